"""Everything drawn with Rich: download progress, tables, reports."""

import os
import re
import sys
import time
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING

try:
    import termios
except ImportError:  # Windows: no termios, and no echo to turn off
    termios = None

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text

from .events import Done, Reading, Step, Token
from .stats import INTERRUPTED, Recorder, Summary, TreeTally

if TYPE_CHECKING:
    from .store.compat import CompatReport


def _consoles(styled: bool) -> tuple[Console, Console]:
    """Standard error's and standard output's consoles. Unstyled: no ANSI styling at all, as NO_COLOR
    (no-color.org) asks, whose reading by Rich alone drops colours but keeps bold and dim."""
    color_system = "auto" if styled else None
    return (Console(stderr=True, highlight=False, color_system=color_system),
            Console(highlight=False, color_system=color_system))


err, out = _consoles(styled=not os.environ.get("NO_COLOR"))


def unstyled() -> None:
    """Plain text from here on (--no-color)."""
    global err, out
    err, out = _consoles(styled=False)


# C0 and C1 control characters and DEL: on a terminal they are commands (ESC starts a clipboard write
# with OSC 52, or a hyperlink with OSC 8), so text from models, model files and users shows them as
# escapes instead. Newlines and tabs of generated text are layout and stay.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL_OR_LAYOUT = re.compile("[\x00-\x1f\x7f-\x9f]")


def visible(text: str, layout: bool = True) -> str:
    """text with its control characters written as escapes (\\x1b), keeping newlines and tabs if layout."""
    return (_CONTROL if layout else _CONTROL_OR_LAYOUT).sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def log_line(text: str) -> None:
    """A line for the operator on stderr (a server's request log): its text may come from clients, so
    controls are escaped; a traceback keeps its lines."""
    print("\n".join(visible(line, layout=False) for line in text.split("\n")), file=sys.stderr, flush=True)


def shown(text) -> str:
    """Untrusted text to put inside Rich markup: shown literally, controls escaped, on one line."""
    return escape(visible(str(text), layout=False))


def download_progress():
    """A tqdm-shaped class for huggingface_hub that draws Rich bars on stderr, or None when
    stderr is not a terminal (scripts and CI get no progress noise)."""
    if not sys.stderr.isatty():
        return None

    class RichBar:
        def __init__(self, *, total=None, initial=0, desc="", **_):
            self.progress = Progress(
                TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                TimeRemainingColumn(), console=err, transient=False,
            )
            self.task = self.progress.add_task(desc or "downloading", total=total, completed=initial)
            self.progress.start()

        def update(self, n=1):
            self.progress.advance(self.task, n)

        def close(self):
            self.progress.stop()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.close()

    return RichBar


@contextmanager
def loading(text: str):
    """A spinner on stderr while models load (seconds of blank screen otherwise); nothing off a terminal."""
    if not err.is_terminal:
        yield
        return
    with err.status(f"[dim]{shown(text)}...[/]"):
        yield


def size_text(size: int | None) -> str:
    if not size:
        return "unknown"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def compat_report(report: "CompatReport", shared: float | None = None, console: Console = out) -> None:
    """The pair check's rules and verdict; shared: the share of the draft's vocabulary that spells single
    target tokens, where it drafts through text."""
    table = Table(title=f"{shown(report.draft.path.name)} drafting for {shown(report.target.path.name)}")
    table.add_column("rule")
    table.add_column("result")
    table.add_column("detail")
    for rule in report.rules:
        result = "[green]pass[/]" if rule.passed else "[yellow]differs[/]" if rule.vocabulary and report.across \
            else "[red]FAIL[/]"
        table.add_row(rule.name, result, shown(rule.detail))
    console.print(table)
    if not report.compatible:
        console.print("[red]incompatible: this draft cannot speculate for this target[/]")
    elif report.across:
        console.print(f"[yellow]{across_verdict(shared)}[/]")
    else:
        console.print("[green]compatible: this pair can speculate[/]")


def across_verdict(shared: float | None) -> str:
    share = f"; {shared:.0%} of the draft's vocabulary spells single target tokens" if shared is not None else ""
    return ("drafts through text (cross-vocabulary): expected acceptance lower than a same-family draft" + share
            + " (`bench` measures it)")


# models' columns, the most useful first: where the width runs out, the last ones are left out
MODEL_COLUMNS = ("name", "params", "size", "installed", "draft", "layers", "aliases", "family", "license")
# which columns stay at a narrow width, most wanted first: at 80 columns the name, whether it is here and
# what drafts for it
KEPT_FIRST = ("name", "draft", "installed", "size", "params", "layers", "aliases", "family", "license")


UNVERIFIED = " ?"  # beside a size (or drafter) that one public source alone pins


def drafts_text(row: dict) -> str:
    """The draft model a target recommends and the drafters published beside it (mtp, eagle3, ...)."""
    unverified = row.get("unverified_drafters", ())
    beside = [kind + (UNVERIFIED if name in unverified else "") for kind, name in row.get("drafters", {}).items()]
    return " + ".join(filter(None, [row["draft"] or "", ", ".join(beside)]))


def _also(row: dict) -> str:
    """A models row's aliases, or for a model made with `create` what it is made from; whose download it is, where
    another app's."""
    if row.get("keeper"):  # (another app's: its file's path says little a reader can use)
        return f"{row['keeper']}'s"
    parts = (row.get("made_from"), *row.get("adapters", ()), *filter(None, [row.get("projector")]))
    also = ", ".join(row["aliases"]) or (f"made from {' + '.join(parts)}" if row.get("made_from") else "")
    return ", ".join(filter(None, [also, row.get("kept_by") and f"from {row['kept_by']}"]))


