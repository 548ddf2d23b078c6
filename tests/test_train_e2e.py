"""train.py end to end, as users run it (subprocesses, torchrun with 2 CPU ranks, real vLLM).

tests/train_patched.py swaps in a toy reward ('7' in the response) so that a random-weight model
gets reward spread and every step really changes the weights.
"""
import json
import os
import subprocess
import sys

import pytest
import torch
import yaml
from safetensors.torch import load_file

import plot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow
VOLATILE = ("timing/",)  # wall-clock fields differ between any two runs


def setup_run(tmp_path, model_dir, name, **overrides):
    data = tmp_path / "toy.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i)})
                                + "\n" for i in range(40)))
    cfg = dict(model=model_dir, train_data=str(data), out_dir=str(tmp_path / name), seed=0,
               prompt_template="{problem} \\boxed{}\n", steps=4, prompts_per_step=4, group_size=4,
               max_prompt_len=64, max_new_tokens=24,
               num_minibatches=2, micro_batch_tokens=256, lr=1e-3, log_samples_every=1)
    cfg.update(overrides)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path), cfg["out_dir"]


def run(config, *extra, nproc=0, patch=("--toy-reward",), check=True):
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
                 f"--nproc_per_node={nproc}"] if nproc else [sys.executable])
    cmd = launcher + [os.path.join(ROOT, "tests", "train_patched.py"), *patch, "--",
                      "--config", config, *extra]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if check and out.returncode:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}")
    return out


def metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def test_resumed_run_equals_uninterrupted_run(tmp_path, tiny_model_dir):
    """4 steps in one go == 2 steps, then --resume for 2 more: same metrics, same weights.

    The reward draws from torch's, Python's and numpy's RNGs (--noisy-reward), so the metrics
    agree only if a resume restores all three. A held-out prompt longer than max_prompt_len is
    dropped and counted, not fatal."""
    evals = tmp_path / "eval.jsonl"
    evals.write_text("".join(json.dumps({"problem": p, "answer": "2"}) + "\n"
                             for p in ["What is 1 + 1?", "What is 2 + 0?", "Long " * 40 + "1 + 1?"]))
    noisy = ("--noisy-reward",)
    cfg_a, out_a = setup_run(tmp_path, tiny_model_dir, "whole", save_every=2, eval_data=str(evals),
                             eval_every=2, log_samples_every=2)
    run(cfg_a, nproc=2, patch=noisy)
    cfg_b, out_b = setup_run(tmp_path, tiny_model_dir, "resumed", save_every=2, eval_data=str(evals),
                             eval_every=2, log_samples_every=2)
    run(cfg_b, "--set", "steps=2", nproc=2, patch=noisy)
    assert sorted(os.listdir(out_b)) == ["config.yaml", "final", "metrics.jsonl", "samples.jsonl",
                                         "step_000002"]
    # A kill after step 3 was logged, before it was saved: its lines are dropped, then logged anew;
    # a kill in the middle of writing step 4's line left half of it: dropped too, and said.
    for name in ("metrics.jsonl", "samples.jsonl"):
        with open(os.path.join(out_b, name), "a") as f:
            f.write(json.dumps({"step": 3, "stale": True}) + "\n" + '{"step": 4, "rew')
    res = run(cfg_b, "--resume", nproc=2, patch=noisy)
    for name in ("metrics.jsonl", "samples.jsonl"):
        assert f"--resume: dropped 1 torn line(s) of {out_b}/{name}" in res.stdout, res.stdout[-2000:]

    ma, mb = metrics(out_a), metrics(out_b)
    # each held-out evaluation printed as a line (rank 0, once): the step's, with its interval and n
    line = f"step 4: held-out accuracy {100 * mb[4]['eval/accuracy']:.1f}% "
    assert res.stdout.count(line) == 1 and "x 1 sample)" in res.stdout.split(line)[1].splitlines()[0], \
        res.stdout[-2000:]
    samples = [[json.loads(ln) for ln in open(os.path.join(out, "samples.jsonl"))] for out in (out_a, out_b)]
    assert not any("stale" in r for r in samples[1])
    # samples every 2 steps: after steps 2 and 4, as evaluation and checkpoints, and so labelled
    assert sorted({r["step"] for r in samples[0]}) == [2, 4]
    assert [(r["step"], r["prompt"], r["response"]) for r in samples[0]] == \
        [(r["step"], r["prompt"], r["response"]) for r in samples[1]]
    assert ma[0] == {"step": 0, "eval/accuracy": ma[0]["eval/accuracy"], "eval/dropped_long_prompts": 1,
                     "eval/pass@1": ma[0]["eval/accuracy"]}  # eval_n = 1: pass@1 only
    # plot.py draws these names (the KL to pi_ref needs a method with a reference model, pass@4
    # and pass@32 as many samples a problem).
    drawn = {key for _, keys in plot.PANELS for key, _ in keys} - {"actor/kl_ref", "eval/pass@4",
                                                                   "eval/pass@32"}
    assert drawn <= set().union(*ma), drawn - set().union(*ma)
    assert [r["step"] for r in ma] == [0, 1, 2, 3, 4] == [r["step"] for r in mb]
    assert all(r["actor/grad_norm"] > 0 for r in ma[1:]), "the toy reward should give every step a gradient"
    for ra, rb in zip(ma, mb):
        assert ra.keys() == rb.keys()
        for k in ra:
            assert ra[k] == pytest.approx(rb[k], rel=1e-6, abs=1e-9), (ra["step"], k)
    wa = load_file(os.path.join(out_a, "step_000004", "model.safetensors"))
    wb = load_file(os.path.join(out_b, "step_000004", "model.safetensors"))
    w0 = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    assert wa.keys() == wb.keys()
    assert any(not torch.equal(wa[k], w0[k]) for k in wa), "training did not change the weights"
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-6), k
    # The checkpoint is a plain HF directory, and keep_last=2 kept the newest two.
    assert sorted(d for d in os.listdir(out_a) if d.startswith("step_")) == ["step_000002",
                                                                            "step_000004"]
    state = json.load(open(os.path.join(out_a, "step_000004", "trainer_state.json")))
    assert state["step"] == 4 and state["data_pos"] == 16


