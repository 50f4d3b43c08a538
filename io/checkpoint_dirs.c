/* checkpoint_dirs.c - listing, completeness and retention of a run's step
 * directories (checkpoint_dirs.h). */
#define _XOPEN_SOURCE 700
#include "io/checkpoint_dirs.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/h5util.h"
#include "util/error.h"
#include "util/fsutil.h"

/* The step of "step_DIGITS" (after an optional ".tmp_"), or -1. */
static int64_t step_of(const char *name, int *tmp) {
  *tmp = strncmp(name, ".tmp_", 5) == 0;
  const char *s = *tmp ? name + 5 : name;
  if (strncmp(s, "step_", 5) != 0 || !s[5] || strlen(s) > 30) return -1;
  int64_t v = 0;
  for (const char *c = s + 5; *c; c++) {
    if (*c < '0' || *c > '9') return -1;
    v = v * 10 + (*c - '0');
  }
  return v;
}

static int newest_first(const void *a, const void *b) {
  const st_ckpt_entry *x = a, *y = b;
  if (x->step != y->step) return x->step < y->step ? 1 : -1;
  return x->tmp - y->tmp;
}

int st_ckpt_list(const char *run_dir, st_ckpt_entry **out, int *n) {
  char dir[4200];
  *out = NULL;
  *n = 0;
  snprintf(dir, sizeof dir, "%s/ckpt", run_dir);
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? 0 : st_error_set("cannot list %s: %s", dir, strerror(errno));
  int cap = 0;
  st_ckpt_entry *v = NULL;
  struct dirent *e;
  while ((e = readdir(d)) != NULL && *n < ST_CKPT_MAX_LIST) {
    int tmp;
    int64_t s = step_of(e->d_name, &tmp);
    if (s < 0) continue;
    char path[4500];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (!st_is_dir(path)) continue;
    if (*n == cap) {
      cap = cap ? 2 * cap : 64;
      st_ckpt_entry *w = realloc(v, (size_t)cap * sizeof *v);
      if (!w) {
        free(v);
        closedir(d);
        return st_error_set("out of host memory listing %s", dir);
      }
      v = w;
    }
    snprintf(v[*n].name, sizeof v[*n].name, "%.40s", e->d_name); /* step_of: <= 35 chars */
    v[*n].step = s;
    v[*n].tmp = tmp;
    (*n)++;
  }
  closedir(d);
  if (*n > 1) qsort(v, (size_t)*n, sizeof *v, newest_first);
  *out = v;
  return 0;
}

int st_ckpt_step_complete(const char *step_dir, char *why, size_t cap) {
  char path[4300];
  snprintf(path, sizeof path, "%s/index.h5", step_dir);
  if (cap) why[0] = 0;
  if (!st_path_exists(path)) {
    snprintf(why, cap, "has no index.h5");
    return 0;
  }
  st_h5_quiet();
  hid_t fapl = st_h5_fapl();
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
  st_h5_close_plist(fapl);
  int nfiles = 0;
  if (f < 0) {
    snprintf(why, cap, "has an index.h5 that does not open");
    return 0;
  }
  int bad = st_h5_attr_get_int(f, "rank_files", &nfiles) != 0 || nfiles < 1;
  H5Fclose(f);
  if (bad) {
    snprintf(why, cap, "has an index.h5 without rank_files");
    return 0;
  }
  for (int r = 0; r < nfiles; r++) {
    snprintf(path, sizeof path, "%s/rank_%05d.h5", step_dir, r);
    if (!st_path_exists(path)) {
      snprintf(why, cap, "is missing rank_%05d.h5", r);
      return 0;
    }
  }
  return 1;
}

void st_ckpt_newest_complete(const char *run_dir, char *name, size_t cap, int64_t *step) {
  st_ckpt_entry *v;
  int n;
  *step = -1;
  if (cap) name[0] = 0;
  if (st_ckpt_list(run_dir, &v, &n) != 0) return;
  for (int i = 0; i < n; i++) {
    char dir[4300], why[128];
    if (v[i].tmp) continue;
    snprintf(dir, sizeof dir, "%s/ckpt/%s", run_dir, v[i].name);
    if (!st_ckpt_step_complete(dir, why, sizeof why)) continue;
    snprintf(name, cap, "%s", v[i].name);
    *step = v[i].step;
    break;
  }
  free(v);
}

int st_ckpt_prune(const char *run_dir, int keep_last, char *removed, size_t cap) {
  char latest[4200], name[256];
  size_t used = 0;
  if (cap) removed[0] = 0;
  if (keep_last < 1) return 0;
  snprintf(latest, sizeof latest, "%s/ckpt/latest", run_dir);
  if (st_read_small_file(latest, name, sizeof name) != 0) return 0; /* nothing is sure: keep all */
  int tmp;
  const int64_t latest_step = step_of(name, &tmp);
  if (latest_step < 0 || tmp) return 0;
  st_ckpt_entry *v;
  int n, rc = 0, kept = 0, seen_latest = 0;
  if (st_ckpt_list(run_dir, &v, &n) != 0) return -1;
  for (int i = 0; i < n; i++) {
    char dir[4300], mark[4400], why[128];
    if (v[i].tmp) continue;
    snprintf(dir, sizeof dir, "%s/ckpt/%s", run_dir, v[i].name);
    if (!st_ckpt_step_complete(dir, why, sizeof why)) continue;
    if (strcmp(v[i].name, name) == 0) seen_latest = 1;
    /* the newest complete ones are kept, latest among them: a directory
     * newer than latest (not expected) is kept and counts */
    if (kept < keep_last || v[i].step >= latest_step) {
      kept++;
      continue;
    }
    if (!seen_latest) break; /* latest is not a complete directory here: touch nothing */
    snprintf(mark, sizeof mark, "%s/%s", dir, ST_CKPT_KEEP_MARK);
    if (st_path_exists(mark)) continue; /* the user's: kept, not counted */
    /* Renamed first so that a crash part-way through removal leaves a
     * directory no listing takes for a checkpoint. */
    char gone[4400];
    snprintf(gone, sizeof gone, "%s/ckpt/.deleting_%s", run_dir, v[i].name);
    if (rename(dir, gone) != 0 || st_rm_rf(gone) != 0) {
      rc = st_error_set("--keep-last %d: cannot remove %s: %s", keep_last, dir, strerror(errno));
      break;
    }
    int w = snprintf(removed + used, cap - used, "%s%s", used ? ", " : "", v[i].name);
    if (w > 0 && (size_t)w < cap - used) used += (size_t)w;
  }
  free(v);
  return rc;
}
