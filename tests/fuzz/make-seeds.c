/* SPDX-License-Identifier: Apache-2.0 */
/* Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/TARGET/):
 * well-formed inputs of each reader for libFuzzer to mutate, made with the
 * project's own writers so they follow the code. Built with -Dfuzz=true; run
 * as `build-fuzz/tests/fuzz-make-seeds tests/fuzz/corpus` after a format
 * changes, and commit what changed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>
#include "alloc.h"
#include "ckpt-file.h"
#include "ckpt-manifest.h"
#include "compress.h"
#include "job.h"
#include "shardmap.h"
#include "wire-job.h"
#include "wire.h"

static const char *top;

static void put(const char *target, const char *name, const void *p, size_t n) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", top, target);
        (void) mkdir(path, 0755);
        snprintf(path, sizeof path, "%s/%s/%s", top, target, name);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
                fprintf(stderr, "make-seeds: cannot write %s\n", path);
                exit(1);
        }
}

static uint8_t buf[1 << 16];

/* One wire seed: 2-byte lengths before every part but the last; each of the
 * nframes frames is fl bytes, of `frame` when given. */
/* A seed of a table's rows message: 2 ids (frame of 16 bytes), then, with
 * two frames, 2 rows of 4 floats (32 bytes), with four their stamps (16
 * bytes) and an id dropped (8); each frame says its length, the last too
 * (its zeros would read as lengths). */
static void rows_seed(const char *name, Psnet__Header *h, size_t nframes) {
        static const uint8_t rows[4][32] = { { 7, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0x80 },
                                             { 0 },
                                             { 3, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0 },
                                             { 11 } };
        size_t hl = psnet__header__get_packed_size(h), at = 0;
        buf[at++] = (uint8_t) hl, buf[at++] = (uint8_t) (hl >> 8);
        psnet__header__pack(h, buf + at);
        at += hl;
        for (size_t f = 0; f < nframes; f++) {
                size_t len = f == 1 ? 32 : f == 3 ? 8 : 16;
                buf[at++] = (uint8_t) len, buf[at++] = 0;
                memcpy(buf + at, rows[f], len), at += len;
        }
        put("wire", name, buf, at);
}

/* A ROWS_MOVE naming a worker: 2 ids, then an empty frame. */
static void record_seed(const char *name, Psnet__Header *h) {
        static const uint8_t ids[16] = { 7, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0x80 };
        size_t hl = psnet__header__get_packed_size(h), at = 0;
        buf[at++] = (uint8_t) hl, buf[at++] = (uint8_t) (hl >> 8);
        psnet__header__pack(h, buf + at);
        at += hl;
        buf[at++] = sizeof ids, buf[at++] = 0;
        memcpy(buf + at, ids, sizeof ids), at += sizeof ids;
        buf[at++] = 0, buf[at++] = 0; /* the empty last frame */
        put("wire", name, buf, at);
}

static void wire_seed(const char *name, Psnet__Header *h, size_t nframes, size_t fl, const uint8_t *frame) {
        size_t hl = psnet__header__get_packed_size(h), at = 0;
        buf[at++] = (uint8_t) hl;
        buf[at++] = (uint8_t) (hl >> 8);
        psnet__header__pack(h, buf + at);
        at += hl;
        for (size_t i = 0; i < nframes; i++) {
                if (i + 1 < nframes) {
                        buf[at++] = (uint8_t) fl;
                        buf[at++] = (uint8_t) (fl >> 8);
                }
                for (size_t k = 0; k < fl; k++)
                        buf[at++] = frame ? frame[k] : (uint8_t) (k * 7 + i);
        }
        put("wire", name, buf, at);
}

