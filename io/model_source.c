/* model_source.c - open and read a model from any source (see model_source.h). */
#include "io/model_source.h"

#include "kernels/nf4.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "io/hf_arch.h"
#include "io/llmc_model.h"
#include "rank/optim/partition.h"
#include "util/error.h"
#include "util/fsutil.h"

/* Every failure of a model source is a checkpoint-class failure (exit 3). */
static int coded(int rc) {
  if (rc != 0) st_error_code(ST_EXIT_CHECKPOINT);
  return rc;
}

/* RUN/ckpt/step_N -> RUN/tokenizer, when train left the tokenizer there. */
static void ckpt_tokenizer_dir(const char *step_dir, char *out, size_t cap) {
  out[0] = 0;
  int n = snprintf(out, cap, "%s/../../tokenizer", step_dir);
  if (n < 0 || (size_t)n >= cap || !st_path_exists(out)) out[0] = 0;
}

static int open_ckpt(const char *src, st_model_source *s) {
  int found = 0;
  char index[1300];
  snprintf(index, sizeof index, "%s/index.h5", src);
  const char *how = st_path_exists(index) ? src : "auto";
  if (st_ckpt_resolve(src, how, s->path, (int)sizeof s->path, &found) != 0) return coded(-1);
  if (!found)
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s holds no checkpoint yet (ckpt/ is empty)", src);
  st_ckpt_meta meta;
  if (st_ckpt_read_meta(s->path, &meta) != 0) return coded(-1);
  if (st_model_from_json(meta.config_json, &s->cfg) != 0)
    return coded(st_error_prefix("%s", s->path));
  snprintf(s->config_json, sizeof s->config_json, "%s", meta.config_json);
  snprintf(s->dtype, sizeof s->dtype, "fp32");
  s->kind = ST_MODEL_SRC_CKPT;
  ckpt_tokenizer_dir(s->path, s->tokenizer_dir, sizeof s->tokenizer_dir);
  return 0;
}

int st_model_source_open(const char *src, st_model_source *s) {
  memset(s, 0, sizeof *s);
  char probe[1300];
  snprintf(probe, sizeof probe, "%s/index.h5", src);
  int is_ckpt = st_path_exists(probe);
  snprintf(probe, sizeof probe, "%s/ckpt", src);
  is_ckpt = is_ckpt || st_path_exists(probe);
  if (is_ckpt) return open_ckpt(src, s);
  if (st_hf_is_dir(src)) {
    const st_hf_arch *arch;
    if (st_hf_read_config(src, &arch, &s->cfg)) return coded(-1);
    /* The stored dtype: that of the first tensor (the shape is checked on read). */
    st_sf_set set;
    memset(&set, 0, sizeof set);
    int rc = st_sf_open_dir(src, &set);
    if (!rc) snprintf(s->dtype, sizeof s->dtype, "%s", set.n ? st_dtype_name(set.t[0].dtype) : "fp32");
    st_sf_close(&set);
    if (rc) return coded(-1);
    snprintf(s->path, sizeof s->path, "%s", src);
    s->kind = ST_MODEL_SRC_HF;
    if (st_hf_has_tokenizer(src)) snprintf(s->tokenizer_dir, sizeof s->tokenizer_dir, "%s", src);
    return 0;
  }
  if (st_llmc_is_model(src)) {
    st_dtype dt;
    if (st_llmc_read_header(src, &s->cfg, &dt)) return coded(-1);
    snprintf(s->dtype, sizeof s->dtype, "%s", st_dtype_name(dt));
    snprintf(s->path, sizeof s->path, "%s", src);
    s->kind = ST_MODEL_SRC_LLMC;
    return 0;
  }
  if (!st_path_exists(src))
    return st_error_setc(ST_EXIT_CHECKPOINT, "model source %s does not exist; give a run or "
                         "step directory, a Hugging Face model directory or an llm.c model file",
                         src);
  return st_error_setc(ST_EXIT_CHECKPOINT, "%s is not a model this build can read: no "
                       "index.h5 or ckpt/ (shardtrain), config.json (Hugging Face) or llm.c "
                       "header", src);
}

