"""Wrong answers that must never pay: right answers turned certainly wrong, put into many kinds of response.

A policy trained on a grader finds every wrong answer the grader pays, so the grader is tried here as
an adversary would: each gold answer is turned into answers that are wrong for certain (by how they
are built, not by the grader's judgement), and each is written into responses of several kinds.
The right answer in the same kinds of response must still pay.

Mutations (a gold of one number, fraction, expression, list, set, tuple, interval or equation):
  off_by_one   one number (of a list: one item) one more or one less
  times_ten    a number times ten (gold != 0)
  negated      a number (or an expression) negated (gold != 0)
  flipped      a fraction turned over (a != b)
  plus_one     an expression + 1 (any finite value changes)
  dropped      a list, set or tuple with an item left out
  added        a list or set with an item added that it does not hold
  interval     a list or set of two numbers a < b as the interval [a, b] or (a, b)
  as_number    a list of two integers a, b < 1000 written as the number `a,0bb` (3, 7 -> 3,007)
  reversed     a tuple with distinct items in reverse order
  bracket      an interval with one bracket turned (closed <-> open, at a finite end)
  endpoints    an interval given as its two endpoints (a list or a set)
  letter       a choice letter replaced by another

Kinds of response (each with the wrong answer w; g is the gold, A an item of it):
  box          w in a box at the end
  reject       g boxed first, withdrawn in words the rules may not know, then w boxed
  reject_item  (several answers) one item of g boxed, withdrawn in words, the rest boxed after
  reject_after (several answers) every item of g boxed, then one withdrawn in words after the last box
  unboxed      w on the final line, no box
  hedge        g and w offered as alternatives: two boxes apart by "or" (either order), one box or
               two math spans holding both apart by "or"
The right answers: the gold in a box, an equivalent form in a box, the gold on the final line, and
for several answers one box per item (joined by commas, "and", "or", indexed names).

    python bench/wrong_answers.py [--data ../shared/data] [--limit N] [--math-verify] [--show 5]

prints, per mutation and per kind, how many wrong answers each grader pays (reward.verify, by the
rules alone, and with --math-verify math-verify 0.9.0 as TRL's reward reads a response), and how
many right answers verify misses. tests/test_wrong_answers.py runs the same battery on golds of its
own and on a sample of the benchmark files, and asserts that no wrong answer pays.
"""
import argparse
import collections
import json
import os
import random
import re
import sys
import time
from fractions import Fraction

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

FILES = ["math500", "minerva_math", "olympiadbench", "gsm8k_test", "aime24", "aime25", "amc23", "math_train"]

# ----------------------------------------------------------------------------- reading a gold (our own, simple)
_INT = re.compile(r"-?\d+")
_DEC = re.compile(r"-?\d+\.\d+")
_FRAC = re.compile(r"(-?)\\[dt]?frac\{(\d+)\}\{(\d+)\}")
_LETTER = re.compile(r"\(?([A-E])\)?")
_PLAIN = re.compile(r"[-\w\\{}^+*/. ]+")  # an expression: no comma, no bracket, no `=`, no text


def _top_split(s, sep=","):
    """s split at `sep` outside brackets and braces, or None when they do not balance."""
    parts, depth, cur = [], 0, []
    i = 0
    while i < len(s):
        c = s[i]
        if s.startswith("\\{", i) or s.startswith("\\}", i):
            depth += 1 if s[i + 1] == "{" else -1
            cur.append(s[i:i + 2])
            i += 2
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if depth < 0:
            return None
        if c == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
        i += 1
    parts.append("".join(cur))
    return None if depth else [p.strip() for p in parts]


def _balanced(s):
    return _top_split(s, "\0") is not None


def _scalar(s):
    """The kind of a scalar gold: 'int', 'dec', 'frac', 'expr' (an expression we can wrap), or None."""
    s = s.strip()
    if _INT.fullmatch(s):
        return "int"
    if _DEC.fullmatch(s):
        return "dec"
    if _FRAC.fullmatch(s):
        return "frac"
    if (_PLAIN.fullmatch(s) and _balanced(s) and re.search(r"\d|\\pi|\\sqrt", s) and "\\text" not in s
            and not re.search(r"[a-zA-Z]{2,}(?<!\\[a-zA-Z]{2})\s+[a-zA-Z]{2,}", s) and "\\%" not in s
            and "\\circ" not in s and "\\infty" not in s and not s.endswith(("^", "_"))):
        return "expr"
    return None


