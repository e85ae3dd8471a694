"""Tool calls: which form a model's chat template teaches it to write them in, a grammar that keeps
every call it starts well formed, and the calls read back out of its answer, whole or as it streams.

The tools reach the model through its own template (the `tools` variable), as Hugging Face renders
them; the answer is the model's own text, so each family's form is read here:

* hermes (Qwen2.5, Qwen3, Hermes): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block
  a call, after any text; or, as Qwen2.5-Coder writes them, an answer that is one such object (in a
  ```json fence or not), which llama.cpp reads as a call too;
* llama3 (Llama 3.1-3.3): the whole answer is `{"name": ..., "parameters": {...}}`;
* mistral (Mistral Nemo and Small): `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`;
* xml (Qwen3-Coder, Qwen3.5, Qwen3.6): `<tool_call>\n<function=NAME>\n<parameter=KEY>\nvalue\n</parameter>\n
  </function>\n</tool_call>`, a value of a string parameter written as it is, others as JSON;
* seed (Seed-OSS): xml's calls, each in a `<seed:tool_call>` block instead;
* apriel (Apriel 1.5, 1.6): `<tool_calls>[{"name": ..., "arguments": {...}}, ...]</tool_calls>`, a list of JSON calls;
* nemotron (Nemotron Nano v2): the same list in `<TOOLCALL>...</TOOLCALL>`;
* glm (GLM-4.5, GLM-4.6): `<tool_call>NAME\n<arg_key>KEY</arg_key>\n<arg_value>value</arg_value>\n</tool_call>`,
  values as in xml;
* gemma4 (Gemma 4): `<|tool_call>call:NAME{key:value,...}<tool_call|>`, a string between `<|"|>` marks, a
  dict's keys unquoted (its template's own spelling; llama.cpp's conversion shows those marks as text);
* mistral-args (Mistral Small 3.2, Devstral, Magistral, Ministral 3): `[TOOL_CALLS]NAME[ARGS]{...}` a call (Small
  3.2 writes `[CALL_ID]ID` before `[ARGS]`); its markers are control tokens, shown to the reader (shown());
* harmony (gpt-oss): a message on the commentary channel addressed `to=functions.NAME`, which reasoning.py
  hands on in hermes' form (its splitter reads the channels); no grammar holds it (a call opens with text
  of harmony's header, which the model writes freely), so tool_choice "required" is asked of it, not enforced.

The grammar is lazy (llama.cpp's): the model writes freely until it begins a call (a form's opening),
and from there on it can only write calls to the tools offered, with their parameters' schemas (in xml,
glm and gemma4, each offered parameter at most once, the required ones always, in the schema's order or,
for gemma4, sorted as its template writes them; a string's value any text but its closing tag). With
tool_choice "required" or a named function it holds from the first token. It masks the target's
choices alone, so speculation stays lossless (engine/grammar.py).
"""

import hashlib
import json
import re
import secrets
import string
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from enum import StrEnum

from .engine.gbnf import ANNOTATIONS, from_json_schema, from_json_schemas, refs_written_out
from .errors import InputError, UsageError
from .events import Done, Token
from .reasoning import CALL_CLOSING, CALL_OPENING, XTML_CLOSE, XTML_MARKERS, XTML_OPEN, XTML_SEP


class ToolFormat(StrEnum):
    HERMES = "hermes"
    LLAMA3 = "llama3"
    MISTRAL = "mistral"
    HARMONY = "harmony"
    XML = "xml"
    GLM = "glm"
    GEMMA4 = "gemma4"
    MISTRAL_ARGS = "mistral-args"
    LFM2 = "lfm2"
    MINIMAX = "minimax"
    KIMI = "kimi"
    SEED = "seed"
    APRIEL = "apriel"
    NEMOTRON = "nemotron"
    COMMAND_R7B = "command-r7b"
    # DeepSeek V3.2's and V4's DSML: V3.2 names its block of calls function_calls, V4 tool_calls
    DSML_FUNCTIONS = "dsml-function-calls"
    DSML = "dsml"
    MINICPM5 = "minicpm5"
    APERTUS = "apertus"
    GRANITE = "granite"  # Granite 3.x's <|tool_call|> JSON list (Granite 4's templates write Hermes' <tool_call>)
    GIGACHAT3 = "gigachat3"  # one JSON call in a `function call` turn after the content's <|message_sep|>
    GIGACHAT31 = "gigachat3.1"  # GigaChat 3.1's: one JSON call after <|function_call|>
    FIREFUNCTION = "firefunction"  # Firefunction v2's JSON list after `functools`, to the answer's end
    FUNCTIONARY = "functionary-v3.1"  # Functionary v3.1's <function=NAME>{...}</function>
    # Functionary v3.2's messages, each `>>>RECIPIENT\n` and its text: `all`'s the content, a function's its call
    FUNCTIONARY_V32 = "functionary-v3.2"
    KIMI_K3 = "kimi-k3"  # Kimi K3's XTML `tools` section of `call`s, each argument a section of its own
    MINIMAX_M1 = "minimax-m1"  # MiniMax-M1's <tool_calls> block of JSON calls, one a line
    HY3 = "hy3"  # Hy3's <tool_calls:opensource> block of calls, each argument an <arg_key:...> and <arg_value:...>
    # DeepSeek R1's and V3's (0324, R1-0528): a block of calls, each `function<｜tool▁sep｜>NAME` and a fenced JSON object
    DEEPSEEK = "deepseek"
    # DeepSeek V3.1's: a block of calls, each NAME<｜tool▁sep｜> and its JSON object (its own template writes no tools:
    # they are described in the system prompt as DeepSeek documents, described_tools)
    DEEPSEEK_V31 = "deepseek-v3.1"
    SOLAR = "solar-open"  # Solar Open's tool_calls message: each call its id, name and JSON arguments between markers
    MINIMAX_M3 = "minimax-m3"  # MiniMax-M3's namespaced <invoke>s, each argument an element nested as its schema nests
    ATEM = "atem"  # Muse Glimmer's: a message to the tool holding an <atem:function_calls> block of one <atem:invoke>


# An answer that is one call object: white space, perhaps a ```json fence, then the object.
_FENCE = re.compile(r"^\s*(?:```(?:json)?\s*)?")
# Llama 3.x may begin it with <|python_tag|>, a control token the grammar sees and the answer's text does not.
_WHOLE_CALL_TRIGGER = r'^\s*(?:<\|python_tag\|>)?\s*(?:```(?:json)?\s*)?(\{\s*"name")[\s\S]*$'


@dataclass(frozen=True)
class _Markup:
    """How a call is spelled where it is markup, not a JSON object: its name, then each argument's key and
    value between these tags (a string's value as written, any other as JSON), then `end`. typed: where the
    key's closing says how the value is written (DeepSeek's `" string="true">`, `" string="false">`), those
    two in place of key[1]: as written, and as JSON."""

    name: tuple[str, str]
    key: tuple[str, str]
    value: tuple[str, str]
    end: str
    typed: tuple[str, str] | None = None
    # a string's value may come wrapped in <![CDATA[...]]> (MiniCPM5's, where it holds <, & or a newline)
    cdata: bool = False

    def key_closing(self, as_text: bool) -> str:
        return self.key[1] if self.typed is None else self.typed[0 if as_text else 1]


@dataclass(frozen=True)
class _Form:
    opening: str | None  # the text that begins the calls after any content (None: only a whole answer is one)
    closing: str | None  # the text that ends each call (None: the answer's end does)
    whole: str | None  # how an answer that is only calls begins: its object, or list (None: with its opening)
    arguments: str  # the key of a call's arguments
    triggers: tuple[str, ...]  # the lazy grammar's: regular expressions whose first group begins the calls
    one: str  # GBNF of an answer's calls (`call`: one call's object, `ws`: a little white space): one call
    several: str  # one call or more
    # where a call is not a JSON object: GBNF of one (`call`) for the functions offered, and what reads the
    # calls back (their text between opening and closing, the offered functions' parameters by name ->
    # [(name, arguments)]: one call, or LFM2's list; (name, arguments, id) where the model writes the call's id)
    call_rules: Callable[[list[dict]], str] | None = None
    read_calls: Callable[[str, dict], list[tuple]] | None = None
    json: bool = False  # its calls are JSON: a closing inside one of their strings is a value's text
    # its calls are markup whose values are text as written: a closing inside one is the value's text (the
    # regular expression of a value's opening, and its closing; MiniCPM5's a <![CDATA[...]]> section)
    values: tuple[str, str] | None = None


def tool_format(template: str | None) -> ToolFormat:
    """The form the template teaches tool calls in; InputError where it has none localspec reads."""
    source = template or ""
    if _DEEPSEEK_CALLS[0] in source and _DEEPSEEK_CALL[1] in source and "```json" not in source:
        return ToolFormat.DEEPSEEK_V31
    if "tools" not in source:
        raise InputError("this model's chat template has no tools: it cannot be asked to call them"
                         " (send the request without `tools`)")
    if "<|channel|>" in source and "functions." in source:
        return ToolFormat.HARMONY
    if _FUNCTIONARY_CONTENT in source:
        return ToolFormat.FUNCTIONARY_V32
    if "<|tool_call>call:" in source:
        return ToolFormat.GEMMA4
    if _APERTUS[0] in source and _APERTUS[1] in source:
        return ToolFormat.APERTUS
    if "Tool usage guidelines:" in source and '<function name="' in source and '<param name="' in source:
        return ToolFormat.MINICPM5
    if "dsml_token" in source and "DSML" in source:
        return ToolFormat.DSML_FUNCTIONS if "function_calls" in source else ToolFormat.DSML
    if "<atem:function_calls>" in source and "<atem:invoke name=" in source:
        return ToolFormat.ATEM
    if _MM3 in source and "<invoke name=" in source:
        return ToolFormat.MINIMAX_M3
    if "<minimax:tool_call>" in source and "<invoke name=" in source:
        return ToolFormat.MINIMAX
    if "<|tool_calls_section_begin|>" in source and "<|tool_call_argument_begin|>" in source:
        return ToolFormat.KIMI
    if all(marker in source for marker in XTML_MARKERS) and "'argument'" in source:
        return ToolFormat.KIMI_K3
    if "<seed:tool_call>" in source and "<function=" in source and "<parameter=" in source:
        return ToolFormat.SEED
    if "<tool_calls>[" in source and "]</tool_calls>" in source:
        return ToolFormat.APRIEL
    if _MINIMAX_M1_TAUGHT in source and "</tool_calls>" in source:
        return ToolFormat.MINIMAX_M1
    if _HY3_MARK in source and "'<tool_calls{}>'" in source:
        return ToolFormat.HY3
    if _DEEPSEEK_CALLS[0] in source and _DEEPSEEK_CALL[1] in source and "```json" in source:
        return ToolFormat.DEEPSEEK
    if _SOLAR_CALL[0] in source and _SOLAR_CALL[2] in source:
        return ToolFormat.SOLAR
    if "<TOOLCALL>[" in source and "]</TOOLCALL>" in source:
        return ToolFormat.NEMOTRON
    if _COHERE_ACTION[0] in source and '"tool_name"' in source:
        return ToolFormat.COMMAND_R7B
    # forms that spell <tool_call> too but write something else in or around it (an <invoke>, another <tool_calls>):
    # refused, rather than read as another family's
    if not any(marker in source for marker in ("<invoke", "<tool_calls>", "<seed:tool_call>")):
        if "<tool_call>" in source and "<function=" in source and "<parameter=" in source:
            return ToolFormat.XML
        if "<tool_call>" in source and "<arg_key>" in source and "<arg_value>" in source:
            return ToolFormat.GLM
        if "<tool_call>" in source and "<function=" not in source:
            return ToolFormat.HERMES
    # LFM2's template lists the tools between its markers; LFM2.5's lists them bare (llama.cpp reads both so)
    if "<|tool_list_start|>" in source or "List of tools: [" in source:
        return ToolFormat.LFM2
    if _GRANITE_CALL in source and "available_tools" in source:
        return ToolFormat.GRANITE
    if _GIGACHAT_ROLE in source and "<|message_sep|>" in source:
        return ToolFormat.GIGACHAT31 if _GIGACHAT31_CALL in source else ToolFormat.GIGACHAT3
    if _FUNCTOOLS in source:
        return ToolFormat.FIREFUNCTION
    if _FUNCTIONARY[0] in source and _FUNCTIONARY[1] in source and "<parameter=" not in source:
        return ToolFormat.FUNCTIONARY
    if "[TOOL_CALLS]" in source and "[ARGS]" in source:
        return ToolFormat.MISTRAL_ARGS
    if "[TOOL_CALLS]" in source:
        return ToolFormat.MISTRAL
    if "ipython" in source and '"parameters"' in source:
        return ToolFormat.LLAMA3
    raise InputError("this model's chat template writes tool calls in a form localspec does not read yet"
                     " (it reads Qwen's and Hermes' <tool_call>, Qwen3.5's, Qwen3-Coder's and Seed-OSS's <function=...>"
                     " XML, Apriel's <tool_calls>, Nemotron's <TOOLCALL> and Command R7B's <|START_ACTION|> lists, GLM's"
                     " <arg_key>, Gemma 4's <|tool_call>call:, MiniMax-M2's and DeepSeek V3.2's and V4's (DSML)"
                     " <invoke>, MiniCPM5's <function name=...>, Apertus' {NAME: arguments} lists, Kimi K2's tool-call"
                     " sections, LFM2's Python-style calls, Llama 3.x's JSON, Mistral's [TOOL_CALLS] (and [ARGS]),"
                     " Granite 3's <|tool_call|> lists, GigaChat 3's and 3.1's calls, Firefunction v2's functools"
                     " lists, Functionary v3.1's <function=NAME>, Functionary v3.2's >>>NAME, Kimi K3's XTML,"
                     " MiniMax-M1's <tool_calls> lines, Hy3's <tool_calls:opensource>, DeepSeek R1's and V3's fenced"
                     " calls, DeepSeek V3.1's, Solar Open's <|tool_calls|>, Muse Glimmer's ATEM, MiniMax-M3's"
                     " namespaced <invoke>s and gpt-oss's harmony)")


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

    @classmethod
    def of(cls, tools) -> "Tools":
        """OpenAI's list of tools ({"type": "function", "function": {"name", "description", "parameters"}}), offered
        to be called as the model chooses; UsageError where it is none."""
        if isinstance(tools, (str, bytes, dict)) or not isinstance(tools, Sequence) or not all(
                isinstance(tool, dict) and isinstance(tool.get("function"), dict)
                and isinstance(tool["function"].get("name"), str) for tool in tools):
            raise UsageError('tools: a list of {"type": "function", "function": {"name": ..., "parameters": {...}}}'
                             f" objects (OpenAI's), or a localspec.Tools, got {tools!r:.80}", setting="tools")
        return cls(tuple(tools))

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


