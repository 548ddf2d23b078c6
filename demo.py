"""The demo: a task the project makes itself, and a tiny char-level Qwen2 model pre-trained on it.

No model hub is needed: `make_tiny_model(dir)` writes a transformers-format directory
(config, safetensors, tokenizer) that transformers, vLLM and every file of this project load
like any hub checkpoint. The tests and benchmarks use it at several sizes.

The demo task is arithmetic word problems ("Ann has 347 coins and finds 258 more. How many
now?", + and - of 2-3 digit numbers) whose worked solutions do column arithmetic one digit at a
time, so that every step is local and a ~0.8M-parameter model can learn it.
`python demo.py prepare --out runs/demo` writes the data (OUT/data/{train,test,sft}.jsonl), makes
the tiny model, pre-trains it on worked solutions (600 steps, ~5 minutes on 2 idle cores), saves
it to OUT/model and prints its held-out accuracy.

The pre-training solutions are those of a careless student: 60% of them carry one slip of one in
a column (4+5+1=09), carried through consistently to a wrong boxed answer (SLIP_PROB,
`worked_solution(..., slip=)`). The model learns the method and, at each column, a ~20% habit of
slipping, so it is mostly right greedily but often wrong when it samples. Measured with seed 0:
85% greedy, 39% sampled at T=1. RL (train.py, configs/demo.yaml) rewards only right answers and
so removes the habit: what RL does for reasoning models, sharpening a skill the model has but
does not use reliably. Responses are <= 50 tokens with EOS, so 64 new tokens is a safe limit.

The chain task (`prepare --task chain`, the loss study's: bench/study.py) has three 2-digit numbers
and two operations of + and - ("Ann has 47 coins, finds 38 more and gives away 25. How many
now?"). Its solution writes an order of the terms first (47+38-25, 38+47-25, 47-25+38 or
38-25+47: 2 to 6 right orders per problem) and works it left to right in two column
computations ("47-25+38\n47-25\n17-5-0=12\n14-2-0=12\n22+38\n2+8+0=10\n2+3+1=06\n\boxed{60}").
The pre-training solutions take an order uniformly and slip in 30% of the computations
(CHAIN_SLIP_PROB), so the model both spreads over the orders, which RL can collapse, and slips.
Measured with seed 0 (800 steps, 8 minutes on 2 idle cores): 89% greedy, 37% sampled at T=1 on
500 held-out problems, pass@32 98% (32 samples, 128 problems); responses of 60-82 tokens with EOS.

The shortcut task (`prepare --task shortcut`, the entropy study's) is a + b of 3-digit numbers,
answered either at a glance ("347+251=598", each column added alone, never carrying: right only
when no column carries) or worked in columns as the demo does, with slips. Most problems carry in
no column (SHORTCUT_NO_CARRY), so a policy can gain accuracy by sharpening onto the glance and
lose the problems that carry, whose one route it stops sampling.
"""
import argparse
import itertools
import json
import os
import random
import time

import torch
import torch.nn.functional as F
from transformers import (AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM,
                          Qwen2Tokenizer)

import reward
from data import encode_prompt, load_problems

PAD, EOS = "<|pad|>", "<|eos|>"
# Every printable ASCII character plus newline, one token each: 2 specials + 96 characters.
CHARS = [chr(c) for c in range(32, 127)] + ["\n"]


def make_char_tokenizer(vocab_size=128):
    """A character-level tokenizer: one token per character of CHARS (printable ASCII, newline).

    It is Qwen2's own tokenizer class with a vocabulary of single bytes and no merges. Why: for a
    model_type=qwen2 directory, transformers 5 loads the tokenizer as Qwen2Tokenizer whatever
    tokenizer_config.json says, and that class rebuilds a byte-level BPE pipeline around the saved
    vocabulary, so a tokenizer of any other kind comes back broken (symptom: AutoTokenizer and vLLM
    silently drop every space and newline). Byte-level BPE spells ' ' as 'Ġ' and '\\n' as 'Ċ'.
    Characters outside CHARS are dropped (Qwen2's BPE has no unknown token). The vocabulary is
    padded with unused tokens to `vocab_size` (a multiple of 8 suits the kernels).
    """
    byte_level = {" ": "\u0120", "\n": "\u010a"}  # GPT-2's bytes_to_unicode; other ASCII is itself
    vocab = {PAD: 0, EOS: 1}
    for ch in CHARS:
        vocab[byte_level.get(ch, ch)] = len(vocab)
    if vocab_size < len(vocab):
        raise ValueError(f"vocab_size must be at least {len(vocab)}, got {vocab_size}")
    for i in range(len(vocab), vocab_size):
        vocab[f"<|unused{i}|>"] = i
    return Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=None, eos_token=EOS, pad_token=PAD,
                          model_max_length=4096)


