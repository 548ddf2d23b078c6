"""The grader's class tables: (gold, model answer or whole response, same answer?) rows, one table
per class of misjudgement named in issue 14. Shared by tests/test_reward.py (every row must hold)
and bench/bench_reward.py (agreement per class, for this grader and optionally for math-verify).

Written by hand from the mathematics, in the shapes that model outputs and benchmark golds take
(golds from ../shared/data: MATH-500, AIME, AMC, Minerva, OlympiadBench, GSM8K); the held-out pairs
of the issue are not copied here. The non-equivalent rows matter as much as the equivalent ones:
each class has some, and the last table collects the false positives the issue names.
"""
T, F = True, False

CLASSES = {
    # several boxes that together are the answer; an intermediate box before the final one
    "boxes": [
        ("2, 3", "The roots are $\\boxed{2}$ and $\\boxed{3}$.", T),
        ("5, 7", "(a) The first part gives $\\boxed{5}$.\n\n(b) The second part gives $\\boxed{7}$.", T),
        ("5, 7", "**Part (a):** $\\boxed{5}$\n\n**Part (b):** $\\boxed{7}$", T),
        ("5, 7", "(a) $\\boxed{5}$\n(b) $\\boxed{8}$", F),
        ("12", "First $x = \\boxed{3}$, so the area is $4x = \\boxed{12}$.", T),
        ("3", "First $x = \\boxed{3}$, so the area is $4x = \\boxed{12}$.", F),
        ("12", "We get $\\boxed{3}$ for $x$. Therefore, the final answer is $\\boxed{12}$.", T),
        ("12", "The answer is $\\boxed{12}$.<|im_end|>\n<|im_start|>user\nNext: what is 2+3? \\boxed{5}", T),
        ("5", "The answer is $\\boxed{12}$.<|im_end|>\n<|im_start|>user\nNext: what is 2+3? \\boxed{5}", F),
        ("\\boxed{2} \\text{ and } \\boxed{3}", "2, 3", T),
        ("3", "Maybe $\\boxed{2}$ or $\\boxed{3}$.", F),
        ("(1, 2)", "$x = \\boxed{1}$ and $y = \\boxed{2}$, so the point is $\\boxed{(1, 2)}$.", T),
        # more of the kind, written after the fixes as a check that they generalise (misses: KNOWN_MISSES)
        ('3, 4', '$\\boxed{3}$, $\\boxed{4}$', T),
        ('3, 4', 'The answers are \\boxed{3} \\text{ and } \\boxed{4}', T),
        ('10', 'Step 1: $\\boxed{5}$ apples.\nStep 2: total is $\\boxed{10}$', T),
        ('\\frac{1}{2}, 3', '(i) $\\boxed{\\frac{1}{2}}$\n\n(ii) $\\boxed{3}$', T),
        ('1, 2, 3', 'a) \\boxed{1}\nb) \\boxed{2}\nc) \\boxed{3}', T),
        ('4', '\\boxed{4}\n\nThis is because 2+2 = 4. Hope this helps!', T),
        ('4', '\\boxed{4}<|endoftext|>Human: what is 3+3? Assistant: \\boxed{6}', T),
        ('7', '\\boxed{7}\n\n<|im_start|>user', T),
        ('2, 3', '$\\boxed{2}$ \\\\ $\\boxed{3}$', T),
        ('2', '$\\boxed{2}$ \\\\ $\\boxed{3}$', F),
    ],
    # thousands separators, decimal commas, currency, units, percent words, degrees
    "numbers": [
        ("10455", "10,455", T), ("10455", "10,456", F), ("3.5", "3,5", T), ("0.75", "0,75", T),
        ("3.5", "3,6", F), ("3.5", "3, 5", F), ("5.4", "\\$5.40", T), ("5.4", "$5.40", T),
        ("5.4", "€5.40", T), ("5.4", "5,40 €", T), ("2000.5", "2,000.5 kg", T), ("2000.5", "2,000.6 kg", F),
        ("0.4", "40 pct", T), ("40\\%", "40 percent", T), ("40\\%", "40 per cent", T), ("45", "45^\\circ", T),
        ("45", "45 degrees", T), ("46", "45^\\circ", F), ("1000000", "1 000 000", T), ("2000", "2 000", T),
        ("1234.5", "\\$1,234.50", T), ("18", "\\$18.00 dollars", T), ("7", "7 USD", T),
        # more of the kind, written after the fixes as a check that they generalise (misses: KNOWN_MISSES)
        ('1000', '1.000', F),
        ('12345', '12,345', T),
        ('12345.6', '12,345.6', T),
        ('0.5', '0,5', T),
        ('2.25', '\\$2.25', T),
        ('2.25', '2.25 dollars', T),
        ('50', '50\\%', T),
        ('5', '5 %', T),
        ('30', '30°', T),
        ('100', '100 km/h', T),
        ('1.5', '1,50', T),
        ('3', '3.0', T),
        ('1234567', '1,234,567', T),
        ('1234567', '1 234 567', T),
        ('7.5', '7,5 cm', T),
        ('40\\%', '0.4', T),
        ('9', '9 pct', T),
        ('0.09', '9 pct', T),
        ('5.40', 'USD 5.40', T),
        # round 3: from KNOWN_MISSES, fixed
        ("30", "30^{\\circ}C", T),
        ("12", "12 m^2", T),
    ],
    # answers in prose in other languages
    "languages": [
        ("42", "Por lo tanto, la respuesta es 42.", T), ("42", "Por lo tanto, la respuesta es 41.", F),
        ("42", "Donc, la réponse est 42.", T), ("42", "Die Antwort ist 42.", T),
        ("42", "Итак, ответ: 42.", T), ("42", "因此，答案是 42。", T), ("42", "答案：$42$", T),
        ("42", "La risposta è 42.", T), ("42", "A resposta é 42.", T), ("42", "答えは 42 です。", T),
        ("12", "所以这个数是12", T), ("12", "所以这个数是13", F),
        ("12", "On trouve donc que le nombre cherché est 12.", T),
        ("\\frac{1}{2}", "La probabilidad es $\\frac{1}{2}$.", T),
        ("\\frac{1}{2}", "La probabilidad es $\\frac{1}{3}$.", F),
        # more of the kind, written after the fixes as a check that they generalise (misses: KNOWN_MISSES)
        ('5', 'La réponse finale est $5$.', T),
        ('5', 'La respuesta final es 5', T),
        ('5', 'Die endgültige Antwort lautet 5.', T),
        ('5', 'Ответ: $5$', T),
        ('5', '最终答案是5', T),
        ('5', '答案为 $\\boxed{5}$', T),
        ('5', 'Vậy đáp án là 5', T),
        ('5', 'Jadi jawabannya adalah 5.', T),
        ('5', 'Así que el resultado es 6.', F),
        ('\\frac{3}{4}', '所以概率为 $\\frac{3}{4}$。', T),
        ('12', 'Il y a donc 12 billes rouges.', F),
        ('42', 'Respuesta: 42', T),
        ('42', 'Jibu: 42', T),
        ('42', 'উত্তর: 42', T),
        ('42', 'คำตอบ: 42', T),
        ('42', 'Vậy đáp án là 42', T),
        ('42', 'Risposta: 41', F),
        ('C', 'Respuesta: C', T),
        ('5', 'La réponse est donc $5$.', T),
        ('5', 'Ответ: 5 яблок.', T),
        ('6', 'Ответ: 5 яблок.', F),
        # round 3: from KNOWN_MISSES, fixed
        ("5", "Yani cevap 5'tir.", T),
    ],
    # the wrong span taken from prose
    "prose": [
        ("64", "Final Answer: the area is 64", T), ("64", "Final Answer: the area is 63", F),
        ("34", "The largest $n$ is 34.", T), ("34", "The largest $n$ is 35.", F),
        ("12", "**Answer:** 12", T), ("12", "**Answer**: 12", T), ("12", "**Final Answer**\n\n12", T),
        ("12", "**Final Answer**\n$$12$$", T), ("12", "The answer is 12.<|im_end|>", T),
        ("12", "Final answer: 12<|eot_id|><|start_header_id|>user<|end_header_id|>", T),
        ("12", "\\boxed{12}</s>", T), ("12", "The answer is \\boxed 12<|im_end|>", T),
        ("12", "So the answer is 12 (since $3 \\cdot 4 = 12$).", T),
        ("8", "So the number of ways is $8$, and the probability is $\\frac{8}{36}$.", F),
        ("\\frac{2}{9}", "So the number of ways is $8$, and the probability is $\\frac{8}{36}$.", T),
        ("5", "Thus $x = 5$ and the answer follows.", T),
        # more of the kind, written after the fixes as a check that they generalise (misses: KNOWN_MISSES)
        ('64', 'The area is $64$ square units.', T),
        ('64', 'So, the area of the square is 64.', T),
        ('7', 'Answer: 7 ways', T),
        ('7', '**Answer: 7**', T),
        ('7', 'Final answer: $\\boxed{7}$<|im_end|>', T),
        ('12', 'The final answer is 12 apples.', T),
        ('-2', 'The minimum value is $-2$, attained at $x = 1$.', T),
        ('1', 'The minimum value is $-2$, attained at $x = 1$.', F),
        ('9', '<answer>9</answer>', T),
        ('9', '<think>hmm</think><answer>The answer is 9</answer>', T),
        ('8', '<answer>9</answer>', F),
        ('5', 'Hence, $x = 5$.', T),
        ('8', 'Hence, $x = 5$.', F),
        # round 3: from KNOWN_MISSES, fixed (reward.py's docstring, rules of the third round)
        ("3", "x = 3 is the solution.", T),
    ],
    # multiple-choice letters
    "choices": [
        ("C", "Ruling out A and D, the answer is C.", T), ("C", "Ruling out C and D, the answer is A.", F),
        ("C", "ruling out A and D, we are left with (C).", T), ("(B)", "\\boxed{B}", T),
        ("B", "\\boxed{\\textbf{(B)}}", T), ("C", "\\boxed{\\text{C}}", T), ("C", "The correct option is C.", T),
        ("C", "The answer is C or D.", F), ("B", "I choose (B).", T), ("D", "**D**", T),
        ("E", "$\\mathrm{(E)}$", T), ("A", "A", T), ("A", "(B)", F), ("C", "Answer: (C) $12$", T),
        ("C", "Both A and C look right, but the answer is A.", F),
        # more of the kind, written after the fixes as a check that they generalise (misses: KNOWN_MISSES)
        ('B', 'The answer is $\\boxed{B}$', T),
        ('B', 'Answer: B', T),
        ('B', '(B) 12', T),
        ('B', 'B) 12', T),
        ('B', 'option B', T),
        ('B', "I think it's B.", T),
        ('B', 'The correct choice is (B).', T),
        ('B', 'Either A or B', F),
        ('E', '\\textbf{(E) }10', T),
        ('A', 'a', F),
        ('\\textbf{(C)}\\ 12', 'C', T),
        ('\\textbf{(C)}\\ 12', '12', T),
        ('\\textbf{(C)}\\ 12', 'D', F),
        ('\\textbf{(C)}\\ 12', '13', F),
        # round 3: from KNOWN_MISSES, fixed in round 2 without being moved
        ("B", "The answer is B, not C.", T),
    ],
    # a labelled gold against the bare value, and the reverse
    "labels": [
        ("AB:CD = 2:5", "2:5", T), ("2:5", "AB:CD = 2:5", T), ("AB:CD = 2:5", "5:2", F),
        ("|z| = 2", "2", T), ("2", "|z| = 2", T), ("|z| = 2", "3", F),
        ("V_1 : V_2 = 11 : 21", "11:21", T), ("V_1 : V_2 = 11 : 21", "11 : 20", F),
        ("\\frac{AB}{CD} = \\frac{2}{5}", "\\frac{2}{5}", T), ("AB = 5", "5", T), ("a_n = 2n+1", "2n+1", T),
        ("\\angle ABC = 40^\\circ", "40", T), ("m \\angle B = 40", "40^\\circ", T),
        ("\\overline{AB} = 7", "7", T), ("f(3) = 7", "7", T), ("7", "f(3) = 7", T),
        ("x = 3", "x = 4", F),
        # more of the kind, written after the fixes as a check that they generalise (misses: KNOWN_MISSES)
        ('x = 4', '4', T),
        ('4', 'x=4', T),
        ('a = 3, b = 5', '3, 5', T),
        ('P = 12', '12', T),
        ('|AB| = 5', '5', T),
        ('\\angle A = 60^\\circ', '60', T),
        ('BC:CA:AB = 3:4:5', '3:4:5', T),
        ('3:4:5', 'BC : CA : AB = 3 : 4 : 5', T),
        ('S_{\\triangle ABC} = 6', '6', T),
        ('\\tan \\theta = 2', '2', T),
        ('\\sin A = \\frac{3}{5}', '\\frac{3}{5}', T),
        ('k = 2', '3', F),
        ('r = 2', '|z| = 3', F),
        # round 3: from KNOWN_MISSES, fixed
        ("|a+b| = 5", "5", T),
    ],
    # relations: \lt \gt \le \geq, flipped inequalities, chains and intervals
    "relations": [
        ("x < 4", "x \\lt 4", T), ("x > 4", "x \\gt 4", T), ("x \\le 4", "x \\leq 4", T),
        ("x \\geq 4", "x \\ge 4", T), ("y < 4", "-y > -4", T), ("y < 4", "-y < -4", F),
        ("x \\le 3", "3 \\ge x", T), ("x < 4", "x \\le 4", F), ("0 \\le t \\le 5", "t \\in [0, 5]", T),
        ("0 \\le t \\le 5", "t \\in [0, 5)", F), ("-2 < x < 3", "x \\in (-2, 3)", T), ("x \\gt 2", "(2, \\infty)", T),
        ("x < 2", "2x + 1 < 5", T), ("x < 2", "2x + 1 < 6", F), ("x \\ge -1", "-3x \\le 3", T),
        ("(-\\infty, 4)", "-y > -4", T),
        # more of the kind, written after the fixes as a check that they generalise (misses: KNOWN_MISSES)
        ('x \\leq 5', 'x \\le 5', T),
        ('x<5', 'x \\lt 5', T),
        ('x \\geq 5', '5 \\leq x', T),
        ('-5 < x', 'x > -5', T),
        ('1 \\le x \\le 3', '[1, 3]', T),
        ('1 < x \\le 3', '(1, 3]', T),
        ('1 < x \\le 3', '[1, 3]', F),
        ('x > 3', '3 - x < 0', T),
        ('x \\le -2', '-x \\ge 2', T),
        ('x \\ge 2', '-x \\ge 2', F),
        ('a > 0', 'a \\gt 0', T),
        ('x < 1', '1 > x', T),
        ('x \\in [0, 5]', '0 \\leq t \\leq 5', T),
        ('t \\in (0, 5)', '0 < t < 5', T),
    ],
    # sets and lists
    "sets": [
        ("1, 2", "1; 2", T), ("1; 2; 3", "3, 2, 1", T), ("1; 2", "1; 3", F),
        ("1, 2", "x = 1 or x = 2", T), ("x = 1 \\text{ or } x = 2", "x = 2, x = 1", T),
        ("\\{1, 2, 2\\}", "\\{1, 2\\}", T), ("\\{1, 2\\}", "\\{1, 2, 2\\}", T), ("\\{1, 2\\}", "\\{1, 2, 3\\}", F),
        ("(10, 4, -2)", "(4, 10, -2)", F), ("(10, 4, -2)", "(10, 4, -2)", T),
        ("x = 10, y = 4, z = -2", "(10, 4, -2)", T), ("x = 10, y = 4, z = -2", "(4, 10, -2)", F),
        ("\\{-1, 3\\}", "x = 3 \\text{ or } x = -1", T),
        # more of the kind, written after the fixes as a check that they generalise (misses: KNOWN_MISSES)
        ('1, 2', '2; 1', T),
        ('\\{1, 2\\}', '\\{2, 1, 1\\}', T),
        ('\\{1, 2\\}', '1 \\text{ and } 2', T),
        ('x = 1 \\text{ or } x = 2', '\\{1, 2\\}', T),
        ('x = -1, x = 3', 'x \\in \\{-1, 3\\}', T),
        ('(1, 2), (3, 4)', '(3, 4), (1, 2)', T),
        ('(1, 2), (3, 4)', '(2, 1), (4, 3)', F),
        ('1, 2, 3', '1, 2', F),
        ('2, 3', 'x=2; x=3', T),
        ('-2, 2', '\\pm 2', T),
        ('\\{2\\}', '2, 2', T),
        ('2', '2, 3', F),
    ],
    # doubled backslashes (JSON or prompt escaping), in the gold or in the answer
    "escaped": [
        ("\\\\frac{1}{2}", "0.5", T), ("\\frac{1}{2}", "\\\\frac{1}{2}", T), ("\\\\frac{1}{2}", "\\\\frac{1}{3}", F),
        ("\\\\sqrt{2}", "\\sqrt{2}", T), ("\\\\{1, 2\\\\}", "\\{2, 1\\}", T),
        ("0.75", "The answer is \\\\boxed{\\\\frac{3}{4}}.", T), ("\\\\text{(B)}", "B", T),
        ("\\\\pi", "3.14159", T), ("90^\\\\circ", "90", T), ("\\\\frac{\\\\sqrt{3}}{2}", "\\frac{\\sqrt{3}}{2}", T),
        ("\\\\begin{pmatrix} 1 \\\\\\\\ 2 \\\\end{pmatrix}", "(1, 2)", T), ("\\\\sqrt{2}", "\\sqrt{3}", F),
        # more of the kind, written after the fixes as a check that they generalise (misses: KNOWN_MISSES)
        ('\\\\dfrac{3}{4}', '0.75', T),
        ('\\\\left(1, 2\\\\right)', '(1, 2)', T),
        ('2\\\\sqrt{3}', '\\sqrt{12}', T),
        ('\\\\infty', '\\infty', T),
        ('\\\\text{yes}', 'yes', T),
        ('x \\\\in [0, 1]', '[0, 1]', T),
        ('\\\\frac{1}{2}', '\\frac{1}{4}', F),
    ],
    # matrices: pmatrix / bmatrix, an unevaluated sum, entries rounded in the gold
    "matrices": [
        ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\begin{bmatrix} 1 & 2 \\\\ 3 & 4 \\end{bmatrix}", T),
        ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\begin{bmatrix} 1 & 3 \\\\ 2 & 4 \\end{bmatrix}", F),
        ("\\begin{pmatrix} 4 \\\\ 6 \\end{pmatrix}",
         "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix} + \\begin{pmatrix} 3 \\\\ 4 \\end{pmatrix}", T),
        ("\\begin{pmatrix} 4 \\\\ 7 \\end{pmatrix}",
         "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix} + \\begin{pmatrix} 3 \\\\ 4 \\end{pmatrix}", F),
        ("\\begin{pmatrix} 2 \\\\ 4 \\end{pmatrix}", "2\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", T),
        ("\\begin{pmatrix} -2 \\\\ 2 \\end{pmatrix}",
         "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix} - \\begin{pmatrix} 3 \\\\ 0 \\end{pmatrix}", T),
        ("\\begin{pmatrix} 0.33 & 0.67 \\end{pmatrix}", "\\begin{pmatrix} 1/3 & 2/3 \\end{pmatrix}", T),
        ("\\begin{pmatrix} 0.33 & 0.67 \\end{pmatrix}", "\\begin{pmatrix} 1/3 & 3/4 \\end{pmatrix}", F),
        # within half a unit of the last digit, not a whole one: 1/3 is 0.0067 from 0.34
        ("\\begin{pmatrix} 0.34 & 0.67 \\end{pmatrix}", "\\begin{pmatrix} 1/3 & 2/3 \\end{pmatrix}", F),
        ("\\begin{pmatrix} 0.333 & 0.667 \\end{pmatrix}", "\\begin{pmatrix} 1/3 & 2/3 \\end{pmatrix}", T),
        ("\\mathbf{v} = \\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", T),
        ("\\left[\\begin{matrix} 1 & 0 \\\\ 0 & 1 \\end{matrix}\\right]",
         "\\begin{pmatrix} 1 & 0 \\\\ 0 & 1 \\end{pmatrix}", T),
        # more of the kind, written after the fixes as a check that they generalise (misses: KNOWN_MISSES)
        ('\\begin{bmatrix} 1 & 2 \\\\ 3 & 4 \\end{bmatrix}', '\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}', T),
        ('\\begin{pmatrix} 2 & 0 \\\\ 0 & 2 \\end{pmatrix}', '2\\begin{pmatrix} 1 & 0 \\\\ 0 & 1 \\end{pmatrix}', T),
        ('\\begin{pmatrix} 1 \\\\ 1 \\end{pmatrix}', '\\frac{1}{2}\\begin{pmatrix} 2 \\\\ 2 \\end{pmatrix}', T),
        ('\\begin{pmatrix} 0.333 \\\\ 0.667 \\end{pmatrix}', '\\begin{pmatrix} \\frac13 \\\\ \\frac23 \\end{pmatrix}', T),
        ('\\begin{pmatrix} 0.5 \\\\ 0.25 \\end{pmatrix}', '\\begin{pmatrix} \\frac12 \\\\ \\frac13 \\end{pmatrix}', F),
        ('\\begin{pmatrix} 1 & 2 \\end{pmatrix}', '\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}', F),
    ],
    # false positives: none of these may verify
    "false_positives": [
        ("2p + q", "5 = 2p + q", F), ("2p + q", "2p + q = 5", F), ("5", "5 = 2p + q", F),
        ("f(2)", "f(3)", F), ("f(2) = 5", "f(3) = 5", F), ("123", "1\n2\n3", F), ("123", "1 2 3", F),
        ("6", "1 2 3", F), ("12", "1\n\n2", F), ("x^2 + 1", "x^2 + 1 = 0", F), ("4", "x^2 = 4", F),
        ("2p + q", "2p + q", T), ("5", "2 + 3 = 5", T),
        # more of the kind, written after the fixes as a check that they generalise (misses: KNOWN_MISSES)
        ('x', 'x = 5', F),
        ('2p + q', '2p + q = 5', F),
        ('7', '7 = x + y', F),
        ('f(1)', 'f(2)', F),
        ('g(2) = 4', 'g(-2) = 4', F),
        ('12', '1,2', F),
        ('1.2', '1,2', T),
        ('13', '1\n3', F),
        ('2, 3', '23', F),
        ('6', '2 3', F),
        ('x + 1', 'x + 1 = 0', F),
    ],
}

