/* fuzz_safetensors.c - a safetensors file (io/safetensors.h): open it and
 * read every tensor small enough to hold. */
#include "tests/fuzz/fuzz.h"

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_path(0, "model.safetensors");
  fuzz_write(path, data, size);
  st_sf_set set;
  memset(&set, 0, sizeof set);
  fuzz_clear_error();
  if (st_sf_open_file(path, &set)) {
    fuzz_check_failure("st_sf_open_file");
  } else {
    fuzz_accepted("st_sf_open_file");
    for (int i = 0; i < set.n; i++) {
      const st_sf_tensor *t = &set.t[i];
      if (t->numel < 0 || (uint64_t)t->numel * st_dtype_size(t->dtype) != t->bytes) {
        fprintf(stderr, "fuzz: tensor %s: %lld elements but %llu bytes accepted\n", t->name,
                (long long)t->numel, (unsigned long long)t->bytes);
        abort();
      }
      if (st_sf_find(&set, t->name) != t) abort(); /* names are unique */
      if (t->numel > (1 << 20)) continue;
      float *out = malloc((size_t)(t->numel ? t->numel : 1) * sizeof(float));
      if (!out) abort();
      fuzz_clear_error();
      if (st_sf_read_f32(&set, t, out)) fuzz_check_failure("st_sf_read_f32");
      free(out);
    }
  }
  st_sf_close(&set);
  return 0;
}
