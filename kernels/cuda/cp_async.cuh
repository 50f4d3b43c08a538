/* cp_async.cuh - asynchronous global-to-shared copies (cp.async, sm_80+)
 * and the shared-memory address they take, for the attention kernels
 * (attention_tc.cu, wgmma.cuh).
 */
#ifndef ST_CP_ASYNC_CUH
#define ST_CP_ASYNC_CUH

#include <stdint.h>

/* The 32-bit shared-state-space address of a generic pointer to shared memory. */
__device__ __forceinline__ uint32_t st_saddr(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 (or 4) bytes global -> shared, asynchronously; bytes = 0 writes zeros
 * and reads nothing (the source must still be a mapped address). */
__device__ __forceinline__ void st_cp16(void *dst, const void *src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(st_saddr(dst)), "l"(src),
               "r"(bytes)
               : "memory");
}
/* st_cp16 to a 32-bit shared-state-space address (st_saddr's). */
__device__ __forceinline__ void st_cp16s(uint32_t dst, const void *src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void st_cp4(void *dst, const void *src, int bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(st_saddr(dst)), "l"(src),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void st_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* Waits until at most N of this thread's commit groups are still in flight. */
template <int N>
__device__ __forceinline__ void st_cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif
