"""Structured output: llama.cpp's grammar sampler (GBNF) as the mask on the target's choices.

Speculation stays lossless under a grammar because only the target's side is masked: at every
verified position the target chooses among the tokens the grammar admits after the tokens committed
before it, and the grammar then accepts the choice. A draft token the grammar forbids is one the
target never chooses, so it is rejected like any other wrong guess; drafters need not know the grammar.
The grammar only ever accepts committed tokens, so nothing has to be taken back when a draft fails.

Masking a whole row costs about 10 ms at a 150k vocabulary; asking whether one token is admitted
costs a few microseconds. Greedy choices ask about the row's argmax first (what the grammar admits
of it is the masked argmax too) and mask the row only where the argmax is refused.

llama.cpp's grammar code throws a C++ exception (or aborts) when it is made to accept a token it does
not admit, and through ctypes that ends the whole process: every server client's request with it. So
nothing is accepted here that the grammar was not first asked about (`accept` asks itself). Lazy
grammars (tool calls: free text until a trigger pattern matches) are lazy here, not in llama.cpp: its
lazy sampler replays the text from the trigger on into the grammar unchecked (a model that writes
`{` and a newline where a schema allows `{` and a space killed the server) and matches its triggers
with std::regex, which recurses once per character of the answer so far. Here a token that would set
off a trigger is admitted only if the grammar admits the text it sets off.
"""

import ctypes
import functools
import json
import math
import re
import sys
from time import perf_counter

import numpy as np

from ..errors import InputError
from .chain import TOKEN_DATA
from .library import c_stderr_captured, grammars, llama, recent_errors
from .sampling import Dist

# Rules of llama-cpp-python's port of the converter, as llama.cpp's own (json-schema-to-grammar.cpp) writes them now:
# its space lets JSON break lines and indent, as models write it (the port's `" "?` refused `{` and a newline); a
# string's character is no raw control character, which JSON escapes (the port's `[^"\\]` admitted a raw line
# break or \x07 inside a string: JSON that does not parse)
_AS_LLAMA_CPP_WRITES = {
    "space": 'space ::= | " " | "\\n"{1,2} [ \\t]{0,20}',
    "char": r'char ::= [^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])',
}


def json_object() -> str:
    """GBNF for any JSON object (OpenAI's response_format json_object): llama.cpp's json.gbnf."""
    return grammars().JSON_GBNF


def from_json_schema(schema: dict | bool, rule: str = "root") -> str:
    """A JSON schema as GBNF, by the converter llama-cpp-python maintains (llama.cpp's own, ported);
    InputError where the schema uses what it cannot convert. rule: the name of the rule that matches the
    schema (its helper rules are named after it), so a grammar can be built around it."""
    return from_json_schemas({rule: schema})[0]


def from_json_schemas(schemas: dict[str, dict | bool]) -> tuple[str, dict[str, str]]:
    """Several JSON schemas as the rules of one grammar, their helper rules shared: the GBNF and, for each
    name given, the rule that matches its schema (a primitive's is the shared rule of its type: `integer`)."""
    converter = _converter()(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    matching = {}
    try:
        for rule, schema in schemas.items():
            if schema is False:
                raise InputError("the JSON schema is false, which no value matches")
            copy = {} if schema is True else json.loads(json.dumps(schema))  # (resolve_refs rewrites what it is given)
            _check_counts(copy)
            _loosened(copy)
            matching[rule] = converter.visit(converter.resolve_refs(copy, "stdin"), "" if rule == "root" else rule)
        gbnf = converter.format_grammar()
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, AssertionError, NotImplementedError,
            RecursionError) as error:  # (a malformed schema: `properties` a list, `$ref` a number, ...)
        raise InputError(f"the JSON schema cannot be turned into a grammar: {error or type(error).__name__}") from None
    return "\n".join(_AS_LLAMA_CPP_WRITES.get(line.split(" ::= ", 1)[0], line) for line in gbnf.split("\n")), matching


# a schema's values that are JSON data, not schemas: a `$ref` inside one is data
_DATA_KEYWORDS = ("enum", "const", "default", "examples")
# the most parts a schema with its $refs written out may have (definitions that each use another twice, twenty
# deep, write out to a million)
MOST_WRITTEN_OUT = 100_000


