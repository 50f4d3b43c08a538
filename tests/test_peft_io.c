/* test_peft_io.c - the PEFT adapter directory (io/peft_export.h).
 *
 * 1. GPT-2 and Llama adapter sets (several layers and modules, given out of
 *    order) exported in fp32 read back bit-exact, sorted by layer then
 *    module, with r, alpha, dropout, fan_in_fan_out, target_modules and
 *    base_model_name_or_path as written; bf16 and fp16 read back as the
 *    fp32 values rounded to nearest even, and differ from them.
 * 2. target_modules: leaf names, the module path where the leaf alone
 *    would also match an untouched module (GPT-2's c_proj).
 * 3. An existing --out (directory or file) is refused with exit 3 and left
 *    as it was; bad adapters (NaN, unknown module, duplicate, r <= 0) and
 *    a write that fails half-way (a file size limit) are refused and leave
 *    neither the directory nor a temporary one behind.
 * 4. The reader refuses, exit 3 naming the cause: another peft_type,
 *    rsLoRA, DoRA, a bias, a rank_pattern, a lora_A without lora_B, a
 *    wrong shape, a tensor that is not a LoRA weight, mixed families.
 *
 * `test_peft_io --write DIR` writes the fixture directories only (for
 * tests/e2e/test_peft_files.py, which checks them with the safetensors
 * package): DIR/gpt2_fp32, DIR/llama_fp32, DIR/llama_bf16, DIR/llama_fp16.
 * Values: value(seed, i) below, seed = 16 layer + 2 module + (B ? 1 : 0),
 * module the index in the family's module list.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "io/peft_export.h"
#include "io/peft_names.h"
#include "io/safetensors.h"
#include "util/error.h"
#include "util/fsutil.h"

/* Exact in fp32 and easy to reproduce in numpy: a 24-bit integer hash
 * scaled into [-0.5, 0.5), most of which bf16 and fp16 cannot hold. */
static float value(uint32_t seed, uint32_t i) {
  uint32_t h = i * 2654435761u + seed * 40503u + 12345u;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  return (float)(h >> 8) * (1.0f / 16777216.0f) - 0.5f;
}

typedef struct {
  st_peft_adapter ad[16];
  float *buf[32];
  int n;
} fixture;

static int module_index(st_arch arch, const char *m) {
  for (int i = 0; i < st_peft_n_modules(arch); i++)
    if (strcmp(st_peft_module_at(arch, i), m) == 0) return i;
  return -1;
}

static void add(fixture *f, st_arch arch, int r, int layer, const char *module, int in, int out) {
  st_peft_adapter *a = &f->ad[f->n];
  memset(a, 0, sizeof *a);
  a->layer = layer;
  snprintf(a->module, sizeof a->module, "%s", module);
  a->in = in;
  a->out = out;
  const uint32_t seed = (uint32_t)(16 * layer + 2 * module_index(arch, module));
  float *A = malloc((size_t)r * (size_t)in * sizeof *A);
  float *B = malloc((size_t)out * (size_t)r * sizeof *B);
  for (int i = 0; i < r * in; i++) A[i] = value(seed, (uint32_t)i);
  for (int i = 0; i < out * r; i++) B[i] = value(seed + 1, (uint32_t)i);
  a->A = A;
  a->B = B;
  f->buf[2 * f->n] = A;
  f->buf[2 * f->n + 1] = B;
  f->n++;
}

static void fixture_free(fixture *f) {
  for (int i = 0; i < 2 * f->n; i++) free(f->buf[i]);
  f->n = 0;
}

/* GPT-2: 2 layers of c_attn (32 -> 96) and mlp.c_proj (128 -> 32), given
 * layer 1 first. r 4, alpha 8, dropout 0.05. */
static void gpt2_fixture(fixture *f, st_peft_config *c) {
  memset(f, 0, sizeof *f);
  *c = (st_peft_config){.arch = ST_ARCH_GPT2, .r = 4, .alpha = 8, .dropout = 0.05f,
                        .dtype = ST_FP32, .base_model = "runs/base/gpt2"};
  add(f, ST_ARCH_GPT2, 4, 1, "mlp.c_proj", 128, 32);
  add(f, ST_ARCH_GPT2, 4, 1, "attn.c_attn", 32, 96);
  add(f, ST_ARCH_GPT2, 4, 0, "attn.c_attn", 32, 96);
  add(f, ST_ARCH_GPT2, 4, 0, "mlp.c_proj", 128, 32);
}

