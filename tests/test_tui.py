"""What people see: rendered with a recording Rich console."""

from rich.console import Console

from localspec import tui
from localspec.events import Done, Prefill, Step, Token
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


def test_untrusted_text_is_never_read_as_rich_markup():
    console = Console(record=True, width=260)  # every column holds the text whole
    hostile = "[/] [link=http://evil]click[/link] [bold red]"
    tui.models_table([dict(name=hostile, aliases=[hostile], family=hostile, params="1B", size=None, installed=False,
                           draft=hostile, license=hostile)], console)
    tui.batch_summary([{"id": hostile, "error": hostile}], 0, console)
    text = console.export_text()
    assert text.count("[link=http://evil]click[/link]") >= 5


def test_generated_escape_sequences_reach_the_live_view_as_text():
    console = Console(record=True, width=90, height=30, force_terminal=True)
    with tui.LiveView(console, summary=False) as view:
        view.add(Prefill(1, 0, 0.0))
        view.add(Token(1, "copy \x1b]52;c;aGk=\x07 me", False))
    assert "\x1b]52" not in console.export_text(styles=True, clear=False) and "\\x1b]52" in console.export_text()


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
