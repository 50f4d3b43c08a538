/* matmul.cu - the linear layer out = inp @ w^T + bias through cuBLASLt with
 * CUBLAS_COMPUTE_32F (fp32 accumulation; fp32 tables run plain FFMA, not
 * TF32, so results stay close to the CPU reference; bf16 and fp16 tables
 * run on tensor cores). Backward: dinp = dout @ w (beta = 0) and
 * dw += dout^T @ inp (beta = 1) are GEMMs; dbias += colsum(dout) is a
 * two-pass column sum.
 *
 * cuBLAS is column-major. A row-major [R, K] matrix is a column-major
 * [K, R] one, so with w [OC, C], inp [N, C] and out [N, OC] row-major:
 *   forward:  out^T[OC,N] = (w as [C,OC])^T  * (inp as [C,N])       (T, N)
 *   dinp:    dinp^T[C,N]  = (w as [C,OC])    * (dout as [OC,N])     (N, N)
 *   dw:        dw^T[C,OC] = (inp as [C,N])   * (dout as [OC,N])^T   (N, T)
 * The forward adds the bias with cuBLASLt's bias epilogue (a vector over the
 * rows of out^T, i.e. over OC, in the storage type) when the heuristic
 * offers it. Types: A, B, C, D and the bias are in the storage type, except
 * dw, whose C and D are fp32 (A and B bf16/fp16, a combination cuBLASLt
 * supports with COMPUTE_32F): weight gradients are never rounded to 16 bits.
 *
 * Determinism: cuBLASLt gives bit-identical results for the same algorithm,
 * problem and workspace on one stream. Each problem's descriptors and the
 * heuristic's algorithm are made once and kept in a small cache, so a shape
 * keeps its algorithm for the life of the process. Split-K is asked for
 * with partial sums kept in the compute type (fp32) and reduced in a
 * separate pass: the in-place and output-type schemes would add partials in
 * bf16/fp16 (they are taken only if the heuristic offers nothing else).
 *
 * The handle and a 32 MiB workspace are made by reserve at train setup
 * (cuda_matmul_reserve, the memory plan's size, carved from the arena), or
 * else on the first
 * matmul, on the device current then (st_cuda_bind_device runs before any
 * op).
 */
#include <cublasLt.h>
#include <errno.h>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/gemm_cache.h"
#include "util/envparse.h"