# A function offered with no parameters takes none: OpenAI's "omitting parameters defines a function with an empty
# parameter list" (its calls were held to any object: f({"city": "Paris"}))
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


def arguments_schema(function: dict) -> dict:
    """The schema a call's arguments follow: the function's parameters (NO_PARAMETERS where it has none), an object
    where they say no type and nothing of one (a description alone: JSON Schema would admit any value, and a call's
    arguments are an object)."""
    parameters = function.get("parameters")
    if parameters is None:
        return NO_PARAMETERS
    properties, required = (parameters.get("properties"), parameters.get("required")) if isinstance(parameters, dict) \
        else (None, None)
    if not isinstance(parameters, dict) or not isinstance(properties, dict | None) or not isinstance(required, list | None):
        # (a markup form reads them in Python: `properties` a list was an AttributeError, a 500)
        raise InputError(f"tools: {function['name']}'s parameters: a JSON schema object, its properties an object and"
                         f" required a list, got {parameters!r:.80}")
    try:  # (its `#/$defs/...` named the call wrapper's root: pydantic's nested models were a 400 with every form)
        parameters = refs_written_out(parameters)
    except InputError as error:
        raise InputError(f"tools: {function['name']}'s parameters: {error}") from None
    if "type" in parameters or set(parameters) - ANNOTATIONS:
        return parameters
    return {**parameters, "type": "object"}


def constraint(form: ToolFormat, tools: Tools) -> tuple[str | None, tuple[str, ...]]:
    """(GBNF, triggers) for Sampling.grammar and grammar_triggers: what the answer's calls must follow.
    No grammar with tool_choice "none"; a lazy one with "auto"; one that holds from the start else."""
    if tools.choice == "none" or form is ToolFormat.HARMONY:
        return None, ()
    f = _FORMS[form]
    offered = [d["function"] for d in tools.definitions if tools.choice in ("auto", "required", d["function"]["name"])]
    try:
        if f.call_rules:
            rules = f.call_rules(offered)
        else:
            schemas = [{"type": "object", "properties": {"name": {"const": function["name"]},
                                                        f.arguments: arguments_schema(function)},
                        "required": ["name", f.arguments], "additionalProperties": False} for function in offered]
            rules = from_json_schema({"anyOf": schemas} if len(schemas) > 1 else schemas[0], "call")
    except InputError:  # (said of the tool whose parameters it is, not of the call's wrapper, which it quoted)
        for function in offered:
            schema = arguments_schema(function)  # (its own refusals name the tool)
            try:
                from_json_schema(schema)
            except InputError as error:
                raise InputError(f"tools: {function['name']}'s parameters: {error}") from None
        raise
    triggers = f.triggers if tools.choice == "auto" else ()
    return f"root ::= {f.several if tools.parallel else f.one}\nws ::= [ \\n]{{0,2}}\n{rules}", triggers


def _choices(schema) -> list | None:
    """The values a schema allows where it lists them (enum, const)."""
    return schema.get("enum", [schema["const"]] if "const" in schema else None) if isinstance(schema, dict) else None


def _written_as_text(schema) -> bool:
    """Whether a markup form writes a parameter's value as it is (a string), not as JSON."""
    if not isinstance(schema, dict):
        return False
    choices = _choices(schema)
    if schema.get("type") == "string" or (schema.get("type") is None and choices):
        return choices is None or all(isinstance(choice, str) for choice in choices)
    return False


def _markup_rules(markup: _Markup, offered: list[dict]) -> str:
    """GBNF of one call (`call`) in a markup form: an offered function's name, then its parameters in the
    schema's order (the required ones always, each at most once), a string's value any text without the
    value's closing tag (or one of its enum), any other's its schema's JSON; a function whose parameters
    name no properties takes any keys, their values any text."""
    def literal(text: str) -> str:
        return json.dumps(text, ensure_ascii=False) if text else ""

    def opened(key: str | None, as_text: bool) -> str:
        """An argument up to its value: its key (None: any), and the value's opening tag where it has one."""
        closing = markup.key_closing(as_text)
        name = literal(markup.key[0] + key + closing) if key is not None else \
            f"{literal(markup.key[0])} [^<>\"\\n]+ {literal(closing)}"
        return f"{name} ws {literal(markup.value[0])}" if markup.value[0] else name

    as_json, calls, pieces = {}, [], []
    for number, function in enumerate(offered):
        properties, required, open_keys = _parameters(function)
        arguments = []
        for place, (key, schema) in enumerate(properties.items()):
            choices, as_text = _choices(schema), _written_as_text(schema)
            if as_text:
                value = " | ".join(literal(choice) for choice in choices) if choices else "text"
                value = f"({value})"
            else:
                value = f"json-{number}-{place}"
                as_json[value] = schema
            argument = f"{opened(key, as_text)} \"\\n\"? {value} \"\\n\"? {literal(markup.value[1])} ws"
            arguments.append(argument if key in required else f"({argument})?")
        if open_keys:
            arguments.append(f"({opened(None, True)} \"\\n\"? text \"\\n\"? {literal(markup.value[1])} ws)*")
        name = literal(markup.name[0] + function["name"] + markup.name[1])
        pieces.append(f"call-{number} ::= {name} ws {' '.join(arguments)} {literal(markup.end)}")
        calls.append(f"call-{number}")
    return "\n".join([f"call ::= {' | '.join(calls)}", *pieces, _text_without(markup.value[1], "text"),
                      _json_rules(as_json)])


def _parameters(function: dict) -> tuple[dict, set[str], bool]:
    """An offered function's parameters: their schemas by name, the required names, and whether it takes any
    keys (its schema names no properties and does not forbid others)."""
    return _members(arguments_schema(function))


def _members(schema: dict) -> tuple[dict, set[str], bool]:
    """An object schema's members: their schemas by name, the required names, and whether it takes any keys."""
    properties = schema.get("properties") or {}
    return (properties, set(schema.get("required") or ()),
            not properties and schema.get("additionalProperties") is not False)


def _json_rules(schemas: dict[str, dict]) -> str:
    """GBNF of JSON values, a rule of each name for its schema (a primitive's an alias of its shared rule)."""
    if not schemas:
        return ""
    rules, names = from_json_schemas(schemas)
    return "\n".join([*(f"{rule} ::= {name}" for rule, name in names.items() if name != rule), rules])


def _read_markup(m: _Markup, body: str, parameters: dict) -> tuple[str, dict]:
    """A call written in a markup form: its name, and each argument's value as its schema reads it."""
    named = re.match(re.escape(m.name[0]) + r"\s*([^\s<>]+)\s*" + re.escape(m.name[1]), body)
    if named is None:
        raise InputError(f"the model wrote a tool call without a name: {body[:80]!r}")
    name, rest = named.group(1), body[named.end():]
    if m.end and not rest.rstrip().endswith(m.end):
        raise InputError(f"the model wrote a tool call that does not end with {m.end}: {body[:80]!r}")
    pattern = (re.escape(m.key[0]) + r"(.*?)" + re.escape(m.key[1]) + (r"\s*" + re.escape(m.value[0]) if m.value[0]
               else "") + (r"(<!\[CDATA\[.*?\]\]>|.*?)" if m.cdata else r"(.*?)") + re.escape(m.value[1]))
    schemas = parameters.get(name, {})

    def read(value: str, schema) -> object:
        value = value.removeprefix("\n").removesuffix("\n")
        if m.cdata and value.startswith("<![CDATA[") and value.endswith("]]>"):
            return value[len("<![CDATA["):-len("]]>")]
        return _value(value, schema)

    return name, {key.strip(): read(value, schemas.get(key.strip()))
                  for key, value in re.findall(pattern, rest, re.DOTALL)}


def _read_invokes(m: _Markup, body: str, parameters: dict) -> list[tuple[str, dict]]:
    """MiniMax-M2's and DeepSeek's calls in one block: `<invoke name="NAME">`, then `<parameter name="KEY">value
    </parameter>`s, then `</invoke>`, one after another; read in order, so that a value holding `</invoke>`
    stays a value (the grammar keeps `</parameter>` out of one). A DSML key's closing says how its value is
    written: as is, or as JSON."""
    calls, at = [], 0
    try:
        while body[at:].strip():
            at = len(body) - len(body[at:].lstrip())
            if not body.startswith(m.name[0], at):
                raise ValueError(f"no <invoke> at {at}")
            end = body.index(m.name[1], at)
            name, arguments, at = body[at + len(m.name[0]) : end].strip(), {}, end + len(m.name[1])
            schemas = parameters.get(name, {})
            while True:
                at = len(body) - len(body[at:].lstrip())
                if body.startswith(m.end, at):
                    at += len(m.end)
                    break
                if not body.startswith(m.key[0], at):
                    raise ValueError(f"no <parameter> at {at}")
                key_end = body.index(m.key[1] if m.typed is None else '"', at + len(m.key[0]))
                key = body[at + len(m.key[0]) : key_end].strip()
                closing = next(c for c in ((m.key[1],) if m.typed is None else m.typed) if body.startswith(c, key_end))
                value_start = key_end + len(closing)
                if m.value[0]:  # (Hy3's value has an opening of its own, on the key's next line)
                    value_start = body.index(m.value[0], value_start) + len(m.value[0])
                value_end = body.index(m.value[1], value_start)
                written = body[value_start:value_end].removeprefix("\n").removesuffix("\n")
                as_written = m.typed is not None and closing == m.typed[0]
                arguments[key] = written if as_written else _value(written, None if m.typed else schemas.get(key))
                at = value_end + len(m.value[1])
            calls.append((name, arguments))
    except (ValueError, StopIteration):
        raise InputError(f"the model wrote tool calls that do not read as <invoke>s: {body[:80]!r}") from None
    return calls


