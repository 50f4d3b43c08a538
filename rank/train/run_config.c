/* run_config.c - run configuration defaults and JSON (see run_config.h). */
#include "rank/train/run_config.h"
#include "rank/memory/nccl_buffsize.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/decimal.h"
#include "util/error.h"

void st_run_config_defaults(st_run_config *rc) {
  memset(rc, 0, sizeof *rc);
  snprintf(rc->model_name, sizeof rc->model_name, "small");
  st_model_preset("small", &rc->model);
  rc->model.block_size = 128;
  rc->seq_len = 128;
  rc->model.vocab_size = 0; /* from the data file */
  rc->micro_batch = 8;
  rc->global_batch = 16;
  rc->zero_stage = 1;
  snprintf(rc->precision, sizeof rc->precision, "auto");
  snprintf(rc->recompute, sizeof rc->recompute, "none");
  snprintf(rc->base_dtype, sizeof rc->base_dtype, "bf16");
  snprintf(rc->attention, sizeof rc->attention, "auto");
  snprintf(rc->shuffle, sizeof rc->shuffle, "auto");
  snprintf(rc->grad_dtype, sizeof rc->grad_dtype, "fp32");
  rc->loss_scale_max = 16777216.0f;
  snprintf(rc->device, sizeof rc->device, "auto");
  snprintf(rc->out, sizeof rc->out, "runs/default");
  snprintf(rc->resume, sizeof rc->resume, "auto");
  rc->steps = 100;
  rc->optim = (st_optim_config){.lr = 1e-3f, .min_lr_frac = 0.1f, .warmup_steps = 20,
                                .total_steps = 100, .beta1 = 0.9f, .beta2 = 0.95f,
                                .eps = 1e-8f, .weight_decay = 0.1f, .grad_clip = 1.0f};
  rc->seed = 1337;
  rc->ckpt_every = 0;
  rc->ckpt_async = 1;
  rc->val_every = 0;
  rc->val_seqs = 256;
  rc->log_every = 1;
  rc->headroom_pct = 5.0f;
  rc->mem_warn_fraction = 0.9f;
  rc->nccl_timeout_s = 600;
  rc->nccl_cga = -1;
  rc->nccl_overlap_ctas = 4;
}

void st_run_config_set_tokenizer(st_run_config *rc, const char *name, const char *digest,
                                 int vocab) {
  snprintf(rc->tokenizer_name, sizeof rc->tokenizer_name, "%s", name ? name : "");
  snprintf(rc->tokenizer_digest, sizeof rc->tokenizer_digest, "%s", digest ? digest : "");
  rc->tokenizer_vocab = vocab;
}

int st_run_config_set_special_ids(st_run_config *rc, const cJSON *ids, const char *from) {
  rc->hf_special_ids[0] = 0;
  if (!cJSON_IsObject(ids) || !ids->child) return 0;
  char *text = cJSON_PrintUnformatted(ids);
  if (!text)
    return st_error_setc(ST_EXIT_ERROR, "out of host memory for the special token ids of %s", from);
  const size_t n = strlen(text);
  if (n < sizeof rc->hf_special_ids) memcpy(rc->hf_special_ids, text, n + 1);
  cJSON_free(text);
  if (n >= sizeof rc->hf_special_ids)
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: its bos/eos/pad token ids take %zu characters "
                         "of JSON, more than the %zu a checkpoint keeps; shorten eos_token_id's "
                         "list in its config.json", from, n, sizeof rc->hf_special_ids - 1);
  return 0;
}

int st_run_config_base_dtype(st_run_config *rc) {
  const int nf4 = strcmp(rc->base_dtype, "nf4") == 0;
  if (nf4 && !rc->lora_spec[0])
    return st_error_setc(ST_EXIT_USAGE, "--base-dtype nf4 quantises a frozen LoRA base: add "
                         "--lora RANK, or drop --base-dtype");
  rc->lora.nf4_base = nf4 && rc->lora.rank > 0;
  return 0;
}