def adam_steps(ckpt):
    """{parameter: Adam's step count} of a checkpoint's optimizer state (read without ranks)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    path = os.path.join(os.path.dirname(ckpt), os.path.basename(ckpt) + "_optim.pt")
    dcp_to_torch_save(os.path.join(ckpt, "optim"), path)
    flat = {}

    def walk(prefix, obj):
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            flat[prefix] = obj
    walk("", torch.load(path, weights_only=False))
    return {k: float(v) for k, v in flat.items() if k.endswith(".step")}


def test_a_run_saved_by_two_ranks_resumes_on_one(tmp_path, tiny_model_dir):
    """A node lost: the checkpoint of 2 ranks resumes on 1. The optimizer state is resharded, not
    dropped: Adam's step count goes on from the saved one (it would restart from 0 if not)."""
    cfg, out = setup_run(tmp_path, tiny_model_dir, "reshard", save_every=2)
    run(cfg, "--set", "steps=2", nproc=2)
    res = run(cfg, "--resume")  # one process
    assert "was saved by 2 ranks, this run has 1" in res.stdout
    assert [r["step"] for r in metrics(out)] == [1, 2, 3, 4]
    first, resumed = adam_steps(os.path.join(out, "step_000002")), adam_steps(os.path.join(out, "step_000004"))
    assert first and first.keys() == resumed.keys()
    assert all(resumed[k] == 2 * first[k] > 0 for k in first), (first, resumed)


def same_update_for_any_micro_batch(tmp_path, model_dir, keys, **common):
    """Train with one sequence per micro-batch and with all in one; assert that `keys` agree at
    every step. -> the metrics of the first run"""
    cfg_a, out_a = setup_run(tmp_path, model_dir, "big", micro_batch_tokens=100000, **common)
    cfg_b, out_b = setup_run(tmp_path, model_dir, "small", micro_batch_tokens=1, **common)
    run(cfg_a)
    run(cfg_b)
    for ra, rb in zip(metrics(out_a), metrics(out_b)):
        for k in keys:
            assert ra[k] == pytest.approx(rb[k], rel=1e-5, abs=1e-7), k
    return metrics(out_a)


def test_microbatch_size_does_not_change_the_update(tmp_path, tiny_model_dir):
    """One sequence per micro-batch or all in one: same loss, same gradient (norm), same metrics."""
    rows = same_update_for_any_micro_batch(
        tmp_path, tiny_model_dir, ("loss/policy", "actor/grad_norm", "actor/entropy",
                                   "actor/cov_logp_adv", "actor/kl_mask_frac", "reward/mean"),
        steps=2, num_minibatches=1, backend="hf", lr=1e-4)
    assert rows[0]["actor/grad_norm"] > 0


@pytest.mark.parametrize("method,loss", [
    ("klcov", {"cov_ratio": 0.05}),
    ("clipcov", {"cov_ratio": 0.05, "cov_lb": 0.0, "cov_ub": 100.0, "entropy_coef": 0.01})])
