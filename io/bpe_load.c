/* bpe_load.c - read a byte-level BPE vocabulary from disk.
 *
 * Three spellings of GPT-2's: vocab.json + merges.txt (Hugging Face),
 * encoder.json + vocab.bpe (OpenAI: the same formats) and tokenizer.json
 * (Hugging Face tokenizers: model.vocab, model.merges, added_tokens); a
 * tokenizer.json with its own Split pattern (Llama 3, Qwen2: hf-bpe), with
 * an NFC normalizer (Qwen2) where the build has ICU; and
 * the dispatch to tiktoken rank files (io/bpe_tiktoken.c). JSON is
 * parsed with cJSON; token strings are mapped back to bytes through the
 * inverse of GPT-2's bytes_to_unicode table. Every failure is one line naming
 * the file, exit code 4 (data).
 */
#define _XOPEN_SOURCE 700
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/bpe_gpt2.h"
#include "io/text_nfc.h"
#include "util/error.h"

#define data_error(...) st_error_setc(4, __VA_ARGS__)

/* ---- files ---------------------------------------------------------------- */

int st_bpe_read_whole(const char *path, unsigned char **data, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return data_error("cannot open tokenizer file %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    fclose(f);
    return data_error("tokenizer file %s is not a regular file", path);
  }
  size_t n = (size_t)st.st_size;
  unsigned char *buf = malloc(n + 1);
  if (!buf) {
    fclose(f);
    return data_error("out of memory reading tokenizer file %s (%zu bytes)", path, n);
  }
  if (n && fread(buf, 1, n, f) != n) {
    free(buf);
    fclose(f);
    return data_error("cannot read tokenizer file %s: %s", path, strerror(errno));
  }
  fclose(f);
  buf[n] = 0;
  *data = buf;
  *len = n;
  return 0;
}

static int is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int st_bpe_add_file(st_tokenizer *t, const char *path, const char *hf_name) {
  st_tok_file *f = &t->files[t->n_files];
  if (st_bpe_read_whole(path, &f->data, &f->len) != 0) return -1;
  snprintf(f->name, sizeof f->name, "%s", hf_name);
  t->n_files++;
  return 0;
}

/* ---- bytes_to_unicode, inverted --------------------------------------------- */

/* cp -> byte for the 324 code points GPT-2's table uses; -1 elsewhere. */
static void unicode_to_bytes(int map[324]) {
  for (int i = 0; i < 324; i++) map[i] = -1;
  int n = 0;
  for (int b = 0; b < 256; b++) {
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (printable) map[b] = b;
    else map[256 + n++] = b;
  }
}

/* Next code point of UTF-8 s (NUL-terminated); -1 when malformed. */
static long next_cp(const unsigned char **s) {
  const unsigned char *p = *s;
  long cp;
  int more;
  if (p[0] < 0x80) { cp = p[0]; more = 0; }
  else if ((p[0] & 0xE0) == 0xC0) { cp = p[0] & 0x1F; more = 1; }
  else if ((p[0] & 0xF0) == 0xE0) { cp = p[0] & 0x0F; more = 2; }
  else if ((p[0] & 0xF8) == 0xF0) { cp = p[0] & 0x07; more = 3; }
  else return -1;
  for (int i = 1; i <= more; i++) {
    if ((p[i] & 0xC0) != 0x80) return -1;
    cp = cp << 6 | (p[i] & 0x3F);
  }
  *s = p + 1 + more;
  return cp;
}

/* The bytes a vocabulary string stands for, into out (cap >= strlen(s)).
 * raw: the string is the bytes themselves (added tokens of tokenizer.json).
 * Returns the length, or -1 when s uses a code point outside the table. */
