/* main.c - `shardtrain COMMAND [flags]`: MPI init, rank identity, dispatch.
 *
 *   shardtrain prep   --input TEXT|DIR --out FILE.h5 [--tokenizer PATH] [--val-fraction F]
 *   shardtrain tokenize --tokenizer PATH [--decode]   (stdin -> stdout)
 *   shardtrain train  --data FILE [flags]            (under mpirun/srun)
 *   shardtrain ckpt   info|verify STEP_DIR|RUN_DIR
 *   shardtrain bench  collectives [flags]              (under mpirun/srun)
 *   shardtrain bench  train --ranks LIST -- TRAIN_FLAGS (one process; starts the runs)
 *   shardtrain plan   [flags] [--fit] [--json]         (one process, no MPI)
 *   shardtrain sample --init SRC --prompt TEXT [flags] (one process, no MPI)
 *   shardtrain eval   --init SRC --data FILE [flags]   (one process, no MPI)
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/collectives.h"
#include "io/checkpoint.h"
#include "io/model_source.h"
#include "io/tokens.h"
#include "launcher/bench.h"
#include "launcher/ckpt_port.h"
#include "launcher/cli.h"
#include "launcher/env.h"
#include "launcher/eval.h"
#include "launcher/grads_cmd.h"
#include "launcher/plan.h"
#include "launcher/prep_cmd.h"
#include "launcher/sample.h"
#include "launcher/signals.h"
#include "rank/model/lora.h"
#include "rank/train/config_agree.h"
#include "rank/train/trainer.h"
#include "util/error.h"
#include "util/fsutil.h"

static void usage(void) {
  printf("shardtrain %s - GPT-2 and Llama-family training with ZeRO, one process per rank\n\n"
         "usage:\n"
         "  shardtrain prep  --input TEXT|DIR|- --out FILE.h5 [--tokenizer bytes|DIR]\n"
         "                   [--val-fraction 0.1]   (see shardtrain prep --help)\n"
         "  shardtrain tokenize --tokenizer bytes|DIR [--decode]   (stdin -> ids or text)\n"
         "  shardtrain train --data FILE|DIR|'GLOB'|@LIST [flags]   (see shardtrain train --help)\n"
         "  shardtrain ckpt  info|verify RUN_DIR|STEP_DIR\n"
         "  shardtrain ckpt  import HF_DIR|LLMC_FILE --out RUN_DIR\n"
         "  shardtrain ckpt  export RUN_DIR|STEP_DIR --out PATH [--dtype fp32|bf16] [--format "
         "hf|llmc]\n"
         "  shardtrain bench collectives|model [flags]   (busbw; scaling model; see shardtrain "
         "bench --help)\n"
         "  shardtrain bench train --ranks 1,2,4 [flags] -- TRAIN_FLAGS   (tokens/s, MFU, scaling;\n"
         "                   not under mpirun: it starts the runs)\n"
         "  shardtrain plan  [train's model/batch/system flags] [--ranks N] [--gpu-mem SIZE]\n"
         "                   [--fit] [--json]   (memory per GPU or CPU rank; see shardtrain "
         "plan --help)\n"
         "  shardtrain sample --init SRC --prompt TEXT [flags]   (continue a prompt, KV cache;\n"
         "                   one process: see shardtrain sample --help)\n"
         "  shardtrain eval  --init SRC --data FILE [flags]   (loss, perplexity, tokens; one\n"
         "                   process: see shardtrain eval --help)\n"
         "  shardtrain grads norms RUN_DIR | diff A B   (gradient dumps of train --dump-grads;\n"
         "                   see shardtrain grads --help)\n",
         SHARDTRAIN_VERSION);
}


static int cmd_ckpt(int argc, char **argv) {
  if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
    printf("usage: shardtrain ckpt info|verify RUN_DIR|STEP_DIR\n"
           "  info    step, tokens, data position, ranks, ZeRO stage and config of a checkpoint;\n"
           "          exit 3 when a rank file is missing (incomplete)\n"
           "  verify  every rank file, checksum, shape and finite value against the index;\n"
           "          exit 3 naming the file and dataset otherwise\n");
    return 0;
  }
  if (argc >= 2 && strcmp(argv[1], "info") && strcmp(argv[1], "verify")) {
    st_error_set("unknown ckpt action '%s'; use: shardtrain ckpt info|verify RUN_DIR|STEP_DIR",
                 argv[1]);
    return st_cli_fail(ST_EXIT_USAGE);
  }
  if (argc < 3) {
    st_error_set("usage: shardtrain ckpt info|verify RUN_DIR|STEP_DIR");
    return st_cli_fail(ST_EXIT_USAGE);
  }
  char dir[1200];
  int found = 0;
  /* A run directory means its latest checkpoint. */
  char latest[1200];
  snprintf(latest, sizeof latest, "%s/ckpt/latest", argv[2]);
  FILE *probe = fopen(latest, "r");
  if (probe) fclose(probe);
  char index[1300];
  snprintf(index, sizeof index, "%s/index.h5", argv[2]);
  if (!probe && !st_path_exists(index)) {
    st_error_set("no checkpoint at %s: give a run directory (one with ckpt/latest, as --out "
                 "wrote it) or a step directory such as RUN/ckpt/step_00001000", argv[2]);
    return st_cli_fail(ST_EXIT_CHECKPOINT);
  }
  if (probe) {
    /* The step `latest` names, and no other: resume may fall back to an
     * older complete step (with a notice), but a check of the run must
     * fail when the checkpoint `latest` points at is not usable. */
    char name[256] = "";
    if (st_read_small_file(latest, name, (int)sizeof name) != 0) name[0] = 0;
    name[strcspn(name, " \t\r\n")] = 0;
    snprintf(dir, sizeof dir, "%s/ckpt/%s", argv[2], name);
    if (!name[0] || strchr(name, '/') || !st_path_exists(dir)) {
      st_error_set("%s names '%s', which is not a step directory of %s/ckpt; train --resume "
                   "auto falls back to the newest complete one (give its step directory here "
                   "to check it)", latest, name, argv[2]);
      return st_cli_fail(ST_EXIT_CHECKPOINT);
    }
    found = 1;
  } else if (st_ckpt_resolve(argv[2], argv[2], dir, sizeof dir, &found)) {
    return st_cli_fail(ST_EXIT_CHECKPOINT);
  }
  if (!found) {
    st_error_set("no checkpoint at %s", argv[2]);
    return st_cli_fail(ST_EXIT_CHECKPOINT);
  }
  st_ckpt_meta meta;
  if (st_ckpt_read_meta(dir, &meta)) return st_cli_fail(ST_EXIT_CHECKPOINT);
  printf("checkpoint %s\n  step %lld, tokens seen %lld, data position %lld\n"
         "  written by %d rank%s at ZeRO stage %d\n  config %s\n",
         dir, (long long)meta.step, (long long)meta.tokens_seen, (long long)meta.data_position,
         meta.world_size, meta.world_size == 1 ? "" : "s", meta.zero_stage, meta.config_json);
  fflush(stdout);
  /* info too: a rank file missing is silent NaN through index.h5. */
  if (strcmp(argv[1], "info") == 0 && st_ckpt_check_files(dir))
    return st_cli_fail(ST_EXIT_CHECKPOINT);
  if (strcmp(argv[1], "verify") == 0) {
    /* A LoRA run's checkpoint holds its adapters, laid out by the adapter
     * table, not the model's parameter table. */
    st_model_source src;
    st_lora_config lora;
    char base[1024], digest[72];
    if (st_model_source_open(dir, &src)) return st_cli_fail(ST_EXIT_CHECKPOINT);
    const int is_lora = st_model_source_lora(&src, &lora, base, sizeof base, digest);
    if (is_lora < 0) return st_cli_fail(ST_EXIT_CHECKPOINT);
    st_param_table tab;
    st_lora_table lt = {0};
    if (is_lora ? st_lora_table_build(&src.cfg, &lora, &lt) ||
                      st_lora_param_table(&src.cfg, &lt, &tab)
                : st_param_table_build(&src.cfg, &tab)) {
      st_lora_table_free(&lt);
      return st_cli_fail(ST_EXIT_CHECKPOINT);
    }
    int rc = st_ckpt_verify(dir, &tab);
    st_param_table_free(&tab);
    st_lora_table_free(&lt);
    if (rc) return st_cli_fail(ST_EXIT_CHECKPOINT);
    printf("  verify: OK (all rank files present, checksums good, values finite, shapes match "
           "the config%s)\n", is_lora ? "'s LoRA adapters" : "");
  }
  return 0;
}

