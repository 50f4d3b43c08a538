/* nf4.h - 4-bit NormalFloat (NF4) weights: the storage format of QLoRA's
 * frozen base (Dettmers et al. 2023, "QLoRA", sec. 3) as bitsandbytes lays
 * it out (functional.py quantize_4bit with quant_type="nf4", blocksize=64,
 * compress_statistics=True), so a tensor quantised by either reads the same.
 *
 * A [rows, cols] row-major weight is taken as one flat vector of
 * n = rows * cols elements (bitsandbytes flattens the nn.Linear weight
 * [out, in] the same way):
 *  - blocks of ST_NF4_BLOCK = 64 consecutive elements, the last one shorter
 *    when 64 does not divide n; block b has absmax_b = max |w| over it;
 *  - element i is the 4-bit index of the NF4 code value (st_nf4_code) nearest
 *    to w_i * (1 / absmax_b); the fp32 midpoint between two codes goes to
 *    the lower one (torch.bucketize in bitsandbytes' CPU quantiser);
 *  - two indices per byte, element 2k in the HIGH nibble and 2k+1 in the low
 *    one; when n is odd the last low nibble is 7 (the code of 0.0, what
 *    bitsandbytes' zero padding quantises to);
 *  - double quantisation of the absmax values (QLoRA sec. 3 "Double
 *    Quantization"): offset = mean of all absmax_b, then a_b = absmax_b -
 *    offset is quantised with 8-bit blockwise quantisation in blocks of
 *    ST_NF4_BLOCK2 = 256: absmax2_g = max |a_b| over block g (fp32), and
 *    absmax_code_b is the index of the dynamic-map code value
 *    (st_nf4_dynamic_code, bitsandbytes' create_dynamic_map(signed=True)) nearest
 *    to a_b / absmax2_g, ties to the lower index.
 * Dequantisation, in fp32 with every operation rounded once (no fused
 * multiply-add), as bitsandbytes' dequantize_4bit does it:
 *   absmax_b = st_nf4_dynamic_code[absmax_code_b] * absmax2_{b/256} + offset
 *   w_i      = st_nf4_code[index_i] * absmax_b.
 *
 * Where bitsandbytes' own backends differ from each other, we follow its
 * CPU backend, whose output is our golden file (tests/data/nf4/): the
 * absmax of an all-zero block is 0 and its elements quantise to 0.0's code;
 * the 4-bit thresholds are the fp32 midpoints (its CUDA tree's literals
 * are one ulp off at 4 of the 15); the second level divides by absmax2 (its
 * CUDA kernel multiplies by 1/absmax2, and never emits index 255). The offset is the fp32 rounding of
 * the mean summed in double in a fixed order (st_nf4_mean), which can sit
 * one fp32 ulp from torch's float mean; the second level of bitsandbytes'
 * CPU backend (a bucketed search, BinSearch's Direct2) is also not always
 * the nearest code close to 0, where ours is. None of this changes how a
 * stored tensor dequantises.
 */
#ifndef ST_NF4_H
#define ST_NF4_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/dtype.h"

#define ST_NF4_BLOCK 64   /* weights per absmax (bitsandbytes blocksize=64) */
#define ST_NF4_BLOCK2 256 /* absmax values per second-level scale */
#define ST_NF4_ZERO_INDEX 7 /* st_nf4_code[7] == 0.0f */

/* The 16 NF4 values, ascending: bitsandbytes' get_4bit_type("nf4"), i.e.
 * create_normal_map(offset=0.9677083) rounded to fp32. */
extern const float st_nf4_code[16];
/* The 256 values of bitsandbytes' create_dynamic_map(signed=True,
 * max_exponent_bits=7, total_bits=8), ascending, fp32. */
extern const float st_nf4_dynamic_code[256];

/* One NF4 tensor. The three arrays live in one memory (host for the CPU
 * functions below, the backend's for the op table's nf4_* ops), usually one
 * block laid out by st_nf4_carve; offset is a plain value in the struct. */
