"""What the course needs from TransformerLens, measured on 3.x (``HookedTransformer``) and 4.x
(``TransformerBridge`` in compatibility mode): ``docs/TRANSFORMERLENS4.md`` reports its results.

Run it twice, the 3.x run first (it saves the reference numbers the 4.x run compares with):

    # TransformerLens 3.9 (the course's venv)
    HF_HOME=/path/to/.stand-in-hf HF_HUB_OFFLINE=1 .venv/bin/python scripts/tl4_probe.py \\
        --save-reference runs/tl-probe/ref.pt --out runs/tl-probe/tl3.json
    # TransformerLens 4.x (a side venv: torch==2.13.0 first, then transformer-lens==4.3.*; never the course's)
    HF_HOME=/path/to/.stand-in-hf HF_HUB_OFFLINE=1 /path/to/side-venv/bin/python scripts/tl4_probe.py \\
        --reference runs/tl-probe/ref.pt --out runs/tl-probe/tl4.json

Every check is one use of the API that the course makes (``rlhf_tutorial/``, ``course/``: the grep is in
the report), run on the tiny world's policy (its shipped ``HookedTransformer``-format weights), on the
stand-in GPT-2 hub's ``gpt2`` (``from_pretrained`` of a local cache; needs ``HF_HOME``) and on a random
small model (the checkers' fixture). A check passes, fails (it ran, the result is wrong: says how) or
errors (it raised: the exception). Numbers are compared with the 3.x run's (``--reference``): logits as
log-probabilities (the centred unembedding shifts logits by a constant per position). Only torch,
transformers, safetensors and transformer_lens are imported: the course package itself is not, so the
script runs in a venv without it. The last line printed is the JSON summary.
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import json
import os
import platform
import statistics
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "rlhf_tutorial" / "tiny" / "artifacts"
TL_VERSION = importlib.metadata.version("transformer-lens")
V4 = int(TL_VERSION.split(".")[0]) >= 4
PROMPT = "This movie was really"
TEXTS = ["This movie was really good", "I hated it", "The plot was slow and the acting was"]
#: Every hook name the course reads or writes (grep of rlhf_tutorial/ and course/), per layer where {L}.
COURSE_HOOKS = ["hook_embed", "hook_pos_embed", "blocks.{L}.hook_resid_pre", "blocks.{L}.hook_resid_mid",
                "blocks.{L}.hook_resid_post", "blocks.{L}.hook_attn_out", "blocks.{L}.hook_mlp_out",
                "blocks.{L}.attn.hook_z", "blocks.{L}.ln2.hook_normalized", "ln_final.hook_normalized",
                "ln_final.hook_scale"]


# --- loading: the one place where the two versions differ (what an adapter module would hold) ------------
def tiny_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TINY / "tokenizer"))


def load_tiny():
    """The tiny world's policy, processed as the course processes it (fold_ln, centred writing weights and
    unembedding, folded value biases): 3.x as ``worlds._load_tiny_policy`` does, 4.x through
    ``boot_native`` + ``convert_tl_checkpoint`` (TransformerLens-format weights) + compatibility mode."""
    from safetensors.torch import load_file

    config = json.loads((TINY / "policy" / "config.json").read_text())
    state = load_file(str(TINY / "policy" / "model.safetensors"))
    if V4:
        from transformer_lens import TransformerBridge
        from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

        cfg = {k: v for k, v in config.items() if k not in ("model_name", "original_architecture")}
        model = TransformerBridge.boot_native(cfg, tokenizer=tiny_tokenizer(), device="cpu")
        model.load_state_dict(convert_tl_checkpoint(state, model.cfg))
        model.enable_compatibility_mode(disable_warnings=True)
        return model.eval()
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(**{**config, "normalization_type": "LNPre"}, device="cpu", init_weights=False)
    model = HookedTransformer(cfg, tokenizer=tiny_tokenizer())
    model.load_and_process_state_dict(state, fold_ln=True, center_writing_weights=True, center_unembed=True,
                                      fold_value_biases=True)
    return model.eval()


def load_gpt2(name: str = "gpt2"):
    """``gpt2`` from the local Hugging Face cache (HF_HOME: the stand-in hub), processed as 3.x's
    ``from_pretrained`` does."""
    if V4:
        from transformer_lens import TransformerBridge

        model = TransformerBridge.boot_transformers(name, device="cpu")
        model.enable_compatibility_mode(disable_warnings=True)
        return model.eval()
    from transformer_lens import HookedTransformer

    return HookedTransformer.from_pretrained(name, device="cpu").eval()


def small_random(seed: int = 0):
    """The checkers' fixture (``checks/fixtures.small_model``): a seeded random 2-layer model, no tokenizer."""
    fields = dict(n_layers=2, d_model=32, n_ctx=32, d_head=8, n_heads=4, d_vocab=50, act_fn="gelu_new",
                  normalization_type="LN", seed=seed)
    if V4:
        from transformer_lens import TransformerBridge

        return TransformerBridge.boot_native(fields, device="cpu").eval()
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    return HookedTransformer(HookedTransformerConfig(**fields, device="cpu")).eval()


