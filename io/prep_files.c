/* prep_files.c - `shardtrain prep` over several inputs with any tokenizer:
 * gather the documents (files, directories, stdin), tokenize each, join
 * them with the end-of-text token and hand the ids to the writer (prep.c).
 */
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "io/tokenizer.h"
#include "io/tokens.h"
#include "util/error.h"

#define data_error(...) st_error_setc(ST_EXIT_DATA, __VA_ARGS__)

typedef struct {
  char **path;
  int n, cap;
} doc_list;

static int add_doc(doc_list *l, const char *path) {
  if (l->n == l->cap) {
    int cap = l->cap ? l->cap * 2 : 16;
    char **p = realloc(l->path, (size_t)cap * sizeof *p);
    if (!p) return st_error_set("out of memory listing inputs");
    l->path = p;
    l->cap = cap;
  }
  if (!(l->path[l->n] = strdup(path))) return st_error_set("out of memory listing inputs");
  l->n++;
  return 0;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A directory's regular files (not dot files, not recursive), sorted. */
static int add_dir(doc_list *l, const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return data_error("cannot list input directory %s: %s", dir, strerror(errno));
  doc_list here = {0};
  int rc = 0;
  char path[4096];
  for (struct dirent *e; rc == 0 && (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) rc = add_doc(&here, path);
  }
  closedir(d);
  if (rc == 0 && here.n == 0)
    rc = data_error("input directory %s holds no regular files (dot files are skipped); put one "
                    "text file per document in it", dir);
  if (here.n) qsort(here.path, (size_t)here.n, sizeof *here.path, cmp_str);
  for (int i = 0; i < here.n; i++) {
    if (rc == 0) rc = add_doc(l, here.path[i]);
    free(here.path[i]);
  }
  free(here.path);
  return rc;
}

static int read_doc(const char *path, char **text, size_t *len) {
  int fd = strcmp(path, "-") ? open(path, O_RDONLY | O_CLOEXEC) : STDIN_FILENO;
  if (fd < 0) {
    if (errno == ENOENT)
      return data_error("input %s does not exist; pass --input with a text file, a directory of "
                        "them, or - for stdin", path);
    return data_error("cannot open input %s: %s", path, strerror(errno));
  }
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  int rc = buf ? 0 : st_error_set("out of memory reading %s", path);
  while (rc == 0) {
    if (n == cap) {
      char *b = realloc(buf, cap * 2);
      if (!b) {
        rc = st_error_set("out of memory reading %s (%zu bytes so far)", path, n);
        break;
      }
      buf = b;
      cap *= 2;
    }
    ssize_t got = read(fd, buf + n, cap - n);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) rc = data_error("cannot read input %s: %s", path, strerror(errno));
    if (got <= 0) break;
    n += (size_t)got;
  }
  if (fd != STDIN_FILENO) close(fd);
  if (rc != 0) {
    free(buf);
    return -1;
  }
  *text = buf;
  *len = n;
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The byte tokenizer's tokens are the bytes: the documents joined, as
 * they are (one byte per token in memory, not four). */
static int join_docs(const doc_list *docs, unsigned char **all, size_t *n, st_prep_stats *stats) {
  for (int i = 0; i < docs->n; i++) {
    char *text = NULL;
    size_t len = 0;
    if (read_doc(docs->path[i], &text, &len) != 0) return -1;
    unsigned char *p = realloc(*all, *n + len + 1);
    if (!p) {
      free(text);
      return st_error_set("out of memory holding %zu bytes of text", *n + len);
    }
    *all = p;
    if (len) memcpy(*all + *n, text, len);
    *n += len;
    stats->bytes += (int64_t)len;
    free(text);
  }
  stats->documents = docs->n;
  return 0;
}

/* Tokenize the documents and append them, EOT between, to *all. */
static int tokenize_docs(const doc_list *docs, const st_tokenizer *t, uint32_t **all, size_t *n,
                         st_prep_stats *stats) {
  size_t cap = 0;
  const int64_t eot = st_tokenizer_eot(t);
  for (int i = 0; i < docs->n; i++) {
    char *text = NULL;
    size_t len = 0;
    if (read_doc(docs->path[i], &text, &len) != 0) return -1;
    uint32_t *ids = NULL;
    size_t k = 0;
    double t0 = now_s();
    /* document text is ordinary text: a literal "<|endoftext|>" in it stays text */
    int rc = st_tokenizer_encode(t, text, len, 0, &ids, &k);
    stats->seconds += now_s() - t0;
    stats->bytes += (int64_t)len;
    free(text);
    if (rc != 0) return st_error_prefix("tokenizing %s", docs->path[i]);
    size_t need = *n + k + 1;
    if (need > cap || !*all) {
      size_t c = cap ? cap : 1 << 20;
      while (c < need) c *= 2;
      uint32_t *p = realloc(*all, c * sizeof *p);
      if (!p) {
        free(ids);
        return st_error_set("out of memory holding %zu tokens", need);
      }
      *all = p;
      cap = c;
    }
    if (i > 0 && eot >= 0) (*all)[(*n)++] = (uint32_t)eot;
    if (k) memcpy(*all + *n, ids, k * sizeof *ids);
    *n += k;
    free(ids);
  }
  stats->documents = docs->n;
  return 0;
}

int st_prep_text(const char *const *inputs, int n_inputs, const char *tokenizer_path,
                 const char *out_path, double val_fraction, st_prep_stats *stats) {
  memset(stats, 0, sizeof *stats);
  if (st_prep_check_args(out_path, val_fraction) != 0) return -1;
  if (n_inputs < 1)
    return st_error_setc(ST_EXIT_USAGE, "no input given; pass --input TEXT (a file, a directory "
                         "of files, or - for stdin; repeatable)");
  doc_list docs = {0};
  int rc = 0;
  for (int i = 0; i < n_inputs && rc == 0; i++) {
    struct stat st;
    if (strcmp(inputs[i], "-") && stat(inputs[i], &st) == 0 && S_ISDIR(st.st_mode))
      rc = add_dir(&docs, inputs[i]);
    else
      rc = add_doc(&docs, inputs[i]);
  }
  st_tokenizer *t = NULL;
  if (rc == 0 && !(t = st_tokenizer_load(tokenizer_path ? tokenizer_path : "bytes")))
    rc = st_error_prefix("--tokenizer");
  uint32_t *ids = NULL;
  unsigned char *bytes = NULL;
  size_t n = 0;
  const int is_bytes = rc == 0 && !strcmp(st_tokenizer_name(t), "bytes");
  struct stat one;
  if (is_bytes && n_inputs == 1 && docs.n == 1 && !stat(inputs[0], &one) && S_ISREG(one.st_mode)) {
    /* one file: mapped, never copied (prep.c) */
    st_tokenizer_free(t);
    for (int i = 0; i < docs.n; i++) free(docs.path[i]);
    free(docs.path);
    stats->documents = 1;
    rc = st_prep_bytes(inputs[0], out_path, val_fraction, &stats->train_tokens,
                       &stats->val_tokens);
    stats->bytes = stats->train_tokens + stats->val_tokens;
    return rc;
  }
  if (rc == 0) rc = is_bytes ? join_docs(&docs, &bytes, &n, stats)
                             : tokenize_docs(&docs, t, &ids, &n, stats);
  char label[1200];
  snprintf(label, sizeof label, "%s%s", n_inputs == 1 && strcmp(inputs[0], "-") ? inputs[0]
                                        : n_inputs == 1 ? "stdin" : inputs[0],
           n_inputs > 1 ? " (and more)" : "");
  if (rc == 0)
    rc = st_prep_write(out_path, label, ids, bytes, (int64_t)n, t, val_fraction,
                       &stats->train_tokens, &stats->val_tokens);
  free(ids);
  free(bytes);
  st_tokenizer_free(t);
  for (int i = 0; i < docs.n; i++) free(docs.path[i]);
  free(docs.path);
  return rc;
}
