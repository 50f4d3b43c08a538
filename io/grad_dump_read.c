/* grad_dump_read.c - reading gradient dumps (grad_dump.h): a dump's
 * attributes and norms table, whole tensors through its virtual datasets,
 * and the list of a run's complete dumps. */
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <hdf5_hl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/grad_dump.h"
#include "io/h5util.h"
#include "util/error.h"
#include "util/fsutil.h"


static hid_t open_index(const char *step_dir, char *path, size_t cap) {
  snprintf(path, cap, "%s/index.h5", step_dir);
  st_h5_quiet();
  if (!st_path_exists(path)) {
    st_error_set("%s: no index.h5: not a gradient dump (RUN/grads/step_N), or one whose write "
                 "did not finish", step_dir);
    return -1;
  }
  hid_t fapl = st_h5_fapl();
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
  st_h5_close_plist(fapl);
  if (f < 0) st_error_set("cannot open %s: %s", path, st_h5_why());
  return f;
}

static int read_attrs(hid_t f, const char *path, st_grad_dump_meta *m) {
  memset(m, 0, sizeof *m);
  if (st_h5_attr_get_i64(f, "step", &m->step) || st_h5_attr_get_double(f, "grad_norm", &m->grad_norm) ||
      st_h5_attr_get_double(f, "clip_factor", &m->clip_factor) ||
      st_h5_attr_get_double(f, "loss_scale", &m->loss_scale) ||
      st_h5_attr_get_int(f, "skipped", &m->skipped) ||
      st_h5_attr_get_int(f, "world_size", &m->world_size) ||
      st_h5_attr_get_int(f, "zero_stage", &m->zero_stage) ||
      st_h5_attr_get_str(f, "pattern", m->pattern, sizeof m->pattern) ||
      st_h5_attr_get_str(f, "run_id", m->run_id, sizeof m->run_id))
    return st_error_set("%s: not a gradient dump's index (an attribute of step, grad_norm, "
                        "clip_factor, loss_scale, skipped, world_size, zero_stage, pattern or "
                        "run_id is missing)", path);
  return 0;
}

int st_grad_dump_open(const char *step_dir, st_grad_dump_info *info) {
  char path[4200];
  memset(info, 0, sizeof *info);
  hid_t f = open_index(step_dir, path, sizeof path);
  if (f < 0) return -1;
  int rc = read_attrs(f, path, &info->meta);
  hsize_t nfields = 0, nrec = 0;
  if (rc == 0 && (H5TBget_table_info(f, "norms", &nfields, &nrec) < 0 || nfields != 5))
    rc = st_error_set("%s: no /norms table of 5 fields: %s", path, st_h5_why());
  st_grad_norm_row *rows = rc == 0 ? calloc((size_t)nrec + 1, sizeof *rows) : NULL;
  if (rc == 0 && !rows) rc = st_error_set("%s: out of host memory", path);
  if (rc == 0) {
    const size_t offs[5] = {offsetof(st_grad_norm_row, name), offsetof(st_grad_norm_row, numel),
                            offsetof(st_grad_norm_row, norm), offsetof(st_grad_norm_row, norm_clipped),
                            offsetof(st_grad_norm_row, dumped)};
    const size_t sizes[5] = {ST_MAX_NAME, sizeof(int64_t), sizeof(double), sizeof(double),
                             sizeof(int)};
    if (H5TBread_table(f, "norms", sizeof(st_grad_norm_row), offs, sizes, rows) < 0)
      rc = st_error_set("cannot read /norms in %s: %s", path, st_h5_why());
  }
  for (hsize_t i = 0; rc == 0 && rows && i < nrec; i++) rows[i].name[ST_MAX_NAME - 1] = 0;
  H5Fclose(f);
  if (rc != 0) {
    free(rows);
    return -1;
  }
  info->rows = rows;
  info->n = (int)nrec;
  return 0;
}

void st_grad_dump_close(st_grad_dump_info *info) {
  free(info->rows);
  info->rows = NULL;
  info->n = 0;
}

int st_grad_dump_read(const char *step_dir, const char *group, const char *name, float **out,
                      int64_t *numel) {
  char path[4200], dset[ST_MAX_NAME + 32];
  *out = NULL;
  *numel = 0;
  hid_t f = open_index(step_dir, path, sizeof path);
  if (f < 0) return -1;
  snprintf(dset, sizeof dset, "/%s/%s", group, name);
  /* A virtual dataset whose source file is gone reads as its fill (NaN)
   * without an error: every rank file must be there first. */
  int files = 0;
  if (st_h5_attr_get_int(f, "rank_files", &files) || files < 1) {
    H5Fclose(f);
    return st_error_set("%s: no rank_files attribute: not a gradient dump's index", path);
  }
  for (int r = 0; r < files; r++) {
    char rank_path[4300];
    snprintf(rank_path, sizeof rank_path, "%s/rank_%05d.h5", step_dir, r);
    if (!st_path_exists(rank_path)) {
      H5Fclose(f);
      return st_error_set("%s is missing: the dump %s is incomplete (its index names %d rank "
                          "files)", rank_path, step_dir, files);
    }
  }
  int rc = -1;
  hid_t d = H5Lexists(f, group, H5P_DEFAULT) > 0 && H5Lexists(f, dset, H5P_DEFAULT) > 0
                ? H5Dopen2(f, dset, H5P_DEFAULT)
                : -1;
  hid_t space = d >= 0 ? H5Dget_space(d) : -1;
  if (d < 0) {
    st_error_set("%s holds no %s (the dump's --dump-grads pattern did not select it?)", path,
                 dset);
  } else if (space >= 0) {
    hssize_t n = H5Sget_simple_extent_npoints(space);
    float *buf = n > 0 ? malloc((size_t)n * sizeof(float)) : NULL;
    if (!buf) {
      st_error_set("%s in %s: cannot allocate %lld floats", dset, path, (long long)n);
    } else if (H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
      st_error_set("cannot read %s in %s (a rank file missing or damaged?): %s", dset, path,
                   st_h5_why());
      free(buf);
    } else {
      *out = buf;
      *numel = n;
      rc = 0;
    }
  }
  st_h5_close_space(space);
  st_h5_close_dset(d);
  H5Fclose(f);
  return rc;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

int st_grad_dump_list(const char *run_dir, int64_t *steps, int cap) {
  char root[4200];
  snprintf(root, sizeof root, "%s/grads", run_dir);
  DIR *d = opendir(root);
  if (!d) return st_error_set("%s: no gradient dumps here (train with --dump-grads EVERY)", root);
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    long long s;
    char tail;
    if (sscanf(e->d_name, "step_%lld%c", &s, &tail) != 1) continue;
    char idx[4500];
    snprintf(idx, sizeof idx, "%s/%s/index.h5", root, e->d_name);
    if (!st_path_exists(idx)) continue;
    if (n < cap) steps[n] = s;
    n++;
  }
  closedir(d);
  qsort(steps, (size_t)(n < cap ? n : cap), sizeof *steps, cmp_i64);
  return n;
}
