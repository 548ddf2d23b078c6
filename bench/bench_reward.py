"""Benchmark of reward.verify: verifications per second and p50/p99/max latency, on one core.

Realistic set: every problem of the benchmark files (MATH-500, Minerva, OlympiadBench, GSM8K, AIME 24,
AMC 23) graded against a correct and a wrong model-style response: a <think> block, then a boxed
answer. The correct one boxes the gold in another way of writing it (\\dfrac, \\left( \\right), a
decimal, reordered list, `x = ...`, a unit, thousands commas, ...); the wrong one boxes a nearby
different answer (the next problem's gold, or the gold with a number changed).
Hostile set: the inputs of the fuzz test (huge towers, deep nesting, 100k-character strings, ...).
Class tables: tests/grader_cases.py, the rows of each class of misjudgement of issue 14; the
agreement per class is printed (the speed sets measure speed; these measure judgement).

    python bench/bench_reward.py [--data ../shared/data] [--limit N] [--classes-only]
    (the class tables, then the batches of rounds 2 and 3 of tests/grader_cases.py, each apart)
    python bench/bench_reward.py --grader-dir OLD_CHECKOUT   # the same figures for another reward.py
    python bench/bench_reward.py --grader math_verify         # math-verify alone
    python bench/bench_reward.py --demo [--steps 200] [--corrupt 0.05]   # the demo's grading per step

--grader-dir imports reward.py / mathexpr.py from another directory (e.g. an old commit checked
out with `git worktree add`), so that before/after figures come from the same script and cases.

--demo times training's grading of the demo (configs/demo.yaml: 16 prompts x 8 samples a step) on
demo.py's arithmetic word problems: per step, 16 problems of demo.generate_rows, 8 responses each in
the pre-training solutions' form (column lines, then the boxed result; a slip of one in a column
with demo.SLIP_PROB, carried to a wrong box), a tenth of them cut short before the box (a response
over max_new_tokens), and with --corrupt a share with one character of the box replaced (a sampled
slip of the pen); each graded as train.py grades (make_grader, inside reward.guarded). Printed: the
median and mean seconds per step, and how often math-verify was asked.

Caches are cleared before each set, so every distinct answer is parsed once, as in training where
each gold is graded against a group of responses. With the default grader, the number of pairs on
which math-verify's second opinion was asked is printed per set. Also printed: the accuracy on the realistic set
(a correct response must verify, a wrong one must not), which is a sanity check, not a quality score.
"""
import argparse
import json
import os
import random
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
for _i, _a in enumerate(sys.argv):  # before `import reward`: which reward.py to measure
    if _a == "--grader-dir" and _i + 1 < len(sys.argv):
        sys.path.insert(0, os.path.abspath(sys.argv[_i + 1]))
import reward  # noqa: E402

FILES = ["math500", "minerva_math", "olympiadbench", "gsm8k_test", "aime24", "amc23"]


def rewrite(gold, rng):
    """An equivalent way of writing `gold`, as a model might (falls back to gold itself)."""
    options = [gold]
    if "\\frac" in gold:
        options.append(gold.replace("\\frac", "\\dfrac"))
    m = re.fullmatch(r"(-?)\\frac\{(\d+)\}\{(\d+)\}", gold)
    if m and int(m.group(3)) in (2, 4, 5, 8, 10, 16, 20, 25, 40, 50, 100):
        options.append(m.group(1) + str(int(m.group(2)) / int(m.group(3))))
    if m:
        options.append(f"{m.group(1)}{m.group(2)}/{m.group(3)}")
    if gold.startswith("(") and gold.endswith(")") and "," in gold:
        options.append("\\left(" + gold[1:-1] + "\\right)")
    if re.fullmatch(r"-?\d+", gold):
        options += [f"{int(gold):,}", gold + ".0", f"x = {gold}", gold + " \\text{ units}"]
    if re.fullmatch(r"[^(){}\[\]]+(,[^(){}\[\]]+)+", gold) and not re.search(r",\\!|\d,\d{3}", gold):
        # a bare list (not a number with thousands commas): reorder it
        items = gold.split(",")
        rng.shuffle(items)
        options.append(", ".join(i.strip() for i in items))
    if re.fullmatch(r"-?\d*\.\d+(e-?\d+)?", gold):
        options.append(f"{float(gold):.6g}".replace("e+", "e"))
    if " " in gold and not re.search(r"[a-z]{2,} [a-z]{2,}", gold):  # not prose
        options.append(gold.replace(" ", ""))
    return rng.choice(options)


