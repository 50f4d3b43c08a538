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
  /* Blocks are one contiguous run of tensors: block l's are t[block_first +
   * l * block_tensors ..], block_tensors of them, the same for every block
   * (which ones depends on the description: biases, LayerNorm or RMSNorm). */
  int block_first, block_tensors;
} st_param_table;

/* Pointers into a flat buffer for one transformer block. void *: the same
 * views address the working weights (storage dtype) and the fp32 gradients.
 * Shapes with QKV = (n_head + 2 n_kv_head) * head_dim and F = ffn_dim; a
 * tensor the description does not have is NULL (biases under no_bias, the
 * norms' biases under RMSNorm). */
typedef struct {
  void *ln1_w, *ln1_b;       /* [C] */
  void *qkv_w, *qkv_b;       /* [QKV, C], [QKV] */
  void *attproj_w, *attproj_b; /* [C, C], [C] */
  void *ln2_w, *ln2_b;       /* [C] */
  void *fc_w, *fc_b;         /* GELU [F, C], [F]; SwiGLU [2F, C], [2F] (gate rows, then up) */
  void *fcproj_w, *fcproj_b; /* [C, F], [C] */
} st_block_params;

typedef struct {
  void *wte;                 /* [Vp, C]; the LM head too unless untied */
  void *wpe;                 /* [block_size, C]; NULL with rotary positions */
  st_block_params *h;        /* n_layer entries (malloc'ed) */
  void *lnf_w, *lnf_b;       /* [C]; lnf_b NULL under RMSNorm */
  void *lm_head;             /* [Vp, C] untied head; NULL when tied to wte */
} st_param_views;

/* Fill the derived zero fields of cfg as st_model_validate does
 * (n_kv_head = n_head, ffn_dim = 4 n_embd, norm_eps = 1e-5, and with RoPE
 * rope_theta = 10000), checking nothing: the table, the schedule and inference take a
 * shape that was not validated (a GPT-2 config that sets only the shape and
 * padded_vocab_size) and mean by it what st_model_validate would. */
void st_model_fill_derived(st_model_config *cfg);

/* Build the table for a model from its description, in the order and
 * with the names of DESIGN.md's checkpoint format: wte, wpe (learned
 * positions), per block ln_1, attn.qkv, attn.proj, ln_2, mlp.fc, mlp.proj
 * (weights, and biases where the description has them), ln_f, lm_head
 * (untied); derived zero fields as st_model_fill_derived. 0, or -1 with st_error on allocation
 * failure. */
int st_param_table_build(const st_model_config *cfg, st_param_table *tab);
void st_param_table_free(st_param_table *tab);
/* Index of the tensor with this name, or -1. */
int st_param_find(const st_param_table *tab, const char *name);
/* Resolve named views into a flat buffer laid out by tab whose elements
 * are elem_size bytes (4 for fp32, 2 for bf16/fp16). Absent tensors get
 * NULL. 0, or -1 with st_error (out of host memory). */
int st_param_views_bind(const st_model_config *cfg, const st_param_table *tab, void *flat,
                        size_t elem_size, st_param_views *v);
/* Point block l's views into buf, which holds the flat elements from
 * element `first` on (buf is element `first`): ZeRO 2's one-block gradient
 * buckets use first = block l's first offset. */
void st_param_block_bind(const st_param_table *tab, int l, void *buf, int64_t first,
                         size_t elem_size, st_block_params *b);
void st_param_views_free(st_param_views *v);

#endif
