"""The log-probs of the update from the last hidden states through the LM head in chunks
(tepo.head_logprobs_entropy, config `lm_head`): equal to the model's own logits' path
(tepo.token_logprobs_entropy, `lm_head: logits`) in log-probs, entropies and every parameter's
gradient, on each architecture the project trains (Qwen2, Qwen3, Llama, Gemma 3 with its final
soft-capping), tied and untied, with a head bias and without, in both layouts of packing.collate, at
a temperature != 1 and with an entropy bonus; under FSDP2 on one rank, in fp32 and bf16; a gradient
check in fp64; and a model whose head cannot be reached falls back to the logits, said."""
import pytest
import torch

import packing
import tepo
from architectures import config as arch_config
from demo import make_tiny_model

# ----------------------------------------------------------------------------- the function alone


def naive(hidden, weight, bias, targets, temperature, softcap):
    """log-probs and entropy through the whole (N, V) logits, in the inputs' dtype: the reference."""
    z = torch.nn.functional.linear(hidden, weight, bias)
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    lp = torch.log_softmax(z / temperature, dim=-1)
    return lp.gather(-1, targets[..., None]).squeeze(-1), -(lp.exp() * lp).sum(-1)


@pytest.mark.parametrize("softcap", [None, 2.0])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gradcheck_in_fp64(softcap, with_bias):
    """torch.autograd.gradcheck of log-probs and entropies against finite differences, in fp64, over
    several chunks (4 rows each), in the hidden states, the weight and the bias."""
    g = torch.Generator().manual_seed(0)
    N, H, V = 13, 8, 37
    hidden = torch.randn(N, H, dtype=torch.float64, generator=g).requires_grad_()
    weight = torch.randn(V, H, dtype=torch.float64, generator=g).requires_grad_()
    bias = torch.randn(V, dtype=torch.float64, generator=g).requires_grad_() if with_bias else None
    targets = torch.randint(0, V, (N,), generator=g)

    def f(hidden, weight, *bias):
        return tepo.head_logprobs_entropy(hidden, weight, bias[0] if bias else None, targets, 0.7, True,
                                          softcap, max_chunk_elems=4 * V)
    assert torch.autograd.gradcheck(f, (hidden, weight, *([bias] if with_bias else [])))


@pytest.mark.parametrize("softcap", [None, 2.0])
def test_equal_to_the_whole_logits_with_every_gradient(softcap):
    """Against log_softmax over the whole logits (fp64): log-probs, entropies, and the gradients of
    a loss reading both (an entropy bonus) in the hidden states, weight and bias; one chunk or
    many; targets of a (B, T) shape."""
    g = torch.Generator().manual_seed(1)
    B, T, H, V = 2, 7, 16, 50
    hidden = torch.randn(B, T, H, dtype=torch.float64, generator=g).requires_grad_()
    weight = torch.randn(V, H, dtype=torch.float64, generator=g).requires_grad_()
    bias = torch.randn(V, dtype=torch.float64, generator=g).requires_grad_()
    targets = torch.randint(0, V, (B, T), generator=g)
    w, v = torch.randn(B, T, dtype=torch.float64, generator=g), torch.randn(B, T, dtype=torch.float64, generator=g)
    ref_lp, ref_h = naive(hidden, weight, bias, targets, 1.3, softcap)
    want = torch.autograd.grad((ref_lp * w).sum() + (ref_h * v).sum(), (hidden, weight, bias))
    for elems in (3 * V, 2**27):
        lp, h = tepo.head_logprobs_entropy(hidden, weight, bias, targets, 1.3, True, softcap, elems)
        assert lp.shape == (B, T) and torch.allclose(lp, ref_lp, atol=1e-12) and torch.allclose(h, ref_h, atol=1e-12)
        got = torch.autograd.grad((lp * w).sum() + (h * v).sum(), (hidden, weight, bias))
        for a, b in zip(got, want):
            assert torch.allclose(a, b, atol=1e-10), (a - b).abs().max()
        # log-probs alone: no entropy computed, its gradient absent
        lp, h = tepo.head_logprobs_entropy(hidden, weight, None, targets, 1.3, False, softcap, elems)
        assert h is None
        got = torch.autograd.grad((lp * w).sum(), (hidden, weight))
        no_bias, _ = naive(hidden, weight, None, targets, 1.3, softcap)
        for a, b in zip(got, torch.autograd.grad((no_bias * w).sum(), (hidden, weight))):
            assert torch.allclose(a, b, atol=1e-10)


