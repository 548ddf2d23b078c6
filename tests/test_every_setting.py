"""Every key a researcher can turn on, and every value of every choice of LossConfig, run through
train.py end to end (two RL steps, in this process on one rank: conftest.train_here), where no
other test trains with it. A key that only its formula's unit test reads may still crash in the
loop that wires it; each run here checks that the loop ends with finite metrics, that the weights
moved, and the key's own footprint in metrics.jsonl where it has one.

Where each key's other values run (so that a value missing here is not a value untrained):
method tepo everywhere, grpo (tests/test_train_invariants.py), dapo, klcov (tests/test_gpu_configs.py),
gspo (tests/test_bf16.py), clipcov (tests/test_train_e2e.py), gmpo, cispo, sapo here (and with them
every loss.surrogate); backend vllm, train_dtype and dtype
bfloat16, activation_checkpointing (tests/test_bf16.py); loggers (tests/test_trackers.py); a
reward of one's own (tests/test_custom_reward.py); kl_mask_target ref and the old log-probs of
later mini-batches (tests/test_train_steps.py). Not runnable on a CPU: packed_attention flex (the
CPU has no FlexAttention backward; bench/gpu_check.py runs it on a GPU), gpu_memory_utilization
(vLLM's GPU share: set here, read only on a GPU)."""
import json
import math

import pytest
import torch
from safetensors.torch import load_file

import train
from conftest import BOXED_TEMPLATE, read_metrics, toy_reward

