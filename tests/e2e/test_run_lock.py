"""A run directory belongs to one job at a time (issue 12, item 3; RUN/run.lock).

- 8 races of two real mpirun jobs (2 ranks each) started together on one
  --out: in every race exactly one trains and exits 0, the other exits 1
  with one line naming the holder (host, pid, since when) and what to do;
  afterwards latest names a complete checkpoint that verifies, and
  metrics.jsonl holds each step once.
- The lock is gone after exit 0, after an error exit (2), after an
  out-of-memory abort (7, MPI_Abort) and after a preemption (75).
- A kill -9'd job leaves its lock behind; the next start takes it over
  with a notice and trains.
- A lock of a live process on this host blocks; one whose pid is alive but
  started at another time (a reused pid) does not; one of the same
  SLURM_JOB_ID (a requeued job) does not, another job id does; a lock from
  another host blocks.
"""
import os
import signal
import socket
import subprocess
import time

from common import check, corpus, losses, parse_args, run, train

a = parse_args()
data = corpus(a)
W = lambda n: os.path.join(a.work, n)
base = ["--data", data, "--model", "tiny", "--seq-len", 32, "--micro-batch", 1,
        "--global-batch", 4, "--val-seqs", 4, "--log-every", 100, "--device", "cpu"]
base = [str(x) for x in base]
env = dict(os.environ, OMP_NUM_THREADS="1")


def mpirun(np, args, extra_env=None):
    cmd = [a.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np",
           str(np), a.bin, "train"] + base + [str(x) for x in args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(env, **(extra_env or {})))


def ours(err):
    return [l for l in err.splitlines() if l.startswith("shardtrain")]


def start_time(pid):
    s = open("/proc/%d/stat" % pid).read()
    return int(s[s.rindex(")") + 2:].split()[19])


def write_lock(out, host, pid, pid_start, job=""):
    os.makedirs(out, exist_ok=True)
    open(os.path.join(out, "run.lock"), "w").write(
        "host=%s\npid=%d\npid_start=%d\nslurm_job_id=%s\nsince=2026-01-02T03:04:05Z\n"
        "since_epoch=0\nrun_id=0123456789abcdef0123456789abcdef\n" % (host, pid, pid_start, job))


# --- two jobs racing on one --out ------------------------------------------
# ST_TEST_LOCK_RACES: fewer races where runs are slow (the sanitizer stage).
for race in range(int(os.environ.get("ST_TEST_LOCK_RACES", "8"))):
    out = W("race%d" % race)
    # The job that wins holds the lock past the ~2 s a live holder is looked
    # at again before a refusal, on any machine: its rank 0 sleeps 5 s before
    # step 2 (ST_FAULT_STALL; the loser never reaches a step). Without it,
    # 200 steps were not enough on a fast machine or with the second job
    # started late on busy cores: the first ended inside that window and the
    # second, finding the run done, also exited 0 (seen on 2026-12-04).
    jobs = [mpirun(2, ["--steps", 60, "--ckpt-every", 20, "--out", out],
                   {"ST_FAULT_STALL": "0:2:5"}) for _ in range(2)]
    res = [(p.wait(timeout=300),) + p.communicate() for p in jobs]
    rcs = sorted(r[0] for r in res)
    check(rcs == [0, 1], "race %d: one job exits 0, the other 1 (got %s)" % (race, rcs))
    won = [r for r in res if r[0] == 0][0]
    lost = [r for r in res if r[0] == 1][0]
    msg = ours(lost[2])
    check(len(msg) == 1 and "is in use by another job: host %s, pid " % socket.gethostname()
          in msg[0] and "since " in msg[0] and "run.lock" in msg[0],
          "race %d: the refused job names the holder in one line" % race)
    check("done: step 60" in won[1] and "done:" not in lost[1] and "checkpoint:" not in lost[1],
          "race %d: exactly one trained" % race)
    check(open(os.path.join(out, "ckpt", "latest")).read().strip() == "step_00000060",
          "race %d: latest names step 60" % race)
    run([a.bin, "ckpt", "verify", out])
    check(sorted(losses(out)) == list(range(1, 61)) and
          sum(1 for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l) == 60,
          "race %d: metrics.jsonl holds steps 1-60 once each" % race)
    check(not os.path.exists(os.path.join(out, "run.lock")), "race %d: the lock is released" % race)
print("ok: the refusal reads: " + msg[0])

