"""LoRA adapters on the target (llama.cpp's --lora, --lora-scaled, --lora-init-without-apply; llama-server's
per-request `lora` and /lora-adapters): the adapted target's text, kept by every drafter; scales switched between
requests without a cache read under other scales reused; refusals that name the file and why. And control vectors
(--control-vector), alike."""

import threading

import pytest

import localspec
from localspec.config import Adapter, DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine import prompt_cache
from localspec.errors import InputError, ModelLoadError, UsageError
from localspec.events import Prefill, Token
from localspec.request import Request
from localspec.service import FINISHED, Service
from localspec.session import Session

from tinylora import write_tiny_control_vector, write_tiny_lora

PROMPT = "the cat sat on the mat and the dog sat on the log"


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("lora")
    return {"strong": write_tiny_lora(folder / "strong.gguf", seed=11),
            "other": write_tiny_lora(folder / "other.gguf", seed=12),
            "wide": write_tiny_lora(folder / "wide.gguf", seed=11, wrong_width=True),
            "lfm2": write_tiny_lora(folder / "lfm2.gguf", seed=11, architecture="lfm2")}


def greedy(session: Session, lora: dict | None = None, prompt: str = PROMPT, n: int = 24) -> list[int]:
    events = session.generate(Request(Sampling(temperature=0), Limits(n), prompt=prompt, lora=lora))
    return [event.id for event in events if isinstance(event, Token)]


def opened(tiny, *adapters: Adapter, draft: str | None = None, mode=DrafterKind.PLAIN, **runtime) -> Session:
    return Session(tiny["target"], tiny[draft] if draft else None, Runtime(ctx_size=512, lora=adapters, **runtime),
                   Speculation(drafting=mode))


def test_an_adapter_changes_the_text_and_every_drafter_keeps_the_adapted_targets(tiny, adapters):
    with opened(tiny) as base:
        plain_base = greedy(base)
    strong = Adapter(str(adapters["strong"]))
    with opened(tiny, strong) as adapted:
        plain = greedy(adapted)
    assert plain != plain_base
    for draft, mode in ((None, DrafterKind.NGRAM), ("partial", DrafterKind.DRAFT), ("partial", DrafterKind.AUTO)):
        with opened(tiny, strong, draft=draft, mode=mode) as session:
            assert greedy(session) == plain, (draft, mode)
            assert session.lora_applied == (1.0,)


def test_scale_zero_is_the_base_model_and_a_half_is_neither(tiny, adapters):
    with opened(tiny) as base:
        plain_base = greedy(base)
    path = str(adapters["strong"])
    with opened(tiny, Adapter(path, 0.0)) as unapplied, opened(tiny, Adapter(path, 1.0)) as full:
        assert greedy(unapplied) == plain_base
        half = greedy(unapplied, lora={0: 0.5})
        assert half not in (plain_base, greedy(full))


def test_requests_switch_the_scales_and_never_reuse_a_cache_read_under_others(tiny, adapters):
    with opened(tiny, Adapter(str(adapters["strong"])), Adapter(str(adapters["other"]), 0.0)) as session:
        with opened(tiny) as base:
            plain_base = greedy(base)
        first = greedy(session)
        # the same prompt again, the cache then holding all of it: read under scale 1, it would be reused at 0
        assert greedy(session, lora={}) == plain_base
        assert greedy(session, lora={0: 1.0}) == first == greedy(session)
        both = greedy(session, lora={0: 1.0, 1: 1.0})
        assert both != first and session.lora_applied == (1.0, 1.0)
        with pytest.raises(UsageError, match=r"no adapter 2 is loaded \(ids 0 to 1"):
            greedy(session, lora={2: 1.0})
        with pytest.raises(UsageError, match="scale is a number"):
            greedy(session, lora={0: float("nan")})


def test_prompts_kept_on_disk_are_read_back_under_the_scales_they_were_read_with(tiny, adapters, tmp_path):
    long_prompt = " ".join([PROMPT] * 6)
    with opened(tiny, Adapter(str(adapters["strong"]))) as session:
        kept = session.target.prompt_cache  # (scale 1's, and the model's own: a tiny model reads in no time)
        kept.least_seconds = kept.beside("").least_seconds = 0

        def reused(lora) -> int:
            session.reset()  # (the sequence's own cache emptied: what is reused comes from disk)
            events = session.generate(Request(Sampling(temperature=0), Limits(2), prompt=long_prompt, lora=lora))
            reading = next(event for event in events if isinstance(event, Prefill))
            prompt_cache.settled()
            return reading.reused_tokens

        assert reused(None) == 0
        assert reused({0: 0.0}) == 0  # kept under scale 1: not this one's
        assert reused({0: 1.0}) > 16 and reused({}) > 16


