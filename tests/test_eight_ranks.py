"""configs/math1.5b-tepo.yaml on eight gloo ranks, as on a node of 8 GPUs, in the GPU's precision
(a bf16 engine and train_dtype bfloat16), its own settings kept (group size 8, 4 mini-batches,
activation checkpointing, the packed layout) but for the engine (transformers' generate: what runs
in lock-step here is train.py's collectives, and vLLM never syncs the ranks while it samples; its
engines under torchrun are tests/test_rollout_torchrun.py's and the two-rank runs'), the model (the
tiny random one, tests/conftest.py), the data (slices of data.py fetch's MATH train set and
MATH-500) and the sizes:
two RL steps of 8 prompts, whose groups have reward spread (tests.custom_rewards:even_length) on
ranks 0-4 and none on ranks 5-7 (train_patched.py --flat-reward-on-ranks), so that ranks hold no
sequence of a mini-batch's update; then step 2 again, resumed from the step-1 checkpoint.

  - every rank makes the same collective calls, function by function, in every phase of every
    step (train_patched.py --count-collectives), the ranks without work included;
  - the held-out evaluation (6 problems: ranks 6 and 7 sample none) gives at step 0 the responses
    and accuracy of the same evaluation dealt over 1 and over 2 ranks (a straightforward
    reference here: eval.sample_benchmark on one engine, rank by rank);
  - the resumed step 2 is the uninterrupted one, every metric.
Slow: two launches of 8 ranks on the machine's cores, most of it the ranks' start (imports).
"""
import json
import os
import subprocess
import sys

import pytest

import eval as ev
import rollout
import train
from data import load_rows, load_tokenizer
from qwen_math import DATA_DIR, ROOT, need_shared

pytestmark = pytest.mark.slow
FLAT = (5, 6, 7)      # the ranks whose groups have equal rewards (A = 0): out of every update
VOLATILE = ("timing/",)


def launch(tmp_path, name, sets, *extra):
    """torchrun of 8 ranks, configs/math1.5b-tepo.yaml with `sets`, through train_patched.py.
    -> the directory of its dumps and counts"""
    out = tmp_path / f"{name}_dumps"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=8",
           os.path.join(ROOT, "tests", "train_patched.py"), "--count-collectives", str(out / "counts"),
           "--dump-eval", str(out / "eval"), "--dump-old-logprobs", str(out / "old"),
           "--flat-reward-on-ranks", ",".join(map(str, FLAT)), "--",
           "--config", os.path.join(ROOT, "configs", "math1.5b-tepo.yaml"),
           *[a for s in sets + [f"out_dir={tmp_path / name}"] for a in ("--set", s)], *extra]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"{' '.join(cmd)}\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
    return out


def lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def metrics(out_dir):
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)}
            for r in lines(os.path.join(out_dir, "metrics.jsonl"))]


def same_collectives(dumps):
    """Every rank's [(phase, {collective: calls})] equals rank 0's. -> rank 0's"""
    counts = [json.load(open(dumps / "counts" / f"rank{r}.json")) for r in range(8)]
    for r in range(1, 8):
        assert len(counts[r]) == len(counts[0]), (r, [c["phase"] for c in counts[r]])
        for i, (mine, first) in enumerate(zip(counts[r], counts[0])):
            assert mine == first, f"rank {r}, phase call {i}: {mine} != rank 0's {first}"
    return counts[0]


