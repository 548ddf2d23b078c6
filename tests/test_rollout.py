"""rollout.py's engines, checked against an independent reference: a plain transformers forward
pass over prompt + response, log_softmax(logits / temperature) at each response position.

Every test runs on both backends (vLLM on CPU here, and the transformers fallback); each module
starts one engine per backend, since a vLLM start costs seconds.
"""
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import rollout

MAX_LEN = 192  # max_model_len of the engines under test (> vLLM's CPU KV block of 128 tokens)
TOL = 1e-4    # fp32 log-prob agreement the issue asks for


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The reference forward passes run single-threaded: with 2 threads on this shared 2-core box
    they were 10x slower whenever another process was busy (OpenMP barriers wait for a core)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=["vllm", "hf"])
def engine(request, tiny_model_dir):
    eng = rollout.make_engine(tiny_model_dir, backend=request.param, dtype="float32",
                              max_model_len=MAX_LEN, seed=0)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@torch.no_grad()
def reference_logits(model, sample):
    """(T, V) logits that predict each response token, from one unpadded forward pass."""
    ids = torch.tensor([sample.prompt_ids + sample.response_ids])
    return model(ids).logits[0, len(sample.prompt_ids) - 1:-1].float()


def reference_logprobs(model, sample, temperature):
    """(T,) log-probs of the response tokens under softmax(logits / temperature)."""
    logp = (reference_logits(model, sample) / temperature).log_softmax(-1)
    return logp.gather(-1, torch.tensor(sample.response_ids)[:, None]).squeeze(-1)


def max_logprob_error(model, groups, temperature):
    return max((torch.tensor(s.logprobs) - reference_logprobs(model, s, temperature)).abs().max()
               .item() for g in groups for s in g)


def test_logprobs_match_transformers(engine, reference):
    prompts = ["12+34=", "The cat", "12+34="]
    for temperature in (1.0, 0.7):
        out = engine.generate(prompts, n=4, max_new_tokens=24, temperature=temperature, seed=1)
        assert max_logprob_error(reference, out, temperature) < TOL
    # ... and they are of the tempered distribution, not of the raw logits (vLLM's default).
    assert max_logprob_error(reference, out, 1.0) > 1e-2


def test_greedy_follows_the_argmax(engine, reference):
    out = engine.generate(["12+34=", "abc"], n=1, max_new_tokens=16, temperature=0.0)
    for g in out:
        s = g[0]
        logits = reference_logits(reference, s)
        assert s.response_ids == logits.argmax(-1).tolist()
        ref = logits.log_softmax(-1).gather(-1, torch.tensor(s.response_ids)[:, None]).squeeze(-1)
        assert (torch.tensor(s.logprobs) - ref).abs().max() < TOL  # temperature 0: at T = 1


def test_top_p_logprobs_are_of_the_nucleus(engine, reference):
    top_p, temperature = 0.6, 1.0
    out = engine.generate(["12+34=", "xyz"], n=4, max_new_tokens=16, temperature=temperature,
                          top_p=top_p, seed=3)
    for g in out:
        for s in g:
            probs = (reference_logits(reference, s) / temperature).softmax(-1)  # (T, V)
            # The nucleus: drop the least likely tokens while the mass dropped stays <= 1 - top_p.
            sorted_p, order = probs.sort(-1)
            dropped = sorted_p.cumsum(-1) <= 1 - top_p
            keep = torch.ones_like(probs, dtype=torch.bool).scatter(-1, order, ~dropped)
            nucleus = torch.where(keep, probs, 0.0)
            nucleus = nucleus / nucleus.sum(-1, keepdim=True)
            tok = torch.tensor(s.response_ids)[:, None]
            assert keep.gather(-1, tok).all()  # every sampled token is inside the nucleus
            ref = nucleus.gather(-1, tok).squeeze(-1).log()
            assert (torch.tensor(s.logprobs) - ref).abs().max() < TOL


