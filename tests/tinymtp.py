"""Tiny Qwen3.5-architecture GGUFs ("qwen35") with one multi-token-prediction (MTP, "nextn") block.

Qwen3.5 is the dense architecture whose MTP block the pinned llama.cpp runs (src/models/qwen35.cpp).
Its trunk is a hybrid: a gated delta-net layer (a recurrent state) and a gated full-attention layer,
each followed by a SwiGLU FFN. The MTP block, the last of block_count, is a full-attention block
plus nextn.eh_proj, which mixes the next token's embedding with the trunk's last hidden state.
Weights are random but seeded, F32; the tokenizer is tinymodels'. Shapes are numpy's (ggml's reversed).
"""

from pathlib import Path

import gguf
import numpy as np

from tinymodels import LOWERCASE, N_EMBD, N_FF, add_spm_tokenizer, finish, spm_vocab

ARCHITECTURE = "qwen35"
N_HEAD, N_HEAD_KV, HEAD_DIM = 4, 2, 16
TRUNK = 2  # blk.0 gated delta net (recurrent), blk.1 full attention; blk.2 is the MTP block
FULL_ATTENTION_INTERVAL = 2
STATE, GROUPS, V_HEADS, CONV = 16, 2, 2, 4  # delta net: head size, k heads, v heads, conv kernel


def _tensors(seed: int, n_vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float32)

    def ones(n):
        return np.ones(n, np.float32)

    def attention(block):
        t[f"{block}.attn_q.weight"] = normal(2 * N_HEAD * HEAD_DIM, N_EMBD)  # each head's query and its gate
        t[f"{block}.attn_k.weight"] = normal(N_HEAD_KV * HEAD_DIM, N_EMBD)
        t[f"{block}.attn_v.weight"] = normal(N_HEAD_KV * HEAD_DIM, N_EMBD)
        t[f"{block}.attn_output.weight"] = normal(N_EMBD, N_HEAD * HEAD_DIM)
        t[f"{block}.attn_q_norm.weight"] = ones(HEAD_DIM)
        t[f"{block}.attn_k_norm.weight"] = ones(HEAD_DIM)

    def common(block):
        t[f"{block}.attn_norm.weight"] = ones(N_EMBD)
        t[f"{block}.post_attention_norm.weight"] = ones(N_EMBD)
        t[f"{block}.ffn_gate.weight"] = normal(N_FF, N_EMBD)
        t[f"{block}.ffn_up.weight"] = normal(N_FF, N_EMBD)
        t[f"{block}.ffn_down.weight"] = normal(N_EMBD, N_FF)

    key_dim, value_dim = STATE * GROUPS, STATE * V_HEADS
    t = {"token_embd.weight": normal(n_vocab, N_EMBD, scale=np.sqrt(N_EMBD))}
    for layer in range(TRUNK):
        block = f"blk.{layer}"
        common(block)
        if (layer + 1) % FULL_ATTENTION_INTERVAL:  # gated delta net
            t[f"{block}.attn_qkv.weight"] = normal(2 * key_dim + value_dim, N_EMBD)
            t[f"{block}.attn_gate.weight"] = normal(value_dim, N_EMBD)
            t[f"{block}.ssm_conv1d.weight"] = normal(2 * key_dim + value_dim, CONV)
            t[f"{block}.ssm_dt.bias"] = np.zeros(V_HEADS, np.float32)
            t[f"{block}.ssm_a"] = -np.exp(rng.uniform(-1.0, 0.5, V_HEADS)).astype(np.float32)  # decays; no .weight
            t[f"{block}.ssm_beta.weight"] = normal(V_HEADS, N_EMBD)
            t[f"{block}.ssm_alpha.weight"] = normal(V_HEADS, N_EMBD)
            t[f"{block}.ssm_norm.weight"] = ones(STATE)
            t[f"{block}.ssm_out.weight"] = normal(N_EMBD, value_dim)
        else:
            attention(block)
    t["output_norm.weight"] = ones(N_EMBD)
    t["output.weight"] = normal(n_vocab, N_EMBD)
    mtp = f"blk.{TRUNK}"
    common(mtp)
    attention(mtp)
    t[f"{mtp}.nextn.eh_proj.weight"] = normal(N_EMBD, 2 * N_EMBD)  # [normed embedding | normed hidden state]
    t[f"{mtp}.nextn.enorm.weight"] = ones(N_EMBD)
    t[f"{mtp}.nextn.hnorm.weight"] = ones(N_EMBD)
    t[f"{mtp}.nextn.shared_head_norm.weight"] = ones(N_EMBD)
    return t


def write_tiny_mtp_model(path: Path, seed: int, sharpness: float = 1.0, layer_scale: float = 1.0,
                         pieces=LOWERCASE, part: str = "whole") -> Path:
    """layer_scale < 1 shrinks what every block adds to its input, so each hidden state stays close
    to its token's embedding and the next token depends mostly on the last one; with the MTP block
    reading the next token's embedding (eh_proj passing it through) it then predicts what the target
    will: its drafts are mostly accepted, not mostly rejected as random weights' are.

    part: "whole"; "trunk", the model built without its MTP block (as ggml-org publishes Qwen3.6);
    or "sidecar", the MTP block alone in a file of its own (its `mtp-` file: no trunk layers, which
    llama.cpp's qwen35 loader takes as an MTP-only file)."""
    tensors = _tensors(seed, len(spm_vocab(pieces)))
    if layer_scale != 1.0:
        for name, weights in tensors.items():
            if name.startswith("blk.") and weights.ndim == 2:
                tensors[name] = weights * np.float32(layer_scale)
        tensors[f"blk.{TRUNK}.nextn.eh_proj.weight"] = np.hstack([np.eye(N_EMBD), np.zeros((N_EMBD, N_EMBD))]
                                                                 ).astype(np.float32)
    tensors["output.weight"] = tensors["output.weight"] * np.float32(sharpness)
    tensors["output.weight"][:3] = 0.0  # as tinymodels: end of text possible, rarely chosen greedily
    trunk = tuple(f"blk.{layer}." for layer in range(TRUNK))
    if part == "trunk":
        tensors = {name: weights for name, weights in tensors.items() if not name.startswith(f"blk.{TRUNK}.")}
    elif part == "sidecar":
        tensors = {name: weights for name, weights in tensors.items() if not name.startswith(trunk)}
    a = ARCHITECTURE
    writer = gguf.GGUFWriter(str(path), a)
    writer.add_name(path.stem)
    writer.add_context_length(512)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(TRUNK if part == "trunk" else TRUNK + 1)
    if part != "trunk":
        writer.add_uint32(f"{a}.nextn_predict_layers", 1)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_dimension_sections([3, 3, 2, 0])
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_uint32(f"{a}.full_attention_interval", FULL_ATTENTION_INTERVAL)
    writer.add_uint32(f"{a}.ssm.conv_kernel", CONV)
    writer.add_uint32(f"{a}.ssm.inner_size", STATE * V_HEADS)
    writer.add_uint32(f"{a}.ssm.state_size", STATE)
    writer.add_uint32(f"{a}.ssm.time_step_rank", V_HEADS)
    writer.add_uint32(f"{a}.ssm.group_count", GROUPS)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    add_spm_tokenizer(writer, pieces)
    return finish(writer, tensors, path)