static void wire_seeds(void) {
        Psnet__Header h;
        Psnet__Key k[2] = { PSNET__KEY__INIT, PSNET__KEY__INIT }, *kp[2] = { &k[0], &k[1] };
        k[0].tensor = 0, k[0].chunk = 0, k[0].len = 8;
        k[1].tensor = 1, k[1].chunk = 3, k[1].len = 8;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_PUSH);
        h.has_job = h.has_sender = h.has_seq = h.has_clock = true;
        h.job = 1, h.sender = 2, h.seq = 7, h.clock = 41;
        h.n_keys = 2, h.keys = kp;
        wire_seed("push", &h, 2, 8 * 4, NULL);
        h.type = PSNET__MSG_TYPE__MSG_PULL;
        wire_seed("pull", &h, 0, 0, NULL);
        h.type = PSNET__MSG_TYPE__MSG_PULL_REP;
        wire_seed("pull-rep", &h, 2, 8 * 4, NULL);
        /* --wire bf16: 2 bytes a value; a federated push coded as int8. */
        h.type = PSNET__MSG_TYPE__MSG_PUSH;
        h.has_dtype = true, h.dtype = PSNET__DTYPE__DTYPE_BF16;
        wire_seed("push-bf16", &h, 2, 8 * 2, NULL);
        h.has_dtype = false, h.dtype = PSNET__DTYPE__DTYPE_F32;
        float x[8] = { 0.5f, -1, 0.25f, 2, -0.125f, 0, 1, -3 }, scratch[8];
        uint8_t coded[256];
        size_t cl = compress_encode(COMPRESS_INT8, x, 8, 0, NULL, coded, scratch);
        h.has_codec = true, h.codec = PSNET__CODEC__CODEC_INT8;
        wire_seed("push-int8", &h, 2, cl, coded);
        /* A table's rows: 2 ids, then 2 rows of 4 floats (frames of 16 and 32 bytes). */
        h.has_codec = false, h.codec = PSNET__CODEC__CODEC_RAW;
        h.type = PSNET__MSG_TYPE__MSG_ROWS_PUSH;
        h.n_keys = 0, h.keys = NULL;
        h.has_table = true, h.table = 1;
        rows_seed("rows-push", &h, 2);
        /* A primary's copy of the same rows for a backup: 2 ids, 2 whole rows. */
        h.type = PSNET__MSG_TYPE__MSG_ROWS_COPY;
        h.has_clock = h.has_epoch = true, h.clock = 3, h.epoch = 1;
        rows_seed("rows-copy", &h, 2);
        /* A bounded table's: the rows' stamps and an id its primary dropped. */
        rows_seed("rows-copy-bounded", &h, 4);
        /* Rows moved after a map change: the sender's last of the table. */
        h.type = PSNET__MSG_TYPE__MSG_ROWS_MOVE;
        h.has_last = h.last = true;
        rows_seed("rows-move", &h, 2);
        h.has_last = h.last = false;
        /* What worker 5's pushes of the table left at the sender (ASP). */
        h.has_origin = h.has_done = true, h.origin = 5, h.done = 2;
        record_seed("rows-move-record", &h);
        h.has_origin = h.has_done = false;
        /* A new holder asking for rows that have not come: the ids alone. */
        h.type = PSNET__MSG_TYPE__MSG_ROWS_WANT;
        rows_seed("rows-want", &h, 1);
        Psnet__Register reg = PSNET__REGISTER__INIT;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_REGISTER);
        reg.role = PSNET__ROLE__ROLE_SERVER;
        reg.endpoint = (char *) "ipc:///tmp/psd-1.sock";
        reg.has_want_id = reg.has_pid = true;
        reg.want_id = 1, reg.pid = 1234;
        h.body_case = PSNET__HEADER__BODY_REG;
        h.reg = &reg;
        wire_seed("register", &h, 0, 0, NULL);
        Psnet__Checkpoint ck = PSNET__CHECKPOINT__INIT;
        wire_header_init(&h, PSNET__MSG_TYPE__MSG_CHECKPOINT);
        ck.name = (char *) "mid";
        ck.dir = (char *) "/var/lib/psnet/checkpoints/mid";
        ck.has_clock = true;
        ck.clock = 54;
        h.body_case = PSNET__HEADER__BODY_CHECKPOINT;
        h.checkpoint = &ck;
        wire_seed("checkpoint", &h, 0, 0, NULL);
}

