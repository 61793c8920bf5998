"""Running chapter 09: GRPO on multi-turn trajectories with a calculator in the loop, and the
``train-agent`` command.

The pieces a learner writes (the call parser, the sandboxed calculator, the policy-token mask, the
multi-turn rollout, the reward) live in ``rlhf_tutorial.agent``; the group advantages and the clipped
objective are chapter 04's (``rlhf_tutorial.grpo``). ``train_agent(args, **learner_functions(globals()))``
runs a notebook's versions in place of the reference ones (``trainers.plug``).

One phase of training:

1. draw ``problems_per_difficulty`` fresh problems of each training difficulty (``tiny.calc``) and roll
   each out ``group_size`` times with ``multi_turn_rollout``: the policy samples, a closed call is
   answered by the calculator, whose text is appended as token ids, and the policy goes on;
2. score each trajectory with ``agent_reward`` (1 for a right ``Answer:`` line, minus ``call_cost`` per
   answered call) and turn the rewards into group advantages (``group_relative_advantages``);
3. maximise ``calc_grpo_objective`` over the tokens the rollout's mask marks as the policy's
   (``--no-policy-mask``: over every token after the prompt, the environment's too: the classic bug),
   in ``updates_per_phase`` minibatch steps; the ratio's "old" log-probs are the sampling policy's,
   computed once per phase before the first step, so the later steps' ratios move off 1 and clip.

``python -m rlhf_tutorial train-agent --world tiny --seed 0`` prints a JSON summary on its last line:
``accuracy_initial`` / ``accuracy_final`` and ``tool_calls_per_problem_initial`` / ``_final`` on the hard
problems (the tool available; ``accuracy_gain`` their difference), and ``by_difficulty`` (accuracy and calls per problem of every
difficulty, initial and final), measured on ``eval_problems`` fresh problems per difficulty with
``eval_samples`` samples each at temperature 1.
"""

from __future__ import annotations

import functools
import math
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm
from transformer_lens import HookedTransformer

from rlhf_tutorial import agent, grpo, reasoning, speed
from rlhf_tutorial.devices import device_of
from rlhf_tutorial.grpo import eos_id
from rlhf_tutorial.tiny import calc
from rlhf_tutorial.trainers.args import arg, documented, given_flags, parse_command
from rlhf_tutorial.trainers.plug import bind, learner_functions_for

#: The exercises of chapter 09 this trainer runs (a notebook's versions replace them by keyword).
AGENT_PLUGGABLE = ("parse_tool_call", "safe_calculate", "calculator", "policy_token_mask",
                   "multi_turn_rollout", "agent_reward")
#: Chapter 04's pieces it reuses (pluggable too).
GRPO_PLUGGABLE = ("group_relative_advantages", "calc_grpo_objective")
PLUGGABLE = AGENT_PLUGGABLE + GRPO_PLUGGABLE
learner_functions = learner_functions_for(PLUGGABLE)

#: Sub-seeds of the problem sets: training phases and the measurements never share problems.
SPLITS = {"train": 11, "eval": 12}

# A result the policy wrote itself: an expression, optionally a closing tag, then "= N".
_SELF_RESULT = re.compile(r"([0-9]+)\s*([-+*])\s*([0-9]+)\s*(?:</calc>)?\s*=\s*(-?[0-9]+)")


