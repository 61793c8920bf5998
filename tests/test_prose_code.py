"""Every code suggestion in the prose runs: the chapters' markdown (``course/*.py``) and the README.

A learner copies what the text tells them to type. This module extracts every inline code span and
fenced block of the prose and checks what can be checked without training anything:

- a command line (``python -m rlhf_tutorial CMD ...``, or ``CMD --flag ...`` for a command of the CLI)
  parses with that command's real parser (its ``parse_args`` is stopped right after a successful parse,
  so nothing runs); a snippet of flags alone (``--kl-coef 0.001``) parses for some command;
- a ``*Args(...)`` / ``*Args.preset(...)`` expression constructs, and ``*Args.name`` exists;
- a fragment of keyword arguments (``loss_type="dr_grpo", scale="none"``) names fields of a trainer's
  ``*Args`` (and then constructs it), or parameters of a function of the package or of the library the
  prose is talking about;
- a call of a function ``name(a, b, k=v)`` names something that exists (in the chapter's imports, the
  package, torch, or a short list of names the prose uses for other things), and its arguments bind to
  that function's signature;
- a dotted name ``rlhf_tutorial.x.y`` (or ``trainers.x.y``) resolves;
- a fenced Python block compiles, and its ``rlhf_tutorial`` imports resolve.

The checkers are tested on wrong snippets written here (the first one is the sentence chapter 06 once
had: ``clip_eps`` is the loss function's name, ``GRPOArgs`` calls it ``clip_coef``).
"""

from __future__ import annotations

import argparse
import ast
import builtins
import contextlib
import dataclasses
import importlib
import inspect
import io
import pkgutil
import re
import shlex
from functools import cache
from pathlib import Path

import pytest
import torch

import rlhf_tutorial
from rlhf_tutorial.cli import COMMANDS, pop_device
from rlhf_tutorial.notebooks import parse_source, sources

# cpu_only: it parses the prose's code and command lines against the CLI's parsers; no model and no
# device is involved, so on the simulated GPU it would repeat `make unit` exactly.
pytestmark = pytest.mark.cpu_only

ROOT = Path(__file__).resolve().parents[1]

FENCE = re.compile(r"^```([\w-]*)[ \t]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)*)`(?!`)")

#: Placeholders the prose writes in command lines, and what stands in for them here.
PLACEHOLDERS = {"S": "0", "DIR": "some_dir", "NAME": "name"}

#: Callables the prose names that are not the course's own functions (a hook's signature, TRL's reward
#: function, methods of torch / transformers objects, pseudo-code of a layer): their names are not
#: looked up, their arguments not bound.
NOT_COURSE_CALLABLES = {
    "fn", "reward", "forward", "backward", "train", "zero_grad", "requires_grad_", "value_head", "step",
    "Categorical", "Sequential", "GRPOTrainer", "raise", "clone", "float", "split", "mean", "squeeze",
    "generate", "run_with_cache", "run_with_hooks", "batch_decode", "accumulated_resid", "collect",
    "inference_mode", "no_grad", "partial", "get_minibatches", "to",
    "log", "sigmoid", "exp",  # maths written as code: log(sigmoid(x))
}

#: Keyword parameters of the libraries the prose tells the learner to call (``model.generate``, the
#: tokenizer, AdamW, gymnasium's vector env, TRL's config, tensor factories), beside the package's own.
LIBRARY_KEYWORDS = {
    "stop_at_eos", "max_new_tokens", "verbose", "temperature", "top_k",  # HookedTransformer.generate
    "padding", "truncation", "return_tensors", "skip_special_tokens",  # tokenizers
    "weight_decay", "maximize",  # torch.optim.AdamW
    "autoreset_mode",  # gymnasium's vector envs
    "lr_scheduler_type",  # trl.GRPOConfig
    "device", "generator", "gain",  # torch factories, randperm, nn.init
    "logits", "fwd_hooks", "names_filter", "return_labels", "pos_slice", "attention_mask",
}


# ----------------------------------------------------------------------------------------------------
# Extraction
# ----------------------------------------------------------------------------------------------------


