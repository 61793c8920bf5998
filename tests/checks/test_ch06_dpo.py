"""Checkers of chapter 06: the reference passes, the stub fails, realistic wrong versions (written out
here, independently of the checker's catalogue) fail with a message naming the mistake, and correct
code written differently passes."""

import pytest
import torch
import torch.nn.functional as F

from rlhf_tutorial.checks import run_check
from rlhf_tutorial.checks.core import check_device
from tests.checks.helpers import assert_fails_with

#: A tensor built on the CPU beside the checker's cases is a mistake only on another device.
needs_gpu = pytest.mark.skipif(check_device().type == "cpu", reason="needs a GPU or RLHF_TUTORIAL_DEVICE=simgpu")


# ----------------------------------------------------------------------------------------------------
# sequence_logprobs
# ----------------------------------------------------------------------------------------------------
def seq_unshifted(logits, tokens, mask):
    lp = logits.log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return (lp * mask).sum(-1)


def seq_mean(logits, tokens, mask):
    lp = logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
    m = mask[:, 1:].float()
    return (lp * m).sum(-1) / m.sum(-1)


def seq_log_of_softmax(logits, tokens, mask):
    probs = torch.softmax(logits[:, :-1], dim=-1)
    lp = torch.log(probs).gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
    return (lp * mask[:, 1:]).sum(-1)


def seq_mask_misaligned(logits, tokens, mask):
    lp = logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
    return (lp * mask[:, :-1]).sum(-1)


def seq_ignores_mask(logits, tokens, mask):
    lp = logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
    return lp.sum(-1)


def seq_counts_position_zero_by_wraparound(logits, tokens, mask):
    # torch.roll instead of slicing: position 0 gets the last logits, and mask[:, 0] is used.
    prev = torch.roll(logits, 1, dims=1).log_softmax(-1)
    lp = prev.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return (lp * mask).sum(-1)


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (seq_unshifted, "not shifted"),
        (seq_mean, "averaged"),
        (seq_log_of_softmax, "NaN or inf"),  # only the large-logit case exposes it
        (seq_mask_misaligned, "mask is shifted"),
        (seq_ignores_mask, "only the tokens where mask is True"),
        (seq_counts_position_zero_by_wraparound, "Wrong values on an all-True mask"),  # only mask[:, 0] exposes it
    ],
)
def test_sequence_logprobs_mistakes(wrong, fragment):
    assert_fails_with("sequence_logprobs", wrong, fragment)


def test_sequence_logprobs_written_differently():
    def with_loops(logits, tokens, mask):
        out = torch.zeros(logits.shape[0], device=logits.device)
        for b in range(logits.shape[0]):
            for t in range(1, logits.shape[1]):
                if mask[b, t]:
                    out[b] += logits[b, t - 1, tokens[b, t]] - torch.logsumexp(logits[b, t - 1], dim=0)
        return out

    assert run_check("sequence_logprobs", with_loops).passed


def seq_padded_on_the_cpu(logits, tokens, mask):
    # the log-probs padded back to s with a zero column for position 0 (no device=: on the CPU)
    lp = logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
    lp = torch.cat([torch.zeros(len(lp), 1), lp], dim=1)
    return (lp * mask).sum(-1)


@needs_gpu
def test_sequence_logprobs_padding_on_the_cpu_is_named():
    """Right on a CPU; on a GPU, the CPU zeros meet the GPU log-probs in torch.cat."""
    result = run_check("sequence_logprobs", seq_padded_on_the_cpu)
    assert not result.passed and "mixed devices" in result.message, result.message
    assert "torch.cat([torch.zeros(len(lp), 1), lp], dim=1)" in result.message and "checker" not in result.message


# ----------------------------------------------------------------------------------------------------
# dpo_loss
# ----------------------------------------------------------------------------------------------------
def _h(pc, pr, rc, rr):
    return (pc - rc) - (pr - rr)


def dpo_unstable(pc, pr, rc, rr, beta=0.1, loss_type="sigmoid", label_smoothing=0.0):
    h = _h(pc, pr, rc, rr)
    if loss_type == "sigmoid":
        ls = label_smoothing
        return (-(1 - ls) * torch.log(torch.sigmoid(beta * h)) - ls * torch.log(torch.sigmoid(-beta * h))).mean()
    if loss_type == "ipo":
        return ((h - 1 / (2 * beta)) ** 2).mean()
    if loss_type == "hinge":
        return torch.relu(1 - beta * h).mean()
    raise ValueError(loss_type)


def dpo_no_reference(pc, pr, rc, rr, beta=0.1, loss_type="sigmoid", label_smoothing=0.0):
    h = pc - pr
    if loss_type == "sigmoid":
        return (-(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)).mean()
    if loss_type == "ipo":
        return ((h - 1 / (2 * beta)) ** 2).mean()
    if loss_type == "hinge":
        return torch.relu(1 - beta * h).mean()
    raise ValueError(loss_type)


def dpo_ipo_wrong_target(pc, pr, rc, rr, beta=0.1, loss_type="sigmoid", label_smoothing=0.0):
    h = _h(pc, pr, rc, rr)
    if loss_type == "ipo":
        return ((h - 1 / beta) ** 2).mean()
    if loss_type == "hinge":
        return torch.relu(1 - beta * h).mean()
    if loss_type == "sigmoid":
        return (-(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)).mean()
    raise ValueError(loss_type)


