"""How much a run fuzzes (``Profile``, ``PROFILES``) and what the user configured (``FuzzConfig``)."""

from __future__ import annotations

import importlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .model.devices import DeviceLimits


@dataclass(frozen=True)
class Profile:
    """How much to fuzz: examples per property and llama.cpp workloads (counts: one seed, one
    verdict), graph scale, and a time budget that only caps the run (a run it cuts is "cut
    short", never clean). Only a campaign that keeps going on a budget of the user's runs on time
    (``Fuzzer.examples_for``)."""

    examples: int
    max_steps: int
    budget: float | None  # seconds for the whole run: a cap
    derandomize: bool
    # the most devices of each kind a layout holds (a build drops the kinds it cannot serve; BLAS is skipped where ggml has none)
    devices: DeviceLimits = DeviceLimits.of(rpc=2, gpu=1)
    max_layers: int = 4  # llama-like graphs: layers, and extra elementwise ops per layer
    max_extra_ops: int = 0
    llama_examples: int = 60  # llama.cpp workloads (tiny models: ~10 per second), each judged by every llama property
    llama_layers: int = 3
    llama_calls: int = 24
    chunk: int = 25  # examples per Hypothesis run when a campaign fuzzes on time (each run a seed of its own)
    keep_going: bool = False  # campaign: go on after a finding, report every distinct signature
    size_oracle: bool = False  # every scenario, not one in ten, is compared with ggml's own figures (``observed``)
    # the fewest examples a property item must judge to pass (fewer, if it is asked for fewer: an
    # example count over its xdist shards); an item below it is reported with the reason, not passed
    min_examples: int = 10
    about: str = ""  # what it is for, in the options' help


PROFILES: dict[str, Profile] = {
    "dev": Profile(examples=15, devices=DeviceLimits.of(rpc=1, gpu=1), max_steps=5, budget=None, derandomize=False, llama_examples=40,
                   about="local and fast, 15 examples a property (40 llama.cpp workloads), a random seed"),
    # ci: deterministic (seed 0) by counts: what the time shares of a 240 s run on two cores gave,
    # less a fifth (docs/benchmarks.md); the budget only caps (a slower machine, or a loaded one, is
    # cut short: a verdict of its own). Two GPU-like devices: peer copies between
    # them, cpy_tensor_async
    "ci": Profile(examples=800, devices=DeviceLimits.of(rpc=2, gpu=2), max_steps=6, budget=600.0, derandomize=True, llama_examples=1200, min_examples=10,
                  about="seed 0, 800 examples a property and 1,200 llama.cpp workloads (about 190 s on 2 cores; capped at 600 s), "
                        "up to 2 RPC and 2 GPU-like devices"),
    # up to 32 layers of up to 250 nodes: llama-sized graphs of several thousand nodes
    "nightly": Profile(
        examples=300, devices=DeviceLimits.of(rpc=3, gpu=2, blas=1), max_steps=10, budget=None, derandomize=False, max_layers=32, max_extra_ops=200, keep_going=True, size_oracle=True,
        llama_examples=1000, llama_layers=6, llama_calls=48, min_examples=100,
        about="300 examples a property on graphs of up to 32 layers, keeps going after a finding, ggml's own figures on every scenario",
    ),
}


@dataclass(frozen=True)
class FuzzConfig:
    profile: str = "dev"
    examples: int | None = None
    seed: int | None = None
    budget: float | None = None
    target: str | None = None  # module:factory; default the built-in ggml engine
    lib: str | None = None
    llama_lib: str | None = None  # a llama.cpp build's library folder; default llama-cpp-python's
    policy: str | None = None  # module:callable
    rereserve: bool = True
    reference: str | None = None  # module:callable replacing reference.predict.predict
    keep_going: bool | None = None  # campaign mode; default: the profile's
    size_oracle: bool | None = None  # ggml's own graph size for matches-reference; default: the profile's
    database: Path | None = Path(".schedfuzz/examples")
    shared: str | None = None  # redis[s]://HOST:PORT/N: a campaign shared with other hosts (``campaign.shared``)
    shared_ca: str | None = None  # the CA file a rediss:// server's certificate is checked against
    confirm_runs: int = 5  # replays on fresh workers of a failure that did not come back at once (``campaign.confirm``)
    sightings: Path | None = None  # each signature a process sees first is appended here (``campaign.stats.sighted``)

    def resolved_profile(self) -> Profile:
        if self.profile not in PROFILES:
            raise ValueError(f"--schedfuzz-profile {self.profile!r}: choose one of {', '.join(PROFILES)}")
        return PROFILES[self.profile]

    def uses_size_oracle(self) -> bool:
        return self.size_oracle if self.size_oracle is not None else self.resolved_profile().size_oracle

    def keeps_going(self) -> bool:
        return self.keep_going if self.keep_going is not None else self.resolved_profile().keep_going

    def default_seed(self) -> int:
        """The seed where none is given: 0 under a derandomized profile (ci: every run alike), but
        a drawn one in a shared campaign, where hosts alike would all fuzz the same examples."""
        return new_seed() if self.shared or not self.resolved_profile().derandomize else 0

    def validate(self) -> None:
        """A ``ValueError`` naming the option (``--schedfuzz-*``) for any value out of range."""
        self.resolved_profile()
        if self.examples is not None and self.examples < 1:
            raise ValueError(f"--schedfuzz-examples {self.examples}: must be at least 1")
        if self.confirm_runs < 1:
            raise ValueError(f"--schedfuzz-confirm-runs {self.confirm_runs}: must be at least 1")
        if self.budget is not None and not self.budget > 0:
            raise ValueError(f"--schedfuzz-budget {self.budget:g}: must be a positive number of seconds")
        if self.seed is not None and not 0 <= self.seed < 2**32:
            raise ValueError(f"--schedfuzz-seed {self.seed}: must be in 0 .. 2**32-1")
        if self.target is not None:
            load_spec(self.target, "--schedfuzz-target")
        if self.shared is not None:
            from .redis_url import RedisUrl

            RedisUrl.parse(self.shared)


def new_seed() -> int:
    return random.SystemRandom().randrange(2**32)


def load_spec(spec: str, what: str) -> Any:
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{what} {spec!r}: write it MODULE:NAME")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        hint = " (is its folder on PYTHONPATH?)" if isinstance(e, ModuleNotFoundError) else ""
        raise ValueError(f"{what} {spec!r}: {e}{hint}") from None
