/* infer.c - KV-cache inference over the op table (see infer.h). */
#include "rank/model/infer.h"

#include <stdlib.h>
#include <string.h>

#include "rank/model/rope.h"
#include "util/error.h"

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

int st_infer_init(st_infer *m, const st_model_config *cfg, const st_ops *ops, int max_rows) {
  memset(m, 0, sizeof *m);
  m->cfg = *cfg;
  st_model_fill_derived(&m->cfg);
  cfg = &m->cfg;
  m->ops = ops;
  m->es = st_dtype_size(ops->dtype);
  m->max_pos = cfg->block_size;
  m->max_rows = max_rows < 1 ? 1 : max_rows > cfg->block_size ? cfg->block_size : max_rows;
  if (st_param_table_build(cfg, &m->tab)) return -1;
  const size_t C = (size_t)cfg->n_embd, R = (size_t)m->max_rows, es = m->es;
  const size_t L = (size_t)cfg->n_layer, Vp = (size_t)cfg->padded_vocab_size;
  const size_t QKV = (size_t)st_model_qkv_dim(cfg), F = (size_t)cfg->ffn_dim;
  const size_t HD = (size_t)st_model_head_dim(cfg), KV = (size_t)cfg->n_kv_head * HD;
  const size_t FC = cfg->mlp == ST_MLP_SWIGLU ? 2 * F : F;
  const size_t ncs = cfg->pos == ST_POS_ROPE ? (size_t)m->max_pos * HD : 0;
  /* sizes of x, ln, qkv, atty, tmp, fch, fch_act, mean, rstd, lnf, logits, tokens, rope_cs */
  const size_t sz[13] = {R * C * es,  R * C * es,        R * QKV * es,      R * C * es,
                         R * C * es,  R * FC * es,       R * F * es,        R * sizeof(float),
                         R * sizeof(float), C * es,      Vp * es,           R * sizeof(int),
                         ncs * sizeof(float)};
  const size_t cache = align256((size_t)m->max_pos * KV * es);
  size_t total = 2 * L * cache;
  for (int i = 0; i < 13; i++) total += align256(sz[i]);
  const size_t pbytes = (size_t)m->tab.total * es;
  m->params = ops->alloc(pbytes, "weights");
  m->mem = ops->alloc(total, "kv_cache");
  m->kc = calloc(L ? L : 1, sizeof *m->kc);
  m->vc = calloc(L ? L : 1, sizeof *m->vc);
  if (ops->dtype != ST_FP32) m->logits_stage = malloc(Vp * es);
  if (!m->params || !m->mem || !m->kc || !m->vc || (ops->dtype != ST_FP32 && !m->logits_stage)) {
    double mib = (double)(pbytes + total) / 1048576.0;
    st_infer_free(m);
    return st_error_setc(ST_EXIT_OOM, "cannot allocate %.1f MiB of %s memory for sampling "
                         "(weights, a KV cache of %d positions, buffers for %d rows)", mib,
                         ops->name, cfg->block_size, max_rows);
  }
  char *at = m->mem;
  void **slot[13] = {&m->x, &m->ln, &m->qkv, &m->atty, &m->tmp, &m->fch, &m->fch_act,
                     (void **)&m->mean, (void **)&m->rstd, &m->lnf, &m->logits,
                     (void **)&m->tokens, (void **)&m->rope_cs};
  for (int i = 0; i < 13; i++) {
    *slot[i] = sz[i] ? at : NULL;
    at += align256(sz[i]);
  }
  for (size_t l = 0; l < L; l++) {
    m->kc[l] = at;
    at += cache;
    m->vc[l] = at;
    at += cache;
  }
  if (st_param_views_bind(cfg, &m->tab, m->params, es, &m->p)) {
    st_infer_free(m);
    return -1;
  }
  if (ncs) {
    float *cs = malloc(ncs * sizeof(float));
    if (!cs) {
      st_infer_free(m);
      return st_error_setc(ST_EXIT_OOM, "cannot allocate %zu bytes of host memory for the "
                           "RoPE table", ncs * sizeof(float));
    }
    st_rope_table(cfg, m->max_pos, cs);
    ops->to_device(m->rope_cs, cs, ncs * sizeof(float));
    free(cs);
  }
  return 0;
}

int st_infer_set_weights(st_infer *m, const float *host) {
  const size_t n = (size_t)m->tab.total, bytes = n * m->es;
  if (m->ops->dtype == ST_FP32) {
    m->ops->to_device(m->params, host, bytes);
    return 0;
  }
  void *staged = malloc(bytes);
  if (!staged)
    return st_error_set("cannot allocate %zu bytes of host memory to convert the weights", bytes);
  st_dtype_from_f32(m->ops->dtype, staged, host, n);
  m->ops->to_device(m->params, staged, bytes);
  free(staged);
  return 0;
}

