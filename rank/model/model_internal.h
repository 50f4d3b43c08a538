/* model_internal.h - what the files of st_model share (model.c: the
 * schedule; model_layout.c: where each activation and view lives, and setup;
 * model_weights.c: weights in, out and drawn; model_lora.c: the adapter
 * path). Internal to rank/model/. */
#ifndef ST_MODEL_INTERNAL_H
#define ST_MODEL_INTERNAL_H

#include "rank/model/model.h"

/* The widths the description implies (cfg's derived fields filled). */
typedef struct {
  int C, NH, NKV, HD, QKV, F, FC; /* FC: mlp.fc's outputs, F or SwiGLU's 2F */
  int ln, rope, swiglu;           /* LayerNorm (else RMSNorm), rotary positions, SwiGLU */
} dims;

static inline dims dims_of(const st_model_config *c) {
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

static inline int lora_on(const st_model *m) { return m->lora.rank > 0; }
static inline int lora_has(const st_model *m, st_lora_target t) {
  return lora_on(m) && (m->lora.targets >> t & 1);
}
/* GPT-2 with an adapter on mlp.fc (up) or mlp.proj (down): the GELU runs
 * apart from its GEMMs, so the adapter's share lands before (up) or its
 * gradient after (down) the GELU; down then needs d(fch_act) [B,T,F]. */
static inline int lora_gelu_split(const st_model *m) {
  return m->cfg.mlp != ST_MLP_SWIGLU && (lora_has(m, ST_LORA_UP) || lora_has(m, ST_LORA_DOWN));
}

/* Flat offset of the first tensor after the blocks (ln_f). */
static inline int64_t lnf_begin(const st_model *m) {
  return m->block_begin + m->cfg.n_layer * m->block_numel;
}

/* Elements of the head gradient buffer (ZeRO 2): wte (+ wpe), then ln_f (+ lm_head). */
static inline int64_t head_numel(const st_model *m) {
  return m->block_begin + (m->tab.total - lnf_begin(m));
}

/* Bind block l's gradient views to a one-block bucket. */
static inline void bind_block_grads(st_model *m, int l, float *bucket) {
  st_param_block_bind(&m->tab, l, bucket, m->block_begin + (int64_t)l * m->block_numel,
                      sizeof(float), &m->g.h[l]);
}

/* QLoRA: which projection (st_lora_proj) base tensor `name` is, or -1 for
 * a tensor that stays in the storage dtype; *layer its block. */
int st_model_nf4_proj_of(const char *name, int *layer);

/* The weight of projection P (st_lora_proj) of block l for the GEMMs: the
 * storage-dtype view, or under QLoRA the NF4 weight dequantised into
 * nf4_scratch (kept there until another projection needs the scratch, so
 * the backward right after a forward of the same weight reuses it). */
const void *st_model_proj_w(st_model *m, int l, int P);

#endif
