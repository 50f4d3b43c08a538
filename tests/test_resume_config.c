/* test_resume_config.c - what a resume takes from the checkpoint's config
 * (rank/train/resume_config.c), from the real flag parser (launcher/cli.c) and
 * the real config writer (rank/train/run_config.c): settings not given come from
 * the checkpoint, given ones override and are listed, the cosine horizon
 * follows --steps unless it was set apart, a warmup capped to the horizon
 * stays capped, model-defining settings are
 * refused with exit 3 naming the flag, auto-fit keeps choosing what it
 * chooses, --steps below the checkpoint's step is a usage error, and the
 * source's bos/eos/pad ids are the checkpoint's.
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
#include "rank/train/resume_config.h"
#include "util/error.h"

/* rc from a command line given as one string of space-separated words. */
static void parse(const char *line, st_run_config *rc) {
  char buf[1024], *argv[64];
  int argc = 0;
  snprintf(buf, sizeof buf, "train %s", line);
  for (char *t = strtok(buf, " "); t && argc < 64; t = strtok(NULL, " ")) argv[argc++] = t;
  st_run_config_defaults(rc);
  assert_int_equal(st_cli_parse_train(argc, argv, rc), 0);
}

/* The checkpoint a run of `line` writes at `step` on `world` ranks (the
 * vocabulary as the data file gives it). */
static void written(const char *line, int64_t step, int world, st_ckpt_meta *meta) {
  st_run_config rc;
  parse(line, &rc);
  if (!rc.model.vocab_size) rc.model.vocab_size = 256; /* a family preset keeps its own */
  assert_int_equal(st_model_validate(&rc.model), 0);    /* as setup leaves it */
  memset(meta, 0, sizeof *meta);
  char *j = st_run_config_to_json(&rc);
  snprintf(meta->config_json, sizeof meta->config_json, "%s", j);
  free(j);
  meta->step = step;
  meta->world_size = world;
  meta->zero_stage = rc.zero_stage;
}

static const char *k_run = "--data d.h5 --model tiny --seq-len 32 --micro-batch 2 "
                           "--global-batch 8 --lr 2e-3 --warmup 3 --steps 6 --zero 2 --seed 7";

static void test_settings_not_given_come_from_the_checkpoint(void **state) {
  (void)state;
  st_ckpt_meta meta;
  written(k_run, 6, 2, &meta);
  st_run_config rc;
  parse("--data d.h5 --steps 9", &rc);
  st_resume_note note;
  assert_int_equal(st_resume_config_apply(&rc, &meta, "R/ckpt/step_00000006", 1, &note), 0);
  assert_int_equal(rc.model.n_layer, 2);
  assert_int_equal(rc.model.n_head, 4);
  assert_int_equal(rc.model.n_embd, 64);
  assert_int_equal(rc.model.block_size, 32);
  assert_int_equal(rc.model.vocab_size, 256);
  assert_string_equal(rc.model_name, "tiny");
  assert_int_equal(rc.micro_batch, 2);
  assert_int_equal(rc.global_batch, 8);
  assert_int_equal(rc.zero_stage, 2);
  assert_true(rc.optim.lr == 2e-3f);
  assert_int_equal(rc.optim.warmup_steps, 3);
  assert_int_equal((int)rc.seed, 7);
  assert_int_equal((int)rc.steps, 9);
  assert_int_equal((int)rc.optim.total_steps, 9); /* follows --steps: it did in the run */
  assert_non_null(strstr(note.text, "overridden on the command line: --steps 6 -> 9\n"));
  assert_non_null(strstr(note.text, "rank count 2 -> 1"));
  assert_non_null(strstr(note.text, "ends at step 9, not 6"));
  assert_non_null(strstr(note.text, "--lr-decay-steps 6"));
  assert_non_null(strstr(note.json, "\"lr_decay_steps_checkpoint\":6"));
  free(note.json);
}

static void test_given_settings_override_and_are_listed(void **state) {
  (void)state;
  st_ckpt_meta meta;
  written(k_run, 6, 1, &meta);
  st_run_config rc;
  parse("--data d.h5 --lr 1e-3 --micro-batch 4", &rc);
  st_resume_note note;
  assert_int_equal(st_resume_config_apply(&rc, &meta, "S", 1, &note), 0);
  assert_true(rc.optim.lr == 1e-3f);
  assert_int_equal(rc.micro_batch, 4);
  assert_int_equal((int)rc.steps, 6); /* not given: the checkpoint's */
  assert_non_null(strstr(note.text, "--micro-batch 2 -> 4, --lr 0.002 -> 0.001\n"));
  assert_null(strstr(note.text, "rank count"));
  assert_null(strstr(note.text, "cosine"));
  assert_non_null(strstr(note.json, "\"--lr\":{\"checkpoint\":0.002,\"now\":0.001}"));
  free(note.json);
}

