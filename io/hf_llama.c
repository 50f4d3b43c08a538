/* hf_llama.c - the "llama" and "qwen2" families of Hugging Face models
 * (LlamaForCausalLM, Qwen2ForCausalLM; SmolLM2 is "llama").
 *
 * Names (transformers' modeling_llama.py / modeling_qwen2.py), with C the
 * width, HD = C / NH the head size, F = intermediate_size:
 *   model.embed_tokens.weight [V, C]               -> wte.weight [Vp, C] (rows >= V zero)
 *   model.layers.{l}.input_layernorm.weight        -> h.{l}.ln_1.weight
 *   model.layers.{l}.self_attn.q_proj.weight [NH*HD, C]  \
 *   model.layers.{l}.self_attn.k_proj.weight [NKV*HD, C]  > rows of h.{l}.attn.qkv.weight
 *   model.layers.{l}.self_attn.v_proj.weight [NKV*HD, C] /  (q, then k, then v)
 *   ...{q,k,v}_proj.bias (qwen2; llama with attention_bias) -> h.{l}.attn.qkv.bias
 *   model.layers.{l}.self_attn.o_proj.{weight,bias} -> h.{l}.attn.proj.*
 *   model.layers.{l}.post_attention_layernorm.weight -> h.{l}.ln_2.weight
 *   model.layers.{l}.mlp.gate_proj, mlp.up_proj [F, C] -> rows of h.{l}.mlp.fc.weight [2F, C]
 *   model.layers.{l}.mlp.down_proj [C, F]           -> h.{l}.mlp.proj.weight
 *   (biases of the three with llama's mlp_bias: the same split)
 *   model.norm.weight                               -> ln_f.weight
 *   lm_head.weight [V, C]                           -> lm_head.weight [Vp, C] (untied only)
 * Both sides store linears [out, in], and shardtrain's RoPE is HF's
 * rotate-half form, so nothing is transposed or permuted: a tensor is a
 * block of rows. With tie_word_embeddings true an lm_head.weight in the
 * files must equal the embedding (transformers ties them); buffers some
 * older files hold, self_attn.rotary_emb.inv_freq, are skipped.
 *
 * config.json: transformers 4 writes rope_theta and rope_scaling,
 * transformers 5 rope_parameters {rope_type, rope_theta, ...}; both are
 * read, and both are written so either version loads the export. Absent
 * fields take the config classes' defaults (LlamaConfig / Qwen2Config):
 * num_key_value_heads = num_attention_heads, rms_norm_eps 1e-6, rope_theta
 * 10000, tie_word_embeddings false, hidden_act silu, no biases (llama).
 * attention_dropout is not refused but not kept: shardtrain trains without
 * dropout and the export writes 0.0.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/hf_arch.h"
#include "util/error.h"

#define HF_NAME (ST_MAX_NAME + 48)

/* Present: 1 (a number in *out), absent or null: 0, anything else: -1. */
static int get_num(const cJSON *j, const char *key, double *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!v || cJSON_IsNull(v)) return 0;
  if (!cJSON_IsNumber(v)) return -1;
  *out = v->valuedouble;
  return 1;
}

/* A positive integer field; required or (absent) left as it is. */
static int get_pos_int(const char *path, const cJSON *j, const char *key, int required,
                       int *out) {
  double d = 0;
  const int r = get_num(j, key, &d);
  if (r == 0 && !required) return 0;
  if (r != 1 || d != floor(d) || d < 1 || d > 1e9)
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: %s must be a positive integer", path, key);
  *out = (int)d;
  return 0;
}

/* A boolean field: absent or null leaves *out. */
static int get_bool(const char *path, const cJSON *j, const char *key, int *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!v || cJSON_IsNull(v)) return 0;
  if (!cJSON_IsBool(v))
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: %s must be true or false", path, key);
  *out = cJSON_IsTrue(v);
  return 0;
}

/* The RoPE settings: rope_parameters (transformers 5) or rope_theta and
 * rope_scaling (transformers 4). Only "default" and "llama3" exist here. */
