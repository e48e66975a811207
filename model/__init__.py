"""AO-GPT network, orders, sampler and checkpoint loading (no DeepSpeed here)."""