def make_tiny_model(path, *, hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128,
                    vocab_size=128, max_positions=1024, seed=0):
    """Write a random-weight Qwen2ForCausalLM with the character tokenizer to `path`; return path.

    Head size is hidden // heads; vLLM's CPU attention needs it to be 32 or more.
    """
    torch.manual_seed(seed)
    tokenizer = make_char_tokenizer(vocab_size)
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32")
    model = Qwen2ForCausalLM(config).float()  # float32 whatever torch's default dtype
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# The size of the demo model (~0.8M parameters): head size 32, the least vLLM's CPU attention takes.
DEMO_MODEL = dict(hidden=128, layers=4, heads=4, kv_heads=2, intermediate=384, max_positions=512)

# ----------------------------------------------------------------------------------------------
# The task: arithmetic word problems with worked column-arithmetic solutions

DEMO_TEMPLATE = "{problem}\nAnswer in \\boxed{}.\n"

NAMES = ["Ann", "Bob", "Mia", "Tom", "Eva", "Sam", "Leo", "Zoe"]
THINGS = ["coins", "apples", "stamps", "cards", "beads", "shells"]
# Short stories: every prompt character is a token that each of RL's samples pays for.
STORIES = {  # {n} a name, {o} the things, {a} {b} the numbers
    "+": ["{n} has {a} {o} and finds {b} more. How many now?",
          "{n} had {a} {o} and bought {b} more. How many now?",
          "A box has {a} {o}. {n} adds {b}. How many now?"],
    "-": ["{n} has {a} {o} and gives away {b}. How many are left?",
          "{n} had {a} {o} and lost {b}. How many are left?",
          "A box has {a} {o}. {n} takes {b}. How many are left?"],
    "*": ["{n} buys {b} bags of {a} {o}. How many {o} is that?",
          "{n} has {b} boxes of {a} {o}. How many in all?"],
}


def worked_solution(a, op, b, slip=None):
    """The worked solution of `a op b`: one line per digit column, right to left, then the answer.

    347+258 -> "347+258\\n7+8+0=15\\n4+5+1=10\\n3+2+1=06\\n\\boxed{605}". Every column line has the
    same shape "x?y?c=rr" (digit of a, digit of b or the multiplier b, carry c from the line
    above, two-digit result), so a tiny model finds each operand at a fixed distance. The carry
    to the next column is the tens digit rr // 10 (for * too). Subtraction always borrows ten,
    "1x-y-c=rr", and gives the borrow back when it was not needed: the next c is 1 - rr // 10
    (547-258: "17-8-0=09\\n14-5-1=08\\n15-2-1=12"). The answer is the columns' units digits read
    from the last line up, after the last line's tens digit (for + and *).

    `slip=(i, d)` writes a slip of one in column i: its result is rr + d (d = +1 or -1; -d where
    rr + d would leave 0..19, 0..99 for *). What follows is read off the written lines, as a
    person's slip would go on: the next carry comes from the wrong line, the boxed answer is
    the one the lines give (347+258 with slip (1, -1): "4+5+1=09\\n3+2+0=05\\n\\boxed{595}").
    """
    lines, answer = column_arithmetic(a, op, b, slip)
    return "\n".join(lines + [f"\\boxed{{{answer}}}"])


def column_arithmetic(a, op, b, slip=None):
    """The lines of `a op b` worked in columns (the header "a?b", then one line per column) and the
    result those lines give: worked_solution without the box, see there. -> (lines, result)"""
    if not (isinstance(a, int) and isinstance(b, int) and a >= 0 and b >= 0):
        raise ValueError(f"operands must be non-negative ints, got {a!r}, {b!r}")
    if op not in ("+", "-", "*"):
        raise ValueError(f"unknown operation {op!r}")
    if op == "-" and a < b:
        raise ValueError(f"subtraction needs a >= b, got {a} - {b}")
    if op == "*" and b > 9:
        raise ValueError(f"multiplication is by one digit, got {a} * {b}")
    da, db = str(a)[::-1], str(b)[::-1]
    ncols = len(da) if op == "*" else max(len(da), len(db))
    if slip is not None and (len(slip) != 2 or slip[0] not in range(ncols) or slip[1] not in (-1, 1)):
        raise ValueError(f"slip must be (column in 0..{ncols - 1}, +1 or -1), got {slip!r}")
    lines, carry, digits = [f"{a}{op}{b}"], 0, []
    for i in range(ncols):
        x = int(da[i]) if i < len(da) else 0
        y = b if op == "*" else (int(db[i]) if i < len(db) else 0)
        r = 10 + x - y - carry if op == "-" else x * y + carry if op == "*" else x + y + carry
        if slip is not None and slip[0] == i:
            top = 99 if op == "*" else 19
            r = r + slip[1] if 0 <= r + slip[1] <= top else r - slip[1]
        lines.append(f"1{x}-{y}-{carry}={r:02d}" if op == "-" else f"{x}{op}{y}+{carry}={r:02d}")
        carry = 1 - r // 10 if op == "-" else r // 10
        digits.append(r % 10)
    head = "" if op == "-" else str(carry)  # the borrow given back is no digit of a - b
    return lines, int(head + "".join(str(d) for d in reversed(digits)))


