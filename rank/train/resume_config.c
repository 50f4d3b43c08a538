/* resume_config.c - the checkpoint's settings for what the command line
 * did not give (see resume_config.h). */
#include "rank/train/resume_config.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/model_source.h"
#include "rank/model/config_fields.h"
#include "rank/model/lora.h"
#include "rank/optim/optimizer.h"
#include "util/decimal.h"
#include "util/error.h"

typedef enum { K_INT, K_I64, K_U64, K_FLOAT, K_STR } kind;

/* What a setting is on resume: taken from the checkpoint when not given
 * (INHERIT); the same, but chosen by --auto-fit (FIT) or --auto-fit-zero
 * (FIT_ZERO) when they are on; or part of the function the weights compute
 * (ARCH): never overridden. */
enum { INHERIT, FIT, FIT_ZERO, ARCH, IDENT }; /* IDENT: as ARCH, exit 4 (the base's identity) */

typedef struct {
  const char *flag, *section, *key;
  kind k;
  size_t off, cap; /* cap: the char array's size (K_STR) */
  int cls;
} field;

#define F(flag, sec, key, k, member, cls) \
  {flag, sec, key, k, offsetof(st_run_config, member), sizeof(((st_run_config *)0)->member), cls}

/* The run's settings the checkpoint's config holds, beside the model
 * description (every field of rank/model/config_fields.h's table is ARCH:
 * model_fields below). --attention is written but not taken: which kernel
 * runs is the machine's choice, cuDNN exists only on GPUs, and both compute
 * the same function. */
static const field k_fields[] = {
    /* T; the positions apart from it are the description's (older
     * checkpoints wrote the same number for both) */
    F("--seq-len", "train", "seq_len", K_INT, seq_len, ARCH),
    F("--micro-batch", "train", "micro_batch", K_INT, micro_batch, FIT),
    F("--global-batch", "train", "global_batch", K_INT, global_batch, INHERIT),
    F("--zero", "train", "zero_stage", K_INT, zero_stage, FIT_ZERO),
    F("--precision", "train", "precision", K_STR, precision, INHERIT),
    /* how the gradients are kept: numerics, not state (no checkpoint holds
     * gradients), so a resume may change it */
    F("--grad-dtype", "train", "grad_dtype", K_STR, grad_dtype, INHERIT),
    F("--recompute", "train", "recompute", K_STR, recompute, FIT),
    F("--loss-scale-max", "train", "loss_scale_max", K_FLOAT, loss_scale_max, INHERIT),
    F("--steps", "train", "steps", K_I64, steps, INHERIT),
    F("--lr", "train", "lr", K_FLOAT, optim.lr, INHERIT),
    F("--min-lr-frac", "train", "min_lr_frac", K_FLOAT, optim.min_lr_frac, INHERIT),
    F("--warmup", "train", "warmup_steps", K_INT, optim.warmup_steps, INHERIT),
    F("--beta1", "train", "beta1", K_FLOAT, optim.beta1, INHERIT),
    F("--beta2", "train", "beta2", K_FLOAT, optim.beta2, INHERIT),
    F("--eps", "train", "eps", K_FLOAT, optim.eps, INHERIT),
    F("--weight-decay", "train", "weight_decay", K_FLOAT, optim.weight_decay, INHERIT),
    F("--grad-clip", "train", "grad_clip", K_FLOAT, optim.grad_clip, INHERIT),
    F("--seed", "train", "seed", K_U64, seed, INHERIT),
    F("--data", "train", "data", K_STR, data, INHERIT),
    F("--val-data", "train", "val_data", K_STR, val_data, INHERIT),
    F("--shuffle", "train", "shuffle", K_STR, shuffle, INHERIT),
    F("--ckpt-every", "train", "ckpt_every", K_INT, ckpt_every, INHERIT),
    F("--keep-last", "train", "keep_last", K_INT, keep_last, INHERIT),
    F("--val-every", "train", "val_every", K_INT, val_every, INHERIT),
    F("--val-seqs", "train", "val_seqs", K_INT, val_seqs, INHERIT),
    F("--log-every", "train", "log_every", K_INT, log_every, INHERIT),
    /* where the weights first came from: kept in later checkpoints' configs */
    F("--init-from", "train", "init_from", K_STR, init_from, INHERIT),
    /* LoRA: the adapters' shape and function, and the base they were
     * trained on (train_setup.c checks the base's digest again) */
    F("--lora", "lora", "spec", K_STR, lora_spec, ARCH),
    F("(lora base digest)", "lora", "base_sha256", K_STR, lora_base_digest, ARCH),
    /* the base the adapters trained on is its NF4 rounding under nf4: another
     * dtype is another base (older checkpoints: bf16, the default) */
    F("--base-dtype", "lora", "base_dtype", K_STR, base_dtype, IDENT),
    /* No flag sets these (never "given"): always the checkpoint's, and
     * train_setup.c refuses data of another tokenizer. */
    F("(tokenizer)", "tokenizer", "name", K_STR, tokenizer_name, ARCH),
    F("(tokenizer digest)", "tokenizer", "digest", K_STR, tokenizer_digest, ARCH),
    F("(tokenizer vocabulary)", "tokenizer", "vocab_size", K_INT, tokenizer_vocab, ARCH),
};
#undef F

