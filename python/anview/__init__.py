"""Anview: point-to-point messaging and collectives over shared memory and TCP.

    import numpy as np, anview
    comm = anview.Communicator.from_env()          # under anview-run, torchrun, mpirun, srun
    grad = np.ones(1 << 20, dtype=np.float32)
    comm.allreduce(grad, op="avg")                 # in place, zero copy
    if comm.rank == 0:
        comm.send(grad, peer=1, tag=7)
    elif comm.rank == 1:
        status = comm.recv(grad, source=0, tag=7)  # Status(source=0, tag=7, bytes=4194304)

Buffers are anything with the buffer protocol (numpy arrays, bytes, bytearray, memoryview),
C-contiguous, used in place. The element type comes from the buffer (dtype="bfloat16" reads
2-byte elements as bfloat16). Timeouts are in seconds. Failures raise anview.Error, a
RuntimeError with kind, rank, peer, operation and cause.

Large messages between ranks of one host go about twice as fast when the send and the receive
buffer are both anview.HostBuffer memory (2 MiB pages):
`np.frombuffer(anview.HostBuffer(n), np.float32)` is a writable view.

`import anview.torch` registers the PyTorch distributed backend "anview".
"""

from ._anview import (  # noqa: F401  (re-exported)
    ANY_SOURCE,
    ANY_TAG,
    Communicator,
    Error,
    HostBuffer,
    Request,
    Status,
    Store,
    __version__,
    metrics_json,
    metrics_prometheus,
)

__all__ = ["ANY_SOURCE", "ANY_TAG", "Communicator", "Error", "HostBuffer", "Request", "Status",
           "Store", "metrics_json", "metrics_prometheus"]