def models_table(rows: list[dict], console: Console = out) -> None:
    """Every name whole, at any width and in a pipe: the less useful columns are left out (and named
    below the table) rather than any name cut short."""
    cells = [{"name": shown(row["name"]), "aliases": shown(_also(row)), "family": shown(row["family"]),
              "params": shown(row["params"]), "size": size_text(row["size"]) + (UNVERIFIED if row.get("unverified") else ""),
              "installed": "[green]yes[/]" if row["installed"] else "no", "draft": shown(drafts_text(row)),
              "layers": layers_text(row), "license": shown(row["license"])} for row in rows]
    console = _whole_rows(console)
    widths = {column: max([len(Text.from_markup(c[column]).plain) for c in cells] + [len(column)])
              for column in MODEL_COLUMNS}
    kept = list(KEPT_FIRST)
    # a column takes its widest cell, two of padding and a rule
    while len(kept) > 1 and sum(widths[c] + 3 for c in kept) + 1 > console.width:
        kept.pop()
    columns = [column for column in MODEL_COLUMNS if column in kept]
    table = Table(title="Models")
    for column in columns:
        whole = column in ("name", "draft")
        table.add_column(column, no_wrap=whole, min_width=widths[column] if whole else None, overflow="fold")
    for c in cells:
        table.add_row(*(c[column] for column in columns))
    console.print(table)
    if any(row.get("unverified") or row.get("unverified_drafters") for row in rows):
        console.print(f"[dim]{UNVERIFIED.strip()} unverified: one public source found for the file, or its size and"
                      " sha256 not found[/]")
    if len(columns) < len(MODEL_COLUMNS):
        console.print(f"[dim]not shown at this width: {', '.join(KEPT_FIRST[len(kept):])} (--json has them)[/]")


def search_table(found: list, console: Console = out) -> None:
    """`localspec search`: each model to fetch, the registry's first, its name whole (what `pull` takes)."""
    asked = any(model.downloads is not None for model in found)  # (the Hub's counts, where it was searched)
    columns = ("name", "params", *(("downloads", "likes") if asked else ()), "drafts", "here")
    table = Table(title="Models to pull")
    for column in columns:
        table.add_column(column, no_wrap=column == "name", justify="right" if column in ("downloads", "likes")
                         else "left")
    for model in found:
        counts = ["" if count is None else f"{count:,}" for count in (model.downloads, model.likes)] if asked else []
        table.add_row(shown(model.name), shown(model.params), *counts, shown(", ".join(model.drafts)),
                      "[green]yes[/]" if model.downloaded else "")
    _whole_rows(console).print(table)


def quantizations_table(repo: str, quantizations: list, console: Console = out) -> None:
    """`localspec search owner/repo`: its quantizations, the smallest first, each with the name `pull` takes."""
    table = Table(title=f"{shown(repo)}: its GGUF files")
    for column in ("quant", "size", "fits", "here", "pull as"):
        table.add_column(column, no_wrap=column == "pull as", justify="right" if column == "size" else "left")
    for quantization in quantizations:
        fits = quantization.fit + (" [bold](recommended)[/]" if quantization.recommended else "")
        table.add_row(shown(quantization.quant), size_text(quantization.size),
                      f"[red]{fits}[/]" if quantization.fit == "too big" else fits,
                      "[green]yes[/]" if quantization.here else "no", shown(quantization.pull))
    _whole_rows(console).print(table)


def model_card(card, console: Console = out) -> None:
    """`localspec show`: what Ollama's show prints, and what the model means for speculation."""
    info = card.info
    if applied := info.get("applied"):  # (no model: its architecture, context and drafts would say nothing true)
        lines = [("name", info["name"]), ("is", f"{applied['is']}" + (f" for {applied['for']} models" if applied["for"]
                                                                        else "") + ", not a model"),
                 ("use", f"localspec run MODEL {applied['option']} {info['file']}"), ("file", info["file"]),
                 ("size", size_text(info["size"]))]
        _rows(console, lines)
        return
    made = info.get("made", {})
    known = info["architecture"] is not None  # the file is on disk
    lines = [
        ("name", info["name"]),
        ("also", f"{info['ollama_name']} (Ollama's spelling)" if info["ollama_name"] not in (info["name"], None)
         else None),
        (f"{made.get('keeper')}'s", made.get("kept")),  # (read in place: its manifest, YAML or file)
        ("read from", info.get("kept_by")),  # (another app's download, read in place: `file` says where)
        ("made from", made.get("from")),  # (a model made with `create`; Ollama's: its GGUF blob)
        ("LoRA adapters", ", ".join(made.get("adapters", ())) or None),
        ("projector", made.get("projector")),  # (it reads images through it)
        ("system", Text(visible(made["system"])) if made.get("system") else None),  # (its lines as written)
        ("parameters set", ", ".join(f"{key} {value}" for key, value in made.get("parameters", ())) or None),
        ("opens with", f"{len(made['messages'])} message{'s' if len(made['messages']) != 1 else ''}"
         if made.get("messages") else None),
        ("architecture", info["architecture"]),
        ("parameters", card.parameters),
        ("context length", f"{info['context_length']:,}" if info["context_length"] else None),
        ("quantization", info["quantization"]),
        ("tokenizer", f"{info['tokenizer']}, {info['vocab_size']:,} tokens" if known else None),
        ("chat template", None if not known else "yes" if info["chat_template"] else "no (a plain transcript)"),
        ("thinks", {"think": "yes: <think> blocks", "gemma4": "yes: Gemma 4's thought channel",
                    "seed": "yes: <seed:think> blocks", "apriel": "yes: Apriel's reasoning steps",
                    "harmony": "yes: harmony's analysis channel"}.get(info["thinking"])
         if known and info["thinking"]
         else None),
        ("capabilities", ", ".join(info["capabilities"]) if info.get("capabilities") else None),  # (Ollama's words)
        ("file", info["file"] or f"not downloaded (`localspec pull {card.pull_name}`): what the file says"
         " shows once it is"),
        ("size", size_text(info["size"])),
        ("layers", layers_text(info) or None),
        ("drafts", card.drafts),
        ("license", info["license"] or None),
    ]
    _rows(console, lines)


