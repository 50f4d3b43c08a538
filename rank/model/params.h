/* params.h - the parameter table: every named tensor of the model as a slice
 * of one flat fp32 vector.
 *
 * All parameters (and, with the same offsets, gradients and Adam moments)
 * live in one contiguous buffer so that ZeRO partitions, reductions and
 * checkpoints work on byte ranges rather than on tensor lists. Names follow
 * the checkpoint format in DESIGN.md, e.g. "h.3.mlp.fc.weight".
 *
 * Linear weights are stored [out, in] (PyTorch nn.Linear convention).
 */
#ifndef ST_PARAMS_H
#define ST_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "rank/model/config.h"

#define ST_MAX_NAME 64

typedef struct {
  char name[ST_MAX_NAME];
  int ndim;            /* 1 or 2 */
  int64_t shape[2];
  int64_t offset;      /* element offset in the flat vector */
  int64_t numel;
  int decay;           /* 1: AdamW weight decay applies (matrices only) */
} st_tensor;

typedef struct {
  st_tensor *t;
  int n;
  int64_t total;       /* elements in the flat vector */
} st_param_table;

/* Pointers into a flat buffer for one transformer block. void *: the same
 * views address the working weights (storage dtype) and the fp32 gradients. */
typedef struct {
  void *ln1_w, *ln1_b;       /* [C] */
  void *qkv_w, *qkv_b;       /* [3C, C], [3C] */
  void *attproj_w, *attproj_b; /* [C, C], [C] */
  void *ln2_w, *ln2_b;       /* [C] */
  void *fc_w, *fc_b;         /* [4C, C], [4C] */
  void *fcproj_w, *fcproj_b; /* [C, 4C], [C] */
} st_block_params;

typedef struct {
  void *wte;                 /* [Vp, C], tied with the LM head */
  void *wpe;                 /* [block_size, C] */
  st_block_params *h;        /* n_layer entries (malloc'ed) */
  void *lnf_w, *lnf_b;       /* [C] */
} st_param_views;

/* Build the table for a model. 0, or -1 with st_error on allocation failure. */
int st_param_table_build(const st_model_config *cfg, st_param_table *tab);
void st_param_table_free(st_param_table *tab);
/* Index of the tensor with this name, or -1. */
int st_param_find(const st_param_table *tab, const char *name);
/* Resolve named views into a flat buffer laid out by tab whose elements
 * are elem_size bytes (4 for fp32, 2 for bf16/fp16). */
int st_param_views_bind(const st_model_config *cfg, const st_param_table *tab, void *flat,
                        size_t elem_size, st_param_views *v);
void st_param_views_free(st_param_views *v);

#endif
