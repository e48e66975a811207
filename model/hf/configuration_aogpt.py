"""ModelConfig as a transformers config: config.json holds every ModelConfig field by its name."""

from __future__ import annotations

import dataclasses

from transformers import PretrainedConfig

from aogpt.model.config import GPT2_EOS, ModelConfig


class AOGPTConfig(PretrainedConfig):
    model_type = "aogpt"
    # the names transformers' utilities (and lm-eval) look for
    attribute_map = {"hidden_size": "n_embd", "num_attention_heads": "n_head",
                     "num_hidden_layers": "n_layer"}

    def __init__(self, **kwargs):
        defaults = ModelConfig()
        for field in dataclasses.fields(ModelConfig):
            setattr(self, field.name, kwargs.pop(field.name, getattr(defaults, field.name)))
        # transformers ties the head to wte by its own flag: one source, ModelConfig's
        kwargs["tie_word_embeddings"] = self.tie_embeddings
        kwargs.setdefault("bos_token_id", GPT2_EOS)
        kwargs.setdefault("eos_token_id", GPT2_EOS)
        kwargs.setdefault("use_cache", False)  # the wrapper keeps no KV cache in generate()
        super().__init__(**kwargs)

    @property
    def max_position_embeddings(self) -> int:
        """The longest input: left to right, t tokens take t + 1 slots ([None] first), and the last
        slot asks for position t, so t + 1 <= block_size, the slots the model was trained on."""
        return self.block_size - 1

    def to_model_config(self) -> ModelConfig:
        return ModelConfig(**{f.name: getattr(self, f.name)
                              for f in dataclasses.fields(ModelConfig)})
