"""The data: problem files (JSONL with `problem` and `answer`), the prompt each problem becomes,
and the seeded, endless stream of training prompts. Shared by train.py and eval.py, so a checkpoint
is evaluated the way it was trained."""
import json
import os

import numpy as np

from config import UserError

# The instruction of Qwen2.5-Math and most R1-style math RL work.
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


PROMPT_DATE = "26 Jul 2024"  # the date Llama 3.1's template writes when none is given


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
        # date_string: Llama 3's templates write a date into the system prompt, today's unless given
        # one, which would make a prompt (its ids, eval.py's protocol) depend on the day it is built
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             date_string=PROMPT_DATE)
    return f"{problem}\n{INSTRUCTION}\n"


def encode_prompt(tokenizer, problem, template=None):
    """One problem's prompt as (text, token ids): build_prompt's text, and the ids that training,
    sampling and evaluation all give the model. A chat template's prompt gets exactly the special
    tokens the template writes: Llama 3's and Gemma 3's write `{{ bos_token }}`, and tokenizing
    their text with the tokenizer's special tokens would put a second BOS before it. A plain prompt
    gets those its tokenizer adds (prompt_ids)."""
    text = build_prompt(tokenizer, problem, template)
    if template is None and getattr(tokenizer, "chat_template", None):
        return text, tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    return text, prompt_ids(tokenizer, text)


def prompt_ids(tokenizer, text):
    """The token ids of a plain prompt text: with the special tokens its tokenizer adds (its BOS),
    unless the text already begins with the BOS (a template that writes it), which gets no second."""
    bos = getattr(tokenizer, "bos_token", None)
    written = bool(bos) and text.startswith(bos)
    # verbose=False: transformers would warn of the tokenizer's model_max_length, which need not be
    # the model's context (the demo's: 4,096 and 512)
    return tokenizer(text, add_special_tokens=not written, verbose=False)["input_ids"]


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
    """The rows of a JSONL data file whose prompt fits max_prompt_len, each with its prompt's text
    and token ids (encode_prompt: "prompt", "prompt_ids").

    Longer prompts are dropped (and counted on the console): the engine's context is
    max_prompt_len + max_new_tokens, so they could not be sampled. Held-out accuracy is then over
    the rows kept. -> (rows, number dropped)
    """
    rows = load_problems(path)
    kept = []
    for row in rows:
        row["prompt"], row["prompt_ids"] = encode_prompt(tokenizer, row["problem"], cfg.prompt_template)
        if len(row["prompt_ids"]) <= cfg.max_prompt_len:
            kept.append(row)
    if not kept:
        raise UserError(f"{path}: no prompt fits max_prompt_len={cfg.max_prompt_len} tokens (the shortest "
                        f"has {min(len(r['prompt_ids']) for r in rows)})")
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
        raise FileNotFoundError(f"model directory not found: {name} (give a directory with config.json, "
                                f"weights and tokenizer, or a hub name such as Qwen/Qwen2.5-Math-1.5B)")
    from huggingface_hub import snapshot_download
    try:
        return snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.txt",
                                                       "*.model", "*.tiktoken", "*.jinja"])
    except Exception as e:
        raise UserError(f"model {name!r} is not a local directory, and the hub did not give it "
                        f"({type(e).__name__}: {str(e).splitlines()[0][:200]}): download it where the "
                        f"hub is reachable (`hf download {name} --local-dir DIR`) and give the "
                        f"directory (`--set model=DIR`)") from None


def take_prompts(rows, pos, count, seed):
    """Rows pos .. pos+count of an endless stream: the data set reshuffled each epoch, seeded."""
    out = []
    for p in range(pos, pos + count):
        epoch, i = divmod(p, len(rows))
        order = np.random.default_rng([seed, epoch]).permutation(len(rows))
        out.append(rows[order[i]])
    return out


# ----------------------------------------------------------------------------- fetching the data
# `python data.py fetch [NAME ...] --out DIR [--mirror URL]`: each file of this project's schema,
# converted from a raw file of a public repository at a pinned commit, checked by its SHA-256 (the
# digest of the upstream bytes, pinned here). The rules are those of the converted copies the
# project is tested against: rows keep the upstream order, only the answer is normalised.

GITHUB_RAW = "https://raw.githubusercontent.com"
QWEN = ("QwenLM/Qwen2.5-Math", "a45202bd16f1ec06f433442dc1152d0074773465")


