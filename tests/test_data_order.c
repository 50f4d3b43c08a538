/* test_data_order.c - the epoch orders of rank/train/data_order.c and the
 * position arithmetic of rank/train/dataloader.c.
 *
 * 1. st_perm_index permutes [0, n): for sizes around powers of two (the
 *    cycle-walking edge) and several keys, every index exactly once, the
 *    same again on a second call, and another order for another key.
 * 2. st_shard_order: a permutation of the shards, deterministic, another
 *    one for another epoch and for another seed.
 * 3. st_data_order_at over shards of 5, 1 and 12 sequences: each epoch
 *    names every (shard, sequence) exactly once; shuffled, each shard's
 *    sequences are one block in the epoch's shard order, and epoch 0 and 1
 *    differ; sequential, position p is the concatenation's p-th sequence.
 * 4. Positions: sequential order wraps a step that would run past the last
 *    whole step; advance carries into later epochs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "rank/train/data_order.h"
#include "rank/train/dataloader.h"

static void test_perm(void **state) {
  (void)state;
  const uint64_t sizes[] = {1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 63, 64, 65, 1000, 4095, 4096, 4097};
  for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
    const uint64_t n = sizes[si];
    unsigned char *seen = calloc(n, 1);
    uint64_t *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    assert_non_null(seen);
    assert_non_null(a);
    assert_non_null(b);
    for (uint64_t key = 1; key < 4; key++) {
      memset(seen, 0, n);
      for (uint64_t i = 0; i < n; i++) {
        uint64_t j = st_perm_index(i, n, key);
        assert_true(j < n);
        assert_int_equal(seen[j], 0); /* exactly once */
        seen[j] = 1;
        assert_int_equal(st_perm_index(i, n, key), j); /* deterministic */
        if (key == 1) a[i] = j;
        if (key == 2) b[i] = j;
      }
    }
    if (n >= 8) assert_true(memcmp(a, b, n * sizeof *a) != 0); /* another key, another order */
    if (n >= 8) { /* and not the identity */
      uint64_t fixed = 0;
      for (uint64_t i = 0; i < n; i++) fixed += a[i] == i;
      assert_true(fixed < n);
    }
    free(seen);
    free(a);
    free(b);
  }
}

static int is_perm(const int *o, int n) {
  int seen[64] = {0};
  for (int i = 0; i < n; i++) {
    if (o[i] < 0 || o[i] >= n || seen[o[i]]) return 0;
    seen[o[i]] = 1;
  }
  return 1;
}

static void test_shard_order(void **state) {
  (void)state;
  int a[10], b[10], c[10], d[10];
  st_shard_order(10, 1337, 0, a);
  st_shard_order(10, 1337, 0, b);
  st_shard_order(10, 1337, 1, c);
  st_shard_order(10, 7, 0, d);
  assert_true(is_perm(a, 10));
  assert_true(is_perm(c, 10));
  assert_true(is_perm(d, 10));
  assert_memory_equal(a, b, sizeof a);
  assert_true(memcmp(a, c, sizeof a) != 0);
  assert_true(memcmp(a, d, sizeof a) != 0);
  int one[1];
  st_shard_order(1, 1337, 3, one);
  assert_int_equal(one[0], 0);
}

static void test_epoch_order(void **state) {
  (void)state;
  const int64_t nseq[3] = {5, 1, 12};
  const int64_t N = 18, base[3] = {0, 5, 6};
  for (int shuffle = 0; shuffle < 2; shuffle++) {
    st_data_order o;
    assert_int_equal(st_data_order_init(&o, 3, nseq, 1337, shuffle), 0);
    assert_int_equal(o.total, N);
    int64_t e0[18];
    for (int64_t epoch = 0; epoch < 3; epoch++) {
      int seen[18] = {0}, order[3];
      st_shard_order(3, 1337, epoch, order);
      int block = 0, prev = -1;
      for (int64_t p = 0; p < N; p++) {
        int s;
        int64_t q;
        st_data_order_at(&o, epoch, p, &s, &q);
        if (s < 0 || s >= 3 || q < 0 || q >= nseq[s]) {
          fail_msg("position %lld of epoch %lld: shard %d sequence %lld", (long long)p,
                   (long long)epoch, s, (long long)q);
          return; /* the analyzer does not know fail_msg ends the test */
        }
        assert_int_equal(seen[base[s] + q], 0);
        seen[base[s] + q] = 1;
        if (s != prev) { /* a new block: the next shard of the epoch's order */
          assert_int_equal(s, shuffle ? order[block] : block);
          block++;
          prev = s;
        }
        if (!shuffle) assert_int_equal(base[s] + q, p);
        if (epoch == 0) e0[p] = base[s] + q;
        else if (epoch == 1 && shuffle && p == N - 1) {
          /* epoch 1 is another order than epoch 0 */
          int same = 1;
          for (int64_t r = 0; r < N; r++) {
            int s2;
            int64_t q2;
            st_data_order_at(&o, 1, r, &s2, &q2);
            same &= e0[r] == base[s2] + q2;
          }
          assert_false(same);
        }
      }
      assert_int_equal(block, 3);
    }
    /* asking for an earlier epoch again gives the same answer */
    int s;
    int64_t q;
    st_data_order_at(&o, 0, 7, &s, &q);
    assert_int_equal(base[s] + q, e0[7]);
    st_data_order_free(&o);
  }
}

static void test_positions(void **state) {
  (void)state;
  st_data_pos p = {2, 12};
  /* sequential: 12 + 4 <= 16 fits, 13 + 4 > 16 wraps to the next epoch */
  st_data_pos s = st_data_step_start(p, 4, 16, 0);
  assert_int_equal(s.epoch, 2);
  assert_int_equal(s.pos, 12);
  p.pos = 13;
  s = st_data_step_start(p, 4, 16, 0);
  assert_int_equal(s.epoch, 3);
  assert_int_equal(s.pos, 0);
  /* shuffled: no wrap; advance carries */
  s = st_data_step_start(p, 4, 16, 1);
  assert_int_equal(s.epoch, 2);
  assert_int_equal(s.pos, 13);
  s = st_data_advance(p, 4, 16);
  assert_int_equal(s.epoch, 3);
  assert_int_equal(s.pos, 1);
  s = st_data_advance(p, 3, 16);
  assert_int_equal(s.epoch, 3);
  assert_int_equal(s.pos, 0);
  s = st_data_advance(p, 35, 16);
  assert_int_equal(s.epoch, 5);
  assert_int_equal(s.pos, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_perm),
      cmocka_unit_test(test_shard_order),
      cmocka_unit_test(test_epoch_order),
      cmocka_unit_test(test_positions),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
