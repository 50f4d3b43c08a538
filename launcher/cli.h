/* cli.h - command-line flags of `shardtrain train` into one run config. */
#ifndef ST_CLI_H
#define ST_CLI_H

#include "rank/run_config.h"



/* Parse flags (argv[0] is the subcommand). Unknown flags and bad values give
 * -1 with st_error naming the flag and st_error_code(ST_EXIT_USAGE). */
int st_cli_parse_train(int argc, char **argv, st_run_config *rc);

/* Usage text for `shardtrain train --help`. */
void st_cli_print_train_usage(void);

#endif
