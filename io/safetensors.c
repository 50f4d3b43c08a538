/* safetensors.c - safetensors reader and writer (see safetensors.h). */
#define _GNU_SOURCE
#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"
#include "util/fsutil.h"

/* A header larger than this is not a model's header but a corrupt length. */
#define ST_SF_MAX_HEADER (100u << 20)

static int sf_err(const char *fmt, const char *a, const char *b, const char *c) {
  return st_error_setc(ST_EXIT_CHECKPOINT, fmt, a, b, c);
}

static int dtype_of(const char *s, st_dtype *d) {
  if (strcmp(s, "F32") == 0) *d = ST_FP32;
  else if (strcmp(s, "BF16") == 0) *d = ST_BF16;
  else if (strcmp(s, "F16") == 0) *d = ST_FP16;
  else return -1;
  return 0;
}

static const char *dtype_str(st_dtype d) {
  return d == ST_BF16 ? "BF16" : d == ST_FP16 ? "F16" : "F32";
}

static int add_file(st_sf_set *set, const char *path, int fd) {
  char(*f)[1200] = realloc(set->files, (size_t)(set->nfiles + 1) * sizeof *f);
  if (!f) return st_error_set("out of host memory reading %s", path);
  set->files = f;
  int *fds = realloc(set->fds, (size_t)(set->nfiles + 1) * sizeof *fds);
  if (!fds) return st_error_set("out of host memory reading %s", path);
  set->fds = fds;
  snprintf(set->files[set->nfiles], sizeof set->files[0], "%s", path);
  set->fds[set->nfiles] = fd;
  set->nfiles++;
  return 0;
}

static st_sf_tensor *new_tensor(st_sf_set *set) {
  if (set->n == set->cap) {
    int cap = set->cap ? 2 * set->cap : 64;
    st_sf_tensor *t = realloc(set->t, (size_t)cap * sizeof *t);
    if (!t) return NULL;
    set->t = t;
    set->cap = cap;
  }
  st_sf_tensor *t = &set->t[set->n];
  memset(t, 0, sizeof *t);
  return t;
}

/* Parse one header entry into t. */
static int parse_entry(const char *path, const cJSON *e, uint64_t data_start, uint64_t fsize,
                       st_sf_tensor *t) {
  const char *nm = e->string;
  if (strlen(nm) >= sizeof t->name)
    return sf_err("%s: tensor name '%.60s...' is too long%s", path, nm, "");
  snprintf(t->name, sizeof t->name, "%s", nm);
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
  const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
  const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
  if (!cJSON_IsObject(e) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off) ||
      cJSON_GetArraySize(off) != 2)
    return sf_err("%s: tensor %s: header entry needs dtype, shape and data_offsets [begin, "
                  "end]%s", path, nm, "");
  if (dtype_of(dt->valuestring, &t->dtype))
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor %s: dtype %s is not supported (F32, "
                         "F16 and BF16 are; convert the model to one of them)", path, nm,
                         dt->valuestring);
  t->ndim = cJSON_GetArraySize(sh);
  if (t->ndim > ST_SF_MAX_DIM)
    return sf_err("%s: tensor %s: more than 8 dimensions%s", path, nm, "");
  /* No tensor holds more elements than its file has bytes: bounding the
   * product by the file size as it grows keeps it from overflowing. */
  t->numel = 1;
  int64_t bound = (int64_t)(fsize < (uint64_t)INT64_MAX ? fsize : (uint64_t)INT64_MAX);
  for (int i = 0; i < t->ndim; i++) {
    const cJSON *d = cJSON_GetArrayItem(sh, i);
    if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble > 1e15)
      return sf_err("%s: tensor %s: shape entries must be non-negative integers%s", path, nm, "");
    t->shape[i] = (int64_t)d->valuedouble;
    if (t->shape[i] > 0 && t->numel > bound / t->shape[i])
      return st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor %s: its shape has more elements than "
                           "the file (%llu bytes) has bytes: corrupt header", path, nm,
                           (unsigned long long)fsize);
    t->numel *= t->shape[i];
  }
  const cJSON *b = cJSON_GetArrayItem(off, 0), *en = cJSON_GetArrayItem(off, 1);
  if (!cJSON_IsNumber(b) || !cJSON_IsNumber(en) || b->valuedouble < 0 || en->valuedouble < 0)
    return sf_err("%s: tensor %s: data_offsets must be two non-negative integers%s", path, nm,
                  "");
  /* compared as doubles first: a value past 2^64 has no uint64_t */
  if (b->valuedouble > (double)fsize || en->valuedouble > (double)fsize)
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor %s: data_offsets [%.0f, %.0f] run past "
                         "the end of the file (%llu bytes): truncated or corrupt", path, nm,
                         b->valuedouble, en->valuedouble, (unsigned long long)fsize);
  uint64_t begin = (uint64_t)b->valuedouble, end = (uint64_t)en->valuedouble;
  if (begin > end)
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor %s: data_offsets begin %llu > end "
                         "%llu", path, nm, (unsigned long long)begin, (unsigned long long)end);
  if (data_start + end > fsize)
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor %s: data ends at byte %llu, past the "
                         "end of the file (%llu bytes): truncated or corrupt", path, nm,
                         (unsigned long long)(data_start + end), (unsigned long long)fsize);
  uint64_t want = (uint64_t)t->numel * st_dtype_size(t->dtype);
  if (end - begin != want)
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor %s: %llu bytes of data, but dtype %s "
                         "x shape needs %llu", path, nm, (unsigned long long)(end - begin),
                         dt->valuestring, (unsigned long long)want);
  t->offset = data_start + begin;
  t->bytes = want;
  return 0;
}

