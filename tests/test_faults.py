"""Faults and bad input (issue 16): each bad input is a one-line error naming the problem (no
traceback); reward errors and timeouts are counted, not silent; a full disk leaves the previous
checkpoint; poisoned weights are never saved; a dead rank or launcher does not leave workers
behind. docs/RELIABILITY.md lists them all with what the program does."""
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types

import psutil
import pytest
import yaml

import data
import checkpoint, runs
import reward
import train
from config import UserError
from conftest import free_port
from test_train_e2e import metrics, setup_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = ["model=m", "train_data=d"]


# ----------------------------------------------------------------------------- config


def wrong_value(kind):
    """A YAML value of the wrong type for a field annotated `kind`."""
    if isinstance(kind, types.UnionType):
        kind = next(t for t in kind.__args__ if t is not type(None))
    return {bool: "maybe", int: "abc", float: "abc", str: "[1, 2]", tuple: "fast", dict: "7",
            list: "7"}[kind]


@pytest.mark.parametrize("field", [f for f in dataclasses.fields(train.Config)] +
                         [f for f in dataclasses.fields(train.tepo.LossConfig) if f.name != "method"],
                         ids=lambda f: f.name)
def test_a_wrong_type_for_any_key_names_the_key(field):
    key = field.name if field in dataclasses.fields(train.Config) else f"loss.{field.name}"
    with pytest.raises(UserError, match=f"'{key}' must be"):
        train.load_config(None, BASE + [f"{key}={wrong_value(field.type)}"])


@pytest.mark.parametrize("setting,message", [
    ("lr=-1e-6", "lr must be > 0"), ("group_size=1", "group_size must be >= 2"),
    ("prompts_per_step=0", "prompts_per_step must be > 0"), ("top_p=1.5", r"top_p must be in \(0, 1\]"),
    ("temperature=0", "temperature must be > 0"), ("max_bad_steps=-1", "max_bad_steps must be >= 0"),
    ("betas=[0.9, 1.5]", "betas must be two numbers"), ("max_reward_errors=2", "max_reward_errors must be in"),
    ("reward_timeout=0", "reward_timeout must be > 0"), ("backend=sglang", "backend must be one of"),
    ("loss.clip_low=2", "clip range"), ("method=ppo", "unknown method"),
    ("loss.top_entropy_frac=1.5", r"top_entropy_frac must lie in \[0, 1\]"),
    ("loss.surrogate=ppo", "unknown surrogate 'ppo'"), ("loss.sapo_tau_neg=0", "sapo_tau_neg must be > 0"),
    ("loggers=[jsonl, mlflow]", "loggers takes jsonl, tensorboard and wandb, not 'mlflow'"),
    ("learning_rate=1", r"unknown config key\(s\) \['learning_rate'\]")])
def test_out_of_range_values_are_named(setting, message):
    with pytest.raises(UserError, match=message):
        train.load_config(None, BASE + [setting])


def test_training_refuses_top_p_below_1_and_evaluation_takes_it(tmp_path, tiny_model_dir, monkeypatch):
    """top_p < 1 in training: vLLM's log-probs are of the renormalised nucleus, the trainer's of the
    full softmax, so every ratio and mismatch metric read the nucleus as drift, silently (before:
    accepted). One line, the reason and the fix. eval.py samples at its --top-p as before."""
    import eval as ev
    import rollout
    with pytest.raises(UserError, match=re.escape(
            "config: top_p 0.9 < 1 is not supported in training: vLLM's sampled log-probs are of the "
            "renormalised nucleus, the trainer's of the full softmax, so the ratios, loss.is_correction and "
            "the mismatch metrics would read the nucleus as drift; set top_p: 1.0 (eval.py's --top-p is "
            "unaffected)")):
        train.load_config(None, BASE + ["top_p=0.9"])
    assert train.load_config(None, BASE + ["top_p=1.0"]).top_p == 1.0
    asked, real = [], rollout.make_engine

    def engine(*a, **kw):
        eng = real(*a, **kw)
        gen = eng.generate
        eng.generate = lambda *a, **kw: (asked.append(kw["top_p"]), gen(*a, **kw))[1]
        return eng
    monkeypatch.setattr(rollout, "make_engine", engine)
    bench, out = tmp_path / "b.jsonl", tmp_path / "r.json"
    bench.write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "2+2?", "answer": "4"}\n')
    ev.main(["--ckpt", tiny_model_dir, "--data", str(bench), "-n", "2", "--temperature", "1.0", "--top-p", "0.9",
             "--max-new-tokens", "8", "--prompt-template", "{problem}", "--backend", "hf", "--out", str(out)])
    assert asked and set(asked) == {0.9}
    assert json.load(open(out))["protocol"]["top_p"] == 0.9


def test_a_resume_may_change_only_what_cannot_change_the_run():
    """config.config_changes splits a resume's changes: what defines the run (lr, method and the
    values it resolves, a loss key, the data, the seed) from what may change (the steps to run, the
    evaluation's cadence, the trackers, the micro-batch size); `steps` defines the run when the
    learning rate follows a cosine over them. A key the saved config lacks counts as its default."""
    from config import config_changes, config_dict
    base = train.load_config(None, BASE)
    saved = yaml.safe_load(yaml.safe_dump(config_dict(base)))
    assert config_changes(saved, base) == ({}, {})
    changed = train.load_config(None, BASE + ["lr=2e-6", "method=dapo", "loss.clip_high=0.5", "seed=1",
                                              "train_data=other", "steps=5", "eval_every=2",
                                              "loggers=[jsonl, tensorboard]", "micro_batch_tokens=512"])
    defining, free = config_changes(saved, changed)
    assert defining == {"seed": [0, 1], "method": ["tepo", "dapo"], "train_data": ["d", "other"],
                        "lr": [1e-6, 2e-6], "wrong_reward": [0.0, -1.0], "dynamic_sampling": [False, True],
                        "overlong_buffer": [0, 256], "loss.ratio": ["sequence", "token"],
                        "loss.clip_low": [3e-4, 0.2], "loss.clip_high": [4e-4, 0.5], "loss.kl_mask": [True, False]}
    assert free == {"steps": [100, 5], "micro_batch_tokens": [16384, 512], "eval_every": [0, 2],
                    "loggers": [["jsonl"], ["jsonl", "tensorboard"]]}
    cosine = train.load_config(None, BASE + ["lr_schedule=cosine"])
    assert config_changes(yaml.safe_load(yaml.safe_dump(config_dict(cosine))),
                          train.load_config(None, BASE + ["lr_schedule=cosine", "steps=5"])) == \
        ({"steps": [100, 5]}, {})
    del saved["eval_n"], saved["betas"]
    saved["a_key_since_removed"] = 1
    assert config_changes(saved, base) == ({}, {})


