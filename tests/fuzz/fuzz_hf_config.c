/* fuzz_hf_config.c - a Hugging Face config.json (io/hf_arch.h): the
 * family and shape, and the special ids, from a directory holding it. */
#include "tests/fuzz/fuzz.h"

#include <cjson/cJSON.h>

#include "io/hf_arch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_write(fuzz_path(0, "config.json"), data, size);
  const st_hf_arch *arch = NULL;
  st_model_config cfg;
  memset(&cfg, 0, sizeof cfg);
  fuzz_clear_error();
  if (st_hf_read_config(fuzz_dir(), &arch, &cfg)) {
    fuzz_check_failure("st_hf_read_config");
  } else if (!arch || st_model_validate(&cfg) != 0) {
    fprintf(stderr, "fuzz: st_hf_read_config accepted a shape st_model_validate refuses: %s\n",
            st_error_msg());
    abort();
  } else {
    fuzz_accepted("st_hf_read_config");
  }
  cJSON *ids = st_hf_special_ids(fuzz_dir());
  if (ids) {
    char *text = malloc(size + 1);
    if (!text) abort();
    memcpy(text, data, size);
    text[size] = 0;
    char *with = st_hf_config_with_ids(text, ids);
    if (with != text) free(with);
    free(text);
    cJSON_Delete(ids);
  }
  return 0;
}
