"""serve's models on demand: a request's `model` names any downloaded registry model, loaded when first
asked, unloaded once idle for its keep-alive or, least recently used first, when another needs the
memory; a name that is not here is one 404 in the client's protocol."""

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx2 as httpx
import lmstudio as lms
import ollama
import openai
import pytest

from localspec.store import gguf_meta, hardware
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.pool import NoRoom, Pool
from localspec.request import Request
from localspec.session import Session
from localspec.stats import record

from processes import localspec_process
from test_server import PROMPT, ServerProcess
from tinybert import N_EMBD, write_tiny_bert

REGISTRY = """
[families.tiny]
license = "test-licence"

[models.tiny-b]
family = "tiny"
params = "1M"
repo = "test/tiny-b-GGUF"
file = "b.gguf"
draft = "tiny-c"

[models.tiny-c]
family = "tiny"
params = "1M"
repo = "test/tiny-c-GGUF"
file = "c.gguf"
aliases = ["cee"]

[models.tiny-embed]
family = "tiny"
params = "1M"
repo = "test/tiny-embed-GGUF"
file = "embed.gguf"

[models.tiny-b-mtp]
family = "tiny"
repo = "test/tiny-b-GGUF"
file = "mtp-b.gguf"
drafts = "mtp"

[models.tiny-gone]
family = "tiny"
params = "1M"
repo = "test/tiny-gone-GGUF"
file = "gone.gguf"
"""


@pytest.fixture
def home(tmp_path, tiny):
    return downloaded_home(tmp_path / "home", tiny)


def downloaded_home(home: Path, tiny) -> Path:
    """A home whose registry names three more tiny models, two of them downloaded, and an embedding model."""
    (home / "models" / "tiny-b").mkdir(parents=True)
    (home / "models" / "tiny-c").mkdir(parents=True)
    (home / "models.toml").write_text(REGISTRY)
    shutil.copy(tiny["unrelated"], home / "models" / "tiny-b" / "b.gguf")
    shutil.copy(tiny["partial"], home / "models" / "tiny-c" / "c.gguf")
    (home / "models" / "tiny-embed").mkdir(parents=True)
    write_tiny_bert(home / "models" / "tiny-embed" / "embed.gguf")
    (home / "models" / "tiny-b-mtp").mkdir(parents=True)  # (a drafter's file: any GGUF stands in for it here)
    shutil.copy(tiny["same"], home / "models" / "tiny-b-mtp" / "mtp-b.gguf")
    return home


def plain_text(path, max_tokens: int = 8) -> str:
    with Session(path, None, Runtime(ctx_size=512), Speculation(drafting=DrafterKind.PLAIN)) as session:
        tokens = session.prompts.chat_tokens([{"role": "user", "content": PROMPT}])
        return record(session.generate(Request(Sampling(temperature=0), Limits(max_tokens), prompt=tokens))).text


