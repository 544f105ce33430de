"""What `slimrl train` shows while and after it trains: one compact line per step, the reward's moving average."""

from __future__ import annotations

import io
from types import SimpleNamespace

from slimrl.cli.report import StepLineCallback, moving_average, plot_metrics


def test_one_compact_line_per_step():
    out = io.StringIO()
    cb = StepLineCallback(stream=out)
    state = SimpleNamespace(global_step=0, max_steps=30, is_world_process_zero=True)
    cb.on_train_begin(None, state, None)
    state.global_step = 3
    cb.on_log(
        None,
        state,
        None,
        logs={
            "loss": 0.0123,
            "reward": 0.8125,
            "kl": 0.00123,
            "completions/mean_length": 18.44,
            "memory/peak_mb": 1732.4,
            "learning_rate": 2e-4,
            "epoch": 0.1,
            "frac_reward_zero_std": 0.25,
        },
    )
    cb.on_log(None, state, None, logs={"train_runtime": 12.0})  # the final summary row: not a step
    (line,) = out.getvalue().splitlines()
    assert line.startswith("step 3/30  loss 0.0123  reward 0.812  kl 0.0012  len 18.4  signal 75%  ")
    assert line.endswith(" s  1732 MB") and "{" not in line


def test_moving_average():
    assert moving_average([1.0, 3.0, 5.0, 7.0], window=2) == [1.0, 2.0, 4.0, 6.0]
    assert moving_average([]) == []


def test_reward_panel_draws_the_moving_average(tmp_path, monkeypatch):
    import matplotlib.axes

    drawn = []
    real = matplotlib.axes.Axes.plot

    def spy(self, *args, **kwargs):
        drawn.append(kwargs.get("label"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    rows = [{"step": i, "reward": float(i % 3), "kl": 0.01} for i in range(1, 9)]
    assert plot_metrics(rows, tmp_path / "m.png").stat().st_size > 1000
    assert "moving average (5 steps)" in drawn and "reward" in drawn


def test_one_panel_per_reward_function_and_the_health_panels(tmp_path, monkeypatch):
    import matplotlib.axes

    titles, labels = [], []
    real_title, real_plot = matplotlib.axes.Axes.set_title, matplotlib.axes.Axes.plot
    monkeypatch.setattr(
        matplotlib.axes.Axes, "set_title", lambda self, t, *a, **k: (titles.append(t), real_title(self, t, *a, **k))[1]
    )

    def spy(self, *args, **kwargs):
        labels.append(kwargs.get("label"))
        return real_plot(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    rows = [
        {
            "step": i,
            "reward": 1.0,
            "rewards/fmt/mean": 0.1 * i,
            "rewards/correct/mean": 0.5,
            "frac_reward_zero_std": 0.5,
            "entropy": 1.0,
            "completions/clipped_ratio": 0.0,
        }
        for i in range(1, 9)
    ]
    assert plot_metrics(rows, tmp_path / "m.png").stat().st_size > 1000
    assert {
        "reward: fmt",
        "reward: correct",
        "groups without reward spread (no signal)",
        "entropy (nats per token)",
        "completions truncated",
    } <= set(titles)
    assert labels.count("moving average (5 steps)") == 3  # the total reward and each function's


def test_the_step_line_shows_a_disagreeing_generator_and_the_plot_has_its_panels(tmp_path, monkeypatch):
    out = io.StringIO()
    cb = StepLineCallback(stream=out)
    state = SimpleNamespace(global_step=0, max_steps=5, is_world_process_zero=True)
    cb.on_train_begin(None, state, None)
    state.global_step = 1
    cb.on_log(
        None, state, None, logs={"loss": 0.1, "sampling/kl_k3/mean": 0.0, "sampling/is_masked_share/sequence": 0.0}
    )
    state.global_step = 2
    cb.on_log(
        None, state, None, logs={"loss": 0.1, "sampling/kl_k3/mean": 0.0123, "sampling/is_masked_share/sequence": 0.25}
    )
    first, second = out.getvalue().splitlines()
    assert "sampler" not in first and "masked" not in first  # zero: nothing to say
    assert "sampler kl 0.012  is-masked 25%" in second
    import matplotlib.axes

    titles = []
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", lambda self, t, *a, **k: titles.append(t))
    rows = [{"step": 1, "reward": 0.1, "sampling/kl_k3/mean": 0.01, "sampling/is_masked_share/sequence": 0.2}]
    plot_metrics(rows, tmp_path / "p.png")
    assert "sampler-trainer KL (k3, nats per token)" in titles
    assert "sequences masked by the IS correction" in titles


def test_without_the_cli_extra_there_is_no_plot_and_the_summary_says_how_to_get_it(tmp_path, monkeypatch, capsys):
    """matplotlib is in the ``cli`` extra (``pip install 'slimrl[cli]'``), not a dependency of the library."""
    import sys
    import tomllib
    from pathlib import Path

    from slimrl.cli.report import NO_PLOT, print_summary

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith(("matplotlib", "pyyaml")) for d in project["dependencies"])
    assert {"matplotlib", "pyyaml"} <= set(project["optional-dependencies"]["cli"])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    assert plot_metrics([{"step": 1, "reward": 0.5}], tmp_path / "p.png") is None
    print_summary("grpo", 1, 1.0, 100.0, tmp_path, None, None, None, 0, None)
    assert NO_PLOT in capsys.readouterr().out
