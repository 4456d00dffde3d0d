/* SPDX-License-Identifier: Apache-2.0 */
/* Checkpoint files (common/ckpt-file.c) and manifests (common/net/ckpt-manifest.c):
 * what is written reads back bit for bit; a byte changed anywhere is refused by
 * a checksum, naming the file and the key; a file cut short, a bad header or an
 * index pointing outside the file is refused before anything is read; a write
 * that cannot finish leaves nothing behind; names never make a path. */
#define RNG_SEED 0xc4ec4b01u
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "alloc.h"
#include "ckpt-file.h"
#include "ckpt-manifest.h"
#include "rng.h"
#include "tap.h"
#include "wire-job.h"

#define PER 2u

static char dir[64];

static int files_in(const char *d) {
        int n = 0;
        DIR *x = opendir(d);
        struct dirent *e;
        while (x && (e = readdir(x)))
                n += e->d_name[0] != '.';
        if (x)
                closedir(x);
        return n;
}

/* CkptFillFn: the ids and rows of fill_ids and fill_rows (a table's rows, read as the file is written). */
static const int64_t *fill_ids;
static const float *fill_rows;
static int fill(void *ud, const CkptRecord *rec, int64_t *ids, float *rows) {
        if (ud)
                return -EIO;
        memcpy(ids, fill_ids, rec->nlast * 8u);
        memcpy(rows, fill_rows, rec->len * 4u);
        return 0;
}

static void flip(const char *path, off_t at) {
        int fd = open(path, O_RDWR);
        unsigned char b = 0;
        if (fd < 0 || pread(fd, &b, 1, at) != 1)
                abort();
        b ^= 0x40;
        if (pwrite(fd, &b, 1, at) != 1 || close(fd) < 0)
                abort();
}

