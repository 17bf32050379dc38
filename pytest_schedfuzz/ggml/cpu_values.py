"""The values oracle's data: what every leaf holds, derived from the scenario alone, and the
comparison of a scheduled compute with the same graph computed on the CPU backend alone.

* Weights and caches are filled once per scenario, inputs at every compute step, from a seed
  derived from the scenario's JSON and the tensor's name (and the step, for inputs): a finding
  replays from its corpus file alone.
* Floats are uniform in [-1, 1) (f16 rounded), q8_0 blocks a small scale and random quants.
  Index inputs count up modulo the smallest range their consumers accept (rows of ``get_rows``'
  table and ``set_rows``' destination, experts of ``mul_mat_id``), so that ``set_rows`` never
  writes one row twice (which threads would race on). Rope frequency factors are ones.
* The comparison is bitwise: the scheduled graph runs the CPU's kernels everywhere (RPC servers
  and the GPU-like device compute with the CPU backend, with the same thread count), except
  BLAS, whose matmuls round differently: with BLAS in the layout, floats compare with
  ``BLAS_RTOL``/``BLAS_ATOL``.
* A run whose values no property compares (``GgmlTarget.run(values=False)``: every property but
  same-values) holds zeros instead (rope's factors ones, indices as above): no seed, no random
  numbers, no CPU-only computation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np
from numpy.random import default_rng  # numpy imports it lazily: once in the fork server, not in every worker

from ..model.graph_spec import GraphSpec, TensorSpec
from ..model.ops import OPS, VIEW_OPS
from ..model.scenario import Scenario
from ..model.shapes import Geometry, nbytes, nelements

BLAS_RTOL, BLAS_ATOL = 1e-3, 1e-4
# how far positions count before wrapping (rope reads any position)
POSITION_RANGE = 1 << 16


def scenario_seed(scenario: Scenario) -> int:
    """A 64-bit seed from the scenario's JSON (``Scenario.dumps``: written once per scenario)."""
    return int.from_bytes(hashlib.sha256(scenario.dumps().encode()).digest()[:8], "little")


def _rng(seed: int, *key: object) -> np.random.Generator:
    digest = hashlib.sha256(repr((seed, *key)).encode()).digest()
    return default_rng(int.from_bytes(digest[:8], "little"))


def index_ranges(spec: GraphSpec) -> dict[str, int]:
    """For each integer input: the smallest index range over its consumers, read directly or
    through views of it (llama.cpp reads ``rs_s_copy`` through two views)."""
    geo, by_name = spec.geometry, spec.by_name
    out: dict[str, int] = {}
    for t in spec.tensors:
        for arg, table, dim in OPS[t.op].indexes if t.op in OPS else ():
            name = t.args[arg]
            if name is None:
                continue
            while by_name[name].op in VIEW_OPS and by_name[name].args[0] is not None:
                name = by_name[name].args[0]  # type: ignore[assignment]
            limit = POSITION_RANGE if table is None else geo[t.args[table]].ne[dim]  # type: ignore[index]
            out[name] = min(out.get(name, limit), limit)  # type: ignore[index]
    return out


def fill(geo: Geometry, rng: np.random.Generator | None, index_range: int | None = None, ones: bool = False) -> bytes:
    """The bytes of a contiguous tensor of ``geo``'s type and shape; with no ``rng`` (a run whose
    values nobody compares), floats are zeros (ones where ``ones``) and indices as always."""
    n = int(np.prod(geo.ne))
    if geo.type in ("i32", "i64"):
        values = np.arange(n) % (index_range or POSITION_RANGE)
        return values.astype(np.int32 if geo.type == "i32" else np.int64).tobytes()
    if geo.type == "q8_0":
        blocks = n // 32
        out = np.zeros(blocks, dtype=[("d", np.float16), ("qs", np.int8, 32)])
        if rng is not None:
            out["d"] = rng.uniform(0.001, 0.01, blocks).astype(np.float16)
            out["qs"] = rng.integers(-127, 128, (blocks, 32), dtype=np.int8)
        return out.tobytes()
    values = np.ones(n) if ones else np.zeros(n) if rng is None else rng.uniform(-1.0, 1.0, n)
    return values.astype(np.float32 if geo.type == "f32" else np.float16).tobytes()


