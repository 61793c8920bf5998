"""The checking framework: every exercise's checker is built from these pieces.

A checker is a function ``check_x(candidate) -> str | None`` registered with :func:`checker`. It calls
the learner's object only through :func:`call`, compares against the reference with
:func:`compare_to_reference`, and fails by raising :class:`CheckFailure`. :func:`run_check` turns every
outcome, including exceptions the checker did not expect, into a :class:`CheckResult`: it never raises
because of the candidate, and never shows a traceback of the checker's own code.
"""

from __future__ import annotations

import contextlib
import html
import importlib
import inspect
import io
import math
import os
import sys
import sysconfig
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------------------------------
# Results and failures
# ----------------------------------------------------------------------------------------------------
@dataclass
class CheckResult:
    """The verdict on one exercise: ``passed`` and a human-readable ``message``."""

    name: str
    passed: bool
    message: str
    hint: str | None = None
    devices: tuple[str, ...] = ()  # where the check ran, in order: ("cpu", "cuda:0"), or ("cpu",) when the CPU pass failed
    next_rung: int = 1  # the hint rung a failed verdict points to (:func:`next_rung`): never the code's

    def how_to_ask(self) -> str:
        """What a failed verdict says instead of the hint: which rung of the ladder to ask for next
        (a nudge, then the approach); it never points to the code."""
        call = f'hint("{self.name}")' if self.next_rung == 1 else f'hint("{self.name}", {self.next_rung})'
        what = "a nudge" if self.next_rung == 1 else "the approach"
        again = " again" if self.next_rung <= HINT_SHOWN.get(self.name, 0) else ""
        return f"Stuck? {call} gives {what}{again} (or open the Hint cell above)."

    def __str__(self) -> str:
        mark = "PASSED" if self.passed else "FAILED"
        text = f"[{mark}] {self.name}: {self.message}"
        if not self.passed:
            text += f"\n  {self.how_to_ask()}"
        return text

    def _repr_pretty_(self, printer, cycle: bool) -> None:  # IPython's text/plain form
        printer.text(str(self))

    def _repr_html_(self) -> str:
        colour, mark = ("#1a7f37", "&#10004; passed") if self.passed else ("#cf222e", "&#10008; failed")
        ask = "" if self.passed else f"<div style='margin-top:4px;color:#57606a'>{html.escape(self.how_to_ask())}</div>"
        return verdict_box(colour, f"{html.escape(self.name)}: {mark}", html.escape(self.message), ask)


def verdict_box(colour: str, title: str, body_html: str, footer_html: str = "", monospace: bool = True) -> str:
    """The course's box for verdicts and hints: a coloured left border, a bold title, the body."""
    font = "font-family:monospace;font-size:90%;" if monospace else ""
    return (
        f"<div style='border-left:4px solid {colour};padding:4px 10px;margin:4px 0;font-family:sans-serif'>"
        f"<b style='color:{colour}'>{title}</b>"
        f"<div style='white-space:pre-wrap;{font}'>{body_html}</div>{footer_html}</div>"
    )


RUNGS = 3
RUNG_NAMES = ("a nudge", "the approach", "the code")


def rungs_of(hint: str | Sequence[str]) -> tuple[str, ...]:
    """An exercise's hint as its ladder of rungs: (nudge, approach, code). A single string (the form
    before the ladder) is one rung."""
    return (hint,) if isinstance(hint, str) else tuple(hint)


def _strip_fences(text: str) -> str:
    """Markdown code fences (```python ... ```) removed, for a box that shows the code as it is."""
    return "\n".join(line for line in text.splitlines() if not line.strip().startswith("```")).strip("\n")


@dataclass
class Hint:
    """One rung of an exercise's hint ladder, shown only when asked (``hint("name", rung)``), in the
    verdicts' box: 1 a nudge (which quantity, which torch function), 2 the approach or formula, 3 the
    code."""

    name: str
    text: str
    last_failure: str | None = None  # the more specific hint of the learner's last failed check, if any
    rung: int = 1
    rungs: int = 1  # how many rungs the ladder has

    def _about_last(self) -> str | None:
        """What the last attempt got wrong: below the code rung, without the fix (its nudge)."""
        if not self.last_failure or self.last_failure == self.text:
            return None
        return self.last_failure if self.rung >= self.rungs else nudge(self.last_failure)

    def _title(self) -> str:
        if self.rungs == 1:
            return f"Hint for {self.name}"
        return f"Hint {self.rung} of {self.rungs} ({RUNG_NAMES[self.rung - 1]}) for {self.name}"

    def _next(self) -> str | None:
        if self.rung >= self.rungs:
            return None
        return f'Still stuck? hint("{self.name}", {self.rung + 1}) gives {RUNG_NAMES[self.rung]}.'

    def __str__(self) -> str:
        head = "[HINT]" if self.rungs == 1 else f"[HINT {self.rung}/{self.rungs}]"
        if self.rung == RUNGS:  # the code, on lines of its own
            code = "\n".join("    " + line for line in _strip_fences(self.text).splitlines())
            text = f"{head} {self.name} ({RUNG_NAMES[-1]}):\n{code}"
        else:
            text = f"{head} {self.name}: {self.text}"
        about = self._about_last()
        if about:
            text += f"\n  About your last attempt: {about}"
        if self._next():
            text += f"\n  {self._next()}"
        return text

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        extra, about = "", self._about_last()
        if about:
            extra += f"<div style='margin-top:4px'><b>About your last attempt:</b> {html.escape(about)}</div>"
        if self._next():
            extra += f"<div style='margin-top:4px;color:#57606a'>{html.escape(self._next())}</div>"
        code = self.rung == RUNGS
        body = _strip_fences(self.text) if code else self.text
        return verdict_box("#0969da", html.escape(self._title()), html.escape(body), extra, monospace=code)


class CheckFailure(Exception):
    """Raised inside a checker to fail the exercise with a message (and optionally a targeted hint).
    ``about_devices``: the failure is a device mix or a result on the wrong device (which the CPU pass
    of :func:`run_check` cannot judge: there every input is on the CPU)."""

    def __init__(self, message: str, hint: str | None = None, about_devices: bool = False):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.about_devices = about_devices


@dataclass
class Checker:
    name: str
    chapter: str
    hint: tuple[str, ...]  # the ladder of rungs: (nudge, approach, code); one string before the ladder
    fn: Callable[[Any], str | None]
    device: str | None = None  # where its cases live; None: the course's device

    @property
    def first_rung(self) -> str:
        """The general hint a failure without a more specific one carries: the nudge."""
        return self.hint[0]