@documented
@dataclass
class AgentArgs:
    """Every knob of ``train-agent`` (chapter 09). The defaults are the tiny world's;
    ``AgentArgs.preset("gpt2")`` gives the GPT-2 world's (see ``PRESETS``)."""

    world: str | None = arg(None, "'tiny' or 'gpt2'; None lets RLHF_TUTORIAL_WORLD decide")
    seed: int = arg(0, "seeds the problems, the sampling and the batch order")
    difficulties: str = arg("easy,medium,hard", "comma-separated difficulties trained on (tiny.calc.DIFFICULTIES)")
    num_phases: int = arg(60, "rollout-then-update phases")
    problems_per_difficulty: int = arg(8, "fresh problems per training difficulty in a phase")
    group_size: int = arg(8, "trajectories per problem (G): the group the advantages are relative to")
    updates_per_phase: int = arg(2, "gradient steps on each phase's trajectories (minibatches of a shuffled pass)")
    learning_rate: float = arg(3e-4, "AdamW learning rate (constant; no weight decay; 1e-3 is unstable in the tiny world: the head arithmetic of easy problems collapses)")
    max_grad_norm: float = arg(1.0, "clip the global gradient norm to this")
    clip_coef: float = arg(0.2, "epsilon (clip_eps): the ratio is clipped to [1 - clip_coef, 1 + clip_coef]")
    beta: float = arg(0.0, "KL penalty to the starting policy (k3 per token); 0 skips the reference model")
    loss_type: str = arg("grpo", "'grpo', 'dapo' or 'dr_grpo' (calc_grpo_objective)")
    advantage_scale: str = arg("group", "'group', 'batch' or 'none' (group_relative_advantages)")
    call_cost: float = arg(0.0, "reward subtracted per answered call (agent_reward)")
    policy_mask: bool = arg(True, "train only on the policy's tokens; --no-policy-mask also on the environment's (the bug)")
    max_turns: int = arg(3, "turns per trajectory (a call in the last turn is left unanswered)")
    max_new_tokens: int = arg(28, "positions after the prompt, sampled and environment tokens together")
    temperature: float = arg(1.0, "sampling temperature (the measurements' too)")
    eval_problems: int = arg(64, "fresh problems per difficulty for the measurements")
    eval_samples: int = arg(2, "samples per problem for the measurements")
    sft_texts: int = arg(0, "before RL, fine-tune on this many of the world's pretraining texts (tiny.calc.corpus; "
                            "the GPT-2 world's base model has never seen the calculator); 0: none")
    sft_learning_rate: float = arg(5e-5, "learning rate of that fine-tuning (one pass, batches of 16)")
    # harness speed (what a learner's functions compute is unchanged)
    fast: bool = arg(True, "harness speed-ups (speed.py): with the reference multi_turn_rollout, our own key/value-cache "
                     "rollout (speed.fast_multi_turn_rollout: the same draws), and a hook-free forward for training")

    @classmethod
    def preset(cls, world: str, **overrides: Any) -> AgentArgs:
        """The preset of ``world`` ('tiny' or 'gpt2', any GPT-2 size) with ``overrides`` applied."""
        from rlhf_tutorial.worlds import preset_key

        return cls(**{**PRESETS[preset_key(world).split("-")[0]], "world": world, **overrides})


#: Per-world settings. The GPT-2 preset first fine-tunes GPT-2 on the world's pretraining text (it has
#: never seen the calculator's syntax: ``sft_texts``), then runs RL with a smaller learning rate and
#: longer trajectories (its tokenizer does not split digits); untuned here (no GPT-2 weights offline).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {},
    "gpt2": dict(learning_rate=2e-5, max_new_tokens=40, problems_per_difficulty=4, num_phases=60, sft_texts=4000),
}


# ----------------------------------------------------------------------------------------------------
# The environment in the loop
# ----------------------------------------------------------------------------------------------------


def tokenizer_fns(model: HookedTransformer) -> tuple[Callable[[str], list[int]], Callable[[list[int]], str]]:
    """``encode`` (a text's token ids, no BOS) and ``decode`` of ``model``'s tokenizer."""
    tok = model.tokenizer

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False)

    def decode(ids: list[int]) -> str:
        return tok.decode(ids)

    return encode, decode


def fast_rollout(policy: HookedTransformer, rollout_fn: Callable, args: AgentArgs) -> bool:
    """Whether the harness's rollout (``speed.fast_multi_turn_rollout``) runs in place of ``rollout_fn``:
    ``args.fast``, the reference ``multi_turn_rollout`` bound (a learner's own always runs as it is) and a
    model the cache can run (``speed.can_fast_sample``)."""
    return (args.fast and getattr(rollout_fn, "__code__", None) is _ROLLOUT_CODE
            and speed.can_fast_sample(policy))


_ROLLOUT_CODE = agent.multi_turn_rollout.__code__


