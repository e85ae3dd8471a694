"""Ollama's models read in place: a store laid out as Ollama lays it out (manifests naming blobs by digest), each
tag a model of one's own made FROM its GGUF blob with what its Modelfile said; listed, shown, run, served and
copied, never written or removed."""

import hashlib
import json
import os
from pathlib import Path

import pytest

from localspec import store
from localspec.errors import UsageError
from localspec.store import ollama_models
from processes import runner

MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def _blob(models, content: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(content).hexdigest()
    (models / "blobs").mkdir(parents=True, exist_ok=True)
    (models / "blobs" / digest.replace(":", "-")).write_bytes(content)
    return digest


def _tag(models, path: str, layers: dict[str, bytes]) -> None:
    manifest = models / "manifests" / path
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "mediaType": MANIFEST, "layers": [
        {"mediaType": f"application/vnd.ollama.image.{kind}", "digest": _blob(models, content), "size": len(content)}
        for kind, content in layers.items()]}))


@pytest.fixture
def ollamas(tmp_path, tiny, monkeypatch):
    """An Ollama store as `ollama pull` leaves one: a library model with its parameters and system prompt, one pulled
    from the Hub by hf.co/, one whose pull is under way (a blob missing), and a manifest that is no JSON."""
    models = tmp_path / "ollama-models"
    gguf = tiny["target"].read_bytes()
    _tag(models, "registry.ollama.ai/library/tinyllm/latest", {
        "model": gguf, "template": b"{{ .Prompt }}", "system": b"You are terse.",
        # (num_keep: Ollama's, left to localspec; a parameter of a newer Ollama's: not read)
        "params": json.dumps({"temperature": 0, "num_predict": 5, "stop": ["<|im_end|>", "###"], "num_keep": 24,
                              "some_newer_parameter": 1}).encode(),
        "license": b"MIT"})
    _tag(models, "hf.co/test/tiny-GGUF/Q4_K_M", {"model": gguf})
    _tag(models, "registry.ollama.ai/library/halfway/latest", {"model": b"GGUF, the first bytes of it"})
    (models / "blobs" / ("sha256-" + hashlib.sha256(b"GGUF, the first bytes of it").hexdigest())).unlink()
    _tag(models, "registry.ollama.ai/library/tinyllm/3b", {"model": gguf})  # (the same blob as tinyllm:latest)
    (models / "manifests" / "registry.ollama.ai" / "library" / "broken").mkdir()
    (models / "manifests" / "registry.ollama.ai" / "library" / "broken" / "latest").write_text("{not json")
    monkeypatch.setenv("OLLAMA_MODELS", str(models))
    return models


def test_each_tag_ollama_has_whole_is_a_model_made_from_its_blob_with_its_settings(ollamas, tiny, tmp_path,
                                                                                    monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    made = store.made("tinyllm")
    blob = str(ollamas / "blobs" / ("sha256-" + hashlib.sha256(tiny["target"].read_bytes()).hexdigest()))
    assert (made.name, made.base, made.system, made.license) == ("tinyllm:latest", blob, "You are terse.", "MIT")
    assert made.parameters == (("temperature", 0.0), ("num_predict", 5), ("stop", "<|im_end|>"), ("stop", "###"))
    assert made.kept == str(ollamas / "manifests" / "registry.ollama.ai" / "library" / "tinyllm" / "latest")
    for name in ("tinyllm:latest", "ollama:tinyllm", "library/tinyllm", "registry.ollama.ai/library/tinyllm:latest"):
        assert store.made(name) == made, name
    assert store.made("hf.co/test/tiny-GGUF:Q4_K_M").system is None
    assert store.made("tinyllm:3b").name == "tinyllm:3b"
    for name in ("tinyllm:7b", "halfway", "broken", "../../etc/passwd", "ollama:../tinyllm", "a/b/c/d/e:1", ""):
        assert store.made(name) is None, name
    assert [m.name for m in store.every_made()] == ["hf.co/test/tiny-GGUF:Q4_K_M", "tinyllm:3b", "tinyllm:latest"]
    assert store.find("ollama:tinyllm") == Path(blob)
    with pytest.raises(UsageError, match="`ollama rm tinyllm:latest` removes it"):
        store.forget("tinyllm")
    # a model made FROM one of Ollama's is made from its file, with Ollama's settings under its own, and is ours
    mine, _ = store.create("terser", "FROM tinyllm\nPARAMETER num_predict 2\n")
    assert (mine.base, mine.system, mine.kept) == (blob, "You are terse.", None)
    assert ("num_predict", 2) in mine.parameters and ("temperature", 0.0) in mine.parameters
    # a model made here by a name Ollama's has hides it; ollama: still names Ollama's
    store.create("tinyllm", f"FROM {blob}\nSYSTEM Mine.\n")
    assert store.made("tinyllm").system == "Mine." and store.made("ollama:tinyllm").system == "You are terse."
    assert [m.name for m in store.every_made()].count("tinyllm") == 1
    # a draft named by the family (a size, auto) is read against the registry model an Ollama name stands for
    _tag(ollamas, "registry.ollama.ai/library/qwen2.5-coder/1.5b", {"model": tiny["target"].read_bytes()})
    coder = store.made("qwen2.5-coder:1.5b")
    assert coder.kept and store.draft_for(coder, "0.5b") == store.draft_for(coder, "auto") == "qwen2.5-coder-0.5b"
    assert store.draft_for(coder, "ngram") == "ngram" and store.draft_for(made, "0.5b") == "0.5b"
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "none-here"))
    assert ollama_models.every() == [] and store.made("tinyllm:3b") is None