def dpo_smoothing_swapped(pc, pr, rc, rr, beta=0.1, loss_type="sigmoid", label_smoothing=0.0):
    h = _h(pc, pr, rc, rr)
    if loss_type == "sigmoid":
        return (-label_smoothing * F.logsigmoid(beta * h) - (1 - label_smoothing) * F.logsigmoid(-beta * h)).mean()
    if loss_type == "ipo":
        return ((h - 1 / (2 * beta)) ** 2).mean()
    if loss_type == "hinge":
        return torch.relu(1 - beta * h).mean()
    raise ValueError(loss_type)


def dpo_falls_back_to_sigmoid(pc, pr, rc, rr, beta=0.1, loss_type="sigmoid", label_smoothing=0.0):
    h = _h(pc, pr, rc, rr)
    if loss_type == "ipo":
        return ((h - 1 / (2 * beta)) ** 2).mean()
    if loss_type == "hinge":
        return torch.relu(1 - beta * h).mean()
    return (-(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)).mean()


def _dpo_with(ipo=None, hinge=None):
    """The right loss except for an IPO or a hinge written here."""

    def fn(pc, pr, rc, rr, beta=0.1, loss_type="sigmoid", label_smoothing=0.0):
        h = _h(pc, pr, rc, rr)
        if loss_type == "sigmoid":
            return (-(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)).mean()
        if loss_type == "ipo":
            return (ipo or (lambda h, beta: (h - 1 / (2 * beta)) ** 2))(h, beta).mean()
        if loss_type == "hinge":
            return (hinge or (lambda h, beta: torch.relu(1 - beta * h)))(h, beta).mean()
        raise ValueError(f"unknown loss_type {loss_type}")

    return fn


dpo_ipo_precedence = _dpo_with(ipo=lambda h, beta: (h - 1/2*beta) ** 2)  # noqa: E226 - the bug is the spacing
dpo_hinge_plus = _dpo_with(hinge=lambda h, beta: torch.relu(1 + beta * h))
dpo_hinge_turned = _dpo_with(hinge=lambda h, beta: torch.relu(beta * h - 1))


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (dpo_ipo_precedence, "1/2*beta is beta / 2"),
        (dpo_hinge_plus, "The hinge has the wrong sign"),
        (dpo_hinge_turned, "The hinge is turned around"),
        (dpo_unstable, "logsigmoid"),  # only the |beta * h| in the hundreds case exposes it
        (dpo_no_reference, "reference log-probs are missing"),
        (dpo_ipo_wrong_target, "1 / (2 beta)"),
        (dpo_smoothing_swapped, "label_smoothing weighs the wrong term"),
        (dpo_falls_back_to_sigmoid, "did not raise ValueError"),
    ],
)
def test_dpo_loss_mistakes(wrong, fragment):
    assert_fails_with("dpo_loss", wrong, fragment)


def test_dpo_loss_written_differently():
    def via_softplus(pc, pr, rc, rr, beta=0.1, loss_type="sigmoid", label_smoothing=0.0):
        logits = beta * ((pc - pr) - (rc - rr))
        if loss_type == "sigmoid":  # -logsigmoid(x) = softplus(-x)
            return ((1 - label_smoothing) * F.softplus(-logits) + label_smoothing * F.softplus(logits)).mean()
        if loss_type == "ipo":
            return ((logits / beta - 0.5 / beta) ** 2).mean()
        if loss_type == "hinge":
            return (1 - logits).clamp(min=0).mean()
        raise ValueError(f"unknown {loss_type}")

    assert run_check("dpo_loss", via_softplus).passed


# ----------------------------------------------------------------------------------------------------
# implicit_reward
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (lambda p, r, beta: beta * (r - p), "upside down"),
        (lambda p, r, beta: p - r, "beta is missing"),
        (lambda p, r, beta: (p - r) / beta, "divided by beta"),
        (lambda p, r, beta: (p - r) * beta + beta, "Wrong values"),  # no catalogued mistake: a plain mismatch
        # only sequence log-probs below about -104 expose it: exp underflows to 0, the ratio is inf
        (lambda p, r, beta: beta * torch.log(p.exp() / r.exp()), "underflows"),
    ],
)
def test_implicit_reward_mistakes(wrong, fragment):
    assert_fails_with("implicit_reward", wrong, fragment)


def test_implicit_reward_written_differently():
    def distributed(policy_logps, ref_logps, beta):
        return torch.mul(policy_logps, beta).sub(torch.mul(ref_logps, beta))

    assert run_check("implicit_reward", distributed).passed


# ----------------------------------------------------------------------------------------------------
# simpo_loss
# ----------------------------------------------------------------------------------------------------
def simpo_unnormalised(c, r, lc, lr, beta=2.0, gamma=0.5):
    return -F.logsigmoid(beta * (c - r) - gamma).mean()


def simpo_gamma_added(c, r, lc, lr, beta=2.0, gamma=0.5):
    return -F.logsigmoid(beta * (c / lc - r / lr) + gamma).mean()


def simpo_unstable(c, r, lc, lr, beta=2.0, gamma=0.5):
    return -torch.log(torch.sigmoid(beta * (c / lc - r / lr) - gamma)).mean()


def simpo_gamma_times_beta(c, r, lc, lr, beta=2.0, gamma=0.5):
    return -F.logsigmoid(beta * (c / lc - r / lr - gamma)).mean()


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (simpo_unnormalised, "not length-normalised"),
        (simpo_gamma_added, "subtract it"),
        (simpo_unstable, "logsigmoid"),  # only the single-token, log-probs-in-the-hundreds case exposes it
        (simpo_gamma_times_beta, "scaled by beta"),
        (lambda c, r, lc, lr, beta=2.0, gamma=0.5: -F.logsigmoid(beta * (c / lr - r / lc) - gamma).mean(),
         "The lengths are swapped"),
    ],
)
def test_simpo_loss_mistakes(wrong, fragment):
    assert_fails_with("simpo_loss", wrong, fragment)


