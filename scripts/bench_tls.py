#!/usr/bin/python3
"""What TLS costs: anview-perf over TCP with ANVIEW_TLS=0 and ANVIEW_TLS=1, run in pairs.

Each repetition measures plain TCP, then TLS, right after each other (the machine is shared
and noisy: minutes apart can differ by 50 %), for pingpong at 8 B and 32 KiB (p50 latency) and
bw at 64 KiB, 1 MiB and 16 MiB; it prints the medians of each side and the median of the
per-pair ratios TLS / plain. The ceiling of user-space TLS on this machine is one core's
AES-128-GCM: `openssl speed -evp aes-128-gcm` is printed with the results.

  scripts/bench_tls.py [--build build] [--reps 7] [--streams N]
"""
import argparse
import json
import os
import statistics
import subprocess

POINTS = [("pingpong", 8), ("pingpong", 32 << 10), ("bw", 64 << 10), ("bw", 1 << 20),
          ("bw", 16 << 20)]


def measure(build, tls, op, size, streams):
    env = dict(os.environ, ANVIEW_TRANSPORTS="tcp", ANVIEW_TLS=str(tls))
    if streams:
        env["ANVIEW_TCP_STREAMS"] = str(streams)
    cmd = [f"{build}/bin/anview-run", "-n", "2", "--timeout", "300", f"{build}/bin/anview-perf",
           op, "-b", str(size), "-e", str(size), "--json"]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    row = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    return row["lat_us_p50"] if op == "pingpong" else row["bw_gbs"]


def aes_gcm_gbs():
    out = subprocess.run(["openssl", "speed", "-seconds", "1", "-evp", "aes-128-gcm"],
                         capture_output=True, text=True).stdout.splitlines()
    row = next((line for line in out if line.startswith("AES-128-GCM")), None)
    return float(row.split()[-1].rstrip("k")) * 1000 / 1e9 if row else float("nan")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--streams", type=int, default=0, help="ANVIEW_TCP_STREAMS (0: default)")
    args = parser.parse_args()
    results = {point: {"plain": [], "tls": [], "ratio": []} for point in POINTS}
    for rep in range(args.reps):
        for op, size in POINTS:
            plain = measure(args.build, 0, op, size, args.streams)
            tls = measure(args.build, 1, op, size, args.streams)
            r = results[(op, size)]
            r["plain"].append(plain)
            r["tls"].append(tls)
            r["ratio"].append(tls / plain)
            unit = "us" if op == "pingpong" else "GB/s"
            print(f"rep {rep + 1} {op} {size} B: plain {plain:.2f} {unit}, TLS {tls:.2f} {unit}",
                  flush=True)
    print(f"\nAES-128-GCM, one core, 16 KiB blocks (openssl speed): {aes_gcm_gbs():.2f} GB/s")
    print(f"{'op':9s} {'bytes':>9s} {'plain':>10s} {'TLS':>10s} {'TLS/plain':>10s}"
          f"   (medians of {args.reps} pairs)")
    for (op, size), r in results.items():
        unit = "us" if op == "pingpong" else "GB/s"
        print(f"{op:9s} {size:9d} {statistics.median(r['plain']):7.2f} {unit:4s}"
              f"{statistics.median(r['tls']):7.2f} {unit:4s} {statistics.median(r['ratio']):8.3f}")


if __name__ == "__main__":
    main()
