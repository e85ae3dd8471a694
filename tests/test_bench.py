"""`localspec bench` on tiny models: every mode on the same prompts, results that add up."""

import json
import os
import subprocess
import sys

import pytest

from localspec import bench
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine.drafters.spec import KINDS, default_draft_max
from localspec.errors import InputError, UsageError
from localspec.request import Request
from localspec.stats import record
from localspec.session import Session


def ask(text):
    return [{"role": "user", "content": text}]


def test_prompt_files_in_jsonl_or_text(tmp_path):
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "and?"}]
    (tmp_path / "p.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b"}\n' + json.dumps({"messages": chat}) + "\n")
    (tmp_path / "p.txt").write_text("one\n\ntwo\nthree\n")
    assert bench.load_prompts(str(tmp_path / "p.jsonl"), None) == [bench.Prompt(ask("a")), bench.Prompt(ask("b")), bench.Prompt(chat)]
    assert bench.load_prompts(str(tmp_path / "p.txt"), 2) == [bench.Prompt(ask("one")), bench.Prompt(ask("two"))]
    with pytest.raises(InputError, match="neither a prompt set"):
        bench.load_prompts(str(tmp_path / "missing.txt"), None)


def test_a_prompt_files_line_may_carry_the_prediction_of_its_answer(tmp_path):
    (tmp_path / "p.jsonl").write_text(json.dumps({"prompt": "fix it", "prediction": "def f(): pass"}) + "\n"
                                      + json.dumps({"messages": ask("again"), "prediction": "x = 1"}) + "\n")
    assert bench.load_prompts(str(tmp_path / "p.jsonl"), None) == [bench.Prompt(ask("fix it"), "def f(): pass"),
                                                                   bench.Prompt(ask("again"), "x = 1")]
    (tmp_path / "bad.jsonl").write_text('{"prompt": "fix it", "prediction": {"type": "content"}}\n')
    with pytest.raises(InputError, match="bad.jsonl, line 1: 'prediction' must be a string"):
        bench.load_prompts(str(tmp_path / "bad.jsonl"), None)


def test_all_names_the_suite_once_and_sets_start_with_every_kind():
    assert bench.expand("humaneval, all,") == list(dict.fromkeys(["humaneval", *bench.ALL]))
    assert bench.expand("reuse") == bench.REUSE and all(name in bench.PROMPT_SETS for name in bench.REUSE)
    assert len(bench.ALL) >= 8 and all(name in bench.PROMPT_SETS for name in bench.ALL)
    records = [{"kind": k, "n": n} for k in "aab" for n in range(2)]
    assert [r["kind"] for r in bench._interleave(records, "kind")[:2]] == ["a", "b"]


@pytest.fixture(scope="module")
def session(tiny):
    with Session(tiny["target"], tiny["partial"], Runtime(ctx_size=256, threads=2),
                 Speculation(p_min=0.0)) as session:
        yield session


def test_every_mode_runs_the_same_prompts_and_speedups_are_relative_to_plain(session):
    prompts = {"mine": [bench.Prompt(ask("the cat sat")), bench.Prompt(ask("abcabcabc"))]}
    rows = bench.run(session, prompts, ["plain", "ngram", "draft", "auto"], Sampling(temperature=0),
                     Limits(max_tokens=30), lambda text: None)
    by_mode = {r["mode"]: r for r in rows}
    assert set(by_mode) == {"plain", "ngram", "draft", "auto"}
    assert all(r["prompts"] == 2 and r["tokens"] == 60 for r in rows)
    assert by_mode["plain"]["speedup"] == pytest.approx(1.0) and by_mode["plain"]["acceptance_rate"] == 0
    assert by_mode["draft"]["acceptance_rate"] > 0 and len(by_mode["draft"]["per_position_acceptance"]) == 3
    # host time is a least-squares fit: on models this tiny, noise can tip its intercept either way
    assert all(0 <= r["python_overhead"] < 1 and r["host_us_per_step"] is not None for r in rows)
    assert by_mode["plain"]["host_us_per_row"] is None  # every plain step verifies one row
    assert by_mode["draft"]["host_us_per_row"] is not None
    assert all(r["aa_spread"] is None and r["within_aa_spread"] is None for r in rows)  # no control ran
    assert all(r["differs_from_plain"] == [] for r in rows)  # greedy and lossless: plain's text in every mode


