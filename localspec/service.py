"""One loaded pair serving many clients, free of any web framework.

Requests run on a worker thread that owns the session (llama.cpp contexts are not shared between
threads), as many at once as the session has sequences (serve -np), in arrival order: each step
decodes every running request's rows in one batch, and a request that arrives joins at the next step
(the library's Scheduler). A few may wait for a sequence, more are refused. A client that goes away
cancels its request at the next step, and its sequence takes the next request. A sequence's KV cache
keeps what its previous request shared with the next, as in a chat; a request goes to the free
sequence whose cache shares most of its prompt. The counters /metrics shows are folded here, from
each request's events, in total and per sequence.
"""

import functools
import math
import queue
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from time import monotonic, perf_counter

from .config import DrafterKind
from .errors import EngineError, LocalspecError
from .request import Request
from .scheduler import ENDED, Running, Scheduler
from .session import Session
from .stats import ANSWER, THINKING, Recorder
from .tool_calls import ToolFormat

# What a job delivers after its last event or its error: nothing more will come.
FINISHED = "finished"
# Seconds of embedding a request's inputs before the requests waiting and running go on (about a step's
# worth of waiting for a request that streams)
EMBEDDING_SLICE = 0.25


class Busy(LocalspecError):
    """As many requests wait as may (or as many of this client's as may): come back in retry_after seconds."""

    def __init__(self, waiting: int, retry_after: int, held: int | None = None):
        super().__init__(f"{waiting} requests are already waiting for this model; retry in {retry_after} s"
                         if held is None else
                         f"this client has {held} requests running or waiting for this model, the most one client"
                         f" may hold while the rest is kept for others; retry in {retry_after} s")
        self.retry_after = retry_after


class Closing(LocalspecError):
    """The server is shutting down."""


class WorkerStopped(EngineError):
    """The generation worker stopped on a fault of its own: this model cannot generate any more, and
    serve exits so that a supervisor can start it again."""


@dataclass(frozen=True)
class Embedding:
    """Texts (or token id lists) to embed, instead of generating; client as a Request's. With a query, the inputs
    are documents a reranker scores against it (one score each), as llama.cpp ranks by pooling."""

    inputs: list
    client: str | None = None
    query: str | None = None
    most_document_tokens: int | None = None  # a ranking's documents are cut to this many tokens each
    norm: int = 2  # how each vector is normalized, and its first dimensions kept (Session.embed)
    dimensions: int | None = None
    truncate: bool = False  # an input longer than the context is cut to it (Ollama's), rather than refused


@dataclass(frozen=True)
class SlotAction:
    """llama-server's save, restore or erase of one sequence's cache (POST /slots/ID?action=), done on the worker
    between steps once no request generates on that sequence, as llama-server defers it; client as a Request's."""

    sequence: int
    action: str  # save, restore, erase
    path: Path | None = None
    client: str | None = None


class Job:
    """A request on its way through the service. deliver(item) receives each event, then any
    error, then FINISHED; it is called on the worker thread."""

    def __init__(self, request: Request | Embedding, deliver: Callable, who: str | None = None):
        self.request = request
        self.deliver = deliver
        self.who = who  # the client it came from (Service.submit)
        self.recorder = Recorder()
        self.running: Running | None = None  # once it generates
        self.outcome = "cancelled"  # or "ok", "error"
        self.embeddings: list = []  # an embedding request's vectors (a ranking's scores), and the tokens it read
        self.embedded_tokens = 0
        self.embedding_inputs: list[list[int]] | None = None  # its inputs as tokens, once read
        self.acted: tuple[int, int] = (0, 0)  # a slot action's tokens and bytes saved, read or erased
        self.seconds = 0.0
        self.started = 0.0
        self._cancelled = threading.Event()

    @property
    def sequence(self) -> int | None:
        """The session's sequence it generates on, once it runs."""
        return self.running.sequence if self.running else None

    @property
    def drafting(self) -> DrafterKind | None:
        """The session's mode when it ran."""
        return self.running.drafting if self.running else None

    @property
    def tool_format(self) -> ToolFormat | None:
        """The form the model writes tool calls in, where it was offered tools."""
        return self.running.tool_format if self.running else None

    @property
    def prompt(self) -> list[int]:
        """Its prompt's tokens as read, once it runs."""
        return self.running.prompt if self.running else []

    @property
    def predicted(self) -> int:
        """The prediction's tokens."""
        return self.running.predicted if self.running else 0

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


