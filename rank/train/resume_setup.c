/* resume_setup.c - where a run starts from: the checkpoint --resume names
 * (its settings before anything is sized, its weights and optimizer state
 * once they are allocated), the source --init-from names (its shape, then
 * its weights), LoRA's frozen base, or a seeded initialisation. Part of
 * st_trainer_setup (train_setup.c). */
#define _XOPEN_SOURCE 700
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "io/checkpoint_dirs.h"
#include "io/model_source.h"
#include "io/tokenizer.h"
#include "rank/train/trainer_state.h"
#include "util/error.h"
#include "util/fsutil.h"

/* host[padded_total] fp32 -> the working weights (storage dtype) and, in
 * mixed precision, this rank's fp32 master range. A split master takes
 * its halves from host first; host is then rounded in place the split's
 * way, so that every rank's working copy of every range is those high
 * halves (an exact tie rounds otherwise to nearest even). */
static int set_weights(trainer *tr, float *host) {
  if (tr->master_lo) {
    st_trainer_master_put(tr, host + tr->opt_part.begin, tr->opt_part.begin, tr->opt_part.end);
    st_master_round_host(host, tr->model.padded_total);
  }
  if (st_model_set_weights(&tr->model, host)) return -1;
  if (tr->master)
    st_trainer_master_put(tr, host + tr->opt_part.begin, tr->opt_part.begin, tr->opt_part.end);
  return 0;
}

/* --init-from SRC (io/model_source.h): the model's shape is the source's.
 * A shape flag that says otherwise is a usage error naming it. When --out
 * already holds a checkpoint, the resume wins (a requeued fine-tune
 * continues, it does not start over) and the two shapes must agree. Reads
 * the shape only; setup_resume reads the weights. */
static int setup_init_from(trainer *tr) {
  st_run_config *rc = tr->rc;
  if (!rc->init_from[0]) return 0;
  /* inherited from the checkpoint's config: the source is not needed (it may be gone) */
  if (tr->resume_found && !st_run_config_given(rc, "--init-from")) return 0;
  st_model_source s;
  if (st_model_source_open(rc->init_from, &s)) return st_error_prefix("--init-from");
  const st_model_config *c = &s.cfg;
  /* a field a flag set must be the source's (the source is the shape) */
  const st_model_config src = st_model_effective(c), now = st_model_effective(&rc->model);
  for (int i = 0; i < ST_MF_COUNT && !tr->resume_found; i++) {
    const st_model_field_id id = (st_model_field_id)i;
    char by[96], a[32], b[32];
    if (!st_run_config_set_by(rc, id, by, sizeof by) ||
        st_model_field_get(&src, id) == st_model_field_get(&now, id))
      continue;
    const char *label = st_model_field_info(id)->label;
    const int own = rc->model_set_by[i] == ST_SET_FLAG;
    return st_error_setc(ST_EXIT_USAGE, "%s%s%s %s, but --init-from %s has %s: the model "
                         "comes from the source; drop %s", by, own ? "" : " sets ",
                         own ? "" : label, st_model_field_show(&now, id, a, sizeof a),
                         rc->init_from, st_model_field_show(&src, id, b, sizeof b),
                         own ? by : rc->model_set_by[i] == ST_SET_PRESET ? "--model" : "--arch");
  }
  if (tr->resume_found) {
    for (int i = 0; i < ST_MF_COUNT; i++) {
      const st_model_field_id id = (st_model_field_id)i;
      if (st_model_field_get(&src, id) == st_model_field_get(&now, id)) continue;
      char x[64], y[64];
      return st_error_setc(ST_EXIT_CHECKPOINT, "--init-from %s is a %s model with %s %s, but %s, "
                           "which --resume continues, has %s %s: give another --out for a new "
                           "fine-tune", rc->init_from, st_arch_name(src.arch),
                           st_model_field_info(id)->label, st_model_field_show(&src, id, x, sizeof x),
                           tr->resume_from, st_model_field_info(id)->label,
                           st_model_field_show(&now, id, y, sizeof y));
    }
    size_t n = strlen(tr->resume_note.text);
    if (rc->lora_spec[0]) {
      snprintf(tr->resume_note.text + n, sizeof tr->resume_note.text - n,
               "  notice     --init-from %s: the LoRA base, checked against the digest of "
               "the one %s (step %lld) was trained on\n", rc->init_from, rc->out,
               (long long)tr->resume_meta.step);
      return 0;
    }
    snprintf(tr->resume_note.text + n, sizeof tr->resume_note.text - n,
             "  notice     --init-from %s not read: %s holds a checkpoint (step %lld), which "
             "--resume %s continues (a requeued fine-tune continues, it does not restart)\n",
             rc->init_from, rc->out, (long long)tr->resume_meta.step, rc->resume);
    return 0;
  }
  rc->model = *c;
  snprintf(rc->model_name, sizeof rc->model_name, "imported");
  /* the source's tokenizer, when it has one we read, is the run's: data of
   * another is refused in setup_data */
  st_tokenizer *tok = s.tokenizer_dir[0] ? st_tokenizer_load(s.tokenizer_dir) : NULL;
  if (tok)
    st_run_config_set_tokenizer(rc, st_tokenizer_name(tok), st_tokenizer_digest(tok),
                                st_tokenizer_vocab_size(tok));
  st_tokenizer_free(tok);
  /* the source's bos/eos/pad ids: this run's export writes them back */
  cJSON *ids = st_model_source_special_ids(&s);
  const int bad = st_run_config_set_special_ids(rc, ids, rc->init_from);
  cJSON_Delete(ids);
  if (bad) return st_error_prefix("--init-from");
  if (!st_run_config_given(rc, "--seq-len")) rc->seq_len = c->block_size;
  if (rc->seq_len > c->block_size)
    return st_error_setc(ST_EXIT_USAGE, "--seq-len %d exceeds the %d positions of --init-from "
                         "%s; give --seq-len %d or less", rc->seq_len, c->block_size,
                         rc->init_from, c->block_size);
  return 0;
}

