// Checks and times attention_wgmma.cuh (issue 17 experiment): forward
// (one and two warpgroups), dQ, dK and dV against a naive fp32 reference on
// fresh random inputs with poisoned outputs, for bf16 and fp16, head sizes
// 64 and 128, with and without grouped-query attention, at sequence lengths
// that are and are not multiples of the 64-row tiles; the backward twice,
// bit for bit. Then times forward and backward at the benchmark shapes.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a attention_wgmma_check.cu -o check
//   ./check            (exit 1 when a check failed)
#include <cstring>
#include <vector>

#include "attention_wgmma.cuh"

// ---- naive fp32 reference, one warp per row; lane l owns columns l + 32 e
template <typename E, int HD>
__device__ float wdot(const E *a, const E *b, int l) {
  float d = 0.f;
  for (int c = l; c < HD; c += 32) d += wg_elem<E>::f(a[c]) * wg_elem<E>::f(b[c]);
  for (int o = 16; o; o >>= 1) d += __shfl_xor_sync(0xffffffff, d, o);
  return d;
}

template <typename E, int HD>
__global__ void r_fwd(const E *qkv, float *out, E *outE, float *lse, int B, int T, int NH, int NKV) {
  const int C = NH * HD, ld = C + 2 * NKV * HD, G = NH / NKV;
  const long row = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int l = threadIdx.x & 31;
  if (row >= (long)B * NH * T) return;
  const int i = row % T, h = (row / T) % NH, b = row / ((long)T * NH);
  const E *q = qkv + ((size_t)b * T + i) * ld + h * HD;
  const int kc = C + (h / G) * HD, vc = kc + NKV * HD;
  const float sc = 1.f / sqrtf((float)HD);
  float mx = -INFINITY;
  for (int j = 0; j <= i; j++) mx = fmaxf(mx, wdot<E, HD>(q, qkv + ((size_t)b * T + j) * ld + kc, l) * sc);
  float acc[HD / 32], sum = 0.f;
  for (int e = 0; e < HD / 32; e++) acc[e] = 0.f;
  for (int j = 0; j <= i; j++) {
    const E *k = qkv + ((size_t)b * T + j) * ld + kc, *v = qkv + ((size_t)b * T + j) * ld + vc;
    const float p = expf(wdot<E, HD>(q, k, l) * sc - mx);
    sum += p;
    for (int e = 0; e < HD / 32; e++) acc[e] += p * wg_elem<E>::f(v[l + 32 * e]);
  }
  const size_t o = ((size_t)b * T + i) * C + h * HD;
  for (int e = 0; e < HD / 32; e++) {
    out[o + l + 32 * e] = acc[e] / sum;
    outE[o + l + 32 * e] = (E)(acc[e] / sum);
  }
  if (l == 0) lse[((size_t)b * NH + h) * T + i] = mx + logf(sum);
}

template <typename E, int HD>
__global__ void r_dq(const E *qkv, const E *dout, const float *lse, const float *Dl, float *dq,
                     int B, int T, int NH, int NKV) {
  const int C = NH * HD, ld = C + 2 * NKV * HD, G = NH / NKV;
  const long row = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int l = threadIdx.x & 31;
  if (row >= (long)B * NH * T) return;
  const int i = row % T, h = (row / T) % NH, b = row / ((long)T * NH);
  const int kc = C + (h / G) * HD, vc = kc + NKV * HD;
  const E *q = qkv + ((size_t)b * T + i) * ld + h * HD, *dO = dout + ((size_t)b * T + i) * C + h * HD;
  const float sc = 1.f / sqrtf((float)HD), L = lse[((size_t)b * NH + h) * T + i],
              Di = Dl[((size_t)b * NH + h) * T + i];
  float acc[HD / 32];
  for (int e = 0; e < HD / 32; e++) acc[e] = 0.f;
  for (int j = 0; j <= i; j++) {
    const E *k = qkv + ((size_t)b * T + j) * ld + kc, *v = qkv + ((size_t)b * T + j) * ld + vc;
    const float p = expf(wdot<E, HD>(q, k, l) * sc - L), ds = p * (wdot<E, HD>(dO, v, l) - Di);
    for (int e = 0; e < HD / 32; e++) acc[e] += ds * wg_elem<E>::f(k[l + 32 * e]);
  }
  for (int e = 0; e < HD / 32; e++) dq[((size_t)b * T + i) * C + h * HD + l + 32 * e] = acc[e] * sc;
}

