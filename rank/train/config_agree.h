/* config_agree.h - ranks agree on their run configuration before they train
 * together.
 *
 * Every rank of an MPI job gets its own command line (an app context
 * `mpirun -np 1 prog A : -np 1 prog B` gives two), and a rank that reads
 * another micro-batch, ZeRO stage or model width than its peers makes
 * collectives of other sizes: a silent difference, a hang or a corrupt
 * heap. So before any collective whose size depends on the configuration,
 * the ranks compare a list of named fields: each rank hashes every field's
 * value (64-bit FNV-1a), the fixed-size array of hashes is all-gathered, and
 * on a difference the first differing field's printed values are
 * all-gathered (a fixed 128 bytes each) to name them and their ranks. Both
 * collectives have sizes fixed at compile time, so they are safe whatever
 * the configuration holds.
 */
#ifndef ST_CONFIG_AGREE_H
#define ST_CONFIG_AGREE_H

#include <stdint.h>

#include "collectives/collectives.h"
#include "rank/train/run_config.h"

#define ST_AGREE_MAX_FIELDS 96
#define ST_AGREE_SHOWN 128 /* bytes of a value shown in the message */

/* Named values to compare. name is the flag ("--micro-batch") or a phrase
 * ("the checkpoint to resume"); code is the exit class when it differs;
 * fix ends the message ("every rank must get the same flags"). */
typedef struct {
  int n, dropped;
  const char *name[ST_AGREE_MAX_FIELDS];
  const char *fix[ST_AGREE_MAX_FIELDS];
  int code[ST_AGREE_MAX_FIELDS];
  uint64_t hash[ST_AGREE_MAX_FIELDS];
  char shown[ST_AGREE_MAX_FIELDS][ST_AGREE_SHOWN];
} st_agree_list;

/* Append a field whose value is printf(fmt, ...); the whole value is
 * hashed, its first ST_AGREE_SHOWN-1 bytes shown. name and fix must
 * outlive the list (string literals). Past ST_AGREE_MAX_FIELDS a field is
 * dropped: a bug that test_config_agree catches (st_agree_check fails). */
void st_agree_add(st_agree_list *l, const char *name, int code, const char *fix,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* A float field: compared bit for bit (hashed as %a), shown as %g. */
void st_agree_add_float(st_agree_list *l, const char *name, int code, const char *fix, double x);

/* Every flag that reaches the run configuration, by flag name, as this
 * rank holds it (after resume merged the checkpoint's settings, when it
 * has). Flags: exit class ST_EXIT_USAGE. */
void st_agree_run_config(st_agree_list *l, const st_run_config *rc);

/* Compare l across the ranks of c. Collective: every rank calls it with a
 * list built the same way. 0 when every field is equal on every rank; else
 * -1 on every rank, with st_error (the first differing field's class) set
 * to the same one line everywhere: "--micro-batch differs between ranks: 2
 * on ranks 0-1, 4 on rank 2; every rank must get the same flags". */
int st_agree_check(st_comm *c, const st_agree_list *l);

/* Whether any rank failed (failed != 0 on it), for a stage that has no
 * trainer yet (flag parsing). The lowest failing rank prints its st_error
 * once ("shardtrain: error (rank R): ..."; without "(rank R)" on one rank).
 * Returns that rank's exit class on every rank, 0 when none failed.
 * Collective over c. */
int st_agree_failure(st_comm *c, int failed);

#endif