# Rows of the same classes that this grader still misjudges (written with the rows above; not asserted).
# Round 3 fixed the six that were left and moved them into the tables above.
KNOWN_MISSES = []

# ----------------------------------------------------------------------------- round 2 (issue 26)
# Two batches per class of misjudgement of the second round, kept apart so each round can measure
# a batch it did not fix against. BATCH1 was written before any change of that round and measured
# (bench/bench_reward.py --round2), then the grader was fixed; BATCH2 was written after the fixes
# and measured before the code was touched again. Written from how models and people write answers;
# not copied from any grader's test suite. Classes: several answers, prose in other languages,
# letters in prose, number forms, the last sentence before chat-template debris, escaped LaTeX and
# shorthand, descriptions of one set.
ROUND2_BATCH1 = {
    "several": [
        ("3, -5", r"The solutions are $x = \boxed{3}$ and $x = \boxed{-5}$.", T),
        ("3, -5", r"$\boxed{-5}$ and $\boxed{3}$", T),
        ("3, -5", r"\boxed{-5, 3}", T),
        ("3, -5", r"\boxed{x = 3 \text{ or } x = -5}", T),
        ("(1, 4), (4, 1)", r"\boxed{(4, 1), (1, 4)}", T),
        ("(1, 4), (4, 1)", r"\boxed{(1, 4)} \quad \text{and} \quad \boxed{(4, 1)}", T),
        ("(1, 4), (4, 1)", r"\boxed{(1, 4)}", F),
        ("a=2, b=3", r"\boxed{2}, \boxed{3}", T),
        ("a=2, b=3", r"\boxed{a = 3, b = 2}", F),
        ("3, -5", r"\boxed{3}", F),
        (r"3 \text{ and } -5", r"\boxed{3, -5}", T),
        ("x=1, y=2", r"\boxed{y = 2, x = 1}", T),
    ],
    "prose": [
        ("42", "所以答案是 **42**。", T),
        ("42", "因此，总共有42个。", T),
        ("15", "La respuesta es **15 manzanas**.", T),
        ("15", "Donc, la réponse est 15 euros.", T),
        ("7", "अतः उत्तर 7 है।", T),
        ("8", "إذن الإجابة هي 8.", T),
        ("8", "所以答案是 18。", F),
        ("12", "Il a 12 ans, donc la réponse est 24.", F),
    ],
    "letters": [
        ("B", "The answer is definitely B, not A or C.", T),
        ("B", "It must be (B); (A) and (C) are ruled out.", T),
        ("B", "La respuesta correcta es B, no A.", T),
        ("B", "答案是B，不是A。", T),
        ("A", "The answer is definitely B, not A or C.", F),
        ("B Maria", "The answer is B.", T),
        ("B Maria", r"\boxed{B}", T),
        ("C Maria", "The answer is B.", F),
    ],
    "number_forms": [
        ("3.5", "The cost is 3,5 €.", T),
        ("2500.5", "2,500.50km", T),
        ("1250", "She earned $1,250 in total.", T),
        ("25", "The discount is 25% of the price.", T),
        ("4.75", "It costs 4,75 €", T),
        ("3.5", "3,5 km", T),
        ("35", "3,5 km", F),
        ("1250", "She earned $1,260 in total.", F),
    ],
    "debris": [
        ("12", "So the total is 12.\nI hope it is correct.", T),
        ("12", "The final answer is 12. I hope it is correct.<|im_end|>", T),
        ("12", "Therefore the answer is 12.<|im_start|>", T),
        ("9", "We find 3 + 6 = 9 apples.\n<|im_start|>assistant", T),
        ("12", "So the total is 13.\nI hope it is correct.", F),
    ],
    "escaped_latex": [
        (r"\frac{1}{2}", r"\\boxed{\\frac{1}{2}}", T),
        (r"\frac{3}{4}", r"$\\boxed{\\dfrac{3}{4}}$", T),
        (r"\frac{1}{2}", r"\boxed{\tfrac{1}{2}}", T),
        (r"\frac{1}{2}", r"\boxed{\frac12}", T),
        (r"\frac{3}{2}", r"\boxed{\frac32}", T),
        ("1000", r"\boxed{1\!000}", T),
        ("(1, 2)", r"\\boxed{\\left(1, 2\\right)}", T),
        (r"\frac{1}{3}", r"\boxed{\frac12}", F),
    ],
    "sets": [
        (r"(-\infty, -2) \cup (2, \infty)", r"\boxed{|x| > 2}", T),
        ("[-3, 3]", r"\boxed{-3 \le x \le 3}", T),
        ("[-3, 3]", r"\boxed{|x| \le 3}", T),
        ("(-3, 3)", r"\boxed{|x| \le 3}", F),
        (r"(-\infty, 1] \cup [5, \infty)", r"\boxed{|x - 3| \ge 2}", T),
        (r"\begin{pmatrix} 0.5 & 0.25 \\ 0.75 & 1 \end{pmatrix}",
         r"\begin{pmatrix} \frac{1}{2} & \frac{1}{4} \\ \frac{3}{4} & 1 \end{pmatrix}", T),
        (r"\begin{pmatrix} 0.5 & 0.25 \end{pmatrix}", r"\begin{pmatrix} \frac{1}{2} & \frac{1}{3} \end{pmatrix}", F),
    ],
}

