"""Model files' headers kept between runs (store/headers.py): the same header as the reader's, read again only when
the file or the reader changes, and never in the way of a read."""

import dataclasses
import json
import os
import shutil

import pytest

from localspec import paths
from localspec.store import gguf_meta, headers
from localspec.store.gguf_meta import GGUFError


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _same(kept: gguf_meta.GGUFInfo, read: gguf_meta.GGUFInfo) -> None:
    assert dataclasses.asdict(kept) == dataclasses.asdict(read)
    assert list(kept.metadata) == list(read.metadata)  # (in the file's order: `show`'s metadata lists it so)
    assert [type(value) for value in kept.metadata.values()] == [type(value) for value in read.metadata.values()]


@pytest.mark.parametrize("name", ["target", "mtp", "eagle3", "mtp_sidecar"])
def test_a_kept_header_is_the_header_the_reader_reads(tiny, home, name):
    first, kept = headers.read(tiny[name]), headers.read(tiny[name])
    assert len(list(paths.headers_dir().glob("*.json"))) == 1
    for header in (first, kept):
        _same(header, gguf_meta.read(tiny[name]))
    assert kept.tokens() == gguf_meta.read(tiny[name]).tokens()  # (read from the file by the offsets kept)
    assert kept.fills_in_the_middle == gguf_meta.read(tiny[name]).fills_in_the_middle


def test_a_header_is_read_again_only_when_its_file_or_the_reader_changes(tiny, home, tmp_path):
    model = shutil.copy(tiny["target"], tmp_path / "model.gguf")
    assert headers.read(model).vocab_type == "llama"
    stamp = os.stat(model)
    data = bytearray(model.read_bytes())
    key = data.index(b"tokenizer.ggml.model")
    data[key:key + 20] = b"tokenizer.ggml.XXXXX"  # (the same size; the key the file has is another)
    # Changed in place, its size and time kept: the header kept is trusted without reading the file (the one
    # change it misses, as make's and rsync's checks miss it).
    model.write_bytes(data)
    os.utime(model, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert headers.read(model).vocab_type == "llama"
    os.utime(model, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1))
    assert headers.read(model).vocab_type is None
    # another file put in its place with the size and time of the one kept (`cp -p`, a download renamed into place)
    other = shutil.copy(tiny["target"], tmp_path / "other.gguf")
    os.utime(other, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1))
    os.replace(other, model)
    assert headers.read(model).vocab_type == "llama"
    # another model downloaded over it
    shutil.copy(tiny["other_tokenizer"], model)
    assert headers.read(model).token_digest == gguf_meta.read(tiny["other_tokenizer"]).token_digest
    # another reader (kept by an older localspec)
    [entry] = paths.headers_dir().glob("*.json")
    kept = json.loads(entry.read_text())
    kept["info"]["parameters"] = 1
    entry.write_text(json.dumps(kept))
    assert headers.read(model).parameters == 1
    kept["stamp"][0] = "an older reader"
    entry.write_text(json.dumps(kept))
    assert headers.read(model).parameters == gguf_meta.read(model).parameters


def test_a_broken_file_is_refused_as_the_reader_refuses_it_and_nothing_is_kept(tiny, home, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny["target"].read_bytes()[:-1000])
    for _ in range(2):
        with pytest.raises(GGUFError, match="cut.gguf: tensor .* extends past the end"):
            headers.read(cut)
    with pytest.raises(GGUFError, match="cannot read model file .*missing.gguf"):
        headers.read(tmp_path / "missing.gguf")
    with pytest.raises(GGUFError, match="is a directory"):
        headers.read(tmp_path)
    assert not paths.headers_dir().exists()


@pytest.mark.parametrize("spoil", ["not json", '{"stamp": 1}', '{"stamp": [], "info": []}', "[]"])
def test_a_spoiled_entry_is_read_past(tiny, home, spoil):
    headers.read(tiny["target"])
    [entry] = paths.headers_dir().glob("*.json")
    entry.write_text(spoil)
    _same(headers.read(tiny["target"]), gguf_meta.read(tiny["target"]))
    _same(headers.read(tiny["target"]), gguf_meta.read(tiny["target"]))  # (and kept anew)


def test_a_cache_that_cannot_be_written_is_no_error(tiny, home):
    """(A read-only home is one such; root, who runs CI, writes into those.)"""
    home.mkdir()
    (home / "headers").write_text("a file where the folder would be")
    _same(headers.read(tiny["target"]), gguf_meta.read(tiny["target"]))


def test_the_oldest_half_goes_past_the_most_kept(tiny, home, tmp_path, monkeypatch):
    monkeypatch.setattr(headers, "MOST_KEPT", 4)
    for i in range(5):
        headers.read(shutil.copy(tiny["target"], tmp_path / f"model{i}.gguf"))
    kept = list(paths.headers_dir().glob("*.json"))
    assert len(kept) == 2
    assert not list(paths.headers_dir().glob("*.partial"))
