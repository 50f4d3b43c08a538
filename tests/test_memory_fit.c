/* test_memory_fit.c - the --fit search (rank/memory/memory_fit.c): which
 * micro-batch, recompute policy and ZeRO stage fit a GPU less a headroom,
 * over the byte counts test_memory_plan.c checks.
 *
 * 1. The cost rule's numbers (docs/memory.md, "Choosing by cost").
 * 2. --fit on 24 GiB GPUs at T=2048, global batch 32: GPT-2 774M and 1558M
 *    in bf16 on 1 and 8 ranks; the choice fits and every candidate the
 *    order ranks above it (lower estimated cost first) does not; the
 *    pre-flight's nearest-change order keeps the given stage.
 * 3. ZeRO 3's gather cost and llama-3.1-8b on 8 x 40 GiB, which fits only
 *    at stage 3.
 * 4. Bad queries name the flag; the change descriptions the pre-flight
 *    prints.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "rank/memory/memory_fit.h"
#include "rank/memory/memory_plan.h"
#include "util/error.h"
#include "tests/memory_plan_fixtures.h"

/* ---- --fit ---- */
static void check_fit_contract(const st_plan_fit *f);
static void check_fit_is_first(const st_plan_fit_query *q, const st_plan_fit *f);
static st_plan_fit_query fit_query(const char *preset, int world, int search_zero) {
  st_plan_fit_query q;
  memset(&q, 0, sizeof q);
  assert_int_equal(st_model_preset(preset, &q.base.model), 0);
  q.base.model.block_size = 2048;
  q.base.model.vocab_size = 50257;
  assert_int_equal(st_model_validate(&q.base.model), 0);
  q.base.world = world;
  q.base.dtype = ST_BF16;
  q.base.backend = ST_BACKEND_CUDA;
  q.base.recompute = ST_RECOMPUTE_NONE;
  q.base.gpu_mem = 24ULL << 30;
  q.base.headroom_pct = 5;
  q.global_batch = 32;
  q.search_zero = search_zero;
  return q;
}

/* The search's contract: the choice fits; each next-better choice (which
 * the search reports with the least memory it could take) does not. */
static void check_fit_contract(const st_plan_fit *f) {
  assert_true(f->found);
  assert_int_equal(f->choice.plan.fits, 1);
  assert_true(f->choice.plan.total <= f->choice.plan.usable);
  if (f->has_larger_batch) {
    assert_int_equal(f->larger_batch.plan.fits, 0);
    assert_true(f->larger_batch.in.micro_batch > f->choice.in.micro_batch);
  }
  if (f->has_cheaper_recompute) {
    assert_int_equal(f->cheaper_recompute.plan.fits, 0);
    assert_true(f->cheaper_recompute.in.recompute < f->choice.in.recompute);
  }
  if (f->has_lower_zero) {
    assert_int_equal(f->lower_zero.plan.fits, 0);
    assert_true(f->lower_zero.in.zero_stage < f->choice.in.zero_stage);
  }
}

/* The order st_memory_plan_fit ranks by, written again from memory_fit.h:
 * 1 when (B, r, z) ranks above the choice. */
static int ranks_above(const st_plan_fit_query *q, const st_plan_choice *ch, int B, int r, int z,
                       const st_plan_input *in, const st_memory_plan *p) {
  const int T = st_plan_seq_len(&q->base);
  if (q->order == ST_FIT_BY_COST) {
    const double c = st_fit_cost(q->base.backend, (int64_t)B * T, (st_recompute)r) +
                     st_fit_zero3_cost(in, p, (int64_t)B * T);
    if (c != ch->cost) return c < ch->cost;
  }
  if (B != ch->in.micro_batch) return B > ch->in.micro_batch;
  if (r != (int)ch->in.recompute) return r < (int)ch->in.recompute;
  return z < ch->in.zero_stage; /* search_zero 0 or 1 here: stages ascend */
}

/* Exhaustive check of the preference order on one query: no candidate that
 * the order ranks above the choice fits. */
