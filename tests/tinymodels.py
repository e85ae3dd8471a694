"""Tiny GGUFs written with the gguf package, for tests on real llama.cpp: llama (attention only)
and LFM2 (a hybrid: gated short-convolution layers, whose state is recurrent, beside attention).

Weights are random but seeded, stored as F32 so batched and single-token logits
agree closely. `sharpness` scales the output layer: larger makes the next-token
distribution peakier, which gives statistical tests their power. Tensor names,
shapes and metadata keys are those of the pinned llama.cpp's src/llama-arch.cpp
and src/models/ (numpy shapes are ggml's reversed).
"""

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from localspec.engine.devices import supports_gpu_offload

N_EMBD = 64
N_HEAD = 4
N_LAYER = 2
N_FF = 128
CONTEXT = 512
# LFM2: which layers are short convolutions (recurrent) and which attention, and the convolution's width
LFM2_LAYERS = ("conv", "attn", "conv")
LFM2_CONV_WIDTH = 3

# llama.cpp's SPM tokenizer only merges into pieces whose prefixes are pieces too,
# so single characters keep tokenization simple: one token per character.
LOWERCASE = tuple("\u2581abcdefghijklmnopqrstuvwxyz.,")
UPPERCASE = tuple("\u2581ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!?")


def spm_vocab(pieces: tuple[str, ...]) -> list[str]:
    return ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list(pieces)


@dataclass(frozen=True)
class TinySpec:
    seed: int
    pieces: tuple[str, ...] = LOWERCASE
    sharpness: float = 1.0
    # Mix in a second random model: 0 keeps `seed`'s weights, 1 replaces them entirely.
    blend_seed: int | None = None
    blend: float = 0.0
    architecture: str = "llama"  # or "lfm2"; anything else is unknown to llama.cpp (and written as llama)
    # tokenizer.chat_template (or named ones, gguf's [{"name", "template"}]); without one localspec's fallback renders chats
    chat_template: str | list[dict] | None = None
    # < 1 shrinks what each layer adds to its input: the next token then depends mostly on the last one
    layer_scale: float = 1.0
    # more tokens after the pieces, as a real family's vocabulary has them: shown as text (USER_DEFINED, as
    # Qwen3's <think>), and control tokens (<|im_end|>), which llama.cpp ends generation at where it knows them
    user_defined: tuple[str, ...] = ()
    control: tuple[str, ...] = ()
    # its byte tokens' logits pinned at 0 too, so that it writes its pieces (text) rather than random bytes
    writes_pieces: bool = False
    # a Mixture of Experts (llama's, as Mixtral's): each layer's feed-forward this many experts, two used a token
    experts: int = 0

    @property
    def vocab(self) -> list[str]:
        return spm_vocab(self.pieces) + list(self.user_defined) + list(self.control)


