/* model.h - GPT-2 forward and backward schedule over the op table.
 *
 * Holds the flat parameter and gradient vectors (padded to a multiple of
 * the ZeRO world size), activations for one micro-batch of B x T, and the
 * order in which ops run. It knows nothing of ranks or optimizers.
 */
#ifndef ST_MODEL_H
#define ST_MODEL_H

#include <stdint.h>

#include "kernels/ops.h"
#include "rank/config.h"
#include "rank/params.h"
#include "rank/rng.h"

typedef struct {
  float *ln1, *ln1_mean, *ln1_rstd; /* [B,T,C], [B,T], [B,T] */
  float *qkv;                       /* [B,T,3C] */
  float *atty;                      /* [B,T,C] attention output */
  float *att;                       /* [B,NH,T,T] softmax (CPU reference) */
  float *attproj;                   /* [B,T,C] */
  float *residual2;                 /* [B,T,C] */
  float *ln2, *ln2_mean, *ln2_rstd;
  float *fch, *fch_gelu;            /* [B,T,4C] */
  float *fcproj;                    /* [B,T,C] */
  float *residual3;                 /* [B,T,C] block output */
} st_block_acts;

typedef struct {
  st_model_config cfg;
  st_param_table tab;
  const st_ops *ops;
  int64_t padded_total;   /* length of params/grads (>= tab.total) */
  float *params, *grads;  /* flat, padded_total elements; grads is NULL when bucketed */
  /* ZeRO 2 (st_model_use_grad_buckets): block l's gradients live in
   * bucket[l % 2] only while its backward runs; the head tensors' (wte, wpe,
   * ln_f) live in head_grads. */
  float *head_grads, *bucket[2];
  int64_t block_begin, block_numel; /* flat range of block 0, size of one block */
  st_param_views p, g;
  int B, T;               /* activation capacity */
  float *act_mem;         /* one allocation for everything below */
  float *encoded;         /* [B,T,C] */
  st_block_acts *blk;
  float *lnf, *lnf_mean, *lnf_rstd;
  float *logits;          /* [B,T,Vp]; holds dlogits after a training forward */
  float *losses;          /* [B,T] */
  float *losses_host;     /* [B,T] host copy for the loss sum */
  /* backward scratch, reused by every layer */
  float *dres, *dln, *dqkv, *datty, *datt, *dfch, *dfch_gelu;
} st_model;

/* Build the parameter table and allocate parameters, gradients (padded to a
 * multiple of pad_multiple elements) and activations for micro-batch B x T,
 * all in the memory of `ops` (host for CPU, device for CUDA). Pointers passed
 * to forward/backward (inp, targets) must live in that memory too.
 * 0, or -1 with st_error (names the bytes that could not be allocated). */
int st_model_init(st_model *m, const st_model_config *cfg, const st_ops *ops, int B, int T,
                  int pad_multiple);
void st_model_free(st_model *m);

/* GPT-2 initialisation (Radford et al. 2019 / nanoGPT): weights N(0, 0.02),
 * residual output projections N(0, 0.02/sqrt(2L)), biases 0, LayerNorm
 * gain 1; padded vocabulary rows 0. Deterministic in the rng's state; drawn
 * on the host and copied to the backend's memory. 0, or -1 with st_error. */
int st_model_init_weights(st_model *m, st_rng *rng);

/* Forward over inp[B,T] (token ids < vocab_size) with targets[B,T]. Returns
 * the SUM of per-token losses (double). When dloss > 0 the gradient of the
 * logits, scaled by dloss, is left in m->logits for st_model_backward. */
double st_model_forward(st_model *m, const int *inp, const int *targets, int B, int T,
                        float dloss);
/* Backward of the last training forward; ACCUMULATES into m->grads. */
void st_model_backward(st_model *m, const int *inp, int B, int T);

/* Called when a flat range [begin, end) of gradients is final for this
 * backward: grads points at element `begin`, in the backend's memory. */
typedef void (*st_grads_ready_fn)(void *ctx, const float *grads, int64_t begin, int64_t end);

/* ZeRO 2: stop keeping a full gradient vector. Frees m->grads and allocates
 * head_grads (wte, wpe, ln_f) plus two one-block buckets. Afterwards use
 * st_model_backward_bucketed. 0, or -1 with st_error. */
int st_model_use_grad_buckets(st_model *m);

/* Backward with gradient buckets: after block l's backward, ready(ctx,
 * bucket, range of block l) is called, then the bucket is zeroed for block
 * l-2; after the embedding backward, ready() is called for the head ranges
 * [0, block_begin) and [ln_f, total). The callback typically reduce-scatters
 * the range; nothing of it is kept after it returns. */
void st_model_backward_bucketed(st_model *m, const int *inp, int B, int T,
                                st_grads_ready_fn ready, void *ctx);
/* Zero the gradient vector. */
void st_model_zero_grad(st_model *m);

#endif
