"""mathexpr.py: a parser and evaluator of scalar math expressions in LaTeX or plain text, whose every
call takes bounded time and memory (reward.py's value comparison is built on it); and, in the last
two sections, reward.py's text helpers: the normalisation of whole answer strings that it compares
(_clean, _key, _structure) and the rules that find an answer in a response (_last_boxed, ...).

    parse(s)                  -> (tree, has a decimal literal, frozenset of free symbols), or None
    evaluate(tree, env, B)    -> its value with symbol values env: a Fraction while exact, else a B number
    FLOAT, mp_backend()       -> the two backends B: complex floats, and mpmath at 50 digits
    to_backend(x, B), nodes(tree), Undecided (raised when a value cannot be computed safely)

Syntax: `\\frac{a}{b}`, `\\frac43`, `\\sqrt[3]{x}`, `\\binom{n}{k}`, `|x|`, `\\lfloor x \\rfloor`, `n!`,
`2^-1`, `x**2`, implicit products (`2xy`, `2\\pi r`; not of two numerals: `1 2` is unreadable),
functions with or without parentheses
(`\\sin^2 x`, `\\sin^{-1}(x)`, `\\log_2 8`, `ln 2`, `sqrt(x)`), names with subscripts, primes and
accents (`x_{max}`, `y'`, `\\vec{v}`), `\\infty`, mixed numbers (`1\\frac{4}{5}` = 9/5). `\\log` is
natural (`lg` is base 10), `e`, `i` and `\\pi` are the constants, and `\\sqrt53` is sqrt(5)*3, as
LaTeX renders it.

Trees are nested tuples: ('n', Fraction), ('sym', name), ('+', *terms), ('*'|'/'|'^', a, b), ('neg', a),
('fn', name, a), ('log', a, base), ('sqrt', a), ('root', a, n), ('abs'|'floor'|'ceil'|'fact', a),
('binom', n, k), ('inf',).

Evaluation is exact (Fractions) while a node's value is rational: + - * /, integer powers, perfect
roots (8^{2/3} = 4), floor and ceil, factorials and binomials of small integers. Other nodes are
computed in a backend B, a dict of functions by tree name: FLOAT (cmath's complex floats, fast) or
mp_backend() (a private 50-digit mpmath context, built on first use: importing mpmath costs ~0.1 s
that most processes never need). A value that is not finite raises Undecided.

Bounded cost: a C call such as a huge integer power cannot be interrupted by a Python-level
deadline, so each one is prevented by a size bound up front. Not parsed: over MAX_EXPR characters
or MAX_TOKENS tokens, nesting deeper than MAX_DEPTH, numerals over 400 characters or with an
exponent over 400. Exact values have at most EXACT_BITS bits (a larger power goes to floats, whose
overflow is Undecided; a larger exact result is Undecided); exact factorials go up to 1000!,
binomials up to n = 2000. mpmath refuses exp/trig/gamma of |z| >= 1e6 (their argument reduction
needs huge precision), computes x^y for |y| >= 1000 as exp(y log x), and treats |x| >= 2^100000
as not finite.
"""
import cmath
import functools
import math
import re
from fractions import Fraction

__all__ = ["parse", "evaluate", "FLOAT", "mp_backend", "to_backend", "nodes", "Undecided"]

MAX_EXPR = 600        # characters of an expression that parse reads (longer: None)
MAX_TOKENS = 400      # tokens of an expression that parse reads
MAX_DEPTH = 80        # nesting of powers / groups that parse follows
EXACT_BITS = 20_000   # bits of an exact rational: larger powers go to floats, larger results are undecided


class Undecided(Exception):
    """The value of an expression cannot be computed safely (overflow, 0/0, unknown notation)."""


# ----------------------------------------------------------------------------- parser
_TOKEN = re.compile(r"\s*(?:(\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)|(\\[a-zA-Z]+|\\.)"
                    r"|([a-zA-Z]+)|(\*\*|\S))")
_FUNCS = {"sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan", "arccot", "arcsec",
          "arccsc", "sinh", "cosh", "tanh", "coth", "arsinh", "arcosh", "artanh", "log", "ln", "lg", "exp"}
_ALIAS = {"asin": "arcsin", "acos": "arccos", "atan": "arctan", "acot": "arccot", "asec": "arcsec",
          "acsc": "arccsc", "asinh": "arsinh", "acosh": "arcosh", "atanh": "artanh", "arcsinh": "arsinh",
          "arccosh": "arcosh", "arctanh": "artanh",
          "sqrt": "\\sqrt", "pi": "\\pi", "infty": "\\infty"}
_WORDS = sorted(_FUNCS | set(_ALIAS), key=len, reverse=True)  # longest first: "sinh" before "sin"
_INVERSE = {"sin": "arcsin", "cos": "arccos", "tan": "arctan", "cot": "arccot", "sec": "arcsec",
            "csc": "arccsc", "sinh": "arsinh", "cosh": "arcosh", "tanh": "artanh"}
_ACCENTS = {"\\overline", "\\bar", "\\hat", "\\vec", "\\tilde", "\\dot", "\\ddot", "\\widehat",
            "\\widetilde", "\\mathbb", "\\mathcal", "\\mathfrak", "\\underline", "\\check"}
_NOT_ATOM = {"\\cdot", "\\times", "\\div", "\\ast", "\\rfloor", "\\rceil", "\\rvert", "\\}", "\\le",
             "\\ge", "\\ne", "\\pm", "\\mp", "\\in", "\\cup", "\\cap", "\\to", "\\mid", "\\{", "\\emptyset",
             "\\dots", "\\ldots", "\\cdots"}
_CLOSER = {"(": ")", "[": "]", "{": "}", "|": "|", "\\lfloor": "\\rfloor", "\\lceil": "\\rceil",
           "\\lvert": "\\rvert", "\\vert": "\\vert", "\\|": "\\|"}


def _tokenize(s):
    """[(kind, text)], kind in num/cmd/fn/sym/op; a run of letters is split into known names
    (sin, sqrt, pi, ...) and single-letter symbols, so `2xy` is 2*x*y and `sqrt(x)` works."""
    out = []
    for m in _TOKEN.finditer(s):
        num, cmd, word, op = m.groups()
        if num:
            out.append(("num", num))
        elif cmd:
            out.append(("fn", cmd[1:]) if cmd[1:] in _FUNCS else ("cmd", cmd))
        elif op:
            out.append(("op", "^" if op == "**" else op))
        while word:
            w = next((w for w in _WORDS if word.startswith(w)), word[0])
            word, w = word[len(w):], _ALIAS.get(w, w)
            out.append(("fn", w) if w in _FUNCS else ("cmd", w) if w[0] == "\\" else ("sym", w))
    return out


class _Cursor:
    """The parse's state: the tokens and the position in them, the nesting depth (bounded), how
    many |..| are open (a `|` then closes one rather than opening another), and what the parse
    found: a decimal literal (`decimal`: compare with tolerance) and the free symbols (`syms`)."""

    def __init__(self, s):
        self.toks, self.i, self.depth, self.in_abs = _tokenize(s), 0, 0, 0
        self.decimal, self.syms = False, set()
        if len(self.toks) > MAX_TOKENS:
            raise Undecided("too many tokens")

    def peek(self, k=0):
        return self.toks[self.i + k] if self.i + k < len(self.toks) else (None, None)

    def take(self, expected=None):
        tok = self.peek()
        if expected is not None and tok[1] != expected:
            raise Undecided(f"expected {expected}, got {tok[1]}")
        self.i += 1
        return tok

    def raw(self):
        """The token text of a braced group or of one token, for names: x_{max}, \\vec{v}."""
        if self.peek()[1] != "{":
            return self.take()[1] or ""
        start, depth = self.i, 0
        while depth or self.i == start:
            depth += {"{": 1, "}": -1}.get(self.take()[1], 0)
            if self.i > len(self.toks):
                raise Undecided("unbalanced braces")
        return "".join(t for _, t in self.toks[start + 1:self.i - 1])


# The grammar, by recursive descent: one function per rule, each reading from the cursor p and
# returning a tree (see the module docstring):
#   expr    a sum of signed terms                 term {(+ | -) term}
#   term    a signed product                      [+ | -] term  |  power {(* / \cdot ... | implicit) power}
#   power   an atom, its factorials, its power    atom {!} [^ signed]        (right-associative)
#   signed  the right operand of * / ^            [-] power                  (3/-4, 2^-1)
#   atom    number | function | (..) [..] {..} | |..| floors ceils | name | \frac \binom \sqrt ...


def _expr(p):
    terms = [_term(p)]
    while p.peek()[1] in ("+", "-"):
        terms.append(_term(p))
    return terms[0] if len(terms) == 1 else ("+",) + tuple(terms)


def _term(p):
    if p.peek()[1] in ("+", "-"):
        sign = p.take()[1]
        t = _term(p)
        return ("neg", t) if sign == "-" else t
    node = _power(p)
    while True:
        t = p.peek()[1]
        if t in ("*", "\\cdot", "\\times", "\\ast", "/", "\\div"):
            p.take()
            node = ("/" if t in ("/", "\\div") else "*", node, _signed(p))
        elif _starts_atom(p):
            if p.peek()[0] == "num" and p.toks[p.i - 1][0] == "num":
                raise Undecided("two numbers side by side")  # `1 2 3` (lines run together) is no product
            node = ("*", node, _power(p))
        else:
            return node


def _starts_atom(p):
    kind, t = p.peek()
    if kind == "cmd":
        return t not in _NOT_ATOM
    return kind in ("num", "sym", "fn") or t in ("(", "[", "{") or t == "|" and not p.in_abs


