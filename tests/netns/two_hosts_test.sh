#!/usr/bin/env bash
# two_hosts_test.sh - two "hosts" on one machine: two network namespaces
# joined by a veth pair, one rank in each under Open MPI over TCP. Checks
#   1. the trainer sees 2 nodes and its losses, gradient norms, validation
#      loss and final parameters equal a single-host `mpirun -np 2` run bit
#      for bit (2 ranks: every reduction is a + b, whatever the transport);
#   2. a run directory host 2 cannot see (a private tmpfs over its parent on
#      that host only) stops the run with one "is not shared between nodes"
#      message naming --out, a non-zero exit, and no files left in it.
#
#   tests/netns/two_hosts_test.sh --bin build/shardtrain --mpirun mpirun --work DIR
#
# Needs root, iproute2 (`ip netns`) and util-linux (`unshare`); exits 77
# (skip) with one line when namespaces cannot be made. The namespaces, the
# veth pair, the mounts and any process left in the namespaces are removed on
# every exit. Addresses 10.231.7.1/.2 exist only inside these namespaces.
set -uo pipefail

BIN= MPIRUN=mpirun WORK=
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$2; shift 2 ;;
    --mpirun) MPIRUN=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    *) echo "usage: $0 --bin PATH [--mpirun PATH] --work DIR" >&2; exit 2 ;;
  esac
done
[ -n "$BIN" ] && [ -n "$WORK" ] || { echo "usage: $0 --bin PATH [--mpirun PATH] --work DIR" >&2; exit 2; }

T0=$(date +%s%N)
HERE=$(cd "$(dirname "$0")" && pwd)
AGENT=$HERE/netns_rsh
PY=/usr/bin/python3

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
ok() { echo "ok: $*"; }

# ---- can we make namespaces at all? (skip, never fail, when not) ----------
[ "$(id -u)" -eq 0 ] || skip "two-host test needs root to create network namespaces"
command -v ip >/dev/null 2>&1 || skip "no 'ip' command (install iproute2)"
command -v unshare >/dev/null 2>&1 || skip "no 'unshare' command (install util-linux)"
command -v hostname >/dev/null 2>&1 || skip "no 'hostname' command (install hostname)"

BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
[ -x "$BIN" ] || fail "--bin $BIN is not an executable"
command -v "$MPIRUN" >/dev/null 2>&1 || fail "--mpirun $MPIRUN not found"
MPIRUN=$(command -v "$MPIRUN")

