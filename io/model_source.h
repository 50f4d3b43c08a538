/* model_source.h - where a model's weights come from, for train
 * --init-from, ckpt import/export, sample and eval.
 *
 * A source is one of:
 *   - a shardtrain run directory (the step its ckpt/latest names) or a step
 *     directory (one with index.h5);
 *   - a Hugging Face model directory: config.json + model.safetensors, or
 *     model-0000N-of-0000M.safetensors with model.safetensors.index.json;
 *     fp32, fp16 or bf16 tensors (io/hf_*.c);
 *   - an llm.c model file: a header of 256 int32 (magic 20240326, version 3
 *     fp32 or 5 bf16) and the parameters (io/llmc_model.c).
 * Opening reads the shape only; reading fills the flat fp32 vector laid out
 * by st_param_table_build(&s->cfg), whatever the stored dtype, layout or
 * tensor names were.
 */
#ifndef ST_MODEL_SOURCE_H
#define ST_MODEL_SOURCE_H

#include <cjson/cJSON.h>

#include "rank/model/config.h"
#include "rank/model/lora.h"
#include "rank/model/params.h"

typedef enum {
  ST_MODEL_SRC_CKPT = 1, /* shardtrain checkpoint */
  ST_MODEL_SRC_HF = 2,   /* Hugging Face directory */
  ST_MODEL_SRC_LLMC = 3  /* llm.c model file */
} st_model_src_kind;

typedef struct {
  st_model_src_kind kind;
  char path[1200];          /* what is read: the step directory, HF directory or llm.c file */
  st_model_config cfg;      /* the model's shape; block_size = its positions (rows of wpe) */
  char dtype[8];            /* stored dtype of the weights: fp32, bf16 or fp16 */
  char tokenizer_dir[1200]; /* a directory holding the model's tokenizer files, "" when none */
  char config_json[8192];   /* checkpoints: the run configuration they hold; "" otherwise */
} st_model_source;

/* Find out what src is and read its shape (no weights). 0, or -1 with
 * st_error (exit code 3) naming the path and what it lacks. */
int st_model_source_open(const char *src, st_model_source *s);

/* Read every weight into params[tab->total] as fp32, tab built by
 * st_param_table_build(&s->cfg). A LoRA run's checkpoint
 * (st_model_source_lora) reads as its base with the adapters merged
 * (W += scale B A, st_lora_merge), so sample, eval, export and --init-from
 * see a plain model. 0, or -1 with st_error (exit code 3) naming the file
 * and tensor; a LoRA base that is not the one trained on: exit 4. */
int st_model_source_read(const st_model_source *s, const st_param_table *tab, float *params);

/* Is s a LoRA run's checkpoint (its config has a "lora" section: rank/train/
 * run_config.c)? 1 with *lora resolved for s->cfg and base[cap] the base it
 * was trained on (the environment variable ST_LORA_BASE, when set, names a
 * moved copy instead; its weights must have the recorded digest), digest[72]
 * the recorded SHA-256; 0 when not; -1 with st_error (exit 3). */
int st_model_source_lora(const st_model_source *s, st_lora_config *lora, char *base, size_t cap,
                         char digest[72]);
/* The adapters of a LoRA checkpoint as fp32, laid out by st_lora_table_build(&s->cfg,
 * lora, lt) (built here; the caller frees *ad with free and lt with
 * st_lora_table_free). 0, or -1 with st_error (exit 3). */
int st_model_source_read_adapters(const st_model_source *s, const st_lora_config *lora,
                                  st_lora_table *lt, float **ad);

/* The bos/eos/pad token ids the source records, as a new cJSON object
 * ({"bos_token_id":1,"eos_token_id":[2,3]}: those present, as the Hugging
 * Face config.json has them; the caller deletes), or NULL when it records
 * none: a Hugging Face directory's config.json (st_hf_special_ids), a
 * checkpoint's config (st_ckpt_config_special_ids); an llm.c file has no
 * field for them. They travel import -> train -> export (docs/checkpoints.md). */
cJSON *st_model_source_special_ids(const st_model_source *s);
/* The same ids in a checkpoint's config JSON text: its "hf_special_ids"
 * (rank/train/run_config.h), else "imported_from"."hf_special_ids", where
 * `ckpt import` kept them before runs carried them; NULL when neither holds
 * a non-empty object or the text is not JSON. */
cJSON *st_ckpt_config_special_ids(const char *config_json);

#endif
