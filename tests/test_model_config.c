/* test_model_config.c - the model description's JSON (rank/model/config.c,
 * config_fields.c) and the model flags (launcher/cli.c).
 *
 * 1. Every preset, and descriptions with every field off its default, go
 *    through st_model_to_json / st_model_from_json and come back equal
 *    field by field; the JSON names enums and booleans.
 * 2. A config written before the architecture fields existed (the shape
 *    alone) reads as GPT-2; wrong types and unknown names are refused
 *    naming the key.
 * 3. The flags: --model, then --arch, then single fields, whatever their
 *    order on the command line; a family preset keeps its vocabulary and
 *    positions while --seq-len sets only T; a GPT-2 preset and flags give
 *    positions = T and the vocabulary to the data; model_set_by records
 *    who set what; bad values are usage errors naming the flag.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <cjson/cJSON.h>

#include "launcher/cli.h"
#include "rank/model/config_fields.h"
#include "util/error.h"

static void assert_same(const st_model_config *a, const st_model_config *b) {
  for (int i = 0; i < ST_MF_COUNT; i++) {
    const st_model_field_id id = (st_model_field_id)i;
    if (st_model_field_get(a, id) != st_model_field_get(b, id))
      fail_msg("field %s: %g != %g", st_model_field_info(id)->key, st_model_field_get(a, id),
               st_model_field_get(b, id));
  }
  assert_int_equal(a->padded_vocab_size, b->padded_vocab_size);
  assert_int_equal(a->no_bias, b->no_bias);
}

static void round_trip(const st_model_config *c) {
  char *j = st_model_to_json(c);
  assert_non_null(j);
  st_model_config back;
  memset(&back, 0x5a, sizeof back); /* from_json must set every field */
  assert_int_equal(st_model_from_json(j, &back), 0);
  assert_same(c, &back);
  free(j);
}

