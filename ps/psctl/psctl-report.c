/* SPDX-License-Identifier: Apache-2.0 */
/* psctl report: a job's curves. The numbers come from pscoord (the status's
 * epochs and federated rounds, MSG_HISTORY's samples of the workers'
 * heartbeats); they are written as CSV for people and their own tools, and as
 * whitespace tables for gnuplot, which draws each chart as PNG and SVG
 * (Debian's gnuplot-nox: psctl draws nothing itself). index.html shows the
 * charts with the job's facts and its epochs. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "macro.h"
#include "psctl.h"
#include "wire-job.h"

extern char **environ;

/* --- files ----------------------------------------------------------------------- */

/* dir/name opened for writing, its path in path; NULL (errno set) after
 * saying why. */
static FILE *out_open(const char *dir, const char *name, char *path, size_t n) {
        snprintf(path, n, "%s/%s", dir, name);
        FILE *f = fopen(path, "w");
        if (!f) {
                int e = errno;
                fprintf(stderr, "psctl report: cannot write %s: %s\n", path, strerror(e));
                errno = e;
        }
        return f;
}

/* Closes f, written to path: 0, or a negative errno after saying why. */
static int out_close(FILE *f, const char *path) {
        int r = ferror(f) ? -EIO : 0;
        if (fclose(f) != 0 && r == 0)
                r = -errno;
        if (r < 0)
                fprintf(stderr, "psctl report: cannot write %s: %s\n", path, strerror(-r));
        return r;
}

/* --- tables --------------------------------------------------------------------- */

/* A table of numbers (NaN: none), written as CSV (header, empty fields for
 * none) or for gnuplot (whitespace, "?" for none, the header as a comment,
 * two blank lines between blocks: gnuplot's `index`). */
typedef struct Table {
        const char *const *cols;
        const bool *ints;     /* columns printed as integers */
        size_t ncols, nrows;
        const double *v;      /* nrows * ncols */
        const size_t *block;  /* rows' block numbers (ascending), or NULL: one block */
} Table;

static int table_write(const Table *t, const char *dir, const char *name, bool csv) {
        char path[4096];
        FILE *f = out_open(dir, name, path, sizeof path);
        if (!f)
                return -errno;
        fputs(csv ? "" : "# ", f);
        for (size_t c = 0; c < t->ncols; c++)
                fprintf(f, "%s%s", c ? (csv ? "," : " ") : "", t->cols[c]);
        fputc('\n', f);
        for (size_t i = 0; i < t->nrows; i++) {
                if (!csv && t->block && i > 0 && t->block[i] != t->block[i - 1])
                        fputs("\n\n", f);
                for (size_t c = 0; c < t->ncols; c++) {
                        double x = t->v[i * t->ncols + c];
                        if (c)
                                fputc(csv ? ',' : ' ', f);
                        if (isnan(x))
                                fputs(csv ? "" : "?", f);
                        else
                                fprintf(f, t->ints[c] ? "%.0f" : "%.6g", x);
                }
                fputc('\n', f);
        }
        return out_close(f, path);
}

static int table_both(const Table *t, const char *dir, const char *base) {
        char name[64];
        snprintf(name, sizeof name, "%s.csv", base);
        int r = table_write(t, dir, name, true);
        snprintf(name, sizeof name, "%s.dat", base);
        return r < 0 ? r : table_write(t, dir, name, false);
}

/* --- the numbers ------------------------------------------------------------------ */

typedef struct Report {
        const Psnet__StatusRep *st;
        const Psnet__History *h;
        uint32_t *workers;    /* the workers sampled, ascending */
        size_t nworkers;
        bool has_loss, has_speed, has_lr, has_test_loss, has_accuracy, has_auc, fed, fed_loss, fed_accuracy;
        double seconds;       /* of the last sample */
        char title[192];
} Report;

static size_t worker_index(const Report *rp, uint32_t id) {
        uint32_t *w = bsearch(&id, rp->workers, rp->nworkers, sizeof id, cmp_u32);
        return w ? (size_t) (w - rp->workers) : 0;
}

static double opt(bool has, double v) {
        return has && isfinite(v) ? v : NAN;
}

