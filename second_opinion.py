"""math-verify as a second opinion, in a worker process of the calling thread: started, asked,
timed out, killed and restarted. reward.py decides when to ask (reward._second_opinion).

Why a process: nothing in-process bounds math-verify. Its own timeouts use signal.alarm (main
thread only, and they would cancel reward.guarded()'s timer), and a sys.setprofile deadline cannot
stop one long C call (sympy's evalf of 9^{9^{9^{9}}} against 9^{9^{9}} was still in mpmath's
integer power after 10 s, where faulthandler found it). A worker that runs over its time is killed
and replaced.
"""
import json
import os
import signal
import sys
import threading
import time

SECOND_OPINION_TIMEOUT = 2.0  # seconds (wall clock) one math-verify verdict may take; over: "no", counted
SECOND_OPINION_START = 5.0    # ... and before it, a new worker's import of math-verify (~1 s; a loaded machine's more)
_LOCAL = threading.local()    # per thread: its worker


class Failed(Exception):
    """math-verify's verdict could not be had: `kind` is "timeouts" or "errors" (reward.guarded's counts)."""

    def __init__(self, kind, what):
        super().__init__(what)
        self.kind = kind


def ask(gold, pred, timeout):
    """math-verify's verdict (parse both, verify) from this thread's worker within `timeout` seconds
    of wall clock, or Failed. A worker still importing math-verify (a thread's first verdict, or
    the one after a kill) is waited for first, up to SECOND_OPINION_START seconds, and not killed
    when it takes longer; a verdict that does not come in time kills the worker, and a new one
    starts at once (it imports while the next responses are graded)."""
    worker = _ready(SECOND_OPINION_START)
    deadline = time.monotonic() + timeout
    asked = False
    try:
        worker["proc"].stdin.write(json.dumps([gold, pred]).encode() + b"\n")
        asked = True
        line = _read_line(worker, deadline, timeout)
        asked = False
    except (BrokenPipeError, OSError) as e:
        raise Failed("errors", f"its process is gone ({e})") from None
    finally:
        if asked:  # no verdict in time (or the caller's own timeout hit): the worker may be stuck
            worker["proc"].kill()
            worker["proc"].wait()
            _LOCAL.worker = _start_worker()
    if line.startswith("E "):
        raise Failed("errors", line[2:])
    return line == "1"


def start(timeout=120.0):
    """Start this thread's worker and wait until it has imported math-verify, so that the first
    verdict is not spent on the import (reward.make_grader does this); ImportError if it cannot."""
    import importlib.util
    if importlib.util.find_spec("math_verify") is None:
        raise ImportError("reward: the grader's second opinion needs math-verify: "
                          "`pip install -r requirements.txt` (or `pip install math-verify`)")
    try:
        _ready(timeout)
    except Failed:
        raise ImportError(f"reward: math-verify's worker process did not start within {timeout}s") from None


def _ready(seconds):
    """This thread's worker (a new one if it has none, or its worker exited), once it has imported
    math-verify, waited for up to `seconds`; else Failed."""
    worker = getattr(_LOCAL, "worker", None)
    if worker is None or worker["proc"].poll() is not None:
        worker = _LOCAL.worker = _start_worker()
    if not worker["ready"]:
        try:
            ready = _read_line(worker, time.monotonic() + seconds, seconds) == "ready"
        except Failed as e:
            raise Failed(e.kind, f"its worker, still importing math-verify: {e}") from None
        if not ready:
            raise Failed("errors", "its process did not start")
        worker["ready"] = True
    return worker


def _math_verify_worker():
    """The worker process: reads one JSON [gold, pred] per line from stdin, answers "1" (equal), "0"
    or "E <error>" per line; "ready" first, once math-verify is imported. Its own timeouts are off
    (the parent bounds the call) and so is its logging (the parent counts the failures)."""
    import logging
    logging.disable(logging.CRITICAL)
    from math_verify import LatexExtractionConfig, parse as mv_parse, verify as mv_verify
    # LaTeX only: where its LaTeX parser fails, math-verify's default falls back to a number picked out
    # of the text (`\\sqrt\\sqrt 12 + \\gcd(7,9)` read as 12), which is no reading of the answer
    latex = [LatexExtractionConfig()]
    print("ready", flush=True)
    for line in sys.stdin:
        try:
            gold, pred = json.loads(line)
            g = mv_parse(gold, extraction_config=latex, parsing_timeout=None)
            p = mv_parse(pred, extraction_config=latex, parsing_timeout=None)
            out = "1" if g and p and mv_verify(g, p, timeout_seconds=None) else "0"
        except Exception as e:
            out = "E " + " ".join(f"{type(e).__name__}: {e}".split())[:200]
        print(out, flush=True)


def _start_worker():
    """A new math-verify worker process (it dies with the thread that started it, on Linux)."""
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    code = (f"import sys; sys.path.insert(0, {here!r}); import second_opinion; "
            f"second_opinion._die_with_parent(); second_opinion._math_verify_worker()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, bufsize=0)
    return {"proc": proc, "buf": b"", "ready": False}


def _die_with_parent():
    """Linux: the worker gets SIGKILL when the thread that started it ends (prctl PR_SET_PDEATHSIG),
    so a worker stuck in a long computation never outlives its grader."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _read_line(worker, deadline, seconds):
    """The worker's next output line, or Failed at `deadline` (time.monotonic), the
    end of the `seconds` it was given."""
    import select
    out = worker["proc"].stdout
    while b"\n" not in worker["buf"]:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([out], [], [], left)[0]:
            raise Failed("timeouts", f"no verdict within {seconds}s")
        chunk = os.read(out.fileno(), 1 << 16)
        if not chunk:
            raise Failed("errors", f"its process exited (code {worker['proc'].wait()})")
        worker["buf"] += chunk
    line, _, worker["buf"] = worker["buf"].partition(b"\n")
    return line.decode("utf-8", "replace")
