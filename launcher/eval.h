/* eval.h - `shardtrain eval`: mean loss, perplexity and tokens evaluated of
 * a model over whole token files (an HDF5 token file's split, llm.c .bin
 * shards). One process, no MPI. Exit codes: 2 bad flag, 3 unreadable
 * model, 4 data (unreadable, too short, or a vocabulary larger than the
 * model's). */
#ifndef ST_EVAL_H
#define ST_EVAL_H

/* argv[0] is "eval". Returns the exit code. */
int st_cmd_eval(int argc, char **argv);

#endif
