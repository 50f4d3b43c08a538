/* error.c - per-thread error message buffer (see error.h). */
#include "util/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char g_msg[2048];
static _Thread_local int g_code = ST_EXIT_ERROR;

int st_error_set(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_msg, sizeof g_msg, fmt, ap);
  va_end(ap);
  return -1;
}

int st_error_setc(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_msg, sizeof g_msg, fmt, ap);
  va_end(ap);
  g_code = code;
  return -1;
}

int st_error_prefix(const char *fmt, ...) {
  char prefix[1024], old[sizeof g_msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, g_msg, sizeof old);
  /* Bounded pieces: the two halves always fit, so nothing is cut mid-way. */
  snprintf(g_msg, sizeof g_msg, "%.1000s: %.1000s", prefix, old);
  return -1;
}

const char *st_error_msg(void) { return g_msg; }
void st_error_code(int code) { g_code = code; }
int st_error_exit_code(void) { return g_code; }
