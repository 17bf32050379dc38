"""Graph specs as plain data: a small op program that both the reference and the real engine
materialize the same way: tensors in creation order (leafs: weights, KV cache, inputs; then
ops), and the roots handed to ``ggml_build_forward_expand``. ``GraphBuilder`` writes one as one
writes a ggml graph; ``reshaped``, ``leaf_merged`` and ``leaf_split`` make variants of one (the
minimizer's and the strategies' smaller or re-leafed graphs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any

from .ops import OPS, ggml_srcs, infer
from .shapes import CAST_SELF, TYPES, Geometry, SpecError, nbytes, nelements, new_tensor

ROLES = ("weight", "cache", "input", "")
# explicit limits on what a graph may ask of the engine (case files are checked against them)
MAX_ELEMENTS = 2**26  # per tensor: 256 MiB of f32
MAX_TENSORS = 100_000  # per graph
_ONES = {k: (1,) * (4 - k) for k in range(5)}  # a stored shape of k dimensions, padded as ggml pads it


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class TensorSpec:
    """One tensor: a leaf (``op == "none"``) or an op over earlier tensors (``args``).

    ``device`` is the index, in the layout, of the backend whose buffer holds a weight or a
    cache tensor. ``ne`` is filled in by shape inference and checked on load.
    """

    name: str
    op: str = "none"
    type: str = "f32"
    ne: tuple[int, ...] = ()
    args: tuple[str | None, ...] = ()
    params: tuple[tuple[str, Any], ...] = ()
    role: str = ""
    device: int | None = None
    output: bool = False

    @property
    def is_leaf(self) -> bool:
        return self.op == "none"

    @cached_property
    def srcs(self) -> tuple[str | None, ...]:
        """Names in ggml's ``src[]`` order (see ``ops.ggml_srcs``); read by every pass."""
        if self.is_leaf:
            return ()
        return tuple(self.name if s == CAST_SELF else s for s in ggml_srcs(self.op, self.args))

    @cached_property
    def _params(self) -> dict[str, Any]:
        return dict(self.params)

    def param(self, key: str, default: Any = None) -> Any:
        return self._params.get(key, default)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "op": self.op, "type": self.type, "ne": list(self.ne)}
        if self.args:
            out["args"] = list(self.args)
        if self.params:
            out["params"] = {k: _thaw(v) for k, v in self.params}
        if self.role:
            out["role"] = self.role
        if self.device is not None:
            out["device"] = self.device
        if self.output:
            out["output"] = True
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> TensorSpec:
        return TensorSpec(
            name=d["name"],
            op=d.get("op", "none"),
            type=d.get("type", "f32"),
            ne=tuple(d.get("ne", ())),
            args=tuple(d.get("args", ())),
            params=tuple(sorted((k, _freeze(v)) for k, v in d.get("params", {}).items())),
            role=d.get("role", ""),
            device=d.get("device"),
            output=bool(d.get("output", False)),
        )


