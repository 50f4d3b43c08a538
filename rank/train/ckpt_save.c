/* ckpt_save.c - the trainer's checkpoint saves, synchronous or in the
 * background (--ckpt-async on, the default).
 *
 * An asynchronous save copies this rank's partition (fp32 weights, Adam m
 * and v) into pinned host staging buffers sized at setup (the plan's "host
 * checkpoint staging"), checks it is finite, makes the temporary step
 * directory (collective), and hands the rank file to a writer thread while
 * training goes on. The writer makes no collective call: when every rank's
 * writer is done (asked in the step boundary's all-reduce), or at the next
 * save, the preemption path or the end of training, the ranks finish the
 * save together (io/checkpoint.h: index, rename, then latest), exactly as a
 * synchronous save would. So latest still moves only after every rank has
 * flushed, and a kill -9 mid-write leaves the previous latest. HDF5 must
 * be built thread-safe for this (Debian's is); otherwise saves are
 * synchronous and the configuration block says so.
 */
#define _XOPEN_SOURCE 700
#include <hdf5.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/checkpoint.h"
#include "io/checkpoint_dirs.h"
#include "io/h5util.h"
#include "rank/train/trainer_state.h"
#include "util/bytes.h"
#include "util/error.h"
#include "util/fsutil.h"

struct st_ckpt_writer {
  int on;               /* --ckpt-async on and HDF5 thread-safe */
  float *hp, *hm, *hv;  /* staging: this rank's partition, part.end - part.begin each */
  size_t n;
  int pinned;           /* allocated with ops->host_alloc (else malloc) */
  st_ckpt_pending pending;
  int in_flight;        /* begun, not finished */
  int thread_live;      /* started, not joined */
  pthread_t thread;
  atomic_int done;      /* the writer has returned */
  int failed;
  char msg[2048];
  double slow_s;        /* ST_FAULT_CKPT_SLOW: the writer sleeps first (tests) */
  long long slow_from;  /* ... for saves of this step and later */
};

uint64_t st_trainer_ckpt_staging_bytes(const trainer *tr) {
  return 3 * (uint64_t)(tr->part.end - tr->part.begin) * sizeof(float);
}

int st_trainer_ckpt_setup(trainer *tr) {
  struct st_ckpt_writer *w = calloc(1, sizeof *w);
  if (!w) return st_error_set("out of host memory");
  tr->ckpt = w;
  hbool_t safe = 0;
  w->on = tr->rc->ckpt_async && H5is_library_threadsafe(&safe) >= 0 && safe;
  w->n = (size_t)(tr->part.end - tr->part.begin);
  const char *slow = getenv("ST_FAULT_CKPT_SLOW"); /* SECONDS[:FROM_STEP] (faults.h) */
  w->slow_s = slow ? atof(slow) : 0;
  w->slow_from = slow && strchr(slow, ':') ? atoll(strchr(slow, ':') + 1) : 0;
  if (!w->on) return 0; /* synchronous saves stage through malloc at each save */
  /* One buffer of three parts. Pinned on a GPU, so the copies off the
   * device are DMA; on the CPU the backend's memory is host memory already,
   * and plain malloc keeps the backend's allocation count to its arena. */
  const size_t part = w->n + 1, bytes = 3 * part * sizeof(float);
  w->pinned = tr->device_index >= 0 && tr->ops->host_alloc != NULL;
  w->hp = w->pinned ? tr->ops->host_alloc(bytes, "checkpoint staging") : calloc(1, bytes);
  if (!w->hp)
    return st_error_setc(ST_EXIT_OOM, "cannot allocate %zu bytes of host memory to stage "
                         "asynchronous checkpoints (3 x this rank's partition); free host "
                         "memory or train with --ckpt-async off", bytes);
  w->hm = w->hp + part;
  w->hv = w->hm + part;
  return 0;
}