def read_gold(gold):
    """(form, parts) of a gold we can mutate for certain, or None: ('scalar', s), ('list', items),
    ('set', items), ('tuple', items), ('interval', (left, a, b, right)), ('equation', (lhs, rhs)),
    ('letter', L)."""
    g = gold.strip().strip("$").strip()
    g = re.sub(r"\\left|\\right|\\!|\\,|\\;", "", g).replace("\\dfrac", "\\frac").strip()
    if len(g) > 120 or not g or "\\text" in g or "\\begin" in g or "\\cup" in g or "\\pm" in g:
        return None
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+", g):  # `4,\!989,\!600`: one number with thousands separators
        g = g.replace(",", "")
    m = _LETTER.fullmatch(g)
    if m and not gold.strip().isdigit():
        return ("letter", m.group(1))
    if _scalar(g):
        return ("scalar", g)
    items = _top_split(g)
    if items and len(items) >= 2 and all(re.fullmatch(r"([a-zA-Z]) ?= ?(.+)", x) for x in items):
        names = [x.split("=")[0].strip() for x in items]  # `x = 0, x = 2`: the solutions, one name
        rhs = [x.split("=", 1)[1].strip() for x in items]
        items = [f"{n} = {v}" for n, v in zip(names, rhs)]
        return ("list", items) if len(set(names)) == 1 and all(map(_scalar, rhs)) and len(set(rhs)) == len(rhs) else None
    if g.count("=") == 1 and "," not in g:
        lhs, rhs = (x.strip() for x in g.split("="))
        if re.fullmatch(r"[a-zA-Z]", lhs) and _scalar(rhs):
            return ("equation", (lhs, rhs))
        return None
    if "=" in g or "<" in g or ">" in g or "\\le" in g or "\\ge" in g:
        return None
    if g.startswith("\\{") and g.endswith("\\}"):
        items = _top_split(g[2:-2])
        return ("set", items) if items and len(items) >= 2 and all(map(_scalar, items)) else None
    if g[0] in "([" and g[-1] in ")]" and len(_top_split(g) or ()) == 1:
        items = _top_split(g[1:-1])
        infinite = lambda x: re.fullmatch(r"-?\\infty", x)  # noqa: E731
        if not items or not all(_scalar(x) or len(items) == 2 and infinite(x) for x in items):
            return None
        if len(items) == 2 and (g[0] == "[" or g[-1] == "]"):
            return ("interval", (g[0], items[0], items[1], g[-1]))
        return ("tuple", items) if g[0] == "(" and g[-1] == ")" and len(items) >= 2 else None
    if items and len(items) >= 2:
        if all(map(_scalar, items)) and not (len(items) == 2 and re.fullmatch(r"\d{1,3}", items[0])
                                             and re.fullmatch(r"\d{3}", items[1])):  # `10,455`: a number?
            return ("list", items)
        if all(x.startswith("(") and x.endswith(")") and read_gold(x) and read_gold(x)[0] == "tuple" for x in items):
            return ("list", items)
    return None


# ----------------------------------------------------------------------------- wrong answers, by construction
def _number_mutations(s):
    """(name, wrong) pairs for one scalar s: each is certainly not equal to s."""
    out = []
    kind = _scalar(s)
    if kind == "int":
        n = int(s)
        out += [("off_by_one", str(n + 1)), ("off_by_one", str(n - 1))]
        if n:
            out += [("times_ten", str(10 * n)), ("negated", str(-n))]
    elif kind == "dec":
        d = Fraction(s)
        places = len(s.split(".")[1])
        step = Fraction(1, 10 ** places)
        out += [("off_by_one", f"{float(d + step):.{places}f}"), ("off_by_one", str(d + 1 if d.denominator == 1 else float(d + 1)))]
        if d:
            out += [("times_ten", f"{float(d * 10):.{max(places - 1, 0)}f}" if places > 1 else str(float(d * 10))),
                    ("negated", s[1:] if s.startswith("-") else "-" + s)]
    elif kind == "frac":
        sign, a, b = _FRAC.fullmatch(s).groups()
        a, b = int(a), int(b)
        if b:
            out += [("off_by_one", f"{sign}\\frac{{{a + 1}}}{{{b}}}")]
            if a and a != b:
                out += [("flipped", f"{sign}\\frac{{{b}}}{{{a}}}")]
            if a:
                out += [("negated", s[1:] if sign else "-" + s)]
    elif kind == "expr" and not re.search(r"\d\.|\.\d|\de", s):  # a decimal is read within a tolerance
        out += [("plus_one", f"{s} + 1")]
    return out


