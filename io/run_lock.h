/* run_lock.h - one job at a time per run directory.
 *
 * RUN/run.lock is a small text file naming the job that holds the run
 * directory (key=value lines, docs/checkpoints.md "Run lock"):
 *
 *   host=node17
 *   pid=41234
 *   pid_start=987654        process start time, clock ticks since boot
 *                           (/proc/PID/stat field 22; 0 where unknown)
 *   slurm_job_id=5521       (empty when not under Slurm)
 *   since=2026-12-01T10:04:05Z
 *   since_epoch=1796119445
 *   run_id=3f0c...          32 hex digits, random per job start
 *
 * It is taken by rank 0 at start-up, before the run directory is written,
 * and removed at every exit the process controls (success, error,
 * preemption). A holder that can no longer run does not block:
 *   - the same SLURM_JOB_ID as ours (a requeued job of the same run);
 *   - on this host, a pid that no longer exists (kill(pid, 0) gives ESRCH),
 *     or one that exists but started at another time than the lock says
 *     (the pid was reused after a kill -9 or a reboot).
 * A holder on another host cannot be checked from here: it blocks, and the
 * message says how to remove the lock if that job is gone.
 */
#ifndef ST_RUN_LOCK_H
#define ST_RUN_LOCK_H

typedef struct {
  char path[1100];     /* RUN/run.lock */
  char host[256];
  long long pid;
  unsigned long long pid_start;
  char slurm_job_id[64];
  char since[32];      /* ISO 8601 UTC */
  long long since_epoch; /* the same, seconds since 1970 */
  char run_id[40];     /* 32 hex digits */
  int held;            /* this process holds path */
} st_run_lock;

/* Take RUN/run.lock for this process (call on one rank only). Atomic: the
 * file is written in full under a private name and then link(2)ed to
 * run.lock, which fails with EEXIST when another holder exists; link is
 * atomic on NFS too, where O_EXCL and flock/fcntl locks may not be (and
 * those locks vanish when the holder dies, leaving no one to name). On
 * success 0, lk->held = 1 and lk holds our identity (run_id is fresh);
 * *notice gets a line when a stale or requeued holder was replaced ("" when
 * not). On failure -1 with st_error: a live holder ("... is in use by
 * host H pid P (Slurm job J) since T ...") or an I/O error. */
int st_run_lock_acquire(const char *run_dir, st_run_lock *lk, char *notice, int notice_cap);

/* Remove run.lock when this process holds it and it still names our
 * run_id (a lock somebody replaced by hand is not ours to remove).
 * Idempotent; safe on a zeroed st_run_lock. */
void st_run_lock_release(st_run_lock *lk);

/* Fill id[33] with 32 random hex digits (/dev/urandom; time and pid mixed
 * in where it cannot be read). */
void st_run_id_make(char id[33]);

#endif