def test_simpo_loss_written_differently():
    def via_softplus(c, r, lc, lr, beta=2.0, gamma=0.5):
        x = beta * c / lc.float() - beta * r / lr.float() - gamma
        return F.softplus(-x).sum() / x.numel()

    assert run_check("simpo_loss", via_softplus).passed


# ----------------------------------------------------------------------------------------------------
# kto_loss
# ----------------------------------------------------------------------------------------------------
def kto_no_reference(policy_logps, ref_logps, desirable, z0, beta=0.1, lambda_d=1.0, lambda_u=1.0):
    z = z0.detach().clamp(min=0)
    r = policy_logps
    losses = torch.where(desirable, lambda_d * (1 - torch.sigmoid(beta * (r - z))),
                         lambda_u * (1 - torch.sigmoid(beta * (z - r))))
    return losses.mean()


def kto_ratio_upside_down(policy_logps, ref_logps, desirable, z0, beta=0.1, lambda_d=1.0, lambda_u=1.0):
    z = z0.detach().clamp(min=0)
    r = ref_logps - policy_logps
    losses = torch.where(desirable, lambda_d * (1 - torch.sigmoid(beta * (r - z))),
                         lambda_u * (1 - torch.sigmoid(beta * (z - r))))
    return losses.mean()


def kto_same_side(policy_logps, ref_logps, desirable, z0, beta=0.1, lambda_d=1.0, lambda_u=1.0):
    z = z0.detach().clamp(min=0)
    r = policy_logps - ref_logps
    weight = torch.where(desirable, lambda_d, lambda_u)
    return (weight * (1 - torch.sigmoid(beta * (r - z)))).mean()


def kto_labels_flipped(policy_logps, ref_logps, desirable, z0, beta=0.1, lambda_d=1.0, lambda_u=1.0):
    z = z0.detach().clamp(min=0)
    r = policy_logps - ref_logps
    undesirable = desirable.float()  # read the flag as "is undesirable"
    losses = (1 - undesirable) * lambda_d * (1 - torch.sigmoid(beta * (r - z))) \
        + undesirable * lambda_u * (1 - torch.sigmoid(beta * (z - r)))
    return losses.mean()


def kto_unclamped(policy_logps, ref_logps, desirable, z0, beta=0.1, lambda_d=1.0, lambda_u=1.0):
    z = z0.detach()
    r = policy_logps - ref_logps
    losses = torch.where(desirable, lambda_d * (1 - torch.sigmoid(beta * (r - z))),
                         lambda_u * (1 - torch.sigmoid(beta * (z - r))))
    return losses.mean()


def kto_clamps_below(policy_logps, ref_logps, desirable, z0, beta=0.1, lambda_d=1.0, lambda_u=1.0):
    z = z0.detach().clamp(max=0)  # clamp's min and max mixed up
    r = policy_logps - ref_logps
    losses = torch.where(desirable, lambda_d * (1 - torch.sigmoid(beta * (r - z))),
                         lambda_u * (1 - torch.sigmoid(beta * (z - r))))
    return losses.mean()


def kto_z0_not_detached(policy_logps, ref_logps, desirable, z0, beta=0.1, lambda_d=1.0, lambda_u=1.0):
    z = torch.clamp(z0, min=0.0)
    r = policy_logps - ref_logps
    losses = torch.where(desirable, lambda_d * (1 - torch.sigmoid(beta * (r - z))),
                         lambda_u * (1 - torch.sigmoid(beta * (z - r))))
    return losses.mean()


def kto_no_reference_point(policy_logps, ref_logps, desirable, z0, beta=0.1, lambda_d=1.0, lambda_u=1.0):
    r = policy_logps - ref_logps  # z0 read in the docstring, forgotten in the code: judged against 0
    losses = torch.where(desirable, lambda_d * (1 - torch.sigmoid(beta * r)), lambda_u * (1 - torch.sigmoid(-beta * r)))
    return losses.mean()


def kto_minus_sigmoid(policy_logps, ref_logps, desirable, z0, beta=0.1, lambda_d=1.0, lambda_u=1.0):
    z, r = z0.detach().clamp(min=0), policy_logps - ref_logps  # "maximise the sigmoid": the 1 forgotten
    return torch.where(desirable, -lambda_d * torch.sigmoid(beta * (r - z)), -lambda_u * torch.sigmoid(beta * (z - r))).mean()


def kto_two_class_means(policy_logps, ref_logps, desirable, z0, beta=0.1, lambda_d=1.0, lambda_u=1.0):
    z = z0.detach().clamp(min=0)
    r = policy_logps - ref_logps
    chosen = lambda_d * (1 - torch.sigmoid(beta * (r[desirable] - z)))
    rejected = lambda_u * (1 - torch.sigmoid(beta * (z - r[~desirable])))
    return chosen.mean() + rejected.mean()


def kto_two_class_means_guarded(policy_logps, ref_logps, desirable, z0, beta=0.1, lambda_d=1.0, lambda_u=1.0):
    """The sum of two class means, with a guard for an empty class: right only when one class is empty."""
    z = z0.detach().clamp(min=0)
    r = policy_logps - ref_logps
    total = policy_logps.new_zeros(())
    if desirable.any():
        total = total + (lambda_d * (1 - torch.sigmoid(beta * (r[desirable] - z)))).mean()
    if (~desirable).any():
        total = total + (lambda_u * (1 - torch.sigmoid(beta * (z - r[~desirable])))).mean()
    return total


