/* model.h - the decoder-only transformer's forward and backward schedule
 * over the op table, for every architecture st_model_config describes
 * (GPT-2; Llama 3, Qwen2, SmolLM2: RMSNorm, RoPE, SwiGLU, GQA, untied head).
 *
 * Holds the flat parameter and gradient vectors (padded to a multiple of
 * the ZeRO world size), activations for one micro-batch of B x T, and the
 * order in which ops run. It knows nothing of ranks or optimizers.
 */
#ifndef ST_MODEL_H
#define ST_MODEL_H

#include <stdint.h>

#include "kernels/nf4.h"
#include "kernels/ops.h"
#include "rank/model/config.h"
#include "rank/model/lora.h"
#include "rank/model/params.h"
#include "util/rng.h"

/* Activations of one block. void *: storage dtype (ops->dtype); float *:
 * always fp32. QKV = st_model_qkv_dim, F = ffn_dim. */
typedef struct {
  void *ln1;                        /* [B,T,C] norm output */
  float *ln1_mean, *ln1_rstd;       /* [B,T]; mean NULL under RMSNorm */
  void *qkv;                        /* [B,T,QKV], q and k rotated under RoPE */
  void *atty;                       /* [B,T,C] attention output */
  float *att;                       /* attention_state_floats(B,T,NH) */
  void *residual2;                  /* [B,T,C] input + attention projection */
  void *ln2;
  float *ln2_mean, *ln2_rstd;
  void *fch;                        /* [B,T,F] GELU input, or [B,T,2F] SwiGLU's gate | up */
  void *fch_act;                    /* [B,T,F] GELU or SwiGLU output */
  void *residual3;                  /* [B,T,C] block output */
} st_block_acts;

/* Activation recompute (Chen et al. 2016; Korthikanti et al. 2022 for the
 * selective form), from the least memory saved to the most:
 * - none keeps every activation for backward;
 * - act drops only the MLP activation's output (GELU(fc) or SiLU(gate)*up,
 *   GPT-2: 4 of 16 B*T*C-sized tensors per block) and rebuilds it with one
 *   pointwise pass before the block's backward: no GEMM and no attention is
 *   rerun. torch.compile's default partitioner (min-cut rematerialization)
 *   makes the same trade for pointwise ops, so this is the policy to set
 *   beside an unrecomputed PyTorch run;
 * - selective also drops the two norm outputs (GPT-2: 6 of 16) and reruns
 *   the norms;
 * - full keeps only each block's output and reruns the whole block before
 *   its backward.
 * full gives bit-identical results to none; so do act and selective with
 * SwiGLU (never fused) and where the GELU is not fused into the GEMM (CPU,
 * fp32). In bf16/fp16 act's and selective's forward take GELU from the
 * stored fc output, as their recompute does, so they differ from none by
 * that rounding (backward is still the exact gradient of its own forward),
 * and act equals selective bit for bit. */
typedef enum {
  ST_RECOMPUTE_NONE = 0,
  ST_RECOMPUTE_ACT = 1,
  ST_RECOMPUTE_SELECTIVE = 2,
  ST_RECOMPUTE_FULL = 3
} st_recompute;
/* How many policies there are: loops over them run r < ST_RECOMPUTE_POLICIES. */
#define ST_RECOMPUTE_POLICIES 4

/* ZeRO 3: how a sharded model (st_model_init_sharded) gets block l's
 * working weights into its buffer wbuf[slot], slot = l % 2.
 * start: begin filling buf (block_numel elements, storage dtype) with block
 *   l's weights. It is called once the compute that last read buf has been
 *   issued; on GPUs the fill must be ordered after that compute (the
 *   communication stream waits for it) and may overlap what follows.
 * wait: return once the fill started on slot has landed in its buffer. */
typedef struct {
  void (*start)(void *ctx, int layer, void *buf, int slot);
  void (*wait)(void *ctx, int slot);
  void *ctx;
} st_weight_gather;

