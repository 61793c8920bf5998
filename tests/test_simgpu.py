"""The simulated GPU (rlhf_tutorial/simgpu.py), the CPU-side guard against mixed-device bugs: it raises
where CUDA raises, allows what CUDA allows, computes what the CPU computes, and catches the bugs that
broke the course on GPUs (a reference solution's fix undone: the guard fails).

Each case runs in a fresh subprocess with ``RLHF_TUTORIAL_DEVICE=simgpu`` (the simulation changes
process-wide state, so this test process stays a plain CPU one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.cpu_only  # it starts its own simulated GPU


def run_simgpu(code: str) -> dict:
    """Run ``code`` (which fills a dict ``out``) under the simulated GPU; return ``out``."""
    script = "import json, torch\nimport rlhf_tutorial\nout = {}\n" + textwrap.dedent(code) + "\nprint(json.dumps(out))"
    env = {**os.environ, "RLHF_TUTORIAL_DEVICE": "simgpu", "RLHF_TUTORIAL_WORLD": "tiny", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_it_raises_where_cuda_raises_and_allows_what_cuda_allows():
    out = run_simgpu("""
        from rlhf_tutorial.devices import course_device
        dev = course_device()
        out["device"] = str(dev)
        x = torch.randn(2, 4, device=dev)
        lin = torch.nn.Linear(4, 3).to(dev)

        def outcome(fn):
            try:
                fn()
                return "ok"
            except (RuntimeError, TypeError) as exc:
                return str(exc)[:120]

        out["linear_cpu_input"] = outcome(lambda: lin(torch.randn(2, 4)))
        out["cat"] = outcome(lambda: torch.cat([x, torch.zeros(1, 4)]))
        out["embedding"] = outcome(lambda: torch.nn.Embedding(5, 2)(torch.tensor([1], device=dev)))
        out["equal"] = outcome(lambda: torch.equal(x, x.cpu()))
        out["gpu_scalar_with_cpu"] = outcome(lambda: torch.ones(3) + torch.tensor(1.0, device=dev))
        out["cpu_generator"] = outcome(lambda: torch.randn(3, device=dev, generator=torch.Generator().manual_seed(0)))
        out["numpy"] = outcome(lambda: x.numpy())
        out["gpu_index_of_cpu"] = outcome(lambda: torch.zeros(4)[torch.tensor([1], device=dev)])
        # allowed on CUDA: a CPU scalar tensor, CPU indices, copies and moves, a generator of the device
        out["cpu_scalar"] = outcome(lambda: x * torch.tensor(2.0))
        out["cpu_index"] = outcome(lambda: (x[torch.tensor([1])], x[[0, 1]], x[:, [0, 2]], x[0, [1]]))
        out["moves"] = outcome(lambda: (x.cpu().numpy(), torch.zeros(2).to(x), x.to("cpu").tolist(), x.tolist()))
        out["copy"] = outcome(lambda: x.copy_(torch.zeros(2, 4)))
        out["device_generator"] = outcome(lambda: torch.randn(3, device=dev, generator=torch.Generator(device=dev)))
        out["result_devices"] = [str((x * torch.tensor(2.0)).device), str(x.cpu().device), str(lin(x).device)]
        # what torch's own composite ops and Python entry points do with such tensors
        v, W = torch.randn(4, device=dev), torch.randn(4, 3, device=dev)
        out["shapes"] = [list((v @ W).shape), list((W.T @ v).shape), list(x[:, []].shape), list(x[:, [0, 3]].shape)]
        out["format"] = f"{torch.tensor(1.25, device=dev):.1f}"
        out["tensor_of_scalars"] = str(torch.tensor([v[0], v[1]]).device)
    """)
    assert out["device"] == "simgpu:0"
    for case in ("linear_cpu_input", "cat", "embedding", "equal", "gpu_scalar_with_cpu"):
        assert out[case].startswith("Expected all tensors to be on the same device"), (case, out[case])
    assert "generator" in out["cpu_generator"]
    assert "Use Tensor.cpu()" in out["numpy"]
    assert "indices should be either on cpu" in out["gpu_index_of_cpu"]
    for case in ("cpu_scalar", "cpu_index", "moves", "copy", "device_generator"):
        assert out[case] == "ok", (case, out[case])
    assert out["result_devices"] == ["simgpu:0", "cpu", "simgpu:0"]
    assert out["shapes"] == [[3], [3], [2, 0], [2, 2]]
    assert out["format"] == "1.2" and out["tensor_of_scalars"] == "cpu"


def test_it_computes_what_the_cpu_computes_gradients_and_optimizer_steps_included():
    out = run_simgpu("""
        from rlhf_tutorial.devices import course_device

        def train(device):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(device)
            opt = torch.optim.Adam(model.parameters(), lr=0.1)
            x = torch.linspace(-1, 1, 12).reshape(3, 4).to(device)
            for _ in range(3):
                loss = (model(x) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            return [p.detach().cpu().tolist() for p in model.parameters()], str(next(model.parameters()).device)

        cpu, _ = train("cpu")
        sim, where = train(course_device())
        out["same"] = cpu == sim
        out["where"] = where
    """)
    assert out["where"] == "simgpu:0"
    assert out["same"], "the simulated GPU computes on the CPU: the same seed must give the same weights"


def test_a_vector_through_linear_and_matmul_keeps_the_shape_the_cpu_gives():
    # torch squeezes a vector's product in place, which a wrapper tensor cannot do: the simulation
    # writes those calls itself (a LoRA applied to one d_in vector failed a correct learner's version)
    out = run_simgpu("""
        import torch.nn.functional as F
        from rlhf_tutorial.devices import course_device
        dev = course_device()
        x, w, b = torch.randn(4), torch.randn(5, 4), torch.randn(5)
        calls = {
            "linear": lambda x, w, b: F.linear(x, w),
            "linear_bias": lambda x, w, b: F.linear(x, w, b),
            "linear_twice": lambda x, w, b: F.linear(F.linear(x, w), w.T),
            "matmul": lambda x, w, b: w @ x,
            "vecmat": lambda x, w, b: torch.matmul(x, w.T),
        }
        for name, call in calls.items():
            cpu = call(x, w, b)
            xs, ws, bs = (t.to(dev).requires_grad_() for t in (x, w, b))
            sim = call(xs, ws, bs)
            sim.sum().backward()
            out[name] = [list(cpu.shape), list(sim.shape), torch.allclose(cpu, sim.cpu()), list(xs.grad.shape)]
    """)
    for name, (cpu_shape, sim_shape, same, grad_shape) in out.items():
        assert sim_shape == cpu_shape and same, (name, cpu_shape, sim_shape)
        assert grad_shape == [4], (name, grad_shape)


def test_a_module_converted_to_another_dtype_computes_in_it():
    # Module.to(dtype) sets each parameter's .data: the wrapped CPU tensor must follow the wrapper (a bfloat16
    # sampler copy of the policy, chapter 04, computed with float32 weights and failed on the simulated GPU)
    out = run_simgpu("""
        import copy
        from rlhf_tutorial.devices import course_device
        dev = course_device()
        lin = torch.nn.Linear(4, 3).to(dev)
        x = torch.randn(2, 4).to(dev)
        for name, convert in {"bfloat16": lambda m: m.to(torch.bfloat16), "double": lambda m: m.double()}.items():
            m = convert(copy.deepcopy(lin))
            y = m(x.to(m.weight.dtype))
            cpu = convert(copy.deepcopy(lin).cpu())(x.cpu().to(m.weight.dtype))
            out[name] = [str(m.weight.dtype), str(y.dtype), str(y.device), torch.equal(y.cpu(), cpu)]
        out["original"] = str(lin.weight.dtype)
    """)
    assert out["bfloat16"] == ["torch.bfloat16", "torch.bfloat16", "simgpu:0", True]
    assert out["double"] == ["torch.float64", "torch.float64", "simgpu:0", True]
    assert out["original"] == "torch.float32"


def test_a_tour_and_a_generate_run_on_the_simulated_gpu():
    """The worlds load there; TransformerLens' generate (inference mode, start_at_layer) runs there; the
    classifier fed CPU inputs (chapter 00's bug before its fix) fails, fed its own device's inputs runs."""
    out = run_simgpu("""
        from rlhf_tutorial.worlds import load_policy, load_sentiment_classifier
        policy = load_policy("tiny")
        tokens = policy.to_tokens(["This movie was really"])
        out["generated_on"] = str(policy.generate(tokens, max_new_tokens=4, verbose=False).device)
        classifier, tok = load_sentiment_classifier("tiny")
        try:
            classifier(**tok(["a great film"], return_tensors="pt"))
            out["cpu_inputs"] = "ok"
        except RuntimeError as exc:
            out["cpu_inputs"] = str(exc)[:80]
        out["moved_inputs"] = str(classifier(**tok(["a great film"], return_tensors="pt").to(classifier.device)).logits.device)
    """)
    assert out["generated_on"] == "simgpu:0"
    assert out["cpu_inputs"].startswith("Expected all tensors to be on the same device")
    assert out["moved_inputs"] == "simgpu:0"


PRE_FIX_VALUE_HEAD = """
import math
import torch.nn as nn
from rlhf_tutorial import rlhf
from rlhf_tutorial.ppo import layer_init

class ValueHeadOnTheCpu(rlhf.TransformerWithValueHead):
    '''The reference as it was before the device fix: the head is built and never moved.'''
    def __init__(self, base_model):
        super().__init__(base_model)
        d = base_model.cfg.d_model
        self.value_head = nn.Sequential(layer_init(nn.Linear(d, 4 * d), std=math.sqrt(2)), nn.ReLU(),
                                        layer_init(nn.Linear(4 * d, 1), std=1.0))
"""


def test_undoing_a_device_fix_fails_the_guard_and_only_the_guard():
    """Chapter 03's value head built on the CPU (the reference before its fix): on the CPU the check
    cannot tell (everything is on one device); on the simulated GPU it fails, naming the head and both
    devices, while the reference passes there."""
    from rlhf_tutorial.checks import run_check

    namespace: dict = {}
    exec(PRE_FIX_VALUE_HEAD, namespace)
    on_cpu = run_check("TransformerWithValueHead", namespace["ValueHeadOnTheCpu"])
    assert on_cpu.passed, on_cpu.message  # invisible on a CPU: why the guard exists
    out = run_simgpu(PRE_FIX_VALUE_HEAD + """
from rlhf_tutorial.checks import run_check
bug = run_check("TransformerWithValueHead", ValueHeadOnTheCpu)
ref = run_check("TransformerWithValueHead", rlhf.TransformerWithValueHead)
out.update(bug=[bug.passed, bug.message], ref=[ref.passed, ref.message])
""")
    assert out["ref"][0], out["ref"][1]
    assert not out["bug"][0]
    assert "value head is on cpu" in out["bug"][1] and "simgpu:0" in out["bug"][1], out["bug"][1]


def test_a_check_runs_the_candidate_on_the_cpu_before_the_gpu():
    """On a GPU a check runs first on the CPU: chapter 05's hook that indexes the batch dim with a position
    (out of range: on CUDA a device-side assert that loses the kernel's CUDA context) is reported from the
    CPU pass with its usual hint and never reaches the GPU; the reference runs on both; a hook that builds
    its output on the CPU passes the CPU pass and is caught on the GPU; a CUDA error on the GPU pass says the
    kernel must be restarted."""
    out = run_simgpu("""
        from rlhf_tutorial import interp
        from rlhf_tutorial.checks import run_check

        def run(fn):
            seen = set()

            def patch_activation(activation, hook, source, positions=None):
                seen.add(str(activation.device))
                return fn(activation, hook, source, positions)

            result = run_check("patch_activation", patch_activation)
            return {"passed": result.passed, "devices": list(result.devices), "seen": sorted(seen),
                    "message": result.message}

        def batch_dim(activation, hook, source, positions=None):
            if positions is None:
                return source.clone()
            activation[positions] = source[positions]
            return activation

        def on_the_cpu(activation, hook, source, positions=None):
            return interp.patch_activation(activation.cpu(), hook, source.cpu(), positions)

        def assert_on_the_gpu(activation, hook, source, positions=None):
            if activation.device.type != "cpu":
                raise RuntimeError("CUDA error: device-side assert triggered")
            return interp.patch_activation(activation, hook, source, positions)

        out["batch_dim"] = run(batch_dim)
        out["reference"] = run(interp.patch_activation)
        out["on_the_cpu"] = run(on_the_cpu)
        out["assert"] = run(assert_on_the_gpu)
    """)
    wrong = out["batch_dim"]
    assert not wrong["passed"] and wrong["devices"] == wrong["seen"] == ["cpu"]
    assert "IndexError" in wrong["message"] and "indexed the batch dim" in wrong["message"]
    right = out["reference"]
    assert right["passed"] and right["devices"] == right["seen"] == ["cpu", "simgpu:0"]
    cpu_bug = out["on_the_cpu"]
    assert not cpu_bug["passed"] and cpu_bug["devices"] == ["cpu", "simgpu:0"]
    assert "is on cpu" in cpu_bug["message"]
    lost = out["assert"]
    assert not lost["passed"] and lost["devices"] == ["cpu", "simgpu:0"]
    assert "CUDA context of this kernel is lost" in lost["message"] and "Restart the kernel" in lost["message"]


def test_a_print_in_the_learners_code_shows_once_when_the_check_runs_on_the_cpu_then_the_gpu():
    """The two passes of a check on a GPU run the learner's code twice; its output shows once: the GPU
    pass's when the CPU pass passes, the CPU pass's when that pass fails (the learner sees what the
    failing code printed)."""
    out = run_simgpu("""
        import contextlib, io
        from rlhf_tutorial.checks import core

        @core.checker("toy_double", chapter="00_setup_and_tour", hint=("nudge", "approach", "code"))
        def check_toy_double(candidate):
            return core.compare_to_reference(candidate, lambda x: 2 * x, [core.Case("a vector", (torch.arange(3.0),))])

        def right(x):
            print("right on", x.device.type)
            return x + x

        def wrong(x):
            print("wrong on", x.device.type)
            return 3 * x

        for fn in (right, wrong):
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                result = core.run_check("toy_double", fn)
            out[fn.__name__] = {"passed": result.passed, "devices": list(result.devices),
                                "printed": buffer.getvalue().splitlines()}
    """)
    assert out["right"] == {"passed": True, "devices": ["cpu", "simgpu:0"], "printed": ["right on simgpu"]}
    assert out["wrong"] == {"passed": False, "devices": ["cpu"], "printed": ["wrong on cpu"]}