/* CUBLAS_STATUS_ALLOC_FAILED is an out-of-memory, reported as such. */
#define ST_CUBLAS_CHECK(call)                                                         \
  do {                                                                                \
    cublasStatus_t st_s_ = (call);                                                    \
    if (st_s_ == CUBLAS_STATUS_ALLOC_FAILED)                                          \
      st_cuda_oom(#call, cublasLtGetStatusString(st_s_), __FILE__, __LINE__);         \
    if (st_s_ != CUBLAS_STATUS_SUCCESS)                                               \
      st_cuda_fail(cublasLtGetStatusString(st_s_), __FILE__, __LINE__);               \
  } while (0)

static cublasLtHandle_t g_lt;
static void *g_workspace;
static size_t g_workspace_bytes = (size_t)32 << 20; /* ST_PLAN_CUBLASLT_WORKSPACE */

static void lt_init(void) {
  if (g_lt) return;
  ST_CUBLAS_CHECK(cublasLtCreate(&g_lt));
  cuda_note_alloc("cuBLASLt workspace", g_workspace_bytes);
  ST_CUDA_CHECK(cudaMalloc(&g_workspace, g_workspace_bytes));
}

int cuda_matmul_reserve(size_t bytes) {
  if (bytes == 0) bytes = g_workspace_bytes;
  if (g_lt) return g_workspace_bytes >= bytes ? 0 : -1;
  if (cublasLtCreate(&g_lt) != CUBLAS_STATUS_SUCCESS) {
    g_lt = NULL;
    return -1;
  }
  g_workspace = cuda_buffer(bytes, "cublaslt_workspace"); /* train: from the arena */
  if (!g_workspace) {
    cublasLtDestroy(g_lt);
    g_lt = NULL;
    return -1;
  }
  g_workspace_bytes = bytes;
  return 0;
}

void cuda_matmul_leave_arena(const st_arena *arena) {
  if (!g_workspace || !st_arena_owns(arena, g_workspace)) return;
  cublasLtDestroy(g_lt); /* lt_init makes both again if a matmul follows */
  g_lt = NULL;
  g_workspace = NULL;
  g_workspace_bytes = (size_t)32 << 20;
}

/* Largest power of two (<= 256, >= the element size) dividing the address:
 * the heuristic must only offer kernels that work with the real alignment
 * (views into the flat parameter vector can sit at any element offset). */
static uint32_t alignment_of(const void *p, uint32_t elem) {
  uintptr_t a = (uintptr_t)p;
  uint32_t al = 256;
  while (al > elem && (a % al) != 0) al >>= 1;
  return al;
}

static uint32_t type_size(cudaDataType_t t) { return t == CUDA_R_32F ? 4u : 2u; }

/* Everything the descriptors and the heuristic's choice depend on. Compared
 * with memcmp, so it is zeroed before it is filled (padding included). */
typedef enum { EPI_NONE = 0, EPI_GELU_AUX = 1, EPI_DGELU = 2 } lt_epi;

typedef struct {
  int m, n, k, lda, ldb, ldd;
  int ta, tb, has_bias, epi;
  cudaDataType_t ab, cd;
  uint32_t al_a, al_b, al_c, al_d, al_bias, al_aux;
} lt_key;

/* Which algorithm a problem runs (ST_GEMM_SEARCH, util/envparse.h).
 *
 * Default ("exact"): the first call of each problem times the heuristic's
 * first 8 algorithms on that call's own operands and keeps the fastest of
 * those whose output is bit for bit the heuristic's first's (a 64-bit
 * digest of D, and of aux where the GELU epilogue writes it, compared).
 * Algorithms that differ only in tile shape, cluster or pipeline depth walk
 * k in the same order and agree exactly; a split-K or stream-K one sums in
 * another order, differs in the last bits, and is not kept. So the result
 * is the heuristic's first's whatever the timing picks, in every process,
 * and the run stays bit-reproducible. A problem is timed only when doing so
 * needs no memory: beta 0 or C apart from D (D is pure output, rewritten
 * by the real call), or D accumulating in place (the weight gradients)
 * while it is all zero, as at the first micro-batch, zeroed again after,
 * and then only among algorithms that do not split k (search_exact says
 * why); a D in place that is not zero keeps the heuristic's first, since
 * timing it would need a saved copy. A problem whose
 * first output is mostly exact zeros (a zero operand: LoRA's B at step 0)
 * says nothing about the order and keeps the heuristic's first.
 *
 * "2".."8": the fastest of the first N, whatever order it sums in (a warm-up
 * and 5 timed runs each; D is saved before and restored after, so the
 * call's result is what the chosen algorithm alone computes). On one H200
 * (GPT-2 124M bf16, micro-batch 32, T 1024) the fastest of 8 beat the first
 * by up to 8.4% a GEMM and 1.9% a step. Timing noise can pick differently
 * in another process, and a different algorithm sums in another order:
 * with ST_GEMM_CACHE=FILE the choices are written there
 * (kernels/gemm_cache.h) and every later process on the same GPU model and
 * cuBLASLt takes them without timing, so its results are bit-identical to
 * the run that chose. The file is read and written only in this mode
 * (cache_path): ST_GEMM_CACHE alone is ignored. The saved copy of D is
 * outside the memory plan (up to the largest GEMM output, 201 MB at GPT-2
 * 124M micro-batch 32, freed at once) and only while a problem is timed;
 * when the GPU has no room for it, that problem keeps the heuristic's first.
 *
 * "off" or "1": the heuristic's first, untimed.
 * Searching, a problem keeps its choice for the life of the process, even
 * when its plan is evicted and rebuilt (g_choices). */
#define LT_SEARCH_MAX 8

typedef struct {
  lt_key key;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulAlgo_t algo;
  int ok; /* 0: no algorithm (cached too, so the heuristic is asked once) */
  int ncand; /* ST_GEMM_SEARCH: candidates still to be timed on the first call */
  cublasLtMatmulAlgo_t cand[LT_SEARCH_MAX];
} lt_plan;

/* A GPT-2 step uses about 15 shapes (5 forward, 10 backward) per micro-batch
 * size; evaluation adds a few. Past the capacity, plans are replaced round
 * robin; a replaced shape gets the same algorithm again from the heuristic,
 * or under ST_GEMM_SEARCH the one it was given before (g_choices below). */
#define LT_CACHE 64
static lt_plan g_plans[LT_CACHE];
static int g_nplans, g_next_evict;

/* ST_GEMM_SEARCH: the algorithm each problem got on its first call in this
 * process, by key, never evicted. Without it, a problem whose plan the
 * round robin above replaced would be timed again when it came back and
 * could take another algorithm mid-run: another summation order, so results
 * that change in the middle of a run (ST_GEMM_CACHE's file would give the
 * choice back, but the file is optional and may be unwritable). Every
 * choice made while searching is kept here (timed, read from the file, or
 * the heuristic's first when there was no memory to time), and a rebuilt
 * plan takes it without timing. Past LT_CHOICES problems nothing new is
 * timed: a new problem takes the heuristic's first, as it will every time
 * its plan is rebuilt. A whole process uses far fewer problems. */
#define LT_CHOICES 1024
typedef struct {
  lt_key key;
  cublasLtMatmulAlgo_t algo;
} lt_choice;
static lt_choice g_choices[LT_CHOICES];
static int g_nchoices;

static const cublasLtMatmulAlgo_t *choice_find(const lt_key *key) {
  for (int i = 0; i < g_nchoices; i++)
    if (memcmp(&g_choices[i].key, key, sizeof *key) == 0) return &g_choices[i].algo;
  return NULL;
}

/* Keeps key's first choice; a later one for the same key, or one past the
 * table's capacity, is dropped. */
static void choice_keep(const lt_key *key, const cublasLtMatmulAlgo_t *algo) {
  if (g_nchoices == LT_CHOICES || choice_find(key)) return;
  memcpy(&g_choices[g_nchoices].key, key, sizeof *key); /* memcmp'd: padding too */
  g_choices[g_nchoices].algo = *algo;
  g_nchoices++;
}

static void plan_destroy(lt_plan *p) {
  cublasLtMatrixLayoutDestroy(p->ld);
  cublasLtMatrixLayoutDestroy(p->lb);
  cublasLtMatrixLayoutDestroy(p->la);
  cublasLtMatmulDescDestroy(p->desc);
}

/* ST_GEMM_SEARCH, parsed once: count, the candidates a problem's first call
 * times (1: none, the heuristic's first); any, 1 when the fastest is kept
 * whatever its summation order (2..8) rather than only a bit-identical one
 * (exact). */
typedef struct {
  int count, any;
} lt_search_setting;

static lt_search_setting search_setting(void) {
  static lt_search_setting s = {-1, 0};
  if (s.count < 0) {
    const char *e = getenv("ST_GEMM_SEARCH");
    if (st_envparse_gemm_search(e, &s.count, &s.any) != 0) {
      fprintf(stderr, "shardtrain: warning: ST_GEMM_SEARCH=%s is not exact, off or a whole "
              "number from 1 to %d; the default (exact) is kept\n", e, LT_SEARCH_MAX);
      (void)st_envparse_gemm_search(NULL, &s.count, &s.any);
    }
  }
  return s;
}

static int search_count(void) { return search_setting().count; }

/* 1 when the problems may keep an algorithm that sums in another order. */
static int search_any(void) {
  const lt_search_setting s = search_setting();
  return s.count > 1 && s.any;
}

/* One line per searched problem on stderr only when ST_GEMM_SEARCH is set:
 * the default search is silent. */
static int search_verbose(void) {
  const char *e = getenv("ST_GEMM_SEARCH");
  return e && e[0];
}

/* ST_GEMM_CACHE, when searching in any order; NULL otherwise. */
static const char *cache_path(void) {
  const char *e = getenv("ST_GEMM_CACHE");
  return search_any() && e && e[0] ? e : NULL;
}

/* The cache's DEVICE word: GPU model and cuBLASLt version, blanks made '_'
 * (an algorithm's words are only meaningful to the same library on the
 * same architecture). */
static const char *cache_device(void) {
  static char dev[320];
  if (!dev[0]) {
    int d = 0;
    cudaDeviceProp prop;
    if (cudaGetDevice(&d) != cudaSuccess || cudaGetDeviceProperties(&prop, d) != cudaSuccess)
      snprintf(prop.name, sizeof prop.name, "unknown");
    snprintf(dev, sizeof dev, "%s-sm%d%d-cublasLt%zu", prop.name, prop.major, prop.minor,
             cublasLtGetVersion());
    for (char *c = dev; *c; c++)
      if (*c == ' ' || *c == '\t') *c = '_';
  }
  return dev;
}

/* The key's fields as the cache's integers, in declaration order. */
static int cache_key(const lt_key *k, long long out[ST_GEMM_KEY_MAX]) {
  const long long f[] = {k->m,   k->n,    k->k,    k->lda,  k->ldb,  k->ldd,     k->ta,
                         k->tb,  k->has_bias, k->epi, k->ab,  k->cd,   k->al_a,    k->al_b,
                         k->al_c, k->al_d, k->al_bias, k->al_aux};
  const int n = (int)(sizeof f / sizeof f[0]);
  memcpy(out, f, sizeof f);
  return n;
}

/* 1 when algo runs p's problem within the workspace. */
static int algo_usable(const lt_plan *p, const cublasLtMatmulAlgo_t *algo) {
  cublasLtMatmulHeuristicResult_t check;
  return cublasLtMatmulAlgoCheck(g_lt, p->desc, p->la, p->lb, p->ld, p->ld, algo, &check) ==
             CUBLAS_STATUS_SUCCESS &&
         check.workspaceSize <= g_workspace_bytes;
}

/* Asks the heuristic for the best algorithm under the key's alignments and
 * the given split-K reduction schemes; 1 when it offers one. Searching
 * (p->ncand set), the problem's earlier choice in this process wins, then
 * ST_GEMM_CACHE's; otherwise the first call times the candidates. */
static int plan_heuristic(lt_plan *p, uint32_t schemes) {
  const lt_key *key = &p->key;
  cublasLtMatmulPreference_t pref;
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  uint64_t ws = g_workspace_bytes;
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes));
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key->al_a, sizeof key->al_a));
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key->al_b, sizeof key->al_b));
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key->al_c, sizeof key->al_c));
  ST_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key->al_d, sizeof key->al_d));
  cublasLtMatmulHeuristicResult_t heur[LT_SEARCH_MAX];
  int found = 0;
  const int want = search_count();
  /* The first is asked for alone, as ST_GEMM_SEARCH=off asks: the library
   * does not promise that a longer list starts with the same algorithm,
   * and the exact search must compare against what off would run. */
  cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(g_lt, p->desc, p->la, p->lb, p->ld, p->ld,
                                                     pref, 1, heur, &found);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) {
    cublasLtMatmulPreferenceDestroy(pref);
    return 0;
  }
  p->algo = heur[0].algo;
  p->ncand = 0;
  if (want > 1) {
    cublasLtMatmulHeuristicResult_t more[LT_SEARCH_MAX];
    int nmore = 0;
    if (cublasLtMatmulAlgoGetHeuristic(g_lt, p->desc, p->la, p->lb, p->ld, p->ld, pref, want,
                                       more, &nmore) != CUBLAS_STATUS_SUCCESS)
      nmore = 0;
    p->cand[0] = p->algo; /* then the others, the first left out wherever it is */
    int n = 1;
    for (int i = 0; i < nmore && n < want; i++)
      if (memcmp(&more[i].algo, &p->algo, sizeof p->algo) != 0) p->cand[n++] = more[i].algo;
    p->ncand = n > 1 ? n : 0;
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (!p->ncand) return 1;
  const cublasLtMatmulAlgo_t *kept = choice_find(key);
  if (kept) { /* this process's choice for the problem, whose plan was replaced */
    /* not runnable any more (a smaller workspace since): the heuristic's
     * first, untimed, as every later rebuild will also do */
    if (algo_usable(p, kept)) p->algo = *kept;
    p->ncand = 0;
    return 1;
  }
  const char *path = cache_path();
  if (path) { /* an earlier process's choice, if it still checks out */
    long long ck[ST_GEMM_KEY_MAX];
    unsigned long long words[ST_GEMM_ALGO_WORDS];
    const int nk = cache_key(key, ck);
    const int r = st_gemm_cache_find(path, cache_device(), ck, nk, words);
    if (r < 0)
      fprintf(stderr, "shardtrain: warning: ST_GEMM_CACHE=%s cannot be read (%s); timing "
              "instead\n", path, strerror(errno));
    cublasLtMatmulAlgo_t cached;
    static_assert(sizeof cached == sizeof words, "cublasLtMatmulAlgo_t is 8 64-bit words");
    memcpy(&cached, words, sizeof cached);
    if (r == 1 && algo_usable(p, &cached)) {
      p->algo = cached;
      p->ncand = 0;
      choice_keep(key, &p->algo);
      return 1;
    }
  }
  if (g_nchoices == LT_CHOICES) { /* no room to keep a choice: do not make one */
    static int warned;
    if (!warned)
      fprintf(stderr, "shardtrain: warning: ST_GEMM_SEARCH: choices kept for %d GEMM problems, "
              "the most one process holds; later problems take the heuristic's first "
              "algorithm, untimed\n", LT_CHOICES);
    warned = 1;
    p->ncand = 0;
  }
  return 1;
}

