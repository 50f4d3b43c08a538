/* config.c - model presets, validation and JSON (see config.h). */
#include "rank/model/config.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "rank/model/config_fields.h"
#include "util/error.h"

typedef struct {
  const char *name;
  int layers, heads, dim;
} preset;

/* GPT-2 sizes from Radford et al. 2019; "tiny" for tests, "small" for the
 * CPU demo (trains on two CPU cores in minutes). */
static const preset k_presets[] = {
    {"tiny", 2, 4, 64},        {"small", 4, 4, 128},
    {"gpt2-124m", 12, 12, 768}, {"gpt2-350m", 24, 16, 1024},
    {"gpt2-774m", 36, 20, 1280}, {"gpt2-1558m", 48, 25, 1600},
};

/* The Llama family at the shapes of their published config.json files
 * (Hugging Face meta-llama/Llama-3.2-1B, -3B, Llama-3.1-8B, Qwen/Qwen2.5-0.5B,
 * -1.5B, HuggingFaceTB/SmolLM2-135M, -360M). */
typedef struct {
  const char *name;
  st_arch arch;
  int layers, heads, kv_heads, dim, ffn, vocab, max_pos, untied;
  float theta, eps;
  float scale_factor; /* Llama 3 rope scaling (low 1, high 4, original 8192); 0: none */
} family_preset;

static const family_preset k_family[] = {
    {"llama-3.2-1b", ST_ARCH_LLAMA, 16, 32, 8, 2048, 8192, 128256, 131072, 0, 500000.0f, 1e-5f, 32.0f},
    {"llama-3.2-3b", ST_ARCH_LLAMA, 28, 24, 8, 3072, 8192, 128256, 131072, 0, 500000.0f, 1e-5f, 32.0f},
    {"llama-3.1-8b", ST_ARCH_LLAMA, 32, 32, 8, 4096, 14336, 128256, 131072, 1, 500000.0f, 1e-5f, 8.0f},
    {"qwen2.5-0.5b", ST_ARCH_QWEN2, 24, 14, 2, 896, 4864, 151936, 32768, 0, 1000000.0f, 1e-6f, 0},
    {"qwen2.5-1.5b", ST_ARCH_QWEN2, 28, 12, 2, 1536, 8960, 151936, 32768, 0, 1000000.0f, 1e-6f, 0},
    {"smollm2-135m", ST_ARCH_LLAMA, 30, 9, 3, 576, 1536, 49152, 8192, 0, 100000.0f, 1e-5f, 0},
    {"smollm2-360m", ST_ARCH_LLAMA, 32, 15, 5, 960, 2560, 49152, 8192, 0, 100000.0f, 1e-5f, 0},
};

const char *st_arch_name(st_arch arch) {
  switch (arch) {
  case ST_ARCH_LLAMA: return "llama";
  case ST_ARCH_QWEN2: return "qwen2";
  default: return "gpt2";
  }
}

int st_arch_parse(const char *name, st_arch *arch) {
  const st_arch all[] = {ST_ARCH_GPT2, ST_ARCH_LLAMA, ST_ARCH_QWEN2};
  for (int i = 0; i < 3; i++)
    if (strcmp(name, st_arch_name(all[i])) == 0) {
      *arch = all[i];
      return 0;
    }
  return st_error_set("unknown --arch '%s'; use gpt2, llama or qwen2", name);
}

void st_model_arch_defaults(st_model_config *cfg, st_arch arch) {
  cfg->arch = arch;
  if (arch == ST_ARCH_GPT2) {
    cfg->norm = ST_NORM_LAYERNORM;
    cfg->pos = ST_POS_LEARNED;
    cfg->mlp = ST_MLP_GELU;
    cfg->no_bias = 0;
    cfg->norm_eps = 1e-5f;
    cfg->rope_theta = 0;
    return;
  }
  cfg->norm = ST_NORM_RMSNORM;
  cfg->pos = ST_POS_ROPE;
  cfg->mlp = ST_MLP_SWIGLU;
  cfg->no_bias = arch == ST_ARCH_QWEN2 ? ST_NO_BIAS_ALL & ~ST_NO_BIAS_QKV : ST_NO_BIAS_ALL;
  cfg->norm_eps = arch == ST_ARCH_QWEN2 ? 1e-6f : 1e-5f;
  cfg->rope_theta = arch == ST_ARCH_QWEN2 ? 1000000.0f : 500000.0f;
}

