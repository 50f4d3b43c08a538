/* memory_plan.c - per-GPU memory of a training configuration (see
 * memory_plan.h and docs/memory.md for the derivation; the --fit search is
 * in memory_fit.c). */
#include "rank/memory/memory_plan.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SHARDTRAIN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/ops_cuda.h"
#endif
#include "kernels/arena.h"
#include "kernels/attention_choice.h"
#include "kernels/colsum.h"
#include "rank/model/params.h"
#include "util/bytes.h"
#include "util/envparse.h"
#include "util/error.h"

/* Indexed by st_recompute: the one list the parser, the printer and the
 * CLI's allowed values read. */
const char *const st_recompute_names[ST_RECOMPUTE_POLICIES + 1] = {"none", "act", "selective",
                                                                   "full", NULL};

st_recompute st_recompute_parse(const char *name) {
  for (int r = 0; r < ST_RECOMPUTE_POLICIES; r++)
    if (strcmp(name, st_recompute_names[r]) == 0) return (st_recompute)r;
  return ST_RECOMPUTE_NONE;
}

const char *st_recompute_name(st_recompute r) {
  return (int)r >= 0 && (int)r < ST_RECOMPUTE_POLICIES ? st_recompute_names[r] : "none";
}

/* NCCL's device.h: LL = NCCL_LL_LINES_PER_THREAD (8) x NCCL_LL_MAX_NTHREADS
 * (512) x NCCL_STEPS (8) x sizeof(ncclLLFifoLine) (16); LL128 =
 * NCCL_LL128_ELEMS_PER_THREAD (120) x NCCL_LL128_MAX_NTHREADS (640) x
 * NCCL_STEPS (8) x sizeof(uint64_t). */
#define NCCL_LL_BYTES ((uint64_t)8 * 512 * 8 * 16)
#define NCCL_LL128_BYTES ((uint64_t)120 * 640 * 8 * 8)

uint64_t st_plan_nccl_bytes(int world, int64_t buffsize, int channels) {
  if (world < 2) return 0;
  const uint64_t simple = buffsize > 0 ? (uint64_t)buffsize : ST_PLAN_NCCL_BUFFSIZE;
  const uint64_t peers = world - 1 < 2 ? (uint64_t)(world - 1) : 2;
  const uint64_t ch = channels > 0 ? (uint64_t)channels : ST_PLAN_NCCL_CHANNELS;
  return ch * peers * (simple + NCCL_LL_BYTES + NCCL_LL128_BYTES);
}

int st_plan_master_split(st_dtype dtype, int offload, int master_fp32) {
  return dtype == ST_BF16 && !offload && !master_fp32;
}

int st_plan_grads_bf16(const st_plan_input *in) {
  return in->grad_bf16 && in->zero_stage >= 2 && in->accum == 1;
}

int st_master_fp32_env(int *on) {
  const char *s = getenv("ST_MASTER_FP32");
  *on = st_envparse_switch(s);
  if (*on >= 0) return 0;
  *on = 0;
  return st_error_setc(ST_EXIT_USAGE, "ST_MASTER_FP32='%.40s': use 1 (bf16 keeps an fp32 master "
                       "copy) or 0 (the master is split into the working weights and 2-byte "
                       "rests: the default)", s);
}

uint64_t st_plan_context_bytes(int world, int nccl_one_rank) {
  return ST_PLAN_CUDA_CONTEXT + (world > 1 || nccl_one_rank ? ST_PLAN_NCCL_COMM : 0);
}

