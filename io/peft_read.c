/* peft_read.c - read a PEFT LoRA adapter directory (see peft_export.h). */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/peft_export.h"
#include "io/peft_names.h"
#include "io/safetensors.h"
#include "util/error.h"
#include "util/fsutil.h"

static int bad(const char *path, const char *what) {
  return st_error_setc(ST_EXIT_CHECKPOINT, "%s: %s", path, what);
}

static int is_true(const cJSON *j, const char *key) {
  return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, key));
}

static int nonempty_object(const cJSON *j, const char *key) {
  const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, key);
  return cJSON_IsObject(o) && o->child != NULL;
}

/* adapter_config.json -> s->cfg, targets, fan_in_fan_out. */
static int parse_config(const char *path, const cJSON *j, st_peft_set *s) {
  if (!cJSON_IsObject(j)) return bad(path, "not a JSON object");
  const cJSON *pt = cJSON_GetObjectItemCaseSensitive(j, "peft_type");
  if (!cJSON_IsString(pt) || strcmp(pt->valuestring, "LORA") != 0)
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: peft_type is %s, not \"LORA\": not a LoRA "
                         "adapter", path, cJSON_IsString(pt) ? pt->valuestring : "missing");
  const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "r");
  if (!cJSON_IsNumber(r) || r->valuedouble < 1 || r->valuedouble > 1e6 ||
      r->valuedouble != floor(r->valuedouble))
    return bad(path, "r must be a positive integer");
  s->cfg.r = (int)r->valuedouble;
  const cJSON *al = cJSON_GetObjectItemCaseSensitive(j, "lora_alpha");
  if (al && !cJSON_IsNumber(al)) return bad(path, "lora_alpha must be a number");
  s->cfg.alpha = al ? (float)al->valuedouble : 8.0f; /* LoraConfig's default */
  const cJSON *dr = cJSON_GetObjectItemCaseSensitive(j, "lora_dropout");
  if (dr && !cJSON_IsNumber(dr)) return bad(path, "lora_dropout must be a number");
  s->cfg.dropout = dr ? (float)dr->valuedouble : 0.0f;
  if (is_true(j, "use_rslora"))
    return bad(path, "use_rslora is true (scale alpha / sqrt(r)); shardtrain's LoRA scale is "
                     "alpha / r");
  if (is_true(j, "use_dora")) return bad(path, "use_dora is true: DoRA is not plain LoRA");
  const cJSON *bias = cJSON_GetObjectItemCaseSensitive(j, "bias");
  if (cJSON_IsString(bias) && strcmp(bias->valuestring, "none") != 0)
    return bad(path, "bias is not \"none\": trained biases are not LoRA adapters shardtrain "
                     "reads");
  if (nonempty_object(j, "rank_pattern") || nonempty_object(j, "alpha_pattern"))
    return bad(path, "rank_pattern / alpha_pattern give modules their own rank or alpha; "
                     "shardtrain has one r and one alpha");
  s->fan_in_fan_out = is_true(j, "fan_in_fan_out");
  const cJSON *bm = cJSON_GetObjectItemCaseSensitive(j, "base_model_name_or_path");
  if (cJSON_IsString(bm)) {
    snprintf(s->base_model, sizeof s->base_model, "%s", bm->valuestring);
    s->cfg.base_model = s->base_model;
  }
  const cJSON *tm = cJSON_GetObjectItemCaseSensitive(j, "target_modules");
  int nt = cJSON_IsArray(tm) ? cJSON_GetArraySize(tm) : cJSON_IsString(tm) ? 1 : 0;
  s->targets = calloc((size_t)(nt ? nt : 1), sizeof *s->targets);
  if (!s->targets) return st_error_set("out of host memory reading %s", path);
  for (int i = 0; i < nt; i++) {
    const cJSON *e = cJSON_IsArray(tm) ? cJSON_GetArrayItem(tm, i) : tm;
    if (!cJSON_IsString(e)) return bad(path, "target_modules must hold strings");
    snprintf(s->targets[i], sizeof s->targets[i], "%s", e->valuestring);
  }
  s->n_targets = nt;
  return 0;
}

