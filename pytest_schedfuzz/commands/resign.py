"""``schedfuzz resign``: a corpus's known bugs signed again by today's judges, on one build.

A signature names a root cause; when the judges learn to name a cause better (the topology of
the re-plan that lost a reservation, a build-independent word for what moved), the cases saved
under the old words would no longer match what a replay shows, and their known bug would be
reported as new. ``resign`` runs each case as it failed: a graph case's recorded scenario (for a
guard of a driver's policy, the decisions that failed then), a llama.cpp case's workload where its
known bug is expected on the run's build (its ggml version and, where the case names builds,
that build). Where that shows the case's property at the case's own
step under one other signature (and not under its own), it writes that signature into the case,
keeping the old one in ``signed_as``. The
file keeps its name (other cases and the docs refer to it); nothing else in it changes. It prints,
for the build, the distinct signatures before and after and which ones merged.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import replace

from ..cases.corpus import Case, CaseError
from ..engine import Unsupported
from ..files import atomic_write
from ..properties.base import Violation
from . import bad_case, load_all, replaying_fuzzer


def new_signature(case: Case, found: list[Violation]) -> str | None:
    """The signature the replay shows for ``case``'s property at its step (or, where it shows
    none there, at its first failing step), if it is not the case's own: the one of them that
    keeps most of the case's facts (``explained=lost`` beside a ``not-dominating`` at the same
    call); None where the case's own shows, nothing shows, or no one of them keeps the most."""
    mine = [v for v in found if v.property == case.property]
    if not mine or any(v.signature() == case.signature for v in mine):
        return None
    at = [v for v in mine if v.step == case.step] or [v for v in mine if v.step == mine[0].step]
    kept = {v.signature(): sum(f"{k}={x}" in case.signature for k, x in v.facts.items()) for v in at}
    best = max(kept.values())
    chosen = [sig for sig, n in kept.items() if n == best]
    return chosen[0] if len(chosen) == 1 else None


def resign(args: argparse.Namespace) -> int:
    try:
        cases = load_all(args.cases)
    except CaseError as e:
        return bad_case(e)
    fuzzer = replaying_fuzzer(args)  # with the known bugs a replay judges with: a case is signed as its replay signs it
    before: set[str] = set()
    after: set[str] = set()
    merged: dict[str, set[str]] = defaultdict(set)
    changed = 0
    try:
        for case in cases:
            llama = case.llama is not None
            version = fuzzer.engines.ggml_version(llama)
            off = case.off_build(version, fuzzer.engines.gpu_device()) if llama else None
            if (llama and case.expected_failure_on(version, fuzzer.engines.llama_build()) is None) or off is not None:
                continue
            before.add(case.signature)
            try:
                found = fuzzer.replay(case) if case.scenario is None else fuzzer.check_until_shown(case, case.scenario)
            except Unsupported as e:
                print(f"{case.path}: cannot replay it on this build: {e}")
                after.add(case.signature)
                continue
            new = new_signature(case, found)
            if new is None:
                shown = "its own signature" if any(v.signature() == case.signature for v in found) else \
                    f"{len({v.signature() for v in found if v.property == case.property})} signature(s) of its property"
                print(f"{case.path}: kept {case.signature} (the replay shows {shown})")
                after.add(case.signature)
                continue
            assert case.path is not None
            text = json.dumps(replace(case, signature=new, signed_as=(*case.signed_as, case.signature)).to_json(), indent=1, sort_keys=True) + "\n"
            atomic_write(case.path, lambda tmp, text=text: tmp.write_text(text))
            print(f"{case.path}: {case.signature}\n    -> {new}")
            changed += 1
            after.add(new)
            merged[new].add(case.signature)
    finally:
        fuzzer.close()
    print(f"resign: {changed} case(s) signed again; distinct signatures shown on this build: {len(before)} before, {len(after)} after")
    for new, olds in sorted(merged.items()):
        if len(olds) > 1 or new in before:
            print(f"  merged into {new}:\n" + "\n".join(f"    {o}" for o in sorted(olds)))
    return 0