uint64_t st_plan_cuda_scratch(int64_t rows, const st_model_config *c) {
  const uint64_t part = (uint64_t)st_colsum_chunks((int)rows) * sizeof(float);
  const int64_t C = c->n_embd;
  /* LayerNorm's backward sums dw and db per column, RMSNorm's dw only */
  const int64_t norm = c->norm == ST_NORM_RMSNORM ? C : 2 * C;
  /* matmul backward sums a bias's column only when the bias exists */
  const int64_t F = (int64_t)(c->ffn_dim > 0 ? c->ffn_dim : 4 * c->n_embd) *
                    (c->mlp == ST_MLP_SWIGLU ? 2 : 1);
  const int64_t NKV = c->n_kv_head > 0 ? c->n_kv_head : c->n_head;
  const int64_t qkv = (c->n_head + 2 * NKV) * (C / c->n_head);
  const int mlp_b = !(c->no_bias & ST_NO_BIAS_MLP), proj_b = !(c->no_bias & ST_NO_BIAS_PROJ),
            qkv_b = !(c->no_bias & ST_NO_BIAS_QKV);
  uint64_t s = st_scratch_grow(0, part * norm); /* ln_f */
  /* One block's requests in backward's order (mlp.proj, mlp.fc, ln_2,
   * attn.proj, attn.qkv, ln_1); later blocks repeat them and cannot grow it. */
  const int64_t widths[] = {mlp_b ? C : 0, mlp_b ? F : 0, norm, proj_b ? C : 0,
                            qkv_b ? qkv : 0, norm};
  for (int i = 0; i < 6; i++)
    if (widths[i] > 0) s = st_scratch_grow(s, part * widths[i]);
  return st_scratch_grow(s, 512 * sizeof(double)); /* sum_squares (kernels/cuda/adamw.cu) */
}

/* The parameter table's split (rank/model/params.c builds it; the plan
 * counts from it, so whatever the description holds is counted as the
 * model allocates it): elements before block 0 (wte, wpe), of one block,
 * and after the last (ln_f, an untied lm_head). */
static int table_split(const st_model_config *c, int64_t *total, int64_t *front, int64_t *block,
                       int64_t *tail) {
  st_param_table tab;
  if (st_param_table_build(c, &tab)) {
    st_error_code(ST_EXIT_ERROR);
    return -1;
  }
  *front = -1;
  *block = 0;
  for (int i = 0; i < tab.n; i++)
    if (strncmp(tab.t[i].name, "h.0.", 4) == 0) {
      if (*front < 0) *front = tab.t[i].offset;
      *block += tab.t[i].numel;
    }
  if (*front < 0) *front = tab.total; /* no block: cannot happen after validation */
  *total = tab.total;
  *tail = tab.total - *front - (int64_t)c->n_layer * *block;
  st_param_table_free(&tab);
  return 0;
}

