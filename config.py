"""The run's settings: the `Config` dataclass (one field per YAML key, each with its meaning), and
`load_config`, which reads a YAML file (and the file its `base:` names) plus `--set key=value`
overrides, and rejects unknown keys and values of the wrong type with the key's name; which keys
define a run, which a resume may change and which the seeds of one configuration may differ in
(`run_values`, `FREE_KEYS`, `FREE_UNLESS`, `defining_values`, `config_changes`)."""
import dataclasses
import difflib
import math
import os
import types
from dataclasses import dataclass, field

import yaml

import reward
import tepo


class UserError(ValueError):
    """Bad input (config, data, model or checkpoint paths): reported by ranks.run_main as one
    `error: ...` line, no traceback."""

@dataclass
class Config:
    """Every setting of a run; the README documents each. YAML keys map onto these fields."""
    model: str = ""                      # HF model directory or hub id: the initial policy (required)
    train_data: str = ""                 # JSONL with "problem" and "answer" per line (required)
    eval_data: str = ""                  # held-out JSONL: accuracy at start, every eval_every, end
    prompt_template: str | None = None   # "...{problem}..."; null: the chat template, else plain
    out_dir: str = "runs/run"            # metrics, samples and checkpoints go here
    seed: int = 0                        # data order, sampling seeds, initial RNG states
    method: str = "tepo"                 # grpo | drgrpo | dapo | gspo | tepo | clipcov | klcov | gmpo | cispo | sapo
    loss: dict = field(default_factory=dict)  # overrides of tepo.LossConfig fields, e.g. clip_high
    steps: int = 100                     # RL steps (one batch of P x G samples each)
    prompts_per_step: int = 16           # P over all ranks (divisible by the number of ranks)
    group_size: int = 8                  # G responses per prompt
    max_prompt_len: int = 512            # tokens; longer training prompts are dropped at load
    max_new_tokens: int = 1024           # response length cap (also Dr.GRPO's L_max)
    temperature: float = 1.0             # sampling temperature, also used for the trainer's log-probs
    top_p: float = 1.0                   # nucleus sampling: 1.0 only (__post_init__ says why; eval.py takes any)
    num_minibatches: int = 4             # optimizer steps per RL step
    micro_batch_tokens: int = 16384      # tokens per forward/backward on one rank
    micro_batch_layout: str = "packed"   # packed | grouped (the layout of before): packing.micro_batches
    packed_attention: str = "auto"       # the packed row's kernel: sdpa | flex; auto: flex on GPU, sdpa on CPU
    lr: float = 1e-6                     # AdamW peak learning rate
    lr_schedule: str = "constant"        # constant | cosine, after the warm-up
    warmup_steps: int = 0                # RL steps of linear warm-up
    min_lr_ratio: float = 0.0            # cosine floor, as a fraction of lr
    weight_decay: float = 0.0            # AdamW weight decay
    betas: tuple = (0.9, 0.999)          # AdamW betas
    grad_clip: float = 1.0               # max global gradient norm
    reward: str = "rule+math_verify"     # grader: rule+math_verify | rule | math_verify | package.module:function
    format_reward: float = 0.0           # reward of a wrong answer that is boxed (reward.py), < 1
    no_answer_penalty: float = 0.0       # minus this for a response with no final answer
    wrong_reward: float | None = None    # added to a wrong answer's reward; null: -1 for dapo (its +1/-1 scale), else 0
    failed_reward: float | None = None   # a failed grading call's reward before wrong_reward and the overlong penalty; null: a
                                         # built-in grader's lowest, min(format_reward, -no_answer_penalty); required for one's own
    dynamic_sampling: bool | None = None  # DAPO: drop groups all right or all wrong; null: on for dapo
    max_sampling_tries: int = 3          # dynamic sampling: batches drawn per step at most
    overlong_buffer: int | None = None   # DAPO overlong shaping; null: max_new_tokens//4 for dapo
    overlong_factor: float = 1.0         # penalty at max_new_tokens
    backend: str = "vllm"                # rollout engine: vllm | hf (transformers generate)
    dtype: str = "auto"                  # rollout dtype; auto: bfloat16 on GPU, float32 on CPU
    train_dtype: str = "auto"            # trainer compute dtype (fp32 master weights); auto as dtype
    gpu_memory_utilization: float = 0.4  # GPU share of the vLLM engine (weights + KV cache)
    activation_checkpointing: bool = False  # recompute layer activations in the backward pass
    checkpoint_layers: int | None = None  # activation_checkpointing on the first N decoder layers only; null: all
    lm_head: str = "auto"                # chunked (the head in chunks) | logits; auto: chunked where exact
    compile: bool = False                # torch.compile each decoder layer (its attention apart)
    eval_every: int = 0                  # held-out evaluation period in steps (0: start, end)
    eval_n: int = 1                      # samples per held-out problem
    eval_max_problems: int = 0           # first N held-out problems (0: all)
    save_every: int = 0                  # checkpoint period in steps (0: only at the end)
    keep_last: int = 2                   # newest checkpoints kept in out_dir (0: keep all)
    log_samples_every: int = 10          # write a few graded responses to samples.jsonl (0: off)
    full_batch_metrics: bool = True      # entropy/Cov over all samples, not just the trained ones
    max_bad_steps: int = 5               # non-finite updates in a row before the run stops
    reward_timeout: float = 10.0         # seconds a reward call may take; over it: a wrong answer, counted
    max_reward_errors: float = 0.1       # share of a step's rewards that may raise or time out
    loggers: list = field(default_factory=lambda: ["jsonl"])  # + tensorboard | wandb (trackers.py)
    wandb_project: str = "tepo"          # wandb: the project
    wandb_run_name: str | None = None    # wandb: the run's name; null: out_dir's last part

    def __post_init__(self):
        try:
            self.loss_cfg = tepo.LossConfig.preset(self.method, **{
                "max_new_tokens": self.max_new_tokens, **self.loss})
        except (TypeError, ValueError) as e:
            raise UserError(f"config: {e}") from None
        for name, value in method_defaults(self.method, self.max_new_tokens).items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        for name in ("model", "train_data"):
            if not getattr(self, name):
                raise UserError(f"config: `{name}` is required")
        if self.reward not in reward.GRADERS:  # package.module:function: imported now, its signature checked
            try:
                reward.make_grader(self.reward)
            except ValueError as e:
                raise UserError(f"config: {e}") from None
            if self.failed_reward is None:  # its lowest reward is its own: a failure must not pay more
                raise UserError(f"config: reward {self.reward} needs failed_reward, the reward of a call "
                                f"that fails (raises or times out): set it to that function's lowest reward, "
                                f"so that no response pays more by making it fail")
        if self.failed_reward is None:
            self.failed_reward = min(self.format_reward, -self.no_answer_penalty)
        for name, allowed in (("backend", ("vllm", "hf")),
                              ("train_dtype", ("auto", "float32", "bfloat16")),
                              ("dtype", ("auto", "float32", "bfloat16", "float16")),
                              ("lr_schedule", ("constant", "cosine")),
                              ("micro_batch_layout", ("packed", "grouped")),
                              ("lm_head", tepo.LM_HEADS),
                              ("packed_attention", ("auto", "sdpa", "flex"))):
            if getattr(self, name) not in allowed:
                raise UserError(f"config: {name} must be one of {allowed}, not {getattr(self, name)!r}")
        bad = [x for x in self.loggers if x not in ("jsonl", "tensorboard", "wandb")]
        if bad:
            raise UserError(f"config: loggers takes jsonl, tensorboard and wandb, not {bad[0]!r} "
                            f"(metrics.jsonl is always written: tensorboard and wandb are added to it)")
        if self.keep_last < 0:
            raise UserError(f"config: keep_last must be >= 0 (0 keeps every checkpoint), not {self.keep_last}")
        for names, ok, what in (
                (("lr", "steps", "prompts_per_step", "max_prompt_len", "max_new_tokens", "temperature",
                  "num_minibatches", "micro_batch_tokens", "grad_clip", "max_sampling_tries", "eval_n",
                  "reward_timeout"), lambda v: v > 0, "> 0"),
                (("warmup_steps", "weight_decay", "eval_every", "eval_max_problems", "save_every",
                  "log_samples_every", "max_bad_steps", "format_reward", "no_answer_penalty",
                  "overlong_buffer", "overlong_factor"), lambda v: v >= 0, ">= 0"),
                (("top_p", "gpu_memory_utilization"), lambda v: 0 < v <= 1, "in (0, 1]"),
                (("min_lr_ratio", "max_reward_errors"), lambda v: 0 <= v <= 1, "in [0, 1]"),
                (("betas",), lambda v: len(v) == 2 and all(0 <= b < 1 for b in v), "two numbers in [0, 1)")):
            for name in names:
                if not ok(getattr(self, name)):
                    raise UserError(f"config: {name} must be {what}, got {getattr(self, name)!r}")
        if self.top_p < 1:
            raise UserError(f"config: top_p {self.top_p} < 1 is not supported in training: vLLM's sampled "
                            f"log-probs are of the renormalised nucleus, the trainer's of the full softmax, so "
                            f"the ratios, loss.is_correction and the mismatch metrics would read the nucleus "
                            f"as drift; set top_p: 1.0 (eval.py's --top-p is unaffected)")
        if not self.format_reward < 1:
            raise UserError(f"config: format_reward must be < 1, got {self.format_reward}: a reward of 1 "
                            f"is a right answer's (math_reward's contract, which tells right from wrong)")
        if self.overlong_buffer > self.max_new_tokens:
            raise UserError(f"config: overlong_buffer ({self.overlong_buffer}) must be <= max_new_tokens "
                            f"({self.max_new_tokens}): the penalty starts max_new_tokens - overlong_buffer tokens in")
        if self.checkpoint_layers is not None and self.checkpoint_layers < 0:
            raise UserError(f"config: checkpoint_layers must be >= 0 (or null: every layer), "
                            f"got {self.checkpoint_layers}")
        if self.group_size < 2:
            raise UserError(f"config: group_size must be >= 2, got {self.group_size}: advantages are "
                            f"relative to the group, so a group of one has advantage 0 and never trains")

