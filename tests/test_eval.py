"""eval.py: pass@k and maj@k against independent references, the CLI's errors, and end-to-end runs
on a tiny model that the tests teach to answer \\boxed{7} or \\boxed{8} at random (so that
accuracy, pass@k and maj@k are neither 0 nor 1)."""
import itertools
import json
import math
import os
import subprocess
import sys
from fractions import Fraction

import pytest
import yaml

import eval as ev
import reward
import table

from conftest import BOXED_TEMPLATE as TEMPLATE  # the boxed model's

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------- pass@k, maj@k

def brute_pass_at_k(n, c, k):
    """The fraction of all k-subsets of n samples (c of them correct) holding a correct one."""
    flags = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(flags[i] for i in s) for s in subsets), len(subsets))


def test_pass_at_k_equals_enumeration_over_subsets():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert ev.pass_at_k(n, c, k) == pytest.approx(float(brute_pass_at_k(n, c, k)),
                                                              abs=1e-15), (n, c, k)
    assert ev.pass_at_k(5, 2, 2) == pytest.approx(0.7)        # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert ev.pass_at_k(16, 3, 1) == pytest.approx(3 / 16)    # pass@1 is the mean correctness
    assert ev.pass_at_k(64, 1, 32) == pytest.approx(0.5)      # exact for large n too


def test_pass_at_k_rejects_bad_input():
    for n, c, k in [(4, 1, 5), (4, 5, 1), (4, -1, 1), (4, 1, 0)]:
        with pytest.raises(ValueError, match="pass_at_k needs"):
            ev.pass_at_k(n, c, k)
    with pytest.raises(TypeError):
        ev.pass_at_k(4.0, 1, 1)


def test_maj_at_k_hand_made_cases():
    T, F = True, False
    assert ev.maj_at_k(["7", "8", "7"], [T, F, T], 3)
    assert ev.maj_at_k(["8", "7", "7"], [F, T, T], 3)
    assert not ev.maj_at_k(["8", "7", "7"], [F, T, T], 1)      # only the first k samples vote
    # ties: the cluster whose first answer comes first wins
    assert not ev.maj_at_k(["8", "7"], [F, T], 2)
    assert ev.maj_at_k(["7", "8"], [T, F], 2)
    assert not ev.maj_at_k(["8", "7", "7", "8"], [F, T, T, F], 4)
    # equal answers are grouped by reward.verify: 1/2 = 0.5 = \dfrac12 outvote 1/3
    half = ["1/3", "\\frac{1}{2}", "0.5", "\\dfrac12"]
    correct = [reward.verify("1/2", a) for a in half]
    assert correct == [F, T, T, T]
    assert ev.majority_vote(half) == 1
    assert ev.maj_at_k(half, correct, 4)
    assert not ev.maj_at_k(half, correct, 2)                    # a 1-1 tie: 1/3 came first
    # no extracted answer casts no vote; no answer at all is wrong
    assert not ev.maj_at_k([None, None, "8", None], [F, F, F, F], 4)
    assert ev.maj_at_k([None, None, "7", "8"], [F, F, T, F], 4)
    assert ev.majority_vote([None, None]) is None
    assert not ev.maj_at_k([None, None], [F, F], 2)
    # the grouping function is a parameter
    same_case = lambda a, b: a.lower() == b.lower()
    assert ev.majority_vote(["a", "B", "b"], same=same_case) == 1
    with pytest.raises(ValueError, match="1 <= k <= 2"):
        ev.maj_at_k(["7", "8"], [T, F], 3)
    with pytest.raises(ValueError, match="2 answers but 1"):
        ev.maj_at_k(["7", "8"], [T], 1)


def test_summarize_means_over_problems():
    def s(correct, tokens, finish="stop"):
        return {"answer": "7" if correct else "8", "correct": correct, "tokens": tokens,
                "finish_reason": finish}
    problems = [{"samples": [s(True, 10), s(False, 20, "length")]},
                {"samples": [s(False, 30), s(False, 40, "length")]},
                {"samples": [s(False, 0, "prompt_too_long")] * 2}]
    for p in problems:
        p["metrics"] = ev.problem_metrics(p["samples"], [1, 2])
    m = ev.summarize(problems, [1, 2])
    assert m["problems"] == 3 and m["n"] == 2 and m["prompt_too_long"] == 1
    assert m["accuracy"] == pytest.approx(0.5 / 3) and m["pass@2"] == pytest.approx(1 / 3)
    assert m["maj@1"] == pytest.approx(1 / 3) and m["maj@2"] == pytest.approx(1 / 3)
    assert m["mean_response_tokens"] == 25 and m["truncation_rate"] == 0.5  # generated samples only
    assert m["grader_failures"] == 0


def test_a_grading_call_that_raises_or_hangs_is_a_wrong_sample_counted(monkeypatch, capsys):
    """A grader bug or a hang on one response costs that sample, not the evaluation."""
    import time
    from types import SimpleNamespace

    import rollout

    class Engine:
        def generate(self, prompts, n=1, **kw):
            return [[rollout.Sample(p, [1], f"{p[0]}:{j} \\boxed{{7}}", [-1.0], "stop") for j in range(n)]
                    for p in prompts]

    def judge(text, gold):
        if text.startswith("1:"):
            raise ValueError("grader bug")
        if text.startswith("2:0"):
            time.sleep(30)
        return "7", True
    rows = [{"problem": f"p{i}", "answer": "7"} for i in range(3)]
    records = ev.sample_benchmark(Engine(), "toy", rows, [[0], [1], [2]], n=2, max_new_tokens=4,
                                  temperature=1.0, top_p=1.0, seed=0, chunk_size=2, ks=[1, 2],
                                  judge=judge, reward_timeout=0.2)
    flags = [[(s["correct"], s.get("grader_failed", False)) for s in r["samples"]] for r in records]
    assert flags == [[(True, False)] * 2, [(False, True)] * 2, [(False, True), (True, False)]]
    m = ev.summarize(records, [1, 2])
    assert m["grader_failures"] == 3 and m["accuracy"] == pytest.approx(3 / 6)
    out = capsys.readouterr().out
    assert "toy: 2 grading calls raised and 1 ran over the reward timeout (0.2s)" in out and "grader bug" in out


# ----------------------------------------------------------------------------- the command line

@pytest.fixture
def fake_ckpt(tmp_path):
    """A directory that passes eval's checkpoint check (config.json), with a train_config.yaml."""
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "train_config.yaml").write_text(yaml.safe_dump({"prompt_template": "P {problem}",
                                                         "max_new_tokens": 77}))
    data = tmp_path / "data"
    data.mkdir()
    for f in ("math500.jsonl", "minerva_math.jsonl", "mine.jsonl"):
        (data / f).write_text('{"problem": "1+1?", "answer": "2"}\n')
    return str(d), str(data)


