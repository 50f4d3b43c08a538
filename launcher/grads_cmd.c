/* grads_cmd.c - `shardtrain grads norms RUN` (per-tensor gradient norms
 * over a run's dumps) and `shardtrain grads diff A B` (where two dumps of
 * the same step differ: 1 rank against 4, bf16 against fp32, before and
 * after a change). Whole tensors are read through each dump's index, so
 * dumps of any rank count and ZeRO stage compare. */
#define _XOPEN_SOURCE 700
#include "launcher/grads_cmd.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/grad_dump.h"
#include "util/error.h"
#include "util/fsutil.h"

#define MAX_STEPS 100000

static int usage_fail(const char *msg) {
  st_error_code(ST_EXIT_USAGE);
  st_error_set("%s", msg);
  fprintf(stderr, "shardtrain grads: %s\n", st_error_msg());
  return ST_EXIT_USAGE;
}

static int fail(int code) {
  fprintf(stderr, "shardtrain grads: %s\n", st_error_msg());
  return code;
}

static void print_usage(void) {
  printf("usage: shardtrain grads norms RUN_DIR [--tensors PATTERN] [--json]\n"
         "       shardtrain grads diff A B [--step N] [--clipped] [--tol X] [--json]\n"
         "  norms  per-tensor L2 norms of the gradients of every dump in RUN_DIR/grads (train\n"
         "         --dump-grads EVERY[:PATTERN]), a column per step, with the global norm, the\n"
         "         clip factor and the loss scale; --tensors: comma-separated globs of names\n"
         "  diff   A and B are dump directories (RUN/grads/step_N) or run directories (then\n"
         "         the dump of --step N, default the latest step both have); for each tensor\n"
         "         in both: norms, the largest absolute difference and ||A-B|| / ||A||, and\n"
         "         the tensor that differs most. --clipped compares after clipping. --tol X:\n"
         "         exit 1 when a tensor's relative difference exceeds X\n"
         "  exit   0; 1 (diff --tol exceeded); 2 bad flag; 3 a dump that cannot be read, or\n"
         "         dumps of two different models\n");
}

static void step_dir(const char *run, int64_t step, char *out, size_t cap) {
  snprintf(out, cap, "%s/grads/step_%08lld", run, (long long)step);
}

/* ---------------------------------------------------------------- norms */

