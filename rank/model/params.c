/* params.c - the flat parameter table and named views (see params.h). */
#include "rank/model/params.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

static void add(st_param_table *tab, const char *name, int64_t d0, int64_t d1, int decay) {
  st_tensor *t = &tab->t[tab->n++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = d1 > 0 ? 2 : 1;
  t->shape[0] = d0;
  t->shape[1] = d1 > 0 ? d1 : 1;
  t->numel = d0 * (d1 > 0 ? d1 : 1);
  t->offset = tab->total;
  t->decay = decay;
  tab->total += t->numel;
}

/* A block's tensors in table order, and where each one's view lives. */
static const struct {
  const char *suffix;
  size_t field; /* offsetof in st_block_params */
} k_block[] = {
    {"ln_1.weight", offsetof(st_block_params, ln1_w)},
    {"ln_1.bias", offsetof(st_block_params, ln1_b)},
    {"attn.qkv.weight", offsetof(st_block_params, qkv_w)},
    {"attn.qkv.bias", offsetof(st_block_params, qkv_b)},
    {"attn.proj.weight", offsetof(st_block_params, attproj_w)},
    {"attn.proj.bias", offsetof(st_block_params, attproj_b)},
    {"ln_2.weight", offsetof(st_block_params, ln2_w)},
    {"ln_2.bias", offsetof(st_block_params, ln2_b)},
    {"mlp.fc.weight", offsetof(st_block_params, fc_w)},
    {"mlp.fc.bias", offsetof(st_block_params, fc_b)},
    {"mlp.proj.weight", offsetof(st_block_params, fcproj_w)},
    {"mlp.proj.bias", offsetof(st_block_params, fcproj_b)},
};
enum { N_BLOCK_SLOTS = sizeof k_block / sizeof k_block[0] };

void st_model_fill_derived(st_model_config *cfg) {
  if (cfg->n_kv_head == 0) cfg->n_kv_head = cfg->n_head;
  if (cfg->ffn_dim == 0) cfg->ffn_dim = 4 * cfg->n_embd;
  if (cfg->norm_eps == 0) cfg->norm_eps = 1e-5f;
  if (cfg->pos == ST_POS_ROPE && cfg->rope_theta == 0) cfg->rope_theta = 10000.0f;
}

int st_param_table_build(const st_model_config *shape, st_param_table *tab) {
  st_model_config d = *shape;
  st_model_fill_derived(&d);
  const st_model_config *cfg = &d;
  const int64_t C = cfg->n_embd, L = cfg->n_layer, F = cfg->ffn_dim;
  const int64_t QKV = st_model_qkv_dim(cfg);
  const int64_t FC = cfg->mlp == ST_MLP_SWIGLU ? 2 * F : F; /* gate | up */
  const int ln = cfg->norm == ST_NORM_LAYERNORM; /* RMSNorm has no bias */
  memset(tab, 0, sizeof *tab);
  tab->t = calloc((size_t)(5 + N_BLOCK_SLOTS * L), sizeof *tab->t);
  if (!tab->t) return st_error_set("out of host memory for the parameter table");
  char nm[ST_MAX_NAME];
  add(tab, "wte.weight", cfg->padded_vocab_size, C, 1);
  if (cfg->pos == ST_POS_LEARNED) add(tab, "wpe.weight", cfg->block_size, C, 1);
  tab->block_first = tab->n;
  for (int l = 0; l < L; l++) {
#define ADD(suffix, d0, d1, decay)                        \
  do {                                                    \
    snprintf(nm, sizeof nm, "h.%d.%s", l, suffix);        \
    add(tab, nm, d0, d1, decay);                          \
  } while (0)
    ADD("ln_1.weight", C, 0, 0);
    if (ln) ADD("ln_1.bias", C, 0, 0);
    ADD("attn.qkv.weight", QKV, C, 1);
    if (!(cfg->no_bias & ST_NO_BIAS_QKV)) ADD("attn.qkv.bias", QKV, 0, 0);
    ADD("attn.proj.weight", C, C, 1);
    if (!(cfg->no_bias & ST_NO_BIAS_PROJ)) ADD("attn.proj.bias", C, 0, 0);
    ADD("ln_2.weight", C, 0, 0);
    if (ln) ADD("ln_2.bias", C, 0, 0);
    ADD("mlp.fc.weight", FC, C, 1);
    if (!(cfg->no_bias & ST_NO_BIAS_MLP)) ADD("mlp.fc.bias", FC, 0, 0);
    ADD("mlp.proj.weight", C, F, 1);
    if (!(cfg->no_bias & ST_NO_BIAS_MLP)) ADD("mlp.proj.bias", C, 0, 0);
#undef ADD
    if (l == 0) tab->block_tensors = tab->n - tab->block_first;
  }
  add(tab, "ln_f.weight", C, 0, 0);
  if (ln) add(tab, "ln_f.bias", C, 0, 0);
  if (cfg->untied) add(tab, "lm_head.weight", cfg->padded_vocab_size, C, 1);
  return 0;
}

void st_param_table_free(st_param_table *tab) {
  free(tab->t);
  memset(tab, 0, sizeof *tab);
}

int st_param_find(const st_param_table *tab, const char *name) {
  for (int i = 0; i < tab->n; i++)
    if (strcmp(tab->t[i].name, name) == 0) return i;
  return -1;
}

void st_param_block_bind(const st_param_table *tab, int l, void *buf, int64_t first,
                         size_t elem_size, st_block_params *b) {
  memset(b, 0, sizeof *b);
  const int i0 = tab->block_first + l * tab->block_tensors;
  for (int i = i0; i < i0 + tab->block_tensors; i++) {
    const char *suffix = strchr(tab->t[i].name + 2, '.') + 1; /* past "h.<l>." */
    for (int k = 0; k < N_BLOCK_SLOTS; k++)
      if (strcmp(suffix, k_block[k].suffix) == 0)
        *(void **)((char *)b + k_block[k].field) =
            (char *)buf + (size_t)(tab->t[i].offset - first) * elem_size;
  }
}

int st_param_views_bind(const st_model_config *cfg, const st_param_table *tab, void *flat,
                        size_t elem_size, st_param_views *v) {
  memset(v, 0, sizeof *v);
  v->h = calloc((size_t)(cfg->n_layer > 0 ? cfg->n_layer : 1), sizeof *v->h);
  if (!v->h) return st_error_set("out of host memory for parameter views");
  for (int l = 0; l < cfg->n_layer; l++) st_param_block_bind(tab, l, flat, 0, elem_size, &v->h[l]);
  const struct {
    const char *name;
    void **view;
  } head[] = {{"wte.weight", &v->wte},   {"wpe.weight", &v->wpe}, {"ln_f.weight", &v->lnf_w},
              {"ln_f.bias", &v->lnf_b}, {"lm_head.weight", &v->lm_head}};
  for (size_t k = 0; k < sizeof head / sizeof head[0]; k++) {
    const int i = st_param_find(tab, head[k].name);
    *head[k].view = i < 0 ? NULL : (char *)flat + (size_t)tab->t[i].offset * elem_size;
  }
  return 0;
}

void st_param_views_free(st_param_views *v) {
  free(v->h);
  v->h = NULL;
}