def cli_error(capsys, argv):
    with pytest.raises(SystemExit) as e:
        ev.parse_args(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_cli_defaults_and_checkpoint_settings(fake_ckpt):
    ckpt, data = fake_ckpt
    a = ev.parse_args(["--ckpt", ckpt, "--data-dir", data, "--benchmarks", "math500,minerva,mine",
                       "-n", "4"])
    assert a.files == {"math500": f"{data}/math500.jsonl", "minerva": f"{data}/minerva_math.jsonl",
                       "mine": f"{data}/mine.jsonl"}
    assert a.ks == [1, 4] and a.template == "P {problem}" and a.max_new_tokens == 77
    assert a.chunk_size == 256 and a.temperature == 0.6 and a.top_p == 0.95
    a = ev.parse_args(["--ckpt", ckpt, "--data-dir", data, "--benchmarks", "math500", "--greedy",
                       "--prompt-template", "default", "--max-new-tokens", "9"])
    assert (a.n, a.temperature, a.ks, a.template, a.max_new_tokens) == (1, 0.0, [1], None, 9)
    a = ev.parse_args(["--ckpt", ckpt, "--data", f"{data}/mine.jsonl", "--n", "16", "--k", "8,1"])
    assert a.files == {"mine": f"{data}/mine.jsonl"} and a.ks == [1, 8] and a.n == 16
    assert a.out == os.path.join(ckpt, "eval", "results.json")


def test_the_default_grader_is_the_rules_with_the_second_opinion(fake_ckpt):
    """eval.py grades by the rules, then math-verify where they could not read an answer; `--grader
    rule` is the rules alone (numbers made before), and maj@k groups answers by the same judgement."""
    ckpt, data = fake_ckpt
    assert ev.parse_args(["--ckpt", ckpt, "--data-dir", data, "--benchmarks", "math500"]).grader == "rule+math_verify"
    both, rules = ev.make_judge("rule+math_verify"), ev.make_judge("rule")
    assert both("so \\boxed{\\gcd(12, 8)}", "4") == ("\\gcd(12, 8)", True)
    assert rules("so \\boxed{\\gcd(12, 8)}", "4") == ("\\gcd(12, 8)", False)
    answers, correct = ["5", "\\gcd(12, 8)", "4"], [False, True, True]  # 4 twice, or three answers once
    assert ev.maj_at_k(answers, correct, 3, both.same) is True
    assert ev.maj_at_k(answers, correct, 3, rules.same) is False  # a tie of three: the first, 5, wins


def test_presets_fix_the_protocol_and_yield_to_the_flags_given(fake_ckpt):
    ckpt, data = fake_ckpt
    a = ev.parse_args(["--ckpt", ckpt, "--data-dir", data, "--benchmarks", "math500", "--preset", "paper"])
    assert (a.temperature, a.top_p, a.max_new_tokens, a.template) == (0.6, 0.95, 3072, None)  # chat template
    assert ev.samples_and_ks(a, 30) == (32, [1, 8, 16, 32]) and ev.samples_and_ks(a, 99) == (32, [1, 8, 16, 32])
    assert ev.samples_and_ks(a, 100) == (4, [1, 4]) and ev.samples_and_ks(a, 500) == (4, [1, 4])
    a = ev.parse_args(["--ckpt", ckpt, "--data-dir", data, "--preset", "paper", "--benchmarks", "math500",
                       "-n", "8", "--temperature", "1.0", "--max-new-tokens", "64", "--prompt-template",
                       "Q {problem}"])
    assert ev.samples_and_ks(a, 30) == (8, [1, 8]) and (a.temperature, a.top_p) == (1.0, 0.95)
    assert (a.max_new_tokens, a.template) == (64, "Q {problem}")
    a = ev.parse_args(["--ckpt", ckpt, "--data-dir", data, "--preset", "quick", "--benchmarks", "math500"])
    assert (a.greedy, a.n, a.temperature, a.top_p, a.ks, a.max_new_tokens) == (True, 1, 0.0, 1.0, [1], 3072)
    # quick with a temperature: still one sample per problem, now sampled
    a = ev.parse_args(["--ckpt", ckpt, "--data-dir", data, "--preset", "quick", "--benchmarks", "math500",
                       "--temperature", "0.6"])
    assert (a.greedy, a.n, a.temperature, a.top_p, a.ks) == (False, 1, 0.6, 0.95, [1])
    # without a preset: the defaults of before (n 16, T 0.6, the checkpoint's template and cap)
    a = ev.parse_args(["--ckpt", ckpt, "--data-dir", data, "--benchmarks", "math500"])
    assert ev.samples_and_ks(a, 30) == (16, [1, 8, 16]) and (a.template, a.max_new_tokens) == ("P {problem}", 77)
    # the paper's default benchmark set is all seven: a data dir without them says which are missing
    with pytest.raises(SystemExit):
        ev.parse_args(["--ckpt", ckpt, "--data-dir", data, "--preset", "paper"])


def fake_result(path, method, seed, accs, protocol=None, step="step_000100", run=None, changes=(),
                **settings):
    """A results.json of per-problem accuracies {benchmark: [a, ...]} through eval's own summarize,
    of the checkpoint /runs/<run>/<step> (run: method-s<seed>) trained with `settings` (and
    `changes`: its config_changes records, what resumes changed on the way)."""
    benchmarks = {}
    for name, per_problem in accs.items():
        records = [{"samples": [{"tokens": 1, "finish_reason": "stop"}], "metrics": {"accuracy": a}}
                   for a in per_problem]
        benchmarks[name] = ev.summarize(records, [])
    proto = protocol or {"preset": "paper", "benchmarks": {b: {"n": 4, "problems": len(v)}
                                                           for b, v in accs.items()},
                         "temperature": 0.6, "top_p": 0.95, "max_new_tokens": 3072,
                         "prompt_template": None, "max_problems": None, "grader": "rule", "overrides": []}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        run = run or f"{method}-s{seed}"
        json.dump({"ckpt": f"/runs/{run}/{step}", "method": method, "seed": seed,
                   "train_config": {"method": method, "seed": seed, "out_dir": f"/runs/{run}", "lr": 1e-6,
                                    "loss": {}, **settings},
                   **({"config_changes": list(changes)} if changes is not None else {}),  # None: an old eval.py
                   "protocol": proto, "benchmarks": benchmarks}, f)
    return str(path)


def test_the_table_a_row_per_run_the_mean_over_seeds_and_the_paper_as_reference(tmp_path):
    a = fake_result(tmp_path / "a.json", "tepo", 0, {"math500": [1, 0, 0.5, 0.5], "aime24": [0.25, 0.75]})
    b = fake_result(tmp_path / "b.json", "tepo", 1, {"math500": [1, 1, 0.5, 0.5], "aime24": [0.25, 0.25]})
    c = fake_result(tmp_path / "c.json", "grpo", 0, {"math500": [0, 0, 0, 1], "aime24": [0, 0.5]})
    text = table.write_table([a, b, c], str(tmp_path / "t" / "table.md"))
    lines = {ln.split(" | ")[0].strip("| *"): ln for ln in text.splitlines() if ln.startswith("|")}
    # run a, math500: mean 0.5, sd over problems sqrt(1/6), se sqrt(1/6)/2, t(0.975, 3 df) = 3.182;
    # aime24: 0.5, se 0.25, t(0.975, 1 df) = 12.706; the average's error by the normal quantile
    se_m, se_a = math.sqrt(1 / 6) / 2, 0.25
    half_m, half_a = 100 * 3.182 * se_m, 100 * 12.706 * se_a
    half_avg = 100 * 1.959964 * math.sqrt(se_m ** 2 + se_a ** 2) / 2
    assert lines["tepo (seed 0, tepo-s0/step_000100)"].endswith(
        f"| 50.00 ± {half_m:.2f} | 50.00 ± {half_a:.2f} | 50.00 ± {half_avg:.2f} |")
    # the two tepo seeds: math500 50 and 75, aime24 50 and 25, avg 50 and 50; t(0.975, 1 df) = 12.706
    seeds = lines["tepo, step_000100: mean of 2 seeds"]
    assert seeds.endswith(f"| 62.50 ± {12.706 * 12.5:.2f} | 37.50 ± {12.706 * 12.5:.2f} | 50.00 ± 0.00 |")
    assert "grpo, step_000100: mean" not in text  # one seed: no mean row
    assert lines["tepo as reported by the TEPO paper (its protocol)"].endswith("| 77.20 | n/r | 32.04 |")
    assert lines["grpo as reported by the TEPO paper (its protocol)"].endswith("| n/r | n/r | 30.30 |")
    csv = (tmp_path / "t" / "table.csv").read_text().splitlines()
    assert csv[0].startswith("run,kind,math500,math500_ci95_low,math500_ci95_high,aime24")
    first = csv[1].split(",")
    assert first[-6:-3] == ["50.0000", f"{50 - half_a:.4f}", f"{50 + half_a:.4f}"]
    assert len(csv) == 1 + 3 + 1 + 2


def test_the_papers_numbers_stand_beside_the_paper_protocol_only(tmp_path):
    custom = {"preset": None, "benchmarks": {"held_out": {"n": 4, "problems": 2}}, "temperature": 1.0,
              "top_p": 1.0, "max_new_tokens": 64, "prompt_template": "Q {problem}", "max_problems": None,
              "grader": "rule"}
    a = fake_result(tmp_path / "a.json", "tepo", 0, {"held_out": [1, 0.5]}, protocol=custom)
    text = table.write_table([a], str(tmp_path / "table.md"))
    assert "as reported by the TEPO paper" not in text and "| tepo (seed 0, tepo-s0/step_000100) |" in text


def overrides(argv):
    """preset_overrides of the evaluation `argv` would run, as eval.main computes them."""
    import data
    a = ev.parse_args(argv)
    problems = {b: data.load_problems(f) for b, f in a.files.items()}
    return ev.preset_overrides(a, {b: ev.samples_and_ks(a, len(rows)) for b, rows in problems.items()}, problems)


def test_a_preset_modified_names_each_flag_that_modified_it(fake_ckpt, tmp_path):
    from qwen_math import DATA_DIR, need_shared
    need_shared(DATA_DIR)
    ckpt, data = fake_ckpt
    paper = ["--ckpt", ckpt, "--preset", "paper", "--data-dir", DATA_DIR]
    assert overrides(paper) == [] and overrides(paper + ["--temperature", "0.6", "--top-p", "0.95"]) == []
    assert overrides(paper + ["-n", "4"]) == ["-n 4"]  # avg@4 on AIME too
    assert overrides(paper + ["--top-p", "1.0"]) == ["--top-p 1.0"]  # alone, as each flag below
    assert overrides(paper + ["--data", f"{data}/mine.jsonl", "--temperature", "1.0", "--max-new-tokens",
                              "64", "--max-problems", "2", "--top-p", "0.95"]) == \
        [f"--data mine (rows {ev.rows_digest([{'problem': '1+1?', 'answer': '2'}])[:12]})", "--temperature 1.0",
         "--max-new-tokens 64", "--max-problems 2"]
    assert overrides(paper + ["--benchmarks", "math500,aime24", "-n", "8", "--grader", "rule+math_verify",
                              "--prompt-template", "Q {problem}"]) == \
        ["--benchmarks math500,aime24", "-n 8", "--prompt-template 'Q {problem}'"]
    assert overrides(paper + ["--grader", "rule"]) == ["--grader rule"]  # the rules alone: another grader
    assert overrides(paper + ["--greedy", "--max-new-tokens", "3072"]) == ["--greedy"]
    # the seven benchmarks in another data dir: a row changed is named, the same rows are not
    other = tmp_path / "other"
    other.mkdir()
    for f in ev.BENCHMARKS.values():
        rows = [json.loads(line) for line in open(os.path.join(DATA_DIR, f))]
        if f == "amc23.jsonl":
            rows[3]["answer"] = "12345"
            changed = ev.rows_digest(rows)
        (other / f).write_text("".join(json.dumps({"problem": r["problem"], "answer": r["answer"]}) + "\n"
                                       for r in rows))
    assert overrides(["--ckpt", ckpt, "--preset", "paper", "--data-dir", str(other)]) == \
        [f"--data-dir (other rows of amc23: {changed[:12]})"]  # by content: the same rows elsewhere are equal
    quick = ["--ckpt", ckpt, "--preset", "quick", "--data-dir", DATA_DIR, "--benchmarks", "math500"]
    assert overrides(quick + ["--greedy"]) == ["--benchmarks math500"]
    assert overrides(quick + ["--temperature", "0.6"]) == ["--benchmarks math500", "--temperature 0.6"]
    assert overrides(["--ckpt", ckpt, "--data-dir", DATA_DIR, "--benchmarks", "math500"]) == []  # no preset


def test_the_table_averages_the_seeds_of_one_training_configuration_only(tmp_path):
    """grpo seed 0 and grpo with an entropy bonus seed 1 share a method, not a configuration: two
    rows named apart, no mean (it was 'grpo, final: mean of 2 seeds'); at equal seeds both are
    shown (the second was refused as a second result of one run). Seeds of one configuration,
    written to other out_dirs, are averaged; the runs of an lr sweep are not."""
    grpo = fake_result(tmp_path / "a.json", "grpo", 0, {"math500": [1, 1]}, step="final", run="grpo-s0")
    ent = fake_result(tmp_path / "b.json", "grpo", 1, {"math500": [0, 0]}, step="final", run="grpo-ent-s1",
                      loss={"entropy_coef": 0.001})
    ent0 = fake_result(tmp_path / "c.json", "grpo", 0, {"math500": [0, 1]}, step="final", run="grpo-ent-s0",
                       loss={"entropy_coef": 0.001})
    text = table.write_table([grpo, ent], str(tmp_path / "t.md"))
    assert "mean of" not in text
    assert "| grpo, loss.entropy_coef=0.0 (seed 0, grpo-s0/final) | 100.00" in text
    assert "| grpo, loss.entropy_coef=0.001 (seed 1, grpo-ent-s1/final) | 0.00" in text
    text = table.write_table([grpo, ent0, ent], str(tmp_path / "t.md"))
    assert "| **grpo, loss.entropy_coef=0.001, final: mean of 2 seeds** | 25.00 ± " in text
    assert text.count("mean of") == 1
    sweep = [fake_result(tmp_path / f"lr{i}.json", "tepo", 0, {"math500": [1, 0]}, run=f"tepo-lr{i}", lr=lr)
             for i, lr in enumerate((1e-6, 2e-6))]
    sweep.append(fake_result(tmp_path / "lr0s1.json", "tepo", 1, {"math500": [1, 1]}, run="tepo-lr0-s1"))
    text = table.write_table(sweep, str(tmp_path / "t.md"))
    assert "| tepo, lr=2e-06 (seed 0, tepo-lr1/step_000100) |" in text
    assert "| **tepo, lr=1e-06, step_000100: mean of 2 seeds** | 75.00 ± " in text and text.count("mean of") == 1


def test_a_run_resumed_with_another_config_is_a_configuration_of_its_own(tmp_path):
    """A run trained at lr 1e-6 to step 250 and resumed at 2e-6 (--allow-config-change) ends with
    lr 2e-6 in its train_config.yaml: it was averaged as a third seed of the runs trained at 2e-6
    throughout. Its config_changes name it apart; a change of a key that cannot change the run
    (eval_every) does not; two changes of one key read as a chain."""
    same = [fake_result(tmp_path / f"s{i}.json", "tepo", i, {"math500": [1, 0]}, run=f"s{i}", lr=2e-6)
            for i in (0, 1)]
    changed = fake_result(tmp_path / "c.json", "tepo", 2, {"math500": [0, 0]}, run="c", lr=2e-6, changes=[
        {"step": 250, "resumed_from": "/runs/c/step_000250", "changed": {"lr": [1e-6, 2e-6]}}])
    text = table.write_table(same + [changed], str(tmp_path / "t.md"))
    assert "| **tepo, lr=2e-06, step_000100: mean of 2 seeds** | 50.00 ± 0.00 |" in text
    assert "| tepo, lr=1e-06→2e-06 at step 250 (seed 2, c/step_000100) | 0.00" in text
    assert text.count("mean of") == 1
    free = fake_result(tmp_path / "f.json", "tepo", 2, {"math500": [0, 1]}, run="f", lr=2e-6, changes=[
        {"step": 5, "resumed_from": "/runs/f/step_000005", "changed": {"eval_every": [0, 5]}}])
    assert "| **tepo, step_000100: mean of 3 seeds** |" in table.write_table(same + [free], str(tmp_path / "t.md"))
    chain = fake_result(tmp_path / "ch.json", "tepo", 3, {"math500": [0, 0]}, run="ch", lr=3e-6, changes=[
        {"step": 250, "resumed_from": "x", "changed": {"lr": [1e-6, 2e-6], "steps": [250, 300]}},
        {"step": 300, "resumed_from": "y", "changed": {"lr": [2e-6, 3e-6]}}])
    assert "| tepo, lr=1e-06→2e-06 at step 250→3e-06 at step 300 (seed 3, ch/step_000100) |" in \
        table.write_table(same + [chain], str(tmp_path / "t.md"))
    # each change judged when it was made: DAPO's max_sampling_tries changed while dynamic sampling
    # was on, then dynamic sampling turned off: both named (by the last values alone, the first was
    # free and the run a seed of one that kept 3 tries); a clip range changed under KL-Cov, which
    # reads none, before a switch to Clip-Cov: not named
    dapo = dict(method="dapo", dynamic_sampling=False, max_sampling_tries=5)
    a = fake_result(tmp_path / "d0.json", seed=0, accs={"math500": [1, 0]}, run="d0", changes=[
        {"step": 50, "resumed_from": "x", "changed": {"max_sampling_tries": [3, 5]}},
        {"step": 100, "resumed_from": "y", "changed": {"dynamic_sampling": [True, False]}}], **dapo)
    b = fake_result(tmp_path / "d1.json", seed=1, accs={"math500": [1, 0]}, run="d1", changes=[
        {"step": 100, "resumed_from": "y", "changed": {"dynamic_sampling": [True, False]}}],
                    **{**dapo, "max_sampling_tries": 3})
    text = table.write_table([a, b], str(tmp_path / "t.md"))
    assert "mean of" not in text and "max_sampling_tries=3→5 at step 50" in text
    cov = fake_result(tmp_path / "k.json", seed=0, accs={"math500": [1, 0]}, run="k", method="clipcov", changes=[
        {"step": 50, "resumed_from": "x", "changed": {"loss.clip_high": [0.28, 0.5]}},
        {"step": 100, "resumed_from": "y", "changed": {"method": ["klcov", "clipcov"]}}], loss={"clip_high": 0.5})
    text = table.write_table([cov], str(tmp_path / "t.md"))
    assert "| klcov→clipcov at step 100 (seed 0, k/step_000100) |" in text and "clip_high" not in text


def test_results_of_an_older_eval_read_the_changes_from_the_checkpoint(tmp_path, capsys):
    """A results.json written before eval.py recorded config_changes: read from its checkpoint when
    that is still there; else taken as unchanged, and said."""
    ckpt = tmp_path / "runs" / "c" / "step_000100"
    ckpt.mkdir(parents=True)
    (ckpt / "config_changes.jsonl").write_text(json.dumps(
        {"step": 50, "resumed_from": "x", "changed": {"lr": [1e-6, 2e-6]}}) + "\n")
    old = fake_result(tmp_path / "o.json", "tepo", 0, {"math500": [1, 0]}, run="c", changes=None, lr=2e-6)
    result = json.loads(open(old).read())
    result["ckpt"] = str(ckpt)
    open(old, "w").write(json.dumps(result))
    other = fake_result(tmp_path / "s.json", "tepo", 1, {"math500": [1, 1]}, run="s", lr=2e-6)
    assert "lr=1e-06→2e-06 at step 50" in table.write_table([old, other], str(tmp_path / "t.md"))
    gone = fake_result(tmp_path / "g.json", "tepo", 2, {"math500": [1, 1]}, run="g", changes=None, lr=2e-6)
    table.write_table([gone, other], str(tmp_path / "t.md"))
    assert f"note: {gone} does not record what resumes changed" in capsys.readouterr().out


def test_eval_records_what_resumes_changed_before_the_checkpoint(tmp_path):
    """results.json's config_changes: the record the checkpoint carries; for a checkpoint written
    before checkpoints carried it, its out_dir's lines before the checkpoint's step (a line torn by
    a kill skipped); none without."""
    import checkpoint
    import runs
    out = tmp_path / "run"
    lines = [{"step": 2, "resumed_from": "a", "changed": {"lr": [1, 2]}},
             {"step": 6, "resumed_from": "b", "changed": {"lr": [2, 3]}}]
    (out / "step_000004").mkdir(parents=True)
    (out / "config_changes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 7, "res')
    assert runs.config_changes_before(str(out / "step_000004")) == lines[:1]
    (out / "config_changes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    checkpoint.write_config_changes(str(out), str(out / "step_000004"))  # a checkpoint of today
    assert checkpoint.read_config_changes(str(out / "step_000004")) == lines
    assert runs.config_changes_before(str(out / "step_000004")) == lines
    (tmp_path / "model").mkdir()
    assert runs.config_changes_before(str(tmp_path / "model")) == []


def test_eval_py_writes_the_checkpoints_changes_into_results_json(tmp_path, tiny_model_dir, monkeypatch):
    """eval.main on a checkpoint that carries config_changes.jsonl puts the records into
    results.json, where the table reads them: the middle link between the checkpoint and the
    table's name for the run."""
    import shutil

    import rollout
    from test_train_steps import CannedEngine
    ckpt = tmp_path / "run" / "step_000004"
    shutil.copytree(tiny_model_dir, ckpt)
    records = [{"step": 2, "resumed_from": "x", "changed": {"lr": [1e-6, 2e-6]}}]
    (ckpt / "config_changes.jsonl").write_text(json.dumps(records[0]) + "\n")
    (ckpt / "train_config.yaml").write_text(yaml.safe_dump({"method": "tepo", "seed": 0, "lr": 2e-6,
                                                           "max_new_tokens": 8, "loss": {}}))
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    monkeypatch.setattr(rollout, "make_engine", lambda *a, **kw: CannedEngine(["\\boxed{2}"]))
    out = tmp_path / "r.json"
    ev.main(["--ckpt", str(ckpt), "--data", str(bench), "-n", "1", "--temperature", "1.0",
             "--backend", "hf", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["config_changes"] == records
    other = fake_result(tmp_path / "s.json", "tepo", 1, {"bench": [1]}, protocol=result["protocol"], lr=2e-6,
                        max_new_tokens=8)
    text = table.write_table([str(out), other])
    assert "| tepo, lr=1e-06→2e-06 at step 2 (seed 0, run/step_000004) |" in text and "mean of" not in text


def test_the_table_never_averages_two_points_of_runs_as_seeds(tmp_path):
    """Seed 0's step_000100 and seed 1's step_000200 are one configuration at two points: no mean
    (grouped under the first checkpoint name seen, they would be averaged as two seeds)."""
    a = fake_result(tmp_path / "a.json", "tepo", 0, {"math500": [1, 1]}, step="step_000100")
    b = fake_result(tmp_path / "b.json", "tepo", 1, {"math500": [0, 1]}, step="step_000200")
    text = table.write_table([a, b], str(tmp_path / "t.md"))
    assert "mean of" not in text
    c = fake_result(tmp_path / "c.json", "tepo", 1, {"math500": [0, 1]}, step="step_000100")
    assert "| **tepo, step_000100: mean of 2 seeds** |" in table.write_table([a, b, c], str(tmp_path / "t.md"))


def test_seeds_may_differ_in_what_cannot_change_the_run_as_a_resume_may(tmp_path):
    """Two grpo seeds that differ in eval_every and micro_batch_tokens follow one trajectory but for
    their seed: one configuration, and a mean (they were two rows named as two configurations,
    "grpo, eval_every=0, micro_batch_tokens=16384" and no mean). Under Clip-Cov selecting per
    micro-batch, micro_batch_tokens changes the loss: two configurations, named by it. A `final`
    checkpoint of 100 steps and one of 200 are other points of the run: not averaged."""
    a = fake_result(tmp_path / "a.json", "grpo", 0, {"math500": [1, 1]}, step="final", run="grpo-s0")
    b = fake_result(tmp_path / "b.json", "grpo", 1, {"math500": [0, 1]}, step="final", run="grpo-s1",
                    eval_every=50, micro_batch_tokens=8192)
    text = table.write_table([a, b], str(tmp_path / "t.md"))
    assert "| grpo (seed 0, grpo-s0/final) | 100.00" in text and "| grpo (seed 1, grpo-s1/final) | 50.00" in text
    # 100 and 50: sd 25 * sqrt(2), se over 2 seeds 25, t(0.975, 1 df) = 12.706
    assert f"| **grpo, final: mean of 2 seeds** | 75.00 ± {12.706 * 25:.2f} |" in text
    cov = dict(method="clipcov", step="final", loss={"cov_batch": "microbatch"})
    c = fake_result(tmp_path / "c.json", seed=0, accs={"math500": [1, 1]}, run="cc-s0", **cov)
    d = fake_result(tmp_path / "d.json", seed=1, accs={"math500": [0, 1]}, run="cc-s1", micro_batch_tokens=8192, **cov)
    text = table.write_table([c, d], str(tmp_path / "t.md"))
    assert "mean of" not in text
    assert "| clipcov, micro_batch_tokens=16384 (seed 0, cc-s0/final) |" in text
    assert "| clipcov, micro_batch_tokens=8192 (seed 1, cc-s1/final) |" in text
    e = fake_result(tmp_path / "e.json", "grpo", 1, {"math500": [0, 1]}, step="final", run="grpo-s1", steps=200)
    text = table.write_table([a, e], str(tmp_path / "t.md"))
    assert "mean of" not in text and "| grpo, steps=200 (seed 1, grpo-s1/final) |" in text
    f = fake_result(tmp_path / "f.json", "grpo", 1, {"math500": [0, 1]}, step="step_000100", run="grpo-s1", steps=200)
    g = fake_result(tmp_path / "g.json", "grpo", 0, {"math500": [1, 1]}, step="step_000100", run="grpo-s0")
    assert "| **grpo, step_000100: mean of 2 seeds** | 75.00" in table.write_table([f, g], str(tmp_path / "t.md"))


def test_the_tables_refusal_names_the_flags_that_make_the_protocols_equal(tmp_path):
    """The demo's pair: the pre-trained model evaluated with eval.py's defaults (no training config:
    the plain prompt, 4,096 tokens) and the final checkpoint with its own template and 64-token cap.
    The refusal said "evaluate both with the same --preset", which does not help; it names the flags,
    the template quoted so that bash gives it back."""
    base = {"preset": None, "benchmarks": {"test": {"n": 4, "problems": 2, "rows_sha256": "ab"}},
            "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 4096, "prompt_template": None,
            "prompt_sha256": "cd", "max_problems": None, "grader": "rule", "overrides": []}
    template = "{problem}\nAnswer in \\boxed{}.\n"
    final = {**base, "max_new_tokens": 64, "prompt_template": template, "prompt_sha256": "ef"}
    a = fake_result(tmp_path / "a.json", None, None, {"test": [1, 0]}, protocol=base, run="demo")
    b = fake_result(tmp_path / "b.json", "tepo", 0, {"test": [1, 1]}, protocol=final, run="demo/rl", step="final")
    with pytest.raises(ev.UserError) as e:
        table.write_table([a, b], str(tmp_path / "t.md"))
    quoted = "$'{problem}\\nAnswer in \\\\boxed{}.\\n'"
    assert str(e.value).endswith(f"evaluate /runs/demo/rl/final again with --max-new-tokens 4096 --prompt-template "
                                 f"default (or /runs/demo/step_000100 with --max-new-tokens 64 --prompt-template {quoted})")
    assert subprocess.run(["bash", "-c", f"printf %s {quoted}"], capture_output=True, text=True).stdout == template
    other = {**base, "preset": "paper", "temperature": 0.6, "top_p": 0.95, "max_problems": 2, "grader": "math_verify",
             "benchmarks": {"test": {"n": 32, "problems": 2, "rows_sha256": "00"}}}
    assert table.flags_to_match(other, base) == ("--preset paper -n 32 the same data for test (their problems or "
                                                 "answers differ) --temperature 0.6 --top-p 0.95 --max-problems 2 "
                                                 "--grader math_verify")
    assert table.flags_to_match(base, other) == ("no --preset -n 4 the same data for test (their problems or answers "
                                                 "differ) --temperature 1.0 --top-p 1.0 no --max-problems --grader rule")
    assert table.flags_to_match({**base, "temperature": 0.0}, base) == "--greedy"
    assert table.flags_to_match({**base, "prompt_sha256": "00"}, base) == \
        "one --prompt-template for both (their checkpoints' chat templates differ)"


def test_the_prompt_and_the_cap_say_where_they_come_from(fake_ckpt):
    ckpt, data = fake_ckpt
    common = ["--ckpt", ckpt, "--data-dir", data, "--benchmarks", "math500"]
    a = ev.parse_args(common)
    assert a.sources == {"prompt_template": "the checkpoint's train_config.yaml",
                         "max_new_tokens": "the checkpoint's train_config.yaml"}
    assert ev.start_lines(a, prompt="P {problem}", chat=False, plan={"math500": (16, [1, 8, 16])},
                          prompts={"math500": [[1, 2, 3]]}, context=None, world=1)[1:3] == [
        "prompt: the template 'P {problem}' (from the checkpoint's train_config.yaml)",
        "response cap: 77 tokens (from the checkpoint's train_config.yaml)"]
    a = ev.parse_args(common + ["--preset", "paper", "--max-new-tokens", "64"])
    assert a.sources == {"prompt_template": "--preset paper", "max_new_tokens": "--max-new-tokens"}
    os.remove(os.path.join(ckpt, "train_config.yaml"))
    a = ev.parse_args(common + ["--prompt-template", "Q {problem}"])
    assert a.sources == {"prompt_template": "--prompt-template", "max_new_tokens": "eval.py's default: the "
                         "checkpoint has no train_config.yaml; --max-new-tokens sets it"} and a.max_new_tokens == 4096


def test_the_table_refuses_a_second_result_of_one_run(tmp_path):
    """Two results of one method, seed and checkpoint (evaluated twice): the mean over seeds would
    count one of them silently; it is an error naming both files."""
    a = fake_result(tmp_path / "a.json", "tepo", 0, {"math500": [1, 0]})
    b = fake_result(tmp_path / "b.json", "tepo", 0, {"math500": [1, 1]})
    with pytest.raises(ev.UserError, match=r"b\.json is a second result of tepo, seed 0, step_000100 \(.*a\.json"):
        table.write_table([a, b], str(tmp_path / "table.md"))


def test_the_table_refuses_results_of_another_protocol_and_files_without_one(tmp_path, capsys):
    a = fake_result(tmp_path / "a.json", "tepo", 0, {"math500": [1, 0]})
    other = json.load(open(a))["protocol"]
    other = {**other, "temperature": 1.0}
    b = fake_result(tmp_path / "b.json", "grpo", 0, {"math500": [1, 0]}, protocol=other)
    with pytest.raises(ev.UserError, match=r"b\.json was evaluated under another protocol than .*a\.json "
                                           r"\(they differ in temperature: \[1\.0\] against \[0\.6\]\); to "
                                           r"compare them, evaluate /runs/grpo-s0/step_000100 again with "
                                           r"--temperature 0\.6 \(or /runs/tepo-s0/step_000100 with --temperature 1\.0\)"):
        table.write_table([a, b], str(tmp_path / "t.md"))
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"benchmarks": {}}))
    with pytest.raises(ev.UserError, match="old.json records no protocol"):
        table.write_table([a, str(old)], str(tmp_path / "t.md"))
    assert not (tmp_path / "t.md").exists()
    run = subprocess.run([sys.executable, "eval.py", "--table", a, b, "--out", str(tmp_path / "t.md")],
                         cwd=ev.os.path.dirname(ev.__file__), capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stderr.startswith("error: --table:") and "another protocol" in run.stderr


def test_an_evaluation_under_another_protocol_does_not_replace_the_earlier_one(tiny_model_dir, tmp_path):
    """The default --out is one per checkpoint: an evaluation with other settings stops at start,
    naming --out, and the earlier results stay as they were (they were overwritten silently)."""
    import shutil
    ckpt = shutil.copytree(tiny_model_dir, tmp_path / "ckpt")
    bench = tmp_path / "bench.jsonl"
    bench.write_text('{"problem": "1+1?", "answer": "2"}\n')
    earlier = fake_result(ckpt / "eval" / "results.json", "tepo", 0, {"math500": [1, 0]})
    before = open(earlier).read()
    with pytest.raises(ev.UserError, match=r"eval/results\.json holds an evaluation under another protocol "
                                           r"\(it differs in benchmarks, .*temperature.*\), .*give --out another file"):
        ev.main(["--ckpt", str(ckpt), "--data", str(bench), "-n", "1", "--temperature", "1.0", "--backend", "hf"])
    assert open(earlier).read() == before and not (ckpt / "eval" / "results_samples.jsonl").exists()
    other = tmp_path / "other.json"
    other.write_text("[1, 2]")
    with pytest.raises(ev.UserError, match=r"other\.json holds something that is not a results\.json"):
        ev.main(["--ckpt", str(ckpt), "--data", str(bench), "-n", "1", "--backend", "hf", "--out", str(other)])


def test_the_same_rows_at_another_path_are_one_protocol(tiny_model_dir, tmp_path):
    """One benchmark's rows, re-encoded (other key order, spacing, an extra key) at another path,
    each evaluated with `--preset quick --data PATH`: one protocol, so --table puts them side by
    side (it refused them: "they differ in overrides: ['--data .../b/held.jsonl'] against
    ['--data .../a/held.jsonl']"). The override names the rows by their digest; the paths stay in
    results.json (config.files). Other rows under the same name are another protocol."""
    import shutil
    rows = [{"problem": "1+1?", "answer": "2"}, {"problem": "2+3?", "answer": "5"}]
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir(), (tmp_path / "c").mkdir()
    (tmp_path / "a" / "held.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "b" / "held.jsonl").write_text("".join(json.dumps({"id": i, "answer": r["answer"], "problem": r["problem"]},
                                                                  indent=None, separators=(" ,", ":  ")) + "\n"
                                                       for i, r in enumerate(rows)))
    (tmp_path / "c" / "held.jsonl").write_text("".join(json.dumps({**r, "answer": "7"}) + "\n" for r in rows))
    results = {}
    for d in "abc":  # three checkpoints (copies of one model): a table has one result per run
        results[d] = str(tmp_path / f"{d}.json")
        ckpt = shutil.copytree(tiny_model_dir, tmp_path / f"model-{d}")
        ev.main(["--ckpt", str(ckpt), "--preset", "quick", "--data", str(tmp_path / d / "held.jsonl"),
                 "--max-new-tokens", "4", "--backend", "hf", "--out", results[d]])
    text = table.write_table([results["a"], results["b"]])
    digest = ev.rows_digest(rows)
    assert f"Protocol: quick, modified by --data held (rows {digest[:12]}), --max-new-tokens 4;" in text
    assert text.count("(no training config)") == 2
    for d in "ab":
        got = json.load(open(results[d]))
        assert got["protocol"]["overrides"] == [f"--data held (rows {digest[:12]})", "--max-new-tokens 4"]
        assert got["config"]["files"] == {"held": str(tmp_path / d / "held.jsonl")}
    with pytest.raises(ev.UserError, match=r"c\.json was evaluated under another protocol than .*a\.json \(they "
                                           r"differ in benchmarks, overrides"):
        table.write_table([results["a"], results["c"]])


@pytest.mark.slow
def test_a_model_without_a_training_config_is_told_its_prompt_and_warned_of_its_responses_cut(
        tiny_model_dir, tmp_path, capsys):
    """The demo's pre-trained model has no training config: eval.py prompted it with its default
    template and let it run to the cap, silently (0.1%). It now says which prompt and cap it uses and
    where each comes from, and warns when most responses of a benchmark hit the cap."""
    bench = tmp_path / "bench.jsonl"
    bench.write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "2+2?", "answer": "4"}\n')
    ev.main(["--ckpt", tiny_model_dir, "--data", str(bench), "-n", "4", "--temperature", "1.0",
             "--max-new-tokens", "8", "--backend", "hf", "--out", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert ("prompt: the plain template (the tokenizer has no chat template) '{problem}\\nPlease reason step by "
            "step, and put your final answer within \\\\boxed{}.\\n' (from eval.py's default: the checkpoint has "
            "no train_config.yaml; --prompt-template sets it)\nresponse cap: 8 tokens (from --max-new-tokens)\n") in out
    assert "warning: bench: 100% of the responses hit the length limit (8 tokens" in out


@pytest.mark.slow
def test_a_long_evaluation_says_at_once_what_it_will_do_and_counts_samples(setup, tmp_path, capfd):
    """Before the engine starts: the benchmarks, problems x samples and their total, the cap and
    how the model's context clips it, the prompts that do not fit, the calls the bar counts; then
    one bar over every sample with its rate. No transformers warning of the tokenizer's 4,096-token
    limit, which is not this model's (256)."""
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"problem": "What is " + "1 plus " * 700 + "1?", "answer": "701"}) + "\n"
                    + json.dumps({"problem": "What is 3 plus 4?", "answer": "7"}) + "\n")
    ev.main(["--ckpt", setup["ckpt"], "--data", setup["bench"], str(long), "-n", "2",
             "--temperature", "1.0", "--max-new-tokens", "240", "--chunk-size", "3", "--backend", "hf",
             "--out", str(tmp_path / "r.json")])
    out, err = capfd.readouterr()
    start = out[:out.index("benchmark ")]  # what is printed before the table of results
    assert f"{setup['ckpt']}: 2 benchmark(s), 20 samples (fx 8 x 2, long 2 x 2)\n" in start
    # prompts of 24-251 tokens: 5-232 tokens of the 256-token context left, where the cap is 240
    assert ("response cap: 240 tokens (from --max-new-tokens); the model's context of 256 tokens clips it to "
            "5-232 tokens for 8 of 10 prompts\n") in start
    assert "warning: 2 prompts do not fit the model's context of 256 tokens: their samples count as wrong" in start
    assert "in 4 generate call(s) on rank 0, whose progress the bar shows as each problem's samples finish" in start
    assert "20/20 [" in err and ("sample/s]" in err or "s/sample]" in err)
    assert "Token indices sequence length" not in err + out


