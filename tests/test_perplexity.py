"""A text's perplexity, measured as llama.cpp's llama-perplexity measures it: the chunks, the estimate and
its error, and `localspec perplexity` on a tiny model against the rows the session scores."""

import json
import math

import numpy as np
import pytest

from localspec.config import DrafterKind, Runtime, Speculation
from localspec.errors import UsageError
from localspec.perplexity import chunks_of, estimate
from localspec.session import Session

TEXT = "the cat sat on the mat and the dog sat on the log; " * 40


def test_chunks_are_whole_each_opened_by_the_start_token_where_the_model_takes_one():
    tokens = list(range(10, 31))
    assert chunks_of(tokens, 8, bos=1) == [[1, *range(11, 18)], [1, *range(19, 26)]]
    assert chunks_of(tokens, 8, bos=None) == [list(range(10, 18)), list(range(18, 26))]
    assert chunks_of(tokens, 8, bos=1, most=1) == [[1, *range(11, 18)]] and chunks_of(tokens, 40, 1) == []


def test_the_estimate_and_its_error_are_llama_perplexitys():
    values = [0.5, 1.25, 2.0, 0.75]
    ppl, error = estimate(values)
    mean, spread = np.mean(values), np.mean(np.square(values)) - np.mean(values) ** 2
    assert ppl == pytest.approx(math.exp(mean)) and error == pytest.approx(math.sqrt(spread / 3) * math.exp(mean))
    assert estimate([1.0, 1.0]) == (pytest.approx(math.e), 0.0)


def test_scoring_leaves_what_the_sequences_hold_and_reads_a_chunk_in_one_batch(tiny):
    """As llama-perplexity reads a chunk: one batch of --batch-size with a row of every token, on a context of its
    own, so a generation's cache is still there for the next request."""
    with Session(tiny["target"], None, Runtime(ctx_size=256, prompt_batch=128), Speculation(drafting=DrafterKind.PLAIN)
                 ) as session:
        session.complete("the cat sat on the mat", raw=True, temperature=0, max_tokens=4)
        held = list(session.sequences[0].tokens)
        chunk = session.prompts.model.tokenize(TEXT, add_special=True, parse_special=False)[:100]
        decodes = []
        scorer_decode = session._scoring_context(100).decode
        session._scorer.decode = lambda tokens, **kw: decodes.append(len(tokens)) or scorer_decode(tokens, **kw)
        session.score(chunk, start=51)
        assert decodes == [50, 49] and session.sequences[0].tokens == held


def test_perplexity_scores_the_second_half_of_each_chunk_as_the_session_reads_it(localspec, tiny, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    done = localspec("perplexity", tiny["target"], "-f", text, "-c", "64", "--chunks", "3", "--json")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    with Session(tiny["target"], None, Runtime(ctx_size=256), Speculation(drafting=DrafterKind.PLAIN)) as session:
        model = session.prompts.model
        chunks = chunks_of(model.tokenize(TEXT, add_special=True, parse_special=False), 64, model.bos, 3)
        negative = [-e.chosen.logprob for chunk in chunks for e in session.score(chunk)[33:]]
    assert (found["chunks"], found["ctx_size"], found["scored_tokens"]) == (3, 64, 3 * 31) == (3, 64, len(negative))
    assert found["ppl"] == pytest.approx(estimate(negative)[0], rel=1e-3) and found["error"] > 0
    assert len(found["running"]) == 3 and found["running"][-1] == found["ppl"]
    shown = localspec("perplexity", tiny["target"], "-f", text, "-c", "64", "--chunks", "2")
    assert shown.returncode == 0 and shown.stdout.startswith(b"Final estimate: PPL = ")
    assert shown.stderr.count(b"[1]") == 1 and b"[2]" in shown.stderr


def test_ctrl_c_reports_the_estimate_over_the_chunks_read(tiny, tmp_path):
    """Ctrl-C printed nothing of the chunks read; the running estimate, said to come after each chunk, came at the
    end alone. (Ctrl-C comes here in the third chunk's scoring, as it would.)"""
    import os
    import subprocess
    import sys

    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    script = ("import localspec.session as session\nreal, calls = session.Session.score, []\n"
              "def stopping(*asked, **named):\n    calls.append(1)\n    if len(calls) == 3:\n"
              "        raise KeyboardInterrupt\n    return real(*asked, **named)\n"
              "session.Session.score = stopping\nfrom localspec.cli.app import main\nmain()\n")
    env = {**os.environ, "LOCALSPEC_HOME": str(tmp_path / "home")}
    for as_json in (False, True):
        done = subprocess.run([sys.executable, "-c", script, "perplexity", str(tiny["target"]), "-f", str(text), "-c",
                               "64", "--chunks", "4", *(["--json"] if as_json else [])], capture_output=True,
                              text=True, env=env, timeout=120)
        assert done.returncode == 130 and "Traceback" not in done.stderr, done.stderr
        if as_json:
            found = json.loads(done.stdout)
            assert found["interrupted"] is True and found["chunks"] == 2 and found["scored_tokens"] == 2 * 31
        else:
            assert done.stdout.startswith("Estimate so far: PPL = ") and "2 of 4 chunks of 64 tokens" in done.stderr
            assert "\n[1]" in done.stderr and "[2]" in done.stderr and "[3]" not in done.stderr


def test_a_text_shorter_than_a_chunk_and_a_count_of_no_chunks_are_one_line_each(localspec, cli, tiny, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("the cat sat")
    done = localspec("perplexity", tiny["target"], "-f", short, "-c", "64")
    assert done.returncode == 2 and b"less than one chunk of 64" in done.stderr and b"Traceback" not in done.stderr
    code, _, err = cli("perplexity", tiny["target"], "-f", short, "--chunks", "0")
    assert code == 2 and "--chunks must be at least 1" in err


@pytest.mark.parametrize("model, parallel", [("target", 1), ("target", 2), ("hybrid", 1), ("hybrid", 2)])
def test_scoring_from_a_start_reads_what_comes_before_as_a_prompt_and_scores_the_rest_alike(tiny, model, parallel):
    """The tokens before `start` are read in whole batches with no rows kept (a recurrent model's, on its first
    sequence, in turns where that shares its context); the rows after are the ones scoring every token gives."""
    with Session(tiny[model], None, Runtime(ctx_size=256, parallel=parallel),
                 Speculation(drafting=DrafterKind.PLAIN)) as session:
        model = session.prompts.model
        chunk = chunks_of(model.tokenize(TEXT, add_special=True, parse_special=False), 100, model.bos, 1)[0]
        every, later = session.score(chunk, top=2), session.score(chunk, top=2, start=61)
        with pytest.raises(UsageError, match="start: a token from 1 to 100"):
            session.score(chunk, start=0)
    assert [e.chosen.id for e in later] == chunk and all(e.chosen.logprob is None for e in later[:61])
    assert len(every) == len(later) == 100 and all(e.chosen.logprob is not None for e in every[1:])
    for whole, part in zip(every[61:], later[61:]):
        # (rows of batches of other shapes: the sums go in another order, 2e-3 apart at most on the tiny model)
        assert part.chosen.logprob == pytest.approx(whole.chosen.logprob, rel=1e-3, abs=2e-3)
        assert [c.id for c in part.top] == [c.id for c in whole.top]
