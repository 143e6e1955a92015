"""A request's life in the torch engine (frlab.rollout.torch.request_state): it resolves once,
at a stop token ("stop") or its token budget ("length"), fails when its caller abandoned it, and
a failure after a cancel is silent."""

from __future__ import annotations

import concurrent.futures

import pytest
import torch

from frlab.defaults import sampling_params
from frlab.rollout.engine import EngineError
from frlab.rollout.torch.request_state import Request, fail, finished


def request(**params) -> Request:
    return Request([1, 2], sampling_params(**params), concurrent.futures.Future())


def sample(req: Request, token: int, log_prob: float = -0.5, version: int = 3) -> None:
    req.token_ids.append(token)
    req.log_probs.append(log_prob)
    req.versions.append(version)


def test_a_stop_token_finishes_with_stop_and_is_kept() -> None:
    req = request(max_new_tokens=5, stop_token_ids=(9,))
    sample(req, 4)
    assert not finished(req) and not req.future.done()
    sample(req, 9, -0.25, 4)
    assert finished(req)
    result = req.future.result(0)
    assert (result.token_ids, result.log_probs, result.versions) == ([4, 9], [-0.5, -0.25], [3, 4])
    assert result.finish_reason == "stop" and result.routing is None


def test_the_token_budget_finishes_with_length() -> None:
    req = request(max_new_tokens=2)
    sample(req, 4)
    sample(req, 5)
    assert finished(req) and req.future.result(0).finish_reason == "length"


def test_an_abandoned_request_fails_at_its_next_step() -> None:
    req = request(max_new_tokens=5)
    sample(req, 4)
    req.abandoned = True
    assert finished(req)
    with pytest.raises(EngineError, match="abandoned"):
        req.future.result(0)


def test_routing_pieces_are_joined_into_one_plain_tensor() -> None:
    req = request(max_new_tokens=1)
    with torch.inference_mode():  # the engine records under inference mode
        req.routing = [
            torch.zeros((2, 3, 2), dtype=torch.int16),
            torch.ones((1, 3, 2), dtype=torch.int16),
        ]
        sample(req, 4)
        assert finished(req)
    routing = req.future.result(0).routing
    assert routing.shape == (3, 3, 2) and routing[2].eq(1).all()
    assert not routing.is_inference()


def test_fail_is_silent_on_a_resolved_or_cancelled_request() -> None:
    done, cancelled = request(), request()
    done.future.set_result("kept")
    cancelled.future.cancel()
    fail(done, EngineError("late"))
    fail(cancelled, EngineError("late"))
    assert done.future.result(0) == "kept" and cancelled.future.cancelled()
