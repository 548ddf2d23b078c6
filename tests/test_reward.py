"""Tests of reward.py: a table of known-equal and known-different answer pairs (the kinds that the
test suites of math-verify, Qwen2.5-Math's grader, DeepScaleR, lm-eval's minerva grader, PRM800K's
grader and simple-evals check), extraction, the reward, robustness (a fuzz of hostile inputs) and
self-consistency on the benchmark files in ../shared/data when they are present.

Expected values are written by hand from the mathematics, never copied from the code's output.
"""
import faulthandler
import json
import os
import random
import re
import sys
import threading
import time

import pytest

import reward
import second_opinion
from grader_cases import (CLASSES, KNOWN_MISSES, ROUND2_BATCH1, ROUND2_BATCH2, ROUND2_MISSES, ROUND3_BATCH1,
                          ROUND3_BATCH2, ROUND3_MISSES, SECOND_OPINION_BATCH2, SECOND_OPINION_MISSES)
from reward import extract_answer, math_reward, verify

T, F = True, False

# (gold, pred, same answer?)
PAIRS = [
    # --- integers, decimals, thousands separators, signs
    ("18", "18", T), ("18", "18.0", T), ("18", "18.00", T), ("0.5", ".5", T), ("-3", "- 3", T),
    ("3", "+3", T), ("+2", "2", T), ("1000000", "1,000,000", T), ("1000", "1{,}000", T),
    ("1000000", "10^6", T), ("100", "1e2", T), ("25", "025", T), ("27", "27.0", T),
    ("10080", "10,\\!080", T), ("11,\\! 111,\\! 111,\\! 100", "11111111100", T),
    ("58,500", "58500", T), ("2125", "2,125", T), ("0.10", "0.1", T), ("56.0", "56", T),
    ("3.5", "3{,}5", T), ("12", "13", F), ("3", "3.5", F), ("1", "-1", F), ("0", "0.0", T),
    ("0", "0.0001", F), ("100", "1000", F), ("1000", "1,001", F), ("5", "50", F),
    (".0000672", "6.72 \\times 10^{-5}", T), (".35625", "0.35625", T), ("326.5", "326.50", T),
    ("7", "7.5", F), ("2", "2.", T), ("-0.875", "-\\frac{7}{8}", T),
    ("4813.24", "4813.25", F), ("\\$4813.24", "4813.24", T), ("0.35625", "0.35626", F),
    ("3.14159", "3.1416", T),
    ("2.7778e-6", "2.7779e-6", F), ("1.6", "1.7", F), ("0.5", "0.50", T),
    # --- fractions, mixed numbers
    ("\\frac{1}{2}", "1/2", T), ("\\frac12", "\\frac{1}{2}", T), ("\\dfrac{3}{4}", "\\tfrac34", T),
    ("\\frac{1}{2}", "\\frac{2}{4}", T), ("\\frac{1}{2}", "2", F), ("1/2", "2", F),
    ("1\\frac{4}{5}", "\\frac{9}{5}", T), ("1\\frac{4}{5}", "1.8", T), ("137 \\frac{1}{2}", "137.5", T),
    ("137 \\frac{1}{2}", "\\frac{275}{2}", T), ("-\\frac{1}{2}", "\\frac{-1}{2}", T),
    ("-\\frac{1}{2}", "-0.5", T), ("\\frac{1}{3}", "0.333", F), ("\\frac{1}{3}", "0.33333", T),
    ("\\frac{3}{2}", "1.5", T), ("\\frac{3}{2}", "3/2", T), ("\\frac{3}{2}", "\\frac{2}{3}", F),
    ("\\frac43", "\\frac{4}{3}", T), ("\\frac 59", "5/9", T), ("\\frac9{19}", "\\frac{9}{19}", T),
    ("\\frac{270}7", "\\frac{270}{7}", T), ("\\frac{1}{2}", "0.5", T), ("\\frac{1}{2}", "0.51", F),
    ("\\dfrac{33}{100}", "0.33", T), ("\\frac{14}{3}", "4\\frac{2}{3}", T), ("\\frac{14}{3}", "4.67", F),
    ("\\frac{1}{8}", "\\frac{1}{6}", F), ("-\\frac{3}{8}", "\\frac{3}{8}", F),
    ("\\frac{3840}{289}", "3840/289", T), ("\\frac{1}{2}", "\\frac{1}{2}.", T),
    ("\\frac{-1}{1997}", "-\\frac{1}{1997}", T), ("\\frac{1}{4}", "0.25", T), ("\\frac{1}{4}", "1/4.", T),
    # --- percentages (as the gold suggests)
    ("50\\%", "50", T), ("50\\%", "0.5", T), ("50", "50\\%", T), ("0.5", "50\\%", T),
    ("50\\%", "5", F), ("62.5%", "62.5", T), ("17.5%", "0.175", T), ("10\\%", "20\\%", F),
    ("50", "0.5", F), ("8 \\%", "8", T), ("25\\%", "25 percent", T), ("25\\%", "\\frac{1}{4}", T),
    # --- scientific notation
    ("3.83e35", "3.83 \\times 10^{35}", T), ("3.83e35", "3.83\\cdot10^{35}", T),
    ("4.5e33", "4.5 \\times 10^{33}", T), ("1e-5", "10^{-5}", T), ("1e-5", "0.00001", T),
    ("3.83e35", "3.8e35", F), ("2.7778e-6", "2.7778 \\times 10^{-6}", T), ("6e13", "6 \\times 10^{13}", T),
    ("7e37", "7\\times10^{36}", F), ("1.4903e4", "14903", T), ("3.61e2", "361", T),
    ("5.47e5", "5.47E5", T), ("8.7e8", "870,000,000", T), ("1e11", "10^{11}", T),
    ("4.4e7", "4.4 \\times 10^7", T), ("6.5e-2", "0.065", T), ("2.88e16", "2.89e16", F),
    # --- radicals, pi, e, infinity
    ("2\\sqrt{2}", "\\sqrt{8}", T), ("\\frac{\\sqrt{3}}{3}", "\\frac{1}{\\sqrt{3}}", T),
    ("3\\sqrt{13}", "\\sqrt{117}", T), ("\\sqrt{2}", "1.414", F), ("\\sqrt{2}", "1.41421", T),
    ("11\\sqrt2", "11\\sqrt{2}", T), ("\\pi", "3.14", F), ("\\pi", "3.14159", T), ("288\\pi", "288 \\pi", T),
    ("2\\pi", "\\pi", F), ("\\frac{\\pi}{2}", "\\pi/2", T), ("e", "\\exp(1)", T), ("e^2", "\\exp(2)", T),
    ("\\infty", "\\infty", T), ("\\infty", "-\\infty", F), ("\\sqrt[3]{8}", "2", T),
    ("\\sqrt[3]{-8}", "-2", T),
    ("5 \\sqrt[3]{4}", "5 \\cdot 4^{1/3}", T), ("\\frac{8}{\\sqrt[3]{7}}", "8 \\cdot 7^{-1/3}", T),
    ("\\sqrt{2}+\\sqrt{3}", "\\sqrt{5+2\\sqrt{6}}", T), ("1+\\sqrt{2}", "1-\\sqrt{2}", F),
    ("\\sqrt{2}", "-\\sqrt{2}", F), ("2 \\sqrt{5}", "2\\sqrt{5}", T), ("\\sqrt{53}", "\\sqrt53", F),
    ("3\\sqrt{5}", "\\sqrt53", T),
    ("2\\sqrt{2}", "2\\sqrt{3}", F), ("\\frac{20000}{\\pi}", "20000/\\pi", T), ("18+2\\pi", "2\\pi+18", T),
    ("18+2\\pi", "18+\\pi", F), ("\\frac{3\\sqrt{3}}{4}", "\\frac{3}{4}\\sqrt{3}", T),
    ("4 \\pi^{2}-1", "4\\pi^2 - 1", T), ("\\frac{9 \\sqrt{3}}{20}", "0.7794", T),
    ("\\frac{9 \\sqrt{3}}{20}", "0.78", F), ("7\\pi", "21.9", F), ("7\\pi", "21.991", T),
    ("e^{i\\pi}", "-1", T),
    ("\\sqrt{-4}", "2i", T), ("\\frac{189 \\sqrt{11}}{11}", "\\frac{189}{\\sqrt{11}}", T),
    ("\\sqrt{2}-1", "\\frac{1}{\\sqrt{2}+1}", T), ("2-\\sqrt{3}", "\\frac{1}{2+\\sqrt{3}}", T),
    ("2-\\sqrt{3}", "\\frac{1}{2-\\sqrt{3}}", F), ("\\sqrt{4}", "2", T), ("\\sqrt{4}", "-2", F),
    # --- trig and logs
    ("\\frac{\\sqrt{3}}{2}", "\\cos\\frac{\\pi}{6}", T), ("1", "\\sin^2 x + \\cos^2 x", T),
    ("\\cot x", "\\frac{\\cos x}{\\sin x}", T), ("\\cot x", "\\tan x", F), ("\\log_2 8", "3", T),
    ("\\log_{2} 8", "\\log_2{8}", T), ("\\ln 2 + i\\pi / 3", "\\ln(2) + \\frac{i\\pi}{3}", T),
    ("\\frac{\\log 2}{\\log 2-\\log 3}", "\\frac{\\ln 2}{\\ln(2/3)}", T),
    ("np.arcsin(10/13)", "\\sin^{-1}\\left(\\frac{10}{13}\\right)", T),
    ("np.arcsin(10/13)", "\\arcsin(10/13)", T), ("np.arcsin(10/13)", "\\arccos(10/13)", F),
    ("\\log 8", "3\\log 2", T), ("\\tan\\frac{\\pi}{4}", "1", T), ("\\sin x", "\\cos x", F),
    ("2,-\\log _{10} 250", "2, -\\log_{10}(250)", T), ("\\sin(2x)", "2\\sin x\\cos x", T),
    ("\\frac{\\pi}{6}", "30^\\circ", T), ("30^\\circ", "\\frac{\\pi}{6}", T),
    ("\\frac{\\pi}{6}", "60^\\circ", F),
    ("e^{t} / 3", "\\frac{e^t}{3}", T), ("e^{t} / 3", "\\frac{e^{-t}}{3}", F),
    # --- implicit multiplication, polynomials, expressions with symbols
    ("2x", "2*x", T), ("2x", "x \\cdot 2", T), ("3\\sqrt{2}", "3 \\sqrt 2", T), ("xy", "yx", T),
    ("2x+1", "1+2x", T), ("x^2", "2x", F), ("2(x+1)", "2x+2", T), ("(a+5)(b+2)", "(b+2)(a+5)", T),
    ("(a+5)(b+2)", "ab+2a+5b+10", T), ("(a+5)(b+2)", "ab+2a+5b+11", F), ("6r^2-4r-24", "2(3r^2-2r-12)", T),
    ("\\frac{11+9a}{20}", "\\frac{9a+11}{20}", T), ("p - q", "-q + p", T), ("p - q", "q - p", F),
    ("2k+2", "2(k+1)", T), ("x^3+3x-6", "x^3+3x+6", F), ("n", "n+1", F), ("2n", "n^2", F),
    ("\\frac{n(n+1)}{2}", "\\frac{n^2+n}{2}", T), ("\\binom{2n}{n}", "\\frac{(2n)!}{(n!)^2}", T),
    ("\\binom{2n}{n}", "\\binom{2n}{n+1}", F), ("x^5 - x^4 + x^3 - x^2 + x - 1", "(x-1)(x^4+x^2+1)", T),
    ("x^8 + x^7 + x^6 + x^5 + x^4 + x^3 + x^2 + x + 1", "\\frac{x^9-1}{x-1}", T),
    ("-13x+3", "3-13x", T), ("15x - 80", "5(3x-16)", T), ("5r^5", "5 r^{5}", T), ("3R^2", "3r^2", F),
    ("8n^2 + 4n + 1", "8n^2+4n+1", T), ("\\frac{1}{2 n+2}", "\\frac{1}{2(n+1)}", T),
    ("(n-2) 2^{n}+1", "n2^n - 2^{n+1} + 1", T), ("2^{k-n}", "\\frac{2^k}{2^n}", T),
    ("2^{k-n}", "2^{n-k}", F), ("n(n-1)", "n^2-n", T), ("\\frac{a b}{2}", "ab/2", T),
    ("k\\left(4 k^{2}+k-1\\right) / 2", "\\frac{4k^3+k^2-k}{2}", T), ("\\frac{n}{2}", "n/2", T),
    ("\\frac{1-p^{2}}{3}", "\\frac{(1-p)(1+p)}{3}", T),
    ("m n-\\lfloor m / 2\\rfloor", "mn - \\lfloor \\frac{m}{2} \\rfloor", T),
    ("\\lceil n / 2\\rceil+1", "\\left\\lceil \\frac{n}{2} \\right\\rceil + 1", T),
    ("\\lfloor\\log _{2} n\\rfloor+1", "\\lfloor \\log_2 n \\rfloor + 1", T),
    ("\\lfloor\\sqrt{n-1}\\rfloor", "\\lceil\\sqrt{n-1}\\rceil", F), ("|x|", "\\left|x\\right|", T),
    ("|x-1|", "|1-x|", T), ("|x-1|", "x-1", F),
    ("\\frac{d !}{2 k(d-k) !}", "\\frac{d!}{2k \\cdot (d-k)!}", T),
    # --- equations and assignments
    ("x=5", "5", T), ("5", "x = 5", T), ("x=5", "x=6", F), ("y = 2x + 3", "2x+3", T),
    ("y = 2x+3", "y=3+2x", T), ("y = -2x", "y=-2x", T), ("y = 2x + 1", "2x + 1", T),
    ("5x - 7y + 11z + 4 = 0", "-5x + 7y - 11z - 4 = 0", T),
    ("5x - 7y + 11z + 4 = 0", "10x - 14y + 22z + 8 = 0", T),
    ("5x - 7y + 11z + 4 = 0", "5x - 7y + 11z - 4 = 0", F), ("k=1", "1", T), ("f(x)=2 x", "2x", T),
    ("x=2", "y=2", F), ("x = 2, y = 3", "y = 3, x = 2", T), ("x = 2, y = 3", "x = 3, y = 2", F),
    ("f(n)=n", "n", T), ("f(x)=\\frac{1}{x}", "\\frac{1}{x}", T), ("M=2^{N-2}+1", "2^{N-2}+1", T),
    ("m_{\\max }=n^{2}-n-1", "n^2-n-1", T), ("y = 2x + 3", "y = 2x + 4", F), ("x=5", "x = 5", T),
    ("\\frac{d x}{d t}=k x-a", "\\frac{dx}{dt} = kx - a", T), ("2x = 6", "3", F),
    ("d=\\frac{1+\\sqrt{1+8 n}}{2}", "\\frac{1+\\sqrt{8n+1}}{2}", T),
    ("a=2, a=-6-4 \\sqrt{2}", "2, -6-4\\sqrt{2}", T),
    ("f(x)=x+22", "f(x) = x + 22", T), ("g(x)=x^2-2x+2", "(x-1)^2+1", T), ("n=k+4", "k+4", T),
    # --- tuples, points, intervals (ordered; brackets matter)
    ("(1,2)", "(1, 2)", T), ("(1,2)", "(2,1)", F), ("(1,2)", "\\left(1,2\\right)", T), ("[0,1)", "[0,1]", F),
    ("[0,1)", "[0, 1)", T), ("(3,4]", "(3, 4]", T), ("(-\\infty, 0]", "(-\\infty,0]", T),
    ("(2,\\infty)", "(2, \\infty)", T), ("(2,\\infty)", "x > 2", T), ("(3,4]", "3 < x \\le 4", T),
    ("(3,4]", "3 < x < 4", F), ("[2, \\infty)", "x \\geq 2", T), ("(-\\infty, 5)", "x<5", T),
    ("(-\\infty, 2) \\cup (3, \\infty)", "(3, \\infty) \\cup (-\\infty, 2)", T),
    ("(-\\infty, 2) \\cup (3, \\infty)", "(-\\infty, 2] \\cup (3, \\infty)", F),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)", T),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi)", F),
    ("(6,31,-1)", "(6, 31, -1)", T), ("(6,31,-1)", "(6,-1,31)", F), ("(1,2)", "1, 2", F),
    ("x \\in [-2,7]", "[-2,7]", T), ("x \\in [-2,7]", "[-2,7)", F), ("[\\frac{1}{2}, 8]", "[0.5, 8]", T),
    ("(2,4)", "(2,4]", F), ("\\left(\\frac{3}{5},\\frac{8}{3}\\right]", "(0.6, 8/3]", T),
    ("(0,9) \\cup (9,36)", "(0,9)\\cup(9,36)", T), ("(0,9) \\cup (9,36)", "(0,36)", F),
    ("(-\\sqrt{3}, \\sqrt{3})", "\\left(-\\sqrt3,\\sqrt3\\right)", T), ("(15,-29)", "(15, -29)", T),
    ("(15,-29)", "(-29, 15)", F), ("(1,-16,-4,43)", "(1, -16, -4, 43)", T), ("(1,2,3)", "(1,2)", F),
    ("\\left[ \\frac{\\pi^2}{8}, \\frac{5 \\pi^2}{4} \\right]", "[\\pi^2/8, 5\\pi^2/4]", T),
    ("(-\\infty, 0) \\cup\\{1\\}.", "(-\\infty,0)\\cup\\{1\\}", T),
    ("(-\\frac{1}{2}, \\frac{7}{2})", "(-0.5, 3.5)", T),
    ("(4, \\log _{10} 2)", "(4, \\log_{10} 2)", T),
    ("\\quad(2+\\sqrt{2}, 1+\\sqrt{2})", "(2+\\sqrt2, 1+\\sqrt2)", T),
    ("(2,251,252)", "(2, 251, 252)", T), ("(1,1006),(3,331),(11,31)", "(11,31),(3,331),(1,1006)", T),
    ("(1,1006),(3,331),(11,31)", "(1,1006),(3,331)", F), ("(3,2)", "(3, 2)", T), ("(3,2)", "3,2", F),
    # --- sets and lists of solutions (unordered)
    ("1,-2", "-2, 1", T), ("3, 5, 7", "7,5,3", T), ("3, 5, 7", "3, 5", F), ("\\{1,2\\}", "\\{2,1\\}", T),
    ("1,2", "\\{1, 2\\}", T), ("1 \\pm \\sqrt{19}", "1+\\sqrt{19}, 1-\\sqrt{19}", T),
    ("1 \\pm \\sqrt{19}", "1+\\sqrt{19}", F), ("3 \\pm 2 \\sqrt{2}", "3+2\\sqrt2,3-2\\sqrt2", T),
    ("\\{1\\pm\\sqrt{5},-2\\}", "-2, 1+\\sqrt5, 1-\\sqrt5", T),
    ("\\{1\\pm\\sqrt{5},-2\\}", "2, 1+\\sqrt5, 1-\\sqrt5", F),
    ("(1,8,19), (2,7,13), (4,5,7)", "(4,5,7), (1,8,19), (2,7,13)", T),
    ("(1,8,19), (2,7,13), (4,5,7)", "(8,1,19), (2,7,13), (4,5,7)", F), ("2, 3", "2 \\text{ and } 3", T),
    ("2, 3", "x = 2 \\text{ or } x = 3", T), ("2500,7500", "2500, 7500", T), ("2", "2, 3", F),
    ("2, 3", "2", F),
    ("-2,1", "1,-2", T), ("1,3,5", "1, 3, 5", T), ("1,3,5", "1, 3, 6", F), ("-1,0,1", "0, 1, -1", T),
    ("\\frac{32}{9},\\frac{1}{2}", "0.5, 32/9", T), ("-2,0,2", "-2, 2", F), ("1,2", "1,2,2", T),
    ("11,13", "13 and 11", T), ("90^{\\circ},60^{\\circ}", "60, 90", T),
    ("1,\\frac{3 + \\sqrt{21}}{2},\\frac{3 - \\sqrt{21}}{2}", "\\frac{3\\pm\\sqrt{21}}{2}, 1", T),
    ("10^{100},10^{1 / 100}", "10^{1/100}, 10^{100}", T), ("\\emptyset", "\\varnothing", T),
    ("\\{2, 3\\}", "\\{2, 4\\}", F), ("2,4,3", "2, 3, 4", T),
    # --- matrices and vectors
    ("\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}",
     "\\begin{pmatrix} -\\frac{1}{3} \\\\ \\frac{2}{3} \\\\ \\frac{5}{3} \\end{pmatrix}", T),
    ("\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}", "(-1/3, 2/3, 5/3)", T),
    ("\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}",
     "\\begin{pmatrix} -1/3 \\\\ 5/3 \\\\ 2/3 \\end{pmatrix}", F),
    ("\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}",
     "\\begin{bmatrix} -1 & 0 \\\\ 0 & -1 \\end{bmatrix}", T),
    ("\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}",
     "\\begin{pmatrix} -1 & 0 \\\\ 0 & 1 \\end{pmatrix}", F),
    ("\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}",
     "\\begin{pmatrix} -1 & 0 & 0 & -1 \\end{pmatrix}", F),
    ("\\begin{pmatrix} 1/5 \\\\ -18/5 \\end{pmatrix}", "\\begin{pmatrix}0.2\\\\-3.6\\end{pmatrix}", T),
    ("\\begin{pmatrix} -2 \\\\ -14 \\\\ -7 \\end{pmatrix}",
     "\\left(\\begin{array}{c}-2\\\\-14\\\\-7\\end{array}\\right)", T),
    ("\\begin{pmatrix} 16/49 \\\\ 48/49 \\\\ 24/49 \\end{pmatrix}", "\\frac{1}{49}(16, 48, 24)", F),
    # --- units and words that do not change the value
    ("5", "5 \\text{ cm}", T), ("864 \\mbox{ inches}^2", "864", T), ("15\\mbox{ cm}^2", "15", T),
    ("5.4 \\text{ cents}", "5.4", T), ("90^\\circ", "90", T), ("90^\\circ", "90^{\\circ}", T),
    ("90", "90°", T),
    ("\\frac{270}7\\text{ degrees}", "\\frac{270}{7}", T), ("\\text{Evelyn}", "Evelyn", T),
    ("\\text{east}", "East", T), ("\\text{east}", "west", F), ("\\$32,\\!348", "32348", T),
    ("\\$18.90", "18.9", T), ("\\$36", "36 dollars", T), ("1.6", "1.6 \\mathrm{~cm}", T),
    ("5", "5\\text{ m}", T), ("\\frac{37}{4} m", "\\frac{37}{4}m", T), ("30", "30 \\text{ minutes}", T),
    ("18", "18 eggs", T), ("5", "5\\,\\text{km}", T), ("45^{\\circ}", "45", T), ("18.8^{\\circ}", "18.8", T),
    ("\\text{ellipse}", "ellipse", T), ("\\text{ellipse}", "\\text{parabola}", F),
    ("2", "2 \\text{ units}", T),
    ("16 \\sqrt{3}", "16\\sqrt{3} \\text{ square units}", T), ("12\\pi", "12\\pi \\text{ cm}^3", T),
    ("\\text{even}", "\\text{odd}", F), ("120^\\circ", "120^\\circ.", T), ("76^\\circ", "67^\\circ", F),
    ("4.5e33", "4.5 \\times 10^{33} \\mathrm{ergs} \\mathrm{s}^{-1}", T), ("30", "30 m/s", T),
    ("9.8", "9.8 m/s^2", T),
    ("5", "5cm", T), ("864", "864 square inches", T), ("10\\pi", "10\\pi cm", T), ("3", "3 students", T),
    # ... but letters after a number are not always a unit
    ("2ab", "2", F), ("x^2 + 2 xy", "x^2+2", F), ("\\frac{1}{2} bh", "\\frac{1}{2}", F),
    ("\\frac{37}{4} m", "\\frac{37}{4}", F),
    ("2 \\pi r", "2\\pi", F), ("3 xyz", "3", F), ("x^2 + 2 abc", "x^2 + 2", F), ("n + 1 ways", "n + 1", F),
    # --- LaTeX noise
    ("3", "\\displaystyle 3", T), ("\\frac{1}{2}", "\\left(\\frac{1}{2}\\right)", T), ("3", "$3$", T),
    ("3", "3.", T), ("\\frac{1}{2}", "\\!\\frac{1}{2}", T), ("4", "\\,4\\,", T), ("3", "\\(3\\)", T),
    ("\\frac{1}{2}", "\\displaystyle\\dfrac{1}{2}", T), ("52_8", "52_{8}", T), ("52_8", "52", T),
    ("52_8", "42", F), ("4210_{5}", "4210_5", T), ("x^{2}", "x^2", T),
    ("\\left\\{ 1, 2 \\right\\}", "\\{1,2\\}", T),
    # --- multiple-choice letters when the gold is a letter
    ("\\text{(C)}", "C", T), ("C", "(C)", T), ("C", "\\textbf{(C)}", T), ("C", "(C) 12", T), ("C", "D", F),
    ("(B)", "B", T), ("\\text{(E)}", "\\text{(E)}\\ 9", T), ("A", "B", F), ("B", "(B) $\\frac{1}{2}$", T),
    ("A", "(A) and (B)", F), ("A", "A or B", F), ("C", "C: 12 cm", T), ("D", "\\textbf{(D)}\\ 4\\sqrt{2}", T),
    # --- complex numbers
    ("6 - 5i", "6-5i", T), ("6 - 5i", "6+5i", F), ("1+2i", "2i+1", T), ("-2 + 7i", "7i-2", T),
    ("1+\\sqrt{3} i", "1+i\\sqrt{3}", T), ("-8-8 \\sqrt{3} i", "-8(1+\\sqrt3 i)", T), ("3", "3i", F),
    ("1+274i", "1 + 274 i", T), ("\\frac{4 A}{3+3 i} e^{i t}", "\\frac{2A(1-i)}{3} e^{it}", T),
    ("\\frac{e^{2 i t}}{(2+2 i)}", "\\frac{(1-i)e^{2it}}{4}", T),
    # --- minerva-style (python-like) golds
    ("-1./3", "-\\frac{1}{3}", T), ("-3./2", "-1.5", T), ("-1./3", "-0.3", F),
    ("\\frac{1}{2a}(\\exp{a*t} - \\exp{-a*t})", "\\frac{\\sinh(at)}{a}", T),
    ("\\frac{1}{2}(\\exp{a*t} + \\exp{-a*t})", "\\cosh(a t)", T),
    ("2 \\cos (\\pi t+\\pi / 3)", "2\\cos(\\pi t + \\frac{\\pi}{3})", T),
    ("\\sqrt{2} \\cos (2 t-\\pi / 4)", "\\cos 2t + \\sin 2t", T),
    ("\\sqrt{2} \\cos (2 t-\\pi / 4)", "\\cos 2t - \\sin 2t", F),
    ("I(0) e^{-\\frac{t}{R C}}", "I(0)e^{-t/(RC)}", T),
    ("x / 2-1 / 4+c e^{-2 x}", "\\frac{x}{2} - \\frac14 + ce^{-2x}", T),
    ("\\frac{1}{s+a}", "(s+a)^{-1}", T), ("\\frac{1}{s+a}", "\\frac{1}{s-a}", F), ("1.6", "1.60", T),
    ("41.8", "41.9", F), ("0.006", "6 \\times 10^{-3}", T), ("2.2 \\tau", "2.2\\tau", T),
    ("\\frac{\\cos (2 t)}{15}", "\\frac{1}{15}\\cos 2t", T),
    ("m \\frac{d v}{d t}+b v=f", "m\\frac{dv}{dt} + bv = f", T),
    # --- olympiad-style golds
    ("(0,2),(0,-2),(4,23),(4,-23)", "(4,23), (4,-23), (0,2), (0,-2)", T), ("2^{1009}", "2^{1009}", T),
    ("2^{1009}", "2^{1009}+1", F), ("\\frac{100!}{2^{50}}", "100!/2^{50}", T),
    ("\\frac{100!}{2^{50}}", "100!/2^{49}", F),
    ("2021 \\cdot 505 \\cdot 337", "343943885", T),
    ("\\frac{4 \\cdot 999^{4}}{27}", "\\frac{4 \\times 999^4}{27}", T),
    ("n^{2}-n+1", "n^2 - n + 1", T), ("\\frac{2016}{2017^{2}}", "2016/4068289", T),
    ("(22+8 \\sqrt{6}, 22-8 \\sqrt{6}),(22-8 \\sqrt{6}, 22+8 \\sqrt{6})",
     "(22-8\\sqrt6, 22+8\\sqrt6), (22+8\\sqrt6, 22-8\\sqrt6)", T),
    ("\\frac{1}{2},\\sqrt{x}", "\\sqrt{x}, 1/2", T), ("2^{-2 / 3}, 8", "8, \\frac{1}{\\sqrt[3]{4}}", T),
    # --- large magnitudes that floats cannot separate
    ("10^{100}", "10^{100}+1", F), ("\\sqrt{2} \\cdot 2^{60}", "\\sqrt{2}(2^{60}+1)", F),
    ("x+2^{60}", "x+2^{60}+1", F), ("2^{2000}\\sqrt{2}", "2^{2000.5}", T),
    ("2^{2000}\\sqrt{2}", "2^{2001}", F),
    ("9^{9^{9}}", "9^{9^{9}}", T), ("9^{9^{9}}", "9^{9^{9}}+1", F),
    ("\\frac{31}{4}", "7 3/4", T), ("-\\frac{31}{4}", "-7 3/4", T), ("21/4", "7 3/4", F), ("\\infty", "inf", T),
    ("(2,\\infty)", "(2, oo)", T), ("2x+1", "f^{-1}(x) = 2x+1", T), ("30^\\circ", "\\angle ABC = 30^\\circ", T),
    ("30", "m\\angle A = 30", T), ("x<2", "2>x", T), ("0.5", "P(A) = 0.5", T), ("55", "S_{10} = 55", T),
    # --- the forms of other graders' test suites: sets, inequalities, repeating decimals, chains
    ("\\{1,2\\} \\cup \\{3\\}", "\\{1,2,3\\}", T), ("x > 1", "1 < x", T), ("x \\leq 2", "(-\\infty, 2]", T),
    ("\\pm 2", "\\{-2, 2\\}", T), ("\\pm 2", "2", F),
    ("\\frac{1}{2} \\text{ or } \\frac{1}{3}", "1/3, 1/2", T),
    ("0.0833333333333333", "\\frac{1}{12}", T), ("(1,4.5)", "(1,\\frac{9}{2})", T),
    ("\\frac{x}{7}+\\frac{2}{7}", "\\frac{x+2}{7}", T),
    ("\\sec^2(y)", "\\tan^2(y)+1", T),
    ("\\begin{pmatrix}-\\frac{7}{4}&-2\\\\4&\\frac{1}{4}\\end{pmatrix}",
     "(\\begin{pmatrix}-\\frac{7}{4}&-2\\\\4&\\frac{1}{4}\\\\\\end{pmatrix})", T),
    ("x+2n+1", "x+1", F), ("\\pi", "3.14", F), ("2x+3", "3+2x", T), ("3/2", "1.5", T),
    ("x^2+2x+1", "y^2+2y+1", F),
    ("x^2+2x+1", "(x+1)^2", T), ("2/(-3)", "-2/3", T), ("72 degrees", "72", T), ("64", "64 square feet", T),
    ("64", "63", F),
    ("\\frac{\\sqrt{3}}{2}", "\\sqrt{3}/2", T), ("x^{-1}", "1/x", T),
    ("\\dfrac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}", T),
    ("0.\\overline{3}", "\\frac{1}{3}", T), ("0.1\\overline{6}", "\\frac{1}{6}", T), ("\\$1.50", "1.5", T),
    ("-0", "0", T),
    ("1.5 \\times 10^{-3}", "0.0015", T), ("2 \\times 10^3", "2000", T), ("x \\ge 0", "[0, \\infty)", T),
    ("\\mathbb{R}", "(-\\infty, \\infty)", T), ("\\text{No solution}", "no solution", T),
    ("\\text{Yes}", "yes", T),
    ("8 \\text{ cm}^2", "8", T), ("8\\,\\mathrm{cm}^2", "8", T), ("\\$ 1,000", "1000", T),
    ("\\frac{1}{2}\\text{ hour}", "0.5", T),
    ("1/2", "1/2x", F), ("\\frac{1}{2}", "\\frac{1}{2}x", F), ("2", "2x", F), ("10", "10\\%", T),
    ("(1,2)", "\\{1,2\\}", F),
    ("1, 2", "[1, 2]", F), ("x^2", "x2", F), ("\\sqrt{2}/2", "\\sqrt{2/2}", F), ("e^{x}", "e^{-x}", F),
    ("2^{10}", "1024", T),
    ("2^{10}", "1000", F), ("1,000", "1", F), ("0.1", "0.10000001", T), ("0.1", "0.11", F),
    ("\\frac{1}{6}", "0.1667", F),
    ("\\frac{1}{6}", "0.16667", T), ("27", "27.0001", T), ("3", "3, 3", T), ("(3, 3)", "3", F),
    ("5 \\text{ cm}^2", "5 cm^2", T),
    ("x^2+7x+10", "(x+2)(x+5)", T), ("\\sin x", "sin(x)", T), ("\\sqrt{x}", "sqrt(x)", T),
    ("\\sqrt{x}", "x^{1/2}", T),
    ("\\ln x", "log(x)", T), ("\\log_{10} x", "\\lg x", T), ("\\arctan 2", "\\tan^{-1} 2", T), ("3!", "6", T),
    ("\\binom{5}{2}", "10", T),
    ("2\\pi r", "2 \\pi r", T), ("\\pi r^2", "r^2\\pi", T), ("-\\infty", "-\\infty", T), ("a+b", "b+a", T),
    ("\\frac{1}{x+1}", "(x+1)^{-1}", T),
    ("x^2 - 1", "(x-1)(x+1)", T), ("\\frac{x^2-1}{x-1}", "x+1", T), ("2^{n}", "2**n", T), ("2^n", "n^2", F),
    ("x^2+y^2=1", "y^2+x^2=1", T), ("x^2+y^2=1", "x^2+y^2=2", F), ("x^2+y^2=1", "2x^2+2y^2=2", T),
    ("y=2x+3", "2y=4x+6", T),
    ("x = 1", "1 = x", T), ("B", "\\textbf{(B)} 6", T), ("B", "b", F), ("(B)", "6", F), ("B", "B) 6", T),
    ("C", "C. 12", T),
    ("e", "2.71828", T), ("\\text{C}", "C", T), ("A", "A: 5", T), ("\\text{(A)}", "(A)", T),
    ("\\frac{3}{4}", "3:4", F), ("100", "100.", T), ("\\frac{5}{2}", "2.5", T),
    ("\\frac{5}{2}", "2\\frac{1}{2}", T), ("\\frac{5}{2}", "2\\frac{1}{3}", F),
    ("-\\frac{5}{2}", "-2\\frac{1}{2}", T), ("\\frac{\\pi}{4}", "45^\\circ", T), ("\\frac{\\pi}{4}", "45", F),
    ("45^\\circ", "\\frac{\\pi}{4}", T),
    ("\\infty", "\\infty.", T), ("\\{3\\}", "3", T), ("\\{3, 4\\}", "3", F),
    ("[-1, 1]", "-1 \\le x \\le 1", T), ("(-1, 1)", "-1 < x < 1", T),
    ("(-1, 1)", "|x| < 1", T), ("[-1, 1]", "|x| < 1", F),  # round 2: the set |x| < 1 describes ("x \\in (0, 1)", "(0,1)", T), ("\\text{All real numbers}", "\\mathbb{R}", T),
    ("\\emptyset", "\\text{no solution}", T),
    ("(-\\infty,-2)\\cup(3,\\infty)", "x<-2 \\text{ or } x>3", T),
    ("(-\\infty,-2)\\cup(3,\\infty)", "x<-2 \\text{ or } x>4", F),
    ("12", "twelve", F), ("\\frac{1}{2}", "\\frac{1}{2} \\approx 0.5", T),
    ("(x-1)^2", "x^2-2x+1", T), ("\\frac{2}{3}", "0.\\overline{6}", T), ("1.\\overline{3}", "\\frac43", T),
    ("5\\sqrt{2}", "\\sqrt{50}", T), ("\\sqrt{50}", "7.07", F), ("\\sqrt{50}", "7.0711", T),
    ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt2}2", T),
    ("i", "\\sqrt{-1}", T), ("2i", "-2i", F), ("\\frac{1+i}{2}", "0.5+0.5i", T),
    ("\\cos\\theta", "\\sin(\\frac{\\pi}{2}-\\theta)", T),
    ("\\theta", "\\phi", F), ("a_1 + a_2", "a_2 + a_1", T), ("a_1", "a_2", F), ("x_{1}", "x_1", T),
    ("\\overline{AB}", "\\overline{AB}", T), ("AB", "BA", T),
    ("\\frac{1}{2}ab\\sin C", "\\frac{ab\\sin C}{2}", T),
    ("10^{-3}", "0.001", T), ("10^{-3}", "0.01", F), ("1\\times 10^{6}", "10^6", T),
    ("1000000", "1\\,000\\,000", T),
    ("(0, 0)", "(0,0)", T), ("(0, 0)", "0", F), ("(a, b)", "(b, a)", F), ("[a, b]", "[a,b]", T),
    ("(1, 2]", "(1, 2)", F),
    ("y = x", "x = y", T), ("y = x", "y = -x", F), ("\\frac{a+b}{c}", "\\frac{a}{c}+\\frac{b}{c}", T),
    ("\\frac{a+b}{c}", "\\frac{a}{c}+b", F),
    ("{1,2,3}", "\\{1,2,3\\}", T), ("(1,2)", "(x,y)=(1,2)", T), ("(1,2)", "(x, y) = (2,1)", F),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{\\sqrt{2}}{2} \\approx 0.707", T), ("3.14", "\\pi \\approx 3.14", T),
    ("\\frac{1}{2}", "\\frac{1}{2} = 0.5", T), ("5", "2+3=5", T), ("6", "2x=6", F), ("3", "2x=6", F),
    ("7", "a+b=7", F),
    ("y = -\\frac{1}{2}x + 3", "x + 2y = 6", T), ("(x-1)^2+(y-2)^2=4", "x^2-2x+y^2-4y+1=0", T),
    ("x^2=4", "x=2", F),
    ("x=2", "2x=4", T), ("\\text{(A)}, \\text{(C)}", "C, A", T), ("x=1, y=2", "(1,2)", T),
    ("\\approx 8.24 \\text{ mph}", "8.24", T),
]


