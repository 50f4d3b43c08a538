/* grad_dumps.c - the step's side of --dump-grads (io/grad_dump.h): on the
 * steps it names, this rank's reduced gradient shard comes to the host,
 * unscaled, and goes out in the checkpoint layout. Other steps pay one
 * modulo. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/grad_dump.h"
#include "rank/train/trainer_state.h"
#include "util/error.h"

/* ST_TEST_GRAD_RAW=DIR (tests only): also write this rank's shard as raw
 * float32 to DIR/step_N_rank_R.f32, the values the program computed, for
 * comparing with what the dump holds. */
static int write_raw(const trainer *tr, int64_t step, const float *g, size_t n) {
  const char *dir = getenv("ST_TEST_GRAD_RAW");
  if (!dir || !dir[0]) return 0;
  char path[4200];
  snprintf(path, sizeof path, "%s/step_%lld_rank_%d.f32", dir, (long long)step, tr->comm->rank);
  FILE *f = fopen(path, "wb");
  int ok = f && fwrite(g, sizeof(float), n, f) == n;
  if (f) ok &= fclose(f) == 0;
  return ok ? 0 : st_error_set("ST_TEST_GRAD_RAW: cannot write %s", path);
}

int st_trainer_dump_grads_check(const trainer *tr) {
  const st_run_config *rc = tr->rc;
  if (rc->dump_grads_every <= 0 || !rc->dump_grads_pattern[0]) return 0;
  int n = 0;
  for (int i = 0; i < tr->model.tab.n; i++)
    n += st_grad_pattern_match(rc->dump_grads_pattern, tr->model.tab.t[i].name);
  if (n > 0) return 0;
  const st_param_table *tab = &tr->model.tab;
  return st_error_setc(ST_EXIT_USAGE, "--dump-grads %d:%s: the pattern matches no tensor of "
                       "this model; its names are like %s, %s and %s (comma-separated globs, "
                       "e.g. 'h.0.*,ln_f.*')", rc->dump_grads_every, rc->dump_grads_pattern,
                       tab->t[0].name, tab->n > 2 ? tab->t[2].name : tab->t[0].name,
                       tab->t[tab->n - 1].name);
}

int st_trainer_dump_grads(trainer *tr, const void *g, st_dtype gdt, double norm, float clip,
                          float loss_scale, int skipped) {
  const st_run_config *rc = tr->rc;
  const int64_t step = tr->step + 1;
  if (rc->dump_grads_every <= 0 || step % rc->dump_grads_every != 0) return 0;
  const size_t n = (size_t)(tr->part.end - tr->part.begin);
  float *host = malloc(n * sizeof(float) + sizeof(float));
  int failed = host == NULL;
  if (failed) st_error_set("--dump-grads: cannot allocate %zu bytes of host memory for step %lld",
                           n * sizeof(float), (long long)step);
  if (!failed && gdt != ST_FP32) { /* bf16: widened exactly on the host */
    void *bits = malloc(n * st_dtype_size(gdt) + 1);
    failed = bits == NULL;
    if (failed) st_error_set("--dump-grads: cannot allocate %zu bytes of host memory for step %lld",
                             n * st_dtype_size(gdt), (long long)step);
    else {
      tr->ops->to_host(bits, g, n * st_dtype_size(gdt));
      st_dtype_to_f32(gdt, host, bits, n);
    }
    free(bits);
  } else if (!failed) {
    tr->ops->to_host(host, g, n * sizeof(float));
  }
  if (!failed) {
    if (loss_scale != 1.0f)
      for (size_t i = 0; i < n; i++) host[i] /= loss_scale;
    failed = write_raw(tr, step, host, n) != 0;
  }
  int code = st_trainer_agree(tr, failed);
  if (code) {
    free(host);
    return code;
  }
  st_grad_dump_meta meta;
  memset(&meta, 0, sizeof meta);
  meta.step = step;
  meta.grad_norm = norm;
  meta.clip_factor = clip;
  meta.loss_scale = loss_scale;
  meta.skipped = skipped;
  meta.world_size = tr->comm->world;
  meta.zero_stage = rc->zero_stage;
  snprintf(meta.pattern, sizeof meta.pattern, "%s", rc->dump_grads_pattern);
  snprintf(meta.run_id, sizeof meta.run_id, "%s", tr->lock.run_id);
  meta.config_json = tr->config_json;
  int rc2 = st_grad_dump_save(rc->out, tr->comm, &tr->model.tab, &tr->part, host, &meta);
  free(host);
  if (rc2) return ST_EXIT_ERROR; /* every rank: the save agreed on the failure */
  if (tr->comm->rank == 0 && step % rc->log_every == 0) {
    printf("grads: %s/grads/step_%08lld\n", rc->out, (long long)step);
    fflush(stdout);
  }
  return 0;
}
