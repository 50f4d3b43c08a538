/* test_memory_plan.c - the memory planner's byte counts
 * (rank/memory/memory_plan.c); the --fit search over them is in
 * test_memory_fit.c.
 *
 * 1. Exactness: for small shapes at every ZeRO stage, recompute policy,
 *    storage dtype, backend shape and several rank counts, the planner's
 *    categories equal the bytes st_model_init/_bucketed and
 *    st_trainer_alloc_state really request, buffer by buffer, each rounded
 *    to the arena's 256 bytes, and the category each buffer is tagged with.
 *    The op table is the CPU one with alloc/free replaced by a recording
 *    allocator and, for the CUDA shape, dtype and attention_state_floats set
 *    as the CUDA tables have them: nothing is computed, only allocated, so
 *    bf16/fp16 and CUDA-sized layouts are checked without a GPU. Then the
 *    same allocations (plus the CUDA workspace and scratch reserve carves)
 *    go into a real arena of the plan's `arena` bytes, which they must fill
 *    exactly.
 * 2. GPT-2 124M by hand (docs/memory.md derives every number): parameter
 *    count, bytes per parameter at ZeRO 0/1/2, activations per layer for
 *    recompute none/act/selective/full at B=32, T=1024, scratch, NCCL; the
 *    headroom and the flags bad input names.
 * 3. Sizes on the command line.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <cmocka.h>

#include "kernels/nf4.h"
#include "rank/memory/memory_plan.h"
#include "rank/model/params.h"
#include "rank/train/trainer_state.h"
#include "util/error.h"
#include "tests/memory_plan_fixtures.h"
#ifdef SHARDTRAIN_HAVE_CUDA
#include "kernels/ops_cuda.h"
#endif

/* ---- a recording allocator ---- */
#define MAX_LIVE 64
static struct {
  void *p;
  size_t bytes;
  const char *category;
} g_live[MAX_LIVE];
static int g_nlive;

static void *rec_alloc(size_t bytes, const char *category) {
  void *p = calloc(bytes ? bytes : 1, 1);
  assert_non_null(p);
  assert_true(g_nlive < MAX_LIVE);
  g_live[g_nlive].p = p;
  g_live[g_nlive].bytes = bytes;
  g_live[g_nlive].category = category;
  g_nlive++;
  return p;
}

/* The second pass: the same allocations carved from a real arena. */
static st_arena g_arena;
static void *arena_alloc(size_t bytes, const char *category) {
  return st_arena_take(&g_arena, bytes, category);
}
static void arena_free(void *p) { assert_true(p == NULL || st_arena_owns(&g_arena, p)); }

static void rec_free(void *p) {
  if (!p) return;
  for (int i = 0; i < g_nlive; i++)
    if (g_live[i].p == p) {
      free(p);
      g_live[i] = g_live[--g_nlive];
      return;
    }
  fail_msg("freeing a pointer the recording allocator did not hand out");
}

/* Bytes p takes in an arena: requested, rounded to 256 (0 for NULL);
 * fails for an unknown pointer. */
static uint64_t size_of(const void *p) {
  if (!p) return 0;
  for (int i = 0; i < g_nlive; i++)
    if (g_live[i].p == p) return st_arena_round(g_live[i].bytes);
  fail_msg("no live allocation at %p", p);
  return 0;
}

static uint64_t live_total(void) {
  uint64_t s = 0;
  for (int i = 0; i < g_nlive; i++) s += st_arena_round(g_live[i].bytes);
  return s;
}

/* Every live buffer carries a plan category, and the plan's bytes for each
 * category are those of the buffers tagged with it. */
static void check_tags(const st_memory_plan *p) {
  for (int i = 0; i < g_nlive; i++) {
    int known = 0;
    const uint64_t planned = st_memory_plan_category(p, g_live[i].category, &known);
    assert_true(known);
    uint64_t sum = 0;
    for (int j = 0; j < g_nlive; j++)
      if (strcmp(g_live[j].category, g_live[i].category) == 0)
        sum += st_arena_round(g_live[j].bytes);
    if (planned != sum)
      fail_msg("category %s: plan %llu, buffers %llu", g_live[i].category,
               (unsigned long long)planned, (unsigned long long)sum);
  }
}

static int64_t cuda_att_floats(int B, int T, int NH) { return (int64_t)B * NH * T; }

/* The CPU table with recorded memory, and as the given backend and dtype
 * would size things. */
static st_ops shape_ops(st_backend be, st_dtype dt) {
  st_ops o = *st_ops_cpu();
  o.alloc = rec_alloc;
  o.free = rec_free;
  o.dtype = dt;
  if (be == ST_BACKEND_CUDA) o.attention_state_floats = cuda_att_floats;
  return o;
}

/* A trainer over rc, comm and ops with its state allocated as setup does. */
/* micro-steps per step for check_one: 1 (ZeRO 2/3 reduce into the shard,
 * no receive buffers) or 0 (not 1: receive buffers) */
static int g_accum;
/* --grad-dtype bf16 asked for (it applies at ZeRO 2/3 with g_accum 1) */
static int g_grad16;

static void alloc_trainer(trainer *t, st_run_config *rc, st_comm *comm, const st_ops *ops) {
  memset(t, 0, sizeof *t);
  t->rc = rc;
  t->comm = comm;
  t->ops = ops;
  t->accum = g_accum;
  assert_int_equal(st_trainer_alloc_state(t), 0);
}

/* What alloc_trainer allocated on the host, and the model. */
static void free_trainer_host(trainer *t) {
  st_model_free(&t->model);
  free(t->bucket_counts);
  free(t->inp);
  free(t->tgt);
  free(t->scratch);
  free(t->config_json);
  free(t->split_hi);
  free(t->split_lo);
}

/* --lora for check_one: NULL, full training; else the spec, resolved for the shape. */
static const char *g_lora;
/* with g_lora: 1 for --base-dtype nf4 (QLoRA) */
static int g_nf4;

