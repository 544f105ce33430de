"""``PatchFastRL()`` covers every trainer the installed TRL ships, stable and experimental, read from TRL's modules
(:mod:`slimrl.patching.machinery.catalog`, :mod:`slimrl.patching.derived`): every config builds with its defaults on
this CPU (TRL's bf16 default, which the CPU cannot run, becomes fp32 in the changed-settings table), every trainer has a
name ``PatchFastRL`` takes, and the first-contact trainers train one step of a tiny model under the patch."""

from __future__ import annotations

import tempfile
import warnings

import pytest

from slimrl import PatchFastRL, unpatch
from slimrl.patching.every_trainer.state import config_state, trainer_state
from slimrl.patching.machinery.catalog import resolve, shipped, snake_name
from slimrl.patching.spec import FIRST_CONTACT
from slimrl.patching.table import every_trainer

# what TRL itself requires of a config besides its defaults
REQUIRED = {"ServerDistillationConfig": {"teacher_model_server_url": "http://127.0.0.1:1"}}


def _configs() -> list[type]:
    return [resolve(s.config) for s in shipped() if s.config]


def _build(config_cls: type):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return config_cls(output_dir=tempfile.mkdtemp(), **REQUIRED.get(config_cls.__name__, {}))


def test_every_config_of_the_installed_trl_builds_with_its_defaults():
    from transformers.utils import is_torch_bf16_gpu_available

    configs = _configs()
    assert len(configs) >= 10  # TRL 1.12 ships 24 trainers with a config, 1.16 23
    PatchFastRL()
    try:
        built = [_build(cls) for cls in configs]
    finally:
        unpatch()
    if not is_torch_bf16_gpu_available():  # this CPU: TRL's own default stops there, the patched one runs in fp32
        assert all(c.bf16 is False for c in built)
        assert all("bf16" in config_state(c).changed for c in built)
        gkd_config = next((cls for cls in configs if cls.__name__ == "GKDConfig"), configs[0])
        with pytest.raises(ValueError, match="bf16"):  # TRL alone (unpatched): the error the issue met
            _build(gkd_config)


def test_every_trainer_has_a_name_and_is_patched_by_it():
    """Every trainer class the installed TRL publishes is patched by ``PatchFastRL()`` (its constructor replaced) and
    restored by ``unpatch()``; its name reaches it (aliases such as ``trl.experimental.kto``'s KTOTrainer are
    patched with their base's name); one named trainer alone is patched by its name."""
    from slimrl.patching import _normalise

    names = every_trainer()
    found = list(shipped())
    classes = [resolve(f.trainer) for f in found]
    before = [cls.__dict__.get("__init__") for cls in classes]
    for f in found:
        assert f.name in names and _normalise(f.name) == f.name, f
    PatchFastRL()
    try:
        patched = [cls.__dict__.get("__init__") for cls in classes]
    finally:
        unpatch()
    assert all(p is not b for p, b in zip(patched, before, strict=True)), [
        f.trainer for f, p, b in zip(found, patched, before) if p is b
    ]
    assert [cls.__dict__.get("__init__") for cls in classes] == before
    gkd = next((f for f in found if f.name == "gkd"), found[-1])
    cls = resolve(gkd.trainer)
    PatchFastRL(gkd.name)
    try:
        assert cls.__dict__.get("__init__") is not before[classes.index(cls)]
    finally:
        unpatch()
    assert (
        snake_name("AsyncGRPOTrainer") == "async_grpo"
        and snake_name("GRPOWithReplayBufferTrainer") == "grpo_with_replay_buffer"
        and snake_name("IWOPDTrainer") == "iwopd"
    )


def test_names_people_write_reach_the_trainer():
    from slimrl.patching import _normalise

    if "iwopd" in every_trainer():
        assert _normalise("IWOPDTrainer") == _normalise("iw_opd") == _normalise("IW-OPD") == "iwopd"
    if "gkd" in every_trainer():
        assert _normalise("GKD") == _normalise("gkdtrainer") == "gkd"
    with pytest.raises(ValueError, match="valid names: .*grpo"):
        _normalise("no_such_trainer")


def test_first_contact_trainers_are_listed_as_such():
    for name, spec in every_trainer().items():
        if spec.about.layer == FIRST_CONTACT:
            assert spec.training_step is None and not spec.acts_on and "no memory path" in spec.about.note, name


