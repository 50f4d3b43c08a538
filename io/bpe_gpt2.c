/* bpe_gpt2.c - byte-level BPE encoding: GPT-2's, tokenizer.json's with its
 * own Split pattern (Llama 3, Qwen2) and tiktoken's rank files.
 *
 * Text is cut into pre-tokens by a regular expression (GPT-2's, OpenAI's
 * encoder.py and tiktoken's "gpt2" pattern; or the tokenizer's own), run by
 * PCRE2 with Unicode properties (PCRE2_UTF | PCRE2_UCP) and JIT-compiled
 * where PCRE2 has a JIT. Each pre-token's bytes start as one-byte tokens and
 * are merged pair by pair, lowest rank first (leftmost on ties), as
 * encoder.py's bpe(), HF's BPE model and tiktoken's byte_pair_merge do. A
 * merge list ranks a pair by its line; a rank file ranks a pair by the rank
 * of its concatenation (tiktoken's rule, so every split of a token counts).
 * Ranks live in a hash table keyed by the pair of ids; a direct-mapped cache
 * maps recent short pre-tokens to their ids, since most words of a text
 * repeat. With whole_piece (tiktoken; tokenizer.json's ignore_merges) a
 * pre-token that is a token is taken whole before any merging. A tokenizer
 * with the NFC normalizer (Qwen2's tokenizer.json) puts the text between
 * special tokens in NFC before the regex sees it (io/text_nfc.c).
 *
 * Invalid UTF-8: PCRE2_MATCH_INVALID_UTF makes the regex match only inside
 * valid stretches; the bytes between matches (invalid sequences, or text a
 * pattern from a file leaves unmatched) form one piece, byte-pair encoded
 * like any other, where tiktoken would drop them. Valid text encodes
 * exactly as the oracles do with every pattern they ship (each covers all
 * text); any bytes round-trip through decode.
 */
#define _GNU_SOURCE /* qsort_r */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/bpe_gpt2.h"
#include "io/text_nfc.h"
#include "util/error.h"

/* GPT-2's pattern, with one change: PCRE2 counts U+180E (Mongolian vowel
 * separator) as \s (its \h list keeps Unicode 6.2's White_Space), tiktoken's
 * and HF's regex engines do not (Unicode 6.3 on: a format character). So
 * "space" below is [^\S\x{180e}] and U+180E joins the punctuation class;
 * every other code point is classified alike (tests/e2e/test_tokenizer_parity.py
 * sweeps them all against tiktoken). */
static const char k_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?(?:[^\\s\\p{L}\\p{N}]|\\x{180e})++"
    "|[^\\S\\x{180e}]+(?![\\S\\x{180e}])|[^\\S\\x{180e}]+";

/* A tokenizer's own pattern, with the same change made mechanically: \s
 * outside a class becomes [^\S\x{180e}] and \S [\S\x{180e}]; a class
 * holding \s loses U+180E ([...] becomes (?:(?!\x{180e})[...])) and a
 * negated one gains it ([^...] becomes (?:[^...]|\x{180e})), the reverse
 * for \S. Exact while the rest of a class does not itself name U+180E,
 * as in Llama 3's and Qwen's patterns. malloc'ed; NULL when out of memory. */
