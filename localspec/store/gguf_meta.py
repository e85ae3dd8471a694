"""A fast, defensive GGUF header reader.

Reads the key/value metadata and tensor table straight from a memory map.
Token and merge arrays are not decoded: their raw bytes are hashed, which is
what comparing two tokenizers needs and takes milliseconds even for a
262k-token vocabulary. Every malformed or truncated file raises GGUFError
naming the file and the problem; nothing else escapes.
"""

import hashlib
import mmap
import struct
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import gguf
import numpy as np

from ..errors import InputError

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MAX_KEY_VALUES = 1 << 16
MAX_TENSORS = 1 << 20
MAX_DIMS = 4
MAX_ARRAY_NESTING = 8  # real files nest at most once; deeper is an attack on the reader's stack
SHORT_ARRAY = 64  # arrays of numbers up to this long are decoded as the header is read
DEFAULT_ALIGNMENT = 32
_LENGTH = struct.Struct("<Q")  # a string's length before its bytes

_SCALAR_FORMATS = {
    gguf.GGUFValueType.UINT8: "<B", gguf.GGUFValueType.INT8: "<b",
    gguf.GGUFValueType.UINT16: "<H", gguf.GGUFValueType.INT16: "<h",
    gguf.GGUFValueType.UINT32: "<I", gguf.GGUFValueType.INT32: "<i",
    gguf.GGUFValueType.FLOAT32: "<f", gguf.GGUFValueType.BOOL: "<?",
    gguf.GGUFValueType.UINT64: "<Q", gguf.GGUFValueType.INT64: "<q",
    gguf.GGUFValueType.FLOAT64: "<d",
}


class GGUFError(InputError):
    pass


@dataclass(frozen=True)
class RawArray:
    """An array value left undecoded: its element type, length and bytes' location."""

    item_type: int
    count: int
    start: int
    end: int
    values: tuple | None = None  # decoded where short and of numbers (a handful of layer indices)


# The spellings llama.cpp's vocabulary loader (src/llama-vocab.cpp) finds the fill-in-the-middle tokens by,
# where the file names none (Qwen, Granite, DeepSeek, CodeLlama, GLM-4.5, Falcon-H1-Tiny-Coder)
FIM_SPELLINGS = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
            "<|prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>",
            "<|suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>",
            "<|middle|>"),
}