def test_eight_ranks_train_evaluate_and_resume_in_lock_step(tmp_path, tiny_model_dir):
    need_shared(DATA_DIR)
    data = {}
    for name, source, n in (("train", "math_train.jsonl", 40), ("math500_slice", "math500.jsonl", 6)):
        data[name] = tmp_path / f"{name}.jsonl"
        with open(os.path.join(DATA_DIR, source)) as f:
            data[name].write_text("".join(f.readlines()[:n]))
    # max_prompt_len: the tiny model's 1024 positions hold a prompt and its 16 new tokens
    sets = [f"model={tiny_model_dir}", f"train_data={data['train']}", f"eval_data={data['math500_slice']}",
            "reward=tests.custom_rewards:even_length", "failed_reward=0", "train_dtype=bfloat16", "steps=2",
            "prompts_per_step=8", "max_prompt_len=1000", "max_new_tokens=16", "save_every=1", "keep_last=0",
            "backend=hf"]
    whole = launch(tmp_path, "whole", sets)
    ma = metrics(tmp_path / "whole")
    assert [r["step"] for r in ma] == [0, 1, 2]

    # RL steps with informative groups on ranks 0-4, none on 5-7; some rank holds no sequence
    # in the loss of some mini-batch (it makes dummy calls for the others' forwards).
    for step in (1, 2):
        assert ma[step]["actor/optimizer_steps"] == 4 and ma[step]["actor/grad_norm"] > 0
        held = {r: lines(whole / "old" / f"rank{r}.jsonl")[step - 1] for r in range(8)}
        trained = {r: [sum(s["in_loss"] for s in held[r] if s["minibatch"] == k) for k in range(4)]
                   for r in range(8)}
        assert all(t == [0, 0, 0, 0] for r, t in trained.items() if r in FLAT), trained
        assert all(any(trained[r][k] for r in range(8)) for k in range(4)), trained
        assert any(len({s["adv"] for s in held[r]}) > 1 for r in range(8)), "no group with reward spread"

    # The same collectives on every rank, phase by phase; FSDP's among them.
    calls = same_collectives(whole)
    phases = [c["phase"] for c in calls]
    assert phases.count("update_policy") == 2 and phases.count("evaluate") == 2, phases
    update = next(c["calls"] for c in calls if c["phase"] == "update_policy")
    assert update.get("distributed.all_gather_single", 0) > 0, update  # FSDP2's, counted
    assert update.get("distributed.reduce_scatter_single", 0) > 0, update

    # The step-0 evaluation (the initial model) as on 1 and on 2 ranks: the same responses, problem
    # by problem, and the same accuracy. Ranks 6 and 7 had no problem.
    dealt = [lines(whole / "eval" / f"rank{r}.jsonl")[0] for r in range(8)]
    assert [[p["index"] for p in d] for d in dealt] == [[0], [1], [2], [3], [4], [5], [], []]
    on_eight = {p["index"]: p["responses"] for d in dealt for p in d}
    cfg = train.load_config(str(tmp_path / "whole" / "config.yaml"))
    tokenizer = load_tokenizer(cfg.model)
    rows, _ = load_rows(cfg.eval_data, cfg, tokenizer, 0)  # the prompts train.py samples
    prompt_ids = [r["prompt_ids"] for r in rows]
    engine = rollout.make_engine(cfg.model, backend=cfg.backend, dtype=cfg.dtype, seed=cfg.seed,
                                 max_model_len=cfg.max_prompt_len + cfg.max_new_tokens)
    judge = ev.make_judge(cfg.reward)
    try:
        for world in (1, 2):
            records = [p for rank in range(world) for p in ev.sample_benchmark(
                engine, "math500_slice", rows, prompt_ids, n=cfg.eval_n, max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed, chunk_size=1024, ks=[1],
                judge=judge, reward_timeout=cfg.reward_timeout, rank=rank, world=world)]
            assert {p["index"]: [s["response"] for s in p["samples"]] for p in records} == on_eight, world
            accuracy = sum(s["correct"] for p in records for s in p["samples"]) / (len(rows) * cfg.eval_n)
            assert ma[0]["eval/accuracy"] == pytest.approx(accuracy, abs=1e-12), world
    finally:
        engine.close()
    assert 0 < ma[0]["eval/accuracy"] < 1  # a judge that tells responses apart

    # Step 2 again, resumed on 8 ranks from the step-1 checkpoint: the same step, evaluation included.
    resumed = launch(tmp_path, "resumed", sets, "--resume", str(tmp_path / "whole" / "step_000001"))
    mb = metrics(tmp_path / "resumed")[-1]
    assert mb["step"] == 2 and mb.keys() == ma[2].keys() and "eval/accuracy" in mb
    for k in mb:
        assert mb[k] == pytest.approx(ma[2][k], rel=1e-6, abs=1e-9), k
    calls = same_collectives(resumed)
    assert [c["phase"] for c in calls].count("update_policy") == 1
