"""Checkers for chapter 02: rewards, whitening, shaping and the Bradley-Terry reward model.

Regimes probed (where plausible implementations differ):
- reward_fn_char_count: empty samples, a batch of 1, case variants ('T' is not 't') and whitespace as
  the character, no samples at all;
- reward_fn_sentiment: a single review (no padding, so the attention mask cannot matter: isolates the
  label index), POSITIVE at index 0 and at index 1, both directions, padding of very different lengths,
  a label2id whose keys are not in the order of their ids, 150 samples (more than one forward pass's
  worth), a review longer than the classifier takes, no samples, a classifier in bfloat16, an unknown
  direction;
- whiten: one element, all-equal values (variance 0: eps matters; values whose mean float32 computes
  exactly, so the exact answer is every correct implementation's), 1-, 2- and 3-d inputs, shift_mean
  both ways, a large eps;
- ngram_repetition: repeated spaces, tabs and newlines, leading/trailing whitespace, empty text, fewer
  than n words and exactly n words, n = 1, 2, 3, 4, n-grams differing only by case or punctuation,
  n-grams whose words glued together are the same text, no samples;
- bradley_terry_loss: ties (all differences 0), differences up to +-12, then -300 .. +220 (exp overflows
  and sigmoid underflows there; an eps or clamp saturates);
- pool_last_token / pool_mean: right and left padding, a boolean mask, no padding, a row with one real token,
  inf at every padding position (a mask multiplied in, or a one-hot product, gives 0 * inf = NaN there;
  torch.where and indexing do not);
- RewardModel / reward_model_train_step: the three poolings with right and left padding, a batch of 1
  (a squeeze() without a dim drops the batch dimension there), no mask given (with token id 0 in the
  texts), the gradient to the backbone and the head under each pooling; two SGD steps (zero_grad, the
  step, the masks) on four pairs, one of them a tie (identical texts: r_c - r_r exactly 0, where
  r_c >= r_r miscounts the accuracy), one margin in (0, 1) at the second step.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from transformer_lens import HookedTransformer

from rlhf_tutorial import rewards
from rlhf_tutorial.checks import fixtures
from rlhf_tutorial.checks.core import (
    Case,
    CheckFailure,
    Mistake,
    call,
    check_device,
    checker,
    compare_to_reference,
    expect_tensor,
    failure,
    fmt,
    get_attr,
    seeded,
    to_device,
)
from rlhf_tutorial.notebooks import solution_code
from rlhf_tutorial.trainers.plug import DIFFERENTIATED

CHAPTER = "02_rewards"
small_model = partial(fixtures.small_model, d_vocab=40)

# The contract of every exercise, clause by clause (its CURRICULUM row and its docstring). The tests
# (tests/checks/test_ch02_rewards.py, VIOLATIONS) write a wrong version breaking each clause, and
# tests/checks/test_contract_clauses.py holds the two together: every clause has a violation, and the
# checker rejects each.
CLAUSES: dict[str, dict[str, str]] = {
    "reward_fn_char_count": {
        "counts_char": "each sample's reward is the number of occurrences of `char` in it, not its length or "
                       "its number of words",
        "every_occurrence": "every occurrence counts, not only whether `char` occurs",
        "char_honoured": "the `char` argument is honoured, not always '.'",
        "case_exact": "characters match exactly: 'T' is not 't' (the text is not lowercased)",
        "float32": "the result is a float32 tensor (not int64)",
        "one_tensor": "the result is one tensor of shape [batch], not a list",
        "empty_batch": "an empty list of samples gives an empty float32 tensor",
    },
    "reward_fn_sentiment": {
        "label_from_label2id": "the label's column is the id classifier.config.label2id gives its name: never "
                               "assumed at index 1, nor taken from the order in which a dict lists its keys",
        "direction": "direction='neg' gives the NEGATIVE label's probability, 'pos' the POSITIVE one's",
        "probabilities": "probabilities: the softmax over the labels of the logits (not raw logits, not a "
                         "sigmoid of one logit, not a softmax over the batch)",
        "attention_mask": "padding changes no score: the attention mask reaches the classifier",
        "too_long": "a text longer than the classifier's maximum length is truncated to it and scored",
        "no_grad": "the classifier runs without gradient tracking: the result does not require grad",
        "direction_checked": "a direction other than 'pos' or 'neg' raises a ValueError (or the KeyError of a "
                             "lookup), never scores silently",
        "batched": "the samples are scored in batches, not one forward pass per sample",
        "more_than_a_chunk": "a batch of more samples than one forward pass takes (over 64) gets every sample's "
                             "score, in order",
        "empty_batch": "an empty list of samples gives an empty float32 tensor",
        "float32": "float32 probabilities whatever the classifier's dtype (a bfloat16 classifier included)",
    },
    "whiten": {
        "all_elements": "one mean and one variance over ALL elements of the tensor, not per row",
        "biased_variance": "the variance is the biased one (divide by N), not torch's default unbiased one",
        "eps_inside_sqrt": "eps is added to the variance inside the square root, not to the standard deviation",
        "eps_honoured": "the `eps` argument is honoured",
        "all_equal": "all-equal values (variance 0) give 0, not NaN: eps keeps the division finite",
        "mean_added_back": "with shift_mean=False the mean is added back after scaling",
        "centred_when_kept": "with shift_mean=False the values are still centred before they are scaled",
        "shape_kept": "the result has the input's shape (1-, 2- and 3-d)",
        "not_in_place": "the input tensor is not modified in place",
    },
    "ngram_repetition": {
        "word_ngrams": "n-grams of the words str.split() gives, not of characters, not of split(' ')",
        "one_minus_distinct": "the score is 1 - distinct / total, not the distinct fraction itself",
        "total_ngrams": "a sample of w >= n words has w - n + 1 n-grams",
        "short_is_zero": "a sample with fewer than n words scores 0.0",
        "words_exact": "words are kept exactly as split() gives them: case and punctuation count",
        "ngram_is_word_sequence": "an n-gram is its sequence of words: ('ab', 'c') and ('a', 'bc') differ",
        "n_honoured": "the `n` argument is honoured",
        "float32": "the result is a float32 tensor of shape [batch], also when every sample is short",
        "empty_batch": "an empty list of samples gives an empty float32 tensor",
    },
    "bradley_terry_loss": {
        "chosen_minus_rejected": "the difference is chosen - rejected, not the reverse",
        "negative_log_likelihood": "the loss is the NEGATIVE log-likelihood (it decreases as chosen wins)",
        "log_sigmoid": "the log of the sigmoid of the difference: not the sigmoid alone, not the raw difference",
        "mean_over_pairs": "a mean over the pairs, not a sum",
        "stable": "exact for differences of hundreds: no -inf from log(sigmoid), no eps or clamp that saturates",
        "differentiable": "differentiable in chosen_rewards and in rejected_rewards",
        "scalar": "the result is a 0-d tensor",
    },
    "pool_last_token": {
        "last_real": "out[b] is x at the LAST position where the mask is 1: not the last position, not the "
                     "first real one",
        "left_padding": "padding on the left works as padding on the right",
        "padding_unread": "padding values are never read: inf there leaves the result finite",
        "features": "x may be [batch, seq] or [batch, seq, d]",
        "bool_mask": "a boolean mask works as an integer one",
        "differentiable": "differentiable in x: the gradient reaches the entries picked",
    },
    "pool_mean": {
        "real_only": "the mean is over the real (mask 1) positions only",
        "divides_by_real": "the sum is divided by each row's number of real positions, not by seq",
        "mean_not_sum": "a mean, not a sum",
        "padding_unread": "padding values are never read: inf there leaves the result finite",
        "features": "x may be [batch, seq] or [batch, seq, d]",
        "differentiable": "differentiable in x: every real position gets its share of the gradient",
    },
    "RewardModel": {
        "final_ln_features": "the features are ln_final.hook_normalized, after the final LayerNorm",
        "mask_to_backbone": "the backbone runs with the attention mask",
        "last_real_token": "'last' scores the last REAL token, with right or left padding",
        "means_over_real": "the mean poolings average over the real tokens only",
        "mean_scores_vs_hidden": "'mean_scores' averages the head's per-token scores, 'mean_hidden' applies the "
                                 "head to the averaged features",
        "shape_batch": "one reward per sequence: shape [batch], for a batch of 1 too",
        "default_mask": "without a mask every token is real, whatever its id",
        "gradient_every_pooling": "gradients reach the backbone and the head under every pooling",
    },
    "reward_model_train_step": {
        "chosen_minus_rejected": "the loss pushes r_chosen above r_rejected",
        "masks": "each side is scored with its own attention mask",
        "zero_grad": "old gradients are cleared before backpropagating",
        "step": "the optimizer steps: the parameters move",
        "loss_is_mean": "the loss backpropagated and returned is the Bradley-Terry loss, a mean over the pairs",
        "returns_dict": "returns a dict with the keys 'loss', 'accuracy' and 'margin'",
        "accuracy_strict": "the accuracy is the fraction of pairs with r_c > r_r strictly: a tie is not correct",
        "accuracy_fraction": "the accuracy is a fraction of the pairs, not a count",
        "margin_mean": "the margin is the mean of r_c - r_r over the pairs",
        "measured_before_step": "the loss, accuracy and margin are those of the scores before the step",
    },
}

SAMPLES = [
    "This movie was really good. I liked it.",
    "Bad... very bad. Awful!",
    "no dots here",
    "",
    "..",
    "A long one. With. Many. Short. Sentences.",
]


def _regime(candidate, reference, case: Case, arg_names: list[str], fix: str, atol: float = 1e-4) -> str:
    """compare_to_reference on one regime case (an empty batch, a text too long for the classifier) run
    after the ordinary cases; a crash there (which ``call`` reports without the case) is reported with
    the case's label and ``fix``, the regime's hint."""
    try:
        return compare_to_reference(candidate, reference, [case], arg_names=arg_names, atol=atol)
    except CheckFailure as exc:
        if exc.hint or exc.message.startswith(("On ", "Wrong")):
            raise
        raise failure(f"On {case.label}, {exc.message}", fix) from None


_EMPTY_LIST_HINT = ("An empty list of samples is a batch with no rows: the result is an empty float32 tensor, of "
                    "shape [0], not an error.")


# ----------------------------------------------------------------------------------------------------
# reward_fn_char_count
# ----------------------------------------------------------------------------------------------------
@checker(
    "reward_fn_char_count",
    chapter=CHAPTER,
    hint=(
        "Python's `str.count` counts a character in one string; the result is one float32 number per sample, "
        "in one tensor.",
        "Count `char` in every sample, then make one tensor of shape [batch], float32: a tensor built from "
        "Python ints is int64, and the training code downstream expects floats. No samples give an empty "
        "tensor.",
        solution_code(rewards.reward_fn_char_count),
    ),
)
def check_reward_fn_char_count(candidate) -> str:
    cases = [
        Case("six samples, char='.'", (SAMPLES,)),
        Case("char='!'", (SAMPLES,), {"char": "!"}),
        Case("char='e'", (SAMPLES[:3],), {"char": "e"}),
        Case("a batch of 1", (["one. two. three."],)),  # one sample
        # case and whitespace variants: 'T' is not 't'; a space is a character like any other
        Case("char='t' (capital T does not count)", (["The tent", "TTT ttt", "It. Is. Tt."],), {"char": "t"}),
        Case("char=' '", (["a b  c", " ", ""],), {"char": " "}),
    ]
    detail = compare_to_reference(
        candidate,
        rewards.reward_fn_char_count,
        cases,
        arg_names=["samples"],
        mistakes=[
            Mistake("That is the length of each sample: count only the occurrences of `char`.", lambda s, char=".": torch.tensor([float(len(x)) for x in s])),
            Mistake("You always count '.': use the `char` argument.",
                    lambda s, char=".": torch.tensor([float(x.count(".")) for x in s])),
            Mistake("That is 1 when `char` appears and 0 otherwise: count every occurrence.",
                    lambda s, char=".": torch.tensor([float(char in x) for x in s])),
            Mistake("You lowercased the text (or the char): 'T' and 't' are different characters; count "
                    "the character exactly as given.",
                    lambda s, char=".": torch.tensor([float(x.lower().count(char.lower())) for x in s])),
            Mistake("Those are word counts: count the occurrences of `char`.",
                    lambda s, char=".": torch.tensor([float(len(x.split())) for x in s])),
        ],
    )
    _regime(candidate, rewards.reward_fn_char_count, Case("no samples", ([],)), ["samples"], _EMPTY_LIST_HINT)
    return detail.rstrip(".") + "; no samples."


# ----------------------------------------------------------------------------------------------------
# reward_fn_sentiment
# ----------------------------------------------------------------------------------------------------
_WORDS = (
    "the a this movie film was is were really very not too great good fun loved bad awful boring hated "
    "plot acting music ending it i . ! ,"
).split()
CLASSIFIER_MAX_LEN = 64  # tokens the test classifier takes (its position embeddings)


def tiny_classifier(label_order: tuple[str, str] = ("POSITIVE", "NEGATIVE"), seed: int = 0, device=None,
                    keys_reversed: bool = False):
    """A seeded random 2-label DistilBERT and a word-level tokenizer, built in memory (no downloads).

    ``label_order`` is id2label: the default puts POSITIVE at index 0, the opposite of the usual
    convention, so that an implementation that assumes index 1 is caught. With ``keys_reversed`` the
    config's label2id and id2label list their entries in the reverse order of the ids (the same
    mapping), so that reading a label's column from a dict's key order, not from its id, is caught.
    The classifier is on ``device`` (default: :func:`check_device`, where the course's models are), its
    weights the same on every device; it takes at most ``CLASSIFIER_MAX_LEN`` tokens.
    """
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import DistilBertConfig, DistilBertForSequenceClassification, PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(_WORDS)}}
    backend = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]", model_max_length=CLASSIFIER_MAX_LEN,
        model_input_names=["input_ids", "attention_mask"],
    )
    config = DistilBertConfig(
        vocab_size=len(vocab), dim=32, n_layers=1, n_heads=2, hidden_dim=64,
        max_position_embeddings=CLASSIFIER_MAX_LEN,
        id2label=dict(enumerate(label_order)), label2id={name: i for i, name in enumerate(label_order)},
    )
    if keys_reversed:
        config.id2label = dict(reversed(list(config.id2label.items())))
        config.label2id = dict(reversed(list(config.label2id.items())))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DistilBertForSequenceClassification(config).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(150.0)  # decisive logits, so that wrong variants differ clearly
    return model.to(check_device() if device is None else device), tokenizer


_REVIEWS = [
    "this movie was really great . i loved it !",
    "awful plot",
    "the acting was not good , the music was boring and the ending was too bad",
    "fun",
    "i hated the film",
]


def _label_probs(classifier, tokenizer, samples, *, mask: bool = True, dim: int = -1):
    enc = to_device(dict(tokenizer(samples, padding=True, return_tensors="pt")), classifier.device)
    kwargs = {"attention_mask": enc["attention_mask"]} if mask else {}
    with torch.no_grad():
        logits = classifier(input_ids=enc["input_ids"], **kwargs).logits.float()
    return logits, logits.softmax(dim=dim)


def _many_reviews(n: int = 150) -> list[str]:
    """``n`` seeded texts of 1 to 20 words of the test vocabulary: more than one chunk of samples."""
    g = seeded(9)
    lengths = torch.randint(1, 21, (n,), generator=g).tolist()
    return [" ".join(_WORDS[i] for i in torch.randint(0, len(_WORDS), (k,), generator=g).tolist()) for k in lengths]


# a review of about 1.5 times the test classifier's maximum length, beside two short ones
_TOO_LONG = ["this movie was really great . " * (CLASSIFIER_MAX_LEN // 4), "awful plot", "i loved it !"]

_TRUNCATE_HINT = ("A text longer than the classifier's maximum length (64 tokens for this test classifier, 512 for "
                  "DistilBERT) cannot be scored whole: have the tokenizer truncate every text to what the classifier "
                  "accepts (its own maximum length, not a number you choose).")
_DIRECTION_HINT = ("A direction other than 'pos' or 'neg' (a typo such as 'positive') must raise a ValueError that "
                   "names it: scoring it silently as 'neg' hides the typo.")
_EMPTY_HINT = ("An empty list of samples is a batch with no rows: return an empty float32 tensor on the classifier's "
               "device (the tokenizer cannot encode an empty list, and no forward pass is needed).")


@checker(
    "reward_fn_sentiment",
    chapter=CHAPTER,
    hint=(
        "The tokenizer pads a list of texts into one batch, truncates them to what the classifier accepts and "
        "returns the attention mask; the classifier's logits become probabilities with a softmax over the "
        "labels; `classifier.config.label2id` maps a label's name to its column.",
        "Tokenize the samples with padding and truncation, returning PyTorch tensors, in chunks (a rollout can "
        "hold hundreds of samples); move every tensor to the classifier's device; run the classifier without "
        "gradients, giving it the input ids AND the attention mask; softmax over the label (last) dimension; "
        "keep the column whose id label2id gives for the label that `direction` names; concatenate the chunks. "
        "No samples: an empty float32 tensor. Any other direction: a ValueError.",
        solution_code(rewards.reward_fn_sentiment),
    ),
)
def check_reward_fn_sentiment(candidate) -> str:
    swapped, tok = tiny_classifier(("POSITIVE", "NEGATIVE"), seed=0)
    usual, tok2 = tiny_classifier(("NEGATIVE", "POSITIVE"), seed=1)
    keyed, tok3 = tiny_classifier(("NEGATIVE", "POSITIVE"), seed=2, keys_reversed=True)

    def pick(direction: str, classifier) -> int:
        return classifier.config.label2id["POSITIVE" if direction == "pos" else "NEGATIVE"]

    def hard_coded(s, c, t, direction="pos"):
        return _label_probs(c, t, s)[1][:, 1 if direction == "pos" else 0]

    def key_order(s, c, t, direction="pos"):
        return _label_probs(c, t, s)[1][:, list(c.config.label2id).index("POSITIVE" if direction == "pos"
                                                                          else "NEGATIVE")]

    def logits_not_probs(s, c, t, direction="pos"):
        return _label_probs(c, t, s)[0][:, pick(direction, c)]

    def no_mask(s, c, t, direction="pos"):
        return _label_probs(c, t, s, mask=False)[1][:, pick(direction, c)]

    def softmax_batch(s, c, t, direction="pos"):
        return _label_probs(c, t, s, dim=0)[1][:, pick(direction, c)]

    def always_positive(s, c, t, direction="pos"):
        return _label_probs(c, t, s)[1][:, pick("pos", c)]

    def sigmoid_logit(s, c, t, direction="pos"):
        return _label_probs(c, t, s)[0][:, pick(direction, c)].sigmoid()

    cases = [
        # One review (no padding, so the attention mask cannot matter), POSITIVE at index 0: isolates the
        # label index from the mask when an implementation gets both wrong.
        Case("a single review, direction='pos' (label2id puts POSITIVE at index 0)",
             ([_REVIEWS[2]], swapped, tok, "pos")),
        Case("5 reviews, direction='pos' (label2id puts POSITIVE at index 0)", (_REVIEWS, swapped, tok, "pos")),
        Case("5 reviews, direction='neg'", (_REVIEWS, swapped, tok, "neg")),
        Case("the usual label order (NEGATIVE=0, POSITIVE=1), 'pos'", (_REVIEWS, usual, tok2), {"direction": "pos"}),
        Case("a batch of 1", (["great fun"], usual, tok2, "neg")),
        # The same ids, but label2id and id2label list POSITIVE first: a column read from a dict's key order
        # (not from the label's id) is the NEGATIVE one here.
        Case("label2id = {'POSITIVE': 1, 'NEGATIVE': 0} (its keys not in the order of the ids), 'pos'",
             (_REVIEWS, keyed, tok3, "pos")),
        Case("150 samples (more than one forward pass's worth)", (_many_reviews(), usual, tok2, "pos")),
    ]
    mistakes = [
        # First: on the 'neg' case with POSITIVE at index 0 it coincides with the hard-coded index,
        # and a candidate that got there passed the 'pos' case, so it ignores the direction.
        Mistake("direction='neg' should give the NEGATIVE label's probability.", always_positive),
        Mistake("You assumed POSITIVE is label 1: read the index from classifier.config.label2id "
                "(this classifier has label2id = {'POSITIVE': 0, 'NEGATIVE': 1}).", hard_coded),
        Mistake("You took the label's position in the order a dict lists its keys: a label's column is the id "
                "that classifier.config.label2id maps its name to, whatever the order of the keys (here "
                "label2id lists POSITIVE first, with id 1).", key_order),
        Mistake("Those are raw logits: softmax them over the label dimension first.", logits_not_probs),
        Mistake("Padding changed the shorter reviews' scores: the classifier needs the attention mask "
                "along with the input ids.", no_mask),
        Mistake("The softmax is over the batch: take it over the labels (the last dimension).", softmax_batch),
        Mistake("sigmoid(logit) is not the label's probability for a 2-way softmax classifier: the "
                "probabilities are the softmax of both logits.", sigmoid_logit),
    ]
    names = ["samples", "classifier", "tokenizer", "direction"]
    detail = compare_to_reference(candidate, rewards.reward_fn_sentiment, cases, arg_names=names, mistakes=mistakes)

    # Gradients: a reward is a number, not something to backpropagate into the classifier.
    out = call(candidate, _REVIEWS[:2], usual, tok2, "pos")
    if out.requires_grad:
        raise CheckFailure(
            "your reward tensor requires grad: the classifier ran with gradient tracking on.",
            hint="Run the classifier without gradient tracking (it saves memory and time, and a reward must not "
            "be differentiated through).",
        )

    # Batching: one forward pass per sample is correct but very slow for a 512-sample rollout.
    calls = []
    handle = usual.register_forward_pre_hook(lambda module, inputs: calls.append(1))
    try:
        call(candidate, _REVIEWS, usual, tok2, "pos")
    finally:
        handle.remove()
    if len(calls) >= len(_REVIEWS):
        raise CheckFailure(
            f"the classifier ran {len(calls)} times for {len(_REVIEWS)} samples: one forward pass per sample.",
            hint="Tokenize many samples at once with padding and run one forward pass on the batch (the "
            "attention mask keeps padding from changing the scores).",
        )
    # The regimes a rollout reaches: a text longer than the classifier takes, and no samples at all.
    _regime(candidate, rewards.reward_fn_sentiment,
            Case("a review longer than the classifier's 64 tokens, with two short ones", (_TOO_LONG, usual, tok2, "pos")),
            names, _TRUNCATE_HINT)
    _regime(candidate, rewards.reward_fn_sentiment, Case("an empty list of samples", ([], usual, tok2, "pos")),
            names, _EMPTY_HINT)
    # A classifier in bfloat16 (how a GPU often holds one): the rewards are float32 all the same. A softmax
    # taken in bfloat16 and then cast is right to its ~3 digits: the tolerance admits it.
    half, tok4 = tiny_classifier(("NEGATIVE", "POSITIVE"), seed=3)
    _regime(candidate, rewards.reward_fn_sentiment,
            Case("a classifier in bfloat16", (_REVIEWS, half.to(torch.bfloat16), tok4, "pos")), names,
            "The rewards are float32 whatever the classifier's dtype: the trainers downstream add them to "
            "float32 numbers.", atol=1e-2)
    # A direction the contract does not name is an error, not a silent NEGATIVE.
    try:
        out = candidate(_REVIEWS[:2], usual, tok2, "positive")
    except (ValueError, KeyError):  # a KeyError is what a lookup of the direction in a dict raises: it names it
        pass
    except Exception as exc:  # noqa: BLE001 - the learner's code may raise anything
        raise failure(f"direction='positive' raised {type(exc).__name__}: {exc}, expected a ValueError.",
                      _DIRECTION_HINT) from None
    else:
        raise failure(f"direction='positive' returned {fmt(out)}: expected a ValueError (only 'pos' and 'neg' "
                      "are directions).", _DIRECTION_HINT)
    return (detail.rstrip(".") + "; a review longer than the classifier takes; no samples; a bfloat16 classifier; "
            "an unknown direction raises. Runs without gradients, in batches.")


# ----------------------------------------------------------------------------------------------------
# whiten
# ----------------------------------------------------------------------------------------------------
def _whiten_cases() -> list[Case]:
    g = seeded(2)
    matrix = torch.randn(4, 6, generator=g) * 3 + 2
    return [
        Case("a [4, 6] tensor, shift_mean=True", (matrix,)),
        Case("the same, shift_mean=False", (matrix,), {"shift_mean": False}),
        Case("a [10] tensor", (torch.rand(10, generator=g) * 5,)),
        Case("a [2, 3, 4] tensor, shift_mean=False", (torch.randn(2, 3, 4, generator=g) - 4,), {"shift_mean": False}),
        # Values whose mean float32 computes exactly, however it sums (0.75 * k and -1.5 * k are exact), so the
        # exact answer, 0 (and -1.5), is every correct implementation's: with 0.7 the float32 mean may be one
        # ulp off, and (x - mean) / sqrt(eps) turns that ulp into 1e-3, which depends on how the mean is summed.
        Case("all-equal values", (torch.full((3, 4), 0.75),)),
        Case("all-equal values, shift_mean=False", (torch.full((5,), -1.5),), {"shift_mean": False}),
        Case("a single element", (torch.tensor([3.0]),)),
        Case("eps=0.1", (matrix,), {"eps": 0.1}),
    ]


def _whiten_variant(center: Callable, scale: Callable, add_back: bool = True, center_when_kept: bool = True):
    def fn(values, shift_mean=True, eps=1e-8):
        mean, var = center(values), scale(values)
        if shift_mean or center_when_kept:
            out = (values - mean) * torch.rsqrt(var + eps)
        else:
            out = values * torch.rsqrt(var + eps)
        if not shift_mean and add_back and center_when_kept:
            out = out + mean
        return out

    return fn


def _whiten_eps_on_std(values, shift_mean=True, eps=1e-8):
    mean = values.mean()
    out = (values - mean) / (values.var(unbiased=False).sqrt() + eps)
    return out if shift_mean else out + mean


@checker(
    "whiten",
    chapter=CHAPTER,
    hint=(
        "One mean and one variance over ALL elements of the tensor (not per row), and the variance is the "
        "biased one (divide by N, not N - 1).",
        "mu = mean of every element; sigma^2 = mean of (x - mu)^2 over every element; the result is (x - mu) "
        "/ sqrt(sigma^2 + eps), with mu added back when shift_mean is False. eps sits inside the square root "
        "(added to the variance), and a single element gives 0, not NaN.",
        solution_code(rewards.whiten),
    ),
)
def check_whiten(candidate) -> str:
    all_mean = lambda v: v.mean()  # noqa: E731
    biased = lambda v: v.var(unbiased=False)  # noqa: E731
    row_mean = lambda v: v.mean(-1, keepdim=True)  # noqa: E731
    return compare_to_reference(
        candidate,
        rewards.whiten,
        _whiten_cases(),
        arg_names=["values"],
        mistakes=[
            Mistake("That uses the unbiased variance (divides by N - 1, torch's default for .var() and "
                    ".std()): whitening uses the biased one, which divides by N.",
                    _whiten_variant(all_mean, lambda v: v.var())),
            Mistake("Those are per-row statistics (mean/var over the last dimension): take the mean and "
                    "variance over ALL elements of the tensor.",
                    _whiten_variant(row_mean, lambda v: v.var(-1, unbiased=False, keepdim=True))),
            Mistake("Those are per-row statistics with the unbiased variance: take one mean and one biased "
                    "variance over ALL elements.",
                    _whiten_variant(row_mean, lambda v: v.var(-1, keepdim=True))),
            Mistake("eps is added to the standard deviation: it belongs inside the square root, added to the "
                    "variance (the two differ where eps is not negligible, eps=0.1 here).",
                    _whiten_eps_on_std),
            Mistake("The `eps` argument is ignored: the result uses the eps it is given.",
                    lambda v, shift_mean=True, eps=1e-8: _whiten_variant(all_mean, biased)(v, shift_mean, 1e-8)),
            Mistake("With shift_mean=False the mean must be added back after scaling: the result is the "
                    "whitened values plus mu.", _whiten_variant(all_mean, biased, add_back=False)),
            Mistake("With shift_mean=False, still centre before scaling and add the mean back afterwards: "
                    "scaling the uncentred values is not the same.",
                    _whiten_variant(all_mean, biased, center_when_kept=False)),
        ],
    )


# ----------------------------------------------------------------------------------------------------
# ngram_repetition
# ----------------------------------------------------------------------------------------------------
_TEXTS = [
    "great great great great great great",
    "the movie was good and the movie was fun",
    "I loved it",
    "too short",
    "the plot  was\tthin,\nthe plot  was thin, the plot was thin",
    "",
]


def _ngram_variant(tokenize: Callable[[str], list], total_fn=None, short=0.0, invert=False, glue=None):
    def fn(samples, n=3):
        out = []
        for s in samples:
            units = tokenize(s)
            if len(units) < n:
                out.append(short)
                continue
            grams = [tuple(units[i : i + n]) for i in range(len(units) - n + 1)]
            if glue is not None:
                grams = [glue.join(gram) for gram in grams]
            total = total_fn(units, grams) if total_fn else len(grams)
            ratio = len(set(grams)) / total
            out.append(ratio if invert else 1.0 - ratio)
        return torch.tensor(out, dtype=torch.float32)

    return fn


@checker(
    "ngram_repetition",
    chapter=CHAPTER,
    hint=(
        "Word n-grams: split each sample on whitespace, slide a window of n words, and count how many "
        "distinct windows there are (a window is its sequence of words).",
        "For each sample: words from str.split(); if there are fewer than n words the score is 0.0; otherwise "
        "the n-grams are the w - n + 1 tuples of n consecutive words, and the score is 1 - (number of "
        "distinct n-grams) / (number of n-grams). Return one float32 tensor of shape [batch].",
        solution_code(rewards.ngram_repetition),
    ),
)
def check_ngram_repetition(candidate) -> str:
    cases = [
        Case("six samples, n=3", (_TEXTS,)),  # typical; repeated spaces, a tab and a newline; empty text
        Case("n=2", (_TEXTS,), {"n": 2}),
        Case("n=1", (_TEXTS[:3],), {"n": 1}),  # single words
        Case("a batch of 1, n=4", (["a b c d a b c d a b c d"],), {"n": 4}),  # one sample
        Case("only short samples", (["hi", "two words", ""],)),  # fewer than n words: 0.0
        # case variants: 'The plot' and 'the plot' are different n-grams (a lowercasing
        # implementation finds repeats here); punctuation stays part of its word
        Case("n-grams that differ only by case or punctuation",
             (["The plot was thin the plot was thin", "Great GREAT great", "good. good good. good"],),
             {"n": 2}),
        Case("exactly n words (one n-gram)", (["one two three", "x x x"],)),  # w = n: 1 n-gram, score 0
        Case("leading and trailing whitespace", (["  \ta b a b\n", "\n"],), {"n": 2}),  # split() drops it
        # (ab, c) and (a, bc) are different bigrams; written without a separator both are "abc"
        Case("n-grams whose words, glued together, would be the same text",
             (["ab c a bc ab c", "x yz xy z x yz"],), {"n": 2}),
    ]
    detail = compare_to_reference(
        candidate,
        rewards.ngram_repetition,
        cases,
        arg_names=["samples"],
        mistakes=[
            Mistake("Those are character n-grams: the n-grams are made of the words str.split() gives.", _ngram_variant(list)),
            Mistake("That is the fraction of DISTINCT n-grams: repetition is 1 - unique / total.",
                    _ngram_variant(str.split, invert=True)),
            Mistake("The number of n-grams in w words is w - n + 1, not w.",
                    _ngram_variant(str.split, total_fn=lambda words, grams: len(words))),
            Mistake("split(' ') keeps empty strings and newlines/tabs inside words: the words are those of "
                    "str.split(), where any run of whitespace separates two words.", _ngram_variant(lambda s: s.split(" "))),
            Mistake("A sample with fewer than n words has no n-gram, so nothing repeats: score it 0.0.",
                    _ngram_variant(str.split, short=1.0)),
            Mistake("You lowercased the text: n-grams that differ only by case are different words here "
                    "('The plot' is not 'the plot'). Count the words exactly as sample.split() gives them.",
                    _ngram_variant(lambda s: s.lower().split())),
            Mistake("You stripped punctuation: 'good.' and 'good' are different words. Count the words "
                    "exactly as sample.split() gives them.",
                    _ngram_variant(lambda s: "".join(c for c in s if c.isalnum() or c.isspace()).split())),
            Mistake("Your n-grams lose the boundaries between their words: glued together without a separator, "
                    "('ab', 'c') and ('a', 'bc') are both 'abc'. An n-gram is its sequence of words.",
                    _ngram_variant(str.split, glue="")),
            Mistake("Those are trigrams whatever `n` is: the n-grams have `n` words.",
                    lambda samples, n=3: _ngram_variant(str.split)(samples, 3)),
        ],
    )
    _regime(candidate, rewards.ngram_repetition, Case("no samples", ([],)), ["samples"], _EMPTY_LIST_HINT)
    return detail.rstrip(".") + "; no samples."


# ----------------------------------------------------------------------------------------------------
# bradley_terry_loss
# ----------------------------------------------------------------------------------------------------
_LARGE_CHOSEN = torch.tensor([-150.0, 120.0, 0.5, -300.0])
_LARGE_REJECTED = torch.tensor([150.0, -100.0, 0.0, 0.0])


def _bt_infinite_hint(candidate, underflow_hint: str) -> str:
    """Why the loss is infinite for large differences: exp overflowing or sigmoid underflowing.

    In float32, exp(y) is inf above y ~ 88.7, and torch.sigmoid(x) is 0 below x ~ -88.7, so both break
    at the same differences and values alone cannot tell them apart, except on the positive side: only
    a form that computes exp(+x) (x - log(1 + exp(x)), say) is infinite at x = +95. Otherwise the
    learner's source says which function it calls."""
    exp_hint = (
        "exp overflows: exp(y) is inf in float32 for y above ~88.7, so log(1 + exp(-x)), 1 / (1 + exp(-x)) or "
        "x - log(1 + exp(x)) become infinite for large differences. A log-sigmoid computed directly (torch has "
        "one, and softplus is its mirror image) never takes exp of a large number."
    )
    probe = call(candidate, *to_device((torch.tensor([95.0]), torch.tensor([0.0]))),
                 _arg_names=["chosen_rewards", "rejected_rewards"])
    if isinstance(probe, torch.Tensor) and probe.numel() == 1 and not math.isfinite(probe.float().item()):
        return exp_hint.replace("exp overflows:", "exp overflows (at x = +95 your loss is already infinite):")
    try:
        source = inspect.getsource(candidate)
    except (OSError, TypeError):
        source = ""
    calls_exp, calls_sigmoid = "exp(" in source, "sigmoid(" in source
    if calls_exp and not calls_sigmoid:
        return exp_hint
    if calls_sigmoid and not calls_exp:
        return underflow_hint
    return ("Either exp overflows (exp(y) is inf in float32 above y ~ 88.7) or sigmoid underflows "
            "(sigmoid(-300) is 0 and its log -inf). A log-sigmoid computed directly (torch has one) stays exact.")


@checker(
    "bradley_terry_loss",
    chapter=CHAPTER,
    hint=(
        "The loss is a negative log-likelihood of sigmoid(r_c - r_r); torch.nn.functional has a stable "
        "log-sigmoid.",
        "z_i = r_chosen_i - r_rejected_i (chosen minus rejected, not the reverse); L = -(1/B) sum_i log "
        "sigma(z_i), a mean over the pairs, not a sum. log(sigmoid(z)) becomes -inf for z below about -89 in "
        "float32; the log-sigmoid function does not.",
        solution_code(rewards.bradley_terry_loss),
    ),
)
def check_bradley_terry_loss(candidate) -> str:
    g = seeded(3)
    chosen, rejected = torch.randn(8, generator=g) * 2, torch.randn(8, generator=g) * 2
    cases = [
        Case("a batch of 8", (chosen, rejected)),
        Case("a batch of 1", (torch.tensor([1.5]), torch.tensor([-0.5]))),
        Case("ties (all-equal rewards)", (torch.zeros(5), torch.zeros(5))),
        Case("differences up to +-12", (torch.linspace(-6, 6, 7), torch.linspace(6, -6, 7))),
    ]
    detail = compare_to_reference(
        candidate,
        rewards.bradley_terry_loss,
        cases,
        arg_names=["chosen_rewards", "rejected_rewards"],
        grad=DIFFERENTIATED["bradley_terry_loss"],
        mistakes=[
            Mistake("Chosen and rejected are swapped: the loss should push r_chosen ABOVE r_rejected, so the "
                    "difference is chosen minus rejected.", lambda c, r: -F.logsigmoid(r - c).mean()),
            Mistake("That is the log-likelihood itself: the loss is its NEGATIVE.",
                    lambda c, r: F.logsigmoid(c - r).mean()),
            Mistake("That is a sum over the batch: take the mean.", lambda c, r: -F.logsigmoid(c - r).sum()),
            Mistake("That is -mean(sigmoid(...)): the loss needs the LOG of the sigmoid.",
                    lambda c, r: -torch.sigmoid(c - r).mean()),
            Mistake("That is -mean(chosen - rejected), a raw margin: the loss takes the log-sigmoid of the "
                    "difference.",
                    lambda c, r: -(c - r).mean()),
            *[
                Mistake(f"That matches -log(sigmoid(x) + {eps:g}): the eps keeps the log finite but biases "
                        "the loss wherever sigmoid(x) is small, and it saturates at -log(eps) for large "
                        "differences. A log-sigmoid computed directly is exact and stable.",
                        lambda c, r, eps=eps: -torch.log(torch.sigmoid(c - r) + eps).mean())
                for eps in (1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10, 1e-12)
            ],
            *[
                Mistake(f"That matches -log(sigmoid(x).clamp(min={eps:g})): the clamp keeps the log finite "
                        "but saturates the loss for large differences. A log-sigmoid computed directly does not.",
                        lambda c, r, eps=eps: -torch.log(torch.sigmoid(c - r).clamp(min=eps)).mean())
                for eps in (1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-10, 1e-12)
            ],
        ],
    )

    # Moderate differences pass; now large ones, where log(sigmoid(x)) breaks down.
    large_chosen, large_rejected = to_device((_LARGE_CHOSEN, _LARGE_REJECTED))
    expected = rewards.bradley_terry_loss(large_chosen, large_rejected).item()
    big = call(candidate, large_chosen, large_rejected, _arg_names=["chosen_rewards", "rejected_rewards"])
    expect_tensor(big, shape=(), what="On large differences, your output", allow_nan=True)
    value = big.detach().float().item()
    unstable_hint = (
        "sigmoid underflows: sigmoid(-300) is 0 in float32 and its log is -inf (or, with an "
        "eps inside the log, the loss saturates at -log(eps)). A log-sigmoid computed directly (torch has one) "
        "stays exact."
    )
    where = "On reward differences chosen - rejected of -300, +220, +0.5, -300"
    if not math.isfinite(value):
        raise failure(f"{where} your loss is {value}, expected {expected:.4f}.",
                      _bt_infinite_hint(candidate, unstable_hint))
    if not math.isclose(value, expected, rel_tol=1e-4, abs_tol=1e-4):
        saturated = value < expected
        raise failure(
            f"{where} your loss is {value:.4f}, expected {expected:.4f}"
            + (": it saturates for large differences." if saturated else "."),
            unstable_hint if saturated else None,
        )
    return detail.rstrip(".") + ", and reward differences of -300 .. +220."


# ----------------------------------------------------------------------------------------------------
# Pooling
# ----------------------------------------------------------------------------------------------------
def _masks() -> dict[str, torch.Tensor]:
    right = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    left = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 1]])
    return {"right": right, "left": left, "full": torch.ones(2, 5, dtype=torch.long), "one": torch.tensor([[1, 1, 0, 0, 0]])}


