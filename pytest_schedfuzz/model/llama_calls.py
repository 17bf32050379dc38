"""The calls a llama.cpp workload makes on its context, one entry per kind (``CALLS``).

An entry is everything the harness knows of a kind: its description, its checks (what llama.cpp
refuses, or llama-server never does), the libllama functions it needs beyond the worker's core
(a build that lacks one cannot make it: the kind is absent from that build's workloads), the
worker's method that makes it, its C for the exported reproducer, what it does to the draft
context (llama-server's ``common_memory``), and how findings treat it: whether it switches the
graph's topology, whether it changes what the devices hold, and the kind a signature names.
Adding a kind is one entry here, the worker's ``_make_<kind>`` method and, to draw it, a line of
the server strategy (``strategies.llama_workloads._Server``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .llama_workload import ContextParams

OUTPUTS = ("last", "all", "none")
# backend sampler chains as llama-server builds them from a request's parameters (each sampler
# here has a backend implementation in 0.3.36: the whole chain runs in the graph)
SAMPLER_CHAINS: dict[str, tuple[str, ...]] = {
    "greedy": ("greedy",),
    "top_k-greedy": ("top_k", "greedy"),
    "top_k-temp-dist": ("top_k", "temp", "dist"),
    "top_p-min_p-temp-dist": ("top_p", "min_p", "temp", "dist"),
}
MAX_DRAFT = 8  # tokens one ``spec`` call drafts (llama-server's --spec-draft-n-max)
MAX_LORAS = 3


@dataclass(frozen=True)
class Part:
    """``n_tokens`` consecutive tokens of sequence ``seq`` in one batch, with outputs for the last
    token, all of them, or none."""

    seq: int
    n_tokens: int
    outputs: str = "last"

    def n_outputs(self) -> int:
        return {"last": 1, "all": self.n_tokens, "none": 0}[self.outputs]


@dataclass(frozen=True)
class Call:
    """One call on the context, of kind ``kind`` (``CALLS`` says what each kind does with the fields)."""

    kind: str
    parts: tuple[Part, ...] = ()  # decode
    seq: int = 0
    dst: int = 0  # seq_cp: the sequence copied to
    n_drop: int = 0  # seq_rm: the last positions dropped (-1: all of them, a slot reused)
    n_keep: int = 0  # shift: the positions kept at the start
    n_discard: int = 0  # shift: the positions discarded after them
    adapter: int = 0  # lora_load, lora_free: the index of the adapter in the workload's ``loras``
    adapters: int = 0  # lora_set: the mask of the adapters attached
    n_draft: int = 0  # spec: the tokens drafted
    accept: int = 0  # spec: the drafts accepted
    on: bool = False  # set_embeddings, set_causal_attn, set_warmup: the value; set_sampler: a chain attached
    chain: str = ""  # set_sampler: SAMPLER_CHAINS key ("": greedy)

    def describe(self) -> str:
        return CALLS[self.kind].describe(self) if self.kind in CALLS else f"llama_{self.kind}({str(self.on).lower()})"

    def n_tokens(self) -> int:
        return sum(p.n_tokens for p in self.parts)

    def n_outputs(self) -> int:
        return sum(p.n_outputs() for p in self.parts)


@dataclass
class Checking:
    """What the calls before the one being checked left (``LlamaWorkload.validate``), and
    ``need(ok, message)``, which raises the workload's error."""

    ctx: ContextParams
    n_loras: int
    model_kind: str
    recurrent: bool  # the model's memory cannot drop its last positions
    tensor: bool  # split mode tensor
    need: Callable[[bool, str], None]
    causal: bool = True
    loaded: set[int] = field(default_factory=set)  # adapters loaded
    attached: int = 0  # mask of the adapters attached
    saved: set[int] = field(default_factory=set)  # sequences with a checkpoint
    rs_seq: int = 0  # the recurrent state's snapshots per sequence (n_rs_seq, where the model rolls back by them)
    pending: set[int] = field(default_factory=set)  # sequences rolled back by a snapshot since their last decode (single use)


def _nothing(call: Call, where: str, state: Checking) -> None:
    """A kind with no checks of its own."""