def perturb(gold, other, rng):
    """A wrong answer close to the gold: a changed number, else another problem's gold."""
    nums = list(re.finditer(r"\d+", gold))
    if nums and rng.random() < 0.6:
        m = rng.choice(nums)
        return gold[:m.start()] + str(int(m.group()) + rng.choice([1, 2, 10])) + gold[m.end():]
    return other


def response(answer, rng):
    steps = ["Let $x = 3$.", "Then $x^2 + 1 = 10$.", "We compute $\\frac{1}{2} + \\frac{1}{3}$.",
             "So the sum is $12$.", "Check: $2 \\cdot 6 = 12$."]
    think = " ".join(rng.choice(steps) for _ in range(30))
    return (f"<think>\n{think}\n</think>\n\nThe computation gives the result.\n"
            f"Therefore, the final answer is $\\boxed{{{answer}}}$.")


def realistic_pairs(data, limit):
    rng = random.Random(0)
    pairs = []
    for name in FILES:
        path = os.path.join(data, name + ".jsonl")
        if not os.path.exists(path):
            continue
        rows = [json.loads(line) for line in open(path, encoding="utf-8")][:limit]
        for i, row in enumerate(rows):
            gold, other = row["answer"], rows[(i + 1) % len(rows)]["answer"]
            pairs.append((gold, response(rewrite(gold, rng), rng), True))
            wrong = perturb(gold, other, rng)
            if wrong != gold and not reward.verify(gold, wrong):  # the next gold may be equal
                pairs.append((gold, response(wrong, rng), False))
    return pairs


def clear_caches():
    for f in (getattr(reward, n, None) for n in ("_clean", "_structure", "_parse")):
        if f is not None:
            f.cache_clear()


def run(pairs, verify):
    clear_caches()
    times, results = [], []
    t_all, cpu_all = time.perf_counter(), time.thread_time()
    cpu_times = []
    for gold, pred, _ in pairs:
        t0, c0 = time.perf_counter(), time.thread_time()
        results.append(verify(gold, pred))
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.thread_time() - c0)
    total, cpu = time.perf_counter() - t_all, time.thread_time() - cpu_all
    times.sort()
    q = lambda p: times[min(len(times) - 1, int(p * len(times)))] * 1e3
    global CPU_RATE, CPU_P99, CPU_MAX  # CPU time: comparable when other work loads the machine
    cpu_times.sort()
    CPU_RATE, CPU_P99, CPU_MAX = len(pairs) / cpu, cpu_times[int(0.99 * len(cpu_times))] * 1e3, cpu_times[-1] * 1e3
    return results, len(pairs) / total, q(0.5), q(0.99), times[-1] * 1e3


CPU_RATE = CPU_P99 = CPU_MAX = None


ASKED = [0]  # math-verify's second opinions asked (second_opinion.ask calls), when the grader has one


def count_second_opinions():
    """Count second_opinion.ask's calls in ASKED (reward._ask_math_verify's, in a tree from before
    second_opinion.py; a reward.py without a second opinion: nothing)."""
    try:
        import second_opinion as where
        name = "ask"
    except ImportError:
        where, name = reward, "_ask_math_verify"
    ask = getattr(where, name, None)
    if ask is None:
        return

    def counted(*a):
        ASKED[0] += 1
        return ask(*a)
    setattr(where, name, counted)


def demo_steps(steps, corrupt, seed=0):
    """[[(response, gold)] * 128] per step: demo.py's problems and solution-form responses (see --demo)."""
    import demo
    rng, out = random.Random(seed), []
    for step in range(steps):
        rows = demo.generate_rows(16, 1000 + step)[0]
        batch = []
        for row in rows:
            a, op, b = re.fullmatch(r"(\d+)([-+])(\d+)", row["solution"].split("\n")[0]).groups()
            for _ in range(8):
                slip = None
                if rng.random() < demo.SLIP_PROB:
                    slip = (rng.randrange(len(str(max(int(a), int(b))))), rng.choice((-1, 1)))
                text = demo.worked_solution(int(a), op, int(b), slip)
                if rng.random() < 0.1:  # cut short before the box
                    text = text[:rng.randrange(1, text.index("\\boxed"))]
                elif rng.random() < corrupt:  # one character of the box replaced
                    i = text.index("{", text.index("\\boxed")) + 1 + rng.randrange(len(text) - text.index("\\boxed") - 8)
                    text = text[:i] + rng.choice("0123456789+-=.,()x ") + text[i + 1:]
                batch.append((text, row["answer"]))
        out.append(batch)
    return out


