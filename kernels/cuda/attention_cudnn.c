/* attention_cudnn.c - cuDNN fused flash attention through the backend graph
 * API (see attention_cudnn.h).
 *
 * cuDNN has no "attention" operation: its fused-attention engines recognise
 * a pattern of matmul, pointwise, reduction and reshape operations, the
 * decomposition the cuDNN frontend's SDPA nodes emit. The graphs below are
 * that pattern for the causal, no-bias, no-dropout case:
 *
 * forward   S = Q K^T * scale; mask = row >= col (GEN_INDEX, CMP_GE);
 *           S = select(mask, S, -FLT_MAX); M = max_j S; E = exp(S - M);
 *           Z = sum_j E; Stats = M + log Z; P = E / Z; O = P V
 * backward  D = sum_d dO*O (times one: the frontend's dropout-scale slot);
 *           S as forward; P = exp(S - Stats); dV = P^T dO;
 *           dS = (dO V^T * one - D) * P * scale; dK = dS^T Q; dQ = dS K
 *
 * K and V enter as K^T and V^T, the same memory with the last two strides
 * swapped, because the engines expect matmul operands in that form.
 * Virtual (never materialised) tensors are fp32, except the P and dS that
 * feed a matmul, which are the storage dtype (what the engines match).
 * dQ is written directly from its matmul: giving it a non-virtual fp32
 * accumulator instead is how the backend is asked for the atomic-add
 * variant, which is not deterministic.
 */
#include "kernels/cuda/attention_cudnn.h"
#include "kernels/attention_choice.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cudnn_graph.h>

static char g_err[512];

static int fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_err, sizeof g_err, fmt, ap);
  va_end(ap);
  return -1;
}

const char *cuda_attention_cudnn_error(void) { return g_err; }
int cuda_attention_cudnn_version(void) { return (int)cudnnGetVersion(); }

/* ---- graph construction: every descriptor made goes into one list, so a
 * failure anywhere frees everything, and the first failure is what is
 * reported (later calls do nothing). */

#define MAX_DESC 320

typedef struct {
  cudnnBackendDescriptor_t d[MAX_DESC];
  int n;
  cudnnBackendDescriptor_t ops[40];
  int nops;
  int64_t next_uid; /* virtual tensors */
  cudnnStatus_t st;
  char where[96];
} graph;

static void g_check(graph *g, cudnnStatus_t s, const char *where) {
  if (g->st == CUDNN_STATUS_SUCCESS && s != CUDNN_STATUS_SUCCESS) {
    g->st = s;
    snprintf(g->where, sizeof g->where, "%s", where);
  }
}

static cudnnBackendDescriptor_t g_new(graph *g, cudnnBackendDescriptorType_t type) {
  cudnnBackendDescriptor_t d = NULL;
  if (g->st != CUDNN_STATUS_SUCCESS) return NULL;
  if (g->n == MAX_DESC) {
    g_check(g, CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, "descriptor list full");
    return NULL;
  }
  g_check(g, cudnnBackendCreateDescriptor(type, &d), "create descriptor");
  if (d) g->d[g->n++] = d;
  return d;
}

static void g_set(graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                  cudnnBackendAttributeType_t type, int64_t count, const void *value,
                  const char *where) {
  if (g->st != CUDNN_STATUS_SUCCESS) return;
  g_check(g, cudnnBackendSetAttribute(d, name, type, count, value), where);
}

static void g_finalize(graph *g, cudnnBackendDescriptor_t d, const char *where) {
  if (g->st != CUDNN_STATUS_SUCCESS) return;
  g_check(g, cudnnBackendFinalize(d), where);
}

/* Not g_free: clang's analyzer takes that name for GLib's and reports the
 * graphs freed here as globals passed to free(). */
static void graph_free(graph *g) {
  for (int i = g->n - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(g->d[i]);
  g->n = 0;
}

/* A 4-d tensor. uid 0 makes a virtual tensor with the next virtual uid. */
static cudnnBackendDescriptor_t tensor(graph *g, int64_t uid, cudnnDataType_t dt,
                                       const int64_t dim[4], const int64_t stride[4],
                                       bool by_value) {
  cudnnBackendDescriptor_t t = g_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const bool is_virtual = uid == 0;
  if (is_virtual) uid = g->next_uid++;
  const int64_t align = 16;
  g_set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type");
  g_set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim, "tensor dims");
  g_set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride, "tensor strides");
  g_set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
  g_set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
  g_set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "tensor virtual");
  if (by_value)
    g_set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "tensor by value");
  g_finalize(g, t, "tensor");
  return t;
}

