"""`localspec serve` over loopback, as clients see it: the official openai package for the API, plain
httpx for the edge cases, and many clients at once. Every server here is a real `localspec serve`
process on a free port of 127.0.0.1, started by the test and stopped with a signal."""

import contextlib
import os
import gzip
import json
import re
import resource
import select
import signal
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import httpx2 as httpx
import numpy as np
import ollama
import openai
import psutil
import pytest
import websocket
from prometheus_client.parser import text_string_to_metric_families

from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine.model import Model
from localspec.prompts import Prompts
from localspec.request import Request
from localspec.session import Session
from localspec.stats import record

from processes import localspec_process, stop

STARTUP_SECONDS = 60
PROMPT = "tell me about the cat"


class ServerProcess:
    """`localspec serve ARGS --port 0` in a subprocess: its base URL once it listens, its log, and a stop
    by signal that must end it with exit code 0."""

    def __init__(self, home: Path, *args, **popen):
        self.log_file = home / "serve.log"
        home.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "wb") as log:
            self.process = localspec_process(home, "serve", *args, "--port", "0", stdout=subprocess.PIPE, stderr=log,
                                             bufsize=0, **popen)
        try:
            self.url = self._wait_for_url()
        except BaseException:
            self.process.kill()
            self.process.wait()
            raise
        self.base = self.url.removesuffix("/v1")

    def _wait_for_url(self) -> str:
        deadline = time.monotonic() + STARTUP_SECONDS
        line = b""
        while time.monotonic() < deadline and not line.endswith(b"\n"):
            ready, _, _ = select.select([self.process.stdout], [], [], 0.5)
            if ready:
                byte = self.process.stdout.read(1)
                if not byte:
                    break
                line += byte
        text = line.decode()
        assert "serving" in text, f"serve did not start: {text!r}; log: {self.log()}"
        return text.split(" on ")[1].split()[0]

    def log(self) -> str:
        return self.log_file.read_text()

    def client(self, **options) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=options.pop("api_key", "unused"), max_retries=0,
                             timeout=120, **options)

    def stop(self, sig=signal.SIGINT) -> int:
        return stop(self.process, sig)


def batch_record(localspec, model, folder: Path, item: dict, *options) -> dict:
    """The record `localspec batch MODEL FILE OPTIONS` writes for a file of one item (the run must succeed)."""
    prompts = folder / "prompts.jsonl"
    prompts.write_text(json.dumps(item) + "\n")
    done = localspec("batch", model, prompts, *options)
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)


def run_text(cli, model, *args) -> str:
    """The text `localspec run MODEL ARGS --json` writes (the run must succeed)."""
    code, stdout, stderr = cli("run", model, *args, "--json")
    assert code == 0, stderr
    return json.loads(stdout)["text"]


def refused_on_both_completions(server: ServerProcess, prompt: str, wrongs) -> None:
    """Each (fields, words) of wrongs, added to a request for prompt, is a 400 that says the words, on
    llama-server's /completion and OpenAI's /v1/completions alike."""
    for wrong, said in wrongs:
        for path in ("/completion", "/v1/completions"):
            refused = httpx.post(server.base + path, json={"prompt": prompt, "max_tokens": 2} | wrong, timeout=60)
            assert refused.status_code == 400 and said in refused.text, (path, refused.text)


def drafting_server(home: Path, tiny) -> ServerProcess:
    """Greedy by default, always drafting with a draft model that agrees with the target."""
    return ServerProcess(home, tiny["target"], "--draft", tiny["same"], "--spec", "fixed", "--p-min", "0", "--temp",
                         "0", "-c", "512", "--alias", "tiny")


def serving(start):
    """A module's server, started by start(folder, request), stopped at the end."""
    @pytest.fixture(scope="module")
    def fixture(request, tmp_path_factory):
        running = start(tmp_path_factory.mktemp("serve"), request)
        yield running
        assert running.stop() == 0, running.log()
    return fixture


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    running = drafting_server(tmp_path_factory.mktemp("serve"), tiny)
    yield running
    assert running.stop() == 0, running.log()


def plain_text(tiny, messages: list[dict] | None = None, prompt: str | list[int] | None = None, max_tokens: int = 16,
               sampling: Sampling = Sampling(temperature=0)) -> str:
    """What the target alone generates (greedily, unless told), in this process: the server must say the same.
    prompt: text read as written, or token ids."""
    with Session(tiny["target"], None, Runtime(ctx_size=512), Speculation(drafting=DrafterKind.PLAIN)) as session:
        tokens = session.prompts.chat_tokens(messages) if messages else \
            session.prompts.tokenize(prompt, raw=True) if isinstance(prompt, str) else prompt
        return record(session.generate(Request(sampling, Limits(max_tokens), prompt=tokens))).text


# every penalty, as an agent's client may send them; greedy, so the drafted text must be the plain one
PENALTIES = {"presence_penalty": -1.0, "frequency_penalty": 0.5, "repeat_penalty": 1.5, "repeat_last_n": 16}


def test_penalties_are_honoured_and_the_drafted_text_stays_plain_decodings(server, tiny):
    messages = [{"role": "user", "content": PROMPT}]
    penalised = server.client().chat.completions.create(
        model="tiny", messages=messages, max_tokens=24, presence_penalty=PENALTIES["presence_penalty"],
        frequency_penalty=PENALTIES["frequency_penalty"],
        extra_body={"repeat_penalty": PENALTIES["repeat_penalty"], "repeat_last_n": PENALTIES["repeat_last_n"]})
    expected = plain_text(tiny, messages, max_tokens=24, sampling=Sampling(temperature=0, **PENALTIES))
    assert penalised.choices[0].message.content == expected != plain_text(tiny, messages, max_tokens=24)
    assert penalised.model_extra["speculation"]["accepted_tokens"] > 0
    # (penalties read every row: no tree was verified, and the record says so)
    assert penalised.model_extra["speculation"]["trees"] == {"steps": 0, "nodes": 0, "depth": 0, "branches": 0,
                                                             "accepted_tokens": 0, "kept_branch": {}}
    with pytest.raises(openai.BadRequestError) as refused:
        server.client().chat.completions.create(model="tiny", messages=messages, max_tokens=4, presence_penalty=3)
    assert refused.value.body["param"] == "presence_penalty"


def plain_ids(tiny, prompt: list[int], max_tokens: int) -> list[int]:
    """The token ids the target alone generates greedily."""
    with Session(tiny["target"], None, Runtime(ctx_size=512), Speculation(drafting=DrafterKind.PLAIN)) as session:
        return record(session.generate(Request(Sampling(temperature=0), Limits(max_tokens), prompt=prompt))).ids


def test_return_token_ids_through_the_openai_client_as_vllm_gives_them(server, tiny):
    """vLLM's return_token_ids (speculators' data generation and RL rollouts read it; taken and ignored before): the
    prompt's ids (a chat's beside its choices, a completion's in its choice) and each choice's, drafted or not,
    streamed as each chunk's, the prompt's with the first; the end-of-generation token that ends one last."""
    model = Model(tiny["target"], vocab_only=True)
    messages = [{"role": "user", "content": PROMPT}]
    read = Prompts(model, 512).chat_tokens(messages)
    asked = {"model": "tiny", "max_tokens": 12, "extra_body": {"return_token_ids": True}}
    chat = server.client().chat.completions.create(messages=messages, **asked)
    assert chat.model_extra["prompt_token_ids"] == read
    assert chat.choices[0].model_extra["token_ids"] == plain_ids(tiny, read, 12)
    assert chat.model_extra["speculation"]["accepted_tokens"] > 0
    text = server.client().completions.create(prompt=PROMPT, **asked)
    raw = Prompts(model, 512).tokenize(PROMPT, raw=True)
    assert text.choices[0].model_extra["prompt_token_ids"] == raw
    assert text.choices[0].model_extra["token_ids"] == plain_ids(tiny, raw, 12)
    chunks = list(server.client().chat.completions.create(messages=messages, stream=True, n=2, **asked))
    assert [c.model_extra.get("prompt_token_ids") for c in chunks if c.model_extra.get("prompt_token_ids")] == [read] * 2
    for index in (0, 1):
        streamed = [i for c in chunks for choice in c.choices if choice.index == index
                    for i in choice.model_extra["token_ids"]]
        assert streamed == chat.choices[0].model_extra["token_ids"]
    chunks = list(server.client().completions.create(prompt=PROMPT, stream=True, **asked))
    assert [choice.model_extra.get("prompt_token_ids") for c in chunks for choice in c.choices][0] == raw
    assert [i for c in chunks for choice in c.choices for i in choice.model_extra["token_ids"]] == \
        text.choices[0].model_extra["token_ids"]
    eos = model.eog_tokens[0]
    ended = server.client().completions.create(prompt=PROMPT, logit_bias={str(eos): 100}, **asked)
    assert ended.choices[0].model_extra["token_ids"] == [eos] and ended.choices[0].finish_reason == "stop"
    plain = server.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=2)
    assert "token_ids" not in plain.choices[0].model_extra


