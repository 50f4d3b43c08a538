/* model_layout.c - where st_model keeps things: the activations carved
 * out of one allocation (sized by the same code that lays them out), the
 * weight and gradient views for each ZeRO stage and for LoRA and QLoRA
 * bases, the LM head's chunk, and setup and teardown. The schedule that
 * uses them is model.c. */
#include "rank/model/model_internal.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/nf4.h"
#include "rank/model/rope.h"
#include "util/envparse.h"
#include "util/error.h"

/* ST_HEAD_CHUNK_ROWS: 1 with *rows set, 0 when unset or empty, -1 when it
 * is not a whole number >= 1 (*s_out: the value, for the message). */
static int head_rows_env(long long *rows, const char **s_out) {
  const char *s = getenv("ST_HEAD_CHUNK_ROWS");
  if (s_out) *s_out = s;
  if (!s || !*s) return 0;
  if (st_envparse_uint(s, INT_MAX, rows) || *rows < 1) return -1;
  return 1;
}

int st_model_head_rows(const st_model_config *cfg, st_dtype dtype, int64_t BT) {
  if (BT < 1) return 1;
  long long forced;
  if (head_rows_env(&forced, NULL) == 1) return (int)(forced < BT ? forced : BT);
  st_model_config c = *cfg;
  st_model_fill_derived(&c);
  const size_t row = (size_t)c.padded_vocab_size * st_dtype_size(dtype);
  if ((size_t)BT * row <= ST_HEAD_CHUNK_BYTES) return (int)BT;
  int64_t r = (int64_t)(ST_HEAD_CHUNK_BYTES / row) / 128 * 128;
  int64_t want = BT / 8 / 128 * 128; /* an eighth of the rows: at most 1/8 of the whole logits */
  if (want < ST_HEAD_CHUNK_MIN_ROWS) want = ST_HEAD_CHUNK_MIN_ROWS;
  if (want > ST_HEAD_CHUNK_WIDE_ROWS) want = ST_HEAD_CHUNK_WIDE_ROWS;
  int64_t floor_rows = (int64_t)(ST_HEAD_CHUNK_MAX_BYTES / row) / 128 * 128;
  if (floor_rows > want) floor_rows = want;
  if (r < floor_rows) r = floor_rows;
  if (r < 128) r = 128;
  return (int)(r < BT ? r : BT);
}

/* Carves buffers out of one allocation. With base == NULL it only
 * measures, so sizing and layout come from the same code. Each take's
 * alignment padding is counted with the part it precedes, so the parts add
 * up to the whole. */
enum { P_EMBED, P_BLOCKS, P_RECOMPUTE, P_ATTENTION, P_HEAD, P_LOGITS, P_GRADS, P_LORA, P_N };
typedef struct {
  char *base;
  size_t off;
  size_t part[P_N];
} carver;

/* n rounded up to the arena's 256-byte unit: vector loads and cuBLASLt
 * like the alignment. */
static int64_t align256(int64_t n) { return (n + 255) & ~(int64_t)255; }

static void *take(carver *cv, int64_t n, size_t elem, int part) {
  const size_t start = cv->off;
  cv->off = (size_t)align256((int64_t)cv->off);
  void *p = cv->base ? cv->base + cv->off : NULL;
  cv->off += (size_t)n * elem;
  cv->part[part] += cv->off - start;
  return p;
}

int st_model_nf4_proj_of(const char *name, int *layer) {
  static const char *const suffix[4] = {"attn.qkv.weight", "attn.proj.weight", "mlp.fc.weight",
                                        "mlp.proj.weight"};
  if (strncmp(name, "h.", 2) != 0) return -1;
  char *end;
  const long l = strtol(name + 2, &end, 10);
  if (*end != '.') return -1;
  for (int P = 0; P < 4; P++)
    if (strcmp(end + 1, suffix[P]) == 0) {
      *layer = (int)l;
      return P;
    }
  return -1;
}