# Written after round 2's fixes to BATCH1, and measured before the code was touched again.
ROUND2_BATCH2 = {
    "several": [
        ("2, 7", r"x=\boxed{7} \text{ or } x=\boxed{2}", T),
        ("(2, 3), (3, 2)", r"\boxed{(3,2)}\ \text{and}\ \boxed{(2,3)}", T),
        ("-1, 4", r"The roots are \boxed{4} and \boxed{-1}.", T),
        ("-1, 4", r"\boxed{-1 \text{ and } 4}", T),
        ("-1, 4", r"\boxed{4}", F),
        ("x = 2, y = -1", r"\boxed{(x, y) = (2, -1)}", T),
        ("1, 2, 3", r"\boxed{3, 2, 1}", T),
        ("1, 2, 3", r"\boxed{1, 2}", F),
    ],
    "prose": [
        ("36", "Jadi jawabannya adalah 36.", T),
        ("120", "Итак, всего 120 рублей.", T),
        ("5", "따라서 답은 5개입니다.", T),
        ("64", "Por lo tanto, el área es **64**.", T),
        ("21", "Also beträgt die Summe 21 Euro.", T),
        ("9", "所以一共需要 9 天。", T),
        ("9", "所以一共需要 19 天。", F),
        ("14", "Il reste donc 4 pommes.", F),
    ],
    "letters": [
        ("D", "So the correct choice is (D), not (B).", T),
        ("C", "Option C is correct; A and B are wrong.", T),
        ("C", "A and B are wrong, so C.", T),
        ("B", "Option C is correct; A and B are wrong.", F),
        ("A", "La bonne réponse est A, pas B.", T),
        ("D Paris", r"\boxed{D}", T),
        ("D Paris", r"\boxed{C}", F),
        ("B", "Die Antwort ist B, nicht D.", T),
    ],
    "number_forms": [
        ("1500", "The total cost is $1,500.", T),
        ("12.5", "Il paie 12,5 €.", T),
        ("7500", "7,500kg", T),
        ("35", "So 35% of the students passed.", T),
        ("2.5", "2,5 Liter", T),
        ("25", "2,5 Liter", F),
        ("1500", "The total cost is $1,600.", F),
        ("10.75", "€10,75", T),
    ],
    "debris": [
        ("8", "Thus the answer is 8.\nI hope it is correct.<|im_end|>", T),
        ("8", "The number of cats is 8.\n\nI hope this helps!", T),
        ("15", "In total she has 15 marbles.<|im_start|>user\nWhat about 3?", T),
        ("8", "The number of cats is 9.\n\nI hope this helps!", F),
        ("6", "Final Answer: The final answer is $6$. I hope it is correct.", T),
    ],
    "escaped_latex": [
        (r"\sqrt{2}", r"\\boxed{\\sqrt{2}}", T),
        (r"\frac{5}{6}", r"\boxed{\tfrac56}", T),
        (r"\frac{1}{4}", r"\boxed{\frac14}", T),
        ("2000", r"\boxed{2\,000}", T),
        (r"\frac{2}{3}", r"\\boxed{\\tfrac{2}{3}}", T),
        (r"\frac{1}{4}", r"\boxed{\frac41}", F),
    ],
    "sets": [
        ("(-1, 5)", r"\boxed{|x - 2| < 3}", T),
        ("[-1, 5]", r"\boxed{|x - 2| < 3}", F),
        (r"(-\infty, -4] \cup [4, \infty)", r"\boxed{|y| \geq 4}", T),
        (r"(-\infty, -4) \cup (4, \infty)", r"\boxed{|y| \geq 4}", F),
        ("[-2, 0]", r"\boxed{|x+1| \leq 1}", T),
        (r"\begin{pmatrix} 0.2 & 0.4 \\ 0.6 & 0.8 \end{pmatrix}",
         r"\begin{pmatrix} \frac15 & \frac25 \\ \frac35 & \frac45 \end{pmatrix}", T),
        (r"\begin{pmatrix} 0.67 \end{pmatrix}", r"\begin{pmatrix} \frac{2}{3} \end{pmatrix}", T),
    ],
}

