"""Did the generator sample from the model being trained? One number per run: the largest difference, over every
sampled completion token of every generation, between the log-prob the generator gave the token and the log-prob
the training model gives it at that moment (same adapter, same weights, training mode, ``log_softmax(logits / T)``).

A stale adapter in the generator, a generator computing with other numbers than training (bitsandbytes' CPU
inference kernel in eval mode, an engine that missed a weight sync) or a wrong mode switch all show up here, while
the loss may look normal.

* HF ``generate`` (GRPO/RLOO without vLLM): :class:`GenerationProbe` wraps the model's ``generate`` to also return
  the raw logits of each step (``output_logits``);
* vLLM (slimrl's colocated engine, server mode): it wraps the trainer's generation object, whose ``generate``
  returns the sampled tokens' log-probs;

and the trainer's ``_generate_and_score_completions``, to score the sampled tokens with the training model right
after (before any optimizer step moves the adapter). Each completion is scored alone, unpadded: the training
model's log-probs do not depend on how a batch was padded.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch

TRL_METRIC = "sampling/sampling_logp_difference/max"


def sampled_logps(logits: tuple[torch.Tensor, ...], tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-prob of each sampled token under the generator's logits: ``logits[t]`` is ``[B, V]`` for step ``t``,
    ``tokens`` ``[B, C]``; returns ``[B, C]`` (fp32)."""
    steps = torch.stack(logits, dim=1).float() / temperature  # [B, C, V]
    return torch.log_softmax(steps, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def completion_mask(tokens: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """``[B, C]`` 1 up to and including each row's first EOS (TRL's rule), 0 after."""
    is_eos = torch.isin(tokens, torch.tensor(eos_ids, device=tokens.device))  # [B, C]
    after = (is_eos.cumsum(dim=1) - is_eos.int()) > 0  # tokens after the first EOS
    return (~after).int()


def model_logps(model: Any, ids: torch.Tensor, mask: torch.Tensor, n: int, temperature: float) -> torch.Tensor:
    """Log-prob of the last ``n`` tokens of ``ids`` ``[B, T]`` under ``model`` (positions from the attention mask,
    as generation counts them); ``[B, n]`` fp32."""
    positions = (mask.long().cumsum(dim=1) - 1).clamp(min=0)  # [B, T]
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -n - 1 : -1]  # [B, n, V]
    logps = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logps.gather(-1, ids[:, -n:].unsqueeze(-1)).squeeze(-1)


class GenerationProbe:
    """Installed on a GRPO/RLOO trainer before ``train()``; :attr:`worst` is the largest difference seen (NaN when
    no generation was checked). Instance attributes only: the trainer's class and TRL are untouched.

    It records what the generator returned — HF ``generate``: the sequences and each step's logits; a vLLM generation
    object (slimrl's engine, TRL's server or colocate client): prompt ids, completion ids and the sampled tokens'
    log-probs — and scores each completion with the training model when ``_generate_and_score_completions``
    returns."""

    def __init__(self, trainer: Any):
        self.trainer = trainer
        self.worst = math.nan
        self.checked = 0
        self._pending: list[tuple[list[int], list[int], torch.Tensor]] = []  # (prompt ids, completion ids, logps)
        self._generate = trainer.model.generate
        trainer.model.generate = self._recording_generate
        self._vllm = getattr(trainer, "vllm_generation", None) if getattr(trainer, "use_vllm", False) else None
        if self._vllm is not None:
            self._vllm_generate = self._vllm.generate
            self._vllm.generate = self._recording_vllm_generate
        self._score = trainer._generate_and_score_completions
        trainer._generate_and_score_completions = self._scoring

    def remove(self) -> None:
        del self.trainer.model.generate
        del self.trainer._generate_and_score_completions
        if self._vllm is not None:
            del self._vllm.generate

    def _temperature(self) -> float:
        return float(getattr(self.trainer, "temperature", None) or self.trainer.args.temperature)

    def _recording_generate(self, *args, **kwargs):
        config = kwargs.get("generation_config")
        if config is not None:  # TRL passes one: ask it (a copy) for the logits too
            config = copy.deepcopy(config)
            config.output_logits, config.return_dict_in_generate = True, True
            kwargs["generation_config"] = config
        else:
            kwargs.update(output_logits=True, return_dict_in_generate=True)
        out = self._generate(*args, **kwargs)
        ids = kwargs.get("input_ids", args[0] if args else None)  # [B, P], left-padded
        mask = kwargs.get("attention_mask")
        mask = torch.ones_like(ids) if mask is None else mask
        completions = out.sequences[:, ids.shape[1] :]  # [B, C]
        sampled = sampled_logps(out.logits, completions, self._temperature())  # [B, C]
        keep = completion_mask(completions, list(self._eos()))
        for row in range(ids.shape[0]):
            n = int(keep[row].sum())
            self._pending.append(
                (ids[row][mask[row].bool()].tolist(), completions[row, :n].tolist(), sampled[row, :n].detach().cpu())
            )
        return out.sequences

    def _recording_vllm_generate(self, *args, **kwargs):
        out = self._vllm_generate(*args, **kwargs)
        prompts, completions, logprobs = out[0], out[1], out[2]
        for prompt, completion, lps in zip(prompts, completions, logprobs):
            sampled = torch.tensor([float("nan") if lp[0] is None else lp[0] for lp in lps], dtype=torch.float32)
            self._pending.append((list(prompt), list(completion), sampled))
        return out

    def _eos(self) -> list[int]:
        eos = getattr(self.trainer, "eos_token_ids", None)
        return list(eos) if eos is not None else [self.trainer.processing_class.eos_token_id]

    def _scoring(self, *args, **kwargs):
        out = self._score(*args, **kwargs)
        pending, self._pending = self._pending, []
        model = self.trainer.model
        was_training = model.training
        model.train()
        device = next(model.parameters()).device
        with torch.no_grad():
            for prompt, completion, sampled in pending:
                if not completion:
                    continue
                ids = torch.tensor([prompt + completion], device=device)  # [1, P + C]
                ours = model_logps(model, ids, torch.ones_like(ids), len(completion), self._temperature())[0]
                delta = (ours.cpu() - sampled).abs()
                delta = delta[~torch.isnan(delta)]  # a token the generator could not score
                if delta.numel():
                    worst = float(delta.max())
                    self.worst = worst if math.isnan(self.worst) else max(self.worst, worst)
                    self.checked += int(delta.numel())
        model.train(was_training)
        return out


def worst_difference(probe: GenerationProbe | None, log_history: list[dict]) -> float:
    """The run's largest generator-vs-training log-prob difference: the probe's (HF generate), else TRL's logged
    one (vLLM paths), else NaN (nothing generated or nothing to compare)."""
    if probe is not None and probe.checked:
        return probe.worst
    logged = [h[TRL_METRIC] for h in log_history if TRL_METRIC in h]
    return max(logged) if logged else math.nan