/* Llama with GQA: 3 layers of q (64 -> 64), v (64 -> 32) and down (96 ->
 * 64), in reverse order. r 8, alpha 16, dropout 0. */
static void llama_fixture(fixture *f, st_peft_config *c, st_dtype dt) {
  memset(f, 0, sizeof *f);
  *c = (st_peft_config){.arch = ST_ARCH_LLAMA, .r = 8, .alpha = 16, .dropout = 0,
                        .dtype = dt, .base_model = NULL};
  for (int l = 2; l >= 0; l--) {
    add(f, ST_ARCH_LLAMA, 8, l, "mlp.down_proj", 96, 64);
    add(f, ST_ARCH_LLAMA, 8, l, "self_attn.v_proj", 64, 32);
    add(f, ST_ARCH_LLAMA, 8, l, "self_attn.q_proj", 64, 64);
  }
}

static char g_root[256];

static const char *tmp_path(const char *name) {
  static char p[4][512];
  static int k;
  k = (k + 1) % 4;
  snprintf(p[k], sizeof p[k], "%s/%s", g_root, name);
  return p[k];
}

/* Entries of g_root whose name starts with prefix. */
static int count_entries(const char *prefix) {
  DIR *d = opendir(g_root);
  assert_non_null(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  closedir(d);
  return n;
}

/* The adapter of s with this layer and module, or fail. */
static const st_peft_adapter *find(const st_peft_set *s, int layer, const char *module) {
  for (int i = 0; i < s->n; i++)
    if (s->ad[i].layer == layer && strcmp(s->ad[i].module, module) == 0) return &s->ad[i];
  fail_msg("layer %d %s missing after read", layer, module);
  return NULL;
}

/* Every adapter of f in s, values equal to f's after a round trip through dt. */
static void assert_values(const fixture *f, const st_peft_set *s, int r, st_dtype dt) {
  assert_int_equal(s->n, f->n);
  int changed = 0;
  for (int i = 0; i < f->n; i++) {
    const st_peft_adapter *w = &f->ad[i], *g = find(s, w->layer, w->module);
    assert_int_equal(g->in, w->in);
    assert_int_equal(g->out, w->out);
    for (int k = 0; k < 2; k++) {
      const size_t n = k ? (size_t)w->out * r : (size_t)r * w->in;
      const float *src = k ? w->B : w->A, *got = k ? g->B : g->A;
      float *want = malloc(n * sizeof *want);
      uint16_t *h = malloc(n * 2);
      if (dt == ST_FP32) {
        memcpy(want, src, n * sizeof *want);
      } else {
        st_dtype_from_f32(dt, h, src, n);
        st_dtype_to_f32(dt, want, h, n);
      }
      if (memcmp(got, want, n * sizeof *got) != 0)
        fail_msg("layer %d %s lora_%c differs from the %s round trip", w->layer, w->module,
                 k ? 'B' : 'A', st_dtype_name(dt));
      changed += memcmp(src, want, n * sizeof *want) != 0;
      free(want);
      free(h);
    }
  }
  if (dt != ST_FP32) assert_true(changed > 0); /* the rounding was real */
}

static void assert_sorted(const st_peft_set *s) {
  for (int i = 1; i < s->n; i++) {
    const st_peft_adapter *a = &s->ad[i - 1], *b = &s->ad[i];
    assert_true(a->layer < b->layer ||
                (a->layer == b->layer &&
                 module_index(s->cfg.arch, a->module) < module_index(s->cfg.arch, b->module)));
  }
}

static void test_gpt2_round_trip(void **st) {
  (void)st;
  fixture f;
  st_peft_config c;
  gpt2_fixture(&f, &c);
  const char *out = tmp_path("gpt2");
  assert_int_equal(st_peft_export(out, &c, f.ad, f.n), 0);
  st_peft_set s;
  assert_int_equal(st_peft_read(out, &s), 0);
  assert_int_equal(s.cfg.arch, ST_ARCH_GPT2);
  assert_int_equal(s.cfg.r, 4);
  assert_true(s.cfg.alpha == 8.0f);
  assert_true(s.cfg.dropout == 0.05f);
  assert_int_equal(s.cfg.dtype, ST_FP32);
  assert_int_equal(s.fan_in_fan_out, 1);
  assert_string_equal(s.cfg.base_model, "runs/base/gpt2");
  /* c_proj alone would also adapt attn.c_proj, which has no adapter */
  assert_int_equal(s.n_targets, 2);
  assert_string_equal(s.targets[0], "c_attn");
  assert_string_equal(s.targets[1], "mlp.c_proj");
  assert_values(&f, &s, 4, ST_FP32);
  assert_sorted(&s);
  /* the names PEFT's save_pretrained writes: no adapter name in them */
  st_sf_set set;
  memset(&set, 0, sizeof set);
  char p[600];
  snprintf(p, sizeof p, "%s/adapter_model.safetensors", out);
  assert_int_equal(st_sf_open_file(p, &set), 0);
  assert_int_equal(set.n, 8);
  const st_sf_tensor *t = st_sf_find(&set, "base_model.model.transformer.h.1.attn.c_attn.lora_B.weight");
  assert_non_null(t);
  assert_int_equal(t->shape[0], 96);
  assert_int_equal(t->shape[1], 4);
  t = st_sf_find(&set, "base_model.model.transformer.h.0.mlp.c_proj.lora_A.weight");
  assert_non_null(t);
  assert_int_equal(t->shape[0], 4);
  assert_int_equal(t->shape[1], 128);
  st_sf_close(&set);
  st_peft_free(&s);
  fixture_free(&f);
  assert_int_equal(count_entries("gpt2.tmp."), 0);
}

static void test_llama_round_trip(void **st) {
  (void)st;
  const st_dtype dts[3] = {ST_FP32, ST_BF16, ST_FP16};
  for (int d = 0; d < 3; d++) {
    fixture f;
    st_peft_config c;
    llama_fixture(&f, &c, dts[d]);
    char name[64];
    snprintf(name, sizeof name, "llama_%s", st_dtype_name(dts[d]));
    const char *out = tmp_path(name);
    assert_int_equal(st_peft_export(out, &c, f.ad, f.n), 0);
    st_peft_set s;
    assert_int_equal(st_peft_read(out, &s), 0);
    assert_int_equal(s.cfg.arch, ST_ARCH_LLAMA);
    assert_int_equal(s.cfg.r, 8);
    assert_true(s.cfg.alpha == 16.0f);
    assert_true(s.cfg.dropout == 0.0f);
    assert_int_equal(s.cfg.dtype, dts[d]);
    assert_int_equal(s.fan_in_fan_out, 0);
    assert_null(s.cfg.base_model);
    assert_int_equal(s.n_targets, 3);
    assert_string_equal(s.targets[0], "down_proj");
    assert_string_equal(s.targets[1], "q_proj");
    assert_string_equal(s.targets[2], "v_proj");
    assert_values(&f, &s, 8, dts[d]);
    assert_sorted(&s);
    assert_int_equal(s.ad[0].layer, 0);
    assert_string_equal(s.ad[0].module, "self_attn.q_proj");
    st_peft_free(&s);
    fixture_free(&f);
  }
}

static void test_target_names(void **st) {
  (void)st;
  assert_string_equal(st_peft_module_of(ST_ARCH_GPT2, "qkv"), "attn.c_attn");
  assert_string_equal(st_peft_module_of(ST_ARCH_GPT2, "o"), "attn.c_proj");
  assert_string_equal(st_peft_module_of(ST_ARCH_GPT2, "up"), "mlp.c_fc");
  assert_string_equal(st_peft_module_of(ST_ARCH_GPT2, "down"), "mlp.c_proj");
  assert_null(st_peft_module_of(ST_ARCH_GPT2, "q"));
  assert_string_equal(st_peft_module_of(ST_ARCH_LLAMA, "q"), "self_attn.q_proj");
  assert_string_equal(st_peft_module_of(ST_ARCH_QWEN2, "k"), "self_attn.k_proj");
  assert_string_equal(st_peft_module_of(ST_ARCH_LLAMA, "gate"), "mlp.gate_proj");
  assert_string_equal(st_peft_module_of(ST_ARCH_QWEN2, "down"), "mlp.down_proj");
  assert_null(st_peft_module_of(ST_ARCH_LLAMA, "qkv"));
  /* both c_proj modules adapted: the leaf name covers them */
  fixture f;
  memset(&f, 0, sizeof f);
  st_peft_config c = {.arch = ST_ARCH_GPT2, .r = 2, .alpha = 4, .dtype = ST_FP32};
  add(&f, ST_ARCH_GPT2, 2, 0, "attn.c_proj", 8, 8);
  add(&f, ST_ARCH_GPT2, 2, 0, "mlp.c_proj", 32, 8);
  add(&f, ST_ARCH_GPT2, 2, 0, "mlp.c_fc", 8, 32);
  const char *out = tmp_path("gpt2_cproj");
  assert_int_equal(st_peft_export(out, &c, f.ad, f.n), 0);
  st_peft_set s;
  assert_int_equal(st_peft_read(out, &s), 0);
  assert_int_equal(s.n_targets, 2);
  assert_string_equal(s.targets[0], "c_fc");
  assert_string_equal(s.targets[1], "c_proj");
  st_peft_free(&s);
  fixture_free(&f);
}

static void expect_export_error(const char *out, const st_peft_config *c,
                                const st_peft_adapter *ad, int n, const char *needle) {
  st_error_code(ST_EXIT_OK);
  assert_int_equal(st_peft_export(out, c, ad, n), -1);
  assert_int_equal(st_error_exit_code(), ST_EXIT_CHECKPOINT);
  if (!strstr(st_error_msg(), needle))
    fail_msg("message '%s' does not name '%s'", st_error_msg(), needle);
}

static void test_never_overwrites(void **st) {
  (void)st;
  fixture f;
  st_peft_config c;
  gpt2_fixture(&f, &c);
  const char *dir = tmp_path("exists_dir");
  assert_int_equal(mkdir(dir, 0755), 0);
  expect_export_error(dir, &c, f.ad, f.n, "already exists");
  char p[600];
  snprintf(p, sizeof p, "%s/adapter_config.json", dir);
  assert_false(st_path_exists(p));
  const char *file = tmp_path("exists_file");
  FILE *fp = fopen(file, "w");
  fputs("keep", fp);
  fclose(fp);
  expect_export_error(file, &c, f.ad, f.n, "already exists");
  char buf[16];
  assert_int_equal(st_read_small_file(file, buf, sizeof buf), 0);
  assert_string_equal(buf, "keep");
  fixture_free(&f);
}

/* An out_dir whose parent folder is missing: exit 1 (an unwritable --out),
 * naming out_dir as given, not the temporary name written first. */
static void test_missing_parent(void **st) {
  (void)st;
  fixture f;
  st_peft_config c;
  gpt2_fixture(&f, &c);
  char out[600];
  snprintf(out, sizeof out, "%s/peft", tmp_path("no_such_parent"));
  st_error_code(ST_EXIT_OK);
  assert_int_equal(st_peft_export(out, &c, f.ad, f.n), -1);
  assert_int_equal(st_error_exit_code(), ST_EXIT_ERROR);
  if (!strstr(st_error_msg(), out) || strstr(st_error_msg(), ".tmp.") ||
      !strstr(st_error_msg(), "parent folder"))
    fail_msg("message '%s' should name --out %s and its parent folder, not a temporary name",
             st_error_msg(), out);
  assert_false(st_path_exists(out));
  fixture_free(&f);
}

static void test_bad_adapters_leave_nothing(void **st) {
  (void)st;
  fixture f;
  st_peft_config c;
  gpt2_fixture(&f, &c);
  const char *out = tmp_path("bad");
  float *B = (float *)f.ad[1].B;
  B[5] = NAN;
  expect_export_error(out, &c, f.ad, f.n, "NaN");
  B[5] = 0.25f;
  snprintf(f.ad[2].module, sizeof f.ad[2].module, "self_attn.q_proj");
  expect_export_error(out, &c, f.ad, f.n, "self_attn.q_proj");
  snprintf(f.ad[2].module, sizeof f.ad[2].module, "attn.c_attn");
  f.ad[2].layer = 1; /* now twice layer 1's c_attn */
  expect_export_error(out, &c, f.ad, f.n, "two adapters");
  f.ad[2].layer = 0;
  c.r = 0;
  expect_export_error(out, &c, f.ad, f.n, "rank");
  c.r = 4;
  c.dropout = 1.0f;
  expect_export_error(out, &c, f.ad, f.n, "lora_dropout");
  c.dropout = 0;
  /* A write that fails half-way (the file size limit lets adapter_config.json
   * through, not the 10 kB of tensors): the temporary directory goes too. */
  struct rlimit old, small = {.rlim_cur = 2048, .rlim_max = 0};
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
  small.rlim_max = old.rlim_max;
  void (*was)(int) = signal(SIGXFSZ, SIG_IGN);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
  st_error_code(ST_EXIT_OK);
  const int rc = st_peft_export(out, &c, f.ad, f.n);
  assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, was);
  assert_int_equal(rc, -1);
  assert_int_equal(st_error_exit_code(), ST_EXIT_CHECKPOINT);
  assert_non_null(strstr(st_error_msg(), "adapter_model.safetensors"));
  assert_false(st_path_exists(out));
  assert_int_equal(count_entries("bad"), 0);
  /* and the same set, repaired, writes */
  assert_int_equal(st_peft_export(out, &c, f.ad, f.n), 0);
  assert_int_equal(count_entries("bad"), 1);
  fixture_free(&f);
}