static void check_one(const st_model_config *cfg, int B, int world, int rank, int zero,
                      st_recompute rec, st_backend be, st_dtype dt) {
  st_ops ops = shape_ops(be, dt);
  st_run_config rc;
  st_run_config_defaults(&rc);
  rc.model = *cfg;
  rc.seq_len = cfg->block_size; /* T: a fresh model's positions */
  rc.micro_batch = B;
  rc.zero_stage = zero;
  snprintf(rc.grad_dtype, sizeof rc.grad_dtype, "%s", g_grad16 ? "bf16" : "fp32");
  snprintf(rc.recompute, sizeof rc.recompute, "%s", st_recompute_name(rec));
  if (g_lora) {
    assert_int_equal(st_lora_parse(g_lora, &rc.lora), 0);
    assert_int_equal(st_lora_resolve(&rc.lora, cfg), 0);
    rc.lora.nf4_base = g_nf4;
  }
  st_comm comm;
  memset(&comm, 0, sizeof comm);
  comm.rank = rank;
  comm.world = world;
  trainer tr;
  alloc_trainer(&tr, &rc, &comm, &ops);

  st_plan_input in = {.model = *cfg, .micro_batch = B, .world = world, .zero_stage = zero,
                      .dtype = dt, .recompute = rec, .backend = be, .lora = rc.lora,
                      .accum = g_accum, .grad_bf16 = g_grad16};
  st_memory_plan p;
  assert_int_equal(st_memory_plan_make(&in, &p), 0);
  const st_model *m = &tr.model;
  /* model */
  assert_int_equal(p.params, m->tab.total);
  if (g_lora) { /* the adapters train; the base is frozen: working weights only */
    st_lora_table lt;
    assert_int_equal(st_lora_table_build(cfg, &rc.lora, &lt), 0);
    assert_int_equal(p.params, lt.total);
    st_lora_table_free(&lt);
    assert_int_equal(p.base_params, st_model_num_params(cfg));
    assert_int_equal(p.weights_base, size_of(m->base_params));
    assert_int_equal(p.lora_weights, size_of(m->params));
    if (g_nf4) { /* QLoRA: the projections as NF4 only, one dequantisation scratch */
      int64_t kept = 0, big = 0;
      uint64_t nf4 = 0;
      for (int i = 0; i < m->base_tab.n; i++) {
        const st_tensor *t = &m->base_tab.t[i];
        if (strstr(t->name, ".attn.qkv.weight") || strstr(t->name, ".attn.proj.weight") ||
            strstr(t->name, ".mlp.fc.weight") || strstr(t->name, ".mlp.proj.weight")) {
          nf4 += st_nf4_bytes(t->shape[0], t->shape[1]);
          if (t->numel > big) big = t->numel;
        } else {
          kept += t->numel;
        }
      }
      assert_int_equal(p.weights_base, st_arena_round((uint64_t)kept * m->es));
      assert_int_equal(p.weights_nf4, size_of(m->nf4_mem));
      assert_int_equal(p.weights_nf4, st_arena_round(nf4));
      assert_int_equal(p.nf4_scratch, size_of(m->nf4_scratch));
      assert_true(p.nf4_scratch >= (uint64_t)big * m->es);
      assert_int_equal(p.weights, p.weights_base + p.lora_weights + p.weights_nf4 +
                                      p.nf4_scratch);
    } else {
      assert_int_equal(p.weights_base, st_arena_round((uint64_t)p.base_params * m->es));
      assert_int_equal(p.weights, p.weights_base + p.lora_weights);
      assert_int_equal(p.weights_nf4 + p.nf4_scratch, 0);
    }
    assert_true(p.acts.lora > 0);
  } else {
    assert_int_equal(p.params, st_model_num_params(cfg));
    assert_int_equal(p.weights_base + p.lora_weights + p.acts.lora, 0);
  }
  assert_int_equal(p.padded_params, m->padded_total);
  assert_int_equal(p.shard, tr.part.shard);
  if (zero == 3) { /* the shard, the head whole, two gathered-block buffers; no whole vector */
    assert_null(m->params);
    assert_int_equal(p.weights_shard, size_of(m->shard_params));
    assert_int_equal(p.weights_shard, st_arena_round((uint64_t)tr.part.shard * m->es));
    assert_int_equal(m->shard_begin, (int64_t)rank * tr.part.shard);
    assert_int_equal(p.weights_head, size_of(m->head_params));
    assert_int_equal(p.weights_blocks, size_of(m->wbuf[0]) + size_of(m->wbuf[1]));
    assert_int_equal(p.weights_blocks, 2 * st_arena_round((uint64_t)m->block_numel * m->es));
    assert_int_equal(p.weights, p.weights_shard + p.weights_head + p.weights_blocks);
    /* every rank's shard tiles the padded vector */
    assert_int_equal(tr.part.shard * world, m->padded_total);
  } else if (!g_lora) {
    assert_int_equal(p.weights, size_of(m->params));
    assert_int_equal(p.weights, st_arena_round((uint64_t)m->padded_total * m->es));
    assert_int_equal(p.weights_shard + p.weights_head + p.weights_blocks, 0);
  }
  assert_int_equal(p.acts.total, size_of(m->act_mem));
  assert_int_equal(p.acts.total, m->act_bytes);
  assert_int_equal(p.acts.embed + p.acts.blocks + p.acts.recompute + p.acts.attention +
                       p.acts.head + p.acts.logits + p.acts.grad_scratch + p.acts.lora,
                   p.acts.total);
  if (zero >= 2) {
    assert_null(m->grads);
    assert_int_equal(p.grads_full, 0);
    assert_int_equal(p.grads_head, size_of(m->head_grads));
    /* one rank: one bucket for both slots */
    assert_true((m->bucket[0] == m->bucket[1]) == (world == 1));
    assert_int_equal(p.grads_buckets, size_of(m->bucket[0]) +
                                          (world > 1 ? size_of(m->bucket[1]) : 0));
    uint64_t recv = 0;
    for (int s = 0; s < ST_COMM_TAGS; s++) recv += size_of(tr.recv[s]);
    assert_int_equal(p.grads_recv, recv);
    /* one micro-step: into the shard, unless a bf16 shard on several ranks
     * (reduced in fp32, then rounded into it) */
    if (g_accum == 1 && !(g_grad16 && world > 1)) assert_int_equal(recv, 0);
    else assert_true(recv > 0);
  } else {
    assert_non_null(m->grads);
    assert_int_equal(p.grads_full, size_of(m->grads));
    assert_int_equal(p.grads_full, st_arena_round((uint64_t)m->padded_total * sizeof(float)));
    assert_int_equal(p.grads_head + p.grads_buckets + p.grads_recv, 0);
    assert_null(m->head_grads);
  }
  /* optimizer and batches */
  if (tr.grad_shard_aliased) { /* ZeRO 1, one rank: reduced in place into m->grads */
    assert_true(zero == 1 && world == 1 && tr.grad_shard == m->grads);
    assert_int_equal(p.grad_shard, 0);
  } else {
    assert_int_equal(p.grad_shard, size_of(tr.grad_shard));
  }
  const int grad16 = g_grad16 && zero >= 2 && g_accum == 1;
  assert_int_equal(tr.grad_dtype, grad16 ? ST_BF16 : ST_FP32);
  if (zero >= 1 && !tr.grad_shard_aliased)
    assert_int_equal(p.grad_shard, st_arena_round((uint64_t)tr.part.shard * (grad16 ? 2 : 4)));
  /* bf16: the master's rests alone (kernels/master_split.h), 2 bytes each */
  assert_int_equal(p.master, size_of(tr.master) + size_of(tr.master_lo));
  if (tr.master_lo) assert_true(ops.dtype == ST_BF16 && !tr.master);
  assert_int_equal(p.adam_m, size_of(tr.adam_m));
  assert_int_equal(p.adam_v, size_of(tr.adam_v));
  assert_int_equal(p.tokens, size_of(tr.d_inp) + size_of(tr.d_tgt));
  /* and nothing else: every byte requested is in a category */
  assert_int_equal(p.total - p.cublaslt - p.scratch - p.nccl - p.context, live_total());
  assert_int_equal(p.arena, p.total - p.nccl - p.context);
  assert_int_equal(p.acts.total % ST_ARENA_ALIGN, 0);
  if (be == ST_BACKEND_CPU) assert_int_equal(p.cublaslt + p.scratch + p.nccl + p.context, 0);
  check_tags(&p);

  ops.free(tr.adam_m);
  ops.free(tr.adam_v);
  if (!tr.grad_shard_aliased) ops.free(tr.grad_shard);
  ops.free(tr.master);
  ops.free(tr.master_lo);
  for (int s = 0; s < ST_COMM_TAGS; s++) ops.free(tr.recv[s]);
  ops.free(tr.d_inp);
  ops.free(tr.d_tgt);
  free_trainer_host(&tr);
  assert_int_equal(g_nlive, 0);

  /* The same setup in a real arena of exactly the plan's size. */
  /* Mapped, not malloc'ed: nothing is computed, untouched pages cost nothing,
   * and under AddressSanitizer a malloc of the CUDA cases' 32 MiB cuBLASLt
   * workspace poisons and quarantines its shadow each time (this test took
   * 70 s there with malloc, 22 s with mmap, on shared cores; the unit tests'
   * fast unwinder, tests/CMakeLists.txt, does the rest). Page-aligned, so
   * ST_ARENA_ALIGN too. */
  void *block = mmap(NULL, (size_t)p.arena, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  assert_true(block != MAP_FAILED);
  st_arena_init(&g_arena, block, (size_t)p.arena);
  ops.alloc = arena_alloc;
  ops.free = arena_free;
  trainer t2;
  alloc_trainer(&t2, &rc, &comm, &ops);
  if (be == ST_BACKEND_CUDA) { /* what cuda_reserve carves at the plan's sizes */
    assert_non_null(st_arena_take(&g_arena, ST_PLAN_CUBLASLT_WORKSPACE, "cublaslt_workspace"));
    assert_non_null(st_arena_take(&g_arena, st_plan_cuda_scratch((int64_t)B * cfg->block_size,
                                                                 cfg), "cuda_scratch"));
  }
  assert_false(g_arena.failed);
  assert_int_equal(g_arena.used, g_arena.size);
  for (int i = 0; i < g_arena.ncat; i++)
    assert_int_equal(g_arena.cat[i].bytes,
                     st_memory_plan_category(&p, g_arena.cat[i].name, NULL));
  free_trainer_host(&t2);
  assert_int_equal(munmap(block, (size_t)p.arena), 0);
}

static void test_plan_equals_allocation(void **state) {
  (void)state;
  /* Shapes that exercise padding: a vocabulary that is not a multiple of
   * 128, widths that are not multiples of 64 (so buffers need alignment
   * padding), totals that do not divide by the rank counts. */
  st_model_config shapes[] = {
      {.n_layer = 2, .n_head = 4, .n_embd = 64, .block_size = 32, .vocab_size = 256},
      {.n_layer = 3, .n_head = 3, .n_embd = 48, .block_size = 24, .vocab_size = 300},
      {.n_layer = 1, .n_head = 5, .n_embd = 5, .block_size = 7, .vocab_size = 131},
      /* the Llama family: GQA, SwiGLU of its own width, RMSNorm, RoPE, untied */
      {.n_layer = 2, .n_head = 4, .n_kv_head = 2, .n_embd = 64, .ffn_dim = 96, .block_size = 16,
       .vocab_size = 300, .untied = 1},
      /* Qwen2's q/k/v biases, MQA, tied */
      {.n_layer = 1, .n_head = 6, .n_kv_head = 1, .n_embd = 48, .ffn_dim = 80, .block_size = 12,
       .vocab_size = 131},
  };
  const int nshapes = (int)(sizeof shapes / sizeof shapes[0]);
  st_model_arch_defaults(&shapes[3], ST_ARCH_LLAMA);
  st_model_arch_defaults(&shapes[4], ST_ARCH_QWEN2);
  const int Bs[] = {1, 3};
  const int worlds[] = {1, 2, 3, 7};
  int cases = 0;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    assert_int_equal(st_model_validate(&shapes[s]), 0);
    for (int be = 0; be < 2; be++)
      for (int dt = 0; dt < 3; dt++) {
        if (be == ST_BACKEND_CPU && dt != ST_FP32) continue;
        for (int bi = 0; bi < 2; bi++)
          for (int wi = 0; wi < 4; wi++)
            for (int z = 0; z < ST_PLAN_ZERO_STAGES; z++)
              for (int r = 0; r < ST_RECOMPUTE_POLICIES; r++) {
                const int w = worlds[wi];
                /* every rank's state has the same size; check the first and
                 * last, with several micro-steps a step and (ZeRO 2/3,
                 * where it matters) with one */
                for (g_accum = 0; g_accum <= (z >= 2); g_accum++)
                  for (g_grad16 = 0; g_grad16 <= (g_accum == 1); g_grad16++) {
                    check_one(&shapes[s], Bs[bi], w, 0, z, (st_recompute)r, (st_backend)be,
                              (st_dtype)dt);
                    if (w > 1)
                      check_one(&shapes[s], Bs[bi], w, w - 1, z, (st_recompute)r,
                                (st_backend)be, (st_dtype)dt);
                  }
                g_accum = g_grad16 = 0;
                cases++;
              }
      }
  }
  assert_int_equal(cases, nshapes * 4 * 2 * 4 * ST_PLAN_ZERO_STAGES * ST_RECOMPUTE_POLICIES);
}

