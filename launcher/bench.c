/* bench.c - the collectives benchmark command (see bench.h): sizes doubling
 * from --min-bytes to --max-bytes, each op checked once against known values
 * and then timed, printed as nccl-tests prints them (time, algbw, busbw). */
#include "launcher/bench.h"

#include <cjson/cJSON.h>
#include <mpi.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/busbw.h"
#include "collectives/collectives.h"
#include "collectives/scaling_model.h"
#include "kernels/ops.h"
#include "launcher/cli.h"
#include "launcher/env.h"
#include "rank/train/config_agree.h"
#include "rank/train/device_select.h"
#include "util/bytes.h"
#include "util/error.h"
#ifdef SHARDTRAIN_HAVE_CUDA
#include "collectives/collectives_nccl.h"
#include "kernels/ops_cuda.h"
#endif

typedef struct {
  char device[8];
  uint64_t min_bytes, max_bytes;
  int ops[ST_COLL_COUNT], nops;
  int iters, warmup, json, blocking;
  double nccl_timeout_s;
} bench_opts;

static void usage(void) {
  printf("usage: shardtrain bench collectives [flags]   (under mpirun/srun, one rank per GPU)\n"
         "  --device cpu|cuda|auto   NCCL on GPUs, MPI on CPU ranks (auto)\n"
         "  --min-bytes SIZE         smallest total array size S (8)\n"
         "  --max-bytes SIZE         largest S, sizes double (GPU 4GiB, CPU 64MiB)\n"
         "  --ops LIST               all-reduce,reduce-scatter,all-gather,broadcast (all)\n"
         "  --iters N                timed calls per size (0: 100 up to 1 MiB, 20 up to 64 MiB,\n"
         "                           5 above)  --warmup N (5)\n"
         "  --timing pipelined|blocking  pipelined (default): the timed calls are enqueued back\n"
         "                           to back and waited for once, as nccl-tests times them;\n"
         "                           blocking: the host waits for each call, as train does\n"
         "  --nccl-timeout S         watchdog per collective (600)  --json  (one object a line)\n"
         "busbw = algbw x 2(n-1)/n (all-reduce), x (n-1)/n (reduce-scatter, all-gather),\n"
         "x 1 (broadcast); algbw = S / time, S the total array size (nccl-tests' definitions).\n"
         "Data: fp32. Every size is first checked against known values on every rank.\n");
}

static int usage_error(void) {
  st_error_code(ST_EXIT_USAGE);
  return -1;
}

static const char *const k_coll_flags[] = {"--device", "--min-bytes", "--max-bytes", "--ops",
                                           "--iters",  "--warmup",    "--timing",    "--nccl-timeout",
                                           "--json",   NULL};

static int parse(int argc, char **argv, bench_opts *o) {
  memset(o, 0, sizeof *o);
  snprintf(o->device, sizeof o->device, "auto");
  o->min_bytes = 8;
  o->warmup = 5;
  o->nccl_timeout_s = 600;
  for (int i = 2; i < argc; i++) {
    const char *f = argv[i];
    if (strcmp(f, "--json") == 0) {
      o->json = 1;
      continue;
    }
    if (i + 1 >= argc) return st_cli_missing_value(f, k_coll_flags, "bench collectives");
    const char *v = argv[++i];
    if (strcmp(f, "--device") == 0) {
      if (strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "auto")) {
        st_error_set("--device %s: use cpu, cuda or auto", v);
        return usage_error();
      }
      snprintf(o->device, sizeof o->device, "%s", v);
    } else if (strcmp(f, "--min-bytes") == 0 || strcmp(f, "--max-bytes") == 0) {
      uint64_t b;
      if (st_parse_bytes(v, &b) || b == 0) {
        st_error_set("%s %s: give a size such as 8, 64KiB or 4GiB", f, v);
        return usage_error();
      }
      if (f[2] == 'm' && f[3] == 'i') o->min_bytes = b;
      else o->max_bytes = b;
    } else if (strcmp(f, "--ops") == 0) {
      char buf[256];
      snprintf(buf, sizeof buf, "%s", v);
      for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int op = st_coll_parse(tok);
        if (op < 0 || o->nops == ST_COLL_COUNT) {
          st_error_set("--ops: unknown collective '%s' (all-reduce, reduce-scatter, all-gather, "
                       "broadcast)", tok);
          return usage_error();
        }
        o->ops[o->nops++] = op;
      }
    } else if (strcmp(f, "--iters") == 0 || strcmp(f, "--warmup") == 0) {
      char *end;
      long n = strtol(v, &end, 10);
      if (*end || n < 0 || n > 1000000) {
        st_error_set("%s %s: give a whole number from 0 to 1000000", f, v);
        return usage_error();
      }
      if (f[2] == 'i') o->iters = (int)n;
      else o->warmup = (int)n;
    } else if (strcmp(f, "--timing") == 0) {
      if (strcmp(v, "pipelined") && strcmp(v, "blocking")) {
        st_error_set("--timing %s: use pipelined or blocking", v);
        return usage_error();
      }
      o->blocking = v[0] == 'b';
    } else if (strcmp(f, "--nccl-timeout") == 0) {
      if (st_cli_number_in(f, v, 0.0, 1e6, &o->nccl_timeout_s)) return usage_error();
    } else {
      char hint[64];
      st_error_set("unknown flag '%s'%s for bench collectives (see shardtrain bench --help)", f,
                   st_cli_did_you_mean(f, k_coll_flags, hint, sizeof hint));
      return usage_error();
    }
  }
  if (o->nops == 0)
    for (int k = 0; k < ST_COLL_COUNT; k++) o->ops[o->nops++] = k;
  return 0;
}

