"""Mutation test of the checkers: small changes to every reference solution, each of which its checker
must reject.

Every exercise (``# %% exercise rlhf_tutorial.module:name`` in ``course/NN_*.py``) has a reference in its
module; the learner's part of it is the region between ``# >>> exercise`` and ``# <<< exercise`` (without
markers: every function or method body after its docstring, the part :func:`notebooks.stub_source`
replaces). Only the lines of that region are mutated, at the level of the syntax tree, one change per
mutant: an arithmetic, comparison or boolean operator swapped, a number changed (0 <-> 1, +-1, x2; a dim
or keepdim is a number too), ``.detach()`` or a clamp added to an assigned or returned value, a slice
bound moved by one, a statement removed, two arguments swapped, a keyword argument dropped, a reduction
or extremum swapped (``mean`` <-> ``sum``, ``min`` <-> ``max``...), a ``.detach()``, ``.clone()`` or
``torch.no_grad()`` taken away. Each mutant is the reference's source with that one change, executed in a
copy of the reference module's namespace (what the reference itself sees), and handed to the exercise's
checker (:func:`rlhf_tutorial.checks.run_check`), on the CPU, in a child process forked from one that
already ran the reference's check (its fixtures loaded). A child checks up to 20 mutants of one exercise
in turn, then the reference again: when that fails (a mutant changed state the checker shares), or the
child dies or hangs, its mutants are checked again one per child. A mutant past its time (10 s plus 20
times its reference's check) is stopped. The checker failing kills the mutant; so do a hang and a crash.
An added ``.detach()`` that never met a tensor requiring grad, or an added clamp that never changed a
value, during a check that passed, is *inert* (it did nothing to tell apart), counted but not a survivor.
Device keywords are not dropped: on the CPU that changes nothing.

A mutant that survives either is equivalent (it computes what the reference computes on every input the
contract allows: a tolerance doubled, a clamp that never binds) or shows a checker too weak. The
equivalent ones are listed, each with its reason, in a file (``tests/mutants_equivalent.txt``: one
mutant a line, its id then the reason; ``#`` starts a comment); the run fails on any other survivor and
reports listed ids that no longer survive (stale: the checker got stronger or the reference changed).

A mutant's id is ``exercise:L<line>:<operator>:<what>``: the line counted from the region's start (the
marker's line; ``R<k>L<line>`` in the k-th region when there are several), so an edit elsewhere in the
module, or in another exercise, leaves it unchanged. Enumeration is deterministic; ``--max-per-exercise``
samples with ``--seed``. Mutants that do not compile, whose source is the reference's, or whose source
another mutant of the same exercise already has, are skipped.

``python -m rlhf_tutorial mutate [--equivalents FILE ...] [--survivors-dir DIR] [--exercise NAME] [--jobs N]``
prints the unexpected survivors and stale entries, then one JSON summary on its last line, and exits 1
when there are any; ``make mutate`` (part of ``make test``) runs it. Against another checkout:
``PYTHONPATH=that/checkout python rlhf_tutorial/checks/mutants.py ...`` (its course and checkers).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import importlib
import inspect
import io
import json
import linecache
import os
import random
import select
import signal
import sys
import textwrap
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhf_tutorial import notebooks

DEFAULT_EQUIVALENTS = notebooks.ROOT / "tests" / "mutants_equivalent.txt"


# ----------------------------------------------------------------------------------------------------
# What is mutated: the exercise regions
# ----------------------------------------------------------------------------------------------------
@dataclass
class Target:
    """One exercise: its reference's source (dedented, markers kept as comments) and the line ranges
    (1-based, inclusive, in that source) of the learner's regions."""

    chapter: str
    name: str
    obj: Any
    source: str
    regions: list[tuple[int, int]]
    namespace: dict[str, Any]
    flags: int = 0

    @property
    def obj_name(self) -> str:
        return self.obj.__name__


def regions_of(source: str) -> list[tuple[int, int]]:
    """The learner's line ranges of a reference's source: between the exercise markers, else every
    function or method body after its docstring (what ``stub_source`` replaces)."""
    lines = source.splitlines()
    marked, start = [], None
    for i, line in enumerate(lines, start=1):
        if line.strip() == notebooks.BEGIN:
            start = i + 1
        elif line.strip() == notebooks.END and start is not None:
            marked.append((start, i - 1))
            start = None
    if marked:
        return [r for r in marked if r[0] <= r[1]]
    functions = notebooks.top_level_functions(ast.parse(source))
    regions = []
    for fn in sorted(functions, key=lambda f: f.lineno):
        body = fn.body
        if _is_docstring(body[0]):
            if len(body) == 1:
                continue
            body = body[1:]
        regions.append((body[0].lineno, fn.end_lineno))
    return regions


