"""frlab: a Lightning + Hydra framework for FlashREINFORCE.

Critic-free, one-rollout-per-prompt, asynchronous RL for agentic language models.
Importing frlab is cheap and never imports vllm, alfworld or wandb.
"""

__version__ = "0.1.0"
