/* prep.c - `shardtrain prep`'s token file writer (ids from any tokenizer,
 * io/tokenizer.h; io/prep_files.c gathers and tokenizes the inputs) and the
 * llm.c .bin writer; st_prep_bytes is the byte tokenizer's whole path.
 *
 * Token files record the tokenizer's identity and carry its files
 * (tokens.h). Files are written to
 * PATH.tmp, fsynced and renamed over PATH only when complete: a failed or
 * interrupted prep leaves whatever was at PATH before untouched.
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
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/h5util.h"
#include "io/tokenizer.h"
#include "util/error.h"
#include "util/fsutil.h"

#define LLMC_MAGIC 20240520
#define LLMC_HEADER_INTS 256
#define MIN_SPLIT_TOKENS 2

/* 256 Ki tokens = 512 KiB per chunk: fits HDF5's default 1 MiB chunk cache,
 * so other readers (h5py) also decompress each chunk once, not per slice. */
#define CHUNK_TOKENS ((int64_t)1 << 18)


/* ---- input ---------------------------------------------------------------- */

/* Input text: mapped when it is a regular file (no copy, however large),
 * read into memory when it is a pipe or stdin. */
typedef struct {
  const unsigned char *data;
  size_t n;
  void *map;
  unsigned char *heap;
} text_input;

static int read_all(int fd, const char *label, text_input *in) {
  size_t cap = 1 << 20, n = 0;
  unsigned char *buf = malloc(cap);
  if (!buf) return st_error_setc(ST_EXIT_ERROR, "out of memory reading %s", label);
  for (;;) {
    if (n == cap) {
      unsigned char *bigger = realloc(buf, cap * 2);
      if (!bigger) {
        free(buf);
        return st_error_setc(ST_EXIT_ERROR, "out of memory reading %s (%zu bytes so far)", label, n);
      }
      buf = bigger;
      cap *= 2;
    }
    ssize_t got = read(fd, buf + n, cap - n);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      free(buf);
      return st_error_setc(ST_EXIT_DATA, "cannot read input %s: %s", label, strerror(errno));
    }
    if (got == 0) break;
    n += (size_t)got;
  }
  in->heap = buf;
  in->data = buf;
  in->n = n;
  return 0;
}

static int load_input(const char *path, const char *label, text_input *in) {
  memset(in, 0, sizeof *in);
  if (!strcmp(path, "-")) return read_all(STDIN_FILENO, label, in);

  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT)
      return st_error_setc(ST_EXIT_DATA, "input %s does not exist; pass --input with a text file, "
                                "or - for stdin", path);
    return st_error_setc(ST_EXIT_DATA, "cannot open input %s: %s", path, strerror(errno));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return st_error_setc(ST_EXIT_DATA, "cannot stat input %s: %s", path, strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) {
    close(fd);
    return st_error_setc(ST_EXIT_DATA, "input %s is a directory; pass --input with a text file", path);
  }
  int rc = 0;
  if (S_ISREG(st.st_mode) && st.st_size > 0) {
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED)
      rc = st_error_setc(ST_EXIT_DATA, "cannot map input %s: %s", path, strerror(errno));
    else {
      in->map = map;
      in->data = map;
      in->n = (size_t)st.st_size;
    }
  } else if (!S_ISREG(st.st_mode)) {
    rc = read_all(fd, label, in); /* a FIFO or device, e.g. <(zcat ...) */
  }
  close(fd);
  return rc;
}

static void free_input(text_input *in) {
  if (in->map) munmap(in->map, in->n);
  free(in->heap);
}

/* ---- split ---------------------------------------------------------------- */

static int64_t val_tokens_for(int64_t n, double val_fraction) {
  return (int64_t)((double)n * val_fraction); /* rounded down */
}

/* Smallest input that leaves MIN_SPLIT_TOKENS in /val (and so in /train, as
 * val_fraction <= 0.5). Starts just below 2/val_fraction: rounding makes the
 * closed form off by one. */
static int64_t min_input_tokens(double val_fraction) {
  int64_t m = (int64_t)(MIN_SPLIT_TOKENS / val_fraction) - 1;
  if (m < 2 * MIN_SPLIT_TOKENS) m = 2 * MIN_SPLIT_TOKENS;
  while (val_tokens_for(m, val_fraction) < MIN_SPLIT_TOKENS) m++;
  return m;
}