def test_the_table_is_written_where_out_says_only(tmp_path, monkeypatch, capsys):
    """Without --out the table is printed, and no table.md / table.csv lands in the working
    directory (the repository's root, as the commands are run)."""
    a = fake_result(tmp_path / "r" / "a.json", "tepo", 0, {"math500": [1, 0]})
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    ev.main(["--table", a])
    assert os.listdir(cwd) == [] and "| tepo (seed 0, tepo-s0/step_000100) | 50.00" in capsys.readouterr().out
    ev.main(["--table", a, "--out", str(tmp_path / "t" / "table.md")])
    assert sorted(os.listdir(tmp_path / "t")) == ["table.csv", "table.md"]


def test_every_flag_says_what_it_does(monkeypatch):
    """`eval.py --help` describes every flag (--seed, --backend and --dtype had no text), and its
    examples use the README's data directory."""
    import argparse
    seen = {}

    def grab(parser, argv=None):
        seen["parser"] = parser
        raise SystemExit(0)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", grab)
    with pytest.raises(SystemExit):
        ev.parse_args([])
    bare = [a.option_strings for a in seen["parser"]._actions if not a.help]
    assert bare == [] and "../shared" not in ev.__doc__


def test_cli_errors_name_the_problem(fake_ckpt, tmp_path, capsys):
    ckpt, data = fake_ckpt
    err = cli_error(capsys, ["--ckpt", str(tmp_path / "nope"), "--data-dir", data])
    assert "checkpoint not found" in err and "nope" in err
    run = tmp_path / "run"
    (run / "step_000010").mkdir(parents=True)
    (run / "step_000020").mkdir()
    err = cli_error(capsys, ["--ckpt", str(run)])
    assert "holds checkpoints; the latest is" in err and "step_000020" in err
    err = cli_error(capsys, ["--ckpt", ckpt, "--data-dir", data, "--benchmarks", "math500,aime99"])
    assert "unknown benchmark(s) ['aime99']" in err
    assert "'math500', 'mine', 'minerva', 'minerva_math'" in err     # those found are listed
    err = cli_error(capsys, ["--ckpt", ckpt, "--data-dir", data])    # default set: aime24 missing
    assert "unknown benchmark(s)" in err and "aime24" in err
    err = cli_error(capsys, ["--ckpt", ckpt, "--data-dir", data, "--benchmarks", "mine",
                             "-n", "4", "--k", "1,8"])
    assert "--k [8]" in err and "n = 4" in err
    err = cli_error(capsys, ["--ckpt", ckpt, "--data-dir", data, "--benchmarks", "mine",
                             "--greedy", "--k", "2"])
    assert "--k [2]" in err
    err = cli_error(capsys, ["--ckpt", ckpt, "--data-dir", data, "--benchmarks", "mine",
                             "--greedy", "-n", "4"])
    assert "--greedy" in err
    err = cli_error(capsys, ["--ckpt", ckpt, "--data-dir", data, "--benchmarks", "mine",
                             "--temperature", "0"])
    assert "use --greedy" in err
    err = cli_error(capsys, ["--ckpt", ckpt, "--data", str(tmp_path / "x.jsonl")])
    assert "--data file not found" in err
    err = cli_error(capsys, ["--ckpt", ckpt, "--data", f"{data}/mine.jsonl",
                             "--prompt-template", "no placeholder"])
    assert "{problem}" in err


