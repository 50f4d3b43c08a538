/* test_checkpoint.c - sharded HDF5 checkpoints (io/checkpoint.h).
 *
 * Run under mpirun -np 1, 2 and 4. Every rank saves its shard of a tiny
 * model whose odd sizes make partitions cut through tensor rows; then:
 * load with the same partition (exact), load on rank 0 with simulated
 * partitions of 1, 2, 3 and 5 ranks (resharding through the index), check
 * `latest`, and the failure modes: an unwritable --out, a save that fails
 * on one rank, a corrupted chunk, a missing rank file, a different model
 * shape, and --resume resolution.
 *
 * A tiny MPI st_comm lives here so the test does not depend on
 * collectives/collectives_mpi.c.
 */
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <hdf5.h>
#include <mpi.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "io/checkpoint.h"
#include "rank/model/config.h"
#include "util/error.h"
#include "util/fsutil.h"

/* ------------------------------------------------------------------------
 * A minimal MPI communicator (only what checkpoints use)
 * --------------------------------------------------------------------- */

static int t_broadcast(st_comm *c, void *buf, size_t bytes, int root) {
  (void)c;
  return MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD) == MPI_SUCCESS ? 0 : -1;
}

static int t_barrier(st_comm *c) {
  (void)c;
  return MPI_Barrier(MPI_COMM_WORLD) == MPI_SUCCESS ? 0 : -1;
}

static int t_int_max(st_comm *c, int *buf, size_t n) {
  (void)c;
  return MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_INT, MPI_MAX, MPI_COMM_WORLD) == MPI_SUCCESS
             ? 0 : -1;
}

/* ------------------------------------------------------------------------
 * Fixture
 * --------------------------------------------------------------------- */

static struct {
  st_comm comm;
  st_model_config cfg;
  st_param_table tab;
  st_partition part;
  float *params, *m, *v; /* full flat vectors, identical on every rank */
  char root[4096];       /* mkdtemp directory, shared by all ranks */
  char run[4200];        /* root/run: the --out directory */
} g;

static void make_meta(st_ckpt_meta *meta, int64_t step) {
  memset(meta, 0, sizeof *meta);
  meta->step = step;
  meta->tokens_seen = 1000 * step;
  meta->data_position = 12345 + step;
  meta->rng_state[0] = 0x0123456789abcdefULL;
  meta->rng_state[1] = 0xfedcba9876543210ULL + (uint64_t)step;
  meta->world_size = g.comm.world;
  meta->zero_stage = 1;
  char *json = st_model_to_json(&g.cfg);
  snprintf(meta->config_json, sizeof meta->config_json, "%s", json);
  free(json);
}

static int save_step(const char *run_dir, const st_param_table *tab, int64_t step) {
  st_ckpt_meta meta;
  make_meta(&meta, step);
  return st_ckpt_save(run_dir, &g.comm, tab, &g.part, g.params, g.m + g.part.begin,
                      g.v + g.part.begin, &meta);
}

static void path_in(char *buf, size_t cap, const char *fmt, ...) {
  char rel[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(rel, sizeof rel, fmt, ap);
  va_end(ap);
  if (snprintf(buf, cap, "%s/%s", g.root, rel) >= (int)cap) fail_msg("path too long: %s", rel);
}

static void expect_error(int rc, const char *needle) {
  if (getenv("ST_TEST_VERBOSE")) printf("rank %d error: %s\n", g.comm.rank, st_error_msg());
  if (rc != -1 || !strstr(st_error_msg(), needle))
    fail_msg("expected an error containing \"%s\", got rc=%d, \"%s\"", needle, rc, st_error_msg());
}

static void expect_ok(int rc) {
  if (rc != 0) fail_msg("rank %d: unexpected error: %s", g.comm.rank, st_error_msg());
}

static void expect_latest(const char *name) {
  char path[4300], buf[64] = "", want[64];
  snprintf(path, sizeof path, "%s/ckpt/latest", g.run);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  snprintf(want, sizeof want, "%s\n", name);
  assert_string_equal(buf, want);
}

static void expect_no_open_h5(void) {
  assert_int_equal(H5Fget_obj_count((hid_t)H5F_OBJ_ALL, H5F_OBJ_ALL), 0);
}

/* Copy the regular files of one directory into a new one. */
static void copy_dir(const char *from, const char *to) {
  assert_int_equal(st_mkdir_p(to), 0);
  DIR *d = opendir(from);
  assert_non_null(d);
  struct dirent *e;
  char buf[65536];
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char src[4400], dst[4400];
    snprintf(src, sizeof src, "%s/%s", from, e->d_name);
    snprintf(dst, sizeof dst, "%s/%s", to, e->d_name);
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    assert_true(in && out);
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) assert_int_equal(fwrite(buf, 1, n, out), n);
    fclose(in);
    fclose(out);
  }
  closedir(d);
}

