"""`reward: package.module:function` (config) and `--grader package.module:function` (eval.py): a
reward of one's own, imported at start, checked, and guarded as the built-in graders are."""
import json
import os
import types

import pytest

import eval as ev
import reward
import train
from config import UserError

BASE = ["model=m", "train_data=d"]
SPEC = "tests.custom_rewards:has_seven"


def test_the_config_names_a_reward_of_ones_own():
    cfg = train.load_config(None, BASE + [f"reward={SPEC}", "failed_reward=0"])
    grader = reward.make_grader(cfg.reward)
    assert grader("a 7 here", "1") == 1.0 and grader("none", "1", format_reward=0.25) == 0.25


@pytest.mark.parametrize("spec,message", [
    ("tests.no_such_module:f", "cannot import 'tests.no_such_module' for the reward"),
    ("tests.custom_rewards:nope", "module 'tests.custom_rewards' has no 'nope'"),
    ("tests.custom_rewards:NOT_A_FUNCTION", "is a int, not a function"),
    ("tests.custom_rewards:one_argument", "must take math_reward's arguments"),
    ("sympy", "unknown grader 'sympy'"),
])
def test_a_reward_that_cannot_be_had_is_a_one_line_error(spec, message):
    with pytest.raises(UserError, match=message) as e:
        train.load_config(None, BASE + [f"reward={spec}"])
    assert "\n" not in str(e.value) and str(e.value).startswith("config: reward: ")


def test_eval_takes_it_and_refuses_a_bad_one(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    data = tmp_path / "toy.jsonl"
    data.write_text(json.dumps({"problem": "1 + 6?", "answer": "7"}) + "\n")
    args = ev.parse_args(["--ckpt", str(ckpt), "--data", str(data), "--grader", SPEC])
    judge = ev.make_judge(args.grader)
    assert judge("so \\boxed{7}", "7") == ("7", True) and judge("so \\boxed{8}", "7") == ("8", False)
    with pytest.raises(SystemExit):
        ev.parse_args(["--ckpt", str(ckpt), "--data", str(data), "--grader", "tests.custom_rewards:one_argument"])
    assert "must take math_reward's arguments" in capsys.readouterr().err


def test_it_is_guarded_and_its_failures_counted():
    """A raise of the function is a failed reward call, counted, as a built-in grader's."""
    cfg = train.Config(model="m", train_data="d", reward=SPEC, failed_reward=0.0)
    grader, failed = reward.make_grader(cfg.reward), {"errors": 0, "timeouts": 0}
    sample = types.SimpleNamespace(text="7 #", response_ids=[1, 2])
    assert train.guarded_reward(cfg, grader, sample, "7", failed=failed) == (0.0, False)
    assert failed["errors"] == 1 and "a '#' in the response" in failed["first"]


def test_two_steps_of_training_with_it(tmp_path, tiny_model_dir, train_main):
    """2 RL steps (tiny settings, one rank in this process, the reward unpatched) with `reward:
    tests.custom_rewards:has_seven`: every logged sample's reward is that function's (the rules
    would give a random model 0 everywhere), its raises are counted in reward/errors, and the
    held-out evaluation judges by it too. (The function is imported by name on every rank alike;
    ranks have no code of their own for it.)"""
    from test_train_e2e import metrics, setup_run
    evals = tmp_path / "eval.jsonl"
    evals.write_text("".join(json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                             for i in range(16)))
    cfg, out = setup_run(tmp_path, tiny_model_dir, "own", steps=2, reward=SPEC, failed_reward=0.0,
                         max_reward_errors=1.0, eval_data=str(evals), backend="hf")
    train_main("--config", cfg, reward_fn=None)
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    with open(os.path.join(out, "samples.jsonl")) as f:
        samples = [json.loads(line) for line in f]
    assert samples and all(s["reward"] == (0.0 if "#" in s["response"] else float("7" in s["response"]))
                           for s in samples)
    assert sum(r["reward/mean"] for r in rows[1:]) > 0 and sum(r["reward/errors"] for r in rows[1:]) > 0
    assert any(r.get("eval/accuracy", 0) > 0 for r in rows)


def test_a_failure_of_ones_own_reward_pays_no_more_than_its_wrong_answer():
    """A function of one's own may score a wrong answer below the built-in graders' floor (-1 here):
    its config must say its lowest reward (failed_reward), which a failed call then gets, so that
    stalling the grader never pays more than a wrong answer. Without it the config is refused."""
    with pytest.raises(UserError, match="needs failed_reward") as e:
        train.load_config(None, BASE + ["reward=tests.custom_rewards:plus_minus_one"])
    assert "\n" not in str(e.value)
    cfg = train.Config(model="m", train_data="d", reward="tests.custom_rewards:plus_minus_one",
                       failed_reward=-1.0, reward_timeout=0.3)
    grader, failed = reward.make_grader(cfg.reward), {"errors": 0, "timeouts": 0}
    wrong = train.guarded_reward(cfg, grader, types.SimpleNamespace(text="\\boxed{8}", response_ids=[1]), "7",
                                 failed=failed)
    stalled = train.guarded_reward(cfg, grader, types.SimpleNamespace(text="STALL \\boxed{8}", response_ids=[1]),
                                   "7", failed=failed)
    assert wrong == (-1.0, False) and stalled == (-1.0, False) and failed["timeouts"] == 1