/* LoRA (rank/model/lora.h) on the same shapes at ZeRO 0-2 (3 is refused),
 * with and without dropout, the family's default and every target: the
 * frozen base's working weights, the adapters' weights, gradients, master
 * and Adam state, and the adapters' activations, byte for byte. */
static void test_lora_plan_equals_allocation(void **state) {
  (void)state;
  st_model_config shapes[] = {
      {.n_layer = 2, .n_head = 4, .n_embd = 64, .block_size = 32, .vocab_size = 256},
      {.n_layer = 1, .n_head = 5, .n_embd = 5, .block_size = 7, .vocab_size = 131},
      {.n_layer = 2, .n_head = 4, .n_kv_head = 2, .n_embd = 64, .ffn_dim = 96, .block_size = 16,
       .vocab_size = 300, .untied = 1},
      {.n_layer = 1, .n_head = 6, .n_kv_head = 1, .n_embd = 48, .ffn_dim = 80, .block_size = 12,
       .vocab_size = 131},
  };
  st_model_arch_defaults(&shapes[2], ST_ARCH_LLAMA);
  st_model_arch_defaults(&shapes[3], ST_ARCH_QWEN2);
  const char *gpt2[] = {"8", "3,dropout=0.1,targets=qkv,o,up,down"};
  const char *llama[] = {"8", "3,dropout=0.1,targets=q,k,v,o,gate,up,down"};
  const int worlds[] = {1, 3};
  int cases = 0;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    assert_int_equal(st_model_validate(&shapes[s]), 0);
    for (int k = 0; k < 4; k++) { /* k >= 2: the same specs with --base-dtype nf4 */
      g_lora = shapes[s].arch == ST_ARCH_GPT2 ? gpt2[k % 2] : llama[k % 2];
      g_nf4 = k >= 2;
      for (int be = 0; be < 2; be++)
        for (int dt = 0; dt < 3; dt++) {
          if (be == ST_BACKEND_CPU && dt != ST_FP32) continue;
          for (int wi = 0; wi < 2; wi++)
            for (int z = 0; z < 3; z++)
              for (int r = 0; r < ST_RECOMPUTE_POLICIES; r++) {
                const int w = worlds[wi];
                check_one(&shapes[s], 2, w, w - 1, z, (st_recompute)r, (st_backend)be,
                          (st_dtype)dt);
                cases++;
              }
        }
    }
  }
  g_lora = NULL;
  g_nf4 = 0;
  assert_int_equal(cases, 4 * 4 * 4 * 2 * 3 * ST_RECOMPUTE_POLICIES);
  /* ZeRO 3 and --offload are refused with LoRA (exit 2) */
  st_plan_input in = {.model = shapes[0], .micro_batch = 1, .world = 2, .zero_stage = 3,
                      .dtype = ST_FP32};
  assert_int_equal(st_lora_parse("4", &in.lora), 0);
  assert_int_equal(st_lora_resolve(&in.lora, &shapes[0]), 0);
  st_memory_plan p;
  st_error_code(ST_EXIT_ERROR);
  assert_int_equal(st_memory_plan_make(&in, &p), -1);
  assert_int_equal(st_error_exit_code(), ST_EXIT_USAGE);
  in.zero_stage = 1;
  assert_int_equal(st_memory_plan_make(&in, &p), 0);
  /* the frozen base: the same working weights, no base gradient, master or Adam */
  st_plan_input full = in;
  memset(&full.lora, 0, sizeof full.lora);
  st_memory_plan q;
  assert_int_equal(st_memory_plan_make(&full, &q), 0);
  assert_int_equal(p.weights_base, st_arena_round((uint64_t)q.params * 4));
  assert_true(p.grads < q.grads / 10 && p.adam_m < q.adam_m / 10);
}

