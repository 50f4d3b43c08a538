/* memory_plan_fixtures.h - the model the memory tests share
 * (test_memory_plan.c, test_memory_fit.c); include after <cmocka.h>.
 */
#ifndef ST_TESTS_MEMORY_PLAN_FIXTURES_H
#define ST_TESTS_MEMORY_PLAN_FIXTURES_H

#include "rank/memory/memory_plan.h"

/* GPT-2 124M (12 layers, 12 heads, width 768, T = 1024, vocabulary 50,257;
 * docs/memory.md, "GPT-2 124M") at micro-batch 32 in bf16 on the CUDA
 * backend's shape, on `world` ranks at ZeRO stage `zero` with `rec`. */
static inline st_plan_input gpt2_124m(int world, int zero, st_recompute rec) {
  st_plan_input in = {.micro_batch = 32, .world = world, .zero_stage = zero, .dtype = ST_BF16,
                      .recompute = rec, .backend = ST_BACKEND_CUDA};
  in.model = (st_model_config){.n_layer = 12, .n_head = 12, .n_embd = 768, .block_size = 1024,
                               .vocab_size = 50257};
  assert_int_equal(st_model_validate(&in.model), 0);
  return in;
}

#endif
