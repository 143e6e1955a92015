"""The steps of the weight-update modes that the backends share (frlab.rollout.weight_modes):
continuing a request after a resubmit abort, reading token versions from labelled spans, and
the drain wait."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from frlab.defaults import sampling_params
from frlab.rollout.engine import SEED_LIMIT, EngineError, SamplingParams
from frlab.rollout.weight_modes import (
    Fragment,
    continue_after_abort,
    rest_params,
    span_versions,
    wait_drained,
)

PROMPT = [3, 4]


def scripted(*parts: tuple[list[int], str]):  # noqa: ANN201
    """A submit answering `parts` in turn (version = the part's index); records what it got."""
    sent: list[tuple[list[int], SamplingParams]] = []

    async def submit(context: list[int], params: SamplingParams) -> Fragment:
        tokens, reason = parts[len(sent)]
        version = len(sent)
        sent.append((context, params))
        return Fragment(tokens, [-0.5] * len(tokens), [version] * len(tokens), reason)

    return submit, sent


def test_an_aborted_request_goes_on_with_the_rest_of_its_budget() -> None:
    submit, sent = scripted(([5, 6], "abort"), ([], "abort"), ([7, 8], "length"))
    aborts: list[int] = []
    params = sampling_params(max_new_tokens=4, seed=9)
    res = asyncio.run(continue_after_abort(submit, PROMPT, params, lambda: aborts.append(1)))
    assert (res.token_ids, res.versions, res.finish_reason) == (
        [5, 6, 7, 8],
        [0, 0, 2, 2],
        "length",
    )
    assert [(c, p.max_new_tokens, p.seed) for c, p in sent] == [
        (PROMPT, 4, 9),
        ([*PROMPT, 5, 6], 2, 11),
        ([*PROMPT, 5, 6], 2, 11),
    ]
    assert len(aborts) == 2


@pytest.mark.parametrize(("tokens", "reason"), [([5, 6, 7], "length"), ([5, 2], "stop")])
def test_an_abort_that_ends_the_request_is_not_sent_again(tokens: list[int], reason: str) -> None:
    """Aborted with its budget spent it ends as `length`; after a stop token, as `stop`."""
    submit, sent = scripted((tokens, "abort"))
    params = sampling_params(max_new_tokens=3, stop_token_ids=(2,))
    res = asyncio.run(continue_after_abort(submit, PROMPT, params))
    assert (res.token_ids, res.finish_reason, len(sent)) == (tokens, reason, 1)


def test_a_fragment_that_ends_on_its_own_ends_the_request() -> None:
    submit, sent = scripted(([5, 2], "stop"))
    res = asyncio.run(continue_after_abort(submit, PROMPT, sampling_params(stop_token_ids=(2,))))
    assert (res.token_ids, res.log_probs, res.finish_reason) == ([5, 2], [-0.5, -0.5], "stop")
    assert sent[0][1] == sampling_params(stop_token_ids=(2,))  # the first one as asked


def test_the_rest_of_a_request_moves_its_own_seed_on() -> None:
    assert rest_params(sampling_params(max_new_tokens=5, seed=1), 0).seed == 1
    assert rest_params(sampling_params(max_new_tokens=5, seed=1), 2) == sampling_params(
        max_new_tokens=3, seed=3
    )
    assert rest_params(sampling_params(max_new_tokens=5, seed=SEED_LIMIT - 1), 2).seed == 1
    assert rest_params(sampling_params(max_new_tokens=5), 2).seed is None  # the engine's stream


def triple(span: dict) -> tuple:
    return span["v"], span["s"], span["e"]


def test_spans_give_one_version_per_token() -> None:
    spans = [{"v": "4", "s": 0, "e": 1}, {"v": "5", "s": 1, "e": 1}, {"v": "5", "s": 1, "e": 3}]
    assert span_versions(spans, 3, triple) == [4, 5, 5]
    assert span_versions((), 0, triple) == [] == span_versions(None, 0, triple)


@pytest.mark.parametrize(
    ("spans", "why"),
    [
        (None, "no token is labelled"),
        ("0-3", "must be a list"),
        ([{"v": "default", "s": 0, "e": 3}], "not frlab's version"),  # the label was never set
        ([{"v": 3, "s": 0, "e": 3}], "not frlab's version"),
        ([{"v": "-1", "s": 0, "e": 3}], "not frlab's version"),
        ([{"v": "0", "s": 0, "e": 2}], "cover 2 of 3"),
        ([{"v": "0", "s": 0, "e": 2}, {"v": "1", "s": 1, "e": 3}], "do not tile"),  # overlap
        ([{"v": "0", "s": 1, "e": 3}], "do not tile"),  # a gap at the start
        ([{"v": "0", "s": 0, "e": 3.0}], "do not tile"),
        ([{"v": "0", "s": 2, "e": 1}], "do not tile"),
    ],
)
def test_spans_that_do_not_label_every_token_exactly_are_refused(spans: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        span_versions(spans, 3, triple)


def test_a_drain_returns_once_nothing_decodes() -> None:
    counts = iter([-1, 2, 1, 0])  # -1: not reported yet
    waits: list[float] = []
    wait_drained(lambda: next(counts), waits.append, deadline_s=60)
    assert len(waits) == 3 and all(0 < w <= 60 for w in waits)


def test_a_drain_past_its_deadline_names_the_requests_still_decoding() -> None:
    with pytest.raises(EngineError, match=r"\(drain\): 2 requests still decoding after 0 s"):
        wait_drained(lambda: 2, time.sleep, deadline_s=0.01)
    with pytest.raises(EngineError, match=r"\(drain\): requests still decoding"):
        wait_drained(lambda: -1, time.sleep, deadline_s=0.01)


def test_a_drain_stops_at_once_when_the_worker_is_gone() -> None:
    looks = itertools.count()
    with pytest.raises(EngineError, match="the worker is gone"):
        wait_drained(
            lambda: 1, lambda s: None, down=lambda: "the worker is gone" if next(looks) else None
        )
    assert next(looks) == 2  # the second look saw it