@dataclass(frozen=True)
class GraphSpec:
    """A compute graph as an op program; ``forced`` are user assignments (tensor, backend)."""

    tensors: tuple[TensorSpec, ...]
    roots: tuple[str, ...]
    forced: tuple[tuple[str, int], ...] = ()
    label: str = ""

    @cached_property
    def by_name(self) -> dict[str, TensorSpec]:
        return {t.name: t for t in self.tensors}

    @cached_property
    def geometry(self) -> dict[str, Geometry]:
        """Every tensor's type, ne, nb and view source, from ``ops.infer`` (in the engine's
        worker, as the parent inferred it: ``geometry_rows``)."""
        geo: dict[str, Geometry] = {}
        rows = self.__dict__.get("_geometry_rows")
        if rows is not None:
            for row in rows:
                g = geo[row[0]] = object.__new__(Geometry)
                g.__dict__.update(zip(_GEOMETRY_FIELDS, row[1:]))
            return geo
        for t in self.tensors:
            if t.is_leaf:
                geo[t.name] = new_tensor(t.type, t.ne)
                continue
            args = [geo[a] if a is not None else None for a in t.args]
            geo[t.name] = infer(t.op, args, t.args, dict(t.params))
        return geo

    @cached_property
    def largest_nbytes(self) -> int:
        """``ggml_nbytes`` of its largest tensor (0 for none)."""
        geo = self.geometry
        return max((nbytes(geo[t.name]) for t in self.tensors), default=0)

    def validate(self, n_backends: int | None = None) -> None:
        """Raise ``SpecError`` naming the first problem: names, ops, order, shapes, devices. A
        spec is immutable: once valid for ``n_backends``, it is not checked again (a captured
        graph is drawn into many scenarios)."""
        valid_for: set[int | None] = self.__dict__.setdefault("_valid_for", set())
        if n_backends in valid_for:
            return
        # what its tensors alone decide is checked once for every copy that shares them (a
        # captured graph drawn with more nodes forced, ``with_forced``), the forced ones per copy
        tensors_valid_for: set[int | None] = self.__dict__.setdefault("_tensors_valid_for", set())
        if n_backends not in tensors_valid_for:
            self._check_tensors(n_backends)
            tensors_valid_for.add(n_backends)
        by_name = self.by_name
        for name, backend in self.forced:
            if name not in by_name:
                raise SpecError(f"forced assignment names unknown tensor {name!r}")
            if n_backends is not None and not 0 <= backend < n_backends:
                raise SpecError(f"forced assignment of {name!r} to backend {backend}, not in the layout")
        valid_for.add(n_backends)

    def _check_tensors(self, n_backends: int | None) -> None:
        seen: set[str] = set()
        for t in self.tensors:
            name, leaf = t.name, t.op == "none"
            if not name or len(name) >= 64:
                raise SpecError(f"tensor name {name!r} must have 1 to 63 characters")
            if name in seen:
                raise SpecError(f"tensor {name!r} is defined twice")
            if not leaf and t.op not in OPS:
                raise SpecError(f"tensor {name!r}: unknown op {t.op!r}")
            if t.role not in ROLES:
                raise SpecError(f"tensor {name!r}: unknown role {t.role!r}")
            for a in t.args:
                if a is not None and a not in seen:
                    # sources must be defined earlier: this also rules out cycles
                    raise SpecError(f"tensor {name!r}: source {a!r} is not defined before it (or forms a cycle)")
            if t.role in ("weight", "cache"):
                if not leaf or t.device is None:
                    raise SpecError(f"tensor {name!r}: a {t.role} must be a leaf with a device")
                if n_backends is not None and not 0 <= t.device < n_backends:
                    raise SpecError(f"tensor {name!r}: device {t.device} is not in the layout ({n_backends} backends)")
            if leaf and t.role == "":
                raise SpecError(f"leaf {name!r} needs a role (weight, cache or input)")
            if leaf and t.ne and min(t.ne) < 0:
                raise SpecError(f"tensor {name!r}: shape {list(t.ne)} has a negative dimension")
            seen.add(name)
        for r in self.roots:
            if r not in seen:
                raise SpecError(f"root {r!r} is not a tensor of the graph")
        geo = self.geometry
        for t in self.tensors:
            g = geo[t.name]
            ne, k = g.ne, len(t.ne)
            if k and ne[:k] != tuple(t.ne) or ne[k:] != _ONES[k]:
                raise SpecError(f"tensor {t.name!r}: stored shape {list(t.ne)} but ops give {list(ne)}")
            if ne[0] * ne[1] * ne[2] * ne[3] > MAX_ELEMENTS:
                raise SpecError(f"tensor {t.name!r}: {nelements(g):,} elements, over the limit of {MAX_ELEMENTS:,} (2**26) per tensor")
        if len(self.tensors) > MAX_TENSORS:
            raise SpecError(f"{len(self.tensors):,} tensors, over the limit of {MAX_TENSORS:,} per graph")

    @property
    def n_ops(self) -> int:
        return sum(1 for t in self.tensors if not t.is_leaf)

    @property
    def derived(self) -> dict[str, Any]:
        """What a judge derives from the spec (the reference's graph of it), kept with it: never
        pickled for the engine's worker, and shared with its ``relabeled`` copies."""
        return self.__dict__.setdefault("_derived", {})  # type: ignore[no-any-return]

    @property
    def rows(self) -> tuple[tuple[Any, ...], ...]:
        """Its tensors as rows of their fields, in ``TensorSpec``'s order: what is pickled, and
        what the engine's worker encodes its program from (``ggml.program.encode``)."""
        rows: tuple[tuple[Any, ...], ...] | None = self.__dict__.get("_rows")
        if rows is None:
            rows = tuple((t.name, t.op, t.type, t.ne, t.args, t.params, t.role, t.device, t.output) for t in self.tensors)
        return rows

    @property
    def geometry_rows(self) -> tuple[tuple[Any, ...], ...]:
        """``geometry`` as rows (the name, then ``Geometry``'s fields), in the order of ``rows``."""
        rows: tuple[tuple[Any, ...], ...] | None = self.__dict__.get("_geometry_rows")
        if rows is None:
            rows = tuple((k, g.type, g.ne, g.nb, g.view_src, g.view_offs) for k, g in self.geometry.items())
        return rows

    def __getattr__(self, name: str) -> Any:
        # a spec unpickled by the engine's worker has rows only: most scenarios never read its
        # tensors as objects there, and making them was a sixth of a fresh scenario's time
        rows = self.__dict__.get("_rows")
        if name != "tensors" or rows is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        tensors = self.__dict__["tensors"] = tuple(tensor_from_row(row) for row in rows)
        return tensors

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled for the engine's worker as rows of plain values (its geometry and validity
        # with it, ``derived`` not): fewer bytes, and faster to write than the
        # default; the parent writes one per graph per scenario
        inferred = "geometry" in self.__dict__ or "_geometry_rows" in self.__dict__
        return (_unpickle_graph, (
            self.rows,
            self.roots, self.forced, self.label,
            self.geometry_rows if inferred else None,
            self.__dict__.get("_valid_for", set()),
        ))

    def relabeled(self, label: str) -> GraphSpec:
        """This spec under another label, with what was derived from its tensors (geometry,
        validity, ``derived``): the label is a name, nothing is derived from it."""
        return self if label == self.label else self._sharing(True, label=label)

    def with_forced(self, forced: tuple[tuple[str, int], ...]) -> GraphSpec:
        """This spec with other forced assignments, with what was derived from its tensors alone
        (``by_name``, geometry, ``derived``: the reference's graph applies forced assignments per
        step); its validity is checked again, as it depends on them."""
        return self if forced == self.forced else self._sharing(False, forced=forced)

    def _sharing(self, validity: bool, **changes: Any) -> GraphSpec:
        """A copy with ``changes`` that shares what was derived from the tensors, and their
        validity where ``changes`` cannot change it."""
        # its fields and cached values copied as they are, not through the constructor: a
        # worker's spec has rows, not tensors (``__getattr__``), until they are asked for
        copy: GraphSpec = object.__new__(GraphSpec)
        copy.__dict__.update((k, v) for k, v in self.__dict__.items() if validity or k != "_valid_for")
        copy.__dict__.update(changes)
        copy.__dict__["_derived"] = self.derived
        return copy

    def __repr__(self) -> str:
        return f"GraphSpec({self.label or 'graph'}: {self.n_ops} ops, {len(self.tensors) - self.n_ops} leafs)"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tensors": [t.to_json() for t in self.tensors], "roots": list(self.roots)}
        if self.forced:
            out["forced"] = [list(f) for f in self.forced]
        if self.label:
            out["label"] = self.label
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> GraphSpec:
        return GraphSpec(
            tensors=tuple(TensorSpec.from_json(t) for t in d["tensors"]),
            roots=tuple(d["roots"]),
            forced=tuple((str(n), int(b)) for n, b in d.get("forced", ())),
            label=d.get("label", ""),
        )