def kto_lambdas_swapped(policy_logps, ref_logps, desirable, z0, beta=0.1, lambda_d=1.0, lambda_u=1.0):
    z = z0.detach().clamp(min=0)
    r = policy_logps - ref_logps
    losses = torch.where(desirable, lambda_u * (1 - torch.sigmoid(beta * (r - z))),
                         lambda_d * (1 - torch.sigmoid(beta * (z - r))))
    return losses.mean()


def kto_lambdas_ignored(policy_logps, ref_logps, desirable, z0, beta=0.1, lambda_d=1.0, lambda_u=1.0):
    z = z0.detach().clamp(min=0)
    r = policy_logps - ref_logps
    losses = torch.where(desirable, 1 - torch.sigmoid(beta * (r - z)), 1 - torch.sigmoid(beta * (z - r)))
    return losses.mean()


def kto_beta_outside(policy_logps, ref_logps, desirable, z0, beta=0.1, lambda_d=1.0, lambda_u=1.0):
    z = z0.detach().clamp(min=0)
    r = policy_logps - ref_logps
    losses = torch.where(desirable, lambda_d * beta * (1 - torch.sigmoid(r - z)),
                         lambda_u * beta * (1 - torch.sigmoid(z - r)))
    return losses.mean()


def kto_beta_ignored(policy_logps, ref_logps, desirable, z0, beta=0.1, lambda_d=1.0, lambda_u=1.0):
    z = z0.detach().clamp(min=0)
    r = policy_logps - ref_logps
    losses = torch.where(desirable, lambda_d * (1 - torch.sigmoid(r - z)), lambda_u * (1 - torch.sigmoid(z - r)))
    return losses.mean()


def kto_log_sigmoid(policy_logps, ref_logps, desirable, z0, beta=0.1, lambda_d=1.0, lambda_u=1.0):
    z = z0.detach().clamp(min=0)
    r = policy_logps - ref_logps
    losses = torch.where(desirable, -lambda_d * F.logsigmoid(beta * (r - z)), -lambda_u * F.logsigmoid(beta * (z - r)))
    return losses.mean()


def kto_undesirable_detached(policy_logps, ref_logps, desirable, z0, beta=0.1, lambda_d=1.0, lambda_u=1.0):
    z = z0.detach().clamp(min=0)
    r = policy_logps - ref_logps
    losses = torch.where(desirable, lambda_d * (1 - torch.sigmoid(beta * (r - z))),
                         lambda_u * (1 - torch.sigmoid(beta * (z - r.detach()))))
    return losses.mean()


def kto_in_place(policy_logps, ref_logps, desirable, z0, beta=0.1, lambda_d=1.0, lambda_u=1.0):
    z = z0.detach().clamp(min=0)
    r = policy_logps.sub_(ref_logps)  # "saves a tensor"
    losses = torch.where(desirable, lambda_d * (1 - torch.sigmoid(beta * (r - z))),
                         lambda_u * (1 - torch.sigmoid(beta * (z - r))))
    return losses.mean()


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (kto_no_reference, "log-ratio to the reference"),
        (kto_ratio_upside_down, "upside down"),
        (kto_same_side, "Both kinds are scored on r - z"),
        (kto_labels_flipped, "Desirable and undesirable are swapped"),
        (kto_unclamped, "not clamped at 0"),
        (kto_z0_not_detached, "z0 carried a gradient"),
        (kto_no_reference_point, "reference point is missing"),
        (kto_minus_sigmoid, "minus the sigmoid"),
        (kto_two_class_means, "ONE mean"),
        (kto_lambdas_swapped, "lambda_d and lambda_u are swapped"),
        (kto_beta_outside, "beta multiplies the loss"),
        (kto_log_sigmoid, "not\n-log sigmoid"),
        (kto_undesirable_detached, "is not the reference's"),
    ],
)
def test_kto_loss_mistakes(wrong, fragment):
    assert_fails_with("kto_loss", wrong, fragment.replace("\n", " "))


def test_kto_loss_z0_in_the_graph_is_not_called_detached():
    """z0 left in the graph adds a term to the gradient: the message names that, and does not also claim
    that something was detached (the opposite of what the learner did)."""
    result = run_check("kto_loss", kto_z0_not_detached)
    assert not result.passed and "z0 carried a gradient" in result.message, result.message
    assert "is detached or replaced" not in result.message, result.message


def test_kto_loss_written_differently():
    def in_float64_with_signs(policy_logps, ref_logps, desirable, z0, beta=0.1, lambda_d=1.0, lambda_u=1.0):
        # 1 - sigmoid(x) = sigmoid(-x); the sign of each side from the label; float64 inside
        z = max(float(z0), 0.0)
        r = policy_logps.double() - ref_logps.double()
        sign = desirable.double() * 2 - 1  # +1 desirable, -1 undesirable
        weight = torch.where(desirable, torch.full_like(r, lambda_d), torch.full_like(r, lambda_u))
        return (weight * torch.sigmoid(-beta * sign * (r - z))).sum().div(len(r)).float()

    def with_a_loop(policy_logps, ref_logps, desirable, z0, beta=0.1, lambda_d=1.0, lambda_u=1.0):
        z = torch.relu(z0.detach())
        total = 0
        for p, q, good in zip(policy_logps, ref_logps, desirable):
            if good:
                total = total + lambda_d * torch.sigmoid(-beta * (p - q - z))
            else:
                total = total + lambda_u * torch.sigmoid(-beta * (z - p + q))
        return total / len(policy_logps)

    assert run_check("kto_loss", in_float64_with_signs).passed
    assert run_check("kto_loss", with_a_loop).passed


# ----------------------------------------------------------------------------------------------------
# orpo_loss
# ----------------------------------------------------------------------------------------------------
def _log_odds(m):
    return m - torch.log(-torch.expm1(m))


