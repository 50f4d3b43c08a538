/* model.c - the order of ops in forward and backward, for the architecture
 * st_model_config describes (where each activation lives: model_layout.c).
 * Pre-norm blocks:
 *   x = x + proj(attn(rope(qkv(norm_1(x)))));  x = x + mlp.proj(act(mlp.fc(norm_2(x))))
 * then norm_f and the LM head. GPT-2 (Radford et al. 2019): LayerNorm,
 * learned positions added by the encoder (no rope), GELU, the head tied to
 * wte. Llama (Touvron et al. 2023) / Qwen2: RMSNorm, RoPE on q and k, GQA,
 * SwiGLU (act(gate | up) = silu(gate) * up), the head tied or its own. */
#include "rank/model/model_internal.h"
#include "rank/model/model_lora.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

/* The weight of projection P (st_lora_proj) of block l for the GEMMs: the
 * storage-dtype view, or under QLoRA the NF4 weight dequantised into
 * nf4_scratch (kept there until another projection needs the scratch, so
 * the backward right after a forward of the same weight reuses it). */
const void *st_model_proj_w(st_model *m, int l, int P) {
  if (!m->nf4) {
    const st_block_params *w = &m->p.h[l];
    const void *const v[4] = {w->qkv_w, w->attproj_w, w->fc_w, w->fcproj_w};
    return v[P];
  }
  if (m->nf4_held != 4 * l + P) {
    m->ops->nf4_dequantize(m->nf4_scratch, &m->nf4[4 * l + P]);
    m->nf4_held = 4 * l + P;
  }
  return m->nf4_scratch;
}

void st_model_weights_settle(st_model *m) {
  for (int s = 0; s < 2; s++)
    if (m->wpending[s]) {
      m->gather.wait(m->gather.ctx, s);
      m->wpending[s] = 0;
    }
}

void st_model_weights_changed(st_model *m) { m->wheld[0] = m->wheld[1] = -1; }

/* ZeRO 3, before block l runs: its weights in wbuf[l % 2] (filled now
 * unless already there or on the way), then the fill of block `next`
 * started into the other buffer, so it overlaps block l's compute. next
 * outside [0, n_layer): nothing to prefetch. */
static void block_weights(st_model *m, int l, int next) {
  if (!m->shard_params) return;
  const st_weight_gather *g = &m->gather;
  const int s = l % 2;
  if (m->wheld[s] != l) {
    if (m->wpending[s]) g->wait(g->ctx, s);
    g->start(g->ctx, l, m->wbuf[s], s);
    m->wheld[s] = l;
    m->wpending[s] = 1;
  }
  if (m->wpending[s]) {
    g->wait(g->ctx, s);
    m->wpending[s] = 0;
  }
  if (next < 0 || next >= m->cfg.n_layer) return;
  const int ns = next % 2;
  if (m->wheld[ns] == next) return;
  if (m->wpending[ns]) g->wait(g->ctx, ns);
  g->start(g->ctx, next, m->wbuf[ns], ns);
  m->wheld[ns] = next;
  m->wpending[ns] = 1;
}

void st_model_zero_grad(st_model *m) {
  if (!m->head_grads) {
    m->ops->zero(m->grads, (size_t)m->padded_total * sizeof(float));
    return;
  }
  /* the buckets are zeroed by backward itself, block by block */
  m->ops->zero(m->head_grads, (size_t)head_numel(m) * sizeof(float));
}

/* norm(x) of N rows by the description's norm: LayerNorm (mean, rstd
 * saved) or RMSNorm (rstd saved; mean and b unused, NULL). */
static void norm_forward(const st_model *m, void *out, float *mean, float *rstd, const void *x,
                         const void *w, const void *b, int N) {
  if (m->cfg.norm == ST_NORM_LAYERNORM)
    m->ops->layernorm_forward(out, mean, rstd, x, w, b, N, m->cfg.n_embd);
  else
    m->ops->rmsnorm_forward(out, rstd, x, w, N, m->cfg.n_embd, m->cfg.norm_eps);
}