def stop_command(home, name, *args, command: str = "stop") -> subprocess.CompletedProcess:
    process = localspec_process(home, command, name, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = process.communicate(timeout=60)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def test_load_puts_a_model_into_the_running_serve_as_lms_load_does(home, tiny):
    """LM Studio's `lms load`: a downloaded model loaded into the serve on this machine before a request needs it,
    for --ttl seconds once idle (-1: while serve runs); nothing to load into, or a model not downloaded, said."""
    refused = stop_command(home, "tiny-c", command="load")
    assert refused.returncode == 2 and "no `localspec serve` runs on this machine" in refused.stderr, refused.stderr
    server = ServerProcess(home, tiny["target"], "--alias", "tiny", "--temp", "0", "-c", "512")
    try:
        loading = stop_command(home, "cee", "--ttl", "-1", command="load")
        assert loading.returncode == 0 and loading.stdout.startswith("loaded cee into localspec serve at"), loading
        assert "while that serve runs" in loading.stdout and loaded(server) == ["tiny", "tiny-c"]
        briefly = stop_command(home, "tiny-b", "--ttl", "600", command="load")
        assert briefly.returncode == 0 and "unless asked for" in briefly.stdout, briefly.stderr
        own = stop_command(home, str(tiny["target"]), "--ttl", "600", command="load")  # (said "until ... unless asked for")
        assert own.returncode == 0 and "is the model localspec serve" in own.stdout and "started with" in own.stdout
        missing = stop_command(home, "tiny-gone", command="load")
        assert missing.returncode == 2 and "not a downloaded model" in missing.stderr, missing.stderr
        # stop's TAB offers what serves loaded on demand (not the model a serve started with, which stays)
        assert sorted(tab(home, "stop", "")) == ["tiny-b", "tiny-c"] and tab(home, "unload", "tiny-c") == ["tiny-c"]
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()


def tab(home, *words: str) -> list[str]:
    """What the shell's TAB offers for the last word (typer's bash protocol, which zsh's and fish's scripts speak
    too)."""
    env = {**os.environ, "_LOCALSPEC_COMPLETE": "complete_bash", "COMP_WORDS": " ".join(("localspec", *words)),
           "COMP_CWORD": str(len(words))}
    return localspec_process(home, env=env, stdout=subprocess.PIPE, text=True).communicate(timeout=60)[0].split()


def loaded(server) -> list[str]:
    return sorted(m["name"] for m in httpx.get(server.base + "/api/ps").json()["models"])


def test_the_first_models_rope_scaling_is_not_another_models(home, tiny):
    """serve's --rope-* options are the model serve started with's (another's file says its own): a model loaded on
    demand ran with them too, its text another."""
    server = ServerProcess(home, tiny["target"], "--alias", "tiny", "--temp", "0", "-c", "512", "--rope-scaling",
                           "linear", "--rope-scale", "4")
    try:
        reply = server.client().chat.completions.create(model="tiny-b", max_tokens=8,
                                                        messages=[{"role": "user", "content": PROMPT}])
        assert reply.choices[0].message.content == plain_text(home / "models/tiny-b/b.gguf")
    finally:
        assert server.stop() == 0, server.log()


def test_a_request_names_another_downloaded_model_which_loads_then_unloads_when_idle(home, tiny):
    server = ServerProcess(home, tiny["target"], "--alias", "tiny", "--temp", "0", "-c", "512", "--keep-alive", "2")
    try:
        client = server.client()
        listed = {m.id: m.model_extra["meta"]["loaded"] for m in client.models.list().data}
        assert listed == {"tiny": True, "tiny-b": False, "tiny-c": False, "tiny-embed": False}
        tags = ollama.Client(host=server.base).list().models
        assert sorted(m.model for m in tags) == ["tiny", "tiny-b", "tiny-c", "tiny-embed"]
        # one digest a file (it was the vocabulary's: models of one tokenizer were one to a client)
        assert len({m.digest for m in tags}) == 4 and all(len(m.digest) == 64 for m in tags)

        reply = client.chat.completions.create(model="tiny-b", messages=[{"role": "user", "content": PROMPT}],
                                               max_tokens=8)
        # (before its keep-alive of two seconds ends: plain_text, below, takes longer on a busy machine)
        listed, now_loaded = client.models.list().data, loaded(server)
        assert now_loaded == ["tiny", "tiny-b"]
        assert reply.model == "tiny-b" and reply.choices[0].message.content == plain_text(home / "models/tiny-b/b.gguf")
        # its registry draft is downloaded too: it drafts with it
        assert "c.gguf" == listed[1].model_extra["meta"]["draft"]
        # the one it started with answers as before, and an alias finds its model
        assert client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPT}],
                                              max_tokens=4).model == "tiny"
        assert client.completions.create(model="cee", prompt=PROMPT, max_tokens=4).model == "tiny-c"

        deadline = time.monotonic() + 20
        while loaded(server) != ["tiny"] and time.monotonic() < deadline:
            time.sleep(0.25)
        assert loaded(server) == ["tiny"], server.log()
        assert "unloaded tiny-b (idle beyond its keep-alive)" in server.log()

        answer = ollama.Client(host=server.base).generate("tiny-c", prompt=PROMPT, keep_alive=-1,
                                                          options={"num_predict": 4})
        assert answer.done and loaded(server) == ["tiny", "tiny-c"]
        # the request waited for its model's load: Ollama's load_duration says how long, and its total holds it
        took = float(re.findall(r"loaded tiny-c in ([0-9.]+) s", server.log())[-1])  # (its second load: "cee" was it)
        assert answer.load_duration > 0 and answer.load_duration >= (took - 0.05) * 1e9
        assert answer.total_duration > answer.load_duration + answer.eval_duration
        [kept] = [m for m in httpx.get(server.base + "/api/ps").json()["models"] if m["name"] == "tiny-c"]
        assert kept["expires_at"].startswith("9999")  # keep_alive -1: while serve runs
        unload = ollama.Client(host=server.base).generate("tiny-c", prompt="", keep_alive=0)
        assert unload.done_reason == "unload" and loaded(server) == ["tiny"]
        kept = ollama.Client(host=server.base).generate("tiny", prompt="", keep_alive=0)  # the one serve started with
        assert kept.done_reason == "load" and loaded(server) == ["tiny"], kept
        assert "kept tiny loaded: asked to unload it, but serve started with it" in server.log()

        # `localspec stop`, as `ollama stop`: a model loaded on demand goes; the one serve started with stays
        ollama.Client(host=server.base).generate("tiny-c", prompt=PROMPT, keep_alive=-1, options={"num_predict": 2})
        stopped = stop_command(home, "cee")
        assert stopped.returncode == 0 and stopped.stdout.startswith("stopped cee: unloaded by localspec serve at")
        assert loaded(server) == ["tiny"]
        for name, said in ((tiny["target"], "is the model `localspec serve`"), ("tiny-c", "is not loaded by any")):
            refused = stop_command(home, name)
            assert refused.returncode == 1 and said in refused.stderr and refused.stdout == "", refused.stderr
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()


