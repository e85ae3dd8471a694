"""The service behind `localspec serve`, without HTTP: arrival order, the queue's bound, cancelling,
errors, and the counters /metrics shows; and the API's request parsing as pure functions."""

import functools
import threading

import pytest

from localspec.protocols.openai import parse_chat, parse_completion
from localspec.protocols.shared import ApiError, Defaults, api_error
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Serving, Speculation
from localspec.errors import ContextOverflow, InputError
from localspec.engine import prompt_cache
from localspec.events import Prefill
from localspec.engine.together import Together
import localspec.service as service_module
from localspec.request import Request
from localspec.service import FINISHED, Busy, Embedding, Service, SlotAction, WorkerStopped
from localspec.session import Session


@pytest.fixture(scope="module")
def session(tiny):
    with Session(tiny["target"], None, Runtime(ctx_size=512), Speculation(drafting=DrafterKind.NGRAM)) as opened:
        yield opened


class Inbox:
    """What a job delivers, collected; `done` is set by FINISHED."""

    def __init__(self, name: str, order: list):
        self.name, self.order, self.items, self.done = name, order, [], threading.Event()

    def __call__(self, item) -> None:
        if isinstance(item, Prefill):
            self.order.append(self.name)
        self.items.append(item)
        if item is FINISHED:
            self.done.set()


def request(prompt="abc", max_tokens=8) -> Request:
    return Request(Sampling(temperature=0), Limits(max_tokens), prompt=prompt)


def test_requests_run_in_arrival_order_and_the_queue_is_bounded(session):
    service = Service(session, queue_limit=2, log=print)
    order: list[str] = []
    try:
        # the first holds the model (a long generation) while the others queue behind it
        inboxes = [Inbox(name, order) for name in "abc"]
        jobs = [service.submit(request(max_tokens=200 if name == "a" else 4), inbox)
                for name, inbox in zip("abc", inboxes)]
        with pytest.raises(Busy) as busy:
            service.submit(request(), Inbox("d", order))
        assert busy.value.retry_after >= 1
        for inbox in inboxes:
            assert inbox.done.wait(60)
        assert order == ["a", "b", "c"]
        assert [job.outcome for job in jobs] == ["ok", "ok", "ok"]
        assert service.metrics.requests["ok"] == 3 and service.metrics.rejected == 1
        assert service.metrics.served.tokens == sum(job.recorder.tokens for job in jobs)
    finally:
        service.close()


def test_one_client_cannot_take_every_place_and_the_rest_stay_for_others(session):
    # one client could fill the running place and the queue, and every other client got 429 (issue 46)
    service = Service(session, queue_limit=7, log=print)  # 8 places: one client may hold 6
    try:
        inboxes = [Inbox(str(n), []) for n in range(9)]
        jobs = [service.submit(request(max_tokens=200 if n == 0 else 2), inboxes[n], who="key 1") for n in range(6)]
        with pytest.raises(Busy, match="this client has 6 requests running or waiting"):
            service.submit(request(), Inbox("seventh", []), who="key 1")
        others = [service.submit(request(max_tokens=2), inboxes[n], who=f"key {n}") for n in (6, 7)]
        with pytest.raises(Busy, match="requests are already waiting"):  # every place taken
            service.submit(request(), Inbox("ninth", []), who="key 9")
        for inbox in inboxes[:8]:
            assert inbox.done.wait(60)
        assert [job.outcome for job in jobs + others] == ["ok"] * 8
        service.submit(request(max_tokens=2), inboxes[8], who="key 1")  # its places are its own again
        assert inboxes[8].done.wait(60) and service.metrics.rejected == 2
    finally:
        service.close()


def test_a_clients_cached_prompt_is_reused_for_it_alone(session):
    # the KV prefix cache was shared across API keys: cached_tokens told key 2 how much of key 1's prompt it
    # guessed (issue 46)
    service = Service(session, queue_limit=4, log=print)
    reused = functools.partial(reused_by, service, "the secret plan is to meet at the old mill at noon")
    try:
        reused("key 1")
        assert reused("key 1") > 0  # its own prompt, read again from the cache
        assert reused("key 2") == 0  # another key's guess of it learns nothing
        assert reused("key 2") > 0 and reused("key 1") == 0
    finally:
        service.close()


def reused_by(service: Service, prompt: str, client: str) -> int:
    """The prompt tokens a client's request of the prompt found cached."""
    inbox = Inbox(client, [])
    service.submit(Request(Sampling(temperature=0), Limits(2), prompt=prompt, client=client), inbox)
    assert inbox.done.wait(60)
    return next(item.reused_tokens for item in inbox.items if isinstance(item, Prefill))


