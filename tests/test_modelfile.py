"""Models of one's own made from a Modelfile (`localspec create`, as `ollama create`): the Modelfile read as
Ollama reads it, kept, listed, shown and removed, and run, chat and serve asking as it says."""

import json
import shutil
import socket
import time

import pytest

from localspec.config import Limits, Sampling
from localspec.errors import UsageError
from localspec.store import modelfile

OLLAMAS = '''# a terse coder
FROM qwen2.5-coder-1.5b
PARAMETER temperature 0.2
parameter num_ctx 4096
PARAMETER stop "<|im_end|>"
PARAMETER stop ###
PARAMETER	num_predict	-1
PARAMETER num_gpu 99
TEMPLATE """{{ .System }} {{ .Prompt }}"""
SYSTEM """
You are terse.
Answer in one line.
"""
MESSAGE user Is Toronto in Canada?
MESSAGE assistant yes
LICENSE MIT
'''


def test_a_modelfile_is_read_as_ollama_reads_it_and_kept_so_that_it_reads_back_the_same():
    notes = []
    made = modelfile.parse(OLLAMAS, "terse", notes=notes)
    assert made.base == "qwen2.5-coder-1.5b" and made.system == "You are terse.\nAnswer in one line."
    assert made.parameters == (("temperature", 0.2), ("num_ctx", 4096), ("stop", "<|im_end|>"), ("stop", "###"),
                               ("num_predict", -1), ("num_gpu", 99))
    assert made.messages == (("user", "Is Toronto in Canada?"), ("assistant", "yes")) and made.license == "MIT"
    assert [note.split(":")[0] for note in notes] == ["line 9"]  # TEMPLATE: left alone, said
    assert modelfile.parse(made.modelfile(), "terse") == made


def test_a_system_prompt_of_several_lines_shows_as_lines_and_a_parameter_refused_names_its_modelfile(localspec, tiny,
                                                                                                       tmp_path):
    # show wrote "You are a pirate.\x0aAlways say arr."; "top-p must be in (0, 1], got 7.0" named no file
    (tmp_path / "Modelfile").write_text(f'FROM {tiny["target"]}\nSYSTEM """You are a pirate.\nAlways say arr."""\n')
    assert localspec("create", "pirate", "-f", tmp_path / "Modelfile").returncode == 0
    card = localspec("show", "pirate").stdout.decode()
    rows = [row.strip() for row in card.splitlines()]
    assert "system           You are a pirate." in rows and "Always say arr." in rows, card
    (tmp_path / "Wrong").write_text(f"FROM {tiny['target']}\nPARAMETER top_p 7\n")
    refused = localspec("create", "wrong", "-f", tmp_path / "Wrong")
    assert refused.returncode == 2 and f"{tmp_path / 'Wrong'}: PARAMETER top-p must be in (0, 1]".encode() in refused.stderr


def test_a_modelfile_saved_with_a_byte_order_mark_reads():
    # Windows' Notepad writes one first: "'\ufeffFROM' is not a Modelfile instruction"
    assert modelfile.parse("\ufeffFROM qwen2.5-coder-0.5b\r\nSYSTEM Be kind.\r\n", "kind") == modelfile.parse(
        "FROM qwen2.5-coder-0.5b\nSYSTEM Be kind.\n", "kind")


def test_its_parameters_stand_under_a_requests_own_and_its_system_prompt_where_the_conversation_has_none():
    made = modelfile.parse(OLLAMAS, "terse")
    sampling, limits = made.settings(Sampling(), Limits(max_tokens=100))
    assert sampling.temperature == 0.2 and limits.stop == ("<|im_end|>", "###") and limits.max_tokens is None
    assert made.loading()["num_ctx"] == 4096
    asked = [{"role": "user", "content": "hi"}]
    assert made.conversation(asked) == [{"role": "system", "content": made.system},
                                        {"role": "user", "content": "Is Toronto in Canada?"},
                                        {"role": "assistant", "content": "yes"}, *asked]
    own = [{"role": "system", "content": "You are a poet."}, *asked]
    assert made.conversation(own)[0] == own[0] and made.conversation(own)[1]["content"] == "Is Toronto in Canada?"
    # going on from an earlier exchange's tokens (Ollama's context), which began with its MESSAGEs: its SYSTEM
    # alone, as Ollama renders it
    assert made.conversation(asked, continued=True) == [{"role": "system", "content": made.system}, *asked]


