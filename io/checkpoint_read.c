/* checkpoint_read.c - resolve, inspect, verify and load checkpoints
 * (checkpoint.h).
 *
 * Readers go through index.h5 only: its virtual datasets present every
 * tensor whole, so a hyperslab read returns exactly the elements this run's
 * partition needs whatever rank count wrote the checkpoint.
 *
 * HDF5 quietly returns fill values when a virtual dataset's source file is
 * missing, so verification checks every rank file explicitly and reads each
 * of its datasets back in full (which is what exercises Fletcher-32).
 */
#define _XOPEN_SOURCE 700
#include "io/checkpoint.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint_dirs.h"
#include "io/h5util.h"
#include "util/error.h"
#include "util/fsutil.h"

#define VERIFY_BLOCK (1 << 20) /* elements read per call while verifying */

static const char *const k_groups[3] = {"params", "adam_m", "adam_v"};
static const char k_earlier[] = "resume from an earlier step with --resume PATH";
static const char k_same_shape[] =
    "pass the same --model/--layers/--heads/--dim as the run that wrote it, or start a new --out";

/* st_error_set plus the checkpoint exit code. */
__attribute__((format(printf, 1, 2))) static int ckpt_err(const char *fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  st_error_set("%s", buf);
  st_error_code(ST_EXIT_CHECKPOINT);
  return -1;
}

/* ------------------------------------------------------------------------
 * Resolve --resume
 * --------------------------------------------------------------------- */

static int copy_out(const char *dir, char *step_dir, int cap, int *found) {
  if ((int)strlen(dir) >= cap) return st_error_set("checkpoint path too long: %s", dir);
  snprintf(step_dir, (size_t)cap, "%s", dir);
  *found = 1;
  return 0;
}

/* What resolve_auto found out besides the answer (st_ckpt_resolve_notice). */
static char g_notice[3072];

const char *st_ckpt_resolve_notice(void) { return g_notice; }

/* " (skipped: step_00000300 has no index.h5, ...)" appended to buf. */
static void add_skip(char *buf, size_t cap, int *nskip, const char *name, const char *why) {
  size_t n = strlen(buf);
  if (n + 8 >= cap) return;
  snprintf(buf + n, cap - n, "%s%s %s", (*nskip)++ ? ", " : " (skipped: ", name, why);
}

/* The newest complete, verified step directory of run_dir: 1 with dir
 * filled, 0 when none; what was passed over is described in skipped. */
static int newest_verified(const char *run_dir, char *dir, size_t cap, char *skipped,
                           size_t scap, int *nskip) {
  st_ckpt_entry *v;
  int n, got = 0;
  if (st_ckpt_list(run_dir, &v, &n) != 0) return 0;
  char msg[1536];
  snprintf(msg, sizeof msg, "%s", st_error_msg()); /* verification below overwrites it */
  for (int i = 0; i < n && !got; i++) {
    char d[4300], why[160];
    if (v[i].tmp) {
      add_skip(skipped, scap, nskip, v[i].name, "is an unfinished save");
      continue;
    }
    snprintf(d, sizeof d, "%s/ckpt/%s", run_dir, v[i].name);
    if (!st_ckpt_step_complete(d, why, sizeof why)) {
      add_skip(skipped, scap, nskip, v[i].name, why);
      continue;
    }
    if (st_ckpt_verify(d, NULL) != 0) {
      add_skip(skipped, scap, nskip, v[i].name, "does not verify");
      continue;
    }
    snprintf(dir, cap, "%s", d);
    got = 1;
  }
  free(v);
  st_error_set("%s", msg);
  return got;
}

/* --resume auto. `latest` is a pointer; the step directories are the truth:
 * when latest is missing, empty, unreadable, not a step name, or names a
 * directory that is missing or incomplete, the newest complete and verified
 * step directory is taken instead (with a notice); when latest is good but a
 * complete, verified directory of a later step exists (a crash between the
 * rename of a step and the update of latest), that one. No complete
 * directory at all: a fresh start (with a notice when something was
 * skipped). */