# --- the checks -------------------------------------------------------------------------------------------
class Fail(Exception):
    """The API ran but its result is not what the course relies on."""


def expect(ok: bool, why: str) -> None:
    if not ok:
        raise Fail(why)


class Probe:
    def __init__(self, reference: dict | None):
        self.reference = reference
        self.saved: dict[str, torch.Tensor] = {}
        self.results: dict[str, dict] = {}

    def close(self, name: str, value: torch.Tensor, atol: float = 1e-4) -> str:
        """Save ``value`` under ``name`` (3.x run); compare with the reference (4.x run)."""
        value = value.detach().float().cpu()
        self.saved[name] = value
        if self.reference is None or name not in self.reference:
            return "no reference"
        ref = self.reference[name]
        expect(ref.shape == value.shape, f"{name}: shape {tuple(value.shape)}, 3.x gave {tuple(ref.shape)}")
        diff = (ref - value).abs().max().item() if value.numel() else 0.0
        expect(diff <= atol, f"{name}: differs from 3.x by {diff:.3g} (> {atol:g})")
        return f"max |diff| vs 3.x {diff:.2g}"

    def run(self, name: str, fn, *args) -> None:
        start = time.perf_counter()
        try:
            detail = fn(*args)
            result = {"status": "pass", "detail": detail}
        except Fail as err:
            result = {"status": "fail", "detail": str(err)}
        except Exception as err:  # the API itself is missing or raises
            line = traceback.extract_tb(err.__traceback__)[-1]
            result = {"status": "error", "detail": f"{type(err).__name__}: {str(err)[:400]} "
                      f"({Path(line.filename).name}:{line.lineno})"}
        result["seconds"] = round(time.perf_counter() - start, 3)
        self.results[name] = result
        print(f"{result['status']:>5}  {name}: {str(result['detail'])[:160]}", flush=True)


def logprobs(logits: torch.Tensor) -> torch.Tensor:
    return logits.float().log_softmax(-1)


def course_hooks(n_layers: int) -> list[str]:
    return [h.replace("{L}", str(layer)) for h in COURSE_HOOKS for layer in range(n_layers) if "{L}" in h] + [
        h for h in COURSE_HOOKS if "{L}" not in h]