/* bias: the first call's bias pointer (the heuristic looks at its alignment,
 * which the key fixes for every later call that uses this plan). */
static void plan_build(lt_plan *p, const lt_key *key, const void *bias) {
  memset(p, 0, sizeof *p);
  p->key = *key;
  ST_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t opa = key->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t opb = key->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa,
                                                 sizeof opa));
  ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb,
                                                 sizeof opb));
  cublasLtEpilogue_t epi = key->epi == EPI_GELU_AUX ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                              : CUBLASLT_EPILOGUE_GELU_AUX)
                           : key->epi == EPI_DGELU ? CUBLASLT_EPILOGUE_DGELU
                           : bias                  ? CUBLASLT_EPILOGUE_BIAS
                                                   : CUBLASLT_EPILOGUE_DEFAULT;
  ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                 sizeof epi));
  if (bias) {
    int32_t bias_type = key->cd;
    ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                   &bias_type, sizeof bias_type));
    ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &bias, sizeof bias));
  }
  if (key->epi != EPI_NONE) { /* the GELU input, laid out like D */
    int64_t aux_ld = key->ldd;
    int32_t aux_type = key->cd;
    ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                   &aux_ld, sizeof aux_ld));
    ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof aux_type));
  }
  const int m = key->m, n = key->n, k = key->k;
  ST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, key->ab, key->ta ? k : m, key->ta ? m : k,
                                             key->lda));
  ST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, key->ab, key->tb ? n : k, key->tb ? k : n,
                                             key->ldb));
  ST_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->ld, key->cd, m, n, key->ldd));
  /* fp32 split-K partials first; the other schemes (still deterministic:
   * in-place reduction is sequenced by counters) only when nothing else
   * is offered */
  const uint32_t fp32_partials =
      CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  p->ok = plan_heuristic(p, fp32_partials) || plan_heuristic(p, CUBLASLT_REDUCTION_SCHEME_MASK);
}