static int parse_rope(const char *path, const cJSON *j, st_model_config *cfg) {
  const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
  const char *where = "rope_parameters";
  const cJSON *sc = rp;
  double theta = 10000.0;
  if (rp && !cJSON_IsNull(rp)) {
    if (!cJSON_IsObject(rp))
      return st_error_setc(ST_EXIT_CHECKPOINT, "%s: rope_parameters must be an object", path);
    if (get_num(rp, "rope_theta", &theta) < 0)
      return st_error_setc(ST_EXIT_CHECKPOINT, "%s: rope_parameters.rope_theta must be a "
                           "number", path);
  } else {
    where = "rope_scaling";
    sc = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    if (get_num(j, "rope_theta", &theta) < 0)
      return st_error_setc(ST_EXIT_CHECKPOINT, "%s: rope_theta must be a number", path);
  }
  if (!(theta > 1))
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: rope_theta %g must be > 1", path, theta);
  cfg->rope_theta = (float)theta;
  memset(&cfg->rope_scaling, 0, sizeof cfg->rope_scaling);
  if (!sc || cJSON_IsNull(sc)) return 0;
  if (!cJSON_IsObject(sc))
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: %s must be null or an object", path, where);
  const cJSON *ty = cJSON_GetObjectItemCaseSensitive(sc, "rope_type");
  if (!ty) ty = cJSON_GetObjectItemCaseSensitive(sc, "type");
  if (!cJSON_IsString(ty))
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: %s has no rope_type (or type) string", path,
                         where);
  if (strcmp(ty->valuestring, "default") == 0) return 0;
  if (strcmp(ty->valuestring, "llama3") != 0)
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: %s rope_type \"%s\" is not supported (this "
                         "build has RoPE without scaling and Llama 3's \"llama3\" scaling)",
                         path, where, ty->valuestring);
  static const char *const keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                                     "original_max_position_embeddings"};
  double v[4];
  for (int i = 0; i < 4; i++)
    if (get_num(sc, keys[i], &v[i]) != 1)
      return st_error_setc(ST_EXIT_CHECKPOINT, "%s: %s of rope_type \"llama3\" needs a number "
                           "%s", path, where, keys[i]);
  if (v[3] != floor(v[3]) || v[3] < 1 || v[3] > 1e9)
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: %s.original_max_position_embeddings must be a "
                         "positive integer", path, where);
  if (!(v[0] >= 1 && v[1] > 0 && v[2] > v[1]))
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: %s (llama3) needs factor >= 1 and 0 < "
                         "low_freq_factor < high_freq_factor (got %g, %g, %g)", path, where,
                         v[0], v[1], v[2]);
  cfg->rope_scaling = (st_rope_scaling){ST_ROPE_SCALING_LLAMA3, (float)v[0], (float)v[1],
                                        (float)v[2], (int)v[3]};
  return 0;
}

