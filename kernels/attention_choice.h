/* attention_choice.h - which of the CUDA backend's attention kernels takes a
 * shape, as plain C (built into st_kernels_cpu) so the rules are unit-tested
 * on the CPU (tests/test_attention_choice.c) and checked at setup, not found
 * out inside a step. */
#ifndef ST_ATTENTION_CHOICE_H
#define ST_ATTENTION_CHOICE_H

#include <stdint.h>

#include "kernels/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Attention implementations of the CUDA tables (--attention). AUTO picks
 * one of the others at setup (st_attention_auto_mixed, memory_preflight.c);
 * MIXED is cuDNN's forward with our O(T) backward. */
typedef enum {
  ST_ATTENTION_AUTO = 0,
  ST_ATTENTION_CUDNN = 1,
  ST_ATTENTION_FLASH = 2,
  ST_ATTENTION_MIXED = 3
} st_attention_impl;

/* --attention's words, in the enum's order, NULL-terminated (the CLI's
 * list of what it takes). */
extern const char *const st_attention_words[];

/* --attention's word ("auto", "cudnn", "flash", "mixed") into *out: 0, or
 * -1 for any other word (*out untouched; the CLI has refused it before). */
int st_attention_parse(const char *word, st_attention_impl *out);

/* The --attention word of impl ("auto" for anything unknown). */
const char *st_attention_name(st_attention_impl impl);

/* 1 when --attention auto runs cuDNN's forward with our backward (mixed)
 * from the start, not cuDNN's deterministic backward: at head size 64 where
 * our software-pipelined Hopper backward runs (hopper: the wgmma kernels
 * run on this GPU; plan assumes they do). Measured on an H100 (2026-12-06,
 * test_cuda_attention_cudnn's timings, bf16, 12 heads): our backward 0.634
 * ms against cuDNN's 0.664 at B=32 T=1024, 0.905 against 1.049 at B=4
 * T=4096, 0.872 against 1.039 at B=1 T=8192, and no O(T^2) workspace; at
 * head size 128 cuDNN's is the faster (0.908 against 1.099 ms at B=2
 * T=4096, 16 heads), so auto keeps it there where it fits. */
int st_attention_auto_mixed(int hs, int hopper);

/* 1 when the tensor-core FlashAttention-2 kernels (attention_tc.cu) take
 * width C with NH heads in dtype dt: bf16 or fp16, C a positive multiple of
 * NH, head size C/NH of 32, 64 or 128. Else 0. */
int st_attention_tc_takes(int C, int NH, st_dtype dt);

/* The head-size tile of the fp32-arithmetic kernels (attention.cu) for width
 * C with NH heads: 32, 64 or 128, the smallest that holds the head size
 * C/NH; 0 when C/NH is not a whole number from 1 to 128 (no kernel). */
int st_attention_simt_tile(int C, int NH);

/* 1 when one of our own kernels takes width C with NH heads in dtype dt on
 * the CUDA backend (the tensor-core ones or the fp32-arithmetic ones: any
 * whole head size from 1 to 128), else 0. train refuses the rest at setup
 * (attention.cu) and plan at plan time, with the same words. */
int st_attention_ours_takes(int C, int NH, st_dtype dt);

/* 1 when cuDNN 9's fused attention takes head size hs: a multiple of 8, at
 * most 128 (the backward's documented support surface on Hopper), else 0. */
int st_attention_cudnn_takes_head(int hs);

/* The refusal train's setup (attention.cu) and plan share for a head size
 * that nothing on the CUDA backend would run with --attention asked in
 * dtype dt: ours take whole head sizes 1 to 128, cuDNN (cudnn, and mixed's
 * forward) multiples of 8 up to 128 (bf16/fp16 only; fp32 runs ours). 1
 * with one line naming --heads/--dim or --attention and the fix in
 * msg[cap]; 0 when something runs (msg untouched). */
int st_attention_head_refusal(st_attention_impl asked, int C, int NH, st_dtype dt, char *msg,
                              unsigned long cap);