static int cmd_train(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      int rank;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      if (rank == 0) st_cli_print_train_usage();
      return 0;
    }
  st_env env;
  st_comm comm;
  int bad = st_env_detect(&env);
  if (bad) {
    if (env.rank == 0) st_cli_fail(ST_EXIT_USAGE);
    return ST_EXIT_USAGE;
  }
  st_run_config rc;
  st_run_config_defaults(&rc);
  const int parse_failed = st_cli_parse_train(argc, argv, &rc) != 0;
  if (st_comm_mpi_init(&comm)) return st_cli_fail(ST_EXIT_ERROR);
  /* Before any collective whose size depends on the flags: every rank
   * parsed its own command line (an app context can give each another),
   * so they first agree that all parsed, then that all parsed the same
   * (rank/train/config_agree.h). Both exchanges have fixed sizes. */
  int code = st_agree_failure(&comm, parse_failed);
  if (!code) {
    st_agree_list flags;
    memset(&flags, 0, sizeof flags);
    st_agree_run_config(&flags, &rc);
    if (st_agree_check(&comm, &flags)) {
      code = st_error_exit_code();
      if (comm.rank == 0) st_cli_fail(code); /* the same message on every rank: print it once */
    }
  }
  if (code) {
    st_comm_mpi_free(&comm);
    return code;
  }
  st_signals_install();
  code = st_train(&rc, &env, &comm);
  st_comm_mpi_free(&comm);
  return code;
}