def test_a_scheduler_runs_one_set_of_scales_at_a_time(tiny, adapters):
    with opened(tiny, Adapter(str(adapters["strong"])), parallel=2) as session:
        scheduler = session.scheduler()
        asked = [Request(Sampling(temperature=0), Limits(6), prompt=PROMPT, lora=lora) for lora in (None, {0: 1.0}, {})]
        scheduler.add(asked[0])
        assert scheduler.admits(asked[1]) and not scheduler.admits(asked[2])
        with pytest.raises(UsageError, match="LoRA scales differ"):
            scheduler.add(asked[2])
        scheduler.add(asked[1])
        while scheduler.running:
            list(scheduler.step())
        assert scheduler.admits(asked[2])


def test_a_service_holds_a_request_of_other_scales_until_the_running_ones_end(tiny, adapters):
    with opened(tiny, Adapter(str(adapters["strong"])), mode=DrafterKind.NGRAM, parallel=2) as session:
        service = Service(session, queue_limit=4, log=print)
        order, done = [], {name: threading.Event() for name in ("long", "other", "same")}

        def inbox(name):
            def deliver(item):
                if isinstance(item, Prefill):
                    order.append(name)
                if item is FINISHED:
                    done[name].set()
            return deliver

        try:
            service.submit(Request(Sampling(temperature=0), Limits(200), prompt=PROMPT, lora=None), inbox("long"))
            service.submit(Request(Sampling(temperature=0), Limits(4), prompt=PROMPT, lora={0: 0.0}), inbox("other"))
            service.submit(Request(Sampling(temperature=0), Limits(4), prompt=PROMPT), inbox("same"))
            assert all(event.wait(120) for event in done.values())
            # first come first served: the one behind the held request waits for it, though the other sequence is free
            assert order == ["long", "other", "same"]
        finally:
            service.close()


def test_an_adapter_llama_cpp_cannot_apply_is_refused_with_its_reason(tiny, adapters):
    with pytest.raises(ModelLoadError, match=r"wide.gguf for target.gguf: tensor 'blk.0.attn_q.weight' has incorrect"
                                             " shape"):
        opened(tiny, Adapter(str(adapters["wide"])))
    with pytest.raises(ModelLoadError, match="arch mismatch"):
        opened(tiny, Adapter(str(adapters["lfm2"])))
    with pytest.raises(InputError, match="is not a GGUF LoRA adapter file"):
        opened(tiny, Adapter(str(__file__)))


def test_the_library_takes_adapters_by_load(tiny, adapters):
    with localspec.load(str(tiny["target"]), spec="off", ctx_size=512,
                        lora=(localspec.Adapter(str(adapters["strong"]), 0.5),)) as session:
        assert session.adapters.scales == (0.5,) and session.lora_applied == (0.5,)


def test_the_command_line_spells_them_as_llama_cpp(localspec, tiny, adapters, tmp_path):
    import json

    reported = {}

    def text(*options) -> str:
        done = localspec("run", tiny["target"], "-p", PROMPT, "-n", "16", "--temp", "0", "--no-color", "--json",
                         *options)
        assert done.returncode == 0, done.stderr.decode()
        reported.update(json.loads(done.stdout)["placement"]["target"])
        return json.loads(done.stdout)["text"]

    strong, other = adapters["strong"], adapters["other"]
    base, adapted = text(), text("--lora-scaled", f"{strong}:1,{other}:0.0")
    assert adapted != base
    assert reported["lora"] == [{"path": str(strong.resolve()), "scale": 1.0}, {"path": str(other.resolve()),
                                                                                  "scale": 0.0}]
    assert text("--lora", strong, "--lora-init-without-apply") == base
    assert text("--lora-scaled", f"{strong}:1.0") == adapted
    assert text("--lora-scaled", f"{strong}:0") == base
    assert text("--lora", f"{strong},{other}") == text("--lora", strong, "--lora", other) != adapted