def _is_docstring(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def target_of(chapter: str, ref: str) -> Target:
    """The target of exercise reference ``ref`` ("module:name") in chapter ``chapter``."""
    obj = notebooks.resolve(ref)
    module = importlib.import_module(ref.partition(":")[0])
    return target_for(chapter, notebooks.exercise_name(ref), obj, module)


def target_for(chapter: str, name: str, obj: Any, module: Any) -> Target:
    source = textwrap.dedent(inspect.getsource(obj))
    future = getattr(module, "annotations", None)
    flags = getattr(future, "compiler_flag", 0) if future is not None and hasattr(future, "compiler_flag") else 0
    return Target(chapter, name, obj, source, regions_of(source), dict(vars(module)), flags)


def course_targets(chapters: list[str] | None = None, names: list[str] | None = None) -> list[Target]:
    """Every exercise of the course (optionally only these chapters' stems / exercise names), in order."""
    targets = []
    for src in notebooks.sources():
        if chapters and src.stem not in chapters:
            continue
        for cell in notebooks.parse_source(src.read_text()):
            if cell.kind != "exercise":
                continue
            for ref in cell.refs:
                if names and notebooks.exercise_name(ref) not in names:
                    continue
                targets.append(target_of(src.stem, ref))
    return targets


# ----------------------------------------------------------------------------------------------------
# How: the mutation operators
# ----------------------------------------------------------------------------------------------------
BINOP_SWAPS: dict[type, tuple[type, ...]] = {
    ast.Add: (ast.Sub,), ast.Sub: (ast.Add,), ast.Mult: (ast.Div,), ast.Div: (ast.Mult,),
    ast.FloorDiv: (ast.Div,), ast.Mod: (ast.FloorDiv,), ast.Pow: (ast.Mult,),
    ast.BitAnd: (ast.BitOr,), ast.BitOr: (ast.BitAnd,),
}
CMP_SWAPS: dict[type, tuple[type, ...]] = {
    ast.Lt: (ast.LtE, ast.Gt), ast.LtE: (ast.Lt,), ast.Gt: (ast.GtE, ast.Lt), ast.GtE: (ast.Gt,),
    ast.Eq: (ast.NotEq,), ast.NotEq: (ast.Eq,), ast.Is: (ast.IsNot,), ast.IsNot: (ast.Is,),
    ast.In: (ast.NotIn,), ast.NotIn: (ast.In,),
}
#: functions and methods a learner confuses with each other (attribute or plain name)
CALL_SWAPS = {
    "min": "max", "max": "min", "minimum": "maximum", "maximum": "minimum", "amin": "amax", "amax": "amin",
    "argmin": "argmax", "argmax": "argmin", "mean": "sum", "sum": "mean", "softmax": "log_softmax",
    "log_softmax": "softmax", "any": "all", "all": "any", "floor": "ceil", "ceil": "floor",
    "logsigmoid": "sigmoid", "sigmoid": "logsigmoid", "zeros_like": "ones_like", "ones_like": "zeros_like",
    "std": "var", "var": "std", "cumsum": "cumprod",
}
#: calls whose removal (``x.detach()`` -> ``x``) is a realistic mistake
DROPPED_CALLS = ("detach", "clone", "float", "contiguous")
CLAMP = (-10.0, 10.0)


@dataclass(frozen=True)
class Site:
    """One mutation, before it is applied: the node (its index in ``ast.walk`` order of the parsed
    source), the operator and what it does, and how to build the replacement."""

    index: int
    op: str
    what: str
    build: Callable[[ast.AST], ast.AST | list[ast.stmt]]
    col: tuple[int, int]


@dataclass
class Mutant:
    target: Target
    id: str
    op: str
    line: int  # in the target's source
    before: str
    after: str
    source: str
    code: Any = None


def _in_region(node: ast.AST, regions: list[tuple[int, int]]) -> int | None:
    lineno, end = getattr(node, "lineno", None), getattr(node, "end_lineno", None)
    if lineno is None:
        return None
    for k, (a, b) in enumerate(regions):
        if a <= lineno and end <= b:
            return k
    return None


def _number(node: ast.AST) -> float | int | None:
    """The value of a numeric literal (a negative one is ``-`` applied to a constant), else None."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant)
            and type(node.operand.value) in (int, float)):
        return -node.operand.value
    return None


def _literal(value: float | int) -> ast.expr:
    if value < 0:
        return ast.UnaryOp(ast.USub(), ast.Constant(-value))
    return ast.Constant(value)


def _number_changes(value: float | int) -> list[float | int]:
    out: list[float | int] = []
    for new in ([1] if value == 0 else []) + ([0] if value == 1 else []) + [value + 1, value - 1, value * 2]:
        new = type(value)(new)
        if new != value and new not in out:
            out.append(new)
    return out


def _skipped_subtrees(tree: ast.AST) -> set[int]:
    """Nodes never mutated: annotations, f-strings, docstrings, and what is inside them."""
    skip: set[int] = set()

    def mark(node: ast.AST | None) -> None:
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mark(node.returns)
            for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
                mark(a.annotation)
        elif isinstance(node, ast.AnnAssign):
            mark(node.annotation)
        elif isinstance(node, ast.JoinedStr):
            mark(node)
        elif _is_docstring(node):
            mark(node)
    return skip


def sites(tree: ast.AST, regions: list[tuple[int, int]]) -> Iterator[Site]:
    """Every mutation of the nodes inside ``regions``, in ``ast.walk`` order."""
    skip = _skipped_subtrees(tree)
    negated_constants = {id(n.operand) for n in ast.walk(tree)
                         if isinstance(n, ast.UnaryOp) and _number(n) is not None}
    for index, node in enumerate(ast.walk(tree)):
        if id(node) in skip or _in_region(node, regions) is None:
            continue
        col = (node.lineno, node.col_offset)

        def site(op: str, what: str, build: Callable, _i: int = index, _c: tuple = col) -> Site:
            return Site(_i, op, what, build, _c)

        if isinstance(node, ast.BinOp):
            for new in BINOP_SWAPS.get(type(node.op), ()):
                yield site("binop", f"{type(node.op).__name__}->{new.__name__}",
                           lambda n, new=new: ast.BinOp(n.left, new(), n.right))
            if isinstance(node.op, (ast.Sub, ast.Div)):
                yield site("swap", f"operands-{type(node.op).__name__}", lambda n: ast.BinOp(n.right, n.op, n.left))
        elif isinstance(node, ast.AugAssign):
            for new in BINOP_SWAPS.get(type(node.op), ()):
                yield site("binop", f"{type(node.op).__name__}=->{new.__name__}=",
                           lambda n, new=new: ast.AugAssign(n.target, new(), n.value))
        elif isinstance(node, ast.Compare):
            for k, cmp in enumerate(node.ops):
                for new in CMP_SWAPS.get(type(cmp), ()):
                    def build(n, k=k, new=new):
                        ops = list(n.ops)
                        ops[k] = new()
                        return ast.Compare(n.left, ops, n.comparators)
                    yield site("cmp", f"{type(cmp).__name__}->{new.__name__}", build)
        elif isinstance(node, ast.BoolOp):
            new = ast.Or if isinstance(node.op, ast.And) else ast.And
            yield site("boolop", f"{type(node.op).__name__}->{new.__name__}", lambda n, new=new: ast.BoolOp(new(), n.values))
        elif isinstance(node, ast.UnaryOp) and _number(node) is None and not isinstance(node.op, ast.UAdd):
            yield site("unary", f"drop-{type(node.op).__name__}", lambda n: n.operand)
        if (_number(node) is not None and id(node) not in negated_constants):
            value = _number(node)
            for new in _number_changes(value):
                yield site("const", f"{value!r}->{new!r}", lambda n, new=new: _literal(new))
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            yield site("const", f"{node.value}->{not node.value}", lambda n: ast.Constant(not n.value))
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return)) and node.value is not None:
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            for k, value in enumerate(values):
                if _number(value) is not None or isinstance(value, ast.Constant):
                    continue
                tag = f"[{k}]" if len(values) > 1 else ""
                yield site("detach", f"detach{tag}", lambda n, k=k: _wrap_value(n, k, "detach", []))
                yield site("clamp", f"clamp{tag}", lambda n, k=k: _wrap_value(
                    n, k, "clamp", [ast.Constant(CLAMP[0]), ast.Constant(CLAMP[1])]))
        if isinstance(node, ast.Slice):
            for bound in ("lower", "upper"):
                value = getattr(node, bound)
                if value is None:
                    new_value = 1 if bound == "lower" else -1
                    yield site("slice", f"{bound}={new_value}",
                               lambda n, b=bound, v=new_value: _slice_with(n, b, _literal(v)))
                elif _number(value) is None:
                    for delta, sign in ((1, ast.Add), (1, ast.Sub)):
                        yield site("slice", f"{bound}{'+' if sign is ast.Add else '-'}{delta}",
                                   lambda n, b=bound, s=sign, d=delta: _slice_with(
                                       n, b, ast.BinOp(getattr(n, b), s(), ast.Constant(d))))
        if isinstance(node, ast.stmt) and not _is_docstring(node):
            yield site("stmt", f"remove-{type(node).__name__}", lambda n: ast.Pass())
            if isinstance(node, ast.With) and any(_is_no_grad(item.context_expr) for item in node.items):
                yield site("nograd", "drop-no_grad", lambda n: n.body)
        if isinstance(node, ast.Call):
            positional = [a for a in node.args if not isinstance(a, ast.Starred)]
            if len(positional) == len(node.args):
                for k in range(len(node.args) - 1):
                    if ast.dump(node.args[k]) != ast.dump(node.args[k + 1]):
                        yield site("args", f"swap-{k}-{k + 1}", lambda n, k=k: _swap_args(n, k))
            for kw in node.keywords:
                if kw.arg is not None and kw.arg != "device":  # on the CPU, where this runs, a no-op
                    yield site("kw", f"drop-{kw.arg}", lambda n, a=kw.arg: ast.Call(
                        n.func, n.args, [w for w in n.keywords if w.arg != a]))
            fname = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if fname in CALL_SWAPS:
                yield site("call", f"{fname}->{CALL_SWAPS[fname]}", lambda n, new=CALL_SWAPS[fname]: ast.Call(
                    _renamed(n.func, new), n.args, n.keywords))
            if (isinstance(node.func, ast.Attribute) and node.func.attr in DROPPED_CALLS and not node.args
                    and not node.keywords):
                yield site("call", f"drop-{node.func.attr}", lambda n: n.func.value)


def _is_no_grad(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Call) and getattr(expr.func, "attr", getattr(expr.func, "id", None)) in {
        "no_grad", "inference_mode"}


def _renamed(func: ast.expr, name: str) -> ast.expr:
    if isinstance(func, ast.Attribute):
        return ast.Attribute(func.value, name, func.ctx)
    return ast.Name(name, func.ctx)


def _swap_args(call: ast.Call, k: int) -> ast.Call:
    args = list(call.args)
    args[k], args[k + 1] = args[k + 1], args[k]
    return ast.Call(call.func, args, call.keywords)


def _slice_with(node: ast.Slice, bound: str, value: ast.expr) -> ast.Slice:
    new = ast.Slice(node.lower, node.upper, node.step)
    setattr(new, bound, value)
    return new


def _wrap_value(stmt: ast.stmt, k: int, method: str, args: list[ast.expr]) -> ast.stmt:
    new = copy.copy(stmt)

    def wrap(value: ast.expr) -> ast.expr:
        call = ast.Call(ast.Attribute(value, method, ast.Load()), args, [])
        call.mutant_probe = method  # run through a probe that sees whether it changes anything
        return call

    if isinstance(stmt.value, ast.Tuple):
        elts = list(stmt.value.elts)
        elts[k] = wrap(elts[k])
        new.value = ast.Tuple(elts, ast.Load())
    else:
        new.value = wrap(stmt.value)
    return new


class _Probed(ast.NodeTransformer):
    """``x.detach()`` / ``x.clamp(a, b)`` added by a mutation -> ``__mutant_detach__(x)`` /
    ``__mutant_clamp__(x, a, b)``: the same result, and a record of whether it changed anything."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        method = getattr(node, "mutant_probe", None)
        if method is None:
            return node
        return ast.copy_location(ast.Call(ast.Name(f"__mutant_{method}__", ast.Load()), [node.func.value, *node.args], []),
                                 node)


#: whether this process's probe changed a value (a mutant whose probe never did is inert on the check)
FIRED: list[bool] = []


def _probe_detach(value: Any) -> Any:
    out = value.detach()
    if getattr(value, "requires_grad", False):
        FIRED.append(True)
    return out


def _probe_clamp(value: Any, low: float, high: float) -> Any:
    import torch

    out = value.clamp(low, high)
    if isinstance(value, torch.Tensor) and bool((out != value).any()):
        FIRED.append(True)
    return out


PROBES = {"__mutant_detach__": _probe_detach, "__mutant_clamp__": _probe_clamp}


def _replace(tree: ast.AST, old: ast.AST, new: ast.AST | list[ast.stmt]) -> None:
    for parent in ast.walk(tree):
        for name, value in ast.iter_fields(parent):
            if isinstance(value, list) and any(v is old for v in value):
                i = next(i for i, v in enumerate(value) if v is old)
                value[i:i + 1] = new if isinstance(new, list) else [new]
                return
            if value is old:
                setattr(parent, name, new)
                return
    raise ValueError("node not found")


def _statement_of(tree: ast.AST) -> dict[int, int]:
    """``ast.walk`` index of each node -> that of the innermost statement holding it (itself, for one)."""
    index = {id(n): i for i, n in enumerate(ast.walk(tree))}
    out: dict[int, int] = {}

    def visit(node: ast.AST, current: int) -> None:
        if isinstance(node, ast.stmt):
            current = index[id(node)]
        out[index[id(node)]] = current
        for child in ast.iter_child_nodes(node):
            visit(child, current)

    visit(tree, 0)
    return out


def _first_line(node: ast.AST | None) -> str:
    if node is None:
        return ""
    if isinstance(node, (ast.For, ast.While, ast.If, ast.With)):  # the header, not the body
        shallow = copy.copy(node)
        shallow.body = [ast.Expr(ast.Constant(...))]
        if hasattr(shallow, "orelse"):
            shallow.orelse = []
        return ast.unparse(shallow).splitlines()[0]
    return ast.unparse(node).splitlines()[0]


def mutants_of(target: Target, skipped: Counter | None = None) -> list[Mutant]:
    """Every mutant of ``target``, in a deterministic order, each with its stable id."""
    skipped = skipped if skipped is not None else Counter()
    tree = ast.parse(target.source)
    original = ast.unparse(tree)
    seen = {original}
    nodes = list(ast.walk(tree))
    raw = [(s, _in_region(nodes[s.index], target.regions)) for s in sites(tree, target.regions)]
    # ids: the line from the start of its region (the marker's line is 0), the operator, what it does;
    # a second identical change on the same line gets #2, #3 by column
    keyed: dict[tuple, list[Site]] = defaultdict(list)
    for s, region in raw:
        start = target.regions[region][0] - 1
        loc = (f"R{region}" if region else "") + f"L{s.col[0] - start}"
        keyed[(loc, s.op, s.what)].append(s)
    ids: dict[int, str] = {}
    for (loc, op, what), group in keyed.items():
        for n, s in enumerate(sorted(group, key=lambda s: s.col), start=1):
            ids[id(s)] = f"{target.name}:{loc}:{op}:{what}" + (f"#{n}" if n > 1 else "")
    raw.sort(key=lambda pair: (pair[1], pair[0].col, pair[0].index))
    statement_of = _statement_of(tree)
    out = []
    for s, _ in raw:
        mutated = copy.deepcopy(tree)
        mnodes = list(ast.walk(mutated))
        node = mnodes[s.index]
        stmt = mnodes[statement_of[s.index]]
        before = _first_line(nodes[statement_of[s.index]])
        try:
            new = s.build(node)
            if isinstance(new, ast.AST):
                ast.copy_location(new, node)
            _replace(mutated, node, new)
            ast.fix_missing_locations(mutated)
            source = ast.unparse(mutated)
        except Exception:  # noqa: BLE001 - a mutation that cannot be written out is no mutant
            skipped["unbuildable"] += 1
            continue
        if source == original:
            skipped["same source"] += 1
            continue
        if source in seen:
            skipped["duplicate"] += 1
            continue
        seen.add(source)
        after = "(removed)" if s.op == "stmt" else _first_line(stmt if stmt is not node else new)
        if s.op == "nograd":
            after = "(its body, without no_grad)"
        try:
            code = compile(ast.unparse(_Probed().visit(mutated)), f"<mutant {ids[id(s)]}>", "exec",
                           flags=target.flags, dont_inherit=True)
        except SyntaxError:
            skipped["does not compile"] += 1
            continue
        out.append(Mutant(target, ids[id(s)], s.op, s.col[0], before, after, source, code))
    return out


# ----------------------------------------------------------------------------------------------------
# Running them
# ----------------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    mutant: Mutant
    killed: bool
    why: str  # the checker's first line, "timeout", "crashed ..."
    seconds: float
    inert: bool = False  # passed, and its added detach/clamp never changed a value during the check


def build_mutant(mutant: Mutant) -> Any:
    """The mutated object, defined in a copy of its reference module's namespace."""
    namespace = dict(mutant.target.namespace, **PROBES)
    filename = f"<mutant {mutant.id}>"
    linecache.cache[filename] = (len(mutant.source), None, mutant.source.splitlines(True), filename)
    exec(mutant.code, namespace)  # noqa: S102 - the reference's own source, changed by one node
    return namespace[mutant.target.obj_name]


def checker_verdict(name: str, candidate: Any) -> tuple[bool, str]:
    """``(passed, first line of the message)`` of exercise ``name``'s checker on ``candidate``."""
    from rlhf_tutorial.checks import run_check

    result = run_check(name, candidate)
    return result.passed, (result.message.strip().splitlines() or [""])[0][:200]


Check = Callable[[str, Any], "tuple[bool, str]"]


class _Timeout(BaseException):
    """Raised in a child by its alarm: past a mutant's time (a BaseException: no checker catches it)."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _Timeout


def _verdict(mutant: Mutant, check: Check) -> dict:
    FIRED.clear()
    try:
        candidate = build_mutant(mutant)
    except Exception as exc:  # noqa: BLE001 - a definition the reference's module cannot run
        return {"killed": True, "why": f"defining it raised {type(exc).__name__}"}
    passed, message = check(mutant.target.name, candidate)
    return {"killed": not passed, "why": message,
            "inert": passed and mutant.op in ("detach", "clamp") and not FIRED}


def _child(batch: list[Mutant], check: Check, write_fd: int, limits: list[float]) -> None:
    """Check ``batch`` (mutants of one exercise) one after the other, a JSON line per verdict; after a
    batch of several, the reference's own verdict (a mutant that changed state the checker shares, a
    cached fixture say, makes the batch's verdicts untrustworthy: the parent then checks each alone)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        signal.signal(signal.SIGALRM, _on_alarm)
        for index, (mutant, limit) in enumerate(zip(batch, limits)):
            signal.setitimer(signal.ITIMER_REAL, limit)
            try:
                verdict = _verdict(mutant, check)
            except _Timeout:
                verdict = {"killed": True, "why": "timeout"}
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            verdict["index"] = index
            os.write(write_fd, (json.dumps(verdict)[:20000] + "\n").encode())
            if verdict["why"] == "timeout" and len(batch) > 1:
                return  # state left mid-check: the parent checks the rest anew
        if len(batch) > 1:
            target = batch[0].target
            signal.setitimer(signal.ITIMER_REAL, limits[0])
            try:
                passed, _ = check(target.name, target.obj)
            except _Timeout:
                passed = False
            os.write(write_fd, (json.dumps({"reference": passed}) + "\n").encode())
    finally:
        os._exit(0)


def batches(mutants: list[Mutant], size: int) -> list[list[Mutant]]:
    """Consecutive mutants of one exercise, at most ``size`` together."""
    out: list[list[Mutant]] = []
    for m in mutants:
        if out and len(out[-1]) < size and out[-1][0].target is m.target:
            out[-1].append(m)
        else:
            out.append([m])
    return out


def run_mutants(mutants: list[Mutant], check: Check = checker_verdict, jobs: int = 1,
                timeout: dict[str, float] | float = 60.0, progress: Callable[[Outcome], None] | None = None,
                batch: int = 20) -> list[Outcome]:
    """Check every mutant in child processes forked from this one (``jobs`` at a time), each child a batch
    of up to ``batch`` mutants of one exercise. A mutant that runs past its exercise's ``timeout`` is
    stopped and counts as killed (a learner would see it hang); one that kills its process, too. When a
    batch's child dies, hangs or leaves the reference failing its checker, its unsettled mutants are
    checked again one per child."""
    pending = batches(list(mutants), max(1, batch))[::-1]
    running: dict[int, dict] = {}  # read fd -> {batch, pid, start, data, done: {index: verdict}}
    outcomes: list[Outcome] = []

    def settle(mutant: Mutant, verdict: dict, seconds: float) -> None:
        outcomes.append(Outcome(mutant, bool(verdict["killed"]), str(verdict["why"]), seconds,
                                bool(verdict.get("inert"))))
        if progress:
            progress(outcomes[-1])

    sys.stdout.flush()
    sys.stderr.flush()
    while pending or running:
        while pending and len(running) < max(1, jobs):
            group = pending.pop()
            limits = [_limit(timeout, m.target.name) for m in group]
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read_fd)
                _child(group, check, write_fd, limits)
            os.close(write_fd)
            running[read_fd] = {"batch": group, "pid": pid, "start": time.monotonic(), "data": b"",
                                "done": {}, "reference": None, "deadline": time.monotonic() + sum(limits) + 5}
        now = time.monotonic()
        wait = max(0.0, min(r["deadline"] for r in running.values()) - now)
        ready, _, _ = select.select(list(running), [], [], wait)
        for fd in ready:
            run = running[fd]
            chunk = os.read(fd, 65536)
            run["data"] += chunk
            *lines, run["data"] = run["data"].split(b"\n")
            for line in lines:
                message = json.loads(line)
                if "reference" in message:
                    run["reference"] = message["reference"]
                else:
                    run["done"][message["index"]] = message
            if chunk:
                continue
            del running[fd]
            os.close(fd)
            _, status = os.waitpid(run["pid"], 0)
            _finish(run, f"crashed ({_status(status)})", pending, settle)
        now = time.monotonic()
        for fd, run in list(running.items()):
            if now > run["deadline"]:
                os.kill(run["pid"], signal.SIGKILL)
                os.waitpid(run["pid"], 0)
                os.close(fd)
                del running[fd]
                _finish(run, "timeout", pending, settle)
    order = {id(m): i for i, m in enumerate(mutants)}
    return sorted(outcomes, key=lambda o: order[id(o.mutant)])