def test_a_clients_prompts_on_disk_are_read_back_for_it_alone(tiny):
    # prompts kept on disk were read back for whichever key sent the same beginning: cached_tokens told key 2
    # that key 1 had sent it, in this serve or an earlier one
    prompt = " ".join(["the secret plan is to meet at the old mill at noon"] * 4)
    with Session(tiny["target"], None, Runtime(ctx_size=512), Speculation(drafting=DrafterKind.NGRAM)) as own:
        own.sequences[0].prompt_cache.least_seconds = 0  # (a tiny model reads it in no time)
        service = Service(own, queue_limit=4, log=print)
        reused = functools.partial(reused_by, service, prompt)
        try:
            assert reused("key 1") == 0
            prompt_cache.settled()  # (key 1's file written)
            assert reused("key 2") == 0  # its cache emptied, and key 1's file is not its to read
            assert reused("key 1") > 16  # its own, read back from its file
        finally:
            service.close()

def test_a_cancelled_job_stops_at_its_next_step_and_a_waiting_one_never_starts(session):
    service = Service(session, queue_limit=4, log=print)
    order: list[str] = []
    try:
        running, waiting = Inbox("running", order), Inbox("waiting", order)
        first = service.submit(request(max_tokens=400), running)
        second = service.submit(request(), waiting)
        second.cancel()
        while not any(isinstance(item, Prefill) for item in list(running.items)):
            assert not running.done.wait(0.01)
        first.cancel()
        assert running.done.wait(60) and waiting.done.wait(60)
        assert first.outcome == second.outcome == "cancelled"
        assert first.recorder.tokens < 400 and waiting.items == [FINISHED]
        assert order == ["running"]
        assert service.metrics.requests["cancelled"] == 2
    finally:
        service.close()


def test_errors_reach_the_job_and_the_service_goes_on(session):
    service = Service(session, queue_limit=4, log=print)
    try:
        bad, good = Inbox("bad", []), Inbox("good", [])
        service.submit(Request(Sampling(), Limits(4), prompt=[10**9]), bad)
        service.submit(request(max_tokens=3), good)
        assert bad.done.wait(60) and good.done.wait(60)
        assert isinstance(bad.items[0], InputError) and "token ids" in str(bad.items[0])
        assert service.metrics.requests == {"ok": 1, "cancelled": 0, "error": 1}
    finally:
        service.close()


def test_many_inputs_embed_a_slice_at_a_time_and_a_generation_goes_on_between(session, monkeypatch):
    monkeypatch.setattr(service_module, "EMBEDDING_SLICE", 0.0)  # one input a turn
    service = Service(session, queue_limit=4, log=print)
    try:
        embedding, generation = Inbox("embedding", []), Inbox("generation", [])
        many = service.submit(Embedding(["the cat sat"] * 300), embedding)
        service.submit(request(max_tokens=4), generation)
        assert generation.done.wait(60)
        assert not embedding.done.is_set() and len(many.embeddings) < 300  # it did not hold the model throughout
        assert embedding.done.wait(120) and many.outcome == "ok" and len(many.embeddings) == 300
        assert many.embeddings[0] == many.embeddings[-1] and many.embedded_tokens == 300 * len(many.embedding_inputs[0])
    finally:
        service.close()


def test_an_embedding_whose_client_left_stops_and_a_bad_input_fails_before_any_is_embedded(session, monkeypatch):
    monkeypatch.setattr(service_module, "EMBEDDING_SLICE", 0.0)
    service = Service(session, queue_limit=4, log=print)
    try:
        left, bad = Inbox("left", []), Inbox("bad", [])
        leaving = service.submit(Embedding(["the cat sat"] * 10_000), left)
        while not leaving.embeddings:
            assert not left.done.wait(0.01)
        leaving.cancel()
        assert left.done.wait(60) and leaving.outcome == "cancelled" and len(leaving.embeddings) < 10_000
        refused = service.submit(Embedding(["the cat"] * 5 + ["abc " * 400]), bad)
        assert bad.done.wait(60) and isinstance(bad.items[0], InputError) and "input 6 to embed" in str(bad.items[0])
        assert refused.embeddings == []
    finally:
        service.close()


def test_close_refuses_new_requests(session):
    service = Service(session, queue_limit=1, log=print)
    service.close()
    with pytest.raises(Exception, match="shutting down"):
        service.submit(request(), Inbox("late", []))