static int resolve_auto(const char *run_dir, char *step_dir, int cap, int *found) {
  char latest[4200], name[256] = "", dir[4500], why[200] = "", skipped[1400] = "";
  int nskip = 0;
  g_notice[0] = 0;
  snprintf(latest, sizeof latest, "%s/ckpt/latest", run_dir);
  if (!st_path_exists(latest)) snprintf(why, sizeof why, "is missing");
  else if (st_read_small_file(latest, name, sizeof name) != 0)
    snprintf(why, sizeof why, "cannot be read (%.120s)", st_error_msg());
  else if (!name[0]) snprintf(why, sizeof why, "is empty");
  else if (strchr(name, '/') || strncmp(name, "step_", 5) != 0)
    snprintf(why, sizeof why, "holds '%.60s', not a step directory name", name);
  if (!why[0]) {
    char w[128];
    snprintf(dir, sizeof dir, "%s/ckpt/%s", run_dir, name);
    if (!st_is_dir(dir)) snprintf(why, sizeof why, "names %s, which does not exist", name);
    else if (!st_ckpt_step_complete(dir, w, sizeof w))
      snprintf(why, sizeof why, "names %s, which is incomplete (it %s)", name, w);
  }
  if (!why[0]) {
    /* latest is good; only a later complete directory overrides it */
    char newest[64];
    int64_t ns, ls = strtoll(name + 5, NULL, 10);
    st_ckpt_newest_complete(run_dir, newest, sizeof newest, &ns);
    if (ns <= ls) return copy_out(dir, step_dir, cap, found);
    char d[4500];
    if (newest_verified(run_dir, d, sizeof d, skipped, sizeof skipped, &nskip) &&
        strtoll(strrchr(d, '/') + 6, NULL, 10) > ls) {
      snprintf(g_notice, sizeof g_notice, "notice: ckpt/latest names %s, but the later %s is "
               "complete and verifies (a save was interrupted before latest moved); resuming "
               "from it", name, strrchr(d, '/') + 1);
      return copy_out(d, step_dir, cap, found);
    }
    return copy_out(dir, step_dir, cap, found);
  }
  if (newest_verified(run_dir, dir, sizeof dir, skipped, sizeof skipped, &nskip)) {
    snprintf(g_notice, sizeof g_notice, "notice: ckpt/latest %s; resuming from the newest "
             "complete checkpoint %s%s%s", why, strrchr(dir, '/') + 1, skipped, nskip ? ")" : "");
    return copy_out(dir, step_dir, cap, found);
  }
  /* Nothing to resume from. Only leftovers of saves that never became
   * latest (no latest, nothing complete) allow a fresh start: a latest, or
   * a complete directory that does not verify, says a checkpoint was made,
   * and starting over beside it would bury it. */
  char newest[64];
  int64_t ns;
  st_ckpt_newest_complete(run_dir, newest, sizeof newest, &ns);
  if (strcmp(why, "is missing") == 0 && ns < 0) {
    if (nskip)
      snprintf(g_notice, sizeof g_notice, "notice: ckpt/latest is missing and no step directory "
               "in %s/ckpt is a complete checkpoint%s); starting fresh", run_dir, skipped);
    return 0;
  }
  return ckpt_err("%s %s, and no step directory is a complete checkpoint that verifies%s%s; "
                  "restore it, %s, or remove %s/ckpt (or choose a new --out) to start over",
                  latest, why, skipped, nskip ? ")" : "", k_earlier, run_dir);
}

/* A step directory, or its index.h5. */
static int resolve_path(const char *resume, char *step_dir, int cap, int *found) {
  char dir[4200], idx[4300];
  snprintf(dir, sizeof dir, "%s", resume);
  size_t n = strlen(dir);
  while (n > 1 && dir[n - 1] == '/') dir[--n] = 0;
  char *base = strrchr(dir, '/');
  if (strcmp(base ? base + 1 : dir, "index.h5") == 0 && !st_is_dir(dir)) {
    if (!base) snprintf(dir, sizeof dir, ".");
    else if (base == dir) dir[1] = 0;
    else *base = 0;
  }
  snprintf(idx, sizeof idx, "%s/index.h5", dir);
  if (!st_is_dir(dir) || !st_path_exists(idx))
    return ckpt_err("--resume %s: no checkpoint there (expected a step directory holding "
                    "index.h5, such as RUN/ckpt/step_00001000; or use --resume auto|none)",
                    resume);
  return copy_out(dir, step_dir, cap, found);
}

int st_ckpt_resolve(const char *run_dir, const char *resume, char *step_dir, int cap,
                    int *found) {
  *found = 0;
  g_notice[0] = 0;
  if (cap > 0) step_dir[0] = 0;
  if (!resume || !resume[0] || strcmp(resume, "none") == 0) return 0;
  if (strcmp(resume, "auto") == 0) return resolve_auto(run_dir, step_dir, cap, found);
  return resolve_path(resume, step_dir, cap, found);
}

/* ------------------------------------------------------------------------
 * Index and metadata
 * --------------------------------------------------------------------- */

static hid_t open_h5(const char *path) {
  hid_t fapl = st_h5_fapl();
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
  st_h5_close_plist(fapl);
  return f;
}

static hid_t open_index(const char *step_dir) {
  char path[4200];
  snprintf(path, sizeof path, "%s/index.h5", step_dir);
  if (!st_path_exists(path)) {
    ckpt_err("checkpoint %s has no index.h5; the checkpoint is incomplete: %s", step_dir,
             k_earlier);
    return -1;
  }
  hid_t f = open_h5(path);
  if (f < 0)
    ckpt_err("cannot open %s as HDF5 (%s); the checkpoint is corrupted: %s", path, st_h5_why(),
             k_earlier);
  return f;
}

static int read_meta_attrs(hid_t f, const char *step_dir, st_ckpt_meta *m) {
  int version = 0;
  const char *missing = NULL;
  memset(m, 0, sizeof *m);
  if (st_h5_attr_get_int(f, "format_version", &version)) missing = "format_version";
  else if (version != 1)
    return ckpt_err("checkpoint %s has format_version %d; this build of shardtrain reads "
                    "version 1: use the shardtrain that wrote it", step_dir, version);
  else if (st_h5_attr_get_str(f, "config", m->config_json, sizeof m->config_json))
    missing = "config";
  else if (st_h5_attr_get_i64(f, "step", &m->step)) missing = "step";
  else if (st_h5_attr_get_i64(f, "tokens_seen", &m->tokens_seen)) missing = "tokens_seen";
  else if (st_h5_attr_get_i64(f, "data_position", &m->data_position)) missing = "data_position";
  else if (st_h5_attr_get_u64s(f, "rng_state", m->rng_state, 2)) missing = "rng_state";
  else if (st_h5_attr_get_int(f, "world_size", &m->world_size)) missing = "world_size";
  else if (st_h5_attr_get_int(f, "zero_stage", &m->zero_stage)) missing = "zero_stage";
  if (missing)
    return ckpt_err("checkpoint %s: index.h5 lacks the root attribute '%s'; it was not "
                    "written by shardtrain or is damaged: %s", step_dir, missing, k_earlier);
  /* Optional: the loss scaler's state arrived after format_version 1. */
  m->has_scaler = !st_h5_attr_get_double(f, "loss_scale", &m->loss_scale) &&
                  !st_h5_attr_get_i64(f, "loss_scale_clean_steps", &m->scaler_clean_steps) &&
                  !st_h5_attr_get_int(f, "loss_scale_hysteresis_left",
                                      &m->scaler_hysteresis_left) &&
                  !st_h5_attr_get_i64(f, "skipped_steps", &m->skipped_steps);
  if (st_h5_attr_get_str(f, "run_id", m->run_id, sizeof m->run_id) != 0) m->run_id[0] = 0;
  if (st_h5_attr_get_i64(f, "data_epoch", &m->data_epoch) != 0) m->data_epoch = 0; /* older */
  return 0;
}