typedef struct {
  st_model_config cfg;
  st_recompute recompute;
  st_param_table tab;
  const st_ops *ops;
  int64_t padded_total;   /* length of params/grads (>= tab.total) */
  size_t es;              /* bytes per element of the storage dtype */
  void *params;           /* working weights, storage dtype, padded_total elements */
  float *grads;           /* fp32, padded_total elements; NULL when bucketed */
  /* ZeRO 2 (st_model_init_bucketed): block l's gradients live in
   * bucket[l % 2] only while its backward runs; the head tensors' (wte, wpe,
   * then ln_f, lm_head: [0, block_begin) and [ln_f, total) of the flat
   * vector, in that order) live in head_grads. On one rank bucket[1] is
   * bucket[0] (one buffer; the reuse hook then waits for both slots). */
  float *head_grads, *bucket[2];
  int64_t block_begin, block_numel; /* flat range of block 0, size of one block */
  /* ZeRO 3 (st_model_init_sharded; params is then NULL): this rank's
   * working weights are shard_params, flat elements [shard_begin,
   * shard_begin + shard_numel) in the storage dtype; the head tensors (wte,
   * wpe, ln_f, lm_head, laid out as head_grads) stay whole in head_params;
   * block l's weights exist whole only in wbuf[l % 2], filled through
   * `gather` before block l's forward and backward (the next block's fill is
   * started while this one computes). wheld[s]: the block wbuf[s] holds or
   * is being filled with (-1: none); wpending[s]: its fill not yet waited
   * for. Anything that changes the shard calls st_model_weights_changed. */
  void *shard_params, *head_params, *wbuf[2];
  int64_t shard_begin, shard_numel;
  int wheld[2], wpending[2];
  st_weight_gather gather;
  st_param_views p, g;    /* p: into params (storage dtype); g: into fp32 gradients */
  int B, T;               /* activation capacity */
  size_t act_bytes;       /* size of act_mem */
  void *act_mem;          /* one allocation for everything below */
  void *encoded;          /* [B,T,C] */
  float *rope_cs;         /* RoPE: [T, head_dim] cos | sin (rank/model/rope.h); else NULL */
  st_block_acts *blk;     /* n_layer blocks, then the shared one recompute rebuilds into */
  void *lnf;              /* [B,T,C] */
  float *lnf_mean, *lnf_rstd;
  int head_rows;          /* R: rows per LM-head chunk (st_model_head_rows) */
  void *logits;           /* [R, Vp]: one chunk's logits, then its dlogits (scratch) */
  float *losses;          /* [B,T] */
  float *losses_host;     /* [B,T] host copy for the loss sum */
  /* backward scratch, reused by every layer: dqkv [B,T,QKV], dfch [B,T,F]
   * or SwiGLU's [B,T,2F], dfact [B,T,F] SwiGLU's output gradient (else NULL).
   * dfch, dqkv and datty [B,T,C] are one buffer (model_layout.c): a block's
   * MLP backward is done with dfch before its attention backward writes
   * datty and then dqkv, which sit side by side in it.
   * dln [B,T,C] also carries d(ln_f output) from a training forward (the
   * chunked head's backward) to backward's first step. */
  void *dres, *dln, *dqkv, *datty, *dfch, *dfact;
  float *datt;
  /* LoRA (lora.rank > 0; st_model_init_lora): the base is frozen and the
   * adapters are what trains. tab, params (storage dtype), grads (fp32),
   * padded_total and the ZeRO-2 buckets then describe the adapter vector
   * (block_begin 0, block_numel one layer's adapters, no head tensors); the
   * base's working weights are base_params [base_tab.total], which p views;
   * g has no base views (no base gradient exists). lora_u[i]: slot i's
   * A dropout(x) [B,T,r], kept for backward; lora_s [B,T,max(max_in,
   * max_out)] scratch (B u, the output gradient's share, the adapter's dx);
   * lora_du [B,T,r]; lora_x [B,T,max_in] dropout(x) (only with dropout).
   * lora_seed: this micro-step's dropout masks (the trainer sets it before
   * forward; backward and recompute rebuild the same masks from it). */
  st_lora_config lora;
  st_lora_table ltab;
  st_param_table base_tab;
  void *base_params;
  void **lora_u;
  void *lora_s, *lora_du, *lora_x;
  uint64_t lora_seed;
  /* QLoRA (lora.nf4_base): the four projection weights of block l (qkv,
   * attn.proj, mlp.fc, mlp.proj) are nf4[4 l + P] (P: st_lora_proj), their
   * arrays carved from nf4_mem (category "weights_nf4"); base_params then
   * holds only the other base tensors (at base_coff[i] for base tensor i,
   * -1 for a projection) and p's projection views are NULL. nf4_scratch
   * (category "nf4_scratch", st_model_nf4_scratch_bytes) holds one
   * dequantised weight at a time, nf4_held = 4 l + P of the one it holds
   * (-1: none); its tail is nf4_quantize's workspace at setup. */
  st_nf4 *nf4;
  void *nf4_mem, *nf4_scratch;
  int64_t *base_coff;
  int nf4_held;
  int lora_dropout_on;  /* 1: dropout applies (training); 0 (after init): evaluation */
} st_model;