/* ---- the Llama family at its real shapes ---- */
/* Published parameter counts (Hugging Face model cards / safetensors
 * metadata, tied heads counted once): Llama-3.2-1B 1,235,814,400,
 * SmolLM2-360M 361,821,120, Qwen2.5-0.5B 494,032,768. Every vocabulary is a
 * multiple of 128, so padding adds nothing. */
static void test_family_shapes(void **state) {
  (void)state;
  /* rows: the LM head's chunk at B*T = 8,192 in bf16. The whole [8,192, Vp]
   * (0.8 to 2.5 GB) fits 256 MiB for none. Llama 3's 128,256 columns take
   * 256,512 bytes a row, 1,046.5 rows fit, and Qwen2's 151,936: 303,872 a
   * row, 883.4: both fewer than 2048, which fit 2 GiB, so 2048. SmolLM2's
   * 49,152: 98,304 a row, 2,730.7 fit: 2,688, a multiple of 128. */
  const struct {
    const char *name;
    int64_t params;
    int rows;
  } k[] = {{"llama-3.2-1b", 1235814400LL, 2048}, {"smollm2-360m", 361821120LL, 2688},
           {"qwen2.5-0.5b", 494032768LL, 2048}};
  const int B = 4, T = 2048;
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
    st_plan_input in = {.micro_batch = B, .seq_len = T, .world = 1, .zero_stage = 1,
                        .dtype = ST_BF16, .recompute = ST_RECOMPUTE_NONE,
                        .backend = ST_BACKEND_CUDA};
    assert_int_equal(st_model_preset(k[i].name, &in.model), 0);
    assert_int_equal(st_model_validate(&in.model), 0);
    const st_model_config *c = &in.model;
    assert_int_equal(c->padded_vocab_size, c->vocab_size);
    st_memory_plan p;
    assert_int_equal(st_memory_plan_make(&in, &p), 0);
    st_param_table tab;
    assert_int_equal(st_param_table_build(c, &tab), 0);
    const int64_t table = tab.total;
    st_param_table_free(&tab); /* before a failure jumps out */
    if (p.params != table || p.params != k[i].params || p.params != st_model_num_params(c))
      fail_msg("%s: plan %lld, table %lld, published %lld, st_model_num_params %lld", k[i].name,
               (long long)p.params, (long long)table, (long long)k[i].params,
               (long long)st_model_num_params(c));
    /* bf16 ZeRO 1 on one rank: 2 + 4 + 2 + 4 + 4 bytes per parameter (the
     * master split: its rests, 2 bytes; kernels/master_split.h) */
    const uint64_t P = (uint64_t)k[i].params;
    assert_int_equal(p.weights, st_arena_round(2 * P));
    assert_int_equal(p.master, st_arena_round(2 * P));
    assert_int_equal(p.grads + p.adam_m + p.adam_v, 3 * st_arena_round(4 * P));
    /* activations: the model's own layout, and one chunk of the logits,
     * [rows, Vp] bf16, among them (its gradient overwrites it) */
    st_act_bytes a;
    st_model_measure_acts(c, ST_BF16, (int64_t)B * c->n_head * T, B, T, ST_RECOMPUTE_NONE, &a);
    assert_memory_equal(&a, &p.acts, sizeof a);
    assert_int_equal(st_model_head_rows(c, ST_BF16, (int64_t)B * T), k[i].rows);
    assert_int_equal(p.acts.logits, (uint64_t)k[i].rows * c->padded_vocab_size * 2);
    assert_true(p.acts.logits <= ST_HEAD_CHUNK_MAX_BYTES &&
                (p.acts.logits <= ST_HEAD_CHUNK_BYTES) == (k[i].rows > ST_HEAD_CHUNK_MIN_ROWS));
    /* ZeRO 2: the gradients outside the blocks are the tied embedding and
     * the final RMSNorm's weight (no wpe, no norm bias, no lm_head) */
    in.zero_stage = 2;
    assert_int_equal(st_memory_plan_make(&in, &p), 0);
    assert_int_equal(p.grads_head,
                     st_arena_round(((uint64_t)c->padded_vocab_size + 1) * c->n_embd * 4));
    /* cuDNN's workspace per sequence: dP per query head, plus dK and dV per
     * query head for GQA */
    const uint64_t ws = st_plan_cudnn_attention_per_seq(T, c);
    assert_int_equal(ws, (uint64_t)c->n_head * T * T * 2 + (uint64_t)c->n_head * T * 4 +
                             2ULL * c->n_head * T * st_model_head_dim(c) * 4);
    /* untied: the head's weights, gradients and Adam state on top */
    st_plan_input u = in;
    u.zero_stage = 0;
    u.model.untied = 1;
    st_memory_plan pu, pt;
    in.zero_stage = 0;
    assert_int_equal(st_memory_plan_make(&in, &pt), 0);
    assert_int_equal(st_memory_plan_make(&u, &pu), 0);
    const int64_t head = (int64_t)c->padded_vocab_size * c->n_embd;
    assert_int_equal(pu.params - pt.params, head);
    assert_int_equal(pu.adam_m - pt.adam_m, 4 * head);
  }
}