void st_model_nf4_bytes(const st_model_config *cfg, st_dtype dtype, uint64_t *nf4,
                        uint64_t *scratch, int64_t *base) {
  st_param_table tab;
  *nf4 = *scratch = 0;
  *base = 0;
  if (st_param_table_build(cfg, &tab)) return;
  int64_t big_r = 0, big_c = 0;
  for (int i = 0; i < tab.n; i++) {
    const st_tensor *t = &tab.t[i];
    int l;
    if (st_model_nf4_proj_of(t->name, &l) < 0) {
      *base += t->numel;
      continue;
    }
    *nf4 += st_nf4_bytes(t->shape[0], t->shape[1]);
    if (t->numel > big_r * big_c) {
      big_r = t->shape[0];
      big_c = t->shape[1];
    }
  }
  *scratch = st_nf4_scratch_bytes(big_r, big_c, dtype) +
             st_nf4_quantize_scratch_bytes(big_r, big_c);
  st_param_table_free(&tab);
}

/* The activation layout of m (cfg, es, B, T, recompute) with natt floats of
 * attention state per layer. m->blk may be NULL when only measuring. */
static void layout_acts(st_model *m, int64_t natt, carver *cv) {
  const st_model_config *c = &m->cfg;
  const dims d = dims_of(c);
  const int64_t BT = (int64_t)m->B * m->T, C = d.C;
  const size_t es = m->es, f4 = sizeof(float);
  m->encoded = take(cv, BT * C, es, P_EMBED);
  m->rope_cs = d.rope ? take(cv, (int64_t)m->T * d.HD, f4, P_EMBED) : NULL;
  /* Recompute: what backward rebuilds lives once, in the shared block
   * blk[n_layer], instead of once per layer. act shares the MLP
   * activation's output; selective the norm outputs too; full shares
   * everything but the block output,
   * which is the next block's input. The two projections have no buffer:
   * matmul_residual_forward writes them into the residual stream (backward
   * needs their inputs, never them). X(field, elements, element size,
   * exists?, shared?, part when kept per layer) */
  const int act = m->recompute != ST_RECOMPUTE_NONE;
  const int sel = m->recompute >= ST_RECOMPUTE_SELECTIVE, full = m->recompute == ST_RECOMPUTE_FULL;
#define BLOCK_FIELDS(X)                                                                      \
  X(ln1, BT * C, es, 1, sel, P_BLOCKS) X(ln1_mean, BT, f4, d.ln, full, P_BLOCKS)               \
  X(ln1_rstd, BT, f4, 1, full, P_BLOCKS) X(qkv, BT * d.QKV, es, 1, full, P_BLOCKS)             \
  X(atty, BT * C, es, 1, full, P_BLOCKS) X(att, natt, f4, 1, full, P_ATTENTION)                \
  X(residual2, BT * C, es, 1, full, P_BLOCKS)                                                 \
  X(ln2, BT * C, es, 1, sel, P_BLOCKS) X(ln2_mean, BT, f4, d.ln, full, P_BLOCKS)               \
  X(ln2_rstd, BT, f4, 1, full, P_BLOCKS) X(fch, BT * d.FC, es, 1, full, P_BLOCKS)              \
  X(fch_act, BT * d.F, es, 1, act, P_BLOCKS)
#define SHARED_PART(part) ((part) == P_ATTENTION ? P_ATTENTION : P_RECOMPUTE)
#define SHARE(f, n, e, has, shared, part) \
  sh->f = (has) && (shared) ? take(cv, n, e, SHARED_PART(part)) : NULL;
#define PICK(f, n, e, has, shared, part) \
  a->f = !(has) ? NULL : (shared) ? sh->f : take(cv, n, e, part);
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
  m->lnf_mean = d.ln ? take(cv, BT, f4, P_HEAD) : NULL;
  m->lnf_rstd = take(cv, BT, f4, P_HEAD);
  m->losses = take(cv, BT, f4, P_HEAD);
  /* dln carries d(ln_f output) from the training forward's chunked head to
   * backward's first step, so it has its own buffer. */
  m->dln = take(cv, BT * C, es, P_GRADS);
  /* The logits chunk is dead once the training forward's head is done, and
   * backward's block scratch is written only after that: one region holds
   * the chunk in forward and dres, dfch and dfact in backward (GPT-2 124M,
   * micro-batch 32: 240 MiB of scratch inside the 393 MiB chunk). dfch's
   * buffer serves dqkv beside datty too: a block's MLP backward has put
   * fc's input gradient in dln before its attention backward writes datty,
   * and the next block writes dfch only after the qkv projection's backward
   * has read dqkv (GPT-2: 4X instead of 8X, X = [B,T,C]). Each piece starts
   * on a 256-byte boundary, as its own take did. The part of the region
   * beyond the logits counts as backward scratch. */
  const int64_t x_bytes = align256(BT * C * (int64_t)es);
  const int64_t qkv_bytes = align256(BT * d.QKV * (int64_t)es);
  const int64_t mlp_bytes = BT * d.FC * (int64_t)es, attn_bytes = qkv_bytes + BT * C * (int64_t)es;
  const int64_t u_bytes = align256(mlp_bytes > attn_bytes ? mlp_bytes : attn_bytes);
  const int has_fact = d.swiglu || lora_has(m, ST_LORA_DOWN);
  const int64_t scratch = x_bytes + u_bytes + (has_fact ? BT * d.F * (int64_t)es : 0);
  const int64_t logit_bytes = (int64_t)m->head_rows * c->padded_vocab_size * (int64_t)es;
  char *region = take(cv, logit_bytes, 1, P_LOGITS);
  if (scratch > logit_bytes) {
    cv->off += (size_t)(scratch - logit_bytes);
    cv->part[P_GRADS] += (size_t)(scratch - logit_bytes);
  }
  m->logits = region;
  m->dres = region;
  m->dfch = region ? region + x_bytes : NULL;
  m->dqkv = m->dfch;
  m->datty = region ? region + x_bytes + qkv_bytes : NULL;
  m->dfact = has_fact && region ? region + x_bytes + u_bytes : NULL;
  m->datt = take(cv, natt, f4, P_ATTENTION);
  if (lora_on(m)) {
    /* A dropout(x) of every adapter is kept per layer under every policy:
     * r columns each, small against the block's own activations. */
    const st_lora_table *lt = &m->ltab;
    const int64_t r = m->lora.rank;
    for (int i = 0; i < lt->n; i++) {
      void *u = take(cv, BT * r, es, P_LORA);
      if (m->lora_u) m->lora_u[i] = u;
    }
    const int64_t w = lt->max_in > lt->max_out ? lt->max_in : lt->max_out;
    m->lora_s = take(cv, BT * w, es, P_LORA);
    m->lora_du = take(cv, BT * r, es, P_LORA);
    m->lora_x = m->lora.dropout > 0 ? take(cv, BT * lt->max_in, es, P_LORA) : NULL;
  }
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
  out->lora = cv->part[P_LORA];
  out->total = cv->off;
}