@pytest.mark.parametrize("options, message", [
    (("--lora", "missing.gguf"), "--lora missing.gguf: no such file"),
    (("--lora-scaled", "x.gguf"), "--lora-scaled takes FILE:SCALE (llama.cpp's), got 'x.gguf'"),
    (("--lora-scaled", "{strong}:half"), "a scale is a number, got 'half'"),
    (("--lora-init-without-apply",), "give the adapters to load with --lora FILE"),
    (("--control-vector", "x.gguf"), "--control-vector x.gguf: no such file"),
    (("--control-vector-scaled", "x.gguf"), "--control-vector-scaled takes FILE:SCALE"),
    (("--control-vector-layer-range", "2", "1"), "--control-vector-layer-range takes START END, 1 <= START <= END"),
])
def test_mistakes_are_told_in_one_line(cli, tiny, adapters, options, message):
    options = [option.format(strong=adapters["strong"]) for option in options]
    code, out, err = cli("run", tiny["target"], "-p", "x", *options)
    assert code != 0 and message in err and "Traceback" not in err


@pytest.fixture(scope="module")
def served(tiny, adapters, tmp_path_factory):
    from test_server import ServerProcess

    running = ServerProcess(tmp_path_factory.mktemp("serve"), tiny["target"], "--alias", "tiny", "-c", "512", "-np",
                            "2", "--lora", adapters["strong"], "--lora-scaled", f"{adapters['other']}:0")
    yield running
    assert running.stop() == 0, running.log()


