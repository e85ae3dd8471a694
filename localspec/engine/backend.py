"""Contexts on llama.cpp (through llama-cpp-python's C bindings), and decoding.

Model (model.py) owns weights and vocabulary; Context owns one KV cache and is one sequence of it (a context made
for several sequences hands out the others as views: Context.sequence). Logits come back as numpy
views on llama.cpp's own buffer: valid until the next decode on that context, never copied; what a
row becomes through the context's sampler chain is chain.ChainRows'; taking the cache back is
rollback.Rollback's; a draft tree's rows are tree.TreeDecoding's; decoding beside hidden states (a drafter's
context) is hidden.HiddenDecoding's, and a prompt's images vision.MediaDecoding's.
"""

import copy
import ctypes
import os
from collections.abc import Sequence
from time import perf_counter
from typing import NamedTuple

import numpy as np

from ..config import ROPE_SCALING, Rope
from ..errors import EngineError, UsageError
from .chain import ChainRows
from .hidden import HiddenDecoding, HiddenStates
from .library import llama, nextn
from .model import Model
from .rollback import Rollback
from .tree import DraftTree, TreeDecoding
from .vision import MediaDecoding, image_start

# LOCALSPEC_DEBUG=1 also checks after every step that each KV cache holds exactly the tokens we
# think it does (a rollback that drifted would silently corrupt every later token).
CHECK_CACHES = bool(os.environ.get("LOCALSPEC_DEBUG"))


def _flash_attention(on: bool | None) -> int:
    return {None: llama.LLAMA_FLASH_ATTN_TYPE_AUTO, True: llama.LLAMA_FLASH_ATTN_TYPE_ENABLED,
            False: llama.LLAMA_FLASH_ATTN_TYPE_DISABLED}[on]


def _scale_rope(params, rope: Rope) -> None:
    """llama.cpp's context parameters for RoPE's scaling, each left at 'the model's' where not given."""
    if rope.scaling is not None:
        params.rope_scaling_type = ROPE_SCALING[rope.scaling]
    for field, value in (("rope_freq_base", rope.freq_base), ("rope_freq_scale", rope.freq_scale),
                         ("yarn_orig_ctx", rope.yarn_orig_ctx), ("yarn_ext_factor", rope.yarn_ext_factor),
                         ("yarn_attn_factor", rope.yarn_attn_factor), ("yarn_beta_slow", rope.yarn_beta_slow),
                         ("yarn_beta_fast", rope.yarn_beta_fast)):
        if value is not None:
            setattr(params, field, value)