def refs_written_out(schema):
    """A schema with each $ref to a place in itself written out in its place (its siblings over what it points to),
    its definitions then dropped: a schema that can stand inside another (a tool's parameters inside a call's
    wrapper, whose root its `#/$defs/...` would otherwise name). InputError where a $ref points to a place that is
    not there or, through others, to itself (no finite writing holds it)."""
    if not isinstance(schema, dict) or not _refers(schema):
        return schema
    parts = [0]

    def written(node, within: tuple[str, ...]):
        parts[0] += 1
        if parts[0] > MOST_WRITTEN_OUT:
            raise InputError(f"its $refs written out take more than {MOST_WRITTEN_OUT:,} parts")
        if isinstance(node, list):
            return [written(item, within) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            if ref in within:
                raise InputError(f"$ref {ref} contains itself")
            target = schema
            for step in ref[2:].split("/") if ref != "#" else ():
                step = step.replace("~1", "/").replace("~0", "~")
                if isinstance(target, list) and step.isdigit() and int(step) < len(target):
                    target = target[int(step)]
                elif isinstance(target, dict) and step in target:
                    target = target[step]
                else:
                    raise InputError(f"$ref {ref} points to nothing")
            if not isinstance(target, dict):
                raise InputError(f"$ref {ref} points to no schema")
            siblings = {key: value for key, value in node.items() if key != "$ref"}
            return written({key: value for key, value in target.items() if key not in ("$defs", "definitions")}
                           | siblings, within + (ref,))
        return {key: value if key in _DATA_KEYWORDS else written(value, within)
                for key, value in node.items() if key not in ("$defs", "definitions")}

    return written(schema, ())


def _refers(node) -> bool:
    """Whether a schema holds a $ref anywhere."""
    if isinstance(node, dict):
        return isinstance(node.get("$ref"), str) or any(_refers(value) for key, value in node.items()
                                                         if key not in _DATA_KEYWORDS)
    return isinstance(node, list) and any(map(_refers, node))


@functools.cache
def _converter() -> type:
    """llama-cpp-python's converter, holding an integer to its bounds (minimum, maximum and their exclusive forms), as
    llama.cpp's own converter does: the port admits any integer there (a schema's 5 to 10 had 1000000000000000)."""
    port = grammars()

    class Converter(port.SchemaConverter):
        def visit(self, schema, name):
            if isinstance(schema, dict) and schema.get("type") == "integer" and not {"$ref", "enum", "const"} & set(schema):
                low, high = _integer_bounds(schema)
                if low is not None or high is not None:
                    rule = name + "-" if name in port.RESERVED_NAMES else name or "root"
                    return self._add_rule(rule, f"({integer_range(low, high)}) space")
            return super().visit(schema, name)

    return Converter


def _integer_bounds(schema: dict) -> tuple[int | None, int | None]:
    """The least and the greatest integer a schema admits (None: no bound), from its minimum, maximum and exclusive
    bounds (draft 6's numbers, or draft 4's true beside minimum or maximum); InputError where none is admitted."""
    def bound(value) -> float | None:
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None

    low, high = bound(schema.get("minimum")), bound(schema.get("maximum"))
    low = None if low is None else math.ceil(low) + (schema.get("exclusiveMinimum") is True and low == math.ceil(low))
    high = None if high is None else math.floor(high) - (schema.get("exclusiveMaximum") is True and high == math.floor(high))
    if (above := bound(schema.get("exclusiveMinimum"))) is not None:
        low = max(low if low is not None else -math.inf, math.floor(above) + 1)
    if (below := bound(schema.get("exclusiveMaximum"))) is not None:
        high = min(high if high is not None else math.inf, math.ceil(below) - 1)
    if low is not None and high is not None and low > high:
        raise InputError(f"the JSON schema's integer bounds admit no integer ({json.dumps(schema)[:200]})")
    return low, high


def integer_range(low: int | None, high: int | None) -> str:
    """GBNF of the integers from low to high (None: no bound), as JSON writes them (no leading zero, no -0)."""
    if high is not None and high < 0:  # all negative
        return f'"-" ({_naturals(-high, None if low is None else -low)})'
    alternatives = [] if low is not None and low >= 0 else [f'"-" ({_naturals(1, None if low is None else -low)})']
    return " | ".join([*alternatives, f"({_naturals(max(low or 0, 0), high)})"])


def _naturals(low: int, high: int | None) -> str:
    """GBNF of the whole numbers from low to high (None: no bound), without leading zeros."""
    longest = len(str(high)) if high is not None else len(str(low))
    parts = []
    for length in range(len(str(low)), longest + 1):
        first = max(low, 10 ** (length - 1) if length > 1 else 0)
        last = 10 ** length - 1 if high is None else min(high, 10 ** length - 1)
        parts += _digits(str(first), str(last)) if first <= last else []
    if high is None:
        parts.append(f"[1-9] [0-9]{{{longest},}}")
    return " | ".join(parts)


def _digits(low: str, high: str) -> list[str]:
    """Alternatives of GBNF for the numerals of one length from low to high (each written with all its digits)."""
    if low == high:
        return [f'"{low}"']
    if len(low) == 1:
        return [f"[{low}-{high}]"]
    rest = len(low) - 1
    if low[0] == high[0]:
        return [f'"{low[0]}" ({" | ".join(_digits(low[1:], high[1:]))})']
    whole_first, whole_last = low[1:] == "0" * rest, high[1:] == "9" * rest
    out = [] if whole_first else [f'"{low[0]}" ({" | ".join(_digits(low[1:], "9" * rest))})']
    start, end = (int(low[0]) + (not whole_first), int(high[0]) - (not whole_last))
    if start <= end:
        out.append(f"[{start}-{end}] [0-9]{{{rest}}}")
    if not whole_last:
        out.append(f'"{high[0]}" ({" | ".join(_digits("0" * rest, high[1:]))})')
    return out


def from_regex(pattern: str) -> str:
    """GBNF for text that a regular expression matches whole (vLLM's structured output `regex`), by the schema
    converter's translation of a pattern (anchored where it is not); InputError where it cannot translate it."""
    _check_counts({"pattern": pattern})
    converter = grammars().SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=True)
    try:
        converter.visit({"type": "string", "pattern": converted_pattern(pattern)}, "")
        return converter.format_grammar()
    except (ValueError, KeyError, TypeError, IndexError, AssertionError, RecursionError) as error:
        raise InputError(f"the regular expression cannot be turned into a grammar: {error or type(error).__name__}"
                         ) from None