static int family_parse(const char *path, const cJSON *j, st_model_config *cfg, st_arch arch) {
  st_model_arch_defaults(cfg, arch);
  static const char *const keys[] = {"hidden_size", "num_hidden_layers", "num_attention_heads",
                                     "intermediate_size", "vocab_size",
                                     "max_position_embeddings"};
  int *dst[] = {&cfg->n_embd, &cfg->n_layer, &cfg->n_head, &cfg->ffn_dim, &cfg->vocab_size,
                &cfg->block_size};
  for (int i = 0; i < 6; i++)
    if (get_pos_int(path, j, keys[i], 1, dst[i])) return -1;
  cfg->n_kv_head = cfg->n_head;
  if (get_pos_int(path, j, "num_key_value_heads", 0, &cfg->n_kv_head)) return -1;
  if (cfg->n_head % cfg->n_kv_head != 0)
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: num_key_value_heads %d must divide "
                         "num_attention_heads %d", path, cfg->n_kv_head, cfg->n_head);
  if (cfg->n_embd % cfg->n_head != 0)
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: hidden_size %d is not a multiple of "
                         "num_attention_heads %d (shardtrain's head size is hidden_size / "
                         "num_attention_heads)", path, cfg->n_embd, cfg->n_head);
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "hidden_act");
  if (v && !(cJSON_IsString(v) && (strcmp(v->valuestring, "silu") == 0 ||
                                   strcmp(v->valuestring, "swish") == 0)))
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: hidden_act %s is not supported (shardtrain's "
                         "gated MLP is SwiGLU: silu)", path,
                         cJSON_IsString(v) ? v->valuestring : "(not a string)");
  double d = 0;
  int r = get_num(j, "head_dim", &d);
  if (r < 0 || (r == 1 && d != cfg->n_embd / cfg->n_head))
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: head_dim %g is not supported (shardtrain's "
                         "head size is hidden_size / num_attention_heads = %d)", path,
                         r == 1 ? d : NAN, cfg->n_embd / cfg->n_head);
  r = get_num(j, "partial_rotary_factor", &d);
  if (r < 0 || (r == 1 && d != 1.0))
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: partial_rotary_factor %g is not supported "
                         "(shardtrain rotates the whole head)", path, r == 1 ? d : NAN);
  double eps = 1e-6;
  if (get_num(j, "rms_norm_eps", &eps) < 0 || !(eps > 0 && eps < 1))
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: rms_norm_eps must be a number in (0, 1)",
                         path);
  cfg->norm_eps = (float)eps;
  if (parse_rope(path, j, cfg)) return -1;
  int tied = 0;
  if (get_bool(path, j, "tie_word_embeddings", &tied)) return -1;
  cfg->untied = !tied;
  if (arch == ST_ARCH_LLAMA) {
    int attn_bias = 0, mlp_bias = 0;
    if (get_bool(path, j, "attention_bias", &attn_bias) ||
        get_bool(path, j, "mlp_bias", &mlp_bias))
      return -1;
    cfg->no_bias = ST_NO_BIAS_ALL;
    if (attn_bias) cfg->no_bias &= ~(unsigned)(ST_NO_BIAS_QKV | ST_NO_BIAS_PROJ);
    if (mlp_bias) cfg->no_bias &= ~(unsigned)ST_NO_BIAS_MLP;
  } else {
    int sliding = 0;
    if (get_bool(path, j, "use_sliding_window", &sliding)) return -1;
    if (sliding)
      return st_error_setc(ST_EXIT_CHECKPOINT, "%s: use_sliding_window true is not supported "
                           "(shardtrain's attention is full causal attention)", path);
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(j, "layer_types"), *e;
    if (!cJSON_IsArray(lt)) lt = NULL;
    cJSON_ArrayForEach(e, lt) {
      if (!cJSON_IsString(e) || strcmp(e->valuestring, "full_attention") != 0)
        return st_error_setc(ST_EXIT_CHECKPOINT, "%s: layer_types entry %s is not supported "
                             "(shardtrain's attention is full causal attention)", path,
                             cJSON_IsString(e) ? e->valuestring : "(not a string)");
    }
  }
  return 0;
}

static int llama_parse_config(const char *path, const cJSON *j, st_model_config *cfg) {
  return family_parse(path, j, cfg, ST_ARCH_LLAMA);
}
static int qwen2_parse_config(const char *path, const cJSON *j, st_model_config *cfg) {
  return family_parse(path, j, cfg, ST_ARCH_QWEN2);
}

/* One block of rows of a shardtrain tensor: the HF tensor that holds it. */
typedef struct {
  char hf[HF_NAME];
  int64_t rows;
} piece;

/* The HF tensors that make up shardtrain tensor st, in row order: their
 * number (1 to 3), or 0 when st has no counterpart in this family. */
