"""Where the models run: decided once, before anything loads, from the runtime settings, the GGUF
headers and the devices llama.cpp sees (this machine's and its RPC workers'). A Session loads as its
Placement says; `run --json`'s placement, doctor's table and the memory-fit refusal read the same.

Layers are counted as llama.cpp counts them: the blocks (without multi-token-prediction blocks, which
llama.cpp keeps apart) and the output layer.
"""

from dataclasses import dataclass, replace
from pathlib import Path

from . import hardware
from ..config import KV_CACHE_TYPES, PARALLEL_AUTO_MOST, Runtime
from ..errors import UsageError
from ..engine.devices import Device, splits_by_rows
from .gguf_meta import GGUFInfo


@dataclass(frozen=True)
class ModelPlacement:
    """One model's layers: gpu_layers as asked of llama.cpp (-1: all), on the offload devices it may
    use (`offload`, in llama.cpp's order: workers' first), `devices` as named to llama.cpp (None: every
    one), shared among them by tensor_split (None: by free memory); the rest on this machine's CPU.
    sizes: its estimate by layers; by: how gpu_layers was decided: asked, fit (auto: as many as the devices' free
    memory holds) or share (auto with workers and no GPU here: their share of the free memory)."""

    file: str
    layers: int
    gpu_layers: int
    offload: tuple[str, ...]
    devices: tuple[str, ...] | None = None
    tensor_split: tuple[float, ...] | None = None
    sizes: hardware.LayerBytes | None = None
    by: str = "asked"

    @property
    def layers_on_gpu(self) -> int:
        if not self.offload:
            return 0
        return self.layers if self.gpu_layers < 0 else min(self.gpu_layers, self.layers)

    @property
    def on_gpu(self) -> float:
        """The share of its layers on the offload devices."""
        return self.layers_on_gpu / self.layers

    @property
    def on_devices(self) -> int:
        """Its estimated bytes on the offload devices."""
        return self.sizes.on_devices(self.layers_on_gpu) if self.sizes else 0

    @property
    def on_host(self) -> int:
        return self.sizes.on_host(self.layers_on_gpu) if self.sizes else 0

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


def room(machine: hardware.Machine, offload: tuple[str, ...], margin: int) -> int | None:
    """Free bytes on these offload devices, margin left free on each; None where one says nothing of its
    memory (0 of 0 bytes, as some backends report)."""
    used = [d for d in machine.devices if d.name in offload]
    if any(not d.total for d in used):
        return None
    return sum(max(0, d.free - margin) for d in used)


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


def place_target(runtime: Runtime, info: GGUFInfo, machine: hardware.Machine, n_ctx: int | None = None,
                 sequences: int = 1, beside: ModelPlacement | None = None) -> ModelPlacement:
    """The target: as asked; auto (gpu_layers None): as many layers as the free memory of its offload devices
    holds beside the draft model placed there first (`beside`), or, with workers and no GPU here, the
    workers' share of the free memory (all of it counted), the rest staying on this machine's CPU. n_ctx:
    every sequence's together (None: runtime's)."""
    offload = _offload(machine.devices, runtime.devices, runtime)
    # (a draft tree's nodes take a batch of cells beyond the sequences' own, as Context makes room for them)
    sizes = hardware.layer_bytes(info, (n_ctx or runtime.ctx_size) + runtime.prompt_batch, sequences, runtime.kv_bytes,
                                 runtime.tensor_overrides, runtime.kv_offload, runtime.prompt_batch)
    if runtime.gpu_layers is None and offload and not any(d.is_local_gpu for d in machine.devices):
        remote = sum(d.free for d in machine.devices if d.remote)
        share = remote / (remote + machine.ram_available) if remote + machine.ram_available else 1
        return ModelPlacement(info.path.name, sizes.layers, round(sizes.layers * share), offload, runtime.devices,
                              runtime.tensor_split, sizes, "share")
    free = room(machine, offload, runtime.fit_margin)
    if free is not None and beside and set(beside.offload) & set(offload):
        free -= beside.on_devices
    if free is not None and runtime.mmproj and runtime.mmproj_offload:
        free -= _file_bytes(runtime.mmproj)  # (libmtmd puts the projector's weights on the GPU beside the layers)
    return _placed(info, sizes, runtime.gpu_layers, offload, runtime.devices, runtime.tensor_split, free)


def _file_bytes(path: str) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:  # (not fetched yet: it is counted when the pair is placed to load)
        return 0


