"""The scheduler's re-plans as ggml-alloc's calls tell them: ``sched_hook.c`` interposes
``ggml_gallocr_alloc_graph`` and ``ggml_gallocr_reserve_n``, which ``ggml_backend_sched_alloc_splits``
calls through libggml-base's PLT, and ``ggml_gallocr_reserve``, with which
``ggml_gallocr_alloc_graph`` re-plans a single buffer by itself ("own"); it reports those a
scheduler alloc makes (``llama_worker.Llama`` proves at its start that it sees them). On a Release
build they are the decisions ggml tells nobody else (a callback tells the scheduler's, not
ggml-alloc's own); elsewhere they are held against what the callback or ggml's Debug log told.
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
    k = calls.index("reserve")
    return k == 0 or calls[k - 1] != "failed"


def allocator_decision(rec: dict[str, Any], calls: list[str], call: int, told_by: str | None) -> None:
    """Put the re-plans ggml-alloc's ``calls`` tell into a scheduler alloc's record ``rec``:
    the scheduler's where nothing else told it (``told_by`` ""), ggml-alloc's own where no log
    did (``told_by`` "" or "callback"); what ggml's Debug log (``told_by`` None) or its realloc
    callback ("callback": the scheduler's re-plans) told, held against them, a difference being
    the harness's error (the call is not judged)."""
    replan, own = allocator_replan(calls), "own" in calls
    told = rec.get("realloc")
    sched = told if told is not None and told.get("via") == "sched" else None
    if told_by == "" and replan is not None:
        rec["realloc"] = {"via": "sched", "backend_ids_changed": replan, "reason": UNOBSERVABLE, "allocator": True}
        return
    if told_by != "" and ((sched is None) != (replan is None) or sched is not None and sched["backend_ids_changed"] != replan):
        said = "none" if sched is None else f"backend_ids_changed = {int(sched['backend_ids_changed'])}"
        raise RuntimeError(f"ggml-alloc's calls in alloc (call {call}: {', '.join(calls) or 'none'}) tell "
                           f"{'no re-plan' if replan is None else f'a re-plan, backend_ids_changed = {int(replan)}'}; ggml's "
                           f"{'realloc callback' if told_by == 'callback' else 'debug log'} told {said}")
    if told_by is None and own != (told is not None and told.get("via") == "gallocr"):
        raise RuntimeError(f"ggml-alloc's calls in alloc (call {call}: {', '.join(calls)}) tell "
                           f"{'a' if own else 'no'} re-plan of its single buffer; ggml's debug log told {'none' if own else 'one'}")
    if told is None and own:  # a Release build: ggml-alloc re-planned its single buffer, which nothing else tells
        rec["realloc"] = {"via": "gallocr", "backend_ids_changed": False, "reason": UNOBSERVABLE, "allocator": True}
    elif told is not None:
        told["allocator_agreed"] = True  # ggml's callback or log told it, and the allocator's calls the same
