"""reward.py: a rule-based math answer grader that is right, fast, and never hangs.

    extract_answer(text)        -> the final answer of a response or reference solution, or None
    verify(gold, pred)          -> True when the two denote the same mathematical answer
    math_reward(response, gold) -> 1.0 / 0.0 (configurable) for RL

How `verify` decides, cheapest first (most pairs never get past step 2):
  1. final answer: a whole solution text is reduced to its final answer (extract_answer);
  2. clean: LaTeX noise, units, `\\text{}`, `$`, thousands separators, `%` and degree marks are
     removed, giving a canonical string; equal strings are equal answers;
  3. structure: tuples and intervals (ordered, brackets must match), sets and bare lists (unordered),
     unions, matrices, `\\pm`, equations (`x = 2` vs `2`), inequalities (as intervals), letters;
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
a letter gold (A-J) takes only that letter; bare lists and sets are unordered, tuples and intervals
ordered with their brackets; `x = 5` stands for 5, and equations match up to a constant factor.

Never hangs: every input is length-capped; mathexpr bounds the cost of each parse and evaluation
(caps on tokens, nesting and the size of exact values; a value it cannot compute safely is
"undecided", i.e. not equal); and the slow path runs under a deadline implemented with
sys.setprofile, which, unlike signal.alarm, works in any thread (trainer thread pools, vLLM or
torchrun workers). A C call that the hook cannot interrupt is prevented by mathexpr's size bounds.
"""
import functools
import operator
import re
import sys
import time
import zlib
from fractions import Fraction

from mathexpr import FLOAT, Undecided, evaluate, mp_backend, nodes, parse, to_backend

_parse = parse  # the old name: bench/bench_reward.py clears its cache as reward._parse

__all__ = ["extract_answer", "verify", "math_reward"]

MAX_TEXT = 200_000    # characters of a response looked at (the tail: answers come last)
MAX_ANSWER = 2_000    # an extracted answer longer than this is compared as a plain string only
TIME_BUDGET = 1.0     # seconds for the slow path of one verify call


# ----------------------------------------------------------------------------- extraction
_BOXED = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])\s*")
# "the answer is" / "answer:" / "**Final Answer**" on its own line, and the same in other languages
# (a model trained on mixed data answers in the prompt's language); CJK words have no \b after them
_ANSWER_IS = re.compile(
    r"(?i)(?:\banswer\b[*\s]*(?:is\b|:)|\bfinal\s+answer\b[*]*[ \t]*(?=\n)"
    r"|\brespuesta\s+(?:final\s+)?(?:es\b|:)|\bréponse\s+(?:finale\s+)?(?:est\b|:)"
    r"|\bantwort\s+(?:ist|lautet)\b|\bantwort\s*:|\bответ\b\s*(?:равен\b|:)?|\brisposta\s+(?:è|e)\b"
    r"|\bresposta\s+(?:é|e)\b|\brisposta\s*:|\bresposta\s*:|答案(?:是|为|為)?\s*[:：]?|答えは|정답은)[\s:*：]*")
_JOIN_GAP = re.compile(r"[\s,;$]*(?:(?:and|or|\\text\{\s*(?:and|or)\s*\}|\\q?quad)[\s,;$]*)?"
                       r"(?:[a-zA-Z]\s*=\s*)?")  # `\boxed{2}, \boxed{3}` and `x = \boxed{2} or x = \boxed{3}`
# a part label at the start of a line: `(a)`, `b)`, `(ii)`, `**Part (b):**`, `Part 2:`
_PART = re.compile(r"(?im)^[\s*#]*(?:part\s*)?\(?(?:[a-h]|i{1,3}|iv|vi{0,3}|[1-9])\)(?![\w)])"
                   r"|^[\s*#]*part\s+\(?[a-h1-9]\)?\s*[:.*]")
# the end of the model's turn: whatever follows (a new user turn, another answer) is not its answer
_END_OF_TURN = re.compile(r"<\|(?:im_end|im_start|eot_id|endoftext|end|start_header_id|user|assistant)\|>"
                          r"|</s>|<end_of_turn>|<start_of_turn>|\[/?INST\]")