static void add_op(graph *g, cudnnBackendDescriptor_t op) {
  if (g->st != CUDNN_STATUS_SUCCESS) return;
  if (g->nops == (int)(sizeof g->ops / sizeof g->ops[0])) {
    g_check(g, CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, "operation list full");
    return;
  }
  g->ops[g->nops++] = op;
}

/* y = mode(x[, b[, t]]) computed in prec. axis >= 0 for GEN_INDEX. */
static void pointwise(graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                      cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                      cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y, int64_t axis) {
  cudnnBackendDescriptor_t pw = g_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  g_set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
  g_set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise prec");
  if (axis >= 0)
    g_set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
  g_finalize(g, pw, "pointwise descriptor");
  cudnnBackendDescriptor_t op = g_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
  g_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, D, 1, &pw, "pointwise op");
  g_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, D, 1, &x, "pointwise x");
  if (b) g_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, D, 1, &b, "pointwise b");
  if (t) g_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, D, 1, &t, "pointwise t");
  g_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, D, 1, &y, "pointwise y");
  g_finalize(g, op, "pointwise operation");
  add_op(g, op);
}

/* y = reduce(x) over the dimensions where y has extent 1 (here the last). */
static void reduction(graph *g, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                      cudnnBackendDescriptor_t y) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t r = g_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  g_set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode,
        "reduction mode");
  g_set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, "reduction type");
  g_finalize(g, r, "reduction descriptor");
  cudnnBackendDescriptor_t op = g_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
  g_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, D, 1, &r, "reduction op");
  g_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, D, 1, &x, "reduction x");
  g_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, D, 1, &y, "reduction y");
  g_finalize(g, op, "reduction operation");
  add_op(g, op);
}

/* c[b,h] = a[b,h] @ b[b,h], fp32 accumulation. */
static void matmul(graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                   cudnnBackendDescriptor_t c) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t mm = g_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  g_set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, "matmul type");
  g_finalize(g, mm, "matmul descriptor");
  cudnnBackendDescriptor_t op = g_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
  g_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, D, 1, &mm, "matmul op");
  g_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, D, 1, &a, "matmul a");
  g_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, D, 1, &b, "matmul b");
  g_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, D, 1, &c, "matmul c");
  g_finalize(g, op, "matmul operation");
  add_op(g, op);
}

/* y = x seen through y's dims and strides (transposes here). */
static void reshape(graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t op = g_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  const cudnnBackendAttributeType_t D = CUDNN_TYPE_BACKEND_DESCRIPTOR;
  g_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, D, 1, &x, "reshape x");
  g_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, D, 1, &y, "reshape y");
  g_finalize(g, op, "reshape operation");
  add_op(g, op);
}

/* ---- the two graphs */

enum { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV,
       UID_SCALE, UID_ONE, UID_NEG, UID_VIRTUAL = 100 };

typedef struct {
  int64_t B, T, C, NH, NKV, hs;
  cudnnDataType_t io;
} shape;

/* Strides of the views, R = (NH + 2 NKV) hs the qkv row: the [B,NH,T,hs]
 * query heads of qkv/dqkv and of out/dout (row C); the [B,NKV,T,hs] key
 * or value heads and their transposed [B,NKV,hs,T] view; S [B,NH,T,T],
 * S^T, and the per-row [B,NH,T,1]. Grouped-query attention is the matmuls'
 * broadcast of the NKV heads over the NH (cuDNN's SDPA pattern). */
typedef struct {
  int64_t qkv_d[4], qkv_s[4], kv_d[4], kt_d[4], kt_s[4], o_s[4];
  int64_t ss_d[4], ss_s[4], st_s[4], row_d[4], row_s[4], one[4];
  int64_t od_s[4]; /* packed [B,NH,T,hs]: the dO*O product, and GQA's per-query-head dK, dV */
} layout;

