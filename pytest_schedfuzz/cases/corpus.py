"""The corpus: one JSON file per finding, saved atomically, checked on load, replayed, shrunk.

A case holds the scenario (or, for the llama.cpp properties, the llama workload: model, devices,
context parameters and calls), the property it broke, its failure signature (property id plus
the distinguishing facts), the engine it was found on, and ``expect``: ``"new"`` (a finding
nobody has triaged yet: how every finding is saved; it fails each run it reproduces in until
``schedfuzz known`` makes it known, or it is fixed), ``"pass"`` (the bug is fixed: the case guards
against its return) or ``{"fail": reason}`` (a known engine bug that must keep failing until fixed). A failure can be scoped by ggml version: ``"since"`` (the first
version with the bug) and ``"fixed_in"`` (the first without it) bound where it is expected;
outside those bounds the case is a guard, e.g. ``{"fail": "...", "fixed_in": "0.25.3"}`` is an
expected failure on 0.15.3 and must pass on 0.25.3.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from ..builds.names import recorded_build
from ..files import atomic_write
from ..model.llama_calls import call_from_format1
from ..model.llama_workload import LlamaWorkload, WorkloadError
from ..model.scenario import Scenario
from ..model.shapes import SpecError, nelements
from ..model.versions import version_key
from ..properties import PROPERTY_IDS, is_llama
from ..sim.driver import Workload

CASE_VERSION = 2


def _from_format1(data: dict[str, Any]) -> dict[str, Any]:
    """Format 1 to 2: a llama.cpp call's one ``n`` and its ``flag`` became fields named for what
    they hold (``model.llama_calls.call_from_format1``)."""
    if isinstance(data.get("llama"), dict) and isinstance(data["llama"].get("calls"), list):
        data = {**data, "llama": {**data["llama"], "calls": [call_from_format1(c) for c in data["llama"]["calls"]]}}
    return {**data, "version": 2}


# format k's case as format k + 1: a case file of any earlier version loads (``schedfuzz migrate`` rewrites it)
UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _from_format1}

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["format", "version", "property", "signature"],
    "oneOf": [{"required": ["scenario"]}, {"required": ["llama"]}],
    "properties": {
        "format": {"const": "schedfuzz-case"},
        "version": {"type": "integer"},
        "property": {"enum": list(PROPERTY_IDS)},
        "signature": {"type": "string"},
        # the signatures the case had before ``schedfuzz resign`` named its cause otherwise, oldest first
        "signed_as": {"type": "array", "items": {"type": "string"}},
        "message": {"type": "string"},
        "step": {"type": "integer", "minimum": 0},
        "seed": {"type": ["integer", "null"]},
        "engine": {"type": "object", "additionalProperties": {"type": "string"}},
        "expect": {
            "oneOf": [
                {"const": "pass"},
                {"const": "new"},  # untriaged (``Case.untriaged``)
                {
                    "type": "object", "required": ["fail"], "additionalProperties": False,
                    "properties": {
                        "fail": {"type": "string"},
                        "since": {"type": "string", "pattern": r"^\d+\.\d+(\.\d+)?$"},
                        "fixed_in": {"type": "string", "pattern": r"^\d+\.\d+(\.\d+)?$"},
                        # llama.cpp cases: the builds the bug is known on (``--schedfuzz-llama-lib`` names)
                        "known_on": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    },
                },
            ]
        },
        "workload": {"type": "object", "required": ["layout", "model", "n_ubatch", "events"]},
        # options of the run that found it which change its verdict (replay honours them)
        "options": {"type": "object", "additionalProperties": False, "properties": {"rereserve": {"type": "boolean"}}},
        "llama": {"type": "object", "required": ["model", "ctx", "calls"], "properties": {"calls": {"type": "array", "items": {"type": "object", "required": ["kind"]}}}},
        "scenario": {
            "type": "object",
            "required": ["version", "layout", "graphs", "steps"],
            "properties": {
                "layout": {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["kind"]}},
                "graphs": {"type": "object", "additionalProperties": {"type": "object", "required": ["tensors", "roots"]}},
                "steps": {"type": "array", "items": {"type": "object", "required": ["kind"]}},
            },
        },
    },
}


class CaseError(Exception):
    """A corpus file that cannot be used; the message names the file and the problem."""

    def __init__(self, path: Path | str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = Path(path)
        self.problem = problem


@dataclass(frozen=True)
class Case:
    property: str
    signature: str
    scenario: Scenario | None  # None for a llama.cpp case
    message: str = ""
    step: int = 0
    seed: int | None = None
    engine: Mapping[str, str] = field(default_factory=dict)
    expect: str | Mapping[str, str] = "pass"
    workload: Workload | None = None  # driver properties: replayed through the current driver
    path: Path | None = None
    llama: LlamaWorkload | None = None  # llama.cpp properties: replayed on llama.cpp
    options: Mapping[str, Any] = field(default_factory=dict)  # ``rereserve``: the driver's mode it was found in
    signed_as: tuple[str, ...] = ()  # its earlier signatures (``schedfuzz resign``), oldest first

    @property
    def untriaged(self) -> bool:
        """A finding saved as found, that nobody has called known (``schedfuzz known``) or fixed."""
        return self.expect == "new"

    def explanation(self) -> str:
        """What the case's record says of its bug, for a report: the known bug's explanation, or
        the state that stands in for one (a new finding nobody has triaged, a guard of a fixed bug)."""
        if self.expected_failure is not None:
            return self.expected_failure
        if self.untriaged:
            return ("Not triaged yet: a new finding nobody has explained. `schedfuzz known CASE --because \"...\"` records "
                    "the explanation and makes it a known bug.")
        return "A guard: the bug this case found was fixed; it must not come back (expect: pass)."

    @property
    def expected_failure(self) -> str | None:
        """The known bug's description, whatever the version (see ``expected_failure_on``)."""
        return self.expect["fail"] if isinstance(self.expect, Mapping) else None

    def known_builds(self) -> tuple[str, ...] | None:
        """The llama.cpp builds this case's bug is known on: its ``expect``'s ``known_on``, else (a
        case saved before builds were named) the build its engine record names
        (``builds.names.recorded_build``); None for a graph case, a guard, or a build not named."""
        if self.llama is None or not isinstance(self.expect, Mapping):
            return None
        if "known_on" in self.expect:
            return tuple(self.expect["known_on"])
        found = recorded_build(self.engine)
        return (found,) if found else None

    def known_elsewhere(self, build: str | None) -> tuple[str, ...] | None:
        """The builds this llama.cpp case's bug is known on where ``build`` is not one of them
        (its signature seen on ``build`` is "known on X, seen on Y": reported, not silenced);
        None where it is known on ``build``, or where builds are not named."""
        known = self.known_builds()
        return known if build is not None and known is not None and build not in known else None

    def expected_failure_on(self, version: str | None, build: str | None = None) -> str | None:
        """The known bug's description if it is expected on ggml ``version`` (and, for a llama.cpp
        case, on llama.cpp ``build``, where both name builds: ``known_builds``): inside the
        ``since``/``fixed_in`` bounds. A version that cannot be read (a build without
        ``ggml_version()``, or no number in it) is inside no bound: a bug known only for some
        versions is not assumed there (one recorded for every version, with no bound, still is).

        >>> case = Case("no-abort", "s", None, expect={"fail": "bug", "fixed_in": "0.25.3"})
        >>> case.expected_failure_on("0.15.3"), case.expected_failure_on("0.25.3"), case.expected_failure_on("unknown")
        ('bug', None, None)
        """
        if not isinstance(self.expect, Mapping) or self.known_elsewhere(build) is not None:
            return None
        bounded = "since" in self.expect or "fixed_in" in self.expect
        v = version_key(version)
        if v is None:
            return None if bounded else self.expect["fail"]
        if "since" in self.expect and v < version_key(self.expect["since"]):  # type: ignore[operator]
            return None
        if "fixed_in" in self.expect and v >= version_key(self.expect["fixed_in"]):  # type: ignore[operator]
            return None
        return self.expect["fail"]

    def off_build(self, version: str | None, gpu_device: str) -> str | None:
        """Why this llama.cpp case cannot be replayed on the run's llama.cpp (whose ggml is
        ``version``, and whose GPU-like device is ``gpu_device``), None where it can. A case is
        replayed on the llama.cpp line it was found on (the same ggml major.minor) unless its
        expectation is bounded by version: another llama.cpp builds other graphs (``schedfuzz
        compare``), so neither a known bug nor a guard of one build says anything of another.
        A case with GPU-like devices needs them."""
        if self.llama is None:
            return None
        if self.llama.devices.gpus and gpu_device != "available":
            return f"the case puts its model on GPU-like devices, which this llama.cpp cannot have ({gpu_device})"
        found = str(self.engine.get("ggml_version", ""))
        bounded = isinstance(self.expect, Mapping) and ("since" in self.expect or "fixed_in" in self.expect)
        a, b = version_key(found), version_key(version)
        if bounded or a is None or b is None or a[:2] == b[:2]:
            return None
        return (f"found on a llama.cpp with ggml {found}; this run's has ggml {version}: another llama.cpp, whose graphs differ, "
                "so the case is replayed on its own line only (give its expect since/fixed_in bounds to replay it here)")

    def expectation_on(self, version: str | None, build: str | None = None) -> str:
        """``expect`` in words, for ``version`` (and llama.cpp ``build``)."""
        why = self.expected_failure_on(version, build)
        if why is None and (elsewhere := self.known_elsewhere(build)) is not None:
            return f"known on {', '.join(elsewhere)} only"
        if self.untriaged:
            return "reproduces (a new finding, not triaged: schedfuzz known makes it a known bug)"
        return f"fail: {why}" if why is not None else "pass"

    def size(self) -> tuple[int, int, int, int]:
        """(steps, op nodes, leafs, elements), over all graphs: what minimization reduces, in
        that order; for a llama case: (calls, batch tokens, model layers, model weights)."""
        if self.scenario is None:
            assert self.llama is not None
            return len(self.llama.calls), sum(c.n_tokens() for c in self.llama.calls), self.llama.model.n_layer, self.llama.model.n_params
        graphs = [g for _, g in self.scenario.graphs]
        elements = sum(nelements(geo) for g in graphs for geo in g.geometry.values())
        return len(self.scenario.steps), sum(g.n_ops for g in graphs), sum(len(g.tensors) - g.n_ops for g in graphs), elements

    def size_text(self) -> str:
        """``size()`` in words: what the numbers count depends on the case kind."""
        units = ("calls", "batch tokens", "layers", "weights") if self.scenario is None else ("steps", "nodes", "leafs", "elements")
        return ", ".join(f"{n} {u}" for n, u in zip(self.size(), units, strict=True))

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "schedfuzz-case",
            "version": CASE_VERSION,
            "property": self.property,
            "signature": self.signature,
            "message": self.message,
            "step": self.step,
            "seed": self.seed,
            "engine": dict(self.engine),
            "expect": dict(self.expect) if isinstance(self.expect, Mapping) else self.expect,
        } | ({"scenario": self.scenario.to_json()} if self.scenario is not None else {}) \
          | ({"workload": self.workload.to_json()} if self.workload is not None else {}) \
          | ({"llama": self.llama.to_json()} if self.llama is not None else {}) \
          | ({"options": dict(self.options)} if self.options else {}) \
          | ({"signed_as": list(self.signed_as)} if self.signed_as else {})

    def file_name(self) -> str:
        """``<signature as a slug>-<scenario hash>.json``, e.g.
        ``no-same-size-realloc-explained-lost-73f51b5e50.json``."""
        body = self.scenario.dumps() if self.scenario is not None else json.dumps(self.llama.to_json() if self.llama else {}, sort_keys=True)
        digest = hashlib.sha1(body.encode()).hexdigest()[:10]
        slug = re.sub(r"[^a-z0-9]+", "-", self.signature.lower()).strip("-")[:60].rstrip("-")
        return f"{slug}-{digest}.json"


