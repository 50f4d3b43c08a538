/* test_gemm_cache.c - the file of timed GEMM algorithm choices
 * (kernels/gemm_cache.c), which the CUDA backend's ST_GEMM_SEARCH reads and
 * appends to (kernels/cuda/matmul.cu).
 *
 * 1. A missing file finds nothing; an added line is found again, word for
 *    word, and only for its own device and its own key (every key word
 *    counts, and so does the key's length).
 * 2. The first matching line wins: a later line for the same problem (a
 *    rank that raced) does not change what readers take.
 * 3. Lines that do not parse (truncated by a full disk, another format,
 *    trailing words, a line longer than any of ours) are skipped, and the
 *    lines around them still count.
 * 4. Refusals: a device name with a blank, a bad key length, a folder that
 *    does not exist (errno ENOENT, nothing created), a file that cannot be
 *    read (a directory in its place).
 * 5. Ranks appending at once: 4 processes x 50 lines, every line whole.
 * 6. A last line left without its newline: the next added line starts a
 *    line of its own and is found.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "kernels/gemm_cache.h"

static char g_dir[64];
static char g_path[128];

static int setup(void **state) {
  (void)state;
  strcpy(g_dir, "/tmp/st_gemm_cache_XXXXXX");
  if (!mkdtemp(g_dir)) return -1;
  snprintf(g_path, sizeof g_path, "%s/gemm.txt", g_dir);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  unlink(g_path);
  rmdir(g_dir);
  return 0;
}

static void algo_of(unsigned long long a[ST_GEMM_ALGO_WORDS], unsigned long long seed) {
  for (int i = 0; i < ST_GEMM_ALGO_WORDS; i++)
    a[i] = seed * 0x9e3779b97f4a7c15ULL + (unsigned long long)i * 0xffffffff00000001ULL;
}

static void test_round_trip(void **state) {
  (void)state;
  const long long key[5] = {2304, 32768, 768, -1, 1LL << 40};
  unsigned long long a[ST_GEMM_ALGO_WORDS], got[ST_GEMM_ALGO_WORDS];
  algo_of(a, 7);
  assert_int_equal(st_gemm_cache_find(g_path, "H200-130100", key, 5, got), 0); /* no file */
  assert_int_equal(st_gemm_cache_add(g_path, "H200-130100", key, 5, a), 0);
  memset(got, 0, sizeof got);
  assert_int_equal(st_gemm_cache_find(g_path, "H200-130100", key, 5, got), 1);
  assert_memory_equal(got, a, sizeof a);
  assert_int_equal(st_gemm_cache_find(g_path, "H100-130100", key, 5, got), 0); /* device */
  assert_int_equal(st_gemm_cache_find(g_path, "H200-130100", key, 4, got), 0); /* key length */
  for (int i = 0; i < 5; i++) {
    long long other[5];
    memcpy(other, key, sizeof key);
    other[i] += 1;
    assert_int_equal(st_gemm_cache_find(g_path, "H200-130100", other, 5, got), 0);
  }
  struct stat st;
  assert_int_equal(stat(g_path, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0644);
  unlink(g_path);
}

static void test_first_wins(void **state) {
  (void)state;
  const long long key[3] = {768, 32768, 3072};
  unsigned long long a[ST_GEMM_ALGO_WORDS], b[ST_GEMM_ALGO_WORDS], got[ST_GEMM_ALGO_WORDS];
  algo_of(a, 1), algo_of(b, 2);
  assert_int_equal(st_gemm_cache_add(g_path, "dev", key, 3, a), 0);
  assert_int_equal(st_gemm_cache_add(g_path, "dev", key, 3, b), 0);
  assert_int_equal(st_gemm_cache_find(g_path, "dev", key, 3, got), 1);
  assert_memory_equal(got, a, sizeof a);
  unlink(g_path);
}

static void test_bad_lines_skipped(void **state) {
  (void)state;
  const long long key[2] = {1, 2};
  unsigned long long a[ST_GEMM_ALGO_WORDS], got[ST_GEMM_ALGO_WORDS];
  algo_of(a, 3);
  FILE *f = fopen(g_path, "w");
  assert_non_null(f);
  fprintf(f, "st-gemm-1 dev 2 1 2 : 1 2 3\n");              /* truncated */
  fprintf(f, "st-gemm-0 dev 2 1 2 : 1 2 3 4 5 6 7 8\n");    /* another format */
  fprintf(f, "st-gemm-1 dev 2 1 2 : 1 2 3 4 5 6 7 8 9\n");  /* trailing word */
  fprintf(f, "st-gemm-1 dev 2 1 2 : 1 2 3 4 5 6 7 zz\n");   /* not hex */
  fprintf(f, "st-gemm-1 dev 2 1 2 1 2 3 4 5 6 7 8\n");      /* no colon */
  for (int i = 0; i < 3000; i++) fputc('x', f);             /* longer than any of ours */
  fputc('\n', f);
  fclose(f);
  assert_int_equal(st_gemm_cache_find(g_path, "dev", key, 2, got), 0);
  assert_int_equal(st_gemm_cache_add(g_path, "dev", key, 2, a), 0);
  assert_int_equal(st_gemm_cache_find(g_path, "dev", key, 2, got), 1);
  assert_memory_equal(got, a, sizeof a);
  unlink(g_path);
}