def test_serve_takes_each_requests_scales_and_sets_the_defaults_as_llama_server(served):
    import httpx

    client = served.client()

    def completion(**extra) -> str:
        return client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0,
                                         extra_body=extra).choices[0].text

    listed = httpx.get(served.base + "/lora-adapters", timeout=30).json()
    assert [(entry["id"], entry["path"].rsplit("/", 1)[1], entry["scale"]) for entry in listed] == [
        (0, "strong.gguf", 1.0), (1, "other.gguf", 0.0)]
    assert listed[0]["task_name"] == listed[0]["prompt_prefix"] == ""
    adapted, base = completion(), completion(lora=[])
    assert adapted != base and completion(lora=[{"id": 0, "scale": 1}]) == adapted
    assert completion(lora=[{"id": 1, "scale": 1}]) not in (adapted, base)
    # llama-server's /completion takes the same field
    answer = httpx.post(served.base + "/completion", json={"prompt": PROMPT, "n_predict": 12, "temperature": 0,
                                                           "lora": [{"id": 0, "scale": 0.0}]}, timeout=60).json()
    assert answer["content"] == base and answer["generation_settings"]["lora"] == [{"id": 0, "scale": 0.0}]

    set_to = httpx.post(served.base + "/lora-adapters", json=[{"id": 0, "scale": 0}], timeout=30)
    assert set_to.status_code == 200 and set_to.json() == {"success": True}
    assert completion() == base and [entry["scale"] for entry in httpx.get(served.base + "/lora-adapters").json()] == [
        0.0, 0.0]
    assert httpx.get(served.base + "/props").json()["default_generation_settings"]["params"]["lora"] == [
        {"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]
    for body, said in (([{"id": 2, "scale": 1}], "no adapter 2 is loaded (ids 0 to 1"),
                       ({"id": 0, "scale": 1}, "must be a JSON array"), ([{"id": 0, "scale": "1"}], "0.scale")):
        refused = httpx.post(served.base + "/lora-adapters", json=body, timeout=30)
        assert refused.status_code == 400 and said in refused.json()["error"]["message"], refused.text
    with pytest.raises(Exception, match="no adapter 5 is loaded"):
        completion(lora=[{"id": 5, "scale": 1}])
    httpx.post(served.base + "/lora-adapters", json=[{"id": 0, "scale": 1}], timeout=30)
    assert completion() == adapted
    assert "Traceback" not in served.log()


def test_a_modelfiles_adapter_makes_a_model_of_its_own_that_run_and_serve_answer(localspec, cli, tiny, adapters,
                                                                                 tmp_path):
    import hashlib
    import json
    import shutil

    import ollama

    from test_server import ServerProcess

    folder = tmp_path / "work"
    folder.mkdir()
    shutil.copy(adapters["strong"], folder / "strong.gguf")
    (folder / "Modelfile").write_text(f"FROM {tiny['target']}\nADAPTER ./strong.gguf\nPARAMETER temperature 0\n")
    assert localspec("create", "tuned", "-f", folder / "Modelfile").returncode == 0
    assert f"ADAPTER {folder / 'strong.gguf'}\n" in localspec("show", "tuned", "--modelfile").stdout.decode()
    assert "LoRA adapters" in localspec("show", "tuned").stdout.decode()
    listed = [json.loads(line) for line in localspec("ls", "--json").stdout.decode().splitlines()]
    assert [(row["made_from"], row["adapters"]) for row in listed if row["name"] == "tuned"] == [
        (str(tiny["target"]), [str(folder / "strong.gguf")])]

    def text(*args) -> str:
        done = localspec("run", *args, "-p", PROMPT, "-n", "16", "--temp", "0", "--raw", "--json")
        assert done.returncode == 0, done.stderr.decode()
        return json.loads(done.stdout)["text"]

    tuned = text("tuned")
    assert tuned == text(tiny["target"], "--lora", adapters["strong"]) != text(tiny["target"])

    server = ServerProcess(tmp_path / "home", tiny["target"], "--alias", "tiny", "-c", "512")
    try:
        client = ollama.Client(host=server.base)

        def answer(model: str) -> str:
            return client.generate(model, PROMPT, raw=True, options={"temperature": 0, "num_predict": 16}).response

        assert answer("tuned") == tuned != answer("tiny")  # (the same file, loaded a second time with the adapter)
        # run finds this serve holding the file: it answers with the adapter all the same (it was the serve's text)
        assert text(tiny["target"], "--lora", adapters["strong"]) == text("tuned") == tuned
        assert {model.model for model in client.ps().models} == {"tiny", "tuned"}
        # as Ollama's clients upload an adapter and name it
        digest = client.create_blob(adapters["strong"])
        assert client.create("tuned-too", from_="tiny", adapters={"strong.gguf": digest}).status == "success"
        assert answer("tuned-too") == tuned
        blob = tmp_path / "home" / "blobs" / digest.replace(":", "-")
        assert client.delete("tuned-too").status == "success" and not blob.exists()
        text_digest = "sha256:" + hashlib.sha256(b"not an adapter").hexdigest()
        client.create_blob(_written(tmp_path / "notes.txt", b"not an adapter"))
        with pytest.raises(ollama.ResponseError, match="notes.gguf is not a GGUF file"):
            client.create("mine", from_="tiny", adapters={"notes.gguf": text_digest})
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()

    for line, said in ((f"ADAPTER {folder}", "convert a PEFT (safetensors) adapter with llama.cpp's"),
                       (f"ADAPTER {tiny['target']}", "a GGUF model, not a LoRA adapter"),
                       ("ADAPTER ./missing.gguf", "ADAPTER ./missing.gguf: no such file beside")):
        (folder / "Modelfile").write_text(f"FROM {tiny['target']}\n{line}\n")
        code, _, err = cli("create", "mine", "-f", folder / "Modelfile")
        assert code != 0 and said in err, err


def _written(path, data: bytes):
    path.write_bytes(data)
    return path


def test_a_control_vector_steers_the_text_and_every_drafter_keeps_the_steered_targets(localspec, tiny, tmp_path):
    import json

    vector = write_tiny_control_vector(tmp_path / "mood.gguf", seed=21)
    other = write_tiny_control_vector(tmp_path / "other.gguf", seed=22)

    def text(*options) -> str:
        done = localspec("run", tiny["target"], "-p", PROMPT, "-n", "16", "--temp", "0", "--json", *options)
        assert done.returncode == 0, done.stderr.decode()
        return json.loads(done.stdout)["text"]

    base, steered = text("--no-draft"), text("--no-draft", "--control-vector", vector)
    assert steered != base
    assert text("--draft", tiny["partial"], "--spec", "fixed", "--control-vector", vector) == steered
    assert text("--draft", "ngram", "--spec", "fixed", "--control-vector", vector) == steered
    assert text("--no-draft", "--control-vector-scaled", f"{vector}:0") == base
    # the other way undoes it: summed, the two cancel
    assert text("--no-draft", "--control-vector", vector, "--control-vector-scaled", f"{vector}:-1") == base
    assert text("--no-draft", "--control-vector", f"{vector},{other}") not in (base, steered)
    # only the layers named: llama.cpp steers the outputs of layers 1 to the last but one, here layer 1 alone
    assert text("--no-draft", "--control-vector", vector, "--control-vector-layer-range", "1", "1") == steered
    assert text("--no-draft", "--control-vector", vector, "--control-vector-layer-range", "2", "9") == base


def test_a_control_vector_llama_cpp_would_not_take_is_one_line(cli, tiny, tmp_path):
    for vector, said in ((write_tiny_control_vector(tmp_path / "wide.gguf", seed=1, width=72),
                          "its directions are 72 wide, the model's layers 64: a control vector made for another"),
                         (write_tiny_control_vector(tmp_path / "named.gguf", seed=1, names=("blk.0.weight",)),
                          "is not a control vector: a tensor 'blk.0.weight'"),
                         (tiny["target"], "is not a control vector")):
        code, _, err = cli("run", tiny["target"], "-p", "x", "--control-vector", vector)
        assert code != 0 and said in err and "Traceback" not in err, err


def test_prompts_kept_on_disk_under_control_vectors_are_kept_apart_by_their_scales():
    from localspec.loading import _cache_variant
    from localspec.config import Rope

    plain = _cache_variant(("f16", "f16"), Rope())
    steered = {_cache_variant(("f16", "f16"), Rope(), ((Adapter("/m.gguf", scale),), layers))
               for scale in (1.0, -1.0) for layers in (None, (1, 1))}
    assert plain == "" and len(steered) == 4 and all(name.startswith("cvec-") for name in steered)


def test_scores_and_embeddings_are_the_adapted_and_steered_targets(tiny, adapters, tmp_path):
    vector = Adapter(str(write_tiny_control_vector(tmp_path / "mood.gguf", seed=21)))
    with opened(tiny) as base:
        tokens = base.prompts.tokenize(PROMPT, raw=True)
        plain = ([row.chosen for row in base.score(tokens)[1:]], base.embed(tokens))
    for lora, steering in (((Adapter(str(adapters["strong"])),), ()), ((), (vector,))):
        with Session(tiny["target"], None, Runtime(ctx_size=512, lora=lora, control_vectors=steering),
                     Speculation(drafting=DrafterKind.PLAIN)) as session:
            scored = [row.chosen for row in session.score(tokens)[1:]]
            assert scored != plain[0] and session.embed(tokens) != plain[1]


def test_batch_items_ask_for_their_own_scales_and_wait_for_those_running(localspec, tiny, adapters, tmp_path):
    import json

    def text(scale: float) -> str:
        done = localspec("run", tiny["target"], "-p", PROMPT, "-n", "12", "--temp", "0", "--raw", "--json",
                         "--lora-scaled", f"{adapters['strong']}:{scale}")
        assert done.returncode == 0, done.stderr.decode()
        return json.loads(done.stdout)["text"]

    asked = [{"id": "a", "lora": [{"id": 0, "scale": 1.0}]}, {"id": "b", "lora": []}, {"id": "c"},
             {"id": "d", "lora": [{"id": 0, "scale": 0.5}]}, {"id": "e", "lora": [{"id": 3, "scale": 1}]},
             {"id": "f", "lora": {"id": 0}}]
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(item | {"prompt": PROMPT, "max_tokens": 12}) + "\n"
                                                  for item in asked))
    done = localspec("batch", tiny["target"], tmp_path / "items.jsonl", "--raw", "--temp", "0", "--parallel", "2",
                     "--lora", adapters["strong"])
    assert done.returncode != 0  # (two items failed: their records say why)
    records = {record["id"]: record for record in map(json.loads, done.stdout.decode().splitlines())}
    adapted = text(1)
    assert records["a"]["text"] == records["c"]["text"] == adapted
    assert records["b"]["text"] == text(0) != adapted
    assert records["d"]["text"] == text(0.5)
    assert "no adapter 3 is loaded" in records["e"]["error"] and "'lora' must be a list" in records["f"]["error"]


