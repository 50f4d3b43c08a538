/* self_check.c - a program with one defect of our own, for
 * tests/sanitizers/self_test.sh: proves the sanitizer build reports our
 * leaks (while Open MPI's are suppressed) and stops at undefined behaviour.
 * Usage: self_check leak|ubsan|clean (under mpirun). */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *volatile sink;

__attribute__((noinline)) static void st_self_check_leak(void) {
  char *p = malloc(4096);
  if (p) memset(p, 1, 4096);
  sink = p;
  sink = NULL; /* the only pointer is gone: a leak LSan must report */
}

__attribute__((noinline)) static int st_self_check_overflow(int x) {
  return x + 1; /* signed overflow for INT_MAX */
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  const char *mode = argc > 1 ? argv[1] : "clean";
  if (strcmp(mode, "leak") == 0) st_self_check_leak();
  if (strcmp(mode, "ubsan") == 0) {
    volatile int big = INT_MAX;
    printf("%d\n", st_self_check_overflow(big));
    printf("ubsan: still running after the overflow\n");
  }
  MPI_Finalize();
  return 0;
}