static int setup(void **state) {
  (void)state;
  memset(&g.cfg, 0, sizeof g.cfg);
  g.cfg.n_layer = 2;
  g.cfg.n_head = 3;
  g.cfg.n_embd = 12;
  g.cfg.block_size = 7;
  g.cfg.vocab_size = 37;
  if (st_model_validate(&g.cfg) != 0 || st_param_table_build(&g.cfg, &g.tab) != 0) return -1;
  st_partition_make(g.tab.total, g.comm.rank, g.comm.world, &g.part);
  size_t n = (size_t)g.tab.total;
  g.params = malloc(n * sizeof(float));
  g.m = malloc(n * sizeof(float));
  g.v = malloc(n * sizeof(float));
  if (!g.params || !g.m || !g.v) return -1;
  /* distinct, exactly representable values */
  for (size_t i = 0; i < n; i++) {
    g.params[i] = 1.0f + (float)i / 8.0f;
    g.m[i] = -0.5f - (float)i / 16.0f;
    g.v[i] = 2.0f + (float)i / 32.0f;
  }
  memset(g.root, 0, sizeof g.root);
  if (g.comm.rank == 0) {
    snprintf(g.root, sizeof g.root, "/tmp/st_ckpt_test_XXXXXX");
    if (!mkdtemp(g.root)) g.root[0] = 0;
  }
  MPI_Bcast(g.root, sizeof g.root, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (!g.root[0]) return -1;
  snprintf(g.run, sizeof g.run, "%s/run", g.root);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  MPI_Barrier(MPI_COMM_WORLD);
  if (g.comm.rank == 0 && !getenv("ST_KEEP_TEST_DIR")) st_rm_rf(g.root);
  if (g.comm.rank == 0 && getenv("ST_KEEP_TEST_DIR")) printf("kept %s\n", g.root);
  free(g.params);
  free(g.m);
  free(g.v);
  st_param_table_free(&g.tab);
  return 0;
}

/* Load with partition p and compare against the original vectors. */
static void load_and_compare(const char *step_dir, const st_partition *p, int64_t step) {
  size_t n = (size_t)g.tab.total, k = (size_t)(p->end - p->begin);
  float *params = calloc(n, sizeof(float));
  float *m = calloc(k + 1, sizeof(float)), *v = calloc(k + 1, sizeof(float));
  st_ckpt_meta meta, want;
  assert_true(params && m && v);
  expect_ok(st_ckpt_load(step_dir, &g.tab, p, params, m, v, &meta));
  assert_memory_equal(params, g.params, n * sizeof(float));
  if (k) assert_memory_equal(m, g.m + p->begin, k * sizeof(float));
  if (k) assert_memory_equal(v, g.v + p->begin, k * sizeof(float));
  make_meta(&want, step);
  assert_int_equal(meta.step, want.step);
  assert_int_equal(meta.tokens_seen, want.tokens_seen);
  assert_int_equal(meta.data_position, want.data_position);
  assert_true(meta.rng_state[0] == want.rng_state[0] && meta.rng_state[1] == want.rng_state[1]);
  assert_int_equal(meta.world_size, want.world_size);
  assert_int_equal(meta.zero_stage, want.zero_stage);
  assert_string_equal(meta.config_json, want.config_json);
  free(params);
  free(m);
  free(v);
}

/* ------------------------------------------------------------------------
 * Collective tests (every rank)
 * --------------------------------------------------------------------- */

static void test_save_and_load(void **state) {
  (void)state;
  char dir[4400];
  int found = 0;
  int rc = save_step(g.run, &g.tab, 1);
  expect_ok(rc);
  expect_ok(st_ckpt_resolve(g.run, "auto", dir, sizeof dir, &found));
  assert_int_equal(found, 1);
  assert_non_null(strstr(dir, "/ckpt/step_00000001"));
  load_and_compare(dir, &g.part, 1);
  expect_latest("step_00000001");
  t_barrier(&g.comm);
  if (g.comm.rank == 0) {
    char tmp[4400];
    path_in(tmp, sizeof tmp, "run/ckpt/.tmp_step_00000001");
    assert_false(st_path_exists(tmp));
  }
  expect_no_open_h5();
}

static void test_failed_saves(void **state) {
  (void)state;
  char bad[4400], badckpt[4400];
  path_in(bad, sizeof bad, "badrun");
  path_in(badckpt, sizeof badckpt, "badrun/ckpt");
  if (g.comm.rank == 0) {
    st_mkdir_p(bad);
    FILE *f = fopen(badckpt, "w"); /* ckpt is a file: the save cannot create the directory */
    fputs("not a directory\n", f);
    fclose(f);
  }
  t_barrier(&g.comm);
  int rc = save_step(bad, &g.tab, 2);
  expect_error(rc, badckpt);
  expect_error(rc, "--out");
  expect_error(rc, "not saved");
  assert_int_equal(st_error_exit_code(), ST_EXIT_ERROR);
  assert_false(st_is_dir(badckpt));

  /* A save that fails on the last rank only (its tensor name cannot be a
   * dataset name): every rank fails with that rank's message, and `latest`
   * still names step 1. */
  st_param_table bent = g.tab;
  bent.t = malloc((size_t)g.tab.n * sizeof *bent.t);
  assert_non_null(bent.t);
  memcpy(bent.t, g.tab.t, (size_t)g.tab.n * sizeof *bent.t);
  snprintf(bent.t[g.tab.n - 1].name, ST_MAX_NAME, "bad/name");
  rc = save_step(g.run, &bent, 3);
  free(bent.t);
  expect_error(rc, "bad/name");
  expect_error(rc, "not saved");
  t_barrier(&g.comm);
  expect_latest("step_00000001");
  char dir[4400];
  int found = 0;
  expect_ok(st_ckpt_resolve(g.run, "auto", dir, sizeof dir, &found));
  assert_true(found && strstr(dir, "step_00000001"));
  if (g.comm.rank == 0) {
    char p3[4400], t3[4400];
    path_in(p3, sizeof p3, "run/ckpt/step_00000003");
    path_in(t3, sizeof t3, "run/ckpt/.tmp_step_00000003");
    assert_false(st_path_exists(p3));
    assert_false(st_path_exists(t3));
  }
  t_barrier(&g.comm);

  /* And the run goes on: step 2 saves. */
  expect_ok(save_step(g.run, &g.tab, 2));
  expect_latest("step_00000002");
  /* Saving the same step again is refused: a complete checkpoint is never
   * overwritten (exit class 3), and it and `latest` stay as they were. */
  rc = save_step(g.run, &g.tab, 2);
  expect_error(rc, "never overwritten");
  assert_int_equal(st_error_exit_code(), ST_EXIT_CHECKPOINT);
  t_barrier(&g.comm);
  expect_latest("step_00000002");
  {
    char s2[4400];
    path_in(s2, sizeof s2, "run/ckpt/step_00000002");
    expect_ok(st_ckpt_verify(s2, &g.tab));
  }
  expect_no_open_h5();
}

/* A save past the process's file size limit (RLIMIT_FSIZE: the kernel
 * fails the writes with EFBIG, as a full disk fails them with ENOSPC; no
 * root needed, unlike a tmpfs), at two sizes: the data writes fail; every
 * write fits but the reservation before the metadata flush does not (it
 * exists because a failed H5Fflush makes HDF5 1.10's close fail and the
 * process segfault at exit). Each: one line naming the file, exit 1,
 * `latest` unchanged, nothing temporary left, no HDF5 id left open. */
static void save_past_limit(rlim_t limit, int64_t step, const char *file) {
  struct rlimit old, rl;
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
  rl = old;
  rl.rlim_cur = limit;
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &rl), 0);
  int rc = save_step(g.run, &g.tab, step);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
  expect_error(rc, "file too large writing");
  expect_error(rc, file);
  expect_error(rc, "ckpt/latest still names step_00000002");
  assert_null(strchr(st_error_msg(), '\n'));
  assert_int_equal(st_error_exit_code(), ST_EXIT_ERROR);
  t_barrier(&g.comm);
  expect_latest("step_00000002");
  char tmp[4400];
  path_in(tmp, sizeof tmp, "run/ckpt/.tmp_step_%08lld", (long long)step);
  assert_false(st_path_exists(tmp));
  expect_no_open_h5();
}

