/* matmul.c - the linear layer out = inp @ w^T + bias, forward and backward.
 *
 * w is [OC, C] (nn.Linear layout). Every output element is a sum over one
 * index taken in ascending order, whatever the thread count, so results are
 * bit-for-bit repeatable. The loops are tiled so the innermost loop runs
 * over contiguous memory and the compiler vectorises it (-O3 -march=native).
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_ops.h"

#define ROWS 4   /* rows of inp per tile */
#define COLS 64  /* output channels per tile */

/* A few rows (sampling's one new position per step): reading w in its own
 * layout once beats transposing all of it for one row. Each output is the
 * same sum as the tiled path's, bias first then c ascending, so the result
 * is the same bit for bit; eight outputs at a time give independent chains. */
#define FEW_ROWS 4
static void matmul_forward_few(float *out, const float *inp, const float *w, const float *bias,
                               int N, int C, int OC) {
#pragma omp parallel for
  for (int o0 = 0; o0 < OC; o0 += 8) {
    const int no = OC - o0 < 8 ? OC - o0 : 8;
    for (int r = 0; r < N; r++) {
      const float *a = inp + (int64_t)r * C;
      float acc[8];
      for (int k = 0; k < no; k++) acc[k] = bias ? bias[o0 + k] : 0.0f;
      for (int c = 0; c < C; c++) {
        const float x = a[c];
        for (int k = 0; k < no; k++) acc[k] += x * w[(int64_t)(o0 + k) * C + c];
      }
      memcpy(out + (int64_t)r * OC + o0, acc, (size_t)no * sizeof(float));
    }
  }
}

/* Forward on a transposed copy wT[C, OC]: the inner loop then walks OC
 * contiguously, accumulating a ROWS x COLS tile that stays in L1. */
void cpu_matmul_forward(void *out_, const void *inp_, const void *w_, const void *bias_,
                        int N, int C, int OC) {
  float *out = out_;
  const float *inp = inp_;
  const float *w = w_;
  const float *bias = bias_;
  if (N <= FEW_ROWS) {
    matmul_forward_few(out, inp, w, bias, N, C, OC);
    return;
  }
  float *wT = malloc((size_t)C * OC * sizeof *wT);
#pragma omp parallel for
  for (int c = 0; c < C; c++)
    for (int o = 0; o < OC; o++) wT[(int64_t)c * OC + o] = w[(int64_t)o * C + c];

  int ntiles = (N + ROWS - 1) / ROWS, otiles = (OC + COLS - 1) / COLS;
#pragma omp parallel for collapse(2)
  for (int it = 0; it < ntiles; it++)
    for (int ot = 0; ot < otiles; ot++) {
      int n0 = it * ROWS, o0 = ot * COLS;
      int nr = N - n0 < ROWS ? N - n0 : ROWS, no = OC - o0 < COLS ? OC - o0 : COLS;
      float acc[ROWS][COLS];
      for (int r = 0; r < nr; r++)
        for (int o = 0; o < no; o++) acc[r][o] = bias ? bias[o0 + o] : 0.0f;
      for (int c = 0; c < C; c++) {
        const float *wr = wT + (int64_t)c * OC + o0;
        for (int r = 0; r < nr; r++) {
          float a = inp[(int64_t)(n0 + r) * C + c];
          for (int o = 0; o < no; o++) acc[r][o] += a * wr[o];
        }
      }
      for (int r = 0; r < nr; r++)
        memcpy(out + (int64_t)(n0 + r) * OC + o0, acc[r], (size_t)no * sizeof(float));
    }
  free(wT);
}

/* dinp[n, :] = sum_o dout[n, o] * w[o, :] */
void cpu_matmul_backward_input(void *dinp_, const void *dout_, const void *w_, int N, int C,
                               int OC) {
  float *dinp = dinp_;
  const float *dout = dout_;
  const float *w = w_;
#pragma omp parallel for
  for (int n0 = 0; n0 < N; n0 += ROWS) {
    int nr = N - n0 < ROWS ? N - n0 : ROWS;
    memset(dinp + (int64_t)n0 * C, 0, (size_t)nr * C * sizeof(float));
    for (int o = 0; o < OC; o++) {
      const float *wr = w + (int64_t)o * C;
      for (int r = 0; r < nr; r++) {
        float d = dout[(int64_t)(n0 + r) * OC + o];
        float *di = dinp + (int64_t)(n0 + r) * C;
        for (int c = 0; c < C; c++) di[c] += d * wr[c];
      }
    }
  }
}

void cpu_matmul_backward(void *dinp, float *dw, float *dbias, const void *dout_,
                         const void *inp_, const void *w, int N, int C, int OC) {
  const float *dout = dout_;
  const float *inp = inp_;
  cpu_matmul_backward_input(dinp, dout_, w, N, C, OC);
  /* dw[o, :] += sum_n dout[n, o] * inp[n, :]; dbias[o] += sum_n dout[n, o]. dw NULL: a
   * frozen weight (LoRA's base), no weight gradient at all. */
  if (!dw) {
    if (dbias)
      for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) dbias[o] += dout[(int64_t)n * OC + o];
    return;
  }
#pragma omp parallel for
  for (int o0 = 0; o0 < OC; o0 += ROWS) {
    int no = OC - o0 < ROWS ? OC - o0 : ROWS;
    for (int n = 0; n < N; n++) {
      const float *x = inp + (int64_t)n * C;
      for (int r = 0; r < no; r++) {
        float d = dout[(int64_t)n * OC + o0 + r];
        float *dwr = dw + (int64_t)(o0 + r) * C;
        for (int c = 0; c < C; c++) dwr[c] += d * x[c];
        if (dbias) dbias[o0 + r] += d;
      }
    }
  }
}
