#!/usr/bin/python3
"""How good the tuner's picks are: anview-perf with the tuner choosing, next to the same sweep
with every algorithm forced (-a), repetition by repetition (the machine is shared and noisy).

For each size: the algorithm the tuner picked, its time, the fastest forced algorithm of that
repetition and its time; the table gives medians over repetitions and the median of the
per-repetition ratios pick/best (1.00 = the tuner picked the fastest; the issue asks <= 1.10).

  scripts/bench_tuner.py [--build build] [--reps 3] [--op allreduce] [--transports shm|tcp]
                         [--ranks 2] [--max BYTES] [--hosts K]
"""
import argparse
import json
import os
import subprocess
import sys

from bench_p2p import fmt, med

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALGOS = {
    "allreduce": ["shared", "direct", "recursive_doubling", "rabenseifner", "hierarchical", "ring"],
    "broadcast": ["shared", "binomial", "chain", "hierarchical"],
    "allgather": ["shared", "ring", "bruck", "hierarchical"],
    "reduce": ["shared", "binomial", "hierarchical"],
    "alltoall": ["pairwise", "bruck"],
    "reduce_scatter": ["ring", "recursive_halving", "direct"],
}
SHARED_LIMIT = 256 * 1024  # a shared slot's payload (an allreduce of any size goes in stages)


def perf(a, algo, max_bytes):
    """{bytes: (time_us, algo)} of one anview-perf sweep; None if the algorithm cannot run."""
    # shm where ranks share a host, tcp between (emulated) hosts
    env = dict(os.environ, ANVIEW_TRANSPORTS="tcp" if a.transports == "tcp" else "shm,tcp")
    env.pop("ANVIEW_ALGO", None)
    perf_cmd = [f"{a.build}/bin/anview-perf", a.op, "-b", "8", "-e", str(max_bytes), "-f", "8", "--json"]
    if algo:
        perf_cmd += ["-a", algo]
    cmd = [f"{a.build}/bin/anview-run", "-n", str(a.ranks), "--timeout", "300"]
    if a.hosts > 1:  # consecutive ranks share an emulated host (ANVIEW_HOST_ID)
        cmd += ["--emulate-hosts", str(a.hosts)]
    cmd += perf_cmd
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if run.returncode != 0:
        return None
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    return {r["bytes"]: (r["time_us"], r["algo"]) for r in rows}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"), help="build directory")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--op", default="allreduce", choices=sorted(ALGOS))
    p.add_argument("--transports", default="shm", choices=["shm", "tcp"])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--max", type=int, default=64 << 20, help="largest size in bytes")
    p.add_argument("--hosts", type=int, default=1, help="emulate this many hosts (ANVIEW_HOST_ID)")
    a = p.parse_args()
    reps = []  # per repetition: {size: (pick us, pick algo, best us, best algo)}
    for _ in range(a.reps):
        auto = perf(a, None, a.max)
        forced = {}
        for algo in ALGOS[a.op]:
            limit = a.max
            if algo == "shared" and a.op != "allreduce":
                limit = min(a.max, SHARED_LIMIT * (a.ranks if a.op == "allgather" else 1))
            got = perf(a, algo, limit)
            if got:
                forced[algo] = got
        row = {}
        for size, (us, algo) in auto.items():
            times = {al: t[size][0] for al, t in forced.items() if size in t}
            best = min(times, key=times.get)
            row[size] = (us, algo, times[best], best, times)
        reps.append(row)
    where = f" on {a.hosts} emulated hosts (tcp between them)" if a.hosts > 1 else ""
    print(f"{a.op}, {a.ranks} ranks{where} over {a.transports}, float32 sum; {a.reps} repetitions; "
          f"candidates forced: {', '.join(ALGOS[a.op])}\n")
    print("| size | tuner pick | pick us | fastest forced | fastest us | pick/fastest, median [min-max] |")
    print("|---|---|---|---|---|---|")
    for size in sorted(reps[0]):
        rows = [r[size] for r in reps if size in r]
        picks = sorted({r[1] for r in rows})
        bests = sorted({r[3] for r in rows})
        print(f"| {size} | {'/'.join(picks)} | {fmt(med([r[0] for r in rows]))} | {'/'.join(bests)} | "
              f"{fmt(med([r[2] for r in rows]))} | {fmt(med([r[0] / r[2] for r in rows]))}x |")
    algos = [al for al in ALGOS[a.op] if any(al in r[size][4] for r in reps for size in r)]
    print("\nEvery forced algorithm, median us:\n")
    print("| size | " + " | ".join(algos) + " |")
    print("|---" * (len(algos) + 1) + "|")
    for size in sorted(reps[0]):
        cells = []
        for al in algos:
            ts = [r[size][4][al] for r in reps if size in r and al in r[size][4]]
            cells.append(fmt(med(ts)) if ts else "-")
        print(f"| {size} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