def _pool_cases() -> list[Case]:
    g = seeded(4)
    m = _masks()
    return [
        Case("scores [3, 5], right padding", (torch.randn(3, 5, generator=g), m["right"])),
        Case("hidden states [3, 5, 4], right padding", (torch.randn(3, 5, 4, generator=g), m["right"])),
        Case("a boolean mask", (torch.randn(3, 5, 4, generator=g), m["right"].bool())),
        Case("no padding", (torch.randn(2, 5, 3, generator=g), m["full"])),
        Case("a batch of 1", (torch.randn(1, 5, 2, generator=g), m["one"])),
        Case("left padding", (torch.randn(3, 5, 4, generator=g), m["left"])),
        Case("inf at the padding positions", (_inf_at_padding(torch.randn(3, 5, 4, generator=g), m["right"]),
                                               m["right"])),
    ]


def _inf_at_padding(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Saturation: what padding positions hold is arbitrary (here inf); a pooling must not read it,
    not even multiplied by 0 (0 * inf = NaN)."""
    return torch.where(mask.bool()[..., None], x, torch.inf)


_PADDING_LEAK = ("Your output is not finite where the padding holds inf: padding values reached the arithmetic (x * mask, "
                 "or a product with a one-hot, gives 0 * inf = NaN). Exclude padding without reading it: "
                 "select the real entries (by a condition, or by indexing) instead of multiplying by the mask.")


def _compare_pooling(candidate, reference, mistakes: list[Mistake]) -> str:
    """compare_to_reference on the pooling cases; a NaN on the inf-at-padding case (the only case where
    a correct value could come with padding read arithmetically) gets the padding-leak hint."""
    try:
        return compare_to_reference(candidate, reference, _pool_cases(), arg_names=["x", "attention_mask"],
                                    mistakes=mistakes, grad=DIFFERENTIATED[reference.__name__], grad_cases=(1, 5))
    except CheckFailure as exc:
        first = exc.message.split("\n")[0]
        if first.startswith("On inf at the padding positions") and "NaN or inf" in first:
            # The generic NaN hint (exp / log of large values) does not apply: padding was read.
            raise failure(first, _PADDING_LEAK) from None
        raise


def _take(x, idx):
    return x[torch.arange(x.shape[0], device=x.device), idx]


@checker(
    "pool_last_token",
    chapter=CHAPTER,
    hint=(
        "You need, per row, the INDEX of the last position where the mask is 1; then advanced indexing with a "
        "row index and that position index picks the entries. A range of positions (on x's device) and a "
        "maximum help.",
        "Give every position its index (0..seq-1), replace the indices of padding positions by -1 "
        "(selected with the mask), and take the max over the sequence: the last real position of each row, "
        "whatever side the padding is on. Then index x with (row numbers, those positions), which works for "
        "[batch, seq] and [batch, seq, d] alike. mask.sum(1) - 1 is right only for right padding.",
        solution_code(rewards.pool_last_token),
    ),
)
def check_pool_last_token(candidate) -> str:
    return _compare_pooling(
        candidate,
        rewards.pool_last_token,
        [
            Mistake("x[:, -1] is padding for the shorter rows: take the last position where the mask is 1.",
                    lambda x, m: x[:, -1]),
            Mistake("mask.sum(1) - 1 is the last real position only with right padding; here the padding "
                    "is on the left. Find the last position where the mask is 1.",
                    lambda x, m: _take(x, m.long().sum(1) - 1)),
            Mistake("Off by one: with n real tokens (right padding) the last one is at index n - 1.",
                    lambda x, m: _take(x, m.long().sum(1).clamp(max=x.shape[1] - 1))),
            Mistake("argmax of the mask returns the FIRST real position, not the last.",
                    lambda x, m: _take(x, m.long().argmax(1))),
            Mistake("That is the first position: take the last real one.", lambda x, m: x[:, 0]),
        ],
    )


def _mask_like(x, m):
    return m.bool().reshape(*m.shape, *([1] * (x.ndim - 2)))


@checker(
    "pool_mean",
    chapter=CHAPTER,
    hint=(
        "A masked mean: set the padding positions to zero by selecting (not by multiplying: NaN * 0 is NaN), "
        "sum over the sequence, divide by the number of real tokens of each row.",
        "Make the mask boolean and give it trailing dimensions of size 1 so it broadcasts over x's feature "
        "dimensions (x may be [batch, seq] or [batch, seq, d]); where it is False put 0; sum over dim 1; "
        "divide by the per-row count of real tokens, reshaped to broadcast the same way.",
        solution_code(rewards.pool_mean),
    ),
)
def check_pool_mean(candidate) -> str:
    return _compare_pooling(
        candidate,
        rewards.pool_mean,
        [
            Mistake("x.mean(1) averages the padding too: average over the real positions only.",
                    lambda x, m: x.mean(1)),
            Mistake("You zeroed the padding but divided by the full length: divide by each row's number of "
                    "real tokens.", lambda x, m: torch.where(_mask_like(x, m), x, 0).sum(1) / x.shape[1]),
            Mistake("That is a sum: divide by the number of real tokens.",
                    lambda x, m: torch.where(_mask_like(x, m), x, 0).sum(1)),
        ],
    )


# ----------------------------------------------------------------------------------------------------
# RewardModel
# ----------------------------------------------------------------------------------------------------
def _token_batches(d_vocab: int = 40) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    g = seeded(5)
    m = _masks()
    tokens = torch.randint(1, d_vocab, (3, 5), generator=g)
    return {
        "right": (tokens, m["right"]),
        "left": (torch.randint(1, d_vocab, (3, 5), generator=g), m["left"]),
        "one": (torch.randint(1, d_vocab, (1, 5), generator=g), m["one"]),
        # token id 0 inside the texts: without a mask every token is real, whatever its id (a default mask
        # guessed from a pad id would drop these)
        "zeros": torch.randint(1, d_vocab, (3, 5), generator=g).index_fill(1, torch.tensor([1, 4]), 0),
    }


def _rm_mistakes(base: HookedTransformer, head: torch.nn.Module, pooling: str) -> list[Mistake]:
    def hidden(tokens, mask, *, use_mask=True, hook="ln_final.hook_normalized"):
        store = []
        base.run_with_hooks(
            tokens, attention_mask=mask if use_mask else None, return_type=None,
            fwd_hooks=[(hook, lambda act, hook: store.append(act))],
        )
        return store[0]

    def reduce(h, mask, how):
        if how == "last":
            return head(rewards.pool_last_token(h, mask)).squeeze(-1)
        if how == "mean_scores":
            return rewards.pool_mean(head(h).squeeze(-1), mask)
        return head(rewards.pool_mean(h, mask)).squeeze(-1)

    def guessed_mask(t, m):
        return (t != 0).long() if m is None else m

    resid = f"blocks.{base.cfg.n_layers - 1}.hook_resid_post"
    wrong = [
        Mistake("Without a mask every token is real: a default mask guessed from a token id (0 here, a real "
                "token of these texts) drops real tokens.",
                lambda t, m=None: reduce(hidden(t, guessed_mask(t, m)), guessed_mask(t, m), pooling)),
        Mistake("squeeze() without a dim also drops the batch dimension when the batch has one row: "
                "remove only the head's output dimension.",
                lambda t, m=None: reduce(hidden(t, m), m, pooling).squeeze()),
        Mistake("The backbone ran without the attention mask: the model needs it too (real "
                "tokens must not attend to padding, and positions start at the first real token).",
                lambda t, m=None: reduce(hidden(t, m, use_mask=False), m, pooling)),
        Mistake("Those features are the residual stream BEFORE the final LayerNorm: read "
                "'ln_final.hook_normalized'.", lambda t, m=None: reduce(hidden(t, m, hook=resid), m, pooling)),
    ]
    if pooling == "last":
        wrong += [
            Mistake("h[:, -1] is padding for the shorter rows: pool the last REAL token (your "
                    "pool_last_token does).", lambda t, m=None: head(hidden(t, m)[:, -1]).squeeze(-1)),
            Mistake("mask.sum(1) - 1 is the last real position only with right padding: use pool_last_token.",
                    lambda t, m=None: head(_take(hidden(t, m), m.sum(1) - 1)).squeeze(-1)),
            Mistake("pooling='last' should read the last real token, not a mean.",
                    lambda t, m=None: reduce(hidden(t, m), m, "mean_hidden")),
        ]
    else:
        other = "mean_hidden" if pooling == "mean_scores" else "mean_scores"
        wrong += [
            Mistake("The mean includes the padding positions: average over real tokens only (pool_mean).",
                    lambda t, m=None: (head(hidden(t, m)).squeeze(-1).mean(1) if pooling == "mean_scores"
                                       else head(hidden(t, m).mean(1)).squeeze(-1))),
            Mistake(f"pooling='{pooling}' should not use the last token.",
                    lambda t, m=None: reduce(hidden(t, m), m, "last")),
            Mistake(f"That is the '{other}' pooling: 'mean_scores' applies the head to every position and "
                    "averages the scores; 'mean_hidden' averages the hidden states, then applies the head.",
                    lambda t, m=None: reduce(hidden(t, m), m, other)),
        ]
    return wrong


@checker(
    "RewardModel",
    chapter=CHAPTER,
    hint=(
        "Catch the activation at 'ln_final.hook_normalized' in a hook of your own during "
        "`self.base_model.run_with_hooks(...)` (with the attention mask, and no unembedding needed), then "
        "pool it with your pool functions and `self.head`.",
        "In forward: default the mask to all ones, the tokens' shape (on their device); run the backbone with "
        "that mask, without the unembedding, and a hook that stores the activation (returning nothing); then 'last' "
        "applies the head to the pooled last-token features, 'mean_scores' pools the head's per-token scores, "
        "'mean_hidden' applies the head to the mean-pooled features; drop the head's trailing dimension of "
        "size 1 so the result is [batch].",
        solution_code(rewards.RewardModel),
    ),
)
def check_reward_model(candidate) -> str:
    base = small_model(seed=6)  # on check_device(), the course's device, and so are the token batches
    batches = to_device(_token_batches(base.cfg.d_vocab))
    for pooling, head_hidden in (("last", None), ("mean_scores", 8), ("mean_hidden", 8)):
        learner = call(candidate, base, pooling=pooling, head_hidden=head_hidden)
        head = get_attr(learner, "head")
        reference = rewards.RewardModel(base, pooling=pooling, head_hidden=head_hidden)
        try:
            reference.head.load_state_dict(head.state_dict())
        except Exception as exc:  # noqa: BLE001 - the learner changed the head
            raise CheckFailure(f"self.head is not the head __init__ builds ({exc}).") from None
        cases = [
            Case(f"pooling={pooling!r}, right padding", batches["right"]),
            Case(f"pooling={pooling!r}, left padding", batches["left"]),
            Case(f"pooling={pooling!r}, a batch of 1", batches["one"]),
            Case(f"pooling={pooling!r}, no attention_mask given", (batches["right"][0],)),
            Case(f"pooling={pooling!r}, no attention_mask given, token id 0 in the texts", (batches["zeros"],)),
        ]
        compare_to_reference(
            learner, reference, cases, arg_names=["tokens", "attention_mask"],
            mistakes=_rm_mistakes(base, reference.head, pooling),
        )

    # Gradients must reach the backbone (run_with_cache detaches what it stores) and the head, under every
    # pooling: the same weighted sum of the rewards backpropagated through the learner's model and the
    # reference (the same weights, the head copied) gives the same gradients.
    for pooling, head_hidden in (("last", None), ("mean_scores", 8), ("mean_hidden", 8)):
        _compare_rm_gradients(candidate, base, pooling, head_hidden, batches["left"])
    return "matches the reference for the three poolings (right and left padding, batch of 1, no mask); " \
           "gradients reach the backbone and the head under each."


def _compare_rm_gradients(candidate, base: HookedTransformer, pooling: str, head_hidden: int | None,
                          batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Fail unless d(sum_b w_b r_b) with respect to the backbone's and the head's parameters is the
    reference's, for ``pooling``."""
    learner = call(candidate, base, pooling=pooling, head_hidden=head_hidden)
    reference = rewards.RewardModel(base, pooling=pooling, head_hidden=head_hidden)
    reference.head.load_state_dict(get_attr(learner, "head").state_dict())
    weights = torch.randn(batch[0].shape[0], generator=seeded(11)).to(batch[0].device)

    def grads(model) -> tuple[list, list]:
        base.zero_grad(set_to_none=True)
        model.head.zero_grad(set_to_none=True)
        out = call(model, *batch, _arg_names=["tokens", "attention_mask"]) if model is learner else model(*batch)
        if model is learner:
            expect_tensor(out, shape=(batch[0].shape[0],), what=f"With pooling={pooling!r}, your forward's output")
            if not out.requires_grad:
                raise CheckFailure(f"with pooling={pooling!r} your reward does not require grad: nothing could be "
                                   "trained.", hint="The forward must keep the graph: no torch.no_grad(), no "
                                   ".detach() of the features, no number rebuilt into a new tensor.")
        (out * weights).sum().backward()
        return [p.grad for p in base.parameters()], [p.grad for p in model.head.parameters()]

    def flat(got: list, want: list) -> tuple[torch.Tensor, torch.Tensor]:
        """The gradients of the parameters the reference's rewards depend on (not ln_final's affine
        weights, which act after hook_normalized: a version reading the features after them, equal at
        initialisation, trains them too and is not wrong for that)."""
        pairs = [(g, w) for g, w in zip(got, want) if w is not None]
        return (torch.cat([(g if g is not None else torch.zeros_like(w)).flatten().double() for g, w in pairs]),
                torch.cat([w.flatten().double() for _, w in pairs]))

    want_base, want_head = grads(reference)  # zero_grad(set_to_none=True) leaves these tensors as they are
    got_base, got_head = grads(learner)
    (got_base, want_base), (got_head, want_head) = flat(got_base, want_base), flat(got_head, want_head)
    base.zero_grad(set_to_none=True)
    if not bool(got_base.ne(0).any()):
        raise CheckFailure(
            f"with pooling={pooling!r} no gradient reaches the backbone: only the head would learn.",
            hint="run_with_cache stores DETACHED activations: catch ln_final.hook_normalized with a hook of your "
            "own while the backbone runs (and do not detach it).",
        )
    for what, got, want in (("the backbone", got_base, want_base), ("the head", got_head, want_head)):
        if not torch.allclose(got, want, rtol=1e-3, atol=1e-6 + 1e-3 * float(want.abs().max())):
            raise CheckFailure(
                f"with pooling={pooling!r} the rewards are right, but their gradient with respect to {what}'s "
                "parameters is not the reference's.",
                hint="Part of the computation is detached or rebuilt from numbers (a .detach(), .item(), .tolist() "
                "or torch.tensor(...) of a result): training would move the parameters in another direction.",
            )


# ----------------------------------------------------------------------------------------------------
# reward_model_train_step
# ----------------------------------------------------------------------------------------------------
def _pair_batch(d_vocab: int):
    """Four pairs; the last is a tie (rejected == chosen, so r_c - r_r is exactly 0): it counts as NOT
    correct in the accuracy (r_c > r_r), which only a tie separates from r_c >= r_r."""
    g = seeded(7)
    chosen = torch.randint(1, d_vocab, (4, 6), generator=g)
    rejected = torch.randint(1, d_vocab, (4, 6), generator=g)
    chosen_mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 6, [1] * 3 + [0] * 3])
    rejected_mask = torch.tensor([[1] * 2 + [0] * 4, [1] * 5 + [0], [1] * 4 + [0] * 2, [1] * 3 + [0] * 3])
    rejected[3] = chosen[3]
    return chosen, chosen_mask, rejected, rejected_mask


