/* nf4.c - NF4 quantisation and dequantisation on the host: the format of
 * kernels/nf4.h, the fp32 reference the CUDA kernels (kernels/cuda/nf4.cu)
 * match bit for bit. Built with -ffp-contract=off (CMakeLists.txt): the
 * dequantised absmax is a product and a sum rounded separately, as in
 * bitsandbytes and in the CUDA kernels' __fmul_rn/__fadd_rn; a fused
 * multiply-add would change low bits.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/nf4.h"
#include "kernels/nf4_tables.h"
#include "kernels/cpu/cpu_ops.h"

const float st_nf4_code[16] = {ST_NF4_CODE_VALUES};
const float st_nf4_dynamic_code[256] = {ST_NF4_DYNAMIC_CODE_VALUES};
static const float k_mid[15] = {ST_NF4_MID_VALUES};

static size_t round256(size_t b) { return (b + 255) & ~(size_t)255; }

st_nf4_sizes st_nf4_size(int64_t rows, int64_t cols) {
  st_nf4_sizes s;
  memset(&s, 0, sizeof s);
  s.n = rows * cols;
  s.blocks = (s.n + ST_NF4_BLOCK - 1) / ST_NF4_BLOCK;
  s.blocks2 = (s.blocks + ST_NF4_BLOCK2 - 1) / ST_NF4_BLOCK2;
  s.code_bytes = (size_t)((s.n + 1) / 2);
  s.absmax_code_bytes = (size_t)s.blocks;
  s.absmax2_bytes = (size_t)s.blocks2 * sizeof(float);
  s.payload = s.code_bytes + s.absmax_code_bytes + s.absmax2_bytes + sizeof(float);
  s.bytes = round256(s.code_bytes) + round256(s.absmax_code_bytes) + round256(s.absmax2_bytes);
  return s;
}

size_t st_nf4_bytes(int64_t rows, int64_t cols) { return st_nf4_size(rows, cols).bytes; }

size_t st_nf4_quantize_scratch_bytes(int64_t rows, int64_t cols) {
  const st_nf4_sizes s = st_nf4_size(rows, cols);
  return round256((size_t)s.blocks * sizeof(float)) + 256;
}

size_t st_nf4_scratch_bytes(int64_t rows, int64_t cols, st_dtype dt) {
  const size_t deq = round256((size_t)(rows * cols) * st_dtype_size(dt));
  const size_t qs = st_nf4_quantize_scratch_bytes(rows, cols);
  return deq > qs ? deq : qs;
}

void st_nf4_carve(st_nf4 *q, int64_t rows, int64_t cols, void *mem) {
  const st_nf4_sizes s = st_nf4_size(rows, cols);
  uint8_t *p = mem;
  q->rows = rows;
  q->cols = cols;
  q->codes = p;
  q->absmax_codes = p + round256(s.code_bytes);
  q->absmax2 = (float *)(void *)(p + round256(s.code_bytes) + round256(s.absmax_code_bytes));
  q->offset = 0.0f;
}

float st_nf4_mean(const float *absmax, int64_t nb) {
  if (nb <= 0) return 0.0f;
  double part[ST_NF4_BLOCK2];
  for (int t = 0; t < ST_NF4_BLOCK2; t++) {
    double acc = 0.0;
    for (int64_t i = t; i < nb; i += ST_NF4_BLOCK2) acc += (double)absmax[i];
    part[t] = acc;
  }
  for (int h = ST_NF4_BLOCK2 / 2; h > 0; h >>= 1)
    for (int t = 0; t < h; t++) part[t] += part[t + h];
  return (float)(part[0] / (double)nb);
}

/* First level: absmax[b] and the packed indices; -1 on a non-finite w. */
static int quantize_first(st_nf4 *q, const float *w, float *absmax) {
  const st_nf4_sizes s = st_nf4_size(q->rows, q->cols);
  int bad = 0;
#pragma omp parallel for reduction(| : bad)
  for (int64_t b = 0; b < s.blocks; b++) {
    const int64_t i0 = b * ST_NF4_BLOCK;
    const int64_t i1 = i0 + ST_NF4_BLOCK < s.n ? i0 + ST_NF4_BLOCK : s.n;
    float m = 0.0f;
    for (int64_t i = i0; i < i1; i++) {
      if (!isfinite(w[i])) bad = 1;
      m = fmaxf(m, fabsf(w[i]));
    }
    absmax[b] = m;
    /* bitsandbytes: w * (1 / max(absmax, 1e-38)), so an all-zero block
     * gives 0 * 1e38 = 0, the index of 0.0 */
    const float r = 1.0f / fmaxf(m, 1e-38f);
    for (int64_t i = i0; i < i1; i += 2) { /* i0 is even: pairs never straddle blocks */
      const uint8_t hi = st_nf4_index(w[i] * r, k_mid);
      const uint8_t lo = i + 1 < i1 ? st_nf4_index(w[i + 1] * r, k_mid) : ST_NF4_ZERO_INDEX;
      q->codes[i / 2] = (uint8_t)(hi << 4 | lo);
    }
  }
  return bad ? -1 : 0;
}

