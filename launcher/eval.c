/* eval.c - `shardtrain eval` (see eval.h).
 *
 * Windows: each file (or split) of N tokens gives W = (N - 1) / T windows of
 * seq-len T; window i has inputs tokens[i*T .. i*T+T) and targets
 * tokens[i*T+1 .. i*T+T+1) (the windows train's validation uses, and those
 * of the HF oracle in tests/data/hf/oracle). Windows never cross from one
 * file into the next. The loss is the mean over every target token of every
 * window of -log p(target), in nats; perplexity is exp(loss). B windows go
 * through one forward (st_model_forward, the training forward without its
 * backward); the last batch of a file may be smaller, and only its real
 * windows are computed and counted. --max-windows N stops after N windows
 * in all, in file order. */
#define _POSIX_C_SOURCE 200809L
#include "launcher/eval.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "io/tokens.h"
#include "launcher/cli.h"
#include "launcher/infer_setup.h"
#include "io/tokens.h"
#include "rank/model/model.h"
#include "util/error.h"

#define EVAL_MAX_FILES 256

static void usage(void) {
  printf("usage: shardtrain eval --init RUN_DIR|STEP_DIR|HF_DIR|LLMC_FILE --data FILE\n"
         "                       [--data FILE2 ...] [flags]\n"
         "  --data FILE        an HDF5 token file (its --split) or an llm.c .bin shard; repeat\n"
         "                     for several\n"
         "  --split S          val (default) or train, for HDF5 token files\n"
         "  --seq-len T        window length (min(block size, 1024)); at most the block size\n"
         "  --micro-batch B    windows per forward (4)\n"
         "  --max-windows N    stop after N windows in all (0 = every window)\n"
         "  --device D         cpu, cuda or auto (auto)\n"
         "  --precision P      fp32, bf16, fp16 or auto (bf16 on CUDA, fp32 on the CPU)\n"
         "  --json             one JSON line: loss, perplexity, tokens, windows, ...\n"
         "Window i of a file of N tokens: inputs tokens[i*T : i*T+T], targets shifted by one,\n"
         "i = 0 .. (N-1)/T - 1. Loss in nats per token, perplexity exp(loss).\n");
}

typedef struct {
  const char *init, *device, *precision, *split;
  const char *data[EVAL_MAX_FILES];
  int ndata, json;
  long seq_len, micro_batch, max_windows;
} eval_flags;

static int parse(int argc, char **argv, eval_flags *f) {
  memset(f, 0, sizeof *f);
  f->device = "auto";
  f->precision = "auto";
  f->split = "val";
  f->micro_batch = 4;
  const int U = ST_EXIT_USAGE;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--json")) { f->json = 1; continue; }
    if (i + 1 >= argc) return st_error_setc(U, "%s needs a value (see shardtrain eval --help)", a);
    const char *v = argv[++i];
    if (!strcmp(a, "--init")) f->init = v;
    else if (!strcmp(a, "--device")) f->device = v;
    else if (!strcmp(a, "--precision")) f->precision = v;
    else if (!strcmp(a, "--split")) f->split = v;
    else if (!strcmp(a, "--data")) {
      if (f->ndata == EVAL_MAX_FILES)
        return st_error_setc(U, "--data given more than %d times", EVAL_MAX_FILES);
      f->data[f->ndata++] = v;
    } else if (!strcmp(a, "--seq-len")) {
      if (st_flag_long(a, v, 1, 1L << 20, &f->seq_len)) return -1;
    } else if (!strcmp(a, "--micro-batch")) {
      if (st_flag_long(a, v, 1, 1L << 16, &f->micro_batch)) return -1;
    } else if (!strcmp(a, "--max-windows")) {
      if (st_flag_long(a, v, 0, 1L << 40, &f->max_windows)) return -1;
    } else {
      return st_error_setc(U, "unknown flag '%s' for eval (see shardtrain eval --help)", a);
    }
  }
  if (!f->init) return st_error_setc(U, "eval needs --init RUN_DIR|STEP_DIR|HF_DIR|LLMC_FILE");
  if (!f->ndata) return st_error_setc(U, "eval needs --data FILE (an HDF5 token file or .bin)");
  if (strcmp(f->split, "val") && strcmp(f->split, "train"))
    return st_error_setc(U, "--split %s: give val or train", f->split);
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
  st_model m;
  int *inp, *tgt, *scratch; /* host [B*T], [B*T], [B*T+1] */
  int *d_inp, *d_tgt;       /* backend memory */
  char tok_name[32], tok_digest[72]; /* the model's tokenizer; "" when unknown */
} evaluator;

