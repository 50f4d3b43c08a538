/* decimal.c - see decimal.h. */
#include "util/decimal.h"

#include <stdio.h>
#include <stdlib.h>

double st_float_decimal(float x) {
  char buf[32];
  for (int digits = 6; digits <= 9; digits++) {
    snprintf(buf, sizeof buf, "%.*g", digits, (double)x);
    if (strtof(buf, NULL) == x) break;
  }
  return strtod(buf, NULL);
}