def _finish(run: dict, failure: str, pending: list[list[Mutant]], settle: Callable) -> None:
    """Settle a finished child's mutants: all of them when it ran through; else (it died, hung, or its
    reference failed after the batch) the ones it settled before the first unsettled one are kept when the
    reference was not found failing, and the rest go back, one per child. A lone mutant is settled
    whatever happened: ``failure`` names how its child ended."""
    group, done = run["batch"], run["done"]
    seconds = (time.monotonic() - run["start"]) / max(1, len(group))
    if len(group) == 1:
        settle(group[0], done.get(0, {"killed": True, "why": failure}), seconds)
        return
    trusted = run["reference"] is not False
    kept = 0
    while trusted and kept in done and done[kept]["why"] != "timeout":
        kept += 1
    if kept < len(group) and kept in done and trusted:  # a timeout: that mutant is settled, killed
        kept += 1
    for index, mutant in enumerate(group):
        if index < kept:
            settle(mutant, done[index], seconds)
        else:
            pending.append([mutant])


def _limit(timeout: dict[str, float] | float, name: str) -> float:
    return timeout.get(name, 60.0) if isinstance(timeout, dict) else float(timeout)


def _status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit {os.WEXITSTATUS(status)}"


# ----------------------------------------------------------------------------------------------------
# The list of equivalent mutants
# ----------------------------------------------------------------------------------------------------
def read_equivalents(path: Path) -> dict[str, str]:
    """``{id: reason}`` from a list file: one mutant a line, its id, then its reason (required), apart
    or after a ``|``; blank lines and ``#`` comments are ignored."""
    out: dict[str, str] = {}
    if not path.exists():
        return out
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        mutant_id, _, reason = line.partition(" ")
        reason = reason.strip().removeprefix("|").strip()
        if not reason:
            raise ValueError(f"{path}:{number}: the equivalent mutant {mutant_id} has no reason")
        out[mutant_id] = reason
    return out