def prose() -> list[tuple[str, str]]:
    """(document name, markdown text): every chapter's markdown cells, then the README."""
    docs = []
    for src in sources():
        for cell in parse_source(src.read_text()):
            if cell.kind == "markdown":
                docs.append((src.stem, cell.source))
    docs.append(("README", (ROOT / "README.md").read_text()))
    return docs


def snippets(text: str) -> list[tuple[str, str]]:
    """("fence:<lang>" or "inline", code) of a markdown text; inline spans may wrap over lines."""
    found = [(f"fence:{m.group(1)}", m.group(2)) for m in FENCE.finditer(text)]
    rest = FENCE.sub("", text)
    found += [("inline", " ".join(m.group(1).split())) for m in INLINE.finditer(rest)]
    return found


# ----------------------------------------------------------------------------------------------------
# Command lines
# ----------------------------------------------------------------------------------------------------


class _Parsed(Exception):
    pass


def parse_command(argv: list[str]) -> argparse.Namespace:
    """Parse ``argv`` (``[command, *flags]``) with the command's real parser, running nothing after it.

    Raises ``ValueError`` with argparse's message when the flags do not parse."""
    name, (rest, _device) = argv[0], pop_device(argv[1:])
    if name not in COMMANDS:
        raise ValueError(f"unknown command {name!r}")
    module_name, func_name = COMMANDS[name][0].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    original = argparse.ArgumentParser.parse_args
    errors: list[str] = []

    def parse_args(self, args=None, namespace=None):
        original_error = self.error

        def error(message):
            errors.append(f"{self.prog}: {message}")
            original_error(message)

        self.error = error
        ns = original(self, args, namespace)
        raise _Parsed(ns)

    argparse.ArgumentParser.parse_args = parse_args
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # argparse's usage text: the message says it
            func(rest)
    except _Parsed as parsed:
        return parsed.args[0]
    except SystemExit as exc:
        raise ValueError(errors[-1] if errors else f"{name} exited with {exc.code}") from None
    finally:
        argparse.ArgumentParser.parse_args = original
    raise AssertionError(f"{name}'s main returned without parsing its arguments")


def command_variants(line: str) -> list[list[str]]:
    """A command line of the prose as argv lists: comments, pipes and redirections cut, ``...`` dropped,
    placeholders filled, every ``[optional]`` group both left out and put in."""
    line = line.split("#")[0].split("|")[0].split(">")[0]
    line = line.replace("...", " ")
    if "python -m rlhf_tutorial" in line:
        line = line.split("python -m rlhf_tutorial", 1)[1]
    without = re.sub(r"\[[^\]]*\]", " ", line)
    with_all = line.replace("[", " ").replace("]", " ")
    variants = []
    for text in dict.fromkeys([without, with_all]):
        argv = [PLACEHOLDERS.get(w, w) for w in shlex.split(text)]
        if argv:
            variants.append(argv)
    return variants


def check_command_line(line: str) -> None:
    for argv in command_variants(line):
        if argv[0] in {"--help", "-h", "help"}:
            continue
        parse_command(argv)


@cache
def option_strings(name: str) -> frozenset[str]:
    """Every option string of a command (its parser, built by parsing ``--help``-free: we read the
    parser off the stopped ``parse_args``)."""
    module_name, func_name = COMMANDS[name][0].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    original, seen = argparse.ArgumentParser.parse_args, []

    def parse_args(self, args=None, namespace=None):
        seen.append(self)
        raise _Parsed(None)

    argparse.ArgumentParser.parse_args = parse_args
    try:
        func([])
    except _Parsed:
        pass
    finally:
        argparse.ArgumentParser.parse_args = original
    return frozenset(s for parser in seen for s in parser._option_string_actions) | {"--device"}


def check_flags(snippet: str) -> None:
    """Flags without a command: a single ``--flag`` must be an option of some command; several tokens must
    parse for some command."""
    words = shlex.split(snippet)
    if len(words) == 1:
        if not any(words[0] in option_strings(name) for name in COMMANDS):
            raise ValueError(f"no command has the option {words[0]}")
        return
    problems = []
    for name in COMMANDS:
        try:
            parse_command([name, *words])
            return
        except ValueError as exc:
            problems.append(str(exc))
    raise ValueError(f"{snippet!r} parses for no command ({problems[0]}, ...)")