def orpo_unnormalised(c, r, lc, lr, lam=0.1):
    return -(c / lc).mean() - lam * F.logsigmoid(_log_odds(c) - _log_odds(r)).mean()


def orpo_swapped_lengths(c, r, lc, lr, lam=0.1):
    mc, mr = c / lr, r / lc
    return -mc.mean() - lam * F.logsigmoid(_log_odds(mc) - _log_odds(mr)).mean()


def orpo_summed_nll(c, r, lc, lr, lam=0.1):
    mc, mr = c / lc, r / lr
    return -c.mean() - lam * F.logsigmoid(_log_odds(mc) - _log_odds(mr)).mean()


def orpo_nll_per_token_of_the_batch(c, r, lc, lr, lam=0.1):
    mc, mr = c / lc, r / lr
    return -c.sum() / lc.sum() - lam * F.logsigmoid(_log_odds(mc) - _log_odds(mr)).mean()  # every token weighs 1


def orpo_nll_on_both(c, r, lc, lr, lam=0.1):
    mc, mr = c / lc, r / lr
    return -(mc.mean() + mr.mean()) - lam * F.logsigmoid(_log_odds(mc) - _log_odds(mr)).mean()


def orpo_log_probs_not_odds(c, r, lc, lr, lam=0.1):
    mc, mr = c / lc, r / lr
    return -mc.mean() - lam * F.logsigmoid(mc - mr).mean()


def orpo_sign_flipped(c, r, lc, lr, lam=0.1):
    mc, mr = c / lc, r / lr
    return -mc.mean() + lam * F.logsigmoid(_log_odds(mc) - _log_odds(mr)).mean()


def orpo_rejected_minus_chosen(c, r, lc, lr, lam=0.1):
    mc, mr = c / lc, r / lr
    return -mc.mean() - lam * F.logsigmoid(_log_odds(mr) - _log_odds(mc)).mean()


def orpo_lam_on_nll(c, r, lc, lr, lam=0.1):
    mc, mr = c / lc, r / lr
    return -lam * mc.mean() - F.logsigmoid(_log_odds(mc) - _log_odds(mr)).mean()


def orpo_lam_default(c, r, lc, lr, lam=0.1):
    lam = lam or 0.1
    mc, mr = c / lc, r / lr
    return -mc.mean() - lam * F.logsigmoid(_log_odds(mc) - _log_odds(mr)).mean()


def orpo_naive_log_odds(c, r, lc, lr, lam=0.1):
    mc, mr = c / lc, r / lr

    def odds(m):
        return m - torch.log(1 - torch.exp(m))

    return -mc.mean() - lam * F.logsigmoid(odds(mc) - odds(mr)).mean()


def orpo_log1p_exp(c, r, lc, lr, lam=0.1):
    """log1p(-exp(m)): exact for m very negative, every digit lost for m near 0."""
    mc, mr = c / lc, r / lr

    def odds(m):
        return m - torch.log1p(-torch.exp(m))

    return -mc.mean() - lam * F.logsigmoid(odds(mc) - odds(mr)).mean()


def orpo_through_probabilities(c, r, lc, lr, lam=0.1):
    """log p taken back from p = exp(m): -inf once p underflows (m in the hundreds below 0)."""
    mc, mr = c / lc, r / lr
    pc, pr = torch.exp(mc), torch.exp(mr)
    ratio = (torch.log(pc) - torch.log(-torch.expm1(mc))) - (torch.log(pr) - torch.log(-torch.expm1(mr)))
    return -mc.mean() - lam * F.logsigmoid(ratio).mean()


def orpo_expm1_of_minus_m(c, r, lc, lr, lam=0.1):
    """log_odds = -log(exp(-m) - 1): exact near 0, but exp(-m) overflows for m in the hundreds below 0."""
    mc, mr = c / lc, r / lr
    return -mc.mean() - lam * F.logsigmoid(torch.log(torch.expm1(-mr)) - torch.log(torch.expm1(-mc))).mean()


def orpo_log_of_sigmoid(c, r, lc, lr, lam=0.1):
    mc, mr = c / lc, r / lr
    return -mc.mean() - lam * torch.log(torch.sigmoid(_log_odds(mc) - _log_odds(mr))).mean()


def orpo_sum(c, r, lc, lr, lam=0.1):
    mc, mr = c / lc, r / lr
    return -mc.sum() - lam * F.logsigmoid(_log_odds(mc) - _log_odds(mr)).sum()


def orpo_rejected_detached(c, r, lc, lr, lam=0.1):
    mc, mr = c / lc, r.detach() / lr
    return -mc.mean() - lam * F.logsigmoid(_log_odds(mc) - _log_odds(mr)).mean()


def orpo_in_place(c, r, lc, lr, lam=0.1):
    mc, mr = c.div_(lc), r / lr
    return -mc.mean() - lam * F.logsigmoid(_log_odds(mc) - _log_odds(mr)).mean()


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (orpo_unnormalised, "not length-normalised"),
        (orpo_swapped_lengths, "lengths are swapped"),
        (orpo_summed_nll, "NLL per token"),
        (orpo_nll_on_both, "chosen completions alone"),
        (orpo_nll_per_token_of_the_batch, "weighs every token the same"),
        (orpo_log_probs_not_odds, "log-probs, not log-odds"),
        (orpo_sign_flipped, "wrong sign"),
        (orpo_rejected_minus_chosen, "wrong sign"),
        (orpo_lam_on_nll, "lam weighs the NLL"),
        (orpo_lam_default, "0 is a value"),
        (orpo_naive_log_odds, "close to 0"),
        (orpo_log1p_exp, "close to 0"),
        (orpo_through_probabilities, "NaN or inf"),
        (orpo_log_of_sigmoid, "NaN or inf"),
        (orpo_sum, "both terms are means"),
        (orpo_rejected_detached, "no gradient reaches"),
    ],
)
def test_orpo_loss_mistakes(wrong, fragment):
    assert_fails_with("orpo_loss", wrong, fragment)


