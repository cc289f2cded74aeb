"""The resolved config as YAML with each field's comment from `crl_jax/config.py` above it (`crl-jax config
show`): the comments are the config's documentation, so they are read from the source, not copied."""

from __future__ import annotations

import dataclasses
import inspect
import re

import yaml

_FIELD = re.compile(r"^    (\w+): [^#]*?(?:\s+#\s?(.*))?$")
_MORE = re.compile(r"^    \s*#\s?(.*)$")


def field_comments(cls) -> dict[str, list[str]]:
    """{field: comment lines} of a config dataclass, from its source: the comment after the field and the
    comment lines that continue it (indented `#` lines right below)."""
    out: dict[str, list[str]] = {}
    last = None
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return out
    names = {f.name for f in dataclasses.fields(cls)}
    for line in lines:
        m = _FIELD.match(line)
        if m and m.group(1) in names:
            last = m.group(1)
            out[last] = [m.group(2).strip()] if m.group(2) else []
            continue
        m = _MORE.match(line)
        if m and last is not None:
            out[last].append(m.group(1).strip())
        else:
            last = None
    return out


def _value(key: str, v) -> str:
    if isinstance(v, (dict, list, tuple)):  # env.params: one flow-style line
        flow = yaml.safe_dump(v, sort_keys=False, default_flow_style=True, width=10**9).rstrip("\n")
        return f"{key}: {flow}"
    return yaml.safe_dump({key: v}, sort_keys=False, default_flow_style=False, width=10**9).rstrip("\n")


def commented_yaml(cfg, indent: str = "") -> str:
    """`cfg` (a config dataclass) as YAML, every field preceded by its `field_comments` lines; parses back
    to `dataclasses.asdict(cfg)`."""
    comments = field_comments(type(cfg))
    lines = []
    for f in dataclasses.fields(cfg):
        for c in comments.get(f.name, []):
            lines.append(f"{indent}# {c}" if c else f"{indent}#")
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v):
            lines.append(f"{indent}{f.name}:")
            lines.append(commented_yaml(v, indent + "  ").rstrip("\n"))
        else:
            lines.append(indent + _value(f.name, v).replace("\n", "\n" + indent))
    return "\n".join(lines) + "\n"
