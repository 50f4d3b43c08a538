/* sample.c - `shardtrain sample` (see sample.h).
 *
 * The prompt runs through the model in one step (the prefill), which gives
 * the first new token; every later token is one step of one position over
 * the KV cache. The continuation (not the prompt) is streamed to stdout as
 * it is chosen, then a newline; the timing summary goes to stderr (one JSON
 * line with --json), so stdout holds only the sample. An id the tokenizer
 * has no text for prints as <|id:N|> (st_tokenizer_token_text). */
#define _POSIX_C_SOURCE 200809L
#include "launcher/sample.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "launcher/cli.h"
#include "launcher/infer_setup.h"
#include "rank/model/infer.h"
#include "util/rng.h"
#include "rank/model/sampler.h"
#include "util/error.h"
#include "io/tokenizer.h"

static void usage(void) {
  printf("usage: shardtrain sample --init RUN_DIR|STEP_DIR|HF_DIR|LLMC_FILE\n"
         "                         --prompt TEXT | --prompt-ids 1,2,3 [flags]\n"
         "  --max-new N        new tokens (64); at most the block size minus the prompt\n"
         "  --temperature T    1; 0 = greedy (argmax)\n"
         "  --top-k K          only the K most likely tokens (0 = all)\n"
         "  --top-p P          nucleus: the fewest tokens with probability >= P (1 = all)\n"
         "  --seed S           1337; the same seed gives the same sample\n"
         "  --device D         cpu, cuda or auto (auto)\n"
         "  --precision P      fp32, bf16, fp16 or auto (bf16 on CUDA, fp32 on the CPU)\n"
         "  --tokenizer PATH   tokenizer dir (vocab.json + merges.txt or tokenizer.json) or\n"
         "                     \"bytes\", when the source has none of its own\n"
         "  --print-ids        print the generated ids (comma-separated), not text\n"
         "  --ignore-eot       do not stop at the end-of-text token\n"
         "  --json             the summary on stderr as one JSON line\n"
         "Stops at --max-new, the model's block size, or the end-of-text token. Prints the\n"
         "continuation only (the prompt is not repeated), then a newline; tokens/s on stderr.\n"
         "An id the tokenizer has no text for (past its vocabulary, in a model with more ids,\n"
         "such as byte tokens under a 300-id model) prints as <|id:N|>; --print-ids prints N.\n");
}

typedef struct {
  const char *init, *prompt, *prompt_ids, *tokenizer, *device, *precision;
  long max_new;
  int max_new_given, print_ids, ignore_eot, json;
  long seed;
  st_sampler_opts so;
} sample_flags;

static int parse(int argc, char **argv, sample_flags *f) {
  memset(f, 0, sizeof *f);
  f->device = "auto";
  f->precision = "auto";
  f->max_new = 64;
  f->seed = 1337;
  f->so.temperature = 1.0f;
  f->so.top_p = 1.0f;
  const int U = ST_EXIT_USAGE;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--print-ids")) { f->print_ids = 1; continue; }
    if (!strcmp(a, "--ignore-eot")) { f->ignore_eot = 1; continue; }
    if (!strcmp(a, "--json")) { f->json = 1; continue; }
    if (i + 1 >= argc)
      return st_error_setc(U, "%s needs a value (see shardtrain sample --help)", a);
    const char *v = argv[++i];
    long x;
    double d;
    if (!strcmp(a, "--init")) f->init = v;
    else if (!strcmp(a, "--prompt")) f->prompt = v;
    else if (!strcmp(a, "--prompt-ids")) f->prompt_ids = v;
    else if (!strcmp(a, "--tokenizer")) f->tokenizer = v;
    else if (!strcmp(a, "--device")) f->device = v;
    else if (!strcmp(a, "--precision")) f->precision = v;
    else if (!strcmp(a, "--max-new")) {
      if (st_flag_long(a, v, 1, 1L << 30, &f->max_new)) return -1;
      f->max_new_given = 1;
    } else if (!strcmp(a, "--seed")) {
      if (st_flag_long(a, v, 0, 0x7fffffffL, &f->seed)) return -1;
    } else if (!strcmp(a, "--top-k")) {
      if (st_flag_long(a, v, -(1L << 30), 1L << 30, &x)) return -1;
      f->so.top_k = (int)x;
    } else if (!strcmp(a, "--temperature")) {
      if (st_flag_double(a, v, &d)) return -1;
      f->so.temperature = (float)d;
    } else if (!strcmp(a, "--top-p")) {
      if (st_flag_double(a, v, &d)) return -1;
      f->so.top_p = (float)d;
    } else {
      return st_error_setc(U, "unknown flag '%s' for sample (see shardtrain sample --help)", a);
    }
  }
  if (!f->init) return st_error_setc(U, "sample needs --init RUN_DIR|STEP_DIR|HF_DIR|LLMC_FILE");
  if (!f->prompt == !f->prompt_ids)
    return st_error_setc(U, "sample needs exactly one of --prompt TEXT and --prompt-ids 1,2,3");
  return 0;
}

