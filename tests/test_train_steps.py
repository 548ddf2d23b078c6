"""How train.py wires its well-tested functions into one RL step, run in this process on one rank
(conftest.train_here: train.main itself, transformers' generate, no subprocess): the advantages a
method asks for, the reference model a loss term reads, the old log-probs of the later
mini-batches, the weight sync after a step with a skipped update, the held-out grading of a
thinking prompt. Each test here was written against a deliberate bug that the rest of the suite
did not catch; the bug is named in its docstring."""
import math
from types import SimpleNamespace

import pytest

import reward
import rollout
import train
from checkpoint import TrainState
from conftest import read_metrics


def alternating_reward():
    """A reward of 1, 0, 1, 0, ... in call order: every group of an even size has reward spread
    (its responses are graded one after another), so every mini-batch trains, on any CPU."""
    calls = [0]

    def fn(response, gold, **kw):
        calls[0] += 1
        return float(calls[0] % 2)
    return fn


def group(rewards):
    samples = [rollout.Sample([1, 2], [3 + i, 4], f"r{i}", [-1.0, -1.0], "stop") for i in range(len(rewards))]
    return train.Group({"prompt": "p", "answer": "7"}, samples, rewards, [r >= 1 for r in rewards])


@pytest.mark.parametrize("method,want", [("drgrpo", [0.75, -0.25, -0.25, -0.25]),
                                         ("grpo", [1.5, -0.5, -0.5, -0.5])])
def test_the_step_takes_the_methods_advantages(method, want):
    """make_sequences reads the method's adv_std_norm: Dr.GRPO centres the rewards [1, 0, 0, 0]
    only (0.75, -0.25, ...); GRPO divides by their std too (1.5, -0.5, ...). Dropping the argument
    made Dr.GRPO divide, and no test trained drgrpo."""
    cfg = train.Config(model="m", train_data="d", method=method, group_size=4, num_minibatches=1)
    (mb,) = train.make_sequences([group([1.0, 0.0, 0.0, 0.0])], cfg=cfg)
    assert [s.adv for s in mb] == pytest.approx(want, abs=1e-5)


def test_the_engine_gets_the_weights_when_any_optimizer_step_was_taken(train_here, monkeypatch):
    """Two mini-batches, the first one's optimizer step skipped (its loss not finite), the
    second's taken: the weights moved, so the engine must get them (Update.changed is any step
    taken; with all(), the engine sampled from stale weights). The poisoned-weights test has one
    mini-batch, so it never mixed the two."""
    assert train.Update([train.OptimizerStep(1.0, False), train.OptimizerStep(1.0, True)], {}).changed
    assert not train.Update([train.OptimizerStep(1.0, False)], {}).changed
    synced, real_step, real_make, calls = [], train.clip_and_step, rollout.make_engine, [0]

    def skip_first(run, loss_sum):
        calls[0] += 1
        return real_step(run, math.nan if calls[0] == 1 else loss_sum)

    def counting_engine(*a, **kw):
        engine = real_make(*a, **kw)
        real_update = engine.update_weights
        engine.update_weights = lambda tensors: (synced.append(1), real_update(tensors))
        return engine
    monkeypatch.setattr(train, "clip_and_step", skip_first)
    monkeypatch.setattr(rollout, "make_engine", counting_engine)
    out = train_here("mixed", reward_fn=alternating_reward(), steps=1, num_minibatches=2)
    (row,) = read_metrics(out)
    assert row["actor/optimizer_steps"] == 2 and row["actor/skipped_updates"] == 1
    assert synced == [1], "the step took one optimizer step of two: the engine must get the weights"


def test_later_mini_batches_read_pi_old_not_their_own_forward(train_here):
    """After the first optimizer step of an RL step the policy has moved, so the later
    mini-batches' ratios to pi_old differ from 1 and kl_old > 0 (the first mini-batch's are exactly
    1 and 0: theta = theta_old there). A trainer that took every mini-batch's own forward as its
    old pass (every ratio 1, PPO's clip and TEPO's mask dead) was caught only by a bf16 precision
    test."""
    out = train_here("old", reward_fn=alternating_reward(), steps=2, num_minibatches=4, lr=1e-2,
                     method="grpo", loss={"kl_coef": 0.0})
    for row in read_metrics(out):
        assert row["actor/optimizer_steps"] == 4
        assert row["actor/kl_old"] > 0, row
        assert row["actor/log_ratio_max"] > 1e-3 and (row["actor/ratio_min"] < 1 or row["actor/ratio_max"] > 1)