def _fresh(items):
    """A number that is none of items (as far as plain numbers go): one more than the largest integer."""
    ints = [int(x) for x in items if _INT.fullmatch(x.strip())]
    return str(max(ints) + 1) if ints else "1000003"


def mutations(gold):
    """The wrong answers built from gold, as (name, wrong) pairs; [] for a gold this cannot read."""
    r = read_gold(gold)
    if r is None:
        return []
    form, x = r
    out = []
    if form == "scalar":
        out = _number_mutations(x)
    elif form == "letter":
        out = [("letter", "ABCDE"[("ABCDE".index(x) + 1) % 5])]
    elif form == "equation":
        lhs, rhs = x
        out = [(name, f"{lhs} = {w}") for name, w in _number_mutations(rhs) if name != "negated" or rhs.strip() != "0"]
    elif form in ("list", "set"):
        wrap = (lambda items: "\\{" + ", ".join(items) + "\\}") if form == "set" else ", ".join
        if len(set(x)) != len(x):
            return []
        assigned = re.match(r"([a-zA-Z]) = ", x[0])  # `x = 0, x = 2`
        name_of = (lambda v: f"{assigned.group(1)} = {v}") if assigned else (lambda v: v)  # noqa: E731
        values = [i.split("=", 1)[1].strip() for i in x] if assigned else x
        for i in range(len(x)):
            item_mutations = _number_mutations(values[i]) if _scalar(values[i]) else \
                [(n, w) for n, w in mutations(values[i]) if n in ("off_by_one", "plus_one")]  # a point's
            for name, w in item_mutations[:1]:
                if w not in values:
                    out.append((name, wrap(x[:i] + [name_of(w)] + x[i + 1:])))
            out.append(("dropped", wrap(x[:i] + x[i + 1:]) if len(x) > 2 or form == "set" else x[1 - i]))
        fresh = _fresh(values) if _scalar(values[0]) else "(" + ", ".join([_fresh(values)] * values[0].count(",")) + ", 0)"
        out.append(("added", wrap(x + [name_of(fresh)])))
        x = values
        if len(x) == 2 and all(_INT.fullmatch(i) for i in x):
            a, b = sorted(int(i) for i in x)
            if a != b:
                out += [("interval", f"[{a}, {b}]"), ("interval", f"({a}, {b})")]
            for u, v in ((a, b), (b, a)):  # 3, 7 -> `3,007`; 0, 1 -> `1,000`; 0, 2 -> `2,000`
                if 0 < u < 1000 and 0 <= v < 100:
                    out.append(("as_number", f"{u},{v:03d}"))
        if len(x) > 2 and all(_INT.fullmatch(i) for i in x[:2]) and 0 < int(x[0]) < 1000 and 0 <= int(x[1]) < 100:
            out.append(("as_number", f"{x[0]},{int(x[1]):03d} \\text{{ and }} " + ", ".join(x[2:])))  # 3,007 and 5
    elif form == "tuple":
        if x != x[::-1]:
            out.append(("reversed", "(" + ", ".join(x[::-1]) + ")"))
        for i in range(len(x)):
            for name, w in _number_mutations(x[i])[:1]:
                out.append((name, "(" + ", ".join(x[:i] + [w] + x[i + 1:]) + ")"))
        out.append(("dropped", "(" + ", ".join(x[:-1]) + ")" if len(x) > 2 else x[0]))
    elif form == "interval":
        left, a, b, right = x
        flip = {"(": "[", "[": "(", ")": "]", "]": ")"}
        if "infty" not in a:
            out.append(("bracket", f"{flip[left]}{a}, {b}{right}"))
        if "infty" not in b:
            out.append(("bracket", f"{left}{a}, {b}{flip[right]}"))
        for name, w in _number_mutations(b)[:1]:
            out.append((name, f"{left}{a}, {w}{right}"))
        out += [("endpoints", f"{a}, {b}")] + ([("endpoints", f"\\{{{a}, {b}\\}}")] if "infty" not in a + b else [])
    return [(name, w) for name, w in dict.fromkeys(out) if w.strip() and w.strip() != gold.strip()]


# ----------------------------------------------------------------------------- kinds of response
_WORK = "We set up the equation and solve it step by step, checking each case."
# withdrawals the rules' word lists may not hold: what a model says when it throws out a value
_WITHDRAWN = ["but this isn't in the domain of $\\log(x-5)$", "in (a) we get a contradiction",
              "but then the denominator vanishes", "which is too large for the constraint",
              "but plugging it back in gives $0 = 2$", "so this case is out", "but that contradicts $x > 4$",
              "and this violates the triangle inequality", "but it makes the radicand negative",
              "though that double-counts the first arrangement"]