def test_cli_errors_are_one_line_and_a_missing_data_dir_names_the_fetch(fake_ckpt, tmp_path, capsys,
                                                                         monkeypatch):
    """Each error is one line (argparse printed its 9-line usage first); `--ckpt X` with no data
    directory names `python data.py fetch` and `--data` (it said "found: no .jsonl files")."""
    ckpt, data = fake_ckpt
    monkeypatch.delenv("TEPO_DATA_DIR", raising=False)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")                        # no data/ here
    err = cli_error(capsys, ["--ckpt", ckpt])
    assert err.count("\n") == 1 and "error: no benchmarks: --data-dir data does not exist; " \
        "`python data.py fetch --out data` fetches the benchmarks there, or --data FILE.jsonl" in err
    (tmp_path / "elsewhere" / "empty").mkdir()
    err = cli_error(capsys, ["--ckpt", ckpt, "--data-dir", "empty"])
    assert err.count("\n") == 1 and "--data-dir empty holds no .jsonl file" in err
    err = cli_error(capsys, ["--ckpt", ckpt, "--data-dir", data])    # some there, aime24 missing
    assert err.count("\n") == 1 and f"(`python data.py fetch --out {data}` fetches the benchmarks)" in err
    err = cli_error(capsys, ["--ckpt", ckpt, "--data-dir", data, "--benchmarks", "mine", "--bogus"])
    assert err.count("\n") == 1 and err.endswith("error: unrecognized arguments: --bogus\n")
    err = cli_error(capsys, ["--ckpt", str(tmp_path / "nope")])
    assert err.count("\n") == 1 and "checkpoint not found" in err


