/* tiny_config.h - the tiny model shape the CPU model tests share
 * (test_model_family.c; test_lora.c and test_qlora.c through
 * lora_fixtures.h); include after <cmocka.h>.
 */
#ifndef ST_TESTS_TINY_CONFIG_H
#define ST_TESTS_TINY_CONFIG_H

#include "rank/model/config.h"

/* 2 layers, 4 heads, width 32, 16 positions, vocabulary 67 (padded to 128:
 * there are padded rows), with the family's defaults. Not
 * validated: tests set their own fields first, and st_model_validate fills
 * what is still 0. */
static inline st_model_config tiny_config(st_arch arch) {
  st_model_config c = {.n_layer = 2, .n_head = 4, .n_embd = 32, .block_size = 16,
                       .vocab_size = 67};
  st_model_arch_defaults(&c, arch);
  return c;
}

/* The Llama shape: grouped-query attention (2 KV heads), F 48, untied
 * head; not validated, as tiny_config. */
static inline st_model_config tiny_llama_shape(void) {
  st_model_config c = tiny_config(ST_ARCH_LLAMA);
  c.n_kv_head = 2;
  c.ffn_dim = 48;
  c.untied = 1;
  return c;
}

#endif
