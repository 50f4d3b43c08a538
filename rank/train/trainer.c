/* trainer.c - one rank's training job (see trainer.h).
 *
 * Step: zero grads -> for each micro-step: read this rank's sequences,
 * forward, backward (gradients accumulate in fp32) -> ZeRO reduction ->
 * global grad norm -> AdamW on this rank's partition -> all-gather params.
 * ZeRO 0 all-reduces whole gradients and every rank updates everything;
 * ZeRO 1 reduce-scatters, keeps Adam m and v for its 1/N partition only,
 * and all-gathers the updated parameters. ZeRO 2 reduces block by block
 * into the shard as backward goes. ZeRO 3 also keeps only its shard of the
 * block weights: each block is gathered into one of two buffers before its
 * forward and backward (the next block's gather overlapping this block's
 * compute), and after the step only the head tensors are gathered.
 */
#define _XOPEN_SOURCE 700
#include "rank/train/trainer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "io/checkpoint_dirs.h"
#ifdef SHARDTRAIN_HAVE_CUDA
#include "collectives/collectives_nccl.h"
#endif
#include "kernels/profile.h"
#include "launcher/signals.h"
#include "rank/train/dataloader.h"
#include "rank/optim/optimizer.h"
#include "rank/train/trainer_state.h"
#include "util/bytes.h"
#include "util/error.h"
#include "util/fsutil.h"

/* All ranks learn whether any failed; the lowest failing rank prints its
 * message once. Returns that rank's exit code, or 0 when none failed. */
int st_trainer_agree(trainer *tr, int failed) {
  st_comm *c = tr->comm;
  int v[2] = {failed ? c->world - c->rank : 0, 0};
  c->all_reduce_int_max(c, v, 1);
  if (!v[0]) return 0;
  int first = c->world - v[0];
  int code = failed ? st_error_exit_code() : 0;
  c->broadcast(c, &code, sizeof code, first);
  if (c->rank == first) {
    if (c->world > 1) fprintf(stderr, "shardtrain: error (rank %d): %s\n", c->rank, st_error_msg());
    else fprintf(stderr, "shardtrain: error: %s\n", st_error_msg());
    fflush(stderr);
  }
  return code ? code : ST_EXIT_ERROR;
}

/* Mean validation loss over the first val_seqs sequences of the validation
 * set (its shards in order, sequences in file order), spread round-robin
 * over ranks by micro-batch. ZeRO 3's forward gathers weights
 * collectively, so there every rank runs the same number of forwards: a
 * rank past the last micro-batch runs one sequence of token 0 that does
 * not count. */
/* The seed of LoRA's dropout masks for micro-step k of the step after
 * `step` on `rank`: splitmix64 (Steele et al. 2014) of the three. */
static uint64_t lora_mask_seed(uint64_t seed, int64_t step, int k, int rank) {
  uint64_t z = seed ^ 0x4C6F524144524F50ull;
  const uint64_t parts[3] = {(uint64_t)step, (uint64_t)k, (uint64_t)rank};
  for (int i = 0; i < 3; i++) {
    z += parts[i] * 0x9E3779B97F4A7C15ull + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
  }
  return z;
}

static int validate(trainer *tr, double *loss_out) {
  st_run_config *rc = tr->rc;
  const int T = rc->seq_len, B = rc->micro_batch;
  int64_t nseq = tr->val.total_seq;
  if (rc->val_seqs < nseq) nseq = rc->val_seqs;
  double acc[2] = {0, 0};
  int failed = 0;
  snprintf(tr->phase, sizeof tr->phase, "the validation after step %lld", (long long)tr->step);
  const int64_t nbatches = (nseq + B - 1) / B, W = tr->comm->world;
  const int lockstep = rc->zero_stage == 3;
  const int64_t rounds = lockstep ? (nbatches + W - 1) / W : 0;
  for (int64_t i = 0, j = tr->comm->rank; lockstep ? i < rounds : j < nbatches; i++, j += W) {
    int b = 1;
    const int real = j < nbatches && !failed;
    if (real) {
      b = (int)(nseq - j * B < B ? nseq - j * B : B);
      const st_data_pos at = {0, j * B};
      if (st_data_micro_batch(&tr->val, &tr->val_order, at, 0, 0, 1, b, T, rc->model.vocab_size,
                              tr->inp, tr->tgt, tr->scratch, NULL)) {
        failed = 1;
        if (!lockstep) break;
      }
    }
    if (!real || failed) {
      b = 1;
      memset(tr->inp, 0, (size_t)T * sizeof(int));
      memset(tr->tgt, 0, (size_t)T * sizeof(int));
    }
    tr->ops->to_device(tr->d_inp, tr->inp, (size_t)b * T * sizeof(int));
    tr->ops->to_device(tr->d_tgt, tr->tgt, (size_t)b * T * sizeof(int));
    tr->model.lora_dropout_on = 0; /* evaluation: no dropout */
    const double sum = st_model_forward(&tr->model, tr->d_inp, tr->d_tgt, b, T, 0.0f);
    if (real && !failed) {
      acc[0] += sum;
      acc[1] += (double)b * T;
    }
  }
  int code = st_trainer_agree(tr, failed);
  if (code) return code;
  tr->comm->all_reduce_double_sum(tr->comm, acc, 2);
  *loss_out = acc[1] > 0 ? acc[0] / acc[1] : 0.0;
  return 0;
}

/* ST_FAULT_OVERFLOW (rank/train/faults.h): an inf in this rank's reduced
 * gradients, as an fp16 overflow would leave. */
static void fault_overflow(trainer *tr, const void *g, st_dtype gdt) {
  if (tr->part.end <= tr->part.begin || !st_faults_overflow_at(&tr->faults, tr->step + 1)) return;
  const float inf = INFINITY;
  const uint16_t inf16 = 0x7f80; /* bf16 +inf */
  tr->ops->to_device((void *)g, gdt == ST_BF16 ? (const void *)&inf16 : (const void *)&inf,
                     st_dtype_size(gdt));
}