def test_bf16_matmul_fp32_softmax(monkeypatch):
    """bf16 hidden states and weight (FSDP2's mixed precision): the matmul in bf16 as the model's own
    head, the softmax in fp32, gradients in bf16 near the fp32 ones; the weight's summed over 8
    chunks in fp32, 7 of its rows at a time."""
    monkeypatch.setattr(tepo, "HEAD_GRAD_ROWS", 7)
    g = torch.Generator().manual_seed(2)
    N, H, V = 64, 32, 300
    h32 = torch.randn(N, H, generator=g)
    w32 = torch.randn(V, H, generator=g) / 4
    targets = torch.randint(0, V, (N,), generator=g)
    h16, w16 = (t.to(torch.bfloat16).requires_grad_() for t in (h32, w32))
    lp, ent = tepo.head_logprobs_entropy(h16, w16, None, targets, 1.0, True, None, max_chunk_elems=8 * V)
    assert lp.dtype == torch.float32 and ent.dtype == torch.float32
    ref = torch.log_softmax(torch.nn.functional.linear(h16, w16).float(), -1)  # today's: bf16 logits
    assert torch.allclose(lp, ref.gather(1, targets[:, None])[:, 0], atol=1e-5)
    lp.sum().backward()
    assert h16.grad.dtype == torch.bfloat16 and w16.grad.dtype == torch.bfloat16
    h, w = h32.clone().requires_grad_(), w32.clone().requires_grad_()
    tepo.head_logprobs_entropy(h, w, None, targets, 1.0, False)[0].sum().backward()
    for a, b in ((h16.grad, h.grad), (w16.grad, w.grad)):
        assert (a.float() - b).norm() / b.norm() < 2e-2


def test_no_tensor_of_the_logits_size_is_made():
    """The forward and backward of 600 positions over a vocabulary of 1,000 (chunks of 50 rows):
    no tensor any op makes (logits, their gradient, a softmax) holds more than one chunk's logits,
    nor does the weight's gradient take a (V, H) copy per chunk beyond its sum (bf16: its slices of
    HEAD_GRAD_ROWS rows). Every op's outputs seen by a dispatch mode."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.sizes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.sizes += [(t.numel(), str(func)) for t in (out if isinstance(out, (tuple, list)) else [out])
                           if isinstance(t, torch.Tensor)]
            return out
    g = torch.Generator().manual_seed(3)
    N, H, Vb = 600, 16, 1000
    for dtype in (torch.float32, torch.bfloat16):
        hidden = torch.randn(N, H, generator=g).to(dtype).requires_grad_()
        weight = (torch.randn(Vb, H, generator=g) / 4).to(dtype).requires_grad_()
        targets = torch.randint(0, Vb, (N,), generator=g)
        with Largest() as seen:
            lp, ent = tepo.head_logprobs_entropy(hidden, weight, None, targets, 0.9, True, None, 50 * Vb)
            (lp.sum() + ent.sum()).backward()
        biggest = max(seen.sizes)
        assert biggest[0] <= 50 * Vb, biggest
        assert weight.grad.shape == (Vb, H) and hidden.grad.shape == (N, H)
        with Largest() as seen:  # the logits' path, as the model's head feeds it: (N, V) tensors
            lp, _ = tepo.token_logprobs_entropy(torch.nn.functional.linear(hidden, weight)[None], targets[None], 0.9)
            lp.sum().backward()
        assert max(seen.sizes)[0] >= N * Vb


def test_bad_input():
    with pytest.raises(ValueError, match="targets"):
        tepo.head_logprobs_entropy(torch.zeros(2, 3, 4), torch.zeros(5, 4), None, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        tepo.head_logprobs_entropy(torch.zeros(2, 4), torch.zeros(5, 4), None, torch.zeros(2, dtype=torch.long), 0.0)


# ----------------------------------------------------------------------------- on the models

ARCHS = ("qwen2", "qwen3", "llama", "gemma3")
V = 128


def build(arch, tied=True, bias=False, dtype=torch.float32, seed=0):
    """A tiny random `arch` causal LM (tests/architectures.py's shapes; Qwen2 as demo.make_tiny_model),
    tied or not, its head with a bias where asked (none of these architectures has one: a Linear
    with one put in its place, tied to the embeddings still where `tied`); Gemma 3 with its final
    logit soft-capping at 3 (random logits reach it). Attending with the packed kernel (sdpa)."""
    from transformers import AutoModelForCausalLM, Qwen2Config
    if arch == "qwen2":
        config = Qwen2Config(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)
    else:
        config = arch_config(arch, V, eos=1, pad=0)
    config.tie_word_embeddings = tied
    if arch == "gemma3":
        config.final_logit_softcapping = 3.0
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(dtype)
    if bias:
        head = torch.nn.Linear(config.hidden_size, V, bias=True, dtype=dtype)
        with torch.no_grad():
            head.weight.copy_(model.lm_head.weight)
            head.bias.normal_()
        if tied:
            head.weight = model.get_input_embeddings().weight
        model.lm_head = head
    assert (model.lm_head.weight is model.get_input_embeddings().weight) == tied
    return packing.use_packed_attention(model)


def batches(seed=3):
    """The same sequences in both layouts of packing.collate: packed (3 prompts, 6 responses, one
    row), grouped with the prompt's KV cache, and grouped with a copy of the prompt in each row (as
    under activation checkpointing). Responses of one token (only the prompt's last position
    predicts it) and longer than Gemma 3's window of 8."""
    g = torch.Generator().manual_seed(seed)
    from types import SimpleNamespace
    prompts = [torch.randint(2, V, (p,), generator=g).tolist() for p in (6, 2, 11)]
    packed = [SimpleNamespace(gid=(0, k), prompt=prompts[k], resp=torch.randint(2, V, (n,), generator=g).tolist(),
                              adv=1.0, rollout_logp=torch.zeros(n)) for k, n in ((2, 9), (0, 1), (1, 14), (0, 5), (2, 3))]
    grouped = [s for s in packed if s.gid == (0, 0)] + [SimpleNamespace(
        gid=(0, 0), prompt=prompts[0], resp=torch.randint(2, V, (12,), generator=g).tolist(), adv=1.0,
        rollout_logp=torch.zeros(12))]
    cpu = torch.device("cpu")
    return {"packed": packing.collate(packed, cpu), "grouped": packing.collate(grouped, cpu, "grouped"),
            "grouped rows": packing.collate(grouped, cpu, "grouped", rows=True)}