SETTINGS = {
    # Dr.GRPO: its aggregation (L_max from loss.max_new_tokens), no std division; with a cosine
    # schedule after a warm-up, AdamW's betas and weight decay, another seed and temperature (top_p
    # takes 1.0 alone in training), and the metrics over the trained samples only
    "drgrpo-cosine": dict(method="drgrpo", loss={"max_new_tokens": 30}, lr_schedule="cosine",
                          warmup_steps=1, min_lr_ratio=0.1, steps=3, betas=[0.8, 0.95], weight_decay=0.01,
                          seed=1, temperature=0.8, full_batch_metrics=False),
    # GRPO's KL term by k1 and k2, the layout of before with the sdpa kernel named, shaping on
    "grpo-k1-grouped": dict(method="grpo", loss={"kl_kind": "k1"}, micro_batch_layout="grouped",
                            packed_attention="sdpa", no_answer_penalty=0.5, format_reward=0.1,
                            gpu_memory_utilization=0.5),
    "grpo-k2": dict(method="grpo", loss={"kl_kind": "k2", "clip_low": 0.1, "clip_high": 0.3, "kl_coef": 0.01}),
    # the mismatch corrections, per token and per sequence
    "tepo-tis-sequence": dict(loss={"is_correction": "tis", "is_level": "sequence", "is_cap": 1.5,
                                    "kl_mask_coef": 0.5}),
    "gspo-mask-token": dict(method="gspo", loss={"is_correction": "mask", "is_level": "token", "is_cap": 3.0}),
    # TEPO without its mask; an entropy bonus
    "tepo-nomask-bonus": dict(loss={"kl_mask": False, "entropy_coef": 0.01}),
    # Clip-Cov and KL-Cov over every response token, with their defaults and other coefficients
    "clipcov-all": dict(method="clipcov", loss={"cov_tokens": "all", "cov_ratio": 0.05}),
    "klcov-all-micro": dict(method="klcov", loss={"cov_tokens": "all", "cov_batch": "microbatch",
                                                 "kl_cov_coef": 0.5, "cov_ratio": 0.05}),
    # DAPO's pieces set by hand on another method; a failed call's reward named
    "grpo-dapo-parts": dict(method="grpo", dynamic_sampling=True, max_sampling_tries=2, wrong_reward=-0.5,
                            overlong_buffer=8, overlong_factor=2.0, failed_reward=-1.0),
    # the newer losses (GMPO; SAPO with temperatures of its own) and the 80/20 rule: on CISPO, and
    # on Clip-Cov over every response token (both choices from one selection pass)
    "gmpo": dict(method="gmpo"),
    "sapo-taus": dict(method="sapo", loss={"sapo_tau_pos": 2.0, "sapo_tau_neg": 3.0}),
    "cispo-top-entropy": dict(method="cispo", loss={"top_entropy_frac": 0.2}),
    "clipcov-all-top-entropy": dict(method="clipcov", loss={"top_entropy_frac": 0.5, "cov_tokens": "all",
                                                            "cov_lb": 0.0, "cov_ub": 100.0}),
    # the rollout in float16
    "tepo-float16": dict(dtype="float16"),
    # the update's log-probs from the model's logits (the path of before; every other run here takes
    # them from the hidden states in chunks: lm_head auto); activation checkpointing on 1 of the 2
    # layers, each layer compiled (its compile time said at start)
    "tepo-lm-head-logits": dict(lm_head="logits"),
    "tepo-checkpoint-one-layer-compiled": dict(activation_checkpointing=True, checkpoint_layers=1, compile=True),
    # the real graders, each alone (the boxed model answers 7 or 8: right about half the time)
    "grader-rule": dict(reward="rule", format_reward=0.2, boxed=True),
    "grader-math_verify": dict(reward="math_verify", boxed=True),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_the_setting_trains(train_here, tiny_model_dir, boxed_model, tmp_path, request, name):
    settings = dict(SETTINGS[name])
    if settings.get("compile"):
        request.getfixturevalue("compile_without_codegen")
    reward_fn, model = toy_reward, tiny_model_dir
    if settings.pop("boxed", False):  # graded for real: questions whose answer is 7
        data = tmp_path / "sevens.jsonl"
        data.write_text("".join(json.dumps({"problem": f"What is {i} plus {7 - i}?", "answer": "7"}) + "\n"
                                for i in range(8)))
        reward_fn, model = None, boxed_model
        settings.update(model=boxed_model, train_data=str(data), prompt_template=BOXED_TEMPLATE)
    out = train_here(name, reward_fn=reward_fn, **settings)
    cfg = train.load_config(f"{out}.yaml")
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == list(range(1, cfg.steps + 1))
    for r in rows:
        bad = {k: v for k, v in r.items() if isinstance(v, float) and not math.isfinite(v)}
        assert not bad, f"step {r['step']}: not finite {bad}"
        assert r["actor/lr"] == pytest.approx(train.lr_at(cfg, r["step"] - 1))
    assert sum(r["actor/optimizer_steps"] for r in rows) > 0, "no step trained: the test proves nothing"
    before = load_file(f"{model}/model.safetensors")
    after = load_file(f"{out}/final/model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in after), "the weights did not move"
    lcfg = cfg.loss_cfg
    trained = [r for r in rows if r["actor/optimizer_steps"]]
    if lcfg.is_correction != "none":
        assert all("mismatch/is_weight" in r for r in trained)
    if lcfg.is_correction == "mask":
        assert all("mismatch/masked_frac" in r for r in trained)
    if lcfg.cov == "kl":
        assert all(r["actor/cov_selected_frac"] > 0 for r in trained)
    if lcfg.cov == "clip":  # its default band (1, 5) of cov may hold none of a tiny model's tokens
        assert all("actor/cov_selected_frac" in r for r in trained)
    if lcfg.entropy_coef:
        assert all(r["loss/entropy_bonus"] < 0 for r in trained)
    if lcfg.top_entropy_frac:  # the share kept: about the key's, of the trained tokens
        assert all(0 < r["actor/high_entropy_frac"] <= lcfg.top_entropy_frac + 0.1 for r in trained)
    if lcfg.kl_coef:
        assert all("actor/kl_ref" in r for r in trained)
    if not cfg.full_batch_metrics:
        assert all(r["actor/entropy"] is None or r["actor/entropy"] > 0 for r in rows)
    if cfg.dynamic_sampling:
        assert all("reward/groups_kept" in r for r in rows)