def typed(name, value, kind):
    """`value` as type `kind` (a field's annotation), or a ValueError naming the key.

    YAML reads 3e-6 (no dot) as a string, so number-like strings are accepted for numbers.
    """
    if isinstance(kind, types.UnionType):  # `X | None`: None, or an X
        if value is None:
            return None
        kind = next(t for t in kind.__args__ if t is not type(None))
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"config key {name!r} must be true or false, got {value!r}")
    if kind in (int, float):
        try:
            number = float(value) if not isinstance(value, bool) else None
        except (TypeError, ValueError):
            number = None
        if number is None or not math.isfinite(number) or (kind is int and number != int(number)):
            raise UserError(f"config key {name!r} must be {'an integer' if kind is int else 'a number'}"
                             f", got {value!r}")
        return kind(number)
    if kind is tuple:  # AdamW betas
        if not isinstance(value, (list, tuple)):
            raise UserError(f"config key {name!r} must be a list of numbers, got {value!r}")
        return tuple(typed(f"{name}[{i}]", v, float) for i, v in enumerate(value))
    if not isinstance(value, kind):
        raise UserError(f"config key {name!r} must be a {kind.__name__}, got {value!r}")
    return value


def read_yaml_config(path):
    """A config file's keys, on top of those of the file its `base:` names (relative to it), if any;
    `loss` is merged key by key."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file not found: {path}")
    with open(path) as f:
        try:
            raw = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            raise UserError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: a config file must be a mapping of keys, got {type(raw).__name__}")
    if "base" not in raw:
        return raw
    base = read_yaml_config(os.path.join(os.path.dirname(path), str(raw.pop("base"))))
    loss = {**(base.get("loss") or {}), **(raw.get("loss") or {})}
    return {**base, **raw, **({"loss": loss} if loss else {})}


def load_config(path, overrides=()):
    """YAML file (and its `base:`) + `key=value` overrides -> Config. Unknown keys are errors
    listing valid ones."""
    raw = read_yaml_config(path) if path else {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"--set expects key=value, got {item!r}")
        target = raw
        *parents, leaf = key.strip().split(".")
        for p in parents:
            target = target.setdefault(p, {})
        target[leaf] = yaml.safe_load(value)
    valid = {f.name: f for f in dataclasses.fields(Config)}
    loss_valid = {f.name: f for f in dataclasses.fields(tepo.LossConfig) if f.name != "method"}
    loss = raw.get("loss") or {}
    if not isinstance(loss, dict):
        raise UserError(f"config key 'loss' must be a mapping of loss keys, got {loss!r}")
    for what, keys, ok in (("config", raw, valid), ("loss", loss, loss_valid)):
        if set(keys) - set(ok):
            unknown = sorted(set(keys) - set(ok))
            raise UserError(f"unknown {what} key(s) {unknown}{did_you_mean(unknown, ok)}; "
                            f"valid keys: {sorted(ok)}")
    raw = {k: typed(k, v, valid[k].type) for k, v in raw.items() if k != "loss"}
    raw["loss"] = {k: typed(f"loss.{k}", v, loss_valid[k].type) for k, v in loss.items()}
    return Config(**raw)


def did_you_mean(unknown, valid):
    """' (did you mean 'lr'?)' for the unknown keys that are close to a valid one (a typo), else ''."""
    close = {k: difflib.get_close_matches(k, valid, n=1) for k in unknown}
    hints = [f"{m[0]!r}" + (f" for {k!r}" if len(unknown) > 1 else "") for k, m in close.items() if m]
    return f" (did you mean {', '.join(hints)}?)" if hints else ""


def method_defaults(method, max_new_tokens):
    """The values a null `dynamic_sampling`, `overlong_buffer` and `wrong_reward` take under
    `method`: DAPO's own (it scores right +1, wrong -1, then adds the overlong penalty), else off."""
    dapo = method == "dapo"
    return {"dynamic_sampling": dapo, "overlong_buffer": max_new_tokens // 4 if dapo else 0,
            "wrong_reward": -1.0 if dapo else 0.0}