/* Sequences per cuDNN attention backward call. cuDNN's deterministic
 * backward keeps dP for every sequence of a call in its workspace, NH x T'^2
 * x 2 bytes a sequence (T' = T rounded up to 64;
 * kernels/cuda/attention_cudnn.h), and the sequences are independent, so
 * calling it on groups of sequences bounds the workspace by a group, not
 * the micro-batch, with the same result bytes. Each extra call costs speed
 * (an H200, GPT-2 124M, against one call for the micro-batch: T = 4096,
 * micro-batch 8, groups of 4 -1.9%, of 2 -4.0%, of 1 -6.8%; T = 8192,
 * micro-batch 4, groups of 2 -1.8%, of 1 -4.1%; docs/memory.md), so
 * the whole micro-batch is one call unless memory asks for groups.
 *
 * The group for a micro-batch of B sequences under cap: the largest
 * divisor of B that is at most cap when cap >= 1; when cap is 0, the one
 * ST_ATTENTION_CUDNN_SEQS=N (N >= 1; measurements and tests) caps the same
 * way, else B. B < 1 gives 1. train and plan both ask this function, so the
 * workspace they count agrees. */
int st_attention_cudnn_group(int B, int cap);

/* The smallest group --attention auto considers for B sequences of T
 * tokens and NH query heads: the smallest divisor g of B with g x NH x
 * ceil(T/128) >= ST_CUDNN_MIN_TILES (B when none), so that a call keeps the
 * GPU busy: the measured costs above all have 768 such tiles or more;
 * below that cuDNN's advantage over our O(T) kernel is not measured. */
#define ST_CUDNN_MIN_TILES 768
int st_attention_cudnn_min_group(int B, int T, int NH);

/* The block order of the Hopper flash-attention kernels
 * (attention_wgmma.cu): how many heads a group (wg_slot_at,
 * kernels/cuda/wgmma.cuh) for bnh heads (B x NH; B x NKV for dK/dV) of
 * `tiles` 64-row tiles on a GPU of `sms` SMs (<= 0: 132, an H100's). Returns
 * g in [1, bnh]: 1 is head after head (the blocks running at once share few
 * heads' K and V in L2, but the last head's longest tile runs out the tail
 * alone), bnh every head's longest tile in the first wave (no tail, but
 * the resident blocks span every head).
 * setting: ST_ATTENTION_GRID_AUTO, ST_ATTENTION_GRID_HEADS (bnh) or a
 * group size >= 1 (ST_ATTENTION_GRID=tiles is 1), which is forced.
 * Auto: bnh while bnh <= ST_ATTENTION_HEADS_FIRST_MAX (measured faster:
 * attention_wgmma.cu has the timings); above it the smallest group whose
 * own work hides its longest tile under list scheduling, work / slots >=
 * longest: g n (n + 1) / 2 / slots >= n, so g = ceil(2 slots / (n + 1)),
 * with slots = 3 blocks an SM (the dQ kernel's; dK/dV holds 2), and at
 * most ST_ATTENTION_HEADS_GROUP_MAX heads: at T <= 2048 the model asks for
 * 24-47 heads, and those measured slower than 7 (their resident blocks
 * span more heads' K and V than L2 keeps), while 7 was the fastest or
 * within 0.3% of it at every shape timed (attention_wgmma.cu). */
#define ST_ATTENTION_HEADS_FIRST_MAX 32
#define ST_ATTENTION_HEADS_GROUP_MAX 7
#define ST_ATTENTION_GRID_AUTO 0
#define ST_ATTENTION_GRID_HEADS (-1)
#define ST_ATTENTION_GRID_BAD (-2)
int st_attention_heads_group(int setting, int64_t bnh, int64_t tiles, int sms);

/* ST_ATTENTION_GRID's value e as a setting for st_attention_heads_group:
 * ST_ATTENTION_GRID_AUTO for NULL, "" or "auto", ST_ATTENTION_GRID_HEADS
 * for "heads", 1 for "tiles", N for a whole number N in [1, 65535] (heads a
 * group), ST_ATTENTION_GRID_BAD for anything else (the caller warns and
 * takes auto). */
int st_attention_grid_parse(const char *e);

#ifdef __cplusplus
}
#endif
#endif
