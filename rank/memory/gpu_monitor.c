/* gpu_monitor.c - device and process memory while training (see
 * gpu_monitor.h). NVML is reached through dlopen/dlsym only. */
#define _POSIX_C_SOURCE 200809L
#include "rank/memory/gpu_monitor.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#ifdef SHARDTRAIN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/ops_cuda.h"
#endif

/* NVML's own header when the toolkit ships it; otherwise the few stable
 * declarations used here, with NVML's names and layouts (nvml.h, API v2),
 * so the file builds the same on machines whose toolkit lacks nvml.h. */
#if defined(__has_include)
#if __has_include(<nvml.h>)
#include <nvml.h>
#define ST_HAVE_NVML_H 1
#endif
#endif
#ifndef ST_HAVE_NVML_H
typedef enum { NVML_SUCCESS = 0 } nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
  unsigned int gpu, memory;
} nvmlUtilization_t;
typedef enum { NVML_TEMPERATURE_GPU = 0 } nvmlTemperatureSensors_t;
#endif

/* nvmlDeviceGetMemoryInfo_v2's struct (nvml.h's nvmlMemory_v2_t), declared
 * here under our name: v1's `used` counts the driver's reserved memory too
 * (about 600 MiB on an H200), v2's does not, matching nvidia-smi and
 * cudaMemGetInfo. */
typedef struct {
  unsigned int version;
  unsigned long long total, reserved, free, used;
} st_nvml_memory_v2;
#define ST_NVML_MEMORY_V2_VERSION ((unsigned int)(sizeof(st_nvml_memory_v2) | (2u << 24)))
typedef nvmlReturn_t (*nvml_memory_v2_fn)(nvmlDevice_t, st_nvml_memory_v2 *);

typedef nvmlReturn_t (*nvml_init_fn)(void);
typedef nvmlReturn_t (*nvml_shutdown_fn)(void);
typedef const char *(*nvml_error_string_fn)(nvmlReturn_t);
typedef nvmlReturn_t (*nvml_by_pci_fn)(const char *, nvmlDevice_t *);
typedef nvmlReturn_t (*nvml_memory_fn)(nvmlDevice_t, nvmlMemory_t *);
typedef nvmlReturn_t (*nvml_util_fn)(nvmlDevice_t, nvmlUtilization_t *);
typedef nvmlReturn_t (*nvml_temp_fn)(nvmlDevice_t, nvmlTemperatureSensors_t, unsigned int *);

enum { F_SHUTDOWN, F_ERROR_STRING, F_MEMORY, F_UTIL, F_TEMP, F_COUNT, F_MEMORY_V2 = F_COUNT };

uint64_t st_process_rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long long size = 0, resident = 0;
  int n = f ? fscanf(f, "%llu %llu", &size, &resident) : 0;
  if (f) fclose(f);
  long page = sysconf(_SC_PAGESIZE);
  return n == 2 && page > 0 ? (uint64_t)resident * (uint64_t)page : 0;
}

static uint64_t host_total_bytes(void) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

/* Load NVML and find the CUDA device in it; 0, or -1 with why set. The
 * device is looked up by PCI bus id because NVML numbers every GPU of the
 * machine while CUDA numbers only those CUDA_VISIBLE_DEVICES leaves. */
static int open_nvml(st_gpu_monitor *m, char *why, size_t cap) {
#ifdef SHARDTRAIN_HAVE_CUDA
  m->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!m->lib) {
    const char *e = dlerror();
    snprintf(why, cap, "libnvidia-ml.so.1 not loadable: %s", e ? e : "unknown");
    return -1;
  }
  nvml_init_fn init = (nvml_init_fn)dlsym(m->lib, "nvmlInit_v2");
  nvml_by_pci_fn by_pci = (nvml_by_pci_fn)dlsym(m->lib, "nvmlDeviceGetHandleByPciBusId_v2");
  static const char *const names[F_COUNT] = {"nvmlShutdown", "nvmlErrorString",
                                             "nvmlDeviceGetMemoryInfo",
                                             "nvmlDeviceGetUtilizationRates",
                                             "nvmlDeviceGetTemperature"};
  int missing = !init || !by_pci;
  for (int i = 0; i < F_COUNT; i++) missing |= (m->fn[i] = dlsym(m->lib, names[i])) == NULL;
  m->fn[F_MEMORY_V2] = dlsym(m->lib, "nvmlDeviceGetMemoryInfo_v2"); /* optional: r510+ */
  if (missing) {
    snprintf(why, cap, "libnvidia-ml.so.1 lacks the NVML v2 entry points");
    return -1;
  }
  nvmlReturn_t r = init();
  if (r != NVML_SUCCESS) {
    snprintf(why, cap, "nvmlInit failed: %s", ((nvml_error_string_fn)m->fn[F_ERROR_STRING])(r));
    return -1;
  }
  char bus[32];
  if (cudaDeviceGetPCIBusId(bus, (int)sizeof bus, m->device_index) != cudaSuccess) {
    (void)cudaGetLastError();
    ((nvml_shutdown_fn)m->fn[F_SHUTDOWN])();
    snprintf(why, cap, "CUDA did not give the PCI bus id of device %d", m->device_index);
    return -1;
  }
  nvmlDevice_t dev = NULL;
  r = by_pci(bus, &dev);
  if (r != NVML_SUCCESS) {
    snprintf(why, cap, "NVML does not know the GPU at %s: %s", bus,
             ((nvml_error_string_fn)m->fn[F_ERROR_STRING])(r));
    ((nvml_shutdown_fn)m->fn[F_SHUTDOWN])();
    return -1;
  }
  m->dev = dev;
  return 0;
