/* config_agree.c - ranks compare their run configuration (see config_agree.h). */
#include "rank/train/config_agree.h"

#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

static uint64_t fnv1a(const char *s, uint64_t h) {
  for (; *s; s++) {
    h ^= (unsigned char)*s;
    h *= 1099511628211ULL;
  }
  return h;
}

#define FNV_BASIS 14695981039346656037ULL

void st_agree_add(st_agree_list *l, const char *name, int code, const char *fix,
                  const char *fmt, ...) {
  if (l->n >= ST_AGREE_MAX_FIELDS) {
    l->dropped++;
    return;
  }
  char value[2200]; /* the longest field is a path of 1024 bytes */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(value, sizeof value, fmt, ap);
  va_end(ap);
  const int i = l->n++;
  l->name[i] = name;
  l->fix[i] = fix;
  l->code[i] = code;
  l->hash[i] = fnv1a(value, FNV_BASIS);
  const size_t cap = sizeof l->shown[i], len = strlen(value);
  if (len < cap) memcpy(l->shown[i], value, len + 1);
  else { /* shown cut, with "..." ending it */
    memcpy(l->shown[i], value, cap - 4);
    memcpy(l->shown[i] + cap - 4, "...", 4);
  }
}

void st_agree_add_float(st_agree_list *l, const char *name, int code, const char *fix, double x) {
  st_agree_add(l, name, code, fix, "%g", x);
  if (l->dropped) return;
  char exact[64];
  snprintf(exact, sizeof exact, "%a", x);
  l->hash[l->n - 1] = fnv1a(exact, FNV_BASIS);
}

