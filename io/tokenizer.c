/* tokenizer.c - the tokenizer handle (see tokenizer.h): which kind, decode,
 * the identity digest and the files a run carries. Encoding of BPE text is
 * io/bpe_gpt2.c, loading io/bpe_load.c. */
#define _XOPEN_SOURCE 700
#include "io/tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/bpe_gpt2.h"
#include "util/error.h"
#include "util/fsutil.h"

/* ---- digest ----------------------------------------------------------------- */

static void put_u32(EVP_MD_CTX *c, uint32_t v) {
  unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                        (unsigned char)(v >> 24)};
  EVP_DigestUpdate(c, b, 4);
}

static void put_str(EVP_MD_CTX *c, const char *s) {
  put_u32(c, (uint32_t)strlen(s));
  EVP_DigestUpdate(c, s, strlen(s));
}

/* The canonical serialisation of tokenizer.h, hashed with SHA-256. */
static int compute_digest(st_tokenizer *t) {
  static const char head[] = "shardtrain tokenizer v1\n", head2[] = "shardtrain tokenizer v2\n",
                    head3[] = "shardtrain tokenizer v3\n";
  /* v3 only with a normalizer, so every digest without one stays as it was */
  const int v3 = t->nfc, v2 = !v3 && !t->is_bytes && t->kind != ST_TOK_GPT2;
  EVP_MD_CTX *c = EVP_MD_CTX_new();
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1;
  if (ok && (v2 || v3)) {
    if (v3) EVP_DigestUpdate(c, head3, sizeof head3 - 1);
    else EVP_DigestUpdate(c, head2, sizeof head2 - 1);
    put_str(c, t->name);
    put_str(c, t->pattern ? t->pattern : "");
    put_u32(c, (uint32_t)t->whole_piece);
    if (v3) put_str(c, "NFC");
  } else if (ok) {
    EVP_DigestUpdate(c, head, sizeof head - 1);
  }
  if (ok) {
    put_u32(c, (uint32_t)t->vocab);
    for (int id = 0; id < t->vocab; id++) {
      put_u32(c, t->tok_len[id]);
      EVP_DigestUpdate(c, t->tok[id], t->tok_len[id]);
    }
    put_u32(c, t->n_merges);
    for (uint32_t r = 0; r < t->n_merges; r++) {
      put_u32(c, t->merge[r][0]);
      put_u32(c, t->merge[r][1]);
    }
    put_u32(c, (uint32_t)t->n_special);
    for (int i = 0; i < t->n_special; i++) put_u32(c, t->special_id[i]);
    ok = EVP_DigestFinal_ex(c, md, &mdlen) == 1;
  }
  EVP_MD_CTX_free(c);
  if (!ok) return st_error_set("OpenSSL SHA-256 failed computing the digest of tokenizer %s", t->path);
  for (unsigned int i = 0; i < mdlen && 2 * i + 2 < sizeof t->digest; i++)
    snprintf(t->digest + 2 * i, 3, "%02x", md[i]);
  return 0;
}

/* ---- load / free --------------------------------------------------------------- */

void st_tokenizer_free(st_tokenizer *t) {
  if (!t) return;
  if (!t->is_bytes) st_bpe_release(t);
  for (int id = 0; t->tok && id < t->vocab; id++) free(t->tok[id]);
  free(t->tok);
  free(t->tok_len);
  free(t->str_slot);
  free(t->merge);
  for (int i = 0; i < t->n_files; i++) free(t->files[i].data);
  free(t);
}