/* Bytes of the activation allocation (act_mem) by part. Each buffer's
 * 256-byte alignment padding counts with the part of that buffer, so the
 * parts add up to total. */
typedef struct {
  size_t embed;        /* encoder output [B,T,C]; RoPE's fp32 table [T, head_dim] */
  size_t blocks;       /* kept per block for backward, n_layer blocks (attention state apart) */
  size_t recompute;    /* the one shared block: what recompute rebuilds, and the two
                        * projection outputs every policy shares */
  size_t attention;    /* attention state: saved per layer (or in the shared block under
                        * full), plus backward's datt; fp32; and the padding that makes
                        * total a multiple of 256 (the arena's unit) */
  size_t head;         /* ln_f output and statistics, per-token losses */
  size_t logits;       /* one head chunk [R, Vp] (st_model_head_rows), storage dtype */
  size_t grad_scratch; /* backward's activation gradients dres, dln, datty, dqkv, dfch, dfact */
  size_t lora;         /* LoRA: A x per adapter per layer, and the adapters' scratch (0 without) */
  size_t total;        /* == st_model.act_bytes */
} st_act_bytes;

/* Bytes the LM head's logits may take at once: 256 MiB, raised to at least
 * ST_HEAD_CHUNK_MIN_ROWS rows (up to ST_HEAD_CHUNK_WIDE_ROWS when B*T has
 * eight times as many) when those fit ST_HEAD_CHUNK_MAX_BYTES (see
 * st_model_head_rows). */
#define ST_HEAD_CHUNK_BYTES ((size_t)256 << 20)
#define ST_HEAD_CHUNK_MIN_ROWS 2048
#define ST_HEAD_CHUNK_WIDE_ROWS 4096
#define ST_HEAD_CHUNK_MAX_BYTES ((size_t)2 << 30)

