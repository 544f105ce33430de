"""``slimrl train --config run.yaml``: the file read as a mapping and every key checked against the options (one
line naming the file and the key)."""

from __future__ import annotations

import datetime
import difflib
from pathlib import Path
from typing import Any

from slimrl.errors import InputError


def read_yaml(path: str) -> dict[str, Any]:
    """The ``--config`` file as a mapping; InputError naming the file for a missing, unreadable or non-mapping one."""
    import yaml

    p = Path(path).expanduser()
    if not p.is_file():  # a FIFO or a device would block the read: a regular file only
        raise InputError(f"--config {path}: file not found; pass an existing YAML file")
    if p.stat().st_size > MAX_CONFIG_BYTES:
        raise InputError(
            f"--config {path}: {p.stat().st_size} bytes; an options file is a few kB (at most "
            f"{MAX_CONFIG_BYTES // 2**20} MB)"
        )
    try:
        text = p.read_text()
        if "*" in text and _expanded_size(yaml.compose(text, Loader=yaml.SafeLoader)) > MAX_VALUES:
            raise InputError(
                f"--config {path}: its aliases expand to more than {MAX_VALUES} values; an options "
                f"file holds a few dozen (write them out)"
            )
        data = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"--config {path}: cannot read it ({err})") from None
    except yaml.YAMLError as err:
        raise InputError(f"--config {path}: not valid YAML ({str(err).splitlines()[0][:200]})") from None
    except RecursionError:
        raise InputError(f"--config {path}: nested too deeply to be an options file") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"--config {path}: must be a YAML mapping of option: value, got {type(data).__name__}")
    return data


MAX_CONFIG_BYTES = 2**20
MAX_VALUES = 100_000  # an alias bomb (a 434-byte file expanding to 21 MB) expands past it; an options file never


def _expanded_size(node, memo: dict | None = None) -> int:
    """How many values the composed YAML ``node`` stands for once its aliases are expanded (shared nodes counted
    once each time they are used; linear in the nodes, without building the expansion)."""
    memo = {} if memo is None else memo
    if id(node) in memo:
        return memo[id(node)]
    children = node.value if isinstance(node.value, list) else []
    items = [x for pair in children for x in (pair if isinstance(pair, tuple) else (pair,))]
    memo[id(node)] = 1 + sum(_expanded_size(x, memo) for x in items)
    return memo[id(node)]


def shown(value: Any, limit: int = 60) -> str:
    """A value as an error line shows it: at most ``limit`` characters of its repr."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({type(value).__name__})"


def _option_map(parser) -> dict[str, Any]:
    return {a.dest: a for a in parser._actions if a.option_strings}


def check_yaml_values(parser, data: dict[str, Any], path: str) -> None:
    """Every key of the YAML is an option and its value has the option's type (one line naming file and key)."""
    import argparse

    options = _option_map(parser)
    for key, value in data.items():
        if not isinstance(key, str):
            raise InputError(
                f"--config {path}: key {shown(key)} is not an option name (keys are names such as learning_rate)"
            )
        action = options.get(key)
        if action is None:
            close = difflib.get_close_matches(key, list(options), n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise InputError(
                f"--config {path}: unknown key {key!r}: {hint}remove it or see `slimrl train --help` for the keys"
            )
        convert = action.type
        if (
            isinstance(value, dict | list)
            and not (isinstance(value, list) and action.nargs in ("+", "*"))
            and convert in (str, None)
        ):
            if not _takes_mappings(action):
                raise InputError(
                    f"--config {path}: key {key}: {shown(value)} is a {type(value).__name__}; this "
                    f"option takes one value"
                )
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, datetime.date):  # YAML reads an unquoted 2026-12-02 as a date
                raise InputError(
                    f"--config {path}: key {key}: YAML read {v} as a date; this option takes a string (quote it: '{v}')"
                )
            if isinstance(v, str) and "\0" in v:
                raise InputError(
                    f"--config {path}: key {key}: {shown(v)} holds a NUL character, which no path or "
                    f"name can; remove it"
                )
        if value is None or convert is None or not callable(convert):
            continue
        values = value if isinstance(value, list) and action.nargs in ("+", "*") else [value]
        for v in values:
            if getattr(convert, "__name__", "") == "str" and isinstance(v, bool | int | float):
                kind = "a boolean" if isinstance(v, bool) else "a number"
                raise InputError(
                    f"--config {path}: key {key}: YAML read {shown(v)} as {kind}; this option takes "
                    f"a string (quote it: '{v}')"
                )
            try:
                converted = convert(v) if isinstance(v, str) else v
                if convert in (int, float) and (isinstance(v, bool) or not isinstance(converted, int | float)):
                    raise ValueError
                if convert is int and isinstance(converted, float) and not converted.is_integer():
                    raise ValueError
            except (ValueError, TypeError, argparse.ArgumentTypeError):
                kind = getattr(convert, "__name__", "value")
                raise InputError(f"--config {path}: key {key}: {shown(v)} is not a valid {kind}") from None
            if isinstance(v, dict | list) and convert is not None and getattr(convert, "__name__", "") == "str":
                raise InputError(f"--config {path}: key {key}: {shown(v)} is a {type(v).__name__}; pass a string")
            if action.choices and converted not in action.choices:
                raise InputError(
                    f"--config {path}: key {key}: {shown(v)} is not one of {', '.join(map(str, action.choices))}"
                )


def _takes_mappings(action) -> bool:
    """Options whose value may be a mapping or list in YAML (TRL's ``dict | str`` fields: ``generation_kwargs``,
    ``model_init_kwargs``, ``lr_scheduler_kwargs``, ...)."""
    return action.dest.endswith(("kwargs", "_config", "_args")) or action.dest in ("reward", "report_to")