static char *rewrite_pattern(const char *p) {
  size_t n = strlen(p), k = 0;
  char *o = malloc(n * 16 + 1); /* each 2-byte \s grows to at most 14 */
  if (!o) return NULL;
  for (size_t i = 0; i < n;) {
    if (p[i] == '\\' && i + 1 < n && (p[i + 1] == 's' || p[i + 1] == 'S')) {
      const char *r = p[i + 1] == 's' ? "[^\\S\\x{180e}]" : "[\\S\\x{180e}]";
      memcpy(o + k, r, strlen(r));
      k += strlen(r);
      i += 2;
    } else if (p[i] == '\\' && i + 1 < n) {
      o[k++] = p[i++];
      o[k++] = p[i++];
    } else if (p[i] == '[') {
      size_t j = i + 1;
      int neg = j < n && p[j] == '^', has_s = 0, has_S = 0;
      if (neg) j++;
      if (j < n && p[j] == ']') j++; /* a leading ] is literal */
      for (; j < n && p[j] != ']'; j++) {
        if (p[j] == '\\' && j + 1 < n) {
          has_s |= p[j + 1] == 's';
          has_S |= p[j + 1] == 'S';
          j++;
        } else if (p[j] == '[' && j + 1 < n && p[j + 1] == ':') { /* [:alpha:] */
          const char *e = strstr(p + j + 2, ":]");
          if (e) j = (size_t)(e - p) + 1;
        }
      }
      size_t end = j < n ? j + 1 : n;
      int adds = (has_s && neg) || (has_S && !neg), drops = (has_s && !neg) || (has_S && neg);
      if (adds == drops) { /* neither, or both: as written */
        memcpy(o + k, p + i, end - i);
        k += end - i;
      } else {
        const char *pre = adds ? "(?:" : "(?:(?!\\x{180e})", *post = adds ? "|\\x{180e})" : ")";
        memcpy(o + k, pre, strlen(pre));
        k += strlen(pre);
        memcpy(o + k, p + i, end - i);
        k += end - i;
        memcpy(o + k, post, strlen(post));
        k += strlen(post);
      }
      i = end;
    } else {
      o[k++] = p[i++];
    }
  }
  o[k] = 0;
  return o;
}

/* ---- cache --------------------------------------------------------------- */

#define CACHE_SLOTS (1u << 16)
#define CACHE_KEY 30
#define CACHE_IDS 12

typedef struct {
  uint64_t h;
  uint8_t klen, nid; /* klen 0 = empty */
  char key[CACHE_KEY];
  uint32_t ids[CACHE_IDS];
} cache_slot;

struct bpe_cache {
  cache_slot slot[CACHE_SLOTS];
};

static uint64_t fnv(const unsigned char *s, size_t n) {
  uint64_t h = 14695981039346656037ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ULL;
  return h;
}

/* ---- pair ranks ------------------------------------------------------------ */

#define NO_RANK UINT32_MAX
/* Pieces longer than this merge through a heap (bpe_long_piece): the plain
 * scan is quicker for words, quadratic for runs of thousands of bytes. */
#define LONG_PIECE 64

static uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}

static uint32_t pair_rank(const st_tokenizer *t, uint32_t a, uint32_t b) {
  uint64_t key = (uint64_t)a << 32 | b;
  for (uint64_t h = mix(key) & t->pair_mask;; h = (h + 1) & t->pair_mask) {
    if (t->pair_rank[h] == 0) return NO_RANK;
    if (t->pair_key[h] == key) return t->pair_rank[h] - 1;
  }
}

static int pair_insert(st_tokenizer *t, uint32_t a, uint32_t b, uint32_t rank) {
  uint64_t key = (uint64_t)a << 32 | b;
  uint64_t h = mix(key) & t->pair_mask;
  while (t->pair_rank[h] && t->pair_key[h] != key) h = (h + 1) & t->pair_mask;
  if (t->pair_rank[h]) return 0; /* a repeated merge: the first (lowest) rank counts */
  t->pair_key[h] = key;
  t->pair_rank[h] = rank + 1;
  return 1;
}

/* A rank file's pairs: every split of every token into two tokens, ranked
 * by the token (tiktoken merges any adjacent pair whose bytes are a token). */
static uint64_t tiktoken_pairs(st_tokenizer *t, int insert) {
  uint64_t count = 0;
  for (int id = 0; id < t->vocab; id++) {
    if (t->is_special[id]) continue;
    const unsigned char *s = t->tok[id];
    for (uint32_t k = 1; k < t->tok_len[id]; k++) {
      int64_t l = st_bpe_lookup(t, s, k), r = l < 0 ? -1 : st_bpe_lookup(t, s + k, t->tok_len[id] - k);
      if (l < 0 || r < 0 || t->is_special[l] || t->is_special[r]) continue;
      count++;
      if (insert) pair_insert(t, (uint32_t)l, (uint32_t)r, (uint32_t)id);
    }
  }
  return count;
}