/* ST_FAULT_NAN_STEP (rank/train/faults.h): this rank's first fp32 weight becomes
 * NaN after the update, as a diverged run's would; the weights the save
 * stages (st_trainer_weights_to_host) are the ones poisoned. */
static void fault_nan(trainer *tr) {
  if (tr->part.end <= tr->part.begin ||
      !st_faults_nan_at(&tr->faults, tr->comm->rank, tr->step + 1))
    return;
  const float nan = NAN;
  st_trainer_master_put(tr, &nan, tr->part.begin, tr->part.begin + 1);
}

/* A gradient or parameter collective failed or its watchdog fired. The
 * peers may be stuck inside the same collective, so agreeing with them could
 * hang: say what happened here and now, and take the whole job down. */
static void collective_failed(trainer *tr) {
  fprintf(stderr, "shardtrain: error (rank %d): %s\n", tr->comm->rank, st_error_msg());
  fflush(stderr);
  fflush(stdout);
  st_run_lock_release(&tr->lock); /* MPI_Abort skips st_train's exit path */
  MPI_Abort(MPI_COMM_WORLD, ST_EXIT_COLLECTIVE);
}

/* Overlapped gradient reduction (ZeRO 1 and 2). As backward finishes a
 * range of gradients, its reduce-scatter starts on the communication stream
 * (tag = the hook's slot) while backward goes on, and each rank receives the
 * part inside its partition: ZeRO 1 (one reduction per step, during the last
 * micro-step's backward) straight into grad_shard; ZeRO 2 (every micro-step,
 * from the buckets) into recv[slot], added to grad_shard once that slot's
 * reduction has finished, in micro-step order, or with one micro-step a
 * step straight into grad_shard too (no recv buffers then). */
/* --step-timing: wait for the device (so work issued so far is charged to
 * the phase that issued it) and read the clock; without it, just the clock. */
static double tmark(trainer *tr) {
  if (tr->rc->step_timing) tr->ops->synchronize();
  return MPI_Wtime();
}

/* ST_TIMELINE: a GPU timestamp on the compute stream (kernels/cuda/timeline.h). */
static void gmark(trainer *tr, const char *label, int tag) {
  if (tr->ops->timeline_mark) tr->ops->timeline_mark(label, tag);
}

/* bucket_counts[r] = the elements of flat range [begin, end) in rank r's
 * partition; returns the first of them in this rank's (clipped to begin). */
static int64_t range_counts(trainer *tr, int64_t begin, int64_t end) {
  for (int r = 0; r < tr->dcomm->world; r++) {
    int64_t b, e;
    st_partition_range(&tr->part, r, &b, &e);
    b = b > begin ? b : begin;
    e = e < end ? e : end;
    tr->bucket_counts[r] = e > b ? (size_t)(e - b) : 0;
  }
  return begin > tr->part.begin ? begin : tr->part.begin;
}

/* The shard's elements from flat index lo (inside this rank's partition). */
static float *shard_f32(trainer *tr, int64_t lo) {
  return (float *)tr->grad_shard + (lo - tr->part.begin);
}
static uint16_t *shard_bf16(trainer *tr, int64_t lo) {
  return (uint16_t *)tr->grad_shard + (lo - tr->part.begin);
}

static void slot_finish(trainer *tr, int slot) {
  if (!tr->slot_busy[slot]) return;
  tr->slot_busy[slot] = 0;
  const double t0 = tmark(tr); /* what the wait adds beyond compute is exposed */
  if (tr->dcomm->wait(tr->dcomm, slot)) collective_failed(tr);
  tr->timing.comm += MPI_Wtime() - t0;
  if (!tr->recv[slot] || !tr->slot_mine[slot]) return;
  /* bf16: one micro-step a step, so each element arrives once: rounded,
   * not added */
  if (tr->grad_dtype == ST_BF16)
    tr->ops->f32_to_bf16(shard_bf16(tr, tr->slot_lo[slot]), tr->recv[slot],
                         (int64_t)tr->slot_mine[slot]);
  else
    tr->ops->accumulate_f32(shard_f32(tr, tr->slot_lo[slot]), tr->recv[slot],
                            (int64_t)tr->slot_mine[slot]);
}

/* Start the reduction of [begin, end) of the gradient vector (grads points
 * at begin) on tag `slot`; background: backward is still computing. */
static void reduce_range(trainer *tr, const float *grads, int64_t begin, int64_t end, int slot,
                         int background) {
  st_comm *d = tr->dcomm;
  slot_finish(tr, slot); /* the tag (and with ZeRO 2 its recv buffer) must be free */
  const int64_t lo = range_counts(tr, begin, end);
  const size_t mine = tr->bucket_counts[d->rank];
  /* A bf16 shard on one rank: the range is this rank's whole, rounded in
   * place of a reduction, in stream order (so its bucket is free at once) */
  if (tr->grad_dtype == ST_BF16 && d->world == 1) {
    if (mine) tr->ops->f32_to_bf16(shard_bf16(tr, lo), grads, (int64_t)mine);
    return;
  }
  /* ZeRO 2/3 with more than one micro-step (or a bf16 shard): a receive
   * buffer, added (rounded) to the shard when done; else the shard itself */
  float *recv = tr->recv[slot] ? tr->recv[slot]
                : mine         ? shard_f32(tr, lo)
                               : (float *)tr->grad_shard;
  if (d->world == 1 && recv == grads) return; /* one rank, in place: nothing to reduce */
  /* on GPUs this only enqueues; MPI ranks reduce here and now */
  const double t0 = tmark(tr);
  if (d->reduce_scatterv_sum_start(d, grads, tr->bucket_counts, recv, slot, background))
    collective_failed(tr);
  tr->timing.comm += MPI_Wtime() - t0;
  tr->slot_busy[slot] = 1;
  tr->slot_lo[slot] = lo;
  tr->slot_mine[slot] = mine;
}

