/* device_select.c - see device_select.h. */
#include "rank/train/device_select.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/envparse.h"
#include "util/error.h"
#ifdef SHARDTRAIN_HAVE_CUDA
#include "kernels/ops_cuda.h"
#endif

int st_device_select(const char *device, const st_env *env, st_device *out) {
  out->index = -1;
  snprintf(out->name, sizeof out->name, "cpu");
  int ngpu = 0;
#ifdef SHARDTRAIN_HAVE_CUDA
  ngpu = st_cuda_device_count();
#endif
  const int U = ST_EXIT_USAGE;
  if (strcmp(device, "cuda") == 0 && ngpu == 0) {
#ifdef SHARDTRAIN_HAVE_CUDA
    char vis[96];
    st_envparse_cuda_visible(getenv("CUDA_VISIBLE_DEVICES"), vis, sizeof vis);
    return st_error_setc(U, "--device cuda, but no CUDA device is visible on %s "
                            "(CUDA_VISIBLE_DEVICES %s); use --device cpu, or run where a GPU is",
                         env->hostname, vis);
#else
    return st_error_setc(U, "--device cuda: this build has no CUDA backend (it was configured "
                            "without a CUDA toolkit); use --device cpu, or rebuild where nvcc is");
#endif
  }
  const int cuda = strcmp(device, "cuda") == 0 || (strcmp(device, "auto") == 0 && ngpu > 0);
  if (!cuda) return 0;
#ifdef SHARDTRAIN_HAVE_CUDA
  /* Two ranks on one GPU would each plan for the whole device. */
  if (env->local_world > ngpu)
    return st_error_setc(U, "%d ranks run on node %s but it has %d visible GPU(s): launch at "
                            "most %d ranks per node (srun --ntasks-per-node=%d / mpirun -npernode "
                            "%d), or use --device cpu", env->local_world, env->hostname, ngpu,
                         ngpu, ngpu, ngpu);
  char name[96];
  out->index = st_cuda_bind_device(env->local_rank, name, sizeof name);
  if (out->index < 0) return -1;
  snprintf(out->name, sizeof out->name, "cuda:%d (%s)", out->index, name);
#endif
  return 0;
}
