"""Chapters 04 and 06: what their prose says about the recorded runs holds for the recorded figures.

The numbers themselves are substituted from ``figures.json`` (tests/test_figures.py checks that every one
is recorded); these tests check the *sentences around them*: "GRPO pays more KL for the same reward",
"RLOO ... at less KL", "DPO and IPO move off the base point in the notebook's grid". A re-recording that
turns one of them false fails here, naming the sentence to rewrite.
"""

from __future__ import annotations

import re
from dataclasses import asdict

import pytest

from rlhf_tutorial import figures, notebooks
from rlhf_tutorial.trainers.frontier import METHODS, FrontierArgs, rewards_at_common_kl

# cpu_only: it reads figures.json and the chapters' text; no device is involved.
pytestmark = pytest.mark.cpu_only


def fig(ref: str) -> float:
    return float(figures.lookup(ref))


def points(run: str) -> dict[tuple[str, float], dict]:
    """The frontier run's points by (method, strength)."""
    return {(p["method"], p["strength"]): p for p in figures.lookup(f"{run}.points")}


def source(chapter: str) -> str:
    return next(src for src in notebooks.sources() if src.name.startswith(chapter)).read_text()


# ----------------------------------------------------------------------------------------------------
# Chapter 04, section 8: PPO and GRPO side by side
# ----------------------------------------------------------------------------------------------------


def test_ch04_grpo_pays_more_kl_for_the_same_reward():
    assert fig("grpo_neg.kl_final") > 1.2 * fig("rlhf_neg.kl_final"), "ch04 section 8: 'GRPO pays more KL'"
    assert abs(fig("grpo_neg.mean_reward_final") - fig("rlhf_neg.mean_reward_final")) < 0.03, (
        "ch04 section 8: 'for the same reward'")


def test_ch04_grpo_samples_run_the_full_16_tokens():
    """'almost none has ended early and both ways of averaging count the same tokens'."""
    assert figures.lookup("grpo_neg.args.max_new_tokens") == 16
    assert fig("grpo_neg.completion_len_final") > 15.8


# ----------------------------------------------------------------------------------------------------
# Chapter 06
# ----------------------------------------------------------------------------------------------------


def test_ch06_rloo_as_high_as_grpo_at_less_kl():
    se = fig("frontier_short.base.reward_se")
    assert fig("rloo_short.mean_reward_final") > fig("grpo_short.mean_reward_final") - se, "ch06 section 6: 'as high'"
    assert fig("rloo_short.kl_final") < fig("grpo_short.kl_final"), "ch06 section 6: 'at less KL'"


def test_ch06_one_base_reward_per_sample_count():
    """Every run of the notebook measures the base policy on the same 64 samples; the CLI's on 128."""
    base_64 = {fig(ref) for ref in ("grpo_short.mean_reward_initial", "grpo_short_nofast.mean_reward_initial",
                                    "rloo_short.mean_reward_initial",
                                    "gspo_short.mean_reward_initial", "dpo_short.mean_reward_initial",
                                    "frontier_short.base.reward")}
    base_128 = {fig(ref) for ref in ("grpo_neg.mean_reward_initial", "dpo_offline.mean_reward_initial",
                                     "dpo_online.mean_reward_initial", "frontier.base.reward")}
    assert len(base_64) == 1 and len(base_128) == 1, (base_64, base_128)
    # the preference-pair run measures the same policy on the same 64 samples too
    assert fig("dpo_prefs.mean_reward_initial") in base_64


def test_ch06_offline_dpo_levels_off_while_its_kl_grows():
    rewards, kls = figures.lookup("dpo_offline.reward_per_round"), figures.lookup("dpo_offline.kl_per_round")
    assert all(a < b for a, b in zip(kls, kls[1:])), "ch06 section 5: 'the KL keeps growing'"
    assert max(rewards[-3:]) - min(rewards[-3:]) < 0.12, "ch06 section 5: 'the held-out reward levels off'"
    short = figures.lookup("dpo_short.reward_per_round")
    assert all(a < b for a, b in zip(short, short[1:])), "ch06 section 5: the short run 'is still climbing'"


def test_ch06_preference_pairs_barely_move_the_reward():
    assert fig("dpo_prefs.pair_accuracy_final") > 0.75, "the pair accuracy climbs"
    assert fig("dpo_prefs.mean_reward_final") - fig("dpo_prefs.mean_reward_initial") < 0.12, "'barely moved'"
    assert fig("dpo_short.mean_reward_final") > fig("dpo_prefs.mean_reward_final") + 0.15


def test_ch06_online_dpo_spends_far_less_kl_than_offline():
    assert fig("dpo_online.kl_final") < fig("dpo_offline.kl_final") / 3
    assert fig("dpo_online.repetition_final") < 0.01, "'with clean samples'"