def saved_run(tmp_path, settings):
    """A checkpoint directory of step 2 whose run was trained with `settings` (--set items), as
    resumed_config reads it: its train_config.yaml and trainer_state.json."""
    from config import config_dict
    ckpt = tmp_path / "-".join(settings) / "step_000002"
    ckpt.mkdir(parents=True)
    (ckpt / "train_config.yaml").write_text(yaml.safe_dump(config_dict(train.load_config(None, BASE + settings))))
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": 2}))
    return str(ckpt)


def test_micro_batch_tokens_define_the_run_where_clip_cov_selects_per_micro_batch(tmp_path):
    """micro_batch_tokens (and the layout) cut the batch that Clip-Cov and KL-Cov select their
    tokens in under `loss.cov_batch: microbatch`: a change is refused there (it was free), and free
    where the selection is over the mini-batch (their default) or there is none (grpo)."""
    from runs import resumed_config
    for method in ("clipcov", "klcov"):
        cov = [f"method={method}", "loss.cov_batch=microbatch"]
        ckpt = saved_run(tmp_path, cov)
        with pytest.raises(UserError, match=r"changes what defines the run of .*step_000002: micro_batch_tokens "
                                            r"16384 -> 512; resume with its values"):
            resumed_config(ckpt, train.load_config(None, BASE + cov + ["micro_batch_tokens=512"]), False)
        with pytest.raises(UserError, match=r"micro_batch_layout 'packed' -> 'grouped'; "):
            resumed_config(ckpt, train.load_config(None, BASE + cov + ["micro_batch_layout=grouped"]), False)
        assert resumed_config(ckpt, train.load_config(None, BASE + cov + ["micro_batch_tokens=512"]), True) == \
            {"micro_batch_tokens": [16384, 512]}
    for method in (["method=clipcov"], ["method=klcov"], ["method=grpo", "loss.cov_batch=microbatch"]):
        assert resumed_config(saved_run(tmp_path, method), train.load_config(
            None, BASE + method + ["micro_batch_tokens=512", "micro_batch_layout=grouped"]), False) == \
            {"micro_batch_tokens": [16384, 512], "micro_batch_layout": ["packed", "grouped"]}


def test_a_resume_may_not_change_reward_timeout(tmp_path):
    """reward_timeout decides which responses are graded wrong (a call over it is one): a change is
    refused (it was free)."""
    from runs import resumed_config
    ckpt = saved_run(tmp_path, ["method=grpo"])
    with pytest.raises(UserError, match=r"changes what defines the run of .*: reward_timeout 10\.0 -> 2\.0; "):
        resumed_config(ckpt, train.load_config(None, BASE + ["method=grpo", "reward_timeout=2"]), False)


def test_a_resume_compares_values_after_the_methods_preset(tmp_path):
    """`loss.clip_high=0.2` (and kl_coef 0.04) on grpo are grpo's own values: no change (it was
    refused as loss.clip_high None -> 0.2). Another value is one, named with the preset's value."""
    from runs import resumed_config
    ckpt = saved_run(tmp_path, ["method=grpo"])
    assert resumed_config(ckpt, train.load_config(None, BASE + ["method=grpo", "loss.clip_high=0.2",
                                                                "loss.kl_coef=0.04"]), False) == {}
    with pytest.raises(UserError, match=r"changes what defines the run of .*: loss\.clip_high 0\.2 -> 0\.28; "):
        resumed_config(ckpt, train.load_config(None, BASE + ["method=grpo", "loss.clip_high=0.28"]), False)
    # and the other way: the saved run wrote the preset's value, the resume leaves it to the preset
    ckpt = saved_run(tmp_path, ["method=grpo", "loss.clip_high=0.2"])
    assert resumed_config(ckpt, train.load_config(None, BASE + ["method=grpo"]), False) == {}


@pytest.mark.parametrize("method", train.tepo.METHODS)
def test_the_values_a_resume_and_the_table_compare_are_those_the_run_uses(method):
    """config.run_values resolves a saved config without building a Config (the table reads
    results.json's configs, which need not import their grader); it must give what Config itself
    resolves: each loss field as cfg.loss_cfg has it, every null as Config fills it."""
    from config import config_dict, run_values
    nulls = {f.name: None for f in dataclasses.fields(train.Config) if f.default is None}
    for extra in ([], ["max_new_tokens=64", "loss.entropy_coef=0.001"]):
        cfg = train.load_config(None, BASE + [f"method={method}"] + extra)
        values = run_values(yaml.safe_load(yaml.safe_dump({**config_dict(cfg), **nulls})))
        assert {k: values.get(f"loss.{k}", cfg.max_new_tokens if k == "max_new_tokens" else None)
                for k in cfg.loss_cfg.as_dict() if k != "method"} == \
            {k: v for k, v in cfg.loss_cfg.as_dict().items() if k != "method"}
        assert {k: values[k] for k in config_dict(cfg) if k != "loss"} == \
            {k: v for k, v in config_dict(cfg).items() if k != "loss"}


