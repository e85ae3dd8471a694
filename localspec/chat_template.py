"""Rendering a model's own chat template (Jinja, from its GGUF metadata) safely.

Templates come from model files downloaded off the internet, so they run in
Jinja's immutable sandbox: no attribute access to Python internals, no mutation
of the objects passed in.
"""

from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import InputError


def _raise_exception(message: str):
    raise jinja2.TemplateError(message)


def render(template: str, messages: list[dict], bos_token: str, eos_token: str) -> str:
    # trim_blocks/lstrip_blocks match how Hugging Face renders these templates.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template).render(
            messages=messages, add_generation_prompt=True, bos_token=bos_token, eos_token=eos_token
        )
    except jinja2.TemplateError as error:
        raise InputError(f"the model's chat template failed ({error}); pass --raw to send the prompt as is") from None
