"""bench/gpu_plan.py's parameter counts against the published model sizes, and its verdicts on
cases whose answer is plain (a 7B engine cannot hold its weights in 0.4 x 24 GB)."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import gpu_plan  # noqa: E402
import train  # noqa: E402


@pytest.mark.parametrize("key,published", [("1.5b", 1_543_714_304),   # Qwen2.5-Math-1.5B
                                            ("7b", 7_615_616_512),     # Qwen2.5-Math-7B
                                            ("qwen3-0.6b", 596_049_920),   # Qwen3-0.6B
                                            ("qwen3-4b", 4_022_468_096)])  # Qwen3-4B-Base
def test_parameter_counts_match_the_published_models(key, published):
    assert gpu_plan.params(gpu_plan.MODELS[key])[2] == published


def test_verdicts(capsys):
    cfg = train.load_config(os.path.join(ROOT, "configs", "math1.5b-tepo.yaml"))
    gpu_plan.plan(cfg, gpu_plan.model_shapes("7b"), "4090", 8, 0.4, 0.6, 1536, 150)
    out = capsys.readouterr().out
    assert "ENGINE DOES NOT FIT" in out and "rollout: master + Adam + vLLM + ctx" in out
    assert "DOES NOT FIT (engine, above)" in out
    gpu_plan.plan(cfg, gpu_plan.model_shapes("1.5b"), "h100", 8, 0.4, 0.6, 1536, 150)
    out = capsys.readouterr().out
    assert "ENGINE DOES NOT FIT" not in out and "DOES NOT FIT" not in out


def test_the_plan_counts_the_straggler_and_the_evaluation_by_todays_rules():
    """The update's time is the busiest rank's (packing.deal simulated), and evaluation's the busiest
    rank's decode waves: MATH-500 at n = 1 on 8 ranks is one wave now, two on rank 0 alone before;
    the paper protocol 10 against 28."""
    cfg = train.load_config(os.path.join(ROOT, "configs", "math1.5b-tepo.yaml"))
    pos = gpu_plan.step_positions(cfg, 8, 150, 700, 500, equal=0.6, steps=10)
    assert pos["update"] / pos["update_mean"] <= 1.10 < pos["before"] / pos["update_mean"]
    assert (gpu_plan.eval_waves(500, 1, 8, "now"), gpu_plan.eval_waves(500, 1, 8, "before")) == (1, 2)
    paper = [(p, 32 if p < 100 else 4) for p in gpu_plan.PAPER_SIZES.values()]
    assert sum(gpu_plan.eval_waves(p, n, 8, "now") for p, n in paper) == 10
    assert sum(gpu_plan.eval_waves(p, n, 8, "before") for p, n in paper) == 28
