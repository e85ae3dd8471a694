"""What people see: rendered with a recording Rich console."""

from rich.console import Console

from localspec import tui
from localspec.events import Done, Prefill, Step, Token
from localspec.stats import Tally


def events():
    steps = [
        Prefill(10, 0, 0.1),
        Step("draft", 3, 2, 0.03, 0.05), Token(1, "Hello", True), Token(2, " wor", True), Token(3, "ld", False),
        Step("draft", 0, 0, 0.0, 0.02), Token(4, "!", False),
    ]
    tally = Tally()
    for event in steps:
        tally.add(event)
    return [*steps, Done("length", "Hello world!", "", tally.summary(0.1))]


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
    tui.models_table([dict(name="m", family="f", params="1B", size=808_000_000, installed=True, draft="d", license="x")],
                     console)
    text = console.export_text()
    assert "808.0 MB" in text and "yes" in text