static void check_fit_is_first(const st_plan_fit_query *q, const st_plan_fit *f) {
  const int per_rank = q->global_batch / q->base.world;
  for (int B = per_rank; B >= 1; B--) {
    if (per_rank % B) continue;
    for (int r = q->base.recompute; r <= 2; r++)
      for (int z = q->search_zero ? 0 : q->base.zero_stage;
           z <= (q->search_zero ? ST_PLAN_ZERO_STAGES - 1 : q->base.zero_stage); z++) {
        st_plan_input in = q->base;
        in.micro_batch = B;
        in.recompute = (st_recompute)r;
        in.zero_stage = z;
        st_memory_plan p;
        assert_int_equal(st_memory_plan_make(&in, &p), 0);
        const int better = f->found && ranks_above(q, &f->choice, B, r, z, &in, &p);
        if (better) assert_int_equal(p.fits, 0);
        if (!f->found) assert_int_equal(p.fits, 0);
        if (!f->found) assert_true(p.total >= f->least.plan.total);
      }
  }
}

/* The cost rule's numbers (docs/memory.md, "Choosing by cost"). */
static void test_fit_cost(void **state) {
  (void)state;
  const double eps = 1e-12;
  assert_true(fabs(st_fit_cost(ST_BACKEND_CUDA, 8192, ST_RECOMPUTE_NONE) - 1.05) < 0.001);
  assert_true(fabs(st_fit_cost(ST_BACKEND_CUDA, 1024, ST_RECOMPUTE_NONE) - 1.40) < 0.001);
  assert_true(fabs(st_fit_cost(ST_BACKEND_CPU, 256, ST_RECOMPUTE_SELECTIVE) - 1.03) < eps);
  assert_true(fabs(st_fit_cost(ST_BACKEND_CPU, 1, ST_RECOMPUTE_FULL) - 1.20) < eps);
  /* On a GPU at T = 1024, halving 8 sequences to 4 costs less than full
   * recompute, more than selective; full only beats one sequence barely. */
  const double n4 = st_fit_cost(ST_BACKEND_CUDA, 4096, ST_RECOMPUTE_NONE);
  assert_true(n4 < st_fit_cost(ST_BACKEND_CUDA, 8192, ST_RECOMPUTE_FULL));
  assert_true(n4 > st_fit_cost(ST_BACKEND_CUDA, 8192, ST_RECOMPUTE_SELECTIVE));
  assert_true(st_fit_cost(ST_BACKEND_CUDA, 1024, ST_RECOMPUTE_NONE) >
              st_fit_cost(ST_BACKEND_CUDA, 32768, ST_RECOMPUTE_FULL));
}