# From llama.cpp's src/llama-arch.cpp (the pinned version): architectures whose layers keep a recurrent
# state instead of (or beside) a KV cache, and those whose state it can roll back by a few tokens, as a
# rejected draft needs (llm_arch_supports_rs_rollback).
# Encoders (src/llama-arch.cpp): they embed text and cannot generate it; llama.cpp aborts the process
# if asked for their logits. A converted encoder also says `{arch}.attention.causal = false`.
RANK_POOLING = 4  # enum llama_pooling_type
ENCODER_ARCHITECTURES = frozenset({
    "bert", "modern-bert", "nomic-bert", "nomic-bert-moe", "neo-bert", "jina-bert-v2", "jina-bert-v3", "eurobert",
    "t5encoder",
})
RECURRENT_ARCHITECTURES = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHITECTURES = frozenset({
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe", "qwen3next",
    "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "minimax-01",
})
# Targets whose graph hands out the input of each layer (llama.cpp's t_layer_inp, set in src/models/): the
# hidden states an EAGLE-3 drafter reads. Asking another for them aborts the process (a GGML_ASSERT). Of
# these, the ones that also hand out their last hidden state (t_h_nextn), a layer index equal to their
# layer count.
LAYER_INPUT_ARCHITECTURES = frozenset({
    "llama", "qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "qwen4exp", "gemma4", "gpt-oss", "lfm2",
    "nemotron_h", "deepseek4", "bailingmoe3", "minimax-01", "minimax-m2", "mimo2", "hunyuan_vl", "nanbeige",
    "muse-glimmer",
})
LAST_HIDDEN_ARCHITECTURES = frozenset({
    "qwen3next", "qwen35", "qwen35moe", "gemma4", "gpt-oss", "nemotron_h", "deepseek4", "bailingmoe3", "mimo2",
})
ROLLBACK_ARCHITECTURES = frozenset({
    "kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h", "nemotron_h_moe", "lfm2",
    "lfm2moe", "bailingmoe3",
})


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    version: int
    file_size: int
    metadata: dict = field(repr=False)
    tensor_count: int
    parameters: int
    token_digest: str | None
    merges_digest: str | None
    trunk: bool = True  # whether it holds its first layer's weights (an MTP sidecar holds only its MTP block)
    # each tensor's bytes in the file, by name (what a layer weighs where llama.cpp places it; its keys, which
    # tensors the file has)
    tensor_bytes: dict[str, int] = field(default_factory=dict, repr=False)

    def get(self, key: str, default=None):
        value = self.metadata.get(key, default)
        return default if isinstance(value, RawArray) else value

    @property
    def architecture(self) -> str:
        return self.get("general.architecture", "unknown")

    @property
    def name(self) -> str:
        return self.get("general.name") or self.path.stem

    def arch(self, key: str, default=None):
        return self.get(f"{self.architecture}.{key}", default)

    def numbers(self, key: str) -> tuple:
        """A short array of numbers (RawArray.values); () where there is none."""
        value = self.metadata.get(key)
        return value.values or () if isinstance(value, RawArray) else ()

    @property
    def target_layers(self) -> tuple[int, ...]:
        """The target's layers whose inputs an EAGLE-3 drafter reads (the target's layer count: its last
        hidden state); () for other models."""
        return self.numbers(f"{self.architecture}.target_layers")

    @property
    def mtp_sidecar(self) -> bool:
        """An MTP block published in a file of its own beside a target built without one (ggml-org's
        `mtp-` files): llama.cpp's qwen35 loader takes a file with MTP layers and no first layer as one."""
        return self.mtp_layers > 0 and not self.trunk

    @property
    def applied_to_a_model(self) -> tuple[str, str, str] | None:
        """Where the file is no model but something applied to one: what it is, the architecture of the models it
        is for ("" unknown) and the option that applies it; None for a model."""
        if self.get("general.type") == "adapter":
            return "a LoRA adapter", self.architecture, "--lora"
        if self.architecture == "controlvector":
            return "a control vector", self.get("controlvector.model_hint") or "", "--control-vector"
        if self.architecture == "clip":  # (its projector type says little of which models: "" )
            return "a multimodal projector", "", "--mmproj"
        return None

    @property
    def generates(self) -> bool:
        """Whether the model writes text (an embedding model's encoder only embeds it; a reranker, even a causal
        one such as Qwen3-Reranker, only scores)."""
        return (self.architecture not in ENCODER_ARCHITECTURES and self.arch("attention.causal") is not False
                and not self.ranks)

    @property
    def classifies(self) -> bool:
        """Whether it has a classifier head, which rank pooling scores with (a reranker's)."""
        return "cls.weight" in self.tensor_bytes or "cls.output.weight" in self.tensor_bytes

    @property
    def ranks(self) -> bool:
        """Whether the model is a reranker: it pools by rank (llama.cpp's pooling type 4), scoring a query and a
        document read together rather than embedding a text."""
        return self.arch("pooling_type") == RANK_POOLING

    @property
    def recurrent(self) -> bool:
        """Whether some layers keep a recurrent state, which a rejected draft cannot simply be cut from."""
        return self.architecture in RECURRENT_ARCHITECTURES | HYBRID_ARCHITECTURES

    @property
    def rolls_back(self) -> bool:
        """Whether llama.cpp can take the last tokens of a decode back out of this model's state."""
        return not self.recurrent or self.architecture in ROLLBACK_ARCHITECTURES

    @property
    def mtp_layers(self) -> int:
        """Multi-token-prediction ("nextn") layers the target can draft for itself with."""
        return self.arch("nextn_predict_layers", 0) or 0

    @property
    def parameter_size(self) -> str:
        """How big it is in words (1.5B, 135M): the file's own size label, else its counted parameters
        (which count a tied embedding's table, so a 1.5B model counts 1.8B)."""
        label = self.get("general.size_label")
        if isinstance(label, str) and label:
            return label
        return f"{self.parameters / 1e9:.1f}B" if self.parameters >= 1e9 else f"{self.parameters / 1e6:.0f}M"

    @cached_property
    def fills_in_the_middle(self) -> bool:
        """Whether llama.cpp finds the tokens a code model fills in the middle with (Ollama's "insert"): named by
        the file, or spelled in its vocabulary as llama.cpp looks for them."""
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, RawArray):
            return False
        with open(self.path, "rb") as f:
            f.seek(tokens.start)
            vocabulary = f.read(tokens.end - tokens.start)

        def has(spelling: str) -> bool:  # a whole token: its length comes before it
            text = spelling.encode()
            return struct.pack("<Q", len(text)) + text in vocabulary

        return all(self.get(f"tokenizer.ggml.fim_{part}_token_id") is not None or any(map(has, spellings))
                   for part, spellings in FIM_SPELLINGS.items())

    @property
    def context_length(self) -> int | None:
        return self.arch("context_length")

    @property
    def quantization(self) -> str:
        file_type = self.get("general.file_type")
        try:
            return gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            return "unknown" if file_type is None else f"type {file_type}"

    @property
    def vocab_type(self) -> str | None:
        return self.get("tokenizer.ggml.model")

    @property
    def vocab_size(self) -> int:
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        return tokens.count if isinstance(tokens, RawArray) else 0

    @property
    def pre_tokenizer(self) -> str | None:
        return self.get("tokenizer.ggml.pre")

    @property
    def bos_id(self) -> int | None:
        return self.get("tokenizer.ggml.bos_token_id")

    @property
    def eos_id(self) -> int | None:
        return self.get("tokenizer.ggml.eos_token_id")

    @property
    def add_bos(self) -> bool | None:
        return self.get("tokenizer.ggml.add_bos_token")

    @property
    def add_eos(self) -> bool | None:
        return self.get("tokenizer.ggml.add_eos_token")

    @property
    def chat_template(self) -> str | None:
        return self.get("tokenizer.chat_template")

    @property
    def tool_use_template(self) -> str | None:
        """The template the file carries for prompts that offer tools, beside its own (Hermes', Cohere's)."""
        return self.get("tokenizer.chat_template.tool_use")

    def tokens(self) -> list[bytes]:
        """The vocabulary's token texts (decoded on demand: slow for big vocabularies)."""
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, RawArray):
            return []
        with open(self.path, "rb") as f:
            data = f.read(tokens.end)[tokens.start :]
        out, at = [], 0
        for _ in range(tokens.count):
            (length,) = struct.unpack_from("<Q", data, at)
            out.append(data[at + 8 : at + 8 + length])
            at += 8 + length
        return out