const char *st_trainer_ckpt_mode(const trainer *tr) {
  static char text[256];
  char a[32];
  if (!tr->ckpt) return "synchronous";
  if (!tr->ckpt->on)
    return tr->rc->ckpt_async ? "synchronous (this HDF5 is not built thread-safe)"
                              : "synchronous (--ckpt-async off)";
  snprintf(text, sizeof text, "asynchronous: staged in %s of %shost memory per rank, written "
           "by a background thread while training goes on",
           st_format_bytes(st_trainer_ckpt_staging_bytes(tr), a, sizeof a),
           tr->ckpt->pinned ? "pinned " : "");
  return text;
}

/* --keep-last (rank 0, after `latest` names the new checkpoint): older
 * complete checkpoints beyond the newest N go, except those marked `keep`
 * (io/checkpoint_dirs.h). A removal that fails is a warning: training on
 * loses nothing. */
static void prune_checkpoints(trainer *tr) {
  if (tr->rc->keep_last < 1) return;
  char removed[2048];
  if (st_ckpt_prune(tr->rc->out, tr->rc->keep_last, removed, sizeof removed) != 0)
    fprintf(stderr, "shardtrain: warning: %s\n", st_error_msg());
  if (removed[0])
    printf("checkpoint: removed %s (--keep-last %d)\n", removed, tr->rc->keep_last);
}

/* How many values of this rank's share (hp, hm, hv: the partition's fp32
 * weights, Adam m and v) are NaN or inf, and where the first is. */
static int64_t count_nonfinite(const trainer *tr, const float *hp, const float *hm,
                               const float *hv, const char **group, const char **tensor) {
  static const char *const k_group[3] = {"params", "adam_m", "adam_v"};
  const int64_t b = tr->part.begin, n = tr->part.end - tr->part.begin;
  const float *const src[3] = {hp, hm, hv};
  int64_t count = 0, first = -1;
  for (int g = 0; g < 3; g++)
    for (int64_t i = 0; i < n; i++)
      if (!isfinite(src[g][i]) && count++ == 0) {
        *group = k_group[g];
        first = b + i;
      }
  const st_param_table *tab = &tr->model.tab;
  for (int t = 0; first >= 0 && t < tab->n; t++)
    if (first >= tab->t[t].offset && first < tab->t[t].offset + tab->t[t].numel)
      *tensor = tab->t[t].name;
  return count;
}

/* A diverged run must not replace its last good checkpoint: every rank
 * checks its share, and if any holds a NaN or inf nobody writes (exit 1). */
static int refuse_nonfinite(trainer *tr, const float *hp, const float *hm, const float *hv) {
  const char *group = "?", *tensor = "?";
  int64_t bad = count_nonfinite(tr, hp, hm, hv, &group, &tensor);
  if (bad > 0) {
    char latest[1200], name[256] = "";
    snprintf(latest, sizeof latest, "%s/ckpt/latest", tr->rc->out);
    if (!st_path_exists(latest) || st_read_small_file(latest, name, sizeof name) != 0)
      snprintf(name, sizeof name, "nothing (no earlier checkpoint)");
    st_error_setc(ST_EXIT_ERROR, "the run diverged: %lld NaN or inf value(s) in the weights or "
                  "Adam moments at step %lld, the first in %s/%s; checkpoint step %lld was not "
                  "written and ckpt/latest still names %s (resume from it with a lower --lr or "
                  "a --grad-clip)", (long long)bad, (long long)tr->step, group, tensor,
                  (long long)tr->step, name);
  }
  return st_trainer_agree(tr, bad > 0);
}

static void *writer_main(void *arg) {
  struct st_ckpt_writer *w = arg;
  st_h5_quiet(); /* HDF5's error printing is per thread in a thread-safe build */
  if (w->slow_s > 0 && w->pending.meta.step >= w->slow_from) {
    struct timespec ts = {(time_t)w->slow_s, (long)((w->slow_s - (double)(time_t)w->slow_s) * 1e9)};
    nanosleep(&ts, NULL);
  }
  w->failed = st_ckpt_save_write(&w->pending, w->hp, w->hm, w->hv) != 0;
  if (w->failed) snprintf(w->msg, sizeof w->msg, "%s", st_error_msg());
  atomic_store(&w->done, 1);
  return NULL;
}

