"""The fuzzing loop shared by the pytest plugin and the ``schedfuzz`` command.

A ``Fuzzer`` holds the engines under test (``engines.Engines``), the reference, the driver, the
known bugs (``known.KnownBugs``) and the statistics. For a property id it runs Hypothesis over
that property's strategy, checks each generated case on the engine and the reference (``checks``, signing
causes by reruns, ``causes``), and returns the shrunk failing case, if any, as a ``Finding``.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import FlakyFailure, HypothesisWarning
from hypothesis.internal.conjecture import engine as hypothesis_engine

from reference.rules import Rules

from .. import properties as props
from ..engine import TargetError, Unsupported, gc_paused, gc_young_threshold
from ..model.devices import DeviceLimits
from ..model.llama_workload import MAX_GPU, MAX_RPC, OPTIONAL_PARAMS, LlamaWorkload
from ..model.scenario import Scenario
from ..profiles import FuzzConfig, Profile, load_spec
from ..sim.driver import Driver, Workload, can_reuse, load_policy
from ..strategies import Pool, scenarios, workloads
from ..strategies.captured_graphs import captured_scenarios, captured_workloads
from ..strategies.llama_workloads import FAMILIES, llama_workloads
from ..strategies.neighbours import neighbours
from .captures import session_pool
from .checks import Checks, Predict
from .confirm import FLAKY, Confirmation, Finding, ViolationFound, confirmed_finding, keep_unconfirmed
from .engines import Engines
from .judging import LlamaJudges
from .known import KnownBugs
from .stats import Stats, sighted

if TYPE_CHECKING:
    from .shared import SharedCampaign



# the most llama.cpp runs a campaign on time spends shrinking one failure (each candidate is a run):
# Hypothesis's shrinker goes on until 200 candidates in a row keep nothing, which on llama.cpp cost
# more than the search for the next cause; a count, so that one seed still gives one case, and
# ``schedfuzz minimize`` shrinks a saved case further
LLAMA_SHRINK_RUNS = 64


@contextmanager
def shrinking_by_count() -> Iterator[None]:
    """Hypothesis stops shrinking after ``MAX_SHRINKING_SECONDS`` of the clock: on a loaded
    machine the same seed would shrink less, and end with another case and other example counts.
    Here a shrink is bounded by its count alone (Hypothesis's ``MAX_SHRINKS``), so that one seed
    gives one verdict and one report wherever it runs (``tests/campaign/test_verdicts.py``)."""
    before = getattr(hypothesis_engine, "MAX_SHRINKING_SECONDS", None)
    if before is None:  # a Hypothesis without the limit: nothing to lift
        yield
        return
    hypothesis_engine.MAX_SHRINKING_SECONDS = float("inf")  # type: ignore[attr-defined]
    try:
        yield
    finally:
        hypothesis_engine.MAX_SHRINKING_SECONDS = before  # type: ignore[attr-defined]

def llama_strategy(p: Profile, info: Mapping[str, str], favoured: list[LlamaWorkload], stats: Stats) -> st.SearchStrategy[LlamaWorkload]:
    """What draws the llama.cpp properties' server-like workloads on the build ``info`` describes,
    sized by the profile; once a campaign that keeps going has found a cause, half of them next
    to the workloads that found one (``strategies.neighbours``, counted: a dead dimension shows)."""
    limits = DeviceLimits.of(rpc=min(MAX_RPC, p.devices["rpc"]), gpu=MAX_GPU).without(  # the kinds this build can serve
        lambda k: (k.fake_gpu and info.get("gpu_device", "available") != "available") or (k.endpoint and info.get("rpc_round_trip", "").startswith("absent")))
    # call kinds and context parameters this build lacks (the engine's word; one that does not say has none of the parameters)
    absent = frozenset(k for k in info.get("absent_calls", "").split(",") if k) | \
        frozenset(k for k in info.get("absent_params", ",".join(OPTIONAL_PARAMS)).split(",") if k)
    drawn = llama_workloads(p.llama_layers, limits, p.llama_calls, families=FAMILIES, absent=absent, draft_models=True)
    if not favoured:
        return drawn

    def counted(workload: LlamaWorkload) -> LlamaWorkload:
        stats.llama_neighbours += 1
        return workload

    return st.one_of(drawn, neighbours(Pool(favoured), p.llama_layers, limits, p.llama_calls, FAMILIES, absent).map(counted))


@dataclass
class Quiet:
    """When a unit that keeps going on time ends (``Fuzzer.campaign``): at its ``deadline``, or
    ``patience`` seconds after its start or its last new finding (``campaign.patience``)."""

    deadline: float | None
    patience: float | None
    since: float

    def left(self) -> float | None:
        ends = [t for t in (self.deadline, None if self.patience is None else self.since + self.patience) if t is not None]
        return min(ends) - time.monotonic() if ends else None

    def given_on(self) -> int:
        """Seconds of the unit's share it gives on to those after it (0: it ran to its deadline)."""
        return round(max(0.0, self.deadline - time.monotonic())) if self.deadline is not None and self.patience is not None else 0


class Fuzzer(Checks):
    """Engine + reference + driver for one session (one pytest-xdist worker)."""

    def __init__(self, config: FuzzConfig) -> None:
        config.validate()
        self.config = config
        self.profile = config.resolved_profile()
        self.seed = config.seed if config.seed is not None else config.default_seed()
        self.policy = load_policy(config.policy) if config.policy else can_reuse
        self.driver = Driver(self.policy, config.rereserve)
        # a user's reference is theirs to version; the built-in one follows the loaded ggml
        self.predict: Predict = load_spec(config.reference, "--schedfuzz-reference") if config.reference else self._reference
        if config.target is None:
            from ..ggml.lib import resolve_lib

            resolve_lib(config.lib)  # a LibError (a ValueError) now, not at the first case
        if config.llama_lib is not None:
            from ..llama.llama_target import resolve_lib_dir

            try:
                resolve_lib_dir(config.llama_lib)
            except TargetError as e:
                raise ValueError(f"--schedfuzz-llama-lib {config.llama_lib}: {e}") from None
        self._rules: Rules | None = None
        self.rules_note: str | None = None
        self.stats = Stats()
        self.engines = Engines(config, self.stats, self.seed)
        self.known = KnownBugs(self.stats, self.engines.ggml_version, self.engines.llama_build)
        self.started = time.monotonic()
        self.first_failure: float | None = None  # seconds from the start of fuzz() to the first violation
        self.llama_judged: tuple[str, ...] = props.LLAMA_PROPERTY_IDS  # what LLAMA_GROUP judges (the selected ones)
        self.interrupted = False  # Ctrl-C was pressed while fuzzing: the caller saves what fuzz() returned, then stops
        self._captured: tuple[Scenario, ...] | None = None  # llama.cpp's graphs (``captured_pool``), made on first use
        self.judges = LlamaJudges()  # which judge a llama.cpp run: a sample of the costly ones while generating on time
        self.favoured: list[LlamaWorkload] = []  # llama.cpp workloads that found a cause in this campaign (``strategy``)
        self.shared: SharedCampaign | None = None  # --schedfuzz-db: the campaign shared on Redis
        if config.shared is not None:
            from .shared import SharedCampaign

            self.shared = SharedCampaign(config.shared, self.seed, ca=config.shared_ca)

    def close(self) -> None:
        """Stop every engine (workers, RPC servers); a Ctrl-C meanwhile is noted in
        ``interrupted``, not raised halfway, so that nothing is left running."""
        with self.ctrl_c_noted():
            self.engines.close()
            shared, self.shared = self.shared, None  # its part in the campaign ends once
            if shared is not None:
                for line in shared.close(self.stats.examples):
                    shared.say(line)

    def out_of_budget(self) -> bool:
        budget = self.config.budget if self.config.budget is not None else self.profile.budget
        return budget is not None and time.monotonic() - self.started > budget

    # ----------------------------------------------------------------- a property

    def strategy(self, prop: str) -> st.SearchStrategy[Workload | Scenario | LlamaWorkload]:
        """What draws ``prop``'s examples: server-like workloads (run on llama.cpp) for the llama
        properties, else what the property's registry entry says it ``draws``, sized by the
        profile. Layouts have GPU-like devices only where this ggml can."""
        p = self.profile
        if props.is_llama(prop):
            return llama_strategy(p, self.engines.llama_target.start(), self.favoured, self.stats)
        limits = p.devices if self.engines.gpu_device() == "available" else p.devices.without(lambda k: k.fake_gpu)
        d = props.PROPERTIES[prop].draws
        drawn: list[st.SearchStrategy[Workload | Scenario | LlamaWorkload]] = []
        if d.captured and self.captured_pool():
            pool = self.captured_pool()
            drawn.append(captured_scenarios(pool, limits, p.max_steps, self.policy) if d.captured == "scenarios"
                         else captured_workloads(pool, limits, d.max_ubatches, self.policy))
        if d.kind in ("scenarios", "both"):
            drawn.append(scenarios(limits, p.max_steps, True, p.max_layers, p.max_extra_ops))
        if d.kind in ("workloads", "both"):
            drawn.append(workloads(max_ubatches=d.max_ubatches, min_reconfigures=d.min_reconfigures, max_layers=max(2, p.max_layers // 4),
                                   max_extra_ops=p.max_extra_ops, limits=DeviceLimits.of(rpc=1, gpu=limits["gpu"])))  # the driver's layouts: one RPC device, no BLAS
        return drawn[0] if len(drawn) == 1 else st.one_of(*drawn)

    def captured_pool(self) -> tuple[Scenario, ...]:
        """llama.cpp's graphs, captured once per session (``captures.session_pool``)."""
        if self._captured is None:
            self._captured = Pool(session_pool(self.engines, self.stats, self.config.target is None))
        return self._captured

    def scenario_of(self, case: Workload | Scenario) -> Scenario:
        return self.driver.scenario(case) if isinstance(case, Workload) else case

    def examples_for(self, prop: str, examples: int | None = None) -> int | None:
        """Examples to run on ``prop``: given, configured, or the profile's; ``None``: on time,
        for a campaign that keeps going on a budget the user gave (``--schedfuzz-keep-going
        --schedfuzz-budget``: as many as it allows, shared by the properties)."""
        if examples or self.config.examples:
            return examples or self.config.examples
        # the built-in policy's decisions are can_reuse's own: a chunk of cheap rule checks, no more
        rules = prop in props.POLICY_PROPERTY_IDS and not self.config.policy
        if self.config.keeps_going() and self.config.budget is not None:
            return self.profile.chunk if rules else None
        n = self.profile.llama_examples if props.is_llama(prop) else self.profile.examples
        return min(n, self.profile.chunk) if rules else n

    def campaign(self, prop: str, shard: int = 0, shards: int = 1, seconds: float | None = None,
                 on_finding: Callable[[Finding], None] = lambda f: None, patience: float | None = None) -> list[Finding]:
        """Keep going after a finding: record it (``on_finding``), count its signature as known,
        and fuzz on (round ``r`` under seeds offset by ``r``), until the property's examples or
        time are spent, or ``patience`` has passed without a new finding (``Quiet``); every
        distinct finding, in order."""
        findings: list[Finding] = []
        quiet = Quiet(time.monotonic() + seconds if seconds is not None else None, patience, time.monotonic())
        for rnd in range(10_000):
            left = quiet.left()
            if (left is not None and left <= 0) or self.out_of_budget():
                break
            finding = self.fuzz(prop, shard=shard, shards=shards, seconds=left, round_=rnd)
            if finding is None:
                break
            findings.append(finding)
            self.known.campaign.add(finding.violation.signature())
            self.favoured += [finding.llama] if finding.llama is not None else []  # a favoured input: the next draws go next to it too
            on_finding(finding)
            if self.interrupted:
                break
            quiet.since = time.monotonic()
        if not self.interrupted and not self.out_of_budget() and (given := quiet.given_on()):
            self.stats.quiet_ends[prop] = self.stats.quiet_ends.get(prop, 0) + given
        return findings

    def fuzz(self, prop: str, examples: int | None = None, shard: int = 0, shards: int = 1, seconds: float | None = None,
             round_: int = 0) -> Finding | None:
        """Run Hypothesis on one property; the shrunk failing case, or None. With ``shards``
        (one per pytest-xdist worker) this runs shard ``shard``: its share of the examples,
        under seed ``seed + shard``. With no example count (the ci profile) it runs chunks of
        ``profile.chunk`` examples, chunk ``k`` under seed ``seed + k*shards + shard``, until
        ``seconds`` (this property's share of the budget) or the budget is spent. The collector's
        young generation is ``gc_young_threshold``'s for all of them (set back at each chunk, the
        next allocation would collect every container it let live at once)."""
        with gc_young_threshold():
            return self._fuzz_chunks(prop, examples, shard, shards, round_, seconds)

    def _fuzz_chunks(self, prop: str, examples: int | None, shard: int, shards: int, round_: int, seconds: float | None) -> Finding | None:
        n = self.examples_for(prop, examples)
        start = time.monotonic()
        self.first_failure = None
        if n is not None:
            # by count: which examples run, and so the verdict, depend on the seed alone; the budget
            # only caps, and what it leaves unrun is counted (``Stats.examples_cut``: "cut short")
            share = -(-n // shards)
            self.stats.examples_asked += share
            if self.out_of_budget():
                self.stats.examples_cut += share
                return None
            return self._fuzz_run(prop, share, self.seed + shard + round_ * 1_000_003, start, None, counted=True)
        if seconds is None and self.config.budget is None and self.profile.budget is None:
            raise ValueError(f"profile {self.config.profile!r} fuzzes on time and needs a budget")
        deadline = start + seconds if seconds is not None else None
        k = 0
        while not self.out_of_budget() and (deadline is None or time.monotonic() < deadline):
            finding = self._fuzz_run(prop, self.profile.chunk, self.seed + k * shards + shard + round_ * 1_000_003, start, deadline)
            if finding is not None:
                return finding
            k += 1
        return None

    @contextmanager
    def ctrl_c_noted(self) -> Iterator[None]:
        """A first Ctrl-C is noted in ``self.interrupted`` and raised by the next example (``one``),
        not where the signal lands: a KeyboardInterrupt raised in a garbage-collector callback or
        a ``__del__`` (Hypothesis's, mid-shrink) is printed ("Exception ignored in …") and lost. A
        second Ctrl-C raises at once, for a step that does not return. Outside a Hypothesis run
        (saving a case, closing the engines: ``close``, the CLI) the caller reads ``interrupted``."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def pressed(signum: int, frame: object) -> None:
            if self.interrupted:
                raise KeyboardInterrupt
            self.interrupted = True

        before = signal.signal(signal.SIGINT, pressed)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, before)

    def _fuzz_run(self, prop: str, n: int, seed: int, start: float, deadline: float | None, counted: bool = False) -> Finding | None:
        if self.shared is not None:
            self.shared.record_examples(self.stats.examples)
        # shrink towards the first failure's signature only, so that a case keeps its finding
        target: list[str] = []

        @hypothesis_seed(seed)
        @settings(
            max_examples=n,
            deadline=None,
            derandomize=False,
            suppress_health_check=list(HealthCheck),
            phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
            report_multiple_bugs=False,
        )
        @given(self.strategy(prop))
        def run(case: Workload | Scenario | LlamaWorkload) -> None:
            try:
                with gc_paused():
                    check_example(case)
            except KeyboardInterrupt:
                self.interrupted = True
                raise

        def check_example(case: Workload | Scenario | LlamaWorkload) -> None:
            # out of time, skip; but never once a failure is being confirmed and shrunk (a skip
            # would make Hypothesis's replay of it pass: a FlakyFailure)
            if not target and (self.out_of_budget() or (deadline is not None and time.monotonic() > deadline)):
                self.stats.examples_cut += counted
                return
            if self.interrupted:  # Ctrl-C: Hypothesis stopped shrinking and replays; do not run the engine again
                raise KeyboardInterrupt
            self.stats.examples += 1
            scenario = None if isinstance(case, LlamaWorkload) else self.scenario_of(case)
            if scenario is not None:
                self.stats.add_features(scenario)
            shrunk[0] += bool(target) and scenario is None and not counted  # once spent, the smallest case so far is the finding
            try:
                self.judges.sampling, self.judges.shrinking = not counted and not target, target[0] if target else None
                found = ([best[0].violation] if case == best[0].llama else []) if shrunk[0] > LLAMA_SHRINK_RUNS else \
                    self.check(prop, scenario) if scenario is not None else self.check_llama(prop, case)  # type: ignore[arg-type]
            except Unsupported:
                reject()  # the case tests nothing here (counted in the stats where it is the engine's answer): not a pass

            # a known engine bug (an expect-fail case of the corpus) found again is not news
            # (a llama.cpp bug known on other builds only is seen again too, its summary group saying where)
            elsewhere = self.known.elsewhere(props.is_llama(prop))
            known_set = self.known.signatures(props.is_llama(prop)) | set(elsewhere)
            known = [v for v in found if v.signature() in known_set]
            self.stats.known += len(known)
            for v in known:
                self.stats.seen_again[v.signature()] = self.stats.seen_again.get(v.signature(), 0) + 1
                if v.signature() in elsewhere:
                    self.stats.components[v.signature()] = f"known on {', '.join(elsewhere[v.signature()])}, seen on {self.engines.llama_build()}"
            found = [v for v in found if v.signature() not in known_set]
            # a shared campaign: a signature another host claimed is theirs to shrink and save; here it is seen again
            while found and not target and self.shared is not None and (owner := self.shared.claim(prop, found[0].signature(), take=False)):
                sig = found.pop(0).signature()
                self.stats.seen_again[sig] = self.stats.seen_again.get(sig, 0) + 1
                self.stats.components.setdefault(sig, f"found by {owner} in the shared campaign")
            if found and self.first_failure is None:
                self.first_failure = time.monotonic() - start
            if found and not target:
                sighted(self.config.sightings, prop, [v.signature() for v in found])
                print(f"schedfuzz: {prop}: found {found[0].signature()}; shrinking it (Ctrl-C stops and saves the smallest so far)", file=sys.stderr, flush=True)
            if found and (not target or found[0].signature() == target[0]):
                target[:] = [found[0].signature()]
                best[:] = [ViolationFound(scenario, found[0], case if isinstance(case, Workload) else None, case if isinstance(case, LlamaWorkload) else None)]
                raise best[0]

        best: list[ViolationFound] = []  # the smallest failing case so far (Hypothesis shrinks in order)
        shrunk = [0]  # llama.cpp runs of the shrink's candidates, in a campaign on time
        if self.shared is not None:
            # ``seed`` turns Hypothesis's database off: a seeded run is decided by its seed alone, as a
            # local run stays. A shared campaign needs it on, so that every host replays first the
            # failing examples any host saved (its local database beside the shared one).
            run._hypothesis_internal_use_settings = settings(  # type: ignore[attr-defined]
                run._hypothesis_internal_use_settings, database=self.shared.database(self.config.database))  # type: ignore[attr-defined]

        def interrupted() -> None:
            # Ctrl-C: stop at once (Hypothesis would stop shrinking, replay the case, and the
            # session go on to the next property); the smallest case so far is still a finding,
            # returned to be saved, and ``self.interrupted`` tells the caller to stop after it
            self.interrupted = True
            if best:
                raise best[0] from None
            raise KeyboardInterrupt

        try:
            try:
                with self.ctrl_c_noted(), warnings.catch_warnings(), shrinking_by_count():
                    # Hypothesis formats a failing example's repr for its own report, which this
                    # replaces (``Finding.report``): a large graph's is a warning no user caused
                    warnings.filterwarnings("ignore", "Generating overly large repr", HypothesisWarning)
                    run()
            except FlakyFailure as flaky:  # found once, not again on Hypothesis's own replay: unconfirmed (``confirm``)
                found = [x for x in flaky.exceptions if isinstance(x, ViolationFound)]
                if not found:
                    raise
                keep_unconfirmed(self.engines, found[0].violation, Confirmation((), FLAKY), found[0].scenario, found[0].workload, found[0].llama)
                return None
            except KeyboardInterrupt:
                interrupted()
        except ViolationFound as e:
            self.judges.sampling, self.judges.shrinking = False, None
            return confirmed_finding(self, prop, e)
        finally:
            self.judges.sampling, self.judges.shrinking = False, None
        return None
