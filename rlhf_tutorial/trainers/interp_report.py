"""Chapter 05's findings in one run: ``python -m rlhf_tutorial interp-report --world tiny``.

Loads the base policy and a tuned one (the tiny world's shipped checkpoint, or ``--checkpoint DIR``
written by ``train-rlhf --save DIR``), runs every analysis of the chapter with the reference exercises
of :mod:`rlhf_tutorial.interp`, writes an HTML report (plotly.js inlined: it opens offline) and prints a
JSON summary on the last line:

- ``logit_lens_half_layer``: where the tuned model's logit lens first reaches half its final value;
- ``top_heads_by_change``: the 3 heads whose direct logit attribution changed most;
- ``best_single_layer_patch``: the attention or MLP output whose patch restores most of the shift;
- ``final_resid_patch_restored``: the sanity check (patching the last residual restores all of it);
- ``attribution_closure_error``: |sum of component attributions - total| (bookkeeping);
- ``value_final``: the tuned model's value head on each model's final residual at the last prompt token
  (averaged over the prompts), and ``tuned_reward_prompt0``: the tuned samples' mean P(NEGATIVE);
- ``top_activation_difference_tokens``, ``steering_reward``: the activation-difference lens;
  ``activation_difference_sentiment``: where the negative and positive words rank under it, against 1000
  random directions (``interp.word_rank_baseline``) and for each unrelated text alone;
- ``fraction_changed_fp32`` / ``fraction_changed_bf16``: how sparse the update is, and in which precision.

Everything is seeded (``--seed``); with one torch thread the same seed gives the same summary.

``python -m rlhf_tutorial build-tuned --world tiny`` (``build_tuned_main``) trains the tiny world's tuned
policy with chapter 03's trainer and ships it in the package (``tiny/artifacts/tuned_neg``).
"""

from __future__ import annotations

import argparse
import html
import json
import time
from pathlib import Path
from typing import Any

import torch
from transformer_lens import HookedTransformer

from rlhf_tutorial import interp
from rlhf_tutorial.devices import device_of, rng_devices
from rlhf_tutorial.interp import (
    closure_error,
    lens_records,
    mean_attributions,
    sentiment_setup,
    steered_samples,
)
from rlhf_tutorial.rewards import sentiment_reward_fn
from rlhf_tutorial.rlhf import TransformerWithValueHead, get_samples
from rlhf_tutorial.trainers.checkpoint import (
    WEIGHTS_FILE,
    load_tuned_policy,
    save_tuned_policy,
    stand_in_mismatch,
)


def train_tuned(world: str, out: str | Path, smoke: bool = False, seed: int = 0, progress: bool = True,
                **extra: Any) -> dict[str, Any]:
    """Run chapter 03's trainer towards negative sentiment with the world's preset (a few tiny phases when
    ``smoke``), evaluate it before and after, and save the policy with its value head to ``out`` (the
    run's numbers and ``extra`` go into its ``rlhf_config.json``). Returns those numbers."""
    from rlhf_tutorial.trainers.rlhf import RLHFArgs, RLHFTrainer

    small = dict(num_phases=2, batch_size=8, num_minibatches=2, gen_len=8, eval_samples=8) if smoke else {}
    args = RLHFArgs.preset(world, direction="neg", seed=seed, **small)
    trainer = RLHFTrainer(args)
    before = trainer.evaluate(args.eval_samples, seed=seed + 1)
    history = trainer.train(progress=progress)
    after = trainer.evaluate(args.eval_samples, seed=seed + 1)
    stats = {"mean_reward_initial": round(before["reward"], 4), "mean_reward_final": round(after["reward"], 4),
             "kl_final": round(after["kl"], 4), "phases": len(history)}
    save_tuned_policy(trainer.model, out, args, **extra, **stats)
    return stats


