"""What every trainer shares: the plugging rule, the argument dataclasses and their flags, the clip
diagnostics, the schedules, the display helper."""

from __future__ import annotations

import argparse
import math
import types
from dataclasses import dataclass, fields

import pytest
import torch

from rlhf_tutorial import display
from rlhf_tutorial.ppo import clip_diagnostics
from rlhf_tutorial.trainers.args import add_flags, arg, documented, given_flags, parse_command
from rlhf_tutorial.trainers.plug import DIFFERENTIATED, NoGradientError, bind, learner_functions_for
from rlhf_tutorial.trainers.schedules import warmup_then_cosine, warmup_then_linear_to_zero


def make_module() -> types.ModuleType:
    """A small exercise module: ``outer`` calls ``inner``; ``Box`` is a class."""
    module = types.ModuleType("fake_exercises")
    exec(
        "def inner(x):\n    return x + 1\n\n"
        "def outer(x):\n    return inner(x) * 10\n\n"
        "def helper(x):\n    return inner(x)\n\n"
        "class Box:\n    pass\n",
        module.__dict__,
    )
    return module


def test_bind_reference_calls_the_override():
    module = make_module()
    fns = bind(module, ("inner", "outer", "Box"), {"inner": lambda x: x - 1})
    assert fns["outer"](5) == 40  # the reference outer calls the override of inner
    assert fns["inner"](5) == 4
    assert fns["Box"] is module.Box
    assert module.outer(5) == 60  # the module itself is untouched


def test_bind_a_reference_handed_back_is_no_override():
    module = make_module()
    calls = []

    def my_inner(x):
        calls.append(x)
        return x

    # outer handed back (as learner_functions does when the notebook imported it) still calls my_inner
    fns = bind(module, ("inner", "outer"), {"outer": module.outer, "inner": my_inner})
    assert fns["outer"](3) == 30 and calls == [3]
    assert fns["outer"] is not module.outer


def test_bind_overrides_keep_their_own_globals_and_unknown_names_fail():
    module = make_module()
    namespace = {"inner": lambda x: 100}
    exec("def outer(x):\n    return inner(x)\n", namespace)
    fns = bind(module, ("inner", "outer"), {"outer": namespace["outer"]})
    assert fns["outer"](1) == 100  # the learner's outer calls the learner's inner, not the module's
    with pytest.raises(TypeError, match="cannot replace"):
        bind(module, ("inner",), {"helper": print})


def test_bind_aliases_point_a_name_at_another_pluggable():
    module = make_module()
    exec("def other(x):\n    return -x\n", module.__dict__)
    fns = bind(module, ("inner", "outer", "other"), {}, aliases={"inner": "other"})
    assert fns["outer"](2) == -20


def test_bind_stops_a_differentiated_function_that_loses_the_graph_and_names_it():
    module = types.ModuleType("fake_losses")
    exec("def dpo_loss(x):\n    return (x ** 2).sum()\n\ndef step(x):\n    return dpo_loss(x) * 2\n", module.__dict__)
    x = torch.ones(3, requires_grad=True)
    detached = bind(module, ("dpo_loss", "step"), {"dpo_loss": lambda x: (x ** 2).sum().detach()})
    with pytest.raises(NoGradientError, match="your `dpo_loss` returned a tensor with no gradient graph"):
        detached["step"](x)  # called by a reference function, as in a trainer
    with torch.no_grad():
        assert detached["step"](x).item() == 6.0  # no gradients wanted: nothing to complain about
    assert detached["step"](torch.ones(3)).item() == 6.0  # no input carries gradients
    right = bind(module, ("dpo_loss", "step"), {"dpo_loss": lambda x: (x ** 2).sum()})
    assert right["step"](x).requires_grad
    # a module's parameters count as inputs that carry gradients; names outside DIFFERENTIATED are never wrapped
    assert "compute_rlhf_objective" in DIFFERENTIATED and "step" not in DIFFERENTIATED
    exec("def compute_rlhf_objective(model):\n    return model(torch.ones(1, 2)).sum()\n", module.__dict__)
    module.torch = torch
    fns = bind(module, ("compute_rlhf_objective",), {"compute_rlhf_objective": lambda m: m(torch.ones(1, 2)).sum().detach()})
    with pytest.raises(NoGradientError, match="compute_rlhf_objective"):
        fns["compute_rlhf_objective"](torch.nn.Linear(2, 1))


def test_learner_functions_picks_only_callables_of_the_pluggable_names():
    pick = learner_functions_for(("a", "b", "c"))
    assert sorted(pick({"a": print, "b": 3, "d": print})) == ["a"]


@dataclass
class DemoArgs:
    rate: float = arg(0.5, "a rate")
    name: str | None = arg(None, "a name")
    flag: bool = arg(True, "a switch")
    items: tuple[str, ...] = arg(("x",), "some items")


def test_flags_are_generated_from_the_fields():
    parser = argparse.ArgumentParser()
    add_flags(parser, DemoArgs, from_preset=False)
    ns = parser.parse_args(["--rate", "0.25", "--no-flag", "--items", "p", "q"])
    assert (ns.rate, ns.name, ns.flag, ns.items) == (0.25, None, False, ["p", "q"])
    assert "a rate (default: 0.5)" in parser.format_help()
    preset = argparse.ArgumentParser()
    add_flags(preset, DemoArgs, from_preset=True)
    assert given_flags(DemoArgs, preset.parse_args(["--items", "p"])) == {"items": ("p",)}