/* b consecutive windows of T+1 tokens starting at token pos: inputs and
 * next-token targets ([b,T]); scratch holds b*T+1 ints. 0 or -1. */
static int read_windows(st_token_source *src, int64_t pos, int b, int T, int vocab, int *inp,
                        int *tgt, int *scratch) {
  const int64_t n = (int64_t)b * T + 1;
  if (st_tokens_read(src, pos, n, scratch)) return -1;
  for (int64_t i = 0; i < n; i++)
    if (scratch[i] < 0 || scratch[i] >= vocab)
      return st_error_set("token %d at position %lld of %s is outside the model vocabulary "
                          "(%d); pass --vocab-size to match the tokenizer that wrote the file",
                          scratch[i], (long long)(pos + i), st_tokens_path(src), vocab);
  memcpy(inp, scratch, (size_t)b * T * sizeof(int));
  memcpy(tgt, scratch + 1, (size_t)b * T * sizeof(int));
  return 0;
}

/* Loss sum and token count over one file's windows, up to *left windows
 * (< 0: no limit). 0, or -1 with st_error (data class for the file). */
static int eval_file(evaluator *ev, const eval_flags *f, const char *path, int T, int B,
                     int vocab, int64_t *left, double *sum, int64_t *tokens, int64_t *windows) {
  int file_vocab = 0;
  st_error_code(ST_EXIT_DATA);
  st_token_source *src = st_tokens_open(path, f->split, &file_vocab);
  if (!src) return st_error_prefix("--data");
  int rc = 0;
  st_tokens_tokenizer d;
  if (ev->tok_digest[0] && st_tokens_tokenizer_info(path, &d) == 0 && d.known &&
      strcmp(d.digest, ev->tok_digest) != 0)
    rc = st_error_setc(ST_EXIT_DATA, "--data %s was tokenized with %s (digest %.12s), but the "
                       "model's ids are %s's (digest %.12s): the loss would mean nothing; "
                       "tokenize the text with the model's tokenizer (shardtrain prep "
                       "--tokenizer ...)", path, d.name, d.digest, ev->tok_name, ev->tok_digest);
  if (!rc && file_vocab > vocab)
    rc = st_error_setc(ST_EXIT_DATA, "--data %s: its tokenizer's vocabulary is %d tokens, the "
                       "model's only %d; evaluate it with a model of that tokenizer",
                       path, file_vocab, vocab);
  const int64_t n = st_tokens_count(src), W = n > 0 ? (n - 1) / T : 0;
  if (!rc && W == 0)
    rc = st_error_setc(ST_EXIT_DATA, "--data %s: %lld tokens%s make no window of --seq-len %d "
                       "(a window needs T + 1 tokens); give a shorter --seq-len", path,
                       (long long)n, strstr(path, ".bin") ? "" : " in its split", T);
  for (int64_t w = 0; !rc && w < W && *left != 0; w += B) {
    int b = (int)(W - w < B ? W - w : B);
    if (*left > 0 && b > *left) b = (int)*left;
    if (read_windows(src, w * T, b, T, vocab, ev->inp, ev->tgt, ev->scratch)) {
      st_error_code(ST_EXIT_DATA);
      rc = -1;
      break;
    }
    ev->m.ops->to_device(ev->d_inp, ev->inp, (size_t)b * T * sizeof(int));
    ev->m.ops->to_device(ev->d_tgt, ev->tgt, (size_t)b * T * sizeof(int));
    *sum += st_model_forward(&ev->m, ev->d_inp, ev->d_tgt, b, T, 0.0f);
    *tokens += (int64_t)b * T;
    *windows += b;
    if (*left > 0) *left -= b;
  }
  st_tokens_close(src);
  return rc;
}

