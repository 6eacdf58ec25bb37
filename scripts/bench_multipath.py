#!/usr/bin/python3
"""Multi-path TCP in the lab (scripts/anview-lab), against iperf3 in the same run.

  scripts/bench_multipath.py [--build build] [--repeats 5]

Two emulated hosts, two links each. Reports medians over the repeats:

1. Aggregation: links limited to 1 Gbit/s and 500 Mbit/s. iperf3 (one stream, 3 s) measures
   each link alone; anview_lab_transfer sends 256 MiB (content checked) over both paths, and
   over link 0 alone (ANVIEW_TCP_PATHS=1). The figure: Anview's rate / the two links' summed
   iperf3 rate (the issue asks >= 0.90).
2. Failover stall: both links at 1 Gbit/s, 256 MiB as 4 MiB messages; link 1 goes down 1 s in.
   The figure: the longest gap between two messages arriving at the receiver, next to the
   same transfer with no failure (the issue asks <= 1 s of no delivery).
3. Incast: four hosts send 24 x 4 MiB each into a fifth whose link is limited to 1 Gbit/s,
   while one sender ping-pongs 8 bytes with the receiver. The figures: the aggregate rate /
   iperf3's rate into that link, and the ping's p99, with the receiver's credit (the default)
   and without (ANVIEW_TCP_CREDIT=0), under the cubic and bbr congestion controls.

Needs root (network namespaces) and iperf3; runs the lab's ranks with the build's
anview_lab_transfer.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "lab"))
from lab_harness import Lab, lab_check  # noqa: E402


def iperf3(lab, src_host, dst_host, link, seconds=3):
    """Mbit/s of one TCP stream from src to dst over `link`, as the receiver counts it."""
    server = lab.popen(dst_host, ["iperf3", "-s", "-1", "-B", lab.addr(dst_host, link)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    out = lab.run(src_host, ["iperf3", "-c", lab.addr(dst_host, link), "-B",
                             lab.addr(src_host, link), "-t", str(seconds), "-J"],
                  timeout=seconds + 20)
    server.wait(timeout=10)
    if out.returncode != 0:
        raise RuntimeError(f"iperf3 failed: {out.stdout[-500:]} {out.stderr[-500:]}")
    return json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"] / 1e6


def run_ranks(lab, cmd, placement, env=None, during=None):
    """Runs rank r of CMD on host placement[r]; `during(lab)` meanwhile; their RESULT dicts."""
    procs = lab.start_ranks([*map(str, cmd)], placement=placement,
                            env={"ANVIEW_TIMEOUT": "60", "ANVIEW_LOG_LEVEL": "error", **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    thread = threading.Thread(target=during, args=(lab,)) if during else None
    if thread:
        thread.start()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"{cmd[0]} rank exited {proc.returncode}: {err[-2000:]}")
        results.append(next(json.loads(line[7:]) for line in out.splitlines()
                            if line.startswith("RESULT ")))
    if thread:
        thread.join()
    return results


def transfer(lab, program, args, env=None, during=None):
    """Rank 0 on host 0 sends to rank 1 on host 1; both results."""
    return run_ranks(lab, [program, *args], [0, 1], env, during)


def incast(lab, program, env):
    """Every other host into host 0: (aggregate Mbit/s, ping p99 in ms)."""
    results = run_ranks(lab, [program, "--bytes", 4 << 20, "--messages", 24],
                        list(range(lab.hosts)), env)
    return results[0]["mbit_per_s"], results[1]["ping_p99_us"] / 1000


def mbit(result):
    return result["bytes"] * 8 / result["seconds"] / 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    program = os.path.abspath(os.path.join(args.build, "bin", "anview_lab_transfer"))
    incast_program = os.path.abspath(os.path.join(args.build, "bin", "anview_lab_incast"))
    code, why = lab_check()
    if code != 0:
        sys.exit(f"bench_multipath: the lab is not available here: {why}")
    if not os.path.exists(program):
        sys.exit(f"bench_multipath: {program} is missing: build first")

    print("== Aggregation: link 0 at 1 Gbit/s, link 1 at 500 Mbit/s; 256 MiB, checked")
    rows = {"iperf3 link 0": [], "iperf3 link 1": [], "anview 2 paths": [],
            "anview 1 path (link 0)": [], "ratio to iperf3 sum": []}
    with Lab(hosts=2, links=2, rates={0: "1gbit", 1: "500mbit"}) as lab:
        for _ in range(args.repeats):
            l0 = iperf3(lab, 0, 1, 0)
            l1 = iperf3(lab, 0, 1, 1)
            both = mbit(transfer(lab, program, ["--bytes", 256 << 20, "--messages", 1])[1])
            one = mbit(transfer(lab, program, ["--bytes", 256 << 20, "--messages", 1],
                                env={"ANVIEW_TCP_PATHS": "1"})[1])
            for key, value in (("iperf3 link 0", l0), ("iperf3 link 1", l1),
                               ("anview 2 paths", both), ("anview 1 path (link 0)", one),
                               ("ratio to iperf3 sum", both / (l0 + l1))):
                rows[key].append(value)
            print(f"  run: iperf3 {l0:.0f} + {l1:.0f} Mbit/s; anview 2 paths {both:.0f}, "
                  f"1 path {one:.0f} Mbit/s; ratio {both / (l0 + l1):.3f}", flush=True)
    for key, values in rows.items():
        unit = "" if key.startswith("ratio") else " Mbit/s"
        print(f"  median {key:26s} {statistics.median(values):8.3f}{unit}  "
              f"(min {min(values):.3f}, max {max(values):.3f})")

    print("== Failover stall: both links at 1 Gbit/s; 64 x 4 MiB; link 1 down after 1 s")
    stalls, quiet = [], []
    with Lab(hosts=2, links=2, rates={0: "1gbit", 1: "1gbit"}) as lab:
        for _ in range(args.repeats):
            base = transfer(lab, program, ["--bytes", 4 << 20, "--messages", 64])[1]

            def cut(lab):
                time.sleep(1.0)
                lab.link(1, 1, up=False)

            failed = transfer(lab, program, ["--bytes", 4 << 20, "--messages", 64],
                              during=cut)[1]
            lab.link(1, 1, up=True)
            quiet.append(base["max_gap_ms"])
            stalls.append(failed["max_gap_ms"])
            print(f"  run: longest gap {failed['max_gap_ms']:.0f} ms with the failure, "
                  f"{base['max_gap_ms']:.0f} ms without; {mbit(failed):.0f} vs "
                  f"{mbit(base):.0f} Mbit/s", flush=True)
    print(f"  median longest gap: {statistics.median(stalls):.0f} ms with a path failing, "
          f"{statistics.median(quiet):.0f} ms without")

    print("== Incast 4 -> 1 into a 1 Gbit/s link, with a concurrent 8 B ping")
    with Lab(hosts=5, links=1, host_rates={(0, 0): "1gbit"}) as lab:
        reference = statistics.median(iperf3(lab, 1, 0, 0) for _ in range(args.repeats))
        print(f"  iperf3 into the receiver's link: {reference:.0f} Mbit/s (median)")
        for cc in ("cubic", "bbr"):
            for credit in ("2M", "0"):
                runs = [incast(lab, incast_program, {"ANVIEW_TCP_CC": cc,
                                                      "ANVIEW_TCP_CREDIT": credit})
                        for _ in range(args.repeats)]
                rate = statistics.median(r[0] for r in runs)
                p99 = statistics.median(r[1] for r in runs)
                print(f"  {cc:5s} credit {credit:2s}: aggregate {rate:.0f} Mbit/s "
                      f"({rate / reference:.3f} of iperf3), ping p99 {p99:.1f} ms "
                      f"(runs: {', '.join(f'{r[1]:.1f}' for r in runs)})", flush=True)


if __name__ == "__main__":
    main()