/* Second level: absmax - offset in blocks of 256, 8-bit dynamic codes. */
static void quantize_second(st_nf4 *q, const float *absmax, int64_t nb) {
  const int64_t ng = (nb + ST_NF4_BLOCK2 - 1) / ST_NF4_BLOCK2;
#pragma omp parallel for
  for (int64_t g = 0; g < ng; g++) {
    const int64_t b0 = g * ST_NF4_BLOCK2;
    const int64_t b1 = b0 + ST_NF4_BLOCK2 < nb ? b0 + ST_NF4_BLOCK2 : nb;
    float m = 0.0f;
    for (int64_t b = b0; b < b1; b++) m = fmaxf(m, fabsf(absmax[b] - q->offset));
    q->absmax2[g] = m;
    for (int64_t b = b0; b < b1; b++) {
      /* m == 0: every value equals the offset; code 127 is 0.0 exactly */
      const float v = m > 0.0f ? (absmax[b] - q->offset) / m : 0.0f;
      q->absmax_codes[b] = st_nf4_dynamic_index(v, st_nf4_dynamic_code);
    }
  }
}

static int quantize(st_nf4 *q, const float *w, const float *offset) {
  const st_nf4_sizes s = st_nf4_size(q->rows, q->cols);
  float *absmax = malloc((size_t)(s.blocks ? s.blocks : 1) * sizeof(float));
  if (!absmax) return -1;
  int rc = quantize_first(q, w, absmax);
  if (rc == 0) {
    q->offset = offset ? *offset : st_nf4_mean(absmax, s.blocks);
    quantize_second(q, absmax, s.blocks);
  }
  free(absmax);
  return rc;
}

int st_nf4_quantize(st_nf4 *q, const float *w) { return quantize(q, w, NULL); }

int st_nf4_quantize_with_offset(st_nf4 *q, const float *w, float offset) {
  return quantize(q, w, &offset);
}

float st_nf4_block_absmax(const st_nf4 *q, int64_t b) {
  const float scaled = st_nf4_dynamic_code[q->absmax_codes[b]] * q->absmax2[b / ST_NF4_BLOCK2];
  return scaled + q->offset;
}

void st_nf4_dequantize(const st_nf4 *q, float *out) {
  const st_nf4_sizes s = st_nf4_size(q->rows, q->cols);
#pragma omp parallel for
  for (int64_t b = 0; b < s.blocks; b++) {
    const float a = st_nf4_block_absmax(q, b);
    const int64_t i0 = b * ST_NF4_BLOCK;
    const int64_t i1 = i0 + ST_NF4_BLOCK < s.n ? i0 + ST_NF4_BLOCK : s.n;
    for (int64_t i = i0; i < i1; i++) {
      const uint8_t byte = q->codes[i / 2];
      out[i] = st_nf4_code[(i & 1) ? (byte & 15) : (byte >> 4)] * a;
    }
  }
}

/* The CPU op table's entries (kernels/ops.h): its storage dtype is fp32 and
 * its memory the host's, so they are the reference functions themselves. */
void cpu_nf4_dequantize(void *dst, const st_nf4 *q) { st_nf4_dequantize(q, dst); }

int cpu_nf4_quantize(st_nf4 *q, const void *src, void *workspace) {
  (void)workspace;
  return st_nf4_quantize(q, src);
}
