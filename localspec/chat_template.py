"""Rendering a model's own chat template (Jinja, from its GGUF metadata) safely.

Templates come from model files anyone can publish, so they run in Jinja's immutable sandbox (no
attribute access to Python internals; of all changes, a list's append and pop alone, as llama.cpp's engine allows,
on copies of what a render is given), and every operation
that could take much time or memory is measured before it runs, never after:

* the source may be at most MAX_SOURCE characters: compiling is not interruptible (200,000
  `{{ ... }}` took a minute and 2.6 GB; 64 KiB of them take ~0.6 s), and each source is compiled
  once per process, not per turn;
* integers stay under MAX_INT_BITS: `**` and `*` are refused when their result would be larger,
  since one big-integer operation (`((10**64)**64)**64`) cannot be interrupted;
* no value may become longer than MAX_TEXT: repetition, `+`, `~`, `%`, `str.format`, `join`,
  `replace`, `expandtabs`, `translate` and the filters that grow text (`format`, `indent`,
  `wordwrap`, `string`, `tojson`, `sum`) compute an upper bound of their result's length from their
  operands first, as does writing a value out (a list of 250 one-MB strings is 250 MB once
  printed); what is built in all is bounded by MAX_WORK;
* every loop iteration, call and operator checks the clock against MAX_SECONDS; as each single
  operation is bounded above, no render outlives that by much.

Why not a child process with RLIMIT_AS/RLIMIT_CPU: a render happens every chat turn and every serve
request, and forking a process that holds a model (threads, GPU state; macOS) per render is slow and
unsafe; a verdict cached per template cannot cover messages the test render never saw. Measuring
operands in the sandbox's own hooks bounds every render, costs microseconds, and works on every OS.
"""

import json
import re
import string
from collections.abc import Iterator
from contextvars import ContextVar
from copy import deepcopy
from datetime import datetime
from functools import lru_cache, wraps
from itertools import chain
from time import perf_counter

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment, SecurityError
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer

from .errors import InputError

# characters (or list items) of one value and of the rendered prompt; also the largest width, count
# or repetition a call may ask for
MAX_TEXT = 1 << 22
MAX_WORK = 1 << 25  # characters of all the values a render builds together
MAX_SECONDS = 2.0
# the longest real templates (tool-calling ones with built-in system prompts) are ~20 KB
MAX_SOURCE = 1 << 16
MAX_INT_BITS = 1 << 12  # ~1,200 digits: far beyond any count or date a template computes
# one %-conversion: mapping key, flags, width, precision, length modifier, conversion
PERCENT_FIELD = re.compile(r"%(?:\([^)]*\))?[#0 +-]*(\*|\d*)(?:\.(\*|\d*))?[hlL]?(.?)", re.S)


class TemplateBudgetExceeded(SecurityError):
    pass


def _raise_exception(message: str):
    raise jinja2.TemplateError(message)


_END = object()  # what an exhausted iterator gives


class _Budget:
    """What one render may still spend."""

    def __init__(self):
        self.deadline = perf_counter() + MAX_SECONDS
        self.work = 0

    def tick(self) -> None:
        if perf_counter() > self.deadline:
            raise TemplateBudgetExceeded(f"it ran for more than {MAX_SECONDS:g} s")

    def spend(self, value):
        if isinstance(value, (str, bytes, list, tuple, dict)):
            if len(value) > MAX_TEXT:
                raise TemplateBudgetExceeded(f"it built a value of {len(value):,} items (at most {MAX_TEXT:,})")
            self.work += len(value)
            if self.work > MAX_WORK:
                raise TemplateBudgetExceeded(f"it built more than {MAX_WORK:,} characters in all")
        return value


# the render under way in this thread (one environment serves every render)
_budget: ContextVar[_Budget] = ContextVar("chat_template_budget")


def _refuse_numbers(values) -> None:
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_TEXT:
            raise TemplateBudgetExceeded(f"it asked for {value:,} of something (at most {MAX_TEXT:,})")


