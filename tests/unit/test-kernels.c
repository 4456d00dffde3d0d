/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests for kernels/: backend selection, then every op of every backend this
 * machine can run (always the CPU reference; CUDA too when built and a device is
 * usable) against naive double-precision loops on random inputs, and the
 * rejection of bad shapes. Data goes through alloc/upload/download, so the same
 * checks hold for device backends.
 *
 * Tolerances: u = FLT_EPSILON / 2 is float's unit roundoff. A float dot product
 * of length k is within about k*u*sum|a_i b_i| of the exact value, so gemm is
 * checked against 4*(k+2)*FLT_EPSILON*(|alpha| sum|a||b| + |beta||c|), colsum
 * against 2*rows*FLT_EPSILON*sum|x|. Elementwise ops (bias_act, act_backward,
 * sgd_step) do one or two roundings: 4*FLT_EPSILON relative. softmax_xent uses
 * expf/logf (a few ulp each) over <= 16 classes: 1e-5 relative on the loss and
 * 1e-6 absolute on the gradient, whose entries are in [-1, 1]. gemm_ep: gemm's
 * bound plus |bias| for the sum, and colsum's bound for its bias gradient. TF32
 * products keep 10 mantissa bits (relative error up to 2^-10 each), so a TF32
 * gemm gets 2^-9 sum|a||b| on top of the fp32 bound. */
#include <errno.h>
#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "kernels.h"
#include "tap.h"

#define RNG_SEED 0x9e3779b97f4a7c15ull
#include "rng.h"

static void fill_uniform(float *x, size_t n, float lo, float hi) {
        for (size_t i = 0; i < n; i++)
                x[i] = rng_uniform(lo, hi);
}

static void *xmalloc(size_t n) {
        void *p = malloc(n ? n : 1);
        if (!p) {
                printf("Bail out! out of memory\n");
                exit(1);
        }
        return p;
}

/* Backend buffer holding a copy of host; NULL (and a failed check) on error.
 * Success adds no TAP line: the check that uses the buffer reports. */
static void *dev_from(KBackend *kb, const void *host, size_t bytes) {
        void *p = NULL;
        int r = kb->ops->alloc(kb, bytes, &p);
        if (r < 0) {
                CHECK(false, "%s: alloc %zu bytes: %s", kb->ops->name, bytes, strerror(-r));
                return NULL;
        }
        r = kb->ops->upload(kb, p, host, bytes);
        if (r < 0) {
                CHECK(false, "%s: upload %zu bytes: %s", kb->ops->name, bytes, strerror(-r));
                kb->ops->free(kb, p);
                return NULL;
        }
        return p;
}

static bool dev_to(KBackend *kb, void *host, const void *dev, size_t bytes) {
        return kb->ops->download(kb, host, dev, bytes) == 0;
}

static void dev_release(KBackend *kb, void *p) {
        if (p)
                kb->ops->free(kb, p);
}

static void test_select(void) {
        KBackend *kb = NULL;
        char err[256];
        int r;

        r = kbackend_new("cpu", 1, &kb, err, sizeof err);
        CHECK(r == 0 && kb && strcmp(kb->ops->name, "cpu") == 0, "kbackend_new(cpu) gives cpu");
        kb = kbackend_free(kb);
        CHECK(kb == NULL, "kbackend_free returns NULL");
        CHECK(kbackend_free(NULL) == NULL, "kbackend_free(NULL) is safe");

        r = kbackend_new("tpu", 0, &kb, err, sizeof err);
        CHECK(r == -EINVAL && strstr(err, "tpu") && strstr(err, "cpu"),
              "unknown backend rejected with a clear reason: %s", err);
        r = kbackend_new("cpu", -1, &kb, err, sizeof err);
        CHECK(r == -EINVAL, "negative thread count rejected");

        r = kbackend_new("auto", 0, &kb, err, sizeof err);
        CHECK(r == 0 && kb && (strcmp(kb->ops->name, "cpu") == 0 || kbackend_cuda_built()),
              "auto always gives a backend (%s)", kb ? kb->ops->name : "none");
        kb = kbackend_free(kb);

        r = kbackend_new("cuda", 0, &kb, err, sizeof err);
        if (kbackend_cuda_built())
                CHECK(r == 0 || (r < 0 && err[0] != '\0'), "cuda: a backend or a reason (%s)",
                      r == 0 ? "ok" : err);
        else
                CHECK(r == -ENODEV && strstr(err, "no CUDA backend"),
                      "cuda in a build without it: -ENODEV with a reason: %s", err);
        kb = kbackend_free(kb);
}

/* Element (i, j) of op(A) op(B) in double, and the sum of |products| (the scale
 * of its rounding error); stored A is (ta ? k x m : m x k), B (tb ? n x k : k x n). */
static double ref_dot(const float *a, int lda, bool ta, const float *b, int ldb, bool tb, int i, int j,
                      int k, double *ret_sabs) {
        double s = 0, sabs = 0;
        for (int p = 0; p < k; p++) {
                double av = ta ? a[(size_t) p * lda + i] : a[(size_t) i * lda + p];
                double bv = tb ? b[(size_t) j * ldb + p] : b[(size_t) p * ldb + j];
                s += av * bv;
                sabs += fabs(av * bv);
        }
        *ret_sabs = sabs;
        return s;
}

