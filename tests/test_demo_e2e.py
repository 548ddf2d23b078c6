"""The README's demo command, shortened: prepare (few pre-training steps), 3 RL steps of
configs/demo.yaml under torchrun with 2 ranks and the real vLLM, eval.py on the final
checkpoint, plot.py. Each stage reads what the one before it wrote, as a user's run does."""
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow


def sh(*cmd):
    out = subprocess.run(list(cmd), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return out.stdout + out.stderr


def test_the_demo_pipeline_end_to_end(tmp_path):
    pytest.importorskip("matplotlib")
    demo_dir, py = str(tmp_path / "demo"), sys.executable
    out = sh(py, "demo.py", "prepare", "--out", demo_dir, "--steps", "4", "--n-eval", "16")
    assert re.search(r"held-out accuracy at T=1: [\d.]+% on 16 problems", out), out
    for split in ("train", "test", "sft"):
        assert os.path.getsize(os.path.join(demo_dir, "data", f"{split}.jsonl")) > 0

    rl = os.path.join(demo_dir, "rl")
    sh(py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py",
       "--config", "configs/demo.yaml",
       "--set", f"model={demo_dir}/model", "--set", f"train_data={demo_dir}/data/train.jsonl",
       "--set", f"eval_data={demo_dir}/data/test.jsonl", "--set", f"out_dir={rl}",
       "--set", "steps=3", "--set", "prompts_per_step=4", "--set", "group_size=4",
       "--set", "eval_max_problems=8", "--set", "save_every=0")
    rows = [json.loads(line) for line in open(os.path.join(rl, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # step 0: held-out accuracy before RL
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in rows[-1]
    for r in rows[1:]:
        assert 0.0 <= r["reward/accuracy"] <= 1.0 and r["actor/entropy"] > 0 and r["timing/rollout"] > 0
    final = os.path.realpath(os.path.join(rl, "final"))
    assert os.path.basename(final) == "step_000003"

    res_path = str(tmp_path / "results.json")
    sh(py, "eval.py", "--ckpt", os.path.join(rl, "final"), "--data",
       f"{demo_dir}/data/test.jsonl", "-n", "2", "--temperature", "1.0", "--top-p", "1.0",
       "--out", res_path)
    res = json.load(open(res_path))
    bench = next(iter(res["benchmarks"].values()))
    assert bench["problems"] == 500 and bench["n"] == 2 and 0.0 <= bench["accuracy"] <= 1.0

    sh(py, "plot.py", rl)
    assert os.path.getsize(os.path.join(rl, "curves.png")) > 10_000