def train_cli(*args, torchrun=False, timeout=300):
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
           if torchrun else [sys.executable]) + [os.path.join(ROOT, "train.py"), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(res, want):
    errors = [ln for ln in res.stderr.splitlines() if "error: " in ln]
    assert res.returncode != 0, res.stderr[-2000:]
    assert errors and want in errors[0], res.stderr[-3000:]
    # The workers' own output: torchrun's report (log lines "E1123 ...", then its own traceback of
    # ChildFailedError, which names the failed ranks) follows it.
    workers = re.split(r"\n[EW]\d{4} ", res.stderr)[0]
    assert "Traceback" not in workers, res.stderr[-3000:]


@pytest.mark.slow
def test_config_errors_are_one_line_without_traceback(tmp_path, tiny_model_dir, train_main, capfd):
    """`python train.py` as a user runs it: clip_high=abc, group_size 1, a missing model, a model
    directory without a tokenizer each print one `error: ...` line and exit 2."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"problem": "1+1?", "answer": "2"}\n')
    no_tok = tmp_path / "no_tokenizer"
    no_tok.mkdir()
    shutil.copy(os.path.join(tiny_model_dir, "config.json"), no_tok)
    shutil.copy(os.path.join(tiny_model_dir, "model.safetensors"), no_tok)
    common = ["--set", f"train_data={data}", "--set", f"out_dir={tmp_path / 'out'}"]
    cases = [(["--set", "loss.clip_high=abc", "--set", f"model={tiny_model_dir}"],
              "config key 'loss.clip_high' must be a number, got 'abc'"),
             (["--set", "group_size=1", "--set", f"model={tiny_model_dir}"], "group_size must be >= 2"),
             (["--set", f"model={tmp_path / 'missing'}"], "model directory not found"),
             (["--set", "model=runs/missing"], "is not a local directory, and the hub"),
             (["--set", "model=runs/missing"], "(`hf download runs/missing --local-dir DIR`) and give the "
                                               "directory (`--set model=DIR`)"),
             (["--set", f"model={no_tok}"], "has no tokenizer")]
    # as a user runs it, once (run_main's one line, exit 2, no traceback, whatever the input) ...
    res = train_cli(*common, *cases[0][0])
    assert res.returncode == 2
    assert_one_line_error(res, cases[0][1])
    assert len(res.stderr.strip().splitlines()) <= 3, res.stderr  # (+ transformers' warnings)
    # ... and each input in this process: the error that run_main prints, and no more than two
    # lines of warnings from the libraries on the way
    for extra, want in cases:
        with pytest.raises((UserError, FileNotFoundError), match=re.escape(want)):
            train_main(*common, *extra)
        assert len(capfd.readouterr().err.strip().splitlines()) <= 2


def test_resume_of_a_missing_checkpoint_says_so_and_writes_nothing(tmp_path, tiny_model_dir, train_main):
    """--resume of a pruned (or mistyped) checkpoint: the error says it does not exist and lists the
    ones there, before anything is written (it used to answer about newer checkpoints, and a new
    out_dir was left behind, empty)."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"problem": "1+1?", "answer": "2"}\n')
    old_run = tmp_path / "old"
    for name in ("step_000200", "step_000300"):
        (old_run / name).mkdir(parents=True)
    common = ["--set", f"train_data={data}", "--set", f"model={tiny_model_dir}"]
    with pytest.raises(UserError, match=re.escape(f"--resume {old_run}/step_000100: no such checkpoint "
                                                  f"({old_run} holds step_000200, step_000300; a run keeps its newest")):
        train_main(*common, "--set", f"out_dir={tmp_path / 'branch'}", "--resume", f"{old_run}/step_000100")
    assert not (tmp_path / "branch").exists()
    with pytest.raises(UserError, match="no such checkpoint: give one that exists"):
        train_main(*common, "--set", f"out_dir={tmp_path / 'new'}", "--resume", f"{tmp_path}/nowhere/step_1")
    assert not (tmp_path / "new").exists()


@pytest.mark.slow
def test_prompts_per_step_not_divisible_by_the_ranks(tmp_path, tiny_model_dir):
    """Under torchrun: the line once, on its own line, and again as the last word of torchrun's
    report (the root cause's `traceback :`), not a link to torch's documentation."""
    cfg, _ = setup_run(tmp_path, tiny_model_dir, "odd", prompts_per_step=3)
    res = train_cli("--config", cfg, torchrun=True)
    want = "error: config: prompts_per_step=3 must divide by the 2 ranks"
    assert_one_line_error(res, want)
    assert [ln for ln in res.stderr.splitlines() if "error: " in ln and "traceback : " not in ln] == [want]
    root = res.stderr[res.stderr.index("Root Cause"):]
    assert f"  traceback : {want}\n=====" in root and "To enable traceback" not in res.stderr, res.stderr[-3000:]


SYNC_FAILS_ON_RANK_1 = """import os, sys, time
sys.path.insert(0, {root!r})
from types import SimpleNamespace
import torch
from torch.distributed.fsdp import fully_shard
import ranks, train
rank, world, device = ranks.setup_distributed()
model = torch.nn.Sequential(*(torch.nn.Linear(8, 8) for _ in range(3)))
for layer in model:
    fully_shard(layer)
fully_shard(model)  # its state dict: DTensor shards, each drawn whole by an all-gather


class Engine:  # loads the synced tensors one by one, as vLLM's load_weights does
    def wake(self):
        pass

    def update_weights(self, named):
        for i, (name, tensor) in enumerate(named):
            if rank == 1 and i == 2 and {fail!r} == "load":  # a parameter name this rank's model spells otherwise
                raise KeyError(f"{{name}} is not a parameter of the model")


if {fail!r} == "gather":  # rank 1's gather of the third tensor runs out of memory
    real = train.full_weights

    def full_weights(model):
        for i, item in enumerate(real(model)):
            if rank == 1 and i == 2:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            yield item
    train.full_weights = full_weights


try:
    train.sync_weights(SimpleNamespace(device=device, engine=Engine(), model=model), changed=True)
    print(f"rank {{rank}}: synced", flush=True)
except RuntimeError as e:
    print(f"rank {{rank}}: {{e}}", flush=True)
    time.sleep(1 - rank)  # rank 1 after rank 0 has printed: a gloo peer that leaves ends the wait
    os._exit(1)
"""


@pytest.mark.slow
@pytest.mark.parametrize("fail,error", [("load", "KeyError: '1.weight is not a parameter of the model'"),
                                        ("gather", "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")])
def test_a_weight_sync_that_fails_on_one_rank_stops_every_rank_with_its_error(tmp_path, fail, error):
    """A rank's engine fails to load a synced tensor (the third of six), or its gather of one fails
    (out of memory): every rank raises with that rank's error, promptly. (Before: the failed rank
    raised alone, and its peers went on to gather the next tensor, which it never sends: with nccl
    they wait forever; here, with gloo, rank 0 died of the lost peer, not knowing why; and a failed
    gather was not caught at all.) Two processes, gloo, FSDP2's gathers."""
    script = tmp_path / "sync.py"
    script.write_text(SYNC_FAILS_ON_RANK_1.format(root=ROOT, fail=fail))
    port, procs = str(free_port()), []
    for r in range(2):
        env = {**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": port, "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, cwd=ROOT))
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    want = f"the weight sync into the engine failed on rank 1 of 2, so every rank stops; rank 1: {error}"
    for r, out in enumerate(outs):
        assert f"rank {r}: {want}" in out, out[-3000:]


FAIL_LIKE_A_RANK = """import os, sys
sys.path.insert(0, {root!r})
import ranks
from config import UserError
def main():
    raise UserError("config: prompts_per_step=3 must divide by the 2 ranks")
ranks.run_main(main)
"""


def test_under_torchrun_a_bad_input_is_printed_once_and_reported_to_torchrun(tmp_path):
    """Two ranks fail at once on bad input, writing to one stderr unbuffered (PYTHONUNBUFFERED=1,
    common in containers): one line, whole; each rank's error file, which torchrun reads, carries
    it, so that its report ends with the line. (Before: a line per rank, at times glued on one
    line, and no error file, so torchrun's report ended with a link to its documentation.)"""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
    script = tmp_path / "fail.py"
    script.write_text(FAIL_LIKE_A_RANK.format(root=ROOT))
    attempt, log = tmp_path / "attempt_0", tmp_path / "stderr.txt"
    with open(log, "ab") as err:
        procs = []
        for r in range(2):
            (attempt / str(r)).mkdir(parents=True)
            env = {**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "PYTHONUNBUFFERED": "1",
                   "TORCHELASTIC_ERROR_FILE": str(attempt / str(r) / "error.json")}
            procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stderr=err, cwd=ROOT))
        assert [p.wait(timeout=120) for p in procs] == [2, 2]
    want = "error: config: prompts_per_step=3 must divide by the 2 ranks"
    assert [ln for ln in log.read_text().splitlines() if "error" in ln] == [want], log.read_text()
    failures = {r: ProcessFailure(local_rank=r, pid=0, exitcode=2, error_file=str(attempt / str(r) / "error.json"))
                for r in range(2)}
    report = str(ChildFailedError("train.py", failures))
    assert report.rstrip().splitlines()[-2] == f"  traceback : {want}", report


