/* memory_fit.h - choosing micro-batch, gradient accumulation, recompute
 * policy and (when allowed) ZeRO stage for a global batch so that the memory
 * plan (rank/memory/memory_plan.h) fits a GPU less a headroom.
 *
 * One search serves `shardtrain plan --fit`, `shardtrain train --auto-fit`
 * and train's pre-flight message, so they cannot disagree: plan and train
 * build the query with st_fit_query_make from the same flags and call
 * st_memory_plan_fit. The rule (docs/memory.md, "Choosing by cost") ranks
 * candidates by an estimated step time, not by micro-batch first. */
#ifndef ST_MEMORY_FIT_H
#define ST_MEMORY_FIT_H

#include "rank/memory/memory_plan.h"

/* One candidate configuration and its plan. */
typedef struct {
  st_plan_input in;
  int accum;              /* gradient accumulation steps */
  double cost;            /* st_fit_cost of (backend, micro-batch x T, recompute) */
  st_memory_plan plan;
} st_plan_choice;

typedef enum {
  /* plan --fit, train --auto-fit: the lowest estimated step time (st_fit_cost);
   * ties go to the larger micro-batch, then the cheaper recompute policy,
   * then the ZeRO stage earlier in search_zero's order. */
  ST_FIT_BY_COST = 0,
  /* train's pre-flight suggestion: the smallest change from the run's own
   * settings, i.e. the largest micro-batch, then the cheapest recompute, then
   * the stage earlier in search_zero's order; cost is not looked at. */
  ST_FIT_NEAREST = 1
} st_fit_order;

typedef struct {
  st_plan_input base;     /* model, world, dtype, backend, NCCL, gpu_mem (required), headroom;
                           * micro_batch: the largest to try (0 = any);
                           * recompute: the cheapest to try;
                           * zero_stage: kept unless search_zero */
  int global_batch;       /* sequences per optimizer step; must divide by world */
  int search_zero;        /* 0: only base.zero_stage; 1: any of 0 .. 3, lowest first;
                           * 2: base.zero_stage first, then higher, then lower (the smallest
                           * change from a given stage, for train's pre-flight) */
  st_fit_order order;
} st_plan_fit_query;

typedef struct {
  int found;
  st_plan_choice choice;
  /* Why not better. Each is a candidate the order ranks above the choice,
   * so it does not fit; given with the least memory over the allowed ZeRO
   * stages. larger_batch: the next larger micro-batch at the chosen
   * recompute policy; cheaper_recompute: the next cheaper policy at the
   * chosen micro-batch; lower_zero (search_zero 1 only): the next lower
   * stage at the chosen micro-batch and policy. */
  int has_larger_batch, has_cheaper_recompute, has_lower_zero;
  st_plan_choice larger_batch, cheaper_recompute, lower_zero;
  /* For every other allowed recompute policy, the best-ranked candidate
   * with it that fits (it ranks below the choice: it costs more, or as
   * much); has_alt[r] is 0 when nothing with policy r fits. */
  int has_alt[ST_RECOMPUTE_POLICIES];
  st_plan_choice alt[ST_RECOMPUTE_POLICIES];
  /* For every allowed policy, the least memory it needs at any allowed
   * micro-batch and stage (what "does not fit at all" is measured by). */
  int has_least_with[ST_RECOMPUTE_POLICIES];
  st_plan_choice least_with[ST_RECOMPUTE_POLICIES];
  /* The candidate that needs the least memory (meaningful when !found). */
  st_plan_choice least;
  int candidates;         /* how many (micro-batch, recompute, stage) were planned */
} st_plan_fit;

/* Estimated time of one optimizer step, relative to an ideal GPU step with
 * no recompute and no per-micro-step overhead; dimensionless, >= 1.
 * cost = recompute factor x (1 + R0 / (micro_batch x seq_len)), with the
 * recompute factor 1.00 (none), 1.02 (act: the MLP activation rerun),
 * 1.03 (selective: the norms and the activation rerun), 1.20
 * (full: the block's forward up to the down projection again), and R0 the
 * fixed work of a micro-step in rows: 410 on CUDA (kernel launches and
 * weight reads, 5% of a step at 8 sequences of 1024 tokens), 0 on the CPU
 * (no launch latency; its time is proportional to the rows). */
double st_fit_cost(st_backend backend, int64_t rows, st_recompute recompute);

/* The cost --offload optimizer adds to a candidate's st_fit_cost: the
 * host part of its optimizer step (the copies over PCIe or the host AdamW,
 * whichever is slower; they overlap) over the ideal GPU time of its
 * `tokens` per optimizer step per rank (6 x params FLOPs a token at
 * FIT_GPU_FLOPS). 0 without offload. p: in's plan (params, shard). */
double st_fit_offload_cost(const st_plan_input *in, const st_memory_plan *p, int64_t tokens);