# Rows of the two batches this grader still misjudged (not asserted; every other row is). Round 3
# fixed all ten (the rules of the third round in reward.py's docstring), so every row is asserted.
ROUND2_MISSES = []

# ----------------------------------------------------------------------------- round 3 (issue 26)
# The same discipline as round 2: BATCH1 was written before any change of the third round and
# measured as the grader was; then the grader was fixed; BATCH2 was written after the fixes and
# measured before the code was touched again. Written from how models and people write answers, not
# from the strings of the rows above or of any grader's test suite. Same seven classes.
ROUND3_BATCH1 = {
    "several": [
        ("-2, 5", r"So $x=-2$ or $x=5$; the solutions are $\boxed{-2}$ and $\boxed{5}$.", T),
        ("(0, 0), (2, 4)", r"The curves meet at $\boxed{(2, 4)}$ and at $\boxed{(0, 0)}$.", T),
        ("x = 1, y = -3", r"$\boxed{x = 1},\ \boxed{y = -3}$", T),
        ("t_1 = 2, t_2 = 6", r"\boxed{t_1 = 6,\ t_2 = 2}", F),
        ("2, 6", r"\boxed{6 \text{ or } 2}", T),
        ("2, 6", r"\boxed{2, 6, 8}", F),
        ("4, -4", r"$x^2 = 16$, so $\boxed{x = \pm 4}$.", T),
        ("a = 2, b = 3; a = 3, b = 2", r"\boxed{(a, b) = (2, 3) \text{ or } (3, 2)}", T),
        ("a = 2, b = 3; a = 3, b = 2", r"\boxed{(a, b) = (2, 3)}", F),
        ("-1, 2", r"The roots satisfy $x_1 + x_2 = 1$, and the smaller one is $\boxed{-1}$.", F),
        ("1, 2, 4", "The divisors are:\n- $\\boxed{1}$\n- $\\boxed{2}$\n- $\\boxed{4}$", T),
    ],
    "prose": [
        ("45", "Portanto, o trem percorre **45 km**.", T),
        ("18", "Así que Juan tiene 18 canicas en total.", T),
        ("18", "Juan tenía 18 canicas y regaló 6, así que le quedan 12.", F),
        ("250", "इसलिए कुल लागत 250 रुपये है।", T),
        ("30", "لذلك، عدد الطلاب هو 30 طالبًا.", T),
        ("6", "因此，小明还剩下**6**个苹果。", T),
        ("10", "小明原来有10个苹果，吃掉了4个，所以还剩6个。", F),
        ("7", "Daher dauert die Reise insgesamt 7 Stunden.", T),
        ("12", "Следовательно, ответ — 12.", T),
        ("24", "Bu yüzden sınıfta toplam 24 öğrenci vardır.", T),
    ],
    "letters": [
        ("C", "Options A, B and D all fail the test, so the answer is C.", T),
        ("C", "The correct option is **(C)**, since (A) and (D) give negative values.", T),
        ("A", "The correct option is **(C)**, since (A) and (D) give negative values.", F),
        ("D", "La respuesta correcta es la D.", T),
        ("D", "正确答案是D，而不是B或C。", T),
        ("B", "正确答案是D，而不是B或C。", F),
        ("B: Mercury", "The answer is B.", T),
        ("B: Mercury", "Venus", F),
        ("B", "A est exclue, donc la réponse est B.", T),
        ("A", "A est exclue, donc la réponse est B.", F),
    ],
    "number_forms": [
        ("1234.5", "Der Preis beträgt 1.234,50 €.", T),
        ("0.25", "Die Wahrscheinlichkeit ist 0,25.", T),
        ("12000", "The company made $12,000 in profit last year.", T),
        ("12000", "It spent $3,000 and earned $12,000, so the profit was $9,000.", F),
        ("40", "That is a 40% increase.", T),
        ("1.5", "Each bottle holds 1,5 l.", T),
        ("15", "Each bottle holds 1,5 l.", F),
        ("1050", "He paid 1,050.00 dollars.", T),
        ("3200.75", "Le total est de 3 200,75 €.", T),
    ],
    "debris": [
        ("20", "So she needs 20 more stickers.\n<|im_start|>user\nThanks!", T),
        ("20", "Adding them gives 12 + 8 = 20.<|im_start|>", T),
        ("12", "Adding them gives 12 + 8 = 20.<|im_start|>", F),
        ("144", "Therefore, the area of the garden is 144 square meters. I hope it is correct.\n<|im_start|>user", T),
        ("7", "The remainder when dividing by 9 is 7.<|endoftext|><|endoftext|>", T),
        ("9", "The remainder when dividing by 9 is 7.<|endoftext|>", F),
        ("56", "There are 56 handshakes in total.\n\nI hope this is correct!<|im_end|>", T),
        ("5", "Hence the smallest such n is 5.</s><s>[INST] Next question [/INST]", T),
    ],
    "escaped_latex": [
        (r"\sqrt{3}", r"$$\\boxed{\\sqrt{3}}$$", T),
        (r"\frac{7}{2}", r"\boxed{\tfrac72}", T),
        (r"\frac{1}{6}", r"\boxed{\frac16\pi}", F),
        (r"2\sqrt{2}", r"\boxed{2\!\sqrt{2}}", T),
        (r"\left(\frac{1}{2}, 3\right)", r"\\boxed{\\left(\\frac{1}{2}, 3\\right)}", T),
        (r"\frac{1}{2}", r"\\boxed{\\frac{1}{2}x}", F),
        (r"\frac{\sqrt{2}}{2}", r"\boxed{\frac{\sqrt2}2}", T),
        ("10", r"\\boxed{10 \\text{ cm}}", T),
        (r"\frac{5}{3}", r"\boxed{1\tfrac{2}{3}}", T),
    ],
    "sets": [
        (r"(-\infty, -1) \cup (1, \infty)", r"\boxed{x < -1 \text{ or } x > 1}", T),
        (r"(-\infty, -1) \cup (1, \infty)", r"\boxed{-1 < x < 1}", F),
        ("[2, 8]", r"\boxed{|x - 5| \le 3}", T),
        (r"(-\infty, 0) \cup (4, \infty)", r"\boxed{|x-2|>2}", T),
        (r"(-3, -1) \cup (1, 3)", r"\boxed{1 < |x| < 3}", T),
        (r"[-3, -1] \cup [1, 3]", r"\boxed{1 < |x| < 3}", F),
        (r"|x| \ge 1", r"(-\infty, -1] \cup [1, \infty)", T),
        (r"\begin{pmatrix} 0.6 & -0.8 \\ 0.8 & 0.6 \end{pmatrix}",
         r"\begin{pmatrix} \frac35 & -\frac45 \\ \frac45 & \frac35 \end{pmatrix}", T),
        (r"\begin{pmatrix} 0.14 \\ 0.29 \end{pmatrix}", r"\begin{pmatrix} 1/7 \\ 2/7 \end{pmatrix}", T),
        (r"\begin{pmatrix} 0.14 \\ 0.29 \end{pmatrix}", r"\begin{pmatrix} 1/7 \\ 3/7 \end{pmatrix}", F),
        (r"(3, \infty)", r"\{x \mid x > 3\}", T),
    ],
}

