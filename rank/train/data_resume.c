/* data_resume.c - the shard set against the checkpoint's (see data_resume.h). */
#include "rank/train/data_resume.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint.h"
#include "util/error.h"

static const char *base_name(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

/* "" when they agree, else what differs into why. */
static void compare(const cJSON *rec, const st_shard_set *set, char *why, size_t cap) {
  why[0] = 0;
  const int n = cJSON_GetArraySize(rec);
  for (int i = 0; i < n && i < set->n; i++) {
    const cJSON *e = cJSON_GetArrayItem(rec, i);
    const cJSON *path = cJSON_GetObjectItem(e, "path"), *bytes = cJSON_GetObjectItem(e, "bytes"),
                *tokens = cJSON_GetObjectItem(e, "tokens"),
                *digest = cJSON_GetObjectItem(e, "digest");
    const st_shard *sh = &set->s[i];
    char dg[24];
    snprintf(dg, sizeof dg, "%016llx", (unsigned long long)sh->digest);
    if (!cJSON_IsString(path) || !cJSON_IsNumber(bytes) || !cJSON_IsNumber(tokens) ||
        !cJSON_IsString(digest)) {
      snprintf(why, cap, "its record of shard %d is malformed", i);
      return;
    }
    if (strcmp(base_name(path->valuestring), base_name(sh->path)) != 0) {
      snprintf(why, cap, "shard %d was %s, now it is %s", i, path->valuestring, sh->path);
      return;
    }
    if ((long long)bytes->valuedouble != (long long)sh->bytes ||
        (long long)tokens->valuedouble != (long long)sh->tokens ||
        strcmp(digest->valuestring, dg) != 0) {
      snprintf(why, cap, "shard %s changed: %lld bytes, %lld tokens, digest %s then; %lld bytes, "
               "%lld tokens, digest %s now", sh->path, (long long)bytes->valuedouble,
               (long long)tokens->valuedouble, digest->valuestring, (long long)sh->bytes,
               (long long)sh->tokens, dg);
      return;
    }
  }
  if (n != set->n)
    snprintf(why, cap, "it read %d shard%s, --data now names %d", n, n == 1 ? "" : "s", set->n);
}

int st_data_resume_check(const char *step_dir, const st_shard_set *set, int allow_changed,
                         st_resume_note *note) {
  char *json = NULL;
  if (st_ckpt_read_data_shards(step_dir, &json)) return -1;
  if (!json) return 0; /* an older checkpoint */
  cJSON *rec = cJSON_Parse(json);
  free(json);
  if (!cJSON_IsArray(rec)) {
    cJSON_Delete(rec);
    return st_error_setc(ST_EXIT_CHECKPOINT, "checkpoint %s: the attribute data_shards of index.h5 is not a "
                         "JSON list; the checkpoint is damaged: resume from an earlier step "
                         "with --resume PATH", step_dir);
  }
  char why[1600];
  compare(rec, set, why, sizeof why);
  cJSON_Delete(rec);
  if (!why[0]) return 0;
  if (!allow_changed)
    return st_error_setc(ST_EXIT_DATA, "--data differs from the shard set checkpoint %s was "
                         "trained on (%s): restore the data, or pass --data-changed-ok to resume "
                         "at the saved epoch and position of the new set's order", step_dir, why);
  if (note) {
    size_t k = strlen(note->text);
    snprintf(note->text + k, sizeof note->text - k, "  notice     --data-changed-ok: the data "
             "differs from the checkpoint's (%.600s); continuing at its saved position\n", why);
  }
  return 0;
}