def _value(text: str, schema) -> object:
    """A markup form's argument: a string's value as written; any other's as JSON (Qwen3.5's template writes
    a boolean as Python does: True), or as written where it does not read as such."""
    if _written_as_text(schema):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return {"True": True, "False": False, "None": None}.get(text.strip(), text)


def _text_without(stop: str, rule: str) -> str:
    """GBNF of any text in which `stop` does not occur, for a stop whose first character occurs in it once
    (a closing tag): runs of other characters, and from each of that character on the stop's beginning
    as far as the text follows it, the stop's last character refused. Character classes and repetitions,
    not a rule a character: llama.cpp's grammar checks a row of 150,000 tokens under it in tens of ms
    (one rule a character of a matcher's states took over 2 s)."""
    first = stop[0]
    assert first not in stop[1:], stop

    def literal(text: str) -> str:
        return json.dumps(text, ensure_ascii=False)

    def other_than(*chars: str) -> str:
        return "[^" + "".join(json.dumps(c, ensure_ascii=False)[1:-1].replace("[", "\\[").replace("]", "\\]")
                              .replace("-", "\\-") for c in sorted(set(chars))) + "]"

    free = f"{other_than(first)}*"
    tail = f"({other_than(stop[-1], first)} {free})?"
    for at in range(len(stop) - 2, 0, -1):  # the stop matched as far as `at`: a character other than the next, or the next
        tail = f"({other_than(stop[at], first)} {free} | {literal(stop[at])} {tail})?"
    return f"{rule} ::= {free} ({literal(first)}+ {tail})*"


# Gemma 4's values: a string between <|"|> marks, a number, true, false, null, and lists and dicts of them
# (a dict's keys unquoted), as its template's format_argument writes them
_GEMMA_QUOTE = '<|"|>'
_GEMMA_VALUES = r"""gvalue ::= gstring | gdict | glist | gnumber | "true" | "false" | "null"
gstring ::= "<|\"|>" gtext "<|\"|>"
gdict ::= "{" ws (gkey ":" ws gvalue ("," ws gkey ":" ws gvalue)*)? ws "}"
gkey ::= [^:}{,<>\n ]+
glist ::= "[" ws (gvalue ("," ws gvalue)*)? ws "]"
gint ::= "-"? ([0-9] | [1-9] [0-9]{1,15})
gnumber ::= gint ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?"""


def _gemma_rules(offered: list[dict]) -> str:
    """GBNF of one Gemma 4 call (`call`): `call:NAME{key:value,...}`, an offered function's parameters in its
    template's order (sorted by key, as it writes earlier calls), the required ones always; a string's value
    any text without the closing mark (or one of its enum), a number's, a boolean's and the rest as Gemma
    writes them; a function whose parameters name no properties takes any keys."""
    pieces = [f"call ::= {' | '.join(f'call-{number}' for number in range(len(offered)))}"]
    for number, function in enumerate(offered):
        properties, required, open_keys = _parameters(function)
        members = [(f"{json.dumps(key + ':', ensure_ascii=False)} ws {_gemma_value_rule(properties[key])}", key in required)
                   for key in sorted(properties)]
        if open_keys:
            body = 'ws (gkey ":" ws gvalue ("," ws gkey ":" ws gvalue)*)? ws'
        else:
            body = f"args-{number}-0"
            pieces += _in_order(f"args-{number}", members)
        pieces.append(f'call-{number} ::= {json.dumps("call:" + function["name"] + "{")} {body} "}}"')
    return "\n".join([*pieces, _GEMMA_VALUES, _text_without(_GEMMA_QUOTE, "gtext")])


def _in_order(prefix: str, members: list[tuple[str, bool]]) -> list[str]:
    """GBNF rules of a call's arguments (`PREFIX-0`), each member (GBNF, whether required) at most once and
    in the order given, a comma between two."""
    pieces = []
    # PREFIX-i: the members from the i-th on; PREFIX-i-after: the same where one is written before them
    for place in range(len(members) + 1):
        for after in (False, True) if place else (False,):  # (nothing comes before the first)
            name = f"{prefix}-{place}" + ("-after" if after else "")
            if place == len(members):
                pieces.append(f"{name} ::= ws")
                continue
            member, needed = members[place]
            comma = '"," ws ' if after else ""
            written = f"{comma}{member} {prefix}-{place + 1}-after"
            skipped = f"{prefix}-{place + 1}" + ("-after" if after else "")
            pieces.append(f"{name} ::= {written}" if needed else f"{name} ::= {written} | {skipped}")
    return pieces


def _gemma_value_rule(schema) -> str:
    """A parameter's value in Gemma 4's spelling, as its schema allows."""
    if _written_as_text(schema):
        choices = _choices(schema)
        text = " | ".join(json.dumps(choice, ensure_ascii=False) for choice in choices) if choices else "gtext"
        return f'"<|\\"|>" ({text}) "<|\\"|>"'
    kind = schema.get("type") if isinstance(schema, dict) else None
    return {"integer": "gint", "number": "gnumber", "boolean": '("true" | "false")', "null": '"null"',
            "array": "glist", "object": "gdict"}.get(kind, "gvalue")


def _read_gemma(body: str) -> tuple[str, dict]:
    """A Gemma 4 call, `call:NAME{key:value,...}`: its name and arguments."""
    if not body.startswith("call:") or "{" not in body:
        raise InputError(f"the model wrote a tool call without a name: {body[:80]!r}")
    name, _, rest = body.removeprefix("call:").partition("{")
    try:
        arguments, end = _gemma_value("{" + rest, 0)
    except (ValueError, IndexError):
        arguments, end = None, 0
    if not isinstance(arguments, dict) or ("{" + rest)[end:].strip():
        raise InputError(f"the model wrote a tool call that does not read as Gemma 4's: {body[:80]!r}")
    return name.strip(), arguments


def _gemma_value(text: str, at: int) -> tuple[object, int]:
    """The value at `at` in Gemma 4's spelling, and where it ends (ValueError where there is none)."""
    while text[at] in " \n":
        at += 1
    if text.startswith(_GEMMA_QUOTE, at):
        end = text.index(_GEMMA_QUOTE, at + len(_GEMMA_QUOTE))
        return text[at + len(_GEMMA_QUOTE):end], end + len(_GEMMA_QUOTE)
    if text[at] in "{[":
        closing, items, at = "}" if text[at] == "{" else "]", [], at + 1
        while True:
            while text[at] in " \n,":
                at += 1
            if text[at] == closing:
                return (dict(items) if closing == "}" else items), at + 1
            if closing == "}":
                key, colon = text[at:].split(":", 1)[0], text.index(":", at)
                value, at = _gemma_value(text, colon + 1)
                items.append((key.strip(), value))
            else:
                value, at = _gemma_value(text, at)
                items.append(value)
    scalar = re.match(r"[^,}\]\s]+", text[at:])
    if scalar is None:
        raise ValueError(f"no value at {at}")
    return json.loads(scalar.group()), at + scalar.end()


def _json_argument_calls(offered: list[dict], spelled: Callable[[str, str], str]) -> str:
    """GBNF of one call (`call`) of a form that writes the function's name in markup of its own and the arguments
    as a JSON object, held to the function's parameters' schema: spelled(name, arguments_rule) is one call."""
    rules, names = from_json_schemas({f"arguments-{number}": arguments_schema(function)
                                      for number, function in enumerate(offered)})
    calls = [spelled(function["name"], names[f"arguments-{number}"]) for number, function in enumerate(offered)]
    return "\n".join([f"call ::= {' | '.join(calls)}", rules])


def _args_rules(offered: list[dict]) -> str:
    """GBNF of one call of Mistral's [ARGS] form (`call`): an offered function's name, perhaps its call id,
    then `[ARGS]` and its arguments' JSON object, held to its parameters' schema."""
    return _json_argument_calls(offered, lambda name, arguments: f'{json.dumps(name, ensure_ascii=False)}'
                                f' ("[CALL_ID]" [A-Za-z0-9]{{1,32}})? "[ARGS]" {arguments}')


def _read_args_call(body: str, parameters: dict) -> tuple[str, dict]:
    """A call of Mistral's [ARGS] form after its [TOOL_CALLS]: NAME, perhaps [CALL_ID]ID, then [ARGS] and JSON."""
    head, marked, arguments = body.partition("[ARGS]")
    name = head.split("[CALL_ID]")[0].strip()
    try:
        values = json.loads(arguments) if marked and name else None
    except ValueError:
        values = None
    if not isinstance(values, dict):
        raise InputError(f"the model wrote a tool call that is not NAME[ARGS] and a JSON object: {body[:80]!r}")
    return name, values


# Kimi K2's: the calls in one section, each `<|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>`, its
# arguments' JSON object, then `<|tool_call_end|>`; what it writes before the arguments is the call's id, which its
# template writes back in the conversation (and in the tool result's `## Return of ID`)
_KIMI_SECTION = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")
_KIMI_CALL = ("<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>")


def _kimi_rules(offered: list[dict]) -> str:
    """GBNF of one Kimi K2 call (`call`): its opening, `functions.`, an offered function's name and an index, then
    the arguments' JSON object held to its parameters' schema."""
    begin, arguments_begin, end = (json.dumps(marker) for marker in _KIMI_CALL)
    def spelled(name: str, arguments: str) -> str:
        return (f'{begin} {json.dumps("functions." + name, ensure_ascii=False)} ":" [0-9]{{1,4}} {arguments_begin}'
                f' {arguments} {end}')

    return _json_argument_calls(offered, spelled)


def _read_kimi_calls(body: str, parameters: dict) -> list[tuple[str, dict, str]]:
    """Kimi K2's calls in one section, as (name, arguments, the id it wrote)."""
    begin, arguments_begin, end = _KIMI_CALL
    calls = []
    for written in body.split(begin)[1:]:
        head, marked, rest = written.partition(arguments_begin)
        arguments, ended, after = rest.rpartition(end)
        call_id = head.strip()
        name = call_id.removeprefix("functions.").rpartition(":")[0]
        try:
            values = json.loads(arguments) if marked and ended and name and not after.strip() else None
        except ValueError:
            values = None
        if not isinstance(values, dict):
            raise InputError(f"the model wrote a tool call that is not Kimi's functions.NAME:INDEX and a JSON object:"
                             f" {written[:80]!r}")
        calls.append((name, values, call_id))
    if not calls or body.split(begin)[0].strip():
        raise InputError(f"the model wrote a tool-call section without calls: {body[:80]!r}")
    return calls


def _alone(read: Callable[[str, dict], tuple[str, dict]]) -> Callable[[str, dict], list[tuple[str, dict]]]:
    """A reader of the one call a form's block holds, as a reader of a block's calls."""
    return lambda body, parameters: [read(body, parameters)]


def _read_json_calls(body: str, parameters: dict, name: str = "name", arguments: str = "arguments"
                     ) -> list[tuple[str, dict]]:
    """A JSON list of calls, each `{"name": ..., "arguments": {...}}` (Apriel's, Nemotron's), or under the keys
    given (Command R7B's `tool_name` and `parameters`)."""
    try:
        calls = json.loads(body)
    except ValueError:
        raise InputError(f"the model wrote tool calls that are not a JSON list: {body[:80]!r}") from None
    if not isinstance(calls, list) or not calls or not all(_is_call(call, arguments, name) for call in calls):
        raise InputError(f"the model wrote a list without calls of a {name} and {arguments}: {body[:80]!r}")
    return [(call[name], call.get(arguments, call.get("arguments"))) for call in calls]  # (as _is_call takes them)


