/* error.h - one error message per thread, set where the failure is understood.
 *
 * Functions that can fail return 0 on success and -1 on failure after calling
 * st_error_set() with a message that names the file or flag and the fix. The
 * caller either adds context (st_error_prefix) or prints it and exits.
 */
#ifndef ST_ERROR_H
#define ST_ERROR_H

#include <stddef.h>

/* Exit codes, documented in README.md ("Exit codes"). */
enum {
  ST_EXIT_OK = 0,
  ST_EXIT_ERROR = 1,      /* bad input, I/O failure: message says which */
  ST_EXIT_USAGE = 2,      /* unknown flag or bad flag value */
  ST_EXIT_CHECKPOINT = 3, /* checkpoint missing, corrupted or incompatible */
  ST_EXIT_DATA = 4,       /* token data missing, malformed or too small */
  ST_EXIT_COLLECTIVE = 5, /* a collective failed or timed out (watchdog); job aborted */
  /* The memory plan does not fit the GPU (`plan`, `train`'s pre-flight) or
   * --fit found nothing that fits; docs/memory.md. */
  ST_EXIT_MEMORY = 6,
  /* Out of memory at run time despite the plan: the arena could not be
   * made or a planned buffer did not fit it (setup), or an allocation
   * failed inside a step (kernels/arena.h, st_oom_fatal). Reported against
   * the plan; no checkpoint is written on this path. docs/memory.md. */
  ST_EXIT_OOM = 7,
  /* Stopped by SIGUSR1/SIGTERM after writing a checkpoint: requeue and the
   * run continues with --resume auto. 75 is sysexits' EX_TEMPFAIL. */
  ST_EXIT_PREEMPTED = 75
};

/* Set the current error message (printf-style). Always returns -1. The
 * message is one line: control characters in it (a newline or an escape
 * in a name read from a file) are written as C escapes (\n, \x1b). */
int st_error_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same for a report of several lines (a failed child run and the end
 * of its log): newlines and other control characters stay as they are. */
int st_error_set_lines(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* st_error_set plus the exit-code class (ST_EXIT_*). Always returns -1. */
int st_error_setc(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Put "prefix: " in front of the current message (the prefix escaped as
 * st_error_set escapes). Always returns -1. */
int st_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The current message ("" when none). */
const char *st_error_msg(void);
/* Exit code class attached with st_error_code(); defaults to ST_EXIT_ERROR. */
void st_error_code(int code);
int st_error_exit_code(void);

#endif