/* samples.csv (in time order) and samples.dat (a block per worker). */
static int write_samples(Report *rp, const char *dir) {
        static const char *const cols[] = { "seconds", "worker", "clock", "loss", "samples_per_s", "staleness", "lr" };
        static const bool ints[] = { false, true, true, false, false, true, false };
        const size_t nc = ELEMENTSOF(cols), n = rp->h->n_samples;
        _cleanup_free_ double *v = calloc(MAX(n, (size_t) 1) * nc, sizeof *v);
        _cleanup_free_ double *byw = calloc(MAX(n, (size_t) 1) * nc, sizeof *byw);
        _cleanup_free_ size_t *block = calloc(MAX(n, (size_t) 1), sizeof *block);
        _cleanup_free_ size_t *fill = calloc(rp->nworkers + 1, sizeof *fill);
        if (!v || !byw || !block || !fill)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                const Psnet__ClockSample *s = rp->h->samples[i];
                double row[] = { opt(s->has_seconds, s->seconds), s->worker, opt(s->has_clock, (double) s->clock),
                                 opt(s->has_loss, s->loss), opt(s->has_samples_per_s, s->samples_per_s),
                                 opt(s->has_spread, (double) s->spread), opt(s->has_lr, s->lr) };
                memcpy(v + i * nc, row, sizeof row);
                fill[worker_index(rp, s->worker) + 1]++;
                rp->has_loss |= !isnan(row[3]);
                rp->has_speed |= !isnan(row[4]);
                rp->has_lr |= !isnan(row[6]);
                if (!isnan(row[0]))
                        rp->seconds = MAX(rp->seconds, row[0]);
        }
        for (size_t k = 1; k <= rp->nworkers; k++) /* each worker's first row */
                fill[k] += fill[k - 1];
        for (size_t i = 0; i < n; i++) {
                size_t w = worker_index(rp, rp->h->samples[i]->worker), at = fill[w]++;
                memcpy(byw + at * nc, v + i * nc, nc * sizeof *v);
                block[at] = w;
        }
        Table t = { .cols = cols, .ints = ints, .ncols = nc, .nrows = n, .v = v };
        int r = table_write(&t, dir, "samples.csv", true);
        t.v = byw;
        t.block = block;
        return r < 0 ? r : table_write(&t, dir, "samples.dat", false);
}

static int write_epochs(Report *rp, const char *dir) {
        static const char *const cols[] = { "epoch", "clock", "seconds", "accuracy", "test_loss", "train_loss", "auc" };
        static const bool ints[] = { true, true, false, false, false, false, false };
        const size_t nc = ELEMENTSOF(cols), n = rp->st->n_epochs;
        _cleanup_free_ double *v = calloc(MAX(n, (size_t) 1) * nc, sizeof *v);
        if (!v)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                const Psnet__EpochRecord *e = rp->st->epochs[i];
                double row[] = { e->epoch, opt(e->has_clock, (double) e->clock), opt(e->has_seconds, e->seconds),
                                 opt(e->has_accuracy, e->accuracy), opt(e->has_test_loss, e->test_loss),
                                 opt(e->has_train_loss, e->train_loss), opt(e->has_auc, e->auc) };
                memcpy(v + i * nc, row, sizeof row);
                rp->has_accuracy |= !isnan(row[3]);
                rp->has_auc |= !isnan(row[6]);
                rp->has_test_loss |= !isnan(row[4]) && !isnan(row[1]);
        }
        const Table t = { .cols = cols, .ints = ints, .ncols = nc, .nrows = n, .v = v };
        return table_both(&t, dir, "epochs");
}

/* A federated job's aggregated rounds (the failed ones left out). */
static int write_rounds(Report *rp, const char *dir) {
        static const char *const cols[] = { "round", "seconds", "loss", "accuracy", "answered", "sampled" };
        static const bool ints[] = { true, false, false, false, true, true };
        const Psnet__FedStatus *f = rp->st->fed;
        const size_t nc = ELEMENTSOF(cols), n = f ? f->n_history : 0;
        _cleanup_free_ double *v = calloc(MAX(n, (size_t) 1) * nc, sizeof *v);
        if (!v)
                return -ENOMEM;
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
                const Psnet__RoundRecord *o = f->history[i];
                if (!o->has_round || o->round == 0)
                        continue;
                double row[] = { o->round, opt(o->has_seconds, o->seconds), opt(o->has_loss, o->loss),
                                 opt(o->has_accuracy, o->accuracy), opt(o->has_answered, o->answered),
                                 opt(o->has_sampled, o->sampled) };
                memcpy(v + m++ * nc, row, sizeof row);
                rp->fed_loss |= !isnan(row[2]);
                rp->fed_accuracy |= !isnan(row[3]);
        }
        const Table t = { .cols = cols, .ints = ints, .ncols = nc, .nrows = m, .v = v };
        return table_both(&t, dir, "rounds");
}

