"""The data: problem files (JSONL with `problem` and `answer`), the prompt each problem becomes,
and the seeded, endless stream of training prompts. Shared by train.py and eval.py, so a checkpoint
is evaluated the way it was trained."""
import json
import os

import numpy as np

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


def load_rows(path, cfg, tokenizer, rank):
    """The rows of a JSONL data file whose prompt fits max_prompt_len, each with its prompt text.

    Longer prompts are dropped (and counted on the console): the engine's context is
    max_prompt_len + max_new_tokens, so they could not be sampled. Held-out accuracy is then over
    the rows kept. -> (rows, number dropped)
    """
    rows = load_problems(path)
    kept = []
    for row in rows:
        row["prompt"] = build_prompt(tokenizer, row["problem"], cfg.prompt_template)
        if len(tokenizer(row["prompt"]).input_ids) <= cfg.max_prompt_len:
            kept.append(row)
    if not kept:
        raise ValueError(f"{path}: no prompt fits max_prompt_len={cfg.max_prompt_len}")
    if rank == 0 and len(kept) < len(rows):
        print(f"{path}: dropped {len(rows) - len(kept)} of {len(rows)} prompts longer than "
              f"max_prompt_len={cfg.max_prompt_len}")
    return kept, len(rows) - len(kept)


def resolve_model(name):
    """A local directory for `model`: itself if it is one, else the hub's snapshot of it (downloaded
    once into the Hugging Face cache; ranks that start together share the download's locks)."""
    if os.path.isdir(name):
        return name
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise FileNotFoundError(f"model directory not found: {name}")
    from huggingface_hub import snapshot_download
    try:
        return snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.txt",
                                                       "*.model", "*.tiktoken", "*.jinja"])
    except Exception as e:
        raise FileNotFoundError(f"model {name!r} is not a local directory, and the hub did not "
                                f"give it ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


def take_prompts(rows, pos, count, seed):
    """Rows pos .. pos+count of an endless stream: the data set reshuffled each epoch, seeded."""
    out = []
    for p in range(pos, pos + count):
        epoch, i = divmod(p, len(rows))
        order = np.random.default_rng([seed, epoch]).permutation(len(rows))
        out.append(rows[order[i]])
    return out
