/* hf_gpt2.c - the "gpt2" family of Hugging Face models (GPT2LMHeadModel).
 *
 * Names (transformers' modeling_gpt2.py; the original openai-community/gpt2
 * files lack the "transformer." prefix):
 *   transformer.wte.weight [V, C]    -> wte.weight [Vp, C] (rows >= V zero)
 *   transformer.wpe.weight [P, C]    -> wpe.weight
 *   transformer.h.{l}.ln_1.{weight,bias}, ln_2, ln_f: the same names
 *   transformer.h.{l}.attn.c_attn.weight [C, 3C] -> h.{l}.attn.qkv.weight [3C, C]
 *   transformer.h.{l}.attn.c_proj.weight [C, C]  -> h.{l}.attn.proj.weight
 *   transformer.h.{l}.mlp.c_fc.weight [C, 4C]    -> h.{l}.mlp.fc.weight [4C, C]
 *   transformer.h.{l}.mlp.c_proj.weight [4C, C]  -> h.{l}.mlp.proj.weight [C, 4C]
 * GPT-2's Conv1D stores weights [in, out]: transposed both ways; biases as
 * they are. lm_head.weight absent means tied; present, it must equal wte.
 * Buffers, not parameters, that some files hold and that are skipped:
 * h.{l}.attn.bias (the causal mask) and h.{l}.attn.masked_bias.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/hf_arch.h"
#include "util/error.h"

static int get_int(const char *path, const cJSON *j, const char *key, int *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 ||
      v->valuedouble > 1e9)
    return -1;
  (void)path;
  *out = (int)v->valuedouble;
  return 0;
}

static int gpt2_parse_config(const char *path, const cJSON *j, st_model_config *cfg) {
  static const char *const keys[] = {"n_layer", "n_head", "n_embd", "vocab_size"};
  int *dst[] = {&cfg->n_layer, &cfg->n_head, &cfg->n_embd, &cfg->vocab_size};
  for (int i = 0; i < 4; i++)
    if (get_int(path, j, keys[i], dst[i]))
      return st_error_setc(ST_EXIT_CHECKPOINT, "%s: %s must be a positive integer", path,
                           keys[i]);
  if (get_int(path, j, "n_positions", &cfg->block_size) &&
      get_int(path, j, "n_ctx", &cfg->block_size))
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: n_positions (or n_ctx) must be a positive "
                         "integer", path);
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "n_inner");
  if (v && !cJSON_IsNull(v) && !(cJSON_IsNumber(v) && v->valuedouble == 4.0 * cfg->n_embd))
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: n_inner %g is not supported (shardtrain's "
                         "MLP is 4 x n_embd = %d; null means that)", path,
                         cJSON_IsNumber(v) ? v->valuedouble : NAN, 4 * cfg->n_embd);
  v = cJSON_GetObjectItemCaseSensitive(j, "activation_function");
  if (v && !(cJSON_IsString(v) && (strcmp(v->valuestring, "gelu_new") == 0 ||
                                   strcmp(v->valuestring, "gelu_pytorch_tanh") == 0)))
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: activation_function %s is not supported "
                         "(shardtrain's GELU is the tanh one: gelu_new or gelu_pytorch_tanh)",
                         path, cJSON_IsString(v) ? v->valuestring : "(not a string)");
  v = cJSON_GetObjectItemCaseSensitive(j, "layer_norm_epsilon");
  if (v && !(cJSON_IsNumber(v) && fabs(v->valuedouble - 1e-5) < 1e-12))
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: layer_norm_epsilon %g is not supported "
                         "(shardtrain's LayerNorm uses 1e-5)", path,
                         cJSON_IsNumber(v) ? v->valuedouble : NAN);
  v = cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings");
  if (cJSON_IsFalse(v))
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: tie_word_embeddings false: an untied output "
                         "head is not supported yet", path);
  static const char *const refused[] = {"scale_attn_by_inverse_layer_idx", "add_cross_attention"};
  for (int i = 0; i < 2; i++)
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, refused[i])))
      return st_error_setc(ST_EXIT_CHECKPOINT, "%s: %s true is not supported", path, refused[i]);
  v = cJSON_GetObjectItemCaseSensitive(j, "scale_attn_weights");
  if (cJSON_IsFalse(v))
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: scale_attn_weights false is not supported "
                         "(shardtrain scales attention by 1/sqrt(head size))", path);
  return 0;
}

/* One parameter's HF name and layout. */
typedef struct {
  char hf[ST_MAX_NAME + 16];
  int transpose; /* Conv1D [in, out] */
} map_entry;

