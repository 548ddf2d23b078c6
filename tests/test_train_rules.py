"""Rules of the training step, pinned value by value: DAPO's reward scale and overlong shaping,
"correct" as the grader's verdict (never a positive shaped reward) in the step's accuracy, DAPO's
dynamic-sampling filter and the held-out accuracy, and dynamic sampling's quota filled over all
ranks together."""
import json
import os
import subprocess
import sys

import pytest

import reward
import rollout
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RIGHT, WRONG, NONE = "so \\boxed{7}", "so \\boxed{8}", "I give up"  # against the gold "7"


def cfg(**kw):
    return train.Config(model="m", train_data="d", **kw)


def shaped(c, text, n_tokens):
    sample = rollout.Sample([1], [0] * n_tokens, text, [0.0] * n_tokens, "stop")
    return train.shaped_reward(c, reward.math_reward, sample, "7")


def test_dapo_rewards_value_by_value():
    """DAPO's scale (right +1, wrong -1) plus the overlong penalty: 0 up to max_new_tokens -
    overlong_buffer tokens, linear over the buffer, -overlong_factor at max_new_tokens.
    max_new_tokens 100: buffer 100 // 4 = 25, so the penalty starts after token 75."""
    c = cfg(method="dapo", max_new_tokens=100)
    assert (c.wrong_reward, c.overlong_buffer, c.overlong_factor) == (-1.0, 25, 1.0)
    for n, penalty in [(10, 0.0), (75, 0.0), (76, -1 / 25), (88, -13 / 25), (99, -24 / 25), (100, -1.0)]:
        assert shaped(c, RIGHT, n) == (pytest.approx(1.0 + penalty, abs=1e-12), True), n
        assert shaped(c, WRONG, n) == (pytest.approx(-1.0 + penalty, abs=1e-12), False), n
        assert shaped(c, NONE, n) == (pytest.approx(-1.0 + penalty, abs=1e-12), False), n
    # a right answer at the cap is worth more than a short wrong one (0 > -1): the scale's point
    assert shaped(c, RIGHT, 100)[0] == pytest.approx(0.0) and shaped(c, WRONG, 10)[0] == -1.0
    half = cfg(method="dapo", max_new_tokens=100, overlong_buffer=10, overlong_factor=0.5)
    assert [shaped(half, RIGHT, n)[0] for n in (90, 91, 95, 100)] == \
        pytest.approx([1.0, 1.0 - 0.05, 1.0 - 0.25, 0.5], abs=1e-12)
    # the other methods: right 1, wrong 0, no overlong shaping unless asked for
    for method in ("grpo", "drgrpo", "gspo", "tepo"):
        c = cfg(method=method, max_new_tokens=100)
        assert (shaped(c, RIGHT, 100), shaped(c, WRONG, 100)) == ((1.0, True), (0.0, False))


def test_correct_means_the_answer_is_right_not_that_the_reward_is_positive():
    """A format reward makes a wrong, boxed answer's reward positive; it stays wrong."""
    c = cfg(method="grpo", format_reward=0.5, no_answer_penalty=0.2)
    assert shaped(c, RIGHT, 5) == (1.0, True)
    assert shaped(c, WRONG, 5) == (0.5, False)
    assert shaped(c, NONE, 5) == (pytest.approx(-0.2), False)
    d = cfg(method="dapo", format_reward=0.5, max_new_tokens=100)
    assert shaped(d, WRONG, 5) == (-0.5, False)
    # DAPO's filter reads these verdicts: an all-wrong group with rewards 0.5 is dropped, a group
    # of one right and one boxed wrong answer (rewards 1.0 and 0.5, both positive) is kept
    groups = []
    for texts in ([WRONG, WRONG], [RIGHT, WRONG], [RIGHT, RIGHT], [NONE, WRONG]):
        graded = [shaped(c, t, 5) for t in texts]
        groups.append(train.Group({}, texts, [g[0] for g in graded], [g[1] for g in graded]))
    assert train.informative_groups(groups) == [groups[1]]


