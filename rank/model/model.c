/* model.c - GPT-2 (Radford et al. 2019): the order of ops in forward and
 * backward, and where each activation lives. Pre-LayerNorm blocks:
 *   x = x + proj(attn(ln_1(x)));  x = x + mlp.proj(gelu(mlp.fc(ln_2(x))))
 * then ln_f and an LM head tied to the token embedding. */
#include "rank/model/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

/* Carves buffers out of one allocation. With base == NULL it only
 * measures, so sizing and layout come from the same code. Each take's
 * alignment padding is counted with the part it precedes, so the parts add
 * up to the whole. */
enum { P_EMBED, P_BLOCKS, P_RECOMPUTE, P_ATTENTION, P_HEAD, P_LOGITS, P_GRADS, P_N };
typedef struct {
  char *base;
  size_t off;
  size_t part[P_N];
} carver;

static void *take(carver *cv, int64_t n, size_t elem, int part) {
  const size_t start = cv->off;
  cv->off = (cv->off + 255) & ~(size_t)255; /* vector loads and cuBLASLt like alignment */
  void *p = cv->base ? cv->base + cv->off : NULL;
  cv->off += (size_t)n * elem;
  cv->part[part] += cv->off - start;
  return p;
}

/* The activation layout of m (cfg, es, B, T, recompute) with natt floats of
 * attention state per layer. m->blk may be NULL when only measuring. */
static void layout_acts(st_model *m, int64_t natt, carver *cv) {
  const st_model_config *c = &m->cfg;
  const int64_t BT = (int64_t)m->B * m->T, C = c->n_embd;
  const size_t es = m->es, f4 = sizeof(float);
  m->encoded = take(cv, BT * C, es, P_EMBED);
  /* Recompute: what backward rebuilds lives once, in the shared block
   * blk[n_layer], instead of once per layer. selective shares the LayerNorm
   * and GELU outputs; full shares everything but the block output, which is
   * the next block's input. X(field, elements, element size, shared?, part
   * when kept per layer) */
  const int sel = m->recompute != ST_RECOMPUTE_NONE, full = m->recompute == ST_RECOMPUTE_FULL;
#define BLOCK_FIELDS(X)                                                                      \
  X(ln1, BT * C, es, sel, P_BLOCKS) X(ln1_mean, BT, f4, full, P_BLOCKS)                         \
  X(ln1_rstd, BT, f4, full, P_BLOCKS) X(qkv, BT * 3 * C, es, full, P_BLOCKS)                    \
  X(atty, BT * C, es, full, P_BLOCKS) X(att, natt, f4, full, P_ATTENTION)                       \
  X(attproj, BT * C, es, full, P_BLOCKS) X(residual2, BT * C, es, full, P_BLOCKS)               \
  X(ln2, BT * C, es, sel, P_BLOCKS) X(ln2_mean, BT, f4, full, P_BLOCKS)                         \
  X(ln2_rstd, BT, f4, full, P_BLOCKS) X(fch, BT * 4 * C, es, full, P_BLOCKS)                    \
  X(fch_gelu, BT * 4 * C, es, sel, P_BLOCKS) X(fcproj, BT * C, es, full, P_BLOCKS)
#define SHARED_PART(part) ((part) == P_ATTENTION ? P_ATTENTION : P_RECOMPUTE)
#define SHARE(f, n, e, shared, part) sh->f = (shared) ? take(cv, n, e, SHARED_PART(part)) : NULL;
#define PICK(f, n, e, shared, part) a->f = (shared) ? sh->f : take(cv, n, e, part);
  st_block_acts measured[2]; /* stand-ins for blk[] when only measuring */
  st_block_acts *sh = m->blk ? &m->blk[c->n_layer] : &measured[0];
  BLOCK_FIELDS(SHARE)
  for (int l = 0; l < c->n_layer; l++) {
    st_block_acts *a = m->blk ? &m->blk[l] : &measured[1];
    BLOCK_FIELDS(PICK)
    a->residual3 = take(cv, BT * C, es, P_BLOCKS);
  }
#undef PICK
#undef SHARE
#undef SHARED_PART
#undef BLOCK_FIELDS
  m->lnf = take(cv, BT * C, es, P_HEAD);
  m->lnf_mean = take(cv, BT, f4, P_HEAD);
  m->lnf_rstd = take(cv, BT, f4, P_HEAD);
  m->logits = take(cv, BT * c->padded_vocab_size, es, P_LOGITS);
  m->losses = take(cv, BT, f4, P_HEAD);
  m->dres = take(cv, BT * C, es, P_GRADS);
  m->dln = take(cv, BT * C, es, P_GRADS);
  m->datty = take(cv, BT * C, es, P_GRADS);
  m->dqkv = take(cv, BT * 3 * C, es, P_GRADS);
  m->dfch = take(cv, BT * 4 * C, es, P_GRADS);
  m->datt = take(cv, natt, f4, P_ATTENTION);
  /* The arena hands out whole 256-byte units; counting the tail here keeps
   * act_bytes the bytes act_mem really takes there. */
  take(cv, 0, 1, P_ATTENTION);
}

