/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for common/modeldesc.c: the three spellings of a model, the
 * shapes and PyTorch names of the built-in ones, the canonical text read back
 * to the same model, files, and an error for every kind of bad description
 * that names the layer and the field. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "modeldesc.h"
#include "tap.h"

static ModelDesc d;

static const MdTensor *tensor(const char *name) {
        for (size_t i = 0; i < d.ntensors; i++)
                if (strcmp(d.tensors[i].name, name) == 0)
                        return &d.tensors[i];
        return NULL;
}

static bool shape_is(const char *name, unsigned ndim, uint32_t a, uint32_t b, uint32_t c, uint32_t e) {
        const MdTensor *t = tensor(name);
        const uint32_t want[4] = { a, b, c, e };
        if (!t || t->ndim != ndim)
                return false;
        for (unsigned i = 0; i < ndim; i++)
                if (t->shape[i] != want[i])
                        return false;
        return true;
}

static void test_mlp(void) {
        char err[256];
        CHECK(modeldesc_parse("mlp:784-256-10", &d, err, sizeof err) == 0, "mlp parses (%s)", err);
        CHECK(d.nlayers == 3 && d.layers[0].kind == LK_LINEAR && d.layers[1].kind == LK_RELU &&
              d.layers[2].kind == LK_LINEAR, "mlp: linear, relu, linear");
        CHECK(d.ntensors == 4 && shape_is("0.weight", 2, 256, 784, 0, 0) && shape_is("0.bias", 1, 256, 0, 0, 0) &&
              shape_is("2.weight", 2, 10, 256, 0, 0) && shape_is("2.bias", 1, 10, 0, 0, 0),
              "mlp tensors are nn.Sequential's: 0.weight [256, 784], 2.weight [10, 256]");
        CHECK(d.classes == 10 && md_shape_numel(&d.input) == 784, "784 inputs, 10 classes");
        const char *bad[] = { "mlp:", "mlp:784", "mlp:784--10", "mlp:0-10", "mlp:784-65537", "mlp:1-2-3-4-5-6-7-8-9-10-11-12-13-14-15-16-17", "mlp:7-x" };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
                CHECK(modeldesc_parse(bad[i], &d, err, sizeof err) == -EINVAL && strstr(err, "mlp:D0-D1"),
                      "'%s' refused: %s", bad[i], err);
}

static void test_lr(void) {
        char err[256], text[64];
        CHECK(modeldesc_parse("lr:13", &d, err, sizeof err) == 0, "lr:13 parses (%s)", err);
        CHECK(d.click && d.nlayers == 1 && d.layers[0].kind == LK_LINEAR && d.layers[0].init == INIT_ZEROS &&
              d.ntensors == 2 && shape_is("0.weight", 2, 1, 13, 0, 0) && shape_is("0.bias", 1, 1, 0, 0, 0) &&
              md_shape_numel(&d.input) == 13 && d.classes == 1,
              "lr:13 is a click model with a Linear(13, 1) of zeros: 0.weight [1, 13], 0.bias [1]");
        CHECK(modeldesc_format(&d, text, sizeof text) == 0 && strcmp(text, "lr:13") == 0,
              "lr:13's canonical text is itself (%s)", text);
        CHECK(modeldesc_resolve("lr:4", text, sizeof text, err, sizeof err) == 0 && strcmp(text, "lr:4") == 0,
              "--model lr:4 resolves without a file (%s)", err);
        CHECK(modeldesc_parse("mlp:784-256-10", &d, err, sizeof err) == 0 && !d.click, "an mlp is no click model");
        const char *bad[] = { "lr:", "lr:0", "lr:x", "lr:4x", "lr:-4", "lr: 4", "lr:65537" };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
                CHECK(modeldesc_parse(bad[i], &d, err, sizeof err) == -EINVAL && strstr(err, "lr:D"),
                      "'%s' refused: %s", bad[i], err);
}

