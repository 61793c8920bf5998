"""Export a policy to Hugging Face transformers: the bridge from this course to TRL and its ecosystem.

A policy here is a TransformerLens ``HookedTransformer`` loaded with TransformerLens's processing:
every LayerNorm's weight and bias folded into the next linear map (``normalization_type = "LNPre"``,
a LayerNorm with no parameters of its own), the writing weights and the unembedding centred, the
value biases folded into the output bias, and Q, K, V kept as separate ``[n_heads, d_model, d_head]``
tensors. All of that is a reparametrisation: the same function, so it maps exactly onto a
transformers ``GPT2LMHeadModel`` whose LayerNorms are the identity affine map (weight 1, bias 0)::

    wte = W_E                      wpe = W_pos
    c_attn.weight = [W_Q | W_K | W_V]   heads concatenated: [d_model, 3 * n_heads * d_head]
    c_attn.bias   = [b_Q | b_K | b_V]   c_proj = W_O (heads flattened), b_O
    mlp.c_fc = W_in, b_in               mlp.c_proj = W_out, b_out
    logits = ln_f(resid) @ W_U + b_U

The last line is the one thing GPT-2's own head cannot hold: ``GPT2LMHeadModel.lm_head`` is a
``Linear`` without bias, tied to ``wte``. After folding, ``W_U`` is no longer ``W_E``'s transpose
and ``b_U`` is not zero (the final LayerNorm's bias lands there, and RL tuning trains it), so the
export uses ``GPT2WithUnembedBias``: a ``GPT2LMHeadModel`` subclass whose untied head has a bias.
Its ``model_type`` is ``gpt2_unembed_bias``, registered with the Auto classes when this module is
imported; a plain transformers install refuses the folder instead of silently dropping the bias.
The bias is a parameter of the head, trained like the rest (not folded into a LayerNorm, where it
would train at a different rate).

``export_hf(policy, out)`` writes the model and tokenizer (``save_pretrained``), and a chapter-03
value head beside them (``value_head.safetensors`` + ``value_head.json``). ``load_hf_policy(out)``
loads it back. ``python -m rlhf_tutorial export-hf --checkpoint DIR --out DIR`` exports a checkpoint
saved by ``train-rlhf --save DIR`` (``--world tiny`` without ``--checkpoint``: the base policy), and
reports the largest logit difference between the two models on sampled text.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens import HookedTransformer
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from rlhf_tutorial.worlds import PROMPT

VALUE_HEAD_FILE, VALUE_HEAD_CONFIG = "value_head.safetensors", "value_head.json"


class GPT2WithUnembedBiasConfig(GPT2Config):
    """GPT-2's config under its own model type, so that the Auto classes pick the biased head."""

    model_type = "gpt2_unembed_bias"
    # No remote code: TRL reads ``config.auto_map`` of a class it does not find in transformers.
    auto_map = {}  # (a plain class attribute, not a config field)


class GPT2WithUnembedBias(GPT2LMHeadModel):
    """``GPT2LMHeadModel`` whose language-model head has a bias: ``logits = h @ W_U + b_U``.

    The head is untied from the token embedding (``tie_word_embeddings=False``). Everything else is
    GPT-2: generation, ``from_pretrained``, TRL's trainers take it as they take GPT-2.
    """

    config_class = GPT2WithUnembedBiasConfig
    _tied_weights_keys: Any = None

    def __init__(self, config: GPT2Config):
        super().__init__(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=True)
        self.post_init()


AutoConfig.register(GPT2WithUnembedBiasConfig.model_type, GPT2WithUnembedBiasConfig, exist_ok=True)
AutoModelForCausalLM.register(GPT2WithUnembedBiasConfig, GPT2WithUnembedBias, exist_ok=True)


