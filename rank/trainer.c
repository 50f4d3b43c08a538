/* trainer.c - one rank's training job (see trainer.h).
 *
 * Step: zero grads -> for each micro-step: read this rank's sequences,
 * forward, backward (gradients accumulate in fp32) -> ZeRO reduction ->
 * global grad norm -> AdamW on this rank's partition -> all-gather params.
 * ZeRO 0 all-reduces whole gradients and every rank updates everything;
 * ZeRO 1 reduce-scatters, keeps Adam m and v for its 1/N partition only,
 * and all-gathers the updated parameters.
 */
#define _XOPEN_SOURCE 700
#include "rank/trainer.h"

#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "io/checkpoint.h"
#ifdef SHARDTRAIN_HAVE_CUDA
#include "collectives/collectives_nccl.h"
#include "kernels/ops_cuda.h"
#endif
#include "io/tokens.h"
#include "launcher/signals.h"
#include "rank/dataloader.h"
#include "rank/model.h"
#include "rank/optimizer.h"
#include "rank/partition.h"
#include "rank/rng.h"
#include "util/error.h"
#include "util/fsutil.h"

typedef struct {
  st_run_config *rc;
  const st_env *env;
  st_comm *comm;
  st_token_source *train, *val;
  int64_t ntrain, nval;
  int accum;               /* gradient accumulation steps */
  int64_t step_tokens;     /* global batch in tokens */
  st_model model;
  st_partition part;       /* this rank's ZeRO partition */
  st_partition opt_part;   /* range whose Adam state this rank keeps */
  const st_ops *ops;       /* the backend: its memory holds everything below but inp/tgt */
  st_comm *dcomm;          /* collectives on backend memory: comm itself, or NCCL on GPUs */
  st_comm nccl;            /* storage for the NCCL communicator when used */
  char device_name[128];   /* "cpu" or "cuda:N (NVIDIA H200)" */
  int device_index;        /* CUDA device of this rank, -1 on CPU */
  float *adam_m, *adam_v;  /* opt_part.end - opt_part.begin (+pad) elements */
  float *grad_shard;       /* ZeRO 1: reduce-scatter target, part.shard */
  int *inp, *tgt, *scratch; /* host: what the data loader fills */
  int *d_inp, *d_tgt;      /* the same in backend memory */
  st_rng rng;
  int64_t step, data_pos, tokens_seen, epoch;
  char *config_json;
  char ckpt_config[8192];  /* config of the checkpoint resumed from ("" when fresh) */
  int trained, validated;  /* did this invocation train / validate at all */
  FILE *metrics;
  double t_start, val_loss;
  double last_loss;
} trainer;

/* All ranks learn whether any failed; the lowest failing rank prints its
 * message once. Returns that rank's exit code, or 0 when none failed. */
static int agree(trainer *tr, int failed) {
  st_comm *c = tr->comm;
  int v[2] = {failed ? c->world - c->rank : 0, 0};
  c->all_reduce_int_max(c, v, 1);
  if (!v[0]) return 0;
  int first = c->world - v[0];
  int code = failed ? st_error_exit_code() : 0;
  c->broadcast(c, &code, sizeof code, first);
  if (c->rank == first) {
    if (c->world > 1) fprintf(stderr, "shardtrain: error (rank %d): %s\n", c->rank, st_error_msg());
    else fprintf(stderr, "shardtrain: error: %s\n", st_error_msg());
    fflush(stderr);
  }
  return code ? code : ST_EXIT_ERROR;
}

static int is_bin(const char *path) {
  size_t n = strlen(path);
  return n >= 4 && strcmp(path + n - 4, ".bin") == 0;
}

/* Pick CPU or CUDA, bind this rank's GPU by node-local rank, and check the
 * precision and recompute choices the backend supports. */