static void test_fit_774m(void **state) {
  (void)state;
  st_plan_fit f;
  /* 1 rank: 16 bytes x 775.4 M parameters = 11.6 GiB before activations
   * (the bf16 master split: 2 of them), of 22.8 GiB usable (24 GiB less 5%),
   * and 541 MiB of context (no NCCL communicator). Without recompute one sequence
   * at T=2048 keeps 36 layers x 16 [T,C] bf16 tensors (2048 x 1280 x 2 x 16
   * = 84 MB per layer): 3.0 GB. The logits are one LM-head chunk whatever
   * the batch: all 2,048 rows (206 MB) of one sequence, 2,560 rows (258 MB)
   * from two on, 4,096 (412 MB, inside backward's larger scratch) from 16 on. So 2 sequences fit (6.0 GiB of activations, 20.5 GiB in
   * all) and 4 do not (11.8 GiB, 26.5). act keeps 12 per layer (63 MB):
   * 4 sequences fit (8.8 GiB, 21.0), 8 do not (29.6). Selective keeps 10
   * (52 MB) and fits 4 too (19.6) but not 8 (26.8). Full recompute keeps
   * 1 [T,C] per layer (5.2 MB) and the logits one chunk: 32 sequences fit
   * (22.4 GiB in all). By cost, 4 sequences with act (8192 rows: 1.07)
   * beat the same with selective (1.08), 2 without recompute (4096 rows:
   * 1.10) and 32 with full recompute (1.21). */
  st_plan_fit_query q = fit_query("gpt2-774m", 1, 1);
  assert_int_equal(st_memory_plan_fit(&q, &f), 0);
  check_fit_contract(&f);
  check_fit_is_first(&q, &f);
  assert_int_equal(f.choice.in.micro_batch, 4);
  assert_int_equal(f.choice.accum, 8);
  assert_int_equal(f.choice.in.recompute, ST_RECOMPUTE_ACT);
  assert_int_equal(f.choice.in.zero_stage, 0); /* on one rank ZeRO 1/2 only add a shard */
  assert_true(f.has_larger_batch && f.has_cheaper_recompute && !f.has_lower_zero);
  assert_int_equal(f.larger_batch.in.micro_batch, 8);
  assert_int_equal(f.larger_batch.in.recompute, ST_RECOMPUTE_ACT);
  assert_int_equal(f.cheaper_recompute.in.recompute, ST_RECOMPUTE_NONE);
  assert_int_equal(f.cheaper_recompute.in.micro_batch, 4);
  assert_true(!f.has_alt[ST_RECOMPUTE_ACT]);
  assert_true(f.has_alt[ST_RECOMPUTE_SELECTIVE]);
  assert_int_equal(f.alt[ST_RECOMPUTE_SELECTIVE].in.micro_batch, 4);
  assert_true(f.alt[ST_RECOMPUTE_SELECTIVE].cost > f.choice.cost);
  assert_true(f.alt[ST_RECOMPUTE_SELECTIVE].plan.total < f.choice.plan.total);
  assert_true(f.has_alt[ST_RECOMPUTE_NONE] && f.has_alt[ST_RECOMPUTE_FULL]);
  assert_int_equal(f.alt[ST_RECOMPUTE_FULL].in.micro_batch, 32);
  assert_int_equal(f.alt[ST_RECOMPUTE_FULL].accum, 1);
  assert_int_equal(f.alt[ST_RECOMPUTE_FULL].plan.fits, 1);
  assert_true(f.alt[ST_RECOMPUTE_FULL].cost > f.choice.cost);
  assert_int_equal(f.alt[ST_RECOMPUTE_NONE].in.micro_batch, 2);
  assert_true(f.alt[ST_RECOMPUTE_NONE].cost > f.choice.cost);

  /* The pre-flight's nearest-change order still ranks the micro-batch
   * first: 32 sequences with full recompute. */
  q.order = ST_FIT_NEAREST;
  assert_int_equal(st_memory_plan_fit(&q, &f), 0);
  check_fit_contract(&f);
  check_fit_is_first(&q, &f);
  assert_int_equal(f.choice.in.micro_batch, 32);
  assert_int_equal(f.choice.in.recompute, ST_RECOMPUTE_FULL);
  assert_true(f.has_alt[ST_RECOMPUTE_NONE]);
  assert_int_equal(f.alt[ST_RECOMPUTE_NONE].in.micro_batch, 2);

  /* 8 ranks: 4 sequences per rank at most. ZeRO 1 divides the 10 bytes of
   * the master's rests, m and v and the 4 of the gradient shard by 8 (under
   * 8 bytes per parameter in all), leaving room for 4 sequences without
   * recompute (11.8 GiB of activations); ZeRO 0's 11.6 GiB does not. */
  q = fit_query("gpt2-774m", 8, 1);
  assert_int_equal(st_memory_plan_fit(&q, &f), 0);
  check_fit_contract(&f);
  check_fit_is_first(&q, &f);
  assert_int_equal(f.choice.in.micro_batch, 4);
  assert_int_equal(f.choice.accum, 1);
  assert_int_equal(f.choice.in.recompute, ST_RECOMPUTE_NONE);
  assert_int_equal(f.choice.in.zero_stage, 1);
  assert_true(!f.has_larger_batch && !f.has_cheaper_recompute && f.has_lower_zero);
  assert_int_equal(f.lower_zero.in.zero_stage, 0);

  /* --zero 0 given: the stage is kept and the batch or recompute gives way. */
  q = fit_query("gpt2-774m", 8, 0);
  q.base.zero_stage = 0;
  assert_int_equal(st_memory_plan_fit(&q, &f), 0);
  check_fit_contract(&f);
  check_fit_is_first(&q, &f);
  assert_int_equal(f.choice.in.zero_stage, 0);
  assert_true(f.choice.in.micro_batch < 4 || f.choice.in.recompute != ST_RECOMPUTE_NONE);
}

