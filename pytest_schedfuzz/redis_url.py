"""Where a shared campaign's Redis is (``--schedfuzz-db``): its URL parsed and printed without
its password. Below the options and profiles that check it at the start, and the campaign
(``campaign.shared``) that connects to it."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

OPTION = "--schedfuzz-db"
PASSWORD_ENV = "SCHEDFUZZ_DB_PASSWORD"  # AUTH's password where the URL has none (a CI secret)


class SharedError(ValueError):
    """A ``--schedfuzz-db`` that cannot be used at the start (a usage error, naming the option)."""


@dataclass(frozen=True)
class RedisUrl:
    """Where the campaign's Redis is: ``redis://`` or ``rediss://`` (TLS), a user and password
    (AUTH: from the URL, else the password from ``PASSWORD_ENV``), host, port, database. The
    password is never printed: ``str`` leaves it out."""

    host: str
    port: int
    db: int
    tls: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def __str__(self) -> str:
        user = f"{self.username}@" if self.username else ""
        return f"{'rediss' if self.tls else 'redis'}://{user}{self.host}:{self.port}/{self.db}"

    @classmethod
    def parse(cls, text: str) -> RedisUrl:
        """``redis[s]://[USER[:PASSWORD]@]HOST:PORT/N`` (port 6379 and database 0 where left out);
        a ``SharedError`` naming the option, and the URL without its password, for anything else."""
        usage = f"{OPTION} {redacted(text)!r}: write it redis://HOST:PORT/N (rediss:// for TLS; USER:PASSWORD@ before the host for AUTH)"
        try:
            url = urlsplit(text)
            port = url.port or 6379
        except ValueError as e:  # a port that is not a number, or out of range
            raise SharedError(f"{usage} ({redacted(str(e))})") from None
        if url.scheme not in ("redis", "rediss") or not url.hostname:
            raise SharedError(f"{usage} (a redis:// or rediss:// URL with a host)")
        path = url.path.strip("/") or "0"
        if not path.isdigit() or url.query or url.fragment:
            raise SharedError(f"{usage} (the database N is a number, nothing after it)")
        password = unquote(url.password) if url.password else os.environ.get(PASSWORD_ENV) or None
        return cls(url.hostname, port, int(path), url.scheme == "rediss", unquote(url.username) if url.username else None, password)


def redacted(text: str) -> str:
    """A Redis URL as it may be printed: its password replaced by ``***``."""
    return re.sub(r"^(rediss?://[^:@/]*:)[^@/]*@", r"\1***@", text)
