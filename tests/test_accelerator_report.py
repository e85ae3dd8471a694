"""scripts/accelerator-report: its arithmetic and models, its smallest run on this CPU (so the report cannot
rot between the GPUs we are lent), and the trimmed sdist it packs for a lent device, built and measured here."""

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from localspec.store import gguf_meta
from localspec.config import DrafterKind, Sampling
from localspec.events import Step
from localspec.engine.model import Model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import accelerator_measure as measure

SCRIPT = measure.REPORT_SCRIPT
report = measure.report_script()


def run_report(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def test_a_flat_curve_predicts_drafting_as_long_as_it_can():
    ratios = {n: 1.0 for n in range(1, 65)}
    speedup, k = measure.predicted_speedup(ratios, 0.0, 0.9)
    assert k == 63
    assert speedup == pytest.approx((1 - 0.9**64) / (1 - 0.9))


def test_where_verifying_costs_its_length_nothing_is_drafted():
    ratios = {n: float(n) for n in range(1, 65)}
    assert measure.predicted_speedup(ratios, 0.0, 0.9) == (1.0, 0)


def test_the_prediction_counts_what_drafting_costs():
    # k = 1: (1 + 0.8) / (0.5 + 1) = 1.2; k = 2: (1 + 0.8 + 0.64) / (1 + 1) = 1.22
    speedup, k = measure.predicted_speedup({1: 1.0, 2: 1.0, 3: 1.0}, 0.5, 0.8)
    assert (speedup, k) == (pytest.approx(1.22), 2)


def test_the_bundle_leaves_out_only_what_no_build_reads():
    root = "llama_cpp_python-0.3.36"
    assert report.trimmed(f"{root}/vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf")
    assert report.trimmed(f"{root}/.git/HEAD")
    assert report.trimmed(f"{root}/vendor/llama.cpp/tools/server/server.cpp")
    assert not report.trimmed(f"{root}/vendor/llama.cpp/ggml/src/ggml.c")
    assert not report.trimmed(f"{root}/vendor/llama.cpp/tools/llama-bench/llama-bench.cpp")
    assert not report.trimmed(f"{root}/docsy/file")  # a name that begins like a trimmed folder
    assert not report.trimmed(root)


def test_a_cuda_build_is_for_the_devices_own_architecture_or_those_asked_for(monkeypatch):
    monkeypatch.setattr(report, "cuda_architecture", lambda: "90")
    flags = report.build_flags("cuda")
    assert "-DGGML_CUDA=ON" in flags
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in flags
    assert "-DLLAMA_BUILD_TOOLS=ON" in flags  # llama-bench, from the same build as localspec's libraries
    assert "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON" in flags  # a packed build runs wherever it is unpacked
    assert "-DGGML_NATIVE=OFF" not in flags  # built where it runs
    packed = report.build_flags("cuda", "89;90")  # --pack --cuda: built here, no GPU here, for another machine
    assert "-DCMAKE_CUDA_ARCHITECTURES=89;90" in packed
    assert "-DGGML_NATIVE=OFF" in packed  # (-march=native here could be an illegal instruction there)
    assert "-DGGML_AVX2=ON" in packed and "-DGGML_AVX512=ON" not in packed


def test_cublas_is_found_in_an_nvidia_wheel_where_the_toolkit_has_none(tmp_path, monkeypatch):
    # a toolkit assembled from pip wheels: nvcc and the runtime, no cuBLAS (this project's machines)
    toolkit, site = tmp_path / "cuda", tmp_path / "site"
    (toolkit / "include").mkdir(parents=True)
    wheel = site / "nvidia" / "cu13"
    for name in ("include/cublas_v2.h", "lib/libcublas.so.13", "lib/libcublasLt.so.13"):
        (wheel / name).parent.mkdir(parents=True, exist_ok=True)
        (wheel / name).touch()
    monkeypatch.setattr(report, "_ldconfig", lambda: "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib64/libcuda.so.1\n")
    flags = report.cuda_library_flags([toolkit], [tmp_path / "elsewhere", site])
    assert f"-DCMAKE_CUDA_STANDARD_INCLUDE_DIRECTORIES={wheel / 'include'}" in flags
    assert f"-DCUDA_cublas_LIBRARY={wheel / 'lib' / 'libcublas.so.13'}" in flags
    assert f"-DCUDA_cublasLt_LIBRARY={wheel / 'lib' / 'libcublasLt.so.13'}" in flags
    assert "-DCUDA_cuda_driver_LIBRARY=/usr/lib64/libcuda.so.1" in flags

    monkeypatch.setattr(report, "_ldconfig", lambda: "")  # no driver to link: ggml's pool without VMM
    assert "-DGGML_CUDA_NO_VMM=ON" in report.cuda_library_flags([toolkit], [site])
    (toolkit / "include" / "cublas_v2.h").touch()
    (toolkit / "lib64" / "stubs").mkdir(parents=True)
    (toolkit / "lib64" / "stubs" / "libcuda.so").touch()
    assert report.cuda_library_flags([toolkit], [site]) == []  # a whole toolkit: CMake finds its own


@pytest.mark.parametrize("quant", ["Q8_0", "Q4_K"])
def test_random_blocks_spread_as_asked(quant):
    data = measure.quantized(64, 1024, quant, 0.05, np.random.default_rng(0))
    weights = gguf.quants.dequantize(data, measure.QUANT[quant])
    assert weights.shape == (64, 1024)
    assert abs(weights.mean()) < 0.005
    assert weights.std() == pytest.approx(0.05, rel=0.15)


def test_a_written_model_has_its_shape_and_loads(tmp_path):
    target, _ = report.SIZES["smallest"].pairs[0]
    path = measure.write_model(target, tmp_path, seed=0)
    assert measure.write_model(target, tmp_path, seed=0) == path  # written once, then reused
    info = gguf_meta.read(path)
    assert info.architecture == "qwen2"
    assert info.arch("block_count") == target.n_layer
    model = Model(path, gpu_layers=0)
    try:
        assert model.n_vocab == target.n_vocab
        assert model.is_eog(2)
    finally:
        model.close()


def test_the_answer_is_drafted_until_the_text_leaves_it():
    oracle = measure.Oracle()
    oracle.answer = [5, 6, 7, 8]
    oracle.begin([1, 2], Sampling(temperature=0), None)
    assert oracle.propose([1, 2], 3).tokens == [5, 6, 7]
    assert oracle.propose([1, 2, 5, 6], 8).tokens == [7, 8]
    assert oracle.propose([1, 2, 5, 6, 9], 3).tokens == []
    assert oracle.propose([1, 2, 5, 6, 9, 7], 3).tokens == []  # it does not take the answer up again


def test_a_stubborn_answer_goes_on_at_its_length():
    oracle = measure.Oracle(length=2, stubborn=True)
    oracle.answer = [5, 6, 7, 8, 9]
    oracle.begin([1, 2], Sampling(temperature=0), None)
    assert oracle.propose([1, 2, 5, 9], 3).tokens == [7, 8]
    assert oracle.propose([1, 2, 5, 9, 3], 1).tokens == [8]


def test_a_recorded_offer_is_spelled_on_the_answer_as_far_as_it_was_right():
    offered = measure.Offered([[], [3, 2, 9, "earlier agree"], [2, 0, 2, "seen once"]])
    offered.answer = [5, 6, 7, 8, 9]
    offered.begin([1, 2], Sampling(temperature=0), None)
    assert offered.propose([1, 2], 4).tokens == []
    draft = offered.propose([1, 2, 5], 4)
    assert draft.tokens == [6, 7, measure.FIRST] and draft.run == 9
    assert draft.evidence == measure.Evidence(measure.RunClass.FROM_8, measure.Agreement.AGREE)
    assert offered.propose([1, 2, 5, 6], 1).tokens == [measure.FIRST]


def test_a_change_of_batch_size_is_timed_on_the_plain_steps_after_a_draft():
    def step(drafted, ms):
        return Step(DrafterKind.NGRAM, drafted, 0, 0.0, ms / 1e3)

    # after the prompt's two: held, a draft, then the plain step just after it and the one after that
    steps = [step(0, 9.0), step(0, 9.0), step(0, 2.0), step(0, 2.0), step(3, 4.0), step(0, 5.0), step(0, 3.0), step(0, 2.0)]
    loop = measure.changes_in_the_loop([steps, steps[:3]])
    assert loop["steps"] == {"held": 4, "reshape": 1, "recapture": 1}
    assert loop["held_ms"] == 2.0 and loop["reshape"] == 1.5 and loop["recapture"] == 0.5
    assert measure.changes_in_the_loop([steps[:4]]) is None  # no plain step after a draft


def test_the_smallest_run_reports_every_stage_and_a_rerun_goes_on_where_the_last_stopped(tmp_path, monkeypatch):
    out, build, scratch = tmp_path / "out", tmp_path / "build", tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    done = run_report("--cpu", "--size", "smallest", "--out", out, "--build-dir", build)
    assert done.returncode == 0, done.stderr
    assert not list(scratch.iterdir())  # its own LOCALSPEC_HOME is gone (each CI run left one in /tmp)
    saved = json.loads((out / "report.json").read_text())
    assert saved["accelerator"] == "cpu"
    target = saved["targets"]["smallest-target"]
    assert list(target["stages"]) == list(measure.STAGES)  # most valuable first, each timed
    assert all(f"{title}, smallest-target: " in done.stderr for title, _ in measure.STAGES.values())
    assert set(target["verify"]["ratios"]) == {str(k) for k in range(1, 17)}
    assert target["verify"]["ratios"]["1"] == 1.0
    assert "not built" in target["llama_cpp"]["skipped"]  # --build was not asked for
    assert target["draft_cost"]["token_cost"] > 0 and set(target["draft_cost"]["predicted"]) == {"0.6", "0.8", "0.9"}
    assert target["draft"]["name"] == "smallest-draft"
    assert set(target["host"]) == {"backend", "host"}
    assert target["host"]["host"]["greedy"]["sampled_on"] == "host"
    assert target["host"]["backend"]["greedy"]["sampled_on"] == "backend"
    # greedy drafts of the plain run's own text: all kept, but where batched logits break a near-tie
    assert target["ceiling"]["answer k=4"]["acceptance"] >= 0.9
    assert set(target["floor"]["modes"]) == {"plain", "plain again", "draft model", "auto"}
    assert target["floor"]["modes"]["draft model"]["acceptance"] == 0.0  # a sure draft that is never right
    # auto's floor drafts nothing from plain's answer to the same prompt (the first H200 report's did, 24 steps)
    assert "suffix" not in target["floor"]["modes"]["auto"]["steps_by_drafter"]
    trees = target["trees"]  # the answer as the runner-up of two branches: kept by the tree alone
    assert set(trees) == {"plain", "answer k=4", "tree 2x4, answer 2nd", "answer k=8", "tree 2x8, answer 2nd"}
    assert trees["tree 2x4, answer 2nd"]["tokens_per_pass"] > 3 and trees["tree 2x4, answer 2nd"]["acceptance"] < 0.6
    assert set(target["parallel"]) == {"plain", "draft model"}
    assert all(row["together"] > 0 and row["one_at_a_time"] > 0 for row in target["parallel"].values())
    gap = target["gap"]
    assert set(gap["settings"]) >= {measure.OWN, "the session's target", "all of llama-bench's"}
    assert all(row["tokens_per_second"] > 0 for row in gap["settings"].values()) and gap["localspec_plain"] > 0
    assert set(gap["verify_ms"]) == {"held", "changed"} and gap["verify_ms"]["held"]["1"] > 0
    assert gap["loop"]["k"] == measure.VERIFIED and gap["loop"]["steps"] > 0
    assert target["auto_costs"]["verify_relative"]["1"] == 1.0
    shapes = target["shapes"]  # real drafters' steps replayed: padded, verifications keep one length
    assert shapes["humaneval-edit, ngram, as drafted"]["tokens_per_pass"] > 1
    for rows in measure.FIXED_ROWS:  # but near the end, where fewer tokens are left to make
        timed = shapes[f"humaneval-edit, auto, {rows} rows a step"]["verify_ms"]
        assert max(timed, key=lambda key: timed[key][0]) == f"{rows} held"
    markdown = (out / "report.md").read_text()
    assert "## smallest-target" in markdown and "Floor: auto / plain" in markdown
    assert "| tree 2x8, answer 2nd |" in markdown
    assert "| one-token decodes: all of llama-bench's |" in markdown and "Auto's costs after one generation" in markdown
    assert "| 4 sequences at once (greedy) |" in markdown and "not yet" not in markdown
    assert "| mtbench-2turn, auto, 9 rows a step |" in markdown
    policy = target["policy"]  # auto live on real n-gram offers, with its calibrated reshape and without
    assert {"humaneval-edit, auto", "humaneval-edit, auto blind to reshapes"} <= set(policy["modes"])
    assert policy["reshape"] >= 0 and "| humaneval, n-gram offers as they come |" in markdown
    loop = policy["in_the_loop"]  # (copies drafted, then plain steps: changes of batch size timed in the loop)
    assert loop["steps"]["held"] > 0 and loop["steps"]["reshape"] > 0 and "Auto's own plain steps" in markdown

    # a call cut short after three stages: the rerun measures only what is missing
    cut = json.loads((out / "report.json").read_text())
    cut_off = list(measure.STAGES)[3:]
    for stage in cut_off:
        del cut["targets"]["smallest-target"]["stages"][stage], cut["targets"]["smallest-target"][stage]
    (out / "report.json").write_text(json.dumps(cut))
    (out / "report.md").write_text(measure.markdown(cut))
    assert f"not yet: {', '.join(cut_off)}." in (out / "report.md").read_text()
    again = run_report("--cpu", "--size", "smallest", "--out", out, "--build-dir", build)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("measured before") == 3  # (a) to (c)
    rerun = json.loads((out / "report.json").read_text())["targets"]["smallest-target"]
    assert list(rerun["stages"]) == list(measure.STAGES)
    assert rerun["verify"] == target["verify"] and rerun["floor"] == target["floor"]  # kept, not measured again
    assert rerun["parallel"] != target["parallel"]  # measured again

    # --stages: those alone, again, the others kept as they were
    chosen = run_report("--cpu", "--size", "smallest", "--out", out, "--build-dir", build, "--stages", "parallel")
    assert chosen.returncode == 0, chosen.stderr
    assert "measured before" not in chosen.stderr and "(d) 4 sequences at once, smallest-target: " in chosen.stderr
    assert all(f"{title}, " not in chosen.stderr for stage, (title, _) in measure.STAGES.items() if stage != "parallel")
    again_chosen = json.loads((out / "report.json").read_text())["targets"]["smallest-target"]
    assert again_chosen["parallel"] != rerun["parallel"] and again_chosen["shapes"] == rerun["shapes"]
    assert list(again_chosen["stages"]) == list(measure.STAGES)
    unknown = run_report("--cpu", "--stages", "plain,ceiling")
    assert unknown.returncode == 2 and "--stages: no stage ceiling (the stages: plain, bounds," in unknown.stderr
    assert report.STAGE_NAMES == tuple(measure.STAGES)  # the script's list, read before anything is installed


def _packed_build(folder: Path, architectures: list[str], library: bytes) -> None:
    """A folder as --pack --cuda leaves it, holding one file for libggml-cuda.so."""
    import io
    import tarfile

    with tarfile.open(folder / "llama-cpp-cuda-sm90.tar.xz", "w:xz") as archive:
        member = tarfile.TarInfo("libggml-cuda.so")
        member.size = len(library)
        archive.addfile(member, io.BytesIO(library))
    (folder / "llama-cpp-cuda-sm90.json").write_text(json.dumps(
        {"archive": "llama-cpp-cuda-sm90.tar.xz", "architectures": architectures, "built": "2026-11-26 16:00 UTC"}))


def test_a_packed_build_for_another_architecture_is_left_for_a_build_there(tmp_path, monkeypatch, capsys):
    _packed_build(tmp_path, ["90"], b"")
    monkeypatch.setattr(report, "cuda_architecture", lambda: "80")
    report.use_prebuilt(tmp_path, tmp_path / "bin", tmp_path / "src")
    assert not (tmp_path / "bin").exists()
    assert capsys.readouterr().err == f"no packed CUDA build for sm_80 in {tmp_path} (it has: 90): building here\n"


def test_a_packed_build_that_does_not_load_says_why_in_one_line_and_is_removed(tmp_path, monkeypatch, capsys):
    _packed_build(tmp_path, ["90"], b"not a shared library " * 8)
    monkeypatch.setattr(report, "cuda_architecture", lambda: "90")
    report.use_prebuilt(tmp_path, tmp_path / "bin", tmp_path / "src")
    said = capsys.readouterr().err
    assert said.startswith("the packed CUDA build (llama-cpp-cuda-sm90.tar.xz) does not load here: ")
    assert "invalid ELF header" in said and said.endswith(": building here\n") and said.count("\n") == 1
    assert not (tmp_path / "bin").exists()  # the build there starts clean


def test_cuda_libraries_are_looked_for_in_nvidia_packages_and_the_toolkit(tmp_path, monkeypatch):
    site = tmp_path / "site"
    for name in ("nvidia/cu13/lib/libcublas.so.13", "nvidia/cudnn/lib/libcudnn.so.9"):
        (site / name).parent.mkdir(parents=True)
        (site / name).touch()
    (tmp_path / "cuda" / "lib64").mkdir(parents=True)
    monkeypatch.setattr(report, "site_folders", lambda: [site])
    monkeypatch.setattr(report, "cuda_toolkits", lambda: [tmp_path / "cuda", tmp_path / "none"])
    assert report.library_path(tmp_path / "bin").split(":") == [
        str(tmp_path / "bin"), str(site / "nvidia/cu13/lib"), str(tmp_path / "cuda" / "lib64")]


def test_cuda_architectures_go_with_pack():
    done = run_report("--cuda", "90")
    assert done.returncode == 2 and "--cuda goes with --pack" in done.stderr


def test_without_an_accelerator_it_says_how_to_measure_the_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 1
    assert "no accelerator found" in done.stderr and "--cpu" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_the_packed_sdist_builds_and_runs_beside_llama_bench(tmp_path):
    bundle = tmp_path / "bundle"
    packed = run_report("--pack", "--bundle", bundle)
    assert packed.returncode == 0, packed.stderr
    sdist = bundle / f"{report.SDIST}-trimmed.tar.gz"
    wheels = {wheel.name.split("-")[0].lower() for wheel in (bundle / "wheels").glob("*.whl")}
    assert {"gguf", "pydantic_core", "huggingface_hub", "httpx2", "diskcache"} <= wheels
    assert "numpy" not in wheels  # the device has its own
    assert "hf_xet" not in wheels  # (it fetches from the Hub, which the report never does)
    # for the device's Python 3.12 on x86-64 Linux, whatever this machine runs
    assert all(w.name.split("-")[-3] in ("py3", "py2.py3", "cp312") or w.name.split("-")[-2] == "abi3"
               for w in (bundle / "wheels").glob("*.whl"))
    assert all("x86_64" in w.name or w.name.endswith("-any.whl") for w in (bundle / "wheels").glob("*.whl"))
    # with a packed CUDA build (40.1 MiB on 2026-12-04) and the tree (5 MiB), under what a device call carries
    # (64 MiB): with hf_xet's wheel the three came to 65 MiB and the call was refused
    assert sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file()) < 18 * 2**20
    assert sdist.stat().st_size < 24 * 2**20

    out, build = tmp_path / "out", tmp_path / "build"
    done = run_report("--cpu", "--build", "--bundle", bundle, "--size", "smallest", "--out", out, "--build-dir", build,
                      timeout=1200)
    assert done.returncode == 0, done.stderr
    saved = json.loads((out / "report.json").read_text())
    assert saved["llama_bench"] == str(build / "cmake" / "bin" / "llama-bench")
    versus = saved["targets"]["smallest-target"]["llama_cpp"]
    assert versus["llama_bench_tokens_per_second"] > 0 and versus["ratio"] > 0
    assert versus["llama_bench"]["n_threads"] >= 1