static long token_bytes_of(const char *s, int raw, const int map[324], unsigned char *out) {
  if (raw) {
    size_t n = strlen(s);
    memcpy(out, s, n);
    return (long)n;
  }
  const unsigned char *p = (const unsigned char *)s;
  long n = 0;
  while (*p) {
    long cp = next_cp(&p);
    if (cp < 0 || cp >= 324 || map[cp] < 0) return -1;
    out[n++] = (unsigned char)map[cp];
  }
  return n;
}

/* ---- the vocabulary ---------------------------------------------------------- */

static uint64_t fnv(const unsigned char *s, size_t n) {
  uint64_t h = 14695981039346656037ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
  return h;
}

int st_bpe_index(st_tokenizer *t) {
  uint64_t cap = 1;
  while (cap < (uint64_t)t->vocab * 2) cap <<= 1;
  free(t->str_slot);
  t->str_slot = calloc(cap, sizeof *t->str_slot);
  if (!t->str_slot) return data_error("out of memory indexing the vocabulary of %s", t->path);
  t->str_mask = cap - 1;
  for (int id = 0; id < t->vocab; id++) {
    uint64_t h = fnv(t->tok[id], t->tok_len[id]) & t->str_mask;
    while (t->str_slot[h]) h = (h + 1) & t->str_mask;
    t->str_slot[h] = (uint32_t)id + 1;
  }
  return 0;
}

int64_t st_bpe_lookup(const st_tokenizer *t, const unsigned char *s, size_t n) {
  uint64_t h = fnv(s, n) & t->str_mask;
  while (t->str_slot[h]) {
    uint32_t id = t->str_slot[h] - 1;
    if (t->tok_len[id] == n && memcmp(t->tok[id], s, n) == 0) return id;
    h = (h + 1) & t->str_mask;
  }
  return -1;
}

static int set_token(st_tokenizer *t, const char *file, long id, const char *key, int raw,
                     const int map[324]) {
  if (t->tok[id])
    return data_error("%s: id %ld is given to two tokens (\"%s\" and another); each id must "
                      "name one token", file, id, key);
  unsigned char *b = malloc(strlen(key) + 1);
  if (!b) return data_error("out of memory reading %s", file);
  long n = token_bytes_of(key, raw, map, b);
  if (n <= 0) {
    free(b);
    return data_error("%s: token \"%s\" (id %ld) is not in GPT-2's byte-level alphabet; this is "
                      "not a byte-level BPE vocabulary", file, key, id);
  }
  t->tok[id] = b;
  t->tok_len[id] = (uint32_t)n;
  return 0;
}

/* vocab: a JSON object {token: id}. extra: room for added tokens past it. */
static int read_vocab(st_tokenizer *t, const char *file, const cJSON *vocab, int extra) {
  int map[324];
  unicode_to_bytes(map);
  if (!cJSON_IsObject(vocab))
    return data_error("%s: the vocabulary is not a JSON object of token -> id; give GPT-2's "
                      "vocab.json (encoder.json) or a tokenizer.json", file);
  long max_id = -1, count = 0;
  for (const cJSON *e = vocab->child; e; e = e->next) {
    if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > (1 << 24) ||
        e->valuedouble != (double)(long)e->valuedouble)
      return data_error("%s: token \"%s\" has id %s; ids are integers in 0..16777216", file,
                        e->string, cJSON_IsNumber(e) ? "out of range" : "that is not a number");
    if ((long)e->valuedouble > max_id) max_id = (long)e->valuedouble;
    count++;
  }
  if (count == 0) return data_error("%s: the vocabulary is empty", file);
  t->vocab = (int)max_id + 1;
  t->tok = calloc((size_t)t->vocab + (size_t)extra, sizeof *t->tok);
  t->tok_len = calloc((size_t)t->vocab + (size_t)extra, sizeof *t->tok_len);
  if (!t->tok || !t->tok_len) return data_error("out of memory reading %s", file);
  for (const cJSON *e = vocab->child; e; e = e->next)
    if (set_token(t, file, (long)e->valuedouble, e->string, 0, map) != 0) return -1;
  for (int id = 0; id < t->vocab; id++)
    if (!t->tok[id])
      return data_error("%s: no token has id %d (ids run to %ld); the vocabulary has a hole", file,
                        id, max_id);
  for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
  for (int id = 0; id < t->vocab; id++)
    if (t->tok_len[id] == 1 && t->byte_id[t->tok[id][0]] < 0) t->byte_id[t->tok[id][0]] = id;
  for (int b = 0; b < 256; b++)
    if (t->byte_id[b] < 0)
      return data_error("%s: byte 0x%02x has no token of its own; a byte-level BPE vocabulary "
                        "holds all 256", file, b);
  return 0;
}

