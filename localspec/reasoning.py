"""Reasoning models: how a model's chat template has it write its thinking, and a reply split, as it streams,
into the thinking, the answer and (gpt-oss) its tool calls.

Recognised, from the chat template (docs/models.md lists the registry's families):

* `<think>` ... `</think>` (THINK): Qwen3, Qwen3.5/3.6, QwQ, DeepSeek-R1 and its distills, GLM-4.5. Where the
  template opens the block itself (its generation prompt ends with `<think>`), the reply starts inside it.
  Gemma 4's `<|channel>thought` ... `<channel|>`, Seed-OSS's `<seed:think>` ... `</seed:think>`, MiniMax-M3's
  `<mm:think>` ... `</mm:think>` and Hy3's `<think:opensource>` ... `</think:opensource>` alike, and
  Mistral's `[THINK]` ... `[/THINK]` (Magistral's, Ministral 3 Reasoning's: control tokens), and
  Apriel's, which its template opens with `Here are my reasoning steps:` and the model ends with
  `[BEGIN FINAL RESPONSE]`, and Command R7B's plan, `<|START_THINKING|>` ... `<|END_THINKING|>` (control tokens;
  its answer's `<|START_RESPONSE|>` and `<|END_RESPONSE|>` are left out as every other control token is).
* XTML (XTML): Kimi K3. Every part of a reply is a section, `<|open|>NAME ATTRIBUTES<|sep|>` ... `<|close|>NAME<|sep|>`
  (the markers control tokens, the names words): the thinking a `think` section, the answer a `response`, the calls a
  `tools` section, all inside the assistant's `message`. The prompt opens `think` (or, thinking off, `response`).
* channels (CHANNELS): Solar Open. Each message is `<|begin|>assistant<|CHANNEL|>` TEXT `<|end|>`: `think` the
  thinking, `content` the answer, `tool_calls` its calls (handed on in the answer as written, for tool_calls.py).
* addressed (ADDRESSED): Muse Glimmer. Each message is `<|start|>assistant to=RECIPIENT<|message|>` TEXT `<|eom|>`
  (`<|eot|>` the last): to `self` the thinking, to `user` the answer, to a tool its call (handed on as written).
* harmony (HARMONY): gpt-oss. Each message is `<|channel|>NAME[ to=RECIPIENT][<|constrain|>FORMAT]<|message|>`
  TEXT `<|end|>` (the last ends with `<|return|>`, or `<|call|>` for a tool call): the analysis channel is the
  thinking, final the answer, commentary addressed `to=functions.NAME` a call of that tool. It is read here
  rather than with the openai-harmony package: that parser decodes its own token ids with OpenAI's o200k
  vocabulary, which it downloads on first use (an offline machine has none), where a GGUF's tokens reach
  localspec as text already; llama.cpp and Ollama read harmony as text too.

A splitter never holds back more than its longest marker, less one character, of text it could show (a
reply's opening white space aside, where the opening marker may still come).
"""

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from enum import StrEnum
from time import perf_counter

from .events import Done, Prefill, Token


class Part(StrEnum):
    THINKING = "thinking"
    ANSWER = "answer"
    TOOL = "tool"  # harmony's commentary addressed to a function: a call, handed on in the answer's text


@dataclass(frozen=True)
class Piece:
    """Text of one part of a reply; name: the tool whose call the text belongs to (harmony)."""

    part: Part
    text: str
    name: str | None = None


class ReasoningFormat(StrEnum):
    NONE = "none"  # the template shows no thinking that localspec reads: a reply is all answer
    THINK = "think"  # a block between two markers at the reply's start
    HARMONY = "harmony"
    XTML = "xtml"
    CHANNELS = "channels"
    ADDRESSED = "addressed"


