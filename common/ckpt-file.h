/* SPDX-License-Identifier: Apache-2.0 */
/* A shard's checkpoint file: the chunks it led at a clock boundary (values,
 * optimizer state, step count, clock, de-duplication table).
 *
 * Layout (little-endian, as the machine writes it):
 *   header  64 bytes: magic "PSNETCK1", version, shard, job, records, clock,
 *           state floats per value, index bytes, CRC-32 of header and index
 *   index   one 56-byte entry per record: tensor, chunk, len, nlast, steps,
 *           clock, offset, bytes, CRC-32 of the record
 *   records nlast int64 last clocks, len float values, len x per float state
 *
 * Written to NAME.tmp, fsync'd, renamed to NAME, and the directory fsync'd:
 * a reader sees a whole file or none. Every byte is covered by a checksum,
 * checked on load; the reader checks every size and offset against the file
 * before it trusts one (ckpt_check_index is the fuzz target). */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CKPT_MAGIC "PSNETCK1"
#define CKPT_VERSION 1u
#define CKPT_HEADER_BYTES 64u
#define CKPT_ENTRY_BYTES 56u
#define CKPT_MAX_RECORDS (1u << 24)
#define CKPT_MAX_NLAST 65536u
#define CKPT_MAX_LEN (1u << 28)
#define CKPT_MAX_PER 4u

/* A table's rows (issue 34) are records too: tensor CKPT_ROWS | the table's
 * index in the job, chunk the block's number, nlast its rows (at most
 * CKPT_MAX_NLAST) and last_clocks their ids, len rows x the table's floats a
 * row, values the rows as psd-table keeps them (values, optimizer state,
 * Adam's step count), and no state part whatever the header's per. */
#define CKPT_ROWS 0x80000000u
/* The state floats per value a record of tensor holds in a file of per. */
static inline uint32_t ckpt_record_per(uint32_t tensor, uint32_t per) {
        return tensor & CKPT_ROWS ? 0 : per;
}

typedef struct CkptRecord {
        uint32_t tensor, chunk, len, nlast;
        uint64_t steps;
        int64_t clock;
        const int64_t *last_clocks;     /* nlast */
        const float *values;            /* len */
        const float *state;             /* len x per (NULL when per is 0) */
} CkptRecord;

typedef struct CkptEntry {
        uint32_t tensor, chunk, len, nlast;
        uint64_t steps;
        int64_t clock;
        uint64_t offset, bytes;
        uint32_t crc;
} CkptEntry;

typedef struct CkptHeader {
        uint32_t version, shard, job, nrec, per;
        int64_t clock;
        uint32_t index_crc;     /* CRC-32 of the header (its CRC field zero) and the index */
} CkptHeader;

typedef struct CkptFileInfo {
        uint64_t bytes;
        uint32_t index_crc, nrec;
} CkptFileInfo;

/* The bytes of a record with these sizes (0 when they overflow). */
uint64_t ckpt_record_bytes(uint32_t len, uint32_t nlast, uint32_t per);

/* Writes the records as dir/name atomically (see above). On failure nothing
 * named name is created or changed, the temporary file is removed, and err
 * says which file and what failed (e.g. "No space left on device"). */
int ckpt_write(const char *dir, const char *name, uint32_t shard, uint32_t job, int64_t clock, uint32_t per,
               const CkptRecord *recs, size_t n, CkptFileInfo *ret, char *err, size_t errn);
/* The same, where a record without values (a table's rows, read as the
 * file is written rather than copied before) is filled by fill into
 * last_clocks (nlast int64) and values (len floats) of scratch the writer
 * holds: 0 or a negative errno (the write fails with it). */
typedef int (*CkptFillFn)(void *ud, const CkptRecord *rec, int64_t *last_clocks, float *values);
int ckpt_write_fill(const char *dir, const char *name, uint32_t shard, uint32_t job, int64_t clock, uint32_t per,
                    const CkptRecord *recs, size_t n, CkptFillFn fill, void *ud, CkptFileInfo *ret, char *err,
                    size_t errn);

/* The steps of an atomic write, shared with the manifest's: every byte at
 * its offset (short writes retried); then fsync, close (always), rename of tmp
 * to path and fsync of dir, *what naming the step that failed (path is
 * removed when the directory could not be synced). 0 or a negative errno. */
int ckpt_pwrite_all(int fd, const void *p, uint64_t n, uint64_t at);
int ckpt_commit(int fd, const char *tmp, const char *path, const char *dir, const char **what);

/* A sealed file: an 8-byte magic, the CRC-32 and length of the payload
 * (little-endian 32-bit each), the payload; written atomically as dir/file.
 * The checkpoint manifest and pscoord's state file are sealed files of one
 * protobuf message each. what names the file's kind in the messages
 * ("manifest", "state"). */
#define CKPT_SEALED_HEAD 16u
/* The header of a sealed file holding payload (len < 2^32 bytes). */
void ckpt_sealed_head(const char *magic, const void *payload, size_t len, uint8_t head[CKPT_SEALED_HEAD]);
int ckpt_sealed_write(const char *dir, const char *file, const char *magic, const void *payload, size_t len,
                      char *err, size_t errn);
/* Reads all of path when it holds at most max bytes: *ret (free with
 * ps_free) and *ret_n. -ENOENT when there is no such file, -EFBIG over max;
 * err says what failed, naming path. (NumPy and safetensors files too.) */
int ckpt_read_file(const char *path, uint64_t max, uint8_t **ret, size_t *ret_n, char *err, size_t errn);
/* Reads all of path (at most max payload bytes): *ret (free with ps_free)
 * and *ret_n. -ENOENT when there is no such file, -EBADMSG when it is
 * larger; err says what failed. */
int ckpt_sealed_read(const char *path, size_t max, uint8_t **ret, size_t *ret_n, char *err, size_t errn);
/* Checks buf (a whole sealed file) against magic, length and CRC: 0 with
 * *payload and *len pointing into buf, or -EBADMSG with err saying why. */
int ckpt_sealed_open(const uint8_t *buf, size_t n, const char *magic, const char *what, const uint8_t **payload,
                     size_t *len, char *err, size_t errn);

/* Checks a file's header and index (buf: its first n bytes, at least the
 * header and index; file_size: the whole file's) and decodes them: 0, or
 * -EBADMSG with err saying what is wrong. entries (may be NULL) gets
 * header->nrec entries, caller-freed. */
int ckpt_check_index(const uint8_t *buf, size_t n, uint64_t file_size, CkptHeader *header, CkptEntry **entries,
                     char *err, size_t errn);

typedef struct CkptReader CkptReader;
/* Opens and checks a file (header, index, sizes). */
int ckpt_open(const char *path, CkptReader **ret, char *err, size_t errn);
const CkptHeader *ckpt_header(const CkptReader *r);
const CkptEntry *ckpt_entry(const CkptReader *r, size_t i);
/* Reads record i into buf (entry's bytes) and checks its CRC: 0 or -EBADMSG
 * (err names the file, the key and both checksums), -EIO. */
int ckpt_read(CkptReader *r, size_t i, void *buf, char *err, size_t errn);
/* The same into nparts buffers one after the other (lens add up to the
 * record's bytes; the CRC runs over all of them): a record read straight into
 * the buffers that will hold it (last clocks, values, state). */
int ckpt_read_parts(CkptReader *r, size_t i, void *const *parts, const uint64_t *lens, size_t nparts, char *err,
                    size_t errn);
CkptReader *ckpt_close(CkptReader *r);
