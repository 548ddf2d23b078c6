"""Config `compile`: each decoder layer compiled with torch.compile (policy.compile_layers) gives the
eager model's log-probs, entropies and gradients within float rounding, in both layouts, over rows
of several lengths (one dynamic graph: no recompile per length), under FSDP2 with activation
checkpointing on some layers (config `checkpoint_layers`), and says its compile time at start.
Slow: dynamo and AOT autograd trace each graph (~55 s on 2 cores), even by the "aot_eager" backend
used here (conftest.compile_without_codegen), which leaves out inductor's C++ kernels (~70 s more
with a cold cache; a GPU's are Triton's, which bench/gpu_check.py compiles there). And
`checkpoint_layers` alone: which layers recompute, and its bad values."""
from types import SimpleNamespace

import pytest
import torch

import packing
import policy
from test_lm_head import V, assert_close, batches, build, fsdp_grads, logprobs_and_grads


def rows_of_lengths(lengths, seed=0):
    """Packed micro-batches of 2 prompts x 2 responses, responses of each length in turn."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        seqs = [SimpleNamespace(gid=(0, k // 2), prompt=torch.randint(2, V, (4 + k,), generator=g).tolist(),
                                resp=torch.randint(2, V, (n + k,), generator=g).tolist(), adv=1.0)
                for k in range(4)]
        out.append(packing.collate(seqs, torch.device("cpu")))
    return out


@pytest.mark.slow
def test_compiled_layers_give_the_eager_numbers(one_rank, compile_without_codegen, tmp_path, capsys):
    """The model as training loads it (policy.load_policy: FSDP2, `compile`, checkpointing on one of
    its two layers), compiled once at start, against the same model eager: the start summary gives
    the compile time; on both layouts and packed rows of 4 lengths, the log-probs, entropies and
    every gradient within fp32 rounding (1e-5); and no graph compiled for a new row length. (The grouped
    layout with the prompt's KV cache is no layout of a checkpointed model: a copy per row is.)"""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from config import Config
    model = build("qwen2", tied=True)
    data = {**batches(), **{f"packed {i}": b for i, b in enumerate(rows_of_lengths((3, 10, 40, 7)))}}
    del data["grouped"]  # the prompt's KV cache: no layout under activation checkpointing (rows instead)
    eager = {k: logprobs_and_grads(model, b, "chunked") for k, b in data.items()}
    path = str(tmp_path / "qwen2")
    model.save_pretrained(path)
    torch._dynamo.reset()
    cfg = Config(model=path, train_data="d", compile=True, activation_checkpointing=True, checkpoint_layers=1)
    fsdp = policy.load_policy(path, cfg, torch.device("cpu"))
    assert [layer.gradient_checkpointing for layer in fsdp.model.layers] == [True, False]
    out = capsys.readouterr().out
    assert "update: its 2 decoder layers compiled (torch.compile) in " in out, out
    graphs = counters["stats"]["unique_graphs"]
    assert graphs > 0
    for k in sorted(data, key=lambda k: not k.startswith("packed")):  # the packed rows first
        assert_close(fsdp_grads(fsdp, data[k], "chunked"), eager[k], 1e-5, k)
        if k.startswith("packed"):
            assert counters["stats"]["unique_graphs"] == graphs, f"{k}: a row length compiled a graph of its own"


def test_checkpoint_layers_checkpoints_the_first_n_and_refuses_more_than_the_model_has(tiny_model_dir):
    """checkpoint_layers 1 of the tiny model's 2: the first layer recomputes (transformers' flag), the
    second keeps its activations, and the gradients are those of no checkpointing; 3 is an error
    naming the model's 2, as is a negative number in the config."""
    from config import Config, UserError
    model = policy.load_model(tiny_model_dir, "sdpa").train()
    batch = batches()["packed"]
    want = logprobs_and_grads(model, batch, "chunked")
    policy.checkpoint_layers(model, 1)
    assert [layer.gradient_checkpointing for layer in model.model.layers] == [True, False]
    assert_close(logprobs_and_grads(model, batch, "chunked"), want, 1e-6, "checkpoint_layers 1")
    policy.checkpoint_layers(model, None)
    assert [layer.gradient_checkpointing for layer in model.model.layers] == [True, True]
    with pytest.raises(UserError, match="checkpoint_layers 3 is more than the model's 2 decoder layers"):
        policy.checkpoint_layers(model, 3)
    with pytest.raises(UserError, match="checkpoint_layers must be >= 0"):
        Config(model="m", train_data="d", checkpoint_layers=-1)