void st_model_measure_acts(const st_model_config *cfg, st_dtype dtype, int64_t att_floats, int B,
                           int T, st_recompute recompute, st_act_bytes *out) {
  st_model_measure_acts_lora(cfg, NULL, dtype, att_floats, B, T, recompute, out);
}

void st_model_measure_acts_lora(const st_model_config *cfg, const st_lora_config *lora,
                                st_dtype dtype, int64_t att_floats, int B, int T,
                                st_recompute recompute, st_act_bytes *out) {
  st_model m;
  memset(&m, 0, sizeof m);
  if (lora && lora->rank > 0) {
    m.lora = *lora;
    if (st_lora_table_build(cfg, lora, &m.ltab)) m.lora.rank = 0; /* unresolved: measured without */
  }
  m.cfg = *cfg;
  st_model_fill_derived(&m.cfg);
  m.es = st_dtype_size(dtype);
  m.B = B;
  m.T = T;
  m.recompute = recompute;
  m.head_rows = st_model_head_rows(&m.cfg, dtype, (int64_t)B * T);
  carver measure = {NULL, 0, {0}};
  layout_acts(&m, att_floats, &measure);
  parts_of(&measure, out);
  st_lora_table_free(&m.ltab);
}

/* Where head tensor `name` lives in a head buffer of es-byte elements
 * (head_grads, head_params: [0, block_begin) then [ln_f, total) back to
 * back), or NULL when the description lacks it. */
