/* memory_fit.c - the one search behind plan --fit, train --auto-fit and the
 * pre-flight's suggestion (see memory_fit.h; the rule is in docs/memory.md,
 * "Choosing by cost"). */
#include "rank/memory/memory_fit.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention_choice.h"
#include "util/bytes.h"
#include "util/error.h"

/* Measured on an H200 (README, GPT-2 124M B=32): selective ran at 0.96-0.98
 * and full at 0.85 of --recompute none's speed (0.74 before full recompute
 * stopped short of the down projection). The factors are rounded to the
 * arithmetic (full: about two thirds of a forward more, a forward being a
 * third of forward + backward), so the rule does not hang on one
 * measurement. act: one more pointwise pass over the 4X-wide MLP
 * activation a block (read fc, write its GELU); measured on an H100
 * (2026-12-07, docs/memory.md) at 0.977-0.990 of none's speed for GPT-2
 * 350M-1.5B and Llama 3.2 1B. Indexed by st_recompute. */
static const double k_recompute_factor[ST_RECOMPUTE_POLICIES] = {1.00, 1.02, 1.03, 1.20};
/* A micro-step's fixed work in rows on CUDA: about 5% at 8 x 1024 rows. */
#define FIT_CUDA_STEP_ROWS 410.0

/* --offload optimizer's cost (st_fit_offload_cost). FIT_GPU_FLOPS: the
 * model FLOP/s an H200 sustains in training (GPT-2 774M-1.5B at 55-60% MFU
 * of 740 TFLOP/s, docs/benchmarks.md). Per element of the rank's shard the
 * offloaded step moves 4 bytes of gradient to the host and 2 (or 4) bytes
 * of weights back over one copy stream, and the host AdamW reads and writes
 * 30 bytes (g, m, v, master in; m, v, master, weight out); the copies and
 * the host update overlap chunk by chunk, so the slower of the two counts. */
#define FIT_GPU_FLOPS 4.0e14
#define FIT_PCIE_BPS 2.0e10
#define FIT_HOST_ADAM_BPS 4.0e10

double st_fit_offload_cost(const st_plan_input *in, const st_memory_plan *p, int64_t tokens) {
  if (!in->offload || tokens < 1) return 0.0;
  const double shard = (double)p->shard, es = (double)st_dtype_size(in->dtype);
  const double copy = shard * (4.0 + es) / FIT_PCIE_BPS, host = shard * 30.0 / FIT_HOST_ADAM_BPS;
  const double ideal = 6.0 * (double)p->params * (double)tokens / FIT_GPU_FLOPS;
  return (copy > host ? copy : host) / ideal;
}

/* ZeRO 3's gathers (st_fit_zero3_cost): an assumed 100 GB/s of all-gather
 * bandwidth per GPU, about a quarter of an H200's NVLink and within reach of
 * 4 x 400 Gb/s InfiniBand per node of 8; not measured here. */
#define FIT_LINK_BPS 1.0e11

double st_fit_zero3_cost(const st_plan_input *in, const st_memory_plan *p, int64_t rows) {
  if (in->zero_stage != 3 || in->world < 2 || rows < 1 || in->backend != ST_BACKEND_CUDA)
    return 0.0;
  const double es = (double)st_dtype_size(in->dtype), N = (double)in->world;
  const double blocks = (double)p->params - (double)p->weights_head / es;
  const double gather = 2.0 * blocks * es * (N - 1.0) / N / FIT_LINK_BPS;
  const double ideal = 6.0 * (double)p->params * (double)rows / FIT_GPU_FLOPS;
  return gather / ideal;
}

double st_fit_cost(st_backend backend, int64_t rows, st_recompute recompute) {
  const double r0 = backend == ST_BACKEND_CUDA ? FIT_CUDA_STEP_ROWS : 0.0;
  const int r = (int)recompute >= 0 && (int)recompute < ST_RECOMPUTE_POLICIES ? (int)recompute : 0;
  return k_recompute_factor[r] * (1.0 + r0 / (double)(rows > 0 ? rows : 1));
}