def test_documented_puts_every_fields_help_in_the_docstring():
    """help(Args) in a notebook shows each knob's meaning (chapter 06 sends the learner to help(DPOArgs))."""
    import pydoc

    from rlhf_tutorial.trainers.dpo import DPOArgs
    from rlhf_tutorial.trainers.grpo import GRPOArgs

    @documented
    @dataclass
    class Demo:
        """Demo knobs."""

        rate: float = arg(0.5, "a rate")
        items: tuple[str, ...] = arg(("x",), "some items")

    assert Demo.__doc__.startswith("Demo knobs.")
    assert "rate (float, default 0.5): a rate" in Demo.__doc__
    assert "items (tuple[str, ...], default ('x',)): some items" in Demo.__doc__
    assert Demo(rate=0.25).rate == 0.25  # still the dataclass
    assert "a rate" not in (DemoArgs.__doc__ or "")  # undecorated: no help in the docstring
    page = pydoc.render_doc(DPOArgs, renderer=pydoc.plaintext)
    assert "min_reward_gap (float, default 0.05): drop groups whose best and worst reward differ" in page
    for cls in every_args_dataclass():
        for f in fields(cls):
            assert f"{f.name} (" in cls.__doc__ and f.metadata.get("help", "") in cls.__doc__, (cls.__name__, f.name)
    assert {DPOArgs, GRPOArgs} <= set(every_args_dataclass())


def every_args_dataclass() -> list[type]:
    """Every ``...Args`` dataclass the package defines (one per trainer or command), found by walking it."""
    import dataclasses
    import importlib
    import pkgutil

    import rlhf_tutorial

    found = []
    for info in pkgutil.walk_packages(rlhf_tutorial.__path__, "rlhf_tutorial."):
        if not info.name.startswith(("rlhf_tutorial.trainers.", "rlhf_tutorial.tiny.")):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (name.endswith("Args") and dataclasses.is_dataclass(obj) and isinstance(obj, type)
                    and obj.__module__ == module.__name__):
                found.append(obj)
    assert len(found) >= 12, found
    return found


def test_a_command_parses_its_fields_threads_and_progress():
    """parse_command: the dataclass's flags, --threads (applied to torch) and --no-progress, for every command
    built on it (train-sft, train-rejection-sampling, pass-at-k, compare-reasoning)."""
    threads = torch.get_num_threads()
    try:
        ns = parse_command("demo", DemoArgs, ["--rate", "0.25", "--items", "p", "--threads", "2", "--no-progress"],
                           description=None, from_preset=False)
        assert (ns.threads, ns.no_progress, torch.get_num_threads()) == (2, True, 2)
        assert DemoArgs(**given_flags(DemoArgs, ns)) == DemoArgs(rate=0.25, items=("p",))
        ns = parse_command("demo", DemoArgs, [], description=None, from_preset=True)
        assert (given_flags(DemoArgs, ns), ns.threads, ns.no_progress) == ({}, 1, False)
    finally:
        torch.set_num_threads(threads)


def test_clip_diagnostics_definitions_and_mask():
    logprobs = torch.tensor([0.0, math.log(1.5), math.log(0.5), math.log(1.1)])
    old = torch.zeros(4)
    ratio = logprobs.exp()
    stats = clip_diagnostics(logprobs, old, clip_coef=0.2)
    assert stats["clipfrac"] == pytest.approx(0.5)  # 1.5 and 0.5 lie outside [0.8, 1.2]
    assert stats["approx_kl"] == pytest.approx(((ratio - 1) - logprobs).mean().item())
    assert stats["approx_kl"] >= 0
    masked = clip_diagnostics(logprobs, old, 0.2, mask=torch.tensor([True, False, False, True]))
    assert masked["clipfrac"] == 0.0
    assert masked["approx_kl"] == pytest.approx((ratio[3] - 1 - logprobs[3]).item() / 2)


def test_schedules():
    assert warmup_then_linear_to_zero(0, 100, 10) == pytest.approx(0.1)
    assert warmup_then_linear_to_zero(10, 100, 10) == pytest.approx(1.0)
    assert warmup_then_linear_to_zero(55, 100, 10) == pytest.approx(0.5)
    assert warmup_then_linear_to_zero(55, 100, 10, decay=False) == 1.0
    assert warmup_then_cosine(10, 110, 10) == pytest.approx(1.0)
    assert warmup_then_cosine(60, 110, 10) == pytest.approx(0.55)  # half way down the cosine
    assert warmup_then_cosine(110, 110, 10, final_scale=0.2) == pytest.approx(0.2)


def test_html_text_and_show_outside_a_kernel(capsys):
    shown = display.HTMLText("<b>x</b>", "x")
    assert shown._repr_html_() == "<b>x</b>" and repr(shown) == str(shown) == "x"
    assert not display.in_kernel()
    display.show(shown)
    assert capsys.readouterr().out == "x\n"
