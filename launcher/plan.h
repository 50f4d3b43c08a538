/* plan.h - `shardtrain plan`: the memory table of a training configuration
 * (rank/memory/memory_plan.h) for one rank, per GPU or, on --device cpu, per CPU
 * rank's host memory, checked against --gpu-mem or the GPU's memory, and
 * --fit, which picks micro-batch, recompute and ZeRO stage for a global
 * batch. One process, no MPI. docs/memory.md explains the output. */
#ifndef ST_PLAN_H
#define ST_PLAN_H

/* argv[0] is "plan". Returns an exit code: 0 when the configuration fits
 * (or there is no GPU memory to check it against), ST_EXIT_MEMORY when it
 * does not or --fit finds nothing, ST_EXIT_USAGE for bad flags. */
int st_cmd_plan(int argc, char **argv);

#endif
