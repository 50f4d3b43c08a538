/* bench.h - `shardtrain bench`. collectives: busbw of the collectives the
 * trainer uses, on the backend it would train on (NCCL on GPUs, MPI on CPU
 * ranks), run under mpirun/srun like train, MPI initialised; model: the
 * alpha-beta fit and projection (bench.c). train: training throughput
 * against the rank count, one process that launches the runs itself
 * (bench_train.c). */
#ifndef ST_BENCH_H
#define ST_BENCH_H

/* argv[0] is "bench". Returns an exit code: 0, ST_EXIT_USAGE for bad flags,
 * ST_EXIT_COLLECTIVE when a collective failed or returned a wrong result. */
int st_cmd_bench(int argc, char **argv);

/* `shardtrain bench train` (argv[0] is "train"), started without mpirun and
 * without MPI_Init: it starts `train --step-timing` under the launcher for
 * each mode and rank count, then writes OUT/scaling.json and prints the
 * tables. Returns 0, ST_EXIT_USAGE for bad flags (bench's or train's), or
 * ST_EXIT_ERROR when a run failed (the message names its log). */
int st_cmd_bench_train(int argc, char **argv);

/* Usage text of `shardtrain bench train`. */
void st_bench_train_usage(void);

#endif