@pytest.mark.slow
def test_an_error_under_torchrun_is_one_line_once(fake_ckpt, tmp_path):
    """Under torchrun every rank fails alike: the line is printed once (not once per rank, and not
    before argparse's exit left torchrun's report without it), and ends torchrun's report as its
    root cause (ranks.report_error)."""
    ckpt, _ = fake_ckpt
    (tmp_path / "empty").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TEPO_DATA_DIR"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          os.path.join(root, "eval.py"), "--ckpt", ckpt], cwd=tmp_path / "empty", env=env,
                         capture_output=True, text=True, timeout=300)
    line = "eval.py: error: no benchmarks: --data-dir data does not exist"
    lines = (out.stdout + out.stderr).splitlines()
    assert out.returncode != 0 and sum(x.startswith(line) for x in lines) == 1, out.stderr[-3000:]
    assert [x for x in lines if "traceback :" in x][-1].split("traceback : ")[1].startswith(line)


def test_every_rank_samples_every_benchmark_within_one_problem():
    """Problems are dealt round-robin: all covered once, and each rank's share within one problem
    of the others', on any number of ranks (the chunks of before left 7 of 8 ranks idle on a
    benchmark of one chunk: MATH-500 at n = 1)."""
    for n_problems, world in ((11, 1), (11, 2), (11, 3), (500, 8), (30, 8), (3, 8)):
        shares = [ev.my_problems(n_problems, r, world) for r in range(world)]
        assert sorted(i for s in shares for i in s) == list(range(n_problems))
        assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_a_problems_samples_do_not_depend_on_the_call_that_samples_it():
    """sample_benchmark seeds problem i by (seed, benchmark, i), whatever the call and rank: an
    engine that echoes each prompt's seed shows every problem's seed the same on 1 and 3 ranks and
    for any chunk size."""
    from rollout import Sample, derive_seed

    class Echo:
        def generate(self, prompts, n, max_new_tokens, temperature, top_p, seeds):
            return [[Sample(p, [1], f"\\boxed{{{s}}}", [0.0], "stop") for _ in range(n)]
                    for p, s in zip(prompts, seeds)]
    rows = [{"problem": str(i), "answer": "0"} for i in range(7)]
    seen = {}
    for world, chunk in ((1, 7), (3, 2), (3, 1)):
        got = {}
        for rank in range(world):
            for r in ev.sample_benchmark(Echo(), "bench", rows, [[5]] * 7, n=2, max_new_tokens=4,
                                         temperature=1.0, top_p=1.0, seed=3, chunk_size=chunk, ks=[1],
                                         judge=reward.grade, reward_timeout=5, rank=rank, world=world):
                got[r["index"]] = [s["answer"] for s in r["samples"]]
        seen[(world, chunk)] = got
    want = {i: [str(derive_seed(3, "bench", i))] * 2 for i in range(7)}
    assert all(got == want for got in seen.values())