/* One merge "left right" (line of merges.txt or entry of model.merges). */
static int add_merge(st_tokenizer *t, const char *file, long line, const char *left,
                     const char *right) {
  int map[324];
  unicode_to_bytes(map);
  size_t ln = strlen(left), rn = strlen(right);
  unsigned char *buf = malloc(ln + rn + 1);
  if (!buf) return data_error("out of memory reading %s", file);
  long a = token_bytes_of(left, 0, map, buf), b = a < 0 ? -1 : token_bytes_of(right, 0, map, buf + a);
  int64_t l = a > 0 ? st_bpe_lookup(t, buf, (size_t)a) : -1;
  int64_t r = b > 0 ? st_bpe_lookup(t, buf + a, (size_t)b) : -1;
  int64_t m = (l >= 0 && r >= 0) ? st_bpe_lookup(t, buf, (size_t)(a + b)) : -1;
  free(buf);
  if (l < 0 || r < 0 || m < 0)
    return data_error("%s: merge %ld \"%s %s\" names a token that is not in the vocabulary "
                      "(\"%s\"); the merges and vocabulary files do not belong together", file,
                      line, left, right, l < 0 ? left : r < 0 ? right : "the merged token");
  t->merge[t->n_merges][0] = (uint32_t)l;
  t->merge[t->n_merges][1] = (uint32_t)r;
  t->merge[t->n_merges][2] = (uint32_t)m;
  t->n_merges++;
  return 0;
}

/* merges.txt / vocab.bpe: optional "#version" line, then "left right" lines. */
static int read_merges_txt(st_tokenizer *t, const char *file, char *text) {
  size_t lines = 1;
  for (char *p = text; *p; p++) lines += *p == '\n';
  t->merge = malloc(lines * sizeof *t->merge);
  if (!t->merge) return data_error("out of memory reading %s", file);
  long line = 0;
  char *save = NULL;
  for (char *s = strtok_r(text, "\n", &save); s; s = strtok_r(NULL, "\n", &save)) {
    line++;
    size_t n = strlen(s);
    if (n && s[n - 1] == '\r') s[--n] = 0;
    if (n == 0 || (line == 1 && strncmp(s, "#version", 8) == 0)) continue;
    char *sp = strchr(s, ' ');
    if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' '))
      return data_error("%s: line %ld \"%s\" is not a merge (two tokens separated by one space)",
                        file, line, s);
    *sp = 0;
    if (add_merge(t, file, line, s, sp + 1) != 0) return -1;
  }
  return 0;
}

/* <|endoftext|> is GPT-2's one special token (and Qwen's end of text),
 * <|end_of_text|> Llama 3's: when the vocabulary has one, it is matched as
 * a special token and is the end-of-text id. */
void st_bpe_find_eot(st_tokenizer *t) {
  int64_t id = st_bpe_lookup(t, (const unsigned char *)"<|endoftext|>", 13);
  if (id < 0) id = st_bpe_lookup(t, (const unsigned char *)"<|end_of_text|>", 15);
  t->eot = id;
  if (id < 0) return;
  for (int i = 0; i < t->n_special; i++)
    if (t->special_id[i] == (uint32_t)id) return;
  if (t->n_special < ST_TOK_MAX_SPECIAL) t->special_id[t->n_special++] = (uint32_t)id;
}