/* One gemm against the double reference; stored A is (ta ? k x m : m x k). */
static void check_gemm(KBackend *kb, bool ta, bool tb, int m, int n, int k, int pad, float alpha,
                       float beta) {
        int lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
        size_t na = (size_t) (ta ? k : m) * lda, nb = (size_t) (tb ? n : k) * ldb,
               nc = (size_t) m * ldc;
        float *a = xmalloc(na * sizeof(float)), *b = xmalloc(nb * sizeof(float));
        float *c0 = xmalloc(nc * sizeof(float)), *c = xmalloc(nc * sizeof(float));
        float *da, *db, *dc;
        double worst = 0.0;
        bool pad_ok = true, ok = false;

        fill_uniform(a, na, -1, 1);
        fill_uniform(b, nb, -1, 1);
        fill_uniform(c0, nc, -1, 1);
        if (beta == 0.0f) /* beta == 0 must not read C: poison it */
                for (size_t i = 0; i < nc; i++)
                        c0[i] = NAN;
        da = dev_from(kb, a, na * sizeof(float));
        db = dev_from(kb, b, nb * sizeof(float));
        dc = dev_from(kb, c0, nc * sizeof(float));
        if (da && db && dc &&
            kb->ops->gemm(kb, ta, tb, m, n, k, alpha, da, lda, db, ldb, beta, dc, ldc) == 0 &&
            dev_to(kb, c, dc, nc * sizeof(float))) {
                ok = true;
                for (int i = 0; i < m; i++) {
                        for (int j = 0; j < n; j++) {
                                double sabs, ref, tol, cij = beta == 0.0f ? 0.0 : c0[(size_t) i * ldc + j];
                                double s = ref_dot(a, lda, ta, b, ldb, tb, i, j, k, &sabs);
                                ref = alpha * s + beta * cij;
                                tol = 4.0 * (k + 2) * FLT_EPSILON *
                                      (fabs(alpha) * sabs + fabs(beta) * fabs(cij));
                                double e = fabs(c[(size_t) i * ldc + j] - ref);
                                if (!(e <= tol))
                                        ok = false;
                                if (e > worst)
                                        worst = e;
                        }
                        for (int j = n; j < ldc; j++) /* the padding is not C's */
                                if (memcmp(&c[(size_t) i * ldc + j], &c0[(size_t) i * ldc + j],
                                           sizeof(float)) != 0)
                                        pad_ok = false;
                }
        }
        CHECK(ok && pad_ok, "%s: gemm ta=%d tb=%d m=%d n=%d k=%d lda=%d ldb=%d ldc=%d alpha=%g beta=%g "
              "(worst error %.2e, padding kept %d)", kb->ops->name, ta, tb, m, n, k, lda, ldb, ldc,
              alpha, beta, worst, pad_ok);
        dev_release(kb, da);
        dev_release(kb, db);
        dev_release(kb, dc);
        free(a);
        free(b);
        free(c0);
        free(c);
}

static void test_gemm(KBackend *kb) {
        float buf[64] = { 0 };
        float *d = dev_from(kb, buf, sizeof buf);

        for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++) {
                        check_gemm(kb, ta, tb, 5, 7, 3, 0, 1.0f, 0.0f);
                        check_gemm(kb, ta, tb, 17, 13, 33, 3, 0.7f, -0.3f);
                        check_gemm(kb, ta, tb, 1, 64, 9, 1, -1.5f, 1.0f);
                }
        check_gemm(kb, false, true, 4, 6, 0, 2, 1.0f, 0.5f); /* k == 0: C = beta C */
        check_gemm(kb, true, false, 3, 2, 100, 5, 2.0f, 0.0f);

        if (!d)
                return;
        /* 2x2 by 2x2 with tight leading dimensions is valid; shrink one at a time. */
        CHECK(kb->ops->gemm(kb, false, false, 2, 2, 2, 1, d, 2, d + 16, 2, 0, d + 32, 2) == 0,
              "%s: gemm tight shapes accepted", kb->ops->name);
        CHECK(kb->ops->gemm(kb, false, false, -1, 2, 2, 1, d, 2, d + 16, 2, 0, d + 32, 2) == -EINVAL,
              "%s: gemm m < 0 rejected", kb->ops->name);
        CHECK(kb->ops->gemm(kb, false, false, 2, -2, 2, 1, d, 2, d + 16, 2, 0, d + 32, 2) == -EINVAL,
              "%s: gemm n < 0 rejected", kb->ops->name);
        CHECK(kb->ops->gemm(kb, false, false, 2, 2, -2, 1, d, 2, d + 16, 2, 0, d + 32, 2) == -EINVAL,
              "%s: gemm k < 0 rejected", kb->ops->name);
        CHECK(kb->ops->gemm(kb, false, false, 2, 3, 4, 1, d, 3, d + 16, 3, 0, d + 32, 3) == -EINVAL,
              "%s: gemm lda < k rejected", kb->ops->name);
        CHECK(kb->ops->gemm(kb, true, false, 4, 2, 3, 1, d, 3, d + 16, 2, 0, d + 32, 2) == -EINVAL,
              "%s: gemm trans_a lda < m rejected", kb->ops->name);
        CHECK(kb->ops->gemm(kb, false, false, 2, 4, 3, 1, d, 3, d + 16, 3, 0, d + 32, 4) == -EINVAL,
              "%s: gemm ldb < n rejected", kb->ops->name);
        CHECK(kb->ops->gemm(kb, false, true, 2, 2, 3, 1, d, 3, d + 16, 2, 0, d + 32, 2) == -EINVAL,
              "%s: gemm trans_b ldb < k rejected", kb->ops->name);
        CHECK(kb->ops->gemm(kb, false, false, 2, 3, 2, 1, d, 2, d + 16, 3, 0, d + 32, 2) == -EINVAL,
              "%s: gemm ldc < n rejected", kb->ops->name);
        dev_release(kb, d);
}