static void test_a_horizon_set_apart_is_kept(void **state) {
  (void)state;
  st_ckpt_meta meta;
  char line[512];
  snprintf(line, sizeof line, "%s --lr-decay-steps 20", k_run);
  written(line, 6, 1, &meta);
  st_run_config rc;
  parse("--data d.h5 --steps 12", &rc);
  st_resume_note note;
  assert_int_equal(st_resume_config_apply(&rc, &meta, "S", 1, &note), 0);
  assert_int_equal((int)rc.optim.total_steps, 20);
  assert_null(strstr(note.text, "cosine"));
  free(note.json);
}

/* A warmup the run capped to its horizon (README, --warmup) is what the run
 * trained with, and a resume with more --steps keeps it: the checkpoint's
 * config holds the capped length. --warmup on the resume sets another and is
 * listed like any override. */
static void test_a_capped_warmup_stays_capped(void **state) {
  (void)state;
  st_ckpt_meta meta;
  written("--data d.h5 --model tiny --seq-len 32 --micro-batch 2 --global-batch 8 "
          "--warmup 10 --steps 6", 6, 1, &meta);
  assert_non_null(strstr(meta.config_json, "\"warmup_steps\":6"));
  st_run_config rc;
  parse("--data d.h5 --steps 12", &rc);
  st_resume_note note;
  assert_int_equal(st_resume_config_apply(&rc, &meta, "S", 1, &note), 0);
  assert_int_equal(rc.optim.warmup_steps, 6);
  assert_int_equal((int)rc.optim.total_steps, 12);
  assert_null(strstr(note.text, "--warmup"));
  free(note.json);
  parse("--data d.h5 --steps 12 --warmup 10", &rc);
  assert_int_equal(st_resume_config_apply(&rc, &meta, "S", 1, &note), 0);
  assert_int_equal(rc.optim.warmup_steps, 10);
  assert_non_null(strstr(note.text, "--steps 6 -> 12, --warmup 6 -> 10"));
  free(note.json);
  /* given, but longer than the resumed horizon too: capped to it again */
  parse("--data d.h5 --steps 8 --warmup 10", &rc);
  assert_int_equal(st_resume_config_apply(&rc, &meta, "S", 1, &note), 0);
  assert_int_equal(rc.optim.warmup_steps, 8);
  free(note.json);
}

static void expect_refused(const char *line, const char *words) {
  st_ckpt_meta meta;
  written(k_run, 6, 1, &meta);
  st_run_config rc;
  parse(line, &rc);
  assert_int_equal(st_resume_config_apply(&rc, &meta, "S", 1, NULL), -1);
  assert_int_equal(st_error_exit_code(), ST_EXIT_CHECKPOINT);
  if (!strstr(st_error_msg(), words)) fail_msg("'%s' not in: %s", words, st_error_msg());
}

static void test_model_defining_settings_are_refused(void **state) {
  (void)state;
  expect_refused("--data d.h5 --heads 8", "--heads 8 differs from the checkpoint S");
  expect_refused("--data d.h5 --heads 2 --layers 2 --dim 64", "--heads 2 differs");
  expect_refused("--data d.h5 --seq-len 64", "--seq-len 64 differs");
  expect_refused("--data d.h5 --vocab-size 512", "--vocab-size 512 differs");
  expect_refused("--data d.h5 --model small", "--model small sets --layers 4");
  /* the checkpoint's own shape, given again, is not a difference */
  st_ckpt_meta meta;
  written(k_run, 6, 1, &meta);
  st_run_config rc;
  parse("--data d.h5 --model tiny --heads 4 --seq-len 32 --vocab-size 256", &rc);
  assert_int_equal(st_resume_config_apply(&rc, &meta, "S", 1, NULL), 0);
}

/* The architecture: a resume continues the checkpoint's description when
 * no model flag is given, and refuses one that differs naming the flag
 * that set it (its own, --arch or --model). */
static const char *k_llama = "--data d.h5 --arch llama --layers 2 --heads 4 --kv-heads 2 "
                             "--dim 64 --ffn-dim 96 --norm-eps 1e-6 --tied 0 --seq-len 32";

static void expect_refused_from(const char *run, const char *line, const char *words) {
  st_ckpt_meta meta;
  written(run, 6, 1, &meta);
  st_run_config rc;
  parse(line, &rc);
  assert_int_equal(st_resume_config_apply(&rc, &meta, "S", 1, NULL), -1);
  assert_int_equal(st_error_exit_code(), ST_EXIT_CHECKPOINT);
  if (!strstr(st_error_msg(), words)) fail_msg("'%s' not in: %s", words, st_error_msg());
}