def test_the_old_pass_forwards_each_mini_batch_as_the_update_does(train_here, monkeypatch):
    """The old pass computes each later mini-batch's trained sequences in exactly the micro-batches
    (rows, order, cuts) the update forwards them in, and the A = 0 sequences apart: where the
    policy has not moved (lr 1e-30, in bf16) every kernel then has the update's own inputs, so
    log r is 0 wherever the kernels are deterministic (on a GPU too, not only on a CPU whose
    matmuls round a row alike whatever the other rows; gpu_check's floor measures it there). Before, the old pass
    packed mini-batches 2-4 and the A = 0 sequences together, into other rows (a GPU's bf16 matmul,
    tiled by the shape, could round those differently: TEPO's clip at 1 +- 3e-4 and its mask read
    such differences)."""
    calls, real = [], train.lockstep_forwards

    def spy(model, seqs, **kw):
        plan = []
        for item in real(model, seqs, **kw):
            plan.append(tuple((id(s), s.in_loss, len(s.resp)) for s in item[0]))
            yield item
        calls.append((kw.get("grad", False), plan))
    monkeypatch.setattr(train, "lockstep_forwards", spy)
    graded = [0]

    def reward_fn(response, gold, **kw):  # groups 0-2 spread, group 3 all right (A = 0)
        graded[0] += 1
        return 1.0 if (graded[0] - 1) % 16 >= 12 else float(graded[0] % 2)
    out = train_here("plans", reward_fn=reward_fn, steps=2, num_minibatches=2, micro_batch_tokens=48,
                     lr=1e-30, train_dtype="bfloat16", dtype="bfloat16")
    steps, cur = [], None  # each step: its old pass's calls (no grad), then the update's
    for grad, plan in calls:
        if not grad and (cur is None or cur[1]):
            cur = ([], [])
            steps.append(cur)
        cur[grad].append(plan)
    assert len(steps) == 2
    for old, update in steps:
        assert len(update) == 2 and all(len(p) >= 2 for p in update)  # two mini-batches, each cut
        # mini-batch 2 (the update's second call): the very micro-batches of the old pass's first
        assert update[1] == old[0]
        # then the A = 0 group's 4 sequences, apart from every trained one
        assert len(old) == 2 and all(not in_loss for mb in old[1] for _, in_loss, _ in mb)
        assert sum(map(len, old[1])) == 4
    for row, (_, update) in zip(read_metrics(out), steps):  # the policy did not move: every ratio 1
        assert row["actor/optimizer_steps"] == 2
        # the step's budget: 16 samples, 3 groups with reward spread, their tokens in the loss
        assert row["rollout/samples_drawn"] == 16 and row["rollout/groups_spread"] == 3
        assert row["actor/trained_tokens"] == sum(n for p in update for mb in p for _, _, n in mb) > 0
        assert row["actor/kl_old"] == 0 and row["actor/log_ratio_max"] == 0
        assert row["actor/ratio_min"] == row["actor/ratio_max"] == 1
        assert row["actor/kl_mask_frac"] == 0
        assert row["actor/kl_mask_grad_share"] == 0 and row["actor/grad_w_kl_mask"] == 0
        assert row["actor/grad_w_policy"] > 0  # the second mini-batch's policy term
        assert row["actor/clip_frac_low"] == row["actor/clip_frac_high"] == 0


def test_the_masks_reference_target_loads_the_reference(train_here):
    """TEPO with `loss.kl_mask_target: ref` and no KL-to-reference term: the mask reads pi_ref, so
    the reference must be loaded (LossConfig.needs_ref; without it the first later mini-batch
    crashed on ref_logp None), and the mask's term acts once the policy has left the reference."""
    out = train_here("ref", reward_fn=alternating_reward(), steps=2, num_minibatches=2, lr=1e-2,
                     loss={"kl_mask_target": "ref", "kl_coef": 0.0})
    rows = read_metrics(out)
    assert all(r["actor/optimizer_steps"] == 2 for r in rows)
    assert rows[-1]["actor/kl_ref"] > 0  # read from pi_ref: the run moved off it
    assert rows[-1]["actor/kl_mask_frac"] > 0
    assert 0 < rows[-1]["actor/kl_mask_grad_share"] < 1


class CannedEngine:
    """Answers every prompt with the same texts, cut off at the length limit."""

    def __init__(self, texts):
        self.texts = texts

    def generate(self, prompts, n=1, **kw):
        return [[rollout.Sample(list(p), [5, 6], t, [-1.0, -1.0], "length") for t in self.texts[:n]]
                for p in prompts]


