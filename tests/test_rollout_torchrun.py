"""The vLLM engine inside a torchrun job, as train.py uses it: two ranks with gloo already
initialised, each with its own in-process engine sampling its own prompts, a weight update, and
the trainer's process group, environment and threads intact afterwards."""
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = textwrap.dedent('''
    import os, sys
    import torch, torch.distributed as dist
    from transformers import AutoModelForCausalLM
    import ranks, rollout

    def max_error(model, groups):
        """Largest |sampler - transformers| log-prob over all response tokens (temperature 1)."""
        err = 0.0
        for g in groups:
            for s in g:
                ids = torch.tensor([s.prompt_ids + s.response_ids])
                with torch.no_grad():
                    logits = model(ids).logits[0, len(s.prompt_ids) - 1:-1].float()
                ref = logits.log_softmax(-1).gather(-1, torch.tensor(s.response_ids)[:, None])
                err = max(err, (torch.tensor(s.logprobs) - ref.squeeze(-1)).abs().max().item())
        return err

    if __name__ == "__main__":
        dist.init_process_group("gloo")
        rank, path = dist.get_rank(), sys.argv[1]
        cpus_before, threads_before = sorted(os.sched_getaffinity(0)), torch.get_num_threads()
        engine = rollout.make_engine(path, backend="vllm", max_model_len=128, seed=rank)
        assert os.environ["LOCAL_WORLD_SIZE"] == "2", os.environ["LOCAL_WORLD_SIZE"]
        assert torch.get_num_threads() == threads_before
        if len(cpus_before) >= 2:  # "auto" binding: a core of its own per rank
            assert sorted(os.sched_getaffinity(0)) == [cpus_before[rank]], os.sched_getaffinity(0)
        trainer = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        # Different amounts of work per rank: the engines must not wait for each other.
        out = engine.generate([f"rank {rank}"] * (1 + 3 * rank), n=4, max_new_tokens=20 + 20 * rank,
                              seed=0)
        assert max_error(trainer, out) < 1e-4, max_error(trainer, out)
        with torch.no_grad():
            for p in trainer.parameters():
                p.add_(0.05 * torch.randn_like(p))
        engine.update_weights((k, v) for k, v in trainer.state_dict().items())
        out = engine.generate([f"rank {rank}"] * 2, n=4, max_new_tokens=20, seed=0)
        assert max_error(trainer, out) < 1e-4, max_error(trainer, out)
        total = torch.tensor([float(rank + 1)])
        dist.all_reduce(total)  # the trainer's group still works
        assert total.item() == 3.0
        engine.close()  # ... and survives the engine
        print(f"RANK {rank} OK", flush=True)
        ranks.end_distributed()
''')


@pytest.mark.slow
def test_one_engine_per_rank_under_torchrun(tiny_model_dir, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--standalone", str(script), tiny_model_dir],
        env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "RANK 0 OK" in proc.stdout and "RANK 1 OK" in proc.stdout
