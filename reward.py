"""reward.py: a rule-based math answer grader that is right, fast, and never hangs.

    extract_answer(text)        -> the final answer of a response or reference solution, or None
    after_thinking(text)        -> the part of a thinking model's response that is graded
    verify(gold, pred)          -> True when the two denote the same mathematical answer
    rule_verify(gold, pred)     -> the same by the rules alone, without math-verify's second opinion
    math_reward(response, gold) -> 1.0 / 0.0 (configurable) for RL

How `verify` decides, cheapest first (most pairs never get past step 2):
  1. final answer: a whole solution text is reduced to its final answer (extract_answer; a prose
     sentence without one to the value it states: "The largest $n$ is 34.", "所以这个数是12");
  2. clean (mathexpr._clean): LaTeX noise, units, `\\text{}`, `$`, currency, thousands separators,
     `%` and degree marks are removed, giving a canonical string; equal strings are equal answers;
  3. structure (mathexpr._structure): tuples and intervals (ordered, brackets must match), sets and
     bare lists (unordered), unions, matrices (and sums of their multiples), `\\pm`, equations and
     labelled values (`x = 2`, `|z| = 2`, `AB:CD = 2:5` vs the value), inequalities (as intervals,
     one-variable linear ones solved), ratios, letters;
  4. value: each scalar is parsed into a tree and evaluated by mathexpr.py: exactly (Fractions)
     when it is rational, at 3 seeded rational points for its free symbols, and in complex floats
     otherwise. Equal floats are then confirmed at 50 digits with mpmath (sympy's numeric engine,
     installed with sympy), so 2^{60}+x and 2^{60}+1+x do not meet at float precision.
     This is identity testing: it never calls sympy.simplify, whose run time has no bound.

Conventions (each a choice some grader makes differently): `\\log` is natural, `e` and `i` are the
constants, `\\sqrt53` is sqrt(5)*3 as LaTeX renders it; free symbols are sampled positive (answers
assume sqrt(x^2) = x), and negative too when |x|, floor or ceil appear; `rel_tol` (1e-4) applies when
a side is written as a decimal, except two decimals with the same number of significant digits,
which must agree (4813.24 != 4813.25); `%` follows the gold (50% = 50 = 0.5, but 50 != 0.5); units
and words after a number are ignored (5 cm = 5), but not letters after an expression (2 xy != 2);
a letter gold (A-J) takes only that letter; bare lists and sets are unordered (sets without their
duplicates), tuples and intervals ordered with their brackets, and so is a list of assignments
(`x = 10, y = 4` is the tuple (10, 4)); `x = 5` stands for 5, `5 = 2p + q` for no value, and
equations match up to a constant factor; `3,5` is 3.5 against a number (`10,455` is 10455).

Rules of the second round (each as a careful human grader would read it; no rule may turn a wrong
answer right, so a number the text only contains, an intermediate step or a ruled-out option stays
wrong): boxes joined by `\\quad \\text{and} \\quad` (or `\\,`, `\\;`) are one answer, like boxes joined
by commas or "and"; a response's closing sign-off ("I hope it is correct.", "Hope this helps!") is
not its last sentence; after "is", a number with a unit of one or two words is the value ("The total
is 9 apples." -> 9, but not "3 more than x"); a sentence that ends in a number with a counter or a
unit of up to 3 characters glued on ("共有42个。", "7 है।", "4,75 €") states that number; options ruled
out in so many words ("B, not A or C", "(A) and (C) are ruled out", "B，不是A", "B, no A") are not
named, so one letter left is the answer; a gold `B Maria` (the option's letter and text) takes the
letter; `|x - c| < r` (<=, >, >=) is the set it describes over the reals, (c - r, c + r) or two rays.

Rules of the third round (the same discipline): boxes apart only by spacing (`\\ `), "and at", or
one per item of a bulleted or numbered list are one answer, and so are `x_1 = \\boxed{..}, x_2 =
\\boxed{..}`; solutions written as groups of the same names' values apart by `;` or "or" (`a = 2, b
= 3; a = 3, b = 2`) are a list of tuples, and so is `(a, b) = (2, 3) or (3, 2)`; a prose sentence
with no value after its verb states the number of its last clause (after the last '=' if it has one:
"3 + 6 = 9 apples"), in any language, when that is the clause's only number and an amount of money
("She earned $1,250 in total."), a percent ("So 35% passed.") or followed only by what it counts: one
word, maybe after "more", before closing words ("7 Stunden", "6个苹果", "5개입니다", "5'tir", "56
handshakes in total", "250 रुपये है"), but not two ("12 billes rouges" may count something else), nor
an operand or a rank ("3 more than 5", "with 12", "the first 8", "$100 less than"), nor a denied value
("n'est pas 25", "不是5"), and a clause that rules a value out ("..., not 13") is passed over;
`1.234,50` and `3 200,75` are one number; after the verb, an option letter is the value ("The correct
option is (C), since (A) and (D) fail."), and a prose answer against a letter is read as written
(cleaning made "(B); (A) and (C) are ruled out" one list); in a text with no answer marker whose
every `$` comes before a digit, the `$` are dollars; "x = 3 is the solution." states x = 3; `30^\\circ
C` (or F) is 30 degrees; against a number, `12 m^2` is 12 (square metres); `|a + b| = 5` labels 5
like `|z| = 2`; a set-builder `\\{x \\mid x > 3\\}` (also `:`, `|`) is the interval(s) it describes.
Two false positives of the old rules closed: a text with two words of prose (or "not") is no
product of symbols (`0 is not the answer` parsed as 0 * i * s * ...), and a sentence's last number
is not its value when its clause rules it out ("Il reste 4 pommes, pas 5.").

Several answers (issue 56): a gold or response of several answers (boxes joined as above, answers
joined by commas, `;`, "and" or "or", math spans so joined, `$2$ and $5$`, a set `\\{..\\}`) is one
collection, compared as a set: in any order, each item by the rules of one answer, a repeated item
counting once (`(1, 2), (2, 1), (1, 2)` = `(2, 1), (1, 2)`; not an item with `=`), unless the gold itself
repeats one (`2, 2, 3`: then as many); a different number of distinct answers (a superset, a subset,
one right and one wrong) is wrong. A tuple, point or interval is one ordered answer, never reordered
and never several answers (`[1, 2]` is not the solutions 1 and 2), and so is a list of assignments of
several names against a tuple (`x = 10, y = 4`; not `x = 0, x = 2`). Against a gold of several answers
only (grade and verify read the gold first), boxes are also one list when a part is named at the start
of a clause between them ("for part (a)", "; (b)") or when they give one name with two indices (`y_1 =
..`, `y_2 = ..`), and then only where the text between them is a list's joint (punctuation, the labels,
and words of mathexpr._JOINT_WORDS: "and", "then", "the other root is"): a withdrawal in any words
("but this isn't in the domain", "we get a contradiction") keeps them apart, and so do words after
joined boxes that are not a closing ("These are the solutions."), or math after a box of several.
Two answers of several items offered as alternatives (`\boxed{1, -2}` or `\boxed{1}`) are a hedge,
right only where each of them is. A sentence "The final answer is $...$" after the last box is the
final answer when it states a plain number; against a gold bare list or set, `10,455` is the list 10,
455 (against a number, a tuple or an interval, the number 10455; `3,007` is always a number: a list
item is never written `007`). bench/wrong_answers.py tries all this as an adversary would. Where the rules cannot read an item, the second opinion is asked as for one answer: item by
item for two lists or sets of scalars (math-verify reads `\\max(2, 5), \\gcd(4, 6)` as no set of
numbers), else about the two collections; within one SECOND_OPINION_TIMEOUT in all (past it, a timeout
for guarded() to count).

The second opinion (verify; the default grader, "rule+math_verify"; "rule" is rule_verify): where
the rules find two final answers different because they could not read one of them (a function or
a notation mathexpr does not parse: `\\gcd(12, 8)`, `\\operatorname{lcm}(4, 6)`), math-verify is
asked about the two final answers the rules extracted, and its "yes" counts. Not where the rules read
both (math-verify would only read the same values, or by other conventions); nor, the rules'
veto, where either is an equation or prose, which math-verify misreads (it takes `2x = 6` for 6 and
picks numbers out of sentences). It runs in a worker process of the calling thread
(second_opinion.py), bounded by SECOND_OPINION_TIMEOUT of wall clock in any thread (a worker over
it is killed and replaced), after at most SECOND_OPINION_START for a new worker's import; a timeout
or an error is "no", and guarded() counts it as a failed grading call. An answer over SECOND_OPINION_MAX
characters or nested deeper than SECOND_OPINION_DEPTH is not shown to it (its time grows with both).

Never hangs: every input is length-capped; mathexpr bounds the cost of each parse and evaluation
(caps on tokens, nesting and the size of exact values; a value it cannot compute safely is
"undecided", i.e. not equal); and the slow path runs under a deadline implemented with
sys.setprofile, which, unlike signal.alarm, works in any thread (trainer thread pools, vLLM or
torchrun workers). A C call that the hook cannot interrupt is prevented by mathexpr's size bounds.
"""
import collections
import functools
import operator
import os
import re
import signal
import sys
import threading
import time
import zlib
from fractions import Fraction