def rollouts_agree(a: agent.AgentRollout, b: agent.AgentRollout, atol: float = 1e-4) -> bool:
    """The same trajectories: tokens, masks, spans, lengths, calls and prompt length equal, log-probs
    within ``atol`` (a cached forward rounds differently from a full one)."""
    return (a.prompt_len == b.prompt_len and a.env_spans == b.env_spans
            and all(torch.equal(x.cpu(), y.cpu()) for x, y in ((a.tokens, b.tokens), (a.mask, b.mask),
                                                             (a.lengths, b.lengths), (a.num_calls, b.num_calls)))
            and torch.allclose(a.logprobs.float().cpu(), b.logprobs.float().cpu(), rtol=0.0, atol=atol))


def matched_rollout(yours: Callable, cached: Callable, note: dict[str, str]) -> Callable:
    """A rollout function that runs ``yours`` on its first call and ``cached`` beside it, from the same
    generator state. When the two agree draw for draw (``rollouts_agree``, and the generator left in the
    same state), every later call runs ``cached``: the same trajectories, faster; otherwise ``yours``
    runs throughout. The first call returns ``yours``'s rollout either way; ``note["rollout"]`` says which
    ran."""
    chosen: list[Callable] = []

    def rollout(*a: Any, generator: torch.Generator, **kw: Any) -> agent.AgentRollout:
        if chosen:
            return chosen[0](*a, generator=generator, **kw)
        start = generator.get_state()
        mine = yours(*a, generator=generator, **kw)
        after = generator.get_state()
        generator.set_state(start)
        try:
            theirs = cached(*a, generator=generator, **kw)
            same = torch.equal(generator.get_state(), after) and rollouts_agree(mine, theirs)
        except Exception as e:  # noqa: BLE001 - the cache is only a speed-up: yours runs on
            same, note["cached_error"] = False, f"{type(e).__name__}: {e}"
        generator.set_state(after)
        chosen.append(cached if same else yours)
        note["rollout"] = ("yours on the first batch; it matched the cached rollout draw for draw, which ran "
                           "from then on" if same else
                           "yours throughout (it did not match the cached rollout draw for draw on the first batch)")
        return mine

    return rollout


def rollout_problems(
    policy: HookedTransformer,
    problem_list: Sequence[calc.CalcProblem],
    n: int,
    args: AgentArgs,
    fns: dict[str, Callable],
    generator: torch.Generator,
) -> list[tuple[list[int], agent.AgentRollout]]:
    """``n`` trajectories of every problem, rows ``[problem 0] * n + [problem 1] * n + ...``, rolled out
    together per prompt length (``multi_turn_rollout`` takes prompts of one length). Returns (indices of
    the problems, rollout) per length. With the reference ``multi_turn_rollout`` the harness's cached
    rollout runs (``fast_rollout``: the same draws), with the bound ``policy_token_mask``."""
    encode, decode = tokenizer_fns(policy)
    device = device_of(policy)
    by_len: dict[int, list[int]] = {}
    prompts = [policy.to_tokens(p.prompt, prepend_bos=True)[0] for p in problem_list]
    for i, t in enumerate(prompts):
        by_len.setdefault(len(t), []).append(i)
    out = []
    rollout_fn = fns["multi_turn_rollout"]
    if fast_rollout(policy, rollout_fn, args):
        rollout_fn = functools.partial(speed.fast_multi_turn_rollout, token_mask=fns["policy_token_mask"])
    for _, idx in sorted(by_len.items()):
        rows = torch.stack([prompts[i] for i in idx]).repeat_interleave(n, dim=0).to(device)
        rollout = rollout_fn(
            policy, rows, fns["calculator"], encode, decode, args.max_turns, args.max_new_tokens,
            eos_token_id=eos_id(policy), temperature=args.temperature, generator=generator)
        out.append((idx, rollout))
    return out


def trajectory_texts(policy: HookedTransformer, rollout: agent.AgentRollout) -> list[str]:
    """Each row's text after the prompt, the environment's text included, up to its end (an EOS cut)."""
    eos = eos_id(policy)
    texts = []
    for row, length in zip(rollout.tokens, rollout.lengths.tolist()):
        ids = row[rollout.prompt_len : length].tolist()
        if ids and ids[-1] == eos:
            ids = ids[:-1]
        texts.append(policy.tokenizer.decode(ids))
    return texts