/* special_by_byte: the special ids grouped by first byte, longest first. */
static int cmp_special(const void *a, const void *b, void *arg) {
  const st_tokenizer *t = arg;
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  if (t->tok[x][0] != t->tok[y][0]) return t->tok[x][0] < t->tok[y][0] ? -1 : 1;
  if (t->tok_len[x] != t->tok_len[y]) return t->tok_len[x] > t->tok_len[y] ? -1 : 1;
  return x < y ? -1 : x > y;
}

static void index_specials(st_tokenizer *t) {
  memcpy(t->special_by_byte, t->special_id, (size_t)t->n_special * sizeof *t->special_id);
  qsort_r(t->special_by_byte, (size_t)t->n_special, sizeof *t->special_by_byte, cmp_special, t);
  int i = 0;
  for (int b = 0; b <= 256; b++) {
    while (i < t->n_special && t->tok[t->special_by_byte[i]][0] < b) i++;
    t->special_start[b] = i;
  }
}

int st_bpe_prepare(st_tokenizer *t) {
  if (!t->is_special) t->is_special = calloc((size_t)t->vocab, 1);
  if (!t->is_special) return st_error_setc(1, "out of memory preparing the tokenizer %s", t->path);
  for (int i = 0; i < t->n_special; i++) t->is_special[t->special_id[i]] = 1;
  index_specials(t);
  uint64_t pairs = t->kind == ST_TOK_TIKTOKEN ? tiktoken_pairs(t, 0) : t->n_merges;
  uint64_t cap = 1;
  while (cap < pairs * 2 + 2) cap <<= 1;
  t->pair_key = calloc(cap, sizeof *t->pair_key);
  t->pair_rank = calloc(cap, sizeof *t->pair_rank);
  t->cache = calloc(1, sizeof *t->cache);
  if (!t->pair_key || !t->pair_rank || !t->cache)
    return st_error_setc(4, "out of memory preparing the tokenizer %s", t->path);
  t->pair_mask = cap - 1;
  if (t->kind == ST_TOK_TIKTOKEN)
    tiktoken_pairs(t, 1);
  else
    for (uint32_t r = 0; r < t->n_merges; r++) pair_insert(t, t->merge[r][0], t->merge[r][1], r);
  int err;
  PCRE2_SIZE off;
  char *own = t->pattern ? rewrite_pattern(t->pattern) : NULL;
  if (t->pattern && !own) return st_error_setc(1, "out of memory preparing the tokenizer %s", t->path);
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)(own ? own : k_pattern), PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, NULL);
  free(own);
  if (!re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    if (t->pattern)
      return st_error_setc(4, "%s: PCRE2 cannot compile the pre-tokenizer pattern \"%.80s\": %s; "
                           "give a pattern PCRE2 reads", t->path, t->pattern, (const char *)msg);
    return st_error_setc(1, "PCRE2 cannot compile GPT-2's pre-tokenizer pattern: %s (at %zu)",
                         (const char *)msg, (size_t)off);
  }
  (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter runs it otherwise */
  t->re = re;
  t->md = pcre2_match_data_create_from_pattern(re, NULL);
  /* Patterns without possessive quantifiers (Llama 3's, Qwen's) backtrack
   * over a whole run of spaces or symbols: PCRE2's default 32 KiB JIT stack
   * and 20 MB interpreter heap end at a few thousand bytes. The stack is
   * address space, committed as used. */
  t->mctx = pcre2_match_context_create(NULL);
  t->jstack = pcre2_jit_stack_create(64 << 10, 1 << 30, NULL);
  if (!t->md || !t->mctx || !t->jstack)
    return st_error_setc(1, "out of memory preparing the tokenizer %s", t->path);
  pcre2_jit_stack_assign((pcre2_match_context *)t->mctx, NULL, t->jstack);
  pcre2_set_heap_limit((pcre2_match_context *)t->mctx, 4u << 20); /* KiB: 4 GiB */
  return 0;
}

