#!/usr/bin/env bash
# requeue_on_preempt.sh LAUNCH_COMMAND [ARGS...]
#
# Runs the launch command (srun ... or mpirun ... shardtrain train ...) and
# turns shardtrain's "preempted" exit code into a Slurm requeue:
#
#   exit 75 (ST_EXIT_PREEMPTED: a checkpoint was written after SIGUSR1 or
#   SIGTERM)  ->  scontrol requeue "$SLURM_JOB_ID", exit 0
#   anything else                       ->  passed through unchanged
#
# The requeued job runs the same batch script again with SLURM_RESTART_COUNT
# one higher, and `--resume auto` continues from RUN_DIR/ckpt/latest.
#
# SIGUSR1 and SIGTERM that reach this script (sbatch --signal=B:USR1@T,
# scancel --batch or --full, the time limit's SIGTERM) are forwarded to the
# launch command, which forwards them to the ranks, and to the shardtrain
# processes below it on this node (mpirun's local ranks; one rank is enough,
# the ranks agree on a pending signal), so the script never dies of them
# before it can requeue.
#
# Only a job that is still RUNNING (the ranks were warned by --signal or
# `scancel --signal`) or that reached its time limit is requeued; one that
# Slurm is ending for another reason (plain scancel, preemption) is left to
# end: a cancelled job stays cancelled. REQUEUE_ON_PREEMPT=0: never requeue
# (exit 75 is then passed through).
# shellcheck disable=SC2317  # local_ranks and forward run from the traps
set -u

readonly EXIT_PREEMPTED=75
me=requeue_on_preempt
if [ $# -eq 0 ]; then
  echo "usage: $0 LAUNCH_COMMAND [ARGS...]   (e.g. srun --mpi=pmix shardtrain train ...)" >&2
  exit 2
fi

child=""
trapped=0
# Processes named $PREEMPT_RANK_NAME (shardtrain) below pid $1 on this node.
local_ranks() {
  ps -eo pid=,ppid=,comm= 2>/dev/null | awk -v root="$1" -v name="${PREEMPT_RANK_NAME:-shardtrain}" '
    { ppid[$1] = $2; comm[$1] = $3 }
    END { for (p in ppid) { q = p; for (n = 0; n < 64 && q > 1; n++) { q = ppid[q]
            if (q == root) { if (comm[p] == name) print p; break } } } }'
}
forward() {
  local ranks
  trapped=1
  [ -n "$child" ] || return 0
  # The launcher forwards it to every rank (srun does; mpirun should, but
  # some Open MPI builds do not). The ranks on this node also get it
  # directly: one rank is enough, they agree on a pending signal each step.
  ranks=$(local_ranks "$child" | tr '\n' ' ')
  ranks=${ranks% }
  echo "$me: $(date '+%F %T') SIG$1 received; forwarding it to the launcher (pid $child)${ranks:+" and to the ranks here (pids $ranks)"}"
  kill -s "$1" "$child" 2>/dev/null
  # shellcheck disable=SC2086  # a list of pids
  [ -n "$ranks" ] && kill -s "$1" $ranks 2>/dev/null
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM

"$@" &
child=$!
# `wait` returns early (status > 128) when a trapped signal arrives; wait again
# for the launcher's real status (bash keeps it even if the child is gone).
while :; do
  trapped=0
  wait "$child"
  rc=$?
  [ "$trapped" = 1 ] || break
done
trap - USR1 TERM

if [ "$rc" -ne "$EXIT_PREEMPTED" ]; then
  exit "$rc"
fi
if [ "${REQUEUE_ON_PREEMPT:-1}" = 0 ] || [ -z "${SLURM_JOB_ID:-}" ]; then
  echo "$me: preempted (exit $EXIT_PREEMPTED), not requeueing (REQUEUE_ON_PREEMPT=0 or not under Slurm)"
  exit "$rc"
fi
# RUNNING: the ranks were warned (sbatch --signal, scancel --signal) and
# stopped on their own: requeue. Otherwise (COMPLETING, CANCELLED, ...) Slurm
# is already ending the job (scancel, preemption, the time limit): requeue
# only at the time limit, since a cancelled job must stay cancelled and a
# preempted one is requeued by Slurm itself when PreemptMode=REQUEUE.
to_s() { # [D-]HH:MM:SS | MM:SS -> seconds; UNLIMITED etc. -> empty
  local t=$1 d=0 h=0 m=0 s=0
  case $t in *[!0-9:-]*|'') return ;; esac
  case $t in *-*) d=${t%%-*}; t=${t#*-} ;; esac
  IFS=: read -r h m s <<<"$t"
  [ -z "$s" ] && { s=$m; m=$h; h=0; }
  echo $(( 10#$d * 86400 + 10#$h * 3600 + 10#$m * 60 + 10#${s:-0} ))
}
info=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null)
state=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$info")
if [ -n "$state" ] && [ "$state" != RUNNING ]; then
  run=$(to_s "$(sed -n 's/.* RunTime=\([^ ]*\).*/\1/p' <<<"$info")")
  limit=$(to_s "$(sed -n 's/.* TimeLimit=\([^ ]*\).*/\1/p' <<<"$info")")
  if [ -z "$run" ] || [ -z "$limit" ] || [ "$run" -lt "$limit" ]; then
    echo "$me: preempted (exit $EXIT_PREEMPTED) while Slurm was ending job $SLURM_JOB_ID" \
         "(scancel or preemption; JobState=$state); not requeueing. The checkpoint is" \
         "complete: resubmit the same script and --resume auto continues"
    exit "$rc"
  fi
fi
echo "$me: $(date '+%F %T') preempted (exit $EXIT_PREEMPTED): checkpoint written;" \
     "requeueing job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0} -> $(( ${SLURM_RESTART_COUNT:-0} + 1 )))"
if ! scontrol requeue "$SLURM_JOB_ID"; then
  echo "$me: scontrol requeue $SLURM_JOB_ID failed (see above; \"Requested operation is" \
       "presently disabled\" means the job was submitted with --no-requeue, or without" \
       "--requeue where JobRequeue=0); resubmit the same script and --resume auto continues" >&2
  exit "$rc"
fi
exit 0
