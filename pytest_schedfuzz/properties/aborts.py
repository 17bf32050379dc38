"""no-abort: no ggml abort, crash or hang the reference does not predict, signed by its check (an
assert's site) or, for a crash without one, by the top frames of its C stack."""

from __future__ import annotations

import re

from reference.alloc import KEPT_PLAN, MEASURED_PLAN

from ..model.scenario import Scenario, Step
from ..model.trace import Abort, Trace
from .base import ENGINE, REFERENCE, Draws, Export, PropertyEntry, Violation
from .sites import check_site, server_death, server_refusal, site_key


def with_c_stack(cause: str, message: str, depth: int = 3) -> str:
    """A signal's cause with the top ``depth`` functions of the C stack the worker printed
    (``process/crash.py``): two segfaults in different functions are two findings. A function's
    type- or implementation-specialized variants are one function (ggml 0.15.3's
    ``ggml_compute_forward_set_rows_f32`` is 0.25.3's ``..._set_rows_impl``), so one bug keeps
    one signature across ggml versions.

    >>> with_c_stack("SIGSEGV", "C stack: ggml_cpu_fp32_to_fp32 < ggml_compute_forward_set_rows_f32 < ggml_compute_forward_set_rows < ggml_compute_forward")
    'SIGSEGV in ggml_cpu_fp32_to_fp32 < ggml_compute_forward_set_rows < ggml_compute_forward'
    """
    m = re.search(r"^C stack: (.+)$", message, re.MULTILINE)
    if not m:
        return cause
    frames: list[str] = []
    for f in m.group(1).split(" < "):
        f = re.sub(r"_(impl|f32|f16|bf16|q\d_[\dK]|[a-z]?\d+)$", "", f)
        if not frames or frames[-1] != f:
            frames.append(f)
    return f"{cause} in {' < '.join(frames[:depth])}"


def without_c_stack(signature: str) -> str:
    """A signature with a crash's C stack left out: the same case crashing in functions of
    other names (another build of the same bug) compares equal."""
    return re.sub(r"(killed by SIG\w+) in [^,\]]+", r"\1", signature)


def unlike_prediction(a: Abort, p: Abort) -> str:
    """How the engine's abort ``a`` differs from the one the reference predicts, ``p``; "" when it
    is that one: the same step and kind, the same assert or ``GGML_ABORT`` text where the
    reference names one, and for a crash the same signal, in the function it names where the
    worker printed a C stack: the function or, where the reference names its callers (``in f < g <
    h``), one of them (a Release build inlines static functions into their callers).

    >>> crash = Abort(1, "crash", "SIGSEGV in ggml_vbuffer_tensor_alloc < ggml_gallocr_alloc_graph: the CPU buffer is NULL")
    >>> unlike_prediction(Abort(1, "crash", "the worker was killed by SIGSEGV\\nC stack: ggml_vbuffer_tensor_alloc < f"), crash)
    ''
    >>> unlike_prediction(Abort(1, "crash", "the worker was killed by SIGSEGV\\nC stack: ggml_gallocr_alloc_graph < f"), crash)
    ''
    >>> unlike_prediction(Abort(1, "abort", "ggml-alloc.c:99: GGML_ASSERT(buffer) failed"), crash)
    'an abort, where the reference predicts a crash'
    """
    if a.step != p.step:
        return f"at step {a.step}, where the reference predicts step {p.step}"
    if a.kind != p.kind:
        return f"{'an' if a.kind[0] in 'aeiou' else 'a'} {a.kind}, where the reference predicts a {p.kind}"
    expected = re.search(r"GGML_ASSERT\(.*?\) failed", p.message)
    if expected and expected.group(0).split(" (")[0] not in a.message:
        return f"another assert than the reference's {expected.group(0)}"
    aborted = re.match(r"GGML_ABORT: (.+?)(?: \(|$)", p.message)
    if aborted and aborted.group(1) not in a.message:
        return f"another abort than the reference's {aborted.group(1)!r}"
    crashed = re.match(r"(SIG\w+) in (\w+(?: < \w+)*)", p.message) if p.kind == "crash" else None
    if crashed:
        signal, chain = crashed.group(1), crashed.group(2).split(" < ")
        if f"killed by {signal}" not in a.message:
            return f"not the {signal} the reference predicts"
        stack = re.search(r"^C stack: (.+)$", a.message, re.MULTILINE)
        if stack and not set(chain) & set(stack.group(1).split(" < ")[:3]):
            return f"a {signal} in {stack.group(1).split(' < ')[0]}, where the reference predicts one in {chain[0]}"
    return ""