from mathexpr import FLOAT, Undecided, evaluate, mp_backend, nodes, parse, to_backend
# the answer-string normalisation (cleaning and structure) lives in mathexpr.py beside the parser
from mathexpr import HEDGE, _SIMPLE_LHS, _THOUSANDS, _clean, _key, _several_items, _split_top, _structure
# ... and so do the text rules that find an answer in a response (extract_answer chains them)
from mathexpr import (_ANSWER_WORDS, _PROSE, _PROSE_ASCII, _answer_is, _from_prose, _hashes, _last_boxed,
                      _last_math, _prepare)
import second_opinion

_parse = parse  # the old name: bench/bench_reward.py clears its cache as reward._parse

__all__ = ["extract_answer", "verify", "math_reward", "make_grader", "GRADERS"]

MAX_TEXT = 200_000    # characters of a response looked at (the tail: answers come last)
MAX_ANSWER = 2_000    # an extracted answer longer than this is compared as a plain string only
TIME_BUDGET = 0.08    # seconds for the slow path of one verify call (realistic ones take < 0.02)


# ----------------------------------------------------------------------------- extraction
def _stated_math(s):
    """The last math span of s, or in prose the value it states ("The largest $n$ is 34." -> 34, not
    n); None if s has no math span (a bare number is no answer for math_reward)."""
    math = _last_math(s)
    if math is None:
        return None
    stated = _from_prose(s)
    return math if stated is s else stated


def _answer_tag(s):
    """The content of the last `<answer>...</answer>` (the R1-Zero style format), or None."""
    j = s.rfind("</answer>")
    i = s.rfind("<answer>", 0, j) if j > 0 else -1
    content = s[i + 8:j].strip() if i >= 0 else ""
    return (_answer_is(content) or _stated_math(content) or _from_prose(content)) if content else None


# Minerva's closing line, "The final answer is $10,455$.": after the last box, a number it states is the final answer
_FINAL_IS = re.compile(r"(?i)\bfinal\s+answer\s+is\s*\$")
_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")


def _boxed(s, several=True):
    """The boxed answer (_last_boxed), unless a sentence "The final answer is $...$" after the last
    box states a plain number (digits, a sign, thousands separators, a decimal point: "$10,455$"):
    then that number. Anything else it states ("$\\$12$", "$x$, where $x = 5$") leaves the box."""
    ans = _last_boxed(s, several)
    later = _FINAL_IS.search(s, max(s.rfind("\\boxed"), s.rfind("\\fbox"))) if ans is not None else None
    stated = _answer_is(s[later.start():]) if later else None
    return stated.strip() if stated and _PLAIN_NUMBER.fullmatch(stated.strip()) else ans


def _extract(s, several=True):
    """The answer of the first rule that finds one (see extract_answer), or None."""
    for rule in (_boxed, _answer_tag, _answer_is, _hashes, _stated_math):
        ans = rule(s, several) if rule is _boxed else rule(s)
        if ans is not None and ans.strip():
            return ans.strip()
    return None