st_tokenizer *st_tokenizer_bytes(void) {
  st_tokenizer *t = calloc(1, sizeof *t);
  if (!t) {
    st_error_set("out of memory making the byte tokenizer");
    return NULL;
  }
  t->is_bytes = 1;
  snprintf(t->name, sizeof t->name, "bytes");
  snprintf(t->path, sizeof t->path, "bytes");
  t->vocab = 256;
  t->eot = -1;
  t->tok = calloc(256, sizeof *t->tok);
  t->tok_len = calloc(256, sizeof *t->tok_len);
  for (int b = 0; t->tok && t->tok_len && b < 256; b++) {
    if (!(t->tok[b] = malloc(1))) break;
    t->tok[b][0] = (unsigned char)b;
    t->tok_len[b] = 1;
    t->byte_id[b] = b;
  }
  if (!t->tok || !t->tok_len || !t->tok[255] || compute_digest(t) != 0) {
    st_tokenizer_free(t);
    st_error_set("out of memory making the byte tokenizer");
    return NULL;
  }
  return t;
}

static const char *const k_presets[] = {"llama3", "qwen", NULL};

static int is_preset(const char *s) {
  for (int i = 0; k_presets[i]; i++)
    if (!strcmp(s, k_presets[i])) return 1;
  return 0;
}

st_tokenizer *st_tokenizer_load_with(const char *path, const char *preset) {
  if (!path || !path[0]) {
    st_error_setc(ST_EXIT_USAGE, "no tokenizer given; pass a directory, a tokenizer.json, a "
                  "tiktoken rank file (FILE:llama3, FILE:qwen) or bytes");
    return NULL;
  }
  if (!preset && (!strcmp(path, "bytes") || !strcmp(path, "byte"))) return st_tokenizer_bytes();
  if (preset && !is_preset(preset)) {
    st_error_setc(ST_EXIT_USAGE, "tokenizer preset \"%s\" (for %s) is unknown; the presets are "
                  "llama3 and qwen", preset, path);
    return NULL;
  }
  st_tokenizer *t = calloc(1, sizeof *t);
  if (!t) {
    st_error_set("out of memory loading tokenizer %s", path);
    return NULL;
  }
  snprintf(t->path, sizeof t->path, "%s", path);
  t->eot = -1;
  if (st_bpe_load(t, path, preset) != 0 || st_bpe_prepare(t) != 0) {
    st_tokenizer_free(t);
    return NULL;
  }
  snprintf(t->name, sizeof t->name, "%s",
           t->kind == ST_TOK_TIKTOKEN ? "tiktoken-bpe" : t->kind == ST_TOK_HF ? "hf-bpe" : "gpt2-bpe");
  if (compute_digest(t) != 0) {
    st_tokenizer_free(t);
    return NULL;
  }
  return t;
}

st_tokenizer *st_tokenizer_load(const char *path) {
  const char *colon = path ? strrchr(path, ':') : NULL;
  if (colon && colon > path && !strchr(colon, '/') && access(path, F_OK) != 0) {
    /* PATH:preset */
    char base[1024];
    snprintf(base, sizeof base, "%.*s", (int)(colon - path), path);
    if (is_preset(colon + 1) || access(base, F_OK) == 0) return st_tokenizer_load_with(base, colon + 1);
  }
  return st_tokenizer_load_with(path, NULL);
}

/* ---- encode / decode ----------------------------------------------------------- */

int st_tokenizer_encode(const st_tokenizer *t, const char *text, size_t len, int allow_special,
                        uint32_t **ids, size_t *n) {
  *ids = NULL;
  *n = 0;
  if (!t->is_bytes)
    return st_bpe_encode(t, (const unsigned char *)text, len, allow_special, ids, n);
  uint32_t *v = malloc((len ? len : 1) * sizeof *v);
  if (!v) return st_error_set("out of memory encoding %zu bytes", len);
  for (size_t i = 0; i < len; i++) v[i] = (unsigned char)text[i];
  *ids = v;
  *n = len;
  return 0;
}

int st_tokenizer_decode(const st_tokenizer *t, const uint32_t *ids, size_t n, char **out,
                        size_t *len) {
  size_t total = 0;
  *out = NULL;
  *len = 0;
  for (size_t i = 0; i < n; i++) {
    if (ids[i] >= (uint32_t)t->vocab)
      return st_error_setc(ST_EXIT_DATA, "token id %u at position %zu is outside the vocabulary "
                           "of %s (%d ids)", ids[i], i, t->path, t->vocab);
    total += t->tok_len[ids[i]];
  }
  char *s = malloc(total + 1);
  if (!s) return st_error_set("out of memory decoding %zu tokens", n);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    memcpy(s + k, t->tok[ids[i]], t->tok_len[ids[i]]);
    k += t->tok_len[ids[i]];
  }
  s[k] = 0;
  *out = s;
  *len = k;
  return 0;
}