@pytest.mark.parametrize("gold,pred,same", PAIRS, ids=[f"{i}" for i in range(len(PAIRS))])
def test_pairs(gold, pred, same):
    assert verify(gold, pred) is same, (gold, pred)


def test_pairs_table_is_broad():
    assert len(PAIRS) >= 300
    assert sum(1 for *_, s in PAIRS if not s) >= 100  # false positives matter as much


# Equality is symmetric for the pairs where no side plays the gold's special role (letters, %, base,
# a single answer or a list that accepts an answer twice, where a gold that repeats an item counts it).
ONE_WAY = {("3", "3, 3"), ("1,2", "1,2,2")}
SYMMETRIC = [(g, p, s) for g, p, s in PAIRS
             if "%" not in g + p and "_8" not in g and g[:1] not in "\\(ABCDE" and (g, p) not in ONE_WAY]


@pytest.mark.parametrize("gold,pred,same", SYMMETRIC[::3])
def test_pairs_symmetric(gold, pred, same):
    assert verify(pred, gold) is same, (pred, gold)


CLASS_ROWS = [(name, g, p, s) for name, rows in CLASSES.items() for g, p, s in rows]


@pytest.mark.parametrize("cls,gold,pred,same", CLASS_ROWS, ids=[f"{r[0]}-{i}" for i, r in enumerate(CLASS_ROWS)])
def test_class_tables(cls, gold, pred, same):
    """The rows of tests/grader_cases.py, one table per class of misjudgement of issue 14."""
    assert verify(gold, pred) is same, (cls, gold, pred)