def extract_answer(text, *, several=True):
    """The final answer in `text`, or None if it has none.

    In order: the last \\boxed{...}/\\fbox{...} with balanced braces (also `\\boxed 5`; boxes in a
    row such as `\\boxed{2}, \\boxed{3}`, one per labelled part, or per indexed name `y_1`, `y_2`, are
    joined; a later "The final answer is $...$" that states a number replaces them; `several=False`,
    grade's reading against a gold of one answer, joins no boxes per part named in the text or per
    indexed name: see mathexpr._last_boxed), else the content of
    the last `<answer>...</answer>`, else the value after
    the last "(final) answer is" / "answer:" (also "Respuesta:", "答案是", ...: the languages of
    mathexpr._ANSWER_WORDS), else GSM8K's `#### ...`, else the last `$...$` (or \\(...\\),
    \\[...\\]) span, or in prose with such spans the value the last sentence states ("The largest $n$
    is 34." -> 34). The text ends at the first end-of-turn marker (`<|im_end|>`, `</s>`, ...). With a
    `<think>` block, the text after `</think>` is searched first, then the whole text.
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_answer expects a str, got {type(text).__name__}")
    text = _prepare(text[-MAX_TEXT:])
    if "</think>" in text:
        ans = _extract(text.rsplit("</think>", 1)[1], several)
        if ans is not None:
            return ans
    return _extract(text, several)


def _has_marker(s):
    """Does s have a final-answer marker? (substring tests: a regex over a whole response is slow)"""
    if any(m in s for m in ("\\boxed", "\\fbox", "####", "</think>")):
        return True
    low = s.lower()
    return "answer" in low or any(w in low for w in _ANSWER_WORDS) or "jawabannya" in low


def _final_answer(s, several=True):
    """What verify compares: the extracted answer of a solution text; the value a prose sentence
    states (see _from_prose); else s itself (a bare answer)."""
    if _has_marker(s):
        ans = extract_answer(s, several=several)
        if ans is not None:
            return ans
    return _from_prose(s, dollars=True)


def _several(g):
    """Is the final answer g several answers (a list or set of two or more)? Only against such a
    gold are a response's boxes joined per part named in the text or per indexed name: against one
    answer, "$a_1 = \\boxed{3}$, and so $a_2 = \\boxed{7}$" is 7, not the list 3, 7."""
    if len(g) > MAX_ANSWER:
        return False
    try:
        x = _structure(_clean(g)[0])
    except Exception:
        return False
    return x[0] in ("list", "set") and len(x[1]) > 1


@functools.lru_cache(maxsize=1024)
def _gold_several(gold):
    """_several of a gold's final answer (a GRPO group's responses share one gold: cached)."""
    try:
        return _several(_final_answer(_prepare(gold[-MAX_TEXT:])))
    except Exception:
        return False


# ----------------------------------------------------------------------------- structures
def _match_unordered(gs, ps, eq, repeats=False):
    """Pair every item of gs with an equal item of ps. Candidates are tried nearest value first (a
    float at one seeded point), so a reordered list costs about n comparisons, not n^2 / 2. With
    `repeats` (ps is a bare list), a pred with more items than a gold that repeats none is a set: it
    matches when each of its items equals an item of gs and each item of gs is met (`(1, 2), (2, 1),
    (1, 2)` = `(2, 1), (1, 2)`); a gold that repeats an item (`2, 2, 3`: side lengths, a multiplicity)
    takes only as many."""
    if repeats and len(ps) > len(gs) and len(set(gs)) == len(gs) and not any(map(_has_equation, ps)):
        return _covers(gs, ps, eq)
    if len(gs) != len(ps):
        return False
    same = collections.Counter(gs) & collections.Counter(ps)  # the same items first: no comparison needed,
    gs, ps = list((collections.Counter(gs) - same).elements()), list((collections.Counter(ps) - same).elements())
    left = [(_fingerprint(p), p) for p in ps]  # so a list of 400 reordered costs 400 steps, not 80,000
    for g in gs:
        fg = _fingerprint(g) if len(left) > 3 else None
        order = sorted(range(len(left)), key=lambda i: _distance(fg, left[i][0])) if fg else range(len(left))
        i = next((i for i in order if eq(g, left[i][1])), None)
        if i is None:
            return False
        del left[i]
    return True


def _covers(gs, ps, eq):
    """Is every item of ps equal to an item of gs, and every item of gs met? (ps with duplicates; no
    item of ps an equation: `x = 1, y = 2, z = 1` is three answers, not 1 and 2 with 1 repeated.)
    Items equal within rel_tol count as one: `1.5, 1.5001, 2` covers `1.5, 2` (as `1.5001` alone
    equals 1.5)."""
    ps = tuple(dict.fromkeys(ps))  # the same text twice: once (no comparisons)
    if len(ps) < len(gs):
        return False
    pset, gset = set(ps), set(gs)
    met = {i for i, g in enumerate(gs) if g in pset}  # an item the same as a gold's: met, no comparison
    ps = [p for p in ps if p not in gset]
    fgs = [_fingerprint(g) for g in gs] if len(gs) > 3 else None
    for p in ps:
        fp = _fingerprint(p) if fgs else None
        order = sorted(range(len(gs)), key=lambda i: _distance(fp, fgs[i])) if fp else range(len(gs))
        i = next((i for i in order if eq(gs[i], p)), None)
        if i is None:
            return False
        met.add(i)
    return len(met) == len(gs)


def _has_equation(x):
    """Does structure x hold an `=` (an assignment `x = 1`, an equation)?"""
    if x[0] == "expr":
        return "=" in x[1]
    return x[0] in ("list", "set", "union", "seq") and any(map(_has_equation, x[-1]))


def _fingerprint(x):
    """The float values of a scalar or a tuple of scalars at the first seeded point, or None."""
    items = (x,) if x[0] == "expr" else x[2] if x[0] == "seq" and len(x[2]) < 10 else ()
    values = []
    for item in items:
        t = parse(item[1]) if item[0] == "expr" and len(item[1]) < 200 else None
        try:
            values.append(complex(to_backend(evaluate(t[0], _point(t[2], 0), FLOAT), FLOAT)) if t else None)
        except (Undecided, ArithmeticError, ValueError, TypeError, KeyError):
            values.append(None)
    return tuple(values) if values and None not in values else None


def _distance(a, b):
    return sum(abs(x - y) for x, y in zip(a, b)) if b is not None and len(a) == len(b) else float("inf")


def _as_vector(x):
    """A ()-tuple, or a one-row / one-column matrix, as a flat tuple of items; else None."""
    if x[0] == "seq" and x[1] == "()":
        return x[2]
    if x[0] == "mat" and len(x[1]) == 1:
        return x[1][0]
    if x[0] == "mat" and all(len(r) == 1 for r in x[1]):
        return tuple(r[0] for r in x[1])
    return None


def _struct_equal(g, p, ctx):
    """Compare two structures; tuples ordered, sets/lists/unions unordered."""
    eq = functools.partial(_struct_equal, ctx=ctx)
    if g[0] in ("set", "list") and len(g[1]) == 1 and p[0] not in ("set", "list"):
        g = g[1][0]  # {3} vs 3
    if p[0] in ("set", "list") and len(p[1]) == 1 and g[0] not in ("set", "list"):
        p = p[1][0]
    if g[0] == "list" and p[0] == "set" and len(set(g[1])) < len(g[1]):
        return False  # the gold counts an item twice (`2, 2, 3`: side lengths): a set cannot
    if "set" in (g[0], p[0]):  # {1, 2, 2} = {1, 2}, and {2} = 2, 2
        g, p = ((x[0], tuple(dict.fromkeys(x[1]))) if x[0] in ("set", "list") else x for x in (g, p))
    gk, pk = g[0], p[0]
    if gk == "expr" and pk == "expr":
        return _scalar_equal(g[1], p[1], ctx)
    if gk == "mat" and pk == "mat":  # entries rounded in the gold (0.33 for 1/3) are read as rounded
        near = lambda a, b: eq(a, b) or _rounded_equal(a, b)  # noqa: E731
        return len(g[1]) == len(p[1]) and all(
            len(a) == len(b) and all(map(near, a, b)) for a, b in zip(g[1], p[1]))
    if gk == "mat" or pk == "mat":  # a column or row vector equals a tuple
        gv, pv = _as_vector(g), _as_vector(p)
        return gv is not None and pv is not None and len(gv) == len(pv) and all(map(eq, gv, pv))
    if gk == "seq" and pk == "seq":
        return g[1] == p[1] and len(g[2]) == len(p[2]) and all(map(eq, g[2], p[2]))
    if gk == "seq" and pk == "list" and g[1] == "()":  # (10, 4) vs x = 10, y = 4; not 10, 4 (an open
        # interval's endpoints are not the interval, `x = \boxed{1}` or `x = \boxed{2}` is two answers, and
        # `(1, 2), (1, 2)` two points)
        return all(map(_assignment, p[1])) and not _one_name(p[1]) and len(g[2]) == len(p[1]) and all(map(eq, g[2], p[1]))
    bag = ("list", "set", "union")
    if gk == "list" and pk == "seq" and p[1] == "()" and all(map(_assignment, g[1])) and not _one_name(g[1]):
        return len(g[1]) == len(p[2]) and all(map(eq, g[1], p[2]))  # x = 10, y = 4 is the tuple (10, 4)
    if gk in bag and pk == "seq" and any(x[0] != "seq" for x in p[2]):
        return False  # `[1, 2]`, `(1, 2)`, `(1, 2, 3)`: an interval, a point or a tuple is one answer, not several
    if gk in bag and (pk in bag or pk == "seq" and p[1] in ("()", "[]")):  # `[(1, 2), (3, 4)]`: a list of points
        return _match_unordered(g[1], p[-1], eq, repeats=pk == "list")  # `x < -2 or x > 3`: a union too
    if pk == "list" and gk not in ("list", "set"):  # the same answer twice: `\\boxed{1.5} or \\boxed{3/2}`
        return all(eq(g, x) for x in p[1])
    return False


def _assignment(x):
    """Is structure x an `x = value` item (so that a list of them is ordered like a tuple)?"""
    left = _split_eq(x[1])[0] if x[0] == "expr" else None
    return left is not None and bool(_SIMPLE_LHS.fullmatch(left))


def _one_name(items):
    """Do the items assign one name twice or more (`x = 0, x = 2`: two solutions, no tuple (0, 2))?"""
    names = [_split_eq(x[1])[0] for x in items if x[0] == "expr" and _assignment(x)]
    return len(names) > len(set(names))


def _rounded_equal(g, p):
    """Is g a decimal (2+ significant digits) that p, an exact constant, rounds to? (0.33 and 1/3)"""
    digits = re.fullmatch(r"-?\d*\.(\d+)", g[1]) if g[0] == p[0] == "expr" else None
    if not digits or (_sig_digits(g[1]) or 0) < 2:
        return False
    P = parse(p[1])
    try:
        v = complex(to_backend(evaluate(P[0], {}, FLOAT), FLOAT)) if P and not P[1] and not P[2] else None
    except (Undecided, ArithmeticError, ValueError, TypeError):
        return False
    return v is not None and abs(v - float(g[1])) <= 0.5 * 10 ** -len(digits.group(1)) * (1 + 1e-9)


# ----------------------------------------------------------------------------- scalars
def _split_eq(s):
    """(left, right) of an equation `l = r` (of `a = b = c`, the outer two), else (None, s)."""
    parts = _split_top(s, "=")
    return (parts[0], parts[-1]) if len(parts) > 1 and parts[0] and parts[-1] else (None, s)


def _constant(s):
    """Is s an expression without free symbols (`2 + 3` in `2 + 3 = 5`)?"""
    t = parse(s)
    return t is not None and not t[2]


_NAME = r"(?:\\[a-zA-Z]+\s*\{[A-Za-z]+\}|\\?[a-zA-Z]+'*)(?:_\{[^{}]*\}|_[\w\\]+)?"
# the label of a value: `|z|`, `AB:CD`, `V_1 : V_2`, `\frac{AB}{CD}` (besides _SIMPLE_LHS: x, f(3), a_n)
_LABEL = re.compile(rf"\|{_NAME}\||\|(?:[a-zA-Z\\+\-*/ ^{{}}]|_\{{?\w{{1,3}}\}}?){{1,40}}\|"  # |z|, |a + b|
                    rf"|{_NAME}(?:\s*[:/]\s*{_NAME})*|\\frac\{{{_NAME}\}}\{{{_NAME}\}}"
                    rf"|\\(?:sin|cos|tan|cot|sec|csc)\s*(?:\\angle\s*)?{_NAME}")  # \tan\theta = 2, \sin A = 3/5


def _stated_value(left, right):
    """The value an equation `left = right` states, or None when it is an equation to keep whole:
    `x = 5`, `|z| = 2`, `AB:CD = 2:5` state their right side, `2 + 3 = 5` too, and `5 = x` its left;
    `5 = 2p + q` and `x + y = 5` are equations (their sides are not the answer)."""
    if _SIMPLE_LHS.fullmatch(left) or _LABEL.fullmatch(left):
        return right
    if _constant(left):
        if _SIMPLE_LHS.fullmatch(right) and not _constant(right):
            return left
        return right if _constant(right) else None
    return None


def _scalar_equal(g, p, ctx):
    gk, pk = _key(g), _key(p)
    if gk == pk:
        return True
    m = re.fullmatch(r"(\d+)_\{?(\d+)\}?", gk)
    if m and pk == m.group(1):  # 52_8 vs 52 (the base left out)
        return True
    if re.fullmatch(r"[a-zA-Z][a-zA-Z ]{2,}", g) and re.fullmatch(r"[a-zA-Z][a-zA-Z ]*", p):
        return g.lower().replace(" ", "") == p.lower().replace(" ", "")
    gl, gr = _split_eq(g)
    pl, pr = _split_eq(p)
    gv = _stated_value(gl, gr) if gl is not None else g
    pv = _stated_value(pl, pr) if pl is not None else p
    if gl is not None and pl is not None:
        if gv is not None and pv is not None and _key(gl) == _key(pl) and _scalar_equal(gr, pr, ctx):
            return True
        return _value_equal(f"{gl}-({gr})", f"{pl}-({pr})", ctx, ratio=True)
    if gv is None or pv is None:
        return False
    if gl is not None or pl is not None:
        return _scalar_equal(gv, pv, ctx)
    gs, ps = _split_top(g, ":"), _split_top(p, ":")
    if len(gs) > 1 or len(ps) > 1:  # ratios (and times: 5:00 is not 6:00) part by part; 3:4 is no fraction
        return len(gs) == len(ps) and all(_value_equal(a, b, ctx) for a, b in zip(gs, ps))
    return _value_equal(g, p, ctx)


# ----------------------------------------------------------------------------- comparison
def _point(names, trial):
    """Seeded rational values in (1/3, 10.3) for the free symbols (crc32, so that every process
    agrees); trial 3 is their negatives, used when |x|, floor or ceil make the sign matter.
    Positive points keep sqrt(x^2) = x and ln(xy) = ln x + ln y true, as answers assume."""
    sign = -1 if trial == 3 else 1
    return {x: sign * (Fraction(1 + zlib.crc32(f"{x}|{trial % 3}".encode()) % 10007, 1009) + Fraction(1, 3))
            for x in names}


def _close(a, b, rtol, B):
    """Are a and b equal: exactly for two Fractions under rtol 0, else within rtol (plus float noise)."""
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        return a == b if rtol == 0 else abs(a - b) <= rtol * max(abs(a), abs(b))
    a, b = to_backend(a, B), to_backend(b, B)
    if a == B["inf"] or b == B["inf"] or a == -B["inf"] or b == -B["inf"]:
        return a == b
    noise = 1e-9 if B is FLOAT else 1e-35
    return abs(a - b) <= max(rtol, noise) * max(abs(a), abs(b)) + (0 if rtol else noise * 1e-3)


def _arith(f, a, b, B):
    """f(a, b), exact for two Fractions, else in backend B (mpmath does not take Fractions)."""
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        return f(a, b)
    return f(to_backend(a, B), to_backend(b, B))


def _trees_equal(gt, pt, names, rtol, ratio, B):
    """Evaluate both trees at seeded points; True/False, or Undecided propagates.
    Returns 'exact' when every comparison was between exact rationals."""
    exact, c = True, None
    signed = any(n[0] in ("abs", "floor", "ceil") for t in (gt, pt) for n in nodes(t))
    ratio = ratio and bool(names)  # two constant equations: compare their differences directly
    for trial in (0, 1, 2, 3) if names and signed else (0, 1, 2) if names else (0,):
        env = _point(names, trial)
        a, b = evaluate(gt, env, B), evaluate(pt, env, B)
        if ratio:  # equations: l1 - r1 = c (l2 - r2) for one constant c != 0
            if a == 0 or b == 0:
                if not (a == 0 and b == 0):
                    return False
                continue
            if c is None:
                c = _arith(operator.truediv, a, b, B)
                continue
            b = _arith(operator.mul, b, c, B)
        exact = exact and isinstance(a, Fraction) and isinstance(b, Fraction)
        if not _close(a, b, rtol, B):
            return False
    return "exact" if exact else True


def _sig_digits(s):
    """Number of significant digits of a plain decimal literal (`0.0350` -> 3), else None."""
    m = re.fullmatch(r"[-+]?(\d*)\.(\d+)(?:[eE][-+]?\d+)?", s.strip())
    return len((m.group(1) + m.group(2)).lstrip("0")) if m else None


# two words of prose (not function names), or "not": `0 is not the answer` is no product of symbols (that is 0)
_FN = r"(?!(?:arc\w*|sinh|cosh|tanh|sin|cos|tan|cot|sec|csc|log|exp|sqrt|ln|lg)\b)"
_TWO_WORDS = re.compile(rf"(?<![\\a-zA-Z]){_FN}[a-zA-Z]{{2,}}[ \t]+{_FN}[a-zA-Z]{{2,}}|(?<![\\a-zA-Z])not(?![a-zA-Z])")


def _value_equal(g, p, ctx, ratio=False):
    """Two scalar expressions: parsed, evaluated, compared; percent and degree readings tried."""
    rtol, g_pct, p_pct, g_deg, p_deg = ctx
    G, P = parse(g), parse(p)
    if G is None or P is None:
        return False
    (gt, g_dec, g_syms), (pt, p_dec, p_syms) = G, P
    if (g_syms or p_syms) and any((" " in x or "\t" in x or "not" in x) and _TWO_WORDS.search(x) for x in (g, p)):
        return False
    names = sorted(g_syms | p_syms)
    tol = rtol if g_dec or p_dec else 0
    if _sig_digits(g) is not None and _sig_digits(g) == _sig_digits(p):
        tol = 0  # two decimals written to the same precision: 4813.24 is not 4813.25
    hundredth = ("/", ("n", Fraction(1)), ("n", Fraction(100)))
    deg = ("/", ("sym", "pi"), ("n", Fraction(180)))
    has_pi = lambda t: ("sym", "pi") in nodes(t)
    readings = [(gt, pt)]
    if g_pct != p_pct:  # 50% vs 0.5
        readings.append((("*", gt, hundredth), pt) if g_pct else (gt, ("*", pt, hundredth)))
    if g_deg and not p_deg and has_pi(pt):  # 30^\circ vs \pi/6
        readings.append((("*", gt, deg), pt))
    if p_deg and not g_deg and has_pi(gt):
        readings.append((gt, ("*", pt, deg)))
    for a, b in readings:
        try:
            verdict = _trees_equal(a, b, names, tol, ratio, FLOAT)
        except (Undecided, ArithmeticError, ValueError, TypeError):
            verdict = None  # overflow or a singular point: let the 50-digit pass decide
        if verdict == "exact" or verdict is True and tol:
            return True
        if verdict is False:
            continue
        try:  # equal in floats, or undecided: confirm at 50 digits
            if _trees_equal(a, b, names, tol, ratio, mp_backend()):
                return True
        except (Undecided, ArithmeticError, ValueError, TypeError):
            pass
    return False


class RewardTimeout(BaseException):
    """Raised by SIGALRM in a grading call over guarded()'s timeout (a BaseException, so that the
    grader's own `except Exception` cannot swallow it)."""


