"""The self-check's child process (:mod:`slimrl.patching.every_trainer.preflight`): one ``slimrl verify --tiny`` row
per trainer (its first loss type), printed as one JSON line each."""

from __future__ import annotations

import json


def child(names: list[str]) -> None:
    """The child process (``slimrl verify --self-check-rows NAMES``): the TRL it imported (``trl_file``), then one
    ``slimrl verify --tiny`` row per trainer (its first loss type), one JSON line each."""
    import logging
    import pathlib
    import warnings

    import transformers
    import trl

    print(json.dumps({"trl_file": str(pathlib.Path(trl.__file__).resolve())}), flush=True)

    from slimrl.patching import trainer_and_config
    from slimrl.verify import compare, make_setup
    from slimrl.verify.scenarios import loss_types
    from slimrl.verify.table import format_table

    transformers.logging.set_verbosity_error()
    logging.getLogger("trl").setLevel(logging.ERROR)
    warnings.simplefilter("ignore")
    setup = make_setup()
    for name in names:
        loss_type = loss_types(name, trainer_and_config(name)[1])[0]
        try:
            row = compare(name, loss_type, setup)
            passed = row.passed or bool(row.skipped)  # skipped: TRL alone cannot run here either
            text = format_table([row]).splitlines()
            line = next((t.strip() for t in text if t.strip().startswith(name)), f"{name} {loss_type}")
            summary = line + (f" ({row.problem or row.skipped})" if row.problem or row.skipped else "")
        except Exception as err:  # noqa: BLE001 - a row that cannot run fails the check, named
            passed, summary, row = False, f"{name} {loss_type}: {type(err).__name__}: {err}"[:300], None
        print(
            json.dumps(
                {
                    "trainer": name,
                    "passed": passed,
                    "row": " ".join(summary.split()),
                    "seconds": round(row.seconds, 1) if row else 0.0,
                }
            ),
            flush=True,
        )
