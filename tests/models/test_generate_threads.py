"""``model.generate`` from a second thread while a trainer step runs (round 7: it flipped the model to inference
mode under the step, and the run aborted in the checkpoint's recompute): the step's modes are left alone; and a step
that starts while another thread's generation has the model switched waits until it is switched back."""

from __future__ import annotations

import threading
import time

import torch

from slimrl.models.methods import attach
from slimrl.models.modes import trainer_step
from tests.tiny import tiny_llama


def _model():
    model = attach(tiny_llama())
    model.train()
    return model


def test_generate_from_another_thread_leaves_a_running_step_in_training_mode():
    model = _model()
    seen, started, done = [], threading.Event(), threading.Event()

    def step():
        with trainer_step():
            started.set()
            while not done.is_set():
                seen.append(model.training and all(m.training for m in model.modules()))
                time.sleep(0.001)

    worker = threading.Thread(target=step)
    worker.start()
    started.wait(10)
    out = model.generate(torch.tensor([[2, 3, 4]]), max_new_tokens=4, do_sample=False)
    done.set()
    worker.join(10)
    assert out.shape == (1, 7) and seen and all(seen)


def test_a_step_starting_during_a_switched_generation_waits_for_the_switch_back(monkeypatch):
    model = _model()
    original = type(model).generate
    in_generation, release, step_saw = threading.Event(), threading.Event(), []

    def slow_generate(self, *args, **kwargs):
        in_generation.set()
        release.wait(10)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "generate", slow_generate)

    def step():
        in_generation.wait(10)
        with trainer_step():
            step_saw.append(model.training)

    worker = threading.Thread(target=step)
    worker.start()
    generator = threading.Thread(target=lambda: model.generate(torch.tensor([[2, 3]]), max_new_tokens=2))
    generator.start()
    in_generation.wait(10)
    time.sleep(0.2)
    assert not step_saw  # the step waits while the model is in inference mode
    release.set()
    generator.join(10)
    worker.join(10)
    assert step_saw == [True]
