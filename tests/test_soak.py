"""Long runs: 200 batch items on a real model with memory flat and every KV cache checked after every step."""

import json
import os
import subprocess
import sys

import psutil
import pytest

ITEMS = 200
WARM_UP = 20  # items before memory is compared: allocator pools and caches fill early
RSS_GROWTH_BOUND = 16 * 2**20  # bytes, after the warm-up; a leak of one KV cache or logits copy per item is far more


@pytest.mark.slow
def test_200_batch_items_keep_memory_flat_and_kv_caches_exact(real_model, tmp_path):
    model = real_model("smollm2-135m")
    topics = ["the sea", "mountains", "bread", "rivers", "the moon", "bees", "glass", "trains"]
    items = tmp_path / "items.jsonl"
    items.write_text("".join(
        json.dumps({"id": i, "prompt": f"Tell me fact number {i} about {topics[i % len(topics)]}."}) + "\n"
        for i in range(ITEMS)
    ))
    # LOCALSPEC_DEBUG=1: after every step the loop checks that llama.cpp's KV cache holds exactly
    # the committed tokens; n-gram drafts at temperature 0.8 are often rejected, so it rolls back often.
    env = {**os.environ, "LOCALSPEC_HOME": str(tmp_path / "home"), "LOCALSPEC_DEBUG": "1"}
    with open(tmp_path / "stderr.txt", "w") as stderr:
        batch = subprocess.Popen(
            [sys.executable, "-m", "localspec", "batch", model, items, "--draft", "ngram", "--spec", "fixed",
             "--temp", "0.8", "--seed", "1", "--max-tokens", "24"],
            stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL, text=True, env=env,
        )
        process = psutil.Process(batch.pid)
        rss, rolled_back = [], 0
        for line in batch.stdout:
            record = json.loads(line)
            assert "error" not in record, record
            rss.append(process.memory_info().rss)
            rolled_back += record["stats"]["drafted"] - record["stats"]["accepted"]
        assert batch.wait(timeout=60) == 0, (tmp_path / "stderr.txt").read_text()[-2000:]
    assert len(rss) == ITEMS
    assert rolled_back > ITEMS  # the checks saw many rejected drafts rolled back
    growth = max(rss[WARM_UP:]) - rss[WARM_UP - 1]
    print(f"RSS after {WARM_UP} items {rss[WARM_UP - 1] / 2**20:.1f} MiB, growth to item {ITEMS}: {growth / 2**20:.2f} MiB")
    assert growth < RSS_GROWTH_BOUND
