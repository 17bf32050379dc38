"""Reading ggml's debug log: the scheduler's splits and the graph reallocations.

With ``GGML_SCHED_DEBUG=2``, ``ggml_backend_sched_split_graph`` calls
``ggml_backend_sched_print_assignments``, which logs, for the ORIGINAL graph::

    ## SPLIT #k: <backend name> # n inputs: [<name> (<size>)] [<name> (<size>)] ...
    node #  i (    OP): <name> ...          (one line per non-view node)

Each ``GGML_LOG_DEBUG`` call reaches the log callback as one fragment; a line may span many
fragments (the header: one per input), so lines are assembled from fragments and the split
inputs are read one fragment each (tensor names may hold spaces and parentheses).

In a build without ``NDEBUG`` (a Debug build), ggml-alloc and the scheduler also log::

    ggml_gallocr_needs_realloc: graph has different number of nodes|leafs
    ggml_gallocr_needs_realloc: node NAME is not valid
    ggml_gallocr_needs_realloc: src J (NAME) of node NAME is not valid
    ggml_gallocr_alloc_graph: reallocating buffers automatically          (one buffer)
    ggml_backend_sched_alloc_splits: failed to allocate graph, reserving (backend_ids_changed = B)

from which ``SchedLog`` tells each reallocation, how it happened and why.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

_HEADER = re.compile(r"^## SPLIT #(\d+): (.*) # (\d+) inputs$", re.DOTALL)
_INPUT = re.compile(r"^\[(.*) \(.{5}\)\] $", re.DOTALL)
_NODE = re.compile(r"^node #\s*(\d+) \(")
_NEEDS = "ggml_gallocr_needs_realloc: "
_AUTO = "ggml_gallocr_alloc_graph: reallocating buffers automatically"
_SCHED = re.compile(r"^ggml_backend_sched_alloc_splits: failed to allocate graph, reserving \(backend_ids_changed = (\d+)\)$")
# every other line the scheduler and the allocator log (ggml 0.15.3 to 0.25.3), which say nothing
# about a reallocation; a scheduler or allocator line matching neither this nor the lines read
# above is a line this parser does not know, and an error: a pass must not rest on a missed line
_SCHED_LINE = re.compile(r"^(ggml_backend_sched_\w*|ggml_gallocr_\w*|ggml_dyn_tallocr_\w*|ggml_tallocr_\w*): ")
_KNOWN = re.compile(
    r"^\w+: (reallocating \S.* buffer from size .* MiB to .* MiB|failed to allocate .*|failed to reserve graph buffers"
    r"|cannot reallocate multi buffer graph automatically, call reserve|not enough space in the buffer to allocate .*"
    r"|increasing (split|graph) inputs capacity from \d+ to \d+|warning: .*|all tensors in the context are already allocated"
    r"|failed to initialize tensor .*)$"
)


@dataclass
class LoggedSplit:
    """One ``## SPLIT`` header and the index of the first ``node #`` line after it."""

    index: int
    backend_name: str
    inputs: list[str]
    first_node: int | None = None


@dataclass(frozen=True)
class LoggedRealloc:
    """A reallocation: ``via`` "sched" or "gallocr", and ggml's reason for it."""

    via: str
    backend_ids_changed: bool
    reason: str


# ends each fragment in the graph worker's gathered log (``observe.c``)
SEP = "\x1e"


@dataclass
class SchedLog:
    """Collects one step's worth of ggml log: feed it every fragment the log callback gets
    (``feed``), or the fragments gathered by ``observe.c``, each ended by ``SEP`` (``feed_fragments``)."""

    splits: list[LoggedSplit] = field(default_factory=list)
    reallocs: list[LoggedRealloc] = field(default_factory=list)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=40))  # the last lines, for error messages
    errors: list[str] = field(default_factory=list)
    _pieces: list[str] = field(default_factory=list)
    _reason: str = ""

    def begin(self) -> None:
        """Forget the previous step."""
        self.splits, self.reallocs, self.errors = [], [], []
        self._reason = ""

    def feed(self, text: str) -> None:
        while True:
            head, newline, text = text.partition("\n")
            if head:
                self._pieces.append(head)
            if not newline:
                return
            pieces, self._pieces = self._pieces, []
            if pieces:
                self._line(pieces)

    def feed_fragments(self, text: str) -> None:
        """As ``feed`` of each fragment of ``text`` in turn, a line at a time."""
        *lines, rest = text.split("\n")
        for line in lines:
            pieces = self._pieces + [p for p in line.split(SEP) if p]
            self._pieces = []
            if pieces:
                self._line(pieces)
        self._pieces += [p for p in rest.split(SEP) if p]

    def _line(self, pieces: list[str]) -> None:
        line = "".join(pieces)
        self.tail.append(line)
        if line.startswith("## SPLIT #"):
            self._header(pieces)
        elif line.startswith("node #"):
            if self.splits and self.splits[-1].first_node is None:  # only a split's first node line is read
                m = _NODE.match(line)
                if m is None:
                    self.errors.append(f"unreadable node line: {line!r}")
                else:
                    self.splits[-1].first_node = int(m.group(1))
        elif line.startswith(_NEEDS):
            reason = line[len(_NEEDS) :]
            self._reason = reason.removeprefix("graph has ")
        elif line == _AUTO:
            self.reallocs.append(LoggedRealloc("gallocr", False, self._reason))
            self._reason = ""
        elif (m := _SCHED.match(line)) is not None:
            changed = m.group(1) != "0"
            self.reallocs.append(LoggedRealloc("sched", changed, "backend ids changed" if changed else self._reason))
            self._reason = ""
        elif _SCHED_LINE.match(line) and not _KNOWN.match(line):
            self.errors.append(f"a scheduler/allocator line this parser does not know: {line!r}")

    def _header(self, pieces: list[str]) -> None:
        m = _HEADER.match(pieces[0])
        if m is None:
            self.errors.append(f"unreadable split header: {''.join(pieces)!r}")
            return
        index, name, n_inputs = int(m.group(1)), m.group(2), int(m.group(3))
        inputs: list[str] = []
        for piece in pieces[1:]:
            if piece == ": ":
                continue
            im = _INPUT.match(piece)
            if im is None:
                self.errors.append(f"split #{index}: unreadable input {piece!r}")
                continue
            inputs.append(im.group(1))
        if len(inputs) != n_inputs:
            self.errors.append(f"split #{index}: header says {n_inputs} inputs, read {len(inputs)}")
        if index != len(self.splits):
            self.errors.append(f"split #{index} logged after {len(self.splits)} splits")
        self.splits.append(LoggedSplit(index, name, inputs, 0 if index == 0 else None))
