/* test_optimizer.c - st_adamw_range's grouping of tensors into
 * adamw_update_segments calls (rank/optim/optimizer.c).
 *
 * The CUDA backend updates up to ST_ADAMW_SEGS tensors per launch; the
 * kernel itself is checked on the GPU (test_cuda_ops). What is checked here,
 * with a CPU stand-in for the segmented op, is the host side: for a model
 * of more than two groups' worth of tensors and for every rank's ZeRO range
 * at several world sizes (boundaries cutting tensors anywhere), the
 * segmented path must give the per-tensor path's master weights, working
 * copy and moments bit for bit, with segments that are non-empty, rising,
 * ending at n, at most ST_ADAMW_SEGS per call, and carrying each tensor's
 * weight decay.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/master_split.h"
#include "kernels/ops.h"
#include "rank/model/config.h"
#include "rank/optim/optimizer.h"
#include "rank/model/params.h"
#include "rank/optim/partition.h"

static int calls;

/* The contract of adamw_update_segments, checked, then carried out with the
 * CPU's per-range update. */
static void segments_on_cpu(float *p, const void *g, st_dtype gdt, float *m, float *v,
                            int64_t n, const int64_t *seg_end, const float *seg_wd, int nseg,
                            float lr, float b1, float b2, float eps, float grad_scale, int64_t t,
                            void *work) {
  calls++;
  assert_true(nseg >= 1 && nseg <= ST_ADAMW_SEGS);
  assert_int_equal(seg_end[nseg - 1], n);
  int64_t b = 0;
  for (int k = 0; k < nseg; k++) {
    assert_true(seg_end[k] > b);
    st_ops_cpu()->adamw_update(p + b, (const char *)g + (size_t)b * st_dtype_size(gdt), gdt,
                               m + b, v + b, seg_end[k] - b, lr, b1, b2, eps, seg_wd[k],
                               grad_scale, t, work ? (float *)work + b : NULL);
    b = seg_end[k];
  }
}

static float *filled(int64_t n, unsigned seed, float scale, int positive) {
  float *x = malloc((size_t)n * sizeof *x);
  assert_non_null(x);
  for (int64_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    float u = (float)(seed >> 8) / (float)(1u << 24) - 0.5f;
    x[i] = positive ? u * u * scale : u * scale;
  }
  return x;
}

/* The tests' model: 24 layers of width 8, 4 + 12 x 24 = 292 tensors (more
 * than two groups of ST_ADAMW_SEGS), and their AdamW settings. */
static void table_24_layers(st_param_table *tab) {
  st_model_config cfg = {.n_layer = 24, .n_head = 2, .n_embd = 8, .block_size = 4,
                         .vocab_size = 21};
  assert_int_equal(st_model_validate(&cfg), 0);
  assert_int_equal(st_param_table_build(&cfg, tab), 0);
}
static const st_optim_config k_optim = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                                        .weight_decay = 0.1f, .grad_clip = 1.0f};

static void test_grouping(void **state) {
  (void)state;
  /* 24 layers: 4 + 12 x 24 = 292 tensors, three groups of at most 128 */
  st_param_table tab;
  table_24_layers(&tab);
  assert_true(tab.n > 2 * ST_ADAMW_SEGS);
  const int64_t P = tab.total;
  const st_optim_config o = k_optim;
  float *p0 = filled(P, 1, 2.0f, 0), *g = filled(P, 2, 1.0f, 0);
  float *m0 = filled(P, 3, 0.2f, 0), *v0 = filled(P, 4, 0.1f, 1);
  st_ops seg = *st_ops_cpu();
  seg.adamw_update_segments = segments_on_cpu;
  assert_null(st_ops_cpu()->adamw_update_segments); /* the CPU loops per tensor */

  const int worlds[] = {1, 2, 3, 5, 7};
  for (size_t wi = 0; wi < sizeof worlds / sizeof *worlds; wi++) {
    for (int r = 0; r < worlds[wi]; r++) {
      st_partition part;
      st_partition_make(P, r, worlds[wi], &part);
      const int64_t b = part.begin, e = part.end, n = e - b;
      if (n <= 0) continue;
      float *want[4], *got[4]; /* master, work, m, v */
      for (int k = 0; k < 2; k++) {
        float **x = k ? got : want;
        x[0] = malloc((size_t)n * 4), x[1] = calloc((size_t)n, 4);
        x[2] = malloc((size_t)n * 4), x[3] = malloc((size_t)n * 4);
        memcpy(x[0], p0 + b, (size_t)n * 4);
        memcpy(x[2], m0 + b, (size_t)n * 4);
        memcpy(x[3], v0 + b, (size_t)n * 4);
      }
      st_adamw_range(st_ops_cpu(), &tab, &o, o.lr, 0.7f, 3, want[0], want[1], 4, g + b, ST_FP32,
                     want[2], want[3], b, e);
      calls = 0;
      st_adamw_range(&seg, &tab, &o, o.lr, 0.7f, 3, got[0], got[1], 4, g + b, ST_FP32, got[2],
                     got[3], b, e);
      /* one call per ST_ADAMW_SEGS tensors the range touches */
      int touched = 0;
      for (int i = 0; i < tab.n; i++)
        touched += tab.t[i].offset < e && tab.t[i].offset + tab.t[i].numel > b;
      assert_int_equal(calls, (touched + ST_ADAMW_SEGS - 1) / ST_ADAMW_SEGS);
      for (int k = 0; k < 4; k++) {
        assert_memory_equal(want[k], got[k], (size_t)n * 4);
        free(want[k]), free(got[k]);
      }
    }
  }
  free(p0), free(g), free(m0), free(v0);
  st_param_table_free(&tab);
}