def _reward_alarm(signum, frame):
    raise RewardTimeout


def guarded(timeout, call, text, failed):
    """call(), or None when it raises or runs over `timeout` seconds, counted in failed["errors"] /
    failed["timeouts"] (the first one described in failed["first"], with the response `text`). What
    train.py's rewards and held-out evaluation and eval.py put around every grading call: a grader
    bug or a pathological response costs one wrong answer, not the run.
    The timeout is a SIGALRM timer (two setitimer calls per response; main thread only), which
    also interrupts a grader stuck in a sleep or a pure-Python loop. A second opinion that timed
    out or failed inside the call (math-verify's: see _second_opinion) fails the call the same way,
    though verify itself returned the rules' "no"."""
    timer = threading.current_thread() is threading.main_thread()
    _SECOND.failure = None
    try:
        try:
            if timer:
                if signal.getsignal(signal.SIGALRM) is not _reward_alarm:
                    signal.signal(signal.SIGALRM, _reward_alarm)
                signal.setitimer(signal.ITIMER_REAL, timeout)
            out = call()
        finally:
            if timer:
                signal.setitimer(signal.ITIMER_REAL, 0)
        if _SECOND.failure is None:
            return out
        kind, what = _SECOND.failure
    except RewardTimeout:
        kind, what = "timeouts", f"took over reward_timeout={timeout}s"
    except Exception as e:
        kind, what = "errors", f"{type(e).__name__}: {e}"
    failed[kind] += 1
    failed.setdefault("first", f"{what} (rank {os.environ.get('RANK', '0')}, response {text[:60]!r})")
    return None


