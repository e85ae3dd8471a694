"""A tiny Qwen3-Reranker written with the gguf package: a causal language model of llama.cpp's architecture "qwen3"
(src/models/qwen3.cpp: llama's tensors plus a q and k norm a head) that pools by rank, as llama.cpp's converter
writes Qwen3-Reranker (conversion/qwen.py): pooling type RANK, classifier labels ["yes", "no"], a cls.output head
whose two rows are the language model's output rows of its "yes" and "no" tokens, and a chat template named "rerank"
with {query} and {document} in it. llama.cpp reads the last token of the filled-in template, applies the head and a
softmax (src/llama-graph.cpp, build_pooling), so the score is P(yes) over the two: what the same weights written as a
plain language model give from their own next-token logits (write_tiny_qwen3(reranker=False)).

Its vocabulary is tinymodels' SPM one (single characters) plus the template's control tokens; YES and NO are two of
its pieces, standing for Qwen3's "yes" and "no" tokens."""

from pathlib import Path

import gguf
import numpy as np
from tinymodels import N_EMBD, N_HEAD, N_LAYER, TinySpec, add_spm_tokenizer, attention_writer, finish, tiny_weights

CONTROL = ("<|im_start|>", "<|im_end|>")
RERANK_TEMPLATE = "<|im_start|>query: {query}\ndocument: {document}<|im_end|>\n<|im_start|>"
SPEC = TinySpec(seed=3, sharpness=2.0, control=CONTROL)
YES, NO = SPEC.vocab.index("y"), SPEC.vocab.index("n")


def write_tiny_qwen3(path: Path, reranker: bool = True) -> Path:
    tensors = tiny_weights(SPEC)
    for layer in range(N_LAYER):
        tensors[f"blk.{layer}.attn_q_norm.weight"] = np.ones(N_EMBD // N_HEAD, np.float32)
        tensors[f"blk.{layer}.attn_k_norm.weight"] = np.ones(N_EMBD // N_HEAD, np.float32)
    writer = attention_writer(path, "qwen3", 1e-6)
    writer.add_rope_freq_base(10000.0)
    add_spm_tokenizer(writer, SPEC.pieces, control=CONTROL)
    if reranker:
        tensors["cls.output.weight"] = tensors["output.weight"][[YES, NO]].copy()
        writer.add_pooling_type(gguf.PoolingType.RANK)
        writer.add_classifier_output_labels(["yes", "no"])
        writer.add_chat_template([{"name": "rerank", "template": RERANK_TEMPLATE}])
    return finish(writer, tensors, path)