@dataclass(frozen=True)
class Family:
    """How one family of templates has its models think: the format, and a block's markers (THINK)."""

    name: str
    format: ReasoningFormat
    open: str = ""
    close: str = ""
    # the text that ends the thinking for the model, where a budget runs out (what llama.cpp forces)
    closing: str = ""
    channel: str = ""  # the word after the opening marker that names the block (Gemma 4's `thought`)
    answer: tuple[str, str] = ("", "")  # markers around the answer, left out of it (Granite 3.3's <response>)
    # what opens the answer at once where thinking cannot be switched off (gpt-oss's final channel)
    answer_now: str = ""
    # its template reads an earlier turn's thinking only as a content block of type `thinking` (Mistral's)
    earlier_in_blocks: bool = False


THINK = Family("think", ReasoningFormat.THINK, "<think>", "</think>", "</think>")
# MiniMax-M3: `<mm:think>` ... `</mm:think>` (its switch `thinking_mode`: enabled, disabled or, by default, adaptive)
MINIMAX_M3 = Family("minimax-m3", ReasoningFormat.THINK, "<mm:think>", "</mm:think>", "</mm:think>")
# Hy3: `<think:opensource>` ... `</think:opensource>` (its template's markers carry that suffix); its switch its
# reasoning_effort, `no_think` (its default), `low` or `high`
HY3 = Family("hy3", ReasoningFormat.THINK, "<think:opensource>", "</think:opensource>", "</think:opensource>")
# Granite 3.3: asked to think (its switch `thinking`), it writes <think> ... </think><response> ... </response>
GRANITE = Family("granite", ReasoningFormat.THINK, "<think>", "</think>", "</think>", answer=("<response>", "</response>"))
# Magistral's and Ministral 3 Reasoning's: `[THINK]` ... `[/THINK]` (control tokens), which its default system
# prompt asks for (no switch)
MISTRAL = Family("mistral", ReasoningFormat.THINK, "[THINK]", "[/THINK]", "[/THINK]", earlier_in_blocks=True)
# Seed-OSS: `<seed:think>` ... `</seed:think>` (its budget's reflections, `<seed:cot_budget_reflect>`, inside)
SEED = Family("seed", ReasoningFormat.THINK, "<seed:think>", "</seed:think>", "</seed:think>")
# Apriel: its template opens the thinking with words, the model ends it with a marker of words
APRIEL = Family("apriel", ReasoningFormat.THINK, "Here are my reasoning steps:", "[BEGIN FINAL RESPONSE]",
                "\n[BEGIN FINAL RESPONSE]\n")
# Command R7B: the plan its template asks for before tool calls
COMMAND_R7B = Family("command-r7b", ReasoningFormat.THINK, "<|START_THINKING|>", "<|END_THINKING|>", "<|END_THINKING|>")
# Gemma 4: `<|channel>thought` ... `<channel|>` (its template strips earlier turns' thinking by those markers)
GEMMA4 = Family("gemma4", ReasoningFormat.THINK, "<|channel>", "<channel|>", "<channel|>", "thought")
HARMONY = Family("harmony", ReasoningFormat.HARMONY, closing="<|end|><|start|>assistant<|channel|>final<|message|>",
                 answer_now="<|channel|>final<|message|>")
# Muse Glimmer's messages, each addressed: `<|start|>assistant to=RECIPIENT<|message|>` TEXT `<|eom|>` (`<|eot|>` the
# turn's last): to=self the thinking, to=user the answer, to=a tool its call (ATEM markup, handed on as written)
MUSE_MARKERS = ("<|start|>", "<|message|>", "<|eom|>", "<|eot|>")
MUSE = Family("muse-glimmer", ReasoningFormat.ADDRESSED, " to=", closing="<|eom|><|start|>assistant to=user<|message|>",
              answer_now=" to=user<|message|>")  # (open: a grammar that spells an address shapes the messages)
# Kimi K3's XTML: a section's markers (its name and attributes between the first two or the last two)
XTML_OPEN, XTML_CLOSE, XTML_SEP = "<|open|>", "<|close|>", "<|sep|>"
XTML_MARKERS = (XTML_OPEN, XTML_CLOSE, XTML_SEP)
KIMI_K3 = Family("kimi-k3", ReasoningFormat.XTML, f"{XTML_OPEN}think{XTML_SEP}", f"{XTML_CLOSE}think{XTML_SEP}",
                 f"{XTML_CLOSE}think{XTML_SEP}{XTML_OPEN}response{XTML_SEP}")
