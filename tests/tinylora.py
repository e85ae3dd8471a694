"""Tiny LoRA adapters written with the gguf package, for the tiny llama-architecture models of tinymodels.py:
the tensors and metadata the pinned llama.cpp's src/llama-adapter.cpp reads (general.type adapter, adapter.type
lora, adapter.lora.alpha; a pair NAME.lora_a, NAME.lora_b for each weight it changes, numpy shapes (rank, in)
and (out, rank))."""

from pathlib import Path

import gguf
import numpy as np
from tinymodels import N_EMBD, N_FF, N_LAYER


def write_tiny_lora(path: Path, seed: int, strength: float = 2.0, rank: int = 4, architecture: str = "llama",
                    wrong_width: bool = False) -> Path:
    """strength: how far it moves the model (its weights' scale); wrong_width: made for a wider model."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(rank))
    rng = np.random.default_rng(seed)
    for layer in range(N_LAYER):
        for name, (inputs, outputs) in {"attn_q": (N_EMBD, N_EMBD), "attn_v": (N_EMBD, N_EMBD),
                                        "ffn_down": (N_FF, N_EMBD)}.items():
            inputs += 8 if wrong_width else 0
            down = rng.standard_normal((rank, inputs)) * strength / np.sqrt(inputs)
            up = rng.standard_normal((outputs, rank)) * strength / np.sqrt(rank)
            writer.add_tensor(f"blk.{layer}.{name}.weight.lora_a", down.astype(np.float32))
            writer.add_tensor(f"blk.{layer}.{name}.weight.lora_b", up.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_control_vector(path: Path, seed: int, strength: float = 0.3, width: int = N_EMBD,
                              names: tuple[str, ...] = ()) -> Path:
    """A control vector as llama.cpp's cvector-generator writes one: direction.1 .. direction.N_LAYER, one F32
    vector of the model's width each (names: other tensor names in their place)."""
    writer = gguf.GGUFWriter(str(path), "controlvector")
    writer.add_string("controlvector.model_hint", "llama")
    writer.add_uint32("controlvector.layer_count", N_LAYER)
    rng = np.random.default_rng(seed)
    for name in names or [f"direction.{layer}" for layer in range(1, N_LAYER + 1)]:
        writer.add_tensor(name, (rng.standard_normal(width) * strength).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