def test_a_worker_that_stops_answers_every_request_in_one_line_and_refuses_the_rest(session, monkeypatch):
    """A fault outside any one generation (here: Together.step itself) ends the worker: what runs and
    what waits is told so in one line, later requests are refused with it, and the service says why."""
    def broken(self):
        raise RuntimeError("a fault in the loop\nwith a second line")

    monkeypatch.setattr(Together, "step", broken)
    logged = []
    service = Service(session, queue_limit=4, log=logged.append)
    try:
        first, second = Inbox("first", []), Inbox("second", [])
        service.submit(request(), first)
        service.submit(request(), second)
        assert first.done.wait(60) and second.done.wait(60)
        for inbox in (first, second):
            [error] = [item for item in inbox.items if isinstance(item, WorkerStopped)]
            assert str(error) == "the generation worker stopped: RuntimeError: a fault in the loop"
        assert service.stopped == str(error) and "Traceback" in logged[0]  # the operator gets the traceback
        with pytest.raises(WorkerStopped, match="a fault in the loop"):
            service.submit(request(), Inbox("late", []))
        assert api_error(error).status == 503 and api_error(error).code == "worker_stopped"
        assert service.metrics.requests["error"] == 2 and service.pending == 0
    finally:
        service.close()


DEFAULTS = Defaults(Sampling(temperature=0.5, top_k=10), Limits(max_tokens=100, stop=("END",)))


def test_chat_requests_take_the_servers_defaults_for_what_they_leave_out():
    parsed = parse_chat({"messages": [{"role": "developer", "content": "be brief"},
                                      {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                   {"type": "text", "text": "b"}]},
                                      {"role": "assistant", "content": None}],
                         "temperature": 0, "max_completion_tokens": 7, "max_tokens": 9, "stop": "x",
                         "stream": True, "stream_options": {"include_usage": True}, "user": "ignored"}, DEFAULTS)
    assert parsed.request.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a\nb"},
                                       {"role": "assistant", "content": ""}]
    assert parsed.request.sampling == Sampling(temperature=0, top_k=10)
    assert parsed.request.limits == Limits(max_tokens=7, stop=("x",))
    assert parsed.stream and parsed.include_usage
    plain = parse_chat({"messages": [{"role": "user", "content": "hi"}]}, DEFAULTS)
    assert plain.request.sampling == DEFAULTS.sampling and plain.request.limits == DEFAULTS.limits
    assert not plain.stream and not plain.include_usage


def test_completion_prompts_are_text_token_ids_or_several_of_either():
    assert parse_completion({"prompt": "hi"}, DEFAULTS).request.prompt == "hi"
    assert parse_completion({"prompt": ["hi"]}, DEFAULTS).request.prompt == "hi"
    assert parse_completion({"prompt": [1, 2, 3]}, DEFAULTS).request.prompt == [1, 2, 3]
    assert parse_completion({"prompt": ["a", "b"]}, DEFAULTS).prompts == ("a", "b")
    assert parse_completion({"prompt": [[1, 2], [3]]}, DEFAULTS).prompts == ([1, 2], [3])
    with pytest.raises(ApiError, match="17 prompts, and n is 1: at most 16 answers"):
        parse_completion({"prompt": ["a"] * 17}, DEFAULTS)
    with pytest.raises(ApiError) as raised:
        parse_completion({"prompt": "hi", "best_of": 2}, DEFAULTS)
    assert raised.value.param == "best_of" and raised.value.code == "unsupported_parameter"
    # neutral values of fields localspec does not implement change nothing, so they pass
    assert parse_completion({"prompt": "hi", "best_of": 1, "logprobs": None, "presence_penalty": 0}, DEFAULTS)


def test_pulls_are_allowed_on_this_machine_only_unless_said_otherwise():
    # any client could make a server that others reach fetch and load any Hub GGUF (issue 46)
    assert Serving().model_changes and Serving(host="::1").model_changes
    assert not Serving(host="0.0.0.0").model_changes and not Serving(host="192.168.1.5", api_keys=("k",)).model_changes
    assert Serving(host="0.0.0.0", allow_pull=True).model_changes and not Serving(allow_pull=False).model_changes


def test_a_server_others_can_reach_without_a_key_is_warned_about():
    assert Serving().exposure_warning is None
    assert Serving(host="::1").exposure_warning is None
    assert "without --api-key" in Serving(host="0.0.0.0").exposure_warning
    assert Serving(host="0.0.0.0", api_keys=("k",)).exposure_warning is None