def test_a_failed_grading_call_scores_exactly_a_wrong_answer_of_its_length():
    """configs/math1.5b-dapo.yaml, 10 tokens short of the 3,072-token cap: the overlong buffer is
    3072 // 4 = 768 tokens, so the penalty runs from token 2,304 and is -(3062 - 2304) / 768 here; a
    wrong answer scores -1 plus that. A grading call that raises, one that runs over reward_timeout,
    and one whose math-verify second opinion is killed (a gcd of a huge binomial, which gets past the
    rules' size guards; ~3 s) score the same and are counted (they scored 0: above every wrong answer)."""
    import time
    path = os.path.join(ROOT, "configs", "math1.5b-dapo.yaml")
    c, quick = train.load_config(path), train.load_config(path, ["reward_timeout=0.3"])
    n = c.max_new_tokens - 10
    wrong = -1.0 - (3062 - 2304) / 768
    grader = reward.make_grader(c.reward)
    sample = rollout.Sample([1], [0] * n, WRONG, [0.0] * n, "length")
    failed = {"errors": 0, "timeouts": 0}
    assert train.guarded_reward(c, grader, sample, "7", failed=failed) == (pytest.approx(wrong, abs=1e-12), False)
    assert failed == {"errors": 0, "timeouts": 0}
    assert train.guarded_reward(c, lambda *a, **k: 1 / 0, sample, "7", failed=failed) == \
        (pytest.approx(wrong, abs=1e-12), False)
    assert train.guarded_reward(quick, lambda *a, **k: time.sleep(100), sample, "7", failed=failed) == \
        (pytest.approx(wrong, abs=1e-12), False)
    stall = rollout.Sample([1], [0] * n, "\\boxed{\\gcd(\\binom{1000000}{500000}, 7)}", [0.0] * n, "length")
    assert train.guarded_reward(c, grader, stall, "7", failed=failed) == (pytest.approx(wrong, abs=1e-12), False)
    assert (failed["errors"], failed["timeouts"]) == (1, 2) and failed["first"].startswith("ZeroDivisionError")


def test_no_shaping_makes_a_failed_grading_call_pay_more_than_a_wrong_answer():
    """Over random shaping configs (method, format_reward, no_answer_penalty, wrong_reward, the
    overlong buffer and factor, the length): a failed call scores the lowest a wrong answer of its
    length scores (a boxed wrong one or one without an answer), whatever the response says."""
    import random
    rng = random.Random(0)
    for trial in range(300):
        cap = rng.randint(4, 300)
        c = cfg(method=rng.choice(["dapo", "grpo", "drgrpo", "gspo", "tepo"]), max_new_tokens=cap,
                format_reward=rng.choice([0.0, rng.uniform(0, 0.99)]),
                no_answer_penalty=rng.choice([0.0, rng.uniform(0, 2)]),
                wrong_reward=rng.choice([None, rng.uniform(-2, 0.5)]),
                overlong_buffer=rng.choice([None, 0, rng.randint(0, cap)]),
                overlong_factor=rng.uniform(0, 2))
        n = rng.randint(1, cap)
        lowest = min(shaped(c, WRONG, n)[0], shaped(c, NONE, n)[0])
        for text in (RIGHT, WRONG, NONE):
            sample = rollout.Sample([1], [0] * n, text, [0.0] * n, "stop")
            failed = {"errors": 0, "timeouts": 0}
            r, correct = train.guarded_reward(c, lambda *a, **k: 1 / 0, sample, "7", failed=failed)
            assert (r, correct, failed["errors"]) == (pytest.approx(lowest, abs=1e-12), False, 1), (trial, c, n)
            assert r <= lowest + 1e-12


def test_format_reward_below_one():
    with pytest.raises(train.UserError, match="format_reward must be < 1"):
        cfg(format_reward=1.0)


