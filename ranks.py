"""The process group: joined and left by every rank (setup_distributed, end_distributed),
reductions over it (all_ranks; the exact quantile of values spread over the ranks: global_tail;
the threshold of a top-n choice over them: global_nth; a collective iteration that fails on every
rank when it fails on one: on_every_rank),
a bad input reported once for all ranks (run_main), and a worker that outlives its launcher ended
(watch_launcher, started when this module is imported).
"""
import json
import math
import os
import socket
import sys
import threading
import time

import torch
import torch.distributed as dist

from config import UserError


def process_group_backend(cuda):
    """The torch.distributed backend string: gloo for CPU tensors always, nccl for CUDA ones.

    An nccl-only group fails the first collective on a CPU tensor ("No backend type associated
    with device type cpu"), and train.py reduces its metrics on the CPU; vLLM's external launcher
    also asks for both ('cpu:gloo,cuda:nccl').
    """
    return "cpu:gloo,cuda:nccl" if cuda else "cpu:gloo"


def setup_distributed():
    """Join torchrun's process group, or make a group of one on a free port. -> (rank, world, device)

    Used by train.py and eval.py alike. Call it before make_engine: in a process without a
    group, vLLM would make its own.
    """
    if "RANK" not in os.environ:  # plain `python train.py`: a group of one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", port))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(process_group_backend(cuda), device_id=device if cuda else None)
    # Every rank past its connections before any goes on: a rank that stops at once on bad input
    # (its one-line error, os._exit) would otherwise close its end while a slower peer is still
    # connecting, and that peer would die with gloo's "Connection closed by peer" traceback.
    dist.barrier()
    return dist.get_rank(), dist.get_world_size(), device


def placement(world, device):
    """(the line that says where the run's ranks are, a warning or None): rank 0 prints both at
    start. The warning: this node sees more GPUs than ranks run on it (plain `python train.py` on an
    8-GPU node trains on GPU 0 alone, with the whole batch), naming the torchrun command."""
    # torchrun sets it; a plain launch is one process; another launcher of several: not known (0)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1 if world == 1 else 0))
    visible = torch.cuda.device_count() if device.type == "cuda" else 0
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    return placement_text(world, local, device.type, visible, name)


def placement_text(world, local, device_type, visible, gpu_name=""):
    """placement's words, from numbers: `world` ranks, `local` of them on this node, `visible` GPUs."""
    s = "s" if world != 1 else ""
    if device_type != "cuda":
        return f"ranks: {world} process{'es' if world != 1 else ''} on the CPU (gloo)", None
    line = f"ranks: {world} rank{s}{f', {local} on this node' if local else ''}, one GPU each ({gpu_name}; nccl)"
    if local and visible > local:
        return line, (f"warning: this node has {visible} GPUs and {local} rank{'s' if local != 1 else ''} "
                      f"run on it: {visible - local} GPU{'s' if visible - local != 1 else ''} stay idle. Launch "
                      f"with `torchrun --nproc_per_node {visible} train.py ...` to use them all (or set "
                      f"CUDA_VISIBLE_DEVICES to the ones meant)")
    return line, None


EXIT_GRACE_S = 0.05  # end_distributed's pause with the GIL released


def end_distributed():
    """Leave the process group, last of all, on every rank: a barrier, destroy_process_group, then
    a pause of EXIT_GRACE_S with the GIL released.

    The pause works around a race in torch 2.13's gloo backend. A gloo worker thread frees a
    finished collective's tensors after the caller has gone on; one that Python has let go of
    needs the GIL to be freed, and if the interpreter is shutting down by then, the thread's wait
    for the GIL ends it inside a noexcept C++ frame: "terminate called without an active
    exception", SIGABRT, and torchrun calls a finished run a failure (exit code -6). After FSDP's
    all-gathers it hit 1 two-rank exit in 5 to 8 (bench/bench_exit.py); a barrier alone does not
    close it (the freeing thread may still be behind it), the pause does (the thread takes the GIL
    as soon as the main thread sleeps).
    """
    dist.barrier()
    dist.destroy_process_group()
    time.sleep(EXIT_GRACE_S)


def all_ranks(values, op="sum"):
    """Reduce a dict of named numbers over all ranks in one collective -> dict of floats.

    A collective: every rank must call it, as often, with the same keys."""
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                           "min": dist.ReduceOp.MIN}[op])
    return dict(zip(keys, t.tolist()))


def on_every_rank(consume, items, what):
    """consume(items) on this rank, where drawing each item is a collective (policy.full_weights: an
    all-gather per tensor), failing on every rank if it fails on any: where `consume` raises (vLLM's
    load_weights on a parameter name it spells otherwise) or drawing an item does (a gather out of
    memory). The ranks agree after each item drawn, by one small all-reduce, whether every rank drew
    it, so that no rank goes on to the next gather once a peer has stopped (before: a load that
    failed left its peers in the next gather, forever under nccl); a rank whose `consume` raised
    goes on drawing with them. Then every rank raises, naming the failed ranks and the first one's
    error, `what` failed. (A gather that fails inside nccl's own call may still leave a peer's copy
    of it pending: the run then ends at that rank's exit.) A collective."""
    caught = []

    def agreed():  # the items, while every rank drew the last one
        it = iter(items)
        while True:
            try:
                item, state = next(it), 1.0
            except StopIteration:
                item, state = None, 2.0  # every rank walks the same items: all end together
            except Exception as e:  # noqa: BLE001 (any error: the peers must hear of it)
                caught.append(e)
                item, state = None, 0.0
            if all_ranks({"state": state}, "min")["state"] != 1.0:
                return
            yield item

    drawn = agreed()
    try:
        consume(drawn)
    except Exception as e:  # noqa: BLE001
        caught.append(e)
    for _ in drawn:  # the gathers this rank still owes its peers
        pass
    error = caught[0] if caught else None
    if all_ranks({"failed": error is not None}, "max")["failed"]:
        errors = [None] * dist.get_world_size()
        dist.all_gather_object(errors, f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
                               if error is not None else None)
        failed = [r for r, e in enumerate(errors) if e]
        raise RuntimeError(f"{what} failed on rank {', '.join(map(str, failed))} of {len(errors)}, so every "
                           f"rank stops; rank {failed[0]}: {errors[failed[0]]}") from error