def reuse_or_train_tuned(world: str, out: str | Path, smoke: bool = False, **kwargs: Any) -> Path:
    """``out`` when it holds a tuned policy of this world's policy as it is here (in the GPT-2 world on a
    stand-in cache: trained on the same stand-in, tokenizer and vocabulary, :func:`stand_in_mismatch`),
    else a new one trained there with :func:`train_tuned` (``smoke``, ``kwargs``), saying why the old one
    was not reused. Returns ``out``: chapter 05's GPT-2 world runs on it."""
    out = Path(out)
    if (out / WEIGHTS_FILE).exists():
        problem = stand_in_mismatch(out)
        if problem is None:
            return out
        print(f"[rlhf_tutorial] not reusing it: {problem}. Training a new one in its place.")
    train_tuned(world, out, smoke=smoke, **kwargs)
    return out


def build_tuned_main(argv: list[str]) -> dict:
    """``python -m rlhf_tutorial build-tuned --world tiny [--seed 0] [--out DIR]``: train the tiny world's
    tuned policy (about 30-60 s on one thread) and ship it in the package's artifacts
    (``tiny/artifacts/tuned_neg``, manifest rewritten), or write it to ``--out``. Its config records the
    sha256 of the base policy it was tuned from (after ``build-tiny``, run it again) and how it was built
    (:func:`rlhf_tutorial.buildinfo.build_info`). The same seed gives the same bytes on one machine; on
    other CPU kernels the weights differ and the evaluation lands within ``tiny.tuned.REBUILD_BANDS``."""
    from rlhf_tutorial.buildinfo import build_info
    from rlhf_tutorial.tiny.build import sha256, write_manifest
    from rlhf_tutorial.tiny.tuned import TUNED_NAME
    from rlhf_tutorial.worlds import tiny_dir

    p = argparse.ArgumentParser(prog="python -m rlhf_tutorial build-tuned",
                                description="train and ship the tiny world's tuned policy (chapter 05 reads it)")
    p.add_argument("--world", default="tiny", choices=["tiny"], help="only the tiny world ships a tuned policy")
    p.add_argument("--seed", type=int, default=0, help="seed of the RLHF run (default 0: the shipped one)")
    p.add_argument("--out", default=None, help="write here instead of the package's artifacts")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    ns = p.parse_args(argv)
    torch.set_num_threads(1)  # determinism and speed: the tiny matrices gain nothing from more threads
    start = time.perf_counter()
    base_dir = tiny_dir()
    folder = Path(ns.out) if ns.out else base_dir / TUNED_NAME
    info = build_info()
    stats = train_tuned("tiny", folder, seed=ns.seed, progress=not ns.no_progress,
                        base_policy_sha256=sha256(base_dir / "policy" / "model.safetensors"), build_info=info)
    if not ns.out:
        write_manifest(base_dir)
    return {"saved_to": str(folder), "seed": ns.seed, **stats,
            "policy_sha256": sha256(folder / "policy.safetensors"),
            "cpu_capability": info["torch_build"]["cpu_capability"], "kernel_env": info["kernel_env"],
            "size_bytes": sum(f.stat().st_size for f in folder.iterdir()),
            "wall_seconds": round(time.perf_counter() - start, 1)}


def load_pair(world: str | None = None, checkpoint: str | Path | None = None) -> tuple[HookedTransformer, TransformerWithValueHead]:
    """The base policy and the tuned one (with its value head). Tiny world: the shipped checkpoint
    unless ``checkpoint`` is given; GPT-2 world: ``checkpoint`` is required (``train-rlhf --save DIR``)."""
    from rlhf_tutorial.worlds import WorldUnavailable, load_policy, resolve_world

    world = resolve_world(world)
    if checkpoint is None:
        if world != "tiny":
            raise WorldUnavailable("The GPT-2 world ships no tuned policy: train one with `python -m rlhf_tutorial "
                                   "train-rlhf --world gpt2 --save DIR` and pass --checkpoint DIR.")
        from rlhf_tutorial.tiny.tuned import tuned_dir

        checkpoint = tuned_dir()
    if not (Path(checkpoint) / "policy.safetensors").exists():
        raise WorldUnavailable(f"no tuned policy in {checkpoint} (expected policy.safetensors and rlhf_config.json "
                               "from `train-rlhf --save`).")
    return load_policy(world).requires_grad_(False), load_tuned_policy(checkpoint).requires_grad_(False)