# ----------------------------------------------------------------------------------------------------
# Python
# ----------------------------------------------------------------------------------------------------


@cache
def package_modules() -> tuple:
    mods = [rlhf_tutorial]
    for info in pkgutil.walk_packages(rlhf_tutorial.__path__, "rlhf_tutorial."):
        if info.name.startswith(("rlhf_tutorial.__main__", "rlhf_tutorial.trainers.bench_trl")):
            continue  # bench_trl* import TRL lazily; __main__ runs the CLI
        mods.append(importlib.import_module(info.name))
    return tuple(mods)


@cache
def args_classes() -> dict[str, type]:
    return {name: obj for mod in package_modules() for name, obj in vars(mod).items()
            if name.endswith("Args") and dataclasses.is_dataclass(obj) and isinstance(obj, type)}


@cache
def package_callables() -> dict[str, list]:
    """name -> every function, class or method of that name defined in the package."""
    found: dict[str, list] = {}
    for mod in package_modules():
        for name, obj in vars(mod).items():
            if getattr(obj, "__module__", "").startswith("rlhf_tutorial") and callable(obj):
                found.setdefault(name, []).append(obj)
                if isinstance(obj, type):
                    for attr, member in vars(obj).items():
                        if callable(member) and not attr.startswith("__"):
                            found.setdefault(attr, []).append(getattr(obj, attr))
    return found


@cache
def package_keywords() -> frozenset[str]:
    names = set()
    for objs in package_callables().values():
        for obj in objs:
            try:
                names |= set(inspect.signature(obj).parameters)
            except (TypeError, ValueError):
                pass
    return frozenset(names)


@cache
def chapter_namespace(doc: str) -> dict:
    """The names a chapter's imports cell defines (the README: none beyond the package)."""
    namespace: dict = {}
    path = ROOT / "course" / f"{doc}.py"
    if path.exists():
        for cell in parse_source(path.read_text()):
            if cell.kind == "imports":
                exec(compile(cell.source, f"{doc} imports", "exec"), namespace)
    return namespace


def resolve_dotted(name: str):
    """``rlhf_tutorial.a.b`` or ``trainers.a.b`` -> the object (``ValueError`` when it does not exist)."""
    parts = name.split(".")
    if parts[0] == "trainers":
        parts = ["rlhf_tutorial", *parts]
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                raise ValueError(f"{name}: {'.'.join(parts[:cut])} has no {attr!r}")
            obj = getattr(obj, attr)
        return obj
    raise ValueError(f"{name}: no such module")


def check_args_expressions(tree: ast.AST, snippet: str) -> int:
    """Evaluate every ``XArgs(...)``, ``XArgs.preset(...)`` and ``XArgs.attr`` in ``tree``; return how many."""
    classes, count = args_classes(), 0
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id.endswith("Args"):
                target = node
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id.endswith("Args"):
                target = node
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id.endswith("Args"):
            target = node
        if target is None:
            continue
        count += 1
        expr = ast.Expression(target)
        ast.fix_missing_locations(expr)
        head = target.func if isinstance(target, ast.Call) else target
        cls_name = head.id if isinstance(head, ast.Name) else head.value.id
        if cls_name not in classes:
            raise ValueError(f"{snippet!r}: the package has no {cls_name}")
        try:
            eval(compile(expr, snippet, "eval"), {**classes})
        except Exception as exc:  # the point: any error a learner would see
            raise ValueError(f"{snippet!r}: {type(exc).__name__}: {exc}") from None
    return count


def check_keyword_fragment(snippet: str) -> bool:
    """``a=1, b="x"``: True when it is such a fragment (and then checked), False when it is not one."""
    try:
        call = ast.parse(f"f({snippet})", mode="eval").body
    except SyntaxError:
        return False
    if not isinstance(call, ast.Call) or call.args or not call.keywords or any(k.arg is None for k in call.keywords):
        return False
    names = [k.arg for k in call.keywords]
    owners = [cls for cls in args_classes().values() if set(names) <= {f.name for f in dataclasses.fields(cls)}]
    if owners:
        try:
            values = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        except ValueError:
            return True  # a value that names something (``clip_eps=args.clip_coef``): the names are fields
        for cls in owners:
            cls(**values)
        return True
    unknown = [n for n in names if n not in package_keywords() and n not in LIBRARY_KEYWORDS]
    if unknown:
        raise ValueError(f"{snippet!r}: {unknown} is no field of any *Args and no parameter of the package's "
                         "functions or of the libraries the course calls")
    return True


