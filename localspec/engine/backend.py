"""The only module that talks to llama.cpp (through llama-cpp-python's C bindings).

Model owns weights and vocabulary; Context owns one KV cache with a single
sequence. Logits come back as numpy views on llama.cpp's own buffer: valid
until the next decode on that context, never copied.
"""

import ctypes
import os
import sys
from collections import deque
from time import perf_counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import llama_cpp as llama

from ..errors import EngineError, InputError, ModelLoadError

GGUF_MAGIC = b"GGUF"


# LOCALSPEC_DEBUG=1 also checks after every step that each KV cache holds exactly the tokens we
# think it does (a rollback that drifted would silently corrupt every later token).
CHECK_CACHES = bool(os.environ.get("LOCALSPEC_DEBUG"))
LOG_LEVEL_ERROR = 4  # enum ggml_log_level
_recent_errors: deque[str] = deque(maxlen=4)  # llama.cpp's own words, for our error messages


@llama.llama_log_callback
def _log(level, text, user_data):
    # llama.cpp narrates every load to stderr; users see it only with LOCALSPEC_DEBUG=1.
    line = text.decode("utf-8", errors="replace")
    if level == LOG_LEVEL_ERROR and line.strip():
        _recent_errors.append(line.strip())
    if os.environ.get("LOCALSPEC_DEBUG"):
        sys.stderr.write(line)


llama.llama_log_set(_log, ctypes.c_void_p(0))
llama.llama_backend_init()


def supports_gpu_offload() -> bool:
    return bool(llama.llama_supports_gpu_offload())