# Written after round 3's fixes to BATCH1, and measured before the code was touched again.
ROUND3_BATCH2 = {
    "several": [
        ("0, 1", r"The fixed points are $x=\boxed{0}$ and $x=\boxed{1}$.", T),
        ("(1, -1), (-1, 1)", r"\boxed{(x,y)=(1,-1)} \text{ and } \boxed{(x,y)=(-1,1)}", T),
        ("-3, 3", r"\boxed{x=3} \quad \boxed{x=-3}", T),
        ("-3, 3", r"\boxed{x = 3}", F),
        ("2, 5", r"We get $x = 2$ (rejected, since $x > 3$) and $x = \boxed{5}$.", F),
        ("m = 1, n = 4", r"\boxed{m=1,\ n=4}", T),
        ("1, 4, 9", "The perfect squares are:\n1. $\\boxed{1}$\n2. $\\boxed{4}$\n3. $\\boxed{9}$", T),
        ("p = 2, q = 3; p = 3, q = 2", r"\boxed{(p, q) \in \{(2, 3), (3, 2)\}}", T),
    ],
    "prose": [
        ("48", "Entonces, el perímetro mide 48 cm.", T),
        ("48", "Entonces, el perímetro mide 49 cm.", F),
        ("15", "Alors, Marie a 15 ans.", T),
        ("300", "Следовательно, он проехал 300 км.", T),
        ("9", "所以，一共有 9 种不同的方法。", T),
        ("4", "したがって、答えは 4 です。", T),
        ("12", "Jadi, Budi memiliki 12 kelereng.", T),
        ("3", "Quindi ci sono 3 soluzioni, non 4.", T),
        ("4", "Quindi ci sono 3 soluzioni, non 4.", F),
        ("60", "إذن السرعة تساوي 60 كم/ساعة.", T),
    ],
    "letters": [
        ("A", "Only option A satisfies both conditions.", T),
        ("A", "Option B fails the first condition, so the answer must be A.", T),
        ("B", "Option B fails the first condition, so the answer must be A.", F),
        ("E", "**Answer: (E)**", T),
        ("C", "La opción correcta es la (C), porque (A) y (B) son falsas.", T),
        ("D Paris", "Paris", T),
        ("D Paris", "Lyon", F),
        ("B", "Ни A, ни C не подходят, значит ответ B.", T),
    ],
    "number_forms": [
        ("2500", "The car costs €2.500.", T),
        ("0.5", "The probability is 0,5.", T),
        ("75", "He scored 75 % on the test.", T),
        ("1200000", "The city has 1,200,000 inhabitants.", T),
        ("1200000", "The city has 1.2 million inhabitants.", T),
        ("19.99", "Each ticket costs $19.99.", T),
        ("1999", "Each ticket costs $19.99.", F),
        ("8.5", "La distancia es de 8,5 km.", T),
    ],
    "debris": [
        ("42", "Therefore, the answer is 42.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 6 times 9?", T),
        ("54", "Therefore, the answer is 42.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 6 times 9?", F),
        ("11", "Counting them gives 11 triangles.\n\nI hope it is correct.<|im_end|>\n<|endoftext|>", T),
        ("8", "So Tom has 8 cards left. Hope this helps!<|im_end|>", T),
        ("3", "The smallest prime factor is 3.<end_of_turn>\n<start_of_turn>user\nAnd the largest?", T),
        ("7", "Adding gives 3 + 4 = 7.</s>", T),
        ("4", "Adding gives 3 + 4 = 7.</s>", F),
    ],
    "escaped_latex": [
        (r"\frac{4}{9}", r"$\\boxed{\\dfrac{4}{9}}$", T),
        (r"\sqrt{5}", r"\\(\\boxed{\\sqrt5}\\)", T),
        (r"\frac{1}{8}", r"\boxed{\tfrac18}", T),
        (r"\frac{1}{8}", r"\boxed{\tfrac81}", F),
        (r"3\sqrt{3}", r"\boxed{3\!\cdot\!\sqrt{3}}", T),
        (r"2\pi", r"\\boxed{2\\pi}", T),
        (r"\frac{\pi}{4}", r"\boxed{\frac\pi4}", T),
        ("1000000", r"\boxed{1\,000\,000}", T),
    ],
    "sets": [
        (r"(-\infty, 2) \cup (6, \infty)", r"\boxed{|x-4|>2}", T),
        ("[-5, 5]", r"\boxed{|t| \leq 5}", T),
        ("(-5, 5)", r"\boxed{|t| \leq 5}", F),
        (r"(-4, -2) \cup (2, 4)", r"\boxed{2<|x|<4}", T),
        ("[1, 3]", r"\{x : 1 \le x \le 3\}", T),
        (r"\begin{pmatrix} 0.25 & 0.75 \end{pmatrix}", r"\begin{pmatrix} \tfrac14 & \tfrac34 \end{pmatrix}", T),
        (r"\begin{pmatrix} 0.43 \\ 0.57 \end{pmatrix}", r"\begin{pmatrix} 3/7 \\ 4/7 \end{pmatrix}", T),
        (r"\begin{pmatrix} 0.43 \\ 0.57 \end{pmatrix}", r"\begin{pmatrix} 3/7 \\ 5/7 \end{pmatrix}", F),
        (r"x \in (-\infty, -3] \cup [3, \infty)", r"|x| \ge 3", T),
    ],
}

