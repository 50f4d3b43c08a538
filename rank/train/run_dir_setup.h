/* run_dir_setup.h - start-up stages of rank/train/train_setup.c that concern the
 * run directory (--out). Each returns 0, or -1 with st_error; the caller
 * agrees on the outcome across ranks (st_trainer_agree). */
#ifndef ST_RUN_DIR_SETUP_H
#define ST_RUN_DIR_SETUP_H

#include "rank/train/trainer_state.h"

/* Rank 0 locks an --out that already exists, before its checkpoints are
 * read (io/run_lock.h). */
int st_run_dir_lock_existing(trainer *tr);

/* Rank 0 creates --out and locks it when st_run_dir_lock_existing did not;
 * refuses when checkpoints appeared there since they were resolved. */
int st_run_dir_prepare(trainer *tr);

/* Every directory the run writes can take a file; shares rank 0's run id.
 * Collective. */
int st_run_dir_check_writable(trainer *tr);

/* On several nodes, --out is one filesystem every node sees. Collective. */
int st_run_dir_check_shared(trainer *tr);

/* No complete checkpoint newer than the step the run starts from (exit 3);
 * prints resume's fallback notice on rank 0. */
int st_run_dir_check_no_overwrite(trainer *tr);

#endif