static lt_plan *plan_get(const lt_key *key, const void *bias) {
  for (int i = 0; i < g_nplans; i++)
    if (memcmp(&g_plans[i].key, key, sizeof *key) == 0) return &g_plans[i];
  lt_plan *p;
  if (g_nplans < LT_CACHE) {
    p = &g_plans[g_nplans++];
  } else {
    p = &g_plans[g_next_evict];
    g_next_evict = (g_next_evict + 1) % LT_CACHE;
    plan_destroy(p); /* cublasLtMatmul reads descriptors when called: nothing in flight uses them */
  }
  plan_build(p, key, bias);
  return p;
}

/* ms of one run of algo on p's problem, the mean of 5 after the caller's
 * warm-up, between events e0 and e1 on stream 0. Synchronises. */
static float time_algo(const lt_plan *p, const cublasLtMatmulAlgo_t *algo, void *d,
                       const void *a, const void *b, const void *c, float beta, cudaEvent_t e0,
                       cudaEvent_t e1) {
  const float alpha = 1.0f;
  float ms = 0.0f;
  ST_CUDA_CHECK(cudaEventRecord(e0, 0));
  for (int r = 0; r < 5; r++)
    ST_CUBLAS_CHECK(cublasLtMatmul(g_lt, p->desc, &alpha, a, p->la, b, p->lb, &beta, c, p->ld, d,
                                   p->ld, algo, g_workspace, g_workspace_bytes, 0));
  ST_CUDA_CHECK(cudaEventRecord(e1, 0));
  ST_CUDA_CHECK(cudaEventSynchronize(e1));
  ST_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  return ms / 5;
}

/* ST_GEMM_SEARCH: time p's candidates on this call's operands, keep the
 * fastest in p->algo. D is saved first and restored after, so the real call
 * that follows sees what it would have (with beta 1, C may be D: dw
 * accumulates into itself). Only D: the GELU_AUX epilogue's aux output (the
 * GELU input) is written only by forward calls with beta 0, which read
 * neither D nor aux, and the real call after the search writes all of aux
 * again with the chosen algorithm, so it ends up as that algorithm alone
 * computes it. DGELU's aux is an input and is never written. */
