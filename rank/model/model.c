/* model.c - the order of ops in forward and backward, and where each
 * activation lives, for the architecture st_model_config describes.
 * Pre-norm blocks:
 *   x = x + proj(attn(rope(qkv(norm_1(x)))));  x = x + mlp.proj(act(mlp.fc(norm_2(x))))
 * then norm_f and the LM head. GPT-2 (Radford et al. 2019): LayerNorm,
 * learned positions added by the encoder (no rope), GELU, the head tied to
 * wte. Llama (Touvron et al. 2023) / Qwen2: RMSNorm, RoPE on q and k, GQA,
 * SwiGLU (act(gate | up) = silu(gate) * up), the head tied or its own. */
#include "rank/model/model.h"
#include "rank/model/model_lora.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/nf4.h"
#include "rank/model/rope.h"
#include "util/envparse.h"
#include "util/error.h"

/* The widths the description implies (cfg's derived fields filled). */
typedef struct {
  int C, NH, NKV, HD, QKV, F, FC; /* FC: mlp.fc's outputs, F or SwiGLU's 2F */
  int ln, rope, swiglu;           /* LayerNorm (else RMSNorm), rotary positions, SwiGLU */
} dims;

static dims dims_of(const st_model_config *c) {
  dims d;
  d.C = c->n_embd;
  d.NH = c->n_head;
  d.NKV = c->n_kv_head;
  d.HD = st_model_head_dim(c);
  d.QKV = st_model_qkv_dim(c);
  d.F = c->ffn_dim;
  d.swiglu = c->mlp == ST_MLP_SWIGLU;
  d.FC = d.swiglu ? 2 * d.F : d.F;
  d.ln = c->norm == ST_NORM_LAYERNORM;
  d.rope = c->pos == ST_POS_ROPE;
  return d;
}

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
  int64_t floor_rows = (int64_t)(ST_HEAD_CHUNK_MAX_BYTES / row) / 128 * 128;
  if (floor_rows > ST_HEAD_CHUNK_MIN_ROWS) floor_rows = ST_HEAD_CHUNK_MIN_ROWS;
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

static void *take(carver *cv, int64_t n, size_t elem, int part) {
  const size_t start = cv->off;
  cv->off = (cv->off + 255) & ~(size_t)255; /* vector loads and cuBLASLt like alignment */
  void *p = cv->base ? cv->base + cv->off : NULL;
  cv->off += (size_t)n * elem;
  cv->part[part] += cv->off - start;
  return p;
}

static int lora_on(const st_model *m) { return m->lora.rank > 0; }
static int lora_has(const st_model *m, st_lora_target t) {
  return lora_on(m) && (m->lora.targets >> t & 1);
}
/* GPT-2 with an adapter on mlp.fc (up) or mlp.proj (down): the GELU runs
 * apart from its GEMMs, so the adapter's share lands before (up) or its
 * gradient after (down) the GELU; down then needs d(fch_act) [B,T,F]. */
static int lora_gelu_split(const st_model *m) {
  return m->cfg.mlp != ST_MLP_SWIGLU && (lora_has(m, ST_LORA_UP) || lora_has(m, ST_LORA_DOWN));
}

/* QLoRA: which projection (st_lora_proj) base tensor `name` is, or -1 for
 * a tensor that stays in the storage dtype; *layer its block. */