# ----------------------------------------------------------------------------- data


@pytest.mark.parametrize("content,message", [
    (b"", "no rows (the file is empty)"),
    (b'{"problem": "1+1?", "answer": "2"}\n{"problem": "2+2?"}\n', ":2: row has no 'answer'"),
    (b'{"answer": "2"}\n', ":1: row has no 'problem'"),
    (b'{"problem": "1+1?", "answer": "2"}\n{"problem": "2+2?", "answer": "4"\n', ":2: not valid JSON"),
    (b'{"problem": "1+1?", "answer": "2"}\n\n{"problem": "caf\xe9", "answer": "4"}\n', ":3: not UTF-8 (byte 0xe9"),
    (b'{"problem": "1+1?", "answer": ["2"]}\n', ":1: 'answer' must be a string or a number, got list"),
    (b'[1, 2]\n', ":1: expected a JSON object")])
def test_bad_data_names_file_and_line(tmp_path, content, message):
    path = tmp_path / "data.jsonl"
    path.write_bytes(content)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[")):
        data.load_problems(str(path))
    with pytest.raises(FileNotFoundError, match="data file not found"):
        data.load_problems(str(tmp_path / "missing.jsonl"))


def test_every_prompt_too_long(tmp_path, tiny_model_dir):
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"problem": "long " * 50, "answer": "1"}) + "\n")
    cfg = train.Config(model="m", train_data=str(path), max_prompt_len=16, prompt_template="{problem}")
    with pytest.raises(UserError, match="no prompt fits max_prompt_len=16 tokens .the shortest has 250"):
        data.load_rows(str(path), cfg, data.load_tokenizer(tiny_model_dir), 0)


def test_model_directories(tmp_path, tiny_model_dir):
    """No config.json, no tokenizer files: named."""
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="has no config.json"):
        data.resolve_model(str(tmp_path / "empty"))
    with pytest.raises(UserError, match="has no tokenizer"):
        data.load_tokenizer(str(tmp_path / "empty"))


# ----------------------------------------------------------------------------- checkpoints


def fake_checkpoint(path, model_dir, world=2, step=2, **config_changes):
    os.makedirs(os.path.join(path, "optim"))
    config = {**json.load(open(os.path.join(model_dir, "config.json"))), **config_changes}
    json.dump(config, open(os.path.join(path, "config.json"), "w"))
    open(os.path.join(path, "optim", ".metadata"), "w").close()
    open(os.path.join(path, "train_config.yaml"), "w").write("seed: 0\n")
    for r in range(world):
        open(os.path.join(path, f"rng_rank{r}.pt"), "w").close()
    json.dump({"step": step}, open(os.path.join(path, "trainer_state.json"), "w"))
    return str(path)


def test_resume_checks_the_checkpoint(tmp_path, tiny_model_dir):
    good = fake_checkpoint(tmp_path / "step_000002", tiny_model_dir)
    assert checkpoint.check_checkpoint(good, tiny_model_dir, 2) == 2
    assert checkpoint.check_checkpoint(good, tiny_model_dir, 4) == 2  # resumed on 4 ranks: resharded
    os.remove(os.path.join(good, "rng_rank0.pt"))  # rank 1's file without rank 0's: incomplete
    with pytest.raises(UserError, match="lacks rng_rank0.pt .incomplete"):
        checkpoint.check_checkpoint(good, tiny_model_dir, 2)
    open(os.path.join(good, "rng_rank0.pt"), "w").close()
    os.remove(os.path.join(good, "train_config.yaml"))  # the config it was trained with: compared
    with pytest.raises(UserError, match="lacks train_config.yaml .incomplete"):
        checkpoint.check_checkpoint(good, tiny_model_dir, 2)
    open(os.path.join(good, "train_config.yaml"), "w").write("seed: 0\n")
    with pytest.raises(UserError, match="is not a checkpoint .no trainer_state.json"):
        checkpoint.check_checkpoint(str(tmp_path), tiny_model_dir, 2)
    half = fake_checkpoint(tmp_path / "step_000004.tmp", tiny_model_dir)
    with pytest.raises(UserError, match="half-written checkpoint.*complete one: .*step_000002"):
        checkpoint.check_checkpoint(half, tiny_model_dir, 2)
    other = fake_checkpoint(tmp_path / "other", tiny_model_dir, hidden_size=128)
    with pytest.raises(UserError, match="another model .*hidden_size 128 vs 64"):
        checkpoint.check_checkpoint(other, tiny_model_dir, 2)


def a_finished_run(out):
    """out_dir as an earlier run left it: a checkpoint of step 150, metrics, samples, and a file of
    the user's. -> {name: bytes} of the run's files, to check that nothing was touched."""
    os.makedirs(os.path.join(out, "step_000150"))
    files = {"step_000150/trainer_state.json": b'{"step": 150}', "metrics.jsonl": b'{"step": 0}\n' * 3,
             "samples.jsonl": b'{"step": 150}\n', "notes.txt": b"mine"}
    for name, content in files.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(content)
    return files


def test_a_fresh_start_never_touches_another_runs_out_dir(tmp_path, tiny_model_dir, train_main):
    """train.py without --resume into an out_dir that holds a run: one line naming what is there
    and the ways on, and every file as it was (it used to truncate metrics.jsonl and, with
    keep_last 1, prune its own new checkpoint beside the old run's newer one)."""
    cfg, out = setup_run(tmp_path, tiny_model_dir, "used", backend="hf")
    files = a_finished_run(out)
    with pytest.raises(UserError, match=re.escape(
            f"out_dir {out} holds another run (1 checkpoint(s) up to step_000150 and metrics.jsonl with "
            f"3 line(s)): continue it with --resume, choose a new out_dir (--set out_dir=...), or start "
            f"over with --overwrite")):
        train_main("--config", cfg)
    os.makedirs(os.path.join(out, "step_000050"))  # an older checkpoint kept beside the newest
    with pytest.raises(UserError, match=re.escape("holds newer checkpoints (up to step_000150)")):
        train_main("--config", cfg, "--resume", os.path.join(out, "step_000050"))
    with pytest.raises(UserError, match="--overwrite starts a run afresh: it does not go with --resume"):
        train_main("--config", cfg, "--resume", "--overwrite")
    for name, content in files.items():
        assert open(os.path.join(out, name), "rb").read() == content, name


