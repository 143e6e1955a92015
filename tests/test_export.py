"""`python -m frlab.export RUN_DIR OUT_DIR`: a trained run as a Hugging Face model folder.

A real toy run (2 updates, checkpoints switched on with `callbacks.model_checkpoint.enabled`)
is exported; transformers loads the folder and its logits equal those of the policy restored
from the run's checkpoint, exactly (same dtype, same attention kernel). The folder holds the
layout `vllm serve` reads for a Hugging Face model: `config.json` naming the architecture
class, safetensors weights under the model's own parameter names (no `policy.` prefix), the
tokenizer with its chat template. An existing OUT_DIR is refused unless `--overwrite`, and
a run without a checkpoint is a clear error (exit code 2). The sharded FSDP2 case is checked
in tests/learner/test_learner_fsdp.py, on the checkpoint that test writes.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from frlab.export import main

pytestmark = pytest.mark.slow  # a module fixture starts servers or runs a training run

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HYDRA_FULL_ERROR": "1"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "run"
    command = [
        sys.executable,
        "-m",
        "frlab",
        "trainer.max_steps=2",
        "plots=false",
        "callbacks.model_checkpoint.enabled=true",
        "callbacks.model_checkpoint.every_n_train_steps=2",
        f"hydra.run.dir={out}",
    ]
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def trained_policy(run_dir: Path) -> torch.nn.Module:
    """The learner's policy as the checkpoint holds it (its `policy.` weights, read by hand)."""
    from frlab.config.arguments import declared_arguments
    from frlab.config.schema import ModelConfig
    from frlab.model.policy import build_policy

    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    model = checkpoint["hyper_parameters"]["model"]
    keys = declared_arguments(ModelConfig, name_or_path=None, config=None)
    policy = build_policy(**{k: model[k] for k in keys}, seed=0)
    prefix = "policy."
    weights = {
        k[len(prefix) :]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)
    }
    policy.load_state_dict(weights)
    return policy.eval()


def test_the_export_loads_in_transformers_with_the_trained_logits(run_dir, tmp_path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from frlab.model.toy_tokenizer import CHAT_TEMPLATE, build_toy_tokenizer

    out = tmp_path / "hf"
    assert main([str(run_dir), str(out)]) == 0
    policy = trained_policy(run_dir)
    attention = policy.config._attn_implementation  # the same kernels: bit-equal logits
    exported = AutoModelForCausalLM.from_pretrained(out, attn_implementation=attention).eval()
    ids = torch.tensor([[1, 7, 12, 30, 9, 4], [2, 5, 5, 40, 11, 3]])
    with torch.no_grad():
        want, got = policy(input_ids=ids).logits, exported(input_ids=ids).logits
    assert torch.equal(want, got)
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 2  # the weights after 2 updates
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert tokenizer.get_vocab() == build_toy_tokenizer().get_vocab()


def test_the_folder_has_the_layout_vllm_reads(run_dir, tmp_path) -> None:
    from safetensors import safe_open

    out = tmp_path / "hf"
    assert main([str(run_dir), str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["model_type"] == "qwen2"
    assert config["dtype"] == "float32"
    with safe_open(str(out / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
    policy_names = set(trained_policy(run_dir).state_dict())
    assert names <= policy_names and "model.embed_tokens.weight" in names
    assert not any(name.startswith("policy.") for name in names)
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
        "frlab_export.json",
    ):
        assert (out / name).is_file(), name
    assert json.loads((out / "frlab_export.json").read_text())["global_step"] == 2


def test_an_existing_out_dir_is_refused_unless_overwrite(run_dir, tmp_path, capsys) -> None:
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main([str(run_dir), str(out)]) == 2
    assert "exists" in capsys.readouterr().err and (out / "keep.txt").read_text() == "mine"
    assert main([str(run_dir), str(out), "--overwrite"]) == 0
    assert not (out / "keep.txt").exists() and (out / "config.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no temporary folder left


def test_a_run_without_checkpoint_is_a_clear_error(tmp_path, capsys) -> None:
    assert main([str(tmp_path), str(tmp_path / "out")]) == 2
    assert "callbacks.model_checkpoint.enabled=true" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_command_line_entry_point(run_dir, tmp_path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "frlab.export",
            str(run_dir),
            str(tmp_path / "hf"),
            "--dtype",
            "bfloat16",
        ],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["dtype"] == "bfloat16"


@pytest.fixture(scope="module")
def lora_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real toy run with LoRA adapters (model.lora.rank=4) and a larger lr, 3 updates."""
    out = tmp_path_factory.mktemp("export_lora") / "run"
    command = [
        sys.executable,
        "-m",
        "frlab",
        "trainer.max_steps=3",
        "plots=false",
        "model.lora.rank=4",
        "optim.lr=0.05",
        "callbacks.model_checkpoint.enabled=true",
        "callbacks.model_checkpoint.every_n_train_steps=3",
        f"hydra.run.dir={out}",
    ]
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_a_lora_run_exports_its_adapter_or_the_merged_model(lora_run_dir, tmp_path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    policy = trained_policy(lora_run_dir)
    ids = torch.tensor([[1, 7, 12, 30, 9, 4]])
    with torch.no_grad():
        want = policy(input_ids=ids).logits
    adapter, merged = tmp_path / "adapter", tmp_path / "merged"
    assert main([str(lora_run_dir), str(adapter)]) == 0
    assert (adapter / "adapter_config.json").is_file()
    assert (adapter / "adapter_model.safetensors").is_file()
    assert json.loads((adapter / "frlab_export.json").read_text())["form"] == "adapter"
    assert json.loads((adapter / "frlab_export.json").read_text())["model"]["lora"]["rank"] == 4
    base = copy.deepcopy(policy).unload()  # the frozen base weights, adapters removed
    with torch.no_grad():
        got = PeftModel.from_pretrained(base, adapter).eval()(input_ids=ids).logits
    assert (got - want).abs().max() < 1e-5
    assert main([str(lora_run_dir), str(merged), "--merge"]) == 0
    assert not (merged / "adapter_config.json").exists()
    with torch.no_grad():
        got = AutoModelForCausalLM.from_pretrained(merged).eval()(input_ids=ids).logits
    assert (got - want).abs().max() < 1e-4  # folded into the base weights
    assert main([str(lora_run_dir), str(tmp_path / "x")]) == 0  # the run itself is unchanged


def test_merge_needs_a_lora_run(run_dir, tmp_path) -> None:
    assert main([str(run_dir), str(tmp_path / "m"), "--merge"]) == 2
