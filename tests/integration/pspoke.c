/* SPDX-License-Identifier: Apache-2.0 */
/* pspoke: sends one hand-made (often deliberately broken) message to a psnet
 * daemon and prints its answer, for the integration tests:
 *   pspoke ENDPOINT CASE [JOB]
 * prints "type=<n> status=<name> reason=<text>" and exits 0 when an answer came
 * within 5 s, 3 when none came. With PSPOKE_TO=coord or =SHARD-ID, the
 * message goes through psgate (ENDPOINT) to that far end. CASE is one of:
 *   garbage        random bytes as the header frame
 *   empty          one empty frame
 *   truncated      a valid PULL header cut in half
 *   version        a header with protocol version 99
 *   unknown-type   a header with message type 77
 *   oversized      a PUSH whose frame is 8x the size its key declares
 *   missing-frame  a PUSH declaring 2 keys with 1 frame
 *   unknown-tensor a PULL of tensor 999
 *   bad-len        a PULL of key (0,0) declaring 3 floats
 *   wrong-job      a PULL of key (0,0) for job 4242
 *   pull           a valid PULL of every chunk of tensor 0 that this shard owns...
 *                  (here: key (0,0) with the length the default job uses; the
 *                  answer is PULL_REP or MOVED); with PSPOKE_UPDATE_OF=ID a
 *                  strategy's read of client ID's update of round PSPOKE_CLOCK
 *   status         a STATUS request (pscoord)
 *   register-bad   a REGISTER without a body (pscoord)
 *   v1             a REGISTER as a protocol-version-1 peer sends it
 *   register-worker  a REGISTER as a worker (pscoord)
 *   register-server  a REGISTER as shard 77 at ipc:///nowhere (pscoord)
 *   chunk-state    a shard-to-shard CHUNK_STATE of key (0,0) (psd)
 *   job-stop       a JOB_STOP (pscoord)
 *   history        a HISTORY (pscoord: admin only)
 *   push-nan       a PUSH of key (0,0) whose values are all NaN, as worker
 *                  PSPOKE_SENDER (default 999), clock PSPOKE_CLOCK (default 0)
 *   push-value     the same with every value PSPOKE_VALUE (default 1) and an
 *                  example count of 1, as a federated client's update
 *                  (both: with PSPOKE_PROGRESS, the job's progress the push
 *                  says it is at, "nan" included; with PSPOKE_BF16=1, the
 *                  values as bf16, a --wire bf16 worker's; with
 *                  PSPOKE_CODEC=int8 an int8 frame of the value, =topk two
 *                  (index, value) pairs, =topk-disorder the same in
 *                  descending order of index; with PSPOKE_DELTA=1, a
 *                  strategy's delta, Header.strategy_delta)
 *   rows-push      a ROWS_PUSH of table PSPOKE_TABLE (default 0): PSPOKE_COUNT
 *                  ids (default 4; 1, 2, ...) each with a row of PSPOKE_DIM
 *                  (default 1) values PSPOKE_VALUE ("nan" too; default 1), as
 *                  worker PSPOKE_SENDER (default 999), clock PSPOKE_CLOCK;
 *                  with PSPOKE_ROWS_BYTES the rows frame has that many bytes
 *   rows-pull      a ROWS_PULL of those ids, the same way
 *   huge           a PUSH whose frame is 1 GiB (zero pages: nothing is allocated here)
 *   frames         one PUSH of PSPOKE_COUNT frames of CHUNKLEN floats each
 *   pull-future    PSPOKE_COUNT PULLs of key (0,0) for clock PSPOKE_CLOCK (default
 *                  2^40), pipelined; prints how each was answered
 *   flood          PSPOKE_COUNT more connections held open while a STATUS (or,
 *                  with CHUNKLEN, a PULL) is sent on a fresh one
 *   shm-hello      a bad shared-memory hello on the shard's PATH.shm socket,
 *                  PSPOKE_SHM_CASE: unsealed (a memfd without seals), file (a
 *                  regular file), size (another size than the memfd's), huge
 *                  (more than a shard maps), nofd, garbage; prints "shm
 *                  answer=..." (the shard's refusal, or ok)
 *   shm-push       a session of worker PSPOKE_SENDER opened as libpsnet does,
 *                  then a PUSH of key (0,0) whose values (PSPOKE_VALUE, "nan"
 *                  too) lie in it at PSPOKE_SHM_OFFSET (default 0); with
 *                  PSPOKE_SHM_TOKEN=wrong naming a session nobody opened,
 *                  with PSPOKE_SHM_AS=N sent as worker N; with
 *                  PSPOKE_SHM_SCRIBBLE=1 a thread turns every 97th value
 *                  NaN and back, again and again, until the answer comes
 *   shm-pull       the same session, a PULL of key (0,0) into it; prints
 *                  also "shm nonzero=N nonfinite=M", the values written there
 * With PSPOKE_KEYS=DIR it speaks CURVE as the key PSPOKE_KEY (default admin) to
 * the server whose public key is PSPOKE_SERVER (default pscoord). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "errors.h"
#include "keys.h"
#include "macro.h"
#include "shm.h"
#include "wire.h"

/* PSPOKE_TO (coord or a shard id): every message goes through psgate with
 * that address frame first, and answers come with one (netsock.h, NetMux). */
