/* ops_cuda.h - the CUDA backend's op table and device binding.
 *
 * Built only when the build has a CUDA toolkit (SHARDTRAIN_HAVE_CUDA). The
 * table's memory functions work on device memory of the current device, so
 * a rank binds its GPU (st_cuda_bind_device) before the first op or alloc.
 * This version computes in fp32 (matmuls through cuBLASLt with
 * CUBLAS_COMPUTE_32F, attention materialising att[B,NH,T,T] like the CPU
 * reference); every reduction runs in a fixed order, so results are
 * bit-for-bit repeatable on the same GPU model.
 */
#ifndef ST_OPS_CUDA_H
#define ST_OPS_CUDA_H

#include <stddef.h>

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA fp32 implementation of every op (see kernels/ops.h). */
const st_ops *st_ops_cuda(void);

/* Number of visible CUDA devices; 0 when there is none, no driver, or the
 * driver is too old for this build. Never aborts. */
int st_cuda_device_count(void);

/* Make device local_rank % count current for this process, write its name
 * into name[cap] (when name is not NULL), and return its index; -1 with
 * st_error when no device is visible or it cannot be selected. */
int st_cuda_bind_device(int local_rank, char *name, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