def test_logprobs_whole_and_streamed_through_the_openai_client(server):
    """The target's rows' own numbers for every token, drafted or not: whole and streamed alike, the
    likeliest first, the greedy choice the likeliest; completions in their own shape."""
    messages = [{"role": "user", "content": PROMPT}]
    whole = server.client().chat.completions.create(model="tiny", messages=messages, max_tokens=12, logprobs=True,
                                                    top_logprobs=3)
    content = whole.choices[0].logprobs.content
    assert b"".join(bytes(t.bytes) for t in content).decode(errors="replace") == whole.choices[0].message.content
    assert len(content) == whole.usage.completion_tokens and whole.model_extra["speculation"]["accepted_tokens"] > 0
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token
               and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob for t in content)
    chunks = list(server.client().chat.completions.create(model="tiny", messages=messages, max_tokens=12,
                                                          logprobs=True, top_logprobs=3, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, t.bytes) for t in streamed] == [(t.token, t.bytes) for t in content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content], abs=1e-4)

    completion = server.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=8, logprobs=2)
    shown = completion.choices[0].logprobs
    assert len(shown.tokens) == 8 and all(len(top) <= 2 for top in shown.top_logprobs)
    assert shown.text_offset == [sum(map(len, shown.tokens[:i])) for i in range(8)]
    assert all(p <= 0 for p in shown.token_logprobs)
    for wrong, param in (({"top_logprobs": 3}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs")):
        with pytest.raises(openai.BadRequestError) as refused:
            server.client().chat.completions.create(model="tiny", messages=messages, max_tokens=2, **wrong)
        assert refused.value.body["param"] == param


def test_an_echoed_prompt_carries_its_tokens_logprobs_as_lm_eval_reads_them(server, tiny):
    """lm-eval's loglikelihood tasks through its local-completions model: its remote tokenizer (vLLM's
    /tokenizer_info, /tokenize, /detokenize), then token ids in a batch of one with echo, logprobs 1 and
    max_tokens 1, from which it reads token_logprobs[ctxlen:-1], each checked against its top_logprobs' best
    (`echo` was refused as unsupported before)."""
    client, base = server.client(), server.base
    info = httpx.get(base + "/tokenizer_info").json()
    assert "eos_token" in info and info["model_max_length"] == 512 and info["chat_template"]
    ids = httpx.post(base + "/tokenize", json={"prompt": PROMPT, "add_special_tokens": False}).json()["tokens"]
    text = httpx.post(base + "/detokenize", json={"tokens": ids}).json()["prompt"]
    assert text.strip() == PROMPT
    echoed = client.completions.create(model="tiny", prompt=[ids], echo=True, logprobs=1, max_tokens=1)
    choice = echoed.choices[0]
    shown = choice.logprobs
    assert len(shown.token_logprobs) == len(ids) + 1 and shown.token_logprobs[0] is None and shown.top_logprobs[0] is None
    assert choice.text == text + plain_text(tiny, prompt=text, max_tokens=1) == "".join(shown.tokens)
    assert shown.text_offset == [sum(map(len, shown.tokens[:i])) for i in range(len(shown.tokens))]
    assert shown.token_logprobs[-1] == max(shown.top_logprobs[-1].values())  # greedy: its own choice the best
    with Session(tiny["target"], None, Runtime(ctx_size=512), Speculation(drafting=DrafterKind.PLAIN)) as alone:
        scored = record(alone.generate(Request(Sampling(temperature=0, prompt_logprobs=1), Limits(1), prompt=ids)))
    assert shown.token_logprobs[1:-1] == pytest.approx([e.chosen.logprob for e in scored.prompt_logprobs[1:]], abs=1e-4)
    chunks = list(client.completions.create(model="tiny", prompt=[ids], echo=True, logprobs=1, max_tokens=3,
                                            stream=True))
    assert chunks[0].choices[0].text == text and chunks[0].choices[0].logprobs.token_logprobs[0] is None
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text + plain_text(tiny, prompt=text, max_tokens=3)
    unasked = client.completions.create(model="tiny", prompt=PROMPT, echo=True, max_tokens=2)
    assert unasked.choices[0].text.startswith(PROMPT) and unasked.choices[0].logprobs is None
    for wrong, param in (({"prompt": [ids] * 9, "n": 2}, "prompt"), ({"prompt": "def f(", "suffix": "):"}, "echo")):
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model="tiny", max_tokens=1, **{"prompt": PROMPT, "echo": True, **wrong})
        assert refused.value.body["param"] == param


def test_several_prompts_are_answered_in_one_response_as_openai_numbers_their_choices(server, tiny):
    """OpenAI's (and llama-server's) completions take a list of prompts, texts or token ids (lm-eval sends its
    batches so): each prompt's n choices in turn, index prompt * n + choice, its prompt counted in the usage
    (refused before: "localspec answers one per request")."""
    client = server.client()
    prompts = ["tell me about the cat", "once upon a time"]
    whole = client.completions.create(model="tiny", prompt=prompts, max_tokens=6, n=2)
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    assert [c.text for c in whole.choices] == [plain_text(tiny, prompt=p, max_tokens=6) for p in prompts for _ in "ab"]
    counts = [client.completions.create(model="tiny", prompt=p, max_tokens=6).usage.prompt_tokens for p in prompts]
    assert whole.usage.prompt_tokens == sum(counts) and whole.usage.completion_tokens == 24
    ids = [httpx.post(server.base + "/tokenize", json={"content": p}).json()["tokens"] for p in prompts]
    echoed = client.completions.create(model="tiny", prompt=ids, max_tokens=1, echo=True, logprobs=1)
    assert [len(c.logprobs.token_logprobs) for c in echoed.choices] == [len(i) + 1 for i in ids]
    chunks = list(client.completions.create(model="tiny", prompt=prompts, max_tokens=6, stream=True))
    assert ["".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i) for i in (0, 1)] == \
        [plain_text(tiny, prompt=p, max_tokens=6) for p in prompts]


def test_n_choices_read_the_prompt_once_and_each_drafts(server, tiny):
    messages = [{"role": "user", "content": PROMPT}]
    sampled = server.client().chat.completions.create(model="tiny", messages=messages, max_tokens=12, n=3,
                                                      temperature=1.0, seed=7)
    assert [choice.index for choice in sampled.choices] == [0, 1, 2]
    texts = [choice.message.content for choice in sampled.choices]
    assert len(set(texts)) > 1  # seeds 7, 8, 9
    read = [choice.model_extra["timings"] for choice in sampled.choices]
    assert read[0]["prompt_n"] > 1 and all(t["prompt_n"] <= 1 and t["cache_n"] >= read[0]["prompt_n"] - 1
                                           for t in read[1:])
    assert all(choice.model_extra["speculation"]["draft_tokens"] > 0 for choice in sampled.choices)
    assert sampled.usage.completion_tokens == sum(t["predicted_n"] for t in read)
    again = server.client().chat.completions.create(model="tiny", messages=messages, max_tokens=12, n=3,
                                                    temperature=1.0, seed=7)
    assert [choice.message.content for choice in again.choices] == texts
    greedy = server.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=10, n=2, logprobs=1)
    assert [c.text for c in greedy.choices] == [plain_text(tiny, prompt=PROMPT, max_tokens=10)] * 2
    assert all(c.logprobs.text_offset[0] == 0 for c in greedy.choices)
    chunks = list(server.client().chat.completions.create(
        model="tiny", messages=messages, max_tokens=12, n=3, temperature=1.0, seed=7, stream=True,
        stream_options={"include_usage": True}, logprobs=True))
    streamed, ended = {0: "", 1: "", 2: ""}, {}
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                ended[choice.index] = chunk.model_extra["speculation"]
    assert [streamed[i] for i in range(3)] == texts  # side by side, each choice as whole
    assert sorted(ended) == [0, 1, 2] and all(record["draft_tokens"] > 0 for record in ended.values())
    assert chunks[-1].usage.completion_tokens == sampled.usage.completion_tokens
    assert all(chunk.choices[0].logprobs.content for chunk in chunks if chunk.choices and chunk.choices[0].delta.content)
    for wrong in ({"n": 17}, {"n": 0}):
        with pytest.raises(openai.BadRequestError) as refused:
            server.client().chat.completions.create(model="tiny", messages=messages, max_tokens=2, **wrong)
        assert refused.value.body["param"] == "n"


def test_chat_completion_carries_usage_timings_and_speculation(server, tiny):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": PROMPT}]
    response = server.client().chat.completions.create(model="tiny", messages=messages, max_tokens=16)
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == plain_text(tiny, messages)
    assert choice.finish_reason == "length"
    assert response.model == "tiny" and response.object == "chat.completion"
    assert response.usage.completion_tokens == 16
    assert response.usage.total_tokens == response.usage.prompt_tokens + 16
    timings, speculation = response.timings, response.speculation
    assert timings["predicted_n"] == 16 and timings["draft_n"] >= timings["draft_n_accepted"] > 0
    assert timings["prompt_n"] + timings["cache_n"] == response.usage.prompt_tokens
    assert timings["cache_n"] == response.usage.prompt_tokens_details.cached_tokens
    assert speculation["drafting"] == "draft" and speculation["speculated"]
    assert speculation["equivalence"].startswith("same tokens as plain greedy decoding")
    assert speculation["draft_tokens"] == timings["draft_n"]
    assert speculation["drafters"]["draft"]["accepted_tokens"] == timings["draft_n_accepted"]
    assert len(speculation["acceptance_by_position"]) == len(speculation["drafts_by_position"]) > 0
    assert speculation["mean_accepted_length"] > 1


def test_a_streamed_chat_says_the_same_and_ends_with_the_statistics(server, tiny):
    messages = [{"role": "user", "content": PROMPT + " again"}]
    stream = server.client().chat.completions.create(model="tiny", messages=messages, max_tokens=12, stream=True,
                                                     stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain_text(tiny, messages, max_tokens=12)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 12
    assert last.timings["predicted_n"] == 12 and last.speculation["draft_tokens"] > 0
    assert all(c.model == "tiny" and c.id == chunks[0].id for c in chunks)


def test_completions_full_and_streamed_and_the_prompt_cache(server, tiny):
    client = server.client()
    prompt = "the cat sat on the mat and looked"
    first = client.completions.create(model="tiny", prompt=prompt, max_tokens=10)
    assert first.choices[0].text == plain_text(tiny, prompt=prompt, max_tokens=10)
    assert first.object == "text_completion"
    again = client.completions.create(model="tiny", prompt=prompt, max_tokens=10)
    # the previous request left the whole prompt in both KV caches (all but its last token, which
    # the first step decodes)
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    assert again.timings["cache_n"] == again.usage.prompt_tokens - 1
    assert again.choices[0].text == first.choices[0].text
    chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=10, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == first.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].speculation["draft_tokens"] > 0


def test_a_conversation_resent_with_one_more_turn_reads_only_the_new_turn(server):
    client = server.client()
    messages = [{"role": "user", "content": "first question about cats"}]
    first = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "and a second one"}]
    second = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1
    assert second.timings["prompt_n"] < second.usage.prompt_tokens - first.usage.prompt_tokens + 8


def test_stop_strings_seed_and_sampling_fields(server, tiny):
    client = server.client()
    full = client.completions.create(model="tiny", prompt="abc", max_tokens=12).choices[0].text
    stop = full[4:6]
    stopped = client.completions.create(model="tiny", prompt="abc", max_tokens=12, stop=[stop])
    assert stopped.choices[0].text == full[: full.index(stop)] and stopped.choices[0].finish_reason == "stop"
    sampled = [client.completions.create(model="tiny", prompt="abc", max_tokens=12, temperature=0.9, top_p=0.9,
                                         seed=7, extra_body={"top_k": 20, "min_p": 0.01}) for _ in range(2)]
    assert sampled[0].choices[0].text == sampled[1].choices[0].text  # the same seed
    assert sampled[0].speculation["equivalence"].startswith("same distribution")


def test_models_and_health(server):
    models = server.client().models.list()
    assert [m.id for m in models.data] == ["tiny"]
    health = httpx.get(server.base + "/health").json()
    assert health["status"] == "ok"