static bool via_gate;
static uint32_t via_to;
static bool mid_message;

static int send_raw(void *s, const void *data, size_t n, int more) {
        if (via_gate && !mid_message) {
                uint8_t to[4] = { (uint8_t) via_to, (uint8_t) (via_to >> 8), (uint8_t) (via_to >> 16),
                                  (uint8_t) (via_to >> 24) };
                if (zmq_send(s, to, sizeof to, ZMQ_SNDMORE) < 0)
                        return -errno;
        }
        mid_message = more;
        return zmq_send(s, data, n, more ? ZMQ_SNDMORE : 0) < 0 ? -errno : 0;
}

static int send_header(void *s, Psnet__Header *h, size_t cut, bool more) {
        size_t n = psnet__header__get_packed_size(h);
        uint8_t *buf = malloc(n ? n : 1);
        if (!buf)
                return -ENOMEM;
        psnet__header__pack(h, buf);
        int r = send_raw(s, buf, cut ? MIN(cut, n) : n, more);
        free(buf);
        return r;
}

static unsigned long env_num(const char *name, unsigned long dflt) {
        const char *v = getenv(name);
        return v ? strtoul(v, NULL, 10) : dflt;
}

/* Receives one answer within ms; returns its status (or -1 for none). */
static int answer(void *s, long ms, char *reason, size_t n) {
        zmq_pollitem_t it = { .socket = s, .events = ZMQ_POLLIN };
        if (zmq_poll(&it, 1, ms) <= 0)
                return -1;
        WireMsg m;
        int r = via_gate ? wire_recv_to(s, false, 0, &m) : wire_recv(s, false, 0, &m),
            st = r < 0 ? -2 : (int) m.hdr->status;
        if (reason)
                snprintf(reason, n, "%s", r == 0 && m.hdr->reason ? m.hdr->reason : "");
        wire_msg_done(&m);
        return st;
}

/* shm-push with PSPOKE_SHM_SCRIBBLE: what a worker writing its shared memory
 * while the shard reads its push does, at its worst. */
typedef struct Scribble {
        float *v;
        uint32_t len;
        float value;
        atomic_bool stop;
        unsigned long rounds;
} Scribble;

static void *scribble(void *arg) {
        Scribble *sc = arg;
        volatile float *v = sc->v;
        while (!atomic_load(&sc->stop)) {
                for (uint32_t i = 0; i < sc->len; i += 97)
                        v[i] = NAN;
                for (uint32_t i = 0; i < sc->len; i += 97)
                        v[i] = sc->value;
                sc->rounds++;
        }
        return NULL;
}

