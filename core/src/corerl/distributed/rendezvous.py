"""Joining the ranks' process group over a TCPStore that listens only where it must.

``init_method="env://"`` starts rank 0's ``TCPStore`` listening on every interface, with no
authentication, whatever ``MASTER_ADDR`` says. When every rank runs on one machine the driver
gives ``MASTER_ADDR=127.0.0.1`` (:class:`~corerl.distributed.worker_group.RayWorkerGroup`), and
:func:`join_process_group` hands rank 0's store a socket bound to loopback (torch's
``master_listen_fd``), so nothing outside the machine can reach it. Across machines the store
must listen on the node's address, as before.
"""

from __future__ import annotations

import os
import socket
from typing import Any

LOOPBACK = "127.0.0.1"


def loopback_listener(port: int) -> socket.socket:
    """A listening TCP socket on ``127.0.0.1:port`` (for rank 0's store)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK, port))
    sock.listen(128)
    return sock


def join_process_group(backend: str, rank: int, world_size: int) -> None:
    """``torch.distributed.init_process_group`` from ``MASTER_ADDR``/``MASTER_PORT``: through a
    store listening on loopback alone when ``MASTER_ADDR`` is loopback, else ``env://``."""
    import torch.distributed as dist

    host, port = os.environ.get("MASTER_ADDR", ""), int(os.environ.get("MASTER_PORT", "0"))
    if host != LOOPBACK:
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size)
        return
    options: dict[str, Any] = {}
    listener = None
    if rank == 0:
        listener = loopback_listener(port)
        options["master_listen_fd"] = listener.fileno()
    store = dist.TCPStore(host, port, world_size, rank == 0, **options)
    if listener is not None:
        listener.detach()  # the store serves on that descriptor now: Python must not close it
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
