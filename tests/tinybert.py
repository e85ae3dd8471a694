"""A tiny BERT embedding GGUF written with the gguf package (architecture `bert`, a WordPiece vocabulary,
mean pooling named in its metadata): an encoder that embeds and cannot generate, as nomic-embed,
bge and all-MiniLM files are. Tensor names and shapes are those of the pinned llama.cpp's
src/models/bert.cpp (numpy shapes are ggml's reversed)."""

from pathlib import Path

import gguf
import numpy as np

from tinymodels import finish

N_EMBD = 32
N_HEAD = 2
N_LAYER = 1
N_FF = 64
CONTEXT = 128
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
# llama.cpp's converter keeps WordPiece's word-initial pieces with a leading "▁" and its "##" pieces bare
VOCAB = SPECIAL + [f"\u2581{c}" for c in LETTERS] + list(LETTERS) + ["\u2581.", "\u2581,"]


def write_tiny_bert(path: Path, seed: int = 5, pooling: gguf.PoolingType = gguf.PoolingType.MEAN,
                    classifier: bool | None = None) -> Path:
    """pooling RANK: a reranker, with the classifier head that scores a pair (one value, not a vector); classifier:
    whether it has that head (by default where it pools by rank; the weights are the same either way)."""
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_name("tiny-bert")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_block_count(N_LAYER)
    writer.add_head_count(N_HEAD)
    writer.add_layer_norm_eps(1e-12)
    writer.add_causal_attention(False)
    writer.add_pooling_type(pooling)
    writer.add_token_type_count(2)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("bert")
    writer.add_token_list(VOCAB)
    writer.add_token_types([gguf.TokenType.CONTROL] * len(SPECIAL) + [gguf.TokenType.NORMAL] * (len(VOCAB) - len(SPECIAL)))
    writer.add_pad_token_id(0)
    writer.add_unk_token_id(1)
    writer.add_bos_token_id(2)  # [CLS]
    writer.add_sep_token_id(3)
    writer.add_eos_token_id(3)
    writer.add_mask_token_id(4)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)

    ones, zeros = np.ones(N_EMBD, np.float32), np.zeros(N_EMBD, np.float32)
    tensors = {"token_embd.weight": normal(len(VOCAB), N_EMBD), "token_types.weight": normal(2, N_EMBD),
               "position_embd.weight": normal(CONTEXT, N_EMBD),
               "token_embd_norm.weight": ones, "token_embd_norm.bias": zeros}
    for layer in range(N_LAYER):
        block = f"blk.{layer}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensors[f"{block}.{name}.weight"] = normal(N_EMBD, N_EMBD)
            tensors[f"{block}.{name}.bias"] = zeros
        tensors[f"{block}.attn_output_norm.weight"], tensors[f"{block}.attn_output_norm.bias"] = ones, zeros
        tensors[f"{block}.ffn_up.weight"], tensors[f"{block}.ffn_up.bias"] = normal(N_FF, N_EMBD), np.zeros(N_FF, np.float32)
        tensors[f"{block}.ffn_down.weight"], tensors[f"{block}.ffn_down.bias"] = normal(N_EMBD, N_FF), zeros
        tensors[f"{block}.layer_output_norm.weight"], tensors[f"{block}.layer_output_norm.bias"] = ones, zeros
    if pooling == gguf.PoolingType.RANK if classifier is None else classifier:
        tensors.update({"cls.weight": normal(N_EMBD, N_EMBD), "cls.bias": zeros, "cls.output.weight": normal(1, N_EMBD),
                        "cls.output.bias": np.zeros(1, np.float32)})
    return finish(writer, tensors, path)