static int cmd_norms(int argc, char **argv) {
  const char *run = NULL, *pattern = "";
  int json = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--json") == 0) json = 1;
    else if (strcmp(argv[i], "--tensors") == 0 && i + 1 < argc) pattern = argv[++i];
    else if (argv[i][0] == '-' || run) {
      char msg[512];
      snprintf(msg, sizeof msg, "norms: unexpected argument '%s'; usage: shardtrain grads "
               "norms RUN_DIR [--tensors PATTERN] [--json]", argv[i]);
      return usage_fail(msg);
    } else run = argv[i];
  }
  if (!run) return usage_fail("norms: give the run directory (shardtrain grads norms RUN_DIR)");
  int64_t *steps = malloc(MAX_STEPS * sizeof *steps);
  if (!steps) return usage_fail("out of host memory");
  int n = st_grad_dump_list(run, steps, MAX_STEPS);
  if (n == 0) st_error_set("%s/grads holds no complete dump", run);
  if (n <= 0) {
    free(steps);
    return fail(ST_EXIT_CHECKPOINT);
  }
  if (n > MAX_STEPS) n = MAX_STEPS;
  st_grad_dump_info *info = calloc((size_t)n, sizeof *info);
  int code = info ? 0 : usage_fail("out of host memory");
  for (int s = 0; s < n && !code; s++) {
    char dir[4200];
    step_dir(run, steps[s], dir, sizeof dir);
    if (st_grad_dump_open(dir, &info[s])) code = fail(ST_EXIT_CHECKPOINT);
    else if (info[s].n != info[0].n)
      code = (st_error_set("%s has %d tensors, %s/grads/step_%08lld %d: dumps of two models "
                           "in one run directory", dir, info[s].n, run, (long long)steps[0],
                           info[0].n), fail(ST_EXIT_CHECKPOINT));
  }
  if (!code && json) {
    for (int s = 0; s < n; s++) {
      const st_grad_dump_meta *m = &info[s].meta;
      printf("{\"step\":%lld,\"grad_norm\":%.9g,\"clip_factor\":%.9g,\"loss_scale\":%.9g,"
             "\"skipped\":%d,\"world_size\":%d,\"norms\":{", (long long)m->step, m->grad_norm,
             m->clip_factor, m->loss_scale, m->skipped, m->world_size);
      int first = 1;
      for (int t = 0; t < info[s].n; t++) {
        if (!st_grad_pattern_match(pattern, info[s].rows[t].name)) continue;
        printf("%s\"%s\":%.9g", first ? "" : ",", info[s].rows[t].name, info[s].rows[t].norm);
        first = 0;
      }
      printf("}}\n");
    }
  } else if (!code) {
    printf("%-28s", "step");
    for (int s = 0; s < n; s++) printf(" %12lld", (long long)info[s].meta.step);
    printf("\n%-28s", "grad_norm (before clip)");
    for (int s = 0; s < n; s++) printf(" %12.6g", info[s].meta.grad_norm);
    printf("\n%-28s", "clip factor");
    for (int s = 0; s < n; s++) printf(" %12.6g", info[s].meta.clip_factor);
    printf("\n%-28s", "loss scale");
    for (int s = 0; s < n; s++) printf(" %12.6g", info[s].meta.loss_scale);
    printf("\n");
    for (int t = 0; t < info[0].n; t++) {
      if (!st_grad_pattern_match(pattern, info[0].rows[t].name)) continue;
      printf("%-28s", info[0].rows[t].name);
      for (int s = 0; s < n; s++) printf(" %12.6g", info[s].rows[t].norm);
      printf("\n");
    }
  }
  for (int s = 0; info && s < n; s++) st_grad_dump_close(&info[s]);
  free(info);
  free(steps);
  return code;
}

/* ----------------------------------------------------------------- diff */

/* A dump directory as given, or the run's dump of `step` (-1: the latest
 * step that `other_run` also has, when it is a run too). */
static int resolve(const char *arg, int64_t step, const char *other, char *out, size_t cap) {
  char idx[4200];
  if (!st_is_dir(arg))
    return st_error_set("%s: no such directory; give a run directory (train --out) or one of "
                        "its dumps, RUN/grads/step_N", arg);
  snprintf(idx, sizeof idx, "%s/index.h5", arg);
  if (st_path_exists(idx)) {
    snprintf(out, cap, "%s", arg);
    return 0;
  }
  if (step < 0) {
    int64_t *a = malloc(MAX_STEPS * sizeof *a), *b = malloc(MAX_STEPS * sizeof *b);
    int na = a ? st_grad_dump_list(arg, a, MAX_STEPS) : -1, nb = 0;
    snprintf(idx, sizeof idx, "%s/index.h5", other);
    int other_is_dump = st_path_exists(idx);
    if (na > 0 && !other_is_dump && b) nb = st_grad_dump_list(other, b, MAX_STEPS);
    if (na > MAX_STEPS) na = MAX_STEPS;
    if (nb > MAX_STEPS) nb = MAX_STEPS;
    for (int i = na - 1; i >= 0 && step < 0; i--) {
      if (other_is_dump) step = a[i];
      for (int j = 0; j < nb && step < 0; j++)
        if (b[j] == a[i]) step = a[i];
    }
    free(a);
    free(b);
    if (na < 0) return -1;
    if (step < 0)
      return st_error_set("%s and %s have no dump of a common step (give --step N, or two "
                          "dump directories)", arg, other);
  }
  step_dir(arg, step, out, cap);
  snprintf(idx, sizeof idx, "%s/index.h5", out);
  if (!st_path_exists(idx)) {
    int64_t have[8];
    const int n = st_grad_dump_list(arg, have, 8);
    char list[160] = "";
    for (int i = 0, k = 0; i < n && i < 8; i++)
      k += snprintf(list + k, sizeof list - (size_t)k, "%s%lld", i ? ", " : "", (long long)have[i]);
    return st_error_set("%s: no complete dump of step %lld; its dumps: %s%s", arg,
                        (long long)step, n > 0 ? list : "none", n > 8 ? ", ..." : "");
  }
  return 0;
}