static int plan_split(const char *label, int64_t n, double val_fraction, int64_t *train,
                      int64_t *val) {
  int64_t need = min_input_tokens(val_fraction);
  if (n == 0)
    return st_error_setc(ST_EXIT_DATA, "input %s is empty; prep needs text to tokenize (at least %lld "
                              "bytes with --val-fraction %g)", label, (long long)need,
                val_fraction);
  *val = val_tokens_for(n, val_fraction);
  *train = n - *val;
  if (*val < MIN_SPLIT_TOKENS || *train < MIN_SPLIT_TOKENS)
    return st_error_setc(ST_EXIT_DATA, "input %s holds %lld bytes, which gives %lld train and %lld val "
                              "tokens with --val-fraction %g; each split needs at least %d: "
                              "give at least %lld bytes of text or raise --val-fraction",
                label, (long long)n, (long long)*train, (long long)*val, val_fraction,
                MIN_SPLIT_TOKENS, (long long)need);
  return 0;
}

/* ---- output --------------------------------------------------------------- */

static void dir_of(const char *path, char *dir, size_t cap) {
  snprintf(dir, cap, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash)
    snprintf(dir, cap, ".");
  else if (slash == dir)
    dir[1] = 0;
  else
    *slash = 0;
}

static int has_h5_extension(const char *path) {
  const char *dot = strrchr(path, '.');
  const char *slash = strrchr(path, '/');
  if (!dot || (slash && dot < slash)) return 0;
  return !strcasecmp(dot, ".h5") || !strcasecmp(dot, ".hdf5");
}

/* Checked up front so a long tokenization does not end in "cannot create". */
static int check_out_dir(const char *out_path) {
  char dir[4096];
  if (strlen(out_path) + 5 >= sizeof dir)
    return st_error_setc(ST_EXIT_USAGE, "output path is too long: %s", out_path);
  if (st_is_dir(out_path))
    return st_error_setc(ST_EXIT_USAGE, "output %s is a directory; pass --out with a file name such as "
                               "%s/tokens.h5", out_path, out_path);
  dir_of(out_path, dir, sizeof dir);
  if (!st_is_dir(dir))
    return st_error_setc(ST_EXIT_ERROR, "output directory %s for %s does not exist; create it "
                               "(mkdir -p %s) or choose another --out", dir, out_path, dir);
  if (access(dir, W_OK | X_OK) != 0)
    return st_error_setc(ST_EXIT_ERROR, "output directory %s for %s is not writable (%s); fix its "
                               "permissions or choose another --out", dir, out_path,
                strerror(errno));
  return 0;
}

/* Make a finished tmp file durable and move it over path; removes tmp on
 * failure so no half file is ever left behind. */
static int commit_tmp(const char *tmp, const char *path) {
  char dir[4096];
  int fd = open(tmp, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || fsync(fd) != 0) {
    int err = errno;
    if (fd >= 0) close(fd);
    unlink(tmp);
    return st_error_setc(ST_EXIT_ERROR, "cannot flush %s to disk: %s; %s was not changed", tmp,
                strerror(err), path);
  }
  close(fd);
  if (rename(tmp, path) != 0) {
    int err = errno;
    unlink(tmp);
    return st_error_setc(ST_EXIT_ERROR, "cannot rename %s to %s: %s", tmp, path, strerror(err));
  }
  dir_of(path, dir, sizeof dir);
  st_fsync_dir(dir);
  return 0;
}

/* ---- HDF5 writer ---------------------------------------------------------- */

static int set_attr(hid_t loc, const char *name, hid_t file_type, hid_t mem_type,
                    const void *value) {
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t attr = H5Acreate2(loc, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT);
  herr_t rc = attr < 0 ? -1 : H5Awrite(attr, mem_type, value);
  if (attr >= 0) H5Aclose(attr);
  H5Sclose(space);
  return rc < 0 ? -1 : 0;
}

/* Fixed-length, NUL-terminated UTF-8: readable as bytes by every HDF5 tool. */
static int set_str_attr(hid_t loc, const char *name, const char *value) {
  hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, strlen(value) + 1);
  H5Tset_strpad(type, H5T_STR_NULLTERM);
  H5Tset_cset(type, H5T_CSET_UTF8);
  int rc = set_attr(loc, name, type, type, value);
  H5Tclose(type);
  return rc;
}

/* The tokenizer's identity (tokens.h) and its files under /tokenizer/NAME
 * as uint8 datasets, so a run made from this file can carry them. */