def test_update_weights_follows_the_trainer(engine, reference, tiny_model_dir):
    """A few optimizer steps on a copy of the model (the 'trainer'), then update_weights from a
    generator of its full state dict (which includes the tied lm_head.weight)."""
    trainer = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    original = {k: v.clone() for k, v in trainer.state_dict().items()}
    opt = torch.optim.AdamW(trainer.parameters(), lr=1e-2)
    batch = torch.randint(2, 100, (4, 32), generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        loss = trainer(batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    trainer.eval()
    assert "lm_head.weight" in trainer.state_dict()
    # A prompt longer than a KV block: vLLM caches its prefix, which the update must invalidate.
    prompts = ["12+34=", "The cat " * 18]
    engine.generate(prompts, n=4, max_new_tokens=4, seed=2)

    engine.update_weights((name, t) for name, t in trainer.state_dict().items())
    out = engine.generate(prompts, n=4, max_new_tokens=24, temperature=1.0, seed=2)
    assert max_logprob_error(trainer, out, 1.0) < TOL
    assert max_logprob_error(reference, out, 1.0) > 1e-2  # no longer the start-up weights

    # Back to the start (other tests share this engine); this checks the round trip too.
    engine.update_weights(iter(original.items()))
    out = engine.generate(["12+34="], n=4, max_new_tokens=24, temperature=1.0, seed=2)
    assert max_logprob_error(reference, out, 1.0) < TOL


def test_update_weights_rejects_an_unknown_name(engine):
    with pytest.raises((KeyError, ValueError), match="not_a_weight"):
        engine.update_weights([("model.not_a_weight", torch.zeros(3))])


def test_same_seed_same_samples_and_the_n_samples_differ(engine):
    prompts = ["abc", "abc", "12+34="]
    a = engine.generate(prompts, n=4, max_new_tokens=20, seed=7)
    b = engine.generate(prompts, n=4, max_new_tokens=20, seed=7)
    c = engine.generate(prompts, n=4, max_new_tokens=20, seed=8)
    ids = lambda out: [[s.response_ids for s in g] for g in out]  # noqa: E731
    assert ids(a) == ids(b)
    assert [[s.logprobs for s in g] for g in a] == [[s.logprobs for s in g] for g in b]
    assert ids(a) != ids(c)
    for g in ids(a):
        assert len({tuple(r) for r in g}) == 4  # the n samples of a prompt differ
    assert ids(a)[0] != ids(a)[1]  # and so do equal prompts at different positions
    # seed=None: a new stream per call.
    assert ids(engine.generate(prompts, n=4, max_new_tokens=20)) != \
        ids(engine.generate(prompts, n=4, max_new_tokens=20))


def test_derive_seed_is_one_fixed_rule():
    """Every seed of a run (train.py's sampling and covariance keys, eval.py's chunks, a call's
    prompts) comes from rollout.derive_seed: pinned values, so a changed rule, which would change
    every published number, shows here; parts differing in one place give unrelated seeds."""
    assert rollout.derive_seed(0, "math500", 3) == 665398830
    assert rollout.derive_seed(1, 0, 0, 1) == 6761620
    near = {rollout.derive_seed(s, step, 0, r) for s in range(3) for step in range(50) for r in range(4)}
    assert len(near) == 3 * 50 * 4 and all(0 <= x < 2**31 - 2**16 for x in near)


def test_n_samples_in_prompt_order_and_finish_reasons(engine, tokenizer):
    """Random weights put ~1/128 of the mass on EOS, so over 64 samples of 40 tokens some stop."""
    eos = tokenizer.eos_token_id
    prompts = ["a", "bb", "ccc", "dddd"]
    out = engine.generate(prompts, n=16, max_new_tokens=40, temperature=1.0, seed=5)
    assert len(out) == len(prompts)
    reasons = []
    for prompt, group in zip(prompts, out):
        assert len(group) == 16
        for s in group:
            assert s.prompt_ids == tokenizer(prompt)["input_ids"]
            assert len(s.logprobs) == len(s.response_ids)
            assert s.text == tokenizer.decode(s.response_ids, skip_special_tokens=True)
            assert eos not in s.response_ids[:-1]
            if s.finish_reason == "stop":
                assert s.response_ids[-1] == eos and len(s.response_ids) <= 40
            else:
                assert s.finish_reason == "length"
                assert len(s.response_ids) == 40 and s.response_ids[-1] != eos
            reasons.append(s.finish_reason)
    assert "stop" in reasons and "length" in reasons


def test_a_call_larger_than_one_prefill_batch(engine):
    """~10k prompt tokens: more than vLLM prefills in one step (8192 on CPU), with seeds."""
    prompts = [f"{i:3d}" + "long prompt " * 14 for i in range(60)]
    a = engine.generate(prompts, n=2, max_new_tokens=3, seed=4)
    b = engine.generate(prompts, n=2, max_new_tokens=3, seed=4)
    assert [[s.response_ids for s in g] for g in a] == [[s.response_ids for s in g] for g in b]


def test_token_id_prompts_and_max_model_len(engine, tokenizer):
    long_prompt = tokenizer("x" * (MAX_LEN - 5))["input_ids"]
    out = engine.generate([long_prompt, [5, 6, 7]], n=2, max_new_tokens=40, seed=0)
    assert out[0][0].prompt_ids == long_prompt and out[1][0].prompt_ids == [5, 6, 7]
    for s in out[0]:  # only 5 positions are left in the context
        assert len(s.response_ids) <= 5
        assert s.finish_reason == ("stop" if s.response_ids[-1] == tokenizer.eos_token_id
                                   else "length")
    with pytest.raises(ValueError, match=f"prompt 1 has {MAX_LEN} tokens.*max_model_len={MAX_LEN}"):
        engine.generate(["ok", "y" * MAX_LEN], n=1, max_new_tokens=4)
    assert engine.generate([], n=2, max_new_tokens=4) == []


def test_a_prompt_is_sampled_with_one_bos(engine, reference):
    """With a tokenizer whose chat template writes the BOS and whose post-processor adds it (as
    Llama 3's and Gemma 3's: tests/test_prompt_ids.py): a prompt's ids are sampled as given, a text
    prompt that writes its BOS gets no second, a plain one the tokenizer's; and the log-probs are
    the reference's on those ids, so the engine conditioned on them and nothing more."""
    import data
    from test_prompt_ids import BOS_ID, bos_tokenizer, one_bos
    before, engine.tokenizer = engine.tokenizer, bos_tokenizer()  # the tiny model's vocabulary
    try:
        text, ids = data.encode_prompt(engine.tokenizer, "2+2?")
        plain = "2+2? Answer:"
        groups = engine.generate([ids, text, plain], n=2, max_new_tokens=4, temperature=1.0, seed=0)
        want = [BOS_ID] + engine.tokenizer(plain, add_special_tokens=False)["input_ids"]
    finally:
        engine.tokenizer = before
    got = [g[0].prompt_ids for g in groups]
    assert got == [ids, ids, want] and all(one_bos(p) for p in got), [p[:3] for p in got]
    assert max_logprob_error(reference, groups, 1.0) < TOL


def test_bad_arguments_are_named(tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match="unknown rollout backend 'sglang'"):
        rollout.make_engine(tiny_model_dir, backend="sglang")
    missing = str(tmp_path / "no_such_model")
    with pytest.raises(FileNotFoundError, match="no_such_model"):
        rollout.make_engine(missing)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        rollout.make_engine(str(tmp_path))


def test_the_trainers_threads_survive(engine):
    """vLLM replaces torch.set_num_threads by a no-op and sets torch to 1 thread for serving;
    the trainer in the same process must keep its own count (here 2) and a working setter."""
    assert torch.set_num_threads is rollout._TORCH_SET_NUM_THREADS
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert torch.get_num_threads() == 2
        engine.generate(["abc"], n=2, max_new_tokens=8)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


START_AN_ENGINE = """import sys
sys.path.insert(0, {root!r})
import rollout
engine = rollout.make_engine({model!r}, backend="vllm", dtype="float32", max_model_len=192, seed=0)
engine.generate(["1+1="], n=2, max_new_tokens=4, seed=0)
engine.close()
"""


@pytest.mark.slow
def test_known_harmless_notices_are_silenced_unless_asked_for(tmp_path, tiny_model_dir):
    """A vLLM engine's start on CPU logs none of rollout.KNOWN_NOTICES, no vLLM warning at all, and
    not the FutureWarning of torch.distributed.reduce_op; TEPO_ALL_WARNINGS=1 shows them. (They were
    ~30 of a 2-rank run's first 46 lines.)"""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = tmp_path / "start.py"
    script.write_text(START_AN_ENGINE.format(root=root, model=tiny_model_dir))
    logs = {}
    for name, extra in (("quiet", {}), ("all", {"TEPO_ALL_WARNINGS": "1"})):
        # VLLM_DIST_IDENT: as an earlier engine of the process (this one's) leaves it
        env = {**{k: v for k, v in os.environ.items() if k != "TEPO_ALL_WARNINGS"}, "VLLM_DIST_IDENT": "x"}
        out = subprocess.run([sys.executable, str(script)], env={**env, **extra}, capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        logs[name] = out.stdout + out.stderr
    assert " WARNING " not in logs["quiet"] and "FutureWarning" not in logs["quiet"], logs["quiet"]
    shown = [text for _, text in rollout.KNOWN_NOTICES if text in logs["all"]]
    assert len(shown) >= 7 and "reduce_op` is deprecated" in logs["all"], logs["all"]
    assert [text for text in shown if text in logs["quiet"]] == [], logs["quiet"]


def test_the_progress_of_a_call_is_reported_as_its_prompts_finish(engine):
    """generate(progress=f): f hears each prompt's n samples as the engine finishes them (eval.py's
    bar moves within a call, not once per call), and the samples are those of a call without it."""
    heard = []
    with_bar = engine.generate(["ab", "cd", "ef"], n=2, max_new_tokens=8, seeds=[1, 2, 3],
                               progress=heard.append)
    without = engine.generate(["ab", "cd", "ef"], n=2, max_new_tokens=8, seeds=[1, 2, 3])
    assert heard == [2, 2, 2]
    assert [[s.response_ids for s in g] for g in with_bar] == [[s.response_ids for s in g] for g in without]