@dataclass(frozen=True)
class CallKind:
    """One kind of call (see the module's docstring)."""

    describe: Callable[[Call], str]
    c: Callable[[Call], str]  # the reproducer's statement(s); one that returns a status sets rc
    make: str  # the llama worker's method: ``Llama.<make>(ctx, mem, call)`` -> llama.cpp's return code, or why it could not
    functions: tuple[str, ...] = ()
    check: Callable[[Call, str, Checking], None] = _nothing
    draft: str = ""  # what the draft context does after it (``DRAFT_ACTIONS``): llama-server's common_memory
    format1_n: str = ""  # the field that case format 1's one ``n`` held for this kind (``call_from_format1``)
    switch: bool = False  # switches the graph's topology: a lost reservation after it names it
    changes: bool = False  # changes what the devices hold (weights attached, cache contents)
    signed_as: str = ""  # the kind a finding's signature names ("": its own)


@dataclass(frozen=True)
class DraftAction:
    """The draft context's side of a memory call of the target's (llama-server's common_memory):
    the draft context's method of that name makes it (``speculative.DraftContext.<name>``), and
    repro.c's statement ``c`` (formatted with the call ``c`` and ``end``, the end of a shifted
    range) does the same."""

    c: str


DRAFT_ACTIONS: dict[str, DraftAction] = {
    "drop_after": DraftAction("dft_drop_after({c.seq});"),  # the target's positions after the call decide what the draft drops
    "copy": DraftAction("dft_copy({c.seq}, {c.dst});"),
    "keep": DraftAction("dft_keep({c.seq});"),
    "clear": DraftAction("dft_clear();"),
    "shift": DraftAction("dft_shift({c.seq}, {c.n_keep}, {end}, {c.n_discard});"),
    # llama-server's prompt checkpoints hold both contexts: a draft model's recurrent state is saved and set back too
    "save": DraftAction("dft_save({c.seq});"),
    "load": DraftAction("dft_load({c.seq});"),
}


def _check_decode(call: Call, where: str, state: Checking) -> None:
    ctx, need = state.ctx, state.need
    need(bool(call.parts), f"{where}: a batch needs at least one part")
    seqs = [p.seq for p in call.parts]
    need(len(set(seqs)) == len(seqs), f"{where}: a sequence appears twice in one batch")
    for p in call.parts:
        need(0 <= p.seq < ctx.n_seq_max, f"{where}: sequence id {p.seq} >= n_seq_max {ctx.n_seq_max}")
        need(p.n_tokens >= 1 and p.outputs in OUTPUTS, f"{where}: part {p} out of range")
        need(p.n_outputs() <= ctx.outputs_max_per_seq(), f"{where}: {p.n_outputs()} outputs for seq {p.seq} > n_outputs_max_per_seq {ctx.outputs_max_per_seq()}")
    need(call.n_tokens() <= ctx.n_batch, f"{where}: {call.n_tokens()} tokens > n_batch {ctx.n_batch}")
    need(state.causal or call.n_tokens() <= ctx.n_ubatch, f"{where}: {call.n_tokens()} tokens > n_ubatch {ctx.n_ubatch} while causal attention is off")
    need(call.n_outputs() <= ctx.outputs_max(), f"{where}: {call.n_outputs()} outputs > n_outputs_max {ctx.outputs_max()}")
    state.pending -= set(seqs)  # a decode uses the rolled-back state


def _check_spec(call: Call, where: str, state: Checking) -> None:
    ctx, need = state.ctx, state.need
    verify = 1 + call.n_draft  # the last token and the drafts, all with outputs
    need(1 <= call.n_draft <= MAX_DRAFT and 0 <= call.accept <= call.n_draft,
         f"{where}: draft {call.n_draft} must be 1..{MAX_DRAFT}, accept {call.accept} 0..draft")
    need(verify <= ctx.n_batch and verify <= ctx.outputs_max_per_seq() and verify <= ctx.outputs_max(),
         f"{where}: verifying {verify} tokens needs n_batch and n_outputs_max (per seq) >= {verify}")
    need(state.causal or verify <= ctx.n_ubatch, f"{where}: {verify} tokens > n_ubatch {ctx.n_ubatch} while causal attention is off")
    state.pending.discard(call.seq)  # its verification decodes the sequence; its own rollback is its own


