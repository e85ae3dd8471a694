"""What people see: rendered with a recording Rich console."""

import time

import pytest
from rich.console import Console

from localspec import tui
from localspec.events import Done, Prefill, Reading, Step, Token
from localspec.stats import Recorder


def events():
    steps = [
        Prefill(10, 0, 0.1),
        Step("draft", 3, 2, 0.03, 0.05), Token(1, "Hello", True), Token(2, " wor", True), Token(3, "ld", False),
        Step("draft", 0, 0, 0.0, 0.02), Token(4, "!", False),
    ]
    return [*steps, Done("length", "", 0.1)]


def record(color=True):
    console = Console(record=True, width=90, height=30, force_terminal=True, color_system="truecolor")
    with tui.LiveView(console, color=color) as view:
        for event in events():
            view.add(event)
    return console


def test_final_view_has_the_text_and_the_statistics():
    recorded = record().export_text()
    final = recorded[recorded.rindex("Hello world!"):]  # after the live frames
    assert "speculation · length" in final
    assert "67% of 3" in final  # 2 of 3 drafted tokens accepted
    assert "draft #1" in final and "draft #3" in final
    # the plain step's target pass took 0.02 s: 4 tokens would take 0.08 s plain; 0.10 s were spent
    assert "0.80x (est.)" in final


def test_tokens_from_accepted_drafts_are_highlighted_unless_turned_off():
    assert '<span style="color: #008000' in record(color=True).export_html(inline_styles=True)
    assert '<span style="color: #008000' not in record(color=False).export_html(inline_styles=True)


def test_models_table_and_compat_report_render():
    console = Console(record=True, width=120)
    tui.models_table([dict(name="m", aliases=[], family="f", params="1B", size=808_000_000, installed=True, draft="d",
                           license="x")], console)
    text = console.export_text()
    assert "808.0 MB" in text and "yes" in text
    layers = {"attention": (False, True, 0), "recurrent state, 1 MTP": (True, True, 1),
              "recurrent state (decodes plainly)": (True, False, 0)}
    for shown_as, (recurrent, rolls_back, mtp_layers) in layers.items():
        row = dict(recurrent=recurrent, rolls_back=rolls_back, mtp_layers=mtp_layers)
        assert tui.layers_text(row) == shown_as
    assert tui.layers_text(dict(recurrent=None)) == ""  # not downloaded: not known


def test_control_characters_of_untrusted_text_are_shown_as_escapes():
    clipboard_write, link = "\x1b]52;c;aGk=\x07", "\x1b]8;;http://x\x1b\\here\x1b]8;;\x1b\\"
    assert tui.visible(f"a{clipboard_write}b\n\tc\x9b") == "a\\x1b]52;c;aGk=\\x07b\n\tc\\x9b"  # layout kept
    assert tui.visible("one\ntwo", layout=False) == "one\\x0atwo"
    assert "\x1b" not in tui.visible(link)


def test_a_batchs_tokens_a_second_are_over_its_whole_run_not_its_items_overlapping_decode_times():
    # three items on parallel sequences, each 2 s of decoding in a run of 3 s, read 300 / 6 s = 50.0
    console = Console(record=True, width=200)
    done = {"stats": {"tokens": 100, "decode_seconds": 2.0, "drafted": 10, "accepted": 5}}
    tui.batch_summary([dict(done, id=str(i)) for i in range(3)], 0, 3.0, console)
    assert "100.0" in console.export_text() and "50.0" not in console.export_text()


def test_untrusted_text_is_never_read_as_rich_markup():
    console = Console(record=True, width=260)  # every column holds the text whole
    hostile = "[/] [link=http://evil]click[/link] [bold red]"
    tui.models_table([dict(name=hostile, aliases=[hostile], family=hostile, params="1B", size=None, installed=False,
                           draft=hostile, license=hostile)], console)
    tui.batch_summary([{"id": hostile, "error": hostile}], 0, 1.0, console)
    text = console.export_text()
    assert text.count("[link=http://evil]click[/link]") >= 5


def test_generated_escape_sequences_reach_the_live_view_as_text():
    console = Console(record=True, width=90, height=30, force_terminal=True)
    with tui.LiveView(console, summary=False) as view:
        view.add(Prefill(1, 0, 0.0))
        view.add(Token(1, "copy \x1b]52;c;aGk=\x07 me", False))
    assert "\x1b]52" not in console.export_text(styles=True, clear=False) and "\\x1b]52" in console.export_text()