class _Timeout(BaseException):
    """Raised inside the guarded code when its time budget is spent (BaseException, so that
    `except Exception` blocks inside sympy/mpmath cannot swallow it)."""


def _with_deadline(seconds, fn, *args):
    """fn(*args), interrupted with _Timeout after `seconds`. sys.setprofile calls the hook on
    every Python and C function call of this thread only, so it works off the main thread, where
    signal.alarm cannot be used. The budget is this thread's CPU time (time.thread_time), so that
    graders in a thread pool, waiting for the GIL, or on a loaded machine are not cut short: what is
    bounded is the work. If a profiler already holds the hook (cProfile, a tracing profiler), it is
    left alone and fn runs with only the static size guards."""
    if sys.getprofile() is not None:
        return fn(*args)
    deadline, calls = time.thread_time() + seconds, [0]

    def hook(frame, event, arg):
        calls[0] += 1
        if calls[0] & 255 == 0 and time.thread_time() > deadline:
            raise _Timeout

    sys.setprofile(hook)
    try:
        return fn(*args)
    finally:
        sys.setprofile(None)


_CHOICE = re.compile(r"\(?([A-J])\)?")
_CHOICE_PRED = re.compile(r"(?:\(([A-J])\)|([A-J])(?:[):.]|\s|$))")


_GROUP_SEP = re.compile(r"\s*(?:;|\\text\{\s*or\s*\}|\bor\b|\\q?quad\b)\s*")
_ASSIGN = re.compile(r"\s*([a-zA-Z](?:_\{?\w{1,3}\}?)?)\s*=\s*(\S.*)")


def _solution_groups(s):
    """`a = 2, b = 3; a = 3, b = 2` (solutions apart by `;` or 'or', each a list of values of the same
    two or more names) as the list of tuples `(2, 3), (3, 2)`, in the first solution's order of the
    names; else s. (_clean would read the `;` as a comma, giving one list of four values.)"""
    if s.count("=") < 4 or not (";" in s or "or" in s) or len(s) > 500:
        return s  # two solutions of two names have four '='
    groups = []
    for part in _GROUP_SEP.split(s):
        items = [_ASSIGN.fullmatch(x) for x in _split_top(part)] if part.strip() else []
        if not items or None in items:
            return s
        groups.append({m.group(1): m.group(2).strip() for m in items})
    names = list(groups[0]) if groups else []
    if len(groups) < 2 or len(names) < 2 or any(len(g) != len(names) or set(g) != set(names) for g in groups):
        return s
    return ", ".join("(" + ", ".join(g[x] for x in names) + ")" for g in groups)


_NUMBER_ONLY = re.compile(r"-?[\d.,]+")
_SQUARE_METRES = re.compile(r"^(-?[\d.,]+)\s*m\s*(?:\^\s*\{?[23]\}?|[²³])$")


def _equal(gold, pred, rtol):
    """Compare two final answers (not whole solutions)."""
    if len(gold) > MAX_ANSWER or len(pred) > MAX_ANSWER:
        return gold.strip() == pred.strip()
    (g, g_pct, g_deg), (p, p_pct, p_deg) = _clean(gold), _clean(pred)
    if not g or not p:
        return False
    if _key(g) == _key(p):
        return True
    if "," in g and "," not in p and _THOUSANDS.fullmatch(pred.strip("$ ")) and not re.search(r",0|\.", pred) \
            and _structure(g)[0] in ("list", "set"):
        p = _clean(pred.strip("$ ").replace(",", ", "))[0]  # the gold decides: against a list or set
        # (`10, 455`), `10,455` is that list; against a number, a tuple `(1, 500)` or an interval, a number.
        # Not `3,007`, `2,000` or `1,234.0`: a list item is never written `007`, and a decimal part makes a number
    grouped = (_solution_groups(gold), _solution_groups(pred)) if "=" in gold or "=" in pred else (gold, pred)
    if grouped != (gold, pred):  # `a = 2, b = 3; a = 3, b = 2`: solutions as tuples
        (g, g_pct, g_deg), (p, p_pct, p_deg) = _clean(grouped[0]), _clean(grouped[1])
    m = _CHOICE.fullmatch(g)
    if m:  # prose is read as written: cleaning makes `(B); (A) and (C)` one list
        return _choice(m.group(1), (pred if _PROSE.search(pred) else p).strip("* "))
    m = re.fullmatch(r"\(([A-J])\)\s*(?!.*\([A-J]\))([^\s,;].*)", g) or \
        re.fullmatch(r"([A-J])[.:)]?\s+(?!(?:and|or)\b)([A-Za-z][a-z]+(?:\s+[A-Za-z][a-z]*)*)", g)
    # a gold `(C) 12` or `B Maria` (the option's text after its letter): the letter, or that text
    if m and _CHOICE.fullmatch(p.strip("* ")):
        return _choice(m.group(1), p.strip("* "))
    g = m.group(2) if m else g
    if "m" in p and _NUMBER_ONLY.fullmatch(g):  # against a number, `12 m^2` is 12 square metres (else a monomial in m)
        p = _SQUARE_METRES.sub(r"\1", p)
    for a, b in ((p, g), (g, p)):  # a decimal comma (`3,5`) against a number written with a point
        if _DECIMAL_COMMA.fullmatch(a) and "," not in b and (a is p or "." in b):
            g, p = (g, a.replace(",", ".")) if a is p else (a.replace(",", "."), p)
    g, p = _abs_interval(g), _abs_interval(p)
    ctx = (rtol, g_pct, p_pct, g_deg, p_deg)
    mp_backend()  # built once per process, outside the deadline: importing mpmath takes ~0.1 s
    return _with_deadline(TIME_BUDGET, lambda: _struct_equal(_structure(g), _structure(p), ctx))


_REL = r"(<=|>=|<|>|\\leq?(?:slant)?|\\geq?(?:slant)?|≤|≥)"
_ABS_INEQUALITY = re.compile(rf"(?:(\d+(?:\.\d+)?)\s*{_REL}\s*)?\|\s*[a-z]\s*(?:([+-])\s*(\d+(?:\.\d+)?))?\s*\|"
                             rf"\s*{_REL}\s*(\d+(?:\.\d+)?)")