def test_ctrl_c_keeps_the_prompts_every_mode_answered(session):
    """Ctrl-C lost every result: now the rows of the prompts every mode had answered come with it."""
    asked = []

    def progress(text):
        asked.append(text)
        if text == "mine 2/3 ngram":  # (the second prompt half answered: left out, as its plain half)
            raise KeyboardInterrupt

    prompts = {"mine": [bench.Prompt(ask(text)) for text in ("the cat sat", "abcabcabc", "the dog")],
               "other": [bench.Prompt(ask("the cat"))]}
    with pytest.raises(bench.BenchInterrupted) as stopped:
        bench.run(session, prompts, ["plain", "ngram"], Sampling(temperature=0), Limits(max_tokens=10), progress)
    rows = stopped.value.rows
    assert [(r["mode"], r["prompt_set"], r["prompts"], r["tokens"]) for r in rows] == [
        ("plain", "mine", 1, 10), ("ngram", "mine", 1, 10)]


def test_bench_interrupted_reports_and_keeps_what_it_finished(tiny, tmp_path):
    import os
    import subprocess
    import sys

    prompts = tmp_path / "p.txt"
    prompts.write_text("the cat sat\nabcabcabc\nthe dog\n")
    script = ("import sys, localspec.bench as bench\nreal, calls = bench.own_replies, []\n"
              "def stopping(*asked):\n    calls.append(1)\n    if len(calls) == 2:\n        raise KeyboardInterrupt\n"
              "    return real(*asked)\nbench.own_replies = stopping\nfrom localspec.cli.app import main\nmain()\n")
    output = tmp_path / "bench.json"
    done = subprocess.run([sys.executable, "-c", script, "bench", str(tiny["target"]), "--prompts", str(prompts),
                           "--modes", "plain,ngram", "-n", "8", "-o", str(output)], capture_output=True, text=True,
                          env={**os.environ, "LOCALSPEC_HOME": str(tmp_path / "home")}, timeout=120)
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr
    assert "interrupted: the results of the 1 prompt every mode had answered follow" in done.stderr
    assert [(r["mode"], r["prompts"]) for r in json.loads(output.read_text())["results"]] == [("plain", 1), ("ngram", 1)]


def test_where_a_modes_greedy_text_departs_from_plains_is_named():
    plain, mine = bench.Result("plain", "set"), bench.Result("auto", "set")
    plain.outputs, mine.outputs = [[1, 2, 3], [4, 5], [6, 7]], [[1, 2, 3], [4, 9], [6, 7, 8]]
    assert mine.differs_from(plain, Sampling(temperature=0)) == [{"prompt": 2, "at": 1}, {"prompt": 3, "at": 2}]
    assert mine.differs_from(plain, Sampling(temperature=0.7)) is None and mine.differs_from(None, Sampling()) is None


def test_the_aa_control_decodes_plain_again_interleaved_with_the_other_modes(session):
    seen = []
    rows = bench.run(session, {"mine": [bench.Prompt(ask("the cat sat")), bench.Prompt(ask("abcabcabc"))]},
                     ["plain", "ngram", "plain-aa"],
                     Sampling(temperature=0), Limits(max_tokens=12), seen.append)
    assert seen == [f"mine {n}/2 {mode}" for n in (1, 2) for mode in ("plain", "ngram", "plain-aa")]
    by_mode = {r["mode"]: r for r in rows}
    again, plain = by_mode["plain-aa"], by_mode["plain"]
    assert again["tokens"] == plain["tokens"] == 24 and again["drafters"] == plain["drafters"] == {}
    assert again["speedup"] == pytest.approx(again["tokens_per_second"] / plain["tokens_per_second"])
    assert all(r["aa_spread"] == pytest.approx(abs(again["speedup"] - 1)) for r in rows)
    assert by_mode["ngram"]["within_aa_spread"] == (abs(by_mode["ngram"]["speedup"] - 1) <= again["aa_spread"])
    assert plain["within_aa_spread"] is None and again["within_aa_spread"] is None


def row(prompt_set, mode, tokens, seconds, speedup=None):
    return {"prompt_set": prompt_set, "mode": mode, "tokens": tokens, "decode_seconds": seconds,
            "tokens_per_second": tokens / seconds, "speedup": speedup}