def make_row(a, op, b, rng, slip=None):
    """One data row {"problem", "answer", "solution"} for `a op b`, the story drawn from `rng`.

    "answer" is always the true result; the solution ends in another one when it has a `slip`.
    """
    story = rng.choice(STORIES[op])
    problem = story.format(n=rng.choice(NAMES), o=rng.choice(THINGS), a=a, b=b)
    answer = {"+": a + b, "-": a - b, "*": a * b}[op]
    return {"problem": problem, "answer": str(answer), "solution": worked_solution(a, op, b, slip)}


# The share of pre-training solutions with one slip (see the module docstring): 0.6 leaves a model
# that is right greedily ~85% of the time but at T=1 under 40%.
SLIP_PROB = 0.6


def sample_operands(rng, ops="+-", digits=(2, 3)):
    """Draw (a, op, b): each number has one of `digits` digits; `*` is by one digit; a >= b for -."""
    op = rng.choice(ops)

    def num():
        d = rng.choice(digits)
        return rng.randint(10 ** (d - 1), 10 ** d - 1)
    a, b = num(), (rng.randint(2, 9) if op == "*" else num())
    if op == "-" and a < b:
        a, b = b, a
    return a, op, b


def generate_rows(n, seed, *, ops="+-", digits=(2, 3), exclude=(), slip_prob=0.0):
    """`n` distinct rows from `seed`, none of whose sums is in `exclude`; return (rows, their keys).

    A key is (a, op, b), with a <= b for the commutative +, so no split holds a swapped copy.
    Each solution has one slip with probability `slip_prob` (column and sign uniform), drawn
    from a stream of its own, so the problems drawn do not depend on `slip_prob`.
    """
    if not ops or set(ops) - set(STORIES) or not digits or min(digits) < 1:
        raise ValueError(f"ops must be made of {''.join(STORIES)} and digits >= 1, "
                         f"got ops={ops!r} digits={digits!r}")
    if not 0.0 <= slip_prob <= 1.0:
        raise ValueError(f"slip_prob must be in [0, 1], got {slip_prob!r}")
    rng, slip_rng = random.Random(seed), random.Random(f"slips-{seed}")
    seen, rows = set(exclude), []
    for _ in range(100 * n):
        if len(rows) == n:
            break
        a, op, b = sample_operands(rng, ops, digits)
        key = (min(a, b), op, max(a, b)) if op == "+" else (a, op, b)  # 34+53 is 53+34
        if key in seen:
            continue
        seen.add(key)
        slip = None
        if slip_rng.random() < slip_prob:
            slip = (slip_rng.randrange(len(str(a)) if op == "*" else len(str(max(a, b)))),
                    slip_rng.choice((-1, 1)))
        rows.append(make_row(a, op, b, rng, slip))
    if len(rows) < n:
        raise ValueError(f"could not draw {n} distinct problems with ops={ops!r} digits={digits}")
    return rows, seen - set(exclude)


def write_demo_data(out_dir, seed=0, *, n_train=5000, n_test=500, n_sft=40000, ops="+-",
                    digits=(2, 3), slip_prob=SLIP_PROB):
    """Write train.jsonl (RL prompts), test.jsonl (held out) and sft.jsonl (with solutions).

    The three splits share no (a, op, b), so held-out accuracy measures arithmetic, not recall.
    Only the SFT solutions have slips (`slip_prob`); every "answer" is the true result.
    Returns {split: rows}.
    """
    return write_splits(out_dir, seed, {"test": n_test, "train": n_train, "sft": n_sft},
                        lambda n, split_seed, exclude, slips: generate_rows(
                            n, split_seed, ops=ops, digits=digits, exclude=exclude,
                            slip_prob=slip_prob if slips else 0.0))


