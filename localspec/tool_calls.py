"""Tool calls: which form a model's chat template teaches it to write them in, a grammar that keeps
every call it starts well formed, and the calls read back out of its answer, whole or as it streams.

The tools reach the model through its own template (the `tools` variable), as Hugging Face renders
them; the answer is the model's own text, so each family's form is read here:

* hermes (Qwen2.5, Qwen3, Hermes): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block
  a call, after any text; or, as Qwen2.5-Coder writes them, an answer that is one such object (in a
  ```json fence or not), which llama.cpp reads as a call too;
* llama3 (Llama 3.1-3.3): the whole answer is `{"name": ..., "parameters": {...}}`;
* mistral (Mistral Nemo and Small): `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`;
* harmony (gpt-oss): a message on the commentary channel addressed `to=functions.NAME`, which reasoning.py
  hands on in hermes' form (its splitter reads the channels); no grammar holds it (a call opens with text
  of harmony's header, which the model writes freely), so tool_choice "required" is asked of it, not enforced.

The grammar is lazy (llama.cpp's): the model writes freely until it begins a call (a form's opening),
and from there on it can only write calls to the tools offered, with their parameters' schemas. With
tool_choice "required" or a named function it holds from the first token. It masks the target's
choices alone, so speculation stays lossless (engine/grammar.py).
"""

import json
import re
import secrets
import string
from dataclasses import dataclass
from enum import StrEnum

from .engine.grammar import from_json_schema
from .errors import InputError


class ToolFormat(StrEnum):
    HERMES = "hermes"
    LLAMA3 = "llama3"
    MISTRAL = "mistral"
    HARMONY = "harmony"


# An answer that is one call object: white space, perhaps a ```json fence, then the object.
_FENCE = re.compile(r"^\s*(?:```(?:json)?\s*)?")
# Llama 3.x may begin it with <|python_tag|>, a control token the grammar sees and the answer's text does not.
_WHOLE_CALL_TRIGGER = r'^\s*(?:<\|python_tag\|>)?\s*(?:```(?:json)?\s*)?(\{\s*"name")[\s\S]*$'


@dataclass(frozen=True)
class _Form:
    opening: str | None  # the text that begins the calls after any content (None: only a whole answer is one)
    closing: str | None  # the text that ends each call (None: the answer's end does)
    whole: str  # how an answer that is only calls begins: its object, or list
    arguments: str  # the key of a call's arguments
    triggers: tuple[str, ...]  # the lazy grammar's: regular expressions whose first group begins the calls
    one: str  # GBNF of an answer's calls (`call`: one call's object, `ws`: a little white space): one call
    several: str  # one call or more


_BLOCK = '"<tool_call>" ws call ws "</tool_call>"'
_FORMS = {
    ToolFormat.HERMES: _Form("<tool_call>", "</tool_call>", "{", "arguments", (r"(<tool_call>)", _WHOLE_CALL_TRIGGER),
                             f'{_BLOCK} | call ws "```"?', f'{_BLOCK} (ws {_BLOCK})* | call ws "```"?'),
    ToolFormat.LLAMA3: _Form(None, None, "{", "parameters", (_WHOLE_CALL_TRIGGER,), 'call ws "```"?', 'call ws "```"?'),
    # [TOOL_CALLS] is a control token: the answer's text may show only the list after it
    ToolFormat.MISTRAL: _Form("[TOOL_CALLS]", None, "[", "arguments", (r"(\[TOOL_CALLS\])",),
                              '"[TOOL_CALLS]" "[" call "]"', '"[TOOL_CALLS]" "[" call ("," ws call)* "]"'),
    ToolFormat.HARMONY: _Form("<tool_call>", "</tool_call>", "{", "arguments", (), "", ""),
}


def tool_format(template: str | None) -> ToolFormat:
    """The form the template teaches tool calls in; InputError where it has none localspec reads."""
    source = template or ""
    if "tools" not in source:
        raise InputError("this model's chat template has no tools: it cannot be asked to call them"
                         " (send the request without `tools`)")
    if "<|channel|>" in source and "functions." in source:
        return ToolFormat.HARMONY
    if "<tool_call>" in source and "<function=" not in source:
        return ToolFormat.HERMES
    if "[TOOL_CALLS]" in source and "[ARGS]" not in source:
        return ToolFormat.MISTRAL
    if "ipython" in source and '"parameters"' in source:
        return ToolFormat.LLAMA3
    raise InputError("this model's chat template writes tool calls in a form localspec does not read yet"
                     " (it reads Qwen's and Hermes' <tool_call>, Llama 3.x's JSON, Mistral's [TOOL_CALLS] and gpt-oss's"
                     " harmony)")


@dataclass(frozen=True)
class Tools:
    """The tools a request offers and how it wants them used."""

    definitions: tuple[dict, ...]  # OpenAI's: {"type": "function", "function": {name, description, parameters}}
    choice: str = "auto"  # "auto", "required", "none", or the one function's name to call
    parallel: bool = True  # more than one call an answer

    def __post_init__(self):
        names = self.names
        if len(set(names)) != len(names):
            raise InputError("tools: two tools have the same name")
        if self.choice not in ("auto", "required", "none", *names):
            raise InputError(f"tool_choice names {self.choice!r}, which is not one of the tools offered")

    @property
    def names(self) -> list[str]:
        return [definition["function"]["name"] for definition in self.definitions]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI's objects carry it

    @property
    def argument_values(self) -> dict:
        return json.loads(self.arguments)