def no_abort(scenario: Scenario, trace: Trace, prediction: Trace) -> list[Violation]:
    """Valid scenarios never abort the engine."""
    a = trace.abort
    if a is None:
        return []
    step: Step = scenario.steps[a.step] if a.step < len(scenario.steps) else Step("?")
    predicted = " (the reference predicts it: " + prediction.abort.message + ")" if prediction.abort else ""
    first = a.message.strip().splitlines()[0] if a.message.strip() else a.kind
    # ggml prefixes its source path (a build directory): keep the file name, drop line numbers
    first = re.sub(r"\S*/(\w[\w.-]*\.(?:c|cpp|h)):\d+", r"\1", first)
    kind = re.sub(r"\d+", "N", first)[:100]
    if a.kind == "crash":
        first = with_c_stack(first, a.message)
        kind = with_c_stack(kind, a.message)
    facts = {"kind": a.kind, "message": kind}
    site = site_key(a.message)
    if site:  # one assert text has many sites (ggml-backend.cpp has fifteen GGML_ASSERT(buffer))
        facts["site"] = site
    # the RPC client reports every server failure alike: a server that died (and how), or the
    # command a live one refused and why (its log), is what separates one server failure from another
    died = server_death(a.servers, a.message) or server_refusal(a.refused)
    if died:
        facts["server"] = died
    if a.kind == "crash":  # a signal says less than an assert: add the kind of step it hit
        facts["during"] = step.kind
    # the reference's ggml-alloc explains it: a failed reservation kept its new plan, and its
    # buffers (NULL, or older and smaller) cannot hold it. Whether that shows as a crash or an
    # assert depends on which buffer the first misplaced tensor is in
    # (only if ggml's abort is the one predicted: another abort at that step is another finding)
    measured = prediction.abort is not None and MEASURED_PLAN in prediction.abort.message and not unlike_prediction(a, prediction.abort)
    kept = prediction.abort is not None and KEPT_PLAN in prediction.abort.message and not unlike_prediction(a, prediction.abort)
    if kept or "failed to allocate" in a.message or any(not r.ok for r in trace.records if r.kind in ("reserve", "alloc", "compute")):
        # ggml could not allocate a buffer (it logged so, said no to an earlier step, or the
        # reference says so) and went on: a different story, whichever step then fails
        facts["after"] = "failed allocation"
        facts.pop("during", None)
        if kept:
            facts = {"after": "failed allocation", "plan": "kept", "kind": a.kind}
    if measured:
        # the reference's ggml-alloc explains it too: a reserve_size measurement recorded its graph's
        # plan and freed the buffers too small for it (no_alloc), and a later alloc of a graph that
        # plan fits places its tensors in them
        facts = {"after": "reserve_size", "plan": "measured", "kind": a.kind}
    # a crash has no assert text: its last output (ggml's, the C library's) is the explanation
    tail = "\n".join(a.message.strip().splitlines()[-12:]) if a.kind == "crash" else ""
    detail = f"\nlast output:\n{tail}" if tail and tail != first else ""
    return [Violation("no-abort", a.step, f"ggml {a.kind} during {step.describe()}: {first}{at_site(a.message)}{predicted}{detail}", facts)]


def at_site(message: str) -> str:
    """`` (check: file:line, in function)`` for an abort whose site ggml printed, else ""."""
    site = check_site(message)
    return f" (check: {site})" if site else ""


# every engine property reports aborts; no-abort's own examples are what none of them draws:
# workloads with many reconfigurations, and raw scenarios
NO_ABORT = PropertyEntry(
    "no-abort", "valid scenarios never abort, crash or hang ggml",
    needs=frozenset({ENGINE, REFERENCE}), draws=Draws("both", max_ubatches=6, min_reconfigures=2),
    judge=lambda sc, o: no_abort(sc, o.trace, o.prediction),
    export=Export("death", "ggml aborts (its abort callback) or the process dies of a signal at the step"))
ENTRIES = (NO_ABORT,)