int st_ckpt_read_meta(const char *step_dir, st_ckpt_meta *meta) {
  st_h5_quiet();
  hid_t f = open_index(step_dir);
  if (f < 0) return -1;
  int rc = read_meta_attrs(f, step_dir, meta);
  H5Fclose(f);
  return rc;
}

int st_ckpt_read_data_shards(const char *step_dir, char **json) {
  *json = NULL;
  st_h5_quiet();
  hid_t f = open_index(step_dir);
  if (f < 0) return -1;
  const htri_t has = H5Aexists(f, "data_shards");
  if (has > 0 && !(*json = st_h5_attr_get_str_dup(f, "data_shards"))) {
    H5Fclose(f);
    return ckpt_err("checkpoint %s: cannot read the attribute data_shards of index.h5 (%s): %s",
                    step_dir, st_h5_why(), k_earlier);
  }
  H5Fclose(f);
  return 0;
}

/* ------------------------------------------------------------------------
 * Verification of the index: mappings and shapes
 * --------------------------------------------------------------------- */

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *dims) {
  if (ndim == 1) snprintf(buf, cap, "[%lld]", (long long)dims[0]);
  else snprintf(buf, cap, "[%lld,%lld]", (long long)dims[0], (long long)dims[1]);
}

/* Elements of a virtual dataset covered by its mappings, or -1. */
static int64_t vds_mapped(hid_t d) {
  hid_t dcpl = H5Dget_create_plist(d);
  size_t count = 0;
  int64_t sum = -1;
  if (dcpl >= 0 && H5Pget_layout(dcpl) == H5D_VIRTUAL && H5Pget_virtual_count(dcpl, &count) >= 0) {
    sum = 0;
    for (size_t i = 0; i < count && sum >= 0; i++) {
      hid_t vs = H5Pget_virtual_vspace(dcpl, i);
      hssize_t np = vs >= 0 ? H5Sget_select_npoints(vs) : -1;
      sum = np < 0 ? -1 : sum + np;
      st_h5_close_space(vs);
    }
  }
  st_h5_close_plist(dcpl);
  return sum;
}

/* One index dataset: fully mapped, and (with tab) the same shape as the
 * run's tensor of that name. */
static int check_index_dset(hid_t grp, const char *step_dir, const char *gname, const char *name,
                            const st_param_table *tab) {
  hid_t d = H5Dopen2(grp, name, H5P_DEFAULT);
  hid_t s = d >= 0 ? H5Dget_space(d) : -1;
  hsize_t hd[2] = {0, 1};
  int ndim = s >= 0 ? H5Sget_simple_extent_dims(s, hd, NULL) : -1;
  int64_t mapped = ndim >= 1 && ndim <= 2 ? vds_mapped(d) : -1;
  st_h5_close_space(s);
  st_h5_close_dset(d);
  int64_t dims[2] = {(int64_t)hd[0], ndim == 2 ? (int64_t)hd[1] : 1};
  if (mapped != dims[0] * dims[1])
    return ckpt_err("checkpoint %s: index.h5 dataset /%s/%s is not a virtual dataset covering "
                    "the whole tensor; the index is damaged: %s", step_dir, gname, name,
                    k_earlier);
  if (!tab) return 0;
  int i = st_param_find(tab, name);
  if (i < 0)
    return ckpt_err("checkpoint %s holds a model of a different shape: it has %s/%s, which "
                    "this run's model lacks; %s", step_dir, gname, name, k_same_shape);
  const st_tensor *t = &tab->t[i];
  if (ndim != t->ndim || dims[0] != t->shape[0] || dims[1] != t->shape[1]) {
    char have[64], want[64];
    shape_str(have, sizeof have, ndim, dims);
    shape_str(want, sizeof want, t->ndim, t->shape);
    return ckpt_err("checkpoint %s holds a model of a different shape: %s/%s is %s in the "
                    "checkpoint but %s in this run; %s", step_dir, gname, name, have, want,
                    k_same_shape);
  }
  return 0;
}

