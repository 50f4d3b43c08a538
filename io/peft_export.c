/* peft_export.c - write LoRA adapters as a PEFT adapter directory (see
 * peft_export.h). */
#define _GNU_SOURCE
#include "io/peft_export.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/peft_names.h"
#include "io/safetensors.h"
#include "util/error.h"
#include "util/fsutil.h"

#define NAME_MAX_LEN 160 /* st_sf_tensor.name's size */

/* A float as the shortest decimal that reads back to the same float (0.1f
 * as "0.1", not 0.10000000149011612), so the JSON says what was asked. */
static cJSON *float_json(float x) {
  char s[32];
  for (int p = 6; p <= 9; p++) {
    snprintf(s, sizeof s, "%.*g", p, (double)x);
    if (strtof(s, NULL) == x) break;
  }
  return cJSON_CreateRaw(s);
}

static int check_config(const st_peft_config *cfg) {
  if (cfg->arch != ST_ARCH_GPT2 && cfg->arch != ST_ARCH_LLAMA && cfg->arch != ST_ARCH_QWEN2)
    return st_error_setc(ST_EXIT_CHECKPOINT, "PEFT export: unknown architecture %d",
                         (int)cfg->arch);
  if (cfg->r <= 0)
    return st_error_setc(ST_EXIT_CHECKPOINT, "PEFT export: rank r must be > 0, got %d", cfg->r);
  if (!isfinite(cfg->alpha))
    return st_error_setc(ST_EXIT_CHECKPOINT, "PEFT export: lora_alpha must be finite");
  if (!(cfg->dropout >= 0.0f && cfg->dropout < 1.0f))
    return st_error_setc(ST_EXIT_CHECKPOINT, "PEFT export: lora_dropout must be in [0, 1), got "
                         "%g", (double)cfg->dropout);
  if (cfg->dtype != ST_FP32 && cfg->dtype != ST_BF16 && cfg->dtype != ST_FP16)
    return st_error_setc(ST_EXIT_CHECKPOINT, "PEFT export: dtype must be fp32, bf16 or fp16");
  return 0;
}

static int all_finite(const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(x[i])) return 0;
  return 1;
}

static int check_adapters(const st_peft_config *cfg, const st_peft_adapter *ad, int n) {
  if (n < 1) return st_error_setc(ST_EXIT_CHECKPOINT, "PEFT export: no adapters to write");
  for (int i = 0; i < n; i++) {
    const st_peft_adapter *a = &ad[i];
    if (!st_peft_module_known(cfg->arch, a->module))
      return st_error_setc(ST_EXIT_CHECKPOINT, "PEFT export: adapter %d: module '%s' is not "
                           "one of %s's (%s ...)", i, a->module, st_arch_name(cfg->arch),
                           st_peft_module_at(cfg->arch, 0));
    if (a->layer < 0 || a->in <= 0 || a->out <= 0 || !a->A || !a->B)
      return st_error_setc(ST_EXIT_CHECKPOINT, "PEFT export: adapter %d (layer %d, %s): needs "
                           "layer >= 0, in > 0, out > 0 and both A and B", i, a->layer,
                           a->module);
    if (!all_finite(a->A, (size_t)cfg->r * (size_t)a->in) ||
        !all_finite(a->B, (size_t)a->out * (size_t)cfg->r))
      return st_error_setc(ST_EXIT_CHECKPOINT, "PEFT export: adapter of layer %d, %s holds NaN "
                           "or inf; nothing written", a->layer, a->module);
    for (int j = 0; j < i; j++)
      if (ad[j].layer == a->layer && strcmp(ad[j].module, a->module) == 0)
        return st_error_setc(ST_EXIT_CHECKPOINT, "PEFT export: two adapters for layer %d, %s",
                             a->layer, a->module);
  }
  return 0;
}

