"""Chat templates come from downloaded files: they render in a sandbox and fail as one-line user errors."""

import pytest

from localspec.chat_template import render
from localspec.errors import InputError

MESSAGES = [{"role": "user", "content": "hi"}]


def test_an_ordinary_template_renders():
    template = "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    assert render(template, MESSAGES, "<s>", "</s>") == "<s><user>hi<assistant>"


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",  # reach Python's classes
        "{{ messages.__class__.__init__.__globals__ }}",  # reach a module's globals
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        "{% set _ = messages.append({'role': 'system'}) %}",  # mutate what it was given
        "{{ 'x' * 10000000000 }}",  # ask for 10 GB
        "{{ [0] * (2 ** 40) }}",
        "{{ 10 ** 100000000 }}",
        "{% for i in range(10 ** 9) %}{% endfor %}",
        "{{ 1 / 0 }}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",  # endless recursion
        "{{ raise_exception('templates may refuse input on purpose') }}",
        "{% for m in messages %}",  # not even valid Jinja
    ],
)
def test_hostile_or_broken_templates_fail_safely(template):
    with pytest.raises(InputError, match="chat template failed"):
        render(template, MESSAGES, "<s>", "</s>")
    assert MESSAGES == [{"role": "user", "content": "hi"}]
