"""The "anview" backend of torch.distributed.

    import anview.torch  # registers the backend
    import torch.distributed as dist
    dist.init_process_group("anview")  # torchrun's MASTER_ADDR/PORT, RANK, WORLD_SIZE

torch's store serves only the bootstrap; tensors (CPU) move over Anview's transports: shared
memory between ranks of one host, TCP between hosts. Every collective of torch.distributed
works, with async_op=True and Work.get_future() (DistributedDataParallel), and send, recv,
isend, irecv. Unsupported cases (CUDA tensors, complex types, PREMUL_SUM) raise anview.Error.
"""

import torch.distributed as _dist

from . import Error  # noqa: F401  (errors raised by the backend are anview.Error)
from ._torch import create_process_group

BACKEND = "anview"

if not hasattr(_dist.Backend, BACKEND.upper()):
    _dist.Backend.register_backend(BACKEND, create_process_group)

__all__ = ["BACKEND", "create_process_group"]