static void make_layout(const shape *s, layout *l) {
  const int64_t B = s->B, T = s->T, C = s->C, H = s->NH, KV = s->NKV, hs = s->hs;
  const int64_t R = C + 2 * KV * hs;
  const int64_t qd[4] = {B, H, T, hs}, qs[4] = {T * R, hs, R, 1}, kvd[4] = {B, KV, T, hs};
  const int64_t kd[4] = {B, KV, hs, T}, ks[4] = {T * R, hs, 1, R};
  const int64_t os[4] = {T * C, hs, C, 1};
  const int64_t sd[4] = {B, H, T, T}, ss[4] = {H * T * T, T * T, T, 1},
                sts[4] = {H * T * T, T * T, 1, T};
  const int64_t rd[4] = {B, H, T, 1}, rs[4] = {H * T, T, 1, 1}, one[4] = {1, 1, 1, 1};
  const int64_t ods[4] = {H * T * hs, T * hs, hs, 1};
  memcpy(l->qkv_d, qd, sizeof qd), memcpy(l->qkv_s, qs, sizeof qs), memcpy(l->kv_d, kvd, sizeof kvd);
  memcpy(l->kt_d, kd, sizeof kd), memcpy(l->kt_s, ks, sizeof ks);
  memcpy(l->o_s, os, sizeof os);
  memcpy(l->ss_d, sd, sizeof sd), memcpy(l->ss_s, ss, sizeof ss), memcpy(l->st_s, sts, sizeof sts);
  memcpy(l->row_d, rd, sizeof rd), memcpy(l->row_s, rs, sizeof rs), memcpy(l->one, one, sizeof one);
  memcpy(l->od_s, ods, sizeof ods);
}

/* The causal mask on scaled scores ss: positions with column > row get
 * -FLT_MAX (not -inf: exp of it is exactly 0 without inf - inf). */
static cudnnBackendDescriptor_t causal(graph *g, const layout *l, cudnnBackendDescriptor_t ss,
                                       cudnnBackendDescriptor_t neg) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, i32 = CUDNN_DATA_INT32, b8 = CUDNN_DATA_BOOLEAN;
  cudnnBackendDescriptor_t row = tensor(g, 0, i32, l->ss_d, l->ss_s, false);
  cudnnBackendDescriptor_t col = tensor(g, 0, i32, l->ss_d, l->ss_s, false);
  cudnnBackendDescriptor_t keep = tensor(g, 0, b8, l->ss_d, l->ss_s, false);
  cudnnBackendDescriptor_t out = tensor(g, 0, f32, l->ss_d, l->ss_s, false);
  pointwise(g, CUDNN_POINTWISE_GEN_INDEX, i32, ss, NULL, NULL, row, 2);
  pointwise(g, CUDNN_POINTWISE_GEN_INDEX, i32, ss, NULL, NULL, col, 3);
  pointwise(g, CUDNN_POINTWISE_CMP_GE, b8, row, col, NULL, keep, -1);
  pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, f32, ss, neg, keep, out, -1);
  return out;
}

/* S = Q K^T * scale, causally masked. */
static cudnnBackendDescriptor_t scores(graph *g, const layout *l, cudnnBackendDescriptor_t q,
                                       cudnnBackendDescriptor_t kt,
                                       cudnnBackendDescriptor_t scale,
                                       cudnnBackendDescriptor_t neg) {
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t s = tensor(g, 0, f32, l->ss_d, l->ss_s, false);
  cudnnBackendDescriptor_t ss = tensor(g, 0, f32, l->ss_d, l->ss_s, false);
  matmul(g, q, kt, s);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, s, scale, NULL, ss, -1);
  return causal(g, l, ss, neg);
}