int st_memory_plan_make(const st_plan_input *in, st_memory_plan *p) {
  memset(p, 0, sizeof *p);
  const st_model_config *c = &in->model;
  const int U = ST_EXIT_USAGE;
  if (c->n_layer < 1 || c->n_head < 1 || c->n_embd < 1 || c->block_size < 1 ||
      c->padded_vocab_size < c->vocab_size || c->padded_vocab_size < 1)
    return st_error_setc(U, "memory plan: the model shape is not set (check --model or "
                            "--layers/--heads/--dim, --seq-len, --vocab-size)");
  if (in->micro_batch < 1)
    return st_error_setc(U, "--micro-batch must be >= 1, got %d", in->micro_batch);
  if (in->world < 1) return st_error_setc(U, "--ranks must be >= 1, got %d", in->world);
  if (in->zero_stage < 0 || in->zero_stage >= ST_PLAN_ZERO_STAGES)
    return st_error_setc(U, "--zero must be 0, 1, 2 or 3, got %d", in->zero_stage);
  const int seq = st_plan_seq_len(in);
  if (seq > c->block_size)
    return st_error_setc(U, "--seq-len %d exceeds the model's %d positions (rows of wpe)", seq,
                         c->block_size);
  if ((int64_t)in->micro_batch * seq > INT_MAX)
    return st_error_setc(U, "--micro-batch %d x --seq-len %d = %lld rows exceeds the ops' "
                            "32-bit row count (%d); lower either", in->micro_batch,
                         seq, (long long)in->micro_batch * seq, INT_MAX);
  if (in->backend == ST_BACKEND_CPU && in->dtype != ST_FP32)
    return st_error_setc(U, "--precision %s: the CPU backend is the fp32 reference; use "
                            "--precision fp32 with --device cpu, or plan for --device cuda",
                         st_dtype_name(in->dtype));
  if (in->headroom_pct < 0 || in->headroom_pct >= 100)
    return st_error_setc(U, "--headroom must be in [0, 100), got %g", in->headroom_pct);

  const int64_t T = seq, B = in->micro_batch;
  const int64_t N = in->world;
  const uint64_t es = st_dtype_size(in->dtype), f4 = sizeof(float);
  /* The parameter table: front (wte, wpe), L equal blocks, tail (ln_f, an
   * untied lm_head); activations are counted by T. */
  int64_t front, block, tail;
  const int lora = in->lora.rank > 0;
  if (lora) {
    /* the adapters are the trainable vector: per-layer blocks, no head */
    if (in->zero_stage == 3 || in->offload)
      return st_error_setc(U, "--lora with %s is not supported; use --zero 0, 1 or 2 without "
                           "--offload", in->zero_stage == 3 ? "--zero 3" : "--offload");
    st_lora_table lt;
    if (st_lora_table_build(c, &in->lora, &lt) || table_split(c, &p->base_params, &front, &block,
                                                              &tail))
      return -1;
    p->params = lt.total;
    front = tail = 0;
    block = lt.layer_numel;
    st_lora_table_free(&lt);
  } else if (table_split(c, &p->params, &front, &block, &tail)) {
    return -1;
  }
  p->padded_params = (p->params + N - 1) / N * N;
  p->shard = p->padded_params / N;
  const uint64_t padded = (uint64_t)p->padded_params, shard = (uint64_t)p->shard;

  /* Every buffer takes st_arena_round(its bytes) in the arena (256-byte
   * alignment), so each category counts its buffers rounded: the arena is
   * then exactly the sum of the categories inside it. */
  uint64_t (*const R)(uint64_t) = st_arena_round;
  if (in->zero_stage == 3) {
    /* st_model_init_sharded: this rank's shard, the head tensors whole, two
     * one-block buffers the blocks are gathered into */
    p->weights_shard = R(shard * es);
    p->weights_head = R((uint64_t)(front + tail) * es);
    p->weights_blocks = 2 * R((uint64_t)block * es);
    p->weights = p->weights_shard + p->weights_head + p->weights_blocks;
  } else if (lora) {
    /* st_model_init_lora: the base unpadded, the adapters padded to N */
    int64_t kept = p->base_params;
    if (in->lora.nf4_base) {
      uint64_t nf4, scratch;
      st_model_nf4_bytes(c, in->dtype, &nf4, &scratch, &kept);
      p->weights_nf4 = R(nf4 ? nf4 : 1);
      p->nf4_scratch = R(scratch);
    }
    p->weights_base = R((uint64_t)(kept ? kept * (int64_t)es : 1));
    p->lora_weights = R(padded * es);
    p->weights = p->weights_base + p->lora_weights + p->weights_nf4 + p->nf4_scratch;
  } else {
    p->weights = R(padded * es);
  }
  if (in->zero_stage >= 2) {
    p->grads_head = R((uint64_t)(front + tail) * f4);
    /* one bucket on one rank, two otherwise (rank/model/model_layout.c) */
    p->grads_buckets = (N == 1 ? 1 : 2) * R((uint64_t)(block + 1) * f4);
    /* st_trainer_alloc_state: per hook slot (block l % 2, front, tail),
     * min(range, shard) + 1 floats; none with one micro-step a step, whose
     * reductions land in the shard itself, unless that shard is bf16 on
     * more than one rank (reduced in fp32 here, then rounded into it). */
    const int64_t range[4] = {block, block, front, tail};
    const int recv = in->accum != 1 || (st_plan_grads_bf16(in) && N > 1);
    for (int s = 0; s < 4 && recv; s++)
      p->grads_recv += R((uint64_t)((range[s] < p->shard ? range[s] : p->shard) + 1) * f4);
    p->grads = p->grads_head + p->grads_buckets + p->grads_recv;
  } else {
    p->grads_full = R(padded * f4);
    p->grads = p->grads_full;
  }
  const uint64_t nopt = in->zero_stage == 0 ? padded : shard;
  /* ckpt_save.c: three buffers of shard + 1 floats (the checkpoint's
   * partition is the ZeRO shard at every stage) */
  p->host_ckpt_staging = in->ckpt_async ? 3 * (uint64_t)(shard + 1) * f4 : 0;
  /* ZeRO 1 on one rank reduces in place into the full gradients (train_setup.c) */
  p->grad_shard = in->zero_stage >= 1 && !(in->zero_stage == 1 && N == 1)
                      ? R(shard * (st_plan_grads_bf16(in) ? 2 : f4))
                      : 0;
  if (in->offload) {
    /* rank/optim/offload.c: the state moves to the host whole (fp32
     * storage too: the host keeps its own master copy), plus two staging
     * chunks each way */
    const uint64_t chunk = (uint64_t)st_plan_offload_chunk(in);
    const uint64_t stage = chunk < nopt ? chunk : nopt;
    p->host_master = p->host_adam_m = p->host_adam_v = R(nopt * f4);
    p->host_grad_staging = 2 * R(stage * f4);
    p->host_work_staging = 2 * R(stage * es);
    p->host_total = p->host_master + p->host_adam_m + p->host_adam_v + p->host_grad_staging +
                    p->host_work_staging;
  } else {
    p->master = st_plan_master_split(in->dtype, in->offload, in->master_fp32) ? R(nopt * 2)
                : in->dtype != ST_FP32                         ? R(nopt * f4)
                                                               : 0;
    p->adam_m = p->adam_v = R(nopt * f4);
  }

  /* Attention state per layer: the CPU keeps the softmax [B,NH,T,T]
   * (kernels/cpu/attention.c), CUDA's flash attention one statistic per
   * row [B,NH,T] (kernels/cuda/attention.cu); per query head, GQA or not. */
  const int64_t NH = c->n_head;
  double natt_d = in->backend == ST_BACKEND_CPU ? (double)B * NH * T * T : (double)B * NH * T;
  if (natt_d * 4 > 1e18)
    return st_error_setc(ST_EXIT_USAGE, "--seq-len %lld: the CPU attention keeps a T x T "
                         "matrix per head (%.3g bytes); lower --seq-len or --micro-batch",
                         (long long)T, natt_d * 4);
  const int64_t natt = in->backend == ST_BACKEND_CPU ? B * NH * T * T : B * NH * T;
  st_model_measure_acts_lora(c, lora ? &in->lora : NULL, in->dtype, natt, (int)B, (int)T,
                             in->recompute, &p->acts);
  p->tokens = 2 * R((uint64_t)(B * T) * sizeof(int));

  if (in->backend == ST_BACKEND_CUDA) {
    p->cublaslt = R(ST_PLAN_CUBLASLT_WORKSPACE);
    p->scratch = R(st_plan_cuda_scratch(B * T, c));
    p->nccl = st_plan_nccl_bytes(in->world, in->nccl_buffsize, in->nccl_channels) +
              (in->nccl_overlap_channels > 0
                   ? st_plan_nccl_bytes(in->world, in->nccl_buffsize,
                                        ST_PLAN_NCCL_OVERLAP_FACTOR * in->nccl_overlap_channels)
                   : 0);
    p->context = st_plan_context_bytes(in->world, in->nccl_one_rank);
    p->attn_workspace =
        R(st_plan_attention_workspace(in->attn_workspace_per_seq, (int)B, in->attn_group));
  }
  /* act_mem is one buffer, its size a multiple of 256 (model.c) */
  p->arena = p->weights + p->grads + p->acts.total + p->grad_shard + p->master + p->adam_m +
             p->adam_v + p->tokens + p->cublaslt + p->scratch + p->attn_workspace;
  p->total = p->arena + p->nccl + p->context;
  p->capped = p->total + (in->backend == ST_BACKEND_CPU ? p->host_total : 0);
  p->fits = -1;
  if (in->gpu_mem > 0) {
    const uint64_t keep = (uint64_t)ceil((double)in->gpu_mem * in->headroom_pct / 100.0);
    p->usable = in->gpu_mem > keep ? in->gpu_mem - keep : 0;
    p->spare = (int64_t)p->usable - (int64_t)p->capped;
    p->fits = p->capped <= p->usable;
  }
  return 0;
}

