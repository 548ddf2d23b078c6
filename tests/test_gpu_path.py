"""Defects that would stop a GPU run in its first minute or quietly spoil it, each checked on CPU:
the process group's backends, DAPO's filter, sampling settings a checkpoint ships, dropout,
typed loss keys, the checkpoint lifecycle, and the chat template's end of turn."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch
from torch.distributed.distributed_c10d import BackendConfig

import data
import checkpoint, policy, ranks
import rollout
import train
from demo import make_tiny_model
from qwen_math import ENDOFTEXT, IM_END, TOKENIZER_DIR, make_qwen_math_model, need_shared

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------- process group


def test_the_engine_is_not_started_where_its_share_of_the_gpu_is_not_free(tiny_model_dir, monkeypatch):
    """vLLM starts only with gpu_memory_utilization x the GPU's memory free; on a resume the trainer
    holds its optimizer state there already. A GPU of 80 GiB with 30 free (26 held by this process,
    24 by others): 0.4 (32 GiB) is refused in one line with the figures and the utilization that
    fits, before vLLM starts (before: vLLM's own error, blaming other processes); 0.37 starts."""
    started = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (30 * 2 ** 30, 80 * 2 ** 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 26 * 2 ** 30)
    monkeypatch.setattr(rollout, "VLLMEngine", lambda *a: started.append(a[-1]["gpu_memory_utilization"]))
    with pytest.raises(train.UserError, match=re.escape(
            "gpu_memory_utilization 0.4: vLLM's engine needs 0.4 x 80.0 GiB = 32.0 GiB of cuda:0 free at its "
            "start, and 30.0 GiB is (26.0 GiB held by this process: the trainer's weights, and on a resume its "
            "optimizer state; 24.0 GiB by others): set gpu_memory_utilization to 0.37 or less (a --resume may "
            "change it; the engine gets less KV cache), or free the GPU")):
        rollout.make_engine(tiny_model_dir, backend="vllm", gpu_memory_utilization=0.4)
    assert started == []
    rollout.make_engine(tiny_model_dir, backend="vllm", gpu_memory_utilization=0.37)
    assert started == [0.37]


@pytest.mark.parametrize("cuda", [True, False])
def test_the_process_group_reduces_cpu_tensors_on_every_device(cuda):
    """Metrics are all-reduced as CPU tensors: the group must map the CPU to gloo on GPUs too (an
    nccl-only group fails there: "No backend type associated with device type cpu")."""
    backends = BackendConfig(ranks.process_group_backend(cuda)).get_device_backend_map()
    assert backends["cpu"] == "gloo"
    if cuda:
        assert backends["cuda"] == "nccl"


# ----------------------------------------------------------------------------- DAPO

def test_dynamic_sampling_filters_on_correctness_not_on_shaped_reward():
    """A group all right (or all wrong) is dropped even when the overlong penalty spreads its
    rewards; a group with right and wrong answers is kept even when its rewards tie."""
    all_right = train.Group({}, ["s"] * 3, [1.0, 0.7, 0.4], [True, True, True])
    all_wrong = train.Group({}, ["s"] * 3, [0.0, -0.3, 0.0], [False, False, False])
    mixed = train.Group({}, ["s"] * 3, [1.0, 1.0, 0.0], [True, True, False])
    tie = train.Group({}, ["s"] * 2, [0.5, 0.5], [True, False])  # format reward 0.5: boxed, wrong
    assert train.informative_groups([all_right, mixed, all_wrong, tie]) == [mixed, tie]


# ----------------------------------------------------------------------------- sampling settings

SHIPPED = {"do_sample": True, "repetition_penalty": 1.3, "top_k": 5, "top_p": 0.7,
           "temperature": 0.6, "eos_token_id": 127}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_engines_sample_what_the_config_says_whatever_the_checkpoint_ships(tmp_path, backend):
    """A checkpoint whose generation_config.json sets repetition_penalty, top_k, top_p and
    temperature: the engine's log-probs at temperature 1, top_p 1 must be the trainer's."""
    path = make_tiny_model(str(tmp_path / "m"), hidden=64, layers=2, heads=2, kv_heads=1,
                           intermediate=128, vocab_size=128)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump(SHIPPED, f)
    engine = rollout.make_engine(path, backend=backend, dtype="float32", max_model_len=96, seed=0)
    try:
        groups = engine.generate(["abc 12+7=", "what is 3*3"], n=4, max_new_tokens=24, temperature=1.0,
                                 top_p=1.0, seed=1)
    finally:
        engine.close()
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    worst = 0.0
    with torch.no_grad():
        for s in (s for g in groups for s in g):
            logits = model(torch.tensor([s.prompt_ids + s.response_ids])).logits[0].float()
            lp = logits[len(s.prompt_ids) - 1:-1].log_softmax(-1)
            want = lp.gather(1, torch.tensor(s.response_ids)[:, None]).squeeze(1)
            worst = max(worst, (torch.tensor(s.logprobs) - want).abs().max().item())
    assert worst < 1e-4, f"{backend}: log-probs differ from the trainer's by {worst:.3g}"


# ----------------------------------------------------------------------------- dropout

def test_a_checkpoint_with_dropout_trains_without_it(tmp_path):
    path = make_tiny_model(str(tmp_path / "m"), hidden=64, layers=2, heads=2, kv_heads=1)
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config["attention_dropout"] = 0.5
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    model = policy.load_model(path).train()
    ids = torch.randint(2, 100, (2, 24), generator=torch.Generator().manual_seed(0))
    a, b = model(input_ids=ids).logits, model(input_ids=ids).logits
    assert torch.equal(a, b), "two forward passes in train mode differ: dropout is on"


# ----------------------------------------------------------------------------- config

def test_loss_keys_are_typed_and_named():
    base = ["model=m", "train_data=d"]
    cfg = train.load_config(None, base + ["loss.clip_high=5e-4", "loss.kl_mask_coef=1"])
    assert cfg.loss_cfg.clip_high == 5e-4 and isinstance(cfg.loss_cfg.kl_mask_coef, float)
    for bad, message in [("loss.clip_high=abc", "'loss.clip_high' must be a number"),
                         ("loss.kl_mask=3", "'loss.kl_mask' must be true or false"),
                         ("loss.max_new_tokens=1.5", "'loss.max_new_tokens' must be an integer"),
                         ("loss.aggregation=5", "'loss.aggregation' must be a str"),
                         ("loss=7", "'loss' must be a mapping")]:
        with pytest.raises(ValueError, match=message):
            train.load_config(None, base + [bad])


# ----------------------------------------------------------------------------- checkpoints

def test_a_kill_while_a_step_is_saved_again_leaves_a_whole_checkpoint(tmp_path, monkeypatch):
    """Saving step N when step_N exists: a kill between the two renames must leave one whole
    copy that list_checkpoints finds (the old code removed step_N before the rename)."""
    out = tmp_path / "run"
    (out / "step_000004").mkdir(parents=True)
    (out / "step_000004" / "trainer_state.json").write_text('{"step": 4, "version": "old"}')
    (out / "step_000004.tmp").mkdir()
    (out / "step_000004.tmp" / "trainer_state.json").write_text('{"step": 4, "version": "new"}')
    real_replace = os.replace

    def killed(src, dst):
        if str(src).endswith(".tmp"):
            raise KeyboardInterrupt("killed")
        return real_replace(src, dst)
    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.publish(str(out / "step_000004.tmp"), str(out / "step_000004"))
    found = checkpoint.list_checkpoints(str(out))
    assert len(found) == 1
    assert json.load(open(os.path.join(found[0], "trainer_state.json")))["version"] == "old"
    monkeypatch.setattr(os, "replace", real_replace)
    checkpoint.publish(str(out / "step_000004.tmp"), str(out / "step_000004"))  # the save done again
    assert checkpoint.list_checkpoints(str(out)) == [str(out / "step_000004")]
    assert json.load(open(out / "step_000004" / "trainer_state.json"))["version"] == "new"
    assert sorted(os.listdir(out)) == ["step_000004"]


def test_list_checkpoints_ignores_partial_and_foreign_directories(tmp_path):
    for name in ("step_000002", "step_000010", "step_000012.tmp", "step_notes", "final"):
        (tmp_path / name).mkdir()
    assert checkpoint.list_checkpoints(str(tmp_path)) == [str(tmp_path / "step_000002"),
                                                     str(tmp_path / "step_000010")]
    with pytest.raises(ValueError, match="keep_last must be >= 0"):
        train.Config(model="m", train_data="d", keep_last=-1)


SHARED_DIR_SCRIPT = r'''
import sys, torch.distributed as dist
sys.path.insert(0, ROOT)
import ranks, runs
dist.init_process_group("gloo")
rank = dist.get_rank()
out = sys.argv[1] if rank == 0 or sys.argv[2] == "shared" else sys.argv[1] + "-node-local"
try:
    runs.check_shared_dir(out, rank, dist.get_world_size())
    print("SHARED", flush=True)
except RuntimeError as e:
    print("ERROR", e, flush=True)
ranks.end_distributed()  # not a bare destroy_process_group: gloo's threads may abort the exit
'''


@pytest.mark.slow
def test_multi_node_runs_need_a_shared_out_dir(tmp_path):
    """Rank 1 looking at another directory stands for a node whose out_dir is a local disk: every
    rank stops with the error (none is left waiting for the others)."""
    script = tmp_path / "check.py"
    script.write_text(f"ROOT = {ROOT!r}\n" + SHARED_DIR_SCRIPT)
    for mode, want in (("shared", "SHARED"), ("local", "cannot see the file rank 0 wrote")):
        out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                              "--nproc_per_node=2", str(script), str(tmp_path / mode), mode],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and out.stdout.count(want) == 2, \
            out.stdout[-2000:] + out.stderr[-3000:]
        assert not [f for f in os.listdir(tmp_path / mode) if f.startswith(".shared")]


