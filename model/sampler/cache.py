"""The static KV cache of a sampler: every layer's keys and values, allocated once."""

from __future__ import annotations

import torch


class StaticKVCache:
    """Keys and values of every layer, each (b, h, slots, hd), allocated once.

    Before each call, `prepare` says where the new rows go and how many slots they may see;
    attention then calls `update` (the attention.KVCache protocol) once per layer. Each layer's
    keys and values are a tensor of their own, not views of one: a compiled step then writes
    its new rows into them in place, where writing into a view makes inductor copy the base.

    keys_last: the keys are stored as (b, h, hd, slots) and handed to attention as a transposed
    view, so that q @ k^T reads them as they lie. A CPU's bf16 batched matmul copies k^T first
    whenever the visible slots are fewer than all of them (small model, batch 4, 31 rows, 600 of
    1025 slots: 1.76 ms -> 1.03 ms a layer on an AVX512-BF16 EPYC); the GPU kernels want
    (b, h, slots, hd).
    """

    def __init__(self, n_layer: int, batch: int, n_head: int, slots: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, keys_last: bool = False):
        shape = (batch, n_head, slots, head_dim)
        key_shape = (batch, n_head, head_dim, slots) if keys_last else shape
        self.keys_last = keys_last
        self.keys = [torch.zeros(key_shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        self.rows = torch.arange(batch, device=device)[:, None]  # (b, 1)
        self.write_slots: torch.Tensor | None = None
        self.visible = slots

    def prepare(self, write_slots: torch.Tensor, visible: int) -> None:
        """write_slots (b, s): the slot of each new row; visible: slots 0..visible-1 are
        attended."""
        self.write_slots, self.visible = write_slots, visible

    def copy_slot(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """Each sample's keys and values at slot source[i] to slot target[i] ((b,) int64), in
        every layer: the row a planner chose becomes the slot it decided."""
        rows = self.rows[:, 0]
        for keys, values in zip(self.keys, self.values, strict=True):
            if self.keys_last:
                keys[rows, :, :, target] = keys[rows, :, :, source]
            else:
                keys[rows, :, target] = keys[rows, :, source]
            values[rows, :, target] = values[rows, :, source]

    @property
    def kv(self) -> torch.Tensor:
        """A copy of the whole cache, (n_layer, 2, b, h, slots, hd): for inspection."""
        keys = [k.transpose(-2, -1) if self.keys_last else k for k in self.keys]
        return torch.stack([torch.stack(pair) for pair in zip(keys, self.values, strict=True)])

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys[layer], self.values[layer]
        # indexing (b, s) pairs moves them first: the values go in as (b, s_new, h, hd), in the
        # cache's dtype (under autocast the projections come in bf16 over fp32 weights)
        if self.keys_last:
            keys[self.rows, :, :, self.write_slots] = k.transpose(1, 2).to(keys.dtype)
            visible_keys = keys[..., :self.visible].transpose(-2, -1)
        else:
            keys[self.rows, :, self.write_slots] = k.transpose(1, 2).to(keys.dtype)
            visible_keys = keys[:, :, :self.visible]
        values[self.rows, :, self.write_slots] = v.transpose(1, 2).to(values.dtype)
        return visible_keys, values[:, :, :self.visible]