def notebook_frontier_args(world: str = "tiny") -> FrontierArgs:
    """The FrontierArgs that chapter 06's notebook builds in the tiny world, read from its source."""
    text = source("06")
    match = re.search(r"^frontier_args = FrontierArgs\(.*?\)\n", text, flags=re.S | re.M)
    assert match, "chapter 06 no longer builds `frontier_args = FrontierArgs(...)` in one statement"
    scope = {"FrontierArgs": FrontierArgs, "world": world, "direction": "neg"}
    exec(match[0], scope)  # noqa: S102 - the course's own source
    return scope["frontier_args"]


def test_ch06_notebook_grid_is_the_recorded_run():
    """The notebook's agree() call compares its grid with `frontier_short`: they must be the same run."""
    recorded = figures.lookup("frontier_short.args")
    mine = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(notebook_frontier_args()).items()}
    assert {k: v for k, v in mine.items() if k != "world"} == {k: v for k, v in recorded.items() if k != "world"}


def test_ch06_notebook_grid_moves_dpo_and_ipo_off_the_base_point():
    """Issue 20: the notebook's grid left DPO and IPO at the base policy (8 optimizer steps)."""
    base = figures.lookup("frontier_short.base")
    for method in ("dpo", "ipo"):
        best = max((p for (m, _), p in points("frontier_short").items() if m == method), key=lambda p: p["reward"])
        assert best["kl"] > 1.0, (method, best)
        assert best["reward"] - base["reward"] > 3 * max(best["reward_se"], base["reward_se"]), (method, best)


def test_ch06_full_grid_reads_as_the_text_says():
    """Section 7's bullets on the CLI's grid (`frontier`): points 0-2 PPO (kl_coef 0.03, 0.1, 0.3), 3-5 GRPO,
    6-8 RLOO, 9-11 GSPO (beta 0.01, 0.1, 0.5), 12-14 DPO (0.03, 0.1, 0.5), 15-17 IPO (0.02, 0.1, 0.5)."""
    p = points("frontier")
    assert [m for m, _ in p] == [m for m in ("ppo", "grpo", "rloo", "gspo", "dpo", "ipo") for _ in range(3)], (
        "the grid's order changed: the chapter's placeholders index the points by position")
    # RLOO spends less KL than GRPO for a little less reward, at the same beta
    for beta in (0.1, 0.01):
        rloo, grpo = p["rloo", beta], p["grpo", beta]
        assert rloo["kl"] < grpo["kl"] and rloo["reward"] < grpo["reward"], beta
    # offline DPO and IPO sit below the RL curve: at about the KL of DPO's weakest-tether points, less reward
    for method, beta in (("dpo", 0.03), ("dpo", 0.1), ("ipo", 0.02)):
        assert p[method, beta]["reward"] < p["ppo", 0.03]["reward"] - 0.1, (method, beta)
    assert p["dpo", 0.5]["reward"] < min(p["ppo", 0.1]["reward"], p["grpo", 0.1]["reward"]) - 0.1
    assert abs(p["dpo", 0.5]["kl"] - p["grpo", 0.1]["kl"]) < 1.0, "'at about the same KL'"
    # IPO's beta sets the KL in order; the weakest tether runs away, GSPO furthest
    assert p["ipo", 0.5]["kl"] < p["ipo", 0.1]["kl"] < p["ipo", 0.02]["kl"]
    others = max(q["kl"] for (m, b), q in p.items() if (m, b) not in (("grpo", 0.01), ("gspo", 0.01)))
    assert p["gspo", 0.01]["kl"] > p["grpo", 0.01]["kl"] > others
    base = figures.lookup("frontier.base")
    assert min(p["grpo", 0.01]["repetition"], p["gspo", 0.01]["repetition"]) > 10 * base["repetition"]
    # standard errors: up to about a tenth of the KL
    assert max(q["kl_se"] / q["kl"] for q in p.values()) < 0.15
    # GSPO starts on the curve but spends more than twice GRPO's KL at beta 0.1 for the same reward
    assert abs(p["gspo", 0.5]["reward"] - p["grpo", 0.5]["reward"]) < 0.05
    assert p["gspo", 0.1]["kl"] > 2 * p["grpo", 0.1]["kl"]
    assert abs(p["gspo", 0.1]["reward"] - p["grpo", 0.1]["reward"]) < 0.05
    # at equal KL, PPO, GRPO and RLOO above DPO and IPO
    _, rewards = rewards_at_common_kl(figures.recorded()["frontier"]["summary"])
    assert min(rewards[m] for m in ("ppo", "grpo", "rloo")) > max(rewards["dpo"], rewards["ipo"]), rewards