static int iters_for(const bench_opts *o, uint64_t bytes) {
  if (o->iters > 0) return o->iters;
  return bytes <= (1u << 20) ? 100 : bytes <= (64u << 20) ? 20 : 5;
}

/* Backend and communicator, as train picks them (rank/train/device_select.h). */
static int setup(bench_opts *o, const st_env *env, st_comm *mpi, st_comm *nccl, st_comm **dcomm,
                 const st_ops **ops, char *where, size_t cap) {
  /* The outputs are set before anything can fail, so a caller never sees
   * them unset. */
  *ops = st_ops_cpu();
  *dcomm = mpi;
  snprintf(where, cap, "mpi on cpu");
  st_device dev;
  if (st_device_select(o->device, env, &dev)) return -1;
  if (!o->max_bytes) o->max_bytes = dev.index >= 0 ? (4ull << 30) : (64ull << 20);
#ifdef SHARDTRAIN_HAVE_CUDA
  if (dev.index >= 0) {
    st_nccl_options no = {.timeout_s = o->nccl_timeout_s, .cga_cluster_size = -1,
                          .one_rank_nccl = 1};
    if (st_comm_nccl_init(nccl, &no)) return -1;
    *dcomm = nccl;
    *ops = st_ops_cuda(ST_FP32);
    snprintf(where, cap, "nccl on %s; %s", dev.name, st_comm_nccl_describe(nccl));
  }
#else
  (void)nccl;
#endif
  return 0;
}

static int run(bench_opts *o, st_comm *c, const st_ops *ops, const char *where) {
  size_t half = st_coll_buffer_bytes(o->max_bytes) / 2;
  void *send = ops->alloc(half, "bench"), *recv = ops->alloc(half, "bench");
  int bad = !send || !recv;
  c->all_reduce_int_max(c, &bad, 1);
  if (bad) {
    ops->free(send);
    ops->free(recv);
    char b[32];
    return st_error_set("cannot allocate 2 x %s of %s memory for --max-bytes; lower it",
                        st_format_bytes(half, b, sizeof b), ops->name);
  }
  if (c->rank == 0 && !o->json) {
    printf("shardtrain bench collectives: %d rank%s, %s\nfp32 data; algbw = S/time with S the "
           "total array size; busbw = algbw x 2(n-1)/n (all-reduce), x (n-1)/n (reduce-scatter,"
           " all-gather), x 1 (broadcast); %s timing\n", c->world, c->world == 1 ? "" : "s", where,
           o->blocking ? "blocking (the host waits for each call)"
                       : "pipelined (timed calls enqueued back to back, one wait)");
    printf("%-15s %12s %12s %7s %12s %11s %11s  %s\n", "op", "bytes", "count", "iters", "time_us",
           "algbw_GB/s", "busbw_GB/s", "check");
  }
  int failed = 0;
  for (int k = 0; k < o->nops && !failed; k++) {
    for (uint64_t s = o->min_bytes; s <= o->max_bytes; s *= 2) {
      st_coll_result r;
      if (st_coll_measure(c, ops, send, recv, (st_coll_op)o->ops[k], s, o->warmup,
                          iters_for(o, s), !o->blocking, &r)) {
        failed = 1;
        break;
      }
      if (r.bytes == 0) continue; /* too small to split over these ranks */
      if (c->rank == 0) {
        if (o->json)
          printf("{\"op\":\"%s\",\"bytes\":%zu,\"count\":%zu,\"ranks\":%d,\"iters\":%d,"
                 "\"time_us\":%.4f,\"algbw_GBs\":%.6f,\"busbw_GBs\":%.6f,\"correct\":%s,"
                 "\"backend\":\"%s\",\"timing\":\"%s\"}\n", st_coll_name(r.op), r.bytes, r.count, c->world,
                 r.iters, r.time_s * 1e6, r.algbw / 1e9, r.busbw / 1e9,
                 r.correct ? "true" : "false", c->backend,
                 o->blocking ? "blocking" : "pipelined");
        else
          printf("%-15s %12zu %12zu %7d %12.2f %11.3f %11.3f  %s\n", st_coll_name(r.op), r.bytes,
                 r.count, r.iters, r.time_s * 1e6, r.algbw / 1e9, r.busbw / 1e9,
                 r.correct ? "ok" : "WRONG");
        fflush(stdout);
      }
      if (!r.correct) {
        failed = 2;
        st_error_set("%s of %zu bytes on %d ranks returned wrong values (compared with the sum "
                     "of known per-rank patterns)", st_coll_name(r.op), r.bytes, c->world);
        break;
      }
      if (s > UINT64_MAX / 2) break;
    }
  }
  ops->free(send);
  ops->free(recv);
  return failed ? -1 : 0;
}