def _drops_last_positions(call: Call, n: int, where: str, state: Checking) -> None:
    # llama.cpp cannot drop a recurrent state's last positions (llama_memory_seq_rm returns false), but
    # by a snapshot: at most n_rs_seq of them, once between two decodes of the sequence
    if state.recurrent and state.rs_seq:
        state.need(n <= state.rs_seq and call.seq not in state.pending,
                f"{where}: a recurrent state rolls back by at most n_rs_seq {state.rs_seq} positions, once between two decodes")
        state.pending.add(call.seq)
        return
    state.need(not state.recurrent, f"{where}: a {state.model_kind} model's recurrent state cannot drop its last positions (checkpoint and restore instead)")


def _check_set_sampler(call: Call, where: str, state: Checking) -> None:
    # llama_set_sampler refuses a chain with split mode tensor (returns false: "using CPU")
    state.need(not (state.tensor and call.on), f"{where}: no backend sampler with split mode tensor")


def _check_set_causal_attn(call: Call, where: str, state: Checking) -> None:
    state.causal = call.on


def _check_checkpoint(call: Call, where: str, state: Checking) -> None:
    state.saved.add(call.seq)


def _check_restore(call: Call, where: str, state: Checking) -> None:
    state.need(call.seq in state.saved, f"{where}: no checkpoint of sequence {call.seq} before it")


def _check_lora_load_free(call: Call, where: str, state: Checking) -> None:
    need = state.need
    need(0 <= call.adapter < state.n_loras, f"{where}: adapter {call.adapter}: the workload has {state.n_loras}")
    need((call.adapter in state.loaded) == (call.kind == "lora_free"), f"{where}: adapter {call.adapter} is {'not ' if call.kind == 'lora_free' else ''}loaded")
    # freeing an attached adapter leaves the context a dangling pointer: llama-server never does
    need(call.kind == "lora_load" or not state.attached >> call.adapter & 1, f"{where}: adapter {call.adapter} is attached to the context")
    state.loaded ^= {call.adapter}


def _check_lora_set(call: Call, where: str, state: Checking) -> None:
    state.need(call.adapters >= 0 and all(call.adapters >> i & 1 == 0 or i in state.loaded for i in range(max(call.adapters.bit_length(), 1))),
            f"{where}: attaches adapters that are not loaded (mask {call.adapters}, loaded {sorted(state.loaded)})")
    state.attached = call.adapters


def _flag(name: str) -> CallKind:
    """``llama_<name>(ctx, flag)``: a per-request switch of the context."""
    return CallKind(lambda c: f"llama_{c.kind}({str(c.on).lower()})", lambda c: f"llama_{c.kind}(ctx, {str(c.on).lower()});",
                    "_make_flag", (f"llama_{name}",), check=_check_set_causal_attn if name == "set_causal_attn" else _nothing, switch=True)


def _decode_parts(c: Call) -> str:
    return ", ".join(f"{{{p.seq}, {p.n_tokens}, {({'none': 0, 'last': 1, 'all': 2})[p.outputs]}}}" for p in c.parts)


def _chain_c(c: Call) -> str:
    return "chain_" + (c.chain or "greedy").replace("-", "_") + "()" if c.on else "NULL"