int st_sf_open_file(const char *path, st_sf_set *set) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return st_error_setc(ST_EXIT_CHECKPOINT, "cannot open %s: %s", path, strerror(errno));
  struct stat sb;
  unsigned char len8[8];
  if (fstat(fd, &sb) != 0 || pread(fd, len8, 8, 0) != 8) {
    close(fd);
    return sf_err("%s: shorter than the 8-byte header length: not a safetensors file%s%s", path,
                  "", "");
  }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
  const uint64_t fsize = (uint64_t)sb.st_size;
  if (hlen > fsize - 8 || hlen > ST_SF_MAX_HEADER) {
    close(fd);
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: header length %llu runs past the end of the "
                         "file (%llu bytes): truncated or not a safetensors file", path,
                         (unsigned long long)hlen, (unsigned long long)fsize);
  }
  char *hdr = malloc(hlen + 1);
  if (!hdr || pread(fd, hdr, hlen, 8) != (ssize_t)hlen) {
    free(hdr);
    close(fd);
    return sf_err("%s: cannot read the header%s%s", path, "", "");
  }
  hdr[hlen] = 0;
  cJSON *j = cJSON_Parse(hdr);
  free(hdr);
  if (!cJSON_IsObject(j)) {
    cJSON_Delete(j);
    close(fd);
    return sf_err("%s: header is not a JSON object: not a safetensors file%s%s", path, "", "");
  }
  if (add_file(set, path, fd)) {
    cJSON_Delete(j);
    close(fd);
    return -1;
  }
  const int first = set->n;
  const cJSON *e;
  cJSON_ArrayForEach(e, j) {
    if (strcmp(e->string, "__metadata__") == 0) continue;
    st_sf_tensor *t = new_tensor(set);
    if (!t) {
      cJSON_Delete(j);
      return st_error_set("out of host memory reading %s", path);
    }
    if (parse_entry(path, e, 8 + hlen, fsize, t)) {
      cJSON_Delete(j);
      return -1;
    }
    t->file = set->nfiles - 1;
    for (int i = 0; i < set->n; i++)
      if (strcmp(set->t[i].name, t->name) == 0) {
        cJSON_Delete(j);
        return sf_err("%s: tensor %s appears twice (also in %s)", path, t->name,
                      set->files[set->t[i].file]);
      }
    set->n++;
  }
  (void)first;
  cJSON_Delete(j);
  return 0;
}

int st_sf_open_dir(const char *dir, st_sf_set *set) {
  char p[1400];
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
  if (!st_path_exists(p)) {
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if (!st_path_exists(p))
      return sf_err("%s holds neither model.safetensors nor model.safetensors.index.json (a "
                    "pytorch_model.bin model must be converted to safetensors first)%s%s", dir,
                    "", "");
    return st_sf_open_file(p, set);
  }
  char *text = st_read_text(p, 64L << 20);
  cJSON *j = text ? cJSON_Parse(text) : NULL;
  free(text);
  const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
  if (!cJSON_IsObject(wm)) {
    cJSON_Delete(j);
    return sf_err("%s: not JSON with a weight_map object%s%s", p, "", "");
  }
  const cJSON *e;
  /* Open each file the map names once, in the order they first appear. */
  cJSON_ArrayForEach(e, wm) {
    if (!cJSON_IsString(e) || strchr(e->valuestring, '/')) {
      sf_err("%s: weight_map entry %s must name a file of %s", p, e->string, dir);
      cJSON_Delete(j); /* after the message: it quotes e's name */
      return -1;
    }
    char f[1400];
    snprintf(f, sizeof f, "%s/%s", dir, e->valuestring);
    int seen = 0;
    for (int i = 0; i < set->nfiles; i++) seen |= strcmp(set->files[i], f) == 0;
    if (seen) continue;
    if (!st_path_exists(f)) {
      st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor %s is mapped to %s, which does not exist "
                    "(a shard is missing)", p, e->string, f);
      cJSON_Delete(j);
      return -1;
    }
    if (st_sf_open_file(f, set)) {
      cJSON_Delete(j);
      return -1;
    }
  }
  /* Each tensor where the map says; none that the map does not name. */
  cJSON_ArrayForEach(e, wm) {
    const st_sf_tensor *t = st_sf_find(set, e->string);
    char f[1400];
    snprintf(f, sizeof f, "%s/%s", dir, e->valuestring);
    if (!t || strcmp(set->files[t->file], f) != 0) {
      st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor %s is mapped to %s, which does not hold "
                    "it", p, e->string, f);
      cJSON_Delete(j);
      return -1;
    }
  }
  for (int i = 0; i < set->n; i++)
    if (!cJSON_GetObjectItemCaseSensitive(wm, set->t[i].name)) {
      st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor %s is not in the weight_map of %s",
                    set->files[set->t[i].file], set->t[i].name, p);
      cJSON_Delete(j);
      return -1;
    }
  cJSON_Delete(j);
  return 0;
}

