"""Where the models run: decided once, before anything loads, from the runtime settings, the GGUF
headers and the devices llama.cpp sees (this machine's and its RPC workers'). A Session loads as its
Placement says; `run --json`'s placement, doctor's table and the memory-fit refusal read the same.

Layers are counted as llama.cpp counts them: the blocks (without multi-token-prediction blocks, which
llama.cpp keeps apart) and the output layer.
"""

from dataclasses import dataclass

from . import hardware
from ..config import KV_CACHE_TYPES, Runtime
from ..errors import UsageError
from ..engine.devices import Device, splits_by_rows
from .gguf_meta import GGUFInfo


def layer_count(info: GGUFInfo) -> int:
    return info.arch("block_count", 0) - info.mtp_layers + 1


@dataclass(frozen=True)
class ModelPlacement:
    """One model's layers: gpu_layers as asked of llama.cpp (-1: all), on the offload devices it may
    use (`offload`, in llama.cpp's order: workers' first), `devices` as named to llama.cpp (None: every
    one), shared among them by tensor_split (None: by free memory); the rest on this machine's CPU."""

    file: str
    layers: int
    gpu_layers: int
    offload: tuple[str, ...]
    devices: tuple[str, ...] | None = None
    tensor_split: tuple[float, ...] | None = None

    @property
    def layers_on_gpu(self) -> int:
        if not self.offload:
            return 0
        return self.layers if self.gpu_layers < 0 else min(self.gpu_layers, self.layers)

    @property
    def held_by(self) -> list[str]:
        """The devices that hold its layers, this machine's CPU included where it keeps some."""
        on_gpu = self.layers_on_gpu
        return (list(self.offload) if on_gpu else []) + (["CPU"] if on_gpu < self.layers else [])

    def as_dict(self) -> dict:
        """For `run --json`: file, layers, layers_on_gpu, devices."""
        return {"file": self.file, "layers": self.layers, "layers_on_gpu": self.layers_on_gpu, "devices": self.held_by}

    def as_layers(self) -> dict:
        """For doctor's table: layers, offloaded, devices."""
        return {"layers": self.layers, "offloaded": self.layers_on_gpu, "devices": self.held_by}


def _offload(found: list[Device], devices: tuple[str, ...] | None, runtime: Runtime,
             one_gpu: bool = True) -> tuple[str, ...]:
    """The offload devices a model named so may use, as llama.cpp orders them: as named, else the workers' first;
    with --split-mode none (and one_gpu), the --main-gpu among them alone."""
    names = [d.name for d in found if d.remote] + [d.name for d in found if d.is_local_gpu]
    offload = tuple(names if devices is None else (name for name in devices if name in names))
    if runtime.split_mode == "row":
        unsplit = [name for name in offload if not splits_by_rows(name)]
        if unsplit:
            raise UsageError(f"--split-mode row: this llama.cpp cannot split weights by rows on {', '.join(unsplit)}"
                             " (its load fails: \"does not support split buffers\"); --split-mode layer, the default,"
                             " splits the layers across GPUs, tensor the weights and KV cache")
    if runtime.split_mode != "none" or not one_gpu or not offload:
        return offload
    if runtime.main_gpu >= len(offload):
        raise UsageError(f"--main-gpu {runtime.main_gpu}: the model may use {len(offload)} GPU(s), numbered from 0:"
                         f" {', '.join(offload)}")
    return (offload[runtime.main_gpu],)


def place_target(runtime: Runtime, info: GGUFInfo, machine: hardware.Machine) -> ModelPlacement:
    """The target: as asked; with workers and no --gpu-layers, all layers offloaded where this machine
    has a GPU (llama.cpp splits them by free memory, the workers' included), else the workers' share of
    the free memory, the rest staying on this machine's CPU."""
    layers = layer_count(info)
    gpu_layers = runtime.gpu_layers
    if gpu_layers is None:  # (only with --rpc)
        remote = sum(d.free for d in machine.devices if d.remote)
        local = machine.ram_available
        gpu_layers = (-1 if any(d.is_local_gpu for d in machine.devices) or not remote + local
                      else round(layers * remote / (remote + local)))
    return ModelPlacement(info.path.name, layers, gpu_layers, _offload(machine.devices, runtime.devices, runtime),
                          runtime.devices, runtime.tensor_split)


