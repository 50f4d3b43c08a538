/* bench.h - `shardtrain bench collectives`: busbw of the collectives the
 * trainer uses, on the backend it would train on (NCCL on GPUs, MPI on CPU
 * ranks). Run under mpirun/srun like train; MPI must be initialised. */
#ifndef ST_BENCH_H
#define ST_BENCH_H

/* argv[0] is "bench". Returns an exit code: 0, ST_EXIT_USAGE for bad flags,
 * ST_EXIT_COLLECTIVE when a collective failed or returned a wrong result. */
int st_cmd_bench(int argc, char **argv);

#endif
