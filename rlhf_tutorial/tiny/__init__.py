"""The offline tiny world: a synthetic movie-review corpus and everything built from it.

* :mod:`rlhf_tutorial.tiny.corpus`: the seeded review generator, its sentiment rule, preference pairs;
* :mod:`rlhf_tutorial.tiny.build`: ``python -m rlhf_tutorial build-tiny`` (tokenizer, policy, classifier,
  pairs, checksums);
* ``artifacts/``: the shipped build (seed 0). Load it through :mod:`rlhf_tutorial.worlds`.
"""