def _power(p):
    p.depth += 1
    if p.depth > MAX_DEPTH:
        raise Undecided("nesting too deep")
    node = _atom(p)
    while p.peek()[1] == "!":
        p.take()
        node = ("fact", node)
    if p.peek()[1] == "^":
        p.take()
        node = ("^", node, _signed(p))
    p.depth -= 1
    return node


def _signed(p):
    if p.peek()[1] == "-":
        p.take()
        return ("neg", _power(p))
    return _power(p)


def _group(p, opener):
    p.take(opener)
    p.in_abs += opener in ("|", "\\lvert", "\\vert", "\\|")
    e = _expr(p)
    p.in_abs -= opener in ("|", "\\lvert", "\\vert", "\\|")
    p.take(_CLOSER[opener])
    return e


def _arg(p):
    """One macro argument: a {group} or a single token (`\\frac43` reads 4, then 3)."""
    kind, t = p.peek()
    if kind == "num" and len(t) > 1 and t.isdigit():
        p.toks[p.i] = ("num", t[1:])
        return ("n", Fraction(int(t[0])))
    return _group(p, "{") if t == "{" else _atom(p)


def _atom(p):
    kind, t = p.peek()
    if kind == "num":
        return _number(p)
    if kind == "fn":
        return _function(p, p.take()[1])
    if t in ("(", "[", "{"):
        return _group(p, t)
    if t in _CLOSER:  # |x|, \lvert x \rvert, \lfloor x \rfloor, \lceil x \rceil
        return ({"\\lfloor": "floor", "\\lceil": "ceil"}.get(t, "abs"), _group(p, t))
    p.take()
    if kind == "sym":
        return _name(p, t)
    if kind != "cmd" or t in _NOT_ATOM:
        raise Undecided(f"unexpected {t!r}")
    if t in ("\\frac", "\\binom"):
        return ("/" if t == "\\frac" else "binom", _arg(p), _arg(p))
    if t == "\\sqrt":
        if p.peek()[1] != "[":
            return ("sqrt", _arg(p))
        n = _group(p, "[")
        return ("root", _arg(p), n)
    if t in ("\\pi", "\\infty"):
        return ("sym", "pi") if t == "\\pi" else ("inf",)
    if t in _ACCENTS:  # \vec{v}, \overline{AB}: a name
        return _name(p, t[1:] + "{" + p.raw() + "}")
    return _name(p, t[1:])  # \alpha, \hbar, \theta_w, ...


def _name(p, name):
    """A symbol's full name with subscripts and primes: x_{max}, y', \\theta_w."""
    while p.peek()[1] in ("_", "'"):
        name += "'" if p.take()[1] == "'" else "_" + p.raw()
    if name not in ("pi", "e", "i"):
        p.syms.add(name)
    return ("sym", name)


def _number(p):
    """A numeral; or, followed by `_`, a numeral in another base (52_8: an opaque name); or a
    mixed number (1\\frac{4}{5})."""
    t = p.take()[1]
    mantissa, _, exponent = t.lower().partition("e")
    if len(mantissa) > 400 or exponent and abs(int(exponent)) > 400:
        raise Undecided("number too large")  # Fraction("1e999999999") would never return
    p.decimal |= "." in t or "e" in t.lower()
    if p.peek()[1] == "_":
        return _name(p, t)
    if p.peek()[1] == "\\frac" and p.peek(1)[1] == "{" and t.isdigit():
        save = p.i
        p.take()
        a, b = _arg(p), _arg(p)
        if a[0] == b[0] == "n" and 0 <= a[1] < b[1]:
            return ("n", int(t) + a[1] / b[1])
        p.i = save
    return ("n", Fraction(t))


def _function(p, name):
    """`\\sin x`, `\\sin(x)`, `\\sin^2 x`, `\\sin^{-1} x`, `\\log_2 8`, `\\ln 2`, `\\exp{a t}`."""
    base, power = None, None
    for _ in range(2):
        if p.peek()[1] == "_" and name == "log":
            p.take()
            base = _arg(p)
        elif p.peek()[1] == "^":
            p.take()
            power = _signed(p) if p.peek()[1] == "-" else _arg(p)
    if power in (("neg", ("n", 1)), ("n", -1)) and name in _INVERSE:
        name, power = _INVERSE[name], None
    if p.peek()[1] in ("(", "{"):
        arg = _group(p, p.peek()[1])
    else:  # \sin 2x, \cos \frac{\pi}{3}: a product of powers, up to the next function
        arg = _power(p)
        while _starts_atom(p) and p.peek()[0] != "fn":
            arg = ("*", arg, _power(p))
    if name == "lg" or name == "log" and base is not None:
        node = ("log", arg, base if base is not None else ("n", Fraction(10)))
    else:
        node = ("fn", "log" if name == "ln" else name, arg)
    return ("^", node, power) if power is not None else node


@functools.lru_cache(maxsize=1 << 16)
def parse(s):
    """(tree, has a decimal literal, frozenset of free symbols) of one scalar expression, or None if
    it is unreadable or over a size bound. Cached: a gold graded against a group is parsed once."""
    if len(s) > MAX_EXPR:
        return None
    try:
        p = _Cursor(s)
        tree = _expr(p)
        return (tree, p.decimal, frozenset(p.syms)) if p.i == len(p.toks) else None
    except (Undecided, RecursionError, ValueError, ZeroDivisionError, IndexError):
        return None


# ----------------------------------------------------------------------------- evaluation
def _backend(m, conv, **extra):
    """The functions of one number type, by tree name: m is cmath (complex) or an mpmath context."""
    B = {f: getattr(m, f) for f in ("sqrt", "exp", "log", "sin", "cos", "tan", "sinh", "cosh", "tanh")}
    B.update(arcsin=m.asin, arccos=m.acos, arctan=m.atan, arsinh=m.asinh, arcosh=m.acosh,
             artanh=m.atanh, cot=lambda z: 1 / m.tan(z), sec=lambda z: 1 / m.cos(z),
             csc=lambda z: 1 / m.sin(z), coth=lambda z: 1 / m.tanh(z), arccot=lambda z: m.atan(1 / z),
             arcsec=lambda z: m.acos(1 / z), arccsc=lambda z: m.asin(1 / z), conv=conv,
             pow=lambda x, y: x ** y, pi=conv(m.pi), e=conv(m.e), i=conv(1j), inf=conv(math.inf))
    B.update(extra)
    return B


def _real_gamma(z):
    """math.gamma of a real complex z (cmath has no gamma)."""
    if z.imag:
        raise Undecided("complex factorial")
    return complex(math.gamma(z.real))


FLOAT = _backend(cmath, complex, gamma=_real_gamma, finite=cmath.isfinite,
                 floor=lambda z: math.floor(z.real))
_MP = None


def mp_backend():
    """The same functions at 50 digits in a private mpmath context (so threads never fight over its
    precision), built on first use: importing mpmath costs ~0.1 s that most processes never need."""
    global _MP
    if _MP is None:
        import mpmath
        c = mpmath.MPContext()
        c.dps = 50

        def small(f):  # trig/exp/gamma of a huge argument needs a huge-precision reduction: refuse
            def f_small(z):
                if not abs(z) < 1e6:  # `not <`: a NaN is refused too
                    raise Undecided("argument too large")
                return f(z)
            return f_small

        def conv(x):
            return c.mpc(c.mpf(x.numerator) / x.denominator) if isinstance(x, Fraction) else c.mpc(x)

        B = _backend(c, conv, floor=lambda z: int(c.floor(z.real)),
                     finite=lambda x: c.isfinite(x) and (x == 0 or c.mag(x) < 100_000))  # |x| < 2^100000
        for f in ("exp", "sin", "cos", "tan", "cot", "sec", "csc", "sinh", "cosh", "tanh", "coth"):
            B[f] = small(B[f])
        B["gamma"] = small(c.gamma)
        # mpmath computes x**n for a huge integer n exactly, in one long loop no hook can interrupt
        B["pow"] = lambda x, y: x ** y if abs(y) < 1000 else B["exp"](y * c.log(x))
        _MP = B
    return _MP


def _iroot(n, q):
    """The integer q-th root of n >= 0 if n is a perfect q-th power, else None."""
    if n.bit_length() > 2000:
        return None
    r = round(n ** (1.0 / q)) if n.bit_length() < 1000 else round(math.exp(math.log(n) / q))
    return next((c for c in (r - 1, r, r + 1) if c >= 0 and c ** q == n), None)


def _exact_pow(a, b):
    """a**b as an exact Fraction when it is rational and not too large, else None."""
    if b.denominator == 1:
        n = b.numerator
        if a == 0 and n < 0:
            raise Undecided("0 to a negative power")
        bits = max(a.numerator.bit_length(), a.denominator.bit_length())
        return a ** n if abs(a) in (0, 1) or abs(n) * bits <= EXACT_BITS else None
    if a > 0 and b.denominator <= 64:  # 8^(2/3) = 4
        num, den = _iroot(a.numerator, b.denominator), _iroot(a.denominator, b.denominator)
        if num is not None and den is not None:
            return _exact_pow(Fraction(num, den), Fraction(b.numerator))
    return None