def check_exportable(policy: HookedTransformer) -> None:
    """Raise ``ValueError`` naming the first setting GPT-2's architecture cannot express."""
    cfg = policy.cfg
    wanted = {
        "normalization_type": ("LNPre", "LN"), "positional_embedding_type": ("standard",),
        "attn_only": (False,), "gated_mlp": (False,), "parallel_attn_mlp": (False,),
        "final_rms": (False,), "use_local_attn": (False,), "attention_dir": ("causal",),
    }
    for name, allowed in wanted.items():
        if getattr(cfg, name) not in allowed:
            raise ValueError(f"cannot export to GPT-2: cfg.{name} = {getattr(cfg, name)!r} (need one of {allowed})")
    if cfg.n_key_value_heads not in (None, cfg.n_heads):
        raise ValueError("cannot export to GPT-2: grouped-query attention")
    if not cfg.use_attn_scale or abs(float(cfg.attn_scale) - cfg.d_head**0.5) > 1e-6:
        raise ValueError(f"cannot export to GPT-2: attention scale {cfg.attn_scale} is not sqrt(d_head)")


def hf_config(policy: HookedTransformer) -> GPT2WithUnembedBiasConfig:
    """The transformers config of ``policy``'s architecture (special tokens from its tokenizer)."""
    cfg, tok = policy.cfg, policy.tokenizer
    return GPT2WithUnembedBiasConfig(
        vocab_size=cfg.d_vocab, n_positions=cfg.n_ctx, n_embd=cfg.d_model, n_layer=cfg.n_layers,
        n_head=cfg.n_heads, n_inner=cfg.d_mlp, activation_function=cfg.act_fn,
        layer_norm_epsilon=cfg.eps, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        tie_word_embeddings=False,
        bos_token_id=getattr(tok, "bos_token_id", None), eos_token_id=getattr(tok, "eos_token_id", None),
        architectures=[GPT2WithUnembedBias.__name__],
    )


def hf_state_dict(policy: HookedTransformer) -> dict[str, Tensor]:
    """``policy``'s weights under GPT-2's names and layouts (see the module docstring)."""
    cfg = policy.cfg
    d = cfg.d_model

    def ln(prefix: str, module: nn.Module) -> dict[str, Tensor]:
        # LNPre (folded) is LayerNorm with weight 1, bias 0; an unfolded "LN" keeps its own.
        w = getattr(module, "w", None)
        b = getattr(module, "b", None)
        return {f"{prefix}.weight": torch.ones(d) if w is None else w.detach().clone(),
                f"{prefix}.bias": torch.zeros(d) if b is None else b.detach().clone()}

    out: dict[str, Tensor] = {
        "transformer.wte.weight": policy.W_E.detach(),  # [d_vocab d_model]
        "transformer.wpe.weight": policy.W_pos.detach(),  # [n_ctx d_model]
        **ln("transformer.ln_f", policy.ln_final),
        "lm_head.weight": policy.W_U.detach().T,  # [d_vocab d_model]: Linear stores W_U transposed
        "lm_head.bias": policy.b_U.detach(),
    }
    for i, block in enumerate(policy.blocks):
        attn, mlp, p = block.attn, block.mlp, f"transformer.h.{i}"
        heads_w = [einops.rearrange(w.detach(), "n m h -> m (n h)") for w in (attn.W_Q, attn.W_K, attn.W_V)]
        heads_b = [einops.rearrange(b.detach(), "n h -> (n h)") for b in (attn.b_Q, attn.b_K, attn.b_V)]
        out.update({
            **ln(f"{p}.ln_1", block.ln1), **ln(f"{p}.ln_2", block.ln2),
            f"{p}.attn.c_attn.weight": torch.cat(heads_w, dim=1),  # [d_model 3*n_heads*d_head]
            f"{p}.attn.c_attn.bias": torch.cat(heads_b),
            f"{p}.attn.c_proj.weight": einops.rearrange(attn.W_O.detach(), "n h m -> (n h) m"),
            f"{p}.attn.c_proj.bias": attn.b_O.detach(),
            f"{p}.mlp.c_fc.weight": mlp.W_in.detach(), f"{p}.mlp.c_fc.bias": mlp.b_in.detach(),
            f"{p}.mlp.c_proj.weight": mlp.W_out.detach(), f"{p}.mlp.c_proj.bias": mlp.b_out.detach(),
        })
    return {k: v.float().cpu().contiguous().clone() for k, v in out.items()}


def to_hf(policy: HookedTransformer) -> GPT2WithUnembedBias:
    """A transformers model computing the same logits as ``policy`` (in eval mode, on the CPU)."""
    check_exportable(policy)
    model = GPT2WithUnembedBias(hf_config(policy))
    missing, unexpected = model.load_state_dict(hf_state_dict(policy), strict=False)
    missing = [k for k in missing if not k.endswith(".attn.bias") and not k.endswith(".masked_bias")]
    if missing or unexpected:
        raise RuntimeError(f"export mapping incomplete: missing {missing}, unexpected {unexpected}")
    return model.eval()


