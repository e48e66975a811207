"""DeepSpeed training, streaming loader, EMA, checkpoints, eval and sample CLIs."""
