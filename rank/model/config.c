/* config.c - model presets, validation and JSON (see config.h). */
#include "rank/model/config.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

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

int st_model_preset(const char *name, st_model_config *cfg) {
  for (size_t i = 0; i < sizeof k_presets / sizeof k_presets[0]; i++) {
    if (strcmp(name, k_presets[i].name) == 0) {
      cfg->n_layer = k_presets[i].layers;
      cfg->n_head = k_presets[i].heads;
      cfg->n_embd = k_presets[i].dim;
      return 0;
    }
  }
  return st_error_set("unknown --model preset '%s'; use one of tiny, small, gpt2-124m, "
                      "gpt2-350m, gpt2-774m, gpt2-1558m, or give --layers/--heads/--dim",
                      name);
}

int st_model_validate(st_model_config *cfg) {
  if (cfg->n_layer < 1 || cfg->n_layer > 1000)
    return st_error_set("--layers must be in [1, 1000], got %d", cfg->n_layer);
  if (cfg->n_head < 1) return st_error_set("--heads must be >= 1, got %d", cfg->n_head);
  if (cfg->n_embd < 1 || cfg->n_embd % cfg->n_head != 0)
    return st_error_set("--dim %d must be a positive multiple of --heads %d", cfg->n_embd,
                        cfg->n_head);
  if (cfg->block_size < 1) return st_error_set("--seq-len must be >= 1, got %d", cfg->block_size);
  /* the token files' bound (io/tokens.h: uint32 ids past 65536) */
  if (cfg->vocab_size < 2 || cfg->vocab_size > (1 << 24))
    return st_error_set("vocabulary size %d out of range [2, %d]", cfg->vocab_size, 1 << 24);
  cfg->padded_vocab_size = (cfg->vocab_size + 127) / 128 * 128;
  return 0;
}

void st_model_add_json(cJSON *o, const st_model_config *cfg, const char *seq_key) {
  cJSON_AddNumberToObject(o, "n_layer", cfg->n_layer);
  cJSON_AddNumberToObject(o, "n_head", cfg->n_head);
  cJSON_AddNumberToObject(o, "n_embd", cfg->n_embd);
  cJSON_AddNumberToObject(o, seq_key, cfg->block_size);
  cJSON_AddNumberToObject(o, "vocab_size", cfg->vocab_size);
  cJSON_AddNumberToObject(o, "padded_vocab_size", cfg->padded_vocab_size);
}

char *st_model_to_json(const st_model_config *cfg) {
  cJSON *o = cJSON_CreateObject();
  st_model_add_json(o, cfg, "block_size");
  char *s = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return s;
}

int st_model_from_json(const char *json, st_model_config *cfg) {
  cJSON *o = cJSON_Parse(json);
  if (!o) return st_error_set("model configuration is not valid JSON");
  cJSON *m = cJSON_GetObjectItem(o, "model");
  if (!m) m = o;
  const char *keys[] = {"n_layer", "n_head", "n_embd", "block_size", "vocab_size",
                        "padded_vocab_size"};
  int *dst[] = {&cfg->n_layer, &cfg->n_head, &cfg->n_embd, &cfg->block_size,
                &cfg->vocab_size, &cfg->padded_vocab_size};
  for (int i = 0; i < 6; i++) {
    cJSON *it = cJSON_GetObjectItem(m, keys[i]);
    if (!cJSON_IsNumber(it)) {
      cJSON_Delete(o);
      return st_error_set("model configuration lacks numeric field '%s'", keys[i]);
    }
    *dst[i] = it->valueint;
  }
  cJSON_Delete(o);
  return 0;
}

int64_t st_model_num_params(const st_model_config *c) {
  const int64_t C = c->n_embd, L = c->n_layer;
  return (int64_t)c->padded_vocab_size * C + (int64_t)c->block_size * C +
         L * (12 * C * C + 13 * C) + 2 * C;
}
