/* host_mem.h - the host memory one rank may plan on (--offload optimizer):
 * the node's available memory shared among the ranks on that node. */
#ifndef ST_HOST_MEM_H
#define ST_HOST_MEM_H

#include <stddef.h>
#include <stdint.h>

/* The ranks sharing this node: local_world when known (> 0, from MPI's
 * shared-memory split), else OMPI_COMM_WORLD_LOCAL_SIZE, else
 * SLURM_NTASKS_PER_NODE (its first number), else 1. *source names which. */
int st_host_ranks_per_node(int local_world, const char **source);

/* Bytes of host memory one rank may use: MemAvailable of /proc/meminfo
 * (or ST_FAULT_HOST_MEM_AVAILABLE=BYTES, which stands in for it in tests)
 * divided by ranks. what[cap] gets where the number came from ("MemAvailable
 * 61.2 GiB / 2 ranks on this node (MPI)"). 0, or -1 with st_error when
 * neither can be read. */
int st_host_mem_per_rank(int ranks, const char *ranks_source, uint64_t *bytes, char *what,
                         size_t cap);

/* --offload optimizer's pre-flight: need bytes of host memory per rank
 * (the plan's host section, plus on the CPU backend its device total, the
 * same memory) against st_host_mem_per_rank's share, the ranks counted by
 * st_host_ranks_per_node(local_world). *avail and what[cap] get the share
 * and its source. 0 when it fits; -1 with st_error (exit 6, ST_EXIT_MEMORY)
 * naming both and the fix when it does not or cannot be read. */
int st_host_mem_check(uint64_t need, int local_world, uint64_t *avail, char *what, size_t cap);

#endif
