/* oom.c - an out-of-memory reported against the memory plan (docs/memory.md,
 * "Out of memory anyway"): what was asked for and for which category, what
 * the plan holds for it, what the device has free, where the run was, and
 * what to change. Used at setup, where the arena cannot be made or a
 * planned buffer does not fit it (the ranks agree and exit 7), and inside
 * the step loop, where the failure cannot be returned (st_oom_fatal's
 * handler: print and end the job with 7). Neither path writes anything. */
#define _XOPEN_SOURCE 700
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#ifdef SHARDTRAIN_HAVE_CUDA
#include "kernels/ops_cuda.h"
#endif
#include "rank/train/trainer_state.h"
#include "util/bytes.h"
#include "util/error.h"

/* Free and total memory where this rank's buffers live: the GPU's
 * (cudaMemGetInfo) or the host's (/proc/meminfo MemAvailable, MemTotal).
 * 0, or -1 when it cannot be read. */
static int memory_now(const trainer *tr, uint64_t *fr, uint64_t *tot, const char **source) {
#ifdef SHARDTRAIN_HAVE_CUDA
  if (tr->device_index >= 0) {
    size_t f = 0, t = 0;
    *source = "cudaMemGetInfo";
    if (st_cuda_mem_info(&f, &t)) return -1;
    *fr = f;
    *tot = t;
    return 0;
  }
#endif
  *source = "/proc/meminfo MemAvailable, MemTotal";
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  unsigned long long kb;
  int have = 0;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) *fr = kb * 1024ULL, have |= 1;
    if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) *tot = kb * 1024ULL, have |= 2;
  }
  fclose(f);
  return have == 3 ? 0 : -1;
}