typedef struct st_nf4 {
  int64_t rows, cols;     /* the weight's shape; n = rows * cols elements */
  uint8_t *codes;         /* ceil(n / 2) bytes: 4-bit indices, high nibble first */
  uint8_t *absmax_codes;  /* ceil(n / 64) bytes: 8-bit dynamic-map indices */
  float *absmax2;         /* ceil(ceil(n / 64) / 256) second-level scales, fp32 */
  float offset;           /* mean of the first-level absmax values, fp32 */
} st_nf4;

/* Sizes of an NF4 [rows, cols] tensor. payload is what the format holds
 * (codes + absmax codes + absmax2 + the 4-byte offset): n/2 + n/64 +
 * 4 * ceil(n/16384) + 4 bytes, about 0.516 bytes per weight (4.127 bits)
 * for large n. bytes is what st_nf4_carve takes in one block: the three
 * arrays each rounded up to 256 bytes (the arena's alignment), the offset
 * kept in the struct. */
typedef struct {
  int64_t n;            /* elements */
  int64_t blocks;       /* first-level blocks (absmax values) */
  int64_t blocks2;      /* second-level blocks (absmax2 values) */
  size_t code_bytes;    /* ceil(n / 2) */
  size_t absmax_code_bytes; /* blocks */
  size_t absmax2_bytes; /* 4 * blocks2 */
  size_t payload;       /* code_bytes + absmax_code_bytes + absmax2_bytes + 4 */
  size_t bytes;         /* st_nf4_carve's block: each array rounded up to 256 */
} st_nf4_sizes;

/* The sizes above for a [rows, cols] weight (rows, cols >= 0). */
st_nf4_sizes st_nf4_size(int64_t rows, int64_t cols);
/* st_nf4_size(rows, cols).bytes: the memory plan's figure for one NF4
 * weight in backend memory. */
size_t st_nf4_bytes(int64_t rows, int64_t cols);
/* The dequantisation scratch the NF4 matmul (kernels/nf4_matmul.h) needs for
 * this weight: rows * cols elements of the storage dtype dt, rounded up to
 * 256 bytes. One scratch of the largest NF4 weight of a layer serves all of
 * them, one after the other (the weights are never all held in 16 bits).
 * At least st_nf4_quantize_scratch_bytes(rows, cols), so the same buffer
 * also serves the op table's nf4_quantize at setup. */
size_t st_nf4_scratch_bytes(int64_t rows, int64_t cols, st_dtype dt);
/* Workspace of the op table's nf4_quantize: the fp32 first-level absmax
 * values and one fp32 for the offset, 256-byte aligned parts. */
size_t st_nf4_quantize_scratch_bytes(int64_t rows, int64_t cols);

/* Point q's arrays into mem (st_nf4_bytes(rows, cols) bytes, 256-byte
 * aligned, any memory: host or device) and set its shape; offset 0. */
void st_nf4_carve(st_nf4 *q, int64_t rows, int64_t cols, void *mem);

/* The offset: the mean of absmax[0..nb) summed in double in a fixed order
 * (256 interleaved partial sums s_t = sum of absmax[t + 256 j] over
 * ascending j, then halved pairwise: s_t += s_{t+128}, s_t += s_{t+64}, ...,
 * s_0 += s_1), divided by nb in double, rounded to fp32. The CUDA quantiser
 * takes the same sums in the same order, so both give the same bits. nb = 0
 * gives 0. */
float st_nf4_mean(const float *absmax, int64_t nb);

/* Quantise w[rows * cols] (fp32, host) into q (host arrays, from
 * st_nf4_carve). Returns 0, or -1 when w holds a NaN or an infinity
 * (nothing meaningful to quantise: the caller names the tensor, exit 3). */
int st_nf4_quantize(st_nf4 *q, const float *w);
/* The same with the offset given instead of computed (tests: reproduces a
 * state made by another implementation of the mean). */
int st_nf4_quantize_with_offset(st_nf4 *q, const float *w, float offset);
/* The dequantised absmax of first-level block b (fp32, the formula above). */
float st_nf4_block_absmax(const st_nf4 *q, int64_t b);
/* out[rows * cols] = the dequantised weight, fp32 (host). The reference the
 * CUDA kernel matches bit for bit once both round to the same dtype. */
void st_nf4_dequantize(const st_nf4 *q, float *out);

#endif