REGISTRY: dict[str, Checker] = {}
_running_on: list[str | None] = []  # the device of the checker now running (a stack: checks may nest)
_cpu_first: list[bool] = []  # whether it is the CPU pass before a GPU pass (same stack)


def checker(name: str, *, chapter: str, hint: str | tuple[str, str, str], device: str | None = None) -> Callable:
    """Register ``fn(candidate) -> str | None`` as the checker of exercise ``name``.

    ``hint`` is the exercise's hint ladder, three rungs shown one at a time (``hint("name", k)``; the
    first two also nested in the notebook's collapsed hint cell, the code only through ``hint``): 1 a nudge (which quantity, which torch function),
    2 the approach or formula, 3 the code (markdown; a ```python fence). None of the first two
    contains a line of the solution (tests/checks/test_exercise_text.py). A single string is the
    one-rung form of the chapters not yet converted. ``device``: where the exercise's code runs in its
    chapter when that is not the course's device (chapter 01 trains gymnasium agents on the CPU on
    every machine).
    """
    rungs = rungs_of(hint)
    if len(rungs) not in (1, RUNGS) or not all(isinstance(r, str) and r.strip() for r in rungs):
        raise ValueError(f"exercise {name!r}: the hint is {RUNGS} non-empty rungs (nudge, approach, code)")

    def register(fn: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
        if name in REGISTRY and REGISTRY[name].fn.__module__ != fn.__module__:
            raise ValueError(f"two checkers for exercise {name!r}")
        REGISTRY[name] = Checker(name=name, chapter=chapter, hint=rungs, fn=fn, device=device)
        return fn

    return register


# ----------------------------------------------------------------------------------------------------
# Calling the learner's code
# ----------------------------------------------------------------------------------------------------
_LIBRARY_DIRS = tuple(os.path.abspath(p) for p in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                                                   sysconfig.get_paths()["stdlib"]})


def _learner_frame(tb) -> str:
    """The innermost traceback frame of the learner's code, as 'line N: code': outside this package
    and outside installed libraries (torch's own Python frames are not the learner's line); failing
    that, the innermost frame outside this package."""
    outside = [f for f in traceback.extract_tb(tb) if not os.path.abspath(f.filename).startswith(PACKAGE_DIR)]
    frames = [f for f in outside if not os.path.abspath(f.filename).startswith(_LIBRARY_DIRS)] or outside
    if not frames:
        return ""
    f = frames[-1]
    where = f"line {f.lineno}" if f.filename.startswith("<") else f"{os.path.basename(f.filename)}:{f.lineno}"
    code = (f.line or "").strip()
    return f" (at {where}: `{code}`)" if code else f" (at {where})"


def _raised_by_learner(exc: BaseException) -> bool:
    """Whether ``exc`` comes from the learner's own ``raise`` (an untouched stub's), not from torch or
    another library: the innermost frame is outside installed libraries and its line is a ``raise``
    (torch's C++ errors surface on the learner's line that called it, which is no ``raise``)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return True
    last = frames[-1]
    if os.path.abspath(last.filename).startswith(_LIBRARY_DIRS):
        return False
    return not last.line or last.line.lstrip().startswith("raise")


def describe_exception(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}{_learner_frame(exc.__traceback__)}"


def _tensors_in(obj: Any, path: str = "") -> Iterable[tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, (list, tuple)):
        for i, x in enumerate(obj):
            yield from _tensors_in(x, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for k, x in obj.items():
            yield from _tensors_in(x, f"{path}[{k!r}]")


# ----------------------------------------------------------------------------------------------------
# Devices: checkers run on the course's device (rlhf_tutorial.devices), and compare on one device
# ----------------------------------------------------------------------------------------------------
def check_device() -> torch.device:
    """Where checkers build their cases and fixtures: the course's device (a GPU when there is one),
    so that a learner's device bug shows here, with a message, rather than in training; or the device
    the running checker was registered with (``checker(..., device="cpu")``)."""
    from rlhf_tutorial.devices import course_device, resolve

    return resolve(_running_on[-1]) if _running_on and _running_on[-1] else course_device()


def is_cpu_pass() -> bool:
    """Whether the running check is the CPU pass that precedes a GPU pass (see :func:`run_check`). A
    checker may leave out there what only repeats code the pass has already run on the CPU (a few phases
    of training with the candidate): the GPU pass runs it, and the CPU pass stays cheap."""
    return bool(_cpu_first and _cpu_first[-1])


def to_device(obj: Any, device: torch.device | None = None) -> Any:
    """``obj`` with every tensor (in tuples, lists, dicts, a :class:`Case`) moved to ``device``
    (default :func:`check_device`); modules are moved in place."""
    device = check_device() if device is None else device
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, torch.nn.Module):
        return obj.to(device)
    if isinstance(obj, Case):
        return Case(obj.label, to_device(obj.args, device), to_device(obj.kwargs, device))
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(to_device(x, device) for x in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj


_DEVICE_MIX = ("Expected all tensors to be on the same device", "indices should be either on cpu",
               "device type for generator", "can't convert cuda", "can't convert simgpu")


def is_device_mix(exc: BaseException) -> bool:
    """Whether ``exc`` is torch's complaint about tensors on two devices."""
    return isinstance(exc, (RuntimeError, TypeError)) and any(text in str(exc) for text in _DEVICE_MIX)


_ACCELERATOR_ERROR = getattr(torch, "AcceleratorError", ())  # torch >= 2.8: CUDA errors have their own type


def is_cuda_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a CUDA error (a device-side assert, an illegal memory access): after one, the
    process's CUDA context is lost and every later GPU operation fails with it."""
    text = str(exc)
    return isinstance(exc, _ACCELERATOR_ERROR) or "CUDA error" in text or "device-side assert" in text


CONTEXT_LOST = (
    "the GPU stopped on a CUDA error: {error}. The CUDA context of this kernel is lost: CUDA cannot recover "
    "from an error inside a GPU operation (most often an index out of range: indexing, `gather`, an embedding "
    "lookup or `cross_entropy` targets beyond their size), here or in an earlier cell, so every later GPU "
    "operation in this kernel fails the same way, whatever the code. Restart the kernel (Kernel > Restart) and "
    "run the cells above again. Checks run your code on the CPU before the GPU, where such a mistake gets a "
    "readable message; to find one that shows only on the GPU, run your function once on CPU tensors, or start "
    "Jupyter with RLHF_TUTORIAL_DEVICE=cpu."
)


def cuda_error_failure(exc: BaseException) -> CheckFailure:
    """The failure for a CUDA error: the kernel must be restarted, and why (:data:`CONTEXT_LOST`)."""
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return CheckFailure(CONTEXT_LOST.format(error=f"{type(exc).__name__}: {first_line}"),
                        hint="Restart the kernel: a lost CUDA context does not come back.")