/* Collective: finish the save in flight (every rank has one: saves are
 * collective). Joins this rank's writer first. */
static int finish_in_flight(trainer *tr) {
  struct st_ckpt_writer *w = tr->ckpt;
  if (w->thread_live) {
    pthread_join(w->thread, NULL);
    w->thread_live = 0;
  }
  w->in_flight = 0;
  snprintf(tr->phase, sizeof tr->phase, "the checkpoint of step %lld (not made latest)",
           (long long)w->pending.meta.step);
  int rc = st_ckpt_save_finish(&w->pending, tr->comm, w->failed ? w->msg : NULL);
  if (rc) st_error_code(ST_EXIT_ERROR); /* writing --out failed: README "Exit codes" */
  int code = st_trainer_agree(tr, rc != 0);
  if (!code && tr->comm->rank == 0) {
    printf("checkpoint: %s/ckpt/step_%08lld (latest)\n", tr->rc->out,
           (long long)w->pending.meta.step);
    prune_checkpoints(tr);
    fflush(stdout);
  }
  snprintf(tr->phase, sizeof tr->phase, "step %lld", (long long)tr->step);
  return code;
}

int st_trainer_ckpt_wait(trainer *tr) {
  if (!tr->ckpt || !tr->ckpt->in_flight) return 0;
  return finish_in_flight(tr);
}

int st_trainer_ckpt_writing(const trainer *tr) {
  return tr->ckpt && tr->ckpt->in_flight && !atomic_load(&tr->ckpt->done);
}

int st_trainer_ckpt_poll(trainer *tr, int any_writing) {
  if (!tr->ckpt || !tr->ckpt->in_flight || any_writing) return 0;
  return finish_in_flight(tr);
}

void st_trainer_ckpt_abandon(trainer *tr) {
  struct st_ckpt_writer *w = tr->ckpt;
  if (!w) return;
  if (w->thread_live) pthread_join(w->thread, NULL);
  w->thread_live = w->in_flight = 0;
}

void st_trainer_ckpt_free(trainer *tr) {
  struct st_ckpt_writer *w = tr->ckpt;
  if (!w) return;
  st_trainer_ckpt_abandon(tr);
  if (w->pinned) tr->ops->host_free(w->hp);
  else free(w->hp);
  free(w);
  tr->ckpt = NULL;
}

static void fill_meta(const trainer *tr, st_ckpt_meta *meta) {
  memset(meta, 0, sizeof *meta);
  meta->step = tr->step;
  meta->tokens_seen = tr->tokens_seen;
  meta->data_position = tr->dpos.pos * tr->rc->seq_len;
  meta->data_epoch = tr->dpos.epoch;
  meta->data_shards_json = tr->data_ident;
  meta->rng_state[0] = tr->rng.s[0];
  meta->rng_state[1] = tr->rng.s[1];
  meta->world_size = tr->comm->world;
  meta->zero_stage = tr->rc->zero_stage;
  meta->has_scaler = 1;
  meta->loss_scale = tr->scaler.scale;
  meta->scaler_clean_steps = tr->scaler.clean_steps;
  meta->scaler_hysteresis_left = tr->scaler.hysteresis_left;
  meta->skipped_steps = tr->scaler.skipped_steps;
  snprintf(meta->config_json, sizeof meta->config_json, "%s", tr->config_json);
  snprintf(meta->run_id, sizeof meta->run_id, "%s", tr->lock.run_id);
  meta->memory_plan_json = tr->plan_json;
  meta->memory_planned_bytes = tr->plan.total;
}