def _refuse_text(size: int, what: str) -> None:
    if size > MAX_TEXT:
        raise TemplateBudgetExceeded(f"{what} would be more than {MAX_TEXT:,} characters")


def _text_size(value, indent: int = 0) -> int:
    """An upper bound of len(str(value)), also of its repr and JSON (with `indent`) inside a
    container; counted only until it passes MAX_TEXT, so it costs at most ~MAX_TEXT steps and no
    memory (a container is read through an iterator, never copied)."""
    if isinstance(value, str):
        return len(value)
    total, stack, open_ids = 0, [(iter((value,)), None)], set()  # (items, their container's id)
    while stack and total <= MAX_TEXT:
        items, owner = stack[-1]
        item = next(items, _END)
        if item is _END:
            stack.pop()
            open_ids.discard(owner)
            continue
        total += indent * len(stack) + 1  # the line an indented dump gives each item
        if isinstance(item, str):  # quoted and escaped: \u00XX at worst, \ud83d\ude00 beyond ASCII
            total += (6 if item.isascii() else 12) * len(item) + 2
        elif isinstance(item, bytes):
            total += 4 * len(item) + 3
        elif isinstance(item, bool) or item is None:
            total += 5
        elif isinstance(item, int):
            total += item.bit_length() // 3 + 2
        elif isinstance(item, float):
            total += 330  # '%f' of 1e308 is 316 characters
        elif isinstance(item, (list, tuple, set, frozenset, dict, Namespace)):
            if isinstance(item, Namespace):
                item = item._Namespace__attrs  # how Jinja's Namespace lets its own repr reach them
                total += 12
            if id(item) in open_ids:  # a namespace holding itself is shown as {...}
                total += 5
                continue
            open_ids.add(id(item))
            total += 2 + 4 * len(item)
            stack.append((chain.from_iterable(item.items()) if isinstance(item, dict) else iter(item), id(item)))
        else:  # a macro, loop, cycler or undefined: shown as a short tag or nothing
            total += 200
    return total


def _largest_number(values) -> int:
    """The largest width or precision the values could give a `*` or nested format field: an
    integer, or the digits in a text (`'{0:{1}}'.format('a', '4000000')`)."""
    largest = 0
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool):
            largest = max(largest, abs(value))
        elif isinstance(value, str):
            for digits in re.findall(r"\d+", value):
                if len(digits) > 9:
                    return MAX_TEXT + 1
                largest = max(largest, int(digits))
    return largest


def _percent_size(form: str, values) -> int:
    """An upper bound of the length of `form % values`: each field at most its width and precision
    plus the longest value (its repr for %r/%a); `*` widths come from the values."""
    # a mapping serves `%(key)s` fields, and `%s` prints the whole of it
    values = (values, *values.values()) if isinstance(values, dict) else values if isinstance(values, tuple) else (values,)
    fields = list(PERCENT_FIELD.finditer(form))
    widths = 0
    for field in fields:
        for number in field.group(1, 2):
            if number == "*":
                widths += _largest_number(values)
            elif number:
                if len(number) > 9:
                    return MAX_TEXT + 1
                widths += int(number)
    quoted = any(field[3] in ("r", "a") for field in fields)
    longest = max((_text_size([v] if quoted else v) for v in values), default=0)
    return len(form) + widths + len(fields) * longest


def _format_size(form: str, values: list) -> int:
    """An upper bound of the length of `form.format(...)` given its arguments' values, alike."""
    fields = [spec or "" for _, name, spec, _ in string.Formatter().parse(form) if name is not None]
    nested = sum(spec.count("{") for spec in fields)  # widths and precisions taken from the arguments
    widths = nested * _largest_number(values) if nested else 0
    for spec in fields:
        for number in re.findall(r"\d+", spec):
            if len(number) > 9:
                return MAX_TEXT + 1
            widths += int(number)
    quoted = "!r" in form or "!a" in form
    longest = max((_text_size([v] if quoted else v) for v in values), default=0)
    return len(form) + widths + len(fields) * longest


