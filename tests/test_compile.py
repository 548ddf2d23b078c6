"""Config `compile`: each decoder layer compiled with torch.compile (policy.compile_layers) gives the
eager model's log-probs, entropies and gradients within float rounding, in both layouts, over rows
of several lengths (one dynamic graph: no recompile per length), under FSDP2 with activation
checkpointing on some layers (config `checkpoint_layers`), and says its compile time at start.
Slow: inductor compiles C++ kernels (~20-70 s on 2 cores, less with its cache warm; minutes on a
busy machine). And `checkpoint_layers` alone: which layers recompute, and its bad values."""
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
def test_compiled_layers_give_the_eager_numbers(one_rank, tmp_path, capsys):
    """The same model eager and compiled, on the same batches: both layouts, and packed rows of 4
    lengths after the start's compilation (its forwards and backward): within fp32 rounding (1e-5),
    and no graph compiled for a new length. Then FSDP2 (load_policy) with compile, checkpointing
    on one of the two layers: the start summary gives the compile time, and the gradients are the
    eager model's."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from config import Config
    model = build("qwen2", tied=True)
    data = {**batches(), **{f"packed {i}": b for i, b in enumerate(rows_of_lengths((3, 10, 40, 7)))}}
    eager = {k: logprobs_and_grads(model, b, "chunked") for k, b in data.items()}
    torch._dynamo.reset()
    policy.compile_layers(model)
    cfg = Config(model="m", train_data="d")
    assert policy.compile_now(model, cfg) > 0
    graphs = counters["stats"]["unique_graphs"]
    for k in data:
        if k.startswith("packed "):
            assert_close(logprobs_and_grads(model, data[k], "chunked"), eager[k], 1e-5, k)
    assert counters["stats"]["unique_graphs"] == graphs, "a row length compiled a graph of its own"
    for k in batches():
        assert_close(logprobs_and_grads(model, data[k], "chunked"), eager[k], 1e-5, k)
    path = str(tmp_path / "qwen2")
    build("qwen2", tied=True).save_pretrained(path)
    cfg = Config(model=path, train_data="d", compile=True, activation_checkpointing=True, checkpoint_layers=1)
    fsdp = policy.load_policy(path, cfg, torch.device("cpu"))
    assert [layer.gradient_checkpointing for layer in fsdp.model.layers] == [True, False]
    out = capsys.readouterr().out
    assert "update: its 2 decoder layers compiled (torch.compile) in " in out, out
    assert_close(fsdp_grads(fsdp, data["packed"], "chunked"), eager["packed"], 1e-5, "fsdp")


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