int st_trainer_save_checkpoint(trainer *tr, int wait) {
  struct st_ckpt_writer *w = tr->ckpt;
  int code = st_trainer_ckpt_wait(tr); /* the previous save first */
  if (code) return code;
  static st_ckpt_meta meta; /* 8 KiB of config: not on the stack */
  fill_meta(tr, &meta);
  /* An out-of-memory while saving stops before the step directory is
   * renamed, so latest stays the previous checkpoint. */
  snprintf(tr->phase, sizeof tr->phase, "the checkpoint of step %lld (not made latest)",
           (long long)tr->step);
  /* The file holds this rank's ZeRO partition whatever the stage, so the
   * layout on disk depends only on the rank count. */
  const int64_t off = tr->part.begin - tr->opt_part.begin;
  const size_t n = (size_t)(tr->part.end - tr->part.begin);
  const int async = w && w->on;
  /* A synchronous save with the optimizer offloaded writes the host state
   * where it lies: training waits for the save, so nothing changes it, and
   * a copy would need 12 more bytes of host memory per parameter, which the
   * host check never counted (a 6.2B model on a 128 GiB host was killed by
   * the kernel at its final save). */
  const int in_place = !async && tr->offload.on;
  /* calloc: fresh pages, zeroed by the kernel, so no slower than malloc */
  float *hp = async ? w->hp : in_place ? tr->master + off : calloc(n + 1, sizeof(float));
  float *hm = async ? w->hm : in_place ? tr->adam_m + off : calloc(n + 1, sizeof(float));
  float *hv = async ? w->hv : in_place ? tr->adam_v + off : calloc(n + 1, sizeof(float));
  int staged = hp && hm && hv;
  if (!staged)
    st_error_set("cannot allocate host memory to stage checkpoint step %lld", (long long)tr->step);
  code = st_trainer_agree(tr, !staged); /* collective: no rank enters the save alone */
  if (!code && staged && !in_place) {
    st_trainer_weights_to_host(tr, hp, tr->part.begin, tr->part.end);
    st_offload_state_get(&tr->offload, tr->ops, hm, tr->adam_m + off, n * sizeof(float));
    st_offload_state_get(&tr->offload, tr->ops, hv, tr->adam_v + off, n * sizeof(float));
  }
  if (!code && staged) code = refuse_nonfinite(tr, hp, hm, hv);
  static st_ckpt_pending sync_pending;
  st_ckpt_pending *pend = async ? &w->pending : &sync_pending;
  if (!code && staged &&
      st_ckpt_save_begin(tr->rc->out, tr->comm, &tr->model.tab, &tr->part, &meta, pend) != 0)
    code = st_error_exit_code();
  if (!code && staged && async) {
    w->in_flight = 1;
    w->failed = 0;
    atomic_store(&w->done, 0);
    if (pthread_create(&w->thread, NULL, writer_main, w) == 0) {
      w->thread_live = 1;
    } else { /* no thread: write it here, as a synchronous save */
      writer_main(w);
    }
    snprintf(tr->phase, sizeof tr->phase, "step %lld", (long long)tr->step);
    return wait ? st_trainer_ckpt_wait(tr) : 0;
  }
  if (!code && staged) {
    char msg[2048];
    const int bad = st_ckpt_save_write(pend, hp, hm, hv) != 0;
    if (bad) snprintf(msg, sizeof msg, "%s", st_error_msg());
    int rc = st_ckpt_save_finish(pend, tr->comm, bad ? msg : NULL);
    if (rc) st_error_code(ST_EXIT_ERROR); /* writing --out failed: README "Exit codes" */
    code = st_trainer_agree(tr, rc != 0);
    if (!code && tr->comm->rank == 0) {
      printf("checkpoint: %s/ckpt/step_%08lld (latest)\n", tr->rc->out, (long long)tr->step);
      prune_checkpoints(tr);
      fflush(stdout);
    }
  }
  if (!async && !in_place) {
    free(hp);
    free(hm);
    free(hv);
  }
  return code;
}