void st_fit_query_make(const st_plan_input *in, int global_batch, int micro_batch_max,
                       st_recompute recompute_min, int zero_stage, int search_zero,
                       st_plan_fit_query *q) {
  memset(q, 0, sizeof *q);
  q->base = *in;
  q->base.micro_batch = micro_batch_max > 0 ? micro_batch_max : 0;
  q->base.recompute = recompute_min;
  q->base.zero_stage = zero_stage;
  q->global_batch = global_batch;
  q->search_zero = search_zero ? 1 : 0;
  q->order = ST_FIT_BY_COST;
}

/* The candidates: micro-batches largest first (each dividing the per-rank
 * batch and within the bound), ZeRO stages in order of preference. */
/* A placement: where the optimizer state lives, as one search dimension,
 * coded ZeRO stage + PLACE_OFFLOAD x (--offload optimizer). */
enum { PLACE_OFFLOAD = 8, PLACE_MAX = 16 };

typedef struct {
  const st_plan_fit_query *q;
  int batches[2048], nb;
  int stages[PLACE_MAX], ns; /* placements in order of preference */
} search;

static int plan_at(const search *s, int B, int r, int z, st_plan_choice *c) {
  c->in = s->q->base;
  c->in.micro_batch = B;
  c->in.recompute = (st_recompute)r;
  c->in.zero_stage = z % PLACE_OFFLOAD;
  c->in.offload = z >= PLACE_OFFLOAD;
  c->accum = s->q->global_batch / (B * s->q->base.world);
  c->in.accum = c->accum;
  const int64_t rows = (int64_t)B * st_plan_seq_len(&c->in);
  c->cost = st_fit_cost(c->in.backend, rows, c->in.recompute);
  if (st_memory_plan_make(&c->in, &c->plan)) return -1;
  c->cost += st_fit_offload_cost(&c->in, &c->plan, rows * c->accum);
  c->cost += st_fit_zero3_cost(&c->in, &c->plan, rows);
  return 0;
}

static int place_of(const st_plan_input *in) {
  return in->zero_stage + (in->offload ? PLACE_OFFLOAD : 0);
}

static int stage_index(const search *s, int z) {
  for (int k = 0; k < s->ns; k++)
    if (s->stages[k] == z) return k;
  return s->ns;
}

/* < 0 when a ranks above b in the query's order. */
static int rank_cmp(const search *s, const st_plan_choice *a, const st_plan_choice *b) {
  if (s->q->order == ST_FIT_BY_COST && a->cost != b->cost) return a->cost < b->cost ? -1 : 1;
  /* the nearest change keeps the optimizer on the GPU if anything does:
   * offload slows every step, a smaller micro-batch only the ones it splits */
  if (s->q->order == ST_FIT_NEAREST && a->in.offload != b->in.offload)
    return a->in.offload ? 1 : -1;
  if (a->in.micro_batch != b->in.micro_batch) return a->in.micro_batch > b->in.micro_batch ? -1 : 1;
  if (a->in.recompute != b->in.recompute) return a->in.recompute < b->in.recompute ? -1 : 1;
  return stage_index(s, place_of(&a->in)) - stage_index(s, place_of(&b->in));
}

/* The least memory over the allowed stages at (B, r) among the candidates
 * that rank above `like` (the choice), with the optimizer where it has it
 * (offload costs more, so a cheaper candidate that "does not fit" is one on
 * the same side). ZeRO 3's gather cost can put it below the choice at a
 * larger micro-batch or cheaper recompute, so it only counts where it
 * would have won; a lower stage at those (B, r) always does. 1 when one
 * was found, 0 when none ranks above, -1 on error. */
static int least_over_zero(const search *s, int B, int r, const st_plan_choice *like,
                           st_plan_choice *best) {
  int have = 0;
  for (int k = 0; k < s->ns; k++) {
    if ((s->stages[k] >= PLACE_OFFLOAD) != (like->in.offload != 0)) continue;
    st_plan_choice c;
    if (plan_at(s, B, r, s->stages[k], &c)) return -1;
    if (rank_cmp(s, &c, like) >= 0) continue;
    if (!have || c.plan.capped < best->plan.capped) *best = c;
    have = 1;
  }
  return have;
}

