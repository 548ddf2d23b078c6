"""Rollout: the prompts the policy sees, and sampling them with vLLM (transformers as fallback).

(The engines land with the rollout issue; the prompt and data helpers below are shared by
train.py and eval.py, so a checkpoint is evaluated exactly the way it was trained.)
"""
import json
import os

# The instruction of Qwen2.5-Math and most R1-style math RL work.
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def build_prompt(tokenizer, problem, template=None):
    """The prompt text for one problem.

    `template`, if given, is a string with a `{problem}` placeholder (filled by plain replacement,
    so LaTeX braces in it need no escaping). Otherwise the tokenizer's chat template is used when
    it has one, with the problem and INSTRUCTION as the user's message; else a plain template.
    """
    if template is not None:
        return template.replace("{problem}", problem)
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": f"{problem}\n{INSTRUCTION}"}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{problem}\n{INSTRUCTION}\n"


def load_problems(path):
    """Read a JSONL file of {"problem": str, "answer": str, ...} rows; return the list of dicts.

    A missing file, a line that is not JSON, or a row without a non-empty `problem` or `answer`
    is a ValueError naming the file and line: silently skipping rows would change the data set.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file not found: {path}")
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            for key in ("problem", "answer"):
                value = row.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    row[key] = value = str(value)
                if not isinstance(value, str) or not value.strip():
                    raise ValueError(f"{path}:{lineno}: row has no '{key}' (keys: {sorted(row)})")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows
