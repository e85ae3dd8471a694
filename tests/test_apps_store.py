"""Jan's and GPT4All's models read in place, as Ollama's are (test_ollama_store.py): folders laid out as those apps
lay them out, each model one made FROM its file, named as the app names it; listed, shown, run and served, never
written or removed."""

import json
import os
from pathlib import Path

import pytest

from localspec import store
from localspec.errors import UsageError
from localspec.store import gpt4all_models, jan_models
from processes import runner


def _jan_model(data: Path, model_id: str, **fields) -> Path:
    described = data / "llamacpp" / "models" / model_id / "model.yml"
    described.parent.mkdir(parents=True, exist_ok=True)
    described.write_text("".join(f"{key}: {json.dumps(value)}\n" for key, value in fields.items()))
    return described


@pytest.fixture
def jan(tmp_path, tiny, monkeypatch):
    """Jan's data folder as Jan 0.6 leaves it: a model it downloaded (model.gguf beside its YAML), one it imported
    (its YAML naming the file where it lay), one the `jan` command line downloaded under its repo's name, one with
    a vision projector, a download under way (no YAML yet), a YAML naming a file that is gone, and one that is no
    YAML."""
    data = tmp_path / "jan-data"
    downloaded = data / "llamacpp" / "models" / "Tiny-1B-Q4_K_M" / "model.gguf"
    downloaded.parent.mkdir(parents=True)
    downloaded.write_bytes(tiny["target"].read_bytes())
    _jan_model(data, "Tiny-1B-Q4_K_M", model_path="llamacpp/models/Tiny-1B-Q4_K_M/model.gguf",
               name="Tiny-1B-Q4_K_M", size_bytes=downloaded.stat().st_size, embedding=False)
    _jan_model(data, "imported-tiny", model_path=str(tiny["same"]), name="imported-tiny", embedding=False)
    by_repo = data / "llamacpp" / "models" / "test" / "tiny-GGUF" / "tiny-q4_k_m.gguf"
    by_repo.parent.mkdir(parents=True)
    by_repo.write_bytes(tiny["target"].read_bytes())
    _jan_model(data, "test/tiny-GGUF", model_path="llamacpp/models/test/tiny-GGUF/tiny-q4_k_m.gguf")
    (data / "llamacpp" / "models" / "seeing" / "mmproj.gguf").parent.mkdir(parents=True)
    (data / "llamacpp" / "models" / "seeing" / "mmproj.gguf").write_bytes(b"a projector")
    _jan_model(data, "seeing", model_path=str(tiny["target"]), mmproj_path="llamacpp/models/seeing/mmproj.gguf")
    halfway = data / "llamacpp" / "models" / "halfway"
    halfway.mkdir(parents=True)
    (halfway / "model.gguf.tmp").write_bytes(b"GGUF, the first bytes of it")
    _jan_model(data, "gone", model_path="llamacpp/models/gone/model.gguf")
    (data / "llamacpp" / "models" / "broken").mkdir()
    (data / "llamacpp" / "models" / "broken" / "model.yml").write_text("model_path: [unclosed\n")
    monkeypatch.setenv("JAN_DATA_FOLDER", str(data))
    return data


@pytest.fixture
def gpt4all(tmp_path, tiny, monkeypatch):
    """GPT4All's download path: a model, one in a folder of its own, a download under way, and its other files."""
    models = tmp_path / "gpt4all"
    (models / "mine").mkdir(parents=True)
    (models / "tiny.Q4_0.gguf").write_bytes(tiny["target"].read_bytes())
    (models / "mine" / "other.gguf").write_bytes(tiny["same"].read_bytes())
    (models / "incomplete-big.Q4_0.gguf").write_bytes(b"GGUF, the first bytes of it")
    (models / "localdocs_v3.db").write_bytes(b"")
    monkeypatch.setenv("LOCALSPEC_GPT4ALL_MODELS", str(models))
    return models