typedef struct {
  int index;            /* in A's table */
  double na, nb, maxabs, rel;
} diff_row;

static int cmd_diff(int argc, char **argv) {
  const char *arg[2] = {NULL, NULL};
  int json = 0, clipped = 0, nargs = 0;
  long long step = -1;
  double tol = -1;
  for (int i = 1; i < argc; i++) {
    char *end = NULL;
    if (strcmp(argv[i], "--json") == 0) json = 1;
    else if (strcmp(argv[i], "--clipped") == 0) clipped = 1;
    else if (strcmp(argv[i], "--step") == 0 && i + 1 < argc) {
      step = strtoll(argv[++i], &end, 10);
      if (*end || step < 0) return usage_fail("diff: --step takes a step number >= 0");
    } else if (strcmp(argv[i], "--tol") == 0 && i + 1 < argc) {
      tol = strtod(argv[++i], &end);
      if (*end || !(tol >= 0) || isinf(tol))
        return usage_fail("diff: --tol takes a relative difference >= 0 (e.g. 1e-5)");
    } else if (argv[i][0] == '-' || nargs == 2) {
      char msg[512];
      snprintf(msg, sizeof msg, "diff: unexpected argument '%s'; usage: shardtrain grads diff "
               "A B [--step N] [--clipped] [--tol X] [--json]", argv[i]);
      return usage_fail(msg);
    } else arg[nargs++] = argv[i];
  }
  if (nargs != 2) return usage_fail("diff: give two dumps or run directories (grads diff A B)");
  char dir[2][4200];
  if (resolve(arg[0], step, arg[1], dir[0], sizeof dir[0]) ||
      resolve(arg[1], step, arg[0], dir[1], sizeof dir[1]))
    return fail(ST_EXIT_CHECKPOINT);
  st_grad_dump_info in[2];
  if (st_grad_dump_open(dir[0], &in[0])) return fail(ST_EXIT_CHECKPOINT);
  if (st_grad_dump_open(dir[1], &in[1])) {
    st_grad_dump_close(&in[0]);
    return fail(ST_EXIT_CHECKPOINT);
  }
  int code = 0;
  diff_row *rows = calloc((size_t)in[0].n + 1, sizeof *rows);
  int nrow = 0, worst = -1, over = 0;
  if (!rows) code = usage_fail("out of host memory");
  const char *group = clipped ? "grads_clipped" : "grads";
  for (int t = 0; t < in[0].n && !code; t++) {
    const st_grad_norm_row *ra = &in[0].rows[t];
    int u = -1;
    for (int k = 0; k < in[1].n; k++)
      if (strcmp(in[1].rows[k].name, ra->name) == 0) u = k;
    if (u < 0 || in[1].rows[u].numel != ra->numel) {
      st_error_set("%s in %s is %s in %s: dumps of two different models", ra->name, dir[0],
                   u < 0 ? "missing" : "of another size", dir[1]);
      code = fail(ST_EXIT_CHECKPOINT);
      break;
    }
    if (!ra->dumped || !in[1].rows[u].dumped) continue;
    float *a = NULL, *b = NULL;
    int64_t na = 0, nb = 0;
    if (st_grad_dump_read(dir[0], group, ra->name, &a, &na) ||
        st_grad_dump_read(dir[1], group, ra->name, &b, &nb)) {
      code = fail(ST_EXIT_CHECKPOINT);
    } else {
      double sa = 0, sb = 0, sd = 0, mx = 0;
      for (int64_t j = 0; j < na; j++) {
        const double d = (double)a[j] - (double)b[j];
        sa += (double)a[j] * a[j];
        sb += (double)b[j] * b[j];
        sd += d * d;
        if (fabs(d) > mx || isnan(d)) mx = isnan(d) ? NAN : fabs(d);
      }
      diff_row *r = &rows[nrow++];
      r->index = t;
      r->na = sqrt(sa);
      r->nb = sqrt(sb);
      r->maxabs = mx;
      r->rel = sd == 0 ? 0 : sqrt(sd) / (r->na > 0 ? r->na : 1e-30);
      if (isnan(sd)) r->rel = NAN;
      if (worst < 0 || !(r->rel <= rows[worst].rel)) worst = nrow - 1;
      if (tol >= 0 && !(r->rel <= tol)) over++;
    }
    free(a);
    free(b);
  }
  if (!code && nrow == 0) {
    st_error_set("%s and %s have no tensor dumped in both (their --dump-grads patterns: "
                 "'%s', '%s')", dir[0], dir[1], in[0].meta.pattern, in[1].meta.pattern);
    code = fail(ST_EXIT_CHECKPOINT);
  }
  if (!code && json) {
    for (int i = 0; i < nrow; i++)
      printf("{\"tensor\":\"%s\",\"norm_a\":%.9g,\"norm_b\":%.9g,\"max_abs_diff\":%.9g,"
             "\"rel_diff\":%.9g}\n", in[0].rows[rows[i].index].name, rows[i].na, rows[i].nb,
             rows[i].maxabs, rows[i].rel);
  } else if (!code) {
    printf("A: %s (step %lld, %d rank(s), ZeRO %d, grad_norm %.9g)\n", dir[0],
           (long long)in[0].meta.step, in[0].meta.world_size, in[0].meta.zero_stage,
           in[0].meta.grad_norm);
    printf("B: %s (step %lld, %d rank(s), ZeRO %d, grad_norm %.9g)\n", dir[1],
           (long long)in[1].meta.step, in[1].meta.world_size, in[1].meta.zero_stage,
           in[1].meta.grad_norm);
    printf("%-28s %12s %12s %12s %12s\n", clipped ? "tensor (after clipping)" : "tensor",
           "norm A", "norm B", "max |A-B|", "|A-B|/|A|");
    for (int i = 0; i < nrow; i++)
      printf("%-28s %12.6g %12.6g %12.4g %12.4g%s\n", in[0].rows[rows[i].index].name,
             rows[i].na, rows[i].nb, rows[i].maxabs, rows[i].rel,
             tol >= 0 && !(rows[i].rel <= tol) ? "  > tol" : "");
  }
  if (!code) {
    const diff_row *w = &rows[worst];
    fprintf(json ? stderr : stdout,
            "largest difference: %s, |A-B|/|A| = %.4g; %d of %d tensors compared%s\n",
            in[0].rows[w->index].name, w->rel, nrow, in[0].n,
            tol < 0 ? "" : over ? ", some above --tol" : ", all within --tol");
    if (tol >= 0 && over) code = 1;
  }
  free(rows);
  st_grad_dump_close(&in[0]);
  st_grad_dump_close(&in[1]);
  return code;
}

int st_cmd_grads(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    print_usage();
    return argc < 2 ? ST_EXIT_USAGE : 0;
  }
  if (strcmp(argv[1], "norms") == 0) return cmd_norms(argc - 1, argv + 1);
  if (strcmp(argv[1], "diff") == 0) return cmd_diff(argc - 1, argv + 1);
  char msg[256];
  snprintf(msg, sizeof msg, "unknown grads command '%s': norms or diff (shardtrain grads --help)",
           argv[1]);
  return usage_fail(msg);
}