/* R, the rows of [B*T, Vp] logits the LM head computes at a time, in
 * forward and in st_model_logits: all BT rows when BT x Vp elements of
 * dtype fit in ST_HEAD_CHUNK_BYTES; else the larger of the largest multiple
 * of 128 rows that fits ST_HEAD_CHUNK_BYTES and a floor, the floor being
 * ST_HEAD_CHUNK_MIN_ROWS (2048) rows, raised to BT / 8 (a multiple of 128)
 * up to ST_HEAD_CHUNK_WIDE_ROWS (4096), and lowered to the largest multiple
 * of 128 that fits ST_HEAD_CHUNK_MAX_BYTES; at least 128, at most BT. Why chunk: the whole
 * buffer is 2.1 GB for Llama 3's 128256 columns at B*T = 8192 (bf16), 3.3
 * GB for GPT-2 at 32768 rows, held only to be read once by the
 * cross-entropy and once by the head's backward. Why not small chunks: each
 * chunk's weight-gradient GEMM reads and writes the fp32 [Vp, C] gradient
 * once (8 Vp C bytes against its 2 R Vp C FLOPs, 4/R bytes a FLOP), which
 * at R = 1024 held the head's backward to 584 TFLOP/s against 690 for the
 * block GEMMs (llama-3.2-1b, micro-batch 32, one H200, ST_PROFILE_OPS);
 * 4096 rows took the step from 66.7k to 68.2k tokens/s there, for 768 MiB.
 * At 2048 rows (since 2026-12-05; 4096 before) the GEMM moves 1 byte per
 * 512 FLOPs, above an H100's balance of about 295 FLOPs a byte, and GPT-2's
 * chunk is the 2,560 rows that fit 256 MiB, not 4096 (393 MiB): the 147
 * MiB that put GPT-2 774M under 0.9x the PyTorch peer (docs/memory.md).
 * Where B*T is at least 8 x 4096 rows the floor is 4096 again: a chunk is
 * then at most an eighth of the logits an unchunked head holds, and at
 * GPT-2 124M, T 8192, micro-batch 4 (32,768 rows) 4096 rows ran 0.8%
 * faster than 2,560 in two A/B runs on an H100 (docs/benchmarks.md), for
 * 147 MiB at a shape using 0.65x the peer's memory.
 * 128-row multiples keep GEMM tiles full and each chunk's rows 256-byte
 * aligned. The environment variable ST_HEAD_CHUNK_ROWS (a whole number >=
 * 1, clamped to BT) forces R, for tests and diagnostics; a value that is
 * not one makes st_model_init fail (st_model_head_rows itself then returns
 * the default). The chunking changes only the order in which the head's
 * weight gradient sums rows. */
int st_model_head_rows(const st_model_config *cfg, st_dtype dtype, int64_t BT);

/* The activation bytes st_model_init allocates for micro-batch B x T under
 * `recompute` in storage dtype `dtype`, where att_floats is the backend's
 * ops->attention_state_floats(B, T, n_head). Measured by the same layout
 * code that carves act_mem; allocates nothing. cfg must be validated. */
void st_model_measure_acts(const st_model_config *cfg, st_dtype dtype, int64_t att_floats, int B,
                           int T, st_recompute recompute, st_act_bytes *out);

/* As st_model_measure_acts for a LoRA model (lora NULL or rank 0: none). */
void st_model_measure_acts_lora(const st_model_config *cfg, const st_lora_config *lora,
                                st_dtype dtype, int64_t att_floats, int B, int T,
                                st_recompute recompute, st_act_bytes *out);

/* Build the parameter table and allocate working weights (ops->dtype),
 * fp32 gradients (both padded to a multiple of pad_multiple elements) and
 * activations for micro-batch B x T under the recompute policy, all in the
 * memory of `ops` (host for CPU, device for CUDA). Pointers passed
 * to forward/backward (inp, targets) must live in that memory too.
 * 0, or -1 with st_error (names the bytes that could not be allocated). */
int st_model_init(st_model *m, const st_model_config *cfg, const st_ops *ops, int B, int T,
                  int pad_multiple, st_recompute recompute);
/* As st_model_init, for ZeRO 2: no full gradient vector is ever allocated.
 * Gradients live in head_grads (wte, wpe, ln_f, lm_head) and two
 * one-block buckets of block_numel + 1 floats; backward then needs hooks
 * (st_model_backward_hooked). 0, or -1 with st_error. */
int st_model_init_bucketed(st_model *m, const st_model_config *cfg, const st_ops *ops, int B,
                           int T, int pad_multiple, st_recompute recompute);
