/* bench_train.c - `shardtrain bench train`: training throughput against the
 * rank count. One process, not under mpirun: for each mode (weak: micro-batch
 * per rank fixed, the global batch grows with the ranks; strong: the global
 * batch fixed) and each rank count it starts the launcher (mpirun or srun)
 * on this executable's `train --step-timing`, waits for it, reads the run's
 * metrics.jsonl, and reports the median step after the first: tokens/s,
 * TFLOP/s per rank (6N + 6LCT FLOPs per token), MFU against a given peak,
 * efficiency against the smallest rank count, and the step split into data,
 * compute, exposed communication and optimizer. Writes OUT/scaling.json
 * (bench/plot_scaling.py draws it). */
#include "launcher/bench.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launcher/cli.h"
#include "rank/train/run_config.h"
#include "util/error.h"
#include "util/fsutil.h"

extern char **environ;

enum { MAX_RANK_COUNTS = 64, MAX_LAUNCHER_WORDS = 64 };

typedef struct {
  int ranks[MAX_RANK_COUNTS], nranks; /* ascending, distinct */
  const char *modes[2];               /* "weak", "strong", in the order given */
  int nmodes;
  double peak_tflops;                 /* per rank, for MFU; 0: none */
  const char *out;
  char launcher[1024];                /* the launcher's words, before the rank count */
  const char *launcher_from;          /* where it came from, for the header */
  int json;
  char **train;                       /* train flags after --, --micro-batch removed */
  int ntrain;
  int micro_batch;                    /* train's --micro-batch (or its default) */
} bt_opts;

/* One run's medians (ms) and what follows from them. */
typedef struct {
  int ranks, micro_batch, global_batch, steps_timed;
  double tokens_per_step, flops_per_token;
  double tokens_per_s, tflops_per_rank, mfu, efficiency;
  double t_step, t_data, t_compute, t_comm, t_optimizer;
} bt_row;

static const char *const k_bench_flags[] = {"--ranks", "--modes", "--peak-tflops", "--out",
                                            "--launcher", "--json", "--help", NULL};

void st_bench_train_usage(void) {
  printf(
      "usage: shardtrain bench train --ranks LIST [flags] -- TRAIN_FLAGS   (one process: it\n"
      "       starts the runs itself; do not put it under mpirun/srun)\n"
      "  --ranks LIST       rank counts, e.g. 1,2 (GPUs: one rank per GPU) or 1,2,4 (CPU ranks)\n"
      "  --modes LIST       weak (micro-batch per rank fixed, global batch = micro-batch x\n"
      "                     ranks), strong (global batch = micro-batch x the largest rank\n"
      "                     count, split over the ranks) (weak,strong)\n"
      "  --peak-tflops X    peak TFLOP/s of one rank's device, for MFU (none)\n"
      "  --out DIR          DIR/MODE-N/ run directories (replaced), DIR/MODE-N.log (each run's\n"
      "                     output), DIR/scaling.json (runs/bench-train)\n"
      "  --launcher CMD     the launcher's words, split on spaces; the rank count is added as\n"
      "                     --ntasks N when its program is srun, else -np N (default: $ST_MPIRUN\n"
      "                     if set; else srun --mpi=pmix inside a Slurm allocation; else mpirun.\n"
      "                     As root: \"mpirun --allow-run-as-root --oversubscribe\")\n"
      "  --json             one JSON object per mode and rank count on stdout instead of tables\n"
      "TRAIN_FLAGS: train's own (shardtrain train --help), at least --data and the model;\n"
      "  --micro-batch B is per rank (8), --steps (100); --device, --precision, --zero as for\n"
      "  train. Set per run: --micro-batch, --global-batch, --out DIR/MODE-N, --resume none,\n"
      "  --step-timing, --val-seqs 0. Runs inherit the environment (OMP_NUM_THREADS, NCCL_*).\n"
      "Reported: the median step after the first. tokens/s = global batch x seq len / median\n"
      "step; TFLOP/s per rank = (6N + 6LCT) x tokens/s / ranks; efficiency = tokens/s /\n"
      "(ranks / smallest ranks x its tokens/s). --step-timing synchronises the device at each\n"
      "phase boundary, which makes steps slightly slower (about 1-3%% on 2 H200s against an\n"
      "unsynchronised run), so tokens/s here is a little below an ordinary run's.\n");
}