def _json_list(opening: str, closing: str, call_rules: Callable[[list[dict]], str] | None = None,
               read_calls: Callable[[str, dict], list[tuple]] = _read_json_calls) -> _Form:
    """A form whose calls are one JSON list between two markers (Apriel's, Nemotron's, Apertus')."""
    block = f'"{opening}" "[" ws {{calls}} ws "]" "{closing}"'
    return _Form(opening, closing, None, "arguments", (f"({re.escape(opening)})",), block.format(calls="call"),
                 block.format(calls='call (ws "," ws call)*'), call_rules, read_calls, json=True)


# Apertus': a JSON list of calls between two control tokens, each call an object of one key, the function's name,
# whose value is its arguments
_APERTUS = ("<|tools_prefix|>", "<|tools_suffix|>")


def _apertus_rules(offered: list[dict]) -> str:
    """GBNF of one Apertus call (`call`): `{"NAME": arguments}` for an offered function, arguments to its schema."""
    schemas = [{"type": "object", "properties": {function["name"]: arguments_schema(function)},
                "required": [function["name"]], "additionalProperties": False} for function in offered]
    return from_json_schema({"anyOf": schemas} if len(schemas) > 1 else schemas[0], "call")


def _read_named_calls(body: str, parameters: dict) -> list[tuple[str, dict]]:
    """Apertus' list of `{"NAME": arguments}` calls."""
    try:
        calls = json.loads(body)
    except ValueError:
        raise InputError(f"the model wrote tool calls that are not a JSON list: {body[:80]!r}") from None
    if not isinstance(calls, list) or not calls or not all(
            isinstance(call, dict) and len(call) == 1 and isinstance(next(iter(call.values())), dict) for call in calls):
        raise InputError(f"the model wrote a list without calls of a name and arguments: {body[:80]!r}")
    return [next(iter(call.items())) for call in calls]


# Command R7B's: after its plan (<|START_THINKING|>), a JSON list of calls between two control tokens, each
# `{"tool_call_id": "0", "tool_name": ..., "parameters": {...}}`, laid out as its template writes earlier ones
_COHERE_ACTION = ("<|START_ACTION|>", "<|END_ACTION|>")
_COHERE_BLOCK = f'"{_COHERE_ACTION[0]}" "[" indent {{calls}} indent "]" "{_COHERE_ACTION[1]}"'


def _cohere_rules(offered: list[dict]) -> str:
    """GBNF of one Command R7B call (`call`): its id (digits, as a string), an offered function's name, then its
    parameters held to their schema, in that order."""
    schemas = {f"call-{number}": {"type": "object", "properties": {
        "tool_call_id": {"type": "string", "pattern": "^[0-9]{1,4}$"}, "tool_name": {"const": function["name"]},
        "parameters": arguments_schema(function)},
        "required": ["tool_call_id", "tool_name", "parameters"], "additionalProperties": False}
        for number, function in enumerate(offered)}
    return "\n".join([f"call ::= {' | '.join(schemas)}", _json_rules(schemas), "indent ::= [ \\n]{0,8}"])


# LFM2's: a list of Python-style calls between two markers, `<|tool_call_start|>[f(a=1), g()]<|tool_call_end|>`
_LFM2_OPENING, _LFM2_CLOSING = "<|tool_call_start|>", "<|tool_call_end|>"
_LFM2_LIST = 'call ("," ws call)*'


def _lfm2_block(calls: str) -> str:
    return f'"{_LFM2_OPENING}" "[" {calls} "]" "{_LFM2_CLOSING}"'


def _python_rules(offered: list[dict]) -> str:
    """GBNF of one LFM2 call (`call`): `NAME(key=value, ...)`, an offered function's parameters in the schema's
    order (the required ones always), each value its schema's JSON, or as LFM2.5's template writes earlier
    calls (a string between single quotes, True, False); a function whose parameters name no properties takes
    any keys, their values any JSON."""
    as_json, pieces = {"any-value": {"type": ["string", "number", "boolean", "array", "object", "null"]}}, []
    for number, function in enumerate(offered):
        properties, required, open_keys = _parameters(function)
        members = []
        for place, (key, schema) in enumerate(properties.items()):
            value = as_json_rule = f"json-{number}-{place}"
            as_json[as_json_rule] = schema
            if _written_as_text(schema):
                choices = _choices(schema)
                quoted = " | ".join(json.dumps(f"'{c}'", ensure_ascii=False) for c in choices) if choices else "quoted"
                value = f"({as_json_rule} | {quoted})"
            elif isinstance(schema, dict) and schema.get("type") == "boolean":
                value = f'({as_json_rule} | "True" | "False")'
            members.append((f'{json.dumps(key + "=", ensure_ascii=False)} {value}', key in required))
        if open_keys:
            body = 'ws (pkey "=" any-value ("," ws pkey "=" any-value)*)? ws'
        else:
            body = f"args-{number}-0"
            pieces += _in_order(f"args-{number}", members)
        pieces.append(f'call-{number} ::= {json.dumps(function["name"] + "(", ensure_ascii=False)} {body} ")"')
    return "\n".join([f"call ::= {' | '.join(f'call-{number}' for number in range(len(offered)))}", *pieces,
                      "pkey ::= [A-Za-z_] [A-Za-z0-9_]{0,63}", "quoted ::= \"'\" [^'\\\\]* (\"\\\\\" . [^'\\\\]*)* \"'\"",
                      _json_rules(as_json)])


def _read_python_calls(body: str, parameters: dict) -> list[tuple[str, dict]]:
    """LFM2's calls, `[NAME(key=value, ...), ...]`: each name and its arguments, a value as JSON writes it or
    as Python does (True, None, 'text'), as llama.cpp reads them."""
    try:
        calls, at = [], _past_space(body, body.index("[") + 1)
        if body[: body.index("[")].strip():
            raise ValueError("text before the list")
        while body[at] != "]":
            opened = body.index("(", at)
            name, arguments, at = body[at:opened].strip(), {}, _past_space(body, opened + 1)
            while body[at] != ")":
                equals = body.index("=", at)
                key = body[at:equals].strip()
                if not key.isidentifier():
                    raise ValueError(f"no argument's name: {key!r}")
                arguments[key], at = _python_value(body, equals + 1)
                at = _past_space(body, at)
                if body[at] == ",":
                    at = _past_space(body, at + 1)
            if not name:
                raise ValueError("a call without a name")
            calls.append((name, arguments))
            at = _past_space(body, at + 1)
            if body[at] == ",":
                at = _past_space(body, at + 1)
        if body[at + 1:].strip():
            raise ValueError("text after the list")
    except (ValueError, IndexError, RecursionError):
        raise InputError(f"the model wrote tool calls that do not read as LFM2's [NAME(key=value)]: {body[:80]!r}") \
            from None
    return calls


def _past_space(text: str, at: int) -> int:
    while text[at] in " \n\t":
        at += 1
    return at


# a Python or JSON number, and the words either spells a constant with
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_ESCAPED = {"n": "\n", "t": "\t"}
_CONSTANTS = {"True": True, "False": False, "None": None, "true": True, "false": False, "null": None}


def _python_value(text: str, at: int) -> tuple[object, int]:
    """The value at `at`, written as JSON writes it or as Python does (True, None, 'text'), and where it ends
    (ValueError where there is none)."""
    at = _past_space(text, at)
    quote = text[at]
    if quote in "\"'":
        end = at + 1
        while text[end] != quote:
            end += 2 if text[end] == "\\" else 1
        if quote == '"':  # (JSON's string, which Python reads the same)
            return json.loads(text[at:end + 1]), end + 1
        # as LFM2.5's template writes a string: the text between single quotes (a backslash escapes what follows)
        return re.sub(r"\\(.)", lambda m: _ESCAPED.get(m.group(1), m.group(1)), text[at + 1:end], flags=re.DOTALL), end + 1
    if quote in "[{":
        closing, items, at = "]" if quote == "[" else "}", [], _past_space(text, at + 1)
        while text[at] != closing:
            if closing == "}":
                key, at = _python_value(text, at)
                at = _past_space(text, at)
                if text[at] != ":" or not isinstance(key, str):
                    raise ValueError(f"no key at {at}")
                value, at = _python_value(text, at + 1)
                items.append((key, value))
            else:
                value, at = _python_value(text, at)
                items.append(value)
            at = _past_space(text, at)
            if text[at] == ",":
                at = _past_space(text, at + 1)
        return (dict(items) if closing == "}" else items), at + 1
    word = re.match(r"[A-Za-z]+", text[at:])
    if word and word.group() in _CONSTANTS:
        return _CONSTANTS[word.group()], at + word.end()
    number = _NUMBER.match(text, at)
    if number is None:
        raise ValueError(f"no value at {at}")
    return json.loads(number.group()), number.end()


def with_calls_written(messages: list[dict], template: str) -> list[dict]:
    """The conversation with each assistant's earlier calls written after its content as the model wrote them,
    where its template leaves them out (LFM2's and Granite 3's write an assistant's content alone), and a client
    sends a call back as `tool_calls` (the model then read an empty turn and the result of a call it never saw)."""
    if "tool_calls" in template or not any(m.get("tool_calls") for m in messages):
        return messages
    try:
        form = tool_format(template)
    except InputError:  # (a template without tools: the calls are left out, as it writes them)
        return messages
    if form not in (ToolFormat.LFM2, ToolFormat.GRANITE):
        return messages

    def called(call: dict) -> str:
        function = call["function"]
        arguments = ", ".join(f"{key}={json.dumps(value, ensure_ascii=False)}"
                              for key, value in (function.get("arguments") or {}).items())
        return f"{function['name']}({arguments})"

    def written(calls: list[dict]) -> str:
        if form is ToolFormat.GRANITE:
            return _GRANITE_CALL + json.dumps([{"name": call["function"]["name"],
                                                "arguments": call["function"].get("arguments") or {}}
                                               for call in calls], ensure_ascii=False)
        return f"{_LFM2_OPENING}[{', '.join(map(called, calls))}]{_LFM2_CLOSING}"

    return [m | {"content": (m.get("content") or "") + written(m["tool_calls"])} if m.get("tool_calls") else m
            for m in messages]


# Mistral's templates refuse any other call id, with this message
_NINE_ONLY = "alphanumeric strings with length 9"
_NINE = re.compile(r"[A-Za-z0-9]{9}")


def with_ids_it_takes(messages: list[dict], template: str) -> list[dict]:
    """The conversation with the call ids its template takes: where it takes only nine letters and digits
    (Mistral's), another model's ids (`call_...`, `toolu_...`: a conversation Mistral goes on with) are written as
    nine of their own, each the same for the call and for its result."""
    if _NINE_ONLY not in template:
        return messages

    def nine(given):
        if not isinstance(given, str) or _NINE.fullmatch(given):
            return given
        digest = hashlib.sha256(given.encode()).digest()
        return "".join((string.ascii_letters + string.digits)[byte % 62] for byte in digest[:9])

    def renamed(message: dict) -> dict:
        if isinstance(message.get("tool_calls"), list):
            return message | {"tool_calls": [call | {"id": nine(call.get("id"))} for call in message["tool_calls"]]}
        return message | {"tool_call_id": nine(message["tool_call_id"])} if "tool_call_id" in message else message

    return [renamed(message) for message in messages]


# Llama 3.1's to 3.3's templates refuse an assistant's message of several calls, with this message
_ONE_CALL_ONLY = "only supports single tool-calls"