static void test_bias_act(KBackend *kb) {
        enum { R = 13, C = 21 };
        float y0[R * C], bias[C], y[R * C];
        float *dy, *db;

        fill_uniform(y0, R * C, -2, 2);
        fill_uniform(bias, C, -1, 1);
        for (int act = KACT_NONE; act <= KACT_RELU; act++)
                for (int with_bias = 0; with_bias < 2; with_bias++) {
                        bool ok = false;
                        dy = dev_from(kb, y0, sizeof y0);
                        db = dev_from(kb, bias, sizeof bias);
                        if (dy && db &&
                            kb->ops->bias_act(kb, dy, with_bias ? db : NULL, R, C, (KAct) act) == 0 &&
                            dev_to(kb, y, dy, sizeof y)) {
                                ok = true;
                                for (int r = 0; r < R; r++)
                                        for (int c = 0; c < C; c++) {
                                                double v = (double) y0[r * C + c] + (with_bias ? bias[c] : 0.0);
                                                if (act == KACT_RELU && v < 0)
                                                        v = 0;
                                                if (!(fabs(y[r * C + c] - v) <= 4 * FLT_EPSILON * fmax(1, fabs(v))))
                                                        ok = false;
                                        }
                        }
                        CHECK(ok, "%s: bias_act act=%d bias=%d matches reference", kb->ops->name, act,
                              with_bias);
                        if (dy) {
                                CHECK(kb->ops->bias_act(kb, dy, db, -1, C, (KAct) act) == -EINVAL,
                                      "%s: bias_act rows < 0 rejected", kb->ops->name);
                                CHECK(kb->ops->bias_act(kb, dy, db, R, -1, (KAct) act) == -EINVAL,
                                      "%s: bias_act cols < 0 rejected", kb->ops->name);
                        }
                        dev_release(kb, dy);
                        dev_release(kb, db);
                }
        dy = dev_from(kb, y0, sizeof y0);
        if (dy)
                CHECK(kb->ops->bias_act(kb, dy, NULL, R, C, (KAct) 7) == -EINVAL,
                      "%s: bias_act unknown activation rejected", kb->ops->name);
        dev_release(kb, dy);
}

static void test_act_backward(KBackend *kb) {
        enum { N = 301 };
        float g0[N], y[N], g[N];
        float *dg, *dy;

        fill_uniform(g0, N, -3, 3);
        for (int i = 0; i < N; i++) /* a ReLU output: zeros (exact) and positives */
                y[i] = i % 3 == 0 ? 0.0f : rng_uniform(0.001f, 2);
        for (int act = KACT_NONE; act <= KACT_RELU; act++) {
                bool ok = false;
                dg = dev_from(kb, g0, sizeof g0);
                dy = dev_from(kb, y, sizeof y);
                if (dg && dy && kb->ops->act_backward(kb, dg, dy, N, (KAct) act) == 0 &&
                    dev_to(kb, g, dg, sizeof g)) {
                        ok = true;
                        for (int i = 0; i < N; i++) {
                                double ref = act == KACT_RELU && !(y[i] > 0) ? 0.0 : g0[i];
                                if (!(fabs(g[i] - ref) <= 4 * FLT_EPSILON * fmax(1, fabs(ref))))
                                        ok = false;
                        }
                }
                CHECK(ok, "%s: act_backward act=%d matches reference (0 where y == 0)", kb->ops->name,
                      act);
                if (dg)
                        CHECK(kb->ops->act_backward(kb, dg, dy, N, (KAct) 3) == -EINVAL,
                              "%s: act_backward unknown activation rejected", kb->ops->name);
                dev_release(kb, dg);
                dev_release(kb, dy);
        }
}

static void test_colsum(KBackend *kb) {
        enum { R = 37, C = 11 };
        float x[R * C], out[C];
        float *dx = NULL, *dout = NULL;
        bool ok = false;

        fill_uniform(x, R * C, -5, 5);
        fill_uniform(out, C, -1, 1); /* garbage that must be overwritten */
        dx = dev_from(kb, x, sizeof x);
        dout = dev_from(kb, out, sizeof out);
        if (dx && dout && kb->ops->colsum(kb, dx, R, C, dout) == 0 && dev_to(kb, out, dout, sizeof out)) {
                ok = true;
                for (int c = 0; c < C; c++) {
                        double s = 0, sabs = 0;
                        for (int r = 0; r < R; r++) {
                                s += x[r * C + c];
                                sabs += fabs(x[r * C + c]);
                        }
                        if (!(fabs(out[c] - s) <= 2.0 * R * FLT_EPSILON * sabs))
                                ok = false;
                }
        }
        CHECK(ok, "%s: colsum %dx%d matches reference", kb->ops->name, R, C);
        if (dx) {
                CHECK(kb->ops->colsum(kb, dx, -1, C, dout) == -EINVAL, "%s: colsum rows < 0 rejected",
                      kb->ops->name);
                CHECK(kb->ops->colsum(kb, dx, R, -1, dout) == -EINVAL, "%s: colsum cols < 0 rejected",
                      kb->ops->name);
        }
        dev_release(kb, dx);
        dev_release(kb, dout);
}