static void test_dlrm(void) {
        char err[256], text[4096];
        CHECK(modeldesc_parse("dlrm:26:13-64-16:32-8-1", &d, err, sizeof err) == 0, "dlrm parses (%s)", err);
        /* The top MLP takes E + F(F+1)/2 = 16 + 351 values. */
        CHECK(d.click && d.click_dim == 16 && d.click_fields == 26 && d.dlrm_bottom == 4 && d.ntensors == 10 &&
                      shape_is("bot.0.weight", 2, 64, 13, 0, 0) && shape_is("bot.2.weight", 2, 16, 64, 0, 0) &&
                      shape_is("bot.2.bias", 1, 16, 0, 0, 0) && shape_is("top.0.weight", 2, 32, 367, 0, 0) &&
                      shape_is("top.2.weight", 2, 8, 32, 0, 0) && shape_is("top.4.weight", 2, 1, 8, 0, 0) &&
                      shape_is("top.4.bias", 1, 1, 0, 0, 0) && md_shape_numel(&d.input) == 13 && d.classes == 1,
              "dlrm's tensors are two nn.Sequential's, bot.* and top.*, top.0 taking 16 + 26*27/2 values");
        /* Bottom: linear, relu, linear, relu; top: linear, relu, linear, relu, linear. */
        CHECK(d.nlayers == 9 && d.layers[3].kind == LK_RELU && d.layers[8].kind == LK_LINEAR &&
                      d.layers[4].first_tensor == 4 && d.layers[8].first_tensor == 8,
              "dlrm's layers: the bottom's (a ReLU last) then the top's");
        CHECK(modeldesc_format(&d, text, sizeof text) == 0 && strcmp(text, "dlrm:26:13-64-16:32-8-1") == 0,
              "dlrm's canonical text is itself (%s)", text);
        CHECK(modeldesc_json(&d, text, sizeof text) == 0 && strstr(text, "\"top.0.weight\",\"shape\":[32,367]"),
              "dlrm's JSON lists its tensors (%.120s)", text);
        CHECK(modeldesc_resolve("dlrm:2:3-4:1", text, sizeof text, err, sizeof err) == 0 &&
                      strcmp(text, "dlrm:2:3-4:1") == 0, "--model dlrm:2:3-4:1 resolves without a file (%s)", err);
        CHECK(modeldesc_parse("dlrm:2:3-4:1", &d, err, sizeof err) == 0 && d.ntensors == 4 &&
                      shape_is("top.0.weight", 2, 1, 7, 0, 0), "a top of one width is one Linear(E + 3, 1)");
        /* Leading zeros are the same model; its text (which a job carries) is without them. */
        const char *same[][2] = { { "dlrm:02:03-004:01", "dlrm:2:3-4:1" }, { "mlp:0784-010", "mlp:784-10" },
                                  { "lr:013", "lr:13" } };
        for (size_t i = 0; i < 3; i++)
                CHECK(modeldesc_parse(same[i][0], &d, err, sizeof err) == 0 &&
                              modeldesc_format(&d, text, sizeof text) == 0 && strcmp(text, same[i][1]) == 0,
                      "%s is written %s (%s)", same[i][0], text, err);
        /* A JSON model named as a short spelling is still written as JSON:
         * its text must read back as itself, not as the built-in. */
        const char *named = "{\"name\":\"cnn\",\"tensors\":[{\"name\":\"w\",\"shape\":[6,1,3,3],\"init\":\"he\"}]}";
        static ModelDesc back;
        CHECK(modeldesc_parse(named, &d, err, sizeof err) == 0 && modeldesc_format(&d, text, sizeof text) == 0 &&
                      text[0] == '{' && modeldesc_parse(text, &back, err, sizeof err) == 0 && back.ntensors == 1 &&
                      back.external,
              "a JSON model named \"cnn\" is written as JSON and reads back as itself (%.60s)", text);
        char longest[256] = "dlrm:64:";
        for (int i = 0; i < 16; i++)
                strcat(longest, i ? "-60000" : "60000");
        strcat(longest, ":");
        for (int i = 0; i < 15; i++)
                strcat(longest, "60000-");
        strcat(longest, "1");
        CHECK(modeldesc_parse(longest, &d, err, sizeof err) == -EINVAL && strstr(err, "longer than 127 characters"),
              "a DLRM whose text cannot be a job's model name is refused, saying so: %s", err);
        const char *bad[] = { "dlrm:", "dlrm:0:3-4:1", "dlrm:65:3-4:1", "dlrm:2:3:1", "dlrm:2:3-4:2",
                              "dlrm:2:3-4:8-2", "dlrm:2:3-4", "dlrm:2:3-4:1x", "dlrm:x:3-4:1", "dlrm:2:3-0:1" };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
                CHECK(modeldesc_parse(bad[i], &d, err, sizeof err) == -EINVAL && strstr(err, "dlrm:F:D-...-E"),
                      "'%s' refused: %s", bad[i], err);
}

