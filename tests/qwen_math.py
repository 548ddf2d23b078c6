"""A random 2-layer Qwen2 model with Qwen2.5-Math-1.5B's real tokenizer, vocabulary (151,936),
config.json fields and generation_config.json, for tests of the GPU configurations on CPU; and where
the tests find what they need from outside the repository.

The data sets (data.py fetch's files, and the raw upstream files it keeps in upstream/) come from
$TEPO_DATA_DIR, the tokenizer files from $TEPO_QWEN_TOKENIZER; unset, from ../shared/data,
../shared/upstream and ../shared/qwen2.5-math-tokenizer (see its PROVENANCE.md), which this
repository's CI puts beside the checkout. Tests that need them skip when they are absent, saying
what is missing and how to provide it (need_shared).
"""
import json
import os
import shutil

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
DATA_DIR = os.environ.get("TEPO_DATA_DIR") or os.path.join(SHARED, "data")
UPSTREAM = os.path.join(DATA_DIR, "upstream") if os.environ.get("TEPO_DATA_DIR") else os.path.join(SHARED, "upstream")
TOKENIZER_DIR = os.environ.get("TEPO_QWEN_TOKENIZER") or os.path.join(SHARED, "qwen2.5-math-tokenizer")
TOKENIZER_FILES = ("config.json", "generation_config.json", "vocab.json", "merges.txt", "tokenizer_config.json")
IM_END = 151645        # <|im_end|>: the chat template's end of turn
ENDOFTEXT = 151643     # <|endoftext|>: the only eos of config.json and generation_config.json
HOW = {DATA_DIR: "the eight data sets: `python data.py fetch --out DIR`, then TEPO_DATA_DIR=DIR",
       UPSTREAM: "the data sets' raw upstream files, which `python data.py fetch --out DIR` keeps in "
                 "DIR/upstream: TEPO_DATA_DIR=DIR",
       TOKENIZER_DIR: f"Qwen2.5-Math-1.5B's tokenizer and config files: `hf download Qwen/Qwen2.5-Math-1.5B "
                      f"{' '.join(TOKENIZER_FILES)} --local-dir DIR`, then TEPO_QWEN_TOKENIZER=DIR"}


def need_shared(*paths):
    """Skip the calling test when one of `paths` (DATA_DIR, UPSTREAM, TOKENIZER_DIR) is absent,
    saying what it holds and how to provide it."""
    for p in paths:
        if not os.path.exists(p):
            pytest.skip(f"{p} is absent: this test needs {HOW.get(p, p)} (tests/qwen_math.py)")


def make_qwen_math_model(path, *, layers=2, hidden=64, heads=2, kv_heads=1, intermediate=128,
                         emit=None, seed=0, generation_config=None):
    """Write the model to `path`; return path.

    The config is Qwen2.5-Math-1.5B's config.json with the sizes made small (head size 32, the
    least vLLM's CPU attention takes). `emit`: a token id the model then samples first with
    probability ~1 (the residual stream carries a constant in one channel that only the LM head's
    row for `emit` reads). `generation_config`: written instead of the real one.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM
    need_shared(TOKENIZER_DIR)
    with open(os.path.join(TOKENIZER_DIR, "config.json")) as f:
        real = json.load(f)
    real.update(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv_heads, max_window_layers=layers,
                torch_dtype="float32", tie_word_embeddings=emit is None)
    for key in ("architectures", "transformers_version", "model_type"):
        real.pop(key, None)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**real)).float()
    if emit is not None:
        with torch.no_grad():
            d = 0  # channel 0: a constant 50 in every embedding, untouched by the layers
            model.model.embed_tokens.weight[:, d] = 50.0
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight[d] = 0.0
                layer.mlp.down_proj.weight[d] = 0.0
            model.model.norm.weight.zero_()
            model.model.norm.weight[d] = 1.0
            model.lm_head.weight.zero_()
            model.lm_head.weight[emit, d] = 100.0
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    for f in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKENIZER_DIR, f), path)
    if generation_config is None:
        shutil.copy(os.path.join(TOKENIZER_DIR, "generation_config.json"), path)
    else:
        with open(os.path.join(path, "generation_config.json"), "w") as f:
            json.dump(generation_config, f)
    return path