def policy_texts(policy: HookedTransformer, rollout: agent.AgentRollout) -> list[list[str]]:
    """Each row's turns: the pieces of text the policy sampled between the environment's spans."""
    out = []
    for i, length in enumerate(rollout.lengths.tolist()):
        cuts = [rollout.prompt_len] + [x for span in rollout.env_spans[i] for x in span] + [length]
        out.append([policy.tokenizer.decode(rollout.tokens[i, a:b].tolist()) for a, b in zip(cuts[::2], cuts[1::2])])
    return out


def self_written_results(turns: Sequence[str]) -> tuple[int, int]:
    """(results the policy wrote itself, of them wrong): ``a op b = N`` in the policy's own text, not the
    calculator's (the symptom of training on the environment's tokens)."""
    written = wrong = 0
    for turn in turns:
        for a, op, b, n in _SELF_RESULT.findall(turn):
            written += 1
            wrong += calc.compute(int(a), op, int(b)) != int(n)
    return written, wrong


def score(policy: HookedTransformer, problem_list: Sequence[calc.CalcProblem], idx: list[int], n: int,
          rollout: agent.AgentRollout) -> tuple[Tensor, list[str]]:
    """Whether each row's answer (``reasoning.extract_answer`` of its text after the prompt) is its
    problem's, and the texts."""
    texts = trajectory_texts(policy, rollout)
    answers = [problem_list[idx[r // n]].answer for r in range(len(texts))]
    correct = torch.tensor([reasoning.extract_answer(t) == a for t, a in zip(texts, answers)])
    return correct, texts


@torch.no_grad()
def evaluate(
    policy: HookedTransformer,
    args: AgentArgs,
    fns: dict[str, Callable] | None = None,
    difficulties: Sequence[str] = calc.DIFFICULTIES,
    seed: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Per difficulty, on ``args.eval_problems`` problems of the 'eval' split with ``args.eval_samples``
    trajectories each (the tool available): ``accuracy``, ``calls_per_problem`` (answered calls per
    trajectory), ``call_rate`` (fraction of trajectories with a call), ``accuracy_with_call`` and
    ``accuracy_without_call`` (over the trajectories that called and those that did not, the latter the
    model's arithmetic in its head; None where there are none), ``self_results_per_problem`` and
    ``self_results_wrong`` (results written without the tool, and the fraction of them that are wrong),
    ``length`` (positions after the prompt) and a few ``samples``. Its own random stream (``seed``)."""
    fns = fns or bind(agent, AGENT_PLUGGABLE, {})
    seed = args.seed if seed is None else seed
    out = {}
    for d in difficulties:
        problem_list = calc.problems(args.eval_problems, 1000 * args.seed + SPLITS["eval"], d)
        generator = torch.Generator(device=device_of(policy)).manual_seed(seed * 7919 + 1)
        correct, calls, lengths, written, wrong, samples = [], [], [], 0, 0, []
        for idx, rollout in rollout_problems(policy, problem_list, args.eval_samples, args, fns, generator):
            c, texts = score(policy, problem_list, idx, args.eval_samples, rollout)
            correct.append(c.float())
            calls.append(rollout.num_calls.float().cpu())
            lengths.append((rollout.lengths - rollout.prompt_len).float().cpu())
            for turns in policy_texts(policy, rollout):
                w, x = self_written_results(turns)
                written, wrong = written + w, wrong + x
            samples += [problem_list[idx[0]].prompt + t for t in texts[:2]]
        calls_t, correct_t = torch.cat(calls), torch.cat(correct)
        called = calls_t > 0
        out[d] = {
            "accuracy": correct_t.mean().item(),
            "accuracy_with_call": correct_t[called].mean().item() if called.any() else None,
            "accuracy_without_call": correct_t[~called].mean().item() if (~called).any() else None,
            "calls_per_problem": calls_t.mean().item(),
            "call_rate": (calls_t > 0).float().mean().item(),
            "self_results_per_problem": written / len(calls_t),
            "self_results_wrong": wrong / written if written else None,
            "length": torch.cat(lengths).mean().item(),
            "samples": samples[:2],
        }
    return out


# ----------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------


def token_logprobs(policy: HookedTransformer, tokens: Tensor, temperature: float, fast: bool = False) -> Tensor:
    """[b s]: at position t >= 1 the log-probability of ``tokens[:, t]`` given the positions before, at the
    sampling temperature (the rollout's convention); 0 at position 0. ``fast``: by ``speed.token_logprobs``
    (a hook-free forward; the same values and gradients to float rounding) where the model allows."""
    if fast and speed.can_fast_sample(policy):
        lp = speed.token_logprobs(policy, tokens, 1, temperature)  # [b s-1]
        return torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)
    logits = policy(tokens[:, :-1]).float() / temperature  # [b s-1 v]
    lp = logits.log_softmax(-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)  # [b s-1]
    return torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)


def trained_mask(rollout: agent.AgentRollout, policy_mask: bool) -> Tensor:
    """The tokens the objective counts: the rollout's policy-token mask, or (``policy_mask=False``, the
    bug) every position after the prompt up to the trajectory's end, the environment's tokens too."""
    if policy_mask:
        return rollout.mask
    positions = torch.arange(rollout.tokens.shape[1], device=rollout.tokens.device)
    return (positions >= rollout.prompt_len) & (positions < rollout.lengths[:, None])


def pretrain(policy: HookedTransformer, args: AgentArgs, progress: bool = True) -> list[float]:
    """Fine-tune ``policy`` in place on ``args.sft_texts`` texts of the world's pretraining corpus (the
    tiny world's writers: a few solutions call the calculator), the prompt masked (chapter 07's SFT), so
    that a base model that never saw the calculator's syntax has tool use as a rare behaviour. Returns
    the losses."""
    from rlhf_tutorial.tiny.build import sub_seed
    from rlhf_tutorial.trainers.reasoning import SFTArgs, fine_tune

    texts = calc.corpus(args.sft_texts, sub_seed(args.seed, "calc-sft"), calc.CalcWriter())
    pairs = [(t[: t.index("\n") + 1], t[t.index("\n") + 1 :]) for t in texts]
    sft_args = SFTArgs(world=args.world, batch_size=16, learning_rate=args.sft_learning_rate,
                       max_grad_norm=args.max_grad_norm)
    generator = torch.Generator().manual_seed(args.seed)
    return fine_tune(policy, pairs, sft_args, 1, reasoning.sft_loss, generator, progress, desc="SFT on the corpus")


@dataclass
class AgentResult:
    """What ``train_agent`` returns."""

    policy: HookedTransformer
    history: list[dict[str, float]]  # one record per phase
    eval_initial: dict[str, dict[str, Any]] | None
    eval_final: dict[str, dict[str, Any]] | None
    wall_seconds: float
    cpu_seconds: float
    rollout: str = "yours"  # which multi_turn_rollout sampled (matched_rollout)


def agent_functions(policy: HookedTransformer, args: AgentArgs,
                    **overrides: Callable) -> tuple[dict[str, Callable], dict[str, str]]:
    """The functions a run calls, by name: the reference ones of ``PLUGGABLE`` with ``overrides`` in their
    place (``trainers.plug.bind``); a learner's ``multi_turn_rollout`` is wrapped in ``matched_rollout``
    (with ``args.fast`` and a model the cache can run). Returns them and a note whose ``"rollout"`` says
    which rollout sampled (updated once the first call has run)."""
    agent_over = {k: v for k, v in overrides.items() if k not in GRPO_PLUGGABLE}
    grpo_over = {k: v for k, v in overrides.items() if k in GRPO_PLUGGABLE}
    fns = {**bind(agent, AGENT_PLUGGABLE, agent_over), **bind(grpo, GRPO_PLUGGABLE, grpo_over)}
    course_rollout = getattr(fns["multi_turn_rollout"], "__code__", None) is _ROLLOUT_CODE
    cache = args.fast and speed.can_fast_sample(policy)  # fast_rollout's two other conditions
    note = {"rollout": "yours" if not course_rollout else "the course's, cached" if cache else "the course's"}
    if cache and not course_rollout:
        fns["multi_turn_rollout"] = matched_rollout(
            fns["multi_turn_rollout"],
            functools.partial(speed.fast_multi_turn_rollout, token_mask=fns["policy_token_mask"]), note)
    return fns, note


def train_agent(
    args: AgentArgs,
    *,
    policy: HookedTransformer | None = None,
    evaluate_before_after: bool = True,
    progress: bool = True,
    callback: Callable[[dict[str, float]], None] | None = None,
    **overrides: Callable,
) -> AgentResult:
    """GRPO on multi-turn trajectories (the module docstring's phases), ``args.num_phases`` times.
    ``policy`` defaults to the world's base model (``worlds.load_agent_policy``), trained in place. Any
    function of ``PLUGGABLE`` can be replaced by keyword. ``callback`` gets each phase's record
    (reward, accuracy, calls and turns per trajectory, length, the fraction of groups with one reward)."""
    difficulties = [d.strip() for d in args.difficulties.split(",") if d.strip()]
    for d in difficulties:
        if d not in calc.LEVELS:
            raise ValueError(f"unknown difficulty {d!r}; known: {calc.DIFFICULTIES}")
    torch.manual_seed(args.seed)
    if policy is None:
        from rlhf_tutorial.worlds import load_agent_policy

        policy = load_agent_policy(args.world)
    fns, note = agent_functions(policy, args, **overrides)
    start, cpu_start = time.perf_counter(), time.process_time()
    if args.sft_texts > 0:
        pretrain(policy, args, progress)
    before = evaluate(policy, args, fns) if evaluate_before_after else None
    reference = None
    if args.beta > 0:
        import copy

        reference = copy.deepcopy(policy).eval()
    device = device_of(policy)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    order_gen = torch.Generator().manual_seed(args.seed + 1)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=args.learning_rate,
                                  weight_decay=0.0)
    history: list[dict[str, float]] = []
    bar = tqdm(total=args.num_phases, desc="agent GRPO", disable=not progress, file=sys.stderr, leave=False)
    for phase in range(args.num_phases):
        t0 = time.perf_counter()
        batches = []  # (rollout, trained mask, advantages, correct, rewards, old log-probs, reference log-probs)
        policy.eval()
        with torch.no_grad():
            for d in difficulties:
                problem_list = calc.problems(args.problems_per_difficulty,
                                             1000 * args.seed + SPLITS["train"] + 100 * phase, d)
                for idx, rollout in rollout_problems(policy, problem_list, args.group_size, args, fns, generator):
                    correct, _ = score(policy, problem_list, idx, args.group_size, rollout)
                    rewards = fns["agent_reward"](correct.to(device), rollout.num_calls, args.call_cost)
                    adv = fns["group_relative_advantages"](rewards.view(-1, args.group_size).float(),
                                                           args.advantage_scale).reshape(-1)
                    # the "old" policy of the ratio is the one that sampled: its log-probs once, before any step
                    old = token_logprobs(policy, rollout.tokens, args.temperature, args.fast)  # [b s]
                    ref = (token_logprobs(reference, rollout.tokens, args.temperature, args.fast)
                           if reference is not None else old)
                    batches.append((rollout, trained_mask(rollout, args.policy_mask), adv, correct, rewards, old, ref))
        rows = [(b, i) for b, batch in enumerate(batches) for i in range(batch[0].tokens.shape[0])]
        policy.train()
        losses = []
        per_update = math.ceil(len(rows) / args.updates_per_phase)
        perm = torch.randperm(len(rows), generator=order_gen).tolist()
        for u in range(args.updates_per_phase):
            chosen = [rows[j] for j in perm[u * per_update : (u + 1) * per_update]]
            if not chosen:
                continue
            optimizer.zero_grad()
            total = 0.0
            for b, batch in enumerate(batches):
                members = [i for bb, i in chosen if bb == b]
                if not members:
                    continue
                rollout, mask, adv, _, _, old_all, ref_all = batch
                tokens, m, a = rollout.tokens[members], mask[members], adv[members]
                old, ref = old_all[members], ref_all[members]
                new = token_logprobs(policy, tokens, args.temperature, args.fast)
                objective = fns["calc_grpo_objective"](new, old, ref, a.float(), m, clip_eps=args.clip_coef,
                                                       beta=args.beta, loss_type=args.loss_type)
                loss = -objective * len(members) / len(chosen)  # the minibatch's mean over its rows
                loss.backward()
                total += loss.item()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
            optimizer.step()
            losses.append(total)
        policy.eval()
        correct = torch.cat([b[3].float() for b in batches])
        calls = torch.cat([b[0].num_calls.float().cpu() for b in batches])
        rewards = torch.cat([b[4].float().cpu() for b in batches]).view(-1, args.group_size)
        record = {
            "phase": phase,
            "reward": rewards.mean().item(),
            "accuracy": correct.mean().item(),
            "calls_per_trajectory": calls.mean().item(),
            "turns_per_trajectory": (calls + 1).mean().item(),
            "length": torch.cat([(b[0].lengths - b[0].prompt_len).float().cpu() for b in batches]).mean().item(),
            "frac_reward_zero_std": (rewards.std(-1) == 0).float().mean().item(),
            "loss": sum(losses) / max(len(losses), 1),
            "seconds": time.perf_counter() - t0,
        }
        history.append(record)
        if callback is not None:
            callback(record)
        bar.update(1)
        bar.set_postfix(reward=f"{record['reward']:.2f}", calls=f"{record['calls_per_trajectory']:.2f}")
    bar.close()
    after = evaluate(policy, args, fns) if evaluate_before_after else None
    return AgentResult(policy, history, before, after, time.perf_counter() - start, time.process_time() - cpu_start,
                       note["rollout"])


# ----------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------


def _round(x: Any) -> Any:
    return round(x, 4) if isinstance(x, float) else x


def summary(args: AgentArgs, result: AgentResult, wall: float, cpu: float) -> dict[str, Any]:
    """The JSON summary of a run (the module docstring's keys, the per-phase records and the timings)."""
    before, after = result.eval_initial, result.eval_final
    keys = ("accuracy", "calls_per_problem", "call_rate", "accuracy_with_call", "accuracy_without_call",
            "self_results_per_problem", "self_results_wrong", "length")
    by = {d: {f"{k}_{when}": _round(ev[d][k]) for when, ev in (("initial", before), ("final", after)) for k in keys}
          for d in after}
    return {
        "world": args.world,
        "seed": args.seed,
        "call_cost": args.call_cost,
        "policy_mask": args.policy_mask,
        "accuracy_initial": _round(before["hard"]["accuracy"]),
        "accuracy_final": _round(after["hard"]["accuracy"]),
        "accuracy_gain": _round(after["hard"]["accuracy"] - before["hard"]["accuracy"]),
        "tool_calls_per_problem_initial": _round(before["hard"]["calls_per_problem"]),
        "tool_calls_per_problem_final": _round(after["hard"]["calls_per_problem"]),
        "by_difficulty": by,
        "reward_per_phase": [_round(r["reward"]) for r in result.history],
        "accuracy_per_phase": [_round(r["accuracy"]) for r in result.history],
        "calls_per_phase": [_round(r["calls_per_trajectory"]) for r in result.history],
        "length_per_phase": [_round(r["length"]) for r in result.history],
        "samples_initial": {d: before[d]["samples"] for d in before},
        "samples_final": {d: after[d]["samples"] for d in after},
        "phases": len(result.history),
        "wall_seconds": round(wall, 1),
        "cpu_seconds": round(cpu, 1),
        "args": asdict(args),
    }


def main(argv: list[str]) -> dict:
    """``train-agent``: GRPO with the calculator in the loop; JSON summary (module docstring).
    ``wall_seconds`` and ``cpu_seconds`` (this process's CPU time) cover loading, both measurements and
    training."""
    from rlhf_tutorial.worlds import resolve_world

    start, cpu_start = time.perf_counter(), time.process_time()
    ns = parse_command("train-agent", AgentArgs, argv, from_preset=True,
                       description="GRPO on multi-turn trajectories with a calculator (chapter 09). Flags not "
                                   "given keep the world's preset (AgentArgs.preset).")
    world = resolve_world(ns.world)
    given = given_flags(AgentArgs, ns)
    given.pop("world", None)
    args = AgentArgs.preset(world, **given)
    result = train_agent(args, progress=not ns.no_progress)
    return summary(args, result, time.perf_counter() - start, time.process_time() - cpu_start)