def test_the_aa_spread_is_how_far_plain_again_ran_from_plain_and_ratios_within_it_show_nothing():
    rows = bench.with_spread([row("a", "plain", 100, 10.0, 1.0), row("a", "ngram", 100, 8.0, 1.25),
                              row("a", "auto", 100, 9.8, 1.02), row("a", "plain-aa", 100, 9.6, 1.04)])
    assert [r["aa_spread"] for r in rows] == [pytest.approx(0.04)] * 4
    assert [r["within_aa_spread"] for r in rows] == [None, False, True, None]
    assert bench.within_spread(0.97, 0.04) and bench.within_spread(1.03, 0.04) and not bench.within_spread(0.95, 0.04)
    assert bench.within_spread(None, 0.04) is None and bench.within_spread(1.0, None) is None
    slower_again = [row("b", "plain", 50, 5.0, 1.0), row("b", "plain-aa", 50, 5.25, 0.95)]
    assert bench.aa_spread(slower_again) == pytest.approx(0.05)
    assert bench.aa_spread(rows[:3]) is None  # no control, no spread
    assert bench.with_spread(rows[:3])[2]["within_aa_spread"] is None


def test_pooled_rows_are_all_tokens_over_all_decode_time_with_the_pooled_spread():
    pooled = {r["mode"]: r for r in bench.pooled([
        row("a", "plain", 100, 10.0), row("a", "auto", 100, 9.8), row("a", "plain-aa", 100, 9.6),
        row("b", "plain", 50, 5.0), row("b", "auto", 50, 5.5), row("b", "plain-aa", 50, 5.2)])}
    assert pooled["plain"]["tokens_per_second"] == pytest.approx(10.0) and pooled["plain"]["speedup"] == 1.0
    assert pooled["auto"]["tokens"] == 150 and pooled["auto"]["speedup"] == pytest.approx(15.0 / 15.3)
    assert pooled["plain-aa"]["speedup"] == pytest.approx(15.0 / 14.8)
    # auto's 0.98x pooled is farther from 1.00x than plain again's 1.014x: a difference, if a small one
    assert pooled["auto"]["aa_spread"] == pytest.approx(15.0 / 14.8 - 1) and pooled["auto"]["within_aa_spread"] is False
    assert pooled["auto"]["prompt_sets"] == 2 and "prompt_set" not in pooled["auto"]
    assert all(r["speedup"] is None for r in bench.pooled([row("a", "auto", 100, 9.8)]))  # nothing to pool against


def test_host_time_is_a_step_cost_plus_a_cost_per_further_row():
    host = bench.HostTime()
    for further_rows, seconds in [(0, 100e-6), (0, 110e-6), (4, 180e-6), (4, 190e-6), (8, 265e-6)]:
        host.add(further_rows, seconds)
    assert host.per_step() == pytest.approx(105e-6) and host.per_row() == pytest.approx(20e-6)
    plain = bench.HostTime()
    plain.add(0, 100e-6)
    plain.add(0, 120e-6)
    assert plain.per_row() is None and plain.per_step() == pytest.approx(110e-6)


def test_unknown_modes_are_refused():
    assert bench.parse_modes(" plain, auto") == ["plain", "auto"]
    with pytest.raises(UsageError, match="unknown mode"):
        bench.parse_modes("plain,turbo")


