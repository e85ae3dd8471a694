"""Tiny Gemma 4 GGUFs: a target ("gemma4") and the assistant drafter published beside it
("gemma4-assistant", as ggml-org's mtp-gemma-4-*.gguf), written with the gguf package.

The target alternates sliding-window and full-attention layers, as Gemma 4 does (its last two layers
sliding then full: the assistant reads their KV cache). The assistant has no KV cache of its own: it
reads the target's (llama.cpp's ctx_other), its input is the target's embedding of a token beside
the target's last hidden state, and its logits come from an output layer of its own. Keys, tensor names
and shapes are those of the pinned llama.cpp's src/models/gemma4*.cpp (numpy shapes are ggml's reversed).
"""

from pathlib import Path

import gguf
import numpy as np

from tinymodels import LOWERCASE, N_EMBD, N_FF, add_spm_tokenizer, finish, spm_vocab

N_HEAD, N_HEAD_KV = 4, 2
HEAD_FULL, HEAD_SWA = 32, 16  # key and value widths of full-attention and sliding-window layers
WINDOW = 16
PATTERN = (True, True, True, False)  # per layer: sliding window?
ASSISTANT_EMBD = 2 * N_EMBD  # its own width (llama.cpp requires one other than the target's)
ASSISTANT_PATTERN = (True, False)


def _normal(rng, scale=1.0):
    def normal(*shape):
        return (rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float32)
    return normal


def _attention_keys(writer: gguf.GGUFWriter, pattern) -> None:
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_key_length(HEAD_FULL)
    writer.add_value_length(HEAD_FULL)
    writer.add_key_length_swa(HEAD_SWA)
    writer.add_value_length_swa(HEAD_SWA)
    writer.add_rope_dimension_count(HEAD_FULL)
    writer.add_rope_dimension_count_swa(HEAD_SWA)  # its default, the full layers' count, aborts llama.cpp
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_rope_freq_base_swa(10_000.0)
    writer.add_sliding_window(WINDOW)
    writer.add_sliding_window_pattern(list(pattern))
    writer.add_layer_norm_rms_eps(1e-6)


def _layers(tensors: dict, normal, pattern, width: int, ff: int, own_kv: bool) -> None:
    for layer, sliding in enumerate(pattern):
        block, head = f"blk.{layer}", HEAD_SWA if sliding else HEAD_FULL
        tensors[f"{block}.attn_norm.weight"] = np.ones(width, np.float32)
        tensors[f"{block}.attn_q.weight"] = normal(N_HEAD * head, width)
        tensors[f"{block}.attn_q_norm.weight"] = np.ones(head, np.float32)
        if own_kv:
            tensors[f"{block}.attn_k.weight"] = normal(N_HEAD_KV * head, width)
            tensors[f"{block}.attn_v.weight"] = normal(N_HEAD_KV * head, width)
            tensors[f"{block}.attn_k_norm.weight"] = np.ones(head, np.float32)
        tensors[f"{block}.attn_output.weight"] = normal(width, N_HEAD * head)
        tensors[f"{block}.post_attention_norm.weight"] = np.ones(width, np.float32)
        tensors[f"{block}.layer_output_scale.weight"] = np.ones(1, np.float32)
        tensors[f"{block}.ffn_norm.weight"] = np.ones(width, np.float32)
        tensors[f"{block}.ffn_gate.weight"] = normal(ff, width)
        tensors[f"{block}.ffn_up.weight"] = normal(ff, width)
        tensors[f"{block}.ffn_down.weight"] = normal(width, ff)
        tensors[f"{block}.post_ffw_norm.weight"] = np.ones(width, np.float32)


def _output(seed: int, n_vocab: int, sharpness: float) -> np.ndarray:
    output = _normal(np.random.default_rng(seed))(n_vocab, N_EMBD) * np.float32(sharpness)
    output[:3] = 0.0  # as tinymodels: end of text possible, rarely chosen greedily
    return output


def write_tiny_gemma4(path: Path, seed: int, sharpness: float = 2.0, layer_scale: float = 0.3,
                      pieces=LOWERCASE) -> Path:
    """layer_scale < 1 shrinks the layers' weights: the next token then depends mostly on the last one,
    which the tiny assistant predicts."""
    rng = np.random.default_rng(seed)
    normal = _normal(rng)
    n_vocab = len(spm_vocab(pieces))
    tensors = {"token_embd.weight": normal(n_vocab, N_EMBD) * np.float32(np.sqrt(N_EMBD)),
               "output_norm.weight": np.ones(N_EMBD, np.float32),
               "rope_freqs.weight": np.ones(HEAD_FULL // 2, np.float32),
               "output.weight": _output(seed + 1000, n_vocab, sharpness)}
    _layers(tensors, _normal(rng, layer_scale), PATTERN, N_EMBD, N_FF, own_kv=True)
    writer = gguf.GGUFWriter(str(path), "gemma4")
    writer.add_name(path.stem)
    writer.add_context_length(512)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(len(PATTERN))
    writer.add_feed_forward_length(N_FF)
    _attention_keys(writer, PATTERN)
    writer.add_embedding_length_per_layer_input(0)  # no per-layer embeddings
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_spm_tokenizer(writer, pieces)
    return finish(writer, tensors, path)


def write_tiny_assistant(path: Path, target_seed: int, seed: int, sharpness: float = 2.0, layer_scale: float = 0.3,
                         pieces=LOWERCASE) -> Path:
    """For write_tiny_gemma4(target_seed): its input projection passes the token's embedding through
    (beside random weights scaled by layer_scale), and its output layer is the target's, padded to its
    width: it predicts what the target's first guess from the token alone would be."""
    rng = np.random.default_rng(seed)
    normal = _normal(rng, layer_scale)
    n_vocab = len(spm_vocab(pieces))
    into = normal(ASSISTANT_EMBD, 2 * N_EMBD)  # [target's token embedding | target's hidden state]
    into[:N_EMBD, :N_EMBD] += np.eye(N_EMBD, dtype=np.float32)
    head = np.zeros((n_vocab, ASSISTANT_EMBD), np.float32)
    head[:, :N_EMBD] = _output(target_seed + 1000, n_vocab, sharpness)
    tensors = {"token_embd.weight": head,  # its output layer (llama.cpp ties it)
               "output_norm.weight": np.ones(ASSISTANT_EMBD, np.float32),
               "nextn.pre_projection.weight": into,
               "nextn.post_projection.weight": normal(N_EMBD, ASSISTANT_EMBD),  # its hidden state, as the next step reads it
               "rope_freqs.weight": np.ones(HEAD_FULL // 2, np.float32)}
    _layers(tensors, normal, ASSISTANT_PATTERN, ASSISTANT_EMBD, 2 * N_FF, own_kv=False)
    writer = gguf.GGUFWriter(str(path), "gemma4-assistant")
    writer.add_name(path.stem)
    writer.add_context_length(512)
    writer.add_embedding_length(ASSISTANT_EMBD)
    writer.add_embedding_length_out(N_EMBD)  # the target's width
    writer.add_block_count(len(ASSISTANT_PATTERN))
    writer.add_nextn_predict_layers(len(ASSISTANT_PATTERN))  # all its layers draft
    writer.add_feed_forward_length(2 * N_FF)
    _attention_keys(writer, ASSISTANT_PATTERN)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_spm_tokenizer(writer, pieces)
    return finish(writer, tensors, path)