static int usage_error(void) {
  st_error_code(ST_EXIT_USAGE);
  return -1;
}

/* --ranks: positive counts, sorted ascending, duplicates dropped. */
static int parse_ranks(const char *v, bt_opts *o) {
  char buf[512];
  if (snprintf(buf, sizeof buf, "%s", v) >= (int)sizeof buf) {
    st_error_set("--ranks %.40s...: too long", v);
    return usage_error();
  }
  o->nranks = 0;
  for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
    char *end;
    long n = strtol(t, &end, 10);
    if (*end || end == t || n < 1 || n > 1000000 || o->nranks == MAX_RANK_COUNTS) {
      st_error_set("--ranks %s: give up to %d rank counts >= 1, comma-separated (e.g. 1,2,4)", v,
                   MAX_RANK_COUNTS);
      return usage_error();
    }
    int k = o->nranks;
    while (k > 0 && o->ranks[k - 1] > n) k--;
    if (k > 0 && o->ranks[k - 1] == n) continue;
    memmove(o->ranks + k + 1, o->ranks + k, (size_t)(o->nranks - k) * sizeof o->ranks[0]);
    o->ranks[k] = (int)n;
    o->nranks++;
  }
  if (o->nranks == 0) {
    st_error_set("--ranks %s: give at least one rank count (e.g. 1,2,4)", v);
    return usage_error();
  }
  return 0;
}

static int parse_modes(const char *v, bt_opts *o) {
  char buf[64];
  snprintf(buf, sizeof buf, "%s", v);
  o->nmodes = 0;
  for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
    const char *m = strcmp(t, "weak") == 0 ? "weak" : strcmp(t, "strong") == 0 ? "strong" : NULL;
    if (!m) {
      st_error_set("--modes %s: use weak, strong or weak,strong", v);
      return usage_error();
    }
    if (o->nmodes == 1 && o->modes[0] == m) continue;
    o->modes[o->nmodes++] = m;
  }
  if (o->nmodes == 0) {
    st_error_set("--modes %s: use weak, strong or weak,strong", v);
    return usage_error();
  }
  return 0;
}

/* The default launcher: $ST_MPIRUN, else srun inside a Slurm allocation,
 * else mpirun. */