@dataclass
class Report:
    outcomes: list[Outcome]
    equivalents: dict[str, str]
    targets: list[Target]
    skipped: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # this process's and its children's, user + system
    broken: list[str] = field(default_factory=list)  # references their own checker rejects

    @property
    def survivors(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.killed and not o.inert]

    @property
    def inert(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.inert]

    @property
    def unexpected(self) -> list[Outcome]:
        return [o for o in self.survivors if o.mutant.id not in self.equivalents]

    @property
    def stale(self) -> list[str]:
        """Listed ids of the exercises run that are no longer surviving mutants."""
        run = {t.name for t in self.targets}
        surviving = {o.mutant.id for o in self.survivors}
        return sorted(i for i in self.equivalents if i.partition(":")[0] in run and i not in surviving)

    def summary(self) -> dict:
        chapters: dict[str, dict[str, int]] = {}
        for o in self.outcomes:
            c = chapters.setdefault(o.mutant.target.chapter, {"mutants": 0, "killed": 0, "inert": 0,
                                                                  "survivors": 0, "equivalent": 0, "unexpected": 0})
            c["mutants"] += 1
            if o.killed or o.inert:
                c["killed" if o.killed else "inert"] += 1
            else:
                c["survivors"] += 1
                c["equivalent" if o.mutant.id in self.equivalents else "unexpected"] += 1
        return {
            "exercises": len(self.targets),
            "mutants": len(self.outcomes),
            "killed": sum(o.killed for o in self.outcomes),
            "inert": len(self.inert),
            "survivors": len(self.survivors),
            "equivalent": len(self.survivors) - len(self.unexpected),
            "unexpected": [o.mutant.id for o in self.unexpected],
            "stale": self.stale,
            "timeouts": sum(o.why == "timeout" for o in self.outcomes),
            "skipped": dict(sorted(self.skipped.items())),
            "broken_references": self.broken,
            "per_chapter": chapters,
            "seconds": round(self.seconds, 1),
            "cpu_seconds": round(self.cpu_seconds, 1),
            "passed": not self.unexpected and not self.stale and not self.broken,
        }


