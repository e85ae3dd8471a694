"""Self-speculation with the target's own multi-token-prediction (MTP) block, on a tiny Qwen3.5-style GGUF
(a hybrid trunk and one MTP block), as sessions and the CLI meet it; its lossless tests are in
test_drafters_beside."""

import json

import pytest

from localspec.store import gguf_meta
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine.model import Model
from localspec.engine.drafters import NoDrafter
from localspec.engine.speculative import generate
from localspec.errors import UsageError
from localspec.events import Token
from localspec.request import Request
from localspec.session import Session
from localspec.stats import record


GREEDY = Sampling(temperature=0)
SPECULATION = Speculation(draft_max=3, p_min=0.0)


def tokens_of(events) -> list[int]:
    return [e.id for e in events if isinstance(e, Token)]


def test_the_header_and_llama_cpp_agree_on_the_mtp_layer(tiny):
    assert Model(tiny["mtp"], load_mtp=True).mtp_layers == 1 and gguf_meta.read(tiny["mtp"]).mtp_layers == 1
    assert gguf_meta.read(tiny["target"]).mtp_layers == 0 and gguf_meta.read(tiny["mtp_trunk"]).mtp_layers == 0
    sidecar = gguf_meta.read(tiny["mtp_sidecar"])
    assert sidecar.mtp_sidecar and not gguf_meta.read(tiny["mtp"]).mtp_sidecar
    assert Model(tiny["mtp_sidecar"], load_mtp=True).mtp_layers == 1


def test_a_session_drafts_with_mtp_only_where_the_target_has_it(tiny):
    runtime = Runtime(ctx_size=512, threads=2)
    with Session(tiny["mtp"], None, runtime, Speculation(DrafterKind.MTP, p_min=0.0)) as session:
        assert session.mode == DrafterKind.MTP and "MTP" in session.describe()
        outcome = record(session.generate(Request(GREEDY, Limits(max_tokens=30), prompt=session.prompts.tokenize("the cat", raw=False))))
        assert outcome.summary().drafters[DrafterKind.MTP].accepted > 0
    with pytest.raises(UsageError, match="no multi-token-prediction"):
        Session(tiny["target"], None, runtime, Speculation(DrafterKind.MTP))
    with pytest.raises(UsageError, match="give its MTP sidecar file"):
        Session(tiny["mtp_trunk"], None, runtime, Speculation(DrafterKind.MTP))


def test_draft_mtp_from_the_command_line(localspec, cli, tiny):
    done = localspec("run", tiny["mtp"], "--draft", "mtp", "--p-min", "0", "--temp", "0", "-p", "the cat sat",
                     "-n", "40", "--json")
    assert done.returncode == 0, done.stderr.decode()
    result = json.loads(done.stdout)
    assert result["stats"]["tokens"] == 40 and result["stats"]["drafters"]["mtp"]["accepted"] > 0
    assert result["placement"]["drafting"] == "mtp"
    code, out, _ = cli("check", tiny["mtp"], "mtp", "--json")
    assert code == 0 and json.loads(out)["mtp_layers"] == 1
    code, _, err = cli("check", tiny["target"], "mtp")
    assert code == 1 and "no multi-token-prediction layers" in err


def test_auto_may_draft_with_the_targets_mtp_layers_beside_a_draft_model(tiny):
    runtime = Runtime(ctx_size=512, threads=2)
    with Session(tiny["mtp"], None, runtime, Speculation(p_min=0.0)) as session:
        assert session.mode == DrafterKind.AUTO and "MTP" in session.describe()
        assert session.drafting.auto().costly == {DrafterKind.MTP: session.drafting.costly[DrafterKind.MTP]}
        record(session.generate(Request(GREEDY, Limits(max_tokens=20), prompt=session.prompts.tokenize("the cat", raw=False))))
    # a llama draft model shares the tiny models' tokenizer: both costly drafters are weighed
    with Session(tiny["mtp"], tiny["partial"], runtime, Speculation(p_min=0.0)) as session:
        assert set(session.drafting.auto().costly) == {DrafterKind.DRAFT, DrafterKind.MTP}
        assert session.describe().endswith("(auto: n-gram lookup, partial.gguf or its own MTP layers)")
        tokens = session.prompts.tokenize("the cat", raw=False)
        plain = tokens_of(generate(session.target, NoDrafter(), tokens, GREEDY, SPECULATION, Limits(max_tokens=30)))
        session.reset()
        assert tokens_of(session.generate(Request(GREEDY, Limits(max_tokens=30), prompt=tokens))) == plain