# (a section's name and attributes: a longer text between its markers is a model's that left the form)
_LONGEST_TAG = 256
_LONGEST_ROLE = 32  # (Solar Open's header: `assistant`, as its template writes it)
# Solar Open's messages: a channel's marker after the role opens each, `<|end|>` ends it (its reply's end `<|flush|>`
# or, after calls, `<|calls|>`: the tokens llama.cpp ends its generation at)
SOLAR_BEGIN, SOLAR_END, SOLAR_CHANNELS = "<|begin|>", "<|end|>", ("<|think|>", "<|content|>", "<|tool_calls|>")
SOLAR = Family("solar-open", ReasoningFormat.CHANNELS, "<|think|>", SOLAR_END,
               f"{SOLAR_END}{SOLAR_BEGIN}assistant<|content|>")
NONE = Family("none", ReasoningFormat.NONE)
HARMONY_MARKERS = ("<|start|>", "<|channel|>", "<|constrain|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>")
# a harmony tool call (commentary to=functions.NAME) as the answer's text carries it: the form tool_calls.py
# reads as HARMONY (Hermes' block), so that every protocol's tool_calls come of it as of any other family's
CALL_OPENING, CALL_CLOSING = '<tool_call>{{"name": {name}, "arguments": ', "}</tool_call>"


def family(template: str | None) -> Family:
    """How the chat template has the model write its thinking."""
    source = template or ""
    if "<|channel|>" in source and "<|message|>" in source:
        return HARMONY
    if " to=self<|message|>" in source:
        return MUSE
    if "<|channel>" in source and "<channel|>" in source:
        return GEMMA4
    if all(marker in source for marker in XTML_MARKERS) and "'think'" in source:
        return KIMI_K3
    if f"{SOLAR_BEGIN}assistant<|think|>" in source and "<|content|>" in source:
        return SOLAR
    if SEED.open in source and SEED.close in source:
        return SEED
    if MISTRAL.open in source and MISTRAL.close in source:
        return MISTRAL
    if APRIEL.open in source and APRIEL.close in source:
        return APRIEL
    if COMMAND_R7B.open in source and COMMAND_R7B.close in source:
        return COMMAND_R7B
    if "<think></think>" in source and "<response></response>" in source:
        return GRANITE
    if f"'{MINIMAX_M3.open}'" in source and f"'{MINIMAX_M3.close}'" in source:
        return MINIMAX_M3
    if "set HYTK = ':opensource'" in source and "'<think{}>'" in source:
        return HY3
    if THINK.open in source and THINK.close in source:
        return THINK
    return NONE


# What a template that has its model think in a form not read here shows of it (a [THINK] it never closes, a
# switch or field of its own)
_THINKING_HINTS = ("[THINK]", "enable_thinking", "reasoning_content", "thinking")


def unread_thinking(template: str | None) -> str | None:
    """What shows that a template has its model think in a form localspec does not split (None: none does)."""
    if family(template) is not NONE:
        return None
    return next((hint for hint in _THINKING_HINTS if hint in (template or "")), None)


