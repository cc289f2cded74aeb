"""Golden files (`tests/golden/`): a text a test produces must equal its file byte for byte.

`UPDATE_GOLDEN=1 python -m pytest ...` rewrites the files from what the tests produce (then review the diff).
"""

from __future__ import annotations

import os

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")


def check_golden(name: str, text: str) -> None:
    """Assert `text` equals `tests/golden/<name>` (with UPDATE_GOLDEN set: write it there first)."""
    path = os.path.join(GOLDEN, name)
    if os.environ.get("UPDATE_GOLDEN"):
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    with open(path, encoding="utf-8") as f:
        assert text == f.read(), f"{name} differs from the golden file (UPDATE_GOLDEN=1 rewrites it)"
