/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/net/endpoint.c: which tcp:// endpoints are loopback
 * (a non-loopback listen needs --keys or --insecure), and the ordinal of a
 * StatefulSet pod's hostname (psd --id-from-hostname). */
#include <errno.h>
#include "endpoint.h"
#include "tap.h"

int main(void) {
        static const struct { const char *ep; bool loop; } eps[] = {
                { "tcp://127.0.0.1:7000", true },  { "tcp://127.9.9.9:7000", true },
                { "tcp://localhost:7000", true },  { "tcp://[::1]:7000", true },
                { "tcp://0.0.0.0:7000", false },   { "tcp://*:7000", false },
                { "tcp://[::]:7000", false },      { "tcp://10.0.0.1:7000", false },
                { "tcp://128.0.0.1:7000", false }, { "tcp://eth0:7000", false },
                { "tcp://[::1:7000", false },      { "tcp://127.0.0.1", false },
                { "ipc:///tmp/x.sock", false },    { "inproc://x", false },
        };
        for (size_t i = 0; i < sizeof eps / sizeof eps[0]; i++)
                CHECK(endpoint_is_loopback_tcp(eps[i].ep) == eps[i].loop, "%s is %sloopback", eps[i].ep,
                      eps[i].loop ? "" : "not ");
        CHECK(endpoint_is_tcp("tcp://x:1") && !endpoint_is_tcp("ipc:///x") && !endpoint_is_tcp("tcpx://"),
              "endpoint_is_tcp looks at the scheme");

        unsigned n = 99;
        CHECK(hostname_ordinal("psd-0", &n) == 0 && n == 0, "psd-0 is ordinal 0");
        CHECK(hostname_ordinal("my-psnet-psd-17", &n) == 0 && n == 17, "the last -N counts (%u)", n);
        CHECK(hostname_ordinal("psd-1000000", &n) == 0 && n == 1000000, "1000000 is the largest");
        n = 99;
        static const char *bad[] = { "psd", "psd-", "-3", "psd-3a", "psd-1000001", "psd-99999999999999999999",
                                     "psd-+1", "psd- 1", "" };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
                CHECK(hostname_ordinal(bad[i], &n) == -EINVAL && n == 99, "'%s' has no ordinal", bad[i]);
        CHECK(hostname_ordinal(NULL, &n) == -EINVAL, "NULL has no ordinal");
        return tap_done();
}
