"""The GGUF header reader on tiny and real files, and on broken ones."""

import struct

import pytest

from localspec.store import compat, gguf_meta
from localspec.store.gguf_meta import GGUFError


def test_reads_what_the_tiny_model_was_written_with(tiny):
    info = gguf_meta.read(tiny["target"])
    assert info.architecture == "llama" and info.quantization == "F32"
    assert info.vocab_type == "llama" and info.vocab_size == 288
    assert (info.bos_id, info.eos_id, info.add_bos) == (1, 2, True)
    assert info.context_length == 512 and info.parameters > 0
    assert info.tokens()[260] == b"a"


def test_token_digest_tells_tokenizers_apart(tiny):
    same = gguf_meta.read(tiny["target"]).token_digest == gguf_meta.read(tiny["unrelated"]).token_digest
    other = gguf_meta.read(tiny["target"]).token_digest == gguf_meta.read(tiny["other_tokenizer"]).token_digest
    assert same and not other


@pytest.mark.parametrize("cut", [3, 10, 30, 200, 2000, -1000])
def test_truncated_files_are_refused_with_our_error(tiny, tmp_path, cut):
    data = tiny["target"].read_bytes()
    broken = tmp_path / "cut.gguf"
    broken.write_bytes(data[:cut])
    with pytest.raises(GGUFError, match="cut.gguf"):
        gguf_meta.read(broken)


def test_a_vocabulary_cut_short_or_with_a_string_past_the_end_is_refused_naming_the_problem(tiny, tmp_path):
    data = tiny["target"].read_bytes()
    key = b"tokenizer.ggml.tokens"
    strings = data.index(key) + len(key) + 4 + 4 + 8  # (its value type, the items' type, the count)
    broken = tmp_path / "vocabulary.gguf"
    count = struct.unpack_from("<Q", data, strings - 8)[0]
    broken.write_bytes(data[:strings + 8 * count + 2])  # (room for every length, not for every string)
    with pytest.raises(GGUFError, match="vocabulary.gguf: file is truncated"):
        gguf_meta.read(broken)
    broken.write_bytes(data[:strings] + struct.pack("<Q", 1 << 40) + data[strings + 8:])
    with pytest.raises(GGUFError, match=f"a string of {1 << 40} bytes runs past the end"):
        gguf_meta.read(broken)


def test_non_gguf_and_directories_are_refused(tmp_path):
    (tmp_path / "text.gguf").write_text("hello, this is not a model at all" * 3)
    with pytest.raises(GGUFError, match="not a GGUF"):
        gguf_meta.read(tmp_path / "text.gguf")
    with pytest.raises(GGUFError, match="directory"):
        gguf_meta.read(tmp_path)
    with pytest.raises(GGUFError, match="cannot read"):
        gguf_meta.read(tmp_path / "missing.gguf")


def test_absurd_counts_are_refused(tiny, tmp_path):
    data = bytearray(tiny["target"].read_bytes())
    data[16:24] = (2**40).to_bytes(8, "little")  # metadata entry count
    (tmp_path / "absurd.gguf").write_bytes(bytes(data))
    with pytest.raises(GGUFError, match="claims"):
        gguf_meta.read(tmp_path / "absurd.gguf")


def test_compatibility_of_tiny_models(tiny):
    target = gguf_meta.read(tiny["target"])
    assert compat.check(target, gguf_meta.read(tiny["partial"])).compatible
    # another vocabulary: a draft model drafts through text; what differs is said
    report = compat.check(target, gguf_meta.read(tiny["other_tokenizer"]))
    assert report.compatible and report.across and not report.failed
    differs = [r for r in report.rules if not r.passed]
    assert [r.name for r in differs] == ["token texts"]
    assert "first difference at token 260: target 'a', draft 'A'" in differs[0].detail
    # a drafter that reads the target's cache needs its vocabulary, and the target's architecture
    assert not compat.check(target, gguf_meta.read(tiny["gemma4_assistant"])).compatible


@pytest.mark.slow
def test_a_262k_token_vocabulary_is_read_without_decoding_it(real_model):
    """Its 262,144 token texts and scores stay bytes on the map (hashed for the pair check) until asked for: the gguf
    package's reader, which decodes every array, took 11.7 s on this file (2-core CPU, 12-04); this reader ~50 ms.
    (Not timed here: a wall-clock bound fails on a busy machine.)"""
    info = gguf_meta.read(real_model("gemma3-270m"))
    assert info.vocab_size == 262144 and info.architecture == "gemma3"
    assert all(isinstance(info.metadata[key], gguf_meta.RawArray)
               for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"))


@pytest.mark.slow
def test_real_pairs(real_model):
    qwen = compat.check(gguf_meta.read(real_model("qwen2.5-coder-1.5b")), gguf_meta.read(real_model("qwen2.5-coder-0.5b")))
    assert qwen.compatible and qwen.same_vocabulary and not qwen.across
    mixed = compat.check(gguf_meta.read(real_model("smollm2-135m")), gguf_meta.read(real_model("gemma3-270m")))
    differs = {r.name for r in mixed.rules if not r.passed}
    assert {"vocabulary type", "vocabulary size", "token texts", "pre-tokenizer"} <= differs
    assert mixed.compatible and mixed.across  # it drafts through text