/* Every byte category of a plan, by the name `plan --json` and the arena's
 * tags use, in the JSON's order: one list for both. */
typedef struct {
  const char *name;
  uint64_t bytes;
} named_bytes;
enum { N_CATEGORIES = 26 };

static void categories(const st_memory_plan *p, named_bytes k[N_CATEGORIES]) {
  const named_bytes all[N_CATEGORIES] = {
      {"weights", p->weights},         {"weights_shard", p->weights_shard},
      {"weights_head", p->weights_head}, {"weights_blocks", p->weights_blocks},
      {"weights_base", p->weights_base}, {"lora_weights", p->lora_weights},
      {"weights_nf4", p->weights_nf4}, {"nf4_scratch", p->nf4_scratch},
      {"grads", p->grads},
      {"grads_full", p->grads_full},   {"grads_head", p->grads_head},
      {"grads_buckets", p->grads_buckets}, {"grads_recv", p->grads_recv},
      {"grad_shard", p->grad_shard},   {"master", p->master},
      {"adam_m", p->adam_m},           {"adam_v", p->adam_v},
      {"activations", p->acts.total},  {"tokens", p->tokens},
      {"cublaslt_workspace", p->cublaslt}, {"cudnn_attention_workspace", p->attn_workspace},
      {"cuda_scratch", p->scratch},    {"nccl_estimate", p->nccl},
      {"cuda_context_estimate", p->context}, {"arena", p->arena},
      {"total", p->total}};
  memcpy(k, all, sizeof all);
}

