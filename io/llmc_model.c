/* llmc_model.c - llm.c model file reader and writer (see llmc_model.h). */
#include "io/llmc_model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"

/* The per-layer kinds in llm.c's order (ParameterTensors in train_gpt2.c),
 * which is also the order of a block in rank/model/params.c. */
static const char *const k_kinds[12] = {"ln_1.weight", "ln_1.bias", "attn.qkv.weight",
                                        "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
                                        "ln_2.weight", "ln_2.bias", "mlp.fc.weight",
                                        "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"};

int st_llmc_is_model(const char *path) {
  struct stat sb;
  if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
  FILE *f = fopen(path, "rb");
  int32_t magic = 0;
  int ok = f && fread(&magic, 4, 1, f) == 1 && magic == ST_LLMC_MAGIC;
  if (f) fclose(f);
  return ok;
}

static int read_hdr(const char *path, int32_t h[256], FILE **fp) {
  FILE *f = fopen(path, "rb");
  if (!f) return st_error_setc(ST_EXIT_CHECKPOINT, "cannot open %s: %s", path, strerror(errno));
  if (fread(h, 4, 256, f) != 256) {
    fclose(f);
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: shorter than the 1024-byte llm.c header", path);
  }
  if (h[0] != ST_LLMC_MAGIC) {
    fclose(f);
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: magic %d is not llm.c's model magic %d", path,
                         h[0], ST_LLMC_MAGIC);
  }
  if (h[1] != 3 && h[1] != 5) {
    fclose(f);
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: llm.c model version %d is not supported (3: "
                         "fp32, 5: bf16)", path, h[1]);
  }
  if (fp) *fp = f;
  else fclose(f);
  return 0;
}

/* The file's size against what its header's shape needs (llm.c's
 * train_gpt2.c layout: wte of padded_vocab_size rows, wpe, 12 per-layer
 * kinds, ln_f): a truncated or padded file, or a header that asks for more
 * than the file holds, is refused before anything is allocated for it.
 * fstat on the stream read, so the size checked is the file's being read
 * even if the path is replaced in between. */
static int check_size(FILE *f, const char *path, const int32_t h[256]) {
  const int64_t T = h[2], Vp = h[7], L = h[4], C = h[6];
  const int64_t per_layer = 12 * C * C + 13 * C; /* qkv 3C^2+3C, proj C^2+C, fc 4C^2+4C,
                                                    fcproj 4C^2+C, two LayerNorms 4C */
  const int64_t n = Vp * C + T * C + L * per_layer + 2 * C;
  const int64_t need = 1024 + n * (h[1] == 5 ? 2 : 4);
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0)
    return st_error_setc(ST_EXIT_CHECKPOINT, "cannot stat %s: %s", path, strerror(errno));
  if ((int64_t)sb.st_size != need)
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: %lld bytes, but its header's shape (layers "
                         "%d, width %d, positions %d, padded vocabulary %d, %s) needs %lld: the "
                         "file is truncated or not the model its header describes",
                         path, (long long)sb.st_size, h[4], h[6], h[2], h[7],
                         h[1] == 5 ? "bf16" : "fp32", (long long)need);
  return 0;
}

/* The shape of header h (of open file f) into cfg, validated and checked
 * against f's size. 0 or -1 with st_error. */
static int header_config(FILE *f, const char *path, const int32_t h[256], st_model_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->block_size = h[2];
  cfg->vocab_size = h[3];
  cfg->n_layer = h[4];
  cfg->n_head = h[5];
  cfg->n_embd = h[6];
  if (st_model_validate(cfg))
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: header: %s", path, st_error_msg());
  /* llm.c pads to a multiple of 128; more than 2^16 rows of padding is no
   * padding, and the bound keeps the size arithmetic below exact */
  if (h[7] < h[3] || h[7] - h[3] > (1 << 16))
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: padded_vocab_size %d is not vocab_size %d "
                         "padded (at most 65536 more)", path, h[7], h[3]);
  return check_size(f, path, h);
}

int st_llmc_read_header(const char *path, st_model_config *cfg, st_dtype *dt) {
  int32_t h[256];
  memset(h, 0, sizeof h);
  FILE *f = NULL;
  if (read_hdr(path, h, &f)) return -1;
  const int rc = header_config(f, path, h, cfg);
  fclose(f);
  if (rc == 0) *dt = h[1] == 5 ? ST_BF16 : ST_FP32;
  return rc;
}

/* Read n elements of dt into dst (fp32). */
static int read_elems(FILE *f, const char *path, const char *what, st_dtype dt, float *dst,
                      int64_t n, void *scratch) {
  void *raw = dt == ST_FP32 ? (void *)dst : scratch;
  if (fread(raw, st_dtype_size(dt), (size_t)n, f) != (size_t)n)
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: truncated in %s (the header's shape needs "
                         "more bytes)", path, what);
  if (raw != dst) st_dtype_to_f32(dt, dst, raw, (size_t)n);
  return 0;
}

