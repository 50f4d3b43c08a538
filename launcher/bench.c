/* bench.c - the collectives benchmark command (see bench.h): sizes doubling
 * from --min-bytes to --max-bytes, each op checked once against known values
 * and then timed, printed as nccl-tests prints them (time, algbw, busbw). */
#include "launcher/bench.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/busbw.h"
#include "collectives/collectives.h"
#include "kernels/ops.h"
#include "launcher/env.h"
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
  int iters, warmup, json;
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
         "  --nccl-timeout S         watchdog per collective (600)  --json  (one object a line)\n"
         "busbw = algbw x 2(n-1)/n (all-reduce), x (n-1)/n (reduce-scatter, all-gather),\n"
         "x 1 (broadcast); algbw = S / time, S the total array size (nccl-tests' definitions).\n"
         "Data: fp32. Every size is first checked against known values on every rank.\n");
}

static int usage_error(void) {
  st_error_code(ST_EXIT_USAGE);
  return -1;
}

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
    if (i + 1 >= argc) {
      st_error_set("flag %s needs a value (see shardtrain bench --help)", f);
      return usage_error();
    }
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
    } else if (strcmp(f, "--nccl-timeout") == 0) {
      o->nccl_timeout_s = atof(v);
    } else {
      st_error_set("unknown flag '%s' for bench collectives (see shardtrain bench --help)", f);
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

/* Backend and communicator, as train picks them. */
static int setup(bench_opts *o, const st_env *env, st_comm *mpi, st_comm *nccl, st_comm **dcomm,
                 const st_ops **ops, char *where, size_t cap) {
  int ngpu = 0;
#ifdef SHARDTRAIN_HAVE_CUDA
  ngpu = st_cuda_device_count();
#endif
  int cuda = strcmp(o->device, "cuda") == 0 || (strcmp(o->device, "auto") == 0 && ngpu > 0);
  if (cuda && ngpu == 0) {
    st_error_code(ST_EXIT_USAGE);
    return st_error_set("--device cuda, but no CUDA device is visible (or this build has no "
                        "CUDA); use --device cpu");
  }
  *ops = st_ops_cpu();
  *dcomm = mpi;
  snprintf(where, cap, "mpi on cpu");
  if (!o->max_bytes) o->max_bytes = cuda ? (4ull << 30) : (64ull << 20);
#ifdef SHARDTRAIN_HAVE_CUDA
  if (cuda) {
    char name[96];
    int dev = st_cuda_bind_device(env->local_rank, name, sizeof name);
    if (dev < 0) return -1;
    st_nccl_options no = {.timeout_s = o->nccl_timeout_s, .cga_cluster_size = -1};
    if (st_comm_nccl_init(nccl, &no)) return -1;
    *dcomm = nccl;
    *ops = st_ops_cuda(ST_FP32);
    snprintf(where, cap, "nccl on cuda:%d (%s); %s", dev, name, st_comm_nccl_describe(nccl));
  }
#else
  (void)env, (void)nccl;
#endif
  return 0;
}

static int run(bench_opts *o, st_comm *c, const st_ops *ops, const char *where) {
  size_t half = st_coll_buffer_bytes(o->max_bytes) / 2;
  void *send = ops->alloc(half), *recv = ops->alloc(half);
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
    printf("shardtrain bench collectives: %d ranks, %s\nfp32 data; algbw = S/time with S the "
           "total array size; busbw = algbw x 2(n-1)/n (all-reduce), x (n-1)/n (reduce-scatter,"
           " all-gather), x 1 (broadcast)\n", c->world, where);
    printf("%-15s %12s %12s %7s %12s %11s %11s  %s\n", "op", "bytes", "count", "iters", "time_us",
           "algbw_GB/s", "busbw_GB/s", "check");
  }
  int failed = 0;
  for (int k = 0; k < o->nops && !failed; k++) {
    for (uint64_t s = o->min_bytes; s <= o->max_bytes; s *= 2) {
      st_coll_result r;
      if (st_coll_measure(c, ops, send, recv, (st_coll_op)o->ops[k], s, o->warmup,
                          iters_for(o, s), &r)) {
        failed = 1;
        break;
      }
      if (r.bytes == 0) continue; /* too small to split over these ranks */
      if (c->rank == 0) {
        if (o->json)
          printf("{\"op\":\"%s\",\"bytes\":%zu,\"count\":%zu,\"ranks\":%d,\"iters\":%d,"
                 "\"time_us\":%.4f,\"algbw_GBs\":%.6f,\"busbw_GBs\":%.6f,\"correct\":%s,"
                 "\"backend\":\"%s\"}\n", st_coll_name(r.op), r.bytes, r.count, c->world,
                 r.iters, r.time_s * 1e6, r.algbw / 1e9, r.busbw / 1e9,
                 r.correct ? "true" : "false", c->backend);
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

int st_cmd_bench(int argc, char **argv) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    if (rank == 0) usage();
    return argc < 2 ? ST_EXIT_USAGE : 0;
  }
  for (int i = 2; i < argc; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      if (rank == 0) usage();
      return 0;
    }
  bench_opts o;
  int perr;
  if (strcmp(argv[1], "collectives") != 0) {
    st_error_set("unknown benchmark '%s'; available: collectives (training throughput against "
                 "the PyTorch peer: bench/gpt2_vs_torch.sh)", argv[1]);
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
  const st_ops *ops = NULL;
  char where[768];
  int rc = setup(&o, &env, &mpi, &nccl, &dcomm, &ops, where, sizeof where);
  int bad = rc != 0;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (!bad) rc = run(&o, dcomm, ops, where);
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
