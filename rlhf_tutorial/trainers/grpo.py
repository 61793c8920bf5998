"""Running chapter 04's GRPO: its arguments and presets, the training loop, evaluation and the
``train-grpo`` command.

The pieces a learner writes (group-relative advantages, the objective, sampling groups, the rollout,
the optimizer step) live in ``rlhf_tutorial.grpo``; this module runs them.
``train(args, **learner_functions(globals()))`` runs a notebook's versions in place of the reference
ones (see ``rlhf_tutorial.trainers.plug``).

``python -m rlhf_tutorial train-grpo --world tiny --direction neg --seed 0`` trains and prints a JSON
summary on its last line.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from rlhf_tutorial import grpo
from rlhf_tutorial.devices import device_of, rng_devices
from rlhf_tutorial.grpo import (
    GroupRollout,
    decode_completions,
    eos_id,
    group_record,
    group_token_logprobs,
    reward_fn_rule,
    sample_group,
)
from rlhf_tutorial.rewards import ngram_repetition, sentiment_reward_fn
from rlhf_tutorial.rlhf import approx_kl
from rlhf_tutorial.speed import REWARD_TARGET, harness_speedups, time_split, time_to_reward
from rlhf_tutorial.trainers.args import add_flags, arg, documented, given_flags, gpt2_size_presets
from rlhf_tutorial.trainers.lora import ALPHA_HELP, RANK_HELP, apply_lora, optimizer_state_mb, trainable
from rlhf_tutorial.trainers.lora import summary as lora_summary
from rlhf_tutorial.trainers.plug import bind, learner_functions_for
from rlhf_tutorial.trainers.records import add_stats, mean_stats
from rlhf_tutorial.trainers.runtime import PeakMemory, peak_memory_mb
from rlhf_tutorial.worlds import PROMPT

#: The prompts of a rule-reward run (``reward="rule"``): review openings of which none mentions the
#: default aspect ("acting"), so the policy has to write it. ``--prompts`` takes any list of strings.
RULE_PROMPTS = (PROMPT, "I watched this film", "The plot was")

# ----------------------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------------------


@documented
@dataclass
class GRPOArgs:
    """Every knob of the GRPO trainer. The defaults are the tiny world's; ``GRPOArgs.preset("gpt2")``
    gives the GPT-2 world's (see ``PRESETS``).

    Sizes: one phase samples ``groups_per_phase`` groups (p) of ``group_size`` completions (G) of at
    most ``max_new_tokens`` tokens, B = p * G rows. The learning phase then makes
    ``update_epochs`` passes (mu) over the rollout in ``num_minibatches`` minibatches of whole
    groups: ``mu * num_minibatches`` optimizer steps per phase. Group ``i`` of phase ``k`` uses prompt
    ``prompts[(k * p + i) % len(prompts)]``.
    """

    world: str | None = arg(None, "'tiny' or 'gpt2'; None lets RLHF_TUTORIAL_WORLD decide")
    seed: int = arg(0, "seeds sampling and the minibatch order")
    # task
    reward: str = arg("sentiment", "'sentiment' (the classifier's probability) or 'rule' (reward_fn_rule)")
    direction: str = arg("neg", "sentiment the classifier reward asks for: 'neg' or 'pos'")
    aspect: str = arg("acting", "rule reward: the aspect the review must mention")
    max_sentences: int = arg(3, "rule reward: the review must end within this many sentences")
    prompts: tuple[str, ...] = arg((PROMPT,), "prompts the groups cycle through")
    prepend_bos: bool = arg(True, "put the BOS token before each prompt")
    task: str = arg("reviews", "'reviews' (chapter 04: review prompts, `reward` decides) or 'arithmetic' (chapter "
                    "07: the arithmetic base model, problems of the training difficulty, the verifiable reward)")
    verifier: str = arg("strict", "arithmetic: 'strict' (extract_answer: the last 'Answer: N' line) or 'lenient' "
                        "(lenient_extract_answer: the first number anywhere, which a policy can hack)")
    init: str = arg("base", "arithmetic: start from the 'base' model or from 'sft' (train-sft's run first)")
    n_problems: int = arg(256, "arithmetic: training problems (the 'train' split) the groups cycle through")
    eval_problems: int = arg(64, "arithmetic: fresh problems of the training difficulty for pass@k")
    eval_pass_samples: int = arg(16, "arithmetic: samples per problem for pass@k (k up to this)")
    # sampling
    groups_per_phase: int = arg(8, "p: groups (prompts) sampled per phase")
    group_size: int = arg(8, "G: completions sampled per prompt")
    max_new_tokens: int = arg(16, "most tokens a completion may have (it ends earlier at EOS)")
    temperature: float = arg(1.0, "sampling temperature; log-probs are taken of logits / temperature")
    top_k: int | None = arg(None, "sample from the top k tokens only (None: the full distribution)")
    # phases and optimisation
    num_phases: int = arg(40, "rollout + learning phases")
    update_epochs: int = arg(2, "mu: passes over each rollout (only the first minibatch of the first pass has ratio 1 exactly)")
    num_minibatches: int = arg(4, "minibatches (of whole groups) per pass")
    learning_rate: float = arg(3e-4, "AdamW learning rate (constant; no weight decay)")
    max_grad_norm: float = arg(1.0, "clip the global gradient norm to this")
    # objective
    clip_coef: float = arg(0.2, "epsilon (clip_eps): the ratio is clipped to [1 - clip_coef, 1 + clip_coef_high]")
    clip_coef_high: float | None = arg(None, "upper clip (DAPO's clip-higher uses 0.28); None: clip_coef")
    kl_coef: float = arg(0.1, "beta: weight of the per-token k3 KL to the reference inside the loss (DeepSeekMath: 0.04)")
    loss_type: str = arg("grpo", "aggregation over tokens: 'grpo', 'dapo' or 'dr_grpo'")
    scale: str = arg("group", "advantage scaling: 'group' (GRPO), 'batch', 'none' (Dr. GRPO)")
    adv_eps: float = arg(1e-4, "eps added to the std of the advantage scaling")
    advantage_estimator: str = arg("group", "'group' (group_relative_advantages with `scale`), 'rloo' "
                                   "(chapter 06's rloo_advantages: leave-one-out baseline, no std) or 'reinforce_pp' "
                                   "(reinforce_pp_advantages: per-token returns with the k1 KL times kl_coef in the "
                                   "reward, whitened over the batch; the objective then has no KL term)")
    importance_level: str = arg("token", "'token' (GRPO: clip every token's ratio) or 'sequence' (chapter 06's "
                                "GSPO: clip one length-normalised ratio per completion)")
    sampler_dtype: str = arg("float32", "'float32', or 'bfloat16': a bfloat16 copy of the policy samples the rollout "
                             "(as a low-precision inference engine would) while the policy trains in float32; the "
                             "phases record the per-token mismatch of the two (mismatch_*)")
    tis_cap: float = arg(0.0, "with sampler_dtype='bfloat16': > 0 multiplies each token's advantage by "
                         "truncated_is_weights(pi_old, sampler, cap=tis_cap); 0: no correction")
    policy_loss: str = arg("clip", "'clip' (PPO's clipped surrogate) or 'cispo' (cispo_objective: a clipped, detached "
                           "weight on every token's log-prob, clip_coef / clip_coef_high its bounds, token-level mean)")
    # variants
    dynamic_sampling: bool = arg(False, "DAPO: drop groups whose rewards are all equal, sample more")
    max_sampling_rounds: int = arg(3, "dynamic sampling: most sampling rounds per phase")
    zero_std_tol: float = arg(1e-6, "a group whose reward std is below this counts as all equal")
    ref_refresh_every: int = arg(0, "iterative GRPO: copy the policy into the reference every k phases (0: never)")
    # evaluation and logging
    eval_samples: int = arg(128, "samples drawn before and after training to measure the reward")
    n_logged_samples: int = arg(6, "samples kept per phase for the tables")
    # harness speed (what a learner's functions compute is unchanged)
    fast: bool = arg(True, "harness speed-ups (speed.py): a hook-free forward, and with the reference "
                     "sample_group our own sampler, whose log-probs are pi_old's (no second forward); a fused AdamW; "
                     "each step's gradients freed after it (the next forward's activations never sit beside them)")
    # chapter 08
    lora_rank: int = arg(0, RANK_HELP)
    lora_alpha: float = arg(16.0, ALPHA_HELP)

    @classmethod
    def preset(cls, world: str, **overrides: Any) -> GRPOArgs:
        """The preset of ``world`` ('tiny' or 'gpt2'; in the GPT-2 world, of the chosen size) with ``overrides`` applied. With
        ``reward="rule"``, the prompts default to ``RULE_PROMPTS`` and completions may be 40 tokens
        long (room for a few sentences and the EOS)."""
        rule = {"prompts": RULE_PROMPTS, "max_new_tokens": 40} if overrides.get("reward") == "rule" else {}
        from rlhf_tutorial.worlds import preset_key

        key = preset_key(world)
        if overrides.get("task") == "arithmetic":
            from rlhf_tutorial.trainers.reasoning import split_problems

            settings = {**ARITHMETIC_PRESETS[key.split("-")[0]], **overrides}
            n, seed = settings.get("n_problems", 256), settings.get("seed", 0)
            rule = {**ARITHMETIC_PRESETS[key.split("-")[0]],
                    "prompts": tuple(p.prompt for p in split_problems("train", n, seed=seed))}
            return cls(**{**rule, "world": world, **overrides})
        return cls(**{**PRESETS[key], **rule, "world": world, **overrides})


#: Per-world settings. The tiny preset (the dataclass defaults) is the one measured in this repository:
#: 40 phases of 8 groups of 8 (30 reached 0.92-0.98 depending on the seed, 40 gives more margin),
#: learning rate 3e-4, kl_coef (beta) 0.1 (0.04 let the KL climb past 0.6 per token and garbled more words),
#: 4 minibatches x 2 passes = 8 steps per phase like chapter 03's PPO.
#: The GPT-2 preset scales chapter 03's GPT-2 settings to GRPO (learning rate of the same order as
#: PPO's 8e-6 base rate, beta = 0.04 and clip 0.2 as in DeepSeekMath, 30 new tokens): it has not
#: been tuned here (no GPT-2 weights offline), treat it as a starting point.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {},
    "gpt2": dict(
        groups_per_phase=8, group_size=8, max_new_tokens=30, num_phases=200, update_epochs=2,
        num_minibatches=4, learning_rate=1e-5, max_grad_norm=0.5, clip_coef=0.2, kl_coef=0.04,
    ),
}
#: gpt2-medium, gpt2-large, gpt2-xl: the gpt2 preset scaled by ``trainers.args.GPT2_SCALING`` (sources
#: there); GRPO has no warm-up and no KL threshold.
PRESETS.update(gpt2_size_presets(PRESETS["gpt2"], dict(
    lr_scale=("learning_rate",), max_grad_norm=("max_grad_norm",), clip_scale=("clip_coef",), kl_scale=("kl_coef",),
    phases=("num_phases",),
)))

#: Chapter 07 (``task="arithmetic"``): GRPO from the arithmetic base model with DAPO's recipe: dynamic
#: sampling (most groups of a one-step problem are all right or all wrong), clip-higher (0.28), token-level
#: aggregation ('dapo'), no KL term. The tiny preset is the one measured in the README; the GPT-2 preset
#: starts from GPT-2 fine-tuned on demonstrations (``init="sft"``: GPT-2 has never seen the format) and is
#: untuned here (no GPT-2 weights offline). Tiny, measured with seed 0: 16 groups a phase at 5e-4 gained
#: 0.07 in 30 phases and nothing in 100 (noisy steps undid each other), 1e-3 collapsed; 32 groups at 3e-4
#: gained 0.28 in 80 phases. 100 phases gained 0.36 at seed 0 on the AMD reference machine but 0.26 at seed 0
#: and 0.34 at seed 1 on an Intel Xeon (AMX; issue 38): one seed or one CPU is one draw, and the gain was still
#: climbing (seed 1 on the Xeon: +0.20 after 25 phases, +0.27 after 50), so the preset runs 200: on the Xeon
#: seeds 0, 1 and 2 at the AVX512, AVX2 and unvectorised kernel levels all gained between +0.36 and +0.47
#: (figures.json: grpo_arith_*; issue 38: with the reference's forward skipped at beta = 0 and a phase's prompts
#: sampled together, 120 to 145 s of CPU a run, 170 to 200 s unvectorised; before, 240 to 300 s and 409 to 445 s).
#: The notebook and
#: ``compare-reasoning`` set their own phases and groups, so this number is the CLI's alone.
ARITHMETIC_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(groups_per_phase=32, group_size=8, max_new_tokens=24, num_phases=200, update_epochs=1,
                 num_minibatches=2, learning_rate=3e-4, kl_coef=0.0, clip_coef=0.2, clip_coef_high=0.28,
                 loss_type="dapo", dynamic_sampling=True, max_sampling_rounds=3, eval_samples=128),
    "gpt2": dict(groups_per_phase=16, group_size=8, max_new_tokens=24, num_phases=60, update_epochs=1,
                 num_minibatches=2, learning_rate=1e-5, kl_coef=0.0, clip_coef=0.2, clip_coef_high=0.28,
                 loss_type="dapo", dynamic_sampling=True, max_sampling_rounds=3, init="sft", eval_samples=128),
}


def make_reward_fn(args: GRPOArgs) -> Callable[[list[str]], Float[Tensor, "batch"]]:
    """The task reward of ``args``: the world's sentiment classifier, or the rule; for the arithmetic
    task the verifiable reward (``trainers.reasoning.arithmetic_reward_fn``) with ``args.verifier``."""
    if args.task == "arithmetic":
        from rlhf_tutorial import reasoning
        from rlhf_tutorial.trainers.reasoning import arithmetic_reward_fn

        if args.verifier not in ("strict", "lenient"):
            raise ValueError(f"verifier must be 'strict' or 'lenient', got {args.verifier!r}")
        parse = reasoning.extract_answer if args.verifier == "strict" else reasoning.lenient_extract_answer
        return arithmetic_reward_fn(parse)
    if args.reward == "rule":
        return lambda texts: reward_fn_rule(texts, args.aspect, args.max_sentences)
    if args.reward == "sentiment":
        return sentiment_reward_fn(args.world, args.direction)
    raise ValueError(f"reward must be 'sentiment' or 'rule', got {args.reward!r}")


# ----------------------------------------------------------------------------------------------------
# Evaluation
# ----------------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(
    policy: HookedTransformer,
    reference: HookedTransformer,
    reward_fn: Callable[[list[str]], Float[Tensor, "batch"]],
    args: GRPOArgs,
    n_samples: int,
    seed: int,
) -> dict[str, Any]:
    """Sample ``n_samples`` completions spread over ``args.prompts`` (its own RNG stream: the same
    seed gives the same draws) and measure the mean reward, the per-token k3 KL to ``reference``
    (``train`` passes the starting policy) and the n-gram repetition."""
    eos = eos_id(policy)
    texts, kls, masks = [], [], []
    with torch.random.fork_rng(devices=rng_devices(device_of(policy))):  # the GPU's stream too
        torch.manual_seed(seed)
        per_prompt = math.ceil(n_samples / len(args.prompts))
        for prompt in args.prompts:
            prompt_tokens = policy.to_tokens(prompt, prepend_bos=args.prepend_bos)[0]
            tokens, mask = sample_group(
                policy, prompt_tokens, per_prompt, args.max_new_tokens, eos, args.temperature, args.top_k
            )
            texts += decode_completions(policy, tokens, mask, prompt)
            lp = group_token_logprobs(policy, [tokens], [len(prompt_tokens)], args.temperature)
            ref = group_token_logprobs(reference, [tokens], [len(prompt_tokens)], args.temperature)
            kls.append(approx_kl(lp, ref, "k3"))
            masks.append(mask)
    texts = texts[:n_samples]
    rewards = reward_fn(texts).float().cpu()
    mask = torch.cat(masks)[:n_samples].float()
    kl = (torch.cat(kls)[:n_samples] * mask).sum() / mask.sum()
    return {
        "reward": rewards.mean().item(),
        "kl": kl.item(),
        "repetition": ngram_repetition(texts).mean().item(),
        "completion_len": mask.sum(-1).mean().item(),
        "texts": texts,
        "rewards": rewards.tolist(),
    }


# ----------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------

#: The functions ``train`` lets you replace by keyword (your own version from the notebook).
PLUGGABLE = (
    "group_relative_advantages",
    "calc_grpo_objective",
    "completion_mask",
    "sample_group",
    "collect_rollout",
    "grpo_step",
    "rloo_advantages",  # chapter 06
    "gspo_sequence_ratio",  # chapter 06
    "calc_gspo_objective",  # not an exercise: built on gspo_sequence_ratio
    "reinforce_pp_advantages",
    "cispo_objective",
    "truncated_is_weights",
    "calc_token_advantage_objective",  # not an exercise: per-token advantages in PPO's surrogate (TIS)
    "calc_reinforce_pp_objective",  # not an exercise: the same, with the KL in the advantages
    "calc_cispo_grpo_objective",  # not an exercise: built on cispo_objective
)


def objective_alias(args: GRPOArgs) -> str | None:
    """The objective the reference ``grpo_step`` optimises under the name ``calc_grpo_objective``: None
    (GRPO's own), ``calc_gspo_objective`` (``importance_level="sequence"``), ``calc_cispo_grpo_objective``
    (``policy_loss="cispo"``), ``calc_reinforce_pp_objective`` (``advantage_estimator="reinforce_pp"``,
    whose advantages are per token) or ``calc_token_advantage_objective`` (``tis_cap > 0``: each token's
    advantage times its truncated importance weight). At most one; others raise ValueError."""
    if args.sampler_dtype not in ("float32", "bfloat16"):
        raise ValueError(f"sampler_dtype must be 'float32' or 'bfloat16', got {args.sampler_dtype!r}")
    if args.tis_cap and args.sampler_dtype == "float32":
        raise ValueError("tis_cap > 0 corrects a sampler that differs from the trainer: set sampler_dtype='bfloat16'")
    if args.importance_level not in ("token", "sequence"):
        raise ValueError(f"importance_level must be 'token' or 'sequence', got {args.importance_level!r}")
    if args.policy_loss not in ("clip", "cispo"):
        raise ValueError(f"policy_loss must be 'clip' or 'cispo', got {args.policy_loss!r}")
    chosen = [name for name, on in (
        ("calc_gspo_objective", args.importance_level == "sequence"),
        ("calc_cispo_grpo_objective", args.policy_loss == "cispo"),
        ("calc_reinforce_pp_objective", args.advantage_estimator == "reinforce_pp"),
    ) if on]
    if args.tis_cap and chosen != ["calc_reinforce_pp_objective"]:  # REINFORCE++'s objective takes them weighted
        chosen.append("calc_token_advantage_objective")
    if len(chosen) > 1:
        raise ValueError("importance_level='sequence', policy_loss='cispo', advantage_estimator='reinforce_pp' and "
                         "tis_cap > 0 each replace the objective: choose one (tis_cap goes with reinforce_pp)")
    return chosen[0] if chosen else None


learner_functions = learner_functions_for(PLUGGABLE)


@dataclass
class GRPOResult:
    """What ``train`` returns: the models, every phase's record, and the evaluations."""

    policy: HookedTransformer
    reference: HookedTransformer
    history: list[dict[str, Any]]
    eval_initial: dict[str, Any] | None
    eval_final: dict[str, Any] | None
    last_rollout: GroupRollout | None
    wall_seconds: float
    peak_memory_mb: float
    note: str | None = None  # set when dynamic sampling kept no group in any phase (nothing was trained)
    adapters: nn.ModuleDict | None = None  # lora_rank > 0: the trained adapters, attached to `policy` by hooks
    optimizer_state_mb: float = 0.0  # megabytes of the optimizer's state at the end (trainers.lora)

    @property
    def reward_per_phase(self) -> list[float]:
        return [r["reward"] for r in self.history]


def train(
    args: GRPOArgs,
    *,
    policy: HookedTransformer | None = None,
    reference: HookedTransformer | None = None,
    reward_fn: Callable[[list[str]], Float[Tensor, "batch"]] | None = None,
    callback: Callable[[dict[str, Any]], None] | None = None,
    evaluate_before_after: bool = True,
    progress: bool = True,
    lora_functions: dict[str, Callable] | None = None,
    reference_kl: bool = True,
    batched_prompts: bool = False,
    **overrides: Callable,
) -> GRPOResult:
    """Train the policy with GRPO; any function named in ``PLUGGABLE`` can be replaced by keyword.

    ``policy`` defaults to the world's policy, ``reference`` to a frozen copy of the policy as it is
    at the start, ``reward_fn`` to ``make_reward_fn(args)``. Each phase: ``collect_rollout`` (the
    policy at this moment is pi_old), then ``update_epochs`` passes of ``grpo_step`` over
    ``num_minibatches`` minibatches; with ``ref_refresh_every = k > 0`` the reference becomes a copy
    of the policy every k phases (the iterative variant; the phases' ``kl`` is then to the current
    reference, the evaluations' to the starting policy). ``callback(record)`` gets each phase's
    record. Wall time and peak memory (on the policy's device) cover everything after the models are
    loaded, evaluations included. With ``args.lora_rank > 0`` the policy is frozen and LoRA adapters are
    attached and trained instead (``trainers.lora.apply_lora``; ``lora_functions``: the learner's ``LoRA``,
    ``lora_hooks``, ``merge_lora`` from ``trainers.lora.learner_functions``). ``reference_kl=False``: with
    ``kl_coef`` = 0 (outside REINFORCE++) the phases skip the reference's forward, whose log-probs would only
    be reported (``grpo.reference_unused``: the same training, no ``kl`` / ``update_kl_ref`` in the records).
    ``batched_prompts=True``: the harness's sampler draws the groups of all prompts of one token length in one
    call (``grpo._fast_sample_prompts``: the same distribution, other draws; many prompts a phase sample faster).
    """
    alias = objective_alias(args)
    if alias and overrides.get("grpo_step", grpo.grpo_step) is not grpo.grpo_step:
        raise ValueError(
            "importance_level='sequence' (GSPO), policy_loss='cispo' and advantage_estimator='reinforce_pp' need the "
            "reference grpo_step: yours calls your token-level calc_grpo_objective. Leave grpo_step out of the "
            "overrides for such a run."
        )
    # GSPO, CISPO, REINFORCE++: the reference grpo_step optimises their objective under the name calc_grpo_objective.
    aliases = {"calc_grpo_objective": alias} if alias else None
    fns = bind(grpo, PLUGGABLE, overrides, aliases=aliases)
    torch.manual_seed(args.seed)
    if policy is None:
        from rlhf_tutorial.worlds import load_policy, load_reasoning_policy

        policy = load_reasoning_policy(args.world) if args.task == "arithmetic" else load_policy(args.world)
    if reference is None:
        reference = copy.deepcopy(policy)
    reference.eval().requires_grad_(False)
    # What the evaluations measure the KL against: the starting policy. The iterative variant moves
    # its reference, so it keeps a copy of the start for that.
    anchor = copy.deepcopy(reference) if args.ref_refresh_every else reference
    reward_fn = reward_fn or make_reward_fn(args)
    if args.lora_rank and args.ref_refresh_every:
        raise ValueError("lora_rank > 0 with ref_refresh_every: the reference would be refreshed without the adapters' "
                         "update (it lives in hooks, not in the weights); use one or the other")
    # chapter 08: with lora_rank > 0 the policy is frozen and adapters are attached (after the reference's copy)
    adapters = apply_lora(policy, args.lora_rank, args.lora_alpha, seed=args.seed, **(lora_functions or {}))
    # fused (one kernel for all parameters, the same update) when the speed-ups are on: 5x faster on a CPU
    optimizer = torch.optim.AdamW(trainable(policy, adapters), lr=args.learning_rate, weight_decay=0.0,
                                  maximize=True, fused=args.fast or None)
    generator = torch.Generator().manual_seed(args.seed)

    history: list[dict[str, Any]] = []
    rollout = None
    eval_initial = eval_final = None
    start = time.perf_counter()
    with PeakMemory(device_of(policy)) as memory, harness_speedups(args.fast), \
            grpo.harness(reference_kl=reference_kl, batched_prompts=batched_prompts):
        if evaluate_before_after:
            eval_initial = evaluate(policy, anchor, reward_fn, args, args.eval_samples, seed=args.seed + 1)
        bar = tqdm(range(args.num_phases), desc="GRPO phases", disable=not progress, file=sys.stderr)
        for phase in bar:
            phase_start = time.perf_counter()
            grpo.CLOCK.take()
            policy.eval()
            rollout_k, record = fns["collect_rollout"](policy, reference, reward_fn, args, phase)
            record["phase"] = phase
            if rollout_k is not None:
                rollout = rollout_k
                n = args.n_logged_samples
                record["samples"] = [
                    (t, float(r)) for t, r in zip(rollout.texts[:n], rollout.rewards.flatten()[:n].tolist())
                ]
                policy.train()
                steps = []
                with grpo.CLOCK("optimisation"):
                    for _ in range(args.update_epochs):
                        for minibatch in rollout.minibatches(args.num_minibatches, generator):
                            steps.append(fns["grpo_step"](policy, optimizer, minibatch, args))
                            if args.fast:  # free the step's gradients (grpo_step zeroes them before its backward
                                # anyway): the next forward's activations then never sit beside them in memory
                                optimizer.zero_grad(set_to_none=True)
                if grpo.reference_unused(args):  # pi_old stood in for the reference: its KL is not the reference's
                    for step in steps:
                        step.pop("kl_ref", None)
                add_stats(record, mean_stats(steps), prefix="update_")
            if args.ref_refresh_every and (phase + 1) % args.ref_refresh_every == 0:
                reference.load_state_dict(policy.state_dict())
                record["reference_refreshed"] = True
            record.update(grpo.CLOCK.take(), seconds_phase=time.perf_counter() - phase_start)
            history.append(record)
            if callback is not None:
                callback(record)
            bar.set_postfix(reward=f"{record['reward']:.3f}", kl=f"{record.get('kl', float('nan')):.3f}")
        policy.eval()
        note = None
        if rollout is None and args.num_phases:
            rollout, note = _unfiltered_rollout(policy, reference, reward_fn, args, fns)
        if evaluate_before_after:
            eval_final = evaluate(policy, anchor, reward_fn, args, args.eval_samples, seed=args.seed + 1)
    return GRPOResult(
        policy=policy,
        reference=reference,
        history=history,
        eval_initial=eval_initial,
        eval_final=eval_final,
        last_rollout=rollout,
        wall_seconds=time.perf_counter() - start,
        peak_memory_mb=memory.peak_mb,
        note=note,
        adapters=adapters,
        optimizer_state_mb=optimizer_state_mb(optimizer),
    )


def _unfiltered_rollout(policy: HookedTransformer, reference: HookedTransformer, reward_fn: Callable,
                        args: GRPOArgs, fns: dict[str, Callable]) -> tuple[GroupRollout, str]:
    """When dynamic sampling dropped every group of every phase: a message that says so (printed, and
    returned for ``GRPOResult.note``) and one rollout of the final policy drawn without dropping, for
    the notebook to show (it is not trained on)."""
    note = (f"dynamic sampling kept no group in any of the {args.num_phases} phases: every group's rewards were "
            f"all equal (within zero_std_tol = {args.zero_std_tol:g}), so there was nothing to learn from and the "
            "policy was not updated. last_rollout holds one rollout of the policy drawn without dropping, for "
            "display. Try a reward the policy earns sometimes (or never always), larger groups (group_size), more "
            "max_sampling_rounds, or dynamic_sampling=False.")
    print(f"GRPO: {note}", file=sys.stderr)
    rollout, _ = fns["collect_rollout"](policy, reference, reward_fn, replace(args, dynamic_sampling=False),
                                        args.num_phases)
    return rollout, note


# ----------------------------------------------------------------------------------------------------
# Command line: python -m rlhf_tutorial train-grpo --world tiny --direction neg --seed 0
# ----------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rlhf_tutorial train-grpo",
        description="GRPO (chapter 04): tune the world's policy with group-relative advantages and no "
        "value head. Flags not given keep the world's preset (GRPOArgs.preset).",
    )
    add_flags(parser, GRPOArgs, from_preset=True)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (the tiny model runs fastest on one, above all on a busy machine)")
    parser.add_argument("--compare", default=None,
                        help="a JSON file holding train-rlhf's summary (its last line): with --report, "
                        "the PPO-vs-GRPO figure is written")
    parser.add_argument("--report", default=None, help="write an HTML report (curves, groups) here")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="arithmetic: run the preset once per seed (in place of --seed) and summarise the spread "
                        "of pass@1 over them (`over_seeds`; each seed's own summary under `runs`)")
    return parser


