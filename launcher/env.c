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

static int expect(const char *var, int got_env, int got_mpi, const char *what) {
  if (got_env < 0 || got_env == got_mpi) return 0;
  return st_error_set("%s=%d but MPI reports %s %d: the launcher and MPI disagree. Under Slurm "
                      "launch with `srun --mpi=pmix` (Open MPI built with PMIx) or with mpirun "
                      "inside the allocation, not plain srun of an MPI program without PMI",
                      var, got_env, what, got_mpi);
}

int st_env_detect(st_env *env) {
  memset(env, 0, sizeof *env);
  MPI_Comm_rank(MPI_COMM_WORLD, &env->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &env->world);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, env->rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &env->local_rank);
  MPI_Comm_size(node, &env->local_world);
  /* Node count: number of node-local rank-0 processes. */
  int leader = env->local_rank == 0;
  MPI_Allreduce(&leader, &env->node_count, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Comm_free(&node);
  gethostname(env->hostname, sizeof env->hostname - 1);

  int bad = 0;
  if (getenv("OMPI_COMM_WORLD_SIZE")) {
    env->launcher = "mpirun";
    bad |= expect("OMPI_COMM_WORLD_RANK", env_int("OMPI_COMM_WORLD_RANK"), env->rank, "rank") ||
           expect("OMPI_COMM_WORLD_SIZE", env_int("OMPI_COMM_WORLD_SIZE"), env->world, "world size") ||
           expect("OMPI_COMM_WORLD_LOCAL_RANK", env_int("OMPI_COMM_WORLD_LOCAL_RANK"),
                  env->local_rank, "node-local rank");
  } else if (getenv("SLURM_PROCID") && getenv("SLURM_STEP_ID")) {
    /* Only a task of an srun step carries its own SLURM_PROCID; an mpirun
     * inside an allocation sets OMPI_* and is handled above. */
    env->launcher = "srun";
    bad |= expect("SLURM_PROCID", env_int("SLURM_PROCID"), env->rank, "rank") ||
           expect("SLURM_NTASKS", env_int("SLURM_NTASKS"), env->world, "world size") ||
           expect("SLURM_LOCALID", env_int("SLURM_LOCALID"), env->local_rank, "node-local rank");
  } else {
    env->launcher = env->world == 1 ? "single" : "mpi";
  }
  int any_bad = bad;
  MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_bad && !bad)
    return st_error_set("another rank found its launcher environment inconsistent with MPI");
  return any_bad ? -1 : 0;
}