void st_agree_run_config(st_agree_list *l, const st_run_config *rc) {
  static const char *const fix = "every rank must get the same flags";
  const int U = ST_EXIT_USAGE;
  const st_model_config *m = &rc->model;
  const st_optim_config *o = &rc->optim;
  /* Primary flags before the ones derived from them (--lr-decay-steps
   * follows --steps, --model turns "custom" with a shape flag), so the
   * message names the flag the user gave. */
  st_agree_add(l, "--seq-len", U, fix, "%d", rc->seq_len); /* it sets the positions */
  /* the model description field by field (rank/model/config_fields.h), as
   * validation will fill it: --kv-heads 4 given next to --heads 4 is the
   * same model as neither */
  const st_model_config eff = st_model_effective(m);
  for (int i = 0; i < ST_MF_COUNT; i++) {
    const st_model_field_id id = (st_model_field_id)i;
    const st_model_field *f = st_model_field_info(id);
    if (f->kind == ST_MF_FLOAT) {
      st_agree_add_float(l, f->label, U, fix, st_model_field_get(&eff, id));
    } else {
      char v[32];
      st_agree_add(l, f->label, U, fix, "%s", st_model_field_show(&eff, id, v, sizeof v));
    }
  }
  st_agree_add(l, "--init-from", U, fix, "%s", rc->init_from);
  st_agree_add(l, "--model", U, fix, "%s", rc->model_name);
  st_agree_add(l, "--micro-batch", U, fix, "%d", rc->micro_batch);
  st_agree_add(l, "--global-batch", U, fix, "%d", rc->global_batch);
  st_agree_add(l, "--zero", U, fix, "%d", rc->zero_stage);
  st_agree_add(l, "--offload", U, fix, "%s", rc->offload ? "optimizer" : "none");
  st_agree_add(l, "--grad-dtype", U, fix, "%s", rc->grad_dtype);
  st_agree_add(l, "--precision", U, fix, "%s", rc->precision);
  st_agree_add_float(l, "--loss-scale-max", U, fix, rc->loss_scale_max);
  st_agree_add(l, "--recompute", U, fix, "%s", rc->recompute);
  st_agree_add(l, "--attention", U, fix, "%s", rc->attention);
  st_agree_add(l, "--device", U, fix, "%s", rc->device);
  st_agree_add(l, "--data", U, fix, "%s", rc->data);
  st_agree_add(l, "--val-data", U, fix, "%s", rc->val_data);
  st_agree_add(l, "--out", U, fix, "%s", rc->out);
  st_agree_add(l, "--resume", U, fix, "%s", rc->resume);
  st_agree_add(l, "--dump-params", U, fix, "%s", rc->dump_params);
  st_agree_add(l, "--dump-grads", U, fix, "%d:%s", rc->dump_grads_every, rc->dump_grads_pattern);
  st_agree_add(l, "the tokenizer", ST_EXIT_DATA, "every rank must read the same --data file and "
               "checkpoint", "%s %s %d", rc->tokenizer_name, rc->tokenizer_digest,
               rc->tokenizer_vocab);
  st_agree_add(l, "--steps", U, fix, "%lld", (long long)rc->steps);
  st_agree_add(l, "--stop-after", U, fix, "%d", rc->stop_after);
  st_agree_add(l, "--ckpt-every", U, fix, "%d", rc->ckpt_every);
  st_agree_add(l, "--ckpt-async", U, fix, "%s", rc->ckpt_async ? "on" : "off");
  st_agree_add(l, "--keep-last", U, fix, "%d", rc->keep_last);
  st_agree_add(l, "--val-every", U, fix, "%d", rc->val_every);
  st_agree_add(l, "--val-seqs", U, fix, "%d", rc->val_seqs);
  st_agree_add(l, "--log-every", U, fix, "%d", rc->log_every);
  st_agree_add(l, "--seed", U, fix, "%llu", (unsigned long long)rc->seed);
  st_agree_add_float(l, "--lr", U, fix, o->lr);
  st_agree_add_float(l, "--min-lr-frac", U, fix, o->min_lr_frac);
  st_agree_add(l, "--warmup", U, fix, "%d", o->warmup_steps);
  st_agree_add(l, "--lr-decay-steps", U, fix, "%lld", (long long)o->total_steps);
  st_agree_add_float(l, "--beta1", U, fix, o->beta1);
  st_agree_add_float(l, "--beta2", U, fix, o->beta2);
  st_agree_add_float(l, "--eps", U, fix, o->eps);
  st_agree_add_float(l, "--weight-decay", U, fix, o->weight_decay);
  st_agree_add_float(l, "--grad-clip", U, fix, o->grad_clip);
  st_agree_add(l, "--auto-fit/--auto-fit-zero", U, fix, "%s",
               rc->auto_fit == 2 ? "--auto-fit-zero" : rc->auto_fit ? "--auto-fit" : "neither");
  st_agree_add(l, "--gpu-mem", U, fix, "%llu bytes", (unsigned long long)rc->gpu_mem);
  st_agree_add(l, "--enforce-gpu-mem", U, fix, "%s", rc->enforce_gpu_mem ? "given" : "not given");
  st_agree_add_float(l, "--headroom", U, fix, rc->headroom_pct);
  st_agree_add(l, "--gpu-stats-every", U, fix, "%d", rc->gpu_stats_every);
  st_agree_add_float(l, "--mem-warn-fraction", U, fix, rc->mem_warn_fraction);
  st_agree_add(l, "--json", U, fix, "%s", rc->json ? "given" : "not given");
  st_agree_add(l, "--step-timing", U, fix, "%s", rc->step_timing ? "given" : "not given");
  st_agree_add(l, "--shuffle", U, fix, "%s", rc->shuffle);
  st_agree_add(l, "--data-changed-ok", U, fix, "%s", rc->data_changed_ok ? "given" : "not given");
  st_agree_add_float(l, "--nccl-timeout", U, fix, rc->nccl_timeout_s);
  st_agree_add(l, "--nccl-buffsize", U, fix, "%lld", rc->nccl_buffsize);
  st_agree_add(l, "--nccl-cga", U, fix, "%d", rc->nccl_cga);
  st_agree_add(l, "--nccl-min-ctas", U, fix, "%d", rc->nccl_min_ctas);
  st_agree_add(l, "--nccl-max-ctas", U, fix, "%d", rc->nccl_max_ctas);
  st_agree_add(l, "--nccl-overlap-ctas", U, fix, "%d", rc->nccl_overlap_ctas);
}

/* "0-1,3" for the ranks r with grp[r] == g. */
static void rank_list(const int *grp, int world, int g, char *out, size_t cap, int *count) {
  size_t len = 0;
  *count = 0;
  out[0] = 0;
  for (int r = 0; r < world; r++) {
    if (grp[r] != g) continue;
    int e = r;
    while (e + 1 < world && grp[e + 1] == g) e++;
    int n = e > r ? snprintf(out + len, cap - len, "%s%d-%d", len ? "," : "", r, e)
                  : snprintf(out + len, cap - len, "%s%d", len ? "," : "", r);
    if (n > 0 && (size_t)n < cap - len) len += (size_t)n;
    *count += e - r + 1;
    r = e;
  }
}

/* A few kilobytes per rank: a rank that cannot have them cannot take part
 * in the fixed-size gathers either, and waiting peers would hang, so the
 * job ends here. */
static void *must_calloc(size_t n, size_t size) {
  void *p = calloc(n, size);
  if (!p) {
    fprintf(stderr, "shardtrain: error: out of host memory comparing the run configuration "
            "across ranks\n");
    MPI_Abort(MPI_COMM_WORLD, ST_EXIT_ERROR);
  }
  return p;
}

/* The message for field i, whose hashes over ranks are h[r]. Collective:
 * gathers the shown values. */