def test_a_resume_from_another_out_dir_never_touches_the_run_there(tmp_path, tiny_model_dir, monkeypatch,
                                                                   train_main):
    """--resume A/step_000100 with out_dir B, where B holds a run of its own (step_000050 and 61
    metric lines): one line naming what B holds and how to branch, every file of B as it was. (It
    used to be accepted: B's metrics went on from its step 60 with A's branch from step 101, and
    the branch's next save pruned B's step_000050.) Into an empty out_dir the branch goes ahead;
    with --overwrite, B's run is removed first."""
    cfg, out_b = setup_run(tmp_path, tiny_model_dir, "B", backend="hf")
    os.makedirs(os.path.join(out_b, "step_000050"))
    files = {"step_000050/trainer_state.json": b'{"step": 50}', "notes.txt": b"mine",
             "metrics.jsonl": b"".join(b'{"step": %d}\n' % i for i in range(61))}
    for name, content in files.items():
        with open(os.path.join(out_b, name), "wb") as f:
            f.write(content)
    ckpt = fake_checkpoint(tmp_path / "A" / "step_000100", tiny_model_dir, step=100)
    with pytest.raises(UserError, match=re.escape(
            f"--resume {ckpt}: out_dir {out_b} holds another run (1 checkpoint(s) up to step_000050 and "
            f"metrics.jsonl with 61 line(s)), which this branch's metrics would go on from and its saves "
            f"prune: branch into a new out_dir (--set out_dir=...)")):
        train_main("--config", cfg, "--resume", ckpt)
    for name, content in files.items():
        assert open(os.path.join(out_b, name), "rb").read() == content, name
    monkeypatch.setattr(runs.dist, "barrier", lambda: None)
    assert runs.checkpoint_to_resume(str(tmp_path / "new"), ckpt, False, 0) == ckpt
    assert runs.checkpoint_to_resume(out_b, os.path.join(out_b, "..", "A", "step_000100"), True, 0)
    assert sorted(os.listdir(out_b)) == ["notes.txt"]


def test_pruning_removes_only_older_checkpoints(tmp_path):
    for step in (10, 20, 30, 50, 150):
        os.makedirs(tmp_path / f"step_{step:06d}")
    checkpoint.prune_checkpoints(str(tmp_path), 50, keep_last=2)   # just published: step 50
    assert sorted(os.listdir(tmp_path)) == ["step_000030", "step_000050", "step_000150"]
    checkpoint.prune_checkpoints(str(tmp_path), 50, keep_last=1)
    assert sorted(os.listdir(tmp_path)) == ["step_000050", "step_000150"]
    checkpoint.prune_checkpoints(str(tmp_path), 50, keep_last=5)   # fewer than keep_last: all stay
    assert sorted(os.listdir(tmp_path)) == ["step_000050", "step_000150"]
    checkpoint.prune_checkpoints(str(tmp_path), 150, keep_last=0)  # 0 keeps every one
    assert sorted(os.listdir(tmp_path)) == ["step_000050", "step_000150"]


def test_pruning_keeps_what_an_evaluation_needs_and_says_so(tmp_path, tiny_model_dir, capsys):
    """A checkpoint that eval.py evaluated (step_000150/eval/results.json) and that keep_last would
    remove keeps its weights, eval/ and train_config.yaml, and loses its optimizer and RNG states,
    said once. (Before: kept whole, optimizer state too, so a watcher evaluating each checkpoint as
    it appears turned keep_last off: ~18 GB per 1.5B checkpoint until the disk was full.) An
    unevaluated one, or one whose evaluation left no results.json, is removed as before. A resume
    of the pruned one says why it cannot, naming one that can."""
    for step in (100, 150, 151):
        fake_checkpoint(tmp_path / f"step_{step:06d}", tiny_model_dir, world=2, step=step)
    ckpt = tmp_path / "step_000150"
    (ckpt / "model.safetensors").write_bytes(b"weights")
    (ckpt / "optim" / "__0_0.distcp").write_bytes(b"moments")
    os.makedirs(ckpt / "eval")
    (ckpt / "eval" / "results.json").write_text("{}")
    assert checkpoint.prune_checkpoints(str(tmp_path), 151, keep_last=1) == [str(ckpt)]
    assert sorted(os.listdir(tmp_path)) == ["step_000150", "step_000151"]
    assert sorted(os.listdir(ckpt)) == ["config.json", "eval", "model.safetensors", "train_config.yaml",
                                        "trainer_state.json"]
    assert (ckpt / "model.safetensors").read_bytes() == b"weights"
    assert (ckpt / "eval" / "results.json").read_text() == "{}"
    said = capsys.readouterr().out
    assert said.count("kept") == 1 and f"kept {ckpt} for its evaluation results: its weights, eval/ and " \
        f"train_config.yaml; deleted its optimizer and RNG states (it can no longer be resumed from)" in said
    with pytest.raises(UserError, match=re.escape(
            f"--resume: {ckpt} was pruned to what its evaluation needs (keep_last kept its weights, eval/ "
            f"and train_config.yaml, and deleted its optimizer and RNG states): resume from a checkpoint "
            f"that has them (step_000151), or start a new run from its weights (--set model={ckpt})")):
        checkpoint.check_checkpoint(str(ckpt), tiny_model_dir, 2)
    fake_checkpoint(tmp_path / "step_000152", tiny_model_dir, step=152)
    assert checkpoint.prune_checkpoints(str(tmp_path), 152, keep_last=1) == [str(ckpt)]
    assert sorted(os.listdir(tmp_path)) == ["step_000150", "step_000152"]
    assert "kept" not in capsys.readouterr().out  # said once
    # an evaluation that failed or was killed leaves eval/ without results.json: nothing to keep
    os.makedirs(tmp_path / "step_000152" / "eval")
    os.makedirs(tmp_path / "step_000153")
    assert checkpoint.prune_checkpoints(str(tmp_path), 153, keep_last=1) == [str(ckpt)]
    assert sorted(os.listdir(tmp_path)) == ["step_000150", "step_000153"]


def test_a_run_extended_past_its_evaluated_checkpoint_prunes_it_and_resumes_from_the_newest(
        train_here, capsys):
    """train.py end to end: a run of 1 step, its final checkpoint evaluated, extended to 3 steps at
    keep_last 1: step 1 keeps its weights and results, not its optimizer state; --resume takes
    step 3, the newest, whole; a branch off the pruned step 1 is refused, saying why."""
    out = train_here("ext", steps=1, save_every=1, keep_last=1)
    first = os.path.join(out, "step_000001")
    os.makedirs(os.path.join(first, "eval"))
    open(os.path.join(first, "eval", "results.json"), "w").write("{}")
    capsys.readouterr()
    train_here("ext", "--resume", steps=3, save_every=1, keep_last=1)
    assert sorted(n for n in os.listdir(out) if n.startswith("step_")) == ["step_000001", "step_000003"]
    assert not os.path.exists(os.path.join(first, "optim")) and not any(
        n.startswith("rng_rank") for n in os.listdir(first))
    assert {"model.safetensors", "config.json", "train_config.yaml", "eval"} <= set(os.listdir(first))
    assert capsys.readouterr().out.count(f"kept {first} for its evaluation results") == 1
    train_here("ext", "--resume", steps=4, save_every=1, keep_last=1)
    assert f"--resume: from {os.path.join(out, 'step_000003')}" in capsys.readouterr().out
    with pytest.raises(UserError, match=re.escape(f"--resume: {first} was pruned to what its evaluation needs")):
        train_here("branch", "--resume", first, steps=4)


