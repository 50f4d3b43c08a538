/* config.h - model shape and run configuration, presets, and JSON round trip. */
#ifndef ST_CONFIG_H
#define ST_CONFIG_H

#include <stdint.h>

/* The architecture of a decoder-only transformer: one description that
 * the one schedule (rank/model/model.c) reads. GPT-2 (Radford et al. 2019)
 * and the Llama family (Llama 3, Qwen2, SmolLM2: Touvron et al. 2023,
 * Grattafiori et al. 2024, Yang et al. 2024) are instances of it.
 *
 * Every field's zero value is GPT-2's choice, so a config that sets only
 * the shape (n_layer .. vocab_size) is GPT-2; st_model_validate fills the
 * derived zeros (n_kv_head, ffn_dim, norm_eps, rope_theta) and
 * st_model_arch_defaults sets a family's choices in one call. */
typedef enum { ST_ARCH_GPT2 = 0, ST_ARCH_LLAMA = 1, ST_ARCH_QWEN2 = 2 } st_arch;
typedef enum { ST_NORM_LAYERNORM = 0, ST_NORM_RMSNORM = 1 } st_norm_kind;
typedef enum { ST_POS_LEARNED = 0, ST_POS_ROPE = 1 } st_pos_kind;
typedef enum { ST_MLP_GELU = 0, ST_MLP_SWIGLU = 1 } st_mlp_kind;
typedef enum { ST_ROPE_SCALING_NONE = 0, ST_ROPE_SCALING_LLAMA3 = 1 } st_rope_scaling_kind;

/* Projections without a bias (bits of st_model_config.no_bias). GPT-2: 0;
 * Llama: all; Qwen2: all but ST_NO_BIAS_QKV. RMSNorm never has a bias. */
enum {
  ST_NO_BIAS_QKV = 1,   /* attn.qkv.bias */
  ST_NO_BIAS_PROJ = 2,  /* attn.proj.bias */
  ST_NO_BIAS_MLP = 4,   /* mlp.fc.bias and mlp.proj.bias */
  ST_NO_BIAS_ALL = 7
};

/* Llama 3's frequency-dependent RoPE scaling (Hugging Face
 * rope_scaling {"rope_type": "llama3", ...}, _compute_llama3_parameters):
 * wavelengths longer than original_max_pos / low_freq_factor are divided
 * by factor, shorter than original_max_pos / high_freq_factor kept, and
 * the band between interpolated smoothly. */
typedef struct {
  st_rope_scaling_kind kind;
  float factor, low_freq_factor, high_freq_factor;
  int original_max_pos;
} st_rope_scaling;

/* vocab_size is the tokenizer's vocabulary; padded_vocab_size rounds it up
 * to a multiple of 128 (padded rows of the embedding and the head exist but
 * never win a softmax and get no gradient). Attention has n_head query
 * heads and n_kv_head key/value heads (GQA; 1 is MQA) of head_dim =
 * n_embd / n_head each. */
typedef struct {
  int n_layer;
  int n_head;
  int n_embd;            /* C, the residual width */
  int block_size;        /* maximum sequence length (rows of wpe; RoPE: positions) */
  int vocab_size;
  int padded_vocab_size;
  st_arch arch;          /* the family: names, import/export, defaults */
  int n_kv_head;         /* 0: n_head */
  int ffn_dim;           /* MLP hidden width; 0: 4 * n_embd */
  st_norm_kind norm;
  float norm_eps;        /* 0: 1e-5 (LayerNorm is always 1e-5) */
  st_pos_kind pos;
  float rope_theta;      /* RoPE base; 0: 10000 */
  st_rope_scaling rope_scaling;
  st_mlp_kind mlp;       /* SwiGLU's mlp.fc holds gate rows, then up rows: [2F, C] */
  unsigned no_bias;      /* ST_NO_BIAS_* bits */
  int untied;            /* 1: lm_head.weight of its own; 0: the head is wte */
} st_model_config;