def with_one_call_a_turn(messages: list[dict], template: str) -> list[dict]:
    """The conversation as a template that writes one call an assistant's message takes it (Llama 3.x's): another
    model's calls made together are written a message each, each followed by its result (those without an id
    that matches after them)."""
    if _ONE_CALL_ONLY not in template:
        return messages
    out, at = [], 0
    while at < len(messages):
        message, at = messages[at], at + 1
        calls = message.get("tool_calls")
        if not isinstance(calls, list) or len(calls) < 2:
            out.append(message)
            continue
        results = []
        while at < len(messages) and messages[at].get("role") == "tool":
            results.append(messages[at])
            at += 1
        for number, call in enumerate(calls):
            out.append(message | {"tool_calls": [call]} if number == 0 else
                       {"role": "assistant", "content": "", "tool_calls": [call]})
            answered = [result for result in results if result.get("tool_call_id") == call.get("id")]
            out += answered
            results = [result for result in results if result not in answered]
        out += results
    return out


def shown(events: Iterator, form: ToolFormat | None, control_text: Callable[[int], str | None]) -> Iterator:
    """A generation's events with the control tokens that mark a form's calls written into the text, as
    llama.cpp's preserved tokens are (Mistral's [TOOL_CALLS], [CALL_ID] and [ARGS], which generated text
    leaves out: without its opening, a call after some content read as content); the events as they are for
    every other form."""
    if form is ToolFormat.FUNCTIONARY_V32:
        return _each(events, _Recipients().rewritten)
    markers = _MARKERS.get(form)
    if not markers:
        return events

    def marked(event):
        if isinstance(event, Token) and (marker := control_text(event.id)) in markers:
            return replace(event, text=event.text + marker)
        return event

    return _each(events, marked)


def _each(events: Iterator, change: Callable) -> Iterator:
    """The events, each changed."""
    try:
        for event in events:
            yield change(event)
    finally:
        if hasattr(events, "close"):  # (a generation, closed with it: its sequence is free at once)
            events.close()


# Granite 3's: a JSON list of calls after a control token, to the answer's end (its template writes no earlier call)
_GRANITE_CALL = "<|tool_call|>"
# GigaChat 3's: after the content's <|message_sep|>, a turn of the `function call` role (its header ended by
# <|role_sep|>, a control token, written into the text for the reader) holding one JSON call; 3.1's: one JSON call
# after <|function_call|>. Either model calls one function an answer.
_GIGACHAT_ROLE = "<|role_sep|>"
_GIGACHAT3_CALL = "function call" + _GIGACHAT_ROLE
_GIGACHAT31_CALL = "<|function_call|>"
# Firefunction v2's: ` functools[` then a JSON list of calls, no closing marker
_FUNCTOOLS = "functools["
# Functionary v3.1's: <function=NAME>, the arguments' JSON object, </function>
_FUNCTIONARY = ("<function=", "</function>")


def _functionary_rules(offered: list[dict]) -> str:
    """GBNF of one Functionary v3.1 call (`call`): `<function=NAME>`, the arguments held to its parameters' schema,
    `</function>`."""
    return _json_argument_calls(offered, lambda name, arguments: f'{json.dumps(_FUNCTIONARY[0] + name + ">")}'
                                f' {arguments} {json.dumps(_FUNCTIONARY[1])}')


def _read_functionary_call(body: str, parameters: dict) -> tuple[str, dict]:
    """A Functionary v3.1 call without its opening and closing: NAME>, then the arguments' JSON object."""
    name, marked, arguments = body.partition(">")
    try:
        values = json.loads(arguments) if marked and name.strip() else None
    except ValueError:
        values = None
    if not isinstance(values, dict):
        raise InputError(f"the model wrote a tool call that is not <function=NAME> and a JSON object: {body[:80]!r}")
    return name.strip(), values


# Functionary v3.2's: its prompt ends `>>>`, and the model names the message's recipient, then a newline: `all` for
# the content, a function's name for a call of it, its arguments' JSON object the message's text
_RECIPIENT = ">>>"
_FUNCTIONARY_CONTENT = _RECIPIENT + "all"
# (a recipient's name is a line of its own: a longer one is text of a model that left the form)
_LONGEST_RECIPIENT = 128


def _functionary_v32_rules(offered: list[dict]) -> str:
    """GBNF of one Functionary v3.2 call (`call`): an offered function's name and a newline, then the arguments
    held to its parameters' schema."""
    return _json_argument_calls(offered, lambda name, arguments: f"{json.dumps(name + chr(10), ensure_ascii=False)}"
                                f" {arguments}")


def content_opening(template: str, tools: "Tools | None") -> str:
    """The text a prompt ends with, past the template's own, where the reply is to be content alone: Functionary
    v3.2's recipient `all`, as its template writes an assistant's content (its generation prompt leaves the
    recipient to the model, who may choose a tool; without tools on offer there is none to choose)."""
    if _FUNCTIONARY_CONTENT in template and (tools is None or tools.choice == "none"):
        return "all\n"
    return ""


class _Recipients:
    """Functionary v3.2's messages as they stream, the first opened by the prompt's `>>>`: `all`'s text passed on
    as the content, a call written as Hermes' block that the reader reads (harmony's calls are written so too)."""

    def __init__(self):
        self._pending = ""
        self._header: str | None = ""  # the recipient's name while it is read; None in a message's text
        self._call = False

    def feed(self, text: str) -> str:
        self._pending += text
        out = []
        while self._pending:
            if self._header is not None:
                line, newline, rest = self._pending.partition("\n")
                if not newline and len(self._header + line) <= _LONGEST_RECIPIENT:
                    self._header, self._pending = self._header + line, ""
                    break
                written, self._header = self._header + line, None
                if not newline:  # no recipient at all: a model that left the form writes content
                    out.append(written)
                    self._pending = ""
                    break
                recipient, self._pending = written.strip(), rest
                if recipient != "all":
                    self._call = True
                    out.append(CALL_OPENING.format(name=json.dumps(recipient, ensure_ascii=False)))
                continue
            at = self._pending.find(_RECIPIENT)
            if at >= 0:
                out += [self._pending[:at], self._end_of_call()]
                self._pending, self._header = self._pending[at + len(_RECIPIENT):], ""
                continue
            keep = next((n for n in range(len(_RECIPIENT) - 1, 0, -1) if self._pending.endswith(_RECIPIENT[:n])), 0)
            out.append(self._pending[:len(self._pending) - keep])
            self._pending = self._pending[len(self._pending) - keep:]
            break
        return "".join(out)

    def finish(self, stopped: bool) -> str:
        """What is held at the reply's end; stopped: the model ended it (a call a limit cut off stays open, for
        the reader to refuse as unfinished)."""
        held, self._pending = self._pending, ""
        if self._header is not None:
            header, self._header = self._header, None
            return header if header.strip() != "all" else ""
        return held + (self._end_of_call() if stopped else "")

    def _end_of_call(self) -> str:
        ended, self._call = self._call, False
        return CALL_CLOSING if ended else ""

    def rewritten(self, event):
        """A generation's event with its text rewritten (a Token's, a Done's tail and what is held at its end)."""
        if isinstance(event, Token):
            return replace(event, text=self.feed(event.text))
        if isinstance(event, Done):
            return replace(event, tail=self.feed(event.tail) + self.finish(event.finish_reason == "stop"))
        return event



def template_variables(template: str, tools: Tools | None) -> dict:
    """What a family's template reads of the tools beyond `tools`: Firefunction v2's `functions`, their definitions
    as JSON text (as its model card passes them; its template fails without it, tools or not); Kimi K3's
    `tool_choice`, which it tells the model of (a named function: required)."""
    variables = {}
    if _FUNCTOOLS in template and "functions" in template:
        variables["functions"] = json.dumps([d["function"] for d in tools.definitions] if tools else [], indent=4,
                                            ensure_ascii=False)
    if tools and tools.choice != "auto" and "tool_choice" in template:
        variables["tool_choice"] = tools.choice if tools.choice == "none" else "required"
    return variables


# DeepSeek R1's and V3's: `<｜tool▁calls▁begin｜>`, then each call `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`, a newline,
# its arguments' JSON object fenced as ```json, `<｜tool▁call▁end｜>`, then `<｜tool▁calls▁end｜>`
_DEEPSEEK_CALLS = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
_DEEPSEEK_CALL = ("<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>")


def _deepseek_rules(offered: list[dict]) -> str:
    """GBNF of one DeepSeek R1 call (`call`): its opening, `function`, an offered function's name, then the arguments
    fenced as ```json and held to its parameters' schema."""
    begin, sep, end = _DEEPSEEK_CALL

    def spelled(name: str, arguments: str) -> str:
        return (f'{json.dumps(f"{begin}function{sep}{name}", ensure_ascii=False)} "\\n```json\\n" {arguments}'
                f' "\\n"? "```" "\\n"? {json.dumps(end, ensure_ascii=False)}')

    return _json_argument_calls(offered, spelled)


def _read_deepseek_calls(body: str, parameters: dict, named_first: bool = False) -> list[tuple[str, dict]]:
    """DeepSeek's calls in one block: R1's and V3's each `function<｜tool▁sep｜>NAME` and its fenced JSON object,
    V3.1's (named_first) each `NAME<｜tool▁sep｜>` and its JSON object."""
    begin, sep, end = _DEEPSEEK_CALL
    calls = []
    for written in body.split(begin)[1:]:
        head, marked, rest = written.partition(sep)
        name, arguments = (head, rest) if named_first else rest.partition("\n")[::2]
        arguments, ended, after = arguments.rpartition(end)
        try:
            values = json.loads(arguments.strip().removeprefix("```json").removesuffix("```")) \
                if marked and ended and name.strip() and not after.strip() else None
        except ValueError:
            values = None
        if not isinstance(values, dict):
            raise InputError(f"the model wrote a tool call that is not DeepSeek's name and JSON object: {written[:80]!r}")
        calls.append((name.strip(), values))
    if not calls or body.split(begin)[0].strip():
        raise InputError(f"the model wrote a tool-call block without calls: {body[:80]!r}")
    return calls


def _deepseek_v31_rules(offered: list[dict]) -> str:
    """GBNF of one DeepSeek V3.1 call (`call`): its opening, an offered function's name, `<｜tool▁sep｜>`, then the
    arguments held to its parameters' schema."""
    begin, sep, end = _DEEPSEEK_CALL
    return _json_argument_calls(offered, lambda name, arguments: f"{json.dumps(begin + name + sep, ensure_ascii=False)}"
                                f" {arguments} {json.dumps(end, ensure_ascii=False)}")


def described_tools(form: ToolFormat | None, template: str, tools: "Tools | None") -> str | None:
    """The tools described for a model whose makers have the application write them into the system prompt, where
    its template does not (DeepSeek V3.1's, in the form its model card gives, as Ollama and vLLM write it); None
    where the template writes them itself or no tool is offered."""
    if form is not ToolFormat.DEEPSEEK_V31 or not tools or "tools" in template:
        return None
    begin, sep, end = _DEEPSEEK_CALL
    listed = "".join(f"\n### {d['function']['name']}\nDescription: {d['function'].get('description') or ''}\n\n"
                     f"Parameters: {json.dumps(d['function'].get('parameters') or {}, ensure_ascii=False)}\n"
                     for d in tools.definitions)
    return (f"## Tools\nYou have access to the following tools:\n{listed}\nIMPORTANT: ALWAYS adhere to this exact"
            f" format for tool use:\n{_DEEPSEEK_CALLS[0]}{begin}tool_call_name{sep}tool_call_arguments{end}"
            f"{{{{additional_tool_calls}}}}{_DEEPSEEK_CALLS[1]}\n\nWhere:\n\n- `tool_call_name` must be an exact match"
            " to one of the available tools\n- `tool_call_arguments` must be valid JSON that strictly follows the"
            " tool's Parameters Schema\n- For multiple tool calls, chain them directly without separators or spaces\n")


