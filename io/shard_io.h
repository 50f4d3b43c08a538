/* shard_io.h - the pieces every sharded HDF5 tensor set is written with:
 * checkpoints (RUN/ckpt/step_N, checkpoint_write.c) and gradient dumps
 * (RUN/grads/step_N, grad_dump.c) share one layout. Each rank file holds,
 * per tensor, the 1-D piece of the flat vector that falls in the rank's
 * partition (chunked, Fletcher-32); index.h5 holds virtual datasets of the
 * tensors' full shapes that map every rank file's piece into place. Every
 * error path sets st_error with one line naming the file and dataset; a
 * full disk or quota names the fix (free space or another --out). */
#ifndef ST_SHARD_IO_H
#define ST_SHARD_IO_H

#include <hdf5.h>
#include <stdint.h>

#include "collectives/collectives.h"
#include "rank/model/params.h"
#include "rank/optim/partition.h"

/* Collective agreement between the stages of a save: every rank learns
 * whether any failed; then each returns -1 and st_error holds the lowest
 * failing rank's message ("rank R failed: ..." on the others). 0 when none
 * failed. */
int st_shard_agree(st_comm *c, int failed);

/* "cannot DOING [DSET in] PATH: WHY", or for ENOSPC/EDQUOT/EFBIG the cause,
 * the file and the fix. Returns -1. */
int st_shard_io_failed(int err, const char *doing, const char *path, const char *dset,
                       const char *why);

/* The same for a failed HDF5 call, right after it (HDF5's error stack). -1. */
int st_shard_h5_failed(const char *doing, const char *path, const char *dset);

/* fsync a file by path. 0, or -1 with st_error. */
int st_shard_fsync_file(const char *path);

/* Intersection [*lo, *hi) of tensor t with the flat range [b, e); 0 when
 * empty, 1 otherwise. */
int st_shard_overlap(const st_tensor *t, int64_t b, int64_t e, int64_t *lo, int64_t *hi);

/* Write /GROUP/<t->name> into grp: elements [lo, hi) of the flat vector
 * (src[0] is flat element lo), float32, chunked by 65536 elements with one
 * Fletcher-32 checksum each, attributes tensor_begin and flat_begin. 0, or
 * -1 (HDF5's stack holds why; the caller names the file). */
int st_shard_write_piece(hid_t grp, const st_tensor *t, int64_t lo, int64_t hi,
                         const float *src);

/* A virtual dataset /gname/<t->name> in grp of t's full shape, mapping the
 * piece of every rank of part that overlaps t (rank_NNNNN.h5, relative
 * names, so the directory can be renamed and copied); unmapped elements
 * read as NaN. 0, or -1. */
int st_shard_write_vds(hid_t grp, const char *gname, const st_tensor *t,
                       const st_partition *part);

/* Before the metadata flush of f (at path): every byte the file will occupy
 * reserved on disk, so a full disk is reported here and never by H5Fflush.
 * 0, or -1 with st_error. */
int st_shard_reserve_rest(hid_t f, const char *path);

/* Create (truncate) the HDF5 file at path with the project's file access
 * properties. The file, or -1 with st_error naming it. */
hid_t st_shard_create_file(const char *path);

/* Flush, close and fsync f (at path), after rc (the status so far): a
 * failed file is discarded, not flushed again into a full disk. Returns the
 * first failure (-1 with st_error) or 0. */
int st_shard_finish_file(hid_t f, const char *path, int rc);

#endif