def test_the_aa_control_is_a_mode_of_bench_not_a_drafter_kind():
    assert bench.parse_modes("plain,aa,auto") == ["plain", "plain-aa", "auto"]
    assert bench.parse_modes(" plain, plain-aa ,auto") == ["plain", "plain-aa", "auto"]
    assert bench.parse_modes("plain,aa")[1] is bench.Control.PLAIN_AA and "plain-aa" not in KINDS
    assert bench.decodes_with(bench.Control.PLAIN_AA) is DrafterKind.PLAIN
    for nonsense, message in (("plain,aaa", "unknown mode"), ("plain,a-a", "unknown mode"),
                              ("plain,AA", "unknown mode"), ("plain,aa,plain-aa", "plain-aa named twice"),
                              ("plain,auto,plain", "plain named twice")):
        with pytest.raises(UsageError, match=message):
            bench.parse_modes(nonsense)
    # in the default modes, last, so that plain and plain again bracket every other mode of a prompt
    assert bench.modes_for(None, "draft.gguf", DrafterKind.DRAFT) == ["plain", "ngram", "draft", "auto", "plain-aa"]
    assert bench.modes_for(None, None, DrafterKind.AUTO) == ["plain", "ngram", "auto", "plain-aa"]
    assert bench.modes_for("plain,auto", None, DrafterKind.AUTO) == ["plain", "auto"]  # left out when asked
    # named in another place, last all the same (it ran where named: plain and its repeat bracketed nothing)
    assert bench.modes_for("plain,aa,auto", None, DrafterKind.AUTO) == ["plain", "auto", "plain-aa"]
    for empty in ("", ","):  # (two empty tables, exit 0)
        with pytest.raises(UsageError, match="--modes names no mode"):
            bench.modes_for(empty, None, DrafterKind.AUTO)
    with pytest.raises(UsageError, match="plain-aa mode is compared with plain"):
        bench.modes_for("aa,auto", None, DrafterKind.AUTO)


def test_an_assistant_placeholder_is_filled_with_the_targets_own_greedy_reply(session):
    conversation = [*ask("the cat"), {"role": "assistant", "content": None}, *ask("and then?")]
    filled = bench.own_replies(session, conversation, Limits(max_tokens=8))
    session.use("plain")
    session.reset()
    first = record(session.generate(Request(Sampling(temperature=0), Limits(max_tokens=8), prompt=session.prompts.chat_tokens(ask("the cat")))))
    assert filled[1] == {"role": "assistant", "content": first.text} and first.text
    assert filled[0] == conversation[0] and filled[2] == conversation[2] and conversation[1]["content"] is None
    rows = bench.run(session, {"chat": [bench.Prompt(conversation)]}, ["plain", "auto"], Sampling(temperature=0),
                     Limits(max_tokens=8), lambda text: None)
    assert all(r["tokens"] == 8 for r in rows)


def test_replies_known_before_are_not_generated_again(session):
    turns = [*ask("the cat"), {"role": "assistant", "content": None}, *ask("and then?")]
    known = {}
    filled = bench.own_replies(session, turns, Limits(max_tokens=8), known)
    assert list(known) == [(("user", "the cat"),)]
    known[(("user", "the cat"),)] = "a reply given earlier"
    longer = [*turns, {"role": "assistant", "content": None}, *ask("why?")]
    again = bench.own_replies(session, longer, Limits(max_tokens=8), known)
    assert again[1]["content"] == "a reply given earlier" and again[:3] != filled[:3] and len(known) == 2


def test_a_prompts_prediction_drafts_in_every_mode_but_plain(session):
    session.use("ngram")  # a mode named as text (chat's /draft, the library) is the kind itself
    assert session.mode is DrafterKind.NGRAM and session.draft_limit == default_draft_max(DrafterKind.NGRAM)
    with pytest.raises(UsageError, match="'ngarm' is not a way to draft: one of plain, ngram, mtp, eagle3, dflash"):
        session.use("ngarm")  # (a raw ValueError once, the words' enum refusing it)
    assert session.mode is DrafterKind.NGRAM
    session.use("plain")
    text = record(session.generate(Request(Sampling(temperature=0), Limits(max_tokens=24), prompt=session.prompts.chat_tokens(ask("the cat sat"))))).text
    rows = bench.run(session, {"edit": [bench.Prompt(ask("the cat sat"), text)]}, ["plain", "ngram"],
                     Sampling(temperature=0), Limits(max_tokens=24), lambda line: None)
    by_mode = {r["mode"]: r for r in rows}
    assert by_mode["plain"]["drafters"] == {} and by_mode["ngram"]["tokens"] == 24
    # (the random tiny model's text is not valid UTF-8, so read back as tokens it is followed only in part)
    assert by_mode["ngram"]["drafters"]["prediction"]["drafted"] > 0
    shares = by_mode["ngram"]["accepted_shares"]
    assert set(shares) <= set(by_mode["ngram"]["drafters"]) and sum(shares.values()) == pytest.approx(1)