static void parts_of(const carver *cv, st_act_bytes *out) {
  out->embed = cv->part[P_EMBED];
  out->blocks = cv->part[P_BLOCKS];
  out->recompute = cv->part[P_RECOMPUTE];
  out->attention = cv->part[P_ATTENTION];
  out->head = cv->part[P_HEAD];
  out->logits = cv->part[P_LOGITS];
  out->grad_scratch = cv->part[P_GRADS];
  out->total = cv->off;
}

void st_model_measure_acts(const st_model_config *cfg, st_dtype dtype, int64_t att_floats, int B,
                           int T, st_recompute recompute, st_act_bytes *out) {
  st_model m;
  memset(&m, 0, sizeof m);
  m.cfg = *cfg;
  m.es = st_dtype_size(dtype);
  m.B = B;
  m.T = T;
  m.recompute = recompute;
  carver measure = {NULL, 0, {0}};
  layout_acts(&m, att_floats, &measure);
  parts_of(&measure, out);
}

/* Elements of the head gradient buffer (ZeRO 2): wte + wpe, then ln_f. */
static int64_t head_numel(const st_model *m) {
  return m->block_begin + (m->tab.total - (m->block_begin + m->cfg.n_layer * m->block_numel));
}

/* Bind block l's gradient views to a one-block bucket. */
static void bind_block_grads(st_model *m, int l, float *bucket) {
  st_block_params *b = &m->g.h[l];
  void **slots[12] = {&b->ln1_w, &b->ln1_b, &b->qkv_w, &b->qkv_b, &b->attproj_w, &b->attproj_b,
                       &b->ln2_w, &b->ln2_b, &b->fc_w, &b->fc_b, &b->fcproj_w, &b->fcproj_b};
  const int64_t base = m->block_begin + (int64_t)l * m->block_numel;
  for (int k = 0; k < 12; k++) *slots[k] = bucket + (m->tab.t[2 + 12 * l + k].offset - base);
}

/* grad_buckets: ZeRO 2's gradient storage (head_grads and two one-block
 * buckets) instead of a full fp32 vector, which is never allocated. */
