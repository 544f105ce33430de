"""``slimrl train --config run.yaml``: the file read as a mapping and every key checked against the options (one
line naming the file and the key)."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from slimrl.cli.errors import UsageError


def read_yaml(path: str) -> dict[str, Any]:
    """The ``--config`` file as a mapping; UsageError naming the file for a missing, unreadable or non-mapping one."""
    import yaml

    p = Path(path).expanduser()
    if not p.is_file():
        raise UsageError(f"--config {path}: file not found; pass an existing YAML file")
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"--config {path}: cannot read it ({err})") from None
    except yaml.YAMLError as err:
        raise UsageError(f"--config {path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: must be a YAML mapping of option: value, got {type(data).__name__}")
    return data


def _option_map(parser) -> dict[str, Any]:
    return {a.dest: a for a in parser._actions if a.option_strings}


def check_yaml_values(parser, data: dict[str, Any], path: str) -> None:
    """Every key of the YAML is an option and its value has the option's type (one line naming file and key)."""
    options = _option_map(parser)
    for key, value in data.items():
        action = options.get(key)
        if action is None:
            close = difflib.get_close_matches(key, list(options), n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise UsageError(f"--config {path}: unknown key {key!r}: {hint}remove it or see `slimrl train --help` "
                             f"for the keys")
        convert = action.type
        if value is None or convert is None or not callable(convert):
            continue
        values = value if isinstance(value, list) and action.nargs in ("+", "*") else [value]
        for v in values:
            try:
                converted = convert(v) if isinstance(v, str) else v
                if convert in (int, float) and (isinstance(v, bool) or not isinstance(converted, int | float)):
                    raise ValueError
                if convert is int and isinstance(converted, float) and not converted.is_integer():
                    raise ValueError
            except (ValueError, TypeError):
                kind = getattr(convert, "__name__", "value")
                raise UsageError(f"--config {path}: key {key}: {v!r} is not a valid {kind}") from None
            if action.choices and converted not in action.choices:
                raise UsageError(f"--config {path}: key {key}: {v!r} is not one of "
                                 f"{', '.join(map(str, action.choices))}")
