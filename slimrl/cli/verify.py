"""``slimrl verify``: patched vs unpatched TRL on your setup, one table, exit 1 on any FAIL (thin: parse, run,
report; the work is :mod:`slimrl.verify`)."""

from __future__ import annotations

import argparse
import sys
import warnings

from slimrl.cli.oneline import fail, parse
from slimrl.patching.every_trainer.extra_fields import EXTRA_FIELDS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slimrl verify",
        description=(
            "Train a tiny copy of your model two steps with TRL alone and with slimrl patched, per trainer and loss "
            "type, and compare losses, gradients and updates. Exit 1 on any FAIL."
        ),
    )
    p.add_argument("--algorithm", help="comma-separated trainers (default: every trainer the installed TRL has)")
    p.add_argument("--all", action="store_true", help="every trainer and loss type (the default)")
    p.add_argument("--loss_type", help="only this loss type")
    p.add_argument(
        "--model", help="model dir, .gguf or hub id whose config the tiny model copies (default: a tiny Llama)"
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument("--tiny", action="store_true", help="a 2-layer, narrow copy of --model's config (default)")
    size.add_argument("--full", action="store_true", help="the real model (slow; default model: SmolLM2-135M)")
    p.add_argument("--device", default="cpu", help="cpu (fp32) or cuda (bf16)")
    quant = p.add_mutually_exclusive_group()
    quant.add_argument(
        "--load_in_4bit",
        action="store_true",
        help="a bitsandbytes NF4 base under the LoRA rows "
        "(grpo, rloo, online_dpo, xpo); CPU with bitsandbytes>=0.50, or CUDA",
    )
    quant.add_argument("--load_in_8bit", action="store_true", help="the same with an LLM.int8() base")
    p.add_argument(
        "--fast_inference",
        action="store_true",
        help="also GRPO/RLOO rows generating through slimrl's "
        "colocated vLLM engine (the generator check: sampled tokens' log-probs vs the training model's)",
    )
    p.add_argument(
        "--vllm_server_base_url",
        help="also GRPO/RLOO rows generating through this running vLLM server "
        "(needs --model: the local directory the server serves)",
    )
    chunks = EXTRA_FIELDS["unsloth_num_chunks"]
    p.add_argument(
        "--unsloth_num_chunks",
        type=int,
        help=f"{chunks.help[:-1]}, on every row's config (on a GPU "
        "where TRL's Triton kernel serves the fused-head trainers, this makes slimrl's op serve them)",
    )
    p.add_argument("--quiet", action="store_true", help="only the table")
    p.add_argument("--self-check-rows", help=argparse.SUPPRESS)  # the self-check child (every_trainer/preflight.py)
    p.add_argument(
        "--list",
        action="store_true",
        help="every trainer of the installed TRL: what slimrl gives it "
        "(memory paths, checks and guards, first contact) and whether verify runs it; nothing is trained",
    )
    return p


def listing() -> str:
    """``--list``: one line per trainer of the installed TRL (slimrl's table and the rest, read from TRL)."""
    from slimrl.patching.table import ALIASES, every_trainer

    rows = [
        (
            name,
            spec.trainer_class_name,
            spec.about.layer,
            "verified" if spec.about.scenario else spec.about.not_verified or "not verified",
        )
        for name, spec in every_trainer().items()
        if spec.available()
    ]
    rows += [
        (name, target.partition(":")[2] + f" ({target.partition(':')[0]})", f"alias of {name}", "as " + name)
        for name, targets in ALIASES.items()
        for target in targets
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{n:<{widths[0]}}  {c:<{widths[1]}}  {layer:<{widths[2]}}  {v}" for n, c, layer, v in rows]
    return "\n".join(
        ["trainers of the installed TRL (PatchFastRL name, class, what slimrl gives, slimrl verify):", *lines]
    )


def _fail(message: str) -> int:
    return fail("slimrl verify", message)


def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), argv)
    if isinstance(args, int):  # --help (0) or a parse error already printed as one line (2)
        return args
    if args.all and args.algorithm:
        return _fail("--all and --algorithm: pass one of them")
    if args.list:
        print(listing())
        return 0
    if args.self_check_rows:
        from slimrl.verify.self_check_rows import child

        child(args.self_check_rows.split(","))
        return 0
    from slimrl.errors import InputError
    from slimrl.verify import format_table, verify

    algorithms = [a for a in (args.algorithm or "").split(",") if a.strip()] or None

    def progress(row):
        if not args.quiet:
            result = "PASS" if row.passed else "SKIP" if row.skipped else "FAIL"
            print(f"  {row.trainer:<11} {row.loss_type:<18} {result}  {row.seconds:.1f} s", file=sys.stderr, flush=True)

    import logging

    import transformers

    transformers.logging.set_verbosity_error()  # TRL's and transformers' notices about the tiny runs
    logging.getLogger("trl").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            rows = verify(
                algorithms,
                args.loss_type,
                args.model,
                args.full,
                args.device,
                progress=progress,
                load_in_4bit=args.load_in_4bit,
                load_in_8bit=args.load_in_8bit,
                fast_inference=args.fast_inference,
                vllm_server_base_url=args.vllm_server_base_url,
                unsloth_num_chunks=args.unsloth_num_chunks,
            )
        except InputError as err:
            return _fail(str(err))
    import trl

    where = (
        f"trl {trl.__version__}, {'real' if args.full else 'tiny'} model "
        f"({args.model or ('SmolLM2-135M-Instruct' if args.full else 'a tiny Llama')}), {args.device}"
        + (
            ", 4-bit base (bitsandbytes NF4)"
            if args.load_in_4bit
            else ", 8-bit base (bitsandbytes LLM.int8())"
            if args.load_in_8bit
            else ""
        )
    )
    from slimrl.verify.reference import reference_note

    print(format_table(rows, setup_line=f"slimrl verify: {where}"))
    if reference_note():
        print(reference_note())
    failed = [r for r in rows if r.failed]
    skipped = [r for r in rows if r.skipped]
    print(
        f"{sum(r.passed for r in rows)} passed, {len(failed)} failed"
        + (f", {len(skipped)} skipped (TRL alone cannot run them here; slimrl did)" if skipped else "")
    )
    return 1 if failed else 0