# ----------------------------------------------------------------------------- end to end

PROBLEMS = [("What is 3 plus 4?", "7"), ("What is 5 plus 3?", "8"), ("What is 2 plus 5?", "7"),
            ("What is 1 plus 7?", "8"), ("What is 9 minus 1?", "8"),
            ("What is 12 minus 5?", "\\frac{14}{2}"),
            ("What is " + "1 plus " * 60 + "1?", "61"),   # 400+ characters: longer than the context
            # 244 characters + 7 of TEMPLATE = 251 tokens: 5 left of the 256-token context
            (("Tell me. " * 30)[:227] + "What is 3 plus 4?", "7")]
CAPPED = 7


@pytest.fixture(scope="module")
def setup(tmp_path_factory, boxed_model):
    """conftest.boxed_model (a tiny model that answers \\boxed{7} or \\boxed{8} after TEMPLATE, with a
    train_config.yaml), and a fixture benchmark."""
    root = tmp_path_factory.mktemp("eval")
    bench = root / "fx.jsonl"
    bench.write_text("".join(json.dumps({"problem": p, "answer": a}) + "\n" for p, a in PROBLEMS))
    return {"root": root, "ckpt": boxed_model, "bench": str(bench)}


def eval_args(setup, out, seed=0):
    return ["--ckpt", setup["ckpt"], "--data", setup["bench"], "-n", "4", "--k", "1,2,4",
            "--temperature", "1.0", "--top-p", "1.0", "--chunk-size", "3", "--seed", str(seed),
            "--out", str(out)]


