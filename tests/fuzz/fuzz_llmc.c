/* fuzz_llmc.c - an llm.c model file (io/llmc_model.h): the header, and
 * the parameters when the shape it states is small. */
#include "tests/fuzz/fuzz.h"

#include "io/llmc_model.h"
#include "rank/model/params.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_path(0, "model.bin");
  fuzz_write(path, data, size);
  (void)st_llmc_is_model(path);
  st_model_config cfg;
  memset(&cfg, 0, sizeof cfg);
  st_dtype dt;
  fuzz_clear_error();
  if (st_llmc_read_header(path, &cfg, &dt)) {
    fuzz_check_failure("st_llmc_read_header");
    return 0;
  }
  fuzz_accepted("st_llmc_read_header");
  if (st_model_validate(&cfg) != 0) {
    fprintf(stderr, "fuzz: st_llmc_read_header accepted a shape st_model_validate refuses\n");
    abort();
  }
  st_param_table tab;
  fuzz_clear_error();
  if (st_param_table_build(&cfg, &tab)) {
    fuzz_check_failure("st_param_table_build");
    return 0;
  }
  if (tab.total <= (1 << 22)) {
    float *p = malloc((size_t)tab.total * sizeof(float));
    if (!p) abort();
    fuzz_clear_error();
    if (st_llmc_read(path, &cfg, &tab, p)) fuzz_check_failure("st_llmc_read");
    else fuzz_accepted("st_llmc_read");
    free(p);
  }
  st_param_table_free(&tab);
  return 0;
}