def checks(probe: Probe, world: str, load) -> None:
    p = f"{world}."
    box: dict = {}

    def load_it():
        start = time.perf_counter()
        box["m"] = load()
        return f"{type(box['m']).__name__} in {time.perf_counter() - start:.2f} s"

    probe.run(p + "load", load_it)
    if "m" not in box:
        return
    m = box["m"]
    L = m.cfg.n_layers
    tokens = m.to_tokens(PROMPT)

    def fresh():
        """A deep copy of the model. A no-grad forward first: on 4.3 a copy's forward with gradients leaves
        non-leaf tensors in the original (``deepcopy_after_a_copy_trained`` measures it), which makes the next
        ``deepcopy`` raise; the no-grad forward overwrites them, so the checks after it measure their own API."""
        with torch.no_grad():
            m(tokens)
        return copy.deepcopy(m)

    def cfg_fields():
        names = ["n_layers", "d_model", "n_heads", "d_head", "d_mlp", "d_vocab", "n_ctx", "act_fn", "eps",
                 "normalization_type", "device", "default_prepend_bos", "positional_embedding_type"]
        values = {n: getattr(m.cfg, n, "MISSING") for n in names}
        missing = [n for n, v in values.items() if v == "MISSING"]
        expect(not missing, f"cfg lacks {missing}")
        expect(values["normalization_type"] == "LNPre",
               f"cfg.normalization_type is {values['normalization_type']!r} after processing (the course asserts "
               "'LNPre': LayerNorm weights folded)")
        return {n: str(v) for n, v in values.items()}

    probe.run(p + "cfg_fields", cfg_fields)

    def to_tokens():
        expect(tokens[0, 0].item() == m.tokenizer.bos_token_id, "to_tokens does not prepend BOS by default")
        no_bos = m.to_tokens(PROMPT, prepend_bos=False)
        expect(no_bos.shape[1] == tokens.shape[1] - 1, "prepend_bos=False still prepends")
        batch = m.to_tokens(TEXTS)
        probe.close(p + "to_tokens_batch", batch.float(), atol=0)
        return f"{tokens.tolist()}; batch {tuple(batch.shape)}; " + probe.close(p + "to_tokens", tokens.float(), atol=0)

    probe.run(p + "to_tokens", to_tokens)

    def strings():
        text = m.to_string(m.to_tokens(PROMPT, prepend_bos=False)[0])
        expect(text == PROMPT, f"to_string gave {text!r}")
        pieces = m.to_str_tokens(PROMPT)
        decoded = m.tokenizer.batch_decode(tokens, skip_special_tokens=True)
        expect(decoded == [PROMPT], f"tokenizer.batch_decode gave {decoded}")
        return f"to_str_tokens {pieces}"

    probe.run(p + "to_string_to_str_tokens_batch_decode", strings)

    def forward():
        logits = m(tokens)
        expect(logits.shape == (1, tokens.shape[1], m.cfg.d_vocab), f"logits shape {tuple(logits.shape)}")
        expect(m(tokens, return_type=None) is None, "return_type=None does not return None")
        return probe.close(p + "logprobs", logprobs(logits))

    probe.run(p + "forward_logits", forward)

    def hook_names():
        missing = [h for h in course_hooks(L) if h not in m.hook_dict]
        expect(not missing, f"hook_dict lacks {missing}")
        return f"all {len(course_hooks(L))} course hook names present (hook_dict has {len(m.hook_dict)})"

    probe.run(p + "hook_names", hook_names)

    def run_with_cache():
        logits, cache = m.run_with_cache(tokens)
        details = []
        for h in course_hooks(L):
            details.append(probe.close(p + "cache." + h, cache[h], atol=2e-4))
        z = cache[f"blocks.{L - 1}.attn.hook_z"]
        expect(z.shape == (1, tokens.shape[1], m.cfg.n_heads, m.cfg.d_head), f"hook_z shape {tuple(z.shape)}")
        expect(cache["ln_final.hook_scale"].shape == (1, tokens.shape[1], 1),
               f"ln_final.hook_scale shape {tuple(cache['ln_final.hook_scale'].shape)}")
        torch.testing.assert_close(cache["z", 0], cache["blocks.0.attn.hook_z"])
        torch.testing.assert_close(cache["mlp_out", 0], cache["blocks.0.hook_mlp_out"])
        return f"{len(details)} activations; " + (details[-1] if details else "")

    probe.run(p + "run_with_cache", run_with_cache)

    def names_filter():
        _, cache = m.run_with_cache(tokens, names_filter="ln_final.hook_normalized")
        expect(list(cache.keys()) == ["ln_final.hook_normalized"], f"names_filter kept {list(cache.keys())}")
        return "one key"

    probe.run(p + "run_with_cache_names_filter", names_filter)

    def invariant():
        logits, cache = m.run_with_cache(tokens)
        rebuilt = cache["ln_final.hook_normalized"] @ m.W_U + m.b_U
        diff = (rebuilt - logits).abs().max().item()
        expect(diff < 1e-3, f"logits != ln_final.hook_normalized @ W_U + b_U (max diff {diff:.3g}): the value head "
               "and the logit lens read a different residual than the logits are made of")
        centred = m.W_U.mean(-1).abs().max().item()
        expect(centred < 1e-5, f"W_U is not centred (max |row mean| {centred:.3g})")
        return f"max diff {diff:.2g}; W_U centred"

    probe.run(p + "logits_from_normalized_residual", invariant)

    def accumulated():
        _, cache = m.run_with_cache(tokens)
        stack, labels = cache.accumulated_resid(return_labels=True, pos_slice=-1)
        expect(stack.shape == (L + 1, 1, m.cfg.d_model), f"accumulated_resid shape {tuple(stack.shape)}")
        return f"labels {labels}; " + probe.close(p + "accumulated_resid", stack, atol=2e-4)

    probe.run(p + "cache_accumulated_resid", accumulated)

    def hooks_read_patch():
        seen = {}

        def save(x, hook):
            seen["h"] = x.detach().clone()

        m.run_with_hooks(tokens, fwd_hooks=[("ln_final.hook_normalized", save)])
        _, cache = m.run_with_cache(tokens)
        torch.testing.assert_close(seen["h"], cache["ln_final.hook_normalized"])
        expect(not m.hook_dict["ln_final.hook_normalized"].fwd_hooks, "run_with_hooks left its hook in place")
        other = m.to_tokens("I hated this film so")[:, : tokens.shape[1]]
        _, src = m.run_with_cache(other)

        def patch(x, hook):
            x[:, -1] = src[hook.name][:, -1]
            return x

        patched = m.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_pre", patch)])
        return probe.close(p + "patched_logprobs", logprobs(patched))

    probe.run(p + "run_with_hooks_read_and_patch", hooks_read_patch)

    def hooks_context():
        seen = []
        with m.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: seen.append(1))]):
            m(tokens)
        m(tokens)
        expect(len(seen) == 1, f"the hook fired {len(seen)} times (once inside the context, never after)")
        return "fires inside only"

    probe.run(p + "hooks_context_manager", hooks_context)

    def hook_gradient():
        model = fresh().train()
        head = torch.nn.Linear(model.cfg.d_model, 1)
        store = {}

        def grab(x, hook):
            store["h"] = x

        model.run_with_hooks(tokens, return_type="logits", fwd_hooks=[("ln_final.hook_normalized", grab)])
        head(store["h"]).sum().backward()
        reached = [n for n, q in model.named_parameters() if q.grad is not None and q.grad.abs().sum() > 0]
        expect(len(reached) > 0, "no gradient reaches any parameter through the hook")
        grad = model.blocks[0].attn.W_Q.grad
        expect(grad is not None, f"the gradient reaches {len(reached)} of {len(list(model.parameters()))} parameter "
               "tensors, but blocks[0].attn.W_Q.grad is None: W_Q is computed from the parameters on access, not "
               "a parameter (chapter 03's checker reads W_Q.grad)")
        return f"{len(reached)} parameter tensors get a gradient; |grad W_Q| {grad.abs().sum().item():.3g}"

    probe.run(p + "value_head_gradient_through_hook", hook_gradient)

    def weights():
        d, v, h, e = m.cfg.d_model, m.cfg.d_vocab, m.cfg.n_heads, m.cfg.d_head
        shapes = {"W_U": (m.W_U, (d, v)), "b_U": (m.b_U, (v,)), "W_E": (m.W_E, (v, d)), "W_pos": (m.W_pos, (m.cfg.n_ctx, d)),
                  "W_O": (m.W_O, (L, h, e, d)), "b_O": (m.b_O, (L, d)),
                  "blocks[0].attn.W_Q": (m.blocks[0].attn.W_Q, (h, d, e)), "blocks[0].attn.b_O": (m.blocks[0].attn.b_O, (d,)),
                  "blocks[0].mlp.W_in": (m.blocks[0].mlp.W_in, (d, m.cfg.d_mlp)),
                  "blocks[0].mlp.W_out": (m.blocks[0].mlp.W_out, (m.cfg.d_mlp, d)),
                  "unembed.b_U": (m.unembed.b_U, (v,))}
        wrong = {k: tuple(t.shape) for k, (t, s) in shapes.items() if tuple(t.shape) != s}
        expect(not wrong, f"shapes differ from 3.x: {wrong}")
        ln_w, ln_b = getattr(m.ln_final, "w", None), getattr(m.ln_final, "b", None)
        if ln_w is None:
            return "W_U W_E W_pos W_O b_O W_Q mlp.W_in/W_out unembed.b_U: 3.x shapes; ln_final.w None (folded)"
        expect(bool((ln_w == 1).all()) and (ln_b is None or bool((ln_b == 0).all())),
               "ln_final.w/b hold weights after folding")
        return ("3.x shapes; ln_final.w exists but is all ones and ln_final.b zeros (folded into the next layer: "
                "speed.py's LayerNorm gives the same numbers)")

    probe.run(p + "weight_attributes", weights)

    def writable_bias():
        model = fresh()
        before = model(tokens)[0, -1]
        with torch.no_grad():
            model.unembed.b_U[5] += 3.0
        after = model(tokens)[0, -1]
        diff = (after - before)[5].item()
        expect(abs(diff - 3.0) < 1e-4, f"writing unembed.b_U[5] += 3 moved logit 5 by {diff:.3g} (checks of ch04 "
               "build models this way)")
        return "an in-place edit of unembed.b_U reaches the logits"

    probe.run(p + "in_place_weight_edit", writable_bias)

    def train_step():
        model = fresh().train()
        params = [q for q in model.parameters() if q.requires_grad]
        opt = torch.optim.Adam(params, lr=1e-4)
        target = tokens[:, 1:]

        def loss():
            return -logprobs(model(tokens))[:, :-1].gather(-1, target[..., None]).mean()

        first = loss()
        first.backward()
        opt.step()
        opt.zero_grad()
        second = loss().item()
        expect(second < first.item(), f"an Adam step on the parameters did not lower the loss ({first.item():.4f} -> {second:.4f})")
        n = sum(q.numel() for q in params)
        return f"{len(params)} tensors, {n} numbers; loss {first.item():.4f} -> {second:.4f}"

    probe.run(p + "optimizer_step_on_parameters", train_step)

    def train_mode_deterministic():
        model = fresh().train()  # the trainers train the policy in train mode
        with torch.no_grad():
            a, b = model(tokens), model(tokens)
        diff = (a - b).abs().max().item()
        expect(diff == 0, f"two forwards in train mode differ by {diff:.3g}: dropout is on (3.x's HookedTransformer "
               "has none; PPO's first ratio would not be 1, the reference and the policy would disagree)")
        return "no dropout"

    probe.run(p + "train_mode_deterministic", train_mode_deterministic)

    def state_dict_roundtrip():
        sd = m.state_dict()
        other = fresh()
        with torch.no_grad():
            for q in other.parameters():
                q.add_(0.1)
        other.load_state_dict(sd)
        torch.testing.assert_close(other(tokens), m(tokens))
        keys = sorted(k for k in sd if not k.endswith(("IGNORE", ".mask")))
        if probe.reference is not None and "keys" in probe.reference.get("_meta", {}).get(world, {}):
            same = keys == probe.reference["_meta"][world]["keys"]
            return f"{len(keys)} keys, {'the same' if same else 'NOT the same'} names as 3.x (e.g. {keys[:3]})"
        probe.saved.setdefault("_meta", {}).setdefault(world, {})["keys"] = keys
        return f"{len(keys)} keys (e.g. {keys[:3]})"

    probe.run(p + "state_dict_roundtrip", state_dict_roundtrip)

    def generate_greedy():
        out = m.generate(tokens, max_new_tokens=8, do_sample=False, verbose=False, stop_at_eos=False)
        expect(out.shape == (1, tokens.shape[1] + 8), f"shape {tuple(out.shape)}")
        step = tokens
        for _ in range(8):  # greedy by hand from forward passes
            step = torch.cat([step, m(step)[:, -1].argmax(-1, keepdim=True)], dim=1)
        if not torch.equal(out, step):
            first = int((out != step).any(0).nonzero()[0])
            top2 = m(out[:, :first])[0, -1].topk(2).values
            margin = (top2[0] - top2[1]).item()
            no_cache = m.generate(tokens, max_new_tokens=8, do_sample=False, verbose=False, stop_at_eos=False,
                                  use_past_kv_cache=False)
            expect(margin < 1e-3, f"greedy generate {out[0, tokens.shape[1]:].tolist()} != argmax rollout of the "
                   f"model's own forward {step[0, tokens.shape[1]:].tolist()} (top-2 logit margin {margin:.3g} where "
                   f"they part: not a tie); with use_past_kv_cache=False generate gives "
                   f"{no_cache[0, tokens.shape[1]:].tolist()}: the key/value-cache path computes something else")
            return (f"greedy generate and a by-hand argmax rollout part at a near-tie (top-2 logit margin "
                    f"{margin:.2g}, cached vs full forward rounding); " + probe.close(p + "greedy", out.float(), atol=1e9))
        return probe.close(p + "greedy", out.float(), atol=0)

    probe.run(p + "generate_greedy", generate_greedy)

    def generate_sample():
        torch.manual_seed(0)
        out = m.generate(tokens.expand(6, -1), max_new_tokens=10, stop_at_eos=False, temperature=0.7, top_k=10,
                         verbose=False, return_type="tokens").clone()
        expect(out.shape == (6, tokens.shape[1] + 10), f"shape {tuple(out.shape)}")
        expect(torch.equal(out[:, : tokens.shape[1]], tokens.expand(6, -1)), "the prompt is not kept")
        eos = m.tokenizer.eos_token_id
        stop = m.generate(tokens.expand(6, -1), max_new_tokens=10, stop_at_eos=True, eos_token_id=eos, verbose=False,
                          return_type="tokens")
        expect(stop.shape[0] == 6 and stop.shape[1] <= tokens.shape[1] + 10, f"stop_at_eos shape {tuple(stop.shape)}")
        return f"temperature/top_k/return_type ok; stop_at_eos shape {tuple(stop.shape)}"

    probe.run(p + "generate_sampling_kwargs", generate_sample)

    def generate_under_hooks():
        plain = m.generate(tokens, max_new_tokens=6, do_sample=False, verbose=False, stop_at_eos=False)
        push = m.W_E[plain[0, -1]] * 0 + m.W_U[:, 7] * 50  # a steering vector towards token 7

        def steer(x, hook):
            return x + push

        with m.hooks(fwd_hooks=[(f"blocks.{L - 1}.hook_resid_post", steer)]):
            steered = m.generate(tokens, max_new_tokens=6, do_sample=False, verbose=False, stop_at_eos=False)
        expect(not torch.equal(plain, steered), "generate inside model.hooks(...) ignored the hook")
        return f"steered greedy {steered[0, tokens.shape[1]:].tolist()} vs {plain[0, tokens.shape[1]:].tolist()}"

    probe.run(p + "generate_inside_hooks", generate_under_hooks)

    def deepcopy_and_modes():
        other = fresh().requires_grad_(False).eval()
        torch.testing.assert_close(other(tokens), m(tokens))
        return "deepcopy, requires_grad_(False), eval()"

    probe.run(p + "deepcopy", deepcopy_and_modes)

    def deepcopy_after_a_copy_trained():
        base = load()  # its own model: the outcome depends on what ran on it before, so start from a known state
        with torch.no_grad():
            base(tokens)  # a model that has run (right after loading, the copy below does not leak)
        policy = copy.deepcopy(base).train()  # the trainers' pattern: policy = deepcopy(base); train; ref = deepcopy(base)
        store = {}
        policy.run_with_hooks(tokens, fwd_hooks=[("ln_final.hook_normalized", lambda x, hook: store.update(h=x))])
        store["h"].sum().backward()  # a value head's loss, as in chapter 03
        try:
            reference = copy.deepcopy(base)
        except RuntimeError as err:
            raise Fail(f"deepcopy(base) after a gradient forward of an earlier deepcopy(base) raises: "
                       f"{str(err)[:120]}") from err
        torch.testing.assert_close(reference(tokens), base(tokens))
        return "deepcopy(base) again after training a copy"

    probe.run(p + "deepcopy_after_a_copy_trained", deepcopy_after_a_copy_trained)

    def isinstance_check():
        try:
            from transformer_lens import HookedTransformer
        except ImportError as err:
            raise Fail(f"{err}: 19 package modules and the chapter sources import it at the top, "
                       "speed.can_fast_sample tests isinstance") from err
        expect(isinstance(m, HookedTransformer), f"{type(m).__name__} is not a HookedTransformer")
        return "isinstance(model, HookedTransformer)"

    probe.run(p + "import_and_isinstance_HookedTransformer", isinstance_check)