void st_bpe_release(st_tokenizer *t) {
  if (t->md) pcre2_match_data_free((pcre2_match_data *)t->md);
  if (t->mctx) pcre2_match_context_free((pcre2_match_context *)t->mctx);
  if (t->jstack) pcre2_jit_stack_free((pcre2_jit_stack *)t->jstack);
  if (t->re) pcre2_code_free((pcre2_code *)t->re);
  free(t->pair_key);
  free(t->pair_rank);
  free(t->cache);
  free(t->is_special);
  free(t->pattern);
}

/* ---- output ---------------------------------------------------------------- */

typedef struct {
  uint32_t *v;
  size_t n, cap;
} ids_out;

static int push(ids_out *o, const uint32_t *ids, size_t k) {
  if (k == 0) return 0;
  if (o->n + k > o->cap) {
    size_t cap = o->cap ? o->cap : 1024;
    while (cap < o->n + k) cap *= 2;
    uint32_t *v = realloc(o->v, cap * sizeof *v);
    if (!v) return st_error_setc(1, "out of memory encoding text (%zu tokens so far)", o->n);
    o->v = v;
    o->cap = cap;
  }
  memcpy(o->v + o->n, ids, k * sizeof *ids);
  o->n += k;
  return 0;
}

/* The token a pair of rank r merges into: a rank file's rank is that id. */
static inline uint32_t merged(const st_tokenizer *t, uint32_t r) {
  return t->kind == ST_TOK_TIKTOKEN ? r : t->merge[r][2];
}

/* ---- one piece ---------------------------------------------------------------- */

/* Merge the bytes of one pre-token into ids (ids has room for n). Returns
 * the number of ids. ranks[i] is the rank of the pair (ids[i], ids[i+1]). */
static size_t bpe_piece(const st_tokenizer *t, const unsigned char *s, size_t n, uint32_t *ids,
                        uint32_t *ranks) {
  for (size_t i = 0; i < n; i++) ids[i] = (uint32_t)t->byte_id[s[i]];
  for (size_t i = 0; i + 1 < n; i++) ranks[i] = pair_rank(t, ids[i], ids[i + 1]);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; i++)
      if (ranks[i] < ranks[best]) best = i;
    uint32_t r = ranks[best];
    if (r == NO_RANK) break;
    ids[best] = merged(t, r);
    memmove(ids + best + 1, ids + best + 2, (n - best - 2) * sizeof *ids);
    /* pairs right of the merge move down by one: n-1 pairs before, n-2 after */
    if (n - best >= 3) memmove(ranks + best + 1, ranks + best + 2, (n - best - 3) * sizeof *ranks);
    n--;
    if (best > 0) ranks[best - 1] = pair_rank(t, ids[best - 1], ids[best]);
    if (best + 1 < n) ranks[best] = pair_rank(t, ids[best], ids[best + 1]);
  }
  return n;
}

/* The same merges for a long piece (a run of thousands of letters, spaces
 * or symbols), in O(n log n) rather than bpe_piece's O(n^2): a min-heap of
 * (rank << 32 | left position) over a linked list of the ids. An entry is
 * current when its left node lives and the pair it starts has that rank
 * (a rank names one pair, so an entry for a pair since changed fails the
 * test); the least current entry is the lowest rank, leftmost, as in
 * bpe_piece. ids has room for n; returns the count or -1 (memory). */
static void heap_push(uint64_t *h, size_t *len, uint64_t v) {
  size_t i = (*len)++;
  while (i > 0 && h[(i - 1) / 2] > v) {
    h[i] = h[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *len) {
  uint64_t top = h[0], v = h[--*len];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *len) break;
    if (c + 1 < *len && h[c + 1] < h[c]) c++;
    if (h[c] >= v) break;
    h[i] = h[c];
    i = c;
  }
  if (*len) h[i] = v;
  return top;
}