_TENSOR_FIELDS = tuple(f.name for f in fields(TensorSpec))
_GEOMETRY_FIELDS = tuple(f.name for f in fields(Geometry))
# the rows ``GraphSpec.__reduce__`` writes, field by field
if _TENSOR_FIELDS != ("name", "op", "type", "ne", "args", "params", "role", "device", "output") or (
        _GEOMETRY_FIELDS != ("type", "ne", "nb", "view_src", "view_offs")):
    raise ImportError("TensorSpec's or Geometry's fields changed: change GraphSpec.__reduce__'s rows with them")


def tensor_from_row(row: tuple[Any, ...]) -> TensorSpec:
    """A ``GraphSpec.rows`` row made a tensor again (without its constructor's checks: it was
    made and checked by the pickling side)."""
    t: TensorSpec = object.__new__(TensorSpec)
    t.__dict__.update(zip(_TENSOR_FIELDS, row))
    return t


def _unpickle_graph(rows: tuple[tuple[Any, ...], ...], roots: tuple[str, ...], forced: tuple[tuple[str, int], ...], label: str,
                    geometry: tuple[tuple[Any, ...], ...] | None, valid_for: set[int | None]) -> GraphSpec:
    """``GraphSpec.__reduce__``'s rows, kept as rows: the tensors and their geometry are made on
    first use (``GraphSpec.__getattr__``, ``GraphSpec.geometry``)."""
    spec: GraphSpec = object.__new__(GraphSpec)
    spec.__dict__.update(_rows=rows, roots=roots, forced=forced, label=label, _valid_for=valid_for)
    if geometry is not None:
        spec.__dict__["_geometry_rows"] = geometry  # ``geometry`` makes its objects on first use
    return spec


