/* grads_cmd.h - `shardtrain grads norms|diff`: read gradient dumps
 * (io/grad_dump.h), one process, no MPI. Exit codes: 0, 1 (grads diff
 * --tol: a tensor differs by more), 2 bad flag, 3 a dump that cannot be
 * read or two dumps of different models. */
#ifndef ST_GRADS_CMD_H
#define ST_GRADS_CMD_H

/* argv[0] is "grads". Returns the exit code. */
int st_cmd_grads(int argc, char **argv);

#endif