def test_tests_run_on_the_llama_cpp_the_report_would_measure_and_say_their_outcome():
    """--tests: a device's lossless tests on its own GPU, in one call; pytest's exit status is the script's."""
    passed = run_report("--cpu", "--tests", "-q", "tests/test_sampling.py", "-k", "penalties")
    assert passed.returncode == 0 and " passed" in passed.stdout, passed.stderr
    failed = run_report("--cpu", "--tests", "-q", "tests/test_sampling.py", "-k", "no_test_has_this_name")
    assert failed.returncode == 5  # pytest's "no tests ran"


def test_the_tests_own_localspec_processes_import_what_the_report_does(monkeypatch, tmp_path):
    """The fifth lease: three tests that run `python -m localspec` failed on the device, their processes
    without the bundle's packages the report had put on its own path."""
    monkeypatch.setattr(report, "INTERPRETERS_PATH", list(report.sys.path))
    monkeypatch.setattr(report.sys, "path", [str(tmp_path / "bundle"), str(tmp_path / "binding"), *report.sys.path])
    monkeypatch.setenv("PYTHONPATH", "/stand-ins")
    assert report.children_path().split(os.pathsep) == [str(tmp_path / "bundle"), str(tmp_path / "binding"),
                                                        "/stand-ins"]
    monkeypatch.delenv("PYTHONPATH")
    assert report.children_path().split(os.pathsep) == [str(tmp_path / "bundle"), str(tmp_path / "binding")]


