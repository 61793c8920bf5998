"""A simulated GPU on the CPU: catches mixed-device bugs on a machine without one.

On a CUDA machine ``cuda_tensor + cpu_tensor`` raises "Expected all tensors to be on the same device";
on a CPU-only machine the same code runs, so a course developed and tested on CPUs ships device bugs
that break every learner with a GPU. This module gives the CPU a second device, ``simgpu``: its
tensors compute on the CPU (real values, real gradients, real optimizers) but report ``simgpu:0`` as
their device, and every operation that mixes them with CPU tensors raises as CUDA would.

Turn it on for a whole process with ``RLHF_TUTORIAL_DEVICE=simgpu`` (``import rlhf_tutorial`` calls
:func:`install`; the course's device rule in :mod:`rlhf_tutorial.devices` then puts every model there),
or call :func:`install` yourself. It is a test tool: Python runs every tensor operation, so it is many
times slower than the CPU.

What it reproduces of CUDA's rules (the ones the course's code can break):

- every tensor argument of an operation on one device, except CPU tensors of zero dimensions (Python
  scalars wrapped as tensors, allowed beside CUDA tensors), CPU index tensors of a simgpu tensor, and
  copies between devices (``copy_``, ``.to``);
- a random operation on the simgpu device needs a generator of that device
  (``torch.Generator(device=...)``): a CPU generator raises, as on CUDA;
- ``.numpy()`` of a simgpu tensor raises (``.cpu()`` first), as on CUDA.

How: a tensor subclass wraps a CPU tensor and reports the ``privateuseone`` device renamed to
``simgpu`` (torch's Python-backend registration gives autograd the device guard it needs); a
``TorchDispatchMode`` runs every ATen operation on the wrapped CPU tensors after checking their
devices (it holds the FAKE mode slot, which lets factory calls with a non-CPU device reach it); a
``TorchFunctionMode`` handles the few Python-level entry points that check devices before dispatch
(``Tensor.to``, ``torch.tensor``, ``torch.Generator``). ``torch.inference_mode`` runs as ``no_grad``
(wrapper tensors cannot be inference tensors).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

NAME = "simgpu"
_installed = False
_lock = threading.Lock()
aten = torch.ops.aten


_sim_device: torch.device | None = None


def sim_device() -> torch.device:
    """The simulated GPU (``simgpu:0``); :func:`install` must have run."""
    global _sim_device
    if _sim_device is None:
        _sim_device = torch.device(NAME, 0)
    return _sim_device


def _is_sim_device(dev: Any) -> bool:
    return dev is not None and not isinstance(dev, int) and torch.device(dev).type == NAME


class _SimTensorType(type(torch.Tensor)):
    """``type(x) == torch.Tensor`` holds for a simgpu tensor as for a CUDA one (TransformerLens asserts
    it in ``forward(..., start_at_layer=...)``)."""

    def __eq__(cls, other: object) -> bool:
        return cls is other or other is torch.Tensor

    __hash__ = type.__hash__


class SimTensor(torch.Tensor, metaclass=_SimTensorType):
    """A CPU tensor (``.elem``) that reports the simulated GPU as its device."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> SimTensor:
        r = torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
            layout=elem.layout, device=sim_device(), requires_grad=elem.requires_grad,
        )
        r.elem = elem
        return r

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        text = repr(self.elem)
        return text[:-1] + f", device='{sim_device()}')" if text.endswith(")") else text

    def __format__(self, spec: str) -> str:  # f"{loss:.3f}" of a 0-d tensor, as on CUDA
        return self.elem.__format__(spec) if self.dim() == 0 else object.__format__(self, spec)

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # Reached when the dispatch mode is not active in this thread (autograd's worker threads): the
        # same rules, run directly (entering a mode for each operation of a backward pass cost as much again).
        return _run(func, args, kwargs or {})


class SimGenerator(torch.Generator):
    """``torch.Generator(device="simgpu")``: a CPU generator that the simulated device accepts."""

    def __new__(cls, device: Any = "cpu"):
        gen = super().__new__(cls)
        gen._sim = _is_sim_device(device)
        return gen

    def __init__(self, device: Any = "cpu"):
        super().__init__()

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return sim_device() if self._sim else torch.device("cpu")


# ATen's arguments and results are tensors, scalars, dtypes, devices and lists or tuples of them (kwargs: a
# dict of those), so the three walks below look into lists, tuples and dicts only: torch's general pytree
# functions did the same work at several times the cost (a third of the simulated GPU's overhead).
def _tensors(x: Any, out: list) -> list:
    """Append every tensor in ``x`` (a tensor, or lists / tuples / dicts of them) to ``out``."""
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for item in x:
            _tensors(item, out)
    elif isinstance(x, dict):
        for item in x.values():
            _tensors(item, out)
    return out