int st_run_config_given(const st_run_config *rc, const char *flag) {
  char key[80];
  snprintf(key, sizeof key, " %s ", flag);
  return strstr(rc->given, key) != NULL;
}

void st_run_config_mark_given(st_run_config *rc, const char *flag) {
  if (st_run_config_given(rc, flag)) return;
  size_t n = strlen(rc->given), k = strlen(flag);
  if (n == 0 && k + 2 < sizeof rc->given) rc->given[n++] = ' ';
  if (n + k + 2 > sizeof rc->given) return;
  memcpy(rc->given + n, flag, k);
  rc->given[n + k] = ' ';
  rc->given[n + k + 1] = 0;
}

const char *st_run_config_set_by(const st_run_config *rc, st_model_field_id id, char *buf,
                                 size_t cap) {
  switch ((st_set_by)rc->model_set_by[id]) {
  case ST_SET_FLAG: snprintf(buf, cap, "%s", st_model_field_info(id)->flag); return buf;
  case ST_SET_PRESET: snprintf(buf, cap, "--model %s", rc->model_name); return buf;
  case ST_SET_ARCH: snprintf(buf, cap, "--arch %s", st_arch_name(rc->model.arch)); return buf;
  case ST_SET_NONE: break;
  }
  return NULL;
}

int st_run_config_check_model(const st_run_config *rc) {
  const st_model_config *m = &rc->model;
  if (rc->model_set_by[ST_MF_NORM_EPS] == ST_SET_FLAG && m->norm == ST_NORM_LAYERNORM)
    return st_error_setc(ST_EXIT_USAGE, "--norm-eps %g is RMSNorm's epsilon, but this model "
                         "(--arch %s) has LayerNorm, whose epsilon is 1e-5: drop --norm-eps, or "
                         "give --arch llama|qwen2", (double)m->norm_eps, st_arch_name(m->arch));
  if (rc->model_set_by[ST_MF_ROPE_THETA] == ST_SET_FLAG && m->pos != ST_POS_ROPE)
    return st_error_setc(ST_EXIT_USAGE, "--rope-theta %g is the base of rotary positions, but "
                         "this model (--arch %s) learns its positions: drop --rope-theta, or "
                         "give --arch llama|qwen2", (double)m->rope_theta, st_arch_name(m->arch));
  if (rc->seq_len > m->block_size) {
    char by[96] = "";
    if (rc->model_set_by[ST_MF_POSITIONS] == ST_SET_PRESET)
      snprintf(by, sizeof by, " (--model %s)", rc->model_name);
    return st_error_setc(ST_EXIT_USAGE, "--seq-len %d exceeds the model's %d positions%s; give "
                         "--seq-len %d or less", rc->seq_len, m->block_size, by, m->block_size);
  }
  return 0;
}

void st_run_config_schedule(st_run_config *rc) {
  if (!rc->lr_decay_fixed) rc->optim.total_steps = rc->steps;
  if (rc->optim.warmup_steps > 0 && rc->optim.warmup_steps > rc->optim.total_steps) {
    rc->warmup_capped_from = rc->optim.warmup_steps; /* said in the config block */
    rc->optim.warmup_steps = (int)rc->optim.total_steps;
  }
}