/* shm-hello: one bad hello; prints the shard's answer. */
static int shm_hello_case(const char *ep, const char *what) {
        char path[108];
        if (!what || shm_socket_path(ep, path, sizeof path) < 0) {
                fprintf(stderr, "pspoke: shm-hello needs PSPOKE_SHM_CASE and an ipc:// endpoint\n");
                return 2;
        }
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
        int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (s < 0 || connect(s, (struct sockaddr *) &sa, sizeof sa) < 0) {
                fprintf(stderr, "pspoke: cannot connect to %s: %s\n", path, strerror(errno));
                return 2;
        }
        ShmHello hello = { .magic = SHM_MAGIC, .worker = 999, .size = 4096 };
        int fd = -1;
        bool sealed = !strcmp(what, "size") || !strcmp(what, "huge");
        if (!strcmp(what, "unsealed") || sealed) {
                fd = memfd_create("pspoke", MFD_CLOEXEC | (sealed ? MFD_ALLOW_SEALING : 0));
                off_t size = !strcmp(what, "huge") ? (off_t) (SHM_MAX_SIZE + 4096) : 4096;
                if (fd < 0 || ftruncate(fd, size) < 0 ||
                    (sealed && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0))
                        return 2;
                hello.size = !strcmp(what, "size") ? 8192 : (uint64_t) size;
        } else if (!strcmp(what, "file")) {
                fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
                struct stat st;
                if (fd < 0 || fstat(fd, &st) < 0)
                        return 2;
                hello.size = (uint64_t) st.st_size;
        } else if (strcmp(what, "nofd") != 0 && strcmp(what, "garbage") != 0) {
                fprintf(stderr, "pspoke: unknown PSPOKE_SHM_CASE '%s'\n", what);
                return 2;
        }
        struct iovec iov = { .iov_base = &hello, .iov_len = !strcmp(what, "garbage") ? 10 : sizeof hello };
        union {
                char buf[CMSG_SPACE(sizeof(int))];
                struct cmsghdr align;
        } u;
        memset(&u, 0, sizeof u);
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
        if (fd >= 0) {
                mh.msg_control = u.buf;
                mh.msg_controllen = sizeof u.buf;
                struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
                cm->cmsg_level = SOL_SOCKET;
                cm->cmsg_type = SCM_RIGHTS;
                cm->cmsg_len = CMSG_LEN(sizeof(int));
                memcpy(CMSG_DATA(cm), &fd, sizeof fd);
        }
        if (sendmsg(s, &mh, MSG_NOSIGNAL) < 0)
                return 2;
        struct pollfd pfd = { .fd = s, .events = POLLIN };
        if (poll(&pfd, 1, (int) env_num("PSPOKE_WAIT_MS", 5000)) <= 0) {
                printf("no answer\n");
                return 3;
        }
        char ans[256];
        ssize_t got = recv(s, ans, sizeof ans - 1, 0);
        if (got <= 0) {
                printf("shm answer=closed\n");
                return 0;
        }
        ans[got] = '\0';
        printf("shm answer=%s\n", ans[0] ? ans : "ok");
        close(s);
        if (fd >= 0)
                close(fd);
        return 0;
}