int st_model_source_lora(const st_model_source *s, st_lora_config *lora, char *base, size_t cap,
                         char digest[72]) {
  if (s->kind != ST_MODEL_SRC_CKPT || !s->config_json[0]) return 0;
  cJSON *j = cJSON_Parse(s->config_json);
  const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "lora");
  const cJSON *spec = cJSON_GetObjectItemCaseSensitive(l, "spec");
  const cJSON *bp = cJSON_GetObjectItemCaseSensitive(l, "base_path");
  const cJSON *dg = cJSON_GetObjectItemCaseSensitive(l, "base_sha256");
  const cJSON *bd = cJSON_GetObjectItemCaseSensitive(l, "base_dtype");
  int rc = 0;
  if (cJSON_IsString(spec) && spec->valuestring[0]) {
    rc = 1;
    const char *moved = getenv("ST_LORA_BASE");
    snprintf(base, cap, "%s", moved && *moved ? moved : cJSON_IsString(bp) ? bp->valuestring : "");
    snprintf(digest, 72, "%s", cJSON_IsString(dg) ? dg->valuestring : "");
    if (st_lora_parse(spec->valuestring, lora) || st_lora_resolve(lora, &s->cfg))
      rc = st_error_setc(ST_EXIT_CHECKPOINT, "%s: its LoRA config '%s' does not read (%s)",
                         s->path, spec->valuestring, st_error_msg());
    else /* QLoRA: the adapters were trained on the NF4 rounding of the base */
      lora->nf4_base = cJSON_IsString(bd) && strcmp(bd->valuestring, "nf4") == 0;
  }
  cJSON_Delete(j);
  return rc;
}

int st_model_source_read_adapters(const st_model_source *s, const st_lora_config *lora,
                                  st_lora_table *lt, float **ad) {
  *ad = NULL;
  st_param_table atab;
  if (st_lora_table_build(&s->cfg, lora, lt)) return coded(-1);
  if (st_lora_param_table(&s->cfg, lt, &atab)) return coded(-1);
  *ad = malloc((size_t)(lt->total > 0 ? lt->total : 1) * sizeof(float));
  int rc = -1;
  if (!*ad) {
    st_error_set("cannot allocate host memory for the adapters of %s", s->path);
  } else {
    st_partition none;
    memset(&none, 0, sizeof none);
    none.total = atab.total;
    st_ckpt_meta meta;
    rc = st_ckpt_load(s->path, &atab, &none, *ad, NULL, NULL, &meta);
  }
  st_param_table_free(&atab);
  return coded(rc);
}

/* QLoRA: each block's four projection weights of params replaced by their
 * NF4 quantisation dequantised (kernels/nf4.h, fp32): the base the
 * adapters were trained on. Exact for the CPU backend's runs (fp32 base);
 * a bf16 run quantised the base's bf16 rounding on the GPU, which is the
 * same whenever the base holds bf16 values (any Hugging Face bf16 model). */
static int nf4_round_trip(const st_model_source *s, const st_param_table *tab, float *params) {
  for (int i = 0; i < tab->n; i++) {
    const st_tensor *t = &tab->t[i];
    const char *n = t->name;
    if (strncmp(n, "h.", 2) != 0 || t->ndim != 2 ||
        !(strstr(n, ".attn.qkv.weight") || strstr(n, ".attn.proj.weight") ||
          strstr(n, ".mlp.fc.weight") || strstr(n, ".mlp.proj.weight")))
      continue;
    st_nf4 q;
    const size_t bytes = st_nf4_bytes(t->shape[0], t->shape[1]);
    void *mem = aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!mem) return st_error_set("cannot allocate %zu bytes of host memory for NF4", bytes);
    st_nf4_carve(&q, t->shape[0], t->shape[1], mem);
    const int bad = st_nf4_quantize(&q, params + t->offset);
    if (!bad) st_nf4_dequantize(&q, params + t->offset);
    free(mem);
    if (bad)
      return st_error_setc(ST_EXIT_CHECKPOINT, "the QLoRA base of %s: %s holds a NaN or an "
                           "infinity", s->path, n);
  }
  return 0;
}