@pytest.mark.parametrize("fields, param", [
    ({"messages": []}, "messages"),
    ({"n": 99}, "n"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": 3}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"tool_choice": "required"}, "tool_choice"),  # and no tools to call (test_tools.py has the rest)
    ({"logprobs": "yes"}, "logprobs"),
    ({"logit_bias": {"42": True}}, "logit_bias"),  # (a bias is a number, or false to ban the token)
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"messages": [{"role": "function", "content": "42", "name": "f"}]}, "messages.0.role"),
    ({"messages": [{"role": "tool", "content": "42"}]}, "messages.0.tool_call_id"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages.0.content.0.image_url"),  # (no data: URL, http(s) URL or base64)
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": ""}}]}]},
     "messages.0.content.0.input_audio.data"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "UklG"}}]}]},
     "messages.0.content.0.input_audio.format"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "iVBORw0KGgoAAAAN",
                                                                                        "format": "wav"}}]}]},
     "messages.0.content.0.input_audio.data"),  # (a PNG's bytes: refused as "reads no images")
    # (a part that fits none of content's types is named by the part's own field, not as content that is no string)
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages.0.content.0.image_url.url"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages.0.content.0.text"),
    ({"messages": [{"role": "user", "content": "x" * 2000}]}, "messages"),  # longer than the context
    ({"stop": ["ok", ""]}, "stop"),
    ({"stop": [f"s{n}" for n in range(550_000)]}, "stop"),  # 0.45 s more every step (issue 46)
    ({"stop": ["x" * 1_001]}, "stop"),
    ({"seed": -2}, "seed"),
])
def test_bad_requests_raise_the_openai_clients_bad_request_error(server, fields, param):
    request = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **fields}
    with pytest.raises(openai.BadRequestError) as raised:
        server.client().chat.completions.create(**request)
    error = raised.value.body
    assert raised.value.status_code == 400 and error["param"] == param and error["message"]
    assert "Traceback" not in server.log()


def test_a_schema_slow_to_convert_holds_up_no_other_request(server):
    # a JSON schema's conversion to a grammar ran on the event loop: 20,000 properties held every request
    # for a second (issue 46)
    schema = {"type": "object", "properties": {f"p{n}": {"type": "string"} for n in range(20_000)}}
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "response_format": {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}}
    finished = []
    slow = threading.Thread(target=lambda: finished.append(httpx.post(server.url + "/chat/completions", json=body,
                                                                      timeout=120).status_code))
    slow.start()
    time.sleep(0.2)  # its body has arrived and its schema is being converted
    assert httpx.get(server.base + "/health", timeout=30).status_code == 200
    answered_first = not finished
    slow.join(120)
    assert finished == [400] and answered_first


def test_a_prompt_longer_than_the_context_says_so(server):
    with pytest.raises(openai.BadRequestError) as raised:
        server.client().completions.create(model="tiny", prompt="abc " * 300, max_tokens=4)
    assert raised.value.code == "context_length_exceeded" and "context" in raised.value.message


@pytest.mark.parametrize("body, status, code", [
    (b"{not json", 400, "invalid_json"),
    (b"[1, 2]", 400, "invalid_json"),
    (b"\xff\xfe", 400, "invalid_json"),
    (b'{"messages": "hi"}', 400, "list_type"),
    (b'{"messages": [{"role": "user", "content": 5}]}', 400, None),
    (b'{"messages": [{"content": "hi"}]}', 400, "missing"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}', 400, "bool_type"),
    (b"[" * 100_000 + b"]" * 100_000, 400, "invalid_json"),
    # half a UTF-16 pair, as an editor that cut a string inside an emoji sends it: a 500 and a traceback before
    (b'{"messages": [{"role": "user", "content": "\\ud800x"}]}', 400, "invalid_json"),
])
def test_malformed_bodies_get_openais_error_object(server, body, status, code):
    response = httpx.post(server.url + "/chat/completions", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    if code:
        assert error["code"] == code


# Values of every JSON type, and numbers no C field holds: whatever a field is given, the answer is 200 or
# OpenAI's 400, never a 500 (`{"type": ["text"]}` in a content part was "unhashable type" and a traceback).
WRONG_VALUES = [None, True, 1.5, -1, 2**70, -(2**70), "x", "", [], ["text"], [1], {}, {"type": "text"}]
CHAT_BODY = {"model": "tiny", "max_tokens": 1, "stop": ["."], "stream_options": {"include_usage": True},
             "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "logprobs": True,
             "top_logprobs": 2, "presence_penalty": 0.5, "frequency_penalty": -0.5, "n": 2}
COMPLETION_BODY = {"model": "tiny", "max_tokens": 1, "prompt": [[5, 6], [7, 8]], "seed": 1, "temperature": 0.5,
                   "top_p": 0.9, "top_k": 4, "min_p": 0.1, "n": 1, "logprobs": 2, "repeat_penalty": 1.1,
                   "repeat_last_n": 8, "echo": True}


def _paths(value, path=()):
    """Every place in a JSON value that a client could fill: keys, list items, the value itself."""
    yield path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, inner in items:
        yield from _paths(inner, path + (key,))


def _replaced(value, path, new):
    if not path:
        return new
    copy = json.loads(json.dumps(value))
    inner = copy
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] = new
    return copy


@pytest.mark.parametrize("route, body", [("/chat/completions", CHAT_BODY), ("/completions", COMPLETION_BODY)])
def test_a_wrongly_typed_value_anywhere_in_a_request_is_a_400_never_a_500(server, route, body):
    statuses = {}
    with httpx.Client(timeout=60) as client:
        assert client.post(server.url + route, json=body).status_code == 200  # (each wrong value the only one)
        for path in list(_paths(body))[1:]:
            for wrong in WRONG_VALUES:
                response = client.post(server.url + route, json=_replaced(body, path, wrong))
                statuses[(path, json.dumps(wrong))] = response.status_code
                if response.status_code != 200:
                    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    # (a model's name that is a string but names no model here is a 404, as OpenAI says it)
    assert {where: status for where, status in statuses.items()
            if status not in (200, 400) and not (where[0] == ("model",) and status == 404)} == {}
    assert "Traceback" not in server.log()


# A request every other route takes as it stands, each value in it a place a client may fill wrongly.
EVERY_ROUTES_BODY = {
    "/v1/embeddings": ("POST", {"model": "tiny", "input": ["hi", "there"], "encoding_format": "float"}),
    "/api/embed": ("POST", {"model": "tiny", "input": ["hi"], "truncate": True, "options": {"num_ctx": 64},
                            "keep_alive": "5m"}),
    "/api/embeddings": ("POST", {"model": "tiny", "prompt": "hi", "options": {"temperature": 0}}),
    "/api/show": ("POST", {"model": "tiny", "verbose": True}),
    "/api/v0/chat/completions": ("POST", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                          "max_tokens": 1, "ttl": 300, "stream": False}),
    "/api/v0/completions": ("POST", {"model": "tiny", "prompt": "hi", "max_tokens": 1, "stop": "\n", "ttl": 60}),
    "/api/v1/chat": ("POST", {"model": "tiny", "input": [{"type": "message", "content": "hi"}], "system_prompt": "s",
                              "max_output_tokens": 1, "temperature": 0.5, "top_k": 4, "reasoning": "off",
                              "store": False, "context_length": 128, "stream": False}),
    "/api/v1/models/load": ("POST", {"model": "tiny", "context_length": 256, "eval_batch_size": 512,
                                     "echo_load_config": True}),
    "/api/v1/models/unload": ("POST", {"instance_id": "tiny"}),  # (a 400: serve started with it)
    "/api/v1/models/download": ("POST", {"model": "no-such-model", "quantization": "Q4_K_M"}),  # (a 404: none such)
    "/api/generate": ("POST", {"model": "tiny", "prompt": "hi", "system": "s", "stream": False, "format": "json",
                               "options": {"num_predict": 1, "stop": ["."], "seed": 1, "mirostat": 1, "mirostat_tau": 4.0},
                               "keep_alive": 60, "think": False}),
    "/api/pull": ("POST", {"model": "no-such-model", "stream": False, "insecure": False}),  # (a 404: none such)
    "/api/create": ("POST", {"model": "made", "from": "tiny", "system": "s", "parameters": {"temperature": 0, "stop": ["x"]},
                             "messages": [{"role": "user", "content": "a"}], "license": "MIT", "stream": False}),
    "/api/copy": ("POST", {"source": "tiny", "destination": "copied"}),
    "/api/delete": ("DELETE", {"model": "copied"}),
    "/v1/responses": ("POST", {"model": "tiny", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "hi"}]}], "max_output_tokens": 16, "instructions": "x", "temperature": 0,
        "text": {"format": {"type": "text"}}, "store": True}),
    "/v1/messages": ("POST", {"model": "tiny", "max_tokens": 1, "system": [{"type": "text", "text": "s"}],
                              "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                              "stop_sequences": ["."], "temperature": 0, "metadata": {"user_id": "u"}}),
    "/v1/responses/input_tokens": ("POST", {"model": "tiny", "input": "hi", "instructions": "x", "temperature": 0}),
    "/v1/chat/completions/input_tokens": ("POST", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}),
    "/v1/messages/count_tokens": ("POST", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "system": "s"}),
    "/localspec/v1/generate": ("POST", {"prompt": "hi", "max_tokens": 1, "temperature": 0, "stop": ["."]}),
    "/localspec/v1/tokens": ("POST", {"prompt": "hi"}),
    "/completion": ("POST", {"prompt": "hi", "n_predict": 2, "temperature": 0, "stop": ["."], "n_probs": 1,
                             "response_fields": ["content"], "cache_prompt": True, "samplers": ["top_k"],
                             "dry_multiplier": 0.5, "dry_base": 1.5, "dry_allowed_length": 1, "dry_penalty_last_n": 16,
                             "dry_sequence_breakers": ["\n"], "xtc_probability": 0.0, "xtc_threshold": 0.1,
                             "typical_p": 0.9, "dynatemp_range": 0.2, "dynatemp_exponent": 1.0, "top_n_sigma": 1.5,
                             "mirostat": 2, "mirostat_tau": 5.0, "mirostat_eta": 0.1}),
    "/tokenize": ("POST", {"content": "hi", "add_special": True, "with_pieces": True}),
    "/detokenize": ("POST", {"tokens": [5, 6]}),
    "/apply-template": ("POST", {"messages": [{"role": "user", "content": "hi"}]}),
}