int st_model_preset(const char *name, st_model_config *cfg) {
  for (size_t i = 0; i < sizeof k_presets / sizeof k_presets[0]; i++) {
    if (strcmp(name, k_presets[i].name) == 0) {
      st_model_arch_defaults(cfg, ST_ARCH_GPT2);
      cfg->n_layer = k_presets[i].layers;
      cfg->n_head = k_presets[i].heads;
      cfg->n_embd = k_presets[i].dim;
      return 0;
    }
  }
  for (size_t i = 0; i < sizeof k_family / sizeof k_family[0]; i++) {
    const family_preset *f = &k_family[i];
    if (strcmp(name, f->name) != 0) continue;
    st_model_arch_defaults(cfg, f->arch);
    cfg->n_layer = f->layers;
    cfg->n_head = f->heads;
    cfg->n_kv_head = f->kv_heads;
    cfg->n_embd = f->dim;
    cfg->ffn_dim = f->ffn;
    cfg->vocab_size = f->vocab;
    cfg->block_size = f->max_pos;
    cfg->untied = f->untied;
    cfg->rope_theta = f->theta;
    cfg->norm_eps = f->eps;
    memset(&cfg->rope_scaling, 0, sizeof cfg->rope_scaling);
    if (f->scale_factor > 0)
      cfg->rope_scaling = (st_rope_scaling){ST_ROPE_SCALING_LLAMA3, f->scale_factor, 1.0f, 4.0f,
                                            8192};
    return 0;
  }
  return st_error_set("unknown --model preset '%s'; use one of tiny, small, gpt2-124m, "
                      "gpt2-350m, gpt2-774m, gpt2-1558m, llama-3.2-1b, llama-3.2-3b, "
                      "llama-3.1-8b, qwen2.5-0.5b, qwen2.5-1.5b, smollm2-135m, smollm2-360m, "
                      "or give --layers/--heads/--dim",
                      name);
}

int st_model_validate(st_model_config *cfg) {
  if (cfg->n_layer < 1 || cfg->n_layer > ST_MODEL_MAX_LAYERS)
    return st_error_set("--layers must be in [1, %d], got %d", ST_MODEL_MAX_LAYERS, cfg->n_layer);
  if (cfg->n_head < 1 || cfg->n_head > ST_MODEL_MAX_HEADS)
    return st_error_set("--heads must be in [1, %d], got %d", ST_MODEL_MAX_HEADS, cfg->n_head);
  if (cfg->n_embd < 1 || cfg->n_embd > ST_MODEL_MAX_WIDTH)
    return st_error_set("--dim must be in [1, %d], got %d", ST_MODEL_MAX_WIDTH, cfg->n_embd);
  if (cfg->n_embd % cfg->n_head != 0)
    return st_error_set("--dim %d must be a multiple of --heads %d", cfg->n_embd, cfg->n_head);
  if (cfg->block_size < 1 || cfg->block_size > ST_MODEL_MAX_POSITIONS)
    return st_error_set("--seq-len must be in [1, %d], got %d", ST_MODEL_MAX_POSITIONS,
                        cfg->block_size);
  if (cfg->vocab_size < 2 || cfg->vocab_size > ST_MODEL_MAX_VOCAB)
    return st_error_set("vocabulary size %d out of range [2, %d]", cfg->vocab_size,
                        ST_MODEL_MAX_VOCAB);
  if (cfg->n_kv_head == 0) cfg->n_kv_head = cfg->n_head;
  if (cfg->n_kv_head < 1 || cfg->n_head % cfg->n_kv_head != 0)
    return st_error_set("--kv-heads %d must divide --heads %d", cfg->n_kv_head, cfg->n_head);
  if (cfg->ffn_dim == 0) cfg->ffn_dim = 4 * cfg->n_embd;
  if (cfg->ffn_dim < 1 || cfg->ffn_dim > ST_MODEL_MAX_FFN)
    return st_error_set("--ffn-dim must be in [1, %d], got %d", ST_MODEL_MAX_FFN, cfg->ffn_dim);
  if (cfg->norm_eps == 0) cfg->norm_eps = 1e-5f;
  if (!(cfg->norm_eps > 0 && cfg->norm_eps < 1))
    return st_error_set("--norm-eps must be in (0, 1), got %g", (double)cfg->norm_eps);
  if (cfg->norm == ST_NORM_LAYERNORM && cfg->norm_eps != 1e-5f)
    return st_error_set("--norm-eps %g: LayerNorm uses 1e-5 only; RMSNorm (--arch llama|qwen2) "
                        "takes any epsilon",
                        (double)cfg->norm_eps);
  if (cfg->pos == ST_POS_ROPE) {
    if (cfg->rope_theta == 0) cfg->rope_theta = 10000.0f;
    if (!(cfg->rope_theta > 1))
      return st_error_set("--rope-theta must be > 1, got %g", (double)cfg->rope_theta);
    if (st_model_head_dim(cfg) % 2 != 0)
      return st_error_set("rotary positions need an even head size; --dim %d / --heads %d = %d",
                          cfg->n_embd, cfg->n_head, st_model_head_dim(cfg));
    const st_rope_scaling *r = &cfg->rope_scaling;
    if (r->kind == ST_ROPE_SCALING_LLAMA3 &&
        !(r->factor >= 1 && r->low_freq_factor > 0 && r->high_freq_factor > r->low_freq_factor &&
          r->original_max_pos > 0))
      return st_error_set("llama3 rope scaling needs factor >= 1, 0 < low_freq_factor < "
                          "high_freq_factor and original_max_position_embeddings > 0");
  }
  cfg->padded_vocab_size = (cfg->vocab_size + 127) / 128 * 128;
  return 0;
}

