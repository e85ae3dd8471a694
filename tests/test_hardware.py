from dataclasses import replace

import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from localspec.config import KV_CACHE_TYPES, DrafterKind, Runtime, Speculation
from localspec.paths import prompts_of
from localspec.session import Session

from localspec.store import gguf_meta, hardware
from localspec.engine.backend import Context
from localspec.engine.rollback import PARTIAL_STATE
from localspec.engine.model import Model
from localspec.engine.library import llama
from localspec.engine.devices import Device
from localspec.errors import UsageError


def small_machine(free: int) -> hardware.Machine:
    return hardware.Machine(gpu_offload=False, rpc=False, devices=[], ram_total=free, ram_available=free, cpu="test", features="")


def test_kv_cache_follows_the_models_shape(tiny):
    info = gguf_meta.read(tiny["target"])
    # 2 layers x 4 KV heads x (16 + 16) values per head x 2 bytes, per token
    assert hardware.kv_cache_bytes(info, 100) == 100 * 2 * 4 * 32 * 2


def test_the_kv_cache_types_are_ggmls_and_a_quantized_one_takes_its_blocks_bytes(tiny):
    for name, (number, values, size) in KV_CACHE_TYPES.items():  # (ggml's numbers and blocks, as gguf has them)
        kind = GGMLQuantizationType[name.upper()]
        assert (number, values, size) == (int(kind), *GGML_QUANT_SIZES[kind]), name
    info = gguf_meta.read(tiny["target"])
    assert hardware.kv_cache_bytes(info, 100, Runtime(cache_type_k="q8_0", cache_type_v="q8_0").kv_bytes) == \
        hardware.kv_cache_bytes(info, 100) * 17 // 32
    with pytest.raises(UsageError, match="needs flash attention"):
        Runtime(cache_type_v="q8_0", flash_attn=False)
    with pytest.raises(UsageError, match="takes one of f32, f16"):
        Runtime(cache_type_k="q9")
    with pytest.raises(UsageError, match="--cache-type-k-draft takes one of f32, f16"):
        Runtime(draft_cache_type_k="q9")
    with pytest.raises(UsageError, match="--cache-type-v-draft q4_0 needs flash attention"):
        Runtime(draft_cache_type_v="q4_0", flash_attn=False)
    # a draft's quantized cache counts what it takes
    assert hardware.check_fit([info, info], 100, small_machine(10**12), draft_kv=Runtime(
        draft_cache_type_k="q8_0", draft_cache_type_v="q8_0").draft_kv_bytes) == hardware.check_fit(
        [info, info], 100, small_machine(10**12)) - hardware.kv_cache_bytes(info, 100) * 15 // 32


@pytest.mark.slow
def test_a_quantized_kv_cache_takes_less_memory_and_speculation_on_it_is_lossless(real_model):
    """llama.cpp's -ctk/-ctv q8_0 (an unknown option before): the target's cache holds about 17/32 of f16's bytes,
    and drafting keeps the text the target writes with that cache; its prompts are kept apart from f16's."""
    model = real_model("smollm2-135m")
    prompt = "def add(a, b):\n    return a + b\n\n" * 8
    quantized = Runtime(ctx_size=512, cache_type_k="q8_0", cache_type_v="q8_0")
    texts, states, scores = {}, {}, {}
    for name, runtime, drafting in (("plain", quantized, DrafterKind.PLAIN), ("ngram", quantized, DrafterKind.NGRAM),
                                    ("f16", Runtime(ctx_size=512), DrafterKind.PLAIN)):
        with Session(model, None, runtime, Speculation(drafting=drafting, required=True)) as session:
            reply = session.complete(prompt, raw=True, max_tokens=48, temperature=0)
            texts[name], states[name] = (reply.text, reply.summary.drafted), len(session.sequences[0].state())
            scores[name] = session.score(session.prompts.tokenize(prompt, raw=True))[-1].chosen.logprob
            folder = session.sequences[0].prompt_cache.folder
            assert folder.name == ("kv-q8_0-q8_0" if runtime is quantized else prompts_of(model).name)
    assert texts["ngram"][0] == texts["plain"][0] and texts["ngram"][1] > 0
    assert states["plain"] < 0.6 * states["f16"]
    # (perplexity and scoring read with that cache too: they read with f16's whatever -ctk said)
    assert scores["plain"] == scores["ngram"] != scores["f16"]


