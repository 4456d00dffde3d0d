/* workerd --edge: a federated client (edge.c). It registers with the edge
 * role, loads its own share of the training data (--data, --partition K/N,
 * --alpha), and for each round pscoord samples it for: pulls the model,
 * trains --local-epochs on its data only, pushes the delta of its weights
 * with its example count to the shards, and tells pscoord. pscoord may ask it
 * to evaluate the final model on the test set. With --simulate N the process
 * holds N such clients (a Fleet) sharing one dataset and one model. */
#pragma once
#include "trainer.h"

/* Runs until the job is done (or the worker is stopped). 0, or a negative
 * errno after logging why. */
int edge_run(const WorkerConfig *cfg);