static int model_init(st_model *m, const st_model_config *cfg, const st_ops *ops, int B, int T,
                      int pad_multiple, st_recompute recompute, int grad_buckets) {
  memset(m, 0, sizeof *m);
  m->recompute = recompute;
  m->cfg = *cfg;
  m->ops = ops;
  m->B = B;
  m->T = T;
  m->es = st_dtype_size(ops->dtype);
  if (st_param_table_build(cfg, &m->tab)) return -1;
  m->padded_total = (m->tab.total + pad_multiple - 1) / pad_multiple * pad_multiple;
  /* Table order: wte, wpe, 12 tensors per block, ln_f: blocks are one
   * contiguous range of equal-sized pieces. */
  m->block_begin = m->tab.t[2].offset;
  m->block_numel = cfg->n_layer > 0 ? m->tab.t[2 + 12].offset - m->block_begin : 0;
  m->blk = calloc((size_t)cfg->n_layer + 1, sizeof *m->blk);
  if (!m->blk) return st_error_set("out of host memory for the model's activation table");
  const int64_t natt = ops->attention_state_floats(B, T, cfg->n_head);
  carver measure = {NULL, 0, {0}};
  layout_acts(m, natt, &measure);
  m->act_bytes = measure.off;
  size_t pbytes = (size_t)m->padded_total * m->es, gbytes;
  m->params = ops->alloc(pbytes, "weights");
  if (grad_buckets) {
    const size_t nh = (size_t)head_numel(m), nb = (size_t)m->block_numel + 1;
    gbytes = (nh + 2 * nb) * sizeof(float);
    m->head_grads = ops->alloc(nh * sizeof(float), "grads_head");
    m->bucket[0] = ops->alloc(nb * sizeof(float), "grads_buckets");
    m->bucket[1] = ops->alloc(nb * sizeof(float), "grads_buckets");
  } else {
    gbytes = (size_t)m->padded_total * sizeof(float);
    m->grads = ops->alloc(gbytes, "grads_full");
  }
  int grads_ok = grad_buckets ? m->head_grads && m->bucket[0] && m->bucket[1] : m->grads != NULL;
  m->act_mem = ops->alloc(m->act_bytes, "activations");
  m->losses_host = calloc((size_t)B * T, sizeof(float));
  if (!m->params || !grads_ok || !m->act_mem || !m->losses_host) {
    double mib = (pbytes + gbytes + (double)m->act_bytes) / 1048576.0;
    st_model_free(m);
    return st_error_set("cannot allocate %.1f MiB of %s memory for the model "
                        "(parameters, gradients, activations); lower --micro-batch or --seq-len",
                        mib, ops->name);
  }
  if (st_param_views_bind(cfg, &m->tab, m->params, m->es, &m->p)) return -1;
  if (!grad_buckets) {
    if (st_param_views_bind(cfg, &m->tab, m->grads, sizeof(float), &m->g)) return -1;
  } else {
    /* Head tensors in head_grads (wte, wpe, then ln_f); block views point
     * into a bucket and are rebound as each block's backward starts. */
    const int64_t lnf = m->block_begin + cfg->n_layer * m->block_numel;
    m->g.h = calloc((size_t)cfg->n_layer, sizeof *m->g.h);
    if (!m->g.h) return st_error_set("out of host memory for gradient views");
    m->g.wte = m->head_grads;
    m->g.wpe = m->head_grads + m->tab.t[1].offset;
    m->g.lnf_w = m->head_grads + m->block_begin;
    m->g.lnf_b = m->head_grads + m->block_begin + (m->tab.t[m->tab.n - 1].offset - lnf);
    for (int l = 0; l < cfg->n_layer; l++) bind_block_grads(m, l, m->bucket[l % 2]);
  }
  carver cv = {m->act_mem, 0, {0}};
  layout_acts(m, natt, &cv);
  return 0;
}

int st_model_init(st_model *m, const st_model_config *cfg, const st_ops *ops, int B, int T,
                  int pad_multiple, st_recompute recompute) {
  return model_init(m, cfg, ops, B, T, pad_multiple, recompute, 0);
}

int st_model_init_bucketed(st_model *m, const st_model_config *cfg, const st_ops *ops, int B,
                           int T, int pad_multiple, st_recompute recompute) {
  return model_init(m, cfg, ops, B, T, pad_multiple, recompute, 1);
}

int st_model_set_weights(st_model *m, const float *host) {
  size_t n = (size_t)m->padded_total, bytes = n * m->es;
  void *staged = m->ops->dtype == ST_FP32 ? NULL : malloc(bytes);
  if (m->ops->dtype != ST_FP32 && !staged)
    return st_error_set("cannot allocate %zu bytes of host memory to convert the weights", bytes);
  if (staged) st_dtype_from_f32(m->ops->dtype, staged, host, n);
  m->ops->to_device(m->params, staged ? staged : host, bytes);
  free(staged);
  return 0;
}

int st_model_get_weights(const st_model *m, float *host) {
  size_t n = (size_t)m->padded_total, bytes = n * m->es;
  void *staged = m->ops->dtype == ST_FP32 ? NULL : malloc(bytes);
  if (m->ops->dtype != ST_FP32 && !staged)
    return st_error_set("cannot allocate %zu bytes of host memory to convert the weights", bytes);
  m->ops->to_host(staged ? staged : host, m->params, bytes);
  if (staged) st_dtype_to_f32(m->ops->dtype, host, staged, n);
  free(staged);
  return 0;
}

void st_model_free(st_model *m) {
  st_param_views_free(&m->p);
  st_param_views_free(&m->g);
  st_param_table_free(&m->tab);
  if (m->ops) {
    m->ops->free(m->params);
    m->ops->free(m->grads);
    m->ops->free(m->act_mem);
    m->ops->free(m->head_grads);
    m->ops->free(m->bucket[0]);
    m->ops->free(m->bucket[1]);
  }
  free(m->losses_host);
  free(m->blk);
  memset(m, 0, sizeof *m);
}

static void fill_normal(float *x, int64_t n, float std, st_rng *rng) {
  for (int64_t i = 0; i < n; i++) x[i] = std * st_rng_normal(rng);
}