@pytest.mark.slow
def test_stop_unloads_a_model_answering_a_request_as_soon_as_that_ends(tmp_path, tiny, real_model):
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    (home / "models" / "smollm2-135m").symlink_to(real_model("smollm2-135m").parent)
    server = ServerProcess(home, tiny["target"], "-c", "4096", "--offline")
    try:
        with httpx.stream("POST", server.base + "/api/generate", timeout=120, json={
                "model": "smollm2-135m", "prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "raw": True,
                "options": {"num_predict": 3000, "temperature": 0}}) as answer:
            lines = answer.iter_lines()  # (held: a dropped iterator would close the stream)
            next(lines)  # it has begun counting: 3,000 tokens to go, tens of seconds here
            # ps lists it under the serve that holds it, as Ollama's ps lists what its server holds
            listed = localspec_process(home, "ps", stdout=subprocess.PIPE, text=True).communicate(timeout=60)[0]
            assert "+ smollm2-135m (on demand; unloads in 4 min)" in listed, listed
            [serve] = [json.loads(line) for line in localspec_process(home, "ps", "--json", stdout=subprocess.PIPE,
                                                                       text=True).communicate(timeout=60)[0].splitlines()]
            assert [model["name"] for model in serve["loaded"]] == [tiny["target"].name, "smollm2-135m"]
            busy = stop_command(home, "smollm2:135m")
            assert busy.returncode == 0 and "is unloaded as soon as that ends" in busy.stdout, busy.stderr
            assert "smollm2-135m" in loaded(server) and next(lines)  # its answer goes on
        # the client left, which ends its generation: the model goes, as Ollama's stop has a busy one go
        deadline = time.monotonic() + 30
        while "smollm2-135m" in loaded(server) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert loaded(server) == [tiny["target"].name], server.log()
    finally:
        assert server.stop() == 0, server.log()


@pytest.mark.parametrize("name, said", [("nope", "not served here"), ("tiny-gone", "not downloaded"),
                                        ("tiny-b-mtp", "the mtp drafter published beside another model")])
def test_a_model_that_is_not_here_is_one_404_in_each_protocol_but_openais_take_any_name(home, tiny, name, said):
    server = ServerProcess(home, tiny["target"], "--alias", "tiny", "-c", "512")
    try:
        if name == "nope":  # no model's name: the model serve started with answers, by its real name (llama-server)
            asked = server.client().chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}],
                                                            max_tokens=2)
            assert asked.model == "tiny" and "no model is called 'nope': tiny answers" in server.log()
        else:  # a model that is known but not here says what to do
            with pytest.raises(openai.NotFoundError) as raised:
                server.client().chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}])
            assert raised.value.code == "model_not_found" and said in raised.value.message
        with pytest.raises(openai.NotFoundError) as raised:
            server.client().models.retrieve(name)
        assert said in raised.value.message
        with pytest.raises(ollama.ResponseError) as refused:
            ollama.Client(host=server.base).chat(name, messages=[{"role": "user", "content": "hi"}])
        assert refused.value.status_code == 404 and said in refused.value.error
        assert server.client().embeddings.create(model="tiny", input="still serving").data
    finally:
        assert server.stop() == 0, server.log()


def test_the_least_recently_used_idle_model_makes_room_and_none_is_made_of_the_first(home, tiny, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(home))
    real = hardware.machine()
    runtime = Runtime(ctx_size=256)
    each = hardware.estimate_bytes(gguf_meta.read(tiny["target"]), 256)
    budget = 0

    def machine(*args, **kwargs):  # memory as much as the budget leaves beside the models loaded
        used = sum(hardware.estimate_bytes(s.session.target_info, 256) for s in pool.loaded.values())
        return replace(real, ram_available=budget - used, devices=[])

    with Session(tiny["target"], None, runtime, Speculation()) as first:
        pool = Pool(first, "tiny", runtime, Speculation(drafting=DrafterKind.PLAIN), 4, 300.0, lambda line: None)
        monkeypatch.setattr(hardware, "machine", machine)

        async def load(*names):
            return [(await pool.get(name)).name for name in names]

        try:
            budget = int(2.5 * each)  # the first and one more
            assert asyncio.run(load("tiny-b", "tiny-c", "tiny-b")) == ["tiny-b", "tiny-c", "tiny-b"]
            assert sorted(s.name for s in pool.loaded.values()) == ["tiny", "tiny-b"]
            budget = int(1.5 * each)  # the first alone: what is idle goes, and the first is never unloaded
            with pytest.raises(NoRoom, match="needs about"):
                asyncio.run(load("tiny-c"))
            assert [s.name for s in pool.loaded.values()] == ["tiny"]
        finally:
            pool.close()


def test_first_requests_for_two_models_at_once_are_loaded_one_after_the_other(home, tiny, monkeypatch):
    # three first requests for 6 GiB models at once all passed the memory check of 10 GiB together (issue 46)
    monkeypatch.setenv("LOCALSPEC_HOME", str(home))
    real = hardware.machine()
    runtime = Runtime(ctx_size=256)
    each = hardware.estimate_bytes(gguf_meta.read(tiny["target"]), 256)

    def machine(*args, **kwargs):  # room for the first model and one more
        used = sum(hardware.estimate_bytes(s.session.target_info, 256) for s in pool.loaded.values())
        return replace(real, ram_available=int(2.5 * each) - used, devices=[])

    with Session(tiny["target"], None, runtime, Speculation()) as first:
        pool = Pool(first, "tiny", runtime, Speculation(drafting=DrafterKind.PLAIN), 4, 300.0, lambda line: None)
        monkeypatch.setattr(hardware, "machine", machine)

        async def both():
            return await asyncio.gather(pool.get("tiny-b"), pool.get("tiny-c"), return_exceptions=True)

        try:
            got = asyncio.run(both())
            # one of them loads; the other's check sees it, and it is not unloaded under the request it was loaded for
            assert sum(isinstance(each, NoRoom) for each in got) == 1, got
            [served] = [each for each in got if not isinstance(each, NoRoom)]
            assert sorted(s.name for s in pool.loaded.values()) == sorted(["tiny", served.name])
            assert served.session.generate  # still open: never unloaded under its request
        finally:
            pool.close()


def test_an_embedding_model_asked_for_by_name_embeds_and_refuses_to_generate(home, tiny):
    server = ServerProcess(home, tiny["target"], "--alias", "tiny", "-c", "512")
    try:
        client = server.client()
        vectors = client.embeddings.create(model="tiny-embed", input=["the cat sat", "a dog ran"]).data
        assert [len(v.embedding) for v in vectors] == [N_EMBD, N_EMBD] and vectors[0].embedding != vectors[1].embedding
        assert ollama.Client(host=server.base).show("tiny-embed").capabilities == ["embedding"]
        answer = ollama.Client(host=server.base).embed("tiny-embed", input="the cat sat")
        assert 0 < answer.load_duration < answer.total_duration  # the model was there: finding it is all it took
        embedded = answer.embeddings
        assert embedded[0] == pytest.approx(vectors[0].embedding, abs=1e-5)  # pooled as its metadata says (mean)
        with pytest.raises(openai.BadRequestError, match="is an embedding model"):
            client.chat.completions.create(model="tiny-embed", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(ollama.ResponseError, match="is an embedding model"):
            ollama.Client(host=server.base).generate("tiny-embed", prompt="hi")
        refused = httpx.post(server.base + "/v1/rerank", json={"model": "tiny-embed", "query": "q", "documents": ["d"]})
        assert refused.status_code == 400 and "is not a reranker: it embeds text" in refused.json()["error"]["message"]
        assert client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4,
                                         temperature=0).usage.completion_tokens == 4
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()


