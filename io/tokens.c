/* tokens.c - read token splits from shardtrain HDF5 files and llm.c shards.
 *
 * The trainer asks for a few thousand tokens at a time at arbitrary offsets,
 * so both formats are read in place: HDF5 by hyperslab, .bin by pread. No
 * code path loads a whole split, which keeps memory flat for any corpus size.
 *
 * Every failure names the file and says how to get a good one, because a bad
 * data path is usually a typo or a forgotten `shardtrain prep`.
 */
#define _XOPEN_SOURCE 700
#include "io/tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/h5util.h"
#include "util/error.h"

#define LLMC_MAGIC 20240520
#define LLMC_HEADER_BYTES 1024

/* Chunk cache per open dataset. Larger than one chunk written by prep, so
 * sequential micro-batches decompress (and checksum) each chunk once. */
#define H5_CHUNK_CACHE_BYTES (16u << 20)

enum { FMT_HDF5, FMT_BIN };

struct st_token_source {
  int format;
  char *path;
  int64_t count;
  int vocab_size; /* 0 when unknown; known ones are enforced on every read */
  hid_t file, dset, space; /* HDF5 */
  int fd;                  /* .bin */
  int width;               /* bytes per stored token: .bin 2 (version 1) or 4 (version 2);
                            * HDF5 the dataset type's size */
};

/* Data problems share one exit code (ST_EXIT_DATA) so scripts can tell a bad
 * data file from a crash. */
#define data_error(...) st_error_setc(ST_EXIT_DATA, __VA_ARGS__)

/* HDF5's innermost error (e.g. a checksum mismatch), copied out before a
 * close call clears the stack. */
static const char *h5_reason(char buf[256]) {
  snprintf(buf, 256, "%s", st_h5_why()[0] ? st_h5_why() : "unknown HDF5 error");
  return buf;
}

static int detect_format(const char *path) {
  const char *dot = strrchr(path, '.');
  const char *slash = strrchr(path, '/');
  if (!dot || (slash && dot < slash)) return -1;
  if (!strcasecmp(dot, ".h5") || !strcasecmp(dot, ".hdf5")) return FMT_HDF5;
  if (!strcasecmp(dot, ".bin")) return FMT_BIN;
  return -1;
}

static int check_readable(const char *path, int format) {
  struct stat st;
  if (stat(path, &st) != 0) {
    if (errno != ENOENT) return data_error("cannot access data file %s: %s", path, strerror(errno));
    if (format == FMT_HDF5)
      return data_error("data file %s does not exist; run `shardtrain prep --input TEXT --out %s` "
                        "or pass --data", path, path);
    return data_error("data file %s does not exist; pass --data with an existing llm.c .bin shard "
                      "or an HDF5 file made by `shardtrain prep`", path);
  }
  if (S_ISDIR(st.st_mode))
    return data_error("data file %s is a directory; pass --data with a token file inside it", path);
  if (access(path, R_OK) != 0)
    return data_error("cannot read data file %s: %s; fix its permissions or pass another --data",
                      path, strerror(errno));
  return 0;
}

/* ---- HDF5 ---------------------------------------------------------------- */

static void describe_type(hid_t type, char *buf, size_t cap) {
  H5T_class_t cls = H5Tget_class(type);
  size_t bits = H5Tget_size(type) * 8;
  if (cls == H5T_INTEGER)
    snprintf(buf, cap, "%s %zu-bit integers",
             H5Tget_sign(type) == H5T_SGN_NONE ? "unsigned" : "signed", bits);
  else if (cls == H5T_FLOAT)
    snprintf(buf, cap, "%zu-bit floats", bits);
  else if (cls == H5T_STRING)
    snprintf(buf, cap, "strings");
  else
    snprintf(buf, cap, "a non-numeric type");
}

/* Any 2- or 4-byte unsigned integer works (prep writes uint32 past a
 * vocabulary of 65536): HDF5 converts byte order and width on read. */
