"""LoRA adapters on a model (llama.cpp's --lora): each loaded once beside its weights and applied to a context at
the scales asked, every sequence of the context alike. What a cache holds was computed under the scales applied
while it was read, so a change of them leaves no cache to reuse. And control vectors (--control-vector), added
to a context's layers' outputs."""

import ctypes
import hashlib
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..errors import ModelLoadError, UsageError
from .library import llama, recent_errors
from .model import Model, check_is_gguf


class Adapters:
    """The adapters loaded for a model, in order (their ids, as serve's /lora-adapters numbers them): scales is
    what a request naming none computes with."""

    def __init__(self, model: Model, paths: Sequence[Path], scales: Sequence[float]):
        self.paths = tuple(Path(path) for path in paths)
        self.scales = tuple(float(scale) for scale in scales)
        self._handles: list = []
        for path in self.paths:
            check_is_gguf(path, "LoRA adapter")
            recent_errors.clear()
            handle = llama.llama_adapter_lora_init(model.handle, str(path).encode())
            if not handle:
                reason = recent_errors[-1].split("lora adapter: ")[-1] if recent_errors else "damaged file?"
                raise ModelLoadError(f"llama.cpp could not load the LoRA adapter {path} for {model.path.name}:"
                                     f" {reason}")
            self._handles.append(handle)

    def __len__(self) -> int:
        return len(self.paths)

    def meta(self, index: int, key: str) -> str:
        """A value of an adapter's metadata as text ("" where it has none): adapter.lora.task_name, say."""
        text = ctypes.create_string_buffer(1024)
        written = llama.llama_adapter_meta_val_str(self._handles[index], key.encode(), text, len(text))
        return text.value.decode("utf-8", errors="replace") if written >= 0 else ""

    def scales_of(self, asked: Mapping[int, float] | None) -> tuple[float, ...]:
        """The scales a request computes with: those it names by adapter id, 0 for the others (llama-server's
        rule); None: the defaults. UsageError for an id no adapter has."""
        if asked is None:
            return self.scales
        for key, scale in asked.items():
            if not (isinstance(key, int) and 0 <= key < len(self)):
                loaded = f"ids 0 to {len(self) - 1}" if self.paths else "none: give serve --lora FILE"
                raise UsageError(f"lora: no adapter {key!r} is loaded ({loaded}; GET /lora-adapters lists them)",
                                 setting="lora")
            if not (isinstance(scale, (int, float)) and math.isfinite(scale)):
                raise UsageError(f"lora: adapter {key}'s scale is a number, got {scale!r}", setting="lora")
        return tuple(float(asked.get(key, 0.0)) for key in range(len(self)))

    def apply(self, context, scales: tuple[float, ...]) -> None:
        """Have the context compute with the adapters at these scales (those at 0 left out, as they add nothing)."""
        used = [(handle, scale) for handle, scale in zip(self._handles, scales) if scale != 0.0]
        handles = (llama.llama_adapter_lora_p_ctypes * max(1, len(used)))(*(handle for handle, _ in used))
        factors = (ctypes.c_float * max(1, len(used)))(*(scale for _, scale in used))
        if llama.llama_set_adapters_lora(context.handle, handles, len(used), factors) != 0:
            raise ModelLoadError("llama.cpp could not apply the LoRA adapters to the context")

    def variant(self, scales: tuple[float, ...]) -> str:
        """A name for what a cache computed under these scales holds ("" where no adapter applies)."""
        used = [f"{path.resolve()}={scale!r}" for path, scale in zip(self.paths, scales) if scale != 0.0]
        return "lora-" + hashlib.sha256("\n".join(used).encode()).hexdigest()[:8] if used else ""

    def close(self) -> None:
        for handle in self._handles:
            llama.llama_adapter_lora_free(handle)
        self._handles.clear()


def steer(context, directions: np.ndarray, layers: tuple[int, int]) -> None:
    """Add a control vector to the outputs of the context's layers from layers[0] to layers[1]: directions holds
    one row a layer from the first (layer 1's output; llama.cpp steers no input), the vectors given summed
    each times its scale."""
    rows = np.ascontiguousarray(directions, dtype=np.float32)
    width = rows.shape[1]
    if llama.llama_set_adapter_cvec(context.handle, rows.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), rows.size,
                                    width, layers[0], layers[1]) != 0:
        raise UsageError(f"llama.cpp could not add the control vector to {context.model.path.name}: its directions"
                         f" are {width} wide, the model's layers {context.model.layer_width}")
