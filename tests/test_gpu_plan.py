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
                                            ("qwen3-0.6b", 596_049_920)])  # Qwen3-0.6B
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
