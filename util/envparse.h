/* envparse.h - strict parsers of the environment variables the backends
 * read (ST_TIMELINE, ST_ATTENTION_KERNEL, CUDA_VISIBLE_DEVICES, and the
 * integer of NCCL_BUFFSIZE). Pure functions of the string, no getenv and no
 * error state, so the CUDA backend calls them and CPU unit tests
 * (tests/test_envparse.c) check them. Built into st_kernels_cpu, the library
 * both backends link. */
#ifndef ST_ENVPARSE_H
#define ST_ENVPARSE_H

#ifdef __cplusplus
extern "C" {
#endif

/* A whole number written in decimal digits only ("4194304"): no sign, no
 * blanks, no unit suffix, no fraction, no exponent, at most `max`.
 * 0 with *out set, or -1 (NULL, empty, any other character, or a value past
 * max, overflow of 2^63 included; *out untouched). */
int st_envparse_uint(const char *s, long long max, long long *out);

/* ST_TIMELINE: "FROM:TO" or "STEP" (steps, 0 <= FROM <= TO). 1 with the
 * range set: enabled; 0 for NULL or "" (unset: disabled, range untouched);
 * -1 for anything else (range untouched). */
int st_envparse_step_range(const char *s, long long *from, long long *to);

/* ST_ATTENTION_KERNEL: 1 for "simt" (force the fp32-arithmetic kernels),
 * 0 for NULL, "" or "auto" (the normal choice), -1 for anything else. */
int st_envparse_attention_kernel(const char *s);

/* A switch such as ST_NCCL_ONE_RANK: 0 for NULL, "" or "0", 1 for "1",
 * -1 for anything else ("yes", "true", " 1" and the like are refused, not
 * guessed at). */
int st_envparse_switch(const char *s);

/* ST_GEMM_SEARCH: how many of the cuBLASLt heuristic's algorithms a GEMM
 * problem's first call times, and which it may keep. NULL, "" or "exact":
 * *count 8, *any 0 (only algorithms whose output is bit for bit the
 * heuristic's first; the default). "off" or "1": *count 1 (the heuristic's
 * first, untimed). "2".."8": *count that, *any 1 (the fastest, whatever
 * order it sums in). 0, or -1 for anything else (outputs untouched). */
int st_envparse_gemm_search(const char *s, int *count, int *any);

/* CUDA_VISIBLE_DEVICES as a phrase for a "no CUDA device" message: "unset",
 * "set but empty, which hides every GPU", "'-1', which hides every GPU"
 * (CUDA stops at the first invalid entry), or "'0,1'". Into buf[cap];
 * returns buf. */
char *st_envparse_cuda_visible(const char *s, char *buf, unsigned long cap);

#ifdef __cplusplus
}
#endif
#endif
