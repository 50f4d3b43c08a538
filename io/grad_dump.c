/* grad_dump.c - writing one gradient dump (grad_dump.h), collectively, in
 * the stages of a checkpoint save: rank 0 makes the temporary directory,
 * every rank writes and fsyncs its file, rank 0 writes the index, then
 * renames the directory into place; an agreement after each stage, so a
 * failure anywhere stops every rank before the next. */
#define _XOPEN_SOURCE 700
#include "io/grad_dump.h"

#include <errno.h>
#include <fnmatch.h>
#include <hdf5_hl.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/h5util.h"
#include "io/shard_io.h"
#include "util/error.h"
#include "util/fsutil.h"

#ifndef SHARDTRAIN_VERSION
#define SHARDTRAIN_VERSION "dev"
#endif

static const char *const k_groups[2] = {"grads", "grads_clipped"};

typedef struct {
  char root[4096];  /* RUN/grads */
  char tmp[4200];   /* RUN/grads/.tmp_step_XXXXXXXX */
  char final[4200]; /* RUN/grads/step_XXXXXXXX */
  char old[4200];   /* RUN/grads/.replaced_step_XXXXXXXX */
} dump_paths;

int st_grad_pattern_match(const char *pattern, const char *name) {
  if (!pattern || !pattern[0]) return 1;
  char buf[ST_GRAD_PATTERN_MAX];
  snprintf(buf, sizeof buf, "%s", pattern);
  char *save = NULL;
  for (char *g = strtok_r(buf, ",", &save); g; g = strtok_r(NULL, ",", &save))
    if (g[0] && fnmatch(g, name, 0) == 0) return 1;
  return 0;
}

static int make_paths(const char *run_dir, int64_t step, dump_paths *p) {
  int n = snprintf(p->root, sizeof p->root, "%s/grads", run_dir);
  if (n >= (int)sizeof p->root)
    return st_error_set("--out %s: path too long for a gradient dump directory", run_dir);
  snprintf(p->tmp, sizeof p->tmp, "%s/.tmp_step_%08lld", p->root, (long long)step);
  snprintf(p->final, sizeof p->final, "%s/step_%08lld", p->root, (long long)step);
  snprintf(p->old, sizeof p->old, "%s/.replaced_step_%08lld", p->root, (long long)step);
  return 0;
}

static int make_tmp_dir(const dump_paths *p) {
  if (st_mkdir_p(p->root) == 0 && st_rm_rf(p->tmp) == 0) {
    if (mkdir(p->tmp, 0755) == 0) return 0;
    st_error_set("cannot create directory %s: %s", p->tmp, strerror(errno));
  }
  char why[2048];
  snprintf(why, sizeof why, "%s", st_error_msg());
  return st_error_set("--dump-grads: %s; check that --out names a writable directory", why);
}

/* Per tensor, the sums of squares of this rank's piece before and after
 * clipping, in double (the norms of /norms once summed over ranks). */
static void piece_sums(const st_param_table *tab, const st_partition *part, const float *g,
                       float clip, double *sq, double *sqc) {
  for (int i = 0; i < tab->n; i++) {
    int64_t lo, hi;
    double s = 0, sc = 0;
    if (st_shard_overlap(&tab->t[i], part->begin, part->end, &lo, &hi)) {
      for (int64_t j = lo; j < hi; j++) {
        const double v = g[j - part->begin], vc = (float)(g[j - part->begin] * clip);
        s += v * v;
        sc += vc * vc;
      }
    }
    sq[i] = s;
    sqc[i] = sc;
  }
}