def _input_device(args: tuple, kwargs: dict) -> torch.device | None:
    """The device of the inputs: of their first tensor of one or more dimensions, else of the first
    module's parameters; None when there is neither."""
    for _, t in _tensors_in((args, kwargs)):
        if t.dim() > 0:
            return t.device
    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.nn.Module):
            for p in x.parameters():
                return p.device
    return None


def mismatch(what: str, obj: Any, where: Any, other: str = "the model", fix: str | None = None) -> str | None:
    """A learner-facing sentence when ``obj`` (a tensor or module) is not on ``where``'s device (a
    device, tensor or module), e.g. "your value head is on cpu, the model on cuda:0: <fix>"; None when
    they agree."""
    from rlhf_tutorial.devices import device_of, same_device

    got, want = device_of(obj), where if isinstance(where, torch.device) else device_of(where)
    if same_device(got, want):
        return None
    fix = fix or (f"create it on {other}'s device (e.g. `.to(next(model.parameters()).device)` or "
                  "`device=x.device`).")
    return f"your {what} is on {got}, {other} on {want}: {fix}"


def device_problem(out: Any, want: torch.device | None) -> str | None:
    """A learner-facing sentence when the output of their code is not on ``want`` (the inputs'
    device): a tensor, or a module's parameter ("your value head is on cpu, the model on cuda:0")."""
    if want is None:
        return None
    if isinstance(out, torch.nn.Module):
        for name, p in out.named_parameters():
            part = name.split(".")[0].replace("_", " ")  # value_head.0.weight -> value head
            problem = mismatch(part, p, want, fix="create new layers on the model's device (e.g. "
                               "`nn.Linear(...).to(next(model.parameters()).device)`).")
            if problem:
                return problem
        return None
    for path, t in _tensors_in(out):  # a scalar loss too: backward() would leave the GPU
        problem = mismatch(f"output{path}" if path else "output", t, want, "the inputs",
                           fix="build new tensors on an input's device (`torch.zeros(..., device=x.device)`, "
                           "`torch.tensor(..., device=x.device)`).")
        if problem:
            return problem
    return None


# The start of the verdict on an exercise whose stub is untouched (``check`` then stops Run All).
NOT_IMPLEMENTED = "not implemented yet"
STUB_RAISE = "your code here"  # what every untouched stub's NotImplementedError says (notebooks.stub_message)


def is_stub_raise(exc: NotImplementedError) -> bool:
    """Whether ``exc`` is the untouched stub's raise (its message, or a bare ``raise NotImplementedError``),
    not a learner's own raise for a case their code does not handle (``scale="batch"`` not written yet)."""
    text = str(exc)
    return not text or STUB_RAISE in text


def call(candidate: Callable, *args: Any, _arg_names: Sequence[str] | None = None,
         _device_hint: str | None = None, _keep_modes: bool = True, **kwargs: Any) -> Any:
    """Call the learner's ``candidate``; every way it can go wrong becomes a :class:`CheckFailure`.

    - ``NotImplementedError`` -> "not implemented yet";
    - a mix of devices inside their code (a tensor built on the CPU beside a model on the GPU) -> a
      failure that says so, with their line, and ``_device_hint`` (where the inputs live, when they are
      no tensor or module ``call`` can read it from: a trainer, a hook's activation) or a general hint;
    - any other exception -> a failure naming the exception and the learner's line;
    - a tensor argument modified in place -> a failure naming the argument;
    - a module it is given (an argument, or a module attribute of one: a trainer's ``model``) left in
      another train/eval mode -> a failure naming it (``_keep_modes=False`` where the reference
      switches modes too: TransformerLens's ``generate`` puts the model in eval mode);
    - an output (a tensor, or a module's parameter) on another device than the inputs -> a failure
      naming both devices.
    """
    if not callable(candidate):
        raise CheckFailure(f"expected a function or class, got {type(candidate).__name__}: {candidate!r}")
    snapshot = [(p, t, t.detach().clone()) for p, t in _tensors_in((args, kwargs))]
    given = _given_modules(candidate, args, kwargs, _arg_names)
    modes = [(name, m, [sub.training for sub in m.modules()]) for name, m in given] if _keep_modes else []
    dtypes = _module_dtypes(given)
    try:
        with torch.enable_grad():
            out = candidate(*args, **kwargs)
    except NotImplementedError as exc:
        if not _raised_by_learner(exc):  # a library's NotImplementedError, not the exercise stub's
            raise CheckFailure(f"your code raised {describe_exception(exc)}") from None
        if not is_stub_raise(exc):  # the learner's own raise: a case (a mode, an option) their code lacks
            raise CheckFailure(
                f"your code raised {describe_exception(exc)}: the contract covers this case, so it needs an "
                "answer, not a raise.") from None
        raise CheckFailure(
            f"{NOT_IMPLEMENTED}: replace the `raise NotImplementedError(...)` line with your code."
        ) from None
    except CheckFailure:
        raise
    except Exception as exc:  # noqa: BLE001 - the learner's code may raise anything
        if is_cuda_error(exc):
            raise cuda_error_failure(exc) from None
        if is_device_mix(exc):
            where = _input_device(args, kwargs)
            inputs = f"The inputs are on {where}: build" if where is not None else "Build"
            raise CheckFailure(
                f"your code mixed devices: {describe_exception(exc)}",
                hint=_device_hint or f"{inputs} every new tensor on an input's device "
                "(`device=x.device`) and every new layer with `.to(...)` that device; the same code must run "
                "on a CPU and on a GPU.",
                about_devices=True,
            ) from None
        raise CheckFailure(f"your code raised {describe_exception(exc)}") from None
    for path, tensor, before in snapshot:
        same_shape = tensor.shape == before.shape
        if not same_shape or not torch.equal(tensor.detach(), before):
            raise CheckFailure(
                f"your code modified an input tensor in place (argument {_pretty_path(path, _arg_names)}).",
                hint="Use out-of-place operations (x = x - m, not x -= m or x.sub_(m)), or .clone() first.",
            )
    _check_dtypes(dtypes)
    _check_modes(modes)
    problem = device_problem(out, _input_device(args, kwargs))
    if problem:
        raise CheckFailure(problem, hint="The same code must run on a CPU and on a GPU: create tensors and layers "
                           "on the device of the inputs, never on the default device.", about_devices=True)
    return out