def read(path: Path) -> GGUFInfo:
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 24:
                raise GGUFError(f"{path} is not a GGUF model file (only {size} bytes)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _Reader(path, data, size).info()
    except IsADirectoryError:
        raise GGUFError(f"{path} is a directory, not a GGUF model file") from None
    except OSError as error:
        raise GGUFError(f"cannot read model file {path}: {error.strerror}") from None


class _Reader:
    def __init__(self, path: Path, data, size: int):
        self.path, self.data, self.size, self.at = path, data, size, 0

    def fail(self, problem: str):
        raise GGUFError(f"{self.path}: {problem}")

    def take(self, fmt: str):
        width = struct.calcsize(fmt)
        if self.at + width > self.size:
            self.fail(f"file is truncated (header needs byte {self.at + width}, file has {self.size})")
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += width
        return value

    def string(self) -> str:
        raw = self.string_bytes()
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"a string at byte {self.at - len(raw)} is not UTF-8")

    def string_bytes(self) -> bytes:
        start = self.skip_string()
        return self.data[start : self.at]

    def skip_string(self) -> int:
        """Move past a length-prefixed string without copying it; returns where its bytes start."""
        length = self.take("<Q")
        if self.at + length > self.size:
            self.fail(f"file is truncated (a string of {length} bytes runs past the end)")
        self.at += length
        return self.at - length

    def skip_strings(self, count: int) -> None:
        """Move past count length-prefixed strings: skip_string's work in one loop of locals. A vocabulary and its
        merges are 300,000 strings, 55 ms a header one call each, 24 ms so (`ls` reads each downloaded model's)."""
        data, size, at, length_at = self.data, self.size, self.at, _LENGTH.unpack_from
        for _ in range(count):
            if at + 8 > size:
                self.fail(f"file is truncated (header needs byte {at + 8}, file has {size})")
            (length,) = length_at(data, at)
            at += 8 + length
            if at > size:
                self.fail(f"file is truncated (a string of {length} bytes runs past the end)")
        self.at = at

    def value(self, value_type: int):
        if value_type in _SCALAR_FORMATS:
            return self.take(_SCALAR_FORMATS[value_type])
        if value_type == gguf.GGUFValueType.STRING:
            return self.string()
        if value_type == gguf.GGUFValueType.ARRAY:
            return self.array()
        self.fail(f"unknown value type {value_type}")

    def array(self, depth: int = 1) -> RawArray:
        if depth > MAX_ARRAY_NESTING:
            self.fail(f"arrays nested more than {MAX_ARRAY_NESTING} deep")
        item_type, count = self.take("<I"), self.take("<Q")
        start = self.at
        if item_type in _SCALAR_FORMATS:
            width = struct.calcsize(_SCALAR_FORMATS[item_type])
            if count > (self.size - start) // width:
                self.fail(f"an array claims {count} items, more than the file holds")
            self.at += count * width
        elif item_type == gguf.GGUFValueType.STRING:
            if count > (self.size - start) // 8:
                self.fail(f"an array claims {count} strings, more than the file holds")
            self.skip_strings(count)
        elif item_type == gguf.GGUFValueType.ARRAY:
            if count > (self.size - start) // 12:
                self.fail(f"an array claims {count} arrays, more than the file holds")
            for _ in range(count):
                self.array(depth + 1)
        else:
            self.fail(f"unknown array item type {item_type}")
        values = None
        if item_type in _SCALAR_FORMATS and count <= SHORT_ARRAY:
            values = struct.unpack_from(f"<{count}{_SCALAR_FORMATS[item_type][-1]}", self.data, start)
        return RawArray(item_type, count, start, self.at, values)

    def info(self) -> GGUFInfo:
        if self.data[:4] != MAGIC:
            self.fail("not a GGUF model file")
        self.at = 4
        version = self.take("<I")
        if version not in SUPPORTED_VERSIONS:
            self.fail(f"GGUF version {version} is not supported (only {SUPPORTED_VERSIONS})")
        tensor_count, kv_count = self.take("<Q"), self.take("<Q")
        if kv_count > MAX_KEY_VALUES:
            self.fail(f"header claims {kv_count} metadata entries")
        if tensor_count > MAX_TENSORS:
            self.fail(f"header claims {tensor_count} tensors")
        metadata = {}
        for _ in range(kv_count):
            key = self.string()
            metadata[key] = self.value(self.take("<I"))
        parameters, sizes = self._tensors(tensor_count, metadata)
        return GGUFInfo(
            path=self.path,
            version=version,
            file_size=self.size,
            metadata=metadata,
            tensor_count=tensor_count,
            parameters=parameters,
            token_digest=self._digest(metadata.get("tokenizer.ggml.tokens")),
            merges_digest=self._digest(metadata.get("tokenizer.ggml.merges")),
            trunk=any(name.startswith("blk.0.") for name in sizes) or not any(name.startswith("blk.") for name in sizes),
            tensor_bytes=sizes,
        )

    def _tensors(self, count: int, metadata: dict) -> tuple[int, dict[str, int]]:
        """The parameter count and each tensor's bytes, by name."""
        tensors = []
        for _ in range(count):
            name = self.string()
            n_dims = self.take("<I")
            if n_dims > MAX_DIMS:
                self.fail(f"tensor {name} claims {n_dims} dimensions")
            dims = [self.take("<Q") for _ in range(n_dims)]
            tensor_type, offset = self.take("<I"), self.take("<Q")
            tensors.append((name, dims, tensor_type, offset))
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0:
            self.fail(f"invalid alignment {alignment!r}")
        data_start = -(-self.at // alignment) * alignment
        parameters, sizes = 0, {}
        for name, dims, tensor_type, offset in tensors:
            elements = 1
            for d in dims:
                elements *= d
            parameters += elements
            try:
                block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(tensor_type)]
            except (ValueError, KeyError):
                self.fail(f"tensor {name} has unknown type {tensor_type}")
            sizes[name] = elements // block * block_bytes
            if data_start + offset + sizes[name] > self.size:
                self.fail(f"tensor {name} extends past the end of the file (truncated download?)")
        return parameters, sizes

    def _digest(self, array) -> str | None:
        if not isinstance(array, RawArray):
            return None
        return hashlib.sha256(self.data[array.start : array.end]).hexdigest()