static void config_seeds(void) {
        static const char a[] = "[fuzz]\nlisten = ipc:///run/psnet/coord.sock\nlease-ms = 3000\nlr = 0.05\n"
                                "insecure = true\n; a comment\n# another\nmemory = 17179869184\nlevel = -3\n";
        static const char b[] = "listen=tcp://0.0.0.0:7000\n[other]\nkeys = /etc/psnet/keys\ninsecure\n";
        put("config", "sections", a, sizeof a - 1);
        put("config", "bare", b, sizeof b - 1);
}

static void idx_seeds(void) {
        uint8_t img[16 + 3 * 2 * 2] = { 0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 2 };
        uint8_t lab[8 + 3] = { 0, 0, 8, 1, 0, 0, 0, 3, 4, 0, 9 };
        for (size_t i = 16; i < sizeof img; i++)
                img[i] = (uint8_t) (i * 13);
        put("idx", "images", img, sizeof img);
        put("idx", "labels", lab, sizeof lab);
        uLongf n = sizeof buf;
        /* gzip framing (windowBits 31) as the data set's .gz files */
        z_stream z = { 0 };
        if (deflateInit2(&z, 9, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY) != Z_OK)
                exit(1);
        z.next_in = img;
        z.avail_in = sizeof img;
        z.next_out = buf;
        z.avail_out = (uInt) n;
        if (deflate(&z, Z_FINISH) != Z_STREAM_END)
                exit(1);
        put("idx", "images.gz", buf, z.total_out);
        deflateEnd(&z);
}

