/* config_fields.h - the fields of a model description (rank/model/config.h)
 * as one table: JSON key, the flag that sets it, its kind and its values.
 *
 * One table for everything that walks the description field by field: the
 * JSON a checkpoint and `plan --json` carry (config.c), the ranks'
 * agreement (rank/train/config_agree.c), what a resume may take from the
 * checkpoint and what it must refuse (rank/train/resume_config.c), and the
 * comparison with an --init-from source (rank/train/train_setup.c). A field
 * added to st_model_config is one line here and is then written, read,
 * compared across ranks and checked on resume.
 */
#ifndef ST_CONFIG_FIELDS_H
#define ST_CONFIG_FIELDS_H

#include <stddef.h>

#include "rank/model/config.h"

/* In table order: the GPT-2 shape first (as older configs wrote it), then
 * the architecture. padded_vocab_size is derived and not in the table. */
typedef enum {
  ST_MF_LAYERS, ST_MF_HEADS, ST_MF_DIM, ST_MF_POSITIONS, ST_MF_VOCAB,
  ST_MF_ARCH, ST_MF_KV_HEADS, ST_MF_FFN, ST_MF_NORM, ST_MF_NORM_EPS, ST_MF_POS,
  ST_MF_ROPE_THETA, ST_MF_ROPE_SCALING, ST_MF_ROPE_FACTOR, ST_MF_ROPE_LOW, ST_MF_ROPE_HIGH,
  ST_MF_ROPE_ORIG, ST_MF_MLP, ST_MF_QKV_BIAS, ST_MF_PROJ_BIAS, ST_MF_MLP_BIAS, ST_MF_TIED,
  ST_MF_COUNT
} st_model_field_id;

typedef enum {
  ST_MF_INT,   /* an int field */
  ST_MF_FLOAT, /* a float field, written as the decimal a person types */
  ST_MF_ENUM,  /* an enum, written by name (names[value]) */
  ST_MF_BOOL   /* true/false in JSON (a bias present, the head tied) */
} st_model_field_kind;

typedef struct {
  const char *key;   /* JSON key in the "model" object ("n_kv_head") */
  /* What sets it on the command line: its own flag ("--kv-heads"), or
   * NULL when only --arch / --model do (norm, positions, MLP, biases, rope
   * scaling). label is the flag or, without one, a phrase for messages. */
  const char *flag, *label;
  st_model_field_kind kind;
  const char *const *names; /* ST_MF_ENUM: the value names, NULL-terminated */
  int required;             /* 1: older configs wrote it too (absence is an error) */
} st_model_field;

/* The table entry of field id (0 <= id < ST_MF_COUNT). */
const st_model_field *st_model_field_info(st_model_field_id id);

/* The field's value as a double (ints and enums exactly, bools 0/1, a
 * float as the decimal it was typed as) and set it from one. */
double st_model_field_get(const st_model_config *c, st_model_field_id id);
void st_model_field_set(st_model_config *c, st_model_field_id id, double v);

/* The value as text for messages: "8", "1e-06", "rmsnorm", "true" (a
 * boolean with a flag as the flag takes it: "1"). buf is returned. */
const char *st_model_field_show(const st_model_config *c, st_model_field_id id, char *buf,
                                size_t cap);

/* c with the zeros st_model_validate fills (n_kv_head, ffn_dim, norm_eps,
 * rope_theta for rotary positions) filled, and the fields its own choices
 * make meaningless (rope settings under learned positions) zeroed, so two
 * descriptions of the same function compare equal field by field. Checks
 * nothing. */
st_model_config st_model_effective(const st_model_config *c);

/* What sets c apart from plain GPT-2 of its shape, in one phrase for the
 * configuration block and plan ("llama: 8 KV heads of 64, FFN 8192 SwiGLU,
 * RMSNorm eps 1e-05, RoPE theta 500000 (llama3 scaling x32 of 8192), no
 * biases, tied head"); "" when nothing does. Returns buf. */
const char *st_model_describe(const st_model_config *c, char *buf, size_t cap);

/* The flags that give c's shape to `shardtrain plan` or `train`
 * ("--layers 16 --heads 32 --dim 2048 --vocab-size 128256 --arch llama
 * --kv-heads 8 --ffn-dim 8192 --rope-theta 500000 --norm-eps 1e-05 --tied 1";
 * the architecture flags only when c is not GPT-2). Returns buf. */
const char *st_model_flags(const st_model_config *c, char *buf, size_t cap);

#endif
