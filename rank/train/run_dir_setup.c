/* run_dir_setup.c - the run directory at start-up (see run_dir_setup.h):
 * its lock, every directory the run writes, one filesystem on every node,
 * and no complete checkpoint newer than where the run starts. */
#define _XOPEN_SOURCE 700
#include "rank/train/run_dir_setup.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "io/checkpoint_dirs.h"
#include "util/error.h"
#include "util/fsutil.h"

/* The run directory belongs to one job at a time (io/run_lock.h): rank 0
 * creates it and takes RUN/run.lock before anything else is written there;
 * st_trainer_setup's agreement tells every rank the outcome. A holder that
 * is gone (dead pid on this host, reused pid, the same Slurm job requeued)
 * is taken over with a notice. */
/* Rank 0 takes RUN/run.lock (io/run_lock.h), printing the notice of a
 * stale holder replaced. */
static int take_run_lock(trainer *tr) {
  char notice[1600];
  st_error_code(ST_EXIT_ERROR);
  if (st_run_lock_acquire(tr->rc->out, &tr->lock, notice, sizeof notice)) return -1;
  if (notice[0]) {
    printf("%s\n", notice);
    fflush(stdout);
  }
  return 0;
}

/* An --out that exists is locked before its checkpoints are read, so a
 * second job never resolves `latest` while the holder is writing a save
 * (it met a half-written step directory and exited 3). One that does not
 * exist yet is locked in setup_outdir, after the memory checks, so that a
 * run stopped before then creates no directory. */
int st_run_dir_lock_existing(trainer *tr) {
  if (tr->comm->rank != 0 || !st_is_dir(tr->rc->out)) return 0;
  return take_run_lock(tr);
}

int st_run_dir_prepare(trainer *tr) {
  const char *out = tr->rc->out;
  if (tr->comm->rank != 0 || tr->lock.held) return 0;
  st_error_code(ST_EXIT_ERROR);
  if (st_mkdir_p(out))
    return st_error_prefix("--out %s is not usable (choose a directory whose parent exists and "
                           "is writable)", out);
  if (take_run_lock(tr)) return -1;
  /* --out did not exist when the checkpoints were resolved: if another job
   * made it and saved since (and has ended, or we would not hold the lock),
   * what was resolved is stale. */
  char ckpt[1100];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", out);
  if (!tr->resume_found && st_is_dir(ckpt))
    return st_error_set("--out %s: another job wrote checkpoints there while this one started; "
                        "run again to resume them (--resume auto) or choose another --out", out);
  return 0;
}

/* 0 when a file can be created in dir, else -1 naming dir and what the run
 * writes there. As root, permission bits do not stop us, so only creating
 * a file tells (a read-only mount, an immutable directory, a full quota). */
static int probe_dir(const char *dir, const char *what, int rank) {
  char probe[1300];
  snprintf(probe, sizeof probe, "%s/.write_probe_%d", dir, rank);
  FILE *f = fopen(probe, "w");
  if (!f)
    return st_error_set("--out: directory %s is not writable (%s); the run writes %s there: make "
                        "it writable or choose another --out", dir, strerror(errno), what);
  fclose(f);
  unlink(probe);
  return 0;
}

/* Every directory the run will write, checked before any compute is spent,
 * not at the first save: --out (metrics.jsonl, run.lock), --out/ckpt (every
 * rank's checkpoint files), an existing metrics.jsonl (appended to), and
 * the directory of --dump-params. Also gives every rank the run identity
 * rank 0's lock holds, which each checkpoint file carries. Collective. */