/* What --resume names, before anything depends on the settings: the
 * checkpoint's config fills every setting the flags did not give
 * (rank/train/resume_config.h), so that the batch, the model, the memory plan and
 * the schedule are those of the run being continued, and a setting that
 * would change the function its weights compute is refused here, before
 * any compute or allocation. Reads only. */
int st_trainer_setup_checkpoint(trainer *tr) {
  st_run_config *rc = tr->rc;
  tr->resume_found = 0;
  tr->resume_from[0] = 0;
  if (strcmp(rc->resume, "none") == 0) {
    char latest[1200];
    snprintf(latest, sizeof latest, "%s/ckpt/latest", rc->out);
    if (st_path_exists(latest)) {
      st_error_code(ST_EXIT_USAGE);
      return st_error_set("--resume none, but %s already holds checkpoints (see %s); pass "
                          "--resume auto to continue that run, or choose a new --out so "
                          "nothing is overwritten", rc->out, latest);
    }
    return setup_init_from(tr);
  }
  if (st_ckpt_resolve(rc->out, rc->resume, tr->resume_from, (int)sizeof tr->resume_from,
                      &tr->resume_found)) {
    st_error_code(ST_EXIT_CHECKPOINT);
    if (strncmp(st_error_msg(), "--resume", 8) == 0) return -1; /* it names the flag already */
    return st_error_prefix("--resume %s", rc->resume);
  }
  if (!tr->resume_found) return setup_init_from(tr);
  if (st_ckpt_read_meta(tr->resume_from, &tr->resume_meta)) {
    st_error_code(ST_EXIT_CHECKPOINT);
    return st_error_prefix("--resume %s", rc->resume);
  }
  if (st_resume_config_apply(rc, &tr->resume_meta, tr->resume_from, tr->comm->world,
                             &tr->resume_note))
    return -1;
  return setup_init_from(tr);
}

/* A resumed LoRA run whose base digest is not the checkpoint's: exit 4,
 * naming what drew the base. Without --init-from the base is the seeded
 * initialisation of the model, so --seed (not --init-from, never given) is
 * what differs; the checkpoint's config holds the seed that drew it. */