static void finish_all(trainer *tr) {
  for (int s = 0; s < ST_COMM_TAG_GATHER; s++) slot_finish(tr, s);
}

/* ZeRO 3: start gathering flat range [begin, end) of the working weights
 * from every rank's shard into dst (end - begin elements) on `tag`. The
 * counts are read while the call issues, so bucket_counts is free after. */
static void gather_range(trainer *tr, int64_t begin, int64_t end, void *dst, int tag) {
  st_model *m = &tr->model;
  st_comm *d = tr->dcomm;
  const int64_t lo = range_counts(tr, begin, end);
  const void *send = tr->bucket_counts[d->rank]
                         ? (const char *)m->shard_params + (size_t)(lo - m->shard_begin) * m->es
                         : m->shard_params;
  const double t0 = tmark(tr);
  if (d->all_gatherv_start(d, send, tr->bucket_counts, dst, m->es, tag)) collective_failed(tr);
  tr->timing.comm += MPI_Wtime() - t0;
}

/* The model's st_weight_gather: block l from the shards into buf. */
static void block_gather_start(void *ctx, int l, void *buf, int slot) {
  trainer *tr = ctx;
  const st_model *m = &tr->model;
  const int64_t b0 = m->block_begin + (int64_t)l * m->block_numel;
  gmark(tr, "gather", l);
  gather_range(tr, b0, b0 + m->block_numel, buf, ST_COMM_TAG_GATHER + slot);
}

static void block_gather_wait(void *ctx, int slot) {
  trainer *tr = ctx;
  const double t0 = tmark(tr); /* what the wait adds beyond compute is exposed */
  if (tr->dcomm->wait(tr->dcomm, ST_COMM_TAG_GATHER + slot)) collective_failed(tr);
  tr->timing.comm += MPI_Wtime() - t0;
}

void st_trainer_bind_gather(trainer *tr) {
  tr->model.gather = (st_weight_gather){block_gather_start, block_gather_wait, tr};
}

/* ZeRO 3 after an update: the head tensors, whole on every rank, from the
 * shards that were updated ([0, block_begin) and [ln_f, total)); the blocks
 * wait for the next forward's gathers. */
static void gather_head(trainer *tr) {
  st_model *m = &tr->model;
  st_model_weights_settle(m);
  const int64_t lnf = m->block_begin + m->cfg.n_layer * m->block_numel;
  gather_range(tr, 0, m->block_begin, m->head_params, ST_COMM_TAG_GATHER);
  gather_range(tr, lnf, m->tab.total, (char *)m->head_params + (size_t)m->block_begin * m->es,
               ST_COMM_TAG_GATHER + 1);
  block_gather_wait(tr, 0);
  block_gather_wait(tr, 1);
  st_model_weights_changed(m);
}

static void grads_ready(void *ctx, const float *grads, int64_t begin, int64_t end, int slot) {
  trainer *tr = ctx;
  gmark(tr, "grads", slot);
  /* Slots 2 and 3 (the head's ranges) come last, when backward is done:
   * they may take every SM. */
  reduce_range(tr, grads, begin, end, slot, slot < 2);
}

/* Backward is about to zero slot's bucket for a new block. One rank's two
 * slots share one bucket (rank/model/model.h): both must be done with it. */
static void grads_reuse(void *ctx, int slot) {
  trainer *tr = ctx;
  if (slot < 2 && tr->model.bucket[0] == tr->model.bucket[1]) {
    slot_finish(tr, 0);
    slot_finish(tr, 1);
  } else {
    slot_finish(tr, slot);
  }
}

/* A rank whose data read failed still joins every reduction the others
 * make, with gradients that do not count (the step is abandoned after). */
static void join_range(void *ctx, int64_t begin, int64_t end, int slot) {
  trainer *tr = ctx;
  st_model *m = &tr->model;
  const float *src;
  if (!m->head_grads) src = m->grads + begin;
  else if (slot < 2) src = m->bucket[slot];
  else src = m->head_grads + (slot == 3 ? m->block_begin : 0);
  grads_ready(tr, src, begin, end, slot);
}