static int pieces(const st_model_config *c, const char *st, piece out[3]) {
  const int64_t C = c->n_embd, HD = C / c->n_head, F = c->ffn_dim;
  const int64_t q = c->n_head * HD, kv = c->n_kv_head * HD;
  static const char *const top[][2] = {{"wte.weight", "model.embed_tokens.weight"},
                                       {"lm_head.weight", "lm_head.weight"},
                                       {"ln_f.weight", "model.norm.weight"}};
  for (int i = 0; i < 3; i++)
    if (strcmp(st, top[i][0]) == 0) {
      snprintf(out[0].hf, HF_NAME, "%s", top[i][1]);
      out[0].rows = i < 2 ? c->vocab_size : C; /* padded rows are not HF's */
      return 1;
    }
  int l, n = 0;
  if (sscanf(st, "h.%d.%n", &l, &n) != 1 || n == 0) return 0;
  const char *s = st + n;
  const char *kind = strrchr(s, '.'); /* ".weight" or ".bias" */
  if (!kind) return 0;
  static const struct {
    const char *ours;
    const char *hf[3];
    int np;
  } blk[] = {{"ln_1", {"input_layernorm"}, 1},
             {"ln_2", {"post_attention_layernorm"}, 1},
             {"attn.qkv", {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}, 3},
             {"attn.proj", {"self_attn.o_proj"}, 1},
             {"mlp.fc", {"mlp.gate_proj", "mlp.up_proj"}, 2},
             {"mlp.proj", {"mlp.down_proj"}, 1}};
  const size_t stem = (size_t)(kind - s);
  for (size_t i = 0; i < sizeof blk / sizeof blk[0]; i++) {
    if (strlen(blk[i].ours) != stem || strncmp(s, blk[i].ours, stem) != 0) continue;
    if (i < 2 && strcmp(kind, ".weight") != 0) return 0; /* RMSNorm has no bias */
    const int64_t rows[][3] = {{C}, {C}, {q, kv, kv}, {C}, {F, F}, {C}};
    for (int k = 0; k < blk[i].np; k++) {
      snprintf(out[k].hf, HF_NAME, "model.layers.%d.%s%s", l, blk[i].hf[k], kind);
      out[k].rows = rows[i][k];
    }
    return blk[i].np;
  }
  return 0;
}

static void shape_str(const int64_t *s, int nd, char *buf, size_t cap) {
  int o = snprintf(buf, cap, "[");
  for (int i = 0; i < nd && o > 0 && (size_t)o < cap; i++)
    o += snprintf(buf + o, cap - (size_t)o, "%s%lld", i ? ", " : "", (long long)s[i]);
  if (o > 0 && (size_t)o < cap) snprintf(buf + o, cap - (size_t)o, "]");
}

/* model.layers.{l}.self_attn.rotary_emb.inv_freq: a buffer, recomputed here. */
static int is_buffer(const char *name) {
  int l, n = 0;
  if (sscanf(name, "model.layers.%d.%n", &l, &n) != 1 || n == 0) return 0;
  return strcmp(name + n, "self_attn.rotary_emb.inv_freq") == 0;
}

static const char *family_name(const st_model_config *cfg) {
  return cfg->arch == ST_ARCH_QWEN2 ? "Qwen2" : "Llama";
}

/* A tied config's lm_head.weight: accepted when it equals the embedding. */
static int check_tied_head(const st_sf_set *set, const st_sf_tensor *t,
                           const st_model_config *cfg, const st_param_table *tab,
                           const float *params) {
  if (t->ndim != 2 || t->shape[0] != cfg->vocab_size || t->shape[1] != cfg->n_embd)
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor lm_head.weight is not [%d, %d] like "
                         "model.embed_tokens.weight", set->files[t->file], cfg->vocab_size,
                         cfg->n_embd);
  float *buf = malloc((size_t)t->numel * sizeof *buf);
  if (!buf) return st_error_set("out of host memory reading lm_head.weight");
  int rc = st_sf_read_f32(set, t, buf);
  const int w = st_param_find(tab, "wte.weight");
  if (!rc && (w < 0 || memcmp(buf, params + tab->t[w].offset,
                              (size_t)t->numel * sizeof *buf) != 0))
    rc = st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor lm_head.weight differs from "
                       "model.embed_tokens.weight but config.json says tie_word_embeddings "
                       "true: set it false for an untied head", set->files[t->file]);
  free(buf);
  return rc;
}