static void test_file_size_limit(void **state) {
  (void)state;
  signal(SIGXFSZ, SIG_IGN); /* else the kernel kills the process at the limit */
  struct stat st;
  char path[4400];
  path_in(path, sizeof path, "run/ckpt/step_00000002/rank_%05d.h5", g.comm.rank);
  assert_int_equal(stat(path, &st), 0);
  save_past_limit(4096, 7, "rank_");
  /* This rank's file is as large as at step 2: every write fits, and the
   * reservation (a page past the end) is what fails, before the flush. */
  save_past_limit((rlim_t)st.st_size, 8, ".h5 (past the file size limit");
  /* index.h5 is the smaller file here; tests/e2e/test_ckpt_full_disk.py
   * makes its case on a full tmpfs. */
  /* And the limit gone, saving works (into a run of its own: step 2 of
   * g.run is complete and never overwritten, and test_resolve wants step 2
   * to stay g.run's newest). */
  char other[4400];
  path_in(other, sizeof other, "run_fsize");
  expect_ok(save_step(other, &g.tab, 9));
  path_in(path, sizeof path, "run_fsize/ckpt/step_00000009/index.h5");
  assert_true(st_path_exists(path));
}

/* ------------------------------------------------------------------------
 * Rank 0 only: resharding, faults, resolution
 * --------------------------------------------------------------------- */