static int default_launcher(bt_opts *o) {
  const char *env = getenv("ST_MPIRUN");
  if (env && *env) {
    /* A value of blanks only would leave run_one no program to start. */
    if (snprintf(o->launcher, sizeof o->launcher, "%s", env) >= (int)sizeof o->launcher ||
        !strpbrk(env, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")) {
      st_error_set("ST_MPIRUN='%.60s': give the launcher's command, e.g. \"mpirun "
                   "--oversubscribe\", or unset it (the rank count is added)", env);
      return -1;
    }
    o->launcher_from = "ST_MPIRUN";
  } else if (getenv("SLURM_JOB_ID") && *getenv("SLURM_JOB_ID")) {
    snprintf(o->launcher, sizeof o->launcher, "srun --mpi=pmix");
    o->launcher_from = "inside a Slurm allocation";
  } else {
    snprintf(o->launcher, sizeof o->launcher, "mpirun");
    o->launcher_from = "default";
  }
  return 0;
}

/* Bench flags up to "--", then train's flags, checked with train's own
 * parser so a bad one stops here (exit 2) rather than in the first run. */
static int parse(int argc, char **argv, bt_opts *o) {
  memset(o, 0, sizeof *o);
  o->modes[0] = "weak";
  o->modes[1] = "strong";
  o->nmodes = 2;
  o->out = "runs/bench-train";
  int i = 1, have_launcher = 0;
  for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
    const char *f = argv[i];
    if (strcmp(f, "--json") == 0) {
      o->json = 1;
      continue;
    }
    if (!strcmp(f, "--ranks") || !strcmp(f, "--modes") || !strcmp(f, "--peak-tflops") ||
        !strcmp(f, "--out") || !strcmp(f, "--launcher")) {
      if (i + 1 >= argc) return st_cli_missing_value(f, k_bench_flags, "bench train");
      const char *v = argv[++i];
      if (strcmp(f, "--ranks") == 0) {
        if (parse_ranks(v, o)) return -1;
      } else if (strcmp(f, "--modes") == 0) {
        if (parse_modes(v, o)) return -1;
      } else if (strcmp(f, "--peak-tflops") == 0) {
        char *end;
        o->peak_tflops = strtod(v, &end);
        if (*end || end == v || !(o->peak_tflops > 0) || o->peak_tflops > 1e9) {
          st_error_set("--peak-tflops %s: give a positive number (the peak TFLOP/s of one "
                       "rank's device in the run's precision)", v);
          return usage_error();
        }
      } else if (strcmp(f, "--out") == 0) {
        if (!*v || strlen(v) > 900) {
          st_error_set("--out '%s': give a directory path (up to 900 characters)", v);
          return usage_error();
        }
        o->out = v;
      } else {
        if (snprintf(o->launcher, sizeof o->launcher, "%s", v) >= (int)sizeof o->launcher ||
            !strpbrk(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")) {
          st_error_set("--launcher '%.60s': give the launcher's command, e.g. \"mpirun "
                       "--oversubscribe\" (the rank count is added)", v);
          return usage_error();
        }
        o->launcher_from = "--launcher";
        have_launcher = 1;
      }
      continue;
    }
    char hint[64];
    if (st_cli_is_train_flag(f))
      st_error_set("%s is a train flag: give it after --, as in shardtrain bench train --ranks "
                   "1,2 -- --data FILE --model tiny", f);
    else
      st_error_set("unknown flag '%s' for bench train%s; train's flags go after -- (see "
                   "shardtrain bench train --help)", f,
                   st_cli_did_you_mean(f, k_bench_flags, hint, sizeof hint));
    return usage_error();
  }
  if (o->nranks == 0) {
    st_error_set("bench train needs --ranks LIST, e.g. --ranks 1,2,4 (see shardtrain bench train "
                 "--help)");
    return usage_error();
  }
  if (i >= argc || i + 1 >= argc) {
    st_error_set("bench train needs train's flags after --, at least --data FILE and the model "
                 "(e.g. -- --data data/kjv.h5 --model tiny --steps 20)");
    return usage_error();
  }
  if (!have_launcher && default_launcher(o)) return usage_error();

  /* Train's flags: refuse those the bench sets per run, keep the rest
   * (--micro-batch is read here and given to each run as it needs). */
  char **rest = argv + i + 1;
  int nrest = argc - i - 1;
  for (int k = 0; k < nrest; k++) {
    const char *f = rest[k];
    if (!strcmp(f, "--out") || !strcmp(f, "--resume") || !strcmp(f, "--global-batch")) {
      st_error_set("train flag %s is set by bench train for each run (%s); drop it", f,
                   f[2] == 'o' ? "DIR/MODE-N: use bench train's own --out DIR before --"
                   : f[2] == 'r' ? "--resume none: every run starts fresh"
                                 : "weak: micro-batch x ranks; strong: micro-batch x the "
                                   "largest rank count");
      return usage_error();
    }
  }
  char **targv = calloc((size_t)nrest + 2, sizeof *targv);
  o->train = calloc((size_t)nrest + 1, sizeof *o->train);
  if (!targv || !o->train) {
    free(targv);
    return st_error_set("out of host memory parsing flags");
  }
  targv[0] = "train";
  for (int k = 0; k < nrest; k++) targv[k + 1] = rest[k];
  st_run_config rc;
  st_run_config_defaults(&rc);
  int bad = st_cli_parse_train(nrest + 1, targv, &rc);
  free(targv);
  if (bad) {
    st_error_prefix("train flags after --");
    return usage_error();
  }
  o->micro_batch = rc.micro_batch;
  for (int k = 0; k < nrest; k++) {
    if (strcmp(rest[k], "--micro-batch") == 0 && k + 1 < nrest) {
      k++;
      continue;
    }
    o->train[o->ntrain++] = rest[k];
  }
  /* Strong scaling splits micro-batch x the largest count over each count. */
  const int nmax = o->ranks[o->nranks - 1];
  if ((long long)o->micro_batch * nmax > (1LL << 30)) {
    st_error_set("micro-batch %d x %d ranks is more than train's largest --global-batch (2^30)",
                 o->micro_batch, nmax);
    return usage_error();
  }
  for (int m = 0; m < o->nmodes; m++) {
    if (strcmp(o->modes[m], "strong") != 0) continue;
    long long gb = (long long)o->micro_batch * nmax;
    for (int k = 0; k < o->nranks; k++)
      if (gb % o->ranks[k] != 0) {
        st_error_set("strong scaling: the global batch (micro-batch %d x %d ranks = %lld) does "
                     "not divide over %d ranks; choose rank counts that divide it, or --modes "
                     "weak", o->micro_batch, nmax, gb, o->ranks[k]);
        return usage_error();
      }
  }
  return 0;
}

/* The per-rank micro-batch and the global batch of one run. */
static void batch_of(const bt_opts *o, const char *mode, int n, int *mb, int *gb) {
  if (strcmp(mode, "weak") == 0) {
    *mb = o->micro_batch;
    *gb = o->micro_batch * n;
  } else {
    *gb = o->micro_batch * o->ranks[o->nranks - 1];
    *mb = *gb / n;
  }
}

/* The last few lines of a log, indented, into buf. */
/* 1 when the log at path holds needle (in its first 64 KiB). */
static int log_contains(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  static char buf[65536];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  return strstr(buf, needle) != NULL;
}

static void log_tail(const char *path, char *buf, size_t cap) {
  buf[0] = 0;
  FILE *f = fopen(path, "r");
  if (!f) return;
  char t[2048];
  long n = 0;
  if (fseek(f, 0, SEEK_END) == 0) {
    long end = ftell(f);
    fseek(f, end > (long)sizeof t - 1 ? end - (long)sizeof t + 1 : 0, SEEK_SET);
  }
  n = (long)fread(t, 1, sizeof t - 1, f);
  fclose(f);
  t[n] = 0;
  while (n > 0 && (t[n - 1] == '\n' || t[n - 1] == ' ')) t[--n] = 0;
  int lines = 0;
  long s = n;
  while (s > 0 && lines < 6) {
    s--;
    if (t[s] == '\n') lines++;
  }
  if (t[s] == '\n') s++;
  size_t used = 0;
  for (char *line = strtok(t + s, "\n"); line && used + 8 < cap; line = strtok(NULL, "\n"))
    used += (size_t)snprintf(buf + used, cap - used, "\n    %s", line);
}

/* The first "shardtrain: error" line a rank wrote into the log (the
 * launcher's own report follows it and would hide it in the tail), or "". */
static void log_error_line(const char *path, char *buf, size_t cap) {
  buf[0] = 0;
  FILE *f = fopen(path, "r");
  if (!f) return;
  char *line = NULL;
  size_t lcap = 0;
  ssize_t n;
  while ((n = getline(&line, &lcap, f)) > 0) {
    const char *e = strstr(line, "shardtrain: error");
    if (!e) continue;
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    snprintf(buf, cap, "\n    %s", e);
    break;
  }
  free(line);
  fclose(f);
}

/* Start the launcher on `train` for one run, output to log; wait for it. */
static int run_one(const bt_opts *o, const char *exe, const char *mode, int n, int mb, int gb,
                   const char *dir, const char *log) {
  char words[sizeof o->launcher];
  snprintf(words, sizeof words, "%s", o->launcher);
  char *av[MAX_LAUNCHER_WORDS + 24 + 1];
  int ac = 0;
  for (char *w = strtok(words, " \t"); w; w = strtok(NULL, " \t")) {
    if (ac == MAX_LAUNCHER_WORDS)
      return st_error_set("--launcher has more than %d words", MAX_LAUNCHER_WORDS);
    av[ac++] = w;
  }
  if (ac == 0) /* parse refuses a launcher without a word; never start av[0] unset */
    return st_error_set("the launcher '%s' (%s) has no command word", o->launcher,
                        o->launcher_from);
  const char *prog = strrchr(av[0], '/') ? strrchr(av[0], '/') + 1 : av[0];
  char ns[16], mbs[16], gbs[16];
  snprintf(ns, sizeof ns, "%d", n);
  snprintf(mbs, sizeof mbs, "%d", mb);
  snprintf(gbs, sizeof gbs, "%d", gb);
  av[ac++] = strcmp(prog, "srun") == 0 ? "--ntasks" : "-np";
  av[ac++] = ns;
  av[ac++] = (char *)exe;
  av[ac++] = "train";
  char **full = calloc((size_t)(ac + o->ntrain + 16), sizeof *full);
  if (!full) return st_error_set("out of host memory starting a run");
  int fc = 0;
  for (int k = 0; k < ac; k++) full[fc++] = av[k];
  for (int k = 0; k < o->ntrain; k++) full[fc++] = o->train[k];
  const char *tail[] = {"--micro-batch", mbs, "--global-batch", gbs, "--out", dir, "--resume",
                        "none", "--step-timing", "--val-seqs", "0"};
  for (size_t k = 0; k < sizeof tail / sizeof tail[0]; k++) full[fc++] = (char *)tail[k];
  full[fc] = NULL;

  /* The command first, so the log says what produced it. */
  FILE *lf = fopen(log, "w");
  if (!lf) {
    free(full);
    return st_error_set("cannot write %s: %s", log, strerror(errno));
  }
  fprintf(lf, "# shardtrain bench train: %s, %d ranks:", mode, n);
  for (int k = 0; k < fc; k++) fprintf(lf, " %s", full[k]);
  fprintf(lf, "\n");
  fclose(lf);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_APPEND, 0);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  fflush(stdout);
  fflush(stderr);
  pid_t pid;
  int err = posix_spawnp(&pid, full[0], &fa, NULL, full, environ);
  posix_spawn_file_actions_destroy(&fa);
  free(full);
  if (err)
    return st_error_set("cannot start the launcher '%s' (%s): %s; set --launcher or ST_MPIRUN",
                        av[0], o->launcher_from, strerror(err));
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return st_error_set("waiting for %s: %s", av[0], strerror(errno));
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
  char why[64], first[600], tail_text[1800];
  if (WIFEXITED(status)) snprintf(why, sizeof why, "exit code %d", WEXITSTATUS(status));
  else snprintf(why, sizeof why, "signal %d", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  log_error_line(log, first, sizeof first);
  log_tail(log, tail_text, sizeof tail_text);
  /* Open MPI refuses root without a flag: say which setting takes it */
  const char *hint = log_contains(log, "allow-run-as-root")
                         ? "\n  hint: running as root, Open MPI needs --allow-run-as-root: give "
                           "--launcher \"mpirun --allow-run-as-root\" or set ST_MPIRUN"
                         : "";
  return st_error_set_lines("the %s run on %d rank%s failed (%s); its output is in %s%s%s\n  "
                      "which ends:%s%s", mode, n, n == 1 ? "" : "s", why, log,
                      first[0] ? "\n  first error:" : "", first,
                      tail_text[0] ? tail_text : "\n    (nothing)", hint);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median as Python's statistics.median: the mean of the middle two for an
 * even count. Sorts v. */
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int num(const cJSON *o, const char *k, double *out) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!cJSON_IsNumber(x)) return -1;
  *out = x->valuedouble;
  return 0;
}