def test_a_long_prompts_reading_shows_how_far_it_has_got():
    assert tui.reading_line(Reading(4096, 16384, 1024, 10.0)) == \
        "reading the prompt: 4,096 of 16,384 tokens (25%, 1,024 cached), 307 tokens/s"
    assert tui.reading_line(Reading(512, 600, 0, 0.0)) == "reading the prompt: 512 of 600 tokens (85%), 0 tokens/s"
    console = Console(record=True, width=90, height=30, force_terminal=True)
    with tui.LiveView(console, summary=False) as view:
        view.add(Reading(512, 600, 0, 1.0))
        assert "reading the prompt: 512 of 600" in console.export_text(clear=False)
        view.add(Prefill(600, 0, 1.2))
        view.add(Token(1, "done", False))


def test_a_generation_without_drafts_says_why():
    summary = Recorder().summary()
    assert tui.drafted_text(summary) == "nothing drafted"
    assert "auto expected no draft to beat a plain step" in tui.drafted_text(summary, auto=True)
    console = Console(record=True, width=120)
    console.print(tui.stats_panel(summary, "done", models="t.gguf (auto: n-gram lookup)", auto=True))
    text = console.export_text()
    assert "t.gguf (auto: n-gram lookup)" in text and "nothing drafted" in text


def test_models_show_aliases_and_unknown_sizes_as_unknown():
    console = Console(record=True, width=160)
    tui.models_table([dict(name="llama3.3-70b", aliases=["llama3-70b"], family="llama3", params="70B", size=None,
                           installed=False, draft="llama3.2-1b", license="x")], console)
    text = console.export_text()
    assert "llama3-70b" in text and "unknown" in text and "license" in text


def test_a_chat_reply_without_drafts_says_nothing_drafted():
    recorder = Recorder()
    for event in [Prefill(3, 0, 0.01), Step("plain", 0, 0, 0.0, 0.02), Token(1, "hi", False), Done("stop", "", 0.02)]:
        recorder.add(event)
    line = tui.reply_line(recorder)
    assert "nothing drafted" in line and "0%" not in line and "of 0" not in line
    recorder = Recorder()
    for event in events():
        recorder.add(event)
    assert "67% of 3 drafted accepted" in tui.reply_line(recorder)


def test_batch_progress_joins_only_what_there_is():
    progress = tui.BatchProgress(3)
    progress({"id": "a", "error": "x"})
    assert progress.status() == "1 failed"  # was ", 1 failed" after the time column: "0:00:01 , 1 failed"
    progress({"id": "b", "stats": {"drafted": 4, "accepted": 3}})
    assert progress.status() == "75% accepted, 1 failed" and progress.finished == 2


def test_the_registrys_models_at_80_columns_keep_whether_each_is_here_and_what_drafts_for_it(monkeypatch, tmp_path):
    from localspec.store import catalog

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    console = Console(record=True, width=80)
    tui.models_table(catalog.model_rows(), console)
    header = next(line for line in console.export_text().splitlines() if "name" in line)
    assert "installed" in header and "draft" in header, header  # (the draft column was the first to go)


def test_models_table_keeps_every_name_whole_at_80_columns():
    console = Console(record=True, width=80)
    rows = [dict(name=f"a-rather-long-model-name-{i}", aliases=["alias-one", "alias-two"], family="family", params="70B",
                 size=42_500_000_000, installed=False, draft="tiny-draft", license="some licence (gated)",
                 recurrent=None) for i in range(3)]
    tui.models_table(rows, console)
    text = console.export_text()
    assert "…" not in text and all(f"a-rather-long-model-name-{i}" in text for i in range(3))
    assert "tiny-draft" in text and "not shown at this width: layers, aliases, family, license" in text
    assert max(map(len, text.splitlines())) <= 80


def test_bench_tables_fit_100_columns():
    row = {"prompt_set": "humaneval-edit", "mode": "auto", "prompts": 10, "tokens": 1280, "tokens_per_second": 14.52,
           "speedup": 1.37, "acceptance_rate": 0.91, "mean_accepted_length": 3.43,
           "acceptance_by_positions": {"1": 0.95, "2-4": 0.9, "5-8": 0.8, "9-16": 0.7},
           "drafters": {"ngram": {"steps": 120, "probes": 3, "probes_lost": 1}, "draft": {"steps": 30, "probes": 2,
                                                                                          "probes_lost": 1}},
           "accepted_shares": {"ngram": 0.8, "draft": 0.2},
           "probe_loss": 0.012, "python_overhead": 0.08, "host_us_per_step": 410.0, "host_us_per_row": 23.0,
           "aa_spread": 0.034, "within_aa_spread": False}
    console = Console(record=True, width=100)
    tui.bench_table([row, {**row, "mode": "plain", "speedup": 1.0, "within_aa_spread": None},
                     {**row, "mode": "plain-aa", "speedup": 1.034, "within_aa_spread": None}], None, console)
    text = console.export_text()
    assert "…" not in text and max(map(len, text.splitlines())) <= 100
    for cell in ("1.37x ±3.4%", "3.43", "2-4:90%", "ngram 120:80%", "draft 30:20%", "2/5 1.2%", "410+23"):
        assert cell in text, text
    assert text.count("±") == 2  # beside auto's ratio and in the heading; plain and the control are the spread
    assert "thinking and answer apart" not in text
    thinking = {"tokens": 200, "tokens_per_second": 16.6, "tokens_per_step": 1.17}
    tui.bench_table([{**row, "parts": {"thinking": thinking, "answer": {**thinking, "tokens": 80}}}], None, console)
    text = console.export_text()
    assert "thinking and answer apart" in text and "200, 16.6, 1.17" in text and "80, 16.6, 1.17" in text
    assert max(map(len, text.splitlines())) <= 100