static void search(lt_plan *p, void *d, const void *a, const void *b, const void *c, float beta) {
  const lt_key *k = &p->key;
  const size_t dbytes = (size_t)k->ldd * k->n * type_size(k->cd);
  void *saved = NULL;
  /* memory of the search's own, outside the plan and the arena, freed below;
   * none left on the GPU: no search for this problem, the heuristic's first */
  if (cudaMalloc(&saved, dbytes) != cudaSuccess) {
    (void)cudaGetLastError();
    fprintf(stderr, "shardtrain: warning: ST_GEMM_SEARCH: no %zu bytes of GPU memory to time "
            "m=%d n=%d k=%d; the heuristic's first algorithm is kept\n", dbytes, k->m, k->n,
            k->k);
    p->ncand = 0;
    choice_keep(k, &p->algo); /* kept too: a rebuilt plan must not time it later */
    return;
  }
  ST_CUDA_CHECK(cudaMemcpy(saved, d, dbytes, cudaMemcpyDeviceToDevice));
  cudaEvent_t e0, e1;
  ST_CUDA_CHECK(cudaEventCreate(&e0));
  ST_CUDA_CHECK(cudaEventCreate(&e1));
  const float alpha = 1.0f;
  float best = -1.0f, first = -1.0f;
  int besti = 0;
  for (int i = 0; i < p->ncand; i++) {
    if (cublasLtMatmul(g_lt, p->desc, &alpha, a, p->la, b, p->lb, &beta, c, p->ld, d, p->ld,
                       &p->cand[i], g_workspace, g_workspace_bytes, 0) != CUBLAS_STATUS_SUCCESS)
      continue; /* warm-up; an algorithm that fails here is not a candidate */
    const float ms = time_algo(p, &p->cand[i], d, a, b, c, beta, e0, e1);
    if (i == 0) first = ms;
    if (best < 0 || ms < best) best = ms, besti = i;
  }
  p->algo = p->cand[besti];
  p->ncand = 0;
  choice_keep(k, &p->algo);
  ST_CUDA_CHECK(cudaMemcpy(d, saved, dbytes, cudaMemcpyDeviceToDevice));
  ST_CUDA_CHECK(cudaFree(saved));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  fprintf(stderr,
          "gemm search m=%d n=%d k=%d t%d%d epi=%d beta=%g: heuristic's first %.4f ms, "
          "fastest #%d %.4f ms (%.1f%%)\n",
          k->m, k->n, k->k, k->ta, k->tb, k->epi, beta, first, besti, best,
          first > 0 && best >= 0 ? 100.0 * (first - best) / first : 0.0);
  const char *path = cache_path();
  if (path) {
    long long ck[ST_GEMM_KEY_MAX];
    unsigned long long words[ST_GEMM_ALGO_WORDS];
    memcpy(words, &p->algo, sizeof words);
    const int nk = cache_key(k, ck);
    if (st_gemm_cache_add(path, cache_device(), ck, nk, words) != 0)
      fprintf(stderr, "shardtrain: warning: ST_GEMM_CACHE=%s: cannot append this choice (%s); "
              "later runs will time it again\n", path, strerror(errno));
  }
}

/* out[0] += the sum over the 16-bit units u_i of x of splitmix64(u_i, i),
 * out[1] += how many are not zero. Integer sums: the same bytes give the
 * same digest whatever the schedule. */
__global__ void lt_digest_kernel(const uint16_t *x, size_t n, unsigned long long *out) {
  unsigned long long h = 0, nz = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    unsigned long long z = ((unsigned long long)x[i] << 44) ^ i;
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    h += z ^ (z >> 31);
    nz += x[i] != 0;
  }
  for (int o = 16; o > 0; o >>= 1) {
    h += __shfl_down_sync(0xffffffffu, h, o);
    nz += __shfl_down_sync(0xffffffffu, nz, o);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(out, h);
    atomicAdd(out + 1, nz);
  }
}

typedef struct {
  unsigned long long h, nz;
} lt_digest;

/* The digest of bytes (even) at x and, when aux is not NULL, of as many at
 * aux, added; computed in the first 16 bytes of the cuBLASLt workspace,
 * whose content is saved first and put back after, since cuBLASLt does not
 * document what its split-K and stream-K kernels leave there between calls.
 * Every GEMM is on stream 0, as these copies are, so none runs in between.
 * Synchronises. */
static lt_digest digest_of(const void *x, const void *aux, size_t bytes) {
  unsigned long long *dev = (unsigned long long *)g_workspace, kept[2];
  ST_CUDA_CHECK(cudaMemcpy(kept, dev, sizeof kept, cudaMemcpyDeviceToHost));
  ST_CUDA_CHECK(cudaMemsetAsync(dev, 0, 2 * sizeof *dev, 0));
  const size_t n = bytes / 2;
  const int threads = 256;
  const unsigned blocks = (unsigned)(n / threads + 1 < 1024 ? n / threads + 1 : 1024);
  lt_digest_kernel<<<blocks, threads>>>((const uint16_t *)x, n, dev);
  if (aux) lt_digest_kernel<<<blocks, threads>>>((const uint16_t *)aux, n, dev);
  ST_CUDA_LAUNCHED();
  lt_digest r;
  unsigned long long host[2];
  ST_CUDA_CHECK(cudaMemcpy(host, dev, sizeof host, cudaMemcpyDeviceToHost));
  ST_CUDA_CHECK(cudaMemcpy(dev, kept, sizeof kept, cudaMemcpyHostToDevice));
  r.h = host[0], r.nz = host[1];
  return r;
}

/* How many parts algo splits k into (cuBLASLt's CUBLASLT_ALGO_CONFIG_SPLITK_NUM;
 * 1: none). 0 when the library does not say. */
static uint32_t splitk_of(const cublasLtMatmulAlgo_t *algo) {
  uint32_t v = 0;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &v, sizeof v,
                                           &written) != CUBLAS_STATUS_SUCCESS ||
      written != sizeof v)
    return 0;
  return v;
}

/* The default search (ST_GEMM_SEARCH exact; "Which algorithm a problem
 * runs" above): time p's candidates on this call's operands and keep in
 * p->algo the fastest whose output (D, and aux_out when the epilogue writes
 * it) is bit for bit the heuristic's first's. Needs no memory: a problem
 * whose D is accumulated in place (c == d, beta != 0) is timed only while
 * D is zero, and keeps the first otherwise. */
