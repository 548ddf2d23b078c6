"""The data: problem files (JSONL with `problem` and `answer`), the prompt each problem becomes,
and the seeded, endless stream of training prompts. Shared by train.py and eval.py, so a checkpoint
is evaluated the way it was trained."""
import json
import os

import numpy as np

from config import UserError

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

    A missing or empty file, a line that is not UTF-8 or not JSON, or a row without a non-empty
    string (or number) `problem` and `answer` is a UserError naming the file and line: silently
    skipping rows would change the data set.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file not found: {path}")
    rows = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UserError(f"{path}:{lineno}: not UTF-8 (byte {raw[e.start]:#04x} at column "
                                f"{e.start + 1})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise UserError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            for key in ("problem", "answer"):
                value = row.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    row[key] = value = str(value)
                if key in row and not isinstance(value, str):
                    raise UserError(f"{path}:{lineno}: '{key}' must be a string or a number, got "
                                    f"{type(value).__name__} {json.dumps(value)[:60]}")
                if not isinstance(value, str) or not value.strip():
                    raise UserError(f"{path}:{lineno}: row has no '{key}' (keys: {sorted(row)})")
            rows.append(row)
    if not rows:
        raise UserError(f"{path}: no rows (the file is empty)")
    return rows


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def load_tokenizer(model_dir):
    """The tokenizer of a model directory, or a UserError when it has no tokenizer files (transformers
    would fall back to something that encodes every prompt as nothing). A missing pad token is not
    an error: nothing here pads with it (the hf engine pads with a stop id, the trainer masks)."""
    from transformers import AutoTokenizer
    if not any(os.path.isfile(os.path.join(model_dir, f)) for f in TOKENIZER_FILES):
        raise UserError(f"model directory {model_dir} has no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    try:
        return AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as e:
        raise UserError(f"model directory {model_dir}: cannot load its tokenizer "
                        f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


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
        raise UserError(f"{path}: no prompt fits max_prompt_len={cfg.max_prompt_len} tokens (the shortest "
                        f"has {min(len(tokenizer(r['prompt']).input_ids) for r in rows)})")
    if rank == 0 and len(kept) < len(rows):
        print(f"{path}: dropped {len(rows) - len(kept)} of {len(rows)} prompts longer than "
              f"max_prompt_len={cfg.max_prompt_len}")
    return kept, len(rows) - len(kept)


def resolve_model(name):
    """A local directory for `model`: itself if it is one, else the hub's snapshot of it (downloaded
    once into the Hugging Face cache; ranks that start together share the download's locks)."""
    if os.path.isdir(name):
        if not os.path.isfile(os.path.join(name, "config.json")):
            raise UserError(f"model directory {name} has no config.json")
        return name
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise FileNotFoundError(f"model directory not found: {name}")
    from huggingface_hub import snapshot_download
    try:
        return snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.txt",
                                                       "*.model", "*.tiktoken", "*.jinja"])
    except Exception as e:
        raise UserError(f"model {name!r} is not a local directory, and the hub did not "
                        f"give it ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None


def take_prompts(rows, pos, count, seed):
    """Rows pos .. pos+count of an endless stream: the data set reshuffled each epoch, seeded."""
    out = []
    for p in range(pos, pos + count):
        epoch, i = divmod(p, len(rows))
        order = np.random.default_rng([seed, epoch]).permutation(len(rows))
        out.append(rows[order[i]])
    return out