char *st_run_config_to_json(const st_run_config *rc) {
  cJSON *o = cJSON_CreateObject();
  cJSON *m = cJSON_AddObjectToObject(o, "model");
  cJSON_AddStringToObject(m, "name", rc->model_name);
  st_model_add_json(m, &rc->model, "block_size");
  cJSON *t = cJSON_AddObjectToObject(o, "train");
  cJSON_AddNumberToObject(t, "micro_batch", rc->micro_batch);
  cJSON_AddNumberToObject(t, "global_batch", rc->global_batch);
  cJSON_AddNumberToObject(t, "seq_len", rc->seq_len);
  cJSON_AddStringToObject(t, "init_from", rc->init_from);
  cJSON_AddNumberToObject(t, "zero_stage", rc->zero_stage);
  cJSON_AddStringToObject(t, "grad_dtype", rc->grad_dtype);
  if (rc->master[0]) cJSON_AddStringToObject(t, "master", rc->master);
  cJSON_AddStringToObject(t, "precision", rc->precision);
  cJSON_AddStringToObject(t, "recompute", rc->recompute);
  cJSON_AddNumberToObject(t, "steps", (double)rc->steps);
  cJSON_AddNumberToObject(t, "lr", st_float_decimal(rc->optim.lr));
  cJSON_AddNumberToObject(t, "min_lr_frac", st_float_decimal(rc->optim.min_lr_frac));
  cJSON_AddNumberToObject(t, "warmup_steps", rc->optim.warmup_steps);
  cJSON_AddNumberToObject(t, "lr_decay_steps", (double)rc->optim.total_steps);
  cJSON_AddNumberToObject(t, "beta1", st_float_decimal(rc->optim.beta1));
  cJSON_AddNumberToObject(t, "beta2", st_float_decimal(rc->optim.beta2));
  cJSON_AddNumberToObject(t, "eps", st_float_decimal(rc->optim.eps));
  cJSON_AddNumberToObject(t, "weight_decay", st_float_decimal(rc->optim.weight_decay));
  cJSON_AddNumberToObject(t, "grad_clip", st_float_decimal(rc->optim.grad_clip));
  cJSON_AddNumberToObject(t, "seed", (double)rc->seed);
  cJSON_AddStringToObject(t, "data", rc->data);
  /* Read back on resume (rank/train/resume_config.c) for the flags not given. */
  cJSON_AddStringToObject(t, "val_data", rc->val_data);
  cJSON_AddStringToObject(t, "shuffle", rc->shuffle);
  cJSON_AddNumberToObject(t, "ckpt_every", rc->ckpt_every);
  cJSON_AddNumberToObject(t, "keep_last", rc->keep_last);
  cJSON_AddNumberToObject(t, "val_every", rc->val_every);
  cJSON_AddNumberToObject(t, "val_seqs", rc->val_seqs);
  cJSON_AddNumberToObject(t, "log_every", rc->log_every);
  cJSON_AddNumberToObject(t, "loss_scale_max", st_float_decimal(rc->loss_scale_max));
  cJSON_AddStringToObject(t, "attention", rc->attention);
  if (rc->lora_spec[0]) { /* the adapters' config and the base they belong to */
    cJSON *l = cJSON_AddObjectToObject(o, "lora");
    cJSON_AddStringToObject(l, "spec", rc->lora_spec);
    cJSON_AddStringToObject(l, "base_sha256", rc->lora_base_digest);
    cJSON_AddStringToObject(l, "base_dtype", rc->base_dtype);
    cJSON_AddStringToObject(l, "base_path", rc->init_from);
    cJSON_AddNumberToObject(l, "trainable_params", (double)rc->lora_trainable);
    cJSON_AddNumberToObject(l, "base_params", (double)rc->lora_base_params);
  }
  /* what the ids mean: a resumed run refuses data of another tokenizer */
  cJSON *k = cJSON_AddObjectToObject(o, "tokenizer");
  cJSON_AddStringToObject(k, "name", rc->tokenizer_name);
  cJSON_AddStringToObject(k, "digest", rc->tokenizer_digest);
  cJSON_AddNumberToObject(k, "vocab_size", rc->tokenizer_vocab);
  /* what `ckpt export` writes back into config.json (io/model_source.h) */
  cJSON *ids = rc->hf_special_ids[0] ? cJSON_Parse(rc->hf_special_ids) : NULL;
  if (ids) cJSON_AddItemToObject(o, "hf_special_ids", ids);
  char *s = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return s;
}