#: The methods the notebook's common-KL cell reads (its ``swept``): the default grid's, REINFORCE++ and CISPO.
SWEPT = (*METHODS, "reinforce_pp", "cispo")


def test_ch06_notebook_reads_the_swept_methods_at_common_kl():
    assert re.search(r'^swept = \(\*METHODS, "reinforce_pp", "cispo"\)', source("06"), flags=re.M), (
        "chapter 06's common-KL cell reads other methods than SWEPT here")


def test_ch06_notebook_grid_puts_every_rl_method_above_dpo_and_ipo():
    """The text after the notebook's last frontier cell: every RL method above DPO and IPO at equal KL,
    RLOO first, then REINFORCE++ and GRPO, then CISPO, GSPO and PPO."""
    _, rewards = rewards_at_common_kl(figures.recorded()["frontier_short"]["summary"], methods=SWEPT)
    ranking = sorted(rewards, key=rewards.get, reverse=True)
    assert ranking[0] == "rloo" and set(ranking[-2:]) == {"dpo", "ipo"}, rewards
    assert set(ranking[1:3]) == {"reinforce_pp", "grpo"}, rewards
    assert set(ranking[3:6]) == {"cispo", "gspo", "ppo"}, rewards


def test_ch06_kto_and_orpo_raise_the_reward_orpo_moving_least():
    """Section 5 on the KTO and ORPO runs: both raise the reward from the base; ORPO moves least (less KL and
    less reward than KTO and DPO); KTO lands about where DPO does (within two standard errors)."""
    for run in ("kto_short", "orpo_short"):
        gain = fig(f"{run}.mean_reward_final") - fig(f"{run}.mean_reward_initial")
        assert gain > 3 * fig(f"{run}.reward_se_final"), run
        assert fig(f"{run}.mean_reward_initial") == fig("dpo_short.mean_reward_initial"), "'from the same base reward'"
    for other in ("kto_short", "dpo_short"):
        assert fig("orpo_short.kl_final") < fig(f"{other}.kl_final"), other
        assert fig("orpo_short.mean_reward_final") < fig(f"{other}.mean_reward_final"), other
    assert abs(fig("kto_short.mean_reward_final") - fig("dpo_short.mean_reward_final")) < 2 * fig("kto_short.reward_se_final")


def test_ch06_notebook_grid_places_kto_and_orpo_off_the_base_point():
    """Section 7: the notebook's grid has one KTO and one ORPO point, after the 12 of the swept methods (the
    placeholders index the points by position), each above the base policy."""
    p = figures.lookup("frontier_short.points")
    assert [q["method"] for q in p[12:14]] == ["kto", "orpo"]
    base = figures.lookup("frontier_short.base")
    for q in p[12:14]:
        assert q["kl"] > 0.5 and q["reward"] - base["reward"] > 3 * max(q["reward_se"], base["reward_se"]), q
    kto, orpo, dpo_05, ipo_002, rloo_05 = p[12], p[13], p[9], p[10], p[5]
    assert (dpo_05["method"], dpo_05["strength"], ipo_002["method"], ipo_002["strength"]) == ("dpo", 0.5, "ipo", 0.02)
    # "the offline preference methods share one region, below the RL curve"
    assert max(abs(kto["reward"] - q["reward"]) for q in (dpo_05, ipo_002)) < 2 * kto["reward_se"]
    assert max(abs(kto["kl"] - q["kl"]) for q in (dpo_05, ipo_002)) < 1.5
    # "ORPO moves least, about where GRPO + RLOO adv. at kl_coef 0.5 lands"
    assert orpo["kl"] < min(q["kl"] for q in p[:12] if q["method"] in ("dpo", "ipo", "ppo", "grpo", "gspo")
                            and q["reward"] > orpo["reward"])
    assert (rloo_05["method"], rloo_05["strength"]) == ("rloo", 0.5)
    assert abs(orpo["reward"] - rloo_05["reward"]) < 2 * orpo["reward_se"] and abs(orpo["kl"] - rloo_05["kl"]) < 1.0
    # the common-KL cell leaves the one-point methods out: ORPO's KL is below every swept method's largest
    assert orpo["kl"] < min(max(q["kl"] for q in p if q["method"] == m) for m in SWEPT)