def test_class_tables_have_both_sides():
    for name, rows in CLASSES.items():
        assert len(rows) >= 10, name
        if name != "false_positives":
            assert any(s for *_, s in rows) and any(not s for *_, s in rows), name


def test_odd_roots_of_negative_numbers_that_are_not_cubes():
    """The real odd root of a negative non-cube goes through the float path (no exact value):
    it must stay the real root, -2^(1/3) ~ -1.2599, not the principal complex one."""
    assert verify("\\sqrt[3]{-2}", "-\\sqrt[3]{2}") is True
    assert verify("\\sqrt[3]{-2}", "-1.2599") is True
    assert verify("-1.2599", "\\sqrt[3]{-2}") is True
    assert verify("\\sqrt[3]{-2}", "1.2599") is False
    assert verify("\\sqrt[3]{-2}", "\\sqrt[3]{2}") is False
    assert verify("\\sqrt[5]{-3}", "-\\sqrt[5]{3}") is True
    assert verify("\\sqrt[3]{-2} + x", "x - 2^{1/3}") is True


def test_against_sympy_on_its_own_latex():
    """An independent reference: expressions built in sympy, each printed by sympy.latex in several
    equivalent forms (expanded, factored, simplified); every pair of forms must verify exactly when
    sympy's own values agree (evaluated from sympy's trees at two points, so the reference never
    goes through reward.py's LaTeX parser)."""
    sp = pytest.importorskip("sympy")
    x, y, n = sp.symbols("x y n", positive=True)
    exprs = [x**2 + 2*x + 1, (x + 1)**2, x**2 + 1, sp.sin(x)**2 + sp.cos(x)**2, sp.Integer(1), sp.sqrt(8),
             2*sp.sqrt(2), sp.Rational(1, 3), sp.Rational(1, 2), sp.exp(2*x), sp.exp(x)**2, sp.log(x*y),
             sp.log(x) + sp.log(y), sp.pi/6, sp.asin(sp.Rational(1, 2)), sp.tan(x), sp.sin(x)/sp.cos(x),
             sp.binomial(2*n, n), sp.factorial(n)/sp.factorial(n - 2), n*(n - 1), (x**3 - 1)/(x - 1),
             x**2 + x + 1, sp.sqrt(x**2), x, -x, 1/(1 + sp.sqrt(2)), sp.sqrt(2) - 1, sp.Rational(7, 4) + sp.I,
             sp.Rational(7, 4) - sp.I, sp.E**(sp.I*sp.pi), sp.Integer(-1), x*y/2, (x + y)**3,
             x**3 + 3*x**2*y + 3*x*y**2 + y**3, sp.cos(2*x), 1 - 2*sp.sin(x)**2, sp.Rational(22, 7), sp.pi,
             2**sp.Rational(1, 3), sp.root(16, 3)/2, sp.atan(x), sp.pi/2 - sp.acot(x)]
    forms = []
    for e in exprs:
        latex = {sp.latex(e)} | {sp.latex(f(e)) for f in (sp.expand, sp.factor, sp.simplify, sp.together)}
        forms += [(e, s) for s in sorted(latex)]
    points = [{x: sp.Rational(13, 7), y: sp.Rational(5, 3), n: sp.Rational(29, 11)},
              {x: sp.Rational(3, 10), y: sp.Rational(17, 4), n: sp.Rational(9, 2)}]
    values = [[complex(e.evalf(30, subs=pt)) for pt in points] for e, _ in forms]
    wrong = []
    for i in range(len(forms)):
        for j in range(i + 1, len(forms)):
            same = all(abs(a - b) <= 1e-12 * max(1, abs(a)) for a, b in zip(values[i], values[j]))
            if verify(forms[i][1], forms[j][1]) is not same:
                wrong.append((forms[i][1], forms[j][1], same))
    assert len(forms) > 50 and not wrong, wrong[:5]