def test_run_on_an_embedding_model_says_it_does_not_generate(localspec, tmp_path):
    done = localspec("run", write_tiny_bert(tmp_path / "embed.gguf"), "hi")
    assert done.returncode == 2 and b"is an embedding model (bert)" in done.stderr and b"Traceback" not in done.stderr


def test_a_reranker_is_refused_as_an_embedding_model_and_no_memory_is_read_past_its_scores(tmp_path):
    """Rank pooling hands out one score a sequence, not n_embd floats: read as a vector it returned
    ~2,300 bytes of the process heap in base64 (issue 46). It is refused, and serving goes on."""
    import gguf

    reranker = write_tiny_bert(tmp_path / "rerank.gguf", pooling=gguf.PoolingType.RANK)
    server = ServerProcess(tmp_path / "home", reranker, "--alias", "rerank")
    try:
        for _ in range(2):
            with pytest.raises(openai.BadRequestError, match="is a reranker"):
                server.client().embeddings.create(model="rerank", input=["the cat sat"])  # base64, as the client asks
        assert ollama.Client(host=server.base).show("rerank").capabilities == []  # (it neither completes nor embeds)
        assert httpx.get(server.base + "/health").json()["status"] == "ok"
    finally:
        assert server.stop() == 0, server.log()


def test_ps_lists_a_serve_that_does_not_answer_without_waiting_on_it(tmp_path, tiny):
    home = tmp_path / "home"
    server = ServerProcess(home, tiny["target"], "-c", "512")
    try:
        os.kill(server.process.pid, signal.SIGSTOP)  # it holds its model and answers nothing
        try:
            listed = localspec_process(home, "ps", "--json", stdout=subprocess.PIPE, text=True).communicate(timeout=60)
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        [serve] = [json.loads(line) for line in listed[0].splitlines()]
        assert serve["command"] == "serve" and "loaded" not in serve
    finally:
        assert server.stop() == 0, server.log()


def test_lm_studios_model_list_and_ttl_say_and_set_what_is_loaded(home, tiny):
    """LM Studio's /api/v0/models: every model that can be served, loaded or not (an embedding model as one), its
    publisher the Hub owner of its repo; a request's `ttl` (LM Studio's keep-alive, in seconds) sets how long the
    model it loads stays."""
    server = ServerProcess(home, tiny["target"], "--alias", "tiny", "--temp", "0", "-c", "512")
    try:
        listed = {m["id"]: m for m in httpx.get(server.base + "/api/v0/models").json()["data"]}
        assert {name: (m["type"], m["state"]) for name, m in listed.items()} == {
            "tiny": ("llm", "loaded"), "tiny-b": ("llm", "not-loaded"), "tiny-c": ("llm", "not-loaded"),
            "tiny-embed": ("embeddings", "not-loaded")}
        assert listed["tiny-b"]["publisher"] == "test" and "loaded_context_length" not in listed["tiny-b"]
        lm_studio = openai.OpenAI(base_url=server.base + "/api/v0", api_key="lm-studio", max_retries=0, timeout=120)
        lm_studio.chat.completions.create(model="tiny-c", messages=[{"role": "user", "content": PROMPT}], max_tokens=2,
                                          extra_body={"ttl": -1})
        [kept] = [m for m in httpx.get(server.base + "/api/ps").json()["models"] if m["name"] == "tiny-c"]
        assert kept["expires_at"].startswith("9999")  # (serve's --keep-alive is 5 minutes)
        assert httpx.get(server.base + "/api/v0/models/tiny-c").json()["state"] == "loaded"
        lm_studio.chat.completions.create(model="tiny-c", messages=[{"role": "user", "content": PROMPT}], max_tokens=2,
                                          extra_body={"ttl": 0.5})
        deadline = time.monotonic() + 20
        while loaded(server) != ["tiny"] and time.monotonic() < deadline:
            time.sleep(0.25)
        assert loaded(server) == ["tiny"], server.log()
    finally:
        assert server.stop() == 0, server.log()