def tail_size(n, q):
    """How many of the largest of n values reach down to their q-quantile (nearest rank: the
    ceil(q n)-th smallest, numpy's method="inverted_cdf")."""
    return n - math.ceil(round(q * n, 9)) + 1


def keep_largest(top, values, k):
    """The k largest of `top` and `values` (1-D tensors)."""
    both = torch.cat([top, values.float()])
    return torch.topk(both, min(k, len(both))).values


def global_tail(top, n, q):
    """(max, q-quantile) of n values spread over the ranks, from each rank's tail_size(n, q)
    largest (`top`). A collective."""
    tops = [None] * dist.get_world_size()
    dist.all_gather_object(tops, top.tolist())
    union = sorted((v for t in tops for v in t), reverse=True)
    return union[0], union[tail_size(n, q) - 1]


def global_nth(top, n):
    """The n-th largest of (score, key) pairs spread over the ranks, from each rank's n largest
    (`top`, (k, 2) float64 as tepo.top_pairs gives them): the threshold of a top-n choice over
    all ranks (None where they hold fewer than n). A collective."""
    world = dist.get_world_size()
    size = torch.tensor([len(top)], dtype=torch.int64)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)  # then the pairs as tensors, padded to the longest: the 80/20 rule's n is a
    longest = max(int(s) for s in sizes)  # fifth of a mini-batch's tokens (~51k pairs a rank at the GPU
    padded = torch.zeros(longest, 2, dtype=torch.float64)  # configs): as Python lists that took ~1 s
    padded[:len(top)] = top
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    pairs = torch.cat([p[:int(s)] for p, s in zip(parts, sizes)])
    if len(pairs) < n:
        return None
    pairs = pairs[torch.argsort(pairs[:, 1], descending=True, stable=True)]  # largest first, score then key
    return pairs[torch.argsort(pairs[:, 0], descending=True, stable=True)][n - 1]


def run_main(main):
    """main(), with bad input (UserError, FileNotFoundError) reported as one `error: ...` line on
    stderr (report_error) and exit code 2, no traceback; other exceptions keep theirs (they are bugs
    or faults)."""
    try:
        return main()
    except (UserError, FileNotFoundError) as e:
        report_error(f"error: {e}")
        os._exit(2)  # not sys.exit: peers may be gone, and shutdown hooks would wait on them


def report_error(line):
    """Print `line` on stderr on a line of its own, once per launcher.

    Under torchrun every rank usually fails alike: the first rank of this node to get here prints
    it (a file made with O_EXCL beside the ranks' error files decides), and every rank writes it as
    its error file (TORCHELASTIC_ERROR_FILE), which torchrun's failure report then shows as the
    root cause's `traceback :` line, last of all, instead of a link to its documentation. Other
    launchers of several processes: each rank prints it, prefixed with its rank. One write, so
    that two processes' lines never interleave (print writes the text and the newline apart).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    error_file, first = os.environ.get("TORCHELASTIC_ERROR_FILE"), True
    if error_file:
        try:
            with open(error_file, "w") as f:  # the format of torch.distributed.elastic's @record
                json.dump({"message": {"message": line, "extraInfo": {
                    "py_callstack": line, "timestamp": str(int(time.time()))}}}, f)
            os.close(os.open(os.path.join(os.path.dirname(os.path.dirname(error_file)), "error_shown"),
                             os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            first = False
        except OSError:
            pass
    elif int(os.environ.get("WORLD_SIZE", 1)) > 1:
        line = f"[rank {os.environ['RANK']}] {line}"
    if first:
        os.write(2, (line + "\n").encode())


LAUNCHER_POLL_S = 1.0  # a torchrun worker checks its launcher is alive this often


def watch_launcher(parent, period=LAUNCHER_POLL_S):
    """Under torchrun: exit this worker within `period` seconds of the death of the launcher `parent`.

    torchrun starts each worker in a session of its own, so when torchrun alone is killed (an OOM
    killer's choice) nothing signals the workers; ones waiting in a rendezvous or a collective
    would sit holding their GPUs. A daemon thread, started when this module is imported (early in
    train.py and eval.py: a worker still importing vLLM is covered too), watches the parent pid:
    it changes when the parent dies and the worker is re-parented. Exit code 3.
    """
    if "TORCHELASTIC_RUN_ID" not in os.environ or getattr(watch_launcher, "started", False):
        return
    rank = os.environ.get("RANK", "?")

    def watch():
        while os.getppid() == parent:
            time.sleep(period)
        print(f"[rank {rank}] error: the launcher (pid {parent}) died; exiting", file=sys.stderr,
              flush=True)
        os._exit(3)
    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()
    watch_launcher.started = True


watch_launcher(os.getppid())
