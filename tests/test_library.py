"""The front door, `import localspec`: docs/library.md's example as written, and what it promises."""

import re
from pathlib import Path

import pytest

import localspec
from localspec import Done, InputError, Prefill, Token, UsageError

DOCS = Path(__file__).resolve().parents[1] / "docs" / "library.md"


@pytest.fixture
def session(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    with localspec.load(str(tiny["target"]), str(tiny["partial"]), ctx_size=256) as opened:
        yield opened


def test_the_documented_example_runs_as_written(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    example = re.search(r"```python\n(.*?)```", DOCS.read_text(), re.S).group(1)
    # the same code on tiny models: only the names of the pair and a context they were written for differ
    example = (example.replace('"qwen2.5-coder-1.5b"', repr(str(tiny["target"])))
               .replace('"qwen2.5-coder-0.5b"', repr(str(tiny["partial"]))).replace("ctx_size=4096", "ctx_size=512"))
    exec(compile(example, str(DOCS), "exec"), {})
    printed = capsys.readouterr().out  # (a tiny model's replies are any characters, new lines too)
    assert re.search(r"^(stop|length) [\d.]+ tok/s [\d.]+ tokens per target pass$", printed, re.M)
    assert re.search(r"\((stop|length)\)$", printed, re.M)  # the stream's Done
    assert re.search(r"^5 messages; \d+ tokens in this chat$", printed, re.M)  # system, two questions, two answers


def test_the_documented_scheduler_runs_requests_side_by_side_as_each_alone(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    example = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)[1]
    example = example.replace('"qwen2.5-coder-1.5b"', repr(str(tiny["target"]))).replace("ctx_size=4096", "ctx_size=512")
    exec(compile(example, str(DOCS), "exec"), {})
    printed = capsys.readouterr().out
    questions = ["Name a prime number.", "Name a colour.", "Name a planet.", "Name a metal."]
    assert [line.split(" -> ")[0] for line in printed.splitlines() if " -> " in line] == questions
    with localspec.load(str(tiny["target"]), ctx_size=512) as alone, \
            localspec.load(str(tiny["target"]), ctx_size=512, parallel=2) as together:
        requests = [localspec.Request(localspec.Sampling(temperature=0), localspec.Limits(max_tokens=16),
                                      messages=[{"role": "user", "content": q}]) for q in questions]
        expected = [localspec.Recorder() for _ in requests]
        for request, recorder in zip(requests, expected):
            for event in alone.generate(request):
                recorder.add(event)
        scheduler, sequences, ended = together.scheduler(), set(), {}
        for request in requests[:2]:
            sequences.add(scheduler.add(request).sequence)
        assert scheduler.full and sequences == {0, 1}
        waiting = requests[2:]
        while scheduler or waiting:
            if waiting and not scheduler.full:
                scheduler.add(waiting.pop(0))
            for running, item in scheduler.step():
                if item is localspec.ENDED:
                    ended[requests.index(running.request)] = running.recorder.text
        assert [ended[i] for i in range(len(requests))] == [recorder.text for recorder in expected]


def test_a_prompt_is_text_messages_or_token_ids(session):
    text = session.prompts.prompt_tokens("the cat", raw=False)
    assert session.prompts.prompt_tokens([{"role": "user", "content": "the cat"}]) == text
    assert session.prompts.prompt_tokens(text) == text
    assert session.prompts.prompt_tokens("the cat", raw=True) != text  # no chat template around it
    with pytest.raises(InputError, match="between 0 and"):
        session.prompts.prompt_tokens([1, session.info.n_vocab])
    with pytest.raises(InputError, match="empty"):
        session.prompts.prompt_tokens([])


def test_options_override_the_defaults_and_are_checked_as_the_cli_checks_them(session):
    reply = session.complete("the cat", temperature=0, max_tokens=5, stop=["zzz"])
    assert reply.summary.tokens <= 5 and reply.finish_reason in ("stop", "length")
    greedy = [session.complete("the cat", temperature=0, max_tokens=8).text for _ in range(2)]
    assert greedy[0] == greedy[1]
    with pytest.raises(UsageError, match="top-p"):
        session.complete("the cat", top_p=1.5)
    with pytest.raises(UsageError, match="max-tokens"):
        session.complete("the cat", max_tokens=0)
    reported = session.complete("the cat", temperature=0, max_tokens=5, logprobs=2, repeat_penalty=1.3)
    assert len(reported.logprobs) == reported.summary.tokens and all(len(e.top) == 2 for e in reported.logprobs)
    assert session.complete("the cat", max_tokens=2).logprobs == ()
    with pytest.raises(UsageError, match="top logprobs"):
        session.complete("the cat", logprobs=21)


def test_a_misspelt_setting_is_named_with_the_one_meant_and_dir_lists_the_library(session):
    with pytest.raises(UsageError, match="unknown setting 'temprature': did you mean temperature?"):
        session.complete("the cat", temprature=0)  # was a raw TypeError from deep inside
    assert {"load", "Session", "Request", "Sampling", "__version__"} <= set(dir(localspec))


def test_a_setting_of_the_wrong_type_is_named_not_a_traceback(session):
    # a text where a number goes failed inside Sampling's checks with a raw TypeError
    for asked, said in ((dict(temperature="abc"), "temperature must be a number, got 'abc'"),
                        (dict(seed=1.5), "seed must be a whole number"), (dict(top_k=True), "top_k must be a whole"),
                        (dict(ignore_eos="yes"), "ignore_eos must be true or false"),
                        (dict(max_tokens="9"), "max_tokens must be a whole number")):
        with pytest.raises(UsageError, match=said):
            session.complete("the cat", **asked)
    assert session.complete("the cat", temperature=0, top_k=40.0, max_tokens=2.0).summary.tokens <= 2  # (JSON's 40.0)
    for prompt, asked, error, said in ((5, {}, InputError, "a prompt is a text, a list of messages"),
                                       (["the", "cat"], {}, InputError, "a list of those mixed or of others"),
                                       ("the \ud800 cat", {}, InputError, "a lone surrogate"),
                                       ("the cat", dict(stop=5), UsageError, "stop must be a text or a list of texts"),
                                       ("the cat", dict(stop=["a", 3]), UsageError, "stop must be a text or a list")):
        with pytest.raises(error, match=said):
            session.complete(prompt, **asked)
    with pytest.raises(UsageError, match="a message is a text, got NoneType"):
        session.chat().send(None)
    with pytest.raises(UsageError, match="a system prompt is a text, got int"):
        session.chat(system=5)


def test_load_names_what_is_wrong_with_a_setting_of_the_wrong_type(tiny):
    for asked, said in ((dict(target=None), "load\\(\\)'s target is a model's name or file, got None"),
                        (dict(draft=5), "load\\(\\)'s draft is a model's name or file, got 5"),
                        (dict(ctx_size="big"), "ctx_size must be a whole number, got 'big'"),
                        (dict(threads="x"), "threads must be a whole number")):
        with pytest.raises(UsageError, match=said):
            localspec.load(**{"target": str(tiny["target"])} | asked)


def test_load_names_a_setting_it_does_not_take(tiny):
    with pytest.raises(UsageError, match="no setting ctx_sise: did you mean ctx_size"):
        localspec.load(str(tiny["target"]), ctx_sise=256)


def test_load_takes_a_chat_template_in_place_of_the_models_own(tiny):
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
    with localspec.load(str(tiny["target"]), ctx_size=256, chat_template=template) as session:
        assert session.prompts.template == template
        assert session.complete("the cat", max_tokens=2).summary.prompt_tokens > 0
    with pytest.raises(InputError, match="chat_template: the chat template does not parse"):
        localspec.load(str(tiny["target"]), chat_template="{% for m in messages %}")


def test_info_says_what_is_loaded(session, tiny):
    info = session.info
    assert (info.target, info.draft, info.mtp) == (tiny["target"].name, tiny["partial"].name, False)
    assert info.n_ctx >= 256 and info.n_vocab > 0


def test_a_conversation_keeps_its_history_and_a_reply_cut_short(session):
    chat = session.chat(system="be brief")
    first = chat.send("the cat", temperature=0, max_tokens=6)
    assert [m["role"] for m in chat.messages] == ["system", "user", "assistant"]
    assert chat.messages[-1]["content"] == first.text
    events = chat.stream("the dog", temperature=0, max_tokens=12)
    taken = [next(events) for _ in range(3)]  # the prefill and the first tokens, then the caller stops
    events.close()
    assert isinstance(taken[0], Prefill)
    shown = "".join(event.text for event in taken if isinstance(event, Token))
    assert chat.messages[-1] == {"role": "assistant", "content": shown}
    assert len(chat.messages) == 5
    chat.clear()
    assert chat.messages == [{"role": "system", "content": "be brief"}]


def test_a_conversation_may_open_with_turns_of_its_own_which_clear_keeps(session):
    opening = [{"role": "user", "content": "Is Toronto in Canada?"}, {"role": "assistant", "content": "yes"}]
    chat = session.chat(system="be brief", opening=opening)  # (a made model's MESSAGEs)
    chat.send("the cat", temperature=0, max_tokens=3)
    assert chat.messages[:3] == [{"role": "system", "content": "be brief"}, *opening]
    assert [m["role"] for m in chat.messages[3:]] == ["user", "assistant"]
    chat.clear()
    assert chat.messages == [{"role": "system", "content": "be brief"}, *opening]


def test_opening_turns_of_another_shape_and_a_slot_file_by_a_text_are_said_or_taken(session, tmp_path):
    # opening=(("user", "Hi"),) was a ValueError from dict(); save(0, "file") an AttributeError from str
    with pytest.raises(UsageError, match="opening turns are messages"):
        session.chat(opening=(("user", "Hi"), ("assistant", "Hello.")))
    session.complete("the cat", max_tokens=2)
    tokens, size = session.save(0, str(tmp_path / "slot.bin"))
    assert tokens > 0 and size > 0 and session.restore(0, str(tmp_path / "slot.bin")) == (tokens, size)
    with pytest.raises(UsageError, match="no sequence 3: this session has 1"):
        session.save(3, tmp_path / "other.bin")


def test_a_turn_that_fails_before_an_answer_leaves_the_conversation_as_it_was(session):
    chat = session.chat()
    with pytest.raises(UsageError):
        chat.send("the cat", top_k=-1)
    assert chat.messages == []


def test_a_session_counts_the_mtp_blocks_decodes_as_its_own(tiny, tmp_path, monkeypatch):
    """bench's host time is wall time less what the models spent in llama_decode: the MTP block's
    decodes are the session's too (bench counted only the target's and a draft model's)."""
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    with localspec.load(str(tiny["mtp"]), "mtp", ctx_size=256) as mtp:
        events = list(mtp.stream("the cat", temperature=0, max_tokens=16))
        assert isinstance(events[-1], Done)
        assert mtp.busy_seconds > mtp.target.busy_seconds > 0


def test_a_turn_too_long_for_the_context_leaves_the_turns_it_would_have_dropped(session):
    """The oldest turns were dropped to fit a message that was then refused: the history was gone with it."""
    chat = session.chat("Be brief.")
    chat.send("the cat", max_tokens=4)
    chat.send("the dog", max_tokens=4)
    before = [dict(message) for message in chat.messages]
    with pytest.raises(localspec.ContextOverflow):
        chat.send("the cat sat " * 400)
    assert chat.messages == before and chat.dropped == 0


def test_one_generation_at_a_time_and_nothing_once_closed(tiny, tmp_path, monkeypatch):
    """Two streams interleaved on one session mixed their answers, a second thread crashed it or failed in llama.cpp,
    a generation between a scheduler's steps wrote over the rows it was to read, and a closed session's models,
    used, ended the process: each is a UsageError saying so, and the session goes on."""
    import threading

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    session = localspec.load(str(tiny["target"]), ctx_size=256)
    expected = session.complete("the cat", max_tokens=8, temperature=0).text
    first = session.stream("the dog", max_tokens=8, temperature=0)
    next(first)
    with pytest.raises(UsageError, match="generating another answer"):
        session.complete("the cat", max_tokens=8)
    refused = []
    thread = threading.Thread(target=lambda: refused.append(pytest.raises(UsageError, session.complete, "the cat")))
    thread.start()
    thread.join(timeout=60)
    assert "another thread" in str(refused[0].value)
    first.close()
    unstarted = session.stream("the dog")
    del unstarted  # (dropped before its first event: a generator's `finally` never runs)
    assert session.complete("the cat", max_tokens=8, temperature=0).text == expected
    session.close()
    for use in (lambda: session.complete("the cat"), lambda: session.chat().send("the cat"),
                lambda: session.score([1, 2, 3]), lambda: session.__enter__()):
        with pytest.raises(UsageError, match="this session is closed"):
            use()
    with localspec.load(str(tiny["target"]), ctx_size=512, parallel=2) as together:
        greedy = localspec.Request(localspec.Sampling(temperature=0), localspec.Limits(max_tokens=12), prompt="the")
        alone = localspec.Recorder()
        for event in together.generate(greedy):
            alone.add(event)
        scheduler = together.scheduler()
        running = scheduler.add(greedy)
        list(scheduler.step())
        with pytest.raises(UsageError, match="Scheduler is generating"):
            together.complete("the dog", max_tokens=4)
        scheduler.add(greedy)
        with pytest.raises(UsageError, match="every sequence of this session is generating"):
            scheduler.add(greedy)
        while scheduler:
            list(scheduler.step())
        assert running.recorder.text == alone.text


def test_a_requests_parts_are_checked_as_they_are_given(session):
    """Request("greedy"), messages as text, a role of one's own or tools as OpenAI's list reached the engine: a
    traceback, or a role the template wrote as it was; Sampling and Limits of the wrong types, likewise."""
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    assert localspec.Request(messages=[{"role": "user", "content": "hi"}], tools=[weather]).tools.names == ["get_weather"]
    for made, said in [(lambda: localspec.Request("greedy"), "sampling is a localspec.Sampling"),
                       (lambda: localspec.Request(messages="hi"), "messages: a list"),
                       (lambda: localspec.Request(messages=[{"role": "robot", "content": "x"}]), "messages: a list"),
                       (lambda: localspec.Request(tools="x"), "tools: a list"),
                       (lambda: localspec.Request(prompt="a", messages=[]), "messages or a prompt, not both"),
                       (lambda: localspec.Sampling(temperature="hot"), "temperature must be a number"),
                       (lambda: localspec.Limits(max_tokens="5"), "max_tokens must be a whole number"),
                       (lambda: localspec.Limits(stop=[1]), "stop must be a text or a list of texts")]:
        with pytest.raises(UsageError, match=said):
            made()
    # (one stop string, as the keyword takes one: its characters were each a stop string)
    assert localspec.Limits(stop=", 5").stop == (", 5",) and localspec.Limits(max_tokens=8.0).max_tokens == 8
    assert all(hasattr(localspec, name) for name in ("ContextOverflow", "EngineError", "ModelLoadError", "Tools"))
    with pytest.raises(UsageError, match="token ids are a list of whole numbers"):  # (was "must be between 0 and")
        session.score("hello world")


def test_ctrl_c_held_notes_the_press_and_gives_the_handler_back():
    import signal

    from localspec.engine.library import ctrl_c_held

    with ctrl_c_held() as pressed:
        signal.raise_signal(signal.SIGINT)  # (raised in the callback llama.cpp made next: dropped by ctypes)
        with ctrl_c_held() as inner:
            assert inner is pressed
    assert pressed == [True] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_while_the_models_load_stops_the_load(tiny):
    """Ctrl-C during load() was dropped by ctypes in llama.cpp's next callback: the models loaded and ran on (a
    batch then ran every item and exited 0). Here it is pressed from llama.cpp's first line of a model's load."""
    import signal
    import subprocess
    import sys

    script = ("import os, signal, localspec\nfrom localspec.engine import library\n"
              "def said(level, text, data):\n    if b'load' in text:\n        os.kill(os.getpid(), signal.SIGINT)\n"
              "press = library.llama.llama_log_callback(said)\nlibrary.llama.llama_log_set(press, None)\n"
              f"try:\n    localspec.load({str(tiny['target'])!r}, {str(tiny['partial'])!r})\n    print('loaded')\n"
              "except KeyboardInterrupt:\n    print('interrupted')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.stdout.strip() == "interrupted" and "Exception ignored" not in done.stderr, (done.stdout, done.stderr)
