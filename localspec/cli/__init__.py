"""Command line: flags become settings, events become output, errors become messages and exit codes.

The commands are registered on `app` by the modules that define them; only parsing and rendering
happen here, reports are built in their wings."""

from . import generate, models  # noqa: F401  (registering their commands)
from .app import app, main

__all__ = ["app", "main"]