def _rows(console: Console, lines: list[tuple[str, object]]) -> None:
    """A card's lines, label beside value; those not known (a file not downloaded yet) left out."""
    table = Table.grid(padding=(0, 3))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for label, value in lines:
        if value is not None:
            table.add_row(label, value if isinstance(value, Text) else shown(value))
    _whole_rows(console).print(table)


def ps_table(processes: list[dict], console: Console = out) -> None:
    if not processes:
        console.print("no localspec process holds a model")
        return
    table = Table(box=None, padding=(0, 2, 0, 0))
    for column in ("pid", "command", "up", "model", "processor", "address"):
        table.add_column(column.upper(), no_wrap=column in ("pid", "command", "up", "processor"), overflow="fold")
    now = time.time()
    for p in processes:
        table.add_row(str(p["pid"]), shown(p["command"]), duration_text(p["uptime"]), shown(p["model"]),
                      processor(p["on_gpu"]) if "on_gpu" in p else "", shown(p["address"]))
        for model in p.get("loaded", [])[1:]:  # (a serve's first is the model it started with, the row above)
            table.add_row("", "", "", f"+ {shown(model['name'])} (on demand; {_until(model['expires_at'], now)})",
                          processor(model.get("on_gpu", 0.0)), "")
    _whole_rows(console).print(table)


def processor(on_gpu: float) -> str:
    """Where a model's layers are, as `ollama ps` says it: 100% GPU, 100% CPU, 48%/52% CPU/GPU."""
    gpu = round(on_gpu * 100)
    return "100% GPU" if gpu >= 100 else "100% CPU" if gpu <= 0 else f"{100 - gpu}%/{gpu}% CPU/GPU"


def _until(expires_at: str, now: float) -> str:
    """When a model a serve loaded on demand goes, from Ollama's expires_at."""
    if expires_at.startswith("9999"):
        return "stays while serve runs"
    left = datetime.fromisoformat(expires_at.replace("Z", "+00:00")).timestamp() - now
    return f"unloads in {duration_text(left)}" if left >= 1 else "unloads once idle"


