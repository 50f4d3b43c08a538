/* error.c - per-thread error message buffer (see error.h). */
#include "util/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char g_msg[2048];
static _Thread_local int g_code = ST_EXIT_ERROR;

/* dst (cap bytes, NUL-terminated) = src with each control character as a C
 * escape: \n, \r, \t, else \xHH (bytes below 0x20, and 0x7f). Messages
 * quote names and values read from files (a tensor name, a JSON key, a
 * token), and those may hold any byte; escaped, a message stays one line
 * and cannot move a terminal's cursor. An escape never stops half-written.
 * Bytes from 0x80 up pass as they are (UTF-8 names print as themselves). */
static void escape_controls(char *dst, size_t cap, const char *src) {
  static const char hex[] = "0123456789abcdef";
  size_t n = 0;
  for (const unsigned char *p = (const unsigned char *)src; *p; p++) {
    char e[5];
    size_t k = 0;
    if (*p >= 0x20 && *p != 0x7f) {
      e[k++] = (char)*p;
    } else {
      e[k++] = '\\';
      if (*p == '\n') e[k++] = 'n';
      else if (*p == '\r') e[k++] = 'r';
      else if (*p == '\t') e[k++] = 't';
      else {
        e[k++] = 'x';
        e[k++] = hex[*p >> 4];
        e[k++] = hex[*p & 15];
      }
    }
    if (n + k >= cap) break;
    memcpy(dst + n, e, k);
    n += k;
  }
  dst[n] = 0;
}

/* g_msg = the formatted message, escaped unless lines (st_error_set_lines). */
static void set_msg(int lines, const char *fmt, va_list ap) {
  if (lines) {
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    return;
  }
  char raw[sizeof g_msg];
  vsnprintf(raw, sizeof raw, fmt, ap);
  escape_controls(g_msg, sizeof g_msg, raw);
}

int st_error_set(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_msg(0, fmt, ap);
  va_end(ap);
  return -1;
}

int st_error_setc(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_msg(0, fmt, ap);
  va_end(ap);
  g_code = code;
  return -1;
}

int st_error_set_lines(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  set_msg(1, fmt, ap);
  va_end(ap);
  return -1;
}

int st_error_prefix(const char *fmt, ...) {
  char raw[1024], prefix[1024], old[sizeof g_msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(raw, sizeof raw, fmt, ap);
  va_end(ap);
  escape_controls(prefix, sizeof prefix, raw);
  memcpy(old, g_msg, sizeof old);
  /* Bounded pieces: the two halves always fit, so nothing is cut mid-way. */
  snprintf(g_msg, sizeof g_msg, "%.1000s: %.1000s", prefix, old);
  return -1;
}

const char *st_error_msg(void) { return g_msg; }
void st_error_code(int code) { g_code = code; }
int st_error_exit_code(void) { return g_code; }
