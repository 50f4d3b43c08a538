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
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checkpoint_dirs.h"
#include "io/h5util.h"
#include "io/run_lock.h"
#include "util/error.h"
#include "util/fsutil.h"

#ifndef SHARDTRAIN_VERSION
#define SHARDTRAIN_VERSION "dev"
#endif

#define CKPT_CHUNK 65536 /* elements per chunk: 256 KiB, one checksum each */

static const char *const k_groups[3] = {"params", "adam_m", "adam_v"};

typedef struct {
  char ckpt[4096];  /* RUN/ckpt */
  char tmp[4096];   /* RUN/ckpt/.tmp_step_XXXXXXXX */
  char final[4096]; /* RUN/ckpt/step_XXXXXXXX */
  char name[32];    /* step_XXXXXXXX */
} save_paths;

/* ------------------------------------------------------------------------
 * Agreement: all ranks learn whether any failed, and the failing rank's
 * message, so that every rank can print something useful.
 * --------------------------------------------------------------------- */

static int agree(st_comm *c, int failed) {
  int who = failed ? c->rank + 1 : 0;
  if (c->all_reduce_int_max(c, &who, 1) != 0) return -1;
  if (who == 0) return 0;
  char msg[1536] = "";
  if (c->rank == who - 1) snprintf(msg, sizeof msg, "%s", st_error_msg());
  if (c->broadcast(c, msg, sizeof msg, who - 1) != 0) return -1;
  if (!failed) st_error_set("rank %d failed: %s", who - 1, msg);
  return -1;
}

/* ------------------------------------------------------------------------
 * Helpers
 * --------------------------------------------------------------------- */

/* "cannot DOING [DSET in] PATH: WHY"; a full disk or quota instead names
 * the file, the dataset (when dset is not NULL) and the fix. */
static int io_failed(int err, const char *doing, const char *path, const char *dset,
                     const char *why) {
  if (err == ENOSPC || err == EDQUOT)
    return st_error_set("%s writing %s%s%s: free space or choose another --out",
                        err == ENOSPC ? "no space left on device" : "disk quota exceeded",
                        dset ? dset : "", dset ? " in " : "", path);
  if (err == EFBIG)
    return st_error_set("file too large writing %s%s%s (past the file size limit, ulimit -f, "
                        "or the filesystem's): raise the limit or choose another --out",
                        dset ? dset : "", dset ? " in " : "", path);
  if (dset) return st_error_set("cannot %s %s in %s: %s", doing, dset, path, why);
  return st_error_set("cannot %s %s: %s", doing, path, why);
}

/* The same for a failed HDF5 call, right after it (reads HDF5's error stack). */
static int h5_failed(const char *doing, const char *path, const char *dset) {
  const char *why = st_h5_why();
  return io_failed(st_h5_errno(), doing, path, dset, why);
}

static int fsync_file(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return st_error_set("cannot open %s to sync it: %s", path, strerror(errno));
  int rc = fsync(fd), err = errno;
  close(fd);
  if (rc != 0) return io_failed(err, "sync to disk", path, NULL, strerror(err));
  return 0;
}

/* Intersection of tensor t with the flat range [b, e); 0 when empty. */
static int overlap(const st_tensor *t, int64_t b, int64_t e, int64_t *lo, int64_t *hi) {
  *lo = t->offset > b ? t->offset : b;
  *hi = t->offset + t->numel < e ? t->offset + t->numel : e;
  return *hi > *lo;
}

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

/* One 1-D, chunked, checksummed piece of a tensor: elements [lo, hi) of the
 * flat vector, i.e. [lo - offset, hi - offset) of the tensor. */