def _held(text: str, marker: str) -> int:
    """How many characters at the end of text could begin the marker."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


class ThinkSplitter:
    """`<think>` ... `</think>` at the start of a reply, then the answer. opened: the prompt ended inside the
    block (the template opened it), so the reply starts in the thinking."""

    def __init__(self, opened: bool = False, markers: Family = THINK, answering: bool = False):
        """answering: the prompt closed the block itself (thinking turned off): the reply is answer."""
        self.open, self.close, self.channel = markers.open, markers.close, markers.channel
        self._state = "closed" if answering else "opened" if opened else "start"
        self._pending = ""
        self.answer_open, self.answer_close = markers.answer

    @property
    def thinking(self) -> bool:
        """Whether the text fed next is (so far) thinking."""
        return self._state in ("opened", "thinking")

    @property
    def held(self) -> int:
        """Characters fed and not yet shown in a piece (nor read as a marker)."""
        return len(self._pending)

    def feed(self, text: str, special: bool = False) -> list[Piece]:
        """The pieces this text completes. special: the text of a control token, which is shown only as a marker."""
        if special and text not in self.open and text not in self.close:
            return []  # a control token shown only where it is (part of) a marker
        self._pending += text
        return list(self._scan(final=False))

    def finish(self, stopped: bool = True) -> list[Piece]:
        """What is held back, at the reply's end (a reply cut off inside its thinking ends there). stopped:
        the model ended it (not a limit)."""
        return list(self._scan(final=True))

    def _scan(self, final: bool) -> Iterator[Piece]:
        while self._pending:
            if self._state == "thinking":
                if self.close[0] not in self._pending:  # (most text: no marker in it, nor the start of one)
                    yield Piece(Part.THINKING, self._pending)
                    self._pending = ""
                    return
                at = self._pending.find(self.close)
                if at >= 0:
                    yield from self._out(Part.THINKING, self._pending[:at])
                    self._pending, self._state = self._pending[at + len(self.close):], "closed"
                    continue
                shown = len(self._pending) - (0 if final else _held(self._pending, self.close))
                yield from self._out(Part.THINKING, self._pending[:shown])
                self._pending = self._pending[shown:]
                return
            if self._state == "start":  # no answer yet: white space, then perhaps the opening marker
                stripped = self._pending.lstrip()
                if stripped.startswith(self.open):
                    self._pending, self._state = stripped[len(self.open):], "opened"
                    continue
                # (white space beyond twice the marker's length is no model's opening)
                if not final and self.open.startswith(stripped) and len(self._pending) <= 2 * len(self.open):
                    return
                self._state = "answer"
                continue
            if self._state in ("opened", "closed"):  # white space at either end of the block is the template's
                self._pending = self._pending.lstrip()
                # and the block's name after its opening, or the answer's own opening after the block
                word = self.channel if self._state == "opened" else self.answer_open
                if word:
                    if not final and word.startswith(self._pending):
                        return
                    self._pending = self._pending.removeprefix(word).lstrip()
                if not self._pending:
                    return
                self._state = "thinking" if self._state == "opened" else "answer"
                continue
            if not self.answer_close:
                yield from self._out(Part.ANSWER, self._pending)
                self._pending = ""
                return
            at = self._pending.find(self.answer_close)  # (the answer's own closing: left out, as the rest is text)
            if at >= 0:
                yield from self._out(Part.ANSWER, self._pending[:at])
                self._pending = self._pending[at + len(self.answer_close):]
                continue
            shown = len(self._pending) - (0 if final else _held(self._pending, self.answer_close))
            yield from self._out(Part.ANSWER, self._pending[:shown])
            self._pending = self._pending[shown:]
            return

    @staticmethod
    def _out(part: Part, text: str) -> Iterator[Piece]:
        if text:
            yield Piece(part, text)


class XtmlSplitter:
    """Kimi K3's sections: `think`'s text is the thinking, `response`'s the answer; a `tools` section is handed on
    in the answer as written, markers and all, for tool_calls.py to read; the `message` around them is left out.
    opened: the prompt opened `think`; answering: it opened `response` (thinking off)."""

    def __init__(self, opened: bool = False, answering: bool = False):
        self._pending = ""
        self._section = "think" if opened else "response" if answering else ""  # "": between sections
        self._tag: tuple[str, str] | None = None  # (marker, text so far) of a section's marker being read

    @property
    def thinking(self) -> bool:
        return self._section == "think"

    @property
    def held(self) -> int:
        return len(self._pending) + (len(self._tag[0] + self._tag[1]) if self._tag else 0)

    def feed(self, text: str, special: bool = False) -> list[Piece]:
        if special and text not in XTML_MARKERS:
            return []
        self._pending += text
        return list(self._scan(final=False))

    def finish(self, stopped: bool = True) -> list[Piece]:
        pieces = list(self._scan(final=True))
        if self._tag is not None:  # a marker cut off: its text, as written
            marker, written = self._tag
            self._tag = None
            pieces += self._text(marker + written)
        return pieces

    def _scan(self, final: bool) -> Iterator[Piece]:
        while self._pending:
            if self._tag is not None:
                marker, written = self._tag
                written, self._pending = written + self._pending, ""
                at = written.find(XTML_SEP)
                if at < 0 and len(written) <= _LONGEST_TAG:
                    self._tag = (marker, written)
                    return
                self._tag = None
                if at < 0:  # no section's marker: text, as written
                    yield from self._text(marker + written)
                    return
                self._pending = written[at + len(XTML_SEP):]
                yield from self._marked(marker, written[:at])
                continue
            found = [(at, marker) for marker in (XTML_OPEN, XTML_CLOSE) if (at := self._pending.find(marker)) >= 0]
            if found:
                at, marker = min(found)
                yield from self._text(self._pending[:at])
                self._tag, self._pending = (marker, ""), self._pending[at + len(marker):]
                continue
            shown = len(self._pending) - (0 if final else max(_held(self._pending, m) for m in XTML_MARKERS))
            yield from self._text(self._pending[:shown])
            self._pending = self._pending[shown:]
            return

    def _text(self, text: str) -> Iterator[Piece]:
        if not text or (not self._section and not text.strip()):  # (white space between sections is layout)
            return
        yield Piece(Part.THINKING if self._section == "think" else Part.ANSWER, text)

    def _marked(self, marker: str, tag: str) -> Iterator[Piece]:
        name = tag.split(" ", 1)[0]
        if self._section == "tools" or name == "tools":  # the calls, as written, for their reader
            yield Piece(Part.ANSWER, marker + tag + XTML_SEP)
            if name == "tools":
                self._section = "tools" if marker == XTML_OPEN else ""
            return
        if name in ("think", "response"):
            self._section = name if marker == XTML_OPEN else ""
        elif name != "message":  # (the message around the sections is left out; any other is text)
            yield from self._text(marker + tag + XTML_SEP)


class _MarkerSplitter:
    """A reply read by its markers as it streams: the text between them handed to _text, each marker to _marker;
    never more than a marker's beginning held back."""

    MARKERS: tuple[str, ...] = ()

    def __init__(self):
        self._pending = ""

    @property
    def held(self) -> int:
        return len(self._pending)

    def feed(self, text: str, special: bool = False) -> list[Piece]:
        """special: the text of a control token, which is read only where it is one of the markers."""
        if special and not self._takes(text):
            return []
        self._pending += text
        return list(self._scan(final=False))

    def _takes(self, special: str) -> bool:
        return special in self.MARKERS

    def _scan(self, final: bool) -> Iterator[Piece]:
        while self._pending:
            if not any(marker[0] in self._pending for marker in self.MARKERS):  # (most text: shown at once)
                yield from self._text(self._pending)
                self._pending = ""
                return
            found = [(at, marker) for marker in self.MARKERS if (at := self._pending.find(marker)) >= 0]
            if found:
                at, marker = min(found)
                yield from self._text(self._pending[:at])
                self._pending = self._pending[at + len(marker):]
                yield from self._marker(marker)
                continue
            shown = len(self._pending) - (0 if final else max(_held(self._pending, m) for m in self.MARKERS))
            yield from self._text(self._pending[:shown])
            self._pending = self._pending[shown:]
            return

    def _text(self, text: str) -> Iterator[Piece]:
        raise NotImplementedError

    def _marker(self, marker: str) -> Iterator[Piece]:
        raise NotImplementedError


