/* fuzz.h - what the fuzz targets share (tests/fuzz/README.md).
 *
 * Each target defines LLVMFuzzerTestOneInput(data, size): it writes the
 * bytes where a loader expects a file (the loaders take paths, as users
 * give them), calls the loader, and checks the contract every loader
 * states: it either succeeds, or fails with an st_error message (one line:
 * no newline, not empty). A crash, a sanitizer finding or a broken
 * contract aborts. libFuzzer drives the targets (SHARDTRAIN_FUZZ=ON, clang);
 * replay_main.c runs the same functions over committed inputs in ctest. */
#ifndef ST_FUZZ_H
#define ST_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/error.h"
#include "util/fsutil.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char fuzz_dir_name[512];

static inline void fuzz_dir_remove(void) { (void)st_rm_rf(fuzz_dir_name); }

/* A private directory for this process's files (made once, under TMPDIR;
 * removed at a normal exit). */
static inline const char *fuzz_dir(void) {
  char *dir = fuzz_dir_name;
  if (!dir[0]) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof fuzz_dir_name, "%s/st_fuzz_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
      perror("fuzz: mkdtemp");
      abort();
    }
    atexit(fuzz_dir_remove);
  }
  return dir;
}

/* dir/name, in a static buffer per slot (0-3). */
static inline const char *fuzz_path(int slot, const char *name) {
  static char p[4][640];
  snprintf(p[slot], sizeof p[slot], "%s/%s", fuzz_dir(), name);
  return p[slot];
}

/* path as an empty directory: whatever was there removed first. */
static inline void fuzz_fresh_dir(const char *path) {
  if (st_rm_rf(path) || st_mkdir_p(path)) {
    fprintf(stderr, "fuzz: %s\n", st_error_msg());
    abort();
  }
}

/* Write n bytes to path, replacing it. */
static inline void fuzz_write(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
    perror(path);
    abort();
  }
}

/* ST_FUZZ_VERBOSE=1: each call's outcome on stderr (is a seed accepted?). */
static inline void fuzz_accepted(const char *what) {
  if (getenv("ST_FUZZ_VERBOSE")) fprintf(stderr, "fuzz: %s: accepted\n", what);
}

/* The contract on a failure: a message, one line of it. */
static inline void fuzz_check_failure(const char *what) {
  const char *msg = st_error_msg();
  if (getenv("ST_FUZZ_VERBOSE")) fprintf(stderr, "fuzz: %s: refused: %s\n", what, msg);
  if (!msg || !*msg) {
    fprintf(stderr, "fuzz: %s failed without an error message\n", what);
    abort();
  }
  if (strchr(msg, '\n')) {
    fprintf(stderr, "fuzz: %s's error message is more than one line: %s\n", what, msg);
    abort();
  }
}

/* Clear the message before a call, so a stale one cannot pass for it. */
static inline void fuzz_clear_error(void) { st_error_set("%s", ""); }

/* Split data into two parts at the first occurrence of sep (the second
 * part starts after it); without sep the second part is empty. */
static inline void fuzz_split(const uint8_t *data, size_t size, const char *sep,
                              size_t *n1, const uint8_t **p2, size_t *n2) {
  const size_t k = strlen(sep);
  for (size_t i = 0; k && i + k <= size; i++)
    if (memcmp(data + i, sep, k) == 0) {
      *n1 = i;
      *p2 = data + i + k;
      *n2 = size - i - k;
      return;
    }
  *n1 = size;
  *p2 = data + size;
  *n2 = 0;
}

/* A fresh directory dir_name (slot 1) holding two files cut from data at
 * "\n--8<--\n": the part before as first, the rest as second. */
static inline const char *fuzz_two_files(const char *dir_name, const char *first,
                                         const char *second, const uint8_t *data,
                                         size_t size) {
  const uint8_t *b;
  size_t na, nb;
  fuzz_split(data, size, "\n--8<--\n", &na, &b, &nb);
  const char *dir = fuzz_path(1, dir_name);
  fuzz_fresh_dir(dir);
  char path[700];
  snprintf(path, sizeof path, "%s/%s", dir, first);
  fuzz_write(path, data, na);
  snprintf(path, sizeof path, "%s/%s", dir, second);
  fuzz_write(path, b, nb);
  return dir;
}

#endif