def test_overwrite_removes_half_written_and_swapped_checkpoints_too(tmp_path):
    """--overwrite's clear_run removes a save cut off (step_*.tmp) and a re-save cut off between
    its renames (step_*.old, which list_checkpoints counts as complete): left behind, a later
    --resume would take the deleted run's checkpoint. The user's own files stay."""
    out = tmp_path / "run"
    for name in ("step_000001", "step_000002.tmp", "step_000003.old", "tensorboard"):
        (out / name).mkdir(parents=True)
        (out / name / "x").write_text("x")
    for name in ("metrics.jsonl", "config_changes.jsonl", "notes.txt", "step_notes.txt"):
        (out / name).write_text("x")
    assert checkpoint.list_checkpoints(str(out)) == [str(out / "step_000001"), str(out / "step_000003.old")]
    runs.clear_run(str(out))
    assert sorted(os.listdir(out)) == ["notes.txt", "step_notes.txt"]
    assert checkpoint.list_checkpoints(str(out)) == []


def test_a_branch_keeps_the_changes_of_the_run_it_branches_off(tmp_path):
    """A resume starts config_changes.jsonl from the record its checkpoint carries, so a branch
    into a new out_dir keeps what was changed before the checkpoint, then adds its own change; a
    checkpoint from before the record: out_dir's lines before its step (unchanged behaviour)."""
    lines = [{"step": 2, "resumed_from": "a", "changed": {"lr": [0.001, 0.002]}}]
    src = tmp_path / "a" / "step_000004"
    src.mkdir(parents=True)
    (src / "config_changes.jsonl").write_text(json.dumps(lines[0]) + "\n")
    cfg = train.load_config(None, BASE + [f"out_dir={tmp_path / 'b'}"])
    os.makedirs(cfg.out_dir)
    runs.record_config(cfg, str(src), 4, {"lr": [0.002, 0.003]})
    got = [json.loads(line) for line in open(os.path.join(cfg.out_dir, "config_changes.jsonl"))]
    assert got == lines + [{"step": 4, "resumed_from": os.path.realpath(src), "changed": {"lr": [0.002, 0.003]}}]
    old = tmp_path / "b" / "step_000003"  # in out_dir, carrying no record: lines before step 3 kept
    old.mkdir()
    runs.record_config(cfg, str(old), 3, {})
    assert [json.loads(line) for line in open(os.path.join(cfg.out_dir, "config_changes.jsonl"))] == lines
    # a branch off a checkpoint of before the record: its own out_dir's lines before its step
    parent = tmp_path / "p"
    (parent / "step_000100").mkdir(parents=True)
    (parent / "config_changes.jsonl").write_text(json.dumps({**lines[0], "step": 50}) + "\n" +
                                                 json.dumps({**lines[0], "step": 150}) + "\n")
    branch = train.load_config(None, BASE + [f"out_dir={tmp_path / 'c'}"])
    os.makedirs(branch.out_dir)
    runs.record_config(branch, str(parent / "step_000100"), 100, {})
    assert [json.loads(line) for line in open(os.path.join(branch.out_dir, "config_changes.jsonl"))] == \
        [{**lines[0], "step": 50}]


def test_overwrite_removes_the_earlier_run_then_trains(tmp_path, tiny_model_dir, train_main, capsys):
    cfg, out = setup_run(tmp_path, tiny_model_dir, "again", backend="hf", steps=1, keep_last=1)
    a_finished_run(out)
    train_main("--config", cfg, "--overwrite")
    assert f"--overwrite: removed the earlier run in {out}" in capsys.readouterr().out
    assert sorted(os.listdir(out)) == ["config.yaml", "final", "metrics.jsonl", "notes.txt",
                                       "samples.jsonl", "step_000001"]
    assert [r["step"] for r in metrics(out)] == [1]


def test_a_resume_with_another_config_stops_unless_allowed_then_records_the_change(tmp_path, tiny_model_dir,
                                                                                    train_main):
    """2 steps, then --resume with lr and method changed: one line naming the keys and values (the
    loss keys grpo's preset changes too), nothing touched. With --allow-config-change it trains on; config.yaml still holds the config of
    steps 1-2, and config_changes.jsonl says what changed after step 2. A change of keys that cannot
    change the run (steps, eval cadence) needs no flag and is recorded too. (It used to run on
    without a word, config.yaml overwritten by the new config.)"""
    cfg, out = setup_run(tmp_path, tiny_model_dir, "changed", backend="hf", steps=2, save_every=1)
    train_main("--config", cfg)
    before = {f: open(os.path.join(out, f), "rb").read() for f in ("config.yaml", "metrics.jsonl", "samples.jsonl")}
    ckpt = os.path.join(out, "step_000002")
    # the loss keys as grpo's preset sets them (tepo.LossConfig.PRESETS), after the config's keys
    with pytest.raises(UserError) as e:
        train_main("--config", cfg, "--resume", "--set", "steps=3", "--set", "lr=1e-4", "--set", "method=grpo")
    assert str(e.value) == (
        f"--resume: the config changes what defines the run of {ckpt}: method 'tepo' -> 'grpo', lr 0.001 -> "
        f"0.0001, loss.ratio 'sequence' -> 'token', loss.clip_low 0.0003 -> 0.2, loss.clip_high 0.0004 -> "
        f"0.2, loss.aggregation 'token-mean' -> 'seq-mean-token-mean', loss.kl_coef 0.0 -> 0.04, "
        f"loss.kl_mask True -> False; resume with its values, or pass --allow-config-change to go on with "
        f"these after step 2 (recorded in {out}/config_changes.jsonl)")
    assert {f: open(os.path.join(out, f), "rb").read() for f in before} == before
    assert not os.path.exists(os.path.join(out, "config_changes.jsonl"))
    train_main("--config", cfg, "--resume", "--set", "steps=3", "--set", "lr=1e-4", "--allow-config-change")
    train_main("--config", cfg, "--resume", "--set", "steps=4", "--set", "lr=1e-4", "--set", "eval_every=1")
    assert open(os.path.join(out, "config.yaml"), "rb").read() == before["config.yaml"]
    changes = [json.loads(line) for line in open(os.path.join(out, "config_changes.jsonl"))]
    assert changes == [
        {"step": 2, "resumed_from": ckpt, "changed": {"lr": [0.001, 0.0001], "steps": [2, 3]}},
        {"step": 3, "resumed_from": os.path.join(out, "step_000003"),
         "changed": {"steps": [3, 4], "eval_every": [0, 1]}}]
    assert [r["step"] for r in metrics(out)] == [1, 2, 3, 4]
    # the record travels with each checkpoint written after a change (train_config.yaml holds only
    # the last values): eval.py copies it into results.json, and table.py names the run by it
    assert checkpoint.read_config_changes(os.path.join(out, "step_000003")) == changes[:1]
    assert checkpoint.read_config_changes(os.path.join(out, "step_000004")) == changes
    # resumed from step 3 again: the change recorded at step 3 is replaced, the one at 2 stays
    shutil.rmtree(os.path.join(out, "step_000004"))
    os.remove(os.path.join(out, "final"))
    train_main("--config", cfg, "--resume", "--set", "steps=4", "--set", "lr=1e-4")
    assert [json.loads(line) for line in open(os.path.join(out, "config_changes.jsonl"))] == [
        changes[0], {**changes[1], "changed": {"steps": [3, 4]}}]