def _weights(seed: int, n_vocab: int, architecture: str, experts: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float32)

    lfm2 = architecture == "lfm2"
    tensors = {"token_embd.weight": normal(n_vocab, N_EMBD, scale=np.sqrt(N_EMBD))}
    for layer, kind in enumerate(LFM2_LAYERS if lfm2 else ("attn",) * N_LAYER):
        block = f"blk.{layer}"
        tensors[f"{block}.attn_norm.weight"] = np.ones(N_EMBD, dtype=np.float32)
        if kind == "conv":
            tensors[f"{block}.shortconv.conv.weight"] = normal(N_EMBD, LFM2_CONV_WIDTH)
            tensors[f"{block}.shortconv.in_proj.weight"] = normal(3 * N_EMBD, N_EMBD)  # gates B and C, and x
            tensors[f"{block}.shortconv.out_proj.weight"] = normal(N_EMBD, N_EMBD)
        else:
            for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
                tensors[f"{block}.{name}.weight"] = normal(N_EMBD, N_EMBD)
            if lfm2:
                tensors[f"{block}.attn_q_norm.weight"] = np.ones(N_EMBD // N_HEAD, dtype=np.float32)
                tensors[f"{block}.attn_k_norm.weight"] = np.ones(N_EMBD // N_HEAD, dtype=np.float32)
        tensors[f"{block}.ffn_norm.weight"] = np.ones(N_EMBD, dtype=np.float32)
        if experts:
            tensors[f"{block}.ffn_gate_inp.weight"] = normal(experts, N_EMBD)
            tensors[f"{block}.ffn_gate_exps.weight"] = normal(experts, N_FF, N_EMBD)
            tensors[f"{block}.ffn_up_exps.weight"] = normal(experts, N_FF, N_EMBD)
            tensors[f"{block}.ffn_down_exps.weight"] = normal(experts, N_EMBD, N_FF)
            continue
        tensors[f"{block}.ffn_gate.weight"] = normal(N_FF, N_EMBD)
        tensors[f"{block}.ffn_up.weight"] = normal(N_FF, N_EMBD)
        tensors[f"{block}.ffn_down.weight"] = normal(N_EMBD, N_FF)
    # LFM2's final norm carries the name "token_embd_norm" in llama.cpp (LLM_TENSOR_OUTPUT_NORM_LFM2)
    tensors["token_embd_norm.weight" if lfm2 else "output_norm.weight"] = np.ones(N_EMBD, dtype=np.float32)
    tensors["output.weight"] = normal(n_vocab, N_EMBD)
    return tensors


def tiny_weights(spec: TinySpec) -> dict[str, np.ndarray]:
    """The tensors write_tiny_model writes for a spec."""
    tokens = spec.vocab
    tensors = _weights(spec.seed, len(tokens), spec.architecture, spec.experts)
    if spec.blend_seed is not None:
        other = _weights(spec.blend_seed, len(tokens), spec.architecture, spec.experts)
        tensors = {name: ((1 - spec.blend) * w + spec.blend * other[name]).astype(np.float32) for name, w in tensors.items()}
    tensors["output.weight"] = tensors["output.weight"] * np.float32(spec.sharpness)
    for name, weights in tensors.items():
        if name.startswith("blk.") and weights.ndim == 2:
            tensors[name] = weights * np.float32(spec.layer_scale)
    # A zero row pins the logit of <unk>/<s>/</s> at 0: end of text stays possible when
    # sampling but greedy runs rarely stop after a handful of tokens.
    tensors["output.weight"][: 259 if spec.writes_pieces else 3] = 0.0
    return tensors


def write_tiny_model(path: Path, spec: TinySpec, tensors_per_part: int = 0) -> Path:
    """tensors_per_part: split the model into files of that many tensors each, as gguf-split does
    (path-00001-of-0000N.gguf, ...; the first is returned)."""
    tensors = tiny_weights(spec)
    writer = gguf.GGUFWriter(str(path), spec.architecture, split_max_tensors=tensors_per_part)
    writer.add_name(path.stem)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    if spec.architecture == "lfm2":
        writer.add_block_count(len(LFM2_LAYERS))
        # per layer; none marks a short-convolution layer
        writer.add_head_count_kv([N_HEAD if kind == "attn" else 0 for kind in LFM2_LAYERS])
        writer.add_rope_freq_base(10000.0)
        writer.add_uint32("lfm2.shortconv.l_cache", LFM2_CONV_WIDTH)
    else:
        writer.add_block_count(N_LAYER)
        writer.add_head_count_kv(N_HEAD)
        if spec.experts:
            writer.add_expert_count(spec.experts)
            writer.add_expert_used_count(2)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_spm_tokenizer(writer, spec.pieces, spec.user_defined, spec.control)
    if spec.chat_template is not None:
        writer.add_chat_template(spec.chat_template)
    finish(writer, tensors, path)
    return next(path.parent.glob(f"{path.stem}-00001-of-*.gguf")) if tensors_per_part else path


def attention_writer(path: Path, architecture: str = "llama", rms_eps: float = 1e-5,
                     context: int = CONTEXT) -> gguf.GGUFWriter:
    """A writer holding the hyperparameters of tiny_weights' attention layers (N_LAYER of them, N_EMBD wide, N_HEAD
    heads of N_EMBD // N_HEAD, F32), for an architecture that reads llama's tensors (and perhaps more)."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(path.stem)
    writer.add_context_length(context)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_block_count(N_LAYER)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(rms_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    return writer


def add_spm_tokenizer(writer: gguf.GGUFWriter, pieces: tuple[str, ...], user_defined: tuple[str, ...] = (),
                      control: tuple[str, ...] = (), scores: list[float] | None = None) -> None:
    """scores: the pieces' own (SentencePiece merges the higher first); by default falling in their order."""
    writer.add_tokenizer_model("llama")
    writer.add_token_list(spm_vocab(pieces) + list(user_defined) + list(control))
    writer.add_token_scores([0.0] * 3 + [-1000.0] * 256 + (scores or [-float(i) for i in range(len(pieces))])
                            + [0.0] * (len(user_defined) + len(control)))
    writer.add_token_types(
        [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
        + [gguf.TokenType.BYTE] * 256
        + [gguf.TokenType.NORMAL] * len(pieces)
        + [gguf.TokenType.USER_DEFINED] * len(user_defined)
        + [gguf.TokenType.CONTROL] * len(control)
    )
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)


def finish(writer: gguf.GGUFWriter, tensors: dict[str, np.ndarray], path: Path) -> Path:
    for name, weights in tensors.items():
        writer.add_tensor(name, weights)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def row_tolerance(on_a_cpu: float) -> float:
    """How far a row computed in a batch of another shape (a tree's, a verification's, a recurrent state's
    after a rollback) may be from the same row decoded alone: on_a_cpu on a CPU; on a GPU 1e-2, as CUDA's
    kernels sum in another order for another shape (on an H200, 2026-11-27: 0.0099 in a tree's rows, 0.0086
    after a recurrent state's rollback, 1e-3 in a row's probabilities)."""
    return 1e-2 if supports_gpu_offload() else on_a_cpu

