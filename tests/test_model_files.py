"""Damaged, hostile and unusable model files: one-line errors, exit code 2, never a crash in llama.cpp."""

import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localspec.store import gguf_meta
from localspec.store.gguf_meta import GGUFError

from tinymodels import TinySpec, write_tiny_model


def tensor_field(data: bytes, name: bytes, field: str) -> int:
    """Byte position of a tensor's first dimension or its data offset in the tensor table."""
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    (n_dims,) = struct.unpack_from("<I", data, at)
    return at + 4 if field == "dim" else at + 4 + 8 * n_dims + 4


def mutate(data: bytes, position: int, value: bytes) -> bytes:
    return data[:position] + value + data[position + len(value):]


@pytest.fixture(scope="module")
def bad_files(tiny, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad-models")
    data = tiny["target"].read_bytes()
    files = {
        "not a GGUF": b"PK\x03\x04 this is a zip archive, not a model" * 10,
        "truncated header": data[:300],
        "truncated tensors": data[: len(data) // 2],
        "absurd metadata count": mutate(data, 16, struct.pack("<Q", 2**40)),
        "absurd tensor count": mutate(data, 8, struct.pack("<Q", 2**50)),
        "absurd dimension": mutate(data, tensor_field(data, b"token_embd.weight", "dim"), struct.pack("<Q", 2**62)),
        "offset past the end": mutate(data, tensor_field(data, b"output.weight", "offset"), struct.pack("<Q", 2**40)),
        "unknown tensor type": mutate(data, tensor_field(data, b"output.weight", "offset") - 4, struct.pack("<I", 999)),
    }
    paths = {}
    for problem, content in files.items():
        paths[problem] = folder / (problem.replace(" ", "-") + ".gguf")
        paths[problem].write_bytes(content)
    paths["unknown architecture"] = write_tiny_model(folder / "unknown-arch.gguf", TinySpec(seed=1, architecture="nosucharch"))
    paths["a directory"] = folder / "model-dir.gguf"
    paths["a directory"].mkdir()
    return paths


EXPECTED = {
    "not a GGUF": "not a GGUF model file",
    "truncated header": "truncated",
    "truncated tensors": "extends past the end of the file",
    "absurd metadata count": "claims 1099511627776 metadata entries",
    "absurd tensor count": "claims 1125899906842624 tensors",
    "absurd dimension": "tensor token_embd.weight extends past the end",
    "offset past the end": "tensor output.weight extends past the end",
    "unknown tensor type": "tensor output.weight has unknown type 999",
    "unknown architecture": "unknown model architecture: 'nosucharch'",
    "a directory": "is a directory",
}


@pytest.mark.parametrize("problem", EXPECTED)
@pytest.mark.parametrize("role", ["target", "draft"])
def test_bad_model_files_get_one_line_errors_naming_file_and_problem(cli, tiny, bad_files, problem, role):
    bad = bad_files[problem]
    args = [bad, "--no-draft"] if role == "target" else [tiny["target"], "--draft", bad]
    code, _, stderr = cli("run", *args, "-p", "hello")
    assert code == 2, stderr
    assert "Traceback" not in stderr and stderr.count("\n") == 1, stderr
    assert stderr.startswith("error: ") and str(bad) in stderr and EXPECTED[problem] in stderr, stderr


def test_escapes_in_a_model_file_reach_the_terminal_only_as_text(cli, tmp_path):
    """An architecture name that writes to the clipboard (OSC 52) if a terminal reads it as a command."""
    evil = write_tiny_model(tmp_path / "evil.gguf", TinySpec(seed=1, architecture="\x1b]52;c;aGk=\x07x"))
    code, _, stderr = cli("run", evil, "--no-draft", "-p", "hello")
    assert code == 2 and "\x1b" not in stderr and "\\x1b]52;c;aGk=\\x07x" in stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_an_unreadable_model_file_is_named(cli, tiny, tmp_path):
    locked = tmp_path / "locked.gguf"
    locked.write_bytes(tiny["target"].read_bytes())
    locked.chmod(0)
    code, _, stderr = cli("run", locked, "-p", "hello")
    assert code == 2 and "cannot read model file" in stderr and str(locked) in stderr


def test_arrays_nested_to_exhaust_the_stack_are_refused(tmp_path):
    nested = b"".join(struct.pack("<IQ", 9, 1) for _ in range(5000))  # array of array of ... (type 9 = ARRAY)
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 3) + b"key" + struct.pack("<I", 9) + nested
    (tmp_path / "deep.gguf").write_bytes(header + b"\0" * 64)
    with pytest.raises(GGUFError, match="nested more than"):
        gguf_meta.read(tmp_path / "deep.gguf")


# The fuzzer rewrites bytes of a real header (written by the gguf package) and must only ever see
# GGUFError or a successful read. The mutated files keep the original length as sparse files, so
# thousands of them cost little disk.
SPECIAL_INTEGERS = [0, 1, 7, 255, 2**31 - 1, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**64 - 1]


@st.composite
def mutations(draw, header_size: int):
    edits = []
    for _ in range(draw(st.integers(1, 6))):
        position = draw(st.integers(0, header_size - 1))
        if draw(st.booleans()):
            value = draw(st.binary(min_size=1, max_size=4))
        else:
            width = draw(st.sampled_from(["<I", "<Q"]))
            number = draw(st.sampled_from(SPECIAL_INTEGERS)) % (1 << (8 * struct.calcsize(width)))
            value = struct.pack(width, number)
        edits.append((position, value))
    cut = draw(st.one_of(st.none(), st.integers(0, header_size)))
    return edits, cut


@pytest.fixture(scope="module")
def real_header(tiny):
    data = tiny["target"].read_bytes()
    header_size = data.index(b"output.weight") + 64  # the tensor table ends just after its last name
    return data, header_size


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_headers_only_ever_raise_our_error(real_header, tmp_path, data):
    original, header_size = real_header
    edits, cut = data.draw(mutations(header_size))
    content = original[:header_size]
    for position, value in edits:
        content = mutate(content, position, value)[:header_size]
    path = tmp_path / "fuzzed.gguf"
    with open(path, "wb") as f:
        f.write(content[:cut] if cut is not None else content)
        if cut is None:
            f.truncate(len(original))
    try:
        gguf_meta.read(path)
    except GGUFError as error:
        assert str(path) in str(error)