def test_orpo_loss_written_differently():
    def piecewise_in_float64(c, r, lc, lr, lam=0.1):
        # log(1 - e^m): the expm1 form near 0, the log1p form far below it, in float64
        def log_one_minus_exp(m):
            return torch.where(m > -0.6931, torch.log(-torch.expm1(m)), torch.log1p(-torch.exp(m)))

        mc, mr = c.double() / lc, r.double() / lr
        ratio = (mc - log_one_minus_exp(mc)) - (mr - log_one_minus_exp(mr))
        return (-mc.mean() + lam * F.softplus(-ratio).mean()).float()

    def with_logaddexp(c, r, lc, lr, lam=0.1):
        # log(1 - p) = log(-expm1(m)); the odds-ratio term as -softplus(-x) written with logaddexp
        mc, mr = c / lc.float(), r / lr.float()
        x = (mc - torch.log(-torch.expm1(mc))) - (mr - torch.log(-torch.expm1(mr)))
        term = -torch.logaddexp(torch.zeros_like(x), -x)
        return torch.mean(-mc) - lam * torch.mean(term)

    assert run_check("orpo_loss", piecewise_in_float64).passed
    assert run_check("orpo_loss", with_logaddexp).passed


# ----------------------------------------------------------------------------------------------------
# best_worst_pairs
# ----------------------------------------------------------------------------------------------------
def pairs_swapped(rewards):
    return torch.stack([rewards.argmin(-1), rewards.argmax(-1)], dim=-1)


def pairs_via_sort(rewards):
    # descending sort: first and last of the order; ties come out in the order sort chooses
    order = rewards.argsort(dim=-1, descending=True, stable=True)
    return torch.stack([order[:, 0], order[:, -1]], dim=-1)


def pairs_transposed(rewards):
    return torch.stack([rewards.argmax(-1), rewards.argmin(-1)])


def pairs_as_float(rewards):
    return torch.stack([rewards.argmax(-1), rewards.argmin(-1)], dim=-1).float()


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (pairs_swapped, "swapped"),
        (pairs_via_sort, "the worst the last"),  # only ties expose it
        (pairs_transposed, "shape"),
        (pairs_as_float, "dtype"),
    ],
)
def test_best_worst_pairs_mistakes(wrong, fragment):
    assert_fails_with("best_worst_pairs", wrong, fragment)


def pairs_with_loops(rewards, device=None):
    out = []
    for row in rewards.tolist():
        best = worst = 0
        for j, value in enumerate(row):
            if value > row[best]:
                best = j
            if value < row[worst]:
                worst = j
        out.append([best, worst])
    return torch.tensor(out, dtype=torch.int64, device=device)


def test_best_worst_pairs_written_differently():
    assert run_check("best_worst_pairs", lambda rewards: pairs_with_loops(rewards, rewards.device)).passed


@needs_gpu
def test_best_worst_pairs_returned_on_the_cpu_is_named():
    """torch.tensor(...) without device=: right values, on the CPU while the rewards are on the GPU."""
    result = run_check("best_worst_pairs", pairs_with_loops)
    assert not result.passed and "your output is on cpu" in result.message, result.message


# ----------------------------------------------------------------------------------------------------
# rloo_advantages
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (lambda r: r - r.mean(-1, keepdim=True), "sample j included"),
        (lambda r: r - (r.sum(-1, keepdim=True) - r) / r.shape[-1], "G - 1"),
        (lambda r: (r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-4), "Wrong values"),
        (lambda r: r - (r.sum() - r) / (r.numel() - 1), "within each group"),
        # G / (G - 1) * (r - mean) with integer division: right for G = 2 only, not the whole group's mean
        (lambda r: r.shape[-1] // (r.shape[-1] - 1) * (r - r.mean(-1, keepdim=True)), "G // (G - 1) is integer division"),
    ],
)
def test_rloo_advantages_mistakes(wrong, fragment):
    assert_fails_with("rloo_advantages", wrong, fragment)