static void test_fit_1558m(void **state) {
  (void)state;
  st_plan_fit f;
  /* 1 rank: 16 bytes x 1.56 G parameters = 23.2 GiB > 22.8 GiB usable: no
   * micro-batch or recompute fits at the given ZeRO 0 (ZeRO 1/2 on one rank
   * add the shard), and offload is searched only with the stage. */
  st_plan_fit_query q = fit_query("gpt2-1558m", 1, 0);
  assert_int_equal(st_memory_plan_fit(&q, &f), 0);
  assert_int_equal(f.found, 0);
  check_fit_is_first(&q, &f);
  assert_int_equal(f.least.in.micro_batch, 1);
  assert_int_equal(f.least.in.recompute, ST_RECOMPUTE_FULL);
  assert_int_equal(f.least.in.zero_stage, 0);
  assert_true(f.least.plan.weights + f.least.plan.grads + f.least.plan.master +
                  f.least.plan.adam_m + f.least.plan.adam_v >
              f.least.plan.usable);

  /* With the stage searched, the optimizer goes to the host: master, m and
   * v (12 bytes per parameter, 17.4 GiB) leave the GPU, which keeps the
   * working weights and fp32 gradients (6 bytes, 8.7 GiB) and activations. */
  q = fit_query("gpt2-1558m", 1, 1);
  assert_int_equal(st_memory_plan_fit(&q, &f), 0);
  check_fit_contract(&f);
  check_fit_is_first(&q, &f);
  assert_int_equal(f.choice.in.offload, 1);
  assert_int_equal(f.choice.plan.master + f.choice.plan.adam_m + f.choice.plan.adam_v, 0);
  assert_true(f.choice.plan.host_total >= 12 * (uint64_t)f.choice.plan.shard);
  assert_true(f.choice.cost > st_fit_cost(ST_BACKEND_CUDA, (int64_t)f.choice.in.micro_batch * 2048,
                                          f.choice.in.recompute));
  /* on the CPU backend the "device" is host memory: offload is no way out */
  q.base.backend = ST_BACKEND_CPU;
  q.base.dtype = ST_FP32;
  assert_int_equal(st_memory_plan_fit(&q, &f), 0);
  assert_true(!f.found || !f.choice.in.offload);

  /* 8 ranks, 4 sequences per rank at most. Model and optimizer state per
   * rank: ZeRO 0 18 bytes per parameter (26.1 GiB, never fits), ZeRO 1
   * 2 + 4 + 16/8 = 8 (11.6 GiB), ZeRO 2 2 + 16/8 plus buckets (6.9 GiB).
   * Activations of 4 sequences: 19.4 GiB without recompute, 12.5 GiB
   * selective, 2.1 GiB full (48 layers x 1 [T,C] + one shared block), each
   * with one LM-head chunk of 2,560 rows (246 MiB; the whole 8,192 rows
   * were 786 MiB); and 2.6 GiB of cuBLASLt and cuDNN workspace, scratch,
   * NCCL and context. At micro-batch 4 selective fits at ZeRO 2
   * (6.9 + 12.5 + 2.6 = 22.0 GiB; cost 1.08) but not at ZeRO 1 (26.7 GiB);
   * act (14.4 GiB of activations) fits at ZeRO 2 too (22.35 GiB in all),
   * costs less (1.07), and is chosen; both beat 2 sequences without
   * recompute (cost 1.10, at ZeRO 1 since the backward scratch moved into
   * the logits chunk; 4 take 28.9 GiB even at ZeRO 2) and 4 with full
   * recompute at ZeRO 1 (1.40). */
  q = fit_query("gpt2-1558m", 8, 1);
  assert_int_equal(st_memory_plan_fit(&q, &f), 0);
  check_fit_contract(&f);
  check_fit_is_first(&q, &f);
  assert_int_equal(f.choice.in.micro_batch, 4);
  assert_int_equal(f.choice.in.recompute, ST_RECOMPUTE_ACT);
  assert_int_equal(f.choice.in.zero_stage, 2);
  assert_true(!f.has_larger_batch && f.has_cheaper_recompute && f.has_lower_zero);
  assert_int_equal(f.lower_zero.in.zero_stage, 1);
  assert_true(f.has_alt[ST_RECOMPUTE_SELECTIVE]);
  assert_int_equal(f.alt[ST_RECOMPUTE_SELECTIVE].in.micro_batch, 4);
  assert_int_equal(f.alt[ST_RECOMPUTE_SELECTIVE].in.zero_stage, 2);
  assert_true(f.has_alt[ST_RECOMPUTE_NONE] && f.has_alt[ST_RECOMPUTE_FULL]);
  assert_int_equal(f.alt[ST_RECOMPUTE_NONE].in.micro_batch, 2);
  assert_int_equal(f.alt[ST_RECOMPUTE_NONE].in.zero_stage, 1);
  assert_int_equal(f.alt[ST_RECOMPUTE_FULL].in.micro_batch, 4);
  assert_int_equal(f.alt[ST_RECOMPUTE_FULL].in.zero_stage, 1);
}

