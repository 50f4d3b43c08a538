/* gpu_monitor.h - what memory a rank really uses while it trains, next to
 * what the plan said (docs/memory.md, "Monitoring").
 *
 * On the CUDA backend NVML is loaded at run time with
 * dlopen("libnvidia-ml.so.1"): the driver ships it, and build machines, CI
 * and CPU machines have no driver, so nothing links against it. NVML gives
 * the device's used and total memory (all processes on the GPU, as
 * nvidia-smi shows them), utilisation and temperature. Without NVML, or on
 * the CPU backend, the monitor says so once and reports what needs no
 * driver library: the process's resident memory (/proc/self/statm) and, on
 * CUDA, cudaMemGetInfo's used memory (total - free, the whole device). */
#ifndef ST_GPU_MONITOR_H
#define ST_GPU_MONITOR_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  int device_index;        /* the CUDA device watched, -1 on the CPU backend */
  int have_nvml;           /* NVML loaded and the device found in it */
  char source[400];        /* what is reported and why, for the configuration block */
  void *lib;               /* dlopen handle of libnvidia-ml.so.1 */
  void *dev;               /* nvmlDevice_t */
  void *fn[6];             /* NVML entry points (gpu_monitor.c names them) */
} st_gpu_monitor;

/* One reading. Each group is valid only when its have_ flag is set. */
typedef struct {
  uint64_t rss_bytes;      /* resident set of this process; 0 when /proc is unreadable */
  uint64_t host_total_bytes; /* physical memory of the machine */
  int have_cuda;           /* cudaMemGetInfo was read */
  uint64_t cuda_used_bytes, cuda_total_bytes; /* total - free, and total, of the device */
  int have_nvml;           /* NVML was read */
  uint64_t gpu_used_bytes, gpu_total_bytes;   /* nvmlDeviceGetMemoryInfo */
  int gpu_util_pct;        /* nvmlDeviceGetUtilizationRates().gpu, -1 when NVML refused */
  int gpu_temp_c;          /* nvmlDeviceGetTemperature(GPU sensor), -1 when NVML refused */
} st_mem_sample;

/* Start watching: device_index is this rank's bound CUDA device, or -1 for
 * the CPU backend. Never fails: when NVML cannot be loaded or does not know
 * the device, m->have_nvml is 0 and m->source says why and what is reported
 * instead. Call after the device is bound. */
void st_gpu_monitor_open(st_gpu_monitor *m, int device_index);

/* Read now. Cheap (a few microseconds; NVML reads driver counters, no
 * device synchronisation). */
void st_gpu_monitor_sample(st_gpu_monitor *m, st_mem_sample *s);

/* The memory the warning threshold is checked on, in order of preference:
 * NVML's used/total, cudaMemGetInfo's, then the process's RSS against the
 * machine's physical memory. *what names it ("GPU memory (NVML)"). 0 when
 * nothing could be read.
 * held: bytes of the device that --enforce-gpu-mem holds above --gpu-mem
 * (0 without it). A GPU reading then leaves them out of both used and
 * total, so that the fraction is of the cap, as on a card of that size:
 * the hold is not use, and counted as use it put every capped run above
 * 0.9 from its first step. RSS readings are not touched. */
int st_mem_sample_usage(const st_mem_sample *s, uint64_t held, uint64_t *used, uint64_t *total,
                        const char **what);

/* Unload NVML (nvmlShutdown, dlclose). Safe on a monitor never opened. */
void st_gpu_monitor_close(st_gpu_monitor *m);

/* The process's resident set in bytes (/proc/self/statm x page size); 0
 * when unreadable. */
uint64_t st_process_rss_bytes(void);

#endif