void st_oom_report(const trainer *tr, const char *when, const char *category, uint64_t requested,
                   const char *detail, char *out, size_t cap) {
  const st_memory_plan *p = &tr->plan;
  const st_run_config *rc = tr->rc;
  char a[32], b[32], c[32], d[32], shape[256];
  size_t n = 0;
#define PUT(...)                                                   \
  do {                                                             \
    int k_ = snprintf(out + n, n < cap ? cap - n : 0, __VA_ARGS__); \
    if (k_ > 0) n += (size_t)k_;                                   \
  } while (0)
  PUT("out of memory at run time despite the plan, during %s (exit code %d)", when, ST_EXIT_OOM);
  int known = 0;
  const uint64_t planned = st_memory_plan_category(p, category, &known);
  PUT("\n  requested   %s", requested ? st_format_bytes(requested, a, sizeof a) : "unknown");
  if (requested) PUT(" (%llu bytes)", (unsigned long long)requested);
  if (known) PUT(" for %s", category);
  else PUT(" outside the plan (%s)", category);
  if (detail && detail[0]) PUT(": %s", detail);
  if (known)
    PUT("\n  planned     %s for %s, of %s per %s in all", st_format_bytes(planned, a, sizeof a),
        category, st_format_bytes(p->total, b, sizeof b),
        tr->device_index >= 0 ? "GPU" : "rank");
  else
    PUT("\n  planned     nothing for this request; %s per %s in all",
        st_format_bytes(p->total, b, sizeof b), tr->device_index >= 0 ? "GPU" : "rank");
  PUT(": the arena %s (one allocation: parameters, gradients, optimizer state, activations, "
      "tokens, workspace and scratch) + NCCL %s + CUDA context %s, both estimates and outside "
      "the arena", st_format_bytes(p->arena, a, sizeof a), st_format_bytes(p->nccl, c, sizeof c),
      st_format_bytes(p->context, d, sizeof d));
  if (tr->arena.base) {
    PUT("\n  arena       %s made, %s carved", st_format_bytes(tr->arena.size, a, sizeof a),
        st_format_bytes(tr->arena.used, b, sizeof b));
    if (tr->arena.size != p->arena)
      PUT(" (made %llu bytes short by ST_FAULT_ARENA_SHORT)",
          (unsigned long long)(p->arena - tr->arena.size));
    for (int i = 0; i < tr->arena.ncat; i++)
      PUT("%s%s %s", i ? ", " : ": ", tr->arena.cat[i].name,
          st_format_bytes(tr->arena.cat[i].bytes, a, sizeof a));
  }
  if (tr->offload.on)
    PUT("\n  host        --offload optimizer: %s of host memory for master weights, Adam m "
        "and v and staging, outside the plan above (%s available per rank at setup)",
        st_format_bytes(tr->offload.host_bytes, a, sizeof a),
        st_format_bytes(tr->host_avail, b, sizeof b));
  uint64_t fr = 0, tot = 0;
  const char *src = "";
  if (memory_now(tr, &fr, &tot, &src) == 0)
    PUT("\n  memory      %s free of %s on %s now (%s)", st_format_bytes(fr, a, sizeof a),
        st_format_bytes(tot, b, sizeof b), tr->device_name, src);
  else PUT("\n  memory      free memory on %s cannot be read", tr->device_name);
  char latest[1200], step_dir[64] = "";
  snprintf(latest, sizeof latest, "%s/ckpt/latest", rc->out);
  FILE *lf = fopen(latest, "r");
  if (lf) {
    if (!fgets(step_dir, sizeof step_dir, lf)) step_dir[0] = 0;
    step_dir[strcspn(step_dir, "\r\n")] = 0;
    fclose(lf);
  }
  if (step_dir[0])
    PUT("\n  checkpoint  none written on this path: %s still names %s, untouched", latest,
        step_dir);
  else PUT("\n  checkpoint  none written on this path (%s has no checkpoint yet)", rc->out);
  const char *dev = tr->device_index >= 0 ? "cuda" : "cpu";
  /* What a new run would have: free now, plus this run's own arena, plus
   * (on CUDA) the context the plan counts but that free memory excludes. */
  const uint64_t room = fr ? fr + tr->arena.size + (tr->device_index >= 0 ? p->context : 0) : tot;
  PUT("\n  fix         something outside the plan took memory (another process on the device, "
      "or the runtime's own buffers beyond the estimates). Leave more room with a larger "
      "--headroom (now %g%%), or find a configuration with a smaller plan: shardtrain plan "
      "%s --seq-len %d --global-batch %d "
      "--micro-batch %d --ranks %d --zero %d --precision %s --device %s%s --gpu-mem %lluMiB "
      "--fit (docs/memory.md, \"Out of memory anyway\")", rc->headroom_pct,
      st_model_flags(&rc->model, shape, sizeof shape), rc->seq_len,
      rc->global_batch, rc->micro_batch, tr->comm->world, rc->zero_stage, rc->precision, dev,
      rc->offload ? " --offload optimizer" : "", (unsigned long long)(room >> 20));
#undef PUT
}

/* st_oom_fatal's handler while a trainer runs. A rank out of memory inside
 * a step cannot agree with its peers, which may be waiting in a collective
 * for it: like a failed collective, it says what happened here and takes
 * the whole job down, with the code of its own. */
static void oom_abort(void *ctx, const char *category, size_t requested, const char *detail) {
  trainer *tr = ctx;
  static char msg[4096];
  st_oom_report(tr, tr->phase[0] ? tr->phase : "setup", category, requested, detail, msg,
                sizeof msg);
  fprintf(stderr, "shardtrain: error (rank %d): %s\n", tr->comm->rank, msg);
  fflush(stderr);
  fflush(stdout);
  st_run_lock_release(&tr->lock); /* MPI_Abort skips st_train's exit path */
  MPI_Abort(MPI_COMM_WORLD, ST_EXIT_OOM);
}

void st_oom_install(trainer *tr) { st_oom_set_handler(oom_abort, tr); }
void st_oom_uninstall(void) { st_oom_set_handler(NULL, NULL); }
