"""Everything drawn with Rich: download progress, tables, reports."""

import sys

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from .compat import CompatReport

err = Console(stderr=True)
out = Console()


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


def size_text(size: int | None) -> str:
    if not size:
        return "?"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def compat_report(report: CompatReport, console: Console = out) -> None:
    table = Table(title=f"{report.draft.path.name} drafting for {report.target.path.name}")
    table.add_column("rule")
    table.add_column("result")
    table.add_column("detail")
    for rule in report.rules:
        table.add_row(rule.name, "[green]pass[/]" if rule.passed else "[red]FAIL[/]", rule.detail)
    console.print(table)
    verdict = "[green]compatible: this pair can speculate[/]" if report.compatible else "[red]incompatible: this draft cannot speculate for this target[/]"
    console.print(verdict)


def models_table(rows: list[dict], console: Console = out) -> None:
    table = Table(title="Models")
    for column in ("name", "family", "params", "size", "installed", "draft", "licence"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["name"], row["family"], row["params"], size_text(row["size"]),
            "[green]yes[/]" if row["installed"] else "no", row["draft"] or "", row["license"],
        )
    console.print(table)


def doctor_report(machine, pairs: list[dict], ctx_size: int, rebuild_hint: str | None, console: Console = out) -> None:
    console.print(f"[bold]llama.cpp backend[/]: {'GPU offload available' if machine.gpu_offload else 'CPU only'}")
    console.print(f"[bold]CPU[/]: {machine.cpu}; {machine.features}")
    console.print(f"[bold]RAM[/]: {size_text(machine.ram_available)} free of {size_text(machine.ram_total)}")
    devices = Table(title="Devices")
    for column in ("name", "kind", "description", "free", "total"):
        devices.add_column(column)
    for d in machine.devices:
        devices.add_row(d["name"], d["kind"], d["description"], size_text(d["free"]), size_text(d["total"]))
    console.print(devices)
    if rebuild_hint:
        console.print(rebuild_hint)
    fits = Table(title=f"Registry pairs at a context of {ctx_size} tokens (estimates; downloaded models measured)")
    for column in ("target", "draft", "needs", "fits"):
        fits.add_column(column)
    for row in pairs:
        fits.add_row(row["target"], row["draft"], size_text(row["needed"]), "[green]yes[/]" if row["fits"] else "[red]no[/]")
    console.print(fits)
