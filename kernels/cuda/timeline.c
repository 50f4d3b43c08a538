/* timeline.c - event timestamps of a step (see timeline.h). */
#include "kernels/cuda/timeline.h"

#include "util/envparse.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CAP 1024

typedef struct {
  const char *label;
  int tag;
  cudaEvent_t ev;
} mark;

static mark marks[CAP];
static int nmarks, enabled = -1;
static long long from = 5, to = 7;

int st_timeline_enabled(void) {
  if (enabled < 0) {
    const char *e = getenv("ST_TIMELINE");
    const int r = st_envparse_step_range(e, &from, &to); /* unset: 0, never parses NULL */
    enabled = r > 0;
    if (r < 0)
      fprintf(stderr, "shardtrain: warning: ST_TIMELINE=%s is not FROM:TO or STEP (steps, "
              "FROM <= TO); no timeline is printed\n", e);
  }
  return enabled;
}

void st_timeline_mark(const char *label, int tag, void *stream) {
  if (!st_timeline_enabled() || nmarks >= CAP) return;
  mark *m = &marks[nmarks];
  /* Events are made once and reused: creating one is cheap but not free. */
  if (!m->ev && cudaEventCreate(&m->ev) != cudaSuccess) return;
  m->label = label;
  m->tag = tag;
  if (cudaEventRecord(m->ev, (cudaStream_t)stream) == cudaSuccess) nmarks++;
}

void st_timeline_step_end(long long step, int rank) {
  if (!st_timeline_enabled()) return;
  if (step >= from && step <= to && nmarks > 0) {
    /* One write per line, so the lines of ranks sharing a stderr stay whole. */
    static char line[CAP * 40];
    size_t len = 0;
    cudaDeviceSynchronize();
    len += (size_t)snprintf(line, sizeof line, "timeline rank %d step %lld:", rank, step);
    for (int i = 0; i < nmarks && len + 64 < sizeof line; i++) {
      float ms = 0;
      cudaEventElapsedTime(&ms, marks[0].ev, marks[i].ev);
      len += (size_t)snprintf(line + len, sizeof line - len, " %s[%d]@%.3f", marks[i].label,
                              marks[i].tag, ms);
    }
    line[len++] = '\n';
    fwrite(line, 1, len, stderr);
    fflush(stderr);
  }
  nmarks = 0;
}
