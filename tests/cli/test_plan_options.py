"""``slimrl plan``'s options are generated from the planner's :class:`Settings` (one declaration per option: its
default, type and help live with the field)."""

from __future__ import annotations

from dataclasses import fields

import pytest

from slimrl.cli.plan import parser
from slimrl.planning.settings import Settings


def test_every_declared_setting_is_an_option_with_its_default():
    declared = {f.name: f.default for f in fields(Settings) if "option" in f.metadata}
    assert len(declared) == 14
    args = parser().parse_args([])
    assert {name: getattr(args, name) for name in declared} == declared


@pytest.mark.parametrize(
    ("argv", "name", "value"),
    [
        (["--lora_r", "0"], "lora_r", 0),
        (["--beta", "0.04"], "beta", 0.04),
        (["--load_in_4bit", "TRUE"], "load_in_4bit", True),
        (["--tiled_mlp", "auto"], "tiled_mlp", None),
        (["--tiled_mlp", "false"], "tiled_mlp", False),
        (["--fused_lora", "false"], "fused_lora", False),
        (["--device", "cuda"], "device", "cuda"),
    ],
)
def test_each_option_parses_as_its_field_is_typed(argv, name, value):
    assert getattr(parser().parse_args(argv), name) == value
