"""Tiny DFlash drafters ("dflash") for the tiny llama targets of tinymodels, written with the gguf package.

A DFlash drafter is a few decoder layers, read without a causal mask: its cache holds, at each position
its target has decoded, a fusion (its `fc`) of the inputs of some of the target's layers, and a draft
reads the last token followed by mask tokens, predicting a token at each masked position. Keys, tensor
names and shapes are those of the pinned llama.cpp's src/models/dflash.cpp and src/llama-arch.cpp
(numpy shapes are ggml's reversed).
"""

from pathlib import Path

import gguf
import numpy as np

from tinymodels import LOWERCASE, N_EMBD, N_FF, add_spm_tokenizer, finish

ARCHITECTURE = "dflash"
TARGET_LAYERS = (0, 1)  # the tiny llama graph hands out its two layers' inputs
N_HEAD, HEAD = 4, 16  # as many KV heads: each copies a quarter of a token's embedding
BLOCK = 4  # a draft is at most BLOCK - 1 tokens
MASK = 0  # <unk> stands for the masked positions
KEY = 7  # the dimension of each head that queries and keys use: the slowest to turn under RoPE
ATTENTION = 5.0  # how sharply masked positions attend to real tokens
PASSED = 4.0  # how strongly the attention's output carries the token it read


def write_tiny_dflash(path: Path, target_weights: dict[str, np.ndarray], seed: int, layer_scale: float = 0.1,
                      pieces=LOWERCASE) -> Path:
    """For a target whose next token depends mostly on the last one (TinySpec.layer_scale), given its
    weights: every masked position attends to the one real token of the block (the last), copies its
    embedding, and the target's output layer predicts from it what the target will after that token,
    beside random weights scaled by layer_scale. The first drafted token is then accepted about as often
    as the target's next token follows from its last alone; the later ones where the target repeats.

    The drafter has its own token embeddings: the target's, with their first dimension set to +1 for
    real tokens and -1 for the mask, which is all that its queries and keys read."""
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return (rng.standard_normal(shape) * layer_scale / np.sqrt(shape[-1])).astype(np.float32)

    embeddings = target_weights["token_embd.weight"].copy()
    embeddings[:, 0] = np.float32(np.sqrt(N_EMBD))
    embeddings[MASK, 0] = -np.float32(np.sqrt(N_EMBD))
    query, key = np.zeros((N_HEAD * HEAD, N_EMBD), np.float32), np.zeros((N_HEAD * HEAD, N_EMBD), np.float32)
    for head in range(N_HEAD):
        query[head * HEAD + KEY, 0], key[head * HEAD + KEY, 0] = -1.0, 1.0
    # the target's hidden states, small, and none in the first dimension: their keys are zero
    fused_scale = np.full(N_EMBD, layer_scale, np.float32)
    fused_scale[0] = 0.0
    value = np.eye(N_EMBD, dtype=np.float32)
    value[0, 0] = 0.0  # the sign dimension is not passed on
    block = "blk.0"
    tensors = {
        "token_embd.weight": embeddings,
        "output.weight": target_weights["output.weight"],
        "fc.weight": normal(N_EMBD, len(TARGET_LAYERS) * N_EMBD),
        "enc.output_norm.weight": fused_scale,
        "output_norm.weight": np.ones(N_EMBD, np.float32),
        f"{block}.attn_norm.weight": np.ones(N_EMBD, np.float32),
        f"{block}.attn_q.weight": query + normal(N_HEAD * HEAD, N_EMBD),
        f"{block}.attn_k.weight": key,
        f"{block}.attn_v.weight": value,
        f"{block}.attn_output.weight": np.eye(N_EMBD, dtype=np.float32) * np.float32(PASSED),
        f"{block}.attn_q_norm.weight": np.full(HEAD, ATTENTION, np.float32),
        f"{block}.attn_k_norm.weight": np.ones(HEAD, np.float32),
        f"{block}.ffn_norm.weight": np.ones(N_EMBD, np.float32),
        f"{block}.ffn_gate.weight": normal(N_FF, N_EMBD),
        f"{block}.ffn_up.weight": normal(N_FF, N_EMBD),
        f"{block}.ffn_down.weight": normal(N_EMBD, N_FF),
    }
    writer = gguf.GGUFWriter(str(path), ARCHITECTURE)
    writer.add_name(path.stem)
    writer.add_context_length(512)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(1)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_key_length(HEAD)
    writer.add_value_length(HEAD)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_array(f"{ARCHITECTURE}.target_layers", list(TARGET_LAYERS))
    writer.add_uint32(f"{ARCHITECTURE}.block_size", BLOCK)
    writer.add_bool(f"{ARCHITECTURE}.attention.causal", False)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_spm_tokenizer(writer, pieces)
    writer.add_mask_token_id(MASK)
    return finish(writer, tensors, path)