def _abs_interval(s):
    """`|x - c| < r` (also <=, >, >=, \\le, \\ge) as the set it describes over the reals, in interval
    notation: (c - r, c + r), or the union of two rays for > and >=; `a < |x - c| < b` as the two
    intervals (c - b, c - a) and (c + a, c + b). A human grader reads `\\boxed{|x| \\le 3}` as [-3, 3];
    s itself when it is not such an inequality."""
    m = _ABS_INEQUALITY.fullmatch(s.strip()) if "|" in s else None
    if not m:
        return s
    a, op1, sign, c, op, r = m.groups()
    closed = lambda o: "=" in o or "q" in o or o in ("\\le", "\\ge", "≤", "≥")  # noqa: E731
    less = lambda o: o.startswith(("<", "\\le", "≤"))  # noqa: E731
    c = (-1 if sign == "+" else 1) * Fraction(c or 0)
    num = lambda x: str(x) if x.denominator == 1 else f"{float(x)}"  # noqa: E731
    lo, hi = num(c - Fraction(r)), num(c + Fraction(r))
    if a is not None:  # a < |x - c| < b: both bounds must point the same way, lower then upper
        if not (less(op1) and less(op)):
            return s
        a_lo, a_hi = num(c - Fraction(a)), num(c + Fraction(a))
        out, inner = ("[", "]") if closed(op) else ("(", ")"), ("]", "[") if closed(op1) else (")", "(")
        return f"{out[0]}{lo}, {a_lo}{inner[0]}\\cup{inner[1]}{a_hi}, {hi}{out[1]}"
    if less(op):
        return f"[{lo}, {hi}]" if closed(op) else f"({lo}, {hi})"
    return f"(-\\infty, {lo}]\\cup[{hi}, \\infty)" if closed(op) else f"(-\\infty, {lo})\\cup({hi}, \\infty)"


_DECIMAL_COMMA = re.compile(r"-?\d+,(?:\d{1,2}|\d{4,})|-?0,\d+")  # not `10,455`: that is ten thousand


# options ruled out in the same sentence: "not A or C", "no A", "不是A", "(A) and (C) are ruled out"
_OPTIONS = r"\(?[A-J]\)?(?:\s*(?:,|or|and|nor|ni|o|y|ou|et|或|和|、)\s*\(?[A-J]\)?)*"
_RULED_OUT = re.compile(rf"(?:\b(?:not|no|nor|ni|pas|nicht|non)\s+|不是|并非|而非){_OPTIONS}(?![A-Za-z])"
                        rf"|{_OPTIONS}\s+(?:is|are)\s+(?:ruled out|eliminated|excluded|incorrect|wrong)\b")


def _choice(letter, p):
    """Multiple choice (the gold is a letter): the prediction leads with that letter and names no
    other; or, in prose ("ruling out A and D, we are left with (C)"), its last `(X)` or letter is it.
    Options ruled out in so many words ("B, not A or C", "(A) and (C) are ruled out", "B，不是A") are
    not named: when that leaves one letter, it is the answer."""
    kept = _RULED_OUT.sub(" ", p) if re.search(r"not|no|ni|pas|nicht|不是|并非|而非|ruled|elimin|exclu|incorrect|wrong", p) else p
    if kept != p:
        left = set(re.findall(r"(?<![A-Za-z\\])[A-J](?![A-Za-z])", kept))
        if len(left) == 1:
            return left.pop() == letter
    mp = _CHOICE_PRED.match(p)
    letters = set(re.findall(r"(?<![A-Za-z\\])[A-J](?![A-Za-z])", p))
    if mp and len(letters) == 1:
        return (mp.group(1) or mp.group(2)) == letter
    if not re.search(r"[a-z]{3,}", p) or re.search(r"[A-J]\)?\s*(?:,|/|&|and|or)\s*\(?[A-J]\)?[\s.*]*$", p):
        return False  # not prose, or it ends hedging: "(A) and (B)", "C or D"
    last = re.findall(r"\(([A-J])\)", p) or re.findall(r"(?<![A-Za-z\\])([A-J])(?![A-Za-z]|\s+[a-z])", p)
    return bool(last) and last[-1] == letter


# ----------------------------------------------------------------------------- public API
def _squeeze(s, digits=True):
    """s without `$` and spaces, except one space between two digits: `1 2 3` is not `123` (the
    cheap form without that exception first: only texts equal under it are looked at again).
    str.split() drops exactly what the regex class \\s matches (str.isspace), at a fraction of
    the cost on a long response."""
    return "".join((re.sub(r"(?<=\d)[\s$]+(?=\d)", "~", s) if digits else s).split()).replace("$", "")


def rule_verify(gold, pred, *, rel_tol=1e-4):
    """The rules alone (this module's grader without the second opinion): `verify` as it was before
    math-verify was asked, kept for reproducing numbers made with it (`reward: rule`)."""
    return _judge(gold, pred, rel_tol, second_opinion=False)


def verify(gold, pred, *, rel_tol=1e-4):
    """True when `pred` (the model's) denotes the same mathematical answer as `gold` (reference).

    Either may be a bare answer (`\\frac{1}{2}`, `0.5`, `x = 3`) or a whole solution text, whose
    final answer is extracted first (see extract_answer) from what follows its thinking
    (after_thinking). `rel_tol` is the relative tolerance used when either side is written as a
    decimal (`0.3333` vs `\\frac{1}{3}`); exact forms must agree exactly. The rules decide first;
    where they find the answers different, math-verify gives a second opinion on the two final
    answers the rules extracted (see _second_opinion). Never raises on str input and returns within
    about TIME_BUDGET + SECOND_OPINION_TIMEOUT seconds (plus up to SECOND_OPINION_START for the
    import of a thread's first worker).
    """
    return _judge(gold, pred, rel_tol, second_opinion=True)


def _judge(gold, pred, rel_tol, second_opinion):
    for name, x in (("gold", gold), ("pred", pred)):
        if not isinstance(x, (str, int, float)) or isinstance(x, bool):
            raise TypeError(f"verify: {name} must be a str, got {type(x).__name__}")
    try:
        gold, pred = _prepare(str(gold)[-MAX_TEXT:]), _prepare(after_thinking(str(pred))[-MAX_TEXT:])
        short = max(len(gold), len(pred)) < MAX_ANSWER
        if short and _squeeze(gold, False) == _squeeze(pred, False) and _squeeze(gold) == _squeeze(pred):
            return True  # the same text, maybe one in $...$ (a prose answer with math in it)
        g = _final_answer(gold)
        p = _final_answer(pred, several=_several(g))
        # a hedge between answers (`\boxed{1, -2}` or `\boxed{1}`: mathexpr.HEDGE) is right only if each is
        alternatives = _alternatives(p)
        if alternatives is None:
            return False
        verdicts = [_equal(g, a, rel_tol) for a in alternatives]
    except (Exception, _Timeout):
        return False
    return all(v or second_opinion and _second_opinion(g, a, rel_tol) for v, a in zip(verdicts, alternatives))


def _alternatives(p):
    """The answers a final answer p offers as alternatives, or None for more than MAX_ALTERNATIVES of
    them (no answer): the parts apart by mathexpr.HEDGE (boxes apart by "or" where one holds several
    items), or by "or" inside one (`1, -2 \\text{ or } 1`, `\\;\\mathrm{or}\\;`) where a part holds
    several items; an enumeration `1, 2, or 3` is one answer unless it names an item twice (`1, -2, or 1`),
    and so are solutions `a = 2, b = 3 or a = 3, b = 2`; else [p]. A hedge is right only where each
    alternative is. An answer over MAX_ANSWER characters is one (compared as a string: _equal)."""
    if len(p) > MAX_ANSWER:
        return [p]
    out = []
    for part in _split_top(p, HEDGE.strip()) if HEDGE.strip() in p else [p]:
        plain = _OR_TEXT.sub(r"\1 or ", part) if "or" in part else part
        split = _split_top(plain, " or ") if " or " in plain else [part]
        if len(split) > 1 and _solution_groups(part) == part:
            listed = any(x.endswith(",") for x in split[:-1])  # `1, 2, or 3`: a list's last joint
            if listed and _names_twice(plain) or not listed and any(map(_several_items, split)):
                out += split
                continue
        out.append(part)
    return out if len(out) <= MAX_ALTERNATIVES else None