def test_relative_tolerance_is_configurable():
    assert verify("\\frac{1}{3}", "0.333") is False
    assert verify("\\frac{1}{3}", "0.333", rel_tol=1e-2) is True
    assert verify("3.83e35", "3.8e35", rel_tol=1e-2) is True
    assert verify("\\sqrt{2}", "1.41", rel_tol=1e-2) is True
    assert verify("2", "1.41", rel_tol=1e-2) is False


# ----------------------------------------------------------------------------- extraction
EXTRACT = [
    ("so the answer is $\\boxed{5}$.", "5"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("first \\boxed{3} then \\boxed{4}", "4"),
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("\\fbox{7}", "7"),
    ("The answer is \\boxed 5 and done", "5"),
    ("$\\boxed{2}$ and $\\boxed{3}$", "2, 3"),
    ("\\boxed{2} \\text{ or } \\boxed{3}", "2, 3"),
    ("\\boxed{\\text{(C)}}", "\\text{(C)}"),
    ("nested \\boxed{\\frac{\\sqrt{3}}{\\{2\\}}} end", "\\frac{\\sqrt{3}}{\\{2\\}}"),
    ("truncated \\boxed{1} and later \\boxed{\\frac{1}{2", "1"),
    ("Final Answer: The final answer is $5$. I hope it is correct.", "5"),
    ("The answer is: 42", "42"),
    ("the final answer is 3.5.", "3.5"),
    ("**Answer:** $x = 2$", "x = 2"),
    ("The answer is\n\n$$\\frac{3}{4}$$", "\\frac{3}{4}"),
    ("Janet sells 9 eggs.\n#### 18", "18"),
    ("#### 1,600", "1,600"),
    ("We get $x=1$ and then $y = 7$.", "y = 7"),
    ("so \\(a+b\\) equals \\(12\\)", "12"),
    ("<think>maybe \\boxed{3}</think> The answer is \\boxed{4}.", "4"),
    ("<think>so \\boxed{3}</think> I am done.", "3"),
    ("<think>\\boxed{3}\n", "3"),
    ("no answer here", None),
    ("", None),
    ("\\boxed{}", None),
    ("It costs $5 and $6", "5 and"),
    ("$$x^2$$", "x^2"),
    # issue 14: languages, '**Final Answer**' lines, parts, end of turn, escaped backslashes, prose
    ("Por lo tanto, la respuesta es $12$.", "12"), ("因此，答案是 42。", "42"), ("Die Antwort ist 7.", "7"),
    ("**Final Answer**\n\n12", "12"), ("(a) $\\boxed{5}$\n(b) $\\boxed{7}$", "5, 7"),
    ("First $x = \\boxed{3}$, so the area is $\\boxed{12}$.", "12"),
    ("\\boxed{12}<|im_end|>\n<|im_start|>user\n\\boxed{5}", "12"), ("The answer is \\\\boxed{\\\\frac{3}{4}}", "\\frac{3}{4}"),
    ("Final Answer: the area is 64", "64"), ("So the answer is 12 (since $3 \\cdot 4 = 12$).", "12"),
    ("The largest $n$ is 34.", "34"), ("The minimum is $-2$, attained at $x = 1$.", "-2"),
    ("Respuesta: 42", "42"), ("所以这个数是12", None),  # no marker and no math span: no answer for RL
    ("<think>so 8?</think><answer>9</answer>", "9"), ("<answer>\\boxed{9}</answer>", "9"),
]


@pytest.mark.parametrize("text,expected", EXTRACT)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


# (gold, a whole model-style response, does it earn the reward?)
RESPONSES = [
    ("\\frac34", "...so the answer is $\\boxed{\\dfrac{3}{4}}$.", True),
    ("(2,-1)", "**Final Answer**\n\\[\n\\boxed{(2, -1)}\n\\]", True),
    ("12", "The final answer is \\(\\boxed{12}\\).", True),
    ("18.9", "Therefore, the total cost is $\\$18.90$. The answer is $\\boxed{\\$18.90}$", True),
    ("\\text{(C)}", "...\n\nThe final answer is $\\boxed{C}$", True),
    ("-3, 2", "We get $x = \\boxed{2}$ or $x = \\boxed{-3}$.", True),
    ("-3, 2", "We get $x = \\boxed{2}$, so $y = \\boxed{-3}$.", False),  # not a list: the last box
    ("2, 3", "The solutions are $\\boxed{2}$ and $\\boxed{3}$.", True),
    ("2", "Maybe $\\boxed{2}$ or $\\boxed{3}$.", False),  # hedging is not an answer
    ("5", "<think>so x is 4... wait \\boxed{5}", False),  # unfinished thinking: no answer yet
    ("5", "<think>so x is 4... wait</think> \\boxed{5}", True),
    ("1.6", "Final Answer: The final answer is $1.6$. I hope it is correct.", True),
    ("18", "The answer is 18.", True), ("18", "Janet makes 18 dollars.\n#### 18", True),
    ("5", "The answer is 5, since 2 + 3 = 5.", True), ("5", "The answer is 5 because it is.", True),
    ("(A)", "The answer is (A).", True), ("A", "Answer: (A) 12", True),
    ("\\frac{1}{2}", "The probability is $\\frac{1}{2}$.", True),
    ("\\frac{1}{2}", "The probability is one half", False),
    ("7", "<think>\nThe answer is 6.\n</think>\nThe answer is $\\boxed{7}$.", True),
    ("6", "<think>\nThe answer is 6.\n</think>\nThe answer is $\\boxed{7}$.", False),
    ("3", "\\boxed{3} is wrong; the answer is 4.", True),  # a box beats "the answer is" anywhere
    ("2", "x" * 50_000 + " so $\\boxed{2}$", True),
    ("34", "The largest $n$ is 34.", True), ("12", "**Final Answer**\n\n12<|im_end|>", True),
    ("5, 7", "(a) $\\boxed{5}$\n(b) $\\boxed{7}$", True), ("C", "Ruling out A and D, the answer is C.", True),
]


@pytest.mark.parametrize("gold,response,correct", RESPONSES)
def test_responses(gold, response, correct):
    assert verify(gold, response) is correct
    assert math_reward(response, gold) == (1.0 if correct else 0.0)


def test_extract_answer_rejects_non_strings():
    with pytest.raises(TypeError, match="str"):
        extract_answer(None)
    with pytest.raises(TypeError, match="gold"):
        verify(["1"], "1")


def test_verify_whole_solutions_on_either_side():
    sol = "We compute $2+3=5$. Therefore the answer is $\\boxed{5}$."
    assert verify(sol, "5") and verify("5", sol) and verify(sol, sol)
    assert not verify(sol, "The answer is $\\boxed{6}$.")
    assert verify("\\frac{1}{2}", "Dividing, we get $\\frac{2}{4}$, i.e. the final answer is $0.5$.")
    # a bare answer with dollar signs inside (Minerva writes some like this)
    assert verify("x_{0} \\cos (\\omega t)+$ $\\dot{x}_{0} \\sin (\\omega t) / \\omega",
                  "\\boxed{x_0\\cos(\\omega t) + \\dot{x}_0\\sin(\\omega t)/\\omega}")


# ----------------------------------------------------------------------------- reward
def test_math_reward():
    assert math_reward("Thus $\\boxed{\\frac12}$.", "0.5") == 1.0
    assert math_reward("Thus $\\boxed{3}$.", "0.5") == 0.0
    assert math_reward("I do not know", "0.5") == 0.0
    assert math_reward("Thus $\\boxed{3}$.", "0.5", format_reward=0.1) == 0.1
    assert math_reward("I do not know", "0.5", no_answer_penalty=0.5) == -0.5
    assert math_reward("Thus $\\boxed{\\frac12}$.", "0.5", format_reward=0.1, no_answer_penalty=1) == 1.0
    assert math_reward("0.5", "0.5") == 0.0  # a bare response has no extractable answer: no credit
    with pytest.raises(TypeError, match="response"):
        math_reward(None, "1")


def test_make_grader():
    """The config's `reward:` names a grader: the rules with math-verify's second opinion (the
    default), the rules alone, math-verify alone; an unknown name is an error that lists them."""
    rule = reward.make_grader("rule")
    assert rule("Thus $\\boxed{\\frac12}$.", "0.5") == 1.0 and rule("I do not know", "1", no_answer_penalty=1) == -1.0
    assert rule.verify("2:5", "AB:CD = 2:5") is True
    assert rule("\\boxed{\\gcd(12, 8)}", "4") == 0.0 and rule.verify("4", "\\gcd(12, 8)") is False
    both = reward.make_grader()
    assert both("\\boxed{\\gcd(12, 8)}", "4") == 1.0 and both.verify("4", "\\gcd(12, 8)") is True
    assert both("\\boxed{5}", "4", format_reward=0.1) == 0.1 and both("no answer", "4", no_answer_penalty=1) == -1.0
    with pytest.raises(ValueError, match="math_verify"):
        reward.make_grader("sympy")
    mv = reward.make_grader("math_verify")  # TRL's extraction, which does not read `\\frac12`
    assert mv("Thus $\\boxed{\\frac{1}{2}}$.", "0.5") == 1.0 and mv("Thus $\\boxed{3}$.", "0.5") == 0.0


# ----------------------------------------------------------------------------- the second opinion
# Where the rules cannot read an answer (a function they do not know), math-verify's "yes" counts.
SECOND_OPINION_YES = [("12", "\\operatorname{lcm}(4, 6)"), ("4", "\\gcd(12, 8)"), ("4", "\\boxed{\\gcd(12, 8)}")]
SECOND_OPINION_NO = [("4", "\\gcd(12, 9)"), ("12", "\\operatorname{lcm}(4, 5)")]
# Wrong answers the rules reject and math-verify alone accepts: the rules keep their "no". An equation
# read by its right side; prose out of which it picks a number (wrong answers made from benchmark
# golds by bench/prose_pairs.py, which it accepted before the veto); a tuple for a set, a ratio for a
# fraction, digits apart for their product, a letter's case.
SECOND_OPINION_VETOED = [
    ("6", "2x=6"), ("7", "a+b=7"), ("4", "x^2 = 4"), ("2p + q", "5 = 2p + q"), ("f(2) = 5", "f(3) = 5"),
    ("240\\text{ ways.}", "So $240\\text{ ways.} + 7 = 247\\text{ ways.}$."),
    ("8\\!:\\!34 \\text{ p.m.}", "\\boxed{8\\!:\\!34 \\text{ p.m.} + 5 = 13\\!:\\!34 \\text{ p.m.}}"),
    ("96", "答案不是 96，而是100。"),
    ("\\left(\\frac{1}{2},\\frac{2}{3}\\right)",
     "Il reste \\left(\\frac{1}{4},\\frac{2}{3}\\right) pommes, pas \\left(\\frac{1}{2},\\frac{2}{3}\\right)."),
    ("(1,2)", "\\{1,2\\}"), ("\\frac{3}{4}", "3:4"), ("6", "1 2 3"), ("B", "b"),
]


@pytest.mark.parametrize("gold,pred", SECOND_OPINION_YES)
def test_second_opinion_where_the_rules_cannot_read(gold, pred):
    assert reward.rule_verify(gold, pred) is False and verify(gold, pred) is True


@pytest.mark.parametrize("gold,pred", SECOND_OPINION_VETOED)
def test_second_opinion_never_turns_a_wrong_answer_the_rules_caught_right(gold, pred):
    """Each of these is a false positive of math-verify alone (asserted, so that the row matters),
    and stays wrong under the combination: as a pair, and as a response graded for the reward."""
    assert reward.make_grader("math_verify").verify(gold, pred) is True
    assert reward.rule_verify(gold, pred) is False and verify(gold, pred) is False
    assert math_reward(pred, gold) < 1.0


def test_second_opinion_is_not_asked_where_the_rules_read_both(monkeypatch):
    """Numbers, expressions and structures of them that the rules read and found apart never reach
    math-verify (the speed of training's grading), nor do huge numbers (9^{9^{9}})."""
    def ask(*a):
        raise AssertionError(f"math-verify asked: {a}")
    monkeypatch.setattr(second_opinion, "ask", ask)
    for gold, pred in [("12", "13"), ("12", "The answer is \\boxed{13}."), ("\\frac{1}{2}", "0.6"), ("x^2+1", "x^2+2"),
                       ("(1,2)", "(1,3)"), ("(-\\infty, 2]", "(-\\infty, 3]"), ("\\{1,2\\}", "\\{1,3\\}"),
                       ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix} 1 \\\\ 3 \\end{pmatrix}"),
                       ("9^{9^{9}}", "9^{9^{9^{9}}}"), ("\\sqrt{2}", "\\sqrt{3}"), ("A", "B"), ("50\\%", "0.6")]:
        assert verify(gold, pred) is False and verify(pred, gold) is False