int st_memory_plan_offload_split(const st_plan_input *in, uint64_t *host_bytes,
                                 uint64_t *device_bytes) {
  st_memory_plan p;
  if (st_memory_plan_make(in, &p)) return -1;
  *host_bytes = p.host_total;
  *device_bytes = p.total;
  return 0;
}

uint64_t st_memory_plan_category(const st_memory_plan *p, const char *name, int *known) {
  named_bytes k[N_CATEGORIES];
  categories(p, k);
  for (int i = 0; i < N_CATEGORIES; i++)
    if (name && strcmp(name, k[i].name) == 0) {
      if (known) *known = 1;
      return k[i].bytes;
    }
  if (known) *known = 0;
  return 0;
}

int st_plan_parse_size(const char *flag, const char *text, uint64_t *out) {
  /* util/bytes.c reads the size; a bare number (bytes there) is refused
   * here, as "--gpu-mem 80" is surely not 80 bytes. */
  char *end;
  double v = strtod(text, &end);
  uint64_t b = 0;
  if (end != text && isfinite(v) && v > 0 && strpbrk(end, "BKMGTbkmgt") &&
      st_parse_bytes(text, &b) == 0 && b > 0) {
    *out = b;
    return 0;
  }
  /* say which part is wrong: the number, the missing unit, or the unit */
  if (end != text && isfinite(v) && v <= 0)
    return st_error_setc(ST_EXIT_USAGE, "%s must be more than 0 bytes, e.g. 24GiB; got '%s'",
                         flag, text);
  if (end != text && isfinite(v) && strpbrk(end, "BKMGTbkmgt")) {
    char unit_alone[32];
    snprintf(unit_alone, sizeof unit_alone, "1%s", end);
    if (st_parse_bytes(unit_alone, &b) == 0)
      return st_error_setc(ST_EXIT_USAGE, "%s: '%s' is more bytes than a 64-bit count holds; "
                           "give the memory to use, e.g. 24GiB", flag, text);
    return st_error_setc(ST_EXIT_USAGE, "%s: '%s' has a unit shardtrain does not read; units "
                         "are B, kB/KB, MB, GB, TB (powers of 1000), KiB, MiB, GiB, TiB or K, M, "
                         "G, T (powers of 1024), in that case; e.g. 24GiB", flag, text);
  }
  return st_error_setc(ST_EXIT_USAGE, "%s expects a size with a unit, e.g. 24GiB, 80GB, "
                                      "81559MiB or 24G (binary); got '%s'", flag, text);
}

