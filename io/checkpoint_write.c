/* checkpoint_write.c - collective, crash-safe checkpoint save (checkpoint.h).
 *
 * The save runs in four stages separated by an agreement (every rank
 * learns whether any rank failed, and with which message):
 *
 *   1. rank 0 creates RUN/ckpt/.tmp_step_XXXXXXXX (removing a stale one),
 *      refusing when step_XXXXXXXX is already a complete checkpoint;
 *   2. every rank writes rank_NNNNN.h5 with its pieces of every tensor,
 *      flushes, closes and fsyncs it;
 *   3. rank 0 writes index.h5, whose virtual datasets stitch the pieces
 *      into whole tensors, and fsyncs the directory;
 *   4. rank 0 renames the directory to step_XXXXXXXX and only then
 *      replaces RUN/ckpt/latest atomically.
 *
 * A failure at any stage stops every rank before the next one, so `latest`
 * never names a step that some rank did not finish writing.
 */
#define _XOPEN_SOURCE 700
#include "io/checkpoint.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checkpoint_dirs.h"
#include "io/h5util.h"
#include "io/shard_io.h"
#include "io/run_lock.h"
#include "util/error.h"
#include "util/fsutil.h"

#ifndef SHARDTRAIN_VERSION
#define SHARDTRAIN_VERSION "dev"
#endif

static const char *const k_groups[3] = {"params", "adam_m", "adam_v"};

/* RUN/ckpt (ckpt), RUN/ckpt/.tmp_step_XXXXXXXX (tmp), RUN/ckpt/step_XXXXXXXX
 * (final) and step_XXXXXXXX (name): st_ckpt_pending's paths. */
typedef st_ckpt_pending save_paths;

/* ------------------------------------------------------------------------
 * Helpers
 * --------------------------------------------------------------------- */

static int make_paths(const char *run_dir, int64_t step, save_paths *p) {
  int n1 = snprintf(p->ckpt, sizeof p->ckpt, "%s/ckpt", run_dir);
  snprintf(p->name, sizeof p->name, "step_%08lld", (long long)step);
  int n2 = snprintf(p->tmp, sizeof p->tmp, "%s/.tmp_%s", p->ckpt, p->name);
  int n3 = snprintf(p->final, sizeof p->final, "%s/%s", p->ckpt, p->name);
  if (n1 >= (int)sizeof p->ckpt || n2 >= (int)sizeof p->tmp || n3 >= (int)sizeof p->final)
    return st_error_set("--out %s: path too long for a checkpoint directory", run_dir);
  return 0;
}

static int check_args(st_comm *comm, const st_param_table *tab, const st_partition *part,
                      const st_ckpt_meta *meta) {
  if (part->total != tab->total)
    return st_error_set("checkpoint save: partition covers %lld elements, model has %lld",
                        (long long)part->total, (long long)tab->total);
  if (part->world != comm->world || part->rank != comm->rank)
    return st_error_set("checkpoint save: partition is for rank %d of %d, communicator "
                        "is rank %d of %d", part->rank, part->world, comm->rank, comm->world);
  if (meta->step < 0)
    return st_error_set("checkpoint save: negative step %lld", (long long)meta->step);
  return 0;
}

/* ------------------------------------------------------------------------
 * Stage 1: the temporary directory (rank 0)
 * --------------------------------------------------------------------- */

/* A complete checkpoint is never written over (docs/checkpoints.md): not
 * by a run resumed from an earlier step, nor by another run in the same
 * directory. An incomplete one (no index.h5, a rank file missing) is
 * replaced, as publish() describes. */
static int refuse_complete(const save_paths *p) {
  char why[128];
  if (!st_is_dir(p->final) || !st_ckpt_step_complete(p->final, why, sizeof why)) return 0;
  return st_error_set("%s already holds a complete checkpoint, which is never overwritten; "
                      "move it away, resume from it (--resume auto), or choose a new --out",
                      p->final);
}

static int make_tmp_dir(const char *run_dir, const save_paths *p) {
  if (refuse_complete(p) != 0) return -1;
  if (st_mkdir_p(p->ckpt) == 0 && st_rm_rf(p->tmp) == 0) {
    if (mkdir(p->tmp, 0755) == 0) return 0;
    st_error_set("cannot create directory %s: %s", p->tmp, strerror(errno));
  }
  char why[2048];
  snprintf(why, sizeof why, "%s", st_error_msg());
  return st_error_set("%s; check that --out %s names a writable directory", why, run_dir);
}