/* A run's metrics.jsonl: the model from its memory_plan line, then the
 * median of each phase over the timed steps after the first. */
static int read_run(const char *dir, int n, bt_row *r) {
  char path[1100];
  snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
  FILE *f = fopen(path, "r");
  if (!f) return st_error_set("%s: %s (the run wrote no metrics)", path, strerror(errno));
  static const char *const keys[5] = {"t_step_ms", "t_data_ms", "t_compute_ms", "t_comm_ms",
                                      "t_optimizer_ms"};
  double *v[5] = {0};
  int cnt = 0, cap = 0, have_plan = 0, rc = 0;
  double P = 0, C = 0, L = 0, T = 0, G = 0;
  char *line = NULL;
  size_t lcap = 0;
  while (getline(&line, &lcap, f) > 0) {
    cJSON *j = cJSON_Parse(line);
    if (!j) continue;
    const cJSON *plan = cJSON_GetObjectItemCaseSensitive(j, "memory_plan");
    double x[5];
    if (plan && !have_plan) {
      const cJSON *m = cJSON_GetObjectItemCaseSensitive(plan, "model"),
                  *c = cJSON_GetObjectItemCaseSensitive(plan, "config");
      have_plan = !num(m, "params", &P) && !num(m, "n_embd", &C) && !num(m, "n_layer", &L) &&
                  !num(m, "seq_len", &T) && !num(c, "global_batch", &G);
    } else if (!num(j, keys[0], &x[0])) {
      int ok = 1;
      for (int k = 1; k < 5; k++) ok = ok && !num(j, keys[k], &x[k]);
      if (ok) {
        if (cnt == cap) {
          cap = cap ? 2 * cap : 64;
          for (int k = 0; k < 5; k++) {
            double *p = realloc(v[k], (size_t)cap * sizeof *p);
            if (!p) rc = -1;
            else v[k] = p;
          }
        }
        if (rc == 0) {
          for (int k = 0; k < 5; k++) v[k][cnt] = x[k];
          cnt++;
        }
      }
    }
    cJSON_Delete(j);
    if (rc) break;
  }
  free(line);
  fclose(f);
  if (rc) {
    st_error_set("out of host memory reading %s", path);
  } else if (!have_plan) {
    st_error_set("%s has no memory_plan line with the model and batch", path);
    rc = -1;
  } else if (cnt == 0) {
    st_error_set("%s has no timed steps (t_step_ms): was the run made with --step-timing?", path);
    rc = -1;
  }
  /* cnt > 0 here: every v[k] holds cnt values (median sorts them). */
  if (rc == 0 && cnt > 0) {
    const int skip = cnt > 1; /* the first step warms caches and allocators */
    double med[5];
    for (int k = 0; k < 5; k++) med[k] = median(v[k] + skip, cnt - skip);
    r->ranks = n;
    r->steps_timed = cnt - skip;
    r->global_batch = (int)G;
    r->tokens_per_step = G * T;
    r->flops_per_token = 6 * P + 6 * L * C * T;
    r->t_step = med[0];
    r->t_data = med[1];
    r->t_compute = med[2];
    r->t_comm = med[3];
    r->t_optimizer = med[4];
    r->tokens_per_s = r->tokens_per_step / (r->t_step / 1e3);
    r->tflops_per_rank = r->flops_per_token * r->tokens_per_s / n / 1e12;
  }
  for (int k = 0; k < 5; k++) free(v[k]);
  return rc;
}

