/* arena.h - one allocation for every buffer a rank plans, handed out by
 * bumping an offset (DESIGN.md "Memory model"; docs/memory.md "The arena").
 *
 * Why one allocation: the memory plan (rank/memory/memory_plan.h) is then the
 * allocation itself. Either the whole plan is there at setup or the run
 * stops before step 1; there is no second allocation that can fail later,
 * no allocator rounding per buffer, and no fragmentation between buffers.
 *
 * The arena is plain memory plus bookkeeping; it allocates nothing itself.
 * A backend's raw allocator makes the block (ops->alloc before
 * ops->use_arena), and the backend then carves every alloc, and its own
 * buffers (CUDA: cuBLASLt workspace, scratch), from it until it is sealed.
 * Every buffer starts on a 256-byte boundary (what cuBLASLt and vector
 * loads want, and what cudaMalloc gives), so a buffer of n bytes takes
 * st_arena_round(n); the planner counts the same, so a rank's arena is
 * exactly full after setup.
 *
 * Also here, as it is shared by both backends: out-of-memory at run time
 * (st_oom_fatal), which a caller turns into a report against the plan.
 */
#ifndef ST_ARENA_H
#define ST_ARENA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ST_ARENA_ALIGN 256
/* Categories kept apart in an arena's tally; more fold into the last. */
#define ST_ARENA_CATEGORIES 24

/* The bytes a buffer of `bytes` takes in an arena: rounded up to 256. */
static inline uint64_t st_arena_round(uint64_t bytes) {
  return (bytes + (ST_ARENA_ALIGN - 1)) / ST_ARENA_ALIGN * ST_ARENA_ALIGN;
}

typedef struct {
  char name[40];
  uint64_t bytes; /* padding included */
  int buffers;
} st_arena_category;

typedef struct {
  unsigned char *base;
  size_t size;   /* capacity in bytes */
  size_t used;   /* bytes handed out, padding included */
  int sealed;    /* setup is over: backends stop carving (see kernels/ops.h, use_arena) */
  /* what was handed out, by category, in first-request order */
  st_arena_category cat[ST_ARENA_CATEGORIES];
  int ncat;
  /* the first request that did not fit (failed = 1) */
  int failed;
  char failed_category[40];
  size_t failed_bytes; /* requested, before rounding */
  size_t failed_used;  /* used at that moment */
} st_arena;

/* An empty arena over [base, base + size). base must be 256-byte aligned;
 * the memory is expected to be zeroed (alloc's contract) and is not
 * touched here. */
void st_arena_init(st_arena *a, void *base, size_t size);

/* The next st_arena_round(bytes) bytes, 256-byte aligned, counted under
 * `category` (a plan category name: "weights", "activations", ...; NULL
 * reads "unnamed"). bytes == 0 gives a valid pointer that takes nothing.
 * NULL when it does not fit: the arena is left as it was and the first
 * such request is kept in failed_* for the report. */
void *st_arena_take(st_arena *a, size_t bytes, const char *category);

/* 1 when p points into the arena's block. */
int st_arena_owns(const st_arena *a, const void *p);

/* Bytes handed out under category (padding included); 0 when none. */
uint64_t st_arena_category_bytes(const st_arena *a, const char *category);

/* Out of memory at run time, where the caller cannot return an error (a
 * CUDA call inside an op, an allocation inside a step). category: the plan
 * category the memory was for, or "unplanned"; requested: bytes asked for
 * (0 when unknown, as for a CUDA call that allocates internally); detail:
 * what failed, for the report. Calls the handler set with
 * st_oom_set_handler (the trainer's, which reports against the plan and
 * ends the job); without one, prints one line and exits with ST_EXIT_OOM
 * (7). Never returns. */
typedef void (*st_oom_handler)(void *ctx, const char *category, size_t requested,
                               const char *detail);
void st_oom_set_handler(st_oom_handler fn, void *ctx);
#ifdef __cplusplus
[[noreturn]]
#else
_Noreturn
#endif
void st_oom_fatal(const char *category, size_t requested, const char *detail);

#ifdef __cplusplus
}
#endif

#endif