def test_serves_own_adapters_are_its_models_by_any_name_and_a_made_models_are_its_own(tmp_path, tiny, adapters):
    """serve tiny-c --lora: a request naming tiny-c's alias loaded its file a second time without the adapter (the
    pool told models apart by file and adapters); a model made with an ADAPTER is served beside its base."""
    import os
    import shutil
    import subprocess
    import sys

    import httpx2 as httpx

    from test_pool import REGISTRY
    from test_server import ServerProcess

    home = tmp_path / "home"
    (home / "models" / "tiny-c").mkdir(parents=True)
    (home / "models.toml").write_text(REGISTRY)
    shutil.copy(tiny["partial"], home / "models" / "tiny-c" / "c.gguf")
    server = ServerProcess(home, "tiny-c", "--offline", "-c", "512", "--lora", adapters["strong"])
    try:
        client = server.client()

        def answer(model: str) -> str:
            return client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0).choices[0].text

        assert answer("cee") == answer("tiny-c") == answer("tiny-c:latest")
        assert [m["name"] for m in httpx.get(server.base + "/api/ps").json()["models"]] == ["tiny-c"]
        # listed once: the file with serve's adapter is the model its name answers with (it was listed again, bare)
        assert [m.id for m in client.models.list()].count("tiny-c") == 1
        assert [m["name"] for m in httpx.get(server.base + "/api/tags").json()["models"]].count("tiny-c") == 1
        adapted = answer("tiny-c")
        assert adapted != client.completions.create(model="tiny-c", prompt=PROMPT, max_tokens=12, temperature=0,
                                                    extra_body={"lora": []}).choices[0].text
    finally:
        assert server.stop() == 0, server.log()
    assert "Traceback" not in server.log()
    # serve started with a model made with the ADAPTER: its base, named, is the base
    (tmp_path / "Modelfile").write_text(f"FROM tiny-c\nADAPTER {adapters['strong']}\n")
    made = subprocess.run([sys.executable, "-m", "localspec", "create", "tuned", "-f", tmp_path / "Modelfile"],
                          env=os.environ | {"LOCALSPEC_HOME": str(home)}, capture_output=True, timeout=120)
    assert made.returncode == 0, made.stderr
    server = ServerProcess(home, "tuned", "--offline", "-c", "512")
    try:
        client = server.client()
        assert answer("tuned") == adapted != answer("cee")
        assert sorted(m["name"] for m in httpx.get(server.base + "/api/ps").json()["models"]) == ["tiny-c", "tuned"]
    finally:
        assert server.stop() == 0, server.log()
    assert "Traceback" not in server.log()


