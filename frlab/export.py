"""`python -m frlab.export RUN_DIR OUT_DIR`: the trained policy as a Hugging Face model folder.

A run's checkpoint is a Lightning file (or, under FSDP2, a folder of shards) holding the whole
training state: the LightningModule's weights under `policy.` prefixes, the optimizer state,
the data cursor. The export reads only the policy's weights and writes what
`AutoModelForCausalLM.from_pretrained` and `vllm serve` load: `config.json` (the trained
architecture, its `architectures` entry and dtype), `generation_config.json`,
`model.safetensors` (sharded with an index above 5 GB) with the model's own parameter names,
and the tokenizer with its chat template (`tokenizer.json`, `tokenizer_config.json`,
`chat_template.jinja`), plus `frlab_export.json` (where it came from: checkpoint, step).

A LoRA run (`model.lora.rank > 0`) is written as its adapter, a peft folder
(`adapter_config.json`, `adapter_model.safetensors`, loaded with `PeftModel.from_pretrained`
over the base model), or with `--merge` as the merged model (adapters folded into the base
weights), loadable as above.

RUN_DIR is a run folder (its `checkpoints/last.ckpt`) or a checkpoint itself (a `.ckpt` file
or a sharded checkpoint folder; `--ckpt` picks another). The model is rebuilt from the
checkpoint's own `model` hyperparameters: the architecture of `model.name_or_path` (a folder,
a cached hub id or a `gguf:` source) or the random-init `model.config`, and the tokenizer of
`model.tokenizer`; every weight must match it (no missing or unexpected names, tied weights
aside). The folder is written next to OUT_DIR under a temporary name and renamed into place,
so OUT_DIR is either absent or complete; an existing OUT_DIR is refused unless `--overwrite`.
Errors exit with code 2 and say what to do.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

PREFIX = "policy."
METADATA = "meta.pt"  # Lightning's sharded-checkpoint metadata file


class ExportError(ValueError):
    """A run or checkpoint that cannot be exported (the message says why)."""


def find_checkpoint(run_dir: str | os.PathLike[str], ckpt: str | None = None) -> Path:
    """The checkpoint to export: `ckpt`, else RUN_DIR itself if it is one, else
    RUN_DIR/checkpoints/last.ckpt (a symlink is followed)."""
    candidates = [Path(ckpt)] if ckpt else [Path(run_dir), Path(run_dir) / "checkpoints/last.ckpt"]
    for path in candidates:
        if path.is_file() or (path.is_dir() and (path / METADATA).is_file()):
            return path.resolve()
    raise ExportError(
        f"no checkpoint at {' or '.join(map(str, candidates))}: train with checkpoints on "
        "(callbacks.model_checkpoint.enabled=true) or pass --ckpt PATH"
    )


def _policy_weights(state_dict: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The `policy.`-prefixed entries of a LightningModule state dict, prefix removed."""
    weights = {k[len(PREFIX) :]: v for k, v in state_dict.items() if k.startswith(PREFIX)}
    if not weights:
        raise ExportError("the checkpoint holds no `policy.` weights (not an frlab learner run)")
    return weights


