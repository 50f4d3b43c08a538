/* checkpoint.h - sharded HDF5 checkpoints with a virtual-dataset index.
 *
 * Layout (DESIGN.md, "Checkpoint format"):
 *   RUN/ckpt/step_00001000/rank_00000.h5 ... rank_NNNNN.h5
 *       each holds, for every tensor, the part of it that falls in the
 *       rank's partition of the flat vector: /params/<name>, /adam_m/<name>,
 *       /adam_v/<name>, 1-D float32, chunked, Fletcher-32 checksummed.
 *   RUN/ckpt/step_00001000/index.h5
 *       /params/<name>, /adam_m/<name>, /adam_v/<name>: virtual datasets of
 *       the tensor's full shape mapping every rank file's piece into place;
 *       root attributes: config (JSON), step, tokens_seen, world_size,
 *       zero_stage, data_position, rng_state, format_version, build_version,
 *       rank_files; memory_plan (JSON) and memory_planned_bytes when the
 *       writer had a plan (shardtrain train always does).
 *   RUN/ckpt/latest: text file holding the step directory name; replaced
 *       atomically (rename) only after every rank has written and flushed.
 *
 * A step is written into RUN/ckpt/.tmp_step_XXXXXXXX and renamed to
 * step_XXXXXXXX after a barrier, so a crash leaves the previous `latest`.
 * A complete step directory is never written over (docs/checkpoints.md).
 *
 * The partition is the flat-vector partition of the writing run; readers use
 * the index only, so any rank count and ZeRO stage can resume.
 */
#ifndef ST_CHECKPOINT_H
#define ST_CHECKPOINT_H

#include <stdint.h>

#include "collectives/collectives.h"
#include "rank/model/params.h"
#include "rank/optim/partition.h"

typedef struct {
  int64_t step;          /* optimizer steps completed */
  int64_t tokens_seen;   /* training tokens consumed (global) */
  int64_t data_position; /* next token offset in the train split: the position in the
                          * epoch's sequence stream times seq_len (rank/train/dataloader.h) */
  int64_t data_epoch;    /* epoch of data_position (0 when the index has none: older) */
  uint64_t rng_state[2];
  int world_size;
  int zero_stage;
  /* fp16 loss scaler (rank/optim/loss_scaler.h); has_scaler 0 when the index has
   * none (checkpoints written before it existed: the scaler starts fresh). */
  int has_scaler;
  double loss_scale;
  int64_t scaler_clean_steps;
  int scaler_hysteresis_left;
  int64_t skipped_steps;
  char config_json[8192]; /* run configuration (model shape + training) */
  /* Identity of the job that wrote it (32 hex digits; run_lock.h): the
   * attribute run_id of index.h5 and of every rank file, which verify and
   * load compare, so files of two runs never pass as one checkpoint. Empty
   * on save: the save makes one. Empty on read: an older checkpoint. */
  char run_id[40];
  /* Written only (the reader leaves them 0): the writing run's memory plan,
   * as `shardtrain plan --json` prints it, and its total bytes per rank;
   * root attributes memory_plan and memory_planned_bytes when not NULL. */
  const char *memory_plan_json;
  uint64_t memory_planned_bytes;
  /* Written only: the training shard set's identity (io/token_shards.h,
   * st_shards_identity_json), the root attribute data_shards (JSON) of
   * index.h5 when not NULL; read back by st_ckpt_read_data_shards. */
  const char *data_shards_json;
} st_ckpt_meta;

/* Write a checkpoint for `meta.step` under run_dir/ckpt. Collective: every
 * rank calls it. params: the full flat parameter vector (every rank has it);
 * adam_m/adam_v: the moments for this rank's partition [part.begin, part.end)
 * (element 0 is element part.begin of the flat vector). On success `latest`
 * names the new step. On failure on any rank, no rank updates `latest`, the
 * temporary directory is removed, and -1 is returned with st_error. A
 * step directory that already holds a complete checkpoint is a failure
 * (it is never overwritten); an incomplete one is kept as .incomplete_NAME.
 * meta->run_id goes into every file (one is made when it is empty). */
int st_ckpt_save(const char *run_dir, st_comm *comm, const st_param_table *tab,
                 const st_partition *part, const float *params,
                 const float *adam_m, const float *adam_v, const st_ckpt_meta *meta);

