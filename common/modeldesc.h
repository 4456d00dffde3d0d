/* SPDX-License-Identifier: Apache-2.0 */
/* A model's description: its input shape and its layers, from which pscoord
 * derives the job's tensors (named and laid out as PyTorch's state_dict of the
 * matching torch.nn model) and workerd builds its compute graph
 * (worker/models/model.c). Three spellings, one parser:
 *   - "mlp:D0-D1-...-Dn": Linear+ReLU layers and a last Linear (2..16 widths);
 *   - "lr:D": sparse logistic regression over a click log, a weight per id in
 *     the job's first table and a Linear(D, 1) over D dense features;
 *   - "dlrm:F:D-...-E:T1-...-1": DLRM over a click log of F fields, its rows
 *     of E floats in the job's first table, a bottom and a top MLP;
 *   - a built-in name: "cnn" (two conv blocks + classifier) or "vit" (7x7
 *     patches of a 28x28 image as 16 tokens, transformer blocks);
 *   - a JSON object (psctl --model FILE reads the file):
 *       {"name": "small", "input": [1, 28, 28],
 *        "layers": [{"type": "conv2d", "out": 16, "kernel": 3, "padding": 1},
 *                   {"type": "relu"}, {"type": "flatten"},
 *                   {"type": "linear", "out": 10}]}
 *     or, for a model the client computes (an external model: any PyTorch
 *     module, through psnet.torch), its tensors alone:
 *       {"name": "resnet18", "tensors": [
 *          {"name": "conv1.weight", "shape": [64, 1, 7, 7], "init": "he"},
 *          {"name": "bn1.running_mean", "shape": [64], "init": "zeros", "buffer": true}]}
 * A job carries the text (a JSON model in the canonical form modeldesc_format
 * writes, every default spelled out), so every program reads the same model.
 *
 * Shapes are per sample: rank 1 [D] (features), rank 2 [T, D] (tokens), rank 3
 * [C, H, W] (images). Errors name the layer (its index and type) and the field. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How a shard fills a tensor before training (job_init_chunk). */
typedef enum { INIT_ZEROS, INIT_HE, INIT_XAVIER, INIT_ONES, INIT_NORMAL } TensorInit;
#define INIT_NORMAL_STD 0.02

#define MD_MAX_LAYERS 64
#define MD_MAX_TENSORS 512         /* a torchvision ResNet-50's state_dict has 320 */
#define MD_MAX_NAME 96             /* a tensor's name, with its NUL */
#define MD_MAX_TEXT (64 * 1024)    /* a model's text in a job */
#define MD_MAX_FILE (256 * 1024)   /* a description file */
#define MD_MAX_DIM 65536u       /* a width, a channel count, a vocabulary */
#define MD_MAX_SPATIAL 4096u    /* an image side, a token count */
#define MD_MAX_KERNEL 64u
#define MD_MAX_TENSOR_FLOATS (1ull << 36) /* values in one tensor of an external model */
#define MD_MAX_SAMPLE_FLOATS (1u << 24) /* one sample's activation in any layer */
#define MD_MAX_FIELDS 64u       /* a click model's categorical fields */

typedef enum {
        LK_LINEAR,      /* out, init; rank 1 or 2 (applied to every token) */
        LK_CONV2D,      /* out, kernel, stride, padding, init; rank 3 */
        LK_MAXPOOL,     /* kernel, stride (default kernel), padding; rank 3 */
        LK_AVGPOOL,     /* the same; padding counts as zeros (PyTorch's default) */
        LK_FLATTEN,     /* rank 3 or 2 -> rank 1, in PyTorch's order (C, H, W) */
        LK_TOKENS,      /* [C, H, W] -> [H*W, C]: each position a token of C features */
        LK_RELU,
        LK_GELU,        /* exact (erf), as torch.nn.GELU() */
        LK_DROPOUT,     /* p; identity when evaluating */
        LK_LAYERNORM,   /* over the last dimension; eps */
        LK_EMBEDDING,   /* vocab, out: [T] token ids -> [T, out] */
        LK_POSEMBED,    /* [T, D] + a learned [T, D] */
        LK_TRANSFORMER, /* heads, hidden, causal: pre-norm attention and GELU MLP with residuals */
        LK_MEAN,        /* [T, D] -> [D], the mean over tokens */
        LK_COUNT
} LayerKind;