/* The field's value in rc as a JSON value (the form the config writes). */
static cJSON *value_of(const st_run_config *rc, const field *f) {
  const char *p = (const char *)rc + f->off;
  switch (f->k) {
  case K_INT: return cJSON_CreateNumber(*(const int *)p);
  case K_I64: return cJSON_CreateNumber((double)*(const int64_t *)p);
  case K_U64: return cJSON_CreateNumber((double)*(const uint64_t *)p);
  case K_FLOAT: return cJSON_CreateNumber(st_float_decimal(*(const float *)p));
  case K_STR: return cJSON_CreateString(p);
  }
  return NULL;
}

/* Set the field in rc from JSON value v (of the field's kind). */
static void set_from(st_run_config *rc, const field *f, const cJSON *v) {
  char *p = (char *)rc + f->off;
  switch (f->k) {
  case K_INT: *(int *)p = (int)v->valuedouble; break;
  case K_I64: *(int64_t *)p = (int64_t)v->valuedouble; break;
  case K_U64: *(uint64_t *)p = (uint64_t)v->valuedouble; break;
  case K_FLOAT: *(float *)p = (float)v->valuedouble; break;
  case K_STR: snprintf(p, f->cap, "%s", v->valuestring); break;
  }
}

/* The model description: a field the command line did not set
 * (rc->model_set_by) is the checkpoint's; one it set must be the
 * checkpoint's too, compared as validation would fill the zeros. A
 * checkpoint older than the architecture fields reads as GPT-2
 * (st_model_from_json). 0, or -1 with st_error (ST_EXIT_CHECKPOINT). */