static int adapter_has(const st_peft_adapter *ad, int n, const char *module) {
  for (int i = 0; i < n; i++)
    if (strcmp(ad[i].module, module) == 0) return 1;
  return 0;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* target_modules: for each module of the family that carries an adapter,
 * its leaf name, or its path when the leaf also names an untouched module
 * of the family; sorted, unique. */
static cJSON *target_modules(st_arch arch, const st_peft_adapter *ad, int n) {
  const char *t[16];
  int nt = 0;
  for (int i = 0; i < st_peft_n_modules(arch) && nt < 16; i++) {
    const char *m = st_peft_module_at(arch, i);
    if (!adapter_has(ad, n, m)) continue;
    const char *leaf = st_peft_leaf(m);
    int ambiguous = 0;
    for (int j = 0; j < st_peft_n_modules(arch); j++) {
      const char *o = st_peft_module_at(arch, j);
      ambiguous |= strcmp(o, m) != 0 && strcmp(st_peft_leaf(o), leaf) == 0 &&
                   !adapter_has(ad, n, o);
    }
    const char *name = ambiguous ? m : leaf;
    int seen = 0;
    for (int j = 0; j < nt; j++) seen |= strcmp(t[j], name) == 0;
    if (!seen) t[nt++] = name;
  }
  qsort(t, (size_t)nt, sizeof t[0], cmp_str);
  cJSON *arr = cJSON_CreateArray();
  for (int i = 0; i < nt; i++) cJSON_AddItemToArray(arr, cJSON_CreateString(t[i]));
  return arr;
}

/* adapter_config.json text (malloc'ed), keys in sorted order as PEFT's
 * save_pretrained writes them (json.dumps(sort_keys=True)). Fields beyond
 * the ones a LoraConfig needs are written with PEFT's defaults so that a
 * reader sees the scale is alpha / r (no rsLoRA), plain LoRA (no DoRA),
 * no bias and no extra trained modules. */
static char *config_json(const st_peft_config *cfg, const st_peft_adapter *ad, int n) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddObjectToObject(j, "alpha_pattern");
  if (cfg->base_model && cfg->base_model[0])
    cJSON_AddStringToObject(j, "base_model_name_or_path", cfg->base_model);
  else
    cJSON_AddNullToObject(j, "base_model_name_or_path");
  cJSON_AddStringToObject(j, "bias", "none");
  cJSON_AddBoolToObject(j, "fan_in_fan_out", cfg->arch == ST_ARCH_GPT2);
  cJSON_AddBoolToObject(j, "inference_mode", 1);
  cJSON_AddBoolToObject(j, "init_lora_weights", 1);
  cJSON_AddNullToObject(j, "layers_to_transform");
  cJSON_AddItemToObject(j, "lora_alpha", float_json(cfg->alpha));
  cJSON_AddItemToObject(j, "lora_dropout", float_json(cfg->dropout));
  cJSON_AddNullToObject(j, "modules_to_save");
  cJSON_AddStringToObject(j, "peft_type", "LORA");
  cJSON_AddNumberToObject(j, "r", cfg->r);
  cJSON_AddObjectToObject(j, "rank_pattern");
  cJSON_AddItemToObject(j, "target_modules", target_modules(cfg->arch, ad, n));
  cJSON_AddStringToObject(j, "task_type", "CAUSAL_LM");
  cJSON_AddBoolToObject(j, "use_dora", 0);
  cJSON_AddBoolToObject(j, "use_rslora", 0);
  char *s = cJSON_Print(j);
  cJSON_Delete(j);
  return s;
}

static int write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return st_error_setc(ST_EXIT_CHECKPOINT, "cannot write %s: %s", path, strerror(errno));
  int ok = fputs(text, f) >= 0 && fputc('\n', f) != EOF;
  ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && ok;
  ok = fclose(f) == 0 && ok;
  return ok ? 0 : st_error_setc(ST_EXIT_CHECKPOINT, "cannot write %s", path);
}

/* The tensors in cfg->dtype: names[2n][NAME_MAX_LEN], and conv (NULL for
 * fp32, whose data is the caller's) holding the converted copies. */
