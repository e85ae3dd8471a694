"""Rendering a model's own chat template (Jinja, from its GGUF metadata) safely.

Templates come from model files downloaded off the internet, so they run in
Jinja's immutable sandbox: no attribute access to Python internals, no mutation
of the objects passed in, no ranges or repetitions big enough to exhaust memory.
"""

from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from .errors import InputError


def _raise_exception(message: str):
    raise jinja2.TemplateError(message)


MAX_REPEAT = 1 << 20  # longest string or list a template may build with * (a prompt, not a memory bomb)


class _Sandbox(ImmutableSandboxedEnvironment):
    """Also bounds `*` and `**`, with which one line of template could ask for gigabytes."""

    intercepted_binops = frozenset(["*", "**"])

    def call_binop(self, context, operator, left, right):
        if operator == "**" and isinstance(right, int) and abs(right) > 64:
            raise SecurityError(f"exponent {right} is too large for a chat template")
        if operator == "*" and any(isinstance(x, (str, list, tuple)) for x in (left, right)):
            sequence, count = (left, right) if isinstance(left, (str, list, tuple)) else (right, left)
            if isinstance(count, int) and len(sequence) * count > MAX_REPEAT:
                raise SecurityError(f"a template tried to repeat {len(sequence)} items {count} times")
        return super().call_binop(context, operator, left, right)


def render(template: str, messages: list[dict], bos_token: str, eos_token: str) -> str:
    # trim_blocks/lstrip_blocks match how Hugging Face renders these templates.
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=True, bos_token=bos_token, eos_token=eos_token
        )
    except Exception as error:  # a template is untrusted code: whatever it raises is its failure, not ours
        raise InputError(f"the model's chat template failed ({error}); pass --raw to send the prompt as is") from None