static int lora_base_mismatch(const trainer *tr, const char *hex) {
  const st_run_config *rc = tr->rc;
  if (rc->init_from[0])
    return st_error_setc(ST_EXIT_DATA, "--init-from %s: these base weights (SHA-256 %.16s...) "
                         "are not the base the LoRA checkpoint %s was trained on (%.16s...); give "
                         "--init-from the original base, or start a new run in another --out",
                         rc->init_from, hex, tr->resume_from, rc->lora_base_digest);
  cJSON *cfg = cJSON_Parse(tr->resume_meta.config_json);
  const cJSON *sd = cJSON_GetObjectItem(cJSON_GetObjectItem(cfg, "train"), "seed");
  const int known = cJSON_IsNumber(sd);
  const unsigned long long was = known ? (unsigned long long)sd->valuedouble : 0;
  cJSON_Delete(cfg);
  const unsigned long long now = (unsigned long long)rc->seed;
  if (known && was != now)
    return st_error_setc(ST_EXIT_DATA, "--seed %llu: the LoRA checkpoint %s was started without "
                         "--init-from, so its base is the model's initialisation drawn by "
                         "--seed %llu, and --seed %llu draws another (SHA-256 %.16s..., not %.16s...); drop "
                         "--seed (or give --seed %llu) to resume, or start a new run in another "
                         "--out", now, tr->resume_from, was, now, hex, rc->lora_base_digest, was);
  return st_error_setc(ST_EXIT_DATA, "the LoRA checkpoint %s was started without --init-from, so "
                       "its base is the model's initialisation drawn by --seed %llu, but this "
                       "build draws another base from that seed (SHA-256 %.16s..., not %.16s...); resume with the "
                       "build that started the run, or start a new run in another --out",
                       tr->resume_from, now, hex, rc->lora_base_digest);
}

/* LoRA: the base's weights from --init-from into the frozen model, and
 * their digest: recorded at a fresh start, and on resume checked against
 * the checkpoint's (another base: exit 4; --init-from may name a moved
 * copy of the same weights). The config the checkpoints store is rebuilt
 * with it. */
static int setup_lora_base(trainer *tr, int resuming) {
  st_run_config *rc = tr->rc;
  if (rc->lora.rank < 1) return 0;
  const size_t nb = (size_t)tr->model.base_tab.total;
  float *host = malloc((nb ? nb : 1) * sizeof(float));
  if (!host) return st_error_set("cannot allocate %zu bytes of host memory for the LoRA base",
                                 nb * sizeof(float));
  st_model_source s;
  char hex[65];
  int err;
  if (rc->init_from[0]) {
    err = st_model_source_open(rc->init_from, &s) ||
          st_model_source_read(&s, &tr->model.base_tab, host);
    if (err) st_error_prefix("--init-from (the LoRA base)");
  } else {
    /* no --init-from: the seeded initialisation of --model is the base, drawn
     * before the adapters; a resume (same --seed, same shape) draws it again
     * and the digest below proves it the same */
    err = st_model_draw_base(&tr->model, &tr->rng, host);
  }
  if (!err) err = st_lora_base_digest(&tr->model.base_tab, host, hex);
  if (!err && resuming && strcmp(hex, rc->lora_base_digest) != 0)
    err = lora_base_mismatch(tr, hex);
  if (!err) err = st_model_set_base_weights(&tr->model, host);
  free(host);
  if (err) return -1;
  snprintf(rc->lora_base_digest, sizeof rc->lora_base_digest, "%s", hex);
  free(tr->config_json);
  tr->config_json = st_run_config_to_json(rc);
  return 0;
}

/* A bf16 master kept split in one run and whole in the other
 * (ST_MASTER_FP32): the same fp32 master is restored, but the working
 * weights round exact ties another way, so the resumed run is not
 * bit-exact with an uninterrupted one. Said, not refused. Checkpoints
 * older than the setting say nothing. */
static void note_master_mode(trainer *tr, const char *config_json) {
  cJSON *cfg = cJSON_Parse(config_json);
  const cJSON *m = cJSON_GetObjectItem(cJSON_GetObjectItem(cfg, "train"), "master");
  const char *was = cJSON_IsString(m) ? m->valuestring : "", *now = tr->rc->master;
  const int split_whole = (!strcmp(was, "split") && !strcmp(now, "whole")) ||
                          (!strcmp(was, "whole") && !strcmp(now, "split"));
  if (split_whole) {
    const size_t n = strlen(tr->resume_note.text);
    snprintf(tr->resume_note.text + n, sizeof tr->resume_note.text - n,
             "  notice     the checkpoint's run kept the bf16 master %s, this one keeps it %s "
             "(ST_MASTER_FP32): the same fp32 master continues, but the working weights round "
             "exact ties the other way, so this resume is not bit-exact with an "
             "uninterrupted run\n", was, now);
  }
  cJSON_Delete(cfg);
}