static int model_fields(st_run_config *rc, const char *config_json, const char *from) {
  st_model_config ck;
  if (st_model_from_json(config_json, &ck)) {
    st_error_code(ST_EXIT_CHECKPOINT);
    return st_error_prefix("the model configuration in %s/index.h5", from);
  }
  for (int i = 0; i < ST_MF_COUNT; i++)
    if (rc->model_set_by[i] == ST_SET_NONE)
      st_model_field_set(&rc->model, (st_model_field_id)i,
                         st_model_field_get(&ck, (st_model_field_id)i));
  const st_model_config now = st_model_effective(&rc->model), was = st_model_effective(&ck);
  for (int i = 0; i < ST_MF_COUNT; i++) {
    const st_model_field_id id = (st_model_field_id)i;
    if (rc->model_set_by[i] == ST_SET_NONE ||
        st_model_field_get(&now, id) == st_model_field_get(&was, id))
      continue;
    const st_model_field *f = st_model_field_info(id);
    char by[96], vn[32], vo[32];
    st_run_config_set_by(rc, id, by, sizeof by);
    st_model_field_show(&now, id, vn, sizeof vn);
    st_model_field_show(&was, id, vo, sizeof vo);
    if (rc->model_set_by[i] == ST_SET_FLAG)
      return st_error_setc(ST_EXIT_CHECKPOINT, "%s %s differs from the checkpoint %s, written "
                           "with %s %s: resuming would give its weights a different shape or "
                           "function than they were trained for. Drop %s to continue with %s, "
                           "or start a new run in another --out", f->label, vn, from, f->label,
                           vo, f->label, vo);
    const char *flag = rc->model_set_by[i] == ST_SET_PRESET ? "--model" : "--arch";
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s sets %s %s, but the checkpoint %s was written "
                         "with %s %s: resuming would give its weights a different shape or "
                         "function than they were trained for. Drop %s to continue the "
                         "checkpoint's model, or start a new run in another --out", by, f->label,
                         vn, from, f->label, vo, flag);
  }
  return 0;
}

/* --lora given on resume against the checkpoint's spec, both resolved for
 * the checkpoint's model (model_fields ran): the family's default targets
 * compare as what they train, whether named or left out (older checkpoints
 * stored "targets=" for them), and a refusal quotes the real targets. */
static int lora_spec_check(const st_run_config *rc, const char *ck_spec, const char *from) {
  const st_model_config m = st_model_effective(&rc->model);
  st_lora_config now, was;
  if (st_lora_parse(rc->lora_spec, &now) || st_lora_resolve(&now, &m)) return -1;
  if (st_lora_parse(ck_spec, &was) || st_lora_resolve(&was, &m)) {
    char why[512];
    snprintf(why, sizeof why, "%s", st_error_msg());
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: its LoRA config \"%s\" does not read (%s)",
                         from, ck_spec, why);
  }
  char a[256], b[256];
  st_lora_format(&now, a, (int)sizeof a);
  st_lora_format(&was, b, (int)sizeof b);
  if (strcmp(a, b) == 0) return 0;
  return st_error_setc(ST_EXIT_CHECKPOINT, "--lora \"%s\" differs from the checkpoint %s, written "
                       "with --lora \"%s\": resuming would give its weights a different shape or "
                       "function than they were trained for. Drop --lora to continue with "
                       "\"%s\", or start a new run in another --out", a, from, b, b);
}

static int any_model_flag(const st_run_config *rc) {
  for (int i = 0; i < ST_MF_COUNT; i++)
    if (rc->model_set_by[i] != ST_SET_NONE) return 1;
  return 0;
}

static void append(char *buf, size_t cap, const char *fmt, const char *a, const char *b,
                   const char *c) {
  size_t n = strlen(buf);
  if (n < cap) snprintf(buf + n, cap - n, fmt, a, b, c);
}

