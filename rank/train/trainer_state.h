/* trainer_state.h - the state one rank's training job carries, shared by
 * the setup (train_setup.c) and the step loop (trainer.c). Internal to rank/. */
#ifndef ST_TRAINER_STATE_H
#define ST_TRAINER_STATE_H

#include <stdint.h>
#include <stdio.h>

#include "collectives/collectives.h"
#include "io/run_lock.h"
#include "io/token_shards.h"
#include "launcher/env.h"
#include "rank/train/data_feed.h"
#include "rank/train/faults.h"
#include "rank/optim/loss_scaler.h"
#include "rank/optim/offload.h"
#include "rank/memory/gpu_monitor.h"
#include "rank/memory/memory_plan.h"
#include "rank/model/model.h"
#include "rank/optim/partition.h"
#include "rank/train/resume_config.h"
#include "util/rng.h"
#include "rank/train/run_config.h"

typedef struct {
  st_run_config *rc;
  const st_env *env;
  st_comm *comm;
  st_shard_set train, val; /* io/token_shards.h; val.n == 0: no validation data */
  int64_t ntrain, nval;    /* their tokens */
  int shuffle;             /* --shuffle resolved: 1 shuffled epochs (rank/train/dataloader.h) */
  st_data_feed *feed;      /* this rank's training micro-batches, prefetched */
  st_data_order val_order; /* the validation set in file order */
  char *data_ident;        /* the train set's identity JSON, what checkpoints record */
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
  int profile;             /* ST_PROFILE_OPS set: ops timed one by one (kernels/profile.h) */
  int omp_auto;            /* OpenMP threads chosen here (OMP_NUM_THREADS unset) */
  float *adam_m, *adam_v;  /* opt_part.end - opt_part.begin (+pad) elements */
  float *master;           /* fp32 master weights of opt_part; NULL when the storage is
                            * fp32 (the model's params are then the master copy) or
                            * the master is split (master_lo) */
  /* bf16 without offload (st_plan_master_split): the master weights of
   * opt_part split in two halves (kernels/master_split.h), the high ones
   * the working weights themselves, the rests here (2 bytes a parameter
   * instead of 4); split_hi/split_lo stage ST_SPLIT_STAGE elements of
   * them on the host (rank/train/master_weights.c) */
  int16_t *master_lo;
  uint16_t *split_hi;
  int16_t *split_lo;
  int master_fp32;         /* ST_MASTER_FP32=1: no split, an fp32 master as before */
  /* --offload optimizer: master, adam_m and adam_v above point into its host
   * buffers (master also in fp32); copies of them go through
   * st_offload_state_get/put */
  st_offload offload;
  uint64_t host_avail;     /* --offload: host memory per rank checked against */
  char host_source[200];   /* and where that figure came from */
  st_loss_scaler scaler;   /* fp16 only; disabled (scale 1) otherwise */
  st_memory_plan plan;     /* this rank's memory plan, checked before allocation */
  char plan_source[320];   /* what the plan was checked against ("" when not) */
  char attn_note[512];     /* the attention that runs, for the configuration block */
  uint64_t attn_ws_per_seq;/* cuDNN attention workspace per sequence (0: ours) */
  int attn_group;          /* most sequences a cuDNN backward call takes (0: all) */
  int attn_cudnn_bwd;      /* cuDNN runs the backward: its workspace is O(T^2), settle weighs it */
  char *plan_json;         /* the plan as `shardtrain plan --json` prints it (metrics, index.h5) */
  st_arena arena;          /* every buffer of the plan's arena, carved at setup, then sealed */
  void *arena_block;       /* its one raw allocation (ops->alloc), NULL before setup makes it */
  uint64_t gpu_mem_held;   /* --enforce-gpu-mem: bytes of the GPU held above the cap */
  char phase[96];          /* where the run is, for an out-of-memory report ("step 5") */
  char auto_fit_text[6144]; /* --auto-fit: the configuration block's lines ("" without) */
  char *auto_fit_json;     /* --auto-fit: the search's choice and reasons (metrics.jsonl) */
  int64_t allocs_setup;    /* the backend's allocation count when setup ended (ops->allocations) */
  char alloc_msg[400];     /* what allocated after setup ("" while nothing has) */
  int have_dev_mem;        /* CUDA: dev_free_before/after and dev_total were read */
  uint64_t dev_free_before, dev_free_after, dev_total; /* cudaMemGetInfo around allocation */
  void *grad_shard;        /* ZeRO 1/2/3: this rank's reduced gradients, part.shard */
  st_dtype grad_dtype;     /* grad_shard's: fp32, or bf16 (--grad-dtype, st_plan_grads_bf16) */
  int grad_shard_aliased;  /* ZeRO 1 on one rank: grad_shard is model.grads itself */
  float *recv[ST_COMM_TAGS]; /* ZeRO 2/3: this rank's share of hook slot 0-3's range
                              * (the gather tags 4-5 have none) */
  size_t *bucket_counts;   /* per-rank share of the range being reduced or gathered */
  int slot_busy[ST_COMM_TAGS];      /* a reduction started on this tag is in flight */
  int64_t slot_lo[ST_COMM_TAGS];    /* its first element inside this rank's partition */
  size_t slot_mine[ST_COMM_TAGS];   /* and how many elements this rank receives */
  int *inp, *tgt, *scratch; /* host: what the data loader fills */
  int *d_inp, *d_tgt;      /* the same in backend memory */
  st_rng rng;
  int64_t step, tokens_seen, epoch; /* epoch: of the latest step's first sequence */
  st_data_pos dpos;        /* where the next step's data starts (before any wrap) */
  double data_wait;        /* seconds this step waited for its micro-batches (data_feed.h) */
  char *config_json;
  char ckpt_config[8192];  /* config of the checkpoint resumed from ("" when fresh) */
  /* What --resume names, resolved and read before the settings are used
   * (train_setup.c, setup_checkpoint): found, its step directory, its
   * metadata, and what its config changed (rank/train/resume_config.h). */
  int resume_found;
  char resume_from[1200];
  st_ckpt_meta resume_meta;
  st_resume_note resume_note;
  int trained, validated;  /* did this invocation train / validate at all */
  long long val_step;      /* the step of the latest validation (val_loss) */
  FILE *metrics;
  st_run_lock lock;        /* RUN/run.lock, held by rank 0 (io/run_lock.h); run_id on all ranks */
  st_gpu_monitor mon;      /* device/process memory readings (gpu_monitor.h) */
  st_faults faults;        /* the tests' ST_FAULT_* injections (faults.h) */
  int stats_every;         /* --gpu-stats-every, or --log-every when 0 */
  int mem_over;            /* use is above --mem-warn-fraction (warned once, until it drops) */
  st_mem_sample sample;    /* this rank's latest reading */
  int sample_max[4];       /* over ranks, KiB: rss, cudaMemGetInfo used, NVML used; temp C */
  double t_start, val_loss;
  double last_loss;
  /* --step-timing: this step's seconds by phase (compute is the rest) */
  struct { double data, compute, comm, optimizer, total; } timing;
  struct st_ckpt_writer *ckpt; /* the checkpoint saver (rank/train/ckpt_save.c) */
} trainer;

