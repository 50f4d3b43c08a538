/* llmc_model.h - llm.c model files (Karpathy's llm.c, train_gpt2.c
 * gpt2_build_from_checkpoint and train_gpt2.py write_model).
 *
 * Layout: a header of 256 little-endian int32: [0] magic 20240326, [1]
 * version (3: fp32 parameters, 5: bf16), [2] max_seq_len (rows of wpe),
 * [3] vocab_size, [4] num_layers, [5] num_heads, [6] channels, [7]
 * padded_vocab_size; then every parameter, grouped by kind across the
 * layers: wte [Vp, C], wpe [maxT, C], ln1w [L, C], ln1b [L, C],
 * qkvw [L, 3C, C], qkvb [L, 3C], attprojw [L, C, C], attprojb [L, C],
 * ln2w [L, C], ln2b [L, C], fcw [L, 4C, C], fcb [L, 4C],
 * fcprojw [L, C, 4C], fcprojb [L, C], lnfw [C], lnfb [C]; weights
 * [out, in] as shardtrain stores them, q, k, v in that order in qkv.
 * Errors are one st_error line, exit code 3, naming the file.
 */
#ifndef ST_LLMC_MODEL_H
#define ST_LLMC_MODEL_H

#include "kernels/dtype.h"
#include "rank/model/config.h"
#include "rank/model/params.h"

#define ST_LLMC_MAGIC 20240326

/* 1 when path is a regular file starting with the llm.c model magic. */
int st_llmc_is_model(const char *path);
/* Read the header: the shape (validated; block_size = max_seq_len) and the
 * stored dtype (ST_FP32 for version 3, ST_BF16 for 5). 0 or -1. */
int st_llmc_read_header(const char *path, st_model_config *cfg, st_dtype *dt);
/* Read every parameter into params[tab->total] as fp32, tab built from the
 * header's shape. The file's padded_vocab_size may differ from
 * shardtrain's: the first vocab_size rows of wte are copied, the rest of
 * shardtrain's rows are zero. 0 or -1. */
int st_llmc_read(const char *path, const st_model_config *cfg, const st_param_table *tab,
                 float *params);
/* Write params as an llm.c model file in dt (ST_FP32: version 3, ST_BF16:
 * version 5, rounded to nearest even) with padded_vocab_size =
 * cfg->padded_vocab_size (padded rows written as zero), to path.tmp then
 * renamed. 0 or -1. */
int st_llmc_write(const char *path, const st_model_config *cfg, const st_param_table *tab,
                  const float *params, st_dtype dt);

#endif