# run_values' failed_reward of a run saved before the key, where the rule then differs from today's.
BEFORE_FAILED_REWARD = "0.0 unshaped (a config saved before failed_reward existed)"


def run_values(values):
    """A config as saved (train_config.yaml, or results.json's train_config, as a dict) -> {key:
    value} as the run uses them, so that a value written and the one a preset gives are one value
    (`loss.clip_high: 0.2` on grpo is grpo): a key it lacks (a field added since) at its default, one
    that no longer exists dropped, the nulls the method fills in filled (method_defaults), and `loss`
    as every field of the method's LossConfig (`loss.clip_high`); `loss.max_new_tokens`, Dr.GRPO's
    L_max, only where it is not max_new_tokens (which it follows unless set)."""
    fields = dataclasses.fields(Config)
    out = {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
           for f in fields}
    out.update({k: v for k, v in values.items() if k in out})
    out = plain(out)
    for name, value in method_defaults(out["method"], out["max_new_tokens"]).items():
        if out[name] is None:
            out[name] = value
    overlong = out["overlong_buffer"] > 0 and out["overlong_factor"] > 0
    if "failed_reward" not in values and (out["wrong_reward"] or overlong or out["no_answer_penalty"]):
        # Saved before the key existed, by a train.py that scored a failed grading call 0.0 with no
        # shaping (until a5b778c, 2026-11-25): today's rule (a wrong answer's reward with
        # wrong_reward and the overlong penalty) differs from it exactly here, so a resume names it.
        out["failed_reward"] = BEFORE_FAILED_REWARD
    if out["failed_reward"] is None:  # as Config fills it (a run from before the key: the same value)
        out["failed_reward"] = min(out["format_reward"], -out["no_answer_penalty"])
    names = {f.name for f in dataclasses.fields(tepo.LossConfig)} - {"method"}
    written = {k: v for k, v in (out.pop("loss") or {}).items() if k in names}
    try:
        loss = tepo.LossConfig.preset(out["method"], **{"max_new_tokens": out["max_new_tokens"], **written})
    except (TypeError, ValueError) as e:
        raise UserError(f"config: {e}") from None
    out.update({f"loss.{k}": v for k, v in loss.as_dict().items()
                if k != "method" and not (k == "max_new_tokens" and v == out["max_new_tokens"])})
    return out