static void search_exact(lt_plan *p, void *d, const void *a, const void *b, const void *c,
                         float beta, const void *aux_out) {
  const lt_key *k = &p->key;
  const size_t dbytes = (size_t)k->ldd * k->n * type_size(k->cd);
  const float alpha = 1.0f;
  int kept = 0, same = 1, besti = 0;
  float first = -1.0f, best = -1.0f;
  const char *why = NULL;
  /* D accumulating in place (a weight gradient) is timed only while it is
   * all zero (the first micro-batch's first call), since then zero is what
   * to put back, and only among algorithms that do not split k: one that
   * does not adds C once to the whole accumulator, fl(acc + C), so equal
   * accumulators (what a zero C compares) give equal results for every C;
   * one that splits k may add C among its partial sums. */
  const int in_place = c == d && beta != 0.0f;
  /* the host-side query first: the digest reads D and synchronises */
  if (g_workspace_bytes < 16) why = "no workspace for the digest";
  else if (in_place && splitk_of(&p->cand[0]) != 1) why = "D accumulates in place, first splits k";
  else if (in_place && digest_of(d, NULL, dbytes).nz != 0) why = "D accumulates in place, not zero";
  const int timing = !why; /* the loop below runs the candidates into D */
  cudaEvent_t e0 = NULL, e1 = NULL;
  lt_digest ref = {0, 0};
  if (timing) {
    ST_CUDA_CHECK(cudaEventCreate(&e0));
    ST_CUDA_CHECK(cudaEventCreate(&e1));
  }
  for (int i = 0; !why && i < p->ncand; i++) {
    if (in_place) {
      if (i > 0 && splitk_of(&p->cand[i]) != 1) continue;
      ST_CUDA_CHECK(cudaMemsetAsync(d, 0, dbytes, 0)); /* the earlier timed runs added into D */
    }
    /* one run to compare, which is also the warm-up; an algorithm that
     * fails here is not a candidate (the heuristic's first must not) */
    if (cublasLtMatmul(g_lt, p->desc, &alpha, a, p->la, b, p->lb, &beta, c, p->ld, d, p->ld,
                       &p->cand[i], g_workspace, g_workspace_bytes, 0) != CUBLAS_STATUS_SUCCESS) {
      if (i == 0) why = "the heuristic's first failed to run";
      continue;
    }
    const lt_digest g = digest_of(d, aux_out, dbytes);
    if (i == 0) {
      ref = g;
      /* mostly exact zeros: a zero operand, which every order agrees on */
      const unsigned long long units = (dbytes / 2) * (aux_out ? 2 : 1);
      if (g.nz < units / 4) why = "its output is mostly zero";
    } else if (g.h != ref.h || g.nz != ref.nz) {
      continue;
    } else {
      same++;
    }
    if (why) break;
    const float ms = time_algo(p, &p->cand[i], d, a, b, c, beta, e0, e1);
    if (i == 0) first = ms;
    if (best < 0 || ms < best) best = ms, besti = i;
    kept = 1;
  }
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  /* D was zero before the search (checked above): zero again for the real
   * call, which adds into it */
  if (in_place && timing) ST_CUDA_CHECK(cudaMemsetAsync(d, 0, dbytes, 0));
  p->algo = kept && !why ? p->cand[besti] : p->cand[0];
  const int ncand = p->ncand;
  p->ncand = 0;
  choice_keep(k, &p->algo);
  if (!search_verbose()) return;
  if (why || !kept)
    fprintf(stderr, "gemm search (exact) m=%d n=%d k=%d t%d%d epi=%d beta=%g: not timed (%s); "
            "the heuristic's first\n", k->m, k->n, k->k, k->ta, k->tb, k->epi, beta,
            why ? why : "nothing ran");
  else
    fprintf(stderr,
            "gemm search (exact) m=%d n=%d k=%d t%d%d epi=%d beta=%g: %d of %d bit-identical; "
            "heuristic's first %.4f ms, fastest identical #%d %.4f ms (%.1f%%)\n",
            k->m, k->n, k->k, k->ta, k->tb, k->epi, beta, same, ncand, first, besti, best,
            first > 0 ? 100.0 * (first - best) / first : 0.0);
}

/* D[m,n] = op(A)[m,k] op(B)[k,n] (+ bias[m]) + beta * C, column-major, with
 * op = transpose when ta/tb. A is stored [m,k] (or [k,m] when ta) with
 * leading dim lda; likewise B. A and B have type ab, D and the bias cd.
 * epi EPI_GELU_AUX: aux = that result, D = gelu(aux); EPI_DGELU: D = result
 * * gelu'(aux); aux is laid out like D. Returns 0, or -1 when cuBLASLt offers
 * no algorithm (only asked with a bias or an epilogue: the caller then does
 * that part itself). */
static int lt_matmul_epi(void *d, const void *a, const void *b, const void *bias, int m, int n,
                         int k, int ta, int tb, int lda, int ldb, int ldd, float beta,
                         cudaDataType_t ab, cudaDataType_t cd, lt_epi epi, const void *aux,
                         const void *c) {
  lt_init();
  if (!c) c = d;
  lt_key key;
  memset(&key, 0, sizeof key);
  key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldd = ldd;
  key.ta = ta, key.tb = tb, key.has_bias = bias != NULL, key.ab = ab, key.cd = cd;
  key.al_a = alignment_of(a, type_size(ab));
  key.al_b = alignment_of(b, type_size(ab));
  key.al_c = alignment_of(c, type_size(cd));
  key.al_d = alignment_of(d, type_size(cd));
  key.al_bias = bias ? alignment_of(bias, type_size(cd)) : 0;
  key.epi = epi;
  key.al_aux = aux ? alignment_of(aux, type_size(cd)) : 0;
  lt_plan *p = plan_get(&key, bias);
  if (!p->ok) {
    if (!bias && epi == EPI_NONE)
      st_cuda_fail("cuBLASLt offers no algorithm for this matmul", __FILE__, __LINE__);
    return -1;
  }
  if (bias) /* this call's bias: same alignment as the one the plan was made with */
    ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &bias, sizeof bias));
  if (aux)
    ST_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
  const float alpha = 1.0f;
  if (p->ncand) {
    if (search_any()) search(p, d, a, b, c, beta);
    else search_exact(p, d, a, b, c, beta, epi == EPI_GELU_AUX ? aux : NULL);
  }
  ST_CUBLAS_CHECK(cublasLtMatmul(g_lt, p->desc, &alpha, a, p->la, b, p->lb, &beta, c, p->ld, d,
                                 p->ld, &p->algo, g_workspace, g_workspace_bytes, 0));
  return 0;
}

