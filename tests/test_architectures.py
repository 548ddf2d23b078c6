"""Beyond Qwen2: Qwen3, Llama 3 and Gemma 3 through the whole stack, on tiny random models made from
a config (tests/architectures.py): packed log-probs equal each sequence's own forward; vLLM samples
what the trainer scores, before and after a weight sync; two RL steps on 2 ranks; the checkpoint's
config and weights; a resume equal to the uninterrupted run (Gemma 3's); eval.py on the
checkpoint; the chat template's end of turn."""
import json
import os

import pytest
import torch

import packing
import rollout
import tepo
from architectures import ARCHS, make_arch_model
from test_packing import own_forward_logprobs, packed_row
from test_train_e2e import metrics, setup_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_logprobs_equal_each_sequences_own_forward(tmp_path, arch):
    """Responses longer than Gemma 3's sliding window of 8, packed after their prompts, give the
    log-probs and entropies of each sequence alone through the model's own attention."""
    from transformers import AutoModelForCausalLM
    path = make_arch_model(str(tmp_path / arch), arch)
    seqs, batch = packed_row([9, 4, 13], [[12, 3, 20], [1, 30], [7, 9]], seed=4)
    model = packing.use_packed_attention(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32))
    with torch.no_grad():
        logp, _ = tepo.response_logprobs(model, batch, 1.0, True)
    for b, (s, want) in enumerate(zip(seqs, own_forward_logprobs(path, seqs))):
        assert torch.allclose(logp[b, :len(s.resp)], want, atol=1e-5), (arch, b)