/* ---- bench model: the alpha-beta fit of measured collectives and the
 * projection of a ZeRO step to more nodes (collectives/scaling_model.h). */

static void model_usage(void) {
  printf("usage: shardtrain bench model --results FILE.jsonl [flags]   (one process)\n"
         "  --results FILE     `bench collectives --json` output: the points to fit\n"
         "  --params P         parameters (124475904: GPT-2 124M with the padded vocabulary)\n"
         "  --compute-ms MS    forward+backward+optimizer per GPU per step (67.7: GPT-2 124M,\n"
         "                     micro-batch 32, T=1024, bf16, one H200, docs/benchmarks.md)\n"
         "  --zero 0|1|2 (1)   --overlap F (0: share of the gradient reduction hidden by backward)\n"
         "  --gpus-per-node G (8)   --nodes LIST (1,2,4,8,16,32,64)   --algo ring|tree (ring)\n"
         "  --intra-bw GB/s (default: fitted from --results)  --intra-lat US (1, per ring hop)\n"
         "  --overhead US      per call (default: the fit's intercept)\n"
         "  --inter-bw GB/s (50: 400 Gb/s of network per GPU)  --inter-lat US (10)   --json\n");
}

typedef struct {
  const char *results;
  st_step_model sm;
  int gpn, nodes[32], nnodes, json;
  int compute_given; /* --compute-ms given: the CPU-points note is not needed */
  st_algo algo;
  double intra_bw, intra_lat, inter_bw, inter_lat, overhead; /* < 0: fitted */
} model_opts;

static const char *const k_model_flags[] = {
    "--results",   "--params",    "--compute-ms", "--zero",      "--overlap",  "--gpus-per-node",
    "--nodes",     "--algo",      "--intra-bw",   "--intra-lat", "--overhead", "--inter-bw",
    "--inter-lat", "--json",      NULL};

