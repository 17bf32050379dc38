"""The options of a fuzzing run, declared once (``OPTIONS``) for both front ends: pytest's
``--schedfuzz-NAME`` options (with their ini keys ``schedfuzz_NAME``) and ``schedfuzz run``'s
``--NAME``. A new option is one entry here; ``campaign.campaign`` reads it.

Each value read keeps where it came from (``Given.source``), so that an error names what the user
wrote: ``SCHEDFUZZ_GGML_LIB=/x``, not an option never passed."""

from __future__ import annotations

import argparse
import difflib
import os
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .builds.names import ABOUT as LLAMA_BUILT_IN
from .builds.names import SEED_GGML
from .model.versions import BUILT_IN
from .profiles import PROFILES


@dataclass(frozen=True)
class Option:
    """One option of a run. ``name`` "" is pytest's ``--schedfuzz`` switch itself."""

    name: str
    help: str
    kind: type = str  # str, int, float, or bool: an on/off pair (--x / --no-x)
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    env: str | None = None  # read where neither the command line nor the ini file gives it
    cli: bool = True  # ``schedfuzz run`` has it too

    @property
    def dest(self) -> str:
        return "schedfuzz" + (f"_{self.name.replace('-', '_')}" if self.name else "")

    @property
    def cli_dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def pytest_flag(self) -> str:
        return "--schedfuzz" + (f"-{self.name}" if self.name else "")

    @property
    def cli_flag(self) -> str:
        return f"--{self.name}"

    @property
    def shown(self) -> str | None:
        """The value's name in the usage line."""
        return self.metavar or ("|".join(self.choices) if self.choices else None)

    def full_help(self) -> str:
        return self.help + (f" (env {self.env})" if self.env else "")


# the built-ins of --schedfuzz-lib and --schedfuzz-llama-lib, from their tables (the first of each is the default)
def _ggml_built_ins() -> str:
    return ", ".join([f"{BUILT_IN[0]} (default)", *BUILT_IN[1:], f"{SEED_GGML} (the seeds' ggml, built on first use)"])


def _llama_built_ins() -> str:
    return ", ".join(f"{name} ({'default: ' if k == 0 else ''}{about})" for k, (name, about) in enumerate(LLAMA_BUILT_IN.items()))


def _profiles_help() -> str:
    return "how much to fuzz: " + "; ".join(f"{name}: {p.about}" for name, p in PROFILES.items()) + " (default: dev)"


OPTIONS: tuple[Option, ...] = (
    Option("", "fuzz the scheduler: replay the corpus, then one item per property", bool, cli=False),
    Option("profile", _profiles_help(), choices=tuple(PROFILES)),
    Option("examples", "Hypothesis examples per property, at least 1 (overrides the profile's count or time)", int, "N"),
    Option("seed", "seed of the run, 0 .. 2**32-1 (printed by every run; default: random, 0 under ci)", int, "N"),
    Option("budget", "seconds for the whole run (overrides the profile's); the properties share what is left", float, "SECONDS"),
    Option("properties", "comma-separated property ids to fuzz (default: all)", metavar="IDS"),
    Option("lib", f"the ggml under test: {_ggml_built_ins()}, or your build's library folder", metavar="NAME|DIR",
           env="SCHEDFUZZ_GGML_LIB"),
    Option("llama-lib", f"the llama.cpp under test: {_llama_built_ins()}, any published build by name (llama.cpp-bNNNN, fetched on first use), or your build's library folder, e.g. build/bin",
           metavar="NAME|DIR", env="SCHEDFUZZ_LLAMA_LIB"),
    Option("target", "your implementation under test as MODULE:FACTORY (default: the real ggml)", metavar="MODULE:FACTORY"),
    Option("policy", "the scheduler reuse policy MODULE:CALLABLE(new, cur) -> bool (default: can_reuse)", metavar="MODULE:CALLABLE"),
    Option("reference", "replace the reference's predict with MODULE:CALLABLE(scenario) -> Trace", metavar="MODULE:CALLABLE"),
    Option("rereserve", "the driver re-reserves the worst case on topology changes (default: on)", bool),
    Option("confirm-runs", "replays on a fresh worker and fresh RPC servers of a failure that does not come back at once; a "
           "finding when one shows its signature, reported as reproduced k of n (default: 5)", int, "N"),
    Option("keep-going", "campaign: after a finding, save it and fuzz on; report every distinct signature (default: on under "
           "nightly)", bool),
    Option("size-oracle", "replay every scenario, not one in ten, under GGML_SCHED_DEBUG_REALLOC=2 and compare ggml's own graph "
           "size, nodes and leafs at its first re-reservation (default: on under nightly)", bool),
    Option("corpus", "folder of saved cases, replayed first; new findings are written there (default: ./corpus; one given "
           "must exist)", metavar="DIR"),
    Option("known", "builtin (default): the starter corpus's known upstream bugs are not reported again; none: report them too",
           choices=("builtin", "none")),
    Option("db", "share the campaign with other hosts on Redis (docs/shared-campaign.md): Hypothesis's examples, claims "
           "of findings by signature, saved cases; rediss:// for TLS, USER:PASSWORD@ before the host (or the password in "
           "SCHEDFUZZ_DB_PASSWORD) for AUTH", metavar="redis[s]://HOST:PORT/N"),
    Option("db-ca", "the CA certificate a rediss:// Redis's certificate is checked against (default: the system's)", metavar="FILE",
           env="SCHEDFUZZ_DB_CA"),
    Option("report", "also write the verdict and every statistic to this JSON file (schema: pytest_schedfuzz/report.schema.json)",
           metavar="FILE.json"),
    Option("sightings", "append each signature a process sees first, with the time, to this file (JSON lines; what the "
           "rediscovery benchmark reads)", metavar="FILE"),
)

BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}


@dataclass(frozen=True)
class Given:
    """An option's value and where the user gave it: ``--schedfuzz-lib``, ``--lib``, ``ini
    schedfuzz_lib`` or ``SCHEDFUZZ_GGML_LIB``."""

    value: Any
    source: str


class OptionError(ValueError):
    """A value that cannot be read; the message names where it came from."""


def convert(option: Option, raw: Any, source: str) -> Any:
    """``raw`` (a string from an ini file or the environment, or a parsed value) as the option's type."""
    if option.kind is bool and isinstance(raw, str):
        words = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
        if raw.strip().lower() not in words:
            raise OptionError(f"{source} {raw!r}: not on or off (true, false, 1, 0)")
        return words[raw.strip().lower()]
    try:
        value = option.kind(raw)
    except ValueError:
        raise OptionError(f"{source} {raw!r}: not {'an' if option.kind is int else 'a'} {option.kind.__name__}") from None
    if option.choices and value not in option.choices:
        raise OptionError(f"{source} {value!r}: choose one of {', '.join(option.choices)}")
    return value


def read(given: Callable[[Option], Given | None]) -> dict[str, Given]:
    """Each option's value: what ``given`` finds (a front end's command line or ini file), else its
    environment variable; options given nowhere are absent."""
    out: dict[str, Given] = {}
    for option in OPTIONS:
        found = given(option)
        if found is None and option.env and os.environ.get(option.env):
            found = Given(os.environ[option.env], option.env)
        if found is not None and found.value not in (None, ""):
            out[option.name] = Given(convert(option, found.value, found.source), found.source)
    return out


def in_user_words(message: str, given: Mapping[str, Given], default: Callable[[Option], str]) -> str:
    """``message`` (which names options ``--schedfuzz-NAME VALUE``, as the campaign's checks say
    them) in the words the user wrote: the flag, ini key or environment variable each value came
    from; an option not given as ``default`` names it (``--NAME`` for ``schedfuzz run``)."""
    for option in OPTIONS:
        if not option.name:
            continue
        source = given[option.name].source if option.name in given else default(option)
        joiner = "=" if option.env == source else " "
        message = re.sub(rf"{re.escape(option.pytest_flag)}(?![\w-])( |=)?", lambda m: source + (joiner if m.group(1) else ""), message)
    return message


# ------------------------------------------------------------------------------ the two front ends


def add_to_pytest(parser: Any) -> None:
    """Every option in pytest's ``schedfuzz`` group, each with its ini key."""
    group = parser.getgroup("schedfuzz", "fuzz ggml's backend scheduler against a reference model")
    for o in OPTIONS:
        help = f"{o.full_help()} (ini: {o.dest})"
        if o.kind is bool and o.name:
            group.addoption(o.pytest_flag, f"--no-{o.pytest_flag[2:]}", dest=o.dest, default=None, action=_OnOff, nargs=0, help=help)
        elif o.kind is bool:
            group.addoption(o.pytest_flag, dest=o.dest, default=None, action="store_true", help=help)
        else:
            # choices are checked by ``convert``, for the ini file and the environment alike
            group.addoption(o.pytest_flag, dest=o.dest, default=None, type=o.kind, metavar=o.shown, help=help)
        parser.addini(o.dest, o.full_help(), type="bool" if o.kind is bool else "string", default=None)


def add_to_argparse(parser: argparse.ArgumentParser, names: Collection[str] | None = None) -> None:
    """The options ``schedfuzz run`` shares with ``pytest --schedfuzz``, without the prefix (only
    ``names``, where given: the engine options of ``replay`` and the other commands)."""
    for o in OPTIONS:
        if not o.cli or (names is not None and o.name not in names):
            continue
        if o.kind is bool:
            parser.add_argument(o.cli_flag, dest=o.cli_dest, default=None, action=argparse.BooleanOptionalAction, help=o.full_help())
        else:
            parser.add_argument(o.cli_flag, dest=o.cli_dest, default=None, type=o.kind, metavar=o.shown, help=o.full_help())


def from_pytest(config: Any) -> dict[str, Given]:
    """The options of a pytest run: its command line, then its ini file, then the environment."""

    def given(o: Option) -> Given | None:
        value = config.getoption(o.dest)
        if value is not None:
            return Given(value, o.pytest_flag)
        value = config.getini(o.dest)
        return Given(value, f"ini {o.dest}") if value not in (None, "") else None

    return read(given)


def from_argparse(args: argparse.Namespace) -> dict[str, Given]:
    """The options of ``schedfuzz run``: its command line, then the environment."""

    def given(o: Option) -> Given | None:
        value = getattr(args, o.cli_dest, None)
        return Given(value, o.cli_flag) if value is not None else None

    return read(given)


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`` (did you mean --x?)`` for a misspelled ``word`` among ``known``; "" where none is close."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def pytest_flags() -> list[str]:
    """Every flag pytest's schedfuzz group has, the --no- forms included."""
    return [f for o in OPTIONS for f in (o.pytest_flag, *([f"--no-{o.pytest_flag[2:]}"] if o.kind is bool and o.name else []))]


class _OnOff(argparse.Action):
    """``--x`` on, ``--no-x`` off (pytest's parser has no BooleanOptionalAction of its own)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, not (option_string or "").startswith("--no-"))