/* All ranks learn whether any failed; the lowest failing rank prints its
 * message once. Returns that rank's exit code, or 0 when none failed.
 * Collective over tr->comm. */
int st_trainer_agree(trainer *tr, int failed);

/* Everything before the first step, each stage agreed on by all ranks:
 * backend and GPU binding, collectives, data, batch arithmetic, run
 * directory (writable, shared across nodes), model and optimizer state,
 * then resume or fresh initialisation. Returns an exit code (0 = ready);
 * *resumed and from (the checkpoint directory) say what was loaded. */
int st_trainer_setup(trainer *tr, int *resumed, char *from, int cap);

/* Parts of st_trainer_setup in rank/train/memory_preflight.c, before any
 * allocation: which attention runs for the training shape (cuDNN's plans
 * are built here, their workspace is part of the plan), and the memory
 * pre-flight (budget agreed over ranks, --auto-fit, --attention auto's
 * cuDNN rule, the plan checked against the GPU and, with offload, the
 * host; exit 6 names the smallest change that fits). 0, or -1 with
 * st_error. */
int st_trainer_setup_attention(trainer *tr);
/* resume_setup.c. What --resume names, read and applied to the settings
 * before anything is sized (and --init-from's shape); 0 or -1 with
 * st_error. */
int st_trainer_setup_checkpoint(trainer *tr);
/* resume_setup.c. The weights and optimizer state: from the checkpoint
 * (*resumed = 1, from = its path, cap bytes), else from --init-from or
 * the seeded initialisation; 0 or -1 with st_error. */
int st_trainer_setup_resume(trainer *tr, int *resumed, char *from, int cap);
int st_trainer_memory_check(trainer *tr);

/* Unless OMP_NUM_THREADS is set, split the node's cores among its ranks
 * (e->local_world) for the CPU ops and the host AdamW of --offload; once. */
void st_trainer_split_host_threads(trainer *tr, const st_env *e);

/* The model and optimizer state in backend memory (tr->ops), sized by
 * tr->rc and tr->comm's rank count: what the memory plan
 * (rank/memory/memory_plan.h) counts, allocated here and nowhere else. 0, or -1
 * with st_error. Part of st_trainer_setup; separate for tests. The
 * backend's own buffers (cuBLASLt workspace, CUDA scratch) are reserved by
 * st_trainer_setup after it, at the plan's sizes (ops->reserve). */
int st_trainer_alloc_state(trainer *tr);

/* Checkpoint saves (rank/train/ckpt_save.c). */
/* At setup, after the state: the saver, and with --ckpt-async on (and a
 * thread-safe HDF5) its pinned staging buffers, 3 x this rank's partition
 * in fp32 (the plan's host_ckpt_staging). 0, or -1 with st_error. */