def test_a_model_made_from_a_made_one_keeps_what_the_newer_does_not_set():
    older = modelfile.parse(OLLAMAS, "terse")
    newer = modelfile.parse("FROM terse\nPARAMETER stop END\nPARAMETER top_k 5\nSYSTEM Be kind.", "kind")
    merged = older.under(newer)
    assert merged.base == "qwen2.5-coder-1.5b" and merged.name == "kind" and merged.system == "Be kind."
    assert merged.parameters == (("temperature", 0.2), ("num_ctx", 4096), ("num_predict", -1), ("num_gpu", 99),
                                 ("stop", "END"), ("top_k", 5))
    assert merged.messages == older.messages and merged.license == "MIT"


@pytest.mark.parametrize("text, said", [
    ("SYSTEM hi", "has no FROM"),
    ("FROM a\nFROM b\nFROM c", "line 3: a third FROM: a model is made from one model and its multimodal projector"),
    ("FROM a\nPARAMETER top_k many", "line 2: PARAMETER top_k: a whole number, got 'many'"),
    ("FROM a\nPARAMETER temperature nan", "line 2: PARAMETER temperature: a number"),
    ("FROM a\nPARAMETER tfs_z 0.5", "line 2: PARAMETER tfs_z 0.5: not supported by localspec (only 1)"),
    ("FROM a\nPARAMETER warmth 1", "line 2: PARAMETER warmth: not a parameter localspec takes (temperature,"),
    ("FROM a\nPARAMETER top_k", "line 2: PARAMETER needs a name and a value"),
    ("FROM a\nSYSTEM \"\"\"never\nclosed", 'line 2: the """ opened here is never closed'),
    ("FROM a\nMESSAGE tool {}", "line 2: MESSAGE tool: the role is one of system, user, assistant"),
    ("FROM a\nQUANTIZE q4", "line 2: 'QUANTIZE' is not a Modelfile instruction"),
    ("FROM", "line 1: FROM needs a value"),
])
def test_what_a_modelfile_cannot_say_is_one_line_naming_the_line(text, said):
    with pytest.raises(UsageError, match=None) as refused:
        modelfile.parse(text, "x")
    assert said in str(refused.value)


def test_create_run_show_list_and_remove_a_model_of_ones_own(localspec, tiny, tmp_path):
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "tiny.gguf").symlink_to(tiny["target"])
    (folder / "Modelfile").write_text("FROM ./tiny.gguf\nPARAMETER temperature 0\nPARAMETER num_predict 6\n"
                                      "PARAMETER num_ctx 128\nSYSTEM You are terse.\n")
    made = localspec("create", "terse", "-f", folder / "Modelfile")
    assert made.returncode == 0, made.stderr.decode()
    assert made.stdout.decode().startswith(f"created terse from {folder.resolve() / 'tiny.gguf'}")
    shown = localspec("show", "terse", "--modelfile")
    assert shown.stdout.decode() == (f"FROM {folder.resolve() / 'tiny.gguf'}\nPARAMETER temperature 0.0\n"
                                     "PARAMETER num_predict 6\nPARAMETER num_ctx 128\nSYSTEM You are terse.\n")
    card = json.loads(localspec("show", "terse", "--json").stdout)
    assert card["name"] == "terse" and card["made"]["system"] == "You are terse."
    assert card["made"]["parameters"] == [["temperature", 0.0], ["num_predict", 6], ["num_ctx", 128]]
    listed = [json.loads(line) for line in localspec("ls", "--json").stdout.splitlines()]
    assert [(row["name"], row["made_from"]) for row in listed] == [("terse", str(folder.resolve() / "tiny.gguf"))]

    # run asks as it says: its system prompt, greedy, 6 tokens, a context of 128
    ran = json.loads(localspec("run", "terse", "Tell me a story.", "--json").stdout)
    same = json.loads(localspec("run", tiny["target"], "Tell me a story.", "--system", "You are terse.", "--temp", "0",
                                "-n", "6", "-c", "128", "--json").stdout)
    bare = json.loads(localspec("run", tiny["target"], "Tell me a story.", "--temp", "0", "-n", "6", "--json").stdout)
    assert ran["text"] == same["text"] and ran["stats"]["tokens"] == 6
    assert ran["stats"]["prompt_tokens"] == same["stats"]["prompt_tokens"] > bare["stats"]["prompt_tokens"]
    # what the command line sets stands over its parameters
    longer = json.loads(localspec("run", "terse", "Tell me a story.", "-n", "9", "--json").stdout)
    assert longer["stats"]["tokens"] == 9 and longer["text"].startswith(ran["text"])

    (tmp_path / "prompts.jsonl").write_text(json.dumps({"id": 1, "prompt": "Tell me a story."}) + "\n")
    batched = localspec("batch", "terse", tmp_path / "prompts.jsonl", "-o", tmp_path / "answers.jsonl")
    assert batched.returncode == 0, batched.stderr.decode()
    assert json.loads((tmp_path / "answers.jsonl").read_text())["text"] == ran["text"]

    # a kept Modelfile edited into one that does not read, and one made from a name no longer known: the
    # listing goes on without them, and asking for one by name says what is wrong
    (tmp_path / "home" / "presets" / "broken.Modelfile").write_text("FROM\n")
    (tmp_path / "home" / "presets" / "orphan.Modelfile").write_text("FROM no-such-model-here\n")
    assert [json.loads(line)["name"] for line in localspec("ls", "--json").stdout.splitlines()] == ["terse"]
    unlicensed = localspec("show", "terse", "--license")  # (it printed "None")
    assert unlicensed.stdout == b"" and b"terse names no licence" in unlicensed.stderr
    for flag in ("--modelfile", "--parameters", "--system", "--license", "--json"):  # (three printed FROM or nothing)
        unknown = localspec("show", "no-such-model-here", flag)
        assert unknown.returncode == 2 and b"unknown model 'no-such-model-here'" in unknown.stderr, flag
    assert localspec("show", "orphan", "--modelfile").stdout == b"FROM no-such-model-here\n"  # (to mend it by)
    broken = localspec("show", "broken")
    assert broken.returncode == 2 and b"broken.Modelfile, line 1: FROM needs a value" in broken.stderr
    orphan = localspec("run", "orphan", "hi")
    assert orphan.returncode == 2 and b"unknown model 'no-such-model-here'" in orphan.stderr

    removed = localspec("rm", "terse")
    assert removed.returncode == 0 and b"removed terse" in removed.stdout
    assert (folder / "tiny.gguf").exists() and localspec("ls", "--json").stdout == b""
    gone = localspec("run", "terse", "hi")
    assert gone.returncode != 0 and b"unknown model 'terse'" in gone.stderr


