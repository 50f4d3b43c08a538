/* model_lora.c - the LoRA adapter path: each adapter's forward and backward
 * around the base projection it rides on (see model_lora.h). */
#include "rank/model/model_lora.h"

#include <stdint.h>

#include "kernels/ops.h"
#include "rank/model/lora.h"

/* Slot i's dropout mask seed for this micro-step (m->lora_seed). */
static uint64_t lora_slot_seed(const st_model *m, int i) {
  return m->lora_seed ^ ((uint64_t)(i + 1) * 0xD1B54A32D192ED03ull);
}

/* Slot s's A or B in the working adapters (storage dtype). */
static const void *lora_w(const st_model *m, int64_t off) {
  return (const char *)m->params + (size_t)off * m->es;
}

/* Slot s's gradient of the element at flat offset off: in m->grads, or
 * (ZeRO 2) in the bucket of the slot's layer. */
static float *lora_g(const st_model *m, const st_lora_slot *s, int64_t off) {
  if (!m->head_grads) return m->grads + off;
  return m->bucket[s->layer % 2] + (off - (int64_t)s->layer * m->block_numel);
}

/* LoRA forward of layer l's adapters on projection proj: y [BT, proj_out]
 * += scale * (dropout(x) A^T) B^T on each adapter's columns, x [BT, in] the
 * projection's input; A dropout(x) kept in lora_u for backward. */
void st_model_lora_forward(st_model *m, int l, st_lora_proj proj, void *y, const void *x, int BT) {
  if (m->lora.rank <= 0) return;
  const st_ops *op = m->ops;
  const st_lora_table *lt = &m->ltab;
  const int r = m->lora.rank;
  const float scale = st_lora_scale(&m->lora), p = m->lora_dropout_on ? m->lora.dropout : 0.0f;
  for (int i = l * lt->per_layer; i < (l + 1) * lt->per_layer; i++) {
    const st_lora_slot *s = &lt->slot[i];
    if (s->proj != proj) continue;
    const void *xin = x;
    if (p > 0) {
      op->dropout(m->lora_x, x, (int64_t)BT * s->in, p, lora_slot_seed(m, i));
      xin = m->lora_x;
    }
    op->matmul_forward(m->lora_u[i], xin, lora_w(m, s->a_off), NULL, BT, s->in, r);
    op->matmul_forward(m->lora_s, m->lora_u[i], lora_w(m, s->b_off), NULL, BT, r, s->out);
    op->lora_add_cols(y, m->lora_s, scale, BT, s->proj_out, s->row0, s->out);
  }
}

/* LoRA backward of layer l's adapters on projection proj, after the base's
 * matmul_backward wrote dx [BT, in] from dy [BT, proj_out]: per adapter
 * dv = scale * dy[:, cols], dB += dv^T u, du = dv B, dA += du^T
 * dropout(x), and dx += dropout'(du A) (the same mask: dropout is linear). */
void st_model_lora_backward(st_model *m, int l, st_lora_proj proj, const void *dy, void *dx,
                          const void *x, int BT) {
  if (m->lora.rank <= 0) return;
  const st_ops *op = m->ops;
  const st_lora_table *lt = &m->ltab;
  const int r = m->lora.rank;
  const float scale = st_lora_scale(&m->lora), p = m->lora_dropout_on ? m->lora.dropout : 0.0f;
  for (int i = l * lt->per_layer; i < (l + 1) * lt->per_layer; i++) {
    const st_lora_slot *s = &lt->slot[i];
    if (s->proj != proj) continue;
    const int64_t nx = (int64_t)BT * s->in;
    op->lora_take_cols(m->lora_s, dy, scale, BT, s->proj_out, s->row0, s->out);
    op->matmul_backward(m->lora_du, lora_g(m, s, s->b_off), NULL, m->lora_s, m->lora_u[i],
                        lora_w(m, s->b_off), BT, r, s->out);
    const void *xin = x;
    if (p > 0) {
      op->dropout(m->lora_x, x, nx, p, lora_slot_seed(m, i));
      xin = m->lora_x;
    }
    op->matmul_backward(m->lora_s, lora_g(m, s, s->a_off), NULL, m->lora_du, xin,
                        lora_w(m, s->a_off), BT, s->in, r);
    if (p > 0) op->dropout(m->lora_s, m->lora_s, nx, p, lora_slot_seed(m, i));
    op->residual_forward(dx, dx, m->lora_s, nx);
  }
}