def test_lm_studios_sdk_lists_what_is_downloaded_loads_one_that_is_not_embeds_and_unloads(home, tiny):
    """LM Studio's Python SDK: its downloaded models (an embedding model as one), llm(name) loading a model that is
    not (said as it loads), an embedding model's vector, and unload, through its sockets."""
    server = ServerProcess(home, tiny["target"], "--alias", "tiny", "--temp", "0", "-c", "512")
    try:
        with lms.Client(server.base.removeprefix("http://")) as client:
            downloaded = {model.model_key: model.type for model in client.list_downloaded_models()}
            assert downloaded == {"tiny": "llm", "tiny-b": "llm", "tiny-c": "llm", "tiny-embed": "embedding"}
            assert [model.model_key for model in client.llm.list_downloaded()] == ["tiny", "tiny-b", "tiny-c"]
            loading = []
            model = client.llm.model("tiny-c", on_load_progress=loading.append)
            assert model.identifier == "tiny-c" and loading[-1] == 1.0  # (said started, and done)
            answer = model.respond(PROMPT, config={"maxTokens": 8}).content
            assert answer == plain_text(home / "models/tiny-c/c.gguf")
            assert sorted(m.identifier for m in client.llm.list_loaded()) == ["tiny", "tiny-c"]

            embedder = client.embedding.model("tiny-embed")
            vector = embedder.embed("hello")
            wanted = openai.OpenAI(base_url=server.url, api_key="unused").embeddings.create(model="tiny-embed",
                                                                                              input="hello")
            assert len(vector) == N_EMBD and vector == pytest.approx(wanted.data[0].embedding, abs=1e-6)
            with pytest.raises(lms.LMStudioModelNotFoundError, match="embedding model"):
                client.llm.model("tiny-embed")

            model.unload()
            assert [m.identifier for m in client.llm.list_loaded()] == ["tiny"]
            again = client.llm.load_new_instance("tiny-c", config={"contextLength": 512})
            assert again.identifier == "tiny-c" and again.get_context_length() == 512
            again.unload()
            with pytest.raises(lms.LMStudioServerError, match="serve started with"):
                client.llm.unload("tiny")
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()


def llm_command(server, tmp_path, *args) -> str:
    """simonw's `llm` with its LM Studio plugin (llm-lmstudio), pointed at serve as at LM Studio: its output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_", "LMSTUDIO_"))}
    env |= {"LMSTUDIO_API_BASE": server.base, "LLM_USER_PATH": str(tmp_path / "llm")}
    done = subprocess.run([str(Path(sys.executable).with_name("llm")), *args], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_llms_lm_studio_plugin_lists_loads_prompts_and_embeds_through_serve(home, tiny, tmp_path):
    """A real LM Studio client: the llm-lmstudio plugin reads /api/v0/models (which models, loaded or not), loads one
    that is not with /api/v1/models/load, streams its chats from /api/v0/chat/completions, asks /v1 for a schema's
    answer, and embeds with an embedding model."""
    server = ServerProcess(home, tiny["target"], "--alias", "tiny", "--temp", "0", "-c", "512")
    try:
        listed = llm_command(server, tmp_path, "models")
        assert "lmstudio/tiny ●" in listed and "lmstudio/tiny-c ⚒" in listed, listed
        assert "tiny-embed" in llm_command(server, tmp_path, "embed-models")
        answer = llm_command(server, tmp_path, "-m", "lmstudio/tiny-c", PROMPT, "-o", "max_tokens", "8")
        assert answer.rstrip("\n") == plain_text(home / "models/tiny-c/c.gguf")
        assert httpx.get(server.base + "/api/v0/models/tiny-c").json()["state"] == "loaded"  # (the plugin loaded it)
        whole = llm_command(server, tmp_path, "-m", "lmstudio/tiny-c", PROMPT, "-o", "max_tokens", "8", "--no-stream")
        assert whole == answer
        shaped = llm_command(server, tmp_path, "-m", "lmstudio/tiny", "a name", "--schema", "name, age int", "-o",
                             "max_tokens", "64")
        assert set(json.loads(shaped)) == {"name", "age"}
        vector = json.loads(llm_command(server, tmp_path, "embed", "-m", "tiny-embed", "-c", "hello"))
        assert len(vector) == N_EMBD
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()