/* --- the charts ------------------------------------------------------------------- */

/* s as a gnuplot single-quoted string (a quote doubled). */
static void gp_str(FILE *f, const char *s) {
        fputc('\'', f);
        for (; *s; s++) {
                if (*s == '\'')
                        fputc('\'', f);
                if ((unsigned char) *s >= ' ')
                        fputc(*s, f);
        }
        fputc('\'', f);
}

/* Ends a chart's script: the PNG drawn, the same plot again as SVG. */
static void gp_chart(FILE *f, const char *name, const char *title, const char *xlabel, const char *ylabel,
                     const Report *rp) {
        char full[320];
        snprintf(full, sizeof full, "%s: %s", title, rp->title);
        fprintf(f, "\nset terminal pngcairo size 960,480 noenhanced font 'sans,10'\nset output '%s.png'\nset title ",
                name);
        gp_str(f, full);
        fprintf(f, "\nset xlabel '%s'\nset ylabel '%s'\n", xlabel, ylabel);
}

static void gp_svg(FILE *f, const char *name) {
        fprintf(f, "set terminal svg size 960,480 dynamic noenhanced font 'sans,10'\nset output '%s.svg'\nreplot\n"
                   "unset output\nunset arrow\n", name);
}

/* One plot clause per worker of samples.dat: column col against xcol. */
static void gp_workers(FILE *f, const Report *rp, int xcol, int col) {
        for (size_t k = 0; k < rp->nworkers; k++)
                fprintf(f, "%s'samples.dat' index %zu using %d:%d with lines lw 1.5 title 'worker %u'", k ? ", " : "",
                        k, xcol, col, rp->workers[k]);
}

typedef struct Chart {
        const char *name, *heading, *about;
} Chart;

/* A test-set figure by epoch: column col of epochs.dat. */
static Chart epoch_chart(FILE *f, const Report *rp, const char *what, const char *ylabel, int col, Chart c) {
        char title[64];
        snprintf(title, sizeof title, "test %s by epoch", what);
        gp_chart(f, c.name, title, "epoch", ylabel, rp);
        fprintf(f, "%splot 'epochs.dat' using 1:%d with linespoints pt 7 lw 2 title 'test set'\n",
                rp->st->n_epochs <= 20 ? "set xtics 1\n" : "", col);
        gp_svg(f, c.name);
        fputs("set xtics autofreq\n", f);
        return c;
}

