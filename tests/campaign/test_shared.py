"""A campaign shared on Redis (``campaign.shared``), on a real ``redis-server`` started on loopback
as the RPC servers are (a free port, ready once it accepts a connection, killed as a process
group): two ``schedfuzz run`` hosts share a finding, saved once and replayed by the other; killing
Redis mid-run loses nothing. Skipped, with the reason, where ``redis-server`` is not installed."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_schedfuzz.cases.corpus import case_files, load_case
from pytest_schedfuzz.process.children import kill_group, spawn
from pytest_schedfuzz.process.rpc import free_port, port_accepts
from pytest_schedfuzz.redis_url import RedisUrl, SharedError

pytest_plugins = ["pytester"]

SCHEDFUZZ = [sys.executable, "-m", "pytest_schedfuzz.cli"]
TESTS = Path(__file__).parents[1]
SIGNATURE = "reuse-complete[rebuilt=True]"
# the planted fault's finding comes in the first examples: a short ci budget is enough (each host
# fuzzes reuse-complete alone, with no engine); a shared campaign keeps going on its budget (on time:
# each chunk of examples a Hypothesis run of its own, which replays what the other hosts saved first)
FUZZ = ["run", "--profile", "ci", "--properties", "reuse-complete", "--known", "none", "--keep-going"]

needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None,
                                 reason="redis-server is not installed (Debian: apt-get install redis-server)")


class RedisServer:
    """``redis-server`` on 127.0.0.1 at a free port, its append-only file in ``folder`` (fsynced at
    every write: what it acknowledged survives a SIGKILL); ``kill`` and ``start`` again on the same port."""

    def __init__(self, folder: Path, tls: tuple[Path, Path, Path] | None = None, password: str | None = None) -> None:
        self.folder = folder
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.tls = tls  # (CA, certificate, key): TLS only, on self.port
        self.password = password  # requirepass
        self.start()

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        log = open(self.folder / "redis.log", "ab")
        port = ["--port", "0", "--tls-port", str(self.port), "--tls-ca-cert-file", str(self.tls[0]), "--tls-cert-file", str(self.tls[1]),
                "--tls-key-file", str(self.tls[2]), "--tls-auth-clients", "no"] if self.tls else ["--port", str(self.port)]
        auth = ["--requirepass", self.password] if self.password else []
        self.proc = spawn(["redis-server", "--bind", "127.0.0.1", *port, *auth, "--dir", str(self.folder), "--save", "",
                           "--appendonly", "yes", "--appendfsync", "always"], dict(os.environ), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not port_accepts(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"redis-server did not listen on {self.port}: {(self.folder / 'redis.log').read_text()[-2000:]}")
            time.sleep(0.02)

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        if self.proc is not None:
            kill_group(self.proc)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    (tmp_path / "redis").mkdir()
    server = RedisServer(tmp_path / "redis")
    yield server
    server.close()


class Host:
    """A ``schedfuzz run`` process whose output lines are read as they come."""

    def __init__(self, args: list[str], cwd: Path, **env: str) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.out: list[str] = []
        self.proc = subprocess.Popen([*SCHEDFUZZ, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "PYTHONPATH": f"{TESTS.parent}{os.pathsep}{TESTS}", **env}, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.out.append(line)
            self.lines.put(line)

    def wait_for(self, text: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            if text in line:
                return line
        pytest.fail(f"never said {text!r}:\n{''.join(self.out)}")

    def finish(self, timeout: float = 120) -> str:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
            pytest.fail(f"still running after {timeout} s:\n{''.join(self.out)}")
        time.sleep(0.2)  # the reader thread's last lines
        return "".join(self.out)


def status(url: str) -> str:
    run = subprocess.run([*SCHEDFUZZ, "campaign", "status", "--db", url], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(TESTS.parent)})
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def test_a_redis_url_is_checked_and_names_the_option() -> None:
    assert RedisUrl.parse("redis://10.0.0.5:7000/3") == RedisUrl("10.0.0.5", 7000, 3)
    assert str(RedisUrl.parse("redis://cache")) == "redis://cache:6379/0"
    tls = RedisUrl.parse("rediss://ci:p%40ss@cache.example:6380/2")
    assert (tls.tls, tls.username, tls.password) == (True, "ci", "p@ss") and str(tls) == "rediss://ci@cache.example:6380/2"
    with pytest.raises(SharedError) as bad:
        RedisUrl.parse("rediss://ci:hunter2@cache.example:port/2")
    assert "hunter2" not in str(bad.value) and "rediss://ci:***@cache.example" in str(bad.value)
    for bad in ("http://h:1/0", "redis://", "redis://h:port/0", "redis://h:1/db", "h:6379"):
        with pytest.raises(SharedError, match=r"--schedfuzz-db .*: write it redis://HOST:PORT/N"):
            RedisUrl.parse(bad)


def test_a_bad_db_is_a_usage_error_of_run_status_and_the_plugin(tmp_path: Path, pytester: pytest.Pytester) -> None:
    env = {**os.environ, "PYTHONPATH": str(TESTS.parent)}
    bad = subprocess.run([*SCHEDFUZZ, "run", "--db", "redis:/nohost"], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert bad.returncode == 2 and "schedfuzz: --db 'redis:/nohost': write it redis://HOST:PORT/N" in bad.stderr, bad.stderr
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    down = subprocess.run([*SCHEDFUZZ, "campaign", "status", "--db", nobody], capture_output=True, text=True, timeout=60, env=env)
    assert down.returncode == 2 and f"--db {nobody}: Redis does not answer there" in down.stderr, down.stderr
    result = pytester.runpytest_subprocess("--schedfuzz", "-p", "no:cacheprovider", "--co", "--schedfuzz-db", "127.0.0.1:6379", timeout=300)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--schedfuzz-db '127.0.0.1:6379': write it redis://HOST:PORT/N" in result.stderr.str()


@needs_redis
def test_two_hosts_on_one_redis_save_a_finding_once_and_the_other_replays_it(redis_server: RedisServer, tmp_path: Path) -> None:
    """Two hosts at once, each with a seed of its own: the first to find the planted fault claims,
    shrinks and saves it; the other finds it again, in the shared examples database too, counts it
    seen again and gets the case in its corpus; ``campaign status`` lists both and the finding."""
    corpora = [tmp_path / "a", tmp_path / "b"]
    hosts = []
    for corpus in corpora:
        corpus.mkdir()
        hosts.append(Host([*FUZZ, "--budget", "15", "--policy", "planted:never", "--corpus", ".", "--db", redis_server.url], corpus))
    outs = [h.finish() for h in hosts]
    names = [re.search(r"shared campaign: redis://\S+: host (\S+), seed (\d+)\n", out) for out in outs]
    assert all(names), outs
    assert names[0].group(2) != names[1].group(2)  # type: ignore[union-attr]
    winner = next(i for i, out in enumerate(outs) if "saved to" in out)
    loser = 1 - winner
    assert "saved to" not in outs[loser], outs[loser]
    assert hosts[winner].proc.returncode == 1 and hosts[loser].proc.returncode == 0, outs
    assert f"{SIGNATURE}: already claimed by {names[winner].group(1)}; counted as seen again" in outs[loser]  # type: ignore[union-attr]
    fetched = re.search(r"(\d+) example\(s\) fetched from the shared database, (\d+) case\(s\) pulled", outs[loser])
    assert fetched and int(fetched.group(1)) >= 1 and int(fetched.group(2)) == 1, outs[loser]
    # saved once: the same one file in both corpora, published once
    files = [[p.name for p in case_files(c)] for c in corpora]
    assert len(files[winner]) == 1 and files[loser] == files[winner], files
    assert load_case(corpora[loser] / files[loser][0]).signature == SIGNATURE
    listed = status(redis_server.url)
    assert "hosts: 2" in listed and f"{names[0].group(1)}  seed {names[0].group(2)}" in listed  # type: ignore[union-attr]
    seen = re.search(rf"  {re.escape(SIGNATURE)}\n    property reuse-complete; claimed by (\S+); seen again (\d+); saved: (\S+)\n", listed)
    assert seen, listed
    assert seen.group(1) == names[winner].group(1) and int(seen.group(2)) >= 1 and seen.group(3) == files[winner][0]  # type: ignore[union-attr]
    assert "findings by signature: 1" in listed
    assert re.search(r"examples in the shared database: [1-9]", listed), listed


@needs_redis
def test_killing_redis_mid_run_loses_nothing(redis_server: RedisServer, tmp_path: Path) -> None:
    """Redis killed (SIGKILL) after a host joined, before its finding: the host says it fuzzes on
    locally, claims and saves the finding in its corpus, and publishes it once Redis is back. A
    host whose Redis never comes back says at the end what it could not publish, kept locally."""
    corpus = tmp_path / "a"
    corpus.mkdir()
    trigger = tmp_path / "trigger-a"
    # --keep-going: it fuzzes on after its finding, for the rest of its budget, while Redis comes back
    host = Host([*FUZZ, "--budget", "20", "--keep-going", "--policy", "planted:never_once_told", "--corpus", ".", "--db", redis_server.url],
                corpus, PLANTED_TRIGGER=str(trigger))
    name = re.search(r"host (\S+),", host.wait_for("shared campaign: redis://")).group(1)  # type: ignore[union-attr]
    redis_server.kill()
    trigger.touch()
    host.wait_for("lost Redis at")
    host.wait_for("saved to")
    assert host.proc.poll() is None  # fuzzing on
    redis_server.start()
    host.wait_for("answers again after")
    out = host.finish()
    assert host.proc.returncode == 1, out
    (saved,) = case_files(corpus)
    assert load_case(saved).signature == SIGNATURE
    assert "NOT PUBLISHED" not in out and "1 case(s) published" in out, out
    assert "Redis was lost 1 time(s) during the run; this host fuzzed on locally meanwhile, and published what waited" in out, out
    listed = status(redis_server.url)
    assert f"  {SIGNATURE}\n    property reuse-complete; claimed by {name}; seen again 0; saved: {saved.name}\n" in listed, listed
    assert re.search(rf"  {re.escape(name)}  seed \d+  examples [1-9]\d*  done", listed), listed

    # a host that never gets Redis back: what waited is listed at the end, and kept locally
    corpus = tmp_path / "c"
    corpus.mkdir()
    trigger = tmp_path / "trigger-c"
    # (another database of the same server: the first host's case, published there, is not pulled as an untriaged finding)
    other_db = redis_server.url[:-1] + "1"
    host = Host([*FUZZ, "--budget", "10", "--policy", "planted:never_once_told", "--corpus", ".", "--db", other_db], corpus,
                PLANTED_TRIGGER=str(trigger))
    host.wait_for("shared campaign: redis://")
    redis_server.kill()
    trigger.touch()
    out = host.finish()
    assert host.proc.returncode == 1, out
    (saved,) = case_files(corpus)
    assert f"NOT PUBLISHED (Redis at {other_db} is lost): 1 case(s): {saved.name}; 1 claim(s): {SIGNATURE}" in out, out
    assert "Traceback" not in out, out
    assert json.loads(saved.read_text())["signature"] == SIGNATURE


def _certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA of the test's own and a certificate it signed for 127.0.0.1: (CA, certificate, key)."""
    ca, key, cert = folder / "ca.crt", folder / "server.key", folder / "server.crt"
    run = lambda *args: subprocess.run(["openssl", *args], cwd=folder, capture_output=True, check=True, timeout=60)  # noqa: E731
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", str(ca), "-days", "2", "-subj", "/CN=schedfuzz test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (folder / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", str(ca), "-CAkey", "ca.key", "-CAcreateserial", "-out", str(cert), "-days", "2",
        "-extfile", "ext.cnf")
    return ca, cert, key