def test_bench_notes_say_where_greedy_text_departs_from_plains():
    rows = [{"prompt_set": "gsm8k", "mode": "plain", "differs_from_plain": []},
            {"prompt_set": "gsm8k", "mode": "auto", "differs_from_plain": [{"prompt": 3, "at": 79}]},
            {"prompt_set": "gsm8k", "mode": "plain-aa", "differs_from_plain": []}]
    assert tui.text_notes(rows) == ["greedy text not plain decoding's (a near-tie in the target's logits that a"
                                    " batched pass breaks differently, or a bug): auto on gsm8k, prompt 3 from token 79"]
    rows[1]["differs_from_plain"] = []
    assert tui.text_notes(rows) == ["greedy text: every mode's, prompt by prompt, is plain decoding's"]
    assert tui.text_notes([{**row, "differs_from_plain": None} for row in rows]) == []  # sampled, or no plain


def bench_row(prompt_set, mode, speedup, spread, within):
    return {"prompt_set": prompt_set, "mode": mode, "speedup": speedup, "aa_spread": spread, "within_aa_spread": within}


def test_bench_notes_say_which_ratios_are_within_the_aa_spread():
    rows = [bench_row("gsm8k", "plain", 1.0, 0.03, None), bench_row("gsm8k", "auto", 0.98, 0.03, True),
            bench_row("gsm8k", "plain-aa", 0.97, 0.03, None),
            bench_row("edit", "plain", 1.0, 0.01, None), bench_row("edit", "auto", 1.6, 0.01, False),
            bench_row("edit", "plain-aa", 1.01, 0.01, None)]
    pooled = [{"mode": "plain", "speedup": 1.0, "aa_spread": 0.02, "within_aa_spread": None},
              {"mode": "auto", "speedup": 1.25, "aa_spread": 0.02, "within_aa_spread": False},
              {"mode": "plain-aa", "speedup": 0.98, "aa_spread": 0.02, "within_aa_spread": None}]
    control, pooled_line, within = tui.aa_notes(rows, pooled)
    assert "interleaved) against plain: 0.97x on gsm8k, 1.01x on edit, 0.98x pooled." in control
    assert pooled_line == "pooled over 2 prompt sets: auto 1.25x ±2.0%"
    assert within == "within the A/A spread of 1.00x, so no difference from plain shown: auto 0.98x ±3.0% on gsm8k"
    one_set = [r for r in rows if r["prompt_set"] == "edit"]
    assert len(tui.aa_notes(one_set, pooled)) == 1  # one set: no pooled line, and no ratio within the spread
    without = [r | {"aa_spread": None, "within_aa_spread": None} for r in rows if r["mode"] != "plain-aa"]
    assert tui.aa_notes(without, [])[0].startswith("no A/A control (plain-aa in --modes) in this run")


def test_the_aa_mode_tui_names_is_benchs():
    from localspec import bench

    assert tui.AA_MODE == bench.Control.PLAIN_AA


def test_ps_says_how_long_a_process_has_held_its_models():
    assert [tui.duration_text(s) for s in (3.2, 125, 7500, 90000, 200000)] == [
        "3 s", "2 min", "2 h 05 min", "1 day 1 h", "2 days 7 h"]
    console = Console(record=True, width=100)
    tui.ps_table([{"pid": 42, "command": "serve", "uptime": 7500, "model": "m.gguf (n-gram lookup)", "on_gpu": 0.0,
                   "address": "http://127.0.0.1:8080/v1"}], console)
    assert "42   serve    2 h 05 min  m.gguf (n-gram lookup)  100% CPU   http://127.0.0.1:8080/v1" in console.export_text()