def _given_modules(candidate: Callable, args: tuple, kwargs: dict,
                   names: Sequence[str] | None) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) for each module the call is given: an argument, or a module attribute of an argument
    (a trainer's ``model``). Names come from ``names``, else from the candidate's own signature."""
    try:
        params = list(inspect.signature(candidate).parameters)
    except (TypeError, ValueError):
        params = []
    named = [((names[i] if names and i < len(names) else params[i] if i < len(params) else f"argument #{i + 1}"), x)
             for i, x in enumerate(args)]
    out = []
    for name, x in [*named, *kwargs.items()]:
        if isinstance(x, torch.nn.Module):
            out.append((name, x))
        elif hasattr(x, "__dict__") and not isinstance(x, (type, torch.Tensor)):
            out.extend((f"{name}.{k}", v) for k, v in vars(x).items() if isinstance(v, torch.nn.Module))
    return out


def _module_dtypes(modules: list[tuple[str, torch.nn.Module]]) -> list[tuple[str, torch.nn.Module, list]]:
    return [(name, m, [(k, t.dtype) for k, t in [*m.named_parameters(), *m.named_buffers()]]) for name, m in modules]


def _check_dtypes(dtypes: list[tuple[str, torch.nn.Module, list]]) -> None:
    """Fail when the call changed the dtype of a module it was given (a `.double()`, `.half()` or `.to(dtype)`
    of the caller's module works in place): the caller's next forward pass then mixes dtypes."""
    for name, module, before in dtypes:
        now = dict((k, t.dtype) for k, t in [*module.named_parameters(), *module.named_buffers()])
        changed = [(k, dtype, now.get(k)) for k, dtype in before if now.get(k) != dtype]
        if changed:
            k, was, is_now = changed[0]
            raise failure(
                f"your code changed the module passed as `{name}`: its {k} is now "
                f"{_dtype_name(is_now) if is_now is not None else 'gone'} (it was {_dtype_name(was)} when your "
                "function got it).",
                "Converting a module to another dtype changes it in place, for the caller too: the module is "
                "the caller's, and their next forward pass would get the dtype you set. Compute in another "
                "dtype on a copy of the weights, or convert the inputs and outputs only.")


def _check_modes(modes: list[tuple[str, torch.nn.Module, list[bool]]]) -> None:
    """Fail when the call changed the train/eval mode of a module it was given (the caller's state)."""
    for name, module, before in modes:
        if [sub.training for sub in module.modules()] != before:
            mode = {True: "train", False: "eval"}
            what = (f"left `{name}` in {mode[module.training]}() mode (it was in {mode[before[0]]}() mode when your "
                    "function got it)" if module.training != before[0] else
                    f"changed the train/eval mode of a part of `{name}`")
            raise failure(
                f"your code {what}.",
                "The mode of a module you are given is the caller's: the trainer's next step (or the frozen "
                "reference) would run in the mode you set. For a forward pass without gradients use "
                "`torch.no_grad()`; if you must switch, restore it: `was = model.training; model.eval(); ...; "
                "model.train(was)`.")


def _pretty_path(path: str, names: Sequence[str] | None) -> str:
    # path looks like "[0][2]..." (args) or "[1]['key']..." (kwargs)
    if path.startswith("[0]["):
        idx = int(path[4 : path.index("]", 4)])
        rest = path[path.index("]", 4) + 1 :]
        name = names[idx] if names and idx < len(names) else f"#{idx + 1}"
        return f"{name}{rest}"
    if path.startswith("[1]["):
        return path[4:].split("]", 1)[0].strip("'\"") + path[4:].split("]", 1)[1]
    return path


def get_attr(obj: Any, name: str) -> Any:
    """``getattr`` for the learner's objects: a missing attribute is a failure, not a crash."""
    try:
        return getattr(obj, name)
    except AttributeError:
        raise CheckFailure(f"your {type(obj).__name__} object has no attribute `{name}`.") from None
    except Exception as exc:  # noqa: BLE001 - a property of the learner's may raise
        raise CheckFailure(f"reading `{name}` raised {describe_exception(exc)}") from None


# ----------------------------------------------------------------------------------------------------
# Comparing outputs
# ----------------------------------------------------------------------------------------------------
def fmt(x: Any, limit: int = 6) -> str:
    """A short printable form of a tensor / number / other value, for expected-vs-got messages."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
        flat = x.flatten()[:limit].tolist()
        vals = ", ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in flat)
        more = ", ..." if x.numel() > limit else ""
        return f"tensor(shape={tuple(x.shape)}, dtype={str(x.dtype).replace('torch.', '')}, [{vals}{more}])"
    if isinstance(x, float):
        return f"{x:.6g}"
    text = repr(x)
    return text if len(text) < 200 else text[:200] + "..."


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def expect_tensor(
    out: Any,
    *,
    shape: Sequence[int] | None = None,
    dtype: torch.dtype | None = None,
    what: str = "your function's output",
    allow_nan: bool = False,
) -> torch.Tensor:
    """Fail unless ``out`` is a tensor of the given shape and dtype with no NaN."""
    if out is None:
        raise CheckFailure(f"{what} is None: did you forget a `return`?")
    if not isinstance(out, torch.Tensor):
        raise CheckFailure(f"{what} should be a torch.Tensor, got {type(out).__name__}: {fmt(out)}")
    if shape is not None and tuple(out.shape) != tuple(shape):
        hint = None
        if out.numel() == math.prod(shape):
            hint = "Same number of elements, different shape: check a reshape/transpose or a missing squeeze."
        elif out.ndim == len(shape) + 1 and out.shape[-1] == 1:
            hint = "There is an extra trailing dimension of size 1: squeeze(-1) it."
        elif out.ndim < len(shape):
            hint = "A dimension is missing: did you reduce (sum/mean) over a dimension that should stay?"
        raise CheckFailure(f"{what} has shape {tuple(out.shape)}, expected {tuple(shape)}.", hint=hint)
    if dtype is not None and out.dtype != dtype:
        want = _dtype_name(dtype)
        raise CheckFailure(
            f"{what} has the wrong dtype: it is {_dtype_name(out.dtype)}: return {want}.",
            hint=f"Build new tensors with an explicit dtype (e.g. torch.tensor(xs, dtype=torch.{want})), or "
            f"convert with .to(torch.{want}).",
        )
    if not allow_nan and out.is_floating_point() and not torch.isfinite(out).all():
        raise CheckFailure(
            f"{what} contains NaN or inf: {fmt(out)}",
            hint="Look for exp/log of large or zero values: log_softmax and logsigmoid are the stable forms.",
        )
    return out


def _close(a: Any, b: Any, atol: float, rtol: float) -> bool:
    """Whether two outputs agree (tensors, numbers, or tuples/lists/dicts of them)."""
    if isinstance(b, torch.Tensor):
        if not isinstance(a, torch.Tensor) or a.shape != b.shape:
            return False
        a, b = a.detach().to(device=b.device, dtype=torch.float64), b.detach().to(torch.float64)
        return bool(torch.allclose(a, b, atol=atol, rtol=rtol, equal_nan=False))
    if isinstance(b, (tuple, list)):
        return isinstance(a, (tuple, list)) and len(a) == len(b) and all(
            _close(x, y, atol, rtol) for x, y in zip(a, b)
        )
    if isinstance(b, dict):
        return isinstance(a, dict) and set(a) == set(b) and all(_close(a[k], b[k], atol, rtol) for k in b)
    if isinstance(b, (float, int)) and not isinstance(b, bool):
        if isinstance(a, torch.Tensor) and a.numel() == 1:
            a = a.item()
        return isinstance(a, (float, int)) and math.isclose(float(a), float(b), rel_tol=rtol, abs_tol=atol)
    return a == b


def _hidden_difference(got: Any, expected: Any, atol: float, rtol: float, shown: int = 6) -> str:
    """For two tensors of one shape whose first ``shown`` values (what ``fmt`` prints) agree, a line naming the
    first entry that does not: otherwise the expected and got previews look the same."""
    if not (isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor) and got.shape == expected.shape):
        return ""
    a = got.detach().to(device="cpu", dtype=torch.float64).flatten()
    b = expected.detach().to(device="cpu", dtype=torch.float64).flatten()
    bad = (~torch.isclose(a, b, atol=atol, rtol=rtol)).nonzero()
    if len(bad) == 0 or int(bad[0]) < shown:
        return ""
    flat = int(bad[0])
    index = list(torch.unravel_index(torch.tensor(flat), tuple(expected.shape))) if expected.dim() else []
    where = "[" + ", ".join(str(int(i)) for i in index) + "]"
    return (f"\n  (the first {shown} values agree; the first that differs is at index {where}: expected "
            f"{fmt(float(b[flat]))}, got {fmt(float(a[flat]))})")


def seeded(seed: int) -> torch.Generator:
    """A CPU generator for building a checker's random cases (never touches the global RNG)."""
    return torch.Generator().manual_seed(seed)


@dataclass
class Case:
    """One test input: a label for messages, positional args and keyword args."""

    label: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass
class Mistake:
    """A known wrong implementation: when the learner's output matches ``fn``'s, show ``hint``."""

    hint: str
    fn: Callable


def _clone(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone(x) for x in obj)
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    return obj


def _check_output_form(out: Any, expected: Any, label: str) -> None:
    """Type, shape and NaN of ``out`` against ``expected`` (dtype and device are judged separately)."""
    if isinstance(expected, torch.Tensor):
        expect_tensor(out, shape=expected.shape, what=f"On {label}, your output")
    elif isinstance(expected, (tuple, list)):
        if not isinstance(out, (tuple, list)) or len(out) != len(expected):
            raise CheckFailure(
                f"On {label}, expected a {type(expected).__name__} of {len(expected)} items, got {fmt(out)}."
            )
        for i, (o, e) in enumerate(zip(out, expected)):
            _check_output_form(o, e, f"{label} (item {i})")
    elif isinstance(expected, dict):
        if not isinstance(out, dict):
            raise CheckFailure(f"On {label}, expected a dict, got {fmt(out)}.")
        if set(out) != set(expected):
            raise CheckFailure(f"On {label}, your dict has the keys {sorted(out)}, expected {sorted(expected)}.")
    elif isinstance(expected, float) and out is None:
        raise CheckFailure(f"On {label}, your function returned None: did you forget a `return`?")


DEVICE_MISMATCH = "the tensor is on"  # how form_mismatch's device difference begins


def form_mismatch(out: Any, expected: Any) -> str | None:
    """The first dtype or device difference between two outputs of the same structure, in words
    ("the dtype is float64: return float32"), or None when there is none."""
    if isinstance(expected, torch.Tensor) and isinstance(out, torch.Tensor):
        if out.dtype != expected.dtype:
            want = _dtype_name(expected.dtype)
            how = ("a comparison such as `x == y`, or .bool()" if expected.dtype == torch.bool
                   else f"an explicit dtype=torch.{want} where you build the tensor, or .to(torch.{want})")
            return f"the dtype is {_dtype_name(out.dtype)}: return {want} ({how})"
        if out.device != expected.device:
            return (f"{DEVICE_MISMATCH} {out.device}: return it on {expected.device}, the device of the inputs "
                    "(build new tensors with device=... of an input)")
    elif isinstance(expected, (tuple, list)) and isinstance(out, (tuple, list)):
        for i, (o, e) in enumerate(zip(out, expected)):
            text = form_mismatch(o, e)
            if text:
                return f"item {i}: {text}" if len(expected) > 1 else text
    elif isinstance(expected, dict) and isinstance(out, dict):
        for key, e in expected.items():
            text = form_mismatch(out.get(key), e)
            if text:
                return f"[{key!r}]: {text}"
    return None


def nudge(hint: str) -> str:
    """The short form of a hint: what is wrong, without the fix (its first clause or sentence).

    A separator (": ", ". ", "; ") ends the clause only at the top level of the text: never inside
    `code`, "double" or 'single' quotes (an apostrophe inside a word is no quote), or parentheses and
    brackets, so that ``else: raise ValueError(...)``, "('Answer: 2' is 2)" and "(e.g. float32)" stay
    whole.
    """
    closing = {"(": ")", "[": "]", "{": "}"}
    stack: list[str] = []  # what closes the innermost open span: ")", "]", "}", "`", '"' or "'"
    for i, ch in enumerate(hint):
        prev = hint[i - 1] if i > 0 else " "
        after = hint[i + 1] if i + 1 < len(hint) else " "
        top = stack[-1] if stack else None
        if top in ("`", '"', "'"):  # inside code or a quotation only its own end counts
            if ch == top and (ch != "'" or not after.isalnum()):
                stack.pop()
            continue
        if ch in "`\"" or (ch == "'" and not prev.isalnum()):
            stack.append(ch)
        elif ch in closing:
            stack.append(closing[ch])
        elif stack and ch == top:
            stack.pop()
        elif not stack and i > 0 and hint[i:i + 2] in (": ", ". ", "; ") and not _abbreviation(hint, i):
            return hint[:i].rstrip(".") + "."
    return hint.rstrip(".") + "."


def _abbreviation(text: str, i: int) -> bool:
    """Whether the full stop at ``text[i]`` ends an abbreviation ("e.g.", "i.e.", "vs."), not a sentence."""
    return text[i] == "." and text[:i + 1].rsplit(" ", 1)[-1].lstrip("(").lower() in ("e.g.", "i.e.", "vs.", "etc.")


def failure(message: str, hint: str | None) -> CheckFailure:
    """A failure whose message ends with the hint's nudge (what is wrong and where); the full hint
    stays in ``hint``, for the learner to open when they want it."""
    if hint:
        message = f"{message}\n  {nudge(hint)}"
    return CheckFailure(message, hint)


def _known_mistake(got: Any, case: Case, mistakes: Sequence[Mistake], atol: float, rtol: float,
                   expected: Any = None, earlier: Sequence[tuple[Case, Any]] = ()) -> str | None:
    """The hint of the first known mistake whose output on ``case`` equals the candidate's and that
    agrees with the candidate on every case run before it.

    A mistake whose output on this case equals the correct one (``expected``) is never named: on this
    case it is indistinguishable from a right answer, so it cannot explain a wrong one. Nor is one that
    differs from the candidate on an ``earlier`` case (``(case, the candidate's output)``, all of which
    the candidate passed): that mistake would have failed there, so it is not what the candidate did (a
    diagnosis right for the wrong reason is worse than none).
    """
    for mistake in mistakes:
        try:
            wrong = mistake.fn(*_clone(case.args), **_clone(case.kwargs))
        except Exception:  # noqa: BLE001 - a mistake variant may not apply to this case
            continue
        if expected is not None and _close(wrong, expected, atol, rtol):
            continue
        if _close(got, wrong, atol, rtol) and _agrees_before(mistake, earlier, atol, rtol):
            return mistake.hint
    return None


def _agrees_before(mistake: Mistake, earlier: Sequence[tuple[Case, Any]], atol: float, rtol: float) -> bool:
    """Whether ``mistake`` gives the candidate's outputs on the cases the candidate already passed."""
    for case, got in earlier:
        try:
            wrong = mistake.fn(*_clone(case.args), **_clone(case.kwargs))
        except Exception:  # noqa: BLE001 - it crashes where the candidate answered: not the candidate's mistake
            return False
        if not _close(got, wrong, atol, rtol):
            return False
    return True


def compare_to_reference(
    candidate: Callable,
    reference: Callable,
    cases: Sequence[Case],
    *,
    mistakes: Sequence[Mistake] = (),
    atol: float = 1e-4,
    rtol: float = 1e-4,
    arg_names: Sequence[str] | None = None,
    diagnose: Callable[[Case, Any, Any], str | None] | None = None,
    grad: Sequence[str] = (),
    grad_cases: Sequence[int] = (0,),
    grad_mistakes: Sequence[Mistake] = (),
) -> str:
    """Run every case on the candidate and the reference; fail on the first disagreement.

    In order: the output's type and shape; its dtype and device (right values in the wrong dtype get
    their own message, before any mistake is looked for); NaN; the values. On wrong values each known
    mistake is run on the same case, and the first whose output the candidate matches (and that
    differs from the reference there) gives the hint; when none matches, ``diagnose(case, got,
    expected)`` may name a difference no fixed variant captures (a clamp at an unknown bound, a
    saturation). Every case runs on :func:`check_device` (the course's device). When ``grad`` names
    inputs (an exercise training differentiates, ``plug.DIFFERENTIATED``), the gradient with respect to
    them is compared too, on the cases numbered ``grad_cases`` (:func:`compare_gradients`, which names a
    ``grad_mistakes`` entry whose gradient the candidate's matches). Returns a one-line summary for the
    pass message.
    """
    cases = [to_device(case) for case in cases]
    passed: list[tuple[Case, Any]] = []  # the cases the candidate got right, with its outputs
    for case in cases:
        expected = reference(*_clone(case.args), **_clone(case.kwargs))
        got = call(candidate, *_clone(case.args), _arg_names=arg_names, **_clone(case.kwargs))
        try:
            _check_output_form(got, expected, case.label)
        except CheckFailure as form:
            hint = _known_mistake(got, case, mistakes, atol, rtol, expected, passed)
            raise (failure(form.message, hint) if hint else form) from None
        mismatch = form_mismatch(got, expected)
        if mismatch and _close(got, expected, atol, rtol):
            raise CheckFailure(
                f"On {case.label}, the values are right, but {mismatch}.",
                hint="Only the dtype (or device) differs: the training code downstream expects exactly the "
                "reference's, and mixing dtypes fails there, far from here.",
                about_devices=DEVICE_MISMATCH in mismatch,
            )
        if _close(got, expected, atol, rtol):
            passed.append((case, got))
            continue
        message = f"Wrong values on {case.label}.\n  expected: {fmt(expected)}\n  got:      {fmt(got)}"
        message += _hidden_difference(got, expected, atol, rtol)
        if mismatch:
            message += f"\n  (also, {mismatch})"
        hint = _known_mistake(got, case, mistakes, atol, rtol, expected, passed)
        if hint is None and diagnose is not None:
            hint = diagnose(case, got, expected)
        raise failure(message, hint)
    for i in grad_cases if grad else ():
        compare_gradients(candidate, reference, cases[i], grad, arg_names=arg_names, mistakes=grad_mistakes)
    return f"matches the reference on {len(cases)} cases ({'; '.join(c.label for c in cases)})."


# ----------------------------------------------------------------------------------------------------
# Comparing gradients
# ----------------------------------------------------------------------------------------------------
NO_GRAPH = ("something in it detached the result: a `.detach()`, an `.item()` or `torch.tensor(...)` of a result, "
            "`.numpy()`, or a body under `torch.no_grad()`")


def _with_grad_inputs(case: Case, wrt: Sequence[str], arg_names: Sequence[str] | None) -> tuple[tuple, dict, list]:
    """Fresh copies of ``case``'s inputs in which those named in ``wrt`` are leaves that require grad."""
    args, kwargs = list(_clone(case.args)), _clone(case.kwargs)
    leaves = []
    for name in wrt:
        if name in kwargs:
            kwargs[name] = leaf = kwargs[name].detach().clone().requires_grad_(True)
        else:
            i = list(arg_names or ()).index(name)  # a checker bug when absent: run_check reports it as one
            args[i] = leaf = args[i].detach().clone().requires_grad_(True)
        leaves.append(leaf)
    return tuple(args), kwargs, leaves


def compare_gradients(candidate: Callable, reference: Callable, case: Case, wrt: Sequence[str], *,
                      arg_names: Sequence[str] | None = None, rtol: float = 1e-3,
                      mistakes: Sequence[Mistake] = ()) -> None:
    """Fail unless the candidate's output on ``case`` carries the reference's gradient with respect to
    each input named in ``wrt`` (the inputs training differentiates through, ``plug.DIFFERENTIATED``).

    The outputs are reduced to one number with the same seeded random weights, L = sum_i w_i * out_i
    over every floating-point tensor of the reference's output that carries a gradient (a stats dict
    beside a loss is left out), and ``torch.autograd.grad(L, inputs)`` is compared: an output with
    no graph at all (detached, or computed under ``torch.no_grad()``), an input no gradient reaches
    (one half of a pair detached), and a gradient that differs (a stop-gradient inside) each get
    their own message. Values are compared first (``compare_to_reference``); this runs after. When the
    gradients differ, the first of ``mistakes`` (variants with the right values and a known wrong
    gradient, such as a weight the contract detaches left in the graph) whose gradient the candidate's
    matches gives the hint; otherwise a generic one names both directions (a term detached that should
    not be, or one left in the graph that the contract treats as a constant).
    """
    case = to_device(case)
    args, kwargs, leaves = _with_grad_inputs(case, wrt, arg_names)
    with torch.enable_grad():
        expected = reference(*args, **kwargs)
    targets = [(path, t) for path, t in _tensors_in(expected) if t.is_floating_point() and t.requires_grad]
    if not targets:
        raise RuntimeError(f"the reference's output on {case.label} carries no gradient: wrong `wrt` {tuple(wrt)}")
    g = seeded(1234)
    weights = [torch.randn(t.shape, generator=g, dtype=torch.float64).to(device=t.device, dtype=t.dtype)
               for _, t in targets]
    want = torch.autograd.grad(sum((w * t).sum() for w, (_, t) in zip(weights, targets)), leaves, allow_unused=True)

    args, kwargs, leaves = _with_grad_inputs(case, wrt, arg_names)
    got_out = call(candidate, *args, _arg_names=arg_names, **kwargs)
    got_tensors = dict(_tensors_in(got_out))
    named = " and ".join(f"`{n}`" for n in wrt)
    outs = []
    for path, t in targets:
        got = got_tensors.get(path)
        if not isinstance(got, torch.Tensor) or got.shape != t.shape:
            raise CheckFailure(f"On {case.label} with {named} requiring grad, your output{path} is {fmt(got)}, "
                               f"expected the shape {tuple(t.shape)}.")
        outs.append(got)
    where = f"output{targets[0][0]}" if len(targets) == 1 and targets[0][0] else "output"
    if not any(o.requires_grad for o in outs):
        raise failure(
            f"On {case.label}, your {where} carries no gradient although {named} "
            f"{'requires' if len(wrt) == 1 else 'require'} grad: {NO_GRAPH}.",
            "Training backpropagates through this output: compute it from the inputs with torch operations "
            "only, keep it a tensor (no .item(), no torch.tensor(...) of a result), and do not detach it or wrap "
            "the function in torch.no_grad().")
    loss = sum((w.to(o.dtype) * o).sum() for w, o in zip(weights, outs) if o.requires_grad)
    try:
        got_grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    except RuntimeError as exc:  # e.g. a tensor the backward pass needs was modified in place
        raise CheckFailure(f"On {case.label}, the values are right, but backpropagating through your output "
                           f"failed: {describe_exception(exc)}",
                           hint="Training differentiates this output: avoid in-place operations (x += ..., "
                           "x[mask] = ...) on tensors that are part of the computation; use torch.where or "
                           "out-of-place arithmetic.") from None
    for name, leaf, w_grad, g_grad in zip(wrt, leaves, want, got_grads):
        w_grad = torch.zeros_like(leaf) if w_grad is None else w_grad.detach()
        g_grad = torch.zeros_like(leaf) if g_grad is None else g_grad.detach()
        if bool(w_grad.ne(0).any()) and not bool(g_grad.ne(0).any()):
            raise failure(
                f"On {case.label}, no gradient reaches `{name}`: the values are right, but your output does not "
                f"depend on `{name}` through autograd.",
                f"The part computed from `{name}` is detached (a `.detach()`, `.item()`, `.data` or "
                "`torch.no_grad()` on it): training would never move it. Keep it in the graph.")
        scale = float(w_grad.abs().max()) if w_grad.numel() else 0.0
        if not torch.allclose(g_grad.to(torch.float64), w_grad.to(torch.float64), rtol=rtol,
                              atol=1e-6 + rtol * scale):
            hint = _gradient_mistake(mistakes, case, wrt, arg_names, weights, name, g_grad, rtol, scale)
            raise failure(
                f"On {case.label}, the values are right but the gradient with respect to `{name}` is not the "
                f"reference's.\n  expected: {fmt(w_grad)}\n  got:      {fmt(g_grad)}",
                hint or f"Either part of the computation from `{name}` is detached or replaced by a constant (a "
                "`.detach()`, `.item()` or `.data` on one term, a value computed under `torch.no_grad()` and "
                "reused), or a term the contract treats as a constant (a stop-gradient) is left in the graph: "
                "the loss then trains a different direction than its value suggests.")


def _gradient_mistake(mistakes: Sequence[Mistake], case: Case, wrt: Sequence[str], arg_names: Sequence[str] | None,
                      weights: list[torch.Tensor], name: str, got: torch.Tensor, rtol: float,
                      scale: float) -> str | None:
    """The hint of the first of ``mistakes`` whose gradient with respect to ``name`` (the same seeded
    reduction as :func:`compare_gradients`) equals the candidate's ``got``."""
    for mistake in mistakes:
        try:
            args, kwargs, leaves = _with_grad_inputs(case, wrt, arg_names)
            with torch.enable_grad():
                outs = [t for _, t in _tensors_in(mistake.fn(*args, **kwargs))
                        if t.is_floating_point() and t.requires_grad]
                if len(outs) != len(weights):
                    continue
                loss = sum((w.to(o.dtype) * o).sum() for w, o in zip(weights, outs))
                grads = torch.autograd.grad(loss, leaves, allow_unused=True)
        except Exception:  # noqa: BLE001 - a mistake variant may not apply to this case
            continue
        grad = grads[list(wrt).index(name)]
        grad = torch.zeros_like(got) if grad is None else grad.detach()
        if grad.shape == got.shape and torch.allclose(grad.to(torch.float64), got.to(torch.float64), rtol=rtol,
                                                      atol=1e-6 + rtol * scale):
            return mistake.hint
    return None


# ----------------------------------------------------------------------------------------------------
# Running a checker
# ----------------------------------------------------------------------------------------------------
RESULTS: dict[str, bool] = {}  # this kernel's latest verdict per exercise
LAST_FAILURE_HINT: dict[str, str] = {}  # the hint of the latest failure per exercise (for hint())
HINT_SHOWN: dict[str, int] = {}  # the highest hint rung this kernel has shown per exercise


def next_rung(name: str) -> int:
    """The rung a failed verdict points to: the one after the highest shown, but never the code's (a
    learner who has read the approach is pointed back to it; the code is theirs to ask for)."""
    entry = REGISTRY.get(name)
    top = min(len(entry.hint), RUNGS - 1) if entry else 1
    return max(1, min(HINT_SHOWN.get(name, 0) + 1, top))


def hint_rung(name: str, rung: int = 1) -> Hint:
    """Rung ``rung`` (1 a nudge, 2 the approach, 3 the code) of exercise ``name``'s hint, with what the
    learner's last failed attempt got wrong; remembered, so the next failed verdict points one rung up."""
    load_all()
    rungs = REGISTRY[name].hint
    rung = max(1, min(int(rung), len(rungs)))
    HINT_SHOWN[name] = max(HINT_SHOWN.get(name, 0), rung)
    return Hint(name, rungs[rung - 1], LAST_FAILURE_HINT.get(name), rung=rung, rungs=len(rungs))
_loaded = False


def chapter_modules() -> list[str]:
    """Every module of checkers: ``rlhf_tutorial/checks/chNN_*.py``, found on disk (no list to keep)."""
    folder = Path(__file__).parent
    return [f"rlhf_tutorial.checks.{path.stem}" for path in sorted(folder.glob("ch[0-9][0-9]_*.py"))]


def load_all() -> None:
    """Import every chapter's checker module (each registers its checkers)."""
    global _loaded
    if not _loaded:
        for module in chapter_modules():
            importlib.import_module(module)
        _loaded = True


def run_check(name: str, candidate: Any) -> CheckResult:
    """Run the checker of exercise ``name`` on ``candidate``. Never raises because of the candidate.

    On a GPU, the check runs twice: first on the CPU (every case and fixture built there), then, only
    when the candidate passed there, on the GPU. A mistake that indexes out of range (a position used as
    a batch index, a gather beyond the vocabulary) raises a readable IndexError on the CPU, but on CUDA it
    is an asynchronous device-side assert that loses the kernel's CUDA context for good: the CPU pass
    reports such mistakes, and wrong values, shapes and dtypes, with the usual messages, before the
    candidate ever touches the GPU. The GPU pass then judges what only it can see: a tensor or a layer
    left on the CPU beside a model on the GPU. A failure of the CPU pass about devices (the candidate
    built something on a fixed device) is left to the GPU pass to judge. ``CheckResult.devices`` says
    which passes ran.

    What the learner's code prints shows once: the CPU pass runs with stdout held back (:func:`_held_stdout`);
    it is dropped when the GPU pass follows (which prints it again), and written out when the CPU pass
    gives the verdict (a failure there: the learner sees what their code printed in the failing pass).
    """
    load_all()
    if name not in REGISTRY:
        known = ", ".join(sorted(REGISTRY)) or "none"
        return CheckResult(name, False, f"there is no exercise called {name!r}. Exercises: {known}")
    entry = REGISTRY[name]
    from rlhf_tutorial.devices import resolve

    device = resolve(entry.device)
    passes = ["cpu", entry.device] if device.type != "cpu" else [entry.device]
    devices: list[str] = []
    for where in passes:
        cpu_first = len(passes) > 1 and where == "cpu"
        with _held_stdout(cpu_first) as printed:
            result, conclusive = _run_pass(entry, candidate, where, cpu_first=cpu_first)
        devices.append(str(resolve(where)))
        if cpu_first and (result.passed or not conclusive):
            continue  # on to the GPU pass, which prints what the candidate prints (once)
        if printed is not None:  # the verdict of the CPU pass: show what the candidate printed there
            sys.stdout.write(printed.getvalue())
        break  # the verdict; on the CPU pass, the learner's mistake, which the GPU then never runs
    result.devices = tuple(devices)
    RESULTS[name] = result.passed
    if result.passed:
        LAST_FAILURE_HINT.pop(name, None)
    elif result.hint and result.hint not in entry.hint:  # a diagnosis of this attempt, not the ladder's nudge
        LAST_FAILURE_HINT[name] = result.hint
    else:
        LAST_FAILURE_HINT.pop(name, None)
    result.next_rung = next_rung(name)
    return result


@contextlib.contextmanager
def _held_stdout(hold: bool):
    """While ``hold``, what is printed (the learner's ``print``s inside the checked code) goes to a buffer,
    yielded for the caller to drop or write out; otherwise stdout is left alone and None is yielded."""
    if not hold:
        yield None
        return
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        yield buffer


def _run_pass(entry: Checker, candidate: Any, where: str | None, cpu_first: bool = False) -> tuple[CheckResult, bool]:
    """One run of ``entry``'s checker with its cases on ``where`` (None: the course's device), and
    whether its verdict stands: a failure about devices, or a device mix inside the checker, does not
    on the CPU pass (the GPU pass judges it). ``cpu_first``: the CPU pass before a GPU pass
    (:func:`is_cpu_pass`)."""
    name = entry.name
    try:
        from rlhf_tutorial.devices import rng_devices

        # a check draws from seeded generators and leaves the notebook's random streams (the GPU's too) as
        # they were
        _running_on.append(where)
        _cpu_first.append(cpu_first)
        try:
            with torch.random.fork_rng(devices=rng_devices(check_device())):
                torch.manual_seed(0)
                detail = entry.fn(candidate)
        finally:
            _running_on.pop()
            _cpu_first.pop()
        return CheckResult(name, True, detail or "all checks passed."), True
    except CheckFailure as failed:
        message = failed.message
        if failed.hint and nudge(failed.hint) not in message:  # what is wrong, in the verdict itself
            message = f"{message}\n  {nudge(failed.hint)}"
        return CheckResult(name, False, message, failed.hint or entry.first_rung), not failed.about_devices
    except RecursionError:
        return CheckResult(name, False, "your code recursed without end (RecursionError).", entry.first_rung), True
    except Exception as exc:  # noqa: BLE001 - never show a traceback of the checker itself
        if is_cuda_error(exc):  # raised outside call(): on the checker's next GPU operation, or restoring the RNG
            failed = cuda_error_failure(exc)
            return CheckResult(name, False, failed.message, failed.hint), True
        if is_device_mix(exc):  # the learner's code ran on one device (call() checks that): ours mixed them
            return CheckResult(
                name, False,
                f"checking stopped on a device mix inside the checker, not in your code: {describe_exception(exc)}. "
                "This is a bug in the checker: please report it with this message. (Your code may be right.)",
                entry.first_rung,
            ), False
        return CheckResult(
            name,
            False,
            f"checking stopped on {describe_exception(exc)}. If your code looks right, this may be a bug in "
            "the checker: please report it with this message.",
            entry.first_rung,
        ), True
