/* test_arena.c - the arena (kernels/arena.c) and the CPU backend over it.
 *
 * 1. Alignment: every buffer starts on 256 bytes and takes whole 256-byte
 *    units, so odd sizes pad; 0 bytes take nothing.
 * 2. Tags: bytes and buffers tallied per category in first-request order;
 *    more categories than the tally holds fold into the last.
 * 3. Overflow: a request that does not fit returns NULL, leaves the arena
 *    as it was, and the first such request (category, bytes, used then) is
 *    kept; a later smaller one still fits.
 * 4. Exact fill: a block of exactly the rounded sizes' sum is used to the
 *    byte, and one more byte overflows.
 * 5. The CPU op table: with use_arena, alloc carves (zeroed, tagged, no raw
 *    allocation counted) and free ignores arena pointers; sealed, alloc is
 *    raw again and counted.
 * 6. st_oom_fatal without a handler exits 7; with one, the handler gets the
 *    category, bytes and detail (checked in a child process).
 */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "kernels/arena.h"
#include "kernels/ops.h"
#include "util/error.h"

static void *block(size_t bytes) {
  void *p = aligned_alloc(ST_ARENA_ALIGN, bytes ? bytes : ST_ARENA_ALIGN);
  assert_non_null(p);
  memset(p, 0, bytes);
  return p;
}

static void test_alignment(void **state) {
  (void)state;
  assert_int_equal(st_arena_round(0), 0);
  assert_int_equal(st_arena_round(1), 256);
  assert_int_equal(st_arena_round(256), 256);
  assert_int_equal(st_arena_round(257), 512);
  st_arena a;
  void *b = block(4096);
  st_arena_init(&a, b, 4096);
  const size_t sizes[] = {1, 300, 256, 0, 7, 1000};
  size_t off = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    unsigned char *p = st_arena_take(&a, sizes[i], "x");
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % ST_ARENA_ALIGN, 0);
    assert_ptr_equal(p, (unsigned char *)b + off);
    assert_true(st_arena_owns(&a, p));
    off += st_arena_round(sizes[i]);
    assert_int_equal(a.used, off);
  }
  assert_int_equal(off, 256 + 512 + 256 + 0 + 256 + 1024);
  assert_false(st_arena_owns(&a, (unsigned char *)b + 4096));
  assert_false(st_arena_owns(&a, &a));
  assert_false(st_arena_owns(NULL, b));
  free(b);
}

static void test_tags(void **state) {
  (void)state;
  st_arena a;
  void *b = block(1 << 16);
  st_arena_init(&a, b, 1 << 16);
  assert_non_null(st_arena_take(&a, 1000, "weights"));
  assert_non_null(st_arena_take(&a, 10, "activations"));
  assert_non_null(st_arena_take(&a, 300, "weights"));
  assert_non_null(st_arena_take(&a, 4, NULL));
  assert_int_equal(a.ncat, 3);
  assert_string_equal(a.cat[0].name, "weights");
  assert_int_equal(a.cat[0].bytes, 1024 + 512);
  assert_int_equal(a.cat[0].buffers, 2);
  assert_string_equal(a.cat[1].name, "activations");
  assert_int_equal(a.cat[1].bytes, 256);
  assert_string_equal(a.cat[2].name, "unnamed");
  assert_int_equal(st_arena_category_bytes(&a, "weights"), 1536);
  assert_int_equal(st_arena_category_bytes(&a, "adam_m"), 0);
  /* more categories than the tally holds: the rest fold into the last */
  for (int i = 0; i < ST_ARENA_CATEGORIES + 3; i++) {
    char name[16];
    snprintf(name, sizeof name, "c%d", i);
    assert_non_null(st_arena_take(&a, 1, name));
  }
  assert_int_equal(a.ncat, ST_ARENA_CATEGORIES);
  uint64_t sum = 0;
  for (int i = 0; i < a.ncat; i++) sum += a.cat[i].bytes;
  assert_int_equal(sum, a.used);
  free(b);
}

