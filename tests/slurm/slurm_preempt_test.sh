#!/usr/bin/env bash
# slurm_preempt_test.sh BUILD_DIR SRC_DIR
#
# Real Slurm on this machine: starts munged, slurmctld and slurmd on a
# private slurm.conf (temp dir, own ports and munge socket), submits the
# shipped slurm/train_cpu_1node.sbatch with 2 tasks, sends SIGUSR1 to the job
# steps mid-run (`scancel --signal=USR1`, what `#SBATCH --signal=USR1@T`
# does before a time limit), lets the job checkpoint, exit 75, requeue itself
# through slurm/requeue_on_preempt.sh and finish with `--resume auto`; then
# trains the same config uninterrupted under `mpirun -np 2` and checks:
#
#   - every step's loss and the final validation loss equal the uninterrupted
#     run's bit for bit (same rank count: the resume is bit exact, and srun and
#     mpirun run the same binary, MPI library and reduction order), and the
#     final parameters (--dump-params) are byte-identical;
#   - the job log shows "preempted:", the wrapper's requeue and "restart 1";
#     Slurm reports Restarts=1 and ExitCode 0:0;
#   - `shardtrain ckpt verify` passes on the run directory.
#
# Needs root and Debian's slurmctld, slurmd, slurm-client, munge (and
# libpmix-dev for srun --mpi=pmix with Open MPI); exits 77 (skip) without
# them. The daemons are stopped at the end, pass or fail: by PID, SIGTERM,
# then SIGKILL after a timeout, and any slurmstepd or job process left over
# (found by a marker variable only they carry) the same way.
# Environment: KEEP_TMP=1 keeps the temp dir; ST_SLURM_STEPS (2500).
# shellcheck disable=SC2317  # the cleanup functions run from the EXIT trap
set -uo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 BUILD_DIR SRC_DIR" >&2
  exit 2
fi
BUILD=$(cd "$1" && pwd) || exit 2
SRC=$(cd "$2" && pwd) || exit 2
BIN=$BUILD/shardtrain
TEMPLATE=$SRC/slurm/train_cpu_1node.sbatch
STEPS=${ST_SLURM_STEPS:-2500}
T0=$(date +%s)

say() { echo "[slurm-test $(( $(date +%s) - T0 ))s] $*"; }
skip() { echo "SKIP: e2e_slurm_preempt: $*"; exit 77; }

# ---------------------------------------------------------------- preconditions
[ "$(id -u)" -eq 0 ] || skip "needs root (it starts munged, slurmctld and slurmd)"
sbin() { command -v "$1" 2>/dev/null || { [ -x "/usr/sbin/$1" ] && echo "/usr/sbin/$1"; }; }
SLURMCTLD=$(sbin slurmctld) SLURMD=$(sbin slurmd) MUNGED=$(sbin munged)
if [ -z "$SLURMCTLD" ] || [ -z "$SLURMD" ] || [ -z "$MUNGED" ]; then
  skip "slurmctld, slurmd or munged not installed (Debian: apt-get install slurmctld slurmd slurm-client munge libpmix-dev)"
fi
for c in sbatch scontrol sinfo squeue scancel srun; do
  command -v "$c" >/dev/null || skip "$c not installed (Debian package slurm-client)"
done

FAILED=""
fail() { FAILED="$*"; echo "FAIL: e2e_slurm_preempt: $*"; exit 1; }
# A Slurm client retries an unreachable slurmctld for a minute or more: bound
# every call, so the EXIT trap always gets to stop the daemons.
for c in sbatch scontrol sinfo squeue scancel srun; do
  eval "$c() { timeout -k 5 20 $(command -v "$c") \"\$@\"; }"
done
for f in "$BIN" "$TEMPLATE" "$SRC/slurm/requeue_on_preempt.sh"; do
  [ -e "$f" ] || fail "$f missing"
done
command -v mpirun >/dev/null || fail "mpirun missing (openmpi-bin)"
command -v bible >/dev/null || fail "bible missing (Debian package bible-kjv)"
PY=/usr/bin/python3
[ -x "$PY" ] || fail "$PY missing"

T=$(mktemp -d /tmp/st_slurm.XXXXXX) || fail "mktemp"
chmod 755 "$T"
HOST=$(hostname -s)
# Only the daemons and the job carry this variable: cleanup finds leftovers by it.
MARK="ST_SLURM_TEST_MARK=$T"
CONF=$T/slurm.conf
export SLURM_CONF=$CONF
PIDS_DAEMON=()   # slurmd, slurmctld (in that stop order)
MUNGE_PID=""