def test_the_cov_selection_is_the_mini_batchs_whatever_the_micro_batches(tmp_path, tiny_model_dir,
                                                                         method, loss):
    """Clip-Cov / KL-Cov with cov_batch: minibatch (and an entropy bonus): one sequence per
    micro-batch or all in one select the same tokens, so the update and every metric agree."""
    keys = ("loss/policy", "actor/grad_norm", "actor/entropy", "actor/cov_selected_frac",
            "reward/mean") + (("loss/entropy_bonus",) if "entropy_coef" in loss else ())
    rows = same_update_for_any_micro_batch(tmp_path, tiny_model_dir, keys, steps=2, num_minibatches=2,
                                           backend="hf", lr=1e-4, method=method, loss=loss)
    first = rows[1]
    assert first["actor/grad_norm"] > 0 and first["actor/cov_selected_frac"] > 0
    assert first.get("loss/entropy_bonus", -1) < 0


def test_cov_batch_microbatch_selects_within_each_micro_batch(tmp_path, tiny_model_dir):
    """KL-Cov with `cov_batch: microbatch` (verl's): with the whole mini-batch in one micro-batch
    it selects what `minibatch` selects (same means, same count, same ranking), so every metric
    agrees; cut into one sequence per micro-batch, each takes its own max(1, floor(2% of <= 24
    tokens)) = 1 token, about twice the mini-batch's 2%."""
    common = dict(steps=2, num_minibatches=2, backend="hf", lr=1e-4, method="klcov")
    keys = ("loss/policy", "actor/grad_norm", "actor/entropy", "actor/cov_selected_frac", "reward/mean")
    runs = {}
    for name, cov_batch, tokens in (("mini", "minibatch", 100000), ("micro_one", "microbatch", 100000),
                                    ("micro_many", "microbatch", 1)):
        cfg, out = setup_run(tmp_path, tiny_model_dir, name, micro_batch_tokens=tokens,
                             loss={"cov_ratio": 0.02, "cov_batch": cov_batch}, **common)
        run(cfg)
        runs[name] = metrics(out)
    for ra, rb in zip(runs["mini"], runs["micro_one"]):
        for k in keys:
            assert ra[k] == pytest.approx(rb[k], rel=1e-5, abs=1e-7), k
    first = runs["mini"][1]
    assert first["actor/grad_norm"] > 0 and first["actor/cov_selected_frac"] > 0
    many = runs["micro_many"][0]["actor/cov_selected_frac"]
    assert many > 1.5 * runs["mini"][0]["actor/cov_selected_frac"], many


def test_non_finite_updates_are_skipped_then_stop_the_run(tmp_path, tiny_model_dir):
    """Step 1 updates; from step 2 on every loss is NaN: steps 2-4 are skipped and logged, then the
    run stops, saving step 4's state as a resume would need it (weights of step 1, data position
    after step 4) and keeping the older checkpoints even with keep_last 1."""
    cfg, out = setup_run(tmp_path, tiny_model_dir, "nan", steps=10, num_minibatches=1,
                         backend="hf", max_bad_steps=2, save_every=1, keep_last=1,
                         log_samples_every=0)
    res = run(cfg, patch=("--toy-reward", "--nan-from-step", "2"), check=False)
    assert res.returncode != 0
    assert "3 optimizer steps in a row had a non-finite loss or gradient" in res.stderr
    rows = metrics(out)
    assert [r["actor/skipped_updates"] for r in rows] == [0, 1, 2, 3]
    assert sorted(d for d in os.listdir(out) if d.startswith("step_")) == ["step_000003", "step_000004"]
    state = json.load(open(os.path.join(out, "step_000004", "trainer_state.json")))
    assert (state["step"], state["data_pos"], state["bad_in_a_row"]) == (4, 16, 3)
    # log_samples_every 0 logs no samples, except the batches of skipped updates.
    assert {json.loads(ln)["step"] for ln in open(os.path.join(out, "samples.jsonl"))} == {2, 3, 4}
    # Skipped updates leave the weights as step 1 left them.
    w = load_file(os.path.join(out, "step_000004", "model.safetensors"))
    w0 = load_file(os.path.join(out, "step_000003", "model.safetensors"))
    assert any(not torch.equal(w[k], v) for k, v in
               load_file(os.path.join(tiny_model_dir, "model.safetensors")).items()), "step 1 did not update"
    changed = {k: (w[k].dtype, w0[k].dtype, (w[k].double() - w0[k].double()).abs().max().item())
               for k in w0 if not torch.equal(w[k], w0[k])}
    assert not changed, f"weights changed: {changed}\n{res.stderr[-3000:]}"


def test_bad_data_row_names_file_and_line(tmp_path, tiny_model_dir):
    cfg, _ = setup_run(tmp_path, tiny_model_dir, "bad")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "2+2?"}\n')
    res = run(cfg, "--set", f"train_data={bad}", check=False)
    assert res.returncode != 0 and f"{bad}:2: row has no 'answer'" in res.stderr