static int family_read(const char *dir, const st_sf_set *set, const st_model_config *cfg,
                       const st_param_table *tab, float *params) {
  char *used = calloc((size_t)set->n + 1, 1);
  if (!used) return st_error_set("out of host memory reading %s", dir);
  int rc = -1;
  memset(params, 0, (size_t)tab->total * sizeof *params);
  for (int i = 0; i < tab->n; i++) {
    const st_tensor *p = &tab->t[i];
    piece pc[3];
    const int np = pieces(cfg, p->name, pc);
    if (np == 0) {
      st_error_setc(ST_EXIT_CHECKPOINT, "%s: shardtrain parameter %s has no %s counterpart (the "
                    "parameter table does not describe a %s model)", dir, p->name,
                    family_name(cfg), st_arch_name(cfg->arch));
      goto out;
    }
    const int64_t cols = p->ndim == 2 ? p->shape[1] : 1;
    int64_t row = 0;
    for (int k = 0; k < np; k++) {
      const st_sf_tensor *t = st_sf_find(set, pc[k].hf);
      if (!t) {
        st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor %s is missing (a %s model of this "
                      "config.json needs it%s)", dir, pc[k].hf, family_name(cfg),
                      strcmp(p->name, "lm_head.weight") == 0
                          ? ": tie_word_embeddings is false, so the head is its own tensor"
                          : "");
        goto out;
      }
      used[t - set->t] = 1;
      const int64_t want[ST_SF_MAX_DIM] = {pc[k].rows, cols};
      if (t->ndim != p->ndim || t->shape[0] != want[0] || (p->ndim == 2 && t->shape[1] != cols)) {
        char a[64], b[64];
        shape_str(t->shape, t->ndim, a, sizeof a);
        shape_str(want, p->ndim, b, sizeof b);
        st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor %s has shape %s but config.json's shape "
                      "needs %s", set->files[t->file], pc[k].hf, a, b);
        goto out;
      }
      if (st_sf_read_f32(set, t, params + p->offset + row * cols)) goto out;
      row += pc[k].rows;
    }
  }
  for (int i = 0; i < set->n; i++) {
    const st_sf_tensor *t = &set->t[i];
    if (used[i] || is_buffer(t->name)) continue;
    if (!cfg->untied && strcmp(t->name, "lm_head.weight") == 0) {
      if (check_tied_head(set, t, cfg, tab, params)) goto out;
      continue;
    }
    st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor %s is not part of a %s model of this "
                  "config.json (an extra tensor: a different architecture or a corrupt file)",
                  set->files[t->file], t->name, family_name(cfg));
    goto out;
  }
  rc = 0;
out:
  free(used);
  return rc;
}

/* The shortest decimal that reads back as x: 1e-06 for 1e-6f, not 9.99999997e-07. */
static double short_decimal(float x) {
  char b[32];
  for (int p = 1; p <= 9; p++) {
    snprintf(b, sizeof b, "%.*g", p, (double)x);
    if ((float)strtod(b, NULL) == x) return strtod(b, NULL);
  }
  return (double)x;
}

static void add_rope(cJSON *j, const st_model_config *cfg) {
  const st_rope_scaling *r = &cfg->rope_scaling;
  const double theta = short_decimal(cfg->rope_theta);
  cJSON_AddNumberToObject(j, "rope_theta", theta);
  cJSON *p = cJSON_AddObjectToObject(j, "rope_parameters");
  cJSON_AddNumberToObject(p, "rope_theta", theta);
  if (r->kind != ST_ROPE_SCALING_LLAMA3) {
    cJSON_AddStringToObject(p, "rope_type", "default");
    cJSON_AddNullToObject(j, "rope_scaling");
    return;
  }
  cJSON *s = cJSON_AddObjectToObject(j, "rope_scaling");
  cJSON *both[2] = {s, p};
  for (int i = 0; i < 2; i++) {
    cJSON_AddStringToObject(both[i], "rope_type", "llama3");
    cJSON_AddNumberToObject(both[i], "factor", short_decimal(r->factor));
    cJSON_AddNumberToObject(both[i], "low_freq_factor", short_decimal(r->low_freq_factor));
    cJSON_AddNumberToObject(both[i], "high_freq_factor", short_decimal(r->high_freq_factor));
    cJSON_AddNumberToObject(both[i], "original_max_position_embeddings", r->original_max_pos);
  }
}