/* "1,2,3" -> ids (malloc'ed). */
static int parse_ids(const char *s, int vocab, int **ids, int *n) {
  int cap = 16;
  *n = 0;
  *ids = malloc((size_t)cap * sizeof **ids);
  if (!*ids) return st_error_set("out of host memory for the prompt");
  const char *p = s ? s : "";
  while (*p) {
    char *end = NULL;
    long v = strtol(p, &end, 10);
    if (end == p || v < 0 || v >= vocab || (*end && *end != ','))
      return st_error_setc(ST_EXIT_USAGE, "--prompt-ids %s: give comma-separated token ids "
                           "from 0 to %d (the model's vocabulary)", s, vocab - 1);
    if (*n == cap) {
      int *grown = realloc(*ids, (size_t)(cap *= 2) * sizeof **ids);
      if (!grown) return st_error_set("out of host memory for the prompt");
      *ids = grown;
    }
    (*ids)[(*n)++] = (int)v;
    p = *end ? end + 1 : end;
  }
  if (*n == 0) return st_error_setc(ST_EXIT_USAGE, "--prompt-ids is empty: give at least one id");
  return 0;
}

/* The tokenizer text needs: --tokenizer, the source's own, or bytes for a
 * 256-token vocabulary. NULL with *none = 1 when there is none to take. */
static st_tokenizer *open_tokenizer(const sample_flags *f, const st_loaded_model *lm, int *none) {
  *none = 0;
  char own_name[32] = "", own_digest[72] = "";
  /* The source's identity decides only with --tokenizer (must match it) or
   * without tokenizer files (a byte-token run); otherwise its own files are
   * what gets loaded, so they are not read twice. */
  const int own = (f->tokenizer || !lm->src.tokenizer_dir[0]) &&
                  st_loaded_model_tokenizer(lm, own_name, own_digest);
  const char *path = f->tokenizer ? f->tokenizer
                     : lm->src.tokenizer_dir[0] ? lm->src.tokenizer_dir
                     : (own && !strcmp(own_name, "bytes")) || lm->src.cfg.vocab_size == 256
                         ? "bytes" : NULL;
  if (!path) {
    *none = 1;
    return NULL;
  }
  st_tokenizer *t = st_tokenizer_load(path);
  if (!t) return NULL;
  if (own && strcmp(st_tokenizer_digest(t), own_digest) != 0) {
    st_error_setc(ST_EXIT_DATA, "--tokenizer %s (%s, digest %.12s) is not the tokenizer of %s "
                  "(%s, digest %.12s): its ids would decode to other text; drop --tokenizer",
                  path, st_tokenizer_name(t), st_tokenizer_digest(t), f->init, own_name,
                  own_digest);
    st_tokenizer_free(t);
    return NULL;
  }
  if (st_tokenizer_vocab_size(t) > lm->src.cfg.vocab_size) {
    st_error_setc(ST_EXIT_DATA, "tokenizer %s has %d tokens but the model %s only %d; give the "
                  "model's own tokenizer with --tokenizer", path, st_tokenizer_vocab_size(t),
                  f->init, lm->src.cfg.vocab_size);
    st_tokenizer_free(t);
    return NULL;
  }
  return t;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void emit(const sample_flags *f, const st_tokenizer *tok, int id, int k) {
  if (f->print_ids) {
    printf(k ? ",%d" : "%d", id);
  } else {
    char buf[ST_TOKEN_TEXT_BUF];
    size_t len = 0;
    const char *b = st_tokenizer_token_text(tok, (uint32_t)id, buf, &len);
    if (len) fwrite(b, 1, len, stdout);
  }
  fflush(stdout);
}

static void summary(const sample_flags *f, const st_loaded_model *lm, int P, int N,
                    double prefill_s, double decode_s, const char *stop) {
  const double dec_rate = N > 1 && decode_s > 0 ? (N - 1) / decode_s : 0.0;
  const double total = prefill_s + decode_s;
  if (!f->json) {
    const char *why = !strcmp(stop, "eot")          ? "the end-of-text token"
                      : !strcmp(stop, "block-size") ? "the model's block size (its positions)"
                                                    : "--max-new";
    fprintf(stderr, "sample: %d prompt + %d new tokens on %s %s; prefill %.2f ms (%.0f tokens/s), "
            "decode %.1f tokens/s, %.1f tokens/s overall; stopped at %s\n", P, N, lm->device,
            lm->precision, prefill_s * 1e3, prefill_s > 0 ? P / prefill_s : 0.0, dec_rate,
            total > 0 ? N / total : 0.0, why);
    return;
  }
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "prompt_tokens", P);
  cJSON_AddNumberToObject(o, "new_tokens", N);
  cJSON_AddNumberToObject(o, "prefill_s", prefill_s);
  cJSON_AddNumberToObject(o, "decode_s", decode_s);
  cJSON_AddNumberToObject(o, "decode_tokens_per_s", dec_rate);
  cJSON_AddNumberToObject(o, "tokens_per_s", total > 0 ? N / total : 0.0);
  cJSON_AddStringToObject(o, "stop", stop);
  cJSON_AddStringToObject(o, "device", lm->device);
  cJSON_AddStringToObject(o, "precision", lm->precision);
  char *s = cJSON_PrintUnformatted(o);
  if (s) fprintf(stderr, "%s\n", s);
  free(s);
  cJSON_Delete(o);
}

