/* token_shards.c - expand a --data spec into shards, open and check them
 * once, and read sequences by (shard, index) (see token_shards.h). */
#define _XOPEN_SOURCE 700
#include "io/token_shards.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"

#define data_error(...) st_error_setc(ST_EXIT_DATA, __VA_ARGS__)

static int is_token_name(const char *name) {
  const char *dot = strrchr(name, '.');
  return dot && (!strcasecmp(dot, ".bin") || !strcasecmp(dot, ".h5") || !strcasecmp(dot, ".hdf5"));
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Append a copy of p to the growing array. 0 or -1. */
static int push(char ***v, int *n, int *cap, const char *p) {
  if (*n == *cap) {
    int nc = *cap ? *cap * 2 : 16;
    char **nv = realloc(*v, (size_t)nc * sizeof *nv);
    if (!nv) return st_error_set("out of memory listing data shards");
    *v = nv;
    *cap = nc;
  }
  if (!((*v)[*n] = strdup(p))) return st_error_set("out of memory listing data shards");
  (*n)++;
  return 0;
}

void st_shards_free_paths(char **paths, int n) {
  for (int i = 0; i < n; i++) free(paths[i]);
  free(paths);
}

static int expand_glob(const char *spec, char ***v, int *n, int *cap) {
  glob_t g;
  memset(&g, 0, sizeof g);
  int r = glob(spec, GLOB_ERR, NULL, &g);
  if (r == GLOB_NOMATCH) {
    globfree(&g);
    return data_error("--data pattern %s matches no file; check the directory and the pattern "
                      "(quote it so the shell does not expand it)", spec);
  }
  if (r != 0) {
    globfree(&g);
    return data_error("--data pattern %s: cannot list its directory (%s)", spec,
                      r == GLOB_NOSPACE ? "out of memory" : "read error");
  }
  int rc = 0;
  for (size_t i = 0; i < g.gl_pathc && !rc; i++) rc = push(v, n, cap, g.gl_pathv[i]); /* sorted */
  globfree(&g);
  return rc;
}

static int expand_dir(const char *dir, char ***v, int *n, int *cap) {
  DIR *d = opendir(dir);
  if (!d) return data_error("cannot list data directory %s: %s", dir, strerror(errno));
  struct dirent *e;
  char p[4096];
  int rc = 0;
  while (!rc && (e = readdir(d))) {
    if (e->d_name[0] == '.' || !is_token_name(e->d_name)) continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    struct stat st;
    if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) rc = push(v, n, cap, p);
  }
  closedir(d);
  if (rc) return -1;
  if (*n == 0)
    return data_error("data directory %s holds no token files (.bin, .h5 or .hdf5); pass the "
                      "directory the shards are in, or a file or pattern", dir);
  qsort(*v, (size_t)*n, sizeof **v, cmp_str);
  return 0;
}

static int expand_list(const char *list, char ***v, int *n, int *cap) {
  FILE *f = fopen(list, "r");
  if (!f) return data_error("cannot read shard list %s: %s", list, strerror(errno));
  char line[4096], p[8192], base[4096];
  snprintf(base, sizeof base, "%s", list);
  char *slash = strrchr(base, '/');
  if (slash) slash[1] = 0;
  else base[0] = 0;
  int no = 0, rc = 0;
  while (!rc && fgets(line, sizeof line, f)) {
    no++;
    size_t k = strlen(line);
    while (k && (line[k - 1] == '\n' || line[k - 1] == '\r' || line[k - 1] == ' ')) line[--k] = 0;
    const char *s = line;
    while (*s == ' ' || *s == '\t') s++;
    if (!*s || *s == '#') continue;
    snprintf(p, sizeof p, "%s%s", *s == '/' ? "" : base, s);
    if (access(p, R_OK) != 0) {
      rc = data_error("shard list %s, line %d: cannot read %s: %s; fix the entry or the file",
                      list, no, p, strerror(errno));
      break;
    }
    rc = push(v, n, cap, p);
  }
  fclose(f);
  if (!rc && *n == 0)
    rc = data_error("shard list %s names no file; write one token file path per line", list);
  return rc;
}