def test_jans_models_are_models_made_from_their_files(jan, tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    made = store.made("Tiny-1B-Q4_K_M")
    yaml_path = jan / "llamacpp" / "models" / "Tiny-1B-Q4_K_M" / "model.yml"
    assert (made.base, made.kept, made.keeper, made.system) == (
        str(jan / "llamacpp" / "models" / "Tiny-1B-Q4_K_M" / "model.gguf"), str(yaml_path), "Jan", None)
    assert store.made("jan:Tiny-1B-Q4_K_M") == made
    assert store.made("imported-tiny").base == str(tiny["same"])  # (an import: the file where it lay)
    assert store.made("test/tiny-GGUF").base.endswith("tiny-q4_k_m.gguf")
    assert store.made("seeing").projector == str(jan / "llamacpp" / "models" / "seeing" / "mmproj.gguf")
    for name in ("halfway", "gone", "broken", "jan:../jan-data", "jan:llamacpp", "jan:", "ollama:Tiny-1B-Q4_K_M"):
        assert store.made(name) is None, name
    assert [m.name for m in store.every_made()] == ["imported-tiny", "seeing", "test/tiny-GGUF", "Tiny-1B-Q4_K_M"]
    assert store.find("Tiny-1B-Q4_K_M") == jan / "llamacpp" / "models" / "Tiny-1B-Q4_K_M" / "model.gguf"
    with pytest.raises(UsageError, match=f"Tiny-1B-Q4_K_M is Jan's model, read in place \\({yaml_path}\\): Jan"):
        store.forget("Tiny-1B-Q4_K_M")
    mine = store.copy("Tiny-1B-Q4_K_M", "mine")  # (a copy is ours: removed here, the file left)
    assert (mine.kept, mine.keeper) == (None, None) and store.forget("mine") and made.base and Path(made.base).is_file()
    # the data folder Jan's settings name, where JAN_DATA_FOLDER is not set
    monkeypatch.delenv("JAN_DATA_FOLDER")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "share"))
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert jan_models.data_folder() == tmp_path / "share" / "Jan" / "data" and store.made("Tiny-1B-Q4_K_M") is None
    (tmp_path / "share" / "Jan").mkdir(parents=True)
    (tmp_path / "share" / "Jan" / "settings.json").write_text(json.dumps({"data_folder": str(jan)}))
    assert store.made("Tiny-1B-Q4_K_M") == made


def test_gpt4alls_models_are_its_files_by_name(gpt4all, tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    made = store.made("tiny.Q4_0.gguf")
    assert (made.base, made.kept, made.keeper) == (str(gpt4all / "tiny.Q4_0.gguf"),) * 2 + ("GPT4All",)
    assert store.made("tiny.Q4_0") == store.made("gpt4all:tiny.Q4_0.gguf") == made
    assert store.made("mine/other.gguf").base == str(gpt4all / "mine" / "other.gguf")
    for name in ("incomplete-big.Q4_0.gguf", "big.Q4_0.gguf", "localdocs_v3.db", "gpt4all:../gpt4all/tiny.Q4_0",
                 f"gpt4all:{gpt4all / 'tiny.Q4_0.gguf'}", "gpt4all:"):
        assert store.made(name) is None, name
    assert [m.name for m in store.every_made()] == ["mine/other.gguf", "tiny.Q4_0.gguf"]
    with pytest.raises(UsageError, match="tiny.Q4_0.gguf is GPT4All's model, read in place .*: GPT4All deletes it"):
        store.forget("tiny.Q4_0.gguf")
    # a file of that name in the working folder is that file; gpt4all: still names GPT4All's
    (tmp_path / "tiny.Q4_0.gguf").write_bytes(tiny["same"].read_bytes())
    assert store.made("tiny.Q4_0.gguf") is None and store.find("tiny.Q4_0.gguf") == Path("tiny.Q4_0.gguf")
    assert store.made("gpt4all:tiny.Q4_0.gguf") == made
    # the download path GPT4All's settings name, where nothing says otherwise
    monkeypatch.delenv("LOCALSPEC_GPT4ALL_MODELS")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "share"))
    assert gpt4all_models.folder() == tmp_path / "share" / "nomic.ai" / "GPT4All"
    (tmp_path / "config" / "nomic.ai").mkdir(parents=True)
    (tmp_path / "config" / "nomic.ai" / "GPT4All.ini").write_text(f"[General]\nmodelPath={gpt4all}/\nuserDefaultModel"
                                                                  "=Application default\n")
    assert store.made("gpt4all:tiny.Q4_0") == made