/* softmax_xent on rows x cols logits; alias: dlogits written over the logits. */
static void check_xent(KBackend *kb, const char *what, const float *x, const int32_t *lab, int rows,
                       int cols, float scale, bool alias) {
        size_t n = (size_t) rows * cols;
        float *d = xmalloc(n * sizeof(float)), *loss = xmalloc(rows * sizeof(float));
        float *dx = dev_from(kb, x, n * sizeof(float)), *dd = NULL, *dl = NULL;
        int32_t *dlab = dev_from(kb, lab, rows * sizeof(int32_t));
        double worst_loss = 0, worst_grad = 0;
        bool ok = false;

        if (!alias)
                dd = dev_from(kb, x, n * sizeof(float));
        dl = dev_from(kb, loss, rows * sizeof(float));
        if (dx && dlab && dl && (alias || dd) &&
            kb->ops->softmax_xent(kb, dx, dlab, rows, cols, scale, alias ? dx : dd, dl) == 0 &&
            dev_to(kb, d, alias ? dx : dd, n * sizeof(float)) &&
            dev_to(kb, loss, dl, rows * sizeof(float))) {
                ok = true;
                for (int r = 0; r < rows; r++) {
                        const float *xr = x + (size_t) r * cols;
                        double mx = xr[0], s = 0, lse, ref_loss;
                        for (int c = 1; c < cols; c++)
                                mx = fmax(mx, xr[c]);
                        for (int c = 0; c < cols; c++)
                                s += exp(xr[c] - mx);
                        lse = mx + log(s);
                        ref_loss = lse - xr[lab[r]];
                        if (!isfinite(loss[r]) || !(fabs(loss[r] - ref_loss) <= 1e-5 * fmax(1, ref_loss)))
                                ok = false;
                        worst_loss = fmax(worst_loss, fabs(loss[r] - ref_loss));
                        for (int c = 0; c < cols; c++) {
                                double ref = (exp(xr[c] - lse) - (c == lab[r])) * scale;
                                double e = fabs(d[(size_t) r * cols + c] - ref);
                                if (!(e <= 1e-6))
                                        ok = false;
                                worst_grad = fmax(worst_grad, e);
                        }
                }
        }
        CHECK(ok, "%s: softmax_xent %s (%dx%d, alias=%d; worst loss error %.1e, grad error %.1e)",
              kb->ops->name, what, rows, cols, alias, worst_loss, worst_grad);
        dev_release(kb, dx);
        dev_release(kb, dd);
        dev_release(kb, dl);
        dev_release(kb, dlab);
        free(d);
        free(loss);
}

/* softmax_xent's verdict: from the call, or (CUDA) from the sync after it. */
static int xent_status(KBackend *kb, const float *x, const int32_t *labels, int rows, int cols, float *d) {
        int r = kb->ops->softmax_xent(kb, x, labels, rows, cols, 1, d, d);
        return r < 0 ? r : kb->ops->sync(kb);
}

