/* memory_plan.h - bytes per GPU of one training configuration, by category,
 * before anything is allocated (DESIGN.md "Memory model"; docs/memory.md).
 *
 * What the trainer allocates in backend memory is computed from the sizes
 * the allocating code uses: activations come from the model's own layout
 * code (st_model_measure_acts), weights and gradients mirror
 * st_model_init/st_model_init_bucketed, optimizer state, gradient shard,
 * ZeRO-2 receive buffers and token buffers mirror st_trainer_alloc_state.
 * tests/test_memory_plan.c checks each against the bytes those functions
 * really allocate. Backend internals are mirrored from kernels/cuda/ (the
 * 32 MiB cuBLASLt workspace; cuda_scratch's growth under the column-sum
 * requests of one step). Two categories are estimates and say so: NCCL's
 * buffers and the CUDA context (constants to calibrate on the device).
 *
 * Every buffer the trainer or the backend allocates lives in one arena
 * (kernels/arena.h), where it takes its size rounded up to 256 bytes; each
 * category counts its buffers that way, so `arena` is the arena's exact
 * size and tests/test_memory_plan.c checks it byte for byte. What is
 * outside the arena (NCCL's buffers, the CUDA context and what the driver,
 * cuBLASLt and NCCL allocate internally) is the two estimates; cudaMalloc's
 * rounding of the one arena allocation (at most 2 MiB) is absorbed by the
 * context constant.
 */
#ifndef ST_MEMORY_PLAN_H
#define ST_MEMORY_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/dtype.h"
#include "rank/model/config.h"
#include "rank/model/model.h"
#include "rank/model/lora.h"

typedef enum { ST_BACKEND_CPU = 0, ST_BACKEND_CUDA = 1 } st_backend;

/* kernels/cuda/matmul.cu: the cuBLASLt workspace, made on the first matmul. */
#define ST_PLAN_CUBLASLT_WORKSPACE ((uint64_t)32 << 20)
/* Everything on a GPU that is not a planned buffer: the CUDA context,
 * cuBLASLt and cuDNN handles, loaded kernels and cudaMalloc's rounding.
 * 1117 MiB from five one-rank runs on an H200 (CUDA 13.0, 2026-11-30;
 * docs/memory.md) less an NCCL communicator's 576 MiB, which those runs
 * made over one rank and a one-GPU run no longer makes (2026-12-05: the
 * same run peaked 576 MiB lower without it, at mb 4 and 32). */
#define ST_PLAN_CUDA_CONTEXT ((uint64_t)541 << 20)
/* An NCCL communicator's own device memory, made at its init (its kernels,
 * proxy and work buffers, before any connection's buffers): 576 MiB in a
 * one-rank train run with and without it on an H200 (NCCL 2.28,
 * 2026-12-05), 580 in tests/bench_cuda_context. The 2-rank calibration
 * below was made with it inside the 1117 MiB, so it stands. */
#define ST_PLAN_NCCL_COMM ((uint64_t)576 << 20)
/* NCCL's SIMPLE-protocol buffer per connection when NCCL_BUFFSIZE is unset. */
#define ST_PLAN_NCCL_BUFFSIZE ((uint64_t)4 << 20)
/* Channel-equivalents for the NCCL estimate when --nccl-max-ctas does not
 * cap them. Calibrated on 2 H200s over NVLink (NCCL 2.28, 2026-11-30): three
 * 2-rank runs (124M to 1.5B, ZeRO 1 and 2) used 138-139 MiB more than the
 * 16-channel figure, so 32 (NCCL opens 16-32 channels there, plus its own
 * work buffers). Beyond 2 ranks it is unmeasured: the estimate scales with
 * the connections, which errs high if the excess is a fixed cost. */
