"""Rebuilding the tiny world's tuned policy (``build-tuned``), on any CPU.

On one machine the seeded run is byte-identical from run to run. Across CPUs it is not (each CPU's kernels
round differently and 50 RL phases amplify it), so a rebuild is compared with the shipped policy by what it
does: its evaluation's reward and KL fall within ``tiny.tuned.REBUILD_BANDS``, measured across kernel
levels. A second kernel level runs here too (``ATEN_CPU_CAPABILITY``, in a subprocess): what another CPU
would compute. Digests, never megabytes, are compared.
"""

from __future__ import annotations

import json
import os
import platform

import pytest
import torch

from rlhf_tutorial.devices import ENV_VAR
from rlhf_tutorial.tiny import tuned
from rlhf_tutorial.tiny.build import sha256
from rlhf_tutorial.worlds import tiny_dir

#: The shipped policy and the bands are CPU builds: every rebuild here runs on the CPU, whatever the course's
#: device (left out of make unit-simgpu and make test-gpu, where it would only repeat the CPU's run).
pytestmark = pytest.mark.cpu_only

#: One rebuild takes about 45 s on an idle core (80 s on a busy 2-core machine); a test runs at most two.
REBUILD_TIMEOUT_S = 480


@pytest.fixture(scope="module")
def native_rebuild(tmp_path_factory) -> dict:
    """``build-tuned`` in this process, on this CPU's own kernels: its JSON summary."""
    from rlhf_tutorial.trainers.interp_report import build_tuned_main

    out = tmp_path_factory.mktemp("rebuild") / "tuned"
    saved = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = "cpu"
    try:
        return build_tuned_main(["--out", str(out), "--no-progress"])
    finally:
        if saved is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = saved


def shipped_digest() -> str:
    return sha256(tiny_dir() / tuned.TUNED_NAME / "policy.safetensors")


@pytest.mark.slow
@pytest.mark.timeout(REBUILD_TIMEOUT_S)
def test_a_rebuild_does_what_the_shipped_policy_does(native_rebuild):
    """Within the bands every measured CPU landed in (the same bytes as the shipped file only on a CPU with
    the shipping machine's kernels: the message says which it is)."""
    same = native_rebuild["policy_sha256"] == shipped_digest()
    where = (f"rebuilt on {native_rebuild['cpu_capability']} kernels: sha256 {native_rebuild['policy_sha256']}, "
             f"shipped {shipped_digest()} ({'identical' if same else 'other kernels: compared by behaviour'})")
    assert native_rebuild["mean_reward_final"] > native_rebuild["mean_reward_initial"], where
    assert tuned.band_problems(native_rebuild) == [], where


@pytest.mark.slow
@pytest.mark.timeout(REBUILD_TIMEOUT_S)
def test_two_rebuilds_on_one_machine_are_byte_identical(native_rebuild, tmp_path):
    """The second run in a fresh process (nothing carried over from this one): the same digest."""
    again = tuned.rebuild_in_subprocess(tmp_path / "again", {}, timeout=REBUILD_TIMEOUT_S)
    assert again["cpu_capability"] == native_rebuild["cpu_capability"]
    assert again["policy_sha256"] == native_rebuild["policy_sha256"], (
        f"two seeded rebuilds differ: sha256 {again['policy_sha256']} vs {native_rebuild['policy_sha256']}")
    assert (again["mean_reward_final"], again["kl_final"]) == (native_rebuild["mean_reward_final"],
                                                               native_rebuild["kl_final"])


@pytest.mark.slow
@pytest.mark.timeout(REBUILD_TIMEOUT_S)
def test_a_rebuild_on_a_second_kernel_level_lands_in_the_bands(tmp_path):
    """What a CPU with other kernels computes (AVX2 here when this CPU runs AVX-512, none on an AVX2 CPU):
    torch reports the forced level, and the run lands within the bands."""
    native = torch.backends.cpu.get_cpu_capability()
    setting = tuned.other_kernel_setting(native)
    if setting is None:
        pytest.skip(f"no lower x86 kernel level to force below {native} on {platform.machine()}")
    env = tuned.KERNEL_SETTINGS[setting]
    other = tuned.rebuild_in_subprocess(tmp_path / setting, env, timeout=REBUILD_TIMEOUT_S)
    assert other["cpu_capability"] == env["ATEN_CPU_CAPABILITY"].upper() != native
    assert env.items() <= other["kernel_env"].items()  # with whatever kernel settings this run inherited
    assert tuned.band_problems(other) == [], f"on {setting} kernels ({other['policy_sha256']})"


def test_the_shipped_policy_is_within_the_bands():
    """The shipped build is one of the runs the bands were measured from."""
    config = json.loads((tiny_dir() / tuned.TUNED_NAME / "rlhf_config.json").read_text())
    assert tuned.band_problems(config) == []


def test_the_band_check_names_what_is_out():
    low, high = tuned.REBUILD_BANDS["kl_final"]
    reward = sum(tuned.REBUILD_BANDS["mean_reward_final"]) / 2
    assert tuned.band_problems({"mean_reward_final": reward, "kl_final": (low + high) / 2}) == []
    problems = tuned.band_problems({"mean_reward_final": reward, "kl_final": high + 0.01})
    assert len(problems) == 1 and problems[0].startswith("kl_final")
    assert tuned.other_kernel_setting("AVX512") == "avx2" and tuned.other_kernel_setting("AVX2") == "default"
    assert tuned.other_kernel_setting("DEFAULT") is None
