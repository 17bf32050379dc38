"""Workloads drawn next to one that found a cause (``strategies.neighbours``): one dimension drawn
again, the others kept, every one valid; a campaign that keeps going favours what found a cause."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from pytest_schedfuzz.model.devices import DeviceLimits
from pytest_schedfuzz.model.llama_model import ModelSpec
from pytest_schedfuzz.model.llama_workload import Call, ContextParams, Devices, LlamaWorkload, Part
from pytest_schedfuzz.strategies.llama_workloads import FAMILIES
from pytest_schedfuzz.strategies.neighbours import DIMENSIONS, neighbours

FOUND = LlamaWorkload(ModelSpec(n_layer=1), Devices(n_rpc=1), ContextParams(n_seq_max=2),
                      (Call("decode", (Part(0, 7, "last"),)), Call("set_warmup", seq=0, on=True), Call("decode", (Part(0, 5, "last"),))))
PARTS = {"model": lambda w: w.model, "devices": lambda w: w.devices, "context": lambda w: w.ctx, "calls": lambda w: w.calls}
redrawn: set[str] = set()
kinds: set[str] = set()


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(neighbours((FOUND,), 3, DeviceLimits.of(rpc=2, gpu=2), 24, FAMILIES, frozenset({"moe_cache_size"})))
def _drawn(w: LlamaWorkload) -> None:
    w.validate()
    changed = [d for d in DIMENSIONS if PARTS[d](w) != PARTS[d](FOUND)]
    # one dimension drawn again; an MTP model may bring its draft, and its MTP layer onto a device of its own
    assert len(changed) <= 1 or changed == ["model", "devices"] and w.model.kind == "mtp" and w.devices.overrides, changed
    assert w.loras == FOUND.loras and (w.draft == FOUND.draft or w.model.kind == "mtp")
    redrawn.update(changed)
    kinds.add(w.model.kind)


def test_a_neighbour_draws_one_dimension_of_a_found_workload_again() -> None:
    redrawn.clear()
    _drawn()
    assert redrawn == set(DIMENSIONS) and {"mtp", "mamba2"} <= kinds