/* search_zero 2 (train's pre-flight): the given stage first, then higher,
 * then lower, so the suggestion changes as little as it can. */
static void test_fit_keeps_given_stage(void **state) {
  (void)state;
  st_plan_fit f;
  st_memory_plan p0, p1, p2;
  st_plan_input in = gpt2_124m(2, 0, ST_RECOMPUTE_NONE);
  assert_int_equal(st_memory_plan_make(&in, &p0), 0);
  in.zero_stage = 1;
  assert_int_equal(st_memory_plan_make(&in, &p1), 0);
  in.zero_stage = 2;
  assert_int_equal(st_memory_plan_make(&in, &p2), 0);
  /* 2 ranks: ZeRO 2 < 1 < 0. A GPU between ZeRO 2 and 1 at micro-batch 32:
   * from --zero 1, raise to 2 and keep batch and recompute. */
  assert_true(p2.total < p1.total && p1.total < p0.total);
  st_plan_fit_query q;
  memset(&q, 0, sizeof q);
  q.base = gpt2_124m(2, 1, ST_RECOMPUTE_NONE);
  q.base.gpu_mem = (p2.total + p1.total) / 2;
  q.global_batch = 64;
  q.search_zero = 2;
  q.order = ST_FIT_NEAREST; /* as the pre-flight asks */
  assert_int_equal(st_memory_plan_fit(&q, &f), 0);
  check_fit_contract(&f);
  assert_int_equal(f.choice.in.micro_batch, 32);
  assert_int_equal(f.choice.in.recompute, ST_RECOMPUTE_NONE);
  assert_int_equal(f.choice.in.zero_stage, 2);
  /* With room for ZeRO 0 too, the given stage 1 is kept, not lowered. */
  q.base.gpu_mem = p0.total + 1;
  assert_int_equal(st_memory_plan_fit(&q, &f), 0);
  assert_int_equal(f.choice.in.zero_stage, 1);
  /* 1 rank: ZeRO 1 reduces in place, so it costs what ZeRO 0 does; ZeRO 2
   * keeps its buckets and shard and costs more. Between ZeRO 0 and 2, from
   * --zero 2: 2 fails, then 1 (the given stage's nearest lower one). */
  in = gpt2_124m(1, 0, ST_RECOMPUTE_NONE);
  assert_int_equal(st_memory_plan_make(&in, &p0), 0);
  in.zero_stage = 1;

  assert_int_equal(st_memory_plan_make(&in, &p1), 0);
  assert_int_equal(p1.total, p0.total);
  assert_int_equal(p1.grad_shard, 0);
  in.zero_stage = 2;
  in.accum = 1; /* the search's candidate: micro-batch 32 of global batch 32 */
  assert_int_equal(st_memory_plan_make(&in, &p2), 0);
  assert_true(p0.total < p2.total);
  q.base = gpt2_124m(1, 2, ST_RECOMPUTE_NONE);
  q.base.gpu_mem = (p0.total + p2.total) / 2;
  q.global_batch = 32;
  assert_int_equal(st_memory_plan_fit(&q, &f), 0);
  assert_int_equal(f.choice.in.micro_batch, 32);
  assert_true(f.choice.in.zero_stage < 2);
  char s[256];
  st_plan_describe_change(&q.base, &f.choice.in, 32, s, sizeof s);
  assert_true(strncmp(s, "--zero 2 -> ", 12) == 0);
}

