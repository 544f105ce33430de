"""One GRPO (or ``--algorithm rloo``: RLOO) step on the real SmolLM2-135M: TRL alone vs slimrl, each in its own
process.

    python bench/grpo_step.py --generations 8 --length 512            # both, prints ratios
    python bench/grpo_step.py --generations 4 --length 64 --modes trl  # one side only

Each side runs in a fresh subprocess so that its peak RSS (VmHWM) is its own. Completions are forced to exactly
``--length`` tokens (``min_new_tokens``), LoRA r=16 on every projection, beta=0.04, one generation batch of
``--generations`` completions of one prompt (per_device_train_batch_size = num_generations, no accumulation).

* ``trl``: TRL's defaults (GRPOConfig defaults, gradient checkpointing on), model from ``AutoModelForCausalLM`` and
  the LoRA adapter through ``GRPOTrainer(peft_config=...)``.
* ``slimrl``: ``PatchFastRL("grpo")`` + ``FastLanguageModel.from_pretrained`` / ``get_peft_model`` with the same
  LoRA settings, same GRPOConfig.
* ``engine``: as ``slimrl`` with ``fast_inference=True``: generation through slimrl's colocated vLLM engine, the
  adapter handed over as tensors each step (needs vLLM: ``.venv-vllm``). Lengths forced with vLLM's ``min_tokens``.
* ``trl-vllm``: TRL alone with ``use_vllm=True`` (colocate): TRL's own vLLM engine, adapter merged and every weight
  pushed each step.

With the engine modes use ``--steps 2``: the engine starts during the first step; the last step is reported.

Step-time features, one row each in the same run: a slimrl mode may end in ``/noreuse`` (TRL's old-log-prob
pass kept: ``slimrl_reuse_old_logps=False``), ``/nogroups`` (TRL's fixed row batches at the full padded width:
``slimrl_length_groups=False``), ``/nolevers`` (both), ``/noshared`` (TRL's row layout in the log-prob passes,
each prompt repeated in its group's rows: ``slimrl_shared_prefix=False``), ``/autofit`` (``slimrl_auto_fit`` at
``--budget``, default 12GB: the plan's fastest settings that fit), ``/tiled`` (``unsloth_tiled_mlp=True``: the MLPs a
tile of hidden-size tokens at a time, what slimrl's default picks on CUDA where the plan says it pays; without the
flag ``unsloth_tiled_mlp=False``, the CPU default), ``/nofused`` (PEFT's LoRA layers: ``get_peft_model(...,
fused_lora=False)``; without it slimrl's fused LoRA projections and MLPs) or ``/thp`` (malloc's mmap-ed blocks on
transparent huge pages, see ``run_worker``), e.g. ``--modes trl,engine/nolevers,engine/noreuse,engine``.

``--mixed``: completion lengths drawn uniformly from 16..``--length`` per completion (seeded, the same on every
side), instead of all forced to ``--length``: a logits processor ends each row with EOS at its length (HF generate),
per-row ``min_tokens = max_tokens`` (the engine).

``--prompt-tokens P``: the prompt grows to about ``P`` tokens after the chat template (a long instruction followed by
a story to continue, the same text on every side) instead of the one-line default (about 40 tokens). The three
shapes of the shared-prefix issue: ``--prompt-tokens 72 --length 20`` (the default ``slimrl train`` job's lengths),
``--prompt-tokens 200 --length 256 --mixed`` (GSM8K-shaped) and ``--prompt-tokens 2048 --length 256`` (long prompt).

``--tools`` (GRPO; HF generate, or ``engine``): a multi-turn tool task — TRL's ``tools=[calculator]`` with TRL's Qwen3
chat template on SmolLM2's tokenizer (the same ChatML markers; SmolLM2's own template has no tools), a system + user
prompt (about 230 tokens with the tool description); each completion's first turn is forced to a calculator call (8
spellings of the expression), TRL runs the tool and the second turn samples exactly ``--length`` tokens
(:func:`force_tool_turns`). The completions then hold the call, the tool result (masked from the loss by TRL) and the
answer; generation's phase includes TRL's tool loop. With ``engine`` the same turns are held by vLLM's settings
(:func:`force_tool_turns_engine`) and every turn is served by the engine.

The worker also samples RSS every 10 ms and labels it with the phase the trainer is in (generation, no-grad
log-probs, policy forward, backward, other), so ``--profile`` prints where the peak comes from.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

RESULT_TAG = "BENCH_RESULT "


def _rss_mb() -> float:
    from slimrl.compat.memory import resident_bytes

    return resident_bytes() / 2**20


def run_worker(cmd: list[str], label: str) -> dict:
    """Run one bench worker in its own process (own peak RSS) and return the JSON it printed after RESULT_TAG.
    A mode with ``/thp`` runs with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (malloc's mmap-ed blocks on
    transparent huge pages: 2 MiB page faults instead of 4 KiB ones; read by glibc at process start)."""
    env = dict(os.environ)
    if "thp" in label.split("/")[1:]:
        env["GLIBC_TUNABLES"] = "glibc.malloc.hugetlb=1"
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(RESULT_TAG)]
    if out.returncode != 0 or not lines:
        sys.stderr.write(out.stdout[-4000:] + out.stderr[-4000:])
        raise SystemExit(f"{label} worker failed (exit {out.returncode})")
    return json.loads(lines[-1][len(RESULT_TAG) :])


def _hwm_mb() -> float:
    """This worker's peak resident set (MiB): slimrl's one peak reader, never reset in a bench worker."""
    import torch

    from slimrl.compat.memory import peak_bytes

    return peak_bytes(torch.device("cpu")) / 2**20


class PhaseProfiler:
    """Samples RSS in a thread; attributes each sample to the innermost phase active at that moment."""

    def __init__(self, interval: float = 0.01) -> None:
        self.stack: list[str] = ["setup"]
        self.peaks: dict[str, float] = {}
        self.seconds: dict[str, float] = {}
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            phase, rss = self.stack[-1], _rss_mb()
            self.peaks[phase] = max(self.peaks.get(phase, 0.0), rss)
            time.sleep(self.interval)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    @contextmanager
    def phase(self, name: str):
        self.stack.append(name)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
            self.stack.pop()

    def wrap(self, obj, attr: str, name) -> None:
        fn = getattr(obj, attr)

        def wrapped(*args, **kwargs):
            import torch

            label = name(torch.is_grad_enabled()) if callable(name) else name
            with self.phase(label):
                return fn(*args, **kwargs)

        setattr(obj, attr, wrapped)


def profile_phases(prof: PhaseProfiler, trainer) -> list[float]:
    """Label ``trainer``'s phases for ``prof`` (generation, no-grad log-probs, policy forward, backward) and time
    each optimizer step; returns the list the step times are appended to."""
    prof.wrap(trainer, "_generate", "generation")
    prof.wrap(
        trainer,
        "_get_per_token_logps_and_entropies",
        lambda grad: "policy forward (grad)" if grad else "old/ref log-probs (no grad)",
    )
    prof.wrap(trainer.accelerator, "backward", "backward")
    step_times: list[float] = []
    from transformers import TrainerCallback

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            step_times.append(time.perf_counter() - self.t0)

    trainer.add_callback(Timer())
    return step_times


def _reward_len(completions, **kwargs):
    if os.environ.get("BENCH_SHOW"):
        print("COMPLETIONS", [str(c)[:160] for c in completions], flush=True)
    return [float(len(c[0]["content"]) if isinstance(c, list) else len(c)) / 100.0 for c in completions]


def mixed_lengths(rows: int, longest: int, call: int) -> list[int]:
    """The per-row completion lengths of one generation call in ``--mixed`` runs (16..longest, seeded)."""
    import random

    rng = random.Random(1000 + call)
    return [rng.randint(16, longest) for _ in range(rows)]


def force_mixed_lengths(longest: int, eos_id: int) -> None:
    """HF generate: every call gets a logits processor that bans EOS before a row's drawn length and forces it there.
    (Bench-only: TRL's generate call takes no logits processor.)"""
    import torch
    from transformers import GenerationMixin, LogitsProcessor, LogitsProcessorList

    calls = [0]

    class ForceLengths(LogitsProcessor):
        def __init__(self, lengths: list[int], prompt_width: int) -> None:
            self.lengths, self.prompt_width = lengths, prompt_width

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            step = input_ids.shape[1] - self.prompt_width  # tokens generated so far
            for row, length in enumerate(self.lengths):
                if step + 1 < length:
                    scores[row, eos_id] = -float("inf")
                else:
                    scores[row, :] = -float("inf")
                    scores[row, eos_id] = 0.0
            return scores

    orig = GenerationMixin.generate

    def generate(self, inputs=None, *args, **kwargs):
        ids = kwargs.get("input_ids", inputs)
        lengths = mixed_lengths(ids.shape[0], longest, calls[0])
        calls[0] += 1
        kwargs["logits_processor"] = LogitsProcessorList([ForceLengths(lengths, ids.shape[1])])
        return orig(self, inputs, *args, **kwargs)

    GenerationMixin.generate = generate


def force_mixed_lengths_engine(engine, longest: int) -> None:
    """The engine: one SamplingParams per row with ``min_tokens = max_tokens`` = its drawn length."""
    orig, calls = engine.generate_ids, [0]

    def generate(prompt_token_ids, sampling_params, *args, **kwargs):
        lengths = mixed_lengths(len(prompt_token_ids), longest, calls[0])
        calls[0] += 1
        per_row = []
        for n in lengths:
            p = sampling_params.clone()
            p.min_tokens, p.max_tokens = n, n
            per_row.append(p)
        return orig(prompt_token_ids, per_row, *args, **kwargs)

    engine.generate_ids = generate


CALLS = ["37*48+12", "37*48+12", "(37*48)+12", "37*(48+12)", "37*48-12", "1776+12", "37*48 + 12", "48*37+12"]


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: the expression, e.g. "12*7+3"
    """
    import ast
    import operator

    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}

    def ev(node):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError("unsupported expression")

    return str(ev(ast.parse(expression, mode="eval").body))


TOOL_MESSAGES = [
    {"role": "system", "content": "Use the calculator tool for arithmetic, then give the answer."},
    {"role": "user", "content": "What is 37*48+12?"},
]


def force_tool_turns(tok, length: int) -> None:
    """``--tools`` (HF generate): a first turn is forced to a calculator call (row i: ``CALLS[i % 8]``, then the
    end of the turn); a turn after a tool result samples freely for exactly ``length`` tokens. (Bench-only: it
    makes the multi-turn shape the same on every side without a model trained to call tools.)"""
    import json

    import torch
    from transformers import GenerationMixin, LogitsProcessor, LogitsProcessorList

    eos = tok.convert_tokens_to_ids("<|im_end|>")

    def call_ids(expression: str) -> list[int]:
        text = "<tool_call>\n" + json.dumps({"name": "calculator", "arguments": {"expression": expression}})
        return tok(text + "\n</tool_call>", add_special_tokens=False).input_ids + [eos]

    class Force(LogitsProcessor):
        def __init__(self, plans: list[list[int] | None], prompt_width: int) -> None:
            self.plans, self.prompt_width = plans, prompt_width

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            step = input_ids.shape[1] - self.prompt_width
            for row, plan in enumerate(self.plans):
                if plan is not None:  # a first turn: the call, token by token
                    token = plan[step] if step < len(plan) else eos
                    scores[row, :] = -float("inf")
                    scores[row, token] = 0.0
                elif step + 1 < length:
                    scores[row, eos] = -float("inf")
                else:
                    scores[row, :] = -float("inf")
                    scores[row, eos] = 0.0
            return scores

    def after_tool(ids: list[int]) -> bool:
        return "<tool_response>" in tok.decode(ids)

    orig = GenerationMixin.generate

    def generate(self, inputs=None, *args, **kwargs):
        ids = kwargs.get("input_ids", inputs)
        plans = [None if after_tool(row) else call_ids(CALLS[i % len(CALLS)]) for i, row in enumerate(ids.tolist())]
        kwargs["logits_processor"] = LogitsProcessorList([Force(plans, ids.shape[1])])
        return orig(self, inputs, *args, **kwargs)

    GenerationMixin.generate = generate


def force_tool_turns_engine(engine, tok, length: int) -> None:
    """``--tools`` with the engine: what :func:`force_tool_turns` does to HF generate, as per-row vLLM settings: a
    first turn is held to one of the ``CALLS`` by vLLM's structured outputs (a regex of the 8 calls; the engine
    samples which), a turn after a tool result samples exactly ``length`` tokens (``min_tokens = max_tokens``)."""
    import json
    import re

    from vllm.sampling_params import StructuredOutputsParams

    calls = [
        "<tool_call>\n" + json.dumps({"name": "calculator", "arguments": {"expression": e}}) + "\n</tool_call>"
        for e in dict.fromkeys(CALLS)
    ]
    regex = "(?:" + "|".join(re.escape(c) for c in calls) + ")"
    orig = engine.generate_ids

    def generate(prompt_token_ids, sampling_params, *args, **kwargs):
        per_row = []
        for ids in prompt_token_ids:
            p = sampling_params.clone()
            if "<tool_response>" in tok.decode(ids):
                p.min_tokens, p.max_tokens = length, length
            else:
                p.structured_outputs = StructuredOutputsParams(regex=regex)
            per_row.append(p)
        return orig(prompt_token_ids, per_row, *args, **kwargs)

    engine.generate_ids = generate


STORY = (
    "Once upon a time the number five lived in a small town of numbers, where every morning it counted the "
    "houses on its street, greeted the fours and the sixes, and wondered what lay past the river of zeros. "
)


def prompt_messages(tok, tokens: int) -> list[dict]:
    """One user message whose chat-templated length is about ``tokens`` (at least it, within one sentence);
    0 gives the bench's short default prompt."""
    ask = "Write a long story about the number five."
    if tokens <= 0:
        return [{"role": "user", "content": ask}]
    text = ask + " Continue this story, keeping its voice:\n"

    def length(content: str) -> int:
        return len(
            tok.apply_chat_template(
                [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )

    while length(text) < tokens:
        text += STORY
    words = text.split(" ")  # trim back to the smallest prefix of words that still reaches ``tokens``
    lo, hi = 1, len(words)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if length(" ".join(words[:mid])) >= tokens else (mid + 1, hi)
    return [{"role": "user", "content": " ".join(words[:lo])}]


def worker(args: argparse.Namespace) -> dict:
    import torch

    torch.manual_seed(0)
    import slimrl.compat.memory  # noqa: F401 - imported whole before the sampler thread starts: two threads
    import slimrl.models  # noqa: F401 - importing slimrl's packages at once can meet a half-initialised module

    prof = PhaseProfiler()
    prof.start()
    from datasets import Dataset

    from slimrl.models.loader import resolve_model_path

    path = str(resolve_model_path("SmolLM2-135M-Instruct"))
    lora = dict(
        r=16,
        lora_alpha=16,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    base, *flags = args.worker.split("/")
    slimrl_side = base in ("slimrl", "engine")
    if slimrl_side:
        from slimrl import FastLanguageModel, PatchFastRL

        PatchFastRL(args.algorithm, FastLanguageModel)
    import trl

    name = args.algorithm.upper()
    config_cls, trainer_cls = getattr(trl, f"{name}Config"), getattr(trl, f"{name}Trainer")

    extra = {}
    force = {"min_new_tokens": args.length}
    if base in ("engine", "trl-vllm"):
        force = {"min_tokens": args.length}  # vLLM's name (TRL hands generation_kwargs to SamplingParams)
    if args.mixed:
        if base == "trl-vllm":
            raise SystemExit("--mixed is not available for trl-vllm (TRL's own vLLM call takes no per-row lengths)")
        force = {}
    if args.tools:
        if base == "trl-vllm":
            raise SystemExit("--tools is not available for trl-vllm (TRL's own vLLM call takes no per-row settings)")
        force = {}
    if base == "trl-vllm":
        extra.update(use_vllm=True, vllm_mode="colocate", vllm_max_model_length=2048)
    if slimrl_side:
        from slimrl import FastLanguageModel

        longest = max(2048, args.prompt_tokens + args.length + 64)  # the chat prompt plus the completion
        model, tok = FastLanguageModel.from_pretrained(
            path,
            max_seq_length=longest,
            fast_inference=base == "engine",
            max_lora_rank=16,
            unsloth_tiled_mlp="tiled" in flags,
        )
        model = FastLanguageModel.get_peft_model(model, **lora, fused_lora="nofused" not in flags)
        extra["unsloth_num_chunks"] = args.num_chunks
        if {"noreuse", "nolevers"} & set(flags):
            extra["slimrl_reuse_old_logps"] = False
        if {"nogroups", "nolevers"} & set(flags):
            extra["slimrl_length_groups"] = False
        if "noshared" in flags:
            extra["slimrl_shared_prefix"] = False
        if "autofit" in flags:
            extra.update(slimrl_auto_fit=True, slimrl_memory_budget=args.budget)
    else:
        from peft import LoraConfig
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(path)
    prompt = prompt_messages(tok, args.prompt_tokens)
    if args.tools:
        from trl.chat_template_utils import qwen3_chat_template

        tok.chat_template = qwen3_chat_template  # SmolLM2's own template has no tools; same ChatML markers
        prompt = TOOL_MESSAGES
        extra["max_tool_calling_iterations"] = 1
    prompt_len = len(
        tok.apply_chat_template(
            prompt,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
            **({"tools": [calculator]} if args.tools else {}),
        )
    )
    ds = Dataset.from_list([{"prompt": prompt}] * 16)
    cfg = config_cls(
        output_dir="/tmp/slimrl-bench",
        per_device_train_batch_size=args.generations,
        num_generations=args.generations,
        beta=0.04,
        max_completion_length=args.length + (96 if args.tools else 0),  # tools: the call and its result too
        generation_kwargs=force,
        max_steps=args.steps,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        bf16=False,
        use_cpu=True,
        seed=0,
        **({} if args.grad_ckpt == "default" else {"gradient_checkpointing": args.grad_ckpt == "on"}),
        **extra,
    )
    trainer_kwargs = {} if slimrl_side else {"peft_config": LoraConfig(task_type="CAUSAL_LM", **lora)}
    if args.tools:
        trainer_kwargs["tools"] = [calculator]
    trainer = trainer_cls(
        model=model, args=cfg, reward_funcs=[_reward_len], train_dataset=ds, processing_class=tok, **trainer_kwargs
    )
    sync_times: list[float] = []
    if args.tools and base == "engine":
        force_tool_turns_engine(model.vllm_engine, tok, args.length)
    elif args.tools:
        force_tool_turns(tok, args.length)
    elif args.mixed:
        engine = getattr(model, "vllm_engine", None)
        if engine is not None:
            force_mixed_lengths_engine(engine, args.length)
        else:
            force_mixed_lengths(args.length, tok.eos_token_id)
    if base == "trl-vllm":  # TRL's own sync: merge the adapter, push every weight, unmerge
        orig_sync = trainer.vllm_generation.sync_weights

        def timed_sync():
            t0 = time.perf_counter()
            orig_sync()
            sync_times.append(time.perf_counter() - t0)

        trainer.vllm_generation.sync_weights = timed_sync
    step_times = profile_phases(prof, trainer)
    rss_before = _rss_mb()
    with prof.phase("other (train loop, optimizer)"):
        trainer.train()
    prof.stop()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    from slimrl.patching.every_trainer.state import trainer_state

    engine = getattr(getattr(trainer, "vllm_generation", None), "engine", None)
    return {
        "sync_s": engine.timings["last_sync_s"] if engine is not None else (sync_times[-1] if sync_times else None),
        "mode": args.worker,
        "peak_rss_mb": _hwm_mb(),
        "rss_after_load_mb": rss_before,
        "step_s": step_times,
        "phase_peak_rss_mb": prof.peaks,
        "phase_s": prof.seconds,
        "loss": logs[-1]["loss"] if logs else None,
        "completion_len": logs[-1].get("completions/mean_length") if logs else None,
        "tool_calls": logs[-1].get("tools/call_frequency") if logs else None,
        "grad_ckpt": cfg.gradient_checkpointing,
        "threads": torch.get_num_threads(),
        "no_grad_rows": getattr(cfg, "unsloth_grpo_mini_batch", None),
        "prompt_tokens": prompt_len,
        "shared_prefix_forwards": trainer_state(trainer).shared_prefix_forwards if slimrl_side else None,
        "shared_prefills": trainer_state(trainer).shared_prefills if slimrl_side else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--modes", default="trl,slimrl")
    ap.add_argument("--grad-ckpt", choices=["default", "on", "off"], default="default")
    ap.add_argument("--num-chunks", type=int, default=-1)
    ap.add_argument("--profile", action="store_true", help="print peak RSS per phase")
    ap.add_argument("--mixed", action="store_true", help="completion lengths drawn from 16..--length")
    ap.add_argument("--budget", default="12GB", help="memory budget of the /autofit modes")
    ap.add_argument("--prompt-tokens", type=int, default=0, help="prompt of about this many tokens (0: short)")
    ap.add_argument("--algorithm", choices=["grpo", "rloo"], default="grpo")
    ap.add_argument(
        "--tools", action="store_true", help="a multi-turn tool task (GRPO, HF generate; see force_tool_turns)"
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(RESULT_TAG + json.dumps(worker(args)), flush=True)
        return
    results = {}
    for mode in args.modes.split(","):
        forwarded = [
            a
            for i, a in enumerate(sys.argv[1:])
            if not a.startswith("--modes") and not (i > 0 and sys.argv[i] == "--modes")
        ]  # drop "--modes X" and "--modes=X"
        results[mode] = run_worker([sys.executable, __file__, "--worker", mode] + forwarded, mode)
    first = next(iter(results.values()))
    print(
        f"{args.algorithm.upper()} step, SmolLM2-135M, LoRA r=16, beta=0.04, prompt {first['prompt_tokens']} tokens, "
        f"{args.generations} x {args.length} tokens{' (mixed lengths)' if args.mixed else ''}, "
        f"grad-ckpt={args.grad_ckpt}"
    )
    print(f"{'mode':16} {'peak RSS MB':>12} {'s/step':>8} {'loss':>10} {'mean len':>9} {'grad-ckpt':>9}")
    for mode, r in results.items():
        print(
            f"{mode:16} {r['peak_rss_mb']:12.0f} {r['step_s'][-1]:8.1f} {r['loss']!s:>10} "
            f"{r['completion_len']!s:>9} {r['grad_ckpt']!s:>9}"
            + (f"  shared-prefix forwards {r['shared_prefix_forwards']}" if r.get("shared_prefix_forwards") else "")
            + (f", shared prefills {r['shared_prefills']}" if r.get("shared_prefills") else "")
            + (f"  tool calls/completion {r['tool_calls']}" if r.get("tool_calls") is not None else "")
        )
        if args.profile:
            for phase, mb in sorted(r["phase_peak_rss_mb"].items(), key=lambda kv: -kv[1]):
                secs = r.get("phase_s", {}).get(phase)
                print(f"    {phase:34} {mb:8.0f} MB" + (f" {secs:8.1f} s" if secs is not None else ""))
    for mode, s in results.items():
        if mode == "trl" or "trl" not in results:
            continue
        t = results["trl"]
        print(
            f"ratio {mode}/trl: peak RSS {s['peak_rss_mb'] / t['peak_rss_mb']:.2f}x, "
            f"time {s['step_s'][-1] / t['step_s'][-1]:.2f}x"
        )
        if s.get("sync_s") is not None:
            share = 100 * s["sync_s"] / s["step_s"][-1]
            print(f"    {mode}: adapter sync {s['sync_s']:.3f} s = {share:.1f} % of the step")
    print(RESULT_TAG + json.dumps(results))


if __name__ == "__main__":
    main()
