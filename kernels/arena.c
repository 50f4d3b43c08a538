/* arena.c - bump allocation in one block, tallied by category, and the
 * run-time out-of-memory exit (see arena.h). */
#include "kernels/arena.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

void st_arena_init(st_arena *a, void *base, size_t size) {
  memset(a, 0, sizeof *a);
  a->base = base;
  a->size = base ? size : 0;
}

static st_arena_category *category_of(st_arena *a, const char *name) {
  for (int i = 0; i < a->ncat; i++)
    if (strcmp(a->cat[i].name, name) == 0) return &a->cat[i];
  if (a->ncat == ST_ARENA_CATEGORIES) return &a->cat[ST_ARENA_CATEGORIES - 1];
  st_arena_category *c = &a->cat[a->ncat++];
  snprintf(c->name, sizeof c->name, "%s", name);
  return c;
}

void *st_arena_take(st_arena *a, size_t bytes, const char *category) {
  const char *name = category ? category : "unnamed";
  const size_t left = a->base ? a->size - a->used : 0;
  /* bytes first: rounding a request near SIZE_MAX up would wrap to 0 */
  const uint64_t need = bytes <= left ? st_arena_round(bytes) : UINT64_MAX;
  if (!a->base || need > left) {
    if (!a->failed) {
      a->failed = 1;
      snprintf(a->failed_category, sizeof a->failed_category, "%s", name);
      a->failed_bytes = bytes;
      a->failed_used = a->used;
    }
    return NULL;
  }
  void *p = a->base + a->used;
  a->used += (size_t)need;
  st_arena_category *c = category_of(a, name);
  c->bytes += need;
  c->buffers++;
  return p;
}

int st_arena_owns(const st_arena *a, const void *p) {
  const unsigned char *q = p;
  return a && a->base && q >= a->base && q < a->base + (a->size ? a->size : 1);
}

uint64_t st_arena_category_bytes(const st_arena *a, const char *category) {
  for (int i = 0; i < a->ncat; i++)
    if (strcmp(a->cat[i].name, category) == 0) return a->cat[i].bytes;
  return 0;
}

static st_oom_handler g_handler;
static void *g_ctx;

void st_oom_set_handler(st_oom_handler fn, void *ctx) {
  g_handler = fn;
  g_ctx = ctx;
}

void st_oom_fatal(const char *category, size_t requested, const char *detail) {
  if (g_handler) g_handler(g_ctx, category, requested, detail);
  /* no handler, or one that returned: the plain form */
  fprintf(stderr, "shardtrain: error: out of memory (%s, %zu bytes requested): %s\n",
          category ? category : "unplanned", requested, detail ? detail : "");
  fflush(stderr);
  exit(ST_EXIT_OOM);
}