@torch.no_grad()
def analyse(base: HookedTransformer, tuned: TransformerWithValueHead, world: str, seed: int = 0,
            n_samples: int = 16, gen_len: int = 16, steer_coef: float = 4.0, prompts: list[str] | None = None) -> dict:
    """Every finding of the chapter, as numbers and records for the figures."""
    torch.manual_seed(seed)
    setup = sentiment_setup(base)
    direction = setup["direction"]
    tm = tuned.base_model
    tokens_list = interp.prompt_tokens(base, prompts or interp.PROMPTS)
    n_layers = base.cfg.n_layers

    # behaviour: the metric on every prompt, and the logit lens at the last token averaged over prompts
    lens_last, value_last = {}, {}
    for name, model in [("base", base), ("tuned", tm)]:
        rows, values = [], []
        for tokens in tokens_list:
            _, cache = model.run_with_cache(tokens)
            stack, labels = cache.accumulated_resid(return_labels=True, pos_slice=-1)  # [layer+1, 1, d]
            rows.append(interp.logit_lens_score(stack[:, 0], direction))
            values.append(interp.value_lens(stack[:, 0], tuned.value_head))  # the TUNED model's head reads both
        lens_last[name] = torch.stack(rows).mean(0)  # [layer+1]
        value_last[name] = torch.stack(values).mean(0)  # [layer+1]
    half = interp.first_layer_reaching(lens_last["tuned"].tolist(), 0.5)

    attr = {name: mean_attributions(model, tokens_list, direction) for name, model in [("base", base), ("tuned", tm)]}
    change = (attr["tuned"]["heads"] - attr["base"]["heads"])
    order = change.abs().flatten().argsort(descending=True)[:3].tolist()
    top_heads = [{"head": f"L{i // base.cfg.n_heads}H{i % base.cfg.n_heads}",
                  "change": round(float(change.flatten()[i]), 4)} for i in order]

    sweep = interp.patching_sweep(base, tm, tokens_list, direction)
    comps = list(interp.PATCH_COMPONENTS)
    writes = [comps.index("attn_out"), comps.index("mlp_out")]
    sub = sweep["by_component"][:, writes]
    best = int(sub.flatten().argmax())
    best_patch = {"layer": best // 2, "component": comps[writes[best % 2]], "restored": round(float(sub.flatten()[best]), 4)}

    # the activation-difference lens on unrelated text, at the middle of the network
    lens_layer = n_layers // 2
    hook = f"blocks.{lens_layer}.hook_resid_pre"
    texts = interp.NEUTRAL_TEXTS
    resid = {}
    for name, model in [("base", base), ("tuned", tm)]:
        tok = model.to_tokens(texts)  # padded on the right; the first positions are real tokens
        _, cache = model.run_with_cache(tok, names_filter=hook)
        resid[name] = cache[hook]
    delta = interp.activation_difference(resid["base"], resid["tuned"], n_positions=5)
    token_scores = delta @ base.W_U
    top = [(base.to_string(int(i)), round(float(token_scores[i]), 4)) for i in token_scores.topk(10).indices]
    bottom = [(base.to_string(int(i)), round(float(token_scores[i]), 4)) for i in (-token_scores).topk(10).indices]
    baseline = interp.word_rank_baseline(delta, base.W_U, setup["pos_ids"], setup["neg_ids"], seed=seed)
    per_text = []  # the same gap from each unrelated text alone: is the average's sign the texts' common one?
    for i in range(len(texts)):
        ranks = interp.vocab_ranks(interp.activation_difference(resid["base"][i:i + 1], resid["tuned"][i:i + 1], 5), base.W_U)
        per_text.append(float(ranks[setup["pos_ids"]].mean() - ranks[setup["neg_ids"]].mean()))
    delta_sentiment = {"cosine_with_direction": round(float(torch.cosine_similarity(delta, direction, dim=0)), 4),
                       **{k: round(v, 4) for k, v in baseline.items()},
                       "gap_per_text": [round(g, 4) for g in per_text],
                       "gap_per_text_min": round(min(per_text), 4), "gap_per_text_max": round(max(per_text), 4)}
    reward_fn = sentiment_reward_fn(world, "neg")
    with torch.random.fork_rng(devices=rng_devices(device_of(tm))):
        torch.manual_seed(seed + 1)
        tuned_reward = float(reward_fn(get_samples(tm, interp.PROMPTS[0], n_samples, gen_len)[1]).mean())
    steer = {c: steered_samples(base, delta, lens_layer, c, reward_fn, n_samples, gen_len, seed + 1) for c in (0.0, steer_coef)}

    base_params = dict(base.named_parameters())
    tuned_params = dict(tm.named_parameters())
    changes = interp.param_change(base_params, tuned_params)
    # zero in the base model (b_V: folded into b_O when the model was processed), trained from 0 by PPO:
    # a relative change means nothing there
    zero_in_base = sorted(k for k, v in base_params.items() if float(v.norm()) == 0.0)
    changes = {k: v for k, v in changes.items() if k not in zero_in_base}
    bf16 = {k: v.bfloat16() for k, v in base_params.items()}, {k: v.bfloat16() for k, v in tuned_params.items()}
    fraction = {"fp32": interp.fraction_changed(base_params, tuned_params),
                "bf16": interp.fraction_changed(*bf16)}

    records = lens_records(base, tuned, direction, [interp.PROMPTS[0] + " " + w for w in ("bad.", "good.")]
                           + [t for t, _ in steer[0.0][:2]])
    return {
        "setup": setup, "labels": labels, "lens_last": lens_last, "value_last": value_last, "tuned_reward": tuned_reward, "half_layer": half, "attr": attr,
        "top_heads": top_heads, "sweep": sweep, "best_patch": best_patch, "delta": delta, "top": top,
        "bottom": bottom, "delta_sentiment": delta_sentiment, "steer": steer, "steer_coef": steer_coef, "lens_layer": lens_layer,
        "changes": changes, "zero_in_base": zero_in_base, "fraction": fraction, "records": records,
        "n_pos": min(t.shape[1] for t in tokens_list),
    }


def summarise(found: dict, world: str, seed: int) -> dict[str, Any]:
    """The JSON summary of a run (rounded numbers, no tensors)."""
    sweep, lens = found["sweep"], found["lens_last"]
    mean = lambda rows: round(sum(r for _, r in rows) / len(rows), 4)  # noqa: E731
    return {
        "world": world,
        "seed": seed,
        "n_prompts": len(sweep["base"]),
        "sentiment_words": {"positive": len(found["setup"]["pos_words"]), "negative": len(found["setup"]["neg_words"])},
        "logit_diff_base": round(float(sweep["base"].mean()), 4),
        "logit_diff_tuned": round(float(sweep["tuned"].mean()), 4),
        "logit_lens_tuned": [round(v, 4) for v in lens["tuned"].tolist()],
        "logit_lens_half_layer": found["labels"][found["half_layer"]],
        "value_final": {name: round(float(v[-1]), 4) for name, v in found["value_last"].items()},
        "tuned_reward_prompt0": round(found["tuned_reward"], 4),
        "top_heads_by_change": found["top_heads"],
        "attribution_closure_error": round(max(closure_error(a) for a in found["attr"].values()), 7),
        "best_single_layer_patch": found["best_patch"],
        "final_resid_patch_restored": round(float(sweep["by_component"][-1, -1]), 4),
        "top_activation_difference_tokens": [t for t, _ in found["top"][:5]],
        "activation_difference_sentiment": found["delta_sentiment"],
        "steering_reward": {"coef": found["steer_coef"], "before": mean(found["steer"][0.0]),
                            "after": mean(found["steer"][found["steer_coef"]])},
        "fraction_changed_fp32": round(found["fraction"]["fp32"], 4),
        "fraction_changed_bf16": round(found["fraction"]["bf16"], 4),
        "largest_param_change": max(found["changes"], key=found["changes"].get),
        "params_zero_in_base": found["zero_in_base"],
    }


def write_report(path: str | Path, found: dict, summary: dict) -> Path:
    """A self-contained HTML report: the summary, then one figure per section of the chapter."""
    from rlhf_tutorial.widgets import interp as w

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n_pos = found["n_pos"]
    figures = [
        ("Logit lens and value lens", [w.lens_figure(found["records"], "logit"), w.lens_figure(found["records"], "value")]),
        ("Direct logit attribution", [w.attribution_figure(found["attr"]["base"], found["attr"]["tuned"])]),
        ("Activation patching", [w.patching_figure(found["sweep"], list(interp.PATCH_COMPONENTS),
                                                   [str(p - n_pos) for p in range(n_pos)])]),
        ("How much the weights moved", [w.param_change_figure(found["changes"], found["fraction"])]),
    ]
    title = f"What RLHF changed inside the model: {summary['world']} world, seed {summary['seed']}"
    parts = [f"<h1 style='font-family:sans-serif'>{html.escape(title)}</h1>",
             "<pre>" + html.escape(json.dumps(summary, indent=1)) + "</pre>"]
    first = True
    for heading, figs in figures:
        parts.append(f"<h2 style='font-family:sans-serif'>{html.escape(heading)}</h2>")
        for fig in figs:
            parts.append(fig.to_html(full_html=False, include_plotlyjs=first))
            first = False
    parts.append("<h2 style='font-family:sans-serif'>The activation-difference lens</h2>")
    parts.append(w.steering_view(found["top"], found["bottom"], found["steer"][0.0],
                                 found["steer"][found["steer_coef"]], found["steer_coef"]).html)
    path.write_text("<html><head><meta charset='utf-8'><title>" + html.escape(title) + "</title></head><body>"
                    + "".join(parts) + "</body></html>")
    return path


def main(argv: list[str]) -> dict:
    """``python -m rlhf_tutorial interp-report [--world tiny] [--checkpoint DIR] [--seed 0] [--out PATH]``"""
    from rlhf_tutorial.worlds import resolve_world

    p = argparse.ArgumentParser(prog="python -m rlhf_tutorial interp-report", description=__doc__.split("\n")[0])
    p.add_argument("--world", default=None, help="tiny or gpt2 (default: $RLHF_TUTORIAL_WORLD, else automatic)")
    p.add_argument("--checkpoint", default=None, help="a tuned policy saved by `train-rlhf --save DIR` "
                   "(default in the tiny world: the shipped one)")
    p.add_argument("--seed", type=int, default=0, help="seeds the sampling (steering)")
    p.add_argument("--out", default="reports/interp.html", help="where to write the HTML report")
    p.add_argument("--samples", type=int, default=32, help="samples before and after steering")
    p.add_argument("--steer-coef", type=float, default=4.0, help="multiple of the lens added when steering")
    p.add_argument("--smoke", action="store_true", help="two prompts and 4 samples: a quick check of the code path")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: the same numbers on every run)")
    ns = p.parse_args(argv)
    torch.set_num_threads(ns.threads)
    start = time.perf_counter()
    world = resolve_world(ns.world)
    base, tuned = load_pair(world, ns.checkpoint)
    found = analyse(base, tuned, world, ns.seed, n_samples=4 if ns.smoke else ns.samples, steer_coef=ns.steer_coef,
                    prompts=interp.PROMPTS[:2] if ns.smoke else None)
    summary = summarise(found, world, ns.seed)
    summary["report"] = str(write_report(ns.out, found, summary))
    summary["wall_seconds"] = round(time.perf_counter() - start, 1)
    return summary