int st_run_dir_check_writable(trainer *tr) {
  st_run_config *rc = tr->rc;
  const int r = tr->comm->rank;
  st_error_code(ST_EXIT_ERROR);
  if (tr->comm->broadcast(tr->comm, tr->lock.run_id, sizeof tr->lock.run_id, 0))
    return st_error_set("cannot share the run identity between ranks");
  char ckpt[1100], metrics[1100];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", rc->out);
  snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", rc->out);
  /* each rank makes it too: on nodes that do not share --out, rank 0's is
   * invisible here, which check_outdir_shared then names */
  if (st_mkdir_p(rc->out))
    return st_error_prefix("--out %s is not usable (choose a directory whose parent exists and "
                           "is writable)", rc->out);
  if (probe_dir(rc->out, "metrics.jsonl and run.lock", r)) return -1;
  if (st_mkdir_p(ckpt))
    return st_error_prefix("--out %s: cannot create its checkpoint directory", rc->out);
  if (probe_dir(ckpt, "its checkpoints", r)) return -1;
  if (r == 0 && st_path_exists(metrics)) {
    FILE *f = fopen(metrics, "a");
    if (!f)
      return st_error_set("--out: %s cannot be appended to (%s); make it writable or choose "
                          "another --out", metrics, strerror(errno));
    fclose(f);
  }
  if (r == 0 && rc->dump_params[0]) {
    char dir[1100];
    snprintf(dir, sizeof dir, "%s", rc->dump_params);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    if (probe_dir(slash ? (dir[0] ? dir : "/") : ".", "--dump-params", r)) return -1;
  }
  return 0;
}

/* After resume: say what --resume auto had to work around (a missing or
 * damaged latest; rank 0), and refuse to start a run whose saves would
 * land on a complete checkpoint newer than its starting point (a --resume
 * PATH of an earlier step, --resume none, or a fresh start over step
 * directories whose latest is gone and which do not verify): a complete
 * checkpoint is never overwritten. */
int st_run_dir_check_no_overwrite(trainer *tr) {
  const char *notice = st_ckpt_resolve_notice();
  if (tr->comm->rank == 0 && notice[0]) {
    printf("%s\n", notice);
    fflush(stdout);
  }
  char name[64];
  int64_t newest;
  st_ckpt_newest_complete(tr->rc->out, name, sizeof name, &newest);
  if (newest <= tr->step) return 0;
  return st_error_setc(ST_EXIT_CHECKPOINT, "%s/ckpt/%s is a complete checkpoint of a later step "
                       "than this run starts from (%s%lld); training on would overwrite it. "
                       "Resume from it with --resume auto, move it away, or choose a new --out",
                       tr->rc->out, name, tr->step ? "step " : "a fresh start, step ",
                       (long long)tr->step);
}

/* On several nodes the run directory must be one shared filesystem, or each
 * node would write rank files the others (and the index) cannot see. Each
 * node's first rank leaves a marker; every node's first rank looks for all
 * of them. Collective; 0 or -1 with st_error. */
int st_run_dir_check_shared(trainer *tr) {
  const st_env *e = tr->env;
  if (e->node_count < 2) return 0;
  char mine[1200], other[1200];
  snprintf(mine, sizeof mine, "%s/.node_probe_%d", tr->rc->out, e->node_id);
  int failed = 0;
  if (e->local_rank == 0) {
    FILE *f = fopen(mine, "w");
    if (!f || fprintf(f, "%s\n", e->hostname) < 0 || fclose(f) != 0)
      failed = st_error_set("--out %s: cannot write on node %s: %s", tr->rc->out, e->hostname,
                            strerror(errno)) != 0;
  }
  tr->comm->barrier(tr->comm);
  for (int n = 0; n < e->node_count && e->local_rank == 0 && !failed; n++) {
    snprintf(other, sizeof other, "%s/.node_probe_%d", tr->rc->out, n);
    if (!st_path_exists(other))
      failed = st_error_set("--out %s is not shared between nodes: node %d (%s) cannot see the "
                            "file node %d wrote there. Put the run directory on a filesystem "
                            "every node mounts (a cluster home or Lustre/NFS path), not /tmp or "
                            "node-local scratch", tr->rc->out, e->node_id, e->hostname, n) != 0;
  }
  tr->comm->barrier(tr->comm);
  if (e->local_rank == 0) unlink(mine);
  return failed ? -1 : 0;
}
