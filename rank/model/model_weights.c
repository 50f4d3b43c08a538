/* model_weights.c - st_model's weights in and out (fp32 on the host, the
 * storage dtype on the backend; ZeRO 3's shard; a LoRA base, quantised to
 * NF4 under QLoRA) and the seeded initial draw. */
#include "rank/model/model_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/nf4.h"
#include "util/error.h"

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

/* src (backend memory, storage dtype) -> n fp32 host values. */
static int get_f32(const st_model *m, float *host, const void *src, size_t n) {
  const size_t bytes = n * m->es;
  void *staged = m->ops->dtype == ST_FP32 ? NULL : malloc(bytes ? bytes : 1);
  if (m->ops->dtype != ST_FP32 && !staged)
    return st_error_set("cannot allocate %zu bytes of host memory to convert the weights", bytes);
  m->ops->to_host(staged ? staged : host, src, bytes);
  if (staged) st_dtype_to_f32(m->ops->dtype, host, staged, n);
  free(staged);
  return 0;
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
  return put_f32(m, m->params, host, (size_t)m->padded_total);
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
    int l, P = st_model_nf4_proj_of(t->name, &l);
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
    int l, P = st_model_nf4_proj_of(t->name, &l);
    const void *src = P < 0 ? (const char *)m->base_params + (size_t)m->base_coff[i] * m->es
                            : st_model_proj_w(m, l, P);
    if (get_f32(m, host + t->offset, src, (size_t)t->numel)) return -1;
  }
  return 0;
}

int st_model_get_base_weights(const st_model *m, float *host) {
  if (!m->base_params) return st_error_set("internal: not a LoRA model");
  /* the scratch is a cache, not state: reading through it changes nothing observable */
  if (m->nf4) return get_nf4_base((st_model *)m, host);
  return get_f32(m, host, m->base_params, (size_t)m->base_tab.total);
}

int st_model_get_weights(const st_model *m, float *host) {
  if (m->shard_params)
    return st_error_set("internal: a ZeRO-3 model holds only its shard of the weights");
  return get_f32(m, host, m->params, (size_t)m->padded_total);
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
