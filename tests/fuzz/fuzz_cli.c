/* fuzz_cli.c - the command lines of `train` and `plan` (launcher/cli.c):
 * the input cut at NUL bytes is argv. Each parse accepts or refuses with
 * one line; an accepted `train` line's model passes st_run_config_check_model
 * or is refused by it in one line too. */
#include "tests/fuzz/fuzz.h"

#include "launcher/cli.h"

enum { MAX_ARGS = 64 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 4096) return 0;
  char *buf = malloc(size + 1);
  if (!buf) abort();
  memcpy(buf, data, size);
  buf[size] = 0;
  char *argv[MAX_ARGS + 2];
  int argc = 0;
  argv[argc++] = "shardtrain";
  for (size_t i = 0; i <= size && argc < MAX_ARGS + 1;) {
    argv[argc++] = buf + i;
    i += strlen(buf + i) + 1;
  }
  argv[argc] = NULL;
  st_run_config rc;
  st_run_config_defaults(&rc);
  fuzz_clear_error();
  if (st_cli_parse_train(argc, argv, &rc)) {
    fuzz_check_failure("st_cli_parse_train");
  } else {
    fuzz_accepted("st_cli_parse_train");
    fuzz_clear_error();
    if (st_run_config_check_model(&rc)) fuzz_check_failure("st_run_config_check_model");
  }
  st_plan_options o;
  fuzz_clear_error();
  if (st_cli_parse_plan(argc, argv, &o)) fuzz_check_failure("st_cli_parse_plan");
  else fuzz_accepted("st_cli_parse_plan");
  free(buf);
  return 0;
}