@pytest.mark.slow
def test_a_drafts_own_cache_type_and_threads_leave_the_text_the_targets(real_model):
    """llama.cpp's -ctkd/-ctvd and -td (unknown options before): the draft model's context holds a cache of
    that type and runs that many threads; the text is the target's, drafts accepted."""
    model = real_model("smollm2-135m")
    prompt = "def add(a, b):\n    return a + b\n\n" * 4
    texts, states = {}, {}
    for name, runtime in (("f16", Runtime(ctx_size=512)), ("q8_0", Runtime(
            ctx_size=512, draft_cache_type_k="q8_0", draft_cache_type_v="q8_0", draft_threads=1))):
        with Session(model, model, runtime, Speculation(drafting=DrafterKind.DRAFT, required=True)) as session:
            reply = session.complete(prompt, raw=True, max_tokens=24, temperature=0)
            draft = session.drafting.costly[DrafterKind.DRAFT].context
            texts[name] = reply.text, reply.summary.accepted > 0
            states[name] = len(draft.state()), len(session.sequences[0].state())
            assert llama.llama_n_threads(draft._ctx) == (runtime.draft_threads or runtime.threads)
    assert texts["q8_0"] == texts["f16"] and texts["f16"][1]
    assert states["q8_0"][0] < 0.6 * states["f16"][0] and states["q8_0"][1] == states["f16"][1]


def test_pairs_that_do_not_fit_are_refused_with_advice(tiny):
    info = gguf_meta.read(tiny["target"])
    needed = hardware.check_fit([info, info], 512, small_machine(10**12))
    assert needed > 2 * info.file_size
    with pytest.raises(UsageError, match="--ctx-size"):
        hardware.check_fit([info, info], 512, small_machine(needed - 1))