static void *head_view(const st_model *m, void *base, size_t es, const char *name) {
  const int i = st_param_find(&m->tab, name);
  if (i < 0) return NULL;
  const int64_t off = m->tab.t[i].offset;
  return (char *)base +
         (size_t)(off < m->block_begin ? off : m->block_begin + (off - lnf_begin(m))) * es;
}

static float *head_grad_view(const st_model *m, const char *name) {
  return head_view(m, m->head_grads, sizeof(float), name);
}

/* ZeRO 3's views: head tensors into head_params, block l into wbuf[l % 2]. */
static int bind_sharded_views(st_model *m) {
  const int L = m->cfg.n_layer;
  m->p.h = calloc((size_t)(L > 0 ? L : 1), sizeof *m->p.h);
  if (!m->p.h) return st_error_set("out of host memory for weight views");
  m->p.wte = head_view(m, m->head_params, m->es, "wte.weight");
  m->p.wpe = head_view(m, m->head_params, m->es, "wpe.weight");
  m->p.lnf_w = head_view(m, m->head_params, m->es, "ln_f.weight");
  m->p.lnf_b = head_view(m, m->head_params, m->es, "ln_f.bias");
  m->p.lm_head = head_view(m, m->head_params, m->es, "lm_head.weight");
  for (int l = 0; l < L; l++)
    st_param_block_bind(&m->tab, l, m->wbuf[l % 2], m->block_begin + (int64_t)l * m->block_numel,
                        m->es, &m->p.h[l]);
  m->wheld[0] = m->wheld[1] = -1;
  return 0;
}

/* LoRA's views into base_params. QLoRA: base_params holds the tensors
 * that are not NF4 back to back (base_coff), so the views are bound to a
 * copy of the table with those offsets; the projections' views are NULL. */
static int bind_base_views(st_model *m) {
  if (!m->nf4) return st_param_views_bind(&m->cfg, &m->base_tab, m->base_params, m->es, &m->p);
  st_param_table t = m->base_tab;
  t.t = malloc((size_t)t.n * sizeof *t.t);
  if (!t.t) return st_error_set("out of host memory for weight views");
  for (int i = 0; i < t.n; i++) {
    t.t[i] = m->base_tab.t[i];
    t.t[i].offset = m->base_coff[i] < 0 ? 0 : m->base_coff[i];
  }
  const int rc = st_param_views_bind(&m->cfg, &t, m->base_params, m->es, &m->p);
  free(t.t);
  if (rc) return -1;
  for (int l = 0; l < m->cfg.n_layer; l++)
    m->p.h[l].qkv_w = m->p.h[l].attproj_w = m->p.h[l].fc_w = m->p.h[l].fcproj_w = NULL;
  return 0;
}

/* grad_buckets: ZeRO 2's gradient storage (head_grads and two one-block
 * buckets) instead of a full fp32 vector, which is never allocated. On one
 * rank (pad_multiple 1) the two slots share one bucket: nothing reduces
 * while the next block computes (one rank's reductions are copies in
 * stream order), and the trainer's reuse hook waits for both slots.
 * shard_numel > 0: ZeRO 3's working weights (shard, head, two block
 * buffers) instead of a whole vector; implies grad_buckets. */
