"""Generation orders: which permutation of positions each training sequence is read in.

The sampler itself lands with the model issue; the config lives here so that model/ owns the
whole idea and trainer/ only composes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class OrderConfig:
    """How the generation order of each training sequence is drawn."""

    # mixture: left-to-right with probability p_left_to_right, else uniform (the paper, p = 0.1)
    # uniform: any order; l2r: left to right; fixed: one random order for every sample;
    # blockwise: contiguous blocks of block_size, see block_mode.
    kind: Literal["mixture", "uniform", "l2r", "fixed", "blockwise"] = "mixture"
    p_left_to_right: float = 0.1
    # p_left_to_right moves to p_left_to_right_end over schedule_steps (constant: never moves).
    schedule: Literal["constant", "linear", "step", "cosine"] = "constant"
    p_left_to_right_end: float = 0.0
    schedule_steps: int = 0
    fixed_seed: int = 0  # seed of the fixed order, recorded with the run
    fixed_file: str | None = None  # or a file holding the order (a permutation of 0..n-1)
    block_size: int = 64
    # within_blocks: blocks stay left to right, tokens inside each block in random order;
    # across_blocks: blocks in random order, tokens inside each block left to right.
    block_mode: Literal["within_blocks", "across_blocks"] = "within_blocks"
