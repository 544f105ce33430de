"""``slimrl doctor``: versions, device, memory and whether every patch fits the installed TRL; exit 1 when
something asked for cannot work (thin: the facts come from :mod:`slimrl.verify.doctor`)."""

from __future__ import annotations

import argparse
import json

from slimrl.cli.oneline import parse


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="slimrl doctor", description="What slimrl sees on this machine.")
    p.add_argument("--json", action="store_true", help="the report as JSON (for tools)")
    p.add_argument("--fast_inference", action="store_true", help="check what fast_inference=True needs")
    p.add_argument("--load_in_4bit", action="store_true", help="check what load_in_4bit=True needs")
    p.add_argument("--device", choices=("cpu", "cuda"), help="check that this device can be used")
    p.add_argument(
        "--model",
        help="a model (directory, hub id in the cache or the alias): what its config takes "
        "(the shared-prefix layout); its config only is read",
    )
    args = parse(p, argv)
    if isinstance(args, int):  # --help (0) or a parse error (2, one line)
        return args
    import warnings

    from slimrl.verify.doctor import format_report, report

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = report(args.fast_inference, args.load_in_4bit, args.device, args.model)
    print(json.dumps(data, indent=2) if args.json else format_report(data))
    return 1 if data["problems"] else 0