def duration_text(seconds: float) -> str:
    """3 s, 4 min, 2 h 05 min, 3 days 4 h."""
    minutes, hours, days = int(seconds // 60), int(seconds // 3600), int(seconds // 86400)
    if seconds < 60:
        return f"{seconds:.0f} s"
    if hours < 1:
        return f"{minutes} min"
    if days < 1:
        return f"{hours} h {minutes % 60:02d} min"
    return f"{days} day{'s' if days > 1 else ''} {hours % 24} h"


def layers_text(row: dict) -> str:
    """What a downloaded model's layers mean for speculation; nothing before it is downloaded."""
    if row.get("recurrent") is None:
        return ""
    text = "attention"
    if row["recurrent"]:
        text = "recurrent state" + ("" if row["rolls_back"] else " (decodes plainly)")
    return text + (f", {row['mtp_layers']} MTP" if row["mtp_layers"] else "")


def doctor_report(machine, pairs: list[dict], ctx_size: int, rebuild_hint: str | None, console: Console = out) -> None:
    console.print(f"[bold]llama.cpp backend[/]: {'GPU offload available' if machine.gpu_offload else 'CPU only'};"
                  f" {'RPC available (--rpc, `localspec worker`)' if machine.rpc else 'no RPC (rebuild with scripts/setup-venv)'}")
    console.print(f"[bold]CPU[/]: {shown(machine.cpu)}; {shown(machine.features)}")
    console.print(f"[bold]RAM[/]: {size_text(machine.ram_available)} free of {size_text(machine.ram_total)}")
    devices = Table(title="Devices")
    for column in ("name", "kind", "description", "free", "total"):
        devices.add_column(column)
    for d in machine.devices:
        devices.add_row(shown(d.name), shown(d.kind), shown(d.description), size_text(d.free), size_text(d.total))
    console.print(devices)
    gpus = [d.name for d in machine.devices if d.is_local_gpu] if machine.gpu_offload else []
    workers = [f"{d.name} ({d.description})" for d in machine.devices if d.remote]
    if gpus:
        console.print(f"[bold]Models run on[/]: {shown(', '.join(gpus))}, every layer by default (--gpu-layers and"
                      " --draft-gpu-layers N keep the rest on the CPU); rows are sampled on the backend")
    else:
        console.print("[bold]Models run on[/]: the CPU; greedy rows are sampled on the backend (an argmax in the"
                      " graph), other rows on the host")
    if workers:
        console.print(f"[bold]With --rpc[/]: the target's layers go to {shown(', '.join(workers + gpus))} by free"
                      " memory, this machine's CPU too where it has no GPU (--tensor-split, --gpu-layers N to choose);"
                      " the draft model stays here")
    if rebuild_hint:
        console.print(rebuild_hint)
    fits = Table(title=f"Registry pairs at a context of {ctx_size} tokens (estimates; downloaded models measured)")
    for column in ("target", "draft", "needs", "fits", "layers on (target; draft)"):
        fits.add_column(column)
    for row in pairs:
        verdict = {True: "[green]yes[/]", False: "[red]no[/]", None: "unknown until downloaded"}[row["fits"]]
        fits.add_row(shown(row["target"]), shown(row["draft"]), size_text(row["needed"]), verdict,
                     f"{placement_text(row['target_layers'])}; {placement_text(row['draft_layers'])}")
    _whole_rows(console).print(fits)


def _whole_rows(console: Console) -> Console:
    """Written to a file or pipe, a table keeps its rows whole instead of wrapping them at 80 columns
    (a recording console keeps the width it was given)."""
    return console if console.is_terminal or console.record else Console(file=console.file, width=240, highlight=False)


def placement_text(placement: dict | None) -> str:
    """A model's placement (placement.ModelPlacement.as_layers) in a few words: `29 on CUDA0`, `20 on RPC0, RPC1, 9 on the CPU`."""
    if placement is None:
        return "?"
    layers, offloaded = placement["layers"], placement["offloaded"]
    devices = [d for d in placement["devices"] if d != "CPU"]
    parts = ([f"{offloaded} on {shown(', '.join(devices))}"] if offloaded else []) + (
        [f"{layers - offloaded} on the CPU"] if offloaded < layers else [])
    return ", ".join(parts)


DRAFT_STYLE = "green"
THOUGHT_STYLE = "dim italic"  # a reasoning model's thinking, apart from its answer
BAR_WIDTH = 20


class LiveView:
    """Shows a generation as it happens: the text, with tokens that came from accepted
    drafts highlighted, and a panel of speculation statistics. Feed it every event.

    While running, the screen shows the tail of the text that fits above the panel; when
    the generation ends the live region is replaced by the whole text and a summary.
    """

    def __init__(self, console: Console, color: bool = True, summary: bool = True, models: str = "",
                 auto: bool = False, thinking: bool = True):
        """thinking: show a reasoning model's thinking (its counts stay in the panel either way)."""
        self.console = console
        self.models, self.auto, self.thinking = models, auto, thinking
        self.color = color
        self.summary = summary
        self.text = Text()
        self._answering = False  # whether the answer has begun (after any thinking)
        self.recorder = Recorder()
        self.live = Live(console=console, transient=True, auto_refresh=False, redirect_stdout=False)

    def __enter__(self):
        self._quiet_terminal = _EchoOff()
        self.live.start()
        return self

    def __exit__(self, *exc):
        self.live.stop()
        self._quiet_terminal.restore()
        self.console.print(self.text, end="" if self.text.plain.endswith("\n") else "\n")
        if self.recorder.finish_reason is None:  # Ctrl-C, or an error
            self.recorder.interrupt()
        if self.summary:
            self.console.print(stats_panel(self.recorder.summary(), self.recorder.finish_reason, models=self.models,
                                           auto=self.auto))

    def add(self, event) -> None:
        self.recorder.add(event)
        if isinstance(event, Token):
            drafted = DRAFT_STYLE if self.color and event.from_draft else ""
            if event.thought and self.thinking:
                self.text.append(visible(event.thought), style=f"{THOUGHT_STYLE} {drafted}".strip())
            if event.text:
                self._end_of_thinking()
                self.text.append(visible(event.text), style=drafted or None)
        elif isinstance(event, Done):
            if event.thought_tail and self.thinking:
                self.text.append(visible(event.thought_tail), style=THOUGHT_STYLE)
            if event.tail:
                self._end_of_thinking()
                self.text.append(visible(event.tail))
        if isinstance(event, (Step, Done)):
            self.live.update(self._render(), refresh=True)
        elif isinstance(event, Reading):
            self.live.update(Text(reading_line(event), style="dim"), refresh=True)

    def _end_of_thinking(self) -> None:
        """A blank line between the thinking and the answer, where there was thinking shown."""
        if self.recorder.reasoning and self.thinking and not self._answering:
            self.text.append("\n\n" if not self.text.plain.endswith("\n") else "\n")
        self._answering = True

    def _render(self):
        panel = stats_panel(self.recorder.summary(), "generating", self.recorder.last_drafted, self.models, self.auto)
        panel_height = len(self.console.render_lines(panel, self.console.options))
        room = max(self.console.height - panel_height - 1, 3)
        # Wrap only the tail that can show, from the start of its first logical line so it wraps as
        # the whole text would: the cost per step must not grow with the length of the output.
        plain = self.text.plain
        start = plain.rfind("\n", 0, max(len(plain) - room * self.console.width, 0)) + 1
        lines = self.text[start:].wrap(self.console, self.console.width)
        return Group(*lines[-room:], panel)


def reading_line(r: Reading) -> str:
    """How far a long prompt's reading has got."""
    rate = (r.read - r.cached) / r.seconds if r.seconds > 0 else 0.0
    cached = f", {r.cached:,} cached" if r.cached else ""
    return f"reading the prompt: {r.read:,} of {r.total:,} tokens ({r.read / r.total:.0%}{cached}), {rate:,.0f} tokens/s"


def drafted_text(s: Summary, auto: bool = False) -> str:
    """How drafts fared, or why there were none."""
    if s.drafted:
        return f"{s.accepted}/{s.drafted} drafted accepted ({s.acceptance_rate:.0%})"
    if auto:
        return "nothing drafted (auto expected no draft to beat a plain step here)"
    return "nothing drafted"


class _EchoOff:
    """Keeps the terminal from echoing what is typed (and `^C`) while the live view draws. The panel
    fills the last column, so an echoed `^C` wraps to a new line, scrolls the screen by one, and the
    view's erase then misses its top line, which stayed on screen twice."""

    def __init__(self):
        self.saved = None
        if termios is None or not sys.stdin.isatty():
            return
        try:
            self.saved = termios.tcgetattr(sys.stdin)
        except termios.error:
            return
        quiet = list(self.saved)
        quiet[3] &= ~(termios.ECHO | getattr(termios, "ECHOCTL", 0))  # lflag
        termios.tcsetattr(sys.stdin, termios.TCSANOW, quiet)

    def restore(self) -> None:
        if self.saved is not None:
            termios.tcsetattr(sys.stdin, termios.TCSADRAIN, self.saved)


def unshown_text(s: Summary) -> str:
    """The tokens the target settled beyond a count of the tokens generated (its end token, which no Token event
    carries), after that count: tokens/step counts them, and "20 in 21 steps, 1.00 tokens/step" read as a miscount.
    A stop string's tokens are in the count, as every API counts them (completion_tokens, eval_count). (While it
    generates, tokens held back until a stop string is ruled out would make it flicker: said at the end.)"""
    unshown = round(s.mean_accepted_length * s.steps) - s.tokens
    return f" (+{unshown} not shown)" if unshown > 0 else ""


def stats_panel(s: Summary, state: str, draft_length: int | None = None, models: str = "", auto: bool = False) -> Panel:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_column(style="bold")
    table.add_column()
    spent = s.draft_seconds + s.verify_seconds
    split = f"draft {s.draft_seconds / spent:.0%} / verify {s.verify_seconds / spent:.0%}" if spent else "–"
    speedup = f"{s.estimated_speedup:.2f}x (est.)" if s.estimated_speedup else "– (no plain step yet)"
    table.add_row("tokens/s", f"{s.tokens_per_second:.1f}", "tokens", f"{s.tokens}{'' if state == 'generating' else unshown_text(s)} in {s.steps} steps")
    accepted = f"{s.acceptance_rate:.0%} of {s.drafted}" if s.drafted else drafted_text(s, auto)
    table.add_row("accepted", accepted, "tokens/step", f"{s.mean_accepted_length:.2f}")
    table.add_row("time", split, "vs plain", speedup)
    if draft_length is not None:
        table.add_row("draft length", str(draft_length), "prompt", f"{s.prompt_tokens} tokens ({s.reused_prompt_tokens} cached)")
    else:
        table.add_row("prompt", f"{s.prompt_tokens} tokens", "prefill", f"{s.prefill_seconds:.2f} s ({s.reused_prompt_tokens} cached)")
    for name, part in s.parts.items():
        table.add_row(name, f"{part.tokens} tokens, {part.tokens_per_second:.1f} tok/s", "tokens/step",
                      f"{part.tokens_per_step:.2f}")
    for name, d in s.drafters.items():
        probes = f"; {d.probes} probes, {d.probes_lost} lost ({d.probe_lost_seconds:.2f} s)" if d.probes else ""
        table.add_row(name, f"{d.steps} steps", "accepted", f"{d.accepted} of {d.drafted}{probes}")
    if s.trees.steps:
        table.add_row("trees", trees_text(s.trees), "off the bet", f"{s.trees.off_the_bet} steps")
    bars = Table.grid(padding=(0, 1))
    for positions, rate in s.acceptance_by_position_range():
        bars.add_row(f"draft #{positions}", "█" * round(rate * BAR_WIDTH) + "·" * (BAR_WIDTH - round(rate * BAR_WIDTH)), f"{rate:.0%}")
    return Panel(Group(table, bars), title=f"speculation · {state}", title_align="left", border_style="dim",
                 subtitle=shown(models) or None, subtitle_align="right")


def trees_text(trees: TreeTally) -> str:
    """The draft trees' mean size, depth and branches, and where their kept paths went."""
    n = trees.steps
    ranks = ", ".join(f"#{rank} {count}" for rank, count in sorted(trees.wins.items()))
    return (f"{n} steps, {trees.nodes / n:.1f} nodes, depth {trees.depth / n:.1f}, {trees.branches / n:.1f} branches;"
            f" kept branch {ranks}")


def reply_line(recorder: Recorder) -> str:
    """One dim line under a chat reply."""
    if recorder.finish_reason == INTERRUPTED:
        return "(stopped)"
    s = recorder.summary()
    drafted = f"{s.acceptance_rate:.0%} of {s.drafted} drafted accepted" if s.drafted else drafted_text(s)
    return (
        f"{s.tokens} tokens, {s.tokens_per_second:.1f} tok/s, {drafted};"
        f" prompt {s.prompt_tokens} tokens ({s.reused_prompt_tokens} cached) in {s.prefill_seconds:.2f} s"
        + parts_text(s)
    )


def ollama_timings(s: Summary, total_seconds: float, load_seconds: float | None, auto: bool = False) -> str:
    """One answer's timings as `ollama run --verbose` prints them, under its labels (scripts that read Ollama's
    read these), then what speculation did. load_seconds: the models' load, where this answer waited for it
    (None: it did not, and the line is left out as Ollama leaves a zero out)."""
    read = s.prompt_tokens  # (Ollama's runner counts the whole prompt, what its cache held included)
    lines = [("total duration", go_duration(total_seconds)),
             ("load duration", go_duration(load_seconds) if load_seconds is not None else None),
             ("prompt eval count", f"{read} token(s)"),
             ("prompt eval duration", go_duration(s.prefill_seconds)),
             ("prompt eval rate", f"{read / s.prefill_seconds:.2f} tokens/s" if s.prefill_seconds else None),
             ("eval count", f"{s.tokens} token(s)"),
             ("eval duration", go_duration(s.decode_seconds)),
             ("eval rate", f"{s.tokens_per_second:.2f} tokens/s" if s.decode_seconds else None),
             ("speculation", f"{drafted_text(s, auto)}, {s.mean_accepted_length:.2f} tokens per target pass")]
    return "\n".join(f"{label + ':':<22}{value}" for label, value in lines if value is not None)


def go_duration(seconds: float) -> str:
    """A duration as Go writes one (Ollama's --verbose): 850ns, 61.145167ms, 7.945641583s, 1m2.5s."""
    ns = max(0, round(seconds * 1e9))
    if ns < 1000:
        return f"{ns}ns" if ns else "0s"
    if ns < 10**9:
        unit, scale, digits = ("µs", 10**3, 3) if ns < 10**6 else ("ms", 10**6, 6)
        return _decimal(ns, scale, digits) + unit
    minutes, rest = divmod(ns, 60 * 10**9)
    hours, minutes = divmod(minutes, 60)
    return (f"{hours}h" if hours else "") + (f"{minutes}m" if hours or minutes else "") + _decimal(rest, 10**9, 9) + "s"


def _decimal(count: int, scale: int, digits: int) -> str:
    """count / scale written exactly, without trailing zeros (integers: no float's rounding)."""
    whole, fraction = divmod(count, scale)
    return f"{whole}.{fraction:0{digits}d}".rstrip("0").rstrip(".")


def parts_text(s: Summary) -> str:
    """A reasoning model's thinking and answer apart, for one-line summaries ("" where it did not think)."""
    return "".join(f"; {name} {part.tokens} tokens, {part.tokens_per_second:.1f} tok/s, {part.tokens_per_step:.2f}"
                   " tokens/step" for name, part in s.parts.items() if part.tokens)


def stream(events, show: bool, thinking: bool = True) -> Recorder:
    """Run a generation to its end, writing its text to stdout as it streams if `show`, and a reasoning model's
    thinking to stderr if `thinking` too (stdout carries the answer alone). Ctrl-C ends it early; the recorder
    then holds what was made so far, finish reason "interrupted"."""
    recorder = Recorder()
    write = _writer(show)
    think = _thought_writer(show and thinking)
    try:
        for event in events:
            recorder.add(event)
            if isinstance(event, Token):
                think(event.thought)
                write(event.text)
            elif isinstance(event, Done):
                think(event.thought_tail + ("\n" if recorder.reasoning and not recorder.reasoning.endswith("\n") else ""))
                write(event.tail if recorder.text.endswith("\n") else event.tail + "\n")
    except KeyboardInterrupt:
        recorder.interrupt()
        write("\n")
    return recorder


def _writer(show: bool):
    """Writes generated text to stdout as it streams (or nowhere, if not show)."""
    return write_text if show else lambda text: None


def _thought_writer(show: bool):
    def write(text: str) -> None:
        if text and show:
            sys.stderr.write(visible(text) if sys.stderr.isatty() else text)
            sys.stderr.flush()

    return write


def write_text(text: str) -> None:
    """Model text to stdout, flushed. On a terminal a model's escape sequences would be commands
    (OSC 52 writes the clipboard); into a pipe or file the text is data and goes out exactly as generated."""
    if text:
        sys.stdout.write(visible(text) if sys.stdout.isatty() else text)
        sys.stdout.flush()


def comparison(c, console: Console) -> None:
    """A compare.Comparison: the speculative run and the plain one of the same prompt, side by side, and
    what it means."""
    table = Table(box=None, padding=(0, 2, 0, 0))
    table.add_column("same prompt")
    table.add_column(f"speculative ({c.mode})", justify="right")
    table.add_column("plain", justify="right")
    s, p = c.speculative, c.plain
    table.add_row("decode time", f"{s.decode_seconds:.2f} s", f"{p.decode_seconds:.2f} s")
    table.add_row("tokens/s", f"{s.tokens_per_second:.1f}", f"{p.tokens_per_second:.1f}")
    table.add_row("tokens", f"{s.tokens}{unshown_text(s)}", f"{p.tokens}{unshown_text(p)}")
    table.add_row("target passes", str(s.steps), str(p.steps))
    table.add_row("tokens/pass", f"{s.mean_accepted_length:.2f}", f"{p.mean_accepted_length:.2f}")
    table.add_row("drafts", drafted_text(s), "")
    console.print(table)
    console.print(c.headline(), highlight=False)
    console.print(c.verdict(), highlight=False)


def summary_line(recorder: Recorder, auto: bool) -> str:
    """The statistics of a generation in one line, for stderr when stdout is not a terminal."""
    s = recorder.summary()
    return (
        f"{s.tokens} tokens{unshown_text(s)} in {s.decode_seconds:.2f} s, {s.tokens_per_second:.1f} tok/s;"
        f" {drafted_text(s, auto)}, {s.mean_accepted_length:.2f} tokens/step; prompt {s.prompt_tokens} tokens"
        + (f" ({s.reused_prompt_tokens} cached)" if s.reused_prompt_tokens else "") + " in"
        f" {s.prefill_seconds:.2f} s; finish: {recorder.finish_reason}" + parts_text(s)
        + "".join(f"; {kind}: {d.steps} steps, {d.accepted}/{d.drafted} accepted"
                  + (f", {d.probes} probes ({d.probes_lost} lost {d.probe_lost_seconds:.2f} s)" if d.probes else "")
                  for kind, d in s.drafters.items())
    )


class BatchProgress:
    """A progress bar on stderr with ETA and the running acceptance rate; silent off a terminal."""

    def __init__(self, total: int):
        self.drafted = self.accepted = self.failed = self.finished = 0
        self.progress = None
        if err.is_terminal:
            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeRemainingColumn(), TextColumn("{task.fields[status]}"), console=err)
            self.task = self.progress.add_task("batch", total=total, status="")

    def __enter__(self):
        if self.progress:
            self.progress.start()
        return self

    def __exit__(self, *exc):
        if self.progress:
            self.progress.stop()

    def __call__(self, record: dict) -> None:
        self.finished += 1
        stats = record.get("stats")
        if stats:
            self.drafted += stats["drafted"]
            self.accepted += stats["accepted"]
        else:
            self.failed += 1
        if self.progress:
            self.progress.update(self.task, advance=1, status=self.status())

    def status(self) -> str:
        """The running acceptance rate and failures, as far as there are any."""
        return ", ".join(([f"{self.accepted / self.drafted:.0%} accepted"] if self.drafted else [])
                         + ([f"{self.failed} failed"] if self.failed else []))