static int model_init(st_model *m, const st_model_config *cfg, const st_ops *ops, int B, int T,
                      int pad_multiple, st_recompute recompute, int grad_buckets,
                      int64_t shard_begin, int64_t shard_numel, const st_lora_config *lora) {
  memset(m, 0, sizeof *m);
  if (lora && lora->rank > 0) m->lora = *lora;
  m->recompute = recompute;
  m->cfg = *cfg;
  st_model_fill_derived(&m->cfg);
  cfg = &m->cfg;
  m->ops = ops;
  m->B = B;
  m->T = T;
  m->es = st_dtype_size(ops->dtype);
  long long forced;
  const char *env;
  if (head_rows_env(&forced, &env) < 0)
    return st_error_set("ST_HEAD_CHUNK_ROWS=%s is not a whole number of rows >= 1; unset it "
                        "(the LM head then picks its chunk itself) or give e.g. 1024",
                        env);
  m->head_rows = st_model_head_rows(cfg, ops->dtype, (int64_t)B * T);
  if (lora_on(m)) {
    /* the adapters are the model's parameters; the base keeps its own table */
    if (shard_numel > 0) return st_error_set("internal: LoRA with a sharded (ZeRO 3) base");
    if (st_param_table_build(cfg, &m->base_tab) || st_lora_table_build(cfg, &m->lora, &m->ltab) ||
        st_lora_param_table(cfg, &m->ltab, &m->tab))
      return -1;
    m->lora_u = calloc((size_t)(m->ltab.n > 0 ? m->ltab.n : 1), sizeof *m->lora_u);
    if (!m->lora_u) return st_error_set("out of host memory for the LoRA activation table");
  } else if (st_param_table_build(cfg, &m->tab)) {
    return -1;
  }
  m->padded_total = (m->tab.total + pad_multiple - 1) / pad_multiple * pad_multiple;
  /* Table order: head tensors (wte, wpe), block_tensors per block, then ln_f
   * (and lm_head): blocks are one contiguous range of equal-sized pieces. */
  const st_param_table *tb = &m->tab;
  m->block_begin = tb->t[tb->block_first].offset;
  if (lora_on(m)) /* the adapters: one layer's after another, no tail tensor */
    m->block_numel = m->ltab.layer_numel;
  else
    m->block_numel =
        cfg->n_layer > 0 ? tb->t[tb->block_first + tb->block_tensors].offset - m->block_begin : 0;
  m->blk = calloc((size_t)cfg->n_layer + 1, sizeof *m->blk);
  if (!m->blk) return st_error_set("out of host memory for the model's activation table");
  const int64_t natt = ops->attention_state_floats(B, T, cfg->n_head);
  carver measure = {NULL, 0, {0}};
  layout_acts(m, natt, &measure);
  m->act_bytes = measure.off;
  size_t pbytes, gbytes;
  int params_ok;
  if (shard_numel > 0) {
    if (shard_begin < 0 || shard_begin + shard_numel > m->padded_total)
      return st_error_set("internal: weight shard [%lld, %lld) outside the %lld padded "
                          "parameters", (long long)shard_begin,
                          (long long)(shard_begin + shard_numel), (long long)m->padded_total);
    m->shard_begin = shard_begin;
    m->shard_numel = shard_numel;
    const size_t nh = (size_t)head_numel(m), nb = (size_t)m->block_numel;
    pbytes = ((size_t)shard_numel + nh + 2 * nb) * m->es;
    m->shard_params = ops->alloc((size_t)shard_numel * m->es, "weights_shard");
    m->head_params = ops->alloc(nh * m->es, "weights_head");
    m->wbuf[0] = ops->alloc(nb * m->es, "weights_blocks");
    m->wbuf[1] = ops->alloc(nb * m->es, "weights_blocks");
    params_ok = m->shard_params && m->head_params && m->wbuf[0] && m->wbuf[1];
  } else if (lora_on(m)) {
    size_t bb = (size_t)m->base_tab.total * m->es, ab = (size_t)m->padded_total * m->es;
    if (m->lora.nf4_base) {
      uint64_t nb4, ns4;
      int64_t nbase;
      st_model_nf4_bytes(cfg, ops->dtype, &nb4, &ns4, &nbase);
      bb = (size_t)nbase * m->es;
      m->nf4 = calloc((size_t)(4 * (cfg->n_layer > 0 ? cfg->n_layer : 1)), sizeof *m->nf4);
      m->base_coff = malloc((size_t)m->base_tab.n * sizeof *m->base_coff);
      if (!m->nf4 || !m->base_coff) return st_error_set("out of host memory for the NF4 table");
      m->nf4_mem = ops->alloc(nb4 ? nb4 : 1, "weights_nf4");
      m->nf4_scratch = ops->alloc(ns4, "nf4_scratch");
      m->nf4_held = -1;
      pbytes = nb4 + ns4;
      char *at = m->nf4_mem;
      int64_t off = 0;
      for (int i = 0; i < m->base_tab.n && at; i++) {
        const st_tensor *t = &m->base_tab.t[i];
        int l, P = st_model_nf4_proj_of(t->name, &l);
        m->base_coff[i] = P < 0 ? off : -1;
        if (P < 0) {
          off += t->numel;
          continue;
        }
        st_nf4_carve(&m->nf4[4 * l + P], t->shape[0], t->shape[1], at);
        at += st_nf4_bytes(t->shape[0], t->shape[1]);
      }
    } else {
      pbytes = 0;
    }
    pbytes += bb + ab;
    m->base_params = ops->alloc(bb ? bb : 1, "weights_base");
    m->params = ops->alloc(ab, "lora_weights");
    params_ok = m->base_params && m->params && (!m->lora.nf4_base || (m->nf4_mem && m->nf4_scratch));
  } else {
    pbytes = (size_t)m->padded_total * m->es;
    m->params = ops->alloc(pbytes, "weights");
    params_ok = m->params != NULL;
  }
  if (grad_buckets) {
    const size_t nh = (size_t)head_numel(m), nb = (size_t)m->block_numel + 1;
    const int nbuckets = pad_multiple == 1 ? 1 : 2;
    gbytes = (nh + (size_t)nbuckets * nb) * sizeof(float);
    m->head_grads = ops->alloc(nh * sizeof(float), "grads_head");
    m->bucket[0] = ops->alloc(nb * sizeof(float), "grads_buckets");
    m->bucket[1] = nbuckets == 1 ? m->bucket[0] : ops->alloc(nb * sizeof(float), "grads_buckets");
  } else {
    gbytes = (size_t)m->padded_total * sizeof(float);
    m->grads = ops->alloc(gbytes, "grads_full");
  }
  int grads_ok = grad_buckets ? m->head_grads && m->bucket[0] && m->bucket[1] : m->grads != NULL;
  m->act_mem = ops->alloc(m->act_bytes, "activations");
  m->losses_host = calloc((size_t)B * T, sizeof(float));
  if (!params_ok || !grads_ok || !m->act_mem || !m->losses_host) {
    double mib = (pbytes + gbytes + (double)m->act_bytes) / 1048576.0;
    st_model_free(m);
    return st_error_set("cannot allocate %.1f MiB of %s memory for the model "
                        "(parameters, gradients, activations); lower --micro-batch or --seq-len",
                        mib, ops->name);
  }
  if (shard_numel > 0   ? bind_sharded_views(m)
      : lora_on(m)      ? bind_base_views(m)
                        : st_param_views_bind(cfg, &m->tab, m->params, m->es, &m->p))
    return -1;
  if (lora_on(m)) {
    /* no view into a base gradient: every base weight's gradient is NULL */
    m->g.h = calloc((size_t)(cfg->n_layer > 0 ? cfg->n_layer : 1), sizeof *m->g.h);
    if (!m->g.h) return st_error_set("out of host memory for gradient views");
  } else if (!grad_buckets) {
    if (st_param_views_bind(cfg, &m->tab, m->grads, sizeof(float), &m->g)) return -1;
  } else {
    /* Head tensors in head_grads (wte, wpe, then ln_f, lm_head); block
     * views point into a bucket and are rebound as each block's backward
     * starts. */
    m->g.h = calloc((size_t)(cfg->n_layer > 0 ? cfg->n_layer : 1), sizeof *m->g.h);
    if (!m->g.h) return st_error_set("out of host memory for gradient views");
    m->g.wte = head_grad_view(m, "wte.weight");
    m->g.wpe = head_grad_view(m, "wpe.weight");
    m->g.lnf_w = head_grad_view(m, "ln_f.weight");
    m->g.lnf_b = head_grad_view(m, "ln_f.bias");
    m->g.lm_head = head_grad_view(m, "lm_head.weight");
    for (int l = 0; l < cfg->n_layer; l++) bind_block_grads(m, l, m->bucket[l % 2]);
  }
  carver cv = {m->act_mem, 0, {0}};
  layout_acts(m, natt, &cv);
  if (m->rope_cs) {
    /* positions 0 .. T-1 of every forward; built once, on the host */
    const size_t bytes = (size_t)T * (size_t)st_model_head_dim(cfg) * sizeof(float);
    float *cs = malloc(bytes);
    if (!cs) {
      st_model_free(m);
      return st_error_set("cannot allocate %zu bytes of host memory for the RoPE table", bytes);
    }
    st_rope_table(cfg, T, cs);
    ops->to_device(m->rope_cs, cs, bytes);
    free(cs);
  }
  return 0;
}

