/* params.c - the flat parameter table and named views (see params.h). */
#include "rank/model/params.h"

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

int st_param_table_build(const st_model_config *cfg, st_param_table *tab) {
  const int64_t C = cfg->n_embd, L = cfg->n_layer;
  memset(tab, 0, sizeof *tab);
  tab->t = calloc((size_t)(4 + 12 * L), sizeof *tab->t);
  if (!tab->t) return st_error_set("out of host memory for the parameter table");
  char nm[ST_MAX_NAME];
  add(tab, "wte.weight", cfg->padded_vocab_size, C, 1);
  add(tab, "wpe.weight", cfg->block_size, C, 1);
  for (int l = 0; l < L; l++) {
#define ADD(suffix, d0, d1, decay)                        \
  snprintf(nm, sizeof nm, "h.%d.%s", l, suffix);          \
  add(tab, nm, d0, d1, decay)
    ADD("ln_1.weight", C, 0, 0);
    ADD("ln_1.bias", C, 0, 0);
    ADD("attn.qkv.weight", 3 * C, C, 1);
    ADD("attn.qkv.bias", 3 * C, 0, 0);
    ADD("attn.proj.weight", C, C, 1);
    ADD("attn.proj.bias", C, 0, 0);
    ADD("ln_2.weight", C, 0, 0);
    ADD("ln_2.bias", C, 0, 0);
    ADD("mlp.fc.weight", 4 * C, C, 1);
    ADD("mlp.fc.bias", 4 * C, 0, 0);
    ADD("mlp.proj.weight", C, 4 * C, 1);
    ADD("mlp.proj.bias", C, 0, 0);
#undef ADD
  }
  add(tab, "ln_f.weight", C, 0, 0);
  add(tab, "ln_f.bias", C, 0, 0);
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

int st_param_views_bind(const st_model_config *cfg, const st_param_table *tab, void *flat,
                        size_t elem_size, st_param_views *v) {
  char *base = flat;
#define AT(off) (void *)(base + (size_t)(off) * elem_size)
  /* The table order is fixed by st_param_table_build: walk it. */
  int i = 0;
  v->h = calloc((size_t)cfg->n_layer, sizeof *v->h);
  if (!v->h) return st_error_set("out of host memory for parameter views");
  v->wte = AT(tab->t[i++].offset);
  v->wpe = AT(tab->t[i++].offset);
  for (int l = 0; l < cfg->n_layer; l++) {
    st_block_params *b = &v->h[l];
    void **slots[12] = {&b->ln1_w, &b->ln1_b, &b->qkv_w, &b->qkv_b,
                         &b->attproj_w, &b->attproj_b, &b->ln2_w, &b->ln2_b,
                         &b->fc_w, &b->fc_b, &b->fcproj_w, &b->fcproj_b};
    for (int k = 0; k < 12; k++) *slots[k] = AT(tab->t[i++].offset);
  }
  v->lnf_w = AT(tab->t[i++].offset);
  v->lnf_b = AT(tab->t[i++].offset);
#undef AT
  return 0;
}

void st_param_views_free(st_param_views *v) {
  free(v->h);
  v->h = NULL;
}
