"""What a resubmit weight update of the `remote` engine asks a vLLM server, answered by vLLM's
own application (tests/helpers/vllm_app.py): `POST /pause?mode=abort` reaches
`pause_generation(mode="abort")`, `POST /resume` reaches `resume_generation`, and a request
that vLLM ended aborted comes back as a completion with its tokens so far and
`finish_reason: "abort"`, which frlab's parser reads as such. The same answers are what the
CPU fake `PausingVllmServer` (tests/helpers/pausing_vllm.py) gives."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from helpers.vllm_contract import tiny_model

from frlab.defaults import sampling_params
from frlab.rollout.remote import protocol as proto

pytestmark = pytest.mark.vllm_contract


@pytest.fixture(scope="module")
def vllm_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("vllm.entrypoints.rl.online.api_router", reason="vLLM < 0.32")
    from helpers.vllm_app import VllmAppServer

    server = VllmAppServer(str(tiny_model(tmp_path_factory.mktemp("pause") / "tiny")))
    server.start()
    yield server
    server.close()


def post(app: Any, path: str, body: Any) -> httpx.Response:
    return httpx.post(app.url + path, json=body, timeout=30.0, trust_env=False)


def test_pause_with_abort_and_resume_are_vllms_routes(vllm_app: Any) -> None:
    vllm_app.client.pauses.clear()
    resp = post(vllm_app, proto.PAUSE_ABORT, {})
    assert resp.status_code == 200 and resp.json() == {"status": "paused"}
    resp = post(vllm_app, proto.RESUME, {})
    assert resp.status_code == 200 and resp.json() == {"status": "resumed"}
    assert vllm_app.client.pauses == ["abort", "resume"]


@pytest.mark.parametrize("after", [2, 0])
def test_an_aborted_request_answers_its_tokens_so_far(vllm_app: Any, after: int) -> None:
    """As vLLM answers it, and as the fake answers it."""
    body = proto.completion_request("m", [1, 2, 3], sampling_params(max_new_tokens=5), seed=1)
    body["model"] = vllm_app.args.model
    vllm_app.client.abort_after = after
    try:
        resp = post(vllm_app, proto.COMPLETIONS, body)
    finally:
        vllm_app.client.abort_after = None
    assert resp.status_code == 200, resp.text
    done = proto.parse_completion(resp.json(), [1, 2, 3])
    assert done.finish_reason == "abort" and done.token_ids == [4, 5][:after]
    assert done.log_probs == pytest.approx([-0.5, -0.51][:after]) and done.versions is None
    from helpers.pausing_vllm import PausingVllmServer

    fake = PausingVllmServer()
    try:
        fake.post(proto.PAUSE_ABORT, {})  # queued while paused: aborted with no token
        job = ThreadPoolExecutor(1).submit(fake.complete, [1, 2, 3], 5)
        while not fake.held:
            time.sleep(0.01)
        fake.post(proto.ABORT_REQUESTS, {})
        answer = job.result(timeout=10)
    finally:
        fake.close()
    theirs, ours = resp.json()["choices"][0], answer["choices"][0]
    assert set(ours) <= set(theirs) and ours["finish_reason"] == theirs["finish_reason"]
