/* config.h - model shape and run configuration, presets, and JSON round trip. */
#ifndef ST_CONFIG_H
#define ST_CONFIG_H

#include <stdint.h>

/* Shape of a GPT-2 style decoder. vocab_size is the tokenizer's vocabulary;
 * padded_vocab_size rounds it up to a multiple of 128 (padded rows of the
 * tied embedding exist but never win a softmax and get no gradient). */
typedef struct {
  int n_layer;
  int n_head;
  int n_embd;            /* C, the residual width */
  int block_size;        /* maximum sequence length (rows of wpe) */
  int vocab_size;
  int padded_vocab_size;
} st_model_config;

/* Fill cfg from a preset name ("tiny", "small", "gpt2-124m", "gpt2-350m",
 * "gpt2-774m", "gpt2-1558m"). vocab_size and block_size are left for the
 * caller to set. 0, or -1 with st_error naming the known presets. */
int st_model_preset(const char *name, st_model_config *cfg);
/* Check divisibility and ranges, and set padded_vocab_size. 0 or -1. */
int st_model_validate(st_model_config *cfg);
struct cJSON;
/* Add the shape's fields to JSON object o: n_layer, n_head, n_embd, the
 * sequence length under seq_key ("block_size", or "seq_len" in the plan),
 * vocab_size, padded_vocab_size. */
void st_model_add_json(struct cJSON *o, const st_model_config *cfg, const char *seq_key);
/* Serialise the model shape to a malloc'ed JSON string (caller frees). */
char *st_model_to_json(const st_model_config *cfg);
/* Parse a model shape written by st_model_to_json. 0 or -1 with st_error. */
int st_model_from_json(const char *json, st_model_config *cfg);
/* Number of parameters, the tied embedding counted once (padded rows
 * included: they are real storage). */
int64_t st_model_num_params(const st_model_config *cfg);

#endif