def place_draft(runtime: Runtime, info: GGUFInfo, machine: hardware.Machine, n_ctx: int | None = None,
                sequences: int = 1) -> ModelPlacement:
    """The draft model: as asked (auto: all its layers where they fit, placed before the target's, which take
    what room is left), else (with workers) anywhere but a worker's devices, so that no network sits in
    the drafting loop. --split-mode none and --main-gpu are the target's, and the draft's too where its
    devices are not named (llama.cpp's draft splits by layers over those it is given)."""
    devices = runtime.draft_devices
    if devices is None and runtime.rpc:
        devices = tuple(d.name for d in machine.devices if d.is_local_gpu) or ("none",)
    offload = _offload(machine.devices, devices, runtime, one_gpu=devices is None)
    sizes = hardware.layer_bytes(info, n_ctx or runtime.ctx_size, sequences, runtime.draft_kv_bytes,
                                 runtime.draft_tensor_overrides, runtime.kv_offload, runtime.prompt_batch)
    return _placed(info, sizes, runtime.draft_gpu_layers, offload, devices, None,
                   room(machine, offload, runtime.fit_margin))


def _placed(info: GGUFInfo, sizes: hardware.LayerBytes, gpu_layers: int | None, offload: tuple[str, ...],
            devices: tuple[str, ...] | None, tensor_split: tuple[float, ...] | None,
            free: int | None) -> ModelPlacement:
    """A model placed as asked, or (gpu_layers None) with as many layers as free bytes hold on its offload
    devices: all of them where it has none (llama.cpp then keeps every layer on the CPU alike) or where their
    free memory is not known."""
    if gpu_layers is not None:
        return ModelPlacement(info.path.name, sizes.layers, gpu_layers, offload, devices, tensor_split, sizes)
    return ModelPlacement(info.path.name, sizes.layers, sizes.fitting(free) if offload and free is not None else -1,
                          offload, devices, tensor_split, sizes, "fit")


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
    fit_margin: int = 0  # left free on each offload device where layers are fitted to them

    @classmethod
    def plan(cls, runtime: Runtime, target: GGUFInfo, draft: GGUFInfo | None = None,
             machine: hardware.Machine | None = None) -> "Placement":
        """machine: what hardware.machine() says now (RPC workers added first)."""
        machine = machine or hardware.machine()
        check_cache_types(target, runtime.cache_type_k, runtime.cache_type_v)
        if draft:
            check_cache_types(draft, runtime.draft_cache_type_k, runtime.draft_cache_type_v, "-draft")
        parallel = max(1, runtime.parallel)
        n_ctx = runtime.ctx_size * parallel
        # the draft's layers first: it runs several times a step, so a GPU pays most there
        drafted = place_draft(runtime, draft, machine, n_ctx, parallel) if draft else None
        placed = place_target(runtime, target, machine, n_ctx, parallel, drafted)
        backend_sampling = runtime.backend_sampling
        if backend_sampling is None and placed.gpu_layers != 0 and any(d.is_local_gpu for d in machine.devices):
            backend_sampling = True  # else (None) the context samples only greedy rows in the graph
        if runtime.parallel > 1:  # each sequence its own chain, on the host (Context.sequence)
            backend_sampling = False
        return cls(placed, drafted, backend_sampling, (target,) + ((draft,) if draft else ()), n_ctx, machine, parallel,
                   runtime.kv_bytes, runtime.draft_kv_bytes, runtime.fit_margin)

    def check_fit(self) -> int:
        """Refuse, with advice, when the models cannot fit in memory; return the estimate."""
        said = (f" ({self.parallel} sequences of {self.n_ctx // self.parallel} tokens; a smaller --parallel needs less)"
                if self.parallel > 1 else "")
        needed = hardware.check_fit(list(self.models), self.n_ctx, self.machine, said, self.parallel, self.kv,
                                    self.draft_kv)
        beyond = self._beyond()
        if beyond and beyond.least > beyond.free:
            raise UsageError(f"{' + '.join(beyond.files)} need at least {beyond.least / 2**30:.1f} GiB on"
                             f" {', '.join(beyond.devices)} with {beyond.layers} there (about"
                             f" {beyond.needed / 2**30:.1f} GiB with compute buffers), but only"
                             f" {beyond.free / 2**30:.1f} GiB are free{said}; {beyond.advice}, or try a smaller"
                             " --ctx-size or quantization")
        placed = [model for model in (self.target, self.draft) if model]
        on_devices, on_host = sum(model.on_devices for model in placed), sum(model.on_host for model in placed)
        if on_devices and on_host > self.machine.ram_available:
            devices = dict.fromkeys(name for model in placed if model.layers_on_gpu for name in model.offload)
            raise UsageError(
                f"{' + '.join(model.file for model in placed)} need about {on_host / 2**30:.1f} GiB of RAM beside the"
                f" {on_devices / 2**30:.1f} GiB on {', '.join(devices)}, but only"
                f" {self.machine.ram_available / 2**30:.1f} GiB are free here{said}; try a smaller --ctx-size,"
                " a smaller quantization or model, or more workers (--rpc)")
        return needed

    def _beyond(self) -> "_Beyond | None":
        """Where layers asked for by count need more than the free memory of their devices."""
        placed = [model for model in (self.target, self.draft) if model and model.layers_on_gpu]
        over = next((model for model in placed if model.by == "asked"), None)
        devices = tuple(dict.fromkeys(name for model in placed for name in model.offload))
        free = room(self.machine, devices, 0)
        needed = sum(model.on_devices for model in placed)
        if over is None or free is None or needed <= free:
            return None
        least = sum(model.sizes.least_on_devices(model.layers_on_gpu) for model in placed)
        fits = over.sizes.fitting(free - needed + over.on_devices - len(devices) * self.fit_margin)
        option = "--gpu-layers" if over is self.target else "--draft-gpu-layers"
        return _Beyond(tuple(model.file for model in placed), devices, f"{over.layers_on_gpu} of {over.file}'s"
                       f" {over.layers} layers", needed, least, free,
                       f"{option} {fits} fits (auto, the default, finds the count)" if fits > 0 else
                       f"{option} 0 keeps it on the CPU")

    @property
    def notes(self) -> list[str]:
        """What auto's fitting did other than offload every layer, and layers asked for that may not fit, for
        the CLI to print."""
        notes = [f"{model.layers_on_gpu} of {model.file}'s {model.layers} layers on {', '.join(model.offload)}, as"
                 f" many as its free memory holds (the rest run on the CPU, slower;"
                 f" -ngl{'d' if model is self.draft else ''} all tries every layer)"
                 for model in (self.target, self.draft) if model and model.by == "fit" and model.gpu_layers >= 0]
        beyond = self._beyond()
        if beyond:
            notes.append(f"{beyond.layers} on {', '.join(beyond.devices)} need about {beyond.needed / 2**30:.1f} GiB"
                         f" there with compute buffers, {beyond.free / 2**30:.1f} GiB are free: llama.cpp may fail"
                         f" to allocate them; {beyond.advice}")
        return notes

    def report(self, draft: bool, sampling: str, drafting: str) -> dict:
        """For `run --json`: where each model runs (the draft's where one drafts) and where its rows
        were sampled (for the latest generation), and how it drafts."""
        out = {"target": self.target.as_dict()}
        if draft and self.draft:
            out["draft"] = self.draft.as_dict()
        return out | {"sampling": sampling, "drafting": drafting}