static int setup_backend(trainer *tr) {
  st_run_config *rc = tr->rc;
  const st_env *e = tr->env;
  (void)e; /* used only by the CUDA checks */
  int ngpu = 0;
#ifdef SHARDTRAIN_HAVE_CUDA
  ngpu = st_cuda_device_count();
#endif
  st_error_code(ST_EXIT_USAGE);
  if (strcmp(rc->device, "cuda") == 0 && ngpu == 0) {
#ifdef SHARDTRAIN_HAVE_CUDA
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    return st_error_set("--device cuda, but no CUDA device is visible on %s "
                        "(CUDA_VISIBLE_DEVICES=%s); use --device cpu, or run where a GPU is",
                        e->hostname, vis ? vis : "unset");
#else
    return st_error_set("--device cuda: this build has no CUDA backend (it was configured "
                        "without a CUDA toolkit); use --device cpu, or rebuild where nvcc is");
#endif
  }
  int cuda = strcmp(rc->device, "cuda") == 0 || (strcmp(rc->device, "auto") == 0 && ngpu > 0);
  tr->device_index = -1;
  snprintf(tr->device_name, sizeof tr->device_name, "cpu");
  tr->ops = st_ops_cpu();
  if (cuda) {
#ifdef SHARDTRAIN_HAVE_CUDA
    if (e->local_world > ngpu)
      return st_error_set("%d ranks run on node %s but it has %d visible GPU(s): launch at most "
                          "%d ranks per node (srun --ntasks-per-node=%d / mpirun -npernode %d), "
                          "or use --device cpu", e->local_world, e->hostname, ngpu, ngpu, ngpu,
                          ngpu);
    char name[96];
    tr->device_index = st_cuda_bind_device(e->local_rank, name, sizeof name);
    if (tr->device_index < 0) return -1;
    snprintf(tr->device_name, sizeof tr->device_name, "cuda:%d (%s)", tr->device_index, name);
    tr->ops = st_ops_cuda();
#endif
  }
  snprintf(rc->device, sizeof rc->device, "%s", cuda ? "cuda" : "cpu");
  if (strcmp(rc->precision, "auto") == 0) snprintf(rc->precision, sizeof rc->precision, "fp32");
  if (strcmp(rc->precision, "fp32") != 0)
    return st_error_set("--precision %s: this version computes in fp32 on %s; use --precision "
                        "fp32 (bf16/fp16 mixed precision comes with the next CUDA version)",
                        rc->precision, rc->device);
  if (strcmp(rc->recompute, "none") != 0)
    return st_error_set("--recompute %s: this version keeps all activations; use --recompute "
                        "none", rc->recompute);
  st_error_code(ST_EXIT_ERROR);
  return 0;
}

/* Collectives on backend memory: MPI on host buffers, NCCL on GPUs. */
static int setup_collectives(trainer *tr) {
  tr->dcomm = tr->comm;
  if (tr->device_index < 0) return 0;
#ifdef SHARDTRAIN_HAVE_CUDA
  st_nccl_options o = {.timeout_s = tr->rc->nccl_timeout_s, .cga_cluster_size = tr->rc->nccl_cga,
                       .min_ctas = tr->rc->nccl_min_ctas, .max_ctas = tr->rc->nccl_max_ctas,
                       .buffsize = tr->rc->nccl_buffsize};
  if (st_comm_nccl_init(&tr->nccl, &o)) return -1;
  tr->dcomm = &tr->nccl;
#endif
  return 0;
}

static int setup_data(trainer *tr) {
  st_run_config *rc = tr->rc;
  int file_vocab = 0, val_vocab = 0;
  st_error_code(ST_EXIT_DATA);
  tr->train = st_tokens_open(rc->data, "train", &file_vocab);
  if (!tr->train) return st_error_prefix("--data");
  tr->ntrain = st_tokens_count(tr->train);
  const char *val_path = rc->val_data[0] ? rc->val_data : (is_bin(rc->data) ? NULL : rc->data);
  if (val_path) {
    tr->val = st_tokens_open(val_path, "val", &val_vocab);
    if (!tr->val) return st_error_prefix(rc->val_data[0] ? "--val-data" : "--data");
    tr->nval = st_tokens_count(tr->val);
  }
  if (rc->model.vocab_size == 0)
    rc->model.vocab_size = file_vocab > 0 ? file_vocab : 50257; /* .bin: GPT-2 BPE */
  else if (file_vocab > rc->model.vocab_size)
    return st_error_set("--vocab-size %d is smaller than the vocabulary of %s (%d); drop the "
                        "flag or raise it", rc->model.vocab_size, rc->data, file_vocab);
  st_error_code(ST_EXIT_ERROR);
  return 0;
}

static int setup_batch(trainer *tr) {
  st_run_config *rc = tr->rc;
  int world = tr->comm->world, B = rc->micro_batch, T = rc->model.block_size;
  st_error_code(ST_EXIT_USAGE);
  if (rc->global_batch % (B * world) != 0) {
    int lo = rc->global_batch / (B * world) * (B * world), hi = lo + B * world;
    return st_error_set("--global-batch %d does not divide by --micro-batch %d x %d ranks = %d; "
                        "use --global-batch %d or %d, or change --micro-batch",
                        rc->global_batch, B, world, B * world, lo > 0 ? lo : hi, hi);
  }
  tr->accum = rc->global_batch / (B * world);
  tr->step_tokens = (int64_t)rc->global_batch * T;
  if (tr->ntrain < tr->step_tokens + 1) {
    st_error_code(ST_EXIT_DATA);
    return st_error_set("%s holds %lld training tokens, fewer than one global batch needs "
                        "(%d sequences x %d tokens + 1 = %lld); lower --global-batch or "
                        "--seq-len, or prepare more text", rc->data, (long long)tr->ntrain,
                        rc->global_batch, T, (long long)tr->step_tokens + 1);
  }
  if (tr->val && tr->nval < (int64_t)T + 1) {
    st_error_code(ST_EXIT_DATA);
    return st_error_set("the validation split of %s holds %lld tokens, fewer than one sequence "
                        "(%d + 1); lower --seq-len or prepare with a larger --val-fraction",
                        st_tokens_path(tr->val), (long long)tr->nval, T);
  }
  st_error_code(ST_EXIT_ERROR);
  return st_model_validate(&rc->model);
}