def _fresh_rm() -> rewards.RewardModel:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(8)
        return rewards.RewardModel(small_model(seed=8), pooling="last")


def _number(x) -> float:
    return float(x.detach().item()) if isinstance(x, torch.Tensor) else float(x)


def _two_steps(step_fn: Callable, *, learner: bool) -> tuple:
    """Run ``step_fn`` twice on a fresh reward model with SGD; return (loss, accuracy, margin) of both
    steps and the parameters after them."""
    model = _fresh_rm()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)  # at step 2 one margin lies in (0, 1)
    batch = to_device(_pair_batch(model.base_model.cfg.d_vocab))  # where the model is: check_device()
    metrics = []
    for _ in range(2):
        out = call(step_fn, model, optimizer, *batch,
                   _arg_names=["model", "optimizer", "chosen_tokens", "chosen_mask", "rejected_tokens",
                               "rejected_mask"]) if learner else step_fn(model, optimizer, *batch)
        if not isinstance(out, dict) or not {"loss", "accuracy", "margin"} <= set(out):
            raise CheckFailure(
                f"expected a dict with keys 'loss', 'accuracy' and 'margin', got {fmt(out)}.",
                hint="Return a dict with the keys 'loss', 'accuracy' and 'margin', each a number measured on "
                "this batch before the step.",
            )
        try:
            metrics += [_number(out[key]) for key in ("loss", "accuracy", "margin")]
        except (TypeError, ValueError, RuntimeError):
            raise CheckFailure(f"loss, accuracy and margin should be numbers, got {fmt(out)}.") from None
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    return tuple(metrics), params