/* As st_model_init_bucketed, for ZeRO 3: the working weights are only
 * this rank's shard (shard_numel elements from flat element shard_begin,
 * which may run past the table's total into the padding), the whole head
 * tensors and two one-block buffers; no whole weight vector exists. Set
 * m->gather before the first forward. 0, or -1 with st_error. */
int st_model_init_sharded(st_model *m, const st_model_config *cfg, const st_ops *ops, int B,
                          int T, int pad_multiple, st_recompute recompute, int64_t shard_begin,
                          int64_t shard_numel);
/* A LoRA model (rank/model/lora.h; lora resolved, rank >= 1): the frozen
 * base's working weights (ops->dtype, category "weights", base table size,
 * unpadded) and no base gradient; the adapters are the model's parameters
 * (tab, params in category "lora_weights", fp32 grads padded to
 * pad_multiple; buckets: ZeRO 2's per-layer buckets as
 * st_model_init_bucketed), and their activations in act_mem. ZeRO 3 is
 * not supported. 0, or -1 with st_error. */
int st_model_init_lora(st_model *m, const st_model_config *cfg, const st_lora_config *lora,
                       const st_ops *ops, int B, int T, int pad_multiple, st_recompute recompute,
                       int buckets);
/* LoRA: the base's working weights from host fp32 host[base_tab.total],
 * and back. QLoRA (lora.nf4_base): set quantises each projection weight on
 * the backend (rounded to the storage dtype first, then nf4_quantize;
 * exit 3 for a NaN or infinity, naming the tensor) and get returns the
 * dequantised projections (the storage dtype's rounding of them), i.e. the
 * base the adapters train on. 0, or -1 with st_error. */
int st_model_set_base_weights(st_model *m, const float *host);
int st_model_get_base_weights(const st_model *m, float *host);

/* QLoRA's bytes in backend memory for cfg: *nf4 the NF4 arrays of every
 * block's four projection weights (one allocation, st_nf4_bytes each),
 * *scratch the dequantisation buffer of the largest of them in dtype plus
 * nf4_quantize's workspace for it (one allocation); *base the other base
 * tensors' elements (embeddings, norms, biases, LM head). Before the
 * arena's rounding. */
void st_model_nf4_bytes(const st_model_config *cfg, st_dtype dtype, uint64_t *nf4,
                        uint64_t *scratch, int64_t *base);

/* The shard changed (an optimizer step, loaded weights): no block buffer
 * holds valid weights any more. Call after any pending fill was waited for
 * (st_model_weights_settle). No-op for an unsharded model. */
void st_model_weights_changed(st_model *m);
/* Wait for every block-buffer fill still in flight (sharded models). */
void st_model_weights_settle(st_model *m);
void st_model_free(st_model *m);

/* Set the working weights from host fp32 values host[padded_total],
 * rounded to the storage dtype (sharded: the head tensors and this rank's
 * shard only). 0, or -1 with st_error. */
int st_model_set_weights(st_model *m, const float *host);
/* Read the working weights into host[padded_total] as fp32. 0, or -1
 * (sharded models: refused, no rank holds them whole). */
int st_model_get_weights(const st_model *m, float *host);

/* Initial weights, drawn in table order. GPT-2 (Radford et al. 2019 /
 * nanoGPT): matrices N(0, 0.02), residual output projections
 * N(0, 0.02/sqrt(2L)), biases 0, LayerNorm gain 1. Llama / Qwen2 (Hugging
 * Face LlamaPreTrainedModel._init_weights with initializer_range 0.02):
 * every matrix N(0, 0.02), no special scaling of the projections, biases 0,
 * RMSNorm gain 1. Padded vocabulary rows (wte, lm_head) 0. Deterministic in
 * the rng's state (one st_rng_next keys per-chunk generators, so the values
 * do not depend on the thread count; OpenMP draws the chunks in parallel);
 * drawn in fp32 into host[padded_total], the source of
 * master and working weights. LoRA: the adapters (st_lora_init: B = 0, A
 * uniform) into host[padded_total]. 0, or -1 with st_error. */