static int write_tokenizer(hid_t file, const st_tokenizer *t) {
  int32_t vocab = st_tokenizer_vocab_size(t);
  int64_t eot = st_tokenizer_eot(t);
  if (set_str_attr(file, "tokenizer", st_tokenizer_name(t)) != 0) return -1;
  if (set_attr(file, "vocab_size", H5T_STD_I32LE, H5T_NATIVE_INT32, &vocab) != 0) return -1;
  if (set_str_attr(file, "tokenizer_digest", st_tokenizer_digest(t)) != 0) return -1;
  if (set_attr(file, "eot_token", H5T_STD_I64LE, H5T_NATIVE_INT64, &eot) != 0) return -1;
  int nf = st_tokenizer_file_count(t);
  if (nf == 0) return 0;
  hid_t g = H5Gcreate2(file, "/tokenizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (g < 0) return -1;
  int rc = 0;
  for (int i = 0; i < nf && rc == 0; i++) {
    const char *name;
    const unsigned char *data;
    size_t len;
    st_tokenizer_file(t, i, &name, &data, &len);
    hsize_t dims = (hsize_t)len;
    hid_t space = H5Screate_simple(1, &dims, NULL);
    hid_t d = space < 0 ? -1 : H5Dcreate2(g, name, H5T_STD_U8LE, space, H5P_DEFAULT, H5P_DEFAULT,
                                          H5P_DEFAULT);
    if (d < 0 || (len && H5Dwrite(d, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0))
      rc = -1;
    if (d >= 0) H5Dclose(d);
    if (space >= 0) H5Sclose(space);
  }
  H5Gclose(g);
  return rc;
}

static int write_attrs(hid_t file, const char *source, int64_t train, int64_t val, double vf,
                       const st_tokenizer *t) {
  if (write_tokenizer(file, t) != 0) return -1;
  if (set_str_attr(file, "source", source) != 0) return -1;
  if (set_attr(file, "train_tokens", H5T_STD_I64LE, H5T_NATIVE_INT64, &train) != 0) return -1;
  if (set_attr(file, "val_tokens", H5T_STD_I64LE, H5T_NATIVE_INT64, &val) != 0) return -1;
  if (set_attr(file, "val_fraction", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &vf) != 0) return -1;
  return set_str_attr(file, "format", "shardtrain-tokens-v1");
}

/* Chunked so readers can take hyperslabs; Fletcher-32 so a flipped bit is a
 * read error rather than silently different training data. */
static hid_t token_dcpl(int64_t n) {
  hsize_t chunk = (hsize_t)(n < CHUNK_TOKENS ? n : CHUNK_TOKENS);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (dcpl < 0 || H5Pset_chunk(dcpl, 1, &chunk) < 0) goto fail;
  if (H5Zfilter_avail(H5Z_FILTER_SHUFFLE) > 0 && H5Pset_shuffle(dcpl) < 0) goto fail;
  if (H5Zfilter_avail(H5Z_FILTER_DEFLATE) > 0 && H5Pset_deflate(dcpl, 1) < 0) goto fail;
  if (H5Pset_fletcher32(dcpl) < 0) goto fail;
  return dcpl;
fail:
  if (dcpl >= 0) H5Pclose(dcpl);
  return H5I_INVALID_HID;
}

/* Writes whole chunks at a time, so no chunk is ever read back and rewritten. */
/* Tokens from ids, or (ids NULL) the byte tokenizer's: the bytes themselves,
 * so byte prep never holds more than the mapped text and one chunk. */
static int write_split(hid_t file, const char *name, const uint32_t *ids,
                       const unsigned char *bytes, int64_t n, int wide) {
  hsize_t dims = (hsize_t)n;
  int rc = -1;
  hid_t space = H5Screate_simple(1, &dims, NULL);
  hid_t dcpl = token_dcpl(n);
  hid_t dset = H5I_INVALID_HID;
  int64_t step = n < CHUNK_TOKENS ? n : CHUNK_TOKENS;
  uint16_t *buf = wide ? NULL : malloc((size_t)step * sizeof *buf);
  if (space < 0 || dcpl < 0 || (!wide && !buf)) goto done;
  dset = H5Dcreate2(file, name, wide ? H5T_STD_U32LE : H5T_STD_U16LE, space, H5P_DEFAULT, dcpl,
                    H5P_DEFAULT);
  if (dset < 0) goto done;
  for (int64_t off = 0; off < n; off += step) {
    hsize_t start = (hsize_t)off, count = (hsize_t)(n - off < step ? n - off : step);
    for (hsize_t i = 0; !wide && i < count; i++)
      buf[i] = ids ? (uint16_t)ids[off + (int64_t)i] : bytes[off + (int64_t)i];
    hid_t mem = H5Screate_simple(1, &count, NULL);
    herr_t w = -1;
    if (mem >= 0 && H5Sselect_hyperslab(space, H5S_SELECT_SET, &start, NULL, &count, NULL) >= 0)
      w = wide ? H5Dwrite(dset, H5T_NATIVE_UINT32, mem, space, H5P_DEFAULT, ids + off)
               : H5Dwrite(dset, H5T_NATIVE_USHORT, mem, space, H5P_DEFAULT, buf);
    if (mem >= 0) H5Sclose(mem);
    if (w < 0) goto done;
  }
  /* Cached chunks fail here on a full disk, not inside H5Dclose. */
  if (H5Dflush(dset) < 0) goto done;
  rc = 0;
done:
  free(buf);
  if (rc != 0) st_h5_discard(file); /* so the closes succeed (h5util.h) */
  /* These keep HDF5's error stack for the caller's message. */
  st_h5_close_dset(dset);
  st_h5_close_plist(dcpl);
  st_h5_close_space(space);
  return rc;
}

/* 0, or -1 with *why (HDF5's reason, one line) and *err (its errno). */
static int write_token_file(const char *tmp, const char *source, const uint32_t *ids,
                            const unsigned char *bytes,
                            int64_t train, int64_t val, double vf, const st_tokenizer *t,
                            char *why, size_t cap, int *err) {
  /* uint16 while every id fits, as llm.c and most tools expect; uint32 past */
  const int wide = st_tokenizer_vocab_size(t) > 65536;
  hid_t file = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  int rc = file < 0 ? -1 : 0;
  if (rc == 0 && (write_split(file, "/train", ids, bytes, train, wide) != 0 ||
                  write_split(file, "/val", ids ? ids + train : NULL, bytes ? bytes + train : NULL,
                              val, wide) != 0 ||
                  write_attrs(file, source, train, val, vf, t) != 0 ||
                  H5Fflush(file, H5F_SCOPE_LOCAL) < 0))
    rc = -1;
  if (rc != 0) {
    snprintf(why, cap, "%s", st_h5_why());
    *err = st_h5_errno();
  }
  if (file < 0) return rc;
  /* A failed write leaves data HDF5 would flush again on close, into the
   * same full disk: discard it first, so the close succeeds (h5util.h). */
  if (rc != 0) st_h5_discard(file);
  if (H5Fclose(file) < 0 && rc == 0) {
    rc = -1;
    snprintf(why, cap, "%s", st_h5_why());
    *err = st_h5_errno();
  }
  return rc;
}

int st_prep_check_args(const char *out_path, double val_fraction) {
  if (!(val_fraction > 0.0 && val_fraction <= 0.5)) /* also rejects NaN */
    return st_error_setc(ST_EXIT_USAGE, "--val-fraction %g is out of range; use a value in (0, 0.5], "
                               "e.g. 0.1", val_fraction);
  if (!out_path || !has_h5_extension(out_path))
    return st_error_setc(ST_EXIT_USAGE, "output %s must end in .h5 or .hdf5 (the trainer picks the "
                               "format by extension)", out_path ? out_path : "(none)");
  return check_out_dir(out_path);
}

int st_prep_write(const char *out_path, const char *label, const uint32_t *ids,
                  const unsigned char *bytes, int64_t n,
                  const st_tokenizer *t, double val_fraction, int64_t *train_tokens,
                  int64_t *val_tokens) {
  char tmp[4200];
  int64_t train = 0, val = 0;
  if (plan_split(label, n, val_fraction, &train, &val) != 0) return -1;
  st_h5_quiet();
  snprintf(tmp, sizeof tmp, "%s.tmp", out_path);
  char why[512] = "";
  int err = 0;
  int rc = write_token_file(tmp, label, ids, bytes, train, val, val_fraction, t, why, sizeof why,
                            &err);
  if (rc != 0) {
    unlink(tmp);
    if (err == ENOSPC || err == EDQUOT)
      return st_error_setc(ST_EXIT_ERROR, "%s writing %s: free space or choose another --out; %s "
                           "was not changed", err == ENOSPC ? "no space left on device" :
                           "disk quota exceeded", tmp, out_path);
    return st_error_setc(ST_EXIT_ERROR, "cannot write HDF5 token file %s (%s); %s was not changed",
                         tmp, why, out_path);
  }
  if (commit_tmp(tmp, out_path) != 0) return -1;
  if (train_tokens) *train_tokens = train;
  if (val_tokens) *val_tokens = val;
  return 0;
}

int st_prep_bytes(const char *input_path, const char *out_path, double val_fraction,
                  int64_t *train_tokens, int64_t *val_tokens) {
  text_input in;
  if (st_prep_check_args(out_path, val_fraction) != 0) return -1;
  if (!input_path || !input_path[0])
    return st_error_setc(ST_EXIT_USAGE, "no input given; pass --input TEXT (or - for stdin)");
  const char *label = strcmp(input_path, "-") ? input_path : "stdin";
  if (load_input(input_path, label, &in) != 0) return -1;
  st_tokenizer *t = st_tokenizer_bytes();
  int rc = t ? st_prep_write(out_path, label, NULL, in.data, (int64_t)in.n, t, val_fraction,
                             train_tokens, val_tokens)
             : -1;
  free_input(&in);
  st_tokenizer_free(t);
  return rc;
}

/* ---- llm.c .bin writer ---------------------------------------------------- */

static void put_le32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)v;
  p[1] = (unsigned char)(v >> 8);
  p[2] = (unsigned char)(v >> 16);
  p[3] = (unsigned char)(v >> 24);
}

