/* SPDX-License-Identifier: Apache-2.0 */
/* The wire forms of common/'s types: a job (JobSpec), a shard map (ShardMap)
 * and a consistency mode (ModeSpec). What comes from the wire is validated here
 * before anything of ours is built from it. */
#pragma once
#include <stddef.h>
#include "job.h"
#include "psnet.pb-c.h"
#include "shardmap.h"

/* job_to_proto allocates with malloc; free with job_proto_free (NULL is fine).
 * Refuses an invalid job (-EINVAL). */
int job_to_proto(const Job *job, Psnet__JobSpec **ret);
void job_proto_free(Psnet__JobSpec *spec);
/* Validates (see job_validate); on failure writes why into err, -EINVAL. */
int job_from_proto(const Psnet__JobSpec *spec, Job *ret, char *err, size_t errlen);

/* The largest frame a job's messages carry: a chunk's values, or its
 * optimizer state when it moves (up to 2 floats per value), or a header. */
int64_t job_max_frame(const Job *job);

/* A ModeSpec with mode and staleness set (no allocation). */
void mode_to_proto(ConsistencyMode mode, uint32_t staleness, Psnet__ModeSpec *ret);
/* -EINVAL for an unknown mode or a staleness out of range. */
int mode_from_proto(const Psnet__ModeSpec *m, ConsistencyMode *ret_mode, uint32_t *ret_staleness);

/* The wire's JobState and ours are the same list; these convert, mapping
 * anything unknown to -EINVAL (from) or JOB_WAITING's value (to). */
Psnet__JobState job_state_to_proto(JobState s);
int job_state_from_proto(Psnet__JobState s, JobState *ret);

/* Builds a ShardMap from its wire form (validated: 1..65536 shards, distinct
 * ids, non-empty endpoints). -EINVAL when it does not validate. */
int shardmap_from_proto(const Psnet__ShardMap *pm, ShardMap **ret);
/* The wire form of m; free with shardmap_proto_free. */
int shardmap_to_proto(const ShardMap *m, Psnet__ShardMap **ret);
void shardmap_proto_free(Psnet__ShardMap *pm);