NS1=st-h1-$$ NS2=st-h2-$$ VA=st-va-$$ VB=st-vb-$$
IP1=10.231.7.1 IP2=10.231.7.2 NET=10.231.7.0/24
mkdir -p "$WORK" || fail "cannot create --work $WORK"
WORK=$(cd "$WORK" && pwd)
PRIV=$WORK/private             # host 2 gets an empty tmpfs here in the negative test
NETNS_WAS_MOUNT=0
mountpoint -q /run/netns 2>/dev/null && NETNS_WAS_MOUNT=1

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for ns in "$NS1" "$NS2"; do
    [ -e "/run/netns/$ns" ] || continue
    # Processes we started (orted, ranks) that outlived a failed mpirun.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null   # deleting a namespace deletes its veth end and the peer
  done
  ip link del "$VA" 2>/dev/null      # only if it was made but never moved into a namespace
  # The private tmpfs lives in a private mount namespace and dies with it; be sure.
  while grep -q " $PRIV " /proc/mounts 2>/dev/null; do umount -l "$PRIV" 2>/dev/null || break; done
  # `ip netns add` bind-mounts /run/netns onto itself the first time; undo
  # that only if we caused it and nobody else has a namespace there.
  if [ "$NETNS_WAS_MOUNT" = 0 ] && mountpoint -q /run/netns 2>/dev/null &&
     [ -z "$(ls -A /run/netns 2>/dev/null)" ]; then
    umount /run/netns 2>/dev/null
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Namespaces of an earlier run of this test that was killed outright (its pid is gone).
for f in /run/netns/st-h[12]-*; do
  [ -e "$f" ] || continue
  old=${f##*-}
  case "$old" in *[!0-9]*) continue ;; esac
  kill -0 "$old" 2>/dev/null && continue
  for pid in $(ip netns pids "${f##*/}" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
  ip netns del "${f##*/}" 2>/dev/null && echo "removed stale namespace ${f##*/}"
done

err=$(ip netns add "$NS1" 2>&1) || skip "cannot create a network namespace: ${err:-ip netns add refused}"
err=$(ip netns add "$NS2" 2>&1) || skip "cannot create a network namespace: ${err:-ip netns add refused}"
err=$(ip link add "$VA" netns "$NS1" type veth peer name "$VB" netns "$NS2" 2>&1) ||
  skip "cannot create a veth pair between namespaces: $err"
ip -n "$NS1" addr add "$IP1/24" dev "$VA" && ip -n "$NS2" addr add "$IP2/24" dev "$VB" &&
  ip -n "$NS1" link set lo up && ip -n "$NS2" link set lo up &&
  ip -n "$NS1" link set "$VA" up && ip -n "$NS2" link set "$VB" up ||
  fail "cannot configure the veth pair"
ok "namespaces $NS1 ($IP1) and $NS2 ($IP2) joined by veth $VA/$VB"

# ---- corpus (same text as tests/e2e/common.py) ------------------------------
rm -rf "$WORK/corpus.txt" "$WORK/corpus.h5" "$WORK/run_1host" "$WORK/run_2host" "$PRIV"
bible -f "gen1:1-exo40:38" > "$WORK/corpus.txt" || fail "bible (bible-kjv) failed"
"$BIN" prep --input "$WORK/corpus.txt" --out "$WORK/corpus.h5" > "$WORK/prep.log" 2>&1 ||
  { cat "$WORK/prep.log"; fail "prep failed"; }

printf '%s slots=1\n%s slots=1\n' "$IP1" "$IP2" > "$WORK/hostfile"
export NETNS_MAP="$IP1=$NS1 $IP2=$NS2"
TRAIN=(train --data "$WORK/corpus.h5" --model tiny --seq-len 32 --micro-batch 2
       --global-batch 4 --steps 10)

# mpirun on host 1: its own network and UTS namespace (host name = namespace name).
# Every mpirun gets at most 15 s, and none runs past 50 s after the start, so
# the whole test stays under a minute even when a run hangs.
in_host1() {
  local left=$(( 50 - ($(date +%s%N) - T0) / 1000000000 ))
  [ $left -gt 15 ] && left=15
  [ $left -gt 0 ] || { echo "time budget (50 s) spent before: $*"; return 124; }
  # In the background so that a SIGINT/SIGTERM to this script interrupts
  # `wait` and the cleanup runs at once instead of after the run.
  timeout -k 3 $left ip netns exec "$NS1" unshare --uts \
    sh -c 'hostname "$0" && exec "$@"' "$NS1" "$@" &
  wait $!
}
two_hosts() {
  in_host1 "$MPIRUN" --allow-run-as-root --bind-to none -np 2 --hostfile "$WORK/hostfile" \
    --mca plm_rsh_agent "$AGENT" --mca plm_rsh_no_tree_spawn 1 \
    --mca btl tcp,self --mca btl_tcp_if_include "$NET" --mca oob_tcp_if_include "$NET" \
    -x OMP_NUM_THREADS=1 "$BIN" "${TRAIN[@]}" "$@"
}
show() { echo "---- $1"; tail -n 40 "$1"; echo "----"; }

# ---- 1. two hosts vs one host -------------------------------------------------
two_hosts --out "$WORK/run_2host" --dump-params "$WORK/params_2host.f32" > "$WORK/two_hosts.log" 2>&1
rc=$?
[ $rc -eq 0 ] || { show "$WORK/two_hosts.log"; fail "two-host run exited $rc"; }
ok "two-host run finished"
grep -q "ranks      2 on 2 node(s)" "$WORK/two_hosts.log" ||
  { show "$WORK/two_hosts.log"; fail "trainer did not see 2 nodes"; }
grep -Eq "^  node 0 +$NS1: rank->device 0->cpu$" "$WORK/two_hosts.log" &&
  grep -Eq "^  node 1 +$NS2: rank->device 1->cpu$" "$WORK/two_hosts.log" ||
  { show "$WORK/two_hosts.log"; fail "rank map does not show rank 0 on $NS1 and rank 1 on $NS2"; }
ok "trainer reports 2 node(s): rank 0 on $NS1, rank 1 on $NS2"

# The single-host reference: plain `mpirun -np 2` (shared-memory transport),
# run on host 1 so no traffic leaves the test's namespaces.
in_host1 "$MPIRUN" --allow-run-as-root --oversubscribe --bind-to none -np 2 -x OMP_NUM_THREADS=1 \
  "$BIN" "${TRAIN[@]}" --out "$WORK/run_1host" --dump-params "$WORK/params_1host.f32" \
  > "$WORK/one_host.log" 2>&1
rc=$?
[ $rc -eq 0 ] || { show "$WORK/one_host.log"; fail "single-host run exited $rc"; }
grep -q "ranks      2 on 1 node(s)" "$WORK/one_host.log" ||
  { show "$WORK/one_host.log"; fail "single-host run did not see 1 node"; }
ok "single-host run finished (2 ranks on 1 node)"

"$PY" - "$WORK/run_1host/metrics.jsonl" "$WORK/run_2host/metrics.jsonl" 2>&1 <<'EOF' || fail "two-host metrics differ from single-host"
import json, sys
def load(p):
    train, val = {}, {}
    for line in open(p):
        d = json.loads(line)
        if "loss" in d: train[d["step"]] = (d["loss"], d["grad_norm"])
        elif "val_loss" in d: val[d["step"]] = d["val_loss"]
    return train, val
(t1, v1), (t2, v2) = load(sys.argv[1]), load(sys.argv[2])
if sorted(t1) != list(range(1, 11)) or sorted(t2) != sorted(t1) or sorted(v1) != sorted(v2) or not v1:
    sys.exit(f"steps differ: one host {sorted(t1)} val {sorted(v1)}, two hosts {sorted(t2)} val {sorted(v2)}")
diff = max(max(abs(a - b) for a, b in zip(t1[s], t2[s])) for s in t1)
vdiff = max(abs(v1[s] - v2[s]) for s in v1)
if t1 != t2 or v1 != v2:
    sys.exit(f"not bit-identical: max train loss/grad-norm diff {diff:.3g}, val loss diff {vdiff:.3g}")
print(f"ok: losses and grad norms of steps 1-10 and val loss {v1[max(v1)]} equal bit for bit")
EOF
cmp -s "$WORK/params_1host.f32" "$WORK/params_2host.f32" && [ -s "$WORK/params_1host.f32" ] ||
  fail "final parameters differ between the single-host and two-host runs"
ok "final parameters equal bit for bit ($(stat -c %s "$WORK/params_1host.f32") bytes)"

# ---- 2. run directory not shared between the hosts ---------------------------
mkdir -p "$PRIV"
NETNS_PRIVATE_DIR=$PRIV NETNS_PRIVATE_HOST=$IP2 two_hosts --out "$PRIV/run" > "$WORK/not_shared.log" 2>&1
rc=$?
[ $rc -ne 0 ] || { show "$WORK/not_shared.log"; fail "run with an unshared --out exited 0"; }
[ $rc -ne 124 ] && [ $rc -ne 137 ] || { show "$WORK/not_shared.log"; fail "run with an unshared --out hung (timeout)"; }
n=$(grep -c "is not shared between nodes" "$WORK/not_shared.log")
[ "$n" = 1 ] || { show "$WORK/not_shared.log"; fail "expected one 'is not shared between nodes' message, got $n"; }
grep -q -- "--out $PRIV/run is not shared between nodes" "$WORK/not_shared.log" ||
  { show "$WORK/not_shared.log"; fail "message does not name --out $PRIV/run"; }
ok "unshared run dir: exit $rc, one message: $(grep -o 'shardtrain: error.*is not shared between nodes' "$WORK/not_shared.log")"
left=$(find "$PRIV" -mindepth 1 ! -type d 2>/dev/null)
[ -z "$left" ] || fail "files left behind in $PRIV: $left"
ok "nothing left in $PRIV (no probe, metrics or checkpoint files)"
for i in $(seq 50); do
  [ -z "$(ip netns pids "$NS1")$(ip netns pids "$NS2")" ] && break
  sleep 0.1
done
[ -z "$(ip netns pids "$NS1")$(ip netns pids "$NS2")" ] || fail "processes left in the namespaces after mpirun exited"
! grep -q " $PRIV " /proc/mounts || fail "the private tmpfs leaked into the host's mount table"
ok "no process left in the namespaces, no mount left on $PRIV"

echo "PASS: two hosts (netns $NS1/$NS2 over veth, Open MPI TCP) equal one host; unshared --out refused" \
  "($(( ($(date +%s%N) - T0) / 1000000 )) ms)"
