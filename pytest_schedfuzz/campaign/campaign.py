"""One fuzzing run, whichever front end started it: ``pytest --schedfuzz`` (``session``, ``items``)
and ``schedfuzz run`` (``commands.run``) both build a ``Campaign`` from the options
(``options.OPTIONS``) and ask it for the same things: the configuration, the known bugs, each
property's share of the time budget, fuzzing a property and saving its findings, replaying a
corpus case, and the summary and JSON report at the end (``summary``). The front ends differ only in
how they show the outcome (pytest items and reports; lines on stdout)."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..options import Given, Option, in_user_words
from ..profiles import FuzzConfig
from ..properties import PROPERTY_IDS, fuzz_units, is_llama
from . import summary
from .fuzz import Finding, Fuzzer
from .stats import Stats


def shards_for(workers: int) -> int:
    """Shards a property is split into under pytest-xdist: several per worker (they balance
    better); none without it."""
    return 1 if workers == 1 else 4 * workers


class ConfigError(ValueError):
    """A bad option value, in the words the user gave it (pytest: a usage error; the CLI: exit 2)."""


@dataclass(frozen=True)
class Unit:
    """What one property item fuzzes: a property (or the llama.cpp group), one shard of it."""

    prop: str
    weight: int
    shard: int = 0
    shards: int = 1

    @property
    def name(self) -> str:
        return self.prop if self.shards == 1 else f"{self.prop}[{self.shard}]"


# a unit that keeps going on time and has found nothing new for this part of its share gives the
# rest on to the units after it (``patience``): time goes where the causes still are
PATIENCE = 1 / 3


def patience(unit: Unit, share: float | None, keeps_going: bool, last_prop: str) -> float | None:
    """How long a unit that keeps going on time may go without a new finding before it gives the
    rest of its share on to the units after it in this process (``Fuzzer.campaign``):
    ``PATIENCE`` of its share, as a fuzzer spends its time where it still finds. None for the
    shards of the plan's last property (its next shard is only another seed of the same draws,
    and the last one has nothing after it to give to) and for a run by count."""
    if share is None or not keeps_going or unit.prop == last_prop:
        return None
    return share * PATIENCE


@dataclass(frozen=True)
class Fuzzed:
    """What fuzzing a unit gave: each finding in full (``reports``, with where it was saved), the
    findings as the summary lists them, the shortfall below the profile's floor
    (``(judged, floor, reason)``), and the statistics it added (``Stats.delta``)."""

    reports: tuple[str, ...]
    found: tuple[summary.Found, ...]
    short: tuple[int, int, str] | None
    stats: dict[str, Any]
    unjudged: str | None = None  # why the property does not judge this build (``Checks.unjudged``): not run


@dataclass(frozen=True)
class Replayed:
    """A corpus case replayed: ``pass``, ``known``, ``skip`` (off this build, or a race not shown)
    or ``fail`` (a broken file, a failure, or a known bug gone), and the text that says why."""

    outcome: str
    text: str
    property: str | None = None


class Campaign:
    """The options read into a ``FuzzConfig``, the ``Fuzzer``, the corpus, the known bugs, and what
    the run found (``record``: merged from every process under pytest-xdist)."""

    def __init__(self, given: Mapping[str, Given], base: Path, default_flag: Callable[[Option], str], seed: int | None = None) -> None:
        """``given``: the options (``options.read``); ``base``: the folder of the corpus and of
        Hypothesis's files; ``default_flag``: how this front end names an option the user did not
        give; ``seed``: an xdist worker's, its controller's."""
        from hypothesis.configuration import set_hypothesis_home_dir

        self.given = given
        self.default_flag = default_flag
        value = {name: g.value for name, g in given.items()}
        # Hypothesis keeps more than examples (its constants cache): beside them, not in ./.hypothesis
        set_hypothesis_home_dir(base / ".schedfuzz" / "hypothesis")
        config = FuzzConfig(
            profile=value.get("profile", "dev"), examples=value.get("examples"), seed=seed if seed is not None else value.get("seed"),
            budget=value.get("budget"), target=value.get("target"), lib=value.get("lib"), llama_lib=value.get("llama-lib"),
            policy=value.get("policy"), rereserve=value.get("rereserve", True), reference=value.get("reference"),
            keep_going=value.get("keep-going"), size_oracle=value.get("size-oracle"), database=base / ".schedfuzz" / "examples",
            shared=value.get("db"), shared_ca=value.get("db-ca"), confirm_runs=value.get("confirm-runs", FuzzConfig.confirm_runs),
            sightings=Path(value["sightings"]).absolute() if "sightings" in value else None,
        )
        try:
            config.resolved_profile()
            self.config = replace(config, seed=config.seed if config.seed is not None else config.default_seed())
            corpus = value.get("corpus")
            self.corpus = base / (corpus or "corpus")
            if corpus and not self.corpus.is_dir():
                raise ValueError(f"--schedfuzz-corpus {corpus}: no such folder ({self.corpus}); create it, or leave the option out for ./corpus")
            chosen = value.get("properties")
            self.properties = [p.strip() for p in chosen.split(",")] if chosen else list(PROPERTY_IDS)
            unknown = [p for p in self.properties if p not in PROPERTY_IDS]
            if unknown:
                raise ValueError(f"--schedfuzz-properties: unknown property {unknown[0]!r} (known: {', '.join(PROPERTY_IDS)})")
            # built now, so that a bad policy, reference or library is a usage error at startup;
            # the engine itself starts with the first case
            self.fuzzer = Fuzzer(self.config)
        except ValueError as e:
            raise ConfigError(self.words(e)) from None
        from ..cases.corpus import STARTER_CORPUS

        if self.fuzzer.shared is not None and seed is None:
            # the other hosts' cases, before the corpus is learnt; an xdist worker collects what
            # its controller pulled, so that every worker collects the same corpus
            self.fuzzer.shared.pull(self.corpus)
        known = value.get("known", "builtin")
        self.known_source = "none" if known == "none" else str(STARTER_CORPUS) if STARTER_CORPUS.is_dir() else "none (no starter corpus)"
        if known == "builtin":
            self.fuzzer.known.learn(STARTER_CORPUS)
        self.fuzzer.known.learn(self.corpus)
        self.fuzzer.llama_judged = tuple(p for p in self.properties if is_llama(p))
        # as pytest's own --junitxml: relative to the folder the run started in
        self.report_path = Path(value["report"]).absolute() if "report" in value else None
        self.pending = 1  # weight of the units this process has still to fuzz (``plan``)
        self.last_prop = ""  # the property the plan fuzzes last (``patience``)
        self.shards = 1
        # what the run found, over every process: statistics, findings, corpus outcomes
        self.stats = Stats()
        self.found: list[summary.Found] = []
        self.corpus_outcomes: dict[str, list[str]] = {}
        # the engines as they described themselves at the start (``header_lines``), for the summary
        self.engine_info: dict[str, str] = {}
        self.llama_info: dict[str, str] | None = None

    def words(self, e: Exception | str) -> str:
        """An error of the campaign's checks in the words the user gave the option in."""
        return in_user_words(str(e), self.given, self.default_flag)

    # ------------------------------------------------------------------ fuzzing

    def plan(self, workers: int = 1) -> list[Unit]:
        """The units to fuzz: one per property, the llama.cpp properties as one (``fuzz_units``);
        under pytest-xdist each split into shards (``shards_for``), shard ``k`` under seed
        ``seed + k``. Sets what this process's time shares are counted against."""
        self.shards = shards_for(workers)
        units = fuzz_units(self.properties, policy=self.config.policy is not None)
        self.pending = sum(w for _, w in units) * self.shards // workers
        self.last_prop = units[-1][0] if units else ""
        return [Unit(prop, weight, k, self.shards) for prop, weight in units for k in range(self.shards)]

    def time_share(self, unit: Unit) -> float | None:
        """Seconds for the next unit when the profile fuzzes on time: what is left of the budget,
        shared by the units this process has still to run in proportion to their weights. None
        where it fuzzes by count (the budget then only caps the whole run: ``Fuzzer.out_of_budget``)."""
        weight = unit.weight
        budget = self.config.budget if self.config.budget is not None else self.fuzzer.profile.budget
        if budget is None or self.fuzzer.examples_for(unit.prop) is not None:
            self.pending = max(1, self.pending - weight)
            return None
        left = max(0.0, budget - (time.monotonic() - self.fuzzer.started))
        share = left * weight / max(weight, self.pending)
        self.pending = max(1, self.pending - weight)
        return share

    def fuzz(self, unit: Unit) -> Fuzzed:
        """Fuzz one unit, saving each finding to the corpus as it is found."""
        fuzzer = self.fuzzer
        before = fuzzer.stats.as_dict()
        if why := fuzzer.unjudged(unit.prop):
            fuzzer.stats.unjudged[why] = fuzzer.stats.unjudged.get(why, 0) + 1
            return Fuzzed((), (), None, fuzzer.stats.delta(before), why)
        reports: list[str] = []
        found: list[summary.Found] = []

        def save(finding: Finding) -> None:
            text, saved = self.save(finding)
            reports.append(text)
            found.append(saved)

        seconds = self.time_share(unit)
        done, short = False, None
        try:
            if self.config.keeps_going():
                fuzzer.campaign(unit.prop, shard=unit.shard, shards=unit.shards, seconds=seconds, on_finding=save,
                                patience=patience(unit, seconds, True, self.last_prop))
            else:
                finding = fuzzer.fuzz(unit.prop, shard=unit.shard, shards=unit.shards, seconds=seconds)
                if finding is not None:
                    save(finding)
            done = True
        finally:
            ran = fuzzer.stats.examples - before["examples"]
            fuzzer.stats.interrupted = int(fuzzer.interrupted)
            fuzzer.stats.property_examples[unit.prop] = fuzzer.stats.property_examples.get(unit.prop, 0) + ran
            if done and not reports and not fuzzer.interrupted:
                short = self.shortfall(unit, ran, before, seconds)
            if short is not None:
                fuzzer.stats.short_items[unit.name], fuzzer.stats.short_floors[unit.name] = short[:2]
        return Fuzzed(tuple(reports), tuple(found), short, fuzzer.stats.delta(before))

    def save(self, finding: Finding) -> tuple[str, summary.Found]:
        """Write a finding to the corpus: its report in full with where it went (a finding that
        cannot be written is still reported), and its line in the summary."""
        from ..cases.corpus import component_of, save_case

        signature = finding.violation.signature()
        try:
            case = finding.to_case(self.fuzzer)
            path: Path | None = save_case(self.corpus, case)
            if self.fuzzer.shared is not None:  # a shared campaign: published to the other hosts
                self.fuzzer.shared.publish(case, path)  # type: ignore[arg-type]
        except OSError as e:
            path, where = None, f"NOT SAVED: cannot write to {self.corpus}: {e.strerror or e}"
        else:
            where = f"saved to {path}"
        found = summary.Found(finding.violation.property, signature, component_of(finding.violation.property, signature),
                              str(path) if path is not None else None)
        return f"{finding.report()}\n{where}", found

    def shortfall(self, unit: Unit, ran: int, before: dict[str, Any], seconds: float | None) -> tuple[int, int, str] | None:
        """``(judged, floor, reason)`` where a unit judged fewer examples than its floor: the
        profile's ``min_examples``, or the examples it was asked for where fewer (a count over
        its shards). ``ran`` examples were run since the stats were ``before``; ``seconds``: its
        share of the time budget."""
        fuzzer = self.fuzzer
        asked = fuzzer.examples_for(unit.prop)
        floor = fuzzer.profile.min_examples
        if asked is not None:
            floor = min(floor, -(-asked // unit.shards))
        # llama.cpp workloads rejected, not judged: a context that did not fit and made no scheduler call
        added = fuzzer.stats.delta(before)
        rejected = added["llama_out_of_memory"] - added["llama_out_of_memory_judged"]
        judged = max(0, ran - rejected)
        if judged >= floor:
            return None
        why: list[str] = []
        if fuzzer.out_of_budget():
            why.append("the time budget was spent " + ("before it" if not ran else "while it ran"))
        elif seconds is not None and asked is None:
            why.append(f"its share of the time budget ({seconds:.1f} s) " + ("ran out" if ran else "was too small for one example"))
        hint = f" (raise {self.flag('budget')}, or select fewer properties)" if why else ""
        if rejected:
            why.append(f"{rejected} of its llama.cpp workloads were rejected (a context or adapter that did not fit "
                       "devices this full, no scheduler call made: not judged)")
        if not why:
            why.append("Hypothesis stopped early (too many examples rejected, or none left to generate)")
        ran_text = "ran no example" if not ran else f"judged {judged} of {ran} examples" if rejected else f"ran {ran} examples"
        floor_text = f"fewer than its floor of {floor} ({self.config.profile} profile)"
        return judged, floor, f"{unit.name} {ran_text}, {floor_text}: {'; '.join(why)}{hint}"

    def replay(self, path: Path) -> Replayed:
        """Replay one corpus case on the engine: ``expect: pass`` must hold no violation of its
        property; ``expect: {fail: ...}`` is a strict expected failure with the same signature."""
        from ..cases.corpus import CaseError, load_case
        from ..cases.verdict import judge_replay

        try:
            case = load_case(path)
        except CaseError as e:
            return Replayed("fail", f"bad corpus file: {e}")
        engines = self.fuzzer.engines
        version = engines.ggml_version(case.llama is not None)
        if case.llama is not None:
            off = case.off_build(version, engines.llama_target.start().get("gpu_device", "available"))
            if off:
                return Replayed("skip", off, case.property)
        elif why := self.fuzzer.unjudged(case.property):
            return Replayed("skip", why, case.property)
        build = self.fuzzer.engines.llama_build() if case.llama is not None else None
        verdict = judge_replay(case, self.fuzzer.replay(case), version, self.fuzzer.known.tolerated(case.llama is not None), build)
        outcome = {"unshown": "skip", "xpass": "fail", "untriaged": "fail"}.get(verdict.outcome, verdict.outcome)
        return Replayed(outcome, verdict.text, case.property)

    def close(self) -> None:
        self.fuzzer.close()

    # ------------------------------------------------------------------ what it found

    def record(self, stats: Mapping[str, Any] | None = None, found: tuple[summary.Found, ...] = (), case: tuple[str, str] | None = None,
               engines: Mapping[str, Mapping[str, str]] | None = None) -> None:
        """Add what one unit (or corpus case: ``(path, outcome)``) found, in whichever process ran it,
        and the engines that process started (``engines_started``: the first description of each)."""
        self.stats.merge(dict(stats or {}))
        self.found += found
        if case is not None:
            self.corpus_outcomes.setdefault(case[1], []).append(case[0])
        if engines:
            self.engine_info = self.engine_info or dict(engines.get("engine", {}))
            if self.llama_info is None and "llama" in engines:
                self.llama_info = dict(engines["llama"])

    def engines_started(self) -> dict[str, dict[str, str]]:
        """The engines this process has started, described: the summary's "ran" lines. Under
        pytest-xdist the workers start them, and tell the controller with each item they run."""
        engines, seen = self.fuzzer.engines, {}
        if engines.started() and not self.config.target:
            seen["engine"] = engines.info()
        if engines.llama_started():
            seen["llama"] = dict(engines.llama_target.start())
        return seen

    def flag(self, name: str) -> str:
        """How the user names an option in this front end (``--schedfuzz-seed``, ``--seed``)."""
        from ..options import BY_NAME

        return self.default_flag(BY_NAME[name])

    def facts(self) -> summary.Facts:
        """What ran, as the summary and the report say it (the engines already started)."""
        from .. import compiled
        from ..builds.names import BUILT_IN as LLAMA_BUILT_IN
        from ..ggml.lib import DEFAULT_LIB

        importlib.import_module("reference")  # its status is set when it is imported
        fuzzer, config = self.fuzzer, self.config
        self.record(engines=self.engines_started())  # a run without workers: this process's own
        engine = {"name": config.target} if config.target else self.engine_info
        self.stats.components.update(fuzzer.stats.components)
        return summary.Facts(
            profile=config.profile, seed=config.seed or 0, lib=config.lib or DEFAULT_LIB, llama_lib=config.llama_lib or LLAMA_BUILT_IN[0],
            engine=engine, llama=self.llama_info, reference=compiled.status, rules_note=fuzzer.rules_note if engine else None,
            options={name: {"value": g.value, "source": g.source} for name, g in self.given.items() if name},
            shards=self.shards, seed_flag=self.flag("seed"), report_flag=self.flag("report"), budget_flag=self.flag("budget"),
        )

    def summary_lines(self, verbose: bool) -> list[str]:
        return summary.lines(self.facts(), self.stats, self.found, self.corpus_outcomes, verbose)

    def write_report(self) -> Path | None:
        """The JSON report (``--schedfuzz-report``), where asked for."""
        if self.report_path is None:
            return None
        summary.write_report(self.report_path, self.facts(), self.stats, self.found, self.corpus_outcomes)
        return self.report_path

    def header_lines(self, verbose: bool) -> list[str]:
        """What the run is about to do, before it runs: the configuration and the known bugs;
        with ``verbose``, the engines in full. Starts the engines, so that one that cannot start
        is an error now (``TargetError``), not at the first case."""
        fc = self.config
        lines = [f"profile={fc.profile} seed={fc.seed} policy={fc.policy or 'can_reuse'} rereserve={'on' if fc.rereserve else 'off'}"]
        if not fc.target:
            info = self.engine_info = self.fuzzer.engines.info()
            self.fuzzer.rules  # noqa: B018 -- reads the loaded ggml's version: sets rules_note
            if verbose:
                lines.append(f"engine = ggml {info.get('ggml_version', '?')} ({info.get('lib', '?')}); bindings: {info.get('bindings', '?')}")
            if info.get("gpu_device", "available") != "available":
                lines.append(f"GPU-like devices off, layouts run without them: {info['gpu_device']}")
            if info.get("program_encoder", "C") != "C":
                lines.append(info["program_encoder"])
        if any(is_llama(p) for p in self.properties):
            # a bad or Release build: an error now, not at the first workload
            info = self.llama_info = self.fuzzer.engines.llama_target.start()
            lines += llama_header(info, verbose)
        if note := self.fuzzer.rules_note:
            lines.append(note + ("; matches-reference does not judge it (not run)" if self.fuzzer.unjudged("matches-reference") else ""))
        n = len(self.fuzzer.known.cases)
        lines.append(f"known upstream bugs: {n} expected failures (built in: {summary.short_path(self.known_source)}; "
                     f"your corpus: {summary.short_path(str(self.corpus))})")
        for llama in (False, True):
            if not llama or any(is_llama(p) for p in self.properties):
                note = self.fuzzer.known.unknown_version_note(llama)
                lines += [note] if note else []
        return lines


def llama_header(info: dict[str, str], verbose: bool) -> list[str]:
    """The header's lines of the llama.cpp build under test, as its worker described itself: what
    it lacks (calls, devices) and the reference rules it is judged by."""
    from reference.rules import rules_for

    lines = []
    if verbose:
        lines.append(f"llama.cpp = {info.get('lib', '?')} with ggml {info.get('ggml_version', '?')} ({info.get('ggml_lib', '?')}); "
                     f"realloc callback: {info.get('realloc_callback', '?')}; allocator calls: {info.get('allocator_calls', '?')}; "
                     f"build: {info.get('build', '?')}; "
                     f"struct layouts from {info.get('declarations', '?')} (checked: {info.get('layouts_checked', '?')})")
    if info.get("absent_calls"):
        lines.append(f"llama.cpp: call kinds this build lacks a function of, absent from its workloads: {info['absent_calls']}")
    rpc = not info.get("rpc_round_trip", "").startswith("absent")
    if not rpc:
        lines.append(f"llama.cpp: no RPC devices: {info['rpc_round_trip']}")
    if info.get("gpu_device", "available") != "available":
        lines.append(f"llama.cpp: no GPU-like devices ({'RPC devices serve' if rpc else 'the CPU alone serves'}): {info['gpu_device']}")
    _, note = rules_for(info.get("ggml_version"))  # the rules its figures are derived with
    if note:
        lines.append(f"llama.cpp: {note}; llama-matches-reference does not judge this build")
    return lines