/* One optimizer step. Returns an exit code (0 = ok). */
static int train_step(trainer *tr, double *loss, double *norm, float *lr, int *skipped) {
  st_run_config *rc = tr->rc;
  st_comm *c = tr->comm;
  st_model *m = &tr->model;
  const int B = rc->micro_batch, T = rc->seq_len;
  const int64_t G = rc->global_batch, N = tr->train.total_seq;
  const st_data_pos pos = st_data_step_start(tr->dpos, G, N, tr->shuffle);
  tr->dcomm->step = tr->comm->step = tr->step + 1;
  snprintf(tr->phase, sizeof tr->phase, "step %lld", (long long)tr->step + 1);
  st_faults_step(&tr->faults, tr->ops, tr->comm->rank, tr->step + 1);
  tr->epoch = pos.epoch;
  const float dloss = tr->scaler.scale / (float)((double)rc->global_batch * T);
  memset(&tr->timing, 0, sizeof tr->timing);
  tr->data_wait = 0;
  const double t_step = tmark(tr);
  gmark(tr, "step", 0);
  double t0;
  double loss_sum = 0.0;
  int failed = 0, done = 0; /* done: micro-steps completed */
  const int zero2 = rc->zero_stage >= 2; /* gradients in buckets, reduced every micro-step */
  const int zero3 = rc->zero_stage == 3;
  if (zero2)
    tr->ops->zero(tr->grad_shard, (size_t)tr->part.shard * st_dtype_size(tr->grad_dtype));
  else st_model_zero_grad(m);
  for (int k = 0; k < tr->accum; k++) {
    t0 = tmark(tr);
    double wait = 0;
    const int got = st_data_feed_get(tr->feed, pos, k, (int)(tr->step + 1), tr->inp, tr->tgt,
                                     &wait);
    tr->data_wait += wait;
    if (got || failed) {
      failed = 1;
      /* ZeRO 3's forward and backward gather weights collectively: a rank
       * whose read failed still runs them, on token 0, so that it joins
       * every gather and reduction the others make (the step is abandoned
       * after). */
      if (!zero3) break;
      memset(tr->inp, 0, (size_t)B * T * sizeof(int));
      memset(tr->tgt, 0, (size_t)B * T * sizeof(int));
    }
    /* the next micro-batch is read while this one computes */
    if (k + 1 < tr->accum) st_data_feed_post(tr->feed, pos, k + 1);
    else st_data_feed_post(tr->feed, st_data_step_start(st_data_advance(pos, G, N), G, N,
                                                        tr->shuffle), 0);
    tr->ops->to_device(tr->d_inp, tr->inp, (size_t)B * T * sizeof(int));
    tr->ops->to_device(tr->d_tgt, tr->tgt, (size_t)B * T * sizeof(int));
    tr->timing.data += tmark(tr) - t0;
    /* ZeRO 2 reduces the head gradients every micro-step, so they hold one
     * micro-step's worth; zeroed before the forward, which accumulates the
     * LM head's weight gradient (st_model_forward). */
    if (zero2) st_model_zero_grad(m);
    /* LoRA dropout: masks from (seed, step, micro-step, rank) alone, so a
     * resumed run draws the masks the uninterrupted one would have */
    m->lora_dropout_on = 1;
    m->lora_seed = lora_mask_seed(rc->seed, tr->step, k, tr->comm->rank);
    gmark(tr, "fwd", k); /* fwd .. bwd: the forward and the LM head's backward */
    loss_sum += st_model_forward(m, tr->d_inp, tr->d_tgt, B, T, dloss);
    gmark(tr, "bwd", k);
    const st_grad_hooks hooks = {grads_ready, grads_reuse, tr};
    if (zero2) {
      st_model_backward_hooked(m, tr->d_inp, B, T, &hooks);
      finish_all(tr);
    } else if (rc->zero_stage == 1 && k == tr->accum - 1) {
      st_model_backward_hooked(m, tr->d_inp, B, T, &hooks); /* reduce while computing */
      finish_all(tr);
    } else {
      st_model_backward(m, tr->d_inp, B, T);
    }
    gmark(tr, "bwd_end", k);
    if (!failed) done++;
  }
  /* A failed read: the other ranks reduce ranges this rank never produced,
   * so it joins them (ZeRO 2: every remaining micro-step, with zeros; ZeRO 1:
   * once, as the last micro-step would have). */
  if (failed && zero2 && !zero3) {
    st_model_zero_grad(m);
    for (int i = 0; i < 2; i++) tr->ops->zero(m->bucket[i], (size_t)m->block_numel * sizeof(float));
    for (int k = done; k < tr->accum; k++) {
      st_model_grad_ranges(m, join_range, tr);
      finish_all(tr);
    }
  } else if (failed && rc->zero_stage == 1) {
    st_model_grad_ranges(m, join_range, tr);
    finish_all(tr);
  }
  /* No agreement here: a rank that failed to read still joins the gradient
   * collective, so the first thing a rank waits on each step is a collective
   * under the NCCL watchdog, and the failure is agreed on just after it. */
  const void *g;
  const st_dtype gdt = tr->grad_dtype; /* fp32 but for ZeRO 2/3's bf16 shard */
  if (zero2) {
    g = tr->grad_shard; /* reduced bucket by bucket during backward */
  } else if (rc->zero_stage == 0) {
    t0 = tmark(tr);
    if (tr->dcomm->all_reduce_sum(tr->dcomm, m->grads, (size_t)m->padded_total))
      collective_failed(tr);
    tr->timing.comm += tmark(tr) - t0;
    g = m->grads + tr->part.begin;
  } else {
    g = tr->grad_shard; /* reduced block by block during the last backward */
  }
  fault_overflow(tr, g, gdt);
  const double t_opt = tmark(tr);
  gmark(tr, "norm", 0);
  /* Global norm from each rank's partition: the same arithmetic at ZeRO 0
   * and 1, so the two stages agree closely. Non-finite under fp16 means the
   * loss scale overflowed: the scaler skips the step and backs off. */
  double red[3] = {m->ops->sum_squares(g, gdt, tr->part.end - tr->part.begin), loss_sum, failed};
  c->all_reduce_double_sum(c, red, 3);
  if (red[2] > 0) return st_trainer_agree(tr, failed);
  const float loss_scale = tr->scaler.scale;
  *norm = sqrt(red[0]) / loss_scale;
  *loss = red[1] / ((double)rc->global_batch * T);
  *lr = st_lr_at(&rc->optim, tr->step);
  const int skip = st_loss_scaler_update(&tr->scaler, !isfinite(red[0]));
  const float clip = st_clip_scale(&rc->optim, *norm);
  const int dumped = st_trainer_dump_grads(tr, g, gdt, *norm, clip, loss_scale, skip);
  if (dumped) return dumped;
  if (skip) {
    *skipped = 1;
  } else {
    float scale = clip / loss_scale;
    int64_t t = tr->step + 1 - tr->scaler.skipped_steps; /* Adam's count of real updates */
    const int64_t b = tr->opt_part.begin, e = tr->opt_part.end;
    /* the working weights of [b, e): in the whole vector, or ZeRO 3's shard */
    char *work_b = zero3 ? (char *)m->shard_params + (size_t)(b - m->shard_begin) * m->es
                         : (char *)m->params + (size_t)b * m->es;
    float *master = tr->master ? tr->master : (float *)work_b;
    void *work = tr->master ? work_b : NULL;
    /* ZeRO 0: the whole vector (b = 0), all-reduced; else the reduced shard */
    const void *grads = rc->zero_stage == 0 ? (const void *)(m->grads + b) : tr->grad_shard;
    gmark(tr, "adamw", 0);
    if (tr->offload.on) /* on the host, chunk by chunk (rank/optim/offload.h) */
      st_offload_step(&tr->offload, m->ops, &m->tab, &rc->optim, *lr, scale, t, grads, gdt,
                      work_b, b, e);
    else if (tr->master_lo) /* bf16: the master is the working weights and their rests */
      st_adamw_range_split(m->ops, &m->tab, &rc->optim, *lr, scale, t, tr->master_lo,
                           (uint16_t *)work_b, grads, gdt, tr->adam_m, tr->adam_v, b, e);
    else
      st_adamw_range(m->ops, &m->tab, &rc->optim, *lr, scale, t, master, work, m->es, grads,
                     gdt, tr->adam_m, tr->adam_v, b, e);
    if (zero3) { /* no whole-vector gather: the next forward gathers each block */
      gmark(tr, "adamw_end", 0);
      t0 = tmark(tr);
      tr->timing.optimizer += t0 - t_opt;
      gather_head(tr);
    } else if (rc->zero_stage >= 1) {
      gmark(tr, "adamw_end", 0);
      t0 = tmark(tr);
      tr->timing.optimizer += t0 - t_opt;
      void *mine = (char *)m->params + (size_t)c->rank * tr->part.shard * m->es;
      if (tr->dcomm->all_gather(tr->dcomm, mine, m->params, (size_t)tr->part.shard, m->es))
        collective_failed(tr);
      tr->timing.comm += tmark(tr) - t0;
    }
  }
  if (tr->timing.optimizer == 0) tr->timing.optimizer = tmark(tr) - t_opt;
  tr->timing.total = tmark(tr) - t_step;
  gmark(tr, "end", 0);
  if (tr->ops->timeline_step_end) tr->ops->timeline_step_end(tr->step + 1, c->rank);
  tr->timing.compute =
      tr->timing.total - tr->timing.data - tr->timing.comm - tr->timing.optimizer;
  fault_nan(tr);
  tr->dpos = tr->shuffle ? st_data_advance(pos, G, N) : (st_data_pos){pos.epoch, pos.pos + G};
  tr->tokens_seen += tr->step_tokens;
  tr->step++;
  return 0;
}

