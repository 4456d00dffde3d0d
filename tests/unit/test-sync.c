/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for libpsnet's blocking client (worker/client/psnet-sync.c)
 * without a cluster: a worker whose pscoord does not answer gets the failed
 * event with the reason, waits time out and polls return at once, calls
 * before the job answer what there is (no job, no tensors), and freeing
 * stops the thread and frees everything (the ASan build checks for leaks);
 * so does freeing while registration is still being tried. The calls
 * against a running job are exercised by tests/integration/test-python.sh. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "psnet.h"
#include "tap.h"

int main(void) {
        char sock[128], reason[256];
        snprintf(sock, sizeof sock, "ipc:///tmp/psnet-test-sync-%d.sock", (int) getpid());
        PsnetWorkerOptions o = { .coord = sock, .connect_timeout_ms = 300 };
        PsnetSync *s = NULL;
        int r = psnet_sync_new(&o, &s);
        CHECK(r == 0 && s, "psnet_sync_new starts (%d)", r);
        if (!s)
                return tap_done();
        CHECK(psnet_sync_wait(s, PSNET_EV_JOB, 0) == 0, "a poll returns at once with nothing");
        CHECK(psnet_sync_wait(s, PSNET_EV_JOB, 50) == 0, "a wait for the job times out");
        PsnetSyncInfo info;
        r = psnet_sync_info(s, &info);
        CHECK(r == 0 && !info.has_job && info.state == PSNET_JOB_WAITING, "no job yet (%d)", r);
        uint64_t numel = 0;
        char name[64];
        CHECK(psnet_sync_tensor(s, 0, name, sizeof name, &numel) == -ENOENT, "no tensors yet");
        CHECK(psnet_sync_model_json(s, name, sizeof name) == -ENOENT, "no model yet");
        int ev = psnet_sync_wait(s, PSNET_EV_FAILED | PSNET_EV_JOB, PSNET_WAIT_FOREVER);
        psnet_sync_reason(s, reason, sizeof reason);
        CHECK(ev == (int) PSNET_EV_FAILED && strstr(reason, "timed out"), "pscoord silent: failed, '%s'", reason);
        CHECK(psnet_sync_wait(s, PSNET_EV_FAILED, 0) == 0, "an event is collected once");
        psnet_sync_free(s);
        CHECK(true, "freed");

        /* Freed while it still tries to register. */
        o.connect_timeout_ms = 60000;
        r = psnet_sync_new(&o, &s);
        CHECK(r == 0, "a second worker starts");
        if (r == 0)
                psnet_sync_free(s);
        psnet_sync_free(NULL);
        o.coord = "not an endpoint";
        r = psnet_sync_new(&o, &s);
        CHECK(r == -EINVAL && s == NULL, "a bad endpoint is refused (%d)", r);
        return tap_done();
}