/* The planner's attention-state formulas are the backends' own. */
static void test_attention_state_formulas(void **state) {
  (void)state;
  const st_ops *cpu = st_ops_cpu();
  assert_int_equal(cpu->attention_state_floats(3, 17, 5), 3 * 5 * 17 * 17);
#ifdef SHARDTRAIN_HAVE_CUDA
  for (int dt = 0; dt < 3; dt++)
    assert_int_equal(st_ops_cuda((st_dtype)dt)->attention_state_floats(3, 17, 5),
                     cuda_att_floats(3, 17, 5));
#endif
  assert_int_equal(cuda_att_floats(3, 17, 5), 3 * 5 * 17);
}

/* ---- GPT-2 124M by hand (docs/memory.md, "GPT-2 124M") ---- */
static void test_gpt2_124m_parameters(void **state) {
  (void)state;
  st_plan_input in = gpt2_124m(1, 0, ST_RECOMPUTE_NONE);
  assert_int_equal(in.model.padded_vocab_size, 50304); /* 50257 up to a multiple of 128 */
  st_memory_plan p;
  assert_int_equal(st_memory_plan_make(&in, &p), 0);
  /* wte 50304 x 768 = 38,633,472; wpe 1024 x 768 = 786,432;
   * block 12 x 768^2 + 13 x 768 = 7,087,872, x 12 = 85,054,464; ln_f 1,536 */
  const int64_t P = 124475904;
  assert_int_equal(38633472 + 786432 + 85054464 + 1536, P);
  assert_int_equal(p.params, P);
  /* bf16, ZeRO 0, 1 rank: 2 + 4 + 2 + 4 + 4 = 16 bytes per parameter: the
   * fp32 master is the working weight (its high half) and a 2-byte rest
   * (kernels/master_split.h) */
  assert_int_equal(p.weights, 2 * P);
  assert_int_equal(p.grads, 4 * P);
  assert_int_equal(p.grad_shard, 0);
  assert_int_equal(p.master, 2 * P);
  assert_int_equal(p.adam_m, 4 * P);
  assert_int_equal(p.adam_v, 4 * P);
  assert_int_equal(p.weights + p.grads + p.master + p.adam_m + p.adam_v, 16 * P);
  assert_int_equal(16 * P, 1991614464LL);
  /* fp16 keeps the fp32 master (fp16 is not fp32's high half): 18 */
  in.dtype = ST_FP16;
  assert_int_equal(st_memory_plan_make(&in, &p), 0);
  assert_int_equal(p.master, 4 * P);
  assert_int_equal(p.weights + p.grads + p.master + p.adam_m + p.adam_v, 18 * P);

  /* 2 ranks: P is even, so the shard is P / 2 = 62,237,952 */
  in = gpt2_124m(2, 1, ST_RECOMPUTE_NONE);
  assert_int_equal(st_memory_plan_make(&in, &p), 0);
  assert_int_equal(p.padded_params, P);
  assert_int_equal(p.shard, 62237952);
  /* ZeRO 1: 2 + 4 full; shard, master's rests, m, v: 14 / N = 7 -> 13 bytes per parameter */
  assert_int_equal(p.weights + p.grads + p.grad_shard + p.master + p.adam_m + p.adam_v, 13 * P);
  /* ZeRO 0 on 2 ranks keeps everything: 16 */
  in = gpt2_124m(2, 0, ST_RECOMPUTE_NONE);
  assert_int_equal(st_memory_plan_make(&in, &p), 0);
  assert_int_equal(p.weights + p.grads + p.grad_shard + p.master + p.adam_m + p.adam_v, 16 * P);

  /* ZeRO 2, 2 ranks: no full gradient vector. head = wte + wpe + ln_f =
   * 39,421,440 floats; buckets 2 x (7,087,872 + 1); receive buffers
   * (min(range, shard) + 1) for ranges block, block, wte+wpe (39,419,904),
   * ln_f (1,536): 7,087,873 x 2 + 39,419,905 + 1,537 = 53,597,188 floats.
   * Each buffer takes whole 256-byte units in the arena: a bucket's
   * 28,351,492 bytes take 28,351,744; the receive buffers 28,351,744 x 2 +
   * 157,679,872 + 6,400 = 214,389,760 (the 214,388,752 requested + 1,008). */
  in = gpt2_124m(2, 2, ST_RECOMPUTE_NONE);
  assert_int_equal(st_memory_plan_make(&in, &p), 0);
  assert_int_equal(p.grads_full, 0);
  assert_int_equal(p.grads_head, 4LL * 39421440); /* a multiple of 256 */
  assert_int_equal(p.grads_buckets, 2 * st_arena_round(4LL * 7087873));
  assert_int_equal(p.grads_buckets, 2 * 28351744LL);
  assert_int_equal(p.grads_recv, 2 * 28351744LL + 157679872LL + 6400LL);
  assert_int_equal(p.grads_recv, 214389760LL);
  assert_true(p.grads_recv >= 4LL * 53597188 && p.grads_recv - 4LL * 53597188 < 4 * 256);
  assert_int_equal(p.grads, 157685760LL + 56703488LL + 214389760LL);
  /* the shard, the master's 2-byte rests, m and v */
  assert_int_equal(p.grad_shard + p.master + p.adam_m + p.adam_v, (4 + 2 + 4 + 4) * 62237952LL);
  /* one micro-step a step: the reductions land in the shard, no receive
   * buffers (214 MB less) */
  const uint64_t total_accum = p.total;
  in.accum = 1;
  assert_int_equal(st_memory_plan_make(&in, &p), 0);
  assert_int_equal(p.grads_recv, 0);
  assert_int_equal(p.grads, 157685760LL + 56703488LL);
  assert_int_equal(p.total, total_accum - 214389760LL);

  /* ZeRO 3, 4 ranks, bf16: shard P / 4 = 31,118,976 working weights (2
   * bytes each, 62,237,952); the head whole, wte + wpe + ln_f = 39,421,440
   * (78,842,880); two gathered blocks of 7,087,872 (14,175,744 bytes each,
   * multiples of 256): 169,432,320 bytes against ZeRO 2's 2 P =
   * 248,951,808. Gradients as at ZeRO 2 (of the 4-rank shard). */
  in = gpt2_124m(4, 3, ST_RECOMPUTE_NONE);
  assert_int_equal(st_memory_plan_make(&in, &p), 0);
  assert_int_equal(p.shard, 31118976);
  assert_int_equal(p.weights_shard, 62237952LL);
  assert_int_equal(p.weights_head, 78842880LL);
  assert_int_equal(p.weights_blocks, 2 * 14175744LL);
  assert_int_equal(p.weights, 169432320LL);
  st_plan_input in2 = gpt2_124m(4, 2, ST_RECOMPUTE_NONE);
  st_memory_plan p2;
  assert_int_equal(st_memory_plan_make(&in2, &p2), 0);
  assert_int_equal(p2.weights, 2 * P);
  assert_int_equal(p2.weights_shard + p2.weights_head + p2.weights_blocks, 0);
  assert_int_equal(p.grads, p2.grads);
  assert_int_equal(p.total + (2 * P - 169432320LL), p2.total);
}