/* ZeRO 3's cost term (docs/memory.md, "Choosing by cost") and a model
 * that fits only there: llama-3.1-8b on 8 ranks of 40 GiB, bf16, T=2048. */
static void test_fit_zero3(void **state) {
  (void)state;
  st_plan_fit_query q = fit_query("llama-3.1-8b", 8, 1);
  /* the real model (fit_query sets GPT-2's vocabulary and 2048 positions) */
  assert_int_equal(st_model_preset("llama-3.1-8b", &q.base.model), 0);
  assert_int_equal(st_model_validate(&q.base.model), 0);
  q.base.seq_len = 2048;
  q.base.gpu_mem = 40ULL << 30;
  st_plan_fit f;
  assert_int_equal(st_memory_plan_fit(&q, &f), 0);
  check_fit_contract(&f);
  check_fit_is_first(&q, &f);
  const st_plan_choice *ch = &f.choice;
  assert_int_equal(ch->in.zero_stage, 3);
  assert_int_equal(ch->in.offload, 0);
  assert_int_equal(ch->in.micro_batch, 4);
  assert_int_equal(ch->in.recompute, ST_RECOMPUTE_FULL);
  assert_true(f.has_lower_zero && f.lower_zero.in.zero_stage == 2 && !f.lower_zero.plan.fits);
  /* 2 gathers of the block weights (P less the head, 2 bytes each), 7/8 of
   * them received, at 100 GB/s, over 6 P FLOPs a row of 8,192 rows at
   * 4e14 FLOP/s */
  const double P = (double)ch->plan.params, head = (double)ch->plan.weights_head / 2.0;
  const double want = 2.0 * (P - head) * 2.0 * 7.0 / 8.0 / 1e11 / (6.0 * P * 8192.0 / 4e14);
  const double got = st_fit_zero3_cost(&ch->in, &ch->plan, 8192);
  assert_true(fabs(got - want) < 1e-9);
  assert_true(fabs(ch->cost - (st_fit_cost(ST_BACKEND_CUDA, 8192, ST_RECOMPUTE_FULL) + got)) <
              1e-12);
  assert_true(got > 0.2 && got < 0.3);
  /* no term below stage 3, on one rank, or on the CPU */
  st_plan_input in = ch->in;
  in.zero_stage = 2;
  assert_true(st_fit_zero3_cost(&in, &ch->plan, 8192) == 0.0);
  in = ch->in;
  in.world = 1;
  assert_true(st_fit_zero3_cost(&in, &ch->plan, 8192) == 0.0);
  in = ch->in;
  in.backend = ST_BACKEND_CPU;
  assert_true(st_fit_zero3_cost(&in, &ch->plan, 8192) == 0.0);
  /* with room for ZeRO 2 the gathers' cost keeps stage 3 out */
  q.base.gpu_mem = 80ULL << 30;
  assert_int_equal(st_memory_plan_fit(&q, &f), 0);
  check_fit_contract(&f);
  assert_int_equal(f.choice.in.zero_stage, 2);
}

/* LoRA (rank/model/lora.h): the search never tries ZeRO 3 or --offload,
 * which the planner refuses with LoRA (it used to, and the whole search
 * failed on that refusal); where only those would fit the full model, the
 * frozen base's small state fits at a stage of 0 .. 2. */
static void test_fit_lora(void **state) {
  (void)state;
  st_plan_fit_query q = fit_query("llama-3.1-8b", 8, 1);
  assert_int_equal(st_model_preset("llama-3.1-8b", &q.base.model), 0);
  assert_int_equal(st_model_validate(&q.base.model), 0);
  q.base.seq_len = 2048;
  q.base.gpu_mem = 40ULL << 30;
  assert_int_equal(st_lora_parse("16,targets=q,k,v,o", &q.base.lora), 0);
  assert_int_equal(st_lora_resolve(&q.base.lora, &q.base.model), 0);
  st_plan_fit f;
  assert_int_equal(st_memory_plan_fit(&q, &f), 0);
  check_fit_contract(&f);
  assert_true(f.found);
  assert_true(f.choice.in.zero_stage <= 2 && !f.choice.in.offload);
  assert_true(f.choice.plan.fits == 1);
  assert_int_equal(f.choice.plan.base_params, st_model_num_params(&q.base.model));
}