@dataclass
class GraphBuilder:
    """Builds a ``GraphSpec`` the way one writes a ggml graph, e.g.::

        b = GraphBuilder()
        w = b.weight("w", (64, 64), device=0)
        x = b.input("x", (64, 8))
        y = b.op("mul_mat", w, x, name="y")
        spec = b.build(y)
    """

    tensors: list[TensorSpec] = field(default_factory=list)
    forced: list[tuple[str, int]] = field(default_factory=list)
    _geo: dict[str, Geometry] = field(default_factory=dict)

    def _add(self, t: TensorSpec, geo: Geometry) -> str:
        """``t``, made with the shape ``geo`` gives it (``geo.ne``), added."""
        if t.name in self._geo:
            raise SpecError(f"tensor {t.name!r} is defined twice")
        self._geo[t.name] = geo
        self.tensors.append(t)
        return t.name

    def leaf(self, name: str, ne: Sequence[int], type: str = "f32", role: str = "input", device: int | None = None) -> str:
        geo = new_tensor(type, ne)
        return self._add(TensorSpec(name, type=type, ne=geo.ne, role=role, device=device), geo)

    def weight(self, name: str, ne: Sequence[int], device: int, type: str = "f32") -> str:
        return self.leaf(name, ne, type, "weight", device)

    def cache(self, name: str, ne: Sequence[int], device: int, type: str = "f32") -> str:
        return self.leaf(name, ne, type, "cache", device)

    def input(self, name: str, ne: Sequence[int], type: str = "f32") -> str:
        return self.leaf(name, ne, type, "input")

    def op(self, op: str, *args: str | None, name: str, output: bool = False, **params: Any) -> str:
        geo = infer(op, [self._geo[a] if a is not None else None for a in args], args, params)
        frozen = tuple(sorted((k, _freeze(v)) for k, v in params.items())) if params else ()
        return self._add(TensorSpec(name, op, geo.type, geo.ne, tuple(args), frozen, output=output), geo)

    def by_name(self, name: str) -> str | None:
        """``name`` if a tensor of that name was already added."""
        return name if name in self._geo else None

    def force(self, name: str, backend: int) -> None:
        self.forced.append((name, backend))

    def shape(self, name: str) -> tuple[int, int, int, int]:
        return self._geo[name].ne

    def build(self, *roots: str, label: str = "") -> GraphSpec:
        spec = GraphSpec(tuple(self.tensors), tuple(roots), tuple(self.forced), label)
        spec.__dict__["geometry"] = dict(self._geo)  # inferred as each op was added: not again (cached_property's slot)
        return spec