# A regular expression's classes (\s: Python's and JavaScript's ASCII spaces) and escapes of one character, as
# ranges of code points
_CLASSES = {"d": [(0x30, 0x39)], "w": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
            "s": [(0x09, 0x0D), (0x20, 0x20)]}
_KEPT = {"t": 0x09, "n": 0x0A, "r": 0x0D, "f": 0x0C, "v": 0x0B}
_LAST = 0x10FFFF
_DOT = [(0, 0x09), (0x0B, 0x0C), (0x0E, _LAST)]  # (the converter's: any but a line break)
# What JSON writes escaped inside a string: control characters, a quote, a backslash; and their short escapes
_JSON_ESCAPED = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]
_SHORT = {0x22: "[\\x22]", 0x5C: "[\\x5c]", 0x08: "b", 0x0C: "f", 0x0A: "n", 0x0D: "r", 0x09: "t"}


def converted_pattern(pattern: str, in_json: bool = False) -> str:
    """A regular expression (Python's, JavaScript's, a JSON schema's) as the converter translates it whole, ^(...)$:
    its classes and escapes as GBNF classes (the converter copied \\d or \\. into GBNF, which has none: every schema
    with one was refused, "the grammar does not compile"), `(?:` and named groups as groups, lazy and possessive
    repetition as any (what matches the whole is the same). in_json: the text is a JSON string's, each character as
    JSON writes it there (a quote, a backslash or a control character the pattern admits was admitted raw: `.` let a
    model end the string early or write JSON that does not parse). JSON Schema's pattern matches anywhere: its text is
    held to match whole, a value that matches; its anchors, at its ends or its alternatives' (`^a$|^b$`), are said by
    ^(...)$. InputError for what a grammar cannot hold (anchors inside, word boundaries, back references)."""
    try:  # (as Python reads it, which reads a JSON schema's, JavaScript's, but for its named groups' spelling)
        re.compile(re.sub(r"\(\?<(?![=!])", "(?P<", pattern))
    except re.error as error:
        raise InputError(f"the pattern /{pattern}/ is not a regular expression: {error}") from None
    out, at, depth = [], 0, 0
    while at < len(pattern):
        character = pattern[at]
        if character in "\\[":
            matched, at, _ = _escape_at(pattern, at) if character == "\\" else _class_at(pattern, at)
            out.append(_one_of(matched, in_json))
            continue
        if character == ".":
            out.append(_one_of(_DOT, in_json))
        elif pattern.startswith(("(?:", "(?P<"), at) or (pattern.startswith("(?<", at)
                                                            and pattern[at + 3:at + 4] not in "=!"):
            out.append("(")
            depth += 1
            at = pattern.index(">", at) if pattern[at + 2] in "P<" else at + 2
        elif character == "^" and depth == 0 and out[-1:] in ([], ["|"]):
            pass  # (the start of the whole, or of one of its alternatives)
        elif character == "$" and depth == 0 and pattern[at + 1:at + 2] in ("", "|"):
            pass
        elif character in "^$":
            raise InputError(f"the pattern /{pattern}/: {character} inside it has no equivalent in a grammar")
        elif character == '"' or ord(character) < 0x20:  # (the converter writes a quote raw, a line break as it is)
            out.append(_one_of([(ord(character), ord(character))], in_json))
        elif (character in "*+?}" and pattern[at + 1:at + 2] in ("?", "+")
              and not (character == "?" and out[-1:] == ["("])):
            out.append(character)
            at += 1
        else:
            depth += {"(": 1, ")": -1}.get(character, 0)
            out.append(character)
        at += 1
    return f"^({''.join(out)})$"


