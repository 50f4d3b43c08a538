/* text_nfc.c - NFC of UTF-8 text through ICU's unorm2 (see text_nfc.h).
 *
 * ICU's C API normalises UTF-16 only, so the text goes through it in chunks
 * of about CHUNK bytes: UTF-8 -> UTF-16 (u_strFromUTF8), a quick check that
 * leaves a chunk already in NFC untouched (unorm2_spanQuickCheckYes), else
 * unorm2_normalize and back (u_strToUTF8). Chunks end where ICU reports a
 * normalisation boundary (unorm2_hasBoundaryBefore: nothing before it
 * composes or reorders with what follows), so normalising them one by one
 * is the same as normalising the whole; it bounds the UTF-16 buffers and
 * keeps ICU's int32_t lengths in range for text of any size. The output is
 * built only from the first chunk that changes, so text already in NFC (the
 * usual case) costs the scan and no copy.
 */
#define _XOPEN_SOURCE 700
#include "io/text_nfc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

#ifdef SHARDTRAIN_HAVE_ICU
#include <unicode/unorm2.h>
#include <unicode/ustring.h>
#include <unicode/utf8.h>

#define CHUNK ((size_t)64 << 10)
/* A stretch without a boundary this long (only combining marks) is refused
 * rather than handed to ICU whole: its lengths are int32_t, and 64 MiB
 * stays in range after NFC's at most 3x growth and UTF-8's 3 bytes a unit. */
#define MAX_RUN ((size_t)64 << 20)

typedef struct {
  unsigned char *b;
  size_t n, cap;
} bytes_out;

typedef struct {
  UChar *u;
  int32_t cap;
} u16_buf;

static int out_reserve(bytes_out *o, size_t more) {
  if (o->n + more <= o->cap) return 0;
  size_t cap = o->cap ? o->cap : 4096;
  while (cap < o->n + more) cap *= 2;
  unsigned char *b = realloc(o->b, cap);
  if (!b) return st_error_set("out of memory normalising text to NFC (%zu bytes)", o->n + more);
  o->b = b;
  o->cap = cap;
  return 0;
}

static int out_append(bytes_out *o, const unsigned char *s, size_t n) {
  if (n == 0) return 0;
  if (out_reserve(o, n) != 0) return -1;
  memcpy(o->b + o->n, s, n);
  o->n += n;
  return 0;
}

static int u16_reserve(u16_buf *b, int32_t n) {
  if (n <= b->cap) return 0;
  UChar *u = realloc(b->u, (size_t)n * sizeof *u);
  if (!u) return st_error_set("out of memory normalising text to NFC (%d UTF-16 units)", (int)n);
  b->u = u;
  b->cap = n;
  return 0;
}

/* Code point starting at s[i], i < end, inside a valid stretch. */
static UChar32 cp_at(const unsigned char *s, size_t i, size_t end) {
  UChar32 c;
  U8_NEXT(s, i, end, c);
  return c;
}

/* End of the chunk that starts at a in the valid stretch [a, b): about CHUNK
 * bytes on, at a code point with a normalisation boundary before it. */
static size_t chunk_end(const UNormalizer2 *n2, const unsigned char *s, size_t a, size_t b) {
  if (b - a <= CHUNK) return b;
  for (size_t e = a + CHUNK; e > a; e--)
    if (!U8_IS_TRAIL(s[e]) && unorm2_hasBoundaryBefore(n2, cp_at(s, e, b))) return e;
  for (size_t e = a + CHUNK + 1; e < b; e++)
    if (!U8_IS_TRAIL(s[e]) && unorm2_hasBoundaryBefore(n2, cp_at(s, e, b))) return e;
  return b;
}

/* Code points below U+0300 (UTF-8 lead bytes below 0xCC) are all NFC and
 * none combines with what precedes it (ICU's NFC data: its first code
 * point that is not NFC_QC=Yes is U+0300), so such bytes need no ICU. */
static int has_cc_or_above(const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i] >= 0xCC) return 1;
  return 0;
}

/* NFC of the valid UTF-8 chunk s[0..n) into dst: 1 (dst[0..*dn) holds it),
 * 0 (already NFC) or -1. */