def test_second_opinion_is_bounded_and_its_failures_counted(monkeypatch):
    """A verdict that does not come in time is "no", in any thread: the worker (stuck in one C call
    of sympy's, which nothing in-process can stop) is killed and replaced, and guarded() counts the
    call as a timeout, as it counts a grader's own."""
    monkeypatch.setattr(second_opinion, "SECOND_OPINION_TIMEOUT", 0.5)
    monkeypatch.setattr(reward, "_worth_asking", lambda g, p: True)  # 9^{9^{9}} goes to math-verify
    out = {}

    def work():
        second_opinion.start()
        failed = {"errors": 0, "timeouts": 0}
        t0 = time.perf_counter()
        out["verdict"] = reward.guarded(10, lambda: verify("9^{9^{9}}", "9^{9^{9^{9}}}"), "9^{9^{9^{9}}}", failed)
        out["seconds"], out["failed"] = time.perf_counter() - t0, failed
        out["replaced"] = second_opinion._LOCAL.worker["proc"].poll() is None  # started at once, importing
        second_opinion.start()  # waits for its import (which may take over 0.5 s on a loaded machine)
        out["after"] = verify("4", "\\gcd(12, 8)")

    th = threading.Thread(target=work)
    th.start()
    th.join(60)
    assert out["verdict"] is None and out["seconds"] < 2.0
    assert out["failed"]["timeouts"] == 1 and "math-verify: no verdict within 0.5s" in out["failed"]["first"]
    assert out["replaced"] and out["after"] is True