def logprobs_and_grads(model, batch, lm_head, temperature=0.8, seed=5):
    """(logp, entropy, {name: gradient}) of a loss reading both (a policy-gradient term and an entropy
    bonus, random weights per token) through `lm_head`'s path."""
    model.zero_grad(set_to_none=True)
    logp, ent = tepo.response_logprobs(model, batch, temperature, True, lm_head)
    g = torch.Generator().manual_seed(seed)
    w, v = (torch.randn(logp.shape, generator=g).to(logp.dtype) * batch["mask"] for _ in range(2))
    ((logp * w).sum() + 0.3 * (ent * v).sum()).backward()
    return logp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def assert_close(got, want, rel, what):
    lp0, ent0, grads0 = want
    lp, ent, grads = got[0].to(lp0.dtype), got[1].to(lp0.dtype), got[2]
    assert torch.allclose(lp, lp0, atol=rel * 10, rtol=0), (what, (lp - lp0).abs().max())
    assert torch.allclose(ent, ent0, atol=rel * 10, rtol=0), (what, (ent - ent0).abs().max())
    assert grads.keys() == grads0.keys()
    for n, g0 in grads0.items():
        assert grads[n] is not None and g0.norm() > 0, (what, n)
        err = ((grads[n] - g0).norm() / g0.norm()).item()
        assert err < rel, (what, n, err)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tied,bias", [(True, False), (False, False), (False, True), (True, True)])
def test_the_chunked_head_is_the_logits_path_on_every_architecture(arch, tied, bias):
    """Log-probs, entropies and every parameter's gradient (the tied embedding's: its lookup's and
    the head's, summed) through the chunked head equal the model's own logits', in both layouts, at
    temperature 0.8, with an entropy bonus, in fp32; and the model's head computes no logits then
    (it is called on no position)."""
    model = build(arch, tied, bias)
    assert tepo.unreachable_head(model) is None
    seen = []
    model.lm_head.register_forward_hook(lambda m, args, out: seen.append(out.shape[1]))
    for layout, batch in batches().items():
        seen.clear()
        want = logprobs_and_grads(model, batch, "logits")
        assert seen and all(n > 0 for n in seen)
        seen.clear()
        got = logprobs_and_grads(model, batch, "chunked")
        assert seen and all(n == 0 for n in seen), seen   # no (K, V) logits
        assert_close(got, want, 1e-5, (arch, tied, bias, layout))


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_fp64_and_small_chunks(arch, monkeypatch):
    """In fp64 (the logits' path's softmax stays fp32, the chunked one's follows the inputs), with
    chunks of 3 positions: equal within fp32's rounding."""
    monkeypatch.setattr(tepo, "HEAD_CHUNK_ELEMS", 3 * V)
    model = build(arch, tied=True, dtype=torch.float64)
    for layout, batch in batches().items():
        got = logprobs_and_grads(model, batch, "chunked")
        assert got[0].dtype == torch.float64
        assert_close(got, logprobs_and_grads(model, batch, "logits"), 1e-6, (arch, layout))