def test_held_out_grading_of_a_prompt_that_opens_thinking(one_rank):
    """train.evaluate grades as eval.py does: a prompt that opens <think> and a response cut off
    inside the thinking has no answer (0), although it boxes one; with thinking_opened=False it
    scored 1.0. A prompt that opens nothing: the boxed answer counts."""
    for prompt, want in (("Q: 3+4?\n<think>\n", 0.0), ("Q: 3+4?\n", 1.0)):
        cfg = train.Config(model="m", train_data="d", eval_n=1, max_new_tokens=8, eval_data="held.jsonl",
                           reward="rule")
        run = SimpleNamespace(cfg=cfg, rank=0, world=1, engine=CannedEngine(["so \\boxed{7}"]),
                              judge=train.ev.make_judge("rule"), state=TrainState(),
                              eval_rows=[{"problem": "3+4?", "prompt": prompt, "prompt_ids": [1, 2],
                                          "answer": "7"}])
        assert reward.thinking_opened(prompt) == (want == 0.0)
        assert train.evaluate(run)["eval/accuracy"] == want, prompt


def test_sampled_entropy_covers_every_group_drawn(one_rank):
    """rollout/entropy_sampled: -log pi_sampler of the sampled tokens over every sample drawn,
    dynamic sampling's dropped groups too (actor/entropy sees only the groups kept)."""
    cfg = train.Config(model="m", train_data="d", dynamic_sampling=True)
    run = SimpleNamespace(cfg=cfg, rank=0, world=1)
    s = lambda lps: rollout.Sample([1], list(range(len(lps))), "x", lps, "stop")  # noqa: E731
    kept = train.Group({}, [s([-0.5, -1.5]), s([-2.0])], [1.0, 0.0], [True, False])
    dropped = train.Group({}, [s([-0.1, -0.1, -0.1]), s([-0.3])], [1.0, 1.0], [True, True])
    m = train.rollout_metrics(run, groups=[kept], drawn=[kept, dropped], seconds={"rollout": 1.0, "reward": 0.0})
    assert m["rollout/entropy_sampled"] == pytest.approx((0.5 + 1.5 + 2.0 + 0.3 + 0.3) / 7)
    assert m["rollout/samples_drawn"] == 4 and m["rollout/groups_spread"] == 1


@pytest.mark.parametrize("skip_first", [False, True])
def test_the_masks_share_is_read_where_it_can_act(train_here, monkeypatch, skip_first):
    """actor/grad_w_* and actor/kl_mask_grad_share count only the optimizer steps after the RL
    step's first taken one (pi != pi_old: the mask, reading pi_old, can act). Two mini-batches:
    the second acts (a share in (0, 1)); with the first step skipped (not finite) the policy has not
    moved at the second either, so nothing is logged (keyed on k == 0, its zero weight was
    counted)."""
    real_step, calls = train.clip_and_step, [0]

    def step(run, loss_sum):
        calls[0] += 1
        return real_step(run, math.nan if skip_first and calls[0] == 1 else loss_sum)
    monkeypatch.setattr(train, "clip_and_step", step)
    out = train_here(f"share{skip_first}", reward_fn=alternating_reward(), steps=1, num_minibatches=2,
                     lr=1e-2, method="tepo")
    (row,) = read_metrics(out)
    assert row["actor/optimizer_steps"] == 2
    if skip_first:
        assert not any(k.startswith("actor/grad_w_") or k == "actor/kl_mask_grad_share" for k in row), row
    else:
        assert 0 < row["actor/kl_mask_grad_share"] < 1 and row["actor/grad_w_policy"] > 0


def test_the_masks_gradient_weights_are_averaged_over_the_steps_that_read_them(train_here, monkeypatch):
    """K = 3 mini-batches, TEPO's mask reading pi_old: the first mini-batch's gradient weights are
    left out (pi = pi_old there), so actor/grad_w_policy and actor/grad_w_kl_mask are the sums of
    mini-batches 2 and 3's micro-batch values divided by 2, computed here from what policy_loss
    returned. Divided by all 3 optimizer steps, they read low by a third."""
    real_loss, real_step, seen, done = train.micro_batch_loss, train.clip_and_step, [], [0]

    def loss(*a, **kw):
        out = real_loss(*a, **kw)
        seen.append((done[0], {k: float(v) for k, v in out[1].items() if k.startswith("actor/grad_w_")}))
        return out

    def step(run, loss_sum):
        done[0] += 1
        return real_step(run, loss_sum)
    monkeypatch.setattr(train, "micro_batch_loss", loss)
    monkeypatch.setattr(train, "clip_and_step", step)
    out = train_here("w3", reward_fn=alternating_reward(), steps=1, num_minibatches=3, prompts_per_step=6,
                     lr=1e-2, method="tepo")
    (row,) = read_metrics(out)
    assert row["actor/optimizer_steps"] == 3 and row["actor/skipped_updates"] == 0
    assert {k for k, _ in seen} == {0, 1, 2}
    for key in ("actor/grad_w_policy", "actor/grad_w_kl_mask"):
        want = sum(m[key] for k, m in seen if k >= 1) / 2
        assert want > 0 and row[key] == pytest.approx(want, rel=1e-9), key
