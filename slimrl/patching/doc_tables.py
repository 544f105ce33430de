"""The documentation's tables, generated from the trainer table (a test fails for each copy in docs/ that is
stale): docs/compatibility.md's trainers (:func:`readme_table`) and the installed TRL's others
(:func:`every_trainer_table`), docs/train.md's config fields with the trainers each acts on (:func:`field_table`)."""

from __future__ import annotations

from slimrl.compat.trl_info import TESTED_TRL
from slimrl.patching.every_trainer import config_fields
from slimrl.patching.table import ALIASES, EXTRA, TRAINERS, every_trainer, field_users


def readme_table() -> str:
    """docs/compatibility.md's trainer table (Markdown), from :data:`TRAINERS`."""
    rows = [
        "| trainer | TRL | what slimrl does | parity test (loss + gradients vs TRL alone, ≤ 1e-4) |",
        "|---|---|---|---|",
    ]
    first, last = (".".join(TESTED_TRL[i].split(".")[:2]) for i in (0, -1))
    for spec in TRAINERS.values():
        releases = (
            f"{first} – {spec.last_release.rsplit('.', 1)[0]} (removed after)"
            if spec.last_release
            else f"{first} – {last}"
        )
        rows.append(f"| {spec.trainer_class_name} | {releases} | {spec.about.note} | {spec.about.parity_test} |")
    return "\n".join(rows)


def every_trainer_table() -> str:
    """docs/compatibility.md's table of the installed TRL's trainers beyond :data:`TRAINERS` (Markdown): what slimrl
    gives each (:mod:`slimrl.patching.derived`) and the TRL classes patched under a table trainer's name."""
    every_trainer()
    rows = ["| trainer (`PatchFastRL` name) | defined in | what slimrl gives | parity test |", "|---|---|---|---|"]
    for spec in EXTRA.values():
        rows.append(
            f"| {spec.trainer_class_name} (`{spec.name}`) | `{spec.trainer_module}` | **{spec.about.layer}**: "
            f"{spec.about.note} | {spec.about.parity_test} |"
        )
    every = every_trainer()
    for name, targets in ALIASES.items():
        for target in targets:
            module, _, cls = target.partition(":")
            rows.append(
                f"| {cls} (`{name}`) | `{module}` | **alias**: TRL's subclass of "
                f"{every[name].trainer_class_name} under its name, patched with it: the same layer | as "
                f"{name} |"
            )
    return "\n".join(rows)


def field_table() -> str:
    """docs/train.md's table of slimrl's config fields
    (:func:`slimrl.patching.every_trainer.config_fields.field_table`), each naming the trainers whose rows list it."""
    return config_fields.field_table(field_users)
