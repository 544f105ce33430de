"""The two carry sets for a lent GPU machine (Python 3.12, no package registry, 64 MiB carried per command):

    python bench/gpu_wheels.py OUT_DIR                       # make gpu-wheels: OUT_DIR/slimrl and OUT_DIR/unsloth
    python bench/gpu_wheels.py --rehearsal OUT_DIR SITE_DIR  # make envs: the rehearsal's Unsloth folder

* ``slimrl/``: what slimrl's sides need that the machine lacks (TRL 1.16 and the datasets it runs on, Liger,
  bitsandbytes) and slimrl's own wheel;
* ``unsloth/``: Unsloth 2026.10.9 on its own supported stack (TRL 1.15.0, a datasets below 5), installed on the
  machine into a folder of its own (``--target``) that only the Unsloth processes put first on their path.

Two wheels are rebuilt smaller (the run never loads what is dropped): bitsandbytes keeps its CPU library and the
builds for every CUDA release PyTorch publishes wheels for (:data:`TORCH_CUDA_BUILDS`; bitsandbytes loads the build
of torch's CUDA, else the nearest of the same major), not only the CUDA of one machine (the wheel carries fourteen
CUDA/ROCm builds, 43 MB); unsloth drops
``studio/`` (its web application, 82 MB unpacked) and ``unsloth_cli/`` with their console scripts. Left out on
purpose, because ``import unsloth`` does not import them (the rehearsal in ``make test`` imports it from this very
set): xformers (Unsloth falls back to PyTorch's SDPA, which TRL uses too), diffusers, hf_transfer.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_MIB = 60  # each set, and both together, stay under what one device call carries (64 MiB with the tree)

SLIMRL_SET = (
    "trl==1.16.0",
    "datasets==5.2.0",
    "dill==0.4.1",
    "multiprocess==0.70.19",
    "fsspec==2026.9.0",
    "liger-kernel==0.8.5",
    "bitsandbytes==0.50.2",
)
UNSLOTH_SET = (
    "unsloth==2026.10.9",
    "unsloth_zoo==2026.10.9",
    "trl==1.15.0",
    "datasets==4.8.5",
    "fsspec==2026.2.0",
    "torchao==0.18.0",
    "cut_cross_entropy==25.1.1",
    "tyro==1.0.17",
    "docstring-parser==0.18.0",
    "typeguard==4.6.1",
    "msgspec==0.22.0",
    "certifi==2026.10.19.post1",
)  # the H200's was 2026.7.22, older than Unsloth's floor
# the machine's own releases of what Unsloth checks at import (KINDS.md's pip list): the rehearsal's stand-ins
MACHINE_STANDINS = (
    "transformers==5.17.0",
    "huggingface_hub==1.33.0",
    "tokenizers==0.23.2",
    "accelerate==1.15.0",
    "httpx",
    "httpcore",
    "h11",
    "anyio",
)

# the CUDA releases of PyTorch's wheels (torch 2.11, the machine's: cu126, cu128, cu130): a machine's torch reports
# one of them, and bitsandbytes needs its build for it (or one of the same major)
TORCH_CUDA_BUILDS = ("126", "128", "130")
_BNB_BUILDS = ("118", "120", "121", "122", "123", "124", "125", "126", "128", "129", "130", "131", "132")
# what each rebuilt wheel drops: (wheel name prefix, path prefixes dropped, console-script lines dropped)
STRIP = {
    "bitsandbytes-": (
        tuple(f"bitsandbytes/libbitsandbytes_cuda{k}" for k in _BNB_BUILDS if k not in TORCH_CUDA_BUILDS)
        + ("bitsandbytes/libbitsandbytes_rocm",),
        (),
    ),
    "unsloth-": (("studio/", "unsloth_cli/"), ("unsloth_cli",)),
}


def platform_args(python: str = "3.12") -> list[str]:
    """pip's options for binary wheels of CPython ``python`` on x86-64 Linux (the GPU machine's)."""
    abi = "cp" + python.replace(".", "")
    args = [
        "--python-version",
        python,
        "--implementation",
        "cp",
        "--abi",
        abi,
        "--abi",
        "abi3",
        "--abi",
        "none",
        "--platform",
        "any",
    ]
    for tag in (
        "manylinux_2_28_x86_64",
        "manylinux_2_24_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
        "manylinux_2_5_x86_64",
        "manylinux1_x86_64",
    ):
        args += ["--platform", tag]
    return args


def download(specs: tuple[str, ...], dest: Path, python: str = "3.12") -> None:
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            *platform_args(python),
            "-d",
            str(dest),
            *specs,
        ],
        check=True,
    )


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def strip_wheel(path: Path, drop: tuple[str, ...], scripts: tuple[str, ...]) -> int:
    """Rewrite the wheel at ``path`` without the files under ``drop`` and without console scripts naming a module
    in ``scripts``; RECORD is rewritten to match. Returns the bytes saved."""
    before = path.stat().st_size
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        record_name = next(n for n in src.namelist() if n.endswith(".dist-info/RECORD"))
        rows = []
        for info in src.infolist():
            name = info.filename
            if name == record_name or name.startswith(drop):
                continue
            data = src.read(name)
            if name.endswith(".dist-info/entry_points.txt") and scripts:
                lines = data.decode().splitlines()
                data = (
                    "\n".join(ln for ln in lines if not any(f"= {m}" in ln or f"={m}" in ln for m in scripts)) + "\n"
                ).encode()
            dst.writestr(info, data)
            rows.append(f"{name},{_record_hash(data)},{len(data)}")
        rows.append(f"{record_name},,")
        dst.writestr(record_name, "\n".join(rows) + "\n")
    tmp.replace(path)
    return before - path.stat().st_size


def mib(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*.whl")) / 2**20


def build(out: Path) -> dict[str, float]:
    """Both sets under ``out``; their sizes in MiB (SystemExit when over :data:`LIMIT_MIB`)."""
    slim, uns = out / "slimrl", out / "unsloth"
    for folder in (slim, uns):
        for old in folder.glob("*.whl"):
            old.unlink()
    download(SLIMRL_SET, slim)
    download(UNSLOTH_SET, uns)
    for folder in (slim, uns):
        for wheel in folder.glob("*.whl"):
            for prefix, (drop, scripts) in STRIP.items():
                if wheel.name.startswith(prefix):
                    saved = strip_wheel(wheel, drop, scripts)
                    print(f"{wheel.name}: rebuilt without {', '.join(drop)} ({saved / 2**20:.1f} MiB less)")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(slim), str(ROOT)],
        check=True,
    )
    sizes = {"slimrl": mib(slim), "unsloth": mib(uns)}
    sizes["both"] = sizes["slimrl"] + sizes["unsloth"]
    print("carry sets: " + ", ".join(f"{k} {v:.1f} MiB" for k, v in sizes.items()))
    if sizes["both"] >= LIMIT_MIB:
        raise SystemExit(
            f"the carry sets are {sizes['both']:.1f} MiB together: over the {LIMIT_MIB} MiB a device call "
            "can carry beside the repository"
        )
    return sizes


def rehearsal_site(out: Path, site: Path) -> None:
    """The Unsloth folder for this interpreter (the rehearsal imports Unsloth here, on the CPU): the same set,
    compiled wheels in this Python's build, and stand-ins for the GPU machine's own releases of what Unsloth checks
    at import (:data:`MACHINE_STANDINS`; ``bench/gpu_unsloth.py --view`` links the rest of the machine's list)."""
    portable = [
        str(w)
        for w in sorted((out / "unsloth").glob("*.whl"))
        if "-cp3" not in w.name.split("-", 2)[2] or "abi3" in w.name
    ]
    compiled = [
        spec
        for spec in UNSLOTH_SET
        if not any(Path(w).name.startswith(spec.split("==")[0].replace("-", "_")) for w in portable)
    ]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-compile",
            "--target",
            str(site),
            *portable,
            *compiled,
            *MACHINE_STANDINS,
        ],
        check=True,
    )
    (site / ".installed").touch()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--rehearsal":
        rehearsal_site(Path(sys.argv[2]), Path(sys.argv[3]))
    elif len(sys.argv) == 2:
        build(Path(sys.argv[1]))
    else:
        raise SystemExit("usage: python bench/gpu_wheels.py OUT_DIR | --rehearsal OUT_DIR SITE_DIR")
