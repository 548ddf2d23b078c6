"""Wrong answers that contain the right number, made from the benchmark golds, through a grader: the
false-positive check of a grader that may say "yes" where the rules said no (math-verify, alone or
as a second opinion beside the rules).

Every gold of every benchmark file in the data directory (--data, else $TEPO_DATA_DIR, else
../shared/data; the files are never copied here) that has a number gets a wrong value w: an integer
gold plus d (1-9, seeded), any other gold with one of its numbers plus d. Each (gold r, w) is
written into eleven sentences whose final answer is w while r stands in them as
  - a left side:         "So $r + d = w$."  "\\boxed{r + d = w}"  "The answer is $r + d = w$."
  - an intermediate step: "First we find $r$, and then adding d gives $w$."
                          "We get $\\boxed{r}$ for the first part, so the final answer is $\\boxed{w}$."
                          "She has r apples at first and buys d more, so she has w apples in total."
                          "r + d = w\\n#### w"
  - a ruled-out value:   "The answer is not $r$; it is $w$."  "$r$ is ruled out, which leaves $w$."
                          "Il reste w pommes, pas r."  "答案不是r，而是w。"
Each is judged against r as a pair (verify(r, text)) and as a response (math_reward(text, r)); a
"yes" is a false positive. Printed: the pairs checked and, per grader and template, the false
positives, listing those of --grader that --base (the rules) rejected.

    python bench/prose_pairs.py [--data DIR] [--grader rule+math_verify] [--base rule] [--limit N]
"""
import argparse
import collections
import json
import os
import random
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import reward  # noqa: E402

TEMPLATES = {
    "left_side": "So ${r} + {d} = {w}$.",
    "left_side_boxed": "\\boxed{{{r} + {d} = {w}}}",
    "left_side_answer": "The answer is ${r} + {d} = {w}$.",
    "step_then": "First we find ${r}$, and then adding {d} gives ${w}$.",
    "step_boxed": "We get $\\boxed{{{r}}}$ for the first part, so the final answer is $\\boxed{{{w}}}$.",
    "step_words": "She has {r} apples at first and buys {d} more, so she has {w} apples in total.",
    "step_hashes": "{r} + {d} = {w}\n#### {w}",
    "ruled_out_not": "The answer is not ${r}$; it is ${w}$.",
    "ruled_out_left": "${r}$ is ruled out, which leaves ${w}$.",
    "ruled_out_fr": "Il reste {w} pommes, pas {r}.",
    "ruled_out_zh": "答案不是{r}，而是{w}。",
}


def golds(data_dir):
    """Every gold answer of the .jsonl files in data_dir, in file order."""
    files = sorted(f for f in os.listdir(data_dir) if f.endswith(".jsonl"))
    if not files:
        sys.exit(f"no .jsonl benchmark files in {data_dir} (--data or $TEPO_DATA_DIR)")
    for name in files:
        with open(os.path.join(data_dir, name), encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield name, str(json.loads(line)["answer"])


def wrong_value(gold, d, rng):
    """gold + d for an integer gold; else gold with one of its numbers (not a unit's exponent) plus d;
    None when gold has no number."""
    if re.fullmatch(r"-?\d+", gold.strip()):
        return str(int(gold) + d)
    nums = [m for m in re.finditer(r"\d+", gold)
            if not re.search(r"(?:\\mbox|\\text)\{[^}]*\}\^\{?$", gold[:m.start()])]
    if not nums:
        return None
    m = rng.choice(nums)
    return gold[:m.start()] + str(int(m.group()) + d) + gold[m.end():]


def prose_pairs(data_dir, limit=None):
    """[(file, template, gold, text)]: the eleven wrong answers of every gold with a number."""
    rng, pairs = random.Random(0), []
    for k, (name, gold) in enumerate(golds(data_dir)):
        if limit is not None and k >= limit:
            break
        d = rng.randint(1, 9)
        w = wrong_value(gold, d, rng)
        if w is None or w == gold:
            continue
        for t, form in TEMPLATES.items():
            pairs.append((name, t, gold, form.format(r=gold, w=w, d=d)))
    return pairs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.environ.get("TEPO_DATA_DIR", os.path.join(ROOT, "..", "shared", "data")))
    ap.add_argument("--grader", default=reward.DEFAULT_GRADER, help="the grader checked (a name of reward.GRADERS)")
    ap.add_argument("--base", default="rule", help="the grader its false positives are set against")
    ap.add_argument("--limit", type=int, help="only the first N golds")
    ap.add_argument("--show", type=int, default=50, help="false positives listed at most")
    args = ap.parse_args()
    pairs = prose_pairs(args.data, args.limit)
    which, base = reward.make_grader(args.grader), reward.make_grader(args.base)
    print(f"{len(pairs)} wrong answers containing the right number, from {len(set(g for _, _, g, _ in pairs))} "
          f"golds of {args.data}; grader {args.grader} against {args.base}")
    count = collections.Counter()
    new = []
    t0 = time.perf_counter()
    for name, t, gold, text in pairs:
        for how, judge_new, judge_base in (
                ("pair", lambda: which.verify(gold, text), lambda: base.verify(gold, text)),
                ("response", lambda: which(text, gold) >= 1.0, lambda: base(text, gold) >= 1.0)):
            a, b = judge_new(), judge_base()
            count[(how, t, "new")] += a
            count[(how, t, "base")] += b
            if a and not b:
                new.append((how, name, t, gold, text))
    print(f"({time.perf_counter() - t0:.0f} s)")
    for how in ("pair", "response"):
        print(f"false positives as a {how} ({'verify(gold, text)' if how == 'pair' else 'math_reward(text, gold)'}):"
              f" {args.grader} / {args.base}")
        for t in TEMPLATES:
            print(f"  {t:18s} {count[(how, t, 'new')]:6d} / {count[(how, t, 'base')]:6d}")
        print(f"  {'all':18s} {sum(count[(how, t, 'new')] for t in TEMPLATES):6d} / "
              f"{sum(count[(how, t, 'base')] for t in TEMPLATES):6d}")
    print(f"accepted by {args.grader}, rejected by {args.base}: {len(new)}")
    for how, name, t, gold, text in new[:args.show]:
        print(f"  {how:8s} {name:20s} {t:18s} gold {gold!r:30.30s} {text!r:.100s}")


if __name__ == "__main__":
    main()
