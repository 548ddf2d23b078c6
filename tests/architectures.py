"""Tiny random models of the architectures researchers train today besides Qwen2: Qwen3 (q/k norms),
Llama 3 (its rope scaling), Gemma 3 (sliding-window and global layers, q/k norms, scaled
embeddings, tied embeddings, its own chat template), made from a config, for tests of the whole
stack on CPU. Head size 32, the least vLLM's CPU attention takes.

The tokenizer: the character tokenizer of demo.py, or (chat=True) Qwen2.5-Math's real one from
../shared with the architecture's chat template: ChatML for Qwen3 (whose turns end at <|im_end|>),
Gemma's turns (<start_of_turn>, <end_of_turn>, added as special tokens) for Gemma 3.
"""
import os

import torch

from demo import make_char_tokenizer
from qwen_math import TOKENIZER_DIR, need_shared

ARCHS = ("qwen3", "llama", "gemma3")

# Gemma 3's chat template, as its tokenizer_config.json gives it (the system turn folded into the
# first user turn; the assistant's role is "model"), without the image handling.
GEMMA3_TEMPLATE = (
    "{{ bos_token or '' }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}")


def config(arch, vocab_size, eos, pad, sliding_window=8):
    """The transformers config of a tiny `arch` model."""
    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                  max_position_embeddings=512, bos_token_id=None, eos_token_id=eos, pad_token_id=pad,
                  tie_word_embeddings=True)
    if arch == "qwen3":
        from transformers import Qwen3Config
        return Qwen3Config(**common)
    if arch == "llama":
        from transformers import LlamaConfig
        return LlamaConfig(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 128},
                           **common)
    if arch == "gemma3":
        from transformers import Gemma3TextConfig
        return Gemma3TextConfig(sliding_window=sliding_window, query_pre_attn_scalar=32,
                                layer_types=["sliding_attention", "full_attention"], **common)
    raise ValueError(f"unknown architecture {arch!r}; choose one of {ARCHS}")


def make_arch_model(path, arch, *, chat=False, seed=0):
    """Write a tiny random `arch` model with its tokenizer to `path`; return path."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if chat:
        need_shared(TOKENIZER_DIR)
        tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
        if arch == "gemma3":
            tokenizer.add_special_tokens({"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
            tokenizer.chat_template = GEMMA3_TEMPLATE
        vocab, eos, pad = 151936, tokenizer.eos_token_id, tokenizer.pad_token_id
    else:
        tokenizer = make_char_tokenizer(128)
        vocab, eos, pad = 128, tokenizer.eos_token_id, tokenizer.pad_token_id
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config(arch, vocab, eos, pad)).float()
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