# ----------------------------------------------------------------------------- end of turn

def test_the_chat_templates_end_of_turn_stops_sampling():
    """Qwen2.5-Math's config and generation_config name only <|endoftext|>; its chat template
    ends turns with <|im_end|>, which must stop a response too."""
    from transformers import AutoTokenizer
    need_shared(TOKENIZER_DIR)
    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    assert rollout.chat_end_of_turn_id(tok) == IM_END
    assert rollout._stop_ids(TOKENIZER_DIR, tok) == {ENDOFTEXT, IM_END}


@pytest.fixture(scope="module")
def im_end_model(tmp_path_factory):
    return make_qwen_math_model(str(tmp_path_factory.mktemp("im_end") / "m"), emit=IM_END)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_a_model_that_closes_its_turn_gives_one_token_responses(im_end_model, backend):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(im_end_model)
    prompts = [data.build_prompt(tok, p) for p in ("What is 1+1?", "Solve $x^2=4$.")]
    engine = rollout.make_engine(im_end_model, backend=backend, dtype="float32",
                                 max_model_len=256, seed=0)
    try:
        groups = engine.generate(prompts, n=3, max_new_tokens=64, temperature=1.0, top_p=1.0, seed=0)
    finally:
        engine.close()
    for s in (s for g in groups for s in g):
        assert (s.response_ids, s.finish_reason) == ([IM_END], "stop"), s.response_ids[:8]


@pytest.mark.slow
def test_eval_stops_at_the_end_of_turn(im_end_model, tmp_path):
    """eval.py with the chat template (no prompt_template in the checkpoint): one-token responses,
    none truncated. (transformers' generate: each engine's stop at <|im_end|> is checked above.)"""
    import eval as ev
    bench = tmp_path / "b.jsonl"
    bench.write_text("".join(json.dumps({"problem": f"What is {i}+1?", "answer": str(i + 1)}) + "\n"
                             for i in range(3)))
    out = ev.main(["--ckpt", im_end_model, "--data", str(bench), "-n", "2", "--max-new-tokens", "32",
                   "--temperature", "1.0", "--top-p", "1.0", "--backend", "hf", "--out", str(tmp_path / "r.json")])
    got = out["benchmarks"]["b"]
    assert got["mean_response_tokens"] == 1 and got["truncation_rate"] == 0