static void test_softmax_xent(KBackend *kb) {
        enum { R = 9, C = 10 };
        float x[R * C], big[4 * 16], buf[R * C];
        int32_t lab[R], lab4[4], bad[R];
        float *dx, *dl;
        int32_t *dbad;

        fill_uniform(x, R * C, -4, 4);
        for (int r = 0; r < R; r++)
                lab[r] = (int32_t) (rng_next() % C);
        lab[0] = 0;
        lab[1] = C - 1;
        check_xent(kb, "random", x, lab, R, C, 1.0f / R, false);
        check_xent(kb, "random in place", x, lab, R, C, 1.0f / R, true);
        check_xent(kb, "one class", x, (int32_t[]) { 0, 0, 0 }, 3, 1, 1.0f, false);

        /* exp(x) overflows float beyond 88.7: rows near +1000, near -1000, and a
         * row whose label is 200 below the max (softmax underflows to 0 there,
         * the loss must still be ~200, not inf). */
        for (int c = 0; c < 16; c++) {
                big[c] = 1000.0f + rng_uniform(-3, 3);
                big[16 + c] = -1000.0f + rng_uniform(-3, 3);
                big[32 + c] = 0.0f;
                big[48 + c] = 88.0f + (float) c;
        }
        big[32 + 5] = 200.0f;
        lab4[0] = 3;
        lab4[1] = 15;
        lab4[2] = 0;
        lab4[3] = 2;
        check_xent(kb, "large logits", big, lab4, 4, 16, 0.25f, false);
        check_xent(kb, "large logits in place", big, lab4, 4, 16, 0.25f, true);

        memcpy(bad, lab, sizeof bad);
        dx = dev_from(kb, x, sizeof x);
        dl = dev_from(kb, buf, sizeof buf);
        bad[4] = C;
        dbad = dev_from(kb, bad, sizeof bad);
        if (dx && dl && dbad) {
                float before[R * C], after[R * C];
                bool same = dev_to(kb, before, dl, sizeof before);
                CHECK(xent_status(kb, dx, dbad, R, C, dl) == -EINVAL,
                      "%s: softmax_xent label == cols rejected", kb->ops->name);
                same = same && dev_to(kb, after, dl, sizeof after) && memcmp(before, after, sizeof after) == 0;
                CHECK(same, "%s: a batch with a bad label writes nothing", kb->ops->name);
                CHECK(xent_status(kb, dx, dbad, R, C, dl) == -EINVAL &&
                      kb->ops->sync(kb) == 0, "%s: the error is reported once per bad batch", kb->ops->name);
        }
        dev_release(kb, dbad);
        bad[4] = -1;
        dbad = dev_from(kb, bad, sizeof bad);
        if (dx && dl && dbad) {
                CHECK(xent_status(kb, dx, dbad, R, C, dl) == -EINVAL,
                      "%s: softmax_xent label -1 rejected", kb->ops->name);
                CHECK(kb->ops->softmax_xent(kb, dx, dbad, R, 0, 1, dl, dl) == -EINVAL,
                      "%s: softmax_xent cols == 0 rejected", kb->ops->name);
                CHECK(kb->ops->softmax_xent(kb, dx, dbad, -1, C, 1, dl, dl) == -EINVAL,
                      "%s: softmax_xent rows < 0 rejected", kb->ops->name);
        }
        dev_release(kb, dbad);
        dev_release(kb, dx);
        dev_release(kb, dl);
}

static void test_argmax(KBackend *kb) {
        enum { R = 23, C = 7 };
        float x[R * C];
        int32_t out[R];
        float *dx;
        int32_t *dout;
        bool ok = false;

        fill_uniform(x, R * C, -1, 1);
        for (int c = 0; c < C; c++) /* ties: the first index wins */
                x[c] = 0.5f;
        x[C + 0] = -3; /* max at the last column */
        x[C + C - 1] = 3;
        dx = dev_from(kb, x, sizeof x);
        dout = dev_from(kb, out, sizeof out);
        if (dx && dout && kb->ops->argmax(kb, dx, R, C, dout) == 0 && dev_to(kb, out, dout, sizeof out)) {
                ok = true;
                for (int r = 0; r < R; r++) {
                        int best = 0;
                        for (int c = 1; c < C; c++)
                                if (x[r * C + c] > x[r * C + best])
                                        best = c;
                        if (out[r] != best)
                                ok = false;
                }
                ok = ok && out[0] == 0 && out[1] == C - 1;
        }
        CHECK(ok, "%s: argmax %dx%d matches reference (ties to the first)", kb->ops->name, R, C);
        if (dx)
                CHECK(kb->ops->argmax(kb, dx, R, 0, dout) == -EINVAL, "%s: argmax cols == 0 rejected",
                      kb->ops->name);
        dev_release(kb, dx);
        dev_release(kb, dout);
}

static void test_sgd_step(KBackend *kb) {
        enum { N = 1000 };
        static float w0[N], g[N], v0[N], w[N], v[N];
        float *dw, *dg, *dv;
        bool ok = false;

        fill_uniform(w0, N, -1, 1);
        fill_uniform(g, N, -1, 1);
        fill_uniform(v0, N, -1, 1);
        dw = dev_from(kb, w0, sizeof w0);
        dg = dev_from(kb, g, sizeof g);
        dv = dev_from(kb, v0, sizeof v0);
        /* Two steps, so that the second one starts from the first's velocity. */
        if (dw && dg && dv && kb->ops->sgd_step(kb, dw, dg, dv, N, 0.1f, 0.9f) == 0 &&
            kb->ops->sgd_step(kb, dw, dg, dv, N, 0.1f, 0.9f) == 0 && dev_to(kb, w, dw, sizeof w) &&
            dev_to(kb, v, dv, sizeof v)) {
                ok = true;
                for (int i = 0; i < N; i++) {
                        const double mu = 0.9f, lr = 0.1f; /* the floats the op got */
                        double rv = mu * v0[i] + g[i], rw = w0[i] - lr * rv;
                        rv = mu * rv + g[i];
                        rw -= lr * rv;
                        /* Values are O(1) and four roundings each: 8 FLT_EPSILON. */
                        if (!(fabs(v[i] - rv) <= 8 * FLT_EPSILON * fmax(1, fabs(rv))) ||
                            !(fabs(w[i] - rw) <= 8 * FLT_EPSILON * fmax(1, fabs(rw))))
                                ok = false;
                }
        }
        CHECK(ok, "%s: sgd_step (momentum 0.9, two steps) matches reference", kb->ops->name);
        dev_release(kb, dw);
        dev_release(kb, dg);
        dev_release(kb, dv);
}