def main(argv: list[str]) -> dict:
    """Train, evaluate before and after on ``eval_samples`` fresh samples, summarise as a dict.

    ``mean_reward_initial`` / ``_final`` and ``kl_final`` (per token, k3, to the starting policy) come
    from those evaluations; ``frac_reward_zero_std`` is the mean over phases of the fraction of
    sampled groups whose rewards were all equal (``_final``: the last phase's); ``peak_memory_mb`` is
    the peak memory of the policy's device as ``train-rlhf`` reports it (on a CPU the process's peak
    resident set, on a GPU CUDA's peak allocation), ``peak_memory_training_mb`` the peak above what
    was in use when training started (``PeakMemory``); ``device`` is where the policy ran. With
    ``sampler_dtype="bfloat16"``: the ``mismatch_*`` (and, with ``tis_cap``, ``tis_weight_mean``) means over
    phases, and the largest per-token |log pi_old - log mu| of the run (``mismatch_max_abs_logratio_all``).
    """
    from rlhf_tutorial.worlds import resolve_world

    ns = _parser().parse_args(argv)
    torch.set_num_threads(ns.threads)
    world = resolve_world(ns.world)
    given = given_flags(GRPOArgs, ns)
    given.pop("world", None)
    args = GRPOArgs.preset(world, **given)
    if ns.seeds is not None and args.task != "arithmetic":
        raise SystemExit("train-grpo: --seeds is for --task arithmetic")
    if args.task == "arithmetic":
        if ns.seeds is not None:
            given.pop("seed", None)
            return arithmetic_over_seeds(world, given, ns.seeds, progress=not ns.no_progress)
        return arithmetic_main(args, progress=not ns.no_progress)

    start = time.perf_counter()
    result = train(args, progress=not ns.no_progress)
    wall = time.perf_counter() - start
    history, before, after = result.history, result.eval_initial, result.eval_final
    zero_std = [r["frac_reward_zero_std"] for r in history]
    summary: dict[str, Any] = {
        "world": world,
        "reward": args.reward,
        "direction": args.direction,
        "seed": args.seed,
        "mean_reward_initial": round(before["reward"], 4),
        "mean_reward_final": round(after["reward"], 4),
        "kl_final": round(after["kl"], 4),
        "frac_reward_zero_std": round(sum(zero_std) / len(zero_std), 4),
        "frac_reward_zero_std_final": round(zero_std[-1], 4),
        "repetition_initial": round(before["repetition"], 4),
        "repetition_final": round(after["repetition"], 4),
        "completion_len_initial": round(before["completion_len"], 2),
        "completion_len_final": round(after["completion_len"], 2),
        "phases": len(history),
        "samples_per_phase": args.groups_per_phase * args.group_size,
        "reward_per_phase": [round(r["reward"], 4) for r in history],
        "kl_per_phase": [round(r["kl"], 4) if "kl" in r else None for r in history],  # None: no group kept
        "frac_reward_zero_std_per_phase": [round(z, 4) for z in zero_std],
        "samples_initial": before["texts"][:4],
        "samples_final": after["texts"][:4],
        "wall_seconds": round(wall, 1),
        "train_wall_seconds": round(result.wall_seconds, 1),
        "seconds_per_phase": time_split(history),
        **time_to_reward(history, REWARD_TARGET),
        "peak_memory_mb": round(peak_memory_mb(device_of(result.policy)), 1),
        "peak_memory_training_mb": round(result.peak_memory_mb, 1),
        "optimizer_state_mb": round(result.optimizer_state_mb, 3),
        **lora_summary(result.policy, result.adapters, args.lora_rank, args.lora_alpha),
        "device": str(device_of(result.policy)),
        "torch_threads": ns.threads,
        "args": asdict(args),
    }
    mismatch_keys = sorted({k for r in history for k in r if k.startswith(("mismatch_", "tis_"))})
    for key in mismatch_keys:  # sampler_dtype="bfloat16": the sampler/trainer mismatch, mean over phases
        values = [r[key] for r in history if key in r]
        summary[key] = round(sum(values) / len(values), 6)
        if key == "mismatch_max_abs_logratio":
            summary["mismatch_max_abs_logratio_all"] = round(max(values), 6)
    if result.note:
        summary["note"] = result.note
    if ns.report:
        from rlhf_tutorial.widgets.grpo import write_report

        ppo = json.loads(open(ns.compare).read().strip().splitlines()[-1]) if ns.compare else None
        groups = group_record(result.policy, result.last_rollout, args) if result.last_rollout else []
        path = write_report(ns.report, summary, groups, ppo_summary=ppo)
        print(f"report written to {path}", file=sys.stderr)
        summary["report"] = str(path)
    return summary