/* Little-endian on disk whatever the host, as llm.c's readers expect.
 * Version 1 (t16) holds uint16 tokens, version 2 (t32) uint32. */
static int write_bin_body(FILE *f, const uint16_t *t16, const uint32_t *t32, int wide,
                          int64_t n) {
  unsigned char buf[1 << 15];
  const int w = wide ? 4 : 2;
  memset(buf, 0, LLMC_HEADER_INTS * 4);
  put_le32(buf, LLMC_MAGIC);
  put_le32(buf + 4, wide ? 2 : 1);
  put_le32(buf + 8, (uint32_t)n);
  if (fwrite(buf, 1, LLMC_HEADER_INTS * 4, f) != LLMC_HEADER_INTS * 4) return -1;
  for (int64_t off = 0; off < n;) {
    int64_t k = n - off;
    if (k > (int64_t)sizeof buf / w) k = (int64_t)sizeof buf / w;
    for (int64_t i = 0; i < k; i++) {
      if (wide) {
        put_le32(buf + 4 * i, t32[off + i]);
      } else {
        buf[2 * i] = (unsigned char)t16[off + i];
        buf[2 * i + 1] = (unsigned char)(t16[off + i] >> 8);
      }
    }
    if (fwrite(buf, (size_t)w, (size_t)k, f) != (size_t)k) return -1;
    off += k;
  }
  return fflush(f);
}