/* The split master (kernels/master_split.h): st_adamw_range_split over
 * every rank's range must keep, step after step, exactly the fp32 master
 * that st_adamw_range keeps (joined from the two halves, bit for bit), the
 * working weights its high halves, and the same moments. Some weights start
 * on exact ties, where the high half is not round-to-nearest-even. */
static void test_split_master(void **state) {
  (void)state;
  st_param_table tab;
  table_24_layers(&tab);
  const int64_t P = tab.total;
  const st_optim_config o = k_optim;
  float *p0 = filled(P, 5, 2.0f, 0), *m0 = filled(P, 6, 0.2f, 0), *v0 = filled(P, 7, 0.1f, 1);
  for (int64_t i = 0; i < P; i += 7) { /* a tie: the rest exactly half an ulp */
    uint32_t b;
    memcpy(&b, &p0[i], sizeof b);
    b = (b & 0xffff0000u) | 0x8000u;
    memcpy(&p0[i], &b, sizeof b);
  }
  const int worlds[] = {1, 3};
  for (size_t wi = 0; wi < sizeof worlds / sizeof *worlds; wi++) {
    for (int r = 0; r < worlds[wi]; r++) {
      st_partition part;
      st_partition_make(P, r, worlds[wi], &part);
      const int64_t b = part.begin, e = part.end, n = e - b;
      float *p = malloc((size_t)n * 4), *m = malloc((size_t)n * 4), *v = malloc((size_t)n * 4);
      float *ms = malloc((size_t)n * 4), *vs = malloc((size_t)n * 4);
      uint16_t *hi = malloc((size_t)n * 2);
      int16_t *lo = malloc((size_t)n * 2);
      assert_true(p && m && v && ms && vs && hi && lo);
      memcpy(p, p0 + b, (size_t)n * 4);
      memcpy(m, m0 + b, (size_t)n * 4), memcpy(ms, m0 + b, (size_t)n * 4);
      memcpy(v, v0 + b, (size_t)n * 4), memcpy(vs, v0 + b, (size_t)n * 4);
      for (int64_t i = 0; i < n; i++) st_master_split(p[i], &hi[i], &lo[i]);
      for (int t = 1; t <= 6; t++) {
        float *g = filled(n, 100u + (unsigned)t, 1.0f, 0);
        st_adamw_range(st_ops_cpu(), &tab, &o, o.lr, 0.7f, t, p, NULL, 4, g, ST_FP32, m, v, b, e);
        st_adamw_range_split(st_ops_cpu(), &tab, &o, o.lr, 0.7f, t, lo, hi, g, ST_FP32, ms, vs, b,
                             e);
        for (int64_t i = 0; i < n; i++) {
          const float joined = st_master_join(hi[i], lo[i]);
          uint16_t want;
          int16_t rest;
          st_master_split(p[i], &want, &rest);
          if (memcmp(&joined, &p[i], 4) != 0 || hi[i] != want)
            fail_msg("rank %d of %d, step %d, element %lld: master %.9g (%04x) against %.9g",
                     r, worlds[wi], t, (long long)(b + i), (double)joined, hi[i],
                     (double)p[i]);
        }
        assert_memory_equal(m, ms, (size_t)n * 4);
        assert_memory_equal(v, vs, (size_t)n * 4);
        free(g);
      }
      free(p), free(m), free(v), free(ms), free(vs), free(hi), free(lo);
    }
  }
  free(p0), free(m0), free(v0);
  st_param_table_free(&tab);
}

/* --grad-dtype bf16: AdamW reading bf16 gradients must update exactly as
 * it does from fp32 gradients holding the same (bf16) values: the fp32
 * master, the split master and the segment-grouped path, over every rank's
 * range at 1 and 3 ranks. And the bf16 values are the fp32 gradients
 * rounded to nearest even (f32_to_bf16), so a gradient that does not fit
 * bf16 moves the weights differently: planted below, it must show. */