int st_plan_device_memory(uint64_t *free_bytes, uint64_t *total_bytes, char *name, size_t cap) {
#ifdef SHARDTRAIN_HAVE_CUDA
  if (st_cuda_device_count() == 0) return st_error_set("no CUDA device is visible");
  int dev = 0;
  size_t f = 0, t = 0;
  struct cudaDeviceProp prop;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaMemGetInfo(&f, &t);
  if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, dev);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return st_error_set("cannot read the memory of CUDA device %d: %s", dev,
                        cudaGetErrorString(e));
  }
  *free_bytes = f;
  *total_bytes = t;
  if (name && cap) snprintf(name, cap, "cuda:%d (%s)", dev, prop.name);
  return 0;
#else
  (void)free_bytes;
  (void)total_bytes;
  if (name && cap) name[0] = 0;
  return st_error_set("this build has no CUDA backend, so no GPU memory can be read");
#endif
}

/* The plan as one JSON object (what `shardtrain plan --json` prints). */
struct cJSON *st_memory_plan_cjson(const char *model_name, int global_batch, int accum,
                                   const st_plan_input *in, const st_memory_plan *p,
                                   const char *source) {
  cJSON *j = cJSON_CreateObject();
  cJSON *m = cJSON_AddObjectToObject(j, "model");
  cJSON_AddStringToObject(m, "name", model_name);
  st_model_add_json(m, &in->model, "seq_len");
  /* seq_len is T; the positions go apart when they differ (an imported model) */
  cJSON_ReplaceItemInObject(m, "seq_len", cJSON_CreateNumber(st_plan_seq_len(in)));
  if (st_plan_seq_len(in) != in->model.block_size)
    cJSON_AddNumberToObject(m, "positions", in->model.block_size);
  cJSON_AddNumberToObject(m, "params", (double)p->params);
  cJSON_AddNumberToObject(m, "padded_params", (double)p->padded_params);
  if (p->base_params) cJSON_AddNumberToObject(m, "lora_base_params", (double)p->base_params);
  cJSON_AddNumberToObject(m, "shard", (double)p->shard);
  cJSON *c = cJSON_AddObjectToObject(j, "config");
  cJSON_AddNumberToObject(c, "micro_batch", in->micro_batch);
  cJSON_AddNumberToObject(c, "global_batch", global_batch);
  cJSON_AddNumberToObject(c, "grad_accum", accum);
  cJSON_AddNumberToObject(c, "ranks", in->world);
  cJSON_AddNumberToObject(c, "zero", in->zero_stage);
  cJSON_AddStringToObject(c, "precision", st_dtype_name(in->dtype));
  cJSON_AddStringToObject(c, "recompute", st_recompute_name(in->recompute));
  cJSON_AddStringToObject(c, "device", in->backend == ST_BACKEND_CUDA ? "cuda" : "cpu");
  cJSON *b = cJSON_AddObjectToObject(j, "bytes");
  named_bytes k[N_CATEGORIES];
  categories(p, k);
  for (int i = 0; i < N_CATEGORIES; i++) cJSON_AddNumberToObject(b, k[i].name, (double)k[i].bytes);
  /* --offload optimizer: the host section (the node's check is the trainer's) */
  cJSON_AddStringToObject(c, "offload", in->offload ? "optimizer" : "none");
  cJSON_AddStringToObject(c, "grad_dtype", st_plan_grads_bf16(in) ? "bf16" : "fp32");
  cJSON_AddNumberToObject(j, "host_ckpt_staging", (double)p->host_ckpt_staging);
  if (in->offload) {
    cJSON *h = cJSON_AddObjectToObject(j, "host");
    cJSON_AddNumberToObject(h, "master", (double)p->host_master);
    cJSON_AddNumberToObject(h, "adam_m", (double)p->host_adam_m);
    cJSON_AddNumberToObject(h, "adam_v", (double)p->host_adam_v);
    cJSON_AddNumberToObject(h, "grad_staging", (double)p->host_grad_staging);
    cJSON_AddNumberToObject(h, "work_staging", (double)p->host_work_staging);
    cJSON_AddNumberToObject(h, "chunk_elements", (double)st_plan_offload_chunk(in));
    cJSON_AddNumberToObject(h, "total", (double)p->host_total);
  }
  cJSON *a = cJSON_AddObjectToObject(j, "activations");
  cJSON_AddNumberToObject(a, "blocks", (double)p->acts.blocks);
  cJSON_AddNumberToObject(a, "recompute_block", (double)p->acts.recompute);
  cJSON_AddNumberToObject(a, "attention", (double)p->acts.attention);
  cJSON_AddNumberToObject(a, "logits", (double)p->acts.logits);
  /* the rows of the LM head's chunk that those bytes hold, of micro-batch x seq-len */
  cJSON_AddNumberToObject(a, "logits_rows",
                          st_model_head_rows(&in->model, in->dtype,
                                             (int64_t)in->micro_batch * st_plan_seq_len(in)));
  cJSON_AddNumberToObject(a, "grad_scratch", (double)p->acts.grad_scratch);
  cJSON_AddNumberToObject(a, "lora", (double)p->acts.lora);
  cJSON_AddNumberToObject(a, "embed", (double)p->acts.embed);
  cJSON_AddNumberToObject(a, "head", (double)p->acts.head);
  cJSON *g = cJSON_AddObjectToObject(j, "gpu");
  if (p->fits >= 0) {
    cJSON_AddNumberToObject(g, "memory", (double)in->gpu_mem);
    cJSON_AddStringToObject(g, "source", source);
    cJSON_AddNumberToObject(g, "headroom_pct", in->headroom_pct);
    cJSON_AddNumberToObject(g, "usable", (double)p->usable);
    cJSON_AddNumberToObject(g, "spare", (double)p->spare);
    cJSON_AddBoolToObject(g, "fits", p->fits);
  } else {
    cJSON_AddNullToObject(g, "memory");
    cJSON_AddNullToObject(g, "fits");
  }
  return j;
}