/* A valid Llama adapter directory at name with its config edited: the
 * config's text with `from` replaced by `to` (NULL: as written). */
static const char *edited(const char *name, const char *from, const char *to) {
  fixture f;
  st_peft_config c;
  llama_fixture(&f, &c, ST_FP32);
  const char *out = tmp_path(name);
  assert_int_equal(st_peft_export(out, &c, f.ad, f.n), 0);
  fixture_free(&f);
  if (!from) return out;
  char p[600], text[4096];
  snprintf(p, sizeof p, "%s/adapter_config.json", out);
  FILE *fp = fopen(p, "r");
  size_t n = fread(text, 1, sizeof text - 1, fp);
  fclose(fp);
  text[n] = 0;
  char *at = strstr(text, from);
  if (!at) fail_msg("'%s' not in %s", from, p);
  char out_text[4200];
  snprintf(out_text, sizeof out_text, "%.*s%s%s", (int)(at - text), text, to,
           at + strlen(from));
  fp = fopen(p, "w");
  fputs(out_text, fp);
  fclose(fp);
  return out;
}

/* Replace the adapter file of dir with these tensors (fp32, values 0). */
static void rewrite_tensors(const char *dir, const char **names, const int64_t (*shapes)[2],
                            int n) {
  st_sf_out t[8];
  static float zeros[4096];
  for (int i = 0; i < n; i++)
    t[i] = (st_sf_out){.name = names[i], .dtype = ST_FP32, .ndim = 2,
                       .shape = {shapes[i][0], shapes[i][1]}, .data = zeros};
  char p[600];
  snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
  assert_int_equal(st_sf_write(p, t, n), 0);
}