def _int_answer(row):
    """AIME: '025' -> '25' (answers are integers 0-999, some files pad them)."""
    return str(int(row["answer"]))


def _whole_answer(row):
    """AMC 23 stores answers as floats: 27.0 -> '27'; a non-whole one stays as written."""
    value = float(row["answer"])
    return str(int(value)) if value.is_integer() else str(row["answer"])


def last_boxed(text):
    """The content of the last \\boxed{...} in `text` (braces matched), stripped; None if none."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j].strip()
    return None


def _gsm8k_answer(row):
    """GSM8K's solution ends with '#### 1,234': the number, without its thousands commas."""
    if "####" not in row["answer"]:
        return None
    return row["answer"].split("####")[-1].strip().replace(",", "")


# name -> (file written, repository, commit, path in it, SHA-256 of the raw file, problem key,
#          answer rule (row -> str or None), extra keys kept)
SOURCES = {
    "math_train": ("math_train.jsonl", "agentica-project/deepscaler", "95ef74ffee001cce89463f2d61dfdce1d03576c1",
                   "deepscaler/data/train/math.json",
                   "569230b362fd501e1a33d8f29aae3b4b989d32e2b91b07c3f48493528c3bf6d2",
                   "problem", None, ("difficulty", "type")),
    "math500": ("math500.jsonl", "hkust-nlp/simpleRL-reason", "cf1c7858bfc145a27aa733e75d930d34f0d318a6",
                "examples/simplelr_math_eval/data/math500/test.jsonl",
                "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132",
                "problem", None, ("level", "subject", "unique_id")),
    "aime24": ("aime24.jsonl", *QWEN, "evaluation/data/aime24/test.jsonl",
               "af2b8bd2aa911b6333ad0df32f3ca05c7ae8ed10f1731f4372c8ae26990bf7ac",
               "problem", _int_answer, ("id", "url")),
    "aime25": ("aime25.jsonl", "inclusionAI/AReaL", "f55fe685c661b0117d888fcae47d6f46e9a85087",
               "evaluation/data/aime25/test.jsonl",
               "b4e273c02d3e7fe1b74b59eae768fc8230bfb0f79539890cb56f4361caac0331",
               "problem", _int_answer, ("id",)),
    "amc23": ("amc23.jsonl", *QWEN, "evaluation/data/amc23/test.jsonl",
              "43707e1ca784602d8479de24ee8ce36609dbebc46dd152b0b12a46611aa898a4",
              "question", _whole_answer, ("id", "url")),
    "minerva": ("minerva_math.jsonl", *QWEN, "evaluation/data/minerva_math/test.jsonl",
                "0e656b430d3a0a1dab6aa853f453ba3805e28e2cabe4fc72486a897cc09d8ba2",
                "problem", lambda row: last_boxed(row.get("solution") or ""), ("type", "idx")),
    "olympiadbench": ("olympiadbench.jsonl", *QWEN, "evaluation/data/olympiadbench/test.jsonl",
                      "bb8c1e38a16ea9eacb77530315a674d883f267fbff79183effc53681b4fcc416",
                      "question", lambda row: ",".join(a.replace("$", "").strip()
                                                       for a in row["final_answer"]) or None,
                      ("id", "subfield", "answer_type", "unit")),
    "gsm8k": ("gsm8k_test.jsonl", *QWEN, "evaluation/data/gsm8k/test.jsonl",
              "9f098df7ff4522078d6ccec27a5c38a454790fdb51131bedfaa0e490070d5394",
              "question", _gsm8k_answer, ("idx",)),
}
# name -> SHA-256 of the converted file fetch writes: a file in out_dir with this digest is
# up to date, and nothing is downloaded for it (the raw file need not be kept).
CONVERTED_SHA256 = {
    "math_train": "9fd74faeb4b99ccf2bfc89b79fe99456474215ed8e12a288dbbd2d8e7457a150",
    "math500": "ae52846bb9d36419a12cfd43eb17fae28de7b18f69fbc7e3cb51ea4528bdb816",
    "aime24": "b6a88929acdc4b124cf6be58c84572b40036db71e42e86cf1c98e1d8cd93e713",
    "aime25": "ebb0a0a8a90ca1e9bdabd0bb1901645b63b47a6f5444dc8f1ad0e8bcbb8cc1c6",
    "amc23": "985a2f3c8c3d24a0e17b4735cd6a7a48580a105fdc1ce8c010a81969c09388a0",
    "minerva": "cc489d516808aab5236d412d321f5a2c529f99def38e8cf635214e2a590e9ce4",
    "olympiadbench": "ed49c2ca9abd47afa95fde8266479ce9456a5c675463c07dbd63f011e6211d7f",
    "gsm8k": "1281a30832d788fd63df93217a863406718d7be470bc069373211b508d344549",
}
FETCH_TIMEOUT_S, FETCH_TRIES = 30, 3