def _exact(op, a):
    """op on rationals a as an exact Fraction, or None when the result is irrational or too big."""
    if op in ("neg", "+", "*", "/", "abs"):
        return _OPS[op](None, None, *a)  # Fraction arithmetic is exact
    if op in ("^", "sqrt"):
        return _exact_pow(a[0], a[1] if op == "^" else Fraction(1, 2))
    if op == "root" and a[1].denominator == 1 and 0 < a[1] <= 64:
        r = _exact_pow(abs(a[0]), 1 / a[1])  # the real cube root of -8 is -2
        return r if a[0] >= 0 or r is None else -r if a[1] % 2 else None
    if op in ("floor", "ceil"):
        return Fraction(math.floor(a[0]) if op == "floor" else math.ceil(a[0]))
    if op == "fact" and a[0].denominator == 1 and 0 <= a[0] <= 1000:
        return Fraction(math.factorial(int(a[0])))
    if op == "binom" and all(x.denominator == 1 for x in a) and 0 <= a[0] <= 2000:
        return Fraction(math.comb(int(a[0]), int(a[1])) if a[1] >= 0 else 0)
    return None


def _pow(B, x, y):
    """x^y in backend B; 0^y is exact (0) for y > 0 and undecided otherwise."""
    if x == 0:
        if y.real > 0:
            return Fraction(0)
        raise Undecided("0 to a non-positive power")
    return B["pow"](x, y)


def _root(B, n, x, k):
    """The k-th root of x (node n): real for odd k and real x < 0, else the principal one."""
    if x.imag == 0 and x.real < 0 and k.imag == 0 and float(k.real) % 2 == 1:
        return -_pow(B, -x, 1 / k)  # odd roots of negatives are real
    return _pow(B, x, 1 / k)


def _floor(B, n, x):
    """floor or ceil (n[0]) of a real x as a Fraction; undecided for a complex x."""
    if abs(x.imag) > 1e-12 * max(1.0, abs(x)):
        raise Undecided("floor of a complex number")
    return Fraction(B["floor"](x) if n[0] == "floor" else -B["floor"](-x))


# How each tree node is computed, given the backend B, the node n and its evaluated children.
_OPS = {"neg": lambda B, n, a: -a, "+": lambda B, n, *a: sum(a[1:], a[0]), "*": lambda B, n, a, b: a * b,
        "/": lambda B, n, a, b: a / b, "^": lambda B, n, a, b: _pow(B, a, b),
        "fn": lambda B, n, a: B[n[1]](a),
        "log": lambda B, n, a, b: B["log"](a) / B["log"](b), "sqrt": lambda B, n, a: B["sqrt"](a),
        "root": _root, "abs": lambda B, n, a: abs(a) if B is None else B["conv"](abs(a)),
        "floor": _floor, "ceil": _floor, "fact": lambda B, n, a: B["gamma"](a + 1),
        "binom": lambda B, n, a, k: B["gamma"](a + 1) / (B["gamma"](k + 1) * B["gamma"](a - k + 1))}


def evaluate(n, env, B):
    """Value of tree n with symbol values env (name -> Fraction): a Fraction while exact, else a
    number of backend B. Raises Undecided, or an ArithmeticError / ValueError (a float overflow, a
    math domain error), when the value cannot be computed safely."""
    op = n[0]
    if op == "n":
        return n[1]
    if op == "sym":
        return B[n[1]] if n[1] in ("pi", "e", "i") else env[n[1]]
    if op == "inf":
        return B["inf"]
    args = [evaluate(a, env, B) for a in n[1:] if isinstance(a, tuple)]
    if all(isinstance(a, Fraction) for a in args):
        r = _exact(op, args)
        if r is not None:
            if max(r.numerator.bit_length(), r.denominator.bit_length()) > EXACT_BITS:
                raise Undecided("exact value too large")
            return r
    r = _OPS[op](B, n, *(to_backend(a, B) for a in args))
    if not isinstance(r, Fraction) and not B["finite"](r):
        raise Undecided("not finite")
    return r


def to_backend(x, B):
    """x as a number of backend B if it is a Fraction (mpmath does not take Fractions), else x."""
    return B["conv"](x) if isinstance(x, Fraction) else x


def nodes(t):
    """Every node of tree t, t first."""
    yield t
    for a in t[1:]:
        if isinstance(a, tuple):
            yield from nodes(a)


# ----------------------------------------------------------------------------- answer strings
# Normalisation of whole answer strings, for reward.py: _clean (LaTeX noise, units, text, percent and
# degree marks removed), _key (the string compared first), _structure (tuples, intervals, sets, lists,
# matrices and relations as nested tuples, whose scalars reward.py compares through parse/evaluate).

def _brace_map(s):
    """Position of each '{' -> its matching '}', in one linear pass (unmatched ones are absent)."""
    stack, match = [], {}
    for m in re.finditer(r"[{}]", s):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            match[stack.pop()] = m.start()
    return match


# ----------------------------------------------------------------------------- cleaning
_TEXT = re.compile(r"\\(text|textbf|textit|textrm|textnormal|textup|texttt|mathrm|mathbf|mathit|mathsf|"
                   r"mathtt|mbox|operatorname|boldsymbol|bm|hbox)\s*\{")
# words split by / ^ . * or spaces (a separator is required: `(a+)*`-style patterns backtrack forever)
_UNITISH = re.compile(r"[\s~]*[a-zA-Z]+(?:(?:\s*[/^.*]\s*|\s+)[a-zA-Z0-9{}-]+)*[\s~.]*")
_MATH_WORDS = {"sin", "cos", "tan", "cot", "sec", "csc", "log", "ln", "exp", "sqrt", "pi", "and",
               "or", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "mod", "in", "infty"}
_UNIT_TAIL = re.compile(r"(?<![\\a-zA-Z])((?:square |sq\.? |cubic )?[a-zA-Z]+(?:\s*\^\s*\{?-?\d\}?)?"
                        r"(?:(?:\s*[/*]\s*|\s+)[a-zA-Z]+(?:\s*\^\s*\{?-?\d\}?)?)*)\.?\s*$")
_UNITS = {"cm", "mm", "km", "nm", "kg", "mg", "ml", "ft", "in", "yd", "mi", "hr", "hrs", "min", "sec",
          "mph", "kmh", "kph", "mol", "rad", "deg", "sq", "eV", "kJ", "kW", "Hz", "Pa",
          "m", "s", "g", "h", "l", "K", "J", "W", "N", "V"}  # single letters only inside `m/s`
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
# digits in groups of three with a group that starts with 0 or a decimal part: one number, in a list too
_PADDED = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})*(?:,0\d\d(?:,\d{3})*(?:\.\d+)?|,\d{3}\.\d+)(?!\d)(?!,\d{3}(?!\d))")
_SIMPLE_LHS = re.compile(r"(?:\\angle\s*|m\s*\\angle\s*)?(?:\\?[a-zA-Z]+'*)(?:_\{[^{}]*\}|_[\w\\]+)?"
                         r"(?:\^\{?-1\}?)?(?:\([a-zA-Z0-9, ]*\))?")  # x, f(x), a_{n}, f^{-1}(x), \angle ABC
_NB = r"(?![a-zA-Z])"  # the end of a command name
_CLEAN = [(re.compile(p), r) for p, r in [  # applied in order by _clean
    (r"(?<=\d)\{,\}(?=\d{3}(?!\d))|(?<=\d),\\!\s*(?=\d{3}(?!\d))", ""),  # 1{,}000, 10,\!080
    (r"\{,\}", "."),                                                # 3{,}5
    (r"(?<!\\)\\[()\[\]]", " "),                                    # \( \) \[ \] delimiters
    (r"\\(?:left|right|[bB]igg?[lr]?)" + _NB + r"(?:\s*\.)?", ""),  # \left( -> (, \right. -> nothing
    (r"(?<!\\)\\[,:;!> ]", " "), (r"\\q?quad" + _NB, ","),         # spacing; \quad separates answers
    (r"\\(?:displaystyle|textstyle|scriptstyle|limits|nolimits|mathstrut)" + _NB, ""),
    (r"\\[dtc]frac" + _NB, r"\\frac"), (r"\\[dt]binom" + _NB, r"\\binom"),
    (r"\\(?:leqslant|leqq|leq|le)" + _NB + "|<=|≤|⩽", r" \\le "),
    (r"\\lt" + _NB, " < "), (r"\\gt" + _NB, " > "),
    (r"\\(?:geqslant|geqq|geq|ge)" + _NB + "|>=|≥|⩾", r" \\ge "), (r"\\(?:neq|ne)" + _NB + "|!=", r" \\ne "),
    (r"\\(?:varnothing|empty)" + _NB + r"|\\\{\s*\\\}", r"\\emptyset"),
    (r"\\langle" + _NB, "("), (r"\\rangle" + _NB, ")"), (r"\^\s*\{\s*\\prime\s*\}|\^\s*\\prime" + _NB, "'"),
    (r"\b(?:np|math|sp|sympy)\.", ""), (r"\\mathbb\s*\{?R\}?", r"(-\\infty,\\infty)"),
    (r"−", "-"), (r"×", r"\\times "), (r"·", r"\\cdot "), (r"π", r"\\pi "), (r"∞", r"\\infty "),
    (r"√", r"\\sqrt"), (r"[€£¥₹＄]|\\(?:euro|pounds)" + _NB, " "),  # currency signs (`\$` goes in _clean)
    (r"\b(?:USD|EUR|GBP|INR|Rs\.?)\s*(?=\d)", ""),  # and currency codes before the amount
]]


