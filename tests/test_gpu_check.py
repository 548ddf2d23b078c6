"""bench/gpu_check.py, the first command on a GPU machine, in its CPU form: every check passes on a
healthy tree, a broken weight sync is caught, and the gradient comparison (check 5) passes the
packed sdpa kernel against each sequence alone and fails a kernel whose backward is wrong."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_gpu_check_passes_in_its_cpu_form_without_vllm_or_weights(tmp_path):
    """The CPU form as a GPU node without vLLM and without the hub would run it: --backend hf (the
    engine's two checks SKIP, said, not counted) and --random-init on a directory with the model's
    config.json and tokenizer files only; every other check passes, bf16's packed log-probs among
    them, and the exit code is the number of FAILs: 0. (The engine's checks: the test below.)"""
    import shutil

    from demo import make_tiny_model
    made = make_tiny_model(str(tmp_path / "made"), hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128,
                           max_positions=512)
    bare = tmp_path / "no_weights"
    shutil.copytree(made, bare, ignore=shutil.ignore_patterns("*.safetensors"))
    run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_check.py"), "--cpu", "--backend", "hf",
                          "--random-init", "--model", str(bare)],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "(--random-init): rewards and accuracy mean nothing here" in run.stdout, run.stdout
    lines = [line for line in run.stdout.splitlines() if line.startswith(("PASS", "FAIL", "SKIP"))]
    assert [line.split()[0] for line in lines] == ["PASS"] * 5 + ["SKIP"] * 2 + ["PASS"] * 3, run.stdout
    assert all("--backend hf: the engine is not checked" in line for line in lines if line.startswith("SKIP"))
    assert "packed = own (bf16)" in run.stdout and "8 of 8 checks passed" in run.stdout
    # the floor at lr 1e-30: the later mini-batches' ratios exactly 1 (the old pass forwards each
    # mini-batch as the update does), beside TEPO's clip range
    floor = next(line for line in lines if " floor " in line)
    assert "max |log r| 0.0e+00, max |log s_i| 0.0e+00, KL mask on 0.0% of tokens, clipped 0.0% (exact)" in floor, floor
    assert "clip range 1 - 0.0003 / 1 + 0.0004" in floor
    # the speed line at its tiny CPU size, and gpu_plan's step at that speed (a stand-in GPU)
    speed = next(line for line in lines if " speed " in line)
    assert re.search(r"[\d,]+ tokens/s forward\+backward \(\d+ positions in [\d.]+ s\), .*MFU [\d.]+% \(6N", speed)
    # ... of the config's groups (math1.5b's group_size 8), not the one-step check's 4 a prompt
    shape = re.search(r"(\d+) responses of \d+ after (\d+) prompts of", speed)
    assert shape and int(shape[1]) == 8 * int(shape[2]), speed
    assert "checkpointing on, lm_head auto" in speed
    # under it, the same micro-batch through the head of before, without checkpointing, and
    # checkpointing half the layers (compiled: a GPU's only)
    for label in ("lm_head logits (the path of before)", "checkpointing off", "checkpointing off, lm_head logits",
                  "checkpointing the first 1 of 2 layers"):
        assert re.search(rf"\n      speed, {re.escape(label)}: [\d,]+ tokens/s \([\d.]+ s\), MFU [\d.]+%", run.stdout), label
    assert "each layer compiled" not in run.stdout
    assert "update: log-probs from the last hidden states through the LM head in chunks" in run.stdout
    assert re.search(r"gpu_plan, configs/math1.5b-tepo.yaml with this model on 8 x H100 80GB \(a stand-in: "
                     r"this is no GPU it knows\): [\d.]+ s a step at this speed", run.stdout), run.stdout


BROKEN_SYNC = r'''
import sys, tempfile
sys.path.insert(0, ROOT); sys.path.insert(0, ROOT + "/bench")
import gpu_check, ranks, rollout
from demo import make_tiny_model
args = type("A", (), {"cpu": True, "config": ROOT + "/configs/math1.5b-tepo.yaml", "backend": "vllm"})()
with tempfile.TemporaryDirectory() as work:
    model = make_tiny_model(work + "/m", hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128,
                            max_positions=512)
    config = gpu_check.small_config(args, model, work)
    device = ranks.setup_distributed()[2]
    results = []
    gpu_check.engine_and_sync(args, config, model, device, results)   # healthy
    real = rollout.VLLMEngine.update_weights
    rollout.VLLMEngine.update_weights = lambda self, weights: None   # the weights never reach vLLM
    gpu_check.engine_and_sync(args, config, model, device, results)
    print("RESULTS", results)
    ranks.end_distributed()
'''


@pytest.mark.slow
def test_gpu_check_engine_checks_pass_a_sync_and_catch_one_that_does_not_arrive(tmp_path):
    """Checks 3 and 4 with vLLM's CPU build: the engine beside the trainer and a weight sync pass;
    with update_weights a no-op, the sync fails (its fresh samples keep the old weights)."""
    script = tmp_path / "broken.py"
    script.write_text(f"ROOT = {ROOT!r}\n" + BROKEN_SYNC)
    run = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert "RESULTS [True, True, True, False]" in run.stdout, run.stdout[-2000:] + run.stderr[-3000:]
    assert "PASS  weight sync" in run.stdout and "FAIL  weight sync" in run.stdout


# ----------------------------------------------------------------------------- 5. the gradients


@pytest.fixture
def gpu_check_module():
    """bench/gpu_check.py, imported, with one intra-op thread: the tiny model's forwards are too
    small to share, and on a busy machine two threads contend (~20x slower)."""
    import torch
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import gpu_check
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield gpu_check
    torch.set_num_threads(threads)


def packed_row_and_window(gpu_check, model_dir):
    """The check's CPU case: 3 prompts x 4 responses of up to 48 tokens, the tiny model with its
    first layer within a window of 12 positions (shorter than every prompt)."""
    from data import load_tokenizer
    seqs = gpu_check.sequences(load_tokenizer(model_dir), 12, 48, seed=3, per_prompt=4)
    assert len({s.gid for s in seqs}) == 3 and min(len(s.prompt) for s in seqs) > 12
    config = gpu_check.windowed_config(model_dir, 12)
    assert gpu_check.keeps_window(config)
    return seqs, config


def test_the_gradient_check_passes_sdpa_against_itself_and_against_each_sequence_alone(
        gpu_check_module, tiny_model_dir):
    """The comparison of check 5 on what the CPU can run: the packed sdpa kernel's gradients equal
    its own (exactly) and those of each sequence alone through transformers' eager attention (in
    fp32 within float noise; in bf16 within the tolerance of bf16's own rounding)."""
    import torch
    gc = gpu_check_module
    seqs, config = packed_row_and_window(gc, tiny_model_dir)
    cpu = torch.device("cpu")
    same = gc.compare_kernels(tiny_model_dir, config, seqs, "sdpa", "sdpa", cpu)
    assert same["fp32"][0] == 0 and same["bf16"][0] == 0 and same["bf16 noise"][0] > 1e-3
    d = gc.compare_kernels(tiny_model_dir, config, seqs, "sdpa", "eager", cpu)
    assert d["fp32"][0] < 1e-5, d
    assert gc.gradients_agree(d) == {"fp32": True, "bf16": True}, d


def test_the_gradient_check_fails_a_kernel_whose_backward_drops_the_window(
        gpu_check_module, tiny_model_dir, monkeypatch):
    """A packed kernel whose forward is right (check 2 passes it) but whose backward is that of
    attention without the sliding window fails check 5, in fp32 and in bf16."""
    import torch
    import packing
    import tepo
    gc = gpu_check_module
    seqs, config = packed_row_and_window(gc, tiny_model_dir)
    right = packing.packed_attention

    def wrong_backward(module, query, key, value, mask, scaling=None, dropout=0.0, packed_row=None,
                       sliding_window=None, kernel="sdpa", **kwargs):
        out, _ = right(module, query, key, value, mask, scaling, dropout, packed_row, sliding_window, kernel)
        no_window, _ = right(module, query, key, value, mask, scaling, dropout, packed_row, None, kernel)
        return out.detach() + (no_window - no_window.detach()), None  # exactly out; the gradient without the window
    cpu = torch.device("cpu")
    batch = packing.collate(seqs, cpu)
    with torch.no_grad():
        want, _ = tepo.response_logprobs(gc.policy.load_model(tiny_model_dir, "sdpa", config), batch, 1.0, False)
        monkeypatch.setattr(packing, "packed_attention", wrong_backward)
        got, _ = tepo.response_logprobs(gc.policy.load_model(tiny_model_dir, "sdpa", config), batch, 1.0, False)
    assert torch.equal(got, want)  # the forward is right
    d = gc.compare_kernels(tiny_model_dir, config, seqs, "sdpa", "eager", cpu)
    assert gc.gradients_agree(d) == {"fp32": False, "bf16": False}, d
