/* host_mem.c - available host memory per rank (see host_mem.h). */
#include "rank/memory/host_mem.h"

#include <stdio.h>
#include <stdlib.h>

#include "util/bytes.h"
#include "util/error.h"

int st_host_ranks_per_node(int local_world, const char **source) {
  if (local_world > 0) {
    *source = "MPI";
    return local_world;
  }
  static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"};
  for (int i = 0; i < 2; i++) {
    const char *v = getenv(vars[i]);
    /* SLURM_NTASKS_PER_NODE may read "4(x2)": its first number is this node's */
    const long n = v ? strtol(v, NULL, 10) : 0;
    if (n > 0) {
      *source = vars[i];
      return (int)n;
    }
  }
  *source = "assumed";
  return 1;
}

/* MemAvailable in bytes, or 0 when /proc/meminfo does not say. */
static uint64_t mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
  fclose(f);
  return (uint64_t)kb * 1024u;
}

int st_host_mem_per_rank(int ranks, const char *ranks_source, uint64_t *bytes, char *what,
                         size_t cap) {
  const char *fault = getenv("ST_FAULT_HOST_MEM_AVAILABLE");
  const char *from = fault ? "ST_FAULT_HOST_MEM_AVAILABLE" : "MemAvailable";
  const uint64_t avail = fault ? strtoull(fault, NULL, 10) : mem_available();
  if (!avail && !fault)
    return st_error_set("--offload optimizer: cannot read MemAvailable from /proc/meminfo to "
                        "check the host memory the offloaded optimizer needs");
  if (ranks < 1) ranks = 1;
  *bytes = avail / (uint64_t)ranks;
  char a[32];
  snprintf(what, cap, "%s %s / %d rank(s) on this node (%s)", from,
           st_format_bytes(avail, a, sizeof a), ranks, ranks_source);
  return 0;
}

int st_host_mem_check(uint64_t need, int local_world, uint64_t *avail, char *what, size_t cap) {
  const char *src;
  const int ranks = st_host_ranks_per_node(local_world, &src);
  st_error_code(ST_EXIT_MEMORY);
  if (st_host_mem_per_rank(ranks, src, avail, what, cap)) return -1;
  if (need <= *avail) {
    st_error_code(ST_EXIT_ERROR);
    return 0;
  }
  char a[32], b[32];
  return st_error_set("--offload optimizer needs %s of host memory per rank (pinned master "
                      "weights, Adam m and v, staging; docs/memory.md, \"Offload\"), but %s is "
                      "available (%s): use fewer ranks per node or more nodes, a higher --zero "
                      "(it shares the state among the ranks), or --offload none",
                      st_format_bytes(need, a, sizeof a), st_format_bytes(*avail, b, sizeof b),
                      what);
}