def _escape_at(pattern: str, at: int) -> tuple[list, int, int | None]:
    """The escape at pattern[at]: the code points it matches, where it ends, and its one code point (None for a
    class)."""
    escaped, at = pattern[at + 1:at + 2], at + 2
    for mark, digits in (("x", 2), ("u", 4)):
        if escaped == mark and re.fullmatch(f"[0-9a-fA-F]{{{digits}}}", pattern[at:at + digits]):
            point = int(pattern[at:at + digits], 16)
            return [(point, point)], at + digits, point
    if escaped.lower() in _CLASSES:
        matched = _CLASSES[escaped.lower()]
        return (matched if escaped.islower() else _complement(matched)), at, None
    if escaped in _KEPT or escaped and not (escaped.isascii() and escaped.isalnum()):
        point = _KEPT.get(escaped, ord(escaped))
        return [(point, point)], at, point
    raise InputError(f"the pattern /{pattern}/: \\{escaped} has no equivalent in a grammar")


def _class_at(pattern: str, at: int) -> tuple[list, int, None]:
    """The class opening at pattern[at] (valid, as Python read it): the code points it matches, where it ends."""
    negated = pattern.startswith("[^", at)
    at += 1 + negated
    matched, first = [], True
    while first or pattern[at] != "]":  # (a `]` first is one of its characters)
        first = False
        members, at, low = _escape_at(pattern, at) if pattern[at] == "\\" else ([(ord(pattern[at]),) * 2], at + 1,
                                                                                  ord(pattern[at]))
        if low is not None and pattern[at] == "-" and pattern[at + 1] != "]":
            _, at, high = (_escape_at(pattern, at + 1) if pattern[at + 1] == "\\"
                           else (None, at + 2, ord(pattern[at + 1])))
            members = [(low, high)]
        matched += members
    return (_complement(matched) if negated else _merged(matched)), at + 1, None


def _merged(ranges: list) -> list:
    merged = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(high, merged[-1][1]))
        else:
            merged.append((low, high))
    return merged


def _complement(ranges: list) -> list:
    gaps, at = [], 0
    for low, high in _merged(ranges):
        gaps += [(at, low - 1)] if low > at else []
        at = high + 1
    return gaps + ([(at, _LAST)] if at <= _LAST else [])


