"""Rendering a model's own chat template (Jinja, from its GGUF metadata) safely.

Templates come from model files downloaded off the internet, so they run in
Jinja's immutable sandbox (no attribute access to Python internals, no mutation
of the objects passed in) under a budget checked while they run, not after:

* no string or list a template builds may exceed MAX_TEXT items, and all of them
  together no more than MAX_WORK: every repetition, concatenation, format,
  method and filter result is measured, and the ones whose size can be told
  beforehand (`'a'.ljust(N)`, `'{:>N}'.format`, `'%0Nd' %`, `replace`, `join`)
  are refused before they allocate;
* no render may take longer than MAX_SECONDS: every loop's iteration and every
  call checks the clock, so nested loops that would never return are stopped;
* the rendered text itself is bounded by MAX_TEXT as it streams out.
"""

import re
from datetime import datetime
from functools import wraps
from time import perf_counter

import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from jinja2.visitor import NodeTransformer

from .errors import InputError

# characters (or list items) of one value and of the rendered prompt; also the largest width, count
# or repetition a call may ask for
MAX_TEXT = 1 << 22
MAX_WORK = 1 << 25  # characters of all the values a render builds together
MAX_SECONDS = 2.0
# a field width or precision of seven digits or more in a format string: a request for megabytes
HUGE_FORMAT_FIELD = re.compile(r"\d{7,}")
CHECK_EVERY = 256  # loop iterations between looks at the clock


class TemplateBudgetExceeded(SecurityError):
    pass


def _raise_exception(message: str):
    raise jinja2.TemplateError(message)


class _Budget:
    """What one render may still spend."""

    def __init__(self):
        self.deadline = perf_counter() + MAX_SECONDS
        self.work = 0
        self.ticks = 0

    def tick(self) -> None:
        self.ticks += 1
        if self.ticks % CHECK_EVERY == 0 and perf_counter() > self.deadline:
            raise TemplateBudgetExceeded(f"it ran for more than {MAX_SECONDS:g} s")

    def spend(self, value):
        if isinstance(value, (str, list, tuple, dict)):
            if len(value) > MAX_TEXT:
                raise TemplateBudgetExceeded(f"it built a value of {len(value):,} items (at most {MAX_TEXT:,})")
            self.work += len(value)
            if self.work > MAX_WORK:
                raise TemplateBudgetExceeded(f"it built more than {MAX_WORK:,} characters in all")
        return value

    def refuse_numbers(self, values) -> None:
        for value in values:
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_TEXT:
                raise TemplateBudgetExceeded(f"it asked for {value:,} of something (at most {MAX_TEXT:,})")


def _foreseen_size(method, args) -> int | None:
    """The length of a str method's result where it is cheap to know before calling it."""
    owner = getattr(method, "__self__", None)
    name = getattr(method, "__name__", "")
    if not isinstance(owner, str):
        return None
    if name == "replace" and len(args) >= 2 and all(isinstance(a, str) for a in args[:2]) and args[0]:
        return len(owner) + owner.count(args[0]) * (len(args[1]) - len(args[0]))
    if name == "join" and args and isinstance(args[0], (list, tuple)):
        parts = args[0]
        return sum(len(p) for p in parts if isinstance(p, str)) + len(owner) * max(0, len(parts) - 1)
    return None


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