/* Probe that the run directory can take files before any compute is spent. */
static int setup_outdir(trainer *tr) {
  const char *out = tr->rc->out;
  if (st_mkdir_p(out))
    return st_error_prefix("--out %s is not usable (choose a directory whose parent exists and "
                           "is writable)", out);
  char probe[1100];
  snprintf(probe, sizeof probe, "%s/.write_probe_%d", out, tr->comm->rank);
  FILE *f = fopen(probe, "w");
  if (!f)
    return st_error_set("--out %s is not writable (%s); choose a directory you can write to",
                        out, strerror(errno));
  fclose(f);
  unlink(probe);
  return 0;
}

/* On several nodes the run directory must be one shared filesystem, or each
 * node would write rank files the others (and the index) cannot see. Each
 * node's first rank leaves a marker; every node's first rank looks for all
 * of them. Collective; 0 or -1 with st_error. */
static int check_outdir_shared(trainer *tr) {
  const st_env *e = tr->env;
  if (e->node_count < 2) return 0;
  char mine[1200], other[1200];
  snprintf(mine, sizeof mine, "%s/.node_probe_%d", tr->rc->out, e->node_id);
  int failed = 0;
  if (e->local_rank == 0) {
    FILE *f = fopen(mine, "w");
    if (!f || fprintf(f, "%s\n", e->hostname) < 0 || fclose(f) != 0)
      failed = st_error_set("--out %s: cannot write on node %s: %s", tr->rc->out, e->hostname,
                            strerror(errno)) != 0;
  }
  tr->comm->barrier(tr->comm);
  for (int n = 0; n < e->node_count && e->local_rank == 0 && !failed; n++) {
    snprintf(other, sizeof other, "%s/.node_probe_%d", tr->rc->out, n);
    if (!st_path_exists(other))
      failed = st_error_set("--out %s is not shared between nodes: node %d (%s) cannot see the "
                            "file node %d wrote there. Put the run directory on a filesystem "
                            "every node mounts (a cluster home or Lustre/NFS path), not /tmp or "
                            "node-local scratch", tr->rc->out, e->node_id, e->hostname, n) != 0;
  }
  tr->comm->barrier(tr->comm);
  if (e->local_rank == 0) unlink(mine);
  return failed ? -1 : 0;
}

static int setup_state(trainer *tr) {
  st_run_config *rc = tr->rc;
  st_comm *c = tr->comm;
  int B = rc->micro_batch, T = rc->model.block_size;
  const st_ops *ops = tr->ops;
  if (st_model_init(&tr->model, &rc->model, ops, B, T, c->world)) return -1;
  st_partition_make(tr->model.tab.total, c->rank, c->world, &tr->part);
  /* ZeRO 0 keeps the whole optimizer state on every rank. */
  if (rc->zero_stage == 0) st_partition_make(tr->model.tab.total, 0, 1, &tr->opt_part);
  else tr->opt_part = tr->part;
  size_t n = (size_t)(rc->zero_stage == 0 ? tr->model.padded_total : tr->part.shard);
  size_t bt = (size_t)B * T;
  tr->adam_m = ops->alloc(n * sizeof(float));
  tr->adam_v = ops->alloc(n * sizeof(float));
  tr->grad_shard = rc->zero_stage == 1 ? ops->alloc((size_t)tr->part.shard * sizeof(float)) : NULL;
  tr->d_inp = ops->alloc(bt * sizeof(int));
  tr->d_tgt = ops->alloc(bt * sizeof(int));
  tr->inp = malloc(bt * sizeof(int));
  tr->tgt = malloc(bt * sizeof(int));
  tr->scratch = malloc((bt + 1) * sizeof(int));
  if (!tr->adam_m || !tr->adam_v || (rc->zero_stage == 1 && !tr->grad_shard) || !tr->inp ||
      !tr->tgt || !tr->scratch || !tr->d_inp || !tr->d_tgt)
    return st_error_set("cannot allocate %s memory for optimizer state (%zu floats) and batches",
                        ops->name, n * 2);
  tr->config_json = st_run_config_to_json(rc);
  return 0;
}