static void test_fit_errors(void **state) {
  (void)state;
  st_plan_fit f;
  st_plan_fit_query q = fit_query("gpt2-124m", 3, 1);
  q.global_batch = 32; /* not a multiple of 3 */
  assert_int_equal(st_memory_plan_fit(&q, &f), -1);
  assert_non_null(strstr(st_error_msg(), "--global-batch 32"));
  q = fit_query("gpt2-124m", 1, 1);
  q.base.gpu_mem = 0;
  assert_int_equal(st_memory_plan_fit(&q, &f), -1);
  assert_non_null(strstr(st_error_msg(), "--gpu-mem"));
  /* micro_batch bounds the search; a large global batch has many divisors */
  q = fit_query("gpt2-124m", 1, 1);
  q.base.model.block_size = 1024;
  q.base.gpu_mem = 80ULL << 30;
  q.global_batch = 720720; /* 240 divisors */
  q.base.micro_batch = 64;
  assert_int_equal(st_memory_plan_fit(&q, &f), 0);
  check_fit_contract(&f);
  assert_true(f.choice.in.micro_batch <= 64);
  assert_int_equal(720720 % f.choice.in.micro_batch, 0);
  assert_int_equal(f.choice.accum, 720720 / f.choice.in.micro_batch);
}

/* ---- the smallest cuDNN group, shared by plan and the pre-flight ---- */
static void test_attention_least_group(void **state) {
  (void)state;
  st_plan_input in = gpt2_124m(1, 0, ST_RECOMPUTE_NONE); /* B 32, 12 heads */
  /* asked for cuDNN: down to one sequence a call */
  assert_int_equal(st_plan_attention_least_group(&in, 1), 1);
  /* auto: g x 12 x ceil(T/128) >= 768 tiles, g a divisor of 32 */
  in.seq_len = 1024;
  assert_int_equal(st_plan_attention_least_group(&in, 0), 8);
  in.seq_len = 8192;
  assert_int_equal(st_plan_attention_least_group(&in, 0), 1);
  in.seq_len = 0; /* the model's positions, 1024 */
  assert_int_equal(st_plan_attention_least_group(&in, 0), 8);
  in.seq_len = 2048;
  in.micro_batch = 6; /* 12 x 16 = 192 a sequence: g >= 4, the divisors of 6 give 6 */
  assert_int_equal(st_plan_attention_least_group(&in, 0), 6);
}

/* ---- change descriptions ---- */
static void test_describe_change(void **state) {
  (void)state;
  st_plan_input a = gpt2_124m(2, 1, ST_RECOMPUTE_NONE), b = a;
  char s[256];
  st_plan_describe_change(&a, &b, 64, s, sizeof s);
  assert_string_equal(s, "");
  b.micro_batch = 8;
  st_plan_describe_change(&a, &b, 64, s, sizeof s);
  assert_string_equal(s, "--micro-batch 32 -> 8 (gradient accumulation 1 -> 4)");
  b.recompute = ST_RECOMPUTE_SELECTIVE;
  b.zero_stage = 2;
  st_plan_describe_change(&a, &b, 64, s, sizeof s);
  assert_string_equal(s, "--micro-batch 32 -> 8 (gradient accumulation 1 -> 4), --recompute "
                         "none -> selective, --zero 1 -> 2");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fit_cost),
      cmocka_unit_test(test_fit_774m),
      cmocka_unit_test(test_fit_1558m),
      cmocka_unit_test(test_fit_keeps_given_stage),
      cmocka_unit_test(test_fit_zero3),
      cmocka_unit_test(test_fit_lora),
      cmocka_unit_test(test_fit_errors),
      cmocka_unit_test(test_describe_change),
      cmocka_unit_test(test_attention_least_group),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