def convert(name, raw):
    """The rows of dataset `name` from its raw upstream bytes, in this project's schema.

    `problem` and `answer` (normalised by the dataset's rule; `answer_raw` keeps the original where
    it differs), `source` as "<repository>:<path>@<commit>", and the dataset's useful extra keys.
    MATH train drops the 4 rows whose answer is null or empty, as DeepScaleR's own loader does; in
    any other file a row without a problem or an answer is a UserError naming the file and row
    (1-based): a silently shorter benchmark is a different benchmark.
    """
    file, repo, commit, path, _, problem_key, rule, extra = SOURCES[name]
    where = f"{repo}/{commit}/{path}"
    try:
        text = raw.decode("utf-8")
        upstream = json.loads(text) if path.endswith(".json") else \
            [json.loads(line) for line in text.splitlines() if line.strip()]
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{where}: not UTF-8 JSON ({e})") from None
    rows = []
    for i, row in enumerate(upstream, 1):
        problem = row.get(problem_key) if isinstance(row, dict) else None
        try:
            answer = (rule(row) if rule else row.get("answer")) if isinstance(row, dict) else None
        except (KeyError, TypeError, ValueError):
            answer = None
        if name == "math_train" and isinstance(row, dict) and not row.get("answer"):
            continue
        if not isinstance(problem, str) or not problem.strip() or not isinstance(answer, str) \
                or not answer.strip():
            raise UserError(f"{where}: row {i} has no {problem_key!r} or no answer "
                            f"({json.dumps(row)[:120]})")
        out = {"problem": problem, "answer": answer}
        raw_answer = row.get("final_answer", row.get("answer")) if name != "gsm8k" else None
        if rule and raw_answer is not None and str(raw_answer) != answer:
            out["answer_raw"] = raw_answer  # AIME '025', AMC 27.0, OlympiadBench ['$x$']
        out["source"] = f"{repo}:{path}@{commit}"
        out.update({k: row[k] for k in extra if k in row})
        rows.append(out)
    return rows


def _download(url, desc):
    """The body at `url` (a tqdm bar per file) -> (body, None, True), or (None, why, answered) once
    FETCH_TRIES attempts failed: why (the last failure), and whether the host answered at all (an
    HTTP status, a body cut short) rather than not being reached. A body shorter than its
    Content-Length is a failed attempt (urllib would hand it over as it is)."""
    import time
    import urllib.error
    import urllib.request
    from tqdm import tqdm
    why, answered = None, False
    for attempt in range(FETCH_TRIES):
        if attempt:
            time.sleep(2 ** attempt)
        try:
            with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as resp:
                size = int(resp.headers.get("Content-Length") or 0) or None
                parts = []
                with tqdm(total=size, desc=desc, unit="B", unit_scale=True, leave=False) as bar:
                    while chunk := resp.read(1 << 16):
                        parts.append(chunk)
                        bar.update(len(chunk))
                body = b"".join(parts)
            if size is not None and len(body) != size:
                answered = True
                raise OSError(f"truncated: got {len(body)} of {size} bytes")
            return body, None, True
        except urllib.error.HTTPError as e:
            why, answered = f"HTTP {e.code} {e.reason}", True
            if 400 <= e.code < 500 and e.code != 429:
                break  # a missing file stays missing
        except (OSError, ValueError) as e:  # URLError, timeouts, resets, IncompleteRead
            why = str(getattr(e, "reason", None) or e)
    return None, f"{why}; {attempt + 1} tries", answered