int st_model_draw_weights(const st_model *m, st_rng *rng, float *host) {
  const st_model_config *c = &m->cfg;
  const float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * c->n_layer);
  memset(host, 0, (size_t)m->padded_total * sizeof(float));
  for (int i = 0; i < m->tab.n; i++) {
    const st_tensor *t = &m->tab.t[i];
    float *x = host + t->offset;
    if (t->ndim == 2) {
      int is_proj = strstr(t->name, "attn.proj.weight") || strstr(t->name, "mlp.proj.weight");
      int64_t n = t->numel;
      if (strcmp(t->name, "wte.weight") == 0) n = (int64_t)c->vocab_size * c->n_embd;
      fill_normal(x, n, is_proj ? proj_std : std, rng);
    } else if (strstr(t->name, "ln_") && strstr(t->name, ".weight")) {
      for (int64_t k = 0; k < t->numel; k++) x[k] = 1.0f;
    }
  }
  return 0;
}

int st_model_init_weights(st_model *m, st_rng *rng) {
  size_t bytes = (size_t)m->padded_total * sizeof(float);
  float *host = malloc(bytes);
  if (!host) return st_error_set("cannot allocate %zu bytes of host memory for initial weights", bytes);
  int rc = st_model_draw_weights(m, rng, host) || st_model_set_weights(m, host) ? -1 : 0;
  free(host);
  return rc;
}

void st_model_zero_grad(st_model *m) {
  if (!m->head_grads) {
    m->ops->zero(m->grads, (size_t)m->padded_total * sizeof(float));
    return;
  }
  /* the buckets are zeroed by backward itself, block by block */
  m->ops->zero(m->head_grads, (size_t)head_numel(m) * sizeof(float));
}

/* Block l's forward from its input x: the one definition that forward and
 * full recompute share, so a recomputed block is bit-identical. */
static void block_forward(st_model *m, int l, const void *x, int B, int T) {
  const st_ops *op = m->ops;
  const int C = m->cfg.n_embd, NH = m->cfg.n_head, BT = B * T;
  st_block_acts *a = &m->blk[l];
  const st_block_params *w = &m->p.h[l];
  op->layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, w->ln1_w, w->ln1_b, BT, C);
  op->matmul_forward(a->qkv, a->ln1, w->qkv_w, w->qkv_b, BT, C, 3 * C);
  op->attention_forward(a->atty, a->att, a->qkv, B, T, C, NH, NH);
  op->matmul_forward(a->attproj, a->atty, w->attproj_w, w->attproj_b, BT, C, C);
  op->residual_forward(a->residual2, x, a->attproj, (int64_t)BT * C);
  op->layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->residual2, w->ln2_w, w->ln2_b, BT,
                        C);
  if (m->recompute == ST_RECOMPUTE_SELECTIVE) {
    /* Selective recompute rebuilds the GELU output from the stored (rounded)
     * fch with gelu_forward; forward must produce it the same way, not in
     * the GEMM epilogue from the unrounded sum, or backward would see other
     * values than the loss was computed with. */
    op->matmul_forward(a->fch, a->ln2, w->fc_w, w->fc_b, BT, C, 4 * C);
    op->gelu_forward(a->fch_gelu, a->fch, (int64_t)BT * 4 * C);
  } else {
    op->matmul_gelu_forward(a->fch_gelu, a->fch, a->ln2, w->fc_w, w->fc_b, BT, C, 4 * C);
  }
  op->matmul_forward(a->fcproj, a->fch_gelu, w->fcproj_w, w->fcproj_b, BT, 4 * C, C);
  op->residual_forward(a->residual3, a->residual2, a->fcproj, (int64_t)BT * C);
}

/* Rebuild what the recompute policy did not keep for block l's backward:
 * full reruns the block from its input (the residual3 it writes is already
 * there and comes out the same); selective reruns the two LayerNorms and
 * the GELU, whose inputs were kept. */
static void block_recompute(st_model *m, int l, const void *x, int B, int T) {
  const st_ops *op = m->ops;
  const int C = m->cfg.n_embd, BT = B * T;
  st_block_acts *a = &m->blk[l];
  const st_block_params *w = &m->p.h[l];
  if (m->recompute == ST_RECOMPUTE_FULL) {
    block_forward(m, l, x, B, T);
  } else if (m->recompute == ST_RECOMPUTE_SELECTIVE) {
    op->layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, x, w->ln1_w, w->ln1_b, BT, C);
    op->layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->residual2, w->ln2_w, w->ln2_b,
                          BT, C);
    op->gelu_forward(a->fch_gelu, a->fch, (int64_t)BT * 4 * C);
  }
}