def _unwrap(x: Any) -> Any:
    """``x`` with every simulated-GPU tensor replaced by the CPU tensor it wraps."""
    if isinstance(x, SimTensor):
        return x.elem
    if isinstance(x, (list, tuple)):
        return type(x)(map(_unwrap, x)) if any(isinstance(i, (SimTensor, list, tuple)) for i in x) else x
    if isinstance(x, dict):
        return {k: _unwrap(v) for k, v in x.items()}
    return x


def _wrap(x: Any) -> Any:
    """``x`` with every CPU tensor wrapped as a simulated-GPU tensor."""
    if isinstance(x, torch.Tensor):
        return x if isinstance(x, SimTensor) else SimTensor(x)
    if isinstance(x, (list, tuple)):
        return type(x)(map(_wrap, x))
    return x


_CROSS_DEVICE_OPS = {aten.copy_.default, aten._to_copy.default, aten.lift_fresh.default}
_INDEX_OPS = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}


def _device_name(t: torch.Tensor) -> str:
    return str(sim_device()) if isinstance(t, SimTensor) else str(t.device)


def _mixed_device_error(func, names: set[str]) -> RuntimeError:
    a, b = sorted(names)[:2]
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, {a} and {b}! "
        f"(in {func}; simulated GPU: on a CUDA machine this line fails the same way)"
    )


def _check_devices(func, args: tuple, kwargs: dict) -> bool:
    """Raise as CUDA would on a device mix; return whether the result lives on the simulated GPU."""
    if func in _INDEX_OPS:
        self_ = args[0]
        if not isinstance(self_, SimTensor):
            indices = [t for t in _tensors(args[1], []) if isinstance(t, SimTensor)]
            if indices:
                raise RuntimeError(
                    "indices should be either on cpu or on the same device as the indexed tensor (cpu) "
                    "(simulated GPU: on a CUDA machine this line fails the same way)"
                )
        # index tensors may stay on the CPU; values of index_put must be on self's device
        tensors = _tensors(kwargs, _tensors((args[0], *args[2:]), []))
    else:
        tensors = _tensors(kwargs, _tensors(args, []))
    on_sim = [isinstance(t, SimTensor) for t in tensors]
    if any(on_sim) and not all(on_sim) and func not in _CROSS_DEVICE_OPS:
        # a CPU tensor of zero dimensions may sit beside a CUDA tensor (not the reverse)
        names = {_device_name(t) for t in tensors if isinstance(t, SimTensor) or t.dim() > 0}
        if len(names) > 1:
            raise _mixed_device_error(func, names)
    dev = kwargs.get("device")
    result_on_sim = _is_sim_device(dev) if dev is not None else any(on_sim)
    if func is aten._to_copy.default and dev is None:
        result_on_sim = isinstance(args[0], SimTensor)
    return result_on_sim


def _run(func, args: tuple, kwargs: dict) -> Any:
    """One ATen operation under the simulated GPU's rules: devices checked, computed on the wrapped CPU
    tensors, the result wrapped again where it lives on the simulated GPU."""
    result_on_sim = _check_devices(func, args, kwargs)
    if "device" in kwargs and _is_sim_device(kwargs["device"]):
        kwargs = dict(kwargs, device=torch.device("cpu"))
    out = func(*_unwrap(args), **_unwrap(kwargs))
    if func is aten.copy_.default:
        return args[0]
    if not result_on_sim:
        return out
    if isinstance(out, torch.Tensor) and args and isinstance(args[0], SimTensor) and out is args[0].elem:
        if out.shape == args[0].shape and out.stride() == args[0].stride():
            return args[0]  # in place: the same wrapper
        # an in-place op that changed the metadata (squeeze_ in matmul's 1-D case): a wrapper cannot change
        # its own sizes, so the result is a new one (a Python-level x.squeeze_() leaves x's shape stale)
        return SimTensor(out)
    return _wrap(out)