static int run(const sample_flags *f, st_loaded_model *lm, st_tokenizer *tok, const int *prompt,
               int P) {
  const st_model_config *c = &lm->src.cfg;
  const int room = c->block_size - P;
  if (room < 1)
    return st_error_setc(ST_EXIT_USAGE, "the prompt is %d tokens and the model %s has %d "
                         "positions (block size): shorten the prompt", P, f->init,
                         c->block_size);
  int N = (int)f->max_new;
  const char *stop = "max-new";
  if (N > room) {
    if (f->max_new_given)
      return st_error_setc(ST_EXIT_USAGE, "--max-new %ld: the model has %d positions (block "
                           "size) and the prompt takes %d, so at most %d new tokens fit",
                           f->max_new, c->block_size, P, room);
    N = room;
    stop = "block-size";
  }
  st_sampler sm;
  if (st_sampler_init(&sm, &f->so, c->vocab_size)) return -1;
  st_infer inf;
  if (st_infer_init(&inf, c, lm->ops, P) || st_infer_set_weights(&inf, lm->weights)) {
    st_sampler_free(&sm);
    return -1;
  }
  float *logits = malloc((size_t)c->padded_vocab_size * sizeof *logits);
  int rc = logits ? 0 : st_error_set("out of host memory for the logits");
  st_rng rng;
  st_rng_seed(&rng, (uint64_t)f->seed);
  const int64_t eot = tok && !f->ignore_eot ? st_tokenizer_eot(tok) : -1;
  double t0 = now_s(), prefill_s = 0.0;
  int made = 0;
  if (!rc) rc = st_infer_step(&inf, prompt, P, logits);
  prefill_s = now_s() - t0;
  const double t1 = now_s();
  while (!rc) {
    const int id = st_sampler_next(&sm, logits, &rng);
    if (id == eot) {
      if (f->print_ids) emit(f, tok, id, made);
      made++;
      stop = "eot";
      break;
    }
    emit(f, tok, id, made);
    if (++made == N) break;
    rc = st_infer_step(&inf, &id, 1, logits);
  }
  const double decode_s = now_s() - t1;
  if (!rc) {
    printf("\n");
    fflush(stdout);
    summary(f, lm, P, made, prefill_s, decode_s, stop);
  }
  free(logits);
  st_infer_free(&inf);
  st_sampler_free(&sm);
  return rc;
}

int st_cmd_sample(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage();
      return 0;
    }
  sample_flags f;
  if (parse(argc, argv, &f)) return st_cli_fail(ST_EXIT_USAGE);
  st_sampler probe; /* bad sampling flags fail before the model loads */
  if (st_sampler_init(&probe, &f.so, 1)) return st_cli_fail(ST_EXIT_USAGE);
  st_sampler_free(&probe);
  st_loaded_model lm;
  if (st_load_model(f.init, f.device, f.precision, &lm)) {
    int code = st_error_exit_code();
    st_loaded_model_free(&lm);
    return st_cli_fail(code);
  }
  st_tokenizer *tok = NULL;
  int *prompt = NULL, P = 0, rc = 0, none = 0;
  if (f.prompt || !f.print_ids) {
    tok = open_tokenizer(&f, &lm, &none);
    if (none)
      rc = st_error_setc(ST_EXIT_USAGE, "--init %s has no tokenizer files and a vocabulary of "
                         "%d (not the byte tokenizer's 256): give --tokenizer DIR (vocab.json + "
                         "merges.txt or tokenizer.json), --tokenizer bytes when it was trained "
                         "on byte tokens, or --prompt-ids with --print-ids",
                         f.init, lm.src.cfg.vocab_size);
    else if (!tok)
      rc = -1;
  }
  if (!rc && f.prompt) {
    uint32_t *ids = NULL;
    size_t n = 0;
    rc = st_tokenizer_encode(tok, f.prompt, strlen(f.prompt), 1, &ids, &n);
    if (!rc && n == 0) rc = st_error_setc(ST_EXIT_USAGE, "--prompt is empty: give some text");
    if (!rc) {
      /* a prompt past the block size is refused by run(), which names it */
      P = n > (size_t)lm.src.cfg.block_size ? lm.src.cfg.block_size + 1 : (int)n;
      prompt = malloc((size_t)P * sizeof *prompt);
      if (!prompt) rc = st_error_set("out of host memory for the prompt");
      else
        for (int i = 0; i < P; i++) prompt[i] = (int)ids[i];
    }
    free(ids);
  } else if (!rc) {
    rc = parse_ids(f.prompt_ids, lm.src.cfg.vocab_size, &prompt, &P);
  }
  if (!rc) rc = run(&f, &lm, tok, prompt, P);
  const int code = rc ? st_cli_fail(st_error_exit_code()) : 0;
  free(prompt);
  if (tok) st_tokenizer_free(tok);
  st_loaded_model_free(&lm);
  return code;
}