def _one_of(points: list, in_json: bool) -> str:
    """A piece of the converter's pattern that matches one of these code points; in_json: as JSON writes it inside a
    string, escaped where it must be (by its short escape, else \\u00XX), raw elsewhere."""
    if not in_json:
        return _class(points)
    raw = _complement(_complement(points) + _JSON_ESCAPED)
    escaped = [point for low, high in _complement(_complement(points) + _complement(_JSON_ESCAPED))
               for point in range(low, high + 1)]
    if not escaped:
        return _class(raw)
    pieces = ([_class(raw)] if raw else []) + ["[\\x5c]" + _SHORT[point] for point in escaped if point in _SHORT]
    for high_digit in (0, 1):
        low_digits = [point & 0xF for point in escaped if point not in _SHORT and point >> 4 == high_digit]
        if low_digits:
            hex_digits = "".join(f"{digit:x}{digit:X}" if digit > 9 else str(digit) for digit in low_digits)
            pieces.append(f"[\\x5c]u00{high_digit}[{hex_digits}]")
    return f"({'|'.join(pieces)})"


def _class(points: list) -> str:
    """Code points as one GBNF class (negated where that is shorter)."""
    if not points:
        raise InputError("the pattern has a class that matches no character")
    gaps = _complement(points)
    negated = bool(gaps) and len(gaps) < len(points)
    return ("[^" if negated else "[") + "".join(
        _class_character(low) + (f"-{_class_character(high)}" if high > low else "")
        for low, high in (gaps if negated else points)) + "]"


def _class_character(point: int) -> str:
    if point < 0x80 and chr(point).isalnum():
        return chr(point)
    return f"\\x{point:02x}" if point < 0x80 else f"\\u{point:04x}" if point <= 0xFFFF else f"\\U{point:08x}"


def from_choices(choices: list[str]) -> str:
    """GBNF for exactly one of these texts (vLLM's structured output `choice`)."""
    if not choices:
        raise InputError("no choices to choose from")
    return "root ::= " + " | ".join(_literal(choice) for choice in choices)


def _literal(text: str) -> str:
    """A text as a GBNF literal (its escapes are fewer than JSON's: no \\b or \\f; the converter's own escapes no
    backslash)."""
    return '"' + "".join(f"\\x{ord(c):02x}" if ord(c) < 0x20 else "\\" + c if c in '"\\' else c
                         for c in text) + '"'


# The converter writes a count out as deep as it counts (maxLength 5: five nested optional characters), and
# llama.cpp compiles no nesting much beyond 1,000 (MOST_NESTING): an upper bound beyond it is let go, the
# grammar admitting any length there, as llama.cpp's own parser lets a repetition's beyond 2,000 go (Claude Code
# offers a tool whose script may be 524,288 characters: every request was refused); a lower one is refused,
# as llama.cpp refuses one beyond 2,000 (10**10 ran the converter out of memory).
MOST_HELD = 1_000
MOST_COUNT = 100_000  # a pattern's {n,m}, refused beyond it (then as too deep to compile)
_UPPER = ("maxLength", "maxItems", "maxProperties", "maxContains")
_LOWER = ("minLength", "minItems", "minProperties", "minContains")
_PATTERN_COUNT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def _counts(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# What a schema may say of a value that constrains nothing (a schema of these alone admits any value) ...
ANNOTATIONS = {"description", "title", "examples", "default", "$comment", "deprecated", "readOnly", "writeOnly",
               "$schema", "$id"}
_ANY = ["object", "array", "string", "number", "boolean", "null"]
# ... and where a schema holds schemas: one, a map of them, a list of them
_ONE = ("additionalProperties", "items", "not", "contains", "if", "then", "else", "propertyNames",
        "unevaluatedItems", "unevaluatedProperties", "additionalItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems", "items")


def _loosened(schema):
    """The schema (in place) as the converter can hold it: without its upper bounds beyond MOST_HELD, each
    schema of annotations alone (a Claude Code tool's argument that says only what it is for) a union of every
    type, which JSON Schema makes it (the converter refused one, and took `{}` for an object), and its patterns
    as the converter translates them (converted_pattern)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        for key in [key for key in _UPPER if _counts(node.get(key)) and node[key] > MOST_HELD]:
            del node[key]
        if set(node) <= ANNOTATIONS:
            node["type"] = list(_ANY)
        if isinstance(node.get("pattern"), str):
            node["pattern"] = converted_pattern(node["pattern"], in_json=True)
        stack.extend(node[key] for key in _ONE if isinstance(node.get(key), dict))
        stack.extend(inner for key in _MAP if isinstance(node.get(key), dict) for inner in node[key].values())
        stack.extend(inner for key in _LIST if isinstance(node.get(key), list) for inner in node[key])
    return schema


def _check_counts(schema) -> None:
    """InputError where a schema counts at least beyond MOST_HELD, or a pattern beyond MOST_COUNT."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _LOWER and _counts(value) and value > MOST_HELD:
                    raise InputError(f"the JSON schema's {key} is {value:,}; at most {MOST_HELD:,} are taken")
                if key == "pattern" and isinstance(value, str):
                    for count in (count for pair in _PATTERN_COUNT.findall(value) for count in pair if count):
                        if len(count) > 9 or int(count) > MOST_COUNT:  # (int() takes no more than 4,300 digits)
                            raise InputError(f"the JSON schema's pattern repeats something {count[:12]}"
                                             f"{'...' if len(count) > 12 else ''} times; at most {MOST_COUNT:,} are taken")
                stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)


