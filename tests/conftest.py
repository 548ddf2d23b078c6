"""Fixtures shared by the test files, and how the suite is organised: most of its time is the
start of processes and engines, so a test joins a launch that exists before it adds one.

In this process (no subprocess, ~0.5-2 s a run): `train_main(*argv)` runs train.main on one rank
(gloo), as `python train.py ARGS` does but raising a bad input's UserError to the test;
`train_here(name, **config)` does so on a small config of its own (transformers' generate, the toy
reward); `one_rank` gives a process group of one for calling train.py's phases directly. Use these
for anything one rank and transformers' generate can show: the RL step's wiring, configs, losses,
resumes, errors. A vLLM engine may be started in this process too (tests/test_rollout.py,
tests/test_architectures.py, eval.py on one process): close it, or a later in-process run finds
its process group.

Launched once per session, read by many tests:
  two_ranks      the suite's one training run of 2 ranks with vLLM (torchrun), GRPO in bf16, 4 steps
                 with saves and held-out evaluation, and a resume of it (tests/test_train_e2e.py: resume
                 equals uninterrupted, train.evaluate equals eval.py, resharding onto one rank);
  boxed_model    a tiny model pre-trained to answer \\boxed{7} or \\boxed{8}, for real grading
                 (two_ranks, tests/test_eval.py, tests/test_every_setting.py's graders);
  tiny_model_dir the tiny random Qwen2 of most runs.
Launches of their own, because what they test is a process, a launcher, ranks or an engine: the
eight-rank run (collectives), the kills (tests/test_faults.py, bench/fault_inject.py), two nodes,
the README's demo and paper-path commands, torchrun's report of a bad input, vLLM's start-up
logging and its engines under torchrun, the study runner, bf16 against fp32 on 2 ranks, the
trackers across a resume. tests/train_patched.py holds the patches a launched train.py takes
(rewards, faults, dumps); in this process the tests patch with monkeypatch instead.
The slow tier (`-m slow`) is what launches or trains more than a few seconds; CI runs both tiers.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from demo import make_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A random-weight Qwen2 model (hidden 64, 2 layers, head size 32, vocab 128, tied) with the
    character tokenizer, in a transformers-format directory that transformers and vLLM load.
    Read-only: a test that changes weights works on its own copy."""
    return make_tiny_model(str(tmp_path_factory.mktemp("tiny_model")), hidden=64, layers=2,
                           heads=2, kv_heads=1, intermediate=128, vocab_size=128, seed=0)


BOXED_TEMPLATE = "Q: {problem}\nA: "


@pytest.fixture(scope="session")
def boxed_model(tmp_path_factory):
    """A tiny model pre-trained (a few seconds) to answer \\boxed{7} or \\boxed{8} after
    BOXED_TEMPLATE, saved as a checkpoint with train.py's train_config.yaml: a model the real
    graders find right about half the time on "7" or "8" questions. Read-only."""
    import random

    import yaml

    from demo import pretrain
    ckpt = make_tiny_model(str(tmp_path_factory.mktemp("boxed") / "ckpt"), hidden=64, layers=2, heads=2,
                           kv_heads=1, intermediate=128, max_positions=256)
    rng = random.Random(0)
    rows = [{"problem": f"What is {rng.randint(1, 99)} plus {rng.randint(1, 99)}?", "answer": "0",
             "solution": rng.choice(["\\boxed{7}", "\\boxed{8}"])} for _ in range(256)]
    pretrain(ckpt, rows, steps=40, batch_size=32, lr=1e-2, template=BOXED_TEMPLATE, warmup=5, log_every=0)
    with open(os.path.join(ckpt, "train_config.yaml"), "w") as f:
        yaml.safe_dump({"prompt_template": BOXED_TEMPLATE, "max_new_tokens": 24, "seed": 0}, f)
    return ckpt


# ----------------------------------------------------------------------------- train.py in this process

def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def one_rank(monkeypatch):
    """A process group of one rank (gloo) in this process, for the phases of train.py that are
    collectives; destroyed after the test, and the environment put back."""
    import torch.distributed as dist
    for key, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(key, value)
    assert not dist.is_initialized(), "a process group is left from an earlier test (an engine not closed?)"
    dist.init_process_group("gloo")
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def compile_without_codegen(monkeypatch):
    """Config `compile` with torch.compile's "aot_eager" backend (policy.COMPILE_BACKEND): dynamo's
    capture and guards, dynamic shapes and AOT autograd's backward graph, without inductor's
    lowering, fusion and C++ kernels (~70-90 s a model on 2 cores with a cold cache, as in CI):
    inductor's own guards and fused numerics are not checked here. A GPU's kernels are Triton's:
    bench/gpu_check.py's speed line compiles them there."""
    import policy
    monkeypatch.setattr(policy, "COMPILE_BACKEND", "aot_eager")


def toy_reward(response, gold, **kw):
    """tests/train_patched.py's --toy-reward: 1.0 when the response holds a '7', so that a random
    model's groups have reward spread and every update moves the weights."""
    return float("7" in response)


@pytest.fixture
def train_main(monkeypatch):
    """train.main(argv) in this process, on one rank (gloo): what `python train.py ARGS` runs, but
    for ranks.run_main's printing of a bad input (a UserError is raised to the test; the one-line
    error of the command line is tests/test_faults.py's). The toy reward unless reward_fn says
    otherwise (None: the graders' own math_reward). The environment is put back and the process
    group destroyed after each call, whatever it raised.

    train_main(*argv, reward_fn=toy_reward)"""
    import torch.distributed as dist

    import reward
    import train

    def call(*argv, reward_fn=toy_reward):
        with monkeypatch.context() as m:
            if reward_fn is not None:
                m.setattr(reward, "math_reward", reward_fn)
            for key, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                                   MASTER_PORT=str(free_port())).items():
                m.setenv(key, value)
            assert not dist.is_initialized(), ("a process group is left from an earlier test (a vLLM "
                                               "engine started in this process and not closed?)")
            try:
                train.main(list(argv))
            finally:
                if dist.is_initialized():  # a failed run leaves its group: the next call needs none
                    dist.destroy_process_group()
    return call


