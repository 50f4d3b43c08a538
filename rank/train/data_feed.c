/* data_feed.c - one-ahead prefetch of training micro-batches (see
 * data_feed.h). One request slot: the main thread posts the key of the
 * micro-batch it will want next, the thread reads it into its buffer, the
 * main thread's get copies it out when the key matches. */
#define _XOPEN_SOURCE 700
#include "rank/train/data_feed.h"

#include <hdf5.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/error.h"

enum { SLOT_EMPTY, SLOT_ASKED, SLOT_BUSY, SLOT_READY, SLOT_FAILED };

struct st_data_feed {
  st_shard_set *set;
  st_data_order main_ord, thread_ord; /* each thread its own epoch cache */
  int B, T, rank, world, vocab;
  int *scratch;                       /* main thread's T+1 */
  int64_t *ids;                       /* 2*B (shard, sequence) of the last get */
  FILE *trace;
  int threaded;                       /* 1: the prefetch thread runs */
  /* the slot, under mu */
  int stop, state;
  st_data_pos key_pos;
  int key_micro;
  int *buf_inp, *buf_tgt, *buf_scratch; /* the thread's */
  int64_t *buf_ids;
  int err_code;
  char err[1024];
  pthread_t th;
  pthread_mutex_t mu;
  pthread_cond_t cv;
};

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *reader(void *arg) {
  st_data_feed *f = arg;
  pthread_mutex_lock(&f->mu);
  for (;;) {
    while (!f->stop && f->state != SLOT_ASKED) pthread_cond_wait(&f->cv, &f->mu);
    if (f->stop) break;
    f->state = SLOT_BUSY;
    const st_data_pos pos = f->key_pos;
    const int micro = f->key_micro;
    pthread_mutex_unlock(&f->mu);
    int rc = st_data_micro_batch(f->set, &f->thread_ord, pos, micro, f->rank, f->world, f->B,
                                 f->T, f->vocab, f->buf_inp, f->buf_tgt, f->buf_scratch,
                                 f->buf_ids);
    pthread_mutex_lock(&f->mu);
    if (rc) { /* st_error is per thread: carried to the main thread's get */
      snprintf(f->err, sizeof f->err, "%s", st_error_msg());
      f->err_code = st_error_exit_code();
    }
    f->state = rc ? SLOT_FAILED : SLOT_READY;
    pthread_cond_broadcast(&f->cv);
  }
  pthread_mutex_unlock(&f->mu);
  return NULL;
}

static int any_hdf5(const st_shard_set *set) {
  for (int i = 0; i < set->n; i++)
    if (set->s[i].hdf5) return 1;
  return 0;
}

st_data_feed *st_data_feed_open(st_shard_set *set, uint64_t seed, int shuffle, int B, int T,
                                int rank, int world, int vocab_size) {
  st_data_feed *f = calloc(1, sizeof *f);
  if (!f) {
    st_error_set("out of memory for the data feed");
    return NULL;
  }
  pthread_mutex_init(&f->mu, NULL);
  pthread_cond_init(&f->cv, NULL);
  f->set = set;
  f->B = B;
  f->T = T;
  f->rank = rank;
  f->world = world;
  f->vocab = vocab_size;
  int64_t *nseq = malloc((size_t)set->n * sizeof *nseq);
  if (nseq)
    for (int i = 0; i < set->n; i++) nseq[i] = set->s[i].nseq;
  const size_t bt = (size_t)B * T;
  f->scratch = malloc((size_t)(T + 1) * sizeof(int));
  f->ids = malloc((size_t)2 * B * sizeof(int64_t));
  f->buf_inp = malloc(bt * sizeof(int));
  f->buf_tgt = malloc(bt * sizeof(int));
  f->buf_scratch = malloc((size_t)(T + 1) * sizeof(int));
  f->buf_ids = malloc((size_t)2 * B * sizeof(int64_t));
  int bad = !nseq || !f->scratch || !f->ids || !f->buf_inp || !f->buf_tgt || !f->buf_scratch ||
            !f->buf_ids;
  if (!bad) bad = st_data_order_init(&f->main_ord, set->n, nseq, seed, shuffle) != 0;
  if (!bad) bad = st_data_order_init(&f->thread_ord, set->n, nseq, seed, shuffle) != 0;
  free(nseq);
  if (bad) {
    st_error_set("out of memory for the data feed");
    st_data_feed_close(f);
    return NULL;
  }
  const char *trace = getenv("ST_DATA_TRACE");
  if (trace && trace[0]) {
    char p[1200];
    snprintf(p, sizeof p, "%s/rank_%d.txt", trace, rank);
    if (!(f->trace = fopen(p, "a"))) {
      st_error_set("ST_DATA_TRACE: cannot append to %s", p);
      st_data_feed_close(f);
      return NULL;
    }
  }
  const char *env = getenv("ST_DATA_PREFETCH");
  hbool_t safe = 0;
  H5is_library_threadsafe(&safe);
  const int want = !(env && strcmp(env, "0") == 0) && (safe || !any_hdf5(set));
  if (want) {
    if (pthread_create(&f->th, NULL, reader, f) != 0) {
      st_error_set("cannot start the data prefetch thread; set ST_DATA_PREFETCH=0");
      st_data_feed_close(f);
      return NULL;
    }
    f->threaded = 1;
  }
  return f;
}

