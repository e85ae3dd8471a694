"""Batch prompt files: parsing, per-item settings, output that survives kills, resume."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from localspec import batch
from localspec.config import Limits, Sampling
from localspec.errors import LocalspecError


def test_items_from_jsonl_and_plain_lines():
    items = list(batch.read_items([
        '{"id": "x", "prompt": "hi", "temperature": 0, "max_tokens": 5}',
        "",
        "a plain prompt",
        '{"messages": [{"role": "user", "content": "yo"}]}',
        '{"id": 7, "prompt": 3}',
        "{broken",
    ]))
    assert [i.id for i in items] == ["x", "3", "4", "7", "line 6"]
    assert items[0].options == {"temperature": 0, "max_tokens": 5} and items[1].prompt == "a plain prompt"
    assert items[2].messages == [{"role": "user", "content": "yo"}]
    assert "prompt" in items[3].error and "not valid JSON" in items[4].error


def test_item_settings_override_the_defaults_and_are_checked():
    item = batch.Item(id="1", prompt="p", options={"temp": 0.2, "top_k": 3, "max_tokens": 9, "stop": "END"})
    sampling, limits = batch.settings(item, Sampling(), Limits())
    assert (sampling.temperature, sampling.top_k, limits.max_tokens, limits.stop) == (0.2, 3, 9, ("END",))
    with pytest.raises(LocalspecError, match="unknown field"):
        batch.settings(batch.Item(id="1", prompt="p", options={"tempreature": 1}), Sampling(), Limits())
    with pytest.raises(LocalspecError, match="temperature must be"):
        batch.settings(batch.Item(id="1", prompt="p", options={"temperature": -1}), Sampling(), Limits())


def test_done_ids_drops_a_line_cut_short_by_a_kill(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "a", "text": "x"}\n{"id": "b", "error": "e"}\n{"id": "c", "te')
    assert batch.done_ids(out) == {"a", "b"}
    assert out.read_text().endswith('"e"}\n')


@pytest.fixture
def localspec(tmp_path):
    env = {**os.environ, "LOCALSPEC_HOME": str(tmp_path / "home")}

    def invoke(*args, stdin=b"", **kwargs):
        return subprocess.run([sys.executable, "-m", "localspec", "batch", *map(str, args)], input=stdin,
                              capture_output=True, env=env, timeout=300, **kwargs)

    return invoke, env


def records(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode().splitlines()]


def test_stdin_to_stdout_with_a_failing_item(localspec, tiny):
    invoke, _ = localspec
    done = invoke(tiny["target"], "-", "-n", "5", stdin=b'the cat\n{"id": "bad", "prompt": 1}\n{"id": "ok", "prompt": "a b"}\n')
    assert done.returncode == 1
    out = records(done.stdout)
    assert [r["id"] for r in out] == ["1", "bad", "ok"]
    assert out[0]["stats"]["tokens"] == 5 and "error" in out[1] and out[2]["finish_reason"] == "length"
    assert b"failed bad" in done.stderr


def test_resume_after_a_kill_finishes_every_item_once(localspec, tiny, tmp_path):
    invoke, env = localspec
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"prompt number {i}\n" for i in range(80)))
    output = tmp_path / "out.jsonl"
    run = subprocess.Popen([sys.executable, "-m", "localspec", "batch", str(tiny["target"]), str(prompts),
                            "-o", str(output), "-n", "300", "--temp", "1"], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not output.exists() or output.read_text().count("\n") < 3):
        time.sleep(0.05)
    run.send_signal(signal.SIGKILL)
    run.wait()
    written = output.read_text().count("\n")
    assert 3 <= written < 80, "the kill should land mid-batch"

    resumed = invoke(tiny["target"], prompts, "-o", output, "-n", "20", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    ids = [r["id"] for r in records(output.read_bytes())]
    assert sorted(ids, key=int) == [str(i) for i in range(1, 81)]
    assert b"skipped (resume)" in resumed.stderr


def test_resume_needs_an_output_file(localspec, tiny):
    invoke, _ = localspec
    done = invoke(tiny["target"], "-", "--resume", stdin=b"x\n")
    assert done.returncode == 2 and b"--resume needs --output" in done.stderr


def test_a_non_utf8_input_file_is_refused_in_one_line(localspec, tiny, tmp_path):
    invoke, _ = localspec
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    done = invoke(tiny["target"], tmp_path / "latin1.txt")
    assert done.returncode == 2 and done.stdout == b""
    assert done.stderr.decode().strip().splitlines() == [f"error: {tmp_path / 'latin1.txt'} is not UTF-8 text (byte 3)"]