def _unwrap_text(s):
    """Replace \\text{..}-like groups by their content; drop them when they are a unit after a
    value (`5\\text{ cm}^2`, `3\\mathrm{~m/s}`); turn `\\text{ and }`/`or` into commas."""
    for _ in range(50):
        m = _TEXT.search(s)
        if not m:
            return s
        end = _brace_map(s[m.end() - 1:]).get(0)
        if end is None:
            return s[:m.start()] + s[m.end():]
        end += m.end() - 1
        content, before = s[m.end():end], s[:m.start()].rstrip()
        unit_tail = re.match(r"(\s*\^\s*\{?\d\}?)?\s*(?:$|[,;)\]]|\\\}|\\text)", s[end + 1:])
        if re.fullmatch(r"\s*(?:and|or)\s*", content):
            content = ","
        elif (m.group(1) in ("text", "mbox", "mathrm", "textrm", "textnormal", "hbox") and unit_tail
              and before and (before[-1].isalnum() or before[-1] in "}).") and len(content) < 40
              and _UNITISH.fullmatch(content)):
            content = ""  # a unit after a value, at the end of the answer or of a tuple entry
            end += len(unit_tail.group(1) or "")
        s = s[:m.start()] + " " + content + " " + s[end + 1:]
    return s


def _is_unit(text, glued):
    """Is `text` (the letters at the end of an answer) a unit? Each word a known unit or a word
    (3+ letters with a vowel: dollars, eggs, ways); single letters only in compounds (`m/s`)."""
    words = re.findall(r"[a-zA-Z]+", re.sub(r"^(?:square|sq\.?|cubic) ", "", text))
    if glued:  # `5cm` but not `2ab`
        return len(words) == 1 and words[0] in _UNITS and len(words[0]) > 1
    return all(w.lower() not in _MATH_WORDS and (w in _UNITS and (len(w) > 1 or len(words) > 1)
                                                  or len(w) > 2 and re.search("[aeiou]", w.lower()))
               for w in words)


def _repeating(m):
    """`a.b\\overline{c}` (c repeating) as an exact \\frac."""
    a, b, c = m.group(1) or "0", m.group(2), m.group(3)
    if len(b) + len(c) > 50:
        return m.group()
    return f"\\frac{{{int(a + b + c) - int(a + b)}}}{{{10 ** len(b) * (10 ** len(c) - 1)}}}"


@functools.lru_cache(maxsize=1 << 16)
def _clean(s):
    """Canonical form of an answer string: (cleaned text, had a percent sign, had a degree sign)."""
    s = re.sub(r"\s+", " ", s.replace("\\$", " ").replace("$", " ")).strip()  # no long runs below
    for pattern, repl in _CLEAN:
        s = pattern.sub(repl, s)
    s = re.sub(r"(\d*)\.(\d*)\\overline\s*\{(\d+)\}", _repeating, s)
    s = _unwrap_text(s)
    s, deg = re.subn(r"(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ" + _NB + r"|\\circ" + _NB + r"|°|\\degree" + _NB
                     + r")(?:\s*[CF](?=\s*(?:$|[,;)\]])))?|\bdegrees?\s*$", " ", s)  # 30^\circ C: Celsius
    s, pct = re.subn(r"\\?%|\b(?:percent|per\s*cent|pct\.?)\s*$", " ", s)
    if ",0" in s or "." in s:  # `3,007` and `1,234.5` are numbers wherever they stand (a list item is never `007`)
        s = _PADDED.sub(lambda m: m.group().replace(",", ""), s)
    s = re.sub(r"\s+(?:and|or)\s+", ",", s)
    s = re.sub(r"\s+", " ", s).strip(" ,;:").rstrip(".")
    for _ in range(2):  # trailing unit words: `18 dollars`, `864 inches^2`, `3 m/s`, `4e33 ergs s^{-1}`
        m = _UNIT_TAIL.search(s, max(0, len(s) - 60))  # units are short: bounded regex work
        if not m or not _is_unit(m.group(1), glued=not s[:m.start()][-1:].isspace()):
            break
        before = s[:m.start()].rstrip()
        free_letters = re.search(r"[a-zA-Z]", re.sub(r"\\[a-zA-Z]+", "", before))
        ends_in_value = re.search(r"(?:\d|\\[a-zA-Z]+)[\s})\]]*$", before) and re.search(r"\d", before)
        if free_letters or not ends_in_value:
            break  # a unit follows a number, not an expression with letters (`2 xy`, `x^2 + 2 ab`)
        s = before.rstrip(" ,;:")
    s = re.sub(r"\b(?:infinity|inf|oo)\b|\\infinity|\+\s*\\infty", r"\\infty", s)
    s = re.sub(r"^(-?)(\d+) (\d+)/(\d+)$", r"\1(\2+\3/\4)", s)  # the mixed number 7 3/4
    s = re.sub(r"(?i)^(?:all real numbers|the real numbers)$", r"(-\\infty,\\infty)", s)
    s = re.sub(r"(?i)^(?:no (?:real )?solutions?|none|the empty set|empty set)$", r"\\emptyset", s)
    if "\\approx" in s or "≈" in s:  # `x \approx 3.14` -> 3.14, `\frac{1}{3} \approx 0.33` -> \frac{1}{3}
        lhs, rhs = (x.strip() for x in re.split(r"\\approx|≈", s, maxsplit=1))
        s = rhs if not lhs or _SIMPLE_LHS.fullmatch(lhs) else lhs
    if _THOUSANDS.fullmatch(s) or re.fullmatch(r"-?\d{1,3}(?: \d{3})+(?:\.\d+)?", s):
        s = s.replace(",", "").replace(" ", "")  # only a lone number: in (3,331) or 2500,7500 commas separate
    s = s.replace(";", ",")  # `1; 2` lists answers as `1, 2` does
    s = re.sub(r",\s*,", ",", s).strip(" ,;:").rstrip(". ")
    return s, pct > 0, deg > 0


@functools.lru_cache(maxsize=1 << 16)
def _key(s):
    """The spaces-free string that is compared first (digits apart stay apart: `1 2` is not `12`)."""
    s = re.sub(r"([_^])([0-9a-zA-Z])", r"\1{\2}", re.sub(r"\s+", "", re.sub(r"(?<=\d)\s+(?=\d)", "~", s)))
    return re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)


# ----------------------------------------------------------------------------- structure
_OPEN, _CLOSE = "([{", ")]}"


def _split_top(s, sep=","):
    """Split s at `sep` outside any bracket (brackets need not match in kind: `[0,1)`)."""
    if sep not in s:
        return [s.strip()]  # most calls: no need for the character loop
    out, depth, cur = [], 0, 0
    i = 0
    while i < len(s):
        c = s[i]
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
        elif depth == 0 and s.startswith(sep, i):
            out.append(s[cur:i])
            cur = i + len(sep)
            i = cur
            continue
        i += 1
    out.append(s[cur:])
    return [x.strip() for x in out]


def _enclosed(s):
    """True if s[0] is a bracket whose partner is the last character of s."""
    depth = 0
    for i, c in enumerate(s):
        depth += (c in _OPEN) - (c in _CLOSE)
        if depth == 0:
            return i == len(s) - 1
    return False


_INEQ = re.compile(r"(\\le|\\ge|<|>)")
_MATRIX = re.compile(r"\\begin\{([pbBvV]?matrix|array)\}(?:\{[^{}]*\})?(.*)\\end\{\1\}", re.S)
_ONE_MATRIX = re.compile(r"\\begin\{([pbBvV]?matrix|array)\}(?:\{[^{}]*\})?(.*?)\\end\{\1\}", re.S)


def _matrix_sum(s):
    """An unevaluated sum of scalar multiples of matrices (`A + B`, `2A - B`, `\\frac{1}{3}A`) as one
    matrix whose entries are the expressions `+(c)*(a) - (b)`; None if s is not such a sum."""
    total, pos, n = None, 0, 0
    for m in _ONE_MATRIX.finditer(s):
        coef, sign = s[pos:m.start()].strip(), "+"
        if coef[:1] in ("+", "-"):
            sign, coef = coef[0], coef[1:].strip()
        elif total is not None:
            return None  # two matrices with no + or - between them: a product
        coef = re.sub(r"(?:\\cdot|\\times|\*)$", "", coef).strip()
        if coef and parse(coef) is None:
            return None
        rows = [[c.strip() for c in r.split("&")]
                for r in re.split(r"\\\\(?:\[[^\]]*\])?", m.group(2)) if r.strip()]
        term = [[f"{sign}({coef})*({c})" if coef else f"{sign}({c})" for c in r] for r in rows]
        if total is not None and [len(r) for r in total] != [len(r) for r in term]:
            return None
        total = term if total is None else [[a + b for a, b in zip(x, y)] for x, y in zip(total, term)]
        pos, n = m.end(), n + 1
        if n > 20:
            return None
    if total is None or s[pos:].strip():
        return None
    return ("mat", tuple(tuple(("expr", e) for e in r) for r in total))


def _interval(s):
    """`a < x \\le b`, `x > a`, `x \\le b` as an interval structure, else None."""
    p = [x.strip() for x in _INEQ.split(s)]
    ops = set(p[1::2])
    if len(p) not in (3, 5) or not all(p[0::2]) or len(ops & {"<", "\\le"}) not in (0, len(ops)):
        return None  # not a chain in one direction
    if p[1] in (">", "\\ge"):  # read it from the other end
        p = [{">": "<", "\\ge": "\\le"}.get(x, x) for x in reversed(p)]
    if len(p) == 3 and not _SIMPLE_LHS.fullmatch(p[0]) and not _SIMPLE_LHS.fullmatch(p[2]):
        return _solve_linear(*p)
    if len(p) == 3:
        p = ["-\\infty", "<"] + p if _SIMPLE_LHS.fullmatch(p[0]) else p + ["<", "\\infty"]
    if not _SIMPLE_LHS.fullmatch(p[2]):
        return None
    brackets = ("[" if p[1] == "\\le" else "(") + ("]" if p[3] == "\\le" else ")")
    return ("seq", brackets, (("expr", p[0]), ("expr", p[4])))


