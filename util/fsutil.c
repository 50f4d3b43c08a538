/* fsutil.c - filesystem helpers (see fsutil.h). */
#define _XOPEN_SOURCE 700
#include "util/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"

int st_mkdir_p(const char *dir) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s", dir) >= (int)sizeof tmp)
    return st_error_set("path too long: %s", dir);
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
      return st_error_set("cannot create directory %s: %s", tmp, strerror(errno));
    *p = '/';
  }
  if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
    return st_error_set("cannot create directory %s: %s", tmp, strerror(errno));
  if (!st_is_dir(tmp)) return st_error_set("%s exists and is not a directory", tmp);
  return 0;
}

int st_path_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

int st_is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int st_fsync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return st_error_set("cannot open directory %s: %s", dir, strerror(errno));
  fsync(fd);
  close(fd);
  return 0;
}

int st_write_file_atomic(const char *path, const char *text) {
  char tmp[4200], dir[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return st_error_set("cannot write %s: %s", tmp, strerror(errno));
  size_t n = strlen(text);
  if (fwrite(text, 1, n, f) != n || fflush(f) != 0 || fsync(fileno(f)) != 0) {
    fclose(f);
    unlink(tmp);
    return st_error_set("cannot write %s: %s", tmp, strerror(errno));
  }
  fclose(f);
  if (rename(tmp, path) != 0) {
    unlink(tmp);
    return st_error_set("cannot rename %s to %s: %s", tmp, path, strerror(errno));
  }
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash) {
    *slash = 0;
    st_fsync_dir(dir[0] ? dir : "/");
  }
  return 0;
}

int st_read_small_file(const char *path, char *buf, int cap) {
  FILE *f = fopen(path, "r");
  if (!f) return st_error_set("cannot read %s: %s", path, strerror(errno));
  size_t n = fread(buf, 1, (size_t)cap - 1, f);
  fclose(f);
  buf[n] = 0;
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = 0;
  return 0;
}

char *st_read_text(const char *path, long max) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = NULL;
  if (fseek(f, 0, SEEK_END) == 0) {
    long n = ftell(f);
    if (n >= 0 && n < max && fseek(f, 0, SEEK_SET) == 0) {
      buf = malloc((size_t)n + 1);
      if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
      }
      if (buf) buf[n] = 0;
    }
  }
  fclose(f);
  return buf;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb; (void)flag; (void)ftw;
  return remove(path);
}

int st_rm_rf(const char *dir) {
  if (!st_path_exists(dir)) return 0;
  if (nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS) != 0)
    return st_error_set("cannot remove %s: %s", dir, strerror(errno));
  return 0;
}
