"""scale-trl: TRL launched by accelerate with 2 data-parallel processes on this CPU (gloo), smoke-sized.

The evidence is read from the files the processes wrote, not from what they report: every process's
final weights equal every other's, tensor for tensor, although each sampled and trained on its own
rows (different data digests), and the weights moved away from the exported policy. The trained
folder then loads back into a HookedTransformer with the same logits as the transformers model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl", reason="the `trl` extra is not installed (make test installs it)")
pytest.importorskip("accelerate", reason="the `trl` extra is not installed (make test installs it)")

from safetensors.torch import load_file, save_file  # noqa: E402

from rlhf_tutorial.trainers import scale_trl  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*argv: str) -> tuple[dict, float]:
    """The command as a learner runs it; its last-line summary and its wall time."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "rlhf_tutorial", "scale-trl", *argv], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "error" not in summary, summary["error"]
    return summary, seconds


def expect_processes_device(summary: dict, n: int) -> None:
    """The processes ran where a learner expects: one per GPU (nccl) when there are ``n`` GPUs on a GPU
    run, else on the CPU over gloo, which a GPU run with fewer GPUs says in ``device_note``."""
    from rlhf_tutorial.devices import course_device

    on_gpu = course_device().type == "cuda"
    if on_gpu and torch.cuda.device_count() >= n:
        assert (summary["processes_device"], summary["backend"]) == ("cuda", "nccl")
        return
    assert summary["processes_device"] == "cpu"
    assert (summary["distributed_type"], summary["backend"]) == ("MULTI_CPU", "gloo")
    assert ("device_note" in summary) == on_gpu


def test_fewer_gpus_than_processes_run_on_the_cpu_and_say_so():
    """A learner's one GPU and the default 2 processes: the processes run on the CPU (gloo), with a note;
    enough GPUs: one process each; no GPU (or the simulated one): the CPU, nothing to explain."""
    cuda = torch.device("cuda")
    use_cpu, note = scale_trl.processes_device(cuda, 2, 1)
    assert use_cpu and "2 processes need 2 GPUs and torch sees 1" in note and "CPU (gloo)" in note
    assert scale_trl.processes_device(cuda, 2, 2) == (False, None)
    assert scale_trl.processes_device(cuda, 1, 1) == (False, None)
    assert scale_trl.processes_device(torch.device("cpu"), 2, 0) == (True, None)
    assert scale_trl.processes_device(torch.device("meta"), 2, 0) == (True, None)  # any device but CUDA: the CPU


def assert_processes_trained_the_same_weights(out: Path, n: int) -> dict[str, torch.Tensor]:
    states = [load_file(str(out / f"rank{r}.safetensors")) for r in range(n)]
    for rank, state in enumerate(states[1:], start=1):
        assert state.keys() == states[0].keys()
        for name, value in state.items():
            assert torch.equal(value, states[0][name]), f"process {rank} holds another {name} than process 0"
    exported = load_file(str(out / "policy" / "model.safetensors"))
    moved = [k for k in exported if not torch.equal(exported[k], states[0][k])]
    assert "lm_head.bias" in moved and any(".attn.c_attn." in k for k in moved), "training moved no weight"
    assert not any(".ln_" in k for k in moved), "the LayerNorms (the identity) must stay frozen"
    return states[0]


def assert_loads_back_into_a_hooked_transformer(out: Path, trained: dict[str, torch.Tensor]) -> None:
    from transformer_lens import HookedTransformer

    from rlhf_tutorial.trainers.export import load_hf_policy, max_logit_diff, tl_from_hf
    from rlhf_tutorial.worlds import PROMPT, load_policy

    base = load_policy("tiny", device="cpu")
    model, _ = load_hf_policy(out / scale_trl.TRAINED_DIR)
    for name, value in model.state_dict().items():  # what rank 0 saved is what the processes trained
        if name in trained:
            assert torch.equal(value, trained[name]), name
    policy = tl_from_hf(model, base)
    assert isinstance(policy, HookedTransformer)
    tokens = base.to_tokens(PROMPT).expand(3, -1)
    torch.manual_seed(0)
    with torch.no_grad():
        tokens = base.generate(tokens, max_new_tokens=12, verbose=False, stop_at_eos=False)
        assert max_logit_diff(policy, model, tokens) < 1e-4
        assert (policy(tokens) - base(tokens)).abs().max() > 1e-3  # the trained policy, not the base one