static void expect_read_error(const char *dir, const char *needle) {
  st_peft_set s;
  st_error_code(ST_EXIT_OK);
  assert_int_equal(st_peft_read(dir, &s), -1);
  assert_int_equal(st_error_exit_code(), ST_EXIT_CHECKPOINT);
  assert_null(s.ad);
  if (!strstr(st_error_msg(), needle))
    fail_msg("message '%s' does not name '%s'", st_error_msg(), needle);
}

static void test_reader_refuses(void **st) {
  (void)st;
  expect_read_error(tmp_path("nothing_here"), "adapter_config.json");
  expect_read_error(edited("ia3", "\"LORA\"", "\"IA3\""), "peft_type");
  expect_read_error(edited("rslora", "\"use_rslora\":\tfalse", "\"use_rslora\": true"),
                    "use_rslora");
  expect_read_error(edited("dora", "\"use_dora\":\tfalse", "\"use_dora\": true"), "DoRA");
  expect_read_error(edited("bias", "\"bias\":\t\"none\"", "\"bias\": \"all\""), "bias");
  expect_read_error(edited("rank_pattern", "\"rank_pattern\":\t{\n\t}",
                           "\"rank_pattern\": {\"q_proj\": 4}"), "rank_pattern");
  expect_read_error(edited("r_float", "\"r\":\t8", "\"r\": 8.5"), "r must be");
  expect_read_error(edited("not_json", "{", "["), "JSON object");

  const char *P = "base_model.model.model.layers.0.self_attn.q_proj.lora_";
  char a[160], b[160];
  snprintf(a, sizeof a, "%sA.weight", P);
  snprintf(b, sizeof b, "%sB.weight", P);
  const int64_t ok[2][2] = {{8, 64}, {64, 8}};
  const char *only_a[1] = {a};
  const char *dir = edited("only_a", NULL, NULL);
  rewrite_tensors(dir, only_a, ok, 1);
  expect_read_error(dir, "no lora_B");
  const char *both[2] = {a, b};
  const int64_t wrong[2][2] = {{8, 64}, {64, 4}};
  dir = edited("shape", NULL, NULL);
  rewrite_tensors(dir, both, wrong, 2);
  expect_read_error(dir, "[out, r]");
  const char *extra[3] = {a, b, "base_model.model.lm_head.weight"};
  const int64_t ok3[3][2] = {{8, 64}, {64, 8}, {64, 8}};
  dir = edited("extra", NULL, NULL);
  rewrite_tensors(dir, extra, ok3, 3);
  expect_read_error(dir, "lm_head");
  const char *named[2] = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", b};
  dir = edited("adapter_name", NULL, NULL);
  rewrite_tensors(dir, named, ok, 2);
  expect_read_error(dir, "lora_A.default");
  const char *mixed[4] = {a, b, "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight",
                          "base_model.model.transformer.h.0.attn.c_attn.lora_B.weight"};
  const int64_t ok4[4][2] = {{8, 64}, {64, 8}, {8, 64}, {192, 8}};
  dir = edited("mixed", NULL, NULL);
  rewrite_tensors(dir, mixed, ok4, 4);
  expect_read_error(dir, "another model family");
  /* the pair alone reads: the refusals above were for what they name */
  dir = edited("pair", NULL, NULL);
  rewrite_tensors(dir, both, ok, 2);
  st_peft_set s;
  assert_int_equal(st_peft_read(dir, &s), 0);
  assert_int_equal(s.n, 1);
  assert_int_equal(s.ad[0].in, 64);
  assert_int_equal(s.ad[0].out, 64);
  st_peft_free(&s);
}