def _prepare(text):
    """The text as the grader reads it: cut at the first end-of-turn marker (`<|im_end|>`...), and
    with doubled backslashes undone when every command is written with two (`\\\\frac` from a JSON or
    a prompt template; a matrix row break `\\\\` alone is left as it is)."""
    if "<" in text or "[" in text:
        parts = [x for x in _END_OF_TURN.split(text, maxsplit=20) if x.strip()]
        text = parts[0] if parts else ""
    if "\\\\" in text and re.search(r"\\\\(?:[a-zA-Z]{2,}|[{}])", text) \
            and not re.search(r"(?<!\\)\\(?:[a-zA-Z]{2,}|[{}])", text):
        text = text.replace("\\\\", "\\")
    return text


def _brace_map(s):
    """Position of each '{' -> its matching '}', in one linear pass (unmatched ones are absent)."""
    stack, match = [], {}
    for m in re.finditer(r"[{}]", s):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            match[stack.pop()] = m.start()
    return match


def _last_boxed(s):
    """Content of the last non-empty \\boxed{...} / \\fbox{...} / `\\boxed 5`, with the boxes that
    belong with it joined by ', ': boxes directly before it (only commas, 'and', `$` between), or one
    box per labelled part (`(a) ... \\boxed{5}`, `(b) ... \\boxed{7}`); None if there is none."""
    boxes, match = [], None
    for m in _BOXED.finditer(s):
        j = m.end()
        if j < len(s) and s[j] == "{":
            match = _brace_map(s) if match is None else match
            if j not in match:
                continue  # unbalanced, e.g. truncated output
            boxes.append((m.start(), match[j] + 1, s[j + 1:match[j]]))
        else:
            tok = re.match(r"[^\s$]+", s[j:j + 200])
            if tok:
                boxes.append((m.start(), j + tok.end(), tok.group()))
    boxes = [b for b in boxes if b[2].strip()]
    if not boxes:
        return None
    parts, start = [boxes[-1][2]], boxes[-1][0]
    labelled = [_PART.search(s, max(0, b[0] - 300) if k == 0 else max(boxes[k - 1][1], b[0] - 300), b[0])
                for k, b in enumerate(boxes)] if len(boxes) > 1 and "\n" in s else [None] * len(boxes)
    k = len(boxes) - 1
    for b0, b1, content in reversed(boxes[-20:-1]):
        k -= 1
        part = labelled[k] and labelled[k + 1] and not (len(parts) > 1 and not labelled[k + 2])
        if b1 > start or not (_JOIN_GAP.fullmatch(s[b1:start]) or part):
            break
        parts.append(content)
        start = b0
    return ", ".join(p.strip() for p in reversed(parts))


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
                           r"|\s+\((?:since|because|as|by|from|using)\b")
_PROSE = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{2,}[ \t]+[a-zA-Z]{2,}(?![a-zA-Z]*\})|[^\W\d_a-zA-Z]")
# the verb before a value in a sentence: "the area is 64", "le nombre est 12", "这个数是12"
_IS = re.compile(r"(?i)(?:\b(?:is|are|was|equals|be|es|est|ist|è|é|равно|равен)\b|是|为|為)[\s*]*")
# a sentence that ends in its number: "... est 12.", "所以这个数是12"
_END_NUMBER = re.compile(r"(?:^|[\s:：是为為])(-?\d[\d,]*(?:\.\d+)?(?:\s*\\?%)?)\s*[.。!]?\s*$")


def _from_prose(s):
    """The value a sentence states: the math or number after its last 'is' / '=' ("The largest $n$ is
    34." -> 34), else its last math span, else the number it ends with; s itself when it is not prose
    or states none of these (a gold answer in words stays whole)."""
    if not _PROSE.search("".join(s.replace("$$", "$").split("$")[0::2])):
        return s
    m = None
    for m in _IS.finditer(s):
        pass
    if m is not None:
        tail = _SENTENCE_END.split(s[m.end():m.end() + 500], maxsplit=1)[0].strip(" *.,;")
        if tail and (tail[0] == "$" or tail.startswith("\\(")):
            math = _last_math(tail) or _math_spans(tail + "$")[:1]
            if math and math[0].strip():
                return math if isinstance(math, str) else math[0].strip()
        if tail and not _PROSE.search(tail) and re.search(r"\d", tail):
            return tail.strip("$ ")
    math = _last_math(s)
    if math is not None:
        return math
    end = _END_NUMBER.search(s[-200:])
    return end.group(1) if end else s


