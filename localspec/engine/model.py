"""A model on llama.cpp: its weights, loaded once for every context made of it, and its vocabulary
(tokenizing, token texts, the chat template in its metadata)."""

import ctypes
import threading
from array import array
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path

from cachetools import LRUCache

from ..config import SPLIT_MODES
from ..errors import InputError, ModelLoadError, UsageError
from .devices import offload_array, override_array
from .library import ctrl_c_held, layer_inputs, llama, recent_errors
from .prefixes import Prefixes, anchors_of

GGUF_MAGIC = b"GGUF"
# Texts kept tokenized, by bytes of text and of tokens: every request renders a conversation whole and tokenizes it,
# its earlier messages as before (a 32,000-token conversation's 110 ms at each turn of an agent's).
TOKENIZED_BYTES = 32 << 20
SHORTEST_KEPT = 256  # bytes: a shorter text tokenizes in microseconds
# bytes: a longer text read with special tokens parsed reuses the tokens of an earlier one it begins as (prefixes.py)
SHORTEST_RESUMED = 8 << 10


class Model:
    def __init__(self, path: Path, gpu_layers: int = -1, devices: tuple[str, ...] | None = None,
                 load_mtp: bool = False, tensor_split: tuple[float, ...] | None = None, repack: bool = True,
                 mmap: bool | None = None, mlock: bool = False, watch=None, vocab_only: bool = False,
                 tensor_overrides: tuple[tuple[str, str], ...] = (), split_mode: str = "layer",
                 main_gpu: int = 0):
        """devices: the offload devices to use by name (llama.cpp's --device; ("none",) for none);
        None: every device llama.cpp sees, a worker's (--rpc) too. tensor_split: the share of the
        offloaded layers each of them takes, in order (llama.cpp's --tensor-split); None: in
        proportion to their free memory. load_mtp: also load the multi-token-prediction layers
        (an MTP context can be made only then; llama.cpp aborts otherwise). repack: let the CPU keep
        weights in the layout of its fastest kernels (llama.cpp's extra buffer types). mmap: map the file
        into memory (True) or read it in (False); None: as llama.cpp decides for the device. mlock: keep
        the weights in RAM, never swapped out. watch: the RPC workers (rpc.Workers) that watch this
        model's decodes, where its layers may sit on theirs. vocab_only: read its vocabulary alone (no
        context can be made of it), in a fraction of a second. tensor_overrides: (pattern, buffer type) each, the
        tensors whose names the pattern finds kept in a buffer of that type (llama.cpp's -ot: a MoE's experts
        on the CPU, the rest on the GPU), the first pattern that finds a name deciding. split_mode, main_gpu:
        llama.cpp's -sm and -mg (how layers split across GPUs; the one GPU of split mode none)."""
        self.path = Path(path)
        check_is_gguf(self.path)
        params = llama.llama_model_default_params()
        params.load_mode = _load_mode(mmap, mlock)
        params.n_gpu_layers = gpu_layers
        params.load_mtp = load_mtp
        params.use_extra_bufts = repack
        params.vocab_only = vocab_only
        params.split_mode, params.main_gpu = SPLIT_MODES[split_mode], main_gpu
        if devices is not None:
            chosen = offload_array(devices)
            params.devices = ctypes.cast(chosen, ctypes.c_void_p)
        if tensor_overrides:
            self._overrides = override_array(tensor_overrides)  # kept referenced while llama.cpp reads it
            params.tensor_buft_overrides = ctypes.cast(self._overrides, ctypes.c_void_p)
        if tensor_split is not None:
            most = llama.llama_max_devices()
            if len(tensor_split) > most:
                raise UsageError(f"--tensor-split names {len(tensor_split)} devices; llama.cpp takes at most {most}")
            self._split = (ctypes.c_float * most)(*tensor_split)  # kept referenced while llama.cpp reads it
            params.tensor_split = ctypes.cast(self._split, ctypes.POINTER(ctypes.c_float))
        recent_errors.clear()
        self.watch = watch
        with ctrl_c_held() as pressed:  # (its load stops at the next progress it reports, the model let go)
            params.progress_callback = progress = llama.llama_progress_callback(lambda done, data: not pressed)
            self._model = llama.llama_model_load_from_file(str(self.path).encode(), params)
            del progress  # (referenced until llama.cpp has returned)
        if pressed:
            if self._model:
                llama.llama_model_free(self._model)
            raise KeyboardInterrupt
        if not self._model:
            reason = recent_errors[0].split("error loading model: ")[-1] if recent_errors else "damaged file?"
            raise ModelLoadError(f"llama.cpp could not load {self.path}: {reason} (LOCALSPEC_DEBUG=1 shows its log)")
        self._vocab = llama.llama_model_get_vocab(self._model)
        self.n_vocab = llama.llama_vocab_n_tokens(self._vocab)
        self.vocab_type = llama.llama_vocab_type(self._vocab)
        self.add_bos = bool(llama.llama_vocab_get_add_bos(self._vocab))
        self.add_eos = bool(llama.llama_vocab_get_add_eos(self._vocab))
        # Some layers keep a recurrent state (Mamba, RWKV; hybrids such as LFM2 or Qwen3.5): it holds no
        # positions, so dropping the last tokens of a cache is possible only as far as llama.cpp keeps
        # snapshots of the state (Context.rollback).
        self.recurrent = bool(llama.llama_model_is_recurrent(self._model) or llama.llama_model_is_hybrid(self._model))
        self.mtp_layers = llama.llama_model_n_layer_nextn(self._model) if load_mtp else 0
        self.n_embd = llama.llama_model_n_embd_out(self._model)  # the width of a hidden state an MTP block reads
        self.n_layer = llama.llama_model_n_layer(self._model)
        self.layer_width = llama.llama_model_n_embd(self._model)  # the width of a layer's input
        # an EAGLE-3 or DFlash drafter's: the target layers whose inputs it reads (n_layer: the last hidden state)
        self.target_layers = layer_inputs().target_layers(self._model)
        self.architecture = self.meta("general.architecture") or "unknown"
        self._pieces: dict[int, bytes] = {}
        # text, add_special, parse_special -> (its bytes, its tokens); tokenized on the server's threads and the engine's
        self._tokenized = LRUCache(TOKENIZED_BYTES, getsizeof=lambda kept: kept[0] + kept[1].itemsize * len(kept[1]))
        self._tokenized_lock = threading.Lock()
        self._controls: dict[int, bool] = {}  # token -> whether it is a control token or the unknown one
        self._special_pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self._dry_breakers: dict[tuple[str, ...], dict[int, tuple[tuple[int, ...], ...]]] = {}

    def meta(self, key: str) -> str | None:
        """A metadata value as text, as llama.cpp read it from the file; None where it has none."""
        buffer = ctypes.create_string_buffer(256)
        n = llama.llama_model_meta_val_str(self._model, key.encode(), buffer, len(buffer))
        return buffer.value.decode("utf-8", errors="replace") if n >= 0 else None

    @property
    def vocab(self):
        """llama.cpp's vocabulary handle (a grammar is compiled against it)."""
        return self._vocab

    def tokenize(self, text: str | bytes, add_special: bool, parse_special: bool) -> list[int]:
        try:
            data = text.encode("utf-8") if isinstance(text, str) else text
        except UnicodeEncodeError as error:  # (a library caller's text; a request's JSON is refused as it is read)
            raise InputError(f"the text holds a lone surrogate ({ascii(error.object[error.start])}: half of a UTF-16"
                             " pair, no character of its own), which UTF-8, and so the model, cannot read") from None
        if len(data) < SHORTEST_KEPT:
            return self._tokenized_now(data, add_special, parse_special)
        if (len(data) >= SHORTEST_RESUMED and parse_special and self.prefixes is not None
                and not (add_special and self.add_eos)):
            return self.prefixes.tokens(data, add_special, self._tokenized_now)
        key = (data, add_special, parse_special)
        with self._tokenized_lock:
            kept = self._tokenized.get(key)
        if kept is None:
            kept = (len(data), array("i", self._tokenized_now(data, add_special, parse_special)))
            if self._tokenized.getsizeof(kept) <= TOKENIZED_BYTES // 4:  # (one pasted book does not empty it)
                with self._tokenized_lock:
                    self._tokenized[key] = kept
        return kept[1].tolist()

    @cached_property
    def prefixes(self) -> Prefixes | None:
        """Long texts tokenized lately, for a text that begins as one of them to reuse its tokens; None where the
        tokenizer keeps state from one piece of text to the next, or normalizes text first, or no control token can
        be an anchor (prefixes.py). Reads
        every token's attributes once (0.1 s for Qwen's 152k, 0.4 s for Gemma 3's 262k)."""
        plain_bpe = self.vocab_type == llama.LLAMA_VOCAB_TYPE_BPE and self.meta("tokenizer.ggml.model") not in (
            "hybriddna", "whitespace")
        if not (plain_bpe or self.vocab_type == llama.LLAMA_VOCAB_TYPE_SPM):
            return None
        special = llama.LLAMA_TOKEN_ATTR_CONTROL | llama.LLAMA_TOKEN_ATTR_USER_DEFINED | llama.LLAMA_TOKEN_ATTR_UNKNOWN
        texts, controls = {}, set()
        for token in range(self.n_vocab):
            attributes = llama.llama_vocab_get_attr(self._vocab, token)
            if attributes & special:
                texts[token] = llama.llama_vocab_get_text(self._vocab, token) or b""
                if attributes & llama.LLAMA_TOKEN_ATTR_CONTROL:
                    controls.add(token)
        anchors = anchors_of(texts, controls)
        return Prefixes(anchors, llama.llama_vocab_bos(self._vocab) if self.add_bos else None) if anchors else None

    def reads_control(self, tokens: Sequence[int]) -> bool:
        """Whether a text's tokens, read with special tokens parsed, hold a control token or the unknown one: only where
        they do can reading the text without special tokens parsed give other tokens (llama.cpp splits a text at
        those tokens' texts only when it parses special tokens; the user-defined ones it splits at either way)."""
        distinct, attributes = set(tokens), llama.LLAMA_TOKEN_ATTR_CONTROL | llama.LLAMA_TOKEN_ATTR_UNKNOWN
        for token in distinct.difference(self._controls):
            self._controls[token] = bool(llama.llama_vocab_get_attr(self._vocab, token) & attributes)
        return any(self._controls[token] for token in distinct)

    def _tokenized_now(self, data: bytes, add_special: bool, parse_special: bool) -> list[int]:
        capacity = len(data) + 8
        while True:
            buffer = (llama.llama_token * capacity)()
            n = llama.llama_tokenize(self._vocab, data, len(data), buffer, capacity, add_special, parse_special)
            if n >= 0:
                return list(buffer[:n])
            capacity = -n

    def spell_of(self, tokens: Sequence[int], special: bool = False) -> bytes:
        """The bytes the tokens spell in generated text (special: with special tokens' own text)."""
        return b"".join(map(self.special_piece if special else self.piece, tokens))

    def spell(self, text: str, special: bool = False) -> list[int]:
        """Tokens that spell exactly `text` where it follows other text: a SentencePiece vocabulary puts a
        space before the text it tokenizes, so there it is tokenized after a newline, and the tokens up to
        the newline are dropped. [] where neither way spells it. special: special tokens' texts in it are
        those tokens."""
        tokens = self.tokenize(text, add_special=False, parse_special=special)
        if self.spell_of(tokens, special) == text.encode():
            return tokens
        after, spelled = self.tokenize("\n" + text, add_special=False, parse_special=special), b""
        for i, token in enumerate(after):
            spelled += self.special_piece(token) if special else self.piece(token)
            if spelled.endswith(b"\n"):
                rest = after[i + 1 :]
                return rest if self.spell_of(rest, special) == text.encode() else []
        return []

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for in generated text (special tokens render as nothing)."""
        cached = self._pieces.get(token)
        if cached is None:
            cached = self._pieces[token] = self._to_piece(token, special=False)
        return cached

    def special_piece(self, token: int) -> bytes:
        """The bytes of a token as llama.cpp's grammars read it: special tokens' own text included."""
        cached = self._special_pieces.get(token)
        if cached is None:
            cached = self._special_pieces[token] = self._to_piece(token, special=True)
        return cached

    def control_text(self, token: int) -> str | None:
        """A control token's own text (`<|end|>`), which generated text leaves out; None for any other token."""
        if self.piece(token):
            return None
        text = self.special_piece(token)
        return text.decode("utf-8", errors="replace") if text else None

    def _to_piece(self, token: int, special: bool) -> bytes:
        buffer = ctypes.create_string_buffer(64)
        n = llama.llama_token_to_piece(self._vocab, token, buffer, len(buffer), 0, special)
        if n < 0:  # the piece's length, negated, where it does not fit
            buffer = ctypes.create_string_buffer(-n)
            n = llama.llama_token_to_piece(self._vocab, token, buffer, len(buffer), 0, special)
        return buffer.raw[:n]

    @cached_property
    def stand_in(self) -> int:
        """The token a context without the target's projector reads where a prompt holds an image's row (a draft
        model never saw the image): a space, as harmless a token as any."""
        return (self.tokenize(" ", add_special=False, parse_special=False) or [0])[-1]

    @cached_property
    def longest_token(self) -> int | None:
        """The most bytes of text one token stands for (control tokens' own text included), so that a text
        of more bytes than n_ctx times this cannot fit n_ctx tokens; None where no such bound holds: WPM and
        UGM tokenizers normalize text first (a run of spaces becomes one token, or none). Reading the whole
        vocabulary takes 0.1-0.7 s, hence only when asked."""
        if self.vocab_type in (llama.LLAMA_VOCAB_TYPE_WPM, llama.LLAMA_VOCAB_TYPE_UGM):
            return None
        buffer = ctypes.create_string_buffer(256)
        # a piece that does not fit the buffer answers with its length, negated
        return max(abs(llama.llama_token_to_piece(self._vocab, token, buffer, len(buffer), 0, True))
                   for token in range(self.n_vocab))

    @cached_property
    def detokenized(self) -> list[bytes]:
        """Each token's text as llama.cpp's detokenizer writes it alone (special tokens' own text, a
        SentencePiece token's leading space dropped), by id: ~0.3 s for a 150k vocabulary, hence only when asked."""
        words, buffer, one = [], ctypes.create_string_buffer(256), (llama.llama_token * 1)()
        for token in range(self.n_vocab):
            one[0] = token
            n = llama.llama_detokenize(self._vocab, one, 1, buffer, len(buffer), False, True)
            if n < 0:  # the text's length, negated, where it does not fit
                longer = ctypes.create_string_buffer(-n)
                n = llama.llama_detokenize(self._vocab, one, 1, longer, len(longer), False, True)
                words.append(longer.raw[:n])
            else:
                words.append(buffer.raw[:n])
        return words

    def dry_breakers(self, breakers: tuple[str, ...]) -> dict[int, tuple[tuple[int, ...], ...]]:
        """DRY's sequence breakers in this vocabulary, as llama.cpp's DRY sampler reads them: for each token
        whose text holds a breaker, no tail (it breaks alone); for each whose text ends with a breaker's
        beginning, the tokens of the breaker's rest, which must follow it (at most 20). A breaker counts its
        first 40 bytes. By head token; worked out once a model for each set of breakers."""
        found = self._dry_breakers.get(breakers)
        if found is None:
            tails: dict[int, list[tuple[int, ...]]] = {}
            for breaker in breakers:
                text = breaker.encode()[:40]
                first = text[:1]
                for token, word in enumerate(self.detokenized):
                    if first not in word:
                        continue
                    if text in word:
                        tails.setdefault(token, []).append(())
                        continue
                    for at in (at for at in range(len(word)) if word[at:at + 1] == first):
                        overlap = len(word) - at
                        if text.startswith(word[at:]):
                            tail = tuple(self.tokenize(text[overlap:], add_special=False, parse_special=False)[:20])
                            if tail not in tails.setdefault(token, []):
                                tails[token].append(tail)
            found = self._dry_breakers[breakers] = {token: tuple(each) for token, each in tails.items()}
        return found

    @cached_property
    def character_tokens(self) -> dict[int, str]:
        """The tokens that stand for one printable ASCII character (or a newline or tab) each, by id:
        what a grammar is asked about to find the text it forces (Grammar.forced_text)."""
        found = {}
        for character in map(chr, [9, 10, *range(32, 127)]):
            # a SentencePiece vocabulary puts a space token before the character's own
            ids = self.tokenize(character, add_special=False, parse_special=False)
            if ids and self.piece(ids[-1]) == character.encode():
                found[ids[-1]] = character
        return found

    @cached_property
    def end_tokens(self) -> tuple[int, ...]:
        """The end-of-generation tokens a grammar may admit where its text can end (EOS, EOT)."""
        ends = {llama.llama_vocab_eos(self._vocab), llama.llama_vocab_eot(self._vocab)}
        return tuple(sorted(token for token in ends if token >= 0))

    @cached_property
    def fim(self) -> dict[str, int]:
        """The fill-in-the-middle tokens the model has, of pre, suf, mid (a code model's infill marks) and
        rep, sep (a repository's name and its files, where it was trained on them)."""
        found = {"pre": llama.llama_vocab_fim_pre(self._vocab), "suf": llama.llama_vocab_fim_suf(self._vocab),
                 "mid": llama.llama_vocab_fim_mid(self._vocab), "rep": llama.llama_vocab_fim_rep(self._vocab),
                 "sep": llama.llama_vocab_fim_sep(self._vocab)}
        return {name: token for name, token in found.items() if token >= 0}

    @cached_property
    def bos(self) -> int | None:
        """The token a prompt starts with, where the model wants one."""
        token = llama.llama_vocab_bos(self._vocab)
        return token if self.add_bos and token >= 0 else None

    def token_text(self, token: int) -> bytes:
        """The vocabulary entry itself, as stored in the GGUF."""
        return llama.llama_vocab_get_text(self._vocab, token) or b""

    def is_eog(self, token: int) -> bool:
        eog = self._eog.get(token)
        if eog is None:  # asked of every emitted token: remembered, as pieces are
            eog = self._eog[token] = bool(llama.llama_vocab_is_eog(self._vocab, token))
        return eog

    @cached_property
    def eog_tokens(self) -> tuple[int, ...]:
        """Every token that ends a generation (EOS, EOT, a chat turn's end...): what ignore_eos bans, as
        llama.cpp finds them, by asking of the whole vocabulary (~0.1 s), hence only when asked."""
        return tuple(token for token in range(self.n_vocab) if llama.llama_vocab_is_eog(self._vocab, token))

    def special_text(self, which: str) -> str:
        """Text of the BOS or EOS token, as chat templates expect it."""
        token = llama.llama_vocab_bos(self._vocab) if which == "bos" else llama.llama_vocab_eos(self._vocab)
        return self.token_text(token).decode("utf-8", errors="replace") if token >= 0 else ""

    def chat_template(self, name: str | None = None) -> str | None:
        """The file's chat template, or one of its named others ("rerank": a reranker's prompt for a query and
        a document)."""
        template = llama.llama_model_chat_template(self._model, name.encode() if name else None)
        return template.decode("utf-8") if template else None

    def pair(self, first: Sequence[int], second: Sequence[int]) -> list[int]:
        """Two texts' tokens read as one input (a reranker's query and document), joined with the vocabulary's own
        marks as llama.cpp joins them: BOS, the first, EOS (SEP where there is none), SEP, the second, EOS
        (each mark where the vocabulary adds it: XLM-R's <s> q </s></s> d </s>)."""
        vocab = self._vocab
        eos = llama.llama_vocab_eos(vocab)
        if eos < 0:
            eos = llama.llama_vocab_sep(vocab)
        ends = [eos] if self.add_eos else []
        return (([llama.llama_vocab_bos(vocab)] if self.add_bos else []) + list(first) + ends
                + ([llama.llama_vocab_sep(vocab)] if llama.llama_vocab_get_add_sep(vocab) else []) + list(second) + ends)

    def close(self) -> None:
        if self._model:
            llama.llama_model_free(self._model)
            self._model = None

    @property
    def handle(self):
        return self._model


def _load_mode(mmap: bool | None, mlock: bool) -> int:
    if mlock:
        return llama.LLAMA_LOAD_MODE_MLOCK if mmap is False else llama.LLAMA_LOAD_MODE_MMAP_MLOCK
    return {None: llama.LLAMA_LOAD_MODE_AUTO, True: llama.LLAMA_LOAD_MODE_MMAP, False: llama.LLAMA_LOAD_MODE_NONE}[mmap]


def check_is_gguf(path: Path, what: str = "model") -> None:
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except IsADirectoryError:
        raise InputError(f"{path} is a directory, not a GGUF {what} file") from None
    except OSError as error:
        raise InputError(f"cannot read {what} file {path}: {error.strerror}") from None
    if magic != GGUF_MAGIC:
        raise InputError(f"{path} is not a GGUF {what} file")
