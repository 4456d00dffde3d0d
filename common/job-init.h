/* SPDX-License-Identifier: Apache-2.0 */
/* A job's initial values from a safetensors file (--init FILE): a psnet
 * export, or a PyTorch state_dict saved as safetensors. pscoord checks the
 * file against the model when the job is submitted (job_init_check) and
 * records its size and digest; every shard reads it again when it builds its
 * chunks (job_init_open, then job_init_chunk_from) and refuses a file that is
 * not the one pscoord checked. */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "job.h"
#include "safetensors.h"

/* Reads path and checks it against job's model: every tensor of the model
 * there under its state_dict name with its shape, F32, nothing else in the
 * file (as PyTorch's strict load), and, unless the job allows non-finite
 * values, no NaN or infinity. On success sets job->init to path and records
 * the file's size and digest. 0, or a negative errno with why (naming the
 * file and the tensor) in err. */
int job_init_check(Job *job, const char *path, char *err, size_t n);
/* Reads the job's init file (a shard): the same checks of names and shapes,
 * and its size and digest must be those pscoord recorded. The caller frees
 * *ret with st_free. */
int job_init_open(const Job *job, StFile *ret, char *err, size_t n);
/* Chunk c of tensor t from a file job_init_open returned (job_chunk_len values). */
void job_init_chunk_from(const Job *job, const StFile *f, uint32_t t, uint32_t c, float *out);