def test_ch06_notebook_grid_places_reinforce_pp_and_cispo_as_the_text_says():
    """Section 7: two REINFORCE++ points (kl_coef 0.03, 0.3) and two CISPO points (0.1, 0.5) after KTO's and ORPO's
    (the placeholders index them by position: 14-17), each above the base policy; REINFORCE++ on the RL curve or
    above it; CISPO at 0.5 with GRPO and GSPO at 0.5, at 0.1 the furthest point of the grid."""
    p = figures.lookup("frontier_short.points")
    assert [(q["method"], q["strength"]) for q in p[14:]] == [("reinforce_pp", 0.03), ("reinforce_pp", 0.3),
                                                              ("cispo", 0.1), ("cispo", 0.5)]
    base = figures.lookup("frontier_short.base")
    for q in p[14:]:
        assert q["kl"] > 0.5 and q["reward"] - base["reward"] > 3 * max(q["reward_se"], base["reward_se"]), q
    rpp_003, rpp_03, cispo_01, cispo_05 = p[14:]
    ppo_01, grpo_01, grpo_05, gspo_01, gspo_05 = p[0], p[2], p[3], p[6], p[7]
    assert [(q["method"], q["strength"]) for q in (ppo_01, grpo_01, grpo_05, gspo_01, gspo_05)] == [
        ("ppo", 0.1), ("grpo", 0.1), ("grpo", 0.5), ("gspo", 0.1), ("gspo", 0.5)]
    # REINFORCE++ at 0.3 "beside GRPO's kl_coef 0.5 point"; at 0.03 above PPO's 0.1 point at about its KL,
    # "a gap within two standard errors of the difference"
    assert abs(rpp_03["kl"] - grpo_05["kl"]) < 0.5 and rpp_03["reward"] > grpo_05["reward"] - rpp_03["reward_se"]
    gap = rpp_003["reward"] - ppo_01["reward"]
    assert 0 < gap < 2 * (rpp_003["reward_se"] ** 2 + ppo_01["reward_se"] ** 2) ** 0.5
    assert abs(rpp_003["kl"] - ppo_01["kl"]) < 1.5
    # CISPO at 0.5 "with GRPO and GSPO at 0.5": between them in reward, about their KL
    assert min(grpo_05["reward"], gspo_05["reward"]) < cispo_05["reward"] < max(grpo_05["reward"], gspo_05["reward"])
    assert max(abs(cispo_05["kl"] - q["kl"]) for q in (grpo_05, gspo_05)) < 0.5
    # CISPO at 0.1 "runs furthest of every point", beyond GSPO's and GRPO's at the same kl_coef
    assert cispo_01["kl"] == max(q["kl"] for q in p) and cispo_01["kl"] > gspo_01["kl"] > grpo_01["kl"]

def test_rewards_at_common_kl_reads_each_curve_at_the_smallest_largest_kl():
    result = {"base": {"reward": 0.3}, "points": [
        {"method": "a", "kl": 2.0, "reward": 0.7}, {"method": "a", "kl": 6.0, "reward": 0.9},
        {"method": "b", "kl": 4.0, "reward": 0.5},  # the smallest largest KL: 4
        {"method": "c", "kl": 8.0, "reward": 0.8}]}
    common, rewards = rewards_at_common_kl(result)
    assert common == 4.0
    assert rewards == {"a": pytest.approx(0.8), "b": pytest.approx(0.5), "c": pytest.approx(0.55)}


# ----------------------------------------------------------------------------------------------------
# Chapter 04, section 10: REINFORCE++, CISPO, and a bfloat16 sampler
# ----------------------------------------------------------------------------------------------------


def test_ch04_the_tis_correction_is_not_measurable_at_this_size():
    """'a difference smaller than the standard error ... about the size of the one between two float32 GRPO runs
    whose samplers differ only in their code'; 'no weight comes near the cap'; 'a few hundredths per token'."""
    gap = abs(fig("mismatch_bf16_tis.mean_reward_final") - fig("mismatch_bf16.mean_reward_final"))
    assert gap < fig("frontier_short.base.reward_se"), "ch04 section 10: 'smaller than the standard error'"
    code_gap = abs(fig("grpo_short_nofast.mean_reward_final") - fig("grpo_short.mean_reward_final"))
    assert code_gap / 1.5 < gap < 1.5 * code_gap, "ch04 section 10: 'about the size of the one between two ... runs'"
    assert fig("mismatch_bf16_tis.mismatch_frac_above_cap") == 0.0
    assert fig("mismatch_bf16.mismatch_max_abs_logratio_all") < 0.35, "ch04 section 10: 'no weight comes near the cap'"
    assert 0.01 <= fig("mismatch_bf16.mismatch_abs_logratio") < 0.1, "ch04 section 10: 'a few hundredths per token'"
    assert abs(fig("mismatch_bf16_tis.tis_weight_mean") - 1) < 0.01


def test_ch04_reinforce_pp_and_cispo_learn():
    """'they show that each update learns': both lift the 12-phase run's reward well above the base level."""
    for run in ("reinforce_pp_short", "cispo_short"):
        assert fig(f"{run}.mean_reward_final") > fig(f"{run}.mean_reward_initial") + 0.3, run