class ChannelSplitter(_MarkerSplitter):
    """Solar Open's messages, the first opened by the prompt's `<|begin|>assistant`: `think`'s text is the thinking,
    `content`'s the answer; `tool_calls`' handed on in the answer as written, marker and all, for tool_calls.py to
    read; a message's role, after `<|begin|>`, is left out."""

    MARKERS = (SOLAR_BEGIN, SOLAR_END, *SOLAR_CHANNELS)

    def __init__(self, answering: bool = False):
        """answering: the reply goes on inside a `content` message (a prefill)."""
        super().__init__()
        # None: in a message's header (its role), before its channel
        self._channel: str | None = "<|content|>" if answering else None
        self._role = ""  # the header's text so far

    @property
    def thinking(self) -> bool:
        return self._channel == "<|think|>"

    def _takes(self, special: str) -> bool:
        return special in self.MARKERS or self._channel == "<|tool_calls|>"  # (the calls' own markers too)

    def finish(self, stopped: bool = True) -> list[Piece]:
        pieces = list(self._scan(final=True))
        # (a reply the model ended without naming a channel: one that left the form; a limit cuts a role short)
        role, self._role = self._role, ""
        return pieces + ([Piece(Part.ANSWER, role)] if stopped and self._channel is None and role.strip() else [])

    def _marker(self, marker: str) -> Iterator[Piece]:
        if self._channel == "<|tool_calls|>":  # (the calls run to the reply's end)
            yield Piece(Part.ANSWER, marker)
        elif marker == SOLAR_BEGIN:
            self._channel, self._role = None, ""
        elif marker == SOLAR_END:
            self._channel = ""
        else:
            self._channel = marker
            if marker == "<|tool_calls|>":
                yield Piece(Part.ANSWER, marker)

    def _text(self, text: str) -> Iterator[Piece]:
        if self._channel is None:  # a message's role; one longer than a role is a model's that left the form
            self._role += text
            if len(self._role) <= _LONGEST_ROLE:
                return
            self._channel, text, self._role = "<|content|>", self._role, ""
        if not text or (not self._channel and not text.strip()):  # (white space between messages is layout)
            return
        yield Piece(Part.THINKING if self._channel == "<|think|>" else Part.ANSWER, text)


