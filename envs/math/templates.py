"""The math env's prompt templates by name, and `messages` (a task's own chat messages).

Kept free of imports so that frlab's preflight checks `eval.template` against these names
without loading the environment or its datasets (envs.math.env says what each one asks).
"""

TEMPLATES = {
    "instruct": (
        "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
    ),
    "base": (
        "Question: {question}\nPlease reason step by step, and put your final answer within "
        "\\boxed{{}}.\nAnswer: Let's think step by step."
    ),
}


MESSAGES = "messages"  # the template that sends a task's own chat messages