int st_shards_expand(const char *spec, char ***paths, int *n) {
  char **v = NULL;
  int cnt = 0, cap = 0, rc;
  struct stat st;
  *paths = NULL;
  *n = 0;
  if (!spec || !spec[0]) return data_error("no data given; pass --data FILE, DIR, 'PATTERN' or @LIST");
  if (spec[0] == '@') rc = expand_list(spec + 1, &v, &cnt, &cap);
  else if (strpbrk(spec, "*?[")) rc = expand_glob(spec, &v, &cnt, &cap);
  else if (stat(spec, &st) != 0)
    rc = data_error("%s: %s; give an existing token file (`shardtrain prep` makes one), a "
                    "directory of shards, a quoted pattern or @LIST", spec, strerror(errno));
  else if (S_ISDIR(st.st_mode)) rc = expand_dir(spec, &v, &cnt, &cap);
  else rc = push(&v, &cnt, &cap, spec); /* one file: io/tokens.c says what is wrong with it */
  if (rc) {
    st_shards_free_paths(v, cnt);
    return -1;
  }
  *paths = v;
  *n = cnt;
  return 0;
}

/* FNV-1a 64 over buf. */
static uint64_t fnv(uint64_t h, const unsigned char *buf, size_t n) {
  for (size_t i = 0; i < n; i++) h = (h ^ buf[i]) * 1099511628211ull;
  return h;
}

int st_shards_file_digest(const char *path, int64_t *bytes, uint64_t *digest) {
  enum { PIECE = 64 << 10 };
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    int err = errno;
    if (fd >= 0) close(fd);
    return data_error("cannot read data file %s: %s", path, strerror(err));
  }
  unsigned char *buf = malloc(PIECE);
  if (!buf) {
    close(fd);
    return st_error_set("out of memory reading %s", path);
  }
  const int64_t size = (int64_t)st.st_size;
  uint64_t h = fnv(14695981039346656037ull, (const unsigned char *)&size, sizeof size);
  const int64_t at[3] = {0, size / 2 - PIECE / 2, size - PIECE};
  int rc = 0;
  for (int i = 0; i < 3 && !rc; i++) {
    int64_t off = at[i] < 0 ? 0 : at[i];
    size_t want = (size_t)(size - off < PIECE ? size - off : PIECE), got = 0;
    while (got < want) {
      ssize_t r = pread(fd, buf + got, want - got, (off_t)(off + (int64_t)got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        rc = data_error("cannot read data file %s: %s", path, r < 0 ? strerror(errno) : "short read");
        break;
      }
      got += (size_t)r;
    }
    h = fnv(h, buf, got);
  }
  free(buf);
  close(fd);
  *bytes = size;
  *digest = h;
  return rc;
}

static int open_one(st_shard_set *set, st_shard *sh, const char *path, const char *split, int T,
                    int many) {
  int vocab = 0;
  sh->path = strdup(path);
  if (!sh->path) return st_error_set("out of memory opening %s", path);
  const char *dot = strrchr(path, '.');
  sh->hdf5 = dot && strcasecmp(dot, ".bin") != 0;
  sh->src = st_tokens_open(path, split, &vocab);
  if (!sh->src) return -1;
  sh->tokens = st_tokens_count(sh->src);
  if (st_shards_file_digest(path, &sh->bytes, &sh->digest)) return -1;
  /* one file too small is the batch check's to report (train_setup.c), as before */
  if (many && sh->tokens < (int64_t)T + 1)
    return data_error("data shard %s holds %lld tokens, fewer than one sequence (--seq-len %d "
                      "+ 1); drop it from the set or lower --seq-len", path,
                      (long long)sh->tokens, T);
  sh->nseq = sh->tokens > 0 ? (sh->tokens - 1) / T : 0;
  const int w = st_tokens_width(sh->src);
  if (set->n == 0) {
    set->width = w;
    snprintf(set->first_path, sizeof set->first_path, "%s", path);
  } else if (w != set->width) {
    return data_error("data shard %s stores %d-bit tokens, but %s stores %d-bit ones: all "
                      "shards of a run must have one token width (llm.c version 1 = uint16, "
                      "2 = uint32); convert it or drop it from the set", path, 8 * w,
                      set->first_path, 8 * set->width);
  }
  if (vocab > 0 && set->vocab_size > 0 && vocab != set->vocab_size)
    return data_error("data shard %s records a %d-token vocabulary, but the shards before it "
                      "record %d: all shards must come from one tokenizer; drop it or prepare "
                      "it again", path, vocab, set->vocab_size);
  if (vocab > 0) set->vocab_size = vocab;
  return 0;
}

