"""Chapter 06: DPO and friends: preference learning without a reward model, and RL without a critic.

RLHF (chapters 03 and 04) maximises a reward minus a KL penalty to a reference policy::

    max_pi  E_{y ~ pi(.|x)} [ r(x, y) ]  -  beta * KL( pi(.|x) || pi_ref(.|x) )

whose optimum is known in closed form, ``pi*(y|x) = pi_ref(y|x) exp(r(x, y) / beta) / Z(x)``. Read
backwards, any policy defines the reward it is optimal for, up to a term in x alone::

    r(x, y) = beta * log( pi(y|x) / pi_ref(y|x) )  +  beta * log Z(x)        (the implicit reward)

and under the Bradley-Terry model the probability that y_w is preferred to y_l depends only on the
difference of rewards, so Z(x) cancels: DPO fits the policy directly to preference pairs with a
logistic loss on ``h = log-ratio(y_w) - log-ratio(y_l)``. No reward model, no sampling during
training, no critic. The pieces a learner writes, in the order the chapter builds them:

1. ``sequence_logprobs``    log pi(completion | prompt): the sum of the completion tokens' log-probs
2. ``dpo_loss``             the DPO loss and its variants (IPO, hinge, label smoothing)
3. ``implicit_reward``      beta * (log pi - log pi_ref), what DPO's policy thinks of a completion
4. ``simpo_loss``           SimPO: no reference, length-normalised, with a margin
5. ``kto_loss``             KTO: unpaired desirable / undesirable completions against a reference point
6. ``orpo_loss``            ORPO: no reference, the chosen's NLL plus an odds-ratio term
7. ``best_worst_pairs``     G scored samples per prompt -> one (chosen, rejected) pair
8. ``rloo_advantages``      RLOO's leave-one-out advantages: the baseline of a sample is its siblings' mean
9. ``gspo_sequence_ratio``  GSPO: one importance ratio per sequence (the geometric mean of the tokens')

The last two plug into chapter 04's GRPO trainer (``advantage_estimator="rloo"``: GRPO with RLOO's
advantages, not RLOO's REINFORCE update; ``importance_level="sequence"``). The DPO trainer that runs these is in ``rlhf_tutorial.trainers.dpo``;
the reward-KL frontier of every method of the course in ``rlhf_tutorial.trainers.frontier``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

# ----------------------------------------------------------------------------------------------------
# Log-probabilities of whole completions
# ----------------------------------------------------------------------------------------------------


def sequence_logprobs(
    logits: Float[Tensor, "b s v"], tokens: Int[Tensor, "b s"], mask: Bool[Tensor, "b s"]
) -> Float[Tensor, "b"]:
    """The log-probability of each row's completion given everything before it.

        out[b] = sum_{t >= 1} mask[b, t] * log_softmax(logits[b, t - 1])[tokens[b, t]]

    ``logits[b, t - 1]`` is the model's prediction of token t (logits are shifted by one against the
    tokens); ``mask`` is True on the completion's tokens (prompt and padding False). ``mask[:, 0]``
    is ignored: the first token has no prediction. The result is on ``logits.device``.
    """
    # >>> exercise
    logps = logits[:, :-1].log_softmax(dim=-1)  # [b s-1 v]: position t-1 predicts token t
    token_logps = logps.gather(-1, tokens[:, 1:, None]).squeeze(-1)  # [b s-1]
    return torch.where(mask[:, 1:], token_logps, torch.zeros_like(token_logps)).sum(dim=-1)
    # <<< exercise


# ----------------------------------------------------------------------------------------------------
# The DPO loss and what it implies
# ----------------------------------------------------------------------------------------------------


def dpo_loss(
    policy_chosen_logps: Float[Tensor, "b"],
    policy_rejected_logps: Float[Tensor, "b"],
    ref_chosen_logps: Float[Tensor, "b"],
    ref_rejected_logps: Float[Tensor, "b"],
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> Float[Tensor, ""]:
    """The DPO loss of a batch of pairs (to minimise), with h the difference of the log-ratios:

        h = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)

        "sigmoid": mean( -(1 - ls) * logsigmoid(beta * h) - ls * logsigmoid(-beta * h) )   (DPO;
                   ls = label_smoothing: the label is wrong with probability ls, cDPO)
        "ipo":     mean( (h - 1/(2 beta))^2 )                                              (IPO)
        "hinge":   mean( max(0, 1 - beta h) )                                              (RSO, after SLiC)

    ``logsigmoid`` keeps the loss finite for any h (log(sigmoid(x)) underflows to log 0 for x << 0).
    Any other ``loss_type`` raises ValueError.
    """
    # >>> exercise
    h = (policy_chosen_logps - ref_chosen_logps) - (policy_rejected_logps - ref_rejected_logps)  # [b]
    if loss_type == "sigmoid":
        losses = -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)
    elif loss_type == "ipo":
        losses = (h - 1 / (2 * beta)) ** 2
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * h)
    else:
        raise ValueError(f"loss_type must be 'sigmoid', 'ipo' or 'hinge', got {loss_type!r}")
    return losses.mean()
    # <<< exercise


def implicit_reward(
    policy_logps: Float[Tensor, "b"], ref_logps: Float[Tensor, "b"], beta: float
) -> Float[Tensor, "b"]:
    """The reward a DPO policy implicitly assigns to a completion (up to a term in the prompt alone):

        r_hat(x, y) = beta * log( pi(y | x) / pi_ref(y | x) )

    On a pair, ``r_hat(chosen) - r_hat(rejected) = beta * h``: its mean is the "reward margin" and
    the fraction of pairs where it is positive the "reward accuracy" a DPO run logs.
    """
    # >>> exercise
    return beta * (policy_logps - ref_logps)
    # <<< exercise


def simpo_loss(
    chosen_logps: Float[Tensor, "b"],
    rejected_logps: Float[Tensor, "b"],
    chosen_lengths: Int[Tensor, "b"],
    rejected_lengths: Int[Tensor, "b"],
    beta: float = 2.0,
    gamma: float = 0.5,
) -> Float[Tensor, ""]:
    """SimPO (Meng et al. 2024): no reference model; the reward is the mean log-prob per token, and
    the chosen one must win by a margin gamma:

        mean( -log sigmoid( beta * (log pi(y_w | x) / |y_w| - log pi(y_l | x) / |y_l|) - gamma ) )

    with ``chosen_logps`` = log pi(y_w | x) (summed over its tokens) and ``chosen_lengths`` = |y_w| (tokens).
    """
    # >>> exercise
    margin = chosen_logps / chosen_lengths - rejected_logps / rejected_lengths  # [b]
    return -F.logsigmoid(beta * margin - gamma).mean()
    # <<< exercise


def kto_loss(
    policy_logps: Float[Tensor, "b"],
    ref_logps: Float[Tensor, "b"],
    desirable: Bool[Tensor, "b"],
    z0: Float[Tensor, ""],
    beta: float = 0.1,
    lambda_d: float = 1.0,
    lambda_u: float = 1.0,
) -> Float[Tensor, ""]:
    """KTO (Ethayarajh et al. 2024) on unpaired completions, each labelled desirable or undesirable (to
    minimise). With r = log pi(y | x) - log pi_ref(y | x) per completion and the reference point
    z = max(z0, 0), z0 a KL estimate the caller passes and no gradient flows into:

        loss_i = lambda_d * (1 - sigmoid(beta * (r_i - z)))     if desirable[i]
                 lambda_u * (1 - sigmoid(beta * (z - r_i)))     otherwise

        loss = mean over all b completions of loss_i        (one mean: not the sum of two class means)

    ``desirable`` is True for a desirable completion; ``z0`` is a 0-d tensor (it may carry a graph: the
    loss treats it as a constant). ``lambda_d`` and ``lambda_u`` weigh the two kinds (loss aversion).
    """
    # >>> exercise
    z = z0.detach().clamp(min=0)
    r = policy_logps - ref_logps  # [b]
    losses = torch.where(desirable, lambda_d * (1 - torch.sigmoid(beta * (r - z))),
                         lambda_u * (1 - torch.sigmoid(beta * (z - r))))
    return losses.mean()
    # <<< exercise


def orpo_loss(
    chosen_logps: Float[Tensor, "b"],
    rejected_logps: Float[Tensor, "b"],
    chosen_lengths: Int[Tensor, "b"],
    rejected_lengths: Int[Tensor, "b"],
    lam: float = 0.1,
) -> Float[Tensor, ""]:
    """ORPO (Hong et al. 2024): no reference model; the SFT loss on the chosen completions plus an
    odds-ratio term. With the mean log-prob per token m = log pi(y | x) / |y| of each completion (so
    m < 0) and the log-odds of p = exp(m),

        log_odds(m) = log p - log(1 - p) = m - log(1 - exp(m))

        loss = mean( -m_w )  -  lam * mean( log sigmoid( log_odds(m_w) - log_odds(m_l) ) )

    over the b pairs: the first term is the chosen completions' NLL per token. ``chosen_logps`` is
    log pi(y_w | x) summed over its tokens, ``chosen_lengths`` = |y_w| (tokens). The log-odds must stay
    finite and exact for m close to 0 (1 - exp(m) is then a difference of nearly equal numbers) and for
    m very negative (exp(m) underflows to 0); the log-sigmoid for any difference of log-odds.
    """
    # >>> exercise
    m_w = chosen_logps / chosen_lengths  # [b]
    m_l = rejected_logps / rejected_lengths
    log_odds_w = m_w - torch.log(-torch.expm1(m_w))
    log_odds_l = m_l - torch.log(-torch.expm1(m_l))
    return -m_w.mean() - lam * F.logsigmoid(log_odds_w - log_odds_l).mean()
    # <<< exercise


# ----------------------------------------------------------------------------------------------------
# Pairs from scored groups
# ----------------------------------------------------------------------------------------------------


def best_worst_pairs(rewards: Float[Tensor, "p G"]) -> Int[Tensor, "p 2"]:
    """One (chosen, rejected) pair per group of G scored samples: the indices of the best and the
    worst sample of each row,

        out[i] = (argmax_j rewards[i, j], argmin_j rewards[i, j])        int64

    with the first occurrence on ties (so an all-equal group gives (0, 0): no preference in it), on
    ``rewards.device``.
    """
    # >>> exercise
    return torch.stack([rewards.argmax(dim=-1), rewards.argmin(dim=-1)], dim=-1)
    # <<< exercise


# ----------------------------------------------------------------------------------------------------
# Critic-free RL beside GRPO: RLOO advantages, GSPO's sequence-level ratio
# ----------------------------------------------------------------------------------------------------


def rloo_advantages(rewards: Float[Tensor, "p G"]) -> Float[Tensor, "p G"]:
    """REINFORCE leave-one-out (Ahmadian et al. 2024): the baseline of sample i is the mean reward of
    the *other* G - 1 samples of its group (G >= 2),

        A[i, j] = r[i, j] - mean_{k != j} r[i, k]  =  G / (G - 1) * (r[i, j] - mean_k r[i, k])

    The baseline does not depend on sample j itself, so the policy gradient stays unbiased (GRPO's
    group mean includes r_j). No division by a std.
    """
    # >>> exercise
    size = rewards.shape[-1]
    others = (rewards.sum(dim=-1, keepdim=True) - rewards) / (size - 1)  # [p G]
    return rewards - others
    # <<< exercise


def gspo_sequence_ratio(
    logprobs: Float[Tensor, "B g"], old_logprobs: Float[Tensor, "B g"], mask: Bool[Tensor, "B g"]
) -> Float[Tensor, "B"]:
    """GSPO's (Qwen 2025) importance ratio of a whole sequence, normalised by its length:

        s[b] = exp( sum_t mask[b, t] * (logprobs - old_logprobs)[b, t] / sum_t mask[b, t] )
             = ( pi_theta(y_b | x) / pi_old(y_b | x) ) ** (1 / |y_b|)

    the geometric mean of the token ratios. Masked positions count for nothing (every row has at
    least one True). GSPO clips this one number per sequence instead of every token's ratio.
    """
    # >>> exercise
    log_ratio = torch.where(mask, logprobs - old_logprobs, torch.zeros_like(logprobs))  # [B g]
    return torch.exp(log_ratio.sum(dim=-1) / mask.sum(dim=-1))
    # <<< exercise