#else
  snprintf(why, cap, "this build has no CUDA backend");
  return -1;
#endif
}

void st_gpu_monitor_open(st_gpu_monitor *m, int device_index) {
  memset(m, 0, sizeof *m);
  m->device_index = device_index;
  if (device_index < 0) {
    snprintf(m->source, sizeof m->source, "CPU backend: no GPU to watch; reporting this "
             "process's resident memory (/proc/self/statm)");
    return;
  }
  char why[160];
  if (open_nvml(m, why, sizeof why) == 0) {
    m->have_nvml = 1;
    snprintf(m->source, sizeof m->source, "NVML (libnvidia-ml.so.1): device memory used, "
             "utilisation and temperature; also cudaMemGetInfo and resident memory");
    return;
  }
  if (m->lib) dlclose(m->lib);
  m->lib = NULL;
  snprintf(m->source, sizeof m->source, "no NVML (%s): reporting cudaMemGetInfo's used device "
           "memory and this process's resident memory only", why);
}

void st_gpu_monitor_sample(st_gpu_monitor *m, st_mem_sample *s) {
  memset(s, 0, sizeof *s);
  s->gpu_util_pct = s->gpu_temp_c = -1;
  s->rss_bytes = st_process_rss_bytes();
  s->host_total_bytes = host_total_bytes();
#ifdef SHARDTRAIN_HAVE_CUDA
  size_t fr = 0, tot = 0;
  if (m->device_index >= 0 && st_cuda_mem_info(&fr, &tot) == 0) {
    s->have_cuda = 1;
    s->cuda_total_bytes = tot;
    s->cuda_used_bytes = tot > fr ? tot - fr : 0;
  }
#endif
  if (!m->have_nvml) return;
  nvmlDevice_t dev = (nvmlDevice_t)m->dev;
  st_nvml_memory_v2 m2 = {.version = ST_NVML_MEMORY_V2_VERSION};
  nvmlMemory_t mem;
  if (m->fn[F_MEMORY_V2] &&
      ((nvml_memory_v2_fn)m->fn[F_MEMORY_V2])(dev, &m2) == NVML_SUCCESS) {
    s->have_nvml = 1;
    s->gpu_used_bytes = m2.used;
    s->gpu_total_bytes = m2.total;
  } else if (((nvml_memory_fn)m->fn[F_MEMORY])(dev, &mem) == NVML_SUCCESS) {
    s->have_nvml = 1;
    s->gpu_used_bytes = mem.used;
    s->gpu_total_bytes = mem.total;
  }
  nvmlUtilization_t u;
  if (((nvml_util_fn)m->fn[F_UTIL])(dev, &u) == NVML_SUCCESS) s->gpu_util_pct = (int)u.gpu;
  unsigned int t;
  if (((nvml_temp_fn)m->fn[F_TEMP])(dev, NVML_TEMPERATURE_GPU, &t) == NVML_SUCCESS)
    s->gpu_temp_c = (int)t;
}

/* Leave the hold out of a device reading; a reading below the hold (a
 * hold that failed to stay, or counters read at different times) is 0. */
int st_mem_sample_usage(const st_mem_sample *s, uint64_t held, uint64_t *used, uint64_t *total,
                        const char **what) {
  /* The first GPU source whose total exceeds the hold; the hold comes off
   * both numbers once, so the fraction is of the cap (a source's total at or
   * below the hold would read nothing, hence the next source). */
  uint64_t u = 0, t = 0;
  const char *w = NULL;
  if (s->have_nvml && s->gpu_total_bytes > held) {
    u = s->gpu_used_bytes, t = s->gpu_total_bytes;
    w = held ? "GPU memory (NVML) less --enforce-gpu-mem's hold" : "GPU memory (NVML)";
  } else if (s->have_cuda && s->cuda_total_bytes > held) {
    u = s->cuda_used_bytes, t = s->cuda_total_bytes;
    w = held ? "GPU memory (cudaMemGetInfo) less --enforce-gpu-mem's hold"
             : "GPU memory (cudaMemGetInfo)";
  }
  if (w) {
    *used = u > held ? u - held : 0, *total = t - held, *what = w;
    return 1;
  }
  if (s->rss_bytes && s->host_total_bytes) {
    *used = s->rss_bytes, *total = s->host_total_bytes,
    *what = "resident memory of this rank against the machine's";
    return 1;
  }
  return 0;
}

void st_gpu_monitor_close(st_gpu_monitor *m) {
  if (m->have_nvml && m->fn[F_SHUTDOWN]) ((nvml_shutdown_fn)m->fn[F_SHUTDOWN])();
  if (m->lib) dlclose(m->lib);
  m->lib = NULL;
  m->have_nvml = 0;
}
