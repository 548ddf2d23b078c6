"""The demo task and its supervised pre-training (demo.py)."""
import json
import re

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

import demo
import reward
from data import build_prompt, load_problems


def _numbers(problem):
    return [int(x) for x in re.findall(r"\d+", problem)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo_data")
    demo.write_demo_data(str(out), seed=3, n_train=400, n_test=200, n_sft=600, ops="+-*")  # with slips
    return {s: load_problems(str(out / f"{s}.jsonl")) for s in ("train", "test", "sft")}


def test_generator_is_seeded_and_reproducible(tmp_path):
    for d, seed in [("a", 0), ("b", 0), ("c", 1)]:
        demo.write_demo_data(str(tmp_path / d), seed=seed, n_train=50, n_test=20, n_sft=50)
    read = lambda d, s: (tmp_path / d / f"{s}.jsonl").read_text()
    for split in ("train", "test", "sft"):
        assert read("a", split) == read("b", split)
        assert read("a", split) != read("c", split)
    rows = [json.loads(line) for line in read("a", "sft").splitlines()]
    assert len(rows) == 50 and all(set(r) == {"problem", "answer", "solution"} for r in rows)
    test_rows = [json.loads(line) for line in read("a", "test").splitlines()]
    assert len(test_rows) == 20 and all(set(r) == {"problem", "answer"} for r in test_rows)


def _check_worked_solution(problem, answer, solution):
    """Check a worked solution independently of demo.worked_solution's own code.

    Every column line must be right arithmetic except at most one slip of one (result off by +-1);
    every carry is read from the line written above it and the box holds what the written lines
    give. Returns the slipped column, or None for a clean solution (whose box is `answer`).
    """
    lines = solution.split("\n")
    head, steps, last = lines[0], lines[1:-1], lines[-1]
    m = re.fullmatch(r"(\d+)([-+*])(\d+)", head)
    assert m, head
    a, op, b = int(m[1]), m[2], int(m[3])
    assert sorted(_numbers(problem)) == sorted([a, b])  # the equation is the problem's
    assert eval(head) == int(answer) >= 0  # "answer" is the true result, slip or not
    ncols = len(str(a)) if op == "*" else max(len(str(a)), len(str(b)))
    assert len(steps) == ncols
    da = [int(c) for c in reversed(str(a))] + [0] * 3
    db = [int(c) for c in reversed(str(b))] + [0] * 3
    carry, digits, slipped = 0, [], []
    for i, step in enumerate(steps):
        m = re.fullmatch(r"(\d+)([-+*])(\d)([-+])(\d)=(\d\d)", step)
        assert m, step
        x, y, c, r = int(m[1]), int(m[3]), int(m[5]), int(m[6])
        if r != eval(step.split("=")[0]):  # each step is right arithmetic, or a slip of one
            assert abs(r - eval(step.split("=")[0])) == 1, step
            slipped.append(i)
        assert m[2] == op and m[4] == ("-" if op == "-" else "+") and c == carry
        if op == "-":  # always borrow ten; the next column pays it back only if it was needed
            assert (x, y) == (10 + da[i], db[i]) and 0 <= r <= 19
            carry = 1 - r // 10
        else:
            assert (x, y) == (da[i], b if op == "*" else db[i])
            carry = r // 10
        digits.append(r % 10)
    assert len(slipped) <= 1
    # the units digits read from the last column up (after the carry out of + and *) are the answer
    top = "" if op == "-" else str(carry)
    assert last == "\\boxed{" + str(int(top + "".join(str(d) for d in reversed(digits)))) + "}"
    if not slipped:
        assert last == "\\boxed{" + answer + "}"
        if op == "-":
            assert carry == 0  # a >= b: nothing left to borrow
        return None
    assert last != "\\boxed{" + answer + "}" and not reward.grade(solution, answer)[1]
    return slipped[0]


def test_worked_solutions_are_right(data):
    for row in data["sft"]:
        _check_worked_solution(row["problem"], row["answer"], row["solution"])
    ops = {re.search(r"[-+*]", r["solution"])[0] for r in data["sft"]}
    assert ops == {"+", "-", "*"}
    # hand-checked: carries out of the top column, borrows across a zero, leading zeros dropped
    assert demo.worked_solution(347, "+", 258) == \
        "347+258\n7+8+0=15\n4+5+1=10\n3+2+1=06\n\\boxed{605}"
    assert demo.worked_solution(999, "+", 9) == \
        "999+9\n9+9+0=18\n9+0+1=10\n9+0+1=10\n\\boxed{1008}"
    assert demo.worked_solution(503, "-", 78) == \
        "503-78\n13-8-0=05\n10-7-1=02\n15-0-1=14\n\\boxed{425}"
    assert demo.worked_solution(95, "*", 7) == "95*7\n5*7+0=35\n9*7+3=66\n\\boxed{665}"
    assert demo.worked_solution(40, "-", 34) == "40-34\n10-4-0=06\n14-3-1=10\n\\boxed{6}"


def test_slips_by_hand():
    # the slip loses the carry: 4+5+1 written 09, so the next column adds 0 and the box says 595
    assert demo.worked_solution(347, "+", 258, slip=(1, -1)) == \
        "347+258\n7+8+0=15\n4+5+1=09\n3+2+0=05\n\\boxed{595}"
    # the slip invents a carry: 7+8+0=16 would be 1 too, 4+5+1=10 still; only the units change
    assert demo.worked_solution(347, "+", 258, slip=(0, 1)) == \
        "347+258\n7+8+0=16\n4+5+1=10\n3+2+1=06\n\\boxed{606}"
    # subtraction: the top column written 13 instead of 14; a middle column 03 instead of 02
    assert demo.worked_solution(503, "-", 78, slip=(2, -1)) == \
        "503-78\n13-8-0=05\n10-7-1=02\n15-0-1=13\n\\boxed{325}"
    assert demo.worked_solution(503, "-", 78, slip=(1, 1)) == \
        "503-78\n13-8-0=05\n10-7-1=03\n15-0-1=14\n\\boxed{435}"
    # at the ends of the range the slip goes the other way: 19+1 -> 18, 00-1 -> 01
    assert demo.worked_solution(29, "-", 10, slip=(0, 1)) == "29-10\n19-0-0=18\n12-1-0=11\n\\boxed{18}"
    assert demo.worked_solution(10, "+", 20, slip=(0, -1)) == "10+20\n0+0+0=01\n1+2+0=03\n\\boxed{31}"
    assert demo.worked_solution(95, "*", 7, slip=(0, 1)) == "95*7\n5*7+0=36\n9*7+3=66\n\\boxed{666}"
    for bad in [(3, 1), (0, 2), (0, 0), (-1, 1), (0,)]:
        with pytest.raises(ValueError, match="slip"):
            demo.worked_solution(347, "+", 258, slip=bad)


def test_a_slip_changes_exactly_one_line_and_what_follows_from_it():
    import random
    rng = random.Random(5)
    for _ in range(2000):
        a, op, b = demo.sample_operands(rng, "+-*", (1, 2, 3))
        clean = demo.worked_solution(a, op, b).split("\n")
        ncols = len(clean) - 2
        i, d = rng.randrange(ncols), rng.choice((-1, 1))
        slipped = demo.worked_solution(a, op, b, slip=(i, d)).split("\n")
        problem = f"{a} {b}"
        assert _check_worked_solution(problem, str(eval(f"{a}{op}{b}")), "\n".join(slipped)) == i
        assert slipped[:i + 1] == clean[:i + 1]  # the header and the columns before are untouched
        lhs, r = clean[i + 1].split("=")
        lhs2, r2 = slipped[i + 1].split("=")
        assert lhs2 == lhs and abs(int(r2) - int(r)) == 1  # same operands, result off by one
        # ... and in the direction drawn, unless that leaves the range of the operation
        top = 99 if op == "*" else 19
        assert int(r2) == int(r) + d or not 0 <= int(r) + d <= top


def test_slip_rate_matches_slip_prob_and_rl_rows_never_slip(tmp_path):
    n = 3000
    for p in (0.0, 0.6, 1.0):
        rows, _ = demo.generate_rows(n, 7, ops="+-*", slip_prob=p)
        cols = [_check_worked_solution(r["problem"], r["answer"], r["solution"]) for r in rows]
        rate = sum(c is not None for c in cols) / n
        assert abs(rate - p) <= 4 * (p * (1 - p) / n) ** 0.5 + 1e-9, (p, rate)
        # the problems drawn do not depend on slip_prob, only the solutions do
        assert [r["problem"] for r in rows] == [r["problem"] for r in demo.generate_rows(n, 7, ops="+-*")[0]]
    with pytest.raises(ValueError, match="slip_prob"):
        demo.generate_rows(5, 0, slip_prob=1.5)
    demo.write_demo_data(str(tmp_path / "a"), seed=2, n_train=300, n_test=300, n_sft=300,
                         ops="+-*", slip_prob=0.9)
    demo.write_demo_data(str(tmp_path / "b"), seed=2, n_train=300, n_test=300, n_sft=300,
                         ops="+-*", slip_prob=0.0)
    for split in ("train", "test"):  # the RL and held-out splits are the same whatever slip_prob
        assert (tmp_path / "a" / f"{split}.jsonl").read_text() == (tmp_path / "b" / f"{split}.jsonl").read_text()
        for row in load_problems(str(tmp_path / "a" / f"{split}.jsonl")):
            x, y = _numbers(row["problem"])
            plus = re.search(r"more|adds", row["problem"])
            times = re.search(r"bags|boxes of", row["problem"])
            assert int(row["answer"]) == (x * y if times else x + y if plus else x - y)  # gold is right
    sft = load_problems(str(tmp_path / "a" / "sft.jsonl"))
    slipped = sum(_check_worked_solution(r["problem"], r["answer"], r["solution"]) is not None for r in sft)
    assert 0.8 * 300 <= slipped < 300  # ~0.9 of them, about 270


def test_bad_input_is_a_clear_error():
    for args in [(3, "-", 5), (12, "*", 10), (1, "/", 2), (-1, "+", 2), (1.5, "+", 2)]:
        with pytest.raises(ValueError):
            demo.worked_solution(*args)
    with pytest.raises(ValueError, match="ops"):
        demo.generate_rows(5, 0, ops="+/")
    with pytest.raises(ValueError, match="distinct"):  # only 9 * 8 one-digit products exist
        demo.generate_rows(100, 0, ops="*", digits=(1,))


def test_splits_do_not_overlap(data):
    def key(r):  # the arithmetic asked, read from the text: the numbers and the answer
        return tuple(sorted(_numbers(r["problem"]))), r["answer"]
    keys = {s: {key(r) for r in rows} for s, rows in data.items()}
    assert len(keys["test"]) == len(data["test"]) == 200  # no duplicates inside a split either
    assert not keys["test"] & keys["train"] and not keys["test"] & keys["sft"]
    assert not keys["train"] & keys["sft"]


def test_tokenizer_round_trips_every_character_of_the_task(data, tmp_path):
    built = demo.make_char_tokenizer()
    # what train.py, eval.py and vLLM get: transformers 5 reloads a qwen2 tokenizer as Qwen2Tokenizer
    loaded = AutoTokenizer.from_pretrained(demo.make_tiny_model(str(tmp_path / "m")))
    texts = [build_prompt(built, r["problem"], demo.DEMO_TEMPLATE) for r in data["test"]]
    texts += [r["solution"] for r in data["sft"]]
    texts.append("".join(demo.CHARS))
    for tok in (built, loaded):
        for text in texts:
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert len(ids) == len(text)  # one token per character, none dropped
            assert [tok.decode([i]) for i in ids] == list(text)
            assert tok.decode(ids) == text
    ids = built("".join(demo.CHARS), add_special_tokens=False)["input_ids"]
    assert sorted(ids) == list(range(2, 2 + len(demo.CHARS)))  # distinct, after pad=0 and eos=1
    assert (built.pad_token_id, built.eos_token_id) == (loaded.pad_token_id, loaded.eos_token_id) == (0, 1)


def test_demo_template_asks_for_boxed():
    assert "\\boxed{}" in demo.DEMO_TEMPLATE and "{problem}" in demo.DEMO_TEMPLATE


def test_sft_batch_masks_the_prompt():
    tok = demo.make_char_tokenizer()
    rows = [{"problem": "Ann has 2 and finds 3 more.", "answer": "5", "solution": "2+3\n\\boxed{5}"},
            {"problem": "Bob has 12 coins.", "answer": "12", "solution": "\\boxed{12}"}]
    ids, attn, mask = demo.sft_batch(tok, rows, demo.DEMO_TEMPLATE)
    prompts = [r["problem"] + "\nAnswer in \\boxed{}.\n" for r in rows]  # by hand
    lengths = [len(p) + len(r["solution"]) + 1 for p, r in zip(prompts, rows)]
    T = max(lengths)
    assert ids.shape == attn.shape == mask.shape == (2, T)
    for i, (p, r) in enumerate(zip(prompts, rows)):
        n = lengths[i]
        expected = [0.0] * len(p) + [1.0] * (len(r["solution"]) + 1) + [0.0] * (T - n)
        assert mask[i].tolist() == expected
        assert attn[i].tolist() == [1] * n + [0] * (T - n)
        assert tok.decode(ids[i, :len(p)]) == p
        assert tok.decode(ids[i, len(p):n - 1]) == r["solution"]
        assert ids[i, n - 1] == tok.eos_token_id and (ids[i, n:] == tok.pad_token_id).all()
    with pytest.raises(ValueError, match="solution"):
        demo.sft_batch(tok, [{"problem": "x", "answer": "1"}])


def test_sft_loss_matches_masked_cross_entropy(tmp_path):
    path = demo.make_tiny_model(str(tmp_path / "m"), seed=1)
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = demo.make_char_tokenizer()
    rows = [{"problem": "Ann has 2.", "answer": "5", "solution": "2+3=5\n\\boxed{5}"},
            {"problem": "Bob has 12 coins and 7 more.", "answer": "19", "solution": "\\boxed{19}"}]
    batch = demo.sft_batch(tok, rows)
    loss = demo.sft_loss(model, *batch)
    # reference: per-row loop over response targets only, no padding involved
    nll, count = 0.0, 0
    for r in rows:
        p = tok(build_prompt(tok, r["problem"], demo.DEMO_TEMPLATE), add_special_tokens=False)["input_ids"]
        s = tok(r["solution"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        x = torch.tensor([p + s])
        logits = model(input_ids=x).logits[0]
        for t in range(len(p), len(p) + len(s)):
            nll += F.cross_entropy(logits[t - 1], x[0, t]).item()
            count += 1
    assert loss.item() == pytest.approx(nll / count, rel=1e-4)


def test_short_pretrain_lowers_loss_and_saves_a_loadable_model(tmp_path, data):
    src = demo.make_tiny_model(str(tmp_path / "m"), hidden=64, layers=2, heads=2, kv_heads=1,
                               intermediate=128, seed=0)
    before = AutoModelForCausalLM.from_pretrained(src)
    tok = AutoTokenizer.from_pretrained(src)
    probe = demo.sft_batch(tok, data["sft"][:32])
    history = demo.pretrain(src, data["sft"], steps=40, batch_size=16, lr=3e-3, seed=0,
                            warmup=5, log_every=0, out_dir=str(tmp_path / "sft"))
    assert len(history) == 40
    after = AutoModelForCausalLM.from_pretrained(str(tmp_path / "sft"))
    tok2 = AutoTokenizer.from_pretrained(str(tmp_path / "sft"))
    assert tok2("A+1", add_special_tokens=False)["input_ids"] == tok("A+1", add_special_tokens=False)["input_ids"]
    assert tok2.eos_token_id == tok.eos_token_id
    with torch.no_grad():
        l0, l1 = demo.sft_loss(before, *probe).item(), demo.sft_loss(after, *probe).item()
    assert l1 < l0 - 1.0, (l0, l1)


def test_batched_generate_matches_one_by_one(tmp_path):
    # left padding must not change what a prompt generates: compare with unpadded, one at a time
    path = demo.make_tiny_model(str(tmp_path / "m"), seed=2)
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    texts = ["Ann has 5.\n", "A box has 347 coins. Bob adds 12.\nAnswer in \\boxed{}.\n", "x"]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    batched = demo.generate(model, tok, prompts, temperature=0, max_new_tokens=12)
    single = [demo.generate(model, tok, [p], temperature=0, max_new_tokens=12)[0] for p in prompts]
    assert batched == single and all(len(x) > 0 for x in batched)
    assert tok.padding_side == "right"  # restored


def test_the_demos_accuracy_gives_the_model_the_prompt_ids_of_training(tmp_path, monkeypatch):
    """demo.evaluate encodes each prompt by data.encode_prompt, the one path of training and
    eval.py: with a tokenizer that adds a BOS, the model gets it once (its own rule,
    add_special_tokens=False, gave none: harmless only for the demo's tokenizer, which has none)."""
    import data
    from test_prompt_ids import bos_tokenizer
    tok = bos_tokenizer(chat_template=None)
    seen = []

    class Model:
        def eval(self):
            return self

        def generate(self, input_ids, attention_mask, max_new_tokens, **kw):
            seen.extend([row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask)])
            return torch.cat([input_ids, torch.full((len(input_ids), 1), tok.eos_token_id)], 1)
    monkeypatch.setattr(demo.AutoTokenizer, "from_pretrained", lambda *a, **k: tok)
    monkeypatch.setattr(demo.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: Model())
    rows = [{"problem": "1+1?", "answer": "2"}, {"problem": "20+3?", "answer": "23"}]
    demo.evaluate("m", rows, template="{problem} A:", temperatures=(0.0,))
    assert seen == [data.encode_prompt(tok, r["problem"], "{problem} A:")[1] for r in rows]
    assert all(ids.count(tok.bos_token_id) == 1 for ids in seen)


# ---------------------------------------------------------------------------------------------
# The chain task (a op1 b op2 c in a free order): the loss study's

def _check_chain_solution(problem, answer, solution):
    """Check a chain solution independently of demo.chain_solution's own code: the plan "x?y?z"
    holds the problem's three numbers, then two column computations (each checked by
    _check_worked_solution: right, or one slip carried through), "x?y" and "r?z" where r is the
    result the first one's lines give, and nothing below zero. Returns (the first computation's
    slipped column or None, the second's, the boxed value)."""
    lines = solution.split("\n")
    x, op1, y, op2, z = re.fullmatch(r"(\d+)([-+])(\d+)([-+])(\d+)", lines[0]).groups()
    assert sorted(int(n) for n in (x, y, z)) == sorted(_numbers(problem)[:3])
    assert lines[1] == f"{x}{op1}{y}"
    mid = next(i for i, ln in enumerate(lines) if i > 1 and re.fullmatch(r"\d+[-+]\d+", ln))
    r, op, z2 = re.fullmatch(r"(\d+)([-+])(\d+)", lines[mid]).groups()
    assert (op, z2) == (op2, z)
    first = "\n".join(lines[1:mid] + [f"\\boxed{{{r}}}"])  # the first computation, boxed at r
    slip1 = _check_worked_solution(f"{x} {y}", str(eval(lines[1])), first)
    slip2 = _check_worked_solution(f"{r} {z}", str(eval(lines[mid])), "\n".join(lines[mid:]))
    boxed = int(re.fullmatch(r"\\boxed\{(\d+)\}", lines[-1])[1])
    if slip1 is None and slip2 is None:
        assert boxed == int(answer)
    return slip1, slip2, boxed


def _signed_terms(problem):
    """The problem's three numbers with their signs, read from its words."""
    a, b, c = _numbers(problem)[:3]
    steps = re.search(r", (.+?) and (.+?)\. How many", problem).groups()
    return a, "".join("-" if re.match(r"gives away|loses|sells", s) else "+" for s in steps), b, c


def test_chain_orders_by_hand():
    assert demo.chain_orders(47, "+-", 38, 25) == ["a+b-c", "a-c+b", "b+a-c", "b-c+a"]
    assert demo.chain_orders(47, "+-", 20, 25) == ["a+b-c", "a-c+b", "b+a-c"]  # not 20-25
    assert demo.chain_orders(90, "--", 38, 25) == ["a-b-c", "a-c-b"]
    assert len(demo.chain_orders(20, "++", 38, 25)) == 6
    assert demo.chain_orders(40, "-+", 38, 25) == ["a-b+c", "a+c-b", "c+a-b"]  # not 25-38
    assert demo.chain_solution(47, "+-", 38, 25, "a-c+b") == \
        "47-25+38\n47-25\n17-5-0=12\n14-2-0=12\n22+38\n2+8+0=10\n2+3+1=06\n\\boxed{60}"
    assert demo.chain_solution(47, "+-", 38, 25, "a+b-c") == \
        "47+38-25\n47+38\n7+8+0=15\n4+3+1=08\n85-25\n15-5-0=10\n18-2-0=16\n\\boxed{60}"
    # a slip in the first computation is carried: 85 written 86, so the second one works on 86
    assert demo.chain_solution(47, "+-", 38, 25, "a+b-c", slips=((0, 1), None)) == \
        "47+38-25\n47+38\n7+8+0=16\n4+3+1=08\n86-25\n16-5-0=11\n18-2-0=16\n\\boxed{61}"
    for bad in [(47, "-+", 50, 1), (10, "--", 5, 6), (1, "*+", 2, 3), (1, "+", 2, 3), (-1, "++", 2, 3)]:
        with pytest.raises(ValueError):
            demo.chain_orders(*bad)
    with pytest.raises(ValueError, match="order"):
        demo.chain_solution(47, "+-", 20, 25, "b-c+a")  # 20-25 goes below zero
    with pytest.raises(ValueError, match="order"):
        demo.chain_solution(47, "+-", 38, 25, "a+c-b")  # 25 is taken away, not added


def test_every_chain_order_is_valid_and_reaches_the_answer():
    import itertools
    import random
    rng = random.Random(11)
    seen_counts = set()
    for _ in range(3000):
        ops = rng.choice(demo.CHAIN_OPS)
        a, b, c = (rng.randint(0, 120) for _ in range(3))
        signed = {"a": (1, a), "b": (1 if ops[0] == "+" else -1, b), "c": (1 if ops[1] == "+" else -1, c)}
        if a + signed["b"][0] * b < 0 or a + signed["b"][0] * b + signed["c"][0] * c < 0:
            with pytest.raises(ValueError, match="below zero"):
                demo.chain_orders(a, ops, b, c)
            continue
        answer = a + signed["b"][0] * b + signed["c"][0] * c
        orders = demo.chain_orders(a, ops, b, c)
        seen_counts.add(len(orders))
        # independently: the permutations of the signed terms that start with an added term and
        # stay >= 0 after two of them (after three they give the answer)
        brute = set()
        for x, y, z in itertools.permutations("abc"):
            (sx, vx), (sy, vy), (sz, vz) = signed[x], signed[y], signed[z]
            if sx > 0 and vx + sy * vy >= 0:
                assert vx + sy * vy + sz * vz == answer
                brute.add(f"{x}{'+-'[sy < 0]}{y}{'+-'[sz < 0]}{z}")
        assert set(orders) == brute and len(orders) == len(brute)
        assert orders[0] == f"a{ops[0]}b{ops[1]}c"  # the problem's own order is always one
        for order in orders:
            sol = demo.chain_solution(a, ops, b, c, order)
            assert _check_chain_solution(f"{a} {b} {c}", str(answer), sol) == (None, None, answer)
            assert reward.grade(sol, str(answer))[1]
    assert seen_counts == {2, 3, 4, 6}


def test_chain_rows_are_right_seeded_and_slip_consistently(tmp_path):
    n = 1500
    clean, _ = demo.generate_chain_rows(n, 4)
    slipped, _ = demo.generate_chain_rows(n, 4, slip_prob=0.5)
    assert [r["problem"] for r in clean] == [r["problem"] for r in slipped]  # problems don't depend on it
    steps_slipped, orders = 0, {}
    for row, srow in zip(clean, slipped):
        a, ops, b, c = _signed_terms(row["problem"])
        assert int(row["answer"]) == eval(f"{a}{ops[0]}{b}{ops[1]}{c}") >= 0
        assert _check_chain_solution(row["problem"], row["answer"], row["solution"])[2] == int(row["answer"])
        s1, s2, boxed = _check_chain_solution(srow["problem"], srow["answer"], srow["solution"])
        steps_slipped += (s1 is not None) + (s2 is not None)
        if (s1 is None) != (s2 is None):  # one slip always shows in the box (two may cancel)
            assert boxed != int(srow["answer"]) and not reward.grade(srow["solution"], srow["answer"])[1]
        elif s1 is None:
            assert boxed == int(srow["answer"]) and reward.grade(srow["solution"], srow["answer"])[1]
        head = srow["solution"].split("\n")[0]
        orders.setdefault(len(demo.chain_orders(a, ops, b, c)), set()).add(head)
    rate = steps_slipped / (2 * n)
    assert abs(rate - 0.5) < 0.05, rate  # ~ slip_prob per step (a few dropped: below zero)
    assert all(len(heads) > 1 for heads in orders.values())  # orders vary
    # the order is uniform over the valid ones: 47+38-25 has 4
    import random
    rng, n_draws = random.Random(0), 6000
    drawn = [demo.draw_chain_solution(47, "+-", 38, 25, rng, 0.0)[1] for _ in range(n_draws)]
    for order in demo.chain_orders(47, "+-", 38, 25):
        assert abs(drawn.count(order) / n_draws - 1 / 4) < 4 * (3 / 16 / n_draws) ** 0.5, order
    for d, seed in [("a", 0), ("b", 0), ("c", 1)]:
        demo.write_chain_data(str(tmp_path / d), seed=seed, n_train=60, n_test=30, n_sft=60)
    read = lambda d, s: (tmp_path / d / f"{s}.jsonl").read_text()
    for split in ("train", "test", "sft"):
        assert read("a", split) == read("b", split) and read("a", split) != read("c", split)
    with pytest.raises(ValueError, match="slip_prob"):
        demo.generate_chain_rows(5, 0, slip_prob=-0.1)


def test_chain_splits_do_not_overlap_and_rl_rows_carry_no_solution(tmp_path):
    splits = demo.write_chain_data(str(tmp_path), seed=2, n_train=400, n_test=200, n_sft=800)
    keys = {}
    for name, rows in splits.items():
        keys[name] = {demo.chain_key(*_signed_terms(r["problem"])) for r in rows}
        assert len(keys[name]) == len(rows)  # distinct inside a split, as arithmetic
        file_rows = load_problems(str(tmp_path / f"{name}.jsonl"))
        assert all(("solution" in r) == (name == "sft") for r in file_rows)
    assert not keys["test"] & keys["train"] and not keys["test"] & keys["sft"]
    assert not keys["train"] & keys["sft"]
    # "47+38-25" and "38+47-25" are one key: a swapped copy is no new problem
    assert demo.chain_key(47, "+-", 38, 25) == demo.chain_key(38, "+-", 47, 25) == \
        demo.chain_key(47, "-+", 25, 38) == ((38, 47), (25,))
    assert demo.chain_key(47, "--", 25, 8) != demo.chain_key(47, "-+", 25, 8)


# ----------------------------------------------------------------------------------------------
# The shortcut task (a + b at a glance or in columns): the entropy study's

def _operands(problem):
    a, b = (int(x) for x in re.findall(r"\d+", problem))
    return a, b


def test_the_glance_adds_each_column_alone_by_hand():
    assert demo.glance_sum(347, 251) == 598 and not demo.carries(347, 251)
    assert demo.glance_sum(347, 258) == 595 and demo.carries(347, 258)   # 7+8 carries: 5, not 15
    assert demo.glance_sum(951, 70) == 921 and demo.carries(951, 70)     # 9+0 then 5+7: the tens carry
    assert demo.glance_sum(500, 499) == 999 and not demo.carries(500, 499)
    assert demo.glance_sum(999, 1) == 990 and demo.carries(999, 1)
    assert demo.glance_solution(347, 258) == "347+258=595\n\\boxed{595}"


def test_shortcut_rows_mix_the_kinds_and_each_route_is_right_where_it_should_be():
    rows, keys = demo.generate_shortcut_rows(2000, seed=3, no_carry=0.75, glance_prob=0.5, slip_prob=0.4)
    assert len(keys) == len(rows) == 2000
    no_carry = [not demo.carries(*_operands(r["problem"])) for r in rows]
    assert 0.72 < sum(no_carry) / len(rows) < 0.78
    glances = slipped = 0
    for r, easy in zip(rows, no_carry):
        a, b = _operands(r["problem"])
        assert r["answer"] == str(a + b)
        right = reward.grade(r["solution"], r["answer"])[1]
        if r["solution"].split("\n")[0] == f"{a}+{b}={demo.glance_sum(a, b)}":  # the glance
            glances += 1
            assert right == easy  # right exactly when no column carries
        else:
            assert r["solution"].startswith(f"{a}+{b}\n")  # worked in columns
            slipped += not right
    assert 0.47 < glances / len(rows) < 0.53
    assert 0.37 < slipped / (len(rows) - glances) < 0.43
    # the problems drawn do not depend on the solutions' shares
    same, _ = demo.generate_shortcut_rows(2000, seed=3, no_carry=0.75)
    assert [r["problem"] for r in same] == [r["problem"] for r in rows]
    assert all(reward.grade(r["solution"], r["answer"])[1] for r in same)  # no glance, no slip: right


def test_shortcut_splits_do_not_overlap_and_rl_rows_carry_no_solution(tmp_path):
    splits = demo.write_shortcut_data(str(tmp_path), seed=1, n_train=400, n_test=200, n_sft=800)
    keys = {}
    for name, rows in splits.items():
        keys[name] = {tuple(sorted(_operands(r["problem"]))) for r in rows}
        assert len(keys[name]) == len(rows)
        file_rows = load_problems(str(tmp_path / f"{name}.jsonl"))
        assert all(("solution" in r) == (name == "sft") for r in file_rows)
    assert not keys["test"] & keys["train"] and not keys["test"] & keys["sft"] and not keys["train"] & keys["sft"]
    with pytest.raises(ValueError, match="no_carry must be in"):
        demo.generate_shortcut_rows(10, 0, no_carry=1.5)


def test_every_shortcut_split_holds_the_share_without_carry_at_full_size(tmp_path):
    """At the study's sizes most problems without carry are taken (40,950 of ~54,500 pairs): a
    duplicate redrawn with a new coin for its kind drifted the pre-training split to ~83%."""
    splits = demo.write_shortcut_data(str(tmp_path), seed=0)
    for name, rows in splits.items():
        share = sum(not demo.carries(*_operands(r["problem"])) for r in rows) / len(rows)
        sd = (0.9 * 0.1 / len(rows)) ** 0.5
        assert abs(share - demo.SHORTCUT_NO_CARRY) < 4 * sd, (name, len(rows), share)


def test_the_shortcut_flags_are_refused_for_another_task(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr("sys.argv", ["demo.py", "prepare", "--task", "chain", "--out", str(tmp_path / "x"),
                                     "--glance-prob", "0.5"])
    with pytest.raises(SystemExit):
        demo.main()
    assert "--glance-prob and --no-carry are the shortcut task's: add --task shortcut" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()  # refused before anything is written
