"""Structured output: llama.cpp's grammar sampler (GBNF) as the mask on the target's choices.

Speculation stays lossless under a grammar because only the target's side is masked: at every
verified position the target chooses among the tokens the grammar admits after the tokens committed
before it, and the grammar then accepts the choice. A draft token the grammar forbids is one the
target never chooses, so it is rejected like any other wrong guess; drafters need not know the grammar.
The grammar only ever accepts committed tokens, so nothing has to be taken back when a draft fails.

Masking a whole row costs about 10 ms at a 150k vocabulary; asking whether one token is admitted
costs a few microseconds. Greedy choices ask about the row's argmax first (what the grammar admits
of it is the masked argmax too) and mask the row only where the argmax is refused.
"""

import ctypes
import json

import numpy as np

from ..errors import InputError
from .chain import TOKEN_DATA
from .library import grammars, llama, recent_errors


def json_object() -> str:
    """GBNF for any JSON object (OpenAI's response_format json_object): llama.cpp's json.gbnf."""
    return grammars().JSON_GBNF


def from_json_schema(schema: dict | bool, rule: str = "root") -> str:
    """A JSON schema as GBNF, by the converter llama-cpp-python maintains (llama.cpp's own, ported);
    InputError where the schema uses what it cannot convert. rule: the name of the rule that matches the
    schema (its helper rules are named after it), so a grammar can be built around it."""
    converter = grammars().SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    try:
        copy = json.loads(json.dumps(schema))  # resolve_refs rewrites what it is given
        converter.visit(converter.resolve_refs(copy, "stdin"), "" if rule == "root" else rule)
        return converter.format_grammar()
    except (ValueError, KeyError, TypeError, AssertionError, NotImplementedError, RecursionError) as error:
        raise InputError(f"the JSON schema cannot be turned into a grammar: {error or type(error).__name__}") from None


class Grammar:
    """A GBNF grammar's state over one generation: which tokens it admits next, and the tokens
    committed so far (accept). Close it (or use it in a with block) to free llama.cpp's sampler."""

    def __init__(self, vocab, text: str, triggers: tuple[str, ...] = ()):
        """triggers: Sampling.grammar_triggers (the grammar admits every token until one matches)."""
        recent_errors.clear()
        if triggers:
            patterns = (ctypes.c_char_p * len(triggers))(*(pattern.encode() for pattern in triggers))
            self._sampler = llama.llama_sampler_init_grammar_lazy_patterns(vocab, text.encode(), b"root", patterns,
                                                                           len(triggers), None, 0)
        else:
            self._sampler = llama.llama_sampler_init_grammar(vocab, text.encode(), b"root")
        if not self._sampler:
            why = "; ".join(recent_errors) or "llama.cpp could not parse it"
            raise InputError(f"the grammar does not compile: {why}")
        self._one = np.empty(1, TOKEN_DATA)
        self._row: np.ndarray | None = None
        self._probes: np.ndarray | None = None

    def admits(self, token: int) -> bool:
        self._one["id"], self._one["logit"] = token, 0.0
        self._apply(self._one)
        return bool(np.isfinite(self._one["logit"][0]))

    def admitted(self, logits: np.ndarray) -> np.ndarray:
        """The ids of a whole row the grammar admits next; InputError where it admits none (a grammar
        that cannot go on from here, or cannot begin)."""
        if self._row is None or len(self._row) != len(logits):
            self._row = np.empty(len(logits), TOKEN_DATA)
        self._row["id"] = np.arange(len(logits), dtype=np.int32)
        self._row["logit"] = 0.0
        self._apply(self._row)
        ids = np.flatnonzero(np.isfinite(self._row["logit"])).astype(np.int32)
        if not ids.size:
            raise InputError("the grammar admits no token here: it cannot begin, or cannot go on from the text so far")
        return ids

    def best(self, logits: np.ndarray) -> int:
        """The row's most likely token among those the grammar admits."""
        top = int(np.argmax(logits))
        if self.admits(top):
            return top
        ids = self.admitted(logits)
        return int(ids[np.argmax(logits[ids])])

    def forced_text(self, characters: dict[int, str], ends: tuple[int, ...], most: int) -> tuple[str, str]:
        """The text the grammar admits alone from here (a JSON schema's key after its opening quote, say),
        up to `most` characters, and the characters it admits after that text (where there are several).

        Read character by character while exactly one of `characters` (tokens of one character each, by
        id) is admitted and none of `ends` (end-of-generation tokens), on a copy of the grammar's state, so
        nothing is committed. A BPE vocabulary spells a forced text with tokens of many lengths (`"s`,
        `"sum`, ...), so a grammar forces a text, never a single token."""
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
        """A token committed to the output (it must be one the grammar admits)."""
        llama.llama_sampler_accept(self._sampler, token)

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
