/* run_lock.c - one job at a time per run directory (see run_lock.h).
 *
 * Why link(2) and not flock/fcntl: a lock file that outlives its holder is
 * what lets a second job name the first one (host, pid, Slurm job, since
 * when); an flock vanishes with the process and on NFS is emulated, or not
 * shared between clients at all, depending on the mount. link() of a fully
 * written private file onto RUN/run.lock is atomic on local filesystems and
 * on NFS alike, so the lock file is never seen half written.
 */
#define _XOPEN_SOURCE 700
#include "io/run_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "util/error.h"

/* From /proc/PID/stat: the start time of pid in clock ticks since boot
 * (field 22; 0 where it cannot be read: no /proc, the process is gone) and
 * its state (field 3; 0 when unknown). */
static unsigned long long pid_stat(long long pid, char *state) {
  char path[64], buf[1024];
  if (state) *state = 0;
  snprintf(path, sizeof path, "/proc/%lld/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')'); /* the command name may hold spaces and ')' */
  if (!p) return 0;
  p++;
  /* after ')': field 3 (state) is token 0, so field 22 is token 19 */
  char *save = NULL, *tok = strtok_r(p, " ", &save);
  if (tok && state) *state = tok[0];
  for (int i = 0; tok && i < 19; i++) tok = strtok_r(NULL, " ", &save);
  return tok ? strtoull(tok, NULL, 10) : 0;
}

static unsigned long long pid_start_time(long long pid) { return pid_stat(pid, NULL); }

void st_run_id_make(char id[33]) {
  unsigned char b[16];
  int ok = 0;
  FILE *f = fopen("/dev/urandom", "rb");
  if (f) {
    ok = fread(b, 1, sizeof b, f) == sizeof b;
    fclose(f);
  }
  if (!ok) { /* no /dev/urandom: time, pid and an address, hashed (splitmix64) */
    unsigned long long x = (unsigned long long)time(NULL) ^ ((unsigned long long)getpid() << 32) ^
                           (unsigned long long)(size_t)&b;
    for (int i = 0; i < 16; i++) {
      x += 0x9e3779b97f4a7c15ULL;
      unsigned long long z = x;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      b[i] = (unsigned char)(z ^ (z >> 31));
    }
  }
  for (int i = 0; i < 16; i++) snprintf(id + 2 * i, 3, "%02x", b[i]);
}

static void self_identity(st_run_lock *lk) {
  gethostname(lk->host, sizeof lk->host - 1);
  lk->host[sizeof lk->host - 1] = 0;
  lk->pid = (long long)getpid();
  lk->pid_start = pid_start_time(lk->pid);
  const char *j = getenv("SLURM_JOB_ID");
  snprintf(lk->slurm_job_id, sizeof lk->slurm_job_id, "%s", j ? j : "");
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(lk->since, sizeof lk->since, "%Y-%m-%dT%H:%M:%SZ", &tm);
  lk->since_epoch = (long long)now;
  st_run_id_make(lk->run_id);
}

static int format_lock(const st_run_lock *lk, char *buf, size_t cap) {
  return snprintf(buf, cap, "host=%s\npid=%lld\npid_start=%llu\nslurm_job_id=%s\nsince=%s\n"
                  "since_epoch=%lld\nrun_id=%s\n", lk->host, lk->pid, lk->pid_start,
                  lk->slurm_job_id, lk->since, lk->since_epoch, lk->run_id);
}

/* Parse a lock file; 0, 1 when it does not exist (any more), -1 when it
 * cannot be read or lacks host/pid/run_id. */
static int read_lock(const char *path, st_run_lock *h) {
  memset(h, 0, sizeof *h);
  FILE *f = fopen(path, "r");
  if (!f) return errno == ENOENT ? 1 : -1;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    char *eq = strchr(line, '=');
    if (!eq) continue;
    *eq = 0;
    const char *k = line, *v = eq + 1;
    if (strcmp(k, "host") == 0) snprintf(h->host, sizeof h->host, "%s", v);
    else if (strcmp(k, "pid") == 0) h->pid = atoll(v);
    else if (strcmp(k, "pid_start") == 0) h->pid_start = strtoull(v, NULL, 10);
    else if (strcmp(k, "slurm_job_id") == 0) snprintf(h->slurm_job_id, sizeof h->slurm_job_id, "%s", v);
    else if (strcmp(k, "since") == 0) snprintf(h->since, sizeof h->since, "%s", v);
    else if (strcmp(k, "since_epoch") == 0) h->since_epoch = atoll(v);
    else if (strcmp(k, "run_id") == 0) snprintf(h->run_id, sizeof h->run_id, "%s", v);
  }
  fclose(f);
  return h->host[0] && h->pid > 0 && h->run_id[0] ? 0 : -1;
}

/* Why holder h no longer blocks us (me), or NULL when it does. */
static const char *stale_reason(const st_run_lock *h, const st_run_lock *me, char *buf, size_t cap) {
  if (h->slurm_job_id[0] && strcmp(h->slurm_job_id, me->slurm_job_id) == 0) {
    snprintf(buf, cap, "a requeued run of the same Slurm job %s", h->slurm_job_id);
    return buf;
  }
  if (strcmp(h->host, me->host) != 0) return NULL; /* cannot look at another host's processes */
  if (kill((pid_t)h->pid, 0) != 0 && errno == ESRCH) {
    snprintf(buf, cap, "process %lld is gone", h->pid);
    return buf;
  }
  char state;
  const unsigned long long now = pid_stat(h->pid, &state);
  if (state == 'Z' || state == 'X') { /* exited, not yet reaped (an MPI abort, kill -9) */
    snprintf(buf, cap, "process %lld has exited", h->pid);
    return buf;
  }
  if (h->pid_start && now && now != h->pid_start) {
    snprintf(buf, cap, "pid %lld now belongs to another process (started at tick %llu, the "
             "lock's at %llu)", h->pid, now, h->pid_start);
    return buf;
  }
  return NULL;
}