# Solar Open's: a message of the `tool_calls` channel (reasoning.py hands it on as written), each call
# `<|tool_call:begin|>ID<|tool_call:name|>NAME<|tool_call:args|>` and its JSON object, then `<|tool_call:end|>`; its
# end, `<|calls|>`, ends the reply
_SOLAR_CALLS = "<|tool_calls|>"
_SOLAR_CALL = ("<|tool_call:begin|>", "<|tool_call:name|>", "<|tool_call:args|>", "<|tool_call:end|>")


def _solar_rules(offered: list[dict]) -> str:
    """GBNF of one Solar Open call (`call`): its id, an offered function's name, then its arguments held to its
    parameters' schema."""
    begin, name_mark, args_mark, end = (json.dumps(mark) for mark in _SOLAR_CALL)
    return _json_argument_calls(offered, lambda name, arguments: f"{begin} [A-Za-z0-9_-]{{1,40}} {name_mark}"
                                f" {json.dumps(name, ensure_ascii=False)} {args_mark} {arguments} {end}")


def _read_solar_calls(body: str, parameters: dict) -> list[tuple[str, dict, str]]:
    """Solar Open's calls, as (name, arguments, the id it wrote, which its template writes back)."""
    begin, name_mark, args_mark, end = _SOLAR_CALL
    calls = []
    for written in body.split(begin)[1:]:
        call_id, _, rest = written.partition(name_mark)
        name, marked, arguments = rest.partition(args_mark)
        arguments, ended, after = arguments.rpartition(end)
        try:
            values = json.loads(arguments) if marked and ended and name.strip() and not after.strip() else None
        except ValueError:
            values = None
        if not isinstance(values, dict):
            raise InputError(f"the model wrote a tool call that is not Solar Open's ID, NAME and a JSON object:"
                             f" {written[:80]!r}")
        calls.append((name.strip(), values, call_id.strip()))
    if not calls or body.split(begin)[0].strip():
        raise InputError(f"the model wrote a tool-call message without calls: {body[:80]!r}")
    return calls


# MiniMax-M1's: a <tool_calls> block of JSON calls, one a line (its template teaches it so, its newline escaped)
_MINIMAX_M1_TAUGHT = '<tool_calls>\\n{"name"'


def _read_json_lines(body: str, parameters: dict) -> list[tuple[str, dict]]:
    """MiniMax-M1's calls: JSON objects `{"name": ..., "arguments": {...}}` one after another, a line each (as the
    grammar lets JSON be laid out, one may take several)."""
    calls, at, decoder = [], 0, json.JSONDecoder()
    try:
        while body[at:].strip():
            call, at = decoder.raw_decode(body, len(body) - len(body[at:].lstrip()))
            calls.append(call)
    except ValueError:
        calls = []
    if not calls or not all(_is_call(call, "arguments") for call in calls):
        raise InputError(f"the model wrote tool calls that are not JSON calls a line: {body[:80]!r}")
    return [(call["name"], call["arguments"]) for call in calls]


# Kimi K3's: calls in one `tools` section (XTML, reasoning.py), each `<|open|>call tool="NAME" index="N"<|sep|>`, then
# each argument `<|open|>argument key="KEY" type="TYPE"<|sep|>VALUE<|close|>argument<|sep|>` (a string's value as
# written, any other's JSON), then `<|close|>call<|sep|>`; an attribute's `&` and `"` escaped as XML's
_KIMI_K3_TOOLS = (f"{XTML_OPEN}tools{XTML_SEP}", f"{XTML_CLOSE}tools{XTML_SEP}")
_KIMI_K3_TYPES = {"string": "string", "integer": "number", "number": "number", "boolean": "boolean", "null": "null",
                  "object": "object", "array": "array"}