typedef struct {
  int layer;
  char module[ST_PEFT_MODULE_MAX];
  const st_sf_tensor *t[2]; /* lora_A, lora_B */
} pending;

/* name -> (family, layer, module, A or B). 0, or -1 when it is not a LoRA
 * weight of a known module. */
static int parse_name(const char *name, st_arch *arch, int *layer, char *module, int *is_b) {
  const st_arch fams[2] = {ST_ARCH_GPT2, ST_ARCH_LLAMA};
  for (int f = 0; f < 2; f++) {
    const char *pre = st_peft_prefix(fams[f]);
    size_t pl = strlen(pre);
    if (strncmp(name, pre, pl) != 0) continue;
    const char *p = name + pl;
    char *end;
    long l = strtol(p, &end, 10);
    if (end == p || *end != '.' || l < 0 || l > 100000) return -1;
    const char *m = end + 1;
    const char *suffix = NULL;
    const char *sa = strstr(m, ".lora_A.weight"), *sb = strstr(m, ".lora_B.weight");
    if (sa && strcmp(sa, ".lora_A.weight") == 0) suffix = sa, *is_b = 0;
    else if (sb && strcmp(sb, ".lora_B.weight") == 0) suffix = sb, *is_b = 1;
    if (!suffix || (size_t)(suffix - m) >= ST_PEFT_MODULE_MAX) return -1;
    memcpy(module, m, (size_t)(suffix - m));
    module[suffix - m] = 0;
    if (!st_peft_module_known(fams[f], module)) return -1;
    *arch = fams[f];
    *layer = (int)l;
    return 0;
  }
  return -1;
}

static int module_rank(st_arch arch, const char *module) {
  for (int i = 0; i < st_peft_n_modules(arch); i++)
    if (strcmp(st_peft_module_at(arch, i), module) == 0) return i;
  return -1;
}

static st_arch g_sort_arch; /* qsort has no context argument */

static int cmp_pending(const void *x, const void *y) {
  const pending *a = x, *b = y;
  if (a->layer != b->layer) return a->layer < b->layer ? -1 : 1;
  return module_rank(g_sort_arch, a->module) - module_rank(g_sort_arch, b->module);
}

/* The tensors of set -> pend[*np] (paired A and B), s->cfg.arch/dtype. */
static int collect(const char *path, const st_sf_set *set, st_peft_set *s, pending *pend,
                   int *np) {
  int n = 0, have_arch = 0;
  for (int i = 0; i < set->n; i++) {
    const st_sf_tensor *t = &set->t[i];
    st_arch arch;
    int layer, is_b;
    char module[ST_PEFT_MODULE_MAX];
    if (parse_name(t->name, &arch, &layer, module, &is_b))
      return st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor %s is not a lora_A/lora_B weight "
                           "of a GPT-2 or Llama-family attention or MLP projection "
                           "(modules_to_save and embedding adapters are not read)", path,
                           t->name);
    if (have_arch && arch != s->cfg.arch)
      return st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor %s is named for another model "
                           "family than the file's other tensors", path, t->name);
    if (!have_arch) s->cfg.dtype = t->dtype;
    s->cfg.arch = arch;
    have_arch = 1;
    int k = 0;
    while (k < n && !(pend[k].layer == layer && strcmp(pend[k].module, module) == 0)) k++;
    if (k == n) {
      memset(&pend[n], 0, sizeof pend[n]);
      pend[n].layer = layer;
      snprintf(pend[n].module, sizeof pend[n].module, "%s", module);
      n++;
    }
    pend[k].t[is_b] = t;
  }
  const int r = s->cfg.r;
  for (int k = 0; k < n; k++) {
    const st_sf_tensor *a = pend[k].t[0], *b = pend[k].t[1];
    if (!a || !b)
      return st_error_setc(ST_EXIT_CHECKPOINT, "%s: layer %d, %s has a lora_%s weight but no "
                           "lora_%s", path, pend[k].layer, pend[k].module, a ? "A" : "B",
                           a ? "B" : "A");
    if (a->ndim != 2 || b->ndim != 2 || a->shape[0] != r || b->shape[1] != r ||
        a->shape[1] < 1 || b->shape[0] < 1)
      return st_error_setc(ST_EXIT_CHECKPOINT, "%s: layer %d, %s: lora_A must be [r, in] and "
                           "lora_B [out, r] with r = %d (adapter_config.json's)", path,
                           pend[k].layer, pend[k].module, r);
  }
  *np = n;
  return 0;
}