def arithmetic_main(args: GRPOArgs, progress: bool = True) -> dict:
    """``train-grpo --task arithmetic`` (chapter 07): GRPO with the verifiable reward from the arithmetic
    base model (or from ``train-sft``'s model with ``init="sft"``). The summary holds pass@1 before and
    after (``pass_at_1_initial`` / ``_final``, on ``eval_problems`` fresh problems of the training
    difficulty, ``eval_pass_samples`` samples each, read by the strict verifier; ``_lenient`` by the
    lenient one), ``pass_at_k`` of the final policy, pass@1 on the held-out harder difficulties, and
    per phase the reward, the policy's entropy per token, the completion length (tokens) and the
    fraction of groups whose rewards were all equal."""
    from rlhf_tutorial.tiny import arith
    from rlhf_tutorial.trainers import reasoning as run
    from rlhf_tutorial.worlds import load_reasoning_policy

    start, cpu_start = time.perf_counter(), time.process_time()
    policy = load_reasoning_policy(args.world)
    if args.init == "sft":
        run.train_sft(run.SFTArgs.preset(args.world, seed=args.seed), policy=policy,
                      evaluate_before_after=False, progress=progress)
    elif args.init != "base":
        raise ValueError(f"init must be 'base' or 'sft', got {args.init!r}")

    def measure(model: HookedTransformer) -> dict[str, Any]:
        at = {}
        for difficulty in (arith.TRAIN_DIFFICULTY, *arith.HELD_OUT_DIFFICULTIES):
            problems = run.split_problems("eval", args.eval_problems, difficulty, args.seed)
            held_out = difficulty != arith.TRAIN_DIFFICULTY
            at[difficulty] = run.evaluate(model, problems, 4 if held_out else args.eval_pass_samples,
                                          max_new_tokens=48 if held_out else args.max_new_tokens,
                                          seed=args.seed + 1, temperature=args.temperature)
        return at

    before = measure(policy)
    # the summary reports no KL to the reference: with kl_coef = 0 its forward is skipped (the same training);
    # the phase's 32 prompts are sampled together (one call per token length, not 32 calls of 8 rows)
    result = train(args, policy=policy, evaluate_before_after=False, progress=progress, reference_kl=False,
                   batched_prompts=True)
    after = measure(result.policy)
    history = result.history
    train_at = arith.TRAIN_DIFFICULTY

    def per_phase(key: str) -> list[float | None]:
        return [round(r[key], 4) if key in r else None for r in history]

    entropies = [r["entropy"] for r in history if "entropy" in r]
    lengths = [r["completion_len"] for r in history if "completion_len" in r]

    return {
        "world": args.world,
        "task": args.task,
        "verifier": args.verifier,
        "init": args.init,
        "seed": args.seed,
        "difficulty": train_at,
        "pass_at_1_initial": round(before[train_at]["pass_at_1"], 4),
        **run.pass_summary(before[train_at], after[train_at]),
        "pass_at_1_gain": round(after[train_at]["pass_at_1"] - before[train_at]["pass_at_1"], 4),
        "pass_at_1_lenient_initial": round(before[train_at]["pass_at_1_lenient"], 4),
        "pass_at_1_lenient_final": round(after[train_at]["pass_at_1_lenient"], 4),
        "held_out_pass_at_1_initial": {str(d): round(before[d]["pass_at_1"], 4) for d in arith.HELD_OUT_DIFFICULTIES},
        "held_out_pass_at_1_final": {str(d): round(after[d]["pass_at_1"], 4) for d in arith.HELD_OUT_DIFFICULTIES},
        "reward_per_phase": per_phase("reward"),
        "entropy_per_phase": per_phase("entropy"),
        # means over the first and the last ten phases (one phase's estimate is noisy)
        **{f"entropy_{where}_10": round(sum(e) / len(e), 4) if e else None
           for where, e in (("first", entropies[:10]), ("last", entropies[-10:]))},
        "completion_len_range": [round(min(lengths), 2), round(max(lengths), 2)] if lengths else None,
        "completion_len_per_phase": per_phase("completion_len"),
        "frac_reward_zero_std_per_phase": per_phase("frac_reward_zero_std"),
        "groups_sampled_per_phase": [r["groups_sampled"] for r in history],
        "phases": len(history),
        "wall_seconds": round(time.perf_counter() - start, 1),
        "train_wall_seconds": round(result.wall_seconds, 1),
        # this process's CPU time over the same span: about the wall time on an idle machine (one thread)
        "cpu_seconds": round(time.process_time() - cpu_start, 1),
        "args": {k: v for k, v in asdict(args).items() if k != "prompts"},
    }