def test_create_refuses_a_registry_name_and_a_from_that_is_no_model(localspec, tmp_path):
    modelfile_path = tmp_path / "Modelfile"
    modelfile_path.write_text("FROM ./missing.gguf\n")
    taken = localspec("create", "qwen2.5-coder-1.5b", "-f", modelfile_path)
    assert taken.returncode != 0 and b"is a model the registry names" in taken.stderr
    missing = localspec("create", "mine", "-f", modelfile_path)
    assert missing.returncode != 0 and b"FROM ./missing.gguf: no such file" in missing.stderr
    (tmp_path / "notes.gguf").write_text("a file that is no model, kept and failing at every run before")
    modelfile_path.write_text("FROM ./notes.gguf\n")
    no_model = localspec("create", "mine", "-f", modelfile_path)
    assert no_model.returncode != 0 and b"notes.gguf: not a GGUF model file" in no_model.stderr
    assert b"mine" not in localspec("list").stdout
    modelfile_path.write_text("FROM qwen2.5-coder-1.5b\nPARAMETER top_p 2\n")
    wrong = localspec("create", "mine", "-f", modelfile_path)
    assert wrong.returncode != 0 and b"top-p must be in (0, 1], got 2.0" in wrong.stderr
    nowhere = localspec("create", "mine", "-f", tmp_path / "Nofile")
    assert nowhere.returncode != 0 and b"no Modelfile at" in nowhere.stderr and b"Traceback" not in nowhere.stderr


def test_serve_answers_a_made_model_as_its_modelfile_says_through_ollamas_and_openais_clients(localspec, tiny,
                                                                                             tmp_path):
    import ollama

    from test_server import ServerProcess

    home = tmp_path / "home"  # (the localspec fixture's LOCALSPEC_HOME)
    shutil.copy(tiny["partial"], tmp_path / "other.gguf")
    for name, file, extra in (("terse", tiny["target"], "SYSTEM You are terse.\n"),
                              ("other", tmp_path / "other.gguf", "")):
        (tmp_path / f"{name}.Modelfile").write_text(f"FROM {file}\nPARAMETER temperature 0\nPARAMETER num_predict 5\n"
                                                    + extra)
        assert localspec("create", name, "-f", tmp_path / f"{name}.Modelfile").returncode == 0
    server = ServerProcess(home, tiny["target"], "--alias", "tiny", "-c", "512")
    try:
        client = ollama.Client(host=server.base)
        assert {"terse", "other"} <= {m.model for m in client.list().models}
        ask = [{"role": "user", "content": "Tell me a story."}]
        made = client.chat("terse", messages=ask)
        same_ask = [{"role": "system", "content": "You are terse."}, *ask]
        same = client.chat("tiny", messages=same_ask, options={"temperature": 0, "num_predict": 5})
        assert made.message.content == same.message.content and made.eval_count == 5 == same.eval_count
        assert made.model == "terse"
        openai_client = server.client()  # its usage counts every prompt token, a cached prefix too
        answers = [openai_client.chat.completions.create(model=model, messages=messages, max_tokens=2)
                   for model, messages in (("terse", ask), ("tiny", same_ask), ("tiny", ask))]
        assert answers[0].usage.prompt_tokens == answers[1].usage.prompt_tokens > answers[2].usage.prompt_tokens
        assert answers[0].model == "terse"  # (the model serve started with answered it)
        longer = client.chat("terse", messages=ask, options={"num_predict": 7})  # the request's own over its own
        assert longer.eval_count == 7 and longer.message.content.startswith(made.message.content)
        shown = client.show("terse")
        assert shown.parameters == "temperature 0.0\nnum_predict 5"
        assert shown.modelfile.startswith(f"FROM {tiny['target']}\n") and "SYSTEM You are terse.\n" in shown.modelfile
        # one made from another file is loaded on demand, as any model a request names
        reply = openai_client.chat.completions.create(model="other", messages=ask)
        assert reply.model == "other" and reply.usage.completion_tokens == 5
        client.generate("other", prompt="", keep_alive=0)  # unloaded, and its file taken away: a 404 saying so
        (tmp_path / "other.gguf").unlink()
        with pytest.raises(ollama.ResponseError) as gone:
            client.chat("other", messages=ask)
        assert gone.value.status_code == 404 and "is made from" in str(gone.value) and "no longer there" in str(gone.value)
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()


