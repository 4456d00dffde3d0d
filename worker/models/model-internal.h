/* SPDX-License-Identifier: Apache-2.0 */
/* What model.c and layers.c share: the model and its steps. */
#pragma once
#include "model.h"

#define MODEL_MAX_BUFS (8 * MD_MAX_LAYERS + 32)

/* A transformer block's buffers kept from its forward for its backward
 * (R = batch x tokens rows of width D, H heads of T x T attention). */
typedef struct BlockBufs {
        float *h1, *mean1, *rstd1; /* layer norm 1 of the input, and its statistics */
        float *qkv;                /* [R x 3D] */
        float *heads;              /* q, k, v: 3 x [B x H x T x Dh] */
        float *p;                  /* attention weights [B x H x T x T] */
        float *o_heads;            /* [B x H x T x Dh] */
        float *o;                  /* [R x D], the heads merged */
        float *x1;                 /* input + attention */
        float *h2, *mean2, *rstd2; /* layer norm 2 of x1 */
        float *u, *g;              /* the MLP's hidden layer before and after GELU [R x hidden] */
} BlockBufs;

typedef struct Step {
        MdLayer l;       /* the layer (shapes per sample) */
        size_t index;    /* its index in the description */
        bool relu;       /* a ReLU after it runs fused */
        bool view;       /* its output is its input's buffer (tokens, a flatten that moves nothing, dropout 0) */
        bool in_place;   /* its backward writes the input gradient over the output's */
        KWindow win;     /* conv2d, pooling: for max_batch images (n is set per call) */
        float *col;      /* conv2d: im2col of the batch, reused for its gradient */
        int32_t *idx;    /* maxpool: where each maximum came from */
        float *mask;     /* dropout */
        float *mean, *rstd; /* layer norm */
        float *ones;     /* mean over tokens: T ones */
        BlockBufs blk;   /* transformer */
} Step;

struct Model {
        KBackend *kb;
        const KernelsOps *ops;
        ModelDesc *desc;
        size_t ntensors, in_n;
        uint32_t classes;
        int max_batch;

        size_t *numel;        /* per tensor */
        float **param_host;   /* per tensor, what the client pulls into */
        float **grad_host;    /* per tensor, what the client pushes */
        bool host_lent;       /* param_host and grad_host are the caller's (model_lend_host) */
        float **param_dev;    /* per tensor, backend copies; on a host_memory backend the */
        float **grad_dev;     /* host buffers themselves (no copies, nothing of their own) */

        Step *steps;
        size_t nsteps;
        float *x_dev;         /* the batch as uploaded (NCHW images) */
        bool permute_input;   /* act[0] is x_dev in NHWC */
        float **act;          /* nsteps + 1 */
        float *delta[2];      /* ping-pong gradients w.r.t. activations */
        /* Scratch shared by the transformer blocks' backward (they run one at a time). */
        float *scr[6];
        size_t scr_n[6];
        int32_t *y_dev;       /* labels of the batch */
        int32_t *pred_dev;    /* argmax of the logits */
        float *loss_dev;      /* per-sample losses */
        int32_t *pred_host;
        float *loss_host;

        float *x_stage;       /* host_alloc'd batch (max_batch samples) and labels */
        int32_t *y_stage;
        bool graphs;          /* capture full-batch training steps */
        bool transfers;       /* upload the batch, download losses and gradients */
        bool graph_failed;    /* the backend cannot capture: run ops directly */
        KGraph *graph;        /* the captured full-batch step */
        int pending;          /* batch of the step model_step_begin queued (0: none) */
        uint64_t seed, trained; /* dropout masks: of (seed, steps trained) */

        float *bufs[MODEL_MAX_BUFS]; /* every backend buffer besides the tensors', freed together */
        size_t nbufs;
};

/* A backend buffer of floats owned by the model. */
int model_buf(Model *m, size_t floats, float **ret);

/* layers.c: a step's buffers (and a check that the backend has its ops), its
 * forward (train: dropout on) and its backward. The backward reads dy, writes
 * the parameter gradients into grad_dev and the input gradient into dx
 * (*ret_moved 1) or over dy (*ret_moved 0; dx untouched). Without need_dx
 * (the first step) a step skips what only the input gradient needs; layer
 * norm and transformer blocks, whose parameter gradients come with it, may
 * still write dx, a scratch buffer then. */
int step_setup(Model *m, Step *s, char *err, size_t errlen);
int step_forward(Model *m, Step *s, int batch, bool train, const float *x, float *y);
int step_backward(Model *m, Step *s, int batch, const float *x, const float *y, float *dy, float *dx, bool need_dx,
                  int *ret_moved);