const st_sf_tensor *st_sf_find(const st_sf_set *set, const char *name) {
  for (int i = 0; i < set->n; i++)
    if (strcmp(set->t[i].name, name) == 0) return &set->t[i];
  return NULL;
}

int st_sf_read_f32(const st_sf_set *set, const st_sf_tensor *t, float *out) {
  const int fd = set->fds[t->file];
  void *buf = t->dtype == ST_FP32 ? (void *)out : malloc(t->bytes ? t->bytes : 1);
  if (!buf) return st_error_set("out of host memory reading tensor %s", t->name);
  uint64_t done = 0;
  while (done < t->bytes) {
    ssize_t got = pread(fd, (char *)buf + done, t->bytes - done, (off_t)(t->offset + done));
    if (got <= 0) {
      if (buf != out) free(buf);
      return st_error_setc(ST_EXIT_CHECKPOINT, "%s: tensor %s: read failed: %s",
                           set->files[t->file], t->name, got < 0 ? strerror(errno) : "short");
    }
    done += (uint64_t)got;
  }
  if (buf != out) {
    st_dtype_to_f32(t->dtype, out, buf, (size_t)t->numel);
    free(buf);
  }
  return 0;
}

void st_sf_close(st_sf_set *set) {
  for (int i = 0; i < set->nfiles; i++) close(set->fds[i]);
  free(set->files);
  free(set->fds);
  free(set->t);
  memset(set, 0, sizeof *set);
}

static int cmp_out(const void *a, const void *b) {
  return strcmp((*(const st_sf_out *const *)a)->name, (*(const st_sf_out *const *)b)->name);
}

static int64_t out_bytes(const st_sf_out *t) {
  int64_t n = (int64_t)st_dtype_size(t->dtype);
  for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
  return n;
}

int st_sf_write(const char *path, const st_sf_out *t, int n) {
  const st_sf_out **ord = malloc((size_t)(n ? n : 1) * sizeof *ord);
  if (!ord) return st_error_set("out of host memory writing %s", path);
  for (int i = 0; i < n; i++) ord[i] = &t[i];
  qsort(ord, (size_t)n, sizeof *ord, cmp_out);
  cJSON *h = cJSON_CreateObject();
  cJSON *meta = cJSON_AddObjectToObject(h, "__metadata__");
  cJSON_AddStringToObject(meta, "format", "pt");
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    cJSON *e = cJSON_AddObjectToObject(h, ord[i]->name);
    cJSON_AddStringToObject(e, "dtype", dtype_str(ord[i]->dtype));
    cJSON *sh = cJSON_AddArrayToObject(e, "shape");
    for (int d = 0; d < ord[i]->ndim; d++)
      cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)ord[i]->shape[d]));
    cJSON *o = cJSON_AddArrayToObject(e, "data_offsets");
    cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
    off += out_bytes(ord[i]);
    cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
  }
  char *js = cJSON_PrintUnformatted(h);
  cJSON_Delete(h);
  if (!js) {
    free(ord);
    return st_error_set("out of host memory writing %s", path);
  }
  size_t jl = strlen(js), padded = (jl + 7) / 8 * 8;
  char tmp[1300];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  int ok = f != NULL;
  if (ok) {
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    ok = fwrite(len8, 1, 8, f) == 8 && fwrite(js, 1, jl, f) == jl;
    for (size_t i = jl; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    for (int i = 0; ok && i < n; i++) {
      size_t b = (size_t)out_bytes(ord[i]);
      ok = fwrite(ord[i]->data, 1, b, f) == b;
    }
    ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && ok;
    ok = fclose(f) == 0 && ok;
  }
  free(js);
  free(ord);
  if (!ok || rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return st_error_setc(ST_EXIT_CHECKPOINT, "cannot write %s: %s", path, strerror(e));
  }
  return 0;
}
