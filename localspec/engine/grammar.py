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
import re
import sys
from time import perf_counter

import numpy as np

from ..errors import InputError
from .chain import TOKEN_DATA
from .library import c_stderr_captured, llama, recent_errors
from .sampling import Dist


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