class Context(ChainRows, TreeDecoding, Rollback, HiddenDecoding, MediaDecoding):
    """A sequence of a KV cache, positions 0..n-1 (`tokens` is what it holds): the cache's only one, or
    the first of n_seq, whose others sequence() hands out.

    backend_sampling: run the sampler chain inside the decode graph, for up to max_outputs rows a
    batch (a verification batch), so that full logit rows are not kept at all: every chain (True),
    none (False), or an argmax chain only (None): a greedy row then hands back one token instead of
    a vocabulary of logits for Python to scan, which costs less host time even where the graph runs
    on the CPU, while a sampling chain's top-k is faster on the host there."""

    def __init__(self, model: Model, n_ctx: int, n_batch: int, threads: int, backend_sampling: bool | None = False,
                 max_outputs: int = 1, mtp: bool = False, keep_hidden: tuple[int, ...] = (),
                 flash_attn: bool | None = None, beside: "Context | None" = None, n_seq: int = 1,
                 branches: int = 0, cache_types: tuple[int, int] = (1, 1), rope: Rope = Rope(),
                 kv_offload: bool = True, cache_reuse: int = 0):
        """mtp: a context of the model's MTP block, which decodes each token together with a hidden
        state (decode's `hidden`); keep_hidden: keep, for every decoded position, the inputs of these
        layers (LAST_HIDDEN: the last hidden state) side by side (hidden.row), as the target of MTP
        or EAGLE-3 drafting. beside: the target context whose weights a drafter model borrows (an EAGLE-3
        drafter its token embeddings and output layer; llama.cpp's ctx_other): such a context, like an
        MTP one, decodes each token with a hidden state. flash_attn: llama.cpp's flash attention on,
        off, or (None) wherever the device supports it. n_seq: sequences sharing the cache (this context is
        the first; sequence() hands out the others), each holding up to n_ctx tokens of a cache of
        n_seq * n_ctx cells (one pool: a short sequence leaves room to none but itself). branches: room for
        a draft tree of up to this many branches for each sequence (decode_tree, decode_together), each
        branch a sequence id of its own in one pool of cells (no recurrent state), with a sampler chain of its
        own where rows are sampled on the backend; fewer where llama.cpp's sequence ids run out. cache_types:
        ggml's types of the K and V caches (config.KV_CACHE_TYPES; f16's by default). rope: RoPE's scaling where it
        is not the model's own. kv_offload: the KV cache (and attention) beside offloaded layers on their device,
        else in RAM (llama.cpp's -nkvo). cache_reuse: the shortest run of cached tokens that a prompt's reading
        shifts into place past a change, rather than reading it again (llama-server's --cache-reuse; 0: none)."""
        if n_seq > 1 and backend_sampling is not False:
            raise UsageError("parallel sequences share a context only where rows are sampled on the host")
        if branches and model.recurrent:
            raise UsageError("draft trees need a context without a recurrent state")
        # every sequence's branches have ids of their own, as all of them may verify a tree in one batch; llama.cpp
        # takes as many sequence ids as it has (256) and output rows for a batch (n_batch) at most
        branches = min(branches, (min(llama.llama_max_parallel_sequences(), n_batch) - n_seq) // n_seq)
        self.model = model
        params = llama.llama_context_default_params()
        params.flash_attn_type = _flash_attention(flash_attn)
        params.type_k, params.type_v = cache_types
        params.offload_kqv = kv_offload
        _scale_rope(params, rope)
        params.ctx_type = llama.LLAMA_CONTEXT_TYPE_MTP if mtp else llama.LLAMA_CONTEXT_TYPE_DEFAULT
        # a tree's nodes take cells of their own until one path is kept: room for a batch of them
        extra = n_batch if branches else 0
        params.n_ctx = n_ctx * n_seq + extra
        params.n_seq_max = n_seq * (1 + branches)
        # One pool of cells for the KV caches of several sequences, so that a step's rows of all of them
        # go in one ubatch; but not beside a recurrent state, whose snapshots (what a rejected draft is
        # taken back to) llama.cpp does not move along when a pooled batch moves a sequence's cell.
        params.kv_unified = (n_seq > 1 or branches > 0) and not model.recurrent
        params.n_batch = params.n_ubatch = n_batch
        params.n_threads = params.n_threads_batch = threads
        params.n_outputs_max_per_seq = max(1, min(max_outputs, n_batch))
        if beside is not None:
            params.ctx_other = beside._ctx
        if model.recurrent and not mtp:  # (an MTP context holds the MTP block's KV cache only)
            # Snapshots of the recurrent state for each token of a verification but its first, so a
            # rejected draft's tokens can be taken back (llama.cpp sets it to 0 where it cannot). A
            # ubatch must hold more than n_rs_seq + 1 tokens, or every decode aborts the process.
            params.n_rs_seq = max(0, min(max_outputs - 1, min(n_batch, n_ctx) - 2))
        self._ctx = llama.llama_init_from_model(model.handle, params)
        if not self._ctx:
            raise EngineError(
                f"llama.cpp could not create a context of {n_ctx} tokens for {model.path.name}"
                " (out of memory? try a smaller --ctx-size)"
            )
        self.n_ctx = (llama.llama_n_ctx(self._ctx) - extra) // n_seq
        self.branch_room, self._first_branch = branches, n_seq
        self.n_seq, self.seq = n_seq, 0
        self._views: list[Context] = []  # the other sequences, handed out by sequence()
        # this sequence's first and last rows in the last batch (decode_together puts several in one; -1:
        # the batch's last, where it was this sequence's alone)
        self._row_base, self._row_last = 0, -1
        self.root = self  # the first sequence, whose context the others share
        # the rows the other sequences had in the last batch this one shared, and how many of them verified
        self.others, self.alongside = 0, 0
        # llama.cpp lowers n_batch to a small requested context; larger batches would abort it.
        self.n_batch = llama.llama_n_batch(self._ctx)
        # with several sequences, a prompt is read in pieces of this many tokens, one a step beside the
        # others' rows, so that a long prompt holds up their tokens a piece at a time
        self.prompt_piece = max(1, self.n_batch // 4)
        # Tokens at the end of the last decode that truncate() may take back: any number for a KV
        # cache; for a recurrent state, as many as llama.cpp keeps snapshots for, once after each decode.
        self.recurrent = model.recurrent and not mtp
        self.rollback = llama.llama_n_rs_seq(self._ctx) if self.recurrent else n_ctx
        self.mtp = mtp
        # An MTP block or EAGLE-3 drafter reads a hidden state with each token and hands back its own, for
        # output rows only. A DFlash drafter reads the target's hidden states in place of tokens at the
        # positions the target holds, and the block it drafts as a whole, without a causal mask.
        self.reads_hidden = mtp or model.architecture == "eagle3"
        if self.reads_hidden:
            nextn().llama_set_embeddings_nextn(self._ctx, True, True)
        if model.architecture == "dflash":
            llama.llama_set_causal_attn(self._ctx, model.meta("dflash.attention.causal") == "true")
        self.hidden = HiddenStates(model, keep_hidden)
        self.hidden.switch(self._ctx, True)
        self._last_decoded = 0  # tokens the last llama_decode added: a recurrent state's snapshots span no more
        self._rolled_back = False  # a recurrent state's snapshot is used until the next decode
        self._checkpoint: tuple[int, ctypes.Array] | None = None  # (position, recurrent state) saved by checkpoint()
        # Set while llama.cpp's cache is being changed and `tokens` not yet told: Ctrl-C raises
        # KeyboardInterrupt at the first bytecode after a C call returns, so between the two; the
        # next change first reads what llama.cpp holds (_settle). (first position, tokens) of a decode; (0, None)
        # while cells are moved about (_reuse_chunks).
        self._changing: tuple[int, Sequence[int] | None] | None = None
        self.cache_reuse = cache_reuse
        self._shared = 0  # the first positions, whose cells another sequence may hold too (adopt)
        # most rows one batch may want logits for (a backend sampler is sized for a verification;
        # a recurrent state can only take back what it has snapshots for)
        self.max_rows = (min(self.n_batch, params.n_outputs_max_per_seq) if backend_sampling is not False
                         else self.n_batch)
        self.max_rows = max(1, min(self.max_rows, self.rollback + 1))
        self._memory = llama.llama_get_memory(self._ctx)
        self._batch = llama.llama_batch_init(n_batch, 0, 1 + branches)
        for i in range(n_batch):
            self._batch.n_seq_id[i] = 1
        self.tokens: list[int] = []
        self.busy_seconds = 0.0  # inside llama_decode: what the Python loop around it is measured against
        # prompts kept on disk (prompt_cache.PromptCache), for a context whose cache is all it needs to go on
        self.prompt_cache = None
        # the target's multimodal projector (vision.Vision), whose rows stand where a prompt holds an image; a
        # context without one reads a stand-in token there
        self.media = None
        self._start_rows(backend_sampling)

    def decode(self, tokens: Sequence[int], logits: str, hidden: np.ndarray | None = None,
               embedded: bool = False) -> None:
        """Append tokens after those already cached. logits: "all" rows, the "last" row, or "none".
        hidden: for an MTP context, the hidden state that goes with each token (a row each); embedded:
        the rows are read in place of the tokens, which only say what the positions hold (a DFlash
        drafter reads the target's hidden states so).

        Longer inputs go in n_batch chunks: one oversized batch makes llama.cpp abort the process.
        """
        if self.media is not None and not embedded and tokens and min(tokens) < 0:
            self._decode_media(tokens, logits)
            return
        self._settle()
        start = len(self.tokens)
        if logits == "all" and len(tokens) > self.max_rows:
            raise EngineError(f"cannot verify {len(tokens)} tokens in a batch of {self.max_rows}")
        if start + len(tokens) > self.n_ctx:
            raise EngineError(f"{start + len(tokens)} tokens do not fit the context of {self.n_ctx}")
        batch = self._batch
        for offset in range(0, len(tokens), self.n_batch):
            chunk = tokens[offset : offset + self.n_batch]
            final_chunk = offset + len(chunk) == len(tokens)
            for i, token in enumerate(chunk):
                batch.token[i] = token if token >= 0 else self.model.stand_in  # (an image's row: vision.py)
                batch.pos[i] = start + offset + i
                # (each row says its one sequence, as every filling of the batch does: a tree's rows, in several, are
                # put back to one after their decode, but not where Ctrl-C cut it short)
                batch.n_seq_id[i], batch.seq_id[i][0] = 1, self.seq
                batch.logits[i] = logits == "all" or (logits == "last" and final_chunk and i == len(chunk) - 1)
            batch.n_tokens = len(chunk)
            self._changing = (start + offset, chunk)
            status = self._run(llama.llama_decode, None if hidden is None else hidden[offset : offset + len(chunk)],
                               tokens=not embedded)
            if self.hidden.layers and status == 0:
                self.hidden.keep(start + offset, self.hidden.read(self._ctx, len(chunk)))
            if status != 0:
                self.truncate(start)  # a failed decode may leave part of the batch behind
                raise EngineError(f"llama_decode failed with status {status} at position {start + offset}")
            self.tokens.extend(chunk)
            self._last_decoded, self._rolled_back, self._row_base, self._row_last = len(chunk), False, 0, -1
            self._changing = None

    def decode_tree(self, tree: DraftTree, root: int) -> None:
        """Decode root (the last committed token) and every node of a draft tree in a batch of their own
        (TreeDecoding.tree_rows: which rows, and keep_path after)."""
        decode_together([Part(self, [root], tree=tree)])

    def sequence(self, seq: int) -> "Context":
        """Sequence `seq` (1 .. n_seq - 1) of this context's cache, as a context of its own: its tokens
        and sampler chain its own, llama.cpp's context and batch shared. It decodes alone (decode) or
        with the others (decode_together); closing this context closes it."""
        if not 0 < seq < self.n_seq or any(view.seq == seq for view in self._views):
            raise EngineError(f"sequence {seq} is not one this context of {self.n_seq} sequences can hand out")
        view = copy.copy(self)
        view.seq, view.tokens, view._views, view._shared = seq, [], [], 0
        view._first_branch = self.n_seq + seq * self.branch_room
        view.hidden, view._checkpoint, view._changing = HiddenStates(self.model, self.hidden.layers), None, None
        view._row_base, view._row_last, view.others, view.alongside, view.busy_seconds = 0, -1, 0, 0, 0.0
        view._start_rows(False)
        self._views.append(view)
        return view

    @property
    def handle(self):
        """llama.cpp's context, which every sequence of it shares."""
        return self._ctx

    def _run(self, call, rows: np.ndarray | None, tokens: bool = True, positions: np.ndarray | None = None) -> int:
        """llama.cpp's call (llama_decode, llama_encode) on the batch as prepared, with rows lent as its
        embeddings (llama_batch_free must not free them) and, where tokens is false, read in place of its
        tokens, and positions lent in place of its own where given; timed as busy time once the device has
        finished: a GPU or an RPC worker computes after the call returns, and the time is the call's (the auto
        policy's costs, the host share)."""
        # What is lent goes in a copy of the batch (llama_decode takes it by value): put into the batch itself, a
        # Ctrl-C before it was taken out again left the batch without its tokens and lending freed arrays.
        batch, watch = type(self._batch).from_buffer_copy(self._batch), self.model.watch
        if rows is not None:
            rows = np.ascontiguousarray(rows, dtype=np.float32)
            batch.embd = rows.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        if not tokens:
            batch.token = ctypes.POINTER(llama.llama_token)()
        if positions is not None:
            positions = np.ascontiguousarray(positions, dtype=np.int32)
            batch.pos = positions.ctypes.data_as(ctypes.POINTER(llama.llama_pos))
        started = perf_counter()
        if watch is not None:
            watch.decoding_since = started
        try:
            status = call(self._ctx, batch)
            llama.llama_synchronize(self._ctx)
        finally:
            if watch is not None:
                watch.decoding_since = None
        self.busy_seconds += perf_counter() - started
        return status

    def prefill(self, tokens: Sequence[int], logits: str = "none", agreed: int = 0) -> int:
        """Make the cache hold exactly `tokens`, keeping the prefix it already has in common
        (a chat's earlier turns, a draft's accepted tokens). Returns how many cached tokens
        were reused. `agreed`: tokens known to match already, so comparing starts there.
        With logits="last" the final token is always decoded, since its logits are wanted."""
        keep = self.keep_common(tokens, agreed, len(tokens) - (logits == "last"))
        if keep < len(tokens):
            self.decode(tokens[keep:], logits=logits)
        return keep

    def keep_common(self, tokens: Sequence[int], agreed: int = 0, most: int | None = None) -> int:
        """Keep the cached prefix `tokens` start with (at most `most` tokens), or a longer one the prompt cache
        holds, forget the rest, and return its length. A recurrent state that cannot go back that far is
        emptied (0)."""
        self._settle()
        keep = image_start(tokens, self.shares(tokens, agreed, most))
        if self.prompt_cache is not None:
            keep = self.prompt_cache.recall(self, tokens, keep, len(tokens) if most is None else most)
        keep = self._reuse_chunks(tokens, keep, len(tokens) if most is None else most)
        if not self._forget_from(keep):
            self.truncate(0)
            keep = 0
        return keep

    @property
    def can_remember(self) -> bool:
        """Whether the cache is all a prompt read leaves behind (no hidden states kept or read beside it), so that
        a prompt cache on disk can stand for reading it."""
        return not (self.hidden.layers or self.reads_hidden or self.model.architecture == "dflash")

    def remember(self, read: int, seconds: float) -> None:
        """After reading `read` tokens of a prompt in `seconds`: keep what the cache holds on disk, where it has a
        prompt cache and that took long."""
        # (not one that holds an image: its rows' ids are this process's own, another would read other images so)
        if self.prompt_cache is not None and not (self.tokens and min(self.tokens) < 0):
            self.prompt_cache.keep(self, read, seconds)

    def adopt(self, donor: "Context", n: int) -> bool:
        """Hold the first n positions of donor's cache (another sequence of this context) as this sequence's
        own, in place of what it held: one prefill for both. In a unified cache llama.cpp only marks the
        cells as the other sequence's too, so later changes to either leave the other's alone. False, with
        nothing changed, where the cells cannot stand alone (a recurrent state, hidden states kept per
        sequence)."""
        if self.recurrent or self.hidden.layers or donor._ctx != self._ctx or donor.seq == self.seq:
            return False
        self._settle()
        donor._settle()
        self.truncate(0)
        llama.llama_memory_seq_cp(self._memory, donor.seq, self.seq, 0, n)
        self.tokens = list(donor.tokens[:n])
        self._shared, donor._shared = n, max(donor._shared, n)
        return True

    def shares(self, tokens: Sequence[int], agreed: int = 0, most: int | None = None) -> int:
        """How many of `tokens` the cache holds as its prefix (at most `most`; the first `agreed` known to)."""
        keep = min(agreed, len(self.tokens))
        limit = min(len(self.tokens), len(tokens) if most is None else most)
        while keep < limit and self.tokens[keep] == tokens[keep]:
            keep += 1
        return keep

    def check_holds(self, tokens: Sequence[int]) -> None:
        """Raise EngineError unless the cache holds exactly `tokens` at positions 0..n-1 (debug mode)."""
        first = llama.llama_memory_seq_pos_min(self._memory, self.seq)
        last = llama.llama_memory_seq_pos_max(self._memory, self.seq)
        # a recurrent state is at the last position only (for a hybrid, llama.cpp answers the later minimum)
        expected = ((len(tokens) - 1 if self.recurrent else 0), len(tokens) - 1) if tokens else (-1, -1)
        if (first, last) != expected or self.tokens != list(tokens):
            raise EngineError(
                f"KV cache drifted: llama.cpp holds positions {first}..{last} ({len(self.tokens)} tokens recorded),"
                f" the generation expects 0..{len(tokens) - 1}"
            )

    def close(self) -> None:
        if self._ctx:
            self._free_dist()
            self._free_chain()
            if self.seq:  # a view: llama.cpp's context is the first sequence's to free
                self._ctx = None
                return
            for view in self._views:
                view.close()
            llama.llama_batch_free(self._batch)
            llama.llama_free(self._ctx)
            self._ctx = None


class Part(NamedTuple):
    """A sequence's rows in a batch of several (decode_together): tokens after those it holds, with logits as
    Context.decode takes them and, for an MTP context, its hidden rows; or a draft tree after its root (the
    only token then), with logits on every row (Context.decode_tree)."""

    context: Context
    tokens: Sequence[int]
    logits: str = "all"
    hidden: np.ndarray | None = None
    tree: DraftTree | None = None


def decode_together(parts: Sequence[Part], embedded: bool = False) -> float:
    """Decode the rows of several sequences of one context (Context.sequence) in one llama_decode (embedded:
    every part's rows read in place of its tokens, as Context.decode's): each sequence then reads its own
    rows from 0 (and -1), as after a decode of its own, keeps its hidden states where it keeps them, and
    learns how many rows the others added (`others`) and how many of the others verified (`alongside`).
    Returns the decode's seconds. A decode that fails leaves every sequence as it was."""
    first = parts[0].context.root
    planned, trees = [], []  # each tree part's rows (token, position, sequence ids), and those parts' sequences
    try:
        for context, tokens, logits, _, tree in parts:
            context._settle()
            start = len(context.tokens)
            if tree is not None:
                planned.append(context.tree_rows(tree, tokens[0]))
                trees.append(context)
            elif logits == "all" and len(tokens) > context.max_rows or start + len(tokens) > context.n_ctx:
                raise EngineError(f"sequence {context.seq} cannot take {len(tokens)} more tokens after {start}")
            else:
                planned.append(None)  # (a chain's rows go straight into the batch: this runs every step)
        rows = sum(len(part.tokens) if tree_rows is None else len(tree_rows)
                   for part, tree_rows in zip(parts, planned))
        if rows > first.n_batch:  # llama.cpp would abort the process
            raise EngineError(f"{rows} rows do not fit a batch of {first.n_batch}")
    except EngineError:
        for context in trees:
            context.tree_failed()
        raise
    batch, row, starts = first._batch, 0, []
    for (context, tokens, logits, _, _), tree_rows in zip(parts, planned):
        start = len(context.tokens)
        context._row_base = row
        if tree_rows is None:
            for i, token in enumerate(tokens):
                # (an image's row stands in a draft's context only: the target reads its images alone)
                batch.token[row], batch.pos[row] = token if token >= 0 else context.model.stand_in, start + i
                batch.logits[row] = logits == "all" or logits == "last" and i == len(tokens) - 1
                batch.n_seq_id[row], batch.seq_id[row][0] = 1, context.seq
                row += 1
        else:
            for token, position, seqs in tree_rows:
                batch.token[row], batch.pos[row], batch.logits[row] = token, position, True
                batch.n_seq_id[row] = len(seqs)
                for j, seq in enumerate(seqs):
                    batch.seq_id[row][j] = seq
                row += 1
        context._row_last = row - 1
        starts.append(start)
    batch.n_tokens = rows
    for (context, tokens, *_), start in zip(parts, starts):
        context._changing = (start, tokens)
    busy, verifying = first.busy_seconds, sum(part.logits == "all" for part in parts)
    hidden = [part.hidden for part in parts]
    status = first._run(llama.llama_decode, np.concatenate(hidden) if hidden[0] is not None else None,
                        tokens=not embedded)
    for context in trees:  # a tree's rows back to one sequence each, as Context.decode fills the batch
        for i in range(context._row_base, context._row_last + 1):
            batch.n_seq_id[i] = 1
    kept = first.hidden.read(first._ctx, rows) if first.hidden.layers and status == 0 else None
    for (context, tokens, logits, _, tree), start in zip(parts, starts):
        if status != 0:
            if tree is not None:
                context.tree_failed()
            context.truncate(start)  # a failed decode may leave part of the batch behind
            continue
        context.tokens.extend(tokens)
        if kept is not None:
            context.hidden.keep(start, kept[context._row_base : context._row_last + 1])
        own = context._row_last + 1 - context._row_base
        context._last_decoded, context._rolled_back, context.others = len(tokens), False, rows - own
        context.alongside = verifying - (logits == "all")
        context._changing = None
    if status != 0:
        raise EngineError(f"llama_decode failed with status {status} on a batch of {len(parts)} sequences")
    return first.busy_seconds - busy

