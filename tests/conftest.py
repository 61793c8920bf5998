"""Shared test settings."""

import torch

# One intra-op thread: on a busy 2-core machine two threads contend and make small ops many times slower.
torch.set_num_threads(1)
