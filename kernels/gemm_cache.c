/* gemm_cache.c - the file of timed GEMM algorithm choices (gemm_cache.h). */
#include "kernels/gemm_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAGIC "st-gemm-1"

/* 1 when line is MAGIC DEVICE NKEY KEY... : ALGO... for this device and key,
 * with algo filled; 0 otherwise (another problem, or a line that does not
 * parse). */
static int line_matches(char *line, const char *device, const long long *key, int nkey,
                        unsigned long long *algo) {
  char *save = NULL;
  const char *tok = strtok_r(line, " \t\n", &save);
  if (!tok || strcmp(tok, MAGIC) != 0) return 0;
  tok = strtok_r(NULL, " \t\n", &save);
  if (!tok || strcmp(tok, device) != 0) return 0;
  tok = strtok_r(NULL, " \t\n", &save);
  char *end;
  if (!tok || strtol(tok, &end, 10) != nkey || *end) return 0;
  for (int i = 0; i < nkey; i++) {
    tok = strtok_r(NULL, " \t\n", &save);
    if (!tok) return 0;
    errno = 0;
    long long v = strtoll(tok, &end, 10);
    if (errno || *end || v != key[i]) return 0;
  }
  tok = strtok_r(NULL, " \t\n", &save);
  if (!tok || strcmp(tok, ":") != 0) return 0;
  unsigned long long words[ST_GEMM_ALGO_WORDS];
  for (int i = 0; i < ST_GEMM_ALGO_WORDS; i++) {
    tok = strtok_r(NULL, " \t\n", &save);
    if (!tok) return 0;
    errno = 0;
    words[i] = strtoull(tok, &end, 16);
    if (errno || *end || end == tok) return 0;
  }
  if (strtok_r(NULL, " \t\n", &save)) return 0; /* trailing words: not ours */
  memcpy(algo, words, sizeof words);
  return 1;
}

int st_gemm_cache_find(const char *path, const char *device, const long long *key, int nkey,
                       unsigned long long algo[ST_GEMM_ALGO_WORDS]) {
  if (nkey < 1 || nkey > ST_GEMM_KEY_MAX) {
    errno = EINVAL;
    return -1;
  }
  FILE *f = fopen(path, "r");
  if (!f) return errno == ENOENT ? 0 : -1;
  char line[1024];
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) {
    const size_t n = strlen(line);
    if (n == sizeof line - 1 && line[n - 1] != '\n') { /* longer than any of ours: skip it */
      int ch;
      while ((ch = fgetc(f)) != EOF && ch != '\n') {
      }
      continue;
    }
    found = line_matches(line, device, key, nkey, algo);
  }
  const int err = ferror(f);
  fclose(f);
  if (!found && err) {
    errno = EIO;
    return -1;
  }
  return found;
}

int st_gemm_cache_add(const char *path, const char *device, const long long *key, int nkey,
                      const unsigned long long algo[ST_GEMM_ALGO_WORDS]) {
  if (nkey < 1 || nkey > ST_GEMM_KEY_MAX || strpbrk(device, " \t\n") || !device[0]) {
    errno = EINVAL;
    return -1;
  }
  /* buf[0] is a newline kept in reserve: sent only when the file's last
   * line is unfinished (a full disk, an editor), so ours is not glued to
   * it and lost (found by tests/fuzz/fuzz_gemm_cache.c) */
  enum { CAP = 1024 }; /* what line holds; the reader's line is as long */
  char buf[CAP + 1], *line = buf + 1;
  buf[0] = '\n';
  size_t n = (size_t)snprintf(line, CAP, MAGIC " %s %d", device, nkey);
  for (int i = 0; i < nkey && n < CAP; i++)
    n += (size_t)snprintf(line + n, CAP - n, " %lld", key[i]);
  if (n < CAP) n += (size_t)snprintf(line + n, CAP - n, " :");
  for (int i = 0; i < ST_GEMM_ALGO_WORDS && n < CAP; i++)
    n += (size_t)snprintf(line + n, CAP - n, " %llx", algo[i]);
  if (n + 1 >= CAP) {
    errno = ENAMETOOLONG;
    return -1;
  }
  line[n++] = '\n';
  const int fd = open(path, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  struct stat st;
  char last = '\n';
  if (fstat(fd, &st) == 0 && st.st_size > 0 && pread(fd, &last, 1, st.st_size - 1) != 1)
    last = '\n';
  const char *out = line;
  if (last != '\n') {
    out = buf;
    n++;
  }
  const ssize_t w = write(fd, out, n);
  const int werr = errno;
  if (close(fd) != 0 && w == (ssize_t)n) return -1;
  if (w != (ssize_t)n) {
    errno = w < 0 ? werr : ENOSPC;
    return -1;
  }
  return 0;
}
