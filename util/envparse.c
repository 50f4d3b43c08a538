/* envparse.c - see envparse.h. */
#include "util/envparse.h"

#include <stdio.h>
#include <string.h>

int st_envparse_uint(const char *s, long long max, long long *out) {
  if (!s || !*s || max < 0) return -1;
  long long v = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9') return -1;
    const int d = *p - '0';
    /* v * 10 + d > max, asked without overflowing (d > max first: C's
     * division truncates (max - d) / 10 toward zero, so "9" passed max 8) */
    if (d > max || v > (max - d) / 10) return -1;
    v = v * 10 + d;
  }
  *out = v;
  return 0;
}

int st_envparse_step_range(const char *s, long long *from, long long *to) {
  if (!s || !*s) return 0;
  const long long cap = 1LL << 62; /* steps: any real count is far below */
  long long a, b;
  const char *colon = strchr(s, ':');
  char num[32];
  if (!colon) {
    if (st_envparse_uint(s, cap, &a)) return -1;
    *from = *to = a;
    return 1;
  }
  size_t n = (size_t)(colon - s);
  if (n == 0 || n >= sizeof num) return -1;
  memcpy(num, s, n);
  num[n] = 0;
  if (st_envparse_uint(num, cap, &a) || st_envparse_uint(colon + 1, cap, &b) || a > b) return -1;
  *from = a;
  *to = b;
  return 1;
}

int st_envparse_attention_kernel(const char *s) {
  if (!s || !*s || strcmp(s, "auto") == 0) return 0;
  return strcmp(s, "simt") == 0 ? 1 : -1;
}

int st_envparse_switch(const char *s) {
  if (!s || !*s || strcmp(s, "0") == 0) return 0;
  return strcmp(s, "1") == 0 ? 1 : -1;
}

int st_envparse_gemm_search(const char *s, int *count, int *any) {
  long long v;
  if (!s || !*s || strcmp(s, "exact") == 0) {
    *count = 8, *any = 0;
  } else if (strcmp(s, "off") == 0 || strcmp(s, "1") == 0) {
    *count = 1, *any = 0;
  } else if (st_envparse_uint(s, 8, &v) == 0 && v >= 2 && s[0] != '0') {
    *count = (int)v, *any = 1;
  } else {
    return -1;
  }
  return 0;
}

char *st_envparse_cuda_visible(const char *s, char *buf, unsigned long cap) {
  if (!buf || cap == 0) return buf;
  if (!s) snprintf(buf, cap, "unset");
  else if (!*s) snprintf(buf, cap, "set but empty, which hides every GPU");
  else if (s[0] == '-') snprintf(buf, cap, "'%s', which hides every GPU", s);
  else snprintf(buf, cap, "'%s'", s);
  return buf;
}