def micro_batches_select(values):
    """Whether the run of `values` (run_values) selects Clip-Cov's or KL-Cov's tokens within each
    micro-batch (`loss.cov_batch: microbatch`), so that how the batch is cut changes its loss."""
    return values["loss.cov"] != "none" and values["loss.cov_batch"] == "microbatch"


# The keys that cannot change a run's trajectory (its samples, rewards and weights at every step),
# whatever the other keys say: what it logs, evaluates (from seeds of its own), keeps or stops on,
# and how it lays out the work in memory (the same numbers but for float rounding). A resume may
# change them, and the seeds of one configuration may differ in them (table.py). Every other key
# defines the run: method, loss, data, model, seed, batch shape, sampling, optimizer, rewards (and
# `reward_timeout`, which decides which responses are graded wrong), dtypes, backend.
FREE_KEYS = ("out_dir", "eval_data", "eval_every", "eval_n", "eval_max_problems", "save_every",
             "keep_last", "log_samples_every", "full_batch_metrics", "loggers", "wandb_project",
             "wandb_run_name", "max_bad_steps", "max_reward_errors", "packed_attention",
             "activation_checkpointing", "checkpoint_layers", "lm_head", "compile", "gpu_memory_utilization")


def cosine(values):
    """Whether the run of `values` (run_values) follows a cosine schedule."""
    return values["lr_schedule"] == "cosine"