def place_draft(runtime: Runtime, info: GGUFInfo, machine: hardware.Machine) -> ModelPlacement:
    """The draft model: as asked, else (with workers) anywhere but a worker's devices, so that no
    network sits in the drafting loop. --split-mode none and --main-gpu are the target's, and the draft's too
    where its devices are not named (llama.cpp's draft splits by layers over those it is given)."""
    devices = runtime.draft_devices
    if devices is None and runtime.rpc:
        devices = tuple(d.name for d in machine.devices if d.is_local_gpu) or ("none",)
    return ModelPlacement(info.path.name, layer_count(info), runtime.draft_gpu_layers,
                          _offload(machine.devices, devices, runtime, one_gpu=devices is None), devices)


@dataclass(frozen=True)
class Placement:
    """Where a target (and draft model) run, and whether they fit: what a Session loads by.
    backend_sampling: as Context takes it (True: every chain in the decode graph; None: argmax chains only)."""

    target: ModelPlacement
    draft: ModelPlacement | None
    backend_sampling: bool | None
    models: tuple[GGUFInfo, ...]
    n_ctx: int  # every sequence's, together
    machine: hardware.Machine
    parallel: int = 1
    kv: tuple[float, float] = hardware.F16_KV  # the target's, a value
    draft_kv: tuple[float, float] = hardware.F16_KV

    @classmethod
    def plan(cls, runtime: Runtime, target: GGUFInfo, draft: GGUFInfo | None = None,
             machine: hardware.Machine | None = None) -> "Placement":
        """machine: what hardware.machine() says now (RPC workers added first)."""
        machine = machine or hardware.machine()
        check_cache_types(target, runtime.cache_type_k, runtime.cache_type_v)
        if draft:
            check_cache_types(draft, runtime.draft_cache_type_k, runtime.draft_cache_type_v, "-draft")
        placed = place_target(runtime, target, machine)
        backend_sampling = runtime.backend_sampling
        if backend_sampling is None and placed.gpu_layers != 0 and any(d.is_local_gpu for d in machine.devices):
            backend_sampling = True  # else (None) the context samples only greedy rows in the graph
        if runtime.parallel > 1:  # each sequence its own chain, on the host (Context.sequence)
            backend_sampling = False
        parallel = max(1, runtime.parallel)
        return cls(placed, place_draft(runtime, draft, machine) if draft else None, backend_sampling,
                   (target,) + ((draft,) if draft else ()), runtime.ctx_size * parallel, machine, parallel,
                   runtime.kv_bytes, runtime.draft_kv_bytes)

    def check_fit(self) -> int:
        """Refuse, with advice, when the models cannot fit in memory; return the estimate."""
        said = (f" ({self.parallel} sequences of {self.n_ctx // self.parallel} tokens; a smaller --parallel needs less)"
                if self.parallel > 1 else "")
        return hardware.check_fit(list(self.models), self.n_ctx, self.machine, said, self.parallel, self.kv,
                                  self.draft_kv)

    def report(self, draft: bool, sampling: str, drafting: str) -> dict:
        """For `run --json`: where each model runs (the draft's where one drafts) and where its rows
        were sampled (for the latest generation), and how it drafts."""
        out = {"target": self.target.as_dict()}
        if draft and self.draft:
            out["draft"] = self.draft.as_dict()
        return out | {"sampling": sampling, "drafting": drafting}


def check_cache_types(model: GGUFInfo, k: str, v: str, of: str = "") -> None:
    """Refuse a quantized KV cache whose blocks do not divide the model's heads (llama.cpp fails to make the
    context, or asserts in a multiplication). of: the options' ending (-draft for the draft's)."""
    options = (f"--cache-type-k{of}", f"--cache-type-v{of}")
    for option, kind, length in zip(options, (k, v), hardware.head_lengths(model)):
        values = KV_CACHE_TYPES[kind][1]
        if length % values:
            raise UsageError(f"{option} {kind} stores blocks of {values} values, which do not divide"
                             f" {model.path.name}'s attention heads of {length}: use f16 (or f32, bf16) for it")


def pair_row(target: str, draft: str, target_model: tuple[GGUFInfo | None, int | None],
             draft_model: tuple[GGUFInfo | None, int | None], runtime: Runtime, machine: hardware.Machine,
             ctx_size: int) -> dict:
    """Doctor's row for a registry pair, each model given by its header once downloaded (else None) and
    its size in the registry: what they need together at a context of ctx_size tokens, whether that fits
    here, and where each one's layers go as runtime places them (None until it is downloaded)."""
    needed = hardware.estimate_pair([target_model, draft_model], ctx_size)
    (target_info, _), (draft_info, _) = target_model, draft_model
    return dict(target=target, draft=draft, needed=needed,
                fits=None if needed is None else needed <= machine.memory_free,
                target_layers=place_target(runtime, target_info, machine).as_layers() if target_info else None,
                draft_layers=place_draft(runtime, draft_info, machine).as_layers() if draft_info else None)