/* One row as scaling.json (and --json) hold it; mode only for --json. */
static cJSON *row_json(const bt_row *r, const char *mode) {
  cJSON *j = cJSON_CreateObject();
  if (mode) cJSON_AddStringToObject(j, "mode", mode);
  cJSON_AddNumberToObject(j, "ranks", r->ranks);
  cJSON_AddNumberToObject(j, "tokens_per_s", r->tokens_per_s);
  cJSON_AddNumberToObject(j, "tflops_per_rank", r->tflops_per_rank);
  if (r->mfu > 0) cJSON_AddNumberToObject(j, "mfu", r->mfu);
  else cJSON_AddNullToObject(j, "mfu");
  cJSON_AddNumberToObject(j, "t_step_ms", r->t_step);
  cJSON_AddNumberToObject(j, "t_data_ms", r->t_data);
  cJSON_AddNumberToObject(j, "t_compute_ms", r->t_compute);
  cJSON_AddNumberToObject(j, "t_comm_ms", r->t_comm);
  cJSON_AddNumberToObject(j, "t_optimizer_ms", r->t_optimizer);
  cJSON_AddNumberToObject(j, "efficiency", r->efficiency);
  cJSON_AddNumberToObject(j, "micro_batch", r->micro_batch);
  cJSON_AddNumberToObject(j, "global_batch", r->global_batch);
  cJSON_AddNumberToObject(j, "tokens_per_step", r->tokens_per_step);
  cJSON_AddNumberToObject(j, "flops_per_token", r->flops_per_token);
  cJSON_AddNumberToObject(j, "steps_timed", r->steps_timed);
  cJSON_AddBoolToObject(j, "step_timing_synchronised", 1);
  return j;
}

