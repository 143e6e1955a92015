"""System-prompt settings when the chat template is applied: default, none, or a text.

`none` must remove the system turn that templates inject by themselves (SmolLM2 and Qwen add
a default one to a conversation without a system message) and keep a conversation-level BOS
(Llama-3's `<|begin_of_text|>`); the rendered ids are checked token by token against
the template applied by hand to the conversation it should produce.
"""

from __future__ import annotations

import asyncio

import pytest
from test_agent_loop import EOS, TOK, ScriptedEngine

from envs.base import check_system_prompt
from envs.math import MathEnv
from frlab.defaults import agent_loop_config, sampling_params
from frlab.model.toy_tokenizer import build_toy_tokenizer
from frlab.rollout.agent_loop import run_episode
from frlab.rollout.chat import render_without_system, template_ids, with_system_prompt

USER = [{"role": "user", "content": "what is 2+3?"}]
# A ChatML template that injects a default system turn, as SmolLM2's and Qwen2.5's do.
CHATML_DEFAULT = (
    "{% for m in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|system|>be nice<|end|>' }}{% endif %}"
    "{{ '<|' + m['role'] + '|>' + m['content'] + '<|end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
# Llama-3 style: one BOS for the whole conversation, then the turns.
BOS_FIRST = (
    "{{ bos_token }}{% for m in messages %}{% if loop.first and m['role'] != 'system' %}"
    "{{ '<|system|>be nice<|end|>' }}{% endif %}"
    "{{ '<|' + m['role'] + '|>' + m['content'] + '<|end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def tokenizer_with(template: str):
    tok = build_toy_tokenizer()
    tok.chat_template = template
    return tok


def ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_default_keeps_the_templates_own_system_turn() -> None:
    tok = tokenizer_with(CHATML_DEFAULT)
    expected = ids(tok, "<|system|>be nice<|end|><|user|>what is 2+3?<|end|><|assistant|>")
    assert template_ids(tok, USER) == template_ids(tok, USER, "default") == expected


def test_none_removes_the_injected_system_turn() -> None:
    tok = tokenizer_with(CHATML_DEFAULT)
    assert template_ids(tok, USER, "none") == ids(tok, "<|user|>what is 2+3?<|end|><|assistant|>")
    env_system = [{"role": "system", "content": "env says"}, *USER]
    assert template_ids(tok, env_system, "none") == template_ids(tok, USER, "none")


def test_none_keeps_a_conversation_level_bos() -> None:
    tok = tokenizer_with(BOS_FIRST)
    text = render_without_system(tok, USER)
    assert text == "<bos><|user|>what is 2+3?<|end|><|assistant|>"
    assert template_ids(tok, USER, "none")[0] == tok.bos_token_id


def test_a_text_becomes_the_system_turn() -> None:
    tok = tokenizer_with(CHATML_DEFAULT)
    env_system = [{"role": "system", "content": "env says"}, *USER]
    want = ids(tok, "<|system|>answer briefly<|end|><|user|>what is 2+3?<|end|><|assistant|>")
    assert template_ids(tok, USER, "answer briefly") == want
    assert template_ids(tok, env_system, "answer briefly") == want  # replaces the env's
    assert with_system_prompt(env_system, "default") == env_system


def test_a_template_without_a_system_turn_of_its_own_is_refused_for_none() -> None:
    no_system_turn = (  # the system text goes into the first user turn (Gemma-style)
        "{% for m in messages %}{% if m['role'] != 'system' %}{{ '<|' + m['role'] + '|>' }}"
        "{% if loop.index0 == 1 and messages[0]['role'] == 'system' %}"
        "{{ messages[0]['content'] + ' ' }}{% endif %}{{ m['content'] + '<|end|>' }}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
    )
    tok = tokenizer_with(no_system_turn)
    with pytest.raises(ValueError, match="system_prompt=none"):
        template_ids(tok, USER, "none")


def test_smollm2_none_drops_its_20_token_default() -> None:
    from frlab.model.gguf import cache_root

    folder = cache_root() / "models" / "smollm2-135m-instruct"
    if not (folder / "tokenizer.json").is_file():
        pytest.skip("the converted SmolLM2 folder is not in the frlab cache")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    default, none = template_ids(tok, USER), template_ids(tok, USER, "none")
    assert tok.decode(none) == "<|im_start|>user\nwhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    assert default[-len(none) :] == none and len(default) - len(none) == 21  # 20 + newline


def test_the_agent_loop_applies_the_envs_setting() -> None:
    tok = TOK
    env = MathEnv(
        dataset=[{"question": "2+3?", "answer": "5"}],
        template="{question}",
        system_prompt="be brief",
    )
    engine = ScriptedEngine([[EOS]])
    cfg = agent_loop_config(max_len=64, sampling=sampling_params(max_new_tokens=4))
    traj = asyncio.run(
        run_episode(engine, env, {"question": "2+3?", "answer": "5"}, tok, cfg, prompt_id=0)
    )
    prompt = engine.calls[0][0]
    assert tok.decode(prompt) == "<|system|>be brief<|end|><|user|>2+3?<|end|><|assistant|>"
    assert traj.token_ids[: len(prompt)] == prompt


@pytest.mark.parametrize("value", ["", "   ", None, 3])
def test_a_bad_setting_names_the_key(value: object) -> None:
    with pytest.raises(ValueError, match="env.system_prompt"):
        check_system_prompt(value)
    with pytest.raises(ValueError, match="env.system_prompt"):
        MathEnv(dataset=[{"question": "q", "answer": "1"}], system_prompt=value)  # type: ignore[arg-type]