/* One gemm_ep against the double reference (alpha 1, beta 0); tf32 widens the bound. */
static void check_gemm_ep(KBackend *kb, bool ta, bool tb, int m, int n, int k, int pad, KEpilogue ep,
                          bool tf32) {
        static const char *const names[] = { "none", "bias", "bias+relu", "bgrad" };
        int lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
        size_t na = (size_t) (ta ? k : m) * lda, nb = (size_t) (tb ? n : k) * ldb, nc = (size_t) m * ldc;
        size_t nv = ep == KEPI_BGRAD ? (size_t) m : (size_t) n;
        float *a = xmalloc(na * sizeof(float)), *b = xmalloc(nb * sizeof(float));
        float *c0 = xmalloc(nc * sizeof(float)), *c = xmalloc(nc * sizeof(float));
        float *v0 = xmalloc(nv * sizeof(float)), *v = xmalloc(nv * sizeof(float));
        float *da, *db, *dc, *dv;
        double worst = 0.0, extra = tf32 ? 1.0 / 512 : 0.0;
        bool ok = false;

        fill_uniform(a, na, -1, 1);
        fill_uniform(b, nb, -1, 1);
        for (size_t i = 0; i < nc; i++) /* poison: every element must be written */
                c0[i] = NAN;
        if (ep == KEPI_BGRAD)
                for (size_t i = 0; i < nv; i++)
                        v0[i] = NAN;
        else
                fill_uniform(v0, nv, -1, 1);
        da = dev_from(kb, a, na * sizeof(float));
        db = dev_from(kb, b, nb * sizeof(float));
        dc = dev_from(kb, c0, nc * sizeof(float));
        dv = dev_from(kb, v0, nv * sizeof(float));
        if (da && db && dc && dv &&
            kb->ops->gemm_ep(kb, ta, tb, m, n, k, da, lda, db, ldb, dc, ldc, ep, ep == KEPI_NONE ? NULL : dv) == 0 &&
            dev_to(kb, c, dc, nc * sizeof(float)) && dev_to(kb, v, dv, nv * sizeof(float))) {
                ok = true;
                for (int i = 0; i < m; i++) {
                        double rs = 0, rsabs = 0;
                        for (int j = 0; j < n; j++) {
                                double sabs, ref, tol, e;
                                ref = ref_dot(a, lda, ta, b, ldb, tb, i, j, k, &sabs);
                                tol = (4.0 * (k + 2) * FLT_EPSILON + extra) * sabs;
                                if (ep == KEPI_BIAS || ep == KEPI_BIAS_RELU) {
                                        ref += v0[j];
                                        tol += 4.0 * FLT_EPSILON * fabs(v0[j]);
                                        if (ep == KEPI_BIAS_RELU && ref < 0)
                                                ref = 0;
                                }
                                e = fabs(c[(size_t) i * ldc + j] - ref);
                                if (!(e <= tol))
                                        ok = false;
                                worst = fmax(worst, e);
                        }
                        if (ep != KEPI_BGRAD)
                                continue;
                        for (int p = 0; p < k; p++) {
                                double av = ta ? a[(size_t) p * lda + i] : a[(size_t) i * lda + p];
                                rs += av;
                                rsabs += fabs(av);
                        }
                        if (!(fabs(v[i] - rs) <= 2.0 * (k + 2) * FLT_EPSILON * rsabs))
                                ok = false;
                        worst = fmax(worst, fabs(v[i] - rs));
                }
                if (ep != KEPI_BGRAD && memcmp(v, v0, nv * sizeof(float)) != 0)
                        ok = false; /* the bias is input only */
        }
        CHECK(ok, "%s: gemm_ep %s%s ta=%d tb=%d m=%d n=%d k=%d pad=%d (worst error %.2e)", kb->ops->name,
              names[ep], tf32 ? " tf32" : "", ta, tb, m, n, k, pad, worst);
        dev_release(kb, da);
        dev_release(kb, db);
        dev_release(kb, dc);
        dev_release(kb, dv);
        free(a);
        free(b);
        free(c0);
        free(c);
        free(v0);
        free(v);
}