static void build_forward(graph *g, const shape *sh) {
  layout l;
  make_layout(sh, &l);
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, io = sh->io;
  cudnnBackendDescriptor_t q = tensor(g, UID_Q, io, l.qkv_d, l.qkv_s, false);
  cudnnBackendDescriptor_t kt = tensor(g, UID_K, io, l.kt_d, l.kt_s, false);
  cudnnBackendDescriptor_t v = tensor(g, UID_V, io, l.kv_d, l.qkv_s, false);
  cudnnBackendDescriptor_t o = tensor(g, UID_O, io, l.qkv_d, l.o_s, false);
  cudnnBackendDescriptor_t stats = tensor(g, UID_STATS, f32, l.row_d, l.row_s, false);
  cudnnBackendDescriptor_t scale = tensor(g, UID_SCALE, f32, l.one, l.one, true);
  cudnnBackendDescriptor_t neg = tensor(g, UID_NEG, f32, l.one, l.one, true);
  cudnnBackendDescriptor_t s = scores(g, &l, q, kt, scale, neg);
  cudnnBackendDescriptor_t m = tensor(g, 0, f32, l.row_d, l.row_s, false);
  cudnnBackendDescriptor_t d = tensor(g, 0, f32, l.ss_d, l.ss_s, false);
  cudnnBackendDescriptor_t e = tensor(g, 0, f32, l.ss_d, l.ss_s, false);
  cudnnBackendDescriptor_t z = tensor(g, 0, f32, l.row_d, l.row_s, false);
  cudnnBackendDescriptor_t lz = tensor(g, 0, f32, l.row_d, l.row_s, false);
  cudnnBackendDescriptor_t p = tensor(g, 0, io, l.ss_d, l.ss_s, false);
  reduction(g, CUDNN_REDUCE_TENSOR_MAX, s, m);
  pointwise(g, CUDNN_POINTWISE_SUB, f32, s, m, NULL, d, -1);
  pointwise(g, CUDNN_POINTWISE_EXP, f32, d, NULL, NULL, e, -1);
  reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, z);
  pointwise(g, CUDNN_POINTWISE_LOG, f32, z, NULL, NULL, lz, -1);
  pointwise(g, CUDNN_POINTWISE_ADD, f32, m, lz, NULL, stats, -1);
  pointwise(g, CUDNN_POINTWISE_DIV, f32, e, z, NULL, p, -1);
  matmul(g, p, v, o);
}

static void build_backward(graph *g, const shape *sh) {
  layout l;
  make_layout(sh, &l);
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, io = sh->io;
  cudnnBackendDescriptor_t q = tensor(g, UID_Q, io, l.qkv_d, l.qkv_s, false);
  cudnnBackendDescriptor_t kt = tensor(g, UID_K, io, l.kt_d, l.kt_s, false);
  cudnnBackendDescriptor_t vt = tensor(g, UID_V, io, l.kt_d, l.kt_s, false);
  cudnnBackendDescriptor_t o = tensor(g, UID_O, io, l.qkv_d, l.o_s, false);
  cudnnBackendDescriptor_t dout = tensor(g, UID_DO, io, l.qkv_d, l.o_s, false);
  cudnnBackendDescriptor_t stats = tensor(g, UID_STATS, f32, l.row_d, l.row_s, false);
  cudnnBackendDescriptor_t dq = tensor(g, UID_DQ, io, l.qkv_d, l.qkv_s, false);
  cudnnBackendDescriptor_t dk = tensor(g, UID_DK, io, l.kv_d, l.qkv_s, false);
  cudnnBackendDescriptor_t dv = tensor(g, UID_DV, io, l.kv_d, l.qkv_s, false);
  /* GQA: dK and dV per query head (virtual), then summed over each group
   * into the kv heads by a reduction, as the cuDNN frontend's SDPA
   * backward does */
  const bool gqa = sh->NKV != sh->NH;
  cudnnBackendDescriptor_t dkf = gqa ? tensor(g, 0, io, l.qkv_d, l.od_s, false) : dk;
  cudnnBackendDescriptor_t dvf = gqa ? tensor(g, 0, io, l.qkv_d, l.od_s, false) : dv;
  cudnnBackendDescriptor_t scale = tensor(g, UID_SCALE, f32, l.one, l.one, true);
  cudnnBackendDescriptor_t one = tensor(g, UID_ONE, f32, l.one, l.one, true);
  cudnnBackendDescriptor_t neg = tensor(g, UID_NEG, f32, l.one, l.one, true);

  /* D = rowsum(dO * O) */
  cudnnBackendDescriptor_t doo = tensor(g, 0, f32, l.qkv_d, l.od_s, false);
  cudnnBackendDescriptor_t dsum0 = tensor(g, 0, f32, l.row_d, l.row_s, false);
  cudnnBackendDescriptor_t dsum = tensor(g, 0, f32, l.row_d, l.row_s, false);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, dout, o, NULL, doo, -1);
  reduction(g, CUDNN_REDUCE_TENSOR_ADD, doo, dsum0);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, dsum0, one, NULL, dsum, -1);

  /* P = exp(S - Stats); dV = P^T dO */
  cudnnBackendDescriptor_t s = scores(g, &l, q, kt, scale, neg);
  cudnnBackendDescriptor_t sd = tensor(g, 0, f32, l.ss_d, l.ss_s, false);
  cudnnBackendDescriptor_t p = tensor(g, 0, f32, l.ss_d, l.ss_s, false);
  cudnnBackendDescriptor_t pt = tensor(g, 0, io, l.ss_d, l.st_s, false);
  pointwise(g, CUDNN_POINTWISE_SUB, f32, s, stats, NULL, sd, -1);
  pointwise(g, CUDNN_POINTWISE_EXP, f32, sd, NULL, NULL, p, -1);
  reshape(g, p, pt);
  matmul(g, pt, dout, dvf);
  if (gqa) reduction(g, CUDNN_REDUCE_TENSOR_ADD, dvf, dv);

  /* dS = (dO V^T - D) * P * scale; dK = dS^T Q; dQ = dS K */
  cudnnBackendDescriptor_t dp = tensor(g, 0, f32, l.ss_d, l.ss_s, false);
  cudnnBackendDescriptor_t dp1 = tensor(g, 0, f32, l.ss_d, l.ss_s, false);
  cudnnBackendDescriptor_t dp2 = tensor(g, 0, f32, l.ss_d, l.ss_s, false);
  cudnnBackendDescriptor_t dp3 = tensor(g, 0, f32, l.ss_d, l.ss_s, false);
  cudnnBackendDescriptor_t ds = tensor(g, 0, f32, l.ss_d, l.ss_s, false);
  cudnnBackendDescriptor_t dst = tensor(g, 0, io, l.ss_d, l.st_s, false);
  cudnnBackendDescriptor_t k = tensor(g, 0, io, l.kv_d, l.qkv_s, false);
  matmul(g, dout, vt, dp);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, dp, one, NULL, dp1, -1);
  pointwise(g, CUDNN_POINTWISE_SUB, f32, dp1, dsum, NULL, dp2, -1);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, dp2, p, NULL, dp3, -1);
  pointwise(g, CUDNN_POINTWISE_MUL, f32, dp3, scale, NULL, ds, -1);
  reshape(g, ds, dst);
  matmul(g, dst, q, dkf);
  if (gqa) reduction(g, CUDNN_REDUCE_TENSOR_ADD, dkf, dk);
  reshape(g, kt, k);
  matmul(g, ds, k, dq);
}

