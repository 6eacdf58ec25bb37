"""One rank of a job that exercises the anview module on numpy arrays (run by test_module.py
under anview-run). Raises on a wrong result: results are checked against numpy computing
them from every rank's (deterministic) inputs."""

import os
import sys
import tempfile
import time

import numpy as np

import anview

DTYPES = [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64]
NUMPY_OP = {"sum": np.add.reduce, "prod": np.multiply.reduce, "min": np.minimum.reduce,
            "max": np.maximum.reduce, "band": np.bitwise_and.reduce, "bor": np.bitwise_or.reduce,
            "bxor": np.bitwise_xor.reduce}


def data(rank, count, dtype, salt=0):
    rng = np.random.default_rng(1000 * rank + 17 * count + salt)
    return rng.integers(1, 4, count).astype(dtype)


def expect_error(kind, fn, what):
    try:
        fn()
    except anview.Error as e:
        assert e.kind == kind, f"{what}: {e.kind} instead of {kind}: {e}"
        assert isinstance(e, RuntimeError)
        return e
    raise AssertionError(f"{what}: no anview.Error")


def close(got, want, what):
    if np.issubdtype(got.dtype, np.floating):
        ok = np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-3)
    else:
        ok = np.array_equal(got, want)
    assert ok, f"{what}: got {got[:8]}, want {want[:8]}"


def reductions(comm):
    rank, n = comm.rank, comm.size
    for dtype in DTYPES:
        ops = ["sum", "prod", "min", "max"] + ([] if np.issubdtype(dtype, np.floating) else ["band", "bor", "bxor"])
        for op in ops:
            for count in (1, 100, 70_000):
                every = np.stack([data(r, count, dtype) for r in range(n)])
                mine = data(rank, count, dtype)
                comm.allreduce(mine, op=op)
                close(mine, NUMPY_OP[op](every, axis=0).astype(dtype), f"allreduce {dtype.__name__} {op} x{count}")
    every = np.stack([data(r, 999, np.float32) for r in range(n)])
    out = np.zeros(999, np.float32)
    comm.allreduce(data(rank, 999, np.float32), op="avg", out=out)
    close(out, every.mean(0), "allreduce avg out-of-place")
    # bfloat16: 2-byte elements read as bfloat16 (the high half of a float32).
    f = data(rank, 64, np.float32)
    bf = (f.view(np.uint32) >> 16).astype(np.uint16)
    comm.allreduce(bf, dtype="bfloat16")
    back = (bf.astype(np.uint32) << 16).view(np.float32)
    close(back, sum(data(r, 64, np.float32) for r in range(n)), "bfloat16")
    for root in range(n):
        mine = data(rank, 50, np.int64)
        comm.reduce(mine, root=root, op="max")
        if rank == root:
            close(mine, np.stack([data(r, 50, np.int64) for r in range(n)]).max(0), f"reduce root {root}")
    blocks = np.stack([data(r, 6 * n, np.float64) for r in range(n)])
    out = np.zeros(6)
    comm.reduce_scatter(data(rank, 6 * n, np.float64), out)
    close(out, blocks.sum(0)[6 * rank:6 * (rank + 1)], "reduce_scatter")


def movement(comm):
    rank, n = comm.rank, comm.size
    for root in range(n):
        buf = data(rank, 1000, np.float32, root)
        comm.broadcast(buf, root=root)
        close(buf, data(root, 1000, np.float32, root), f"broadcast root {root}")
    out = np.zeros(5 * n, np.int32)
    comm.allgather(data(rank, 5, np.int32), out)
    close(out, np.concatenate([data(r, 5, np.int32) for r in range(n)]), "allgather")
    out = np.zeros(3 * n, np.uint8) if rank == 0 else None
    comm.gather(data(rank, 3, np.uint8), out, root=0)
    if rank == 0:
        close(out, np.concatenate([data(r, 3, np.uint8) for r in range(n)]), "gather")
    out = np.zeros(4, np.float64)
    comm.scatter(np.arange(4.0 * n) if rank == n - 1 else None, out, root=n - 1)
    close(out, np.arange(4.0 * rank, 4.0 * rank + 4), "scatter")
    send = np.arange(n * 2, dtype=np.int64) + 100 * rank
    out = np.zeros(n * 2, np.int64)
    comm.alltoall(send, out)
    close(out, np.concatenate([np.arange(2 * rank, 2 * rank + 2) + 100 * s for s in range(n)]), "alltoall")
    # v-variants: rank r contributes r + 1 elements (valued 10 * r + i).
    counts = [r + 1 for r in range(n)]
    everyone = np.concatenate([10 * r + np.arange(r + 1) for r in range(n)]).astype(np.int32)
    mine = (10 * rank + np.arange(rank + 1)).astype(np.int32)
    out = np.full(sum(counts), -1, np.int32)
    comm.allgatherv(mine, out, counts)
    close(out, everyone, "allgatherv")
    spaced = np.full(sum(counts) + n, -1, np.int32)  # a gap of one after every block
    displs = [sum(counts[:r]) + r for r in range(n)]
    comm.iallgatherv(mine, spaced, counts, displs).wait()
    close(np.concatenate([spaced[d:d + c] for d, c in zip(displs, counts)]), everyone, "iallgatherv displs")
    assert (spaced[[d + c for d, c in zip(displs, counts)]] == -1).all(), spaced
    out = np.zeros(sum(counts), np.int32) if rank == 0 else None
    comm.gatherv(mine, out, counts if rank == 0 else [], root=0)
    if rank == 0:
        close(out, everyone, "gatherv")
    got = np.zeros(rank + 1, np.int32)
    comm.scatterv(everyone if rank == n - 1 else None, counts, got, root=n - 1)
    close(got, mine, "scatterv")
    # alltoallv: rank s sends (s + d + 1) elements valued 100 * s + d to rank d.
    send_counts = [rank + d + 1 for d in range(n)]
    recv_counts = [s + rank + 1 for s in range(n)]
    send = np.concatenate([np.full(c, 100 * rank + d) for d, c in enumerate(send_counts)]).astype(np.float64)
    out = np.zeros(sum(recv_counts))
    comm.ialltoallv(send, send_counts, out, recv_counts).wait()
    close(out, np.concatenate([np.full(c, 100 * s + rank) for s, c in enumerate(recv_counts)]).astype(np.float64), "alltoallv")
    comm.barrier()


def point_to_point(comm):
    rank, n = comm.rank, comm.size
    right, left = (rank + 1) % n, (rank - 1) % n
    for count in (0, 10, 500_000):
        out = data(rank, count, np.float32)
        inp = np.zeros(count, np.float32)
        r = comm.irecv(inp, source=left, tag=3)
        comm.send(out, right, tag=3)
        st = r.wait(timeout=20)
        assert (st.source, st.tag, st.bytes) == (left, 3, 4 * count), st
        close(inp, data(left, count, np.float32), f"ring {count}")
    # Large messages between anview.HostBuffers (2 MiB pages), viewed through numpy.
    count = 3 * (1 << 20) + 1
    out = np.frombuffer(anview.HostBuffer(4 * count), np.float32)
    inp = np.frombuffer(anview.HostBuffer(4 * count), np.float32)
    out[:] = data(rank, count, np.float32)
    r = comm.irecv(inp, source=left, tag=4)
    comm.send(out, right, tag=4)
    assert r.wait(timeout=20).bytes == 4 * count
    close(inp, data(left, count, np.float32), "ring between host buffers")
    if rank == 0:
        for _ in range(n - 1):
            buf = bytearray(32)
            st = comm.recv(buf, source=anview.ANY_SOURCE, tag=anview.ANY_TAG)
            assert bytes(buf[:st.bytes]) == f"hello from {st.source}".encode() and st.tag == 40 + st.source
    else:
        comm.send(f"hello from {rank}".encode(), 0, tag=40 + rank)
    # Rank 0's wildcard receives above would match the tag-5 messages below: they start once
    # every hello has been taken.
    comm.barrier()
    # A receive whose Request is dropped goes on, and keeps its buffer until it ends (before,
    # dropping the Request let the buffer go at once: it could be resized or freed, and the
    # message landed in freed memory).
    held = bytearray(1 << 20)
    r = comm.irecv(held, source=left, tag=5)
    del r
    try:
        held.extend(b"x")
        raise AssertionError("the buffer of a dropped, still posted receive could be resized")
    except BufferError:
        pass
    comm.send(bytes([rank % 251]) * (1 << 20), right, tag=5)
    for _ in range(500):  # a later call that takes buffers lets it go once the receive ended
        comm.send(b"", rank, tag=6)  # to itself: no other rank needs to take part
        comm.recv(bytearray(0), source=rank, tag=6)
        try:
            held.extend(b"x")
            break
        except BufferError:
            time.sleep(0.01)
    else:
        raise AssertionError("the buffer stayed held after its receive ended")
    assert held[: 1 << 20] == bytes([left % 251]) * (1 << 20), "the dropped receive's message"
    # Nonblocking collectives overlap; their buffers are held until done.
    reqs, bufs = [], []
    for i in range(6):
        b = np.full(1000 * (i + 1), float(rank + i), np.float32)
        bufs.append(b)
        reqs.append(comm.iallreduce(b))
    for i, (r, b) in enumerate(zip(reqs, bufs)):
        r.wait()
        assert r.done and (b == sum(k + i for k in range(n))).all(), i


