"""The claims the chapters make about KL estimators, optimizers and advantages, checked numerically.

Expectations over a categorical distribution are computed exactly (a sum weighted by the probabilities,
no sampling): with the weights detached, grad sum_y sg[p(y)] k(y) is E_{y ~ p}[grad k(y)], the
expected per-sample gradient with the samples held fixed (chapter 03, "KL as a reward vs KL as a loss").
"""

import math

import pytest
import torch

from rlhf_tutorial.grpo import group_relative_advantages
from rlhf_tutorial.rlhf import approx_kl, calc_kl_penalty

# cpu_only: exact sums over small CPU tensors that never meet the course's device; on the simulated GPU
# this module would repeat `make unit` exactly.
pytestmark = pytest.mark.cpu_only


def kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(p || q) of two categorical distributions given by logits, with the package's function."""
    return calc_kl_penalty(p_logits[None, None], q_logits[None, None], 1.0)


def grad(fn, theta: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(fn(theta), theta)
    return g


def expected_grad_samples_fixed(estimator: str, theta: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """E_{y ~ pi_theta}[grad_theta k(y)] with the sampled y held fixed (k differentiated as a loss)."""

    def fn(t):
        logp = t.log_softmax(-1)
        return (logp.exp().detach() * approx_kl(logp, ref_logits.log_softmax(-1), estimator)).sum()

    return grad(fn, theta)


def expected_grad_as_reward(estimator: str, theta: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """E_{y ~ pi_theta}[k(y) grad log pi_theta(y)] with k a constant (the estimator inside a reward)."""

    def fn(t):
        logp = t.log_softmax(-1)
        k = approx_kl(logp, ref_logits.log_softmax(-1), estimator).detach()
        return (logp.exp().detach() * k * logp).sum()

    return grad(fn, theta)


PAIRS = [(seed, scale) for seed in (0, 1, 2) for scale in (0.3, 2.0)]  # nearby and far-apart distributions


def distributions(seed: int, scale: float, vocab: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ref_logits = torch.randn(vocab, generator=gen, dtype=torch.float64)
    theta = (ref_logits + scale * torch.randn(vocab, generator=gen, dtype=torch.float64)).requires_grad_(True)
    return theta, ref_logits


@pytest.mark.parametrize("seed, scale", PAIRS)
def test_k1_as_a_loss_has_zero_expected_gradient(seed, scale):
    theta, ref_logits = distributions(seed, scale)
    g = expected_grad_samples_fixed("k1", theta, ref_logits)
    torch.testing.assert_close(g, torch.zeros_like(g), atol=1e-12, rtol=0)
    # ... while the gradient of its expectation, the KL, is not zero
    assert grad(lambda t: kl(t, ref_logits), theta).norm() > 1e-3


@pytest.mark.parametrize("seed, scale", PAIRS)
def test_k3_as_a_loss_follows_kl_ref_policy(seed, scale):
    theta, ref_logits = distributions(seed, scale)
    g = expected_grad_samples_fixed("k3", theta, ref_logits)
    g_reverse = grad(lambda t: kl(ref_logits, t), theta)  # grad KL(ref || policy)
    g_forward = grad(lambda t: kl(t, ref_logits), theta)  # grad KL(policy || ref)
    torch.testing.assert_close(g, g_reverse, atol=1e-10, rtol=1e-8)
    assert (g - g_forward).norm() > 1e-3 * g_forward.norm()  # it is not the other direction


@pytest.mark.parametrize("seed, scale", PAIRS)
def test_k2_as_a_loss_follows_kl_policy_ref(seed, scale):
    theta, ref_logits = distributions(seed, scale)
    g = expected_grad_samples_fixed("k2", theta, ref_logits)
    g_forward = grad(lambda t: kl(t, ref_logits), theta)
    torch.testing.assert_close(g, g_forward, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("seed, scale", PAIRS)
def test_k1_as_a_reward_gives_the_kl_gradient_and_k3_does_not(seed, scale):
    theta, ref_logits = distributions(seed, scale)
    g_forward = grad(lambda t: kl(t, ref_logits), theta)
    g_reverse = grad(lambda t: kl(ref_logits, t), theta)
    torch.testing.assert_close(expected_grad_as_reward("k1", theta, ref_logits), g_forward, atol=1e-10, rtol=1e-8)
    # k3 in a reward misses E[grad k3] = grad KL(ref || policy)
    g3 = expected_grad_as_reward("k3", theta, ref_logits)
    torch.testing.assert_close(g3, g_forward - g_reverse, atol=1e-10, rtol=1e-8)
    assert (g3 - g_forward).norm() > 1e-3 * g_forward.norm()


@pytest.mark.parametrize("seed, scale", PAIRS)
def test_swapped_k3_averages_to_chi2_minus_kl(seed, scale):
    theta, ref_logits = distributions(seed, scale)
    logp, ref_logp = theta.detach().log_softmax(-1), ref_logits.log_softmax(-1)
    p, q = logp.exp(), ref_logp.exp()
    swapped_mean = (p * approx_kl(ref_logp, logp, "k3")).sum()  # log-ratio the wrong way round
    chi2 = (p**2 / q).sum() - 1
    kl_pq, kl_qp = kl(logp, ref_logp), kl(ref_logp, logp)
    torch.testing.assert_close(swapped_mean, chi2 - kl_pq, atol=1e-12, rtol=1e-10)
    assert abs(swapped_mean - kl_qp) > 1e-3 * kl_qp  # it does not estimate KL(ref || policy)
    # sampled, as the checker's hint says it would be seen: 200k draws land near chi2 - KL
    draws = torch.multinomial(p, 200_000, replacement=True, generator=torch.Generator().manual_seed(seed))
    sampled = approx_kl(ref_logp[draws], logp[draws], "k3").mean()
    stderr = approx_kl(ref_logp[draws], logp[draws], "k3").std() / math.sqrt(len(draws))
    assert abs(sampled - (chi2 - kl_pq)) < 5 * stderr


def test_the_two_kls_agree_to_second_order_near_the_reference():
    ref_logits = torch.randn(9, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    direction = torch.randn(9, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    gaps = []
    for eps in (1e-1, 1e-2):
        theta = ref_logits + eps * direction
        forward, reverse = kl(theta, ref_logits), kl(ref_logits, theta)
        gaps.append(abs(forward - reverse).item())
        assert forward > 0 and reverse > 0
    assert gaps[1] < gaps[0] / 500  # the gap shrinks like eps^3 (1000x for 10x smaller eps), the KLs like eps^2


def test_the_kl_regularised_optimum_is_the_reweighted_reference():
    torch.manual_seed(5)
    gen = torch.Generator().manual_seed(5)
    ref = torch.randn(6, generator=gen, dtype=torch.float64).softmax(-1)
    reward = torch.rand(6, generator=gen, dtype=torch.float64)
    for beta in (0.05, 0.3, 2.0):
        def objective(logits, beta=beta):
            p = logits.softmax(-1)
            return (p * reward).sum() - beta * kl(logits, ref.log())

        optimum_logits = (ref.log() + reward / beta).requires_grad_(True)  # pi* = ref * exp(r / beta) / Z
        # J is concave in pi, so a stationary point is the maximum: J's gradient vanishes at pi* ...
        g = grad(objective, optimum_logits)
        torch.testing.assert_close(g, torch.zeros_like(g), atol=1e-10, rtol=0)
        # ... and no other distribution does better (random ones, and small steps away from pi*)
        others = torch.distributions.Dirichlet(torch.ones(6, dtype=torch.float64)).sample((500,)).log()
        nearby = optimum_logits.detach() + 0.05 * torch.randn(500, 6, generator=gen, dtype=torch.float64)
        best = objective(optimum_logits).item()
        assert all(objective(o).item() < best for o in torch.cat([others, nearby]))
        log_z = torch.logsumexp(ref.log() + reward / beta, -1)
        torch.testing.assert_close(objective(optimum_logits.detach()), beta * log_z)
    # beta sets the trade-off: small beta concentrates on the best reward, large beta stays at the reference
    assert (ref.log() + reward / 1e-3).softmax(-1)[reward.argmax()] > 0.99
    torch.testing.assert_close((ref.log() + reward / 1e3).softmax(-1), ref, atol=1e-3, rtol=0)


def _steps(optimizer_cls, scale: float, **kwargs) -> torch.Tensor:
    """Parameters of a small regression MLP after 5 steps on loss * scale (same seed, same data)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    opt = optimizer_cls(net.parameters(), **kwargs)
    start = torch.cat([p.detach().flatten() for p in net.parameters()])
    for _ in range(5):
        opt.zero_grad()
        (scale * ((net(x) - y) ** 2).mean()).backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in net.parameters()]) - start


def test_adam_step_is_nearly_invariant_to_a_global_gradient_rescale():
    adam = _steps(torch.optim.AdamW, 1.0, lr=1e-2, weight_decay=0.0)
    adam_small = _steps(torch.optim.AdamW, 0.05, lr=1e-2, weight_decay=0.0)
    assert (adam - adam_small).norm() < 1e-3 * adam.norm()
    # the contrast that makes the claim non-trivial: plain SGD's step scales with the gradient
    sgd = _steps(torch.optim.SGD, 1.0, lr=1e-2)
    sgd_small = _steps(torch.optim.SGD, 0.05, lr=1e-2)
    assert sgd_small.norm() < 0.1 * sgd.norm()


def test_mean_zero_group_advantages_are_not_half_up_half_down():
    rewards = torch.tensor([[1.0, 0, 0, 0, 0, 0, 0, 0]])  # one success in a group of 8
    adv = group_relative_advantages(rewards, "group").flatten()
    assert abs(adv.sum().item()) < 1e-5
    assert int((adv > 0).sum()) == 1 and int((adv < 0).sum()) == 7
    std = math.sqrt(1 / 8)  # unbiased std of one 1 and seven 0s
    assert adv[0].item() == pytest.approx((1 - 1 / 8) / std, rel=1e-3)  # ~ 2.47
    assert adv[1:].tolist() == pytest.approx([-(1 / 8) / std] * 7, rel=1e-3)  # ~ -0.35 each