# ----------------------------------------------------------------------------- rewards


def test_a_reward_that_raises_or_hangs_scores_a_wrong_answer_and_is_counted(monkeypatch):
    cfg = train.Config(model="m", train_data="d", reward_timeout=0.3)
    sample = types.SimpleNamespace(text="\\boxed{2}", response_ids=[1, 2])
    failed = {"errors": 0, "timeouts": 0}
    assert train.guarded_reward(cfg, reward.math_reward, sample, "2", failed=failed) == (1.0, True)
    assert train.guarded_reward(cfg, lambda *a, **k: 1 / 0, sample, "2", failed=failed) == (0.0, False)
    t0 = time.perf_counter()
    assert train.guarded_reward(cfg, lambda *a, **k: time.sleep(100), sample, "2", failed=failed) == (0.0, False)
    assert time.perf_counter() - t0 < 1.0

    def busy(*a, **k):  # a pure-Python loop that swallows every Exception
        while True:
            try:
                sum(range(1000))
            except Exception:
                pass
    assert train.guarded_reward(cfg, busy, sample, "2", failed=failed) == (0.0, False)
    assert (failed["errors"], failed["timeouts"]) == (1, 2)
    assert failed["first"].startswith("ZeroDivisionError")
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def failing_reward(share):
    """tests/train_patched.py's --reward-fails SHARE: the toy reward, but raising (ValueError) on a
    response whose hash falls in the first SHARE of the range and hanging (1000 s) on the next."""
    import zlib

    def fn(response, gold, **kw):
        h = zlib.crc32(response.encode()) / 2 ** 32
        if h < share:
            raise ValueError("grader bug")
        if h < 2 * share:
            time.sleep(1000)
        return float("7" in response)
    return fn


@pytest.mark.slow
def test_reward_errors_are_counted_and_too_many_stop_the_run(tmp_path, tiny_model_dir, train_main):
    """5% of responses raise and 5% hang: counted, rewards 0, the run goes on. 30% each: the run
    stops at step 1 with the error named, before any update."""
    # reward_timeout 0.3 s: the injected hangs (1000 s) pass it; the toy reward's calls take microseconds
    cfg, out = setup_run(tmp_path, tiny_model_dir, "rf", steps=2, backend="hf", reward_timeout=0.3,
                         max_reward_errors=0.5)
    train_main("--config", cfg, reward_fn=failing_reward(0.05))
    rows = metrics(out)
    assert sum(r["reward/errors"] for r in rows) > 0 and sum(r["reward/timeouts"] for r in rows) > 0
    cfg, out = setup_run(tmp_path, tiny_model_dir, "rf_stop", steps=2, backend="hf", reward_timeout=0.3)
    with pytest.raises(UserError) as e:
        train_main("--config", cfg, reward_fn=failing_reward(0.3))
    # the first failure named, whichever kind it is (the sampled responses decide)
    assert re.match(r"step 1: \d+ reward calls raised and \d+ timed out of \d+ \(max_reward_errors=0\.1\); "
                    r"first: (ValueError: grader bug|took over reward_timeout=0\.3s) \(rank \d", str(e.value)), e.value
    assert not os.path.exists(os.path.join(out, "metrics.jsonl")) or not metrics(out)


# ----------------------------------------------------------------------------- saves


@pytest.mark.slow
def test_a_full_disk_at_save_keeps_the_previous_checkpoint(tmp_path, tiny_model_dir, train_main, monkeypatch,
                                                           capsys):
    """The second save fails with ENOSPC (on a rank's RNG state, after the model is written): the
    half-written step_000002.tmp goes, step_000001 stays whole, the run stops naming both; it
    resumes from step_000001."""
    import errno

    import torch
    cfg, out = setup_run(tmp_path, tiny_model_dir, "full", steps=4, backend="hf", save_every=1,
                         log_samples_every=0)
    saves, real_save = [0], torch.save

    def full_disk(obj, f, *a, **kw):  # tests/train_patched.py's --enospc-at-save 2
        if str(f).endswith(".pt") and "rng_rank" in str(f):
            saves[0] += 1
            if saves[0] == 2:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return real_save(obj, f, *a, **kw)
    with monkeypatch.context() as m:
        m.setattr(torch, "save", full_disk)
        with pytest.raises(UserError) as e:
            train_main("--config", cfg)
    assert str(e.value).startswith(f"cannot write checkpoint {out}/step_000002.tmp: [Errno 28] No space left on "
                                   f"device") and f"the previous checkpoint ({out}/step_000001) is intact" in str(e.value)
    assert sorted(d for d in os.listdir(out) if d.startswith("step_")) == ["step_000001"]
    capsys.readouterr()
    train_main("--config", cfg, "--resume", "--set", "steps=2")  # and it resumes from it
    assert f"--resume: from {out}/step_000001" in capsys.readouterr().out


def test_an_unwritable_out_dir_is_named(tmp_path, tiny_model_dir, train_main):
    (tmp_path / "a_file").write_text("")
    cfg, _ = setup_run(tmp_path, tiny_model_dir, "ro", out_dir=str(tmp_path / "a_file" / "run"),
                       backend="hf")
    with pytest.raises(UserError, match=re.escape(f"out_dir {tmp_path}/a_file/run is not writable (Not a directory")):
        train_main("--config", cfg)