int st_resume_config_apply(st_run_config *rc, const st_ckpt_meta *meta, const char *from,
                           int world, st_resume_note *note) {
  if (note) {
    note->text[0] = 0;
    note->json = NULL;
  }
  cJSON *cfg = cJSON_Parse(meta->config_json);
  if (!cfg)
    return st_error_setc(ST_EXIT_CHECKPOINT, "the config attribute of %s/index.h5 is not valid "
                         "JSON; the checkpoint's settings cannot be read", from);
  cJSON *j = cJSON_CreateObject(), *ov = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "from", from);
  cJSON_AddNumberToObject(j, "step", (double)meta->step);
  char over[2048] = "";
  int err = model_fields(rc, meta->config_json, from);
  for (size_t i = 0; i < sizeof k_fields / sizeof k_fields[0] && !err; i++) {
    const field *f = &k_fields[i];
    const cJSON *v = cJSON_GetObjectItem(cJSON_GetObjectItem(cfg, f->section), f->key);
    if (!v || (f->k == K_STR ? !cJSON_IsString(v) : !cJSON_IsNumber(v)))
      continue; /* a checkpoint older than the setting: the flag or the default stays */
    if ((f->cls == FIT && rc->auto_fit) || (f->cls == FIT_ZERO && rc->auto_fit == 2)) continue;
    const char *by = st_run_config_given(rc, f->flag) ? f->flag : NULL;
    if (!by) {
      set_from(rc, f, v);
      continue;
    }
    if (f->off == offsetof(st_run_config, lora_spec)) {
      err = lora_spec_check(rc, v->valuestring, from);
      continue;
    }
    cJSON *now = value_of(rc, f);
    const int same = cJSON_Compare(now, v, 1);
    /* --precision auto resolves on the backend: not an override by itself */
    const int auto_prec = f->k == K_STR && !strcmp(f->flag, "--precision") &&
                          !strcmp(now->valuestring, "auto");
    if (!same && !auto_prec) {
      char *vo = cJSON_PrintUnformatted(v), *vn = cJSON_PrintUnformatted(now);
      if (f->cls == ARCH || f->cls == IDENT) {
        err = st_error_setc(f->cls == IDENT ? ST_EXIT_DATA : ST_EXIT_CHECKPOINT, "%s %s differs from the checkpoint %s, "
                              "written with %s %s: resuming would give its weights a different "
                              "shape or function than they were trained for. Drop %s to "
                              "continue with %s, or start a new run in another --out", f->flag,
                              vn, from, f->flag, vo, f->flag, vo);
      } else {
        char one[1200];
        snprintf(one, sizeof one, "%s %s -> %s", f->flag, vo, vn);
        append(over, sizeof over, "%s%s%s", over[0] ? ", " : "", one, "");
        cJSON *o = cJSON_AddObjectToObject(ov, f->flag);
        cJSON_AddItemToObject(o, "checkpoint", cJSON_Duplicate(v, 1));
        cJSON_AddItemToObject(o, "now", cJSON_Duplicate(now, 1));
      }
      cJSON_free(vo);
      cJSON_free(vn);
    }
    cJSON_Delete(now);
  }
  /* No flag sets the bos/eos/pad ids: always the checkpoint's, so a resumed
   * fine-tune's export keeps its source's (rank/train/run_config.h). */
  if (!err) {
    cJSON *ids = st_ckpt_config_special_ids(meta->config_json);
    err = st_run_config_set_special_ids(rc, ids, from);
    cJSON_Delete(ids);
  }
  /* The model's name follows its shape when no shape flag was given. */
  const cJSON *name = cJSON_GetObjectItem(cJSON_GetObjectItem(cfg, "model"), "name");
  if (!err && cJSON_IsString(name) && !any_model_flag(rc))
    snprintf(rc->model_name, sizeof rc->model_name, "%s", name->valuestring);
  /* The cosine horizon: --lr-decay-steps given, or the checkpoint's when it
   * was set apart from --steps; else it follows --steps. */
  const cJSON *t = cJSON_GetObjectItem(cfg, "train");
  const cJSON *ck_decay = cJSON_GetObjectItem(t, "lr_decay_steps");
  const cJSON *ck_steps = cJSON_GetObjectItem(t, "steps");
  int64_t old_horizon = -1;
  if (!err && cJSON_IsNumber(ck_decay) && cJSON_IsNumber(ck_steps)) {
    old_horizon = (int64_t)ck_decay->valuedouble;
    if (st_run_config_given(rc, "--lr-decay-steps")) {
      if (rc->optim.total_steps != old_horizon) {
        char a[32], b[32], one[200];
        snprintf(a, sizeof a, "%lld", (long long)old_horizon);
        snprintf(b, sizeof b, "%lld", (long long)rc->optim.total_steps);
        snprintf(one, sizeof one, "--lr-decay-steps %s -> %s", a, b);
        append(over, sizeof over, "%s%s%s", over[0] ? ", " : "", one, "");
        cJSON *o = cJSON_AddObjectToObject(ov, "--lr-decay-steps");
        cJSON_AddNumberToObject(o, "checkpoint", (double)old_horizon);
        cJSON_AddNumberToObject(o, "now", (double)rc->optim.total_steps);
      }
    } else if (ck_decay->valuedouble != ck_steps->valuedouble) {
      rc->optim.total_steps = old_horizon;
      rc->lr_decay_fixed = 1;
    }
  }
  /* --warmup given and capped by the parser against the flags' horizon:
   * cap again against the final one */
  if (rc->warmup_capped_from > 0 && st_run_config_given(rc, "--warmup"))
    rc->optim.warmup_steps = rc->warmup_capped_from;
  rc->warmup_capped_from = 0;
  st_run_config_schedule(rc);
  if (!err && meta->step > rc->steps)
    err = st_error_setc(ST_EXIT_USAGE, "--steps %lld is below the step of the checkpoint %s "
                        "(%lld); pass --steps above %lld to train further", (long long)rc->steps,
                        from, (long long)meta->step, (long long)meta->step);
  if (err || !note) {
    cJSON_Delete(ov);
    cJSON_Delete(j);
    cJSON_Delete(cfg);
    return err ? -1 : 0;
  }
  char *tx = note->text;
  const size_t cap = sizeof note->text;
  snprintf(tx, cap, "  resume     settings from the checkpoint's config; %s%s\n",
           over[0] ? "overridden on the command line: " : "none overridden on the command line",
           over);
  cJSON_AddItemToObject(j, "overrides", ov);
  cJSON *rk = cJSON_AddObjectToObject(j, "ranks");
  cJSON_AddNumberToObject(rk, "checkpoint", meta->world_size);
  cJSON_AddNumberToObject(rk, "now", world);
  if (meta->world_size != world) {
    size_t n = strlen(tx);
    snprintf(tx + n, cap - n, "  resume     rank count %d -> %d: the checkpoint was written by %d "
             "rank%s at ZeRO %d; its state is read through index.h5 and cut into %d partition%s "
             "(losses match the uninterrupted run to fp32 rounding, not bit for bit)\n",
             meta->world_size, world, meta->world_size, meta->world_size == 1 ? "" : "s",
             meta->zero_stage, world, world == 1 ? "" : "s");
  }
  if (old_horizon >= 0 && old_horizon != rc->optim.total_steps) {
    /* The lr of the next step (0-based index meta->step) under both. */
    st_optim_config old = rc->optim;
    old.total_steps = old_horizon;
    const float lr_old = st_lr_at(&old, meta->step), lr_new = st_lr_at(&rc->optim, meta->step);
    const int given = st_run_config_given(rc, "--lr-decay-steps");
    char keep[96] = "";
    if (!given)
      snprintf(keep, sizeof keep, "; to keep that schedule, pass --lr-decay-steps %lld",
               (long long)old_horizon);
    size_t n = strlen(tx);
    snprintf(tx + n, cap - n, "  notice     the cosine schedule now ends at step %lld, not %lld "
             "(%s): step %lld trains at lr %.2e, where the checkpoint's horizon gives %.2e%s\n",
             (long long)rc->optim.total_steps, (long long)old_horizon,
             given ? "--lr-decay-steps" : "the horizon follows --steps", (long long)meta->step + 1,
             lr_new, lr_old, keep);
    cJSON *s = cJSON_AddObjectToObject(j, "schedule");
    cJSON_AddNumberToObject(s, "lr_decay_steps_checkpoint", (double)old_horizon);
    cJSON_AddNumberToObject(s, "lr_decay_steps_now", (double)rc->optim.total_steps);
    cJSON_AddNumberToObject(s, "next_step", (double)meta->step + 1);
    cJSON_AddNumberToObject(s, "lr_checkpoint_schedule", st_float_decimal(lr_old));
    cJSON_AddNumberToObject(s, "lr_now", st_float_decimal(lr_new));
  }
  note->json = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  cJSON_Delete(cfg);
  return 0;
}