/* A LoRA checkpoint: its base (checked against the recorded digest) with
 * the adapters merged. */
static int read_lora_merged(const st_model_source *s, const st_lora_config *lora,
                            const char *base, const char *digest, const st_param_table *tab,
                            float *params) {
  st_model_source b;
  if (!base[0])
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s is a LoRA checkpoint that records no base; set "
                         "ST_LORA_BASE to the base model's directory", s->path);
  if (st_model_source_open(base, &b) || st_model_source_read(&b, tab, params))
    return coded(st_error_prefix("the LoRA base of %s (set ST_LORA_BASE to a moved copy)",
                                 s->path));
  char hex[65];
  if (st_lora_base_digest(tab, params, hex)) return coded(-1);
  if (strcmp(hex, digest) != 0)
    return st_error_setc(ST_EXIT_DATA, "%s: the LoRA base %s (SHA-256 %.16s...) is not the base "
                         "its adapters were trained on (%.16s...); set ST_LORA_BASE to that "
                         "base", s->path, base, hex, digest);
  if (lora->nf4_base && nf4_round_trip(s, tab, params)) return coded(-1);
  st_lora_table lt;
  float *ad;
  int rc = st_model_source_read_adapters(s, lora, &lt, &ad);
  if (!rc) rc = st_lora_merge(&lt, lora, tab, params, ad);
  free(ad);
  st_lora_table_free(&lt);
  return coded(rc);
}

int st_model_source_read(const st_model_source *s, const st_param_table *tab, float *params) {
  st_lora_config lora;
  char base[1200], digest[72];
  const int is_lora = st_model_source_lora(s, &lora, base, sizeof base, digest);
  if (is_lora < 0) return -1;
  if (is_lora) return read_lora_merged(s, &lora, base, digest, tab, params);
  if (s->kind == ST_MODEL_SRC_CKPT) {
    st_partition none; /* an empty optimizer shard: weights only */
    memset(&none, 0, sizeof none);
    none.total = tab->total;
    st_ckpt_meta meta;
    return coded(st_ckpt_load(s->path, tab, &none, params, NULL, NULL, &meta));
  }
  if (s->kind == ST_MODEL_SRC_HF) return coded(st_hf_read_dir(s->path, &s->cfg, tab, params));
  if (s->kind == ST_MODEL_SRC_LLMC) return coded(st_llmc_read(s->path, &s->cfg, tab, params));
  return st_error_setc(ST_EXIT_CHECKPOINT, "%s: unknown kind of model source", s->path);
}

cJSON *st_ckpt_config_special_ids(const char *config_json) {
  cJSON *o = config_json && config_json[0] ? cJSON_Parse(config_json) : NULL;
  const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "hf_special_ids");
  if (!cJSON_IsObject(ids) || !ids->child)
    ids = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "imported_from"),
                                           "hf_special_ids");
  cJSON *out = cJSON_IsObject(ids) && ids->child ? cJSON_Duplicate(ids, 1) : NULL;
  cJSON_Delete(o);
  return out;
}

cJSON *st_model_source_special_ids(const st_model_source *s) {
  if (s->kind == ST_MODEL_SRC_CKPT) return st_ckpt_config_special_ids(s->config_json);
  if (s->kind != ST_MODEL_SRC_HF) return NULL;
  cJSON *ids = st_hf_special_ids(s->path);
  if (ids && !ids->child) {
    cJSON_Delete(ids);
    ids = NULL;
  }
  return ids;
}
