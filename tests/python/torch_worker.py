"""One rank of a torch.distributed job on the "anview" backend (run by test_torch_backend.py
with torchrun's environment: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE).

    python3 torch_worker.py SCENARIO

Each scenario raises (exit code 1, with the reason on stderr) on a wrong result. Results are
compared with the gloo backend on the same inputs wherever torch 1.13's gloo has the
operation, and with the result computed locally from every rank's (deterministic) inputs
where it has not (reduce_scatter, all_to_all with lists, AVG, bfloat16).
"""

import datetime
import gc
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import anview
import anview.torch  # noqa: F401  (registers the backend)

R = dist.ReduceOp
FLOATS = [torch.float32, torch.float64, torch.float16]
INTS = [torch.int32, torch.int64, torch.int8, torch.uint8]
ARITH_OPS = [R.SUM, R.PRODUCT, R.MIN, R.MAX]
BIT_OPS = [R.BAND, R.BOR, R.BXOR]


def data(rank, count, dtype, salt=0):
    """Rank `rank`'s input: small values so products and sums stay exact."""
    g = torch.Generator().manual_seed(1000 * rank + 17 * count + salt)
    values = torch.randint(1, 4, (count,), generator=g)
    if dtype == torch.bool:
        return values > 2
    if dtype.is_floating_point:
        return (values.to(torch.float64) * 0.5).to(dtype)
    return values.to(dtype)


def check(got, want, what):
    if got.dtype.is_floating_point:
        ok = torch.allclose(got.double(), want.double(), rtol=1e-3, atol=1e-3)
    else:
        ok = torch.equal(got, want)
    if not ok:
        raise AssertionError(f"{what}: got {got.flatten()[:8].tolist()}, want {want.flatten()[:8].tolist()}")


def expect_error(kind, fn, what):
    try:
        fn()
    except anview.Error as e:
        if e.kind != kind:
            raise AssertionError(f"{what}: anview.Error of kind {e.kind}, wanted {kind}: {e}")
        return e
    raise AssertionError(f"{what}: no anview.Error")


def all_reduce(rank, n, gloo):
    for dtype in FLOATS + INTS:
        ops = ARITH_OPS + (BIT_OPS if dtype in INTS else [])
        for op in ops:
            for count in (1, 7, 1000):
                mine, ref = data(rank, count, dtype), data(rank, count, dtype)
                dist.all_reduce(mine, op=op)
                dist.all_reduce(ref, op=op, group=gloo)
                check(mine, ref, f"all_reduce {dtype} {op} x{count}")
    big = data(rank, 1 << 20, torch.float32)  # 4 MiB: the large-message algorithms
    ref = big.clone()
    dist.all_reduce(big)
    dist.all_reduce(ref, group=gloo)
    check(big, ref, "all_reduce 4 MiB")
    # AVG, bfloat16 and bool: not in gloo; compared with the result computed from all inputs.
    every = [data(r, 1000, torch.float32) for r in range(n)]
    mine = data(rank, 1000, torch.float32)
    dist.all_reduce(mine, op=R.AVG)
    check(mine, sum(every) / n, "all_reduce AVG")
    mine = data(rank, 1000, torch.bfloat16)
    dist.all_reduce(mine)
    check(mine.float(), sum(t.bfloat16().float() for t in every), "all_reduce bfloat16")
    flags = [data(r, 50, torch.bool) for r in range(n)]
    mine = flags[rank].clone()
    dist.all_reduce(mine, op=R.SUM)
    check(mine, torch.stack(flags).any(0), "all_reduce bool SUM (logical or)")
    mine = flags[rank].clone()
    dist.all_reduce(mine, op=R.PRODUCT)
    check(mine, torch.stack(flags).all(0), "all_reduce bool PRODUCT (logical and)")
    # A non-contiguous tensor is reduced in place all the same.
    strided = data(rank, 200, torch.float32).view(20, 10).t()
    ref = strided.contiguous()
    dist.all_reduce(strided)
    dist.all_reduce(ref, group=gloo)
    check(strided, ref, "all_reduce non-contiguous")
    # all_reduce_coalesced
    mine = [data(rank, 5, torch.float32), data(rank, 9, torch.float32, 1)]
    ref = [t.clone() for t in mine]
    dist.all_reduce_coalesced(mine)
    for t in ref:
        dist.all_reduce(t, group=gloo)
    for a, b in zip(mine, ref):
        check(a, b, "all_reduce_coalesced")