static int normalize_chunk(const UNormalizer2 *n2, const unsigned char *s, size_t n, u16_buf *src,
                           u16_buf *dst, int32_t *dn) {
  if (!has_cc_or_above(s, n)) return 0;
  if (n > MAX_RUN)
    return st_error_set("a run of %zu bytes of combining characters is too long to normalise to "
                        "NFC (at most %zu)", n, MAX_RUN);
  UErrorCode err = U_ZERO_ERROR;
  int32_t n16 = 0;
  if (u16_reserve(src, (int32_t)n) != 0) return -1; /* UTF-16 units <= UTF-8 bytes */
  u_strFromUTF8(src->u, src->cap, &n16, (const char *)s, (int32_t)n, &err);
  if (U_FAILURE(err)) return st_error_set("ICU u_strFromUTF8 failed: %s", u_errorName(err));
  if (unorm2_spanQuickCheckYes(n2, src->u, n16, &err) == n16 && U_SUCCESS(err)) return 0;
  err = U_ZERO_ERROR;
  int32_t k = unorm2_normalize(n2, src->u, n16, dst->u, dst->cap, &err);
  if (err == U_BUFFER_OVERFLOW_ERROR) { /* it said how long: the second call fits */
    err = U_ZERO_ERROR;
    if (u16_reserve(dst, k) != 0) return -1;
    k = unorm2_normalize(n2, src->u, n16, dst->u, dst->cap, &err);
  }
  if (U_FAILURE(err)) return st_error_set("ICU unorm2_normalize failed: %s", u_errorName(err));
  *dn = k;
  return 1;
}

/* Append the UTF-16 u[0..n) as UTF-8 (at most 3 bytes a unit). */
static int append_utf16(bytes_out *o, const UChar *u, int32_t n) {
  if (out_reserve(o, (size_t)n * 3) != 0) return -1;
  UErrorCode err = U_ZERO_ERROR;
  int32_t written = 0;
  size_t room = o->cap - o->n;
  u_strToUTF8((char *)o->b + o->n, room > INT32_MAX ? INT32_MAX : (int32_t)room, &written, u, n,
              &err);
  if (U_FAILURE(err)) return st_error_set("ICU u_strToUTF8 failed: %s", u_errorName(err));
  o->n += (size_t)written;
  return 0;
}

int st_nfc_available(void) { return 1; }

int st_nfc_normalize(const unsigned char *text, size_t len, unsigned char **out, size_t *out_len) {
  *out = NULL;
  *out_len = 0;
  if (!has_cc_or_above(text, len)) return 0;
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2 *n2 = unorm2_getNFCInstance(&err);
  if (U_FAILURE(err)) return st_error_set("ICU has no NFC data: %s", u_errorName(err));
  bytes_out o = {0};
  u16_buf src = {0}, dst = {0};
  size_t kept = 0; /* text[kept..) is not in o yet: o starts at the first change */
  int rc = 0;
  for (size_t pos = 0; rc == 0 && pos < len;) {
    size_t v = pos; /* the valid stretch [pos, v) */
    while (v < len) {
      size_t j = v;
      UChar32 c;
      U8_NEXT(text, j, len, c);
      if (c < 0) break;
      v = j;
    }
    for (size_t a = pos; rc == 0 && a < v;) {
      size_t e = chunk_end(n2, text, a, v);
      int32_t dn = 0;
      int changed = normalize_chunk(n2, text + a, e - a, &src, &dst, &dn);
      if (changed < 0) rc = -1;
      else if (changed && (out_append(&o, text + kept, a - kept) != 0 ||
                           append_utf16(&o, dst.u, dn) != 0))
        rc = -1;
      if (changed) kept = e;
      a = e;
    }
    while (v < len) { /* the ill-formed bytes after it, kept as they are */
      size_t j = v;
      UChar32 c;
      U8_NEXT(text, j, len, c);
      if (c >= 0) break;
      v = j;
    }
    pos = v;
  }
  if (rc == 0 && o.b) rc = out_append(&o, text + kept, len - kept);
  free(src.u);
  free(dst.u);
  if (rc != 0) {
    free(o.b);
    return -1;
  }
  *out = o.b;
  *out_len = o.n;
  return 0;
}

#else /* built without ICU: the loader refuses NFC before it gets here */

int st_nfc_available(void) { return 0; }

int st_nfc_normalize(const unsigned char *text, size_t len, unsigned char **out, size_t *out_len) {
  (void)text;
  (void)len;
  *out = NULL;
  *out_len = 0;
  return st_error_set("NFC normalisation needs ICU, which this build of shardtrain lacks; install "
                      "libicu-dev (scripts/deps.sh) and reconfigure");
}

#endif