def noisy_reward(response, gold, **kw):
    """tests/train_patched.py's --noisy-reward: '7' in the response, plus 1e-3 x a draw from each
    of torch's, Python's and numpy's global RNGs (reward spread in every group, and a resume equal
    to the uninterrupted run only if it restores all three)."""
    import random

    import numpy as np
    return float("7" in response) + 1e-3 * (torch.rand(()).item() + random.random() + np.random.rand())


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_rl_steps_resume_and_eval(tmp_path, arch):
    """Two RL steps on 2 FSDP2 ranks (torchrun, transformers' generate): the weights move; the
    checkpoint, gathered from the shards, holds the architecture's config and every weight of its
    shape; eval.py reads it. Gemma 3 with its chat template (prompts built by it, <end_of_turn> a
    stop token), and a run resumed from its step 1 on 2 ranks ends as the uninterrupted one (one
    architecture's resume: checkpoint.py has no code per architecture). vLLM, in this process,
    samples what transformers scores on the model made and, after a weight sync, on the step-1
    checkpoint (the engine's own code per architecture). train.py's engine has no code per
    architecture: the two-rank vLLM runs of tests/test_train_e2e.py and tests/test_paper_path.py
    are Qwen2's."""
    from test_train_e2e import run
    chat = arch == "gemma3"
    model = make_arch_model(str(tmp_path / "model"), arch, chat=chat)
    common = dict(steps=2, save_every=1, keep_last=0, num_minibatches=1, lr=1e-2, backend="hf", max_new_tokens=12,
                  **({"prompt_template": None, "max_prompt_len": 96} if chat else {}))
    cfg_a, out_a = setup_run(tmp_path, model, "whole", **common)
    run(cfg_a, nproc=2, patch=("--noisy-reward",))
    ma = metrics(out_a)
    assert [r["step"] for r in ma] == [1, 2]
    assert ma[1]["actor/grad_norm"] > 0 and ma[1]["actor/optimizer_steps"] == 1
    # The checkpoint: the model's config as it was made (Llama's rope parameters, Gemma's window and
    # layer types, ...), every weight of its shape (Qwen3's q/k norms, ...), the trained ones moved.
    import transformers
    from safetensors.torch import load_file
    step1 = os.path.join(out_a, "step_000001")
    made, saved = (transformers.AutoConfig.from_pretrained(p).to_dict() for p in (model, step1))
    assert {k: v for k, v in made.items() if k != "_name_or_path"} == \
        {k: v for k, v in saved.items() if k != "_name_or_path"}
    before, after = (load_file(os.path.join(p, "model.safetensors")) for p in (model, step1))
    assert {k: v.shape for k, v in before.items()} == {k: v.shape for k, v in after.items()}
    assert any(not torch.equal(v, after[k]) for k, v in before.items())
    if arch == "gemma3":
        # Step 2 again, resumed from the run's step-1 checkpoint (a branch into an out_dir of its
        # own, one launch fewer than a run of one step then --resume): the same step 2.
        cfg_b, out_b = setup_run(tmp_path, model, "resumed", **common)
        run(cfg_b, "--resume", step1, nproc=2, patch=("--noisy-reward",))
        mb = metrics(out_b)[-1]
        assert mb["step"] == 2 and ma[1].keys() == mb.keys()
        for k in ma[1]:
            assert ma[1][k] == pytest.approx(mb[k], rel=1e-6, abs=1e-9), k
    import eval as ev
    bench = tmp_path / "held_out.jsonl"
    bench.write_text("".join(json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                             for i in range(4)))
    out = ev.main(["--ckpt", os.path.join(out_a, "final"), "--data", str(bench), "-n", "2", "--backend", "hf",
                   "--temperature", "1.0", "--top-p", "1.0", "--max-new-tokens", "8",
                   "--out", str(tmp_path / "eval" / "results.json")])
    assert out["benchmarks"]["held_out"]["problems"] == 4
    # vLLM samples what the trainer scores (fp32), before and after a sync of the step-1 weights
    from test_rollout import max_logprob_error
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [tok("What is 2 + 2?", add_special_tokens=False)["input_ids"], tok("The cat", add_special_tokens=False)["input_ids"]]
    engine = rollout.make_engine(model, backend="vllm", dtype="float32", max_model_len=128, seed=0)
    try:
        for weights in (model, step1):
            if weights != model:
                engine.update_weights(load_file(os.path.join(weights, "model.safetensors")).items())
            reference = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32).eval()
            out = engine.generate(prompts, n=4, max_new_tokens=16, temperature=1.0, seed=1)
            assert max_logprob_error(reference, out, 1.0) < 1e-4, (arch, weights)
    finally:
        engine.close()


def test_gemma3s_chat_template_ends_a_turn_with_a_stop_token(tmp_path):
    """The chat template's end of turn (<end_of_turn>) stops sampling, as <|im_end|> does for
    Qwen's: found in the template, listed among the engine's stop ids."""
    from transformers import AutoTokenizer
    path = make_arch_model(str(tmp_path / "g"), "gemma3", chat=True)
    tok = AutoTokenizer.from_pretrained(path)
    end = tok.convert_tokens_to_ids("<end_of_turn>")
    assert rollout.chat_end_of_turn_id(tok) == end
    assert end in rollout._stop_ids(path, tok)


def test_a_mixture_of_experts_stops_training_at_start_on_the_cpu(tmp_path):
    """Qwen3-MoE: vLLM's CPU build samples it right, but a weight sync leaves its experts stale;
    train.py stops at start with one line naming the model type and why (eval.py may sample it)."""
    import subprocess
    import sys
    import yaml
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    from demo import make_char_tokenizer
    tok = make_char_tokenizer(128)
    cfg = Qwen3MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=64,
                         num_experts=4, num_experts_per_tok=2, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=32, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, bos_token_id=None)
    path = str(tmp_path / "moe")
    Qwen3MoeForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    assert "qwen3_moe is a mixture of experts" in rollout.cannot_sync(path)
    assert rollout.cannot_sync(path, backend="hf") is None
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    config = tmp_path / "moe.yaml"
    config.write_text(yaml.safe_dump({"model": path, "train_data": str(data), "out_dir": str(tmp_path / "out")}))
    run = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--config", str(config)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "model_type qwen3_moe is a mixture of experts" in run.stderr.strip().splitlines()[-1]


