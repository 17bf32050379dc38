"""Whether a leaf that ggml sees change backend only moved with the order of the graph's leafs.

ggml compares the leafs' backends position by position (``ggml_backend_sched_alloc_splits``): a
graph walked in another order (b11739's ``llama_set_embeddings`` expands the pooled embeddings
before the logits, so ``output.weight`` becomes the last leaf) shifts every leaf after the first
difference, and whichever leaf lands first reads as moved. ``observe.GraphReading`` names that
``reordered``, not the leaf's kind, so that one cause keeps one signature.
"""

from __future__ import annotations


def reordered(prev_names: list[str], prev_ids: list[int], names: list[str], ids: list[int], at: int) -> bool:
    """Whether leaf ``at`` changed backend only because the leafs are in another order: another
    leaf sits there than at the last split, and the graph has the same leafs, each on the same
    backend as before (ggml compares by position, so a leaf walked earlier shifts the rest).

    >>> reordered(["a", "w"], [1, 0], ["w", "a"], [0, 1], 0), reordered(["a", "w"], [1, 0], ["a", "w"], [1, 1], 1)
    (True, False)
    """
    return (len(prev_names) == len(prev_ids) and at < len(prev_names) and prev_names[at] != names[at]
            and sorted(zip(prev_names, prev_ids)) == sorted(zip(names, ids)))