static int write_piece(hid_t grp, const st_tensor *t, int64_t lo, int64_t hi, const float *src) {
  hsize_t n = (hsize_t)(hi - lo), chunk = n < CKPT_CHUNK ? n : CKPT_CHUNK;
  hid_t space = H5Screate_simple(1, &n, NULL);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  hid_t d = -1;
  int rc = -1;
  if (space < 0 || dcpl < 0 || H5Pset_chunk(dcpl, 1, &chunk) < 0 || H5Pset_fletcher32(dcpl) < 0)
    goto out;
  d = H5Dcreate2(grp, t->name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  if (d < 0 || H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, src) < 0) goto out;
  if (st_h5_attr_put_i64(d, "tensor_begin", lo - t->offset) ||
      st_h5_attr_put_i64(d, "flat_begin", lo))
    goto out;
  /* Chunks still cached are written here, where a full disk is an error
   * of this call, and not inside H5Dclose (see st_h5_discard). */
  if (H5Dflush(d) < 0) goto out;
  rc = 0;
out:
  if (rc != 0) st_h5_discard(grp); /* so the closes below and the file's succeed */
  st_h5_close_dset(d);
  st_h5_close_plist(dcpl);
  st_h5_close_space(space);
  return rc;
}

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
      if (!overlap(t, part->begin, part->end, &lo, &hi)) continue;
      /* params is the full vector; the moments start at part->begin. */
      const float *base = g == 0 ? src[0] + lo : src[g] + (lo - part->begin);
      if (write_piece(grp, t, lo, hi, base) != 0) {
        char dset[ST_MAX_NAME + 16];
        snprintf(dset, sizeof dset, "/%s/%s", k_groups[g], t->name);
        h5_failed("write dataset", path, dset);
        H5Gclose(grp);
        return -1;
      }
    }
    H5Gclose(grp);
  }
  return 0;
}

/* Before the metadata flush: every byte the file will occupy (its address
 * space, which the flush fills in) reserved on disk, so a full disk is
 * reported here and never by H5Fflush (see st_h5_reserve). */
static int reserve_rest(hid_t f, const char *path) {
  hsize_t size = 0;
  if (H5Fget_filesize(f, &size) < 0) return h5_failed("read the size of", path, NULL);
  int err = st_h5_reserve(f, (uint64_t)size + 4096); /* a page of margin */
  return err ? io_failed(err, "reserve space for", path, NULL, strerror(err)) : 0;
}

