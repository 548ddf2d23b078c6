"""The GPU configurations, run on CPU: each configs/math1.5b-<method>.yaml as it is, except the
model (a random 2-layer Qwen2 with Qwen2.5-Math-1.5B's real tokenizer, 151,936-token vocabulary,
chat template and generation_config), the data (data.py fetch's MATH train set and a slice of
MATH-500), the sizes (steps, prompts, tokens) and, here, the engine. Everything else as configured:
the chat template, activation checkpointing, bf16 sampling, the method's preset, the evaluation
schedule.

One config per loss family (RUN) trains 2 RL steps in this process on one rank (train.main) with
transformers' generate in bf16, on MATH's first rows, and saves. The config with vLLM on 2 ranks,
as on the GPUs, is tepo's, in tests/test_paper_path.py, with the same checks per step, and eval.py
judges its checkpoints there; grpo's reference on 2 ranks, and its rebuild by a resume (a resume
has no code of its own per method), are the suite's two-rank run's (conftest.two_ranks), dynamic
sampling's quota over 2 ranks tests/test_train_rules.py's, Clip-Cov's and KL-Cov's choice over 2 ranks
tests/test_cov_losses.py's. What a resume checks of the config does depend on the method
(config.run_values: the preset), and every config's round trip is checked below, as is every
file's resolution to its method's preset with the shared GPU settings. Skips, saying what is
missing and how to provide it, without the data sets and the tokenizer (tests/qwen_math.py).
"""
import glob
import json
import os
import subprocess
import sys

import pytest

from qwen_math import DATA_DIR, ROOT, TOKENIZER_DIR, make_qwen_math_model, need_shared

# One config per loss family trains here: grpo (token ratio, the reference model and its KL term),
# dapo (dynamic sampling, overlong shaping, the +1/-1 rewards), klcov (the
# covariance selection over the mini-batch, from its extra forward pass); tepo (sequence ratio, the
# KL mask) with vLLM on 2 ranks in tests/test_paper_path.py. drgrpo, gspo, clipcov, gmpo, cispo and
# sapo differ from these only inside tepo.policy_loss, checked token by token in tests/test_tepo.py,
# tests/test_cov_losses.py and tests/test_newer_losses.py and trained through train.py in
# tests/test_every_setting.py.
RUN = ("grpo", "dapo", "klcov")
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "math1.5b-*.yaml")))
# The sizes: 2 prompts x 8 samples per step (one prompt per rank), responses of at most 24
# tokens, 6 held-out problems. max_prompt_len stays (1024): MATH prompts fit it.
SIZES = ["steps=2", "prompts_per_step=2", "max_new_tokens=24", "eval_max_problems=6"]


@pytest.fixture(scope="module")
def qwen_model(tmp_path_factory):
    need_shared(TOKENIZER_DIR, DATA_DIR)
    return make_qwen_math_model(str(tmp_path_factory.mktemp("qwen") / "model"))


def torchrun(*args, nproc=2):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           *args]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, f"{' '.join(cmd)}\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}"
    return out


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_every_gpu_config_resolves_to_its_method_with_the_shared_settings(path):
    import train
    method = os.path.basename(path)[len("math1.5b-"):-len(".yaml")]
    cfg = train.load_config(path)
    assert cfg.method == method and cfg.out_dir == f"runs/math1.5b-{method}"
    assert cfg.loss_cfg == train.tepo.LossConfig.preset(method, max_new_tokens=cfg.max_new_tokens)
    assert (cfg.model, cfg.train_data, cfg.prompt_template) == ("Qwen/Qwen2.5-Math-1.5B",
                                                               "data/math_train.jsonl", None)
    assert (cfg.dtype, cfg.activation_checkpointing, cfg.micro_batch_layout) == ("bfloat16", True, "packed")
    assert (cfg.prompts_per_step, cfg.group_size, cfg.max_new_tokens) == (128, 8, 3072)


def parity_reward(response, gold, **kw):
    """An even number of characters: reward spread for a random model's groups, so that the update
    runs (with the real grader every reward would be 0, and every advantage too)."""
    return float(len(response) % 2 == 0)


