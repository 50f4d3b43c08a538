/* infer_setup.h - what sample and eval share: open a model source
 * (io/model_source.h), pick the backend from --device and --precision as
 * train does, read the weights, and parse their common flag values. One
 * process, no MPI. */
#ifndef ST_INFER_SETUP_H
#define ST_INFER_SETUP_H

#include "io/model_source.h"
#include "kernels/ops.h"
#include "rank/model/params.h"

typedef struct {
  st_model_source src;
  st_param_table tab;
  float *weights;        /* host fp32 [tab.total] */
  const st_ops *ops;
  char device[128];      /* "cpu", "cuda:0 (NVIDIA H200)" */
  char precision[8];     /* fp32, bf16, fp16 */
} st_loaded_model;

/* Open init, resolve device ("cpu", "cuda", "auto") and precision ("auto":
 * bf16 on CUDA, fp32 on the CPU; the CPU runs fp32 only), read the weights.
 * 0, or -1 with st_error: exit 3 for the source, 2 for the flags. */
int st_load_model(const char *init, const char *device, const char *precision,
                  st_loaded_model *out);
void st_loaded_model_free(st_loaded_model *m);

/* The tokenizer the model's ids mean, where the source says: a
 * checkpoint's run config ("tokenizer": name, digest), else the tokenizer
 * files of its tokenizer_dir (loaded to take their digest). 1 with name
 * (32 bytes) and digest (72 bytes) filled, 0 when the source does not say. */
int st_loaded_model_tokenizer(const st_loaded_model *m, char *name, char *digest);

/* Strict number parsing for flag values: the whole string, finite, in
 * [lo, hi]. 0, or -1 with st_error (usage class) naming the flag. */
int st_flag_long(const char *flag, const char *v, long lo, long hi, long *out);
int st_flag_double(const char *flag, const char *v, double *out);

#endif
