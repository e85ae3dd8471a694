"""The compute devices ggml sees (this machine's CPU and GPUs, and the devices of RPC workers once
added), as typed values: what every "is it a local GPU" question asks."""

import ctypes
from dataclasses import dataclass

from ..errors import UsageError
from .library import ggml

DEVICE_KINDS = {0: "CPU", 1: "GPU", 2: "integrated GPU", 3: "accelerator"}  # enum ggml_backend_dev_type
WORKER_KIND = "RPC worker"  # llama.cpp calls every worker's device a GPU, whatever the worker lends


@dataclass(frozen=True)
class Device:
    """A device: its name (CPU, CUDA0, RPC0), description (a worker's endpoint, for a remote one), kind,
    whether it is remote (an RPC worker's), and its free and total memory in bytes."""

    name: str
    description: str
    kind: str
    remote: bool
    free: int
    total: int

    @property
    def is_offload(self) -> bool:
        """Layers can be offloaded to it (llama.cpp's --device): anything but a CPU, a worker's too."""
        return self.kind != "CPU"

    @property
    def is_local_gpu(self) -> bool:
        """An offload device of this machine's own (not a worker's)."""
        return self.is_offload and not self.remote


def devices() -> list[Device]:
    """The compute devices ggml sees, in its order (llama.cpp's --tensor-split order)."""
    lib = ggml()
    found = []
    for i in range(lib.ggml_backend_dev_count()):
        device = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        lib.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
        remote = lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(device)) == b"RPC"
        found.append(Device(
            name=lib.ggml_backend_dev_name(device).decode(),
            description=lib.ggml_backend_dev_description(device).decode(),
            kind=WORKER_KIND if remote else DEVICE_KINDS.get(lib.ggml_backend_dev_type(device), "other"),
            remote=remote, free=free.value, total=total.value,
        ))
    return found


def supports_gpu_offload() -> bool:
    """Whether this machine has a GPU llama.cpp can put layers on (llama.cpp's own
    llama_supports_gpu_offload also says yes for any build with RPC, workers or not)."""
    return any(d.is_local_gpu for d in devices())


def splits_by_rows(name: str) -> bool:
    """Whether llama.cpp can split each weight by rows on this device (--split-mode row): its backend must
    offer a split buffer type. The pinned llama.cpp's CUDA backend offers none (an H200, 2026-11-29: the load
    failed, "device CUDA0 does not support split buffers")."""
    lib = ggml()
    device = lib.ggml_backend_dev_by_name(name.encode())
    return bool(device) and bool(lib.ggml_backend_reg_get_proc_address(lib.ggml_backend_dev_backend_reg(device),
                                                                       b"ggml_backend_split_buffer_type"))


def offload_array(names: tuple[str, ...]) -> ctypes.Array:
    """The NULL-terminated array of offload devices llama_model_params.devices takes; ("none",): none."""
    lib = ggml()
    offload = {lib.ggml_backend_dev_name(device).decode(): device
               for device in map(lib.ggml_backend_dev_get, range(lib.ggml_backend_dev_count()))
               if DEVICE_KINDS.get(lib.ggml_backend_dev_type(device)) != "CPU"}
    chosen = [] if tuple(names) == ("none",) else list(names)
    unknown = [name for name in chosen if name not in offload]
    if unknown:
        raise UsageError(f"no offload device named {', '.join(unknown)}; this build has:"
                         f" {', '.join(offload) or 'none (a CPU-only build)'}, or 'none' for the CPU alone")
    return (ctypes.c_void_p * (len(chosen) + 1))(*[offload[name] for name in chosen], None)


class _TensorOverride(ctypes.Structure):
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]  # llama_model_tensor_buft_override


def override_array(overrides: tuple[tuple[str, str], ...]) -> ctypes.Array:
    """The array, ended by an empty entry, that llama_model_params.tensor_buft_overrides takes: each (pattern,
    buffer type by name: CPU, CUDA0, ... as llama.cpp's -ot names them)."""
    lib = ggml()
    types = {lib.ggml_backend_buft_name(buft).decode(): buft
             for buft in (lib.ggml_backend_dev_buffer_type(lib.ggml_backend_dev_get(i))
                          for i in range(lib.ggml_backend_dev_count())) if buft}
    unknown = sorted({name for _, name in overrides if name not in types})
    if unknown:
        raise UsageError(f"--override-tensor: no buffer type named {', '.join(unknown)}; this build has:"
                         f" {', '.join(types)}")
    return (_TensorOverride * (len(overrides) + 1))(
        *[_TensorOverride(pattern.encode(), types[name]) for pattern, name in overrides], _TensorOverride(None, None))


def by_name(names) -> list[int]:
    """ggml's handles of these devices (for lending them over RPC)."""
    lib = ggml()
    return [lib.ggml_backend_dev_by_name(name.encode()) for name in names]