static int read_adapters(const char *path, const st_sf_set *set, st_peft_set *s) {
  pending *pend = calloc(set->n > 0 ? (size_t)set->n : 1, sizeof *pend);
  if (!pend) return st_error_set("out of host memory reading %s", path);
  int n = 0;
  if (collect(path, set, s, pend, &n)) {
    free(pend);
    return -1;
  }
  if (n <= 0) {
    free(pend);
    return bad(path, "holds no LoRA weights");
  }
  g_sort_arch = s->cfg.arch;
  qsort(pend, (size_t)n, sizeof *pend, cmp_pending);
  size_t total = 0;
  for (int k = 0; k < n; k++) total += (size_t)(pend[k].t[0]->numel + pend[k].t[1]->numel);
  s->data = malloc(total * sizeof(float));
  s->ad = calloc((size_t)(unsigned)n, sizeof *s->ad);
  if (!s->data || !s->ad) {
    free(pend);
    return st_error_set("out of host memory reading %s", path);
  }
  int rc = 0;
  float *p = s->data;
  for (int k = 0; k < n && !rc; k++) {
    st_peft_adapter *a = &s->ad[k];
    a->layer = pend[k].layer;
    snprintf(a->module, sizeof a->module, "%s", pend[k].module);
    a->in = (int)pend[k].t[0]->shape[1];
    a->out = (int)pend[k].t[1]->shape[0];
    rc = st_sf_read_f32(set, pend[k].t[0], p);
    a->A = p;
    p += pend[k].t[0]->numel;
    if (!rc) rc = st_sf_read_f32(set, pend[k].t[1], p);
    a->B = p;
    p += pend[k].t[1]->numel;
  }
  s->n = n;
  free(pend);
  return rc;
}

int st_peft_read(const char *dir, st_peft_set *s) {
  memset(s, 0, sizeof *s);
  s->cfg.dtype = ST_FP32;
  char p[1400];
  snprintf(p, sizeof p, "%s/adapter_config.json", dir);
  char *text = st_read_text(p, 1L << 20);
  if (!text)
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: missing or unreadable (not a PEFT adapter "
                         "directory)", p);
  cJSON *j = cJSON_Parse(text);
  free(text);
  int rc = parse_config(p, j, s);
  cJSON_Delete(j);
  if (!rc) {
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
    char bin[1400];
    snprintf(bin, sizeof bin, "%s/adapter_model.bin", dir);
    if (!st_path_exists(p) && st_path_exists(bin))
      rc = st_error_setc(ST_EXIT_CHECKPOINT, "%s is a pickle file; save the adapter with "
                         "safe_serialization=True (adapter_model.safetensors)", bin);
    st_sf_set set;
    memset(&set, 0, sizeof set);
    if (!rc) rc = st_sf_open_file(p, &set);
    if (!rc) rc = read_adapters(p, &set, s);
    st_sf_close(&set);
  }
  if (rc) {
    st_peft_free(s);
    st_error_code(ST_EXIT_CHECKPOINT);
  }
  return rc;
}

void st_peft_free(st_peft_set *s) {
  free(s->ad);
  free(s->data);
  free(s->targets);
  memset(s, 0, sizeof *s);
}
