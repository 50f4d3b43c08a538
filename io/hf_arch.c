/* hf_arch.c - the architecture table, config.json and tokenizer files (see hf_arch.h). */
#include "io/hf_arch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/fsutil.h"

extern const st_hf_arch st_hf_arch_gpt2, st_hf_arch_llama, st_hf_arch_qwen2;

static const st_hf_arch *const k_archs[] = {&st_hf_arch_gpt2, &st_hf_arch_llama,
                                            &st_hf_arch_qwen2};

const st_hf_arch *st_hf_arch_find(const char *model_type) {
  for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0]; i++)
    if (strcmp(k_archs[i]->model_type, model_type) == 0) return k_archs[i];
  return NULL;
}

int st_hf_is_dir(const char *dir) {
  char p[1300];
  snprintf(p, sizeof p, "%s/config.json", dir);
  return st_is_dir(dir) && st_path_exists(p);
}

static char *slurp(const char *path, size_t max) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = malloc(max + 1);
  size_t n = buf ? fread(buf, 1, max + 1, f) : 0;
  fclose(f);
  if (!buf || n > max) {
    free(buf);
    return NULL;
  }
  buf[n] = 0;
  return buf;
}

int st_hf_read_config(const char *dir, const st_hf_arch **arch, st_model_config *cfg) {
  char p[1300];
  snprintf(p, sizeof p, "%s/config.json", dir);
  char *text = slurp(p, 1 << 20);
  if (!text) return st_error_setc(ST_EXIT_CHECKPOINT, "cannot read %s (or it is over 1 MiB)", p);
  cJSON *j = cJSON_Parse(text);
  free(text);
  if (!cJSON_IsObject(j)) {
    cJSON_Delete(j);
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s is not a JSON object", p);
  }
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
  if (!cJSON_IsString(mt)) {
    cJSON_Delete(j);
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: no model_type string; this build reads "
                         "model_type \"gpt2\", \"llama\" and \"qwen2\"", p);
  }
  *arch = st_hf_arch_find(mt->valuestring);
  if (!*arch) {
    st_error_setc(ST_EXIT_CHECKPOINT, "%s: model_type \"%s\" is not supported yet (this build "
                  "reads \"gpt2\", \"llama\" and \"qwen2\")", p, mt->valuestring);
    cJSON_Delete(j);
    return -1;
  }
  memset(cfg, 0, sizeof *cfg);
  int rc = (*arch)->parse_config(p, j, cfg);
  cJSON_Delete(j);
  if (rc) return -1;
  if (st_model_validate(cfg)) return st_error_setc(ST_EXIT_CHECKPOINT, "%s: %s", p, st_error_msg());
  return 0;
}

cJSON *st_hf_special_ids(const char *dir) {
  char p[1300];
  snprintf(p, sizeof p, "%s/config.json", dir);
  char *text = slurp(p, 1 << 20);
  cJSON *j = text ? cJSON_Parse(text) : NULL;
  free(text);
  cJSON *ids = cJSON_IsObject(j) ? cJSON_CreateObject() : NULL;
  static const char *const keys[] = {"bos_token_id", "eos_token_id", "pad_token_id"};
  for (int i = 0; ids && i < 3; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, keys[i]);
    if (v) cJSON_AddItemToObject(ids, keys[i], cJSON_Duplicate(v, 1));
  }
  cJSON_Delete(j);
  return ids;
}

char *st_hf_config_with_ids(char *cfg, const cJSON *ids) {
  if (!cJSON_IsObject(ids) || !ids->child) return cfg;
  cJSON *j = cJSON_Parse(cfg);
  if (!j) return NULL;
  const cJSON *e;
  cJSON_ArrayForEach(e, ids) {
    cJSON_DeleteItemFromObjectCaseSensitive(j, e->string);
    cJSON_AddItemToObject(j, e->string, cJSON_Duplicate(e, 1));
  }
  char *out = cJSON_Print(j);
  cJSON_Delete(j);
  return out;
}

int st_hf_read_dir(const char *dir, const st_model_config *cfg, const st_param_table *tab,
                   float *params) {
  const st_hf_arch *arch = NULL;
  st_model_config file_cfg;
  if (st_hf_read_config(dir, &arch, &file_cfg) || !arch) return -1;
  st_sf_set set;
  memset(&set, 0, sizeof set);
  int rc = st_sf_open_dir(dir, &set);
  if (!rc) rc = arch->read(dir, &set, cfg, tab, params);
  st_sf_close(&set);
  if (rc) st_error_code(ST_EXIT_CHECKPOINT);
  return rc;
}

/* tokenizer.model / qwen.tiktoken: tiktoken rank files; shardtrain_tiktoken.json
 * names the pattern and special tokens of one (io/tokenizer.h) */
const char *const st_hf_tokenizer_files[] = {"vocab.json", "merges.txt", "tokenizer.json",
                                             "tokenizer_config.json", "special_tokens_map.json",
                                             "tokenizer.model", "qwen.tiktoken",
                                             "shardtrain_tiktoken.json", NULL};

int st_hf_has_tokenizer(const char *dir) {
  char a[1300], b[1300];
  snprintf(a, sizeof a, "%s/vocab.json", dir);
  snprintf(b, sizeof b, "%s/merges.txt", dir);
  if (st_path_exists(a) && st_path_exists(b)) return 1;
  snprintf(a, sizeof a, "%s/shardtrain_tiktoken.json", dir);
  if (st_path_exists(a)) return 1;
  snprintf(a, sizeof a, "%s/tokenizer.json", dir);
  return st_path_exists(a);
}

static int copy_file(const char *from, const char *to) {
  FILE *in = fopen(from, "rb");
  if (!in) return st_error_set("cannot read %s: %s", from, strerror(errno));
  FILE *out = fopen(to, "wb");
  if (!out) {
    fclose(in);
    return st_error_set("cannot write %s: %s", to, strerror(errno));
  }
  char buf[65536];
  size_t n;
  int ok = 1;
  while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
  ok = !ferror(in) && ok;
  fclose(in);
  ok = fclose(out) == 0 && ok;
  return ok ? 0 : st_error_set("cannot copy %s to %s", from, to);
}

int st_hf_copy_tokenizer(const char *from, const char *to) {
  int copied = 0;
  for (int i = 0; st_hf_tokenizer_files[i]; i++) {
    char a[1300], b[1300];
    snprintf(a, sizeof a, "%s/%s", from, st_hf_tokenizer_files[i]);
    if (!st_path_exists(a)) continue;
    if (!copied && st_mkdir_p(to)) return -1;
    snprintf(b, sizeof b, "%s/%s", to, st_hf_tokenizer_files[i]);
    if (copy_file(a, b)) return -1;
    copied++;
  }
  return copied;
}