def demo_grading(grader, steps, corrupt):
    """Seconds of training's grading per demo step (make_grader's reward inside reward.guarded), in
    wall clock and in this thread's CPU time."""
    batches = demo_steps(steps, corrupt)
    clear_caches()
    per_step, cpu, failed, right = [], [], {"errors": 0, "timeouts": 0}, 0
    for batch in batches:
        t0, c0 = time.perf_counter(), time.thread_time()
        for text, gold in batch:
            right += (reward.guarded(10.0, lambda: grader(text, gold), text, failed) or 0.0) >= 1.0
        per_step.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    n = sum(map(len, batches))
    print(f"demo: {steps} steps x {len(batches[0])} responses (corrupt {corrupt}); right {right}/{n}; "
          f"grading failures {failed['errors'] + failed['timeouts']}; math-verify asked {ASKED[0]} times")
    print(f"  seconds per step: median {sorted(per_step)[len(per_step) // 2] * 1e3:.2f} ms, "
          f"mean {sum(per_step) / len(per_step) * 1e3:.2f} ms, max {max(per_step) * 1e3:.2f} ms")
    print(f"  in CPU time (comparable on a loaded machine): median {sorted(cpu)[len(cpu) // 2] * 1e3:.2f} ms, "
          f"mean {sum(cpu) / len(cpu) * 1e3:.2f} ms")


def class_tables(verify, show=True):
    """Agreement with the hand-written label on each class table of tests/grader_cases.py."""
    from grader_cases import CLASSES
    total = agree = 0
    print("class tables (tests/grader_cases.py): agreement with the label")
    for name, rows in CLASSES.items():
        wrong = [(g, p, want) for g, p, want in rows if bool(verify(g, p)) is not want]
        total, agree = total + len(rows), agree + len(rows) - len(wrong)
        print(f"  {name:16s} {len(rows) - len(wrong):3d}/{len(rows):<3d}")
        for g, p, want in wrong if show else ():
            print(f"      expected {want}: gold {g!r} vs {p[-120:]!r}")
    print(f"  {'all':16s} {agree:3d}/{total:<3d} ({100 * agree / total:.1f}%)")


def round2(verify, show=True):
    """Agreement per class on the batches of the second and third rounds, the second opinion's and
    issue 56's several answers (tests/grader_cases.py), each apart."""
    import grader_cases
    for batch in ("ROUND2_BATCH1", "ROUND2_BATCH2", "ROUND3_BATCH1", "ROUND3_BATCH2", "SECOND_OPINION_BATCH2",
                  "COLLECTIONS"):
        if not hasattr(grader_cases, batch):
            continue
        total = agree = 0
        print(f"{batch} (tests/grader_cases.py): agreement with the label")
        for name, rows in getattr(grader_cases, batch).items():
            wrong = [(g, p, want) for g, p, want in rows if bool(verify(g, p)) is not want]
            total, agree = total + len(rows), agree + len(rows) - len(wrong)
            fp = sum(not want for *_, want in wrong)
            print(f"  {name:16s} {len(rows) - len(wrong):3d}/{len(rows):<3d} (false positives: {fp})")
            for g, p, want in wrong if show else ():
                print(f"      expected {want}: gold {g!r} vs {p[-120:]!r}")
        print(f"  {'all':16s} {agree:3d}/{total:<3d} ({100 * agree / total:.1f}%)")