const char *st_tokenizer_token_bytes(const st_tokenizer *t, uint32_t id, size_t *len) {
  if (id >= (uint32_t)t->vocab) {
    *len = 0;
    return NULL;
  }
  *len = t->tok_len[id];
  return (const char *)t->tok[id];
}

const char *st_tokenizer_token_text(const st_tokenizer *t, uint32_t id, char *buf, size_t *len) {
  const char *b = st_tokenizer_token_bytes(t, id, len);
  if (b) return b;
  /* "<|id:4294967295|>" is 17 characters: it fits ST_TOKEN_TEXT_BUF */
  *len = (size_t)snprintf(buf, ST_TOKEN_TEXT_BUF, "<|id:%u|>", id);
  return buf;
}

int st_tokenizer_vocab_size(const st_tokenizer *t) { return t->vocab; }
int64_t st_tokenizer_eot(const st_tokenizer *t) { return t->eot; }
const char *st_tokenizer_name(const st_tokenizer *t) { return t->name; }
const char *st_tokenizer_normalizer(const st_tokenizer *t) { return t->nfc ? "NFC" : "none"; }
const char *st_tokenizer_digest(const st_tokenizer *t) { return t->digest; }
const char *st_tokenizer_path(const st_tokenizer *t) { return t->path; }
int st_tokenizer_file_count(const st_tokenizer *t) { return t->n_files; }

int st_tokenizer_file(const st_tokenizer *t, int i, const char **name, const unsigned char **data,
                      size_t *len) {
  if (i < 0 || i >= t->n_files) return -1;
  *name = t->files[i].name;
  *data = t->files[i].data;
  *len = t->files[i].len;
  return 0;
}

/* ---- files -------------------------------------------------------------------- */

/* path.tmp, fsync, rename: a reader sees the old file or the whole new one. */
static int write_bytes_atomic(const char *path, const unsigned char *data, size_t len) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return st_error_set("cannot create %s: %s", tmp, strerror(errno));
  size_t done = 0;
  while (done < len) {
    ssize_t w = write(fd, data + done, len - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    done += (size_t)w;
  }
  int err = errno;
  if (done != len || fsync(fd) != 0) {
    if (done == len) err = errno;
    close(fd);
    unlink(tmp);
    return st_error_set("cannot write %s: %s", tmp, strerror(err));
  }
  close(fd);
  if (rename(tmp, path) != 0) {
    err = errno;
    unlink(tmp);
    return st_error_set("cannot rename %s to %s: %s", tmp, path, strerror(err));
  }
  return 0;
}

int st_tokenizer_write_files(const char *dir, int n, const char *const *names,
                             const unsigned char *const *data, const size_t *lens) {
  if (n == 0) return 0;
  if (st_mkdir_p(dir) != 0) return st_error_prefix("tokenizer directory %s", dir);
  char path[4096];
  for (int i = 0; i < n; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    if (write_bytes_atomic(path, data[i], lens[i]) != 0) return -1;
  }
  st_fsync_dir(dir);
  return 0;
}

int st_tokenizer_write_dir(const st_tokenizer *t, const char *dir) {
  const char *names[ST_TOK_MAX_FILES];
  const unsigned char *data[ST_TOK_MAX_FILES];
  size_t lens[ST_TOK_MAX_FILES];
  for (int i = 0; i < t->n_files; i++) {
    names[i] = t->files[i].name;
    data[i] = t->files[i].data;
    lens[i] = t->files[i].len;
  }
  return st_tokenizer_write_files(dir, t->n_files, names, data, lens);
}