static void test_round_trip(void **state) {
  (void)state;
  const char *names[] = {"tiny", "small", "gpt2-124m", "gpt2-1558m", "llama-3.2-1b",
                         "llama-3.2-3b", "llama-3.1-8b", "qwen2.5-0.5b", "qwen2.5-1.5b",
                         "smollm2-135m", "smollm2-360m"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    st_model_config c;
    memset(&c, 0, sizeof c);
    assert_int_equal(st_model_preset(names[i], &c), 0);
    if (!c.vocab_size) c.vocab_size = 50257, c.block_size = 1024;
    assert_int_equal(st_model_validate(&c), 0);
    round_trip(&c);
  }
  /* every field away from every default, biases one by one */
  for (unsigned nb = 0; nb <= ST_NO_BIAS_ALL; nb++) {
    st_model_config c = {.n_layer = 3, .n_head = 6, .n_embd = 96, .block_size = 77,
                         .vocab_size = 1000};
    st_model_arch_defaults(&c, ST_ARCH_QWEN2);
    c.n_kv_head = 2;
    c.ffn_dim = 250;
    c.norm_eps = 3e-6f;
    c.rope_theta = 12345.5f;
    c.rope_scaling = (st_rope_scaling){ST_ROPE_SCALING_LLAMA3, 8.0f, 1.5f, 4.25f, 4096};
    c.no_bias = nb;
    c.untied = (int)(nb & 1);
    assert_int_equal(st_model_validate(&c), 0);
    round_trip(&c);
  }
  /* the JSON says what it means by name */
  st_model_config c;
  memset(&c, 0, sizeof c);
  assert_int_equal(st_model_preset("llama-3.2-1b", &c), 0);
  assert_int_equal(st_model_validate(&c), 0);
  char *j = st_model_to_json(&c);
  const char *want[] = {"\"arch\":\"llama\"", "\"n_kv_head\":8", "\"ffn_dim\":8192",
                        "\"norm\":\"rmsnorm\"", "\"pos\":\"rope\"", "\"rope_theta\":500000",
                        "\"rope_scaling\":\"llama3\"", "\"rope_factor\":32",
                        "\"rope_original_max_position_embeddings\":8192", "\"mlp\":\"swiglu\"",
                        "\"qkv_bias\":false", "\"tied\":true", "\"norm_eps\":1e-05",
                        "\"vocab_size\":128256", "\"block_size\":131072"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    if (!strstr(j, want[i])) fail_msg("%s lacks %s", j, want[i]);
  free(j);
}

static void test_old_config_reads_as_gpt2(void **state) {
  (void)state;
  /* what st_model_to_json wrote before the architecture fields */
  const char *old = "{\"model\":{\"name\":\"tiny\",\"n_layer\":2,\"n_head\":4,\"n_embd\":64,"
                    "\"block_size\":32,\"vocab_size\":256,\"padded_vocab_size\":256}}";
  st_model_config c;
  assert_int_equal(st_model_from_json(old, &c), 0);
  st_model_config g = {.n_layer = 2, .n_head = 4, .n_embd = 64, .block_size = 32,
                       .vocab_size = 256};
  assert_int_equal(st_model_validate(&c), 0);
  assert_int_equal(st_model_validate(&g), 0);
  assert_same(&c, &g);
  assert_int_equal(c.arch, ST_ARCH_GPT2);
  assert_int_equal(c.norm, ST_NORM_LAYERNORM);
  assert_int_equal(c.pos, ST_POS_LEARNED);
  assert_int_equal(c.mlp, ST_MLP_GELU);
  assert_int_equal(c.no_bias, 0);
  assert_int_equal(c.untied, 0);
  assert_int_equal(c.n_kv_head, 4);
  assert_int_equal(c.ffn_dim, 256);

  const char *bad[][2] = {
      {"{\"n_layer\":2,\"n_head\":4,\"n_embd\":64,\"block_size\":32,\"vocab_size\":256,"
       "\"padded_vocab_size\":256,\"norm\":\"batchnorm\"}",
       "'norm' must be one of layernorm|rmsnorm"},
      {"{\"n_layer\":2,\"n_head\":4,\"n_embd\":64,\"block_size\":32,\"vocab_size\":256,"
       "\"padded_vocab_size\":256,\"tied\":1}",
       "'tied' must be true or false"},
      {"{\"n_layer\":2,\"n_head\":4,\"n_embd\":64,\"block_size\":32,\"vocab_size\":256,"
       "\"padded_vocab_size\":256,\"n_kv_head\":\"2\"}",
       "numeric field 'n_kv_head'"},
      {"{\"n_layer\":2,\"n_head\":4,\"n_embd\":64,\"vocab_size\":256,\"padded_vocab_size\":256}",
       "numeric field 'block_size'"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(st_model_from_json(bad[i][0], &c), -1);
    if (!strstr(st_error_msg(), bad[i][1])) fail_msg("'%s' lacks '%s'", st_error_msg(), bad[i][1]);
  }
}

/* rc from a command line of space-separated words; the parser's result. */
static int parse(const char *line, st_run_config *rc) {
  char buf[1024], *argv[64];
  int argc = 0;
  snprintf(buf, sizeof buf, "train --data d.h5 %s", line);
  for (char *t = strtok(buf, " "); t && argc < 64; t = strtok(NULL, " ")) argv[argc++] = t;
  st_run_config_defaults(rc);
  return st_cli_parse_train(argc, argv, rc);
}

static void test_flag_order(void **state) {
  (void)state;
  st_run_config a, b;
  /* preset, then --arch, then single flags: the command line's order does not matter */
  assert_int_equal(parse("--kv-heads 4 --rope-theta 20000 --arch qwen2 --model llama-3.2-1b", &a),
                   0);
  assert_int_equal(parse("--model llama-3.2-1b --arch qwen2 --kv-heads 4 --rope-theta 20000", &b),
                   0);
  assert_same(&a.model, &b.model);
  assert_int_equal(a.model.arch, ST_ARCH_QWEN2);
  assert_int_equal(a.model.no_bias, ST_NO_BIAS_ALL & ~ST_NO_BIAS_QKV); /* --arch qwen2's */
  assert_true(a.model.norm_eps == 1e-6f);                               /* --arch qwen2's */
  assert_true(a.model.rope_theta == 20000.0f);                          /* the flag's */
  assert_int_equal(a.model.n_kv_head, 4);
  assert_int_equal(a.model.n_layer, 16); /* the preset's shape */
  assert_int_equal(a.model.ffn_dim, 8192);
  assert_int_equal(a.model.vocab_size, 128256);
  assert_int_equal(a.model.block_size, 131072);
  assert_int_equal(a.seq_len, 128); /* T keeps its default; the positions are the preset's */
  assert_string_equal(a.model_name, "llama-3.2-1b");
  assert_int_equal(a.model_set_by[ST_MF_LAYERS], ST_SET_PRESET);
  assert_int_equal(a.model_set_by[ST_MF_VOCAB], ST_SET_PRESET);
  assert_int_equal(a.model_set_by[ST_MF_NORM], ST_SET_ARCH);
  assert_int_equal(a.model_set_by[ST_MF_ARCH], ST_SET_FLAG);
  assert_int_equal(a.model_set_by[ST_MF_KV_HEADS], ST_SET_FLAG);
  assert_int_equal(a.model_set_by[ST_MF_ROPE_THETA], ST_SET_FLAG);
  char by[96];
  assert_string_equal(st_run_config_set_by(&a, ST_MF_NORM, by, sizeof by), "--arch qwen2");
  assert_string_equal(st_run_config_set_by(&a, ST_MF_FFN, by, sizeof by), "--model llama-3.2-1b");

  /* a family preset: --seq-len is T, at most its positions */
  assert_int_equal(parse("--seq-len 2048 --model smollm2-360m", &a), 0);
  assert_int_equal(a.seq_len, 2048);
  assert_int_equal(a.model.block_size, 8192);
  assert_int_equal(st_run_config_check_model(&a), 0);
  assert_int_equal(parse("--model smollm2-360m --seq-len 9000", &a), 0);
  assert_int_equal(st_run_config_check_model(&a), -1);
  assert_int_equal(st_error_exit_code(), ST_EXIT_USAGE);
  assert_non_null(strstr(st_error_msg(), "--seq-len 9000 exceeds the model's 8192 positions "
                                         "(--model smollm2-360m)"));

  /* GPT-2 presets and flags: positions = T, vocabulary from the data (0) */
  assert_int_equal(parse("--seq-len 64 --model tiny", &a), 0);
  assert_int_equal(a.model.block_size, 64);
  assert_int_equal(a.model.vocab_size, 0);
  assert_int_equal(a.model_set_by[ST_MF_VOCAB], ST_SET_NONE);
  assert_int_equal(a.model_set_by[ST_MF_POSITIONS], ST_SET_NONE);
  assert_int_equal(a.model_set_by[ST_MF_HEADS], ST_SET_PRESET);
  assert_int_equal(parse("--arch llama --layers 2 --heads 4 --dim 64 --kv-heads 2 --ffn-dim 96 "
                         "--tied 0 --norm-eps 1e-6 --seq-len 48", &a), 0);
  assert_string_equal(a.model_name, "custom");
  assert_int_equal(a.model.block_size, 48);
  assert_int_equal(a.model.vocab_size, 0);
  assert_int_equal(a.model.pos, ST_POS_ROPE);
  assert_int_equal(a.model.untied, 1);
  assert_int_equal(a.model.ffn_dim, 96);
  assert_true(a.model.norm_eps == 1e-6f);
  assert_int_equal(st_run_config_check_model(&a), 0);
  /* GPT-2 takes neither an epsilon nor a rotary base */
  assert_int_equal(parse("--norm-eps 1e-5", &a), 0);
  assert_int_equal(st_run_config_check_model(&a), -1);
  assert_non_null(strstr(st_error_msg(), "--norm-eps 1e-05 is RMSNorm's epsilon"));
  assert_int_equal(parse("--model gpt2-124m --rope-theta 10000", &a), 0);
  assert_int_equal(st_run_config_check_model(&a), -1);
  assert_non_null(strstr(st_error_msg(), "--rope-theta 10000 is the base of rotary positions"));

  /* bad values: usage errors naming the flag */
  const char *bad[][2] = {{"--arch mistral", "unknown --arch 'mistral'; use gpt2, llama or qwen2"},
                          {"--tied yes", "--tied must be one of 0|1, got 'yes'"},
                          {"--kv-heads 0", "--kv-heads expects an integer in [1, 4096]"},
                          {"--dim 100000", "--dim expects an integer in [1, 65536]"},
                          {"--layers 1001", "--layers expects an integer in [1, 1000]"},
                          {"--ffn-dim 2000000", "--ffn-dim expects an integer in [1, 1048576]"},
                          {"--norm-eps 0", "--norm-eps expects a finite number"},
                          {"--rope-theta nan", "--rope-theta expects a finite number"},
                          {"--ffn-dim", "flag --ffn-dim needs a value"},
                          {"--kv-head 2", "unknown flag '--kv-head' (did you mean --kv-heads?)"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    st_error_code(ST_EXIT_ERROR);
    assert_int_equal(parse(bad[i][0], &a), -1);
    assert_int_equal(st_error_exit_code(), ST_EXIT_USAGE);
    if (!strstr(st_error_msg(), bad[i][1])) fail_msg("'%s' lacks '%s'", st_error_msg(), bad[i][1]);
  }
}

/* The configuration line for a non-GPT-2 model, and the flags that give a
 * model's shape (the OOM report's plan command). */
static void test_describe(void **state) {
  (void)state;
  st_model_config c;
  memset(&c, 0, sizeof c);
  assert_int_equal(st_model_preset("qwen2.5-0.5b", &c), 0);
  assert_int_equal(st_model_validate(&c), 0);
  char d[256];
  assert_string_equal(st_model_describe(&c, d, sizeof d),
                      "qwen2: 2 KV heads of 64, FFN 4864 SwiGLU, RMSNorm eps 1e-06, RoPE theta "
                      "1e+06, q/k/v biases only, tied head");
  assert_string_equal(st_model_flags(&c, d, sizeof d),
                      "--layers 24 --heads 14 --dim 896 --vocab-size 151936 --arch qwen2 "
                      "--kv-heads 2 --ffn-dim 4864 --rope-theta 1e+06 --norm-eps 1e-06 --tied 1");
  st_model_config g = {.n_layer = 2, .n_head = 4, .n_embd = 64, .block_size = 32,
                       .vocab_size = 256};
  assert_int_equal(st_model_validate(&g), 0);
  assert_string_equal(st_model_describe(&g, d, sizeof d), "");
  assert_string_equal(st_model_flags(&g, d, sizeof d),
                      "--layers 2 --heads 4 --dim 64 --vocab-size 256");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_old_config_reads_as_gpt2),
      cmocka_unit_test(test_flag_order),
      cmocka_unit_test(test_describe),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
