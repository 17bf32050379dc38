"""The graph ops' table (``model.ops.OPS``): each entry complete, its builds well formed for
``graph.c`` (``ggml.graph_ops``) and the exporter alike."""

from __future__ import annotations

import pytest

from pytest_schedfuzz.ggml import graph_ops
from pytest_schedfuzz.model import ops
from pytest_schedfuzz.model.graph_spec import TensorSpec
from pytest_schedfuzz.model.versions import BUILT_INS


@pytest.mark.parametrize("op", ops.OPS.values(), ids=list(ops.OPS))
def test_every_op_has_a_build_for_every_record(op: ops.Op) -> None:
    """The last build has no condition (``construct`` never falls through to BAD_OP), every
    condition is one of ``WHEN``, every argument token names an argument or parameter the record
    has, and the arguments it indexes are its own."""
    assert op.builds and op.builds[-1].when == ""
    for b in op.builds:
        assert b.when in ("", *ops.WHEN) and b.fn.startswith("ggml_")
        for tok in b.args:
            kind = ops.token(tok)
            if kind is None:
                float(tok.rstrip("f"))  # a C literal: a number
            else:
                assert kind[1] < {"a": op.arity, "f": 4, "n": 4}.get(kind[0], 8), (op.name, tok)
    assert all(arg < op.arity and (table is None or table < op.arity) for arg, table, _ in op.indexes)


def test_the_c_and_the_export_take_the_same_build() -> None:
    """A view of two dims is ``ggml_view_2d`` in both; an in-place add ``ggml_add_inplace``;
    ssm_scan takes K on 0.25.3 only, and 0.15.3 cannot build top_k (its own op in 0.25.3)."""
    from pytest_schedfuzz.cases.export import ExportError, _c_op

    view = TensorSpec("v", op="view", type="f32", ne=(4, 2), args=("x",), params=(("ne", (4, 2)), ("nb", (32,)), ("offset", 4)))
    assert _c_op(view, ["T[0]"], "0.25.3") == "ggml_view_2d(ctx, T[0], 4, 2, 32, 4)"
    assert "case OP_view:\n        if (r[R_NDIMS] == 1) return CALL(ggml_view_1d" in graph_ops.construct_header()
    add = TensorSpec("s", op="add", type="f32", ne=(8,), args=("x", "y"), params=(("inplace", True),))
    assert _c_op(add, ["T[0]", "T[1]"], "0.25.3") == "ggml_add_inplace(ctx, T[0], T[1])"
    scan = TensorSpec("s", op="ssm_scan", type="f32", ne=(8,), args=tuple("abcdefg"), params=(("k", 2),))
    assert _c_op(scan, [f"T[{i}]" for i in range(7)], "0.25.3").endswith(", 2)")
    assert _c_op(scan, [f"T[{i}]" for i in range(7)], "0.15.3").endswith("T[6])")
    with pytest.raises(ExportError, match="GGML_OP_TOP_K is ggml 0.25.3's"):
        _c_op(TensorSpec("k", op="top_k", type="i32", ne=(3,), args=("x",), params=(("k", 3),)), ["T[0]"], "0.15.3")
    assert {v.version: ops.OPS["clamp"].unsupported(v) for v in BUILT_INS} == {"0.25.3": None, "0.15.3": "ggml 0.15.3's ggml_clamp works in place"}


def test_a_captured_node_reads_back_through_the_table() -> None:
    """ggml_set_rows(a, b, c) stores {b, c, a}: the table turns the one into the other both ways;
    a rope's n_dims and mode are its op_params words 1 and 2."""
    set_rows = ops.CAPTURED["SET_ROWS"]
    assert set_rows.args_of(set_rows.srcs(("a", "b", "c"))) == ("a", "b", "c")
    assert ops.CAPTURED["ROPE"].params_of({"op_params": [0, 64, 2]}) == {"n_dims": 64, "mode": 2}
    assert ops.CAPTURED["ROPE"].args_of(("q", "pos")) == ("q", "pos", None)
