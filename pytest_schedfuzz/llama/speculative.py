"""llama-server's speculative decoding, as the llama.cpp worker makes it (``--spec-type``).

A workload with ``draft`` "mtp" has a second context on the same model, of type MTP
(``LLAMA_CONTEXT_TYPE_MTP``, ``ctx_other`` the target), which runs the model's NextN layer
(``common/speculative.cpp``'s draft-mtp):

* the target outputs, for every token it decodes, the hidden state the NextN layer reads
  (``llama_set_embeddings_nextn(target, true, false)``);
* after each target batch the MTP context *catches up*: the same tokens at the same positions,
  token k paired with the target's hidden state of token k-1 (the first with the last state of
  the batch before), no outputs;
* a ``spec`` call drafts ``n`` tokens in the MTP context, one ``llama_process`` each (the first
  with the last accepted state, each next with the MTP context's own state), drops the drafted
  positions from it, verifies the last token and the drafts in the target (all outputs; the
  MTP context catches up on them), accepts ``accept`` and drops the rest from both contexts;
* every memory call on the target (``seq_rm``, ``seq_cp``, ``seq_keep``, a context shift,
  ``clear``) is made on the MTP context too, as llama-server's ``common_memory`` does.

Without a draft context a ``spec`` call drafts as ngram-mod does (token tables, no llama.cpp
call): the target verifies and rolls back alone. A target whose memory cannot drop its last
positions (a recurrent model) is rolled back as llama-server does it there: a checkpoint
(``PARTIAL_ONLY``) before the verification, restored, then the accepted tokens decoded again.

The NextN functions are declared in llama.cpp's ``src/llama-ext.h``, C++ without ``extern "C"``:
no header a build ships, nor a binding's declarations, has them. Both builds export them under
their mangled names, which encode their parameter types (``NEXTN_FUNCTIONS``); a build that
exports none of them, or lacks a function of ``BATCH_EXT``, has no "mtp" draft (it is absent
from its workloads, as a call kind it lacks).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

# llama-ext.h: name -> (the exported mangled name, its parameter types (from the mangling), its result)
NEXTN_FUNCTIONS: dict[str, tuple[str, list[Any], Any]] = {
    "llama_set_embeddings_nextn": ("_Z26llama_set_embeddings_nextnP13llama_contextbb", [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None),
    "llama_get_embeddings_nextn_ith": ("_Z30llama_get_embeddings_nextn_ithP13llama_contexti", [ctypes.c_void_p, ctypes.c_int32],
                                       ctypes.POINTER(ctypes.c_float)),
}
# llama.h: the extended batch an MTP context decodes (a token with a hidden state)
BATCH_EXT = ("llama_batch_ext_init", "llama_batch_ext_free", "llama_batch_ext_add_token", "llama_batch_ext_set_pos",
             "llama_batch_ext_set_embd_state", "llama_batch_ext_set_embd_token", "llama_batch_ext_set_output_logits", "llama_process",
             "llama_model_n_embd_out")
CONTEXT_TYPE_MTP = 1  # enum llama_context_type
PROCESS_DECODE = 1  # enum llama_process_type


def nextn_functions(lib_path: str) -> dict[str, Any] | None:
    """The NextN functions of the libllama at ``lib_path``, typed; None where it exports any not."""
    lib = ctypes.CDLL(lib_path)
    out = {}
    for name, (mangled, args, res) in NEXTN_FUNCTIONS.items():
        fn = getattr(lib, mangled, None)
        if fn is None:
            return None
        fn.argtypes, fn.restype = args, res
        out[name] = fn
    return out


class MtpDraft:
    """The MTP context beside a target, and the hidden states it is given (``pending``: per
    sequence, the state its next token is paired with; ``verified``: the states of the
    target's last batch of that sequence, for a speculative step's accepted token)."""

    def __init__(self, L: Any, nextn: dict[str, Any], model: Any, target: Any, context: Callable[[Any], Any]) -> None:
        """``context(params)`` makes the context (the worker's ``llama_init_from_model``, which
        tells the scheduler hook whose schedulers it makes); None where llama.cpp refused it."""
        self.L, self.nextn, self.target = L, nextn, target
        self.n_embd = int(L.llama_model_n_embd_out(model))
        self.pending: dict[int, list[float]] = {}
        self.verified: dict[int, list[list[float]]] = {}
        self.state_fn = ""  # which llama_batch_ext setter this build takes a state with (found at the first draft)
        nextn["llama_set_embeddings_nextn"](target, True, False)
        self.ctx = context(target)
        if self.ctx:
            nextn["llama_set_embeddings_nextn"](self.ctx, True, True)
            self.mem = L.llama_get_memory(self.ctx)

    def row(self, ctx: Any, i: int) -> list[float]:
        """The NextN hidden state of output ``i`` of ``ctx``'s last batch."""
        p = self.nextn["llama_get_embeddings_nextn_ith"](ctx, i)
        return p[: self.n_embd] if p else [0.0] * self.n_embd

    def process(self, items: Sequence[tuple[int, int, int, list[float], bool]]) -> int:
        """One ``llama_process`` of the MTP context: (token, position, sequence, hidden state,
        output) each. The state goes in with ``set_embd_state`` (b11739), or where the build
        refuses that, ``set_embd_token`` (0.3.36): as each build's llama-server does."""
        L = self.L
        b = L.llama_batch_ext_init(self.ctx)
        keep: list[Any] = []
        try:
            for tok, pos, seq, h, out in items:
                i = L.llama_batch_ext_add_token(b, seq, tok)
                if i < 0:
                    return int(i)
                pp = (ctypes.c_int32 * 4)(pos, pos, pos, pos)
                data = (ctypes.c_float * self.n_embd)(*h)
                keep += [pp, data]
                L.llama_batch_ext_set_pos(b, i, pp)
                embd = L.llama_embd(ctypes.cast(data, ctypes.POINTER(ctypes.c_float)), 1, self.n_embd)
                for fn in ([self.state_fn] if self.state_fn else ["llama_batch_ext_set_embd_state", "llama_batch_ext_set_embd_token"]):
                    if getattr(L, fn)(b, i, embd):
                        self.state_fn = fn
                        break
                else:
                    raise RuntimeError("llama_batch_ext_set_embd_state and _set_embd_token both refused a hidden state of "
                                       f"{self.n_embd} floats for the MTP context")
                if out:
                    L.llama_batch_ext_set_output_logits(b, i, True)
            rc = int(L.llama_process(self.ctx, PROCESS_DECODE, b))
            L.llama_synchronize(self.ctx)
            return rc
        finally:
            L.llama_batch_ext_free(b)

    def catch_up(self, batch: Sequence[tuple[int, int, int]]) -> int:
        """After the target decoded ``batch`` (token, position, sequence each, in batch order):
        the same tokens in the MTP context, each paired with its sequence's previous state."""
        items = []
        rows: dict[int, list[list[float]]] = {}
        for j, (tok, pos, seq) in enumerate(batch):
            items.append((tok, pos, seq, self.pending.get(seq, [0.0] * self.n_embd), False))
            rows.setdefault(seq, []).append(self.row(self.target, j))
            self.pending[seq] = rows[seq][-1]
        self.verified.update(rows)
        return self.process(items) if items else 0

    def draft(self, seq: int, tokens: Sequence[tuple[int, int]]) -> int | str:
        """Draft: ``tokens`` (token, position) decoded one at a time, the first with the
        sequence's pending state, each next with the state the MTP context gave its token before;
        then the drafted positions dropped from the MTP context."""
        kept = int(self.L.llama_memory_seq_pos_max(self.mem, seq))
        h = self.pending.get(seq, [0.0] * self.n_embd)
        for tok, pos in tokens:
            rc = self.process([(tok, pos, seq, h, True)])
            if rc:
                return rc
            h = self.row(self.ctx, 0)
        if not self.L.llama_memory_seq_rm(self.mem, seq, kept + 1, -1):
            return "the MTP context refused to drop its drafted positions (llama_memory_seq_rm)"
        return 0

    def accept(self, seq: int, k: int) -> None:
        """The state after the ``k``-th accepted draft becomes the sequence's pending state."""
        rows = self.verified.get(seq, [])
        if k < len(rows):
            self.pending[seq] = rows[k]

    def copy(self, seq: int, dst: int) -> None:
        if seq in self.pending:
            self.pending[dst] = self.pending[seq]

    def free(self) -> None:
        if self.ctx:
            self.L.llama_free(self.ctx)
            self.ctx = None