static void test_gpt2_124m_activations(void **state) {
  (void)state;
  /* B*T = 32,768 rows; a [B,T,C] bf16 tensor is 25,165,824 x 2 = 50,331,648
   * bytes (48 MiB); a [B,T] fp32 statistic 131,072; the flash-attention
   * state B x NH x T fp32 = 1,572,864. All are multiples of 256: no padding. */
  const int64_t X = 50331648, S = 131072, A = 1572864;
  /* Every policy: encoder output 1 X; head = ln_f output X + mean, rstd,
   * losses 3 S; one chunk of the logits: a row is 50,304 x 2 = 100,608
   * bytes, 256 MiB holds 2,668.1 rows, fewer than the floor, which at
   * 32,768 rows is an eighth of them up to 4096: so 4,096 of the 32,768 (8
   * chunks), 4,096 x 100,608 bytes instead of the whole 3,296,722,944
   * (3.07 GiB); backward scratch: dln
   * (1 X) of its own, and dres (1 X) and one 4 X buffer (dfch in a block's
   * MLP backward, dqkv 3 X beside datty 1 X in its attention backward)
   * inside the logits chunk, which 5 X = 251,658,240 bytes fit; so 1 X,
   * not the 10 X of separate buffers; datt A. */
  const int64_t logits = 4096LL * 50304 * 2;
  assert_int_equal(logits, 412090368LL); /* 393 MiB, a multiple of 256 */
  st_memory_plan p;
  st_plan_input in;
  const int64_t L = 12;

  /* none: per layer 16 X (ln1 1, qkv 3, atty 1, residual2 1, ln2 1, fch 4,
   * fch_gelu 4, residual3 1) + 4 S (LayerNorm mean, rstd twice) + A =
   * 807,403,520 bytes (770 MiB); the projections' outputs have no buffer
   * (they go into the residual stream in the GEMM), so nothing is shared. */
  in = gpt2_124m(1, 0, ST_RECOMPUTE_NONE);
  assert_int_equal(st_model_head_rows(&in.model, ST_BF16, 32768), 4096);
  assert_int_equal(st_memory_plan_make(&in, &p), 0);
  assert_int_equal(16 * X + 4 * S + A, 807403520LL);
  assert_int_equal(p.acts.blocks, L * (16 * X + 4 * S));
  assert_int_equal(p.acts.recompute, 0);
  assert_int_equal(p.acts.attention, L * A + A);
  assert_int_equal(p.acts.embed, X);
  assert_int_equal(p.acts.head, X + 3 * S);
  assert_int_equal(p.acts.logits, logits);
  assert_int_equal(p.acts.grad_scratch, X);
  assert_true(5 * X <= logits);
  assert_int_equal(p.acts.total, 10253893632LL); /* 9.55 GiB */
  assert_int_equal(p.acts.total,
                   L * (16 * X + 4 * S + A) + X + X + 3 * S + logits + X + A);

  /* act: fch_gelu (4 X) once for all layers: per layer 12 X + 4 S + A,
   * plus those 4 X once. */
  in = gpt2_124m(1, 0, ST_RECOMPUTE_ACT);
  assert_int_equal(st_memory_plan_make(&in, &p), 0);
  assert_int_equal(p.acts.blocks, L * (12 * X + 4 * S));
  assert_int_equal(p.acts.recompute, 4 * X);
  assert_int_equal(p.acts.attention, L * A + A);
  assert_int_equal(p.acts.total, L * (12 * X + 4 * S + A) + 4 * X + X + X + 3 * S + logits + X + A);
  assert_int_equal(p.acts.total, 8039301120LL); /* 7.49 GiB */

  /* selective: ln1, ln2 (1 X each) and fch_gelu (4 X) once for all layers:
   * per layer 10 X + 4 S + A = 505,413,632 (482 MiB), plus those 6 X once. */
  in = gpt2_124m(1, 0, ST_RECOMPUTE_SELECTIVE);
  assert_int_equal(st_memory_plan_make(&in, &p), 0);
  assert_int_equal(10 * X + 4 * S + A, 505413632LL);
  assert_int_equal(p.acts.blocks, L * (10 * X + 4 * S));
  assert_int_equal(p.acts.recompute, 6 * X);
  assert_int_equal(p.acts.attention, L * A + A);
  assert_int_equal(p.acts.total, 6932004864LL); /* 6.46 GiB */

  /* full: only the block output (1 X) per layer; everything else (15 X, 4 S,
   * A) once, in the shared block. */
  in = gpt2_124m(1, 0, ST_RECOMPUTE_FULL);
  assert_int_equal(st_memory_plan_make(&in, &p), 0);
  assert_int_equal(p.acts.blocks, L * X);
  assert_int_equal(p.acts.recompute, 15 * X + 4 * S);
  assert_int_equal(p.acts.attention, A + A);
  assert_int_equal(p.acts.total, 1926103040LL); /* 1.79 GiB */

  /* backend internals at B*T = 32,768, C = 768: 256 column-sum chunks;
   * ln_f asks 256 x 1,536 x 4 = 1.5 MiB, the fc bias 256 x 3,072 x 4 = 3 MiB,
   * which doubling from 1.5 MiB meets exactly. */
  assert_int_equal(p.scratch, 3LL << 20);
  assert_int_equal(p.cublaslt, 32LL << 20);
  assert_int_equal(p.tokens, 2LL * 32768 * 4);
  assert_int_equal(p.nccl, 0); /* one rank: no connections */
  /* calibrated on an H200: the context alone, as one rank makes no
   * communicator; with ST_NCCL_ONE_RANK=1 a communicator's 576 MiB too */
  assert_int_equal(p.context, 541LL << 20);
  const uint64_t one_rank_total = p.total;
  in.nccl_one_rank = 1;
  assert_int_equal(st_memory_plan_make(&in, &p), 0);
  assert_int_equal(p.context, (541LL + 576) << 20);
  assert_int_equal(p.nccl, 0);
  assert_int_equal(p.total, one_rank_total + (576LL << 20));
  in = gpt2_124m(2, 1, ST_RECOMPUTE_FULL);
  assert_int_equal(st_memory_plan_make(&in, &p), 0);
  /* two ranks always make one: the 1117 MiB the 2-rank calibration used */
  assert_int_equal(p.context, 1117LL << 20);
  /* 32 channel-equivalents x 1 peer x (4 MiB + 512 KiB + 4,915,200) */
  assert_int_equal(p.nccl, 32LL * (4194304 + 524288 + 4915200));
  assert_int_equal(st_plan_nccl_bytes(8, 0, 0), 32LL * 2 * (4194304 + 524288 + 4915200));
  assert_int_equal(st_plan_nccl_bytes(8, 1 << 20, 4), 4LL * 2 * (1048576 + 524288 + 4915200));
}