static void hf_name(const char *st, const char *prefix, map_entry *e) {
  static const char *const conv[][2] = {{"attn.qkv.weight", "attn.c_attn.weight"},
                                        {"attn.qkv.bias", "attn.c_attn.bias"},
                                        {"attn.proj.weight", "attn.c_proj.weight"},
                                        {"attn.proj.bias", "attn.c_proj.bias"},
                                        {"mlp.fc.weight", "mlp.c_fc.weight"},
                                        {"mlp.fc.bias", "mlp.c_fc.bias"},
                                        {"mlp.proj.weight", "mlp.c_proj.weight"},
                                        {"mlp.proj.bias", "mlp.c_proj.bias"}};
  e->transpose = 0;
  snprintf(e->hf, sizeof e->hf, "%s%s", prefix, st);
  int l;
  int n = 0;
  if (sscanf(st, "h.%d.%n", &l, &n) == 1 && n > 0) {
    for (int i = 0; i < 8; i++)
      if (strcmp(st + n, conv[i][0]) == 0) {
        snprintf(e->hf, sizeof e->hf, "%sh.%d.%s", prefix, l, conv[i][1]);
        e->transpose = strstr(conv[i][0], ".weight") != NULL;
      }
  }
}

static void shape_str(const int64_t *s, int nd, char *buf, size_t cap) {
  int o = snprintf(buf, cap, "[");
  for (int i = 0; i < nd && o > 0 && (size_t)o < cap; i++)
    o += snprintf(buf + o, cap - (size_t)o, "%s%lld", i ? ", " : "", (long long)s[i]);
  if (o > 0 && (size_t)o < cap) snprintf(buf + o, cap - (size_t)o, "]");
}

/* A skippable buffer: h.{l}.attn.bias or h.{l}.attn.masked_bias. */
static int is_buffer(const char *name, const char *prefix) {
  size_t pl = strlen(prefix);
  if (strncmp(name, prefix, pl) != 0) return 0;
  int l, n = 0;
  if (sscanf(name + pl, "h.%d.%n", &l, &n) != 1 || n == 0) return 0;
  return strcmp(name + pl + n, "attn.bias") == 0 || strcmp(name + pl + n, "attn.masked_bias") == 0;
}

static int gpt2_read(const char *dir, const st_sf_set *set, const st_model_config *cfg,
                     const st_param_table *tab, float *params) {
  const char *prefix = st_sf_find(set, "transformer.wte.weight") ? "transformer." : "";
  char *used = calloc((size_t)set->n + 1, 1);
  float *buf = NULL;
  int rc = -1;
  if (!used) return st_error_set("out of host memory reading %s", dir);
  memset(params, 0, (size_t)tab->total * sizeof *params);
  for (int i = 0; i < tab->n; i++) {
    const st_tensor *p = &tab->t[i];
    map_entry e;
    hf_name(p->name, prefix, &e);
    const st_sf_tensor *t = st_sf_find(set, e.hf);
    if (!t) {
      st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor %s is missing (GPT-2 with n_layer %d needs "
                    "it)", dir, e.hf, cfg->n_layer);
      goto out;
    }
    used[t - set->t] = 1;
    /* Expected HF shape. */
    int64_t want[ST_SF_MAX_DIM] = {p->shape[0], p->shape[1]};
    const int is_wte = strcmp(p->name, "wte.weight") == 0;
    if (is_wte) want[0] = cfg->vocab_size;
    if (e.transpose) {
      want[0] = p->shape[1];
      want[1] = p->shape[0];
    }
    if (t->ndim != p->ndim || t->shape[0] != want[0] || (p->ndim == 2 && t->shape[1] != want[1])) {
      char a[64], b[64];
      shape_str(t->shape, t->ndim, a, sizeof a);
      shape_str(want, p->ndim, b, sizeof b);
      st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor %s has shape %s but config.json's shape "
                    "needs %s", set->files[t->file], e.hf, a, b);
      goto out;
    }
    float *dst = params + p->offset;
    if (!e.transpose) {
      if (st_sf_read_f32(set, t, dst)) goto out;
      continue;
    }
    free(buf);
    buf = malloc((size_t)t->numel * sizeof *buf);
    if (!buf) {
      st_error_set("out of host memory reading %s", e.hf);
      goto out;
    }
    if (st_sf_read_f32(set, t, buf)) goto out;
    const int64_t in = t->shape[0], outd = t->shape[1];
    for (int64_t r = 0; r < in; r++)
      for (int64_t c = 0; c < outd; c++) dst[c * in + r] = buf[r * outd + c];
  }
  for (int i = 0; i < set->n; i++) {
    const st_sf_tensor *t = &set->t[i];
    if (used[i] || is_buffer(t->name, prefix)) continue;
    if (strcmp(t->name, "lm_head.weight") == 0) {
      const st_tensor *w = &tab->t[st_param_find(tab, "wte.weight")];
      if (t->ndim != 2 || t->shape[0] != cfg->vocab_size || t->shape[1] != cfg->n_embd) {
        st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor lm_head.weight is not [%d, %d] like the "
                      "embedding", set->files[t->file], cfg->vocab_size, cfg->n_embd);
        goto out;
      }
      free(buf);
      buf = malloc((size_t)t->numel * sizeof *buf);
      if (!buf) {
        st_error_set("out of host memory reading lm_head.weight");
        goto out;
      }
      if (st_sf_read_f32(set, t, buf)) goto out;
      if (memcmp(buf, params + w->offset, (size_t)t->numel * sizeof *buf) != 0) {
        st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor lm_head.weight differs from %swte.weight: "
                      "an untied output head is not supported yet", set->files[t->file], prefix);
        goto out;
      }
      continue;
    }
    st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor %s is not part of a GPT-2 model (an extra "
                  "tensor: a different architecture or a corrupt file)", set->files[t->file],
                  t->name);
    goto out;
  }
  rc = 0;