def test_jans_and_gpt4alls_models_are_listed_shown_and_run_but_left_for_them_to_remove(jan, gpt4all, tiny, tmp_path):
    localspec = runner(tmp_path / "home", JAN_DATA_FOLDER=str(jan), LOCALSPEC_GPT4ALL_MODELS=str(gpt4all))
    listed = {row["name"]: row for row in map(json.loads, localspec("ls", "--json").stdout.splitlines())}
    assert {"Tiny-1B-Q4_K_M", "test/tiny-GGUF", "tiny.Q4_0.gguf", "mine/other.gguf"} <= set(listed), listed
    assert listed["Tiny-1B-Q4_K_M"]["keeper"] == "Jan" and listed["tiny.Q4_0.gguf"]["keeper"] == "GPT4All"
    assert listed["Tiny-1B-Q4_K_M"]["kept"] == str(jan / "llamacpp" / "models" / "Tiny-1B-Q4_K_M" / "model.yml")
    table = localspec("ls", COLUMNS="200").stdout
    assert "Jan's" in table and "GPT4All's" in table and "model.gguf" not in table
    card = localspec("show", "Tiny-1B-Q4_K_M", COLUMNS="300").stdout
    assert "Jan's" in card and "model.yml" in card, card
    ran = json.loads(localspec("run", "Tiny-1B-Q4_K_M", "Tell me a story.", "-n", "6", "--temp", "0", "--json").stdout)
    same = json.loads(localspec("run", tiny["target"], "Tell me a story.", "-n", "6", "--temp", "0", "--json").stdout)
    assert ran["text"] == same["text"] and ran["stats"]["tokens"] == same["stats"]["tokens"]
    drafted = json.loads(localspec("run", "gpt4all:tiny.Q4_0", "Tell me a story.", "-n", "6", "--temp", "0",
                                   "--draft", "imported-tiny", "--spec", "fixed", "--json").stdout)
    assert drafted["text"] == same["text"] and drafted["stats"]["drafted"] > 0, drafted["stats"]
    for name, keeper in (("Tiny-1B-Q4_K_M", "Jan"), ("tiny.Q4_0.gguf", "GPT4All")):
        removed = localspec("rm", name)
        assert removed.returncode == 2 and f"{keeper} deletes it" in removed.stderr, removed.stderr
        assert "Traceback" not in removed.stderr
    assert (jan / "llamacpp" / "models" / "Tiny-1B-Q4_K_M" / "model.gguf").is_file()
    assert (gpt4all / "tiny.Q4_0.gguf").is_file()


def test_serve_lists_jans_and_gpt4alls_models_and_loads_one_a_request_names(jan, gpt4all, tiny, tmp_path):
    import ollama
    import openai
    from test_server import ServerProcess

    server = ServerProcess(tmp_path / "home", "Tiny-1B-Q4_K_M", "--no-draft", "-c", "256",
                           env={**os.environ, "JAN_DATA_FOLDER": str(jan), "LOCALSPEC_GPT4ALL_MODELS": str(gpt4all)})
    try:
        client = ollama.Client(host=server.base)
        listed = [model.model for model in client.list().models]
        assert {"Tiny-1B-Q4_K_M", "tiny.Q4_0.gguf"} <= set(listed) and listed.count("Tiny-1B-Q4_K_M") == 1, listed
        assert {"test/tiny-GGUF", "mine/other.gguf"} <= {model.id for model in
                                                         openai.OpenAI(base_url=server.url, api_key="-").models.list()}
        answer = client.generate("tiny.Q4_0", prompt="Tell me a story.", options={"num_predict": 4})  # (loaded now)
        assert answer.done and answer.model == "tiny.Q4_0" and answer.eval_count <= 4, answer
        with pytest.raises(ollama.ResponseError) as refused:
            client.delete("tiny.Q4_0.gguf")
        assert refused.value.status_code == 400 and "GPT4All deletes it" in str(refused.value)
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()