def test_no_route_answers_a_wrongly_typed_value_with_a_500(tiny, tmp_path):
    """Every route that reads a body, each of its values replaced by values of other types and sizes: a 4xx
    saying what is wrong, never a bug's 500 (the chat routes are swept with every wrong value above)."""
    server = ServerProcess(tmp_path, tiny["target"], "--alias", "tiny", "-c", "256", "--offline")
    failures = {}
    try:
        with httpx.Client(timeout=60) as client:
            for route, (method, body) in EVERY_ROUTES_BODY.items():
                assert client.request(method, server.base + route, json=body).status_code == {
                    "/api/pull": 404, "/api/v1/models/download": 404, "/api/v1/models/unload": 400}.get(route, 200), route
                for path in _paths(body):
                    for wrong in (None, -1, 2**70, "x", [1], {}):
                        answer = client.request(method, server.base + route, json=_replaced(body, path, wrong))
                        if answer.status_code >= 500:
                            failures[route, path, json.dumps(wrong)] = answer.text[:200]
        assert failures == {}
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()


def test_prompts_no_context_could_hold_are_refused_at_the_door_while_others_are_served(server):
    """100,000 one-space messages were rendered and tokenized on the generation thread for four minutes
    before their 400, and a concurrent request got no answer meanwhile: now arithmetic refuses them on the
    event loop (more messages than the context has tokens, more characters than its tokens can hold)."""
    answers = {}

    def ask(name: str, route: str, body: dict) -> None:
        answers[name] = httpx.post(server.url + route, json=body, timeout=60)

    many = {"messages": [{"role": "user", "content": ""}] * 100_000, "max_tokens": 1}
    long = {"prompt": "a" * 500_000, "max_tokens": 1}
    normal = {"prompt": "tell me", "max_tokens": 4}
    threads = [threading.Thread(target=ask, args=args) for args in
               [("many", "/chat/completions", many), ("long", "/completions", long), ("normal", "/completions", normal)]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert answers["normal"].status_code == 200
    for name, what in (("many", "100,000 messages cannot fit the context of 512 tokens"),
                       ("long", "characters fit; raise --ctx-size")):
        error = answers[name].json()["error"]
        assert answers[name].status_code == 400 and error["code"] == "context_length_exceeded", error
        assert what in error["message"]


def test_response_format_and_grammars_constrain_the_answer_under_speculation(server):
    client = server.client()
    ask = [{"role": "user", "content": "hi"}]
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    strict = client.chat.completions.create(model="tiny", messages=ask, max_tokens=64, response_format={
        "type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}})
    assert json.loads(strict.choices[0].message.content) in ({"ok": True}, {"ok": False})
    assert strict.speculation["draft_tokens"] > 0  # drafted all the same
    any_object = client.chat.completions.create(model="tiny", messages=ask, max_tokens=4,
                                                response_format={"type": "json_object"})
    assert any_object.choices[0].message.content.startswith("{")
    # llama-server's own fields, on both endpoints
    yes_no = client.completions.create(model="tiny", prompt="abc", max_tokens=8,
                                       extra_body={"grammar": 'root ::= ("yes" | "no") "."'})
    assert yes_no.choices[0].text in ("yes.", "no.") and yes_no.choices[0].finish_reason == "stop"
    top_level = client.completions.create(model="tiny", prompt="abc", max_tokens=64, extra_body={"json_schema": schema})
    assert json.loads(top_level.choices[0].text) in ({"ok": True}, {"ok": False})


def test_other_servers_names_for_the_repeat_penalty_and_the_limit_are_read(server):
    """vLLM's, TGI's and OpenRouter's `repetition_penalty` and llama-server's `n_predict` on /v1 (read before
    max_tokens there), and OpenAI's `max_tokens` on llama-server's /completion (read where n_predict is not), were
    passed over: the answer unpenalised, or as long as the server's default."""
    client = server.client()
    ask = {"model": "tiny", "prompt": "the cat sat on the mat and the cat", "max_tokens": 24, "temperature": 0}
    free, named, vllms = (client.completions.create(**ask, extra_body=extra).choices[0].text for extra in (
        {}, {"repeat_penalty": 3.0}, {"repetition_penalty": 3.0}))
    assert vllms == named != free
    with pytest.raises(openai.BadRequestError, match="one setting"):
        client.completions.create(**ask, extra_body={"repeat_penalty": 2.0, "repetition_penalty": 3.0})
    short = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=20,
                                           temperature=0, extra_body={"n_predict": 3, "ignore_eos": True})
    assert short.usage.completion_tokens == 3
    llamas = httpx.post(server.base + "/completion", json={"prompt": "abc", "max_tokens": 3, "temperature": 0,
                                                           "ignore_eos": True, "samplers": "kypmxt"}, timeout=60).json()
    assert llamas["tokens_predicted"] == 3


def test_vllms_structured_outputs_and_their_older_guided_names_constrain_the_answer(server):
    """vLLM's clients ask for structured output with `structured_outputs` (json, regex, choice, grammar,
    json_object) or, before vLLM 0.12, `guided_json` and its kin: each was passed over, the answer free text as if
    nothing had been asked."""
    client = server.client()

    def said(**asked) -> str:
        return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=24, extra_body=asked).choices[0].message.content

    assert said(structured_outputs={"choice": ["yes", "no"]}) in ("yes", "no")
    assert said(guided_choice=["maybe so", "no"]) in ("maybe so", "no")
    for asked in ({"structured_outputs": {"regex": r"[a-c]{2}\.\d"}}, {"guided_regex": r"[a-c]{2}\.\d"}):
        assert re.fullmatch(r"[a-c]{2}\.\d", said(**asked)), asked
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": r"^[a-z]\d$"}},
              "required": ["code"], "additionalProperties": False}
    for asked in ({"structured_outputs": {"json": schema}}, {"guided_json": json.dumps(schema)}):
        assert re.fullmatch(r"[a-z]\d", json.loads(said(**asked))["code"]), asked
    assert said(guided_grammar='root ::= ("yes" | "no") "."') in ("yes.", "no.")
    assert said(structured_outputs={"json_object": True}).startswith("{")
    completion = client.completions.create(model="tiny", prompt="abc", max_tokens=8,
                                           extra_body={"structured_outputs": {"choice": ["up", "down"]}})
    assert completion.choices[0].text in ("up", "down")


