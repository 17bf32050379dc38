"""``schedfuzz mutate``: a mutation score of the harness against the real scheduler.

Each mutant is one small change to ggml 0.25.3's ``ggml-backend.cpp`` or ``ggml-alloc.c`` (the
scheduler and the allocator), built into its own ``libggml-base`` (``builds.compile.build_ggml_base``).
The ci profile then runs on it, in a fresh folder with a copy of the corpus, exactly as a
pre-merge job would (``pytest --schedfuzz --schedfuzz-profile=ci``). A mutant is killed when
that run reports a finding (or a corpus case that no longer behaves), and survives when it
passes; a run that fails for another reason (the harness) is an error, never a kill. The
score is killed / all.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..builds.compile import Patch, build_ggml_base
from ..campaign.summary import CUT_SHORT_EXIT
from ..properties import GRAPH_PROPERTY_IDS
from .ci_run import run_ci_profile

BACKEND, ALLOC = "src/ggml-backend.cpp", "src/ggml-alloc.c"


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str  # the scheduler change in ggml's terms
    patch: Patch


_GPU_DOWN = """    // expand gpu down
    {
        int cur_backend_id = -1;
        for (int i = 0; i < graph->n_nodes; i++) {
            struct ggml_tensor * node = graph->nodes[i];
            if (ggml_is_view_op(node->op)) {
                continue;
            }
            int * node_backend_id = &tensor_backend_id(node);
            if (*node_backend_id != -1) {
                if (*node_backend_id == sched->n_backends - 1) {
                    // skip cpu (lowest prio backend)
                    cur_backend_id = -1;"""

MUTANTS: tuple[Mutant, ...] = (
    Mutant("cpu-expands-down", "pass 2: 'expand gpu down' no longer skips the CPU",
           Patch(BACKEND, _GPU_DOWN, _GPU_DOWN.rsplit("cur_backend_id = -1;", 1)[0] + "cur_backend_id = *node_backend_id;")),
    Mutant("rope-follows-weights", "pass 1: ROPE is no longer exempt from following its weights",
           Patch(BACKEND, "    allow = allow && tensor->op != GGML_OP_ROPE;", "    allow = allow;")),
    Mutant("views-follow-consumer", "pass 4: a view src without a backend takes its consumer's, not its view source's",
           Patch(BACKEND, "                    // views are always on the same backend as the source\n"
                          "                    *src_backend_id = tensor_backend_id(src->view_src);",
                 "                    *src_backend_id = *cur_backend_id;")),
    Mutant("no-weight-split", "pass 5: no new split when a node reads a weight from an incompatible backend",
           Patch(BACKEND, "                        if (src_backend_id != cur_backend_id && !ggml_backend_sched_buffer_supported(sched, src, cur_backend_id)) {\n"
                          "                            need_new_split = true;",
                 "                        if (false) {\n                            need_new_split = true;")),
    Mutant("pass3-ignores-srcs", "pass 3: upgrades a node even when a src is not readable there",
           Patch(BACKEND, "                    if (supported) {\n                        *node_backend_id = b;",
                 "                    if (supported || true) {\n                        *node_backend_id = b;")),
    Mutant("no-pass6", "pass 6: input leafs are no longer graph inputs with n_copies > 1",
           Patch(BACKEND, "    if (sched->n_copies > 1) {\n        for (int i = 0; i < graph->n_leafs; i++) {",
                 "    if (false) {\n        for (int i = 0; i < graph->n_leafs; i++) {")),
    Mutant("graph-size-no-copies", "graph_size forgets n_copies",
           Patch(BACKEND, "total_inputs * 2 * sched->n_copies + n_dep_nodes;", "total_inputs * 2 + n_dep_nodes;")),
    Mutant("ids-changed-any-buft", "backend_ids_changed: any id change counts, whatever the buffer type",
           Patch(BACKEND, "        if (sched->node_backend_ids[i] != sched->prev_node_backend_ids[i] &&\n"
                          "            sched->bufts[sched->node_backend_ids[i]] != sched->bufts[sched->prev_node_backend_ids[i]]) {",
                 "        if (sched->node_backend_ids[i] != sched->prev_node_backend_ids[i]) {")),
    Mutant("ids-changed-no-leafs", "backend_ids_changed: the leaf loop is gone",
           Patch(BACKEND, "    if (!backend_ids_changed) {\n        for (int i = 0; i < sched->graph.n_leafs; i++) {",
                 "    if (false) {\n        for (int i = 0; i < sched->graph.n_leafs; i++) {")),
    Mutant("alloc-no-leaf-count", "ggml_gallocr_needs_realloc: a different number of leafs no longer re-plans",
           Patch(ALLOC, "    if (galloc->n_leafs != graph->n_leafs) {", "    if (false) {")),
    Mutant("alloc-sizes-ignored", "ggml_gallocr_node_needs_realloc: every planned size is taken as large enough",
           Patch(ALLOC, "    return talloc->size_max >= node_size;", "    return true;")),
    Mutant("copy-always-0", "alloc_graph: next_copy stays 0 (pipeline copies never rotate)",
           Patch(BACKEND, "    sched->next_copy = (sched->next_copy + 1) % sched->n_copies;", "    sched->next_copy = 0;")),
    Mutant("offload-ignores-op-offload", "pass 1: offload_op is asked even with op_offload off",
           Patch(BACKEND, "if (sched->op_offload && src_backend_id == sched->n_backends - 1", "if (src_backend_id == sched->n_backends - 1")),
    Mutant("alloc-inplace-any-op", "ggml_gallocr_allocate_node: any op may take its parent's memory (not only ops that can run in place)",
           Patch(ALLOC, "        if (ggml_op_can_inplace(node->op)) {", "        if (true) {")),
    Mutant("no-split-sync", "compute_splits: no wait for the previous backend's async work before a split without inputs (0.15.3's race)",
           Patch(BACKEND, "        if (split->n_inputs == 0 && prev_backend_id >= 0 && prev_backend_id != split_backend_id) {",
                 "        if (false) {")),
)


def mutant(name: str) -> Mutant:
    """The mutant called ``name``."""
    return next(m for m in MUTANTS if m.name == name)


@dataclass(frozen=True)
class Outcome:
    mutant: Mutant
    verdict: str  # "killed", "survived", or "error" (the harness failed: neither)
    by: str  # what failed (items and first lines), or why it survived
    seconds: float

    @property
    def killed(self) -> bool:
        return self.verdict == "killed"


# a failed item that is a finding: a property's report, or a corpus case that changed
# a property's finding, or a corpus case the mutant changed (a guard failing, or a known bug that
# no longer reproduces: strict XPASS): either way the ci run saw the mutant
_FINDING = re.compile(r"^(schedfuzz::corpus/\S+|\S+ - (\[|\d+ distinct findings|\S+\.json))")


def run_mutant(m: Mutant, corpus: Path, budget: float | None, log: Path | None = None, size_oracle: bool = False) -> Outcome:
    """Build ``m``, run the ci profile on it in a fresh folder; killed if that run fails."""
    t0 = time.monotonic()
    lib = build_ggml_base("ggml-0.25.3", (m.patch,))
    # the graph properties only: the mutant is ggml's scheduler, and the llama.cpp target runs its
    # own libllama (it would only take its share of the budget)
    proc = run_ci_profile(lib, corpus, budget, properties=GRAPH_PROPERTY_IDS, extra=["--schedfuzz-size-oracle"] if size_oracle else [],
                          tag=f"mutant-{m.name}")
    out = proc.stdout + proc.stderr
    if log is not None:
        log.write_text(out)
    failed = [line.removeprefix("FAILED ") for line in out.splitlines() if line.startswith("FAILED ")]
    findings = [f for f in failed if _FINDING.match(f)]
    if proc.returncode == 0:
        verdict, by = "survived", "the ci profile passed"
    elif proc.returncode == CUT_SHORT_EXIT and not findings:
        said = next((line for line in out.splitlines() if line.startswith("CUT SHORT: ")), "CUT SHORT")
        verdict, by = "survived", f"nothing failed in what ran, but the budget cut the ci profile short ({said.split(' in the time')[0]})"
    elif findings:
        verdict, by = "killed", "; ".join(f[:160] for f in findings[:3])
    else:
        tail = failed[:3] or (out.strip().splitlines() or ["?"])[-1:]
        verdict, by = "error", f"the harness failed (pytest exit {proc.returncode}): " + "; ".join(t[:200] for t in tail)
    return Outcome(m, verdict, by, time.monotonic() - t0)


def main(names: list[str] | None, corpus: Path, budget: float | None, logs: Path | None, size_oracle: bool = False) -> int:
    chosen = [m for m in MUTANTS if not names or m.name in names]
    unknown = set(names or ()) - {m.name for m in MUTANTS}
    if unknown:
        print(f"schedfuzz mutate: unknown mutants {', '.join(sorted(unknown))} (known: {', '.join(m.name for m in MUTANTS)})", file=sys.stderr)
        return 2
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
    outcomes = []
    for m in chosen:
        o = run_mutant(m, corpus, budget, logs / f"{m.name}.log" if logs else None, size_oracle)
        outcomes.append(o)
        print(f"{m.name:<28} {o.verdict.upper():<8} {o.seconds:6.0f} s  {m.what}\n{'':<38}{o.by}", flush=True)
    killed = sum(o.killed for o in outcomes)
    errors = [o.mutant.name for o in outcomes if o.verdict == "error"]
    print(f"\nkill score: {killed}/{len(outcomes)} = {killed / max(1, len(outcomes)):.0%}"
          + (f" ({len(errors)} harness errors, not counted as kills: {', '.join(errors)})" if errors else ""))
    return 1 if errors else 0