def leaf_bytes(seed: int | None, spec: GraphSpec, t: TensorSpec, step: int, ranges: Mapping[str, int], ones: bool = False) -> bytes:
    """What leaf ``t`` holds: weights and caches per scenario, inputs per compute step; with no
    ``seed``, ``fill``'s contents for a run whose values nobody compares."""
    key = (t.name,) if t.role in ("weight", "cache") else (t.name, step)
    return fill(spec.geometry[t.name], None if seed is None else _rng(seed, *key), ranges.get(t.name), ones)


def ones_leafs(scenario: Scenario) -> frozenset[str]:
    """The leafs that hold ones: rope frequency factors (random ones could be 0: theta / 0 = inf, then NaN)."""
    return frozenset(s.args[2] for _, spec in scenario.graphs for s in spec.tensors if s.op == "rope" and s.args[2])


def step_inputs(seed: int | None, index: int, spec: GraphSpec) -> dict[str, bytes]:
    """What every input of ``spec`` holds at compute step ``index`` (``leaf_bytes``)."""
    ranges = index_ranges(spec)
    return {t.name: leaf_bytes(seed, spec, t, index, ranges) for t in spec.tensors if t.role == "input"}


def undetermined(spec: GraphSpec) -> str | None:
    """Why ``spec``'s values are not determined, if they are not: a ``set_rows`` with more
    indices than its destination has rows writes some row twice, from threads that race (only
    a minimized case gets there: the generators keep caches as long as a batch)."""
    geo = spec.geometry
    for t in spec.tensors:
        if t.op == "set_rows" and nelements(geo[t.args[2]]) > geo[t.args[0]].ne[1]:  # type: ignore[index]
            return f"{t.name} writes {nelements(geo[t.args[2]])} rows into {geo[t.args[0]].ne[1]}"  # type: ignore[index]
    return None


def compared(spec: GraphSpec) -> list[str]:
    """The tensors whose values a compute step must get right: the roots no tensor reads and the
    outputs (the allocator keeps both; every other node's memory may be reused: a captured
    graph's roots are all its nodes, handed to ggml in llama.cpp's order) and every cache."""
    read = {a for t in spec.tensors for a in t.args if a is not None}
    names = list(dict.fromkeys([*(r for r in spec.roots if r not in read), *(t.name for t in spec.tensors if t.output)]))
    return names + [t.name for t in spec.tensors if t.role == "cache" and t.name not in names]


def difference(name: str, geo: Geometry, got: bytes, want: bytes, tolerant: bool) -> str:
    """"" if ``got`` equals ``want`` (bitwise, or within the BLAS tolerance), else the first
    difference in the scheduler's terms."""
    if got == want:
        return ""
    what = f"{name} ({geo.type} {list(geo.ne)}, {nbytes(geo)} bytes)"
    if geo.type not in ("f32", "f16"):
        first = next(k for k, (a, b) in enumerate(zip(got, want)) if a != b)
        return f"{what}: differs from the CPU-only result from byte {first} on"
    dtype = np.float32 if geo.type == "f32" else np.float16
    a, b = np.frombuffer(got, dtype).astype(np.float64), np.frombuffer(want, dtype).astype(np.float64)
    if tolerant and np.allclose(a, b, rtol=BLAS_RTOL, atol=BLAS_ATOL, equal_nan=True):
        return ""
    # NaN where the CPU alone has NaN agrees (whatever its payload bits); a NaN or an infinity
    # where it has a number, or the other infinity, does not (a == b is False for those)
    bad = np.flatnonzero(~((a == b) | (np.isnan(a) & np.isnan(b))))
    if not bad.size:
        return ""
    k = int(bad[0])
    return (f"{what}: {len(bad)} of {a.size} elements differ from the CPU-only result, the first at flat index {k}: "
            f"scheduled {a[k]:.6g}, CPU-only {b[k]:.6g} (max |diff| {np.max(np.nan_to_num(np.abs(a[bad] - b[bad]), nan=np.inf)):.3g})")
