"""Rules of the training step, pinned value by value: DAPO's reward scale and overlong shaping,
"correct" as the grader's verdict (never a positive shaped reward)."""
import pytest

import reward
import rollout
import train

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


def test_format_reward_below_one():
    with pytest.raises(train.UserError, match="format_reward must be < 1"):
        cfg(format_reward=1.0)
