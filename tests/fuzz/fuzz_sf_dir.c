/* fuzz_sf_dir.c - a sharded safetensors model directory (io/safetensors.h,
 * st_sf_open_dir): model.safetensors.index.json, then "\n--8<--\n", then
 * the shard it should name, model-00001-of-00001.safetensors. */
#include "tests/fuzz/fuzz.h"

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *b;
  size_t na, nb;
  fuzz_split(data, size, "\n--8<--\n", &na, &b, &nb);
  const char *dir = fuzz_path(1, "model");
  fuzz_fresh_dir(dir);
  char path[700];
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  fuzz_write(path, data, na);
  snprintf(path, sizeof path, "%s/model-00001-of-00001.safetensors", dir);
  fuzz_write(path, b, nb);
  st_sf_set set;
  memset(&set, 0, sizeof set);
  fuzz_clear_error();
  if (st_sf_open_dir(dir, &set)) {
    fuzz_check_failure("st_sf_open_dir");
  } else {
    fuzz_accepted("st_sf_open_dir");
    for (int i = 0; i < set.n; i++)
      if (set.t[i].file < 0 || set.t[i].file >= set.nfiles) abort();
  }
  st_sf_close(&set);
  return 0;
}