static int nf4_proj_of(const char *name, int *layer) {
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
    if (nf4_proj_of(t->name, &l) < 0) {
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

/* The weight of projection P (st_lora_proj) of block l for the GEMMs: the
 * storage-dtype view, or under QLoRA the NF4 weight dequantised into
 * nf4_scratch (kept there until another projection needs the scratch, so
 * the backward right after a forward of the same weight reuses it). */
static const void *proj_w(st_model *m, int l, int P) {
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
   * blk[n_layer], instead of once per layer. selective shares the norm and
   * MLP activation outputs; full shares everything but the block output,
   * which is the next block's input. The two projections' outputs are shared
   * under every policy: each is read only by the residual add that follows
   * it (backward needs their inputs, never them), so one copy serves all
   * layers (GPT-2: 2 of 18 B*T*C-sized tensors per block). X(field, elements, element size,
   * exists?, shared?, part when kept per layer) */
  const int sel = m->recompute != ST_RECOMPUTE_NONE, full = m->recompute == ST_RECOMPUTE_FULL;
#define BLOCK_FIELDS(X)                                                                      \
  X(ln1, BT * C, es, 1, sel, P_BLOCKS) X(ln1_mean, BT, f4, d.ln, full, P_BLOCKS)               \
  X(ln1_rstd, BT, f4, 1, full, P_BLOCKS) X(qkv, BT * d.QKV, es, 1, full, P_BLOCKS)             \
  X(atty, BT * C, es, 1, full, P_BLOCKS) X(att, natt, f4, 1, full, P_ATTENTION)                \
  X(attproj, BT * C, es, 1, 1, P_BLOCKS) X(residual2, BT * C, es, 1, full, P_BLOCKS)        \
  X(ln2, BT * C, es, 1, sel, P_BLOCKS) X(ln2_mean, BT, f4, d.ln, full, P_BLOCKS)               \
  X(ln2_rstd, BT, f4, 1, full, P_BLOCKS) X(fch, BT * d.FC, es, 1, full, P_BLOCKS)              \
  X(fch_act, BT * d.F, es, 1, sel, P_BLOCKS) X(fcproj, BT * C, es, 1, 1, P_BLOCKS)
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
  m->logits = take(cv, (int64_t)m->head_rows * c->padded_vocab_size, es, P_LOGITS);
  m->losses = take(cv, BT, f4, P_HEAD);
  m->dres = take(cv, BT * C, es, P_GRADS);
  m->dln = take(cv, BT * C, es, P_GRADS);
  m->datty = take(cv, BT * C, es, P_GRADS);
  m->dqkv = take(cv, BT * d.QKV, es, P_GRADS);
  m->dfch = take(cv, BT * d.FC, es, P_GRADS);
  m->dfact = d.swiglu || lora_has(m, ST_LORA_DOWN) ? take(cv, BT * d.F, es, P_GRADS) : NULL;
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

/* Flat offset of the first tensor after the blocks (ln_f). */
static int64_t lnf_begin(const st_model *m) {
  return m->block_begin + m->cfg.n_layer * m->block_numel;
}

/* Elements of the head gradient buffer (ZeRO 2): wte (+ wpe), then ln_f (+ lm_head). */
static int64_t head_numel(const st_model *m) {
  return m->block_begin + (m->tab.total - lnf_begin(m));
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

/* Bind block l's gradient views to a one-block bucket. */
static void bind_block_grads(st_model *m, int l, float *bucket) {
  st_param_block_bind(&m->tab, l, bucket, m->block_begin + (int64_t)l * m->block_numel,
                      sizeof(float), &m->g.h[l]);
}

/* grad_buckets: ZeRO 2's gradient storage (head_grads and two one-block
 * buckets) instead of a full fp32 vector, which is never allocated.
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
        int l, P = nf4_proj_of(t->name, &l);
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

/* ZeRO 3: the head tensors and this rank's shard of host[padded_total]. */
static int set_sharded_weights(st_model *m, const float *host) {
  const int64_t nf = m->block_begin, lnf = lnf_begin(m), nt = m->tab.total - lnf;
  const size_t nh = (size_t)(nf + nt), ns = (size_t)m->shard_numel;
  const size_t cap = nh > ns ? nh : ns;
  void *staged = malloc(cap * m->es);
  float *f32 = malloc(cap * sizeof(float));
  if (!staged || !f32) {
    free(staged);
    free(f32);
    return st_error_set("cannot allocate %zu bytes of host memory to convert the weights",
                        cap * (m->es + sizeof(float)));
  }
  memcpy(f32, host, (size_t)nf * sizeof(float));
  memcpy(f32 + nf, host + lnf, (size_t)nt * sizeof(float));
  st_dtype_from_f32(m->ops->dtype, staged, f32, nh);
  m->ops->to_device(m->head_params, staged, nh * m->es);
  st_dtype_from_f32(m->ops->dtype, staged, host + m->shard_begin, ns);
  m->ops->to_device(m->shard_params, staged, ns * m->es);
  free(staged);
  free(f32);
  st_model_weights_changed(m);
  return 0;
}

int st_model_set_weights(st_model *m, const float *host) {
  if (m->shard_params) return set_sharded_weights(m, host);
  size_t n = (size_t)m->padded_total, bytes = n * m->es;
  void *staged = m->ops->dtype == ST_FP32 ? NULL : malloc(bytes);
  if (m->ops->dtype != ST_FP32 && !staged)
    return st_error_set("cannot allocate %zu bytes of host memory to convert the weights", bytes);
  if (staged) st_dtype_from_f32(m->ops->dtype, staged, host, n);
  m->ops->to_device(m->params, staged ? staged : host, bytes);
  free(staged);
  return 0;
}

/* n fp32 host values -> dst (backend memory, storage dtype). */
static int put_f32(const st_model *m, void *dst, const float *host, size_t n) {
  const size_t bytes = n * m->es;
  void *staged = m->ops->dtype == ST_FP32 ? NULL : malloc(bytes ? bytes : 1);
  if (m->ops->dtype != ST_FP32 && !staged)
    return st_error_set("cannot allocate %zu bytes of host memory to convert the weights", bytes);
  if (staged) st_dtype_from_f32(m->ops->dtype, staged, host, n);
  m->ops->to_device(dst, staged ? staged : host, bytes);
  free(staged);
  return 0;
}

int st_model_set_base_weights(st_model *m, const float *host) {
  if (!m->base_params) return st_error_set("internal: not a LoRA model");
  if (!m->nf4) return put_f32(m, m->base_params, host, (size_t)m->base_tab.total);
  /* QLoRA: each projection goes through the scratch in the storage dtype
   * (what a bf16 base would hold) and is quantised there on the backend;
   * the 16-bit copy never outlives its quantisation. */
  m->nf4_held = -1;
  for (int i = 0; i < m->base_tab.n; i++) {
    const st_tensor *t = &m->base_tab.t[i];
    const float *src = host + t->offset;
    int l, P = nf4_proj_of(t->name, &l);
    if (P < 0) {
      if (put_f32(m, (char *)m->base_params + (size_t)m->base_coff[i] * m->es, src,
                  (size_t)t->numel))
        return -1;
      continue;
    }
    st_nf4 *q = &m->nf4[4 * l + P];
    if (put_f32(m, m->nf4_scratch, src, (size_t)t->numel)) return -1;
    void *ws = (char *)m->nf4_scratch + st_nf4_scratch_bytes(q->rows, q->cols, m->ops->dtype);
    if (m->ops->nf4_quantize(q, m->nf4_scratch, ws))
      return st_error_setc(ST_EXIT_CHECKPOINT, "base tensor %s holds a NaN or an infinity: it cannot be quantised "
                           "to NF4; check the base's weights", t->name);
  }
  return 0;
}

/* QLoRA's get: each tensor in turn, the projections dequantised. */
static int get_nf4_base(st_model *m, float *host) {
  for (int i = 0; i < m->base_tab.n; i++) {
    const st_tensor *t = &m->base_tab.t[i];
    int l, P = nf4_proj_of(t->name, &l);
    const void *src = P < 0 ? (const char *)m->base_params + (size_t)m->base_coff[i] * m->es
                            : proj_w(m, l, P);
    const size_t n = (size_t)t->numel, bytes = n * m->es;
    void *staged = m->ops->dtype == ST_FP32 ? NULL : malloc(bytes ? bytes : 1);
    if (m->ops->dtype != ST_FP32 && !staged)
      return st_error_set("cannot allocate %zu bytes of host memory to convert the weights",
                          bytes);
    m->ops->to_host(staged ? staged : host + t->offset, src, bytes);
    if (staged) st_dtype_to_f32(m->ops->dtype, host + t->offset, staged, n);
    free(staged);
  }
  return 0;
}

int st_model_get_base_weights(const st_model *m, float *host) {
  if (!m->base_params) return st_error_set("internal: not a LoRA model");
  /* the scratch is a cache, not state: reading through it changes nothing observable */
  if (m->nf4) return get_nf4_base((st_model *)m, host);
  size_t n = (size_t)m->base_tab.total, bytes = n * m->es;
  void *staged = m->ops->dtype == ST_FP32 ? NULL : malloc(bytes ? bytes : 1);
  if (m->ops->dtype != ST_FP32 && !staged)
    return st_error_set("cannot allocate %zu bytes of host memory to convert the weights", bytes);
  m->ops->to_host(staged ? staged : host, m->base_params, bytes);
  if (staged) st_dtype_to_f32(m->ops->dtype, host, staged, n);
  free(staged);
  return 0;
}

int st_model_get_weights(const st_model *m, float *host) {
  if (m->shard_params)
    return st_error_set("internal: a ZeRO-3 model holds only its shard of the weights");
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
    m->ops->free(m->bucket[0]);
    m->ops->free(m->bucket[1]);
    m->ops->free(m->shard_params);
    m->ops->free(m->head_params);
    m->ops->free(m->wbuf[0]);
    m->ops->free(m->wbuf[1]);
  }
  free(m->losses_host);
  free(m->blk);
  memset(m, 0, sizeof *m);
}

/* Draws run in chunks of INIT_CHUNK values, each from its own generator
 * seeded by (key, tensor, chunk): the weights depend on the seed alone, not
 * on the thread count, and every core draws. Drawn serially, an 8B model's
 * 8e9 Box-Muller values took about 160 s of setup on one core. */
#define INIT_CHUNK ((int64_t)1 << 20)

static void fill_normal(float *x, int64_t n, float std, uint64_t key, int tensor) {
  const int64_t chunks = (n + INIT_CHUNK - 1) / INIT_CHUNK;
#pragma omp parallel for schedule(dynamic) if (chunks > 1)
  for (int64_t c = 0; c < chunks; c++) {
    st_rng r;
    st_rng_seed(&r, key ^ ((uint64_t)tensor << 32 | (uint64_t)c));
    const int64_t end = c * INIT_CHUNK + INIT_CHUNK < n ? c * INIT_CHUNK + INIT_CHUNK : n;
    for (int64_t i = c * INIT_CHUNK; i < end; i++) x[i] = std * st_rng_normal(&r);
  }
}

/* The initialisation st_model_draw_weights documents, over table tab into
 * host[tab->total] (already zeroed). */
static void draw_table(const st_model_config *c, const st_param_table *tab, st_rng *rng,
                       float *host) {
  /* GPT-2 scales the residual projections by 1/sqrt(2L) (Radford et al.
   * 2019, sec. 2.3); Hugging Face's Llama and Qwen2 draw every matrix at
   * initializer_range (0.02) alike. */
  const int scaled_proj = c->arch == ST_ARCH_GPT2;
  const float std = 0.02f, proj_std = scaled_proj ? 0.02f / sqrtf(2.0f * c->n_layer) : std;
  const uint64_t key = st_rng_next(rng); /* one draw from the run's generator keys them all */
  for (int i = 0; i < tab->n; i++) {
    const st_tensor *t = &tab->t[i];
    float *x = host + t->offset;
    if (t->ndim == 2) {
      int is_proj = strstr(t->name, "attn.proj.weight") || strstr(t->name, "mlp.proj.weight");
      int64_t n = t->numel;
      if (strcmp(t->name, "wte.weight") == 0 || strcmp(t->name, "lm_head.weight") == 0)
        n = (int64_t)c->vocab_size * c->n_embd; /* padded rows stay 0 */
      fill_normal(x, n, is_proj ? proj_std : std, key, i);
    } else if (strstr(t->name, "ln_") && strstr(t->name, ".weight")) {
      for (int64_t k = 0; k < t->numel; k++) x[k] = 1.0f; /* LayerNorm and RMSNorm gains */
    }
  }
}

int st_model_draw_weights(const st_model *m, st_rng *rng, float *host) {
  memset(host, 0, (size_t)m->padded_total * sizeof(float));
  if (lora_on(m)) {
    st_lora_init(&m->ltab, host, rng);
    return 0;
  }
  draw_table(&m->cfg, &m->tab, rng, host);
  return 0;
}

int st_model_draw_base(const st_model *m, st_rng *rng, float *host) {
  if (!lora_on(m)) return st_error_set("internal: st_model_draw_base of a model without LoRA");
  memset(host, 0, (size_t)m->base_tab.total * sizeof(float));
  draw_table(&m->cfg, &m->base_tab, rng, host);
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
  op->matmul_forward(a->qkv, a->ln1, proj_w(m, l, 0), w->qkv_b, BT, C, d.QKV);
  st_model_lora_forward(m, l, ST_LORA_PROJ_QKV, a->qkv, a->ln1, BT);
  if (d.rope) op->rope_forward(a->qkv, m->rope_cs, B, T, 0, d.NH, d.NKV, d.HD);
  op->attention_forward(a->atty, a->att, a->qkv, B, T, C, d.NH, d.NKV);
  op->matmul_forward(a->attproj, a->atty, proj_w(m, l, 1), w->attproj_b, BT, C, C);
  st_model_lora_forward(m, l, ST_LORA_PROJ_ATTN, a->attproj, a->atty, BT);
  op->residual_forward(a->residual2, x, a->attproj, (int64_t)BT * C);
  norm_forward(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->residual2, w->ln2_w, w->ln2_b, BT);
  if (d.swiglu) {
    op->matmul_forward(a->fch, a->ln2, proj_w(m, l, 2), w->fc_b, BT, C, d.FC);
    st_model_lora_forward(m, l, ST_LORA_PROJ_FC, a->fch, a->ln2, BT);
    op->swiglu_forward(a->fch_act, a->fch, BT, d.F);
  } else if (m->recompute == ST_RECOMPUTE_SELECTIVE || lora_gelu_split(m)) {
    /* Selective recompute rebuilds the GELU output from the stored (rounded)
     * fch with gelu_forward; forward must produce it the same way, not in
     * the GEMM epilogue from the unrounded sum, or backward would see other
     * values than the loss was computed with. */
    op->matmul_forward(a->fch, a->ln2, proj_w(m, l, 2), w->fc_b, BT, C, d.F);
    st_model_lora_forward(m, l, ST_LORA_PROJ_FC, a->fch, a->ln2, BT);
    op->gelu_forward(a->fch_act, a->fch, (int64_t)BT * d.F);
  } else {
    op->matmul_gelu_forward(a->fch_act, a->fch, a->ln2, proj_w(m, l, 2), w->fc_b, BT, C, d.F);
  }
  if (recompute) return; /* an adapter's A x (lora_u) is kept under every policy */
  op->matmul_forward(a->fcproj, a->fch_act, proj_w(m, l, 3), w->fcproj_b, BT, d.F, C);
  st_model_lora_forward(m, l, ST_LORA_PROJ_MLP, a->fcproj, a->fch_act, BT);
  op->residual_forward(a->residual3, a->residual2, a->fcproj, (int64_t)BT * C);
}

/* Rebuild what the recompute policy did not keep for block l's backward:
 * full reruns the block from its input up to the down projection;
 * selective reruns the two norms and the
 * MLP activation (GELU or SwiGLU), whose inputs were kept. */
static void block_recompute(st_model *m, int l, const void *x, int B, int T) {
  const st_ops *op = m->ops;
  const dims d = dims_of(&m->cfg);
  const int BT = B * T;
  st_block_acts *a = &m->blk[l];
  const st_block_params *w = &m->p.h[l];
  if (m->recompute == ST_RECOMPUTE_FULL) {
    block_forward(m, l, x, B, T, 1);
  } else if (m->recompute == ST_RECOMPUTE_SELECTIVE) {
    norm_forward(m, a->ln1, a->ln1_mean, a->ln1_rstd, x, w->ln1_w, w->ln1_b, BT);
    norm_forward(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->residual2, w->ln2_w, w->ln2_b, BT);
    if (d.swiglu)
      op->swiglu_forward(a->fch_act, a->fch, BT, d.F);
    else
      op->gelu_forward(a->fch_act, a->fch, (int64_t)BT * d.F);
  }
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
                          proj_w(m, l, 3), BT, d.F, C);
      st_model_lora_backward(m, l, ST_LORA_PROJ_MLP, m->dres, m->dfact, a->fch_act, BT);
      op->swiglu_backward(m->dfch, m->dfact, a->fch, BT, d.F);
    } else if (lora_has(m, ST_LORA_DOWN)) {
      /* the adapter's share of d(fch_act) joins before the GELU's backward */
      op->matmul_backward(m->dfact, gw->fcproj_w, gw->fcproj_b, m->dres, a->fch_act,
                          proj_w(m, l, 3), BT, d.F, C);
      st_model_lora_backward(m, l, ST_LORA_PROJ_MLP, m->dres, m->dfact, a->fch_act, BT);
      op->gelu_backward(m->dfch, a->fch, m->dfact, (int64_t)BT * d.F);
    } else {
      op->matmul_backward_gelu(m->dfch, gw->fcproj_w, gw->fcproj_b, m->dres, a->fch_act,
                               proj_w(m, l, 3), a->fch, BT, d.F, C);
    }
    op->matmul_backward(m->dln, gw->fc_w, gw->fc_b, m->dfch, a->ln2, proj_w(m, l, 2), BT, C,
                        d.FC);
    st_model_lora_backward(m, l, ST_LORA_PROJ_FC, m->dfch, m->dln, a->ln2, BT);
    norm_backward(m, m->dres, gw->ln2_w, gw->ln2_b, m->dln, a->residual2, w->ln2_w, a->ln2_mean,
                  a->ln2_rstd, BT);

    op->matmul_backward(m->datty, gw->attproj_w, gw->attproj_b, m->dres, a->atty,
                        proj_w(m, l, 1), BT, C, C);
    st_model_lora_backward(m, l, ST_LORA_PROJ_ATTN, m->dres, m->datty, a->atty, BT);
    op->attention_backward(m->dqkv, m->datt, m->datty, a->qkv, a->atty, a->att, B, T, C, d.NH,
                           d.NKV);
    if (d.rope) op->rope_backward(m->dqkv, m->rope_cs, B, T, d.NH, d.NKV, d.HD);
    op->matmul_backward(m->dln, gw->qkv_w, gw->qkv_b, m->dqkv, a->ln1, proj_w(m, l, 0), BT, C,
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
  if (!lora_on(m)) op->encoder_backward(g->wte, g->wpe, m->dres, inp, B, T, C);
  if (h) {
    const int64_t lnf = lnf_begin(m);
    const float *head = m->head_grads ? m->head_grads : m->grads;
    h->ready(h->ctx, head, 0, m->block_begin, 2);
    h->ready(h->ctx, head + (m->head_grads ? m->block_begin : lnf), lnf, m->tab.total, 3);
  }
#undef zero
}