def test_ollamas_create_copy_and_delete_through_its_client(localspec, tiny, tmp_path):
    import httpx2 as httpx
    import ollama

    from test_server import ServerProcess

    home = tmp_path / "home"
    server = ServerProcess(home, tiny["target"], "--alias", "tiny", "-c", "512")
    try:
        client = ollama.Client(host=server.base)
        statuses = [progress.status for progress in client.create(
            "terse:latest", from_=str(tiny["target"]), system="You are terse.",
            parameters={"temperature": 0, "num_predict": 5, "stop": ["\n\n", "###"], "num_thread": 4},
            template="{{ .Prompt }}", stream=True)]
        assert statuses[0] == "reading model metadata" and statuses[-1] == "success"
        assert any("num_thread left alone" in status for status in statuses)
        assert any("template left alone" in status for status in statuses)
        # kept as `localspec create` keeps it, and answered as it says
        assert localspec("show", "terse", "--modelfile").stdout.decode() == (
            f"FROM {tiny['target']}\nPARAMETER temperature 0.0\nPARAMETER num_predict 5\n"
            'PARAMETER stop """\n\n\n\n"""\nPARAMETER stop ###\nSYSTEM You are terse.\n')
        ask = [{"role": "user", "content": "Tell me a story."}]
        made = client.chat("terse", messages=ask)
        same = client.chat("tiny", messages=[{"role": "system", "content": "You are terse."}, *ask],
                           options={"temperature": 0, "num_predict": 5, "stop": ["\n\n", "###"]})
        assert made.model == "terse" and made.message.content == same.message.content
        # an older client's Modelfile text, made from the model just made
        older = httpx.post(server.base + "/api/create", json={
            "name": "kind", "modelfile": "FROM terse\nSYSTEM You are kind.", "stream": False})
        assert older.status_code == 200 and older.json() == {"status": "success"}
        kind = client.show("kind")
        assert "SYSTEM You are kind.\n" in kind.modelfile and "num_predict 5" in kind.parameters

        # a name only serve answers to (its --alias) is the file it serves (it was an unknown model)
        assert client.copy("tiny", "tiny-too").status == "success"
        assert client.chat("tiny-too", messages=ask, options={"num_predict": 3}).model == "tiny-too"
        assert client.create("tiny-terse", from_="tiny", system="You are terse.").status == "success"
        assert localspec("show", "tiny-terse", "--modelfile").stdout.decode().startswith(f"FROM {tiny['target']}")
        assert client.copy("terse", "terse-backup").status == "success"
        assert {"terse", "kind", "terse-backup"} <= {m.model for m in client.list().models}
        assert client.chat("terse-backup", messages=ask).message.content == made.message.content
        assert client.delete("terse-backup").status == "success"
        assert "terse-backup" not in {m.model for m in client.list().models}
        with pytest.raises(ollama.ResponseError) as gone:
            client.chat("terse-backup", messages=ask)
        assert gone.value.status_code == 404

        for asked, status, said in (
                (lambda: client.create("mine", from_="no-such-model"), 400, "unknown model 'no-such-model'"),
                (lambda: client.create("mine", from_="tiny", quantize="q4_K_M"), 400, "llama-quantize"),
                (lambda: client.create("mine", from_=str(tiny["target"]), parameters={"top_k": "many"}), 400,
                 "parameters.top_k: a whole number, got 'many'"),
                (lambda: client.create("bad name", from_=str(tiny["target"])), 400, "cannot name a model"),
                (lambda: client.copy("no-such-model", "mine"), 404, "no-such-model"),
                (lambda: client.delete("no-such-model"), 404, "no-such-model"),
                (lambda: client.delete("tiny"), 409, "tiny is loaded: unload it first")):
            with pytest.raises(ollama.ResponseError) as refused:
                asked()
            assert refused.value.status_code == status and said in str(refused.value), str(refused.value)
        assert server.client().models.list()  # (still serving)
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()
    assert tiny["target"].exists()