static int check_dataset_shape(st_token_source *s, const char *name) {
  hid_t type = H5Dget_type(s->dset);
  if (type < 0) return data_error("cannot read the type of dataset %s in %s", name, s->path);
  int ok = H5Tget_class(type) == H5T_INTEGER &&
           (H5Tget_size(type) == 2 || H5Tget_size(type) == 4) && H5Tget_sign(type) == H5T_SGN_NONE;
  char desc[64];
  describe_type(type, desc, sizeof desc);
  s->width = (int)H5Tget_size(type);
  H5Tclose(type);
  if (!ok)
    return data_error("dataset %s in %s holds %s; expected 1-D uint16 or uint32 token ids; "
                      "regenerate the file with `shardtrain prep`", name, s->path, desc);

  s->space = H5Dget_space(s->dset);
  if (s->space < 0) return data_error("cannot read the shape of dataset %s in %s", name, s->path);
  int rank = H5Sget_simple_extent_ndims(s->space);
  if (rank != 1)
    return data_error("dataset %s in %s has %d dimensions; expected a 1-D token array; "
                      "regenerate the file with `shardtrain prep`", name, s->path, rank);
  hsize_t dims[1];
  H5Sget_simple_extent_dims(s->space, dims, NULL);
  s->count = (int64_t)dims[0];
  if (s->count == 0)
    return data_error("dataset %s in %s is empty; regenerate the file with `shardtrain prep` "
                      "from a larger input", name, s->path);
  return 0;
}

/* vocab_size is optional for files from other tools: 0 means unknown. */
static int read_vocab_attr(st_token_source *s) {
  htri_t exists = H5Aexists(s->file, "vocab_size");
  if (exists < 0) return data_error("cannot read the attributes of %s", s->path);
  if (exists == 0) return 0;

  hid_t attr = H5Aopen(s->file, "vocab_size", H5P_DEFAULT);
  if (attr < 0) return data_error("cannot open attribute vocab_size in %s", s->path);
  hid_t type = H5Aget_type(attr), space = H5Aget_space(attr);
  int ok = type >= 0 && space >= 0 && H5Tget_class(type) == H5T_INTEGER &&
           H5Sget_simple_extent_npoints(space) == 1;
  long long v = 0;
  if (ok) ok = H5Aread(attr, H5T_NATIVE_LLONG, &v) >= 0;
  if (type >= 0) H5Tclose(type);
  if (space >= 0) H5Sclose(space);
  H5Aclose(attr);
  if (!ok)
    return data_error("attribute vocab_size in %s is not a single integer; "
                      "regenerate the file with `shardtrain prep`", s->path);
  if (v < 1 || v > ST_TOKENS_MAX_VOCAB)
    return data_error("attribute vocab_size = %lld in %s is outside 1..%d; "
                      "regenerate the file with `shardtrain prep`", v, s->path, ST_TOKENS_MAX_VOCAB);
  s->vocab_size = (int)v;
  return 0;
}

static int open_hdf5(st_token_source *s, const char *split) {
  char why[256], name[300];
  if (!split || !split[0] || strchr(split, '/') || strlen(split) > 256)
    return data_error("bad split name \"%s\" for %s; use \"train\" or \"val\"",
                      split ? split : "(null)", s->path);
  snprintf(name, sizeof name, "/%s", split);

  htri_t is_h5 = H5Fis_hdf5(s->path);
  if (is_h5 <= 0)
    return data_error("data file %s is not an HDF5 file; regenerate it with "
                      "`shardtrain prep --input TEXT --out %s`", s->path, s->path);
  s->file = H5Fopen(s->path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (s->file < 0)
    return data_error("cannot open HDF5 file %s (%s); it is damaged or truncated, "
                      "regenerate it with `shardtrain prep`", s->path, h5_reason(why));

  if (H5Lexists(s->file, name, H5P_DEFAULT) <= 0)
    return data_error("data file %s has no dataset %s (a token file holds /train and /val); "
                      "regenerate it with `shardtrain prep`", s->path, name);
  hid_t dapl = H5Pcreate(H5P_DATASET_ACCESS);
  H5Pset_chunk_cache(dapl, H5D_CHUNK_CACHE_NSLOTS_DEFAULT, H5_CHUNK_CACHE_BYTES, 1.0);
  s->dset = H5Dopen2(s->file, name, dapl);
  if (s->dset < 0) h5_reason(why); /* before H5Pclose, which clears the stack */
  H5Pclose(dapl);
  if (s->dset < 0)
    return data_error("%s in %s is not a readable dataset (%s); regenerate the file with "
                      "`shardtrain prep`", name, s->path, why);
  if (check_dataset_shape(s, name) != 0) return -1;
  return read_vocab_attr(s);
}

static int read_hdf5(st_token_source *s, int64_t pos, int64_t n, int *out) {
  hsize_t start = (hsize_t)pos, count = (hsize_t)n;
  char why[256];
  if (H5Sselect_hyperslab(s->space, H5S_SELECT_SET, &start, NULL, &count, NULL) < 0)
    return data_error("cannot select tokens [%lld, %lld) in %s", (long long)pos,
                      (long long)(pos + n), s->path);
  hid_t mem = H5Screate_simple(1, &count, NULL);
  /* HDF5 converts uint16/uint32 to int during the read: no staging buffer
   * (ids stay below ST_TOKENS_MAX_VOCAB, far inside int). */
  herr_t rc = mem < 0 ? -1 : H5Dread(s->dset, H5T_NATIVE_INT, mem, s->space, H5P_DEFAULT, out);
  if (rc < 0) h5_reason(why); /* before H5Sclose, which clears the stack */
  if (mem >= 0) H5Sclose(mem);
  if (rc < 0)
    return data_error("cannot read tokens [%lld, %lld) from %s (%s); the file is damaged, "
                      "regenerate it with `shardtrain prep`", (long long)pos,
                      (long long)(pos + n), s->path, why);
  return 0;
}

/* ---- llm.c .bin ----------------------------------------------------------- */

static int32_t le32(const unsigned char *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                   (uint32_t)p[3] << 24);
}