@pytest.mark.parametrize("have,total,want", [
    ([2, 2], 4, [2, 2]), ([4, 1], 4, [3, 1]), ([6, 6], 8, [4, 4]), ([10, 1], 8, [7, 1]),
    ([0, 5, 1], 4, [0, 3, 1]), ([3, 3, 3], 7, [3, 2, 2])])
def test_share_out(have, total, want):
    assert train.share_out(have, total) == want


SCRIPT = r'''
import json, sys, torch.distributed as dist
from types import SimpleNamespace
sys.path.insert(0, ROOT)
import reward, rollout, train
import ranks
from checkpoint import TrainState
dist.init_process_group("gloo")
rank = dist.get_rank()
RIGHT, WRONG = "so \\boxed{7}", "so \\boxed{8}"
MIXED, ALL_WRONG = [RIGHT, WRONG], [WRONG, WRONG]
# What this rank's engine samples, call by call, for its 2 prompts (groups of 2): rank 0 has both
# groups informative every time; rank 1 none at first, one at the second call.
PLAN = {0: [[MIXED, MIXED]] * 3, 1: [[ALL_WRONG, ALL_WRONG], [MIXED, ALL_WRONG], [MIXED, MIXED]]}
class Engine:
    calls = 0
    def generate(self, prompts, n=1, **kw):
        Engine.calls += 1
        held_out = prompts[0][0] >= 1000  # the held-out rows' ids below
        plan = [MIXED] * len(prompts) if held_out else PLAN[rank][Engine.calls - 1]
        Engine.calls -= held_out
        return [[rollout.Sample([1], [5, 6], t, [-1.0, -1.0], "stop") for t in texts] for texts in plan]
cfg = train.Config(model="m", train_data="d", method="grpo", dynamic_sampling=True,
                   max_sampling_tries=3, prompts_per_step=4, group_size=2, format_reward=0.5,
                   eval_n=2, max_new_tokens=4, eval_data="held_out.jsonl")
rows = [{"prompt": f"p{i}", "prompt_ids": [i], "answer": "7"} for i in range(40)]
run = SimpleNamespace(cfg=cfg, rank=rank, world=2, engine=Engine(), grader=reward.make_grader("rule"),
                      judge=train.ev.make_judge("rule"), rows=rows, state=TrainState(),
                      eval_rows=[{"problem": f"e{i}", "prompt": f"e{i}", "prompt_ids": [1000 + i], "answer": "7"} for i in range(3)])
rollouts = train.sample_and_grade(run, step=0)
groups, drawn, record = rollouts.groups, rollouts.drawn, rollouts.metrics
out = {"calls": Engine.calls, "kept": len(groups), "drawn": len(drawn), "data_pos": run.state.data_pos,
       "kept_correct": [g.correct for g in groups],
       "record": {k: record[k] for k in ("reward/mean", "reward/accuracy", "reward/groups_kept")},
       "eval": train.evaluate(run)}
parts = [None, None]
dist.all_gather_object(parts, out)
if rank == 0:
    print("RESULT " + json.dumps(parts))
ranks.end_distributed()  # not a bare destroy_process_group: gloo's threads may abort the exit
'''


