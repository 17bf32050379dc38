"""The processes the engines run in, whichever the engine: workers and their protocol
(``worker``, ``channel``), the fork server that starts them (``forkserver``), the RPC servers
(``rpc``), the crash hook that says where a worker died (``crash``) and the bookkeeping that
kills every child with the harness (``children``). ``ggml`` and ``llama`` both use it."""
