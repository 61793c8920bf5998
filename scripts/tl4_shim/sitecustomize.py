"""An experiment, not part of the course: run the course's tests on TransformerLens 4.x through one shim.

``scripts/tl4_ch00_ch05.sh`` puts this folder on ``PYTHONPATH`` of a side venv that has TransformerLens 4.x
(never the course's .venv), so every Python process there, the notebook kernels of nbval included,
imports it at start-up. It stands for the adapter module a port would add (``docs/TRANSFORMERLENS4.md``):
the names the course imports from ``transformer_lens`` (``HookedTransformer``, ``HookedTransformerConfig``)
built from 4.x's ``TransformerBridge`` in compatibility mode, and the two loaders that read the tiny
world's TransformerLens-format weights (``worlds._load_tiny_policy``, ``checkpoint.load_tuned_policy``)
converted with ``convert_tl_checkpoint``. It changes nothing when TransformerLens 3.x is installed.
"""

from __future__ import annotations

import importlib.metadata
import os

if os.environ.get("RLHF_TUTORIAL_TL4_SHIM") == "1" and int(importlib.metadata.version("transformer-lens")[0]) >= 4:
    import transformer_lens
    from transformer_lens import TransformerBridge

    _DROP = {"init_weights", "model_name", "original_architecture", "device"}

    def HookedTransformerConfig(**fields):  # noqa: N802  (the 3.x name)
        """3.x's config class: here the dict of fields that ``boot_native`` takes."""
        return dict(fields)

    class _IsBridge(type):
        def __instancecheck__(cls, obj) -> bool:
            return isinstance(obj, TransformerBridge)

    class HookedTransformer(metaclass=_IsBridge):
        """3.x's ``HookedTransformer(cfg, tokenizer)``: a native 4.x bridge of the same shape."""

        def __new__(cls, cfg, tokenizer=None, **_):
            fields = {k: v for k, v in dict(cfg).items() if k not in _DROP}
            bridge = TransformerBridge.boot_native(fields, tokenizer=tokenizer, device=dict(cfg).get("device", "cpu"))
            if fields.get("normalization_type") == "LNPre":
                bridge.enable_compatibility_mode(disable_warnings=True)
            return bridge

        @classmethod
        def from_pretrained(cls, name, device=None, **_):
            bridge = TransformerBridge.boot_transformers(name, device=device)
            bridge.enable_compatibility_mode(disable_warnings=True)
            return bridge

    transformer_lens.HookedTransformer = HookedTransformer
    transformer_lens.HookedTransformerConfig = HookedTransformerConfig

    def _tl_format_into(bridge, state):
        from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

        converted = convert_tl_checkpoint(state, bridge.cfg)
        missing = [k for k in bridge.state_dict() if k not in converted]
        if any(".ln" not in k and "ln_" not in k for k in missing):
            raise RuntimeError(f"weights missing from the checkpoint: {missing}")
        # A processed (LNPre) checkpoint has no LayerNorm weights: the bridge's stay the folded ones and zeros.
        bridge.load_state_dict({**{k: bridge.state_dict()[k] for k in missing}, **converted})

    def _load_tiny_policy(root, device):
        import json

        from transformers import AutoTokenizer

        from rlhf_tutorial.worlds import _load_float32_safetensors

        config = json.loads((root / "policy" / "config.json").read_text())
        fields = {k: v for k, v in config.items() if k not in _DROP}
        bridge = TransformerBridge.boot_native(fields, tokenizer=AutoTokenizer.from_pretrained(str(root / "tokenizer")),
                                               device=str(device))
        _tl_format_into(bridge, _load_float32_safetensors(root / "policy" / "model.safetensors"))
        bridge.enable_compatibility_mode(disable_warnings=True)
        return bridge.eval()

    def load_tuned_policy(path, device=None):
        import json
        from pathlib import Path

        from safetensors.torch import load_file

        from rlhf_tutorial.rlhf import TransformerWithValueHead
        from rlhf_tutorial.trainers.checkpoint import CONFIG_FILE, WEIGHTS_FILE
        from rlhf_tutorial.worlds import load_policy

        folder = Path(path)
        config = json.loads((folder / CONFIG_FILE).read_text())
        model = TransformerWithValueHead(load_policy(config["world"], device=device))
        state = load_file(str(folder / WEIGHTS_FILE))
        base = {k.removeprefix("base_model."): v for k, v in state.items() if k.startswith("base_model.")}
        _tl_format_into(model.base_model, base)  # the checkpoint holds the processed (LNPre) weights
        rest = {k: v for k, v in state.items() if not k.startswith("base_model.")}
        model.load_state_dict(rest, strict=False)
        return model.eval()

    import rlhf_tutorial.trainers.checkpoint as _checkpoint
    import rlhf_tutorial.worlds as _worlds

    _worlds._load_tiny_policy = _load_tiny_policy
    _checkpoint.load_tuned_policy = load_tuned_policy
