"""The worker's side of the protocol (``worker.Worker`` is the parent's)."""

from __future__ import annotations

import os
import pickle
from typing import Any


class Channel:
    """The protocol's output, on a file descriptor of its own: each message pickled, after its
    length (8 bytes, little-endian; ``Worker.recv`` reads them). JSON cost a captured llama.cpp
    workload about a tenth of its time in the worker, and as much again in the parent."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, msg: dict[str, Any]) -> None:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        data = len(data).to_bytes(8, "little") + data
        while data:
            data = data[os.write(self.fd, data) :]