static int report(st_comm *c, const st_agree_list *l, int i, const uint64_t *h) {
  const int world = c->world;
  char mine[ST_AGREE_SHOWN];
  memset(mine, 0, sizeof mine);
  snprintf(mine, sizeof mine, "%s", l->shown[i]);
  char *shown = must_calloc((size_t)world, ST_AGREE_SHOWN);
  int *grp = must_calloc((size_t)world, sizeof *grp);
  if (c->all_gather(c, mine, shown, ST_AGREE_SHOWN / 2, 2)) {
    free(shown);
    free(grp);
    return st_error_setc(l->code[i], "%s differs between ranks; %s", l->name[i], l->fix[i]);
  }
  int ngroups = 0;
  for (int r = 0; r < world; r++) {
    grp[r] = -1;
    for (int q = 0; q < r && grp[r] < 0; q++)
      if (h[q] == h[r]) grp[r] = grp[q];
    if (grp[r] < 0) grp[r] = ngroups++;
  }
  char msg[1500];
  size_t len = (size_t)snprintf(msg, sizeof msg, "%s differs between ranks:", l->name[i]);
  for (int g = 0; g < ngroups && len < sizeof msg; g++) {
    if (g == 4) {
      snprintf(msg + len, sizeof msg - len, ", and %d other values", ngroups - 4);
      break;
    }
    int first = 0;
    while (grp[first] != g) first++;
    char ranks[256];
    int count;
    rank_list(grp, world, g, ranks, sizeof ranks, &count);
    const char *v = shown + (size_t)first * ST_AGREE_SHOWN;
    snprintf(msg + len, sizeof msg - len, "%s %s on rank%s %s", g ? "," : "", v[0] ? v : "''",
             count > 1 ? "s" : "", ranks);
    len = strlen(msg);
  }
  free(shown);
  free(grp);
  return st_error_setc(l->code[i], "%s; %s", msg, l->fix[i]);
}

int st_agree_check(st_comm *c, const st_agree_list *l) {
  /* Slot 0: the layout (names and count), so ranks of different builds
   * are told apart from ranks of different flags. */
  uint64_t mine[ST_AGREE_MAX_FIELDS + 1];
  memset(mine, 0, sizeof mine);
  uint64_t layout = FNV_BASIS;
  for (int i = 0; i < l->n; i++) layout = fnv1a(l->name[i], layout);
  mine[0] = layout ^ (uint64_t)l->n ^ ((uint64_t)l->dropped << 32);
  for (int i = 0; i < l->n; i++) mine[1 + i] = l->hash[i];
  const size_t slots = ST_AGREE_MAX_FIELDS + 1;
  uint64_t *all = must_calloc((size_t)c->world * slots, sizeof *all);
  /* bytes, as 16-bit elements: the gather moves them unchanged */
  if (c->all_gather(c, mine, all, sizeof mine / 2, 2)) {
    free(all);
    return st_error_prefix("cannot compare the run configuration across ranks");
  }
  if (l->dropped) {
    free(all);
    return st_error_setc(ST_EXIT_ERROR, "internal error: %d configuration fields past "
                         "ST_AGREE_MAX_FIELDS (%d) are not compared; raise it in "
                         "rank/train/config_agree.h", l->dropped, ST_AGREE_MAX_FIELDS);
  }
  for (int r = 1; r < c->world; r++)
    if (all[(size_t)r * slots] != all[0]) {
      free(all);
      return st_error_setc(ST_EXIT_USAGE, "ranks 0 and %d run different builds of shardtrain "
                           "(their lists of settings differ); start every rank from the same "
                           "binary", r);
    }
  int field = -1;
  for (int i = 0; i < l->n && field < 0; i++)
    for (int r = 1; r < c->world && field < 0; r++)
      if (all[(size_t)r * slots + 1 + (size_t)i] != all[1 + (size_t)i]) field = i;
  if (field < 0) {
    free(all);
    return 0;
  }
  uint64_t *h = must_calloc((size_t)c->world, sizeof *h);
  for (int r = 0; r < c->world; r++) h[r] = all[(size_t)r * slots + 1 + (size_t)field];
  free(all);
  int ret = report(c, l, field, h);
  free(h);
  return ret;
}

int st_agree_failure(st_comm *c, int failed) {
  int v[1] = {failed ? c->world - c->rank : 0};
  if (c->world > 1) c->all_reduce_int_max(c, v, 1);
  if (!v[0]) return 0;
  int first = c->world - v[0];
  int code = failed ? st_error_exit_code() : 0;
  if (c->world > 1) c->broadcast(c, &code, sizeof code, first);
  if (c->rank == first) {
    fflush(stdout);
    if (c->world > 1) fprintf(stderr, "shardtrain: error (rank %d): %s\n", c->rank, st_error_msg());
    else fprintf(stderr, "shardtrain: error: %s\n", st_error_msg());
    fflush(stderr);
  }
  return code ? code : ST_EXIT_ERROR;
}
