"""frlab.learner.sharding without processes: atomic publication of sharded checkpoints, the
strategy's argument checks, and the decoder-layer lookup."""

from __future__ import annotations

import os

import pytest
from helpers.learner_setup import tiny_policy

from frlab.learner import sharding
from frlab.learner.sharding import FSDP2Strategy, layer_classes, publish_checkpoint


def _shards(folder, text: str):
    folder.mkdir()
    (folder / "meta.pt").write_text(text)
    (folder / "__0_0.distcp").write_text(text)
    return folder


def test_publish_points_the_link_at_the_new_folder_and_drops_the_old(tmp_path) -> None:
    link = tmp_path / "last.ckpt"
    publish_checkpoint(_shards(tmp_path / ".last.ckpt.a", "one"), link)
    assert os.readlink(link) == ".last.ckpt.a" and (link / "meta.pt").read_text() == "one"
    publish_checkpoint(_shards(tmp_path / ".last.ckpt.b", "two"), link)
    assert os.readlink(link) == ".last.ckpt.b" and (link / "meta.pt").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".last.ckpt.b", "last.ckpt"]


def test_a_failed_publish_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch) -> None:
    link = tmp_path / "last.ckpt"
    publish_checkpoint(_shards(tmp_path / ".last.ckpt.a", "one"), link)
    fresh = _shards(tmp_path / ".last.ckpt.b", "two")

    def crash(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(sharding.os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        publish_checkpoint(fresh, link)
    assert os.readlink(link) == ".last.ckpt.a" and (link / "meta.pt").read_text() == "one"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".last.ckpt.a",
        ".last.ckpt.b",
        "last.ckpt",
    ]


def test_publish_replaces_a_plain_sharded_folder(tmp_path) -> None:
    link = _shards(tmp_path / "last.ckpt", "lightning")  # written in place by Lightning
    publish_checkpoint(_shards(tmp_path / ".last.ckpt.b", "two"), link)
    assert link.is_symlink() and (link / "meta.pt").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".last.ckpt.b", "last.ckpt"]


def test_publish_refuses_a_missing_folder(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        publish_checkpoint(tmp_path / "nothing", tmp_path / "last.ckpt")


@pytest.mark.parametrize("key", ["data_parallel_size", "tensor_parallel_size"])
def test_strategy_refuses_parallel_sizes_naming_the_field(key: str) -> None:
    with pytest.raises(ValueError, match=rf"trainer\.strategy\.{key}`: is fixed"):
        FSDP2Strategy(**{key: 2})


def test_layer_classes_of_qwen2_and_a_model_without_them() -> None:
    assert layer_classes(tiny_policy()) == ("Qwen2DecoderLayer",)
    with pytest.raises(ValueError, match="declares no `_no_split_modules`"):
        layer_classes(__import__("torch").nn.Linear(2, 2))
