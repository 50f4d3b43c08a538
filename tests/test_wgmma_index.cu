/* test_wgmma_index.cu - the address arithmetic of the Hopper attention
 * kernels (kernels/cuda/wgmma.cuh), checked on the host: it needs nvcc but
 * no GPU, so CI runs it. What the kernels' fast paths compute must equal
 * what the general forms compute, for every thread and chunk:
 *   - wgmma descriptors stepped by a 32-bit add (wg_dsc_at, wg_dsc_off)
 *     against wg_desc rebuilt at each address, at every offset the
 *     kernels step by (wg_qk, wg_qk_rs: (kk / 4) 8192 + (kk % 4) 32; wg_rs4:
 *     2048 t) from every 16-byte-aligned base that keeps the tile inside
 *     shared memory;
 *   - the per-thread tile load (wg_rows_at, wg_rows_ok/dst/src) against
 *     wg_load's per-chunk form (wg_chunk_row/dst/src) at head size 64 and
 *     128 threads, and that the 512 chunks fill the tile once each;
 *   - the dK/dV walk's counters (wg_walk_next) against m / per, m % per;
 *   - the block order (wg_slot_at): every (tile, head) once for every
 *     group size, groups of one head the grid's own order (x the tile, y
 *     the head), one group of all heads the transposed order (x the head),
 *     and within a group each tile of every head before the next tile.
 * Exit 0 when every check passes, 1 otherwise.
 */
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/wgmma.cuh"

static int g_checks, g_failures;

static void check(int ok, const char *what, long a, long b, long c) {
  g_checks++;
  if (!ok && g_failures++ < 10) printf("FAIL %s (%ld, %ld, %ld)\n", what, a, b, c);
}

static void test_descriptors(void) {
  const uint32_t lbo_sbo[2][2] = {{16, 1024}, {8192, 1024}};
  uint32_t offs[12];
  int n = 0;
  for (int kk = 0; kk < 8; kk++) offs[n++] = (kk >> 2) * 8192 + (kk & 3) * 32;
  for (int t = 0; t < 4; t++) offs[n++] = t * 2048;
  const uint32_t smem = 228 * 1024; /* per block, sm_90 */
  int bad = 0;
  for (int k = 0; k < 2; k++)
    for (uint32_t base = 0; base + 16384 <= smem; base += 16)
      for (int i = 0; i < n; i++) {
        const uint64_t want = wg_desc(base + offs[i], lbo_sbo[k][0], lbo_sbo[k][1]);
        const uint64_t got = wg_dsc_off(wg_dsc_at(base, lbo_sbo[k][0], lbo_sbo[k][1]), offs[i]);
        bad += got != want;
        if (got != want && bad <= 3) check(0, "descriptor stepped by an add", base, offs[i], k);
      }
  check(bad == 0, "every stepped descriptor", bad, 0, 0);
}

static void test_tile_load(void) {
  const int lds[] = {64, 192, 768, 2304, 2560, 4800, 6144};
  const int nvalids[] = {-5, 0, 1, 15, 16, 17, 33, 63, 64, 65, 1000};
  for (size_t a = 0; a < sizeof lds / sizeof *lds; a++) {
    const int ld = lds[a];
    for (size_t b = 0; b < sizeof nvalids / sizeof *nvalids; b++) {
      const int nv = nvalids[b];
      int bad = 0;
      for (int tid = 0; tid < 128; tid++) {
        const wg_rows p = wg_rows_at(tid, ld);
        for (int i = 0; i < 4; i++) {
          const int idx = tid + 128 * i;
          const bool ok = wg_chunk_row(idx) < nv, ok2 = wg_rows_ok(p, i, nv);
          bad += ok != ok2;
          bad += (int)wg_rows_dst(p, i) != wg_chunk_dst(idx);
          bad += wg_rows_src(p, i, ld, ok2) != (ok ? wg_chunk_src(idx, ld) : 0);
        }
      }
      check(bad == 0, "per-thread tile load equals wg_load's chunks (ld, nvalid)", ld, nv, bad);
    }
  }
  /* the 512 chunks of a 64 x 64 tile: each 16-byte slot once */
  unsigned char seen[512];
  memset(seen, 0, sizeof seen);
  int bad = 0;
  for (int tid = 0; tid < 128; tid++)
    for (int i = 0; i < 4; i++) {
      const uint32_t d = wg_rows_dst(wg_rows_at(tid, 64), i);
      bad += (d % 16) != 0 || d >= 8192 || seen[d / 16]++;
    }
  check(bad == 0, "the chunks fill the tile once each", bad, 0, 0);
}

static void test_walk(void) {
  int bad = 0;
  for (int nq = 1; nq <= 70; nq++)
    for (int kt = 0; kt < nq; kt++)
      for (int G = 1; G <= 4; G++) {
        const int per = nq - kt, steps = G * per, h0 = 3 * G;
        wg_walk w{h0, kt};
        for (int m = 0; m < steps; m++) {
          bad += w.h != h0 + m / per || w.t != kt + m % per;
          wg_walk_next(w, kt, nq);
        }
      }
  check(bad == 0, "the walk's counters equal m / per and m % per", bad, 0, 0);
}

/* The order wg_slot_at must give, built from its definition: heads / g
 * groups of g heads (at least one; the last takes the rest), one after the
 * other; inside a group, tile 0 of every head, then tile 1 of every head,
 * and so on. Groups of 1 are the old "tiles first", one group of every
 * head the old "heads first". */
static void test_block_order(void) {
  static int want_i[70 * 70], want_bh[70 * 70];
  int bad = 0, order = 0;
  for (unsigned n = 1; n <= 70; n += 3)
    for (unsigned heads = 1; heads <= 70; heads++)
      for (unsigned g = 1; g <= heads + 2; g++) {
        const unsigned groups = heads / g ? heads / g : 1;
        unsigned L = 0;
        for (unsigned k = 0; k < groups; k++) {
          const unsigned h0 = k * g, h1 = k + 1 == groups ? heads : h0 + g;
          for (unsigned i = 0; i < n; i++)
            for (unsigned h = h0; h < h1; h++, L++) want_i[L] = (int)i, want_bh[L] = (int)h;
        }
        bad += L != n * heads;
        for (L = 0; L < n * heads; L++) {
          const wg_slot s = wg_slot_at(L, n, heads, g);
          bad += s.n != (int)n;
          order += s.i != want_i[L] || s.bh != want_bh[L];
        }
      }
  check(bad == 0, "every group size covers every (tile, head) of the grid", bad, 0, 0);
  check(order == 0, "every block in the order of its group (of 1, of g, of all heads)", order, 0,
        0);
}

int main(void) {
  test_descriptors();
  test_tile_load();
  test_walk();
  test_block_order();
  printf("test_wgmma_index: %d checks, %d failed\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
