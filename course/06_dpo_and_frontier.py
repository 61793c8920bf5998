# %% [markdown]
# # 06. DPO and friends, and every method of the course on one reward-KL frontier
#
# Chapters 03 and 04 tuned the policy with reinforcement learning: sample, score, push up what
# scored well, with a KL penalty that keeps the policy near a reference. This chapter starts from
# the objective those methods share and shows that, for preference data, the RL loop can be
# replaced by a **classification loss on pairs** (DPO), then adds two critic-free RL estimators
# beside GRPO (RLOO and GSPO), and ends by placing every method of the course on one figure: mean
# reward against KL to the reference.

# %% imports
import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

from rlhf_tutorial import check, hint, progress

# %% [markdown]
# ## 1. Log-probabilities of whole completions

# %% exercise rlhf_tutorial.dpo:sequence_logprobs | 15 min | difficulty 3 | importance 4

# %% [markdown]
# ## 2. The DPO loss

# %% exercise rlhf_tutorial.dpo:dpo_loss | 15 min | difficulty 2 | importance 5

# %% exercise rlhf_tutorial.dpo:implicit_reward | 10 min | difficulty 2 | importance 4

# %% exercise rlhf_tutorial.dpo:simpo_loss | 15 min | difficulty 3 | importance 4

# %% exercise rlhf_tutorial.dpo:best_worst_pairs | 15 min | difficulty 2 | importance 3

# %% exercise rlhf_tutorial.dpo:rloo_advantages | 10 min | difficulty 2 | importance 4

# %% exercise rlhf_tutorial.dpo:gspo_sequence_ratio | 15 min | difficulty 3 | importance 4

# %%
progress("06")