/* A GPT-2 block of width C (one head: the scratch does not see heads). */
static const st_model_config *gpt2w(int C) {
  static st_model_config c;
  c = (st_model_config){.n_layer = 1, .n_head = 1, .n_embd = C, .block_size = 1, .vocab_size = 2};
  return &c;
}

static void test_scratch_growth(void **state) {
  (void)state;
  /* Small: every request under 1 MiB -> the 1 MiB floor. */
  assert_int_equal(st_plan_cuda_scratch(256, gpt2w(64)), 1 << 20);
  /* rows 1,000: 8 chunks of 128 rows; C = 16,384: ln_f 8 x 32,768 x 4 = 1 MiB,
   * fc 8 x 65,536 x 4 = 2 MiB = 2 x 1 MiB. */
  assert_int_equal(st_plan_cuda_scratch(1000, gpt2w(16384)), 2 << 20);
  /* C = 10,000, 1 chunk: ln_f 80,000 B -> 1 MiB; fc 160,000 fits. */
  assert_int_equal(st_plan_cuda_scratch(100, gpt2w(10000)), 1 << 20);
  /* 1,024 chunks (rows 2^20: 1,024 rows per chunk); C = 1,024: ln_f 8 MiB,
   * fc 16 MiB = 2 x 8 MiB. */
  assert_int_equal(st_plan_cuda_scratch(1 << 20, gpt2w(1024)), 16 << 20);
  /* ln_f 1.25 MiB (C = 640, 256 chunks), then fc 2.5 MiB = 2 x 1.25 MiB. */
  assert_int_equal(st_plan_cuda_scratch(32768, gpt2w(640)), 2621440);
  /* Doubling overshoots the largest request when the first was raised to
   * the floor: C = 384, ln_f 0.75 MiB -> 1 MiB, then fc 1.5 MiB -> 2 MiB. */
  assert_int_equal(st_plan_cuda_scratch(32768, gpt2w(384)), 2 << 20);
  /* The Llama family at width 2048 (32 heads, 8 KV heads), 256 chunks: an
   * RMSNorm sums only its weight (256 x 2048 x 4 = 2 MiB) and Llama has no
   * bias to sum, so 2 MiB; Qwen2's q/k/v bias is (32 + 16) x 64 = 3072 wide,
   * 3 MiB, which doubles it to 4 MiB. GPT-2 at that width: ln_f 4 MiB, fc
   * 8192 wide, 8 MiB. */
  st_model_config fam = {.n_layer = 1, .n_head = 32, .n_kv_head = 8, .n_embd = 2048,
                         .ffn_dim = 8192, .block_size = 1, .vocab_size = 2};
  st_model_arch_defaults(&fam, ST_ARCH_LLAMA);
  assert_int_equal(st_plan_cuda_scratch(32768, &fam), 2 << 20);
  st_model_arch_defaults(&fam, ST_ARCH_QWEN2);
  assert_int_equal(st_plan_cuda_scratch(32768, &fam), 4 << 20);
  assert_int_equal(st_plan_cuda_scratch(32768, gpt2w(2048)), 8 << 20);
}