/* ---- plans */

static cudnnHandle_t g_handle;

static int has_note(cudnnBackendDescriptor_t engine, cudnnBackendNumericalNote_t want) {
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t n = 0;
  if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes) != CUDNN_STATUS_SUCCESS)
    return 1; /* unknown: treat as the worse case */
  for (int64_t i = 0; i < n; i++)
    if (notes[i] == want) return 1;
  return 0;
}

/* Finalize the operation graph of g, ask the heuristics (mode A, then the
 * fallback list) for engine configs, and keep the first whose execution
 * plan builds, preferring one without the nondeterminism note when
 * want_det. *plan is the caller's to destroy. 0 or -1 (fail's message). */
static int make_plan(graph *g, const char *what, int want_det, cudnnBackendDescriptor_t *plan,
                     int64_t *ws, int *det) {
  *plan = NULL;
  cudnnBackendDescriptor_t og = g_new(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  g_set(g, og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &g_handle, "graph handle");
  g_set(g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops,
        "graph ops");
  g_finalize(g, og, "operation graph");
  if (g->st != CUDNN_STATUS_SUCCESS) {
    char last[256] = "";
    cudnnGetLastErrorString(last, sizeof last);
    return fail("cuDNN %s graph: %s failed: %s%s%s", what, g->where, cudnnGetErrorString(g->st),
                last[0] ? "; " : "", last);
  }
  const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
  int tried = 0;
  for (int pass = 0; pass < 2 * (want_det ? 2 : 1) && !*plan; pass++) {
    const int mode = pass % 2, need_det = want_det && pass < 2;
    cudnnBackendDescriptor_t heur = g_new(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    g_set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og,
          "heuristics graph");
    g_set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[mode],
          "heuristics mode");
    g_finalize(g, heur, "heuristics");
    int64_t count = 0;
    if (g->st == CUDNN_STATUS_SUCCESS)
      g_check(g, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL),
              "heuristics count");
    if (g->st != CUDNN_STATUS_SUCCESS) {
      g->st = CUDNN_STATUS_SUCCESS; /* this mode has nothing; try the next */
      continue;
    }
    if (count > 16) count = 16;
    cudnnBackendDescriptor_t cfg[16];
    int64_t got = 0;
    for (int64_t i = 0; i < count; i++) cfg[i] = g_new(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    if (g->st == CUDNN_STATUS_SUCCESS)
      g_check(g, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfg),
              "heuristics results");
    for (int64_t i = 0; i < got && g->st == CUDNN_STATUS_SUCCESS && !*plan; i++) {
      cudnnBackendDescriptor_t eng = g_new(g, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
      int64_t ne = 0;
      if (g->st != CUDNN_STATUS_SUCCESS) break;
      if (cudnnBackendGetAttribute(cfg[i], CUDNN_ATTR_ENGINECFG_ENGINE,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ne, &eng) != CUDNN_STATUS_SUCCESS)
        continue;
      const int nondet = has_note(eng, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC);
      if (need_det && nondet) continue;
      tried++;
      cudnnBackendDescriptor_t p = NULL;
      if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p) !=
          CUDNN_STATUS_SUCCESS)
        break;
      int64_t w = 0;
      if (cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                                   &g_handle) == CUDNN_STATUS_SUCCESS &&
          cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]) == CUDNN_STATUS_SUCCESS &&
          cudnnBackendFinalize(p) == CUDNN_STATUS_SUCCESS &&
          cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                   &ne, &w) == CUDNN_STATUS_SUCCESS) {
        *plan = p;
        *ws = w;
        *det = !nondet;
      } else {
        cudnnBackendDestroyDescriptor(p);
      }
    }
    g->st = CUDNN_STATUS_SUCCESS;
  }
  if (!*plan) {
    char last[256] = "";
    cudnnGetLastErrorString(last, sizeof last);
    return fail("cuDNN %s: no engine builds an execution plan (%d candidate%s tried)%s%s", what,
                tried, tried == 1 ? "" : "s", last[0] ? ": " : "", last);
  }
  return 0;
}