def batch_summary(records: list[dict], skipped: int, seconds: float, console: Console = err) -> None:
    """The run's table; its tok/s the tokens generated over the run's whole time (seconds: prompts read included),
    the items' own decode times overlapping under --parallel."""
    done = [r for r in records if "stats" in r]
    failed = [r for r in records if "error" in r]
    tokens = sum(r["stats"]["tokens"] for r in done)
    drafted = sum(r["stats"]["drafted"] for r in done)
    accepted = sum(r["stats"]["accepted"] for r in done)
    table = Table(title="batch", caption="tok/s: the tokens over the whole run, prompts read included")
    for column in ("items", "done", "failed", "skipped (resume)", "tokens", "tok/s", "accepted"):
        table.add_column(column)
    table.add_row(str(len(records)), str(len(done)), str(len(failed)), str(skipped), str(tokens),
                  f"{tokens / seconds:.1f}" if seconds else "–", f"{accepted / drafted:.0%}" if drafted else "–")
    console.print(table)
    for record in failed:
        console.print(f"[red]failed[/] {shown(record['id'])}: {shown(record['error'])}")


def bench_table(rows: list[dict], costs: dict | None = None, console: Console = out,
                pooled: list[dict] | None = None) -> None:
    """Two tables that fit 100 columns: what each mode achieved, then how it drafted and what the
    host's Python cost (--json has every figure); then, in words, what the A/A control and the pooled
    rows (bench.pooled) say of the ratios."""
    console = _whole_rows(console)
    results = Table(title="localspec bench")
    for column in ("prompt set", "mode", "prompts", "tokens", "tok/s", "vs plain ±A/A", "accepted", "tokens/step"):
        results.add_column(column, justify="left" if column in ("prompt set", "mode") else "right")
    details = Table(title="how each mode drafted")
    for column in ("prompt set", "mode", "accepted by draft position", "drafting steps: share of accepted",
                   "probes lost", "python",
                   "host µs step+row"):
        details.add_column(column, overflow="fold")
    for r in rows:
        drafters = r["drafters"].values()
        probes = sum(d["probes"] for d in drafters)
        results.add_row(
            shown(r["prompt_set"]), r["mode"], str(r["prompts"]), str(r["tokens"]), f"{r['tokens_per_second']:.2f}",
            versus_plain(r), f"{r['acceptance_rate']:.0%}" if any(d.get("drafted") for d in drafters) else "–",
            f"{r['mean_accepted_length']:.2f}")  # ("0%" read as every draft refused where none was made)
        details.add_row(
            shown(r["prompt_set"]), r["mode"],
            " ".join(f"{positions}:{rate:.0%}" for positions, rate in r["acceptance_by_positions"].items()) or "–",
            " ".join(f"{name} {d['steps']}:{r['accepted_shares'].get(name, 0):.0%}"
                     for name, d in r["drafters"].items()) or "–",
            f"{sum(d['probes_lost'] for d in drafters)}/{probes} {r['probe_loss']:.1%}" if probes else "–",
            f"{r['python_overhead']:.1%}",
            f"{r['host_us_per_step']:.0f}" + (f"+{r['host_us_per_row']:.0f}" if r["host_us_per_row"] is not None else ""),
        )
    console.print(results)
    console.print(details)
    if any(r.get("parts") for r in rows):  # a reasoning model's thinking and answer apart (reports before it: none)
        parts = Table(title="thinking and answer apart")
        for column in ("prompt set", "mode", "thinking: tokens, tok/s, tokens/step", "answer: tokens, tok/s, tokens/step"):
            parts.add_column(column, justify="left" if column in ("prompt set", "mode") else "right")
        for r in rows:
            parts.add_row(shown(r["prompt_set"]), r["mode"], *(
                f"{p['tokens']}, {p['tokens_per_second']:.1f}, {p['tokens_per_step']:.2f}" if (p := r.get("parts", {}).get(name))
                else "–" for name in ("thinking", "answer")))
        console.print(parts)
    if any(r.get("trees", {}).get("steps") for r in rows):  # (reports before trees: none)
        trees = Table(title="draft trees")
        for column in ("prompt set", "mode", "tree steps", "nodes, depth, branches a tree", "kept branch"):
            trees.add_column(column, justify="left" if column in ("prompt set", "mode") else "right")
        for r in rows:
            t = r.get("trees") or {}
            if n := t.get("steps"):
                trees.add_row(shown(r["prompt_set"]), r["mode"], str(n),
                              f"{t['nodes'] / n:.1f}, {t['depth'] / n:.1f}, {t['branches'] / n:.1f}",
                              " ".join(f"#{rank}: {count}" for rank, count in sorted(t["wins"].items())))
        console.print(trees)
    for line in aa_notes(rows, pooled or []) + text_notes(rows):
        console.print(line)
    if costs:
        console.print(costs_line(costs))