def test_the_math_verify_grader_keeps_guardeds_deadline():
    """math-verify's own timeout is signal.alarm, whose alarm(0) cancelled guarded()'s timer: the
    call after it ran past reward_timeout and was not counted. Under guarded it is bounded."""
    grade_mv, failed = reward.make_grader("math_verify"), {"errors": 0, "timeouts": 0}
    t0 = time.perf_counter()
    out = reward.guarded(0.5, lambda: (grade_mv("so \\boxed{8}", "7"), time.sleep(3))[0], "so \\boxed{8}", failed)
    assert out is None and time.perf_counter() - t0 < 2.5 and failed["timeouts"] == 1
    assert grade_mv("so \\boxed{7}", "7") == 1.0  # alone: its own 5 s timeout, as before


def test_second_opinion_in_threads():
    """Each thread has its own worker: threads grading at once get each their own verdicts."""
    results = {}

    def work(k):
        results[k] = [verify(g, p) for g, p in SECOND_OPINION_YES + SECOND_OPINION_NO]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    want = [True] * len(SECOND_OPINION_YES) + [False] * len(SECOND_OPINION_NO)
    assert all(results[k] == want for k in range(3)), results


def test_verify_in_threads():
    """The deadline guard is per-thread; graders in a thread pool must not see each other's hooks."""
    results = {}

    def work(k):
        results[k] = [verify(g, p) is s for g, p, s in PAIRS[k::4]]

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(all(v) for v in results.values())