class _DispatchMode(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        # The FAKE slot: torch lets factory calls with an uninitialised device through to this mode.
        self._mode_key = torch._C._TorchDispatchModeKey.FAKE

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


def _to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    copy = kwargs.pop("copy", False)
    dev, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    if not _is_sim_device(dev):
        return None
    if isinstance(self, SimTensor) and (dtype is None or dtype == self.dtype) and not copy:
        return self
    return aten._to_copy(self, dtype=dtype, device=sim_device())


def _list_to_tensor(index: Any) -> Any:
    if not isinstance(index, list):
        return index
    return torch.tensor(index) if index else torch.tensor([], dtype=torch.long)


def _scalars_to_cpu(data: Any) -> Any:
    """``torch.tensor([gpu scalars])`` reads each scalar (a CPU tensor results, as on CUDA)."""
    if isinstance(data, SimTensor):
        return data.elem
    if isinstance(data, (list, tuple)):
        return type(data)(_scalars_to_cpu(x) for x in data)
    return data


_MATMULS = (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__)


def _matmul_with_a_vector(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """``a @ b`` when one side is a vector, written without the in-place squeeze_ that torch's own
    matmul applies to its result (a wrapper tensor cannot change its sizes in place)."""
    if a.dim() == 1 and b.dim() >= 2:
        return (a.unsqueeze(0) @ b).squeeze(-2)
    if b.dim() == 1 and a.dim() >= 2:
        return (a @ b.unsqueeze(-1)).squeeze(-1)
    return None


class _FunctionMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        generator = kwargs.get("generator")
        if generator is not None and not getattr(generator, "_sim", False) and (
            _is_sim_device(kwargs.get("device")) or (args and isinstance(args[0], SimTensor))
        ):  # checked here, where the generator is still the Python object that knows its device
            raise RuntimeError(
                f"Expected a '{NAME}' device type for generator but found 'cpu' (simulated GPU: on a CUDA "
                "machine a CPU generator cannot drive a random operation on the GPU either)"
            )
        if func in _MATMULS and not kwargs and any(isinstance(a, SimTensor) for a in args[:2]):
            product = _matmul_with_a_vector(*args[:2])
            if product is not None:
                return product
        if func is torch.nn.functional.linear and args and args[0].dim() == 1 and any(
            isinstance(a, SimTensor) for a in (*args, *kwargs.values())
        ):  # torch's own linear on a vector squeezes its result in place, as matmul does
            return func(args[0].unsqueeze(0), *args[1:], **kwargs).squeeze(0)
        if func is torch.Tensor.to:
            moved = _to(*args, **kwargs)
            if moved is not None:
                return moved
        elif func in (torch.tensor, torch.as_tensor):
            if func is torch.as_tensor and isinstance(args[0], SimTensor):
                return func(*args, **kwargs)
            data = _scalars_to_cpu(args[0])
            if not _is_sim_device(kwargs.get("device")):
                return func(data, *args[1:], **kwargs)
            on_cpu = func(data, *args[1:], **dict(kwargs, device="cpu"))
            return aten._to_copy(on_cpu, device=sim_device())
        elif func in (torch.Tensor.numpy, torch.Tensor.__array__) and isinstance(args[0], SimTensor):
            raise TypeError(
                f"can't convert {sim_device()} device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                "to host memory first. (simulated GPU: on a CUDA machine this fails the same way)"
            )
        elif func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and isinstance(args[0], SimTensor):
            # a list index becomes an index tensor on the CPU (allowed beside a GPU tensor, as on CUDA)
            index = args[1]
            index = tuple(map(_list_to_tensor, index)) if isinstance(index, tuple) else _list_to_tensor(index)
            return func(args[0], index, *args[2:], **kwargs)
        elif func == torch.Tensor.data.__set__ and isinstance(args[0], SimTensor):  # a new method-wrapper each time
            # `param.data = new` (what Module.to(dtype), .double(), .half() do) swaps the wrapper's metadata
            # only: the wrapped CPU tensor must follow, or the parameter computes in its old dtype
            func(*args, **kwargs)
            args[0].elem = args[1].elem if isinstance(args[1], SimTensor) else args[1]
            return None
        elif func is torch.Tensor.tolist and isinstance(args[0], SimTensor):
            return args[0].elem.tolist()
        elif func in (torch.Tensor.untyped_storage, torch.Tensor.data_ptr) and isinstance(args[0], SimTensor):
            return func(args[0].elem, *args[1:], **kwargs)
        return func(*args, **kwargs)


def _inference_as_no_grad_enter(self) -> None:
    self._inference_mode_context = torch.no_grad() if self.mode else contextlib.nullcontext()
    self._inference_mode_context.__enter__()


def _inference_as_no_grad_exit(self, *exc: Any) -> None:
    self._inference_mode_context.__exit__(*exc)


def install() -> torch.device:
    """Register the simulated GPU and turn it on for this thread (idempotent). Returns its device."""
    global _installed
    with _lock:
        if not _installed and torch._C._get_privateuse1_backend_name() != NAME:
            from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

            _setup_privateuseone_for_python_backend(NAME)
        if not _installed:
            torch.Generator = SimGenerator  # type: ignore[misc]
            # Wrapper tensors cannot be inference tensors: inference_mode runs as no_grad here.
            torch.autograd.grad_mode.inference_mode.__enter__ = _inference_as_no_grad_enter
            torch.autograd.grad_mode.inference_mode.__exit__ = _inference_as_no_grad_exit
            _installed = True
    stack = torch.utils._python_dispatch._get_current_dispatch_mode_stack()
    if not any(type(m).__name__ == "_DispatchMode" for m in stack):  # by name: survives a re-import
        _DispatchMode().__enter__()
        _FunctionMode().__enter__()
    return sim_device()


def is_installed() -> bool:
    return torch._C._get_privateuse1_backend_name() == NAME
