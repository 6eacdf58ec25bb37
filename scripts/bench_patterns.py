#!/usr/bin/python3
"""RPC and pub/sub against their peers, in the same run: anview-perf rpc against gRPC C++
(../shared/peers/grpc_echo.cc: unary echo over TCP loopback, 16 concurrent calls as 16 threads on
one channel) and anview-perf pubsub against ZeroMQ PUB/SUB (../shared/peers/zmq_pubsub.cc, XPUB
with NODROP: the publisher blocks instead of dropping, like Anview's block policy).

Each repetition runs every case of both sides right after each other (the machine is shared and
noisy); the table shows medians over the repetitions and the ratio of the medians. gRPC and
ZeroMQ are built here from the peers' sources (apt: libgrpc++-dev protobuf-compiler-grpc
libzmq3-dev cppzmq-dev).

  scripts/bench_patterns.py [--build build] [--reps 3] [--seconds 3]
"""
import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "peers"))


def build_peers(out):
    os.makedirs(out, exist_ok=True)
    flags = ["-O3", "-Wall", "-std=c++17"]
    if not os.path.exists(f"{out}/grpc_echo"):
        plugin = subprocess.run(["which", "grpc_cpp_plugin"], capture_output=True, text=True,
                                check=True).stdout.strip()
        subprocess.run(["protoc", f"-I{PEERS}", f"--cpp_out={out}", f"--grpc_out={out}",
                        f"--plugin=protoc-gen-grpc={plugin}", f"{PEERS}/echo.proto"], check=True)
        libs = subprocess.run(["pkg-config", "--cflags", "--libs", "grpc++", "protobuf"],
                              capture_output=True, text=True, check=True).stdout.split()
        subprocess.run(["g++", *flags, f"-I{out}", "-o", f"{out}/grpc_echo",
                        f"{PEERS}/grpc_echo.cc", f"{out}/echo.pb.cc", f"{out}/echo.grpc.pb.cc",
                        *libs, "-lpthread"], check=True)
    if not os.path.exists(f"{out}/zmq_pubsub"):
        libs = subprocess.run(["pkg-config", "--cflags", "--libs", "cppzmq"], capture_output=True,
                              text=True, check=True).stdout.split()
        subprocess.run(["g++", *flags, "-o", f"{out}/zmq_pubsub", f"{PEERS}/zmq_pubsub.cc", *libs],
                       check=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fields(line):
    return {k: v for k, v in re.findall(r"(\w+)=(\S+)", line)}


def grpc_run(peers, seconds):
    port = free_port()
    server = subprocess.Popen([f"{peers}/grpc_echo", "server", str(port)],
                              stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        out = subprocess.run([f"{peers}/grpc_echo", "client", str(port), str(seconds)],
                             capture_output=True, text=True, check=True).stdout
    finally:
        server.kill()
        server.wait()
    rows = {}
    for line in out.splitlines():
        f = fields(line)
        if "qps" in f:
            rows[(int(f["conc"]), int(f["bytes"]))] = (float(f["qps"]), float(f["p50_us"]),
                                                       float(f["p99_us"]))
    return rows


def anview_json(build, op, seconds, extra, env=None):
    cmd = [f"{build}/bin/anview-run", "-n", "2", "--timeout", "600", f"{build}/bin/anview-perf",
           op, "--json", "--seconds", str(seconds), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                         env=dict(os.environ, **(env or {}))).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def anview_rpc(build, seconds, transport):
    env = {"ANVIEW_TRANSPORTS": transport}
    return {(r["concurrency"], r["bytes"]): (r["qps"], r["lat_us_p50"], r["lat_us_p99"])
            for r in anview_json(build, "rpc", seconds, ["--sizes", "64,16K,1M"], env)}


def anview_pubsub(build, seconds, transport):
    env = {"ANVIEW_TRANSPORTS": transport}
    return {r["bytes"]: (r["msgs_per_s"], r["gbs"], r["dropped"])
            for r in anview_json(build, "pubsub", seconds, ["--sizes", "64,1M"], env)}


def zmq_run(peers, seconds, endpoint, size):
    out = subprocess.run([f"{peers}/zmq_pubsub", endpoint, str(size), str(seconds)],
                         capture_output=True, text=True, check=True).stdout
    f = fields(out.splitlines()[-1])
    return float(f["msgs_per_s"]), float(f["GBps"]), int(f.get("lost", 0))


def med(values):
    return statistics.median(values)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3)
    args = ap.parse_args()
    peers = os.path.join(args.build, "peers")
    build_peers(peers)
    rpc = {"anview shm": [], "anview tcp": [], "grpc": []}
    ps = {"anview shm": [], "anview tcp": [], "zmq ipc": [], "zmq tcp": []}
    for rep in range(args.reps):
        print(f"# repetition {rep + 1}/{args.reps}", flush=True)
        rpc["grpc"].append(grpc_run(peers, args.seconds))
        rpc["anview shm"].append(anview_rpc(args.build, args.seconds, "shm,tcp"))
        rpc["anview tcp"].append(anview_rpc(args.build, args.seconds, "tcp"))
        ps["anview shm"].append(anview_pubsub(args.build, args.seconds, "shm,tcp"))
        ps["anview tcp"].append(anview_pubsub(args.build, args.seconds, "tcp"))
        for kind, ep in (("zmq ipc", f"ipc://{os.path.abspath(peers)}/zmq.ipc"),
                         ("zmq tcp", f"tcp://127.0.0.1:{free_port()}")):
            ps[kind].append({size: zmq_run(peers, args.seconds, ep, size)
                             for size in (64, 1 << 20)})
    print(f"\n## RPC echo, 1 client, medians of {args.reps} (round trips; qps = calls/s)")
    print("anview shm: the transport Anview picks on one host; anview tcp: ANVIEW_TRANSPORTS=tcp "
          "(loopback TCP, like gRPC)")
    print("| conc | bytes | side | qps | gRPC qps | qps ratio | p50 us | p99 us | gRPC p99 us "
          "| p99 ratio (gRPC/anview) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(rpc["grpc"][0]):
        g = [r[key] for r in rpc["grpc"]]
        gq, g99 = med([x[0] for x in g]), med([x[2] for x in g])
        for side in ("anview shm", "anview tcp"):
            a = [r[key] for r in rpc[side]]
            aq, a50, a99 = med([x[0] for x in a]), med([x[1] for x in a]), med([x[2] for x in a])
            print(f"| {key[0]} | {key[1]} | {side} | {aq:.0f} | {gq:.0f} | {aq / gq:.1f}x | "
                  f"{a50:.1f} | {a99:.1f} | {g99:.1f} | {g99 / a99:.1f}x |")
    print(f"\n## Pub/sub, 1 publisher -> 1 subscriber, nothing dropped, medians of {args.reps}")
    print("| bytes | side | msgs/s | GB/s | ratio msgs/s vs zmq same medium | ratio GB/s |")
    print("|---|---|---|---|---|---|")
    for size in (64, 1 << 20):
        for side, peer in (("anview shm", "zmq ipc"), ("anview tcp", "zmq tcp"),
                           ("zmq ipc", None), ("zmq tcp", None)):
            m = med([r[size][0] for r in ps[side]])
            g = med([r[size][1] for r in ps[side]])
            ratio = ""
            if peer:
                pm = med([r[size][0] for r in ps[peer]])
                pg = med([r[size][1] for r in ps[peer]])
                ratio = f"{m / pm:.2f}x | {g / pg:.2f}x"
            else:
                ratio = " | "
            print(f"| {size} | {side} | {m:.0f} | {g:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