static long bpe_long_piece(const st_tokenizer *t, const unsigned char *s, size_t n, uint32_t *ids) {
  int64_t *next = malloc(n * sizeof *next), *prev = malloc(n * sizeof *prev);
  uint64_t *heap = malloc(3 * n * sizeof *heap); /* n-1 pairs, 2 more per merge */
  if (!next || !prev || !heap) {
    free(next);
    free(prev);
    free(heap);
    return -1;
  }
  size_t len = 0;
  for (size_t i = 0; i < n; i++) {
    ids[i] = (uint32_t)t->byte_id[s[i]];
    next[i] = i + 1 < n ? (int64_t)i + 1 : -1;
    prev[i] = (int64_t)i - 1;
  }
  for (size_t i = 0; i + 1 < n; i++) {
    uint32_t r = pair_rank(t, ids[i], ids[i + 1]);
    if (r != NO_RANK) heap_push(heap, &len, (uint64_t)r << 32 | i);
  }
  while (len) {
    uint64_t e = heap_pop(heap, &len);
    uint32_t r = (uint32_t)(e >> 32);
    int64_t i = (int64_t)(e & 0xffffffffu), j = next[i];
    if (prev[i] == -2 || j < 0 || pair_rank(t, ids[i], ids[j]) != r) continue; /* stale */
    ids[i] = merged(t, r);
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    prev[j] = -2; /* gone */
    if (prev[i] >= 0) {
      uint32_t rl = pair_rank(t, ids[prev[i]], ids[i]);
      if (rl != NO_RANK) heap_push(heap, &len, (uint64_t)rl << 32 | (uint64_t)prev[i]);
    }
    if (next[i] >= 0) {
      uint32_t rr = pair_rank(t, ids[i], ids[next[i]]);
      if (rr != NO_RANK) heap_push(heap, &len, (uint64_t)rr << 32 | (uint64_t)i);
    }
  }
  long k = 0;
  for (int64_t i = 0; i >= 0; i = next[i]) ids[k++] = ids[i];
  free(next);
  free(prev);
  free(heap);
  return k;
}

static int encode_piece(const st_tokenizer *t, const unsigned char *s, size_t n, ids_out *o) {
  if (n == 1) {
    uint32_t id = (uint32_t)t->byte_id[s[0]];
    return push(o, &id, 1);
  }
  if (t->whole_piece) {
    int64_t id = st_bpe_lookup(t, s, n);
    if (id >= 0 && !t->is_special[id]) {
      uint32_t one = (uint32_t)id;
      return push(o, &one, 1);
    }
  }
  cache_slot *c = NULL;
  uint64_t h = 0;
  if (n <= CACHE_KEY) {
    h = fnv(s, n);
    c = &t->cache->slot[h & (CACHE_SLOTS - 1)];
    if (c->klen == n && c->h == h && memcmp(c->key, s, n) == 0) return push(o, c->ids, c->nid);
  }
  uint32_t stack_ids[LONG_PIECE], stack_ranks[LONG_PIECE];
  if (n > LONG_PIECE) {
    if (n >> 32) /* heap entries hold a 32-bit position */
      return st_error_setc(4, "a run of %zu bytes without a pre-token boundary is too long to "
                           "encode (at most 4 GiB)", n);
    uint32_t *ids = malloc(n * sizeof *ids);
    long k = ids ? bpe_long_piece(t, s, n, ids) : -1;
    int rc = k < 0 ? st_error_setc(1, "out of memory encoding a piece of %zu bytes", n)
                   : push(o, ids, (size_t)k);
    free(ids);
    return rc;
  }
  uint32_t *ids = stack_ids, *ranks = stack_ranks;
  size_t k = bpe_piece(t, s, n, ids, ranks);
  int rc = push(o, ids, k);
  if (c && k <= CACHE_IDS) {
    c->h = h;
    c->klen = (uint8_t)n;
    c->nid = (uint8_t)k;
    memcpy(c->key, s, n);
    memcpy(c->ids, ids, k * sizeof *ids);
  }
  return rc;
}

