/* gemm_cache.h - the file of timed GEMM algorithm choices (ST_GEMM_CACHE):
 * what the CUDA backend's ST_GEMM_SEARCH found fastest for each problem,
 * kept so that later processes on the same GPU and cuBLASLt reuse the same
 * algorithms, and so compute bit-identical results, without timing again
 * (kernels/cuda/matmul.cu). Pure host C with no CUDA types, built into
 * st_kernels_cpu so CPU unit tests check it (tests/test_gemm_cache.c).
 *
 * One line per problem, appended by a single write(2) on an O_APPEND
 * descriptor, so lines from ranks writing at once do not interleave:
 *   st-gemm-1 DEVICE NKEY KEY[0] ... KEY[NKEY-1] : ALGO[0] ... ALGO[7]
 * DEVICE is one word (the caller's: GPU name and library version, blanks
 * made '_'); KEY, decimal integers; ALGO, the 8 64-bit words of a
 * cublasLtMatmulAlgo_t in hex. The first line that matches wins, so every
 * later reader takes the same choice even when two writers raced. Lines
 * that do not parse are skipped. */
#ifndef ST_GEMM_CACHE_H
#define ST_GEMM_CACHE_H

#ifdef __cplusplus
extern "C" {
#endif

#define ST_GEMM_KEY_MAX 32
#define ST_GEMM_ALGO_WORDS 8

/* Looks up (device, key[0..nkey)) in the file at path. 1 with algo set,
 * 0 when the file does not exist or holds no such line, -1 when it exists
 * but cannot be read (errno set). nkey in 1..ST_GEMM_KEY_MAX. */
int st_gemm_cache_find(const char *path, const char *device, const long long *key, int nkey,
                       unsigned long long algo[ST_GEMM_ALGO_WORDS]);

/* Appends the line for (device, key, algo), creating the file (mode 0644)
 * when absent. 0, or -1 with errno set (the file is then unchanged or
 * holds the whole line: never a partial one, short of a full disk). */
int st_gemm_cache_add(const char *path, const char *device, const long long *key, int nkey,
                      const unsigned long long algo[ST_GEMM_ALGO_WORDS]);

#ifdef __cplusplus
}
#endif

#endif
