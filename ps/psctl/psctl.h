/* SPDX-License-Identifier: Apache-2.0 */
/* psctl's parts: the verbs (psctl.c) and how their answers are printed
 * (psctl-print.c): human tables by default, JSON with --json. */
#pragma once
#include <stdbool.h>
#include <uv.h>
#include "keys.h"
#include "psnet.pb-c.h"

/* A job's state, mode (bsp, ssp:3, ...) and model's name (mlp:..., cnn, a
 * JSON model's "name") as psctl prints them; "-" or "?" when unknown. */
const char *psctl_state_of(Psnet__JobState s);
const char *psctl_mode_of(const Psnet__JobSpec *j, char *buf, size_t n);
const char *psctl_model_of(const Psnet__JobSpec *j, char *buf, size_t n);
/* The whole status as a table (stdout). */
void print_status_table(const Psnet__StatusRep *s);
/* The whole status as one JSON object (stdout); 0 or -ENOMEM. */
int print_status_json(const Psnet__StatusRep *s);
/* One progress line per worker and one for the job (psctl watch). */
void print_watch(const Psnet__StatusRep *s);
/* One JSON object of string members: key, value, ..., NULL (a NULL value
 * prints null). 0 or -ENOMEM. */
int print_json_strings(const char *key, ...) __attribute__((sentinel));
/* A saved checkpoint: "checkpoint NAME saved: clock ..." or JSON. */
int print_checkpoint_saved(const Psnet__CheckpointRep *r, bool json);
/* The checkpoints as a table (oldest first) or a JSON array. */
int print_checkpoint_list(const Psnet__CheckpointList *l, bool json);
/* {"state":S,"accuracy":A|null} for job wait. */
/* psctl round status (history false) or round history, from a status answer. */
int print_rounds(const Psnet__StatusRep *s, bool history, bool json);
int print_json_result(const char *state, bool has_accuracy, float accuracy);

/* psctl export (psctl-export.c): pulls the job of st's values from its shards
 * through st's map (on loop, with keys when CURVE is on) and writes them to
 * path as safetensors. Says on stderr why not. */
int psctl_export(uv_loop_t *loop, void *zctx, const NetKeyPair *keys, unsigned timeout_s, const Psnet__StatusRep *st,
                 const char *path, bool json);

/* psctl report (psctl-report.c): st's epochs (and a federated job's rounds)
 * and h's samples as CSV files, charts drawn by gnuplot (PNG and SVG) and an
 * index.html showing them, in dir (made if missing). Says on stderr why
 * not: -ENOENT when gnuplot is not installed (the CSV files are written). */
int psctl_report(const Psnet__StatusRep *st, const Psnet__History *h, const char *dir, bool json);

/* psctl probe (psctl-probe.c): GETs /healthz (ready: /readyz) of a daemon's
 * --http address (NULL: 127.0.0.1 on the port scheme's 9100, 9101 and 9102,
 * the first that answers) within timeout_s, and prints the answer: 0 when
 * it is 200, -EIO when another or none, -EINVAL for an address that is none. */
int psctl_probe(const char *address, bool ready, unsigned timeout_s, bool json);