/* ---- the cache: a few shapes (training, and the tests' handful) */

#define CACHE_SLOTS 16

/* The graphs' descriptors stay alive with the plans built from them (the
 * frontend keeps them too: a plan refers to its engine config). */
typedef struct {
  int used;
  int B, T, C, NH, NKV;
  st_dtype dt;
  graph gf, gb;
  cudnnBackendDescriptor_t fwd, bwd;
  int64_t ws_fwd, ws_bwd;
  int deterministic;
  int cap;  /* the group cap it was prepared under (part of the key) */
  int bseq; /* sequences per backward call: gb is built for bseq, gf for B */
} entry;

static entry g_cache[CACHE_SLOTS];

static int g_group_cap; /* cuda_attention_cudnn_group_cap */

void cuda_attention_cudnn_group_cap(int cap) { g_group_cap = cap > 0 ? cap : 0; }

/* The group cap is part of the key: a plan prepared under another cap is
 * not this one. The group itself is resolved once, at prepare, so the
 * calls in a step read no environment. */
static entry *find(int B, int T, int C, int NH, int NKV, st_dtype dt) {
  for (int i = 0; i < CACHE_SLOTS; i++) {
    entry *e = &g_cache[i];
    if (e->used && e->B == B && e->T == T && e->C == C && e->NH == NH && e->NKV == NKV &&
        e->dt == dt && e->cap == g_group_cap)
      return e;
  }
  return NULL;
}

int cuda_attention_cudnn_ready(int B, int T, int C, int NH, int NKV, st_dtype dt) {
  return find(B, T, C, NH, NKV, dt) != NULL;
}

int cuda_attention_cudnn_ready_backward(int B, int T, int C, int NH, int NKV, st_dtype dt) {
  const entry *e = find(B, T, C, NH, NKV, dt);
  return e && e->bwd;
}

/* The entry for the shape with its forward plan, and with its backward plan
 * too when want_bwd; a backward that fails to build leaves the forward's
 * entry in the cache (--attention mixed runs it). NULL with the reason in
 * g_err on failure. */