static void ckpt_seeds(const char *tmp) {
        char err[512];
        float v[2][6], st[2][6];
        int64_t last[2][3] = { { 3, 4, -1 }, { 3, 3, 2 } };
        CkptRecord r[2];
        for (int i = 0; i < 2; i++) {
                for (int k = 0; k < 6; k++)
                        v[i][k] = (float) (i * 10 + k) / 7.0f, st[i][k] = (float) k;
                r[i] = (CkptRecord) { .tensor = (uint32_t) i, .chunk = 0, .len = 6, .nlast = 3, .steps = 9,
                                      .clock = 5, .last_clocks = last[i], .values = v[i], .state = st[i] };
        }
        CkptFileInfo info;
        if (ckpt_write(tmp, "shard-1.ckpt", 1, 1, 5, 1, r, 2, &info, err, sizeof err) < 0) {
                fprintf(stderr, "make-seeds: %s\n", err);
                exit(1);
        }
        char path[512];
        snprintf(path, sizeof path, "%s/shard-1.ckpt", tmp);
        FILE *f = fopen(path, "rb");
        buf[0] = 0; /* reader 0: a shard's file */
        size_t n = f ? fread(buf + 1, 1, sizeof buf - 1, f) : 0;
        if (f)
                fclose(f);
        put("ckpt", "shard-file", buf, n + 1);

        Job job;
        job_defaults(&job);
        Psnet__JobSpec *spec = NULL;
        if (job_to_proto(&job, &spec) < 0)
                exit(1);
        Psnet__CheckpointFile file = PSNET__CHECKPOINT_FILE__INIT, *fp = &file;
        file.shard = 1, file.file = (char *) "shard-1.ckpt", file.bytes = info.bytes, file.index_crc = info.index_crc;
        file.chunks = 2;
        Psnet__CheckpointManifest m = PSNET__CHECKPOINT_MANIFEST__INIT;
        m.name = (char *) "mid", m.clock = 5, m.job = spec, m.created_ms = 1790000000000ull;
        m.n_files = 1, m.files = &fp;
        if (ckpt_manifest_write(tmp, &m, err, sizeof err) < 0)
                exit(1);
        snprintf(path, sizeof path, "%s/" CKPT_MANIFEST, tmp);
        f = fopen(path, "rb");
        buf[0] = 1; /* reader 1: a manifest */
        n = f ? fread(buf + 1, 1, sizeof buf - 1, f) : 0;
        if (f)
                fclose(f);
        put("ckpt", "manifest", buf, n + 1);

        Psnet__CoordState s = PSNET__COORD_STATE__INIT;
        Psnet__CoordPeer p = PSNET__COORD_PEER__INIT, *pp = &p;
        s.job = spec;
        s.state = PSNET__JOB_STATE__JOB_RUNNING;
        s.has_map_epoch = true, s.map_epoch = 3;
        p.role = PSNET__ROLE__ROLE_SERVER, p.id = 1, p.endpoint = (char *) "ipc:///tmp/psd-1.sock";
        s.n_peers = 1, s.peers = &pp;
        size_t len = psnet__coord_state__get_packed_size(&s);
        if (ckpt_sealed_write(tmp, "pscoord.state", "PSNETCS1", (psnet__coord_state__pack(&s, buf + 1), buf + 1), len,
                              err, sizeof err) < 0)
                exit(1);
        snprintf(path, sizeof path, "%s/pscoord.state", tmp);
        f = fopen(path, "rb");
        buf[0] = 2; /* reader 2: pscoord's state */
        n = f ? fread(buf + 1, 1, sizeof buf - 1, f) : 0;
        if (f)
                fclose(f);
        put("ckpt", "coord-state", buf, n + 1);
        put("coord-state", "waiting", buf + 1 + CKPT_SEALED_HEAD, n - CKPT_SEALED_HEAD);

        /* A running job with a placed, replicated map, two shards and a worker. */
        ShardDesc sd[2] = { { .id = 1, .endpoint = "ipc:///tmp/psd-1.sock" },
                            { .id = 2, .endpoint = "ipc:///tmp/psd-2.sock" } };
        ShardMap *map = NULL;
        Psnet__ShardMap *pm = NULL;
        if (shardmap_place(1, sd, 2, &job, &map) < 0)
                exit(1);
        shardmap_set_replicas(map, 2);
        if (shardmap_to_proto(map, &pm) < 0)
                exit(1);
        Psnet__CoordPeer peers[3], *pp3[3];
        for (int i = 0; i < 3; i++) {
                psnet__coord_peer__init(&peers[i]);
                pp3[i] = &peers[i];
                peers[i].id = i < 2 ? (uint32_t) i + 1 : 1;
                peers[i].role = i < 2 ? PSNET__ROLE__ROLE_SERVER : PSNET__ROLE__ROLE_WORKER;
                peers[i].endpoint = i < 2 ? (char *) sd[i].endpoint : NULL;
                peers[i].has_pid = peers[i].has_member = true;
                peers[i].pid = 100 + (uint32_t) i;
                peers[i].host = (char *) "node-a";
                peers[i].member = i == 2;
        }
        s.state = PSNET__JOB_STATE__JOB_RUNNING;
        s.map = pm;
        s.has_map_epoch = s.has_members_epoch = s.has_first_map_epoch = true;
        s.map_epoch = s.first_map_epoch = 1;
        s.members_epoch = 2;
        s.n_peers = 3, s.peers = pp3;
        len = psnet__coord_state__get_packed_size(&s);
        if (len > sizeof buf)
                exit(1);
        psnet__coord_state__pack(&s, buf);
        put("coord-state", "running", buf, len); /* the message: fuzz-coord-state seals it */
        shardmap_proto_free(pm);
        shardmap_free(map);
        job_proto_free(spec);
}

int main(int argc, char **argv) {
        if (argc != 2) {
                fprintf(stderr, "usage: fuzz-make-seeds CORPUS-DIR\n");
                return 2;
        }
        top = argv[1];
        char tmp[] = "/tmp/psnet-seeds.XXXXXX";
        if (!mkdtemp(tmp))
                return 1;
        wire_seeds();
        config_seeds();
        idx_seeds();
        ckpt_seeds(tmp);
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        return system(cmd) == 0 ? 0 : 1;
}
