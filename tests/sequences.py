"""Generations on sequences of the engine alone, and several at once in one batch a step: what the tests of
parallel sequences and of draft trees beside them compare (imports of the engine only, so that a lent
device without the protocols' clients runs them)."""

from localspec.config import Limits, Sampling, Speculation
from localspec.engine.speculative import generate
from localspec.engine.together import Together
from localspec.events import Step, Token

GREEDY = Sampling(temperature=0.0)


def run_alone(context, prompt, drafter, sampling=GREEDY):
    events = generate(context, drafter, prompt, sampling, Speculation(draft_max=4, p_min=0.0), Limits(max_tokens=40))
    return [event.id for event in events if isinstance(event, Token)]


def run_together(sequences, prompts, drafters, sampling=GREEDY):
    together, out, steps = Together(), {}, {}
    for i, (sequence, prompt, drafter) in enumerate(zip(sequences, prompts, drafters)):
        together.add(i, generate(sequence, drafter, prompt, sampling, Speculation(draft_max=4, p_min=0.0),
                                 Limits(max_tokens=40)))
        out[i], steps[i] = [], []
    for _ in range(1000):
        if not together:
            break
        for key, item in together.step():
            if isinstance(item, Token):
                out[key].append(item.id)
            elif isinstance(item, Step):
                steps[key].append(item)
            elif isinstance(item, Exception):
                raise item
    assert not together
    return out, steps