/* Backward of norm_forward; dx ACCUMULATES (the residual stream). */
static void norm_backward(const st_model *m, void *dx, float *dw, float *db, const void *dout,
                          const void *x, const void *w, const float *mean, const float *rstd,
                          int N) {
  if (m->cfg.norm == ST_NORM_LAYERNORM)
    m->ops->layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, m->cfg.n_embd);
  else
    m->ops->rmsnorm_backward(dx, dw, dout, x, w, rstd, N, m->cfg.n_embd);
}

/* The adapter path (lora_forward, lora_backward): rank/model/model_lora.c. */

/* Block l's forward from its input x: the one definition that forward and
 * full recompute share, so a recomputed block is bit-identical. A recompute
 * stops before the down projection: backward never reads its output, and the
 * block's output (residual3) is the next block's kept input, already there.
 * That GEMM is a quarter of a Llama block's FLOPs (a third of GPT-2's). */
static void block_forward(st_model *m, int l, const void *x, int B, int T, int recompute) {
  const st_ops *op = m->ops;
  const dims d = dims_of(&m->cfg);
  const int C = d.C, BT = B * T;
  st_block_acts *a = &m->blk[l];
  const st_block_params *w = &m->p.h[l];
  norm_forward(m, a->ln1, a->ln1_mean, a->ln1_rstd, x, w->ln1_w, w->ln1_b, BT);
  op->matmul_forward(a->qkv, a->ln1, st_model_proj_w(m, l, 0), w->qkv_b, BT, C, d.QKV);
  st_model_lora_forward(m, l, ST_LORA_PROJ_QKV, a->qkv, a->ln1, BT);
  if (d.rope) op->rope_forward(a->qkv, m->rope_cs, B, T, 0, d.NH, d.NKV, d.HD);
  op->attention_forward(a->atty, a->att, a->qkv, B, T, C, d.NH, d.NKV);
  /* The two projections write into the residual stream directly (their
   * outputs are read by nothing else); an adapter's delta is added there. */
  op->matmul_residual_forward(a->residual2, a->atty, st_model_proj_w(m, l, 1), w->attproj_b, x,
                              BT, C, C);
  st_model_lora_forward(m, l, ST_LORA_PROJ_ATTN, a->residual2, a->atty, BT);
  norm_forward(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->residual2, w->ln2_w, w->ln2_b, BT);
  if (d.swiglu) {
    op->matmul_forward(a->fch, a->ln2, st_model_proj_w(m, l, 2), w->fc_b, BT, C, d.FC);
    st_model_lora_forward(m, l, ST_LORA_PROJ_FC, a->fch, a->ln2, BT);
    op->swiglu_forward(a->fch_act, a->fch, BT, d.F);
  } else if (m->recompute == ST_RECOMPUTE_ACT || m->recompute == ST_RECOMPUTE_SELECTIVE ||
             lora_gelu_split(m)) {
    /* act and selective recompute rebuild the GELU output from the stored
     * (rounded) fch with gelu_forward; forward must produce it the same way, not in
     * the GEMM epilogue from the unrounded sum, or backward would see other
     * values than the loss was computed with. */
    op->matmul_forward(a->fch, a->ln2, st_model_proj_w(m, l, 2), w->fc_b, BT, C, d.F);
    st_model_lora_forward(m, l, ST_LORA_PROJ_FC, a->fch, a->ln2, BT);
    op->gelu_forward(a->fch_act, a->fch, (int64_t)BT * d.F);
  } else {
    op->matmul_gelu_forward(a->fch_act, a->fch, a->ln2, st_model_proj_w(m, l, 2), w->fc_b, BT, C, d.F);
  }
  if (recompute) return; /* an adapter's A x (lora_u) is kept under every policy */
  op->matmul_residual_forward(a->residual3, a->fch_act, st_model_proj_w(m, l, 3), w->fcproj_b,
                              a->residual2, BT, d.F, C);
  st_model_lora_forward(m, l, ST_LORA_PROJ_MLP, a->residual3, a->fch_act, BT);
}