/* --write DIR: the fixtures of tests/e2e/test_peft_files.py. */
static int write_fixtures(const char *dir) {
  if (st_mkdir_p(dir)) return 1;
  struct {
    const char *name;
    int gpt2;
    st_dtype dt;
  } w[4] = {{"gpt2_fp32", 1, ST_FP32}, {"llama_fp32", 0, ST_FP32}, {"llama_bf16", 0, ST_BF16},
            {"llama_fp16", 0, ST_FP16}};
  for (int i = 0; i < 4; i++) {
    fixture f;
    st_peft_config c;
    if (w[i].gpt2) gpt2_fixture(&f, &c);
    else llama_fixture(&f, &c, w[i].dt);
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", dir, w[i].name);
    int rc = st_peft_export(p, &c, f.ad, f.n);
    fixture_free(&f);
    if (rc) {
      fprintf(stderr, "test_peft_io: %s\n", st_error_msg());
      return 1;
    }
    printf("%s\n", p);
  }
  return 0;
}

static int setup(void **st) {
  (void)st;
  snprintf(g_root, sizeof g_root, "/tmp/test_peft_io.XXXXXX");
  return mkdtemp(g_root) ? 0 : -1;
}

static int teardown(void **st) {
  (void)st;
  return st_rm_rf(g_root) ? -1 : 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--write") == 0) return write_fixtures(argv[2]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpt2_round_trip),   cmocka_unit_test(test_llama_round_trip),
      cmocka_unit_test(test_target_names),      cmocka_unit_test(test_never_overwrites),
      cmocka_unit_test(test_missing_parent),
      cmocka_unit_test(test_bad_adapters_leave_nothing),
      cmocka_unit_test(test_reader_refuses),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