/* Resume from a checkpoint or initialise fresh weights. */
static int setup_resume(trainer *tr, int *resumed, char *from, int cap) {
  st_run_config *rc = tr->rc;
  int found = 0;
  *resumed = 0;
  st_rng_seed(&tr->rng, rc->seed);
  if (strcmp(rc->resume, "none") == 0) {
    char latest[1200];
    snprintf(latest, sizeof latest, "%s/ckpt/latest", rc->out);
    if (st_path_exists(latest)) {
      st_error_code(ST_EXIT_USAGE);
      return st_error_set("--resume none, but %s already holds checkpoints (see %s); pass "
                          "--resume auto to continue that run, or choose a new --out so "
                          "nothing is overwritten", rc->out, latest);
    }
  } else if (st_ckpt_resolve(rc->out, rc->resume, from, cap, &found)) {
    st_error_code(ST_EXIT_CHECKPOINT);
    return st_error_prefix("--resume %s", rc->resume);
  }
  if (!found) return st_model_init_weights(&tr->model, &tr->rng);
  /* Read into host staging buffers, then hand them to the backend. */
  st_ckpt_meta meta;
  size_t np = (size_t)tr->model.padded_total, nm = (size_t)(tr->opt_part.end - tr->opt_part.begin);
  float *hp = calloc(np, sizeof(float)), *hm = calloc(nm + 1, sizeof(float)),
        *hv = calloc(nm + 1, sizeof(float));
  int rc_load = -1;
  if (!hp || !hm || !hv) st_error_set("cannot allocate host memory to load %s", from);
  else rc_load = st_ckpt_load(from, &tr->model.tab, &tr->opt_part, hp, hm, hv, &meta);
  if (!rc_load) {
    tr->ops->to_device(tr->model.params, hp, np * sizeof(float));
    tr->ops->to_device(tr->adam_m, hm, nm * sizeof(float));
    tr->ops->to_device(tr->adam_v, hv, nm * sizeof(float));
  }
  free(hp);
  free(hm);
  free(hv);
  st_error_code(ST_EXIT_CHECKPOINT);
  if (rc_load) return -1;
  st_error_code(ST_EXIT_ERROR);
  if (meta.step > rc->steps) {
    st_error_code(ST_EXIT_USAGE);
    return st_error_set("--steps %lld is below the step of the checkpoint %s (%lld); pass "
                        "--steps above %lld to train further", (long long)rc->steps, from,
                        (long long)meta.step, (long long)meta.step);
  }
  snprintf(tr->ckpt_config, sizeof tr->ckpt_config, "%s", meta.config_json);
  tr->step = meta.step;
  tr->data_pos = meta.data_position;
  tr->tokens_seen = meta.tokens_seen;
  tr->rng.s[0] = meta.rng_state[0];
  tr->rng.s[1] = meta.rng_state[1];
  *resumed = 1;
  return 0;
}

static void print_config(trainer *tr, int resumed, const char *from) {
  st_run_config *rc = tr->rc;
  const st_model_config *m = &rc->model;
  const st_env *e = tr->env;
  if (tr->comm->rank != 0) return;
  printf("shardtrain %s | train\n", SHARDTRAIN_VERSION);
  printf("  model      %s: %d layers, %d heads, width %d, seq-len %d, vocab %d (padded %d)\n",
         rc->model_name, m->n_layer, m->n_head, m->n_embd, m->block_size, m->vocab_size,
         m->padded_vocab_size);
  printf("  params     %lld (%.2f M)\n", (long long)tr->model.tab.total,
         tr->model.tab.total / 1e6);
  printf("  batch      micro-batch %d x grad-accum %d x %d ranks = global batch %d sequences "
         "x %d = %lld tokens\n", rc->micro_batch, tr->accum, tr->comm->world, rc->global_batch,
         m->block_size, (long long)tr->step_tokens);
  printf("  ranks      %d on %d node(s), launched by %s; backend %s on %s", tr->comm->world,
         e->node_count, e->launcher, tr->model.ops->name, tr->device_name);
  if (tr->device_index < 0) printf(" (%d OpenMP threads/rank)", omp_get_max_threads());
  printf("; collectives %s\n", tr->dcomm->backend);
#ifdef SHARDTRAIN_HAVE_CUDA
  if (tr->dcomm == &tr->nccl) printf("  nccl       %s\n", st_comm_nccl_describe(tr->dcomm));
#endif
  printf("  zero       stage %d: %s\n", rc->zero_stage,
         rc->zero_stage == 0 ? "all-reduce gradients, full Adam state per rank"
                             : "reduce-scatter gradients, Adam m/v for 1/N of the parameters "
                               "per rank, all-gather parameters");
  printf("  data       %s: %lld train tokens", rc->data, (long long)tr->ntrain);
  if (tr->val) printf(", %lld val tokens (%s)", (long long)tr->nval, st_tokens_path(tr->val));
  else printf(", no validation split");
  printf("\n  optimizer  AdamW lr %g (warmup %d, cosine to %g by step %lld), wd %g, betas "
         "(%g, %g), clip %g\n", rc->optim.lr, rc->optim.warmup_steps,
         rc->optim.lr * rc->optim.min_lr_frac, (long long)rc->optim.total_steps,
         rc->optim.weight_decay, rc->optim.beta1, rc->optim.beta2, rc->optim.grad_clip);
  printf("  run        %s, %lld steps, seed %llu; ", rc->out, (long long)rc->steps,
         (unsigned long long)rc->seed);
  if (resumed) {
    char diff[2048];
    printf("resumed from %s at step %lld\n", from, (long long)tr->step);
    st_run_config_diff(tr->ckpt_config, tr->config_json, diff, sizeof diff);
    if (diff[0]) printf("  notice     settings differ from the checkpoint's: %s\n", diff);
  }
  else if (strcmp(rc->resume, "none") == 0) printf("fresh start (--resume none)\n");
  else printf("fresh start (no checkpoint in %s/ckpt)\n", rc->out);
  fflush(stdout);
}

