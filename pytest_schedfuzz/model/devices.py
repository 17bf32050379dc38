"""The device kinds a layout's backends are of: one entry each, with all the harness knows of the
kind. A new kind is one entry here, its constructor in the graph engine (``ggml.constructors.CONSTRUCTORS``,
keyed by the same name: the engine's half, which this data package cannot import), and, to be
drawn, the strategies' half (``strategies.LAYOUT_DRAWS``: how many, and each device) with a limit in
the profiles (``DeviceLimits``); ``tests/test_layout.py`` checks that every entry has both halves
and that no module outside these compares a kind with a name.

>>> [k.name for k in DEVICE_KINDS.values() if k.own_buft]
['rpc', 'gpu']
>>> DEVICE_KINDS["blas"].exported is None
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceKind:
    """One kind of backend (see the module's docstring).

    * ``name``: ``BackendSpec.kind``; ``label``: ``ggml_backend_name``'s name for it, followed by its
      index among its kind where a layout may hold several (``numbered``: ``RPC0``, ``GPU1``);
    * ``host``: the CPU, which every layout ends with, once: its compute buffer is in a gpu's host
      buffer type where one has one;
    * ``own_buft``: its buffers have a buffer type of their own (an RPC server's memory, a gpu's
      unless it shares the CPU's), which only it supports; otherwise host memory, which it shares;
    * ``endpoint``: an RPC client: it needs a server (``ggml_backend_rpc_init``'s endpoint), and
      the engine's backend is kept per endpoint;
    * ``fake_gpu``: schedfuzz's GPU-like device (``ggml/fake_gpu.c``): it alone takes
      ``BackendSpec``'s device settings, is built from that file (the exporter copies it beside a
      reproducer), and counts the dependency nodes of its fusions;
    * ``matmul_only``: its ``supports_op`` is ggml-blas's (large contiguous matmuls with f32 src1,
      and the view ops); every other kind supports every op but those its spec refuses;
    * ``inexact``: its results differ from the CPU's by rounding (another summation order), so
      values are compared with a tolerance;
    * ``droppable``: the minimizer tries the layout without it (a plain device: its tensors go to
      the CPU); a gpu's settings shrink instead;
    * ``exported``: the C expression that makes it in a reproducer (``repro.c.in``'s constructors;
      ``{i}``: its index, ``{name}``: its name, ``{c_name}``: that as a C string, ``{config}``: a
      gpu's settings), or
      None where the exporter cannot make it;
    * ``explored``: the ``explored`` statistics' names of the layouts that hold at least so many
      of it (the CPU, in every layout, none).
    """

    name: str
    label: str
    numbered: bool = False
    host: bool = False
    own_buft: bool = False
    endpoint: bool = False
    fake_gpu: bool = False
    matmul_only: bool = False
    inexact: bool = False
    droppable: bool = False
    exported: str | None = None
    explored: tuple[tuple[int, str], ...] = ()


# in the order of a layout's priorities as the strategies draw them: devices first, the CPU last
DEVICE_KINDS = {k.name: k for k in (
    DeviceKind("rpc", "RPC", numbered=True, own_buft=True, endpoint=True, droppable=True,
               exported="new_rpc({i});  /* {name} */", explored=((2, "2+ RPC devices"),)),
    DeviceKind("gpu", "GPU", numbered=True, own_buft=True, fake_gpu=True, exported="new_gpu({c_name}, {config});",
               explored=((1, "GPU-like device"), (2, "2+ GPU-like devices (peer copies)"))),
    DeviceKind("blas", "BLAS", matmul_only=True, inexact=True, explored=((1, "BLAS"),)),
    DeviceKind("cpu", "CPU", host=True, exported="new_cpu();"),
)}
BACKEND_KINDS = tuple(DEVICE_KINDS)



@dataclass(frozen=True)
class DeviceLimits:
    """The most devices of each kind a drawn layout holds, by ``DEVICE_KINDS`` name: a kind it
    does not name has none (the CPU, which closes every layout once, takes none). Profiles,
    strategies and the campaign pass this one value, so that a new kind is a new entry, not a new
    parameter; a build that cannot serve a kind drops it (``without``).

    >>> limits = DeviceLimits.of(rpc=2, gpu=2)
    >>> limits["gpu"], limits["blas"], limits.without(lambda k: k.fake_gpu)["gpu"]
    (2, 0, 0)
    >>> DeviceLimits.of(cpu=1)
    Traceback (most recent call last):
    ...
    ValueError: device limits: cpu is not a kind a layout draws (one of rpc, gpu, blas)
    """

    counts: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        drawn = [k.name for k in DEVICE_KINDS.values() if not k.host]
        for name, n in self.counts:
            if name not in drawn:
                raise ValueError(f"device limits: {name} is not a kind a layout draws (one of {', '.join(drawn)})")
            if n < 0:
                raise ValueError(f"device limits: {name} {n}: a count is at least 0")

    @staticmethod
    def of(**counts: int) -> DeviceLimits:
        return DeviceLimits(tuple((k, n) for k, n in counts.items() if n))

    def __getitem__(self, kind: str) -> int:
        return dict(self.counts).get(kind, 0)

    def without(self, dropped: Callable[[DeviceKind], bool]) -> DeviceLimits:
        """These limits without the kinds ``dropped`` says (a build that cannot serve them)."""
        return DeviceLimits(tuple((k, n) for k, n in self.counts if not dropped(DEVICE_KINDS[k])))

    def capped(self, cap: int) -> DeviceLimits:
        """Each kind at most ``cap``."""
        return DeviceLimits(tuple((k, min(n, cap)) for k, n in self.counts if min(n, cap)))
