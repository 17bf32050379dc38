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

A workload with ``draft`` "model" (draft-simple, ``-md``) has a plain context on a draft model of
its own (the target's file loaded again, ``DraftModel``), with ``n_rs_seq`` of its own
(llama-server gives it none: ``common_speculative_init_result``):

* after each target batch the draft context decodes the same tokens (draft-simple's
  ``process``, the last one an output);
* a ``spec`` call decodes the last token and the drafts in it one at a time, then drops them
  again; the target verifies, and the rejected positions go from both contexts;
* each context rolls back as llama-server's ``common_context_can_seq_rm`` finds it can: by
  ``llama_memory_seq_rm`` (an attention cache's positions, or a recurrent state's snapshots),
  else from a checkpoint (``PARTIAL_ONLY``) taken before the drafts and restored, the accepted
  tokens decoded again (the server's replay: the target's, which the draft context mirrors, or
  the draft context's alone where the target dropped its own by ``seq_rm``).

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

from ..model.llama_workload import Call

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
STATE_PARTIAL_ONLY = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: a hybrid model's recurrent part only, as llama-server checkpoints


def decode_batch(L: Any, ctx: Any, items: Sequence[tuple[int, int, int, bool]]) -> int:
    """One ``llama_decode`` of ``ctx``: (token, position, sequence, output) each, then
    ``llama_synchronize`` (RPC computes asynchronously: a crash must surface in this call)."""
    batch = L.llama_batch_init(len(items), 0, 1)
    try:
        for j, (tok, pos, seq, out) in enumerate(items):
            batch.token[j], batch.pos[j], batch.n_seq_id[j], batch.logits[j] = tok, pos, 1, out
            batch.seq_id[j][0] = seq
        batch.n_tokens = len(items)
        rc = int(L.llama_decode(ctx, batch))
        L.llama_synchronize(ctx)
        return rc
    finally:
        L.llama_batch_free(batch)


def checkpoint(L: Any, ctx: Any, mem: Any, seq: int) -> tuple[Any, int]:
    """``seq``'s state as llama-server checkpoints it (``PARTIAL_ONLY``), and its last position."""
    size = L.llama_state_seq_get_size_ext(ctx, seq, STATE_PARTIAL_ONLY)
    buf = (ctypes.c_uint8 * size)()
    got = L.llama_state_seq_get_data_ext(ctx, buf, size, seq, STATE_PARTIAL_ONLY)
    return (buf if got == size else None), int(L.llama_memory_seq_pos_max(mem, seq))


def restore(L: Any, ctx: Any, mem: Any, seq: int, buf: Any, pos: int) -> bool:
    """A checkpoint set back, and what the attention cache holds after it dropped."""
    return buf is not None and bool(L.llama_state_seq_set_data_ext(ctx, buf, len(buf), seq, STATE_PARTIAL_ONLY)) \
        and bool(L.llama_memory_seq_rm(mem, seq, pos + 1, -1))


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


class DraftContext:
    """What every draft context has: its context and memory, how the call being made rolled it
    back (``rolled_back``), and its side of each memory call the target makes (llama-server's
    ``common_memory``): one method per ``DRAFT_ACTIONS`` entry, named for it, given the target's
    memory and the call."""

    L: Any
    ctx: Any
    mem: Any
    recurrent: bool  # a recurrent state: its last positions go by a snapshot
    rolled_back: str

    def drop_after(self, target: Any, call: Call) -> None:
        """The target's positions after the call decide what the draft context drops."""
        end = int(self.L.llama_memory_seq_pos_max(target, call.seq)) + 1
        held = int(self.L.llama_memory_seq_pos_max(self.mem, call.seq)) >= end  # positions to drop: not a no-op
        if self.L.llama_memory_seq_rm(self.mem, call.seq, end, -1) and self.recurrent and end > 0 and held:
            self.rolled_back = "snapshot"

    def shift(self, target: Any, call: Call) -> None:
        self.L.llama_memory_seq_rm(self.mem, call.seq, call.n_keep, call.n_keep + call.n_discard)
        self.L.llama_memory_seq_add(self.mem, call.seq, call.n_keep + call.n_discard, -1, -call.n_discard)

    def copy(self, target: Any, call: Call) -> None:
        self.L.llama_memory_seq_cp(self.mem, call.seq, call.dst, -1, -1)

    def keep(self, target: Any, call: Call) -> None:
        self.L.llama_memory_seq_keep(self.mem, call.seq)

    def clear(self, target: Any, call: Call) -> None:
        self.L.llama_memory_clear(self.mem, True)

    def save(self, target: Any, call: Call) -> None:
        """A prompt checkpoint of the target's: the draft context's state beside it, where it has one to keep."""

    def load(self, target: Any, call: Call) -> None:
        """The target restored its checkpoint: what follows its last position goes here too."""
        self.drop_after(target, call)

    def free(self) -> None:
        if self.ctx:
            self.L.llama_free(self.ctx)
            self.ctx = None


class MtpDraft(DraftContext):
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
        self.rolled_back = ""  # how the call being made rolled this context back: "positions" (its memory is attention alone)
        self.recurrent = False
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
        self.rolled_back = "positions"
        return 0

    def rejected(self, seq: int, k: int, keep: int) -> int | str:
        """After the target accepted ``k`` drafts: the state after the last accepted one
        becomes the sequence's pending state, and the positions from ``keep`` on are dropped."""
        rows = self.verified.get(seq, [])
        if k < len(rows):
            self.pending[seq] = rows[k]
        self.L.llama_memory_seq_rm(self.mem, seq, keep, -1)
        self.rolled_back = "positions"
        return 0

    def replayed(self, seq: int, pos0: int) -> int | str:
        """The target restored its checkpoint and decodes the accepted tokens again: the verified
        positions go (an MTP model is never recurrent here: the target never replays)."""
        self.L.llama_memory_seq_rm(self.mem, seq, pos0, -1)
        return 0

    def copy(self, target: Any, call: Call) -> None:
        super().copy(target, call)
        if call.seq in self.pending:
            self.pending[call.dst] = self.pending[call.seq]

    def clear(self, target: Any, call: Call) -> None:
        """No sequence has a state to pair its next token with any more."""
        super().clear(target, call)
        self.pending.clear()


class ModelDraft(DraftContext):
    """draft-simple's context on a draft model of its own, and how it rolls a step back: by
    ``seq_rm`` where its memory can drop 1 + ``n`` positions (an attention cache, or a recurrent
    state with as many snapshots), else from the checkpoint taken before the drafts (llama-server's
    ``spec_ckpt`` of the draft context). ``rolled_back`` says how, per call."""

    def __init__(self, L: Any, context: Callable[[], Any], recurrent: bool, token: Callable[[int, int], int]) -> None:
        """``context()`` makes the context (None where llama.cpp refused it); ``token(seq, pos)``
        is the token the workload has there."""
        self.L, self.recurrent, self.token = L, recurrent, token
        self.ctx = context()
        self.mem = L.llama_get_memory(self.ctx) if self.ctx else None
        self.n_rs_seq = int(L.llama_n_rs_seq(self.ctx)) if self.ctx and L.has("llama_n_rs_seq") else 0
        self.step: dict[int, tuple[Any, int]] = {}  # seq -> its checkpoint for the speculative step being made
        self.checkpoints: dict[int, tuple[Any, int]] = {}  # seq -> its checkpoint beside the target's (a ``checkpoint`` call)
        self.rolled_back = ""

    def decode(self, items: Sequence[tuple[int, int, int, bool]]) -> int:
        return decode_batch(self.L, self.ctx, items)

    def catch_up(self, batch: Sequence[tuple[int, int, int]]) -> int:
        """The target's batch (token, position, sequence each) decoded again, the last an output."""
        return self.decode([(tok, pos, seq, j == len(batch) - 1) for j, (tok, pos, seq) in enumerate(batch)]) if batch else 0

    def _drop(self, seq: int, p0: int) -> bool:
        """``seq``'s positions from ``p0`` on dropped by ``seq_rm``, or the step's checkpoint restored."""
        if seq in self.step:
            self.rolled_back = "checkpoint"
            return restore(self.L, self.ctx, self.mem, seq, *self.step[seq])
        self.rolled_back = "snapshot" if self.recurrent else "positions"
        return bool(self.L.llama_memory_seq_rm(self.mem, seq, p0, -1))

    def draft(self, seq: int, tokens: Sequence[tuple[int, int]]) -> int | str:
        """The last token and the drafts (``tokens``: token, position) decoded one at a time,
        then dropped again, also where one of them fails (a full cache: those decoded before it
        would leave this context ahead of the target); a checkpoint first where ``seq_rm`` cannot
        drop 1 + n positions."""
        self.step.pop(seq, None)
        if self.recurrent and len(tokens) + 1 > self.n_rs_seq:
            self.step[seq] = checkpoint(self.L, self.ctx, self.mem, seq)
            if self.step[seq][0] is None:
                return "the draft context's checkpoint failed (llama_state_seq_get_data_ext)"
        rc: int | str = 0
        for tok, pos in tokens:
            if (rc := self.decode([(tok, pos, seq, True)])):
                break
        if not self._drop(seq, tokens[0][1]):
            return f"the draft context could not drop its drafts ({'its checkpoint' if seq in self.step else 'llama_memory_seq_rm'})"
        return rc

    def rejected(self, seq: int, k: int, keep: int) -> int | str:
        """The target dropped its rejected drafts by ``seq_rm`` from ``keep``: the same here, or
        the step's checkpoint restored and the accepted tokens decoded again in this context alone."""
        restored = seq in self.step
        if not self._drop(seq, keep):
            return f"the draft context could not drop the rejected drafts ({'its checkpoint' if restored else 'llama_memory_seq_rm'})"
        if not restored:
            return 0
        pos = int(self.L.llama_memory_seq_pos_max(self.mem, seq)) + 1
        return self.decode([(self.token(seq, p), p, seq, p == keep - 1) for p in range(pos, keep)])

    def replayed(self, seq: int, pos0: int) -> int | str:
        """The target restored its checkpoint and decodes the accepted tokens again, which this
        context mirrors: first its own positions from ``pos0`` dropped (or its checkpoint restored)."""
        return 0 if self._drop(seq, pos0) else "the draft context could not drop the verified drafts before the replay"

    def save(self, target: Any, call: Call) -> None:
        """llama-server's prompt checkpoint holds both contexts (``PARTIAL_ONLY``)."""
        self.checkpoints[call.seq] = checkpoint(self.L, self.ctx, self.mem, call.seq)

    def load(self, target: Any, call: Call) -> None:
        if call.seq in self.checkpoints:
            restore(self.L, self.ctx, self.mem, call.seq, *self.checkpoints[call.seq])
        else:
            self.drop_after(target, call)

    def clear(self, target: Any, call: Call) -> None:
        super().clear(target, call)
        self.step.clear()
