/* tokens_tokenizer.c - the tokenizer a token file records (tokens.h): its
 * identity attributes and the files stored under /tokenizer. Read-only. */
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "io/h5util.h"
#include "io/tokenizer.h"
#include "io/tokens.h"
#include "util/error.h"

#define data_error(...) st_error_setc(ST_EXIT_DATA, __VA_ARGS__)

static int is_h5(const char *path) {
  const char *dot = strrchr(path, '.');
  return dot && (!strcasecmp(dot, ".h5") || !strcasecmp(dot, ".hdf5"));
}

/* String attribute name of loc into buf; 0 absent, 1 read, -1 bad. */
static int str_attr(hid_t loc, const char *name, char *buf, size_t cap) {
  if (H5Aexists(loc, name) <= 0) return 0;
  hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
  hid_t ft = a < 0 ? -1 : H5Aget_type(a);
  int rc = -1;
  if (ft >= 0 && H5Tget_class(ft) == H5T_STRING && !H5Tis_variable_str(ft)) {
    size_t n = H5Tget_size(ft);
    char *tmp = calloc(n + 1, 1);
    hid_t mt = H5Tcopy(ft);
    if (tmp && mt >= 0 && H5Aread(a, mt, tmp) >= 0) {
      snprintf(buf, cap, "%s", tmp);
      rc = 1;
    }
    if (mt >= 0) H5Tclose(mt);
    free(tmp);
  }
  if (ft >= 0) H5Tclose(ft);
  if (a >= 0) H5Aclose(a);
  return rc;
}

static int int_attr(hid_t loc, const char *name, long long *v) {
  if (H5Aexists(loc, name) <= 0) return 0;
  hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
  int rc = a >= 0 && H5Aread(a, H5T_NATIVE_LLONG, v) >= 0 ? 1 : -1;
  if (a >= 0) H5Aclose(a);
  return rc;
}

int st_tokens_tokenizer_info(const char *path, st_tokens_tokenizer *info) {
  memset(info, 0, sizeof *info);
  info->eot = -1;
  if (!is_h5(path)) return 0; /* .bin: nothing recorded */
  st_h5_quiet();
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return data_error("cannot open HDF5 file %s to read its tokenizer", path);
  long long vocab = 0, eot = -1;
  int has_name = str_attr(f, "tokenizer", info->name, sizeof info->name);
  int has_digest = str_attr(f, "tokenizer_digest", info->digest, sizeof info->digest);
  int has_vocab = int_attr(f, "vocab_size", &vocab);
  int has_eot = int_attr(f, "eot_token", &eot);
  H5Fclose(f);
  if (has_name < 0 || has_digest < 0 || has_vocab < 0 || has_eot < 0)
    return data_error("the tokenizer attributes of %s (tokenizer, tokenizer_digest, vocab_size, "
                      "eot_token) are unreadable; regenerate it with `shardtrain prep`", path);
  info->vocab_size = (int)vocab;
  info->eot = eot;
  if (has_digest) {
    info->known = 1;
  } else if (has_name && (!strcmp(info->name, "byte") || !strcmp(info->name, "bytes"))) {
    /* prep before tokenizer digests: always the byte tokenizer */
    st_tokenizer *b = st_tokenizer_bytes();
    if (!b) return -1;
    snprintf(info->name, sizeof info->name, "bytes");
    snprintf(info->digest, sizeof info->digest, "%s", st_tokenizer_digest(b));
    info->vocab_size = 256;
    st_tokenizer_free(b);
    info->known = 1;
  }
  return 0;
}

int st_tokens_extract_tokenizer(const char *path, const char *dir, int *written) {
  *written = 0;
  if (!is_h5(path)) return 0;
  st_h5_quiet();
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return data_error("cannot open HDF5 file %s to read its tokenizer files", path);
  if (H5Lexists(f, "/tokenizer", H5P_DEFAULT) <= 0) {
    H5Fclose(f);
    return 0;
  }
  hid_t g = H5Gopen2(f, "/tokenizer", H5P_DEFAULT);
  H5G_info_t gi;
  int rc = g >= 0 && H5Gget_info(g, &gi) >= 0 ? 0 : -1;
  enum { MAXF = 4 };
  char names[MAXF][64];
  unsigned char *data[MAXF] = {0};
  size_t lens[MAXF] = {0};
  int n = 0;
  for (hsize_t i = 0; rc == 0 && i < gi.nlinks && n < MAXF; i++) {
    if (H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, names[n], sizeof names[n],
                           H5P_DEFAULT) < 0 ||
        strchr(names[n], '/') || names[n][0] == '.') {
      rc = -1;
      break;
    }
    hid_t d = H5Dopen2(g, names[n], H5P_DEFAULT);
    hid_t sp = d < 0 ? -1 : H5Dget_space(d);
    hssize_t len = sp < 0 ? -1 : H5Sget_simple_extent_npoints(sp);
    data[n] = len < 0 ? NULL : malloc((size_t)len + 1);
    if (!data[n] || (len > 0 && H5Dread(d, H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                        data[n]) < 0))
      rc = -1;
    else
      lens[n++] = (size_t)len;
    if (sp >= 0) H5Sclose(sp);
    if (d >= 0) H5Dclose(d);
  }
  if (g >= 0) H5Gclose(g);
  H5Fclose(f);
  if (rc != 0) {
    for (int i = 0; i < MAXF; i++) free(data[i]);
    return data_error("cannot read the tokenizer files stored in %s (/tokenizer); regenerate it "
                      "with `shardtrain prep`", path);
  }
  const char *np[MAXF];
  const unsigned char *dp[MAXF];
  for (int i = 0; i < n; i++) {
    np[i] = names[i];
    dp[i] = data[i];
  }
  rc = st_tokenizer_write_files(dir, n, np, dp, lens);
  for (int i = 0; i < MAXF; i++) free(data[i]);
  if (rc == 0) *written = n;
  return rc;
}