static void test_builtins(void) {
        char err[256], sb[48];
        CHECK(modeldesc_parse("cnn", &d, err, sizeof err) == 0, "cnn (%s)", err);
        CHECK(shape_is("0.weight", 4, 32, 1, 3, 3) && shape_is("3.weight", 4, 64, 32, 3, 3) &&
              shape_is("7.weight", 2, 128, 3136, 0, 0) && shape_is("9.weight", 2, 10, 128, 0, 0) && d.ntensors == 8,
              "cnn: conv [32,1,3,3], conv [64,32,3,3], linear [128, 64*7*7], linear [10,128]");
        CHECK(d.layers[6].kind == LK_FLATTEN && d.layers[6].in.rank == 3 && d.layers[6].in.d[0] == 64 &&
              d.layers[6].in.d[1] == 7, "cnn flattens %s", md_shape_string(&d.layers[6].in, sb, sizeof sb));

        CHECK(modeldesc_parse("vit", &d, err, sizeof err) == 0, "vit (%s)", err);
        CHECK(d.layers[1].kind == LK_TOKENS && d.layers[1].outs.rank == 2 && d.layers[1].outs.d[0] == 16 &&
              d.layers[1].outs.d[1] == 64, "vit: 16 tokens of 64 from 7x7 patches (%s)",
              md_shape_string(&d.layers[1].outs, sb, sizeof sb));
        CHECK(shape_is("0.weight", 4, 64, 1, 7, 7) && shape_is("2.weight", 2, 16, 64, 0, 0) &&
              shape_is("3.self_attn.in_proj_weight", 2, 192, 64, 0, 0) &&
              shape_is("3.self_attn.out_proj.weight", 2, 64, 64, 0, 0) && shape_is("3.linear1.weight", 2, 128, 64, 0, 0) &&
              shape_is("3.linear2.weight", 2, 64, 128, 0, 0) && shape_is("5.norm2.bias", 1, 64, 0, 0, 0) &&
              shape_is("6.weight", 1, 64, 0, 0, 0) && shape_is("8.weight", 2, 10, 64, 0, 0),
              "vit: torch.nn.TransformerEncoderLayer names and layouts");
        CHECK(tensor("3.norm1.weight") && tensor("3.norm1.weight")->init == INIT_ONES &&
              tensor("2.weight")->init == INIT_NORMAL && tensor("3.self_attn.in_proj_weight")->init == INIT_XAVIER,
              "layer norm weights start at one, the position embedding normal, projections xavier");
        CHECK(d.ntensors <= MD_MAX_TENSORS && d.ntensors == 2 + 1 + 3 * 12 + 2 + 2, "vit: %zu tensors", d.ntensors);
        CHECK(modeldesc_parse("resnet", &d, err, sizeof err) == -EINVAL && strstr(err, "cnn, vit"),
              "unknown name refused: %s", err);
}

