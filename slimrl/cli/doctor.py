"""``slimrl doctor``: versions, device, memory and whether every patch fits the installed TRL; exit 1 when
something asked for cannot work (thin: the facts come from :mod:`slimrl.verify.doctor`)."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="slimrl doctor", description="What slimrl sees on this machine.")
    p.add_argument("--json", action="store_true", help="the report as JSON (for tools)")
    p.add_argument("--fast_inference", action="store_true", help="check what fast_inference=True needs")
    p.add_argument("--load_in_4bit", action="store_true", help="check what load_in_4bit=True needs")
    p.add_argument("--device", choices=("cpu", "cuda"), help="check that this device can be used")

    def error(message: str):
        print(f"slimrl doctor: error: {message}", file=sys.stderr)
        raise SystemExit(2)

    p.error = error
    try:
        args = p.parse_args(argv)
    except SystemExit as done:  # --help (0) or a parse error (2, one line)
        return int(done.code or 0)
    import warnings

    from slimrl.verify.doctor import format_report, report

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = report(args.fast_inference, args.load_in_4bit, args.device)
    print(json.dumps(data, indent=2) if args.json else format_report(data))
    return 1 if data["problems"] else 0
