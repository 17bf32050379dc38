"""A graph spec encoded for ``graph.c`` (``GraphProgram``, ``encode``), which builds it in one call
with ggml's own constructors (``Ggml.build_graph``): per tensor a record of its op, type, shape,
arguments, parameters and the geometry ggml must give it."""

from __future__ import annotations

import functools
import importlib.util
from array import array
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any, ClassVar

from ..builds.compile import BuildError
from ..engine import Unsupported
from ..model import ops
from ..model.graph_spec import GraphSpec, TensorSpec, tensor_from_row
from ..model.versions import GgmlVersion, version_of
from .build import build_encoder


@dataclass(frozen=True)
class GraphProgram:
    """A graph spec encoded for ``graph.c``: per tensor, in spec order, a record of ``WORDS``
    int64 words (op, type, shape, arguments as record indices, flags, integer parameters, the
    persistent tensor or the name's offset, op_params words, then the geometry ggml must give
    it) and four doubles; the names, NUL-ended; the op_params words; the roots as indices."""

    OPS: ClassVar[tuple[str, ...]] = ("leaf", "persistent", *ops.OPS)  # graph.c's ``OPS`` (``graph_ops`` writes it from the table)
    CODES: ClassVar[dict[str, int]] = {name: i for i, name in enumerate(OPS)}
    WORDS: ClassVar[int] = 38
    PTR: ClassVar[int] = 24  # a persistent tensor's address in its record (graph.c's R_PTR)
    GEO: ClassVar[int] = 27  # where the geometry starts in a record
    INPUT, OUTPUT, INPLACE, NEW_K, NAME = 1, 2, 4, 8, 16  # flags
    OK, NULL, MISSING, BAD_OP = -1, -2, -3, -4  # graph.c's results besides a record index

    records: array[int]
    reals: array[float]
    names: bytes
    words: array[int]
    roots: array[int]
    n: int
    index: dict[str, int]
    # the weights and caches, each with its record's index: their addresses, a scenario's own,
    # are written in by ``bound``, so that one encoding serves every scenario of the spec
    persistent: tuple[tuple[int, TensorSpec], ...] = ()

    def bound(self, address: Callable[[TensorSpec], int]) -> GraphProgram:
        """This program with each persistent tensor's address (``address``) in its record."""
        if not self.persistent:
            return self
        records = array("q", self.records)
        for i, t in self.persistent:
            records[i * self.WORDS + self.PTR] = address(t)
        return replace(self, records=records)

    @staticmethod
    def address(a: array[Any]) -> int:
        return a.buffer_info()[0]


def made_of(spec: GraphSpec, ggml_version: str) -> dict[str, Any]:
    """What the worker made of ``spec`` for the ggml it loaded, kept with the spec (never pickled):
    its programs for graph.c (``encoded``), its node and leaf names as ggml gave them the first
    time (ggml builds a program alike each time). A spec the worker keeps (``kept``) serves many
    scenarios."""
    made: dict[str, dict[str, Any]] = spec.__dict__.setdefault("_made_by_worker", {})
    return made.setdefault(ggml_version, {})


def encoded(spec: GraphSpec, persistent: bool, types: dict[str, int], ggml_version: str) -> GraphProgram:
    """``encode``'s program of ``spec``, made once per spec and ggml (``made_of``); a persistent
    one is unbound (``GraphProgram.bound``)."""
    made = made_of(spec, ggml_version)
    key = "program" if persistent else "cpu program"
    if key not in made:
        made[key] = encode(spec, persistent, types, ggml_version)
    program: GraphProgram = made[key]
    return program