static void test_architecture_comes_from_the_checkpoint(void **state) {
  (void)state;
  st_ckpt_meta meta;
  written(k_llama, 6, 1, &meta);
  st_run_config rc;
  parse("--data d.h5 --steps 9", &rc);
  assert_int_equal(st_resume_config_apply(&rc, &meta, "S", 1, NULL), 0);
  const st_model_config *m = &rc.model;
  assert_int_equal(m->arch, ST_ARCH_LLAMA);
  assert_int_equal(m->n_kv_head, 2);
  assert_int_equal(m->ffn_dim, 96);
  assert_int_equal(m->norm, ST_NORM_RMSNORM);
  assert_true(m->norm_eps == 1e-6f);
  assert_int_equal(m->pos, ST_POS_ROPE);
  assert_true(m->rope_theta == 500000.0f);
  assert_int_equal(m->mlp, ST_MLP_SWIGLU);
  assert_int_equal(m->no_bias, ST_NO_BIAS_ALL);
  assert_int_equal(m->untied, 1);
  assert_string_equal(rc.model_name, "custom");
  /* given again as they were: no difference */
  parse(k_llama, &rc);
  assert_int_equal(st_resume_config_apply(&rc, &meta, "S", 1, NULL), 0);
  /* a family preset round-trips through its checkpoint */
  written("--data d.h5 --model smollm2-135m --seq-len 64", 6, 1, &meta);
  parse("--data d.h5", &rc);
  assert_int_equal(st_resume_config_apply(&rc, &meta, "S", 1, NULL), 0);
  assert_int_equal(rc.model.vocab_size, 49152);
  assert_int_equal(rc.model.block_size, 8192);
  assert_int_equal(rc.model.n_kv_head, 3);
  assert_int_equal(rc.seq_len, 64);
  assert_string_equal(rc.model_name, "smollm2-135m");
  parse("--data d.h5 --model smollm2-135m --seq-len 64", &rc);
  assert_int_equal(st_resume_config_apply(&rc, &meta, "S", 1, NULL), 0);

  expect_refused_from(k_llama, "--data d.h5 --kv-heads 4",
                      "--kv-heads 4 differs from the checkpoint S, written with --kv-heads 2");
  expect_refused_from(k_llama, "--data d.h5 --ffn-dim 128", "--ffn-dim 128 differs");
  expect_refused_from(k_llama, "--data d.h5 --norm-eps 1e-5", "--norm-eps 1e-05 differs");
  expect_refused_from(k_llama, "--data d.h5 --tied 1", "--tied 1 differs from the checkpoint S, written with --tied 0");
  expect_refused_from(k_llama, "--data d.h5 --rope-theta 10000", "--rope-theta 10000 differs");
  expect_refused_from(k_llama, "--data d.h5 --arch qwen2", "--arch qwen2 differs");
  expect_refused_from(k_llama, "--data d.h5 --model tiny",
                      "--model tiny sets --arch gpt2, but the checkpoint S was written with "
                      "--arch llama");
  /* an old GPT-2 checkpoint reads as GPT-2: another architecture is refused */
  expect_refused_from(k_run, "--data d.h5 --arch llama", "--arch llama differs from the "
                      "checkpoint S, written with --arch gpt2");
  expect_refused_from(k_run, "--data d.h5 --kv-heads 2", "--kv-heads 2 differs");
  /* the same GPT-2, named: --kv-heads 4 of 4 heads is what it has */
  written(k_run, 6, 1, &meta);
  parse("--data d.h5 --kv-heads 4 --ffn-dim 256 --tied 1", &rc);
  assert_int_equal(st_resume_config_apply(&rc, &meta, "S", 1, NULL), 0);
}

/* A checkpoint written before the architecture fields: its config has the
 * shape only, and resumes as the GPT-2 it is. */
static void test_old_checkpoint_resumes_as_gpt2(void **state) {
  (void)state;
  st_ckpt_meta meta;
  memset(&meta, 0, sizeof meta);
  snprintf(meta.config_json, sizeof meta.config_json,
           "{\"model\":{\"name\":\"tiny\",\"n_layer\":2,\"n_head\":4,\"n_embd\":64,"
           "\"block_size\":32,\"vocab_size\":256,\"padded_vocab_size\":256},"
           "\"train\":{\"seq_len\":32,\"steps\":6}}");
  meta.step = 6;
  meta.world_size = 1;
  st_run_config rc;
  parse("--data d.h5 --steps 8", &rc);
  rc.model.arch = ST_ARCH_QWEN2; /* not given: the checkpoint's GPT-2 replaces it */
  assert_int_equal(st_resume_config_apply(&rc, &meta, "S", 1, NULL), 0);
  assert_int_equal(rc.model.arch, ST_ARCH_GPT2);
  assert_int_equal(rc.model.norm, ST_NORM_LAYERNORM);
  assert_int_equal(rc.model.n_layer, 2);
  assert_int_equal(st_model_validate(&rc.model), 0);
  assert_int_equal(rc.model.n_kv_head, 4);
}