int main(int argc, char **argv) {
        if (argc < 3) {
                fprintf(stderr, "usage: pspoke ENDPOINT CASE [JOB] [CHUNKLEN]\n");
                return 2;
        }
        const char *ep = argv[1], *c = argv[2], *to = getenv("PSPOKE_TO");
        if (to) {
                via_gate = true;
                via_to = !strcmp(to, "coord") ? UINT32_MAX : (uint32_t) strtoul(to, NULL, 10);
        }
        uint32_t job = argc > 3 ? (uint32_t) strtoul(argv[3], NULL, 10) : 1;
        uint32_t len = argc > 4 ? (uint32_t) strtoul(argv[4], NULL, 10) : 200704; /* W0 of mlp:784-256-10 */
        void *ctx = zmq_ctx_new(), *s = zmq_socket(ctx, ZMQ_DEALER);
        int zero = 0, r = 0;
        const char *kdir = getenv("PSPOKE_KEYS");
        if (kdir && s) {
                NetIdentity id;
                char err[512];
                const char *srv = getenv("PSPOKE_SERVER");
                if (keys_identity_load(&id, kdir, getenv("PSPOKE_KEY") ? getenv("PSPOKE_KEY") : "admin",
                                       srv ? srv : "pscoord", PSNET__ROLE__ROLE_NONE, err, sizeof err) < 0) {
                        fprintf(stderr, "pspoke: %s\n", err);
                        return 2;
                }
                if (zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, id.keys.public_key, 32) < 0 ||
                    zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, id.keys.secret_key, 32) < 0 ||
                    zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, id.coord_key, 32) < 0) {
                        fprintf(stderr, "pspoke: CURVE options: %s\n", zmq_strerror(errno));
                        return 2;
                }
        }
        if (!ctx || !s || zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero) < 0 || zmq_connect(s, ep) < 0) {
                fprintf(stderr, "pspoke: cannot connect to %s: %s\n", ep, zmq_strerror(errno));
                return 2;
        }
        Psnet__Header h;
        Psnet__Key k0 = PSNET__KEY__INIT, k1 = PSNET__KEY__INIT, *keys[2] = { &k0, &k1 };
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_PULL);
        h.has_job = h.has_seq = h.has_clock = h.has_sender = true;
        h.job = job;
        h.seq = 7;
        h.clock = 0;
        h.sender = 999;
        k0.tensor = 0;
        k0.chunk = 0;
        k0.len = len;
        k1 = k0;
        k1.chunk = 1;
        h.n_keys = 1;
        h.keys = keys;
        ShmRegion reg = SHM_REGION_INIT;
        Scribble sc;
        pthread_t scribbler;
        bool scribbling = false;
        uint8_t token[WIRE_SHM_TOKEN];

        if (!strcmp(c, "garbage")) {
                uint8_t junk[64];
                for (size_t i = 0; i < sizeof junk; i++)
                        junk[i] = (uint8_t) (i * 37 + 11);
                r = send_raw(s, junk, sizeof junk, 0);
        } else if (!strcmp(c, "empty"))
                r = send_raw(s, "", 0, 0);
        else if (!strcmp(c, "truncated"))
                r = send_header(s, &h, psnet__header__get_packed_size(&h) - 1, false); /* inside the last key */
        else if (!strcmp(c, "version")) {
                h.version = 99;
                r = send_header(s, &h, 0, false);
        } else if (!strcmp(c, "unknown-type")) {
                h.type = 77;
                r = send_header(s, &h, 0, false);
        } else if (!strcmp(c, "oversized") || !strcmp(c, "missing-frame")) {
                bool over = !strcmp(c, "oversized");
                h.type = PSNET__MSG_TYPE__MSG_PUSH;
                h.n_keys = over ? 1 : 2;
                size_t n = (size_t) len * 4u * (over ? 8u : 1u);
                char *payload = calloc(1, n);
                if (!payload)
                        return 2;
                r = send_header(s, &h, 0, true);
                if (r == 0)
                        r = send_raw(s, payload, n, 0);
                free(payload);
        } else if (!strcmp(c, "unknown-tensor")) {
                k0.tensor = 999;
                r = send_header(s, &h, 0, false);
        } else if (!strcmp(c, "bad-len")) {
                k0.len = 3;
                r = send_header(s, &h, 0, false);
        } else if (!strcmp(c, "wrong-job")) {
                h.job = 4242;
                r = send_header(s, &h, 0, false);
        } else if (!strcmp(c, "pull")) {
                h.has_update_of = getenv("PSPOKE_UPDATE_OF") != NULL;
                h.update_of = (uint32_t) env_num("PSPOKE_UPDATE_OF", 0);
                h.clock = h.has_update_of ? (int64_t) env_num("PSPOKE_CLOCK", 0) : h.clock;
                r = send_header(s, &h, 0, false);
        }
        else if (!strcmp(c, "status")) {
                h.type = PSNET__MSG_TYPE__MSG_STATUS;
                h.n_keys = 0;
                r = send_header(s, &h, 0, false);
        } else if (!strcmp(c, "v1")) {
                /* version 1, type REGISTER, field 13 (v1's Control) = {reg: {role: server}} */
                static const uint8_t v1[] = { 0x08, 0x01, 0x10, 0x0a, 0x6a, 0x04, 0x0a, 0x02, 0x08, 0x01 };
                r = send_raw(s, v1, sizeof v1, 0);
        } else if (!strcmp(c, "register-worker") || !strcmp(c, "register-server")) {
                Psnet__Register reg = PSNET__REGISTER__INIT;
                bool server = !strcmp(c, "register-server");
                reg.role = server ? PSNET__ROLE__ROLE_SERVER : PSNET__ROLE__ROLE_WORKER;
                reg.has_want_id = server;
                reg.want_id = 77;
                reg.endpoint = server ? (char *) "ipc:///nowhere" : NULL;
                h.type = PSNET__MSG_TYPE__MSG_REGISTER;
                h.n_keys = 0;
                h.body_case = PSNET__HEADER__BODY_REG;
                h.reg = &reg;
                r = send_header(s, &h, 0, false);
        } else if (!strcmp(c, "history")) {
                h.type = PSNET__MSG_TYPE__MSG_HISTORY;
                h.n_keys = 0;
                r = send_header(s, &h, 0, false);
        } else if (!strcmp(c, "job-stop")) {
                h.type = PSNET__MSG_TYPE__MSG_JOB_STOP;
                h.n_keys = 0;
                r = send_header(s, &h, 0, false);
        } else if (!strcmp(c, "chunk-state")) {
                Psnet__ChunkState cs = PSNET__CHUNK_STATE__INIT;
                size_t n = (size_t) len * 4u;
                char *v = calloc(1, n);
                if (!v)
                        return 2;
                h.type = PSNET__MSG_TYPE__MSG_CHUNK_STATE;
                h.body_case = PSNET__HEADER__BODY_CHUNK_STATE;
                h.chunk_state = &cs;
                r = send_header(s, &h, 0, true);
                if (r == 0)
                        r = send_raw(s, v, n, 1);
                if (r == 0)
                        r = send_raw(s, v, n, 0);
                free(v);
        } else if (!strcmp(c, "rows-push") || !strcmp(c, "rows-pull")) {
                bool push = !strcmp(c, "rows-push");
                size_t n = env_num("PSPOKE_COUNT", 4), dim = env_num("PSPOKE_DIM", 1);
                const char *pv = getenv("PSPOKE_VALUE");
                float value = pv ? strtof(pv, NULL) : 1.0f; /* strtof reads "nan" */
                h.type = push ? PSNET__MSG_TYPE__MSG_ROWS_PUSH : PSNET__MSG_TYPE__MSG_ROWS_PULL;
                h.n_keys = 0;
                h.has_table = true;
                h.table = (uint32_t) env_num("PSPOKE_TABLE", 0);
                h.sender = (uint32_t) env_num("PSPOKE_SENDER", 999);
                h.clock = (int64_t) env_num("PSPOKE_CLOCK", 0);
                size_t rb = getenv("PSPOKE_ROWS_BYTES") ? env_num("PSPOKE_ROWS_BYTES", 0) : n * dim * sizeof(float);
                int64_t *ids = malloc(n * sizeof *ids + 1);
                float *v = malloc(rb + 1);
                if (!ids || !v)
                        return 2;
                for (size_t i = 0; i < n; i++)
                        ids[i] = (int64_t) i + 1;
                for (size_t i = 0; i < rb / sizeof *v; i++)
                        v[i] = value;
                r = send_header(s, &h, 0, true);
                if (r == 0)
                        r = send_raw(s, ids, n * sizeof *ids, push);
                if (r == 0 && push)
                        r = send_raw(s, v, rb, 0);
                free(ids);
                free(v);
        } else if (!strcmp(c, "push-nan") || !strcmp(c, "push-value")) {
                bool nan = !strcmp(c, "push-nan");
                const char *pv = getenv("PSPOKE_VALUE");
                float value = nan ? NAN : pv ? strtof(pv, NULL) : 1.0f;
                h.type = PSNET__MSG_TYPE__MSG_PUSH;
                h.sender = (uint32_t) env_num("PSPOKE_SENDER", 999);
                h.clock = (int64_t) env_num("PSPOKE_CLOCK", 0);
                h.has_examples = !nan;
                h.examples = 1;
                h.has_strategy_delta = h.strategy_delta = getenv("PSPOKE_DELTA") != NULL;
                const char *pp = getenv("PSPOKE_PROGRESS");
                h.has_progress = pp != NULL;
                h.progress = pp ? strtof(pp, NULL) : 0.0f;
                float *v = malloc((size_t) len * sizeof(float));
                if (!v)
                        return 2;
                for (uint32_t i = 0; i < len; i++)
                        v[i] = value;
                size_t bytes = (size_t) len * sizeof(float);
                if (getenv("PSPOKE_BF16")) {
                        /* The top halves, little-endian, over the front of v. */
                        uint8_t *b = (uint8_t *) v;
                        for (uint32_t i = 0; i < len; i++) {
                                uint32_t u;
                                memcpy(&u, &v[i], sizeof u);
                                b[2 * i] = (uint8_t) (u >> 16);
                                b[2 * i + 1] = (uint8_t) (u >> 24);
                        }
                        h.has_dtype = true;
                        h.dtype = PSNET__DTYPE__DTYPE_BF16;
                        bytes = (size_t) len * 2;
                }
                const char *codec = getenv("PSPOKE_CODEC");
                uint8_t packed[16];
                if (codec && !strcmp(codec, "int8")) {
                        /* The scale, then len int8 values of 1: all of them value. */
                        uint8_t *b = (uint8_t *) v;
                        memcpy(b, &value, 4);
                        memset(b + 4, 1, len);
                        h.has_codec = true;
                        h.codec = PSNET__CODEC__CODEC_INT8;
                        bytes = 4 + (size_t) len;
                } else if (codec && !strncmp(codec, "topk", 4)) {
                        uint32_t idx[2] = { 1, 3 };
                        if (!strcmp(codec, "topk-disorder"))
                                idx[0] = 3, idx[1] = 1;
                        for (int e = 0; e < 2; e++) {
                                memcpy(packed + 8 * e, &idx[e], 4);
                                memcpy(packed + 8 * e + 4, &value, 4);
                        }
                        memcpy(v, packed, sizeof packed);
                        h.has_codec = true;
                        h.codec = PSNET__CODEC__CODEC_TOPK;
                        bytes = sizeof packed;
                }
                r = send_header(s, &h, 0, true);
                if (r == 0)
                        r = send_raw(s, v, bytes, 0);
                free(v);
        } else if (!strcmp(c, "huge")) {
                size_t n = (size_t) 1 << 30;
                void *p = mmap(NULL, n, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
                if (p == MAP_FAILED)
                        return 2;
                h.type = PSNET__MSG_TYPE__MSG_PUSH;
                r = send_header(s, &h, 0, true);
                if (r == 0)
                        r = send_raw(s, p, n, 0);
                zmq_pollitem_t it = { .socket = s, .events = ZMQ_POLLOUT };
                (void) zmq_poll(&it, 1, 2000);
                munmap(p, n);
        } else if (!strcmp(c, "frames")) {
                /* Zero pages, sent without a copy: the frames cost this process nothing. */
                unsigned long nf = env_num("PSPOKE_COUNT", 20);
                size_t n = (size_t) len * sizeof(float);
                void *v = mmap(NULL, n, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
                if (v == MAP_FAILED)
                        return 2;
                h.type = PSNET__MSG_TYPE__MSG_PUSH;
                r = send_header(s, &h, 0, true);
                for (unsigned long i = 0; r == 0 && i < nf; i++) {
                        zmq_msg_t f;
                        zmq_msg_init_data(&f, v, n, NULL, NULL);
                        r = zmq_msg_send(&f, s, i + 1 < nf ? ZMQ_SNDMORE : 0) < 0 ? -errno : 0;
                }
                zmq_pollitem_t it = { .socket = s, .events = ZMQ_POLLOUT };
                (void) zmq_poll(&it, 1, 2000);
        } else if (!strcmp(c, "pull-future")) {
                unsigned long n = env_num("PSPOKE_COUNT", 1000), got = 0, counts[32] = { 0 };
                h.sender = (uint32_t) env_num("PSPOKE_SENDER", 999);
                h.clock = (int64_t) env_num("PSPOKE_CLOCK", 1ul << 40);
                char reason[256] = "";
                /* In batches of 32, each read back before the next: a reader that does
                 * not read loses answers to the shard's bounded send queue. */
                for (unsigned long i = 0; r == 0 && i < n;) {
                        unsigned long b = 0;
                        for (; b < 32 && i < n && r == 0; b++, i++) {
                                h.seq = i + 1;
                                r = send_header(s, &h, 0, false);
                        }
                        for (; b > 0; b--) {
                                int st = answer(s, 5000, reason, sizeof reason);
                                if (st < 0)
                                        break;
                                counts[st < 32 ? st : 31]++;
                                got++;
                        }
                }
                printf("answered=%lu of %lu", got, n);
                for (int i = 0; i < 32; i++)
                        if (counts[i])
                                printf(" %s=%lu", status_name(i), counts[i]);
                printf(" last_reason=%s\n", reason);
                zmq_close(s);
                zmq_ctx_term(ctx);
                return got == n ? 0 : 3;
        } else if (!strcmp(c, "flood")) {
                unsigned long n = env_num("PSPOKE_COUNT", 2000);
                struct rlimit rl;
                if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
                        rl.rlim_cur = rl.rlim_max;
                        (void) setrlimit(RLIMIT_NOFILE, &rl);
                }
                /* A context of their own: its socket limit is set before its first socket. */
                void *fctx = zmq_ctx_new();
                zmq_ctx_set(fctx, ZMQ_MAX_SOCKETS, (int) n + 16);
                void **socks = calloc(n, sizeof *socks);
                unsigned long opened = 0;
                for (unsigned long i = 0; socks && i < n; i++) {
                        socks[i] = zmq_socket(fctx, ZMQ_DEALER);
                        if (!socks[i] || zmq_setsockopt(socks[i], ZMQ_LINGER, &zero, sizeof zero) < 0 ||
                            zmq_connect(socks[i], ep) < 0)
                                break;
                        /* One message each, so every connection is made and kept. */
                        (void) send_raw(socks[i], "", 0, 0);
                        opened++;
                }
                /* Time for the connections to be accepted: the probe below goes last. */
                zmq_pollitem_t none = { .socket = socks ? socks[0] : s, .events = 0 };
                (void) zmq_poll(&none, 1, 2000);
                if (len && argc > 4)
                        r = send_header(s, &h, 0, false);
                else {
                        h.type = PSNET__MSG_TYPE__MSG_STATUS;
                        h.n_keys = 0;
                        r = send_header(s, &h, 0, false);
                }
                int st = r == 0 ? answer(s, 10000, NULL, 0) : -1;
                printf("opened=%lu of %lu, then answered=%s status=%s\n", opened, n, st >= 0 ? "yes" : "no",
                       st >= 0 ? status_name(st) : "-");
                for (unsigned long i = 0; i < opened; i++)
                        zmq_close(socks[i]);
                free(socks);
                zmq_ctx_term(fctx);
                zmq_close(s);
                zmq_ctx_term(ctx);
                return st >= 0 && opened == n ? 0 : 3;
        } else if (!strcmp(c, "shm-hello")) {
                zmq_close(s);
                zmq_ctx_term(ctx);
                return shm_hello_case(ep, getenv("PSPOKE_SHM_CASE"));
        } else if (!strcmp(c, "shm-push") || !strcmp(c, "shm-pull")) {
                char path[128], why[256];
                h.sender = (uint32_t) env_num("PSPOKE_SENDER", 999);
                h.clock = (int64_t) env_num("PSPOKE_CLOCK", 0);
                if (shm_socket_path(ep, path, sizeof path) < 0 ||
                    shm_region_open(&reg, path, h.sender, (size_t) len * sizeof(float), 5000, why, sizeof why) < 0) {
                        printf("shm refused reason=%s\n", why);
                        return 3;
                }
                memcpy(token, reg.token, sizeof token);
                const char *tk = getenv("PSPOKE_SHM_TOKEN");
                if (tk && !strcmp(tk, "wrong"))
                        token[0] ^= 0xff;
                h.has_shm_session = h.has_shm_offset = true;
                h.shm_session.data = token;
                h.shm_session.len = sizeof token;
                h.shm_offset = env_num("PSPOKE_SHM_OFFSET", 0);
                h.sender = (uint32_t) env_num("PSPOKE_SHM_AS", h.sender); /* another worker's request */
                if (!strcmp(c, "shm-push")) {
                        const char *pv = getenv("PSPOKE_VALUE");
                        float value = pv ? strtof(pv, NULL) : 1.0f, *v = reg.base;
                        for (uint32_t i = 0; i < len; i++)
                                v[i] = value;
                        h.type = PSNET__MSG_TYPE__MSG_PUSH;
                }
                r = send_header(s, &h, 0, false);
                if (r == 0 && !strcmp(c, "shm-push") && getenv("PSPOKE_SHM_SCRIBBLE")) {
                        sc = (Scribble) { .v = reg.base, .len = len, .value = ((float *) reg.base)[0] };
                        atomic_init(&sc.stop, false);
                        scribbling = pthread_create(&scribbler, NULL, scribble, &sc) == 0;
                }
        } else if (!strcmp(c, "register-bad")) {
                h.type = PSNET__MSG_TYPE__MSG_REGISTER;
                h.n_keys = 0;
                r = send_header(s, &h, 0, false);
        } else {
                fprintf(stderr, "pspoke: unknown case '%s'\n", c);
                return 2;
        }
        if (r < 0) {
                fprintf(stderr, "pspoke: send failed: %s\n", strerror(-r));
                return 2;
        }
        zmq_pollitem_t it = { .socket = s, .events = ZMQ_POLLIN };
        if (zmq_poll(&it, 1, (long) env_num("PSPOKE_WAIT_MS", 5000)) <= 0) {
                printf("no answer\n");
                r = 3;
        } else {
                WireMsg m;
                r = via_gate ? wire_recv_to(s, false, 0, &m) : wire_recv(s, false, 0, &m);
                if (r < 0)
                        printf("undecodable answer reason=%s\n", m.reason);
                else
                        printf("type=%d status=%s frames=%zu reason=%s\n", m.hdr->type, status_name(m.hdr->status),
                               m.nframes, m.hdr->reason ? m.hdr->reason : "");
                wire_msg_done(&m);
                r = r < 0 ? 4 : 0;
        }
        if (scribbling) {
                atomic_store(&sc.stop, true);
                pthread_join(scribbler, NULL);
                printf("scribbled rounds=%lu\n", sc.rounds);
        }
        if (!strcmp(c, "shm-pull") && reg.base) {
                const float *v = reg.base;
                uint32_t nz = 0, nf = 0;
                for (uint32_t i = 0; i < len; i++) {
                        nz += v[i] != 0.0f;
                        nf += !isfinite(v[i]);
                }
                printf("shm nonzero=%u nonfinite=%u\n", nz, nf);
        }
        shm_region_close(&reg);
        zmq_close(s);
        zmq_ctx_term(ctx);
        return r;
}