@pytest.mark.parametrize("body, message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "json_schema.schema is missing"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/nowhere"}}}},
     "cannot be turned into a grammar"),
    ({"response_format": {"type": "json_object"}, "grammar": 'root ::= "a"'}, "each constrain the output"),
    ({"structured_outputs": {"choice": ["a"], "regex": "b"}}, "each constrain the output"),
    ({"guided_json": {"type": "object"}, "response_format": {"type": "json_object"}}, "each constrain the output"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag is not supported"),
    ({"guided_regex": r"\bword"}, "has no equivalent in a grammar"),
    ({"guided_json": "{not json"}, "guided_json: not a JSON schema"),
    ({"guided_choice": []}, "no choices"),
    ({"min_tokens": 5}, "min_tokens is not supported"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"grammar": 'root ::= "unclosed'}, "the grammar does not compile"),
    # each of these ended the whole process (SIGSEGV in llama.cpp) within 0.1 s before it was bounded (issue 46)
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "string", "minLength": 100_000}}}}, "at most 1,000 are taken"),
    ({"grammar": "root ::= " + "(" * 100_000 + '"a"' + ")" * 100_000}, "at most 1,000 are taken"),
    # a 500 each (the converter's AttributeError), and the converter's memory run out (issue 46)
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": []}}}}, "cannot be turned into a grammar"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "string", "pattern": "^a{99999999999}$"}}}}, "at most 100,000 are taken"),
])
def test_a_constraint_that_cannot_be_used_is_one_400_and_the_server_goes_on(server, body, message):
    response = httpx.post(server.url + "/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                                  "max_tokens": 4, **body})
    assert response.status_code == 400 and message in response.json()["error"]["message"], response.text
    assert server.client().completions.create(model="tiny", prompt="abc", max_tokens=2).choices[0].text


TWO_TOOLS_OF_ONE_NAME = [{"type": "function", "function": {"name": "f"}}] * 2


@pytest.mark.parametrize("path, body, message", [
    ("/completion", {"prompt": "a", "n_predict": 2, "json_schema": {"$ref": "#/nowhere"}}, "cannot be turned into"),
    ("/api/chat", {"messages": [{"role": "user", "content": "hi"}], "stream": False, "tools": TWO_TOOLS_OF_ONE_NAME},
     "two tools have the same name"),
    ("/localspec/v1/generate", {"prompt": "hi", "drafting": {}}, "drafting: one of"),
    ("/localspec/v1/generate", {"prompt": "hi", "limits": []}, "limits: an object of settings"),  # (ran unlimited)
])
def test_requests_that_were_500s_on_their_routes_are_400s(server, path, body, message):
    response = httpx.post(server.base + path, json=body)
    assert response.status_code == 400 and message in response.text, response.text
    assert "Traceback" not in server.log()


def test_json_that_is_not_json_and_a_compressed_body_are_said_as_they_are(server):
    # NaN passed every check (temperature NaN: "should be less than or equal to 2"); a gzip body was "not valid JSON:
    # can't decode byte 0x8b"; a schema of true (any value) was "'bool' object has no attribute 'get'"
    body = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": NaN}'
    nan = httpx.post(server.url + "/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert nan.status_code == 400 and "NaN is not JSON" in nan.text, nan.text
    packed = httpx.post(server.url + "/chat/completions", content=gzip.compress(b"{}"),
                        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert packed.status_code == 415 and "Content-Encoding gzip is not read here" in packed.text, packed.text
    anything = server.client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": True}})
    assert anything.choices[0].message.content is not None


def test_a_refusal_before_any_route_runs_is_in_the_routes_own_shape(server):
    # a 404, a 405 and a 403 were OpenAI's shape on Ollama's, Anthropic's and llama-server's routes alike
    assert isinstance(httpx.get(server.base + "/api/nope").json()["error"], str)  # (Ollama's: a text)
    assert isinstance(httpx.put(server.base + "/api/chat").json()["error"], str)
    assert httpx.put(server.base + "/v1/messages").json()["type"] == "error"  # (Anthropic's)
    assert isinstance(httpx.post(server.base + "/api/chat", json={}, headers={"Origin": "http://evil.example"}).json()[
        "error"], str)
    assert httpx.put(server.base + "/completion").json()["error"]["type"] == "invalid_request_error"  # (llama-server's)
    assert httpx.get(server.url + "/nope").json()["error"]["code"] == "not_found"  # (OpenAI's, as before)


def test_embeddings_give_one_unit_vector_an_input_through_the_openai_client(server):
    # the openai package asks for base64 unless told otherwise, and decodes it
    answer = server.client().embeddings.create(model="tiny", input=["the cat", "the dog", "the cat"])
    vectors = [np.array(item.embedding) for item in answer.data]
    assert [item.index for item in answer.data] == [0, 1, 2] and all(v.shape == (64,) for v in vectors)
    assert all(abs(np.linalg.norm(v) - 1) < 1e-5 for v in vectors)
    assert np.allclose(vectors[0], vectors[2], atol=1e-6) and not np.allclose(vectors[0], vectors[1], atol=1e-3)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens > 6
    floats = httpx.post(server.url + "/embeddings", json={"input": "the cat", "encoding_format": "float"}).json()
    assert np.allclose(floats["data"][0]["embedding"], vectors[0], atol=1e-6)
    ids = httpx.post(server.url + "/embeddings", json={"input": [[5, 6, 7]], "encoding_format": "float"}).json()
    assert len(ids["data"][0]["embedding"]) == 64
    # OpenAI's dimensions: the first that many, normalized again (text-embedding-3's and Matryoshka models' way)
    short = np.array(server.client().embeddings.create(model="tiny", input="the cat", dimensions=8).data[0].embedding)
    raw = np.array(httpx.post(server.base + "/embedding", json={"content": "the cat", "embd_normalize": -1}).json()[
        0]["embedding"][0][:8])
    assert short.shape == (8,) and np.allclose(short, raw / np.linalg.norm(raw), atol=1e-6)
    # generating after embedding is as before
    assert server.client().completions.create(model="tiny", prompt="abc", max_tokens=2).choices[0].text


def test_llama_servers_own_embedding_route_and_its_normalizations(server):
    """/embedding (and /embeddings): `content`, each vector in a list of its own, as llama-server answers; its
    embd_normalize (on /v1/embeddings too) scales as common_embd_normalize: -1 raw, 0 max-abs to 32760, 2 unit
    length, p unit p-norm."""
    unit = np.array(server.client().embeddings.create(model="tiny", input="the cat").data[0].embedding)

    def native(path: str = "/embedding", **body) -> np.ndarray:
        answer = httpx.post(server.base + path, json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        [[vector]] = [item["embedding"] for item in answer.json()]
        return np.array(vector)

    assert np.allclose(native(content="the cat"), unit, atol=1e-6)
    assert np.allclose(native("/embeddings", input="the cat"), unit, atol=1e-6)
    raw = native(content="the cat", embd_normalize=-1)
    assert np.allclose(raw / np.linalg.norm(raw), unit, atol=1e-6) and abs(np.linalg.norm(raw) - 1) > 1e-3
    assert np.isclose(np.abs(native(content="the cat", embd_normalize=0)).max(), 32760, atol=1e-2)
    assert np.isclose(np.sum(np.abs(native(content="the cat", embd_normalize=1))), 1, atol=1e-6)
    # (a large p overflowed the sum of powers: every vector came back as zeros; its norm tends to the largest magnitude)
    assert np.isclose(np.abs(native(content="the cat", embd_normalize=1000)).max(), 1, atol=1e-2)
    several = httpx.post(server.base + "/embedding", json={"content": ["the cat", "the dog"]}, timeout=60).json()
    assert [item["index"] for item in several] == [0, 1]
    openais = httpx.post(server.url + "/embeddings", json={"input": "the cat", "encoding_format": "float",
                                                          "embd_normalize": -1}, timeout=60).json()
    assert np.allclose(openais["data"][0]["embedding"], raw, atol=1e-5)
    for body, said in [({}, '"input" or "content" must be provided'), ({"content": ""}, "an input to embed is empty"),
                       ({"content": "x", "embd_normalize": -2}, "embd_normalize")]:
        refused = httpx.post(server.base + "/embedding", json=body, timeout=60)
        assert refused.status_code == 400 and said in refused.json()["error"]["message"], refused.text


@pytest.mark.parametrize("body, message", [
    ({"input": ""}, "an input to embed is empty"),
    ({"input": ["a", ""]}, "an input to embed is empty"),
    ({"input": "a", "dimensions": 65}, "from 1 to 64 of them are kept"),
    ({"input": "abc " * 400}, "raise --ctx-size or shorten it"),
    ({"input": [[10 ** 9]]}, "token"),
    ({"input": ["a"] * 2049}, "at most 2,048 a request"),  # OpenAI's limit; 10,000 ran 344 s (issue 46)
])
def test_embedding_mistakes_are_one_400_and_the_server_goes_on(server, body, message):
    response = httpx.post(server.url + "/embeddings", json=body)
    assert response.status_code == 400 and message in response.json()["error"]["message"], response.text
    assert httpx.post(server.url + "/embeddings", json={"input": "ok"}).status_code == 200


def test_too_large_bodies_get_413_and_unknown_routes_404_and_the_server_goes_on(server):
    huge = b'{"prompt": "' + b"a" * (8 * 2**20) + b'"}'
    response = httpx.post(server.url + "/completions", content=huge)
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    assert httpx.get(server.url + "/chat/completions").status_code == 405
    missing = httpx.post(server.url + "/audio/speech", json={"input": "x"})
    assert missing.status_code == 404 and "not part of this API" in missing.json()["error"]["message"]
    # the request log shows what clients sent with its control characters escaped
    assert httpx.get(server.base + "/%1b]52;c;cHduZWQ=%07").status_code == 404
    assert "\\x1b]52;c;cHduZWQ=\\x07" in server.log() and "\x1b" not in server.log()
    assert server.client().completions.create(model="tiny", prompt="abc", max_tokens=2).choices[0].text


def test_the_routes_clients_probe_are_answered_and_a_404_lists_every_route(server):
    assert httpx.get(server.base + "/").text == "localspec is running"  # what Ollama's clients look for
    assert httpx.head(server.base + "/").status_code == 200
    model = server.client().models.retrieve("tiny")
    assert model.id == "tiny" and model.model_extra["meta"]["loaded"]
    old = ollama.Client(host=server.base).embeddings(model="tiny", prompt="embed me")  # Ollama's older route
    assert len(old.embedding) == len(server.client().embeddings.create(model="tiny", input="embed me").data[0].embedding)
    listed = httpx.post(server.url + "/audio/speech", json={}).json()["error"]["message"]
    for route in ("POST /v1/chat/completions", "GET /v1/models/{name:path}", "POST /api/embeddings",
                  "POST /v1/messages/count_tokens", "GET /api/version", "GET /metrics", "POST /rerank"):
        assert route in listed, listed


def test_run_answers_through_a_running_serve_of_the_same_model_with_its_statistics(tmp_path, tiny):
    home = tmp_path / "home"
    server = ServerProcess(home, tiny["target"], "-c", "512")

    def run(*args):
        done = localspec_process(home, "run", tiny["target"], "-p", "the cat", "-n", "8", "--temp", "0", *args,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        out, err = done.communicate(timeout=120)
        assert done.returncode == 0, err
        return out.decode(), err.decode()

    try:
        served = json.loads(run("--json")[0])
        local = json.loads(run("--json", "--local")[0])
        assert served["served_by"] == server.base and "served_by" not in local
        assert served["text"] == local["text"] and served["stats"]["tokens"] == local["stats"]["tokens"] == 8
        assert served["stats"]["drafted"] == local["stats"]["drafted"]  # its Steps came over the stream too
        out, err = run()
        assert out.strip() == served["text"].strip()
        assert "answered by target.gguf" in err and f"localspec serve at {server.base}" in err and "8 tokens" in err
        assert server.log().count("/localspec/v1/generate 200") == 2
        _, err = run("--verbose")  # Ollama's timings of the serve's answer: nothing waited for a load here
        assert "eval count:           8 token(s)" in err and "eval rate:" in err and "load duration" not in err
        # chat too: its replies as a chat of its own makes them, /draft riding on each request
        script = b"the cat\n/draft off\nthe mat\n/draft 2\nthe end\n"
        chats = [localspec_process(home, "chat", tiny["target"], "-n", "6", "--temp", "0", *local, stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE).communicate(script, timeout=120)
                 for local in ((), ("--local",))]
        assert chats[0][0] == chats[1][0] and chats[0][0].count(b"\n") >= 3, chats
        assert b"answered by target.gguf" in chats[0][1] and b"answered by" not in chats[1][1]
        assert server.log().count("/localspec/v1/generate 200") == 6
        # nor one whose model reads with other settings than the command's (it answered with its own)
        for own in (("-ctk", "f32"), ("--rope-scaling", "linear", "--rope-scale", "2")):
            assert "served_by" not in json.loads(run("--json", *own)[0]), own
        # a serve of another model is not used
        assert "served_by" not in json.loads(localspec_process(
            home, "run", tiny["partial"], "-p", "x", "-n", "2", "--json", stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL).communicate(timeout=120)[0])
    finally:
        assert server.stop() == 0, server.log()


def test_serve_answers_over_https_and_run_finds_it_there(tmp_path, tiny):
    """llama-server's --ssl-cert-file and --ssl-key-file (unknown options before): the API over HTTPS through the
    openai client trusting the certificate; plain HTTP gets no answer; `run` on this machine finds the serve and
    trusts its certificate, made for another name than the address it listens on."""
    import httpx as openais_httpx  # (the openai client's own)

    certificate, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", certificate,
                    "-days", "2", "-subj", "/CN=localspec.test", "-addext", "subjectAltName=DNS:localspec.test"],
                   check=True, capture_output=True)
    home = tmp_path / "home"
    server = ServerProcess(home, tiny["target"], "-c", "512", "--ssl-cert-file", certificate, "--ssl-key-file", key)
    try:
        assert server.url.startswith("https://127.0.0.1:")
        trusting = ssl.create_default_context(cafile=certificate)
        trusting.check_hostname = False
        client = server.client(http_client=openais_httpx.Client(verify=trusting))
        reply = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                               temperature=0)
        assert reply.choices[0].message.content is not None and reply.usage.completion_tokens == 4
        with pytest.raises(httpx.HTTPError):
            httpx.get(server.base.replace("https://", "http://") + "/health", timeout=10)
        with pytest.raises(openai.APIConnectionError):  # a certificate nobody trusts
            server.client().models.list()
        done = localspec_process(home, "run", tiny["target"], "-p", "the cat", "-n", "4", "--json",
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        out, err = done.communicate(timeout=120)
        assert done.returncode == 0 and json.loads(out)["served_by"] == server.base, err
    finally:
        assert server.stop() == 0, server.log()


def test_while_loading_https_is_answered_too(tmp_path, monkeypatch):
    from localspec import net, server as server_face

    monkeypatch.setattr(server_face, "LOADING_READ_SECONDS", 0.5)
    certificate, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", certificate,
                    "-days", "2", "-subj", "/CN=x"], check=True, capture_output=True)
    tls = net.serving_tls(certificate, key)
    with net.listen("127.0.0.1", 0) as listener, server_face.answering_while_loading(listener, tls):
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as idle:  # no handshake: let go
            answered = httpx.get(f"https://127.0.0.1:{port}/v1/models", verify=net.trusting(str(certificate)))
            assert answered.status_code == 503 and answered.json()["error"]["message"] == "Loading model"
            assert idle.recv(1) == b""


@pytest.mark.parametrize("which", ["certificate", "key"])
def test_a_certificate_or_key_that_is_none_is_refused_before_anything_loads(cli, tiny, tmp_path, which):
    files = {"certificate": tmp_path / "cert.pem", "key": tmp_path / "key.pem"}
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", files["key"], "-out",
                    files["certificate"], "-days", "2", "-subj", "/CN=x"], check=True, capture_output=True)
    files[which].write_text("not PEM")
    code, _, stderr = cli("serve", tiny["target"], "--port", "0", "--ssl-cert-file", str(files["certificate"]),
                          "--ssl-key-file", str(files["key"]))
    assert code == 2 and "are not a PEM certificate and its private key" in stderr, stderr
    code, _, stderr = cli("serve", tiny["target"], "--port", "0", "--ssl-cert-file", str(files["certificate"]))
    assert code == 2 and "HTTPS takes both --ssl-cert-file and --ssl-key-file" in stderr, stderr