def _solve_linear(a, op, b):
    """`a < b` (op `<` or `\\le`) in one variable and linear with rational coefficients, solved as an
    interval: `-y > -4` is (-inf, 4), `2x + 1 < 5` is (-inf, 2), `-3x \\le 3` is [-1, inf); else None."""
    t = parse(f"{a}-({b})")
    if t is None or len(t[2]) != 1:
        return None
    (v,) = t[2]
    try:
        f0, f1, f2 = (evaluate(t[0], {v: Fraction(k)}, FLOAT) for k in (0, 1, 2))
    except (Undecided, ArithmeticError, ValueError, TypeError):
        return None
    if not all(isinstance(f, Fraction) for f in (f0, f1, f2)) or f1 == f0 or f2 - f1 != f1 - f0:
        return None  # not linear, or not exactly
    r = -f0 / (f1 - f0)
    root, closed = ("expr", f"{r.numerator}/{r.denominator}"), op == "\\le"
    if f1 > f0:  # increasing: a - b < 0 below the root
        return ("seq", "(" + "])"[not closed], (("expr", "-\\infty"), root))
    return ("seq", "[("[not closed] + ")", (root, ("expr", "\\infty")))


@functools.lru_cache(maxsize=1 << 16)
def _structure(s):
    """A cleaned answer as nested tuples: ('expr', str), ('list'|'set'|'union', items),
    ('seq', brackets, items) for tuples/intervals, ('mat', rows)."""
    s = s.strip()
    if "\\begin{" in s and (s.count("\\begin{") > 1 or not s.startswith("\\begin{")):
        combined = _matrix_sum(s)
        if combined:
            return combined
    m = _MATRIX.fullmatch(s)
    if m:
        rows = [r for r in re.split(r"\\\\(?:\[[^\]]*\])?", m.group(2)) if r.strip()]
        return ("mat", tuple(tuple(_structure(c) for c in r.split("&")) for r in rows))
    m = re.match(r"(?:[a-zA-Z]|\\[a-zA-Z]+|\([a-zA-Z, ]+\))(?:_\{?\w+\}?)?\s*(?:\\in|=|:)\s*(?=[(\[{\\])", s)
    rest = s[m.end():] if m else ""
    if m and (_enclosed(rest.replace("\\{", "{").replace("\\}", "}")) or rest.count("\\begin{") == 1
              and _MATRIX.fullmatch(rest)):
        return _structure(rest)  # x \in [2, 5],  S = \{1, 2\},  (x, y) = (1, 2),  v = \begin{pmatrix}..
    if m and s[0] == "(" and all(x[:1] == "(" and _enclosed(x) for x in _split_top(rest)):
        return _structure(rest)  # (a, b) = (2, 3), (3, 2): the solutions, each a tuple of the names' values
    if s.startswith("{") and _enclosed(s):
        return _structure(s[1:-1])  # a LaTeX group: {1,2,3} renders as 1,2,3
    union = _split_top(s, "\\cup")
    if len(union) > 1:
        parts = tuple(_structure(u) for u in union)
        if all(u[0] == "set" for u in parts):  # {1,2} \cup {3} = {1,2,3}
            return ("set", tuple(x for u in parts for x in u[1]))
        return ("union", parts)
    items = _split_top(s)
    if len(items) > 1:
        return ("list", _flat(items))
    m = re.fullmatch(r"\\\{\s*([a-zA-Z])\s*(?:\\mid|\||:)(.+)\\\}", s) if s.startswith("\\{") else None
    if m and re.search(rf"(?<![a-zA-Z\\]){m.group(1)}(?![a-zA-Z])", m.group(2)):
        described = _structure(m.group(2).strip())  # {x | x > 3} is (3, inf): set-builder of an interval
        if described[0] == "seq" or described[0] in ("list", "union") and all(x[0] == "seq" for x in described[1]):
            return described
    if s.startswith("\\{") and s.endswith("\\}") and _enclosed(s[1:-2] + "}"):
        return ("set", _flat(_split_top(s[2:-2])))
    if len(s) > 1 and s[0] in "([" and s[-1] in ")]" and _enclosed(s):
        inner = _split_top(s[1:-1])
        if len(inner) == 1:
            return _structure(inner[0])
        return ("seq", s[0] + s[-1], tuple(_structure(x) for x in inner))
    pm = re.search(r"\\(?:pm|mp)(?![a-zA-Z])", s)
    if pm and s.count("\\pm") + s.count("\\mp") == 1:
        a, b = s[:pm.start()], s[pm.end():]
        return ("list", (("expr", f"{a}+{b}"), ("expr", f"{a}-{b}")))
    return _interval(s) or ("expr", s)


def _flat(items):
    """Structures of list items, with `a \\pm b` items spliced in as two."""
    out = []
    for x in items:
        st = _structure(x) if x else None
        out.extend(st[1] if st and st[0] == "list" else [st] if st else [])
    return tuple(out)


# ----------------------------------------------------------------------------- answers in text
# The rules that find the final answer in a response (reward.extract_answer chains them): the last
# \boxed{} (with the boxes that belong with it), the value after 'the answer is' in several
# languages, GSM8K's `####`, the last math span; and the value a prose sentence states.

_BOXED = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])\s*")
# "Answer" in other languages: the prefixes of simple-evals' MGSM and multilingual MMLU, and a few more
_ANSWER_WORDS = ("respuesta", "réponse", "antwort", "antwoord", "ответ", "risposta", "resposta", "jibu",
                 "jawaban", "jawapan", "cevap", "odpowiedź", "svar", "vastaus", "đáp án", "απάντηση",
                 "উত্তর", "उत्तर", "సమాధానం", "คำตอบ", "الإجابة", "答案", "答え", "정답")
# "the answer is" / "answer:" / "**Final Answer**" on its own line, and the same in other languages
# (a model trained on mixed data answers in the prompt's language); CJK words have no \b after them
_ANSWER_IS = re.compile(
    r"(?i)(?:\banswer\b[*\s]*(?:is\b|:)|\bfinal\s+answer\b[*]*[ \t]*(?=\n)"
    r"|\brespuesta\s+(?:final\s+)?es\b|\bréponse\s+(?:finale\s+)?est\b|\bantwort\s+(?:ist|lautet)\b"
    r"|\bответ\b\s*равен\b|\brisposta\s+(?:è|e)\b|\bresposta\s+(?:é|e)\b|\bjawabannya\s+(?:adalah\b)?"
    r"|đáp án là|答案(?:是|为|為)|答えは|정답은"
    r"|(?<![a-zA-Z])(?:" + "|".join(_ANSWER_WORDS) + r")(?:\s+(?:final|finale))?[*\s]*[:：])[\s:*：]*")
# what may stand between two boxes that are one answer: `\boxed{2}, \boxed{3}`, `x = \boxed{2} or x = \boxed{3}`,
# `\boxed{1},\ \boxed{2}`, `(2, 4)$ and at $(0, 0)`, `x_1 = \boxed{1}, x_2 = \boxed{2}`, one box per list item
_JOIN_GAP = re.compile(r"(?:[\s,;$]|\\\\|\\ |\\[()\[\]])*(?:(?:and(?:\s+(?:at|also))?|or|\\text\{\s*(?:and|or)\s*\}|\\q?quad"
                       r"|\\[,; ]|\n[ \t]*(?:[-*•]|\d{1,2}[.)])(?=[ \t]))(?:[\s,;$]|\\[()\[\]])*){0,4}"
                       r"(?:[a-zA-Z](?:_\{?\w{1,3}\}?)?\s*=\s*)?")
# a part label at the start of a line: `(a)`, `b)`, `(ii)`, `**Part (b):**`, `Part 2:`
_PART = re.compile(r"(?im)^[\s*#]*(?:part\s*)?\(?(?:[a-h]|i{1,3}|iv|vi{0,3}|[1-9])\)(?![\w)])"
                   r"|^[\s*#]*part\s+\(?[a-h1-9]\)?\s*[:.*]")
# a part named at the start of a clause between two boxes: "\\boxed{3} for part (a) and \\boxed{7} for part (b)",
# "; (b) ", "For part (b), ..." on a new sentence or line (not "the integer part 3", "option (a)", "f(b)", "part 2 of",
# nor "in (ii)": an equation's number)
_PART_NAMED = re.compile(r"(?im)(?:(?:^|[;:.,]|\b(?:for|in|and)\b)[ \t*]*part\s*\(?(?:[a-h]|i{1,3}|iv|vi{0,3}|[1-9])\)?"
                         r"|(?:^|[;:.,]|\b(?:for|and)\b)[ \t*]*\((?:[a-h]|i{1,3}|iv|vi{0,3})\))(?![\w)])(?![ \t]*of\b)")
# ... or the whole text between them (stripped of spacing, `$`, `,;:*`) is a part's label: "(a) $\\boxed{3}$ (b) $\\boxed{7}$"
_PART_GAP = re.compile(r"(?i)(?:part\s*)?\((?:[a-h]|i{1,3}|iv|vi{0,3})\)")
# The words that may stand between two boxes joined per part or per indexed name, with spacing, punctuation,
# `$` and the labels (`x_2 =`, "for part (b)"): a list's joint. Anything else (a check, a withdrawal in any
# words, a new computation, math) says something about the box before, and the boxes stay apart. A list of
# what may stand, not of what may not: a word it lacks costs a join (a right answer missed), never a wrong
# answer paid ("So $x_1 = \\boxed{3}$, but this isn't in the domain of $\\log(x-5)$. Hence $x_2 = \\boxed{7}$" is 7).
_JOINT_WORDS = frozenset("and or also while then so hence thus therefore the other another second one root solution "
                         "value is are we get find have obtain similarly likewise minimum maximum largest smallest "
                         "least greatest sum product area perimeter length first part parts gives give yields".split())
