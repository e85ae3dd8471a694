"""`localspec bench` on tiny models: every mode on the same prompts, results that add up."""

import json
import os
import subprocess
import sys

import pytest

from localspec import bench
from localspec.config import Limits, Runtime, Sampling, Speculation
from localspec.errors import InputError, UsageError
from localspec.session import Session


def test_prompt_files_in_jsonl_or_text(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    (tmp_path / "p.txt").write_text("one\n\ntwo\nthree\n")
    assert bench.load_prompts(str(tmp_path / "p.jsonl"), None) == ["a", "b"]
    assert bench.load_prompts(str(tmp_path / "p.txt"), 2) == ["one", "two"]
    with pytest.raises(InputError, match="neither a prompt set"):
        bench.load_prompts(str(tmp_path / "missing.txt"), None)


@pytest.fixture(scope="module")
def session(tiny):
    with Session(tiny["target"], str(tiny["partial"]), Runtime(ctx_size=256, threads=2),
                 Speculation(p_min=0.0)) as session:
        yield session


def test_every_mode_runs_the_same_prompts_and_speedups_are_relative_to_plain(session):
    prompts = {"mine": ["the cat sat", "abcabcabc"]}
    rows = bench.run(session, prompts, ["plain", "ngram", "draft", "auto"], Sampling(temperature=0),
                     Limits(max_tokens=30), lambda text: None)
    by_mode = {r["mode"]: r for r in rows}
    assert set(by_mode) == {"plain", "ngram", "draft", "auto"}
    assert all(r["prompts"] == 2 and r["tokens"] == 60 for r in rows)
    assert by_mode["plain"]["speedup"] == pytest.approx(1.0) and by_mode["plain"]["acceptance_rate"] == 0
    assert by_mode["draft"]["acceptance_rate"] > 0 and len(by_mode["draft"]["per_position_acceptance"]) == 3
    assert all(0 <= r["python_overhead"] < 1 for r in rows)


def test_unknown_modes_are_refused(session):
    with pytest.raises(UsageError, match="unknown mode"):
        bench.run(session, {"x": ["a"]}, ["turbo"], Sampling(), Limits(max_tokens=2), lambda text: None)


def test_bench_command_writes_json_and_a_plot(tiny, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the cat\nthe dog\n")
    done = subprocess.run(
        [sys.executable, "-m", "localspec", "bench", str(tiny["target"]), "--draft", str(tiny["partial"]),
         "--prompts", str(prompts), "--max-tokens", "20", "--json", str(tmp_path / "b.json"),
         "--plot", str(tmp_path / "b.png")],
        capture_output=True, env={**os.environ, "LOCALSPEC_HOME": str(tmp_path / "home"), "COLUMNS": "160"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()
    results = json.loads((tmp_path / "b.json").read_text())["results"]
    assert {r["mode"] for r in results} == {"plain", "ngram", "draft", "auto"}
    for key in ("mode", "prompt_set", "tokens_per_second", "speedup", "acceptance_rate", "mean_accepted_length"):
        assert key in results[0]
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"localspec bench" in done.stdout


@pytest.mark.slow
def test_named_prompt_sets_come_from_their_packages():
    humaneval = bench.load_prompts("humaneval", 3)
    assert len(humaneval) == 3 and "def has_close_elements" in humaneval[0]
    mtbench = bench.load_prompts("mtbench", 2)
    assert "travel blog post" in mtbench[0]
    edit = bench.load_prompts("humaneval-edit", 1)[0]
    assert "def has_close_elements" in edit and "for idx, elem in enumerate(numbers)" in edit