static int write_llmc(const char *path, const uint16_t *t16, const uint32_t *t32, int wide,
                      int64_t n) {
  char tmp[4200];
  if (!path || !path[0]) return st_error_setc(ST_EXIT_USAGE, "no output path for the llm.c shard");
  if (n < 0 || n > INT32_MAX || (n > 0 && !(wide ? (const void *)t32 : (const void *)t16)))
    return st_error_setc(ST_EXIT_USAGE, "cannot write %lld tokens to %s: an llm.c shard holds 0 to "
                               "%d tokens; split the data into several shards",
                (long long)n, path, INT32_MAX);
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
    return st_error_setc(ST_EXIT_USAGE, "output path is too long: %s", path);
  FILE *f = fopen(tmp, "wb");
  if (!f)
    return st_error_setc(ST_EXIT_ERROR, "cannot create %s (for %s): %s; check that the directory exists "
                               "and is writable", tmp, path, strerror(errno));
  int rc = write_bin_body(f, t16, t32, wide, n);
  int err = errno;
  if (fclose(f) != 0 && rc == 0) {
    rc = -1;
    err = errno;
  }
  if (rc != 0) {
    unlink(tmp);
    return st_error_setc(ST_EXIT_ERROR, "cannot write %s: %s; %s was not changed", tmp, strerror(err),
                path);
  }
  return commit_tmp(tmp, path);
}

int st_write_llmc_bin(const char *path, const uint16_t *tokens, int64_t n) {
  return write_llmc(path, tokens, NULL, 0, n);
}

int st_write_llmc_bin32(const char *path, const uint32_t *tokens, int64_t n) {
  return write_llmc(path, NULL, tokens, 1, n);
}