/* st_ckpt_save in three parts, for a save whose rank files are written
 * while training goes on (rank/train/ckpt_save.c, --ckpt-async):
 *   begin   collective: checks, and rank 0 makes the temporary directory
 *           (refusing a step that already holds a complete checkpoint);
 *   write   local, any thread, no collective: this rank's file from host
 *           copies of its partition (params, adam_m, adam_v each
 *           part->end - part->begin elements, element 0 at part->begin);
 *   finish  collective: agrees on every rank's write (failed_msg: this
 *           rank's failure, NULL when it wrote its file), then rank 0
 *           writes the index and publishes; latest moves only when every
 *           rank flushed.
 * begin and finish return 0 or -1 with st_error (on every rank, the
 * temporary directory removed); write returns 0 or -1 with st_error in the
 * calling thread. A begun save must be finished. */
typedef struct {
  char ckpt[4096], tmp[4096], final[4096], name[32];
  st_ckpt_meta meta;
  const st_param_table *tab;
  st_partition part;
} st_ckpt_pending;

int st_ckpt_save_begin(const char *run_dir, st_comm *comm, const st_param_table *tab,
                       const st_partition *part, const st_ckpt_meta *meta, st_ckpt_pending *s);
int st_ckpt_save_write(const st_ckpt_pending *s, const float *params, const float *adam_m,
                       const float *adam_v);
int st_ckpt_save_finish(st_ckpt_pending *s, st_comm *comm, const char *failed_msg);

/* Resolve what --resume means: "auto" -> run_dir/ckpt/latest's step
 * directory, or "" with *found=0 when there is none; a path -> that step
 * directory (must contain index.h5). 0, or -1 with st_error.
 * With "auto", latest is only a pointer: when it is missing, empty,
 * unreadable or names a missing or incomplete directory, the newest
 * complete and verified step directory is taken (incomplete and .tmp_
 * ones skipped), and a later complete, verified one than latest's wins;
 * either way st_ckpt_resolve_notice() then holds one line saying so. */
int st_ckpt_resolve(const char *run_dir, const char *resume, char *step_dir,
                    int cap, int *found);

/* The notice of the last st_ckpt_resolve ("" when there is none): one
 * line, for rank 0 to print. */
const char *st_ckpt_resolve_notice(void);

/* Read only the metadata (attributes) of a checkpoint step directory. */
int st_ckpt_read_meta(const char *step_dir, st_ckpt_meta *meta);
/* The shard set identity JSON the checkpoint in step_dir recorded
 * (malloc'd, NUL-terminated) in *json, or NULL when it has none (written
 * before shard sets). 0, or -1 with st_error (exit 3). */
int st_ckpt_read_data_shards(const char *step_dir, char **json);

/* Verify a checkpoint: index present, every rank file present and readable,
 * every dataset's checksum good and every value finite (a NaN or inf names
 * the rank file, dataset and count), shapes equal to tab (when not NULL).
 * 0, or -1 with st_error naming the file, dataset and fix. */
int st_ckpt_verify(const char *step_dir, const st_param_table *tab);

/* The quick part of st_ckpt_verify: index.h5 opens and every rank file it
 * names exists (a missing one would read as NaN through the index). 0, or
 * -1 with st_error (exit 3) naming the missing files. */
int st_ckpt_check_files(const char *step_dir);

/* st_ckpt_verify, but reading back (checksums) only rank files first,
 * first+stride, ...; the structural checks still cover every file. Lets N
 * loading ranks share the read-back instead of each reading everything. */
int st_ckpt_verify_files(const char *step_dir, const st_param_table *tab, int first, int stride);

/* Load through the index: the full params vector (tab->total elements) and
 * the moments for this rank's partition (part->end - part->begin elements),
 * reading hyperslabs so the writing run's rank count does not matter.
 * Fails (-1, st_error) when a tensor's name or shape differs from tab. */
int st_ckpt_load(const char *step_dir, const st_param_table *tab,
                 const st_partition *part, float *params, float *adam_m,
                 float *adam_v, st_ckpt_meta *meta);

/* st_ckpt_load for `readers` ranks loading together: this one (`reader`)
 * verifies every readers-th rank file, so each file is read back once in
 * all; the callers must agree on failure (any rank failing fails the load). */
int st_ckpt_load_shared(const char *step_dir, const st_param_table *tab,
                        const st_partition *part, int reader, int readers, float *params,
                        float *adam_m, float *adam_v, st_ckpt_meta *meta);

#endif
