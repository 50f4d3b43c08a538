/* signals.h - preemption: SIGUSR1 and SIGTERM only set a flag.
 *
 * Slurm sends SIGUSR1 ahead of a time limit (sbatch --signal) and SIGTERM on
 * preemption or scancel; mpirun forwards SIGUSR1 to its ranks. The trainer
 * polls the flag at each step boundary, the ranks agree through an
 * all-reduce, write a checkpoint and exit with ST_EXIT_PREEMPTED, which the
 * sbatch wrapper turns into `scontrol requeue`. A second signal while the
 * checkpoint is written only sets the flag again: it cannot interrupt it.
 */
#ifndef ST_SIGNALS_H
#define ST_SIGNALS_H

/* Install the handlers (idempotent). */
void st_signals_install(void);
/* The first signal received since install (SIGUSR1 or SIGTERM), or 0. */
int st_signals_pending(void);

#endif
