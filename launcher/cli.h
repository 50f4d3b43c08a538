/* cli.h - command-line flags of `shardtrain train` and `shardtrain plan`. */
#ifndef ST_CLI_H
#define ST_CLI_H

#include <stdint.h>

#include "rank/train/run_config.h"

/* Which of the shared flags were given (plan's; train records every flag
 * in st_run_config.given). */
typedef struct {
  int preset, shape, zero, micro_batch, recompute, device;
  /* The model flags' values, applied once every flag is read, in the order
   * --model, --arch, then the single fields (so `--kv-heads 2 --model X`
   * means X with 2 KV heads): arch and tied -1, the rest 0 when not given. */
  int arch, layers, heads, dim, kv_heads, ffn_dim, vocab, seq_len, tied;
  int theta_given, eps_given;
  float rope_theta, norm_eps;
} st_cli_seen;

/* Parse flags (argv[0] is the subcommand). Every flag given is recorded in
 * rc->given (st_run_config_given), so that a resume can tell a flag from a
 * default. Unknown flags, bad values (NaN and inf included), and an empty
 * --resume give -1 with st_error naming the flag and
 * st_error_code(ST_EXIT_USAGE). */
int st_cli_parse_train(int argc, char **argv, st_run_config *rc);

/* A flag's number: v whole (no trailing text), finite, in [lo, hi], into
 * *out. 0, or -1 with st_error naming the flag, the range and v (exit 2);
 * *out untouched then. */
int st_cli_number_in(const char *flag, const char *v, double lo, double hi, double *out);

/* " (did you mean --x?)" naming the flag of cands (NULL-terminated) closest
 * to f (within 2 edits and a quarter of its length), else "". Returns buf. */
const char *st_cli_did_you_mean(const char *f, const char *const *cands, char *buf, size_t cap);
/* A flag last on the command line without its value: "flag F needs a value"
 * when F is one of known (NULL-terminated), else "unknown flag" with the
 * closest of known; cmd names the command ("bench collectives"). Sets
 * st_error with the usage exit class; returns -1. */
int st_cli_missing_value(const char *f, const char *const *known, const char *cmd);
/* A command's failure: what it printed so far stays before the message,
 * "shardtrain: error: <st_error>" goes to stderr, and the exit code is
 * returned (ST_EXIT_ERROR for 0). */
int st_cli_fail(int code);

/* 1 when f is one of train's flags (--help aside). */
int st_cli_is_train_flag(const char *f);

/* Usage text for `shardtrain train --help`. */
void st_cli_print_train_usage(void);

/* `shardtrain plan`: train's model, batch and system flags (no data or run
 * flags) plus the planner's own. */
typedef struct {
  st_run_config rc;  /* model, batch, zero, precision, recompute, device, gpu_mem,
                      * headroom_pct, nccl_buffsize, nccl_max_ctas */
  int ranks;         /* --ranks N: the world size plan assumes (1) */
  int fit, json;     /* --fit, --json */
  st_cli_seen seen;
} st_plan_options;

/* Defaults: train's, with --device cuda (plan is for GPUs; --device auto
 * resolves as train would) and --vocab-size 50257 when not given. -1 with
 * st_error naming the flag (ST_EXIT_USAGE) on a bad flag or value. */
int st_cli_parse_plan(int argc, char **argv, st_plan_options *o);
void st_cli_print_plan_usage(void);

#endif
