import pytest

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