int main(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    usage();
    return argc < 2 ? ST_EXIT_USAGE : 0;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "--version") == 0) {
    printf("shardtrain %s\n", SHARDTRAIN_VERSION);
    return 0;
  }
  if (strcmp(cmd, "prep") == 0) return st_cmd_prep(argc - 1, argv + 1);
  if (strcmp(cmd, "tokenize") == 0) return st_cmd_tokenize(argc - 1, argv + 1);
  if (strcmp(cmd, "ckpt") == 0 && argc >= 3 && strcmp(argv[2], "import") == 0)
    return st_cmd_ckpt_import(argc - 2, argv + 2);
  if (strcmp(cmd, "ckpt") == 0 && argc >= 3 && strcmp(argv[2], "export") == 0)
    return st_cmd_ckpt_export(argc - 2, argv + 2);
  if (strcmp(cmd, "ckpt") == 0) return cmd_ckpt(argc - 1, argv + 1);
  if (strcmp(cmd, "plan") == 0) return st_cmd_plan(argc - 1, argv + 1);
  if (strcmp(cmd, "sample") == 0) return st_cmd_sample(argc - 1, argv + 1); /* one process */
  if (strcmp(cmd, "eval") == 0) return st_cmd_eval(argc - 1, argv + 1);     /* one process */
  if (strcmp(cmd, "grads") == 0) return st_cmd_grads(argc - 1, argv + 1);   /* one process */
  if (strcmp(cmd, "train") == 0) {
    MPI_Init(&argc, &argv);
    int code = cmd_train(argc - 1, argv + 1);
    fflush(stdout);
    fflush(stderr);
    MPI_Finalize();
    return code;
  }
  /* bench train is the launcher of its runs: no MPI_Init here, so no MPI
   * state (or a singleton's environment) leaks into the mpirun it starts. */
  if (strcmp(cmd, "bench") == 0 && argc >= 3 && strcmp(argv[2], "train") == 0)
    return st_cmd_bench_train(argc - 2, argv + 2);
  if (strcmp(cmd, "bench") == 0) {
    MPI_Init(&argc, &argv);
    int code = st_cmd_bench(argc - 1, argv + 1);
    fflush(stdout);
    fflush(stderr);
    MPI_Finalize();
    return code;
  }
  st_error_set("unknown command '%s'; commands: prep, tokenize, train, ckpt, bench, plan, "
               "sample, eval, grads (see shardtrain --help)", cmd);
  return st_cli_fail(ST_EXIT_USAGE);
}
