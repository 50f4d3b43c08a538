/* device_select.h - which device a rank trains (or benchmarks) on: the
 * --device choice resolved against the GPUs this node shows, and the GPU
 * bound. One rule for `train` and `bench collectives`. */
#ifndef ST_DEVICE_SELECT_H
#define ST_DEVICE_SELECT_H

#include "launcher/env.h"

typedef struct {
  int index;      /* the bound CUDA device, or -1 for the CPU backend */
  char name[128]; /* "cpu", or "cuda:0 (NVIDIA H200)" */
} st_device;

/* Resolve device ("cpu", "cuda" or "auto": CUDA when a GPU is visible) for
 * this rank. For CUDA: checks that the node shows at least as many GPUs as
 * it runs ranks (env->local_world), then binds GPU env->local_rank modulo
 * the visible devices (Slurm may hide the others). 0, or -1 with st_error
 * (usage class) naming the fix: --device cuda without a GPU or without a
 * CUDA build, or more ranks on the node than GPUs. */
int st_device_select(const char *device, const st_env *env, st_device *out);

#endif
