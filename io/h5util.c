/* h5util.c - small helpers over the serial HDF5 C API (see h5util.h).
 *
 * Everything here returns 0/-1 without setting st_error: the callers know
 * which file and dataset they were working on and write the message.
 */
#define _GNU_SOURCE /* memfd_create */
#include "io/h5util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static void close_keep(herr_t (*fn)(hid_t), hid_t id);

void st_h5_quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

/* ------------------------------------------------------------------------
 * Error stack
 * --------------------------------------------------------------------- */

static _Thread_local char g_why[512];
static _Thread_local int g_errno;

/* Called innermost-first (H5E_WALK_UPWARD): the first entry is where HDF5
 * detected the problem, e.g. "data error detected by Fletcher32 checksum".
 * A failed system call's entry reads "file write failed: time = <ctime,
 * with its newline>, filename = ..., errno = 28, error message = ...": keep
 * its errno, which is what the user can act on, and never the dump. */
static herr_t why_walk(unsigned n, const H5E_error2_t *e, void *data) {
  char *out = data;
  if (n > 0 || !e->desc) return 0;
  const char *en = strstr(e->desc, "errno = ");
  if (en && (g_errno = atoi(en + 8)) > 0) {
    snprintf(out, sizeof g_why, "%s", strerror(g_errno));
    return 0;
  }
  g_errno = 0;
  char minor[160] = "";
  H5E_type_t type;
  if (H5Eget_msg(e->min_num, &type, minor, sizeof minor) < 0) minor[0] = 0;
  if (minor[0] && strcmp(minor, e->desc) != 0)
    snprintf(out, sizeof g_why, "%s: %s", minor, e->desc);
  else
    snprintf(out, sizeof g_why, "%s", e->desc);
  char *t = strstr(out, ": time = "); /* a short read's ctime and dump: not for users */
  if (t) *t = 0;
  out[strcspn(out, "\n")] = 0; /* one line */
  return 0;
}

const char *st_h5_why(void) {
  g_why[0] = 0;
  g_errno = 0;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, why_walk, g_why);
  if (!g_why[0]) snprintf(g_why, sizeof g_why, "no details from HDF5");
  return g_why;
}

int st_h5_errno(void) { return g_errno; }

/* What reached the disk, copied into a fresh in-memory file; -1 on failure.
 * Reads of metadata HDF5 already evicted still find it there. */
static int memory_copy(int fd) {
  int m = memfd_create("shardtrain-discarded-h5", MFD_CLOEXEC);
  if (m < 0) return -1;
  char buf[1 << 16];
  struct stat st;
  const off_t end = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? st.st_size : 0;
  for (off_t off = 0; off < end;) { /* bounded: a device such as /dev/full reads forever */
    ssize_t r = pread(fd, buf, sizeof buf, off);
    if (r <= 0) break; /* what could not be read stays zeros: it is deleted anyway */
    if (pwrite(m, buf, (size_t)r, off) != r) break;
    off += r;
  }
  return m;
}

/* The descriptor of a sec2 (default driver) file, or -1. */
static int sec2_fd(hid_t f) {
  hid_t fapl = H5Fget_access_plist(f);
  void *handle = NULL;
  int fd = -1;
  if (fapl >= 0 && H5Pget_driver(fapl) == H5FD_SEC2 &&
      H5Fget_vfd_handle(f, H5P_DEFAULT, &handle) >= 0 && handle)
    fd = *(int *)handle;
  if (fapl >= 0) H5Pclose(fapl);
  return fd;
}

int st_h5_reserve(hid_t f, uint64_t bytes) {
  /* fallocate(KEEP_SIZE) does not check the size limit; the writes would. */
  struct rlimit rl;
  if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && bytes > rl.rlim_cur)
    return EFBIG;
  hid_t stack = H5Eget_current_stack();
  int fd = sec2_fd(f), err = 0;
  if (stack >= 0) H5Eset_current_stack(stack);
  if (fd < 0) return 0;
  if (fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)bytes) != 0) err = errno;
  /* Anything else (EOPNOTSUPP, EINVAL, ...) means it cannot preallocate here. */
  return err == ENOSPC || err == EDQUOT || err == EFBIG || err == EIO ? err : 0;
}

void st_h5_unreserve(const char *path) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0) return;
  /* Shrinking frees every block past the new end, the reserved ones too. */
  if (fstat(fd, &st) == 0 && ftruncate(fd, st.st_size + 1) == 0 &&
      ftruncate(fd, st.st_size) != 0)
    fprintf(stderr, "shardtrain: warning: %s may be one byte longer than written\n", path);
  close(fd);
}