def _xtml_attribute(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;")


def _kimi_k3_rules(offered: list[dict]) -> str:
    """GBNF of one Kimi K3 call (`call`): an offered function's `call` section, its index, then its arguments in the
    schema's order (the required ones always), each with the type its template writes: a string's value any text
    without a marker (or one of its enum), any other's its schema's JSON; a function whose parameters name no
    properties takes any keys."""
    def literal(text: str) -> str:
        return json.dumps(text, ensure_ascii=False)

    attribute_end, argument_end = literal('"' + XTML_SEP), literal(f"{XTML_CLOSE}argument{XTML_SEP}")
    as_json, calls, pieces = {}, [], []
    for number, function in enumerate(offered):
        properties, required, open_keys = _parameters(function)
        arguments = []
        for place, (key, schema) in enumerate(properties.items()):
            choices = _choices(schema)
            if _written_as_text(schema):
                kind, value = "string", f"({' | '.join(map(literal, choices))})" if choices else "xtext"
            else:
                value = f"json-{number}-{place}"
                as_json[value] = schema
                kind = _KIMI_K3_TYPES.get(schema.get("type") if isinstance(schema, dict) else None)
            opened = literal(f'{XTML_OPEN}argument key="{_xtml_attribute(key)}" type="{kind or ""}')
            argument = f"{opened} {'' if kind else '[a-z]+ '}{attribute_end} {value} {argument_end}"
            arguments.append(argument if key in required else f"({argument})?")
        if open_keys:
            arguments.append(f"""({literal(XTML_OPEN + 'argument key="')} [^"<]+ {literal('" type="')} [a-z]+"""
                             f" {attribute_end} xtext {argument_end})*")
        name = literal(f'{XTML_OPEN}call tool="{_xtml_attribute(function["name"])}" index="')
        pieces.append(f"call-{number} ::= {name} [1-9] [0-9]? {attribute_end} {' '.join(arguments)}"
                      f" {literal(XTML_CLOSE + 'call' + XTML_SEP)}")
        calls.append(f"call-{number}")
    return "\n".join([f"call ::= {' | '.join(calls)}", *pieces, _text_without(XTML_CLOSE, "xtext"),
                      _json_rules(as_json)])


_XTML_ATTRIBUTE = re.compile(r'(\w+)="([^"]*)"')


def _read_kimi_k3_calls(body: str, parameters: dict) -> list[tuple[str, dict]]:
    """Kimi K3's calls in one `tools` section, each argument read by its schema (else by the type it wrote);
    a call written as one `json` section (as its template writes arguments that came as text) read as JSON."""
    def unescaped(value: str) -> str:
        return value.replace("&quot;", '"').replace("&amp;", "&")

    calls = []
    for written in body.split(f"{XTML_OPEN}call ")[1:]:
        head, marked, rest = written.partition(XTML_SEP)
        attributes = {key: unescaped(value) for key, value in _XTML_ATTRIBUTE.findall(head)}
        name, schemas, arguments = attributes.get("tool"), parameters.get(attributes.get("tool"), {}), {}
        rest, ended, after = rest.rpartition(f"{XTML_CLOSE}call{XTML_SEP}")
        if not (marked and ended and name) or after.strip():
            raise InputError(f"the model wrote a tool call that is not Kimi K3's call section: {written[:80]!r}")
        for section in rest.split(XTML_OPEN)[1:]:
            head, _, value = section.partition(XTML_SEP)
            value, closed, _ = value.rpartition(XTML_CLOSE)
            attributes = {key: unescaped(found) for key, found in _XTML_ATTRIBUTE.findall(head)}
            if head.startswith("json") and closed:
                try:
                    arguments = json.loads(value)
                except ValueError:
                    arguments = None
                if not isinstance(arguments, dict):
                    raise InputError(f"the model wrote a tool call's json that is not an object: {value[:80]!r}")
            elif head.startswith("argument") and closed and "key" in attributes:
                key = attributes["key"]
                schema = schemas.get(key) if key in schemas else {"type": attributes.get("type", "string")}
                arguments[key] = _value(value, schema)
            else:
                raise InputError(f"the model wrote a tool call's argument that does not read: {section[:80]!r}")
        calls.append((name, arguments))
    if not calls or body.split(f"{XTML_OPEN}call ")[0].strip():
        raise InputError(f"the model wrote a tools section without calls: {body[:80]!r}")
    return calls


# MiniMax-M3's: every tag after its namespace token; calls one after another in a block, each argument an element
# named by its key, an object's value its members' elements and a list's its <item>s, as its template's to_xml writes
# them (a string as written, a number or a boolean as JSON)
_MM3 = "]<]minimax[>["
_MM3_BLOCK = (_MM3 + "<tool_call>", _MM3 + "</tool_call>")
_MM3_INVOKE = (_MM3 + '<invoke name="', '">', _MM3 + "</invoke>")


def _m3_kind(schema) -> str | None:
    """How MiniMax-M3 writes a value of the schema: "text" as written (a string may be among what it allows),
    "array" as <item>s, "object" as its members' elements, "json" as JSON; None where the schema says nothing."""
    if not isinstance(schema, dict) or not schema:
        return None
    types = schema.get("type")
    alternatives = [alternative for alternative in schema.get("anyOf") or schema.get("oneOf") or () if alternative]
    if (_written_as_text(schema) or (isinstance(types, list) and "string" in types)
            or any(_m3_kind(alternative) in ("text", None) for alternative in alternatives)):
        return "text"
    if isinstance(types, list):  # (["array", "null"]: as the type that is not null)
        types = next((kind for kind in types if kind != "null"), None)
    if types == "array" or "items" in schema:
        return "array"
    if types == "object" or "properties" in schema:
        return "object"
    return "json"


def _minimax_m3_rules(offered: list[dict]) -> str:
    """GBNF of one MiniMax-M3 call (`call`): an offered function's <invoke>, then its arguments' elements in the
    schema's order (the required ones always), nested as the schema nests objects (their members' elements) and
    lists (<item>s); a string's value any text without the namespace token (or one of its enum), any other scalar's
    its schema's JSON; an object that names no properties takes any keys, their values any text."""
    def literal(text: str) -> str:
        return json.dumps(text, ensure_ascii=False)

    rules, as_json = [], {}

    def value(schema, rule: str) -> str:
        kind = _m3_kind(schema)
        if kind in ("text", None):
            choices = _choices(schema)
            return f"({' | '.join(map(literal, choices))})" if choices else "mtext"
        if kind == "array":
            items = value(schema.get("items"), rule + "-item")
            return f'(ws {literal(_MM3 + "<item>")} {items} {literal(_MM3 + "</item>")})* ws'
        if kind == "object":
            rules.append(f"{rule} ::= {members(schema, rule)}")
            return rule
        as_json[rule] = schema
        return rule

    def members(schema: dict, rule: str) -> str:
        properties, required, open_keys = _members(schema)
        elements = []
        for place, (key, member) in enumerate(properties.items()):
            element = (f'ws {literal(f"{_MM3}<{key}>")} {value(member, f"{rule}-{place}")}'
                       f' {literal(f"{_MM3}</{key}>")}')
            elements.append(element if key in required else f"({element})?")
        if open_keys:
            elements.append(f'(ws {literal(_MM3 + "<")} [^<>/]+ ">" mtext {literal(_MM3 + "</")} [^<>/]+ ">")*')
        return " ".join([*elements, "ws"])

    calls = []
    for number, function in enumerate(offered):
        name = literal(_MM3_INVOKE[0] + function["name"] + _MM3_INVOKE[1])
        rules.append(f"call-{number} ::= {name} {members(arguments_schema(function), f'mm-{number}')}"
                     f" {literal(_MM3_INVOKE[2])}")
        calls.append(f"call-{number}")
    # (text without the namespace token's first run that holds its `<` once: the token, whole, is refused in it)
    return "\n".join([f"call ::= {' | '.join(calls)}", *rules, _text_without(_MM3[1:], "mtext"), _json_rules(as_json)])


def _read_minimax_m3_calls(body: str, parameters: dict) -> list[tuple[str, dict]]:
    """MiniMax-M3's calls in one block, each argument read by its schema where it has one (else by its markup: an
    <item> a list's, another element an object's member)."""
    calls, at = [], 0
    try:
        while body[at:].strip():
            if not body.startswith(_MM3_INVOKE[0], at := _past_space(body, at)):
                raise ValueError
            named = body.index(_MM3_INVOKE[1], at)
            name = body[at + len(_MM3_INVOKE[0]):named]
            arguments, at = _m3_members(body, named + len(_MM3_INVOKE[1]), parameters.get(name, {}), _MM3_INVOKE[2])
            calls.append((name, arguments))
    except (ValueError, IndexError):
        raise InputError(f"the model wrote tool calls that do not read as MiniMax-M3's <invoke>s: {body[:80]!r}") \
            from None
    return calls


def _m3_members(text: str, at: int, properties: dict, closing: str) -> tuple[dict, int]:
    """An object's members' elements up to its closing: the object, and where its closing ends."""
    found = {}
    while not text.startswith(closing, at := _past_space(text, at)):
        if not text.startswith(_MM3 + "<", at):
            raise ValueError
        named = text.index(">", at + len(_MM3))
        key = text[at + len(_MM3) + 1:named]
        found[key], at = _m3_value(text, named + 1, properties.get(key), f"{_MM3}</{key}>")
    return found, at + len(closing)


def _m3_value(text: str, at: int, schema, closing: str) -> tuple[object, int]:
    """A value up to its closing tag: the value, and where its closing ends."""
    schema = schema if isinstance(schema, dict) else {}
    kind, start, item = _m3_kind(schema), _past_space(text, at), _MM3 + "<item>"
    if kind is None and text.startswith(_MM3 + "<", start) and not text.startswith(closing, start):
        kind = "array" if text.startswith(item, start) else "object"
    if kind == "array":
        items = []
        while not text.startswith(closing, at := _past_space(text, at)):
            if not text.startswith(item, at):
                raise ValueError
            value, at = _m3_value(text, at + len(item), schema.get("items"), _MM3 + "</item>")
            items.append(value)
        return items, at + len(closing)
    if kind == "object":
        return _m3_members(text, start, schema.get("properties") or {}, closing)
    end = text.index(closing, at)
    return text[at:end] if kind == "text" else _value(text[at:end], schema or None), end + len(closing)


# Each family's form; its grammar's `call` and reader are the JSON object's unless it names its own.
_BLOCK = '"<tool_call>" ws call ws "</tool_call>"'
_SEED_BLOCK = '"<seed:tool_call>" ws call ws "</seed:tool_call>"'
_GEMMA_BLOCK = '"<|tool_call>" call "<tool_call|>"'
_QWEN_XML = _Markup(("<function=", ">"), ("<parameter=", ">"), ("", "</parameter>"), "</function>")
_GLM = _Markup(("", ""), ("<arg_key>", "</arg_key>"), ("<arg_value>", "</arg_value>"), "")
# MiniMax-M2's: its calls are <invoke>s, one after another inside one <minimax:tool_call> block
_MINIMAX = _Markup(('<invoke name="', '">'), ('<parameter name="', '">'), ("", "</parameter>"), "</invoke>")
# MiniCPM5's: calls one after another, no block around them
_MINICPM5 = _Markup(('<function name="', '">'), ('<param name="', '">'), ("", "</param>"), "</function>", cdata=True)
# Muse Glimmer's: each call a message addressed to the tool (`<|start|>assistant to=NAME<|message|>`, which the
# reasoning splitter leaves out), an <atem:function_calls> block of MiniMax's <invoke> markup under its own namespace
_ATEM = _Markup(('<atem:invoke name="', '">'), ('<atem:parameter name="', '">'), ("", "</atem:parameter>"),
                "</atem:invoke>")
_ATEM_BLOCK = ("<atem:function_calls>", "</atem:function_calls>")
_ATEM_CALL = f'" to=" recipient "<|message|>" "{_ATEM_BLOCK[0]}" ws call ws "{_ATEM_BLOCK[1]}"'


def _atem_rules(offered: list[dict]) -> str:
    """GBNF of one Muse Glimmer call (`call`, MiniMax's markup) and of whom its message addresses (`recipient`): an
    offered function."""
    names = " | ".join(json.dumps(function["name"], ensure_ascii=False) for function in offered)
    return f"{_markup_rules(_ATEM, offered)}\nrecipient ::= {names}"
# Hy3's: its template's every marker carries a suffix (`HYTK`), the released one's `:opensource`; calls one after
# another in a block, each its name and <tool_sep>, then <arg_key>s and <arg_value>s on lines of their own
_HY3_MARK = "set HYTK = ':opensource'"
_HY3 = _Markup(("<tool_call:opensource>", "<tool_sep:opensource>"), ("<arg_key:opensource>", "</arg_key:opensource>"),
               ("<arg_value:opensource>", "</arg_value:opensource>"), "</tool_call:opensource>")
# DeepSeek V3.2's and V4's DSML: MiniMax's <invoke>s under its own marker, each key saying how its value is written
_DSML_MARK = "｜DSML｜"
_DSML = _Markup((f'<{_DSML_MARK}invoke name="', '">'), (f'<{_DSML_MARK}parameter name="', '">'),
                ("", f"</{_DSML_MARK}parameter>"), f"</{_DSML_MARK}invoke>", ('" string="true">', '" string="false">'))


def _values(markup: _Markup) -> tuple[str, str]:
    """Where a markup form's values begin (after their own opening, or their key's tag) and end."""
    opening = re.escape(markup.value[0]) if markup.value[0] else re.escape(markup.key[0]) + "[^>]*>"
    return opening, markup.value[1]


def _invokes(markup: _Markup, opening: str, closing: str) -> _Form:
    """A form whose calls are <invoke>s (or Hy3's like of them) one after another in blocks between two markers
    (MiniMax's, DeepSeek's, Hy3's)."""
    calls = f'"{opening}" ws {{calls}} ws "{closing}"'
    return _Form(opening, closing, None, "arguments", (f"({re.escape(opening)})",), calls.format(calls="call"),
                 f'{calls.format(calls="call (ws call)*")} (ws {calls.format(calls="call (ws call)*")})*',
                 partial(_markup_rules, markup), partial(_read_invokes, markup), values=_values(markup))


_FORMS = {
    ToolFormat.HERMES: _Form("<tool_call>", "</tool_call>", "{", "arguments", (r"(<tool_call>)", _WHOLE_CALL_TRIGGER),
                             f'{_BLOCK} | call ws "```"?', f'{_BLOCK} (ws {_BLOCK})* | call ws "```"?', json=True),
    ToolFormat.LLAMA3: _Form(None, None, "{", "parameters", (_WHOLE_CALL_TRIGGER,), 'call ws "```"?', 'call ws "```"?'),
    # [TOOL_CALLS] is a control token, written into the text by shown() (a file where it is text has it anyway)
    ToolFormat.MISTRAL: _Form("[TOOL_CALLS]", None, "[", "arguments", (r"(\[TOOL_CALLS\])",),
                              '"[TOOL_CALLS]" "[" call "]"', '"[TOOL_CALLS]" "[" call ("," ws call)* "]"'),
    ToolFormat.GRANITE: _Form(_GRANITE_CALL, None, "[", "arguments", (r"(<\|tool_call\|>)",),
                              f'"{_GRANITE_CALL}" "[" call "]"', f'"{_GRANITE_CALL}" "[" call ("," ws call)* "]"'),
    ToolFormat.HARMONY: _Form("<tool_call>", "</tool_call>", "{", "arguments", (), "", "", json=True),
    ToolFormat.XML: _Form("<tool_call>", "</tool_call>", None, "arguments", (r"(<tool_call>)",), _BLOCK,
                          f"{_BLOCK} (ws {_BLOCK})*", partial(_markup_rules, _QWEN_XML),
                          _alone(partial(_read_markup, _QWEN_XML)), values=_values(_QWEN_XML)),
    ToolFormat.SEED: _Form("<seed:tool_call>", "</seed:tool_call>", None, "arguments", (r"(<seed:tool_call>)",),
                           _SEED_BLOCK, f"{_SEED_BLOCK} (ws {_SEED_BLOCK})*", partial(_markup_rules, _QWEN_XML),
                           _alone(partial(_read_markup, _QWEN_XML)), values=_values(_QWEN_XML)),
    ToolFormat.APRIEL: _json_list("<tool_calls>", "</tool_calls>"),
    ToolFormat.NEMOTRON: _json_list("<TOOLCALL>", "</TOOLCALL>"),
    ToolFormat.APERTUS: _json_list(*_APERTUS, _apertus_rules, _read_named_calls),
    ToolFormat.COMMAND_R7B: _Form(*_COHERE_ACTION, None, "parameters", (r"(<\|START_ACTION\|>)",),
                                  _COHERE_BLOCK.format(calls="call"), _COHERE_BLOCK.format(calls='call ("," indent call)*'),
                                  _cohere_rules, partial(_read_json_calls, name="tool_name", arguments="parameters"),
                                  json=True),
    ToolFormat.GLM: _Form("<tool_call>", "</tool_call>", None, "arguments", (r"(<tool_call>)",), _BLOCK,
                          f"{_BLOCK} (ws {_BLOCK})*", partial(_markup_rules, _GLM), _alone(partial(_read_markup, _GLM)),
                          values=_values(_GLM)),
    ToolFormat.MISTRAL_ARGS: _Form("[TOOL_CALLS]", None, None, "arguments", (r"(\[TOOL_CALLS\])",),
                                   '"[TOOL_CALLS]" call', '"[TOOL_CALLS]" call (ws "[TOOL_CALLS]" call)*', _args_rules,
                                   _alone(_read_args_call)),
    ToolFormat.GEMMA4: _Form("<|tool_call>", "<tool_call|>", None, "arguments", (r"(<\|tool_call>)",), _GEMMA_BLOCK,
                             f"{_GEMMA_BLOCK} (ws {_GEMMA_BLOCK})*", _gemma_rules,
                             _alone(lambda body, parameters: _read_gemma(body))),  # (its strings are marked as such)
    ToolFormat.MINIMAX: _invokes(_MINIMAX, "<minimax:tool_call>", "</minimax:tool_call>"),
    # (a call's text read without its opening and closing)
    ToolFormat.MINICPM5: _Form('<function name="', "</function>", None, "arguments", (r'(<function name=")',), "call",
                               "call (ws call)*", partial(_markup_rules, _MINICPM5),
                               _alone(partial(_read_markup, replace(_MINICPM5, name=("", '">'), end=""))),
                               values=(re.escape("<![CDATA["), "]]>")),
    ToolFormat.DSML_FUNCTIONS: _invokes(_DSML, f"<{_DSML_MARK}function_calls>", f"</{_DSML_MARK}function_calls>"),
    ToolFormat.DSML: _invokes(_DSML, f"<{_DSML_MARK}tool_calls>", f"</{_DSML_MARK}tool_calls>"),
    ToolFormat.KIMI: _Form(_KIMI_SECTION[0], _KIMI_SECTION[1], None, "arguments", (r"(<\|tool_calls_section_begin\|>)",),
                           f'"{_KIMI_SECTION[0]}" call "{_KIMI_SECTION[1]}"',
                           f'"{_KIMI_SECTION[0]}" call (ws call)* "{_KIMI_SECTION[1]}"', _kimi_rules, _read_kimi_calls,
                           json=True),
    ToolFormat.GIGACHAT3: _Form(_GIGACHAT3_CALL, None, None, "arguments",
                                (r"(<\|message_sep\|>)\s*function call<\|role_sep\|>",),
                                f'"<|message_sep|>" ws "{_GIGACHAT3_CALL}" ws call',
                                f'"<|message_sep|>" ws "{_GIGACHAT3_CALL}" ws call'),
    ToolFormat.GIGACHAT31: _Form(_GIGACHAT31_CALL, None, None, "arguments", (r"(<\|function_call\|>)",),
                                 f'"{_GIGACHAT31_CALL}" ws call', f'"{_GIGACHAT31_CALL}" ws call'),
    ToolFormat.FIREFUNCTION: _Form(_FUNCTOOLS, None, None, "arguments", (r"(functools\[)",),
                                   f'"{_FUNCTOOLS}" ws call ws "]"', f'"{_FUNCTOOLS}" ws call (ws "," ws call)* ws "]"',
                                   read_calls=lambda body, parameters: _read_json_calls("[" + body, parameters)),
    ToolFormat.FUNCTIONARY: _Form(_FUNCTIONARY[0], _FUNCTIONARY[1], None, "arguments", (r"(<function=)",), "call",
                                  "call (ws call)*", _functionary_rules, _alone(_read_functionary_call), json=True),
    # (the reader reads the Hermes blocks _Recipients writes; the grammar holds what the model writes from a call's
    # recipient on: the first message's, whose `>>>` the prompt wrote, or one's after the content)
    ToolFormat.FUNCTIONARY_V32: _Form("<tool_call>", "</tool_call>", None, "arguments",
                                      (r"^((?!all\n)[\w.-]+\n)[\s\S]*$", r">>>(?!all\n)([\w.-]+\n)"),
                                      "call", 'call (">>>" call)*', _functionary_v32_rules, json=True),
    # (the message's closing may follow the section: the splitter leaves it out)
    ToolFormat.KIMI_K3: _Form(*_KIMI_K3_TOOLS, None, "arguments", (r"(<\|open\|>tools<\|sep\|>)",),
                              f'"{_KIMI_K3_TOOLS[0]}" call "{_KIMI_K3_TOOLS[1]}" "{XTML_CLOSE}message{XTML_SEP}"?',
                              f'"{_KIMI_K3_TOOLS[0]}" call+ "{_KIMI_K3_TOOLS[1]}" "{XTML_CLOSE}message{XTML_SEP}"?',
                              _kimi_k3_rules, _read_kimi_k3_calls),
    ToolFormat.MINIMAX_M1: _Form("<tool_calls>", "</tool_calls>", None, "arguments", (r"(<tool_calls>)",),
                                 '"<tool_calls>" "\\n" call "\\n" "</tool_calls>"',
                                 '"<tool_calls>" "\\n" call ("\\n" call)* "\\n" "</tool_calls>"', None,
                                 _read_json_lines, json=True),
    ToolFormat.HY3: _invokes(_HY3, "<tool_calls:opensource>", "</tool_calls:opensource>"),
    # (a string's value cannot hold the namespace token, which every closing begins with)
    ToolFormat.MINIMAX_M3: _Form(*_MM3_BLOCK, None, "arguments", (f"({re.escape(_MM3_BLOCK[0])})",),
                                 f'"{_MM3_BLOCK[0]}" ws call ws "{_MM3_BLOCK[1]}"',
                                 f'"{_MM3_BLOCK[0]}" ws call (ws call)* ws "{_MM3_BLOCK[1]}"', _minimax_m3_rules,
                                 _read_minimax_m3_calls),
    # (the grammar holds what the model writes from a call's address on, the reader what the splitter hands on; the
    # address set off where it is to no one but self or the user)
    ToolFormat.ATEM: replace(_invokes(_ATEM, *_ATEM_BLOCK),
                             triggers=(r"(?:^|<\|start\|>assistant)( to=(?!self<\|message\|>)(?!user<\|message\|>)"
                                       r"[^<]*?<\|message\|>)",),
                             one=_ATEM_CALL, several=f'{_ATEM_CALL} ("<|eom|><|start|>assistant" {_ATEM_CALL})*',
                             call_rules=_atem_rules),
    ToolFormat.DEEPSEEK: _Form(*_DEEPSEEK_CALLS, None, "arguments", (f"({re.escape(_DEEPSEEK_CALLS[0])})",),
                               f'"{_DEEPSEEK_CALLS[0]}" call "{_DEEPSEEK_CALLS[1]}"',
                               f'"{_DEEPSEEK_CALLS[0]}" call ("\\n"? call)* "{_DEEPSEEK_CALLS[1]}"', _deepseek_rules,
                               _read_deepseek_calls, json=True),
    ToolFormat.DEEPSEEK_V31: _Form(*_DEEPSEEK_CALLS, None, "arguments", (f"({re.escape(_DEEPSEEK_CALLS[0])})",),
                                   f'"{_DEEPSEEK_CALLS[0]}" call "{_DEEPSEEK_CALLS[1]}"',
                                   f'"{_DEEPSEEK_CALLS[0]}" call+ "{_DEEPSEEK_CALLS[1]}"', _deepseek_v31_rules,
                                   partial(_read_deepseek_calls, named_first=True), json=True),
    ToolFormat.SOLAR: _Form(_SOLAR_CALLS, None, None, "arguments", (r"(<\|tool_calls\|>)",), f'"{_SOLAR_CALLS}" call',
                            f'"{_SOLAR_CALLS}" call+', _solar_rules, _read_solar_calls),
    ToolFormat.LFM2: _Form(_LFM2_OPENING, _LFM2_CLOSING, None, "arguments", (r"(<\|tool_call_start\|>)",),
                           _lfm2_block("call"), f'{_lfm2_block(_LFM2_LIST)} (ws {_lfm2_block(_LFM2_LIST)})*',
                           _python_rules, _read_python_calls),
}
# the control tokens a form's reader needs to see (the text leaves control tokens out)
_MARKERS = {ToolFormat.MISTRAL_ARGS: {"[TOOL_CALLS]", "[CALL_ID]", "[ARGS]"}, ToolFormat.MISTRAL: {"[TOOL_CALLS]"},
            ToolFormat.LFM2: {_LFM2_OPENING, _LFM2_CLOSING}, ToolFormat.KIMI: {*_KIMI_SECTION, *_KIMI_CALL},
            ToolFormat.SEED: {"<seed:tool_call>", "</seed:tool_call>"}, ToolFormat.NEMOTRON: {"<TOOLCALL>", "</TOOLCALL>"},
            ToolFormat.COMMAND_R7B: set(_COHERE_ACTION), ToolFormat.DSML_FUNCTIONS: {_DSML_MARK},
            ToolFormat.DSML: {_DSML_MARK}, ToolFormat.APERTUS: set(_APERTUS), ToolFormat.GRANITE: {_GRANITE_CALL},
            # (a vocabulary may spell the role's header and its line's end as one token)
            ToolFormat.GIGACHAT3: {_GIGACHAT_ROLE, _GIGACHAT_ROLE + "\n"}, ToolFormat.GIGACHAT31: {_GIGACHAT31_CALL},
            ToolFormat.KIMI_K3: set(XTML_MARKERS), ToolFormat.DEEPSEEK: {*_DEEPSEEK_CALLS, *_DEEPSEEK_CALL},
            ToolFormat.DEEPSEEK_V31: {*_DEEPSEEK_CALLS, *_DEEPSEEK_CALL},
            ToolFormat.SOLAR: {_SOLAR_CALLS, *_SOLAR_CALL},
            ToolFormat.MINIMAX_M3: {_MM3, "<tool_call>", "</tool_call>"},
            ToolFormat.HY3: {"<tool_calls:opensource>", "</tool_calls:opensource>", *_HY3.name, *_HY3.key, *_HY3.value,
                             _HY3.end}}


def new_id(form: ToolFormat) -> str:
    """A call's id. Mistral's templates refuse any but nine letters and digits."""
    if form in (ToolFormat.MISTRAL, ToolFormat.MISTRAL_ARGS):
        return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))
    return "call_" + secrets.token_hex(12)