/* HDF5 shards also record which tokenizer wrote them: one for all. (One
 * file's own tokenizer is the trainer's to check against the run's.) */
static int check_tokenizers(const st_shard_set *set) {
  st_tokens_tokenizer first = {0}, t;
  const char *first_path = NULL;
  if (set->n < 2) return 0;
  for (int i = 0; i < set->n; i++) {
    if (!set->s[i].hdf5) continue;
    if (st_tokens_tokenizer_info(set->s[i].path, &t)) return -1;
    if (!t.known) continue;
    if (!first_path) {
      first = t;
      first_path = set->s[i].path;
    } else if (strcmp(t.digest, first.digest) != 0) {
      return data_error("data shard %s was tokenized with %s (digest %.12s), but %s with %s "
                        "(digest %.12s): all shards must come from one tokenizer",
                        set->s[i].path, t.name, t.digest, first_path, first.name, first.digest);
    }
  }
  return 0;
}

int st_shards_open(st_shard_set *set, const char *spec, const char *split, int T) {
  char **paths;
  int n;
  memset(set, 0, sizeof *set);
  if (st_shards_expand(spec, &paths, &n)) return -1;
  set->s = calloc((size_t)n, sizeof *set->s);
  if (!set->s) {
    st_shards_free_paths(paths, n);
    return st_error_set("out of memory opening %d data shards", n);
  }
  int rc = 0;
  for (int i = 0; i < n && !rc; i++) {
    rc = open_one(set, &set->s[i], paths[i], split, T, n > 1);
    set->n = i + 1; /* what close must release, the failed one too */
    if (!rc) {
      set->total_seq += set->s[i].nseq;
      set->total_tokens += set->s[i].tokens;
    }
  }
  st_shards_free_paths(paths, n);
  if (!rc) rc = check_tokenizers(set);
  if (rc) st_shards_close(set);
  return rc;
}

void st_shards_close(st_shard_set *set) {
  for (int i = 0; i < set->n; i++) {
    if (set->s[i].src) st_tokens_close(set->s[i].src);
    free(set->s[i].path);
  }
  free(set->s);
  memset(set, 0, sizeof *set);
}

int st_shards_read_seq(st_shard_set *set, int shard, int64_t seq, int T, int *out) {
  if (shard < 0 || shard >= set->n || seq < 0 || seq >= set->s[shard].nseq)
    return data_error("sequence %lld of shard %d is outside the data set", (long long)seq, shard);
  return st_tokens_read(set->s[shard].src, seq * T, (int64_t)T + 1, out);
}

/* path as a JSON string body (quotes, backslashes and control bytes escaped). */
static size_t json_str(char *out, size_t cap, const char *s) {
  size_t k = 0;
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    char esc[8];
    if (c == '"' || c == '\\') snprintf(esc, sizeof esc, "\\%c", c);
    else if (c < 0x20) snprintf(esc, sizeof esc, "\\u%04x", c);
    else snprintf(esc, sizeof esc, "%c", c);
    for (const char *e = esc; *e; e++) {
      if (k + 1 < cap) out[k] = *e;
      k++;
    }
  }
  if (cap) out[k < cap ? k : cap - 1] = 0;
  return k;
}

char *st_shards_identity_json(const st_shard_set *set) {
  size_t cap = 64;
  for (int i = 0; i < set->n; i++) cap += 6 * strlen(set->s[i].path) + 128;
  char *out = malloc(cap);
  if (!out) return NULL;
  size_t k = 0;
  out[k++] = '[';
  for (int i = 0; i < set->n; i++) {
    const st_shard *sh = &set->s[i];
    k += (size_t)snprintf(out + k, cap - k, "%s{\"path\":\"", i ? "," : "");
    k += json_str(out + k, cap - k, sh->path);
    k += (size_t)snprintf(out + k, cap - k, "\",\"bytes\":%lld,\"tokens\":%lld,\"digest\":\"%016llx\"}",
                          (long long)sh->bytes, (long long)sh->tokens,
                          (unsigned long long)sh->digest);
  }
  snprintf(out + k, cap - k, "]");
  return out;
}