// dK, dV of kv head kvh at key j: sums over the group's query heads and rows i >= j
template <typename E, int HD>
__global__ void r_dkv(const E *qkv, const E *dout, const float *lse, const float *Dl, float *dk,
                      float *dv, int B, int T, int NH, int NKV) {
  const int C = NH * HD, ld = C + 2 * NKV * HD, G = NH / NKV, KC = NKV * HD;
  const long row = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int l = threadIdx.x & 31;
  if (row >= (long)B * NKV * T) return;
  const int j = row % T, kvh = (row / T) % NKV, b = row / ((long)T * NKV);
  const E *k = qkv + ((size_t)b * T + j) * ld + C + kvh * HD, *v = k + KC;
  const float sc = 1.f / sqrtf((float)HD);
  float ak[HD / 32], av[HD / 32];
  for (int e = 0; e < HD / 32; e++) ak[e] = av[e] = 0.f;
  for (int h = kvh * G; h < kvh * G + G; h++)
    for (int i = j; i < T; i++) {
      const E *q = qkv + ((size_t)b * T + i) * ld + h * HD, *dO = dout + ((size_t)b * T + i) * C + h * HD;
      const float L = lse[((size_t)b * NH + h) * T + i], Di = Dl[((size_t)b * NH + h) * T + i];
      const float p = expf(wdot<E, HD>(q, k, l) * sc - L), ds = p * (wdot<E, HD>(dO, v, l) - Di);
      for (int e = 0; e < HD / 32; e++) {
        ak[e] += ds * wg_elem<E>::f(q[l + 32 * e]);
        av[e] += p * wg_elem<E>::f(dO[l + 32 * e]);
      }
    }
  for (int e = 0; e < HD / 32; e++) {
    dk[((size_t)b * T + j) * KC + kvh * HD + l + 32 * e] = ak[e] * sc;
    dv[((size_t)b * T + j) * KC + kvh * HD + l + 32 * e] = av[e];
  }
}

