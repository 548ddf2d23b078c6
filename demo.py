"""The demo: a tiny Qwen2 model with a character-level tokenizer, made here from nothing.

No model hub is needed: `make_tiny_model(dir)` writes a transformers-format directory
(config, safetensors, tokenizer) that transformers, vLLM and every file of this project load
like any hub checkpoint. The tests and benchmarks use it at several sizes.
"""
import os

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

PAD, EOS = "<|pad|>", "<|eos|>"
# Every printable ASCII character plus newline, one token each: 2 specials + 96 characters.
CHARS = [chr(c) for c in range(32, 127)] + ["\n"]


def make_char_tokenizer(vocab_size=128):
    """A character-level tokenizer: one token per character, unknown characters map to '?'.

    Built with the `tokenizers` library so it saves as a standard `tokenizer.json` that vLLM reads.
    The vocabulary is padded with unused tokens to `vocab_size` (a multiple of 8 suits the kernels).
    """
    vocab = {PAD: 0, EOS: 1}
    for ch in CHARS:
        vocab[ch] = len(vocab)
    assert vocab_size >= len(vocab), f"vocab_size must be at least {len(vocab)}"
    for i in range(len(vocab), vocab_size):
        vocab[f"<|unused{i}|>"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="?"))
    # Split into single characters ((?s) lets '.' match newlines); Fuse joins them back on decode.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS,
                                   unk_token="?", model_max_length=4096)


def make_tiny_model(path, *, hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128,
                    vocab_size=128, max_positions=1024, seed=0):
    """Write a random-weight Qwen2ForCausalLM with the character tokenizer to `path`; return path.

    Head size is hidden // heads; vLLM's CPU attention needs it to be 32 or more.
    """
    torch.manual_seed(seed)
    tokenizer = make_char_tokenizer(vocab_size)
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32")
    model = Qwen2ForCausalLM(config)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