def test_no_pull_refuses_create_copy_delete_and_uploads_too(localspec, tiny, tmp_path):
    import ollama

    from test_server import ServerProcess

    (tmp_path / "Modelfile").write_text(f"FROM {tiny['target']}\n")
    assert localspec("create", "terse", "-f", tmp_path / "Modelfile").returncode == 0
    server = ServerProcess(tmp_path / "home", tiny["target"], "--no-pull")
    try:
        client = ollama.Client(host=server.base)
        for asked, what in ((lambda: client.create("mine", from_=str(tiny["target"])), "creates"),
                            (lambda: client.copy("terse", "mine"), "copies"), (lambda: client.delete("terse"), "deletes"),
                            (lambda: client.create_blob(tiny["target"]), "uploads")):
            with pytest.raises(ollama.ResponseError) as refused:
                asked()
            assert refused.value.status_code == 403 and f"{what} are off on this server" in str(refused.value)
        assert {m.model for m in client.list().models} >= {"terse"} and "mine" not in {m.model for m in client.list().models}
        assert not (tmp_path / "home" / "blobs").exists()
    finally:
        assert server.stop() == 0, server.log()


def test_cp_makes_a_model_under_another_name_with_its_settings(localspec, tiny, tmp_path):
    (tmp_path / "Modelfile").write_text(f"FROM {tiny['target']}\nPARAMETER temperature 0\nSYSTEM You are terse.\n")
    assert localspec("create", "terse", "-f", tmp_path / "Modelfile").returncode == 0
    copied = localspec("cp", "terse", "terse-v2")
    assert copied.returncode == 0 and b"copied terse to terse-v2" in copied.stdout
    assert localspec("show", "terse-v2", "--modelfile").stdout == localspec("show", "terse", "--modelfile").stdout
    assert localspec("cp", "qwen2.5-coder-1.5b", "coder").returncode == 0  # a registry model, as it is
    assert localspec("show", "coder", "--modelfile").stdout == b"FROM qwen2.5-coder-1.5b\n"
    for source, destination, said in (("terse", "qwen2.5-coder-1.5b", b"is a model the registry names"),
                                      ("no-such-model", "mine", b"unknown model 'no-such-model'"),
                                      ("terse", "two words", b"cannot name a model")):
        refused = localspec("cp", source, destination)
        assert refused.returncode == 2 and said in refused.stderr and b"Traceback" not in refused.stderr