static void test_reshard(void **state) {
  (void)state;
  if (g.comm.rank != 0) return;
  char dir[4400];
  path_in(dir, sizeof dir, "run/ckpt/step_00000002");
  const int worlds[] = {1, 2, 3, 5};
  for (int w = 0; w < 4; w++) {
    for (int r = 0; r < worlds[w]; r++) {
      st_partition p;
      st_partition_make(g.tab.total, r, worlds[w], &p);
      load_and_compare(dir, &p, 2);
    }
  }
  expect_no_open_h5();
}

/* Flip bytes in the middle of the first chunk of /adam_v/wte.weight. */
static void corrupt_chunk(const char *file) {
  hid_t f = H5Fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
  assert_true(f >= 0);
  hid_t d = H5Dopen2(f, "/adam_v/wte.weight", H5P_DEFAULT);
  assert_true(d >= 0);
  hsize_t off[1], size = 0;
  unsigned mask;
  haddr_t addr = HADDR_UNDEF;
  hid_t space = H5Dget_space(d);
  herr_t rc = H5Dget_chunk_info(d, space, 0, off, &mask, &addr, &size);
  H5Sclose(space);
  H5Dclose(d);
  H5Fclose(f);
  assert_true(rc >= 0 && addr != HADDR_UNDEF && size > 64);
  FILE *fp = fopen(file, "r+b");
  assert_non_null(fp);
  unsigned char b[16];
  assert_int_equal(fseek(fp, (long)(addr + size / 2), SEEK_SET), 0);
  assert_int_equal(fread(b, 1, sizeof b, fp), sizeof b);
  for (size_t i = 0; i < sizeof b; i++) b[i] ^= 0x5a;
  assert_int_equal(fseek(fp, (long)(addr + size / 2), SEEK_SET), 0);
  assert_int_equal(fwrite(b, 1, sizeof b, fp), sizeof b);
  fclose(fp);
}

