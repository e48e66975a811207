"""The main job end to end on a small embedded default: `make demo` runs this.

Stages so far: load the offline GPT-2 tokenizer and resolve the tiny preset. Data preparation,
training, evaluation and sampling join as they land (issues 3-7, 9).
"""

import sys
from pathlib import Path

from aogpt import cli_entry
from aogpt.data_prep.tokenizer import load_gpt2
from aogpt.trainer.config import load_config

REPO = Path(__file__).resolve().parent.parent


@cli_entry
def main() -> int:
    encoding = load_gpt2()
    print(f"tokenizer: {encoding.name}, {encoding.n_vocab} tokens")
    cfg = load_config(REPO / "configs" / "tiny.yaml")
    cfg.validate(world_size=2)
    print(f"config: tiny AO-GPT, {cfg.model.n_layer} layers x {cfg.model.n_embd}, "
          f"{cfg.gradient_accumulation_steps(2)} micro-steps per step on 2 processes")
    print("demo: the data, training, evaluation and sampling stages are not built yet")
    return 0


if __name__ == "__main__":
    sys.exit(main())