class AddressedSplitter(_MarkerSplitter):
    """Muse Glimmer's messages, the first's header begun by the prompt's `<|start|>assistant`: a message to `self` is
    the thinking, one to `user` (or to no one) the answer, one to a tool handed on in the answer as written, for
    tool_calls.py to read; headers and markers left out. answering: the prompt addressed the answer itself."""

    MARKERS = MUSE_MARKERS

    def __init__(self, answering: bool = False):
        super().__init__()
        self._header: str | None = None if answering else ""  # while a message's header is read; None in its text
        self._part = Part.ANSWER

    @property
    def thinking(self) -> bool:
        return self._header is None and self._part is Part.THINKING

    @property
    def held(self) -> int:
        return len(self._pending) + len(self._header or "")

    def finish(self, stopped: bool = True) -> list[Piece]:
        pieces = list(self._scan(final=True))
        header, self._header = self._header, None  # (a reply that addressed no one: a model that left the form)
        return pieces + ([Piece(Part.ANSWER, header)] if stopped and header and header.strip() else [])

    def _marker(self, marker: str) -> Iterator[Piece]:
        if marker == "<|message|>" and self._header is not None:
            recipient = _RECIPIENT.search(self._header)
            self._part = Part.THINKING if recipient and recipient.group(1) == "self" else Part.ANSWER
            self._header = None
        elif marker != "<|message|>":  # a message's end, or the next one's start: its header comes
            self._header = ""
        return iter(())

    def _text(self, text: str) -> Iterator[Piece]:
        if self._header is None:
            if text:
                yield Piece(self._part, text)
            return
        self._header += text
        if len(self._header) > _LONGEST_HEADER:  # no header: a reply written without addresses is answer
            header, self._header, self._part = self._header, None, Part.ANSWER
            yield Piece(Part.ANSWER, header)


