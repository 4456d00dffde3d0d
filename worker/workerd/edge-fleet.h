/* SPDX-License-Identifier: Apache-2.0 */
/* workerd --edge: the process of federated clients (edge-fleet.c). Each
 * client (edge.c) registers with the edge role and, in the rounds pscoord
 * samples it for, trains --local-epochs on its own share of the training
 * data (--partition K/N, --alpha) and pushes only the change of its
 * weights with its example count; pscoord may ask it to test a model. With
 * --simulate N the process holds N clients sharing one dataset and
 * --parallel models. */
#pragma once
#include "trainer.h"

/* Runs until every client has left (the job is done, or SIGTERM). 0, or a
 * negative errno after logging why. */
int edge_run(const WorkerConfig *cfg);