def timings(probe: Probe, m, repeat: int = 5) -> dict:
    """Median seconds of a forward (batch 16 x 64 tokens), a run_with_cache of it, and a sampled generate
    (batch 16, 30 new tokens), on one thread."""
    out = {}
    tokens = torch.randint(0, m.cfg.d_vocab, (16, 64), generator=torch.Generator().manual_seed(0))
    prompt = m.to_tokens(PROMPT).expand(16, -1)

    def med(fn):
        fn()  # warm-up
        runs = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - start)
        return round(statistics.median(runs), 4)

    with torch.no_grad():
        out["forward_16x64_s"] = med(lambda: m(tokens))
        out["run_with_cache_16x64_s"] = med(lambda: m.run_with_cache(tokens))
    out["generate_16x30_s"] = med(lambda: m.generate(prompt, max_new_tokens=30, stop_at_eos=False, verbose=False))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the summary JSON here too")
    ap.add_argument("--save-reference", help="(3.x run) save the numbers the 4.x run compares with")
    ap.add_argument("--reference", help="(4.x run) the file --save-reference wrote")
    ap.add_argument("--skip-gpt2", action="store_true", help="no stand-in GPT-2 (HF_HOME without it)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    reference = torch.load(args.reference, weights_only=False) if args.reference else None
    probe = Probe(reference)
    start = time.perf_counter()
    checks(probe, "tiny", load_tiny)
    if not args.skip_gpt2:
        checks(probe, "gpt2", load_gpt2)
    probe.run("random_fixture.build", lambda: f"{type(small_random()).__name__}, "
              f"{sum(q.numel() for q in small_random().parameters())} parameters")

    def conversion_import():
        from transformer_lens.pretrained.weight_conversions.gpt2 import convert_gpt2_weights  # noqa: F401

        return "transformer_lens.pretrained.weight_conversions.gpt2 (tiny/build.py)"

    probe.run("tiny_build.convert_gpt2_weights_import", conversion_import)
    timing: dict = {}
    try:
        timing = timings(probe, load_tiny())
    except Exception as err:
        timing = {"error": f"{type(err).__name__}: {err}"}
    if args.save_reference:
        Path(args.save_reference).parent.mkdir(parents=True, exist_ok=True)
        torch.save(probe.saved, args.save_reference)
    counts = {s: sum(r["status"] == s for r in probe.results.values()) for s in ("pass", "fail", "error")}
    summary = {"command": "tl4_probe", "transformer_lens": TL_VERSION, "torch": torch.__version__,
               "python": platform.python_version(), "threads": torch.get_num_threads(),
               "hf_home": os.environ.get("HF_HOME"), "compared_with_reference": reference is not None,
               "counts": counts, "timings_tiny": timing, "results": probe.results,
               "seconds": round(time.perf_counter() - start, 1)}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
