"""``slimrl`` command line: ``slimrl train [--config run.yaml] [--key value ...]``."""

from __future__ import annotations

import sys

USAGE = """usage: slimrl <command> [options]

commands:
  train    train with TRL through slimrl (embedded default: SmolLM2-135M + LoRA, arithmetic, GRPO)
           `slimrl train --help` lists every option (all GRPOConfig fields too)
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "train":
        from slimrl.cli.train import main as train_main

        return train_main(rest)
    print(f"slimrl: error: unknown command {command!r}\n{USAGE}", file=sys.stderr)
    return 2
