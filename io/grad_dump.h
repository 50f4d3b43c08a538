/* grad_dump.h - gradient dumps (`train --dump-grads EVERY[:PATTERN]`):
 * the reduced gradients of one step in the checkpoint's layout, for finding
 * where two runs diverge (docs/checkpoints.md, "Gradient dumps").
 *
 *   RUN/grads/step_00000010/rank_00000.h5 ... rank_NNNNN.h5
 *       /grads/<name>          this rank's piece, before clipping (unscaled:
 *                              the fp16 loss scale divided out)
 *       /grads_clipped/<name>  the same piece times the clip factor: what
 *                              AdamW is given
 *   RUN/grads/step_00000010/index.h5
 *       /grads/<name>, /grads_clipped/<name>: virtual datasets of the whole
 *       tensors (only the tensors PATTERN selects);
 *       /norms: a table (HDF5 hl) with one row per tensor of the model:
 *       name, numel, norm, norm_clipped (L2, over the whole tensor, every
 *       rank's piece), dumped (1 when its data is in the dump);
 *       root attributes: step, grad_norm (global, before clipping),
 *       clip_factor, loss_scale, skipped (fp16 overflow: no update),
 *       world_size, zero_stage, pattern, run_id, config, format_version.
 *
 * A dump is written into RUN/grads/.tmp_step_N and renamed to step_N only
 * after every rank has written and fsynced its file, as a checkpoint is; a
 * step_N left by an earlier run in the same directory (a resumed run
 * replaying the step) is moved to .replaced_step_N first.
 */
#ifndef ST_GRAD_DUMP_H
#define ST_GRAD_DUMP_H

#include <stdint.h>

#include "collectives/collectives.h"
#include "rank/model/params.h"
#include "rank/optim/partition.h"

#define ST_GRAD_PATTERN_MAX 512

typedef struct {
  int64_t step;        /* the optimizer step these gradients are of (1-based) */
  double grad_norm;    /* global L2 norm before clipping (unscaled) */
  double clip_factor;  /* min(1, grad_clip / grad_norm); 1 without clipping */
  double loss_scale;   /* fp16's dynamic scale (divided out of the data); 1 otherwise */
  int skipped;         /* fp16 overflow: this step made no update */
  int world_size, zero_stage;
  char pattern[ST_GRAD_PATTERN_MAX]; /* comma-separated fnmatch globs; "" = every tensor */
  char run_id[40];
  const char *config_json; /* written only; NULL: none */
} st_grad_dump_meta;

/* Does tensor `name` match pattern (comma-separated fnmatch(3) globs, e.g.
 * "h.0.*,ln_f.*"; "" matches everything)? 1 or 0. */
int st_grad_pattern_match(const char *pattern, const char *name);

/* Write the dump of meta->step under run_dir/grads. Collective over comm.
 * grads: this rank's partition [part->begin, part->end) of the reduced
 * gradient vector, fp32 on the host, unscaled and before clipping (element
 * 0 is flat element part->begin). 0, or -1 with st_error (every rank;
 * nothing is renamed into place; exit class 1). */
int st_grad_dump_save(const char *run_dir, st_comm *comm, const st_param_table *tab,
                      const st_partition *part, const float *grads,
                      const st_grad_dump_meta *meta);

/* One tensor's row of a dump's /norms table. */
typedef struct {
  char name[ST_MAX_NAME];
  int64_t numel;
  double norm, norm_clipped;
  int dumped;
} st_grad_norm_row;

/* A dump's attributes and norms, read from step_dir/index.h5. */
typedef struct {
  st_grad_dump_meta meta;
  st_grad_norm_row *rows; /* n of them, in the model's tensor order; free with _close */
  int n;
} st_grad_dump_info;

/* Read step_dir's index (attributes and /norms). 0, or -1 with st_error
 * naming the file (not a dump, damaged). */
int st_grad_dump_open(const char *step_dir, st_grad_dump_info *info);
void st_grad_dump_close(st_grad_dump_info *info);

/* The whole tensor group/name ("grads" or "grads_clipped") of step_dir as
 * fp32, through the index's virtual dataset; *numel its element count and
 * *out a malloc'd array the caller frees. 0, or -1 with st_error (not in
 * the dump, a rank file missing or damaged: its checksum). */
int st_grad_dump_read(const char *step_dir, const char *group, const char *name, float **out,
                      int64_t *numel);

/* The steps of the complete dumps under run_dir/grads, ascending, into
 * steps[cap]; returns how many there are (may exceed cap), or -1 with
 * st_error when run_dir/grads cannot be read. */
int st_grad_dump_list(const char *run_dir, int64_t *steps, int cap);

#endif