# bench's A/A control (bench.Control.PLAIN_AA): plain decoding again, the mode ratios are read against
AA_MODE = "plain-aa"


def versus_plain(row: dict) -> str:
    """A bench row's ratio to plain, with its prompt set's A/A spread beside it where a control ran and
    the mode is compared with plain (not plain itself, not the control)."""
    if not row["speedup"]:
        return "–"
    ratio = f"{row['speedup']:.2f}x"
    return ratio if row["within_aa_spread"] is None else f"{ratio} ±{row['aa_spread']:.1%}"


def aa_notes(rows: list[dict], pooled: list[dict]) -> list[str]:
    """In words: how far the A/A control ran from plain, each mode pooled over the prompt sets (when
    there are several), and which ratios lie within the A/A spread of 1.00x, so show no difference."""
    several = len({r["prompt_set"] for r in rows}) > 1
    lines = []
    controls = [r for r in rows + (pooled if several else []) if r["mode"] == AA_MODE and r["speedup"]]
    if controls:
        # an identical mode lands outside a single draw of the noise half the time: outside is no proof
        lines.append(f"A/A control ({AA_MODE}: plain decoding again, interleaved) against plain: "
                     + ", ".join(f"{r['speedup']:.2f}x {_where(r)}" for r in controls)
                     + ". A ratio no farther from 1.00x than its control's shows no difference; one a little"
                     " farther may still be noise (the spread is one draw of it).")
    elif any(r["mode"] == "plain" for r in rows) and len({r["mode"] for r in rows}) > 1:
        lines.append(f"no A/A control ({AA_MODE} in --modes) in this run: how much of each ratio is noise is unknown")
    compared = [r for r in pooled if r["mode"] not in ("plain", AA_MODE) and r["speedup"]]
    if several and compared:
        lines.append(f"pooled over {len({r['prompt_set'] for r in rows})} prompt sets: "
                     + ", ".join(f"{r['mode']} {versus_plain(r)}" for r in compared))
    within = [r for r in rows + (pooled if several else []) if r["within_aa_spread"]]
    if within:
        lines.append("within the A/A spread of 1.00x, so no difference from plain shown: "
                     + ", ".join(f"{r['mode']} {versus_plain(r)} {_where(r)}" for r in within))
    return lines


