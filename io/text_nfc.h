/* text_nfc.h - Unicode NFC (canonical composition, UAX #15) of UTF-8 text,
 * the normalizer a tokenizer.json may ask for (Qwen2's {"type": "NFC"}),
 * applied before pre-tokenization. Runs through ICU (unorm2, Debian
 * libicu-dev), which is optional: a build configured without it (CMake
 * finds it by pkg-config icu-uc) has st_nfc_available() == 0 and the
 * tokenizer loader refuses NFC tokenizers, naming the package.
 */
#ifndef ST_TEXT_NFC_H
#define ST_TEXT_NFC_H

#include <stddef.h>

/* 1 when this build normalises (ICU found at configure time), else 0. */
int st_nfc_available(void);

/* NFC of len bytes of text. Only valid UTF-8 is normalised: each maximal
 * valid stretch on its own, the bytes of an ill-formed sequence kept as they
 * are (they end a stretch, so nothing composes across them), so any bytes
 * still round-trip through a byte-level tokenizer. *out is NULL when the text
 * is already NFC (use text itself), else a malloc'ed buffer of *out_len bytes
 * (the caller frees). 0, or -1 with st_error (exit 1: out of memory, ICU
 * failed, or the build lacks ICU). */
int st_nfc_normalize(const unsigned char *text, size_t len, unsigned char **out, size_t *out_len);

#endif