typedef struct MdShape {
        unsigned rank; /* 1..3 */
        uint32_t d[3];
} MdShape;

typedef struct MdLayer {
        LayerKind kind;
        uint32_t out, kernel, stride, padding, heads, hidden, vocab;
        bool causal;
        float p, eps;
        TensorInit init;       /* of the weight (linear, conv2d) */
        MdShape in, outs;      /* per sample */
        uint32_t first_tensor; /* its parameters: tensors first_tensor .. + ntensors - 1 */
        uint32_t ntensors;
} MdLayer;

typedef struct MdTensor {
        char name[MD_MAX_NAME]; /* PyTorch state_dict name, e.g. "0.weight" */
        uint32_t shape[4];  /* PyTorch's layout */
        unsigned ndim;
        uint64_t numel;
        TensorInit init;
        uint32_t fan_in, fan_out;
        bool buffer;        /* not trained: the shards keep the mean of the values workers push */
} MdTensor;

typedef struct ModelDesc {
        char name[128];  /* the mlp: string, the built-in's name, or the JSON's "name" */
        /* It came from its short text (mlp:, lr:, dlrm: or a built-in's
         * name), which name holds: its canonical text. A JSON model is
         * written as JSON whatever its "name". */
        bool spelled;
        MdShape input;
        MdLayer layers[MD_MAX_LAYERS];
        size_t nlayers;
        uint32_t classes; /* the last layer's width: the labels are 0..classes-1 */
        MdTensor tensors[MD_MAX_TENSORS];
        size_t ntensors;
        /* A list of tensors, no layers: the client computes the model (its
         * own framework, e.g. psnet.torch); no input shape, no classes. */
        bool external;
        /* "lr:D": a click model. Its samples are a click log's (ids per
         * categorical field, D dense features, a 0/1 label); its weight per
         * id lives in the job's first table (dim 1). */
        bool click;
        uint32_t click_dim;    /* floats of an id's row: lr 1, dlrm its embedding's E */
        uint32_t click_fields; /* dlrm: the categorical fields each sample has (lr: 0, any) */
        /* dlrm: its first dlrm_bottom tensors are the bottom MLP's, the rest
         * the top's (0: not a DLRM); its layers are the bottom's then the
         * top's, each sequence from its own input. */
        uint32_t dlrm_bottom;
} ModelDesc;

/* Reads any of the three spellings into *ret (shapes and tensors derived).
 * On failure writes why into err and returns -EINVAL. */
int modeldesc_parse(const char *text, ModelDesc *ret, char *err, size_t errlen);
/* The canonical text of a model: its short text (mlp:, lr:, dlrm:, a
 * built-in's name) where it came from one, else the JSON with every field
 * spelled out, whatever its "name". -ENOSPC if it does not fit n. */
int modeldesc_format(const ModelDesc *d, char *buf, size_t n);
/* The JSON with every field spelled out, whatever the spelling (a built-in
 * or mlp: string too): what an export carries. -ENOSPC if it does not fit. */
int modeldesc_json(const ModelDesc *d, char *buf, size_t n);
/* For --model: "mlp:...", a built-in name, or the path of a JSON file, read
 * and checked here. Writes the text a job carries into buf. */
int modeldesc_resolve(const char *spec, char *buf, size_t n, char *err, size_t errlen);

size_t md_shape_numel(const MdShape *s);
/* "[1, 28, 28]" */
const char *md_shape_string(const MdShape *s, char *buf, size_t n);
/* Any shape of ndim dimensions the same way: "[8, 1, 5, 5]" ("[]" for none;
 * cut short if it does not fit n). */
const char *md_dims_string(const uint64_t *d, unsigned ndim, char *buf, size_t n);
const char *layer_kind_name(LayerKind k);
/* True for the layers that behave differently when evaluating (dropout). */
bool modeldesc_has_dropout(const ModelDesc *d);