def write_splits(out_dir, seed, sizes, generate):
    """Write each split of `sizes` ({"test": n, "train": n, "sft": n}, in that order) to
    out_dir/<split>.jsonl from `generate(n, split_seed, exclude, slips) -> (rows, keys)`, each
    split excluding the keys of those before it; only "sft" keeps solutions (with slips).
    Returns {split: rows}."""
    os.makedirs(out_dir, exist_ok=True)
    splits, used = {}, set()
    for i, (name, n) in enumerate(sizes.items()):
        rows, keys = generate(n, seed * 1000 + i, used, name == "sft")
        used |= keys
        if name != "sft":  # the RL and eval splits carry no worked solution
            rows = [{"problem": r["problem"], "answer": r["answer"]} for r in rows]
        with open(os.path.join(out_dir, f"{name}.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        splits[name] = rows
    return splits


# ----------------------------------------------------------------------------------------------
# The chain task (the loss study's): a op1 b op2 c, worked in an order of the solver's choice
#
# "Ann has 47 coins, finds 38 more and gives away 25. How many now?" is 47+38-25, which can be
# worked as 47+38-25, 38+47-25, 47-25+38 or 38-25+47: every order of the terms that starts with
# an added one and never goes below zero is right. A solution writes its order first (the plan),
# then works it left to right in two column computations. The pre-training solutions pick the
# order uniformly, so the pre-trained model spreads its probability over the orders, which RL can
# collapse onto one; and they slip (CHAIN_SLIP_PROB per computation), so the model is often wrong
# when it samples.

CHAIN_STORY = "{n} has {a} {o}, {p} and {q}. How many now?"
CHAIN_STEPS = {"+": ["finds {x} more", "gets {x} more", "buys {x} more"],
               "-": ["gives away {x}", "loses {x}", "sells {x}"]}
CHAIN_OPS = ["++", "+-", "-+", "--"]
# The share of pre-training computations (two per solution) with one slip of one; calibrated so
# that the pre-trained model is right 20-40% of the time at T=1 (see the module docstring).
CHAIN_SLIP_PROB = 0.3


def chain_orders(a, ops, b, c):
    """Every order in which a op1 b op2 c (ops = op1 op2, each + or -) can be worked left to right
    without going below zero. -> list of "x?y?z": the names a, b, c, each with its own sign.

    The terms are +a, op1 b, op2 c; an order is a permutation of them whose first term is an added
    one (x+y and y+x count as two solutions) and whose first two give at least zero.
    47+38-25 -> ["a+b-c", "a-c+b", "b+a-c", "b-c+a"]. The problem itself must not go below zero
    read as told: a op1 b >= 0 and the answer >= 0.
    """
    if ops not in CHAIN_OPS or not all(isinstance(x, int) and x >= 0 for x in (a, b, c)):
        raise ValueError(f"need ops in {CHAIN_OPS} and non-negative ints, got {a!r} {ops!r} {b!r} {c!r}")
    val, sign = {"a": a, "b": b, "c": c}, {"a": "+", "b": ops[0], "c": ops[1]}
    step = {"+": lambda x, y: x + y, "-": lambda x, y: x - y}
    if step[ops[0]](a, b) < 0 or step[ops[1]](step[ops[0]](a, b), c) < 0:
        raise ValueError(f"{a}{ops[0]}{b}{ops[1]}{c} goes below zero")
    orders = []
    for x, y, z in itertools.permutations("abc"):
        if sign[x] == "+" and step[sign[y]](val[x], val[y]) >= 0:
            orders.append(f"{x}{sign[y]}{y}{sign[z]}{z}")
    return orders


def chain_solution(a, ops, b, c, order, slips=(None, None)):
    """The worked solution of a op1 b op2 c in `order` (one of chain_orders'): the order with the
    numbers, the first computation in columns (worked_solution's lines: "x?y", then the columns),
    the second one on its result r ("r?z", the columns), the answer boxed.

    47+38-25 in "a-c+b" -> "47-25+38\\n47-25\\n17-5-0=12\\n14-2-0=12\\n22+38\\n8+2+0=10\\n3+2+1=06\\n\\boxed{60}".
    `slips`: per computation, None or worked_solution's slip (column, +1 or -1). The second
    computation works on the result the first one's lines give, so a slip carries through to the
    box; it is an error when that takes the second computation below zero.
    """
    if order not in chain_orders(a, ops, b, c):
        raise ValueError(f"{order!r} is not an order of {a}{ops[0]}{b}{ops[1]}{c}")
    val = {"a": a, "b": b, "c": c}
    x, op1, y, op2, z = order
    first, r = column_arithmetic(val[x], op1, val[y], slips[0])
    second, answer = column_arithmetic(r, op2, val[z], slips[1])
    plan = f"{val[x]}{op1}{val[y]}{op2}{val[z]}"
    return "\n".join([plan] + first + second + [f"\\boxed{{{answer}}}"])


def chain_key(a, ops, b, c):
    """The arithmetic a problem asks, whatever its story and order of terms: (added, taken away)."""
    terms = [(1, a), (1 if ops[0] == "+" else -1, b), (1 if ops[1] == "+" else -1, c)]
    return (tuple(sorted(x for s, x in terms if s > 0)), tuple(sorted(x for s, x in terms if s < 0)))


def draw_chain_solution(a, ops, b, c, rng, slip_prob):
    """A pre-training solution: the order uniform among chain_orders', a slip in each computation
    with probability `slip_prob` (column and sign uniform; a slip that would take the second
    computation below zero is left out). -> (solution, order, slips)"""
    order = rng.choice(chain_orders(a, ops, b, c))
    val = {"a": a, "b": b, "c": c}
    x, op1, y, op2, z = order

    def draw(p, q):
        if rng.random() >= slip_prob:
            return None
        return rng.randrange(max(len(str(p)), len(str(q)))), rng.choice((-1, 1))
    slip1 = draw(val[x], val[y])
    r = column_arithmetic(val[x], op1, val[y], slip1)[1]
    if op2 == "-" and r < val[z]:  # the slip took the second computation below zero: leave it out
        slip1, r = None, column_arithmetic(val[x], op1, val[y])[1]
    slips = (slip1, draw(r, val[z]))
    return chain_solution(a, ops, b, c, order, slips), order, slips


def generate_chain_rows(n, seed, *, digits=(2,), exclude=(), slip_prob=0.0):
    """`n` distinct chain problems from `seed`, none of whose chain_key is in `exclude`;
    -> (rows {"problem", "answer", "solution"}, their keys). Each number has one of `digits`
    digits; op1 op2 uniform over CHAIN_OPS; the numbers are redrawn until the problem stays at or
    above zero. Orders and slips come from a stream of their own, so the problems drawn do not
    depend on `slip_prob`."""
    if not digits or min(digits) < 1:
        raise ValueError(f"digits must be >= 1, got {digits!r}")
    if not 0.0 <= slip_prob <= 1.0:
        raise ValueError(f"slip_prob must be in [0, 1], got {slip_prob!r}")
    rng, sol_rng = random.Random(f"chain-{seed}"), random.Random(f"chain-solutions-{seed}")

    def num():
        d = rng.choice(digits)
        return rng.randint(10 ** (d - 1), 10 ** d - 1)
    seen, rows = set(exclude), []
    for _ in range(100 * n):
        if len(rows) == n:
            break
        ops = rng.choice(CHAIN_OPS)
        while True:
            a, b, c = num(), num(), num()
            s1, s2 = (1 if o == "+" else -1 for o in ops)
            if a + s1 * b >= 0 and a + s1 * b + s2 * c >= 0:
                break
        key = chain_key(a, ops, b, c)
        if key in seen:
            continue
        seen.add(key)
        story = CHAIN_STORY.format(n=rng.choice(NAMES), o=rng.choice(THINGS), a=a,
                                   p=rng.choice(CHAIN_STEPS[ops[0]]).format(x=b),
                                   q=rng.choice(CHAIN_STEPS[ops[1]]).format(x=c))
        solution = draw_chain_solution(a, ops, b, c, sol_rng, slip_prob)[0]
        rows.append({"problem": story, "answer": str(a + s1 * b + s2 * c), "solution": solution})
    if len(rows) < n:
        raise ValueError(f"could not draw {n} distinct chain problems with digits={digits}")
    return rows, seen - set(exclude)


def write_chain_data(out_dir, seed=0, *, n_train=5000, n_test=500, n_sft=40000, digits=(2,),
                     slip_prob=CHAIN_SLIP_PROB):
    """write_demo_data for the chain task: train.jsonl, test.jsonl and sft.jsonl (with solutions),
    sharing no chain_key. Returns {split: rows}."""
    return write_splits(out_dir, seed, {"test": n_test, "train": n_train, "sft": n_sft},
                        lambda n, split_seed, exclude, slips: generate_chain_rows(
                            n, split_seed, digits=digits, exclude=exclude,
                            slip_prob=slip_prob if slips else 0.0))


# ----------------------------------------------------------------------------------------------
# The shortcut task (the entropy study's): a + b, answered at a glance or worked in columns
#
# "Ann has 347 coins and finds 251 more. How many now?" can be answered at a glance,
# "347+251=598\n\boxed{598}", or worked in columns as the demo does. The glance adds each column on
# its own and never carries: it is right exactly when no column carries (347+251), and wrong
# otherwise (347+258 at a glance is 595). Most problems do not carry (SHORTCUT_NO_CARRY), so the
# glance pays on most of them, and the worked route, which the pre-training solutions write with
# slips, pays less there. A policy that sharpens onto the glance gains accuracy and loses the
# problems that carry, whose only route is the one it stops sampling: entropy collapse that costs
# pass@k. The choice is the response's first token after "347+251" ("=" or a new line).

# The share of problems with no carry in any column, in every split.
SHORTCUT_NO_CARRY = 0.9
# The share of pre-training solutions that take the glance, and of worked ones with one slip.
SHORTCUT_GLANCE_PROB = 0.5
SHORTCUT_SLIP_PROB = 0.6


def carries(a, b):
    """Whether a + b carries in any column."""
    while a or b:
        if a % 10 + b % 10 >= 10:
            return True
        a, b = a // 10, b // 10
    return False


def glance_sum(a, b):
    """a + b added column by column without carrying (347+258 -> 595): the shortcut's answer.
    A leading column that sums to 10 gives a leading 0, dropped as in any number (547+558 -> 95)."""
    out, place = 0, 1
    while a or b:
        out += (a % 10 + b % 10) % 10 * place
        a, b, place = a // 10, b // 10, place * 10
    return out


def glance_solution(a, b):
    """The shortcut's solution: "a+b=s" and the boxed s, s = glance_sum(a, b)."""
    s = glance_sum(a, b)
    return f"{a}+{b}={s}\n\\boxed{{{s}}}"


def generate_shortcut_rows(n, seed, *, digits=(3,), exclude=(), no_carry=SHORTCUT_NO_CARRY,
                           glance_prob=0.0, slip_prob=0.0):
    """`n` distinct a + b problems from `seed` (none of whose keys is in `exclude`), a share
    `no_carry` of them carrying in no column; -> (rows {"problem", "answer", "solution"}, keys).
    Each solution is the glance with probability `glance_prob`, else worked_solution with one slip
    with probability `slip_prob`; both drawn from a stream of their own, so the problems drawn do
    not depend on them."""
    if not digits or min(digits) < 1:
        raise ValueError(f"digits must be >= 1, got {digits!r}")
    for name, p in (("no_carry", no_carry), ("glance_prob", glance_prob), ("slip_prob", slip_prob)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {p!r}")
    rng, sol_rng = random.Random(f"shortcut-{seed}"), random.Random(f"shortcut-solutions-{seed}")
    seen, rows = set(exclude), []
    for _ in range(n):
        # The kind first, then a new problem of that kind: redrawing a taken problem inside its
        # kind keeps the share exact (a new coin per redraw would drift toward the kind with more
        # problems left, carrying: ~83% without carry in a 40,000-row split instead of 90%).
        want_carry = rng.random() >= no_carry
        for _ in range(10_000):
            a, _, b = sample_operands(rng, "+", digits)
            key = (min(a, b), "+", max(a, b))
            if carries(a, b) == want_carry and key not in seen:
                break
        else:
            raise ValueError(f"could not draw {n} distinct shortcut problems with digits={digits} "
                             f"and no_carry={no_carry}")
        seen.add(key)
        row = make_row(a, "+", b, rng)
        if sol_rng.random() < glance_prob:
            row["solution"] = glance_solution(a, b)
        elif sol_rng.random() < slip_prob:
            slip = (sol_rng.randrange(len(str(max(a, b)))), sol_rng.choice((-1, 1)))
            row["solution"] = worked_solution(a, "+", b, slip)
        rows.append(row)
    return rows, seen - set(exclude)


def write_shortcut_data(out_dir, seed=0, *, n_train=5000, n_test=500, n_sft=40000, digits=(3,),
                        slip_prob=SHORTCUT_SLIP_PROB, glance_prob=SHORTCUT_GLANCE_PROB,
                        no_carry=SHORTCUT_NO_CARRY):
    """write_demo_data for the shortcut task: train.jsonl, test.jsonl and sft.jsonl (with
    solutions), sharing no problem. Returns {split: rows}."""
    return write_splits(out_dir, seed, {"test": n_test, "train": n_train, "sft": n_sft},
                        lambda n, split_seed, exclude, slips: generate_shortcut_rows(
                            n, split_seed, digits=digits, exclude=exclude, no_carry=no_carry,
                            glance_prob=glance_prob if slips else 0.0,
                            slip_prob=slip_prob if slips else 0.0))


# ----------------------------------------------------------------------------------------------
# Supervised pre-training on worked solutions

def sft_batch(tokenizer, rows, template=DEMO_TEMPLATE):
    """Token ids of prompt + solution + EOS for `rows`, right-padded to the longest.

    Returns input_ids, attention_mask, loss_mask, each (B, T); loss_mask is 1 on the response
    tokens (solution and EOS) only, so the model learns to answer, not to write prompts.
    """
    seqs, masks = [], []
    for r in rows:
        if not r.get("solution"):
            raise ValueError(f"SFT row has no 'solution': {r.get('problem', r)!r}")
        prompt = encode_prompt(tokenizer, r["problem"], template)[1]  # as RL and evaluation see it
        response = tokenizer(r["solution"], add_special_tokens=False)["input_ids"]
        response = response + [tokenizer.eos_token_id]
        seqs.append(prompt + response)
        masks.append([0] * len(prompt) + [1] * len(response))
    T = max(len(s) for s in seqs)
    input_ids = torch.full((len(seqs), T), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(seqs), T), dtype=torch.long)
    loss_mask = torch.zeros((len(seqs), T), dtype=torch.float32)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        input_ids[i, :len(s)] = torch.tensor(s)
        attention_mask[i, :len(s)] = 1
        loss_mask[i, :len(s)] = torch.tensor(m, dtype=torch.float32)
    return input_ids, attention_mask, loss_mask


def sft_loss(model, input_ids, attention_mask, loss_mask):
    """Mean next-token cross-entropy over the tokens where loss_mask (B, T) is 1.

    Position t predicts token t+1, so the mask of the targets is loss_mask[:, 1:].
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, T, V)
    nll = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), input_ids[:, 1:].flatten(),
                          reduction="none").view(input_ids.shape[0], -1)  # (B, T-1)
    target_mask = loss_mask[:, 1:]
    return (nll * target_mask).sum() / target_mask.sum().clamp(min=1)


def pretrain(model_dir, sft_rows, *, steps=600, batch_size=64, lr=3e-3, seed=0,
             template=DEMO_TEMPLATE, warmup=30, decay_frac=0.25, weight_decay=0.01, log_every=50,
             out_dir=None):
    """Supervised fine-tuning of the model in `model_dir` on worked solutions; save it back.

    Single process, AdamW on random batches. The learning rate warms up, stays constant, then
    decays linearly to lr/10 over the last `decay_frac` of the steps: the model first has to learn
    to copy the numbers from the prompt (a sudden drop of the loss), which a decay started early
    delays; the final decay is what makes the digit facts precise. Saves model and tokenizer to
    `out_dir` (default: `model_dir`); returns the list of (step, loss).
    """
    if len(sft_rows) < batch_size:
        raise ValueError(f"need at least batch_size={batch_size} SFT rows, got {len(sft_rows)}")
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2]},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    stable_end = int(steps * (1 - decay_frac))
    history, t0, order = [], time.time(), []
    for step in range(1, steps + 1):
        decay = max(0, step - stable_end) / max(1, steps - stable_end)
        step_lr = lr * min(1.0, step / warmup) * (1 - 0.9 * decay)
        for g in opt.param_groups:
            g["lr"] = step_lr
        if len(order) < batch_size:  # epochs of shuffled rows
            order += rng.sample(range(len(sft_rows)), len(sft_rows))
        batch, order = [sft_rows[i] for i in order[:batch_size]], order[batch_size:]
        loss = sft_loss(model, *sft_batch(tokenizer, batch, template))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        history.append((step, loss.item()))
        if log_every and (step % log_every == 0 or step == 1 or step == steps):
            print(f"sft step {step}/{steps}  loss {loss.item():.4f}  lr {step_lr:.2e}  "
                  f"{time.time() - t0:.0f}s", flush=True)
    out_dir = out_dir or model_dir
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return history


# ----------------------------------------------------------------------------------------------
# Measuring accuracy (transformers' generate; the RL loop measures with vLLM)

@torch.no_grad()
def generate(model, tokenizer, prompts, *, temperature=1.0, max_new_tokens=96, batch_size=128,
             seed=0):
    """Responses (str) to `prompts`, lists of token ids (data.encode_prompt's, as RL and eval.py
    give the model): sampled at `temperature`, or greedy when it is 0.

    Left padding, so every prompt ends where generation starts. Sampling is plain softmax at
    `temperature` (top_k=0, top_p=1), like the RL sampler.
    """
    torch.manual_seed(seed)
    model.eval()
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    out = []
    for k in range(0, len(prompts), batch_size):
        enc = tokenizer.pad({"input_ids": [list(p) for p in prompts[k:k + batch_size]]}, padding=True,
                            return_tensors="pt")
        kw = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature \
            else dict(do_sample=False)
        ids = model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id, **kw)
        out += tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    tokenizer.padding_side = side
    return out


def evaluate(model_dir, rows, *, template=DEMO_TEMPLATE, temperatures=(1.0, 0.0), samples=1,
             max_new_tokens=96, seed=0):
    """Accuracy on `rows` at each temperature; returns {temperature: (accuracy, mean resp tokens)}."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    prompts = [encode_prompt(tokenizer, r["problem"], template)[1] for r in rows]
    result = {}
    for temp in temperatures:
        n = samples if temp else 1
        resp = generate(model, tokenizer, prompts * n, temperature=temp,
                        max_new_tokens=max_new_tokens, seed=seed)
        acc = sum(reward.grade(x, r["answer"])[1] for x, r in zip(resp, rows * n)) / len(resp)
        length = sum(len(tokenizer(x, add_special_tokens=False)["input_ids"]) for x in resp) / len(resp)
        result[temp] = (acc, length)
    return result


# ----------------------------------------------------------------------------------------------
# CLI

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="write the demo data, make the tiny model, pre-train it")
    p.add_argument("--out", default="runs/demo", help="writes OUT/data/*.jsonl and OUT/model/")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None,
                   help="pre-training steps (default: 600 demo and shortcut, 800 chain)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--decay-frac", type=float, default=0.25, help="final linear lr decay share")
    p.add_argument("--task", choices=["demo", "chain", "shortcut"], default="demo",
                   help="demo: a op b (the README's demo); chain: a op b op c in a free order "
                        "(the loss study's, bench/study.py); shortcut: a + b at a glance or in "
                        "columns (the entropy study's)")
    p.add_argument("--ops", default="+-", help="demo task: the operations")
    p.add_argument("--digits", default=None,
                   help="digits of the numbers, e.g. 2,3 (default: 2,3 demo; 2 chain; 3 shortcut)")
    p.add_argument("--slip-prob", type=float, default=None,
                   help=f"share of pre-training solutions (demo, default {SLIP_PROB}) or solution "
                        f"steps (chain, default {CHAIN_SLIP_PROB}) or worked solutions (shortcut, "
                        f"default {SHORTCUT_SLIP_PROB}) with one slip of one")
    p.add_argument("--glance-prob", type=float, default=None,
                   help=f"shortcut task: share of pre-training solutions that take the glance "
                        f"(default {SHORTCUT_GLANCE_PROB})")
    p.add_argument("--no-carry", type=float, default=None,
                   help=f"shortcut task: share of problems that carry in no column (default {SHORTCUT_NO_CARRY})")
    p.add_argument("--n-eval", type=int, default=500, help="held-out problems to measure on")
    e = sub.add_parser("eval", help="held-out accuracy of a model directory")
    e.add_argument("model_dir")
    e.add_argument("data", help="JSONL with problem and answer")
    e.add_argument("--n", type=int, default=500)
    e.add_argument("--samples", type=int, default=1)
    e.add_argument("--max-new-tokens", type=int, default=96)
    args = ap.parse_args()

    if args.cmd == "prepare":
        t0 = time.time()
        data_dir, model_dir = os.path.join(args.out, "data"), os.path.join(args.out, "model")
        task = args.task
        if task != "shortcut" and (args.glance_prob is not None or args.no_carry is not None):
            ap.error("--glance-prob and --no-carry are the shortcut task's: add --task shortcut")
        digits = tuple(int(d) for d in (args.digits or {"demo": "2,3", "chain": "2", "shortcut": "3"}[task]).split(","))
        slip_prob = args.slip_prob if args.slip_prob is not None else \
            {"demo": SLIP_PROB, "chain": CHAIN_SLIP_PROB, "shortcut": SHORTCUT_SLIP_PROB}[task]
        if task == "chain":
            write_chain_data(data_dir, seed=args.seed, digits=digits, slip_prob=slip_prob)
        elif task == "shortcut":
            write_shortcut_data(data_dir, seed=args.seed, digits=digits, slip_prob=slip_prob,
                                glance_prob=SHORTCUT_GLANCE_PROB if args.glance_prob is None else args.glance_prob,
                                no_carry=SHORTCUT_NO_CARRY if args.no_carry is None else args.no_carry)
        else:
            write_demo_data(data_dir, seed=args.seed, ops=args.ops, digits=digits, slip_prob=slip_prob)
        make_tiny_model(model_dir, seed=args.seed, **DEMO_MODEL)
        sft_rows = load_problems(os.path.join(data_dir, "sft.jsonl"))
        pretrain(model_dir, sft_rows, steps=args.steps or (800 if task == "chain" else 600),
                 batch_size=args.batch_size, lr=args.lr, decay_frac=args.decay_frac, seed=args.seed)
        print(f"pre-training done in {time.time() - t0:.0f}s; model in {model_dir}")
        args.model_dir, args.data = model_dir, os.path.join(data_dir, "test.jsonl")
        args.n, args.samples, args.max_new_tokens = args.n_eval, 1, 96
    rows = load_problems(args.data)[:args.n]
    t0 = time.time()
    for temp, (acc, length) in evaluate(args.model_dir, rows, samples=args.samples,
                                        max_new_tokens=args.max_new_tokens).items():
        print(f"held-out accuracy at T={temp:g}: {acc:.1%} on {len(rows)} problems "
              f"(mean response {length:.0f} tokens)")
    print(f"evaluation took {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