class Grammar:
    """A GBNF grammar's state over one generation: which tokens it admits next, and the tokens
    committed so far (accept). Close it (or use it in a with block) to free llama.cpp's sampler."""

    def __init__(self, model, text: str, triggers: tuple[str, ...] = ()):
        """triggers: Sampling.grammar_triggers, regular expressions as llama.cpp's lazy grammars take them:
        the grammar admits every token until the text so far matches one (in whole where it is written
        ^...$, else anywhere), and from then on constrains the text from the pattern's first group."""
        recent_errors.clear()
        self._model, self._vocab = model, model.vocab
        _check_bounds(text)
        with c_stderr_captured() as said:  # (its parser prints its error, and the grammar, to stderr itself)
            self._sampler = llama.llama_sampler_init_grammar(self._vocab, text.encode(), b"root")
        parsed = re.search(r"^\w+: error parsing grammar: (.*)\n\n" + re.escape(text) + r"\n?", said[0], re.MULTILINE)
        rest = said[0][:parsed.start()] + said[0][parsed.end():] if parsed else said[0]
        if rest:
            sys.stderr.write(rest)  # (not the parser's: another thread's, kept)
        if not self._sampler:
            why = parsed.group(1) if parsed else "; ".join(recent_errors) or "llama.cpp could not parse it"
            raise InputError(f"the grammar does not compile: {why}")
        try:
            self._triggers = [re.compile(pattern.encode()) for pattern in triggers]
        except re.error as error:
            self.close()
            raise InputError(f"a grammar trigger is not a regular expression: {error}") from None
        self._awaiting = bool(triggers)
        self._text = b""  # what was committed while awaiting a trigger
        self._one = np.empty(1, TOKEN_DATA)
        self._row: np.ndarray | None = None
        self._probes: np.ndarray | None = None

    @property
    def awaiting(self) -> bool:
        """Whether the grammar is lazy and no trigger has matched yet (it then admits any text but one
        that would set off a trigger the grammar does not admit)."""
        return self._awaiting

    def admits(self, token: int) -> bool:
        if self._awaiting:
            return self._set_off(token) is not False
        return self._admitted_by(self._sampler, token)

    def admitted(self, logits: np.ndarray) -> np.ndarray | None:
        """The ids of a whole row the grammar admits next (None while awaiting a trigger: any token, bar
        those `restrict` then takes out); InputError where it admits none (a grammar that cannot go on
        from here, or cannot begin)."""
        if self._awaiting:
            return None
        if self._row is None or len(self._row) != len(logits):
            self._row = np.empty(len(logits), TOKEN_DATA)
        self._row["id"] = np.arange(len(logits), dtype=np.int32)
        self._row["logit"] = 0.0
        self._mask_within_budget(self._row)
        ids = np.flatnonzero(np.isfinite(self._row["logit"])).astype(np.int32)
        if not ids.size:
            raise InputError("the grammar admits no token here: it cannot begin, or cannot go on from the text so far")
        return ids

    def restrict(self, dist: Dist) -> Dist:
        """A distribution over what the sampler chain kept of a row, without the tokens the grammar
        refuses (while awaiting a trigger, the ones that would set it off into text it does not admit;
        otherwise admitted() has masked the row already)."""
        if not self._awaiting:
            return dist
        kept = np.array([self.admits(int(token)) for token in dist.ids], dtype=bool)
        if kept.all():
            return dist
        if not kept.any():
            raise InputError(_NONE_LIKELY)
        return Dist(dist.ids[kept], dist.probs[kept] / dist.probs[kept].sum())

    def best(self, logits: np.ndarray) -> int:
        """The row's most likely token among those the grammar admits."""
        top = int(np.argmax(logits))
        if self.admits(top):
            return top
        if self._awaiting:  # refused tokens are rare here: the next likeliest is nearly always admitted
            for token in np.argsort(logits)[::-1][:_LIKELIEST]:
                if self.admits(int(token)):
                    return int(token)
            raise InputError(_NONE_LIKELY)
        ids = self.admitted(logits)
        return int(ids[np.argmax(logits[ids])])

    def forced_text(self, characters: dict[int, str], ends: tuple[int, ...], most: int) -> tuple[str, str]:
        """The text the grammar admits alone from here (a JSON schema's key after its opening quote, say),
        up to `most` characters, and the characters it admits after that text (where there are several).

        Read character by character while exactly one of `characters` (tokens of one character each, by
        id) is admitted and none of `ends` (end-of-generation tokens), on a copy of the grammar's state, so
        nothing is committed. A BPE vocabulary spells a forced text with tokens of many lengths (`"s`,
        `"sum`, ...), so a grammar forces a text, never a single token. Nothing is forced while a lazy
        grammar awaits its trigger."""
        if self._awaiting:
            return "", ""
        if self._probes is None or len(self._probes) != len(characters) + len(ends):
            self._probes = np.empty(len(characters) + len(ends), TOKEN_DATA)
            self._probe_ids = np.array([*characters, *ends], dtype=np.int32)
        probes, text = self._probes, []
        state = llama.llama_sampler_clone(self._sampler)
        try:
            while True:
                probes["id"], probes["logit"] = self._probe_ids, 0.0
                self._apply(probes, state)
                admitted = [int(token) for token in probes["id"][np.isfinite(probes["logit"])]]
                if len(admitted) != 1 or admitted[0] not in characters or len(text) == most:
                    return "".join(text), "".join(characters[token] for token in admitted if token in characters)
                text.append(characters[admitted[0]])
                llama.llama_sampler_accept(state, admitted[0])
        finally:
            llama.llama_sampler_free(state)

    def accept(self, token: int) -> None:
        """A token committed to the output: InputError, never llama.cpp's exception, where the grammar does
        not admit it (an end of generation included, before the grammar's end)."""
        if not self._awaiting:
            if not self._admitted_by(self._sampler, token):
                raise InputError(f"the grammar does not admit token {token} here")
            llama.llama_sampler_accept(self._sampler, token)
            return
        replay = self._set_off(token)
        if replay is False:
            raise InputError(f"token {token} would set off the grammar with text it does not admit")
        if replay is None:
            self._text += self._model.special_piece(token)
            return
        for each in replay:  # each admitted in turn when _set_off asked, on a copy of this very state
            llama.llama_sampler_accept(self._sampler, each)
        self._awaiting, self._text = False, b""

    def _set_off(self, token: int) -> list[int] | None | bool:
        """While awaiting: None if committing the token sets off no trigger; the tokens of the text it
        sets off (from the trigger's first group on) where the grammar admits that text; False where not."""
        text = self._text + self._model.special_piece(token)
        start = next((at for at in (_start(trigger, text) for trigger in self._triggers) if at is not None), None)
        if start is None:
            return None
        try:
            tokens = self._model.spell(text[start:].decode())
        except UnicodeDecodeError:  # a character cut in two by the trigger's token: the grammar waits for it
            return False
        if not tokens:
            return False  # no way to hand the grammar exactly this text
        state = llama.llama_sampler_clone(self._sampler)
        try:
            for each in tokens:
                if not self._admitted_by(state, each):
                    return False
                llama.llama_sampler_accept(state, each)
        finally:
            llama.llama_sampler_free(state)
        return tokens

    def _mask_within_budget(self, rows: np.ndarray) -> None:
        """Mask a whole row PIECE tokens at a time, and give up with an InputError as soon as the pieces done
        so far say the row would take more than STEP_BUDGET seconds: a grammar whose stacks have grown
        combinatorially (40 `[a-z]*` in a row) takes a minute a row in llama.cpp's C code, which nothing can
        cancel, while every other request waits behind it. Pieces change nothing else: llama.cpp masks each
        candidate against every stack, in whatever array it comes."""
        started = perf_counter()
        for start in range(0, len(rows), PIECE):
            self._apply(rows[start : start + PIECE])
            done, elapsed = min(start + PIECE, len(rows)), perf_counter() - started
            if done < len(rows) and elapsed * len(rows) / done > STEP_BUDGET:
                raise InputError(f"checking one token's choices under this grammar would take over {STEP_BUDGET:g} s"
                                 f" ({done:,} of {len(rows):,} took {elapsed:.2f} s): its rules let too many readings"
                                 " stand at once (a long row of optional or repeated items?)")

    def _admitted_by(self, state, token: int) -> bool:
        self._one["id"], self._one["logit"] = token, 0.0
        self._apply(self._one, state)
        return bool(np.isfinite(self._one["logit"][0]))

    def _apply(self, rows: np.ndarray, state=None) -> None:
        """Mask the rows by the grammar's state (state: a copy of it; None: the state itself)."""
        array = llama.llama_token_data_array(rows.ctypes.data_as(llama.llama_token_data_p), len(rows), -1, False)
        llama.llama_sampler_apply(state or self._sampler, ctypes.byref(array))

    def close(self) -> None:
        if self._sampler:
            llama.llama_sampler_free(self._sampler)
            self._sampler = None

    def __enter__(self) -> "Grammar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_LIKELIEST = 64  # tokens of a row tried in turn for a greedy choice while awaiting a trigger