CALLS: dict[str, CallKind] = {
    # llama_decode of ``parts`` (each sequence's next tokens); with a draft context, its catch-up on them
    "decode": CallKind(
        lambda c: "llama_decode([" + ", ".join(f"seq {p.seq}: {p.n_tokens} tok, out {p.outputs}" for p in c.parts) + "])",
        lambda c: f"rc = decode((const struct part[]){{{_decode_parts(c)}}}, {len(c.parts)});", "_make_decode", check=_check_decode),
    # drop the last ``n`` positions of ``seq`` (``n`` = -1: all of it, a slot reused)
    "seq_rm": CallKind(
        lambda c: f"llama_memory_seq_rm(seq {c.seq}, {'all' if c.n_drop < 0 else f'last {c.n_drop}'})",
        lambda c: f"{{ llama_pos end = llama_memory_seq_pos_max(mem, {c.seq}) + 1; "
                  f"rc = !llama_memory_seq_rm(mem, {c.seq}, {'0' if c.n_drop < 0 else f'end > {c.n_drop} ? end - {c.n_drop} : 0'}, -1); }}",
        "_make_seq_rm", check=lambda c, where, state: _drops_last_positions(c, c.n_drop, where, state) if c.n_drop > 0 else None, draft="drop_after",
        format1_n="n_drop", changes=True),
    # copy ``seq`` to ``dst``
    "seq_cp": CallKind(lambda c: f"llama_memory_seq_cp({c.seq} -> {c.dst})", lambda c: f"llama_memory_seq_cp(mem, {c.seq}, {c.dst}, -1, -1);",
                       "_make_seq_cp", ("llama_memory_seq_cp",), draft="copy", changes=True),
    # keep only ``seq``
    "seq_keep": CallKind(lambda c: f"llama_memory_seq_keep({c.seq})", lambda c: f"llama_memory_seq_keep(mem, {c.seq});",
                         "_make_seq_keep", ("llama_memory_seq_keep",), draft="keep", changes=True),
    # context shift of ``seq``: keep ``n_keep``, discard the next ``n`` (seq_rm, then seq_add)
    "shift": CallKind(
        lambda c: f"context shift(seq {c.seq}: keep {c.n_keep}, discard {c.n_discard})",
        lambda c: (f"if (!llama_memory_can_shift(mem)) rc = -1; "
                   f"else if (!llama_memory_seq_rm(mem, {c.seq}, {c.n_keep}, {c.n_keep + c.n_discard})) rc = 1; "
                   f"else llama_memory_seq_add(mem, {c.seq}, {c.n_keep + c.n_discard}, -1, {-c.n_discard});"),
        "_make_shift", ("llama_memory_can_shift", "llama_memory_seq_add"), check=lambda c, where, state: _drops_last_positions(c, c.n_discard, where, state), draft="shift",
        format1_n="n_discard", changes=True),
    "set_embeddings": _flag("set_embeddings"),
    "set_causal_attn": _flag("set_causal_attn"),
    "set_warmup": _flag("set_warmup"),
    # attach (``flag``) a new backend sampler chain ``chain`` to ``seq``, or detach it
    "set_sampler": CallKind(
        lambda c: f"llama_set_sampler(seq {c.seq}, {'chain ' + (c.chain or 'greedy') if c.on else 'none'})",
        lambda c: f"rc = !llama_set_sampler(ctx, {c.seq}, {_chain_c(c)});",
        "_make_set_sampler", ("llama_set_sampler",), check=_check_set_sampler, switch=True, changes=True),
    # llama_memory_clear
    "clear": CallKind(lambda c: "llama_memory_clear()", lambda c: "llama_memory_clear(mem, true);", "_make_clear", ("llama_memory_clear",),
                      draft="clear", changes=True),
    # load or free adapter ``n`` of the workload's ``loras`` on the model
    "lora_load": CallKind(lambda c: f"llama_adapter_lora_init(lora {c.adapter})",
                          lambda c: f"adapters[{c.adapter}] = llama_adapter_lora_init(model, REPRO_DIR \"/lora-{c.adapter}.gguf\"); rc = adapters[{c.adapter}] == NULL;",
                          "_make_lora_load", ("llama_adapter_lora_init", "llama_adapter_lora_free"), check=_check_lora_load_free, format1_n="adapter",
                          changes=True),
    "lora_free": CallKind(lambda c: f"llama_adapter_lora_free(lora {c.adapter})",
                          lambda c: f"llama_adapter_lora_free(adapters[{c.adapter}]); adapters[{c.adapter}] = NULL;",
                          "_make_lora_free", ("llama_adapter_lora_free",), check=_check_lora_load_free, format1_n="adapter", changes=True),
    # attach the loaded adapters whose bits are set in ``n`` (scale 1; 0 detaches all), as llama-server does per request
    "lora_set": CallKind(lambda c: f"llama_set_adapters_lora([{', '.join(f'lora {i}' for i in range(MAX_LORAS) if c.adapters >> i & 1)}])",
                         lambda c: f"rc = set_loras({c.adapters});", "_make_lora_set", ("llama_set_adapters_lora",), check=_check_lora_set,
                         format1_n="adapters", changes=True),
    # save ``seq``'s recurrent state (PARTIAL_ONLY), as llama-server checkpoints before a draft on a recurrent or hybrid model
    "checkpoint": CallKind(lambda c: f"llama_state_seq_get_data_ext(seq {c.seq}, PARTIAL_ONLY)", lambda c: f"rc = checkpoint({c.seq});",
                           "_make_checkpoint", ("llama_state_seq_get_size_ext", "llama_state_seq_get_data_ext"), check=_check_checkpoint,
                           draft="save"),
    # set it back and drop what the attention cache holds after it: a rejected draft rolled back
    "restore": CallKind(
        lambda c: f"llama_state_seq_set_data_ext(seq {c.seq}, PARTIAL_ONLY) + llama_memory_seq_rm(seq {c.seq}, after it)",
        lambda c: f"rc = restore({c.seq});", "_make_restore", ("llama_state_seq_set_data_ext",), check=_check_restore, draft="load"),
    # one speculative step of ``seq`` as llama-server makes it: draft ``n`` tokens (in the draft
    # context, one at a time, where the workload has one; else from n-gram tables, no call), verify
    # the last token and the drafts in one batch with all outputs, accept ``accept`` of them and roll
    # back the rest in every context (seq_rm, or a checkpoint restored where the memory cannot drop
    # its last positions). Signed as the decode it makes: llama.cpp sees only the batches it decodes.
    "spec": CallKind(lambda c: f"speculative step(seq {c.seq}: draft {c.n_draft}, verify {1 + c.n_draft}, accept {c.accept})",
                     lambda c: f"rc = spec({c.seq}, {c.n_draft}, {c.accept});", "_make_spec", ("llama_memory_seq_rm",), check=_check_spec,
                     format1_n="n_draft",
                     changes=True, signed_as="decode"),
}
CALL_KINDS = tuple(CALLS)
if not {k.draft for k in CALLS.values()} - {""} <= set(DRAFT_ACTIONS):
    raise ImportError(f"draft actions of no DRAFT_ACTIONS entry: {sorted({k.draft for k in CALLS.values()} - {''} - set(DRAFT_ACTIONS))}")
