/* h5util.h - small helpers over the serial HDF5 C API.
 *
 * HDF5 prints its own error stack to stderr by default; shardtrain turns
 * that off (st_h5_quiet) and reports failures through st_error with a
 * message naming the file and the fix. st_h5_why() recovers the most
 * specific HDF5 description (e.g. a Fletcher-32 checksum failure) so the
 * message still carries HDF5's reason.
 *
 * Attribute helpers write scalar int/int64/double/string attributes and
 * small uint64 arrays on any object (file, group, dataset) and read them
 * back. Strings are variable-length UTF-8 so that h5py returns `str`.
 */
#ifndef ST_H5UTIL_H
#define ST_H5UTIL_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

/* Turn off HDF5's automatic error printing (idempotent). */
void st_h5_quiet(void);

/* The innermost description on HDF5's current error stack, on one line,
 * or "no details from HDF5" when the stack is empty. A failed read or write
 * of the file itself is reported as strerror of its errno ("No space left
 * on device"), not HDF5's multi-line dump. Call right after the failing
 * HDF5 call. */
const char *st_h5_why(void);

/* The errno of the system call behind the last st_h5_why() (e.g. ENOSPC),
 * or 0 when HDF5's error was not a failed system call. */
int st_h5_errno(void);

/* After a write into the file holding `obj` failed (a full disk): point the
 * file's descriptor at an in-memory copy of what reached the disk, so the
 * closes that follow (which flush again) succeed and release every id.
 * HDF5 before 1.14.1 keeps a freed file in its id table when closing it
 * fails, and crashes at exit closing it again (a segfault in
 * H5F__close_cb); the file's content is garbage afterwards and the caller
 * deletes it. Sec2 (default driver) files only; keeps the error stack.
 * The process's soft file size limit (RLIMIT_FSIZE, which binds the
 * in-memory copy too) is raised to its hard limit and left there; under a
 * hard limit below the file's size the close can still fail.
 * 0, or -1 when the descriptor could not be replaced. */
int st_h5_discard(hid_t obj);

/* Reserve `bytes` of disk from offset 0 of the open sec2 file f (its size
 * unchanged: FALLOC_FL_KEEP_SIZE). Called with the file's address space
 * (H5Fget_filesize) before H5Fflush, it makes a full disk an error here
 * and not of the metadata flush: a failed H5Fflush leaves HDF5 1.10's
 * metadata cache unable to flush again ("slist already enabled"), so the
 * close fails too, and st_h5_discard cannot help. 0 (also where the
 * filesystem cannot preallocate), or ENOSPC, EDQUOT, EFBIG (past the
 * process's file size limit, RLIMIT_FSIZE) or EIO. */
int st_h5_reserve(hid_t f, uint64_t bytes);

/* After closing the file at path: free what st_h5_reserve took past its
 * end. Best effort. */
void st_h5_unreserve(const char *path);

/* File access property list: latest-compatible defaults, and file locking
 * that is used where the filesystem supports it and ignored where it does
 * not (Lustre/NFS mounts without flock would otherwise refuse to open). */
hid_t st_h5_fapl(void);

/* Attributes. Writers: 0 or -1 (st_error not set; the caller names the
 * file). Readers: 0, or -1 when missing or of the wrong kind. */
int st_h5_attr_put_int(hid_t obj, const char *name, int v);
int st_h5_attr_put_i64(hid_t obj, const char *name, int64_t v);
int st_h5_attr_put_double(hid_t obj, const char *name, double v);
int st_h5_attr_put_str(hid_t obj, const char *name, const char *s);
int st_h5_attr_put_u64s(hid_t obj, const char *name, const uint64_t *v, int n);

int st_h5_attr_get_int(hid_t obj, const char *name, int *v);
int st_h5_attr_get_i64(hid_t obj, const char *name, int64_t *v);
int st_h5_attr_get_double(hid_t obj, const char *name, double *v);
/* Reads a fixed- or variable-length string attribute into buf (truncated
 * to cap-1 characters, always NUL-terminated). */
int st_h5_attr_get_str(hid_t obj, const char *name, char *buf, size_t cap);
/* The whole string attribute, malloc'd (the caller frees); NULL when it is
 * absent, not a string or cannot be read. */
char *st_h5_attr_get_str_dup(hid_t obj, const char *name);
int st_h5_attr_get_u64s(hid_t obj, const char *name, uint64_t *v, int n);

/* Select, on a dataspace of a tensor of shape [rows, cols] (ndim 2) or [n]
 * (ndim 1), the elements whose row-major flat index lies in [a, b). A flat
 * range of a 2-D tensor is up to three blocks: the tail of the first row,
 * whole rows, the head of the last row; they are OR-ed together so the
 * selection's row-major order equals the flat order. b > a required. */
int st_h5_select_flat(hid_t space, int ndim, const int64_t *shape, int64_t a, int64_t b);

/* Close helpers that ignore invalid (<0) ids, for cleanup paths. */
void st_h5_close_file(hid_t f);
void st_h5_close_group(hid_t g);
void st_h5_close_dset(hid_t d);
void st_h5_close_space(hid_t s);
void st_h5_close_plist(hid_t p);

#endif
