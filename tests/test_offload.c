/* test_offload.c - the offloaded optimizer (rank/optim/offload.c):
 *
 * 1. Host bytes: with --offload optimizer, st_trainer_alloc_state asks
 *    ops->host_alloc for exactly the plan's host section, buffer by buffer
 *    and category by category (256-byte rounded), and the device for no
 *    master weights or Adam moments: its buffers are the plan's device
 *    categories, at several shapes, dtypes, rank counts, stages and chunk
 *    sizes (the chunk above and below the range's length).
 * 2. The chunked host step equals one st_adamw_range over the whole range
 *    followed by st_dtype_from_f32 (the device's round-to-nearest-even),
 *    bit for bit, in fp32, bf16 and fp16, with chunks that cut tensors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kernels/arena.h"
#include "rank/memory/memory_plan.h"
#include "rank/optim/offload.h"
#include "rank/train/trainer_state.h"

#define MAX_LIVE 64
typedef struct {
  void *p;
  size_t bytes;
  const char *category;
} live;
static live g_dev[MAX_LIVE], g_host[MAX_LIVE];
static int g_ndev, g_nhost;

static void *record(live *l, int *n, size_t bytes, const char *category) {
  void *p = calloc(bytes ? bytes : 1, 1);
  assert_non_null(p);
  assert_true(*n < MAX_LIVE);
  l[*n] = (live){p, bytes, category};
  (*n)++;
  return p;
}
static void forget(live *l, int *n, void *p) {
  if (!p) return;
  for (int i = 0; i < *n; i++)
    if (l[i].p == p) {
      free(p);
      l[i] = l[--*n];
      return;
    }
  fail_msg("freeing a pointer not handed out");
}
static void *dev_alloc(size_t b, const char *c) { return record(g_dev, &g_ndev, b, c); }
static void dev_free(void *p) { forget(g_dev, &g_ndev, p); }
static void *host_alloc(size_t b, const char *c) { return record(g_host, &g_nhost, b, c); }
static void host_free(void *p) { forget(g_host, &g_nhost, p); }

static uint64_t sum_of(const live *l, int n, const char *category) {
  uint64_t s = 0;
  for (int i = 0; i < n; i++)
    if (!category || strcmp(l[i].category, category) == 0) s += st_arena_round(l[i].bytes);
  return s;
}

static int64_t cuda_att_floats(int B, int T, int NH) { return (int64_t)B * NH * T; }

static void check_alloc(const st_model_config *cfg, int world, int zero, st_backend be,
                        st_dtype dt, long chunk) {
  st_ops ops = *st_ops_cpu();
  ops.alloc = dev_alloc;
  ops.free = dev_free;
  ops.host_alloc = host_alloc;
  ops.host_free = host_free;
  ops.dtype = dt;
  if (be == ST_BACKEND_CUDA) ops.attention_state_floats = cuda_att_floats;
  char v[32];
  snprintf(v, sizeof v, "%ld", chunk);
  setenv("ST_OFFLOAD_CHUNK", v, 1);
  st_run_config rc;
  st_run_config_defaults(&rc);
  rc.model = *cfg;
  rc.seq_len = cfg->block_size;
  rc.micro_batch = 2;
  rc.zero_stage = zero;
  rc.offload = 1;
  st_comm comm;
  memset(&comm, 0, sizeof comm);
  comm.rank = world - 1;
  comm.world = world;
  trainer tr;
  memset(&tr, 0, sizeof tr);
  tr.rc = &rc;
  tr.comm = &comm;
  tr.ops = &ops;
  assert_int_equal(st_trainer_alloc_state(&tr), 0);
  st_plan_input in;
  st_run_plan_input(&rc, world, be, dt, &in);
  assert_int_equal(in.offload_chunk, chunk);
  st_memory_plan p;
  assert_int_equal(st_memory_plan_make(&in, &p), 0);
  /* host: the plan's section, by category, and in total */
  assert_int_equal(p.host_master, sum_of(g_host, g_nhost, "host_master"));
  assert_int_equal(p.host_adam_m, sum_of(g_host, g_nhost, "host_adam_m"));
  assert_int_equal(p.host_adam_v, sum_of(g_host, g_nhost, "host_adam_v"));
  assert_int_equal(p.host_grad_staging, sum_of(g_host, g_nhost, "host_grad_staging"));
  assert_int_equal(p.host_work_staging, sum_of(g_host, g_nhost, "host_work_staging"));
  assert_int_equal(p.host_total, sum_of(g_host, g_nhost, NULL));
  assert_int_equal(p.host_total, tr.offload.host_bytes);
  assert_true(tr.master == tr.offload.master && tr.adam_m == tr.offload.m &&
              tr.adam_v == tr.offload.v);
  /* device: nothing of the optimizer's state; the rest as planned */
  assert_int_equal(p.master + p.adam_m + p.adam_v, 0);
  assert_int_equal(sum_of(g_dev, g_ndev, "master") + sum_of(g_dev, g_ndev, "adam_m") +
                       sum_of(g_dev, g_ndev, "adam_v"), 0);
  assert_int_equal(p.total - p.cublaslt - p.scratch - p.nccl - p.context,
                   sum_of(g_dev, g_ndev, NULL));
  uint64_t host = 0, device = 0;
  assert_int_equal(st_memory_plan_offload_split(&in, &host, &device), 0);
  assert_true(host == p.host_total && device == p.total);
  in.offload = 0; /* without: the same device plan plus the state, no host section */
  st_memory_plan q;
  assert_int_equal(st_memory_plan_make(&in, &q), 0);
  assert_int_equal(q.host_total, 0);
  assert_int_equal(q.total - p.total, q.master + q.adam_m + q.adam_v);
  assert_int_equal(q.adam_m, p.host_adam_m);

  st_offload_free(&tr.offload, &ops);
  assert_int_equal(g_nhost, 0);
  if (!tr.grad_shard_aliased) ops.free(tr.grad_shard);
  for (int s = 0; s < ST_COMM_TAGS; s++) ops.free(tr.recv[s]);
  ops.free(tr.d_inp);
  ops.free(tr.d_tgt);
  st_model_free(&tr.model);
  assert_int_equal(g_ndev, 0);
  free(tr.bucket_counts);
  free(tr.inp);
  free(tr.tgt);
  free(tr.scratch);
  free(tr.config_json);
  unsetenv("ST_OFFLOAD_CHUNK");
}