def _callee_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def check_calls(tree: ast.AST, snippet: str, namespace: dict) -> None:
    """Every call of a plain or attribute name: the callee exists, and its arguments bind."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _callee_name(node.func)
        if name is None or name.endswith("Args") or name in NOT_COURSE_CALLABLES:
            continue
        if isinstance(node.func, ast.Attribute):
            base = node.func.value
            root = base
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in {"rlhf_tutorial", "trainers"}:
                resolve_dotted(ast.unparse(node.func))
                continue
            if isinstance(root, ast.Name) and root.id in {"torch", "F", "nn"}:
                try:
                    eval(ast.unparse(node.func), {"torch": torch, "F": torch.nn.functional, "nn": torch.nn})
                except AttributeError as exc:
                    raise ValueError(f"{snippet!r}: {exc}") from None
                continue
            if name not in package_callables():
                continue  # a method of a learner's object (model.generate, tokens.split): not the course's
        candidates = []
        if name in namespace and callable(namespace[name]):
            candidates.append(namespace[name])
        candidates += package_callables().get(name, [])
        if not candidates:
            if hasattr(builtins, name):
                continue
            raise ValueError(f"{snippet!r}: {name!r} is not a function of the package or of the chapter")
        args = [object() for _ in node.args if not isinstance(_, ast.Starred)]
        kwargs = {k.arg: object() for k in node.keywords if k.arg is not None}
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            continue  # ``**learner_functions(globals())``: binds whatever the trainer plugs
        problems = []
        for fn in candidates:
            try:
                inspect.signature(fn).bind(*args, **kwargs)
                break
            except TypeError as exc:
                problems.append(str(exc))
            except ValueError:
                break  # no signature to read (a C function)
        else:
            raise ValueError(f"{snippet!r}: the arguments do not fit {name}: {problems[0]}")


def check_python(snippet: str, namespace: dict) -> bool:
    """Check a Python snippet; False when it is not Python at all (prose, shapes, a path)."""
    if check_keyword_fragment(snippet):  # first: ``a=1, b=2`` is no statement
        return True
    try:
        tree = ast.parse(snippet)
    except SyntaxError:
        return False
    check_args_expressions(tree, snippet)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            for alias in node.names:
                full = f"{module}.{alias.name}" if module else alias.name
                if full.startswith("rlhf_tutorial"):
                    resolve_dotted(full)
        elif isinstance(node, ast.Attribute):
            dotted = ast.unparse(node)
            if dotted.split(".")[0] in {"rlhf_tutorial", "trainers"} and not isinstance(node.ctx, ast.Store):
                resolve_dotted(dotted)
    check_calls(tree, snippet, namespace)
    return True


# ----------------------------------------------------------------------------------------------------
# One dispatcher
# ----------------------------------------------------------------------------------------------------


def check_snippet(kind: str, code: str, namespace: dict) -> None:
    """Raise ``ValueError`` (or the error a learner would get) when the snippet does not run."""
    if kind in ("fence:bash", "fence:", "fence:sh"):
        for line in code.splitlines():
            if "python -m rlhf_tutorial" in line:
                check_command_line(line)
        return
    if kind == "fence:python":
        tree = ast.parse(code)  # a SyntaxError is a failure
        check_args_expressions(tree, code[:60])
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                module = node.module if isinstance(node, ast.ImportFrom) else None
                for alias in node.names:
                    full = f"{module}.{alias.name}" if module else alias.name
                    if full.startswith("rlhf_tutorial"):
                        resolve_dotted(full)
        return
    words = code.split()
    if len(words) == 1 and re.fullmatch(r"[a-z]+(-[a-z]+)+", code) and code in COMMANDS:
        return  # a command named in a sentence, not a line to type
    if re.match(r"^[A-Z][A-Z0-9_]*=", code):
        return  # an environment setting (RLHF_TUTORIAL_WORLD=tiny), not Python
    if "python -m rlhf_tutorial" in code or (words and words[0] in COMMANDS and
                                             (len(words) == 1 or words[1].startswith(("--", "[", "...")) or
                                              words[1] in PLACEHOLDERS)):
        check_command_line(code)
        return
    if code.startswith("--"):
        check_flags(code)
        return
    if words and words[0] == "make":
        targets = [w for w in words[1:] if "=" not in w]
        missing = [t for t in targets if t not in make_targets()]
        if missing:
            raise ValueError(f"{code!r}: the Makefile has no target {missing}")
        return
    script = re.match(r"^python (scripts/\S+\.py)", code)
    if script:
        if not (ROOT / script.group(1)).exists():
            raise ValueError(f"{code!r}: {script.group(1)} does not exist")
        return
    if re.fullmatch(r"[a-z_][a-z0-9_]*=", code):  # a keyword named in a sentence: `gpt2_model_name=`
        if code[:-1] not in package_keywords() | LIBRARY_KEYWORDS:
            raise ValueError(f"{code!r}: no function of the package or of the libraries takes {code[:-1]!r}")
        return
    if code.startswith(".") and re.match(r"^\.[a-z_]+\(", code):  # a method call: `.to(device_of(model))`
        code = "x" + code
    check_python(code, namespace)


@cache
def make_targets() -> frozenset[str]:
    text = (ROOT / "Makefile").read_text()
    return frozenset(re.findall(r"^([a-z][\w-]*):", text, re.M))


def all_snippets() -> list[tuple[str, str, str]]:
    return [(doc, kind, code) for doc, text in prose() for kind, code in snippets(text)]


# ----------------------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------------------


def test_every_code_suggestion_in_the_prose_runs():
    failures = []
    for doc, kind, code in all_snippets():
        try:
            check_snippet(kind, code, chapter_namespace(doc))
        except Exception as exc:  # collect every failing snippet, not only the first
            failures.append(f"{doc}: {code[:100]!r}: {type(exc).__name__}: {exc}")
    assert not failures, "code in the prose that does not run:\n" + "\n".join(failures)


def test_the_prose_holds_the_kinds_of_snippet_this_module_checks():
    """The extraction finds what it is meant to find (a silent regex would pass every check)."""
    found = all_snippets()
    codes = [code for _, _, code in found]
    assert any(c.startswith('GRPOArgs(importance_level="sequence"') for c in codes)
    assert any(c.startswith("python -m rlhf_tutorial train-rlhf") for c in codes)
    assert any(c.startswith("train-dpo --world tiny") for c in codes)
    assert any(c.startswith("--kl-coef") for c in codes)
    assert any(c == 'loss_type="dr_grpo", scale="none"' for c in codes)
    assert any(k == "fence:bash" and "python -m rlhf_tutorial" in c for _, k, c in found)
    assert any(k == "fence:python" and "GRPOConfig" in c for _, k, c in found)
    assert sum(1 for c in codes if "Args" in c) >= 8


def test_the_markdown_holds_no_tab():
    """A TAB in a markdown cell is always a mistake (``\\text`` once lost its ``\\t`` to one)."""
    for doc, text in prose():
        assert "\t" not in text, f"{doc}: a TAB in the prose: {text[text.index(chr(9)) - 40:text.index(chr(9)) + 20]!r}"


@pytest.mark.parametrize("kind, code, message", [
    # chapter 06 once suggested this: GRPOArgs's fields are clip_coef and clip_coef_high
    ("inline", 'GRPOArgs(importance_level="sequence", clip_eps=3e-4, clip_eps_high=4e-4)', "clip_eps"),
    ("inline", 'DPOArgs(kl_coef=0.1)', "kl_coef"),
    ("inline", "RLHFArgs.preset", None),  # exists: must pass
    ("inline", "RLHFArgs.fastest", "fastest"),
    ("inline", 'train(PPOArgs(env_id="Acrobot-v1", total_timestep=300_000))', "total_timestep"),
    ("inline", "python -m rlhf_tutorial train-grpo --world tiny --advantage-estimater rloo", "advantage-estimater"),
    ("inline", "train-dpo --world tiny --seed zero", "seed"),
    ("inline", "python -m rlhf_tutorial train-rlhf --world tiny [--kl-coef]", "kl-coef"),
    ("inline", "--kl-coeff 0.001", "parses for no command"),
    ("inline", "--clip-eps", "no command has"),
    ("inline", 'loss_type="dapo", clip_eps_hi=0.28', "clip_eps_hi"),
    ("inline", "calc_clipped_value_loss(values, old_values, returns, vf_coef)", "do not fit"),
    ("inline", "compute_gae(rewards, values, next_value, dones, gamma, gae_lambda, extra)", "do not fit"),
    ("inline", "make_rewards_fn(args)", "make_rewards_fn"),
    ("inline", "rlhf_tutorial.trainers.dpo.trian", "trian"),
    ("inline", "trainers.policy_eval.evaluate_polcy", "evaluate_polcy"),
    ("fence:bash", "python -m rlhf_tutorial frontier --world tiny --grpo-betas 0.1\n", "grpo-betas"),
    ("fence:python", "from rlhf_tutorial.trainers.grpo import GRPOArgs, make_reward_fun\n", "make_reward_fun"),
    ("fence:python", "ours = GRPOArgs.preset('tiny', clip_eps=0.2)\n", "clip_eps"),
    ("inline", "make nbval-gpt3", "nbval-gpt3"),
    ("inline", "python scripts/lock_it.py check requirements/lock.txt", "lock_it.py"),
    ("inline", "gpt3_model_name=", "gpt3_model_name"),
    ("inline", ".to(device_off(base_model))", "device_off"),
])
def test_the_checks_reject_wrong_snippets(kind, code, message):
    namespace = chapter_namespace("06_dpo_and_frontier")
    if message is None:
        check_snippet(kind, code, namespace)
        return
    with pytest.raises(Exception, match=re.escape(message)):
        check_snippet(kind, code, namespace)


def test_the_checks_accept_right_snippets_written_differently():
    namespace = chapter_namespace("04_grpo")
    for kind, code in [
        ("inline", 'GRPOArgs(clip_coef_high=0.28, loss_type="dapo")'),
        ("inline", "GRPOArgs.preset('tiny', kl_coef=0.0).kl_coef"),
        ("inline", "train-grpo --seed 3 --world tiny --importance-level sequence"),
        ("inline", "python -m rlhf_tutorial frontier --methods ipo dpo --dpo-betas 0.1 --device cpu"),
        ("inline", "--no-early-stopping --kl-coef 0.2"),
        ("inline", "compute_gae(rewards=r, values=v, next_value=nv, dones=d, gamma=1.0, gae_lambda=0.95)"),
        ("fence:bash", "python -m rlhf_tutorial train-dpo --world tiny [--online] | tail -n 1 > dpo.json\n"),
        ("inline", "make lab LAB_ARGS=--no-browser"),
        ("inline", ".to(device_of(policy))"),
    ]:
        check_snippet(kind, code, namespace)


def test_the_trl_script_of_chapter_04_builds_its_config(tmp_path, monkeypatch):
    """Chapter 04's ``train_trl.py`` runs up to the training itself: its GRPOConfig constructs with the
    settings it writes, and the trainer gets the model folder, the reward and the prompts."""
    trl = pytest.importorskip("trl", reason="the `trl` extra is not installed (make test installs it)")
    script = next(c for d, k, c in all_snippets() if k == "fence:python" and "GRPOConfig" in c)
    made = {}

    class Trainer:
        def __init__(self, **kwargs):
            made.update(kwargs)

        def train(self):
            made["trained"] = True

    monkeypatch.setattr(trl, "GRPOTrainer", Trainer)
    monkeypatch.chdir(tmp_path)
    exec(compile(script, "train_trl.py", "exec"), {"__name__": "train_trl"})
    assert made["model"] == "policy_hf" and made["trained"] and made["args"].num_generations == 8
    assert len(made["train_dataset"]) == 320 and callable(made["reward_funcs"])