_RECIPIENT = re.compile(r"\bto=(\S+?)(?=\s|<\||$)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
# header text with no harmony marker in it beyond this is no header: a reply written without harmony is answer
_LONGEST_HEADER = 512


class HarmonySplitter(_MarkerSplitter):
    """gpt-oss's harmony messages, as generated after the prompt's `<|start|>assistant`. llama.cpp shows
    `<|channel|>`, `<|message|>`, `<|start|>` and `<|constrain|>` as text; `<|end|>` comes as a control token.
    answering: the prompt opened the final channel's message itself (thinking turned off)."""

    MARKERS = HARMONY_MARKERS

    def __init__(self, answering: bool = False):
        super().__init__()
        self._header = ""  # of the message being opened: read once its <|message|> comes
        self._body: Part | None = Part.ANSWER if answering else None  # None while in a header
        self._tool: str | None = None
        # the part of the latest message (a header's tokens count in the part of the message before it)
        self.last = Part.ANSWER if answering else Part.THINKING

    @property
    def thinking(self) -> bool:
        return self.last is Part.THINKING

    def finish(self, stopped: bool = True) -> list[Piece]:
        """stopped: the model ended the reply, a call's <|call|> among the ways (a call a limit cut off stays
        open, for tool_calls.py to refuse as unfinished)."""
        pieces = list(self._scan(final=True)) + (self._end_of_call() if stopped else [])
        header, self._header = self._header, ""
        # a reply that never opened a message (a model that ignores harmony) is all answer
        return pieces + ([Piece(Part.ANSWER, header)] if header.strip() and "<|" not in header else [])

    def _text(self, text: str) -> Iterator[Piece]:
        if not text:
            return
        if self._body is Part.TOOL:  # the arguments of a call, in the form tool_calls.py reads (its HARMONY)
            yield Piece(Part.ANSWER, text, self._tool)
            return
        if self._body is not None:
            yield Piece(self._body, text, self._tool)
            return
        self._header += text
        if len(self._header) > _LONGEST_HEADER and "<|" not in self._header:  # not harmony at all
            self._body = self.last = Part.ANSWER
            header, self._header = self._header, ""
            yield Piece(Part.ANSWER, header)

    def _end_of_call(self) -> list[Piece]:
        if self._body is not Part.TOOL:
            return []
        self._body = None
        return [Piece(Part.ANSWER, CALL_CLOSING, self._tool)]

    def _marker(self, marker: str) -> Iterator[Piece]:
        if marker == "<|message|>" and self._body is None:
            channel = _CHANNEL.search(self._header)
            recipient = _RECIPIENT.search(self._header)
            if recipient and recipient.group(1).startswith("functions."):
                self._body, self._tool = Part.TOOL, recipient.group(1).removeprefix("functions.")
                yield Piece(Part.ANSWER, CALL_OPENING.format(name=json.dumps(self._tool)), self._tool)
            else:
                analysis = channel is not None and channel.group(1) == "analysis"
                self._body, self._tool = (Part.THINKING if analysis else Part.ANSWER), None
            self.last, self._header = Part.ANSWER if self._body is Part.TOOL else self._body, ""
        elif marker in ("<|end|>", "<|return|>", "<|call|>", "<|start|>"):
            yield from self._end_of_call()
            self._body, self._tool, self._header = None, None, ""
        elif self._body is None:
            self._header += marker


def _texts(pieces: list[Piece]) -> tuple[str, str]:
    """(answer, thinking) text of these pieces."""
    if len(pieces) == 1:  # (a token's text is most often one piece)
        piece = pieces[0]
        return ("", piece.text) if piece.part is Part.THINKING else (piece.text, "")
    return ("".join(p.text for p in pieces if p.part is not Part.THINKING),
            "".join(p.text for p in pieces if p.part is Part.THINKING))


@dataclass(frozen=True)
class Plan:
    """How a prepared request's reply is split. opened: the prompt ends inside the thinking (the template
    opened the block); answering: the prompt ends past it (thinking turned off); budget: most tokens of
    thinking (None: no limit), after which `closing` (the family's closing text, as tokens) is added for the
    model and it answers."""

    family: Family
    opened: bool = False
    answering: bool = False
    budget: int | None = None
    closing: tuple[int, ...] = ()

    def past_thinking(self, triggers: tuple[str, ...]) -> tuple[str, ...]:
        """A lazy grammar's triggers (tool calls) as they are to count in this reply: only past its thinking
        block, as llama.cpp's patterns for thinking models have it. Thinking that plans a call spells its
        opening as often as not; set off there, the grammar held the thinking to a call that then ended
        the reply inside the block, so that nothing came back as a call."""
        family = self.family
        if family.format is not ReasoningFormat.THINK or self.answering or not triggers:
            return triggers
        opening, closing = re.escape(family.open), re.escape(family.close)
        # the block the prompt opened; else one the reply opens, or none at all (an answer at once)
        thought = (rf"[\s\S]*?{closing}" if self.opened
                   else rf"(?:\s*{opening}[\s\S]*?{closing}|(?!\s*{opening}))")
        return tuple(rf"^{thought}(?:{trigger[1:-1]})$" if trigger.startswith("^") and trigger.endswith("$")
                     else rf"^{thought}[\s\S]*?(?:{trigger})[\s\S]*$" for trigger in triggers)

    def splitter(self) -> "ThinkSplitter | HarmonySplitter | XtmlSplitter | ChannelSplitter | AddressedSplitter":
        if self.family.format is ReasoningFormat.HARMONY:
            return HarmonySplitter(self.answering)
        if self.family.format is ReasoningFormat.XTML:
            return XtmlSplitter(self.opened, self.answering)
        if self.family.format is ReasoningFormat.CHANNELS:
            return ChannelSplitter(self.answering)
        if self.family.format is ReasoningFormat.ADDRESSED:
            return AddressedSplitter(self.answering)
        return ThinkSplitter(self.opened, self.family, self.answering)


def split(events: Iterator, plan: Plan, control_text: Callable[[int], str | None],
          go_on: Callable[[list[int]], Iterator]) -> Iterator:
    """A reasoning model's generation with each Token's text split into its thinking (thought) and answer
    (text), Turns passed through. control_text(token): a control token's own text (None for any other);
    go_on(made): the events of the generation going on after the tokens made so far (the budget's closing
    among them), as one more generation on the same sequence whose prompt is all but read already."""
    splitter = plan.splitter()
    made: list[int] = []
    thought_tokens = 0
    started, went_on = perf_counter(), False
    while True:
        over_budget = False
        for event in events:
            if isinstance(event, Prefill):
                if went_on:
                    continue  # (the tokens the reply made so far, as the prompt of the generation going on)
                started = perf_counter()
            elif isinstance(event, Token):
                made.append(event.id)
                event = _split_token(event, splitter, control_text)
                thought_tokens += event.thinking
                yield event
                over_budget = plan.budget is not None and splitter.thinking and thought_tokens >= plan.budget
                if over_budget:
                    break
                continue
            elif isinstance(event, Done):
                answer, thought = _texts(splitter.feed(event.tail) + splitter.finish(event.finish_reason == "stop"))
                event = replace(event, tail=answer, thought_tail=thought,
                                decode_seconds=perf_counter() - started if went_on else event.decode_seconds)
            yield event
        if not over_budget:
            return
        events.close()
        for number, token in enumerate(plan.closing):  # what the model is made to write: the end of its thinking
            made.append(token)
            answer, thought = _texts(splitter.feed(plan.family.closing) if number == 0 else [])
            yield Token(token, answer, False, thought, thinking=True)
        plan = replace(plan, budget=None)
        events, went_on = go_on(made), True


def _split_token(token: Token, splitter, control_text: Callable[[int], str | None]) -> Token:
    before = splitter.thinking
    special = control_text(token.id)
    # (a control token that marks a tool-call form's calls carries its text already: tool_calls.shown() wrote it)
    pieces = splitter.feed(special, True) if special is not None and not token.text else splitter.feed(token.text)
    answer, thought = _texts(pieces)
    return Token(token.id, answer, token.from_draft, thought, before or splitter.thinking, token.logprobs)