MAX_ALTERNATIVES = 8  # a hedge between more answers than this is no answer
_OR_TEXT = re.compile(r"\\(?:text\w*|math\w*|mbox|hbox)\s*\{\s*(,?)\s*or\s*\}")


def _names_twice(s):
    """Does the list s name one item twice, by the rules (`1, -2, or 1.0`)? (At most 12 items looked at.)"""
    x = _structure(_clean(s)[0])
    items = [i[1] for i in x[1] if i[0] == "expr"] if x[0] == "list" else []
    return len(items) <= 12 and any(_rules_equal(a, b, 1e-4) for k, a in enumerate(items) for b in items[k + 1:])


def grade(response, gold, *, rel_tol=1e-4, second_opinion=True):
    """(the final answer extracted from `response`, or None; whether it verifies against `gold`).

    The one grading of the project: train.py's reward (math_reward), eval.py's accuracy and
    demo.py's calibration all read it. A response with no boxed / "answer is" / `####` / `$...$`
    answer is wrong even if it is a bare number: RL teaches the format. `second_opinion=False`
    judges by the rules alone (rule_verify).
    """
    if not isinstance(response, str):
        raise TypeError(f"reward: response must be a str, got {type(response).__name__}")
    try:  # boxes per part or per indexed name are one answer only against a gold of several
        ans = extract_answer(after_thinking(response), several=isinstance(gold, str) and _gold_several(gold))
    except Exception:
        ans = None
    return ans, ans is not None and _judge(gold, ans, rel_tol, second_opinion)


def after_thinking(text):
    """What a grader reads of a response: the text after its thinking. A thinking model (Qwen3
    under its chat template, DeepSeek-R1's distills) writes <think> ... </think> before its answer:
    the answer is what follows the last </think>, and a <think> left open (the response cut off
    while thinking) leaves no answer, whatever \\boxed{} the thinking holds. A response without the
    tags is read whole."""
    end = text.rfind("</think>")
    tail = text[end + len("</think>"):] if end >= 0 else text
    return "" if "<think>" in tail else tail


def thinking_opened(prompt):
    """Whether a prompt ends inside a think block that its chat template opened (DeepSeek-R1's
    distills: the response then thinks without writing <think>). train.py and eval.py grade such a
    response as "<think>" + response, so that unfinished thinking is no answer there too."""
    return prompt.rfind("<think>") > prompt.rfind("</think>")


def math_reward(response, gold, *, format_reward=0.0, no_answer_penalty=0.0, rel_tol=1e-4):
    """The RL reward of one response: 1.0 if `grade` finds it correct; else `format_reward`
    (default 0.0) if it has a final answer; else -`no_answer_penalty` (default 0.0)."""
    return _shaped(grade(response, gold, rel_tol=rel_tol), format_reward, no_answer_penalty)


def _shaped(graded, format_reward, no_answer_penalty):
    ans, correct = graded
    if ans is None:
        return -float(no_answer_penalty)
    return 1.0 if correct else float(format_reward)


# ----------------------------------------------------------------------------- the second opinion
# math-verify (sympy behind a LaTeX parser) and these rules make different mistakes: where the rules
# find two final answers different, math-verify is asked too, and its "yes" counts. It runs in a
# worker process of the calling thread (second_opinion.py), bounded in time.
# math-verify's time grows with nesting and length, to seconds well inside its bounds (a \frac nested 60
# deep: ~2.5 s of its CPU a call; 25 terms of \gcd: ~1 s), while every gold of the benchmark files nests
# at most 4 deep: an answer beyond these is judged by the rules alone (bench/wrong_answers.py measures it)
SECOND_OPINION_MAX = 300      # characters of a final answer shown to math-verify (longer: not asked)
SECOND_OPINION_DEPTH = 4      # brackets and braces nested in it (deeper: not asked)
_SECOND = threading.local()   # per thread: the failure of its last verdict (guarded reads it)


def _second_opinion(g, p, rtol=1e-4):
    """math-verify's verdict on the final answers g and p (the rules said no), where it can change
    the verdict (_worth_asking); two lists or sets of scalars item by item (_item_by_item); a timeout
    or error is "no", noted for guarded() to count."""
    if not _worth_asking(g, p):
        return False
    try:
        gs, ps = _scalars(g), _scalars(p)
        if gs and ps and len(set(gs)) == len(gs) and len(gs) * len(ps) <= 64:
            return _item_by_item(gs, ps, rtol)
        return second_opinion.ask(_delimited(g), _delimited(p), second_opinion.SECOND_OPINION_TIMEOUT)
    except second_opinion.Failed as e:
        _SECOND.failure = (e.kind, f"math-verify: {e}")
        return False


def _scalars(s):
    """The items of answer s when it is a list or set of two or more scalars, else None: as written
    where a split at its commas finds them all (math-verify reads `\\operatorname{lcm}(1, 5)`, not the
    cleaned `lcm (1,5)`), else cleaned."""
    x = _structure(_clean(s)[0])
    if not (x[0] in ("list", "set") and len(x[1]) > 1 and all(i[0] == "expr" for i in x[1])):
        return None
    raw = [r.strip(" $") for r in _split_top(s.strip(" $"))]
    return raw if len(raw) == len(x[1]) and all(raw) else [i[1] for i in x[1]]


def _item_by_item(gs, ps, rtol):
    """Two collections of scalars as sets, each item by the rules or else by math-verify (where it may
    be asked: _worth_asking), as a single answer is: math-verify reads `\\max(2, 5), \\gcd(4, 6)` as
    no set of numbers. All its verdicts share one SECOND_OPINION_TIMEOUT; past it, "no", counted
    as a timeout (_in_time)."""
    deadline = time.monotonic() + second_opinion.SECOND_OPINION_TIMEOUT
    met = set()
    for p in dict.fromkeys(ps):
        i = next((i for i, g in enumerate(gs) if _in_time(deadline) and _rules_equal(g, p, rtol)), None)
        if i is None:  # math-verify, on the gold's items not met yet first
            i = next((j for j in sorted(range(len(gs)), key=met.__contains__) if _asked(gs[j], p, deadline)), None)
        if i is None:
            return False
        met.add(i)
    return len(met) == len(gs)


def _in_time(deadline, margin=0.0):
    """True before deadline; past it, second_opinion.Failed("timeouts"), which _second_opinion notes
    for guarded() to count in reward/timeouts, as a single answer's verdict that does not come."""
    if time.monotonic() < deadline - margin:
        return True
    raise second_opinion.Failed("timeouts", f"no verdict item by item within {second_opinion.SECOND_OPINION_TIMEOUT}s")


def _rules_equal(g, p, rtol):
    """_equal, with its deadline or an error as "no"."""
    try:
        return _equal(g, p, rtol)
    except (Exception, _Timeout):
        return False


def _asked(g, p, deadline):
    """math-verify's "yes" on the items g and p, where it may be asked, in the time left to deadline."""
    return _worth_asking(g, p) and _in_time(deadline, 0.05) and \
        second_opinion.ask(_delimited(g), _delimited(p), deadline - time.monotonic())


def _worth_asking(g, p):
    """Can math-verify's "yes" be right where the rules said no? Only where the rules could not read
    one of the two answers (_readable): where they read both as values (numbers, expressions,
    ratios, and tuples, lists, sets, intervals and matrices of them) and found them apart,
    math-verify would only read the same values, or read them by other conventions (a tuple for a
    set, `1 2 3` for 6, `3:4` for 3/4, `b` for `B`). Nor, the rules' veto, where either answer is
    an equation or prose (the rules found no value in it): math-verify reads an equation by its
    right side whatever its left (`5 = 2p + q` against 2p + q, `34 + 5 = 39` against 34 when the
    rules cannot read the units), and picks a number out of prose ("答案不是 96，而是100。"
    against 96). The cases asked and skipped are measured by bench/bench_reward.py, the veto by
    bench/prose_pairs.py."""
    if not g or not p or len(g) > SECOND_OPINION_MAX or len(p) > SECOND_OPINION_MAX:
        return False
    if _split_eq(g)[0] is not None or _split_eq(p)[0] is not None or _WORDS.search(g) or _WORDS.search(p):
        return False  # the rules' veto: an equation or prose (see above)
    if _nesting(g) > SECOND_OPINION_DEPTH or _nesting(p) > SECOND_OPINION_DEPTH:
        return False
    if _HUGE.search(g) or _HUGE.search(p):
        return False  # sympy would compute the huge number (in one C call: only a kill stops it)
    try:
        return not (_readable(_structure(_clean(g)[0])) and _readable(_structure(_clean(p)[0])))
    except (Exception, _Timeout):
        return True