int st_model_init(st_model *m, const st_model_config *cfg, const st_ops *ops, int B, int T,
                  int pad_multiple, st_recompute recompute) {
  return model_init(m, cfg, ops, B, T, pad_multiple, recompute, 0, 0, 0, NULL);
}

int st_model_init_lora(st_model *m, const st_model_config *cfg, const st_lora_config *lora,
                       const st_ops *ops, int B, int T, int pad_multiple, st_recompute recompute,
                       int buckets) {
  if (!lora || lora->rank < 1) return st_error_set("internal: st_model_init_lora without a rank");
  return model_init(m, cfg, ops, B, T, pad_multiple, recompute, buckets, 0, 0, lora);
}

int st_model_init_bucketed(st_model *m, const st_model_config *cfg, const st_ops *ops, int B,
                           int T, int pad_multiple, st_recompute recompute) {
  return model_init(m, cfg, ops, B, T, pad_multiple, recompute, 1, 0, 0, NULL);
}

int st_model_init_sharded(st_model *m, const st_model_config *cfg, const st_ops *ops, int B,
                          int T, int pad_multiple, st_recompute recompute, int64_t shard_begin,
                          int64_t shard_numel) {
  if (shard_numel < 1) return st_error_set("internal: an empty weight shard");
  return model_init(m, cfg, ops, B, T, pad_multiple, recompute, 1, shard_begin, shard_numel,
                    NULL);
}

void st_model_free(st_model *m) {
  st_param_views_free(&m->p);
  st_param_views_free(&m->g);
  st_param_table_free(&m->tab);
  st_param_table_free(&m->base_tab);
  st_lora_table_free(&m->ltab);
  free(m->lora_u);
  free(m->nf4);
  free(m->base_coff);
  if (m->ops) {
    m->ops->free(m->nf4_mem);
    m->ops->free(m->nf4_scratch);
    m->ops->free(m->base_params);
    m->ops->free(m->params);
    m->ops->free(m->grads);
    m->ops->free(m->act_mem);
    m->ops->free(m->head_grads);
    if (m->bucket[1] != m->bucket[0]) m->ops->free(m->bucket[1]);
    m->ops->free(m->bucket[0]);
    m->ops->free(m->shard_params);
    m->ops->free(m->head_params);
    m->ops->free(m->wbuf[0]);
    m->ops->free(m->wbuf[1]);
  }
  free(m->losses_host);
  free(m->blk);
  memset(m, 0, sizeof *m);
}