static void test_auto_fit_chooses_again(void **state) {
  (void)state;
  st_ckpt_meta meta;
  written(k_run, 6, 1, &meta);
  st_run_config rc;
  parse("--data d.h5 --auto-fit-zero", &rc);
  assert_int_equal(st_resume_config_apply(&rc, &meta, "S", 1, NULL), 0);
  assert_int_equal(rc.micro_batch, 8);  /* the default: auto-fit's bound, not the checkpoint's */
  assert_int_equal(rc.zero_stage, 1);   /* the default; --auto-fit-zero picks */
  assert_int_equal(rc.global_batch, 8); /* still the checkpoint's */
}

static void test_steps_below_the_checkpoint(void **state) {
  (void)state;
  st_ckpt_meta meta;
  written(k_run, 6, 1, &meta);
  st_run_config rc;
  parse("--data d.h5 --steps 4", &rc);
  assert_int_equal(st_resume_config_apply(&rc, &meta, "S", 1, NULL), -1);
  assert_int_equal(st_error_exit_code(), ST_EXIT_USAGE);
  assert_non_null(strstr(st_error_msg(), "--steps 4 is below the step of the checkpoint S (6)"));
}

/* The bos/eos/pad ids a fine-tune's checkpoint carries (its "hf_special_ids",
 * or an older import's "imported_from" copy) are the resumed run's, whose
 * checkpoints write them again for `ckpt export`; none in the checkpoint
 * leaves none. */
static void test_special_ids_come_from_the_checkpoint(void **state) {
  (void)state;
  st_ckpt_meta meta;
  st_run_config rc;
  parse(k_run, &rc);
  rc.model.vocab_size = 256;
  cJSON *ids = cJSON_Parse("{\"bos_token_id\":1,\"eos_token_id\":[2,3]}");
  assert_int_equal(st_run_config_set_special_ids(&rc, ids, "SRC"), 0);
  cJSON_Delete(ids);
  char *j = st_run_config_to_json(&rc);
  memset(&meta, 0, sizeof meta);
  snprintf(meta.config_json, sizeof meta.config_json, "%s", j);
  free(j);
  meta.step = 2;
  meta.world_size = 1;
  parse("--data d.h5", &rc);
  assert_string_equal(rc.hf_special_ids, "");
  assert_int_equal(st_resume_config_apply(&rc, &meta, "S", 1, NULL), 0);
  assert_string_equal(rc.hf_special_ids, "{\"bos_token_id\":1,\"eos_token_id\":[2,3]}");
  j = st_run_config_to_json(&rc);
  assert_non_null(strstr(j, "\"hf_special_ids\":{\"bos_token_id\":1,\"eos_token_id\":[2,3]}"));
  free(j);
  /* an import written before runs carried them: under imported_from */
  written(k_run, 0, 1, &meta);
  cJSON *o = cJSON_Parse(meta.config_json);
  cJSON *imp = cJSON_AddObjectToObject(o, "imported_from");
  cJSON_AddItemToObject(imp, "hf_special_ids", cJSON_Parse("{\"eos_token_id\":7}"));
  j = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  snprintf(meta.config_json, sizeof meta.config_json, "%s", j);
  cJSON_free(j);
  parse("--data d.h5", &rc);
  assert_int_equal(st_resume_config_apply(&rc, &meta, "S", 1, NULL), 0);
  assert_string_equal(rc.hf_special_ids, "{\"eos_token_id\":7}");
  /* none in the checkpoint: none in the run */
  written(k_run, 6, 1, &meta);
  snprintf(rc.hf_special_ids, sizeof rc.hf_special_ids, "{\"bos_token_id\":9}");
  assert_int_equal(st_resume_config_apply(&rc, &meta, "S", 1, NULL), 0);
  assert_string_equal(rc.hf_special_ids, "");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_settings_not_given_come_from_the_checkpoint),
      cmocka_unit_test(test_given_settings_override_and_are_listed),
      cmocka_unit_test(test_a_horizon_set_apart_is_kept),
      cmocka_unit_test(test_a_capped_warmup_stays_capped),
      cmocka_unit_test(test_model_defining_settings_are_refused),
      cmocka_unit_test(test_architecture_comes_from_the_checkpoint),
      cmocka_unit_test(test_old_checkpoint_resumes_as_gpt2),
      cmocka_unit_test(test_auto_fit_chooses_again),
      cmocka_unit_test(test_steps_below_the_checkpoint),
      cmocka_unit_test(test_special_ids_come_from_the_checkpoint),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
