"""What an honest server's answer can be, and the client's checks of every answer against it.

A generation server is another process on the network: its answer is input, never trusted.
Besides the shape checks of frlab.rollout.remote.protocol / .generate (one choice, ids, finite
log-probs <= 0, equal lengths), every answer to a generation request must hold at most the
tokens the request allowed (`max_tokens`), each an id the learner's model has
(`vocab_size`: the rows of its embedding and output layers), or it is malformed. A body is read
only up to the size no honest answer exceeds (`answer_bytes`: a fixed part plus a generous
per-token part for the prompt echoed back and the tokens sampled; `MAX_CONTROL_BYTES` for
the control plane) and only unencoded (the client asks for `identity`): a larger or encoded
body is refused (`AnswerRefused`, an httpx error the fleet treats as a faulty server) without
reading the rest into memory.
"""

from __future__ import annotations

from typing import Any

import httpx

from frlab.rollout.remote.protocol import Completion, MalformedResponse

MAX_CONTROL_BYTES = 16 * 2**20  # /server_info, /openapi.json, rpc answers: far below this
BASE_BYTES = 64 * 2**10  # ids, usage, model name, ... of one generation answer
# per token: its id, log-prob, `token_id:<id>` spelling, top-log-prob entry and text piece
# (vLLM's `text`: a vocabulary entry, at most a few hundred bytes even JSON-escaped)
PER_TOKEN_BYTES = 2048
IDENTITY = {"", "identity"}


class AnswerRefused(httpx.DecodingError):
    """A body no honest server sends (too large, or encoded although `identity` was asked)."""


def answer_bytes(prompt_tokens: int, max_tokens: int) -> int:
    """The most bytes an honest answer to a generation request can have."""
    return BASE_BYTES + PER_TOKEN_BYTES * (int(prompt_tokens) + int(max_tokens))


async def read_bounded(
    client: httpx.AsyncClient, method: str, url: str, max_bytes: int, **kw: Any
) -> httpx.Response:
    """Send one request and read its answer's body, at most `max_bytes` of it (AnswerRefused,
    the connection closed, beyond that or for an encoded body)."""
    request = client.build_request(method, url, **kw)
    resp = await client.send(request, stream=True)
    try:
        encoding = resp.headers.get("content-encoding", "").strip().lower()
        if encoding not in IDENTITY:
            raise AnswerRefused(
                f"{url} answered a {encoding!r}-encoded body, not asked for", request=request
            )
        declared = resp.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise AnswerRefused(
                f"{url} announced {declared} bytes, more than the {max_bytes} of any honest answer",
                request=request,
            )
        chunks, size = [], 0
        async for chunk in resp.aiter_bytes():  # unencoded: the bytes on the wire
            size += len(chunk)
            if size > max_bytes:
                raise AnswerRefused(
                    f"{url} answered more than the {max_bytes} bytes of any honest answer",
                    request=request,
                )
            chunks.append(chunk)
    finally:
        await resp.aclose()
    return httpx.Response(
        resp.status_code, headers=_plain(resp.headers), content=b"".join(chunks), request=request
    )


def _plain(headers: httpx.Headers) -> list[tuple[str, str]]:
    """The answer's headers without those describing the wire form of its body."""
    drop = {"content-encoding", "content-length", "transfer-encoding"}
    return [(k, v) for k, v in headers.multi_items() if k.lower() not in drop]


def check_tokens(done: Completion, max_tokens: int, vocab_size: int | None) -> None:
    """MalformedResponse unless the answer holds at most `max_tokens` tokens, each an id
    below `vocab_size` (when known)."""
    if len(done.token_ids) > int(max_tokens):
        raise MalformedResponse(
            f"the answer holds {len(done.token_ids)} tokens, the request allowed {max_tokens}"
        )
    if vocab_size is not None:
        bad = [t for t in done.token_ids if not 0 <= t < vocab_size]
        if bad:
            raise MalformedResponse(
                f"token id {bad[0]} is outside the model's vocabulary of {vocab_size}"
            )


def model_vocab_size(policy: Any) -> int | None:
    """The ids a policy can embed and score: the rows of its input embedding and of its output
    layer, the smaller (None when it has neither)."""
    sizes = []
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        layer = getattr(policy, getter, lambda: None)()
        weight = getattr(layer, "weight", None)
        if weight is not None and getattr(weight, "dim", lambda: 0)() == 2:
            sizes.append(int(weight.shape[0]))
    if not sizes:
        size = getattr(getattr(policy, "config", None), "vocab_size", None)
        return int(size) if isinstance(size, int) else None
    return min(sizes)