@pytest.fixture
def train_here(train_main, tmp_path, tiny_model_dir):
    """train.main in this process, on one rank (gloo), with transformers' generate and the toy
    reward unless a test says otherwise: the RL step's wiring without a process start, an engine
    start or torchrun (~0.5 s a launch in place of ~5-15). For what one rank and the hf engine can
    show; ranks, vLLM and kills need a subprocess (tests/train_patched.py).

    train_here(name, *argv, reward_fn=toy_reward, **config) -> out_dir; the config is the small one
    of tests/test_train_e2e.py's setup_run (2 steps, backend hf) with `config` laid over it, written
    to tmp_path/NAME.yaml, out_dir tmp_path/NAME (train_here.out_dir(name), also when it raised)."""
    import json

    import yaml

    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(40)))

    def launch(name, *argv, reward_fn=toy_reward, **config):
        cfg = dict(model=tiny_model_dir, train_data=str(data), out_dir=str(tmp_path / name), seed=0,
                   prompt_template="{problem} \\boxed{}\n", steps=2, prompts_per_step=4, group_size=4,
                   max_prompt_len=64, max_new_tokens=24, num_minibatches=2, micro_batch_tokens=256,
                   lr=1e-3, log_samples_every=1, backend="hf")
        cfg.update(config)
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        train_main("--config", str(path), *argv, reward_fn=reward_fn)
        return cfg["out_dir"]
    launch.out_dir = lambda name: str(tmp_path / name)
    launch.config = lambda name: str(tmp_path / f"{name}.yaml")
    return launch


def read_metrics(out_dir):
    """metrics.jsonl's records."""
    import json
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


# ----------------------------------------------------------------------------- the two-rank vLLM run

@pytest.fixture(scope="session")
def two_ranks(tmp_path_factory, boxed_model):
    """The suite's one training run of 2 ranks with vLLM, as a user launches it (torchrun,
    tests/train_patched.py): GRPO, whose reference model is forwarded in lock-step beside the
    policy and rebuilt by the resume, and whose KL term trains every response; in the GPU's precision (a bf16 engine, train_dtype bfloat16 under
    FSDP2's mixed precision, activation checkpointing, the packed layout with 128-token
    micro-batches, 2 mini-batches): 4 steps in one go (saving at 2 and 4, evaluating at 0, 2 and 4
    with 4 samples a problem), and a resume of it from step 2. The model answers \\boxed{7} or \\boxed{8} (boxed_model), so the toy
    reward ('7' in the response) spreads every group and the held-out accuracy is neither 0 nor 1;
    the reward draws from torch's, Python's and numpy's RNGs (--noisy-reward), so a resume equals
    the run only if it restores all three, after vLLM's start (which seeds them). Read by
    tests/test_train_e2e.py (resume, evaluation against eval.py, resharding onto one rank).
    -> {"cfg", "common", "out_a", "out_b", "whole", "resumed", "held_out", "model", "tmp"}"""
    import json
    import shutil

    import train
    from test_train_e2e import run, setup_run
    tmp = tmp_path_factory.mktemp("two_ranks")
    held_out = tmp / "held_out.jsonl"  # the last prompt is longer than max_prompt_len: dropped, counted
    held_out.write_text("".join(json.dumps({"problem": p, "answer": a}) + "\n" for p, a in (
        ("What is 3 plus 4?", "7"), ("What is 5 plus 3?", "8"), ("What is 2 plus 5?", "7"),
        ("What is 1 plus 7?", "8"), ("What is 9 minus 1?", "8"), ("What is 12 minus 5?", "\\frac{14}{2}"),
        ("Long " * 40 + "1 + 1?", "2"))))
    common = dict(method="grpo", prompt_template=BOXED_TEMPLATE, save_every=2, eval_data=str(held_out), eval_every=2,
                  eval_n=4, log_samples_every=2, format_reward=0.5, train_dtype="bfloat16", dtype="bfloat16",
                  activation_checkpointing=True, micro_batch_layout="packed", num_minibatches=2,
                  micro_batch_tokens=128)
    cfg_a, out_a = setup_run(tmp, boxed_model, "whole", **common)
    whole = run(cfg_a, nproc=2, patch=("--noisy-reward",))
    # The resume: out_dir as a kill after step 4 was logged but before it was saved would leave it
    # (the checkpoint of step 2; metrics and samples of steps 3 and 4, whose lines are dropped and
    # logged anew), with half a line written last (dropped too, and said).
    cfg_b, out_b = setup_run(tmp, boxed_model, "resumed", **common)
    shutil.copytree(out_a, out_b, symlinks=True)
    shutil.rmtree(os.path.join(out_b, "step_000004"))
    os.remove(os.path.join(out_b, "final"))
    for name in ("metrics.jsonl", "samples.jsonl"):
        with open(os.path.join(out_b, name), "a") as f:
            f.write(json.dumps({"step": 3, "stale": True}) + "\n" + '{"step": 4, "rew')
    resumed = run(cfg_b, "--resume", nproc=2, patch=("--noisy-reward",))
    return dict(tmp=tmp, cfg=train.load_config(cfg_a), common=common, out_a=out_a, out_b=out_b, whole=whole,
                resumed=resumed, held_out=str(held_out), model=boxed_model)