# ----------------------------------------------------------------------------- robustness
def _hostile_inputs(n, seed=0):
    rng = random.Random(seed)
    fixed = [
        "9^{9^{9^{9}}}", "10^{10^{10}}!", "(10^{10^{10}})!", "2^{2^{2^{2^{2^{2}}}}}", "10^{10^{10^{10}}}",
        "\\frac{1}{0}", "0^0", "0^{-1}", "(-1)^{1/2}", "\\sqrt[0]{2}", "\\log 0", "\\log_1 5", "1/0!",
        "{" * 5000 + "1" + "}" * 5000, "(" * 3000 + "1" + ")" * 3000, "(" * 3000, "\\boxed{" * 3000,
        "\\frac{" * 2000, "\\sqrt{" * 2000 + "2" + "}" * 2000, "x" * 100_000, "1" * 100_000,
        "$" * 100_000, "\\boxed{" + "1+" * 50_000 + "1}", "{" * 100_000, "}" * 100_000,
        "\\left(" * 10_000, "a^" * 5000 + "a", "-" * 10_000 + "1", "!" * 10_000, "1" + "!" * 200,
        "100000!", "1000000!", "\\binom{10^{9}}{5 \\cdot 10^{8}}", "\\sin(10^{300})", "e^{e^{e^{e^{10}}}}",
        "\\tan(\\pi/2)", "10^{-10^{10}}", "1e999999", "1e-999999", "9" * 5000 + "^" + "9" * 5000,
        "\\underbrace{", "\\begin{pmatrix}" * 500, "&" * 5000, "\\\\" * 5000, "\\text{" * 3000,
        "the answer is " * 20_000, "####" * 20_000, "\\boxed " * 20_000, "<think>" * 10_000,
        "\\pm" * 1000, "," * 50_000, "(1," * 5000, "[0,1)" * 5000, "\\cup" * 5000, "=" * 5000,
        "x = " * 5000, "1 < " * 3000 + "x", "\\sqrt[3]{" * 500, "2^{" * 3000, "\\frac12" * 10_000,
        "(x+1)^{100000}", "(x+y+z)^{300}", "x^{10^{10}}", "\\lfloor" * 1000, "|" * 5001, "\\|" * 3000,
        "\ud800", "\x00" * 1000, "🙂" * 10_000,
    ]
    atoms = ["1", "2", "9", "x", "n", "\\pi", "e", "i", "^", "_", "{", "}", "(", ")", "[", "]", "\\frac",
             "\\sqrt", "\\boxed{", "$", "!", "+", "-", "*", "/", ",", "=", "<", "\\le", "\\infty", "\\cdot",
             "\\times", "10^{", "9^", "\\sin", "\\log", "\\text{", "\\left(", "\\right)", "\\pm", "&", "\\\\",
             "\\begin{pmatrix}", "\\end{pmatrix}", "|", "\\lfloor", "\\binom", "%", "^\\circ", " ", ".", "e5"]
    out = list(fixed)
    while len(out) < n:
        kind = rng.random()
        if kind < 0.45:
            out.append("".join(rng.choice(atoms) for _ in range(rng.randint(1, 120))))
        elif kind < 0.6:
            out.append("".join(chr(rng.randint(0, 0x2FFFF)) for _ in range(rng.randint(1, 200))))
        elif kind < 0.75:  # towers and factorials of random heights
            d = rng.randint(2, 6)
            tower = "".join(f"{rng.randint(2, 99)}^{{" for _ in range(d)) + "9" + "}" * d
            out.append(tower + rng.choice(["", "!", "+1"]))
        elif kind < 0.9:
            out.append("\\boxed{" + "".join(rng.choice(atoms) for _ in range(rng.randint(1, 60))) + "}")
        else:
            out.append(rng.choice(fixed)[: rng.randint(1, 5000)] + rng.choice(atoms))
    return out[:n]


def test_deadline_interrupts_python_code_in_a_worker_thread():
    """The guard around the slow path: a pure-Python loop is stopped after its budget, off the
    main thread (where signal.alarm cannot run), and the thread's profile hook is cleared after."""
    out = {}

    def spin():
        while True:
            sum(range(10))

    def work():
        t0 = time.thread_time()  # the budget is this thread's CPU time
        try:
            reward._with_deadline(0.2, spin)
        except reward._Timeout:
            out["elapsed"] = time.thread_time() - t0
        out["hook"] = sys.getprofile()

    th = threading.Thread(target=work)
    th.start()
    th.join(10)
    assert 0.2 <= out["elapsed"] < 1.0 and out["hook"] is None


def test_deadline_leaves_an_installed_profiler_alone():
    calls = []
    marker = lambda *a: calls.append(1)  # noqa: E731
    sys.setprofile(marker)
    try:
        assert reward._with_deadline(0.0, lambda: sum(range(1000))) == 499500  # not interrupted
        assert sys.getprofile() is marker
        assert verify("(y+1)^3", "y^3+3y^2+3y+1") is True
    finally:
        sys.setprofile(None)
    assert calls


def test_timeout_means_not_equal(monkeypatch):
    monkeypatch.setattr(reward, "TIME_BUDGET", 0.0)
    reward._parse.cache_clear()
    assert verify("(y+1)^2", "y^2+2y+1") is False  # needs the slow path, which has no time left
    monkeypatch.undo()
    assert verify("(y+1)^2", "y^2+2y+1") is True


def _sets_of_pairs(n, reordered):
    """`\\{2y, 2z\\}, \\{3y, 3z\\}, ...`, or the same sets written `\\{zk, yk\\}` in reverse order."""
    ks = range(n + 1, 1, -1) if reordered else range(2, n + 2)
    return ", ".join(f"\\{{z{k}, y{k}\\}}" if reordered else f"\\{{{k}y, {k}z\\}}" for k in ks)


def test_default_time_budget_gives_up_on_a_quadratic_list():
    """120 two-element sets against the same sets reordered: sets cannot be paired by value, so it
    takes O(n^2) set comparisons, ~3 s of work on this project's 2-core machine. The default budget
    must give up long before: this fails if TIME_BUDGET is raised tenfold (0.8 s of CPU), so
    that the worst call stays near 0.1 s."""
    gold, pred = _sets_of_pairs(120, False), _sets_of_pairs(120, True)
    assert len(gold) < reward.MAX_ANSWER and len(pred) < reward.MAX_ANSWER  # no shortcut
    reward._clean.cache_clear(), reward._structure.cache_clear(), reward._parse.cache_clear()
    verify("\\sqrt{2}", "2^{1/2}")  # mpmath imported (once per process) before the clock starts
    t0 = time.thread_time()  # the budget is CPU time: a loaded machine does not make this flaky
    assert verify(gold, pred) is False  # not computed in time: not equal
    assert time.thread_time() - t0 < 0.4
    # the same kind of pair, small enough to finish: the False above is the budget's
    assert verify(_sets_of_pairs(5, False), _sets_of_pairs(5, True)) is True


