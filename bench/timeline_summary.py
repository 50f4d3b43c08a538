#!/usr/bin/env python3
"""Summarise ST_TIMELINE output (kernels/cuda/timeline.h) per rank.

    ST_TIMELINE=12:30 mpirun -np 2 -x ST_TIMELINE build/shardtrain train --device cuda ... 2> timeline.txt
    python3 bench/timeline_summary.py timeline.txt [--blocks]

(ST_TIMELINE is read by each rank: Open MPI passes it with -x, srun passes
the environment. A CUDA build is needed; the CPU backend records nothing.)

For each rank, the median over the printed steps of: forward (the "fwd" to
"bwd" marks), backward (to the last gradient range handed to the
reduction), tail (from there to the step's end: the last reductions, the
gradient norm, AdamW and the parameter all-gather), the whole span and
AdamW alone, in milliseconds of GPU time. --blocks also lists each
reduction's time on the communication stream ("rs>" to "rs<") of the last
printed step. A diagnostic, not a benchmark: the marks cost host time only.
"""
import re
import statistics
import sys


def parse(text):
    steps = []
    for m in re.finditer(r"timeline rank (\d+) step (\d+):([^\n]*)", text):
        marks = [(lab, int(tag), float(t))
                 for lab, tag, t in re.findall(r"(\S+)\[(\d+)\]@([\d.]+)", m.group(3))]
        steps.append((int(m.group(1)), int(m.group(2)), marks))
    return steps


def phases(marks):
    first = {}
    for lab, _, t in marks:
        first.setdefault(lab, t)
    grads = [t for lab, _, t in marks if lab == "grads"]
    if not grads or not all(k in first for k in ("fwd", "bwd", "end")):
        return None
    last = max(grads)
    adamw = first["adamw_end"] - first["adamw"] if "adamw_end" in first else float("nan")
    return (first["bwd"] - first["fwd"], last - first["bwd"], first["end"] - last,
            first["end"], adamw)


def main():
    args = [a for a in sys.argv[1:] if a != "--blocks"]
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if args[:1] in (["-h"], ["--help"]) else 2)
    try:
        text = open(args[0]).read()
    except OSError as e:
        sys.exit(f"{args[0]}: cannot read it ({e.strerror}); give the stderr of a run with "
                 "ST_TIMELINE set")
    steps = parse(text)
    if not steps:
        sys.exit(f"{args[0]}: no 'timeline rank R step S:' lines (was ST_TIMELINE set, "
                 "and is this the run's stderr?)")
    by_rank = {}
    for rank, _, marks in steps:
        p = phases(marks)
        if p:
            by_rank.setdefault(rank, []).append(p)
    print("rank  steps  forward  backward   tail    span   adamw   (ms, medians)")
    for rank, rows in sorted(by_rank.items()):
        med = [statistics.median(col) for col in zip(*rows)]
        print(f"{rank:4d} {len(rows):6d} {med[0]:8.2f} {med[1]:9.2f} {med[2]:6.2f} "
              f"{med[3]:7.2f} {med[4]:7.2f}")
    if "--blocks" in sys.argv:
        for rank in sorted(by_rank):
            marks = [s for s in steps if s[0] == rank][-1][2]
            open_at, spans = {}, []
            for lab, tag, t in marks:
                if lab == "rs>":
                    open_at[tag] = t
                elif lab == "rs<" and tag in open_at:
                    spans.append((open_at.pop(tag), t))
            print(f"rank {rank}: reductions (start ms, duration ms): " +
                  ", ".join(f"{a:.2f}+{b - a:.2f}" for a, b in spans))


if __name__ == "__main__":
    main()