int st_llmc_read(const char *path, const st_model_config *cfg, const st_param_table *tab,
                 float *params) {
  int32_t h[256];
  memset(h, 0, sizeof h);
  FILE *f = NULL;
  if (read_hdr(path, h, &f)) return -1;
  /* the header as st_llmc_read_header checked it, and the same shape */
  st_model_config now;
  if (header_config(f, path, h, &now)) {
    fclose(f);
    return -1;
  }
  if (now.block_size != cfg->block_size || now.vocab_size != cfg->vocab_size ||
      now.n_layer != cfg->n_layer || now.n_head != cfg->n_head || now.n_embd != cfg->n_embd) {
    fclose(f);
    return st_error_setc(ST_EXIT_CHECKPOINT, "%s: header shape differs from the one it was "
                         "opened with (the file changed?)", path);
  }
  const st_dtype dt = h[1] == 5 ? ST_BF16 : ST_FP32;
  const int64_t C = cfg->n_embd, Vp_file = h[7];
  int rc = -1;
  int64_t maxn = Vp_file * C;
  for (int i = 0; i < tab->n; i++)
    if (tab->t[i].numel > maxn) maxn = tab->t[i].numel;
  void *scratch = malloc((size_t)maxn * 4);
  float *wte = malloc((size_t)(Vp_file * C) * sizeof *wte);
  if (!scratch || !wte) {
    st_error_set("out of host memory reading %s", path);
    goto out;
  }
  memset(params, 0, (size_t)tab->total * sizeof *params);
  if (read_elems(f, path, "wte", dt, wte, Vp_file * C, scratch)) goto out;
  const st_tensor *tw = &tab->t[st_param_find(tab, "wte.weight")];
  memcpy(params + tw->offset, wte, (size_t)((int64_t)cfg->vocab_size * C) * sizeof *wte);
  const st_tensor *tp = &tab->t[st_param_find(tab, "wpe.weight")];
  if (read_elems(f, path, "wpe", dt, params + tp->offset, tp->numel, scratch)) goto out;
  for (int k = 0; k < 12; k++)
    for (int l = 0; l < cfg->n_layer; l++) {
      char nm[ST_MAX_NAME];
      snprintf(nm, sizeof nm, "h.%d.%s", l, k_kinds[k]);
      const st_tensor *t = &tab->t[st_param_find(tab, nm)];
      if (read_elems(f, path, nm, dt, params + t->offset, t->numel, scratch)) goto out;
    }
  for (int k = 0; k < 2; k++) {
    const st_tensor *t = &tab->t[st_param_find(tab, k ? "ln_f.bias" : "ln_f.weight")];
    if (read_elems(f, path, t->name, dt, params + t->offset, t->numel, scratch)) goto out;
  }
  char extra;
  if (fread(&extra, 1, 1, f) == 1) {
    st_error_setc(ST_EXIT_CHECKPOINT, "%s: bytes after the last parameter (lnfb): not the "
                  "shape its header gives", path);
    goto out;
  }
  rc = 0;
out:
  free(scratch);
  free(wte);
  fclose(f);
  return rc;
}

static int write_elems(FILE *f, st_dtype dt, const float *src, int64_t n, void *scratch) {
  if (dt == ST_FP32) return fwrite(src, 4, (size_t)n, f) == (size_t)n ? 0 : -1;
  st_dtype_from_f32(dt, scratch, src, (size_t)n);
  return fwrite(scratch, 2, (size_t)n, f) == (size_t)n ? 0 : -1;
}

int st_llmc_write(const char *path, const st_model_config *cfg, const st_param_table *tab,
                  const float *params, st_dtype dt) {
  if (dt != ST_FP32 && dt != ST_BF16)
    return st_error_setc(ST_EXIT_USAGE, "llm.c model files hold fp32 or bf16, not %s",
                         st_dtype_name(dt));
  int32_t h[256];
  memset(h, 0, sizeof h);
  h[0] = ST_LLMC_MAGIC;
  h[1] = dt == ST_BF16 ? 5 : 3;
  h[2] = cfg->block_size;
  h[3] = cfg->vocab_size;
  h[4] = cfg->n_layer;
  h[5] = cfg->n_head;
  h[6] = cfg->n_embd;
  h[7] = cfg->padded_vocab_size;
  char tmp[1300];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  if (!f) return st_error_setc(ST_EXIT_CHECKPOINT, "cannot write %s: %s", tmp, strerror(errno));
  int64_t maxn = 0;
  for (int i = 0; i < tab->n; i++)
    if (tab->t[i].numel > maxn) maxn = tab->t[i].numel;
  void *scratch = malloc((size_t)maxn * 4);
  int ok = scratch && fwrite(h, 4, 256, f) == 256;
  const st_tensor *tw = &tab->t[st_param_find(tab, "wte.weight")];
  if (ok) {
    /* Padded rows as zero, whatever the run left in them. */
    float *wte = scratch ? malloc((size_t)tw->numel * sizeof *wte) : NULL;
    ok = wte != NULL;
    if (ok) {
      const size_t keep = (size_t)cfg->vocab_size * (size_t)cfg->n_embd;
      memcpy(wte, params + tw->offset, keep * sizeof *wte);
      memset(wte + keep, 0, ((size_t)tw->numel - keep) * sizeof *wte);
      ok = write_elems(f, dt, wte, tw->numel, scratch) == 0;
    }
    free(wte);
  }
  const st_tensor *tp = &tab->t[st_param_find(tab, "wpe.weight")];
  ok = ok && write_elems(f, dt, params + tp->offset, tp->numel, scratch) == 0;
  for (int k = 0; ok && k < 12; k++)
    for (int l = 0; ok && l < cfg->n_layer; l++) {
      char nm[ST_MAX_NAME];
      snprintf(nm, sizeof nm, "h.%d.%s", l, k_kinds[k]);
      const st_tensor *t = &tab->t[st_param_find(tab, nm)];
      ok = write_elems(f, dt, params + t->offset, t->numel, scratch) == 0;
    }
  for (int k = 0; ok && k < 2; k++) {
    const st_tensor *t = &tab->t[st_param_find(tab, k ? "ln_f.bias" : "ln_f.weight")];
    ok = write_elems(f, dt, params + t->offset, t->numel, scratch) == 0;
  }
  free(scratch);
  ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && ok;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return st_error_setc(ST_EXIT_CHECKPOINT, "cannot write %s: %s", path, strerror(e));
  }
  return 0;
}