@needs_redis
@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the test's certificates")
def test_a_campaign_over_tls_with_a_password_and_a_malformed_case_refused(tmp_path: Path) -> None:
    """CI runners reach a hosted Redis: rediss:// with a CA file, AUTH with the password from the
    URL or from SCHEDFUZZ_DB_PASSWORD (never printed); a server with requirepass and no password
    is a clear usage error. A case in Redis that the corpus loader cannot read is refused, with the
    host that published it named, and never written to the corpus."""
    (tmp_path / "redis").mkdir()
    ca, cert, key = _certificates(tmp_path / "redis")
    server = RedisServer(tmp_path / "redis", tls=(ca, cert, key), password="s3cr3t-pw")
    try:
        import redis

        client = redis.Redis(host="127.0.0.1", port=server.port, password="s3cr3t-pw", ssl=True, ssl_ca_certs=str(ca))
        client.hset("schedfuzz:cases", "broken-0123456789.json", b'{"format": "schedfuzz-case", "version": 1, "prop')
        client.hset("schedfuzz:published_by", "broken-0123456789.json", "runner-7:4242")
        corpus = tmp_path / "a"
        corpus.mkdir()
        secret = f"rediss://:s3cr3t-pw@127.0.0.1:{server.port}/0"
        host = Host([*FUZZ, "--examples", "20", "--policy", "planted:never", "--corpus", ".", "--db", secret, "--db-ca", str(ca)], corpus)
        out = host.finish()
        assert host.proc.returncode == 1 and "saved to" in out, out
        assert "s3cr3t-pw" not in out
        assert "refused the case broken-0123456789.json published by runner-7:4242: not valid JSON" in out, out
        assert len(list(case_files(corpus))) == 1 and not (corpus / "broken-0123456789.json").exists()
        # the password from the environment, for a URL without one (a CI secret)
        env = {**os.environ, "PYTHONPATH": str(TESTS.parent), "SCHEDFUZZ_DB_PASSWORD": "s3cr3t-pw"}
        listed = subprocess.run([*SCHEDFUZZ, "campaign", "status", "--db", server.url, "--db-ca", str(ca)], capture_output=True, text=True,
                                timeout=60, env=env)
        assert listed.returncode == 0 and f"  {SIGNATURE}\n" in listed.stdout and "s3cr3t-pw" not in listed.stdout, listed.stdout + listed.stderr
        env.pop("SCHEDFUZZ_DB_PASSWORD")
        asked = subprocess.run([*SCHEDFUZZ, "campaign", "status", "--db", server.url, "--db-ca", str(ca)], capture_output=True, text=True,
                               timeout=60, env=env)
        assert asked.returncode == 2 and "Redis asks for a password" in asked.stderr and "SCHEDFUZZ_DB_PASSWORD" in asked.stderr, asked.stderr
        wrong = subprocess.run([*SCHEDFUZZ, "campaign", "status", "--db", f"rediss://:nope@127.0.0.1:{server.port}/0", "--db-ca", str(ca)],
                               capture_output=True, text=True, timeout=60, env=env)
        assert wrong.returncode == 2 and "refused the credentials" in wrong.stderr and "nope" not in wrong.stderr, wrong.stderr
    finally:
        server.close()