def survivor_line(o: Outcome) -> str:
    return f"{o.mutant.id}  |  {o.mutant.before}  ->  {o.mutant.after}"


def write_survivors(report: Report, folder: Path) -> list[Path]:
    """One file per chapter run, ``<chapter stem>.txt``: a line per survivor (id | line -> mutated line);
    listed equivalents are marked with their reason."""
    folder.mkdir(parents=True, exist_ok=True)
    by_chapter: dict[str, list[Outcome]] = {t.chapter: [] for t in report.targets}
    for o in report.survivors:
        by_chapter[o.mutant.target.chapter].append(o)
    written = []
    for chapter, outcomes in by_chapter.items():
        path = folder / f"{chapter}.txt"
        lines = []
        for o in outcomes:
            line = survivor_line(o)
            if o.mutant.id in report.equivalents:
                line += f"  |  listed equivalent: {report.equivalents[o.mutant.id]}"
            lines.append(line)
        path.write_text("\n".join(lines) + ("\n" if lines else ""))
        written.append(path)
    return written


EQUIVALENTS_HEADER = """\
# Equivalent mutants of the checkers' mutation test (make mutate; rlhf_tutorial/checks/mutants.py):
# one a line, its id then why it computes what the reference computes on every input the contract
# allows. `python -m rlhf_tutorial mutate` fails on a survivor not listed here, and names listed ids
# that no longer survive (remove those). Ids: exercise:L<line from the exercise marker>:<operator>:<what>.
"""


