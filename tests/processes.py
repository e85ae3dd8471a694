"""Helpers for tests that run localspec as long-lived processes (servers, workers)."""

import os
import signal
import subprocess
import sys
from pathlib import Path


def localspec_process(home: Path, *args, env: dict | None = None, **popen) -> subprocess.Popen:
    """`localspec ARGS` started in the background with LOCALSPEC_HOME=home and no debug mode, in env
    (default: this process's environment without llama.cpp's LLAMA_ARG_* settings)."""
    if env is None:  # (llama.cpp's settings, which localspec reads too, only where a test gives them)
        env = {name: value for name, value in os.environ.items()
               if not name.startswith("LLAMA_ARG_") and name != "LLAMA_API_KEY"}
    env = {**env, "LOCALSPEC_HOME": str(home)}
    for name in ("LOCALSPEC_DEBUG", "LOCALSPEC_API_KEY"):
        env.pop(name, None)
    return subprocess.Popen([sys.executable, "-m", "localspec", *map(str, args)], env=env, **popen)


def runner(home: Path, **env: str):
    """A function that runs `localspec ARGS` to its end (with more environment where given) and returns its
    CompletedProcess: LOCALSPEC_HOME=home, env over this process's environment (as localspec_process takes it), no
    stdin."""
    base = {name: value for name, value in os.environ.items() if not name.startswith("LLAMA_ARG_")}
    base.update(LOCALSPEC_HOME=str(home), **env)
    base.pop("LOCALSPEC_DEBUG", None)

    def invoke(*args, **extra_env):
        return subprocess.run([sys.executable, "-m", "localspec", *map(str, args)], capture_output=True, text=True,
                              env={**base, **extra_env}, stdin=subprocess.DEVNULL, timeout=300)
    return invoke


def stop(process: subprocess.Popen, sig=signal.SIGINT) -> int:
    """Send sig and return the exit code; a process still there after 30 s is killed."""
    if process.poll() is None:
        process.send_signal(sig)
    try:
        return process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