int st_run_overlap_ctas(const st_run_config *rc) {
  if (rc->zero_stage == 0) return 0;
  int n = rc->nccl_overlap_ctas;
  if (rc->nccl_max_ctas > 0 && n > rc->nccl_max_ctas) n = rc->nccl_max_ctas;
  return n;
}

void st_run_plan_input(const st_run_config *rc, int world, st_backend be, st_dtype dt,
                       st_plan_input *in) {
  memset(in, 0, sizeof *in);
  in->model = rc->model;
  in->micro_batch = rc->micro_batch;
  const int per_step = rc->micro_batch * world;
  in->accum = per_step > 0 && rc->global_batch % per_step == 0 ? rc->global_batch / per_step : 0;
  in->seq_len = rc->seq_len;
  in->world = world;
  in->zero_stage = rc->zero_stage;
  in->dtype = dt;
  in->recompute = st_recompute_parse(rc->recompute);
  in->backend = be;
  long long bs; /* strict; train and plan refused a bad value before (st_nccl_buffsize_env) */
  in->nccl_buffsize = st_nccl_buffsize_env(&bs) == 0 && bs > 0 ? bs : rc->nccl_buffsize;
  in->nccl_channels = rc->nccl_max_ctas;
  in->nccl_overlap_channels = st_run_overlap_ctas(rc);
  in->headroom_pct = rc->headroom_pct;
  in->offload = rc->offload;
  in->grad_bf16 = st_run_grad_bf16(rc);
  in->ckpt_async = rc->ckpt_async;
  in->offload_chunk = st_run_offload_chunk();
  in->lora = rc->lora;
}

int st_run_grad_bf16(const st_run_config *rc) { return strcmp(rc->grad_dtype, "bf16") == 0; }

int st_run_config_check_grad_dtype(const st_run_config *rc, int world, int zero_fixed,
                                   int batch_fixed) {
  if (!st_run_grad_bf16(rc)) return 0;
  /* the setting may come from a resumed checkpoint's config: the fix that
   * always works is the flag's other value */
  const char *from = st_run_config_given(rc, "--grad-dtype") ? "" : " (the checkpoint's)";
  if (zero_fixed && rc->zero_stage < 2)
    return st_error_setc(ST_EXIT_USAGE, "--grad-dtype bf16%s keeps ZeRO 2/3's reduced gradient "
                         "shard in bf16, and --zero %d%s keeps the whole fp32 gradient vector: "
                         "add --zero 2 (on one rank too), or use --grad-dtype fp32", from,
                         rc->zero_stage, st_run_config_given(rc, "--zero") ? "" : " (the default)");
  const int64_t per_step = (int64_t)rc->micro_batch * world;
  if (batch_fixed && per_step > 0 && rc->global_batch != per_step) {
    char steps[96];
    if (rc->global_batch % per_step == 0)
      snprintf(steps, sizeof steps, "%lld micro-steps", (long long)(rc->global_batch / per_step));
    else
      snprintf(steps, sizeof steps, "no whole number of micro-steps");
    char mb[64] = "";
    if (rc->global_batch % world == 0)
      snprintf(mb, sizeof mb, "--micro-batch %d or ", rc->global_batch / world);
    return st_error_setc(ST_EXIT_USAGE, "--grad-dtype bf16%s needs one micro-step a step, and "
                         "--global-batch %d makes %s of --micro-batch %d x %d rank(s): bf16 "
                         "cannot accumulate micro-steps without losing their low bits; use "
                         "%s--global-batch %lld, or --grad-dtype fp32", from, rc->global_batch,
                         steps, rc->micro_batch, world, mb, (long long)per_step);
  }
  return 0;
}

int64_t st_run_offload_chunk(void) {
  const char *v = getenv("ST_OFFLOAD_CHUNK");
  const long long n = v ? strtoll(v, NULL, 10) : 0;
  return n > 0 ? (int64_t)n : 0;
}
