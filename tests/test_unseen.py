"""Rules whose tests used one input where the right form and a plausible slip agree: each here
takes an input that tells them apart (and, where there are two forms of the input, both): a
change record at the checkpoint's own step, a resume that turns a key off while changing the key
it gated, a launcher that says nothing of its ranks per node, a model whose head_dim is not
hidden / heads, a box after a stated answer, a gold set, maj@k under the evaluation's own grader,
a list of EOS ids. Each test's docstring names the slip it was written against."""
import json
import os
import sys
from types import SimpleNamespace

import pytest
import torch

import eval as ev
import reward
import rollout
import runs
import table
from ranks import placement

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import gpu_plan  # noqa: E402


# ----------------------------------------------------------------------------- a run's records


def test_an_older_checkpoints_changes_stop_before_its_own_step(tmp_path):
    """For a checkpoint written before checkpoints carried their record, config_changes_before reads
    out_dir's lines of the resumes made before its step: a resume from step 4 is recorded at step
    4, after the checkpoint was written, and is not part of it (`<=` took it in: [2] became [2, 4]);
    a checkpoint of step 5 has both."""
    out = tmp_path / "run"
    lines = [{"step": 2, "resumed_from": "a", "changed": {"lr": [1, 2]}},
             {"step": 4, "resumed_from": "b", "changed": {"lr": [2, 3]}}]
    for step in (4, 5):
        (out / f"step_{step:06d}").mkdir(parents=True)
    (out / "config_changes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert runs.config_changes_before(str(out / "step_000004")) == lines[:1]
    assert runs.config_changes_before(str(out / "step_000005")) == lines


@pytest.mark.parametrize("tries_read_before,tries_read_after,named", [
    (True, False, True),    # dynamic sampling turned off in the same resume: it was read before
    (False, True, True),    # turned on: read after
    (False, False, False),  # off throughout: never read, not named
    (True, True, True)])
def test_a_key_changed_while_it_defined_the_run_is_named(tries_read_before, tries_read_after, named):
    """table.changed_on_the_way names a key that a resume changed while it defined the run before or
    after the change: DAPO turning dynamic sampling off and max_sampling_tries 3 -> 5 in one resume
    changed a key that the steps before read (the slip, free before *or* after instead of both,
    named only dynamic_sampling)."""
    cfg = dict(model="m", train_data="d", method="dapo", dynamic_sampling=tries_read_after, max_sampling_tries=5)
    changed = {"max_sampling_tries": [3, 5]}
    if tries_read_before != tries_read_after:
        changed["dynamic_sampling"] = [tries_read_before, tries_read_after]
    history = table.changed_on_the_way(cfg, [{"step": 10, "changed": changed}])
    assert ("max_sampling_tries" in history) == named
    if named:
        assert history["max_sampling_tries"] == "3→5 at step 10"


# ----------------------------------------------------------------------------- where the ranks run


@pytest.mark.parametrize("env,world,idle", [
    ({}, 16, None),                            # srun / mpirun: no LOCAL_WORLD_SIZE, ranks per node unknown
    ({"LOCAL_WORLD_SIZE": "8"}, 16, None),     # torchrun, 8 a node
    ({"LOCAL_WORLD_SIZE": "1"}, 16, 7),        # torchrun, 1 a node on an 8-GPU node
    ({}, 1, 7)])                               # plain `python train.py`: one process
def test_idle_gpus_are_named_only_when_the_ranks_per_node_are_known(monkeypatch, env, world, idle):
    """ranks.placement: a launcher that sets no LOCAL_WORLD_SIZE (srun, mpirun) with several ranks
    says nothing of how many run on this node, so no GPU is called idle (taken as 1 a node, 16 ranks
    on 8-GPU nodes got a false "7 GPUs stay idle"); a single process is one on its node."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "GPU")
    line, warning = placement(world, torch.device("cuda", 0))
    assert line.startswith(f"ranks: {world} rank")
    assert (warning is None) if idle is None else f"{idle} GPUs stay idle" in warning


# ----------------------------------------------------------------------------- the GPU plan


QWEN3_4B = dict(model_type="qwen3", hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                tie_word_embeddings=True, attention_bias=False)
QWEN25_15B = dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)


@pytest.mark.parametrize("config,published", [(QWEN3_4B, 4_022_468_096), (QWEN25_15B, 1_543_714_304)])
def test_the_plan_reads_head_dim_from_config_json(tmp_path, config, published):
    """gpu_plan.shapes_from_config takes a config's head_dim where it gives one (Qwen3-4B: 128, not
    2560 / 32 = 80: ignoring it gave 3,668,570,240 parameters), and hidden / heads where it does not
    (Qwen2.5: 1536 / 12)."""
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert gpu_plan.params(gpu_plan.shapes_from_config(str(tmp_path / "config.json")))[2] == published


# ----------------------------------------------------------------------------- grading


def test_a_box_after_a_stated_final_answer_is_the_answer():
    """"The final answer is $N$" replaces the boxes only when it comes after the last box (Minerva's
    closing line); a box written after it (a correction) is the answer: stated 12, boxed 13 later,
    gold 13 is right (the slip searched the whole text for the sentence, and 12 won)."""
    text = "So the final answer is $12$. Wait, that misses a term: recounting gives \\boxed{13}."
    assert reward.extract_answer(text) == "13"
    assert reward.grade(text, "13", second_opinion=False) == ("13", True)
    later = "So \\boxed{10455}. The final answer is $10,455$."  # after the box: the stated number
    assert reward.extract_answer(later) == "10,455"


@pytest.mark.parametrize("gold", ["\\{3, 7\\}", "3, 7", "\\{7, 3\\}"], ids=["set", "list", "set-reordered"])
def test_a_gold_set_takes_the_indexed_boxes_as_several_answers(gold):
    """A gold of several answers, written as a set `\\{3, 7\\}` or a list, joins a response's boxes per
    indexed name (a_1, a_2) into its answer (the slip took a set for one answer: the response's
    answer became the last box, 7, and right became wrong); against one answer, the last box."""
    text = "We get $a_1 = \\boxed{3}$, and so $a_2 = \\boxed{7}$."
    assert reward.grade(text, gold, second_opinion=False) == ("3, 7", True)
    assert reward.rule_verify(gold, text)
    assert reward.grade(text, "7", second_opinion=False) == ("7", True)


class Answers:
    """An engine that answers every prompt with these texts, one per sample."""

    def __init__(self, texts):
        self.texts = texts

    def generate(self, prompts, n=1, **kw):
        return [[rollout.Sample(list(p), [5], t, [-1.0], "stop") for t in self.texts[:n]] for p in prompts]


def test_maj_at_k_groups_answers_by_the_evaluations_grader():
    """With `--grader rule` the votes are grouped by the rules (rule_verify): 5, 4 and \\gcd(12,8)
    are three answers of one vote each, the first (5) wins, maj@3 is 0 against gold 4. Grouped by
    the default grader's verify (math-verify's second opinion finds gcd(12,8) = 4), 4 had two votes
    and maj@3 was 1."""
    judge = ev.make_judge("rule")
    assert not reward.rule_verify("4", "\\gcd(12,8)")
    assert reward.verify("4", "\\gcd(12,8)")  # the default grader's: the slip's grouping had two votes for 4
    (rec,) = ev.sample_benchmark(Answers(["\\boxed{5}", "\\boxed{4}", "\\boxed{\\gcd(12,8)}"]), "b",
                                 [{"problem": "p", "answer": "4"}], [[1, 2]], n=3, max_new_tokens=4,
                                 temperature=1.0, top_p=1.0, seed=0, chunk_size=1, ks=[3], judge=judge,
                                 reward_timeout=10.0)
    assert [s["correct"] for s in rec["samples"]] == [False, True, False]
    assert rec["metrics"]["maj@3"] == 0.0 and rec["metrics"]["pass@3"] == 1.0


# ----------------------------------------------------------------------------- stopping


@pytest.mark.parametrize("eos,want", [([128001, 128008, 128009], {128001, 128008, 128009}),
                                      (128001, {128001, 128009}), (None, {128009})])
def test_every_eos_id_of_generation_config_stops_a_response(tmp_path, eos, want):
    """rollout._stop_ids takes generation_config's eos_token_id as an int or a list (Llama 3.1:
    [128001, 128008, 128009]; the slip kept only the tokenizer's 128009, and responses ran past
    the end of turn), beside the tokenizer's EOS."""
    if eos is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    tokenizer = SimpleNamespace(eos_token_id=128009, chat_template=None)
    assert rollout._stop_ids(str(tmp_path), tokenizer) == want
