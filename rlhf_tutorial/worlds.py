"""The world switch: where the policy, the sentiment classifier and the preference pairs come from.

Two worlds run the same course code:

* ``"gpt2"``: policy ``gpt2`` via ``HookedTransformer.from_pretrained``, reward classifier
  ``lvwerra/distilbert-imdb`` via ``AutoModelForSequenceClassification`` (needs the Hugging Face hub once,
  or a warm local cache);
* ``"tiny"``: the offline tiny world shipped in ``rlhf_tutorial/tiny/artifacts`` (a 2-layer GPT-2-style
  HookedTransformer, a small DistilBERT classifier, preference pairs), built by
  ``python -m rlhf_tutorial build-tiny``.

Choose with ``load_policy("tiny")`` / ``load_policy("gpt2")``, or for everything at once with the
environment variable ``RLHF_TUTORIAL_WORLD=tiny`` (or ``gpt2``). With neither, the GPT-2 world is picked
when it can be loaded (both models are in the local cache, or huggingface.co answers within 2 s) and the
tiny world otherwise; the choice is printed once.

Both classifiers use ``id2label = {0: "NEGATIVE", 1: "POSITIVE"}``. The preference pairs are plain text and
the same in both worlds: there is no public pair set of the same shape for GPT-2, and text pairs train a
reward model on any backbone.

Set ``RLHF_TUTORIAL_TINY_DIR`` to use tiny-world artifacts from another folder (e.g. a fresh ``build-tiny
--out DIR``).

GPT-2 sizes: the GPT-2 world's policy is ``gpt2`` unless ``$RLHF_TUTORIAL_GPT2`` (or the ``gpt2_model``
argument of the loaders) names ``gpt2-medium``, ``gpt2-large`` or ``gpt2-xl``; the trainers' presets
follow the same choice (:func:`preset_key`).

Stand-ins: a cache written by ``python -m rlhf_tutorial build-stand-in-hub DIR`` (used as ``HF_HOME``)
holds random, reduced-size stand-ins of these repos (:mod:`rlhf_tutorial.standin_hub`). The loaders
detect them, say so once per repo, and the CLI adds ``stand_ins`` to its summary: such runs test the
code path, not quality.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

WORLDS = ("tiny", "gpt2")
ENV_VAR = "RLHF_TUTORIAL_WORLD"
TINY_DIR_ENV_VAR = "RLHF_TUTORIAL_TINY_DIR"
ARITH_DIR_ENV_VAR = "RLHF_TUTORIAL_ARITH_DIR"
CALC_DIR_ENV_VAR = "RLHF_TUTORIAL_CALC_DIR"
GPT2_POLICY = "gpt2"
GPT2_MODELS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
GPT2_MODEL_ENV_VAR = "RLHF_TUTORIAL_GPT2"
GPT2_CLASSIFIER = "lvwerra/distilbert-imdb"
PROMPT = "This movie was really"
HUB_TIMEOUT_S = 2.0
_ALIASES = {"gpt-2": "gpt2", "gpt2-small": "gpt2"}

_auto_choice: str | None = None
_why = ""
_stand_ins_loaded: dict[str, str] = {}


class WorldUnavailable(RuntimeError):
    """The requested world cannot be loaded here (no network, not cached, artifacts missing)."""


HOW_TO_USE_TINY = (
    "To work offline, use the tiny world: set the environment variable RLHF_TUTORIAL_WORLD=tiny "
    "(in a notebook: os.environ['RLHF_TUTORIAL_WORLD'] = 'tiny' before loading), or pass it explicitly: "
    "load_policy('tiny'), load_sentiment_classifier('tiny')."
)


# --- choosing a world --------------------------------------------------------------------------------------
def _normalise(world: str, source: str) -> str:
    name = _ALIASES.get(str(world).strip().lower(), str(world).strip().lower())
    if name not in WORLDS:
        raise ValueError(f"unknown world {world!r} (from {source}): choose one of {', '.join(map(repr, WORLDS))}")
    return name


def resolve_world(world: str | None = None, announce: bool = True) -> str:
    """``"tiny"`` or ``"gpt2"``: the argument if given, else ``$RLHF_TUTORIAL_WORLD``, else an automatic
    choice (GPT-2 if it can be loaded, tiny otherwise; printed once per process, unless ``announce`` is
    False)."""
    if world is not None:
        return _normalise(world, "the world argument")
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return _normalise(env, f"${ENV_VAR}")
    return _auto_world(announce)


def is_tiny(world: str | None = None) -> bool:
    """True when the (resolved) world is the tiny one: notebooks use it to size their runs.

    Says nothing: the automatic choice is announced when a model is loaded, where it matters (a chapter
    that sizes a CartPole run with it has no use for the message)."""
    return resolve_world(world, announce=False) == "tiny"


SMOKE_ENV_VAR = "RLHF_TUTORIAL_SMOKE"


def is_smoke() -> bool:
    """True when ``$RLHF_TUTORIAL_SMOKE=1``: notebooks shrink their runs (phases, batch) to a smoke size.

    CI sets it for the GPT-2 world's run against the stand-in hub cache, where the models are random
    stand-ins and only the code path is being tested; the tiny world's runs keep their real lengths.
    """
    return os.environ.get(SMOKE_ENV_VAR, "").strip() not in {"", "0", "false", "False"}


def gpt2_model(name: str | None = None) -> str:
    """The GPT-2 world's policy: ``name`` if given, else ``$RLHF_TUTORIAL_GPT2``, else ``"gpt2"``."""
    source = "the gpt2_model argument" if name is not None else f"${GPT2_MODEL_ENV_VAR}"
    chosen = (name if name is not None else os.environ.get(GPT2_MODEL_ENV_VAR, "")).strip().lower() or GPT2_POLICY
    chosen = _ALIASES.get(chosen, chosen)
    if chosen not in GPT2_MODELS:
        raise ValueError(f"unknown GPT-2 model {chosen!r} (from {source}): choose one of {', '.join(GPT2_MODELS)}")
    return chosen


def preset_key(world: str | None = None) -> str:
    """Which trainer preset a world uses: ``"tiny"``, or in the GPT-2 world the chosen size
    (``gpt2``, ``gpt2-medium``, ``gpt2-large``, ``gpt2-xl``)."""
    return "tiny" if resolve_world(world) == "tiny" else gpt2_model()


def smoke_sizes(**sizes: Any) -> dict[str, Any]:
    """``sizes`` when :func:`is_smoke`, else ``{}``: a notebook's long run writes
    ``RLHFArgs.preset(world, ..., **smoke_sizes(num_phases=2))`` and keeps its real length otherwise."""
    return dict(sizes) if is_smoke() else {}


def default_prompt() -> str:
    """The course prompt, the same in both worlds."""
    return PROMPT


_announced = False


def _auto_world(announce: bool = True) -> str:
    global _auto_choice, _announced, _why
    if _auto_choice is None:
        if all(_is_cached(repo) for repo in (gpt2_model(), GPT2_CLASSIFIER)):
            _auto_choice, why = "gpt2", "GPT-2 and its classifier are in the local Hugging Face cache"
        elif _hub_offline():
            _auto_choice, why = "tiny", "HF_HUB_OFFLINE is set and GPT-2 is not cached"
        elif _hub_reachable():
            _auto_choice, why = "gpt2", "the Hugging Face hub is reachable"
        else:
            _auto_choice, why = "tiny", f"GPT-2 is not cached and the Hugging Face hub did not answer in {HUB_TIMEOUT_S:g} s"
        _why = why
    if announce and not _announced:
        _announced, why = True, _why
        print(
            f"[rlhf_tutorial] using the {_auto_choice!r} world ({why}). "
            f"Switch with RLHF_TUTORIAL_WORLD=tiny|gpt2 or load_policy('tiny'|'gpt2')."
        )
    return _auto_choice


def _hub_offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in {"1", "true", "yes", "on"}
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _is_cached(repo_id: str) -> bool:
    """Whether the repo's config.json is in the local Hugging Face cache (no network access)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:
        return False


def _hub_reachable(timeout: float = HUB_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the hub (or the HTTPS proxy) opens within ``timeout`` seconds.

    Name resolution can block far longer than a socket timeout, so the attempt runs in a daemon thread
    that is abandoned when the time is up.
    """
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    url = urlparse(proxy or os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    if not host:
        return False
    result: list[bool] = []

    def attempt() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


def _stand_in_marker(repo_id: str) -> dict | None:
    """The cached repo's ``STAND_IN.json`` when it is a stand-in written by ``build-stand-in-hub``, else None."""
    try:
        from huggingface_hub import try_to_load_from_cache

        from rlhf_tutorial.standin_hub import MARKER

        path = try_to_load_from_cache(repo_id, MARKER)
        return json.loads(Path(path).read_text()) if isinstance(path, str) else None
    except Exception:
        return None


def _is_stand_in(repo_id: str) -> bool:
    """Whether the cached repo is a stand-in written by ``build-stand-in-hub`` (it holds the marker)."""
    return _stand_in_marker(repo_id) is not None


def stand_ins_loaded() -> dict[str, str]:
    """The stand-in repos loaded in this process so far, each with the note that says what they are."""
    return dict(_stand_ins_loaded)


def policy_stand_in(world: str | None = None) -> dict | None:
    """Which stand-in the world's policy is here, in the form a saved run records it (so that a run
    trained on one stand-in is not reused on another): for the GPT-2 world whose cached policy repo is
    a stand-in (``build-stand-in-hub``), ``{"repo", "tokenizer", "vocab_size"}``, the tokenizer as its
    ``STAND_IN.json`` names it (``"real"``: GPT-2's BPE; ``"trained"``: the fallback trained on the tiny
    corpus; ``"unrecorded"``: a cache built before the marker named it) and the vocabulary size; None
    for the tiny world and for a real GPT-2."""
    if resolve_world(world) != "gpt2":
        return None
    repo = gpt2_model()
    marker = _stand_in_marker(repo)
    if marker is None:
        return None
    return {"repo": repo, "tokenizer": marker.get("tokenizer", "unrecorded"),
            "vocab_size": (marker.get("stand_in_size") or {}).get("vocab_size")}


def describe_stand_in(record: dict | None) -> str:
    """A :func:`policy_stand_in` record in words: "the stand-in gpt2 with GPT-2's real BPE (50257 tokens)"."""
    if record is None:
        return "the real GPT-2 (no stand-in)"
    tokenizer = {"real": "GPT-2's real BPE", "trained": "the BPE trained on the tiny corpus",
                 "unrecorded": "a tokenizer its STAND_IN.json does not name"}.get(record.get("tokenizer"),
                                                                                 repr(record.get("tokenizer")))
    return f"the stand-in {record.get('repo')} with {tokenizer} ({record.get('vocab_size')} tokens)"


def _note_stand_in(repo_id: str) -> None:
    """Record and say once that ``repo_id`` is a stand-in; for a GPT-2 repo the note also says which
    tokenizer it carries (GPT-2's real BPE or the trained fallback, :mod:`rlhf_tutorial.gpt2_bpe`)."""
    marker = None if repo_id in _stand_ins_loaded else _stand_in_marker(repo_id)
    if marker is None:
        return
    from rlhf_tutorial.standin_hub import NOTE

    note = NOTE
    if marker.get("tokenizer") == "real":
        note += f"; tokenizer: GPT-2's real BPE ({marker.get('tokenizer_source')})"
    elif marker.get("tokenizer") == "trained":
        note += "; tokenizer: a BPE trained on the tiny world's corpus (GPT-2's real files were not available)"
    _stand_ins_loaded[repo_id] = note
    print(f"[rlhf_tutorial] {repo_id!r} in the local Hugging Face cache is a {note}.")


@contextlib.contextmanager
def _hub_access(repo_id: str, what: str) -> Iterator[None]:
    """Guard a ``from_pretrained(repo_id)`` call of the gpt2 world.

    Fails at once, before any download attempt, when the repo is neither cached nor reachable (a plain
    ``from_pretrained`` would retry for tens of seconds); reads the cache only (offline mode for the
    duration of the call) when it is cached but the hub does not answer; turns any other loading error
    into a :class:`WorldUnavailable` that says how to use the tiny world.
    """
    from huggingface_hub import constants

    cached, offline = _is_cached(repo_id), _hub_offline()
    reachable = not offline and _hub_reachable()
    if not cached and not reachable:
        reason = (
            "HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set" if offline
            else f"the Hugging Face hub did not answer within {HUB_TIMEOUT_S:g} s (no network?)"
        )
        raise WorldUnavailable(
            f"Cannot load {what} ({repo_id!r}) for the 'gpt2' world: it is not in the local Hugging Face "
            f"cache and {reason}. {HOW_TO_USE_TINY}"
        )
    saved = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = saved or not reachable
    try:
        _note_stand_in(repo_id)
        yield
    except Exception as err:
        raise WorldUnavailable(
            f"Loading {what} ({repo_id!r}) for the 'gpt2' world failed: {type(err).__name__}: {err}. "
            f"{HOW_TO_USE_TINY}"
        ) from err
    finally:
        constants.HF_HUB_OFFLINE = saved


def _default_device(device: Any) -> Any:
    """``device``, or the course's device rule (:func:`rlhf_tutorial.devices.course_device`)."""
    from rlhf_tutorial.devices import resolve

    return resolve(device)


# --- the tiny world's files ---------------------------------------------------------------------------------
def tiny_dir() -> Path:
    """Folder of the tiny world's artifacts (``$RLHF_TUTORIAL_TINY_DIR`` or the package's own)."""
    folder = Path(os.environ.get(TINY_DIR_ENV_VAR) or Path(__file__).resolve().parent / "tiny" / "artifacts")
    if not (folder / "manifest.json").exists():
        raise WorldUnavailable(
            f"The tiny world's artifacts are missing from {folder}. Rebuild them with "
            f"`python -m rlhf_tutorial build-tiny` (or point {TINY_DIR_ENV_VAR} at a build)."
        )
    return folder


def tiny_metadata() -> dict:
    """The tiny world's ``metadata.json``: validation loss, classifier accuracy, pair counts, build time."""
    return json.loads((tiny_dir() / "metadata.json").read_text())


def _load_float32_safetensors(path: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    state = load_file(str(path), device="cpu")
    bad = sorted(k for k, v in state.items() if v.dtype != torch.float32)
    if bad:
        raise WorldUnavailable(f"{path} holds non-float32 tensors: {bad[:3]}")
    return state


# --- loaders ------------------------------------------------------------------------------------------------
def load_tokenizer(world: str | None = None, gpt2_model_name: str | None = None):
    """The policy's tokenizer (GPT-2's, or the tiny world's byte-level BPE with ``<|endoftext|>``)."""
    from transformers import AutoTokenizer

    if resolve_world(world) == "tiny":
        return AutoTokenizer.from_pretrained(str(tiny_dir() / "tokenizer"))
    repo = gpt2_model(gpt2_model_name)
    with _hub_access(repo, "the GPT-2 tokenizer"):
        return AutoTokenizer.from_pretrained(repo)


@contextlib.contextmanager
def _no_loading_bars():
    """Hide transformers' "Loading weights" progress bar (noise in a notebook cell); restore it after."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def load_policy(world: str | None = None, device: Any = None, gpt2_model_name: str | None = None) -> HookedTransformer:
    """The policy as a TransformerLens ``HookedTransformer`` in eval mode, on ``device`` (default: CUDA
    when available, else the CPU).

    gpt2: ``HookedTransformer.from_pretrained(name)`` with ``name`` from :func:`gpt2_model`
    (``gpt2_model_name``, else ``$RLHF_TUTORIAL_GPT2``, else ``"gpt2"``); tiny: the shipped 2-layer model (gelu_new,
    learned positions, n_ctx 128), whose tokenizer prepends ``<|endoftext|>`` as BOS. Both are processed
    alike: LayerNorm weights folded (``normalization_type == "LNPre"``) and the unembedding centred.
    """
    device = _default_device(device)
    if resolve_world(world) == "gpt2":
        repo = gpt2_model(gpt2_model_name)
        with _hub_access(repo, "the GPT-2 policy"):
            from transformer_lens import HookedTransformer

            with _no_loading_bars():
                model = HookedTransformer.from_pretrained(repo, device=device)
        return model.eval()

    return _load_tiny_policy(tiny_dir(), device)


def _load_tiny_policy(root: Path, device: Any) -> HookedTransformer:
    """The HookedTransformer of a tiny build (``root/policy`` and ``root/tokenizer``), processed as
    ``from_pretrained`` processes GPT-2, in eval mode on ``device``."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformers import AutoTokenizer

    folder = root / "policy"
    config = json.loads((folder / "config.json").read_text())
    # Process the weights as from_pretrained("gpt2") does (fold each LayerNorm's weight and bias into the
    # next linear map, centre the writing weights and the unembedding), so both worlds behave alike:
    # in both, logits = ln_final.hook_normalized @ W_U + b_U.
    state = _load_float32_safetensors(folder / "model.safetensors")
    as_trained = HookedTransformer(HookedTransformerConfig(**config, init_weights=False, device="cpu"))
    wanted = {k for k in as_trained.state_dict() if not k.endswith(("IGNORE", ".mask"))}
    if set(state) != wanted:
        raise WorldUnavailable(
            f"tiny policy weights do not match its config: missing {sorted(wanted - set(state))}, "
            f"unexpected {sorted(set(state) - wanted)}. Rebuild with `python -m rlhf_tutorial build-tiny`."
        )
    cfg = HookedTransformerConfig(**{**config, "normalization_type": "LNPre"}, device=str(device), init_weights=False)
    model = HookedTransformer(cfg, tokenizer=AutoTokenizer.from_pretrained(str(root / "tokenizer")))  # parameters uninitialised on `device`
    model.load_and_process_state_dict(
        state, fold_ln=True, center_writing_weights=True, center_unembed=True, fold_value_biases=True
    )
    return model.eval()


def _artifacts_dir(env_var: str, folder_name: str, what: str, command: str) -> Path:
    """``$env_var`` or the package's ``tiny/folder_name``; WorldUnavailable (naming ``command``) when it
    holds no build."""
    folder = Path(os.environ.get(env_var) or Path(__file__).resolve().parent / "tiny" / folder_name)
    if not (folder / "manifest.json").exists():
        raise WorldUnavailable(
            f"The {what} world's artifacts are missing from {folder}. Rebuild them with "
            f"`python -m rlhf_tutorial {command}` (or point {env_var} at a build)."
        )
    return folder


def arith_dir() -> Path:
    """Folder of the tiny arithmetic world's artifacts (chapter 07; ``$RLHF_TUTORIAL_ARITH_DIR`` or the
    package's own ``tiny/artifacts_arith``)."""
    return _artifacts_dir(ARITH_DIR_ENV_VAR, "artifacts_arith", "arithmetic", "build-arith")


def load_reasoning_policy(world: str | None = None, device: Any = None,
                          gpt2_model_name: str | None = None) -> HookedTransformer:
    """Chapter 07's base model: in the tiny world the shipped arithmetic model (``build-arith``: a
    small GPT-2-shaped model pretrained on worked solutions with realistic errors), in the GPT-2 world
    GPT-2 itself (:func:`load_policy`; its presets fine-tune it on the generator's demonstrations first)."""
    if resolve_world(world) == "gpt2":
        return load_policy("gpt2", device, gpt2_model_name)
    return _load_tiny_policy(arith_dir(), _default_device(device))


def calc_dir() -> Path:
    """Folder of the tiny calculator world's artifacts (chapter 09; ``$RLHF_TUTORIAL_CALC_DIR`` or the
    package's own ``tiny/artifacts_calc``)."""
    return _artifacts_dir(CALC_DIR_ENV_VAR, "artifacts_calc", "calculator", "build-calc")


def load_agent_policy(world: str | None = None, device: Any = None,
                      gpt2_model_name: str | None = None) -> HookedTransformer:
    """Chapter 09's base model: in the tiny world the shipped calculator-world model (``build-calc``: a
    small GPT-2-shaped model pretrained on solutions of which a few call the calculator), in the GPT-2
    world GPT-2 itself (:func:`load_policy`), which has never seen the calculator's syntax: its preset
    (``AgentArgs.preset("gpt2")``, ``sft_texts``) fine-tunes it on the world's pretraining text first, as
    chapter 09's notebook does before measuring it."""
    if resolve_world(world) == "gpt2":
        return load_policy("gpt2", device, gpt2_model_name)
    return _load_tiny_policy(calc_dir(), _default_device(device))


def load_sentiment_classifier(world: str | None = None, device: Any = None):
    """``(classifier, tokenizer)``: an ``AutoModelForSequenceClassification`` in eval mode with
    id2label {0: NEGATIVE, 1: POSITIVE}, and its tokenizer (``tokenizer(texts, padding=True,
    truncation=True, return_tensors="pt")`` can be passed as ``classifier(**inputs)``)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    device = _default_device(device)
    if resolve_world(world) == "gpt2":
        with _hub_access(GPT2_CLASSIFIER, "the sentiment classifier"):
            tokenizer = AutoTokenizer.from_pretrained(GPT2_CLASSIFIER)
            with _no_loading_bars():
                classifier = AutoModelForSequenceClassification.from_pretrained(GPT2_CLASSIFIER)
        return classifier.to(device).eval(), tokenizer

    folder = tiny_dir() / "classifier"
    _load_float32_safetensors(folder / "model.safetensors")  # refuse anything but float32 safetensors
    with _no_loading_bars():
        classifier = AutoModelForSequenceClassification.from_pretrained(str(folder), use_safetensors=True)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return classifier.to(device).eval(), tokenizer


def load_preference_pairs(world: str | None = None, split: str = "train") -> list[dict]:
    """Preference pairs ``{"prompt", "chosen", "rejected", ...}`` (the text to score is prompt + chosen).

    Extra keys: ``kind`` ("sentiment" or "repetition") and the corpus sentiment scores of both sides.
    The pairs are the tiny world's in both worlds (plain text, no download); the rule that labelled them
    is in ``tiny_metadata()["preference_rule"]``.
    """
    resolve_world(world)  # validates the name; both worlds share the pairs
    if split not in {"train", "test"}:
        raise ValueError(f"unknown split {split!r}: choose 'train' or 'test'")
    path = tiny_dir() / "preferences" / f"{split}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- world-info ---------------------------------------------------------------------------------------------
def info_main(argv: list[str]) -> dict:
    """``python -m rlhf_tutorial world-info [--world tiny|gpt2] [--seed 0] [--samples 64] [--new-tokens 20]``

    Loads the world, samples continuations of the course prompt and scores them with the classifier;
    the summary ends with how the shipped artifacts were built and what this machine runs
    (``build_info``: library versions, torch build, CPU kernel level).
    """
    p = argparse.ArgumentParser(prog="python -m rlhf_tutorial world-info", description=info_main.__doc__.split("\n")[0])
    p.add_argument("--world", default=None, help="tiny or gpt2 (default: $RLHF_TUTORIAL_WORLD, else automatic)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=64, help="number of sampled continuations")
    p.add_argument("--new-tokens", type=int, default=20, help="tokens sampled after the prompt")
    p.add_argument("--device", default=None)
    p.add_argument("--show", type=int, default=6, help="samples to include in the summary")
    args = p.parse_args(argv)

    t0 = time.perf_counter()
    import torch
    import transformer_lens  # noqa: F401  (timed: the import is most of the loading time)
    import transformers  # noqa: F401

    seconds = {"imports": time.perf_counter() - t0}
    world = resolve_world(args.world)
    t = time.perf_counter()
    policy = load_policy(world, device=args.device)
    seconds["policy"] = time.perf_counter() - t
    t = time.perf_counter()
    classifier, clf_tokenizer = load_sentiment_classifier(world, device=args.device)
    seconds["classifier"] = time.perf_counter() - t

    torch.manual_seed(args.seed)
    prompt = default_prompt()
    tokens = policy.to_tokens(prompt).repeat(args.samples, 1)  # [samples, prompt_len] with BOS
    t = time.perf_counter()
    with torch.no_grad():
        out = policy.generate(tokens, max_new_tokens=args.new_tokens, verbose=False)
    seconds["sampling"] = time.perf_counter() - t
    texts = policy.tokenizer.batch_decode(out.cpu().tolist(), skip_special_tokens=True)
    with torch.no_grad():
        enc = clf_tokenizer(texts, padding=True, truncation=True, return_tensors="pt").to(classifier.device)
        probs = classifier(**enc).logits.softmax(-1)[:, classifier.config.label2id["POSITIVE"]]

    summary: dict[str, Any] = {
        "world": world,
        "policy_model": "tiny" if world == "tiny" else gpt2_model(),
        "device": str(policy.cfg.device),
        "policy_params": sum(p.numel() for p in policy.parameters()),
        "policy_layers": policy.cfg.n_layers,
        "d_vocab": policy.cfg.d_vocab,
        "classifier_id2label": {str(k): v for k, v in classifier.config.id2label.items()},
        "prompt": prompt,
        "seed": args.seed,
        "n_samples": args.samples,
        "new_tokens": args.new_tokens,
        "mean_positive_prob": round(probs.mean().item(), 4),
        "frac_positive": round((probs > 0.5).float().mean().item(), 4),
        "samples": texts[: args.show],
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
        "load_seconds": round(seconds["imports"] + seconds["policy"] + seconds["classifier"], 2),
    }
    if world == "tiny":
        meta = tiny_metadata()
        summary["val_loss"] = round(meta["policy"]["val_loss"], 4)
        summary["classifier_accuracy"] = round(meta["classifier"]["accuracy"], 4)
        summary["classifier_accuracy_negation"] = round(meta["classifier"]["accuracy_negation"], 4)
        summary["preference_pairs"] = {s: meta["preferences"][s]["n"] for s in ("train", "test")}
    summary["build_info"] = artifact_build_info(world)
    return summary


def artifact_build_info(world: str) -> dict[str, Any]:
    """How the world's shipped artifacts were built (library versions, torch build, CPU and kernel level,
    as their builders recorded them, per file) and the same facts for this machine, which ``world-info``
    shows: a learner whose run differs from a quoted figure can see whether the kernels differ."""
    from rlhf_tutorial.buildinfo import artifact_records, build_info

    info: dict[str, Any] = {"this_machine": build_info()}
    if world == "tiny":
        info["artifacts"] = artifact_records(tiny_dir())
    return info