SWITCHES = tuple(k for k, v in CALLS.items() if v.switch)  # calls that switch the graph's topology
CHANGES = tuple(k for k, v in CALLS.items() if v.changes)  # calls that change what the devices hold


def check_calls(calls: tuple[Call, ...], state: Checking) -> None:
    """Each call's checks, in order (``state`` carries what the calls before it left)."""
    ctx, need = state.ctx, state.need
    for i, call in enumerate(calls):
        where = f"calls[{i}] ({call.kind})"
        need(call.kind in CALLS, f"{where}: unknown call kind; one of {', '.join(CALL_KINDS)}")
        need(0 <= call.seq < ctx.n_seq_max and 0 <= call.dst < ctx.n_seq_max, f"{where}: sequence id >= n_seq_max {ctx.n_seq_max}")
        counts = {"n_drop": call.n_drop + 1, "n_keep": call.n_keep, "n_discard": call.n_discard, "adapter": call.adapter, "n_draft": call.n_draft}
        need(min(counts.values()) >= 0, f"{where}: {', '.join(f'{k} {getattr(call, k)}' for k, v in counts.items() if v < 0)} out of range")
        need(not call.chain or call.chain in SAMPLER_CHAINS, f"{where}: chain {call.chain!r}: one of {', '.join(SAMPLER_CHAINS)}")
        CALLS[call.kind].check(call, where, state)


def call_from_format1(d: Mapping[str, Any]) -> dict[str, Any]:
    """A call as case format 1 wrote it, in today's fields: its one ``n`` meant what the kind's
    ``format1_n`` names, and its ``flag`` is ``on``.

    >>> call_from_format1({"kind": "lora_set", "n": 3})
    {'kind': 'lora_set', 'adapters': 3}
    >>> call_from_format1({"kind": "set_warmup", "flag": True})
    {'kind': 'set_warmup', 'on': True}
    """
    out = {k: v for k, v in d.items() if k not in ("n", "flag")}
    if "flag" in d:
        out["on"] = d["flag"]
    if "n" in d:
        field_ = CALLS[d["kind"]].format1_n if d.get("kind") in CALLS else ""
        if not field_:
            raise ValueError(f"a {d.get('kind')!r} call has no field n")
        out[field_] = d["n"]
    return out


def signed_kind(kind: str) -> str:
    """The kind a finding's signature names for a call of ``kind``."""
    return CALLS[kind].signed_as or kind if kind in CALLS else kind

