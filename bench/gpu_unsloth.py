"""Unsloth's side of the GPU runner: install its carry set into a folder of its own and check that everything it
declares is there, before any Unsloth process starts.

    python bench/gpu_unsloth.py --wheels .gpu-wheels/unsloth --target /tmp/slimrl-unsloth-site   # on the GPU machine
    python bench/gpu_unsloth.py --wheels .gpu-wheels/unsloth --target DIR --python 3.12          # the rehearsal here

The folder (``--target``) holds Unsloth, unsloth_zoo and the releases of TRL, datasets and fsspec it supports; only
the Unsloth processes put it first on their path, so slimrl's sides keep TRL 1.16. ``--python 3.12`` installs the
GPU machine's Python-3.12 wheels from another interpreter (pip's cross-platform options; nothing is compiled).

The check reads every installed distribution's requirements (markers evaluated for Linux x86-64 and the target
Python, no extras) and looks each up in the folder, then in what the machine has: the running interpreter's
packages on the GPU machine, the machine's recorded package list (``bench/gpu_machine.txt``, from the device
tool's KINDS.md) in the rehearsal. A requirement left out on purpose (:data:`NOT_CARRIED`: not imported by ``import
unsloth``) is listed, not failed; any other unmet requirement or version conflict fails the step, naming it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from email.parser import Parser
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_wheels import platform_args  # noqa: E402 - the bench directory is not a package

SLIMRL_SET = {
    "trl": "1.16.0",
    "datasets": "5.2.0",
    "dill": "0.4.1",
    "multiprocess": "0.70.19",
    "fsspec": "2026.9.0",
    "liger-kernel": "0.8.5",
    "bitsandbytes": "0.50.2",
}  # what command A (or B on a cold machine) installs


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def gpu_machine() -> dict[str, str | None]:
    """{normalized name: version or None} of the GPU machine's image (``bench/gpu_machine.txt``) plus slimrl's set."""
    out: dict[str, str | None] = {}
    for line in (Path(__file__).with_name("gpu_machine.txt")).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.strip().partition("==")
            out[_norm(name)] = version or None
    return {**out, **{_norm(k): v for k, v in SLIMRL_SET.items()}}


NOT_CARRIED = {"xformers", "diffusers", "hf-transfer", "pydantic", "json5", "nest-asyncio", "structlog"}


def install(wheels: Path, target: Path, python: str | None) -> None:
    """Every wheel of ``wheels`` into ``target`` (no index, no dependencies: the set is complete by itself)."""
    cross = ["--only-binary=:all:", *platform_args(python)] if python else []
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--upgrade",
            "--target",
            str(target),
            *cross,
            *map(str, sorted(wheels.glob("*.whl"))),
        ],
        check=True,
    )


def installed(target: Path) -> dict[str, tuple[str, list[str]]]:
    """{normalized name: (version, requirement strings)} of the distributions in ``target``."""
    out = {}
    for info in target.glob("*.dist-info"):
        meta = Parser().parsestr((info / "METADATA").read_text(errors="replace"))
        out[_norm(meta["Name"])] = (meta["Version"], meta.get_all("Requires-Dist") or [])
    return out


def machine(rehearsal: bool) -> dict[str, str | None]:
    if rehearsal:
        return gpu_machine()
    return {_norm(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}


def check(target: Path, python: str, rehearsal: bool) -> dict:
    """The check of the module docstring: {'ok', 'unmet', 'not_carried', 'from_machine', 'installed'}."""
    from packaging.requirements import Requirement

    env = {
        "python_version": python,
        "python_full_version": python + ".0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }
    here, there = installed(target), machine(rehearsal)
    unmet, skipped, used = [], set(), set()
    for dist, (_, requires) in sorted(here.items()):
        for text in requires:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            name = _norm(req.name)
            if name in NOT_CARRIED:
                skipped.add(name)
                continue
            version = here[name][0] if name in here else there.get(name, "missing")
            if name not in here and name in there:
                used.add(name)
            if version == "missing" or (
                version is not None and req.specifier and not req.specifier.contains(version, prereleases=True)
            ):
                unmet.append(
                    f"{dist} needs {text.split(';')[0].strip()}: "
                    f"{'absent' if version == 'missing' else 'found ' + version}"
                )
    return {
        "ok": not unmet,
        "unmet": unmet,
        "not_carried": sorted(skipped),
        "from_machine": sorted(used),
        "installed": {k: v[0] for k, v in sorted(here.items())},
    }


def machine_view(view: Path, exclude: set[str]) -> int:
    """The rehearsal's stand-in for the GPU machine's site-packages: ``view`` holds links to this interpreter's
    packages that the machine's image also has (``bench/gpu_machine.txt``) and no others, except those in ``exclude``
    (the Unsloth folder's own). An Unsloth process run with ``python -S`` and ``view`` on its path then finds only
    what the machine would: a module Unsloth imports that the machine lacks fails here as it would there. Returns
    the number of links."""
    wanted, links = gpu_machine(), 0
    view.mkdir(parents=True, exist_ok=True)
    for dist in metadata.distributions():
        name = _norm(dist.metadata["Name"] or "")
        if name not in wanted or name in exclude:
            continue
        tops = {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}
        for top in tops:
            src = Path(dist.locate_file(top))
            dst = view / top
            if src.exists() and not dst.exists() and not top.endswith(".pth"):
                dst.symlink_to(src)
                links += 1
    return links


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheels", type=Path, required=True)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--python", default=None, help="install another Python's wheels (the rehearsal: 3.12)")
    ap.add_argument(
        "--view",
        type=Path,
        default=None,
        help="the rehearsal: also build the machine view here (machine_view) for a target of this interpreter",
    )
    args = ap.parse_args(argv)
    if not any(args.wheels.glob("*.whl")):
        raise SystemExit(f"--wheels {args.wheels}: no wheels (make gpu-wheels builds them)")
    if not (args.target / ".installed").exists():
        install(args.wheels, args.target, args.python)
        (args.target / ".installed").touch()
    if args.view is not None:
        print(f"machine view {args.view}: {machine_view(args.view, set(installed(args.target)))} links")
    python = args.python or f"{sys.version_info.major}.{sys.version_info.minor}"
    report = check(args.target, python, rehearsal=args.python is not None or args.view is not None)
    print("BENCH_RESULT " + json.dumps(report))
    for line in report["unmet"]:
        print("unmet: " + line)
    print(
        f"unsloth set in {args.target}: {len(report['installed'])} distributions, "
        f"{'every requirement met' if report['ok'] else str(len(report['unmet'])) + ' unmet'}; left out on "
        f"purpose: {', '.join(report['not_carried']) or 'none'}"
    )
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