def test_a_prompt_no_context_could_hold_is_refused_before_any_tokenizing(session, monkeypatch):
    """run, chat and batch: 8 MB of spaces took up to a minute and 1.2 GB to be refused, 100,000
    one-space messages four minutes; more characters than the context's tokens can stand for, or more
    messages than it has tokens, are refused by arithmetic."""
    def no_tokenizing(*args, **kwargs):
        raise AssertionError("tokenized a prompt that arithmetic alone refuses")

    n_ctx, longest = session.target.n_ctx, session.target_model.longest_token
    monkeypatch.setattr(session.target_model, "tokenize", no_tokenizing)
    with pytest.raises(ContextOverflow, match=f"at most {n_ctx * longest:,} characters fit; raise --ctx-size"):
        session.prompts.tokenize(" " * (n_ctx * longest + 1), raw=True)
    with pytest.raises(ContextOverflow, match="characters fit"):
        session.prompts.tokenize(" " * 8_000_000, raw=False)
    with pytest.raises(ContextOverflow, match=f"{n_ctx + 1:,} messages cannot fit the context of {n_ctx} tokens"):
        session.prompts.chat_tokens([{"role": "user", "content": " "}] * (n_ctx + 1))
    session.prompts.refuse_what_cannot_fit(n_ctx * longest, n_ctx)  # what might fit is left to the tokenizer


def test_the_longest_token_bounds_what_each_token_stands_for(session):
    model = session.target_model
    pieces = [model.piece(token) for token in range(model.n_vocab)]  # control tokens' text counts too
    assert model.longest_token >= max(map(len, pieces)) > 0


def test_a_prediction_is_read_as_far_as_an_output_could_reach(session):
    text = "the cat sat on the mat. " * 400_000  # 9.6 MB: tokenizing all of it took seconds of the worker's time
    tokens = session.prompts.prediction_tokens(text)
    assert len(tokens) == session.target.n_ctx
    assert tokens == session.target_model.tokenize(text[:20_000], False, False)[: session.target.n_ctx]
    spaces = " " * 5_000_000  # few tokens for many characters: read as far as the longest tokens reach
    assert session.prompts.prediction_tokens(spaces) == session.target_model.tokenize(
        spaces[: session.target.n_ctx * session.target_model.longest_token], False, False)[: session.target.n_ctx]
    assert session.prompts.prediction_tokens("the cat") == session.target_model.tokenize("the cat", False, False)


def test_a_prediction_is_its_text_and_only_text_parts_are_taken():
    user = [{"role": "user", "content": "hi"}]
    parts = [{"type": "text", "text": "def f(x):\n"}, {"type": "text", "text": "    return x"}]
    parsed = parse_chat({"messages": user, "prediction": {"type": "content", "content": parts}}, DEFAULTS)
    assert parsed.request.prediction == "def f(x):\n    return x"
    assert parse_completion({"prompt": "a", "prediction": {"type": "content", "content": "b"}}, DEFAULTS).request.prediction == "b"
    assert parse_chat({"messages": user}, DEFAULTS).request.prediction is None
    image = [{"type": "image_url", "text": None}]
    with pytest.raises(ApiError, match="prediction.content: only text parts"):
        parse_chat({"messages": user, "prediction": {"type": "content", "content": image}}, DEFAULTS)


def test_a_slot_action_waits_for_the_generation_on_its_sequence(session, tmp_path):
    # llama-server defers a slot's save, restore or erase while the slot generates: acting mid-generation would
    # save half an answer's cache, or pull the cache from under it
    service = Service(session, queue_limit=4, log=print)
    order: list = []
    try:
        generating = Inbox("generation", order)
        service.submit(request(max_tokens=40), generating)
        saving = Inbox("save", order)
        job = service.submit(SlotAction(0, "save", tmp_path / "slot.bin"), saving)
        assert saving.done.wait(60) and generating.done.wait(60)
        assert job.outcome == "ok" and order == ["generation"]
        assert job.acted[0] == len(session.sequences[0].tokens)  # (the whole answer's cache, not a step's)
        erasing = Inbox("erase", order)
        erased = service.submit(SlotAction(0, "erase"), erasing)
        assert erasing.done.wait(60) and erased.acted == (job.acted[0], 0) and session.sequences[0].tokens == []
        restoring = Inbox("restore", order)
        restored = service.submit(SlotAction(0, "restore", tmp_path / "slot.bin"), restoring)
        assert restoring.done.wait(60) and restored.acted[0] == job.acted[0]
        assert len(session.sequences[0].tokens) == job.acted[0]
    finally:
        service.close()