/* Mean validation loss over the first val_seqs sequences of /val, spread
 * round-robin over ranks by micro-batch. */
static int validate(trainer *tr, double *loss_out) {
  st_run_config *rc = tr->rc;
  const int T = rc->model.block_size, B = rc->micro_batch;
  int64_t nseq = (tr->nval - 1) / T;
  if (rc->val_seqs < nseq) nseq = rc->val_seqs;
  double acc[2] = {0, 0};
  int failed = 0;
  int64_t nbatches = (nseq + B - 1) / B;
  for (int64_t j = tr->comm->rank; j < nbatches && !failed; j += tr->comm->world) {
    int b = (int)(nseq - j * B < B ? nseq - j * B : B);
    if (st_data_micro_batch(tr->val, j * B * T, 0, 0, 1, b, T, rc->model.vocab_size, tr->inp,
                            tr->tgt, tr->scratch)) {
      failed = 1;
      break;
    }
    tr->ops->to_device(tr->d_inp, tr->inp, (size_t)b * T * sizeof(int));
    tr->ops->to_device(tr->d_tgt, tr->tgt, (size_t)b * T * sizeof(int));
    acc[0] += st_model_forward(&tr->model, tr->d_inp, tr->d_tgt, b, T, 0.0f);
    acc[1] += (double)b * T;
  }
  int code = agree(tr, failed);
  if (code) return code;
  tr->comm->all_reduce_double_sum(tr->comm, acc, 2);
  *loss_out = acc[1] > 0 ? acc[0] / acc[1] : 0.0;
  return 0;
}

static int save_checkpoint(trainer *tr) {
  st_ckpt_meta meta;
  memset(&meta, 0, sizeof meta);
  meta.step = tr->step;
  meta.tokens_seen = tr->tokens_seen;
  meta.data_position = tr->data_pos;
  meta.rng_state[0] = tr->rng.s[0];
  meta.rng_state[1] = tr->rng.s[1];
  meta.world_size = tr->comm->world;
  meta.zero_stage = tr->rc->zero_stage;
  snprintf(meta.config_json, sizeof meta.config_json, "%s", tr->config_json);
  /* The file holds this rank's ZeRO partition whatever the stage, so the
   * layout on disk depends only on the rank count. Staged through host
   * memory, which also takes the backend's copy off the device. */
  int64_t off = tr->part.begin - tr->opt_part.begin;
  size_t np = (size_t)tr->model.tab.total, nm = (size_t)(tr->part.end - tr->part.begin);
  float *hp = malloc(np * sizeof(float)), *hm = malloc((nm + 1) * sizeof(float)),
        *hv = malloc((nm + 1) * sizeof(float));
  int staged = hp && hm && hv;
  if (!staged)
    st_error_set("cannot allocate host memory to stage checkpoint step %lld", (long long)tr->step);
  int code = agree(tr, !staged); /* collective: no rank enters the save alone */
  if (code) {
    free(hp);
    free(hm);
    free(hv);
    return code;
  }
  tr->ops->to_host(hp, tr->model.params, np * sizeof(float));
  tr->ops->to_host(hm, tr->adam_m + off, nm * sizeof(float));
  tr->ops->to_host(hv, tr->adam_v + off, nm * sizeof(float));
  int rc = st_ckpt_save(tr->rc->out, tr->comm, &tr->model.tab, &tr->part, hp, hm, hv, &meta);
  free(hp);
  free(hm);
  free(hv);
  if (rc) st_error_code(ST_EXIT_CHECKPOINT);
  code = agree(tr, rc != 0);
  if (!code && tr->comm->rank == 0) {
    printf("checkpoint: %s/ckpt/step_%08lld (latest)\n", tr->rc->out, (long long)tr->step);
    fflush(stdout);
  }
  return code;
}

