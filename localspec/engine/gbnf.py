"""Structured output's grammars written: JSON schemas, regular expressions and choices as GBNF text, by the
converter llama-cpp-python maintains (llama.cpp's json-schema-to-grammar, ported), held where it differs from
llama.cpp's own and bounded where a schema would grow the grammar past what a request may cost. grammar.py masks
the target's choices with the text written here."""

import functools
import json
import math
import re

from ..errors import InputError
from .library import grammars

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
