/* fuzz_sf_dir.c - a sharded safetensors model directory (io/safetensors.h,
 * st_sf_open_dir): model.safetensors.index.json, then "\n--8<--\n", then
 * the shard it should name, model-00001-of-00001.safetensors. */
#include "tests/fuzz/fuzz.h"

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *dir = fuzz_two_files("model", "model.safetensors.index.json",
                                   "model-00001-of-00001.safetensors", data, size);
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