def test_poisoned_weights_are_never_saved(tmp_path, tiny_model_dir, train_main, monkeypatch):
    """A weight turns NaN at step 2: every loss is NaN, the update is skipped, and the save of
    step 2 refuses, keeping step 1 as the newest checkpoint."""
    import torch
    cfg, out = setup_run(tmp_path, tiny_model_dir, "poison", steps=4, backend="hf", save_every=1,
                         num_minibatches=1)
    real_lr, real_load, models = train.lr_at, train.load_policy, []

    def keep_policy(*a, **kw):  # tests/train_patched.py's --corrupt-weight-at-step 2
        models.append(real_load(*a, **kw))
        return models[-1]

    def corrupting_lr(cfg, s):
        if s + 1 == 2:
            p = next(models[0].parameters())
            with torch.no_grad():
                (p.to_local() if hasattr(p, "to_local") else p).view(-1)[0] = float("nan")
        return real_lr(cfg, s)
    monkeypatch.setattr(train, "load_policy", keep_policy)
    monkeypatch.setattr(train, "lr_at", corrupting_lr)
    with pytest.raises(RuntimeError, match="step 2: the weights are not finite; not saved"):
        train_main("--config", cfg)
    assert sorted(d for d in os.listdir(out) if d.startswith("step_")) == ["step_000001"]
    assert [r["actor/skipped_updates"] for r in metrics(out)] == [0, 1]


# ----------------------------------------------------------------------------- processes


def start_run(tmp_path, tiny_model_dir, name, backend="hf"):
    # transformers' generate unless said: what dies is a process
    cfg, out = setup_run(tmp_path, tiny_model_dir, name, steps=50, save_every=0, backend=backend)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           os.path.join(ROOT, "tests", "train_patched.py"), "--toy-reward", "--", "--config", cfg]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    return proc, out


def wait_for_steps(out, proc, timeout=240):
    t0 = time.time()
    while time.time() - t0 < timeout and proc.poll() is None:
        if os.path.exists(os.path.join(out, "metrics.jsonl")) and open(os.path.join(out, "metrics.jsonl")).read():
            return
        time.sleep(0.2)
    raise AssertionError("the run made no step")


@pytest.mark.slow
def test_a_dead_rank_ends_the_run_naming_it(tmp_path, tiny_model_dir):
    """A rank killed mid-run, each rank with its vLLM engine (whose shutdown the survivor must not
    wait on): the run ends within a minute naming rank 1, and no process of it is left, the
    engines' own included."""
    proc, out = start_run(tmp_path, tiny_model_dir, "rankdeath", backend="vllm")
    try:
        wait_for_steps(out, proc)
        workers = sorted(psutil.Process(proc.pid).children(), key=lambda p: p.pid)
        every = psutil.Process(proc.pid).children(recursive=True)  # the engines' processes too
        victim = next(w for w in workers if "RANK=1" in "".join(f"{k}={v}" for k, v in w.environ().items()
                                                             if k == "RANK"))
        t0 = time.time()
        victim.kill()
        text, _ = proc.communicate(timeout=120)
        took = time.time() - t0
    finally:
        if proc.poll() is None:
            for p in psutil.Process(proc.pid).children(recursive=True) + [psutil.Process(proc.pid)]:
                p.kill()
    print(f"run ended {took:.1f}s after rank 1 was killed")
    assert proc.returncode != 0
    assert "rank      : 1" in text and "Signal 9 (SIGKILL)" in text, text[-3000:]
    assert took < 60
    time.sleep(2)  # a process that outlives its parent by a moment is not left behind
    assert not [p for p in every if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.slow
def test_workers_exit_when_the_launcher_dies(tmp_path, tiny_model_dir):
    """SIGKILL of torchrun alone: the workers (sessions of their own) exit within a few seconds."""
    proc, out = start_run(tmp_path, tiny_model_dir, "launcherdeath")
    try:
        wait_for_steps(out, proc)
        workers = psutil.Process(proc.pid).children()
        assert len(workers) == 2
        t0 = time.time()
        proc.kill()
        gone, alive = psutil.wait_procs(workers, timeout=30)
        took = time.time() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    for p in alive:
        p.kill()
    print(f"workers exited {took:.1f}s after the launcher was killed")
    assert not alive and took < 10, f"{len(alive)} workers still running after {took:.1f}s"


@pytest.mark.slow
def test_fault_injection_short(tmp_path):
    """bench/fault_inject.py in short: 3 SIGKILLs of every process (one in start-up, one at random,
    one inside a checkpoint save) of a 2-step run, each resumed; the finished metrics equal an
    uninterrupted run's."""
    # transformers' generate: the kills and resumes are under test, not the engine (the resume's
    # order around vLLM's start, which seeds the RNGs, is tests/test_train_e2e.py's two-rank run)
    res = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "fault_inject.py"), "--kills", "3",
                          "--steps", "2", "--backend", "hf", "--slow-save", "0.5", "--work", str(tmp_path),
                          "--json", str(tmp_path / "f.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    fig = json.load(open(tmp_path / "f.json"))
    assert fig["kills"] == 3 and fig["kills_inside_a_save"] >= 1 and fig["max_difference"] == 0.0
    assert fig["wrong_resume_point"] == 0


# ----------------------------------------------------------------------------- eval.py


@pytest.mark.slow
def test_eval_bad_input_is_one_line(tmp_path, tiny_model_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "1+1?", "answer": "2"}\nnot json\n')
    res = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--ckpt", tiny_model_dir,
                          "--data", str(bad), "-n", "1", "--out", str(tmp_path / "r.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert f"error: {bad}:2: not valid JSON" in res.stderr
    res = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--ckpt", str(tmp_path),
                          "--data", str(bad)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "checkpoint not found" in res.stderr and "Traceback" not in res.stderr


def test_pruning_leaves_a_checkpoint_under_evaluation_be(tmp_path, tiny_model_dir, monkeypatch):
    """eval.py marks the checkpoint it evaluates (CKPT/eval/.running) until its results.json is written:
    pruning keeps that one's weights (before: deleted under the evaluation, which then wrote a stray
    step_X/eval/results.json with no weights beside it); a marker over a day old (a killed
    evaluation's) protects nothing. eval.py's own run writes and removes the marker."""
    for step in (100, 150, 151):
        fake_checkpoint(tmp_path / f"step_{step:06d}", tiny_model_dir, world=2, step=step)
    under_way, stale = tmp_path / "step_000100", tmp_path / "step_000150"
    for ckpt in (under_way, stale):
        os.makedirs(ckpt / "eval")
        (ckpt / "eval" / ".running").write_text("1234 0\n")
    day_old = time.time() - checkpoint.EVAL_RUNNING_S - 60
    os.utime(stale / "eval" / ".running", (day_old, day_old))
    assert checkpoint.prune_checkpoints(str(tmp_path), 151, keep_last=1) == [str(under_way)]
    assert sorted(os.listdir(tmp_path)) == ["step_000100", "step_000151"]
    assert "config.json" in os.listdir(under_way) and "optim" not in os.listdir(under_way)
