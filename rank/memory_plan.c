/* memory_plan.c - per-GPU memory of a training configuration, and the --fit
 * search over micro-batch, recompute and ZeRO stage (see memory_plan.h and
 * docs/memory.md for the derivation). */
#include "rank/memory_plan.h"

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
#include "kernels/colsum.h"
#include "util/bytes.h"
#include "util/error.h"

st_recompute st_recompute_parse(const char *name) {
  if (strcmp(name, "full") == 0) return ST_RECOMPUTE_FULL;
  if (strcmp(name, "selective") == 0) return ST_RECOMPUTE_SELECTIVE;
  return ST_RECOMPUTE_NONE;
}

const char *st_recompute_name(st_recompute r) {
  return r == ST_RECOMPUTE_FULL ? "full" : r == ST_RECOMPUTE_SELECTIVE ? "selective" : "none";
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

uint64_t st_plan_cuda_scratch(int64_t rows, int64_t C) {
  const uint64_t part = (uint64_t)st_colsum_chunks((int)rows) * sizeof(float);
  uint64_t s = st_scratch_grow(0, part * 2 * C); /* ln_f: dw and db partials */
  /* One block's requests; later blocks repeat them and cannot grow it. */
  const int64_t widths[] = {C, 4 * C, 2 * C, C, 3 * C, 2 * C};
  for (int i = 0; i < 6; i++) s = st_scratch_grow(s, part * widths[i]);
  return st_scratch_grow(s, 512 * sizeof(double)); /* sum_squares (kernels/cuda/adamw.cu) */
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
  if (in->zero_stage < 0 || in->zero_stage > 2)
    return st_error_setc(U, "--zero must be 0, 1 or 2, got %d", in->zero_stage);
  if ((int64_t)in->micro_batch * c->block_size > INT_MAX)
    return st_error_setc(U, "--micro-batch %d x --seq-len %d = %lld rows exceeds the ops' "
                            "32-bit row count (%d); lower either", in->micro_batch,
                         c->block_size, (long long)in->micro_batch * c->block_size, INT_MAX);
  if (in->backend == ST_BACKEND_CPU && in->dtype != ST_FP32)
    return st_error_setc(U, "--precision %s: the CPU backend is the fp32 reference; use "
                            "--precision fp32 with --device cpu, or plan for --device cuda",
                         st_dtype_name(in->dtype));
  if (in->headroom_pct < 0 || in->headroom_pct >= 100)
    return st_error_setc(U, "--headroom must be in [0, 100), got %g", in->headroom_pct);

  const int64_t C = c->n_embd, L = c->n_layer, T = c->block_size, B = in->micro_batch;
  const int64_t N = in->world;
  const uint64_t es = st_dtype_size(in->dtype), f4 = sizeof(float);
  /* The parameter table (rank/params.c): wte [Vp,C], wpe [T,C], L blocks of
   * 12 tensors, ln_f. */
  const int64_t head_front = (int64_t)c->padded_vocab_size * C + T * C; /* wte + wpe */
  const int64_t block = 12 * C * C + 13 * C, lnf = 2 * C;
  p->params = head_front + L * block + lnf;
  p->padded_params = (p->params + N - 1) / N * N;
  p->shard = p->padded_params / N;
  const uint64_t padded = (uint64_t)p->padded_params, shard = (uint64_t)p->shard;

  /* Every buffer takes st_arena_round(its bytes) in the arena (256-byte
   * alignment), so each category counts its buffers rounded: the arena is
   * then exactly the sum of the categories inside it. */
  uint64_t (*const R)(uint64_t) = st_arena_round;
  p->weights = R(padded * es);
  if (in->zero_stage == 2) {
    p->grads_head = R((uint64_t)(head_front + lnf) * f4);
    p->grads_buckets = 2 * R((uint64_t)(block + 1) * f4);
    /* st_trainer_alloc_state: per hook slot (block l % 2, wte+wpe, ln_f),
     * min(range, shard) + 1 floats. */
    const int64_t range[4] = {block, block, head_front, lnf};
    for (int s = 0; s < 4; s++)
      p->grads_recv += R((uint64_t)((range[s] < p->shard ? range[s] : p->shard) + 1) * f4);
    p->grads = p->grads_head + p->grads_buckets + p->grads_recv;
  } else {
    p->grads_full = R(padded * f4);
    p->grads = p->grads_full;
  }
  const uint64_t nopt = in->zero_stage == 0 ? padded : shard;
  /* ZeRO 1 on one rank reduces in place into the full gradients (train_setup.c) */
  p->grad_shard = in->zero_stage >= 1 && !(in->zero_stage == 1 && N == 1) ? R(shard * f4) : 0;
  p->master = in->dtype != ST_FP32 ? R(nopt * f4) : 0;
  p->adam_m = p->adam_v = R(nopt * f4);

  /* Attention state per layer: the CPU keeps the softmax [B,NH,T,T]
   * (kernels/cpu/attention.c), CUDA's flash attention one statistic per
   * row [B,NH,T] (kernels/cuda/attention.cu). */
  const int64_t NH = c->n_head;
  double natt_d = in->backend == ST_BACKEND_CPU ? (double)B * NH * T * T : (double)B * NH * T;
  if (natt_d * 4 > 1e18)
    return st_error_setc(ST_EXIT_USAGE, "--seq-len %lld: the CPU attention keeps a T x T "
                         "matrix per head (%.3g bytes); lower --seq-len or --micro-batch",
                         (long long)T, natt_d * 4);
  const int64_t natt = in->backend == ST_BACKEND_CPU ? B * NH * T * T : B * NH * T;
  st_model_measure_acts(c, in->dtype, natt, (int)B, (int)T, in->recompute, &p->acts);
  p->tokens = 2 * R((uint64_t)(B * T) * sizeof(int));

  if (in->backend == ST_BACKEND_CUDA) {
    p->cublaslt = R(ST_PLAN_CUBLASLT_WORKSPACE);
    p->scratch = R(st_plan_cuda_scratch(B * T, C));
    p->nccl = st_plan_nccl_bytes(in->world, in->nccl_buffsize, in->nccl_channels);
    p->context = ST_PLAN_CUDA_CONTEXT;
    p->attn_workspace = R(in->attn_workspace_per_seq * (uint64_t)B);
  }
  /* act_mem is one buffer, its size a multiple of 256 (model.c) */
  p->arena = p->weights + p->grads + p->acts.total + p->grad_shard + p->master + p->adam_m +
             p->adam_v + p->tokens + p->cublaslt + p->scratch + p->attn_workspace;
  p->total = p->arena + p->nccl + p->context;
  p->fits = -1;
  if (in->gpu_mem > 0) {
    const uint64_t keep = (uint64_t)ceil((double)in->gpu_mem * in->headroom_pct / 100.0);
    p->usable = in->gpu_mem > keep ? in->gpu_mem - keep : 0;
    p->spare = (int64_t)p->usable - (int64_t)p->total;
    p->fits = p->total <= p->usable;
  }
  return 0;
}

uint64_t st_memory_plan_category(const st_memory_plan *p, const char *name, int *known) {
  const struct {
    const char *name;
    uint64_t bytes;
  } k[] = {{"weights", p->weights},       {"grads", p->grads},
           {"grads_full", p->grads_full}, {"grads_head", p->grads_head},
           {"grads_buckets", p->grads_buckets}, {"grads_recv", p->grads_recv},
           {"grad_shard", p->grad_shard}, {"master", p->master},
           {"adam_m", p->adam_m},         {"adam_v", p->adam_v},
           {"activations", p->acts.total}, {"tokens", p->tokens},
           {"cublaslt_workspace", p->cublaslt}, {"cuda_scratch", p->scratch},
           {"arena", p->arena},           {"nccl_estimate", p->nccl},
           {"cuda_context_estimate", p->context}, {"total", p->total}};
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
    if (name && strcmp(name, k[i].name) == 0) {
      if (known) *known = 1;
      return k[i].bytes;
    }
  if (known) *known = 0;
  return 0;
}

/* ---- --fit ---- */

/* The search's candidates: micro-batches in order (largest first, each
 * dividing the per-rank batch and within the bound), ZeRO stages in order
 * of preference. */
typedef struct {
  const st_plan_fit_query *q;
  int batches[2048], nb;
  int stages[3], ns;
} search;

static int plan_at(const search *s, int B, st_recompute r, int z, st_plan_choice *c) {
  c->in = s->q->base;
  c->in.micro_batch = B;
  c->in.recompute = r;
  c->in.zero_stage = z;
  c->accum = s->q->global_batch / (B * s->q->base.world);
  return st_memory_plan_make(&c->in, &c->plan);
}

/* The least memory over the allowed ZeRO stages at (B, r); -1 on error. */
static int least_over_zero(const search *s, int B, st_recompute r, st_plan_choice *best) {
  for (int k = 0; k < s->ns; k++) {
    st_plan_choice c;
    if (plan_at(s, B, r, s->stages[k], &c)) return -1;
    if (k == 0 || c.plan.total < best->plan.total) *best = c;
  }
  return 0;
}

/* The least memory at micro-batch B over the allowed recompute and stages. */
static int least_at_batch(const search *s, int B, st_plan_choice *best) {
  const int r0 = s->q->base.recompute;
  for (int r = r0; r <= ST_RECOMPUTE_FULL; r++) {
    st_plan_choice c;
    if (least_over_zero(s, B, (st_recompute)r, &c)) return -1;
    if (r == r0 || c.plan.total < best->plan.total) *best = c;
  }
  return 0;
}

/* The first fitting (micro-batch, stage) for recompute r among
 * batches[from..], in preference order. */
static int first_fit_with(const search *s, int from, st_recompute r, int *found,
                          st_plan_choice *c) {
  *found = 0;
  for (int i = from; i < s->nb; i++)
    for (int k = 0; k < s->ns; k++) {
      if (plan_at(s, s->batches[i], r, s->stages[k], c)) return -1;
      if (c->plan.fits) {
        *found = 1;
        return 0;
      }
    }
  return 0;
}

static int fit_search(const search *s, st_plan_fit *out) {
  const st_plan_fit_query *q = s->q;
  const int r0 = q->base.recompute;
  int have_least = 0;
  for (int i = 0; i < s->nb; i++) {
    const int B = s->batches[i];
    for (int r = r0; r <= ST_RECOMPUTE_FULL; r++) {
      for (int k = 0; k < s->ns; k++) {
        const int z = s->stages[k];
        st_plan_choice c;
        if (plan_at(s, B, (st_recompute)r, z, &c)) return -1;
        if (!have_least || c.plan.total < out->least.plan.total) out->least = c;
        have_least = 1;
        if (!c.plan.fits) continue;
        out->found = 1;
        out->choice = c;
        if (i > 0) {
          out->has_larger_batch = 1;
          if (least_at_batch(s, s->batches[i - 1], &out->larger_batch)) return -1;
        }
        if (r > r0) {
          out->has_cheaper_recompute = 1;
          if (least_over_zero(s, B, (st_recompute)(r - 1), &out->cheaper_recompute)) return -1;
        }
        if (q->search_zero == 1 && k > 0) { /* stages are 0, 1, 2: the one below failed */
          out->has_lower_zero = 1;
          if (plan_at(s, B, (st_recompute)r, s->stages[k - 1], &out->lower_zero)) return -1;
        }
        for (int ra = r0; ra < r; ra++)
          if (first_fit_with(s, i + 1, (st_recompute)ra, &out->has_alt[ra], &out->alt[ra]))
            return -1;
        return 0;
      }
    }
  }
  return 0;
}

int st_memory_plan_fit(const st_plan_fit_query *q, st_plan_fit *out) {
  memset(out, 0, sizeof *out);
  const int N = q->base.world, G = q->global_batch, T = q->base.model.block_size;
  const int U = ST_EXIT_USAGE;
  if (N < 1) return st_error_setc(U, "--ranks must be >= 1, got %d", N);
  if (G < 1) return st_error_setc(U, "--global-batch must be >= 1, got %d", G);
  if (G % N != 0)
    return st_error_setc(U, "--global-batch %d does not divide by %d ranks: every rank takes "
                            "the same number of sequences; use a multiple of %d", G, N, N);
  if (q->base.gpu_mem == 0)
    return st_error_setc(U, "--fit needs the GPU memory: give --gpu-mem SIZE (e.g. 80GiB), or "
                            "run where a GPU is visible");
  search *s = calloc(1, sizeof *s);
  if (!s) return st_error_set("out of host memory");
  s->q = q;
  const int z = q->base.zero_stage;
  if (q->search_zero == 1) {
    for (int k = 0; k < 3; k++) s->stages[s->ns++] = k;
  } else if (q->search_zero == 2) { /* the given stage, then higher, then lower */
    for (int k = z; k < 3; k++) s->stages[s->ns++] = k;
    for (int k = z - 1; k >= 0; k--) s->stages[s->ns++] = k;
  } else {
    s->stages[s->ns++] = z;
  }
  /* Divisors of the per-rank batch, largest first: d <= sqrt ascending gives
   * the partners per_rank / d descending, then the d themselves descending.
   * Below 2^31 a number has at most 1,600 divisors, half of them small. */
  const int per_rank = G / N, bound = q->base.micro_batch > 0 ? q->base.micro_batch : per_rank;
  int lo[1024], nlo = 0, all[2048], n = 0;
  for (int d = 1; (int64_t)d * d <= per_rank; d++)
    if (per_rank % d == 0) lo[nlo++] = d;
  for (int i = 0; i < nlo; i++)
    if (per_rank / lo[i] != lo[i]) all[n++] = per_rank / lo[i];
  for (int i = nlo - 1; i >= 0; i--) all[n++] = lo[i];
  for (int i = 0; i < n; i++)
    if (all[i] <= bound && (int64_t)all[i] * T <= INT_MAX) s->batches[s->nb++] = all[i];
  int rc = 0;
  if (s->nb == 0)
    rc = st_error_setc(U, "no micro-batch dividing %d sequences per rank is at most %d and keeps "
                          "B x --seq-len %d within the ops' 32-bit row count", per_rank, bound, T);
  else rc = fit_search(s, out);
  free(s);
  return rc;
}

void st_plan_describe_change(const st_plan_input *from, const st_plan_input *to,
                             int global_batch, char *out, size_t cap) {
  size_t len = 0;
  out[0] = 0;
#define ADD(...)                                                                   \
  do {                                                                             \
    if (len && len + 2 < cap) len += (size_t)snprintf(out + len, cap - len, ", "); \
    int n_ = snprintf(out + len, cap - len, __VA_ARGS__);                          \
    if (n_ > 0 && (size_t)n_ < cap - len) len += (size_t)n_;                       \
  } while (0)
  if (from->micro_batch != to->micro_batch) {
    const int N = to->world;
    ADD("--micro-batch %d -> %d (gradient accumulation %d -> %d)", from->micro_batch,
        to->micro_batch, global_batch / (from->micro_batch * N),
        global_batch / (to->micro_batch * N));
  }
  if (from->recompute != to->recompute)
    ADD("--recompute %s -> %s", st_recompute_name(from->recompute),
        st_recompute_name(to->recompute));
  if (from->zero_stage != to->zero_stage)
    ADD("--zero %d -> %d", from->zero_stage, to->zero_stage);
#undef ADD
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
  cJSON_AddNumberToObject(m, "n_layer", in->model.n_layer);
  cJSON_AddNumberToObject(m, "n_head", in->model.n_head);
  cJSON_AddNumberToObject(m, "n_embd", in->model.n_embd);
  cJSON_AddNumberToObject(m, "seq_len", in->model.block_size);
  cJSON_AddNumberToObject(m, "vocab_size", in->model.vocab_size);
  cJSON_AddNumberToObject(m, "padded_vocab_size", in->model.padded_vocab_size);
  cJSON_AddNumberToObject(m, "params", (double)p->params);
  cJSON_AddNumberToObject(m, "padded_params", (double)p->padded_params);
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
#define B(name, v) cJSON_AddNumberToObject(b, name, (double)(v))
  B("weights", p->weights);
  B("grads", p->grads);
  B("grads_full", p->grads_full);
  B("grads_head", p->grads_head);
  B("grads_buckets", p->grads_buckets);
  B("grads_recv", p->grads_recv);
  B("grad_shard", p->grad_shard);
  B("master", p->master);
  B("adam_m", p->adam_m);
  B("adam_v", p->adam_v);
  B("activations", p->acts.total);
  B("tokens", p->tokens);
  B("cublaslt_workspace", p->cublaslt);
  B("cudnn_attention_workspace", p->attn_workspace);
  B("cuda_scratch", p->scratch);
  B("nccl_estimate", p->nccl);
  B("cuda_context_estimate", p->context);
  B("arena", p->arena);
  B("total", p->total);
#undef B
  cJSON *a = cJSON_AddObjectToObject(j, "activations");
  cJSON_AddNumberToObject(a, "blocks", (double)p->acts.blocks);
  cJSON_AddNumberToObject(a, "recompute_block", (double)p->acts.recompute);
  cJSON_AddNumberToObject(a, "attention", (double)p->acts.attention);
  cJSON_AddNumberToObject(a, "logits", (double)p->acts.logits);
  cJSON_AddNumberToObject(a, "grad_scratch", (double)p->acts.grad_scratch);
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