#: What :func:`arithmetic_over_seeds` summarises over the seeds.
SEED_KEYS = ("pass_at_1_initial", "pass_at_1_final", "pass_at_1_gain", "wall_seconds", "cpu_seconds")


def spread(values: list[float]) -> dict[str, Any]:
    """``per_seed`` (as given), ``min``, ``max``, ``mean`` and the sample standard deviation ``std`` =
    sqrt(sum_i (x_i - mean)^2 / (n - 1)) (0 for one value), as ``compare-lora --seeds`` summarises them."""
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return {"per_seed": values, "min": min(values), "max": max(values), "mean": round(mean, 4),
            "std": round(var ** 0.5, 4)}


def arithmetic_over_seeds(world: str, given: dict[str, Any], seeds: list[int], progress: bool = True) -> dict:
    """``train-grpo --task arithmetic --seeds S ...``: :func:`arithmetic_main` once per seed (the preset of
    ``world`` with the flags ``given``, one after another in this process), each seed's summary under
    ``runs`` (by seed) and, per key of :data:`SEED_KEYS`, the spread over the seeds under ``over_seeds``
    (:func:`spread`): one seed is one draw, the text quotes the mean and the spread."""
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds needs distinct seeds, got {seeds}")
    start = time.perf_counter()
    runs = {str(seed): arithmetic_main(GRPOArgs.preset(world, **given, seed=seed), progress=progress)
            for seed in seeds}
    first = runs[str(seeds[0])]
    return {
        "world": world,
        "task": "arithmetic",
        "seeds": list(seeds),
        "over_seeds": {key: spread([runs[str(s)][key] for s in seeds]) for key in SEED_KEYS},
        "runs": runs,
        "wall_seconds": round(time.perf_counter() - start, 1),
        "args": {k: v for k, v in first["args"].items() if k != "seed"},
    }