static void print_table(const char *mode, const bt_row *rows, int n) {
  printf("%s scaling (%s), median step after the first; efficiency against the smallest rank "
         "count\n", mode, strcmp(mode, "weak") == 0 ? "micro-batch per rank fixed"
                                                    : "global batch fixed");
  printf("%6s %12s %13s %6s %7s %9s %7s %9s %7s %7s\n", "ranks", "tokens/s", "TFLOP/s/rank",
         "MFU", "eff", "step ms", "data", "compute", "comm", "optim");
  for (int k = 0; k < n; k++) {
    const bt_row *r = rows + k;
    char mfu[16];
    if (r->mfu > 0) snprintf(mfu, sizeof mfu, "%5.1f%%", 100 * r->mfu);
    else snprintf(mfu, sizeof mfu, "    -");
    printf("%6d %12.0f %13.3f %6s %6.1f%% %9.2f %7.2f %9.2f %7.2f %7.2f\n", r->ranks,
           r->tokens_per_s, r->tflops_per_rank, mfu, 100 * r->efficiency, r->t_step, r->t_data,
           r->t_compute, r->t_comm, r->t_optimizer);
  }
}

/* 1 when this process was itself started by mpirun or srun as an MPI rank. */
static int under_mpi_launcher(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
}


int st_cmd_bench_train(int argc, char **argv) {
  for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      st_bench_train_usage();
      return 0;
    }
  if (under_mpi_launcher()) {
    st_error_set("bench train starts its runs with mpirun or srun itself: run it as one "
                 "process (shardtrain bench train --ranks 1,2 -- ...), not under a launcher");
    return st_cli_fail(ST_EXIT_USAGE);
  }
  bt_opts o;
  if (parse(argc, argv, &o)) {
    free(o.train);
    return st_cli_fail(st_error_exit_code());
  }
  char exe[1024];
  ssize_t el = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (el <= 0) {
    free(o.train);
    st_error_set("cannot find this executable through /proc/self/exe: %s", strerror(errno));
    return st_cli_fail(ST_EXIT_ERROR);
  }
  exe[el] = 0;
  if (st_mkdir_p(o.out)) {
    free(o.train);
    st_error_prefix("--out %s", o.out);
    return st_cli_fail(ST_EXIT_ERROR);
  }
  FILE *info = o.json ? stderr : stdout; /* --json keeps stdout for the objects */
  fprintf(info, "shardtrain bench train: modes");
  for (int m = 0; m < o.nmodes; m++) fprintf(info, "%s%s", m ? "," : " ", o.modes[m]);
  fprintf(info, ", ranks");
  for (int k = 0; k < o.nranks; k++) fprintf(info, "%s%d", k ? "," : " ", o.ranks[k]);
  fprintf(info, ", micro-batch %d per rank; launcher: %s (%s); runs and logs in %s/\n",
          o.micro_batch, o.launcher, o.launcher_from, o.out);
  fflush(info);

  bt_row rows[2][MAX_RANK_COUNTS];
  memset(rows, 0, sizeof rows);
  int code = 0;
  for (int m = 0; m < o.nmodes && !code; m++) {
    for (int k = 0; k < o.nranks && !code; k++) {
      const int n = o.ranks[k];
      int mb, gb;
      batch_of(&o, o.modes[m], n, &mb, &gb);
      char dir[1024], log[1100];
      snprintf(dir, sizeof dir, "%s/%s-%d", o.out, o.modes[m], n);
      snprintf(log, sizeof log, "%s.log", dir);
      if (st_path_exists(dir) && st_rm_rf(dir)) {
        st_error_prefix("cannot replace %s", dir);
        code = ST_EXIT_ERROR;
        break;
      }
      fprintf(info, "  %s, %d rank%s: micro-batch %d, global batch %d ... ", o.modes[m], n,
              n == 1 ? "" : "s", mb, gb);
      fflush(info);
      struct timespec t0, t1;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      if (run_one(&o, exe, o.modes[m], n, mb, gb, dir, log)) {
        fprintf(info, "failed\n");
        code = ST_EXIT_ERROR;
        break;
      }
      clock_gettime(CLOCK_MONOTONIC, &t1);
      bt_row *r = &rows[m][k];
      if (read_run(dir, n, r)) {
        fprintf(info, "no timings\n");
        st_error_prefix("the %s run on %d rank%s (log: %s)", o.modes[m], n, n == 1 ? "" : "s",
                        log);
        code = ST_EXIT_ERROR;
        break;
      }
      r->micro_batch = mb;
      r->mfu = o.peak_tflops > 0 ? r->tflops_per_rank / o.peak_tflops : 0;
      fprintf(info, "%.1f s, %.0f tokens/s\n",
              (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec),
              r->tokens_per_s);
      fflush(info);
    }
    if (code) break;
    const bt_row *base = &rows[m][0];
    for (int k = 0; k < o.nranks; k++) {
      const double ratio = (double)rows[m][k].ranks / base->ranks;
      rows[m][k].efficiency = rows[m][k].tokens_per_s / (ratio * base->tokens_per_s);
    }
  }
  free(o.train);
  if (code) return st_cli_fail(code);

  cJSON *res = cJSON_CreateObject();
  for (int m = 0; m < o.nmodes; m++) {
    cJSON *arr = cJSON_AddArrayToObject(res, o.modes[m]);
    for (int k = 0; k < o.nranks; k++) cJSON_AddItemToArray(arr, row_json(&rows[m][k], NULL));
  }
  char *text = cJSON_Print(res);
  cJSON_Delete(res);
  char path[1100];
  snprintf(path, sizeof path, "%s/scaling.json", o.out);
  int werr = !text || st_write_file_atomic(path, text);
  free(text);
  if (werr) {
    if (!text) st_error_set("out of host memory writing %s", path);
    return st_cli_fail(ST_EXIT_ERROR);
  }
  for (int m = 0; m < o.nmodes; m++) {
    if (!o.json) {
      print_table(o.modes[m], rows[m], o.nranks);
      continue;
    }
    for (int k = 0; k < o.nranks; k++) {
      cJSON *j = row_json(&rows[m][k], o.modes[m]);
      char *s = cJSON_PrintUnformatted(j);
      printf("%s\n", s ? s : "{}");
      free(s);
      cJSON_Delete(j);
    }
  }
  fprintf(info, "tokens/s = global batch x seq len / median step. --step-timing synchronises the "
                "device at each phase boundary, so these steps are slightly slower than an "
                "ordinary run's (about 1-3%% on 2 H200s). Written: %s\n", path);
  return 0;
}