@pytest.fixture(scope="module")
def run0(setup):
    out = setup["root"] / "run0" / "results.json"
    result = ev.main(eval_args(setup, out))
    return result, json.loads(out.read_text()), out


def read_samples(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_end_to_end_results_agree_with_a_regrade_of_the_samples(setup, run0):
    result, saved, out = run0
    assert saved == json.loads(json.dumps(result))
    cfg = saved["config"]
    assert cfg["prompt_template"] == TEMPLATE and cfg["max_new_tokens"] == 24    # the checkpoint's
    assert cfg["n"] == 4 and cfg["k"] == [1, 2, 4] and cfg["max_model_len"] == 256
    assert saved["train_config"] == {"prompt_template": TEMPLATE, "max_new_tokens": 24, "seed": 0}
    m = saved["benchmarks"]["fx"]
    for key in ["problems", "n", "accuracy", "pass@1", "pass@2", "pass@4", "maj@1", "maj@2",
                "maj@4", "mean_response_tokens", "truncation_rate", "prompt_too_long"]:
        assert key in m, key
    for key in ["problems_per_s", "generated_tokens_per_s", "total_s"]:
        assert saved["timing"][key] > 0
    assert m["problems"] == len(PROBLEMS) and m["prompt_too_long"] == 1

    lines = read_samples(saved["samples_file"])
    assert len(lines) == 4 * len(PROBLEMS)
    # an independent re-grade: reward.math_reward on each response, pass@k by enumeration,
    # majority by a separate vote loop
    by_problem = {}
    for s in lines:
        assert set(s) >= {"problem", "gold", "response", "answer", "correct"}
        ok = reward.math_reward(s["response"], s["gold"]) >= 1.0
        by_problem.setdefault(s["index"], []).append((s["sample"], ok, s))
    accuracy, passk, majk = 0.0, {k: 0.0 for k in (1, 2, 4)}, {k: 0.0 for k in (1, 2, 4)}
    for i, group in sorted(by_problem.items()):
        group.sort(key=lambda g: g[0])
        flags = [ok for _, ok, _ in group]
        assert [s["correct"] for _, _, s in group] == flags
        assert group[0][2]["problem"] == PROBLEMS[i][0] and group[0][2]["gold"] == PROBLEMS[i][1]
        accuracy += sum(flags) / 4
        for k in passk:
            passk[k] += float(brute_pass_at_k(4, sum(flags), k))
            votes = []  # [answer, count, correct]
            for _, ok, s in group[:k]:
                a = reward.extract_answer(s["response"])
                if a is None:
                    continue
                for v in votes:
                    if reward.verify(v[0], a):
                        v[1] += 1
                        break
                else:
                    votes.append([a, 1, ok])
            best = max(votes, key=lambda v: v[1], default=None)  # max keeps the first of ties
            majk[k] += bool(best and best[2])
    P = len(PROBLEMS)
    assert 0 < accuracy / P < 1 and 0 < m["maj@4"] < 1          # the check is not vacuous
    assert m["accuracy"] == pytest.approx(accuracy / P)
    for k in passk:
        assert m[f"pass@{k}"] == pytest.approx(passk[k] / P)
        assert m[f"maj@{k}"] == pytest.approx(majk[k] / P)
    gen = [s for s in lines if s["finish_reason"] != "prompt_too_long"]
    assert len(gen) == 4 * (P - 1)
    assert m["mean_response_tokens"] == pytest.approx(sum(s["tokens"] for s in gen) / len(gen))
    assert m["truncation_rate"] == pytest.approx(
        sum(s["finish_reason"] == "length" for s in gen) / len(gen))
    capped = [s for s in gen if s["index"] == CAPPED]  # the context, not max_new_tokens, cut them
    assert 0 < m["truncation_rate"] < 1
    assert all(s["tokens"] == 5 and s["finish_reason"] == "length" for s in capped)
    assert all(s["tokens"] <= 24 and (s["tokens"] == 24) == (s["finish_reason"] == "length")
               for s in gen if s["index"] != CAPPED)


@pytest.mark.slow
def test_same_seed_same_numbers(setup, run0):
    _, first, _ = run0
    again = ev.main(eval_args(setup, setup["root"] / "run0b" / "results.json"))
    assert again["benchmarks"] == first["benchmarks"]
    assert read_samples(again["samples_file"]) == read_samples(first["samples_file"])
    other = ev.main(eval_args(setup, setup["root"] / "run1" / "results.json", seed=1))
    assert [s["response"] for s in read_samples(other["samples_file"])] != \
        [s["response"] for s in read_samples(first["samples_file"])]


@pytest.mark.slow
def test_numbers_do_not_depend_on_the_number_of_ranks(setup):
    """eval.py under torchrun on 2 ranks gives one process's numbers and samples, problem by
    problem (transformers' generate: the dealing and gathering are under test, not the engine; a
    training run's held-out evaluation with vLLM on 2 ranks against eval.py on one process is
    tests/test_train_e2e.py's)."""
    first = ev.main(eval_args(setup, setup["root"] / "hf1" / "results.json") + ["--backend", "hf"])
    out = setup["root"] / "ranks2" / "results.json"
    env = dict(os.environ, PYTHONPATH=REPO)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node", "2", os.path.join(REPO, "eval.py"),
                          *eval_args(setup, out), "--backend", "hf"], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    two = json.loads(out.read_text())
    assert two["config"]["world_size"] == 2
    assert two["benchmarks"] == first["benchmarks"]
    assert read_samples(two["samples_file"]) == read_samples(first["samples_file"])