int st_data_feed_threaded(const st_data_feed *f) { return f->threaded == 1; }

static int same_key(const st_data_feed *f, st_data_pos pos, int micro) {
  return f->key_pos.epoch == pos.epoch && f->key_pos.pos == pos.pos && f->key_micro == micro;
}

static void trace_ids(st_data_feed *f, int step, const int64_t *ids, st_data_pos start,
                      int micro) {
  if (!f->trace) return;
  const int64_t first = ((int64_t)micro * f->world + f->rank) * f->B;
  for (int b = 0; b < f->B; b++) {
    st_data_pos at = st_data_advance(start, first + b, f->main_ord.total);
    fprintf(f->trace, "%d %lld %lld %lld %lld\n", step, (long long)at.epoch,
            (long long)at.pos, (long long)ids[2 * b], (long long)ids[2 * b + 1]);
  }
  fflush(f->trace);
}

int st_data_feed_get(st_data_feed *f, st_data_pos start, int micro, int step, int *inp,
                     int *targets, double *wait_s) {
  const double t0 = now_s();
  const size_t bytes = (size_t)f->B * f->T * sizeof(int);
  int rc = 0, hit = 0;
  if (f->threaded == 1) {
    pthread_mutex_lock(&f->mu);
    const int asked = f->state != SLOT_EMPTY && same_key(f, start, micro);
    if (asked || f->state == SLOT_BUSY) /* a miss waits too: one reader at a time */
      while (f->state == SLOT_ASKED || f->state == SLOT_BUSY) pthread_cond_wait(&f->cv, &f->mu);
    if (asked && f->state == SLOT_READY) {
      memcpy(inp, f->buf_inp, bytes);
      memcpy(targets, f->buf_tgt, bytes);
      memcpy(f->ids, f->buf_ids, (size_t)2 * f->B * sizeof(int64_t));
      hit = 1;
    } else if (asked && f->state == SLOT_FAILED) {
      rc = st_error_setc(f->err_code, "%s", f->err);
      hit = 1;
    }
    f->state = SLOT_EMPTY;
    pthread_mutex_unlock(&f->mu);
  }
  if (!hit)
    rc = st_data_micro_batch(f->set, &f->main_ord, start, micro, f->rank, f->world, f->B, f->T,
                             f->vocab, inp, targets, f->scratch, f->ids);
  if (!rc) trace_ids(f, step, f->ids, start, micro);
  *wait_s = now_s() - t0;
  return rc;
}

void st_data_feed_post(st_data_feed *f, st_data_pos start, int micro) {
  if (f->threaded != 1) return;
  pthread_mutex_lock(&f->mu);
  while (f->state == SLOT_BUSY) pthread_cond_wait(&f->cv, &f->mu);
  f->key_pos = start;
  f->key_micro = micro;
  f->state = SLOT_ASKED;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
}

void st_data_feed_close(st_data_feed *f) {
  if (!f) return;
  if (f->threaded == 1) {
    pthread_mutex_lock(&f->mu);
    f->stop = 1;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    pthread_join(f->th, NULL);
  }
  pthread_mutex_destroy(&f->mu);
  pthread_cond_destroy(&f->cv);
  if (f->trace) fclose(f->trace);
  st_data_order_free(&f->main_ord);
  st_data_order_free(&f->thread_ord);
  free(f->scratch);
  free(f->ids);
  free(f->buf_inp);
  free(f->buf_tgt);
  free(f->buf_scratch);
  free(f->buf_ids);
  free(f);
}
