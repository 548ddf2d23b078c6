"""Tests of reward.py on several answers (issue 56): golds and responses that give more than one answer
are compared as collections (unordered, a repeated item counting once, unless the gold is a tuple, an
interval or repeats an item), each item by the rules of one answer; boxes per part or per indexed name
are one list; "The final answer is $...$" after a box is the final answer. The rows are
tests/grader_cases.py's COLLECTIONS, written while fixing the issue (no held-out figure).
"""
import time

import pytest

import mathexpr
import reward
import second_opinion
from grader_cases import COLLECTIONS
from reward import extract_answer, math_reward, verify

ROWS = [(name, g, p, s) for name, rows in COLLECTIONS.items() for g, p, s in rows]


@pytest.mark.parametrize("cls,gold,response,same", ROWS, ids=[f"{r[0]}-{i}" for i, r in enumerate(ROWS)])
def test_collections(cls, gold, response, same):
    """verify and the RL reward agree with the hand-written label, right ones and wrong ones."""
    assert verify(gold, response) is same, (cls, gold, response)
    assert math_reward(response, gold) == (1.0 if same else 0.0), (cls, gold, response)


def test_every_class_has_right_and_wrong_rows():
    for name, rows in COLLECTIONS.items():
        assert any(s for *_, s in rows) and any(not s for *_, s in rows), name


@pytest.mark.parametrize("text,expected", [
    (r"$\boxed{3}$ for part (a) and $\boxed{7}$ for part (b).", "3, 7"),
    (r"For part (a): $\boxed{3}$. For part (b), similarly, we get $\boxed{7}$.", "3, 7"),
    (r"For part (a): $\boxed{3}$. For part (b), the same steps give $\boxed{7}$.", "7"),  # no joint: apart
    (r"(a) $\boxed{3}$, (b) $\boxed{7}$", "3, 7"),
    (r"$\boxed{y_1 = e^x}$, and the other one is $\boxed{y_2 = e^{-x}}$.", "y_1 = e^x, y_2 = e^{-x}"),
    (r"so $x_1 = \boxed{2}$, and then $x_2 = \boxed{5}$", "2, 5"),
    (r"so $x_1 = \boxed{2}$, and after checking, $x_2 = \boxed{5}$", "5"),  # a check between them: no joint
    (r"First $x = \boxed{3}$, so the area is $\boxed{12}$.", "12"),  # no part, no index: the last box
    (r"$\boxed{x = 3}$, and hence $\boxed{y = 2}$.", "y = 2"),  # two names: not one list
    (r"$\boxed{y_1 = 3}$, hence $\boxed{y_1 = 4}$.", "y_1 = 4"),  # one name, one index: a correction
    (r"First $a_1 = \boxed{3}$ and the difference is 2, so $a_{10} = \boxed{21}$.", "21"),  # a step on the way
    ("We get $\\boxed{455}$.\n\nThe final answer is $10,455$. I hope it is correct.", "10,455"),
    ("\\boxed{12}\n\nSo the final answer is reasonable.", "12"),  # no math after it: the box
    ("The final answer is $\\boxed{12}$.", "12"),
    ("The answer is $2$ and $5$.", "2, 5"),
    ("The answer is $2$, since $x = 5$ fails.", "2"),
    ("The answer is $2$ and $x = 5$ is excluded.", "2"),  # the list must end the sentence
    ("The answer is $2$,\tand $5$.", "2, 5"),
    ("The answer is $2$; or $5$.", "2, 5"),
    ("She pays $\\boxed{\\$12}$.\nFinal Answer: The final answer is $\\$12$.", "\\$12"),  # no plain number: the box
    ("Thus $\\boxed{5}$.\nThe final answer is $x$, where $x = 5$.", "5"),
    (r"Thus $x_1 = \boxed{2}$ is extraneous, leaving $x_2 = \boxed{5}$.", "5"),  # withdrawn: not joined
    (r"$\boxed{4}$ would be option (a), which is wrong; the correct value is $\boxed{6}$.", "6"),
    (r"$\lfloor x \rfloor = \boxed{3}$, the integer part 3 of $x$. Then $x^2 = \boxed{10}$.", "10"),
    (r"So $AB = \boxed{6}$. In part 2 of the solution we double it: $\boxed{18}$", "18"),
    (r"We get $f(a) = \boxed{2}$ and then $f(b) = (b)^2$ so the answer is $\boxed{4}$", "4"),
])
def test_extraction_of_several_answers(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text,one", [
    (r"$\boxed{3}$ for part (a) and $\boxed{7}$ for part (b).", "7"),
    (r"(a) $\boxed{3}$; (b) $\boxed{7}$", "7"),
    (r"so $x_1 = \boxed{2}$, and after checking, $x_2 = \boxed{5}$", "5"),
    (r"$a_1 = \boxed{3}$, and so $a_2 = \boxed{7}$.", "7"),
    (r"$\boxed{2}$, $\boxed{3}$", "2, 3"),  # boxes in a row are one list whatever the gold (older rule)
])
def test_parts_and_indices_join_boxes_only_against_a_gold_of_several(text, one):
    """grade joins boxes per part named in the text or per indexed name only where the gold lists
    several answers (several=True, extract_answer's default); against one answer the last box counts."""
    assert extract_answer(text, several=False) == one
    assert reward.grade(text, "7")[0] == one
    assert reward._gold_several("3, 7") and reward._gold_several("$x = 1$ and $x = 2$")
    assert not reward._gold_several("7") and not reward._gold_several("(3, 7)") and not reward._gold_several("10,455")