def reshaped(spec: GraphSpec, leaf: str, dim: int) -> GraphSpec | None:
    """``spec`` with dimension ``dim`` of ``leaf`` halved and every op's shape inferred again;
    None where an op no longer accepts its sources (views keep their explicit shapes, so
    graphs built on them rarely shrink this way)."""
    t = spec.by_name.get(leaf)
    if t is None or not t.is_leaf or dim >= len(t.ne) or t.ne[dim] < 2:
        return None
    ne = list(t.ne)
    ne[dim] //= 2
    if dim == 0 and ne[0] % TYPES[t.type][0]:
        return None
    geo: dict[str, Geometry] = {}
    tensors = []
    try:
        for u in spec.tensors:
            if u.is_leaf:
                g = new_tensor(u.type, ne if u.name == leaf else u.ne)
            else:
                g = infer(u.op, [geo[a] if a else None for a in u.args], u.args, dict(u.params))
            geo[u.name] = g
            tensors.append(replace(u, ne=g.ne))
    except SpecError:
        return None
    return replace(spec, tensors=tuple(tensors))


def leaf_merged(spec: GraphSpec) -> GraphSpec | None:
    """``spec`` with one input leaf fewer: the first input that has an earlier input of the same
    type and shape is replaced by that one in every op reading it (the same ops, one leaf
    fewer: ggml then re-plans for "different number of leafs"). None if there is no such pair."""
    seen: dict[tuple[str, tuple[int, ...]], str] = {}
    for t in spec.tensors:
        if t.role != "input":
            continue
        key = (t.type, tuple(t.ne))
        if key in seen:
            keep, drop = seen[key], t.name
            tensors = tuple(replace(u, args=tuple(keep if a == drop else a for a in u.args)) for u in spec.tensors if u.name != drop)
            try:
                merged = replace(spec, tensors=tensors)
                merged.validate()
            except SpecError:
                return None
            return merged
        seen[key] = t.name
    return None


def leaf_split(spec: GraphSpec) -> GraphSpec | None:
    """``spec`` with one input leaf more: the last op reading an input that is read more than
    once reads a new input of the same type and shape instead (the same ops, one leaf more).
    None if no input is read twice."""
    reads: dict[str, list[int]] = {}
    for i, t in enumerate(spec.tensors):
        for a in t.args:
            if a is not None and spec.by_name[a].role == "input":
                reads.setdefault(a, []).append(i)
    name = next((n for n, rs in reads.items() if len(rs) > 1), None)
    if name is None:
        return None
    src, last = spec.by_name[name], reads[name][-1]
    fresh = replace(src, name=f"{name}_b"[:63])
    if fresh.name in spec.by_name:
        return None
    tensors = list(spec.tensors)
    tensors[last] = replace(tensors[last], args=tuple(fresh.name if a == name else a for a in tensors[last].args))
    tensors.insert(tensors.index(src) + 1, fresh)
    variant = replace(spec, tensors=tuple(tensors))
    try:
        variant.validate()
    except SpecError:
        return None
    return variant
