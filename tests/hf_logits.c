/* hf_logits.c - logits of any model source on the CPU ops table, for the
 * parity tests against transformers (tests/e2e/test_hf_logits.py in ctest,
 * tests/gpu/hf_roundtrip.py on the GPU machine).
 *
 *   hf_logits SRC IDS.i32 B T OUT.f32
 *
 * SRC: anything st_model_source_open takes (run or step directory, Hugging
 * Face directory, llm.c file). IDS.i32: B*T little-endian int32 token ids.
 * Writes OUT.f32: raw little-endian float32 logits [B, T, vocab_size] (the
 * padded columns dropped), computed by st_model_logits in fp32.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/model_source.h"
#include "kernels/ops.h"
#include "rank/model/model.h"
#include "util/error.h"

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: hf_logits SRC IDS.i32 B T OUT.f32\n");
    return 2;
  }
  const int B = atoi(argv[3]), T = atoi(argv[4]);
  st_model_source s;
  st_param_table tab;
  st_model m;
  memset(&m, 0, sizeof m);
  if (B < 1 || T < 1 || st_model_source_open(argv[1], &s) || st_param_table_build(&s.cfg, &tab)) {
    fprintf(stderr, "hf_logits: %s\n", st_error_msg());
    return 3;
  }
  if (T > s.cfg.block_size) {
    fprintf(stderr, "hf_logits: T %d > the model's %d positions\n", T, s.cfg.block_size);
    st_param_table_free(&tab);
    return 2;
  }
  int *ids = malloc(sizeof(int) * (size_t)B * (size_t)T);
  float *w = malloc(sizeof(float) * (size_t)tab.total);
  FILE *f = fopen(argv[2], "rb");
  int ok = ids && w && f && fread(ids, sizeof(int), (size_t)B * T, f) == (size_t)B * T;
  if (f) fclose(f);
  for (int i = 0; ok && i < B * T; i++) ok = ids[i] >= 0 && ids[i] < s.cfg.vocab_size;
  if (!ok) {
    fprintf(stderr, "hf_logits: cannot read %d ids < %d from %s\n", B * T, s.cfg.vocab_size,
            argv[2]);
  }
  int rc = ok ? 3 : 2;
  if (!ok) goto out;
  if (st_model_source_read(&s, &tab, w) ||
      st_model_init(&m, &s.cfg, st_ops_cpu(), B, T, 1, ST_RECOMPUTE_NONE)) {
    fprintf(stderr, "hf_logits: %s\n", st_error_msg());
    goto out;
  }
  /* pad_multiple 1: padded_total == tab.total, so w is the whole host vector. */
  if (m.padded_total != tab.total || st_model_set_weights(&m, w)) {
    fprintf(stderr, "hf_logits: cannot set the weights: %s\n", st_error_msg());
    goto out;
  }
  const int V = s.cfg.vocab_size, Vp = s.cfg.padded_vocab_size;
  float *lg = malloc(sizeof(float) * (size_t)B * T * Vp);
  if (!lg || st_model_logits(&m, ids, B, T, lg)) {
    fprintf(stderr, "hf_logits: cannot compute the logits: out of host memory\n");
    free(lg);
    goto out;
  }
  FILE *o = fopen(argv[5], "wb");
  ok = o != NULL;
  for (int r = 0; ok && r < B * T; r++) ok = fwrite(lg + (size_t)r * Vp, 4, (size_t)V, o) == (size_t)V;
  if (o) ok = fclose(o) == 0 && ok;
  free(lg);
  if (!ok) {
    fprintf(stderr, "hf_logits: cannot write %s\n", argv[5]);
    goto out;
  }
  rc = 0;
out:
  st_model_free(&m);
  st_param_table_free(&tab);
  free(ids);
  free(w);
  return rc;
}