def responses(gold, wrong, rng):
    """(kind, response) pairs with the wrong answer `wrong` for the gold `gold`."""
    why = rng.choice(_WITHDRAWN)
    out = [("box", f"{_WORK}\n\nTherefore, the final answer is $\\boxed{{{wrong}}}$."),
           ("reject", f"{_WORK} Trying $n = \\boxed{{{gold}}}$: {why}. So the answer is $\\boxed{{{wrong}}}$."),
           ("reject", f"{_WORK} So $x_1 = \\boxed{{{gold}}}$, {why}. Hence $x_2 = \\boxed{{{wrong}}}$."),
           ("reject", f"{_WORK} Trying $n=\\boxed{{{gold}}}$: in (a) {why}, so the answer is $\\boxed{{{wrong}}}$."),
           ("reject", f"{_WORK} Substituting $x = \\boxed{{{gold}}}$ in (ii), {why}, so $x = \\boxed{{{wrong}}}$."),
           ("reject", f"{_WORK}\n(1) Solving gives $x = \\boxed{{{gold}}}$.\n(2) But {why}, so we take $x = \\boxed{{{wrong}}}$."),
           ("unboxed", f"{_WORK}\n\nThe answer is ${wrong}$."),
           ("hedge", f"{_WORK} The answer is $\\boxed{{{gold}}}$ or $\\boxed{{{wrong}}}$."),
           ("hedge", f"{_WORK} The answer is $\\boxed{{{wrong}}}$ or $\\boxed{{{gold}}}$."),
           ("hedge", f"{_WORK} The answer is $\\boxed{{{gold} \\text{{ or }} {wrong}}}$."),
           ("hedge", f"{_WORK} The answer is ${wrong}$ or ${gold}$."),
           ("hedge", f"{_WORK} The answer is $\\boxed{{{gold} \\;\\mathrm{{or}}\\; {wrong}}}$."),
           ("hedge", f"{_WORK} The answer is \\({gold}\\) or \\({wrong}\\)."),
           ("hedge", f"{_WORK} The answer is\n\\[{wrong}\\]\nor\n\\[{gold}\\]")]
    return out


def item_rejections(gold, rng):
    """(several answers) responses that box one item of the gold, withdraw it, then box the rest:
    their final answer lacks that item, so each is wrong."""
    r = read_gold(gold)
    if r is None or r[0] not in ("list", "set") or len(set(r[1])) != len(r[1]):
        return []
    items = r[1]
    out = []
    for i in range(len(items)):
        rest = ", ".join(items[:i] + items[i + 1:])
        why = rng.choice(_WITHDRAWN)
        out += [("reject_item", f"{_WORK} So $x_1 = \\boxed{{{items[i]}}}$, {why}. Hence $x_2 = \\boxed{{{rest}}}$."),
                ("reject_item", f"{_WORK} Trying $n=\\boxed{{{items[i]}}}$: {why}. So the answer is $\\boxed{{{rest}}}$."),
                ("reject_item", f"{_WORK}\n(a) We find $\\boxed{{{items[i]}}}$, {why}.\n(b) Then $\\boxed{{{rest}}}$."),
                ("reject_after", f"{_WORK} So " + " and ".join(f"$x = \\boxed{{{x}}}$" for x in items)
                 + f", {why} for $x = {items[i]}$."),
                ("reject_after", f"{_WORK} So $x = \\boxed{{{', '.join(items)}}}$. But $x = {items[i]}$: {why}."),
                ("reject_after", f"{_WORK} So " + ", ".join(f"$x_{k + 1} = \\boxed{{{x}}}$" for k, x in enumerate(items))
                 + f".\n\nBut {why} for $x = {items[i]}$, so only the others remain.")]
    return out


def right_responses(gold):
    """(form, response) pairs that state the gold: each must pay."""
    out = [("box", f"{_WORK}\n\nTherefore, the final answer is $\\boxed{{{gold}}}$."),
           ("unboxed", f"{_WORK}\n\nThe answer is ${gold}$.")]
    r = read_gold(gold)
    if r and r[0] in ("list", "set") and len(set(r[1])) == len(r[1]):
        items = r[1]
        boxes = lambda sep: sep.join(f"\\boxed{{{i}}}" for i in items)  # noqa: E731
        out += [("boxes", f"{_WORK} The solutions are ${boxes(', ')}$."),
                ("boxes", f"{_WORK} The solutions are ${boxes('$ and $')}$."),
                ("boxes", f"{_WORK} So $x = " + "$ or $x = ".join(f"\\boxed{{{i}}}" for i in items) + "$."),
                ("boxes", f"{_WORK} So " + ", ".join(f"$x_{k + 1} = \\boxed{{{i}}}$" for k, i in enumerate(items)) + "."),
                ("reordered", f"{_WORK} The answer is $\\boxed{{{', '.join(items[::-1])}}}$.")]
    return out