_NONE_LIKELY = "the grammar admits none of the likely tokens here: the answer began a form the grammar does not allow"


def _start(trigger: re.Pattern, text: bytes) -> int | None:
    """Where a trigger's constrained text begins in the text so far, as llama.cpp's lazy grammars find it:
    the whole text must match a pattern written ^...$, another may match anywhere; the constrained text
    begins at the first group that matched something, else at the match."""
    pattern = trigger.pattern
    match = (trigger.fullmatch(text) if pattern.startswith(b"^") and pattern.endswith(b"$") else None) \
        or trigger.search(text)
    if match is None:
        return None
    return next((match.start(group) for group in range(1, (trigger.groups or 0) + 1) if match.group(group)),
                match.start())


# llama.cpp parses a grammar and builds its stacks recursively: on an 8 MiB stack a GBNF nested 30,000 deep
# or a chain of 100,000 rules ended the process (SIGSEGV; 10,000 and 30,000 were fine, measured 2026-11-26),
# and the schema converter nests as deep as a maxLength, maxItems or a pattern's {0,n} asks. Its own
# parser already refuses such repetitions from about 2,000 on, so these bounds cost no grammar that works.
MOST_NESTING = 1_000
MOST_RULES = 10_000
MOST_CHARACTERS = 1_000_000
# Seconds masking one row may take (about 0.015 s at a 150k vocabulary for a JSON schema's grammar; 40
# `[a-z]*` in a row took 49 s, measured 2026-11-26), judged after each piece of this many tokens.
STEP_BUDGET = 2.0
PIECE = 4096