# ---- the first-contact trainers train one step of a tiny model under PatchFastRL(); their configs keep TRL's
# defaults but the sizes (and what TRL needs: a teacher, a reward); TRL's bf16 default is changed on this CPU ----


def _chat_model(tmp_path, seed: int, tokenizer) -> str:
    from tests.tiny import tiny_llama

    path = tmp_path / f"m{seed}"
    tiny_llama(seed=seed, vocab_size=len(tokenizer)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def _byte_level_tokenizer():
    """A ByteLevel BPE tokenizer trained here on a few strings (GOLD's byte offsets need one), with TRL's Qwen3 chat
    template."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import qwen3_chat_template

    from slimrl.verify.tiny import CHAT_SPECIAL

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        [f"{a}+{a}={2 * a} user assistant system" for a in range(50)], vocab_size=300, special_tokens=CHAT_SPECIAL
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, pad_token="<pad>", eos_token="<|im_end|>", unk_token="<unk>"
    )
    tok.chat_template = qwen3_chat_template
    return tok


def _reward(completions, **kwargs):
    return [float(len(str(c)) % 3) for c in completions]


MESSAGES = [
    {"messages": [{"role": "user", "content": f"{a}+{a}="}, {"role": "assistant", "content": str(2 * a)}]}
    for a in range(8)
]
CHAT_PROMPTS = [{"prompt": [{"role": "user", "content": f"{a}+{a}="}]} for a in range(8)]
PROMPTS = [{"prompt": f"{a}+{a}="} for a in range(8)]
SIZES = dict(max_steps=1, per_device_train_batch_size=2, report_to="none", save_strategy="no")
# name -> (module, trainer keywords beyond model/args/processing_class, config keywords beyond SIZES, tokenizer)
CASES = {
    "gkd": ("gkd", {"teacher": True, "data": MESSAGES}, {"max_new_tokens": 4}),
    "gold": ("gold", {"teacher": True, "data": MESSAGES, "byte_level": True}, {"max_completion_length": 4}),
    "iwopd": ("iw_opd", {"teacher": True, "data": MESSAGES}, {"max_completion_length": 4}),
    "tpo": (
        "tpo",
        {
            "data": [
                {"prompt": f"{a}+{a}=", "chosen": str(2 * a), "rejected": "x", "reference": str(2 * a)}
                for a in range(8)
            ]
        },
        {},
    ),
    "a2po": ("a2po", {"reward": True, "data": PROMPTS}, {"max_completion_length": 4}),
    "sdft": (
        "sdft",
        {"data": [{**p, "privileged_context": "hint"} for p in CHAT_PROMPTS]},
        {"max_completion_length": 4, "num_generations": 2},
    ),
    "sdpo": ("sdpo", {"reward": True, "data": PROMPTS}, {"max_completion_length": 4, "num_generations": 2}),
    "distillation": (None, {"teacher": True, "data": CHAT_PROMPTS}, {"max_completion_length": 4}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_first_contact_trainer_trains_under_the_patch(tmp_path, name):
    import importlib

    from datasets import Dataset

    from slimrl.verify.tiny import chat_tokenizer

    if name not in every_trainer():
        pytest.skip(f"the installed TRL has no {name} trainer")
    module_name, how, config_kwargs = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = importlib.import_module(f"trl.experimental.{module_name}" if module_name else "trl")
    prefix = every_trainer()[name].trainer_class_name.removesuffix("Trainer")
    tok = _byte_level_tokenizer() if how.get("byte_level") else chat_tokenizer()
    kwargs = {"train_dataset": Dataset.from_list(how["data"]), "processing_class": tok}
    if how.get("teacher"):
        kwargs["teacher_model"] = _chat_model(tmp_path, 1, tok)
    if how.get("reward"):
        kwargs["reward_funcs"] = [_reward]
    PatchFastRL(name)
    try:
        args = getattr(module, f"{prefix}Config")(output_dir=str(tmp_path / "out"), **SIZES, **config_kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = getattr(module, f"{prefix}Trainer")(model=_chat_model(tmp_path, 0, tok), args=args, **kwargs)
            result = trainer.train()
    finally:
        unpatch()
    assert trainer_state(trainer).algorithm == name
    assert result.global_step == 1 and result.training_loss == result.training_loss  # a finite number, not NaN


def test_docs_table_is_generated_from_the_installed_trl():
    """docs/compatibility.md's table of the other trainers is :func:`slimrl.patching.doc_tables.every_trainer_table` on
    the TRL release it names (regenerate it from there)."""
    from pathlib import Path

    from slimrl.compat.trl_info import trl_version
    from slimrl.patching.doc_tables import every_trainer_table

    if str(trl_version()) != "1.16.0":
        pytest.skip("docs/compatibility.md shows TRL 1.16.0's trainers")
    docs = (Path(__file__).resolve().parents[2] / "docs" / "compatibility.md").read_text()
    assert every_trainer_table() in docs, "stale: paste slimrl.patching.doc_tables.every_trainer_table() into the docs"


def test_verify_list_names_what_each_trainer_gets(capsys):
    from slimrl.cli.verify import main

    assert main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name, spec in every_trainer().items():
        if spec.available():
            line = next(x for x in lines if x.split()[:1] == [name])
            assert spec.about.layer in line, line


def _subclass(config_cls: type) -> type:
    """``@dataclass class Example<Name>(<Name>): extra: int = 3``, as TRL's own example scripts declare theirs."""
    import dataclasses

    return dataclasses.dataclass(
        type(f"Example{config_cls.__name__}", (config_cls,), {"__annotations__": {"extra": int}, "extra": 3})
    )


def test_every_config_subclassed_as_trls_scripts_do_gets_the_first_contact():
    """The subclass's generated ``__init__`` never calls the patched class's: slimrl's ``__post_init__`` gives it
    the same first contact. ``bf16=True`` as ``TrlParser`` passes ``--bf16 true``: TRL alone stops on this CPU, the
    patched run trains in fp32 with the change in the table."""
    from transformers.utils import is_torch_bf16_gpu_available

    configs = _configs()
    PatchFastRL()
    try:
        built = []
        for cls in configs:
            sub = _subclass(cls)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                built.append(sub(output_dir=tempfile.mkdtemp(), bf16=True, **REQUIRED.get(cls.__name__, {})))
    finally:
        unpatch()
    assert all(c.extra == 3 for c in built)
    if not is_torch_bf16_gpu_available():
        assert all(c.bf16 is False and "bf16" in config_state(c).changed for c in built), [
            type(c).__name__ for c in built if c.bf16 is not False
        ]
        with pytest.raises(ValueError, match="bf16"):  # TRL alone
            _subclass(configs[0])(output_dir=tempfile.mkdtemp(), bf16=True)


VALUES = [  # unusual values a user can write; TRL accepts some and refuses others
    {"learning_rate": -1e-5},
    {"learning_rate": 0.0},
    {"learning_rate": 5.0},
    {"temperature": 15.0},
    {"temperature": 0.0},
    {"temperature": -1.0},
    {"max_completion_length": 0},
    {"max_completion_length": 1},
    {"beta": -0.5},
    {"beta": 0.0},
    {"num_generations": 1},
    {"num_generations": 3},
    {"per_device_train_batch_size": 3},
    {"gradient_accumulation_steps": 7},
    {"max_steps": 0},
    {"seed": -3},
    {"warmup_ratio": 0.5},
    {"epsilon": 0.0},
    {"top_p": 0.0},
    {"max_length": 1},
]


def _builds(cls, values) -> bool:
    fields = {f for f in cls.__dataclass_fields__}
    if not set(values) <= fields:
        return None  # not a field of this config
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls(output_dir=tempfile.mkdtemp(), use_cpu=True, bf16=False, **REQUIRED.get(cls.__name__, {}), **values)
        return True
    except Exception:  # noqa: BLE001 - TRL's own refusals, whatever their type
        return False


def test_the_patched_configs_refuse_nothing_trl_accepts():
    """Every config class TRL ships, with each of :data:`VALUES`: what TRL alone builds, the patched config builds
    (a warning names what Unsloth would have refused)."""
    configs = _configs()
    alone = {(cls.__name__, i): _builds(cls, v) for cls in configs for i, v in enumerate(VALUES)}
    PatchFastRL()
    try:
        patched = {(cls.__name__, i): _builds(cls, v) for cls in configs for i, v in enumerate(VALUES)}
    finally:
        unpatch()
    tried = [k for k, v in alone.items() if v is not None]
    assert len(tried) > 100 and any(alone[k] is False for k in tried)  # TRL refuses some: not vacuous
    refused = sorted(f"{name} {VALUES[i]}" for (name, i) in tried if alone[(name, i)] and not patched[(name, i)])
    assert not refused, refused