static entry *prepare(int B, int T, int C, int NH, int NKV, st_dtype dt, int want_bwd) {
  g_err[0] = 0;
  if (dt != ST_BF16 && dt != ST_FP16) {
    fail("cuDNN attention runs bf16 and fp16 storage, not %s", st_dtype_name(dt));
    return NULL;
  }
  if (B < 1 || T < 1 || NH < 1 || C % NH != 0 || NKV < 1 || NH % NKV != 0) {
    fail("cuDNN attention: bad shape B=%d T=%d C=%d NH=%d NKV=%d", B, T, C, NH, NKV);
    return NULL;
  }
  const int hs = C / NH;
  if (!st_attention_cudnn_takes_head(hs)) {
    fail("cuDNN attention needs a head size that is a multiple of 8 and at most 128, got %d "
         "(C=%d / NH=%d)", hs, C, NH);
    return NULL;
  }
  const shape sh = {B, T, C, NH, NKV, hs, dt == ST_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF};
  entry *e = find(B, T, C, NH, NKV, dt);
  if (!e) {
    for (int i = 0; i < CACHE_SLOTS && !e; i++)
      if (!g_cache[i].used) e = &g_cache[i];
    if (!e) {
      fail("cuDNN attention: the plan cache holds %d shapes already", CACHE_SLOTS);
      return NULL;
    }
    if (!g_handle) {
      cudnnStatus_t s = cudnnCreate(&g_handle);
      if (s != CUDNN_STATUS_SUCCESS) {
        g_handle = NULL;
        fail("cudnnCreate failed: %s (is libcudnn 9 installed and a GPU visible?)",
             cudnnGetErrorString(s));
        return NULL;
      }
    }
    memset(e, 0, sizeof *e);
    e->gf.next_uid = e->gb.next_uid = UID_VIRTUAL;
    int det_f = 0;
    build_forward(&e->gf, &sh);
    if (make_plan(&e->gf, "attention forward", 0, &e->fwd, &e->ws_fwd, &det_f)) {
      if (e->fwd) cudnnBackendDestroyDescriptor(e->fwd);
      graph_free(&e->gf);
      memset(e, 0, sizeof *e);
      return NULL;
    }
    e->B = B, e->T = T, e->C = C, e->NH = NH, e->NKV = NKV, e->dt = dt, e->cap = g_group_cap;
    e->used = 1;
  }
  if (want_bwd && !e->bwd) {
    /* the backward's workspace holds dP for every sequence of a call:
     * groups of sequences bound it (st_attention_cudnn_group) */
    shape shb = sh;
    e->bseq = st_attention_cudnn_group(B, g_group_cap);
    shb.B = e->bseq;
    e->gb.next_uid = UID_VIRTUAL;
    build_backward(&e->gb, &shb);
    if (make_plan(&e->gb, "attention backward", 1, &e->bwd, &e->ws_bwd, &e->deterministic)) {
      if (e->bwd) cudnnBackendDestroyDescriptor(e->bwd);
      graph_free(&e->gb);
      memset(&e->gb, 0, sizeof e->gb);
      e->bwd = NULL, e->ws_bwd = 0, e->deterministic = 0, e->bseq = 0;
      return NULL;
    }
  }
  return e;
}

int cuda_attention_cudnn_prepare(int B, int T, int C, int NH, int NKV, st_dtype dt,
                                 size_t *workspace_bytes, int *deterministic,
                                 int *seqs_per_call) {
  const entry *e = prepare(B, T, C, NH, NKV, dt, 1);
  if (!e) return -1;
  *workspace_bytes = (size_t)(e->ws_fwd > e->ws_bwd ? e->ws_fwd : e->ws_bwd);
  *deterministic = e->deterministic;
  *seqs_per_call = e->bseq;
  return 0;
}

int cuda_attention_cudnn_prepare_forward(int B, int T, int C, int NH, int NKV, st_dtype dt,
                                         size_t *workspace_bytes) {
  const entry *e = prepare(B, T, C, NH, NKV, dt, 0);
  if (!e) return -1;
  *workspace_bytes = (size_t)e->ws_fwd;
  return 0;
}

static void entry_free(entry *e) {
  if (e->fwd) cudnnBackendDestroyDescriptor(e->fwd);
  if (e->bwd) cudnnBackendDestroyDescriptor(e->bwd);
  graph_free(&e->gb);
  graph_free(&e->gf);
  memset(e, 0, sizeof *e);
}

void cuda_attention_cudnn_release(void) {
  for (int i = 0; i < CACHE_SLOTS; i++)
    if (g_cache[i].used) entry_free(&g_cache[i]);
  if (g_handle) cudnnDestroy(g_handle);
  g_handle = NULL;
}

void cuda_attention_cudnn_keep_only(int B, int T, int C, int NH, int NKV, st_dtype dt,
                                    int backward) {
  entry *keep = find(B, T, C, NH, NKV, dt);
  for (int i = 0; i < CACHE_SLOTS; i++)
    if (g_cache[i].used && &g_cache[i] != keep) entry_free(&g_cache[i]);
  if (keep && !backward && keep->bwd) {
    /* as a failed backward build leaves it (prepare): the forward alone */
    cudnnBackendDestroyDescriptor(keep->bwd);
    graph_free(&keep->gb);
    memset(&keep->gb, 0, sizeof keep->gb);
    keep->bwd = NULL, keep->ws_bwd = 0, keep->deterministic = 0, keep->bseq = 0;
  }
}