class UnfinishedCall(InputError):
    """The answer ended inside a tool call (max_tokens, or a stop string, cut it off)."""


class ToolStream:
    """An answer's text as it streams, read into content and calls: content is passed on at once, except
    what may be the start of a call; each call comes out whole once its text has ended."""

    def __init__(self, form: ToolFormat, required: bool = False, tools: Tools | None = None):
        """required: the answer is calls alone (the grammar held from the first token). tools: those offered,
        whose schemas say which values a markup form's call writes as they are (strings) and which as JSON
        (without them, a value that reads as JSON is taken as JSON)."""
        self.form = form
        self.required = required
        self._f = _FORMS[form]
        self._parameters = {d["function"]["name"]: _parameters(d["function"])[0] for d in tools.definitions} \
            if tools else {}
        self._held = ""  # text that may be, or is, a call
        self._quoting = self._reading()  # (how far a call's strings or values are read)
        # "content" once it is not a whole call, "calls" after an opening, "whole"
        self._state = "start" if self._f.whole is not None else "content"

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
        if self._state == "calls" and self._f.read_calls:  # calls that no closing ends: each from its opening on
            try:
                return [self._made(*call) for body in held.split(self._f.opening) if body.strip()
                        for call in self._f.read_calls(body.strip(), self._parameters)]
            except InputError:  # (the grammar held it: only a limit cuts one short)
                raise UnfinishedCall(f"the answer ended inside a tool call: {held.strip()[:80]!r}") from None
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
        while (end := self._quoting.closing(self._held, f.closing) if self._quoting
               else self._held.find(f.closing)) >= 0:
            block, self._held, self._quoting = self._held[:end], self._held[end + len(f.closing):], self._reading()
            body = block.strip().removeprefix(f.opening).strip()
            if f.read_calls:
                out += [self._made(*call) for call in f.read_calls(body, self._parameters)]
                continue
            try:
                call = json.loads(body)
            except ValueError:
                raise InputError(f"the model wrote a tool call that is not JSON: {body[:80]!r}") from None
            if not _is_call(call, f.arguments):
                raise InputError(f"the model wrote a tool call without a name and {f.arguments}: {body[:80]!r}")
            out.append(self._call(call))
        return out

    def _reading(self) -> "_Quoting | _Values | None":
        """What reads a call's strings (JSON's) or values (markup's), inside which its closing is text."""
        f = self._f
        return _Quoting() if f.json else _Values(*f.values) if f.values else None

    def _call(self, call: dict) -> ToolCall:
        return self._made(call["name"], call.get(self._f.arguments, call.get("arguments")))

    def _made(self, name: str, arguments: dict, call_id: str | None = None) -> ToolCall:
        return ToolCall(call_id or new_id(self.form), name, json.dumps(arguments, ensure_ascii=False))


class _Quoting:
    """How far a JSON form's calls have been read for their strings (a closing inside one is a value's text: code
    that writes `</tool_call>`), kept from feed to feed so that each character is read once."""

    def __init__(self):
        self.at, self.inside, self.escaped = 0, False, False

    def closing(self, held: str, closing: str) -> int:
        """Where the closing is, outside the strings; -1 where it has not come."""
        at = self.at
        while at < len(held):
            char = held[at]
            if self.inside:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.inside = False
            elif char == '"':
                self.inside = True
            elif char == closing[0] and closing.startswith(held[at:at + len(closing)]):
                if held.startswith(closing, at):
                    self.at = at
                    return at
                break  # (its beginning, the rest to come)
            at += 1
        self.at = at
        return -1


class _Values:
    """How far a markup form's calls have been read for their values, which are text as written (a closing inside
    one is the value's: code that writes `</tool_call>`), kept from feed to feed."""

    def __init__(self, opening: str, value_end: str):
        self.opening, self.value_end = re.compile(opening), value_end
        self.at, self.inside = 0, False

    def closing(self, held: str, closing: str) -> int:
        """Where the closing is, outside the values; -1 where it has not come."""
        at = self.at
        while True:
            if self.inside:
                end = held.find(self.value_end, at)
                if end < 0:  # (the value's end may have begun at its last characters)
                    self.at = max(at, len(held) - len(self.value_end) + 1)
                    return -1
                at, self.inside = end + len(self.value_end), False
                continue
            found, opened = held.find(closing, at), self.opening.search(held, at)
            if found >= 0 and (opened is None or found < opened.start()):
                self.at = found
                return found
            if opened is None:
                self.at = at  # (a value's opening may still be coming)
                return -1
            at, self.inside = opened.end(), True


def _is_call(call, arguments: str, name: str = "name") -> bool:
    return (isinstance(call, dict) and isinstance(call.get(name), str)
            and isinstance(call.get(arguments, call.get("arguments")), dict))