# ----------------------------------------------------------------------------- FSDP2, and the fallback


def fsdp_grads(model, batch, lm_head):
    """logprobs_and_grads of an FSDP2 model, its sharded gradients gathered (one rank: the whole)."""
    lp, ent, grads = logprobs_and_grads(model, batch, lm_head)
    return lp, ent, {n: g.full_tensor() if hasattr(g, "full_tensor") else g for n, g in grads.items()}


def grad_difference(a, b):
    return max(((a[n].float() - b[n].float()).norm() / b[n].float().norm()).item() for n in b)


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_under_fsdp2_the_gradient_reaches_the_sharded_weights(one_rank, tmp_path, arch, capsys):
    """policy.load_policy (FSDP2, one rank): the chunked head reads the root's unsharded weight, and
    its gradient (the tied embedding's) reaches the sharded parameter FSDP2 reduce-scatters into:
    in fp32 equal to the plain model's logits path; in bf16 (the GPU's mixed precision: the head's
    matmul in bf16, its softmax in fp32) within 2x bf16's own rounding of the logits path (bf16
    against fp32). The start summary says which path the update takes."""
    import policy
    from config import Config
    path = str(tmp_path / arch)
    build(arch, tied=True).save_pretrained(path)
    batch = batches()["packed"]
    plain = policy.load_model(path, "sdpa")
    if arch == "gemma3":
        plain.config.final_logit_softcapping = 3.0
    want = logprobs_and_grads(plain, batch, "logits")
    runs = {}
    for dtype in ("float32", "bfloat16"):
        model = policy.load_policy(path, Config(model=path, train_data="x", train_dtype=dtype), torch.device("cpu"))
        assert "log-probs from the last hidden states through the LM head in chunks" in capsys.readouterr().out
        runs[dtype, "chunked"] = fsdp_grads(model, batch, "chunked")
        runs[dtype, "logits"] = fsdp_grads(model, batch, "logits")
        assert isinstance(model.lm_head.weight, torch.distributed.tensor.DTensor)  # resharded after the backward
    assert_close(runs["float32", "chunked"], want, 1e-5, arch)
    noise = grad_difference(runs["bfloat16", "logits"][2], runs["float32", "logits"][2])
    assert 1e-3 < noise < 0.2
    assert grad_difference(runs["bfloat16", "chunked"][2], runs["bfloat16", "logits"][2]) < 2 * noise
    assert (runs["bfloat16", "chunked"][0] - want[0]).abs().mean() < 2 * (runs["bfloat16", "logits"][0] - want[0]).abs().mean()


def cohere(tmp_path):
    """A tiny Cohere model: its logits are lm_head(hidden) x logit_scale, which the chunked head does
    not compute (not in tepo.HEAD_MODEL_TYPES). -> its directory"""
    from transformers import CohereConfig, CohereForCausalLM
    torch.manual_seed(0)
    config = CohereConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, logit_scale=0.5,
                          max_position_embeddings=512, bos_token_id=None, pad_token_id=0, eos_token_id=1)
    path = str(tmp_path / "cohere")
    CohereForCausalLM(config).float().save_pretrained(path)
    return path


def test_a_head_that_cannot_be_reached_falls_back_to_the_logits_and_says_so(one_rank, tmp_path, capsys):
    """Cohere scales its logits after the head: lm_head auto takes the model's logits (its numbers,
    scale and all), said in the start summary; lm_head chunked is refused, naming the way out."""
    import policy
    from config import Config, UserError
    path = cohere(tmp_path)
    model = policy.load_model(path, "sdpa")
    assert tepo.unreachable_head(model).startswith("model_type cohere: its logits are not known")
    batch = batches()["packed"]
    with torch.no_grad():
        got, _ = tepo.response_logprobs(model, batch, 1.0, False, "auto")
        logits = model(input_ids=batch["ids"], position_ids=batch["pos"], use_cache=False,
                       packed_row=batch["row"]).logits[0, batch["keep"]]
    want = torch.log_softmax(logits, -1).gather(1, batch["targets"][0, :, None])[:, 0][batch["spans"]]
    assert torch.allclose(got, want, atol=1e-5)
    with pytest.raises(ValueError, match="lm_head chunked: model_type cohere"):
        tepo.response_logprobs(model, batch, 1.0, False, "chunked")
    policy.load_policy(path, Config(model=path, train_data="x"), torch.device("cpu"))
    assert "update: log-probs from the model's logits: model_type cohere" in capsys.readouterr().out
    with pytest.raises(UserError, match="set lm_head: logits"):
        policy.load_policy(path, Config(model=path, train_data="x", lm_head="chunked"), torch.device("cpu"))
