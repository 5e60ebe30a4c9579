"""``python -m flashgen`` and the ``flashgen`` console script: run the bundled Rust binary.

The wheel ships the binary once, as ``flashgen/_bin/flashgen`` (the JIT runs it from there); the
``flashgen`` command on PATH is the console-script entry point ``flashgen.__main__:main``, which
replaces itself with that binary, so the CLI and the loader always agree.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    from ._errors import FlashgenError
    from ._install import binary

    try:
        path = str(binary())
    except FlashgenError as exc:
        sys.stderr.write(f"error: {exc}\n")
        raise SystemExit(2) from None
    # The binary looks at "the Python environment flashgen serves" (the PyPI nvcc, torch for
    # `doctor`) through FLASHGEN_PYTHON, as the loader tells it; here that is this interpreter.
    os.environ.setdefault("FLASHGEN_PYTHON", sys.executable)
    os.execv(path, [path, *sys.argv[1:]])


if __name__ == "__main__":
    main()