#define ST_PLAN_NCCL_CHANNELS 32
/* Channel-equivalents per CTA of the split communicator that reduces
 * gradients during backward (--nccl-overlap-ctas). 2 H200s, NCCL 2.28,
 * 2026-11-30: 124M on 2 ranks (ZeRO 1, B=32) peaked at 17.64 GiB under
 * nvidia-smi against 17.61 GiB planned with 1 per CTA; 2, as for the main
 * communicator, closes the gap. */
#define ST_PLAN_NCCL_OVERLAP_FACTOR 2

typedef struct {
  st_model_config model;  /* validated (padded_vocab_size set); block_size: rows of wpe */
  int micro_batch;        /* B, sequences per rank per micro-step */
  /* micro-steps per optimizer step (gradient accumulation). ZeRO 2/3 keep
   * receive buffers only when it is not 1 (0: not known, so kept) */
  int accum;
  int seq_len;            /* T, the training sequence length (<= block_size); 0 = block_size */
  int world;              /* N ranks */
  int zero_stage;         /* 0, 1, 2 or 3 */
  st_dtype dtype;         /* storage dtype: fp32, or bf16/fp16 with fp32 master weights */
  st_recompute recompute;
  st_backend backend;
  /* cuDNN attention workspace per sequence of a backward call (bytes),
   * measured by the backend at setup (st_cuda_attention_select) and scaled
   * by the sequences of one call (st_plan_attention_workspace), which it
   * grows with linearly; 0 with our kernels. */
  uint64_t attn_workspace_per_seq;
  /* the most sequences one cuDNN backward call takes (--attention auto
   * under a budget, st_plan_attention_groups); 0: the whole micro-batch */
  int attn_group;
  int64_t nccl_buffsize;  /* NCCL_BUFFSIZE in bytes; 0 = NCCL's default 4 MiB */
  int nccl_channels;      /* channels for the NCCL estimate; 0 = ST_PLAN_NCCL_CHANNELS */
  int nccl_overlap_channels; /* the overlap communicator's (--nccl-overlap-ctas); 0 = none */
  /* 1 when one rank makes an NCCL communicator anyway (ST_NCCL_ONE_RANK=1);
   * more than one rank always does */
  int nccl_one_rank;
  /* 1: bf16 keeps an fp32 master copy instead of the split one
   * (ST_MASTER_FP32=1; st_plan_master_split) */
  int master_fp32;
  uint64_t gpu_mem;       /* memory the plan is checked against; 0 = not checked */
  double headroom_pct;    /* percent of gpu_mem kept free */
  /* --offload optimizer (rank/optim/offload.h): master weights, Adam m and
   * v in host memory, and the staging buffers of the chunked copies, each
   * offload_chunk elements (0 = ST_OFFLOAD_CHUNK_ELEMS). */
  int offload;
  int64_t offload_chunk;
  /* --ckpt-async on: pinned host staging of this rank's checkpoint share
   * (rank/train/ckpt_save.c) */
  int ckpt_async;
  /* --lora (rank/model/lora.h), resolved; rank 0: full training. The base
   * is then frozen: its working weights only (no gradients, master or
   * Adam state), and params/grads/master/Adam below count the adapters. */
  st_lora_config lora;
  /* --grad-dtype bf16: the reduced gradient shard in bf16 where
   * st_plan_grads_bf16 says it applies */
  int grad_bf16;
} st_plan_input;

/* ZeRO stages the planner knows, 0 .. ST_PLAN_ZERO_STAGES - 1. */
#define ST_PLAN_ZERO_STAGES 4

/* Elements per chunk of the offloaded optimizer step: 64 MiB of fp32
 * gradients. Large enough that a copy runs near PCIe/C2C bandwidth and the
 * per-chunk costs (a copy launch, an event wait, an OpenMP fork) vanish;
 * small enough that the staging buffers (2 chunks of gradients, 2 of
 * working weights: 192 MiB in bf16) are small next to the state. */
#define ST_OFFLOAD_CHUNK_ELEMS ((int64_t)16 << 20)