# Rows of the two batches this grader still misjudges (not asserted; every other row is). BATCH1 has
# none left; these are BATCH2's misses as measured, before the code was touched again. Re-scored under
# the rules with math-verify's second opinion (reward.verify): the same eight. math-verify alone reads
# the first three right, but a sentence is the rules' veto: it picks "96" out of "答案不是 96，而是100。"
# as readily.
ROUND3_MISSES = [
    ("15", "Alors, Marie a 15 ans."),                      # not read as prose: no two words of 2+ letters
    ("9", "所以，一共有 9 种不同的方法。"),                   # the counted noun phrase is 6 characters long
    ("60", "إذن السرعة تساوي 60 كم/ساعة."),               # a unit with a slash is not one word
    ("A", "Only option A satisfies both conditions."),    # the option is stated mid-sentence, no verb before it
    ("C", "La opción correcta es la (C), porque (A) y (B) son falsas."),  # "porque" explains, as "since" does
    ("B", "Ни A, ни C не подходят, значит ответ B."),     # "ни ... ни" rules A and C out
    ("2500", "The car costs €2.500."),                    # a dot for thousands: 2.5 against a number with none
    ("1200000", "The city has 1.2 million inhabitants."),  # a scale word
]

# ----------------------------------------------------------------------------- the second opinion
# The rules, then math-verify where they could not read an answer (reward.verify). Its first batch was
# bench/prose_pairs.py's 112,189 wrong answers, run before the rules' veto (609 accepted that the rules
# rejected; none after it). This second batch was written after the veto and the gate, and scored
# before the code was touched again: answers with a function the rules do not read (so math-verify is
# asked), right and wrong, alone and inside a tuple, a set, a power.
SECOND_OPINION_BATCH2 = {
    "unread": [
        ("5", r"\max(2, 5)", T),
        ("2", r"\min(2, 5)", T),
        ("5", r"\max(2, 4)", F),
        ("3", r"\operatorname{lcm}(1, 3)", T),
        ("7", r"\mathrm{gcd}(14, 21)", T),
        ("4", r"\gcd(12, 18)", F),
        ("2", r"\operatorname{gcd}(4, 6)", T),
        ("10", r"\sum_{i=1}^{4} i", T),
        ("6", r"\sum_{i=1}^{3} i^2", F),
        ("x + 1", r"\max(x, 1)", F),
        ("5", r"\max(5, x)", F),
        ("2", r"\log_{2} \operatorname{lcm}(2, 4)", T),
        ("8", r"2^{\gcd(6, 9)}", T),
    ],
    "structures": [
        ("(1, 2)", r"\left(\gcd(2, 4) - 1, 2\right)", T),
        ("(1, 2)", r"\left(\gcd(2, 4), 1\right)", F),
        (r"\{1, 2\}", r"\{\max(1, 0), 2\}", T),
        (r"\{1, 2\}", r"\{\max(1, 3), 2\}", F),
        (r"\begin{pmatrix} 2 \\ 3 \end{pmatrix}", r"\begin{pmatrix} \gcd(4, 6) \\ 3 \end{pmatrix}", T),
    ],
}

