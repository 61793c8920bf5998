"""Peak memory of one RLHF phase (rollout + learning) for a GPT-2-sized model.

``python -m rlhf_tutorial bench-memory`` builds a randomly initialised model with GPT-2's shape (12
layers, d_model 768, 12 heads, d_mlp 3072, vocab 50257; random weights change nothing about memory),
a reference copy, and runs one phase of ``RLHFTrainer`` at batch 64, gen_len 30 in a **fresh
subprocess** per measurement, so that the process's peak resident set (``ru_maxrss``) belongs to that
phase alone. The model goes on the course's device (``devices.course_device``; ``--device`` of the
command line sets it, and the subprocesses inherit it); on a GPU it reports
``torch.cuda.max_memory_allocated`` instead.

Two measurements:

* ``chunked``: the trainer as written: the rollout's forward passes run one minibatch of rows at a
  time and keep only log-probs and values; the full KL recomputes reference logits per minibatch;
* ``full_batch_logits``: the same phase, but holding the policy's and the reference's logits for the
  whole batch (``[batch, seq, vocab]`` each) from the rollout through the learning phase, as a
  replay memory that stores reference logits does.

The difference is what the memory rule saves. The reward is a cheap stand-in (the classifier's cost
is not what is measured) and the tokenizer a word-level one with 50257 entries (no download).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

GPT2_SHAPE = dict(n_layers=12, d_model=768, n_heads=12, d_head=64, d_mlp=3072, n_ctx=1024, d_vocab=50257,
                  act_fn="gelu_new", normalization_type="LN")


def word_level_tokenizer(vocab_size: int, folder: str):
    """A word-level tokenizer with ``vocab_size`` entries (the prompt's words among them), saved to
    ``folder`` and loaded from there (TransformerLens reloads a tokenizer by its path)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    special = "<|endoftext|>"
    vocab = {special: 0, "This": 1}
    # As GPT-2's tokens, a word after the first carries its leading space, so that a completion decodes to
    # " w5 w8" and the prompt's text plus it tokenizes back to the same ids (the DPO race needs that)
    for word in "movie was really good bad great awful".split():
        vocab[f" {word}"] = len(vocab)
    for i in range(vocab_size - len(vocab)):
        vocab[f" w{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=special))
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_next")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=special, eos_token=special, pad_token=special,
                                   unk_token=special)
    fast.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def gpt2_sized_policy(folder: str, device: Any = "cpu", seed: int = 0, **shape: Any):
    """A randomly initialised ``HookedTransformer`` of GPT-2 small's shape (``GPT2_SHAPE``, entries
    overridden by ``shape``) with ``word_level_tokenizer`` saved to ``folder``: for time and memory."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    config = {**GPT2_SHAPE, **shape}
    tokenizer = word_level_tokenizer(config["d_vocab"], folder)
    return HookedTransformer(HookedTransformerConfig(**config, seed=seed, device=str(device)), tokenizer=tokenizer)


def even_word_share(texts: list[str]) -> torch.Tensor:
    """A cheap stand-in reward for random-weight models: the share of each text's words that are even-numbered
    vocabulary words (``w0``, ``w2``, ...), in [0, 1]."""
    return torch.tensor([sum(w[1:].isdigit() and int(w[1:]) % 2 == 0 for w in t.split()) / max(len(t.split()), 1)
                         for t in texts])


def _peak_mb(device: torch.device) -> float:
    from rlhf_tutorial.trainers.runtime import peak_memory_mb

    return peak_memory_mb(device)


def run_child(config: dict[str, Any]) -> dict[str, Any]:
    """One phase in this process; returns peak memory after set-up and after the phase."""
    import copy

    from rlhf_tutorial import rlhf
    from rlhf_tutorial.devices import course_device
    from rlhf_tutorial.trainers.rlhf import RLHFArgs, RLHFTrainer

    torch.set_num_threads(config["threads"])
    device = course_device()
    with tempfile.TemporaryDirectory() as folder:
        policy = gpt2_sized_policy(folder, device, **{k: config[k] for k in GPT2_SHAPE})
    ref = copy.deepcopy(policy)
    reward_fn = even_word_share  # a cheap stand-in: the share of even-numbered words

    args = RLHFArgs(batch_size=config["batch_size"], gen_len=config["gen_len"], num_minibatches=config["num_minibatches"],
                         update_epochs=1, num_phases=1, warmup_steps=0, kl_estimator=config["kl_estimator"],
                         advantage_estimator="one_step", early_stopping=False,
                         fast=False)  # the phase as the notebook runs it (the learner's get_samples and value head)
    trainer = RLHFTrainer(args, policy, ref, reward_fn)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    setup_mb = _peak_mb(device)
    start = time.perf_counter()
    memory = rlhf.rollout_phase(trainer)
    held = None
    if config["mode"] == "full_batch_logits":
        with torch.no_grad():
            held = (trainer.model(memory.tokens)[0], trainer.ref_model(memory.tokens))  # 2 x [batch, seq, vocab]
    rollout_mb = _peak_mb(device)
    stats = rlhf.learning_phase(trainer, memory)
    del held
    return {
        "mode": config["mode"],
        "device": str(device),
        "setup_peak_mb": round(setup_mb, 1),
        "after_rollout_peak_mb": round(rollout_mb, 1),
        "phase_peak_mb": round(_peak_mb(device), 1),
        "phase_seconds": round(time.perf_counter() - start, 1),
        "n_params": sum(p.numel() for p in trainer.model.parameters()),
        "objective": stats["objective"],
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rlhf_tutorial bench-memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--gen-len", type=int, default=30)
    parser.add_argument("--num-minibatches", type=int, default=4)
    parser.add_argument("--kl-estimator", default="full", help="'full' (reference logits per minibatch) or 'k3'")
    parser.add_argument("--modes", default="chunked,full_batch_logits", help="comma-separated: chunked, full_batch_logits")
    parser.add_argument("--n-layers", type=int, default=GPT2_SHAPE["n_layers"])
    parser.add_argument("--d-model", type=int, default=GPT2_SHAPE["d_model"])
    parser.add_argument("--d-vocab", type=int, default=GPT2_SHAPE["d_vocab"])
    parser.add_argument("--threads", type=int, default=2)
    return parser


def main(argv: list[str]) -> dict:
    """Run each mode in its own subprocess and collect the peaks."""
    ns = _parser().parse_args(argv)
    shape = dict(GPT2_SHAPE, n_layers=ns.n_layers, d_model=ns.d_model, d_vocab=ns.d_vocab,
                 d_head=ns.d_model // GPT2_SHAPE["n_heads"], d_mlp=4 * ns.d_model)
    results = {}
    for mode in ns.modes.split(","):
        config = dict(shape, mode=mode, batch_size=ns.batch_size, gen_len=ns.gen_len, num_minibatches=ns.num_minibatches,
                      kl_estimator=ns.kl_estimator, threads=ns.threads)
        code = f"import json; from rlhf_tutorial.trainers.bench import run_child; print(json.dumps(run_child({config!r})))"
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
        if proc.returncode != 0:
            raise RuntimeError(f"bench child ({mode}) failed:\n{proc.stderr[-3000:]}")
        results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    summary: dict[str, Any] = {
        "model": {k: shape[k] for k in ("n_layers", "d_model", "d_vocab")},
        "batch_size": ns.batch_size,
        "gen_len": ns.gen_len,
        "minibatch_size": ns.batch_size // ns.num_minibatches,
        "kl_estimator": ns.kl_estimator,
        "threads": ns.threads,
        **results,
    }
    if "chunked" in results and "full_batch_logits" in results:
        summary["saved_mb"] = round(results["full_batch_logits"]["phase_peak_mb"] - results["chunked"]["phase_peak_mb"], 1)
    summary["full_batch_logits_tensor_mb"] = round(
        ns.batch_size * (ns.gen_len + 5) * ns.d_vocab * 4 / 2**20, 1)  # one [batch, seq, vocab] float32 tensor
    return summary