/* pread until len bytes or end of file. Returns bytes read, -1 on error. */
static ssize_t pread_full(int fd, unsigned char *buf, size_t len, off_t off) {
  size_t done = 0;
  while (done < len) {
    ssize_t got = pread(fd, buf + done, len - done, off + (off_t)done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return -1;
    if (got == 0) break;
    done += (size_t)got;
  }
  return (ssize_t)done;
}

static int open_bin(st_token_source *s) {
  struct stat st;
  unsigned char h[LLMC_HEADER_BYTES];
  s->fd = open(s->path, O_RDONLY | O_CLOEXEC);
  if (s->fd < 0 || fstat(s->fd, &st) != 0)
    return data_error("cannot open data file %s: %s", s->path, strerror(errno));
  long long size = (long long)st.st_size;
  if (size < LLMC_HEADER_BYTES)
    return data_error("data file %s holds %lld bytes, too few for an llm.c shard (the header "
                      "alone is %d bytes); regenerate it", s->path, size, LLMC_HEADER_BYTES);
  if (pread_full(s->fd, h, sizeof h, 0) != (ssize_t)sizeof h)
    return data_error("cannot read the header of %s: %s", s->path, strerror(errno));

  int32_t magic = le32(h), version = le32(h + 4), count = le32(h + 8);
  if (magic != LLMC_MAGIC)
    return data_error("data file %s is not an llm.c token shard: magic %d, expected %d; "
                      "pass a GPT-2 .bin shard or an HDF5 file from `shardtrain prep`",
                      s->path, magic, LLMC_MAGIC);
  /* llm.c's dev/data/data_common.py: version 1 = uint16 (GPT-2), 2 = uint32 (Llama 3) */
  if (version != 1 && version != 2)
    return data_error("data file %s has llm.c shard version %d; only versions 1 (uint16 tokens) "
                      "and 2 (uint32 tokens) exist", s->path, version);
  s->width = version == 2 ? 4 : 2;
  if (count <= 0)
    return data_error("data file %s: header says %d tokens; the shard is empty or damaged",
                      s->path, count);

  long long expect = LLMC_HEADER_BYTES + (long long)s->width * count;
  if (size < expect)
    return data_error("data file %s is truncated: header says %d tokens, file holds %lld; "
                      "copy or regenerate the shard", s->path, count,
                      (size - LLMC_HEADER_BYTES) / s->width);
  if (size > expect)
    return data_error("data file %s has %lld bytes after the %d tokens its header announces; "
                      "the shard is damaged, copy or regenerate it", s->path, size - expect, count);
  s->count = count;
  return 0;
}

static int read_bin(st_token_source *s, int64_t pos, int64_t n, int *out) {
  unsigned char buf[1 << 15];
  const int w = s->width;
  int64_t done = 0;
  while (done < n) {
    int64_t k = n - done;
    if (k > (int64_t)sizeof buf / w) k = (int64_t)sizeof buf / w;
    off_t off = (off_t)LLMC_HEADER_BYTES + w * (off_t)(pos + done);
    ssize_t got = pread_full(s->fd, buf, (size_t)k * w, off);
    if (got < 0)
      return data_error("cannot read tokens from %s: %s", s->path, strerror(errno));
    if (got != k * w)
      return data_error("data file %s shrank while open (short read at token %lld); "
                        "another process is rewriting it", s->path, (long long)(pos + done));
    /* Decode only the whole tokens pread_full says it read, never bytes of
     * buf it did not fill (the bound is got, not the k asked for). */
    const int64_t have = (int64_t)got / w;
    if (w == 2) {
      for (int64_t i = 0; i < have; i++)
        out[done + i] = (int)buf[2 * i] | (int)buf[2 * i + 1] << 8;
    } else {
      for (int64_t i = 0; i < have; i++) {
        uint32_t v = (uint32_t)le32(buf + 4 * i);
        if (v >= ST_TOKENS_MAX_VOCAB) /* ids are int from here on */
          return data_error("token %u at position %lld of %s is past the largest vocabulary "
                            "(%d); the shard is damaged, copy or regenerate it", v,
                            (long long)(pos + done + i), s->path, ST_TOKENS_MAX_VOCAB);
        out[done + i] = (int)v;
      }
    }
    done += have;
  }
  return 0;
}

/* ---- public --------------------------------------------------------------- */

st_token_source *st_tokens_open(const char *path, const char *split, int *vocab_size_out) {
  if (vocab_size_out) *vocab_size_out = 0;
  if (!path || !path[0]) {
    data_error("no data file given; pass --data FILE (.h5/.hdf5 from `shardtrain prep` or "
               "an llm.c .bin shard)");
    return NULL;
  }
  int format = detect_format(path);
  if (format < 0) {
    data_error("data file %s has an unknown extension; accepted: .h5 or .hdf5 (HDF5 token file "
               "from `shardtrain prep`) or .bin (llm.c shard)", path);
    return NULL;
  }
  if (check_readable(path, format) != 0) return NULL;

  /* Our messages replace HDF5's stack dump on stderr. */
  if (format == FMT_HDF5) st_h5_quiet();

  st_token_source *s = calloc(1, sizeof *s);
  if (!s || !(s->path = strdup(path))) {
    free(s);
    st_error_set("out of memory opening %s", path);
    return NULL;
  }
  s->format = format;
  s->file = s->dset = s->space = H5I_INVALID_HID;
  s->fd = -1;
  int rc = format == FMT_HDF5 ? open_hdf5(s, split) : open_bin(s);
  if (rc != 0) {
    st_tokens_close(s);
    return NULL;
  }
  if (vocab_size_out) *vocab_size_out = s->vocab_size;
  return s;
}

int64_t st_tokens_count(const st_token_source *s) { return s->count; }

const char *st_tokens_path(const st_token_source *s) { return s->path; }

int st_tokens_width(const st_token_source *s) { return s->width; }

int st_tokens_read(st_token_source *s, int64_t pos, int64_t n, int *out) {
  if (pos < 0 || n < 0 || pos > s->count || n > s->count - pos)
    return data_error("read of %lld tokens at offset %lld is outside %s, which holds %lld tokens; "
                      "use a larger data file or a shorter --seq-len", (long long)n,
                      (long long)pos, s->path, (long long)s->count);
  if (n == 0) return 0;
  int rc = s->format == FMT_HDF5 ? read_hdf5(s, pos, n, out) : read_bin(s, pos, n, out);
  if (rc != 0) return -1;
  /* An id past the vocabulary would index outside the embedding table. */
  if (s->vocab_size > 0) {
    for (int64_t i = 0; i < n; i++)
      if (out[i] >= s->vocab_size)
        return data_error("token %d at position %lld of %s is not below vocab_size %d; "
                          "the file is inconsistent, regenerate it with `shardtrain prep`",
                          out[i], (long long)(pos + i), s->path, s->vocab_size);
  }
  return 0;
}

void st_tokens_close(st_token_source *s) {
  if (!s) return;
  if (s->space >= 0) H5Sclose(s->space);
  if (s->dset >= 0) H5Dclose(s->dset);
  if (s->file >= 0) H5Fclose(s->file);
  if (s->fd >= 0) close(s->fd);
  free(s->path);
  free(s);
}