_CLOSING_WORDS = frozenset("and also so hence thus therefore the is are we get find have obtain these those both all "
                           "solutions answers values roots final answer respectively for in part check checks out "
                           "satisfy satisfies original equation as required any order real of".split())
# (no word that picks one of them out: "the first is the answer", "the largest is the root" would withdraw the rest)
_GAP_NOISE = re.compile(r"\n[ \t]*(?:[-*•]|\d{1,2}[.)])(?=[ \t])|\$|\\[()\[\]]|\\\\|\\[,;: ]|\\q?quad(?![a-zA-Z])"
                        r"|\\text\{\s*(?:and|or)\s*\}|[\s,;:.*!()]")
_NAME_EQ = re.compile(r"[a-zA-Z](?:_\{?\w{1,3}\}?)?\s*=\s*$")
_OR = re.compile(r"\bor\b|\\text\{\s*or\s*\}")
# Two answers offered as alternatives ("$\\boxed{1, -2}$ or $\\boxed{1}$"): joined by HEDGE, not as a list.
# "or" between single answers is a list's joint (`x = \\boxed{2}` or `x = \\boxed{3}`: the solutions 2
# and 3); between answers of several items it is a hedge, which reward._judge takes as right only when
# every alternative is (`\\boxed{1, 2}` or `\\boxed{2, 1}`).
HEDGE = " ‖or‖ "  # a mark no text holds (a model that writes it gets the hedge's reading, never more)
# an indexed name before a box's value, inside it or just before it: `\boxed{y_1 = ..}`, `y_2 = \boxed{..}`
_INDEXED = re.compile(r"(?<![a-zA-Z\\])([a-zA-Z])_\{?(\w{1,3})\}?\s*=")
_INDEXED_BEFORE = re.compile(_INDEXED.pattern + r"\s*$")
# the end of the model's turn: whatever follows (a new user turn, another answer) is not its answer
_SIGN_OFF = re.compile(r"\s*(?:I\s+)?hope\s+(?:it|this|that)\s+(?:is|was|helps)(?:\s+correct)?\s*[.!]?\s*$",
                       re.IGNORECASE)
_END_OF_TURN = re.compile(r"<\|(?:im_end|im_start|eot_id|endoftext|end|start_header_id|user|assistant)\|>"
                          r"|</s>|<end_of_turn>|<start_of_turn>|\[/?INST\]")


def _prepare(text):
    """The text as the grader reads it: cut at the first end-of-turn marker (`<|im_end|>`...), without
    a closing formula that states nothing ("I hope it is correct.", the sign-off of Minerva-style
    few-shot answers), and with doubled backslashes undone when every command is written with two
    (`\\\\frac` from a JSON or a prompt template; a matrix row break `\\\\` alone is left as it is)."""
    if "<|" in text or "</s>" in text or "_of_turn>" in text or "INST]" in text:
        parts = [x for x in _END_OF_TURN.split(text, maxsplit=20) if x.strip()]
        text = parts[0] if parts else ""
    if "ope " in text[-80:]:
        text = text[:-80] + _SIGN_OFF.sub("", text[-80:])
    if "\\\\" in text and re.search(r"\\\\(?:[a-zA-Z]{2,}|[{}])", text) \
            and not re.search(r"(?<!\\)\\(?:[a-zA-Z]{2,}|[{}])", text):
        text = text.replace("\\\\", "\\")
    return text


_BARE_BOX = re.compile(r"[^\s$]+")  # `\boxed 5`: the token after it


def _last_boxed(s, several=True):
    """Content of the last non-empty \\boxed{...} / \\fbox{...} / `\\boxed 5`, with the boxes that
    belong with it joined by ', ': boxes directly before it (only commas, 'and', `$`, spacing, a list
    item's bullet between: _JOIN_GAP, under 300 characters), or one box per labelled part (`(a) ...
    \\boxed{5}`, `(b) ... \\boxed{7}` on their lines); with `several` (the gold is several answers:
    reward.grade decides), also boxes under 300 characters apart with a part named at the start of a
    clause between them ("\\boxed{3} for part (a) and \\boxed{7} for part (b)": _PART_NAMED, _PART_GAP)
    or giving one name with two indices (`\\boxed{y_1 = ..}` ... `\\boxed{y_2 = ..}`: _indexed_pair),
    where only a list's joint stands between them (_apart_as_parts). Boxes apart by "or" where one
    holds several items are joined by HEDGE; words after joined boxes that are not a closing leave
    the last box alone (_closing), and math after a box of several makes it a hedge. None if there
    is no box."""
    boxes, match = [], None
    for m in reversed(list(_BOXED.finditer(s))):  # from the last: at most 20 boxes are joined
        j = m.end()
        if j < len(s) and s[j] == "{":
            match = _brace_map(s) if match is None else match
            if j not in match:
                continue  # unbalanced, e.g. truncated output
            box = (m.start(), match[j] + 1, s[j + 1:match[j]])
        else:
            tok = _BARE_BOX.match(s, j, j + 200)
            if not tok:
                continue
            box = (m.start(), tok.end(), tok.group())
        if box[2].strip():
            boxes.append(box)
            if len(boxes) == 20:
                break
    if not boxes:
        return None
    boxes.reverse()
    # a part label in the text before each box (after the box before it, within 300 characters)
    labelled = [bool(_PART.search(s, max(boxes[k - 1][1] if k else 0, b[0] - 300), b[0]))
                for k, b in enumerate(boxes)] if len(boxes) > 1 and "\n" in s else [False] * len(boxes)
    parts, joints, start = [boxes[-1][2]], [], boxes[-1][0]
    for k in range(len(boxes) - 2, -1, -1):
        b0, b1, content = boxes[k]
        if b1 > start:
            break
        gap = s[b1:start]
        by_part = labelled[k] and labelled[k + 1]  # `(a) ... \boxed{5}`, `(b) ... \boxed{7}`
        near = start - b1 < 300
        if not (near and _JOIN_GAP.fullmatch(gap) or several and (by_part or near)
                and _apart_as_parts(s, boxes[k], boxes[k + 1], by_part)):
            break
        parts.append(content)
        joints.append(_joint_of(gap, content, boxes[k + 1][2]))
        start = b0
    tail = s[boxes[-1][1]:boxes[-1][1] + 500]  # what the response says after its last box
    if len(parts) > 1 and not _closing(tail):
        return parts[0].strip()  # "$x = \\boxed{1}$ and $x = \\boxed{-2}$, but -2 fails": the last box alone
    if s[:boxes[-1][0]].replace("\\$", "").replace("$$", "$").count("$") % 2:  # the box's own span closes first
        tail = tail.replace("\\$", "").replace("$$", "$")
        tail = tail[tail.find("$") + 1:]
    if len(parts) == 1 and re.search(r"\d|\$|\\[(\[]", tail) and not _closing(tail) and _names_an_item(tail, parts[0]):
        return parts[0].strip() + HEDGE + "\\text{...}"  # "$\\boxed{1, -2}$. But $x = 1$ fails.": not one answer
    out = parts[0].strip()
    for joint, content in zip(joints, parts[1:]):
        out = content.strip() + joint + out
    return out


def _joint_of(gap, a, b):
    """How two answers a and b apart by `gap` are joined: HEDGE when an "or" stands between them and
    either holds several items, else ', ' (a list)."""
    return HEDGE if _OR.search(gap) and (_several_items(a) or _several_items(b)) else ", "


def _names_an_item(tail, box):
    """Does the text after a box of several items name one of them (a number, or the value of a math span:
    "But $x = 1$ fails" after `\\boxed{1, -2}`)? A remark that names none ("... the cubic resolvent $P$")
    leaves the box its answer."""
    if len(box) > 2_000:
        return False
    keys = lambda x: {_key(_clean(x)[0]), _key(_clean(x.rsplit("=", 1)[-1])[0])}  # noqa: E731 (`x = 1`: and 1)
    listed = _clean(box)[0]
    listed = listed[2:-2] if listed.startswith("\\{") and listed.endswith("\\}") else listed  # a set's items
    listed = [i for i in _split_top(listed) if i]
    if len(listed) < 2:
        return False
    items = set().union(*map(keys, listed))
    text = _DELIMITER.sub("$", tail)
    said = re.findall(r"-?\d+(?:\.\d+)?", re.sub(r"\$[^$]*\$", " ", text))
    said += [x for x in _math_spans(text) if len(x) < 200]
    return any(keys(x) & items for x in said)


def _several_items(x):
    """Is the answer x a list or set of two or more items?"""
    try:
        st = _structure(_clean(x)[0]) if len(x) < 2_000 else ("expr",)
    except Exception:
        return False
    return st[0] in ("list", "set") and len(st[1]) > 1


def _closing(tail):
    """Does what follows boxes joined as a list (or a box of several) close it, whatever the spacing:
    punctuation, `$` and words of _CLOSING_WORDS only ("These are the solutions.", "Both check out.")?
    Anything else (a value, math, another word) may withdraw one of them."""
    return all(w.lower() in _CLOSING_WORDS for w in _GAP_NOISE.sub(" ", _PART_GAP.sub(" ", tail)).split())


def _joint(gap):
    """Is the text between two boxes, without its labels, a list's joint (_JOINT_WORDS, spacing, `$`)?"""
    return all(w.lower() in _JOINT_WORDS for w in _GAP_NOISE.sub(" ", _NAME_EQ.sub("", gap.rstrip(" $"))).split())