int st_h5_discard(hid_t obj) {
  /* RLIMIT_FSIZE limits the in-memory file too: lift the soft limit as far
   * as the hard one allows, or a limit that failed the writes fails the
   * close as well. The caller is giving up on this file and exiting. */
  struct rlimit rl;
  if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_FSIZE, &rl);
  }
  hid_t stack = H5Eget_current_stack();
  hid_t f = H5Iget_file_id(obj);
  const int fd = f >= 0 ? sec2_fd(f) : -1;
  int rc = -1;
  if (fd >= 0) {
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_nlink == 0) {
      rc = 0; /* already an in-memory (unlinked) file: discarded before */
    } else {
      int m = memory_copy(fd);
      if (m >= 0) {
        rc = dup2(m, fd) < 0 ? -1 : 0;
        close(m);
      }
    }
  }
  if (f >= 0) H5Fclose(f); /* the extra id only; the file stays open */
  if (stack >= 0) H5Eset_current_stack(stack);
  return rc;
}

hid_t st_h5_fapl(void) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl < 0) return H5P_DEFAULT;
#if H5_VERSION_GE(1, 10, 7)
  /* Keep HDF5's locks where they work; do not fail where flock is absent. */
  H5Pset_file_locking(fapl, 1, 1);
#endif
  return fapl;
}

/* ------------------------------------------------------------------------
 * Attributes
 * --------------------------------------------------------------------- */

/* Create (replacing any existing one) and write an attribute. */
static int attr_put(hid_t obj, const char *name, hid_t ftype, hid_t mtype, hid_t space,
                    const void *buf) {
  if (H5Aexists(obj, name) > 0 && H5Adelete(obj, name) < 0) return -1;
  hid_t a = H5Acreate2(obj, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT);
  if (a < 0) return -1;
  herr_t rc = H5Awrite(a, mtype, buf);
  close_keep(H5Aclose, a);
  return rc < 0 ? -1 : 0;
}

static int attr_put_scalar(hid_t obj, const char *name, hid_t ftype, hid_t mtype,
                           const void *buf) {
  hid_t s = H5Screate(H5S_SCALAR);
  if (s < 0) return -1;
  int rc = attr_put(obj, name, ftype, mtype, s, buf);
  st_h5_close_space(s);
  return rc;
}

int st_h5_attr_put_int(hid_t obj, const char *name, int v) {
  return attr_put_scalar(obj, name, H5T_STD_I32LE, H5T_NATIVE_INT, &v);
}

int st_h5_attr_put_i64(hid_t obj, const char *name, int64_t v) {
  return attr_put_scalar(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v);
}

int st_h5_attr_put_double(hid_t obj, const char *name, double v) {
  return attr_put_scalar(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v);
}

/* Variable-length UTF-8 so h5py hands back a str, not bytes. */
static hid_t vlen_str_type(void) {
  hid_t t = H5Tcopy(H5T_C_S1);
  if (t < 0) return -1;
  if (H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
    H5Tclose(t);
    return -1;
  }
  return t;
}

int st_h5_attr_put_str(hid_t obj, const char *name, const char *s) {
  hid_t t = vlen_str_type();
  if (t < 0) return -1;
  int rc = attr_put_scalar(obj, name, t, t, &s);
  close_keep(H5Tclose, t);
  return rc;
}

int st_h5_attr_put_u64s(hid_t obj, const char *name, const uint64_t *v, int n) {
  hsize_t dim = (hsize_t)n;
  hid_t s = H5Screate_simple(1, &dim, NULL);
  if (s < 0) return -1;
  int rc = attr_put(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, s, v);
  st_h5_close_space(s);
  return rc;
}

/* Read an attribute of exactly `n` elements (1 for scalars) as mtype. */
static int attr_get(hid_t obj, const char *name, hid_t mtype, void *buf, hssize_t n) {
  if (H5Aexists(obj, name) <= 0) return -1;
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  if (a < 0) return -1;
  hid_t s = H5Aget_space(a);
  int rc = -1;
  if (s >= 0 && H5Sget_simple_extent_npoints(s) == n && H5Aread(a, mtype, buf) >= 0) rc = 0;
  if (s >= 0) H5Sclose(s);
  H5Aclose(a);
  return rc;
}

int st_h5_attr_get_int(hid_t obj, const char *name, int *v) {
  return attr_get(obj, name, H5T_NATIVE_INT, v, 1);
}

int st_h5_attr_get_i64(hid_t obj, const char *name, int64_t *v) {
  return attr_get(obj, name, H5T_NATIVE_INT64, v, 1);
}

int st_h5_attr_get_double(hid_t obj, const char *name, double *v) {
  return attr_get(obj, name, H5T_NATIVE_DOUBLE, v, 1);
}

int st_h5_attr_get_u64s(hid_t obj, const char *name, uint64_t *v, int n) {
  return attr_get(obj, name, H5T_NATIVE_UINT64, v, n);
}

static int read_vlen_str(hid_t a, char *buf, size_t cap) {
  hid_t t = vlen_str_type();
  hid_t s = H5Screate(H5S_SCALAR);
  char *p = NULL;
  int rc = -1;
  if (t >= 0 && s >= 0 && H5Aread(a, t, &p) >= 0) {
    snprintf(buf, cap, "%s", p ? p : "");
    H5Dvlen_reclaim(t, s, H5P_DEFAULT, &p);
    rc = 0;
  }
  if (s >= 0) H5Sclose(s);
  if (t >= 0) H5Tclose(t);
  return rc;
}

