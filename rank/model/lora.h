/* lora.h - LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large
 * Language Models") on a frozen base: the configuration, the --lora spec,
 * and the adapter table that lays every adapter out in one flat fp32 vector.
 *
 * An adapter on target t of layer L holds A [r, in] and B [out_t, r]; its
 * output scale * B (A dropout(x)), scale = alpha / r, is added to the
 * columns [row0, row0 + out_t) of the base projection's output y = x W^T
 * (row0: the rows of W that t owns; q, k, v are row slices of the fused
 * attn.qkv.weight, gate and up of SwiGLU's mlp.fc.weight). Flat layout
 * (the helpers' shared contract): for L = 0 .. n_layer-1, for each enabled
 * target in the order qkv, q, k, v, o, gate, up, down: A (r*in, row-major
 * [r, in]) then B (out_t*r, row-major [out_t, r]). Defaults as PEFT's
 * LoraConfig: alpha 8, dropout 0; targets GPT-2 qkv (c_attn), Llama/Qwen2
 * q, v. */
#ifndef ST_LORA_H
#define ST_LORA_H

#include <stdint.h>

#include "rank/model/config.h"
#include "rank/model/params.h"
#include "util/rng.h"

typedef enum {
  ST_LORA_QKV = 0, /* GPT-2 attn.c_attn: all of attn.qkv */
  ST_LORA_Q,       /* Llama/Qwen2 self_attn.q_proj: attn.qkv rows [0, H*hd) */
  ST_LORA_K,       /* k_proj: the next KV*hd rows */
  ST_LORA_V,       /* v_proj: the last KV*hd rows */
  ST_LORA_O,       /* attn.proj (o_proj, GPT-2 attn.c_proj) */
  ST_LORA_GATE,    /* SwiGLU mlp.fc rows [0, F) (gate_proj) */
  ST_LORA_UP,      /* SwiGLU mlp.fc rows [F, 2F) (up_proj); GPT-2 all of mlp.fc (c_fc) */
  ST_LORA_DOWN,    /* mlp.proj (down_proj, GPT-2 mlp.c_proj) */
  ST_LORA_NTARGETS
} st_lora_target;

/* The base projection an adapter's output lands in. */
typedef enum { ST_LORA_PROJ_QKV = 0, ST_LORA_PROJ_ATTN, ST_LORA_PROJ_FC, ST_LORA_PROJ_MLP } st_lora_proj;

typedef struct {
  int rank;          /* r; 0: LoRA off (full fine-tuning) */
  float alpha;       /* lora_alpha; scale = alpha / r */
  float dropout;     /* lora_dropout on the adapter's input, [0, 1) */
  unsigned targets;  /* bit t: target t enabled; 0 before st_lora_resolve: the family default */
  int nf4_base;      /* QLoRA (--base-dtype nf4): the base's four projection weights of every
                      * block stored NF4 (kernels/nf4.h); not part of the spec string */
  char unknown[32];  /* the first target named that is none of ours, "" if none: the parser
                      * does not know the family, st_lora_resolve refuses it with the
                      * family's own list */
} st_lora_config;

/* One adapter. in, out: A [rank, in], B [out, rank]; row0: its first row
 * of the base weight (first column of the projection's output, whose width
 * is proj_out); a_off, b_off: element offsets of A and B in the flat vector. */
typedef struct {
  int layer;
  st_lora_target target;
  st_lora_proj proj;
  int in, out, row0, proj_out;
  int64_t a_off, b_off;
} st_lora_slot;

typedef struct {
  st_lora_slot *slot;   /* n slots, layer-major in the flat order */
  int n;
  int per_layer;        /* slots of one layer */
  int64_t layer_numel;  /* elements of one layer's adapters (every layer the same) */
  int64_t total;        /* elements of the flat vector */
  int max_in, max_out;  /* the widest adapter input and output (scratch sizes) */
} st_lora_table;

/* Target name ("q", "gate", "qkv", ...) and its inverse (-1: unknown). */
const char *st_lora_target_name(st_lora_target t);
int st_lora_target_parse(const char *name);
/* The PEFT module name of target t in the family of cfg, e.g.
 * "self_attn.q_proj", "mlp.down_proj", GPT-2 "attn.c_attn", "mlp.c_fc". */
const char *st_lora_peft_module(const st_model_config *cfg, st_lora_target t);
/* The family's targets as a bit set (GPT-2 qkv,o,up,down; Llama/Qwen2
 * q,k,v,o,gate,up,down) and its default (GPT-2 qkv; Llama/Qwen2 q,v). */
unsigned st_lora_family_targets(const st_model_config *cfg);
unsigned st_lora_default_targets(const st_model_config *cfg);

/* Parse `--lora RANK[,alpha=A,dropout=P,targets=T1,T2,...]`: after
 * targets= every comma field is a target, so a key after it (or PEFT's
 * r=RANK) is refused with the spec written in that order. Leaves targets 0
 * when none are named; a target name that is none of ours is kept in
 * out->unknown for st_lora_resolve. 0, or -1 with st_error (exit 2) naming
 * --lora and the fix. */
int st_lora_parse(const char *spec, st_lora_config *out);
/* Fill the default targets for cfg's family and check every target exists
 * there (gate on GPT-2, an unknown name: exit 2, listing the family's
 * targets). cfg need not be validated. 0 or -1. */
int st_lora_resolve(st_lora_config *lora, const st_model_config *cfg);
/* The spec back as text ("8,alpha=16,dropout=0.05,targets=q,v"), which
 * st_lora_parse reads to the same config (checkpoints store it). */
void st_lora_format(const st_lora_config *lora, char *out, int cap);
static inline float st_lora_scale(const st_lora_config *l) { return l->alpha / (float)l->rank; }

/* The adapter table of a resolved config for model cfg (derived fields are
 * filled here as st_model_fill_derived does). 0, or -1 with st_error. */
int st_lora_table_build(const st_model_config *cfg, const st_lora_config *lora,
                        st_lora_table *tab);
void st_lora_table_free(st_lora_table *tab);
/* The same layout as a parameter table (what the trainer, the optimizer and
 * checkpoints see as "the parameters" of a LoRA run): per slot two tensors
 * "h.L.lora_T.A" [r, in] and "h.L.lora_T.B" [out, r], weight decay on,
 * block_first 0 and 2 * per_layer tensors per block. 0, or -1. */
int st_lora_param_table(const st_model_config *cfg, const st_lora_table *lt,
                        st_param_table *tab);

/* Initial adapters into host[tab->total]: B = 0, A as PEFT's default
 * (nn.init.kaiming_uniform_ with a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in))),
 * drawn in slot order from rng. */
void st_lora_init(const st_lora_table *tab, float *host, st_rng *rng);

/* W += scale * B A on the rows of each slot: the merge into the base's
 * fp32 weights base[] laid out by base_tab (the model's st_param_table),
 * from fp32 adapters ad[] laid out by tab. 0, or -1 (a tensor missing). */
int st_lora_merge(const st_lora_table *tab, const st_lora_config *lora,
                  const st_param_table *base_tab, float *base, const float *ad);

/* The base's identity: hex SHA-256 (hex[65]) over, per tensor of tab in
 * table order, its name, its shape (two little-endian int64) and its fp32
 * values w[offset .. offset + numel) as little-endian bytes; the same
 * weights give the same digest whatever file held them (a Hugging Face
 * directory, a checkpoint). 0, or -1 with st_error. */
int st_lora_base_digest(const st_param_table *tab, const float *w, char hex[65]);

#endif
