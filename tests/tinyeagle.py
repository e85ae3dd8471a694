"""Tiny EAGLE-3 drafters ("eagle3") for the tiny llama target of tinymodels, written with the gguf package.

An EAGLE-3 drafter is one decoder layer that reads, with each token, a fusion (its `fc`) of the inputs of
three of the target's layers, and borrows the target's token embeddings and output layer (llama.cpp's
ctx_other) unless it has its own. Tensor names, shapes and metadata keys are those of the pinned
llama.cpp's src/models/eagle3.cpp and src/llama-arch.cpp (numpy shapes are ggml's reversed).
"""

from pathlib import Path

import gguf
import numpy as np

from tinymodels import LOWERCASE, N_EMBD, N_FF, N_HEAD, add_spm_tokenizer, finish

ARCHITECTURE = "eagle3"
# The tiny llama graph hands out its layers' inputs but not its last hidden state, so every layer
# read is one of its two; the second twice.
TARGET_LAYERS = (0, 1, 1)
SELF_ATTENTION = 10.0  # how much more a token's query matches its own key than another token's
TOKEN_PASSED = 5.0  # how strongly the token's embedding is passed on through the attention's output


def write_tiny_eagle3(path: Path, seed: int, layer_scale: float = 0.3, pieces=LOWERCASE) -> Path:
    """For a target whose layers add little to their input (TinySpec.layer_scale), so that its next token
    depends mostly on the last one: the drafter's attention reads mostly its own position's token
    embedding (the token after the hidden states'), passes it on, and the target's output layer predicts
    from it what the target will, beside random weights scaled by layer_scale. Its drafts are then
    accepted about a third of the time, where random weights' almost never are."""
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return (rng.standard_normal(shape) * layer_scale / np.sqrt(shape[-1])).astype(np.float32)

    fused = normal(N_EMBD, len(TARGET_LAYERS) * N_EMBD)
    token_only = np.hstack([np.eye(N_EMBD), np.zeros((N_EMBD, N_EMBD))]).astype(np.float32)
    block = "blk.0"
    tensors = {
        "fc.weight": fused,
        f"{block}.attn_norm.weight": np.ones(N_EMBD, np.float32),  # of the token's embedding
        f"{block}.attn_norm_2.weight": np.ones(N_EMBD, np.float32),  # of the fused hidden state
        # attention reads both, side by side
        f"{block}.attn_q.weight": token_only * np.float32(SELF_ATTENTION) + normal(N_EMBD, 2 * N_EMBD),
        **{f"{block}.{name}.weight": token_only + normal(N_EMBD, 2 * N_EMBD) for name in ("attn_k", "attn_v")},
        f"{block}.attn_output.weight": np.eye(N_EMBD, dtype=np.float32) * np.float32(TOKEN_PASSED) + normal(N_EMBD, N_EMBD),
        f"{block}.ffn_norm.weight": np.ones(N_EMBD, np.float32),
        f"{block}.ffn_gate.weight": normal(N_FF, N_EMBD),
        f"{block}.ffn_up.weight": normal(N_FF, N_EMBD),
        f"{block}.ffn_down.weight": normal(N_EMBD, N_FF),
        "output_norm.weight": np.ones(N_EMBD, np.float32),
    }
    writer = gguf.GGUFWriter(str(path), ARCHITECTURE)
    writer.add_name(path.stem)
    writer.add_context_length(512)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(1)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_array(f"{ARCHITECTURE}.target_layers", list(TARGET_LAYERS))
    writer.add_uint32(f"{ARCHITECTURE}.target_hidden_size", N_EMBD)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_spm_tokenizer(writer, pieces)
    return finish(writer, tensors, path)
