"""ggml's RPC server as the harness runs it against one ggml build (``process.rpc.ServerProgram``):
``rpc_server.c`` built against that ggml (``build.build_rpc_server``, cached), the environment
that loads it, and the RPC commands as that ggml's own ``ggml-rpc.cpp`` declares them."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..builds.compile import BuildError, ggml_source_for
from ..builds.installed import LibError, base_library, installed_folder
from ..model.versions import BINDING_OWN
from ..process.rpc import RpcServerError
from .bindings import CPU_THREADS
from .build import build_rpc_server
from .lib import child_env


@dataclass(frozen=True)
class RpcProgram:
    """The RPC server of the ggml in ``lib_dir`` (None: the default built-in's)."""

    lib_dir: str | None = None
    threads: int = CPU_THREADS

    def program(self) -> Path:
        try:
            return build_rpc_server(self.lib_dir)
        except BuildError as e:
            raise RpcServerError(f"could not build the ggml RPC server: {e}") from None

    def environment(self) -> Mapping[str, str]:
        return child_env(self.lib_dir)

    def commands(self) -> tuple[str, ...]:
        return rpc_commands(self.lib_dir)


@functools.cache
def rpc_commands(lib_dir: str | None) -> tuple[str, ...]:
    """The RPC commands by number, as the build's own ``ggml-rpc.cpp`` declares them
    (``enum rpc_cmd``: ``GRAPH_COMPUTE`` for ``RPC_CMD_GRAPH_COMPUTE``); empty where the build's
    source is not on disk (a prebuilt release): its commands are then said by number."""
    try:
        folder = Path(lib_dir) if lib_dir else installed_folder(BINDING_OWN)
        text = (ggml_source_for(str(base_library(folder))) / "src" / "ggml-rpc" / "ggml-rpc.cpp").read_text()
    except (BuildError, LibError, OSError):
        return ()
    body = re.search(r"enum rpc_cmd \{(.*?)\};", text, re.DOTALL)
    if body is None:
        return ()
    names = re.findall(r"^\s*RPC_CMD_(\w+)\s*(?:=\s*0\s*)?,", body.group(1), re.MULTILINE)
    return tuple(names)