def test_ps_lists_the_models_a_serve_loaded_on_demand_and_when_each_goes():
    from datetime import datetime, timezone

    soon = datetime.fromtimestamp(time.time() + 150, timezone.utc).isoformat().replace("+00:00", "Z")
    console = Console(record=True, width=120)
    tui.ps_table([{"pid": 42, "command": "serve", "uptime": 60, "model": "m.gguf (auto)", "address": "http://h:1/v1",
                   "loaded": [{"name": "m", "expires_at": "9999-12-31T23:59:59Z"},
                              {"name": "gemma3-270m", "expires_at": soon, "on_gpu": 0.52},
                              {"name": "kept", "expires_at": "9999-12-31T23:59:59Z"},
                              {"name": "old", "expires_at": "2020-01-01T00:00:00Z"}]}], console)
    text = console.export_text()
    assert "+ m " not in text and "+ gemma3-270m (on demand; unloads in 2 min)  48%/52% CPU/GPU" in text
    assert "+ kept (on demand; stays while serve runs)" in text and "+ old (on demand; unloads once idle)" in text


def test_streamed_text_is_escaped_on_a_terminal_only(monkeypatch):
    """run's plain path (a terminal with --quiet, or a pipe): escapes would be commands on a terminal."""
    import io
    import sys

    for tty, expected in ((True, "\\x1b]8;;u\\x1b\\a\\x9bb\n"), (False, "\x1b]8;;u\x1b\\a\x9bb\n")):
        class Out(io.StringIO):
            def isatty(self):
                return tty

        out = Out()
        monkeypatch.setattr(sys, "stdout", out)
        tui.stream([Token(1, "\x1b]8;;u\x1b\\a", False), Token(2, "\x9bb", False), Done("length", "", 0.1)], show=True)
        assert out.getvalue() == expected


def test_models_table_names_drafters_published_beside_a_model_and_marks_unverified_facts():
    console = Console(record=True, width=200)
    tui.models_table([dict(name="qwen3.6-27b", aliases=[], family="qwen3.6", params="27B", size=19_095_766_304,
                           installed=False, draft="qwen3.5-0.8b", drafters={"mtp": "q-mtp", "dflash": "q-dflash"},
                           unverified=False, unverified_drafters=["q-dflash"], license="apache-2.0"),
                      dict(name="one-source", aliases=[], family="f", params="1B", size=1_000_000_000, installed=False,
                           draft=None, drafters={}, unverified=True, unverified_drafters=[], license="x")], console)
    text = console.export_text()
    assert "qwen3.5-0.8b + mtp, dflash ?" in text and "1.0 GB ?" in text and "19.1 GB ?" not in text
    assert "? unverified: one public source" in text


def test_thinking_is_dimmed_apart_from_the_answer_with_counts_of_its_own():
    console = Console(record=True, width=90, height=30, force_terminal=True, color_system="truecolor")
    with tui.LiveView(console) as view:
        for event in [Prefill(3, 0, 0.1), Step("ngram", 2, 2, 0.01, 0.05), Token(7, "", False, "", thinking=True),
                      Token(8, "", True, "so it is 4", thinking=True), Token(9, "", True, "", thinking=True),
                      Step("ngram", 0, 0, 0.0, 0.02), Token(10, "Four.", False), Done("stop", "", 0.1)]:
            view.add(event)
    text = console.export_text(clear=False)
    final = text[text.rindex("so it is 4"):]
    assert final.startswith("so it is 4\n\nFour.")  # a blank line between them
    assert "thinking  3 tokens, 50.0 tok/s" in final and "answer    1 tokens" in final
    html = console.export_html(inline_styles=True)
    assert "font-style: italic" in html and "so it is 4" in html
    parts = Recorder()
    for event in [Step("ngram", 2, 2, 0.01, 0.05), Token(8, "", True, "x", thinking=True), Token(9, "", True, "", True),
                  Token(10, "y", False), Done("stop", "", 0.1)]:
        parts.add(event)
    s = parts.summary()
    assert (s.parts["thinking"].tokens, s.parts["thinking"].steps, s.parts["answer"].tokens) == (2, 1, 1)
    assert "thinking 2 tokens" in tui.summary_line(parts, auto=False)