static int write_rank_file(const save_paths *p, const st_param_table *tab,
                           const st_partition *part, const float *const src[3],
                           const st_ckpt_meta *meta) {
  char path[4200];
  snprintf(path, sizeof path, "%s/rank_%05d.h5", p->tmp, part->rank);
  hid_t fapl = st_h5_fapl();
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  st_h5_close_plist(fapl);
  if (f < 0) return h5_failed("create", path, NULL);
  int rc = 0;
  if (write_rank_attrs(f, part, meta) != 0) rc = h5_failed("write attributes of", path, NULL);
  if (rc == 0) rc = write_rank_tensors(f, path, tab, part, src);
  if (rc == 0) rc = reserve_rest(f, path);
  if (rc == 0 && H5Fflush(f, H5F_SCOPE_LOCAL) < 0) rc = h5_failed("flush", path, NULL);
  /* After a failure the close would flush again into the same full disk. */
  if (rc != 0) st_h5_discard(f);
  if (H5Fclose(f) < 0 && rc == 0) rc = h5_failed("close", path, NULL);
  st_h5_unreserve(path);
  if (rc == 0) rc = fsync_file(path);
  return rc;
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

/* A virtual dataset of t's full shape; each rank's piece (the whole 1-D
 * source dataset) maps onto the tensor elements it holds. File names are
 * relative, so the step directory can be renamed and copied. */
static int write_vds(hid_t grp, const char *gname, const st_tensor *t,
                     const st_partition *part) {
  hsize_t dims[2] = {(hsize_t)t->shape[0], (hsize_t)t->shape[1]};
  hid_t space = H5Screate_simple(t->ndim, dims, NULL);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  hid_t d = -1;
  int rc = -1;
  float fill = NAN; /* unmapped or unreadable source: NaN, never plausible zeros */
  if (space < 0 || dcpl < 0 || H5Pset_fill_value(dcpl, H5T_NATIVE_FLOAT, &fill) < 0) goto out;
  for (int r = 0; r < part->world; r++) {
    int64_t rb, re, lo, hi;
    st_partition_range(part, r, &rb, &re);
    if (!overlap(t, rb, re, &lo, &hi)) continue;
    char file[32], dset[ST_MAX_NAME + 16];
    snprintf(file, sizeof file, "rank_%05d.h5", r);
    snprintf(dset, sizeof dset, "/%s/%s", gname, t->name);
    hsize_t n = (hsize_t)(hi - lo);
    hid_t src = H5Screate_simple(1, &n, NULL);
    herr_t e = -1;
    if (src >= 0 && st_h5_select_flat(space, t->ndim, t->shape, lo - t->offset,
                                      hi - t->offset) == 0)
      e = H5Pset_virtual(dcpl, space, file, dset, src);
    st_h5_close_space(src);
    if (e < 0) goto out;
  }
  H5Sselect_all(space);
  d = H5Dcreate2(grp, t->name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  if (d >= 0) rc = 0;
out:
  st_h5_close_dset(d);
  st_h5_close_plist(dcpl);
  st_h5_close_space(space);
  return rc;
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
      if (write_vds(grp, k_groups[g], &tab->t[i], part) != 0) {
        char dset[ST_MAX_NAME + 16];
        snprintf(dset, sizeof dset, "/%s/%s", k_groups[g], tab->t[i].name);
        h5_failed("write virtual dataset", path, dset);
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
  hid_t fapl = st_h5_fapl();
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  st_h5_close_plist(fapl);
  if (f < 0) return h5_failed("create", path, NULL);
  int rc = 0;
  if (write_index_attrs(f, tab, part, meta) != 0) rc = h5_failed("write attributes of", path, NULL);
  if (rc == 0) rc = write_index_tensors(f, path, tab, part);
  if (rc == 0) rc = reserve_rest(f, path);
  if (rc == 0 && H5Fflush(f, H5F_SCOPE_LOCAL) < 0) rc = h5_failed("flush", path, NULL);
  if (rc != 0) st_h5_discard(f); /* as in write_rank_file */
  if (H5Fclose(f) < 0 && rc == 0) rc = h5_failed("close", path, NULL);
  st_h5_unreserve(path);
  if (rc == 0) rc = fsync_file(path);
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

int st_ckpt_save(const char *run_dir, st_comm *comm, const st_param_table *tab,
                 const st_partition *part, const float *params, const float *adam_m,
                 const float *adam_v, const st_ckpt_meta *meta) {
  save_paths p;
  const float *const src[3] = {params, adam_m, adam_v};
  st_h5_quiet();
  /* The writer's identity goes into every file (checkpoint.h, run_id);
   * without one from the caller, this save makes its own. */
  static st_ckpt_meta m; /* 8 KiB of config: not on the stack */
  m = *meta;
  if (!m.run_id[0] && comm->rank == 0) st_run_id_make(m.run_id);
  if (!meta->run_id[0] && comm->broadcast(comm, m.run_id, sizeof m.run_id, 0) != 0)
    return save_failed(&p, comm, 0, meta->step);
  meta = &m;
  int bad = make_paths(run_dir, meta->step, &p) != 0 || check_args(comm, tab, part, meta) != 0;
  int refused = 0;
  if (!bad && comm->rank == 0) {
    refused = refuse_complete(&p) != 0;
    bad = refused || make_tmp_dir(run_dir, &p) != 0;
  }
  if (agree(comm, bad) != 0) {
    /* every rank is here: tell them whether it was the refusal (exit 3) */
    if (comm->all_reduce_int_max(comm, &refused, 1) != 0) refused = 0;
    return save_failed_code(&p, comm, 0, meta->step, refused ? ST_EXIT_CHECKPOINT : ST_EXIT_ERROR);
  }

  bad = write_rank_file(&p, tab, part, src, meta) != 0;
  if (agree(comm, bad) != 0) return save_failed(&p, comm, 1, meta->step);

  bad = comm->rank == 0 && (check_rank_run_ids(&p, part->world, meta->run_id) != 0 ||
                            write_index(&p, tab, part, meta) != 0);
  if (agree(comm, bad) != 0) return save_failed(&p, comm, 1, meta->step);

  bad = comm->rank == 0 && publish(&p) != 0;
  if (agree(comm, bad) != 0) return save_failed(&p, comm, 1, meta->step);
  return comm->barrier(comm);
}