class Service:
    def __init__(self, session: Session, queue_limit: int, log: Callable[[str], None], metrics: "Metrics | None" = None):
        """queue_limit: requests that may wait for a sequence; log: one line for the operator; metrics:
        where its requests are counted (shared by the services of several models)."""
        self.session = session
        self.queue_limit = queue_limit
        self.log = log
        self.metrics = metrics or Metrics()
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._pending = 0  # submitted and not finished: the running job and those waiting
        self._held: dict[str, int] = {}  # of those, each client's
        self.last_finished = monotonic()  # when a job last finished (or the service began)
        self._closing = False
        self._seconds_per_job: float | None = None
        self._running: dict[int, Job] = {}  # by the sequence each generates on
        self._next: Job | None = None  # taken from the queue, waiting for the running ones to end (Scheduler.admits)
        self.stopped: str | None = None  # why the worker stopped, if it did (one line)
        self._thread = threading.Thread(target=self._work, name="localspec-generation")
        self._thread.start()

    @property
    def pending(self) -> int:
        return self._pending

    @property
    def running(self) -> int:
        """Requests generating now (at most the session's sequences)."""
        return len(self._running)

    @property
    def closing(self) -> bool:
        return self._closing

    def submit(self, request: Request | Embedding, deliver: Callable, who: str | None = None) -> Job:
        """Queue a request behind those before it; Busy if the queue is full, or if `who` (the client: its
        API key, or its address) holds as many of the places (running and waiting) as one client may: all
        but a quarter of them, kept for others (one client could take every place, and the others got 429)."""
        with self._lock:
            if self.stopped:
                raise WorkerStopped(self.stopped)
            if self._closing:
                raise Closing("the server is shutting down")
            slots = len(self.session.sequences)
            places = self.queue_limit + slots
            # a place frees up when a running request ends: about a request's time, shared by the sequences
            retry = max(1, math.ceil((self._seconds_per_job or 1) / slots))
            if self._pending >= places:
                self.metrics.rejected += 1
                raise Busy(self._pending - slots, retry)
            held = self._held.get(who, 0)
            if who is not None and held >= self.most_held:
                self.metrics.rejected += 1
                raise Busy(self._pending - slots, retry, held)
            self._pending += 1
            if who is not None:
                self._held[who] = held + 1
        job = Job(request, deliver, who)
        self._jobs.put(job)
        return job

    @property
    def most_held(self) -> int:
        """How many requests one client may have running and waiting at once: all the places but a quarter, kept
        for others."""
        places = self.queue_limit + len(self.session.sequences)
        return places - places // 4

    def cancel_all(self) -> None:
        """Refuse new requests and cancel the running one and those waiting; returns at once (a signal
        handler calls it)."""
        with self._lock:
            self._closing = True
        with self._jobs.mutex:
            waiting = [self._next, *self._jobs.queue]
        for job in [*waiting, *list(self._running.values())]:
            if job is not None:
                job.cancel()

    def close(self) -> None:
        """cancel_all, then wait for the worker to end its current step and stop."""
        self.cancel_all()
        self._jobs.put(None)
        self._thread.join()

    def _work(self) -> None:
        try:
            self._serve_jobs()
        except BaseException as error:  # a fault outside any one request's generation: nothing runs any more
            self._stop_on(error)

    def _stop_on(self, error: BaseException) -> None:
        """Fail every request running and waiting with one line, and refuse those to come."""
        self.log("".join(traceback.format_exception(error)).rstrip())
        with self._lock:
            self.stopped = f"the generation worker stopped: {type(error).__name__}: {error}".splitlines()[0]
            self._closing = True
        jobs = list(self._running.values()) + ([self._next] if self._next else [])
        self._running.clear()
        self._next = None
        with self._jobs.mutex:
            jobs += [job for job in self._jobs.queue if job is not None]
            self._jobs.queue.clear()
        for job in jobs:
            job.outcome = "error"
            job.deliver(WorkerStopped(self.stopped))
            self._finish(job)

    def _serve_jobs(self) -> None:
        scheduler, stopping = Scheduler(self.session), False
        while not stopping or self._running:
            stopping = self._admit(scheduler, stopping)
            for running, item in scheduler.step():
                job = self._running[running.sequence]
                if item is ENDED:
                    job.outcome = "ok"
                    self._end(job)
                elif isinstance(item, BaseException):
                    self._fail(job, item)
                    self._end(job)
                else:
                    self.metrics.add(item, running.sequence)
                    job.deliver(item)
                    if job.cancelled:  # its client left: its events stop here (its cache stays a prefix)
                        scheduler.drop(running)
            for job in [job for job in self._running.values() if job.cancelled]:
                job.recorder.interrupt()
                scheduler.drop(job.running)
                self._end(job)

    def _admit(self, scheduler: Scheduler, stopping: bool) -> bool:
        """Start waiting requests on free sequences (waiting for one while none runs); True once close()
        said to stop."""
        while not stopping and not scheduler.full:
            try:
                job, self._next = self._next or self._jobs.get(block=not self._running), None
            except queue.Empty:
                break
            if job is None:
                return True
            if job.cancelled:  # its client left while it waited
                self._finish(job)
                continue
            if isinstance(job.request, Request) and not scheduler.admits(job.request):
                self._next = job  # (other LoRA scales: it, and those behind it, wait for the running ones to end)
                break
            if self._start(job, scheduler):
                break  # an embedding with inputs left: the generations running take their step first
        return stopping

    def _start(self, job: Job, scheduler: Scheduler) -> bool:
        """Start the request's generation (Scheduler.add); a request whose input is refused ends here, and an
        embedding request embeds for one slice (True where it has inputs left and is queued again)."""
        job.started = perf_counter()
        try:
            if isinstance(job.request, Embedding):
                return self._embed_some(job)
            if isinstance(job.request, SlotAction):
                return self._act(job)
            job.running = scheduler.add(job.request, job.recorder)
            self._running[job.running.sequence] = job
        except Exception as error:
            self._fail(job, error)
            self._finish(job)
        return False

    def _embed_some(self, job: Job) -> bool:
        """Embed the job's inputs for up to EMBEDDING_SLICE seconds; True, with the job queued again behind
        those waiting, where some are left: many inputs hold up other requests no longer than one slice at
        a time, and stop once their client has left."""
        asked, session = job.request, self.session
        if job.embedding_inputs is None:
            job.embedding_inputs = (session.prompts.embedding_inputs(asked.inputs, asked.truncate) if asked.query is None else
                                    session.ranking_inputs(asked.query, asked.inputs, asked.most_document_tokens))
            job.embedded_tokens = sum(map(len, job.embedding_inputs))
        pooled = (functools.partial(session.embed, norm=asked.norm, dimensions=asked.dimensions) if asked.query is None
                  else session.relevance)
        until = perf_counter() + EMBEDDING_SLICE
        while len(job.embeddings) < len(job.embedding_inputs) and not (job.cancelled or self._closing):
            job.embeddings.append(pooled(job.embedding_inputs[len(job.embeddings)]))
            if perf_counter() > until and len(job.embeddings) < len(job.embedding_inputs):
                self._jobs.put(job)
                return True
        # (its time is no guide to a generation's: Retry-After's estimate is left alone)
        job.outcome = "ok" if len(job.embeddings) == len(job.embedding_inputs) else "cancelled"
        self._finish(job)
        return False

    def _act(self, job: Job) -> bool:
        """A slot action, where no request generates on its sequence; True, with the job queued again behind those
        waiting, where one does."""
        action = job.request
        if action.sequence in self._running:
            self._jobs.put(job)
            return True
        session = self.session
        if action.action == "save":
            job.acted = session.save(action.sequence, action.path, action.client)
        elif action.action == "restore":
            job.acted = session.restore(action.sequence, action.path, action.client)
        else:
            job.acted = (session.erase(action.sequence), 0)
        job.seconds = perf_counter() - job.started
        job.outcome = "ok"
        self._finish(job)
        return False

    def running_now(self) -> dict[int, Job]:
        """The jobs generating now, by sequence (a copy, for another thread to read)."""
        return dict(self._running)

    def _fail(self, job: Job, error: BaseException) -> None:
        job.outcome = "error"
        if not isinstance(error, LocalspecError):  # a bug: the operator needs its traceback
            self.log("".join(traceback.format_exception(error)).rstrip())
            error = EngineError(f"internal error: {error}")
        job.deliver(error)

    def _end(self, job: Job) -> None:
        del self._running[job.sequence]
        job.seconds = perf_counter() - job.started
        if job.outcome == "ok":
            seconds = self._seconds_per_job
            self._seconds_per_job = job.seconds if seconds is None else 0.8 * seconds + 0.2 * job.seconds
        self._finish(job)

    def _finish(self, job: Job) -> None:
        self.metrics.finish(job)
        with self._lock:
            self._pending -= 1
            if job.who is not None:
                self._held[job.who] -= 1
                if not self._held[job.who]:
                    del self._held[job.who]
            self.last_finished = monotonic()
        job.deliver(FINISHED)


