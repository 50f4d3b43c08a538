/* env.c - rank identity from MPI, checked against launcher variables. */
#define _XOPEN_SOURCE 700
#include "launcher/env.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/error.h"

/* -1 when the variable is unset. */
static int env_int(const char *name) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : -1;
}

static int expect(const char *var, int got_env, int got_mpi, const char *what, const char *fix) {
  if (got_env < 0 || got_env == got_mpi) return 0;
  return st_error_set("%s=%d but MPI reports %s %d: the launcher and MPI disagree. %s", var,
                      got_env, what, got_mpi, fix);
}

static const char *k_srun_fix =
    "Under Slurm launch with `srun --mpi=pmix` (Open MPI needs PMIx: check `srun --mpi=list` "
    "shows pmix), or with mpirun inside the allocation; a plain srun of an MPI program starts "
    "N separate 1-rank jobs";

/* Node id = number of nodes whose lowest rank is below this node's lowest
 * rank, so nodes are numbered in rank order like Slurm's block distribution.
 * (The split key is the world rank, so local rank 0 is the node's lowest.) */
static void node_ids(st_env *env, MPI_Comm node) {
  int leader = env->local_rank == 0, before = 0;
  MPI_Allreduce(&leader, &env->node_count, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Exscan(&leader, &before, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (env->rank == 0) before = 0; /* MPI_Exscan leaves rank 0's result undefined */
  MPI_Bcast(&before, 1, MPI_INT, 0, node);
  env->node_id = before;
}

static void read_slurm(st_env *env) {
  const char *v = getenv("SLURM_JOB_ID");
  env->slurm_job_id = v && *v ? atoll(v) : -1;
  env->slurm_restart_count = env_int("SLURM_RESTART_COUNT");
  env->slurm_node_id = getenv("SLURM_STEP_ID") ? env_int("SLURM_NODEID") : -1;
  if (env->slurm_restart_count < 0) env->slurm_restart_count = 0;
  v = getenv("SLURM_JOB_NODELIST");
  snprintf(env->slurm_nodelist, sizeof env->slurm_nodelist, "%s", v ? v : "");
}

int st_env_detect(st_env *env) {
  memset(env, 0, sizeof *env);
  MPI_Comm_rank(MPI_COMM_WORLD, &env->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &env->world);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, env->rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &env->local_rank);
  MPI_Comm_size(node, &env->local_world);
  node_ids(env, node);
  MPI_Comm_free(&node);
  gethostname(env->hostname, sizeof env->hostname - 1);
  read_slurm(env);

  int bad = 0;
  if (getenv("OMPI_COMM_WORLD_SIZE")) {
    env->launcher = "mpirun";
    const char *fix = "Launch every rank with the same mpirun, and do not set OMPI_* by hand";
    bad = expect("OMPI_COMM_WORLD_RANK", env_int("OMPI_COMM_WORLD_RANK"), env->rank, "rank", fix) ||
          expect("OMPI_COMM_WORLD_SIZE", env_int("OMPI_COMM_WORLD_SIZE"), env->world,
                 "world size", fix) ||
          expect("OMPI_COMM_WORLD_LOCAL_RANK", env_int("OMPI_COMM_WORLD_LOCAL_RANK"),
                 env->local_rank, "node-local rank", fix);
  } else if (getenv("SLURM_PROCID") && getenv("SLURM_STEP_ID")) {
    /* Only a task of an srun step carries its own SLURM_PROCID; an mpirun
     * inside an allocation sets OMPI_* and is handled above. */
    env->launcher = "srun";
    if (env->world == 1 && env_int("SLURM_NTASKS") > 1) {
      /* The classic: srun without a working PMI plugin starts N singletons. */
      bad = st_error_set("srun started SLURM_NTASKS=%d tasks but MPI sees a world of 1 in each: "
                         "srun launched them without PMIx, so they cannot find each other. Use "
                         "`srun --mpi=pmix` (and check `srun --mpi=list` lists pmix; on Debian "
                         "install libpmix-dev on the compute nodes), or mpirun inside the "
                         "allocation", env_int("SLURM_NTASKS")) != 0;
    } else bad = expect("SLURM_NTASKS", env_int("SLURM_NTASKS"), env->world, "world size", k_srun_fix) ||
          expect("SLURM_PROCID", env_int("SLURM_PROCID"), env->rank, "rank", k_srun_fix) ||
          expect("SLURM_LOCALID", env_int("SLURM_LOCALID"), env->local_rank, "node-local rank",
                 k_srun_fix) ||
          expect("SLURM_NNODES", env_int("SLURM_NNODES"), env->node_count, "node count",
                 k_srun_fix);
  } else {
    env->launcher = env->world == 1 ? "no launcher (one process)" : "mpi";
  }
  int any_bad = bad;
  MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_bad && !bad)
    return st_error_set("another rank found its launcher environment inconsistent with MPI");
  return any_bad ? -1 : 0;
}

typedef struct {
  char host[64];
  int node_id, local_rank, slurm_node_id;
} rank_info;

void st_env_print_map(const st_env *env, const char *device) {
  rank_info me, *all = NULL;
  memset(&me, 0, sizeof me);
  snprintf(me.host, sizeof me.host, "%s", env->hostname);
  me.node_id = env->node_id;
  me.local_rank = env->local_rank;
  me.slurm_node_id = env->slurm_node_id;
  if (env->rank == 0) all = calloc((size_t)env->world, sizeof *all);
  MPI_Gather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, 0, MPI_COMM_WORLD);
  if (env->rank != 0) return;
  if (env->slurm_job_id >= 0)
    printf("  slurm      job %lld, nodes %s, restart %d\n", env->slurm_job_id,
           env->slurm_nodelist[0] ? env->slurm_nodelist : "?", env->slurm_restart_count);
  /* One line per node: its ranks are listed with their local rank/device. */
  for (int n = 0; n < env->node_count; n++) {
    char line[1024];
    int len = 0, shown = 0;
    const char *host = "?";
    int slurm_id = -1;
    for (int r = 0; r < env->world && len < (int)sizeof line - 64; r++) {
      if (all[r].node_id != n) continue;
      host = all[r].host;
      slurm_id = all[r].slurm_node_id;
      /* GPUs are numbered by node-local rank; CPU ranks share the cores. */
      if (shown++ < 16 && strcmp(device, "cpu") == 0)
        len += snprintf(line + len, sizeof line - (size_t)len, "%s%d->cpu", shown > 1 ? " " : "", r);
      else if (shown <= 16)
        len += snprintf(line + len, sizeof line - (size_t)len, "%s%d->%s:%d", shown > 1 ? " " : "",
                        r, device, all[r].local_rank);
    }
    if (shown > 16) snprintf(line + len, sizeof line - (size_t)len, " ... (%d ranks)", shown);
    if (slurm_id >= 0)
      printf("  node %-5d %s (SLURM_NODEID %d): rank->device %s\n", n, host, slurm_id, line);
    else
      printf("  node %-5d %s: rank->device %s\n", n, host, line);
  }
  free(all);
}