static int load_vocab_merges(st_tokenizer *t, const char *vocab_path, const char *merges_path) {
  if (st_bpe_add_file(t, vocab_path, "vocab.json") != 0 || st_bpe_add_file(t, merges_path, "merges.txt") != 0)
    return -1;
  cJSON *v = cJSON_ParseWithLength((const char *)t->files[0].data, t->files[0].len);
  if (!v) return data_error("%s is not valid JSON (near byte %ld); give GPT-2's vocab.json",
                            vocab_path, (long)(cJSON_GetErrorPtr() - (const char *)t->files[0].data));
  int rc = read_vocab(t, vocab_path, v, 0);
  cJSON_Delete(v);
  if (rc != 0 || st_bpe_index(t) != 0) return -1;
  char *text = malloc(t->files[1].len + 1);
  if (!text) return data_error("out of memory reading %s", merges_path);
  memcpy(text, t->files[1].data, t->files[1].len);
  text[t->files[1].len] = 0;
  rc = read_merges_txt(t, merges_path, text);
  free(text);
  if (rc != 0) return -1;
  st_bpe_find_eot(t);
  return 0;
}

/* ---- tokenizer.json ---------------------------------------------------------- */

/* The pre-tokenizer: GPT-2's (ByteLevel with its own regex and no prefix
 * space, alone or inside a Sequence) gives ST_TOK_GPT2; a Sequence of a
 * Split on a regex (Isolated, not inverted) and a ByteLevel without its
 * regex gives ST_TOK_HF with t->pattern set. Anything else is refused. */
static int check_bytelevel(const char *file, const cJSON *pt, int want_regex) {
  const cJSON *type = cJSON_GetObjectItem(pt, "type");
  if (!cJSON_IsString(type) || strcmp(type->valuestring, "ByteLevel"))
    return data_error("%s: pre_tokenizer is %s, not ByteLevel; only byte-level BPE (GPT-2's, or "
                      "a Split regex then ByteLevel as Llama 3's and Qwen2's) is supported", file,
                      cJSON_IsString(type) ? type->valuestring : "missing");
  const cJSON *prefix = cJSON_GetObjectItem(pt, "add_prefix_space");
  const cJSON *regex = cJSON_GetObjectItem(pt, "use_regex");
  if (cJSON_IsTrue(prefix))
    return data_error("%s: the ByteLevel pre_tokenizer has add_prefix_space true; only byte-level "
                      "BPE without a prefix space is supported", file);
  if (want_regex && cJSON_IsFalse(regex))
    return data_error("%s: the ByteLevel pre_tokenizer has use_regex false and no Split before "
                      "it; only GPT-2's regex or a Split regex then ByteLevel is supported", file);
  if (!want_regex && !cJSON_IsFalse(regex))
    return data_error("%s: the ByteLevel pre_tokenizer after the Split has use_regex on; "
                      "two regexes in a row are not supported (Llama 3's and Qwen2's have "
                      "use_regex false)", file);
  return 0;
}