static void fmt_time(double s, char *buf, size_t cap) {
  long t = (long)(s + 0.5);
  if (t >= 3600) snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

/* Memory fields of a sampled step (docs/memory.md, "Monitoring"): rank 0's
 * readings and the maximum over ranks; only what could be read. */
static void log_memory(trainer *tr, int epoch_end) {
  const st_mem_sample *m = &tr->sample;
  const double kib = 1024.0;
  FILE *f = tr->metrics;
  if (epoch_end) fprintf(f, ",\"epoch_end\":true");
  if (m->rss_bytes)
    fprintf(f, ",\"rss_bytes\":%llu,\"rss_max_bytes\":%.0f", (unsigned long long)m->rss_bytes,
            tr->sample_max[0] * kib);
  if (m->have_cuda)
    fprintf(f, ",\"cuda_mem_used_bytes\":%llu,\"cuda_mem_used_max_bytes\":%.0f,"
            "\"cuda_mem_total_bytes\":%llu", (unsigned long long)m->cuda_used_bytes,
            tr->sample_max[1] * kib, (unsigned long long)m->cuda_total_bytes);
  if (m->have_nvml) {
    fprintf(f, ",\"gpu_mem_used_bytes\":%llu,\"gpu_mem_used_max_bytes\":%.0f,"
            "\"gpu_mem_total_bytes\":%llu", (unsigned long long)m->gpu_used_bytes,
            tr->sample_max[2] * kib, (unsigned long long)m->gpu_total_bytes);
    if (m->gpu_util_pct >= 0) fprintf(f, ",\"gpu_util_pct\":%d", m->gpu_util_pct);
    if (m->gpu_temp_c >= 0)
      fprintf(f, ",\"gpu_temp_c\":%d,\"gpu_temp_max_c\":%d", m->gpu_temp_c, tr->sample_max[3]);
  }
}

/* The step this run stops at: --stop-after's when it comes before --steps. */
static int64_t stop_step(const st_run_config *rc) {
  return rc->stop_after > 0 && rc->stop_after < rc->steps ? rc->stop_after : rc->steps;
}

static void log_step(trainer *tr, double loss, double norm, float lr, int skipped, double dt,
                     int sampled, int epoch_end) {
  if (tr->comm->rank != 0) return;
  double el = MPI_Wtime() - tr->t_start;
  double tps = tr->step_tokens / dt;
  const int64_t end = stop_step(tr->rc); /* the ETA is to where this run stops */
  const int64_t left = end > tr->step ? end - tr->step : 0;
  char e1[32], e2[32];
  fmt_time(el, e1, sizeof e1);
  fmt_time(left * dt, e2, sizeof e2);
  const st_loss_scaler *ls = &tr->scaler;
  if (skipped || tr->step % tr->rc->log_every == 0 || tr->step == tr->rc->steps ||
      tr->step == 1) {
    printf("step %6lld/%lld | loss %.4f | lr %.2e | norm %.3f | %.1fk tok/s | %s elapsed | "
           "ETA %s", (long long)tr->step, (long long)tr->rc->steps, loss, lr, norm, tps / 1e3,
           e1, e2);
    if (ls->enabled) printf(" | loss scale %g", ls->scale);
    if (skipped && ls->enabled)
      printf(" | skipped: gradients overflowed (inf/nan), loss scale now %g", ls->scale);
    else if (skipped)
      printf(" | skipped: gradients are not finite (inf/nan); weights left unchanged");
    printf("\n");
    fflush(stdout);
  }
  if (tr->metrics) {
    char nb[32];
    if (isfinite(norm)) snprintf(nb, sizeof nb, "%.9g", norm);
    else snprintf(nb, sizeof nb, "null"); /* JSON has no inf */
    fprintf(tr->metrics,
            "{\"step\":%lld,\"loss\":%.9g,\"lr\":%.9g,\"grad_norm\":%s,\"tokens_per_s\":%.1f,"
            "\"tokens_seen\":%lld,\"epoch\":%lld,\"elapsed_s\":%.3f,\"data_wait_ms\":%.3f",
            (long long)tr->step, loss, lr, nb, tps, (long long)tr->tokens_seen,
            (long long)tr->epoch, el, 1e3 * tr->data_wait);
    if (tr->rc->step_timing)
      fprintf(tr->metrics,
              ",\"t_data_ms\":%.3f,\"t_compute_ms\":%.3f,\"t_comm_ms\":%.3f,"
              "\"t_optimizer_ms\":%.3f,\"t_step_ms\":%.3f", 1e3 * tr->timing.data,
              1e3 * tr->timing.compute, 1e3 * tr->timing.comm, 1e3 * tr->timing.optimizer,
              1e3 * tr->timing.total);
    if (ls->enabled || skipped)
      fprintf(tr->metrics, ",\"loss_scale\":%g,\"skipped\":%d,\"skipped_steps\":%lld", ls->scale,
              skipped, (long long)ls->skipped_steps);
    if (sampled) log_memory(tr, epoch_end);
    fprintf(tr->metrics, "}\n");
    fflush(tr->metrics);
  }
}

static int run_validation(trainer *tr) {
  /* --val-seqs 0 asks for none: a mean over no tokens is not a loss */
  if (!tr->val.n || tr->rc->val_seqs == 0) return 0;
  double vl;
  int code = validate(tr, &vl);
  if (code) return code;
  tr->val_loss = vl;
  tr->validated = 1;
  tr->val_step = tr->step;
  if (tr->comm->rank == 0) {
    printf("val    step %lld | val loss %.4f\n", (long long)tr->step, vl);
    fflush(stdout);
    if (tr->metrics) {
      fprintf(tr->metrics, "{\"step\":%lld,\"val_loss\":%.9g}\n", (long long)tr->step, vl);
      fflush(tr->metrics);
    }
  }
  return 0;
}

/* --dump-params: the final fp32 weights, whole, as raw float32 from rank 0.
 * Each rank contributes its partition (the master copy in mixed precision
 * holds only that at ZeRO >= 1), gathered on the host. Collective. */
static int dump_params(trainer *tr) {
  if (!tr->rc->dump_params[0]) return 0;
  st_comm *c = tr->comm;
  const size_t shard = (size_t)tr->part.shard;
  float *host = calloc(shard * (size_t)c->world + 1, sizeof(float));
  int failed = host == NULL;
  if (c->all_reduce_int_max(c, &failed, 1) || failed) {
    free(host);
    return st_error_set("--dump-params %s: cannot allocate host memory", tr->rc->dump_params);
  }
  st_trainer_weights_to_host(tr, host + tr->part.begin, tr->part.begin, tr->part.end);
  int rc = c->all_gather(c, host + (size_t)c->rank * shard, host, shard, sizeof(float));
  if (!rc && c->rank == 0) {
    FILE *f = fopen(tr->rc->dump_params, "wb");
    size_t n = (size_t)tr->model.tab.total;
    int ok = f && fwrite(host, sizeof(float), n, f) == n;
    if (f) ok &= fclose(f) == 0;
    if (!ok) rc = st_error_set("--dump-params %s: %s", tr->rc->dump_params, strerror(errno));
  }
  free(host);
  return rc;
}

static int alloc_agree(trainer *tr);

/* At a step boundary, in one tiny all-reduce: did any rank allocate after
 * setup (then stop, naming it), and did any get SIGUSR1/SIGTERM (then all
 * checkpoint, unless this step was just saved, and stop with
 * ST_EXIT_PREEMPTED). */
static int step_boundary(trainer *tr, int64_t last_ckpt) {
  int v[3] = {tr->alloc_msg[0] != 0, st_signals_pending(), st_trainer_ckpt_writing(tr)};
  tr->comm->all_reduce_int_max(tr->comm, v, 3);
  if (v[0]) return alloc_agree(tr); /* rare: a second collective picks the message */
  /* an asynchronous save whose every rank file is written: finish it now,
   * so latest moves as soon as it can (rank/train/ckpt_save.c) */
  int code = st_trainer_ckpt_poll(tr, v[2]);
  if (code) return code;
  const int sig = v[1];
  if (!sig) return 0;
  code = tr->step != last_ckpt ? st_trainer_save_checkpoint(tr, 1) : st_trainer_ckpt_wait(tr);
  if (code) return code;
  if (tr->comm->rank == 0) {
    printf("preempted: %s received; checkpoint of step %lld is latest; exiting with code %d "
           "so the job is requeued (resume with --resume auto)\n",
           sig == SIGTERM ? "SIGTERM" : "SIGUSR1", (long long)tr->step, ST_EXIT_PREEMPTED);
    fflush(stdout);
  }
  return ST_EXIT_PREEMPTED;
}

/* Nothing is allocated after setup (docs/memory.md): the backend's
 * allocation count must stay where setup left it. Local; the first
 * offender is kept in tr->alloc_msg until alloc_agree. */
static void alloc_note(trainer *tr, const char *during) {
  const char *last = "";
  int64_t n = tr->ops->allocations(&last);
  if (n == tr->allocs_setup || tr->alloc_msg[0]) return;
  snprintf(tr->alloc_msg, sizeof tr->alloc_msg,
           "internal error: the %s backend allocated memory after setup, during %s (%lld "
           "allocation(s), the latest: %s). Every buffer must be planned and allocated at "
           "setup (docs/memory.md, \"Checks\"); please report this", tr->ops->name, during,
           (long long)(n - tr->allocs_setup), last);
}

/* Collective: every rank learns whether any allocated after setup. */
static int alloc_agree(trainer *tr) {
  if (tr->alloc_msg[0]) {
    st_error_code(ST_EXIT_ERROR);
    st_error_set("%s", tr->alloc_msg);
  }
  return st_trainer_agree(tr, tr->alloc_msg[0] != 0);
}

/* Read memory on every rank, take the maximum over ranks, and warn (each
 * rank for itself, once per crossing) when use passes --mem-warn-fraction.
 * Collective: every rank samples at the same steps. */
static void monitor_sample(trainer *tr) {
  st_mem_sample *m = &tr->sample;
  st_gpu_monitor_sample(&tr->mon, m);
  int *mx = tr->sample_max;
  mx[0] = (int)(m->rss_bytes >> 10);
  mx[1] = (int)(m->cuda_used_bytes >> 10);
  mx[2] = (int)(m->gpu_used_bytes >> 10);
  mx[3] = m->gpu_temp_c;
  tr->comm->all_reduce_int_max(tr->comm, mx, 4);
  const float limit = tr->rc->mem_warn_fraction;
  uint64_t used, total;
  const char *what;
  if (limit <= 0 || !st_mem_sample_usage(m, tr->gpu_mem_held, &used, &total, &what)) return;
  const int over = (double)used > limit * (double)total;
  if (over && !tr->mem_over) {
    char a[32], b[32], c[32];
    fprintf(stderr, "shardtrain: warning (rank %d): %s in use is %s of %s (%.1f%%) after step "
            "%lld, above --mem-warn-fraction %g; the plan was %s per rank (docs/memory.md, "
            "\"Monitoring\")\n", tr->comm->rank, what, st_format_bytes(used, a, sizeof a),
            st_format_bytes(total, b, sizeof b), 100.0 * (double)used / (double)total,
            (long long)tr->step, limit, st_format_bytes(tr->plan.total, c, sizeof c));
    fflush(stderr);
  }
  tr->mem_over = over;
}

static int train_loop(trainer *tr) {
  st_run_config *rc = tr->rc;
  int code = 0;
  const int64_t stop = stop_step(rc);
  int64_t last_ckpt = tr->step, prof_from = tr->step + 2; /* ST_PROFILE_OPS: skip 2 warmup steps */
  double prof_wall = 0;
  while (tr->step < stop) {
    double t0 = MPI_Wtime(), loss = 0, norm = 0;
    float lr = 0;
    int skipped = 0;
    char during[64];
    if (tr->profile && tr->step == prof_from) st_ops_profile_reset();
    if ((code = train_step(tr, &loss, &norm, &lr, &skipped))) return code;
    snprintf(during, sizeof during, "step %lld", (long long)tr->step);
    alloc_note(tr, during);
    tr->last_loss = loss;
    tr->trained = 1;
    if (tr->profile && tr->step > prof_from) prof_wall += MPI_Wtime() - t0;
    const double dt = MPI_Wtime() - t0; /* the sample below is not the step's time */
    /* The last step of an epoch: in order, the next one would wrap to the
     * start; shuffled, this one read the epoch's last sequence. */
    const int64_t G = rc->global_batch, N = tr->train.total_seq;
    const int epoch_end =
        st_data_step_start(tr->dpos, G, N, tr->shuffle).epoch != tr->epoch;
    const int sampled = tr->step == 1 || tr->step % tr->stats_every == 0 || epoch_end ||
                        tr->step == stop;
    if (sampled) monitor_sample(tr);
    log_step(tr, loss, norm, lr, skipped, dt, sampled, epoch_end);
    if (rc->val_every > 0 && tr->step % rc->val_every == 0 && tr->step < rc->steps) {
      if ((code = run_validation(tr))) return code;
      snprintf(during, sizeof during, "the validation after step %lld", (long long)tr->step);
      alloc_note(tr, during);
    }
    if (rc->ckpt_every > 0 && tr->step % rc->ckpt_every == 0) {
      if ((code = st_trainer_save_checkpoint(tr, 0))) return code;
      last_ckpt = tr->step;
      snprintf(during, sizeof during, "the checkpoint of step %lld", (long long)tr->step);
      alloc_note(tr, during);
    }
    if ((code = step_boundary(tr, last_ckpt))) return code;
  }
  if (tr->profile && tr->comm->rank == 0 && tr->step > prof_from) {
    st_ops_profile_report(stdout, (int)(tr->step - prof_from), prof_wall);
    fflush(stdout);
  }
  if (!tr->trained) {
    if (tr->comm->rank == 0 && stop == rc->stop_after)
      printf("nothing to train: --stop-after %d is at or below the checkpoint's step %lld "
             "(raise --stop-after above %lld, or drop it to train to --steps %lld)\n",
             rc->stop_after, (long long)tr->step, (long long)tr->step, (long long)rc->steps);
    else if (tr->comm->rank == 0)
      printf("nothing to train: the checkpoint is at step %lld and training stops at step %lld "
             "(raise --steps to continue)\n", (long long)tr->step, (long long)stop);
    return st_trainer_agree(tr, dump_params(tr) != 0);
  }
  if (tr->step == rc->steps && (code = run_validation(tr))) return code;
  alloc_note(tr, "the final validation");
  if (tr->step != last_ckpt && (code = st_trainer_save_checkpoint(tr, 1))) return code;
  if ((code = st_trainer_ckpt_wait(tr))) return code;
  alloc_note(tr, "the final checkpoint");
  if ((code = alloc_agree(tr))) return code;
  return st_trainer_agree(tr, dump_params(tr) != 0);
}

int st_train(st_run_config *rc, const st_env *env, st_comm *comm) {
  trainer tr;
  memset(&tr, 0, sizeof tr);
  tr.rc = rc;
  tr.env = env;
  tr.comm = comm;
  st_faults_read(&tr.faults);
  int code, resumed = 0;
  char from[1200] = "";
  if ((code = st_trainer_setup(&tr, &resumed, from, sizeof from))) goto done;
  st_gpu_monitor_open(&tr.mon, tr.device_index);
  tr.stats_every = rc->gpu_stats_every > 0 ? rc->gpu_stats_every : rc->log_every;
  if (comm->rank == 0) {
    char path[1100];
    snprintf(path, sizeof path, "%s/metrics.jsonl", rc->out);
    /* Always appended: a fresh start must not truncate what an earlier run
     * (of this directory, or whose checkpoints are gone) logged; each
     * invocation begins with its own memory_plan line. */
    tr.metrics = fopen(path, "a");
    if (tr.metrics && tr.plan_json) { /* this invocation's plan, before its steps */
      fprintf(tr.metrics, "{\"memory_plan\":%s", tr.plan_json);
      if (tr.auto_fit_json) fprintf(tr.metrics, ",\"auto_fit\":%s", tr.auto_fit_json);
      if (resumed && tr.resume_note.json) fprintf(tr.metrics, ",\"resume\":%s", tr.resume_note.json);
      cJSON *mon = cJSON_CreateObject();
      cJSON_AddStringToObject(mon, "source", tr.mon.source);
      cJSON_AddBoolToObject(mon, "nvml", tr.mon.have_nvml);
      cJSON_AddNumberToObject(mon, "every", tr.stats_every);
      char frac[32]; /* as typed: 0.9, not 0.899999976 */
      snprintf(frac, sizeof frac, "%.6g", rc->mem_warn_fraction);
      cJSON_AddNumberToObject(mon, "mem_warn_fraction", strtod(frac, NULL));
      /* the device readings below count it as used: say how much it is */
      if (tr.gpu_mem_held) cJSON_AddNumberToObject(mon, "held_bytes", (double)tr.gpu_mem_held);
      char *ms = cJSON_PrintUnformatted(mon);
      if (ms) fprintf(tr.metrics, ",\"monitor\":%s", ms);
      cJSON_free(ms);
      cJSON_Delete(mon);
      fprintf(tr.metrics, "}\n");
      fflush(tr.metrics);
    }
  }
  st_trainer_print_config(&tr, resumed, from);
  st_env_print_map(env, tr.device_index < 0 ? "cpu" : "cuda");
  fflush(stdout);
  tr.t_start = MPI_Wtime();
  code = train_loop(&tr);
  if (!code && comm->rank == 0) {
    double wall = MPI_Wtime() - tr.t_start;
    char tl[32] = "n/a", vl[64] = "n/a", tlj[32] = "null", vlj[32] = "null";
    if (tr.trained) {
      snprintf(tl, sizeof tl, "%.4f", tr.last_loss);
      snprintf(tlj, sizeof tlj, "%.9g", tr.last_loss);
    }
    if (tr.validated) {
      if (tr.val_step == tr.step) snprintf(vl, sizeof vl, "%.4f", tr.val_loss);
      else snprintf(vl, sizeof vl, "%.4f (at step %lld)", tr.val_loss, (long long)tr.val_step);
      snprintf(vlj, sizeof vlj, "%.9g", tr.val_loss);
    }
    printf("done: step %lld, train loss %s, val loss %s, %.1f s\n", (long long)tr.step, tl, vl,
           wall);
    if (rc->json)
      printf("{\"step\":%lld,\"train_loss\":%s,\"val_loss\":%s,\"wall_s\":%.3f,"
             "\"backend_allocations\":{\"setup\":%lld,\"after_setup\":%lld}}\n",
             (long long)tr.step, tlj, vlj, wall, (long long)tr.allocs_setup,
             (long long)(tr.ops->allocations(NULL) - tr.allocs_setup));
    fflush(stdout);
  }
done:
  st_trainer_ckpt_free(&tr); /* a writer still running finishes its file first */
  if (tr.metrics) fclose(tr.metrics);
  st_run_lock_release(&tr.lock); /* every exit st_train returns from: 0, errors, 75 */
  st_data_feed_close(tr.feed);
  st_shards_close(&tr.train);
  st_shards_close(&tr.val);
  st_data_order_free(&tr.val_order);
  free(tr.data_ident);
  if (tr.model.ops) st_model_free(&tr.model);
#ifdef SHARDTRAIN_HAVE_CUDA
  if (tr.dcomm == &tr.nccl) st_comm_nccl_free(&tr.nccl);
#endif
  if (tr.ops) {
    /* master, adam_m, adam_v: the offload's host buffers, or the backend's */
    if (tr.offload.on) st_offload_free(&tr.offload, tr.ops);
    else {
      tr.ops->free(tr.adam_m);
      tr.ops->free(tr.adam_v);
      tr.ops->free(tr.master); /* NULL for fp32 storage or a split master */
      tr.ops->free(tr.master_lo);
    }
    if (!tr.grad_shard_aliased) tr.ops->free(tr.grad_shard);
    for (int s = 0; s < ST_COMM_TAGS; s++) tr.ops->free(tr.recv[s]);
    tr.ops->free(tr.d_inp);
    tr.ops->free(tr.d_tgt);
    if (tr.arena_block) { /* the buffers above were carved from it: frees were no-ops */
      tr.ops->use_arena(NULL);
      tr.ops->free(tr.arena_block);
    }
  }
  st_oom_uninstall();
  free(tr.split_hi);
  free(tr.split_lo);
  free(tr.bucket_counts);
  free(tr.inp);
  free(tr.tgt);
  free(tr.scratch);
  free(tr.config_json);
  free(tr.plan_json);
  cJSON_free(tr.auto_fit_json);
  cJSON_free(tr.resume_note.json);
  st_gpu_monitor_close(&tr.mon);
  return code;
}