static void test_json(void) {
        char err[256], text[MD_MAX_TEXT];
        ModelDesc again;
        const char *json = "{\n \"name\": \"tiny\", \"input\": [3, 8, 8],\n \"layers\": [\n"
                           "  {\"type\": \"conv2d\", \"out\": 4, \"kernel\": 3, \"stride\": 2, \"padding\": 1, \"init\": \"xavier\"},\n"
                           "  {\"type\": \"gelu\"}, {\"type\": \"avgpool\", \"kernel\": 2},\n"
                           "  {\"type\": \"tokens\"}, {\"type\": \"layernorm\", \"eps\": 1e-6},\n"
                           "  {\"type\": \"transformer\", \"heads\": 2, \"hidden\": 8, \"causal\": true},\n"
                           "  {\"type\": \"mean\"}, {\"type\": \"dropout\", \"p\": 0.1}, {\"type\": \"linear\", \"out\": 5}]}";

        CHECK(modeldesc_parse(json, &d, err, sizeof err) == 0, "JSON model parses (%s)", err);
        CHECK(strcmp(d.name, "tiny") == 0 && d.classes == 5 && d.layers[0].outs.d[1] == 4 && d.layers[2].outs.d[1] == 2 &&
              d.layers[3].outs.rank == 2 && d.layers[3].outs.d[0] == 4 && d.layers[3].outs.d[1] == 4,
              "shapes: conv stride 2 -> 4x4, pool -> 2x2, 4 tokens of 4");
        CHECK(tensor("0.weight")->init == INIT_XAVIER && d.layers[5].causal && d.layers[4].eps == 1e-6f &&
              d.layers[7].p == 0.1f, "fields read");
        CHECK(modeldesc_format(&d, text, sizeof text) == 0 && text[0] == '{', "canonical text: %s", text);
        CHECK(modeldesc_parse(text, &again, err, sizeof err) == 0 && again.ntensors == d.ntensors &&
              again.nlayers == d.nlayers && memcmp(again.layers, d.layers, d.nlayers * sizeof d.layers[0]) == 0 &&
              memcmp(again.tensors, d.tensors, d.ntensors * sizeof d.tensors[0]) == 0,
              "the canonical text reads back to the same model");
        CHECK(modeldesc_format(&d, text, 40) == -ENOSPC, "a text that does not fit: -ENOSPC");

        /* A file, and --model's other spellings. */
        char path[] = "/tmp/psnet-modeldesc-XXXXXX";
        int fd = mkstemp(path);
        FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
        if (CHECK(f != NULL, "temporary file")) {
                fputs(json, f);
                fclose(f);
                CHECK(modeldesc_resolve(path, text, sizeof text, err, sizeof err) == 0 && strstr(text, "\"tiny\""),
                      "a file resolves to its canonical text");
                f = fopen(path, "w");
                if (f) {
                        fputs("{\"input\": [4], \"layers\": [{\"type\": \"linear\", \"out\": 0}]}", f);
                        fclose(f);
                }
                CHECK(modeldesc_resolve(path, text, sizeof text, err, sizeof err) == -EINVAL && strstr(err, path) &&
                      strstr(err, "layer 0 (linear)") && strstr(err, "'out'"), "a bad file's error names it: %s", err);
                unlink(path);
        }
        CHECK(modeldesc_resolve("/nonexistent/model.json", text, sizeof text, err, sizeof err) == -EINVAL &&
              strstr(err, "not a readable file"), "a missing file: %s", err);
        CHECK(modeldesc_resolve("cnn", text, sizeof text, err, sizeof err) == 0 && strcmp(text, "cnn") == 0,
              "a built-in resolves to its name");
}