class Model:
    def __init__(self, path: Path, gpu_layers: int = -1):
        self.path = Path(path)
        _check_is_gguf(self.path)
        params = llama.llama_model_default_params()
        params.n_gpu_layers = gpu_layers
        _recent_errors.clear()
        self._model = llama.llama_model_load_from_file(str(self.path).encode(), params)
        if not self._model:
            reason = _recent_errors[0].split("error loading model: ")[-1] if _recent_errors else "damaged file?"
            raise ModelLoadError(f"llama.cpp could not load {self.path}: {reason} (LOCALSPEC_DEBUG=1 shows its log)")
        self._vocab = llama.llama_model_get_vocab(self._model)
        self.n_vocab = llama.llama_vocab_n_tokens(self._vocab)
        self.vocab_type = llama.llama_vocab_type(self._vocab)
        self.add_bos = bool(llama.llama_vocab_get_add_bos(self._vocab))
        self._pieces: dict[int, bytes] = {}

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        while True:
            buffer = (llama.llama_token * capacity)()
            n = llama.llama_tokenize(self._vocab, data, len(data), buffer, capacity, add_special, parse_special)
            if n >= 0:
                return list(buffer[:n])
            capacity = -n

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for in generated text (special tokens render as nothing)."""
        cached = self._pieces.get(token)
        if cached is None:
            buffer = ctypes.create_string_buffer(64)
            n = llama.llama_token_to_piece(self._vocab, token, buffer, len(buffer), 0, False)
            if n < 0:
                buffer = ctypes.create_string_buffer(-n)
                n = llama.llama_token_to_piece(self._vocab, token, buffer, len(buffer), 0, False)
            cached = self._pieces[token] = buffer.raw[:n]
        return cached

    def token_text(self, token: int) -> bytes:
        """The vocabulary entry itself, as stored in the GGUF."""
        return llama.llama_vocab_get_text(self._vocab, token) or b""

    def is_eog(self, token: int) -> bool:
        return bool(llama.llama_vocab_is_eog(self._vocab, token))

    def special_text(self, which: str) -> str:
        """Text of the BOS or EOS token, as chat templates expect it."""
        token = llama.llama_vocab_bos(self._vocab) if which == "bos" else llama.llama_vocab_eos(self._vocab)
        return self.token_text(token).decode("utf-8", errors="replace") if token >= 0 else ""

    def chat_template(self) -> str | None:
        template = llama.llama_model_chat_template(self._model, None)
        return template.decode("utf-8") if template else None

    def close(self) -> None:
        if self._model:
            llama.llama_model_free(self._model)
            self._model = None

    @property
    def handle(self):
        return self._model


class Context:
    """One KV cache holding one sequence, positions 0..n-1; `tokens` is what it holds."""

    def __init__(self, model: Model, n_ctx: int, n_batch: int, threads: int):
        self.model = model
        params = llama.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = n_batch
        params.n_threads = params.n_threads_batch = threads
        self._ctx = llama.llama_init_from_model(model.handle, params)
        if not self._ctx:
            raise EngineError(
                f"llama.cpp could not create a context of {n_ctx} tokens for {model.path.name}"
                " (out of memory? try a smaller --ctx-size)"
            )
        self.n_ctx = llama.llama_n_ctx(self._ctx)
        # llama.cpp lowers n_batch to a small requested context; larger batches would abort it.
        self.n_batch = llama.llama_n_batch(self._ctx)
        self._memory = llama.llama_get_memory(self._ctx)
        self._batch = llama.llama_batch_init(n_batch, 0, 1)
        self._n_vocab = model.n_vocab
        self.tokens: list[int] = []
        self.busy_seconds = 0.0  # inside llama_decode: what the Python loop around it is measured against

    def decode(self, tokens: Sequence[int], logits: str) -> None:
        """Append tokens after those already cached. logits: "all" rows, the "last" row, or "none".

        Longer inputs go in n_batch chunks: one oversized batch makes llama.cpp abort the process.
        """
        start = len(self.tokens)
        if logits == "all" and len(tokens) > self.n_batch:
            raise EngineError(f"cannot verify {len(tokens)} tokens in a batch of {self.n_batch}")
        if start + len(tokens) > self.n_ctx:
            raise EngineError(f"{start + len(tokens)} tokens do not fit the context of {self.n_ctx}")
        batch = self._batch
        for offset in range(0, len(tokens), self.n_batch):
            chunk = tokens[offset : offset + self.n_batch]
            final_chunk = offset + len(chunk) == len(tokens)
            for i, token in enumerate(chunk):
                batch.token[i] = token
                batch.pos[i] = start + offset + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = logits == "all" or (logits == "last" and final_chunk and i == len(chunk) - 1)
            batch.n_tokens = len(chunk)
            started = perf_counter()
            status = llama.llama_decode(self._ctx, batch)
            self.busy_seconds += perf_counter() - started
            if status != 0:
                self.truncate(start)  # a failed decode may leave part of the batch behind
                raise EngineError(f"llama_decode failed with status {status} at position {start + offset}")
            self.tokens.extend(chunk)

    def logits(self, row: int) -> np.ndarray:
        """Logits of a row of the last decoded batch (-1: its last row) as a view, not a copy."""
        pointer = llama.llama_get_logits_ith(self._ctx, row)
        if not pointer:
            raise EngineError(f"no logits for row {row} of the last batch")
        return np.ctypeslib.as_array(pointer, shape=(self._n_vocab,))

    def truncate(self, n_keep: int) -> None:
        """Forget every position from n_keep on."""
        if not llama.llama_memory_seq_rm(self._memory, 0, n_keep, -1):
            raise EngineError(f"llama.cpp could not roll the KV cache back to {n_keep} tokens")
        del self.tokens[n_keep:]

    def prefill(self, tokens: Sequence[int], logits: str = "none", agreed: int = 0) -> int:
        """Make the cache hold exactly `tokens`, keeping the prefix it already has in common
        (a chat's earlier turns, a draft's accepted tokens). Returns how many cached tokens
        were reused. `agreed`: tokens known to match already, so comparing starts there.
        With logits="last" the final token is always decoded, since its logits are wanted."""
        keep = agreed
        limit = min(len(self.tokens), len(tokens) - (logits == "last"))
        while keep < limit and self.tokens[keep] == tokens[keep]:
            keep += 1
        self.truncate(keep)
        if keep < len(tokens):
            self.decode(tokens[keep:], logits=logits)
        return keep

    def check_holds(self, tokens: Sequence[int]) -> None:
        """Raise EngineError unless the cache holds exactly `tokens` at positions 0..n-1 (debug mode)."""
        first = llama.llama_memory_seq_pos_min(self._memory, 0)
        last = llama.llama_memory_seq_pos_max(self._memory, 0)
        expected = (0, len(tokens) - 1) if tokens else (-1, -1)
        if (first, last) != expected or self.tokens != list(tokens):
            raise EngineError(
                f"KV cache drifted: llama.cpp holds positions {first}..{last} ({len(self.tokens)} tokens recorded),"
                f" the generation expects 0..{len(tokens) - 1}"
            )

    def close(self) -> None:
        if self._ctx:
            llama.llama_batch_free(self._batch)
            llama.llama_free(self._ctx)
            self._ctx = None


def _check_is_gguf(path: Path) -> None:
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except IsADirectoryError:
        raise InputError(f"{path} is a directory, not a GGUF model file") from None
    except OSError as error:
        raise InputError(f"cannot read model file {path}: {error.strerror}") from None
    if magic != GGUF_MAGIC:
        raise InputError(f"{path} is not a GGUF model file")


def system_info() -> str:
    """llama.cpp's summary of the CPU features and backends it was built with."""
    return llama.llama_print_system_info().decode("utf-8", errors="replace").strip()


def devices() -> list[dict]:
    """The compute devices ggml sees: name, description, kind, free and total memory in bytes."""
    library = Path(llama.__file__).parent / "lib"
    ggml = ctypes.CDLL(str(next(library / name for name in ("libggml.so", "libggml.dylib", "ggml.dll") if (library / name).exists())))
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for function in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(ggml, function).restype = ctypes.c_char_p
        getattr(ggml, function).argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_type.restype = ctypes.c_int
    ggml.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    kinds = {0: "CPU", 1: "GPU", 2: "integrated GPU", 3: "accelerator"}  # enum ggml_backend_dev_type
    found = []
    for i in range(ggml.ggml_backend_dev_count()):
        device = ggml.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        ggml.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
        found.append(dict(
            name=ggml.ggml_backend_dev_name(device).decode(),
            description=ggml.ggml_backend_dev_description(device).decode(),
            kind=kinds.get(ggml.ggml_backend_dev_type(device), "other"),
            free=free.value, total=total.value,
        ))
    return found
