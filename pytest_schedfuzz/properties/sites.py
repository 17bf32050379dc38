"""Where the check that aborted ggml is: the file and line ggml printed, and the function read
from the build's source at that line (a figure ggml does not print: derived here, on the judging
side, from the source the engine was built from)."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from ..builds.seed import kept_source
from ..files import cache_dir

# the RPC client's check for every server failure: its site is wherever the client first noticed
# the failure (another call in another ggml version), not where anything went wrong
RPC_FAILED = "Remote RPC server crashed or returned malformed response"


def server_death(servers: tuple[str, ...], message: str) -> str | None:
    """How the first RPC server of an abort that died went, as signatures say it ("was killed by
    SIGSEGV", "exited with status 1"): from the abort's ``servers`` (each "ENDPOINT: killed by
    SIGSEGV", from the process's exit status), else, for a trace from before they were recorded,
    from its message ("RPC server ENDPOINT was killed by SIGSEGV"). None: no server died."""
    if servers:
        status = servers[0].rpartition(": ")[2]
        return f"was {status}" if status.startswith("killed by ") else status
    died = re.search(r"RPC server \S+ (was killed by \w+|exited with status \d+)", message)
    return died.group(1) if died else None


def killed_by_assert(kind: str, head: str, died: str | None, check: str) -> tuple[str, str] | None:
    """How a process killed by an assert is signed, as (kind, first line): by the assert, not by
    which process ran the device's work (the worker for the CPU and a GPU-like device, an RPC
    server for its device), so that one kernel check keeps one signature wherever the device that
    failed it was drawn. A C ``assert`` (``check``: its line) is a crash by its signal, ggml's
    ``GGML_ASSERT``/``GGML_ABORT`` the abort the worker's abort callback would report. ``head`` is
    the abort's first line (the worker's signal, or the RPC client's check), ``died`` how an RPC
    server died (``server_death``). None: no process was killed by it (an assert the worker's
    ggml reported, a server that refused a command).

    >>> killed_by_assert("crash", "the worker was killed by SIGABRT", None, "ops.cpp:9: f: Assertion `x' failed.")
    ('crash', 'killed by SIGABRT')
    >>> killed_by_assert("abort", "ggml-rpc.cpp: Remote RPC server crashed", "was killed by SIGABRT", "ops.cpp:9: f: Assertion `x' failed.")
    ('crash', 'killed by SIGABRT')
    >>> killed_by_assert("abort", "ggml-rpc.cpp: Remote RPC server crashed", "was killed by SIGABRT", "ggml.c:9: GGML_ASSERT(x) failed")
    ('abort', '')
    """
    signal = re.fullmatch(r"the worker was (killed by SIG\w+)", head) if kind == "crash" else None
    if signal:
        return "crash", signal.group(1)
    if died is None or not died.startswith("was killed by "):
        return None
    return ("crash", died.removeprefix("was ")) if "Assertion `" in check else ("abort", "")


def server_refusal(refused: tuple[str, ...]) -> str | None:
    """The command an RPC server refused, as signatures say it (``refused GRAPH_RECOMPUTE``), from
    what it said (``RpcServers.refusals``): ``rpc_server.c``'s "closed the connection after command
    GRAPH_RECOMPUTE" (ggml's server often refuses without a word); where the build's source is not
    on disk to name the command's number, the last server method that logged before the connection
    was closed (b11739's ``[graph_recompute] device: 0, graph with uid 67 not found``, after an
    informational ``[comm_init] device 0 joined pairwise comm``) names it, so that one cause is one
    signature on builds that log and builds that do not. Its words are not part of it (a build
    that logs nothing would sign the same refusal otherwise); the message keeps them. None: no
    server said anything."""
    method = None  # the last server method that logged before the connection was closed (its words: why)
    for line in (r.split(": ", 1)[-1] for r in refused):
        closed = re.match(r"schedfuzz-rpc-server: closed the connection after command (\w+)$", line)
        if closed:
            command = closed.group(1)
            return f"refused {method.upper() if command.isdigit() and method else command}"
        said = re.match(r"\[(\w+)\]", line)
        method = said.group(1) if said else method
    return f"refused {method.upper()}" if method else None


_SITE = re.compile(r"(\S*?)([\w.-]+\.(?:c|cpp|h)):(\d+): ")
# a function definition's first line in ggml's and llama.cpp's style: at column 0, a name and "("
_DEFINITION = re.compile(r"^(?![#/ \t}{])[^;=]*?\b([A-Za-z_]\w*(?:::~?\w+)*)\s*\(")
# a named lambda inside a function (``auto handle_set_rows = [&](...) {``): ggml-backend-meta.cpp
# keeps one per op in one function, so the lambda is the site's finer half
_LAMBDA = re.compile(r"^\s*(?:const\s+)?auto\s+(\w+)\s*=\s*\[")


def check_site(message: str) -> str:
    """Where the check that aborted is: ``file:line, in function`` from the ``file:line:``
    ggml's ``ggml_abort`` prints (the function read from that file at that line, where the
    source is on disk: the build's own path, or the cached source distribution of a built-in
    whose build folder pip has deleted); "" when ggml printed no site."""
    site = _site(message)
    if site is None:
        return ""
    name, line, function, _ = site
    return f"{name}:{line}, in {function}" if function else f"{name}:{line}"


def site_key(message: str) -> str:
    """The check site as a signature keeps it: the function, and which of its checks of the same
    text it is where it has several (``function#2``), so that the fifteen ``GGML_ASSERT(buffer)``
    of ggml-backend.cpp are fifteen sites, while a line that moves between ggml versions (or
    builds) keeps one; "" when ggml printed no site or the source is not on disk (a line number
    alone would make one bug two signatures across builds: the message keeps it) or the check is the
    RPC client's (``RPC_FAILED``: the server's failure is told by how it died). Built-ins' sources
    are in the cache (``schedfuzz device`` fetches them); a user's build has them at its own path.
    """
    site = _site(message)
    if site is None or not site[2] or RPC_FAILED in message:
        return ""
    _, _, function, ordinal = site
    return function if ordinal <= 1 else f"{function}#{ordinal}"


def _site(message: str) -> tuple[str, int, str, int] | None:
    """(file name, line, function, ordinal of the check among the same checks in that function)."""
    m = _SITE.search(message)
    if m is None:
        return None
    folder, name, line = m.group(1), m.group(2), int(m.group(3))
    source = _source_file(folder + name)
    if source is None:
        return name, line, "", 0
    lines = _lines(source)[:line]
    if len(lines) < line:
        return name, line, "", 0
    check = _same(lines[-1])
    inner = ""  # the named lambda the check is in, if any
    for start in range(len(lines) - 1, -1, -1):
        lam = _LAMBDA.match(lines[start])
        if lam and not inner and sum(x.count("{") - x.count("}") for x in lines[start:-1]) > 0:
            # the ordinal counts the lambda's checks only
            inner = lam.group(1)
            ordinal = sum(_same(x) == check for x in lines[start:])
        d = _DEFINITION.match(lines[start])
        if d and d.group(1) not in ("if", "for", "while", "switch", "return", "sizeof"):
            if inner:
                return name, line, f"{d.group(1)}/{inner}", ordinal
            return name, line, d.group(1), sum(_same(x) == check for x in lines[start:])
    return name, line, "", 0


def _same(line: str) -> str:
    """A check's text as a signature keeps it (numbers as N): two checks that differ only in an
    index (``src_ss[1]``, ``src_ss[2]``) are one message, so the ordinal must tell them apart."""
    return re.sub(r"\d+", "N", line.strip())


@lru_cache(maxsize=16)
def _lines(source: Path) -> list[str]:
    """A source file's lines, read once per file (every abort of a run reads the same few)."""
    return source.read_text(errors="replace").splitlines()


def _source_file(path: str) -> Path | None:
    """``path`` if it exists, else the copy a seeds build kept (``builds.seed.kept_source``), else the
    same file in the cached source distribution whose name pip's build folder carries
    (``/tmp/pip-install-*/ggml-python_<hash>/vendor/...``)."""
    if Path(path).is_file():
        return Path(path)
    kept = kept_source(path)
    if kept is not None:
        return kept
    m = re.search(r"/([A-Za-z][\w-]*?)_[0-9a-f]{16,}/(.+)$", path)
    if m is None:
        return None
    for root in sorted((cache_dir() / "src").glob(f"{m.group(1)}-*")):
        if (root / m.group(2)).is_file():
            return root / m.group(2)
    return None