/* The cost ZeRO 3 adds to a candidate's st_fit_cost, an ESTIMATE: each
 * micro-step all-gathers every block's working weights twice (before its
 * forward and its backward), each rank receiving (N-1)/N of them, at an
 * assumed 100 GB/s per GPU (FIT_LINK_BPS), over the ideal GPU time of the
 * micro-step's `rows` (6 x params FLOPs a row at FIT_GPU_FLOPS). The
 * gathers are counted as if none were hidden behind the previous block's
 * compute, so stage 3 is taken where it is needed to fit rather than on a
 * tie. 0 below stage 3, on one rank, and on the CPU (whose cost has no
 * GPU time to compare with: there the lower stage wins a tie). */
double st_fit_zero3_cost(const st_plan_input *in, const st_memory_plan *p, int64_t rows);

/* The query plan --fit and train --auto-fit both make from flags:
 * in (model, world, dtype, backend, NCCL, gpu_mem, headroom; its micro_batch,
 * recompute and zero_stage are ignored), micro_batch_max (--micro-batch when
 * given, else 0: any), recompute_min (--recompute when given, else none),
 * zero_stage (kept when !search_zero), search_zero (1: choose the stage). */
void st_fit_query_make(const st_plan_input *in, int global_batch, int micro_batch_max,
                       st_recompute recompute_min, int zero_stage, int search_zero,
                       st_plan_fit_query *q);

/* Plan every candidate: each micro-batch B dividing global_batch / world
 * (at most base.micro_batch when set; accumulation = global_batch /
 * (B x world)), each recompute policy from base.recompute up, each allowed
 * ZeRO stage; the best-ranked one in q->order that fits gpu_mem less the
 * headroom wins. 0 with out->found 0 or 1; -1 with st_error (ST_EXIT_USAGE)
 * for bad input (global batch not dividing by the ranks, gpu_mem 0). */
int st_memory_plan_fit(const st_plan_fit_query *q, st_plan_fit *out);

/* "micro-batch 16 x grad-accum 2, recompute full, ZeRO 0 (cost 1.35): 21.69 GiB" */
void st_plan_choice_describe(const st_plan_choice *c, char *out, size_t cap);

/* The reasons the choice is the best that fits, one line each, "\n"
 * separated, each starting with indent: the cheaper candidates that do not
 * fit (with what they need and by how much they are over) and the other
 * policies that do fit but cost more. For plan --fit and train --auto-fit. */
void st_plan_fit_explain(const st_plan_fit_query *q, const st_plan_fit *f, const char *indent,
                         char *out, size_t cap);

/* The choice and its reasons as a cJSON object (cJSON_Delete it): found,
 * zero_searched, order, choice or least, larger_batch, cheaper_recompute,
 * lower_zero, alternatives; each candidate with micro_batch, grad_accum,
 * recompute, zero, cost, total, spare, fits. NULL when out of memory. */
struct cJSON *st_plan_fit_cjson(const st_plan_fit_query *q, const st_plan_fit *f);

/* "--micro-batch 32 -> 8 (gradient accumulation 1 -> 4), --recompute none
 * -> selective, --zero 1 -> 2"; "" when nothing differs. */
void st_plan_describe_change(const st_plan_input *from, const st_plan_input *to,
                             int global_batch, char *out, size_t cap);

/* cuDNN's attention workspace against the budget (docs/memory.md,
 * "Attention memory"), the rule train and plan both apply. cuDNN's fused
 * attention is faster than ours (ours runs at 0.65x its speed at GPT-2
 * 124M, docs/benchmarks.md) but its deterministic backward keeps a
 * workspace of heads x T^2 x 2 bytes per sequence of a call
 * (st_plan_cudnn_attention_per_seq), while ours is O(T). So it is taken
 * only where it displaces nothing: `in` is the configuration chosen without
 * any attention workspace (its gpu_mem the budget); cuDNN is taken when
 * that same configuration plus the workspace of one call for the whole
 * micro-batch still fits, else of one call for the largest group of
 * sequences that fits, down to `least` sequences (each extra call costs a
 * little speed; kernels/attention_choice.h): --attention auto passes
 * st_attention_cudnn_min_group, --attention cudnn 1; least < 1 counts as
 * 1. Returns 1 (cuDNN; *with is that plan, *group the group cap, 0 for the
 * whole micro-batch), 0 (ws_per_seq is 0, there is no budget, or no group
 * fits; *group 0, *with the last plan tried), or -1 with st_error. */
int st_plan_attention_groups(const st_plan_input *in, uint64_t ws_per_seq, int least,
                             st_memory_plan *with, int *group);

/* The `least` of st_plan_attention_groups for in's micro-batch, sequence
 * length and heads: 1 when cuDNN was asked for (--attention cudnn: asked
 * 1), else st_attention_cudnn_min_group (auto: below it ours costs less).
 * plan and train's pre-flight both take it from here, so they agree. */
int st_plan_attention_least_group(const st_plan_input *in, int asked);

#endif