int main(void) {
        char err[512], path[128];
        snprintf(dir, sizeof dir, "/tmp/psnet-ckpt-XXXXXX");
        if (!mkdtemp(dir))
                return 1;
        /* Three records: values, Adam-sized state, de-dup clocks. */
        enum { N = 3 };
        uint32_t lens[N] = { 1000, 1, 4096 };
        float *vals[N], *state[N];
        int64_t last[N][3] = { { -1, 7, 8 }, { 3, -1, 0 }, { 5, 5, 5 } };
        CkptRecord recs[N];
        for (int i = 0; i < N; i++) {
                vals[i] = ps_malloc(lens[i] * sizeof(float));
                state[i] = ps_malloc(lens[i] * PER * sizeof(float));
                for (uint32_t j = 0; j < lens[i]; j++)
                        vals[i][j] = rng_uniform(-1, 1);
                for (uint32_t j = 0; j < lens[i] * PER; j++)
                        state[i][j] = rng_uniform(0, 1);
                recs[i] = (CkptRecord) { .tensor = (uint32_t) i, .chunk = 2u * (uint32_t) i, .len = lens[i], .nlast = 3,
                                         .steps = 100u + (uint64_t) i, .clock = 42, .last_clocks = last[i],
                                         .values = vals[i], .state = state[i] };
        }
        CkptFileInfo info;
        int r = ckpt_write(dir, "shard-1.ckpt", 1, 7, 42, PER, recs, N, &info, err, sizeof err);
        CHECK(r == 0, "write: %s", r ? err : "ok");
        CHECK(files_in(dir) == 1, "one file, no temporary left");
        uint64_t want = CKPT_HEADER_BYTES + N * CKPT_ENTRY_BYTES;
        for (int i = 0; i < N; i++)
                want += ckpt_record_bytes(lens[i], 3, PER);
        CHECK(info.bytes == want && info.nrec == N, "size %lu, records %u", (unsigned long) info.bytes, info.nrec);

        snprintf(path, sizeof path, "%s/shard-1.ckpt", dir);
        CkptReader *rd = NULL;
        r = ckpt_open(path, &rd, err, sizeof err);
        CHECK(r == 0, "open: %s", r ? err : "ok");
        if (rd) {
                const CkptHeader *h = ckpt_header(rd);
                CHECK(h->shard == 1 && h->job == 7 && h->clock == 42 && h->per == PER && h->nrec == N &&
                      h->index_crc == info.index_crc, "header fields read back");
                bool same = true;
                for (int i = 0; i < N; i++) {
                        const CkptEntry *e = ckpt_entry(rd, (size_t) i);
                        uint8_t *buf = ps_malloc(e->bytes);
                        same &= e->tensor == (uint32_t) i && e->chunk == 2u * (uint32_t) i && e->len == lens[i] &&
                                e->steps == 100u + (uint64_t) i && e->clock == 42;
                        same &= ckpt_read(rd, (size_t) i, buf, err, sizeof err) == 0;
                        same &= memcmp(buf, last[i], 24) == 0 && memcmp(buf + 24, vals[i], lens[i] * 4) == 0 &&
                                memcmp(buf + 24 + lens[i] * 4, state[i], lens[i] * 4 * PER) == 0;
                        ps_free(buf);
                }
                CHECK(same, "every record reads back bit for bit");
                /* In parts, straight into the buffers that keep them (the restore's way). */
                const CkptEntry *e = ckpt_entry(rd, 1);
                int64_t lc[3];
                float *v = ps_malloc(lens[1] * 4), *st = ps_malloc(lens[1] * 4 * PER);
                void *parts[3] = { lc, v, st };
                uint64_t pl[3] = { 24, lens[1] * 4, lens[1] * 4 * PER }, short_[3] = { 24, lens[1] * 4, 4 };
                CHECK(v && st && ckpt_read_parts(rd, 1, parts, pl, 3, err, sizeof err) == 0 &&
                      memcmp(lc, last[1], 24) == 0 && memcmp(v, vals[1], lens[1] * 4) == 0 &&
                      memcmp(st, state[1], lens[1] * 4 * PER) == 0, "a record read in parts is the same, bit for bit");
                CHECK(e && ckpt_read_parts(rd, 1, parts, short_, 3, err, sizeof err) == -EINVAL,
                      "parts that do not add up to the record are refused");
                ps_free(v);
                ps_free(st);
                rd = ckpt_close(rd);
        }

        /* A table's rows beside a chunk: no state part whatever the file's per. */
        {
                int64_t ids[3] = { -5, 1LL << 40, 9 };
                float rows[3 * 5];
                for (int j = 0; j < 15; j++)
                        rows[j] = (float) j * 0.25f;
                CkptRecord two[2] = { recs[1], { .tensor = CKPT_ROWS | 2u, .chunk = 0, .len = 15, .nlast = 3,
                                                 .clock = 42 } };
                CkptFileInfo ti;
                fill_ids = ids;
                fill_rows = rows;
                r = ckpt_write(dir, "shard-3.ckpt", 3, 7, 42, PER, two, 2, &ti, err, sizeof err);
                CHECK(r == -EINVAL && files_in(dir) == 1, "a record without its data and nothing to fill it: refused, "
                      "nothing left (%s)", err);
                r = ckpt_write_fill(dir, "shard-3.ckpt", 3, 7, 42, PER, two, 2, fill, (void *) 1, &ti, err,
                                    sizeof err);
                CHECK(r == -EIO && strstr(err, "filling") && files_in(dir) == 1, "a fill that fails fails the write, "
                      "nothing left (%s)", err);
                r = ckpt_write_fill(dir, "shard-3.ckpt", 3, 7, 42, PER, two, 2, fill, NULL, &ti, err, sizeof err);
                uint64_t want3 = CKPT_HEADER_BYTES + 2 * CKPT_ENTRY_BYTES + ckpt_record_bytes(lens[1], 3, PER) +
                                 3 * 8 + 15 * 4;
                CHECK(r == 0 && ti.bytes == want3, "a file with a rows record: %lu bytes, %lu wanted (%s)",
                      (unsigned long) ti.bytes, (unsigned long) want3, r ? err : "ok");
                char p3[128];
                snprintf(p3, sizeof p3, "%s/shard-3.ckpt", dir);
                CkptReader *r3 = NULL;
                int64_t got_ids[3];
                float got[15];
                void *parts[2] = { got_ids, got };
                uint64_t pl[2] = { 24, 60 };
                r = ckpt_open(p3, &r3, err, sizeof err);
                CHECK(r == 0 && ckpt_entry(r3, 1)->tensor == (CKPT_ROWS | 2u) && ckpt_entry(r3, 1)->bytes == 84 &&
                      ckpt_read_parts(r3, 1, parts, pl, 2, err, sizeof err) == 0 && memcmp(got_ids, ids, 24) == 0 &&
                      memcmp(got, rows, 60) == 0, "it reads back: ids and rows, bit for bit (%s)", r ? err : "ok");
                ckpt_close(r3);
                CHECK(unlink(p3) == 0, "remove it");
        }

        /* One byte of the third record's state changed. */
        flip(path, (off_t) (info.bytes - 5));
        r = ckpt_open(path, &rd, err, sizeof err);
        CHECK(r == 0, "a changed record does not stop the index from opening");
        if (rd) {
                const CkptEntry *e = ckpt_entry(rd, 2);
                uint8_t *buf = ps_malloc(e->bytes);
                r = ckpt_read(rd, 2, buf, err, sizeof err);
                CHECK(r == -EBADMSG && strstr(err, "shard-1.ckpt: key (2,4): checksum mismatch (stored"),
                      "a changed byte is refused by name, key and checksum (%s)", err);
                CHECK(ckpt_read(rd, 0, buf, err, sizeof err) == 0, "the other records still read");
                uint64_t half = e->bytes / 2, pl[2] = { half, e->bytes - half };
                void *parts[2] = { buf, buf + half };
                r = ckpt_read_parts(rd, 2, parts, pl, 2, err, sizeof err);
                CHECK(r == -EBADMSG && strstr(err, "checksum mismatch"), "and refused when read in parts (%s)", err);
                ps_free(buf);
                rd = ckpt_close(rd);
        }
        flip(path, (off_t) (info.bytes - 5));
        /* A header field changed. */
        flip(path, 26);
        r = ckpt_open(path, &rd, err, sizeof err);
        CHECK(r == -EBADMSG && strstr(err, "header checksum mismatch"), "a changed header is refused (%s)", err);
        flip(path, 26);
        /* Cut short. */
        CHECK(truncate(path, (off_t) (info.bytes - 1)) == 0, "truncate");
        r = ckpt_open(path, &rd, err, sizeof err);
        CHECK(r == -EBADMSG && strstr(err, "outside the file"), "a file cut short is refused (%s)", err);

        /* The index checker against mutated headers and indexes: never reads
         * outside its buffer (ASan), accepts only what is whole. */
        size_t hn = CKPT_HEADER_BYTES + N * CKPT_ENTRY_BYTES;
        uint8_t *good = ps_malloc(hn), *bad = ps_malloc(hn);
        int fd = open(path, O_RDONLY);
        bool read_ok = fd >= 0 && pread(fd, good, hn, 0) == (ssize_t) hn;
        if (fd >= 0)
                close(fd);
        CHECK(read_ok, "read the header and index");
        size_t accepted = 0;
        for (int it = 0; it < 20000; it++) {
                memcpy(bad, good, hn);
                int flips = 1 + (int) (rng_next() % 4);
                for (int f = 0; f < flips; f++)
                        bad[rng_next() % hn] = (uint8_t) rng_next();
                size_t n = (size_t) (rng_next() % (hn + 1));
                CkptHeader h;
                CkptEntry *e = NULL;
                if (ckpt_check_index(bad, n, info.bytes, &h, &e, err, sizeof err) == 0)
                        accepted++;
                ps_free(e);
        }
        CHECK(accepted == 0, "20000 mutated headers and indexes: none accepted (%zu)", accepted);
        ps_free(good);
        ps_free(bad);

        /* A write that cannot finish: nothing is left. */
        r = ckpt_write("/nonexistent-dir", "shard-2.ckpt", 2, 7, 42, PER, recs, N, NULL, err, sizeof err);
        CHECK(r == -ENOENT && strstr(err, "/nonexistent-dir/shard-2.ckpt.tmp"), "a write that fails says where (%s)",
              err);

        /* Names. */
        CHECK(ckpt_name_valid("clock-120") && ckpt_name_valid("a.b_c-D9"), "good names");
        CHECK(!ckpt_name_valid("") && !ckpt_name_valid("../x") && !ckpt_name_valid("a/b") && !ckpt_name_valid(".hidden") &&
              !ckpt_name_valid("x y"), "names that could be paths are refused");

        /* Manifest round trip, then a changed byte. */
        Psnet__CheckpointManifest m = PSNET__CHECKPOINT_MANIFEST__INIT;
        Psnet__JobSpec *js = NULL;
        Job job;
        job_defaults(&job);
        CHECK(job_to_proto(&job, &js) == 0, "a job for the manifest");
        Psnet__CheckpointFile cf = PSNET__CHECKPOINT_FILE__INIT, *cfp = &cf;
        cf.shard = 1;
        cf.file = (char *) "shard-1.ckpt";
        cf.bytes = info.bytes;
        cf.index_crc = info.index_crc;
        cf.chunks = N;
        m.name = (char *) "mid";
        m.clock = 42;
        m.job = js;
        m.n_files = 1;
        m.files = &cfp;
        r = ckpt_manifest_write(dir, &m, err, sizeof err);
        CHECK(r == 0, "manifest written: %s", r ? err : "ok");
        Psnet__CheckpointManifest *back = NULL;
        r = ckpt_manifest_read(dir, &back, err, sizeof err);
        CHECK(r == 0 && back && back->clock == 42 && back->n_files == 1 && back->files[0]->index_crc == info.index_crc,
              "manifest reads back");
        if (back)
                psnet__checkpoint_manifest__free_unpacked(back, NULL);
        snprintf(path, sizeof path, "%s/" CKPT_MANIFEST, dir);
        flip(path, 20);
        r = ckpt_manifest_read(dir, &back, err, sizeof err);
        CHECK(r == -EBADMSG && strstr(err, "manifest checksum mismatch"), "a changed manifest is refused (%s)", err);
        cf.file = (char *) "../../etc/passwd";
        CHECK(ckpt_manifest_write(dir, &m, err, sizeof err) == 0, "manifest rewritten");
        r = ckpt_manifest_read(dir, &back, err, sizeof err);
        CHECK(r == -EBADMSG, "a manifest naming a file outside the checkpoint is refused (%s)", err);

        job_proto_free(js);
        for (int i = 0; i < N; i++) {
                ps_free(vals[i]);
                ps_free(state[i]);
        }
        snprintf(path, sizeof path, "%s/shard-1.ckpt", dir);
        unlink(path);
        snprintf(path, sizeof path, "%s/" CKPT_MANIFEST, dir);
        unlink(path);
        rmdir(dir);
        return tap_done();
}