def compare_verdicts(old_path, new_path):
    """The pairs (in both files) whose verdict changed, by kind: a change that turns a wrong verdict
    right (an old false negative or false positive fixed) or a right one wrong (a regression)."""
    load = lambda path: {(r["gold"], r["pred"]): r for r in map(json.loads, open(path))}  # noqa: E731
    old, new = load(old_path), load(new_path)
    both = old.keys() & new.keys()
    changed = [k for k in both if old[k]["verdict"] != new[k]["verdict"]]
    fixed = [k for k in changed if new[k]["verdict"] == new[k]["label"]]
    print(f"{len(both)} pairs in both; verdicts changed: {len(changed)} ({len(fixed)} now agree with the "
          f"label, {len(changed) - len(fixed)} no longer do)")
    for k in changed:
        print(f"  {old[k]['verdict']} -> {new[k]['verdict']} (label {new[k]['label']}): gold {k[0]!r} vs "
              f"{reward.extract_answer(k[1])!r}")
    return changed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data"))
    ap.add_argument("--limit", type=int, default=10_000, help="problems per file")
    ap.add_argument("--grader-dir", help="import reward.py from this directory instead")
    ap.add_argument("--grader", default=getattr(reward, "DEFAULT_GRADER", "rule"),
                    help="a name of reward.GRADERS (default: the default grader of the reward.py measured)")
    ap.add_argument("--demo", action="store_true", help="only the demo's grading per step (see above)")
    ap.add_argument("--steps", type=int, default=200, help="--demo: steps")
    ap.add_argument("--corrupt", type=float, default=0.0, help="--demo: share of responses with a character "
                                                               "of the box replaced")
    ap.add_argument("--classes-only", action="store_true", help="only the class tables")
    ap.add_argument("--verdicts", help="write each realistic pair's verdict here (JSONL), to compare "
                                       "two graders' verdicts pair by pair (--compare)")
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), help="compare two --verdicts files and stop")
    ap.add_argument("--no-hostile", action="store_true", help="skip the hostile set (math-verify: 5 s a call)")
    args = ap.parse_args()
    if args.compare:
        return compare_verdicts(*args.compare)
    print(f"reward.py: {os.path.abspath(reward.__file__)}   grader: {args.grader}")
    make = getattr(reward, "make_grader", None)
    grader = make(args.grader) if make is not None else None
    verify = reward.verify if grader is None else grader.verify
    count_second_opinions()
    if args.demo:
        return demo_grading(grader or reward.math_reward, args.steps, args.corrupt)
    class_tables(verify)
    round2(verify)
    if args.classes_only:
        return
    print(f"load average: {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cores")
    t0 = time.perf_counter()
    import mpmath  # noqa: F401  (reward imports it lazily on its slow path; not timed below)
    print(f"import mpmath: {time.perf_counter() - t0:.2f}s (once per process, lazily)")

    pairs = realistic_pairs(args.data, args.limit)
    if not pairs:
        sys.exit(f"no benchmark files found in {args.data}")
    ASKED[0] = 0
    results, rate, p50, p99, mx = run(pairs, verify)
    ok = sum(r == want for r, (_, _, want) in zip(results, pairs))
    n_true = sum(w for *_, w in pairs)
    print(f"realistic: {len(pairs)} pairs ({n_true} correct, {len(pairs) - n_true} wrong responses); "
          f"math-verify asked on {ASKED[0]}")
    print(f"  {rate:8.0f} verifications/s   p50 {p50:.3f} ms   p99 {p99:.3f} ms   max {mx:.1f} ms")
    print(f"  in CPU time: {CPU_RATE:8.0f} verifications/s   p99 {CPU_P99:.3f} ms   max {CPU_MAX:.1f} ms")
    print(f"  agreement with the intended label: {ok}/{len(pairs)}")
    for (g, p, want), r in zip(pairs, results):
        if r != want:
            print(f"    expected {want}: gold {g!r} vs {reward.extract_answer(p)!r}")
    if args.verdicts:
        with open(args.verdicts, "w") as f:
            for (g, p, want), r in zip(pairs, results):
                f.write(json.dumps({"gold": g, "pred": p, "label": want, "verdict": bool(r)}) + "\n")
    if args.grader != "rule":
        base = [reward.verify(g, p) for g, p, _ in pairs]
        diff = sum(a != bool(b) for a, b in zip(base, results))
        print(f"  disagreements with the rule grader: {diff}/{len(pairs)}")

    if args.no_hostile:
        return
    from test_reward import _hostile_inputs
    golds = ["9^{9^{9}}", "\\frac{1}{2}", "x^2+1", "(1,2)", "10^{10^{10}}!", "2"]
    hostile = [(golds[k % len(golds)], s, False) for k, s in enumerate(_hostile_inputs(2000))]
    hostile += [(s, g, False) for g, s, _ in hostile]
    ASKED[0] = 0
    _, rate, p50, p99, mx = run(hostile, verify)
    print(f"hostile: {len(hostile)} calls (each input as pred and as gold); math-verify asked on {ASKED[0]}")
    print(f"  {rate:8.0f} verifications/s   p50 {p50:.3f} ms   p99 {p99:.3f} ms   max {mx:.1f} ms")
    print(f"  in CPU time: {CPU_RATE:8.0f} verifications/s   p99 {CPU_P99:.3f} ms   max {CPU_MAX:.1f} ms")


if __name__ == "__main__":
    main()