def _foreseen_size(method, args) -> int | None:
    """The length of a str method's result where it is cheap to know before calling it."""
    owner = getattr(method, "__self__", None)
    name = getattr(method, "__name__", "")
    if not isinstance(owner, (str, bytes)):
        return None
    if name == "replace" and len(args) >= 2 and all(isinstance(a, type(owner)) for a in args[:2]):
        matches = owner.count(args[0]) if args[0] else len(owner) + 1
        return len(owner) + matches * len(args[1])
    if name == "join" and args and isinstance(args[0], (list, tuple, str, bytes)):
        return _joined_size(args[0]) + len(owner) * len(args[0])
    if name == "expandtabs":
        return len(owner) + owner.count("\t" if isinstance(owner, str) else b"\t") * max(8, *(a for a in args if isinstance(a, int)))
    if name == "translate" and args and isinstance(args[0], dict):
        return len(owner) * max((_text_size(v) for v in args[0].values()), default=1)
    return None


def _joined_size(items) -> int:
    """An upper bound of the length of the items' texts together, counted only until it passes
    MAX_TEXT (a list of millions stops early)."""
    if isinstance(items, (str, bytes)):
        return len(items)
    size = 0
    for item in items:
        size += _text_size(item)
        if size > MAX_TEXT:
            break
    return size


def _taken(items) -> list:
    """An iterator's items (from map or select), taken only while their text stays within MAX_TEXT:
    each may be built as it is taken."""
    taken, size = [], 0
    for item in items:
        size += _text_size(item)
        _refuse_text(size, "what it joins")
        taken.append(item)
    return taken


def _bounded_str(value) -> str:
    _refuse_text(_text_size(value), "a value it wrote")
    return str(value)


def _filter_size(name: str, value, args: tuple, kwargs: dict) -> int | None:
    """The length of a growing filter's result, told from its operands (Jinja's own argument order)."""
    def argument(index, key, default):
        return args[index] if len(args) > index else kwargs.get(key, default)

    if name in ("join", "sum"):
        start = argument(0, "d", "") if name == "join" else argument(1, "start", 0)
        return _joined_size(value) + _text_size(start) * max(1, len(value))
    if name == "replace":
        text, old, new = _bounded_str(value), _bounded_str(argument(0, "old", "")), _bounded_str(argument(1, "new", ""))
        return len(text) + (text.count(old) if old else len(text) + 1) * len(new)
    if name == "format":
        return _percent_size(_bounded_str(value), kwargs or args)
    if name == "indent":
        width, text = argument(0, "width", 4), _bounded_str(value)
        return len(text) + (text.count("\n") + 1) * (len(width) if isinstance(width, str) else int(width))
    if name == "wordwrap":
        return len(_bounded_str(value)) * (1 + len(_bounded_str(argument(2, "wrapstring", "\n") or "\n")))
    if name == "slice":  # a list per slice, however few items there are
        return 4 * int(argument(0, "slices", 1))
    if name == "string":
        return _text_size(value)
    if name == "tojson":
        return _text_size([value], indent=int(argument(0, "indent", 0) or 0))
    return None


def _tojson(value, indent=None, ensure_ascii=False, separators=None, sort_keys=False) -> str:
    """JSON as Hugging Face's renderer writes it, which the models were trained on: `<`, `>`, `&` and `'` as
    they are (Jinja's own filter escapes them for HTML, so tool definitions would read `\\u003c`)."""
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, separators=separators, sort_keys=sort_keys)


class _Bounds(NodeTransformer):
    """Routes every loop and every `~` through the budget (by environment attributes, which no
    template can name or replace)."""

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)
        node.iter = nodes.Call(nodes.EnvironmentAttribute("budgeted_iter"), [node.iter], [], None, None)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Call:
        self.generic_visit(node)
        return nodes.Call(nodes.EnvironmentAttribute("budgeted_concat"), [nodes.List(node.nodes)], [], None, None)