/* ---- execution */

static int execute(cudnnBackendDescriptor_t plan, int n, const int64_t *uids, void **ptrs,
                   void *workspace, const char *what) {
  cudnnBackendDescriptor_t vp = NULL;
  cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
  if (s == CUDNN_STATUS_SUCCESS)
    s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
  if (s == CUDNN_STATUS_SUCCESS)
    s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n,
                                 ptrs);
  if (s == CUDNN_STATUS_SUCCESS)
    s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                                 &workspace);
  if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(vp);
  if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendExecute(g_handle, plan, vp);
  if (vp) cudnnBackendDestroyDescriptor(vp);
  if (s != CUDNN_STATUS_SUCCESS) {
    char last[256] = "";
    cudnnGetLastErrorString(last, sizeof last);
    return fail("cuDNN %s failed: %s%s%s", what, cudnnGetErrorString(s), last[0] ? "; " : "",
                last);
  }
  return 0;
}

/* Column col of the first row of a qkv-shaped buffer of dtype dt: the q
 * heads start at 0, the k heads at C, the v heads at C + NKV hs. */
static void *column(const void *base, int64_t col, st_dtype dt) {
  return (char *)(uintptr_t)base + (size_t)col * st_dtype_size(dt);
}

int cuda_attention_cudnn_forward(void *out, float *stats, const void *qkv, int B, int T, int C,
                                 int NH, int NKV, st_dtype dt, void *workspace) {
  entry *e = find(B, T, C, NH, NKV, dt);
  if (!e) return fail("cuDNN attention forward: shape B=%d T=%d C=%d NH=%d NKV=%d %s was not "
                      "prepared", B, T, C, NH, NKV, st_dtype_name(dt));
  float scale = 1.0f / sqrtf((float)(C / NH)), neg = -FLT_MAX;
  const int64_t vcol = C + (int64_t)NKV * (C / NH);
  const int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG};
  void *ptrs[] = {column(qkv, 0, dt), column(qkv, C, dt), column(qkv, vcol, dt), out, stats,
                  &scale, &neg};
  return execute(e->fwd, 7, uids, ptrs, workspace, "attention forward");
}

int cuda_attention_cudnn_backward(void *dqkv, const void *dout, const void *qkv, const void *out,
                                  const float *stats, int B, int T, int C, int NH, int NKV,
                                  st_dtype dt, void *workspace) {
  entry *e = find(B, T, C, NH, NKV, dt);
  if (!e || !e->bwd)
    return fail("cuDNN attention backward: shape B=%d T=%d C=%d NH=%d NKV=%d %s was not "
                "prepared%s", B, T, C, NH, NKV, st_dtype_name(dt),
                e ? " for the backward (its forward only: --attention mixed)" : "");
  float scale = 1.0f / sqrtf((float)(C / NH)), one = 1.0f, neg = -FLT_MAX;
  const int64_t vcol = C + (int64_t)NKV * (C / NH);
  const int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_DO, UID_STATS, UID_DQ, UID_DK, UID_DV,
                          UID_SCALE, UID_ONE, UID_NEG};
  /* one call per group of bseq sequences, each on its own rows: the
   * sequences never meet in attention, and the group's plan has the same
   * strides as the whole micro-batch's */
  const int64_t row = C + 2 * (int64_t)NKV * (C / NH);
  for (int b = 0; b < B; b += e->bseq) {
    const int64_t r0 = (int64_t)b * T;
    const void *q = column(qkv, r0 * row, dt);
    void *dq = column(dqkv, r0 * row, dt);
    void *ptrs[] = {column(q, 0, dt),
                    column(q, C, dt),
                    column(q, vcol, dt),
                    column(out, r0 * C, dt),
                    column(dout, r0 * C, dt),
                    (void *)(uintptr_t)(stats + (size_t)b * NH * T),
                    column(dq, 0, dt),
                    column(dq, C, dt),
                    column(dq, vcol, dt),
                    &scale,
                    &one,
                    &neg};
    if (execute(e->bwd, 12, uids, ptrs, workspace, "attention backward")) return -1;
  }
  return 0;
}