static void test_overflow(void **state) {
  (void)state;
  st_arena a;
  void *b = block(1024);
  st_arena_init(&a, b, 1024);
  assert_non_null(st_arena_take(&a, 600, "weights")); /* 768 */
  assert_null(st_arena_take(&a, 257, "adam_m"));      /* 512 > 256 left */
  assert_int_equal(a.used, 768);
  assert_true(a.failed);
  assert_string_equal(a.failed_category, "adam_m");
  assert_int_equal(a.failed_bytes, 257);
  assert_int_equal(a.failed_used, 768);
  assert_int_equal(st_arena_category_bytes(&a, "adam_m"), 0);
  /* the first failure is the one kept; a fitting request still succeeds */
  assert_null(st_arena_take(&a, SIZE_MAX - 10, "tokens")); /* rounding must not wrap */
  assert_string_equal(a.failed_category, "adam_m");
  assert_non_null(st_arena_take(&a, 256, "tokens"));
  assert_int_equal(a.used, a.size);
  /* no block at all: everything fails */
  st_arena none;
  st_arena_init(&none, NULL, 4096);
  assert_null(st_arena_take(&none, 1, "weights"));
  assert_true(none.failed);
  free(b);
}

static void test_exact_fill(void **state) {
  (void)state;
  const size_t sizes[] = {5, 256, 1023, 77, 4096, 1};
  size_t total = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += st_arena_round(sizes[i]);
  st_arena a;
  void *b = block(total);
  st_arena_init(&a, b, total);
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    assert_non_null(st_arena_take(&a, sizes[i], "x"));
  assert_int_equal(a.used, total);
  assert_int_equal(a.used, a.size);
  assert_false(a.failed);
  assert_non_null(st_arena_take(&a, 0, "x")); /* nothing more taken */
  assert_null(st_arena_take(&a, 1, "y"));
  assert_int_equal(a.failed_used, total);
  free(b);
}

static void test_cpu_backend(void **state) {
  (void)state;
  const st_ops *ops = st_ops_cpu();
  const int64_t n0 = ops->allocations(NULL);
  void *raw = ops->alloc(3 * 256, "arena");
  assert_non_null(raw);
  assert_int_equal((uintptr_t)raw % ST_ARENA_ALIGN, 0);
  assert_int_equal(ops->allocations(NULL), n0 + 1);
  st_arena a;
  st_arena_init(&a, raw, 3 * 256);
  ops->use_arena(&a);
  unsigned char *w = ops->alloc(100, "weights"), *g = ops->alloc(512, "grads_full");
  assert_ptr_equal(w, raw);
  assert_ptr_equal(g, (unsigned char *)raw + 256);
  for (int i = 0; i < 512; i++) assert_int_equal(g[i], 0);
  assert_null(ops->alloc(1, "tokens")); /* full: overflow, not a raw allocation */
  assert_true(a.failed);
  assert_int_equal(ops->allocations(NULL), n0 + 1);
  ops->free(w); /* ignored: the arena owns it */
  a.sealed = 1;
  void *later = ops->alloc(64, "unplanned");
  assert_non_null(later);
  const char *last = NULL;
  assert_int_equal(ops->allocations(&last), n0 + 2);
  assert_string_equal(last, "alloc of 64 bytes");
  ops->free(later);
  ops->use_arena(NULL);
  ops->free(raw);
}

/* The handler's child exits 40 + one point per field it got right. */
static void handler(void *ctx, const char *category, size_t requested, const char *detail) {
  (void)ctx;
  _exit(40 + (strcmp(category, "activations") == 0) + (requested == 12345) +
        (strcmp(detail, "why") == 0));
}
static void oom_plain(void) { st_oom_fatal("unplanned", 1, "plain"); }
static void oom_handled(void) {
  st_oom_set_handler(handler, NULL);
  st_oom_fatal("activations", 12345, "why");
}

/* Runs fn in a child; its exit status. */
static int child_status(void (*fn)(void)) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    fn();
    _exit(99);
  }
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  return WEXITSTATUS(st);
}

static void test_oom_fatal(void **state) {
  (void)state;
  assert_int_equal(child_status(oom_plain), ST_EXIT_OOM);
  assert_int_equal(ST_EXIT_OOM, 7);
  assert_int_equal(child_status(oom_handled), 43);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_alignment),  cmocka_unit_test(test_tags),
      cmocka_unit_test(test_overflow),   cmocka_unit_test(test_exact_fill),
      cmocka_unit_test(test_cpu_backend), cmocka_unit_test(test_oom_fatal),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