def _check_bounds(text: str) -> None:
    """InputError for a grammar too big or too deep for llama.cpp to compile without overflowing its
    stack: parentheses nested (outside literals, character classes and comments), rules, characters."""
    if len(text) > MOST_CHARACTERS:
        raise InputError(f"the grammar is {len(text):,} characters long; at most {MOST_CHARACTERS:,} are taken")
    depth = deepest = rules = 0
    closing, at = None, 0  # the quote or bracket that ends the literal or class being read
    while at < len(text):
        character = text[at]
        if closing:
            if character == "\\":
                at += 1
            elif character == closing:
                closing = None
        elif character in "\"[":
            closing = "]" if character == "[" else character
        elif character == "#":
            end = text.find("\n", at)
            at = len(text) if end < 0 else end
        elif character == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif character == ")":
            depth -= 1
        elif text.startswith("::=", at):
            rules += 1
        at += 1
    if deepest > MOST_NESTING:
        raise InputError(f"the grammar nests {deepest:,} deep (a JSON schema's maxLength, maxItems or a pattern's"
                         f" repetition nests as deep as it counts); at most {MOST_NESTING:,} are taken")
    if rules > MOST_RULES:
        raise InputError(f"the grammar has {rules:,} rules; at most {MOST_RULES:,} are taken")
