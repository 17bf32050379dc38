"""A campaign shared by several hosts on one Redis (``--schedfuzz-db redis://HOST:PORT/N``).

Every host fuzzing with the same ``--schedfuzz-db`` shares, under the ``schedfuzz:`` keys of that
Redis database:

- Hypothesis's example database (``RedisExampleDatabase``, beside the host's local one): the
  failing examples one host saved are replayed first by every other host;
- the findings, by signature: the first host to find a signature claims it (``HSETNX``), shrinks
  it and saves it; another host that finds it counts it as seen again, as a known bug;
- the saved cases, published so that every host's corpus gets them (``pull``);
- the hosts, each with its own seed and its examples run (``schedfuzz campaign status``).

Redis may go away mid-run: a host that loses it fuzzes on locally and says so. Its findings are
claimed and saved locally, its examples kept in its local database, and all of it is published
when Redis answers again (tried at most every ``RETRY_S`` seconds); whatever is still unpublished
at the end is listed then.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase, MultiplexedDatabase

from ..cases.corpus import Case, CaseError, load_case
from ..files import atomic_write
from ..redis_url import OPTION, PASSWORD_ENV, RedisUrl, SharedError

PREFIX = "schedfuzz:"
HOSTS = PREFIX + "hosts"  # host id -> JSON: seed, examples, state, last contact
CLAIMS = PREFIX + "claims"  # signature -> JSON: the host that claimed it first, its property, when
SEEN = PREFIX + "seen"  # signature -> times other hosts found it again
SAVED = PREFIX + "saved:"  # + signature: the set of case files published for it
CASES = PREFIX + "cases"  # case file name -> the case's JSON text
PUBLISHED_BY = PREFIX + "published_by"  # case file name -> the host that published it
EXAMPLES = (PREFIX + "examples:").encode()  # Hypothesis's keys (RedisExampleDatabase's key_prefix)
# a lost Redis is tried again at most this often: a host cut off by a firewall would otherwise
# wait for a connection timeout at every database call
RETRY_S = 5.0

T = TypeVar("T")


def _say(line: str) -> None:
    print(f"schedfuzz: shared campaign: {line}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class HostStatus:
    host: str
    seed: int
    examples: int
    state: str
    last_contact: float  # seconds since the epoch


@dataclass(frozen=True)
class FindingStatus:
    signature: str
    property: str
    host: str  # the host that claimed it
    seen_again: int  # times other hosts found it
    saved: tuple[str, ...]  # its case files published


@dataclass(frozen=True)
class CampaignStatus:
    url: str
    hosts: tuple[HostStatus, ...]
    example_keys: int
    examples: int
    findings: tuple[FindingStatus, ...]

    def lines(self, now: float) -> list[str]:
        out = [f"shared campaign {self.url}", f"hosts: {len(self.hosts)}"]
        out += [f"  {h.host}  seed {h.seed}  examples {h.examples}  {h.state}  (last contact {max(0.0, now - h.last_contact):.0f} s ago)"
                for h in self.hosts]
        out.append(f"examples in the shared database: {self.examples} (under {self.example_keys} keys)")
        out.append(f"findings by signature: {len(self.findings)}")
        for f in self.findings:
            saved = ", ".join(f.saved) if f.saved else "not saved yet (being shrunk, or its host lost Redis)"
            out.append(f"  {f.signature}\n    property {f.property}; claimed by {f.host}; seen again {f.seen_again}; saved: {saved}")
        return out


def _client(url: RedisUrl, ca: str | None = None) -> Any:
    try:
        from redis import Redis
    except ImportError:
        raise SharedError(f"{OPTION} needs the redis client: pip install redis") from None

    if ca is not None and not Path(ca).is_file():
        raise SharedError(f"{OPTION}-ca {ca}: no such file (the CA certificate a rediss:// server's certificate is checked against)")
    tls = {"ssl": True, "ssl_ca_certs": ca} if url.tls else {}
    # short timeouts: a host that cannot reach Redis fuzzes on locally rather than wait
    return Redis(host=url.host, port=url.port, db=url.db, username=url.username, password=url.password, socket_connect_timeout=2.0,
                 socket_timeout=5.0, **tls)


def _lost_errors() -> tuple[type[BaseException], ...]:
    from redis.exceptions import ConnectionError, TimeoutError

    return ConnectionError, TimeoutError, OSError


def reach(text: str, ca: str | None = None) -> tuple[RedisUrl, Any]:
    """The parsed URL and a client that answered a PING (over TLS, checked against ``ca``, for
    ``rediss://``; after AUTH where a password is given); a ``SharedError`` naming the option where
    the URL is malformed, nothing answers there, or Redis refuses the credentials."""
    from redis.exceptions import AuthenticationError, ResponseError

    url = RedisUrl.parse(text)
    client = _client(url, ca)
    try:
        client.ping()
    except (AuthenticationError, ResponseError) as e:  # NOAUTH, a HELLO refused, WRONGPASS
        if url.password is None:
            raise SharedError(f"{OPTION} {url}: Redis asks for a password ({e}): give it in the URL or in {PASSWORD_ENV}") from None
        raise SharedError(f"{OPTION} {url}: Redis refused the credentials ({e}; the password comes from the URL, else {PASSWORD_ENV})") from None
    except _lost_errors() as e:
        raise SharedError(f"{OPTION} {url}: Redis does not answer there: {e}") from None
    return url, client


def status(text: str, ca: str | None = None) -> CampaignStatus:
    """What the campaign at ``text`` holds: hosts, examples and findings by signature."""
    url, r = reach(text, ca)
    hosts = tuple(sorted((HostStatus(h.decode(), **json.loads(v)) for h, v in r.hgetall(HOSTS).items()), key=lambda h: h.host))
    keys = [k for k in r.scan_iter(match=EXAMPLES + b"*", count=1000)]
    examples = sum(r.scard(k) for k in keys)
    seen = {k.decode(): int(v) for k, v in r.hgetall(SEEN).items()}
    findings = []
    for sig_b, claim in sorted(r.hgetall(CLAIMS).items()):
        sig, c = sig_b.decode(), json.loads(claim)
        saved = tuple(sorted(f.decode() for f in r.smembers(SAVED + sig)))
        findings.append(FindingStatus(sig, c["property"], c["host"], seen.get(sig, 0), saved))
    return CampaignStatus(str(url), hosts, len(keys), examples, tuple(findings))


class SharedCampaign:
    """This host's part in a shared campaign: claims, publishing, pulling, and the examples
    database. Every Redis call goes through ``_do``, which turns a lost connection into local
    work queued for later (and says so), never into an error of the run."""

    def __init__(self, text: str, seed: int, say: Callable[[str], None] = _say, ca: str | None = None) -> None:
        self.url, self.redis = reach(text, ca)
        self.seed = seed
        self.say = say
        self.host = f"{socket.gethostname()}:{os.getpid()}"
        self.examples = 0
        self.corpus: Path | None = None  # where ``pull`` writes the published cases (again at ``close``)
        self._lost_at: float | None = None
        self.losses = 0  # times Redis was lost (said at the time, and again at ``close``: pytest may capture the first)
        self._retry_at = 0.0
        self._mine: set[str] = set()  # signatures this host claimed
        self._theirs: dict[str, str] = {}  # signature -> the host that claimed it
        # what waits for Redis to answer again: example writes, claims made offline, cases, seen counts
        self._examples: list[tuple[str, tuple[bytes, ...]]] = []
        self._claims: dict[str, str] = {}
        self._cases: dict[str, tuple[str, str]] = {}  # file name -> (signature, JSON text)
        self._seen: dict[str, int] = {}
        self.published: set[str] = set()  # case files published (now or once Redis was back; a file saved again is one)
        self.fetched = 0  # examples Redis gave Hypothesis to replay
        self.pulled: list[Path] = []
        self.refused: dict[str, str] = {}  # cases pulled that the corpus loader would refuse: file name -> the host that published it
        from hypothesis.extra.redis import RedisExampleDatabase

        self._redis_examples = RedisExampleDatabase(self.redis, key_prefix=EXAMPLES)
        # listed as a host from its first examples on: pytest-xdist's controller, which runs none
        # (it pulls the cases for its workers), is not one
        self._listed = False
        self.say(f"{self.url}: host {self.host}, seed {seed}")

    # ------------------------------------------------------------- the connection

    def _do(self, op: Callable[[Any], T]) -> T | None:
        """``op(redis)``; None while Redis is lost (retried every ``RETRY_S`` s). The first call
        that succeeds after a loss publishes what waited."""
        if self._lost_at is not None and time.monotonic() < self._retry_at:
            return None
        try:
            result = op(self.redis)
        except _lost_errors() as e:
            if self._lost_at is None:
                self._lost_at = time.monotonic()
                self.losses += 1
                self.say(f"lost Redis at {self.url} ({e}); fuzzing on locally: findings are saved in the local corpus and "
                         "examples in the local database, and published when Redis answers again")
            self._retry_at = time.monotonic() + RETRY_S
            return None
        if self._lost_at is not None:
            self.say(f"Redis at {self.url} answers again after {time.monotonic() - self._lost_at:.0f} s; publishing what waited")
            self._lost_at = None
            self._flush()
        return result

    @property
    def lost(self) -> bool:
        return self._lost_at is not None

    def _flush(self) -> None:
        """Publish what waited for Redis, in order; what fails again waits on."""
        for sig, record in list(self._claims.items()):
            if self._do(lambda r: r.hsetnx(CLAIMS, sig, record)) is None:
                return
            del self._claims[sig]
            owner = self._owner(sig)
            if owner not in (None, self.host):
                self.say(f"{sig}: claimed by {owner} too while this host was cut off; both saved it")
        for file, (sig, text) in list(self._cases.items()):
            if not self._publish(file, sig, text):
                return
        while self._examples:
            method, args = self._examples[0]
            if self._do(lambda r: getattr(self._redis_examples, method)(*args) or True) is None:
                return
            self._examples.pop(0)
        for sig, n in list(self._seen.items()):
            if self._do(lambda r: r.hincrby(SEEN, sig, n)) is None:
                return
            del self._seen[sig]

    # ------------------------------------------------------------- the campaign

    def heartbeat(self, state: str) -> None:
        """Record this host's seed, examples run and state (``campaign status``)."""
        record = json.dumps({"seed": self.seed, "examples": self.examples, "state": state, "last_contact": time.time()})
        self._do(lambda r: r.hset(HOSTS, self.host, record))

    def record_examples(self, examples: int) -> None:
        self.examples = examples
        self._listed = True
        self.heartbeat("fuzzing")

    def _owner(self, signature: str) -> str | None:
        raw = self._do(lambda r: r.hget(CLAIMS, signature))
        return str(json.loads(raw)["host"]) if raw else None

    def claim(self, prop: str, signature: str, take: bool = True) -> str | None:
        """Claim a new finding's signature: None where this host is the one to save it (its first
        finder, or cut off from Redis: claimed locally, published later); else the host that
        claimed it, and this host counts it as seen again. ``take=False`` only asks: a failure is
        fuzzed, shrunk and confirmed before its signature is claimed (a claim is a confirmed
        finding's), so while it is new to this host it asks whether another host has claimed it."""
        if signature in self._mine:
            return None
        if signature not in self._theirs:
            if not take:
                owner = self._owner(signature)
                if owner is None or owner == self.host:
                    return None
                self._theirs[signature] = owner
            else:
                record = json.dumps({"host": self.host, "property": prop, "claimed": time.time()})
                won = self._do(lambda r: r.hsetnx(CLAIMS, signature, record))
                if won is None:
                    self._claims[signature] = record
                if won is None or won:
                    self._mine.add(signature)
                    return None
                self._theirs[signature] = self._owner(signature) or "another host"
            self.say(f"{signature}: already claimed by {self._theirs[signature]}; counted as seen again")
        if self._do(lambda r: r.hincrby(SEEN, signature, 1)) is None:
            self._seen[signature] = self._seen.get(signature, 0) + 1
        return self._theirs[signature]

    def publish(self, case: Case, path: Path) -> None:
        """A case this host saved (at ``path``), for every host's corpus."""
        text = path.read_text(encoding="utf-8")
        if not self._publish(path.name, case.signature, text):
            self._cases[path.name] = (case.signature, text)

    def _publish(self, file: str, signature: str, text: str) -> bool:
        def write(r: Any) -> bool:
            pipe = r.pipeline()  # MULTI/EXEC: a case is never listed under its signature without its text
            pipe.hset(CASES, file, text)
            pipe.hset(PUBLISHED_BY, file, self.host)
            pipe.sadd(SAVED + signature, file)
            pipe.execute()
            return True

        if self._do(write) is None:
            return False
        self._cases.pop(file, None)
        self.published.add(file)
        return True

    def pull(self, corpus: Path) -> list[Path]:
        """Write the cases other hosts published into ``corpus`` (those it lacks); remembered, to
        pull again at ``close``."""
        self.corpus = corpus
        cases = self._do(lambda r: r.hgetall(CASES))
        if cases is None:
            return []
        by = self._do(lambda r: r.hgetall(PUBLISHED_BY)) or {}
        new = []
        for name, text in sorted(cases.items()):
            target = corpus / Path(name.decode()).name  # a name only: never a path out of the corpus
            if target.exists() or target.name in self.refused:
                continue
            problem = _unreadable(target.name, text)
            if problem is not None:  # checked as the corpus loader checks a file, before anything is written
                host = by.get(name, b"a host that did not say (an older schedfuzz)").decode(errors="replace")
                self.refused[target.name] = host
                self.say(f"refused the case {target.name} published by {host}: {problem}; not written to {corpus}")
                continue
            new.append(_write_file(target, text))
        self.pulled += new
        return new

    def database(self, local: Path | None) -> ExampleDatabase:
        """Hypothesis's database for this host: the local one (``local``: kept whatever happens to
        Redis) and the shared one."""
        shared = _SharedExamples(self)
        return MultiplexedDatabase(DirectoryBasedExampleDatabase(str(local)), shared) if local is not None else shared

    def close(self, examples: int) -> list[str]:
        """The end of this host's part, after ``examples`` in all: its last record, a last try to
        publish what waited, the published cases pulled into the corpus; the lines that say what it
        did and what it could not."""
        self.examples = examples
        if self.lost:
            self._retry_at = 0.0  # one more try now, whatever the interval
        if self._listed:
            self.heartbeat("done")
        if self.corpus is not None:
            self.pull(self.corpus)
        lines = [f"{self.url}: host {self.host}, seed {self.seed}: {len(self._mine)} finding(s) claimed, "
                 f"{len(self._theirs)} claimed by other hosts (seen again), {len(self.published)} case(s) published, "
                 f"{self.fetched} example(s) fetched from the shared database, {len(self.pulled)} case(s) pulled into the corpus"]
        if self.refused:
            lines.append(f"REFUSED {len(self.refused)} case(s) pulled from Redis that the corpus loader cannot read (not written): "
                         + ", ".join(f"{name} (published by {host})" for name, host in sorted(self.refused.items())))
        if self.losses:
            lines.append(f"Redis was lost {self.losses} time(s) during the run; this host fuzzed on locally meanwhile"
                         + ("" if self.lost else ", and published what waited once it answered again"))
        if self.lost or self._cases or self._examples or self._claims:
            waiting = [f"{len(self._cases)} case(s): {', '.join(sorted(self._cases))}"] if self._cases else []
            waiting += [f"{len(self._claims)} claim(s): {', '.join(sorted(self._claims))}"] if self._claims else []
            waiting += [f"{len(self._examples)} example write(s)"] if self._examples else []
            lines.append(f"NOT PUBLISHED (Redis at {self.url} is lost): " + ("; ".join(waiting) or "nothing waited")
                         + ". The cases are in the local corpus, the examples in the local database.")
        self.redis.close()
        return lines


def _unreadable(name: str, data: bytes) -> str | None:
    """Why a case pulled from Redis cannot be used (``load_case``'s words), or None: it is read
    from a file of its own name in a folder of its own, never from the corpus."""
    with tempfile.TemporaryDirectory(prefix="schedfuzz-pulled-") as folder:
        path = Path(folder) / name
        path.write_bytes(data)
        try:
            load_case(path)
        except CaseError as e:
            return e.problem
    return None


def _write_file(target: Path, data: bytes) -> Path:
    def write(tmp: Path) -> None:
        tmp.write_bytes(data)

    return atomic_write(target, write)


class _SharedExamples(ExampleDatabase):
    """The Redis half of the examples database, through the campaign's ``_do``: a lost connection
    fetches nothing and queues the writes, for ``_flush`` once Redis answers again."""

    def __init__(self, campaign: SharedCampaign) -> None:
        super().__init__()
        self.campaign = campaign

    def fetch(self, key: bytes) -> Iterable[bytes]:
        values = self.campaign._do(lambda r: list(self.campaign._redis_examples.fetch(key))) or []
        self.campaign.fetched += len(values)
        return values

    def save(self, key: bytes, value: bytes) -> None:
        self._write("save", (key, value))

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self._write("move", (src, dest, value))

    def delete(self, key: bytes, value: bytes) -> None:
        """Not forwarded: Hypothesis deletes an example that no longer fails, and one that fails
        with a signature another host claimed, or a bug known only here, does not fail here; in
        the shared database that would erase another host's finding. Redis expires what no host
        replays (``RedisExampleDatabase``'s eight days)."""

    def _write(self, method: str, args: tuple[bytes, ...]) -> None:
        c = self.campaign
        if c._examples or c._do(lambda r: getattr(c._redis_examples, method)(*args) or True) is None:
            c._examples.append((method, args))  # in order, after what already waits (published by ``_flush``)