static char *family_config_json(const st_model_config *cfg, st_dtype dt) {
  const int qwen = cfg->arch == ST_ARCH_QWEN2;
  cJSON *j = cJSON_CreateObject();
  cJSON *a = cJSON_AddArrayToObject(j, "architectures");
  cJSON_AddItemToArray(a, cJSON_CreateString(qwen ? "Qwen2ForCausalLM" : "LlamaForCausalLM"));
  cJSON_AddStringToObject(j, "model_type", qwen ? "qwen2" : "llama");
  cJSON_AddStringToObject(j, "hidden_act", "silu");
  cJSON_AddNumberToObject(j, "hidden_size", cfg->n_embd);
  cJSON_AddNumberToObject(j, "intermediate_size", cfg->ffn_dim);
  cJSON_AddNumberToObject(j, "num_hidden_layers", cfg->n_layer);
  cJSON_AddNumberToObject(j, "num_attention_heads", cfg->n_head);
  cJSON_AddNumberToObject(j, "num_key_value_heads", cfg->n_kv_head);
  if (!qwen) cJSON_AddNumberToObject(j, "head_dim", cfg->n_embd / cfg->n_head);
  cJSON_AddNumberToObject(j, "max_position_embeddings", cfg->block_size);
  cJSON_AddNumberToObject(j, "rms_norm_eps", short_decimal(cfg->norm_eps));
  add_rope(j, cfg);
  cJSON_AddBoolToObject(j, "tie_word_embeddings", !cfg->untied);
  if (!qwen) {
    cJSON_AddBoolToObject(j, "attention_bias", !(cfg->no_bias & ST_NO_BIAS_QKV));
    cJSON_AddBoolToObject(j, "mlp_bias", !(cfg->no_bias & ST_NO_BIAS_MLP));
    cJSON_AddNumberToObject(j, "pretraining_tp", 1);
  } else {
    cJSON_AddBoolToObject(j, "use_sliding_window", 0);
    cJSON_AddNullToObject(j, "sliding_window");
    cJSON_AddNumberToObject(j, "max_window_layers", cfg->n_layer);
  }
  cJSON_AddNumberToObject(j, "attention_dropout", 0.0);
  cJSON_AddNumberToObject(j, "initializer_range", 0.02);
  cJSON_AddBoolToObject(j, "use_cache", 1);
  cJSON_AddNumberToObject(j, "vocab_size", cfg->vocab_size);
  const char *dts = dt == ST_BF16 ? "bfloat16" : dt == ST_FP16 ? "float16" : "float32";
  cJSON_AddStringToObject(j, "torch_dtype", dts); /* transformers 4 */
  cJSON_AddStringToObject(j, "dtype", dts);       /* transformers 5 */
  char *s = cJSON_Print(j);
  cJSON_Delete(j);
  return s;
}

static int family_write(const char *path, const st_model_config *cfg, const st_param_table *tab,
                        const float *params, st_dtype dt) {
  const int cap = 3 * tab->n;
  st_sf_out *out = calloc((size_t)cap, sizeof *out);
  void **bufs = calloc((size_t)cap, sizeof *bufs);
  char (*names)[HF_NAME] = calloc((size_t)cap, sizeof *names);
  int n = 0, rc = -1;
  if (!out || !bufs || !names) {
    st_error_set("out of host memory writing %s", path);
    goto done;
  }
  for (int i = 0; i < tab->n; i++) {
    const st_tensor *p = &tab->t[i];
    piece pc[3];
    const int np = pieces(cfg, p->name, pc);
    if (np == 0) {
      st_error_setc(ST_EXIT_CHECKPOINT, "%s: shardtrain parameter %s has no %s counterpart",
                    path, p->name, family_name(cfg));
      goto done;
    }
    const int64_t cols = p->ndim == 2 ? p->shape[1] : 1;
    int64_t row = 0;
    for (int k = 0; k < np; k++, n++) {
      const int64_t numel = pc[k].rows * cols;
      bufs[n] = malloc((size_t)numel * st_dtype_size(dt));
      if (!bufs[n]) {
        st_error_set("out of host memory writing %s", path);
        goto done;
      }
      st_dtype_from_f32(dt, bufs[n], params + p->offset + row * cols, (size_t)numel);
      memcpy(names[n], pc[k].hf, HF_NAME);
      out[n].name = names[n];
      out[n].dtype = dt;
      out[n].ndim = p->ndim;
      out[n].shape[0] = pc[k].rows;
      out[n].shape[1] = cols;
      out[n].data = bufs[n];
      row += pc[k].rows;
    }
  }
  rc = st_sf_write(path, out, n);
done:
  for (int i = 0; bufs && i < cap; i++) free(bufs[i]);
  free(bufs);
  free(names);
  free(out);
  return rc;
}

const st_hf_arch st_hf_arch_llama = {"llama", llama_parse_config, family_read,
                                     family_config_json, family_write};
const st_hf_arch st_hf_arch_qwen2 = {"qwen2", qwen2_parse_config, family_read,
                                     family_config_json, family_write};