def test_workers_memory_counts_and_a_split_that_does_not_fit_names_every_device(tiny):
    info = gguf_meta.read(tiny["target"])
    needed = hardware.check_fit([info], 512, small_machine(10**12))
    worker = Device(name="RPC0", description="127.0.0.1:50052", kind="RPC worker", remote=True, free=needed // 2,
                    total=needed)
    machine = hardware.Machine(gpu_offload=False, rpc=True, devices=[worker], ram_total=needed,
                               ram_available=needed // 2 + 1, cpu="test", features="")
    assert machine.memory_free == needed // 2 * 2 + 1
    assert hardware.check_fit([info], 512, machine) == needed  # fits only with the worker's memory
    short = hardware.Machine(**{**machine.__dict__, "ram_available": needed // 4})
    with pytest.raises(UsageError, match=r"GiB of RAM here, .* GiB on RPC0 \(the worker at 127.0.0.1:50052\)"):
        hardware.check_fit([info], 512, short)


def test_split_mode_none_keeps_a_model_on_the_main_gpu_alone(tiny):
    """llama.cpp's -sm none -mg N (unknown options before): the model on the Nth GPU the model may use, in
    llama.cpp's order; a number past them refused before anything loads."""
    from localspec.store.placement import Placement

    info = gguf_meta.read(tiny["target"])
    gpus = [Device(name=f"CUDA{n}", description="test", kind="GPU", remote=False, free=10**12, total=10**12)
            for n in range(2)]
    machine = hardware.Machine(gpu_offload=True, rpc=False, devices=gpus, ram_total=10**12, ram_available=10**12,
                               cpu="test", features="")
    assert Placement.plan(Runtime(), info, machine=machine).target.held_by == ["CUDA0", "CUDA1"]
    assert Placement.plan(Runtime(split_mode="none", main_gpu=1), info, info, machine).target.held_by == ["CUDA1"]
    assert Placement.plan(Runtime(split_mode="none", main_gpu=1), info, info, machine).draft.held_by == ["CUDA1"]
    assert Placement.plan(Runtime(split_mode="none", devices=("CUDA1",)), info, machine=machine).target.held_by == \
        ["CUDA1"]
    with pytest.raises(UsageError, match=r"--main-gpu 2: the model may use 2 GPU\(s\), numbered from 0: CUDA0, CUDA1"):
        Placement.plan(Runtime(split_mode="none", main_gpu=2), info, machine=machine)
    # counted in --device's order, as llama.cpp counts them; a draft on devices of its own splits over them
    assert Placement.plan(Runtime(split_mode="none", devices=("CUDA1", "CUDA0")), info, machine=machine).target.held_by \
        == ["CUDA1"]
    assert Placement.plan(Runtime(split_mode="none", main_gpu=1, draft_devices=("CUDA0",)), info, info,
                          machine).draft.held_by == ["CUDA0"]
    with pytest.raises(UsageError, match="--split-mode takes none, layer, row, tensor"):
        Runtime(split_mode="diagonal")


def test_a_row_split_is_refused_before_loading_where_a_gpus_backend_cannot_split_by_rows(tiny, monkeypatch):
    """The sixth lease: -sm row on the H200 failed the load ("device CUDA0 does not support split buffers"): the
    pinned llama.cpp's CUDA backend offers no split buffer type. Now refused in one line, naming the devices."""
    from localspec.engine.devices import splits_by_rows
    from localspec.store import placement
    from localspec.store.placement import Placement

    assert not splits_by_rows("CPU") and not splits_by_rows("no such device")
    info = gguf_meta.read(tiny["target"])
    gpus = [Device(name=f"CUDA{n}", description="test", kind="GPU", remote=False, free=10**12, total=10**12)
            for n in range(2)]
    machine = hardware.Machine(gpu_offload=True, rpc=False, devices=gpus, ram_total=10**12, ram_available=10**12,
                               cpu="test", features="")
    monkeypatch.setattr(placement, "splits_by_rows", lambda name: name == "CUDA1")
    with pytest.raises(UsageError, match=r"--split-mode row: this llama.cpp cannot split weights by rows on CUDA0 \("):
        Placement.plan(Runtime(split_mode="row"), info, machine=machine)
    assert Placement.plan(Runtime(split_mode="row", devices=("CUDA1",)), info, machine=machine).target.held_by == \
        ["CUDA1"]
    assert Placement.plan(Runtime(split_mode="layer"), info, machine=machine).target.held_by == ["CUDA0", "CUDA1"]


def test_machine_reports_at_least_the_cpu():
    found = hardware.machine()
    assert any(d.kind == "CPU" for d in found.devices)
    assert found.ram_total > 0 and found.features and "=" not in found.features  # `AVX2, FMA`, not `AVX2 = 1 | ...`


@pytest.mark.slow
def test_qwen_kv_cache_matches_its_architecture(real_model):
    info = gguf_meta.read(real_model("qwen2.5-coder-1.5b"))
    # Qwen2.5-1.5B: 28 layers, 2 KV heads of 128 dimensions; f16 keys and values
    assert hardware.kv_cache_bytes(info, 4096) == 28 * 4096 * 2 * (128 + 128) * 2


def test_before_a_download_the_known_sizes_decide_and_an_unknown_size_counts_for_nothing():
    machine = small_machine(2 * 2**30)
    hardware.check_fit_before_download([("small", 2**30), ("unknown", None)], 512, machine)
    with pytest.raises(UsageError, match=r"big \+ unknown need about 3\.\d GiB .* \(nothing was downloaded\)"):
        hardware.check_fit_before_download([("big", 3 * 2**30), ("unknown", None)], 512, machine)


@pytest.mark.parametrize("name", ["hybrid", "mtp"], ids=["lfm2", "qwen35"])
def test_a_recurrent_state_is_counted_as_llama_cpp_keeps_it_for_each_sequence_and_snapshot(tiny, name):
    info = gguf_meta.read(tiny[name])
    model = Model(tiny[name])
    try:
        context = Context(model, 256, 64, threads=2, backend_sampling=False, max_outputs=4)
        context.decode(model.tokenize("the cat", add_special=True, parse_special=False), logits="last")
        saved = llama.llama_state_seq_get_size_ext(context._ctx, 0, PARTIAL_STATE)  # the state, with a few headers
        context.close()
    finally:
        model.close()
    each = hardware.recurrent_state_bytes(info)
    assert each <= saved < each + 1024
    plain = gguf_meta.read(tiny["target"])
    assert hardware.recurrent_state_bytes(plain) == 0
    one, four = (hardware.estimate_bytes(info, 512 * n, n) for n in (1, 4))
    assert four - one == 3 * (hardware.kv_cache_bytes(info, 512) + each * (1 + hardware.RECURRENT_SNAPSHOTS))


def gpu_machine(free: int, ram: int = 10**12, gpus: int = 1) -> hardware.Machine:
    devices = [Device(name=f"CUDA{n}", description="test", kind="GPU", remote=False, free=free, total=free)
               for n in range(gpus)]
    return hardware.Machine(gpu_offload=True, rpc=False, devices=devices, ram_total=ram, ram_available=ram,
                            cpu="test", features="")


def test_layers_are_offloaded_from_the_output_layer_back_as_llama_cpp_offloads_them():
    sizes = hardware.LayerBytes(blocks=(100, 200, 300), caches=(1, 1, 1), output=50, output_copy=70, total=10000,
                                compute=1000)
    # weights and caches as they are, then the compute buffer (a batch's logits beside a fixed part)
    assert [sizes.on_devices(n) for n in (0, 1, 2, 3, 4, -1, 9)] == [0, 1120, 1421, 1622, 1723, 1723, 1723]
    assert [sizes.least_on_devices(n) for n in (0, 1, 2, -1)] == [0, 120, 421, 723]
    # the host's estimate keeps the compute margin on the weights: what the layers offloaded take off it
    assert [sizes.on_host(n) for n in (0, 1, 2, -1)] == [10000, 9945, 9614, 9282]  # the copy is made on the device
    assert [sizes.fitting(room) for room in (0, 1119, 1120, 1420, 1421, 1722, 1723, 10**6)] == [0, 0, 1, 1, 2, 3, -1, -1]


def test_a_layers_bytes_are_its_tensors_with_its_share_of_the_cache_and_ot_keeps_tensors_off_the_gpu(tiny):
    info = gguf_meta.read(tiny["target"])
    sizes = hardware.layer_bytes(info, 512)
    blocks = info.arch("block_count")
    assert sizes.layers == blocks + 1 and sizes.total == hardware.estimate_bytes(info, 512)
    weights = sum(size for name, size in info.tensor_bytes.items() if name.startswith("blk.0."))
    assert sizes.blocks[0] == weights and sizes.caches[0] == hardware.kv_cache_bytes(info, 512) // blocks
    assert sizes.output == info.tensor_bytes["output.weight"] + info.tensor_bytes["output_norm.weight"]
    assert sizes.output_copy == 0  # the file has an output layer of its own
    assert sizes.compute == hardware.COMPUTE_FIXED + 512 * info.vocab_size * 4  # a batch's f32 logits
    # the FFN tensors kept in RAM (--cpu-moe's way): the blocks weigh less on the GPU, the host keeps them
    ffn = sum(size for name, size in info.tensor_bytes.items() if name.startswith("blk.0.ffn_"))
    kept = hardware.layer_bytes(info, 512, overrides=((r"ffn_.*=", "CUDA0"), (r"ffn_", "CPU")))
    assert sizes.blocks[0] - kept.blocks[0] == ffn and kept.on_host(-1) > sizes.on_host(-1)
    # -nkvo: the KV cache stays in RAM
    assert hardware.layer_bytes(info, 512, kv_offload=False).caches[0] == 0
    untied = replace(info, tensor_bytes={k: v for k, v in info.tensor_bytes.items() if k != "output.weight"})
    assert hardware.layer_bytes(untied, 512).output_copy == info.tensor_bytes["token_embd.weight"]


def test_auto_fits_the_draft_first_and_then_as_many_target_layers_as_the_gpus_free_memory_holds(tiny, tmp_path):
    """`-ngl auto` was every layer (and a model bigger than the GPU passed the check, RAM and VRAM counted
    together, then failed to allocate): now the draft model's layers, then the target's from its output
    layer back, as many as the free memory holds beside --fit-target's margin."""
    from localspec.store.placement import Placement

    target, draft = gguf_meta.read(tiny["target"]), gguf_meta.read(tiny["partial"])
    runtime = Runtime(ctx_size=512)
    # (the target's cache has a batch of cells more, for draft trees' nodes)
    target_sizes = hardware.layer_bytes(target, 512 + runtime.prompt_batch)
    draft_sizes = hardware.layer_bytes(draft, 512)
    free = runtime.fit_margin + draft_sizes.on_devices(-1) + target_sizes.on_devices(2) + 1000
    placed = Placement.plan(runtime, target, draft, gpu_machine(free))
    assert placed.draft.layers_on_gpu == placed.draft.layers and placed.draft.gpu_layers == -1
    assert (placed.target.gpu_layers, placed.target.layers_on_gpu, placed.target.by) == (2, 2, "fit")
    assert placed.target.held_by == ["CUDA0", "CPU"]
    assert placed.notes == [f"2 of {target.path.name}'s 3 layers on CUDA0, as many as its free memory holds (the rest"
                            " run on the CPU, slower; -ngl all tries every layer)"]
    assert placed.check_fit() > 0
    # where every layer fits, auto is llama.cpp's all (-1), said nowhere; two GPUs' free memory counts together
    roomy = Placement.plan(runtime, target, draft, gpu_machine(10**12))
    assert (roomy.target.gpu_layers, roomy.draft.gpu_layers, roomy.notes) == (-1, -1, [])
    halves = Placement.plan(runtime, target, draft, gpu_machine(runtime.fit_margin + (free - runtime.fit_margin) // 2
                                                                 + 1000, gpus=2))
    assert halves.target.gpu_layers == 2
    # a draft on devices of its own leaves the target's room alone
    apart = Placement.plan(replace(runtime, draft_devices=("CUDA1",)), target, draft, gpu_machine(free, gpus=2))
    assert apart.target.gpu_layers == -1 and apart.draft.held_by == ["CUDA1"]
    # --fit-target leaves more free: fewer layers; a GPU too small for the draft keeps both on the CPU
    assert Placement.plan(replace(runtime, fit_margin=runtime.fit_margin + 200_000), target, draft,
                          gpu_machine(free)).target.gpu_layers == 1
    small = Placement.plan(runtime, target, draft, gpu_machine(runtime.fit_margin + 1000))
    assert (small.target.gpu_layers, small.draft.gpu_layers) == (0, 0) and small.target.held_by == ["CPU"]
    # a projector (--mmproj) goes on the GPU beside the layers, and takes its room: fewer layers
    projector = tmp_path / "projector.gguf"
    projector.write_bytes(b"GGUF" + bytes(target_sizes.blocks[1]))
    seeing = Placement.plan(replace(runtime, mmproj=str(projector)), target, draft, gpu_machine(free))
    assert seeing.target.gpu_layers == 1
    assert Placement.plan(replace(runtime, mmproj=str(projector), mmproj_offload=False), target, draft,
                          gpu_machine(free)).target.gpu_layers == 2
    # a CPU build: every layer asked for, as before, and nothing said
    cpu = Placement.plan(runtime, target, draft, small_machine(10**12))
    assert (cpu.target.gpu_layers, cpu.draft.gpu_layers, cpu.notes) == (-1, -1, [])


def test_a_session_placed_so_says_its_fitting_and_loads_the_count_fitted(tiny):
    """The note reaches the session's notes (which run prints and serve logs), and the model loads with the
    count (on this CPU build llama.cpp keeps the layers on the CPU whatever the count)."""
    from localspec.store.placement import Placement

    target = gguf_meta.read(tiny["target"])
    runtime = Runtime(ctx_size=512)
    free = runtime.fit_margin + hardware.layer_bytes(target, 512 + runtime.prompt_batch).on_devices(2) + 1000
    placement = Placement.plan(runtime, target, machine=gpu_machine(free))
    with Session(tiny["target"], None, runtime, Speculation(drafting=DrafterKind.PLAIN), placement) as session:
        assert session.notes[0].startswith(f"2 of {target.path.name}'s 3 layers on CUDA0, as many as")
        assert session.placement()["target"]["layers_on_gpu"] == 2
        assert session.complete("the cat", raw=True).text


def test_layers_asked_for_beyond_the_gpus_free_memory_are_refused_or_said_with_the_count_that_fits(tiny):
    """Where their weights and caches alone cannot fit, refused before loading; where only the compute
    buffers' estimate goes past the free memory, llama.cpp tries, and a note says the count that fits."""
    from localspec.store.placement import Placement

    target, draft = gguf_meta.read(tiny["target"]), gguf_meta.read(tiny["partial"])
    runtime = Runtime(ctx_size=512, gpu_layers=-1, fit_margin=0)
    sizes = hardware.layer_bytes(target, 512)
    name = target.path.name
    with pytest.raises(UsageError, match=rf"{name} need at least 0.0 GiB on CUDA0 with 3 of {name}'s 3 layers there"
                                         r" \(about 0.3 GiB with compute buffers\), but only 0.0 GiB are free;"
                                         r" --gpu-layers 0 keeps it on the CPU, or try"):
        Placement.plan(runtime, target, machine=gpu_machine(sizes.least_on_devices(-1) - 1)).check_fit()
    tight = Placement.plan(runtime, target, machine=gpu_machine(sizes.on_devices(1) + 1000))
    assert tight.check_fit() > 0 and tight.notes == [
        f"3 of {name}'s 3 layers on CUDA0 need about 0.3 GiB there with compute buffers, 0.3 GiB are free: llama.cpp"
        " may fail to allocate them; --gpu-layers 1 fits (auto, the default, finds the count)"]
    # the draft's fitted layers count: the target's asked ones no longer fit beside them
    beside = Placement.plan(runtime, target, draft, gpu_machine(sizes.on_devices(-1) + 10**6))
    assert beside.draft.gpu_layers == -1 and beside.notes[0].startswith(f"3 of {name}'s 3 layers on CUDA0 need about")
    assert Placement.plan(replace(runtime, gpu_layers=1), target, machine=gpu_machine(sizes.on_devices(1))).notes == []
    # a device that says nothing of its memory (0 of 0 bytes): every layer offloaded, as before, nothing said
    silent = hardware.Machine(**{**gpu_machine(0).__dict__, "devices": [
        Device(name="Vulkan0", description="test", kind="GPU", remote=False, free=0, total=0)]})
    unknown = Placement.plan(Runtime(ctx_size=512), target, draft, silent)
    assert (unknown.target.gpu_layers, unknown.draft.gpu_layers, unknown.notes) == (-1, -1, [])
    assert unknown.check_fit() > 0


def test_what_stays_on_the_cpu_must_fit_the_ram_beside_what_the_gpu_holds(tiny):
    from localspec.store.placement import Placement

    target = gguf_meta.read(tiny["target"])
    runtime = Runtime(ctx_size=512)
    sizes = hardware.layer_bytes(target, 512)
    # RAM and VRAM together hold the model, but the GPU only a layer and the RAM not the rest
    machine = gpu_machine(runtime.fit_margin + sizes.on_devices(1) + 1000, ram=sizes.on_host(1) - 1)
    assert machine.memory_free > sizes.total
    placed = Placement.plan(runtime, target, machine=machine)
    assert placed.target.gpu_layers == 1
    with pytest.raises(UsageError, match=r"need about 0.\d GiB of RAM beside the 0.\d GiB on CUDA0, but only"):
        placed.check_fit()


def test_fit_and_gpu_layers_are_spelled_as_llama_cpps(monkeypatch):
    from localspec.cli.options import build_settings

    def runtime(**values) -> Runtime:
        return build_settings(target="t", **values).runtime

    assert (runtime().gpu_layers, runtime().draft_gpu_layers, runtime().fit_margin) == (None, None, 1 << 30)
    assert runtime(gpu_layers="auto").gpu_layers is None and runtime(gpu_layers="ALL").gpu_layers == -1
    off = runtime(fit="off", draft_gpu_layers="3")
    assert (off.gpu_layers, off.draft_gpu_layers) == (-1, 3)  # --fit off: every layer left to auto
    assert runtime(fit="on", gpu_layers="7").gpu_layers == 7 and runtime(fit_target=512).fit_margin == 512 << 20
    with pytest.raises(UsageError, match="--fit takes on or off, as llama.cpp's; got 'sometimes'"):
        runtime(fit="sometimes")
    with pytest.raises(UsageError, match="--fit-target takes MiB >= 0"):
        runtime(fit_target=-1)