static void test_corrupted_chunk(void **state) {
  (void)state;
  if (g.comm.rank != 0) return;
  char src[4400], dst[4400], file[4500];
  path_in(src, sizeof src, "run/ckpt/step_00000002");
  path_in(dst, sizeof dst, "corrupt");
  copy_dir(src, dst);
  expect_ok(st_ckpt_verify(dst, &g.tab));
  snprintf(file, sizeof file, "%s/rank_00000.h5", dst);
  corrupt_chunk(file);
  int rc = st_ckpt_verify(dst, &g.tab);
  expect_error(rc, "corrupt");
  expect_error(rc, "checksum");
  expect_error(rc, "rank_00000.h5");
  expect_error(rc, "/adam_v/wte.weight");
  assert_int_equal(st_error_exit_code(), ST_EXIT_CHECKPOINT);
  size_t n = (size_t)g.tab.total;
  float *buf = malloc(3 * n * sizeof(float));
  st_ckpt_meta meta;
  assert_non_null(buf);
  expect_error(st_ckpt_load(dst, &g.tab, &g.part, buf, buf + n, buf + 2 * n, &meta), "corrupt");
  free(buf);
  expect_no_open_h5();
}

static void test_missing_rank_file(void **state) {
  (void)state;
  if (g.comm.rank != 0) return;
  char src[4400], dst[4400], file[4500], want[128];
  path_in(src, sizeof src, "run/ckpt/step_00000002");
  path_in(dst, sizeof dst, "missing");
  copy_dir(src, dst);
  int last = g.comm.world - 1;
  snprintf(file, sizeof file, "%s/rank_%05d.h5", dst, last);
  assert_int_equal(unlink(file), 0);
  snprintf(want, sizeof want, "missing rank file rank_%05d.h5 (written by %d ranks)", last,
           g.comm.world);
  expect_error(st_ckpt_verify(dst, &g.tab), want);
  expect_error(st_ckpt_verify(dst, NULL), want);
  expect_error(st_ckpt_verify(dst, NULL), "--resume PATH");
  expect_no_open_h5();
}

static void expect_shape_error(const st_model_config *c, const char *needle) {
  st_model_config cfg = *c;
  st_param_table tab;
  char dir[4400];
  path_in(dir, sizeof dir, "run/ckpt/step_00000002");
  assert_int_equal(st_model_validate(&cfg), 0);
  assert_int_equal(st_param_table_build(&cfg, &tab), 0);
  int rc = st_ckpt_verify(dir, &tab);
  expect_error(rc, "different shape");
  expect_error(rc, needle);
  expect_error(rc, "--layers");
  st_param_table_free(&tab);
}

static void test_shape_mismatch(void **state) {
  (void)state;
  if (g.comm.rank != 0) return;
  st_model_config wide = g.cfg, deep = g.cfg, shallow = g.cfg;
  wide.n_embd = 24;
  expect_shape_error(&wide, "is [12] in the checkpoint but [24] in this run");
  deep.n_layer = 3;
  expect_shape_error(&deep, "h.2.");
  shallow.n_layer = 1;
  expect_shape_error(&shallow, "h.1.");
  expect_no_open_h5();
}