def cov_on(values):
    """Whether the run of `values` selects Clip-Cov's or KL-Cov's tokens."""
    return values["loss.cov"] != "none"


def clips(values):
    """Whether the run of `values` (run_values) clips its ratio (all but KL-Cov and SAPO)."""
    return values["loss.cov"] != "kl" and values["loss.surrogate"] != "sapo"


def sapo(values):
    """Whether the run of `values` (run_values) has SAPO's gate, which its temperatures set."""
    return values["loss.surrogate"] == "sapo"


# The keys free only where another one cannot make them change the run: key -> whether it defines
# the run of `values` (run_values), i.e. whether the code that reads it runs. `steps` sets the
# length of a cosine schedule (and `min_lr_ratio` its floor); how the batch is cut into
# micro-batches sets the tokens Clip-Cov and KL-Cov select when they select per micro-batch; the
# others are read only by the term or the shaping that another key turns on (tepo.policy_loss,
# train.shape, train.sample_and_grade). tests/test_config_keys.py checks each is inert where free.
FREE_UNLESS = {"steps": cosine, "min_lr_ratio": cosine,
               "micro_batch_tokens": micro_batches_select,
               "micro_batch_layout": micro_batches_select,
               "max_sampling_tries": lambda values: values["dynamic_sampling"],
               "overlong_factor": lambda values: values["overlong_buffer"] > 0,
               "overlong_buffer": lambda values: values["overlong_factor"] > 0,
               "loss.kl_kind": lambda values: values["loss.kl_coef"] > 0,
               "loss.kl_mask_coef": lambda values: values["loss.kl_mask"],
               "loss.kl_mask_target": lambda values: values["loss.kl_mask"],
               "loss.is_level": lambda values: values["loss.is_correction"] != "none",
               "loss.is_cap": lambda values: values["loss.is_correction"] != "none",
               "loss.cov_ratio": cov_on, "loss.cov_batch": cov_on, "loss.cov_tokens": cov_on,
               "loss.cov_lb": lambda values: values["loss.cov"] == "clip",
               "loss.cov_ub": lambda values: values["loss.cov"] == "clip",
               "loss.kl_cov_coef": lambda values: values["loss.cov"] == "kl",
               # KL-Cov's and SAPO's losses have no clip (tepo.policy_loss): no term reads the range
               "loss.clip_low": clips, "loss.clip_high": clips,
               "loss.sapo_tau_pos": sapo, "loss.sapo_tau_neg": sapo,
               # Dr.GRPO's L_max: read by its aggregation alone
               "loss.max_new_tokens": lambda values: values["loss.aggregation"] == "seq-mean-token-sum-norm"}


def free_keys(values):
    """The keys that cannot change the run of `values` (run_values): FREE_KEYS, and those of
    FREE_UNLESS that it does not make define the run."""
    return set(FREE_KEYS) | {k for k, defines in FREE_UNLESS.items() if not defines(values)}


def defining_values(values):
    """{key: value} of what defines the run of the config `values` (as saved), as run_values gives
    them: equal for two runs that follow one trajectory, the same steps on the same samples."""
    out = run_values(values)
    free = free_keys(out)
    return {k: v for k, v in out.items() if k not in free}


def config_changes(saved, cfg):
    """What `cfg` changes of a run whose config was `saved` (a checkpoint's train_config.yaml, as
    a dict) -> ({key: [saved value, new value]} of the keys that define the run, the same of the
    keys free for both configs: free_keys).

    Values are compared as the run uses them (run_values): after the method's preset, loss keys one
    by one (`loss.clip_high`), a key the saved config lacks at its default.
    """
    old, new = run_values(saved), run_values(config_dict(cfg))
    changed = {k: [old.get(k), new.get(k)] for k in {**old, **new} if old.get(k) != new.get(k)}
    free = free_keys(old) & free_keys(new)
    return ({k: v for k, v in changed.items() if k not in free},
            {k: v for k, v in changed.items() if k in free})


def plain(values):
    """A dict of config values with tuples as lists (YAML's)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


def config_dict(cfg):
    """A Config's fields as a dict of plain YAML values, as train.py saves it (train_config.yaml)."""
    return plain({f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})
