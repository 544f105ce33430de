"""``slimrl`` command line: ``slimrl train | export | plan | verify | compare | doctor``."""

from __future__ import annotations

import sys

USAGE = """usage: slimrl <command> [options]

commands:
  train    train with TRL through slimrl (embedded default: SmolLM2-135M + LoRA, arithmetic, GRPO)
           `slimrl train --help` lists every option (all GRPOConfig fields too)
  export   write a trained adapter as the adapter, the merged model and/or GGUF files (llama.cpp, Ollama)
  plan     predict peak memory per phase and step time before any weight loads; with --budget, what fits
  verify   prove the patch exact on your setup: TRL alone vs slimrl, every trainer and loss type
  compare  measure TRL alone vs slimrl (and TRL + Liger) on your model and device: memory, time, loss
  doctor   versions, device, memory, and whether every patch applies to the installed TRL
"""


def main(argv: list[str] | None = None) -> int:
    entry_point = argv is None  # the console script / python -m slimrl (not a call from Python)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if entry_point:  # the command, not a call from Python: slimrl's refusals as one line, no third-party notices
        from slimrl.cli.quiet import quiet_third_party
        from slimrl.compat.runtime.callsite import install_one_line_errors

        install_one_line_errors()
        quiet_third_party()
    if command == "train" and entry_point:
        from slimrl.compat.runtime.malloc import restart_with_huge_pages

        restart_with_huge_pages()  # malloc's large blocks on huge pages (glibc reads this only at start)
    if command == "train":
        from slimrl.cli.train import main as train_main

        return train_main(rest)
    if command == "export":
        from slimrl.cli.export import main as export_main

        return export_main(rest)
    if command == "plan":
        from slimrl.cli.plan import main as plan_main

        return plan_main(rest)
    if command == "verify":
        from slimrl.cli.verify import main as verify_main

        return verify_main(rest)
    if command == "compare":
        from slimrl.cli.compare import main as compare_main

        return compare_main(rest)
    if command == "doctor":
        from slimrl.cli.doctor import main as doctor_main

        return doctor_main(rest)
    print(f"slimrl: error: unknown command {command!r}\n{USAGE}", file=sys.stderr)
    return 2