/* T of a plan input: seq_len, or the model's positions when it is 0. */
static inline int st_plan_seq_len(const st_plan_input *in) {
  return in->seq_len > 0 ? in->seq_len : in->model.block_size;
}

typedef struct {
  int64_t params;         /* parameters (st_param_table_build's total): a tied embedding
                           * once, an untied head apart, padded rows included */
  int64_t padded_params;  /* params rounded up to a multiple of world */
  int64_t shard;          /* padded_params / world: one rank's ZeRO partition */
  /* LoRA: params above are the adapters (what trains); base_params the
   * frozen base's, whose working weights are weights_base, the adapters'
   * lora_weights (weights is their sum); 0 without LoRA. QLoRA
   * (lora.nf4_base): weights_base holds only the tensors that stay in the
   * working dtype; weights_nf4 the NF4 arrays of every block's four
   * projection weights (st_nf4_bytes each, one buffer), nf4_scratch the one
   * dequantisation buffer of the largest of them plus nf4_quantize's
   * workspace (st_model_nf4_bytes); both are part of weights. */
  int64_t base_params;
  uint64_t weights_base, lora_weights, weights_nf4, nf4_scratch;
  /* model (st_model_init / st_model_init_bucketed) */
  /* Each category: its buffers' bytes, each rounded up to 256 (the arena's
   * alignment). */
  uint64_t weights;       /* working weights, storage dtype: padded_params (ZeRO 0-2), or
                           * (ZeRO 3) weights_shard + weights_head + weights_blocks */
  uint64_t weights_shard; /* ZeRO 3: this rank's shard of the flat vector, shard elements */
  uint64_t weights_head;  /* ZeRO 3: wte, wpe, ln_f, lm_head whole on every rank */
  uint64_t weights_blocks;/* ZeRO 3: two one-block buffers the blocks are gathered into */
  uint64_t grads;         /* fp32 gradients: grads_full, or (ZeRO 2/3) head + buckets + recv */
  uint64_t grads_full;    /* ZeRO 0/1: the whole padded vector */
  uint64_t grads_head;    /* ZeRO 2: the gradients outside the blocks (wte, wpe, ln_f, lm_head) */
  uint64_t grads_buckets; /* ZeRO 2: two one-block buckets (block_numel + 1 floats each); one
                           * on one rank */
  uint64_t grads_recv;    /* ZeRO 2: the four per-slot receive buffers of the trainer */
  st_act_bytes acts;      /* activations; acts.total is the category */
  /* optimizer (st_trainer_alloc_state) */
  uint64_t grad_shard;    /* ZeRO >= 1: this rank's reduced gradients, shard fp32 (bf16:
                           * st_plan_grads_bf16) */
  uint64_t master;        /* bf16/fp16: fp32 master weights (ZeRO 0 whole, else the shard) */
  uint64_t adam_m, adam_v;/* fp32 (ZeRO 0 whole, else the shard) */
  uint64_t tokens;        /* input and target ids in backend memory, 2 x B x T int32 */
  /* backend internals (CUDA) */
  uint64_t cublaslt;      /* cuBLASLt workspace */
  uint64_t scratch;       /* cuda_scratch after one step (column-sum partials) */
  uint64_t attn_workspace;/* cuDNN attention workspace (st_plan_attention_workspace) */
  uint64_t nccl;          /* ESTIMATE: NCCL connection buffers */
  uint64_t context;       /* ESTIMATE: CUDA context */
  uint64_t arena;         /* the arena: every category above but nccl and context */
  uint64_t total;         /* arena + nccl + context */
  /* host memory (--offload optimizer; all 0 without): this rank's pinned
   * buffers (ops->host_alloc), each rounded up to 256 like the arena's */
  uint64_t host_master;   /* fp32 master weights (ZeRO 0 whole, else the shard) */
  uint64_t host_adam_m, host_adam_v;
  uint64_t host_grad_staging; /* 2 chunks of fp32 gradients copied in */
  uint64_t host_work_staging; /* 2 chunks of updated working weights copied out */
  uint64_t host_total;    /* their sum */
  /* --ckpt-async on: fp32 weights, Adam m and v of this rank's partition,
   * staged for the background writer (not in host_total, which is the
   * offloaded optimizer's) */
  uint64_t host_ckpt_staging;
  /* against gpu_mem */
  uint64_t capped;        /* the bytes gpu_mem caps: total, and on the CPU backend host_total
                           * too (--offload optimizer there moves the state into the same
                           * memory, the rank's own) */
  uint64_t usable;        /* gpu_mem less the headroom */
  int64_t spare;          /* usable - capped; negative when it does not fit */
  int fits;               /* 1 or 0; -1 when gpu_mem is 0 */
} st_memory_plan;