template <typename E> static float hf(E x);
template <> float hf(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> float hf(__half x) { return __half2float(x); }

// largest |got - ref| over a strided view; NaN when any got is NaN
template <typename E>
static double maxerr(const std::vector<E> &got, size_t gstride, size_t goff,
                     const std::vector<float> &ref, size_t rows, int cols, double *mag) {
  double err = 0;
  *mag = 0;
  for (size_t r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      const double x = hf(got[r * gstride + goff + c]), y = ref[r * cols + c];
      const double e = fabs(x - y);
      err = (e == e && err == err) ? fmax(err, e) : NAN;
      *mag = fmax(*mag, fabs(y));
    }
  return err;
}

template <typename E, int HD, int NWG>
static void fwd(const E *qkv, E *out, float *lse, int B, int T, int NH, int NKV) {
  wg_fwd<E, HD, NWG><<<dim3((T + 64 * NWG - 1) / (64 * NWG), B * NH), 128 * NWG, wg_fwd_smem<HD>(NWG)>>>(
      qkv, out, lse, T, NH, NKV);
}

template <typename E, int HD>
static void bwd(E *dqkv, const E *qkv, const E *dout, const E *out, const float *lse, float *Dl,
               int B, int T, int NH, int NKV) {
  const long rows = (long)B * NH * T;
  wg_delta<E, HD><<<(unsigned)((rows * 32 + 255) / 256), 256>>>(Dl, dout, out, B, T, NH);
  const int nt = (T + 63) / 64;
  wg_dq<E, HD><<<dim3(nt, B * NH), 128, wg_bwd_smem<HD>()>>>(dqkv, qkv, dout, lse, Dl, T, NH, NKV);
  wg_dkv<E, HD><<<dim3(nt, B * NKV), 128, wg_bwd_smem<HD>()>>>(dqkv, qkv, dout, lse, Dl, T, NH, NKV);
}

template <typename E, int HD>
static void set_smem() {
  CK(cudaFuncSetAttribute(wg_fwd<E, HD, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, wg_fwd_smem<HD>(1)));
  CK(cudaFuncSetAttribute(wg_fwd<E, HD, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, wg_fwd_smem<HD>(2)));
  CK(cudaFuncSetAttribute(wg_dq<E, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, wg_bwd_smem<HD>()));
  CK(cudaFuncSetAttribute(wg_dkv<E, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, wg_bwd_smem<HD>()));
}

// one configuration: 1 when every check passed
template <typename E, int HD>
static int check(const char *tname, int B, int T, int NH, int NKV, unsigned seed) {
  set_smem<E, HD>();
  const int C = NH * HD, KC = NKV * HD, ld = C + 2 * KC;
  const size_t nq = (size_t)B * T * ld, no = (size_t)B * T * C, nk = (size_t)B * T * KC,
               nr = (size_t)B * NH * T;
  srand(seed);
  auto rnd = [] { return (float)rand() / RAND_MAX * 2.f - 1.f; };
  std::vector<E> hq(nq), hdo(no);
  for (auto &x : hq) x = (E)(rnd() * 2.f);
  for (auto &x : hdo) x = (E)rnd();
  E *qkv, *dout, *out, *outR, *dqkv;
  float *lse, *lseR, *Dl, *DlR, *rout, *rdq, *rdk, *rdv;
  CK(cudaMalloc(&qkv, nq * sizeof(E))); CK(cudaMalloc(&dqkv, nq * sizeof(E)));
  CK(cudaMalloc(&dout, no * sizeof(E))); CK(cudaMalloc(&out, no * sizeof(E)));
  CK(cudaMalloc(&outR, no * sizeof(E))); CK(cudaMalloc(&rout, no * 4));
  CK(cudaMalloc(&lse, nr * 4)); CK(cudaMalloc(&lseR, nr * 4)); CK(cudaMalloc(&Dl, nr * 4));
  CK(cudaMalloc(&DlR, nr * 4)); CK(cudaMalloc(&rdq, no * 4)); CK(cudaMalloc(&rdk, nk * 4));
  CK(cudaMalloc(&rdv, nk * 4));
  CK(cudaMemcpy(qkv, hq.data(), nq * sizeof(E), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dout, hdo.data(), no * sizeof(E), cudaMemcpyHostToDevice));
  const unsigned rb = (unsigned)((nr * 32 + 255) / 256), kb = (unsigned)(((size_t)B * NKV * T * 32 + 255) / 256);
  r_fwd<E, HD><<<rb, 256>>>(qkv, rout, outR, lseR, B, T, NH, NKV);
  wg_delta<E, HD><<<rb, 256>>>(DlR, dout, outR, B, T, NH);
  r_dq<E, HD><<<rb, 256>>>(qkv, dout, lseR, DlR, rdq, B, T, NH, NKV);
  r_dkv<E, HD><<<kb, 256>>>(qkv, dout, lseR, DlR, rdk, rdv, B, T, NH, NKV);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> ro(no), rl(nr), ol(nr), rq(no), rk(nk), rv(nk);
  CK(cudaMemcpy(ro.data(), rout, no * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(rl.data(), lseR, nr * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(rq.data(), rdq, no * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(rk.data(), rdk, nk * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(rv.data(), rdv, nk * 4, cudaMemcpyDeviceToHost));
  int ok = 1;
  std::vector<E> oo(no), g(nq), g2(nq);
  char what[160];
  snprintf(what, sizeof what, "%s hd %d B %d T %d heads %d/%d", tname, HD, B, T, NH, NKV);
  for (int nwg = 1; nwg <= 2; nwg++) {
    CK(cudaMemset(out, 0xff, no * sizeof(E)));
    CK(cudaMemset(lse, 0xff, nr * 4));
    if (nwg == 1) fwd<E, HD, 1>(qkv, out, lse, B, T, NH, NKV);
    else fwd<E, HD, 2>(qkv, out, lse, B, T, NH, NKV);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(oo.data(), out, no * sizeof(E), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ol.data(), lse, nr * 4, cudaMemcpyDeviceToHost));
    double mag, eo = maxerr(oo, C, 0, ro, (size_t)B * T, C, &mag), el = 0;
    for (size_t i = 0; i < nr; i++) {
      const double e = fabs((double)ol[i] - rl[i]);
      el = (e == e && el == el) ? fmax(el, e) : NAN;
    }
    const int good = eo == eo && el == el && eo < 2e-2 && el < 1e-3;
    ok &= good;
    printf("%s: forward<%d> max|out-ref| %.3g, max|lse-ref| %.3g%s\n", what, nwg, eo, el,
           good ? "  <- OK" : "  <- WRONG");
  }
  // backward from the reference's forward (its bf16/fp16 output and lse)
  for (int rep = 0; rep < 2; rep++) {
    CK(cudaMemset(dqkv, 0xff, nq * sizeof(E)));
    bwd<E, HD>(dqkv, qkv, dout, outR, lseR, Dl, B, T, NH, NKV);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(rep ? g2.data() : g.data(), dqkv, nq * sizeof(E), cudaMemcpyDeviceToHost));
  }
  const std::vector<float> *refs[3] = {&rq, &rk, &rv};
  const size_t offs[3] = {0, (size_t)C, (size_t)(C + KC)};
  const int cols[3] = {C, KC, KC};
  const char *names[3] = {"dq", "dk", "dv"};
  for (int p = 0; p < 3; p++) {
    double mag, err = maxerr(g, ld, offs[p], *refs[p], (size_t)B * T, cols[p], &mag);
    const int good = err == err && err <= 0.02 * mag + 2e-3;
    ok &= good;
    printf("%s: %s max|got-ref| %.3g (max|ref| %.3g)%s\n", what, names[p], err, mag,
           good ? "  <- OK" : "  <- WRONG");
  }
  const int same = memcmp(g.data(), g2.data(), nq * sizeof(E)) == 0;
  ok &= same;
  printf("%s: backward run to run %s\n", what, same ? "bit-identical  <- OK" : "DIFFERENT  <- WRONG");
  cudaFree(qkv); cudaFree(dqkv); cudaFree(dout); cudaFree(out); cudaFree(outR); cudaFree(rout);
  cudaFree(lse); cudaFree(lseR); cudaFree(Dl); cudaFree(DlR); cudaFree(rdq); cudaFree(rdk);
  cudaFree(rdv);
  return ok;
}

template <typename E, int HD>
static void timing(int B, int T, int NH) {
  set_smem<E, HD>();
  const int C = NH * HD, ld = 3 * C;
  const size_t nq = (size_t)B * T * ld, no = (size_t)B * T * C, nr = (size_t)B * NH * T;
  E *qkv, *dout, *out, *dqkv;
  float *lse, *Dl;
  CK(cudaMalloc(&qkv, nq * sizeof(E))); CK(cudaMalloc(&dqkv, nq * sizeof(E)));
  CK(cudaMalloc(&dout, no * sizeof(E))); CK(cudaMalloc(&out, no * sizeof(E)));
  CK(cudaMalloc(&lse, nr * 4)); CK(cudaMalloc(&Dl, nr * 4));
  std::vector<E> h(nq);
  srand(7);
  for (auto &x : h) x = (E)((float)rand() / RAND_MAX - 0.5f);
  CK(cudaMemcpy(qkv, h.data(), nq * sizeof(E), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dout, h.data(), no * sizeof(E), cudaMemcpyHostToDevice));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  const double ffwd = 4.0 * B * NH * (double)T * T * HD / 2;
  float ms[2];
  for (int k = 0; k < 2; k++) {
    auto go = [&] {
      if (k == 0) fwd<E, HD, 2>(qkv, out, lse, B, T, NH, NH);
      else bwd<E, HD>(dqkv, qkv, dout, out, lse, Dl, B, T, NH, NH);
    };
    for (int i = 0; i < 3; i++) go();
    CK(cudaEventRecord(e0));
    for (int i = 0; i < 20; i++) go();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms[k], e0, e1));
    ms[k] /= 20;
  }
  CK(cudaGetLastError());
  printf("time bf16 B=%d T=%d H=%d D=%d: forward %.3f ms (%.1f TFLOP/s), backward %.3f ms (%.1f "
         "TFLOP/s as 2.5x forward; delta + dQ + dK/dV kernels)\n", B, T, NH, HD, ms[0],
         ffwd / ms[0] / 1e9, ms[1], 2.5 * ffwd / ms[1] / 1e9);
  cudaFree(qkv); cudaFree(dqkv); cudaFree(dout); cudaFree(out); cudaFree(lse); cudaFree(Dl);
}

int main() {
  int ok = 1;
  ok &= check<__nv_bfloat16, 64>("bf16", 2, 256, 4, 4, 1);
  ok &= check<__nv_bfloat16, 64>("bf16", 2, 1000, 4, 4, 2);
  ok &= check<__nv_bfloat16, 64>("bf16", 1, 777, 8, 2, 3);
  ok &= check<__half, 64>("fp16", 2, 1000, 4, 4, 4);
  ok &= check<__nv_bfloat16, 128>("bf16", 1, 1000, 8, 2, 5);
  ok &= check<__half, 128>("fp16", 1, 512, 4, 4, 6);
  ok &= check<__nv_bfloat16, 64>("bf16", 1, 40, 2, 1, 7);
  timing<__nv_bfloat16, 64>(32, 1024, 12);
  timing<__nv_bfloat16, 64>(4, 4096, 12);
  timing<__nv_bfloat16, 64>(1, 8192, 12);
  timing<__nv_bfloat16, 128>(2, 4096, 16);
  printf("attention_wgmma_check: %s\n", ok ? "all checks passed" : "SOME CHECKS FAILED");
  return ok ? 0 : 1;
}