def test_a_modelfiles_adapters_read_back_as_kept_and_add_up_when_made_from_a_made_model():
    from localspec.store import modelfile

    made = modelfile.parse("FROM base\nADAPTER ./one.gguf\nADAPTER \"/abs/two.gguf\"\nSYSTEM hi\n", "tuned")
    assert made.adapters == ("./one.gguf", "/abs/two.gguf")
    kept = modelfile.parse(made.modelfile(), "tuned")
    assert kept == made and made.modelfile().startswith("FROM base\nADAPTER ./one.gguf\nADAPTER /abs/two.gguf\n")
    newer = modelfile.parse("FROM tuned\nADAPTER /abs/three.gguf\n", "more")
    assert made.under(newer).adapters == ("./one.gguf", "/abs/two.gguf", "/abs/three.gguf")


def test_an_adapter_or_a_control_vector_run_as_a_model_says_what_it_is_and_show_says_how_to_use_it(
        cli, tiny, adapters, tmp_path):
    import json

    vector = write_tiny_control_vector(tmp_path / "mood.gguf", seed=21)
    for file, said in ((adapters["strong"], "strong.gguf is a LoRA adapter for a llama model, not a model: run the model"
                        f" it was made for with --lora {adapters['strong']}"),
                       (vector, f"mood.gguf is a control vector for a llama model, not a model: run the model it was"
                        f" made for with --control-vector {vector}")):
        code, _, err = cli("run", file, "-p", "x")  # (llama.cpp said: key not found in model: llama.context_length)
        assert code != 0 and said in err and "Traceback" not in err, err
        code, _, err = cli("run", tiny["target"], "--draft", file, "-p", "x")
        assert code != 0 and said in err, err
    code, out, _ = cli("show", adapters["strong"])
    assert code == 0 and "a LoRA adapter for llama models, not a model" in out and "--lora" in out
    code, out, _ = cli("show", vector, "--json")
    assert code == 0 and json.loads(out)["applied"] == {"is": "a control vector", "for": "llama",
                                                        "option": "--control-vector"}
