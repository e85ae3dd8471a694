"""What this machine can run: backend, devices, memory, and whether a pair fits.

The estimate is deliberately simple and errs large: weights as stored in the
file, an f16 KV cache for the requested context, and a compute-buffer margin.
Refusing up front beats the OS killing the process halfway through loading.
"""

import os
import platform
import re
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

from ..engine import library, rpc
from ..engine.drafters.spec import LONGEST_DEFAULT_DRAFT
from ..engine.devices import Device, devices, supports_gpu_offload
from ..errors import UsageError
from .gguf_meta import GGUFInfo

KV_BYTES_PER_VALUE = 2  # llama.cpp's default f16 cache
F16_KV = (KV_BYTES_PER_VALUE, KV_BYTES_PER_VALUE)  # bytes a value of the K and V caches, f16's
RECURRENT_BYTES_PER_VALUE = 4  # a recurrent state is kept in f32
# Snapshots of a recurrent state llama.cpp keeps beside it, one for each token of the longest verification
# but its first (Context's n_rs_seq), so that a rejected draft can be taken back out of it
RECURRENT_SNAPSHOTS = LONGEST_DEFAULT_DRAFT
COMPUTE_MARGIN = 0.10  # of the weights, plus the fixed part below
COMPUTE_FIXED = 256 * 2**20  # on each device a model computes on
LOGIT_BYTES = 4  # a row of logits is f32: a GPU holding the output layer computes a batch of them
CPUINFO_FIELDS = ("vendor_id", "cpu family", "model", "model name", "stepping")


@dataclass(frozen=True)
class Machine:
    gpu_offload: bool
    rpc: bool  # whether this llama.cpp build can use other machines' workers (--rpc)
    devices: list[Device]
    ram_total: int
    ram_available: int
    cpu: str
    features: str

    @property
    def accelerator_free(self) -> int:
        return sum(d.free for d in self.devices if d.is_offload)

    @property
    def memory_free(self) -> int:
        """What models may use: free RAM and free accelerator memory."""
        return self.ram_available + self.accelerator_free


def gpu_offload() -> bool:
    """Whether this llama.cpp build can put layers on a GPU."""
    return supports_gpu_offload()


def machine(workers: Sequence[str] = ()) -> Machine:
    """This machine's devices and memory, and those of these RPC workers (HOST:PORT), greeted first:
    one that cannot be reached is refused before anything is counted."""
    rpc.Workers(workers)
    memory = psutil.virtual_memory()
    return Machine(
        gpu_offload=gpu_offload(),
        rpc=rpc.supports_rpc(),
        devices=devices(),
        ram_total=memory.total,
        ram_available=memory.available,
        cpu=platform.processor() or platform.machine(),
        features=cpu_features(library.system_info()),
    )


def describe() -> str:
    """This machine in a few words, for benchmark reports: its CPU and GPU devices, if any."""
    gpus = [d.description or d.name for d in devices() if d.is_offload] if gpu_offload() else []
    cores = f"{psutil.cpu_count(logical=False) or os.cpu_count()}-core {platform.machine()}"
    return ", ".join([cores, *gpus])


def identity() -> dict:
    """What a measurement of llama.cpp's speed on this machine depends on: the CPU and its features, the
    cores, the build of llama.cpp and the devices it computes on (not their free memory, which moves)."""
    return {"machine": platform.machine(), "cpu": _cpu_model(), "cores": os.cpu_count(),
            "llama_cpp": library.version(), "system_info": library.system_info(),
            "devices": [[d.name, d.description, d.kind] for d in devices()]}


def _cpu_model() -> str:
    """The CPU's maker, family and model where the system says them (llama.cpp's CPU device says only
    `AMD EPYC`, and some virtual machines give no model name)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            first = info.read().split("\n\n")[0]
    except OSError:  # not Linux
        return platform.processor()
    fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in first.splitlines())}
    return " | ".join(fields[key] for key in CPUINFO_FIELDS if key in fields)


def cpu_features(system_info: str) -> str:
    """llama.cpp's `CPU : SSE3 = 1 | AVX = 0 | ...` as the features it uses: `SSE3, AVX2, FMA`."""
    used = [name.strip() for name, _, value in (part.partition("=") for part in system_info.split("|"))
            if value.strip() == "1"]
    return ", ".join(name.rpartition(":")[2].strip() for name in used) or "none reported"


def kv_cache_bytes(info: GGUFInfo, n_ctx: int, kv: tuple[float, float] = F16_KV) -> int:
    """kv: bytes a value of the K and V caches takes (Runtime.kv_bytes)."""
    layers = info.arch("block_count", 0)
    heads = info.arch("attention.head_count", 1)
    kv_heads = info.arch("attention.head_count_kv", heads)
    key_length, value_length = head_lengths(info)
    if not isinstance(kv_heads, int):  # per-layer counts are stored as an array; take the worst case
        kv_heads = heads
    return int(layers * n_ctx * kv_heads * (key_length * kv[0] + value_length * kv[1]))