def test_tests_where_pytest_or_scipy_is_missing_say_so_in_one_line(monkeypatch, capsys):
    found = report.importlib.util.find_spec
    monkeypatch.setattr(report.importlib.util, "find_spec", lambda name: None if name == "scipy" else found(name))
    assert report.run_tests(["tests/test_sampling.py"]) == 3
    said = capsys.readouterr().err.strip()
    assert "\n" not in said and "no scipy" in said and "the bundle carries neither" in said


# What a lent device runs through --tests: its image has pytest and scipy, not the protocols' clients
ENGINE_TESTS = ("test_lossless", "test_tree", "test_tree_drafters", "test_engine", "test_hybrid", "test_mtp",
                "test_eagle3", "test_dflash", "test_sampling", "test_policy", "test_grammar")


def test_the_engines_tests_import_where_the_protocols_clients_are_missing():
    """The fifth lease lost a call: test_tree_drafters imported test_parallel's helpers, and with them
    openai and ollama, which the device lacks."""
    clients = ("openai", "ollama", "anthropic", "pexpect", "pyte", "prometheus_client", "websocket")
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in clients)
    done = subprocess.run([sys.executable, "-c", f"import sys; {blocked}; import " + ", ".join(ENGINE_TESTS)],
                          cwd=ROOT / "tests", capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