def test_tokens_the_text_does_not_show_are_said_beside_a_count_that_tokens_a_step_reads():
    # "20 tokens ... 21 target passes ... 1.00 tokens/pass": the end token counted in one and not the other
    recorder = Recorder()
    for event in [Prefill(3, 0, 0.1), Step("plain", 0, 0, 0.0, 0.05), Token(1, "a", False), Step("plain", 0, 0, 0.0, 0.05),
                  Token(2, "b", False), Step("plain", 0, 0, 0.0, 0.05), Done("stop", "", 0.15)]:
        recorder.add(event)
    summary = recorder.summary()
    assert (summary.tokens, summary.steps, summary.mean_accepted_length) == (2, 3, 1.0)
    assert tui.summary_line(recorder, auto=False).startswith("2 tokens (+1 not shown) in 0.15 s")
    console = Console(width=120, record=True)
    console.print(tui.stats_panel(summary, "done"))
    assert "2 (+1 not shown) in 3 steps" in console.export_text()
    shown = Recorder()
    for event in [Step("plain", 0, 0, 0.0, 0.05), Token(1, "a", False), Done("length", "", 0.05)]:
        shown.add(event)
    assert tui.summary_line(shown, auto=False).startswith("1 tokens in ")  # (all shown: nothing added)


def test_the_panel_shows_draft_trees_in_one_line():
    recorder = Recorder()
    for event in [Prefill(3, 0, 0.1), Step("ngram", 6, 2, 0.0, 0.05, branches=2, depth=3, rank=2),
                  Token(1, "a", True), Token(2, "b", True), Token(3, "c", False), Done("stop", "", 0.1)]:
        recorder.add(event)
    console = Console(width=120, record=True)
    console.print(tui.stats_panel(recorder.summary(), "done"))
    shown = console.export_text()
    assert "trees" in shown and "1 steps, 6.0 nodes, depth 3.0, 2.0 branches; kept branch #2 1" in shown
    assert "off the bet" in shown


@pytest.mark.parametrize("seconds, written", [
    (0, "0s"), (8.5e-7, "850ns"), (1.5e-6, "1.5µs"), (0.061145167, "61.145167ms"), (0.001, "1ms"), (1.0, "1s"),
    (7.945641583, "7.945641583s"), (62.5, "1m2.5s"), (3600, "1h0m0s"), (3723.25, "1h2m3.25s"),
])
def test_durations_are_written_as_go_writes_them(seconds, written):
    assert tui.go_duration(seconds) == written


def test_verbose_timings_are_ollamas_lines_with_this_answers_numbers():
    recorder = Recorder()
    for event in events():
        recorder.add(event)
    summary = recorder.summary()
    block = tui.ollama_timings(summary, 1.5, 0.25)
    lines = dict(line.split(":", 1) for line in block.splitlines())
    assert list(lines) == ["total duration", "load duration", "prompt eval count", "prompt eval duration",
                           "prompt eval rate", "eval count", "eval duration", "eval rate", "speculation"]
    assert all(len(label) + 1 + len(value) - len(value.lstrip()) == 22 for label, value in lines.items())
    values = {label: value.strip() for label, value in lines.items()}
    assert values["total duration"] == "1.5s" and values["load duration"] == "250ms"
    assert values["prompt eval count"] == "10 token(s)" and values["prompt eval rate"] == "100.00 tokens/s"
    assert values["eval count"] == f"{summary.tokens} token(s)"
    assert values["eval rate"] == f"{summary.tokens_per_second:.2f} tokens/s"
    assert "2/3 drafted accepted" in values["speculation"]
    assert "load duration" not in tui.ollama_timings(summary, 1.5, None)  # nothing waited for a load


def test_bench_says_no_acceptance_where_nothing_was_drafted():
    """Plain's rows, and auto's where it drafted nothing, read `0%` accepted: every draft refused, where none was."""
    row = {"prompt_set": "gsm8k", "mode": "ngram", "prompts": 2, "tokens": 64, "tokens_per_second": 10.0,
           "speedup": 1.1, "acceptance_rate": 0.5, "mean_accepted_length": 1.5, "acceptance_by_positions": {},
           "drafters": {"ngram": {"steps": 8, "drafted": 16, "probes": 0, "probes_lost": 0}},
           "accepted_shares": {"ngram": 1.0}, "probe_loss": 0.0, "python_overhead": 0.05, "host_us_per_step": 300.0,
           "host_us_per_row": None, "aa_spread": None, "within_aa_spread": None}
    plain = {**row, "mode": "plain", "speedup": 1.0, "acceptance_rate": 0.0, "mean_accepted_length": 1.0,
             "drafters": {}, "accepted_shares": {}}
    console = Console(record=True, width=100)
    tui.bench_table([plain, row], None, console)
    rows = [line for line in console.export_text().splitlines() if "gsm8k" in line][:2]  # (the first table's)
    assert " plain " in rows[0] and "–" in rows[0] and "0%" not in rows[0]
    assert " ngram " in rows[1] and "50%" in rows[1]