/* Resume from the checkpoint setup_checkpoint found, or initialise fresh
 * weights. */
int st_trainer_setup_resume(trainer *tr, int *resumed, char *from, int cap) {
  st_run_config *rc = tr->rc;
  const int found = tr->resume_found;
  *resumed = 0;
  st_rng_seed(&tr->rng, rc->seed);
  snprintf(from, (size_t)cap, "%s", tr->resume_from);
  if (setup_lora_base(tr, found)) return -1;
  if (!found && rc->lora.rank > 0) { /* fresh adapters (B = 0) on the base */
    float *host = calloc((size_t)tr->model.padded_total, sizeof(float));
    if (!host) return st_error_set("cannot allocate host memory for initial adapters");
    int rc_init = st_model_draw_weights(&tr->model, &tr->rng, host) || set_weights(tr, host);
    free(host);
    return rc_init ? -1 : 0;
  }
  if (!found) {
    size_t np = (size_t)tr->model.padded_total;
    float *host = calloc(np, sizeof(float));
    if (!host) return st_error_set("cannot allocate host memory for initial weights");
    int rc_init;
    if (rc->init_from[0]) { /* the source's weights, a fresh optimizer, step 0 */
      st_model_source s;
      rc_init = st_model_source_open(rc->init_from, &s) ||
                st_model_source_read(&s, &tr->model.tab, host) || set_weights(tr, host);
      if (rc_init) st_error_prefix("--init-from");
    } else {
      rc_init = st_model_draw_weights(&tr->model, &tr->rng, host) || set_weights(tr, host);
    }
    free(host);
    return rc_init ? -1 : 0;
  }
  /* Read into host staging buffers, then hand them to the backend. */
  st_ckpt_meta meta;
  size_t np = (size_t)tr->model.padded_total, nm = (size_t)(tr->opt_part.end - tr->opt_part.begin);
  float *hp = calloc(np, sizeof(float)), *hm = calloc(nm + 1, sizeof(float)),
        *hv = calloc(nm + 1, sizeof(float));
  int rc_load = -1;
  if (!hp || !hm || !hv) st_error_set("cannot allocate host memory to load %s", from);
  else rc_load = st_ckpt_load_shared(from, &tr->model.tab, &tr->opt_part, tr->comm->rank,
                                     tr->comm->world, hp, hm, hv, &meta);
  if (!rc_load) rc_load = set_weights(tr, hp);
  if (!rc_load) {
    st_offload_state_put(&tr->offload, tr->ops, tr->adam_m, hm, nm * sizeof(float));
    st_offload_state_put(&tr->offload, tr->ops, tr->adam_v, hv, nm * sizeof(float));
  }
  free(hp);
  free(hm);
  free(hv);
  st_error_code(ST_EXIT_CHECKPOINT);
  if (rc_load) return -1;
  st_error_code(ST_EXIT_ERROR);
  snprintf(tr->ckpt_config, sizeof tr->ckpt_config, "%s", meta.config_json);
  note_master_mode(tr, meta.config_json);
  tr->step = meta.step;
  {
    const int64_t N = tr->train.total_seq;
    st_data_pos at = {meta.data_epoch, meta.data_position / rc->seq_len};
    /* a shard set changed under --data-changed-ok can be shorter now */
    if (at.pos >= N) at = (st_data_pos){at.epoch + 1, 0};
    tr->dpos = at;
    tr->epoch = at.epoch;
  }
  tr->tokens_seen = meta.tokens_seen;
  tr->rng.s[0] = meta.rng_state[0];
  tr->rng.s[1] = meta.rng_state[1];
  if (meta.has_scaler && tr->scaler.enabled) {
    tr->scaler.scale = (float)meta.loss_scale;
    if (tr->scaler.scale > tr->scaler.max_scale) tr->scaler.scale = tr->scaler.max_scale;
    tr->scaler.clean_steps = meta.scaler_clean_steps;
    tr->scaler.hysteresis_left = meta.scaler_hysteresis_left;
  }
  if (meta.has_scaler) tr->scaler.skipped_steps = meta.skipped_steps;
  *resumed = 1;
  return 0;
}
