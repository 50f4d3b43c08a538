/* infer.h - inference over the op table with a KV cache: the forward
 * of rank/model/model.c for new positions only, each block's keys and values kept
 * for every position seen so far, so each generated token costs one
 * position, not a re-run of the prefix (sample uses it; eval uses
 * st_model_forward, which has no cache to keep).
 *
 * One sequence (B = 1), every architecture the description gives. The same
 * ops as training's forward, in the same order (encoder, norm, QKV matmul,
 * RoPE at the cache position, attention, projection, residual, norm, fused
 * matmul+GELU or matmul+SwiGLU, projection, residual; ln_f and the LM
 * head), except attention, which is attention_decode over the cache (GQA:
 * n_kv_head heads cached); the LM head runs on the last new row only. Everything lives in the memory of
 * `ops` (host for CPU, device for CUDA), in its storage dtype.
 */
#ifndef ST_INFER_H
#define ST_INFER_H

#include <stdint.h>

#include "kernels/ops.h"
#include "rank/model/config.h"
#include "rank/model/params.h"

typedef struct {
  st_model_config cfg;
  const st_ops *ops;
  st_param_table tab;
  st_param_views p;   /* into params */
  size_t es;          /* bytes per element of the storage dtype */
  void *params;       /* tab.total elements, storage dtype */
  int max_pos;        /* positions the cache holds: cfg.block_size */
  int max_rows;       /* most new positions one step takes (the prefill) */
  int pos;            /* positions in the cache now */
  void **kc, **vc;    /* per layer [max_pos, n_kv_head * head_dim] keys and values */
  void *mem;          /* one allocation for the buffers below and the cache */
  void *x;            /* [max_rows, C] residual stream */
  /* [max_rows, C | QKV | C | C | F or 2F (SwiGLU's gate | up) | F] */
  void *ln, *qkv, *atty, *tmp, *fch, *fch_act;
  float *mean, *rstd; /* [max_rows] norm statistics (not needed after) */
  float *rope_cs;     /* RoPE: [max_pos, head_dim] fp32 cos | sin; else NULL */
  void *lnf;          /* [C] ln_f of the last row */
  void *logits;       /* [padded_vocab_size], storage dtype */
  int *tokens;        /* [max_rows] token ids in backend memory */
  void *logits_stage; /* host [padded_vocab_size] storage dtype (NULL for fp32) */
} st_infer;

/* Build the parameter table, allocate the weights, a KV cache of
 * cfg->block_size positions (and RoPE's table for them) and buffers for steps of up to max_rows new
 * positions, all in the memory of ops. cfg must be validated. 0, or -1 with
 * st_error (memory class) naming the bytes. */
int st_infer_init(st_infer *m, const st_model_config *cfg, const st_ops *ops, int max_rows);
/* Set the weights from host fp32 values host[tab.total] (the layout of
 * st_param_table_build), rounded to the storage dtype. 0, or -1. */
int st_infer_set_weights(st_infer *m, const float *host);
/* Forget the cached positions (a new sequence). */
void st_infer_reset(st_infer *m);
/* Run n_new tokens (host ids in [0, vocab_size)) at positions pos ..
 * pos+n_new-1, append their keys and values to the cache, and write the
 * logits of the last one to logits[padded_vocab_size] (host, fp32; the
 * padded columns are whatever the zero rows give and must not be sampled).
 * 1 <= n_new <= max_rows and pos + n_new <= block_size, else -1 with
 * st_error (usage class). */
int st_infer_step(st_infer *m, const int *tokens, int n_new, float *logits);
void st_infer_free(st_infer *m);

#endif