static void test_errors(void) {
        static const struct {
                const char *json, *want1, *want2;
        } bad[] = {
                { "{\"input\":[4],\"layers\":[{\"type\":\"linear\"}]}", "layer 0 (linear)", "field 'out' missing" },
                { "{\"input\":[4],\"layers\":[{\"type\":\"linear\",\"out\":3,\"kernel\":2}]}", "layer 0 (linear)",
                  "unknown field 'kernel'" },
                { "{\"input\":[4],\"layers\":[{\"type\":\"linear\",\"out\":-3}]}", "layer 0 (linear)", "field 'out'" },
                { "{\"input\":[4],\"layers\":[{\"type\":\"linear\",\"out\":2.5}]}", "layer 0 (linear)", "field 'out'" },
                { "{\"input\":[4],\"layers\":[{\"type\":\"relu\"},{\"type\":\"dense\",\"out\":3}]}", "layer 1",
                  "unknown layer 'dense'" },
                { "{\"input\":[4],\"layers\":[{\"out\":3}]}", "layer 0", "field 'type'" },
                { "{\"input\":[1,8,8],\"layers\":[{\"type\":\"linear\",\"out\":3}]}", "layer 0 (linear)", "flatten" },
                { "{\"input\":[1,4,4],\"layers\":[{\"type\":\"conv2d\",\"out\":2,\"kernel\":5},{\"type\":\"flatten\"},"
                  "{\"type\":\"linear\",\"out\":2}]}", "layer 0 (conv2d)", "field 'kernel'" },
                { "{\"input\":[1,4,4],\"layers\":[{\"type\":\"maxpool\",\"kernel\":2,\"padding\":2}]}",
                  "layer 0 (maxpool)", "field 'padding'" },
                { "{\"input\":[4,6],\"layers\":[{\"type\":\"transformer\",\"heads\":4,\"hidden\":8}]}",
                  "layer 0 (transformer)", "field 'heads'" },
                { "{\"input\":[4],\"layers\":[{\"type\":\"dropout\",\"p\":1}]}", "layer 0 (dropout)", "field 'p'" },
                /* Below 1, but 1.0f as the float a layer keeps (its mask would scale by 1/0). */
                { "{\"input\":[4],\"layers\":[{\"type\":\"dropout\",\"p\":0.9999999995}]}", "layer 0 (dropout)",
                  "field 'p'" },
                { "{\"input\":[4],\"layers\":[{\"type\":\"layernorm\",\"eps\":1e-50}]}", "layer 0 (layernorm)",
                  "field 'eps'" },
                { "{\"input\":[4],\"layers\":[{\"type\":\"linear\",\"out\":3,\"init\":\"magic\"}]}", "layer 0 (linear)",
                  "field 'init'" },
                { "{\"input\":[4],\"layers\":[{\"type\":\"transformer\",\"heads\":1,\"hidden\":8,\"causal\":1}]}",
                  "layer 0 (transformer)", "field 'causal'" },
                { "{\"input\":[4],\"layers\":[{\"type\":\"relu\"},{\"type\":\"embedding\",\"vocab\":3,\"out\":2}]}",
                  "layer 1 (embedding)", "first layer" },
                { "{\"input\":[2,3],\"layers\":[{\"type\":\"linear\",\"out\":3}]}", "last layer", "flatten or mean" },
                { "{\"input\":[4],\"layers\":[{\"type\":\"relu\"}]}", "no parameters", NULL },
                { "{\"input\":[4],\"layers\":[]}", "field 'layers'", NULL },
                { "{\"input\":[0],\"layers\":[{\"type\":\"linear\",\"out\":3}]}", "field 'input'", NULL },
                { "{\"input\":[4],\"layers\":[{\"type\":\"linear\",\"out\":3}],\"optimizer\":\"adam\"}",
                  "unknown field 'optimizer'", NULL },
                { "{\"name\":\"a b\",\"input\":[4],\"layers\":[{\"type\":\"linear\",\"out\":3}]}", "field 'name'", NULL },
                { "{\"input\":[4],\"input\":[5],\"layers\":[{\"type\":\"linear\",\"out\":3}]}", "not valid JSON",
                  NULL },
                { "{\"input\":[4],\"layers\":[{\"type\":\"linear\",\"out\":3}", "not valid JSON", "line" },
        };
        char err[256];

        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
                int r = modeldesc_parse(bad[i].json, &d, err, sizeof err);
                CHECK(r == -EINVAL && strstr(err, bad[i].want1) && (!bad[i].want2 || strstr(err, bad[i].want2)),
                      "refused with '%s'%s%s: %s", bad[i].want1, bad[i].want2 ? " and " : "",
                      bad[i].want2 ? bad[i].want2 : "", err);
        }
        /* More than 512 tensors: 43 transformer blocks have 516. */
        static char big[MD_MAX_TEXT];
        size_t off = (size_t) snprintf(big, sizeof big, "{\"input\":[2,4],\"layers\":[");
        for (int i = 0; i < 43; i++)
                off += (size_t) snprintf(big + off, sizeof big - off, "{\"type\":\"transformer\",\"heads\":1,\"hidden\":4},");
        snprintf(big + off, sizeof big - off, "{\"type\":\"mean\"},{\"type\":\"linear\",\"out\":2}]}");
        CHECK(modeldesc_parse(big, &d, err, sizeof err) == -EINVAL && strstr(err, "parameter tensors"),
              "more than %d tensors refused: %s", MD_MAX_TENSORS, err);
        char *huge = malloc(MD_MAX_TEXT + 10);
        if (huge) {
                memset(huge, ' ', MD_MAX_TEXT + 9);
                huge[MD_MAX_TEXT + 9] = '\0';
                huge[0] = '{';
                CHECK(modeldesc_parse(huge, &d, err, sizeof err) == -EINVAL && strstr(err, "longer"),
                      "a text over %d bytes refused: %s", MD_MAX_TEXT, err);
                free(huge);
        }
}

/* A model of tensors alone (computed by its client): names as long as
 * torchvision's, buffers, inits, the canonical text read back, and refusals. */