def fetch(names, out_dir, mirror=GITHUB_RAW):
    """Write each dataset of `names` into `out_dir`, checked and converted; -> {name: rows}.

    A converted file already in `out_dir` with its pinned digest (CONVERTED_SHA256) is up to date:
    nothing is downloaded for it. Else the raw file is taken from
    `<out_dir>/upstream/<repo>/<commit>/<path>` when it is there with the pinned digest (put there
    by hand where the network cannot reach the source), or downloaded from
    `<mirror>/<repo>/<commit>/<path>` and kept there. Every file is written whole or not at all (a
    temporary file renamed into place), so an error leaves nothing partial behind. The files that
    cannot be downloaded are named together in one UserError (missing_files), the others written;
    once the host is not reached at all, the rest are not tried.
    """
    import hashlib
    written, missing, unreached = {}, [], None
    for name in names:
        file, repo, commit, path, digest = SOURCES[name][:5]
        target = os.path.join(out_dir, file)
        if os.path.isfile(target):
            body = open(target, "rb").read()
            if hashlib.sha256(body).hexdigest() == CONVERTED_SHA256[name]:
                written[name] = [json.loads(line) for line in body.decode("utf-8").splitlines()]
                print(f"{name}: {len(written[name])} rows (up to date) -> {target}", flush=True)
                continue
        url = f"{mirror.rstrip('/')}/{repo}/{commit}/{path}"
        cached = os.path.join(out_dir, "upstream", repo, commit, path)
        raw = open(cached, "rb").read() if os.path.isfile(cached) else None
        if raw is None or hashlib.sha256(raw).hexdigest() != digest:
            if unreached:
                missing.append((name, None))
                continue
            raw, why, answered = _download(url, file)
            if raw is None:
                missing.append((name, why if answered else None))
                unreached = None if answered else why
                continue
            got = hashlib.sha256(raw).hexdigest()
            if got != digest:
                page = " (an HTML page, not the data)" if raw.lstrip()[:1] == b"<" else ""
                raise UserError(f"{url}: SHA-256 {got} is not the pinned {digest}{page}: the file is "
                                f"corrupt or not the pinned version; nothing was written")
            rows = convert(name, raw)  # a malformed row fails before anything is written
            _write_atomic(cached, raw)
        rows = convert(name, raw)
        _write_atomic(target, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8"))
        print(f"{name}: {len(rows)} rows -> {target}", flush=True)
        written[name] = rows
    if missing:
        raise UserError(missing_files(missing, len(names), out_dir, mirror, unreached))
    return written


def missing_files(missing, wanted, out_dir, mirror, unreached):
    """fetch's error for the files it could not download, [(name, why it failed, or None where the
    host was not reached)], of `wanted` files: every source URL and the path where a copy downloaded by
    hand is taken from, and the two ways on (--mirror, or by hand)."""
    head = (f"could not reach {mirror} ({unreached})" if unreached else
            f"could not download {len(missing)} of the {wanted} data files from {mirror}")
    lines = [f"  {GITHUB_RAW}/{repo}/{commit}/{path} -> {os.path.join(out_dir, 'upstream', repo, commit, path)}"
             + (f" ({why})" if why else "")
             for name, why in missing for repo, commit, path in [SOURCES[name][1:4]]]
    return (f"{head}: {len(missing)} data file(s) missing. Name a host that has them, laid out as "
            f"<repo>/<commit>/<path>, with --mirror URL; or download each by hand to the path after its "
            f"arrow (its SHA-256 is checked), then run this again:\n" + "\n".join(lines))


def _write_atomic(path, body):
    """Write `body` to `path` through a temporary file in the same directory and a rename."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def main(argv=None):
    """`python data.py fetch [NAME ...] --out DIR [--mirror URL]`; a NAME may also be its file's stem
    (minerva_math, gsm8k_test), as eval.py names a --data file."""
    import argparse
    import sys
    stems = {os.path.splitext(s[0])[0]: n for n, s in SOURCES.items() if os.path.splitext(s[0])[0] != n}
    ap = argparse.ArgumentParser(description="Fetch the math data sets from pinned public sources.")
    sub = ap.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch", help="download, check (SHA-256), convert and write the data sets")
    f.add_argument("names", nargs="*", metavar="NAME",
                   help=f"data sets to fetch (default: all): {' '.join(SOURCES)}; or their files' stems")
    f.add_argument("--out", default="data", help="directory written (default: data/)")
    f.add_argument("--mirror", default=GITHUB_RAW,
                   help=f"base URL laid out as <repo>/<commit>/<path> (default: {GITHUB_RAW})")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in SOURCES and n not in stems]
    if unknown:
        f.error(f"unknown data set(s) {unknown}; known: {' '.join(SOURCES)} (or the stems of their "
                f"files: {' '.join(stems)})")
    names = list(dict.fromkeys(stems.get(n, n) for n in args.names)) or list(SOURCES)
    try:
        fetch(names, args.out, args.mirror)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