def rooted(rank, n, gloo):
    for root in range(n):
        for count in (3, 100_000):
            mine = data(rank, count, torch.float32, root)
            ref = mine.clone()
            dist.broadcast(mine, src=root)
            dist.broadcast(ref, src=root, group=gloo)
            check(mine, ref, f"broadcast root {root}")
        for op in (R.SUM, R.MAX):
            mine, ref = data(rank, 33, torch.int64), data(rank, 33, torch.int64)
            dist.reduce(mine, dst=root, op=op)
            dist.reduce(ref, dst=root, op=op, group=gloo)
            if rank == root:
                check(mine, ref, f"reduce {op} root {root}")
        inp = data(rank, 6, torch.float64)
        outs = [torch.zeros(6, dtype=torch.float64) for _ in range(n)] if rank == root else None
        refs = [torch.zeros(6, dtype=torch.float64) for _ in range(n)] if rank == root else None
        dist.gather(inp, outs, dst=root)
        dist.gather(inp, refs, dst=root, group=gloo)
        if rank == root:
            for a, b in zip(outs, refs):
                check(a, b, f"gather root {root}")
        ins = [data(r, 4, torch.int32, 5) for r in range(n)] if rank == root else None
        out, ref = torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)
        dist.scatter(out, ins, src=root)
        dist.scatter(ref, ins, src=root, group=gloo)
        check(out, ref, f"scatter root {root}")


def gathers(rank, n, gloo):
    for dtype in (torch.float32, torch.int8, torch.float16):
        inp = data(rank, 10, dtype)
        outs = [torch.zeros(10, dtype=dtype) for _ in range(n)]
        refs = [torch.zeros(10, dtype=dtype) for _ in range(n)]
        dist.all_gather(outs, inp)
        dist.all_gather(refs, inp, group=gloo)
        for a, b in zip(outs, refs):
            check(a, b, f"all_gather {dtype}")
        flat = torch.zeros(10 * n, dtype=dtype)
        dist.all_gather_into_tensor(flat, inp)
        check(flat, torch.cat(refs), f"all_gather_into_tensor {dtype}")
    # reduce_scatter: gloo 1.13 has none; the result from every rank's inputs.
    every = [[data(r, 8, torch.float32, b) for b in range(n)] for r in range(n)]
    out = torch.zeros(8)
    dist.reduce_scatter(out, every[rank])
    check(out, sum(every[r][rank] for r in range(n)), "reduce_scatter")
    flat_out = torch.zeros(8)
    dist.reduce_scatter_tensor(flat_out, torch.cat(every[rank]), op=R.MAX)
    check(flat_out, torch.stack([every[r][rank] for r in range(n)]).max(0).values, "reduce_scatter_tensor MAX")
    # all_to_all_single, equal and uneven splits, against gloo.
    inp = data(rank, 4 * n, torch.float32)
    out, ref = torch.zeros(4 * n), torch.zeros(4 * n)
    dist.all_to_all_single(out, inp)
    dist.all_to_all_single(ref, inp, group=gloo)
    check(out, ref, "all_to_all_single")
    in_splits = [(rank + r) % 3 + 1 for r in range(n)]
    out_splits = [(r + rank) % 3 + 1 for r in range(n)]
    inp = data(rank, sum(in_splits) * 2, torch.int64).view(-1, 2)
    out = torch.zeros(sum(out_splits), 2, dtype=torch.int64)
    ref = out.clone()
    dist.all_to_all_single(out, inp, out_splits, in_splits)
    dist.all_to_all_single(ref, inp, out_splits, in_splits, group=gloo)
    check(out, ref, "all_to_all_single with splits")
    # all_to_all with lists (gloo 1.13 has none): block r of rank s is data(s, size, r).
    ins = [data(rank, r + 1, torch.float32, 9 + r) for r in range(n)]
    outs = [torch.zeros(rank + 1) for _ in range(n)]
    dist.all_to_all(outs, ins)
    for s in range(n):
        check(outs[s], data(s, rank + 1, torch.float32, 9 + rank), f"all_to_all from {s}")


def point_to_point(rank, n, gloo):
    right, left = (rank + 1) % n, (rank - 1) % n
    for count in (0, 5, 300_000):  # empty, eager, rendezvous
        out = data(rank, count, torch.float32)
        inp = torch.zeros(count)
        reqs = [dist.isend(out, right, tag=7), dist.irecv(inp, left, tag=7)]
        for r in reqs:
            r.wait()
        check(inp, data(left, count, torch.float32), f"isend/irecv {count}")
    if rank == 0:
        got = set()
        for _ in range(n - 1):
            t = torch.zeros(1, dtype=torch.int64)
            source = dist.recv(t, tag=11)  # any source: returns the sender
            assert t.item() == 100 + source, (t, source)
            got.add(source)
        assert got == set(range(1, n)), got
    else:
        dist.send(torch.tensor([100 + rank]), 0, tag=11)
    # A Future of a receive completes with nobody calling wait() on the Work.
    if rank == 0:
        t = torch.zeros(3)
        fut = dist.irecv(t, 1, tag=12).get_future()
        deadline = time.time() + 20
        while not fut.done():
            assert time.time() < deadline, "the receive's future never completed"
            time.sleep(0.01)
        check(t, torch.arange(3.0), "irecv future")
    elif rank == 1:
        dist.send(torch.arange(3.0), 0, tag=12)