/* Write lk's identity to a private file next to the lock. */
static int write_private(const char *path, const st_run_lock *lk) {
  char text[1024];
  int n = format_lock(lk, text, sizeof text);
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (fd < 0) return -1;
  int ok = n > 0 && write(fd, text, (size_t)n) == (ssize_t)n && fsync(fd) == 0;
  ok &= close(fd) == 0;
  if (!ok) unlink(path);
  return ok ? 0 : -1;
}

/* Move a stale lock out of the way, but only the one judged stale: it is
 * renamed to a private name and read back; if someone else's fresh lock was
 * caught instead (a racer replaced the stale one between our read and the
 * rename), it is linked back. */
static void remove_stale(const st_run_lock *lk, const st_run_lock *stale, const char *aside) {
  if (rename(lk->path, aside) != 0) return; /* gone already: the next link decides */
  st_run_lock got;
  if (read_lock(aside, &got) == 0 && strcmp(got.run_id, stale->run_id) != 0)
    if (link(aside, lk->path) != 0) {
      /* EEXIST: a third job holds it now; it stays the holder */
    }
  unlink(aside);
}

int st_run_lock_acquire(const char *run_dir, st_run_lock *lk, char *notice, int notice_cap) {
  memset(lk, 0, sizeof *lk);
  if (notice_cap > 0) notice[0] = 0;
  self_identity(lk);
  char priv[1200], aside[1200];
  if (snprintf(lk->path, sizeof lk->path, "%s/run.lock", run_dir) >= (int)sizeof lk->path)
    return st_error_set("--out %s: path too long for its run.lock", run_dir);
  snprintf(priv, sizeof priv, "%s/.run.lock.%lld.%.8s", run_dir, lk->pid, lk->run_id);
  snprintf(aside, sizeof aside, "%s/.run.lock.stale.%lld.%.8s", run_dir, lk->pid, lk->run_id);
  if (write_private(priv, lk) != 0)
    return st_error_set("--out %s: cannot write %s (%s); choose a directory you can write to",
                        run_dir, priv, strerror(errno));
  int rc = -1, said = 0;
  for (int attempt = 0; attempt < 8; attempt++) {
    if (link(priv, lk->path) == 0) {
      lk->held = 1;
      rc = 0;
      break;
    }
    if (errno != EEXIST) {
      said = 1;
      st_error_set("--out %s: cannot create %s (%s); the run directory must be on a filesystem "
                   "with hard links (any local filesystem, NFS, Lustre)", run_dir, lk->path,
                   strerror(errno));
      break;
    }
    st_run_lock h;
    int r = read_lock(lk->path, &h);
    if (r == 1) continue; /* released between link and read: try again */
    if (r < 0) {
      said = 1;
      st_error_set("--out %s: %s exists but does not name a job (host, pid, run_id); if no job "
                   "is using this run directory, remove it and start again", run_dir, lk->path);
      break;
    }
    char why[256];
    /* A holder on this host that looks alive may be a job that is just
     * ending (its exit or its reaping in progress): look again for up to
     * about 2 s before refusing. */
    const char *stale = stale_reason(&h, lk, why, sizeof why);
    for (int k = 0; !stale && k < 20 && strcmp(h.host, lk->host) == 0; k++) {
      struct timespec ts = {0, 100 * 1000 * 1000};
      nanosleep(&ts, NULL);
      stale = stale_reason(&h, lk, why, sizeof why);
    }
    if (!stale) {
      said = 1;
      st_error_set("--out %s is in use by another job: host %s, pid %lld%s%s, since %s (%s). "
                   "Wait for it to finish or stop it; if that job is gone, remove %s and start "
                   "again; or choose another --out", run_dir, h.host, h.pid,
                   h.slurm_job_id[0] ? ", Slurm job " : "", h.slurm_job_id,
                   h.since[0] ? h.since : "an unknown time", lk->path, lk->path);
      break;
    }
    if (notice_cap > 0)
      snprintf(notice, (size_t)notice_cap, "notice: %s was held by host %s, pid %lld%s%s since "
               "%s, which no longer runs (%s): taken over", lk->path, h.host, h.pid,
               h.slurm_job_id[0] ? ", Slurm job " : "", h.slurm_job_id, h.since, why);
    remove_stale(lk, &h, aside);
  }
  if (rc != 0 && !said)
    st_error_set("--out %s: could not take %s after several attempts (other jobs keep starting "
                 "on it); start one job per run directory", run_dir, lk->path);
  unlink(priv);
  return rc;
}

void st_run_lock_release(st_run_lock *lk) {
  if (!lk->held) return;
  lk->held = 0;
  st_run_lock h;
  if (read_lock(lk->path, &h) == 0 && strcmp(h.run_id, lk->run_id) == 0) unlink(lk->path);
}
