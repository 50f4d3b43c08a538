/* decimal.h - a float as the decimal a person typed, for JSON configs. */
#ifndef ST_DECIMAL_H
#define ST_DECIMAL_H

/* x (a float value) as the double of its shortest decimal that reads back
 * as the same float: 6 to 9 significant digits, so 2e-3f gives 0.002 (not
 * 0.0020000000949949026) and 2^24 stays 16777216 (%.7g would give
 * 16777220). */
double st_float_decimal(float x);

#endif
