"""``schedfuzz coverage``: a coverage build of the built-in ggml counts what the graph engine's
runs reach in the scheduler and the allocator, and tells the branches no caller can take
(an assertion's failing side, an error path) from those the generators have not reached."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from pytest_schedfuzz.builds.compile import build_ggml_base, coverage_build
from pytest_schedfuzz.campaign.fuzz import Fuzzer
from pytest_schedfuzz.ggml.graph_target import GgmlTarget
from pytest_schedfuzz.model.graph_spec import GraphBuilder
from pytest_schedfuzz.model.layout import BackendLayout, BackendSpec
from pytest_schedfuzz.model.scenario import Scenario, SchedParams, Step
from pytest_schedfuzz.profiles import FuzzConfig
from pytest_schedfuzz.tools.coverage import lines, measure, own_counts, zero_counts

Held = Callable[[str], tuple[Path, Path]]


@pytest.fixture
def held() -> Iterator[Held]:
    """A built-in ggml's coverage build, its library folder and build folder, held for the test
    with its counts zeroed (``own_counts``): the tests of another worker measure the same one."""
    with ExitStack() as stack:
        def hold(version: str) -> tuple[Path, Path]:
            lib = build_ggml_base(version, coverage=True)
            build = coverage_build(lib)
            stack.enter_context(own_counts(build))
            return lib, build
        yield hold


@pytest.mark.engine
def test_a_coverage_build_counts_what_a_run_reaches_and_tells_unreachable_branches_apart(held: Held) -> None:
    lib, build = held("ggml-0.25.3")
    b = GraphBuilder()
    y = b.op("mul_mat", b.weight("w", (16, 16), device=0), b.input("x", (16, 4)), name="y")
    sc = Scenario(BackendLayout.of("cpu"), (("g", b.build(b.op("add", y, y, name="z"))),),
                  (Step("sched_new", params=SchedParams(64, False, False)), Step("reserve", "g"), Step("compute", "g")))
    f = Fuzzer(FuzzConfig(database=None, lib=str(lib)))
    try:
        assert f.check("matches-reference", sc) == []
    finally:
        f.close()  # the worker exits at the end of its input and writes its counts
    fns = {fn.name.split("(")[0]: fn for fn in measure(build, lib.parent / "ggml")}
    assert fns["ggml_backend_sched_split_graph"].lines_hit > 100 and fns["ggml_gallocr_reserve_n_impl"].branches_hit > 10
    assert fns["ggml_backend_sched_reserve_size"].lines_hit == 0  # the scenario never called it
    missed = [(s, why) for fn in fns.values() for _, s, why in fn.missed]
    assert any("GGML_ASSERT" in s and why.startswith("an assertion's failing side") for s, why in missed)
    assert any(not why for _, why in missed)  # reachable, not reached by one small scenario
    report = "\n".join(lines(list(fns.values())))
    assert "ggml_backend_sched_split_graph" in report and "branches reachable from the public API" in report


@pytest.mark.engine
def test_an_eval_callback_step_reaches_compute_splits_callback_path(held: Held) -> None:
    """What the coverage list showed no example reached: with ``eval_callback``
    (``ggml_backend_sched_set_eval_callback``, asking for each MUL_MAT), ``compute_splits``
    computes each split in pieces; the same compute without it takes none of those branches.
    The values are those of the CPU alone either way."""
    lib, build = held("ggml-0.25.3")
    b = GraphBuilder()
    y = b.op("mul_mat", b.weight("w", (16, 16), device=0), b.input("x", (16, 4)), name="y")
    g = b.build(b.op("add", b.op("mul_mat", b.weight("w2", (16, 16), device=1), y, name="z"), y, name="o"))
    reached: list[tuple[int, list[int]]] = []
    for callback in (False, True):
        zero_counts(build)
        steps = (Step("sched_new", params=SchedParams(64, False, False)),) + ((Step("eval_callback"),) if callback else ()) + (Step("compute", "g"),)
        f = Fuzzer(FuzzConfig(database=None, lib=str(lib)))
        try:
            assert f.check("same-values", Scenario(BackendLayout((BackendSpec("gpu"), BackendSpec("cpu"))), (("g", g),), steps)) == []
        finally:
            f.close()
        splits = next(fn for fn in measure(build, lib.parent / "ggml") if fn.name.startswith("ggml_backend_sched_compute_splits("))
        reached.append((splits.branches_hit, [line for line, source, _ in splits.missed if "callback_eval(t, true" in source]))
    (plain, plain_missed), (called, called_missed) = reached
    assert called > plain + 5 and len(called_missed) < len(plain_missed), reached


@pytest.mark.engine
def test_a_routed_expert_matmul_offloaded_by_cuda_batch_copies_only_the_used_experts(held: Held) -> None:
    """What the coverage list showed no example reached: a ``MUL_MAT_ID`` whose experts are in
    host memory, offloaded to a device whose ``offload_op`` measures its batch as ggml-cuda does
    (``ne[2]``: tokens), makes ``compute_splits`` copy only the experts the ids use. Measured by
    ``ne[1]`` (the used experts per token) the op stays on the CPU and none of it runs. The engine
    agrees with the reference on where the op goes, and its values are those of the CPU alone."""
    lib, build = held("ggml-0.25.3")
    b = GraphBuilder()
    x = b.op("mul_mat", b.weight("w", (16, 16), device=0), b.input("x", (16, 8)), name="y")
    moe = b.op("mul_mat_id", b.weight("exps", (16, 16, 8), device=1), b.op("reshape", x, name="moe_in", ne=[16, 1, 8]),
               b.input("ids", (2, 8), "i32"), name="moe")
    g = b.build(b.op("cont", b.op("view", moe, name="moe_v", ne=[16, 8], nb=[16 * 4 * 2]), name="out"))
    reached = []
    for cuda_batch in (False, True):
        zero_counts(build)
        gpu = BackendSpec("gpu", offload_min_batch=8, cuda_batch=cuda_batch)
        sc = Scenario(BackendLayout((gpu, BackendSpec("cpu"))), (("g", g),),
                      (Step("sched_new", params=SchedParams(64, False, True)), Step("reserve", "g"), Step("compute", "g")))
        f = Fuzzer(FuzzConfig(database=None, lib=str(lib)))
        try:
            assert f.check("matches-reference", sc) == [] and f.check("same-values", sc) == []
            step = f.predict(sc).records[2]
            moe_backend = step.node_backends[step.node_names.index("moe")]
        finally:
            f.close()
        splits = next(fn for fn in measure(build, lib.parent / "ggml") if fn.name.startswith("ggml_backend_sched_compute_splits("))
        reached.append((moe_backend, [line for line, source, _ in splits.missed if "copy_experts(first_id, last_id)" in source]))
    (plain_backend, plain_missed), (cuda_backend, cuda_missed) = reached
    assert (plain_backend, cuda_backend) == (1, 0), reached  # the CPU, then the device
    assert len(cuda_missed) < len(plain_missed), reached


@pytest.mark.engine
def test_a_copy_between_two_gpu_like_devices_is_a_peer_copy(held: Held) -> None:
    """What the coverage list showed no example reached: ``compute_splits`` hands a split input
    from one GPU-like device to another to the destination's ``cpy_tensor_async`` (a peer copy,
    as ggml-cuda's), which takes it; from the CPU it refuses and the copy is synchronous. The
    values are those of the CPU alone either way."""
    lib, build = held("ggml-0.25.3")
    b = GraphBuilder()
    y = b.op("mul_mat", b.weight("w", (16, 16), device=0), b.input("x", (16, 4)), name="y")
    g = b.build(b.op("add", b.op("mul_mat", b.weight("w2", (16, 16), device=1), y, name="z"), y, name="o"))
    reached = []
    for first in ("rpc", "gpu"):
        zero_counts(build)
        layout = BackendLayout((BackendSpec(first), BackendSpec("gpu"), BackendSpec("cpu")))
        sc = Scenario(layout, (("g", g),), (Step("sched_new", params=SchedParams(64, False, False)), Step("compute", "g")))
        f = Fuzzer(FuzzConfig(database=None, lib=str(lib)))
        try:
            assert f.check("same-values", sc) == []
        finally:
            f.close()
        splits = next(fn for fn in measure(build, lib.parent / "ggml") if fn.name.startswith("ggml_backend_sched_compute_splits("))
        text = next((lib.parent / "ggml").rglob("ggml-backend.cpp")).read_text().splitlines()
        asked = next(n for n in range(splits.line, len(text)) if "cpy_tensor_async(input_backend" in text[n - 1])
        # refused, the scheduler waits for the source and copies synchronously (the next line)
        reached.append((asked in splits.reached_lines, asked + 1 in splits.reached_lines))
    from_rpc, from_gpu = reached
    assert from_rpc == (True, True) and from_gpu == (True, False), reached


@pytest.mark.engine
def test_the_corpus_seed_copies_only_the_used_experts(held: Held) -> None:
    """The starter corpus's coverage seed (replayed by every ci run, so that the figure does not
    hang on a rare draw) takes ``compute_splits``' used-experts copy on ggml 0.15.3."""
    from pytest_schedfuzz.cases.corpus import case_files, load_case

    seed = next(load_case(p) for p in case_files(Path(__file__).resolve().parents[2] / "corpus") if "used-experts" in p.name)
    assert seed.scenario is not None and seed.expect == "pass"
    lib, build = held("ggml-0.15.3")
    with GgmlTarget(lib=str(lib)) as t:
        trace = t.run(seed.scenario)
    assert trace.abort is None
    # the copy of a run of used experts (its lambda) and its call after the loop; the call on a gap
    # between used experts needs ids with holes, and the values oracle's ids count up from 0
    fns = measure(build, lib.parent / "ggml")
    copy = next(fn for fn in fns if fn.name.startswith("ggml_backend_sched_compute_splits(") and "lambda" in fn.name)
    splits = next(fn for fn in fns if fn.name.startswith("ggml_backend_sched_compute_splits(") and "lambda" not in fn.name)
    assert copy.lines_hit == copy.lines and copy.reachable_hit == copy.reachable > 0
    assert len([line for line, source, _ in splits.missed if "copy_experts(first_id, last_id)" in source]) <= 1