def tl_from_hf(model, template: HookedTransformer) -> HookedTransformer:
    """The inverse of ``export.hf_state_dict``: a copy of ``template`` holding ``model``'s weights (a
    ``GPT2WithUnembedBias`` whose LayerNorms are still the identity). Exact: only reshapes."""
    cfg = template.cfg
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    for k, v in sd.items():
        if ".ln_" in k:
            want = torch.ones_like(v) if k.endswith("weight") else torch.zeros_like(v)
            if not torch.equal(v, want):
                raise ValueError(f"{k} is not the identity: the LayerNorm was trained (our policy has none)")
    out = {"embed.W_E": sd["transformer.wte.weight"], "pos_embed.W_pos": sd["transformer.wpe.weight"],
           "unembed.W_U": sd["lm_head.weight"].T, "unembed.b_U": sd["lm_head.bias"]}
    for i in range(cfg.n_layers):
        p, b = f"transformer.h.{i}", f"blocks.{i}"
        ws = sd[f"{p}.attn.c_attn.weight"].chunk(3, dim=1)
        bs = sd[f"{p}.attn.c_attn.bias"].chunk(3)
        for name, w, bias in zip("QKV", ws, bs):
            out[f"{b}.attn.W_{name}"] = einops.rearrange(w, "m (n h) -> n m h", n=cfg.n_heads)
            out[f"{b}.attn.b_{name}"] = einops.rearrange(bias, "(n h) -> n h", n=cfg.n_heads)
        out[f"{b}.attn.W_O"] = einops.rearrange(sd[f"{p}.attn.c_proj.weight"], "(n h) m -> n h m", n=cfg.n_heads)
        out[f"{b}.attn.b_O"] = sd[f"{p}.attn.c_proj.bias"]
        out.update({f"{b}.mlp.W_in": sd[f"{p}.mlp.c_fc.weight"], f"{b}.mlp.b_in": sd[f"{p}.mlp.c_fc.bias"],
                    f"{b}.mlp.W_out": sd[f"{p}.mlp.c_proj.weight"], f"{b}.mlp.b_out": sd[f"{p}.mlp.c_proj.bias"]})
    policy = copy.deepcopy(template)
    missing, unexpected = policy.load_state_dict(out, strict=False)
    missing = [k for k in missing if not k.endswith((".mask", ".IGNORE"))]
    if missing or unexpected:
        raise RuntimeError(f"HF -> TransformerLens mapping incomplete: missing {missing}, unexpected {unexpected}")
    return policy.eval()


def freeze_layernorms(model) -> int:
    """Freeze the export's LayerNorm parameters (ours has none to train); returns how many tensors."""
    frozen = 0
    for name, param in model.named_parameters():
        if ".ln_" in name or name.startswith("transformer.ln_f"):
            param.requires_grad_(False)
            frozen += 1
    return frozen


def export_hf(policy: HookedTransformer, out: str | Path, value_head: nn.Module | None = None) -> Path:
    """Write ``policy`` (and its tokenizer) to ``out`` with ``save_pretrained``; a value head (chapter
    03's ``nn.Sequential`` reading ``ln_final.hook_normalized``, which is the input of transformers'
    ``lm_head``: ``output_hidden_states[-1]``) goes beside it. Returns the folder."""
    from safetensors.torch import save_file

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    to_hf(policy).save_pretrained(folder)
    tokenizer = policy.tokenizer
    if tokenizer.pad_token is None:  # generation and TRL want a pad token; GPT-2 pads with EOS
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.save_pretrained(folder)
    if value_head is not None:
        state = {k: v.detach().float().cpu().contiguous() for k, v in value_head.state_dict().items()}
        save_file(state, str(folder / VALUE_HEAD_FILE))
        layers = [{"type": type(m).__name__, **({"in": m.in_features, "out": m.out_features}
                                                if isinstance(m, nn.Linear) else {})} for m in value_head]
        (folder / VALUE_HEAD_CONFIG).write_text(json.dumps({
            "reads": "the last hidden state (after ln_f): model(..., output_hidden_states=True).hidden_states[-1]",
            "layers": layers,
        }, indent=2))
    return folder


