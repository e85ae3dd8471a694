"""Requests generated side by side on a session's sequences (continuous batching), for any caller that
runs several at once: serve's worker, batch --parallel, a program.

add() starts a request on the free sequence whose cache holds most of its prompt; step() decodes one
step of every running generation in one batch and hands out what each made; drop() stops one. A
generation that fails ends alone, and its sequence's cache is emptied where the failure may have left a
half-made step in it. Requests that ask for other LoRA adapters' scales than those running wait (admits()):
one context computes with one set of scales at a time, as llama-server batches only requests of the same.
"""

from collections.abc import Iterator
from dataclasses import dataclass, field

from .config import DrafterKind
from .engine.together import ENDED, Together
from .errors import InputError, UsageError
from .request import Request
from .stats import Recorder
from .tool_calls import ToolFormat

__all__ = ["ENDED", "Running", "Scheduler"]


@dataclass
class Running:
    """A request being generated: on which sequence, in which drafting mode, how long its prediction was,
    the form the model writes tool calls in (where it was offered tools), its prompt's tokens as read; recorder
    folds its events."""

    request: Request
    sequence: int
    drafting: DrafterKind
    predicted: int = 0
    tool_format: ToolFormat | None = None
    recorder: Recorder = field(default_factory=Recorder)
    prompt: list[int] = field(default_factory=list)


class Scheduler:
    """Requests on the sequences of one session (Session.scheduler() makes one)."""

    def __init__(self, session):
        self.session = session
        self.running: dict[int, Running] = {}  # by sequence
        self._together = Together()

    def __len__(self) -> int:
        return len(self.running)

    @property
    def full(self) -> bool:
        """Whether every sequence is generating."""
        return len(self.running) >= len(self.session.sequences)

    def admits(self, request: Request) -> bool:
        """Whether the request may start beside those running: it computes with the same adapters' scales, or
        none runs (one that names an adapter not loaded is admitted, to be refused by add())."""
        try:
            return not self.running or self.session.lora_scales(request) == self.session.lora_applied
        except UsageError:
            return True

    def add(self, request: Request, recorder: Recorder | None = None) -> Running:
        """Start a request on the free sequence whose cache holds most of its prompt (of those its client
        may reuse); its events are folded into recorder (a new one by default). A request refused
        (InputError, ContextOverflow, ...) raises, with nothing started; so does one not admitted (UsageError)."""
        session = self.session
        if not self.admits(request):
            raise UsageError("this request's LoRA scales differ from those of the requests generating now: add it"
                             " once they end (Scheduler.admits)", setting="lora")
        prepared = session.prepare(request)
        sequence = session.sequence_for(prepared.tokens, busy=self.running, client=request.client)
        self._together.add(sequence, session.generation(prepared, sequence, self))
        running = self.running[sequence] = Running(request, sequence, request.drafting or session.mode,
                                                   len(prepared.prediction or ()),
                                                   prepared.tool_format, recorder or Recorder(), prepared.tokens)
        return running

    def drop(self, running: Running) -> None:
        """Stop a generation (its client left): its cache stays a prefix, for whoever takes the sequence next."""
        self._together.drop(running.sequence)
        self.running.pop(running.sequence, None)

    def step(self) -> Iterator[tuple[Running, object]]:
        """(running, item) for each event of each generation in this step, folded into its recorder first;
        ENDED for one that ended; the exception for one that failed. Either way it is no longer running."""
        for sequence, item in self._together.step():
            running = self.running[sequence]
            if item is ENDED or isinstance(item, BaseException):
                del self.running[sequence]
                if isinstance(item, BaseException) and not isinstance(item, (InputError, UsageError)):
                    self.session.reset(sequence)  # the next request on it reads its prompt from scratch
            else:
                running.recorder.add(item)
            yield running, item