/* Writes report.gp with the charts there are numbers for (in charts). */
static int write_script(const Report *rp, const char *dir, Chart *charts, size_t *nch) {
        char path[4096];
        FILE *f = out_open(dir, "report.gp", path, sizeof path);
        if (!f)
                return -errno;
        fputs("# psctl report: gnuplot report.gp in this directory draws the charts again.\n"
              "set datafile missing '?'\nset grid\nset key top right\n",
              f);
        size_t n = 0;
        if (!rp->fed && (rp->has_loss || rp->has_test_loss)) {
                gp_chart(f, "loss", "loss by clock", "clock", "cross-entropy", rp);
                fputs("plot ", f);
                if (rp->has_loss)
                        gp_workers(f, rp, 3, 4);
                if (rp->has_test_loss)
                        fprintf(f, "%s'epochs.dat' using 2:5 with linespoints pt 7 ps 1.2 lw 2 title 'test set'",
                                rp->has_loss ? ", " : "");
                fputc('\n', f);
                gp_svg(f, "loss");
                charts[n++] = (Chart) { "loss", "Loss by clock",
                                        "Each worker's mean training loss between its heartbeats, and the test "
                                        "set's after each epoch." };
        }
        if (!rp->fed && rp->has_accuracy)
                charts[n++] = epoch_chart(f, rp, "accuracy", "accuracy", 4, (Chart) { "accuracy",
                                          "Test accuracy by epoch",
                                          "The whole test set after each epoch (the last point: the final "
                                          "weights)." });
        if (!rp->fed && rp->has_auc)
                charts[n++] = epoch_chart(f, rp, "AUC", "area under the ROC curve", 7, (Chart) { "auc",
                                          "Test AUC by epoch",
                                          "A binary model's ranking of the test set after each epoch (lr:D, dlrm): 0.5 "
                                          "is chance, 1 every click above every non-click." });
        if (!rp->fed && rp->has_speed) {
                gp_chart(f, "throughput", "samples/s by worker", "seconds since the job started", "samples/s", rp);
                fputs("set yrange [0:*]\nplot ", f);
                gp_workers(f, rp, 1, 5);
                fputc('\n', f);
                gp_svg(f, "throughput");
                fputs("set yrange [*:*]\n", f);
                charts[n++] = (Chart) { "throughput", "Samples per second by worker",
                                        "As each worker measured it between its heartbeats." };
        }
        if (!rp->fed && rp->h->n_samples > 0) {
                gp_chart(f, "staleness", "staleness", "seconds since the job started", "clocks", rp);
                int64_t most = 0;
                for (size_t i = 0; i < rp->h->n_samples; i++)
                        most = MAX(most, rp->h->samples[i]->spread);
                fprintf(f, "set yrange [0:*]\nset offsets 0, 0, 0.5, 0\nset format y '%%.0f'\n%s",
                        most <= 10 ? "set ytics 1\n" : "");
                ConsistencyMode mode;
                uint32_t bound = 0;
                /* ssp:S: a pull of clock c waits for the slowest to complete
                 * c - S, so completed clocks differ by S + 1 at most. */
                if (rp->st->job && mode_from_proto(rp->st->job->mode, &mode, &bound) == 0 && mode == MODE_SSP)
                        fprintf(f, "set arrow from graph 0, first %u to graph 1, first %u nohead dt 2 lw 1.5\n",
                                bound + 1, bound + 1);
                fputs("plot 'samples.dat' using 1:6 with points pt 7 ps 0.6 title 'fastest minus slowest member'\n",
                      f);
                gp_svg(f, "staleness");
                fputs("set yrange [*:*]\nset offsets 0, 0, 0, 0\nset format y '%g'\nset ytics autofreq\n", f);
                charts[n++] = (Chart) { "staleness", "Staleness",
                                        "How many clocks the fastest member was ahead of the slowest when a "
                                        "heartbeat came, as the shards saw it (the dashed line: the most ssp:S "
                                        "allows, S + 1)." };
        }
        if (!rp->fed && rp->has_lr) {
                gp_chart(f, "lr", "learning rate by clock", "clock", "lr", rp);
                fputs("set yrange [0:*]\nplot 'samples.dat' using 3:7 with points pt 7 ps 0.6 title 'the shards'' "
                      "last update'\n",
                      f);
                gp_svg(f, "lr");
                fputs("set yrange [*:*]\n", f);
                charts[n++] = (Chart) { "lr", "Learning rate by clock",
                                        "The rate the shards applied their last update at when a heartbeat came: "
                                        "--lr times --lr-scaling's factor and --lr-schedule's." };
        }
        if (rp->fed && rp->fed_loss) {
                gp_chart(f, "loss", "training loss by round", "round", "cross-entropy", rp);
                fputs("plot 'rounds.dat' using 1:3 with linespoints pt 7 lw 2 title 'clients'' mean'\n", f);
                gp_svg(f, "loss");
                charts[n++] = (Chart) { "loss", "Training loss by round",
                                        "The answering clients' mean training loss in each aggregated round." };
        }
        if (rp->fed && rp->fed_accuracy) {
                gp_chart(f, "accuracy", "test accuracy by round", "round", "accuracy", rp);
                fputs("plot 'rounds.dat' using 1:4 with linespoints pt 7 lw 2 title 'test set'\n", f);
                gp_svg(f, "accuracy");
                charts[n++] = (Chart) { "accuracy", "Test accuracy by round",
                                        "The model after the round, on an edge worker's test set (--eval-every)." };
        }
        *nch = n;
        return out_close(f, path);
}

/* Runs gnuplot on report.gp in dir, its messages to gnuplot.log. */
static int run_gnuplot(const char *dir) {
        char log[4096];
        snprintf(log, sizeof log, "%s/gnuplot.log", dir);
        posix_spawn_file_actions_t fa;
        int e = posix_spawn_file_actions_init(&fa);
        if (e)
                return -e;
        e = posix_spawn_file_actions_addchdir_np(&fa, dir);
        if (!e)
                e = posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
        if (!e)
                e = posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "gnuplot.log", O_WRONLY | O_CREAT | O_TRUNC,
                                                     0644);
        if (!e)
                e = posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
        pid_t pid = 0;
        char *argv[] = { (char *) "gnuplot", (char *) "report.gp", NULL };
        if (!e)
                e = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ);
        (void) posix_spawn_file_actions_destroy(&fa);
        if (e == ENOENT) {
                fprintf(stderr, "psctl report: gnuplot is not installed (Debian: apt-get install gnuplot-nox); "
                                "the numbers are in %s/*.csv\n", dir);
                return -ENOENT;
        }
        if (e) {
                fprintf(stderr, "psctl report: cannot run gnuplot: %s\n", strerror(e));
                return -e;
        }
        int status;
        while (waitpid(pid, &status, 0) < 0)
                if (errno != EINTR)
                        return -errno;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                fprintf(stderr, "psctl report: gnuplot failed (%s %d); its messages are in %s\n",
                        WIFEXITED(status) ? "exit status" : "signal",
                        WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), log);
                return -EIO;
        }
        return 0;
}