def _answer_is(s):
    """The value after the last 'answer is' / 'answer:' (a math span or the rest of the sentence)."""
    m = None
    for m in _ANSWER_IS.finditer(s):
        pass
    if m is None:
        return None
    rest = s[m.end():m.end() + 1000].lstrip()
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


def _extract(s):
    """The answer of the first rule that finds one (see extract_answer), or None."""
    for rule in (_last_boxed, _answer_is, _hashes, _last_math):
        ans = rule(s)
        if ans is not None and ans.strip():
            return ans.strip()
    return None


def extract_answer(text):
    """The final answer in `text`, or None if it has none.

    In order: the last \\boxed{...}/\\fbox{...} with balanced braces (also `\\boxed 5`; boxes in a
    row such as `\\boxed{2}, \\boxed{3}`, or one per labelled part, are joined), else the value after
    the last "(final) answer is" / "answer:" (also in Spanish, French, German, Italian, Portuguese,
    Russian, Chinese, Japanese, Korean), else GSM8K's `#### ...`, else the last `$...$` (or \\(...\\),
    \\[...\\]) span. The text ends at the first end-of-turn marker (`<|im_end|>`, `</s>`, ...). With a
    `<think>` block, the text after `</think>` is searched first, then the whole text.
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_answer expects a str, got {type(text).__name__}")
    text = _prepare(text[-MAX_TEXT:])
    if "</think>" in text:
        ans = _extract(text.rsplit("</think>", 1)[1])
        if ans is not None:
            return ans
    return _extract(text)


_MARKERS = re.compile(r"(?i)\\boxed|\\fbox|answer|####|</think>|respuesta|réponse|antwort|ответ|risposta|"
                      r"resposta|答案|答え|정답")


def _final_answer(s):
    """What verify compares: the extracted answer of a solution text; the value a prose sentence
    states (see _from_prose); else s itself (a bare answer)."""
    if _MARKERS.search(s):
        ans = extract_answer(s)
        if ans is not None:
            return ans
    return _from_prose(s)


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
    (r"\\(?:leqslant|leqq|leq|le)" + _NB + "|<=|≤|⩽", r" \\le "), (r"\\lt" + _NB, " < "), (r"\\gt" + _NB, " > "),
    (r"\\(?:geqslant|geqq|geq|ge)" + _NB + "|>=|≥|⩾", r" \\ge "), (r"\\(?:neq|ne)" + _NB + "|!=", r" \\ne "),
    (r"\\(?:varnothing|empty)" + _NB + r"|\\\{\s*\\\}", r"\\emptyset"),
    (r"\\langle" + _NB, "("), (r"\\rangle" + _NB, ")"), (r"\^\s*\{\s*\\prime\s*\}|\^\s*\\prime" + _NB, "'"),
    (r"\b(?:np|math|sp|sympy)\.", ""), (r"\\mathbb\s*\{?R\}?", r"(-\\infty,\\infty)"),
    (r"−", "-"), (r"×", r"\\times "), (r"·", r"\\cdot "), (r"π", r"\\pi "), (r"∞", r"\\infty "),
    (r"√", r"\\sqrt"), (r"[€£¥₹]|\\(?:euro|pounds)" + _NB, " "),  # currency signs (`\$` goes in _clean)
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
    s, deg = re.subn(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ" + _NB + r"|\\circ" + _NB + r"|°|\\degree" + _NB
                     + r"|\bdegrees?\s*$", " ", s)
    s, pct = re.subn(r"\\?%|\b(?:percent|per\s*cent|pct\.?)\s*$", " ", s)
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


def _key(s):
    """The spaces-free string that is compared first (digits apart stay apart: `1 2` is not `12`)."""
    s = re.sub(r"([_^])([0-9a-zA-Z])", r"\1{\2}", re.sub(r"\s+", "", re.sub(r"(?<=\d)\s+(?=\d)", "~", s)))
    return re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)


# ----------------------------------------------------------------------------- structure
_OPEN, _CLOSE = "([{", ")]}"


def _split_top(s, sep=","):
    """Split s at `sep` outside any bracket (brackets need not match in kind: `[0,1)`)."""
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
        rows = [[c.strip() for c in r.split("&")] for r in re.split(r"\\\\(?:\[[^\]]*\])?", m.group(2)) if r.strip()]
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


def _match_unordered(gs, ps, eq):
    if len(gs) != len(ps):
        return False
    left = list(ps)
    for g in gs:
        for i, p in enumerate(left):
            if eq(g, p):
                del left[i]
                break
        else:
            return False
    return True


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
    g, p = (("set", tuple(dict.fromkeys(x[1]))) if x[0] == "set" else x for x in (g, p))  # {1, 2, 2} = {1, 2}
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
    if gk == "seq" and pk == "list" and g[1] == "()":  # (3, 2) vs 3, 2
        return len(g[2]) == len(p[1]) and all(map(eq, g[2], p[1]))
    bag = ("list", "set", "union")
    if gk == "list" and pk == "seq" and p[1] == "()" and all(map(_assignment, g[1])):
        return len(g[1]) == len(p[2]) and all(map(eq, g[1], p[2]))  # x = 10, y = 4 is the tuple (10, 4)
    if gk in bag and (pk in bag or pk == "seq" and p[1] in ("()", "[]")):
        return _match_unordered(g[1], p[-1], eq)  # `x < -2 or x > 3` is a union of intervals too
    if pk == "list" and gk not in ("list", "set"):  # the same answer twice: `\\boxed{1.5} or \\boxed{3/2}`
        return all(eq(g, x) for x in p[1])
    return False


def _assignment(x):
    """Is structure x an `x = value` item (so that a list of them is ordered like a tuple)?"""
    left = _split_eq(x[1])[0] if x[0] == "expr" else None
    return left is not None and bool(_SIMPLE_LHS.fullmatch(left))


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
_LABEL = re.compile(rf"\|{_NAME}\||{_NAME}(?:\s*[:/]\s*{_NAME})*|\\frac\{{{_NAME}\}}\{{{_NAME}\}}")


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


def _value_equal(g, p, ctx, ratio=False):
    """Two scalar expressions: parsed, evaluated, compared; percent and degree readings tried."""
    rtol, g_pct, p_pct, g_deg, p_deg = ctx
    G, P = parse(g), parse(p)
    if G is None or P is None:
        return False
    (gt, g_dec, g_syms), (pt, p_dec, p_syms) = G, P
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


class _Timeout(BaseException):
    """Raised inside the guarded code when its time budget is spent (BaseException, so that
    `except Exception` blocks inside sympy/mpmath cannot swallow it)."""


def _with_deadline(seconds, fn, *args):
    """fn(*args), interrupted with _Timeout after `seconds`. sys.setprofile calls the hook on
    every Python and C function call of this thread only, so it works off the main thread, where
    signal.alarm cannot be used. If a profiler already holds the hook (cProfile, a tracing
    profiler), it is left alone and fn runs with only the static size guards."""
    if sys.getprofile() is not None:
        return fn(*args)
    deadline, calls = time.perf_counter() + seconds, [0]

    def hook(frame, event, arg):
        calls[0] += 1
        if calls[0] & 255 == 0 and time.perf_counter() > deadline:
            raise _Timeout

    sys.setprofile(hook)
    try:
        return fn(*args)
    finally:
        sys.setprofile(None)


_CHOICE = re.compile(r"\(?([A-J])\)?")
_CHOICE_PRED = re.compile(r"(?:\(([A-J])\)|([A-J])(?:[):.]|\s|$))")


def _equal(gold, pred, rtol):
    """Compare two final answers (not whole solutions)."""
    if len(gold) > MAX_ANSWER or len(pred) > MAX_ANSWER:
        return gold.strip() == pred.strip()
    (g, g_pct, g_deg), (p, p_pct, p_deg) = _clean(gold), _clean(pred)
    if not g or not p:
        return False
    if _key(g) == _key(p):
        return True
    m = _CHOICE.fullmatch(g)
    if m:
        return _choice(m.group(1), p.strip("* "))
    for a, b in ((p, g), (g, p)):  # a decimal comma (`3,5`) against a number written with a point
        if _DECIMAL_COMMA.fullmatch(a) and "," not in b and (a is p or "." in b):
            g, p = (g, a.replace(",", ".")) if a is p else (a.replace(",", "."), p)
    ctx = (rtol, g_pct, p_pct, g_deg, p_deg)
    mp_backend()  # built once per process, outside the deadline: importing mpmath takes ~0.1 s
    return _with_deadline(TIME_BUDGET, lambda: _struct_equal(_structure(g), _structure(p), ctx))


_DECIMAL_COMMA = re.compile(r"-?\d+,(?:\d{1,2}|\d{4,})|-?0,\d+")  # not `10,455`: that is ten thousand


def _choice(letter, p):
    """Multiple choice (the gold is a letter): the prediction leads with that letter and names no
    other; or, in prose ("ruling out A and D, we are left with (C)"), its last `(X)` or letter is it."""
    mp = _CHOICE_PRED.match(p)
    letters = set(re.findall(r"(?<![A-Za-z\\])[A-J](?![A-Za-z])", p))
    if mp and len(letters) == 1:
        return (mp.group(1) or mp.group(2)) == letter
    if not re.search(r"[a-z]{3,}", p) or re.search(r"[A-J]\)?\s*(?:,|/|&|and|or)\s*\(?[A-J]\)?[\s.*]*$", p):
        return False  # not prose, or it ends hedging: "(A) and (B)", "C or D"
    last = re.findall(r"\(([A-J])\)", p) or re.findall(r"(?<![A-Za-z\\])([A-J])(?![A-Za-z]|\s+[a-z])", p)
    return bool(last) and last[-1] == letter


# ----------------------------------------------------------------------------- public API
def _squeeze(s):
    """s without `$` and spaces, except one space between two digits: `1 2 3` is not `123`."""
    return re.sub(r"[\s$]", "", re.sub(r"(?<=\d)[\s$]+(?=\d)", "~", s))


def verify(gold, pred, *, rel_tol=1e-4):
    """True when `pred` (the model's) denotes the same mathematical answer as `gold` (reference).

    Either may be a bare answer (`\\frac{1}{2}`, `0.5`, `x = 3`) or a whole solution text, whose
    final answer is extracted first (see extract_answer). `rel_tol` is the relative tolerance used
    when either side is written as a decimal (`0.3333` vs `\\frac{1}{3}`); exact forms must agree
    exactly. Never raises on str input and returns within about TIME_BUDGET seconds.
    """
    for name, x in (("gold", gold), ("pred", pred)):
        if not isinstance(x, (str, int, float)) or isinstance(x, bool):
            raise TypeError(f"verify: {name} must be a str, got {type(x).__name__}")
    try:
        gold, pred = _prepare(str(gold)[-MAX_TEXT:]), _prepare(str(pred)[-MAX_TEXT:])
        short = max(len(gold), len(pred)) < MAX_ANSWER
        if short and _squeeze(gold) == _squeeze(pred):
            return True  # the same text, maybe one in $...$ (a prose answer with math in it)
        return bool(_equal(_final_answer(gold), _final_answer(pred), rel_tol))
    except (Exception, _Timeout):
        return False


def math_reward(response, gold, *, format_reward=0.0, no_answer_penalty=0.0, rel_tol=1e-4):
    """The RL reward of one response: 1.0 if its extracted final answer verifies against `gold`;
    else `format_reward` (default 0.0) if it has a final answer; else -`no_answer_penalty`
    (default 0.0, so 1.0 / 0.0 by default). Unlike verify, a response with no boxed / "answer is" /
    `####` / `$...$` answer gets no credit even if it is a bare number: RL teaches the format.
    """
    if not isinstance(response, str):
        raise TypeError(f"math_reward: response must be a str, got {type(response).__name__}")
    try:
        ans = extract_answer(response)
    except Exception:
        ans = None
    if ans is None:
        return -float(no_answer_penalty)
    return 1.0 if verify(gold, ans, rel_tol=rel_tol) else float(format_reward)
