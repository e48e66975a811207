"""AOGPT as a transformers causal LM: left-to-right logits, loss and generate(), plus any-order
generation with the paper's KV-cache sampler.

transformers' convention is logits[:, k] predicts token k + 1 from tokens 0..k. In AO-GPT's
stream (gpt.py) read left to right, slot 0 is [None] and asks for position 0, and slot k >= 1
holds token k - 1 at its position and asks for position k. So for t input tokens the network
runs slots 0..t and slots 1..t are transformers' logits; slot 0's prediction of the first token
from nothing has no place in that convention and is dropped. The same holds for sigma-GPT (the
target position added at the input) and the plain GPT (no target position).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from aogpt import UsageError
from aogpt.model.gpt import AOGPT
from aogpt.model.hf.configuration_aogpt import AOGPTConfig
from aogpt.model.sampler import Generation, KVCacheSampler, SamplingConfig, given_tokens


class AOGPTForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = AOGPTConfig
    base_model_prefix = "aogpt"
    _tied_weights_keys = ["aogpt.lm_head.weight"]  # tied to wte only when config.tie_embeddings

    def __init__(self, config: AOGPTConfig):
        super().__init__(config)
        self.aogpt = AOGPT(config.to_model_config())
        self.post_init()

    def _init_weights(self, module):
        """AOGPT initializes its own weights (gpt.py); from_pretrained overwrites them all."""

    def get_input_embeddings(self):
        return self.aogpt.transformer.wte

    def get_output_embeddings(self):
        return self.aogpt.lm_head

    # ---- left to right ---------------------------------------------------------------------------

    def left_to_right_stream(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None):
        """tokens, positions, target_positions (b, t + 1) and the attention mask of the slots
        (AOGPT.slots) that read input_ids (b, t) left to right.

        Padding (attention_mask 0, on either side) is hidden from every other slot, and real
        tokens are numbered from 0 as if it were absent, so a padded row computes what it
        computes alone. (A padding slot's own output, which no other slot sees, means nothing.)
        """
        t = input_ids.size(1)
        if t > self.config.max_position_embeddings:
            raise ValueError(f"{t} tokens exceed the model's "
                             f"{self.config.max_position_embeddings}: "
                             f"block_size {self.config.block_size} slots, one of them [None]")
        mask = None  # causal
        real = torch.ones_like(input_ids, dtype=torch.bool)
        if attention_mask is not None and not bool(attention_mask.all()):
            real = attention_mask.bool()
            seen = torch.cat([torch.ones_like(real[:, :1]), real], dim=1)  # (b, t + 1)
            causal = torch.ones(t + 1, t + 1, dtype=torch.bool, device=real.device).tril()
            itself = torch.eye(t + 1, dtype=torch.bool, device=real.device)  # padding rows too
            mask = (causal & (seen[:, None, :] | itself))[:, None]  # (b, 1, t + 1, t + 1)
        # the order read: slot k asks for the position after the real tokens among the first k,
        # so a real token is read at its number among them (0..t without padding)
        orders = F.pad(real.long().cumsum(dim=1), (1, 0))  # (b, t + 1)
        # in_order's last token would be held by a slot t + 1, which is not run: a stand-in
        return (*AOGPT.slots(F.pad(input_ids, (0, 1)), orders), mask)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, return_dict: bool | None = None, **kwargs):
        """logits (b, t, vocab), fp32 or wider: logits[:, k] predicts input_ids[:, k + 1]. With
        labels (usually input_ids, -100 = ignored), loss is their shifted mean cross-entropy;
        kwargs go to transformers' loss (e.g. num_items_in_batch)."""
        tokens, positions, target_positions, mask = self.left_to_right_stream(input_ids,
                                                                              attention_mask)
        hidden = self.aogpt.forward_stream(tokens, positions, target_positions, mask)
        logits = self.aogpt.lm_head(hidden[:, 1:])
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        loss = None
        if labels is not None:
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        output = CausalLMOutput(loss=loss, logits=logits)
        return output if return_dict is not False else output.to_tuple()

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor,
                                      attention_mask: torch.Tensor | None = None, **kwargs):
        """No KV cache here: each step of generate() runs the whole sequence again."""
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    # ---- any order -------------------------------------------------------------------------------

    @torch.no_grad()
    def generate_any_order(self, num_samples: int = 1, seq_len: int | None = None,
                           given: dict[int, Sequence[int]] | None = None, steps: int | None = None,
                           sample_ids: Sequence[int] | None = None, **sampling) -> Generation:
        """Sequences of seq_len tokens (default block_size) from the any-order KV-cache sampler
        (model/sampler/), in one batch.

        given: token ids (lists or tensors) fixed at start positions, e.g. {0: prompt_ids,
        40: more_ids}, as sampler.given_tokens reads them; they are read first and the rest is
        generated. steps: the paper's sampler's network calls (default one per generated token:
        exact ancestral sampling). sampling: SamplingConfig's other fields (sampler="speculative"
        with draft=K, tree=C candidates per drafted position, tree_depth and predraft, for
        exactly that distribution in fewer calls; schedule, counts, order (a word of
        model/orders.py READINGS), temperature, top_p, top_k, seed). sample_ids (default
        0..num_samples-1) key the randomness with the seed, as in trainer/sample.py.
        Returns the sampler's Generation: .tokens (b, seq_len) at their positions, .orders.
        """
        seq_len = seq_len or self.config.block_size
        try:
            tokens, mask = given_tokens(seq_len, infill=given)
        except UsageError as err:  # transformers' users expect bad arguments as ValueError
            raise ValueError(str(err)) from None
        to_generate = seq_len - int(mask.sum())
        if to_generate == 0:
            raise ValueError("the given tokens fill every position: nothing to generate")
        ids = torch.arange(num_samples) if sample_ids is None else torch.as_tensor(sample_ids)
        config = SamplingConfig(steps=steps or to_generate, **sampling)
        sampler = KVCacheSampler(self.aogpt, len(ids), seq_len, config)
        return sampler.generate(ids, tokens.expand(len(ids), -1), mask.expand(len(ids), -1))