def async_ops(rank, n, gloo):
    works, tensors = [], []
    for i in range(8):
        t = data(rank, 1000 * (i + 1), torch.float32)
        tensors.append(t)
        works.append(dist.all_reduce(t, async_op=True))
    chained = works[0].get_future().then(lambda fut: fut.value()[0] * 2)
    for i, (w, t) in enumerate(zip(works, tensors)):
        w.wait()
        check(t, sum(data(r, 1000 * (i + 1), torch.float32) for r in range(n)), f"async all_reduce {i}")
    check(chained.wait(), tensors[0] * 2, "future then()")
    assert works[0].is_completed() and works[0].is_success()


def groups(rank, n, gloo):
    half = list(range(max(1, n // 2)))
    sub = dist.new_group(half)
    if rank in half:
        t = torch.ones(4) * (rank + 1)
        dist.all_reduce(t, group=sub)
        check(t, torch.ones(4) * sum(r + 1 for r in half), "all_reduce in a subgroup")
    odd = dist.new_group([r for r in range(n) if r % 2 == 1] or [0])
    if rank % 2 == 1:
        t = torch.tensor([float(rank)])
        dist.broadcast(t, src=1, group=odd)
        check(t, torch.tensor([1.0]), "broadcast in the odd ranks")


def errors(rank, n, gloo):
    e = expect_error("usage", lambda: dist.all_reduce(torch.zeros(2, dtype=torch.int16)), "int16")
    assert "Short" in str(e), e
    z = torch.full((3,), 1 + 2j, dtype=torch.complex64)  # torch passes complex as float pairs
    dist.all_reduce(z)
    check(torch.view_as_real(z), torch.view_as_real(torch.full((3,), n * (1 + 2j), dtype=torch.complex64)), "complex")
    outs = [torch.zeros(3) for _ in range(n)]
    expect_error("usage", lambda: dist.all_gather(outs, torch.zeros(4)), "all_gather size mismatch")
    expect_error("usage", lambda: dist.all_gather_into_tensor(torch.zeros(3), torch.zeros(4)), "all_gather_into_tensor size")
    # The timeout torch passes is honoured: a receive nobody answers fails after it, naming the peer.
    short = dist.new_group(timeout=datetime.timedelta(seconds=2))
    if rank == 0:
        start = time.time()
        work = dist.irecv(torch.zeros(1), src=1, tag=99, group=short)
        e = expect_error("timeout", work.wait, "unanswered receive")
        took = time.time() - start
        assert 1.5 < took < 10, took
        assert e.peer == 1, e
    dist.barrier(group=gloo)


def ddp(rank, n, gloo):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    twin = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    twin.load_state_dict(net.state_dict())
    model = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.001)  # several buckets
    reference = nn.parallel.DistributedDataParallel(twin, process_group=gloo)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(6):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        for m, o in ((model, opt), (reference, ref_opt)):
            o.zero_grad()
            nn.functional.mse_loss(m(x), y).backward()
            o.step()
    for (name, p), q in zip(model.module.named_parameters(), reference.module.parameters()):
        check(p.detach(), q.detach(), f"DDP parameter {name} against gloo")
        everyone = [torch.zeros_like(p) for _ in range(n)]
        dist.all_gather(everyone, p.detach().contiguous(), group=gloo)
        for r, other in enumerate(everyone):
            if not torch.equal(other, everyone[0]):
                raise AssertionError(f"DDP parameter {name} differs between ranks 0 and {r}")


def peer_dies(rank, n, gloo):
    t = torch.ones(10)
    dist.all_reduce(t)
    if rank == n - 1:
        sys.stdout.flush()
        os._exit(3)  # no goodbye: the others must learn it from the transport
    e = expect_error("peer_lost", lambda: [dist.all_reduce(torch.ones(1000)) for _ in range(50)], "peer died")
    print(f"rank {rank} got: {e}", flush=True)
    os._exit(0)  # the group is broken; skip teardown


SCENARIOS = {f.__name__: f for f in (all_reduce, rooted, gathers, point_to_point, async_ops, groups, errors, ddp, peer_dies)}

if __name__ == "__main__":
    names = sys.argv[1:] or [n for n in SCENARIOS if n != "peer_dies"]
    dist.init_process_group("anview", timeout=datetime.timedelta(seconds=60))
    rank, size = dist.get_rank(), dist.get_world_size()
    gloo = None if names == ["peer_dies"] else dist.new_group(backend="gloo")
    for name in names:
        SCENARIOS[name](rank, size, gloo)
        if gloo is not None:
            dist.barrier(group=gloo)
    dist.destroy_process_group()
    # torch 1.13's gloo (the reference here) drops a finished work's tensors on its own
    # threads after the waiter has returned; one that does so while the interpreter exits
    # takes the GIL, is ended by Python and aborts the process ("terminate called without an
    # active exception", pytorch/pytorch#190489). Dropping the last reference to the gloo group
    # now runs its destructor, which joins those threads, while the interpreter is alive.
    del gloo
    gc.collect()
    print(f"rank {rank}: {' '.join(names)} passed", flush=True)