static int build_tensors(const st_peft_config *cfg, const st_peft_adapter *ad, int n,
                         st_sf_out *t, char (*names)[NAME_MAX_LEN], void **conv) {
  size_t total = 0;
  for (int i = 0; i < n; i++) total += (size_t)cfg->r * (size_t)(ad[i].in + ad[i].out);
  *conv = NULL;
  char *buf = NULL;
  if (cfg->dtype != ST_FP32) {
    buf = malloc(total * st_dtype_size(cfg->dtype) + 1);
    if (!buf) return st_error_set("out of host memory converting the adapters to %s",
                                  st_dtype_name(cfg->dtype));
    *conv = buf;
  }
  const char *prefix = st_peft_prefix(cfg->arch);
  for (int i = 0; i < n; i++) {
    const st_peft_adapter *a = &ad[i];
    for (int k = 0; k < 2; k++) {
      st_sf_out *o = &t[2 * i + k];
      int len = snprintf(names[2 * i + k], NAME_MAX_LEN, "%s%d.%s.lora_%c.weight", prefix,
                         a->layer, a->module, k ? 'B' : 'A');
      if (len >= NAME_MAX_LEN)
        return st_error_setc(ST_EXIT_CHECKPOINT, "PEFT export: tensor name of layer %d, %s is "
                             "too long", a->layer, a->module);
      o->name = names[2 * i + k];
      o->dtype = cfg->dtype;
      o->ndim = 2;
      o->shape[0] = k ? a->out : cfg->r;
      o->shape[1] = k ? cfg->r : a->in;
      const float *src = k ? a->B : a->A;
      const size_t cnt = (size_t)o->shape[0] * (size_t)o->shape[1];
      if (buf) {
        st_dtype_from_f32(cfg->dtype, buf, src, cnt);
        o->data = buf;
        buf += cnt * st_dtype_size(cfg->dtype);
      } else {
        o->data = src;
      }
    }
  }
  return 0;
}

/* Both files into the directory tmp. */
static int write_files(const char *tmp, const st_peft_config *cfg, const st_peft_adapter *ad,
                       int n) {
  char p[1400];
  char *js = config_json(cfg, ad, n);
  if (!js) return st_error_set("out of host memory writing adapter_config.json");
  snprintf(p, sizeof p, "%s/adapter_config.json", tmp);
  int rc = write_text(p, js);
  free(js);
  if (rc) return rc;
  st_sf_out *t = calloc((size_t)(2 * n), sizeof *t);
  char(*names)[NAME_MAX_LEN] = calloc((size_t)(2 * n), sizeof *names);
  void *conv = NULL;
  rc = !t || !names ? st_error_set("out of host memory writing the PEFT adapters")
                    : build_tensors(cfg, ad, n, t, names, &conv);
  snprintf(p, sizeof p, "%s/adapter_model.safetensors", tmp);
  if (!rc) rc = st_sf_write(p, t, 2 * n);
  free(conv);
  free(names);
  free(t);
  return rc;
}

int st_peft_export(const char *out_dir, const st_peft_config *cfg, const st_peft_adapter *ad,
                   int n) {
  char out[1200];
  snprintf(out, sizeof out, "%s", out_dir);
  for (size_t l = strlen(out); l > 1 && out[l - 1] == '/'; l--) out[l - 1] = 0;
  if (!out[0]) return st_error_setc(ST_EXIT_CHECKPOINT, "PEFT export: empty output directory");
  if (st_path_exists(out))
    return st_error_setc(ST_EXIT_CHECKPOINT, "--out %s already exists; ckpt export never "
                         "overwrites: give a new path", out);
  if (check_config(cfg) || check_adapters(cfg, ad, n)) return -1;
  char tmp[1300];
  snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", out);
  /* the temporary name is ours, not the user's: name --out; a folder that
   * cannot be made is an unwritable --out, exit 1 (README, "Exit codes") */
  if (!mkdtemp(tmp))
    return st_error_setc(ST_EXIT_ERROR, "--out %s cannot be created (%s): its parent folder "
                         "must exist and be writable; create it (mkdir -p) or give another "
                         "--out", out, strerror(errno));
  chmod(tmp, 0755); /* mkdtemp's 0700 is for the temporary name only */
  int rc = write_files(tmp, cfg, ad, n);
  if (!rc && st_path_exists(out))
    rc = st_error_setc(ST_EXIT_CHECKPOINT, "%s appeared while exporting; not overwritten", out);
  if (!rc && rename(tmp, out) != 0)
    rc = st_error_setc(ST_EXIT_CHECKPOINT, "cannot rename %s to %s: %s", tmp, out,
                       strerror(errno));
  if (rc) {
    st_error_code(ST_EXIT_CHECKPOINT); /* an I/O or memory failure too: as `ckpt export` */
    st_rm_rf(tmp);
    return -1;
  }
  char parent[1200];
  snprintf(parent, sizeof parent, "%s", out);
  char *slash = strrchr(parent, '/');
  if (slash) *slash = 0;
  st_fsync_dir(slash ? (parent[0] ? parent : "/") : ".");
  return 0;
}
