"""A prompt's token ids (data.encode_prompt), the same in training, sampling and evaluation: a chat
template's prompt has exactly the special tokens the template writes, a plain prompt the BOS its
tokenizer adds. Tested with a tokenizer as Llama 3's and Gemma 3's are: its chat template writes
`{{ bos_token }}` and its post-processor adds the BOS as well (tests/architectures.py gives every
architecture Qwen's tokenizer, which has no BOS, so nothing else sees a second one)."""
import copy
import json
import types

import pytest

import data
import eval as ev
import reward
import rollout
import train
from demo import EOS, PAD, make_char_tokenizer

BOS = "<|unused100|>"   # a token of the tiny model's vocabulary (128), made the BOS
BOS_ID = 100
CHAT = "{{ bos_token }}{% for m in messages %}U: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}A:{% endif %}"


def bos_tokenizer(chat_template=CHAT):
    """The demo's character tokenizer with a BOS that its post-processor adds, and a chat template
    that writes it."""
    from tokenizers import AddedToken
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast
    backend = copy.deepcopy(make_char_tokenizer(128).backend_tokenizer)
    backend.add_special_tokens([AddedToken(BOS, special=True)])
    backend.post_processor = TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A $B",
                                                special_tokens=[(BOS, BOS_ID)])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=BOS, eos_token=EOS, pad_token=PAD)
    tok.chat_template = chat_template
    assert tok.bos_token_id == BOS_ID and tok("ab")["input_ids"][0] == BOS_ID  # it adds the BOS
    return tok


def one_bos(ids):
    return ids[0] == BOS_ID and BOS_ID not in ids[1:]


def test_a_prompt_has_the_special_tokens_its_template_writes_once():
    tok = bos_tokenizer()
    text, ids = data.encode_prompt(tok, "1+1?")  # the chat template, which writes the BOS
    assert text.startswith(BOS + "U: 1+1?") and one_bos(ids)
    assert ids == [BOS_ID] + tok(text[len(BOS):], add_special_tokens=False)["input_ids"]
    text, ids = data.encode_prompt(tok, "1+1?", "Q: {problem}\nA:")  # a plain template: the tokenizer's BOS
    assert one_bos(ids) and ids[1:] == tok(text, add_special_tokens=False)["input_ids"]
    assert one_bos(data.encode_prompt(tok, "1+1?", BOS + "Q: {problem}\nA:")[1])  # one that writes it
    plain = bos_tokenizer(chat_template=None)
    text, ids = data.encode_prompt(plain, "1+1?")  # no chat template: problem and instruction
    assert text == f"1+1?\n{data.INSTRUCTION}\n" and one_bos(ids)
    # a chat template that writes no BOS gets none: exactly what the template writes
    text, ids = data.encode_prompt(bos_tokenizer(chat_template=CHAT.replace("{{ bos_token }}", "")), "1+1?")
    assert BOS_ID not in ids and ids == tok(text, add_special_tokens=False)["input_ids"]


def test_a_template_that_writes_the_date_gives_one_prompt_whenever_it_is_built():
    """Llama 3.2's template writes today's date (strftime_now) into the system prompt unless given a
    date_string: a prompt, its ids and eval.py's protocol digest would depend on the day (here, the
    microsecond) it is built. build_prompt gives the template a fixed date."""
    dated = CHAT.replace("{{ bos_token }}", "{{ bos_token }}{% if date_string is not defined %}"
                         "{% set date_string = strftime_now('%d %b %Y %H:%M:%S.%f') %}{% endif %}"
                         "Today: {{ date_string }}\n")
    tok = bos_tokenizer(chat_template=dated)
    first = data.encode_prompt(tok, "1+1?")
    assert data.encode_prompt(tok, "1+1?") == first and f"Today: {data.PROMPT_DATE}" in first[0]


def test_qwens_prompt_is_as_before():
    """Qwen's tokenizer adds nothing and its template writes no BOS: the ids of before."""
    from qwen_math import TOKENIZER_DIR, need_shared
    need_shared(TOKENIZER_DIR)
    tok = data.load_tokenizer(TOKENIZER_DIR)
    text, ids = data.encode_prompt(tok, "What is $1+1$?")
    assert text.startswith("<|im_start|>") and ids == tok(text, add_special_tokens=True)["input_ids"]
    assert tok.bos_token_id is None or tok.bos_token_id not in ids


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    """The hf engine on the tiny model, with the BOS tokenizer (the vocabularies agree)."""
    e = rollout.make_engine(tiny_model_dir, backend="hf", dtype="float32", max_model_len=256, seed=0)
    e.tokenizer = bos_tokenizer()
    return e


def test_training_samples_and_trains_on_one_bos(tmp_path, engine, monkeypatch):
    """train.py's path: load_rows, sample_and_grade (the engine's generate), make_sequences. (The
    engine's own, both backends: tests/test_rollout.py.)"""
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"problem": f"{i}+1?", "answer": str(i + 1)}) + "\n" for i in range(4)))
    cfg = train.Config(model="m", train_data=str(path), method="grpo", prompts_per_step=2, group_size=2,
                       max_new_tokens=4, num_minibatches=1)
    rows, _ = data.load_rows(str(path), cfg, engine.tokenizer, 0)
    assert all(one_bos(r["prompt_ids"]) for r in rows)
    monkeypatch.setattr(train, "all_ranks", lambda values, op="sum": {k: float(v) for k, v in values.items()})
    run = types.SimpleNamespace(cfg=cfg, rank=0, world=1, engine=engine, grader=reward.make_grader("rule"),
                                rows=rows, state=train.TrainState())
    groups = train.sample_and_grade(run, step=0).groups
    seqs = [s for mb in train.make_sequences(groups, cfg=cfg) for s in mb]
    assert len(seqs) == 4 and all(one_bos(s.prompt) for s in seqs), [s.prompt[:3] for s in seqs]
    assert {tuple(s.prompt) for s in seqs} <= {tuple(r["prompt_ids"]) for r in rows}


def test_evaluation_samples_from_one_bos(tmp_path, monkeypatch):
    """eval.py's path: the ids its main gives the engine, under the checkpoint's chat template."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    bench = tmp_path / "toy.jsonl"
    bench.write_text("".join(json.dumps({"problem": f"{i}+1?", "answer": str(i + 1)}) + "\n" for i in range(3)))
    seen = []

    class Engine:
        def generate(self, prompts, n=1, **kw):
            seen.extend(prompts)
            return [[rollout.Sample(p, [1], "\\boxed{1}", [0.0], "stop") for _ in range(n)] for p in prompts]
    monkeypatch.setattr(data, "load_tokenizer", lambda path: bos_tokenizer())
    monkeypatch.setattr(rollout, "make_engine", lambda *a, **k: Engine())
    ev.main(["--ckpt", str(ckpt), "--data", str(bench), "-n", "1", "--greedy", "--max-new-tokens", "8",
             "--grader", "rule", "--out", str(tmp_path / "results.json")])
    assert len(seen) == 3 and all(one_bos(p) for p in seen), [p[:3] for p in seen]
