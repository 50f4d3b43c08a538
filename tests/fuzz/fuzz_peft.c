/* fuzz_peft.c - a PEFT LoRA adapter directory (io/peft_export.h):
 * adapter_config.json, then "\n--8<--\n", then adapter_model.safetensors. */
#include "tests/fuzz/fuzz.h"

#include "io/peft_export.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *dir = fuzz_two_files("adapter", "adapter_config.json",
                                   "adapter_model.safetensors", data, size);
  st_peft_set s;
  fuzz_clear_error();
  if (st_peft_read(dir, &s)) {
    fuzz_check_failure("st_peft_read");
    return 0;
  }
  fuzz_accepted("st_peft_read");
  /* what the header says it read is there: touch every element */
  double sum = 0;
  for (int i = 0; i < s.n; i++) {
    const st_peft_adapter *a = &s.ad[i];
    if (a->in < 1 || a->out < 1 || s.cfg.r < 1) abort();
    for (int64_t k = 0; k < (int64_t)s.cfg.r * a->in; k++) sum += a->A[k];
    for (int64_t k = 0; k < (int64_t)a->out * s.cfg.r; k++) sum += a->B[k];
  }
  if (getenv("ST_FUZZ_VERBOSE")) fprintf(stderr, "fuzz: %d adapters, sum %g\n", s.n, sum);
  st_peft_free(&s);
  return 0;
}