@pytest.mark.timeout(240)
def test_grpo_with_two_processes_trains_identical_weights(tmp_path):
    out = tmp_path / "run"
    summary, seconds = run_cli("--world", "tiny", "--num-processes", "2", "--algo", "grpo", "--smoke",
                               "--out", str(out))
    print(f"scale-trl --algo grpo --smoke: {seconds:.1f} s")
    assert summary["num_processes"] == 2
    expect_processes_device(summary, 2)
    smoke = scale_trl.SMOKE["grpo"]
    rows = smoke["groups_per_phase"] * smoke["group_size"]
    assert summary["samples_per_phase"] == rows and summary["samples_per_phase_per_process"] == [rows // 2] * 2
    assert summary["phases"] == smoke["num_phases"] and len(summary["sampled_reward_per_phase"]) == smoke["num_phases"]
    assert summary["optimizer_steps"] == smoke["num_phases"] * smoke["num_minibatches"] * 2  # update_epochs
    assert 0.0 <= summary["reward_before"] <= 1.0 and 0.0 <= summary["reward_after"] <= 1.0
    assert len(summary["peak_memory_mb_per_process"]) == 2 and all(m > 0 for m in summary["peak_memory_mb_per_process"])
    # each process sampled its own completions (seed + rank), so equal weights mean all-reduced gradients
    assert len(set(summary["data_sha256_per_process"])) == 2 and summary["different_data_per_process"]
    assert summary["identical_weights"] and summary["max_abs_weight_diff_across_processes"] == 0.0
    assert summary["weights_changed"] and summary["round_trip_max_abs_logit_diff"] < 1e-4
    trained = assert_processes_trained_the_same_weights(out, 2)
    assert_loads_back_into_a_hooked_transformer(out, trained)


@pytest.mark.timeout(240)
def test_dpo_with_two_processes_trains_identical_weights(tmp_path):
    out = tmp_path / "run"
    summary = scale_trl.main(["--num-processes", "2", "--algo", "dpo", "--smoke", "--out", str(out)])
    assert "error" not in summary, summary["error"]
    assert summary["num_processes"] == 2
    expect_processes_device(summary, 2)
    smoke = scale_trl.SMOKE["dpo"]
    assert summary["phases"] == smoke["rounds"]
    # a step takes batch_size pairs, half from each process; a pass covers every pair (the last batch
    # padded by repeating pairs when they do not divide evenly)
    per_pass = summary["samples_per_phase"]
    assert summary["pairs"] <= per_pass < summary["pairs"] + smoke["batch_size"]
    assert summary["samples_per_phase_per_process"] == [per_pass // 2] * 2
    assert summary["different_data_per_process"] and summary["identical_weights"]
    trained = assert_processes_trained_the_same_weights(out, 2)
    assert_loads_back_into_a_hooked_transformer(out, trained)


def test_the_weight_comparison_sees_a_difference(tmp_path):
    """compare_processes reads the files: one changed element in one process's weights is caught."""
    state = {"a": torch.randn(3, 4), "b": torch.randn(5)}
    save_file(state, str(tmp_path / "rank0.safetensors"))
    save_file({k: v.clone() for k, v in state.items()}, str(tmp_path / "rank1.safetensors"))
    same = scale_trl.compare_processes(tmp_path, 2)
    assert same["identical_weights"] and same["max_abs_weight_diff_across_processes"] == 0.0
    other = {k: v.clone() for k, v in state.items()}
    other["b"][2] += 1e-6
    save_file(other, str(tmp_path / "rank1.safetensors"))
    differ = scale_trl.compare_processes(tmp_path, 2)
    assert not differ["identical_weights"] and 0 < differ["max_abs_weight_diff_across_processes"] < 1e-5
    assert scale_trl.weights_sha256(state) != scale_trl.weights_sha256(other)


def test_batches_are_shared_between_processes(tmp_path):
    """The mapping keeps a phase's rows and a step's rows whatever the number of processes."""
    from rlhf_tutorial.trainers import bench_trl, bench_trl_dpo, dpo, grpo

    args = grpo.GRPOArgs.preset("tiny")
    rows = args.groups_per_phase * args.group_size
    for n in (1, 2, 4):
        config = bench_trl.trl_config(args, seed=0, out=str(tmp_path), num_processes=n)
        assert config.per_device_train_batch_size * n * config.steps_per_generation == rows
    with pytest.raises(ValueError, match="3 processes"):
        bench_trl.trl_config(args, seed=0, out=str(tmp_path), num_processes=3)
    dargs = dpo.DPOArgs.preset("tiny")
    config = bench_trl_dpo.trl_config(dargs, 0, str(tmp_path), max_prompt_tokens=5, num_processes=2)
    assert config.per_device_train_batch_size * 2 == dargs.batch_size


def test_a_missing_trl_or_accelerate_is_explained(monkeypatch):
    monkeypatch.setattr(scale_trl, "_importable", lambda name: name != "accelerate")
    summary = scale_trl.main(["--num-processes", "2"])
    assert "accelerate not installed" in summary["error"] and "rlhf-tutorial[trl]" in summary["error"]


def test_bad_arguments_are_explained():
    assert "--algo" in scale_trl.main(["--algo", "ppo"])["error"]
    assert "--num-processes" in scale_trl.main(["--num-processes", "0"])["error"]
