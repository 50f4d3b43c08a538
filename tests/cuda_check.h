/* cuda_check.h - the harness the CUDA tests share: the CPU reference and
 * the CUDA table under test, random inputs rounded to the storage dtype,
 * host<->device copies that convert, and checks that print one line each
 * and count failures. See test_cuda_ops.c for the tolerances' reasoning. */
#ifndef ST_CUDA_CHECK_H
#define ST_CUDA_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "util/rng.h"

extern const st_ops *CPU, *GPU;
extern st_dtype DT;     /* GPU->dtype */
extern size_t ES;       /* bytes per storage element */
extern double U, UA;    /* rounding of a storage-dtype output: unit roundoff, absolute floor */
extern st_rng g_rng;
extern int g_checks, g_failures;

/* Start a CUDA test program: 77 (skip, message printed) without a GPU, 1 when
 * the device cannot be bound, else 0 with CPU set, device 0 bound, fp32
 * selected and g_rng seeded. name is the program's, for the messages. */
int cuda_check_start(const char *name, char *device, size_t cap);
/* The table of dtype dt becomes GPU, with DT, ES, U and UA. */
void use_dtype(st_dtype dt);

/* ---- buffers (fp32: dev/upload/back; storage dtype: dev_st/upload_st/back_st)
 * and checks */
float *randn(int64_t n, float scale);
void round_st(float *x, int64_t n);
float *randn_st(int64_t n, float scale);
float *copy_of(const float *x, int64_t n);
float *rounded_copy(const float *x, int64_t n);
int *rand_ints(int64_t n, int hi);
void *dev_bytes(const void *h, size_t bytes);
float *dev(const float *h, int64_t n);
void upload(float *d, const float *h, int64_t n);
float *back(const float *d, int64_t n);
void upload_st(void *d, const float *h, int64_t n);
void *dev_st(const float *h, int64_t n);
float *back_st(const void *d, int64_t n);
void *at(void *base, int64_t i);
double maxabs(const float *x, int64_t n);
double maxabs_diff(const float *x, const float *y, int64_t n);
void expect_close_terms(const char *what, const float *cuda, const float *cpu, int64_t n,
                        double atol, double rtol, const float *terms, int64_t period,
                        double tscale);
void expect_close(const char *what, const float *cuda, const float *cpu, int64_t n, double atol,
                  double rtol);
void expect_close_st(const char *what, const float *cuda, const float *cpu, int64_t n, double atol,
                     double rtol);
void expect_close_sum(const char *what, const float *cuda, const float *cpu, int64_t n, double atol,
                      double rtol, const float *terms, int64_t period);
void expect_exact_st(const char *what, const float *cuda, const float *cpu, int64_t n);
/* a and b equal byte for byte: two runs of one op (determinism), or an op
 * against another that must match it; `what` says which. */
void expect_identical(const char *what, const void *a, const void *b, size_t bytes);
void expect_true(const char *what, int ok);

#endif