static int fit_search(const search *s, st_plan_fit *out) {
  const st_plan_fit_query *q = s->q;
  const int r0 = q->base.recompute;
  int have_least = 0, ichoice = -1;
  for (int i = 0; i < s->nb; i++)
    for (int r = r0; r <= ST_RECOMPUTE_FULL; r++)
      for (int k = 0; k < s->ns; k++) {
        st_plan_choice c;
        if (plan_at(s, s->batches[i], r, s->stages[k], &c)) return -1;
        out->candidates++;
        if (!have_least || c.plan.capped < out->least.plan.capped) out->least = c;
        have_least = 1;
        if (!out->has_least_with[r] || c.plan.capped < out->least_with[r].plan.capped)
          out->least_with[r] = c;
        out->has_least_with[r] = 1;
        if (!c.plan.fits) continue;
        if (!out->has_alt[r] || rank_cmp(s, &c, &out->alt[r]) < 0) out->alt[r] = c;
        out->has_alt[r] = 1;
        if (!out->found || rank_cmp(s, &c, &out->choice) < 0) {
          out->choice = c;
          ichoice = i;
        }
        out->found = 1;
      }
  if (!out->found) return 0;
  const st_plan_choice *ch = &out->choice;
  const int rc = ch->in.recompute;
  out->has_alt[rc] = 0; /* the choice itself is no alternative */
  if (ichoice > 0) {
    out->has_larger_batch =
        least_over_zero(s, s->batches[ichoice - 1], rc, ch, &out->larger_batch);
    if (out->has_larger_batch < 0) return -1;
  }
  if (rc > r0) {
    out->has_cheaper_recompute =
        least_over_zero(s, ch->in.micro_batch, rc - 1, ch, &out->cheaper_recompute);
    if (out->has_cheaper_recompute < 0) return -1;
  }
  const int k = stage_index(s, place_of(&ch->in));
  if (q->search_zero == 1 && k > 0 &&
      (s->stages[k - 1] >= PLACE_OFFLOAD) == (ch->in.offload != 0)) {
    /* stages ascend there, on each side of the offload: the one below failed */
    out->has_lower_zero = 1;
    if (plan_at(s, ch->in.micro_batch, rc, s->stages[k - 1], &out->lower_zero)) return -1;
  }
  return 0;
}

