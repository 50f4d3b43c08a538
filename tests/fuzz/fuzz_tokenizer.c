/* fuzz_tokenizer.c - tokenizer files (io/tokenizer.h) and the text they
 * encode. The first byte picks the layout; the rest is cut at "\n--8<--\n"
 * into the file(s) and a text:
 *   0: vocab.json, merges.txt, text     1: encoder.json, vocab.bpe, text
 *   2: tokenizer.json, text             3: a rank file as PATH:llama3, text
 *   4: a rank file as PATH:qwen, text   5: tokenizer.json beside a rank file, text
 *   6: shardtrain_tiktoken.json and the rank file it names (ranks.tiktoken), text
 * A tokenizer that loads must then: encode the text (or fail with one line);
 * decode what it encoded back to the text exactly when it has no
 * normalizer; write its files and load back from them with the same digest. */
#include "tests/fuzz/fuzz.h"

#include "io/tokenizer.h"

#define CUT "\n--8<--\n"

static void roundtrip(const st_tokenizer *t, const uint8_t *text, size_t n) {
  for (int special = 0; special < 2; special++) {
    uint32_t *ids = NULL;
    size_t k = 0;
    fuzz_clear_error();
    if (st_tokenizer_encode(t, (const char *)text, n, special, &ids, &k)) {
      fuzz_check_failure("st_tokenizer_encode");
      continue;
    }
    fuzz_accepted("st_tokenizer_encode");
    char *back = NULL;
    size_t len = 0;
    fuzz_clear_error();
    if (st_tokenizer_decode(t, ids, k, &back, &len)) {
      fprintf(stderr, "fuzz: decode of its own %zu ids failed: %s\n", k, st_error_msg());
      abort();
    }
    if (strcmp(st_tokenizer_normalizer(t), "none") == 0 && (len != n || memcmp(back, text, n))) {
      fprintf(stderr, "fuzz: decode(encode(text)) != text (%zu bytes in, %zu out, special %d)\n",
              n, len, special);
      abort();
    }
    free(back);
    free(ids);
  }
}

static void reload(const st_tokenizer *t) {
  const char *out = fuzz_path(3, "out");
  fuzz_fresh_dir(out); /* no file a previous input wrote stays beside these */
  fuzz_clear_error();
  if (st_tokenizer_write_dir(t, out)) {
    fuzz_check_failure("st_tokenizer_write_dir");
    return;
  }
  if (strcmp(st_tokenizer_name(t), "bytes") == 0) return;
  st_tokenizer *u = st_tokenizer_load(out);
  if (!u) {
    fprintf(stderr, "fuzz: a written tokenizer does not load back: %s\n", st_error_msg());
    abort();
  }
  if (strcmp(st_tokenizer_digest(t), st_tokenizer_digest(u)) != 0) {
    fprintf(stderr, "fuzz: the written tokenizer loads back with another digest\n");
    abort();
  }
  st_tokenizer_free(u);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const int layout = data[0] % 7;
  const uint8_t *a = data + 1, *b, *c;
  size_t na, nb, nc;
  fuzz_split(a, size - 1, CUT, &na, &b, &nb);
  const uint8_t *text = b;
  size_t ntext = nb;
  char path[700];
  /* each layout in a fresh directory, so no file of another is beside it */
  static int seq;
  char sub[32];
  snprintf(sub, sizeof sub, "t%d", seq++ & 1);
  const char *dir = fuzz_path(2, sub);
  fuzz_fresh_dir(dir);
#define FILE_IN(name, p, n)                               \
  do {                                                   \
    snprintf(path, sizeof path, "%s/%s", dir, name);     \
    fuzz_write(path, p, n);                              \
  } while (0)
  switch (layout) {
  case 0:
  case 1:
  case 5:
  case 6: {
    static const char *const first[7] = {"vocab.json", "encoder.json", "", "", "",
                                          "tokenizer.json", "shardtrain_tiktoken.json"};
    static const char *const second[7] = {"merges.txt", "vocab.bpe", "", "", "",
                                           "tokenizer.model", "ranks.tiktoken"};
    fuzz_split(b, nb, CUT, &nb, &c, &nc);
    text = c;
    ntext = nc;
    FILE_IN(first[layout], a, na);
    FILE_IN(second[layout], b, nb);
    /* 5: the rank file is what is given, its tokenizer.json read beside it */
    snprintf(path, sizeof path, "%s%s", dir, layout == 5 ? "/tokenizer.model" : "");
    break;
  }
  case 2:
    FILE_IN("tokenizer.json", a, na);
    snprintf(path, sizeof path, "%s", dir);
    break;
  default:
    FILE_IN("ranks.tiktoken", a, na);
    snprintf(path, sizeof path, "%s/ranks.tiktoken:%s", dir, layout == 3 ? "llama3" : "qwen");
    break;
  }
#undef FILE_IN
  fuzz_clear_error();
  st_tokenizer *t = st_tokenizer_load(path);
  if (!t) {
    fuzz_check_failure("st_tokenizer_load");
    return 0;
  }
  fuzz_accepted("st_tokenizer_load");
  if (st_tokenizer_vocab_size(t) < 1 || strlen(st_tokenizer_digest(t)) != 64) abort();
  roundtrip(t, text, ntext);
  reload(t);
  st_tokenizer_free(t);
  return 0;
}
