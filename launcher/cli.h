/* cli.h - command-line flags of `shardtrain train` into one run config. */
#ifndef ST_CLI_H
#define ST_CLI_H

#include <stdint.h>

#include "rank/config.h"
#include "rank/optimizer.h"

typedef struct {
  st_model_config model;
  char model_name[64];      /* preset name or "custom" */
  int micro_batch;          /* sequences per rank per micro-step */
  int global_batch;         /* sequences per optimizer step */
  int zero_stage;           /* 0 or 1 on CPU */
  char precision[8];        /* fp32 on CPU */
  char recompute[16];       /* none on CPU */
  char device[8];           /* cpu | cuda | auto */
  char data[1024];          /* train tokens (.h5 or .bin) */
  char val_data[1024];      /* validation tokens for .bin data ("" = /val of .h5) */
  char out[1024];           /* run directory */
  char resume[1024];        /* auto | none | PATH */
  char dump_params[1024];   /* write final params as raw float32 (tests) */
  int64_t steps;
  st_optim_config optim;
  uint64_t seed;
  int ckpt_every;           /* steps between checkpoints; 0 = only at the end */
  int val_every;            /* steps between validations; 0 = only at the end */
  int val_seqs;             /* validation sequences (all ranks together) */
  int log_every;
  int stop_after;           /* exit after this step (for resume tests); 0 = off */
  int json;                 /* rank 0 prints one JSON summary line at the end */
} st_run_config;

/* Defaults: the "small" preset, T=128, micro-batch 8, global batch 16. */
void st_run_config_defaults(st_run_config *rc);

/* Parse flags (argv[0] is the subcommand). Unknown flags and bad values give
 * -1 with st_error naming the flag and st_error_code(ST_EXIT_USAGE). */
int st_cli_parse_train(int argc, char **argv, st_run_config *rc);

/* Usage text for `shardtrain train --help`. */
void st_cli_print_train_usage(void);

/* The run config as a malloc'ed JSON object string (model shape + training). */
char *st_run_config_to_json(const st_run_config *rc);

#endif