/* Rebuild what the recompute policy did not keep for block l's backward:
 * full reruns the block from its input up to the down projection;
 * selective reruns the two norms and the MLP activation (GELU or SwiGLU),
 * whose inputs were kept; act reruns only the MLP activation. */
static void block_recompute(st_model *m, int l, const void *x, int B, int T) {
  const st_ops *op = m->ops;
  const dims d = dims_of(&m->cfg);
  const int BT = B * T;
  st_block_acts *a = &m->blk[l];
  const st_block_params *w = &m->p.h[l];
  if (m->recompute == ST_RECOMPUTE_NONE) return;
  if (m->recompute == ST_RECOMPUTE_FULL) {
    block_forward(m, l, x, B, T, 1);
    return;
  }
  if (m->recompute == ST_RECOMPUTE_SELECTIVE) {
    norm_forward(m, a->ln1, a->ln1_mean, a->ln1_rstd, x, w->ln1_w, w->ln1_b, BT);
    norm_forward(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->residual2, w->ln2_w, w->ln2_b, BT);
  }
  /* act and selective: the MLP activation's output from its saved input */
  if (d.swiglu)
    op->swiglu_forward(a->fch_act, a->fch, BT, d.F);
  else
    op->gelu_forward(a->fch_act, a->fch, (int64_t)BT * d.F);
}

/* The LM head's weight: lm_head when untied, else wte. */
static const void *head_weight(const st_param_views *v) { return v->lm_head ? v->lm_head : v->wte; }

/* Everything before the LM head: embedding, blocks, ln_f into m->lnf. */
static void forward_trunk(st_model *m, const int *inp, int B, int T) {
  const st_model_config *c = &m->cfg;
  m->ops->encoder_forward(m->encoded, inp, m->p.wte, m->p.wpe, B, T, c->n_embd);
  const void *x = m->encoded;
  for (int l = 0; l < c->n_layer; l++) {
    block_weights(m, l, l + 1);
    block_forward(m, l, x, B, T, 0);
    x = m->blk[l].residual3;
  }
  norm_forward(m, m->lnf, m->lnf_mean, m->lnf_rstd, x, m->p.lnf_w, m->p.lnf_b, B * T);
}

double st_model_forward(st_model *m, const int *inp, const int *targets, int B, int T,
                        float dloss) {
  const st_ops *op = m->ops;
  const st_model_config *c = &m->cfg;
  const int C = c->n_embd, BT = B * T, Vp = c->padded_vocab_size, R = m->head_rows;
  forward_trunk(m, inp, B, T);
  /* LM head, R rows at a time (st_model_head_rows): logits = lnf @ W^T, the
   * cross-entropy's loss and (training) dlogits in place, then at once the
   * head's backward for those rows, so a chunk's logits are dead before the
   * next chunk's are made. dln (backward scratch, unused by forward) keeps
   * d(lnf) for backward's ln_f step. Tied (W = wte), dwte gets the head's
   * share here and the embedding's share in encoder_backward. */
  const void *W = head_weight(&m->p);
  float *dW = m->g.lm_head ? m->g.lm_head : m->g.wte;
  for (int r0 = 0; r0 < BT; r0 += R) {
    const int n = BT - r0 < R ? BT - r0 : R;
    const void *lnf = (const char *)m->lnf + (size_t)r0 * C * m->es;
    op->matmul_forward(m->logits, lnf, W, NULL, n, C, Vp);
    op->softmax_crossentropy(m->losses + r0, dloss > 0 ? m->logits : NULL, m->logits,
                             targets + r0, dloss, n, c->vocab_size, Vp);
    if (dloss > 0)
      op->matmul_backward((char *)m->dln + (size_t)r0 * C * m->es, dW, NULL, m->logits, lnf, W,
                          n, C, Vp);
  }
  m->ops->to_host(m->losses_host, m->losses, (size_t)BT * sizeof(float));
  double sum = 0.0;
  for (int i = 0; i < BT; i++) sum += m->losses_host[i];
  return sum;
}

