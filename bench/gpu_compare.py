"""The GPU runner's headline step: ``slimrl compare`` on a random-init copy of a public shape (``gpu_shapes.py``),
its record printed as the runner's one ``BENCH_RESULT`` line (sides by name, ``plan``: slimrl plan's prediction).

    python bench/gpu_compare.py --shape qwen2.5-1.5b --length 4096 --prompt-length 256 --generations 8
    python bench/gpu_compare.py --device cpu --tiny --length 12 --prompt-length 16 --generations 2   # rehearsal
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_shapes import SHAPES, model_dir  # noqa: E402 - the bench directory is not a package

from slimrl.cli.compare_worker import RESULT_TAG  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--prompt-length", type=int, default=128)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--lora-r", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--sides", default="trl,trl-liger,slimrl")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--cache", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "slimrl-gpu-models"))
    a = ap.parse_args(argv)
    from slimrl.cli.compare import main as compare

    path = model_dir("tiny" if a.tiny else a.shape, a.cache, a.device)
    record_file = os.path.join(tempfile.mkdtemp(prefix="slimrl-compare-"), "record.json")
    rc = compare(
        [
            "--model",
            path,
            "--sides",
            a.sides,
            "--num_generations",
            str(a.generations),
            "--max_prompt_length",
            str(a.prompt_length),
            "--max_completion_length",
            str(a.length),
            "--lora_r",
            str(a.lora_r),
            "--steps",
            str(a.steps),
            "--device",
            a.device,
            "--json",
            record_file,
        ]
    )
    record = json.loads(Path(record_file).read_text())
    predicted = record["predicted"]
    result = {
        **record["sides"],
        "plan": {
            "peak_gb": predicted.get("slimrl", {}).get("peak_gb"),
            "step_s": predicted.get("slimrl_step_s"),
            "trl_peak_gb": predicted.get("trl", {}).get("peak_gb"),
        },
        "loss_agreement": record["loss_agreement"],
        "rc": rc,
        "config": {
            "shape": "tiny" if a.tiny else a.shape,
            "length": a.length,
            "generations": a.generations,
            "prompt_length": a.prompt_length,
            "lora_r": a.lora_r,
            "device": a.device,
        },
    }
    print(RESULT_TAG + json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    sys.exit(0 if main().get("rc") == 0 else 1)
