/* SPDX-License-Identifier: Apache-2.0 */
/* What psnet's own programs (workerd, the benchmarks) see of a PsnetWorker
 * beyond the public psnet.h: the job as common/'s type. */
#pragma once
#include "job.h"
#include "psnet.h"

#include "shardmap.h"

/* The job (NULL before the job event). */
const Job *psnet_worker_job(const PsnetWorker *w);
/* An edge client's job (NULL before the job event, or for a job it refused). */
const Job *psnet_edge_job(const PsnetEdge *e);
/* The shard map it routes by (NULL before the job event). */
const ShardMap *psnet_worker_map(const PsnetWorker *w);
/* Pushes refused as STALE so far (a worker that was not, or no longer, a
 * member of their clock). */
uint64_t psnet_worker_stale_pushes(const PsnetWorker *w);
/* Shards it reaches through same-host shared memory now (shm.h). */
size_t psnet_worker_shm_shards(const PsnetWorker *w);