# Its misses as scored (not asserted; every other row is), before the code was touched again.
SECOND_OPINION_MISSES = [
    ("7", r"\mathrm{gcd}(14, 21)"),                        # math-verify does not read \mathrm{gcd} either
    ("10", r"\sum_{i=1}^{4} i"),                           # mathexpr parses \sum (wrongly), so math-verify is not asked
    ("(1, 2)", r"\left(\gcd(2, 4) - 1, 2\right)"),         # math-verify says no as well
]

# ----------------------------------------------------------------------------- several answers (issue 56)
# Written while fixing issue 56, in the shapes it describes (so this is no held-out figure: that one is
# measured outside the project, on pairs not copied here). Several answers are one collection: unordered
# and without duplicates unless the gold is a tuple, an interval or repeats an item; each item by the
# rules of one answer; a different number of distinct answers is wrong.
COLLECTIONS = {
    # a gold joined by "and", commas or in several boxes, against one boxed list in another order
    "joined": [
        ("$2$ and $5$", r"The solutions are $\boxed{5, 2}$.", T),
        ("$x = -1$ and $x = 4$", r"\boxed{4, -1}", T),
        (r"\boxed{\frac{1}{2}} \text{ and } \boxed{3}", r"\boxed{3, 0.5}", T),
        (r"$\boxed{-3}$, $\boxed{0}$, $\boxed{3}$", r"\boxed{3, -3, 0}", T),
        ("The roots are $1$ and $6$.", r"\boxed{6, 1}", T),
        ("$2$ and $5$", r"\boxed{5}", F),
        ("$2$ and $5$", r"\boxed{2, 5, 8}", F),
        ("The roots are $1$ and $6$.", r"\boxed{1}", F),
        ("3", "The answer is $3$ and $5$.", F),
        ("3", "The answer is $3$, and $x = 5$ is excluded.", T),
    ],
    # sets of tuples: another order, a solution repeated; a tuple changed or missing
    "tuples": [
        ("(1, 2, 3, 4), (2, 1, 3, 4)", r"\boxed{(2, 1, 3, 4), (1, 2, 3, 4), (2, 1, 3, 4)}", T),
        ("(a, b, c, d) = (1, 2, 3, 4), (2, 1, 3, 4)", r"\boxed{(2,1,3,4), (1,2,3,4), (1,2,3,4)}", T),
        (r"(0, 0), (1, 1), (-1, 1)", r"\boxed{(-1, 1), (0, 0), (1, 1), (-1, 1)}", T),
        ("(1, 2, 3, 4), (2, 1, 3, 4)", r"\boxed{(2, 1, 3, 4), (2, 1, 3, 4)}", F),
        ("(1, 2, 3, 4), (2, 1, 3, 4)", r"\boxed{(2, 1, 3, 4), (1, 2, 3, 4), (2, 1, 4, 3)}", F),
        ("(1, 2, 3, 4), (2, 1, 3, 4)", r"\boxed{(2, 1, 3, 4)}", F),
        ("(1, 2), (2, 1)", r"\boxed{(1, 2), (2, 1), (1, 2), (3, 3)}", F),
        ("1, 2", r"\boxed{1, 2, 2}", T),
        ("2, 2, 3", r"\boxed{2, 3}", F),  # a gold that repeats an item counts it (side lengths)
        ("2, 2, 3", r"\boxed{3, 2, 2}", T),
    ],
    # one box per part, or per indexed name, against a gold that lists them
    "parts": [
        ("3, 7", r"The answer is $\boxed{3}$ for part (a) and $\boxed{7}$ for part (b).", T),
        ("3, 7", r"For part (a) we get $\boxed{3}$; for part (b), similarly, $\boxed{7}$.", T),
        ("3, 7", r"For part (a) we get $\boxed{3}$; for part (b), after more work, $\boxed{7}$.", F),  # words
        # beside the labels that are no list's joint: apart (a join they would allow would allow a withdrawal)
        ("3, 7", r"(a) $\boxed{3}$; (b) $\boxed{7}$", T),
        ("3, 7", r"The answer is $\boxed{3}$ for part (a) and $\boxed{8}$ for part (b).", F),
        ("3", r"The answer is $\boxed{3}$ for part (a) and $\boxed{7}$ for part (b).", F),
        # against one answer, the last box (the parts join only against a gold of several answers)
        ("7", r"The answer is $\boxed{3}$ for part (a) and $\boxed{7}$ for part (b).", T),
        ("y_1 = (x + 1)^2, y_2 = x^2 - 1",
         r"The first is $\boxed{y_1 = x^2 + 2x + 1}$, and the second is $\boxed{y_2 = (x - 1)(x + 1)}$.", T),
        (r"y_1 = e^{2x} \text{ and } y_2 = x e^{2x}", "So\n\\[\\boxed{y_2 = xe^{2x}}\\]\nand also\n\\[\\boxed{y_1 = e^{2x}}\\]", T),
        ("y_1 = (x + 1)^2, y_2 = x^2 - 1",
         r"The first is $\boxed{y_1 = x^2 + 2x + 1}$, and the second is $\boxed{y_2 = x^2 + 1}$.", F),
        ("y_1 = (x + 1)^2, y_2 = x^2 - 1", r"The first is $\boxed{y_1 = x^2 + 2x + 1}$.", F),
        ("y = 2", r"We find $\boxed{x = 3}$, and then $\boxed{y = 2}$.", T),  # two names, no index: the last box
    ],
    # "The final answer is $...$" after a box; thousands separators decided by the gold
    "stated": [
        ("10455", "So the first count is $\\boxed{10455}$.\n\nThe final answer is $10,455$", T),
        ("10455", "We found $\\boxed{455}$ pairs.\n\nThe final answer is $10,455$. I hope it is correct.", T),
        ("455", "We found $\\boxed{455}$ pairs.\n\nThe final answer is $10,455$. I hope it is correct.", F),
        ("10455", "We found $\\boxed{10455}$.\n\nThe final answer is $10,456$", F),
        ("10455", r"\boxed{10, 455}", F),
        ("10, 455", r"\boxed{10,455}", T),
        ("10, 455", r"\boxed{10455}", F),
        ("12", "\\boxed{12}\n\nI checked that the final answer is reasonable.", T),
    ],
    # ordered golds are never reordered: intervals, points, tuples; a point is no pair of answers
    "ordered": [
        ("[1, 2]", r"\boxed{[2, 1]}", F),
        ("[1, 2]", r"\boxed{2}, \boxed{1}", F),
        ("(1, 2)", r"\boxed{2, 1}", F),
        ("(3, 4)", r"\boxed{(4, 3)}", F),
        ("(1, 2)", r"\boxed{(1, 2)}, \boxed{(2, 1)}", F),
        ("(1, 2)", r"\boxed{(1, 2), (1, 2)}", F),
        ("1, 2", r"\boxed{(1, 2, 2)}", F),
        ("(1, 2)", r"\boxed{(1, 2)}", T),
        ("[1, 2]", r"\boxed{1 \le x \le 2}", T),
        (r"(-\infty, 1) \cup (3, \infty)", r"\boxed{(3, \infty) \cup (-\infty, 1)}", T),
    ],
    # a superset, a subset, one right and one wrong: wrong
    "counts": [
        ("2, 5", r"$\boxed{2}$, $\boxed{5}$, $\boxed{7}$", F),
        ("2, 5", r"$\boxed{2}$", F),
        ("2", r"$\boxed{2}$ and $\boxed{5}$", F),
        ("2, 5", r"$\boxed{2, 6}$", F),
        ("2 and 5", r"$\boxed{5}$ and $\boxed{6}$", F),
        (r"\{1, 3\}", r"\boxed{1, 2, 3}", F),
        (r"\{1, 3\}", r"\boxed{1, 3, 3}", T),
        ("2, 5", r"$\boxed{5}$ and $\boxed{2}$", T),
        ("2, 5", r"$\boxed{5}$ and $\boxed{2}$ and $\boxed{5}$", T),
        ("2, 5", r"$\boxed{5}$ and $\boxed{2}$ and $\boxed{2.5}$", F),
        ("1, 2", r"\boxed{x = 1, y = 2, z = 1}", F),  # assignments to three names: three answers, not 1 and 2
        ("1, 2", r"\boxed{x = 1, x = 2}", T),
    ],
    # the review of issue 56's fix: against a gold of one answer, a part or an index named in the text
    # joins no boxes (the last box is the answer); the earlier box alone is wrong
    "single": [
        ("10", r"$\lfloor x \rfloor = \boxed{3}$, the integer part 3 of $x$. Then $x^2 = \boxed{10}$.", T),
        ("18", r"So $AB = \boxed{6}$. In part 2 of the solution we double it: $\boxed{18}$", T),
        ("5", r"The real part is $\boxed{3}$; the imaginary part 4 then gives $|z| = \boxed{5}$.", T),
        ("4", r"We get $f(a) = \boxed{2}$ and then $f(b) = (b)^2$ so the answer is $\boxed{4}$", T),
        ("7", r"$a_1 = \boxed{3}$, and so $a_2 = \boxed{7}$.", T),
        ("3", r"$\lfloor x \rfloor = \boxed{3}$, the integer part 3 of $x$. Then $x^2 = \boxed{10}$.", F),
        ("3", r"$a_1 = \boxed{3}$, and so $a_2 = \boxed{7}$.", F),
        ("3, 7", r"$a_1 = \boxed{3}$, and so $a_2 = \boxed{7}$.", T),  # against a list: one per index
    ],
    # against a list gold, a box the response withdraws between two boxes is not joined
    "withdrawn": [
        ("2, 5", r"So $x = \boxed{2}$ is a candidate, but checking case (i) it fails. Case (ii) gives $\boxed{5}$.", F),
        ("4, 6", r"$\boxed{4}$ would be option (a), which is wrong; the correct value is $\boxed{6}$.", F),
        ("2, 5", r"Thus $x_1 = \boxed{2}$ is extraneous, leaving $x_2 = \boxed{5}$.", F),
        ("3, 4", r"$y_1 = \boxed{3}$ is wrong, since $y$ must be even; $y_2 = \boxed{4}$", F),
        ("3, 7", r"$\boxed{3}$ for part (a) and $\boxed{7}$ for part (b)", T),
        ("3 and 7", r"$\boxed{3}$ for part (a) and $\boxed{7}$ for part (b)", T),
        ("3, 7", "(a) $\\boxed{3}$ (b) $\\boxed{7}$", T),
        ("y_1 = x^2 + 2x + 1, y_2 = x - 1", r"First $y_1 = \boxed{(x+1)^2}$, and then $y_2 = \boxed{x - 1}$.", T),
    ],
    # "The final answer is $...$" after the last box replaces it only when it states a plain number
    "closing": [
        ("12", "She pays $\\boxed{\\$12}$.\nFinal Answer: The final answer is $\\$12$. I hope it is correct.", T),
        ("5", "Thus $\\boxed{5}$.\nThe final answer is $x$, where $x = 5$.", T),
        ("10455", "We found $\\boxed{455}$ pairs.\n\nThe final answer is $-10,455.5$", F),
        ("-10455.5", "We found $\\boxed{455}$ pairs.\n\nThe final answer is $-10,455.5$", T),
        ("x", "Thus $\\boxed{5}$.\nThe final answer is $x$, where $x = 5$.", F),
    ],
    # a thousands separator is a list's comma only against a bare list or set, not a tuple or interval
    "separators": [
        ("(1, 500)", r"\boxed{1,500}", F),
        ("[1, 500]", r"\boxed{1,500}", F),
        ("1500", r"\boxed{1,500}", T),
        (r"\{1, 500\}", r"\boxed{1,500}", T),
    ],
    # a list of math spans is read in the last sentence only (as the last math span is)
    "spans": [
        ("2, 3", "$2$ and $3$.\nWe test both: only $x=3$ satisfies the original equation, so we keep $x = 3$.", F),
        ("3", "$2$ and $3$.\nWe test both: only $x=3$ satisfies the original equation, so we keep $x = 3$.", T),
        ("2, 3", "We test $x = 1$; it fails.\n$x = 2$ and $x = 3$.", T),
    ],
}