static void test_gemm_ep(KBackend *kb) {
        float buf[64] = { 0 };
        float *d = dev_from(kb, buf, sizeof buf);

        for (int ep = KEPI_NONE; ep <= KEPI_BGRAD; ep++)
                for (int ta = 0; ta < 2; ta++)
                        for (int tb = 0; tb < 2; tb++) {
                                check_gemm_ep(kb, ta, tb, 5, 7, 3, 0, (KEpilogue) ep, false);
                                check_gemm_ep(kb, ta, tb, 33, 17, 65, 3, (KEpilogue) ep, false);
                        }
        /* The model's shapes: forward (X W^T + b, ReLU), weight and bias gradient. */
        check_gemm_ep(kb, false, true, 64, 256, 784, 0, KEPI_BIAS_RELU, false);
        check_gemm_ep(kb, false, true, 64, 10, 256, 0, KEPI_BIAS, false);
        check_gemm_ep(kb, true, false, 256, 784, 64, 0, KEPI_BGRAD, false);
        check_gemm_ep(kb, true, false, 10, 256, 64, 0, KEPI_BGRAD, false);
        if (kb->ops->set_tf32(kb, true) == 0) {
                check_gemm_ep(kb, false, true, 128, 256, 512, 0, KEPI_BIAS_RELU, true);
                check_gemm_ep(kb, true, false, 256, 512, 128, 0, KEPI_BGRAD, true);
                CHECK(kb->ops->set_tf32(kb, false) == 0, "%s: tf32 off again", kb->ops->name);
        } else
                CHECK(kb->ops->set_tf32(kb, true) == -ENOTSUP && kb->ops->set_tf32(kb, false) == 0,
                      "%s: tf32 refused with -ENOTSUP, off accepted", kb->ops->name);

        if (!d)
                return;
        CHECK(kb->ops->gemm_ep(kb, false, false, 2, 2, 2, d, 2, d + 16, 2, d + 32, 2, KEPI_BIAS, NULL) == -EINVAL,
              "%s: gemm_ep bias without a vector rejected", kb->ops->name);
        CHECK(kb->ops->gemm_ep(kb, false, false, 2, 2, 0, d, 2, d + 16, 2, d + 32, 2, KEPI_BGRAD, d + 48) == -EINVAL,
              "%s: gemm_ep k == 0 with an epilogue rejected", kb->ops->name);
        CHECK(kb->ops->gemm_ep(kb, false, false, 2, 2, 2, d, 2, d + 16, 2, d + 32, 2, (KEpilogue) 9, d + 48) == -EINVAL,
              "%s: gemm_ep unknown epilogue rejected", kb->ops->name);
        CHECK(kb->ops->gemm_ep(kb, false, false, 2, 3, 4, d, 3, d + 16, 3, d + 32, 3, KEPI_NONE, NULL) == -EINVAL,
              "%s: gemm_ep lda < k rejected", kb->ops->name);
        dev_release(kb, d);
}

/* download_async into host_alloc'd memory, waited for by slot, while later ops run. */
static void test_async(KBackend *kb) {
        enum { N = 4096 };
        float *h0 = NULL, *h1 = NULL, *x = xmalloc(N * sizeof(float)), *y = xmalloc(N * sizeof(float));
        float *dx, *dy;
        bool ok;

        fill_uniform(x, N, -1, 1);
        fill_uniform(y, N, -1, 1);
        dx = dev_from(kb, x, N * sizeof(float));
        dy = dev_from(kb, y, N * sizeof(float));
        ok = kb->ops->host_alloc(kb, N * sizeof(float), (void **) &h0) == 0 &&
             kb->ops->host_alloc(kb, N * sizeof(float), (void **) &h1) == 0;
        CHECK(ok, "%s: host_alloc", kb->ops->name);
        if (ok && dx && dy) {
                for (int i = 0; i < N; i++)
                        h0[i] = h1[i] = NAN;
                ok = kb->ops->download_async(kb, h0, dx, N * sizeof(float), 3) == 0 &&
                     kb->ops->act_backward(kb, dy, dx, N, KACT_RELU) == 0 &&
                     kb->ops->download_async(kb, h1, dy, N * sizeof(float), 4) == 0 &&
                     kb->ops->wait_slot(kb, 3) == 0 && memcmp(h0, x, N * sizeof(float)) == 0 &&
                     kb->ops->wait_slot(kb, 4) == 0;
                for (int i = 0; ok && i < N; i++)
                        ok = h1[i] == (x[i] > 0 ? y[i] : 0.0f);
                CHECK(ok, "%s: download_async x2 with an op between, wait_slot each: right bytes, in order",
                      kb->ops->name);
                CHECK(kb->ops->download_async(kb, h0, dx, 4, KB_SLOTS) == -EINVAL &&
                      kb->ops->wait_slot(kb, KB_SLOTS) == -EINVAL, "%s: slot >= KB_SLOTS rejected",
                      kb->ops->name);
                CHECK(kb->ops->sync(kb) == 0, "%s: sync after async downloads", kb->ops->name);
        }
        if (h0)
                kb->ops->host_free(kb, h0);
        if (h1)
                kb->ops->host_free(kb, h1);
        dev_release(kb, dx);
        dev_release(kb, dy);
        free(x);
        free(y);
}

/* A captured sequence (upload, gemm_ep, bias gradient, async download) replays
 * with fresh inputs and gives what the ops give run directly. */