def _step_variant(*, swap=False, step=True, zero_grad=True, masks=True, ties_correct=False, summed_loss=False,
                  count=False, summed_margin=False, after_step=False):
    def fn(model, optimizer, ct, cm, rt, rm):
        rc = model(ct, cm) if masks else model(ct)
        rr = model(rt, rm) if masks else model(rt)
        loss = rewards.bradley_terry_loss(rr, rc) if swap else rewards.bradley_terry_loss(rc, rr)
        if summed_loss:
            loss = loss * rc.shape[0]
        if zero_grad:
            optimizer.zero_grad()
        loss.backward()
        if step:
            optimizer.step()
        if after_step:
            with torch.no_grad():
                rc, rr = model(ct, cm), model(rt, rm)
                loss = rewards.bradley_terry_loss(rc, rr)
        margin = (rc - rr).detach()
        correct = (margin >= 0 if ties_correct else margin > 0).float()
        return {"loss": loss.item(), "accuracy": (correct.sum() if count else correct.mean()).item(),
                "margin": (margin.sum() if summed_margin else margin.mean()).item()}

    return fn


@checker(
    "reward_model_train_step",
    chapter=CHAPTER,
    hint=(
        "Score both sides with the model (each with its own mask), take your bradley_terry_loss, and do the "
        "three optimizer calls in the right order; the diagnostics are computed from the same scores.",
        "r_c = model(chosen tokens, chosen mask), r_r likewise; L = bradley_terry_loss(r_c, r_r); clear the "
        "old gradients, backpropagate L, step. Return a dict with 'loss' (L), 'accuracy' (the fraction of "
        "pairs with r_c > r_r) and 'margin' (the mean of r_c - r_r), all as Python floats, from the scores "
        "computed before the step.",
        solution_code(rewards.reward_model_train_step),
    ),
)
def check_reward_model_train_step(candidate) -> str:
    expected_metrics, expected_params = _two_steps(rewards.reward_model_train_step, learner=False)
    got_metrics, got_params = _two_steps(candidate, learner=True)
    names = ["loss", "accuracy", "margin"]
    variants = [
        ("Chosen and rejected are swapped: the loss must push r_chosen above r_rejected (your "
         "bradley_terry_loss takes the chosen rewards first).", _step_variant(swap=True)),
        ("The parameters did not change: the optimizer must step after the backward pass.",
         _step_variant(step=False)),
        ("The second step used the first step's gradients too: clear the old gradients (zero_grad) before "
         "the backward pass (gradients accumulate in .grad).", _step_variant(zero_grad=False)),
        ("The masks were not passed to the model: each side is scored with its own attention mask (padding "
         "is not text).", _step_variant(masks=False)),
        ("A tie (r_chosen == r_rejected, the last pair here) counted as correct: the accuracy is the fraction "
         "of pairs with r_chosen > r_rejected, strictly.", _step_variant(ties_correct=True)),
        ("The loss is summed over the pairs: the Bradley-Terry loss is their mean (the step is then 4 times "
         "too large here).", _step_variant(summed_loss=True)),
        ("That accuracy is a count of pairs: the accuracy is the FRACTION of pairs with r_chosen > r_rejected.",
         _step_variant(count=True)),
        ("That margin is a sum over the pairs: the margin is the MEAN of r_chosen - r_rejected.",
         _step_variant(summed_margin=True)),
        ("Those diagnostics were measured after the step: report the loss, accuracy and margin of the scores "
         "the step was computed from (before it).", _step_variant(after_step=True)),
    ]

    def close(a, b) -> bool:
        if isinstance(a, torch.Tensor):
            return bool(torch.allclose(a, b, atol=1e-4, rtol=1e-3))
        return all(math.isclose(x, y, rel_tol=1e-3, abs_tol=1e-4) for x, y in zip(a, b))

    def diagnose() -> str | None:
        for hint, fn in variants:
            metrics, params = _two_steps(fn, learner=False)
            if close(got_metrics, metrics) and close(got_params, params):
                return hint
        return None

    for i, (got, want) in enumerate(zip(got_metrics, expected_metrics)):
        if not math.isclose(got, want, rel_tol=1e-3, abs_tol=1e-4):
            raise CheckFailure(
                f"step {i // 3 + 1}: your {names[i % 3]} is {got:.6g}, expected {want:.6g} (measured before "
                "the optimizer step).",
                hint=diagnose(),
            )
    if not close(got_params, expected_params):
        changed = not torch.equal(got_params, _two_steps(_step_variant(step=False), learner=False)[1])
        raise CheckFailure(
            "after two steps your parameters differ from the reference's"
            + ("" if changed else " (they did not move at all)") + ".",
            hint=diagnose(),
        )
    return "two SGD steps match the reference: loss, accuracy, margin and the updated parameters."