static void test_bf16_grads(void **state) {
  (void)state;
  st_param_table tab;
  table_24_layers(&tab);
  const int64_t P = tab.total;
  const st_optim_config o = k_optim;
  float *p0 = filled(P, 8, 2.0f, 0), *m0 = filled(P, 9, 0.2f, 0), *v0 = filled(P, 10, 0.1f, 1);
  float *g32 = filled(P, 11, 1.0f, 0);
  uint16_t *g16 = malloc((size_t)P * 2);
  float *gw = malloc((size_t)P * 4); /* g16 widened */
  assert_true(g16 && gw);
  st_ops_cpu()->f32_to_bf16(g16, g32, P);
  st_dtype_to_f32(ST_BF16, gw, g16, (size_t)P);
  int64_t differ = 0;
  for (int64_t i = 0; i < P; i++) {
    uint16_t want;
    st_dtype_from_f32(ST_BF16, &want, &g32[i], 1);
    assert_int_equal(g16[i], want);
    differ += gw[i] != g32[i];
  }
  assert_true(differ > P / 2); /* random fp32 values rarely fit bf16 */
  st_ops seg = *st_ops_cpu();
  seg.adamw_update_segments = segments_on_cpu;
  const int worlds[] = {1, 3};
  for (size_t wi = 0; wi < sizeof worlds / sizeof *worlds; wi++) {
    for (int r = 0; r < worlds[wi]; r++) {
      st_partition part;
      st_partition_make(P, r, worlds[wi], &part);
      const int64_t b = part.begin, e = part.end, n = e - b;
      const size_t f4 = (size_t)n * 4;
      /* [0] from fp32 widened values, [1] from bf16, [2] segments from bf16,
       * [3] from the unrounded fp32 gradients: master, work, m, v */
      float *x[4][4];
      for (int k = 0; k < 4; k++) {
        x[k][0] = malloc(f4), x[k][1] = calloc((size_t)n, 4);
        x[k][2] = malloc(f4), x[k][3] = malloc(f4);
        memcpy(x[k][0], p0 + b, f4), memcpy(x[k][2], m0 + b, f4), memcpy(x[k][3], v0 + b, f4);
      }
      st_adamw_range(st_ops_cpu(), &tab, &o, o.lr, 0.7f, 2, x[0][0], x[0][1], 4, gw + b, ST_FP32,
                     x[0][2], x[0][3], b, e);
      st_adamw_range(st_ops_cpu(), &tab, &o, o.lr, 0.7f, 2, x[1][0], x[1][1], 4, g16 + b,
                     ST_BF16, x[1][2], x[1][3], b, e);
      st_adamw_range(&seg, &tab, &o, o.lr, 0.7f, 2, x[2][0], x[2][1], 4, g16 + b, ST_BF16,
                     x[2][2], x[2][3], b, e);
      st_adamw_range(st_ops_cpu(), &tab, &o, o.lr, 0.7f, 2, x[3][0], x[3][1], 4, g32 + b,
                     ST_FP32, x[3][2], x[3][3], b, e);
      for (int k = 0; k < 4; k++) {
        assert_memory_equal(x[0][k], x[1][k], f4);
        assert_memory_equal(x[0][k], x[2][k], f4);
      }
      assert_memory_not_equal(x[0][0], x[3][0], f4);
      /* the split master from bf16 gradients: the fp32 path's master */
      uint16_t *hi = malloc((size_t)n * 2);
      int16_t *lo = malloc((size_t)n * 2);
      float *ms = malloc(f4), *vs = malloc(f4);
      assert_true(hi && lo && ms && vs);
      memcpy(ms, m0 + b, f4), memcpy(vs, v0 + b, f4);
      for (int64_t i = 0; i < n; i++) st_master_split(p0[b + i], &hi[i], &lo[i]);
      st_adamw_range_split(st_ops_cpu(), &tab, &o, o.lr, 0.7f, 2, lo, hi, g16 + b, ST_BF16, ms,
                           vs, b, e);
      for (int64_t i = 0; i < n; i++) {
        const float joined = st_master_join(hi[i], lo[i]);
        if (memcmp(&joined, &x[0][0][i], 4) != 0)
          fail_msg("split, rank %d of %d, element %lld: %.9g against %.9g", r, worlds[wi],
                   (long long)(b + i), (double)joined, (double)x[0][0][i]);
      }
      assert_memory_equal(ms, x[0][2], f4);
      assert_memory_equal(vs, x[0][3], f4);
      free(hi), free(lo), free(ms), free(vs);
      for (int k = 0; k < 4; k++)
        for (int j = 0; j < 4; j++) free(x[k][j]);
    }
  }
  /* the norm's sum of squares reads bf16 as its widened values */
  assert_true(st_ops_cpu()->sum_squares(g16, ST_BF16, P) ==
              st_ops_cpu()->sum_squares(gw, ST_FP32, P));
  free(p0), free(m0), free(v0), free(g32), free(g16), free(gw);
  st_param_table_free(&tab);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_grouping),
                                     cmocka_unit_test(test_split_master),
                                     cmocka_unit_test(test_bf16_grads)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