def head_lengths(info: GGUFInfo) -> tuple[int, int]:
    """Values of an attention head's key and of its value."""
    heads = info.arch("attention.head_count", 1)
    embedding = info.arch("embedding_length", 0)
    key_length = info.arch("attention.key_length", embedding // heads if heads else 0)
    return key_length, info.arch("attention.value_length", key_length)


def recurrent_state_bytes(info: GGUFInfo) -> int:
    """One sequence's recurrent state, as llama.cpp keeps it (f32), over the layers that have one (those
    without attention heads, where the file says which): Mamba's and gated delta nets' convolution and
    SSM states, LFM2's short-convolution cache. 0 for a model without one."""
    if not info.recurrent:
        return 0
    layers = info.arch("block_count", 0) - info.mtp_layers  # (counted among the blocks, with attention)
    kv_heads = info.numbers(f"{info.architecture}.attention.head_count_kv")
    interval = info.arch("full_attention_interval", 0)
    recurrent_layers = (sum(1 for heads in kv_heads if heads == 0) if kv_heads else
                        layers - layers // interval if interval else layers)
    inner, state = info.arch("ssm.inner_size", 0), info.arch("ssm.state_size", 0)
    convolution = max(0, info.arch("ssm.conv_kernel", 0) - 1) * (inner + 2 * info.arch("ssm.group_count", 0) * state)
    short_convolution = max(0, info.arch("shortconv.l_cache", 0) - 1) * info.arch("embedding_length", 0)
    return recurrent_layers * (convolution + state * inner + short_convolution) * RECURRENT_BYTES_PER_VALUE


def estimate_bytes(info: GGUFInfo, n_ctx: int, sequences: int = 1,
                   kv: tuple[float, float] = F16_KV) -> int:
    """n_ctx: every sequence's, together. A recurrent state is kept for each sequence, and, where
    llama.cpp can take rejected drafts back out of it, as many snapshots beside it as a draft is long."""
    # llama.cpp allocates the context asked for, even beyond what the model was trained on.
    states = sequences * (1 + RECURRENT_SNAPSHOTS if info.rolls_back else 1)
    return (int(info.file_size * (1 + COMPUTE_MARGIN)) + kv_cache_bytes(info, n_ctx, kv)
            + recurrent_state_bytes(info) * states + COMPUTE_FIXED)


@dataclass(frozen=True)
class LayerBytes:
    """A model's estimate (estimate_bytes) as llama.cpp's layers take it: each block's weights, first to last,
    and its share of the KV cache and recurrent states; the output layer's weights, and a tied embedding's
    copy, which llama.cpp makes only where the output layer is offloaded. The rest (the input layer, tensors
    -ot keeps on the CPU, a KV cache -nkvo keeps in RAM) stays on the CPU wherever the layers go. Weights as
    stored. compute: the compute buffer on the offload devices, what grows with the batch (a batch's logits,
    on the device that holds the output layer) beside a fixed part: not a share of the weights, as the RAM's
    estimate takes it, which for a 70B would leave gigabytes of a GPU unused."""

    blocks: tuple[int, ...]
    caches: tuple[int, ...]
    output: int
    output_copy: int
    total: int
    compute: int = COMPUTE_FIXED

    @property
    def layers(self) -> int:
        return len(self.blocks) + 1

    def _moved(self, gpu_layers: int) -> tuple[int, int]:
        """The weights and caches this many layers (-1: all) take off the CPU: the output layer, then the
        blocks from the last back, as llama.cpp offloads them."""
        n = self.layers if gpu_layers < 0 else min(gpu_layers, self.layers)
        if n == 0:
            return 0, 0
        first = len(self.blocks) - n + 1
        return self.output + sum(self.blocks[first:]), sum(self.caches[first:])

    def on_devices(self, gpu_layers: int) -> int:
        """Bytes on the offload devices with this many layers there (-1: all)."""
        weights, caches = self._moved(gpu_layers)
        return weights + self.output_copy + caches + self.compute if weights + caches else 0

    def least_on_devices(self, gpu_layers: int) -> int:
        """What they take there at the least: their weights and caches, no compute buffer."""
        weights, caches = self._moved(gpu_layers)
        return weights + caches + (self.output_copy if weights + caches else 0)

    def on_host(self, gpu_layers: int) -> int:
        weights, caches = self._moved(gpu_layers)
        return self.total - int(weights * (1 + COMPUTE_MARGIN)) - caches

    def fitting(self, room: int) -> int:
        """The most layers whose bytes fit in room on the offload devices: -1 where all of them do."""
        if self.on_devices(-1) <= room:
            return -1
        n = 0
        while n < self.layers and self.on_devices(n + 1) <= room:
            n += 1
        return n


def layer_bytes(info: GGUFInfo, n_ctx: int, sequences: int = 1, kv: tuple[float, float] = F16_KV,
                overrides: tuple[tuple[str, str], ...] = (), kv_offload: bool = True, batch: int = 512) -> LayerBytes:
    """info's estimate_bytes by llama.cpp's layers. overrides: -ot's (pattern, buffer type), the first pattern
    found deciding: a tensor kept on a CPU buffer stays on the CPU with its layer offloaded. batch: the most
    rows a decode computes (--batch-size)."""
    n_blocks = max(info.arch("block_count", 0) - info.mtp_layers, 0)
    blocks, output = [0] * n_blocks, 0
    kept = [(re.compile(pattern), buffer.upper().startswith("CPU")) for pattern, buffer in overrides]
    for name, size in info.tensor_bytes.items():
        if next((on_cpu for pattern, on_cpu in kept if pattern.search(name)), False):
            continue
        layer = name.split(".")[1] if name.startswith("blk.") else ""
        if layer.isdigit() and int(layer) < n_blocks:
            blocks[int(layer)] += size
        elif name.startswith("output"):
            output += size
    # tied embeddings: llama.cpp loads the token table again as the output layer's
    copy = info.tensor_bytes.get("token_embd.weight", 0) if "output.weight" not in info.tensor_bytes else 0
    states = sequences * (1 + RECURRENT_SNAPSHOTS if info.rolls_back else 1)
    caches = (kv_cache_bytes(info, n_ctx, kv) * n_blocks / max(info.arch("block_count", 0), 1) if kv_offload else 0
              ) + recurrent_state_bytes(info) * states  # the blocks' together, shared among them as an estimate
    return LayerBytes(tuple(blocks), tuple(int(caches / n_blocks) for _ in blocks), output, copy,
                      estimate_bytes(info, n_ctx, sequences, kv), COMPUTE_FIXED + batch * info.vocab_size * LOGIT_BYTES)


def estimate_pair(models: list[tuple[GGUFInfo | None, int | None]], n_ctx: int) -> int | None:
    """Bytes models need together, each given by its header once downloaded, else by its file size
    in the registry (the KV cache then unknown, so the compute margin stands in); None when a
    model's size is not known before it is downloaded."""
    needed = 0
    for info, size in models:
        if info is None and size is None:
            return None
        needed += estimate_bytes(info, n_ctx) if info else int(size * (1 + COMPUTE_MARGIN)) + COMPUTE_FIXED
    return needed


def check_fit(models: list[GGUFInfo], n_ctx: int, found: Machine | None = None, said: str = "",
              sequences: int = 1, target_kv: tuple[float, float] = F16_KV,
              draft_kv: tuple[float, float] = F16_KV) -> int:
    """Refuse, with advice, when the models cannot fit in memory; return the estimate. n_ctx: every
    sequence's, together; target_kv: the first model's KV cache's bytes a value; draft_kv: the others'."""
    needed = sum(estimate_bytes(info, n_ctx, sequences, target_kv if number == 0 else draft_kv)
                 for number, info in enumerate(models))
    _refuse_beyond(needed, " + ".join(info.path.name for info in models), n_ctx, found or machine(), said)
    return needed


def check_fit_before_download(models: list[tuple[str, int | None]], n_ctx: int, found: Machine | None = None) -> None:
    """Refuse before any byte is fetched when the models' sizes (name, bytes; None: not known before
    downloading, which counts for nothing here) already cannot fit; check_fit judges the files once
    they are there."""
    needed = sum(estimate_pair([(None, size)], n_ctx) or 0 for _, size in models)
    _refuse_beyond(needed, " + ".join(name for name, _ in models), n_ctx, found or machine(),
                   " (nothing was downloaded)")


def _refuse_beyond(needed: int, names: str, n_ctx: int, found: Machine, said: str = "") -> None:
    available = found.memory_free
    if needed > available:
        where = ", ".join([f"{found.ram_available / 2**30:.1f} GiB of RAM here"]
                          + [f"{d.free / 2**30:.1f} GiB on {d.name}" + (f" (the worker at {d.description})" if d.remote else "")
                             for d in found.devices if d.is_offload])
        raise UsageError(
            f"{names} need about {needed / 2**30:.1f} GiB at a context of {n_ctx} tokens but only"
            f" {available / 2**30:.1f} GiB are free ({where}){said}; try a smaller --ctx-size, a smaller"
            " quantization or model, a GPU build with --gpu-layers, or more workers (--rpc)"
        )


REBUILD_HINT = (
    "llama-cpp-python is built for the CPU only. For a GPU, rebuild it:\n"
    "  NVIDIA:  scripts/setup-venv --accelerator cuda     (needs the CUDA toolkit)\n"
    "  Apple:   scripts/setup-venv --accelerator metal\n"
    "  Vulkan:  scripts/setup-venv --accelerator vulkan   (needs the Vulkan SDK)"
)