@pytest.mark.slow
def test_dynamic_sampling_fills_the_global_quota_and_counts_by_correctness(tmp_path):
    """2 gloo ranks, P = 4 groups of 2, a format reward of 0.5 (a wrong boxed answer earns 0.5).
    Draw 1: rank 0 holds 2 informative groups, rank 1 none (2 of 4). Draw 2: rank 0 has 4, rank 1
    has 1: 5 >= 4, so sampling stops there and the ranks keep 3 + 1 (the old code filled a quota
    per rank and had every rank draw a third time). Accuracy counts right answers only: the boxed
    wrong ones earn a positive reward but are wrong, in training and held out."""
    script = tmp_path / "rules.py"
    script.write_text(f"ROOT = {ROOT!r}\n" + SCRIPT)
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node=2", str(script)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    r0, r1 = json.loads(next(ln for ln in res.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    assert (r0["calls"], r1["calls"]) == (2, 2)
    assert (r0["kept"], r1["kept"]) == (3, 1) and (r0["drawn"], r1["drawn"]) == (4, 4)
    assert r0["data_pos"] == r1["data_pos"] == 8                  # two draws of P prompts
    assert all(c == [True, False] for c in r0["kept_correct"] + r1["kept_correct"])
    # drawn: rank 0 4 mixed groups (4 right of 8), rank 1 2 all-wrong + 1 mixed + 1 all-wrong (1 of 8)
    rec = r0["record"]
    assert rec["reward/accuracy"] == pytest.approx(5 / 16)
    assert rec["reward/mean"] == pytest.approx((5 * 1.0 + 11 * 0.5) / 16)
    assert rec["reward/groups_kept"] == pytest.approx(4 / 8)
    # held out: each of the 3 problems answered right once, wrong (boxed, reward 0.5) once
    assert r0["eval"]["eval/accuracy"] == pytest.approx(0.5) and r0["eval"]["eval/pass@2"] == 1.0


def test_thinking_is_graded_after_it_ends_and_counts_toward_the_cap():
    """A thinking model's response: graded after </think> (unfinished thinking, or thinking the
    prompt opened and the response never closed, is no answer); DAPO's overlong penalty counts the
    thinking tokens with the rest."""
    from rollout import Sample
    cfg = train.Config(model="m", train_data="d", method="dapo", max_new_tokens=40, overlong_buffer=10)
    closed = "<think>" + "x" * 20 + "</think>\\boxed{7}"
    sample = Sample([1], [5] * 36, closed, [0.0] * 36, "stop")   # 36 tokens: 6 into the buffer
    r, correct = train.shaped_reward(cfg, reward.math_reward, sample, "7")
    assert correct and r == pytest.approx(1.0 - 0.6)
    open_ = Sample([1], [5] * 10, "<think>so \\boxed{7}", [0.0] * 10, "length")
    assert train.shaped_reward(cfg, reward.math_reward, open_, "7") == (-1.0, False)
    inside = Sample([1], [5] * 10, "so \\boxed{7}", [0.0] * 10, "length")  # the prompt opened <think>
    assert train.shaped_reward(cfg, reward.math_reward, inside, "7", prompt="User: 3+4?\n<think>\n") == (-1.0, False)
    assert train.shaped_reward(cfg, reward.math_reward, inside, "7", prompt="User: 3+4?\n")[1]


def test_the_start_names_the_ranks_and_warns_of_idle_gpus():
    """ranks.placement_text: plain `python train.py` on an 8-GPU node runs one rank on GPU 0 with
    the whole batch; the start says so and names the torchrun command. No warning where every
    visible GPU has a rank (torchrun's 8), nor on the CPU."""
    from ranks import placement_text
    line, warn = placement_text(1, 1, "cuda", 8, "NVIDIA H200")
    assert line == "ranks: 1 rank, 1 on this node, one GPU each (NVIDIA H200; nccl)"
    assert warn.startswith("warning: this node has 8 GPUs and 1 rank run on it: 7 GPUs stay idle")
    assert "torchrun --nproc_per_node 8 train.py" in warn
    assert placement_text(16, 8, "cuda", 8, "NVIDIA H100")[1] is None  # 2 nodes of 8
    assert placement_text(2, 2, "cpu", 0) == ("ranks: 2 processes on the CPU (gloo)", None)
    assert placement_text(1, 1, "cpu", 4)[1] is None  # a CPU run never warns about GPUs
    # a launcher that does not say how many ranks run on this node: no count, no warning
    assert placement_text(16, 0, "cuda", 8, "X") == ("ranks: 16 ranks, one GPU each (X; nccl)", None)
