"""Files written whole or not at all: a temporary name in the same folder, flushed and fsynced, then
`os.replace`d over the target. A kill or a full disk mid-write leaves the previous file (or none), never a
cut one. Used for every file a user or a resume relies on (config.json, summary.json, sweep.json, the sweep
and demo tables, bank exports, checkpoint checksums). A leaf module: it imports nothing of the project."""

from __future__ import annotations

import json
import os


def _replace_via_tmp(path: str, write, mode: str = "w", **open_kw) -> None:
    tmp = path + ".tmp"
    try:
        with open(tmp, mode, **open_kw) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_text_atomic(path: str, text: str, *, newline: str | None = None) -> None:
    """Write `text` to `path` through a temporary file and `os.replace`."""
    _replace_via_tmp(path, lambda f: f.write(text), encoding="utf-8", newline=newline)


def write_json_atomic(path: str, obj, **dump_kw) -> None:
    """Write `obj` as JSON (indent 2 unless given) to `path` through a temporary file and `os.replace`."""
    dump_kw.setdefault("indent", 2)
    _replace_via_tmp(path, lambda f: json.dump(obj, f, **dump_kw))