void st_model_add_json(cJSON *o, const st_model_config *cfg, const char *seq_key) {
  char buf[32];
  for (int i = 0; i < ST_MF_COUNT; i++) {
    const st_model_field *f = st_model_field_info((st_model_field_id)i);
    const char *key = i == ST_MF_POSITIONS ? seq_key : f->key;
    if (f->kind == ST_MF_ENUM)
      cJSON_AddStringToObject(o, key, st_model_field_show(cfg, (st_model_field_id)i, buf,
                                                          sizeof buf));
    else if (f->kind == ST_MF_BOOL)
      cJSON_AddBoolToObject(o, key, st_model_field_get(cfg, (st_model_field_id)i) != 0);
    else
      cJSON_AddNumberToObject(o, key, st_model_field_get(cfg, (st_model_field_id)i));
    if (i == ST_MF_VOCAB) cJSON_AddNumberToObject(o, "padded_vocab_size", cfg->padded_vocab_size);
  }
}

char *st_model_to_json(const st_model_config *cfg) {
  cJSON *o = cJSON_CreateObject();
  st_model_add_json(o, cfg, "block_size");
  char *s = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return s;
}

/* Field f of m into cfg: required ones must be there; the architecture's
 * may be absent (configs written before it existed: GPT-2's zero stays). */
static int read_field(const cJSON *m, st_model_field_id id, st_model_config *cfg) {
  const st_model_field *f = st_model_field_info(id);
  const cJSON *it = cJSON_GetObjectItem(m, f->key);
  if (!it) {
    if (f->required) return st_error_set("model configuration lacks numeric field '%s'", f->key);
    return 0;
  }
  if (f->kind == ST_MF_ENUM) {
    if (cJSON_IsString(it))
      for (int v = 0; f->names[v]; v++)
        if (strcmp(it->valuestring, f->names[v]) == 0) {
          st_model_field_set(cfg, id, v);
          return 0;
        }
    char list[128] = "";
    for (int v = 0; f->names[v]; v++)
      snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", v ? "|" : "",
               f->names[v]);
    return st_error_set("model configuration field '%s' must be one of %s", f->key, list);
  }
  if (f->kind == ST_MF_BOOL) {
    if (!cJSON_IsBool(it))
      return st_error_set("model configuration field '%s' must be true or false", f->key);
    st_model_field_set(cfg, id, cJSON_IsTrue(it));
    return 0;
  }
  if (!cJSON_IsNumber(it))
    return st_error_set("model configuration lacks numeric field '%s'", f->key);
  st_model_field_set(cfg, id, it->valuedouble);
  return 0;
}

int st_model_from_json(const char *json, st_model_config *cfg) {
  cJSON *o = cJSON_Parse(json);
  if (!o) return st_error_set("model configuration is not valid JSON");
  cJSON *m = cJSON_GetObjectItem(o, "model");
  if (!m) m = o;
  memset(cfg, 0, sizeof *cfg); /* every zero is GPT-2's choice */
  int err = 0;
  for (int i = 0; i < ST_MF_COUNT && !err; i++) err = read_field(m, (st_model_field_id)i, cfg);
  const cJSON *pv = cJSON_GetObjectItem(m, "padded_vocab_size");
  if (!err && !cJSON_IsNumber(pv))
    err = st_error_set("model configuration lacks numeric field 'padded_vocab_size'");
  if (!err) cfg->padded_vocab_size = pv->valueint;
  cJSON_Delete(o);
  return err ? -1 : 0;
}

int64_t st_model_num_params(const st_model_config *c) {
  /* rank/model/params.c's table, tensor by tensor; zero n_kv_head and
   * ffn_dim mean what st_model_validate makes of them */
  const int64_t C = c->n_embd, L = c->n_layer, Vp = c->padded_vocab_size;
  const int64_t NKV = c->n_kv_head ? c->n_kv_head : c->n_head;
  const int64_t F = c->ffn_dim ? c->ffn_dim : 4 * C;
  const int64_t QKV = (c->n_head + 2 * NKV) * (C / c->n_head);
  const int64_t FC = c->mlp == ST_MLP_SWIGLU ? 2 * F : F;
  const int64_t norm = c->norm == ST_NORM_LAYERNORM ? 2 * C : C; /* RMSNorm: no bias */
  int64_t block = 2 * norm + QKV * C + C * C + FC * C + C * F;
  if (!(c->no_bias & ST_NO_BIAS_QKV)) block += QKV;
  if (!(c->no_bias & ST_NO_BIAS_PROJ)) block += C;
  if (!(c->no_bias & ST_NO_BIAS_MLP)) block += FC + C;
  return Vp * C + (c->pos == ST_POS_LEARNED ? (int64_t)c->block_size * C : 0) + L * block +
         norm + (c->untied ? Vp * C : 0);
}