static int check_pretokenizer(st_tokenizer *t, const char *file, const cJSON *pt) {
  const cJSON *type = cJSON_GetObjectItem(pt, "type");
  if (!cJSON_IsString(type) || strcmp(type->valuestring, "Sequence")) {
    t->kind = ST_TOK_GPT2;
    return check_bytelevel(file, pt, 1);
  }
  const cJSON *list = cJSON_GetObjectItem(pt, "pretokenizers");
  int n = cJSON_GetArraySize(list);
  if (n == 1) return check_pretokenizer(t, file, cJSON_GetArrayItem(list, 0));
  const cJSON *split = cJSON_GetArrayItem(list, 0);
  const cJSON *stype = cJSON_GetObjectItem(split, "type");
  if (n != 2 || !cJSON_IsString(stype) || strcmp(stype->valuestring, "Split"))
    return data_error("%s: pre_tokenizer is a Sequence of %d that is not [Split, ByteLevel]; only "
                      "GPT-2's ByteLevel or a Split regex then ByteLevel (Llama 3, Qwen2) is "
                      "supported", file, n);
  const cJSON *re = cJSON_GetObjectItem(cJSON_GetObjectItem(split, "pattern"), "Regex");
  const cJSON *behavior = cJSON_GetObjectItem(split, "behavior");
  if (!cJSON_IsString(re) || !re->valuestring[0])
    return data_error("%s: the Split pre_tokenizer has no pattern.Regex (a String pattern is not "
                      "supported); give a tokenizer.json with a Split regex", file);
  if (!cJSON_IsString(behavior) || strcmp(behavior->valuestring, "Isolated") ||
      cJSON_IsTrue(cJSON_GetObjectItem(split, "invert")))
    return data_error("%s: the Split pre_tokenizer has behavior %s%s; only Isolated, not "
                      "inverted (each match one pre-token), is supported", file,
                      cJSON_IsString(behavior) ? behavior->valuestring : "missing",
                      cJSON_IsTrue(cJSON_GetObjectItem(split, "invert")) ? " inverted" : "");
  if (check_bytelevel(file, cJSON_GetArrayItem(list, 1), 0) != 0) return -1;
  t->kind = ST_TOK_HF;
  if (!(t->pattern = strdup(re->valuestring))) return data_error("out of memory reading %s", file);
  return 0;
}

/* The first normalizer kind in norm that is not NFC (inside Sequences), or
 * NULL when all are; *any: 1 when norm holds an NFC. */
static const char *non_nfc_kind(const cJSON *norm, int *any) {
  const cJSON *type = cJSON_GetObjectItem(norm, "type");
  if (!cJSON_IsString(type)) return "unknown type";
  if (!strcmp(type->valuestring, "NFC")) {
    *any = 1;
    return NULL;
  }
  if (strcmp(type->valuestring, "Sequence")) return type->valuestring;
  const cJSON *list = cJSON_GetObjectItem(norm, "normalizers");
  if (!cJSON_IsArray(list)) return "Sequence without a normalizers list";
  for (const cJSON *e = list->child; e; e = e->next) {
    const char *bad = non_nfc_kind(e, any);
    if (bad) return bad;
  }
  return NULL;
}

int st_bpe_read_normalizer(st_tokenizer *t, const char *file, const cJSON *j) {
  const cJSON *norm = cJSON_GetObjectItem(j, "normalizer");
  int any = 0;
  const char *bad = norm && !cJSON_IsNull(norm) ? non_nfc_kind(norm, &any) : NULL;
  if (bad)
    return data_error("%s: has a normalizer (%s); only NFC (alone or in a Sequence of NFC, as "
                      "Qwen2's) is applied, give a tokenizer.json without the others", file, bad);
  if (any && !st_nfc_available())
    return data_error("%s: has a normalizer (NFC), and this build of shardtrain lacks ICU to "
                      "apply it; install libicu-dev (apt-get install libicu-dev, or "
                      "scripts/deps.sh) and rebuild (CMake finds it by pkg-config icu-uc)", file);
  const cJSON *added = cJSON_GetObjectItem(j, "added_tokens");
  for (const cJSON *e = any && added ? added->child : NULL; e; e = e->next)
    if (cJSON_IsTrue(cJSON_GetObjectItem(e, "normalized")))
      return data_error("%s: added token \"%s\" has \"normalized\": true under the NFC normalizer; "
                        "only added tokens matched before normalising (false, as Qwen2's) are "
                        "supported", file,
                        cJSON_IsString(cJSON_GetObjectItem(e, "content"))
                            ? cJSON_GetObjectItem(e, "content")->valuestring : "?");
  t->nfc = any;
  return 0;
}