static void report(const eval_flags *f, const st_loaded_model *lm, int T, double loss,
                   int64_t tokens, int64_t windows, double secs) {
  if (!f->json) {
    printf("eval: %s on %d file%s: loss %.6f nats/token, perplexity %.4f, %lld tokens in %lld "
           "windows of %d (%s %s, %.2f s)\n", f->init, f->ndata, f->ndata == 1 ? "" : "s", loss,
           exp(loss), (long long)tokens, (long long)windows, T, lm->device, lm->precision, secs);
    return;
  }
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "loss", loss);
  cJSON_AddNumberToObject(o, "perplexity", exp(loss));
  cJSON_AddNumberToObject(o, "tokens", (double)tokens);
  cJSON_AddNumberToObject(o, "windows", (double)windows);
  cJSON_AddNumberToObject(o, "seq_len", T);
  cJSON_AddNumberToObject(o, "files", f->ndata);
  cJSON_AddStringToObject(o, "device", lm->device);
  cJSON_AddStringToObject(o, "precision", lm->precision);
  cJSON_AddNumberToObject(o, "seconds", secs);
  char *s = cJSON_PrintUnformatted(o);
  if (s) printf("%s\n", s);
  free(s);
  cJSON_Delete(o);
}

int st_cmd_eval(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage();
      return 0;
    }
  eval_flags f;
  if (parse(argc, argv, &f)) return st_cli_fail(ST_EXIT_USAGE);
  st_loaded_model lm;
  if (st_load_model(f.init, f.device, f.precision, &lm)) {
    int code = st_error_exit_code();
    st_loaded_model_free(&lm);
    return st_cli_fail(code);
  }
  const st_model_config *c = &lm.src.cfg;
  int T = (int)f.seq_len, rc = 0;
  if (T == 0) T = c->block_size < 1024 ? c->block_size : 1024;
  if (T > c->block_size)
    rc = st_error_setc(ST_EXIT_USAGE, "--seq-len %d: the model %s has %d positions (block "
                       "size); give at most %d", T, f.init, c->block_size, c->block_size);
  const int B = (int)f.micro_batch;
  evaluator ev;
  memset(&ev, 0, sizeof ev);
  st_loaded_model_tokenizer(&lm, ev.tok_name, ev.tok_digest);
  if (!rc && st_model_init(&ev.m, c, lm.ops, B, T, 1, ST_RECOMPUTE_NONE)) {
    st_error_code(ST_EXIT_OOM);
    rc = -1;
  }
  if (!rc && st_model_set_weights(&ev.m, lm.weights)) rc = -1;
  const size_t bt = (size_t)B * T;
  if (!rc) {
    ev.inp = malloc(bt * sizeof(int));
    ev.tgt = malloc(bt * sizeof(int));
    ev.scratch = malloc((bt + 1) * sizeof(int));
    ev.d_inp = lm.ops->alloc(bt * sizeof(int), "tokens");
    ev.d_tgt = lm.ops->alloc(bt * sizeof(int), "tokens");
    if (!ev.inp || !ev.tgt || !ev.scratch || !ev.d_inp || !ev.d_tgt)
      rc = st_error_setc(ST_EXIT_OOM, "out of memory for %zu tokens of eval input", bt);
  }
  double sum = 0.0, t0 = now_s();
  int64_t tokens = 0, windows = 0, left = f.max_windows > 0 ? f.max_windows : -1;
  for (int i = 0; !rc && i < f.ndata && left != 0; i++)
    rc = eval_file(&ev, &f, f.data[i], T, B, c->vocab_size, &left, &sum, &tokens, &windows);
  if (!rc) report(&f, &lm, T, tokens ? sum / (double)tokens : 0.0, tokens, windows, now_s() - t0);
  const int code = rc ? st_cli_fail(st_error_exit_code()) : 0;
  free(ev.inp);
  free(ev.tgt);
  free(ev.scratch);
  if (ev.m.ops) {
    ev.m.ops->free(ev.d_inp);
    ev.m.ops->free(ev.d_tgt);
    st_model_free(&ev.m);
  }
  st_loaded_model_free(&lm);
  return code;
}
