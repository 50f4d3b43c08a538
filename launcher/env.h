/* env.h - who this process is: rank, world size, node and node-local rank
 * from MPI, cross-checked against the launcher's environment (Open MPI's
 * OMPI_COMM_WORLD_*, Slurm's SLURM_*), so a mis-launched job stops at once
 * with words instead of training N copies of rank 0. */
#ifndef ST_ENV_H
#define ST_ENV_H

typedef struct {
  int rank, world;
  int local_rank, local_world; /* within this node (MPI_Comm_split_type) */
  int node_id, node_count;     /* nodes numbered by their lowest rank */
  char hostname[64];
  const char *launcher;        /* "mpirun", "srun", "mpi" or one process without a launcher */
  /* Slurm's view, when the job runs under Slurm (-1 / "" otherwise). */
  long long slurm_job_id;
  int slurm_restart_count;     /* how often the job was requeued */
  int slurm_node_id;           /* SLURM_NODEID of this rank's node, -1 outside srun */
  char slurm_nodelist[512];
} st_env;

/* Fill env from MPI (must be initialised) and check the launcher variables
 * agree with it: OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK} under mpirun;
 * SLURM_{PROCID,NTASKS,LOCALID,NNODES} under srun. Collective.
 * 0, or -1 with st_error naming the variable and the launch that fixes it. */
int st_env_detect(st_env *env);

/* Rank 0 prints the node list and the rank -> node -> device map (device is
 * `device` for every rank on the CPU backend). Collective. */
void st_env_print_map(const st_env *env, const char *device);

#endif