def text_notes(rows: list[dict]) -> list[str]:
    """In words, for a greedy run with plain in it: whether every mode's text was plain decoding's, and
    where not, which prompts and from which token (bench.Result.differs_from)."""
    compared = [r for r in rows if r.get("differs_from_plain") is not None and r["mode"] != "plain"]
    if not compared:
        return []
    differing = [r for r in compared if r["differs_from_plain"]]
    if not differing:
        return ["greedy text: every mode's, prompt by prompt, is plain decoding's"]
    return ["greedy text not plain decoding's (a near-tie in the target's logits that a batched pass breaks"
            " differently, or a bug): " + "; ".join(
                f"{r['mode']} {_where(r)}, " + ", ".join(f"prompt {d['prompt']} from token {d['at']}"
                                                          for d in r["differs_from_plain"]) for r in differing)]


def _where(row: dict) -> str:
    """A bench row's prompt set, or `pooled` for a row of bench.pooled."""
    return f"on {shown(row['prompt_set'])}" if "prompt_set" in row else "pooled"


def costs_line(costs: dict) -> str:
    """What auto measured of this machine: the verification cost curve and each drafter's costs."""
    curve = ", ".join(f"{n}: {relative:.2f}" for n, relative in costs["verify_relative"].items())
    drafts = "".join(f"; a {kind} token {d['token']:.2f}" for kind, d in costs["drafts"].items())
    return f"auto's costs: verify(1) {costs['verify_1_ms']:.1f} ms; verify(n) / verify(1): {curve}{drafts}"
