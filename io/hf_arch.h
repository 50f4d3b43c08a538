/* hf_arch.h - Hugging Face model directories: one entry per architecture
 * family, keyed by config.json's model_type.
 *
 * Each family (io/hf_gpt2.c for "gpt2", io/hf_llama.c for "llama" and
 * "qwen2") knows
 * how to read its config.json into a shardtrain shape (refusing what
 * shardtrain does not implement), how to map its tensor names and layouts
 * onto the flat parameter vector of rank/model/params.h, and back for export.
 * Errors are one st_error line, exit code 3, naming the file and field or
 * tensor.
 */
#ifndef ST_HF_ARCH_H
#define ST_HF_ARCH_H

#include <cjson/cJSON.h>

#include "io/safetensors.h"
#include "kernels/dtype.h"
#include "rank/model/config.h"
#include "rank/model/params.h"

typedef struct {
  const char *model_type; /* config.json "model_type" */
  /* config.json (parsed, at path) -> shape; block_size = the positions. */
  int (*parse_config)(const char *path, const cJSON *j, st_model_config *cfg);
  /* Tensors of set -> params[tab->total] (fp32); every tensor of the set
   * used or known to be skippable, every parameter found with its shape. */
  int (*read)(const char *dir, const st_sf_set *set, const st_model_config *cfg,
              const st_param_table *tab, float *params);
  /* config.json text (malloc'ed) for a model of this shape stored in dt. */
  char *(*config_json)(const st_model_config *cfg, st_dtype dt);
  /* params -> safetensors file path in dtype dt with the family's names. */
  int (*write)(const char *path, const st_model_config *cfg, const st_param_table *tab,
               const float *params, st_dtype dt);
} st_hf_arch;

/* The family of model_type, or NULL. */
const st_hf_arch *st_hf_arch_find(const char *model_type);
/* Read dir/config.json: its family and the model's shape (validated, with
 * padded_vocab_size set). 0 or -1 (exit 3) naming the file and field. */
int st_hf_read_config(const char *dir, const st_hf_arch **arch, st_model_config *cfg);
/* The special token ids of dir/config.json (bos_token_id, eos_token_id,
 * pad_token_id: those present, copied as they are, eos may be a list) as
 * a new cJSON object, or NULL when there is none or it cannot be read. */
cJSON *st_hf_special_ids(const char *dir);
/* Set the fields of ids (st_hf_special_ids) in the config.json text cfg:
 * a new malloc'ed text; cfg itself when ids is NULL or empty, NULL when out
 * of memory. An imported model's ids travel to its export this way. */
char *st_hf_config_with_ids(char *cfg, const cJSON *ids);
/* 1 when dir holds a config.json (a Hugging Face model directory). */
int st_hf_is_dir(const char *dir);
/* Read a whole Hugging Face model directory into params (tab from cfg). */
int st_hf_read_dir(const char *dir, const st_model_config *cfg, const st_param_table *tab,
                   float *params);

/* The tokenizer files that travel with a model (NULL-terminated). */
extern const char *const st_hf_tokenizer_files[];
/* 1 when dir holds a tokenizer (vocab.json + merges.txt, or tokenizer.json). */
int st_hf_has_tokenizer(const char *dir);
/* Copy every st_hf_tokenizer_files entry present in from into to (made if
 * needed). Returns the number copied, or -1 with st_error. */
int st_hf_copy_tokenizer(const char *from, const char *to);

#endif