def _apart_as_parts(s, a, b, by_part):
    """Are boxes a and b (start, end, content) answers to two parts or two indexed names, with only a
    list's joint (_joint) between them once the labels are left out: part labels (at the start of a
    line when `by_part`, else at the start of a clause: _PART_NAMED, _PART_GAP), or one name with two
    indices (_indexed_pair)?"""
    lo, hi = a[1], b[0]
    if _PART_GAP.fullmatch(s[lo:hi].strip(" \t\n$,;:*")):
        return True
    labels = [m.span() for m in (_PART if by_part else _PART_NAMED).finditer(s, lo, hi)]
    if labels:
        kept = "".join(s[x:y] for x, y in zip([lo] + [e for _, e in labels], [b for b, _ in labels] + [hi]))
        return _joint(kept)
    return _indexed_pair(s, a, b) and _joint(s[lo:hi])


def _indexed_pair(s, a, b):
    """Are boxes a and b (start, end, content) values of one name with two consecutive indices
    (`\\boxed{y_1 = ..}` ... `\\boxed{y_2 = ..}`, or `x_1 = \\boxed{..}` ... `x_2 = \\boxed{..}`),
    whatever text is between? (`a_1` before `a_{10}` is a step on the way, not a second answer.)"""
    def label(box):
        m = _INDEXED.match(box[2].strip()) or _INDEXED_BEFORE.search(s[max(0, box[0] - 20):box[0]].rstrip(" $"))
        return m.groups() if m and m.group(2).isdigit() else None
    la, lb = label(a), label(b)
    return la is not None and lb is not None and la[0] == lb[0] and abs(int(la[1]) - int(lb[1])) == 1


# math spans joined as a list that ends its sentence: `$2$ and $5$.`, `$x = 1$, $x = 2$, or $x = 3$`. Each
# run of spacing is followed by something the next part needs (a separator, a `$`, the sentence's end), so
# the regex has one way to match: linear time, whatever spacing a response holds (`$1$` + 100k newlines).
_SPAN_LIST = re.compile(r"\s*\$[^$]+\$(?:\s*(?:[,;]\s*(?:(?:and|or)\b\s*)?|(?:and|or)\b\s*)\$[^$]+\$)+"
                        r"(?=[^\S\n]*(?:[.!;\n]|$))")
_SPAN_LIST_MAX = 2_000  # characters of a list looked at
_DELIMITER = re.compile(r"(?<!\\)\\[()\[\]]")  # `\(` `\)` `\[` `\]`, not a row break's `\\[2pt]`


def _span_list(s):
    """The contents of the math spans that s starts with, joined by ', ', when they are a list (apart by
    commas, 'and', 'or') that ends its sentence: "$2$ and $5$." -> "2, 5" (spans in `\\(..\\)` or
    `\\[..\\]` too); else None. Only the first _SPAN_LIST_MAX characters are read (a list running past
    them is none)."""
    head = _DELIMITER.sub("$", s[:_SPAN_LIST_MAX]) if "\\(" in s or "\\[" in s else s[:_SPAN_LIST_MAX]
    m = _SPAN_LIST.match(head) if head.count("$") >= 4 else None
    if m is None or len(s) > _SPAN_LIST_MAX and m.end() == len(head):
        return None
    parts = m.group().replace("\\$", "").replace("$$", "$").split("$")  # text, span, joint, span, ..., text
    out = parts[1].strip()
    for k in range(2, len(parts) - 2, 2):
        out += _joint_of(parts[k], parts[k - 1], parts[k + 1]) + parts[k + 1].strip()
    return out


_SENTENCE_BREAK = re.compile(r"[.!?]\s+(?=\S)")


def _last_sentence(s):
    """The last sentence of s, as _last_math reads the last math: its last line (of the last
    _SPAN_LIST_MAX characters), from its last '. ', '! ' or '? ' outside math spans."""
    line = s[-_SPAN_LIST_MAX:].rstrip().rsplit("\n", 1)[-1]
    start, last, dollars = 0, 0, 0
    for m in _SENTENCE_BREAK.finditer(line):
        dollars += line.count("$", last, m.start()) - line.count("\\$", last, m.start())
        last = m.start()
        if dollars % 2 == 0:
            start = m.end()
    return line[start:]


def _math_spans(s):
    """Contents of the complete `$...$` / `$$...$$` spans of s, in order (linear time)."""
    parts = s.replace("\\$", "").replace("$$", "$").split("$")
    return parts[1:len(parts) - (len(parts) % 2 == 0):2]


def _last_math(s):
    """Content of the last non-empty `$...$`, `\\(...\\)` or `\\[...\\]` span, or None."""
    best, best_end = None, -1
    spans = [x for x in _math_spans(s) if x.strip()]
    if spans:
        best, best_end = spans[-1], s.rfind("$")
    for a, b in (("\\(", "\\)"), ("\\[", "\\]")):
        j = s.rfind(b)
        i = s.rfind(a, 0, j) if j > 0 else -1
        if i >= 0 and j > best_end and s[i + 2:j].strip():
            best, best_end = s[i + 2:j], j
    return best.strip() if best is not None else None


# the end of the answer's sentence: a full stop, a new line, or a clause that explains it
_SENTENCE_END = re.compile(r"\n|[.。](?:\s|$)|。|です|입니다|,?\s+(?:since|because|which|so|where|but|as)\b"
                           r"|,\s*(?:not|nor|no|pas|nicht|non)\s|，\s*(?:不是|而不是|并非|而非)"
                           r"|\s+\((?:since|because|as|by|from|using)\b")
_PROSE_ASCII = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{2,}[ \t]+[a-zA-Z]{2,}(?![a-zA-Z]*\})")  # two words
_PROSE = re.compile(_PROSE_ASCII.pattern + r"|[^\W\d_a-zA-Z]")  # ... or a letter of another script
# the verb before a value in a sentence: "the area is 64", "le nombre est 12", "这个数是12"
_IS = re.compile(r"(?i)(?:\b(?:is|are|was|equals|be|es|est|ist|è|é|равно|равен)\b|是|为|為)[\s*]*")
_NUMBER_UNIT = re.compile(r"(-?\d[\d,]*(?:\.\d+)?)\s*(?!(?:more|less|fewer|times|greater|smaller|than|of|or|and|to|per)\b)"
                          r"[^\W\d_]+(?:\s+[^\W\d_]+)?")  # a number and a unit of one or two words
_LEAD_NUMBER = re.compile(r"(-?\d[\d,]*(?:\.\d+)?)\s+[^\W\d_]+(?:\s+[^\W\d_]+)*\s*[.。]?")  # a number, then words
# a sentence that ends in its number: "... est 12.", "所以这个数是12"
_END_NUMBER = re.compile(r"(?:^|[\s:：]|(?<=[^\x00-\x7f]))(-?\d[\d,]*(?:\.\d+)?(?:\s*\\?%)?)\s*"
                         r"(?:[^\s\d.,;:!?。！।a-zA-Z$\\]{1,3}\s*)?[.。!！।]?\s*$")  # "共有42个。", "7 है।", "4,75 €"


# a number as prose writes it (1,250  1.234,50  3 200,75  3,5  0.25), with a currency sign before or
# after it and a percent after it; not a digit of a name or a power (x2, m^2, a_1)
_PROSE_NUMBER = re.compile(r"(?<![a-zA-Z0-9^_.,\\])([$＄€£¥₹]\s?)?(-?(?:[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?|[0-9]{1,3}(?:\.[0-9]{3})+,[0-9]+"
                           r"|[0-9]{1,3}(?:[ \u00a0\u202f][0-9]{3})+(?:,[0-9]+)?|[0-9]+(?:[.,][0-9]+)?))(?![0-9])(\s?(?:\\?%|％|[€£]))?")
# where a sentence's clauses part: punctuation, a dash, and the words that lead to a conclusion
_CLAUSE = re.compile(r"(?i)[;；，、،:：]|,(?!\d)|\s[—–-]\s|\b(?:so|thus|hence|therefore|then|donc|alors|así que"
                     r"|por lo tanto|portanto|daher|also|итак|поэтому|значит|yani|bu yüzden)\b"
                     r"|所以|因此|于是|故|따라서|したがって|よって|इसलिए|अतः|لذلك|إذن")
_WHY = re.compile(r"(?i),?\s+(?:since|because|which|where|as|but|after|given)\b|\s\((?:since|because|as|by|from|using)\b")
_NEGATED = re.compile(r"(?i)\b(?:not|no|never|cannot|nicht|kein\w*|pas|jamais|nunca|não|non|не|нет|değil)\b|n't\b"
                      r"|不|没|沒|아니|ない|नहीं|ليس")
# words that may close a sentence after the number and its unit: "in total", a copula (है, vardır, 입니다)
_CLOSERS = {"in total", "in all", "altogether", "total", "overall", "each", "apiece", "left", "en total", "au total",
            "en tout", "insgesamt", "im ganzen", "всего", "в сумме", "है", "हैं", "था", "थे", "vardır", "var",
            "dır", "dir", "dur", "dür", "tır", "tir", "tur", "tür", "입니다", "です", "了"}
# what before a number makes it an operand or a rank, not the value stated: "with 5", "than 5", "the first 8"
_OPERAND_BEFORE = re.compile(r"(?i)(?:[-+*/^×÷<>]|\b(?:than|from|with|of|per|besides|except|first|last|next))\s*$")
_PERCENT_WORD = re.compile(r"(?i)percent|per cent|pour ?cent|por ?ciento|prozent|процент\w*")
_WIDE = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")  # CJK, kana, hangul: words not spaced