/* Options that would change the ids GPT-2's algorithm gives: refused, not
 * ignored (a normalizer other than NFC, word suffixes, ignore_merges as in
 * Llama 3). */
static int check_model_options(st_tokenizer *t, const char *file, const cJSON *j,
                               const cJSON *model) {
  if (st_bpe_read_normalizer(t, file, j) != 0) return -1;
  static const char *const strs[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (int i = 0; i < 2; i++) {
    const cJSON *v = cJSON_GetObjectItem(model, strs[i]);
    if (cJSON_IsString(v) && v->valuestring[0])
      return data_error("%s: model.%s is \"%s\"; only GPT-2-style BPE (none) is supported", file,
                        strs[i], v->valuestring);
  }
  if (cJSON_IsTrue(cJSON_GetObjectItem(model, "byte_fallback")))
    return data_error("%s: model.byte_fallback is true; only byte-level BPE (false) is supported",
                      file);
  /* Llama 3's: a pre-token that is in the vocabulary is one token (tiktoken's rule) */
  t->whole_piece = cJSON_IsTrue(cJSON_GetObjectItem(model, "ignore_merges"));
  if (t->whole_piece && t->kind == ST_TOK_GPT2)
    return data_error("%s: model.ignore_merges is true with GPT-2's pre-tokenizer; GPT-2's BPE "
                      "has it false", file);
  return 0;
}

static int read_hf_merges(st_tokenizer *t, const char *file, const cJSON *merges) {
  int n = cJSON_GetArraySize(merges);
  if (!cJSON_IsArray(merges))
    return data_error("%s: model.merges is missing or not an array", file);
  t->merge = malloc(((size_t)n + 1) * sizeof *t->merge);
  if (!t->merge) return data_error("out of memory reading %s", file);
  long i = 0;
  char pair[1024];
  for (const cJSON *e = merges->child; e; e = e->next) {
    i++;
    if (cJSON_IsString(e)) { /* "left right" */
      snprintf(pair, sizeof pair, "%s", e->valuestring);
      char *sp = strchr(pair, ' ');
      if (!sp || sp == pair || !sp[1])
        return data_error("%s: model.merges[%ld] \"%s\" is not two tokens separated by a space",
                          file, i - 1, e->valuestring);
      *sp = 0;
      if (add_merge(t, file, i, pair, sp + 1) != 0) return -1;
    } else if (cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
               cJSON_IsString(cJSON_GetArrayItem(e, 1))) { /* ["left", "right"] */
      if (add_merge(t, file, i, cJSON_GetArrayItem(e, 0)->valuestring,
                    cJSON_GetArrayItem(e, 1)->valuestring) != 0)
        return -1;
    } else {
      return data_error("%s: model.merges[%ld] is neither \"a b\" nor [\"a\", \"b\"]", file, i - 1);
    }
  }
  return 0;
}

/* added_tokens: [{"id": N, "content": "...", ...}]: matched as special
 * tokens; an id past the vocabulary extends it. */
static int read_added(st_tokenizer *t, const char *file, const cJSON *added) {
  int map[324];
  unicode_to_bytes(map);
  for (const cJSON *e = added ? added->child : NULL; e; e = e->next) {
    const cJSON *id = cJSON_GetObjectItem(e, "id"), *content = cJSON_GetObjectItem(e, "content");
    if (!cJSON_IsNumber(id) || !cJSON_IsString(content) || id->valuedouble < 0 ||
        !content->valuestring[0])
      return data_error("%s: an entry of added_tokens lacks an integer id or a content string",
                        file);
    long k = (long)id->valuedouble;
    size_t n = strlen(content->valuestring);
    if (k < t->vocab) {
      if (t->tok_len[k] != n || memcmp(t->tok[k], content->valuestring, n))
        return data_error("%s: added token \"%s\" has id %ld, which the vocabulary gives to "
                          "another token", file, content->valuestring, k);
    } else if (k == t->vocab) {
      if (set_token(t, file, k, content->valuestring, 1, map) != 0) return -1;
      t->vocab++;
    } else {
      return data_error("%s: added token \"%s\" has id %ld, past the vocabulary's end (%d); ids "
                        "must follow on", file, content->valuestring, k, t->vocab);
    }
    if (t->n_special == ST_TOK_MAX_SPECIAL)
      return data_error("%s: more than %d added tokens", file, ST_TOK_MAX_SPECIAL);
    t->special_id[t->n_special++] = (uint32_t)k;
  }
  return 0;
}

/* A tokenizer.json whose pre-tokenizer has a Split (hf-bpe) or that has a
 * normalizer: chosen over vocab.json + merges.txt beside it, which hold no
 * pattern and no normalizer (Qwen2's directories have all three). */
static int json_needs_itself(const cJSON *j) {
  const cJSON *pt = cJSON_GetObjectItem(j, "pre_tokenizer");
  const cJSON *type = cJSON_GetObjectItem(pt, "type");
  const cJSON *norm = cJSON_GetObjectItem(j, "normalizer");
  return (cJSON_IsString(type) && !strcmp(type->valuestring, "Sequence") &&
          cJSON_GetArraySize(cJSON_GetObjectItem(pt, "pretokenizers")) > 1) ||
         (norm && !cJSON_IsNull(norm));
}

/* Load the tokenizer.json at path, read and parsed once. With
 * only_if_needed (a directory that may also hold vocab.json + merges.txt),
 * load it only when it parses and json_needs_itself; *used says whether it
 * was. 0, or -1 with st_error (ST_EXIT_DATA). */
static int load_tokenizer_json_if(st_tokenizer *t, const char *path, int only_if_needed,
                                  int *used) {
  *used = 1;
  if (st_bpe_add_file(t, path, "tokenizer.json") != 0) return -1;
  st_tok_file *f = &t->files[t->n_files - 1];
  cJSON *j = cJSON_ParseWithLength((const char *)f->data, f->len);
  if (!j && !only_if_needed)
    return data_error("%s is not valid JSON; give a Hugging Face tokenizer.json", path);
  if (only_if_needed && (!j || !json_needs_itself(j))) { /* vocab.json + merges.txt serve */
    cJSON_Delete(j);
    free(f->data);
    memset(f, 0, sizeof *f);
    t->n_files--;
    *used = 0;
    return 0;
  }
  const cJSON *model = cJSON_GetObjectItem(j, "model");
  const cJSON *type = cJSON_GetObjectItem(model, "type");
  const cJSON *added = cJSON_GetObjectItem(j, "added_tokens");
  int rc = 0;
  if (!cJSON_IsObject(model))
    rc = data_error("%s: no \"model\" object; give a Hugging Face tokenizer.json", path);
  else if (cJSON_IsString(type) && strcmp(type->valuestring, "BPE"))
    rc = data_error("%s: model type is %s; only BPE is supported", path, type->valuestring);
  else
    rc = check_pretokenizer(t, path, cJSON_GetObjectItem(j, "pre_tokenizer"));
  if (rc == 0) rc = check_model_options(t, path, j, model);
  if (rc == 0) rc = read_vocab(t, path, cJSON_GetObjectItem(model, "vocab"), cJSON_GetArraySize(added));
  if (rc == 0) rc = read_added(t, path, added);
  if (rc == 0) rc = st_bpe_index(t);
  if (rc == 0) rc = read_hf_merges(t, path, cJSON_GetObjectItem(model, "merges"));
  cJSON_Delete(j);
  if (rc != 0) return -1;
  if (t->kind == ST_TOK_GPT2)
    t->eot = st_bpe_lookup(t, (const unsigned char *)"<|endoftext|>", 13);
  else
    st_bpe_find_eot(t);
  return 0;
}

static int load_tokenizer_json(st_tokenizer *t, const char *path) {
  int used;
  return load_tokenizer_json_if(t, path, 0, &used);
}

/* ---- dispatch on what path holds ------------------------------------------- */

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

/* The rank file of a directory: tokenizer.model, else the first *.tiktoken. */
static int find_rank_file(const char *dir, char *out, size_t cap) {
  snprintf(out, cap, "%s/tokenizer.model", dir);
  if (is_file(out) && st_tiktoken_sniff(out)) return 1;
  DIR *d = opendir(dir);
  if (!d) return 0;
  char best[256] = "";
  for (struct dirent *e; (e = readdir(d));) {
    size_t n = strlen(e->d_name);
    if (n > 9 && n < sizeof best && !strcmp(e->d_name + n - 9, ".tiktoken") &&
        (!best[0] || strcmp(e->d_name, best) < 0))
      snprintf(best, sizeof best, "%s", e->d_name);
  }
  closedir(d);
  if (!best[0]) return 0;
  snprintf(out, cap, "%s/%s", dir, best);
  return 1;
}

static int load_file(st_tokenizer *t, const char *path, const char *preset) {
  if (st_tiktoken_sniff(path)) return st_tiktoken_load(t, path, preset);
  if (preset)
    return data_error("%s is not a tiktoken rank file (base64 token, space, rank per line); the "
                      "preset :%s applies to rank files only, drop it", path, preset);
  if (!strcmp(base_name(path), "shardtrain_tiktoken.json")) return st_tiktoken_load_config(t, path);
  return load_tokenizer_json(t, path);
}

int st_bpe_load(st_tokenizer *t, const char *path, const char *preset) {
  char a[1200], b[1200];
  if (is_file(path)) return load_file(t, path, preset);
  if (!is_dir(path))
    return data_error("tokenizer %s does not exist; give a directory with vocab.json + merges.txt "
                      "(or encoder.json + vocab.bpe, or tokenizer.json), a tokenizer.json file, a "
                      "tiktoken rank file (FILE:llama3, FILE:qwen) or \"bytes\" "
                      "(scripts/get_gpt2_tokenizer.sh fetches GPT-2's)", path);
  if (!preset) {
    snprintf(a, sizeof a, "%s/shardtrain_tiktoken.json", path);
    if (is_file(a)) return st_tiktoken_load_config(t, a);
    snprintf(a, sizeof a, "%s/tokenizer.json", path);
    int used = 0;
    if (is_file(a) && load_tokenizer_json_if(t, a, 1, &used) != 0) return -1;
    if (used) return 0;
    static const char *const pairs[2][2] = {{"vocab.json", "merges.txt"},
                                            {"encoder.json", "vocab.bpe"}};
    for (int i = 0; i < 2; i++) {
      snprintf(a, sizeof a, "%s/%s", path, pairs[i][0]);
      snprintf(b, sizeof b, "%s/%s", path, pairs[i][1]);
      if (is_file(a) && is_file(b)) return load_vocab_merges(t, a, b);
      if (is_file(a))
        return data_error("tokenizer directory %s has %s but no %s; the BPE merges are needed too",
                          path, pairs[i][0], pairs[i][1]);
    }
    snprintf(a, sizeof a, "%s/tokenizer.json", path);
    if (is_file(a)) return load_tokenizer_json(t, a);
  }
  if (find_rank_file(path, a, sizeof a)) return st_tiktoken_load(t, a, preset);
  if (preset)
    return data_error("tokenizer directory %s holds no tiktoken rank file (tokenizer.model or "
                      "*.tiktoken) for the preset :%s", path, preset);
  return data_error("tokenizer directory %s holds none of vocab.json + merges.txt, encoder.json + "
                    "vocab.bpe, tokenizer.json, a tiktoken rank file (tokenizer.model, *.tiktoken): "
                    "copy the model's tokenizer files there, or give --tokenizer bytes for byte "
                    "tokens", path);
}