int st_model_draw_weights(const st_model *m, st_rng *rng, float *host);
/* LoRA: a fresh base (train --lora without --init-from) into
 * host[base_tab.total], drawn as a full model's weights of the same
 * description would be from the same rng state. 0, or -1 with st_error. */
int st_model_draw_base(const st_model *m, st_rng *rng, float *host);
/* Draw as above and set the working weights. 0, or -1 with st_error. */
int st_model_init_weights(st_model *m, st_rng *rng);

/* Forward over inp[B,T] (token ids < vocab_size) with targets[B,T]. Returns
 * the SUM of per-token losses (double); the per-token losses are in
 * m->losses [B*T] (fp32, backend memory) and m->losses_host. The LM head
 * runs in chunks of m->head_rows rows, so the [B*T, Vp] logits never exist
 * whole (m->logits holds only the last chunk's). When dloss > 0 (a training
 * forward) each chunk's logit gradient, scaled by dloss, goes straight
 * through the head's backward: the head's weight gradient (g.lm_head when
 * untied, else g.wte) ACCUMULATES here, so gradients must be zeroed BEFORE
 * a training forward, and m->dln is left holding d(ln_f output) for
 * st_model_backward. dloss == 0 (evaluation) touches no gradient. */
double st_model_forward(st_model *m, const int *inp, const int *targets, int B, int T,
                        float dloss);
/* The logits of inp[B,T] (backend memory), B x T within the capacity, into
 * host_out[B*T, Vp] as fp32 (padded columns included): the forward without
 * targets, its head run chunk by chunk through m->logits and copied out.
 * For comparisons with reference logits (tests, tests/hf_logits.c);
 * training never needs them whole. Overwrites the activations; touches no
 * gradient. 0, or -1 with st_error (host staging memory). */
int st_model_logits(st_model *m, const int *inp, int B, int T, float *host_out);
/* Backward of the last training forward, from the m->dln it left: ln_f's
 * backward, the blocks, the embedding (the head's weight gradient was
 * accumulated by the forward). ACCUMULATES into m->grads. */
void st_model_backward(st_model *m, const int *inp, int B, int T);

/* Hooks into backward for overlapping gradient communication with it.
 * ready: the flat range [begin, end) of gradients is final for this
 *   backward; grads points at element begin in the backend's memory (the
 *   bucket, head_grads or m->grads), which stays valid until reuse(slot) is
 *   called or backward returns. slot names the buffer: l % 2 for block l,
 *   2 for [0, block_begin) (wte, wpe), 3 for [ln_f, total) (ln_f, lm_head).
 * reuse: the bucket of slot 0 or 1 is about to be zeroed for a new block;
 *   anything still reading it must finish first. NULL when not needed.
 * Ranges come in a fixed order: blocks n_layer-1 .. 0, then slot 2, then
 *   slot 3 (st_model_grad_ranges walks the same order). */
typedef struct {
  void (*ready)(void *ctx, const float *grads, int64_t begin, int64_t end, int slot);
  void (*reuse)(void *ctx, int slot);
  void *ctx;
} st_grad_hooks;

/* Backward calling hooks as ranges become final. Without buckets the ranges
 * point into m->grads (ZeRO 1: reduce-scatter each block's gradients while
 * earlier blocks compute). With buckets, block l's gradients exist only in
 * bucket[l % 2] until reuse(l % 2) before block l-2. */
void st_model_backward_hooked(st_model *m, const int *inp, int B, int T,
                              const st_grad_hooks *hooks);

/* The hook ranges in backward's order, for a rank that must join the
 * collectives without a backward of its own: calls fn(ctx, begin, end, slot). */
void st_model_grad_ranges(const st_model *m, void (*fn)(void *ctx, int64_t begin, int64_t end,
                                                        int slot), void *ctx);
/* Zero the gradient vector (with buckets: head_grads). */
void st_model_zero_grad(st_model *m);

#endif