def test_ollamas_models_are_listed_shown_run_and_copied_but_left_for_ollama_to_remove(ollamas, tiny, tmp_path):
    localspec = runner(tmp_path / "home", OLLAMA_MODELS=str(ollamas))
    listed = [json.loads(line) for line in localspec("ls", "--json").stdout.splitlines()]
    assert [row["name"] for row in listed] == ["hf.co/test/tiny-GGUF:Q4_K_M", "tinyllm:3b", "tinyllm:latest"]
    assert listed[-1]["kept"] == str(ollamas / "manifests" / "registry.ollama.ai" / "library" / "tinyllm" / "latest")
    assert listed[-1]["keeper"] == "Ollama"
    table = localspec("ls", COLUMNS="200").stdout
    assert "Ollama's" in table and "sha256-" not in table  # (whose it is, not its blob's path)
    card = localspec("show", "tinyllm", COLUMNS="300").stdout
    assert "Ollama's" in card and str(ollamas / "manifests" / "registry.ollama.ai" / "library" / "tinyllm") in card
    shown = localspec("show", "tinyllm", "--modelfile")
    assert "SYSTEM You are terse." in shown.stdout and "PARAMETER num_predict 5" in shown.stdout, shown.stderr
    # run asks as Ollama's Modelfile says: its system prompt, greedy, 5 tokens
    running = localspec("run", "tinyllm", "Tell me a story.", "--json")
    assert running.returncode == 0, running.stderr
    ran = json.loads(running.stdout)
    same = json.loads(localspec("run", tiny["target"], "Tell me a story.", "--system", "You are terse.", "--temp", "0",
                                "-n", "5", "--stop", "<|im_end|>", "--stop", "###", "--json").stdout)
    assert ran["text"] == same["text"] and ran["stats"]["tokens"] == same["stats"]["tokens"] <= 5
    assert ran["stats"]["prompt_tokens"] == same["stats"]["prompt_tokens"]
    drafted = json.loads(localspec("run", "tinyllm", "Tell me a story.", "--draft", "ollama:tinyllm:3b", "--spec",
                                   "fixed", "--json").stdout)
    assert drafted["text"] == ran["text"] and drafted["stats"]["drafted"] > 0, drafted["stats"]
    removed = localspec("rm", "tinyllm")
    assert removed.returncode == 2 and "`ollama rm tinyllm:latest` removes it" in removed.stderr, removed.stderr
    assert "Traceback" not in removed.stderr and (ollamas / "manifests" / "registry.ollama.ai").is_dir()
    copied = localspec("cp", "tinyllm", "mine")
    assert copied.returncode == 0, copied.stderr
    assert "SYSTEM You are terse." in localspec("show", "mine", "--modelfile").stdout
    assert localspec("rm", "mine").returncode == 0 and store_blobs_kept(ollamas)


def store_blobs_kept(ollamas) -> bool:
    return len(list((ollamas / "blobs").iterdir())) == 5  # (the GGUF, template, system, params, licence)


def test_serve_lists_ollamas_models_and_loads_one_a_request_names(ollamas, tiny, tmp_path):
    import ollama
    from test_server import ServerProcess

    server = ServerProcess(tmp_path / "home", tiny["target"], "--no-draft", "-c", "256",
                           env={**os.environ, "OLLAMA_MODELS": str(ollamas)})
    try:
        client = ollama.Client(host=server.base)
        listed = {model.model: model.digest for model in client.list().models}
        assert {"tinyllm:latest", "tinyllm:3b"} <= set(listed)
        # an Ollama blob's digest is the sha256 its name says
        assert {f"sha256-{listed[name]}" for name in ("tinyllm:latest", "tinyllm:3b")} <= {
            blob.name for blob in (ollamas / "blobs").iterdir()}
        answer = client.generate("tinyllm", prompt="Tell me a story.")
        assert answer.done and answer.model == "tinyllm" and answer.eval_count <= 5, answer
        with pytest.raises(ollama.ResponseError) as refused:
            client.delete("tinyllm:3b")
        assert refused.value.status_code == 400 and "ollama rm tinyllm:3b" in str(refused.value)
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()