static void test_resolve(void **state) {
  (void)state;
  if (g.comm.rank != 0) return;
  char dir[4400], want[4400], arg[4500], fresh[4400];
  int found = 1;
  expect_ok(st_ckpt_resolve(g.run, "none", dir, sizeof dir, &found));
  assert_int_equal(found, 0);
  path_in(fresh, sizeof fresh, "fresh");
  expect_ok(st_ckpt_resolve(fresh, "auto", dir, sizeof dir, &found));
  assert_int_equal(found, 0);

  path_in(want, sizeof want, "run/ckpt/step_00000001");
  expect_ok(st_ckpt_resolve(g.run, want, dir, sizeof dir, &found));
  assert_true(found && strcmp(dir, want) == 0);
  snprintf(arg, sizeof arg, "%s/", want);
  expect_ok(st_ckpt_resolve(g.run, arg, dir, sizeof dir, &found));
  assert_true(found && strcmp(dir, want) == 0);
  snprintf(arg, sizeof arg, "%s/index.h5", want);
  expect_ok(st_ckpt_resolve(g.run, arg, dir, sizeof dir, &found));
  assert_true(found && strcmp(dir, want) == 0);

  path_in(arg, sizeof arg, "run/ckpt/step_00000077");
  expect_error(st_ckpt_resolve(g.run, arg, dir, sizeof dir, &found), "--resume");
  assert_int_equal(found, 0);

  st_ckpt_meta meta;
  expect_ok(st_ckpt_read_meta(want, &meta));
  assert_int_equal(meta.step, 1);
  assert_int_equal(meta.world_size, g.comm.world);
  expect_error(st_ckpt_read_meta(fresh, &meta), "index.h5");

  /* `latest` naming a step that is gone, with no step directory to fall
   * back on, is an error, not a fresh start. */
  char lost[4400];
  path_in(lost, sizeof lost, "lost/ckpt");
  assert_int_equal(st_mkdir_p(lost), 0);
  strcat(lost, "/latest");
  assert_int_equal(st_write_file_atomic(lost, "step_00000009\n"), 0);
  path_in(arg, sizeof arg, "lost");
  expect_error(st_ckpt_resolve(arg, "auto", dir, sizeof dir, &found), "step_00000009");

  /* The step directories are the truth: latest missing or naming a gone
   * step resumes from the newest complete, verified one (step 2), with a
   * notice; an unfinished .tmp_ save and an incomplete newer one are
   * skipped. */
  char latest[4400], junk[4400];
  path_in(latest, sizeof latest, "run/ckpt/latest");
  path_in(junk, sizeof junk, "run/ckpt/step_00000005");
  assert_int_equal(st_mkdir_p(junk), 0);
  path_in(junk, sizeof junk, "run/ckpt/.tmp_step_00000006");
  assert_int_equal(st_mkdir_p(junk), 0);
  path_in(want, sizeof want, "run/ckpt/step_00000002");
  assert_int_equal(st_write_file_atomic(latest, "step_00000009\n"), 0);
  expect_ok(st_ckpt_resolve(g.run, "auto", dir, sizeof dir, &found));
  assert_true(found && strcmp(dir, want) == 0);
  assert_non_null(strstr(st_ckpt_resolve_notice(), "names step_00000009"));
  assert_non_null(strstr(st_ckpt_resolve_notice(), "step_00000005 has no index.h5"));
  assert_non_null(strstr(st_ckpt_resolve_notice(), ".tmp_step_00000006 is an unfinished save"));
  assert_int_equal(unlink(latest), 0);
  expect_ok(st_ckpt_resolve(g.run, "auto", dir, sizeof dir, &found));
  assert_true(found && strcmp(dir, want) == 0);
  assert_non_null(strstr(st_ckpt_resolve_notice(), "ckpt/latest is missing"));
  assert_int_equal(st_write_file_atomic(latest, "step_00000002\n"), 0);
  expect_ok(st_ckpt_resolve(g.run, "auto", dir, sizeof dir, &found));
  assert_true(found && strcmp(dir, want) == 0 && !st_ckpt_resolve_notice()[0]);
  expect_no_open_h5();
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  memset(&g, 0, sizeof g);
  MPI_Comm_rank(MPI_COMM_WORLD, &g.comm.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g.comm.world);
  g.comm.backend = "test-mpi";
  g.comm.broadcast = t_broadcast;
  g.comm.barrier = t_barrier;
  g.comm.all_reduce_int_max = t_int_max;

  /* Collective tests first: a rank-0-only test that fails must not leave
   * the other ranks waiting in a collective. */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_save_and_load),   cmocka_unit_test(test_failed_saves),
      cmocka_unit_test(test_file_size_limit),
      cmocka_unit_test(test_reshard),         cmocka_unit_test(test_corrupted_chunk),
      cmocka_unit_test(test_missing_rank_file), cmocka_unit_test(test_shape_mismatch),
      cmocka_unit_test(test_resolve),
  };
  int failed = cmocka_run_group_tests(tests, setup, teardown);
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return failed ? 1 : 0;
}