/* Set arch and its choices of norm, positions, MLP, biases and the
 * defaults of norm_eps and rope_theta (gpt2: LayerNorm, learned, GELU, all
 * biases; llama: RMSNorm 1e-5, RoPE 500000, SwiGLU, no biases; qwen2:
 * RMSNorm 1e-6, RoPE 1e6, SwiGLU, q/k/v biases). Shape, n_kv_head, ffn_dim,
 * rope_scaling and untied are left as they are. */
void st_model_arch_defaults(st_model_config *cfg, st_arch arch);
/* "gpt2", "llama", "qwen2" <-> st_arch. Parse: 0, or -1 with st_error. */
const char *st_arch_name(st_arch arch);
int st_arch_parse(const char *name, st_arch *arch);
/* Head size, n_embd / n_head. */
static inline int st_model_head_dim(const st_model_config *c) { return c->n_embd / c->n_head; }
/* Width of the fused q|k|v projection's output: (n_head + 2 n_kv_head) * head_dim.
 * Valid after st_model_validate (n_kv_head set). */
static inline int st_model_qkv_dim(const st_model_config *c) {
  return (c->n_head + 2 * c->n_kv_head) * st_model_head_dim(c);
}

/* Fill cfg from a preset name. GPT-2 sizes ("tiny", "small", "gpt2-124m",
 * "gpt2-350m", "gpt2-774m", "gpt2-1558m") set the shape and leave
 * vocab_size and block_size for the caller; the family presets
 * ("llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "qwen2.5-0.5b",
 * "qwen2.5-1.5b", "smollm2-135m", "smollm2-360m") set the whole
 * description at the real model's shape, vocab_size and block_size
 * (max_position_embeddings) included. 0, or -1 with st_error naming the
 * known presets. */
int st_model_preset(const char *name, st_model_config *cfg);
/* Shape bounds, well past today's largest models (Llama 3.1 405B: width
 * 16384, 128 heads, 53248 FFN, 131072 positions), that keep every product
 * the planner and layouts form (4 x width, heads x T^2 tiles, rows x width)
 * far from overflowing, so a shape read from a file cannot wrap. The
 * command-line flags take the same ranges (launcher/cli.c). */
#define ST_MODEL_MAX_LAYERS 1000
#define ST_MODEL_MAX_HEADS 4096
#define ST_MODEL_MAX_WIDTH 65536
#define ST_MODEL_MAX_FFN (1 << 20)
#define ST_MODEL_MAX_POSITIONS (1 << 24)
/* the token files' bound (io/tokens.h: uint32 ids past 65536) */
#define ST_MODEL_MAX_VOCAB (1 << 24)
/* Check divisibility and the ranges above, and set padded_vocab_size. 0, or
 * -1 with st_error naming the flag and its range. */
int st_model_validate(st_model_config *cfg);
struct cJSON;
/* Add the description's fields to JSON object o (rank/model/config_fields.h
 * has the table): n_layer, n_head, n_embd, the sequence length under
 * seq_key ("block_size", or "seq_len" in the plan), vocab_size,
 * padded_vocab_size, then arch, n_kv_head, ffn_dim, norm, norm_eps, pos,
 * rope_theta, rope_scaling ("none"|"llama3") and its rope_factor,
 * rope_low_freq_factor, rope_high_freq_factor,
 * rope_original_max_position_embeddings, mlp, qkv_bias, proj_bias,
 * mlp_bias and tied (booleans); enums by name. */
void st_model_add_json(struct cJSON *o, const st_model_config *cfg, const char *seq_key);
/* Serialise the model description to a malloc'ed JSON string (caller frees). */
char *st_model_to_json(const st_model_config *cfg);
/* Parse a description written by st_model_to_json (or a run config with a
 * "model" object). cfg is zeroed first: a config written before the
 * architecture fields existed reads as GPT-2. The shape fields are
 * required; a present field of the wrong type or an unknown name is an
 * error. 0 or -1 with st_error naming the field. */
int st_model_from_json(const char *json, st_model_config *cfg);
/* Number of parameters of the description (the total of rank/model/params.c's
 * table): the tied embedding counted once, an untied lm_head apart, padded
 * rows included (they are real storage). */
int64_t st_model_num_params(const st_model_config *cfg);

#endif