@functools.cache
def native_encoder() -> ModuleType | str:
    """``encode.c``'s module (``build.build_encoder``, built on first use), or why there is none:
    ``encode`` then runs ``encode_rows``, the same encoding in Python, slower."""
    try:
        path = build_encoder()
    except BuildError as e:
        return f"the C encoder cannot be built ({e}): programs are encoded in Python"
    spec = importlib.util.spec_from_file_location("_schedfuzz_encode", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# per ggml version and type codes: what ``_op_record`` made of each (op, parameters) it was given,
# so that the C encoder asks Python once per distinct one (most recur: a norm's eps, a rope's dims)
_OP_FIELDS: dict[tuple[str, tuple[tuple[str, int], ...]], dict[Any, Any]] = {}
OP_FIELDS_KEPT = 65_536  # distinct (op, parameters) per version; forgotten all at once beyond


def encode(spec: GraphSpec, persistent: bool, types: dict[str, int], ggml_version: str) -> GraphProgram:
    """``encode_rows``'s program of ``spec``, made in C (``encode.c``) where that is built: the
    same records, names, words and roots (``tests/ggml/test_encode.py`` compares the two)."""
    native = native_encoder()
    if isinstance(native, str):
        return encode_rows(spec, persistent, types, ggml_version)
    version = version_of(ggml_version)
    cache = _OP_FIELDS.setdefault((version.version, tuple(sorted(types.items()))), {})
    if len(cache) > OP_FIELDS_KEPT:
        cache.clear()

    def fields(op: str, name: str, params: tuple[tuple[str, Any], ...]) -> ops.Fields:
        return _op_record(op, name, dict(params).get, version, types)

    rows = spec.rows
    records, reals, names, words, roots, index, kept = native.encode_rows(
        rows, spec.geometry_rows, spec.roots, GraphProgram.CODES, types, _op_flags(version), persistent, ops.RECORDED, cache, fields)
    return GraphProgram(_array("q", records), _array("d", reals), names, _array("i", words), _array("i", roots), len(rows), index,
                        tuple((i, tensor_from_row(rows[i])) for i in kept))


def _array(typecode: str, data: bytes) -> array[Any]:
    a = array(typecode)
    a.frombytes(data)
    return a


@functools.cache
def _op_flags(version: GgmlVersion) -> dict[str, int]:
    """Each op's record flags: named, and where a build of it asks ``k_given``, whether ``version``'s
    ``ggml_ssm_scan`` takes K."""
    GP = GraphProgram
    k = version.calls.ssm_scan_takes_k
    return {op.name: GP.NAME | (GP.NEW_K if k and any(b.when == "k_given" for b in op.builds) else 0) for op in ops.OPS.values()}


def encode_rows(spec: GraphSpec, persistent: bool, types: dict[str, int], ggml_version: str) -> GraphProgram:
    """``spec`` encoded for ``graph.c``, each tensor to be checked against ``spec.geometry``
    (the parent's inference: it comes with the pickled spec). ``persistent``: a weight or a cache
    is the scenario's tensor (``GraphProgram.bound`` writes its address in); without (the values
    check's CPU-only graph) every leaf is a new tensor, neither named an input nor flagged.
    ``types``: the loaded ggml's type codes by name; ``ggml_version``: its version, whose API the
    records follow (``versions``). Read from the spec's rows (``GraphSpec.rows``,
    ``geometry_rows``): a spec the worker was sent has no tensor or geometry objects unless
    something else needs them."""
    GP = GraphProgram
    rows = spec.rows
    index = {row[0]: i for i, row in enumerate(rows)}
    codes = GP.CODES
    version = version_of(ggml_version)
    program: list[int] = []
    reals: list[float] = []
    words: list[int] = []
    names = bytearray()
    no_ints, no_reals, no_args, no_params = [0] * 8, [0.0] * 4, [-1] * 8, {}.get
    padded = {k: (1,) * (4 - k) for k in range(5)}  # a shape of k dimensions, as the record holds it
    leaf_flags = GP.NAME | (GP.INPUT if persistent else 0)
    op_flags = _op_flags(version)
    kept: list[tuple[int, TensorSpec]] = []
    extend, add_reals = program.extend, reals.extend
    for i, (row, geo) in enumerate(zip(rows, spec.geometry_rows, strict=True)):
        name, op_name, type_name, ne, args, params, role, _, output = row
        geo_name, geo_type, geo_ne, geo_nb, view_src, view_offs = geo
        if geo_name != name:
            raise ValueError(f"tensor {name!r}: its geometry row is {geo_name!r}'s (GraphSpec.geometry_rows out of order)")
        ints, real, w = no_ints, no_reals, None
        flags = GP.OUTPUT if output and persistent else 0
        ptr = len(names)
        if op_name == "none":
            arg_ids = no_args
            if persistent and (role == "weight" or role == "cache"):
                op, ptr = codes["persistent"], 0
                kept.append((i, tensor_from_row(row)))
            else:
                op = codes["leaf"]
                flags |= leaf_flags
        else:
            op = codes.get(op_name, -1)
            flags |= op_flags.get(op_name, GP.NAME)
            P = dict(params).get if params else no_params
            if params:
                flags |= GP.INPLACE if P("inplace") else 0
                w = P("op_params")
            ne = ()
            if op_name in ops.RECORDED:
                ne, ints, real = _op_record(op_name, name, P, version, types)
            arg_ids = [index[a] if a is not None else -1 for a in args]
            if len(arg_ids) < 8:
                arg_ids += no_args[len(arg_ids):]
        if flags & GP.NAME:
            names += name.encode() + b"\0"
        extend((op, types[type_name], len(ne) or 1, *ne, *padded[len(ne)], *arg_ids, flags, *ints, ptr,
                len(words) if w is not None else -1, len(w) if w is not None else 0,
                types[geo_type], *geo_ne, *geo_nb, index[view_src] if view_src is not None else -1, view_offs))
        if w is not None:
            words += [int(x) for x in w]
        add_reals(real)
    return GraphProgram(array("q", program), array("d", reals), bytes(names), array("i", words or [0]),
                        array("i", [index[r] for r in spec.roots]), len(rows), index, tuple(kept))


def _op_record(op: str, name: str, P: Callable[..., Any], version: GgmlVersion, types: dict[str, int]) -> ops.Fields:
    """An op's record fields (``ops.fields``): the shape its constructor takes (views and
    reshapes), its eight integer and four real parameters, as ``graph.c``'s ``construct`` reads
    them; ``P`` reads the tensor's parameters. ``Unsupported`` where ``version`` cannot build it."""
    try:
        return ops.fields(op, P, types, version)
    except ops.NotInVersion as e:
        raise Unsupported(f"tensor {name!r}: {e}") from None