/* A last line without its newline (a disk that filled mid-line, an
 * editor): an added line starts on a line of its own, so it is found, and
 * a file that ends properly gets no blank line. */
static void test_unfinished_last_line(void **state) {
  (void)state;
  const long long key[2] = {3, 4};
  unsigned long long a[ST_GEMM_ALGO_WORDS], got[ST_GEMM_ALGO_WORDS];
  algo_of(a, 5);
  FILE *f = fopen(g_path, "w");
  assert_non_null(f);
  fputs("st-gemm-1 dev 2 1 2 : 1 2 3", f); /* cut short, no newline */
  fclose(f);
  assert_int_equal(st_gemm_cache_add(g_path, "dev", key, 2, a), 0);
  assert_int_equal(st_gemm_cache_find(g_path, "dev", key, 2, got), 1);
  assert_memory_equal(got, a, sizeof a);
  const long long key2[2] = {5, 6};
  assert_int_equal(st_gemm_cache_add(g_path, "dev", key2, 2, a), 0);
  char text[512];
  f = fopen(g_path, "r");
  assert_non_null(f);
  const size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = 0;
  /* the cut line, then ours on their own lines, no blank one between */
  assert_non_null(strstr(text, "1 2 3\nst-gemm-1 dev 2 3 4 :"));
  assert_null(strstr(text, "\n\n"));
  assert_int_equal(text[n - 1], '\n');
  unlink(g_path);
}

static void test_refusals(void **state) {
  (void)state;
  const long long key[2] = {1, 2};
  unsigned long long a[ST_GEMM_ALGO_WORDS], got[ST_GEMM_ALGO_WORDS];
  algo_of(a, 4);
  errno = 0;
  assert_int_equal(st_gemm_cache_add(g_path, "NVIDIA H200", key, 2, a), -1);
  assert_int_equal(errno, EINVAL);
  assert_int_equal(st_gemm_cache_add(g_path, "dev", key, 0, a), -1);
  assert_int_equal(st_gemm_cache_find(g_path, "dev", key, ST_GEMM_KEY_MAX + 1, got), -1);
  assert_int_equal(access(g_path, F_OK), -1); /* nothing was created */
  char missing[192];
  snprintf(missing, sizeof missing, "%s/no/such/folder/gemm.txt", g_dir);
  errno = 0;
  assert_int_equal(st_gemm_cache_add(missing, "dev", key, 2, a), -1);
  assert_int_equal(errno, ENOENT);
  assert_int_equal(mkdir(g_path, 0755), 0); /* a folder where the file should be */
  assert_int_equal(st_gemm_cache_find(g_path, "dev", key, 2, got), -1);
  assert_int_equal(st_gemm_cache_add(g_path, "dev", key, 2, a), -1);
  rmdir(g_path);
}

static void test_ranks_append_at_once(void **state) {
  (void)state;
  enum { PROCS = 4, LINES = 50 };
  pid_t pid[PROCS];
  for (int p = 0; p < PROCS; p++) {
    pid[p] = fork();
    assert_true(pid[p] >= 0);
    if (pid[p] == 0) {
      for (int i = 0; i < LINES; i++) {
        const long long key[3] = {p, i, 12345678901LL};
        unsigned long long a[ST_GEMM_ALGO_WORDS];
        algo_of(a, (unsigned long long)(p * 1000 + i));
        if (st_gemm_cache_add(g_path, "dev", key, 3, a) != 0) _exit(1);
      }
      _exit(0);
    }
  }
  for (int p = 0; p < PROCS; p++) {
    int status = 0;
    assert_int_equal(waitpid(pid[p], &status, 0), pid[p]);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  for (int p = 0; p < PROCS; p++)
    for (int i = 0; i < LINES; i++) {
      const long long key[3] = {p, i, 12345678901LL};
      unsigned long long a[ST_GEMM_ALGO_WORDS], got[ST_GEMM_ALGO_WORDS];
      algo_of(a, (unsigned long long)(p * 1000 + i));
      assert_int_equal(st_gemm_cache_find(g_path, "dev", key, 3, got), 1);
      assert_memory_equal(got, a, sizeof a);
    }
  unlink(g_path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),        cmocka_unit_test(test_first_wins),
      cmocka_unit_test(test_bad_lines_skipped), cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_ranks_append_at_once), cmocka_unit_test(test_unfinished_last_line),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