/* ---- headroom ---- */
static void test_headroom(void **state) {
  (void)state;
  st_plan_input in = gpt2_124m(1, 0, ST_RECOMPUTE_NONE);
  st_memory_plan p;
  assert_int_equal(st_memory_plan_make(&in, &p), 0);
  assert_int_equal(p.fits, -1);
  const uint64_t total = p.total;
  in.gpu_mem = total;
  in.headroom_pct = 0;
  assert_int_equal(st_memory_plan_make(&in, &p), 0);
  assert_int_equal(p.fits, 1);
  assert_int_equal(p.spare, 0);
  in.headroom_pct = 5;
  assert_int_equal(st_memory_plan_make(&in, &p), 0);
  assert_int_equal(p.fits, 0);
  assert_true(p.spare < 0);
  in.gpu_mem = 80ULL << 30;
  assert_int_equal(st_memory_plan_make(&in, &p), 0);
  assert_int_equal(p.usable, (80ULL << 30) - 4294967296ULL); /* 5% of 80 GiB = 4 GiB */
  assert_int_equal(p.spare, (int64_t)p.usable - (int64_t)p.total);
  assert_int_equal(p.fits, 1);
  /* bad input names the flag */
  in.headroom_pct = 100;
  assert_int_equal(st_memory_plan_make(&in, &p), -1);
  assert_non_null(strstr(st_error_msg(), "--headroom"));
  in = gpt2_124m(1, 0, ST_RECOMPUTE_NONE);
  in.backend = ST_BACKEND_CPU;
  assert_int_equal(st_memory_plan_make(&in, &p), -1);
  assert_non_null(strstr(st_error_msg(), "--precision"));
  in = gpt2_124m(1, 4, ST_RECOMPUTE_NONE);
  assert_int_equal(st_memory_plan_make(&in, &p), -1);
  assert_non_null(strstr(st_error_msg(), "--zero"));
}

/* ---- command-line helpers ---- */
static void test_sizes(void **state) {
  (void)state;
  uint64_t b;
  assert_int_equal(st_plan_parse_size("--gpu-mem", "24GiB", &b), 0);
  assert_int_equal(b, 24ULL << 30);
  assert_int_equal(st_plan_parse_size("--gpu-mem", "24G", &b), 0);
  assert_int_equal(b, 24ULL << 30);
  assert_int_equal(st_plan_parse_size("--gpu-mem", "80GB", &b), 0);
  assert_int_equal(b, 80000000000ULL);
  assert_int_equal(st_plan_parse_size("--gpu-mem", "81559MiB", &b), 0);
  assert_int_equal(b, 81559ULL << 20);
  assert_int_equal(st_plan_parse_size("--gpu-mem", "1.5TiB", &b), 0);
  assert_int_equal(b, 3ULL << 39);
  assert_int_equal(st_plan_parse_size("--gpu-mem", "4096B", &b), 0);
  assert_int_equal(b, 4096);
  assert_int_equal(st_plan_parse_size("--gpu-mem", "24 GiB", &b), 0);
  assert_int_equal(b, 24ULL << 30);
  const char *bad[] = {"24", "GiB", "-1GiB", "0GiB", "24XB", "nanGiB", "infGiB", ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(st_plan_parse_size("--gpu-mem", bad[i], &b), -1);
    assert_non_null(strstr(st_error_msg(), "--gpu-mem"));
    assert_int_equal(st_error_exit_code(), ST_EXIT_USAGE);
  }
  /* the message names what is wrong: the number, the missing unit, the unit */
  const struct {
    const char *text, *says;
  } why[] = {{"0GiB", "more than 0"},        {"-5GiB", "more than 0"},
             {"24gib", "does not read"},     {"16EiB", "does not read"},
             {"17179869184GiB", "64-bit"},   {"24", "with a unit"},
             {"banana", "with a unit"}};
  for (size_t i = 0; i < sizeof why / sizeof why[0]; i++) {
    assert_int_equal(st_plan_parse_size("--gpu-mem", why[i].text, &b), -1);
    if (!strstr(st_error_msg(), why[i].says))
      fail_msg("'%s': '%s' does not say '%s'", why[i].text, st_error_msg(), why[i].says);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plan_equals_allocation),
      cmocka_unit_test(test_lora_plan_equals_allocation),
      cmocka_unit_test(test_attention_state_formulas),
      cmocka_unit_test(test_family_shapes),
      cmocka_unit_test(test_gpt2_124m_parameters),
      cmocka_unit_test(test_gpt2_124m_activations),
      cmocka_unit_test(test_scratch_growth),
      cmocka_unit_test(test_headroom),
      cmocka_unit_test(test_sizes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
