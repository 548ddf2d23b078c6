"""train.py end to end: as users run it (torchrun with 2 CPU ranks, real vLLM: the module's one
two-rank run, `two_ranks`, read by every test that needs ranks or the engine), and on one rank in
this process (conftest.train_here) for what one rank shows: the update whatever the micro-batches,
the non-finite guard, a bad data row.

tests/train_patched.py swaps in a toy reward ('7' in the response) so that every group gets reward
spread and every step really changes the weights.
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
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


# ----------------------------------------------------------------------------- the two-rank vLLM run
# conftest.two_ranks: the suite's one run of 2 ranks with vLLM in the GPU's precision, and a resume
# of it, read by the tests below and by tests/test_bf16.py.

@pytest.mark.slow
def test_resumed_run_equals_uninterrupted_run(two_ranks):
    """4 steps in one go == a resume from step 2 for 2 more: same metrics, same weights, the
    metrics and samples logged after the checkpoint cut back, a torn line dropped and said. A
    held-out prompt longer than max_prompt_len is dropped and counted, not fatal."""
    out_a, out_b, res = two_ranks["out_a"], two_ranks["out_b"], two_ranks["resumed"]
    # the start names where the ranks run, once (rank 0)
    assert res.stdout.count("ranks: 2 processes on the CPU (gloo)") == 1, res.stdout[:2000]
    assert sorted(os.listdir(out_a)) == ["config.yaml", "final", "metrics.jsonl", "samples.jsonl",
                                         "step_000002", "step_000004"]  # keep_last 2
    for out in (out_a, out_b):  # the resumed run too names its last step final
        assert os.path.realpath(os.path.join(out, "final")) == os.path.realpath(os.path.join(out, "step_000004"))
    for name in ("metrics.jsonl", "samples.jsonl"):
        assert f"--resume: dropped 1 torn line(s) of {out_b}/{name}" in res.stdout, res.stdout[-2000:]
    ma, mb = metrics(out_a), metrics(out_b)
    # each held-out evaluation printed as a line (rank 0, once): the step's, with its interval and n
    line = f"step 4: held-out accuracy {100 * mb[4]['eval/accuracy']:.1f}% "
    assert res.stdout.count(line) == 1 and "x 4 samples)" in res.stdout.split(line)[1].splitlines()[0], \
        res.stdout[-2000:]
    samples = [[json.loads(ln) for ln in open(os.path.join(out, "samples.jsonl"))] for out in (out_a, out_b)]
    assert not any("stale" in r for r in samples[1])
    # samples every 2 steps: after steps 2 and 4, as evaluation and checkpoints, and so labelled
    assert sorted({r["step"] for r in samples[0]}) == [2, 4]
    assert [(r["step"], r["prompt"], r["response"]) for r in samples[0]] == \
        [(r["step"], r["prompt"], r["response"]) for r in samples[1]]
    assert ma[0] == {"step": 0, "eval/dropped_long_prompts": 1,
                     **{k: ma[0][k] for k in ("eval/accuracy", "eval/accuracy_ci95", "eval/pass@1",
                                              "eval/pass@2", "eval/pass@4")}}
    assert 0 < ma[0]["eval/accuracy"] < 1 and ma[0]["eval/pass@1"] == ma[0]["eval/accuracy"]
    # plot.py draws these names (pass@32 needs as many samples a problem)
    drawn = {key for _, keys in plot.PANELS for key, _ in keys} - {"eval/pass@32"}
    assert drawn <= set().union(*ma), drawn - set().union(*ma)
    assert [r["step"] for r in ma] == [0, 1, 2, 3, 4] == [r["step"] for r in mb]
    assert all(r["actor/grad_norm"] > 0 for r in ma[1:]), "the toy reward should give every step a gradient"
    for ra, rb in zip(ma, mb):
        assert ra.keys() == rb.keys()
        for k in ra:
            assert ra[k] == pytest.approx(rb[k], rel=1e-6, abs=1e-9), (ra["step"], k)
    wa = load_file(os.path.join(out_a, "step_000004", "model.safetensors"))
    wb = load_file(os.path.join(out_b, "step_000004", "model.safetensors"))
    w0 = load_file(os.path.join(two_ranks["model"], "model.safetensors"))
    assert wa.keys() == wb.keys()
    assert any(not torch.equal(wa[k], w0[k]) for k in wa), "training did not change the weights"
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-6), k
    state = json.load(open(os.path.join(out_a, "step_000004", "trainer_state.json")))
    assert state["step"] == 4 and state["data_pos"] == 16


@pytest.mark.slow
def test_training_evaluates_as_eval_py_does_on_any_number_of_ranks(two_ranks):
    """train.py's held-out evaluation is eval.py's path: its eval/accuracy and pass@k on 2 ranks
    equal eval.py's on one process, at step 0 (the model trained from) and at step 4 (its
    checkpoint), with the run's settings (same chunks, seeds, judge). Before, each rank sampled its
    own share with its own seed, so the numbers moved with the number of ranks. With a format
    reward (a wrong boxed answer earns 0.5), so that a judge reading the reward instead of the
    verdict would count more right than eval.py does."""
    import eval as ev
    rows = metrics(two_ranks["out_a"])
    for step, ckpt in ((0, two_ranks["model"]), (4, os.path.join(two_ranks["out_a"], "step_000004"))):
        got = ev.main(["--ckpt", ckpt, "--data", two_ranks["held_out"], "-n", "4", "--k", "1,2,4",
                       "--temperature", "1.0", "--top-p", "1.0", "--max-new-tokens", "24", "--seed", "0",
                       "--prompt-template", two_ranks["cfg"].prompt_template, "--max-problems", "6",
                       "--dtype", two_ranks["cfg"].dtype,
                       "--out", str(two_ranks["tmp"] / f"eval{step}.json")])["benchmarks"]["held_out"]
        assert got["accuracy"] == rows[step]["eval/accuracy"], step
        assert [got[f"pass@{k}"] for k in (1, 2, 4)] == [rows[step][f"eval/pass@{k}"] for k in (1, 2, 4)], step


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


@pytest.mark.slow
def test_a_run_saved_by_two_ranks_resumes_on_one(two_ranks, tmp_path, train_main, capsys):
    """A node lost: the checkpoint of 2 ranks resumes on 1 (a branch into a new out_dir, in this
    process: transformers' generate, a change that --allow-config-change records; the engine plays
    no part in the optimizer state). The optimizer state is resharded, not dropped: Adam's step
    count goes on from the saved one by the optimizer steps taken since (it would restart from 0)."""
    saved = os.path.join(two_ranks["out_a"], "step_000002")
    cfg, out = setup_run(tmp_path, two_ranks["model"], "reshard", **two_ranks["common"],
                         train_data=two_ranks["cfg"].train_data, backend="hf")
    capsys.readouterr()
    train_main("--config", cfg, "--resume", saved, "--allow-config-change")
    assert "was saved by 2 ranks, this run has 1" in capsys.readouterr().out
    rows = metrics(out)
    assert [r["step"] for r in rows] == [3, 4]
    first, resumed = adam_steps(saved), adam_steps(os.path.join(out, "step_000004"))
    taken = sum(r["actor/optimizer_steps"] - r["actor/skipped_updates"] for r in rows)
    assert first and first.keys() == resumed.keys() and taken > 0
    assert all(resumed[k] == first[k] + taken and first[k] > 0 for k in first), (first, resumed, taken)


# ----------------------------------------------------------------------------- one rank, in this process
# (conftest.train_here: train.main on one rank, transformers' generate, the toy reward)

def same_update_for_any_micro_batch(train_here, keys, **common):
    """Train with one sequence per micro-batch and with all in one; assert that `keys` agree at
    every step. -> the metrics of the first run"""
    out_a = train_here("big", micro_batch_tokens=100000, **common)
    out_b = train_here("small", micro_batch_tokens=1, **common)
    for ra, rb in zip(metrics(out_a), metrics(out_b)):
        for k in keys:
            assert ra[k] == pytest.approx(rb[k], rel=1e-5, abs=1e-7), k
    return metrics(out_a)


def test_microbatch_size_does_not_change_the_update(train_here):
    """One sequence per micro-batch or all in one: same loss, same gradient (norm), same metrics."""
    rows = same_update_for_any_micro_batch(
        train_here, ("loss/policy", "actor/grad_norm", "actor/entropy", "actor/cov_logp_adv",
                     "actor/kl_mask_frac", "reward/mean"), steps=2, num_minibatches=1, lr=1e-4)
    assert rows[0]["actor/grad_norm"] > 0


@pytest.mark.parametrize("method,loss", [
    ("klcov", {"cov_ratio": 0.05}),
    ("clipcov", {"cov_ratio": 0.05, "cov_lb": 0.0, "cov_ub": 100.0, "entropy_coef": 0.01})])
def test_the_cov_selection_is_the_mini_batchs_whatever_the_micro_batches(train_here, method, loss):
    """Clip-Cov / KL-Cov with cov_batch: minibatch (and an entropy bonus): one sequence per
    micro-batch or all in one select the same tokens, so the update and every metric agree."""
    keys = ("loss/policy", "actor/grad_norm", "actor/entropy", "actor/cov_selected_frac",
            "reward/mean") + (("loss/entropy_bonus",) if "entropy_coef" in loss else ())
    rows = same_update_for_any_micro_batch(train_here, keys, steps=2, num_minibatches=2, lr=1e-4,
                                           method=method, loss=loss)
    first = rows[1]
    assert first["actor/grad_norm"] > 0 and first["actor/cov_selected_frac"] > 0
    assert first.get("loss/entropy_bonus", -1) < 0


def test_the_8020_choice_is_the_mini_batchs_whatever_the_micro_batches(train_here):
    """The 80/20 rule, beside Clip-Cov's choice from the same selection pass: one sequence per
    micro-batch or all in one keep the same tokens, so the update and every metric agree (each
    micro-batch keeping its own top share would keep others, and more: at least one of each)."""
    keys = ("loss/policy", "actor/grad_norm", "actor/entropy", "actor/high_entropy_frac",
            "actor/cov_selected_frac", "reward/mean")
    rows = same_update_for_any_micro_batch(train_here, keys, steps=2, num_minibatches=2, lr=1e-4,
                                           method="clipcov", loss={"top_entropy_frac": 0.3, "cov_ratio": 0.05,
                                                                   "cov_lb": 0.0, "cov_ub": 100.0})
    first = rows[1]
    assert first["actor/grad_norm"] > 0 and 0 < first["actor/high_entropy_frac"] < 0.4


def test_cov_batch_microbatch_selects_within_each_micro_batch(train_here):
    """KL-Cov with `cov_batch: microbatch` (verl's): with the whole mini-batch in one micro-batch
    it selects what `minibatch` selects (same means, same count, same ranking), so every metric
    agrees; cut into one sequence per micro-batch, each takes its own max(1, floor(2% of <= 24
    tokens)) = 1 token, about twice the mini-batch's 2%."""
    common = dict(steps=2, num_minibatches=2, lr=1e-4, method="klcov")
    keys = ("loss/policy", "actor/grad_norm", "actor/entropy", "actor/cov_selected_frac", "reward/mean")
    runs = {}
    for name, cov_batch, tokens in (("mini", "minibatch", 100000), ("micro_one", "microbatch", 100000),
                                    ("micro_many", "microbatch", 1)):
        runs[name] = metrics(train_here(name, micro_batch_tokens=tokens,
                                        loss={"cov_ratio": 0.02, "cov_batch": cov_batch}, **common))
    for ra, rb in zip(runs["mini"], runs["micro_one"]):
        for k in keys:
            assert ra[k] == pytest.approx(rb[k], rel=1e-5, abs=1e-7), k
    first = runs["mini"][1]
    assert first["actor/grad_norm"] > 0 and first["actor/cov_selected_frac"] > 0
    many = runs["micro_many"][0]["actor/cov_selected_frac"]
    assert many > 1.5 * runs["mini"][0]["actor/cov_selected_frac"], many


def test_non_finite_updates_are_skipped_then_stop_the_run(train_here, tiny_model_dir, monkeypatch):
    """Step 1 updates; from step 2 on every loss is NaN: steps 2-4 are skipped and logged, then the
    run stops, saving step 4's state as a resume would need it (weights of step 1, data position
    after step 4) and keeping the older checkpoints even with keep_last 1."""
    import tepo
    step, real_loss, real_lr = [0], tepo.policy_loss, train.lr_at

    def lr_at(cfg, s):  # called at the start of each RL step's update: note the step
        step[0] = s + 1
        return real_lr(cfg, s)

    def nan_loss(*a, **kw):  # tests/train_patched.py's --nan-from-step 2
        loss, m = real_loss(*a, **kw)
        return (loss * float("nan") if step[0] >= 2 else loss), m
    monkeypatch.setattr(train, "lr_at", lr_at)
    monkeypatch.setattr(tepo, "policy_loss", nan_loss)
    with pytest.raises(RuntimeError, match="3 optimizer steps in a row had a non-finite loss or gradient"):
        train_here("nan", steps=10, num_minibatches=1, max_bad_steps=2, save_every=1, keep_last=1,
                   log_samples_every=0)
    out = train_here.out_dir("nan")
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
    assert not changed, f"weights changed: {changed}"


def test_bad_data_row_names_file_and_line(train_here, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "2+2?"}\n')
    with pytest.raises(train.UserError, match=f"{bad}:2: row has no 'answer'"):
        train_here("bad", train_data=str(bad))