/* Plan one configuration. Pure arithmetic; 0, or -1 with st_error naming
 * the flag when the input is out of range. */
int st_memory_plan_make(const st_plan_input *in, st_memory_plan *out);

/* The split --offload makes, for a configuration search: the host bytes
 * (p->host_total) and the device bytes (p->total) of in with in->offload
 * as given. Pure arithmetic; 0, or -1 with st_error as st_memory_plan_make. */
int st_memory_plan_offload_split(const st_plan_input *in, uint64_t *host_bytes,
                                 uint64_t *device_bytes);

/* Elements per offload chunk of in (offload_chunk, else the default). */
static inline int64_t st_plan_offload_chunk(const st_plan_input *in) {
  return in->offload_chunk > 0 ? in->offload_chunk : ST_OFFLOAD_CHUNK_ELEMS;
}

/* Bytes of one category by its JSON name ("weights", "grads_recv",
 * "activations", "tokens", "cublaslt_workspace", "cuda_scratch", "arena",
 * "total", ...: the names st_memory_plan_cjson uses, which are also the
 * category names the trainer's buffers carry in the arena). *known is 0 (and
 * the result 0) for a name that is no category. */
uint64_t st_memory_plan_category(const st_memory_plan *p, const char *name, int *known);

/* NCCL's buffers for one rank, the estimate the plan uses: channels x
 * min(world - 1, 2) receive connections (a ring's, plus a tree's beyond two
 * ranks) x (SIMPLE NCCL_BUFFSIZE + LL 512 KiB + LL128 4,915,200 bytes, the
 * sizes in NCCL's device.h). 0 on one rank (no connection is made). */
uint64_t st_plan_nccl_bytes(int world, int64_t buffsize, int channels);
/* 1 when the fp32 master weights are kept split (kernels/master_split.h):
 * bf16 storage with the optimizer on the device, unless master_fp32 (the
 * environment's ST_MASTER_FP32=1: an fp32 copy, for comparison). Their
 * rests then take 2 bytes a parameter (the high halves are the working
 * weights), not 4. */
int st_plan_master_split(st_dtype dtype, int offload, int master_fp32);
/* 1 when the reduced gradient shard is kept in bf16 (--grad-dtype bf16):
 * asked for (grad_bf16), ZeRO 2 or 3 and one micro-step a step (accum 1).
 * Backward still writes fp32 (the buckets and head gradients); each range
 * is rounded once to nearest even as it is reduced, so the shard takes 2
 * bytes a parameter, not 4, and AdamW and the norm read bf16. Where the
 * shard accumulates micro-steps (accum > 1) or is the whole vector (ZeRO
 * 0/1) the gradients stay fp32: bf16 sums would lose their low bits, and
 * ZeRO 0/1 keep the fp32 vector anyway. */
int st_plan_grads_bf16(const st_plan_input *in);
/* ST_MASTER_FP32 from the environment into *on: unset, "" or "0" 0, "1" 1;
 * anything else -1 with a one-line message naming it (ST_EXIT_USAGE). train
 * and plan both read it here. */