def test_evaluation_judges_a_thinking_models_answer_after_its_thinking():
    """sample_benchmark as train.py and eval.py call it: a boxed answer inside unfinished thinking
    is wrong, after </think> right; when the prompts open the think block (thinking_opened), a
    response that never closes it has no answer."""
    from rollout import Sample
    texts = ["<think>it is \\\\boxed{7}", "<think>hm</think>\\\\boxed{7}", "\\\\boxed{7}", "done</think> \\\\boxed{7}"]

    class Fixed:
        def generate(self, prompts, n, max_new_tokens, temperature, top_p, seeds):
            return [[Sample(p, [1], texts[p[0]], [0.0], "stop")] for p in prompts]
    rows = [{"problem": str(i), "answer": "7"} for i in range(4)]
    for opened, want in ((False, [False, True, True, True]), (True, [False, True, False, True])):
        records = ev.sample_benchmark(Fixed(), "b", rows, [[i] for i in range(4)], n=1, max_new_tokens=4,
                                      temperature=1.0, top_p=1.0, seed=0, chunk_size=4, ks=[1],
                                      judge=ev.make_judge("rule"), reward_timeout=5, thinking_opened=opened)
        assert [r["samples"][0]["correct"] for r in records] == want, opened
        assert [r["samples"][0]["response"] for r in records] == texts   # the response as written


@pytest.mark.slow
def test_one_benchmark_in_two_encodings_is_one_protocol_and_other_content_another(setup, tmp_path):
    """The protocol's digest is of what the evaluation reads (problems and answers, in order), not
    of the file's bytes: the same rows with other extra keys, key order, escapes and a numeric
    answer share a table; one answer changed, or two rows swapped, is another protocol."""
    rows = [{"problem": p, "answer": a} for p, a in PROBLEMS[:3]]
    encodings = {
        "plain": [json.dumps(r) for r in rows],
        "other": [json.dumps({"source": "x", "answer": int(r["answer"]) if r["answer"].isdigit()
                              else r["answer"], "id": i, "problem": r["problem"]}, ensure_ascii=False,
                             indent=None, separators=(",", ":")) for i, r in enumerate(rows)],
        "changed": [json.dumps({**r, "answer": "9" if i == 1 else r["answer"]}) for i, r in enumerate(rows)],
        "swapped": [json.dumps(r) for r in (rows[1], rows[0], rows[2])]}
    results = {}
    for name, lines in encodings.items():
        f = tmp_path / name / "bench.jsonl"  # one benchmark name: the stem
        f.parent.mkdir()
        f.write_text("\n".join(lines) + "\n")
        out = tmp_path / name / "results.json"
        ev.main(["--ckpt", setup["ckpt"], "--data", str(f), "-n", "2", "--temperature", "1.0",
                 "--top-p", "1.0", "--backend", "hf", "--out", str(out)])
        results[name] = str(out)
    assert (tmp_path / "plain" / "bench.jsonl").read_bytes() != (tmp_path / "other" / "bench.jsonl").read_bytes()
    proto = {name: json.load(open(path))["protocol"] for name, path in results.items()}
    assert proto["plain"] == proto["other"]  # what --table compares
    for name in ("changed", "swapped"):
        assert [k for k in proto["plain"] if proto[name][k] != proto["plain"][k]] == ["benchmarks"], name


def test_the_table_refuses_results_that_digest_files_by_their_bytes(tmp_path):
    """A results.json of before records each benchmark file's bytes, which the table cannot compare
    with a digest of the rows read: it says so, and what to do."""
    proto = {"preset": None, "benchmarks": {"math500": {"n": 4, "problems": 2, "sha256": "ab" * 32}},
             "temperature": 0.6, "top_p": 0.95, "max_new_tokens": 64, "prompt_template": None,
             "max_problems": None, "grader": "rule"}
    a = fake_result(tmp_path / "a.json", "tepo", 0, {"math500": [1, 0]}, protocol=proto)
    with pytest.raises(ev.UserError, match=r"a\.json records its benchmarks by their files' bytes .*: evaluate it again"):
        table.write_table([a], str(tmp_path / "t.md"))


@pytest.mark.slow
def test_the_papers_numbers_are_not_shown_beside_a_modified_paper_protocol(setup, tmp_path):
    """`--preset paper --data FILE --temperature 1.0 --max-new-tokens 24`: a held-out set at other
    settings, which the paper's reported row would be falsely compared with. No reference row, and
    the protocol line names every override."""
    out = tmp_path / "results.json"
    ev.main(["--ckpt", setup["ckpt"], "--preset", "paper", "--data", setup["bench"], "--temperature", "1.0",
             "--max-new-tokens", "24", "--max-problems", "2", "--backend", "hf", "--out", str(out)])
    text = table.write_table([str(out)], str(tmp_path / "table.md"))
    assert "as reported by the TEPO paper" not in text, text
    rows = [json.loads(line) for line in open(setup["bench"])]
    digest = ev.rows_digest(rows)[:12]  # the data is named by its rows, not by where it lies
    assert (f"Protocol: paper, modified by --data fx (rows {digest}), --temperature 1.0, --max-new-tokens 24, "
            f"--max-problems 2; n = 32;") in text


def test_the_data_digest_is_of_problems_and_answers_in_order():
    rows = [{"problem": "1+1?", "answer": "2", "source": "a"}, {"problem": "2+2?", "answer": "4"}]
    same = [{"answer": "2", "problem": "1+1?", "level": 3}, {"problem": "2+2?", "answer": "4"}]
    assert ev.rows_digest(rows) == ev.rows_digest(same)
    assert ev.rows_digest(rows) != ev.rows_digest(rows[::-1])
    assert ev.rows_digest(rows) != ev.rows_digest([rows[0], {"problem": "2+2?", "answer": "5"}])


def test_two_chat_templates_are_two_protocols(tmp_path, tiny_model_dir, monkeypatch):
    """Two checkpoints evaluated without --prompt-template, each under its own chat template (a
    Qwen-like and a Llama-like turn): their protocols differ in the prompt's digest, so --table
    refuses to set them side by side (digesting the --prompt-template flag, None for both, made
    them one protocol)."""
    import shutil

    import rollout
    from test_train_steps import CannedEngine
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    monkeypatch.setattr(rollout, "make_engine", lambda *a, **kw: CannedEngine(["\\boxed{2}"]))
    results = []
    for name, turn in (("qwen", "<|im_start|>user\n{{ m['content'] }}<|im_end|>\n"),
                       ("llama", "<|start_header_id|>user<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>")):
        ckpt = tmp_path / name
        shutil.copytree(tiny_model_dir, ckpt)
        config = json.loads((ckpt / "tokenizer_config.json").read_text())
        config["chat_template"] = "{% for m in messages %}" + turn + "{% endfor %}"
        (ckpt / "tokenizer_config.json").write_text(json.dumps(config))
        out = tmp_path / f"{name}.json"
        ev.main(["--ckpt", str(ckpt), "--data", str(bench), "-n", "1", "--temperature", "1.0",
                 "--max-new-tokens", "8", "--backend", "hf", "--out", str(out)])
        results.append(str(out))
    a, b = (json.loads(open(p).read())["protocol"] for p in results)
    assert a["prompt_template"] is None and b["prompt_template"] is None
    assert a["prompt_sha256"] != b["prompt_sha256"]
    with pytest.raises(ev.UserError, match="evaluated under another protocol"):
        table.write_table(results)


def test_eval_py_marks_the_checkpoint_it_evaluates_until_its_results_are_written(tmp_path, tiny_model_dir,
                                                                                    monkeypatch):
    """Into CKPT/eval/ (the default --out), eval.py writes eval/.running before sampling and removes it
    once results.json is there: the trainer's pruning (checkpoint.evaluated) leaves the checkpoint be
    meanwhile. Elsewhere (--out FILE) it marks nothing."""
    import shutil

    import checkpoint
    import rollout
    from test_train_steps import CannedEngine
    ckpt = tmp_path / "run" / "step_000004"
    shutil.copytree(tiny_model_dir, ckpt)
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    seen = []
    real = ev.sample_benchmark

    def sampling(*a, **kw):
        seen.append((os.path.exists(ckpt / "eval" / ".running"), checkpoint.evaluated(str(ckpt))))
        return real(*a, **kw)
    monkeypatch.setattr(ev, "sample_benchmark", sampling)
    monkeypatch.setattr(rollout, "make_engine", lambda *a, **kw: CannedEngine(["\\boxed{2}"]))
    ev.main(["--ckpt", str(ckpt), "--data", str(bench), "-n", "1", "--temperature", "1.0", "--backend", "hf"])
    assert seen == [(True, True)] and sorted(os.listdir(ckpt / "eval")) == ["results.json", "results_samples.jsonl"]
    ev.main(["--ckpt", str(ckpt), "--data", str(bench), "-n", "1", "--temperature", "1.0", "--backend", "hf",
             "--out", str(tmp_path / "elsewhere" / "r.json")])
    assert seen[1] == (False, True) and sorted(os.listdir(tmp_path / "elsewhere")) == ["r.json", "r_samples.jsonl"]
