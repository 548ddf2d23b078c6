"""Direct tests of mathexpr.py (parse / evaluate / backends); reward.py's grading tests cover it
through verify. Expected values are worked out by hand, never copied from the code's output."""
import cmath
import faulthandler
import math
from fractions import Fraction as Fr

import pytest

import mathexpr
from mathexpr import FLOAT, Undecided, evaluate, mp_backend, nodes, parse, to_backend


def value(s, B=FLOAT, **env):
    tree, _, syms = parse(s)
    assert syms == set(env), (s, syms)
    return evaluate(tree, {k: Fr(v) for k, v in env.items()}, B)


# (expression, symbol values, exact value): these must stay Fractions, not floats
EXACT = [
    ("\\frac{1}{2}+\\frac{1}{3}", {}, Fr(5, 6)), ("2^{10}", {}, Fr(1024)), ("2^-1", {}, Fr(1, 2)),
    ("\\sqrt{16}", {}, Fr(4)), ("8^{2/3}", {}, Fr(4)), ("\\sqrt[3]{-8}", {}, Fr(-2)),
    ("\\sqrt{\\frac{9}{4}}", {}, Fr(3, 2)), ("5!", {}, Fr(120)), ("\\binom{5}{2}", {}, Fr(10)),
    ("\\binom{6}{3}", {}, Fr(20)), ("\\lfloor 7/2 \\rfloor", {}, Fr(3)),
    ("\\lceil 7/2 \\rceil", {}, Fr(4)), ("|3-5|", {}, Fr(2)), ("1\\frac{4}{5}", {}, Fr(9, 5)),
    ("0.125", {}, Fr(1, 8)), ("1.5e3", {}, Fr(1500)), ("\\frac43", {}, Fr(4, 3)),
    ("3 \\cdot 4 / 6", {}, Fr(2)),
    ("2xy", {"x": 3, "y": 5}, Fr(30)), ("x**2 - 1", {"x": Fr(1, 2)}, Fr(-3, 4)),
    ("x_{max} + y'", {"x_max": 1, "y'": 2}, Fr(3)), ("-x^2", {"x": 3}, Fr(-9)),
    ("0^{\\sqrt{2}}", {}, Fr(0)),  # 0 to a positive irrational power
    ("2^{10000}", {}, Fr(2 ** 10000)),  # exactly at the EXACT_BITS bound (10000 * 2 bits)
]


@pytest.mark.parametrize("s,env,want", EXACT)
def test_exact_values(s, env, want):
    v = value(s, **env)
    assert isinstance(v, Fr) and v == want, (s, v)


# (expression, symbol values, value from the math module): irrational, so evaluated in complex floats
FLOATS = [
    ("\\sqrt{8}", {}, math.sqrt(8)), ("\\sqrt53", {}, math.sqrt(5) * 3), ("\\pi r^2", {"r": 2}, 4 * math.pi),
    ("\\sin^2 x + \\cos^2 x", {"x": Fr(7, 5)}, 1.0), ("\\log_2 8", {}, 3.0), ("\\ln e^3", {}, 3.0),
    ("\\log 100", {}, math.log(100)), ("\\sin^{-1}(1/2)", {}, math.pi / 6), ("e^{i\\pi}", {}, -1.0),
    ("\\sqrt{-4}", {}, 2j), ("\\tan\\frac{\\pi}{4}", {}, 1.0), ("\\binom{1/2}{1}", {}, 0.5),
    # odd roots of negative non-cubes: the real root, not the principal complex one (0.63 + 1.09i)
    ("\\sqrt[3]{-2}", {}, -(2 ** (1 / 3))), ("\\sqrt[5]{-7}", {}, -(7 ** (1 / 5))),
]


@pytest.mark.parametrize("s,env,want", FLOATS)
def test_float_values(s, env, want):
    v = value(s, **env)
    assert isinstance(v, complex) and cmath.isclose(v, want, rel_tol=1e-12, abs_tol=1e-12), (s, v)


def test_tree_format_and_flags():
    assert parse("2x") == (("*", ("n", 2), ("sym", "x")), False, frozenset({"x"}))
    assert parse("\\frac{a}{b}")[0] == ("/", ("sym", "a"), ("sym", "b"))
    assert parse("-1+x")[0] == ("+", ("neg", ("n", 1)), ("sym", "x"))
    assert parse("\\log_3 x")[0] == ("log", ("sym", "x"), ("n", 3))
    assert parse("\\sqrt[3]{x}")[0] == ("root", ("sym", "x"), ("n", 3))
    assert parse("\\infty")[0] == ("inf",)
    assert parse("0.5")[1] is True and parse("1/2")[1] is False  # a decimal literal is flagged
    assert parse("2\\pi e i")[2] == frozenset()  # the constants are not free symbols
    assert list(nodes(parse("x+1")[0])) == [("+", ("sym", "x"), ("n", 1)), ("sym", "x"), ("n", 1)]


@pytest.mark.parametrize("s", ["2+", "(1", "1)", "\\frac{1}", "x = 2", "1, 2", "\\le 3", ""])
def test_unreadable_is_none(s):
    assert parse(s) is None


def test_size_bounds_refuse_to_parse():
    assert parse("x" * (mathexpr.MAX_EXPR + 1)) is None
    assert parse("1+" * 250 + "1") is None  # 501 tokens, 501 characters
    assert parse("(" * 90 + "1" + ")" * 90) is None  # nested deeper than MAX_DEPTH
    assert value("(" * 70 + "1" + ")" * 70) == 1
    assert parse("1" * 401) is None and parse("1e401") is None


def test_mp_backend_has_50_digits():
    mp = mp_backend()
    assert abs(value("\\sqrt{2}^2", mp) - 2) < 1e-45  # a float gets only ~1e-16
    v = value("2^{10001}", mp)  # over EXACT_BITS: not exact, but fine at 50 digits
    assert not isinstance(v, Fr) and abs(v / 2 ** 10001 - 1) < 1e-40
    assert abs(to_backend(Fr(1, 3), mp) * 3 - 1) < 1e-45
    assert to_backend(Fr(1, 3), FLOAT) == complex(1 / 3) and to_backend(2j, FLOAT) == 2j
    assert abs(value("\\sqrt[3]{-2}", mp) ** 3 + 2) < 1e-45  # the real cube root at 50 digits too


HUGE = ["9^{9^{9}}", "10^{10^{10}}!", "2^{2^{2^{2^{2^{2}}}}}", "(10^{400})!",
        "\\binom{10^{9}}{5 \\cdot 10^8}", "0^{-1}", "\\lfloor i \\rfloor"]
REFUSED = {"float": ["(1+i)!"],  # cmath has no complex gamma
           "mp": ["\\sin(10^{100})", "e^{10^{7}}"]}  # mpmath would reduce the argument at huge precision


@pytest.mark.parametrize("B", ["float", "mp"])
def test_huge_values_are_refused_not_computed(B):
    """Each of these would take minutes or gigabytes if computed exactly; the size bounds refuse
    them (Undecided, or a float overflow). A hang here dumps the stacks and exits instead."""
    backend = FLOAT if B == "float" else mp_backend()
    faulthandler.dump_traceback_later(60, exit=True)
    try:
        for s in HUGE + REFUSED[B]:
            with pytest.raises((Undecided, ArithmeticError)):
                value(s, backend)
    finally:
        faulthandler.cancel_dump_traceback_later()