def load_hf_policy(folder: str | Path):
    """``(model, tokenizer)`` from an ``export_hf`` folder (safetensors only; eval mode)."""
    from transformers import AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(folder), use_safetensors=True)
    return model.eval(), AutoTokenizer.from_pretrained(str(folder))


def load_value_head(folder: str | Path) -> nn.Sequential:
    """The value head saved beside an export (``Linear -> ReLU -> Linear`` as chapter 03 builds it)."""
    from safetensors.torch import load_file

    spec = json.loads((Path(folder) / VALUE_HEAD_CONFIG).read_text())
    kinds = {"Linear": lambda s: nn.Linear(s["in"], s["out"]), "ReLU": lambda s: nn.ReLU()}
    head = nn.Sequential(*(kinds[s["type"]](s) for s in spec["layers"]))
    head.load_state_dict(load_file(str(Path(folder) / VALUE_HEAD_FILE)))
    return head.eval()


@torch.no_grad()
def max_logit_diff(policy: HookedTransformer, hf_model: nn.Module, tokens: Int[Tensor, "b s"]) -> float:
    """max |logits_TL - logits_HF| over every position of ``tokens``."""
    ours: Float[Tensor, "b s v"] = policy(tokens.to(policy.cfg.device), return_type="logits")
    theirs = hf_model(tokens.to(hf_model.device)).logits
    return (ours.float().cpu() - theirs.float().cpu()).abs().max().item()


def load_checkpoint(checkpoint: str | None, world: str | None) -> tuple[HookedTransformer, nn.Module | None, str]:
    """The policy to export: a chapter-03 checkpoint folder (policy + value head), else the world's
    base policy. Returns ``(policy, value_head or None, description)``."""
    from rlhf_tutorial.worlds import load_policy, resolve_world

    if checkpoint is None:
        name = resolve_world(world)
        return load_policy(name, device="cpu"), None, f"base policy of the {name!r} world"
    from rlhf_tutorial.trainers.checkpoint import CONFIG_FILE, load_tuned_policy

    if not (Path(checkpoint) / CONFIG_FILE).exists():
        raise FileNotFoundError(f"{checkpoint} is not a checkpoint saved by `train-rlhf --save` (no {CONFIG_FILE})")
    tuned = load_tuned_policy(checkpoint, device="cpu")  # the export is built on the CPU
    return tuned.base_model, tuned.value_head, f"tuned checkpoint {checkpoint}"


def main(argv: list[str]) -> dict:
    """``python -m rlhf_tutorial export-hf [--checkpoint DIR | --world tiny|gpt2] --out DIR``"""
    p = argparse.ArgumentParser(prog="python -m rlhf_tutorial export-hf",
                                description="Export a policy (and its value head) to a transformers GPT-2 folder.")
    p.add_argument("--checkpoint", default=None, help="a folder written by `train-rlhf --save` (default: the base policy)")
    p.add_argument("--world", default=None, help="without --checkpoint: whose base policy ('tiny' or 'gpt2')")
    p.add_argument("--out", required=True, help="folder to write (from_pretrained loads it)")
    p.add_argument("--seed", type=int, default=0, help="seeds the text the logits are compared on")
    ns = p.parse_args(argv)
    try:
        policy, value_head, what = load_checkpoint(ns.checkpoint, ns.world)
    except (FileNotFoundError, ValueError) as err:
        return {"error": str(err)}
    folder = export_hf(policy, ns.out, value_head)
    model, _ = load_hf_policy(folder)
    torch.manual_seed(ns.seed)
    prompt = policy.to_tokens(PROMPT)
    with torch.no_grad():
        tokens = policy.generate(prompt.expand(8, -1), max_new_tokens=24, verbose=False, stop_at_eos=False)
    return {
        "exported": what,
        "out": str(folder),
        "model_class": type(model).__name__,
        "files": sorted(f.name for f in folder.iterdir()),
        "value_head": value_head is not None,
        "max_abs_logit_diff": max_logit_diff(policy, model, tokens.clone()),
        "compared_on": list(tokens.shape),
    }