def test_cache_reuse_keeps_the_turns_after_a_dropped_one_through_the_openai_client(tmp_path, tiny):
    """llama-server's --cache-reuse (an unknown option before): a client that drops the oldest turns to stay within the
    context resends the rest at earlier places; they are shifted there rather than read again."""
    turns = [{"role": "system", "content": "be brief"}]
    for n in range(3):
        turns += [{"role": "user", "content": f"tell me about the cat number {n} and the mat it sat on"},
                  {"role": "assistant", "content": f"the cat number {n} sat on the mat all day and slept there"}]
    dropped = turns[:1] + turns[3:] + [{"role": "user", "content": "and then"}]
    cached = {}
    for reuse in ("0", "16"):
        server = ServerProcess(tmp_path / reuse, tiny["target"], "--no-draft", "-c", "1024", "--parallel", "1",
                               "--cache-reuse", reuse, "--temp", "0")
        try:
            client = server.client()
            client.chat.completions.create(model="x", messages=turns + [{"role": "user", "content": "so"}], max_tokens=2)
            reply = client.chat.completions.create(model="x", messages=dropped, max_tokens=4)
            cached[reuse] = reply.usage.prompt_tokens_details.cached_tokens, reply.usage.prompt_tokens
        finally:
            assert server.stop() == 0, server.log()
    (plain, prompt), (reused, _) = cached["0"], cached["16"]
    assert plain < prompt // 4 and reused > prompt * 3 // 4, cached


def test_a_llama_server_containers_environment_configures_serve(tmp_path, tiny):
    """llama.cpp's LLAMA_ARG_* variables (a llama-server container's settings) were ignored: the model, its name,
    context, sequences and sampling come from them; the command line stands over them, a TARGET over the model."""
    env = {**os.environ, "LLAMA_ARG_MODEL": str(tiny["target"]), "LLAMA_ARG_ALIAS": "from-env",
           "LLAMA_ARG_CTX_SIZE": "512", "LLAMA_ARG_N_PARALLEL": "1", "LLAMA_ARG_TEMPERATURE": "0",
           "LLAMA_ARG_N_PREDICT": "3", "LLAMA_ARG_SPEC_TYPE": "none", "LLAMA_ARG_CTX_CHECKPOINTS": "4"}
    server = ServerProcess(tmp_path / "env", env=env)
    try:
        assert [model.id for model in server.client().models.list()] == ["from-env"]
        props = httpx.get(server.base + "/props").json()
        assert props["default_generation_settings"]["n_ctx"] == 512 and props["total_slots"] == 1
        reply = server.client().completions.create(model="from-env", prompt="the cat")
        assert reply.usage.completion_tokens == 3 and reply.model_extra["speculation"]["draft_tokens"] == 0
    finally:
        assert server.stop() == 0, server.log()
    # one it does not take is said, not silently left (its context checkpoints: localspec makes none)
    assert "note: LLAMA_ARG_CTX_CHECKPOINTS: llama.cpp's setting that `localspec serve` does not take" in server.log()
    other = ServerProcess(tmp_path / "target", tiny["partial"], "-c", "1024", env=env)
    try:  # the TARGET named, and -c given, over the environment's
        assert httpx.get(other.base + "/props").json()["default_generation_settings"]["n_ctx"] == 1024
        assert "partial" in httpx.get(other.base + "/props").json()["model_path"]
    finally:
        assert other.stop() == 0, other.log()


def test_metrics_count_requests_tokens_and_draft_acceptance_by_position(server):
    server.client().completions.create(model="tiny", prompt="metrics please", max_tokens=8)
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(server.base + "/metrics").text)}

    def value(name, **labels):
        return sum(s.value for s in families[name].samples
                   if s.name.endswith("_total") or s.name == name if all(s.labels.get(k) == v for k, v in labels.items()))

    assert value("localspec:requests", outcome="ok") >= 1
    assert value("localspec:generation_tokens") >= 8
    drafted = value("localspec:spec_decode_num_draft_tokens")
    accepted = value("localspec:spec_decode_num_accepted_tokens")
    assert drafted >= accepted > 0
    assert value("localspec:spec_decode_num_accepted_tokens_per_pos") == accepted
    assert value("localspec:spec_decode_num_accepted_tokens_per_pos", position="0") > 0
    # each drafter's tokens add up to them all (earlier requests of the module's server drafted forced text too)
    assert value("localspec:drafter_draft_tokens") == drafted and value("localspec:drafter_draft_tokens", drafter="draft") > 0
    assert value("localspec:requests_running") == 0
    assert value("localspec:suffix_cache_tokens") >= 8 and value("localspec:suffix_cache_bytes") > 0


def test_api_key_is_required_except_for_health(tiny, tmp_path):
    server = ServerProcess(tmp_path / "home", tiny["target"], "--api-key", "s3cret", "--no-draft")
    try:
        with pytest.raises(openai.AuthenticationError):
            server.client(api_key="wrong").models.list()
        with pytest.raises(openai.AuthenticationError):
            server.client(api_key="wrong").chat.completions.create(model="target.gguf", messages=[{"role": "user", "content": "hi"}])
        assert httpx.get(server.base + "/metrics").status_code == 401
        assert httpx.get(server.base + "/health").status_code == 200
        reply = server.client(api_key="s3cret").chat.completions.create(
            model="target.gguf", messages=[{"role": "user", "content": "hi"}], max_tokens=3, temperature=0)
        assert reply.usage.completion_tokens == 3 and reply.speculation["speculated"] is False
    finally:
        assert server.stop(signal.SIGTERM) == 0