int st_memory_plan_fit(const st_plan_fit_query *q, st_plan_fit *out) {
  memset(out, 0, sizeof *out);
  const int N = q->base.world, G = q->global_batch, T = st_plan_seq_len(&q->base);
  const int U = ST_EXIT_USAGE;
  if (N < 1) return st_error_setc(U, "--ranks must be >= 1, got %d", N);
  if (G < 1) return st_error_setc(U, "--global-batch must be >= 1, got %d", G);
  if (G % N != 0)
    return st_error_setc(U, "--global-batch %d does not divide by %d ranks: every rank takes "
                            "the same number of sequences; use a multiple of %d", G, N, N);
  if (q->base.gpu_mem == 0)
    return st_error_setc(U, "choosing a configuration that fits needs the GPU memory: give "
                            "--gpu-mem SIZE (e.g. 80GiB), or run where a GPU is visible");
  search *s = calloc(1, sizeof *s);
  if (!s) return st_error_set("out of host memory");
  s->q = q;
  /* LoRA: ZeRO 3 and offload are not supported (rank/model/lora.h), so
   * neither is searched */
  const int lora = q->base.lora.rank > 0;
  const int z = q->base.zero_stage, nz = lora ? 3 : ST_PLAN_ZERO_STAGES;
  /* Offload is searched where it can help: on CUDA, when the stage is
   * searched too, after the on-device placements (a tie goes to the device);
   * given (--offload optimizer), it is kept. The CPU's "device" is host
   * memory already. */
  const int off_given = q->base.offload ? PLACE_OFFLOAD : 0;
  const int off_search =
      !off_given && !lora && q->search_zero && q->base.backend == ST_BACKEND_CUDA;
  /* --grad-dtype bf16 keeps its bf16 shard only at ZeRO 2/3 with one
   * micro-step a step (st_plan_grads_bf16): only those are candidates */
  const int g16 = q->base.grad_bf16, zmin = g16 ? 2 : 0;
  for (int o = off_given; o <= (off_search ? PLACE_OFFLOAD : off_given); o += PLACE_OFFLOAD) {
    if (q->search_zero == 1) {
      for (int k = zmin; k < nz; k++) s->stages[s->ns++] = o + k;
    } else if (q->search_zero == 2) { /* the given stage, then higher, then lower */
      for (int k = z; k < nz; k++) s->stages[s->ns++] = o + k;
      for (int k = z - 1; k >= zmin; k--) s->stages[s->ns++] = o + k;
    } else if (z >= zmin) {
      s->stages[s->ns++] = o + z;
    }
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
    if (all[i] <= bound && (int64_t)all[i] * T <= INT_MAX && (!g16 || all[i] == per_rank))
      s->batches[s->nb++] = all[i];
  int rc = 0;
  if (g16 && (s->ns == 0 || s->nb == 0))
    rc = st_error_setc(U, "--grad-dtype bf16 needs ZeRO 2 or 3 and one micro-step a step "
                          "(micro-batch %d = --global-batch %d / %d ranks); %s", per_rank, G, N,
                       s->ns == 0 ? "add --zero 2, or drop --grad-dtype"
                                  : "raise --micro-batch to it, or drop --grad-dtype");
  else if (s->nb == 0)
    rc = st_error_setc(U, "no micro-batch dividing %d sequences per rank is at most %d and keeps "
                          "B x --seq-len %d within the ops' 32-bit row count", per_rank, bound, T);
  else rc = fit_search(s, out);
  free(s);
  return rc;
}

void st_plan_choice_describe(const st_plan_choice *c, char *out, size_t cap) {
  char h[32];
  snprintf(out, cap, "micro-batch %d x grad-accum %d, recompute %s, ZeRO %d%s (cost %.2f): %s",
           c->in.micro_batch, c->accum, st_recompute_name(c->in.recompute), c->in.zero_stage,
           c->in.offload ? ", offload optimizer" : "", c->cost,
           st_format_bytes(c->plan.capped, h, sizeof h));
}

/* Append one line to out. */
static void line(char *out, size_t cap, const char *indent, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void line(char *out, size_t cap, const char *indent, const char *fmt, ...) {
  size_t len = strlen(out);
  if (len + 1 >= cap) return;
  int n = snprintf(out + len, cap - len, "%s%s", len ? "\n" : "", indent);
  if (n < 0 || (size_t)n >= cap - len) return;
  len += (size_t)n;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out + len, cap - len, fmt, ap);
  va_end(ap);
}

void st_plan_fit_explain(const st_plan_fit_query *q, const st_plan_fit *f, const char *indent,
                         char *out, size_t cap) {
  char h1[32], h2[32], h3[32];
  out[0] = 0;
  const int cuda = q->base.backend == ST_BACKEND_CUDA;
  if (q->order == ST_FIT_BY_COST && cuda)
    line(out, cap, indent, "rule: the lowest estimated step time that fits, cost = recompute "
         "factor (none 1.00, act 1.02, selective 1.03, full 1.20) x (1 + 410 / (micro-batch x seq-len)) "
         "for each micro-step's fixed overhead%s%s; ties to the larger micro-batch%s "
         "(docs/memory.md)",
         q->search_zero && !q->base.offload
             ? ", + the host step's time over the GPU's with --offload optimizer (searched)"
             : "",
         (q->search_zero || q->base.zero_stage == 3) && q->base.world > 1
             ? ", + ZeRO 3's block gathers (2 per block per micro-step at an assumed 100 GB/s) "
               "over the GPU's compute"
             : "",
         q->search_zero == 1 ? ", then the lower ZeRO stage" : "; ZeRO as given");
  else if (q->order == ST_FIT_BY_COST)
    line(out, cap, indent, "rule: the lowest estimated step time that fits, cost = recompute "
         "factor (none 1.00, act 1.02, selective 1.03, full 1.20); on the CPU a smaller micro-batch costs "
         "nothing extra; ties to the larger micro-batch%s (docs/memory.md)",
         q->search_zero == 1 ? ", then the lower ZeRO stage" : "; ZeRO as given");
  if (!f->found) return;
  const st_plan_choice *ch = &f->choice, *c;
  const int per_rank = q->global_batch / q->base.world;
  if (f->has_larger_batch) {
    c = &f->larger_batch;
    line(out, cap, indent, "micro-batch %d with recompute %s would cost %.2f but does not fit: "
         "%s at least (ZeRO %d), over by %s", c->in.micro_batch,
         st_recompute_name(c->in.recompute), c->cost,
         st_format_bytes(c->plan.capped, h1, sizeof h1), c->in.zero_stage,
         st_format_bytes((uint64_t)-c->plan.spare, h2, sizeof h2));
  } else {
    line(out, cap, indent, "micro-batch %d is the largest %s", ch->in.micro_batch,
         q->base.micro_batch > 0 && q->base.micro_batch < per_rank
             ? "allowed (--micro-batch bounds the search)"
             : "there is: all of a rank's sequences in one micro-step");
  }
  if (f->has_cheaper_recompute) {
    c = &f->cheaper_recompute;
    line(out, cap, indent, "recompute %s at micro-batch %d would cost %.2f but does not fit: %s "
         "at least (ZeRO %d), over by %s", st_recompute_name(c->in.recompute), c->in.micro_batch,
         c->cost, st_format_bytes(c->plan.capped, h1, sizeof h1), c->in.zero_stage,
         st_format_bytes((uint64_t)-c->plan.spare, h2, sizeof h2));
  }
  for (int r = q->base.recompute; r <= ST_RECOMPUTE_FULL; r++) {
    if (r == (int)ch->in.recompute) continue;
    if (f->has_alt[r]) {
      c = &f->alt[r];
      line(out, cap, indent, "recompute %s: the best that fits is micro-batch %d x grad-accum %d, "
           "ZeRO %d (%s), cost %.2f, %s %.2f", st_recompute_name((st_recompute)r),
           c->in.micro_batch, c->accum, c->in.zero_stage,
           st_format_bytes(c->plan.capped, h1, sizeof h1), c->cost,
           c->cost > ch->cost ? "more than" : "as much as (and ranks below)", ch->cost);
    } else if (f->has_least_with[r] &&
               !(f->has_cheaper_recompute && r == (int)ch->in.recompute - 1)) {
      c = &f->least_with[r];
      line(out, cap, indent, "recompute %s does not fit at any micro-batch: %s at least "
           "(micro-batch %d, ZeRO %d), over by %s", st_recompute_name((st_recompute)r),
           st_format_bytes(c->plan.capped, h1, sizeof h1), c->in.micro_batch, c->in.zero_stage,
           st_format_bytes((uint64_t)-c->plan.spare, h2, sizeof h2));
    }
  }
  if (f->has_lower_zero) {
    c = &f->lower_zero;
    line(out, cap, indent, "ZeRO %d%s does not fit: %s, over by %s", c->in.zero_stage,
         c->in.offload ? " with the optimizer offloaded" : "",
         st_format_bytes(c->plan.capped, h1, sizeof h1),
         st_format_bytes((uint64_t)-c->plan.spare, h2, sizeof h2));
  } else if (q->search_zero == 1) {
    line(out, cap, indent, "ZeRO %d is the lowest stage", ch->in.zero_stage);
  }
  if (ch->in.zero_stage == 3 && cuda && ch->in.world > 1) {
    const int64_t rows = (int64_t)ch->in.micro_batch * st_plan_seq_len(&ch->in);
    line(out, cap, indent, "ZeRO 3 adds %.2f to the cost (an estimate): each micro-step gathers "
         "every block's weights twice (forward, backward), %s per rank at an assumed 100 GB/s, "
         "against the GPU's work on %lld rows; it keeps %s of working weights per GPU instead "
         "of the whole %s", st_fit_zero3_cost(&ch->in, &ch->plan, rows),
         st_format_bytes((uint64_t)(2.0 * ((double)ch->plan.params -
                                           (double)ch->plan.weights_head /
                                               (double)st_dtype_size(ch->in.dtype)) *
                                    (double)st_dtype_size(ch->in.dtype) *
                                    (ch->in.world - 1) / ch->in.world),
                         h1, sizeof h1),
         (long long)rows, st_format_bytes(ch->plan.weights, h2, sizeof h2),
         st_format_bytes((uint64_t)ch->plan.padded_params * st_dtype_size(ch->in.dtype),
                         h3, sizeof h3));
  }
  if (ch->in.offload) {
    const int64_t tokens = (int64_t)ch->in.micro_batch * st_plan_seq_len(&ch->in) * ch->accum;
    line(out, cap, indent, "--offload optimizer adds %.2f to the cost: the host's AdamW and the "
         "copies of %s of state per step against the GPU's work on %lld tokens (%s of host "
         "memory)%s", st_fit_offload_cost(&ch->in, &ch->plan, tokens),
         st_format_bytes((uint64_t)ch->plan.shard * 12, h1, sizeof h1), (long long)tokens,
         st_format_bytes(ch->plan.host_total, h2, sizeof h2),
         q->base.offload ? " (as given)" : "; every placement on the GPU alone does not fit or "
         "costs more");
  }
}

static cJSON *choice_json(const st_plan_choice *c) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  cJSON_AddNumberToObject(j, "micro_batch", c->in.micro_batch);
  cJSON_AddNumberToObject(j, "grad_accum", c->accum);
  cJSON_AddStringToObject(j, "recompute", st_recompute_name(c->in.recompute));
  cJSON_AddNumberToObject(j, "zero", c->in.zero_stage);
  cJSON_AddStringToObject(j, "offload", c->in.offload ? "optimizer" : "none");
  cJSON_AddStringToObject(j, "grad_dtype", st_plan_grads_bf16(&c->in) ? "bf16" : "fp32");
  cJSON_AddNumberToObject(j, "cost", c->cost);
  cJSON_AddNumberToObject(j, "total", (double)c->plan.total);
  cJSON_AddNumberToObject(j, "spare", (double)c->plan.spare);
  cJSON_AddBoolToObject(j, "fits", c->plan.fits == 1);
  return j;
}