class _Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(["*", "**", "+", "%"])

    def __init__(self, budget: _Budget):
        # trim_blocks/lstrip_blocks match how Hugging Face renders these templates.
        super().__init__(trim_blocks=True, lstrip_blocks=True)
        self.budget = budget
        self.globals.update(raise_exception=_raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
        self.filters = {name: self._budgeted(f) for name, f in self.filters.items()}

    def _parse(self, source, name, filename):
        return _Bounds().visit(super()._parse(source, name, filename))

    def budgeted_iter(self, iterable):
        for item in iterable:
            self.budget.tick()
            yield item

    def budgeted_concat(self, parts: list) -> str:
        texts = [str(part) for part in parts]
        if sum(map(len, texts)) > MAX_TEXT:
            raise TemplateBudgetExceeded(f"it joined more than {MAX_TEXT:,} characters")
        return self.budget.spend("".join(texts))

    def _budgeted(self, f):
        first_argument = 2 if hasattr(f, "jinja_pass_arg") else 1  # the context (if passed) and the value

        @wraps(f)  # keeps the pass_context/pass_environment marks Jinja reads
        def budgeted(*args, **kwargs):
            self.budget.tick()
            self.budget.refuse_numbers([*args[first_argument:], *kwargs.values()])
            return self.budget.spend(f(*args, **kwargs))

        return budgeted

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - Jinja's own signature
        __self.budget.tick()
        __self.budget.refuse_numbers([*args, *kwargs.values()])
        foreseen = _foreseen_size(__obj, args)
        if foreseen is not None and foreseen > MAX_TEXT:
            raise TemplateBudgetExceeded(f"it asked for a string of {foreseen:,} characters")
        return __self.budget.spend(super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value):
        wrapped = super().wrap_str_format(value)
        if wrapped is not None and HUGE_FORMAT_FIELD.search(value.__self__):
            raise TemplateBudgetExceeded("its format string asks for a field of millions of characters")
        return wrapped

    def call_binop(self, context, operator, left, right):
        self.budget.tick()
        if operator == "**" and isinstance(right, int) and abs(right) > 64:
            raise TemplateBudgetExceeded(f"exponent {right} is too large for a chat template")
        if operator == "*" and any(isinstance(x, (str, list, tuple)) for x in (left, right)):
            sequence, count = (left, right) if isinstance(left, (str, list, tuple)) else (right, left)
            if isinstance(count, int) and len(sequence) * count > MAX_TEXT:
                raise TemplateBudgetExceeded(f"it tried to repeat {len(sequence):,} items {count:,} times")
        if operator == "+" and all(isinstance(x, (str, list, tuple)) for x in (left, right)):
            if len(left) + len(right) > MAX_TEXT:
                raise TemplateBudgetExceeded(f"it added up more than {MAX_TEXT:,} items")
        if operator == "%" and isinstance(left, str) and HUGE_FORMAT_FIELD.search(left):
            raise TemplateBudgetExceeded("its format string asks for a field of millions of characters")
        return self.budget.spend(super().call_binop(context, operator, left, right))


def render(template: str, messages: list[dict], bos_token: str, eos_token: str) -> str:
    budget = _Budget()
    try:
        compiled = _Sandbox(budget).from_string(template)
        pieces, length = [], 0
        for piece in compiled.generate(messages=messages, add_generation_prompt=True, bos_token=bos_token,
                                       eos_token=eos_token):
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
        raise InputError(f"the model's chat template failed ({error}); pass --raw to send the prompt as is") from None


# Stands in for a message's text while the template's own text is located; no template alters it.
_STAND_IN = "\u2063{}\u2063"
_STAND_IN_FOUND = re.compile("\u2063(\\d+)\u2063")


def render_pieces(template: str, messages: list[dict], bos_token: str, eos_token: str,
                  literal: set[int]) -> list[tuple[str, bool]]:
    """The rendered conversation as (text, is_message_text) pieces, where the text of each message
    numbered in `literal` is a piece of its own: what a user wrote can then be tokenized as text, and
    only the template's own text may spell control tokens. Templates that trim a message are
    followed; one that rewrites a literal message otherwise is refused."""
    text = render(template, messages, bos_token, eos_token)
    if not literal:
        return [(text, False)]
    stand_ins = [dict(m, content=_STAND_IN.format(i)) if i in literal else m for i, m in enumerate(messages)]
    skeleton = _STAND_IN_FOUND.split(render(template, stand_ins, bos_token, eos_token))
    # odd parts name a message; one that names no literal message came from other text, not a stand-in
    if all(int(part) in literal for part in skeleton[1::2]):
        for shown in (str, str.strip):
            pieces = [(shown(messages[int(part)]["content"]), True) if i % 2 else (part, False)
                      for i, part in enumerate(skeleton) if part or i % 2]
            if "".join(piece for piece, _ in pieces) == text:
                return pieces
    raise InputError("a message contains the text of a control token, and the model's chat template rewrites"
                     " that message in a way localspec cannot follow; pass --raw to send the prompt as written")