int st_master_fp32_env(int *on);
/* Device memory a CUDA rank makes at setup outside the planned buffers and
 * the NCCL connections' (the plan's "CUDA context" row), bytes: the
 * context, plus a communicator's own when one is made (world > 1, or
 * nccl_one_rank). Free memory read after setup already lacks it. */
uint64_t st_plan_context_bytes(int world, int nccl_one_rank);

/* The size cuda_scratch (kernels/cuda/memory.cu) has grown to after one
 * training step of B*T = rows rows of model c: its requests in backward's
 * order (ln_f's norm, then per block the mlp.proj, mlp.fc, ln_2, attn.proj,
 * attn.qkv and ln_1 column sums of st_colsum_chunks(rows) x width floats:
 * 2C for a LayerNorm's weight and bias, C for an RMSNorm's weight, a bias's
 * width only where the bias exists), then sum_squares' 512 doubles, under
 * its growth rule max(2x, request, 1 MiB). */
uint64_t st_plan_cuda_scratch(int64_t rows, const st_model_config *c);

/* "24GiB", "80GB", "81559MiB", "24G" (binary, as in Slurm), "1.5TiB",
 * "4096B" (util/bytes.h); a unit is required and the size must be > 0.
 * 0, or -1 with st_error naming flag (exit class ST_EXIT_USAGE). */
int st_plan_parse_size(const char *flag, const char *text, uint64_t *out);

/* The policies' names, indexed by st_recompute, NULL-terminated:
 * none, act, selective, full. */
extern const char *const st_recompute_names[ST_RECOMPUTE_POLICIES + 1];

/* none | act | selective | full (anything else: none). */
st_recompute st_recompute_parse(const char *name);
const char *st_recompute_name(st_recompute r);

/* The plan as the JSON object `shardtrain plan --json` prints: model,
 * config, bytes (every category; "total"), activations, gpu (checked
 * against source when p->fits >= 0). model_name and global_batch are the
 * run's flags, accum its gradient accumulation. st_memory_plan_cjson
 * returns a cJSON object (cJSON_Delete it); st_memory_plan_json the same
 * as one unformatted string (free() it). NULL when out of memory. */
struct cJSON *st_memory_plan_cjson(const char *model_name, int global_batch, int accum,
                                   const st_plan_input *in, const st_memory_plan *p,
                                   const char *source);
char *st_memory_plan_json(const char *model_name, int global_batch, int accum,
                          const st_plan_input *in, const st_memory_plan *p, const char *source);

/* Free and total memory of the current CUDA device and its name
 * ("cuda:0 (NVIDIA H200)"). -1 with st_error when the build has no CUDA or
 * no device is visible. */
int st_plan_device_memory(uint64_t *free_bytes, uint64_t *total_bytes, char *name, size_t cap);

/* cuDNN's fused attention workspace per sequence when train cannot be
 * asked (`plan`): its deterministic backward keeps dP, NH x T64^2 bf16/fp16
 * values with T64 = T rounded up to 64, plus NH x T fp32 row sums (NH the
 * query heads: scores are per query head with GQA too). The formula matches
 * what cuDNN 9.14 reported on an H200 for GPT-2 (docs/memory.md). With
 * fewer KV heads than query heads, 2 x NH x T x head_dim fp32 more for dK
 * and dV before the group sum: an assumption until measured. train uses
 * cuDNN's own figure. Bytes. */
uint64_t st_plan_cudnn_attention_per_seq(int T, const st_model_config *c);

/* cuDNN's attention workspace (bytes) for a micro-batch of B sequences,
 * per_seq bytes a sequence: the backward runs on groups of
 * st_attention_cudnn_group(B, group_cap) sequences
 * (kernels/attention_choice.h) and one group's workspace serves them all.
 * 0 when per_seq is 0 (our attention). */
uint64_t st_plan_attention_workspace(uint64_t per_seq, int B, int group_cap);

#endif