char *st_memory_plan_json(const char *model_name, int global_batch, int accum,
                          const st_plan_input *in, const st_memory_plan *p, const char *source) {
  cJSON *j = st_memory_plan_cjson(model_name, global_batch, accum, in, p, source);
  char *s = j ? cJSON_PrintUnformatted(j) : NULL;
  size_t n = s ? strlen(s) + 1 : 0;
  char *out = n ? malloc(n) : NULL;
  if (out) memcpy(out, s, n);
  cJSON_free(s);
  cJSON_Delete(j);
  return out;
}

uint64_t st_plan_attention_workspace(uint64_t per_seq, int B, int group_cap) {
  return per_seq ? per_seq * (uint64_t)st_attention_cudnn_group(B, group_cap) : 0;
}

uint64_t st_plan_cudnn_attention_per_seq(int T, const st_model_config *c) {
  const uint64_t t64 = ((uint64_t)T + 63) / 64 * 64, NH = (uint64_t)c->n_head;
  const uint64_t NKV = c->n_kv_head > 0 ? (uint64_t)c->n_kv_head : NH;
  uint64_t ws = NH * t64 * t64 * 2 + NH * (uint64_t)T * 4;
  /* GQA: dK and dV per query head, fp32, before each group is summed into
   * its KV head (kernels/cuda/attention_cudnn.h). Assumed, not yet measured:
   * it errs high if cuDNN sums in place. */
  if (NKV < NH) ws += 2 * NH * (uint64_t)T * (uint64_t)st_model_head_dim(c) * 4;
  return ws;
}
