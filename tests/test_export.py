"""export-hf: a HookedTransformer policy (base or tuned) to a transformers GPT-2 with the same logits."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import GPT2LMHeadModel

from rlhf_tutorial.trainers import export, rlhf
from rlhf_tutorial.worlds import load_policy


def sampled_tokens(policy, n: int = 6, new: int = 20, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    prompt = policy.to_tokens("This movie was really")
    with torch.no_grad():
        return policy.generate(prompt.expand(n, -1), max_new_tokens=new, verbose=False, stop_at_eos=False).clone()


@pytest.fixture(scope="module")
def tuned_checkpoint(tmp_path_factory):
    """A checkpoint saved by chapter 03's trainer after two phases of RLHF with a large learning rate,
    so that every weight (the unembedding bias included) has moved from the base policy."""
    args = rlhf.RLHFArgs.preset("tiny", batch_size=16, gen_len=8, num_minibatches=2, num_phases=2,
                                warmup_steps=0, learning_rate=3e-3, eval_samples=8, early_stopping=False)
    trainer = rlhf.RLHFTrainer(args)
    trainer.train(progress=False)
    return rlhf.save_tuned_policy(trainer.model, tmp_path_factory.mktemp("tuned"), args)


def test_base_policy_round_trips(tmp_path):
    policy = load_policy("tiny", device="cpu")
    folder = export.export_hf(policy, tmp_path / "hf")
    model, tokenizer = export.load_hf_policy(folder)
    assert isinstance(model, GPT2LMHeadModel) and model.lm_head.bias is not None
    assert export.max_logit_diff(policy, model, sampled_tokens(policy)) < 1e-4
    # the tokenizer is the policy's, with a pad token for batched generation
    text = "This movie was really good"
    assert tokenizer(text)["input_ids"] == policy.tokenizer(text)["input_ids"]
    assert tokenizer.pad_token is not None


def test_tuned_checkpoint_round_trips_with_value_head(tuned_checkpoint, tmp_path):
    tuned = rlhf.load_tuned_policy(tuned_checkpoint, device="cpu")  # the export and its comparison run on the CPU
    base = load_policy("tiny", device="cpu")
    assert (tuned.base_model.b_U - base.b_U).abs().max() > 1e-4, "the fixture should have moved b_U"
    summary = export.main(["--checkpoint", str(tuned_checkpoint), "--out", str(tmp_path / "hf")])
    assert summary["value_head"] and summary["max_abs_logit_diff"] < 1e-4, summary
    model, _ = export.load_hf_policy(tmp_path / "hf")
    tokens = sampled_tokens(tuned.base_model, seed=1)
    assert export.max_logit_diff(tuned.base_model, model, tokens) < 1e-4
    # the value head reads the last hidden state (after ln_f), as chapter 03's reads ln_final.hook_normalized
    head = export.load_value_head(tmp_path / "hf")
    with torch.no_grad():
        _, values = tuned(tokens)
        hidden = model(tokens, output_hidden_states=True).hidden_states[-1]
        assert (head(hidden).squeeze(-1) - values).abs().max() < 1e-4
    assert json.loads((tmp_path / "hf" / export.VALUE_HEAD_CONFIG).read_text())["layers"][1]["type"] == "ReLU"


def test_the_unembedding_bias_matters():
    """Dropping b_U (what GPT-2's bias-free head would do) changes the logits far beyond the tolerance,
    so the round-trip tests above do test the bias."""
    policy = load_policy("tiny", device="cpu")
    model = export.to_hf(policy)
    with torch.no_grad():
        model.lm_head.bias.zero_()
    assert export.max_logit_diff(policy, model, sampled_tokens(policy)) > 1e-2


def test_untied_head_and_safetensors_only(tmp_path):
    policy = load_policy("tiny", device="cpu")
    folder = export.export_hf(policy, tmp_path / "hf")
    model, _ = export.load_hf_policy(folder)
    assert model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr()
    assert not list(folder.glob("*.bin")) and (folder / "model.safetensors").exists()
    assert json.loads((folder / "config.json").read_text())["model_type"] == "gpt2_unembed_bias"


def test_cli_reports_a_missing_checkpoint(tmp_path):
    summary = export.main(["--checkpoint", str(tmp_path / "nothing"), "--out", str(tmp_path / "hf")])
    assert "error" in summary and "train-rlhf --save" in summary["error"]


def test_tl_from_hf_reads_an_export_back_exactly():
    """The export in reverse (how TRL's trained weights come back to a HookedTransformer): exact, and a
    trained LayerNorm (which our policy cannot hold) is refused."""
    import torch

    from rlhf_tutorial.trainers.export import tl_from_hf, to_hf
    from rlhf_tutorial.worlds import load_policy

    base = load_policy("tiny", device="cpu")
    back = tl_from_hf(to_hf(base), base)
    for name, value in base.state_dict().items():
        assert torch.equal(back.state_dict()[name], value), name
    hf = to_hf(base)
    with torch.no_grad():
        hf.transformer.ln_f.weight.add_(0.1)
    with pytest.raises(ValueError, match="identity"):
        tl_from_hf(hf, base)