/* ---- ordinary text --------------------------------------------------------- */

/* Bytes of the UTF-8 character that starts at s[0] (1 for a byte that
 * starts none), at most n. */
static size_t char_len(const unsigned char *s, size_t n) {
  const size_t k = s[0] < 0xc0 ? 1 : s[0] < 0xe0 ? 2 : s[0] < 0xf0 ? 3 : s[0] < 0xf8 ? 4 : 1;
  return k < n ? k : n;
}

static int encode_ordinary(const st_tokenizer *t, const unsigned char *s, size_t len, ids_out *o) {
  pcre2_code *re = t->re;
  pcre2_match_data *md = t->md;
  /* pos: the first byte not yet encoded; from: where the next match may
   * start. A pattern from a file may match the empty string (an empty
   * alternative, "a||b"): such a match yields no piece, and the character
   * it stood before joins the bytes between matches, which are encoded as
   * one piece like invalid UTF-8, so no byte of the text is ever dropped. */
  size_t pos = 0, from = 0;
  while (pos < len) {
    int m = from < len ? pcre2_match(re, s, len, from, 0, md, (pcre2_match_context *)t->mctx)
                       : PCRE2_ERROR_NOMATCH;
    size_t start = len, end = len;
    if (m > 0) {
      PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
      start = ov[0];
      end = ov[1];
    } else if (m != PCRE2_ERROR_NOMATCH) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(m, msg, sizeof msg);
      return st_error_setc(1, "PCRE2 failed at byte %zu of the text: %s", from, (const char *)msg);
    }
    if (end == start && start < len) {
      from = start + char_len(s + start, len - start);
      continue;
    }
    if (start > pos && encode_piece(t, s + pos, start - pos, o) != 0) return -1; /* gap */
    if (end > start && encode_piece(t, s + start, end - start, o) != 0) return -1;
    pos = from = end;
  }
  return 0;
}

/* Ordinary text through the tokenizer's normalizer first (NFC). Special
 * tokens are matched before it, as Hugging Face matches added tokens with
 * "normalized": false (Qwen2's): the text between two is normalised alone. */
static int encode_normalized(const st_tokenizer *t, const unsigned char *s, size_t len,
                             ids_out *o) {
  if (!t->nfc) return encode_ordinary(t, s, len, o);
  unsigned char *nfc = NULL;
  size_t n = 0;
  if (st_nfc_normalize(s, len, &nfc, &n) != 0) return -1;
  int rc = nfc ? encode_ordinary(t, nfc, n, o) : encode_ordinary(t, s, len, o);
  free(nfc);
  return rc;
}

int st_bpe_encode(const st_tokenizer *t, const unsigned char *text, size_t len, int allow_special,
                  uint32_t **ids, size_t *n) {
  ids_out o = {0};
  size_t pos = 0;
  int rc = 0;
  while (rc == 0 && pos < len) {
    /* the earliest special token (the longest where two start together) */
    size_t at = len, k_len = 0;
    uint32_t k_id = 0;
    for (size_t p = pos; allow_special && t->n_special && p < len && !k_len; p++) {
      for (int i = t->special_start[text[p]]; i < t->special_start[text[p] + 1]; i++) {
        uint32_t id = t->special_by_byte[i];
        if (t->tok_len[id] <= len - p && !memcmp(text + p, t->tok[id], t->tok_len[id])) {
          at = p;
          k_len = t->tok_len[id];
          k_id = id;
          break;
        }
      }
    }
    rc = encode_normalized(t, text + pos, at - pos, &o);
    if (rc == 0 && k_len) rc = push(&o, &k_id, 1);
    pos = at + k_len;
  }
  if (rc != 0) {
    free(o.v);
    return -1;
  }
  if (!o.v) o.v = malloc(sizeof *o.v); /* a valid pointer for empty text */
  if (!o.v) return st_error_setc(1, "out of memory encoding text");
  *ids = o.v;
  *n = o.n;
  return 0;
}