@dataclass(frozen=True)
class _Beyond:
    """Layers asked for (`layers`, as said) on devices whose free memory the pair's estimate there exceeds:
    `least` its weights and caches alone, `needed` with the compute buffers; advice: the count that fits."""

    files: tuple[str, ...]
    devices: tuple[str, ...]
    layers: str
    needed: int
    least: int
    free: int
    advice: str


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
    drafted = place_draft(runtime, draft_info, machine, ctx_size) if draft_info else None
    return dict(target=target, draft=draft, needed=needed,
                fits=None if needed is None else needed <= machine.memory_free,
                target_layers=place_target(runtime, target_info, machine, ctx_size, beside=drafted).as_layers()
                if target_info else None,
                draft_layers=drafted.as_layers() if drafted else None)


def parallel_that_fits(runtime: Runtime, target: GGUFInfo, draft: GGUFInfo | None = None,
                       machine: hardware.Machine | None = None) -> int:
    """As many sequences as PARALLEL_AUTO_MOST (llama-server's slots), fewer where their caches do not fit
    the memory beside the models."""
    n, machine = PARALLEL_AUTO_MOST, machine or hardware.machine()
    while n > 1:
        try:
            Placement.plan(replace(runtime, parallel=n), target, draft, machine).check_fit()
            return n
        except UsageError:
            n //= 2
    return 1
