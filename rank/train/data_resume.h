/* data_resume.h - a resumed run reads the shard set its checkpoint read.
 *
 * The checkpoint records the training shards' identity (io/token_shards.h:
 * path, bytes, tokens, digest per shard, in order). On resume the set now
 * opened must match it shard by shard: the same count, and for each the
 * same file name (the directory may move), bytes, tokens and digest;
 * otherwise the saved position would point at other sequences. A
 * checkpoint from before shard sets records none and is not checked.
 * docs/data.md, "Resume".
 */
#ifndef ST_DATA_RESUME_H
#define ST_DATA_RESUME_H

#include "io/token_shards.h"
#include "rank/train/resume_config.h"

/* 0 when the set matches the checkpoint in step_dir (or it records none).
 * A mismatch: -1 with st_error (exit 4) naming the first shard that
 * differs and the fix; with allow_changed (--data-changed-ok) 0 instead,
 * and a notice line appended to note->text. Unreadable record: -1, exit 3. */
int st_data_resume_check(const char *step_dir, const st_shard_set *set, int allow_changed,
                         st_resume_note *note);

#endif