int st_model_logits(st_model *m, const int *inp, int B, int T, float *host_out) {
  const st_model_config *c = &m->cfg;
  const int C = c->n_embd, BT = B * T, Vp = c->padded_vocab_size, R = m->head_rows;
  void *stage = m->es == sizeof(float) ? NULL : malloc((size_t)R * Vp * m->es);
  if (m->es != sizeof(float) && !stage)
    return st_error_set("cannot allocate %zu bytes of host memory to convert the logits",
                        (size_t)R * Vp * m->es);
  forward_trunk(m, inp, B, T);
  for (int r0 = 0; r0 < BT; r0 += R) {
    const int n = BT - r0 < R ? BT - r0 : R;
    float *out = host_out + (size_t)r0 * Vp;
    m->ops->matmul_forward(m->logits, (const char *)m->lnf + (size_t)r0 * C * m->es,
                           head_weight(&m->p), NULL, n, C, Vp);
    m->ops->to_host(stage ? stage : out, m->logits, (size_t)n * Vp * m->es);
    if (stage) st_dtype_to_f32(m->ops->dtype, out, stage, (size_t)n * Vp);
  }
  free(stage);
  return 0;
}

static void backward(st_model *m, const int *inp, int B, int T, const st_grad_hooks *h);

void st_model_backward(st_model *m, const int *inp, int B, int T) { backward(m, inp, B, T, NULL); }

void st_model_backward_hooked(st_model *m, const int *inp, int B, int T,
                              const st_grad_hooks *hooks) {
  backward(m, inp, B, T, hooks);
}

void st_model_grad_ranges(const st_model *m, void (*fn)(void *ctx, int64_t begin, int64_t end,
                                                        int slot), void *ctx) {
  for (int l = m->cfg.n_layer - 1; l >= 0; l--) {
    const int64_t b0 = m->block_begin + (int64_t)l * m->block_numel;
    fn(ctx, b0, b0 + m->block_numel, l % 2);
  }
  const int64_t lnf = lnf_begin(m);
  fn(ctx, 0, m->block_begin, 2);
  fn(ctx, lnf, m->tab.total, 3);
}

/* h == NULL: gradients accumulate in m->grads. Otherwise ranges are handed
 * to h->ready as they become final; with buckets (m->head_grads) block l
 * uses bucket[l % 2], zeroed after h->reuse. */