def write_equivalents(report: Report, path: Path) -> int:
    """Write the list of equivalents as this run leaves it: every listed survivor with its reason, in
    course order (stale entries dropped; unlisted survivors are not added: each needs a reason)."""
    kept = [o for o in report.survivors if o.mutant.id in report.equivalents]
    chapters: dict[str, list[str]] = {}
    for o in kept:
        chapters.setdefault(o.mutant.target.chapter, []).append(f"{o.mutant.id}  {report.equivalents[o.mutant.id]}")
    body = "".join(f"\n# {chapter}\n" + "".join(line + "\n" for line in lines) for chapter, lines in chapters.items())
    path.write_text(EQUIVALENTS_HEADER + body)
    return len(kept)


def run(targets: list[Target], equivalents: dict[str, str], jobs: int = 1, timeout: float = 10.0,
        max_per_exercise: int = 0, seed: int = 0, check: Check = checker_verdict,
        progress: Callable[[Outcome], None] | None = None, batch: int = 20) -> Report:
    """Mutate every target, check every mutant; a target whose reference fails its own checker is
    reported (``broken``) and not mutated. Each exercise's timeout is ``timeout`` plus 20 times its
    reference's check."""
    started, cpu_started = time.monotonic(), _cpu_seconds()
    skipped: Counter = Counter()
    all_mutants: list[Mutant] = []
    limits: dict[str, float] = {}
    broken = []
    for target in targets:
        t0 = time.monotonic()
        with contextlib.redirect_stdout(io.StringIO()):  # what loading models prints
            passed, message = check(target.name, target.obj)  # also loads its fixtures before the forks
        limits[target.name] = timeout + 20 * (time.monotonic() - t0)
        if not passed:
            broken.append(f"{target.name}: {message}")
            continue
        mutants = mutants_of(target, skipped)
        if max_per_exercise and len(mutants) > max_per_exercise:
            rng = random.Random(seed + zlib.crc32(target.name.encode()))
            keep = set(rng.sample(range(len(mutants)), max_per_exercise))
            skipped["over the cap"] += len(mutants) - max_per_exercise
            mutants = [m for i, m in enumerate(mutants) if i in keep]
        all_mutants += mutants
    outcomes = run_mutants(all_mutants, check, jobs, limits, progress, batch)
    return Report(outcomes, equivalents, targets, skipped, time.monotonic() - started,
                  _cpu_seconds() - cpu_started, broken)