/* ------------------------------------------------------------------------
 * Stage 2: this rank's file
 * --------------------------------------------------------------------- */

static int write_rank_attrs(hid_t f, const st_partition *part, const st_ckpt_meta *meta) {
  return st_h5_attr_put_int(f, "format_version", 1) || st_h5_attr_put_int(f, "rank", part->rank) ||
         st_h5_attr_put_int(f, "world_size", part->world) ||
         st_h5_attr_put_i64(f, "step", meta->step) ||
         st_h5_attr_put_i64(f, "partition_begin", part->begin) ||
         st_h5_attr_put_i64(f, "partition_end", part->end) ||
         st_h5_attr_put_str(f, "run_id", meta->run_id);
}

static int write_rank_tensors(hid_t f, const char *path, const st_param_table *tab,
                              const st_partition *part, const float *const src[3]) {
  for (int g = 0; g < 3; g++) {
    hid_t grp = H5Gcreate2(f, k_groups[g], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (grp < 0) return st_error_set("cannot create group /%s in %s: %s", k_groups[g], path,
                                     st_h5_why());
    for (int i = 0; i < tab->n; i++) {
      const st_tensor *t = &tab->t[i];
      int64_t lo, hi;
      if (!st_shard_overlap(t, part->begin, part->end, &lo, &hi)) continue;
      const float *base = src[g] + (lo - part->begin); /* each starts at part->begin */
      if (st_shard_write_piece(grp, t, lo, hi, base) != 0) {
        char dset[ST_MAX_NAME + 16];
        snprintf(dset, sizeof dset, "/%s/%s", k_groups[g], t->name);
        st_shard_h5_failed("write dataset", path, dset);
        H5Gclose(grp);
        return -1;
      }
    }
    H5Gclose(grp);
  }
  return 0;
}

static int write_rank_file(const save_paths *p, const st_param_table *tab,
                           const st_partition *part, const float *const src[3],
                           const st_ckpt_meta *meta) {
  char path[4200];
  snprintf(path, sizeof path, "%s/rank_%05d.h5", p->tmp, part->rank);
  hid_t f = st_shard_create_file(path);
  if (f < 0) return -1;
  int rc = 0;
  if (write_rank_attrs(f, part, meta) != 0)
    rc = st_shard_h5_failed("write attributes of", path, NULL);
  if (rc == 0) rc = write_rank_tensors(f, path, tab, part, src);
  return st_shard_finish_file(f, path, rc);
}

/* ------------------------------------------------------------------------
 * Stage 3: the index (rank 0)
 * --------------------------------------------------------------------- */

/* Every rank file in tmp carries this save's run_id: nothing another job
 * wrote into the same directory is indexed as ours. */
static int check_rank_run_ids(const save_paths *p, int world, const char *run_id) {
  for (int r = 0; r < world; r++) {
    char path[4200], got[40] = "";
    snprintf(path, sizeof path, "%s/rank_%05d.h5", p->tmp, r);
    hid_t fapl = st_h5_fapl();
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    st_h5_close_plist(fapl);
    if (f < 0) return st_error_set("cannot open %s to check it: %s", path, st_h5_why());
    int bad = st_h5_attr_get_str(f, "run_id", got, sizeof got) != 0 || strcmp(got, run_id) != 0;
    H5Fclose(f);
    if (bad)
      return st_error_set("%s has run_id %s, not this job's %s: another job is writing into "
                          "%s; start one job per run directory", path, got, run_id, p->ckpt);
  }
  return 0;
}

static int write_index_attrs(hid_t f, const st_param_table *tab, const st_partition *part,
                             const st_ckpt_meta *meta) {
  return st_h5_attr_put_int(f, "format_version", 1) ||
         st_h5_attr_put_str(f, "config", meta->config_json) ||
         st_h5_attr_put_i64(f, "step", meta->step) ||
         st_h5_attr_put_i64(f, "tokens_seen", meta->tokens_seen) ||
         st_h5_attr_put_i64(f, "data_position", meta->data_position) ||
         st_h5_attr_put_i64(f, "data_epoch", meta->data_epoch) ||
         st_h5_attr_put_u64s(f, "rng_state", meta->rng_state, 2) ||
         st_h5_attr_put_int(f, "world_size", meta->world_size) ||
         st_h5_attr_put_int(f, "zero_stage", meta->zero_stage) ||
         st_h5_attr_put_double(f, "loss_scale", meta->has_scaler ? meta->loss_scale : 1.0) ||
         st_h5_attr_put_i64(f, "loss_scale_clean_steps", meta->scaler_clean_steps) ||
         st_h5_attr_put_int(f, "loss_scale_hysteresis_left", meta->scaler_hysteresis_left) ||
         st_h5_attr_put_i64(f, "skipped_steps", meta->skipped_steps) ||
         st_h5_attr_put_str(f, "build_version", SHARDTRAIN_VERSION) ||
         st_h5_attr_put_int(f, "rank_files", part->world) ||
         st_h5_attr_put_i64(f, "total_elements", tab->total) ||
         st_h5_attr_put_int(f, "num_tensors", tab->n) ||
         st_h5_attr_put_str(f, "run_id", meta->run_id) ||
         (meta->memory_plan_json &&
          (st_h5_attr_put_str(f, "memory_plan", meta->memory_plan_json) ||
           st_h5_attr_put_i64(f, "memory_planned_bytes", (int64_t)meta->memory_planned_bytes))) ||
         /* a variable-length string lives in the global heap: no 64 KiB
          * attribute limit however many shards */
         (meta->data_shards_json && st_h5_attr_put_str(f, "data_shards", meta->data_shards_json));
}

static int write_index_tensors(hid_t f, const char *path, const st_param_table *tab,
                               const st_partition *part) {
  for (int g = 0; g < 3; g++) {
    hid_t grp = H5Gcreate2(f, k_groups[g], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (grp < 0) return st_error_set("cannot create group /%s in %s: %s", k_groups[g], path,
                                     st_h5_why());
    for (int i = 0; i < tab->n; i++) {
      if (st_shard_write_vds(grp, k_groups[g], &tab->t[i], part) != 0) {
        char dset[ST_MAX_NAME + 16];
        snprintf(dset, sizeof dset, "/%s/%s", k_groups[g], tab->t[i].name);
        st_shard_h5_failed("write virtual dataset", path, dset);
        H5Gclose(grp);
        return -1;
      }
    }
    H5Gclose(grp);
  }
  return 0;
}

static int write_index(const save_paths *p, const st_param_table *tab, const st_partition *part,
                       const st_ckpt_meta *meta) {
  char path[4200];
  snprintf(path, sizeof path, "%s/index.h5", p->tmp);
  hid_t f = st_shard_create_file(path);
  if (f < 0) return -1;
  int rc = 0;
  if (write_index_attrs(f, tab, part, meta) != 0)
    rc = st_shard_h5_failed("write attributes of", path, NULL);
  if (rc == 0) rc = write_index_tensors(f, path, tab, part);
  rc = st_shard_finish_file(f, path, rc);
  if (rc == 0) rc = st_fsync_dir(p->tmp);
  return rc;
}

/* ------------------------------------------------------------------------
 * Stage 4: publish (rank 0)
 * --------------------------------------------------------------------- */

/* Rename the finished directory into place, then point `latest` at it. An
 * incomplete step directory of the same name (a rank file lost, a save of
 * an older shardtrain cut short) is moved aside to .incomplete_step_X,
 * where it stays (nothing a user might still recover is deleted); a
 * complete one is refused (refuse_complete, checked again here: stage 1
 * ran long ago). */
static int publish(const save_paths *p) {
  char old[4200] = "", latest[4200], text[64];
  if (refuse_complete(p) != 0) return -1;
  if (st_path_exists(p->final)) {
    snprintf(old, sizeof old, "%s/.incomplete_%s", p->ckpt, p->name);
    if (st_rm_rf(old) != 0) return -1;
    if (rename(p->final, old) != 0)
      return st_error_set("cannot move old %s aside: %s", p->final, strerror(errno));
  }
  if (rename(p->tmp, p->final) != 0) {
    st_error_set("cannot rename %s to %s: %s", p->tmp, p->final, strerror(errno));
    if (old[0]) rename(old, p->final); /* put the previous copy back */
    return -1;
  }
  if (st_fsync_dir(p->ckpt) != 0) return -1;
  snprintf(latest, sizeof latest, "%s/latest", p->ckpt);
  snprintf(text, sizeof text, "%s\n", p->name);
  return st_write_file_atomic(latest, text);
}

/* ------------------------------------------------------------------------
 * The collective save
 * --------------------------------------------------------------------- */

/* One line: the cause first, then what the user still has. Exit code class
 * `code`: 1 for an I/O error writing --out (README "Exit codes"), 3 for a
 * refusal to overwrite a complete checkpoint. */
static int save_failed_code(const save_paths *p, st_comm *comm, int remove_tmp, int64_t step,
                            int code) {
  char msg[1536], latest[4200], name[256] = "";
  snprintf(msg, sizeof msg, "%s", st_error_msg());
  /* Every rank has passed the agreement, so no file in tmp is still open. */
  if (remove_tmp && comm->rank == 0) st_rm_rf(p->tmp);
  snprintf(latest, sizeof latest, "%s/latest", p->ckpt);
  if (st_path_exists(latest) && st_read_small_file(latest, name, sizeof name) != 0) name[0] = 0;
  if (name[0])
    st_error_set("%s; checkpoint step %lld was not saved and ckpt/latest still names %s", msg,
                 (long long)step, name);
  else
    st_error_set("%s; checkpoint step %lld was not saved (no earlier checkpoint)", msg,
                 (long long)step);
  st_error_code(code);
  return -1;
}

static int save_failed(const save_paths *p, st_comm *comm, int remove_tmp, int64_t step) {
  return save_failed_code(p, comm, remove_tmp, step, ST_EXIT_ERROR);
}

int st_ckpt_save_begin(const char *run_dir, st_comm *comm, const st_param_table *tab,
                       const st_partition *part, const st_ckpt_meta *meta, st_ckpt_pending *s) {
  st_h5_quiet();
  memset(s->ckpt, 0, sizeof s->ckpt);
  s->tmp[0] = s->final[0] = s->name[0] = 0;
  /* The writer's identity goes into every file (checkpoint.h, run_id);
   * without one from the caller, this save makes its own. */
  s->meta = *meta;
  s->tab = tab;
  s->part = *part;
  if (!s->meta.run_id[0] && comm->rank == 0) st_run_id_make(s->meta.run_id);
  if (!meta->run_id[0] && comm->broadcast(comm, s->meta.run_id, sizeof s->meta.run_id, 0) != 0)
    return save_failed(s, comm, 0, meta->step);
  int bad = make_paths(run_dir, meta->step, s) != 0 || check_args(comm, tab, part, meta) != 0;
  int refused = 0;
  if (!bad && comm->rank == 0) {
    refused = refuse_complete(s) != 0;
    bad = refused || make_tmp_dir(run_dir, s) != 0;
  }
  if (st_shard_agree(comm, bad) != 0) {
    /* every rank is here: tell them whether it was the refusal (exit 3) */
    if (comm->all_reduce_int_max(comm, &refused, 1) != 0) refused = 0;
    return save_failed_code(s, comm, 0, meta->step, refused ? ST_EXIT_CHECKPOINT : ST_EXIT_ERROR);
  }
  return 0;
}

int st_ckpt_save_write(const st_ckpt_pending *s, const float *params, const float *adam_m,
                       const float *adam_v) {
  const float *const src[3] = {params, adam_m, adam_v};
  return write_rank_file(s, s->tab, &s->part, src, &s->meta);
}

int st_ckpt_save_finish(st_ckpt_pending *s, st_comm *comm, const char *failed_msg) {
  if (failed_msg) st_error_set("%s", failed_msg);
  if (st_shard_agree(comm, failed_msg != NULL) != 0) return save_failed(s, comm, 1, s->meta.step);
  int bad = comm->rank == 0 && (check_rank_run_ids(s, s->part.world, s->meta.run_id) != 0 ||
                                write_index(s, s->tab, &s->part, &s->meta) != 0);
  if (st_shard_agree(comm, bad) != 0) return save_failed(s, comm, 1, s->meta.step);
  bad = comm->rank == 0 && publish(s) != 0;
  if (st_shard_agree(comm, bad) != 0) return save_failed(s, comm, 1, s->meta.step);
  return comm->barrier(comm);
}

int st_ckpt_save(const char *run_dir, st_comm *comm, const st_param_table *tab,
                 const st_partition *part, const float *params, const float *adam_m,
                 const float *adam_v, const st_ckpt_meta *meta) {
  static st_ckpt_pending s; /* 8 KiB of config and 12 KiB of paths: not on the stack */
  if (st_ckpt_save_begin(run_dir, comm, tab, part, meta, &s) != 0) return -1;
  char msg[2048];
  const int bad = st_ckpt_save_write(&s, params + part->begin, adam_m, adam_v) != 0;
  if (bad) snprintf(msg, sizeof msg, "%s", st_error_msg());
  return st_ckpt_save_finish(&s, comm, bad ? msg : NULL);
}