/* Fault injection for the watchdog tests: ST_FAULT_STALL="RANK:STEP:SECONDS"
 * makes that rank sleep before that step, so the other ranks sit in the
 * gradient collective and the watchdog must abort it and name it. */
static void fault_stall(trainer *tr) {
  const char *f = getenv("ST_FAULT_STALL");
  int r = -1;
  long long step = -1;
  double secs = 0;
  if (!f || sscanf(f, "%d:%lld:%lf", &r, &step, &secs) != 3) return;
  if (r != tr->comm->rank || step != tr->step + 1) return;
  fprintf(stderr, "shardtrain: ST_FAULT_STALL: rank %d sleeps %.0f s before step %lld\n", r,
          secs, step);
  struct timespec ts = {(time_t)secs, 0};
  nanosleep(&ts, NULL);
}

/* A gradient or parameter collective failed or its watchdog fired. The
 * peers may be stuck inside the same collective, so agreeing with them could
 * hang: say what happened here and now, and take the whole job down. */
static void collective_failed(trainer *tr) {
  fprintf(stderr, "shardtrain: error (rank %d): %s\n", tr->comm->rank, st_error_msg());
  fflush(stderr);
  fflush(stdout);
  MPI_Abort(MPI_COMM_WORLD, ST_EXIT_COLLECTIVE);
}

/* One optimizer step. Returns an exit code (0 = ok). */
static int train_step(trainer *tr, double *loss, double *norm, float *lr) {
  st_run_config *rc = tr->rc;
  st_comm *c = tr->comm;
  st_model *m = &tr->model;
  const int B = rc->micro_batch, T = rc->model.block_size;
  int64_t pos = st_data_step_start(tr->data_pos, tr->step_tokens, tr->ntrain);
  tr->dcomm->step = tr->comm->step = tr->step + 1;
  fault_stall(tr);
  if (pos != tr->data_pos) tr->epoch++;
  const float dloss = 1.0f / (float)((double)rc->global_batch * T);
  double loss_sum = 0.0;
  int failed = 0;
  st_model_zero_grad(m);
  for (int k = 0; k < tr->accum; k++) {
    if (st_data_micro_batch(tr->train, pos, k, c->rank, c->world, B, T, rc->model.vocab_size,
                            tr->inp, tr->tgt, tr->scratch)) {
      failed = 1;
      break;
    }
    tr->ops->to_device(tr->d_inp, tr->inp, (size_t)B * T * sizeof(int));
    tr->ops->to_device(tr->d_tgt, tr->tgt, (size_t)B * T * sizeof(int));
    loss_sum += st_model_forward(m, tr->d_inp, tr->d_tgt, B, T, dloss);
    st_model_backward(m, tr->d_inp, B, T);
  }
  /* No agreement here: a rank that failed to read still joins the gradient
   * collective, so the first thing a rank waits on each step is a collective
   * under the NCCL watchdog, and the failure is agreed on just after it. */
  const float *g;
  if (rc->zero_stage == 0) {
    if (tr->dcomm->all_reduce_sum(tr->dcomm, m->grads, (size_t)m->padded_total))
      collective_failed(tr);
    g = m->grads + tr->part.begin;
  } else {
    if (tr->dcomm->reduce_scatter_sum(tr->dcomm, m->grads, tr->grad_shard, (size_t)tr->part.shard))
      collective_failed(tr);
    g = tr->grad_shard;
  }
  /* Global norm from each rank's partition: the same arithmetic at ZeRO 0
   * and 1, so the two stages agree closely. */
  double red[3] = {m->ops->sum_squares(g, tr->part.end - tr->part.begin), loss_sum, failed};
  c->all_reduce_double_sum(c, red, 3);
  if (red[2] > 0) return agree(tr, failed);
  *norm = sqrt(red[0]);
  *loss = red[1] / ((double)rc->global_batch * T);
  *lr = st_lr_at(&rc->optim, tr->step);
  float scale = st_clip_scale(&rc->optim, *norm);
  int64_t t = tr->step + 1;
  if (rc->zero_stage == 0) {
    st_adamw_range(m->ops, &m->tab, &rc->optim, *lr, scale, t, m->params, m->grads, tr->adam_m,
                   tr->adam_v, 0, m->tab.total);
  } else {
    st_adamw_range(m->ops, &m->tab, &rc->optim, *lr, scale, t, m->params, tr->grad_shard,
                   tr->adam_m, tr->adam_v, tr->part.begin, tr->part.end);
    float *mine = m->params + (int64_t)c->rank * tr->part.shard;
    if (tr->dcomm->all_gather(tr->dcomm, mine, m->params, (size_t)tr->part.shard))
      collective_failed(tr);
  }
  tr->data_pos = pos + tr->step_tokens;
  tr->tokens_seen += tr->step_tokens;
  tr->step++;
  return 0;
}

