"""Chapter 03: RLHF with PPO on a HookedTransformer, in one readable file.

A language model is an RL agent whose **state** is the text so far, whose **action** is the next token,
and whose **episode** is one completion of ``gen_len`` tokens after a fixed prompt. The reward is
sparse: a sentiment classifier scores the whole text once it is written. The pieces, in the order
the chapter builds them:

1. ``TransformerWithValueHead``   the policy plus a value head hooked on ``ln_final.hook_normalized``
2. ``get_samples``                sample completions (with a temperature), return tokens and texts
3. ``get_logprobs``               log pi(token | prefix) of the generated tokens only
4. ``calc_kl_penalty``            KL(policy || reference) from full distributions
5. ``approx_kl``                  the sampled estimators k1, k2, k3 of the same KL
6. ``compute_advantages``         one-step advantages with the score at the last token
7. ``compute_per_token_rewards``  -beta * (log pi - log pi_ref) per token, score added at the end (GAE)
   ``rollout_advantages``         one-step or GAE, as the args say (not an exercise: shown in the notebook)
8. ``ReplayMemory``               one rollout, cut into shuffled minibatches
9. ``compute_rlhf_objective``     clipped surrogate - value loss + entropy - KL (to maximise)
10. ``get_optimizer``, ``lr_schedule``      AdamW with two learning rates, warmup then linear decay
11. ``AdaptiveKLController``, ``EarlyStopping``
12. ``rollout_phase``, ``learning_phase``   the two halves of one PPO phase

Memory rule: no tensor of shape ``[batch, seq, vocab]`` lives for the whole batch. The rollout
runs its forward passes one minibatch at a time and keeps only log-probs and values; the learning
phase recomputes the reference logits of each minibatch when the full-distribution KL is used.

``token_records`` gives the per-token numbers of a few samples (value, KL, advantage) that the
token explorer widget shows, computed by the pieces above.

The trainer that runs these pieces (``RLHFArgs``, ``RLHFTrainer``, saving and loading, the
``train-rlhf`` command) is running code: it lives in ``rlhf_tutorial.trainers.rlhf``, and can run a
learner's versions of the exercises in place of the reference ones:
``RLHFTrainer(args, **learner_functions(globals()))`` from the notebook.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens import HookedTransformer

from rlhf_tutorial.devices import device_of
from rlhf_tutorial.ppo import (
    calc_clipped_surrogate_objective,
    calc_clipped_value_loss,
    calc_entropy_bonus,
    calc_value_function_loss,
    clip_diagnostics,
    compute_gae,
    layer_init,
)
from rlhf_tutorial.rewards import ngram_repetition, whiten

if TYPE_CHECKING:
    from rlhf_tutorial.trainers.rlhf import RLHFArgs, RLHFTrainer

# ----------------------------------------------------------------------------------------------------
# The policy with a value head
# ----------------------------------------------------------------------------------------------------


class TransformerWithValueHead(nn.Module):
    """The policy (a HookedTransformer) and a value head that reads its final normalised residual.

    ``value_head`` is ``Linear(d_model, 4 d_model) -> ReLU -> Linear(4 d_model, 1)``, applied by a
    forward hook to ``ln_final.hook_normalized``: the residual stream after the last LayerNorm, the
    same vector the unembedding turns into logits. One forward pass gives both::

        logits[b, t] = W_U(resid[b, t]),    values[b, t] = V(resid[b, t])  ~ the return expected from state t

    The value head sits on the base model's device (``device_of(base_model)``: a GPU when the model is
    on one), so that the hook applies it to the residual where the residual is; logits and values come
    out on that device.
    """

    def __init__(self, base_model: HookedTransformer):
        super().__init__()
        self.base_model = base_model
        d_model = base_model.cfg.d_model
        # >>> exercise
        self.value_head = nn.Sequential(
            layer_init(nn.Linear(d_model, 4 * d_model), std=math.sqrt(2)),
            nn.ReLU(),
            layer_init(nn.Linear(4 * d_model, 1), std=1.0),
        ).to(device_of(base_model))  # new layers go where the model is
        # <<< exercise

    def forward(self, tokens: Int[Tensor, "b s"]) -> tuple[Float[Tensor, "b s v"], Float[Tensor, "b s"]]:
        # >>> exercise
        stored = {}

        def value_hook(resid: Float[Tensor, "b s d"], hook) -> None:
            stored["values"] = self.value_head(resid).squeeze(-1)  # [b s 1] -> [b s]

        logits = self.base_model.run_with_hooks(
            tokens, return_type="logits", fwd_hooks=[("ln_final.hook_normalized", value_hook)]
        )
        return logits, stored["values"]
        # <<< exercise


# ----------------------------------------------------------------------------------------------------
# Sampling and log-probs
# ----------------------------------------------------------------------------------------------------


def get_samples(
    model: HookedTransformer,
    prompt: str,
    batch_size: int,
    gen_len: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    prepend_bos: bool = True,
) -> tuple[Int[Tensor, "b s"], list[str]]:
    """Sample ``batch_size`` completions of ``gen_len`` new tokens after ``prompt``.

    Each new token is drawn from softmax(logits / temperature) (restricted to the top k when
    ``top_k`` is set); generation does not stop at the end-of-text token, so every row has
    ``seq = prompt_len + gen_len`` tokens (``prompt_len`` counts the BOS token when prepended).

    Returns the tokens (int64; a normal tensor, not an inference tensor: what TransformerLens's
    ``generate`` returns is made under ``torch.inference_mode``, and no forward pass with gradients
    accepts it) and the decoded texts, special tokens (BOS/EOS) left out.
    """
    # >>> exercise
    prompt_tokens = model.to_tokens(prompt, prepend_bos=prepend_bos)  # [1 prompt_len]
    tokens = model.generate(
        prompt_tokens.expand(batch_size, -1),
        max_new_tokens=gen_len,
        stop_at_eos=False,
        temperature=temperature,
        top_k=top_k,
        verbose=False,
        return_type="tokens",
    ).clone()
    texts = model.tokenizer.batch_decode(tokens, skip_special_tokens=True)
    return tokens, texts
    # <<< exercise


def get_logprobs(
    logits: Float[Tensor, "b s v"], tokens: Int[Tensor, "b s"], prefix_len: int | None = None
) -> Float[Tensor, "b g"]:
    """Log-probability of each token under the logits of the position before it.

        logprobs[b, i] = log_softmax(logits[b, start - 1 + i])[tokens[b, start + i]]

    with ``start = 1`` when ``prefix_len`` is None (every token but the first: g = s - 1), else
    ``start = prefix_len`` (the generated tokens only: g = s - prefix_len).
    """
    # >>> exercise
    start = 1 if prefix_len is None else prefix_len
    logprobs = logits[:, start - 1 : -1].log_softmax(dim=-1)  # [b g v]: position t predicts token t+1
    return logprobs.gather(-1, tokens[:, start:, None]).squeeze(-1)  # [b g]
    # <<< exercise


# ----------------------------------------------------------------------------------------------------
# KL to the reference model
# ----------------------------------------------------------------------------------------------------


def calc_kl_penalty(
    logits: Float[Tensor, "b g v"], ref_logits: Float[Tensor, "b g v"], kl_coef: float
) -> Float[Tensor, ""]:
    """The KL penalty from full distributions: KL(policy || reference), averaged over positions.

        p = softmax(logits),  log p and log p_ref from log_softmax (stable for large logits)
        penalty = kl_coef * mean_{b, g} sum_v p * (log p - log p_ref)
    """
    # >>> exercise
    logp = logits.log_softmax(dim=-1)
    ref_logp = ref_logits.log_softmax(dim=-1)
    kl = (logp.exp() * (logp - ref_logp)).sum(dim=-1)  # [b g]
    return kl_coef * kl.mean()
    # <<< exercise


def approx_kl(
    logprobs: Float[Tensor, "*b"], ref_logprobs: Float[Tensor, "*b"], estimator: str = "k3"
) -> Float[Tensor, "*b"]:
    """Per-token estimates of KL(policy || ref) from tokens the policy sampled.

    With r = p_ref(y) / p(y) at the sampled token y (log r from the two log-probs):

        k1 = -log r                 unbiased, high variance, can be negative
        k2 = (log r)^2 / 2          biased (low for small KL), low variance, >= 0
        k3 = (r - 1) - log r        unbiased, low variance, >= 0

    Any other ``estimator`` raises a ValueError whose message names the three accepted ones, k1, k2
    and k3 (a typo must not silently train with another estimator).
    """
    # >>> exercise
    logr = ref_logprobs - logprobs
    if estimator == "k1":
        return -logr
    if estimator == "k2":
        return logr**2 / 2
    if estimator == "k3":
        return torch.expm1(logr) - logr
    raise ValueError(f"estimator must be 'k1', 'k2' or 'k3', got {estimator!r}")
    # <<< exercise


# ----------------------------------------------------------------------------------------------------
# Advantages and per-token rewards
# ----------------------------------------------------------------------------------------------------


def compute_advantages(
    values: Float[Tensor, "b s"], rewards: Float[Tensor, "b"], prefix_len: int
) -> Float[Tensor, "b g"]:
    """One-step advantages of the generated tokens: A_t = Q(s_t, a_t) - V(s_t).

    State ``s_t`` (the text up to position t) chooses the token at position t+1, and ``values[:, t]``
    is V(s_t). The one-step estimate of Q is the next state's value, except after the last token, where
    the episode is over and the score is known. So, for each of the g = s - prefix_len generated tokens
    (the tokens from position prefix_len on):

        A = V(the state just after the token) - V(the state that chose it)    every token but the last
        A = rewards[b] - V(the state that chose it)                            the last token

    The state that chose a token is the position just before it; the state just after a token is the
    token's own position.
    """
    # >>> exercise
    one_step_q = torch.cat([values[:, prefix_len:-1], rewards[:, None]], dim=-1)
    return one_step_q - values[:, prefix_len - 1 : -1]
    # <<< exercise


def compute_per_token_rewards(
    scores: Float[Tensor, "b"],
    logprobs: Float[Tensor, "b g"],
    ref_logprobs: Float[Tensor, "b g"],
    kl_coef: float,
) -> Float[Tensor, "b g"]:
    """Dense per-token rewards for GAE: a KL penalty at every token, the score at the last one.

        r_t = -kl_coef * (logprobs_t - ref_logprobs_t)  (+ scores at t = g - 1)

    Summed over t this is score - kl_coef * log(pi(y|x) / pi_ref(y|x)): the RLHF objective of one
    sequence, with the sampled (k1) estimate of its KL.
    """
    # >>> exercise
    rewards = -kl_coef * (logprobs - ref_logprobs)
    last = torch.zeros_like(rewards)
    last[:, -1] = scores
    return rewards + last
    # <<< exercise


def compute_gae_advantages(
    rewards: Float[Tensor, "b g"], values: Float[Tensor, "b s"], prefix_len: int, gamma: float, gae_lambda: float
) -> Float[Tensor, "b g"]:
    """GAE over the generated tokens, each sequence one episode that ends at its last token.

    ``rewards`` are per generated token; ``values`` are the whole sequence's, as ``compute_advantages``
    takes them: V(s_t) for the state that chose generated token i is at position t = prefix_len - 1 + i,
    so the g states are positions prefix_len - 1 .. s - 2. Chapter 01's ``compute_gae`` is time-major
    (``[steps, env]``): here steps are token positions and envs are sequences, so the tensors are
    transposed in and out. ``dones`` is True at the last position only, so nothing is bootstrapped
    past the end.
    """
    batch, gen = rewards.shape
    state_values = values[:, prefix_len - 1 : -1]  # [b g]
    dones = torch.zeros(gen, batch, dtype=torch.bool, device=rewards.device)
    dones[-1] = True
    next_value = torch.zeros(batch, device=rewards.device)
    advantages = compute_gae(rewards.T, state_values.T, next_value, dones, gamma, gae_lambda)  # [g b]
    return advantages.T


def rollout_advantages(
    scores: Float[Tensor, "b"],
    logprobs: Float[Tensor, "b g"],
    ref_logprobs: Float[Tensor, "b g"],
    values: Float[Tensor, "b s"],
    prefix_len: int,
    kl_coef: float,
    args: RLHFArgs,
) -> Float[Tensor, "b g"]:
    """The advantages of a rollout's generated tokens, by ``args.advantage_estimator``:

        "one_step":  compute_advantages(values, scores, prefix_len)        (the KL goes in the objective)
        "gae":       compute_gae_advantages(r, values, prefix_len, gamma, gae_lambda)
                     with r = compute_per_token_rewards(scores, logprobs, ref_logprobs, kl_coef)

    Both take the whole sequence's ``values`` ``[b s]`` and pick the states that chose the generated
    tokens themselves.
    """
    if args.advantage_estimator == "gae":
        token_rewards = compute_per_token_rewards(scores, logprobs, ref_logprobs, kl_coef)
        return compute_gae_advantages(token_rewards, values, prefix_len, args.gamma, args.gae_lambda)
    return compute_advantages(values, scores, prefix_len)


# ----------------------------------------------------------------------------------------------------
# Replay memory
# ----------------------------------------------------------------------------------------------------


@dataclass
class ReplayMinibatch:
    """A minibatch of one rollout: rows of every tensor of the memory, the same rows for each.

    Fields: ``tokens`` [mb, s], ``logprobs`` [mb, g] (pi_old), ``ref_logprobs`` [mb, g],
    ``advantages`` [mb, g], ``returns`` [mb, g] (= advantages + values; no values field)."""

    tokens: Int[Tensor, "mb s"]
    logprobs: Float[Tensor, "mb g"]  # log pi_old(token) of the generated tokens
    ref_logprobs: Float[Tensor, "mb g"]  # log pi_ref(token)
    advantages: Float[Tensor, "mb g"]
    returns: Float[Tensor, "mb g"]  # value targets: advantages + values


@dataclass
class ReplayMemory:
    """One rollout. ``values[:, i]`` is V(s) of the state that chose generated token i (no gradients)."""

    tokens: Int[Tensor, "b s"]
    logprobs: Float[Tensor, "b g"]
    ref_logprobs: Float[Tensor, "b g"]
    values: Float[Tensor, "b g"]
    advantages: Float[Tensor, "b g"]

    def get_minibatches(
        self, num_minibatches: int, update_epochs: int = 1, generator: torch.Generator | None = None
    ) -> list[ReplayMinibatch]:
        """``update_epochs`` passes over the memory, each a fresh random permutation of
        the rows cut into ``num_minibatches`` equal minibatches (every row once per pass).

        The value targets are ``returns = advantages + values``: with one-step advantages, the next
        state's value (or the score, after the last token).

        The permutation is drawn on the CPU, from ``generator`` (a CPU generator, as the trainer's):
        CPU indices select rows of tensors on any device, so the minibatches stay on the memory's device.
        """
        batch = self.tokens.shape[0]
        assert batch % num_minibatches == 0, "batch_size must be a multiple of num_minibatches"
        # >>> exercise
        returns = self.advantages + self.values
        minibatches = []
        for _ in range(update_epochs):
            permutation = torch.randperm(batch, generator=generator)
            for indices in permutation.reshape(num_minibatches, -1):  # [num_minibatches mb]
                minibatches.append(
                    ReplayMinibatch(
                        tokens=self.tokens[indices],
                        logprobs=self.logprobs[indices],
                        ref_logprobs=self.ref_logprobs[indices],
                        advantages=self.advantages[indices],
                        returns=returns[indices],
                    )
                )
        return minibatches
        # <<< exercise


# ----------------------------------------------------------------------------------------------------
# The objective
# ----------------------------------------------------------------------------------------------------


def compute_rlhf_objective(
    model: TransformerWithValueHead,
    ref_model: HookedTransformer,
    minibatch: ReplayMinibatch,
    prefix_len: int,
    kl_coef: float,
    args: RLHFArgs,
) -> tuple[Float[Tensor, ""], dict[str, float]]:
    """The RLHF objective of one minibatch (to maximise) and its diagnostics.

    One forward pass of the policy gives logits and values; the logits are divided by the sampling
    temperature; ``gen``, a slice of positions prefix_len - 1 .. s - 2, picks the g positions whose
    logits predict the generated tokens (and whose values are the states that chose them)::

        objective = L_clip(logprobs, old logprobs, advantages)      chapter 01, clip_coef
                  - L_value(values[:, gen], returns)                 chapter 01, vf_coef
                  + ent_coef * H(logits[:, gen])                     chapter 01
                  - kl_coef * KL(policy || ref)

    KL is ``calc_kl_penalty`` on the reference logits of this minibatch (recomputed here, without
    gradients, so no full-vocabulary tensor outlives one minibatch, and divided by the same
    ``args.temperature`` as the policy's) when ``args.kl_estimator`` is "full", else the mean of
    ``approx_kl`` with that estimator on the stored reference log-probs (taken at that temperature by
    the rollout). ``kl_coef`` is the argument (the trainer's choice), not ``args.kl_coef``.
    When ``kl_coef`` is 0 (GAE: the KL is already in the per-token rewards) the term adds nothing, and
    may be skipped (this reference does): no reference forward and no KL graph, and ``kl`` is then the
    k3 estimate from the stored reference log-probs, for the logs only. Computing it anyway is right too.

    With ``args.cliprange_value`` set, the value loss is ``calc_clipped_value_loss`` (chapter 01)
    with the rollout's values ``minibatch.returns - minibatch.advantages`` (the memory stored
    ``returns = advantages + values``).

    Diagnostics: ``kl`` (the KL itself), ``approx_kl`` (k3 estimate of KL(old policy || policy): how
    far this update has moved), ``clipfrac`` (fraction of ratios outside 1 +- clip_coef). They are
    computed after your code from the names it defines: ``objective``, ``clipped_surrogate``,
    ``value_loss``, ``entropy`` (the mean entropy, before ``ent_coef``), ``kl`` (before ``kl_coef``),
    ``logprobs``, ``values`` and ``gen``.
    """
    # >>> exercise
    logits, values = model(minibatch.tokens)  # [mb s v], [mb s]
    logits = logits / args.temperature
    gen = slice(prefix_len - 1, -1)
    logprobs = get_logprobs(logits, minibatch.tokens, prefix_len)  # [mb g]

    clipped_surrogate = calc_clipped_surrogate_objective(
        logprobs, minibatch.logprobs, minibatch.advantages, args.clip_coef
    )
    if args.cliprange_value is None:
        value_loss = calc_value_function_loss(values[:, gen], minibatch.returns, args.vf_coef)
    else:
        old_values = minibatch.returns - minibatch.advantages  # the rollout's values
        value_loss = calc_clipped_value_loss(
            values[:, gen], old_values, minibatch.returns, args.vf_coef, args.cliprange_value
        )
    entropy = calc_entropy_bonus(logits[:, gen], 1.0)
    if kl_coef == 0:  # nothing to weigh: skip the reference forward and the KL graph, log k3
        with torch.no_grad():
            kl = approx_kl(logprobs, minibatch.ref_logprobs, "k3").mean()
    elif args.kl_estimator == "full":
        with torch.no_grad():
            ref_logits = ref_model(minibatch.tokens) / args.temperature
        kl = calc_kl_penalty(logits[:, gen], ref_logits[:, gen], 1.0)
    else:
        kl = approx_kl(logprobs, minibatch.ref_logprobs, args.kl_estimator).mean()
    objective = clipped_surrogate - value_loss + args.ent_coef * entropy - kl_coef * kl
    # <<< exercise
    with torch.no_grad():
        stats = {
            "objective": objective.item(),
            "clipped_surrogate": clipped_surrogate.item(),
            "value_loss": value_loss.item(),
            "entropy": entropy.item(),
            "kl": kl.item(),
            **clip_diagnostics(logprobs, minibatch.logprobs, args.clip_coef),  # approx_kl, clipfrac
            "value_mean": values[:, gen].mean().item(),
        }
    return objective, stats


# ----------------------------------------------------------------------------------------------------
# Optimizer, schedule, controllers
# ----------------------------------------------------------------------------------------------------


def get_optimizer(model: TransformerWithValueHead, base_lr: float, head_lr: float) -> torch.optim.AdamW:
    """AdamW with two parameter groups, ``maximize=True`` (we climb the objective):
    the pretrained transformer at ``base_lr``, the freshly initialised value head at ``head_lr``;
    ``weight_decay=0`` (AdamW's default 0.01 would pull the pretrained weights towards zero, not
    towards the reference: the KL penalty is the tether)."""
    # >>> exercise
    return torch.optim.AdamW(
        [
            {"params": model.base_model.parameters(), "lr": base_lr},
            {"params": model.value_head.parameters(), "lr": head_lr},
        ],
        maximize=True,
        weight_decay=0.0,
    )
    # <<< exercise


def lr_schedule(step: int, warmup_steps: int, total_steps: int, final_scale: float) -> float:
    """The learning-rate multiplier at ``step``: linear warmup, then linear decay.

        step / warmup_steps                                           for step < warmup_steps
        1 + (final_scale - 1) * (step - warmup) / (total - warmup)    for warmup_steps <= step < total
        final_scale                                                   for step >= total_steps
    """
    # >>> exercise
    if step < warmup_steps:
        return step / warmup_steps
    if step >= total_steps:
        return final_scale
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return 1.0 + (final_scale - 1.0) * progress
    # <<< exercise


class AdaptiveKLController:
    """A proportional controller of the KL coefficient (Ziegler et al., 2019).

        err   = clip(current_kl / target - 1, -0.2, 0.2)
        value = value * (1 + err * n_steps / horizon)

    KL above target raises the coefficient (a stronger pull back), below target lowers it.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: int):
        # >>> exercise
        self.value = init_kl_coef
        self.target = target
        self.horizon = horizon
        # <<< exercise

    def update(self, current_kl: float, n_steps: int) -> None:
        # >>> exercise
        err = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + err * n_steps / self.horizon
        # <<< exercise


class EarlyStopping:
    """Stop training once ``patience`` consecutive calls have violated a threshold.

    A call violates when ``kl > kl_threshold``, or when a ``reward_threshold`` is set and
    ``reward > reward_threshold``. A call that violates nothing resets the count.
    """

    def __init__(self, patience: int, kl_threshold: float, reward_threshold: float | None = None):
        # >>> exercise
        self.patience = patience
        self.kl_threshold = kl_threshold
        self.reward_threshold = reward_threshold
        self.violations = 0
        # <<< exercise

    def should_stop(self, kl: float, reward: float) -> bool:
        # >>> exercise
        violated = kl > self.kl_threshold
        if self.reward_threshold is not None and reward > self.reward_threshold:
            violated = True
        self.violations = self.violations + 1 if violated else 0
        return self.violations >= self.patience
        # <<< exercise


# ----------------------------------------------------------------------------------------------------
# The two phases
# ----------------------------------------------------------------------------------------------------


def rollout_phase(trainer: RLHFTrainer) -> ReplayMemory:
    """Sample a batch from the policy, score it, and store what the learning phase needs.

    1. ``get_samples`` from ``trainer.model.base_model`` with the args' prompt, sizes, temperature;
    2. task rewards ``trainer.reward_fn(texts)`` (on the policy's device), minus ``repetition_coef *
       ngram_repetition`` (shaping; it reads texts and gives a CPU tensor: move it to the rewards' device);
    3. without gradients, one chunk of at most ``args.minibatch_size`` rows at a time (never
       ``[batch, seq, vocab]`` for the whole batch at once): policy logits and values, reference
       logits; keep only log-probs of the generated tokens (of logits / temperature, for both models)
       and the values;
    4. scores = the shaped rewards, whitened only when ``args.whiten_rewards``;
    5. advantages: ``rollout_advantages`` with the current KL coefficient ``trainer.kl_coef`` (the
       adaptive controller's value when it is on, not ``args.kl_coef``): one-step or GAE, as
       ``args.advantage_estimator`` says;
    6. a ``ReplayMemory`` with the values of the g states that chose the generated tokens.

    The last line logs the phase from the names your code defines: ``texts``, ``task_rewards``,
    ``rewards`` (shaped) and ``memory``.
    """
    args, prefix_len = trainer.args, trainer.prefix_len
    # >>> exercise
    tokens, texts = get_samples(
        trainer.model.base_model, args.prefix, args.batch_size, args.gen_len,
        args.temperature, args.top_k, args.prepend_bos,
    )
    task_rewards = trainer.reward_fn(texts)  # [batch], on the policy's device
    repetition = ngram_repetition(texts, args.repetition_n).to(task_rewards.device)
    rewards = task_rewards - args.repetition_coef * repetition

    logprobs, ref_logprobs, values = [], [], []
    with torch.no_grad():
        for chunk in tokens.split(args.minibatch_size):  # [mb s]
            logits, chunk_values = trainer.model(chunk)  # [mb s v], [mb s]
            ref_logits = trainer.ref_model(chunk)
            logprobs.append(get_logprobs(logits / args.temperature, chunk, prefix_len))
            ref_logprobs.append(get_logprobs(ref_logits / args.temperature, chunk, prefix_len))
            values.append(chunk_values)
    logprobs, ref_logprobs, values = torch.cat(logprobs), torch.cat(ref_logprobs), torch.cat(values)

    scores = whiten(rewards) if args.whiten_rewards else rewards
    advantages = rollout_advantages(scores, logprobs, ref_logprobs, values, prefix_len, trainer.kl_coef, args)
    memory = ReplayMemory(
        tokens=tokens,
        logprobs=logprobs,
        ref_logprobs=ref_logprobs,
        values=values[:, prefix_len - 1 : -1],
        advantages=advantages,
    )
    # <<< exercise
    trainer.log_rollout(texts=texts, task_rewards=task_rewards, rewards=rewards, memory=memory)
    return memory


def learning_phase(trainer: RLHFTrainer, memory: ReplayMemory) -> dict[str, float]:
    """Several passes of minibatch gradient ascent on one rollout, then one step of the LR schedule.

    For each minibatch of the memory (``update_epochs`` passes of ``num_minibatches`` minibatches, the
    order drawn from ``trainer.generator``): zero the gradients, compute the objective
    (``compute_rlhf_objective`` with ``trainer.objective_kl_coef``), backpropagate, clip the global
    gradient norm to ``max_grad_norm``, step the optimizer. After the last one, step ``trainer.scheduler`` once.
    Append each minibatch's diagnostics (the objective's stats dict) to ``all_stats``: their mean is
    returned.
    """
    args = trainer.args
    all_stats = []
    # >>> exercise
    for minibatch in memory.get_minibatches(args.num_minibatches, args.update_epochs, trainer.generator):
        trainer.optimizer.zero_grad()
        objective, stats = compute_rlhf_objective(
            trainer.model, trainer.ref_model, minibatch, trainer.prefix_len, trainer.objective_kl_coef, args
        )
        objective.backward()
        nn.utils.clip_grad_norm_(trainer.model.parameters(), args.max_grad_norm)
        trainer.optimizer.step()
        all_stats.append(stats)
    trainer.scheduler.step()
    # <<< exercise
    return {key: sum(s[key] for s in all_stats) / len(all_stats) for key in all_stats[0]}


# ----------------------------------------------------------------------------------------------------
# Per-token records (what the token explorer shows)
# ----------------------------------------------------------------------------------------------------


@torch.no_grad()
def token_records(trainer: RLHFTrainer, tokens: Int[Tensor, "b s"], texts: list[str]) -> list[dict[str, Any]]:
    """Per sample: its reward and, per generated token, the value of the state that chose it, the KL to
    the reference at that position (``calc_kl_penalty`` of that position's full distributions, at the
    sampling temperature), and its advantage as the trainer computes it (``rollout_advantages``) from
    the scores of these samples whitened together, as a rollout's are (``whiten_rewards``; a single
    sample is not whitened), so that advantages and values are in the units the value head was
    trained on."""
    args, p = trainer.args, trainer.prefix_len
    logits, values = trainer.model(tokens)  # [b s v], [b s]
    logits = logits / args.temperature
    ref_logits = trainer.ref_model(tokens) / args.temperature
    logprobs = get_logprobs(logits, tokens, p)  # [b g]
    ref_logprobs = get_logprobs(ref_logits, tokens, p)
    gen = slice(p - 1, -1)
    kl = torch.stack([
        torch.stack([calc_kl_penalty(lg[None, None], ref[None, None], 1.0) for lg, ref in zip(row, ref_row)])
        for row, ref_row in zip(logits[:, gen], ref_logits[:, gen])
    ])  # [b g]: KL(policy || ref) at each position
    rewards = trainer.reward_fn(list(texts))
    scores = whiten(rewards) if args.whiten_rewards and len(rewards) > 1 else rewards
    advantages = rollout_advantages(scores, logprobs, ref_logprobs, values, p, trainer.kl_coef, args)
    model = trainer.model.base_model
    return [
        {
            "text": texts[i],
            "reward": rewards[i].item(),
            "prompt": model.to_string(tokens[i, :p]),
            "tokens": [model.to_string(tokens[i, j : j + 1]) for j in range(p, tokens.shape[1])],
            "value": values[i, gen].tolist(),
            "kl": kl[i].tolist(),
            "advantage": advantages[i].tolist(),
            "logprob": logprobs[i].tolist(),
            "ref_logprob": ref_logprobs[i].tolist(),
        }
        for i in range(tokens.shape[0])
    ]
