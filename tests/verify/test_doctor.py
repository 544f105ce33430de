"""``slimrl doctor``: one screen or JSON; exit 1 when something asked for cannot work or a patch target is gone."""

from __future__ import annotations

import json

import torch

from slimrl.cli import doctor


def test_report_and_json(capsys):
    code = doctor.main([])
    text = capsys.readouterr().out
    assert "versions   python" in text and "trl " in text and "patches    " in text and "with a missing target" in text
    assert code == 0, text
    assert doctor.main(["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["patches"]["missing"] == [] and data["versions"]["trl"] and "cpu_cores" in data["device"]


def test_a_feature_that_cannot_work_here_is_a_problem(capsys, monkeypatch):
    from slimrl.verify import doctor as facts

    versions = dict.fromkeys(facts.PACKAGES)
    monkeypatch.setattr(facts, "_version", lambda name: {"trl": "1.16.0", "torch": "2.13.0"}.get(name))
    code = doctor.main(["--load_in_4bit", "--fast_inference"] + ([] if torch.cuda.is_available() else
                                                                  ["--device", "cuda"]))
    out = capsys.readouterr().out
    assert code == 1 and "PROBLEM: load_in_4bit needs bitsandbytes" in out and "PROBLEM: fast_inference needs vLLM" \
        in out, (out, versions)


def test_a_missing_patch_target_is_a_problem(capsys, monkeypatch):
    from trl import GRPOTrainer

    monkeypatch.delattr(GRPOTrainer, "_get_per_token_logps_and_entropies")
    assert doctor.main([]) == 1
    assert "PROBLEM: patch target trl.trainer.grpo_trainer:GRPOTrainer._get_per_token_logps_and_entropies is " \
           "missing" in capsys.readouterr().out