# --- released at an error exit and at preemption -----------------------------
out = W("race0")  # latest is step 60: --steps 20 is below it (exit 2, after the lock)
r = train(a, 2, base + ["--steps", 20, "--out", out], expect_rc=2)
check("--steps 20 is below" in r.stderr and not os.path.exists(os.path.join(out, "run.lock")),
      "an error exit after the lock was taken releases it")
r = train(a, 1, base + ["--steps", 4, "--out", W("oom")], env={"ST_FAULT_OOM": "2"}, expect_rc=7)
check(not os.path.exists(os.path.join(W("oom"), "run.lock")),
      "an out-of-memory abort (exit 7, MPI_Abort) releases the lock")
out = W("preempt")
p = mpirun(2, ["--steps", 100000, "--out", out])
metrics = os.path.join(out, "metrics.jsonl")
deadline = time.time() + 60
while time.time() < deadline and (not os.path.exists(metrics) or
                                  sum(1 for _ in open(metrics)) < 5):
    time.sleep(0.05)
check(os.path.exists(os.path.join(out, "run.lock")), "a running job holds run.lock")
p.send_signal(signal.SIGUSR1)
rc = p.wait(timeout=120)
p.communicate()
check(rc == 75 and not os.path.exists(os.path.join(out, "run.lock")),
      "preempted (exit %d): the lock is released" % rc)

# --- a kill -9'd job's lock is stale --------------------------------------------
out = W("killed")
p = mpirun(1, ["--steps", 100000, "--out", out])
lock = os.path.join(out, "run.lock")
deadline = time.time() + 60
while time.time() < deadline and not (os.path.exists(lock) and
                                      os.path.exists(os.path.join(out, "metrics.jsonl"))):
    time.sleep(0.05)
holder = dict(l.split("=", 1) for l in open(lock).read().splitlines())
os.kill(int(holder["pid"]), signal.SIGKILL)
p.wait(timeout=60)
p.communicate()
check(os.path.exists(lock), "kill -9 leaves run.lock behind")
r = train(a, 1, base + ["--steps", 4, "--out", out])
check("was held by host %s, pid %s" % (socket.gethostname(), holder["pid"]) in r.stdout and
      "no longer runs" in r.stdout and "taken over" in r.stdout and "done: step 4" in r.stdout,
      "the next start takes over the dead job's lock with a notice and trains")
check(not os.path.exists(lock), "and releases it at the end")

# --- live, reused, requeued, other host -----------------------------------------
me, host = os.getpid(), socket.gethostname()
out = W("live")
write_lock(out, host, me, start_time(me))
r = train(a, 2, base + ["--steps", 2, "--out", out], expect_rc=1)
check(len(ours(r.stderr)) == 1 and "is in use by another job: host %s, pid %d, since "
      "2026-01-02T03:04:05Z" % (host, me) in r.stderr,
      "a live process on this host blocks: %s" % ours(r.stderr))
check(os.path.exists(os.path.join(out, "run.lock")) and
      "pid=%d\n" % me in open(os.path.join(out, "run.lock")).read(), "and its lock stays")
check(not os.path.exists(os.path.join(out, "ckpt")), "the refused job wrote nothing")

out = W("reused")
write_lock(out, host, me, start_time(me) + 12345)
r = train(a, 2, base + ["--steps", 2, "--out", out])
check("now belongs to another process" in r.stdout and "done: step 2" in r.stdout,
      "a live pid with another start time (pid reuse) does not block")

out = W("requeued")
write_lock(out, host, me, start_time(me), job="424242")
r = train(a, 2, base + ["--steps", 2, "--out", out], env={"SLURM_JOB_ID": "424242"})
check("same Slurm job 424242" in r.stdout and "done: step 2" in r.stdout,
      "the same SLURM_JOB_ID (a requeued job) is let through")
write_lock(out, host, me, start_time(me), job="424242")
r = train(a, 2, base + ["--steps", 4, "--out", out], env={"SLURM_JOB_ID": "7"}, expect_rc=1)
check("Slurm job 424242" in r.stderr, "another Slurm job id is blocked, and named")

out = W("elsewhere")
write_lock(out, "some-other-node", 1, 0)
r = train(a, 2, base + ["--steps", 2, "--out", out], expect_rc=1)
check("host some-other-node, pid 1" in r.stderr and "if that job is gone, remove" in r.stderr,
      "a lock of another host blocks and says how to clear it")
print("PASS")
