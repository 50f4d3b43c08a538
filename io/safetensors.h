/* safetensors.h - read and write the safetensors format (Hugging Face).
 *
 * A file is: 8 bytes little-endian u64 N, then N bytes of JSON mapping each
 * tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
 * relative to the first byte after the header) plus an optional
 * "__metadata__" object of strings, then the tensor bytes (little-endian,
 * row-major). Spec: https://github.com/huggingface/safetensors ("Format").
 * The header is parsed with cJSON; tensors are read with pread, one at a
 * time, never the whole file.
 *
 * A set is the tensors of one model: one file, or the shards a
 * model.safetensors.index.json's weight_map names. Every malformed input is
 * one st_error line (exit code 3) naming the file and the tensor.
 */
#ifndef ST_SAFETENSORS_H
#define ST_SAFETENSORS_H

#include <stdint.h>

#include "kernels/dtype.h"

#define ST_SF_MAX_DIM 8

typedef struct {
  char name[160];
  st_dtype dtype;              /* F32, F16 or BF16 (the only ones accepted) */
  int ndim;
  int64_t shape[ST_SF_MAX_DIM];
  int64_t numel;
  uint64_t offset;             /* absolute byte offset in its file */
  uint64_t bytes;
  int file;                    /* index into st_sf_set.files */
} st_sf_tensor;

typedef struct {
  int nfiles;
  char (*files)[1200];
  int *fds;
  st_sf_tensor *t;
  int n, cap;
} st_sf_set;

/* Open one safetensors file and add its tensors to set (zeroed by the
 * caller before the first call). Errors (exit 3) name the file and tensor:
 * header length past the file, header not JSON, an unknown dtype, begin >
 * end, an offset past the file, bytes != dtype size x shape, a duplicate
 * name (within the file or already in the set). 0 or -1. */
int st_sf_open_file(const char *path, st_sf_set *set);
/* Open a model directory: model.safetensors, or the shards of
 * model.safetensors.index.json (a tensor mapped to a missing file, or
 * missing from the file it is mapped to, is an error naming both). 0 or -1. */
int st_sf_open_dir(const char *dir, st_sf_set *set);
/* The tensor called name, or NULL. */
const st_sf_tensor *st_sf_find(const st_sf_set *set, const char *name);
/* Read tensor t converted to fp32 into out[t->numel]. 0 or -1 (file, tensor). */
int st_sf_read_f32(const st_sf_set *set, const st_sf_tensor *t, float *out);
void st_sf_close(st_sf_set *set);

/* One tensor to write: data holds numel elements of dtype, row-major. */
typedef struct {
  const char *name;
  st_dtype dtype;
  int ndim;
  int64_t shape[ST_SF_MAX_DIM];
  const void *data;
} st_sf_out;

/* Write tensors to path: written to path.tmp, fsync'ed and renamed. Tensors
 * are laid out in name order (deterministic), the header padded with spaces
 * to a multiple of 8, __metadata__ {"format": "pt"} as transformers writes.
 * 0 or -1 (exit 3) naming the file. */
int st_sf_write(const char *path, const st_sf_out *t, int n);

#endif
