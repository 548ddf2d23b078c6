"""How often a two-rank torchrun run that finished its work still dies on the way out.

    python bench/bench_exit.py [--runs 100] [--modes bare barrier end_distributed]

Each run: 2 CPU ranks under torchrun (gloo) gather ten 64x64 DTensors sharded over the two ranks
three times (`full_tensor`, the all-gathers FSDP2 makes of its sharded parameters and gradients),
then leave the process group one of three ways, the modes taken in turn, --runs times each:

    bare             dist.destroy_process_group(), and exit
    barrier          dist.barrier(), then the same
    end_distributed  ranks.end_distributed(): barrier, destroy_process_group, a pause with the GIL
                     released (what train.py, eval.py and the tests' torchrun scripts do)

A run fails when torchrun's exit code is not 0; "terminate called" counts the runs whose stderr
shows the abort of torch's gloo threads at interpreter shutdown (ranks.end_distributed's
docstring says why). Exit code 1 if end_distributed failed at all.
"""
import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = r'''
import sys
sys.path.insert(0, sys.argv[2])
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
import ranks
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (2,))
shards = [distribute_tensor(torch.randn(64, 64), mesh, [Shard(0)]) for _ in range(10)]
for _ in range(3):
    full = [d.full_tensor() for d in shards]
mode = sys.argv[1]
if mode == "end_distributed":
    ranks.end_distributed()
else:
    if mode == "barrier":
        dist.barrier()
    dist.destroy_process_group()
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=100, help="runs per mode")
    ap.add_argument("--modes", nargs="+", default=["bare", "barrier", "end_distributed"],
                    choices=["bare", "barrier", "end_distributed"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        failed = {m: 0 for m in args.modes}
        aborted = {m: 0 for m in args.modes}
        for i in range(args.runs):
            for mode in args.modes:
                out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                      "--nproc_per_node=2", script, mode, ROOT],
                                     capture_output=True, text=True, timeout=300)
                failed[mode] += out.returncode != 0
                aborted[mode] += "terminate called" in out.stderr
            print(f"round {i + 1}/{args.runs}: " + ", ".join(f"{m} {failed[m]} failed" for m in args.modes),
                  flush=True)
    print(f"\n{'mode':<16} {'runs':>5} {'failed':>7} {'terminate called':>17}")
    for m in args.modes:
        print(f"{m:<16} {args.runs:>5} {failed[m]:>7} {aborted[m]:>17}")
    sys.exit(1 if failed.get("end_distributed") else 0)


if __name__ == "__main__":
    main()