static int model_parse(int argc, char **argv, model_opts *o) {
  memset(o, 0, sizeof *o);
  o->sm = (st_step_model){.zero_stage = 1, .params = 124475904, .compute_s = 67.7e-3,
                          .overlap = 0, .grad_bytes = 4, .weight_bytes = 2};
  o->gpn = 8;
  o->inter_bw = 50;
  o->inter_lat = 10;
  o->intra_lat = 1;
  o->overhead = -1;
  const int dflt[] = {1, 2, 4, 8, 16, 32, 64};
  for (int k = 0; k < 7; k++) o->nodes[o->nnodes++] = dflt[k];
  for (int i = 2; i < argc; i++) {
    const char *f = argv[i];
    if (strcmp(f, "--json") == 0) {
      o->json = 1;
      continue;
    }
    if (i + 1 >= argc) return st_cli_missing_value(f, k_model_flags, "bench model");
    const char *v = argv[++i];
    char *end;
    double x = strtod(v, &end);
    int num = *v && !*end;
    if (strcmp(f, "--results") == 0) o->results = v;
    else if (strcmp(f, "--algo") == 0 && (!strcmp(v, "ring") || !strcmp(v, "tree")))
      o->algo = v[0] == 't' ? ST_ALGO_TREE : ST_ALGO_RING;
    else if (strcmp(f, "--nodes") == 0) {
      char buf[256];
      snprintf(buf, sizeof buf, "%s", v);
      o->nnodes = 0;
      for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
        int n = atoi(t);
        if (n < 1 || o->nnodes == 32) {
          st_error_set("--nodes %s: give up to 32 node counts >= 1, comma-separated", v);
          return usage_error();
        }
        o->nodes[o->nnodes++] = n;
      }
    } else if (!num || x < 0) {
      st_error_set("%s %s: give a non-negative number (see shardtrain bench model --help)", f, v);
      return usage_error();
    } else if (strcmp(f, "--params") == 0) o->sm.params = x;
    else if (strcmp(f, "--compute-ms") == 0) o->sm.compute_s = x * 1e-3, o->compute_given = 1;
    else if (strcmp(f, "--overlap") == 0 && x <= 1) o->sm.overlap = x;
    else if (strcmp(f, "--zero") == 0 && x <= 2) o->sm.zero_stage = (int)x;
    else if (strcmp(f, "--gpus-per-node") == 0 && x >= 1) o->gpn = (int)x;
    else if (strcmp(f, "--intra-bw") == 0) o->intra_bw = x;
    else if (strcmp(f, "--intra-lat") == 0) o->intra_lat = x;
    else if (strcmp(f, "--inter-bw") == 0) o->inter_bw = x;
    else if (strcmp(f, "--inter-lat") == 0) o->inter_lat = x;
    else if (strcmp(f, "--overhead") == 0) o->overhead = x;
    else {
      st_error_set("%s %s: unknown flag or value out of range (see shardtrain bench model "
                   "--help)", f, v);
      return usage_error();
    }
  }
  if (!o->results && (o->intra_bw <= 0 || o->overhead < 0)) {
    st_error_set("bench model needs --results FILE.jsonl (from bench collectives --json) to "
                 "fit, or both --intra-bw and --overhead");
    return usage_error();
  }
  return 0;
}

/* Fit op's points of the results file (the rank count of its lines). */
static int model_fit(const char *path, st_coll_op op, st_ab *ab, double *r2, int *ranks,
                     int *points) {
  FILE *f = fopen(path, "r");
  if (!f)
    return st_error_set("--results %s: %s (make it with: mpirun -np N shardtrain bench "
                        "collectives --json > %s)", path, strerror(errno), path);
  double S[256], T[256];
  int m = 0, n = 0;
  char line[1024];
  while (fgets(line, sizeof line, f) && m < 256) {
    cJSON *j = cJSON_Parse(line);
    if (!j) continue;
    const cJSON *o = cJSON_GetObjectItem(j, "op"), *b = cJSON_GetObjectItem(j, "bytes"),
                *t = cJSON_GetObjectItem(j, "time_us"), *r = cJSON_GetObjectItem(j, "ranks");
    if (cJSON_IsString(o) && cJSON_IsNumber(b) && cJSON_IsNumber(t) && cJSON_IsNumber(r) &&
        strcmp(o->valuestring, st_coll_name(op)) == 0) {
      S[m] = b->valuedouble;
      T[m] = t->valuedouble * 1e-6;
      n = r->valueint;
      m++;
    }
    cJSON_Delete(j);
  }
  fclose(f);
  if (m == 0)
    return st_error_set("--results %s has no %s lines (run bench collectives --json with "
                        "that op)", path, st_coll_name(op));
  *ranks = n;
  *points = m;
  if (st_ab_fit(op, n, S, T, m, ab, r2)) return st_error_prefix("--results %s", path);
  return 0;
}

/* 1 when the results file's lines say backend "mpi" (CPU ranks). */
static int model_backend_is_mpi(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[1024];
  int mpi = fgets(line, sizeof line, f) && strstr(line, "\"backend\":\"mpi\"") != NULL;
  fclose(f);
  return mpi;
}