# ---------------------------------------------------------------- cleanup
wait_gone() { # seconds pid... -> 0 when all are gone
  local t=$1 p alive; shift
  for _ in $(seq $(( t * 10 ))); do
    alive=0
    for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && return 0
    sleep 0.1
  done
  return 1
}
stop_pids() { # name pid...: SIGTERM, wait 10 s, SIGKILL, wait 5 s
  local name=$1 p; shift
  [ $# -eq 0 ] && return 0
  kill -TERM "$@" 2>/dev/null
  if ! wait_gone 10 "$@"; then
    for p in "$@"; do
      kill -0 "$p" 2>/dev/null && { echo "cleanup: $name pid $p ignored SIGTERM; SIGKILL"; kill -KILL "$p" 2>/dev/null; }
    done
    wait_gone 5 "$@" || echo "cleanup: $name pid(s) $* still there after SIGKILL"
  fi
}
marked_pids() { # processes (not this shell) whose environment carries $MARK
  local e p
  for e in /proc/[0-9]*/environ; do
    p=${e#/proc/}; p=${p%/environ}
    [ "$p" = $$ ] && continue
    { tr '\0' '\n' < "$e"; } 2>/dev/null | grep -qxF "$MARK" && echo "$p"
  done
}
cleanup() {
  local rc=$? leftovers
  set +e
  trap - EXIT INT TERM ALRM
  [ -n "${WATCHDOG:-}" ] && kill -TERM "$WATCHDOG" 2>/dev/null
  if [ -n "${CTLD_STARTED:-}" ] && [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
    echo "cleanup: cancelling jobs $(squeue -h -o %i | tr '\n' ' ')"
    squeue -h -o %i 2>/dev/null | xargs -r timeout 20 scancel --quiet 2>/dev/null
    for _ in $(seq 50); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  stop_pids "slurm daemon" "${PIDS_DAEMON[@]}"
  # slurmstepd (job steps) and job processes outlive slurmd: stop them by PID.
  mapfile -t leftovers < <(marked_pids)
  if [ ${#leftovers[@]} -gt 0 ]; then
    echo "cleanup: stopping leftover slurmstepd/job processes: ${leftovers[*]}"
    stop_pids "leftover" "${leftovers[@]}"
  fi
  [ -n "$MUNGE_PID" ] && stop_pids munged "$MUNGE_PID"
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
    for f in "$T"/log/slurmctld.log "$T"/log/slurmd.log "$T"/*.out "$T"/ref.log "$T"/munge/munged.log; do
      [ -f "$f" ] || continue
      echo "---- last lines of $f"
      tail -n 25 "$f"
    done
    [ -n "$FAILED" ] || echo "FAIL: e2e_slurm_preempt: exit code $rc"
  fi
  if [ "${KEEP_TMP:-0}" = 1 ] || { [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; }; then
    echo "temp dir kept: $T"
  else
    rm -rf "$T"
  fi
  echo "slurm test: $(( $(date +%s) - T0 )) s"
  exit "$rc"
}
trap cleanup EXIT
trap 'fail "interrupted"' INT TERM
# Watchdog: SIGALRM after LIMIT s fails the test (and so cleans up) before a
# ctest TIMEOUT would SIGKILL it with the daemons still running.
LIMIT=${ST_SLURM_TEST_LIMIT:-240}
trap 'fail "timed out after $LIMIT s (ST_SLURM_TEST_LIMIT)"' ALRM
( trap 'kill "$sp" 2>/dev/null; exit 0' TERM; sleep "$LIMIT" & sp=$!; wait "$sp"; kill -ALRM $$ ) &
WATCHDOG=$!

# ---------------------------------------------------------------- munge
KEY=/etc/munge/munge.key
if [ ! -s "$KEY" ]; then
  say "creating $KEY"
  install -d -o munge -g munge -m 0700 /etc/munge || fail "cannot create /etc/munge"
  if command -v mungekey >/dev/null; then
    mungekey --create --keyfile="$KEY" >/dev/null 2>&1 || rm -f "$KEY"
  fi
  [ -s "$KEY" ] || dd if=/dev/urandom of="$KEY" bs=1 count=1024 status=none || fail "cannot write $KEY"
  chown munge:munge "$KEY" && chmod 0400 "$KEY"
fi
install -d -o munge -g munge -m 0711 "$T/munge"
SOCK=$T/munge/munge.socket
as_munge() {
  if command -v runuser >/dev/null; then runuser -u munge -- "$@"
  else su -s /bin/sh munge -c "$(printf '%q ' "$@")"; fi
}
as_munge "$MUNGED" --socket="$SOCK" --pid-file="$T/munge/munged.pid" \
  --log-file="$T/munge/munged.log" --seed-file="$T/munge/munged.seed" ||
  fail "munged did not start (see $T/munge/munged.log)"
MUNGE_PID=$(cat "$T/munge/munged.pid" 2>/dev/null)
[ -n "$MUNGE_PID" ] || fail "munged wrote no pid file"
munge -S "$SOCK" -n </dev/null | unmunge -S "$SOCK" >/dev/null || fail "munge round trip failed"
say "munged pid $MUNGE_PID (socket $SOCK)"

# ---------------------------------------------------------------- slurm.conf
mkdir -p "$T/state" "$T/spool" "$T/log" "$T/tmp"
# Two ports below Linux's ephemeral range (32768 up), which clients' own
# ports come from, and free now: a clash there failed a fresh clone's run.
for _ in $(seq 50); do
  PORT=$(( 20000 + RANDOM % 12000 ))
  python3 -c 'import socket,sys
for p in (int(sys.argv[1]), int(sys.argv[1]) + 1):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("", p)); s.close()' \
    "$PORT" 2>/dev/null && break
done
MEM=$(awk '/^MemAvailable:/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
cat > "$CONF" <<EOF
# Written by tests/slurm/slurm_preempt_test.sh: one node, this machine.
ClusterName=sttest
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$(( PORT + 1 ))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
# Slurm's per-job temporary files (PMIx's among them) stay in the test's
# directory. Two copies of this test at once on one machine still collide
# (seen: pmixp_stepd_init failed), hence RUN_SERIAL in tests/CMakeLists.txt.
TmpFS=$T/tmp
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
JobRequeue=1
SlurmdParameters=config_overrides
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

# ---------------------------------------------------------------- daemons
env "$MARK" "$SLURMCTLD" -D -i -f "$CONF" > "$T/log/slurmctld.out" 2>&1 &
PIDS_DAEMON=("$!")
CTLD_STARTED=1
env "$MARK" "$SLURMD" -D -N "$HOST" -f "$CONF" > "$T/log/slurmd.out" 2>&1 &
PIDS_DAEMON=("$!" "${PIDS_DAEMON[@]}")
say "slurmctld pid ${PIDS_DAEMON[1]}, slurmd pid ${PIDS_DAEMON[0]}, ports $PORT/$(( PORT + 1 ))"
state=""
for _ in $(seq 60); do
  state=$(sinfo -h -n "$HOST" -o %T 2>/dev/null)
  [ "$state" = idle ] && break
  for p in "${PIDS_DAEMON[@]}"; do kill -0 "$p" 2>/dev/null || fail "a Slurm daemon exited at start-up"; done
  sleep 0.5
done
[ "$state" = idle ] || fail "node $HOST not idle after 30 s (sinfo: '${state}')"
srun --mpi=list 2>&1 | grep -qw pmix || fail "srun --mpi=list has no pmix (Debian: slurm-wlm-basic-plugins)"
say "node $HOST idle; srun --mpi=list has pmix"

# ---------------------------------------------------------------- data
bible -f "gen1:1-exo40:38" > "$T/gx.txt" || fail "bible -f failed"
"$BIN" prep --input "$T/gx.txt" --out "$T/gx.h5" > "$T/prep.log" 2>&1 || fail "prep: $(cat "$T/prep.log")"

# ---------------------------------------------------------------- the job
RUN=$T/run_slurm
REF=$T/run_ref
TRAIN_ENV=(SHARDTRAIN_HOME="$SRC" SHARDTRAIN="$BIN" DATA="$T/gx.h5" RUN_DIR="$RUN"
           MODEL=tiny SEQ_LEN=32 MICRO_BATCH=2 GLOBAL_BATCH=4 ZERO=1 STEPS="$STEPS" CKPT_EVERY=50
           EXTRA_ARGS="--dump-params $T/params_slurm.bin")
cd "$T" || fail "cd $T"
JOB=$(env "$MARK" "${TRAIN_ENV[@]}" timeout 20 sbatch --parsable --ntasks=2 --cpus-per-task=1 \
        --job-name=st_preempt "$TEMPLATE" 2>"$T/sbatch.err") || fail "sbatch: $(cat "$T/sbatch.err")"
JOB=${JOB%%;*}
LOG=$T/st_preempt-$JOB.out
say "submitted job $JOB ($TEMPLATE, 2 tasks, $STEPS steps)"

job_field() { scontrol show job -o "$JOB" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p"; }
last_step() { # last training step in metrics.jsonl, 0 if none
  [ -f "$RUN/metrics.jsonl" ] || { echo 0; return; }
  sed -n 's/^{"step":\([0-9]*\),"loss".*/\1/p' "$RUN/metrics.jsonl" | tail -n 1 | grep . || echo 0
}

step=0
SIGNAL_AT=$(( STEPS / 4 ))   # mid-run, between two checkpoints most of the time
deadline=$(( SECONDS + 60 ))
while [ $SECONDS -lt $deadline ]; do
  step=$(last_step)
  [ "$step" -ge "$SIGNAL_AT" ] && break
  js=$(job_field JobState)
  case $js in
    PENDING|RUNNING|CONFIGURING) ;;
    *) fail "job $JOB is ${js:-unknown (scontrol failed)} before training $SIGNAL_AT steps" ;;
  esac
  sleep 0.1
done
if [ "$step" -lt "$SIGNAL_AT" ]; then
  grep -i pmix "$T/log/slurmd.log" | tail -n 3
  fail "job at step $step, not $SIGNAL_AT, after 60 s (a step that hangs at start: slurmd.log 'can not load PMIx library' means libpmix-dev is missing)"
fi
[ "$step" -lt "$STEPS" ] || fail "job finished before it could be signalled"
say "job $JOB at step $step; scancel --signal=USR1 $JOB (to the job steps, as --signal=USR1@T does)"
scancel --signal=USR1 "$JOB" || fail "scancel --signal=USR1 failed"

# Requeued: Slurm holds it with Reason=BeginTime for ~2 minutes (AuthInfo
# cred_expire, 120 s by default): slurmd revoked the old credentials when it
# killed the job, and a credential made in the same second is refused ("Job
# credential revoked", the job FAILS). A test need not wait 2 minutes, but
# starts it 3 s after the requeue, not at once (and with starttime=now after
# a sleep, not starttime=now+3: that would wait for the next periodic
# scheduling pass, up to a minute).
released=0
final=""
deadline=$(( SECONDS + 120 ))
while [ $SECONDS -lt $deadline ]; do
  js=$(job_field JobState)
  if [ "$js" = PENDING ] && [ "$(job_field Restarts)" -ge 1 ] && [ $released = 0 ] &&
     [ "$(job_field Reason)" = BeginTime ]; then
    say "job $JOB requeued (Restarts=$(job_field Restarts)), held until $(job_field StartTime); in 3 s: scontrol update starttime=now"
    sleep 3
    scontrol update jobid="$JOB" starttime=now || fail "scontrol update starttime=now failed"
    released=1
  fi
  case $js in
    COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)
      final=$js; break ;;
  esac
  sleep 0.1
done
[ -n "$final" ] || fail "job $JOB did not finish within 120 s of the signal (JobState $(job_field JobState))"
restarts=$(job_field Restarts)
exitcode=$(job_field ExitCode)
say "job $JOB $final, Restarts=$restarts, ExitCode=$exitcode"
if [ "$final" != COMPLETED ] || [ "$exitcode" != 0:0 ]; then
  fail "job $JOB ended $final with ExitCode $exitcode"
fi
[ "$restarts" = 1 ] || fail "job $JOB has Restarts=$restarts, expected 1"

# ---------------------------------------------------------------- the log
grep -q '^preempted: SIGUSR1 received; checkpoint of step [0-9]* is latest; exiting with code 75' "$LOG" ||
  fail "no 'preempted: SIGUSR1 ...' line in $LOG"
grep -q '^requeue_on_preempt: .*requeueing job '"$JOB" "$LOG" || fail "no requeue line from requeue_on_preempt.sh in $LOG"
grep -q "slurm      job $JOB, nodes $HOST, restart 0" "$LOG" || fail "no 'restart 0' line in $LOG"
grep -q "slurm      job $JOB, nodes $HOST, restart 1" "$LOG" || fail "no 'restart 1' line in $LOG (SLURM_RESTART_COUNT)"
grep -q "(SLURM_NODEID 0): rank->device 0->cpu 1->cpu" "$LOG" || fail "no rank map with SLURM_NODEID in $LOG"
grep -q "launched by srun" "$LOG" || fail "the ranks were not launched by srun"
grep -q "resumed from $RUN/ckpt/step_" "$LOG" || fail "the second leg did not resume from a checkpoint"
pstep=$(sed -n 's/^preempted: SIGUSR1 received; checkpoint of step \([0-9]*\) is latest.*/\1/p' "$LOG" | head -n 1)
say "log: preempted at step $pstep, requeued, restart 1 resumed from step_$(printf %08d "$pstep")"

# ---------------------------------------------------------------- checkpoint
"$BIN" ckpt verify "$RUN" > "$T/verify.log" 2>&1 || fail "ckpt verify $RUN: $(cat "$T/verify.log")"
grep -q "step $STEPS," "$T/verify.log" || fail "latest checkpoint is not step $STEPS: $(head -n 2 "$T/verify.log")"
grep -q "verify: OK" "$T/verify.log" || fail "ckpt verify printed no OK"
say "ckpt verify $RUN: OK (step $STEPS, written by 2 ranks)"

# ---------------------------------------------------------------- reference
say "uninterrupted reference: mpirun -np 2, same flags"
# In the background with the marker, so the watchdog can interrupt `wait`
# and cleanup finds mpirun and its ranks.
env "$MARK" OMP_NUM_THREADS=1 mpirun -np 2 --allow-run-as-root --oversubscribe --bind-to none \
  "$BIN" train --device cpu --data "$T/gx.h5" --out "$REF" --resume auto --model tiny --seq-len 32 \
  --micro-batch 2 --global-batch 4 --zero 1 --steps "$STEPS" --ckpt-every 50 \
  --dump-params "$T/params_ref.bin" > "$T/ref.log" 2>&1 &
wait $! || fail "reference run failed (exit $?, $T/ref.log)"

# ---------------------------------------------------------------- compare
# Bit for bit: same rank count, binary and MPI reduction order, and the
# resume restores parameters, Adam state, data position and RNG exactly; the
# metrics print floats with 9 significant digits, enough to round-trip fp32.
"$PY" - "$RUN/metrics.jsonl" "$REF/metrics.jsonl" "$STEPS" "$pstep" <<'EOF' || fail "losses differ (above)"
import json, sys
run_path, ref_path, steps, pstep = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def load(path):
    train, val = {}, {}
    for line in open(path):
        d = json.loads(line)
        if "loss" in d:
            train.setdefault(d["step"], []).append(d["loss"])
        elif "val_loss" in d:
            val.setdefault(d["step"], []).append(d["val_loss"])
    return train, val
run, run_val = load(run_path)
ref, ref_val = load(ref_path)
bad = []
if sorted(ref) != list(range(1, steps + 1)):
    bad.append("reference metrics do not hold steps 1..%d" % steps)
if sorted(run) != list(range(1, steps + 1)):
    missing = sorted(set(range(1, steps + 1)) - set(run))
    bad.append("preempted run misses steps %s" % missing[:10])
dups = [s for s, v in run.items() if len(v) > 1]
if dups:
    bad.append("steps logged twice in the preempted run: %s" % dups[:10])
diff = [(s, r, ref[s][0]) for s in sorted(run) for r in run[s] if s in ref and r != ref[s][0]]
maxd = max((abs(a - b) for _, a, b in diff), default=0.0)
for s, a, b in diff[:5]:
    bad.append("step %d: loss %.9g after preemption vs %.9g uninterrupted" % (s, a, b))
if run_val.get(steps) != ref_val.get(steps):
    bad.append("final val loss %s vs %s" % (run_val.get(steps), ref_val.get(steps)))
tail = list(range(max(1, steps - 4), steps + 1))
print("losses: %d steps compared, %d differ (max |diff| %.3g); preempted at %d; "
      "final train loss %.9g vs %.9g, val loss %s vs %s; last 5: %s"
      % (len(run), len(diff), maxd, pstep, run[steps][0] if steps in run else float("nan"),
         ref[steps][0] if steps in ref else float("nan"), run_val.get(steps), ref_val.get(steps),
         " ".join("%.6f" % run[s][0] for s in tail if s in run)))
for b in bad:
    print("  " + b)
sys.exit(1 if bad else 0)
EOF
cmp -s "$T/params_slurm.bin" "$T/params_ref.bin" ||
  fail "final parameters differ between the preempted job and the uninterrupted run"
say "final parameters byte-identical ($(stat -c %s "$T/params_ref.bin") bytes)"

echo "PASS: e2e_slurm_preempt: job $JOB preempted at step $pstep by SIGUSR1, requeued (Restarts=1)," \
     "resumed and finished $STEPS steps bit-identical to an uninterrupted run; ckpt verify OK"
exit 0
