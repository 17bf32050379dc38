"""The state of one ``pytest --schedfuzz`` process: the options read into a ``FuzzConfig``,
the ``Fuzzer``, the merged statistics, and the hooks that print the header and the summary.
Registered by ``plugin.pytest_configure`` only under ``--schedfuzz``."""

from __future__ import annotations

import importlib
import os
import time
from dataclasses import replace
from typing import Any

import pytest

from .items import STATS_KEY, SchedfuzzSuite
from .plugin import base_dir, option
from .properties import PROPERTY_IDS, is_llama


class SchedfuzzSession:
    """Per-process state of a ``--schedfuzz`` run: the config, the fuzzer and the statistics."""

    def __init__(self, config: pytest.Config) -> None:
        from .campaign.fuzz import Fuzzer
        from .campaign.profiles import FuzzConfig
        from .campaign.stats import Stats

        def num(name: str, kind: type) -> Any:
            v = option(config, name)
            if v in (None, ""):
                return None
            try:
                return kind(v)
            except ValueError:
                raise pytest.UsageError(f"--{name.replace('_', '-')}: {v!r} is not a {kind.__name__}") from None

        profile = option(config, "schedfuzz_profile") or "dev"
        workerinput = getattr(config, "workerinput", None)
        seed = workerinput["schedfuzz_seed"] if workerinput else num("schedfuzz_seed", int)
        rereserve = option(config, "schedfuzz_rereserve")
        self.config = config
        self.fuzz_config = FuzzConfig(
            profile=profile,
            examples=num("schedfuzz_examples", int),
            seed=seed,
            budget=num("schedfuzz_budget", float),
            target=option(config, "schedfuzz_target") or None,
            lib=option(config, "schedfuzz_lib") or os.environ.get("SCHEDFUZZ_GGML_LIB") or None,
            llama_lib=option(config, "schedfuzz_llama_lib") or os.environ.get("SCHEDFUZZ_LLAMA_LIB") or None,
            policy=option(config, "schedfuzz_policy") or None,
            rereserve=True if rereserve is None else bool(rereserve),
            reference=option(config, "schedfuzz_reference") or None,
            keep_going=None if option(config, "schedfuzz_keep_going") is None else bool(option(config, "schedfuzz_keep_going")),
            size_oracle=None if option(config, "schedfuzz_size_oracle") is None else bool(option(config, "schedfuzz_size_oracle")),
            database=base_dir(config) / ".schedfuzz" / "examples",
            shared=option(config, "schedfuzz_db") or None,
        )
        try:
            self.fuzz_config.resolved_profile()
        except ValueError as e:
            raise pytest.UsageError(str(e)) from None
        if self.fuzz_config.seed is None:
            self.fuzz_config = replace(self.fuzz_config, seed=self.fuzz_config.default_seed())
        chosen_corpus = option(config, "schedfuzz_corpus")
        self.corpus = base_dir(config) / (chosen_corpus or "corpus")
        if chosen_corpus and not self.corpus.is_dir():
            raise pytest.UsageError(f"--schedfuzz-corpus {chosen_corpus}: no such folder ({self.corpus}); create it, or leave the option out for ./corpus")
        chosen = option(config, "schedfuzz_properties")
        self.properties = [p.strip() for p in chosen.split(",")] if chosen else list(PROPERTY_IDS)
        for p in self.properties:
            if p not in PROPERTY_IDS:
                raise pytest.UsageError(f"--schedfuzz-properties: unknown property {p!r} (known: {', '.join(PROPERTY_IDS)})")
        self.stats = Stats()
        self.pending = 1  # property items this process has still to run (set at collection)
        # built now, so that a bad --schedfuzz-policy or --schedfuzz-reference is a usage error
        # at startup; the engine itself starts with the first case
        try:
            self.fuzzer = Fuzzer(self.fuzz_config)
        except ValueError as e:
            raise pytest.UsageError(str(e)) from None
        if self.fuzzer.shared is not None and workerinput is None:  # xdist's workers collect what the controller pulled
            self.fuzzer.shared.pull(self.corpus)
        known = option(config, "schedfuzz_known") or "builtin"
        if known not in ("builtin", "none"):
            raise pytest.UsageError(f"--schedfuzz-known {known!r}: builtin or none")
        from .cases.corpus import STARTER_CORPUS

        self.known_source = "none" if known == "none" else (str(STARTER_CORPUS) if STARTER_CORPUS.is_dir() else "none (no starter corpus beside the package)")
        if known == "builtin":
            self.fuzzer.known.learn(STARTER_CORPUS)
        self.fuzzer.known.learn(self.corpus)
        self.fuzzer.llama_judged = tuple(p for p in self.properties if is_llama(p))

    def engine_line(self) -> str:
        """Which engine runs: for the built-in ggml its version, library and bindings check."""
        fc = self.fuzz_config
        if fc.target:
            return f"engine = {fc.target}"
        info = self.fuzzer.engines.info()
        line = f"engine = ggml {info.get('ggml_version', '?')} ({info.get('lib', '?')}); bindings: {info.get('bindings', '?')}"
        if info.get("gpu_device", "available") != "available":
            line += f"\nschedfuzz: GPU-like devices off, layouts run without them: {info['gpu_device']}"
        self.fuzzer.rules  # noqa: B018 -- sets rules_note
        return line + (f"\nschedfuzz: {self.fuzzer.rules_note}" if self.fuzzer.rules_note else "")

    def time_share(self, weight: int = 1) -> float | None:
        """Seconds for the next property item when the profile fuzzes on time: what is left of
        the budget, shared by the items this process has still to run in proportion to their
        weights (``properties.fuzz_units``; under xdist, the items are shared by the workers)."""
        budget = self.fuzz_config.budget if self.fuzz_config.budget is not None else self.fuzzer.profile.budget
        if budget is None:
            return None
        left = max(0.0, budget - (time.monotonic() - self.fuzzer.started))
        share = left * weight / max(weight, self.pending)
        self.pending = max(1, self.pending - weight)
        return share

    def reference_line(self) -> str:
        """Which reference judges: compiled or source, and why (xdist's workers find what this
        process finds: the same sources and cache)."""
        from . import compiled

        importlib.import_module("reference")  # its status is set when it is imported
        return f"reference = {compiled.status}"

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        from .engine import TargetError

        fc = self.fuzz_config
        lines = [
            f"schedfuzz: profile={fc.profile} seed={fc.seed} "
            f"policy={fc.policy or 'can_reuse'} rereserve={'on' if fc.rereserve else 'off'}"
        ]
        try:
            lines.append(f"schedfuzz: {self.engine_line()}")
        except TargetError as e:
            pytest.exit(f"schedfuzz: the engine cannot start: {e}", returncode=pytest.ExitCode.USAGE_ERROR)
        if any(is_llama(p) for p in self.properties):
            try:  # a bad or Release llama.cpp build is a usage error now, not at the first workload
                info = self.fuzzer.engines.llama_target.start()
            except TargetError as e:
                pytest.exit(f"schedfuzz: llama.cpp cannot start: {e}", returncode=pytest.ExitCode.USAGE_ERROR)
            lines.append(f"schedfuzz: llama.cpp = {info.get('lib', '?')} with ggml {info.get('ggml_version', '?')} ({info.get('ggml_lib', '?')}); "
                         f"realloc callback: {info.get('realloc_callback', '?')}; build: {info.get('build', '?')}; "
                         f"struct layouts from {info.get('declarations', '?')} (checked against the library: {info.get('layouts_checked', '?')})")
            if info.get("absent_calls"):
                lines.append(f"schedfuzz: llama.cpp: call kinds this build lacks a function of, absent from its workloads: {info['absent_calls']}")
            if info.get("gpu_device", "available") != "available":
                lines.append(f"schedfuzz: llama.cpp: no GPU-like devices (RPC devices serve): {info['gpu_device']}")
            from reference.versions import rules_for

            _, note = rules_for(info.get("ggml_version"))  # the rules its figures are derived with
            if note:
                lines.append(f"schedfuzz: llama.cpp: {note}")
        lines.append(f"schedfuzz: {self.reference_line()}")
        n = len(self.fuzzer.known.cases)
        lines.append(f"schedfuzz: known upstream bugs: {n} expected failures (built in: {self.known_source}; your corpus: {self.corpus})")
        for llama in (False, True):
            if not llama or any(is_llama(p) for p in self.properties):
                note = self.fuzzer.known.unknown_version_note(llama)
                lines += [f"schedfuzz: {note}"] if note else []
        return lines

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:  # pytest-xdist: same seed on every worker
        node.workerinput["schedfuzz_seed"] = self.fuzz_config.seed

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
        if config.args_source == pytest.Config.ArgsSource.TESTPATHS and items:
            # `pytest --schedfuzz` with no paths is the fuzzing job, not the project's own
            # tests that `testpaths` names (name them to run both)
            config.hook.pytest_deselected(items=list(items))
            items.clear()
        suite = SchedfuzzSuite.from_parent(session, name="schedfuzz", nodeid="schedfuzz")
        items[:0] = list(suite.collect())

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for key, value in report.user_properties:
            if key == STATS_KEY:
                self.stats.merge(value)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.section("schedfuzz")
        terminalreporter.write_line(f"seed = {self.fuzz_config.seed} (rerun with --schedfuzz-seed {self.fuzz_config.seed})")
        terminalreporter.write_line(self.reference_line())
        if self.fuzzer.engines.started():
            terminalreporter.write_line(self.engine_line())
        self.stats.components = self.fuzzer.stats.components
        for line in self.stats.summary_lines():
            terminalreporter.write_line(line)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.fuzzer.close()