static int cmd_model(int argc, char **argv) {
  model_opts o;
  if (model_parse(argc, argv, &o)) {
    return st_cli_fail(ST_EXIT_USAGE);
  }
  const st_coll_op fit_op = o.sm.zero_stage == 0 ? ST_COLL_ALL_REDUCE : ST_COLL_REDUCE_SCATTER;
  st_ab fitted = {0, 0, 0};
  double r2 = 0;
  int ranks = 0, points = 0;
  if (o.results && model_fit(o.results, fit_op, &fitted, &r2, &ranks, &points)) {
    return st_cli_fail(ST_EXIT_USAGE);
  }
  if (o.results && !o.json && model_backend_is_mpi(o.results) && !o.compute_given)
    printf("note: these points come from MPI on CPU ranks; the default compute time (%.1f ms) "
           "and cluster are GPU figures: pass --compute-ms and --params for a CPU projection\n",
           o.sm.compute_s * 1e3);
  st_cluster cl = {.gpus_per_node = o.gpn};
  cl.intra.bw = o.intra_bw > 0 ? o.intra_bw * 1e9 : fitted.bw;
  cl.intra.alpha = o.intra_lat * 1e-6;
  cl.intra.overhead = o.overhead >= 0 ? o.overhead * 1e-6 : fitted.overhead;
  cl.inter.bw = o.inter_bw * 1e9;
  cl.inter.alpha = o.inter_lat * 1e-6;
  if (!o.json) {
    if (o.results)
      printf("alpha-beta fit of %s from %s (%d points, %d ranks): %.2f us per call "
             "(overhead and latency together: one rank count cannot separate them), "
             "bandwidth %.1f GB/s per rank (R^2 %.4f, relative residuals)\n",
             st_coll_name(fit_op), o.results, points, ranks, fitted.overhead * 1e6,
             fitted.bw / 1e9, r2);
    printf("projection: ZeRO %d, P = %.0f, compute %.2f ms per GPU per step (weak scaling: "
           "the same per GPU at any size), %.0f%% of the gradient reduction hidden by "
           "backward, %d GPUs per node\n  per call %.2f us (%s); intra %.1f GB/s (%s), %.2f us "
           "per ring hop; inter %.1f GB/s per GPU, %.2f us per hop (flags)\n",
           o.sm.zero_stage, o.sm.params, o.sm.compute_s * 1e3, o.sm.overlap * 100, o.gpn,
           cl.intra.overhead * 1e6, o.overhead >= 0 ? "flag" : "fitted", cl.intra.bw / 1e9,
           o.intra_bw > 0 ? "flag" : "fitted", cl.intra.alpha * 1e6, cl.inter.bw / 1e9,
           cl.inter.alpha * 1e6);
    printf("%7s %7s %11s %11s %11s %11s\n", "nodes", "GPUs", "comm_ms", "exposed_ms", "step_ms",
           "efficiency");
  }
  for (int k = 0; k < o.nnodes; k++) {
    cl.nodes = o.nodes[k];
    st_step_projection p;
    st_project_step(&o.sm, &cl, o.algo, &p);
    if (o.json)
      printf("{\"nodes\":%d,\"gpus\":%d,\"comm_ms\":%.4f,\"exposed_ms\":%.4f,\"step_ms\":%.4f,"
             "\"efficiency\":%.5f,\"zero\":%d,\"params\":%.0f,\"compute_ms\":%.4f,"
             "\"intra_GBs\":%.3f,\"intra_us\":%.3f,\"inter_GBs\":%.3f,\"inter_us\":%.3f}\n",
             cl.nodes, cl.nodes * o.gpn, p.comm_s * 1e3, p.exposed_s * 1e3, p.step_s * 1e3,
             p.efficiency, o.sm.zero_stage, o.sm.params, o.sm.compute_s * 1e3,
             cl.intra.bw / 1e9, cl.intra.alpha * 1e6, cl.inter.bw / 1e9, cl.inter.alpha * 1e6);
    else
      printf("%7d %7d %11.3f %11.3f %11.3f %10.1f%%\n", cl.nodes, cl.nodes * o.gpn,
             p.comm_s * 1e3, p.exposed_s * 1e3, p.step_s * 1e3, 100 * p.efficiency);
  }
  if (!o.json)
    printf("assumptions: one flat ring over all GPUs, limited by its slowest hop (the "
           "network beyond one node) and its largest latency; no congestion or contention; "
           "fp32 gradients, 2-byte weights; the all-gather is not overlapped; compute does "
           "not slow down when collectives share the GPU.\n");
  return 0;
}