def _cpu_seconds() -> float:
    import resource

    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def main(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(prog="python -m rlhf_tutorial mutate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--equivalents", type=Path, action="append",
                        help="a list of equivalent mutants (repeatable; default: tests/mutants_equivalent.txt)")
    parser.add_argument("--survivors-dir", type=Path, help="write <chapter>.txt there: one line per survivor")
    parser.add_argument("--exercise", action="append", help="only this exercise (repeatable)")
    parser.add_argument("--chapter", action="append", help="only this chapter's stem, e.g. 01_ppo (repeatable)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="mutants checked at once")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="seconds per mutant, plus 20 times its reference's check")
    parser.add_argument("--batch", type=int, default=20,
                        help="mutants of one exercise checked one after the other in one child (1: each alone)")
    parser.add_argument("--max-per-exercise", type=int, default=0, help="sample this many per exercise (0: all)")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed")
    parser.add_argument("--write-equivalents", type=Path,
                        help="write there the listed equivalents that survived, with their reasons (stale ones dropped)")
    parser.add_argument("--list", action="store_true", help="only list the mutants (id | line -> mutated)")
    parser.add_argument("--verbose", action="store_true", help="a line per mutant checked, on stderr")
    args = parser.parse_args(argv)
    # On the CPU always: children are forked, and CUDA does not survive a fork (a mutant's checker on the
    # GPU would fail for that alone). What only the GPU pass of a checker sees is not mutated (below).
    os.environ["RLHF_TUTORIAL_DEVICE"] = "cpu"
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread per forked child; --jobs children at a time
    try:
        return _main(args)
    finally:
        torch.set_num_threads(threads)


def _main(args: argparse.Namespace) -> dict:
    targets = course_targets(args.chapter, args.exercise)
    if args.exercise and len(targets) < len(set(args.exercise)):
        raise SystemExit(f"no such exercise: {sorted(set(args.exercise) - {t.name for t in targets})}")
    if args.list:
        skipped: Counter = Counter()
        listed = [m for t in targets for m in mutants_of(t, skipped)]
        for m in listed:
            print(f"{m.id}  |  {m.before}  ->  {m.after}")
        return {"mutants": len(listed), "skipped": dict(skipped)}
    lists = args.equivalents or [DEFAULT_EQUIVALENTS]
    equivalents = {i: r for path in lists for i, r in read_equivalents(path).items()}
    named = " + ".join(map(str, lists))

    def progress(o: Outcome) -> None:
        print(f"{'killed  ' if o.killed else 'inert   ' if o.inert else 'SURVIVED'} {o.seconds:6.2f}s {o.mutant.id}  {o.why[:80]}",
              file=sys.stderr, flush=True)

    report = run(targets, equivalents, args.jobs, args.timeout, args.max_per_exercise, args.seed,
                 progress=progress if args.verbose else None, batch=args.batch)
    summary = report.summary()
    if args.write_equivalents:
        summary["equivalents_written"] = write_equivalents(report, args.write_equivalents)
    if args.survivors_dir:
        summary["survivors_files"] = [str(p) for p in write_survivors(report, args.survivors_dir)]
    if not summary["passed"]:
        if report.broken:
            print("references their own checker rejects:\n  " + "\n  ".join(report.broken))
        if report.unexpected:
            print(f"{len(report.unexpected)} mutant(s) survived that {named} does not list as "
                  "equivalent (each: a checker to strengthen, or an equivalent mutant to list with its reason):")
            for o in report.unexpected:
                print("  " + survivor_line(o))
        if report.stale:
            print(f"{len(report.stale)} listed equivalent(s) no longer survive (remove them from "
                  f"{named}):\n  " + "\n  ".join(report.stale))
        print(json.dumps(summary, sort_keys=True))
        raise SystemExit(1)
    return summary


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), sort_keys=True))