@functools.cache
def _validator() -> Any:
    """The case schema's validator, the schema checked once (``jsonschema.validate`` checks it
    at every call, which each pytest-xdist worker paid for every case of the corpus)."""
    cls = jsonschema.validators.validator_for(SCHEMA)
    cls.check_schema(SCHEMA)
    return cls(SCHEMA)


def load_case(path: Path | str) -> Case:
    """Read and check one case; any problem raises ``CaseError`` naming the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise CaseError(path, f"cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise CaseError(path, f"not UTF-8 text: byte {e.object[e.start]:#04x} at offset {e.start}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CaseError(path, f"not valid JSON (truncated?): {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise CaseError(path, "JSON nested too deeply to be a case") from None
    if isinstance(data, dict) and isinstance(data.get("version"), int) and data["version"] > CASE_VERSION:
        raise CaseError(path, f"case format version {data['version']} is newer than this schedfuzz reads ({CASE_VERSION}); upgrade schedfuzz")
    error = jsonschema.exceptions.best_match(_validator().iter_errors(data))  # as jsonschema.validate chooses
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "the top level"
        raise CaseError(path, f"does not match the case schema at {where}: {error.message}")
    data = upgraded(path, data)
    scenario = llama = None
    try:
        if "scenario" in data:
            scenario = Scenario.from_json(data["scenario"])
    except SpecError as e:
        raise CaseError(path, f"inconsistent scenario: {e}") from None
    except (KeyError, TypeError, ValueError, RecursionError) as e:
        raise CaseError(path, f"malformed scenario: {type(e).__name__}: {e}") from None
    if "llama" in data:
        if not is_llama(data["property"]):
            raise CaseError(path, f"a llama workload cannot replay property {data['property']!r}")
        try:
            llama = LlamaWorkload.from_json(data["llama"])
        except WorkloadError as e:
            raise CaseError(path, f"llama workload: {e}") from None
    elif is_llama(data["property"]):
        raise CaseError(path, f"property {data['property']!r} needs a llama workload")
    workload = None
    if "workload" in data:
        try:
            workload = Workload.from_json(data["workload"])
        except (KeyError, TypeError, ValueError) as e:
            raise CaseError(path, f"malformed workload: {type(e).__name__}: {e}") from None
    return Case(
        property=data["property"],
        signature=data["signature"],
        scenario=scenario,
        message=data.get("message", ""),
        step=data.get("step", 0),
        seed=data.get("seed"),
        engine=data.get("engine", {}),
        expect=data.get("expect", "pass"),
        workload=workload,
        path=path,
        llama=llama,
        options=data.get("options", {}),
        signed_as=tuple(data.get("signed_as", ())),
    )


def upgraded(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """A case file's JSON (checked against the schema) in today's format, by ``UPGRADES`` one
    version at a time; nothing else in it changes."""
    while data["version"] in UPGRADES:
        try:
            data = UPGRADES[data["version"]](data)
        except (KeyError, TypeError, ValueError) as e:
            raise CaseError(path, f"cannot read case format version {data['version']}: {type(e).__name__}: {e}") from None
    if data["version"] != CASE_VERSION:
        raise CaseError(path, f"case format version {data['version']} is not supported (this schedfuzz reads {CASE_VERSION})")
    return data


# the starter corpus: the known upstream bugs, known wherever the plugin runs (beside the
# package in a checkout or an editable install)
STARTER_CORPUS = Path(__file__).resolve().parents[2] / "corpus"


def component(case: Case) -> str:
    """Which part of ggml or llama.cpp a known bug is in (``component_of`` its finding)."""
    return component_of(case.property, case.signature)


def component_of(prop: str, signature: str) -> str:
    """Which part of ggml or llama.cpp a finding is in, from what it says: the RPC backend (a
    remote server failed), ggml-alloc (a kept plan's buffers, allocation), llama.cpp (its
    graphs and calls), or the scheduler."""
    if is_llama(prop):
        return "llama.cpp"
    if "ggml-rpc" in signature or "server=" in signature:
        return "RPC backend"
    if "plan=kept" in signature or "after=failed allocation" in signature or "ggml-alloc" in signature:
        return "ggml-alloc"
    return "scheduler"


def save_case(directory: Path | str, case: Case) -> Path:
    """Write ``case`` under ``directory`` atomically (a temporary file, then a rename), so that
    concurrent writers (pytest-xdist workers) never leave a partial file or lose one. The same
    case found again replaces its file; another case under the same name (the same workload, a
    signature that differs only past the name's first 60 characters: a check site, another
    build's) is kept, and this one is written beside it."""
    text = json.dumps(case.to_json(), indent=1, sort_keys=True) + "\n"
    target = Path(directory) / case.file_name()
    if target.exists() and _signature_in(target) != case.signature:
        target = target.with_name(f"{target.stem}-{hashlib.sha1(case.signature.encode()).hexdigest()[:6]}.json")
    return atomic_write(target, lambda tmp: tmp.write_text(text))


def _signature_in(path: Path) -> str | None:
    """The signature a case file holds; None where it cannot be read (then it is not replaced)."""
    try:
        return str(json.loads(path.read_text(encoding="utf-8"))["signature"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def case_files(directory: Path | str) -> Iterator[Path]:
    """Every case file of a corpus directory, in a stable order (temporary files excluded)."""
    directory = Path(directory)
    if directory.is_dir():
        yield from sorted(p for p in directory.glob("*.json") if not p.name.startswith(".tmp-"))