void st_infer_reset(st_infer *m) { m->pos = 0; }

int st_infer_step(st_infer *m, const int *tokens, int n_new, float *logits) {
  const st_ops *op = m->ops;
  const st_model_config *c = &m->cfg;
  const int C = c->n_embd, NH = c->n_head, Vp = c->padded_vocab_size;
  if (n_new < 1 || n_new > m->max_rows)
    return st_error_setc(ST_EXIT_USAGE, "a step of %d new positions: this sampler takes 1 to %d",
                         n_new, m->max_rows);
  if (m->pos + n_new > m->max_pos)
    return st_error_setc(ST_EXIT_USAGE, "position %d is past the model's %d positions "
                         "(block_size)", m->pos + n_new, m->max_pos);
  for (int i = 0; i < n_new; i++)
    if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
      return st_error_setc(ST_EXIT_USAGE, "token id %d is outside the model's vocabulary "
                           "(0 to %d)", tokens[i], c->vocab_size - 1);
  op->to_device(m->tokens, tokens, (size_t)n_new * sizeof(int));
  const int ln = c->norm == ST_NORM_LAYERNORM, swiglu = c->mlp == ST_MLP_SWIGLU;
  const int NKV = c->n_kv_head, HD = st_model_head_dim(c), QKV = st_model_qkv_dim(c);
  const int F = c->ffn_dim;
#define NORM(out, x, w, b, n)                                                                 \
  do {                                                                                        \
    if (ln)                                                                                   \
      op->layernorm_forward(out, m->mean, m->rstd, x, w, b, n, C);                            \
    else                                                                                      \
      op->rmsnorm_forward(out, m->rstd, x, w, n, C, c->norm_eps);                             \
  } while (0)
  /* wpe offset by the position: the encoder adds wpe[t] for t = 0 .. n_new-1 */
  const char *wpe = m->p.wpe ? (const char *)m->p.wpe + (size_t)m->pos * C * m->es : NULL;
  op->encoder_forward(m->x, m->tokens, m->p.wte, wpe, 1, n_new, C);
  for (int l = 0; l < c->n_layer; l++) {
    const st_block_params *w = &m->p.h[l];
    NORM(m->ln, m->x, w->ln1_w, w->ln1_b, n_new);
    op->matmul_forward(m->qkv, m->ln, w->qkv_w, w->qkv_b, n_new, C, QKV);
    if (m->rope_cs) op->rope_forward(m->qkv, m->rope_cs, 1, n_new, m->pos, NH, NKV, HD);
    op->attention_decode(m->atty, m->kc[l], m->vc[l], m->qkv, 1, n_new, m->pos, m->max_pos, C,
                         NH, NKV);
    op->matmul_forward(m->tmp, m->atty, w->attproj_w, w->attproj_b, n_new, C, C);
    op->residual_forward(m->x, m->x, m->tmp, (int64_t)n_new * C);
    NORM(m->ln, m->x, w->ln2_w, w->ln2_b, n_new);
    if (swiglu) {
      op->matmul_forward(m->fch, m->ln, w->fc_w, w->fc_b, n_new, C, 2 * F);
      op->swiglu_forward(m->fch_act, m->fch, n_new, F);
    } else {
      op->matmul_gelu_forward(m->fch_act, m->fch, m->ln, w->fc_w, w->fc_b, n_new, C, F);
    }
    op->matmul_forward(m->tmp, m->fch_act, w->fcproj_w, w->fcproj_b, n_new, F, C);
    op->residual_forward(m->x, m->x, m->tmp, (int64_t)n_new * C);
  }
  const char *last = (const char *)m->x + (size_t)(n_new - 1) * C * m->es;
  NORM(m->lnf, last, m->p.lnf_w, m->p.lnf_b, 1);
#undef NORM
  op->matmul_forward(m->logits, m->lnf, m->p.lm_head ? m->p.lm_head : m->p.wte, NULL, 1, C, Vp);
  if (m->logits_stage) {
    op->to_host(m->logits_stage, m->logits, (size_t)Vp * m->es);
    st_dtype_to_f32(op->dtype, logits, m->logits_stage, (size_t)Vp);
  } else {
    op->to_host(logits, m->logits, (size_t)Vp * sizeof(float));
  }
  m->pos += n_new;
  return 0;
}

void st_infer_free(st_infer *m) {
  st_param_views_free(&m->p);
  st_param_table_free(&m->tab);
  if (m->ops) {
    m->ops->free(m->params);
    m->ops->free(m->mem);
  }
  free(m->kc);
  free(m->vc);
  free(m->logits_stage);
  memset(m, 0, sizeof *m);
}