static int lt_matmul(void *d, const void *a, const void *b, const void *bias, int m, int n,
                     int k, int ta, int tb, int lda, int ldb, int ldd, float beta,
                     cudaDataType_t ab, cudaDataType_t cd) {
  return lt_matmul_epi(d, a, b, bias, m, n, k, ta, tb, lda, ldb, ldd, beta, ab, cd, EPI_NONE,
                       NULL, NULL);
}

/* out[n, o] += bias[o]: used only when the bias epilogue is not offered. */
template <typename S>
__global__ void add_bias_kernel(S *out, const S *bias, int OC, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = st_st<S>(st_ld(out[i]) + st_ld(bias[i % OC]));
}

/* dbias column sums, pass 1: block (band of 32 V columns, chunk of rows);
 * thread (x, y) holds columns [V (band + x), + V) and sums rows y, y+8, ...
 * of the chunk, then the lanes are added in order. The same sums for any V
 * (layernorm.cu's part kernel says why V > 1). */
template <typename S, int V>
__global__ void bias_backward_part_kernel(float *part, const S *dout, int N, int OC,
                                          int rows_per_chunk) {
  __shared__ float s[ST_COLSUM_LANES][ST_COLSUM_BAND * V];
  const int tx = threadIdx.x, ty = threadIdx.y, chunk = blockIdx.y;
  const int o0 = blockIdx.x * ST_COLSUM_BAND * V, o = o0 + tx * V;
  const int r0 = chunk * rows_per_chunk;
  const int r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float acc[V];
#pragma unroll
  for (int k = 0; k < V; k++) acc[k] = 0.0f;
  if (o < OC)
    for (int r = r0 + ty; r < r1; r += ST_COLSUM_LANES) {
      float d[V];
      st_load<S, V>(d, dout + (int64_t)r * OC + o);
#pragma unroll
      for (int k = 0; k < V; k++) acc[k] += d[k];
    }
#pragma unroll
  for (int k = 0; k < V; k++) s[ty][tx * V + k] = acc[k];
  __syncthreads();
  for (int j = ty * ST_COLSUM_BAND + tx; j < ST_COLSUM_BAND * V;
       j += ST_COLSUM_BAND * ST_COLSUM_LANES) {
    if (o0 + j >= OC) break;
    float t = 0.0f;
    for (int y = 0; y < ST_COLSUM_LANES; y++) t += s[y][j];
    part[(int64_t)chunk * OC + o0 + j] = t;
  }
}

/* Pass 2: dbias[o] += partials in chunk order. */
__global__ void bias_backward_reduce_kernel(float *dbias, const float *part, int OC, int chunks) {
  int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= OC) return;
  float acc = dbias[o];
  for (int k = 0; k < chunks; k++) acc += part[(int64_t)k * OC + o];
  dbias[o] = acc;
}

/* dw += dout^T @ inp and dbias += colsum(dout): the weight side of
 * backward, shared by the plain and the GELU-fused form. */
template <typename S>
static void weight_grads(float *dw, float *dbias, const void *dout, const void *inp, int N, int C,
                         int OC) {
  constexpr cudaDataType_t dt = st_cuda_type<S>();
  /* dw NULL: a frozen weight (LoRA's base), no weight gradient */
  if (dw) lt_matmul(dw, inp, dout, NULL, C, OC, N, 0, 1, C, OC, C, 1.0f, dt, CUDA_R_32F);
  if (dbias) {
    const int rows = st_colsum_rows_per_chunk(N), chunks = st_colsum_chunks(N);
    float *part = (float *)cuda_scratch((size_t)chunks * OC * sizeof(float));
    constexpr int P = st_pack<S>();
    const dim3 block(ST_COLSUM_BAND, ST_COLSUM_LANES);
    if (OC % P == 0 && st_aligned16(dout)) {
      const dim3 grid(st_blocks(OC, ST_COLSUM_BAND * P), chunks);
      bias_backward_part_kernel<S, P><<<grid, block>>>(part, (const S *)dout, N, OC, rows);
    } else {
      const dim3 grid(st_blocks(OC, ST_COLSUM_BAND), chunks);
      bias_backward_part_kernel<S, 1><<<grid, block>>>(part, (const S *)dout, N, OC, rows);
    }
    ST_CUDA_LAUNCHED();
    bias_backward_reduce_kernel<<<st_blocks(OC, 256), 256>>>(dbias, part, OC, chunks);
    ST_CUDA_LAUNCHED();
  }
}

