/* env.h - who this process is: rank, world size and node-local rank from
 * MPI, cross-checked against the launcher's environment (Open MPI's
 * OMPI_COMM_WORLD_*, Slurm's SLURM_*), so a mis-launched job stops at once
 * with words instead of training N copies of rank 0. */
#ifndef ST_ENV_H
#define ST_ENV_H

typedef struct {
  int rank, world;
  int local_rank, local_world; /* within this node (MPI_Comm_split_type) */
  int node_count;
  char hostname[256];
  const char *launcher;        /* "mpirun", "srun", or "single" */
} st_env;

/* Fill env from MPI (must be initialised) and check the environment
 * variables agree. 0, or -1 with st_error naming the variable. Collective. */
int st_env_detect(st_env *env);

#endif
