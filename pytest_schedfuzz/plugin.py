"""pytest glue: ``pytest --schedfuzz`` fuzzes ggml's scheduler. Nothing here runs without it."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from .properties import PROPERTY_IDS, fuzz_units

STATS_KEY = "schedfuzz_stats"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("schedfuzz", "fuzz ggml's backend scheduler against a reference model")

    def add(name: str, help: str, ini_type: str = "string", **kw: Any) -> None:
        dest = name.replace("-", "_")
        group.addoption(f"--{name}", dest=dest, default=None, help=f"{help} (ini: {dest})", **kw)
        parser.addini(dest, help, type=ini_type, default=None)  # type: ignore[arg-type]

    add("schedfuzz", "fuzz the scheduler: collect the property suite and the corpus", "bool", action="store_true")
    add("schedfuzz-profile", "dev (fast, local), ci (deterministic, time-budgeted), nightly (large)")
    add("schedfuzz-examples", "Hypothesis examples per property (overrides the profile)", type=int)
    add("schedfuzz-seed", "seed of the run (printed in the header; default: random, 0 under ci)", type=int)
    add("schedfuzz-budget", "seconds for the whole fuzzing run (overrides the profile)", type=float)
    add("schedfuzz-target", "implementation under test as MODULE:FACTORY (default: the real ggml)")
    add("schedfuzz-lib", "the ggml under test: ggml-0.25.3 (default), ggml-0.15.3, ggml-0.25.3-seed (the seeds' ggml, built on first use), "
        "or your build's folder (env SCHEDFUZZ_GGML_LIB)")
    add("schedfuzz-llama-lib", "the llama.cpp under test: llama.cpp-0.3.36 (default: llama-cpp-python's), llama.cpp-0.3.36-seed (the seeds' "
        "system, built on first use), or your build's library folder, e.g. build/bin (env SCHEDFUZZ_LLAMA_LIB)")
    add("schedfuzz-policy", "scheduler reuse policy MODULE:CALLABLE(new, cur) -> bool (default: can_reuse)")
    add("schedfuzz-reference", "replace the reference's predict with MODULE:CALLABLE(scenario) -> Trace")
    add("schedfuzz-properties", "comma-separated property ids to fuzz (default: all)")
    add("schedfuzz-corpus", "directory of saved cases, replayed first; new findings are written there (default: corpus)")
    add("schedfuzz-known", "builtin (default): the starter corpus's known upstream bugs are not reported again; none: report them too")
    group.addoption(
        "--schedfuzz-rereserve", "--no-schedfuzz-rereserve", dest="schedfuzz_rereserve", default=None,
        action=_BoolFlag, nargs=0, help="driver re-reserves the worst case on topology changes (default on; ini: schedfuzz_rereserve)",
    )
    parser.addini("schedfuzz_rereserve", "driver re-reserves the worst case on topology changes", type="bool", default=None)  # type: ignore[arg-type]
    group.addoption(
        "--schedfuzz-keep-going", "--no-schedfuzz-keep-going", dest="schedfuzz_keep_going", default=None,
        action=_BoolFlag, nargs=0, help="campaign: after a finding, save it and fuzz on; report every distinct signature "
        "(default: on under the nightly profile; ini: schedfuzz_keep_going)",
    )
    parser.addini("schedfuzz_keep_going", "campaign mode: go on after a finding", type="bool", default=None)  # type: ignore[arg-type]
    group.addoption(
        "--schedfuzz-size-oracle", "--no-schedfuzz-size-oracle", dest="schedfuzz_size_oracle", default=None,
        action=_BoolFlag, nargs=0, help="replay every scenario, not one in ten, under GGML_SCHED_DEBUG_REALLOC=2 and compare "
        "ggml's own graph size, nodes and leafs at its first re-reservation (default: on under nightly; ini: schedfuzz_size_oracle)",
    )
    parser.addini("schedfuzz_size_oracle", "check ggml's own graph size at the first realloc", type="bool", default=None)  # type: ignore[arg-type]


class _BoolFlag(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, not (option_string or "").startswith("--no-"))


def _opt(config: pytest.Config, name: str) -> Any:
    value = config.getoption(name)
    return value if value is not None else config.getini(name)


def base_dir(config: pytest.Config) -> Path:
    """Where the corpus and the example database live: the ini file's folder when pytest was
    started inside it, else the folder pytest was started in. Never ``config.rootpath``: pytest
    derives it from path-like arguments, so ``--schedfuzz-llama-lib DIR`` would move it above DIR."""
    here = Path(config.invocation_params.dir).resolve()
    if config.inipath is not None:
        project = config.inipath.parent.resolve()
        if here == project or project in here.parents:
            return project
    return here


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "schedfuzz: a property test over the scheduler engine; runs only with --schedfuzz")
    lib = _opt(config, "schedfuzz_lib")
    if lib:
        # the engine of this session, with --schedfuzz or without: tests that build a GgmlTarget
        # (and their child pytest runs) load the same ggml
        from .ggml.lib import BUILT_IN, LIB_ENV, LibError, resolve_lib

        try:
            folder = resolve_lib(lib)
        except LibError as e:
            raise pytest.UsageError(str(e)) from None
        os.environ[LIB_ENV] = lib if lib in BUILT_IN else str(folder)
    if not _opt(config, "schedfuzz"):
        return
    config.pluginmanager.register(SchedfuzzSession(config), "schedfuzz-session")


class SchedfuzzSession:
    """Per-process state of a ``--schedfuzz`` run: the config, the fuzzer and the statistics."""

    def __init__(self, config: pytest.Config) -> None:
        from .campaign.fuzz import Fuzzer
        from .campaign.profiles import FuzzConfig, new_seed
        from .campaign.stats import Stats

        def num(name: str, kind: type) -> Any:
            v = _opt(config, name)
            if v in (None, ""):
                return None
            try:
                return kind(v)
            except ValueError:
                raise pytest.UsageError(f"--{name.replace('_', '-')}: {v!r} is not a {kind.__name__}") from None

        profile = _opt(config, "schedfuzz_profile") or "dev"
        workerinput = getattr(config, "workerinput", None)
        seed = workerinput["schedfuzz_seed"] if workerinput else num("schedfuzz_seed", int)
        rereserve = _opt(config, "schedfuzz_rereserve")
        self.config = config
        self.fuzz_config = FuzzConfig(
            profile=profile,
            examples=num("schedfuzz_examples", int),
            seed=seed,
            budget=num("schedfuzz_budget", float),
            target=_opt(config, "schedfuzz_target") or None,
            lib=_opt(config, "schedfuzz_lib") or os.environ.get("SCHEDFUZZ_GGML_LIB") or None,
            llama_lib=_opt(config, "schedfuzz_llama_lib") or os.environ.get("SCHEDFUZZ_LLAMA_LIB") or None,
            policy=_opt(config, "schedfuzz_policy") or None,
            rereserve=True if rereserve is None else bool(rereserve),
            reference=_opt(config, "schedfuzz_reference") or None,
            keep_going=None if _opt(config, "schedfuzz_keep_going") is None else bool(_opt(config, "schedfuzz_keep_going")),
            size_oracle=None if _opt(config, "schedfuzz_size_oracle") is None else bool(_opt(config, "schedfuzz_size_oracle")),
            database=base_dir(config) / ".schedfuzz" / "examples",
        )
        try:
            profile_obj = self.fuzz_config.resolved_profile()
        except ValueError as e:
            raise pytest.UsageError(str(e)) from None
        if self.fuzz_config.seed is None:
            self.fuzz_config = replace(self.fuzz_config, seed=0 if profile_obj.derandomize else new_seed())
        chosen_corpus = _opt(config, "schedfuzz_corpus")
        self.corpus = base_dir(config) / (chosen_corpus or "corpus")
        if chosen_corpus and not self.corpus.is_dir():
            raise pytest.UsageError(f"--schedfuzz-corpus {chosen_corpus}: no such folder ({self.corpus}); create it, or leave the option out for ./corpus")
        chosen = _opt(config, "schedfuzz_properties")
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
        known = _opt(config, "schedfuzz_known") or "builtin"
        if known not in ("builtin", "none"):
            raise pytest.UsageError(f"--schedfuzz-known {known!r}: builtin or none")
        from .cases.corpus import STARTER_CORPUS

        self.known_source = "none" if known == "none" else (str(STARTER_CORPUS) if STARTER_CORPUS.is_dir() else "none (no starter corpus beside the package)")
        if known == "builtin":
            self.fuzzer.known.learn(STARTER_CORPUS)
        self.fuzzer.known.learn(self.corpus)
        self.fuzzer.llama_judged = tuple(p for p in self.properties if p.startswith("llama-"))

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
        if any(p.startswith("llama-") for p in self.properties):
            try:  # a bad or Release llama.cpp build is a usage error now, not at the first workload
                info = self.fuzzer.engines.llama_target.start()
            except TargetError as e:
                pytest.exit(f"schedfuzz: llama.cpp cannot start: {e}", returncode=pytest.ExitCode.USAGE_ERROR)
            lines.append(f"schedfuzz: llama.cpp = {info.get('lib', '?')} with ggml {info.get('ggml_version', '?')} ({info.get('ggml_lib', '?')}); "
                         f"realloc callback: {info.get('realloc_callback', '?')}")
            from reference.versions import rules_for

            _, note = rules_for(info.get("ggml_version"))  # the rules its figures are derived with
            if note:
                lines.append(f"schedfuzz: llama.cpp: {note}")
        n = len(self.fuzzer.known.cases)
        lines.append(f"schedfuzz: known upstream bugs: {n} expected failures (built in: {self.known_source}; your corpus: {self.corpus})")
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
        if self.fuzzer.engines.started():
            terminalreporter.write_line(self.engine_line())
        self.stats.components = self.fuzzer.stats.components
        for line in self.stats.summary_lines():
            terminalreporter.write_line(line)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.fuzzer.close()


def xdist_workers(config: pytest.Config) -> int:
    """How many pytest-xdist workers share this session (1 without xdist), from xdist's own
    worker info; not from the environment, which child pytest runs inherit."""
    workerinput = getattr(config, "workerinput", None)
    return int(workerinput.get("workercount", 1)) if workerinput else 1


class SchedfuzzSuite(pytest.Collector):
    """The built-in property suite: one item per property, collected with no test file."""

    def collect(self) -> Iterator[pytest.Item]:
        from .cases.corpus import case_files

        session: SchedfuzzSession = self.config.pluginmanager.get_plugin("schedfuzz-session")  # type: ignore[assignment]
        # the corpus first: known findings are replayed before new fuzzing
        for path in case_files(session.corpus):
            yield CaseItem.from_parent(self, name=f"corpus/{path.stem}", path_=path)
        # under pytest-xdist each property is split into one shard per worker, so that the
        # workers share the fuzzing evenly (every worker collects the same items)
        workers = xdist_workers(self.config)
        shards = 1 if workers == 1 else 4 * workers  # several per worker: they balance better
        units = fuzz_units(session.properties, policy=session.fuzz_config.policy is not None)
        session.pending = sum(w for _, w in units) * shards // workers
        for prop, weight in units:
            for k in range(shards):
                name = prop if shards == 1 else f"{prop}[{k}]"
                yield PropertyItem.from_parent(self, name=name, prop=prop, shard=k, shards=shards, weight=weight)


class SchedfuzzFailure(Exception):
    """Findings of a property item, each reported in full with where it was saved."""


class CaseItem(pytest.Item):
    """One corpus file, replayed on the engine: ``expect: pass`` must hold no violation of its
    property; ``expect: {fail: ...}`` is a strict expected failure with the same signature."""

    def __init__(self, *, path_: Path, **kw: Any) -> None:
        super().__init__(**kw)
        self.case_path = path_
        self.add_marker("schedfuzz")

    def runtest(self) -> None:
        from .cases.corpus import CaseError, load_case
        from .cases.verdict import judge_replay

        session: SchedfuzzSession = self.config.pluginmanager.get_plugin("schedfuzz-session")  # type: ignore[assignment]
        try:
            case = load_case(self.case_path)
        except CaseError as e:
            raise CorpusFailure(f"bad corpus file: {e}") from None
        found = session.fuzzer.replay(case)
        self.user_properties += [("schedfuzz_property", case.property), ("schedfuzz_case", str(self.case_path))]
        version = session.fuzzer.engines.ggml_version(case.llama is not None)
        verdict = judge_replay(case, found, version, session.fuzzer.known.expected(case.llama is not None))
        if verdict.outcome == "known":
            pytest.xfail(verdict.text)
        if not verdict.ok:
            raise CorpusFailure(verdict.text)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, CorpusFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)  # type: ignore[arg-type]

    def reportinfo(self) -> tuple[Path | str, int | None, str]:
        return self.case_path, None, f"schedfuzz::corpus/{self.case_path.stem}"


class CorpusFailure(Exception):
    pass


class PropertyItem(pytest.Item):
    def __init__(self, *, prop: str, shard: int = 0, shards: int = 1, weight: int = 1, **kw: Any) -> None:
        super().__init__(**kw)
        self.prop = prop
        self.weight = weight
        self.shard, self.shards = shard, shards
        self.add_marker("schedfuzz")

    def runtest(self) -> None:
        session: SchedfuzzSession = self.config.pluginmanager.get_plugin("schedfuzz-session")  # type: ignore[assignment]
        fuzzer = session.fuzzer
        before = fuzzer.stats.as_dict()
        reports: list[str] = []

        def save(finding: Any) -> None:
            from .cases.corpus import save_case

            self.user_properties.append(("schedfuzz_property", finding.violation.property))
            try:
                path = save_case(session.corpus, finding.to_case(fuzzer))
            except OSError as e:  # the finding is still reported, in full
                reports.append(f"{finding.report()}\nNOT SAVED: cannot write to {session.corpus}: {e.strerror or e}")
                return
            self.user_properties.append(("schedfuzz_case", str(path)))
            reports.append(f"{finding.report()}\nsaved to {path}")

        try:
            if session.fuzz_config.keeps_going():
                fuzzer.campaign(self.prop, shard=self.shard, shards=self.shards, seconds=session.time_share(self.weight), on_finding=save)
            else:
                finding = fuzzer.fuzz(self.prop, shard=self.shard, shards=self.shards, seconds=session.time_share(self.weight))
                if finding is not None:
                    save(finding)
        finally:
            self.user_properties.append((STATS_KEY, fuzzer.stats.delta(before)))
        if fuzzer.interrupted:  # Ctrl-C: what was found is saved; the session stops here
            print("\n" + "\n\n".join(reports), flush=True)
            raise KeyboardInterrupt
        if reports:
            head = f"{len(reports)} distinct findings:\n\n" if len(reports) > 1 else ""
            raise SchedfuzzFailure(head + "\n\n".join(reports))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, SchedfuzzFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)  # type: ignore[arg-type]

    def reportinfo(self) -> tuple[Path | str, int | None, str]:
        return "schedfuzz", None, f"schedfuzz::{self.name}"


@pytest.fixture(scope="session")
def schedfuzz_engine(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The engine under test (a ``Target``: ``run(scenario) -> Trace``), shared by the session."""
    session = request.config.pluginmanager.get_plugin("schedfuzz-session")
    if session is None:
        pytest.skip("the schedfuzz engine runs only with --schedfuzz")
    yield session.fuzzer.engines.target


@pytest.fixture(scope="session")
def schedfuzz_reference() -> Any:
    """The reference scheduler's ``predict(scenario) -> Trace``."""
    from reference.predict import predict

    return predict


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _opt(config, "schedfuzz"):
        return
    skip = pytest.mark.skip(reason="schedfuzz property tests run with --schedfuzz")
    for item in items:
        if item.get_closest_marker("schedfuzz"):
            item.add_marker(skip)
