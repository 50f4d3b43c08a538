/* resume_config.h - a resumed run continues the run that was written.
 *
 * The checkpoint's run config (the JSON of index.h5's `config` attribute,
 * st_run_config_to_json) is the run's settings: on resume, every setting
 * the command line did not give comes from it, and one given overrides it
 * and is listed. A setting that changes the function the weights compute
 * (the model's shape, heads, sequence length, vocabulary: k_arch in
 * resume_config.c, one line each) cannot be overridden: a different one is
 * refused like a shape mismatch.
 */
#ifndef ST_RESUME_CONFIG_H
#define ST_RESUME_CONFIG_H

#include <stdint.h>

#include "io/checkpoint.h"
#include "rank/train/run_config.h"

typedef struct {
  /* Configuration-block lines, each starting "  resume     " or
   * "  notice     " and ending in a newline ("" when there is nothing). */
  char text[4096];
  /* {"from":DIR,"step":N,"ranks":{"checkpoint":W,"now":R},"overrides":
   * {"--lr":{"checkpoint":0.002,"now":0.001},...},"schedule":{...}} for
   * metrics.jsonl; malloc'ed, the caller frees (cJSON_free); NULL on
   * failure. */
  char *json;
} st_resume_note;

/* Merge the checkpoint (meta, read from step directory `from`) into rc for
 * a run of `world` ranks: settings not given (st_run_config_given) take
 * the checkpoint's values; given ones that differ are overrides. With
 * --auto-fit, the micro-batch and recompute (and with --auto-fit-zero the
 * ZeRO stage) are left to auto-fit. The schedule is finished again
 * (st_run_config_schedule): --steps raised or lowered without
 * --lr-decay-steps moves the cosine horizon, which note says with the lr
 * of the next step under both schedules. 0, or -1 with st_error:
 * ST_EXIT_CHECKPOINT naming the flag when a function-defining setting
 * differs or the config does not parse; ST_EXIT_USAGE when --steps is below
 * the checkpoint's step. note may be NULL. */
int st_resume_config_apply(st_run_config *rc, const st_ckpt_meta *meta, const char *from,
                           int world, st_resume_note *note);

#endif