int st_trainer_ckpt_setup(trainer *tr);
/* Bytes of that staging. */
uint64_t st_trainer_ckpt_staging_bytes(const trainer *tr);
/* How saves run, for the configuration block. */
const char *st_trainer_ckpt_mode(const trainer *tr);
/* Save step tr->step, collectively: after the previous save is finished,
 * this rank's partition is staged on the host and checked finite (a NaN or
 * inf: exit 1, nothing written); asynchronously the rank file is then
 * written by a background thread and the save finished later (wait = 0),
 * else before returning. 0, or an exit code (every rank). */
int st_trainer_save_checkpoint(trainer *tr, int wait);
/* Collective: finish the save in flight, if any (the writer joined, the
 * index written, latest moved). 0, or an exit code. */
int st_trainer_ckpt_wait(trainer *tr);
/* Local: is this rank's writer still writing? (1 only while in flight) */
int st_trainer_ckpt_writing(const trainer *tr);
/* Collective: when no rank's writer is writing (any_writing, the maximum
 * of st_trainer_ckpt_writing over ranks, is 0), finish the save in flight. */
int st_trainer_ckpt_poll(trainer *tr, int any_writing);
/* Local, on the way out after a failure: join the writer, finish nothing
 * (the step stays a .tmp_ directory; latest is unchanged). */
void st_trainer_ckpt_abandon(trainer *tr);
/* Join and free everything (the end of st_train). */
void st_trainer_ckpt_free(trainer *tr);
/* Elements per host staging chunk of the split master (4 MiB of halves). */
#define ST_SPLIT_STAGE ((int64_t)1 << 20)
/* fp32 weights [begin, end) of the flat vector into host[0 .. end - begin):
 * the master copy in mixed precision (it holds opt_part; joined from its
 * halves when split), else the model's own fp32 params
 * (rank/train/master_weights.c). */
void st_trainer_weights_to_host(trainer *tr, float *host, int64_t begin, int64_t end);
/* The reverse: host[0 .. end - begin) becomes the master weights of
 * [begin, end) (within opt_part), or the fp32 params themselves; split, it
 * rewrites the working weights of the range too (their high halves). */
void st_trainer_master_put(trainer *tr, const float *host, int64_t begin, int64_t end);
/* x[n] rounded in place as the split master rounds its working weights
 * (half away from zero to bf16): every rank's working copy of the whole
 * vector then matches the high halves, ties included. */
void st_master_round_host(float *x, int64_t n);

/* --dump-grads (rank/train/grad_dumps.c): on a step it names (tr->step + 1,
 * not yet counted), write this rank's reduced gradients g (backend memory,
 * in gdt: fp32, or bf16 under --grad-dtype bf16, widened exactly; tr->part's
 * range, still times loss_scale) to RUN/grads/step_N (fp32) with the global
 * norm (unscaled, before clipping), the clip factor and whether the step
 * was skipped. Collective; 0, or an exit code (every rank). */
int st_trainer_dump_grads(trainer *tr, const void *g, st_dtype gdt, double norm, float clip,
                          float loss_scale, int skipped);
/* At setup, once the parameter table exists: a --dump-grads PATTERN that
 * matches no tensor is a usage error (exit 2). 0, or -1 with st_error. */
int st_trainer_dump_grads_check(const trainer *tr);

/* Flat element `at` of this rank's working weights (elements of the
 * storage dtype), the whole vector or at ZeRO 3 the shard holding it;
 * st_trainer_work_f32 for fp32 storage (rank/train/master_weights.c). */
void *st_trainer_work_at(const trainer *tr, int64_t at);
float *st_trainer_work_f32(const trainer *tr, int64_t at);

/* ZeRO 3: point the model's block-weight gathers (st_weight_gather) at
 * tr's collectives (trainer.c); st_trainer_alloc_state calls it. */
void st_trainer_bind_gather(trainer *tr);

/* The out-of-memory report against tr's plan (rank/train/oom.c) into out[cap]:
 * when ("step 5", "setup, before step 1"), the category the memory was for
 * (a plan category name, or anything else for memory outside the plan),
 * requested bytes (0: unknown), detail (what failed; may be NULL); then
 * the plan, the arena, the device's free and total memory now, the
 * checkpoint, and a suggested fix. */
void st_oom_report(const trainer *tr, const char *when, const char *category, uint64_t requested,
                   const char *detail, char *out, size_t cap);
/* Make st_oom_fatal (kernels/arena.h) report against tr's plan, using
 * tr->phase, and end the job with ST_EXIT_OOM (MPI_Abort, so no peer hangs
 * in a collective); uninstall before tr goes away. */
void st_oom_install(trainer *tr);
void st_oom_uninstall(void);

/* Rank 0 prints the configuration block. */
void st_trainer_print_config(trainer *tr, int resumed, const char *from);

#endif