@dataclass
class Metrics:
    """Counters over every request served, for /metrics: one Recorder folds the events of all of them
    (the engine's events are counted in one place), and one each sequence's (serve -np), whose
    generations follow each other, so that the time they spent decoding adds up. Written by the worker,
    read by the server: guarded by the lock."""

    served: Recorder = field(default_factory=Recorder)
    sequences: dict[int, Recorder] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=lambda: {"ok": 0, "cancelled": 0, "error": 0})
    rejected: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, event, sequence: int = 0) -> None:
        with self.lock:
            self.served.add(event)
            self.sequences.setdefault(sequence, Recorder()).add(event)

    def finish(self, job: Job) -> None:
        with self.lock:
            self.requests[job.outcome] += 1
            if job.outcome != "ok" and job.sequence in self.sequences:  # its generation's decode time stops here
                self.sequences[job.sequence].interrupt()

    def prometheus(self, running: int, waiting: int, remembered: tuple[int, int] | None = None, loaded: int = 1) -> str:
        """The Prometheus text exposition format. remembered: the suffix caches' tokens and bytes, if
        the sessions keep them; loaded: the models loaded."""
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP localspec:{name} {help_text}")
            lines.append(f"# TYPE localspec:{name} {kind}")
            lines.extend(f"localspec:{name}{labels} {value}" for labels, value in samples)

        with self.lock:
            r = self.served
            metric("requests_total", "counter", "Requests answered, by outcome (cancelled: the client left).",
                   [(f'{{outcome="{outcome}"}}', n) for outcome, n in self.requests.items()])
            metric("requests_rejected_total", "counter", "Requests refused with 429 because the queue was full.",
                   [("", self.rejected)])
            metric("requests_running", "gauge", "Requests generating now (at most --parallel a model).",
                   [("", running)])
            metric("models_loaded", "gauge", "Models loaded (the one serve started with, and those asked for).",
                   [("", loaded)])
            metric("requests_waiting", "gauge", "Requests queued behind the running one.", [("", waiting)])
            metric("prompt_tokens_total", "counter", "Prompt tokens of all requests.", [("", r.prompt_tokens)])
            metric("prompt_tokens_cached_total", "counter",
                   "Prompt tokens found in the KV cache from the previous request, not computed again.",
                   [("", r.reused_prompt_tokens)])
            metric("generation_tokens_total", "counter", "Tokens generated.", [("", r.tokens)])
            metric("prompt_seconds_total", "counter", "Time spent reading prompts.", [("", r.prefill_seconds)])
            metric("decode_seconds_total", "counter", "Time spent generating, summed over the requests generating"
                   " at once.", [("", sum(recorder.decode_seconds for recorder in self.sequences.values()))])
            metric("decode_steps_total", "counter", "Target verification passes (one per token when plain).",
                   [("", r.steps)])
            metric("spec_decode_num_drafts_total", "counter", "Steps that verified a draft.",
                   [("", sum(tally.steps for tally in r.drafters.values()))])
            metric("spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.", [("", r.drafted)])
            metric("spec_decode_num_accepted_tokens_total", "counter", "Draft tokens the target accepted.",
                   [("", r.accepted)])
            metric("spec_decode_num_draft_tokens_per_pos_total", "counter",
                   "Drafts that reached each position (0: the first drafted token).",
                   [(f'{{position="{i}"}}', n) for i, n in enumerate(r.reached)])
            metric("spec_decode_num_accepted_tokens_per_pos_total", "counter",
                   "Draft tokens accepted at each position (0: the first drafted token).",
                   [(f'{{position="{i}"}}', n) for i, n in enumerate(r.kept)])
            by_sequence = sorted(self.sequences.items())
            for name, what, count in (("sequence_prompt_tokens_total", "Prompt tokens", "prompt_tokens"),
                                      ("sequence_prompt_tokens_cached_total", "Prompt tokens found in its cache",
                                       "reused_prompt_tokens"),
                                      ("sequence_generation_tokens_total", "Tokens generated", "tokens"),
                                      ("sequence_decode_seconds_total", "Time spent generating", "decode_seconds"),
                                      ("sequence_draft_tokens_total", "Draft tokens proposed", "drafted"),
                                      ("sequence_accepted_tokens_total", "Draft tokens accepted", "accepted")):
                metric(name, "counter", f"{what}, by sequence (serve -np's slot).",
                       [(f'{{sequence="{sequence}"}}', getattr(recorder, count)) for sequence, recorder in by_sequence])
            for name, what, count in (("part_tokens_total", "Tokens generated", "tokens"),
                                      ("part_steps_total", "Verification passes", "steps"),
                                      ("part_draft_tokens_total", "Draft tokens proposed", "drafted"),
                                      ("part_accepted_tokens_total", "Draft tokens accepted", "accepted"),
                                      ("part_seconds_total", "Time drafting and verifying", "seconds")):
                # (each sequence's recorder places its steps: the served one folds all sequences' interleaved)
                metric(name, "counter", f"{what}, by part of a reply: a reasoning model's thinking, and the answer.",
                       [(f'{{part="{part}"}}', sum(getattr(recorder.parts[part], count) for _, recorder in by_sequence))
                        for part in (THINKING, ANSWER)])
            for name, what, count in (("drafter_steps_total", "Steps that drafted", "steps"),
                                      ("drafter_draft_tokens_total", "Draft tokens proposed", "drafted"),
                                      ("drafter_accepted_tokens_total", "Draft tokens accepted", "accepted")):
                metric(name, "counter", f"{what}, by drafter.",
                       [(f'{{drafter="{kind}"}}', getattr(tally, count)) for kind, tally in r.drafters.items()])
        if remembered is not None:
            metric("suffix_cache_tokens", "gauge", "Tokens of earlier generations kept to draft from.",
                   [("", remembered[0])])
            metric("suffix_cache_bytes", "gauge", "Memory those tokens and their index take.", [("", remembered[1])])
        return "\n".join(lines) + "\n"