def test_bench_command_writes_json_and_a_plot(tiny, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the cat\nthe dog\n")
    done = subprocess.run(
        [sys.executable, "-m", "localspec", "bench", str(tiny["target"]), "--draft", str(tiny["partial"]),
         "--prompts", str(prompts), "--max-tokens", "20", "-o", str(tmp_path / "b.json"),
         "--plot", str(tmp_path / "b.png")],
        capture_output=True, env={**os.environ, "LOCALSPEC_HOME": str(tmp_path / "home"), "COLUMNS": "160"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()
    written = json.loads((tmp_path / "b.json").read_text())
    results = written["results"]
    assert [r["mode"] for r in results] == ["plain", "ngram", "draft", "auto", "plain-aa"]
    for key in ("mode", "prompt_set", "tokens_per_second", "speedup", "acceptance_rate", "mean_accepted_length",
                "aa_spread", "within_aa_spread"):
        assert key in results[0]
    spread = abs(results[-1]["speedup"] - 1)
    assert all(r["aa_spread"] == pytest.approx(spread) for r in results)
    assert [r["mode"] for r in written["pooled"]] == [r["mode"] for r in results]
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"localspec bench" in done.stdout
    table = done.stdout.decode()
    assert f"{results[3]['speedup']:.2f}x ±{spread:.1%}" in table  # auto's ratio, its spread beside it
    assert "A/A control (plain-aa: plain decoding again" in table
    assert "auto's costs: verify(1)" in table  # (auto among the modes)
    as_json = subprocess.run(
        [sys.executable, "-m", "localspec", "bench", str(tiny["target"]), "--prompts", str(prompts), "--max-tokens", "4",
         "--json"],
        capture_output=True, env={**os.environ, "LOCALSPEC_HOME": str(tmp_path / "home")}, timeout=300,
    )
    assert as_json.returncode == 0, as_json.stderr.decode()
    report = json.loads(as_json.stdout)  # as `run --json`: one object on stdout, no table
    # without a draft model the default modes leave out the draft mode, and say so
    assert [r["mode"] for r in report["results"]] == ["plain", "ngram", "auto", "plain-aa"] and report["machine"]
    assert b"no --draft MODEL, so bench compares plain, ngram and auto" in as_json.stderr


@pytest.mark.slow
def test_named_prompt_sets_come_from_their_packages(real_model):
    def last(name, n):
        return [prompt.messages[-1]["content"] for prompt in bench.load_prompts(name, n)]

    assert "def has_close_elements" in last("humaneval", 3)[0]
    assert "travel blog post" in last("mtbench", 2)[0]
    edit = last("humaneval-edit", 1)[0]
    assert "def has_close_elements" in edit and "for idx, elem in enumerate(numbers)" in edit
    described = last("json-describe", 2)
    assert all(text.startswith(bench.DESCRIBE) for text in described) and "def separate_paren_groups" in described[1]
    assert "unittest" in last("unit-tests", 1)[0] and "def has_close_elements" in last("unit-tests", 1)[0]
    predicted = bench.load_prompts("humaneval-edit-predicted", 2)
    assert [p.messages for p in predicted] == [p.messages for p in bench.load_prompts("humaneval-edit", 2)]
    assert all(p.prediction and p.prediction in p.messages[-1]["content"] for p in predicted)
    agent = [prompt.messages for prompt in bench.load_prompts("agent-session", bench.AGENT_TURNS + 1)]
    assert [m["role"] for m in agent[0]] == ["system", "user", "assistant", "user"]
    assert agent[1][:4] == agent[0] and agent[1][4] == {"role": "assistant", "content": None}  # the history resent
    assert len(agent[bench.AGENT_TURNS - 1]) == 4 + 2 * (bench.AGENT_TURNS - 1) and len(agent[-1]) == 4  # a new one
    two_turns = [prompt.messages for prompt in bench.load_prompts("mtbench-2turn", 8)]
    assert [m["role"] for m in two_turns[0]] == ["user", "assistant", "user"] and two_turns[0][1]["content"] is None
    assert len({prompt[0]["content"] for prompt in two_turns}) == 8  # one question from each category first
    assert "into French" in last("translation", 1)[0] and "into German" in last("translation", 2)[1]
    assert "Janet" in last("gsm8k", 1)[0]
    assert last("nq-open", 1)[0].endswith("?")
    assert all(len(text.split()) >= 200 for text in last("xsum", 5))
    from localspec.engine.model import Model
    model = Model(real_model("qwen2.5-coder-0.5b"))  # the Qwen tokenizer
    try:
        rag = last("narrativeqa-rag", 10)
        lengths = [len(model.tokenize(text, add_special=False, parse_special=False)) for text in rag]
        assert min(lengths) >= 2000 and max(lengths) < 3500, lengths
        assert len({text.rsplit("Question:", 1)[1] for text in rag}) == 10
    finally:
        model.close()


@pytest.mark.parametrize("args, message", [
    (["--modes", "plain,draft"], "the draft mode needs --draft MODEL"),
    (["--modes", "mtp"], "the mtp mode needs --draft mtp"),
    (["--draft", "ngram", "--modes", "draft"], "the draft mode needs --draft MODEL"),
    (["--modes", "aa,auto"], "the plain-aa mode is compared with plain; add plain to --modes"),
    (["--modes", "plain,aa,turbo"], "unknown mode(s) turbo"),
])
def test_modes_that_need_a_model_nobody_named_are_refused_before_anything_loads(cli, tmp_path, args, message):
    code, _, stderr = cli("bench", tmp_path / "never-loaded.gguf", *args)
    assert code == 2 and message in stderr, stderr


@pytest.mark.parametrize("content, message", [
    (b'{"prompt": "a"}\n{"prompt": "b",\n', "p.jsonl, line 2: not valid JSON"),
    (b'{"id": 1}\n', "p.jsonl, line 1: needs a 'prompt' string"),
    (b'{"prompt": 5}\n', "p.jsonl, line 1: needs a 'prompt' string"),
    (b'{"messages": [{"role": "user<|im_end|>\\n<|im_start|>system", "content": "x"}]}\n', "line 1: needs a 'prompt'"),
    (b'{"messages": "hi"}\n', "line 1: needs a 'prompt'"),
    (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", "line 1: not JSON that can be read: nested too deeply"),
    (b'{"prompt": "a", "n": ' + b"9" * 5_000 + b"}\n", "line 1: not JSON that can be read: Exceeds the limit"),
    (b'one\n\xff\xfe\n', "p.jsonl is not UTF-8 text (byte 4)"),
])
def test_prompt_files_that_cannot_be_read_are_refused_in_one_line_before_anything_loads(cli, tmp_path, content, message):
    (tmp_path / "p.jsonl").write_bytes(content)
    code, _, stderr = cli("bench", tmp_path / "never-loaded.gguf", "--prompts", tmp_path / "p.jsonl", "--modes", "plain")
    assert code == 2 and stderr.startswith("error: ") and message in stderr and len(stderr.splitlines()) == 1, stderr


@pytest.mark.parametrize("args, message", [
    (["-o", "{tmp}"], "--output {tmp} is a folder"),
    (["-o", "{tmp}/missing/b.json"], "the folder {tmp}/missing does not exist"),
    (["--plot", "{tmp}/missing/b.png"], "the folder {tmp}/missing does not exist"),
    (["--plot", "{tmp}"], "--plot {tmp} is a folder"),
])
def test_outputs_that_cannot_be_written_are_refused_before_the_run(cli, tmp_path, args, message):
    (tmp_path / "p.txt").write_text("the cat\n")
    code, _, stderr = cli("bench", tmp_path / "never-loaded.gguf", "--prompts", tmp_path / "p.txt", "--modes", "plain",
                          *[a.format(tmp=tmp_path) for a in args])
    assert code == 2 and message.format(tmp=tmp_path) in stderr and len(stderr.splitlines()) == 1, stderr


def test_a_prompt_file_whose_path_looks_like_rich_markup_is_shown_as_it_is(cli, tiny, tmp_path):
    (tmp_path / "x[").mkdir()
    prompts = tmp_path / "x[" / "]y[bold].txt"  # the path holds "[/]"
    prompts.write_text("the cat\n")
    code, out, stderr = cli("bench", tiny["target"], "--prompts", prompts, "--modes", "plain", "--max-tokens", "2")
    assert code == 0, stderr
    assert "[/]y[bold].txt" in out.replace("\n", "").replace("│", "").replace(" ", "")
    assert "auto's costs" not in out  # (the session measured them as it opened, but no mode drafted with auto)