# prose: two words of Latin letters, or a word of another script (a lone π is no prose)
_WORDS = re.compile(_PROSE_ASCII.pattern + r"|[^\W\d_a-zA-Z]{2,}")
# a number sympy would compute to no end: a power in an exponent (9^{9^{9}}, x^x^x), a factorial of 3+
# digits, an exponent of 5+ digits; and a symbol or a group to a power of 2+ digits ((x+1)^{99}: sympy
# expands it, past the second opinion's bound)
_HUGE = re.compile(r"\^\s*\{[^{}]*\^|\^\s*\w\s*\^|\d{3,}\s*!|\^\s*\{?\s*\d{5,}|[)}a-zA-Z]\s*\^\s*\{?\s*\d{2,}")


def _nesting(s):
    """How deep brackets and braces nest in s (`\\frac{1}{\\sqrt{2}}`: 2)."""
    depth = deepest = 0
    for c in s:
        if c in "{([":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "})]":
            depth -= 1
    return deepest


def _readable(x):
    """Did the rules read structure x whole: is every scalar in it (each part of a ratio) an
    expression that mathexpr parses, or digits apart (`1 2 3`: no number, by a convention of the
    rules)?"""
    if x[0] == "expr":
        return all(_parses(q) or re.fullmatch(r"[\d\s.,]*\d\s+\d[\d\s.,]*", q) for q in _split_top(x[1], ":"))
    if x[0] == "mat":
        return all(_readable(item) for row in x[1] for item in row)
    items = x[2] if x[0] == "seq" else x[1] if x[0] in ("list", "set", "union") else None
    return items is not None and all(_readable(item) for item in items)


def _parses(s):
    """Does mathexpr parse s? (Its value may be beyond computing, 9^{9^{9}}: beyond sympy's too.)"""
    return bool(s.strip()) and parse(s) is not None


def _delimited(s):
    """A bare answer in $...$, as math-verify reads LaTeX only between delimiters."""
    s = str(s)
    bare = not any(m in s for m in ("$", "\\boxed", "\\(", "\\[")) and not _PROSE.search(s)
    return f"${s}$" if bare else s


# ----------------------------------------------------------------------------- optional graders
def _math_verify_grader():
    """math-verify (the grader behind TRL's and open-r1's math rewards), for reproducing numbers of
    papers that used it. Imported only when chosen (it pulls in antlr4 and latex2sympy2: a second
    of start-up). Its extraction is TRL's accuracy_reward's (boxed first, no match without an
    anchor); its parse and verify timeouts use signal.alarm, which works only in the main thread,
    so they are turned off elsewhere (then nothing bounds its time: sympy.simplify), and under
    guarded()'s timer, which bounds the call instead."""
    try:
        from math_verify import LatexExtractionConfig, parse as mv_parse, verify as mv_verify
        from latex2sympy2_extended import NormalizationConfig
    except ImportError as e:
        raise ImportError("reward: the math_verify grader needs math-verify: "
                          "`pip install -r requirements.txt`") from e
    answer_config = [LatexExtractionConfig(
        normalization_config=NormalizationConfig(nits=False, malformed_operators=False, basic_latex=True,
                                                 boxed="all", units=True),
        boxed_match_priority=0, try_extract_without_anchor=False)]

    def timeout():
        # math-verify's timeout is signal.alarm, the timer guarded() runs on: its alarm(0) at the end
        # would cancel guarded's deadline (a call then ran unbounded and was never counted). Under
        # guarded's timer, that timer bounds the call; off the main thread nothing can.
        main = threading.current_thread() is threading.main_thread()
        return 5 if main and signal.getitimer(signal.ITIMER_REAL)[0] == 0 else None

    def parse_gold(gold):
        return mv_parse(_delimited(gold), parsing_timeout=timeout())

    def verify_pair(gold, pred):
        try:
            g, p = parse_gold(gold), mv_parse(_delimited(pred), parsing_timeout=timeout())
            return bool(g) and bool(p) and bool(mv_verify(g, p, timeout_seconds=timeout()))
        except Exception:
            return False

    def grade(response, gold, *, format_reward=0.0, no_answer_penalty=0.0, rel_tol=None):
        """math_reward's contract with math-verify's judgement (rel_tol is not used: math-verify
        rounds floats to 6 digits)."""
        if not isinstance(response, str):
            raise TypeError(f"math_reward: response must be a str, got {type(response).__name__}")
        try:
            g = parse_gold(gold)
            p = mv_parse(after_thinking(response), extraction_config=answer_config, extraction_mode="first_match",
                         parsing_timeout=timeout())
            if not p:
                return -float(no_answer_penalty)
            return 1.0 if g and mv_verify(g, p, timeout_seconds=timeout()) else float(format_reward)
        except Exception:
            return float(format_reward)

    grade.verify = verify_pair
    return grade


def _combined_grader():
    """The default: the rules, then math-verify's second opinion where they said no (verify)."""
    second_opinion.start()
    grade = functools.partial(math_reward)
    grade.verify = verify
    return grade


def _rule_grader():
    """The rules alone (rule_verify): the default before math-verify's second opinion."""
    def rule_reward(response, gold, *, format_reward=0.0, no_answer_penalty=0.0, rel_tol=1e-4):
        return _shaped(grade(response, gold, rel_tol=rel_tol, second_opinion=False), format_reward,
                       no_answer_penalty)
    rule_reward.verify = rule_verify
    return rule_reward


GRADERS = {"rule+math_verify": _combined_grader, "rule": _rule_grader, "math_verify": _math_verify_grader}
DEFAULT_GRADER = "rule+math_verify"


def make_grader(name=DEFAULT_GRADER):
    """The reward function named `name`, with math_reward's signature `(response, gold, *,
    format_reward=0.0, no_answer_penalty=0.0, rel_tol=...) -> float`, and its `(gold, pred) -> bool`
    judgement as the attribute `.verify` (for eval.py and the benchmarks; a function of one's own
    has none). `name` is a key of GRADERS: "rule+math_verify" (the default: verify), "rule" (the
    rules alone: rule_verify), "math_verify" (math-verify alone, for comparison with papers that
    used it); or `package.module:function`, any function with math_reward's signature, imported
    here. ValueError, naming the problem, when it cannot be had."""
    if name in GRADERS:
        return GRADERS[name]()
    if ":" not in name:
        raise ValueError(f"reward: unknown grader {name!r}; choose one of {sorted(GRADERS)}, or name a "
                         f"function of your own as package.module:function")
    return custom_reward(name)


def custom_reward(spec):
    """The function `package.module:function` names, checked to take math_reward's arguments as the
    trainer passes them: (response, gold, format_reward=..., no_answer_penalty=...)."""
    import importlib
    import inspect
    module, _, attr = spec.partition(":")
    try:
        found = importlib.import_module(module)
    except Exception as e:  # not found, or it fails on import (a SyntaxError, its own imports)
        raise ValueError(f"reward: cannot import {module!r} for the reward {spec!r}: "
                         f"{type(e).__name__}: {e}") from None
    try:
        fn = functools.reduce(getattr, attr.split("."), found)
    except AttributeError:
        raise ValueError(f"reward: module {module!r} has no {attr!r} (the reward {spec!r})") from None
    if not callable(fn):
        raise ValueError(f"reward: {spec!r} is a {type(fn).__name__}, not a function")
    try:
        inspect.signature(fn).bind("response", "gold", format_reward=0.0, no_answer_penalty=0.0)
    except (TypeError, ValueError) as e:
        raise ValueError(f"reward: {spec!r} must take math_reward's arguments (response, gold, *, "
                         f"format_reward=0.0, no_answer_penalty=0.0): {e}") from None
    return fn
