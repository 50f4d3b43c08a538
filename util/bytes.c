/* bytes.c - parse and print byte sizes (see bytes.h). */
#include "util/bytes.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int st_parse_bytes(const char *s, uint64_t *out) {
  if (!s || !*s) return -1;
  char *end;
  double v = strtod(s, &end);
  /* strtod reads "nan" and "inf" too: neither is a size (and NaN passes
   * every comparison below into an undefined cast) */
  if (end == s || !(v >= 0) || !isfinite(v)) return -1;
  while (isspace((unsigned char)*end)) end++;
  static const struct {
    const char *unit;
    double mult;
  } k_units[] = {{"", 1},         {"B", 1},           {"K", 1024.0},        {"KiB", 1024.0},
                 {"kB", 1e3},     {"KB", 1e3},        {"M", 1048576.0},     {"MiB", 1048576.0},
                 {"MB", 1e6},     {"G", 1073741824.0}, {"GiB", 1073741824.0}, {"GB", 1e9},
                 {"T", 1099511627776.0}, {"TiB", 1099511627776.0}, {"TB", 1e12}};
  for (size_t i = 0; i < sizeof k_units / sizeof k_units[0]; i++)
    if (strcmp(end, k_units[i].unit) == 0) {
      double b = v * k_units[i].mult;
      if (b > 1.8e19) return -1;
      *out = (uint64_t)(b + 0.5);
      return 0;
    }
  return -1;
}

char *st_format_bytes(uint64_t bytes, char *buf, size_t cap) {
  static const char *const k_units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    u++;
  }
  if (u == 0) snprintf(buf, cap, "%llu B", (unsigned long long)bytes);
  else snprintf(buf, cap, v == (double)(uint64_t)v ? "%.0f %s" : "%.2f %s", v, k_units[u]);
  return buf;
}