struct cJSON *st_plan_fit_cjson(const st_plan_fit_query *q, const st_plan_fit *f) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  cJSON_AddBoolToObject(j, "found", f->found);
  cJSON_AddBoolToObject(j, "zero_searched", q->search_zero == 1);
  cJSON_AddStringToObject(j, "order", q->order == ST_FIT_BY_COST ? "cost" : "nearest");
  cJSON_AddNumberToObject(j, "gpu_mem", (double)q->base.gpu_mem);
  cJSON_AddNumberToObject(j, "headroom_pct", q->base.headroom_pct);
  const st_plan_choice *ch = f->found ? &f->choice : &f->least;
  cJSON_AddNumberToObject(j, "usable", (double)ch->plan.usable);
  if (f->found) cJSON_AddItemToObject(j, "choice", choice_json(&f->choice));
  else cJSON_AddItemToObject(j, "least", choice_json(&f->least));
  if (f->has_larger_batch) cJSON_AddItemToObject(j, "larger_batch", choice_json(&f->larger_batch));
  if (f->has_cheaper_recompute)
    cJSON_AddItemToObject(j, "cheaper_recompute", choice_json(&f->cheaper_recompute));
  if (f->has_lower_zero) cJSON_AddItemToObject(j, "lower_zero", choice_json(&f->lower_zero));
  cJSON *alts = cJSON_AddArrayToObject(j, "alternatives");
  for (int r = 0; r < 3; r++)
    if (f->has_alt[r]) cJSON_AddItemToArray(alts, choice_json(&f->alt[r]));
  return j;
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
  if (from->offload != to->offload)
    ADD("--offload %s -> %s", from->offload ? "optimizer" : "none",
        to->offload ? "optimizer" : "none");
#undef ADD
}

int st_plan_attention_least_group(const st_plan_input *in, int asked) {
  return asked ? 1
               : st_attention_cudnn_min_group(in->micro_batch, st_plan_seq_len(in),
                                              in->model.n_head);
}

int st_plan_attention_groups(const st_plan_input *in, uint64_t ws_per_seq, int least,
                             st_memory_plan *with, int *group) {
  memset(with, 0, sizeof *with);
  *group = 0;
  if (!ws_per_seq || !in->gpu_mem) return 0;
  st_plan_input c = *in;
  c.attn_workspace_per_seq = ws_per_seq;
  c.attn_group = 0;
  if (st_memory_plan_make(&c, with)) return -1;
  if (with->fits == 1) return 1;
  /* smaller groups, largest first: each extra call costs a little speed */
  const int B = in->micro_batch, whole = st_attention_cudnn_group(B, 0);
  for (int g = whole - 1; g >= (least > 1 ? least : 1); g--) {
    if (B % g != 0) continue;
    c.attn_group = g;
    if (st_memory_plan_make(&c, with)) return -1;
    if (with->fits == 1) {
      *group = g;
      return 1;
    }
  }
  return 0;
}