static void test_host_bytes_equal_allocation(void **state) {
  (void)state;
  st_model_config shapes[] = {
      {.n_layer = 2, .n_head = 4, .n_embd = 64, .block_size = 32, .vocab_size = 256},
      {.n_layer = 1, .n_head = 5, .n_embd = 5, .block_size = 7, .vocab_size = 131},
  };
  const long chunks[] = {0, 37, 5000};
  for (int s = 0; s < 2; s++) {
    assert_int_equal(st_model_validate(&shapes[s]), 0);
    for (int w = 1; w <= 3; w++)
      for (int z = 0; z < 3; z++)
        for (int c = 0; c < 3; c++) {
          check_alloc(&shapes[s], w, z, ST_BACKEND_CPU, ST_FP32, chunks[c]);
          check_alloc(&shapes[s], w, z, ST_BACKEND_CUDA, ST_BF16, chunks[c]);
          check_alloc(&shapes[s], w, z, ST_BACKEND_CUDA, ST_FP16, chunks[c]);
        }
  }
}

/* Deterministic values in [-1, 1). */
static float val(uint32_t i, uint32_t salt) {
  uint32_t x = i * 2654435761u ^ salt * 40503u;
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  x ^= x >> 15;
  return (float)(x & 0xffffff) / (float)0x800000 - 1.0f;
}

/* gdt: the gradients' dtype (--grad-dtype); bf16 ones are the fp32
 * values rounded, and both sides read the same bits. */
static void check_step(st_dtype dt, int64_t chunk, st_dtype gdt) {
  st_model_config cfg = {.n_layer = 2, .n_head = 4, .n_embd = 32, .block_size = 16,
                         .vocab_size = 97};
  assert_int_equal(st_model_validate(&cfg), 0);
  st_param_table tab;
  assert_int_equal(st_param_table_build(&cfg, &tab), 0);
  /* a range that starts and ends inside tensors, as a rank's partition does */
  const int64_t begin = 1001, end = tab.total - 777, n = end - begin;
  st_ops ops = *st_ops_cpu();
  ops.dtype = dt;
  st_offload o;
  assert_int_equal(st_offload_alloc(&o, &ops, n, chunk), 0);
  const size_t es = st_dtype_size(dt);
  float *g = malloc((size_t)n * 4), *pm = malloc((size_t)n * 4), *m = malloc((size_t)n * 4),
        *v = malloc((size_t)n * 4);
  char *work = calloc((size_t)n, es), *want = calloc((size_t)n, es);
  assert_true(g && pm && m && v && work && want);
  void *gq = malloc((size_t)n * st_dtype_size(gdt)); /* g in gdt */
  assert_non_null(gq);
  for (int64_t i = 0; i < n; i++) {
    g[i] = val((uint32_t)i, 1);
    pm[i] = o.master[i] = val((uint32_t)i, 2);
    m[i] = o.m[i] = 0.1f * val((uint32_t)i, 3);
    v[i] = o.v[i] = 0.01f * (val((uint32_t)i, 4) + 1.0f);
  }
  st_dtype_from_f32(gdt, gq, g, (size_t)n);
  const st_optim_config oc = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                              .weight_decay = 0.1f};
  for (int t = 1; t <= 3; t++) {
    st_offload_step(&o, &ops, &tab, &oc, 1e-3f, 0.5f, t, gq, gdt, work, begin, end);
    st_adamw_range(st_ops_cpu(), &tab, &oc, 1e-3f, 0.5f, t, pm, NULL, 0, gq, gdt, m, v, begin,
                   end);
    st_dtype_from_f32(dt, want, pm, (size_t)n);
    assert_memory_equal(o.master, pm, (size_t)n * 4);
    assert_memory_equal(o.m, m, (size_t)n * 4);
    assert_memory_equal(o.v, v, (size_t)n * 4);
    assert_memory_equal(work, want, (size_t)n * es);
  }
  st_offload_free(&o, &ops);
  st_param_table_free(&tab);
  free(g);
  free(gq);
  free(pm);
  free(m);
  free(v);
  free(work);
  free(want);
}

static void test_step_equals_one_update(void **state) {
  (void)state;
  const int64_t chunks[] = {7, 37, 4096, 0};
  for (int d = 0; d < 3; d++)
    for (int c = 0; c < 4; c++) {
      check_step((st_dtype)d, chunks[c], ST_FP32);
      check_step((st_dtype)d, chunks[c], ST_BF16);
    }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_host_bytes_equal_allocation),
      cmocka_unit_test(test_step_equals_one_update),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