static int check_index_group(hid_t f, const char *step_dir, const char *gname,
                             const st_param_table *tab) {
  hid_t grp = H5Gopen2(f, gname, H5P_DEFAULT);
  H5G_info_t info;
  if (grp < 0 || H5Gget_info(grp, &info) < 0) {
    st_h5_close_group(grp);
    return ckpt_err("checkpoint %s: index.h5 has no group /%s; the index is damaged: %s",
                    step_dir, gname, k_earlier);
  }
  int rc = 0;
  for (hsize_t k = 0; k < info.nlinks && rc == 0; k++) {
    char name[256];
    if (H5Lget_name_by_idx(grp, ".", H5_INDEX_NAME, H5_ITER_INC, k, name, sizeof name,
                           H5P_DEFAULT) < 0)
      rc = ckpt_err("checkpoint %s: cannot list /%s in index.h5 (%s)", step_dir, gname,
                    st_h5_why());
    else
      rc = check_index_dset(grp, step_dir, gname, name, tab);
  }
  for (int i = 0; tab && i < tab->n && rc == 0; i++)
    if (H5Lexists(grp, tab->t[i].name, H5P_DEFAULT) <= 0)
      rc = ckpt_err("checkpoint %s holds a model of a different shape: %s/%s is missing from "
                    "the checkpoint but present in this run; %s", step_dir, gname,
                    tab->t[i].name, k_same_shape);
  H5Gclose(grp);
  return rc;
}

/* ------------------------------------------------------------------------
 * Verification of the rank files: present, same step, every byte readable
 * --------------------------------------------------------------------- */

/* Names every missing rank file (the first 8, then how many more). */
static int check_rank_files_exist(const char *step_dir, int nfiles) {
  char names[8 * 16 + 1] = "";
  int missing = 0;
  for (int r = 0; r < nfiles; r++) {
    char path[4200];
    snprintf(path, sizeof path, "%s/rank_%05d.h5", step_dir, r);
    if (st_path_exists(path)) continue;
    if (missing++ < 8)
      snprintf(names + strlen(names), sizeof names - strlen(names), "%srank_%05d.h5",
               missing > 1 ? ", " : "", r);
  }
  if (missing == 0) return 0;
  char more[48] = "";
  if (missing > 8) snprintf(more, sizeof more, " and %d more", missing - 8);
  return ckpt_err("checkpoint %s is missing rank file%s %s%s (written by %d ranks); the "
                  "checkpoint is incomplete: %s", step_dir, missing > 1 ? "s" : "", names, more,
                  nfiles, k_earlier);
}

int st_ckpt_check_files(const char *step_dir) {
  st_h5_quiet();
  hid_t f = open_index(step_dir);
  if (f < 0) return -1;
  int nfiles = 0, rc = 0;
  if (st_h5_attr_get_int(f, "rank_files", &nfiles) != 0 || nfiles < 1)
    rc = ckpt_err("checkpoint %s: index.h5 lacks a valid 'rank_files' attribute; it is "
                  "damaged: %s", step_dir, k_earlier);
  H5Fclose(f);
  return rc ? rc : check_rank_files_exist(step_dir, nfiles);
}

/* Every rank file carries the run_id of index.h5 (when the index has one;
 * checkpoints from before run_id have none): a file of another run, copied
 * or left in by a second job, is named instead of read as if it belonged. */
