"""PythonToolEnv through the real agent loop: a scripted policy calls the tool, reads the output
as masked observation tokens, commits the answer; tool calls are summed per trajectory."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import string

from helpers.scripted_engine import ScriptedTextEngine
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from envs.python_tool import PythonToolEnv
from frlab.defaults import agent_loop_config, sampling_params
from frlab.rollout.agent_loop import run_episode

EOS = "<|end|>"
TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '<|end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def char_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level over printable ASCII (tool-call JSON needs braces and quotes)."""
    special = ["<pad>", "<unk>", EOS, "<|system|>", "<|user|>", "<|assistant|>"]
    chars = sorted(set(string.printable))
    vocab = {tok: i for i, tok in enumerate(special + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=EOS,
        unk_token="<unk>",
        pad_token="<pad>",
        additional_special_tokens=special[3:],
    )
    tok.chat_template = TEMPLATE
    return tok


def play(turns: list[str], max_turns: int = 4) -> tuple[object, PreTrainedTokenizerFast]:
    tok = char_tokenizer()
    env = PythonToolEnv(max_turns=max_turns, timeout_s=5.0)
    cfg = agent_loop_config(
        max_turns=max_turns,
        max_len=4096,
        sampling=sampling_params(max_new_tokens=512, stop_token_ids=(tok.eos_token_id,)),
    )
    task = {"question": "What is 6 times 7?", "answer": "42"}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        traj = asyncio.run(
            run_episode(
                ScriptedTextEngine(tok, turns), env, task, tok, cfg, prompt_id=0, executor=pool
            )
        )
    return traj, tok


def test_tool_call_then_answer_through_the_agent_loop() -> None:
    call = json.dumps({"name": "python", "arguments": {"code": "print(6 * 7)"}})
    traj, tok = play([f"<tool_call>{call}</tool_call>", "<answer>42</answer>"])
    assert traj.reward == 1.0 and not traj.truncated
    assert traj.info["tool_calls"] == 1 and traj.info["turns"] == 2
    assert traj.info["env"]["tool_calls_total"] == 1 and traj.info["env"]["end"] == "answer"
    observed = [t for t, m in zip(traj.token_ids, traj.action_mask, strict=True) if not m]
    acted = [t for t, m in zip(traj.token_ids, traj.action_mask, strict=True) if m]
    assert "<tool_response>\n42\n</tool_response>" in tok.decode(observed)
    assert "tool_response" not in tok.decode(acted)  # tool output is never an action token


def test_no_tool_call_ends_the_episode_unrewarded() -> None:
    traj, _ = play(["It is 42.", "<answer>42</answer>"])
    assert traj.reward == 0.0 and traj.info["turns"] == 1 and traj.info["tool_calls"] == 0