static int write_rank_file(const dump_paths *p, const st_param_table *tab,
                           const st_partition *part, const float *g, const st_grad_dump_meta *m) {
  char path[4300];
  snprintf(path, sizeof path, "%s/rank_%05d.h5", p->tmp, part->rank);
  int64_t most = 0; /* the largest piece, for the clipped copy */
  for (int i = 0; i < tab->n; i++) {
    int64_t lo, hi;
    if (st_shard_overlap(&tab->t[i], part->begin, part->end, &lo, &hi) && hi - lo > most)
      most = hi - lo;
  }
  float *clipped = malloc((size_t)most * sizeof(float) + sizeof(float));
  if (!clipped) return st_error_set("--dump-grads: cannot allocate %lld bytes of host memory",
                                    (long long)most * 4);
  hid_t f = st_shard_create_file(path);
  if (f < 0) {
    free(clipped);
    return -1;
  }
  int rc = 0;
  if (st_h5_attr_put_int(f, "format_version", 1) || st_h5_attr_put_int(f, "rank", part->rank) ||
      st_h5_attr_put_int(f, "world_size", part->world) || st_h5_attr_put_i64(f, "step", m->step) ||
      st_h5_attr_put_i64(f, "partition_begin", part->begin) ||
      st_h5_attr_put_i64(f, "partition_end", part->end) ||
      st_h5_attr_put_str(f, "run_id", m->run_id))
    rc = st_shard_h5_failed("write attributes of", path, NULL);
  const float clip = (float)m->clip_factor;
  for (int gi = 0; gi < 2 && rc == 0; gi++) {
    hid_t grp = H5Gcreate2(f, k_groups[gi], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (grp < 0) {
      rc = st_shard_h5_failed("create group", path, k_groups[gi]);
      break;
    }
    for (int i = 0; i < tab->n && rc == 0; i++) {
      const st_tensor *t = &tab->t[i];
      int64_t lo, hi;
      if (!st_grad_pattern_match(m->pattern, t->name) ||
          !st_shard_overlap(t, part->begin, part->end, &lo, &hi))
        continue;
      const float *src = g + (lo - part->begin);
      if (gi == 1) {
        for (int64_t j = 0; j < hi - lo; j++) clipped[j] = src[j] * clip;
        src = clipped;
      }
      if (st_shard_write_piece(grp, t, lo, hi, src) != 0) {
        char dset[ST_MAX_NAME + 32];
        snprintf(dset, sizeof dset, "/%s/%s", k_groups[gi], t->name);
        rc = st_shard_h5_failed("write dataset", path, dset);
      }
    }
    H5Gclose(grp);
  }
  free(clipped);
  return st_shard_finish_file(f, path, rc);
}


static int write_norms(hid_t f, const st_param_table *tab, const double *sq, const double *sqc,
                       const char *pattern) {
  st_grad_norm_row *rec = calloc((size_t)tab->n + 1, sizeof *rec);
  if (!rec) return -1;
  for (int i = 0; i < tab->n; i++) {
    snprintf(rec[i].name, sizeof rec[i].name, "%s", tab->t[i].name);
    rec[i].numel = tab->t[i].numel;
    rec[i].norm = sqrt(sq[i]);
    rec[i].norm_clipped = sqrt(sqc[i]);
    rec[i].dumped = st_grad_pattern_match(pattern, tab->t[i].name);
  }
  const char *names[5] = {"name", "numel", "norm", "norm_clipped", "dumped"};
  const size_t offs[5] = {offsetof(st_grad_norm_row, name), offsetof(st_grad_norm_row, numel),
                          offsetof(st_grad_norm_row, norm), offsetof(st_grad_norm_row, norm_clipped),
                          offsetof(st_grad_norm_row, dumped)};
  hid_t str = H5Tcopy(H5T_C_S1);
  int rc = -1;
  if (str >= 0 && H5Tset_size(str, ST_MAX_NAME) >= 0) {
    hid_t types[5] = {str, H5T_NATIVE_INT64, H5T_NATIVE_DOUBLE, H5T_NATIVE_DOUBLE,
                      H5T_NATIVE_INT};
    rc = H5TBmake_table("per-tensor gradient norms", f, "norms", 5, (hsize_t)tab->n,
                        sizeof(st_grad_norm_row), names, offs, types, 64, NULL, 0, rec) < 0
             ? -1
             : 0;
  }
  if (str >= 0) H5Tclose(str);
  free(rec);
  return rc;
}

static int write_index(const dump_paths *p, const st_param_table *tab, const st_partition *part,
                       const double *sq, const double *sqc, const st_grad_dump_meta *m) {
  char path[4300];
  snprintf(path, sizeof path, "%s/index.h5", p->tmp);
  hid_t f = st_shard_create_file(path);
  if (f < 0) return -1;
  int rc = 0;
  if (st_h5_attr_put_int(f, "format_version", 1) || st_h5_attr_put_i64(f, "step", m->step) ||
      st_h5_attr_put_double(f, "grad_norm", m->grad_norm) ||
      st_h5_attr_put_double(f, "clip_factor", m->clip_factor) ||
      st_h5_attr_put_double(f, "loss_scale", m->loss_scale) ||
      st_h5_attr_put_int(f, "skipped", m->skipped) ||
      st_h5_attr_put_int(f, "world_size", m->world_size) ||
      st_h5_attr_put_int(f, "zero_stage", m->zero_stage) ||
      st_h5_attr_put_str(f, "pattern", m->pattern) ||
      st_h5_attr_put_str(f, "run_id", m->run_id) ||
      st_h5_attr_put_str(f, "build_version", SHARDTRAIN_VERSION) ||
      st_h5_attr_put_int(f, "rank_files", part->world) ||
      (m->config_json && st_h5_attr_put_str(f, "config", m->config_json)))
    rc = st_shard_h5_failed("write attributes of", path, NULL);
  if (rc == 0 && write_norms(f, tab, sq, sqc, m->pattern) != 0)
    rc = st_shard_h5_failed("write the norms table", path, "/norms");
  for (int gi = 0; gi < 2 && rc == 0; gi++) {
    hid_t grp = H5Gcreate2(f, k_groups[gi], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (grp < 0) {
      rc = st_shard_h5_failed("create group", path, k_groups[gi]);
      break;
    }
    for (int i = 0; i < tab->n && rc == 0; i++) {
      if (!st_grad_pattern_match(m->pattern, tab->t[i].name)) continue;
      if (st_shard_write_vds(grp, k_groups[gi], &tab->t[i], part) != 0) {
        char dset[ST_MAX_NAME + 32];
        snprintf(dset, sizeof dset, "/%s/%s", k_groups[gi], tab->t[i].name);
        rc = st_shard_h5_failed("write virtual dataset", path, dset);
      }
    }
    H5Gclose(grp);
  }
  rc = st_shard_finish_file(f, path, rc);
  if (rc == 0) rc = st_fsync_dir(p->tmp);
  return rc;
}

/* Rename into place; an earlier dump of the same step (a resumed run
 * replaying it) is kept as .replaced_step_N, the one before that removed. */
static int publish(const dump_paths *p) {
  if (st_path_exists(p->final)) {
    if (st_rm_rf(p->old) != 0) return -1;
    if (rename(p->final, p->old) != 0)
      return st_error_set("cannot move the earlier dump %s aside: %s", p->final, strerror(errno));
  }
  if (rename(p->tmp, p->final) != 0)
    return st_error_set("cannot rename %s to %s: %s", p->tmp, p->final, strerror(errno));
  return st_fsync_dir(p->root);
}

static int dump_failed(const dump_paths *p, st_comm *comm, int remove_tmp, int64_t step) {
  char msg[1536];
  snprintf(msg, sizeof msg, "%s", st_error_msg());
  if (remove_tmp && comm->rank == 0) st_rm_rf(p->tmp);
  st_error_set("%s; the gradient dump of step %lld was not written", msg, (long long)step);
  st_error_code(ST_EXIT_ERROR);
  return -1;
}

int st_grad_dump_save(const char *run_dir, st_comm *comm, const st_param_table *tab,
                      const st_partition *part, const float *grads,
                      const st_grad_dump_meta *meta) {
  dump_paths p;
  st_h5_quiet();
  int bad = make_paths(run_dir, meta->step, &p) != 0;
  double *sq = calloc(2 * (size_t)tab->n + 1, sizeof(double));
  if (!bad && !sq) bad = st_error_set("--dump-grads: cannot allocate host memory") != 0;
  if (!bad && comm->rank == 0) bad = make_tmp_dir(&p) != 0;
  if (st_shard_agree(comm, bad) != 0) {
    free(sq);
    return dump_failed(&p, comm, 0, meta->step);
  }
  double *sqc = sq + tab->n;
  piece_sums(tab, part, grads, (float)meta->clip_factor, sq, sqc);
  bad = write_rank_file(&p, tab, part, grads, meta) != 0;
  /* the sums travel with the agreement's stage: one all-reduce of 2n doubles */
  if (comm->all_reduce_double_sum(comm, sq, (size_t)(2 * tab->n)) != 0)
    bad = bad || st_error_set("--dump-grads: the all-reduce of the per-tensor norms failed");
  if (st_shard_agree(comm, bad) != 0) {
    free(sq);
    return dump_failed(&p, comm, 1, meta->step);
  }
  bad = comm->rank == 0 && write_index(&p, tab, part, sq, sqc, meta) != 0;
  free(sq);
  if (st_shard_agree(comm, bad) != 0) return dump_failed(&p, comm, 1, meta->step);
  bad = comm->rank == 0 && publish(&p) != 0;
  if (st_shard_agree(comm, bad) != 0) return dump_failed(&p, comm, 1, meta->step);
  return comm->barrier(comm);
}