def test_rloo_integer_division_is_not_told_it_subtracted_the_whole_mean():
    result = run_check("rloo_advantages", lambda r: r.shape[-1] // (r.shape[-1] - 1) * (r - r.mean(-1, keepdim=True)))
    assert "sample j included" not in f"{result.message}\n{result.hint}"


def test_the_unknown_loss_type_message_has_no_stray_backtick():
    result = run_check("dpo_loss", dpo_falls_back_to_sigmoid)
    for line in result.message.splitlines():
        assert line.count("`") % 2 == 0, line


def test_rloo_advantages_written_differently():
    def via_scaling(rewards):
        size = rewards.shape[1]
        return size / (size - 1) * (rewards - rewards.mean(dim=1, keepdim=True))

    assert run_check("rloo_advantages", via_scaling).passed


# ----------------------------------------------------------------------------------------------------
# gspo_sequence_ratio
# ----------------------------------------------------------------------------------------------------
def gspo_arithmetic(lp, old, mask):
    m = mask.float()
    return ((lp - old).exp() * m).sum(-1) / m.sum(-1)


def gspo_product(lp, old, mask):
    return ((lp - old) * mask).sum(-1).exp()


def gspo_padded_mean(lp, old, mask):
    return ((lp - old) * mask).mean(-1).exp()


def gspo_ignores_mask(lp, old, mask):
    return (lp - old).mean(-1).exp()


def gspo_first_n_positions(lp, old, mask):  # only a True position away from the start exposes it
    n = mask.sum(-1, keepdim=True)
    leading = torch.arange(mask.shape[-1], device=mask.device) < n
    return ((lp - old) * leading).sum(-1).div(n.squeeze(-1)).exp()


@pytest.mark.parametrize(
    "wrong, fragment",
    [
        (gspo_first_n_positions, "as if the True positions always started at 0"),
        (gspo_arithmetic, "arithmetic mean"),
        (gspo_product, "summed, not averaged"),
        (gspo_padded_mean, "padded length"),
        (gspo_ignores_mask, "Masked positions were counted"),
    ],
)
def test_gspo_sequence_ratio_mistakes(wrong, fragment):
    assert_fails_with("gspo_sequence_ratio", wrong, fragment)


def test_gspo_sequence_ratio_written_differently():
    def with_loops(lp, old, mask):
        out = []
        for row_lp, row_old, row_m in zip(lp, old, mask):
            diffs = (row_lp - row_old)[row_m]
            # the geometric mean as exp of the mean log-ratio (a product of the ratios overflows on long rows)
            out.append(torch.exp(diffs.sum() / len(diffs)))
        return torch.stack(out)

    assert run_check("gspo_sequence_ratio", with_loops).passed


# ----------------------------------------------------------------------------------------------------
# The contract, clause by clause: a version breaking each (tests/checks/test_contract_clauses.py)
# ----------------------------------------------------------------------------------------------------
def seq_drops_last_token(logits, tokens, mask):
    lp = logits[:, :-2].log_softmax(-1).gather(-1, tokens[:, 1:-1].unsqueeze(-1)).squeeze(-1)
    return (lp * mask[:, 1:-1]).sum(-1)


def seq_keepdim(logits, tokens, mask):
    lp = logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
    return (lp * mask[:, 1:]).sum(-1, keepdim=True)


def seq_detached(logits, tokens, mask):
    lp = logits[:, :-1].detach().log_softmax(-1).gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
    return (lp * mask[:, 1:]).sum(-1)


def seq_in_place(logits, tokens, mask):
    logits -= logits.logsumexp(-1, keepdim=True)  # log-softmax in place, "to save memory"
    lp = logits[:, :-1].gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
    return (lp * mask[:, 1:]).sum(-1)


def _dpo_written(*, h_sign=1.0, beta_outside=False, ignore_smoothing=False, hinge_no_beta=False, reduce="mean",
                 detach_rejected=False, in_place=False):
    """A dpo_loss as a learner writes it, with one decision made wrong (each keyword one)."""

    def dpo(pc, pr, rc, rr, beta=0.1, loss_type="sigmoid", label_smoothing=0.0):
        if detach_rejected:
            pr = pr.detach()
        if in_place:  # the log-ratios computed in the inputs' own memory
            pc -= rc
            pr -= rr
            h = pc - pr
        else:
            h = h_sign * _h(pc, pr, rc, rr)
        ls = 0.0 if ignore_smoothing else label_smoothing
        if loss_type == "sigmoid":
            if beta_outside:
                losses = -(1 - ls) * beta * F.logsigmoid(h) - ls * beta * F.logsigmoid(-h)
            else:
                losses = -(1 - ls) * F.logsigmoid(beta * h) - ls * F.logsigmoid(-beta * h)
        elif loss_type == "ipo":
            losses = (h - 1 / (2 * beta)) ** 2
        elif loss_type == "hinge":
            losses = torch.relu(1 - (h if hinge_no_beta else beta * h))
        else:
            raise ValueError(f"unknown loss_type {loss_type!r}")
        return losses.sum() if reduce == "sum" else losses.mean()

    return dpo


def implicit_reward_mean(policy_logps, ref_logps, beta):
    return (beta * (policy_logps - ref_logps)).mean()


def implicit_reward_in_place(policy_logps, ref_logps, beta):
    return policy_logps.sub_(ref_logps).mul_(beta)


def simpo_swapped_lengths(c, r, lc, lr, beta=2.0, gamma=0.5):
    return -F.logsigmoid(beta * (c / lr - r / lc) - gamma).mean()


def simpo_default_gamma(c, r, lc, lr, beta=2.0, gamma=0.5):
    gamma = gamma or 0.5
    return -F.logsigmoid(beta * (c / lc - r / lr) - gamma).mean()


def simpo_sum(c, r, lc, lr, beta=2.0, gamma=0.5):
    return -F.logsigmoid(beta * (c / lc - r / lr) - gamma).sum()


def simpo_rejected_detached(c, r, lc, lr, beta=2.0, gamma=0.5):
    return -F.logsigmoid(beta * (c / lc - r.detach() / lr) - gamma).mean()


def pairs_last_occurrence(rewards):
    g = rewards.shape[-1]
    return torch.stack([g - 1 - rewards.flip(-1).argmax(-1), g - 1 - rewards.flip(-1).argmin(-1)], dim=-1)


def pairs_over_prompts(rewards):
    return torch.stack([rewards.argmax(0), rewards.argmin(0)], dim=-1)


def rloo_whole_mean(rewards):
    return rewards - rewards.mean(-1, keepdim=True)


def rloo_divides_by_g(rewards):
    return rewards - (rewards.sum(-1, keepdim=True) - rewards) / rewards.shape[-1]


def rloo_integer_division(rewards):
    size = rewards.shape[-1]
    return size // (size - 1) * (rewards - rewards.mean(-1, keepdim=True))


def rloo_with_std(rewards):
    a = rewards - (rewards.sum(-1, keepdim=True) - rewards) / (rewards.shape[-1] - 1)
    return a / (rewards.std(-1, keepdim=True) + 1e-4)


def rloo_over_batch(rewards):
    return rewards - (rewards.sum() - rewards) / (rewards.numel() - 1)


def rloo_in_place(rewards):
    size = rewards.shape[-1]
    baseline = (rewards.sum(-1, keepdim=True) - rewards) / (size - 1)
    return rewards.sub_(baseline)


def gspo_inverted(lp, old, mask):
    m = mask.float()
    return (((old - lp) * m).sum(-1) / m.sum(-1)).exp()


def gspo_product_then_root(lp, old, mask):
    ratios = torch.where(mask, (lp - old).exp(), torch.ones_like(lp))
    return ratios.prod(-1) ** (1.0 / mask.sum(-1))


def gspo_detached(lp, old, mask):
    m = mask.float()
    return (((lp.detach() - old) * m).sum(-1) / m.sum(-1)).exp()


VIOLATIONS = {
    "sequence_logprobs": {
        "shifted": [seq_unshifted],
        "mask_marks_tokens": [seq_mask_misaligned],
        "mask_used": [seq_ignores_mask],
        "first_ignored": [seq_counts_position_zero_by_wraparound],
        "last_token": [seq_drops_last_token],
        "sum": [seq_mean],
        "stable": [seq_log_of_softmax],
        "shape": [seq_keepdim],
        "differentiable": [seq_detached],
        "not_in_place": [seq_in_place],
    },
    "dpo_loss": {
        "log_ratios": [dpo_no_reference],
        "h_sign": [_dpo_written(h_sign=-1.0)],
        "beta_inside": [_dpo_written(beta_outside=True)],
        "label_smoothing": [dpo_smoothing_swapped, _dpo_written(ignore_smoothing=True)],
        "ipo": [dpo_ipo_wrong_target, dpo_ipo_precedence],
        "hinge": [dpo_hinge_plus, dpo_hinge_turned, _dpo_written(hinge_no_beta=True)],
        "mean": [_dpo_written(reduce="sum")],
        "stable": [dpo_unstable],
        "unknown_loss_type": [dpo_falls_back_to_sigmoid],
        "differentiable": [_dpo_written(detach_rejected=True)],
        "not_in_place": [_dpo_written(in_place=True)],
    },
    "implicit_reward": {
        "log_ratio": [lambda p, r, beta: beta * (r - p)],
        "beta": [lambda p, r, beta: p - r, lambda p, r, beta: (p - r) / beta],
        "log_space": [lambda p, r, beta: beta * torch.log(p.exp() / r.exp())],
        "per_completion": [implicit_reward_mean],
        "not_in_place": [implicit_reward_in_place],
    },
    "simpo_loss": {
        "length_normalised": [simpo_unnormalised, simpo_swapped_lengths],
        "gamma_margin": [simpo_gamma_added, simpo_gamma_times_beta],
        "gamma_zero": [simpo_default_gamma],
        "stable": [simpo_unstable],
        "mean": [simpo_sum],
        "differentiable": [simpo_rejected_detached],
    },
    "kto_loss": {
        "log_ratio": [kto_no_reference, kto_ratio_upside_down],
        "sides": [kto_same_side, kto_labels_flipped],
        "z0_clamped": [kto_unclamped, kto_clamps_below],
        "reference_point": [kto_no_reference_point],
        "z0_detached": [kto_z0_not_detached],
        "one_mean": [kto_two_class_means],
        "one_class": [kto_two_class_means_guarded],
        "lambdas": [kto_lambdas_swapped, kto_lambdas_ignored],
        "beta": [kto_beta_outside, kto_beta_ignored],
        "one_minus_sigmoid": [kto_log_sigmoid, kto_minus_sigmoid],
        "differentiable": [kto_undesirable_detached],
        "not_in_place": [kto_in_place],
    },
    "orpo_loss": {
        "length_normalised": [orpo_unnormalised, orpo_swapped_lengths],
        "nll": [orpo_summed_nll, orpo_nll_on_both, orpo_nll_per_token_of_the_batch],
        "odds_not_probs": [orpo_log_probs_not_odds],
        "orientation": [orpo_sign_flipped, orpo_rejected_minus_chosen],
        "lam": [orpo_lam_on_nll],
        "lam_zero": [orpo_lam_default],
        "stable_near_zero": [orpo_naive_log_odds, orpo_log1p_exp],
        "stable_very_negative": [orpo_through_probabilities, orpo_expm1_of_minus_m],
        "stable_logsigmoid": [orpo_log_of_sigmoid],
        "mean": [orpo_sum],
        "differentiable": [orpo_rejected_detached],
        "not_in_place": [orpo_in_place],
    },
    "best_worst_pairs": {
        "chosen_first": [pairs_swapped],
        "first_on_ties": [pairs_via_sort, pairs_last_occurrence],
        "per_group": [pairs_over_prompts],
        "shape": [pairs_transposed],
        "int64": [pairs_as_float],
    },
    "rloo_advantages": {
        "leave_one_out": [rloo_whole_mean],
        "g_minus_one": [rloo_divides_by_g, rloo_integer_division],
        "no_std": [rloo_with_std],
        "within_group": [rloo_over_batch],
        "not_in_place": [rloo_in_place],
    },
    "gspo_sequence_ratio": {
        "geometric": [gspo_arithmetic],
        "length_normalised": [gspo_product],
        "own_count": [gspo_padded_mean],
        "mask": [gspo_ignores_mask, gspo_first_n_positions],
        "orientation": [gspo_inverted],
        "stable": [gspo_product_then_root],
        "differentiable": [gspo_detached],
    },
}
