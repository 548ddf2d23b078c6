"""Two "nodes" on localhost, one process each, joined by torchrun's c10d rendezvous as on a cluster
(`torchrun --nnodes 2 --rdzv-endpoint HOST:PORT`): a step, a save, a resume for a second step.

On one machine both nodes see the same out_dir, as a shared filesystem gives real nodes; without
one, train.py stops at start-up with a message (tests/test_gpu_path.py checks that).
"""
import json
import os
import socket
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(config, *extra):
    """Start both nodes' torchrun launchers; wait for both; fail with their output."""
    port, env = free_port(), {**os.environ, "OMP_NUM_THREADS": "1"}  # one core per "node"
    procs = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
         f"--node_rank={node}", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
         "--rdzv_id=test", os.path.join(ROOT, "tests", "train_patched.py"), "--toy-reward", "--",
         "--config", config, *extra],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in (0, 1)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, f"{out[-2000:]}\n{err[-5000:]}"


def test_two_nodes_train_save_and_resume(tmp_path, tiny_model_dir):
    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps({"problem": f"What is {i} + {i}?", "answer": str(2 * i)})
                            + "\n" for i in range(20)))
    out = tmp_path / "run"
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(dict(
        model=tiny_model_dir, train_data=str(data), out_dir=str(out), prompt_template="{problem}\n",
        steps=1, prompts_per_step=2, group_size=4, max_prompt_len=64, max_new_tokens=16,
        num_minibatches=1, lr=1e-3, backend="hf")))  # the rendezvous and the shared saves are under test
    two_nodes(str(config))
    assert sorted(d for d in os.listdir(out) if d.startswith("step_")) == ["step_000001"]
    two_nodes(str(config), "--set", "steps=2", "--resume")
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2]
    state = json.load(open(out / "step_000002" / "trainer_state.json"))
    assert (state["step"], state["data_pos"]) == (2, 4)
    assert sorted(f for f in os.listdir(out / "step_000002") if f.startswith("rng_rank")) == \
        ["rng_rank0.pt", "rng_rank1.pt"]  # both nodes wrote their part into the shared out_dir