def _counted(tail, more=True):
    """Is `tail`, what follows a sentence's number, only what it counts: nothing, a unit or a noun of
    one word ("7 Stunden", "30 طالبًا", "6个苹果", "5개입니다", "5'tir"), maybe after "more" ("20 more
    stickers") and before closing words ("in total", है, vardır)? Not two content words ("12 billes
    rouges" may count something else) nor an operand ("3 more than x", "2 times y")."""
    words = tail.replace("*", " ").split()
    while words and (words[-1].lower() in _CLOSERS or len(words) > 1 and " ".join(words[-2:]).lower() in _CLOSERS):
        words = words[:-2] if " ".join(words[-2:]).lower() in _CLOSERS else words[:-1]
    if more and len(words) == 2 and words[0].lower() in ("more", "fewer", "extra", "additional"):
        words = words[1:]
    if not words:
        return True
    if len(words) > 1 or re.search(r"[\d=+*/^<>(){}\[\]\\$]", words[0]):
        return False
    w = words[0]
    if w.lower() in ("more", "less", "fewer", "times", "than", "of", "or", "and", "to", "per", "plus", "minus"):
        return False
    if re.fullmatch(r"[a-zA-Z]", w):
        return w in "lmgsh"  # a variable, unless a unit (5 l, 3 m)
    return len(w) <= (5 if _WIDE.search(w) else 20)


def _sentence_number(s):
    """The number the last sentence of s states, as a careful reader takes it: in the sentence's last
    clause (a clause that rules a value out, "..., not 13", is passed over), the value after its last
    '=' ("3 + 6 = 9 apples"), else its one number, when that is an amount of money or a percent ("She
    earned $1,250 in total.", "So 35% passed.") or is followed only by what it counts (_counted);
    None otherwise: two numbers ("had 18 and gave 6"), no number in the last clause ("There are 12
    apples; we eat half."), an operand ("3 more than x", "with 5 apples", "$100 less than"), a negation."""
    text = s[-300:].replace("**", "")
    if not re.search(r"[0-9]", text[-120:]):
        return None  # the last clause has no number (a cheap test first: most texts reaching here are not prose)
    sentences = [x for x in re.split(r"(?<=[.!?])\s+|[。！？।\n]", text) if x.strip()]
    if not sentences:
        return None
    last = sentences[-1].strip(" \t.!?:")
    if re.search(r"\\(?!\$)|[{}]", last):
        return None  # LaTeX outside math delimiters: not a sentence of prose (and no cost on LaTeX soup)
    last = _WHY.split(last, maxsplit=1)[0]
    clauses = [c for c in _CLAUSE.split(last) if c.strip()]
    while clauses and _NEGATED.search(clauses[-1]):
        clauses.pop()  # "..., not 13": the value is stated before what is ruled out
    clause = clauses[-1] if clauses else ""
    equation = "=" in clause
    clause = clause[clause.rfind("=") + 1:]
    nums = list(_PROSE_NUMBER.finditer(clause))
    if len(nums) != 1:
        return None
    m = nums[0]
    before, tail = clause[:m.start()], clause[m.end():].strip(" .,")
    if _OPERAND_BEFORE.search(before) or \
            re.match(r"(?i)(?:(?:more|less|fewer|greater|smaller|higher|lower|cheaper)\s+)?(?:than|times)\b", tail):
        return None  # an operand: "with 5 apples", "$100 less than the bike", "2 times the base"
    number = m.group(2)
    if re.fullmatch(r"-?\d{1,3}(?:[ \u00a0\u202f]\d{3})+(?:,\d+)?", number):
        number = re.sub(r"[ \u00a0\u202f]", "", number)  # 3 200,75 -> 3200,75 (the comma: see reward._equal)
    elif re.fullmatch(r"-?\d{1,3}(?:\.\d{3})+,\d+", number):
        number = number.replace(".", "")  # 1.234,50 -> 1234,50
    if m.group(3) and "%" in m.group(3) or _PERCENT_WORD.fullmatch(tail):
        return number + "%"
    return number if m.group(1) or m.group(3) or _counted(tail, more=not equation) else None


_WORD_THEN_NUMBER = r"(?:[^\W\d_]{2,}|a)\s+[$＄€£¥₹]?-?\d"  # "is de 3 200,75 €", "is a 40% increase", "is about 12"


def _from_prose(s, dollars=False):
    """The value a sentence states: the math or number after its last 'is' / '=' ("The largest $n$ is
    34." -> 34), else its last math span, else the number it ends with, else the number its last
    sentence states (_sentence_number); s itself when it is not prose or states none of these (a gold
    answer in words stays whole). With `dollars` (verify's reading of a text with no answer marker;
    extraction for the reward keeps its math spans), when every `$` of s is followed by a digit they
    are dollars, not math delimiters ("It cost $5 at first, so she paid $7 in total.")."""
    dollars = dollars and "$" in s and re.search(r"(?<!\\)\$(?!\s?\d)", s) is None
    text = re.sub(r"(?<!\\)\$(?=\s?\d)", "＄", s) if dollars else s  # a dollar sign that delimits nothing
    value = _prose_value(text)
    return s if value is text else value


# the value before 'is the answer': "x = 3 is the solution.", "So $n = 12$ is the answer."
_IS_THE_ANSWER = re.compile(r"(?i)(?:^|[,:;]\s*|\b(?:so|thus|hence|therefore)\s+)\$?([^,:;$]{1,60}?)\$?\s+(?:is|are)\s+"
                            r"(?:the|our|my)\s+(?:(?:only|final|correct|unique|required)\s+)?(?:answer|solution|result)s?"
                            r"\s*[.!]?\s*$")


def _prose_value(s):
    """_from_prose's work on s, or s itself when s states no value."""
    outside = "".join(s.replace("$$", "$").split("$")[0::2]) if "$" in s else s
    if not (_PROSE_ASCII.search(outside) if outside.isascii() else _PROSE.search(outside)) and not (
            outside is not s and re.search(r"(?<![\\a-zA-Z])[a-zA-Z]{3,}", outside)):  # "Hence, $x = 5$."
        return s
    low = s[-200:].lower()
    before = _IS_THE_ANSWER.search(s[-200:]) if " the " in low or " our " in low or " my " in low else None
    if before and not _PROSE_ASCII.search(before.group(1)) and re.search(r"\d", before.group(1)):
        return before.group(1).strip()
    m = None
    for m in _IS.finditer(s):
        pass
    if m is not None:
        tail = _SENTENCE_END.split(s[m.end():m.end() + 500], maxsplit=1)[0].strip(" *.,;")
        if _NEGATED.search(s[max(0, m.start() - 8):m.start()]) or _NEGATED.match(tail):
            return s  # "La réponse n'est pas 25.", "答案不是5": a value denied is not stated
        if "$" in tail:
            first = _span_list(tail) or next((x.strip() for x in _math_spans(tail) if x.strip()), None)
        else:
            first = tail[2:tail.find("\\)")].strip() if tail.startswith("\\(") and tail.find("\\)") > 2 else None
        if first:  # the first math after the verb: "The minimum is $-2$, attained at $x = 1$."
            return first
        if re.fullmatch(r"\(?[A-J]\)?", tail) and not _NEGATED.search(s[max(0, m.start() - 8):m.start()]):
            return tail  # "The correct option is **(C)**, since (A) and (D) fail." (not "..., 不是A")
        if tail and not _PROSE.search(tail) and re.search(r"\d", tail) and not re.match(_WORD_THEN_NUMBER, tail):
            return tail.strip("$ ")
        unit = _NUMBER_UNIT.fullmatch(tail)  # "The total is 9 apples.", "... = 12 cm"
        if unit:
            return unit.group(1)
    math = _span_list(_last_sentence(s)) or _last_math(s)  # a last sentence "$x = 2$ and $x = 5$.": both
    if math is not None:
        return math
    lead = _LEAD_NUMBER.fullmatch(s.strip())  # "5 яблок", "12 red apples"
    if lead:
        return lead.group(1)
    end = _END_NUMBER.search(s[-200:])
    before = s[-200:][:end.start(1)] if end else ""
    if end and not _OPERAND_BEFORE.search(before) and not re.search(r"\d[ \u00a0\u202f]$", before) \
            and not _NEGATED.search(_CLAUSE.split(before)[-1]):  # not "3 more than 5.", "3 200", "..., pas 25."
        return end.group(1)
    number = _sentence_number(s)
    return number if number is not None else s


def _answer_is(s):
    """The value after the last 'answer is' / 'answer:' (a math span or the rest of the sentence)."""
    low = s.lower()
    if "answer" not in low and not any(w in low for w in _ANSWER_WORDS):
        return None  # a substring test is much cheaper than the regex over a long text
    m, start = None, max(0, len(s) - 5000)
    for start in (start, 0) if start else (0,):  # the tail first: a long text need not be scanned whole
        for m in _ANSWER_IS.finditer(s, start):
            pass
        if m is not None:
            break
    if m is None:
        return None
    rest = s[m.end():m.end() + 1000].lstrip()
    listed = _span_list(rest)  # "The answer is $2$ and $5$."
    if listed:
        return listed
    for a, b in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if rest.startswith(a):
            j = rest.find(b, len(a))
            if j > len(a):
                return rest[len(a):j].strip()
    line = _SENTENCE_END.split(rest, maxsplit=1)[0].strip(" *.")
    return _from_prose(line).strip(" *.") if line else None


def _hashes(s):
    """GSM8K's final answer: the rest of the line after the last `####`."""
    i = s.rfind("####")
    return s[i + 4:].split("\n", 1)[0].strip() or None if i >= 0 else None