/* --- index.html ------------------------------------------------------------------- */

static void html(FILE *f, const char *s) {
        for (; s && *s; s++)
                switch (*s) {
                case '<': fputs("&lt;", f); break;
                case '>': fputs("&gt;", f); break;
                case '&': fputs("&amp;", f); break;
                case '"': fputs("&quot;", f); break;
                default: fputc(*s, f);
                }
}

static void fact(FILE *f, const char *name, const char *value) {
        fprintf(f, "<tr><th>%s</th><td>", name);
        html(f, value);
        fputs("</td></tr>\n", f);
}

static void num(char *b, size_t n, bool has, double v, const char *fmt) {
        if (has && isfinite(v))
                snprintf(b, n, fmt, v);
        else
                snprintf(b, n, "-");
}

static int write_index(const Report *rp, const char *dir, const Chart *charts, size_t nch) {
        char path[4096], b[192], mode[32], model[128];
        FILE *f = out_open(dir, "index.html", path, sizeof path);
        if (!f)
                return -errno;
        const Psnet__StatusRep *st = rp->st;
        const Psnet__JobSpec *j = st->job;
        fputs("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>", f);
        html(f, rp->title);
        fputs("</title>\n<style>body{font-family:sans-serif;max-width:1000px;margin:1em auto;padding:0 1em}"
              "table{border-collapse:collapse;margin:.5em 0}th,td{padding:.15em .8em;text-align:left}"
              "td.n{text-align:right}img{max-width:100%;border:1px solid #ddd}</style>\n</head><body>\n<h1>",
              f);
        html(f, rp->title);
        fputs("</h1>\n<table>\n", f);
        fact(f, "state", psctl_state_of(st->job_state));
        fact(f, "model", psctl_model_of(j, model, sizeof model));
        fact(f, "mode", psctl_mode_of(j, mode, sizeof mode));
        if (j) {
                snprintf(b, sizeof b, "%u of %u per worker", j->epochs, j->batch);
                fact(f, "epochs, batch", b);
        }
        num(b, sizeof b, st->has_accuracy, st->accuracy, "%.4f");
        fact(f, "final accuracy", b);
        snprintf(b, sizeof b, "%zu", rp->nworkers);
        fact(f, "workers sampled", b);
        snprintf(b, sizeof b, "%zu heartbeats over %.1f s (every %u%s of a worker's kept)", rp->h->n_samples,
                 rp->seconds, rp->h->stride, rp->h->stride == 1 ? "st" : "th");
        if (!rp->fed)
                fact(f, "samples", b);
        if (j && j->init)
                fact(f, "started from", j->init);
        if (st->restored_from)
                fact(f, "restored from", st->restored_from);
        fputs("</table>\n", f);
        for (size_t k = 0; k < nch; k++)
                fprintf(f, "<h2>%s</h2>\n<p>%s</p>\n<p><img src=\"%s.svg\" alt=\"%s\"></p>\n"
                           "<p><a href=\"%s.png\">PNG</a> · <a href=\"%s.svg\">SVG</a></p>\n",
                        charts[k].heading, charts[k].about, charts[k].name, charts[k].heading, charts[k].name,
                        charts[k].name);
        if (nch == 0)
                fputs("<p>No numbers to draw yet: the job has not reported a step.</p>\n", f);
        if (st->n_epochs > 0) {
                fprintf(f, "<h2>Epochs</h2>\n<table>\n<tr><th>epoch</th><th>clock</th><th>seconds</th><th>accuracy</th>"
                           "<th>test loss</th><th>training loss</th>%s</tr>\n", rp->has_auc ? "<th>AUC</th>" : "");
                for (size_t i = 0; i < st->n_epochs; i++) {
                        const Psnet__EpochRecord *e = st->epochs[i];
                        char c1[32], c2[32], c3[32], c4[32], c5[32], c6[32];
                        num(c1, sizeof c1, e->has_clock, (double) e->clock, "%.0f");
                        num(c2, sizeof c2, e->has_seconds, e->seconds, "%.1f");
                        num(c3, sizeof c3, e->has_accuracy, e->accuracy, "%.4f");
                        num(c4, sizeof c4, e->has_test_loss, e->test_loss, "%.4f");
                        num(c5, sizeof c5, e->has_train_loss, e->train_loss, "%.4f");
                        num(c6, sizeof c6, e->has_auc, e->auc, "%.4f");
                        fprintf(f, "<tr><td class=n>%u</td><td class=n>%s</td><td class=n>%s</td><td class=n>%s"
                                   "</td><td class=n>%s</td><td class=n>%s</td>%s%s%s</tr>\n",
                                e->epoch, c1, c2, c3, c4, c5, rp->has_auc ? "<td class=n>" : "", rp->has_auc ? c6 : "",
                                rp->has_auc ? "</td>" : "");
                }
                fputs("</table>\n", f);
        }
        fprintf(f, "<p>The numbers: %s<a href=\"epochs.csv\">epochs.csv</a>%s. "
                   "<code>gnuplot report.gp</code> here draws the charts again.</p>\n</body></html>\n",
                rp->fed ? "" : "<a href=\"samples.csv\">samples.csv</a>, ",
                rp->fed ? ", <a href=\"rounds.csv\">rounds.csv</a>" : "");
        return out_close(f, path);
}

