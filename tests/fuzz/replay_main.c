/* replay_main.c - runs a fuzz target's LLVMFuzzerTestOneInput over files
 * and directories of inputs, without libFuzzer: how ctest replays the
 * committed seeds and past findings (tests/fuzz/README.md). Exits 0 when
 * every input ran; a broken contract aborts. */
#include "tests/fuzz/fuzz.h"

#include <dirent.h>
#include <sys/stat.h>

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    return -1;
  }
  size_t cap = 1 << 16, n = 0;
  uint8_t *buf = malloc(cap);
  size_t k;
  while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0) {
    n += k;
    if (n == cap) {
      uint8_t *g = realloc(buf, cap *= 2);
      if (!g) free(buf);
      buf = g;
    }
  }
  fclose(f);
  if (!buf) return -1;
  if (getenv("ST_FUZZ_VERBOSE")) fprintf(stderr, "== %s (%zu bytes)\n", path, n);
  LLVMFuzzerTestOneInput(buf, n);
  free(buf);
  return 0;
}

static int names_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_names(char **names, int n) {
  for (int j = 0; j < n; j++) free(names[j]);
  free(names);
}

/* Every file of dir (not those starting with '.'), in name order. */
static int run_dir(const char *dir, int *files) {
  DIR *d = opendir(dir);
  if (!d) {
    perror(dir);
    return -1;
  }
  char **names = NULL;
  int n = 0, rc = 0;
  struct dirent *e;
  while (!rc && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char **g = realloc(names, (size_t)(n + 1) * sizeof *names);
    char *name = malloc(strlen(dir) + strlen(e->d_name) + 2);
    if (g) names = g;
    if (!g || !name) {
      free(name);
      rc = -1;
      break;
    }
    sprintf(name, "%s/%s", dir, e->d_name);
    names[n++] = name;
  }
  closedir(d);
  if (!rc && n > 0) qsort(names, (size_t)n, sizeof *names, names_cmp);
  for (int j = 0; !rc && j < n; j++) {
    rc = run_file(names[j]);
    if (!rc) (*files)++;
  }
  free_names(names, n);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE|DIR ... (the inputs of this fuzz target to run; "
            "tests/fuzz/README.md)\n", argv[0]);
    return 2;
  }
  int files = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      perror(argv[i]);
      return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
      if (run_file(argv[i])) return 1;
      files++;
      continue;
    }
    if (run_dir(argv[i], &files)) return 1;
  }
  printf("replayed %d input%s\n", files, files == 1 ? "" : "s");
  return files > 0 ? 0 : 1;
}
