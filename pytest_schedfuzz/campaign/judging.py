"""Which llama.cpp judges judge the next run of a workload (``LlamaJudges``), and what that run
must make for them: its graphs captured (llama-matches-reference), a second run on the CPU alone
(llama-same-logits). A campaign spends its time where the causes are: while it generates on time,
the judges that cost more than the run they judge (``properties.COSTLY``) judge a sample; while
Hypothesis shrinks a failure, its property judges alone; and a llama.cpp whose ggml the reference
has no rules for is not captured for nothing. A replay judges with every judge it asks for."""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass

from .. import properties as props
from ..model.llama_workload import LlamaWorkload
from ..properties.llama_logits import compares_logits
from .stats import Stats


def in_cpu_run(signature: str) -> bool:
    """Whether a llama.cpp failure of ``signature`` was found in llama-same-logits' CPU-only run,
    which a replay of it must then make."""
    return f"run={props.CPU_ONLY}" in signature


def in_sample(workload: LlamaWorkload) -> bool:
    """Whether the costly judges (``properties.COSTLY``) judge ``workload`` in a campaign on time:
    by a digest of the workload itself, so that one workload is judged alike wherever and
    whenever it runs (a shrink, Hypothesis's replay of a failure)."""
    return zlib.crc32(json.dumps(workload.to_json(), sort_keys=True).encode()) % props.SAMPLE == 0


@dataclass(frozen=True)
class Judging:
    """The judges of one run, and what the run makes for them."""

    judged: tuple[str, ...]
    logits: bool  # a CPU-only run beside it
    capture: bool  # its graphs captured


@dataclass
class LlamaJudges:
    """The state that decides which judges judge a llama.cpp run (``Fuzzer._fuzz_run`` sets it)."""

    sampling: bool = False  # a campaign on time generates: the costly judges on a sample
    shrinking: str | None = None  # the signature of the failure Hypothesis shrinks: its property alone, unconfirmed
    no_rules: str | None = None  # why the reference cannot judge this llama.cpp's graphs, as a run said

    def of(self, judged: tuple[str, ...], workload: LlamaWorkload, cpu_run: bool, replayed: bool, stats: Stats) -> Judging:
        """The judges of ``judged`` that judge this run of ``workload`` (``cpu_run``: a CPU-only
        run asked for, a replayed case found there), counting what they leave out."""
        if self.shrinking is not None and not replayed and (shrunk := self.shrinking.split("[", 1)[0]) in judged:
            # a shrink keeps a candidate only for its failure's signature: the other judges would tell it nothing
            judged, cpu_run = (shrunk,), cpu_run or in_cpu_run(self.shrinking)
        costly = tuple(p for p in judged if props.ENTRIES[p].needs & props.COSTLY)
        if self.sampling and not replayed and 0 < len(costly) < len(judged) and not in_sample(workload):
            judged = tuple(p for p in judged if p not in costly)  # the others judge it
            stats.llama_sampled_out += 1
        needs = frozenset().union(*(props.ENTRIES[p].needs for p in judged if p in props.ENTRIES))
        capture = props.CAPTURED in needs
        if capture and self.no_rules is not None:
            stats.llama_not_captured[self.no_rules] = stats.llama_not_captured.get(self.no_rules, 0) + 1
            capture = False
        return Judging(judged, (props.CPU_ONLY in needs or cpu_run) and compares_logits(workload), capture)