out:
  free(buf);
  free(used);
  return rc;
}

static char *gpt2_config_json(const st_model_config *cfg, st_dtype dt) {
  cJSON *j = cJSON_CreateObject();
  cJSON *a = cJSON_AddArrayToObject(j, "architectures");
  cJSON_AddItemToArray(a, cJSON_CreateString("GPT2LMHeadModel"));
  cJSON_AddStringToObject(j, "model_type", "gpt2");
  cJSON_AddStringToObject(j, "activation_function", "gelu_new");
  cJSON_AddNumberToObject(j, "attn_pdrop", 0.0);
  cJSON_AddNumberToObject(j, "embd_pdrop", 0.0);
  cJSON_AddNumberToObject(j, "resid_pdrop", 0.0);
  cJSON_AddNumberToObject(j, "initializer_range", 0.02);
  cJSON_AddNumberToObject(j, "layer_norm_epsilon", 1e-5);
  cJSON_AddNumberToObject(j, "n_embd", cfg->n_embd);
  cJSON_AddNumberToObject(j, "n_head", cfg->n_head);
  cJSON_AddNullToObject(j, "n_inner");
  cJSON_AddNumberToObject(j, "n_layer", cfg->n_layer);
  cJSON_AddNumberToObject(j, "n_positions", cfg->block_size);
  cJSON_AddNumberToObject(j, "n_ctx", cfg->block_size);
  cJSON_AddBoolToObject(j, "scale_attn_weights", 1);
  cJSON_AddBoolToObject(j, "scale_attn_by_inverse_layer_idx", 0);
  cJSON_AddBoolToObject(j, "reorder_and_upcast_attn", 0);
  cJSON_AddBoolToObject(j, "tie_word_embeddings", 1);
  cJSON_AddNumberToObject(j, "vocab_size", cfg->vocab_size);
  if (cfg->vocab_size == 50257) {
    cJSON_AddNumberToObject(j, "bos_token_id", 50256);
    cJSON_AddNumberToObject(j, "eos_token_id", 50256);
  }
  cJSON_AddStringToObject(j, "torch_dtype", dt == ST_BF16 ? "bfloat16" : dt == ST_FP16 ? "float16" : "float32");
  char *s = cJSON_Print(j);
  cJSON_Delete(j);
  return s;
}

static int gpt2_write(const char *path, const st_model_config *cfg, const st_param_table *tab,
                      const float *params, st_dtype dt) {
  st_sf_out *out = calloc((size_t)tab->n, sizeof *out);
  void **bufs = calloc((size_t)tab->n, sizeof *bufs);
  char (*names)[ST_MAX_NAME + 16] = calloc((size_t)tab->n, sizeof *names);
  int rc = -1;
  if (!out || !bufs || !names) {
    st_error_set("out of host memory writing %s", path);
    goto done;
  }
  for (int i = 0; i < tab->n; i++) {
    const st_tensor *p = &tab->t[i];
    map_entry e;
    hf_name(p->name, "transformer.", &e);
    snprintf(names[i], sizeof names[i], "%s", e.hf);
    int64_t rows = p->shape[0], cols = p->ndim == 2 ? p->shape[1] : 1;
    if (strcmp(p->name, "wte.weight") == 0) rows = cfg->vocab_size; /* padded rows dropped */
    const int64_t n = rows * cols;
    float *f = malloc((size_t)n * sizeof *f);
    bufs[i] = malloc((size_t)n * st_dtype_size(dt));
    if (!f || !bufs[i]) {
      free(f);
      st_error_set("out of host memory writing %s", path);
      goto done;
    }
    const float *src = params + p->offset;
    if (e.transpose)
      for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) f[c * rows + r] = src[r * cols + c];
    else
      memcpy(f, src, (size_t)n * sizeof *f);
    st_dtype_from_f32(dt, bufs[i], f, (size_t)n);
    free(f);
    out[i].name = names[i];
    out[i].dtype = dt;
    out[i].ndim = p->ndim;
    out[i].shape[0] = e.transpose ? cols : rows;
    out[i].shape[1] = e.transpose ? rows : cols;
    out[i].data = bufs[i];
  }
  rc = st_sf_write(path, out, tab->n);
done:
  for (int i = 0; bufs && i < tab->n; i++) free(bufs[i]);
  free(bufs);
  free(names);
  free(out);
  return rc;
}

const st_hf_arch st_hf_arch_gpt2 = {"gpt2", gpt2_parse_config, gpt2_read, gpt2_config_json,
                                    gpt2_write};