def constraint(form: ToolFormat, tools: Tools) -> tuple[str | None, tuple[str, ...]]:
    """(GBNF, triggers) for Sampling.grammar and grammar_triggers: what the answer's calls must follow.
    No grammar with tool_choice "none"; a lazy one with "auto"; one that holds from the start else."""
    if tools.choice == "none" or form is ToolFormat.HARMONY:
        return None, ()
    f = _FORMS[form]
    offered = [d["function"] for d in tools.definitions if tools.choice in ("auto", "required", d["function"]["name"])]
    schemas = [{"type": "object", "properties": {"name": {"const": function["name"]},
                                                f.arguments: function.get("parameters") or {"type": "object"}},
                "required": ["name", f.arguments], "additionalProperties": False} for function in offered]
    rules = from_json_schema({"anyOf": schemas} if len(schemas) > 1 else schemas[0], "call")
    triggers = f.triggers if tools.choice == "auto" else ()
    return f"root ::= {f.several if tools.parallel else f.one}\nws ::= [ \\n]{{0,2}}\n{rules}", triggers


def new_id(form: ToolFormat) -> str:
    """A call's id. Mistral's templates refuse any but nine letters and digits."""
    if form == ToolFormat.MISTRAL:
        return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))
    return "call_" + secrets.token_hex(12)


class UnfinishedCall(InputError):
    """The answer ended inside a tool call (max_tokens, or a stop string, cut it off)."""


class ToolStream:
    """An answer's text as it streams, read into content and calls: content is passed on at once, except
    what may be the start of a call; each call comes out whole once its text has ended."""

    def __init__(self, form: ToolFormat, required: bool = False):
        """required: the answer is calls alone (the grammar held from the first token)."""
        self.form = form
        self.required = required
        self._f = _FORMS[form]
        self._held = ""  # text that may be, or is, a call
        self._state = "start"  # "content" once it is not a whole call, "calls" after an opening, "whole"

    def feed(self, text: str) -> list[str | ToolCall]:
        self._held += text
        out: list[str | ToolCall] = []
        if self._state == "start":
            self._state = self._whole_or_not()
        if self._state == "content":
            out += self._content()
        if self._state == "calls" and self._f.closing:
            out += self._closed_calls()
        return out

    def end(self) -> list[str | ToolCall]:
        """What is left once the answer has ended: the last calls; UnfinishedCall if one is cut off."""
        held, self._held = self._held, ""
        if self._state in ("start", "content"):
            if self.required and held.strip():  # cut off before its opening was whole
                raise UnfinishedCall(f"the answer ended inside a tool call: {held.strip()[:80]!r}")
            return [held] if held else []
        if self._state == "calls" and self._f.closing:
            if held.strip():
                raise UnfinishedCall(f"the answer ended inside a tool call: {held.strip()[:80]!r}")
            return []
        body = held.strip().removeprefix(self._f.opening or "")
        if self._state == "whole":
            body = _FENCE.sub("", body).removesuffix("```").rstrip()
        try:
            found = json.loads(body)
        except ValueError:
            # JSON content, not a call: the grammar holds only from a call's `{"name"` on (unless required);
            # what a model imitating a tool result writes (`{{"name": ...`) it never held
            if self._state == "whole" and not self.required and not re.match(r'\[?\s*\{\s*"name"', body):
                return [held]
            raise UnfinishedCall(f"the answer ended inside a tool call: {body[:80]!r}") from None
        calls = found if isinstance(found, list) and self._f.whole == "[" else [found]
        if not all(_is_call(call, self._f.arguments) for call in calls):
            return [held]
        return [self._call(call) for call in calls]

    def _whole_or_not(self) -> str:
        """While nothing but white space and a fence has come, the answer may yet be one call object."""
        head = self._held.lstrip()
        if not head or "```json".startswith(head):
            return "start"
        rest = _FENCE.sub("", self._held)
        if rest.startswith(self._f.whole):
            return "whole"
        return "start" if not rest and head.startswith("```") else "content"

    def _content(self) -> list[str]:
        f, held = self._f, self._held
        if f.opening is None:
            return self._pass_on(len(held))
        at = held.find(f.opening)
        if at >= 0:
            self._state = "calls"
            return self._pass_on(at)
        # keep back an ending that could be the opening's beginning
        keep = next((n for n in range(min(len(f.opening) - 1, len(held)), 0, -1) if f.opening.startswith(held[-n:])), 0)
        return self._pass_on(len(held) - keep)

    def _pass_on(self, count: int) -> list[str]:
        text, self._held = self._held[:count], self._held[count:]
        return [text] if text else []

    def _closed_calls(self) -> list[ToolCall]:
        f, out = self._f, []
        while (end := self._held.find(f.closing)) >= 0:
            block, self._held = self._held[:end], self._held[end + len(f.closing):]
            body = block.strip().removeprefix(f.opening).strip()
            try:
                call = json.loads(body)
            except ValueError:
                raise InputError(f"the model wrote a tool call that is not JSON: {body[:80]!r}") from None
            if not _is_call(call, f.arguments):
                raise InputError(f"the model wrote a tool call without a name and {f.arguments}: {body[:80]!r}")
            out.append(self._call(call))
        return out

    def _call(self, call: dict) -> ToolCall:
        arguments = call.get(self._f.arguments, call.get("arguments"))
        return ToolCall(new_id(self.form), call["name"], json.dumps(arguments, ensure_ascii=False))


def _is_call(call, arguments: str) -> bool:
    return (isinstance(call, dict) and isinstance(call.get("name"), str)
            and isinstance(call.get(arguments, call.get("arguments")), dict))
