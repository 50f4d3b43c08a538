/* timeline.h - GPU timestamps of a step's phases and collectives, taken
 * with CUDA events so nothing is synchronised and overlap is kept
 * (ST_TIMELINE=FROM:TO, steps; docs/benchmarks.md, "Where a multi-GPU step's
 * time goes"). --step-timing synchronises at phase edges and so hides how
 * communication overlaps compute; this shows it.
 *
 * A mark records an event on a stream; at the end of a step in the range,
 * the device is synchronised and one line per rank goes to stderr:
 * "timeline rank R step S: label[tag]@ms ...", each mark's time from the
 * step's first mark, in milliseconds of GPU time. Marks past the capacity
 * (1024 per step) are dropped. */
#ifndef ST_TIMELINE_H
#define ST_TIMELINE_H

#ifdef __cplusplus
extern "C" {
#endif

/* Whether ST_TIMELINE is set (read once). */
int st_timeline_enabled(void);
/* Record `label` (a string literal: it is kept by pointer) with `tag` on
 * `stream` (a cudaStream_t; NULL: the legacy default stream). */
void st_timeline_mark(const char *label, int tag, void *stream);
/* End of step `step`: print this rank's marks when the step is in range,
 * then forget them. */
void st_timeline_step_end(long long step, int rank);

#ifdef __cplusplus
}
#endif

#endif