def configs_naming_experts():
    """The model types of the installed transformers whose configuration module speaks of experts
    (MoE configs, and dense ones that can be switched to a MoE), read from the source: none built."""
    import transformers.models
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES, model_type_to_module_name
    root = os.path.dirname(transformers.models.__file__)
    found = []
    for model_type in CONFIG_MAPPING_NAMES:
        module = model_type_to_module_name(model_type)
        source = os.path.join(root, module, f"configuration_{module}.py")
        if os.path.exists(source):
            with open(source) as f:
                if "expert" in f.read():
                    found.append(model_type)
    return sorted(found)


def counts_experts(config):
    """Whether a config.json (a dict) gives any part of the model experts: a number above 0 under
    any key naming experts (routed, shared, per token, ...), at any depth."""
    if isinstance(config, list):
        return any(counts_experts(c) for c in config)
    return isinstance(config, dict) and any(
        ("expert" in str(k) and isinstance(v, int) and not isinstance(v, bool) and v > 0) or counts_experts(v)
        for k, v in config.items())


DENSE = ("qwen2", "qwen3", "llama", "gemma3_text", "mistral", "phi3", "olmo2")
# Composite configs whose text part is another type's config by default (DeepSeek V3's, Nemotron-H's),
# which a scan of their own module does not see.
COMPOSITE = ("kimi_k25", "nemotron_h_omni")
# A config whose defaults carry an expert count for a block they do not build.
SWITCHED_OFF = {"doge": "is_moe: false"}


@pytest.mark.parametrize("model_type", configs_naming_experts() + list(COMPOSITE + DENSE))
def test_every_mixture_of_experts_transformers_ships_is_refused_on_the_cpu(tmp_path, model_type):
    """Each config class of the installed transformers that names experts, built with its defaults
    and saved as a checkpoint's config.json: refused for the CPU's weight sync exactly when it gives
    the model experts (DeepSeek's n_routed_experts, DBRX's ffn_config.moe_num_experts, ERNIE's
    moe_num_experts, a thinker's text_config...); a dense one (Qwen2, Llama, Gemma 3, Gemma 4 without
    its MoE block) is not."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"this transformers has no {model_type}")
    try:
        config = CONFIG_MAPPING[model_type]()
    except Exception as e:  # a config that cannot be built from its defaults alone
        pytest.skip(f"{model_type} has no default config: {type(e).__name__}")
    config.save_pretrained(str(tmp_path))
    with open(tmp_path / "config.json") as f:
        moe = counts_experts(json.load(f)) and model_type not in SWITCHED_OFF
    why = rollout.cannot_sync(str(tmp_path))
    assert (why is not None) == moe, (model_type, why)
    if moe:
        assert why.endswith("vLLM's CPU build cannot take in place: a weight sync would leave the experts stale")


def test_a_mixture_of_experts_with_a_null_text_config_is_refused_in_one_line(tmp_path):
    """A config.json with "text_config": null names its own model_type (it raised AttributeError)."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "x", "text_config": None, "num_experts": 4}))
    assert rollout.cannot_sync(str(tmp_path)).startswith("model_type x is a mixture of experts (4)")


@pytest.mark.parametrize("model_type, switch", [
    ("doge", dict(is_moe=True)),
    ("gemma4_text", dict(enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=64))])
def test_a_config_switched_to_its_mixture_of_experts_is_refused(tmp_path, model_type, switch):
    """Doge and Gemma 4 carry an expert count their defaults do not build (above: not refused);
    switched on, they are a mixture of experts."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    CONFIG_MAPPING[model_type](**switch).save_pretrained(str(tmp_path))
    assert f"model_type {model_type} is a mixture of experts" in rollout.cannot_sync(str(tmp_path))