double st_model_forward(st_model *m, const int *inp, const int *targets, int B, int T,
                        float dloss) {
  const st_ops *op = m->ops;
  const st_model_config *c = &m->cfg;
  const int C = c->n_embd, BT = B * T, Vp = c->padded_vocab_size;
  op->encoder_forward(m->encoded, inp, m->p.wte, m->p.wpe, B, T, C);
  const void *x = m->encoded;
  for (int l = 0; l < c->n_layer; l++) {
    block_forward(m, l, x, B, T);
    x = m->blk[l].residual3;
  }
  op->layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, x, m->p.lnf_w, m->p.lnf_b, BT, C);
  op->matmul_forward(m->logits, m->lnf, m->p.wte, NULL, BT, C, Vp);
  op->softmax_crossentropy(m->losses, dloss > 0 ? m->logits : NULL, m->logits, targets, dloss,
                           BT, c->vocab_size, Vp);
  m->ops->to_host(m->losses_host, m->losses, (size_t)BT * sizeof(float));
  double sum = 0.0;
  for (int i = 0; i < BT; i++) sum += m->losses_host[i];
  return sum;
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
  const int64_t lnf = m->block_begin + m->cfg.n_layer * m->block_numel;
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
  const int C = c->n_embd, NH = c->n_head, BT = B * T, Vp = c->padded_vocab_size;
  const int64_t BTC = (int64_t)BT * C;
  st_param_views *g = &m->g;

  /* LM head (tied): logits = lnf @ wte^T, so dwte gets the head's share here
   * and the embedding's share in encoder_backward. */
  op->matmul_backward(m->dln, g->wte, NULL, m->logits, m->lnf, m->p.wte, BT, C, Vp);
  zero(m->dres, BTC);
  const void *xlast = c->n_layer > 0 ? m->blk[c->n_layer - 1].residual3 : m->encoded;
  op->layernorm_backward(m->dres, g->lnf_w, g->lnf_b, m->dln, xlast, m->p.lnf_w, m->lnf_mean,
                         m->lnf_rstd, BT, C);

  /* dres carries d(block output); each residual add passes it through to both
   * branches, so the branches' input gradients accumulate into it. */
  for (int l = c->n_layer - 1; l >= 0; l--) {
    st_block_acts *a = &m->blk[l];
    const st_block_params *w = &m->p.h[l];
    st_block_params *gw = &g->h[l];
    const void *x = l == 0 ? m->encoded : m->blk[l - 1].residual3;
    if (m->head_grads) {
      if (h && h->reuse) h->reuse(h->ctx, l % 2);
      (op->zero)(m->bucket[l % 2], (size_t)m->block_numel * sizeof(float));
      bind_block_grads(m, l, m->bucket[l % 2]);
    }
    block_recompute(m, l, x, B, T);

    op->matmul_backward_gelu(m->dfch, gw->fcproj_w, gw->fcproj_b, m->dres, a->fch_gelu,
                             w->fcproj_w, a->fch, BT, 4 * C, C);
    op->matmul_backward(m->dln, gw->fc_w, gw->fc_b, m->dfch, a->ln2, w->fc_w, BT, C, 4 * C);
    op->layernorm_backward(m->dres, gw->ln2_w, gw->ln2_b, m->dln, a->residual2, w->ln2_w,
                           a->ln2_mean, a->ln2_rstd, BT, C);

    op->matmul_backward(m->datty, gw->attproj_w, gw->attproj_b, m->dres, a->atty, w->attproj_w,
                        BT, C, C);
    op->attention_backward(m->dqkv, m->datt, m->datty, a->qkv, a->atty, a->att, B, T, C, NH,
                           NH);
    op->matmul_backward(m->dln, gw->qkv_w, gw->qkv_b, m->dqkv, a->ln1, w->qkv_w, BT, C, 3 * C);
    op->layernorm_backward(m->dres, gw->ln1_w, gw->ln1_b, m->dln, x, w->ln1_w, a->ln1_mean,
                           a->ln1_rstd, BT, C);
    if (h) {
      const int64_t b0 = m->block_begin + (int64_t)l * m->block_numel;
      const float *src = m->head_grads ? m->bucket[l % 2] : m->grads + b0;
      h->ready(h->ctx, src, b0, b0 + m->block_numel, l % 2);
    }
  }
  op->encoder_backward(g->wte, g->wpe, m->dres, inp, B, T, C);
  if (h) {
    const int64_t lnf = m->block_begin + c->n_layer * m->block_numel;
    const float *head = m->head_grads ? m->head_grads : m->grads;
    h->ready(h->ctx, head, 0, m->block_begin, 2);
    h->ready(h->ctx, head + (m->head_grads ? m->block_begin : lnf), lnf, m->tab.total, 3);
  }
#undef zero
}
