/* shard_io.c - writing one sharded HDF5 tensor set (shard_io.h): the rank
 * file's pieces, the index's virtual datasets, and closing a file so that a
 * full disk is an error of a call that can say so. */
#define _XOPEN_SOURCE 700
#include "io/shard_io.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "io/h5util.h"
#include "util/error.h"

#define SHARD_CHUNK 65536 /* elements per chunk: 256 KiB, one checksum each */

int st_shard_agree(st_comm *c, int failed) {
  int who = failed ? c->rank + 1 : 0;
  if (c->all_reduce_int_max(c, &who, 1) != 0) return -1;
  if (who == 0) return 0;
  char msg[1536] = "";
  if (c->rank == who - 1) snprintf(msg, sizeof msg, "%s", st_error_msg());
  if (c->broadcast(c, msg, sizeof msg, who - 1) != 0) return -1;
  if (!failed) st_error_set("rank %d failed: %s", who - 1, msg);
  return -1;
}

int st_shard_io_failed(int err, const char *doing, const char *path, const char *dset,
                       const char *why) {
  if (err == ENOSPC || err == EDQUOT)
    return st_error_set("%s writing %s%s%s: free space or choose another --out",
                        err == ENOSPC ? "no space left on device" : "disk quota exceeded",
                        dset ? dset : "", dset ? " in " : "", path);
  if (err == EFBIG)
    return st_error_set("file too large writing %s%s%s (past the file size limit, ulimit -f, "
                        "or the filesystem's): raise the limit or choose another --out",
                        dset ? dset : "", dset ? " in " : "", path);
  if (dset) return st_error_set("cannot %s %s in %s: %s", doing, dset, path, why);
  return st_error_set("cannot %s %s: %s", doing, path, why);
}

int st_shard_h5_failed(const char *doing, const char *path, const char *dset) {
  const char *why = st_h5_why();
  return st_shard_io_failed(st_h5_errno(), doing, path, dset, why);
}

int st_shard_fsync_file(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return st_error_set("cannot open %s to sync it: %s", path, strerror(errno));
  int rc = fsync(fd), err = errno;
  close(fd);
  if (rc != 0) return st_shard_io_failed(err, "sync to disk", path, NULL, strerror(err));
  return 0;
}

int st_shard_overlap(const st_tensor *t, int64_t b, int64_t e, int64_t *lo, int64_t *hi) {
  *lo = t->offset > b ? t->offset : b;
  *hi = t->offset + t->numel < e ? t->offset + t->numel : e;
  return *hi > *lo;
}

int st_shard_write_piece(hid_t grp, const st_tensor *t, int64_t lo, int64_t hi,
                         const float *src) {
  hsize_t n = (hsize_t)(hi - lo), chunk = n < SHARD_CHUNK ? n : SHARD_CHUNK;
  hid_t space = H5Screate_simple(1, &n, NULL);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  hid_t d = -1;
  int rc = -1;
  if (space < 0 || dcpl < 0 || H5Pset_chunk(dcpl, 1, &chunk) < 0 || H5Pset_fletcher32(dcpl) < 0)
    goto out;
  d = H5Dcreate2(grp, t->name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  if (d < 0 || H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, src) < 0) goto out;
  if (st_h5_attr_put_i64(d, "tensor_begin", lo - t->offset) ||
      st_h5_attr_put_i64(d, "flat_begin", lo))
    goto out;
  /* Chunks still cached are written here, where a full disk is an error
   * of this call, and not inside H5Dclose (see st_h5_discard). */
  if (H5Dflush(d) < 0) goto out;
  rc = 0;
out:
  if (rc != 0) st_h5_discard(grp); /* so the closes below and the file's succeed */
  st_h5_close_dset(d);
  st_h5_close_plist(dcpl);
  st_h5_close_space(space);
  return rc;
}

int st_shard_write_vds(hid_t grp, const char *gname, const st_tensor *t,
                       const st_partition *part) {
  hsize_t dims[2] = {(hsize_t)t->shape[0], (hsize_t)t->shape[1]};
  hid_t space = H5Screate_simple(t->ndim, dims, NULL);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  hid_t d = -1;
  int rc = -1;
  float fill = NAN; /* unmapped or unreadable source: NaN, never plausible zeros */
  if (space < 0 || dcpl < 0 || H5Pset_fill_value(dcpl, H5T_NATIVE_FLOAT, &fill) < 0) goto out;
  for (int r = 0; r < part->world; r++) {
    int64_t rb, re, lo, hi;
    st_partition_range(part, r, &rb, &re);
    if (!st_shard_overlap(t, rb, re, &lo, &hi)) continue;
    char file[32], dset[ST_MAX_NAME + 16];
    snprintf(file, sizeof file, "rank_%05d.h5", r);
    snprintf(dset, sizeof dset, "/%s/%s", gname, t->name);
    hsize_t n = (hsize_t)(hi - lo);
    hid_t src = H5Screate_simple(1, &n, NULL);
    herr_t e = -1;
    if (src >= 0 && st_h5_select_flat(space, t->ndim, t->shape, lo - t->offset,
                                      hi - t->offset) == 0)
      e = H5Pset_virtual(dcpl, space, file, dset, src);
    st_h5_close_space(src);
    if (e < 0) goto out;
  }
  H5Sselect_all(space);
  d = H5Dcreate2(grp, t->name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  if (d >= 0) rc = 0;
out:
  st_h5_close_dset(d);
  st_h5_close_plist(dcpl);
  st_h5_close_space(space);
  return rc;
}

int st_shard_reserve_rest(hid_t f, const char *path) {
  hsize_t size = 0;
  if (H5Fget_filesize(f, &size) < 0) return st_shard_h5_failed("read the size of", path, NULL);
  int err = st_h5_reserve(f, (uint64_t)size + 4096); /* a page of margin */
  return err ? st_shard_io_failed(err, "reserve space for", path, NULL, strerror(err)) : 0;
}

hid_t st_shard_create_file(const char *path) {
  hid_t fapl = st_h5_fapl();
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  st_h5_close_plist(fapl);
  if (f < 0) st_shard_h5_failed("create", path, NULL);
  return f;
}

int st_shard_finish_file(hid_t f, const char *path, int rc) {
  if (rc == 0) rc = st_shard_reserve_rest(f, path);
  if (rc == 0 && H5Fflush(f, H5F_SCOPE_LOCAL) < 0) rc = st_shard_h5_failed("flush", path, NULL);
  /* After a failure the close would flush again into the same full disk. */
  if (rc != 0) st_h5_discard(f);
  if (H5Fclose(f) < 0 && rc == 0) rc = st_shard_h5_failed("close", path, NULL);
  st_h5_unreserve(path);
  if (rc == 0) rc = st_shard_fsync_file(path);
  return rc;
}
