"""Gemma 4's assistant drafter as the compat check meets it; its lossless tests and its use as a draft file
are in test_drafters_beside."""

import json

from localspec.store import compat, gguf_meta


def test_check_says_the_assistant_reads_a_gemma4_targets_cache_and_refuses_another(tiny, cli):
    code, out, _ = cli("check", tiny["gemma4"], tiny["gemma4_assistant"], "--json")
    assert code == 0 and {rule["name"] for rule in json.loads(out)["rules"]} >= {"target's cache"}
    report = compat.check(gguf_meta.read(tiny["target"]), gguf_meta.read(tiny["gemma4_assistant"]))
    assert "reads a gemma4 target's KV cache, not a 'llama' one's" in report.summary()