def _sharded_weights(folder: Path, shapes: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The policy weights of a sharded (torch.distributed.checkpoint) folder, gathered in this
    process: each tensor in `shapes` (a state dict of the rebuilt model) that the checkpoint
    holds is read whole."""
    import torch.distributed.checkpoint as dcp

    reader = dcp.FileSystemReader(str(folder))
    saved = set(reader.read_metadata().state_dict_metadata)
    wanted = {
        PREFIX + k: torch.empty(v.shape, dtype=v.dtype)
        for k, v in shapes.items()
        if f"state_dict.{PREFIX}{k}" in saved
    }
    if not wanted:
        raise ExportError(f"{folder} holds none of the policy's weights")
    state = {"state_dict": wanted}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": yes
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=reader, no_dist=True)
    return _policy_weights(state["state_dict"])


def read_hyperparameters(ckpt: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the checkpoint's hyperparameters, its metadata: global_step, ...); a sharded folder's
    come from its metadata file."""
    path = ckpt / METADATA if ckpt.is_dir() else ckpt
    data = torch.load(path, map_location="cpu", weights_only=True, mmap=ckpt.is_file())
    hparams = data.get("hyper_parameters") or {}
    if not isinstance(hparams.get("model"), Mapping):
        raise ExportError(f"{ckpt} has no `model` hyperparameters: not an frlab learner run")
    info = {"global_step": data.get("global_step"), "epoch": data.get("epoch")}
    return dict(hparams), info


def build_skeleton(model_cfg: Mapping[str, Any], dtype: str | None) -> Any:
    """The trained architecture with fresh weights (`model.name_or_path`'s config, or the
    random-init `model.config`), in `dtype` (default: the run's `model.dtype`)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from frlab.model.gguf import resolve_model_source
    from frlab.model.policy import make_config, resolve_dtype

    torch_dtype = resolve_dtype(dtype or model_cfg.get("dtype", "float32"))
    source = model_cfg.get("name_or_path")
    remote = bool(model_cfg.get("trust_remote_code", False))
    if source is not None:
        config = AutoConfig.from_pretrained(
            resolve_model_source(str(source)), trust_remote_code=remote
        )
    else:
        config = make_config(model_cfg["config"])
    return AutoModelForCausalLM.from_config(config, dtype=torch_dtype, trust_remote_code=remote)


def load_into(model: Any, weights: Mapping[str, torch.Tensor]) -> None:
    """Copy `weights` into `model`; every parameter must come from the checkpoint (a weight
    tied to one that does is fine) and the checkpoint may hold nothing else."""
    result = model.load_state_dict(dict(weights), strict=False)
    unique = {name for name, _ in model.named_parameters(remove_duplicate=True)}
    missing = [k for k in result.missing_keys if k in unique]
    if missing or result.unexpected_keys:
        raise ExportError(
            f"checkpoint weights do not fit the model: missing {missing[:5]}, "
            f"unexpected {list(result.unexpected_keys)[:5]}"
        )
    model.tie_weights()


def save_tokenizer(name: str, out: Path) -> None:
    """The run's tokenizer (with its chat template) into `out`."""
    from frlab.model.tokenizer import build_tokenizer

    build_tokenizer(name).save_pretrained(out)


def export(
    run_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    ckpt: str | None = None,
    overwrite: bool = False,
    dtype: str | None = None,
    merge: bool = False,
) -> Path:
    """Write the run's trained policy to `out_dir` (see the module docstring); returns it. A
    LoRA run writes its adapter as a peft folder, or with `merge` the merged model."""
    from frlab.model.lora import apply_lora
    from frlab.model.lora import enabled as lora_enabled

    out = Path(out_dir)
    if os.path.lexists(out) and not overwrite:
        raise ExportError(f"{out} exists: choose a new OUT_DIR or pass --overwrite")
    source = find_checkpoint(run_dir, ckpt)
    hparams, info = read_hyperparameters(source)
    model_cfg = hparams["model"]
    lora = model_cfg.get("lora") or {}
    if merge and not lora_enabled(lora):
        raise ExportError("--merge: this run trained no LoRA adapters (model.lora.rank=0)")
    model = build_skeleton(model_cfg, dtype)
    if lora_enabled(lora):  # the checkpoint holds the PeftModel's names
        model = apply_lora(model, {**lora, "adapter": None})
    if source.is_dir():
        weights = _sharded_weights(source, model.state_dict())
    else:
        state = torch.load(source, map_location="cpu", weights_only=True, mmap=True)
        weights = _policy_weights(state["state_dict"])
    load_into(model, weights)
    if merge:
        model = model.merge_and_unload()
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.save_pretrained(work)
        save_tokenizer(str(model_cfg.get("tokenizer") or model_cfg["name_or_path"]), work)
        form = "merged" if merge else "adapter" if lora_enabled(lora) else "model"
        provenance = {
            "checkpoint": str(source),
            **info,
            "model": model_cfg,
            "form": form,
            "dtype": str(model.dtype).removeprefix("torch."),
        }
        (work / "frlab_export.json").write_text(json.dumps(provenance, indent=2, default=str))
        _publish(work, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def _publish(work: Path, out: Path) -> None:
    """Rename the finished folder to `out`; an existing `out` (--overwrite) goes only after."""
    old = None
    if os.path.lexists(out):
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
    os.replace(work, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m frlab.export", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("run_dir", help="a run folder, or a checkpoint file / sharded folder")
    parser.add_argument("out_dir", help="the Hugging Face folder to write (must not exist)")
    parser.add_argument("--ckpt", default=None, help="a checkpoint other than last.ckpt")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUT_DIR")
    parser.add_argument(
        "--dtype", default=None, help="float32 | bfloat16 | float16 (default: the run's)"
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="a LoRA run: the merged model instead of the adapter folder",
    )
    args = parser.parse_args(argv)
    try:
        out = export(
            args.run_dir,
            args.out_dir,
            ckpt=args.ckpt,
            overwrite=args.overwrite,
            dtype=args.dtype,
            merge=args.merge,
        )
    except (ExportError, ValueError, OSError) as exc:
        print(f"frlab.export: {exc}", file=sys.stderr)
        return 2
    print(f"exported {args.run_dir} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