class _Generation(Extension):
    """Hugging Face's `{% generation %}` ... `{% endgeneration %}`, which marks an assistant's text for training
    (LFM2.5's, Laguna's templates): its body, as written."""

    tags = {"generation"}

    def parse(self, parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


# What a template may change of a list: its own, as it goes (Kimi K2's queue of call ids, as llama.cpp's engine
# allows); what it is given is a copy
_LIST_CHANGES = frozenset(("append", "pop"))


class _Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(["*", "**", "+", "%"])

    def __init__(self):
        # trim_blocks/lstrip_blocks and {% break %}/{% continue %} (Kimi K2's) as Hugging Face renders these templates
        super().__init__(trim_blocks=True, lstrip_blocks=True, finalize=self.bounded_output,
                         extensions=["jinja2.ext.loopcontrols", _Generation])
        self.globals.update(raise_exception=_raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
        # lipsum(n, min, max) writes n * max words and pprint indents by nesting depth squared; no chat
        # template uses either
        del self.globals["lipsum"]
        self.filters["tojson"] = _tojson
        self.filters["fromjson"] = json.loads  # (StepFun's templates read an earlier call's arguments so)
        self.filters = {name: self._budgeted(name, f) for name, f in self.filters.items() if name != "pprint"}

    def is_safe_attribute(self, obj, attr: str, value) -> bool:
        if isinstance(obj, list) and attr in _LIST_CHANGES:
            return SandboxedEnvironment.is_safe_attribute(self, obj, attr, value)
        return super().is_safe_attribute(obj, attr, value)

    def _parse(self, source, name, filename):
        return _Bounds().visit(super()._parse(source, name, filename))

    @staticmethod
    def bounded_output(value):
        _refuse_text(_text_size(value), "a value it wrote")
        return value

    def budgeted_iter(self, iterable):
        budget = _budget.get()
        for item in iterable:
            budget.tick()
            yield item

    def budgeted_concat(self, parts: list) -> str:
        _refuse_text(sum(map(_text_size, parts)), "a `~` chain")
        return _budget.get().spend("".join(map(str, parts)))

    def _budgeted(self, name, f):
        value_at = 1 if hasattr(f, "jinja_pass_arg") else 0  # after the context or environment, if passed

        @wraps(f)  # keeps the pass_context/pass_environment marks Jinja reads
        def budgeted(*args, **kwargs):
            budget = _budget.get()
            budget.tick()
            _refuse_numbers([*args[value_at + 1:], *kwargs.values()])
            # (an iterator, from map or select, taken as the list it stands for: llama.cpp's templates write
            # `tools | map(attribute='function') | tojson`)
            if (name in ("join", "sum") and not isinstance(args[value_at], (list, tuple, str))
                    or name == "tojson" and isinstance(args[value_at], Iterator)):
                args = (*args[:value_at], _taken(args[value_at]), *args[value_at + 1:])
            foreseen = _filter_size(name, args[value_at], args[value_at + 1:], kwargs)
            if foreseen is not None:
                _refuse_text(foreseen, f"its `{name}` filter's result")
            return budget.spend(f(*args, **kwargs))

        return budgeted

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - Jinja's own signature
        budget = _budget.get()
        budget.tick()
        if not isinstance(__obj, jinja2.runtime.Macro):  # (a macro's numbers are data: a tool call's timestamp)
            _refuse_numbers([*args, *kwargs.values()])
        owner, name = getattr(__obj, "__self__", None), getattr(__obj, "__name__", "")
        if name == "join" and isinstance(owner, (str, bytes)) and args and not isinstance(args[0], (list, tuple, str, bytes)):
            args = (_taken(args[0]), *args[1:])
        foreseen = _foreseen_size(__obj, (*args, *kwargs.values()))
        if foreseen is not None:
            _refuse_text(foreseen, f"its `{name}`")
        return budget.spend(super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value):
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        form, is_map = value.__self__, value.__name__ == "format_map"

        @wraps(wrapped)
        def bounded(*args, **kwargs):
            mapping = args[0] if is_map and args else kwargs
            values = list(mapping.values()) if isinstance(mapping, dict) else [mapping]
            _refuse_text(_format_size(form, values if is_map else [*args, *values]), "its `format`")
            return wrapped(*args, **kwargs)

        return bounded

    def call_binop(self, context, operator, left, right):
        _budget.get().tick()
        integers = all(isinstance(x, int) for x in (left, right))
        if operator == "**" and integers and right > 0 and abs(left).bit_length() * right > MAX_INT_BITS:
            raise TemplateBudgetExceeded(f"a power would have more than {MAX_INT_BITS:,} bits")
        if operator == "*" and integers and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise TemplateBudgetExceeded(f"a product would have more than {MAX_INT_BITS:,} bits")
        sequences = (str, bytes, list, tuple)
        if operator == "*" and any(isinstance(x, sequences) for x in (left, right)):
            sequence, count = (left, right) if isinstance(left, sequences) else (right, left)
            if isinstance(count, int) and len(sequence) * count > MAX_TEXT:
                raise TemplateBudgetExceeded(f"it tried to repeat {len(sequence):,} items {count:,} times")
        if operator == "+" and all(isinstance(x, sequences) for x in (left, right)):
            if len(left) + len(right) > MAX_TEXT:
                raise TemplateBudgetExceeded(f"it added up more than {MAX_TEXT:,} items")
        if operator == "%" and isinstance(left, (str, bytes)):
            form = left.decode("latin-1") if isinstance(left, bytes) else left  # bytes format alike, byte by byte
            _refuse_text(_percent_size(form, right), "its `%` format")
        return _budget.get().spend(super().call_binop(context, operator, left, right))


_ENVIRONMENT = _Sandbox()


@lru_cache(maxsize=16)  # a few models' templates: compiled once per process, not per turn
def _compiled(template: str) -> jinja2.Template:
    return _ENVIRONMENT.from_string(template)


def checked(template: str, where: str) -> str:
    """A chat template given in place of a model's own, once it is known to parse (InputError naming where it
    came from and what is wrong, rather than a failure at every request)."""
    if len(template) > MAX_SOURCE:
        raise InputError(f"{where}: the chat template is {len(template):,} characters (at most {MAX_SOURCE:,})")
    try:
        _compiled(template)
    except jinja2.TemplateSyntaxError as error:
        raise InputError(f"{where}: the chat template does not parse: {error.message} (line {error.lineno})") from None
    except (Exception, RecursionError, MemoryError) as error:  # (untrusted text: nesting beyond the stack, ...)
        raise InputError(f"{where}: the chat template does not parse ({type(error).__name__})") from None
    return template


def render(template: str, messages: list[dict], bos_token: str, eos_token: str, tools: list[dict] | None = None,
           variables: dict | None = None, add_generation_prompt: bool = True) -> str:
    """The conversation (and the tools it may call, OpenAI's definitions) as the template writes it,
    ready for the assistant's turn (or, add_generation_prompt false, not). variables: more the template reads (a
    reasoning model's enable_thinking)."""
    if len(template) > MAX_SOURCE:
        raise InputError(f"the model's chat template is {len(template):,} characters (at most {MAX_SOURCE:,});"
                         " pass --raw to send the prompt as is")
    token = _budget.set(_Budget())
    try:
        pieces, length = [], 0
        # templates ask `if tools`, some `tools is defined`; today's date as llama.cpp gives it (Firefunction's reads
        # datetime; Llama 3.1's to 3.3's date_string, which they set to 26 Jul 2024 where it is not given)
        now = datetime.now()
        today = {"datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y")}
        # (copies: what a template changes of a list it was given stays in this render)
        extra = today | ({"tools": deepcopy(tools)} if tools else {}) | deepcopy(variables or {})
        for piece in _compiled(template).generate(messages=deepcopy(messages), bos_token=bos_token, eos_token=eos_token,
                                                  add_generation_prompt=add_generation_prompt, **extra):
            length += len(piece)
            if length > MAX_TEXT:
                raise TemplateBudgetExceeded(f"it wrote more than {MAX_TEXT:,} characters")
            pieces.append(piece)
        return "".join(pieces)
    except TemplateBudgetExceeded as error:
        raise InputError(f"the model's chat template was stopped: {error}; pass --raw to send the prompt as is") from None
    except MemoryError:
        raise InputError("the model's chat template ran out of memory; pass --raw to send the prompt as is") from None
    except Exception as error:  # a template is untrusted code: whatever it raises is its failure, not ours
        # jinja's error holds its own traceback in a cycle, and through it the frames of whoever probed the template
        # (a generation, its sequence included) until the cyclic collector runs: cut here, they are freed when done
        error.__traceback__ = None
        raise InputError(f"the model's chat template failed ({error}); pass --raw to send the prompt as is") from None
    finally:
        _budget.reset(token)


# Stands in for a message's text while the template's own text is located; no template alters it.
_STAND_IN = "\u2063{}\u2063"
_STAND_IN_FOUND = re.compile("\u2063(\\d+)\u2063")


def render_pieces(template: str, messages: list[dict], bos_token: str, eos_token: str, literal: set[int],
                  tools: list[dict] | None = None, variables: dict | None = None,
                  prefill: bool = False, generation_prompt: bool = True) -> list[tuple[str, bool]] | None:
    """The rendered conversation as (text, is_message_text) pieces, where the text of each message
    numbered in `literal` is a piece of its own: what a user wrote can then be tokenized as text, and
    only the template's own text may spell control tokens. Templates that trim a message are
    followed; one that rewrites a literal message otherwise is refused. prefill: the last message is the start of
    the assistant's reply, which the reply goes on from (llama-server's and Anthropic's prefill): no generation
    prompt, and the pieces end where its text does (None where the template leaves that text out).
    generation_prompt: false, the assistant's turn is not opened (add_generation_prompt, as templates read it)."""
    if prefill:
        messages = [*messages[:-1], messages[-1] | {"content": (messages[-1].get("content") or "") + _PREFILL_END}]
    pieces = _pieces(template, messages, bos_token, eos_token, literal, tools, variables,
                     generation_prompt and not prefill)
    if not prefill:
        return pieces
    for at, (text, is_message) in enumerate(pieces):
        if _PREFILL_END in text:
            return [*pieces[:at], (text[:text.index(_PREFILL_END)], is_message)]
    return None


# Ends a prefill's text (a final assistant message), where its prompt is cut
_PREFILL_END = "\u2064"


def _pieces(template: str, messages: list[dict], bos_token: str, eos_token: str, literal: set[int],
            tools: list[dict] | None, variables: dict | None, add_generation_prompt: bool) -> list[tuple[str, bool]]:
    text = render(template, messages, bos_token, eos_token, tools, variables, add_generation_prompt)
    if not literal:
        return [(text, False)]
    stand_ins = [dict(m, content=_STAND_IN.format(i)) if i in literal else m for i, m in enumerate(messages)]
    skeleton = _STAND_IN_FOUND.split(render(template, stand_ins, bos_token, eos_token, tools, variables,
                                            add_generation_prompt))
    # odd parts name a message; one that names no literal message came from other text, not a stand-in
    if all(int(part) in literal for part in skeleton[1::2]):
        for shown in (str, str.strip):
            pieces = [(shown(messages[int(part)]["content"]), True) if i % 2 else (part, False)
                      for i, part in enumerate(skeleton) if part or i % 2]
            if "".join(piece for piece, _ in pieces) == text:
                return pieces
    raise InputError("a message contains the text of a control token, and the model's chat template rewrites"
                     " that message in a way localspec cannot follow; pass --raw to send the prompt as written")