static int check_run_ids(hid_t index, const char *step_dir, int nfiles) {
  char want[40] = "", got[40];
  if (st_h5_attr_get_str(index, "run_id", want, sizeof want) != 0 || !want[0]) return 0;
  for (int r = 0; r < nfiles; r++) {
    char path[4200];
    snprintf(path, sizeof path, "%s/rank_%05d.h5", step_dir, r);
    hid_t f = open_h5(path);
    if (f < 0)
      return ckpt_err("checkpoint %s is corrupted: rank_%05d.h5 cannot be opened as HDF5 (%s): "
                      "%s", step_dir, r, st_h5_why(), k_earlier);
    snprintf(got, sizeof got, "(none)");
    int bad = st_h5_attr_get_str(f, "run_id", got, sizeof got) != 0 || strcmp(got, want) != 0;
    H5Fclose(f);
    if (bad)
      return ckpt_err("checkpoint %s mixes files of two runs: rank_%05d.h5 has run_id %s but "
                      "index.h5 has %s (another job wrote into this directory, or a file was "
                      "copied in): %s", step_dir, r, got, want, k_earlier);
  }
  return 0;
}

/* Read a 1-D float dataset back block by block; each chunk read checks its
 * Fletcher-32 sum, and *nonfinite counts its NaN and inf values (a diverged
 * run's weights checksum as well as any). 0, or -1 with *why set from
 * HDF5's error stack. */
static int read_back(hid_t d, float *buf, const char **why, int64_t *nonfinite, int64_t *total) {
  hid_t fs = H5Dget_space(d);
  hsize_t n = 0;
  int rc = fs >= 0 && H5Sget_simple_extent_ndims(fs) == 1 &&
                   H5Sget_simple_extent_dims(fs, &n, NULL) == 1 ? 0 : -1;
  *nonfinite = 0;
  *total = (int64_t)n;
  for (hsize_t off = 0; rc == 0 && off < n; off += VERIFY_BLOCK) {
    hsize_t cnt = n - off < VERIFY_BLOCK ? n - off : VERIFY_BLOCK;
    hid_t ms = H5Screate_simple(1, &cnt, NULL);
    if (ms < 0 || H5Sselect_hyperslab(fs, H5S_SELECT_SET, &off, NULL, &cnt, NULL) < 0 ||
        H5Dread(d, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, buf) < 0)
      rc = -1;
    for (hsize_t i = 0; rc == 0 && i < cnt; i++) *nonfinite += !isfinite(buf[i]);
    st_h5_close_space(ms);
  }
  if (rc != 0) *why = st_h5_why();
  st_h5_close_space(fs);
  return rc;
}

static int check_rank_group(hid_t f, const char *step_dir, const char *file, const char *gname,
                            float *buf) {
  hid_t grp = H5Gopen2(f, gname, H5P_DEFAULT);
  H5G_info_t info;
  if (grp < 0 || H5Gget_info(grp, &info) < 0) {
    st_h5_close_group(grp);
    return ckpt_err("checkpoint %s is corrupted: %s has no group /%s: %s", step_dir, file, gname,
                    k_earlier);
  }
  int rc = 0;
  for (hsize_t k = 0; k < info.nlinks && rc == 0; k++) {
    char name[256] = "?";
    const char *why = "";
    int64_t bad = 0, n = 0;
    H5Lget_name_by_idx(grp, ".", H5_INDEX_NAME, H5_ITER_INC, k, name, sizeof name, H5P_DEFAULT);
    hid_t d = H5Dopen2(grp, name, H5P_DEFAULT);
    if (d < 0 || read_back(d, buf, &why, &bad, &n) != 0) {
      if (d < 0) why = st_h5_why();
      rc = ckpt_err("checkpoint %s is corrupted: %s dataset /%s/%s does not read back (%s); "
                    "its Fletcher-32 checksum or structure is damaged: %s", step_dir, file,
                    gname, name, why, k_earlier);
    } else if (bad > 0) {
      rc = ckpt_err("checkpoint %s holds non-finite values: %s dataset /%s/%s has %lld NaN or "
                    "inf of %lld; the run that wrote it diverged: %s", step_dir, file, gname,
                    name, (long long)bad, (long long)n, k_earlier);
    }
    st_h5_close_dset(d);
  }
  H5Gclose(grp);
  return rc;
}

