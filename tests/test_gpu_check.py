"""bench/gpu_check.py, the first command on a GPU machine, in its CPU form: every check passes on a
healthy tree, and a broken weight sync is caught."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_gpu_check_passes_in_its_cpu_form():
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_check.py"), "--cpu"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert [line.split()[0] for line in lines] == ["PASS"] * 5, run.stdout
    assert "5 of 5 checks passed" in run.stdout


BROKEN_SYNC = r'''
import sys, tempfile
sys.path.insert(0, ROOT); sys.path.insert(0, ROOT + "/bench")
import gpu_check, ranks, rollout
from demo import make_tiny_model
rollout.VLLMEngine.update_weights = lambda self, weights: None   # the weights never reach vLLM
args = type("A", (), {"cpu": True, "config": ROOT + "/configs/math1.5b-tepo.yaml"})()
with tempfile.TemporaryDirectory() as work:
    model = make_tiny_model(work + "/m", hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128,
                            max_positions=512)
    config = gpu_check.small_config(args, model, work)
    device = ranks.setup_distributed()[2]
    results = []
    gpu_check.engine_and_sync(args, config, model, device, results)
    print("RESULTS", results)
    ranks.end_distributed()
'''


@pytest.mark.slow
def test_gpu_check_catches_a_weight_sync_that_does_not_arrive(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text(f"ROOT = {ROOT!r}\n" + BROKEN_SYNC)
    run = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert "RESULTS [True, False]" in run.stdout, run.stdout[-2000:] + run.stderr[-3000:]
    assert "FAIL  weight sync" in run.stdout