static int read_fixed_str(hid_t a, hid_t ftype, char *buf, size_t cap) {
  size_t n = H5Tget_size(ftype);
  char *tmp = calloc(n + 1, 1);
  hid_t t = H5Tcopy(ftype);
  int rc = -1;
  if (tmp && t >= 0 && H5Aread(a, t, tmp) >= 0) {
    snprintf(buf, cap, "%s", tmp);
    rc = 0;
  }
  if (t >= 0) H5Tclose(t);
  free(tmp);
  return rc;
}

int st_h5_attr_get_str(hid_t obj, const char *name, char *buf, size_t cap) {
  if (cap == 0 || H5Aexists(obj, name) <= 0) return -1;
  buf[0] = 0;
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  if (a < 0) return -1;
  hid_t ft = H5Aget_type(a);
  int rc = -1;
  if (ft >= 0 && H5Tget_class(ft) == H5T_STRING)
    rc = H5Tis_variable_str(ft) > 0 ? read_vlen_str(a, buf, cap) : read_fixed_str(a, ft, buf, cap);
  if (ft >= 0) H5Tclose(ft);
  H5Aclose(a);
  return rc;
}

char *st_h5_attr_get_str_dup(hid_t obj, const char *name) {
  if (H5Aexists(obj, name) <= 0) return NULL;
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  if (a < 0) return NULL;
  hid_t ft = H5Aget_type(a);
  char *out = NULL;
  if (ft >= 0 && H5Tget_class(ft) == H5T_STRING && H5Tis_variable_str(ft) > 0) {
    hid_t t = vlen_str_type();
    hid_t s = H5Screate(H5S_SCALAR);
    char *p = NULL;
    if (t >= 0 && s >= 0 && H5Aread(a, t, &p) >= 0) {
      out = strdup(p ? p : "");
      H5Dvlen_reclaim(t, s, H5P_DEFAULT, &p);
    }
    if (s >= 0) H5Sclose(s);
    if (t >= 0) H5Tclose(t);
  } else if (ft >= 0 && H5Tget_class(ft) == H5T_STRING) {
    size_t cap = H5Tget_size(ft) + 1;
    out = malloc(cap);
    if (out && read_fixed_str(a, ft, out, cap) != 0) {
      free(out);
      out = NULL;
    }
  }
  if (ft >= 0) H5Tclose(ft);
  H5Aclose(a);
  return out;
}

/* ------------------------------------------------------------------------
 * Selections
 * --------------------------------------------------------------------- */

static int add_block(hid_t space, int *first, hsize_t r, hsize_t c, hsize_t nr, hsize_t nc) {
  hsize_t start[2] = {r, c}, count[2] = {nr, nc};
  H5S_seloper_t op = *first ? H5S_SELECT_SET : H5S_SELECT_OR;
  *first = 0;
  return H5Sselect_hyperslab(space, op, start, NULL, count, NULL) < 0 ? -1 : 0;
}

int st_h5_select_flat(hid_t space, int ndim, const int64_t *shape, int64_t a, int64_t b) {
  if (b <= a) return -1;
  if (ndim == 1) {
    hsize_t start = (hsize_t)a, count = (hsize_t)(b - a);
    return H5Sselect_hyperslab(space, H5S_SELECT_SET, &start, NULL, &count, NULL) < 0 ? -1 : 0;
  }
  const int64_t cols = shape[1];
  int64_t r0 = a / cols, c0 = a % cols; /* first element */
  int64_t r1 = b / cols, c1 = b % cols; /* one past the last */
  int first = 1;
  if (r0 == r1) /* inside one row */
    return add_block(space, &first, (hsize_t)r0, (hsize_t)c0, 1, (hsize_t)(c1 - c0));
  if (c0 > 0) { /* tail of the first row */
    if (add_block(space, &first, (hsize_t)r0, (hsize_t)c0, 1, (hsize_t)(cols - c0))) return -1;
    r0++;
  }
  if (r1 > r0 && add_block(space, &first, (hsize_t)r0, 0, (hsize_t)(r1 - r0), (hsize_t)cols))
    return -1;
  if (c1 > 0 && add_block(space, &first, (hsize_t)r1, 0, 1, (hsize_t)c1)) return -1;
  return 0;
}

/* ------------------------------------------------------------------------
 * Cleanup
 * --------------------------------------------------------------------- */

/* Closing an id is itself an API call, which clears HDF5's error stack;
 * keep the stack so st_h5_why() still explains the failure afterwards. */
static void close_keep(herr_t (*fn)(hid_t), hid_t id) {
  if (id < 0) return;
  hid_t stack = H5Eget_current_stack();
  fn(id);
  if (stack >= 0) H5Eset_current_stack(stack);
}

void st_h5_close_file(hid_t f) { close_keep(H5Fclose, f); }
void st_h5_close_group(hid_t g) { close_keep(H5Gclose, g); }
void st_h5_close_dset(hid_t d) { close_keep(H5Dclose, d); }
void st_h5_close_space(hid_t s) { close_keep(H5Sclose, s); }
void st_h5_close_plist(hid_t p) {
  if (p != H5P_DEFAULT) close_keep(H5Pclose, p);
}