def test_each_api_keys_client_drafts_only_from_its_own_earlier_answers(tiny, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# one key a line: this comment is none\nsecond\n\n")
    server = ServerProcess(tmp_path / "home", tiny["target"], "--api-key", "first", "--api-key-file", str(keys))
    try:
        def from_earlier_answers(key: str) -> int:
            reply = server.client(api_key=key).completions.create(model="target.gguf", prompt="the cat sat", max_tokens=32,
                                                                  temperature=0)
            assert reply.usage.completion_tokens == 32
            return reply.speculation["drafters"].get("suffix", {}).get("accepted_tokens", 0)

        assert from_earlier_answers("first") == 0
        assert from_earlier_answers("second") == 0  # the first client's answer is not the second's to draft from
        assert from_earlier_answers("first") >= 16  # its own is
        metrics = httpx.get(server.base + "/metrics", headers={"Authorization": "Bearer second"}).text
        cached = next(float(line.split()[-1]) for line in metrics.splitlines()
                      if line.startswith("localspec:suffix_cache_tokens "))
        assert cached >= 3 * 32  # every client's cache counted
        with pytest.raises(openai.AuthenticationError):  # a comment in the key file is no key (issue 46)
            server.client(api_key="# one key a line: this comment is none").models.list()
    finally:
        assert server.stop(signal.SIGTERM) == 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_the_moment_serving_is_said_is_a_normal_exit(tiny, tmp_path, sig):
    # "serving" was printed before uvicorn took the signals over: Ctrl-C then ended serve with 130 (CI, 2026-11-29)
    server = ServerProcess(tmp_path / "home", tiny["target"], "--no-draft", "-c", "256")
    assert server.stop(sig) == 0, server.log()


def test_llama_servers_command_line_runs_and_no_webui_turns_the_page_off(tiny, tmp_path):
    """llama-server's switches for what serve does anyway (--metrics, -cb, --embeddings, --jinja, -kvu,
    --no-context-shift; each "No such option" before) are taken, so its command lines run; --no-webui is a 404
    at / for a browser."""
    server = ServerProcess(tmp_path / "home", tiny["target"], "--no-webui", "--metrics", "-cb", "--embeddings",
                           "--reranking", "--jinja", "-kvu", "--no-context-shift", "--top-nsigma", "1",
                           "--draft-p-min", "0.5")
    try:
        assert httpx.get(server.base + "/", headers={"Accept": "text/html"}).status_code == 404
        assert httpx.get(server.base + "/").text == "localspec is running"  # (what Ollama's clients look for)
        assert httpx.get(server.base + "/metrics").status_code == 200
        assert server.client().completions.create(model="target.gguf", prompt="the cat", max_tokens=2).usage
    finally:
        assert server.stop() == 0, server.log()


def test_browser_pages_of_this_machine_and_of_named_origins_may_call_the_api(tiny, tmp_path):
    server = ServerProcess(tmp_path / "home", tiny["target"], "--no-draft", "--api-key", "k",
                           "--cors-origin", "https://chat.example.com",
                           "--cors-origins", "localhost,https://other.example.org")  # (llama-server's spelling)
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    try:
        def preflight(origin: str) -> httpx.Response:
            return httpx.options(server.url + "/chat/completions", headers={
                "Origin": origin, "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization, content-type"})

        for origin in ("http://localhost:3000", "http://127.0.0.1:8081", "http://[::1]:5173", "https://chat.example.com",
                       "https://other.example.org"):
            answer = preflight(origin)
            assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == origin
            assert "authorization" in answer.headers["access-control-allow-headers"].lower()
        assert preflight("https://elsewhere.example.net").status_code == 400
        # the key is still asked of the request itself; the page can read the refusal as well as the answer
        page = {"Origin": "http://localhost:3000"}
        refused = httpx.post(server.url + "/chat/completions", json=chat, headers=page)
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == page["Origin"]
        answered = httpx.post(server.url + "/chat/completions", json=chat, headers={**page, "Authorization": "Bearer k"})
        assert answered.status_code == 200 and answered.headers["access-control-allow-origin"] == page["Origin"]
        elsewhere = httpx.post(server.url + "/chat/completions", json=chat,
                               headers={"Origin": "https://elsewhere.example.net", "Authorization": "Bearer k"})
        assert "access-control-allow-origin" not in elsewhere.headers  # its browser keeps the answer from the page
    finally:
        assert server.stop(signal.SIGTERM) == 0


def _start_long_stream(server: ServerProcess, prompt: str):
    """A streamed completion that runs until the context is full, read up to its first text."""
    client = httpx.Client(timeout=120)
    request = client.build_request("POST", server.url + "/completions", json={"prompt": prompt, "stream": True})
    response = client.send(request, stream=True)
    lines = response.iter_lines()
    first = next(line for line in lines if line.startswith("data:"))
    return client, response, lines, first


def _wait_until(condition, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_a_full_queue_answers_429_and_a_client_that_leaves_frees_the_model(tiny, tmp_path):
    server = ServerProcess(tmp_path / "home", tiny["target"], "--queue", "1", "--draft", "ngram", "-c", "4096", "-np", "1")
    try:
        # holds the model until the context fills (its line iterator, once collected, would close it)
        client, running, lines, _ = _start_long_stream(server, "abc")
        waiting_result = {}
        waiting = threading.Thread(target=lambda: waiting_result.update(
            response=httpx.post(server.url + "/completions", json={"prompt": "xyz", "max_tokens": 5}, timeout=120)))
        waiting.start()
        _wait_until(lambda: httpx.get(server.base + "/health").json()["waiting"] == 1)
        refused = httpx.post(server.url + "/completions", json={"prompt": "no room", "max_tokens": 5})
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "queue_full"
        with pytest.raises(openai.RateLimitError):
            server.client().completions.create(model="target.gguf", prompt="no room either", max_tokens=5)
        running.close()  # the client goes away: its generation stops at its next step
        client.close()
        waiting.join(timeout=60)
        assert waiting_result["response"].status_code == 200
        # more answers to one request than one client may hold: a 429 however long one waited, now a 400 saying why
        many = httpx.post(server.url + "/completions", json={"prompt": "xyz", "max_tokens": 2, "n": 3})
        assert many.status_code == 400 and "3 answers to one request are more than one client may" in many.text
        families = {f.name: f for f in text_string_to_metric_families(httpx.get(server.base + "/metrics").text)}
        outcomes = {s.labels["outcome"]: s.value for s in families["localspec:requests"].samples
                    if s.name.endswith("_total")}
        assert outcomes["cancelled"] == 1 and outcomes["ok"] == 1
        generated = next(s.value for s in families["localspec:generation_tokens"].samples)
        assert generated < 3000  # the abandoned generation did not run on to fill the 4096-token context
        assert "cancelled" in server.log() and "client went away" in server.log()
    finally:
        assert server.stop() == 0


def test_sigterm_cancels_the_running_generation_and_exits_0(tiny, tmp_path):
    server = ServerProcess(tmp_path / "home", tiny["target"], "-c", "4096")
    client, response, lines, _ = _start_long_stream(server, "abc")
    server.process.send_signal(signal.SIGTERM)
    rest = [line for line in lines if line.startswith("data:")]
    client.close()
    assert json.loads(rest[-1].removeprefix("data:"))["error"]["code"] == "cancelled"
    assert server.process.wait(timeout=30) == 0
    assert "shutting down" in server.log()


def test_many_clients_at_once_each_get_their_own_answer_or_429_and_memory_stays_flat(tiny, tmp_path):
    server = ServerProcess(tmp_path / "home", tiny["target"], "--draft", "ngram", "--temp", "0", "-c", "512",
                           "--queue", "3")
    prompts = [f"prompt number {i} " + "abcdefgh"[i] * (i + 1) for i in range(8)]
    try:
        expected = {p: httpx.post(server.url + "/completions", json={"prompt": p, "max_tokens": 24},
                                  timeout=60).json()["choices"][0]["text"] for p in prompts}
        assert len(set(expected.values())) > 1
        process = psutil.Process(server.process.pid)
        statuses: list[int] = []
        mixed_up: list[str] = []

        def client(index: int, rounds: int) -> None:
            with httpx.Client(timeout=120) as http:
                for n in range(rounds):
                    prompt = prompts[(index + n) % len(prompts)]
                    response = http.post(server.url + "/completions", json={"prompt": prompt, "max_tokens": 24})
                    statuses.append(response.status_code)
                    if response.status_code == 200 and response.json()["choices"][0]["text"] != expected[prompt]:
                        mixed_up.append(prompt)
                    elif response.status_code == 429:
                        assert int(response.headers["retry-after"]) >= 1

        def load(rounds: int) -> None:
            threads = [threading.Thread(target=client, args=(i, rounds)) for i in range(12)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=300)
            assert not any(thread.is_alive() for thread in threads)

        load(2)
        before = process.memory_info().rss
        load(6)
        after = process.memory_info().rss
        assert not mixed_up
        assert set(statuses) <= {200, 429} and statuses.count(200) >= 12
        assert after - before < 32 * 2**20, f"memory grew by {(after - before) / 2**20:.1f} MiB"
        assert httpx.get(server.base + "/health").json() == {"status": "ok", "running": False, "waiting": 0}
    finally:
        assert server.stop() == 0


def _closed_by_the_server(connection: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before closing the connection, or None if it is still open after seconds."""
    connection.settimeout(seconds)
    received = b""
    try:
        while chunk := connection.recv(4096):
            received += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        return None
    return received


def test_slow_and_idle_connections_are_closed_and_a_full_house_does_not_stop_health(tiny, tmp_path):
    def few_open_files():  # as on the machine where 150 slow clients left serve without a file to accept with
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    server = ServerProcess(tmp_path, tiny["target"], "-c", "256", "--timeout", "1", "--max-connections", "16",
                           preexec_fn=few_open_files)
    slow = []
    try:
        assert psutil.Process(server.process.pid).rlimit(psutil.RLIMIT_NOFILE)[0] > 128
        port = int(server.base.rsplit(":", 1)[1])
        for _ in range(40):  # headers that never end
            connection = socket.create_connection(("127.0.0.1", port), timeout=10)
            connection.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
            slow.append(connection)
        answered = None
        deadline = time.monotonic() + 10
        while answered is None and time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                answered = httpx.get(server.base + "/health", timeout=2).json()
        assert answered == {"status": "ok", "running": False, "waiting": 0}, server.log()
        assert all(_closed_by_the_server(connection, 10) is not None for connection in slow)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as trickle:  # a body that never ends
            trickle.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{")
            assert b" 408 " in (_closed_by_the_server(trickle, 10) or b"").split(b"\r\n")[0]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as idle:  # kept alive after its answer
            idle.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert (_closed_by_the_server(idle, 10) or b"").startswith(b"HTTP/1.1 200")
        assert "16 connections are open, the most allowed" in server.log()
    finally:
        for connection in slow:
            connection.close()
        assert server.stop() == 0, server.log()


def test_a_client_that_never_reads_its_answers_is_cut_off_after_the_timeout(tiny, tmp_path):
    # requests sent one after another on a connection whose answers are never read held it open for good:
    # uvicorn waits for the client to take the answer, and the timeout spared an answer under way (issue 46)
    server = ServerProcess(tmp_path, tiny["target"], "-c", "256", "--timeout", "1")
    one = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n"
    try:
        port = int(server.base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as reader_that_never_reads:
            reader_that_never_reads.setblocking(False)
            requests = one * 10_000  # their answers, ~45 MB, more than both sides' buffers hold
            with contextlib.suppress(BlockingIOError):
                while requests:
                    requests = requests[reader_that_never_reads.send(requests):]
            sent = 10_000 - len(requests) // len(one)
            time.sleep(4)  # the server's answers fill both buffers and wait: past its --timeout of 1 s
            assert httpx.get(server.base + "/health", timeout=10).status_code == 200
            reader_that_never_reads.setblocking(True)
            received = _closed_by_the_server(reader_that_never_reads, 60) or b""
        assert received.count(b"HTTP/1.1 200") < sent, "the server waited for the reader"
    finally:
        assert server.stop() == 0, server.log()


def test_a_port_in_use_is_one_line_before_any_model_loads(cli, tiny):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = cli("serve", tiny["target"], "--port", port)
    assert code == 2 and f"port {port} on 127.0.0.1 is in use" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args, message", [
    (["--port", "70000"], "port must be between 0 and 65535"),
    (["--queue", "-1"], "queue must be >= 0"),
    (["--api-key", "a, "], "an API key is empty"),
    (["--cors-origin", "chat.example.com"], "'chat.example.com' is not an origin"),
    (["--cors-origin", "https://chat.example.com/app"], "is not an origin"),
    (["--timeout", "0"], "timeout must be between 0 and 3600 seconds"),
    (["--max-connections", "0"], "max-connections must be >= 1"),
    (["--no-cont-batching"], "serve always decodes the --parallel requests together"),
    (["--context-shift"], "localspec never shifts the context"),
    # llama-server's options localspec takes in no spelling: what it does instead
    (["--samplers", "top_k;temperature"], "no such option: --samplers; its sampler chain runs in llama.cpp's"),
    (["--cache-reuse", "-1"], "--cache-reuse takes a run's length in tokens >= 0"),
    (["--models-dir", "."], "no such option: --models-dir; serve loads any downloaded model a request names"),
    (["-ctxcp", "4"], "no such option: -ctxcp; localspec keeps the whole sliding-window cache"),
])
def test_serve_option_mistakes(cli, tiny, args, message):
    code, _, err = cli("serve", tiny["target"], *args)
    assert code == 2 and message in err


@pytest.mark.slow
def test_real_qwen_pair_streams_a_chat_with_its_speculation_in_the_last_chunk(real_model, tmp_path):
    target, draft = real_model("qwen2.5-coder-1.5b"), real_model("qwen2.5-coder-0.5b")
    server = ServerProcess(tmp_path / "home", target, "--draft", draft, "--spec", "fixed", "--temp", "0",
                           "-c", "2048", "--alias", "qwen")
    code = "def add(a, b):\n    return a + b\n\n\ndef scale(values, factor):\n    return [v * factor for v in values]\n"
    try:
        chunks = list(server.client().chat.completions.create(
            model="qwen", messages=[{"role": "user", "content": "Add type hints and return the code:\n\n" + code}],
            max_tokens=48, stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert "def add(a" in text
        last = chunks[-1]
        assert last.usage.completion_tokens == last.timings["predicted_n"] == 48
        assert last.speculation["drafting"] == "draft"
        assert last.timings["draft_n"] >= last.timings["draft_n_accepted"] > 0
        assert last.speculation["acceptance_by_position"][0] > 0.3
    finally:
        assert server.stop() == 0


def test_a_prediction_leaves_the_answer_as_it_was_and_usage_counts_its_tokens(server, tiny):
    messages = [{"role": "user", "content": PROMPT}]
    expected = plain_text(tiny, messages, max_tokens=24)
    client = server.client()
    wrong = "Something else entirely, in other words, nothing like the answer at all."
    parts = [{"type": "text", "text": wrong[:20]}, {"type": "text", "text": wrong[20:]}]
    off = client.chat.completions.create(model="tiny", messages=messages, max_tokens=24,
                                         prediction={"type": "content", "content": parts})
    assert off.choices[0].message.content == expected
    details = off.usage.completion_tokens_details
    assert details.accepted_prediction_tokens == off.speculation["drafters"].get("prediction", {}).get("accepted_tokens", 0)
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens >= 10  # the prediction's tokens
    plain = client.chat.completions.create(model="tiny", messages=messages, max_tokens=24)
    assert plain.usage.completion_tokens_details.rejected_prediction_tokens == 0
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"prediction": {"type": "content", "content": "abc"}}))
    assert chunks[-1].usage.completion_tokens_details.rejected_prediction_tokens > 0
    with pytest.raises(openai.BadRequestError, match="prediction"):
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=4,
                                       prediction={"type": "nonsense", "content": "x"})


@pytest.mark.slow
def test_a_right_prediction_drafts_most_of_a_real_models_answer(real_model, tmp_path):
    running = ServerProcess(tmp_path, real_model("smollm2-135m"), "--temp", "0", "-c", "1024", "--alias", "m")
    try:
        client = running.client()
        messages = [{"role": "user", "content": "Write a Python function that adds two numbers, with a docstring."}]
        plain = client.chat.completions.create(model="m", messages=messages, max_tokens=80)
        expected = plain.choices[0].message.content
        predicted = client.chat.completions.create(model="m", messages=messages, max_tokens=80,
                                                   prediction={"type": "content", "content": expected})
        assert predicted.choices[0].message.content == expected
        details = predicted.usage.completion_tokens_details
        assert details.accepted_prediction_tokens >= 0.8 * predicted.usage.completion_tokens
        assert predicted.speculation["steps"] <= predicted.usage.completion_tokens // 4
    finally:
        assert running.stop() == 0, running.log()


def test_fifty_clients_dropping_streams_leak_no_sequence_and_memory_stays_flat(tiny, tmp_path):
    server = ServerProcess(tmp_path / "home", tiny["target"], "--draft", "ngram", "--temp", "0", "-c", "1024",
                           "-np", "4", "--queue", "64")
    expected = httpx.post(server.url + "/completions", json={"prompt": "after the storm", "max_tokens": 16},
                          timeout=60).json()["choices"][0]["text"]
    process = psutil.Process(server.process.pid)
    try:
        def dropping_client(index: int) -> None:
            with httpx.Client(timeout=120) as http:
                body = {"prompt": f"client {index} " + "xyz"[index % 3] * (index % 7), "stream": True,
                        "max_tokens": 800}
                with http.stream("POST", server.url + "/completions", json=body) as response:
                    for n, _ in enumerate(response.iter_lines()):
                        if n >= index % 4:  # some leave at once, some after a few chunks
                            break

        def wave(clients: range) -> None:
            threads = [threading.Thread(target=dropping_client, args=(i,)) for i in clients]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=120)
            assert not any(thread.is_alive() for thread in threads)

        wave(range(10))
        _wait_until(lambda: httpx.get(server.base + "/health").json() == {"status": "ok", "running": False,
                                                                          "waiting": 0})
        before = process.memory_info().rss
        wave(range(10, 60))
        _wait_until(lambda: httpx.get(server.base + "/health").json() == {"status": "ok", "running": False,
                                                                          "waiting": 0})
        after = process.memory_info().rss
        assert after - before < 32 * 2**20, f"memory grew by {(after - before) / 2**20:.1f} MiB"
        answer = httpx.post(server.url + "/completions", json={"prompt": "after the storm", "max_tokens": 16},
                            timeout=60)
        assert answer.status_code == 200 and answer.json()["choices"][0]["text"] == expected
        families = {f.name: f for f in text_string_to_metric_families(httpx.get(server.base + "/metrics").text)}
        outcomes = {s.labels["outcome"]: s.value for s in families["localspec:requests"].samples
                    if s.name.endswith("_total")}
        assert outcomes["cancelled"] + outcomes["ok"] == 62 and outcomes["error"] == 0
        assert outcomes["cancelled"] >= 30  # most of the 800-token answers were left, not finished
        sequences = {s.labels["sequence"] for s in families["localspec:sequence_generation_tokens"].samples}
        assert sequences == {"0", "1", "2", "3"}
    finally:
        assert server.stop() == 0


def test_a_client_that_never_reads_its_stream_does_not_hold_the_others(tiny, tmp_path):
    server = ServerProcess(tmp_path / "home", tiny["target"], "--no-draft", "--temp", "0", "-c", "4096", "-np", "2")
    port = int(server.base.rsplit(":", 1)[1])
    try:
        body = json.dumps({"prompt": "abc", "stream": True, "max_tokens": 4000}).encode()  # ~8 s of tokens
        stalled = socket.create_connection(("127.0.0.1", port), timeout=10)
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        _wait_until(lambda: httpx.get(server.base + "/health").json()["running"])
        started = time.monotonic()
        for _ in range(3):  # one after another, beside the stalled one
            answer = httpx.post(server.url + "/completions", json={"prompt": "xyz", "max_tokens": 8}, timeout=60)
            assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 8
            speculation = answer.json()["speculation"]  # beside the stalled one, on the other sequence
            assert speculation["sequence"] == 1 and speculation["steps_shared"] == speculation["steps"] > 0
            assert "other requests' rows" in speculation["equivalence"]
        assert time.monotonic() - started < 30
        stalled.close()
        _wait_until(lambda: httpx.get(server.base + "/health").json() == {"status": "ok", "running": False,
                                                                          "waiting": 0})
    finally:
        assert server.stop() == 0


INJECTED_FAULT = '''
import localspec.engine.together as together

original, calls = together.Together.step, []


def step(self):
    calls.append(1)
    if len(calls) > 3:  # a fault in the worker's own loop, after a few steps of the first request
        raise RuntimeError("an injected fault")
    return original(self)


together.Together.step = step
'''


def test_a_worker_that_stops_is_one_503_and_serve_exits_for_a_supervisor(tiny, tmp_path):
    """Issue 46's watchdog: the request in flight is answered 503 in one line (no connection reset),
    and serve shuts down and exits 4 with the cause, so that systemd or a container restarts it."""
    (tmp_path / "fault").mkdir()
    (tmp_path / "fault" / "sitecustomize.py").write_text(INJECTED_FAULT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "fault"), os.environ.get("PYTHONPATH", "")])}
    server = ServerProcess(tmp_path / "home", tiny["target"], "--alias", "tiny", env=env)
    try:
        with pytest.raises(openai.InternalServerError) as raised:
            server.client().chat.completions.create(model="tiny", max_tokens=16,
                                                    messages=[{"role": "user", "content": "hello"}])
        assert raised.value.status_code == 503
        assert raised.value.body["message"] == "the generation worker stopped: RuntimeError: an injected fault"
        assert server.process.wait(timeout=30) == 4
        said = server.log()
        assert "error: the generation worker stopped: RuntimeError: an injected fault; serve stopped" in said
        assert "Traceback" in said  # the operator's log keeps where it happened
    finally:
        server.stop()


def test_a_web_page_cannot_drive_a_server_on_this_machine(server):
    """Issue 46: DNS rebinding (a page's own name rebound to 127.0.0.1 is same-origin with the server) and
    the cross-site requests browsers send without a preflight (a form, text/plain) are refused in one 403;
    clients outside a browser, which send no Origin, and local pages are served as before."""
    body = {"prompt": "abc", "max_tokens": 2}
    port = server.base.rsplit(":", 1)[1]
    rebound = httpx.post(server.url + "/completions", json=body, headers={"Host": f"attacker.example:{port}"})
    assert rebound.status_code == 403 and "not a name of this machine" in rebound.json()["error"]["message"]
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        forged = httpx.post(server.url + "/completions", content=json.dumps(body),
                            headers={"Origin": "http://attacker.example", "Content-Type": content_type})
        assert forged.status_code == 403 and "may not call this server" in forged.json()["error"]["message"]
    for lookalike in ("http://localhost.attacker.example", "null"):
        assert httpx.post(server.url + "/completions", json=body, headers={"Origin": lookalike}).status_code == 403
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", f"app.localhost:{port}"):
        assert httpx.post(server.url + "/completions", json=body, headers={"Host": host}).status_code == 200, host
    local = httpx.post(server.url + "/completions", json=body, headers={"Origin": f"http://localhost:{port}"})
    assert local.status_code == 200 and httpx.post(server.url + "/completions", json=body).status_code == 200
    # serve's own page, reached by a LAN address: same-origin with serve, so served; a page of another is not
    lan = f"192.168.1.5:{port}"
    assert httpx.post(server.url + "/completions", json=body, headers={"Host": lan, "Origin": f"http://{lan}"}
                      ).status_code == 200
    assert httpx.post(server.url + "/completions", json=body, headers={"Host": lan, "Origin": f"http://192.168.1.6:{port}"}
                      ).status_code == 403
    assert httpx.post(server.url + "/completions", json=body, headers={  # rebound, its own origin: still refused
        "Host": f"attacker.example:{port}", "Origin": f"http://attacker.example:{port}"}).status_code == 403


def test_while_loading_a_client_that_sends_nothing_is_let_go_and_the_others_are_answered(monkeypatch):
    from localspec import net, server as server_face

    monkeypatch.setattr(server_face, "LOADING_READ_SECONDS", 0.5)
    with net.listen("127.0.0.1", 0) as listener, server_face.answering_while_loading(listener):
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=10) as idle:
            answered = httpx.get(f"http://127.0.0.1:{port}/api/tags")  # answered while the other idles
            assert answered.status_code == 503 and answered.json() == {"error": "Loading model"}
            started = time.monotonic()
            assert idle.recv(1) == b""  # closed by the door, not left open for good
            assert time.monotonic() - started < 5


def raw_socket(server, namespace: str = "llm", origin: str | None = None, **headers) -> websocket.WebSocket:
    """A socket as the SDKs open one (no Origin: the client is no web page), its opening sent."""
    opened = websocket.create_connection(f"ws://{server.base.removeprefix('http://')}/{namespace}", timeout=60,
                                         header=[f"{name}: {value}" for name, value in headers.items()],
                                         suppress_origin=origin is None, origin=origin)
    opened.send(json.dumps({"authVersion": 1, "clientIdentifier": "test", "clientPasskey": "test"}))
    return opened