template <typename S>
void cuda_matmul_forward(void *out, const void *inp, const void *w, const void *bias, int N,
                         int C, int OC) {
  constexpr cudaDataType_t dt = st_cuda_type<S>();
  if (N == 0 || OC == 0) return;
  if (C == 0) { /* an empty sum: out = bias (or 0) */
    cuda_zero(out, (size_t)N * OC * sizeof(S));
  } else if (lt_matmul(out, w, inp, bias, OC, N, C, 1, 0, C, C, OC, 0.0f, dt, dt) == 0) {
    return;
  } else {
    lt_matmul(out, w, inp, NULL, OC, N, C, 1, 0, C, C, OC, 0.0f, dt, dt);
  }
  if (bias) {
    int64_t n = (int64_t)N * OC;
    add_bias_kernel<S><<<st_blocks_capped(n, 256), 256>>>((S *)out, (const S *)bias, OC, n);
    ST_CUDA_LAUNCHED();
  }
}

/* The residual rides in the epilogue as C with beta = 1: D = res + (W x +
 * bias) in fp32, rounded once. Against a separate residual kernel this saves
 * a write and two reads of the [N, OC] stream and the projection's own
 * output buffer. Without a fused algorithm: the two steps, as before. */
template <typename S>
void cuda_matmul_residual_forward(void *out, const void *inp, const void *w, const void *bias,
                                  const void *res, int N, int C, int OC) {
  constexpr cudaDataType_t dt = st_cuda_type<S>();
  if (N == 0 || OC == 0) return;
  if (C > 0 && lt_matmul_epi(out, w, inp, bias, OC, N, C, 1, 0, C, C, OC, 1.0f, dt, dt, EPI_NONE,
                             NULL, res) == 0)
    return;
  cuda_matmul_forward<S>(out, inp, w, bias, N, C, OC);
  cuda_residual_forward<S>(out, res, out, (int64_t)N * OC);
}

template <typename S>
void cuda_matmul_backward(void *dinp, float *dw, float *dbias, const void *dout,
                          const void *inp, const void *w, int N, int C, int OC) {
  constexpr cudaDataType_t dt = st_cuda_type<S>();
  if (N == 0 || C == 0 || OC == 0) return;
  /* dinp^T[C,N] = w[C,OC] * dout[OC,N] */
  lt_matmul(dinp, w, dout, NULL, C, N, OC, 0, 0, C, OC, C, 0.0f, dt, dt);
  /* dw^T[C,OC] += inp[C,N] * (dout[OC,N])^T, accumulated in fp32 */
  weight_grads<S>(dw, dbias, dout, inp, N, C, OC);
}

/* The input side alone (frozen weights: kernels/nf4_matmul.h). The same
 * GEMM as cuda_matmul_backward's dinp, so the same plan and the same bits. */
template <typename S>
void cuda_matmul_backward_input(void *dinp, const void *dout, const void *w, int N, int C,
                                int OC) {
  constexpr cudaDataType_t dt = st_cuda_type<S>();
  if (N == 0 || C == 0) return;
  if (OC == 0) { /* an empty sum */
    cuda_zero(dinp, (size_t)N * C * sizeof(S));
    return;
  }
  lt_matmul(dinp, w, dout, NULL, C, N, OC, 0, 0, C, OC, C, 0.0f, dt, dt);
}

/* GELU fused into the GEMM epilogue (cuBLASLt's tanh-form GELU) for bf16 and
 * fp16: saves a read and a write of the [N, 4C] activation each way. The
 * fp32 table, the debugging reference, keeps the separate GELU kernels so
 * it stays within fp32 rounding of the CPU; so does any shape for which
 * cuBLASLt offers no fused algorithm. */
template <typename S>
void cuda_matmul_gelu_forward(void *out, void *pre, const void *inp, const void *w,
                              const void *bias, int N, int C, int OC) {
  constexpr cudaDataType_t dt = st_cuda_type<S>();
  if (sizeof(S) == 2 && N > 0 && OC > 0 && C > 0 &&
      lt_matmul_epi(out, w, inp, bias, OC, N, C, 1, 0, C, C, OC, 0.0f, dt, dt, EPI_GELU_AUX,
                    pre, NULL) == 0)
    return;
  cuda_matmul_forward<S>(pre, inp, w, bias, N, C, OC);
  cuda_gelu_forward<S>(out, pre, (int64_t)N * OC);
}

template <typename S>
void cuda_matmul_backward_gelu(void *dinp, float *dw, float *dbias, const void *dout,
                               const void *inp, const void *w, const void *pre, int N, int C,
                               int OC) {
  constexpr cudaDataType_t dt = st_cuda_type<S>();
  if (N == 0 || C == 0 || OC == 0) return;
  if (sizeof(S) == 2 &&
      lt_matmul_epi(dinp, w, dout, NULL, C, N, OC, 0, 0, C, OC, C, 0.0f, dt, dt, EPI_DGELU, pre,
                    NULL) == 0) {
    weight_grads<S>(dw, dbias, dout, inp, N, C, OC);
    return;
  }
  cuda_matmul_backward<S>(dinp, dw, dbias, dout, inp, w, N, C, OC);
  cuda_gelu_backward<S>(dinp, pre, dinp, (int64_t)N * C);
}

#define MM_INST(S)                                                                          \
  template void cuda_matmul_forward<S>(void *, const void *, const void *, const void *, int, \
                                       int, int);                                           \
  template void cuda_matmul_residual_forward<S>(void *, const void *, const void *,          \
                                                const void *, const void *, int, int, int);   \
  template void cuda_matmul_backward<S>(void *, float *, float *, const void *, const void *, \
                                        const void *, int, int, int);                         \
  template void cuda_matmul_backward_input<S>(void *, const void *, const void *, int, int,    \
                                              int);                                           \
  template void cuda_matmul_gelu_forward<S>(void *, void *, const void *, const void *,       \
                                            const void *, int, int, int);                     \
  template void cuda_matmul_backward_gelu<S>(void *, float *, float *, const void *,         \
                                             const void *, const void *, const void *, int,   \
                                             int, int);
ST_FOR_EACH_STORAGE(MM_INST)
