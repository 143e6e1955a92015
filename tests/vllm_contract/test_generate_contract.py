"""What an in_flight weight update of the `remote` engine asks a vLLM server, answered by
vLLM's own application (tests/helpers/vllm_app.py): the label probe reads the
routes from vLLM's `/openapi.json` (listed only with `--enable-scale-out` on 0.32+), `POST
/update_weight_version` sets the label, `POST /pause?mode=keep` reaches
`pause_generation(mode="keep")`, and a `POST /inference/v1/generate` body built by frlab is
parsed by vLLM's request model into the sampling frlab asked for, its answer's version spans
read by frlab's parser. The CPU fake `LabellingVllmServer` (tests/rollout/remote) answers
alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.vllm_contract import tiny_model

from frlab.defaults import sampling_params
from frlab.rollout.remote import generate as gen
from frlab.rollout.remote import protocol as proto

pytestmark = pytest.mark.vllm_contract
PARAMS = sampling_params(max_new_tokens=5, temperature=0.7, top_p=0.9, top_k=8, stop_token_ids=(9,))


def app(tmp: Path, *flags: str) -> Any:
    from helpers.vllm_app import VllmAppServer

    server = VllmAppServer(str(tiny_model(tmp / "tiny")), *flags)
    server.start()
    return server


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("vllm.entrypoints.rl.online.api_router", reason="vLLM < 0.32")
    server = app(tmp_path_factory.mktemp("labelled"), "--enable-scale-out")
    yield server
    server.close()


@pytest.fixture(scope="module")
def fake() -> Iterator[Any]:
    from helpers.labelling_vllm import LabellingVllmServer

    server = LabellingVllmServer(step_s=0.001)
    yield server
    server.close()


def post(url: str, path: str, body: Any) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=30.0, trust_env=False)


def openapi(url: str) -> Any:
    return httpx.get(url + gen.OPENAPI, timeout=30.0, trust_env=False).json()


def labels(server: Any, url: str) -> bool:
    """What the engine's probe concludes: the routes, then a one-token answer with spans."""
    if not gen.offers_labels(openapi(url)):
        return False
    resp = post(url, gen.GENERATE, gen.probe_request(server.args.model))
    return resp.status_code == 200 and gen.answers_labels(resp.json())


def test_the_probe_finds_labels_on_vllms_app_and_the_fake(labelled: Any, fake: Any) -> None:
    fake.args = labelled.args
    assert labels(labelled, labelled.url) and labels(fake, fake.url) and fake.probes == 1


def test_no_labels_without_scale_out_or_before_vllm_032(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Without `--enable-scale-out` (0.32+: the route is left out of the OpenAPI document),
    or on 0.28 (the routes are listed, its answers carry no spans) the probe says no, so
    in_flight refuses the server instead of trusting answers without labels."""
    server = app(tmp_path_factory.mktemp("plain"))
    try:
        assert not labels(server, server.url)
    finally:
        server.close()


def test_the_label_is_set_as_vllm_sets_it(labelled: Any, fake: Any) -> None:
    for url in (labelled.url, fake.url):
        resp = post(url, gen.UPDATE_WEIGHT_VERSION, gen.label_request(3))
        assert resp.status_code == 200 and gen.label_set(resp.json(), 3), resp.text
        assert not gen.label_set(resp.json(), 4)
    assert labelled.client.weight_version == "3" and fake.label == "3"
    assert httpx.get(labelled.url + "/weight_info", timeout=30).json() == {"weight_version": "3"}


def test_pause_keep_reaches_vllms_keep_mode_without_clearing_the_cache(
    labelled: Any, fake: Any
) -> None:
    """clear_cache=false: the route's default (true) would preempt the frozen requests."""
    labelled.client.pauses.clear()
    labelled.client.clear_cache.clear()
    for url in (labelled.url, fake.url):
        assert post(url, gen.PAUSE_KEEP, {}).json() == {"status": "paused"}
        assert post(url, proto.RESUME, {}).json() == {"status": "resumed"}
    assert labelled.client.pauses == ["keep", "resume"] and labelled.client.clear_cache == [False]


def test_vllm_parses_the_generate_body_into_frlabs_sampling(labelled: Any) -> None:
    body = gen.generate_request(labelled.args.model, [1, 2, 3], PARAMS, seed=11)
    resp = post(labelled.url, gen.GENERATE, body)
    assert resp.status_code == 200, resp.text
    sp = labelled.client.sampling[-1]
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.top_k, sp.seed) == (5, 0.7, 0.9, 8, 11)
    assert (sp.min_p, sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty) == (
        0.0,
        1.0,
        0.0,
        0.0,
    )
    assert list(sp.stop_token_ids) == [9] and sp.ignore_eos and sp.logprobs == 1


@pytest.mark.parametrize("relabel_after", [None, 2])
def test_the_generate_answer_carries_versions_frlab_reads(
    labelled: Any, fake: Any, relabel_after: int | None
) -> None:
    post(labelled.url, gen.UPDATE_WEIGHT_VERSION, gen.label_request(3))
    labelled.client.relabel_after = relabel_after
    try:
        body = gen.generate_request(labelled.args.model, [1, 2, 3], PARAMS, seed=1)
        theirs = post(labelled.url, gen.GENERATE, body).json()
    finally:
        labelled.client.relabel_after = None
    done = gen.parse_generate(theirs)
    assert done.token_ids == [4, 5, 6, 7, 8] and done.finish_reason == "length"
    assert done.log_probs == pytest.approx([-0.5, -0.51, -0.52, -0.53, -0.54])
    assert done.versions == ([3] * 5 if relabel_after is None else [3, 3, 4, 4, 4])
    post(fake.url, gen.UPDATE_WEIGHT_VERSION, gen.label_request(3))
    ours = post(fake.url, gen.GENERATE, body).json()
    assert gen.parse_generate(ours).versions == [3] * 5
    assert set(ours) <= set(theirs) and set(ours["choices"][0]) <= set(theirs["choices"][0])
    span, fake_span = (
        theirs["choices"][0]["weight_versions"][0],
        ours["choices"][0]["weight_versions"][0],
    )
    assert set(span) == set(fake_span) and (span["version"], span["start"]) == ("3", 0)


def test_an_aborted_generate_answers_its_tokens_and_spans(labelled: Any) -> None:
    post(labelled.url, gen.UPDATE_WEIGHT_VERSION, gen.label_request(2))
    for after in (2, 0):
        labelled.client.abort_after = after
        try:
            body = gen.generate_request(labelled.args.model, [1, 2, 3], PARAMS, seed=1)
            done = gen.parse_generate(post(labelled.url, gen.GENERATE, body).json())
        finally:
            labelled.client.abort_after = None
        assert (done.finish_reason, done.token_ids, done.versions) == (
            "abort",
            [4, 5][:after],
            [2] * after,
        )