static int check_rank_file(const char *step_dir, int r, int64_t step, float *buf) {
  char path[4200], file[32];
  snprintf(file, sizeof file, "rank_%05d.h5", r);
  snprintf(path, sizeof path, "%s/%s", step_dir, file);
  hid_t f = open_h5(path);
  if (f < 0)
    return ckpt_err("checkpoint %s is corrupted: %s cannot be opened as HDF5 (%s): %s", step_dir,
                    file, st_h5_why(), k_earlier);
  int64_t fstep = -1;
  int rc = 0;
  if (st_h5_attr_get_i64(f, "step", &fstep) != 0 || fstep != step)
    rc = ckpt_err("checkpoint %s: %s belongs to step %lld but index.h5 to step %lld; the "
                  "directory mixes two checkpoints: %s", step_dir, file, (long long)fstep,
                  (long long)step, k_earlier);
  for (int g = 0; g < 3 && rc == 0; g++) rc = check_rank_group(f, step_dir, file, k_groups[g], buf);
  H5Fclose(f);
  return rc;
}

int st_ckpt_verify(const char *step_dir, const st_param_table *tab) {
  return st_ckpt_verify_files(step_dir, tab, 0, 1);
}

int st_ckpt_verify_files(const char *step_dir, const st_param_table *tab, int first, int stride) {
  st_h5_quiet();
  hid_t f = open_index(step_dir);
  if (f < 0) return -1;
  int nfiles = 0, rc = 0;
  int64_t step = -1;
  if (st_h5_attr_get_int(f, "rank_files", &nfiles) != 0 || nfiles < 1 ||
      st_h5_attr_get_i64(f, "step", &step) != 0)
    rc = ckpt_err("checkpoint %s: index.h5 lacks valid 'rank_files' and 'step' attributes; "
                  "it is damaged: %s", step_dir, k_earlier);
  if (rc == 0) rc = check_rank_files_exist(step_dir, nfiles);
  if (rc == 0) rc = check_run_ids(f, step_dir, nfiles);
  for (int g = 0; g < 3 && rc == 0; g++) rc = check_index_group(f, step_dir, k_groups[g], tab);
  H5Fclose(f);
  if (rc != 0) return rc;
  float *buf = malloc((size_t)VERIFY_BLOCK * sizeof *buf);
  if (!buf) return st_error_set("out of host memory verifying checkpoint %s", step_dir);
  for (int r = first; r < nfiles && rc == 0; r += stride) rc = check_rank_file(step_dir, r, step, buf);
  free(buf);
  return rc;
}

/* ------------------------------------------------------------------------
 * Load through the index
 * --------------------------------------------------------------------- */

/* A read through the index failed: find the rank file and dataset behind
 * it by reading each source of the virtual dataset d back directly, and
 * say what verify would (0), or -1 when every source reads back. */
static int explain_vds(hid_t d, const char *step_dir) {
  hid_t dcpl = H5Dget_create_plist(d);
  size_t count = 0;
  float *buf = malloc((size_t)VERIFY_BLOCK * sizeof *buf);
  int found = -1;
  if (dcpl >= 0 && buf && H5Pget_virtual_count(dcpl, &count) >= 0) {
    for (size_t i = 0; i < count && found < 0; i++) {
      char file[256] = "", dname[ST_MAX_NAME + 16] = "", path[4500];
      if (H5Pget_virtual_filename(dcpl, i, file, sizeof file) < 0 ||
          H5Pget_virtual_dsetname(dcpl, i, dname, sizeof dname) < 0)
        continue;
      snprintf(path, sizeof path, "%s/%s", step_dir, file);
      hid_t f = st_path_exists(path) ? open_h5(path) : -1;
      hid_t s = f >= 0 ? H5Dopen2(f, dname, H5P_DEFAULT) : -1;
      const char *why = "";
      int64_t bad = 0, n = 0;
      if (!st_path_exists(path))
        found = ckpt_err("checkpoint %s is missing rank file %s: %s", step_dir, file, k_earlier);
      else if (s < 0 || read_back(s, buf, &why, &bad, &n) != 0)
        found = ckpt_err("checkpoint %s is corrupted: %s dataset %s does not read back (%s); "
                         "its Fletcher-32 checksum or structure is damaged: %s", step_dir, file,
                         dname, s < 0 ? st_h5_why() : why, k_earlier);
      st_h5_close_dset(s);
      st_h5_close_file(f);
    }
  }
  free(buf);
  st_h5_close_plist(dcpl);
  return found < 0 ? -1 : 0;
}