static void test_external(void) {
        static char text[MD_MAX_TEXT];
        char err[256];
        const char *m = "{\"name\":\"resnet-part\",\"tensors\":["
                        "{\"name\":\"layer4.1.downsample.1.running_mean\",\"shape\":[512],\"buffer\":true},"
                        "{\"name\":\"conv1.weight\",\"shape\":[64,1,7,7],\"init\":\"he\"},"
                        "{\"name\":\"bn1.weight\",\"shape\":[64],\"init\":\"ones\"}]}";
        CHECK(modeldesc_parse(m, &d, err, sizeof err) == 0, "a list of tensors parses (%s)", err);
        const MdTensor *c = tensor("conv1.weight"), *b = tensor("layer4.1.downsample.1.running_mean");
        CHECK(d.external && d.nlayers == 0 && d.ntensors == 3 && d.classes == 0, "external, 3 tensors, no layers");
        CHECK(c && c->numel == 64 * 49 && c->fan_in == 49 && c->fan_out == 64 * 49 && c->init == INIT_HE && !c->buffer,
              "conv1.weight: numel, PyTorch's fans, he");
        CHECK(b && b->buffer && b->init == INIT_ZEROS && b->numel == 512, "a buffer of 512 zeros");
        CHECK(modeldesc_format(&d, text, sizeof text) == 0 && strstr(text, "\"buffer\":true") &&
              !strstr(text, "layers"), "the canonical text: %s", text);
        ModelDesc *again = malloc(sizeof *again);
        if (again) {
                CHECK(modeldesc_parse(text, again, err, sizeof err) == 0 && again->ntensors == d.ntensors &&
                      memcmp(again->tensors, d.tensors, sizeof d.tensors[0] * d.ntensors) == 0,
                      "the canonical text reads back to the same tensors");
                free(again);
        }
        /* 512 tensors fit the text and the model; 513 do not. */
        size_t off = (size_t) snprintf(text, sizeof text, "{\"tensors\":[");
        for (int i = 0; i < MD_MAX_TENSORS; i++)
                off += (size_t) snprintf(text + off, sizeof text - off, "%s{\"name\":\"layer%d.conv.weight\",\"shape\":[8,8]}",
                                         i ? "," : "", i);
        snprintf(text + off, sizeof text - off, "]}");
        CHECK(modeldesc_parse(text, &d, err, sizeof err) == 0 && d.ntensors == MD_MAX_TENSORS, "%d tensors (%s)",
              MD_MAX_TENSORS, err);
        snprintf(text + off, sizeof text - off, ",{\"name\":\"x\",\"shape\":[1]}]}");
        CHECK(modeldesc_parse(text, &d, err, sizeof err) == -EINVAL && strstr(err, "1..512 tensors"),
              "513 refused: %s", err);
        static const struct {
                const char *json, *want;
        } bad[] = {
                { "{\"tensors\":[]}", "1..512 tensors" },
                { "{\"tensors\":[{\"name\":\"a\",\"shape\":[2]}],\"input\":[2]}", "unknown field 'input'" },
                { "{\"tensors\":[{\"name\":\"a b\",\"shape\":[2]}]}", "tensor 0: field 'name'" },
                { "{\"tensors\":[{\"name\":\"a\",\"shape\":[2]},{\"name\":\"a\",\"shape\":[3]}]}", "used twice" },
                { "{\"tensors\":[{\"name\":\"a\"}]}", "tensor 0 (a): field 'shape' is required" },
                { "{\"tensors\":[{\"name\":\"a\",\"shape\":[2,0]}]}", "dimension 1" },
                { "{\"tensors\":[{\"name\":\"a\",\"shape\":[1,2,3,4,5]}]}", "1 to 4 dimensions" },
                { "{\"tensors\":[{\"name\":\"a\",\"shape\":[4],\"init\":\"he\"}]}", "2 dimensions or more" },
                { "{\"tensors\":[{\"name\":\"a\",\"shape\":[4],\"init\":\"kaiming\"}]}", "field 'init'" },
                { "{\"tensors\":[{\"name\":\"a\",\"shape\":[4],\"dtype\":\"f16\"}]}", "unknown field 'dtype'" },
                { "{\"tensors\":[{\"name\":\"a\",\"shape\":[4],\"buffer\":true}]}", "no parameters to train" },
                { "{\"tensors\":[{\"name\":\"a\",\"shape\":[65536,65536,65536]}]}", "more than 68719476736 values" },
                /* 2^64 values would wrap to 0 in a uint64_t */
                { "{\"tensors\":[{\"name\":\"a\",\"shape\":[65536,65536,65536,65536]}]}", "more than 68719476736" },
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
                CHECK(modeldesc_parse(bad[i].json, &d, err, sizeof err) == -EINVAL && strstr(err, bad[i].want),
                      "refused with '%s': %s", bad[i].want, err);
}

int main(void) {
        test_external();
        test_mlp();
        test_lr();
        test_dlrm();
        test_builtins();
        test_json();
        test_errors();
        return tap_done();
}