@pytest.mark.parametrize("spacing", ["\n", " ", "\t ", ", "])
def test_a_long_run_of_spacing_after_a_math_span_grades_fast(spacing):
    """_SPAN_LIST once backtracked quadratically on the spacing after a math span (8k newlines: 1.3 s;
    200k characters: minutes inside one regex call). A 200k-character response now grades at once."""
    n = (200_000 - 30) // len(spacing)
    for response in ("$1$" + spacing * n + "$2$ hello world done.", "The answer is $1$" + spacing * n + "$2$ x",
                     "$1$" + spacing * n + "x"):
        t0 = time.perf_counter()
        reward.grade(response, "2")
        reward.grade(response, "1, 2")
        verify("1, 2", response)
        mathexpr._span_list(response), mathexpr._SPAN_LIST.match(response)
        assert time.perf_counter() - t0 < 2.0, (spacing, response[:20])


def test_a_collections_second_opinion_past_its_bound_is_counted(monkeypatch):
    """Item by item, the verdicts that the shared bound cuts off are a timeout for guarded() to count
    (reward/timeouts), as a single answer's verdict that does not come."""
    def slow_no(gold, pred, timeout):
        time.sleep(0.05)
        return False
    monkeypatch.setattr(second_opinion, "ask", slow_no)
    monkeypatch.setattr(second_opinion, "SECOND_OPINION_TIMEOUT", 0.2)
    failed = {"errors": 0, "timeouts": 0}
    gold, pred = ", ".join(str(k) for k in range(1, 9)), ", ".join(f"\\max({k}, 20)" for k in range(1, 9))
    assert reward.guarded(10, lambda: verify(gold, pred), pred, failed) is None
    assert failed["timeouts"] == 1 and "item by item" in failed["first"]
    monkeypatch.setattr(second_opinion, "SECOND_OPINION_TIMEOUT", 5.0)
    failed = {"errors": 0, "timeouts": 0}  # a "no" within the bound is no failure
    assert reward.guarded(10, lambda: verify("2, 5", r"\gcd(4, 6), \max(2, 4)"), "", failed) is False
    assert failed == {"errors": 0, "timeouts": 0}


def test_a_gold_of_math_spans_is_a_list():
    assert reward._final_answer("$x = -1$ and $x = 4$") == "x = -1, x = 4"
    assert reward._final_answer("The roots are $1$ and $6$.") == "1, 6"
    assert reward._final_answer("The minimum is $-2$, attained at $x = 1$.") == "-2"


def test_single_answers_never_take_the_collection_path(monkeypatch):
    """The set comparison (_covers) runs only for a bare list with more items than the gold: one
    answer, and lists of the gold's length, cost what they cost before."""
    def covers(*a):
        raise AssertionError(f"_covers called: {a}")
    monkeypatch.setattr(reward, "_covers", covers)
    reward._structure.cache_clear()
    for gold, pred, same in [("12", "\\boxed{12}", True), ("12", "\\boxed{13}", False), ("(1, 2)", "(1, 2)", True),
                             ("1, 2", "2, 1", True), ("\\frac{1}{2}", "0.5", True), ("2, 3", "2", False),
                             ("(1, 2), (3, 4)", "(3, 4), (1, 2)", True), ("x^2 + 1", "1 + x^2", True)]:
        assert verify(gold, pred) is same, (gold, pred)


@pytest.mark.parametrize("gold,response,same", [
    ("2, 5", r"\boxed{\gcd(4, 6), \max(2, 5)}", True),
    ("2, 5", r"\boxed{\max(2, 5), \gcd(4, 6), \max(5, 1)}", True),  # 5 twice: once
    ("2, 5", r"\boxed{\gcd(4, 6), \max(2, 4)}", False),  # one right and one wrong
    ("2, 5", r"\boxed{\gcd(4, 6), \max(2, 5), 7}", False),  # a superset
    ("2, 5", r"\boxed{\gcd(4, 6)}", False),  # a subset
])
def test_the_second_opinion_decides_a_collection_the_rules_cannot_read(gold, response, same):
    """Where an item is beyond the rules (`\\gcd`, `\\max`), math-verify is asked about the two
    collections, as it is about two answers; it compares them as sets too."""
    assert reward.rule_verify(gold, response) is False
    assert verify(gold, response) is same


def test_a_collections_second_opinions_share_one_bound(monkeypatch):
    """Item by item, math-verify may be asked many times; all of one grading's asks share one
    SECOND_OPINION_TIMEOUT, so the verdict ("no" past it) comes as soon as for a single answer."""
    asked = []

    def slow_no(gold, pred, timeout):
        asked.append(timeout)
        time.sleep(0.05)
        return False
    monkeypatch.setattr(second_opinion, "ask", slow_no)
    monkeypatch.setattr(second_opinion, "SECOND_OPINION_TIMEOUT", 0.3)
    gold = ", ".join(str(k) for k in range(1, 9))
    pred = ", ".join(f"\\max({k}, 20)" for k in range(1, 9))  # 8 x 8 pairs the rules cannot read
    t0 = time.monotonic()
    assert verify(gold, pred) is False
    assert time.monotonic() - t0 < 0.6 and 1 < len(asked) < 10 and max(asked) <= 0.3