static void backward(st_model *m, const int *inp, int B, int T, const st_grad_hooks *h) {
  const st_ops *op = m->ops;
#define zero(x, n) op->zero((x), (size_t)(n) * m->es)
  const st_model_config *c = &m->cfg;
  const dims d = dims_of(c);
  const int C = d.C, BT = B * T;
  const int64_t BTC = (int64_t)BT * C;
  st_param_views *g = &m->g;

  /* The LM head's backward ran chunk by chunk in the training forward,
   * which left d(lnf) in dln; nothing before ln_f's backward writes dln. */
  zero(m->dres, BTC);
  const void *xlast = c->n_layer > 0 ? m->blk[c->n_layer - 1].residual3 : m->encoded;
  norm_backward(m, m->dres, g->lnf_w, g->lnf_b, m->dln, xlast, m->p.lnf_w, m->lnf_mean,
                m->lnf_rstd, BT);

  /* dres carries d(block output); each residual add passes it through to both
   * branches, so the branches' input gradients accumulate into it. */
  for (int l = c->n_layer - 1; l >= 0; l--) {
    st_block_acts *a = &m->blk[l];
    const st_block_params *w = &m->p.h[l];
    st_block_params *gw = &g->h[l];
    const void *x = l == 0 ? m->encoded : m->blk[l - 1].residual3;
    block_weights(m, l, l - 1); /* ZeRO 3; the last forward block is still there */
    if (m->head_grads) {
      if (h && h->reuse) h->reuse(h->ctx, l % 2);
      (op->zero)(m->bucket[l % 2], (size_t)m->block_numel * sizeof(float));
      if (!lora_on(m)) bind_block_grads(m, l, m->bucket[l % 2]);
    }
    block_recompute(m, l, x, B, T);

    if (d.swiglu) {
      op->matmul_backward(m->dfact, gw->fcproj_w, gw->fcproj_b, m->dres, a->fch_act,
                          st_model_proj_w(m, l, 3), BT, d.F, C);
      st_model_lora_backward(m, l, ST_LORA_PROJ_MLP, m->dres, m->dfact, a->fch_act, BT);
      op->swiglu_backward(m->dfch, m->dfact, a->fch, BT, d.F);
    } else if (lora_has(m, ST_LORA_DOWN)) {
      /* the adapter's share of d(fch_act) joins before the GELU's backward */
      op->matmul_backward(m->dfact, gw->fcproj_w, gw->fcproj_b, m->dres, a->fch_act,
                          st_model_proj_w(m, l, 3), BT, d.F, C);
      st_model_lora_backward(m, l, ST_LORA_PROJ_MLP, m->dres, m->dfact, a->fch_act, BT);
      op->gelu_backward(m->dfch, a->fch, m->dfact, (int64_t)BT * d.F);
    } else {
      op->matmul_backward_gelu(m->dfch, gw->fcproj_w, gw->fcproj_b, m->dres, a->fch_act,
                               st_model_proj_w(m, l, 3), a->fch, BT, d.F, C);
    }
    op->matmul_backward(m->dln, gw->fc_w, gw->fc_b, m->dfch, a->ln2, st_model_proj_w(m, l, 2), BT, C,
                        d.FC);
    st_model_lora_backward(m, l, ST_LORA_PROJ_FC, m->dfch, m->dln, a->ln2, BT);
    norm_backward(m, m->dres, gw->ln2_w, gw->ln2_b, m->dln, a->residual2, w->ln2_w, a->ln2_mean,
                  a->ln2_rstd, BT);

    op->matmul_backward(m->datty, gw->attproj_w, gw->attproj_b, m->dres, a->atty,
                        st_model_proj_w(m, l, 1), BT, C, C);
    st_model_lora_backward(m, l, ST_LORA_PROJ_ATTN, m->dres, m->datty, a->atty, BT);
    op->attention_backward(m->dqkv, m->datt, m->datty, a->qkv, a->atty, a->att, B, T, C, d.NH,
                           d.NKV);
    if (d.rope) op->rope_backward(m->dqkv, m->rope_cs, B, T, d.NH, d.NKV, d.HD);
    op->matmul_backward(m->dln, gw->qkv_w, gw->qkv_b, m->dqkv, a->ln1, st_model_proj_w(m, l, 0), BT, C,
                        d.QKV);
    st_model_lora_backward(m, l, ST_LORA_PROJ_QKV, m->dqkv, m->dln, a->ln1, BT);
    norm_backward(m, m->dres, gw->ln1_w, gw->ln1_b, m->dln, x, w->ln1_w, a->ln1_mean,
                  a->ln1_rstd, BT);
    if (h) {
      const int64_t b0 = m->block_begin + (int64_t)l * m->block_numel;
      const float *src = m->head_grads ? m->bucket[l % 2] : m->grads + b0;
      h->ready(h->ctx, src, b0, b0 + m->block_numel, l % 2);
    }
  }
  /* dfch is dead once block 0's MLP backward is done: the encoder's sort
   * scratch (model_layout.c carves it 256-byte aligned) */
  if (!lora_on(m))
    op->encoder_backward(g->wte, g->wpe, m->dres, inp, B, T, C, m->dfch,
                         (size_t)BT * d.FC * m->es);
  if (h) {
    const int64_t lnf = lnf_begin(m);
    const float *head = m->head_grads ? m->head_grads : m->grads;
    h->ready(h->ctx, head, 0, m->block_begin, 2);
    h->ready(h->ctx, head + (m->head_grads ? m->block_begin : lnf), lnf, m->tab.total, 3);
  }
#undef zero
}
