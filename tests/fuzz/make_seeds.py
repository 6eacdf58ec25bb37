#!/usr/bin/env python3
"""Writes the seed inputs of the fuzz targets into corpus/<target>/seed-*: valid messages of
each kind and a few near misses, encoded from the documented formats (docs/store-protocol.md,
docs/wire-protocol.md, src/transport/shm/ring.hpp). Inputs of crashes found later sit next to
them (crash-*) and are kept. Run from anywhere: python3 tests/fuzz/make_seeds.py"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    folder = os.path.join(HERE, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "seed-" + name), "wb") as f:
        f.write(data)


# --- store protocol: [limits byte] request/reply bytes --------------------------------------
STORE_MAGIC, STORE_VERSION = 0x54535641, 2


def request(op, keys, payload=b"", magic=STORE_MAGIC, version=STORE_VERSION, flags=0):
    body = b"".join(struct.pack("<I", len(k)) + k for k in keys) + payload
    return struct.pack("<IHBBII", magic, version, op, flags, len(keys), len(body)) + body


store = {
    "set": request(1, [b"anview/peer/0"], b'{"rank":0}'),
    "get": request(2, [b"anview/job_id"]),
    "add": request(3, [b"check/barrier/0"], struct.pack("<q", 1)),
    "check": request(4, [b"a", b"bb", b"ccc"]),
    "wait": request(5, [b"anview/peer/1", b"anview/peer/2"]),
    "hello": request(6, [], bytes(range(16))),
    "prove": request(7, [], bytes(range(32))),
    "set-empty-value": request(1, [b"k"]),
    "wrong-magic": request(1, [b"k"], b"v", magic=0x12345678),
    "version-99": request(2, [b"k"], version=99),
    "flags": request(2, [b"k"], flags=1),
    "too-many-keys": struct.pack("<IHBBII", STORE_MAGIC, STORE_VERSION, 5, 0, 5000, 25000),
    "huge-body": struct.pack("<IHBBII", STORE_MAGIC, STORE_VERSION, 1, 0, 1, 0xFFFFFFFF),
    "key-past-body": request(2, [b"key"])[:-1],
    "reply-ok": struct.pack("<IHBBI", STORE_MAGIC, STORE_VERSION, 0, 0, 5) + b"value",
    "reply-error": struct.pack("<IHBBI", STORE_MAGIC, STORE_VERSION, 2, 0, 4) + b"nope",
}
for name, data in store.items():
    write("fuzz_store_protocol", "default-" + name, b"\x01" + data)
    write("fuzz_store_protocol", "small-" + name, b"\x00" + data)
write("fuzz_store_protocol", "small-value-over", b"\x00" + request(1, [b"k"], b"v" * 65))

# --- TCP handshake: [expectation 16 bytes] handshake bytes ----------------------------------
TCP_MAGIC, TCP_VERSION = 0x57564E41, 3


def expectation(job, world, my_rank, streams, secret):
    return struct.pack("<QIHBB", job, world, my_rank, streams, 1 if secret else 0)


def handshake(kind=1, job=1, rank=0, world=4, stream=0, streams=2, reason=0x100, auth=1,
              version=TCP_VERSION, magic=TCP_MAGIC):
    return (struct.pack("<IHHQIIHHI", magic, version, kind, job, rank, world, stream, streams,
                        reason)
            + struct.pack("<II", auth, 0) + bytes(range(16)) + bytes(32))


exp = expectation(1, 4, 2, 2, True)
tcp = {
    "hello": exp + handshake(),
    "hello-no-secret": expectation(1, 4, 2, 2, False) + handshake(auth=0),
    "hello-path-1-of-2": exp + handshake(reason=0x0201),
    "hello-credit-generation": exp + handshake(reason=0x00058101),
    "other-job": exp + handshake(job=2),
    "higher-rank": exp + handshake(rank=3),
    "bad-stream": exp + handshake(stream=2),
    "version-2-prefix": exp + handshake(version=2)[:32],
    "reject": exp + handshake(kind=3, reason=6),
    "foreign": exp + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
}
for name, data in tcp.items():
    write("fuzz_tcp_handshake", name, data)

# --- shm ring: [mode] ... ---------------------------------------------------------------------
RECORD_MAGIC = 0xA5E1


def record(kind, body, seq):
    data = struct.pack("<HBBIQ", RECORD_MAGIC, kind, 0, len(body), seq) + body
    return data + bytes(-len(data) % 16)


frame_header = struct.pack("<BBHIQQQ", 1, 0, 0, 5, 7, 1, 0)  # eager, 5 bytes, tag 7
ring = record(1, frame_header + b"hello", 1) + record(4, struct.pack("<Q", 42), 2) + \
    record(5, b"", 3)
# capacity choice 0 (256 bytes), head = bytes published
write("fuzz_shm_ring", "hostile-frames", b"\x00" + b"\x00" + struct.pack("<Q", len(ring)) + ring)
pad_ring = record(1, frame_header + b"hello", 1)
pad_ring += record(6, bytes(256 - len(pad_ring) - 16), 2)
wrapped = pad_ring + record(2, b"more", 3)
write("fuzz_shm_ring", "hostile-pad", b"\x00" + b"\x00" + struct.pack("<Q", len(wrapped)) +
      pad_ring)
write("fuzz_shm_ring", "hostile-bad-seq",
      b"\x00" + b"\x01" + struct.pack("<Q", 64) + record(1, frame_header, 5))
write("fuzz_shm_ring", "honest-small", b"\x01" + bytes([0, 10, 0x41, 1, 0, 0x42, 0x83, 200, 7]))
write("fuzz_shm_ring", "honest-wrap", b"\x01" + bytes([0, 239, 1] * 9 + [0x80, 5, 2]))

# --- configuration: [selector] text -----------------------------------------------------------
config = {
    "size-64K": b"\x00" + b"64K",
    "size-MiB": b"\x00" + b"1MiB",
    "size-max": b"\x00" + b"9223372036854775807",
    "size-over": b"\x00" + b"8589934592G",
    "duration-10s": b"\x01" + b"10s",
    "duration-ms": b"\x01" + b"500ms",
    "duration-min": b"\x01" + b"2min",
    "duration-fraction": b"\x01" + b"1.5",
    "duration-exponent": b"\x01" + b"1e3ms",
    "anview": b"\x02" + b"ANVIEW_RANK=1\nANVIEW_WORLD_SIZE=4\nANVIEW_ROOT=127.0.0.1:29500",
    "torchrun": b"\x02" + b"RANK=0\nWORLD_SIZE=2\nLOCAL_RANK=0\nMASTER_ADDR=fe80::1\nMASTER_PORT=29500",
    "openmpi": b"\x02" + b"OMPI_COMM_WORLD_RANK=3\nOMPI_COMM_WORLD_SIZE=8\n"
               b"OMPI_COMM_WORLD_LOCAL_RANK=1\nANVIEW_ROOT=[::1]:4000",
    "slurm": b"\x02" + b"SLURM_PROCID=2\nSLURM_NTASKS=3\nSLURM_LOCALID=0\nMASTER_ADDR=node1\n"
             b"MASTER_PORT=1234",
    "rank-out-of-range": b"\x02" + b"ANVIEW_RANK=4\nANVIEW_WORLD_SIZE=4\nANVIEW_ROOT=h:1",
    "slurm-nodelist": b"\x02" + b"SLURM_PROCID=0\nSLURM_NTASKS=2\nSLURM_LOCALID=0\n"
    b"SLURM_STEP_NODELIST=gpu[07-09,12],cpu3\nSLURM_JOB_ID=123456\nSLURM_STEP_ID=2\n"
    b"SLURMD_NODENAME=gpu07",
}
for name, data in config.items():
    write("fuzz_config", name, data)


# --- p2p frames from rank 1 (fuzz_p2p_frames.cpp): opcodes 0 irecv, 1 frame, 2 isend, 3 progress,
# 4 region (rank 0 registers one), 5 rma (rank 0's put or get to rank 1)
def irecv(tag, capacity, any_source=False):
    return bytes([0, 1 if any_source else 0, tag]) + struct.pack("<H", capacity)


def frame(ftype, tag=0, ours=None, fid=0, arg=0, payload=b"", flags=0, defer=0, announced=None):
    pick = bytes([ours]) if ours is not None else b"\xff" + struct.pack("<Q", fid)
    size = len(payload) if announced is None else announced
    return (bytes([1, ftype, flags, tag]) + pick + struct.pack("<QH", arg, size) + bytes([defer])
            + payload)


def isend(tag, size, shift=0):
    return bytes([2, tag]) + struct.pack("<H", size) + bytes([shift])


PROGRESS = b"\x03"


def region(size):
    return bytes([4]) + struct.pack("<H", size)


def rma(get, size, offset=0):
    return bytes([5, 1 if get else 0]) + struct.pack("<HH", size, offset)


p2p = {
    # An eager message matched by a posted receive, and one that arrives unexpected first.
    "eager-matched": irecv(1, 100) + frame(1, tag=1, payload=b"hello") + PROGRESS,
    "eager-unexpected": frame(1, tag=2, payload=b"early") + irecv(2, 8, True) + PROGRESS,
    "eager-too-big": irecv(1, 4) + frame(1, tag=1, payload=b"too long") + PROGRESS,
    # A rendezvous from rank 1: RTS, then data frames into our request (id of request 0).
    "rendezvous-in": irecv(3, 4096) + frame(2, tag=3, fid=9, arg=4096) +
                     frame(4, ours=0, arg=0, payload=b"a" * 2048) +
                     frame(4, ours=0, arg=2048, payload=b"b" * 2048) + PROGRESS,
    "rendezvous-overrun": irecv(3, 1000) + frame(2, tag=3, fid=9, arg=1000) +
                          frame(4, ours=0, arg=900, payload=b"c" * 200) + PROGRESS,
    # Our rendezvous send (128 KiB) answered by a CTS naming it, then a reject.
    "cts-for-our-send": isend(1, 0x8000, 2) + frame(3, ours=0, arg=5) + PROGRESS,
    "cts-reject": isend(1, 0x8000, 2) + frame(3, ours=0, arg=10, flags=1) + PROGRESS,
    "cts-unknown-id": frame(3, fid=12345, arg=1) + PROGRESS,
    "unknown-type": frame(13, payload=b"???") + PROGRESS,
    # One-sided: peers' puts and gets into a region of ours (tag 0: our first region), and
    # answers to our own puts and gets (emulated over the in-process transport).
    "put-into-region": region(4096) + frame(5, tag=0, fid=1, arg=100, payload=b"p" * 200) +
                       PROGRESS,
    "put-outside-region": region(4096) + frame(5, tag=0, fid=1, arg=4000, payload=b"q" * 200) +
                          PROGRESS,
    "get-from-region": region(4096) + frame(7, tag=0, fid=2, payload=struct.pack("<QQ", 1000, 0)) +
                       PROGRESS,
    "our-get-answered": rma(True, 1000) + frame(8, ours=0, payload=b"g" * 1000) + PROGRESS,
    "our-get-refused": rma(True, 1000) + frame(8, ours=0, flags=1) + PROGRESS,
    "our-put-acked": rma(False, 500) + frame(6, ours=0, arg=500) + PROGRESS,
    "our-put-over-acked": rma(False, 500) + frame(6, ours=0, arg=5000) + PROGRESS,
    "deferred": irecv(0, 16) + frame(1, tag=1, payload=b"x" * 50, defer=1) + PROGRESS,
    # Native keys (one_sided_native.cpp): a request for a region (the in-process transport has
    # no native path: refused), a reply nobody asked for, replies of bad sizes, a withdrawal
    # of a key never handed out, a stray acknowledgement.
    "key-request": region(64) + frame(9, tag=0) + PROGRESS,
    "key-request-unknown": frame(9, tag=0xff) + PROGRESS,
    "key-reply-unasked": frame(10, tag=0xff, payload=struct.pack("<QQ", 0x1000, 64) + b"k" * 40),
    "key-reply-short": frame(10, tag=3, payload=b"x" * 8),
    "key-reply-refused": frame(10, tag=3, flags=1) + frame(10, tag=3, flags=9),
    "key-withdraw": region(64) + frame(11, tag=0) + PROGRESS,
    "key-withdrawn-stray": frame(12, tag=0xff) + frame(12, tag=0, payload=b"z"),
}
for name, data in p2p.items():
    write("fuzz_p2p_frames", name, data)


# --- the TCP stream after the handshake (fuzz_tcp_stream.cpp): [flags] then wire frames -----
def wire(ftype, seq=0, payload=b"", tag=0, fid=0, arg=0, flags=0, reserved=0, announced=None):
    size = len(payload) if announced is None else announced
    return struct.pack("<QBBHIQQQ", seq, ftype, flags, reserved, size, tag, fid, arg) + payload


eager = [wire(1, seq=i + 1, payload=bytes([i]) * (i * 5), tag=i) for i in range(4)]
stream = {
    "eager-frames": b"\x00" + b"".join(eager),
    "eager-in-pieces": b"\x02" + b"".join(eager),
    "goodbye": b"\x00" + eager[1] + wire(0xF0),
    "abort": b"\x00" + wire(0xF1, arg=3),
    "ack": b"\x00" + eager[2] + wire(0xF2, tag=1, fid=0),
    "path-down": b"\x00" + wire(0xF3, arg=0, tag=1) + eager[3],
    "keepalive": b"\x00" + wire(0xF4) + wire(0xF4),
    "credit": b"\x01" + wire(0xF5, arg=1 << 20, tag=0, fid=0) + eager[1],
    "oversized": b"\x00" + wire(1, seq=1, announced=(1 << 20) + 1),
    "reserved": b"\x00" + wire(1, seq=1, reserved=7, payload=b"x"),
    "truncated-header": b"\x00" + wire(1, seq=1, payload=b"abc")[:20],
    "truncated-payload": b"\x00" + wire(1, seq=1, announced=1000, payload=b"y" * 10),
    "sequence-gap": b"\x00" + wire(1, seq=5, payload=b"z") + wire(1, seq=2, payload=b"w"),
}
for name, data in stream.items():
    write("fuzz_tcp_stream", name, data)


# --- RPC frame: [limits byte] one message (docs/rpc.md) --------------------------------------
RPC_MAGIC = 0x50525641


def rpc_frame(kind, call_id, text=b"", payload=b"", tensors=(), flags=0, status=0, deadline=0,
              capacity=4096, inline=True, payload_bytes=None, version=1):
    if inline:
        flags |= 2
    size = len(payload) if payload_bytes is None else payload_bytes
    out = struct.pack("<IBBBBQIIQIHH", RPC_MAGIC, version, kind, flags, status, call_id, deadline,
                      capacity, size, len(text), len(tensors), 0)
    for dtype, shape in tensors:
        out += struct.pack("<BBHI", dtype, len(shape), 0, 0) + b"".join(struct.pack("<q", d) for d in shape)
    return out + text + (payload if inline else b"")


rpc = {
    "request": rpc_frame(1, 1, b"echo", b"hello"),
    "request-idempotent": rpc_frame(1, 7, b"get", b"k", flags=1, deadline=5000),
    "request-tensors": rpc_frame(1, 2, b"push", b"", [(8, [4, 4]), (4, [3])]),
    "request-body-apart": rpc_frame(1, 3, b"echo", b"", inline=False, payload_bytes=100000),
    "reply-ok": rpc_frame(2, 1, b"", b"hello"),
    "reply-error": rpc_frame(2, 4, b"refused: bad input", status=2),
    "cancel": rpc_frame(3, 9, inline=False),
    "near-miss-version": rpc_frame(1, 1, b"echo", b"x", version=2),
    "near-miss-huge-tensor": rpc_frame(1, 1, b"echo", b"", [(9, [1 << 40, 1 << 40])]),
    "near-miss-short": rpc_frame(1, 1, b"echo", b"hello")[:30],
}
for name, data in rpc.items():
    write("fuzz_rpc_frame", "default-" + name, b"\x01" + data)
    write("fuzz_rpc_frame", "small-" + name, b"\x00" + data)


# --- pub/sub frames: [limits byte] one message (docs/pubsub.md) -------------------------------
PS_MAGIC = 0x53505641


def ps_header(kind, count=0, value=0, version=1):
    return struct.pack("<IBBHIIQ", PS_MAGIC, version, kind, 0, count, 0, value)


def ps_subscribe(topics, policy=0, window=4096, window_bytes=64 << 20, queue=4096):
    body = struct.pack("<BBHIII", policy, 0, 0, window, queue, 0)
    body += b"".join(struct.pack("<H", len(t)) + t for t in topics)
    return ps_header(1, len(topics), window_bytes) + body


def ps_batch(entries):
    body = b""
    for seq, topic, payload, apart in entries:
        size = payload if apart else len(payload)
        body += struct.pack("<QBBHI", seq, 1 if apart else 0, 0, len(topic), size) + topic
        if not apart:
            body += payload
    return ps_header(3, len(entries)) + body


pubsub = {
    "subscribe": ps_subscribe([b""]),
    "subscribe-topics": ps_subscribe([b"a/", b"metrics/gpu"], policy=1, window=64, queue=100),
    "credit": ps_header(2, 1),
    "end": ps_header(4, 0, 1234),
    "batch": ps_batch([(1, b"t", b"hello", False), (2, b"t", b"world", False)]),
    "batch-apart": ps_batch([(7, b"big", 3000, True), (9, b"x", b"", False)]),
    "near-miss-count": ps_header(3, 1000) + b"\0" * 16,
    "near-miss-version": ps_header(2, 1, version=3),
}
for name, data in pubsub.items():
    write("fuzz_pubsub_frame", "big-" + name, b"\x01" + data)
    write("fuzz_pubsub_frame", "small-" + name, b"\x00" + data)

