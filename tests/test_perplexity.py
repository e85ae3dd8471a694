"""A text's perplexity, measured as llama.cpp's llama-perplexity measures it: the chunks, the estimate and
its error, and `localspec perplexity` on a tiny model against the rows the session scores."""

import json
import math

import numpy as np
import pytest

from localspec.config import DrafterKind, Runtime, Speculation
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


def test_a_text_shorter_than_a_chunk_and_a_count_of_no_chunks_are_one_line_each(localspec, cli, tiny, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("the cat sat")
    done = localspec("perplexity", tiny["target"], "-f", short, "-c", "64")
    assert done.returncode == 2 and b"less than one chunk of 64" in done.stderr and b"Traceback" not in done.stderr
    code, _, err = cli("perplexity", tiny["target"], "-f", short, "--chunks", "0")
    assert code == 2 and "--chunks must be at least 1" in err