/* Elements [a, b) (row-major within the tensor) of /gname/t into dst. */
static int read_range(hid_t f, const char *step_dir, const char *gname, const st_tensor *t,
                      int64_t a, int64_t b, float *dst) {
  char dname[ST_MAX_NAME + 16];
  snprintf(dname, sizeof dname, "/%s/%s", gname, t->name);
  hsize_t n = (hsize_t)(b - a);
  hid_t d = H5Dopen2(f, dname, H5P_DEFAULT);
  hid_t fs = d >= 0 ? H5Dget_space(d) : -1;
  hid_t ms = H5Screate_simple(1, &n, NULL);
  int rc = -1;
  if (fs >= 0 && ms >= 0 && st_h5_select_flat(fs, t->ndim, t->shape, a, b) == 0 &&
      H5Dread(d, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, dst) >= 0)
    rc = 0;
  else {
    ckpt_err("checkpoint %s: cannot read %s through index.h5 (%s): %s", step_dir, dname,
             st_h5_why(), k_earlier);
    if (d >= 0) explain_vds(d, step_dir); /* names the rank file and dataset, where it can */
  }
  st_h5_close_space(ms);
  st_h5_close_space(fs);
  st_h5_close_dset(d);
  return rc;
}

static int load_tensor(hid_t f, const char *step_dir, const st_tensor *t,
                       const st_partition *part, float *const dst[3]) {
  if (read_range(f, step_dir, k_groups[0], t, 0, t->numel, dst[0] + t->offset) != 0) return -1;
  int64_t lo = t->offset > part->begin ? t->offset : part->begin;
  int64_t hi = t->offset + t->numel < part->end ? t->offset + t->numel : part->end;
  if (hi <= lo) return 0; /* outside this rank's optimizer shard */
  for (int g = 1; g < 3; g++)
    if (read_range(f, step_dir, k_groups[g], t, lo - t->offset, hi - t->offset,
                   dst[g] + (lo - part->begin)) != 0)
      return -1;
  return 0;
}

int st_ckpt_load(const char *step_dir, const st_param_table *tab, const st_partition *part,
                 float *params, float *adam_m, float *adam_v, st_ckpt_meta *meta) {
  return st_ckpt_load_shared(step_dir, tab, part, 0, 1, params, adam_m, adam_v, meta);
}

int st_ckpt_load_shared(const char *step_dir, const st_param_table *tab, const st_partition *part,
                        int reader, int readers, float *params, float *adam_m, float *adam_v,
                        st_ckpt_meta *meta) {
  float *const dst[3] = {params, adam_m, adam_v};
  if (part->total != tab->total)
    return st_error_set("checkpoint load: partition covers %lld elements, model has %lld",
                        (long long)part->total, (long long)tab->total);
  if (st_ckpt_verify_files(step_dir, tab, reader, readers) != 0 ||
      st_ckpt_read_meta(step_dir, meta) != 0)
    return -1;
  hid_t f = open_index(step_dir);
  if (f < 0) return -1;
  int rc = 0;
  for (int i = 0; i < tab->n && rc == 0; i++) rc = load_tensor(f, step_dir, &tab->t[i], part, dst);
  H5Fclose(f);
  return rc;
}