/* --- the whole ---------------------------------------------------------------------- */

static int make_dir(const char *dir) {
        struct stat sb;
        if (mkdir(dir, 0755) == 0 || (errno == EEXIST && stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)))
                return 0;
        int r = errno == EEXIST ? -ENOTDIR : -errno;
        fprintf(stderr, "psctl report: cannot make the directory %s: %s\n", dir, strerror(-r));
        return r;
}

static int print_done(const char *dir, const Chart *charts, size_t nch, bool json) {
        if (!json) {
                printf("report written to %s/index.html (%zu chart%s)\n", dir, nch, nch == 1 ? "" : "s");
                return 0;
        }
        json_t *names = json_array();
        for (size_t k = 0; names && k < nch; k++)
                if (json_array_append_new(names, json_string(charts[k].name)) < 0) {
                        json_decref(names);
                        names = NULL;
                }
        json_t *o = names ? json_pack("{s:s,s:o}", "index", "index.html", "charts", names) : NULL;
        if (o && json_object_set_new(o, "dir", json_string(dir)) < 0) {
                json_decref(o);
                o = NULL;
        }
        char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        if (!s)
                return -ENOMEM;
        puts(s);
        free(s);
        return 0;
}

int psctl_report(const Psnet__StatusRep *st, const Psnet__History *h, const char *dir, bool json) {
        Report rp = { .st = st, .h = h, .fed = st->fed != NULL };
        char model[128];
        snprintf(rp.title, sizeof rp.title, "psnet job %u (%s)", st->job ? st->job->id : 0,
                 psctl_model_of(st->job, model, sizeof model));
        int r = make_dir(dir);
        if (r < 0)
                return r;
        _cleanup_free_ uint32_t *ids = calloc(MAX(h->n_samples, (size_t) 1), sizeof *ids);
        if (!ids)
                return -ENOMEM;
        for (size_t i = 0; i < h->n_samples; i++)
                ids[i] = h->samples[i]->worker;
        qsort(ids, h->n_samples, sizeof *ids, cmp_u32);
        for (size_t i = 0; i < h->n_samples; i++)
                if (rp.nworkers == 0 || ids[i] != ids[rp.nworkers - 1])
                        ids[rp.nworkers++] = ids[i];
        rp.workers = ids;
        Chart charts[8];
        size_t nch = 0;
        r = write_samples(&rp, dir);
        if (r == 0)
                r = write_epochs(&rp, dir);
        if (r == 0 && rp.fed)
                r = write_rounds(&rp, dir);
        if (r == 0)
                r = write_script(&rp, dir, charts, &nch);
        if (r == 0 && nch > 0)
                r = run_gnuplot(dir);
        if (r == 0)
                r = write_index(&rp, dir, charts, nch);
        if (r == -ENOMEM)
                fprintf(stderr, "psctl report: out of memory\n");
        return r < 0 ? r : print_done(dir, charts, nch, json);
}
