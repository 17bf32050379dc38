"""The llama.cpp calls of a workload as the worker makes them (``CALLS[kind].make`` names the
method, ``Calls``, a part of ``llama_worker.Llama``): ``llama_decode`` of the same batches every run,
the memory calls (on the draft context too, llama-server's ``common_memory``), checkpoints,
speculative decoding, sampler chains, LoRA adapters and the context's flags; and each call's
record, sent when it is made.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from ..ggml.schedlog import SchedLog
from ..model.llama_calls import CALLS
from ..model.llama_workload import Call, Part
from ..process.channel import Channel
from .observe import HarnessError
from .placement import Placement
from .speculative import DraftContext, checkpoint, decode_batch, restore


class Calls:
    """How each call is made, and its record. A part of ``llama_worker.Llama``, which sets up its state
    (``run``: per workload)."""

    L: Any  # libllama (declarations.Bindings)
    chan: Channel
    log: SchedLog
    absent_calls: tuple[str, ...]
    draft_context: DraftContext | None  # the workload's draft context (``LlamaWorkload.draft``)
    call: int
    sched_events: list[dict[str, Any]]
    sched_context: dict[int, int]
    errors: list[str]
    placement_lines: list[str]
    placement: Placement
    want_logits: bool
    logits: list[list[float]]
    # per workload (``Llama.run``)
    n_vocab: int
    embeddings: bool
    backend_samplers: bool
    recurrent: bool
    rolled_back: str  # "snapshot", "checkpoint", "positions": how the call being made rolled a sequence back
    checkpoints: dict[int, tuple[Any, int]]
    model_for_loras: Any
    lora_paths: list[str]
    adapters: dict[int, Any]
    in_context: Callable[[int], AbstractContextManager[None]]
    chain: Callable[[str], Any]

    def begin(self, i: int) -> None:
        self.call = i
        self.sched_events = []
        self.chan.send({"begin": i})

    def end(self, i: int, kind: str, rc: int | str, error: list[str] | None = None) -> None:
        errors = self.errors + self.log.errors
        if errors:  # run()'s finally forgets them for the next workload
            raise HarnessError("\n".join(errors))
        for e in self.sched_events:  # the draft context's schedulers' calls say so (a log line's, when it came)
            if "context" not in e and self.sched_context.get(e["sched"], 0):
                e["context"] = self.sched_context[e["sched"]]
        rec: dict[str, Any] = {"index": i, "kind": kind, "rc": rc, "sched": self.sched_events}
        if error:
            rec["error"] = error
        if self.rolled_back:  # how llama.cpp let the call roll a sequence back (``_make_spec``, ``_make_seq_rm``)
            rec["rollback"], self.rolled_back = self.rolled_back, ""
        if self.draft_context is not None and self.draft_context.rolled_back:  # and the draft context
            rec["draft_rollback"], self.draft_context.rolled_back = self.draft_context.rolled_back, ""
        if kind == "init":
            rec["log"] = list(self.placement_lines)
            del self.placement_lines[self.placement.n_model_lines:]
        if self.logits:
            rec["logits"], self.logits = self.logits, []
        self.chan.send({"call": rec})

    def make_call(self, ctx: Any, mem: Any, call: Call) -> int | str:
        """One call (``CALLS[kind].make``); its return code (``llama_decode``'s, or 0/1 for the bool memory calls)."""
        kind = CALLS[call.kind]
        if call.kind in self.absent_calls:  # a corpus case's call this build cannot make (drawn workloads have none)
            return f"this build lacks {', '.join(f for f in kind.functions if not self.L.has(f))}"
        rc = getattr(self, kind.make)(ctx, mem, call)
        if self.draft_context is not None and rc == 0 and kind.draft:
            getattr(self.draft_context, kind.draft)(mem, call)  # llama-server's common_memory: on the draft context too
        return rc

    def token(self, seq: int, pos: int) -> int:
        """The token at ``pos`` of ``seq``: every run of a workload decodes the same ones."""
        return 3 + (seq * 31 + pos * 7) % max(1, self.n_vocab - 3)

    def _make_decode(self, ctx: Any, mem: Any, call: Call) -> int:
        return self._decode(ctx, mem, call.parts)

    def _decode(self, ctx: Any, mem: Any, parts: Sequence[Part]) -> int:
        """``llama_decode`` of ``parts`` (each sequence's next tokens); with a draft context, its
        catch-up on them (``catch_up``)."""
        L = self.L
        items: list[tuple[int, int, int, bool]] = []  # token, position, sequence, output
        for part in parts:
            pos0 = L.llama_memory_seq_pos_max(mem, part.seq) + 1
            items += [(self.token(part.seq, pos0 + t), pos0 + t, part.seq, part.outputs == "all" or (part.outputs == "last" and t == part.n_tokens - 1))
                      for t in range(part.n_tokens)]
        rc = decode_batch(L, ctx, items)
        outputs = [i for i, item in enumerate(items) if item[3]]
        if rc == 0 and self.want_logits and outputs and not self.embeddings and not self.backend_samplers:
            for i in dict.fromkeys((outputs[0], outputs[-1])):
                row = L.llama_get_logits_ith(ctx, i)
                self.logits.append([round(float(row[v]), 5) for v in range(self.n_vocab)])
        decoded = [(tok, pos, seq) for tok, pos, seq, _ in items]
        if rc == 0 and self.draft_context is not None:
            with self.in_context(1):
                rc = self.draft_context.catch_up(decoded)
        return rc

    def _make_spec(self, ctx: Any, mem: Any, call: Call) -> int | str:
        """One speculative step of ``call.seq`` (``speculative.py``): draft, verify, accept, roll back."""
        L, seq, dft = self.L, call.seq, self.draft_context
        pos0 = int(L.llama_memory_seq_pos_max(mem, seq)) + 1
        if dft is not None:
            with self.in_context(1):
                rc = dft.draft(seq, [(self.token(seq, pos0 + i), pos0 + i) for i in range(call.n_draft)])
            if rc:
                return rc
        # a memory that cannot drop its last positions is rolled back from a checkpoint (llama-server's FULL),
        # unless its recurrent state keeps enough snapshots for the drafts (llama-server's RS: draft <= n_rs_seq)
        by_snapshot = self.recurrent and call.n_draft <= self.rs_seq(ctx)
        saved = checkpoint(L, ctx, mem, seq) if self.recurrent and call.accept < call.n_draft and not by_snapshot else None
        rc = self._decode(ctx, mem, (Part(seq, 1 + call.n_draft, "all"),))
        if rc or call.accept == call.n_draft:
            return rc
        keep = pos0 + call.accept + 1
        if L.llama_memory_seq_rm(mem, seq, keep, -1):
            self.rolled_back = "snapshot" if self.recurrent else "positions"
            if dft is None:
                return 0
            with self.in_context(1):
                return dft.rejected(seq, call.accept, keep)
        if saved is None or not restore(L, ctx, mem, seq, *saved):
            return f"the rollback of the rejected drafts failed (llama_memory_seq_rm{', then the checkpoint' if saved else ''})"
        self.rolled_back = "checkpoint"
        if dft is not None and (rc := dft.replayed(seq, pos0)):
            return rc
        return self._decode(ctx, mem, (Part(seq, call.accept + 1, "none"),))  # the accepted tokens again (the draft context mirrors them)

    def rs_seq(self, ctx: Any) -> int:
        """The context's recurrent-state snapshots per sequence, as llama.cpp has it (``llama_n_rs_seq``:
        0 where the architecture does not roll back by them); 0 on a build without the call."""
        return int(self.L.llama_n_rs_seq(ctx)) if self.L.has("llama_n_rs_seq") else 0

    # every call but a decode and a speculative step, on the target (``CALLS[kind].make``)

    def _make_checkpoint(self, ctx: Any, mem: Any, call: Call) -> int:
        self.checkpoints[call.seq] = checkpoint(self.L, ctx, mem, call.seq)
        return int(self.checkpoints[call.seq][0] is None)

    def _make_restore(self, ctx: Any, mem: Any, call: Call) -> int:
        return int(not restore(self.L, ctx, mem, call.seq, *self.checkpoints[call.seq]))

    def _make_seq_rm(self, ctx: Any, mem: Any, call: Call) -> int:
        end = self.L.llama_memory_seq_pos_max(mem, call.seq) + 1
        p0 = 0 if call.n_drop < 0 else max(0, end - call.n_drop)
        done = bool(self.L.llama_memory_seq_rm(mem, call.seq, p0, -1))
        if done and self.recurrent and 0 < p0:  # a recurrent state's last positions dropped: by a snapshot
            self.rolled_back = "snapshot"
        return int(not done)

    def _make_seq_cp(self, ctx: Any, mem: Any, call: Call) -> int:
        self.L.llama_memory_seq_cp(mem, call.seq, call.dst, -1, -1)
        return 0

    def _make_seq_keep(self, ctx: Any, mem: Any, call: Call) -> int:
        self.L.llama_memory_seq_keep(mem, call.seq)
        return 0

    def _make_shift(self, ctx: Any, mem: Any, call: Call) -> int | str:
        L = self.L
        if not L.llama_memory_can_shift(mem):
            return "cannot shift"
        a, b = call.n_keep, call.n_keep + call.n_discard
        if not L.llama_memory_seq_rm(mem, call.seq, a, b):
            return 1
        L.llama_memory_seq_add(mem, call.seq, b, -1, -call.n_discard)
        return 0

    def _make_clear(self, ctx: Any, mem: Any, call: Call) -> int:
        self.L.llama_memory_clear(mem, True)
        return 0

    def _make_set_sampler(self, ctx: Any, mem: Any, call: Call) -> int:
        # llama-server attaches a new chain per request (or none); the old one stays alive until llama_free
        smpl = self.chain(call.chain or "greedy") if call.on else None
        return int(not self.L.llama_set_sampler(ctx, call.seq, smpl))

    def _make_lora_load(self, ctx: Any, mem: Any, call: Call) -> int | str:
        adapter = self.L.llama_adapter_lora_init(self.model_for_loras, self.lora_paths[call.adapter].encode())
        if not adapter:
            return "llama_adapter_lora_init failed: " + " / ".join(list(self.log.tail)[-2:])
        self.adapters[call.adapter] = adapter
        return 0

    def _make_lora_free(self, ctx: Any, mem: Any, call: Call) -> int | str:
        adapter = self.adapters.pop(call.adapter, None)
        if adapter is None:  # its lora_load failed, and that call says why
            return f"adapter {call.adapter} is not loaded: its lora_load failed"
        self.L.llama_adapter_lora_free(adapter)
        return 0

    def _make_lora_set(self, ctx: Any, mem: Any, call: Call) -> int:
        chosen = [self.adapters[i] for i in sorted(self.adapters) if call.adapters >> i & 1]
        arr = (ctypes.c_void_p * max(1, len(chosen)))(*chosen)
        scales = (ctypes.c_float * max(1, len(chosen)))(*([1.0] * len(chosen)))
        return int(self.L.llama_set_adapters_lora(ctx, arr if chosen else None, len(chosen), scales if chosen else None))

    def _make_flag(self, ctx: Any, mem: Any, call: Call) -> int:
        """set_embeddings, set_causal_attn, set_warmup."""
        if call.kind == "set_embeddings":
            self.embeddings = call.on
        getattr(self.L, f"llama_{call.kind}")(ctx, call.on)
        return 0
