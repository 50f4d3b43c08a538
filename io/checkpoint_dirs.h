/* checkpoint_dirs.h - the step directories of a run as the truth about its
 * checkpoints: listing, completeness, the newest complete one, retention
 * (--keep-last). RUN/ckpt/latest is only a pointer into them
 * (docs/checkpoints.md).
 *
 * A step directory is complete when its index.h5 opens and names
 * rank_files N, and rank_00000.h5 .. rank_{N-1}.h5 all exist. (Checksums
 * are st_ckpt_verify's job; completeness is the cheap structural test.)
 * `.tmp_step_*` directories are unfinished saves and never count.
 */
#ifndef ST_CHECKPOINT_DIRS_H
#define ST_CHECKPOINT_DIRS_H

#include <stddef.h>
#include <stdint.h>

#define ST_CKPT_MAX_LIST 100000 /* step directories looked at per run */

typedef struct {
  char name[64];   /* step_00001000, or .tmp_step_00001000 */
  int64_t step;
  int tmp;         /* a .tmp_ directory: an unfinished save */
} st_ckpt_entry;

/* The step directories (and .tmp_ ones) of run_dir/ckpt, newest step
 * first (at equal step the finished one first). *out is malloc'ed (free
 * it), *n its length; a missing ckpt/ gives 0 entries. 0, or -1 with
 * st_error. */
int st_ckpt_list(const char *run_dir, st_ckpt_entry **out, int *n);

/* 1 when step_dir is complete (see above), else 0 with a few words in
 * why[cap] ("has no index.h5", "is missing rank_00001.h5"). */
int st_ckpt_step_complete(const char *step_dir, char *why, size_t cap);

/* The newest complete step directory of run_dir (name[cap], its step) or
 * *step = -1 when there is none. Structural test only. */
void st_ckpt_newest_complete(const char *run_dir, char *name, size_t cap, int64_t *step);

/* A user's mark: an (empty) file named `keep` in a step directory keeps
 * it from --keep-last forever (`touch RUN/ckpt/step_00001000/keep`). */
#define ST_CKPT_KEEP_MARK "keep"

/* --keep-last N (N >= 1): remove complete step directories of run_dir
 * older than the one `latest` names, keeping the newest N complete ones
 * (latest's counted) and every one holding a `keep` mark. Incomplete and
 * .tmp_ directories are left alone, as is anything when `latest` cannot be
 * read or names no complete directory. Call on one rank, after `latest`
 * names the new checkpoint. removed[cap] gets "step_A, step_B" (or ""). 0,
 * or -1 with st_error (a directory that could not be removed: the run
 * goes on; the caller warns). */
int st_ckpt_prune(const char *run_dir, int keep_last, char *removed, size_t cap);

#endif