def control_vector(path: Path) -> dict[int, np.ndarray]:
    """A control vector's directions by layer (llama.cpp's cvector-generator writes `direction.N`, N from 1: one
    F32 vector of the model's width a layer), checked as llama.cpp checks them; GGUFError naming what is wrong."""
    read(path)  # (not a GGUF, truncated, ...: said as for any file)
    directions: dict[int, np.ndarray] = {}
    for tensor in gguf.GGUFReader(str(path)).tensors:
        kind, _, layer = tensor.name.partition(".")
        if kind != "direction" or not layer.isdigit() or int(layer) == 0:
            raise GGUFError(f"{path} is not a control vector: a tensor {tensor.name!r}, where a control vector holds"
                            " direction.1, direction.2, ... (llama.cpp's cvector-generator writes one)")
        if tensor.tensor_type != gguf.GGMLQuantizationType.F32 or len(tensor.shape) != 1:
            raise GGUFError(f"{path}: {tensor.name} is not a vector of F32 numbers")
        directions[int(layer)] = directions.get(int(layer), 0) + np.array(tensor.data, dtype=np.float32)
    if not directions:
        raise GGUFError(f"{path} holds no direction tensors: not a control vector")
    if len({len(direction) for direction in directions.values()}) > 1:
        raise GGUFError(f"{path}: its directions are not all of one width")
    return directions
