"""EAGLE-3 drafting (a drafter reading the target's hidden states, llama.cpp's draft-eagle3) as the
compat check, a session and the CLI meet it; its lossless tests and its use as a draft file are in
test_drafters_beside."""

import json
from dataclasses import replace

import pytest

from localspec.store import compat, gguf_meta
from localspec.config import DrafterKind, Runtime, Speculation
from localspec.engine.model import Model
from localspec.errors import UsageError
from localspec.store.gguf_meta import RawArray
from localspec.session import Session

from tinybert import write_tiny_bert


def test_the_header_and_llama_cpp_agree_on_the_layers_read(tiny):
    assert gguf_meta.read(tiny["eagle3"]).target_layers == (0, 1, 1) == Model(tiny["eagle3"]).target_layers
    assert gguf_meta.read(tiny["target"]).target_layers == ()
    report = compat.check(gguf_meta.read(tiny["markov_target"]), gguf_meta.read(tiny["eagle3"]))
    assert report.compatible, report.summary()
    # qwen35 hands out its layers' inputs too; a drafter trained on another width, or reading past the
    # target's layers, is refused
    assert compat.check(gguf_meta.read(tiny["mtp_trunk"]), gguf_meta.read(tiny["eagle3"])).compatible
    drafter = gguf_meta.read(tiny["eagle3"])
    wider = replace(drafter, metadata={**drafter.metadata, "eagle3.target_hidden_size": 128})
    target = gguf_meta.read(tiny["markov_target"])
    assert "trained on hidden states 128 wide, the target's are 64" in compat.check(target, wider).summary()
    deeper = replace(drafter, metadata={**drafter.metadata, "eagle3.target_layers": RawArray(5, 3, 0, 0, (0, 1, 2))})
    assert "reads layer 2, the target has 2 layers" in compat.check(target, deeper).summary()


def test_the_eagle3_mode_needs_an_eagle3_drafter(tiny):
    with Session(tiny["markov_target"], None, Runtime(ctx_size=512), Speculation(DrafterKind.PLAIN)) as plain:
        with pytest.raises(UsageError, match="the eagle3 mode needs an EAGLE-3 drafter"):
            plain.use(DrafterKind("eagle3"))


def test_check_names_the_layers_read_and_a_target_that_cannot_hand_them_out_is_refused_before_loading(
        localspec, cli, tiny, tmp_path):
    code, out, _ = cli("check", tiny["markov_target"], tiny["eagle3"], "--json")
    rules = {rule["name"]: rule for rule in json.loads(out)["rules"]}
    assert code == 0 and rules["hidden states"]["detail"] == "the inputs of target layers 0, 1, 1"
    # llama.cpp's bert graph hands out no layer inputs: asking for them would abort the process
    refused = localspec("run", write_tiny_bert(tmp_path / "embed.gguf"), "--draft", tiny["eagle3"], "-p", "hi")
    assert refused.returncode != 0 and "does not hand out the layer inputs EAGLE-3 reads" in refused.stderr.decode()
    assert b"Traceback" not in refused.stderr