int st_cmd_bench(int argc, char **argv) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    if (rank == 0) {
      usage();
      printf("\n");
      model_usage();
      printf("\n");
      st_bench_train_usage();
    }
    return argc < 2 ? ST_EXIT_USAGE : 0;
  }
  if (strcmp(argv[1], "model") != 0)
    for (int i = 2; i < argc; i++)
      if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
        if (rank == 0) usage();
        return 0;
      }
  if (strcmp(argv[1], "model") == 0) {
    for (int i = 2; i < argc; i++)
      if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
        if (rank == 0) model_usage();
        return 0;
      }
    return rank == 0 ? cmd_model(argc, argv) : 0;
  }
  bench_opts o;
  int perr;
  if (strcmp(argv[1], "collectives") != 0) {
    st_error_set("unknown benchmark '%s'; available: collectives (busbw), model (alpha-beta "
                 "fit and scaling projection), train (throughput and scaling; run without "
                 "mpirun)", argv[1]);
    perr = usage_error();
  } else {
    perr = parse(argc, argv, &o);
  }
  if (perr) {
    if (rank == 0) fprintf(stderr, "shardtrain: error: %s\n", st_error_msg());
    return ST_EXIT_USAGE;
  }
  st_env env;
  if (st_env_detect(&env)) {
    if (rank == 0) fprintf(stderr, "shardtrain: error: %s\n", st_error_msg());
    return ST_EXIT_USAGE;
  }
  st_comm mpi, nccl, *dcomm = NULL;
  memset(&nccl, 0, sizeof nccl);
  if (st_comm_mpi_init(&mpi)) return ST_EXIT_ERROR;
  /* Another --max-bytes or --ops on one rank (an mpirun app context) would
   * size the collectives differently: the ranks agree on every option first,
   * in fixed-size exchanges (rank/train/config_agree.h). */
  st_agree_list agree;
  memset(&agree, 0, sizeof agree);
  const char *fix = "every rank must get the same flags";
  char oplist[128] = "";
  for (int k = 0; k < o.nops; k++)
    snprintf(oplist + strlen(oplist), sizeof oplist - strlen(oplist), "%s%s", k ? "," : "",
             st_coll_name(o.ops[k]));
  st_agree_add(&agree, "--device", ST_EXIT_USAGE, fix, "%s", o.device);
  st_agree_add(&agree, "--min-bytes", ST_EXIT_USAGE, fix, "%llu", (unsigned long long)o.min_bytes);
  st_agree_add(&agree, "--max-bytes", ST_EXIT_USAGE, fix, "%llu", (unsigned long long)o.max_bytes);
  st_agree_add(&agree, "--ops", ST_EXIT_USAGE, fix, "%s", oplist);
  st_agree_add(&agree, "--iters", ST_EXIT_USAGE, fix, "%d", o.iters);
  st_agree_add(&agree, "--warmup", ST_EXIT_USAGE, fix, "%d", o.warmup);
  st_agree_add(&agree, "--timing", ST_EXIT_USAGE, fix, "%s", o.blocking ? "blocking" : "pipelined");
  st_agree_add_float(&agree, "--nccl-timeout", ST_EXIT_USAGE, fix, o.nccl_timeout_s);
  st_agree_add(&agree, "--json", ST_EXIT_USAGE, fix, "%s", o.json ? "given" : "not given");
  if (st_agree_check(&mpi, &agree)) {
    if (rank == 0) fprintf(stderr, "shardtrain: error: %s\n", st_error_msg());
    st_comm_mpi_free(&mpi);
    return st_error_exit_code();
  }
  const st_ops *ops = NULL;
  char where[768];
  int rc = setup(&o, &env, &mpi, &nccl, &dcomm, &ops, where, sizeof where);
  int bad = rc != 0;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (!bad && rc == 0) rc = run(&o, dcomm, ops, where);
  int code = rc ? (bad ? st_error_exit_code() : ST_EXIT_COLLECTIVE) : 0;
  if (rc && st_error_msg()[0]) fprintf(stderr, "shardtrain: error (rank %d): %s\n", rank,
                                       st_error_msg());
  else if (bad && rank == 0) fprintf(stderr, "shardtrain: error: setup failed on a rank\n");
#ifdef SHARDTRAIN_HAVE_CUDA
  if (dcomm == &nccl) st_comm_nccl_free(&nccl);
#endif
  st_comm_mpi_free(&mpi);
  return code;
}