static void test_capture(KBackend *kb) {
        enum { M = 48, N = 40, K = 72 };
        float *hx = NULL, *hc = NULL, *hv = NULL, *a = xmalloc(M * K * sizeof(float));
        float *w = xmalloc(N * K * sizeof(float)), *ref = xmalloc(M * N * sizeof(float));
        float *vref = xmalloc(N * sizeof(float));
        float *da = NULL, *dw, *dc = NULL, *dv = NULL;
        KGraph *g = NULL;
        int r;
        bool ok = true;

        r = kb->ops->capture_begin(kb);
        if (r == -ENOTSUP) {
                CHECK(kb->ops->graph_run(kb, NULL) < 0, "%s: no capture (-ENOTSUP): ops run directly",
                      kb->ops->name);
                goto out;
        }
        CHECK(r == 0, "%s: capture_begin", kb->ops->name);
        if (r == 0) { /* an empty capture, to check the error paths around one */
                CHECK(kb->ops->sync(kb) == -EBUSY && kb->ops->capture_begin(kb) == -EBUSY,
                      "%s: sync and a second capture_begin refused while capturing", kb->ops->name);
                r = kb->ops->capture_end(kb, &g);
                CHECK(r == 0 && g, "%s: an empty capture ends", kb->ops->name);
                kb->ops->graph_free(kb, g);
                g = NULL;
        }
        fill_uniform(w, N * K, -1, 1);
        dw = dev_from(kb, w, N * K * sizeof(float));
        ok = dw && kb->ops->host_alloc(kb, M * K * sizeof(float), (void **) &hx) == 0 &&
             kb->ops->host_alloc(kb, M * N * sizeof(float), (void **) &hc) == 0 &&
             kb->ops->host_alloc(kb, N * sizeof(float), (void **) &hv) == 0 &&
             kb->ops->alloc(kb, M * K * sizeof(float), (void **) &da) == 0 &&
             kb->ops->alloc(kb, M * N * sizeof(float), (void **) &dc) == 0 &&
             kb->ops->alloc(kb, N * sizeof(float), (void **) &dv) == 0;
        /* C = relu(A W^T + 0); v = column sums of C. */
        ok = ok && kb->ops->capture_begin(kb) == 0;
        if (ok) {
                r = kb->ops->upload(kb, da, hx, M * K * sizeof(float));
                r = r < 0 ? r : kb->ops->gemm_ep(kb, false, true, M, N, K, da, K, dw, K, dc, N, KEPI_NONE, NULL);
                r = r < 0 ? r : kb->ops->act_backward(kb, dc, dc, (size_t) M * N, KACT_RELU);
                r = r < 0 ? r : kb->ops->colsum(kb, dc, M, N, dv);
                r = r < 0 ? r : kb->ops->download_async(kb, hc, dc, M * N * sizeof(float), 0);
                r = r < 0 ? r : kb->ops->download_async(kb, hv, dv, N * sizeof(float), 1);
                int r2 = kb->ops->capture_end(kb, &g);
                ok = r == 0 && r2 == 0 && g;
                CHECK(ok, "%s: capture of upload, gemm_ep, act_backward, colsum, two async downloads (%d %d)",
                      kb->ops->name, r, r2);
        }
        for (int round = 0; ok && round < 3; round++) {
                fill_uniform(a, M * K, -1, 1);
                memcpy(hx, a, M * K * sizeof(float));
                for (int i = 0; i < M * N; i++)
                        hc[i] = NAN;
                ok = kb->ops->graph_run(kb, g) == 0 && kb->ops->wait_slot(kb, 0) == 0 &&
                     kb->ops->wait_slot(kb, 1) == 0 && kb->ops->sync(kb) == 0;
                /* The same ops directly, on the same device buffers. */
                ok = ok && kb->ops->upload(kb, da, a, M * K * sizeof(float)) == 0 &&
                     kb->ops->gemm_ep(kb, false, true, M, N, K, da, K, dw, K, dc, N, KEPI_NONE, NULL) == 0 &&
                     kb->ops->act_backward(kb, dc, dc, (size_t) M * N, KACT_RELU) == 0 &&
                     kb->ops->colsum(kb, dc, M, N, dv) == 0 && dev_to(kb, ref, dc, M * N * sizeof(float)) &&
                     dev_to(kb, vref, dv, N * sizeof(float));
                ok = ok && memcmp(hc, ref, M * N * sizeof(float)) == 0 && memcmp(hv, vref, N * sizeof(float)) == 0;
                CHECK(ok, "%s: graph replay %d with a new batch equals the direct ops bit for bit",
                      kb->ops->name, round);
        }
        kb->ops->graph_free(kb, g);
        if (hx)
                kb->ops->host_free(kb, hx);
        if (hc)
                kb->ops->host_free(kb, hc);
        if (hv)
                kb->ops->host_free(kb, hv);
        dev_release(kb, da);
        dev_release(kb, dw);
        dev_release(kb, dc);
        dev_release(kb, dv);
out:
        free(a);
        free(w);
        free(ref);
        free(vref);
}

static void test_backend(KBackend *kb) {
        unsigned char in[333], out[333];
        void *d;

        for (size_t i = 0; i < sizeof in; i++)
                in[i] = (unsigned char) (i * 7 + 1);
        memset(out, 0, sizeof out);
        d = dev_from(kb, in, sizeof in);
        CHECK(d && dev_to(kb, out, d, sizeof out) && kb->ops->sync(kb) == 0 &&
              memcmp(in, out, sizeof in) == 0, "%s: upload/download round trip", kb->ops->name);
        dev_release(kb, d);

        test_gemm(kb);
        test_bias_act(kb);
        test_act_backward(kb);
        test_colsum(kb);
        test_softmax_xent(kb);
        test_argmax(kb);
        test_sgd_step(kb);
        test_gemm_ep(kb);
        test_async(kb);
        test_capture(kb);
}

int main(void) {
        KBackend *kb = NULL;
        char err[256];

        test_select();

        if (CHECK(kbackend_new("cpu", 2, &kb, err, sizeof err) == 0, "cpu backend: %s", err))
                test_backend(kb);
        kb = kbackend_free(kb);

        if (kbackend_cuda_built() && kbackend_new("cuda", 0, &kb, err, sizeof err) == 0)
                test_backend(kb);
        else
                printf("# skipped: cuda backend (%s)\n",
                       kbackend_cuda_built() ? err : "not in this build");
        kb = kbackend_free(kb);

        return tap_done();
}