def check_run(out_dir, method, last):
    """What a GPU config's run must show at every step and in its last checkpoint."""
    rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == list(range(last + 1))
    for r in rows[1:]:
        assert r["response/length_max"] <= 24 and r["actor/optimizer_steps"] > 0
        assert r["actor/grad_norm"] > 0
        assert r["mismatch/abs_mean"] < 0.05 and 0 <= r["actor/kl_old"] < 0.05  # bf16 sampler, fp32 trainer
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in rows[-1]  # MATH prompts fit: none dropped
    assert "eval/dropped_long_prompts" not in rows[0]
    state = json.load(open(os.path.join(out_dir, f"step_{last:06d}", "trainer_state.json")))
    assert state["step"] == last and state["data_pos"] >= last * 2
    assert os.path.realpath(os.path.join(out_dir, "final")) == os.path.join(out_dir, f"step_{last:06d}")
    with open(os.path.join(out_dir, f"step_{last:06d}", "train_config.yaml")) as f:
        text = f.read()
    assert f"method: {method}" in text and "activation_checkpointing: true" in text
    assert "dtype: bfloat16" in text and "prompt_template: null" in text
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("method", RUN)
def test_gpu_config_runs_and_resumes(method, qwen_model, tmp_path, train_main):
    path = os.path.join(ROOT, "configs", f"math1.5b-{method}.yaml")
    slices = {}
    for name, rows in (("math500", 6), ("math_train", 64)):  # MATH's first rows (the whole set: paper path)
        slices[name] = tmp_path / f"{name}_slice.jsonl"
        with open(os.path.join(DATA_DIR, f"{name}.jsonl")) as f:
            slices[name].write_text("".join(f.readlines()[:rows]))
    out_dir = tmp_path / "run"
    overrides = [f"model={qwen_model}", f"train_data={slices['math_train']}", f"eval_data={slices['math500']}",
                 f"out_dir={out_dir}", "backend=hf", *SIZES]
    sets = [a for o in overrides for a in ("--set", o)]
    train_main("--config", path, *sets, reward_fn=parity_reward)
    check_run(str(out_dir), method, 2)


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_every_gpu_config_resumes_as_itself(path, tmp_path):
    """What a checkpoint records of the config (train_config.yaml, as checkpoint.py writes it) reads
    back as the same run, method preset and loss keys included, for every config: the resume check
    (runs.resumed_config) lets each resume with its own file and more steps, and refuses another
    method's file. (The resume itself, which has no code per method, runs in the suite's two-rank
    run, GRPO's: conftest.two_ranks.)"""
    import yaml
    import config
    import runs
    import train
    cfg = train.load_config(path)
    ckpt = tmp_path / "step_000001"
    ckpt.mkdir()
    (ckpt / "train_config.yaml").write_text(yaml.safe_dump(config.config_dict(cfg)))
    (ckpt / "trainer_state.json").write_text('{"step": 1}')
    assert runs.resumed_config(str(ckpt), cfg, allow_change=False) == {}
    longer = train.load_config(path, [f"steps={cfg.steps + 100}"])  # free: the schedule is constant
    assert cfg.lr_schedule == "constant"
    assert runs.resumed_config(str(ckpt), longer, allow_change=False) == {"steps": [cfg.steps, cfg.steps + 100]}
    other = "grpo" if cfg.method != "grpo" else "dapo"
    with pytest.raises(train.UserError, match="changes what defines the run"):
        runs.resumed_config(str(ckpt), train.load_config(path, [f"method={other}"]), allow_change=False)


def test_the_7b_config_is_the_1p5b_setting_with_the_7b_model():
    import train
    small = train.load_config(os.path.join(ROOT, "configs", "math1.5b-tepo.yaml"))
    big = train.load_config(os.path.join(ROOT, "configs", "math7b.yaml"))
    assert (big.model, big.out_dir, big.method) == ("Qwen/Qwen2.5-Math-7B", "runs/math7b-tepo", "tepo")
    assert {k: v for k, v in vars(big).items() if k not in ("model", "out_dir")} == \
        {k: v for k, v in vars(small).items() if k not in ("model", "out_dir")}


def test_the_qwen3_config_fits_its_plan():
    """configs/qwen3-4b.yaml: the shared setting on Qwen3-4B-Base, whose KV cache (144 KiB a token)
    needs gpu_memory_utilization 0.6 to hold the step's responses at mean lengths, and fits 8 x 80 GB
    in both phases (bench/gpu_plan.py's estimate)."""
    import io
    from contextlib import redirect_stdout
    import train
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import gpu_plan
    cfg = train.load_config(os.path.join(ROOT, "configs", "qwen3-4b.yaml"))
    assert (cfg.model, cfg.method, cfg.prompt_template, cfg.prompts_per_step) == \
        ("Qwen/Qwen3-4B-Base", "tepo", None, 128)
    out = io.StringIO()
    with redirect_stdout(out):
        gpu_plan.plan(cfg, gpu_plan.model_shapes("qwen3-4b"), "h100", 8, 0.4, 0.6,
                      cfg.max_new_tokens // 2, 150)
    text = out.getvalue()
    assert "enough for mean lengths" in text and "DOES NOT FIT" not in text and "TOO SMALL" not in text
