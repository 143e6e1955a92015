"""frlab's worker extension inside vLLM's real worker class (vllm 0.28/0.29, CPU platform).

`WorkerWrapperBase.init_worker` (vllm/v1/worker/worker_base.py) resolves
`worker_extension_cls`, refuses any extension attribute the worker class already has, and
appends the extension to the worker class's bases; the real `Worker` (gpu_worker.py) is then
constructed. A weight load goes through the real `Worker.reload_weights` ->
`GPUModelRunner.reload_weights(weights_iterator=..., is_checkpoint_format=True)` and vLLM's
layerwise reload (initialize / finalize) into a model that loads like vLLM's models do
(`weight_loader` of each parameter, metadata recorded at load time)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch
from helpers.vllm_contract import tiny_model, vllm_config

from frlab.rollout.vllm.snapshot import write_snapshot
from frlab.rollout.vllm.worker_extension import WORKER_EXTENSION_CLS, check_acks

pytestmark = pytest.mark.vllm_contract


class TinyVllmStyleModel(torch.nn.Module):
    """Loads like a vLLM model: each parameter through its `weight_loader`."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(3, 2)

    def load_weights(self, weights) -> set[str]:  # noqa: ANN001
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        params, names = dict(self.named_parameters()), set()
        for name, tensor in weights:
            param = params[name]
            getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            names.add(name)
        return names


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """vLLM's Worker class with frlab's extension mixed in by vLLM's own code, constructed."""
    from vllm.model_executor.model_loader.reload import record_metadata_for_reloading
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.gpu_worker import Worker
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    model_dir = str(tiny_model(tmp_path_factory.mktemp("worker") / "tiny"))
    config = vllm_config(model_dir, worker_extension_cls=WORKER_EXTENSION_CLS)

    class ContractWorker(Worker):  # a fresh subclass: the mixing mutates its bases
        pass

    module = types.ModuleType("frlab_contract_worker")
    module.ContractWorker = ContractWorker
    ContractWorker.__module__ = module.__name__
    sys.modules[module.__name__] = module
    config.parallel_config.worker_cls = f"{module.__name__}.ContractWorker"
    wrapper = WorkerWrapperBase(rpc_rank=0)
    wrapper.init_worker(
        [
            {
                "vllm_config": config,
                "local_rank": 0,
                "rank": 0,
                "distributed_init_method": "tcp://127.0.0.1:1",
                "is_driver_worker": True,
            }
        ]
    )
    # The model runner is built by init_device on a GPU; here: vLLM's runner class, its
    # real reload_weights, over a small model whose load metadata is recorded as at load.
    runner = object.__new__(GPUModelRunner)
    runner.model, runner.lora_config = TinyVllmStyleModel(), None
    runner.model_config, runner.load_config = config.model_config, config.load_config
    runner.vllm_config = config  # read by reload_weights since vLLM 0.32
    for name in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
        setattr(runner, name, lambda: None)
    record_metadata_for_reloading(runner.model)
    wrapper.worker.model_runner = runner
    yield wrapper.worker
    del sys.modules[module.__name__]


def test_vllm_mixes_the_extension_into_its_worker_class(worker) -> None:  # noqa: ANN001
    from vllm.v1.worker.gpu_worker import Worker

    from frlab.rollout.vllm.worker_extension import WeightUpdateExtension

    assert isinstance(worker, Worker) and isinstance(worker, WeightUpdateExtension)
    assert type(worker).__bases__[-1] is WeightUpdateExtension
    own = [a for a in dir(WeightUpdateExtension) if not a.startswith("__")]
    assert all(not hasattr(Worker, a) for a in own)  # vLLM's conflict rule, re-checked


def test_a_snapshot_loads_through_vllms_reload_path(worker, tmp_path: Path) -> None:  # noqa: ANN001
    """`Worker.reload_weights(..., is_checkpoint_format=True)` runs
    vLLM's layerwise reload (its post-load processing) around the model's load_weights."""
    weights = {
        "proj.weight": torch.arange(6.0).reshape(2, 3),
        "proj.bias": torch.tensor([2.0, -1.0]),
    }
    path, fingerprint = write_snapshot(weights, tmp_path, 3)
    ack = worker.frlab_load_snapshot(str(path), 3, dict(fingerprint))
    check_acks([ack], 3, fingerprint)
    model = worker.get_model()
    assert torch.equal(model.proj.weight.detach(), weights["proj.weight"])
    assert torch.equal(model.proj.bias.detach(), weights["proj.bias"])
    assert worker.frlab_weight_version() == {"version": 3}
    again = worker.frlab_load_snapshot(str(path), 3, dict(fingerprint))  # deduplicated
    assert again == ack
    path4, fp4 = write_snapshot({k: v + 1 for k, v in weights.items()}, tmp_path, 4)
    check_acks([worker.frlab_load_snapshot(str(path4), 4, dict(fp4))], 4, fp4)
    assert torch.equal(model.proj.bias.detach(), torch.tensor([3.0, 0.0]))


def test_a_snapshot_outside_the_servers_folder_is_refused_by_the_worker(
    worker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    """With FRLAB_SNAPSHOT_ROOT set (the launch recipe: the run's snapshot folder) a snapshot
    below it loads through vLLM's reload path, one elsewhere (or reached through a link that
    leaves it) is refused before anything is read, the weights and version unchanged."""
    from frlab.rollout.vllm.worker_extension import SNAPSHOT_ROOT_VAR

    weights = {"proj.weight": torch.full((2, 3), 0.5), "proj.bias": torch.tensor([1.0, 1.0])}
    inside = tmp_path / "run" / "snapshots"
    monkeypatch.setenv(SNAPSHOT_ROOT_VAR, str(inside))
    path, fingerprint = write_snapshot(weights, inside, 7)
    check_acks([worker.frlab_load_snapshot(str(path), 7, dict(fingerprint))], 7, fingerprint)
    bad = {k: v * 0 for k, v in weights.items()}
    outside, fp_out = write_snapshot(bad, tmp_path / "elsewhere", 8)
    (inside / "v8").symlink_to(outside.parent, target_is_directory=True)
    for attempt in (outside, inside / "v8" / outside.name):
        with pytest.raises(PermissionError, match="outside this server's snapshot folder"):
            worker.frlab_load_snapshot(str(attempt), 8, dict(fp_out))
    assert worker.frlab_weight_version() == {"version": 7}
    assert torch.equal(worker.get_model().proj.bias.detach(), weights["proj.bias"])
