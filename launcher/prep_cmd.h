/* prep_cmd.h - `shardtrain prep` and `shardtrain tokenize` (no MPI). */
#ifndef ST_PREP_CMD_H
#define ST_PREP_CMD_H

/* argv[0] is the command's name. Each returns the process exit code. */
int st_cmd_prep(int argc, char **argv);
int st_cmd_tokenize(int argc, char **argv);

#endif