def test_a_gguf_uploaded_as_ollamas_clients_upload_it_makes_a_model(localspec, tiny, tmp_path):
    import hashlib

    import httpx2 as httpx
    import ollama

    from test_server import ServerProcess

    home = tmp_path / "home"
    elsewhere = tmp_path / "client-side.gguf"  # (the client's file: the server keeps its own copy)
    shutil.copy(tiny["partial"], elsewhere)
    server = ServerProcess(home, tiny["target"], "--alias", "tiny", "-c", "512")
    try:
        client = ollama.Client(host=server.base)
        digest = "sha256:" + hashlib.sha256(elsewhere.read_bytes()).hexdigest()
        assert httpx.head(f"{server.base}/api/blobs/{digest}").status_code == 404
        assert client.create_blob(elsewhere) == digest
        assert httpx.head(f"{server.base}/api/blobs/{digest}").status_code == 200
        assert client.create("uploaded", files={"client-side.gguf": digest}, system="You are terse.",
                             parameters={"num_predict": 3, "temperature": 0}).status == "success"
        elsewhere.unlink()
        reply = client.chat("uploaded", messages=[{"role": "user", "content": "hi"}])
        assert reply.model == "uploaded" and reply.eval_count == 3
        kept = localspec("show", "uploaded", "--modelfile").stdout.decode().splitlines()[0]
        assert kept.startswith(f"FROM {home / 'blobs' / 'sha256-'}")

        wrong = "sha256:" + "0" * 64  # bytes that are not what their digest says: nothing kept
        sent = httpx.post(f"{server.base}/api/blobs/{wrong}", content=b"GGUF and more")
        assert sent.status_code == 400 and "nothing was kept" in sent.json()["error"]
        assert httpx.head(f"{server.base}/api/blobs/{wrong}").status_code == 404
        assert [path.name for path in (home / "blobs").iterdir()] == [digest.replace(":", "-")]
        text = b"not a model"
        text_digest = "sha256:" + hashlib.sha256(text).hexdigest()
        assert httpx.post(f"{server.base}/api/blobs/{text_digest}", content=text).status_code == 201
        for files, said in (({"notes.gguf": text_digest}, "notes.gguf is not a GGUF file"),
                            ({"model.gguf": wrong}, "has not been uploaded"),
                            ({"model.safetensors": digest}, "only GGUF files are taken, a model and its projector")):
            with pytest.raises(ollama.ResponseError) as refused:
                client.create("mine", files=files)
            assert refused.value.status_code == 400 and said in str(refused.value), str(refused.value)
        with pytest.raises(ollama.ResponseError) as both:
            client.create("mine", from_="tiny", files={"client-side.gguf": digest})
        assert both.value.status_code == 400 and "from and files" in str(both.value)
        assert httpx.post(f"{server.base}/api/blobs/sha256:nothex", content=b"x").status_code == 400
        # a file uploaded for a model goes with the last model made from it, as Ollama prunes its blobs
        assert client.copy("uploaded", "uploaded-too").status == "success"
        assert client.delete("uploaded").status == "success" and (home / "blobs" / digest.replace(":", "-")).exists()
        assert client.delete("uploaded-too").status == "success"
        assert not (home / "blobs" / digest.replace(":", "-")).exists()
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()


def test_an_upload_that_stops_or_is_cut_off_keeps_nothing_and_is_no_fault_of_the_server(tiny, tmp_path):
    # one that stopped sending held its connection and partial file until the client closed it, and a
    # client gone mid-body was logged as a 500 with a traceback, as a bug of serve's own
    import httpx2 as httpx

    from test_server import ServerProcess, _closed_by_the_server

    home = tmp_path / "home"
    server = ServerProcess(home, tiny["target"], "-c", "256", "--timeout", "1")
    digest = "sha256:" + "1" * 64
    started = f"POST /api/blobs/{digest} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000\r\n\r\n".encode()
    try:
        port = int(server.base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as stopped:
            stopped.sendall(started + b"GGUF" * 100)
            answer = _closed_by_the_server(stopped, 10) or b""
        assert b" 408 " in answer.split(b"\r\n")[0] and b"nothing arrived for 1 s" in answer, answer
        for started_body in (started, b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                                      b"Content-Length: 100000\r\n\r\n{\"messages\": "):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as cut:
                cut.sendall(started_body + b"GGUF" * 100)
                time.sleep(0.3)
        deadline = time.monotonic() + 10
        while list((home / "blobs").iterdir()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list((home / "blobs").iterdir()) == []  # (no partial file left)
        assert httpx.get(server.base + "/health").status_code == 200
        assert server.log().count("the client went away before its request had arrived") == 2, server.log()
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()


def test_num_gpu_is_the_layers_on_the_gpu_and_minus_one_is_ollamas_auto():
    """PARAMETER num_gpu (Ollama's layers on the GPU) was refused as unknown: now -ngl's count, -1 auto."""
    from localspec.cli.options import _options_of

    made = modelfile.parse("FROM x\nPARAMETER num_gpu 20\nPARAMETER num_ctx 512\nPARAMETER temperature 0\n", "m")
    assert _options_of(made) == {"temp": 0.0, "ctx_size": 512, "gpu_layers": "20"}
    assert _options_of(modelfile.parse("FROM x\nPARAMETER num_gpu -1\n", "m")) == {"gpu_layers": "auto"}
