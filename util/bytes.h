/* bytes.h - byte sizes as people write them on command lines. */
#ifndef ST_BYTES_H
#define ST_BYTES_H

#include <stddef.h>
#include <stdint.h>

/* "4096", "64KiB", "24GiB", "80GB", "1.5GiB", "8B": binary units (KiB, MiB,
 * GiB, TiB; K, M, G, T alone mean the same) and decimal ones (kB, MB, GB,
 * TB). 0, or -1 when s is not such a size (nothing is written then). */
int st_parse_bytes(const char *s, uint64_t *out);

/* "4 KiB", "1.50 GiB", "512 B" into buf[cap]; returns buf. */
char *st_format_bytes(uint64_t bytes, char *buf, size_t cap);

#endif