def test_fuzz_hostile_inputs_never_raise_or_hang():
    # A regression that hangs inside one C call (a huge int power) cannot be interrupted from
    # Python: dump the stacks and exit after 300 s instead of stalling CI without a word.
    faulthandler.dump_traceback_later(300, exit=True)
    try:
        _fuzz()
    finally:
        faulthandler.cancel_dump_traceback_later()


def _fuzz():
    inputs = _hostile_inputs(2000)
    golds = ["9^{9^{9}}", "\\frac{1}{2}", "x^2+1", "(1,2)", "10^{10^{10}}!", "2"]
    rules = reward.make_grader("rule")
    times = []
    for k, s in enumerate(inputs):
        t0 = time.perf_counter()
        ans = extract_answer(s)
        assert ans is None or isinstance(ans, str)
        assert isinstance(reward.rule_verify(golds[k % len(golds)], s), bool)
        assert isinstance(reward.rule_verify(s, golds[k % len(golds)]), bool)
        assert isinstance(rules(s, golds[k % len(golds)]), float)
        times.append(time.perf_counter() - t0)
    assert max(times) < 2.0, (max(times), inputs[times.index(max(times))][:200])
    assert sum(times) / len(times) < 0.05, sum(times) / len(times)


@pytest.mark.slow
def test_hostile_inputs_with_the_second_opinion_in_a_thread():
    """The same battery through the default grader (math-verify asked where the rules cannot read),
    off the main thread, where math-verify's own timeouts do not run: no exception, and every call
    under the reward timeout (10 s by default; the second opinion's bound is 2 s, after at most 5 s
    for the import of a new worker)."""
    faulthandler.dump_traceback_later(600, exit=True)
    inputs, golds, out = _hostile_inputs(2000), ["9^{9^{9}}", "\\frac{1}{2}", "x^2+1", "(1,2)", "10^{10^{10}}!", "2"], {}

    def work():
        worst, failed = (0.0, None), {"errors": 0, "timeouts": 0}
        for k, s in enumerate(inputs):
            g = golds[k % len(golds)]
            for call in (lambda: verify(g, s), lambda: verify(s, g), lambda: math_reward(s, g)):
                t0 = time.perf_counter()
                reward.guarded(1000, call, s, failed)
                worst = max(worst, (time.perf_counter() - t0, s[:100]))
        out["worst"], out["failed"] = worst, failed

    try:
        th = threading.Thread(target=work)
        th.start()
        th.join()
    finally:
        faulthandler.cancel_dump_traceback_later()
    assert out["failed"]["errors"] == 0, out["failed"]
    bound = second_opinion.SECOND_OPINION_START + second_opinion.SECOND_OPINION_TIMEOUT + 1.0  # a worker's import, a verdict
    assert out["worst"][0] < bound < 10, out["worst"]


# ----------------------------------------------------------------------------- benchmark files
from qwen_math import DATA_DIR as DATA  # noqa: E402  ($TEPO_DATA_DIR, else ../shared/data)


@pytest.mark.skipif(not os.path.isdir(DATA), reason=f"benchmark files not found at {DATA}: `python data.py fetch --out DIR`, then TEPO_DATA_DIR=DIR")
def test_every_gold_answer_verifies_against_itself_and_its_solution():
    """Every gold answer of every benchmark file verifies against itself, a boxed response with it,
    its `answer_raw` (AIME `025`, AMC `27.0`, GSM8K `1,600`, OlympiadBench `$...$`), its solution's
    extracted answer where the solution has one, and GSM8K's `#### ` form."""
    failures, checked = [], 0
    for name in sorted(os.listdir(DATA)):
        if not name.endswith(".jsonl"):
            continue
        with open(os.path.join(DATA, name), encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        for row in rows:
            gold = row["answer"]
            preds = [gold, f"Hence the final answer is $\\boxed{{{gold}}}$."]
            if "answer_raw" in row:
                preds.append(str(row["answer_raw"]))
            sol = row.get("solution") or ""
            if "\\boxed" in sol or "\\fbox" in sol:
                preds.append(sol)
            if name.startswith("gsm8k"):
                preds.append(f"{sol}\n#### {row.get('answer_raw', gold)}")
            for p in preds:
                checked += 1
                if not verify(gold, p):
                    failures.append((name, gold, p[-200:]))
    assert checked > 20_000
    assert not failures, f"{len(failures)} of {checked} failed, e.g. {failures[:5]}"


@pytest.mark.skipif(not os.path.isdir(DATA), reason=f"benchmark files not found at {DATA}: `python data.py fetch --out DIR`, then TEPO_DATA_DIR=DIR")
def test_gold_answers_with_a_number_changed_do_not_verify():
    """The negative side on real answers: add 1 to one number of each gold (not a unit's exponent,
    not in an `\\approx` aside) and the result must not verify against the gold."""
    rng, false_positives, checked = random.Random(0), [], 0
    for name in sorted(os.listdir(DATA)):
        if not name.endswith(".jsonl"):
            continue
        with open(os.path.join(DATA, name), encoding="utf-8") as f:
            golds = [json.loads(line)["answer"] for line in f if line.strip()]
        for gold in golds:
            nums = [m for m in re.finditer(r"\d+", gold)
                    if not re.search(r"(?:\\mbox|\\text)\{[^}]*\}\^\{?$", gold[:m.start()])]
            if not nums or "\\approx" in gold:
                continue
            m = rng.choice(nums)
            wrong = gold[:m.start()] + str(int(m.group()) + 1) + gold[m.end():]
            checked += 1
            if verify(gold, wrong):
                false_positives.append((name, gold, wrong))
    assert checked > 10_000
    assert not false_positives, f"{len(false_positives)} of {checked}: {false_positives[:5]}"


# The later rounds' two batches each (tests/grader_cases.py): the first written before the round's
# fixes, the second after them and measured before the code was touched again; each round lists the
# rows it still misses.
ROUNDS = {"round2": ({1: ROUND2_BATCH1, 2: ROUND2_BATCH2}, ROUND2_MISSES),
          "round3": ({1: ROUND3_BATCH1, 2: ROUND3_BATCH2}, ROUND3_MISSES),
          "second_opinion": ({2: SECOND_OPINION_BATCH2}, SECOND_OPINION_MISSES)}  # batch 1: bench/prose_pairs.py
ROUND_ROWS = [(f"{rnd}-batch{b}-{name}", g, p, same) for rnd, (batches, misses) in ROUNDS.items()
              for b, batch in batches.items() for name, rows in batch.items()
              for g, p, same in rows if (g, p) not in misses]


@pytest.mark.parametrize("cls,gold,pred,same", ROUND_ROWS, ids=[f"{r[0]}-{i}" for i, r in enumerate(ROUND_ROWS)])
def test_round_batches(cls, gold, pred, same):
    """Every row of the later rounds' batches but the misses each round lists; every wrong-answer
    row among them holds (no false positive)."""
    assert verify(gold, pred) is same, (cls, gold, pred)


@pytest.mark.parametrize("rnd", list(ROUNDS))
def test_listed_misses_are_false_negatives_of_their_round(rnd):
    batches, misses = ROUNDS[rnd]
    rows = {(g, p): s for batch in batches.values() for r in batch.values() for g, p, s in r}
    assert all(k in rows and rows[k] for k in misses)
    assert not KNOWN_MISSES  # round 3 moved the first round's last ones into the asserted class tables


# ----------------------------------------------------------------------------- thinking models

TWICE = "<think>\nx = 3? \\boxed{3}\n</think>\nHmm.\n<think>\nNo: x = 4.\n</think>\nThe answer is \\boxed{4}."


@pytest.mark.parametrize("response,gold,answer,right", [
    ("<think>\nSo x = 3? \\boxed{3}. No, wait.\n</think>\nThe answer is \\boxed{4}.", "4", "4", True),
    ("<think>\nSo x = 3? \\boxed{3}. No, wait.\n</think>\nThe answer is \\boxed{4}.", "3", "4", False),
    ("<think>\nx is \\boxed{4}, I think, but let me check", "4", None, False),   # cut off while thinking
    ("<think>a</think><think>\\boxed{4}", "4", None, False),                      # a second one left open
    # two think blocks, both closed: the answer follows the last (after the first </think> the
    # second <think> would be still open: no answer)
    (TWICE, "4", "4", True), (TWICE, "3", "4", False),
    ("So 3.</think>\n\\boxed{3}\nWait.<think>\nNo, 4.\n</think>\n\\boxed{4}", "4", "4", True),  # the prompt opened one
    ("Thinking done.</think>\n\\boxed{4}", "4", "4", True),   # the prompt opened it (R1's template)
    ("No thinking: \\boxed{4}", "4", "4", True),
])
def test_a_thinking_models_answer_is_what_follows_its_thinking(response, gold, answer, right):
    """The grader reads a response after its last </think>; a \\boxed{} inside unfinished thinking
    is no answer (math_reward's no-answer penalty applies), evaluation and training alike."""
    assert reward.grade(response, gold) == (answer, right)
    want = 1.0 if right else -0.5 if answer is None else 0.0
    assert reward.math_reward(response, gold, no_answer_penalty=0.5) == want
    assert reward.make_grader("rule")(response, gold) == max(want, 0.0)


def test_a_prompt_that_opens_thinking():
    assert reward.thinking_opened("<|im_start|>assistant\n<think>\n")
    assert not reward.thinking_opened("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # Qwen3, thinking off
    assert not reward.thinking_opened("<|im_start|>assistant\n")