def errors(comm):
    rank, n = comm.rank, comm.size
    e = expect_error("usage", lambda: comm.allreduce(np.zeros(4, np.int16)), "int16")
    assert "dtype=" in e.cause and e.rank == rank, e
    expect_error("usage", lambda: comm.allreduce(np.zeros(4, np.float32), op="median"), "op")
    expect_error("usage", lambda: comm.allreduce(np.zeros(4, np.float32), op="band"), "band on floats")
    expect_error("usage", lambda: comm.allgather(np.zeros(4, np.float32), np.zeros(4 * n + 1, np.float32)), "out size")
    expect_error("usage", lambda: comm.allreduce(np.zeros((4, 4), np.float32)[:, 1]), "non-contiguous")
    expect_error("usage", lambda: comm.allreduce(b"read-only"), "read-only buffer")
    expect_error("usage", lambda: comm.send([1, 2, 3], 0), "a list is no buffer")
    e = expect_error("usage", lambda: comm.recv(np.zeros(1), source=n + 5, tag=1), "bad peer")
    expect_error("usage", lambda: comm.allgatherv(np.zeros(1), np.zeros(n), [1] * (n + 1)), "allgatherv counts")
    expect_error("usage", lambda: comm.allgatherv(np.zeros(1), np.zeros(n - 1 if n > 1 else 0), [1] * n), "allgatherv out too small")
    if n > 1:
        # A receive nobody answers times out, naming the peer and the tag.
        start = time.time()
        e = expect_error("timeout", lambda: comm.recv(np.zeros(1), source=(rank + 1) % n, tag=999, timeout=0.3), "timeout")
        assert e.peer == (rank + 1) % n and 0.25 < time.time() - start < 5, e
    comm.barrier()


def stores_and_split(comm):
    rank, n = comm.rank, comm.size
    directory = os.environ["MODULE_TEST_DIR"]
    store = anview.Store.file(directory, timeout=20, rank=rank)
    store.set(f"k{rank}", f"v{rank}")
    store.wait([f"k{r}" for r in range(n)])
    assert [store.get(f"k{r}") for r in range(n)] == [f"v{r}".encode() for r in range(n)]
    assert store.add("counter", 1) >= 1
    sub = comm.split(color=rank % 2, key=-rank)  # reversed order inside each half
    members = [r for r in range(n) if r % 2 == rank % 2]
    assert sub.size == len(members) and sub.rank == sorted(members, reverse=True).index(rank)
    x = np.array([rank], np.int64)
    sub.allreduce(x)
    assert x[0] == sum(members), (x, members)
    # A communicator of its own over an explicit store.
    own = anview.Communicator.create(rank, n, store, timeout=20, store_prefix="own")
    y = np.ones(3)
    own.allreduce(y)
    assert (y == n).all()
    name, why = own.collective_algorithm("allreduce", 1 << 20)
    assert name and why, (name, why)
    if n > 1:
        assert own.transport_name((rank + 1) % n) in ("shm", "tcp"), own.transport_name((rank + 1) % n)


def observability(comm):
    """The flight recorder and the metrics, from Python."""
    import json
    x = np.ones(8, np.float32)
    comm.allreduce(x)
    state = json.loads(comm.dump_state())
    assert state["rank"] == comm.rank and state["size"] == comm.size, state
    assert any(c["op"] == "allreduce" and c["state"] == "done" for c in state["collectives"]), state
    metrics = json.loads(anview.metrics_json())["metrics"]
    calls = [m for m in metrics if m["name"] == "anview_collective_calls_total"
             and m["labels"]["op"] == "allreduce" and m["labels"]["rank"] == str(comm.rank)]
    assert calls and sum(m["value"] for m in calls) >= 1, calls
    assert "# TYPE anview_collective_calls_total counter" in anview.metrics_prometheus()


SCENARIOS = [reductions, movement, point_to_point, errors, stores_and_split, observability]

if __name__ == "__main__":
    comm = anview.Communicator.from_env(timeout=60)
    for scenario in SCENARIOS:
        scenario(comm)
        comm.barrier()
    print(f"rank {comm.rank}: passed", flush=True)
