"""The scheduler's re-plans as ggml-alloc's calls tell them: ``sched_hook.c`` interposes
``ggml_gallocr_alloc_graph`` and ``ggml_gallocr_reserve_n``, which ``ggml_backend_sched_alloc_splits``
calls through libggml-base's PLT, and reports those a scheduler alloc makes (``worker.Llama``
proves at its start that it sees them). On a Release build without ggml's realloc callback they
are the decision; elsewhere they are held against what the callback or ggml's Debug log told.
"""

from __future__ import annotations

from typing import Any

from ..model.trace import UNOBSERVABLE


def allocator_replan(calls: list[str]) -> bool | None:
    """The re-plan ``ggml_backend_sched_alloc_splits`` made, read from ggml-alloc's calls in one
    scheduler alloc ("alloc", "failed", "reserve", in order): None for none; else its
    ``backend_ids_changed``, true when ``ggml_gallocr_reserve_n`` came without a failed
    ``ggml_gallocr_alloc_graph`` before it (alloc_splits does not try to allocate when the
    backend ids changed).

    >>> allocator_replan(["alloc"]), allocator_replan(["failed", "reserve", "alloc"]), allocator_replan(["reserve", "alloc"])
    (None, False, True)
    """
    if "reserve" not in calls:
        return None
    return calls.index("reserve") == 0 or calls[calls.index("reserve") - 1] != "failed"


def allocator_decision(rec: dict[str, Any], calls: list[str], call: int, told_by: str | None) -> None:
    """Put the re-plan ggml-alloc's ``calls`` tell into a scheduler alloc's record ``rec``:
    the decision itself where nothing else told it (``told_by`` ""); else, where ggml's Debug log
    (``told_by`` None) or its realloc callback ("callback") told it, held against it, a
    difference being the harness's error (the call is not judged)."""
    replan = allocator_replan(calls)
    told = rec.get("realloc") if rec.get("realloc", {}).get("via") == "sched" else None
    if told is None and replan is not None and told_by == "":
        rec["realloc"] = {"via": "sched", "backend_ids_changed": replan, "reason": UNOBSERVABLE, "allocator": True}
    elif (told is None) != (replan is None) or told is not None and told["backend_ids_changed"] != replan:
        said = "none" if told is None else f"backend_ids_changed = {int(told['backend_ids_changed'])}"
        raise RuntimeError(f"ggml-alloc's calls in alloc (call {call}: {', '.join(calls) or 'none'}) tell "
                           f"{'no re-plan' if replan is None else f'a re-plan, backend_ids_changed = {int(replan)}'}; ggml's "
                           f"{'realloc callback' if told_by == 'callback' else 'debug log'} told {said}")
    elif told is not None:
        told["allocator_agreed"] = True  # ggml's callback or log told it, and the allocator's calls the same