def battery(golds, seed=0):
    """Every (gold, mutation, kind, response) of the wrong answers built from golds."""
    rng = random.Random(seed)
    for gold in golds:
        for name, wrong in mutations(gold):
            for kind, text in responses(gold, wrong, rng):
                yield gold, name, kind, text
        for kind, text in item_rejections(gold, rng):
            yield gold, "dropped", kind, text


def right_battery(golds):
    for gold in golds:
        if read_gold(gold) is not None:
            for form, text in right_responses(gold):
                yield gold, form, text


def load_golds(data, limit=None):
    golds = []
    for name in FILES:
        path = os.path.join(data, name + ".jsonl")
        if os.path.exists(path):
            rows = [json.loads(line) for line in open(path, encoding="utf-8")]
            golds += [str(r["answer"]) for r in rows[:limit]]
    return golds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", default=os.environ.get("TEPO_DATA_DIR", os.path.join(ROOT, "..", "shared", "data")))
    ap.add_argument("--limit", type=int, default=None, help="golds per file (default: all)")
    ap.add_argument("--math-verify", action="store_true", help="also count what math-verify pays")
    ap.add_argument("--show", type=int, default=3, help="examples shown per kind that paid")
    ap.add_argument("--grader-dir", default=None, help="import reward.py from this checkout (before/after)")
    args = ap.parse_args()
    if args.grader_dir:
        sys.path.insert(0, os.path.abspath(args.grader_dir))
    import reward
    golds = list(dict.fromkeys(load_golds(args.data, args.limit)))
    graders = {"verify": reward.verify, "rules": reward.rule_verify}
    if args.math_verify:
        mv = reward.make_grader("math_verify")
        graders["math-verify"] = lambda g, r: mv(r, g) == 1.0
    paid = {k: collections.Counter() for k in graders}
    total, examples, t0 = collections.Counter(), collections.defaultdict(list), time.time()
    for gold, name, kind, text in battery(golds):
        total[(name, kind)] += 1
        for k, f in graders.items():
            if f(gold, text):
                paid[k][(name, kind)] += 1
                if k == "verify" and len(examples[(name, kind)]) < args.show:
                    examples[(name, kind)].append((gold, text[len(_WORK):].strip()))
    missed, n_right = collections.Counter(), collections.Counter()
    right_examples = collections.defaultdict(list)
    for gold, form, text in right_battery(golds):
        n_right[form] += 1
        if not reward.verify(gold, text):
            missed[form] += 1
            if len(right_examples[form]) < args.show:
                right_examples[form].append((gold, text[len(_WORK):].strip()))
    readable = sum(read_gold(g) is not None for g in golds)
    print(f"golds: {len(golds)} distinct, {readable} of a form the battery reads; "
          f"{sum(total.values())} wrong answers, {sum(n_right.values())} right ones; {time.time() - t0:.0f} s")
    print(f"{'mutation':<11} {'kind':<12} {'n':>6} " + " ".join(f"{k:>11}" for k in graders))
    for key in sorted(total):
        print(f"{key[0]:<11} {key[1]:<12} {total[key]:>6} " + " ".join(f"{paid[k][key]:>11}" for k in graders))
    print(f"{'all':<11} {'':<12} {sum(total.values()):>6} " + " ".join(f"{sum(paid[k].values()):>11}" for k in graders))
    for kind in sorted({k for _, k in total}):
        print(f"  kind {kind:<12} " + " ".join(
            f"{k}={sum(v for (m, kk), v in paid[k].items() if kk == kind)}" for k in graders))
    print("right answers missed by verify: " + ", ".join(f"{f} {missed[f]}/{n_right[f]}" for f in sorted(n_right)))
    for key, ex in sorted(examples.items()):
        for gold, text in ex:
            print(f"PAID {key}: gold {gold!r}: {text!r}")
    for form, ex in sorted(right_examples.items()):
        for gold, text in ex:
            print(f"MISSED {form}: gold {gold!r}: {text!r}")


if __name__ == "__main__":
    main()