static void fmt_time(double s, char *buf, size_t cap) {
  long t = (long)(s + 0.5);
  if (t >= 3600) snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

static void log_step(trainer *tr, double loss, double norm, float lr, double dt) {
  if (tr->comm->rank != 0) return;
  double el = MPI_Wtime() - tr->t_start;
  double tps = tr->step_tokens / dt;
  int64_t left = tr->rc->steps - tr->step;
  char e1[32], e2[32];
  fmt_time(el, e1, sizeof e1);
  fmt_time(left * dt, e2, sizeof e2);
  if (tr->step % tr->rc->log_every == 0 || tr->step == tr->rc->steps || tr->step == 1) {
    printf("step %6lld/%lld | loss %.4f | lr %.2e | norm %.3f | %.1fk tok/s | %s elapsed | "
           "ETA %s\n", (long long)tr->step, (long long)tr->rc->steps, loss, lr, norm, tps / 1e3,
           e1, e2);
    fflush(stdout);
  }
  if (tr->metrics) {
    fprintf(tr->metrics,
            "{\"step\":%lld,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%.9g,\"tokens_per_s\":%.1f,"
            "\"tokens_seen\":%lld,\"epoch\":%lld,\"elapsed_s\":%.3f}\n",
            (long long)tr->step, loss, lr, norm, tps, (long long)tr->tokens_seen,
            (long long)tr->epoch, el);
    fflush(tr->metrics);
  }
}

static int run_validation(trainer *tr) {
  if (!tr->val) return 0;
  double vl;
  int code = validate(tr, &vl);
  if (code) return code;
  tr->val_loss = vl;
  tr->validated = 1;
  if (tr->comm->rank == 0) {
    printf("val    step %lld | val loss %.4f\n", (long long)tr->step, vl);
    fflush(stdout);
    if (tr->metrics) {
      fprintf(tr->metrics, "{\"step\":%lld,\"val_loss\":%.9g}\n", (long long)tr->step, vl);
      fflush(tr->metrics);
    }
  }
  return 0;
}

static int dump_params(trainer *tr) {
  if (tr->comm->rank != 0 || !tr->rc->dump_params[0]) return 0;
  FILE *f = fopen(tr->rc->dump_params, "wb");
  if (!f) return st_error_set("--dump-params %s: %s", tr->rc->dump_params, strerror(errno));
  size_t n = (size_t)tr->model.tab.total;
  float *host = malloc(n * sizeof(float));
  int ok = host != NULL;
  if (ok) {
    tr->ops->to_host(host, tr->model.params, n * sizeof(float));
    ok = fwrite(host, sizeof(float), n, f) == n;
  }
  free(host);
  ok &= fclose(f) == 0;
  return ok ? 0 : st_error_set("--dump-params %s: write failed", tr->rc->dump_params);
}

/* At a step boundary: if any rank got SIGUSR1/SIGTERM, all ranks agree,
 * checkpoint (unless this step was just saved) and stop with
 * ST_EXIT_PREEMPTED. One tiny all-reduce per step. */
static int check_preempted(trainer *tr, int64_t last_ckpt) {
  int sig = st_signals_pending();
  tr->comm->all_reduce_int_max(tr->comm, &sig, 1);
  if (!sig) return 0;
  int code = tr->step != last_ckpt ? save_checkpoint(tr) : 0;
  if (code) return code;
  if (tr->comm->rank == 0) {
    printf("preempted: %s received; checkpoint of step %lld is latest; exiting with code %d "
           "so the job is requeued (resume with --resume auto)\n",
           sig == SIGTERM ? "SIGTERM" : "SIGUSR1", (long long)tr->step, ST_EXIT_PREEMPTED);
    fflush(stdout);
  }
  return ST_EXIT_PREEMPTED;
}

static int train_loop(trainer *tr) {
  st_run_config *rc = tr->rc;
  int code = 0;
  int64_t stop = rc->stop_after > 0 && rc->stop_after < rc->steps ? rc->stop_after : rc->steps;
  int64_t last_ckpt = tr->step;
  while (tr->step < stop) {
    double t0 = MPI_Wtime(), loss = 0, norm = 0;
    float lr = 0;
    if ((code = train_step(tr, &loss, &norm, &lr))) return code;
    tr->last_loss = loss;
    tr->trained = 1;
    log_step(tr, loss, norm, lr, MPI_Wtime() - t0);
    if (rc->val_every > 0 && tr->step % rc->val_every == 0 && tr->step < rc->steps &&
        (code = run_validation(tr)))
      return code;
    if (rc->ckpt_every > 0 && tr->step % rc->ckpt_every == 0) {
      if ((code = save_checkpoint(tr))) return code;
      last_ckpt = tr->step;
    }
    if ((code = check_preempted(tr, last_ckpt))) return code;
  }
  if (!tr->trained) {
    if (tr->comm->rank == 0)
      printf("nothing to train: the checkpoint is at step %lld and training stops at step %lld "
             "(raise --steps to continue)\n", (long long)tr->step, (long long)stop);
    return agree(tr, dump_params(tr) != 0);
  }
  if (tr->step == rc->steps && (code = run_validation(tr))) return code;
  if (tr->step != last_ckpt && (code = save_checkpoint(tr))) return code;
  return agree(tr, dump_params(tr) != 0);
}

int st_train(st_run_config *rc, const st_env *env, st_comm *comm) {
  trainer tr;
  memset(&tr, 0, sizeof tr);
  tr.rc = rc;
  tr.env = env;
  tr.comm = comm;
  int code, resumed = 0;
  char from[1200] = "";
  if ((code = agree(&tr, setup_backend(&tr) != 0))) goto done;
  if ((code = agree(&tr, setup_collectives(&tr) != 0))) goto done;
  if ((code = agree(&tr, setup_data(&tr) != 0))) goto done;
  if ((code = agree(&tr, setup_batch(&tr) != 0))) goto done;
  if ((code = agree(&tr, setup_outdir(&tr) != 0))) goto done;
  if ((code = agree(&tr, check_outdir_shared(&tr) != 0))) goto done;
  if ((code = agree(&tr, setup_state(&tr) != 0))) goto done;
  if ((code = agree(&tr, setup_resume(&tr, &resumed, from, sizeof from) != 0))) goto done;
  if (comm->rank == 0) {
    char path[1100];
    snprintf(path, sizeof path, "%s/metrics.jsonl", rc->out);
    tr.metrics = fopen(path, resumed ? "a" : "w");
  }
  print_config(&tr, resumed, from);
  st_env_print_map(env, tr.device_index < 0 ? "cpu" : "cuda");
  fflush(stdout);
  tr.t_start = MPI_Wtime();
  code = train_loop(&tr);
  if (!code && comm->rank == 0) {
    double wall = MPI_Wtime() - tr.t_start;
    char tl[32] = "n/a", vl[32] = "n/a", tlj[32] = "null", vlj[32] = "null";
    if (tr.trained) {
      snprintf(tl, sizeof tl, "%.4f", tr.last_loss);
      snprintf(tlj, sizeof tlj, "%.9g", tr.last_loss);
    }
    if (tr.validated) {
      snprintf(vl, sizeof vl, "%.4f", tr.val_loss);
      snprintf(vlj, sizeof vlj, "%.9g", tr.val_loss);
    }
    printf("done: step %lld, train loss %s, val loss %s, %.1f s\n", (long long)tr.step, tl, vl,
           wall);
    if (rc->json)
      printf("{\"step\":%lld,\"train_loss\":%s,\"val_loss\":%s,\"wall_s\":%.3f}\n",
             (long long)tr.step, tlj, vlj, wall);
    fflush(stdout);
  }
done:
  if (tr.metrics) fclose(tr.metrics);
  if (tr.train) st_tokens_close(tr.train);
  if (tr.val) st_tokens_close(tr.val);
  if (tr.model.params) st_model_free(&tr.model);
#ifdef SHARDTRAIN_HAVE_CUDA
  if (tr.dcomm == &tr.nccl) st_comm_nccl_free(&tr.nccl);
#endif
  if (tr.ops) {
    tr.ops->free(tr.adam_m);
    tr.ops->free(tr.adam_v);
    tr.ops->free(tr.grad_shard);
    tr.ops->free(tr.d_inp);
    tr.ops->free(tr.d_tgt);
  }
  free(tr.inp);
  free(tr.tgt);
  free(tr.scratch);
  free(tr.config_json);
  return code;
}
