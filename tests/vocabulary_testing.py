"""The tests' registries of the closed vocabularies, derived from the tables that define them
(model/injection.py VARIANTS, model/orders.py ORDER_KINDS; the readings' tests iterate
model/orders.py READINGS itself): a new decoder variant or order kind reaches every test that
runs each of them, instead of a hand-kept list."""

from dataclasses import replace

from aogpt.model.config import ModelConfig, sigma_gpt
from aogpt.model.injection import VARIANTS
from aogpt.model.orders import ORDER_KINDS, OrderConfig

# ---- decoder variants ----------------------------------------------------------------------------

DECODER_VARIANTS = tuple(VARIANTS)
# the variants told each target's position: they read any order, so run the any-order tests
ANY_ORDER_VARIANTS = tuple(name for name, variant in VARIANTS.items() if variant.any_order)


def variant_config(base: ModelConfig, variant: str) -> ModelConfig:
    """base as the decoder variant, in the recipe its family is trained with where the project
    has one (sigma-GPT's: LayerNorm, a tied head...), else with only model.target_injection
    changed."""
    if variant == "sigma_sum":
        return sigma_gpt(base)
    return replace(base, target_injection=variant)


# ---- order kinds ---------------------------------------------------------------------------------


def order_configs(block_size: int) -> dict[str, OrderConfig]:
    """One training order configuration per order kind (named by its kind), and the settings that
    draw through other code: a scheduled mixture, blockwise blocks drawn afresh (within and
    across blocks). block_size must divide the sequence length the orders are drawn for."""
    configs = {kind: OrderConfig(kind=kind, block_size=block_size) for kind in ORDER_KINDS}
    configs.update({
        "mixture-schedule": OrderConfig(kind="mixture", p_left_to_right=0.5, schedule="cosine",
                                        schedule_steps=100),
        "blockwise-fresh": OrderConfig(kind="blockwise", block_size=block_size,
                                       blockwise_fixed=False),
        "blockwise-across": OrderConfig(kind="blockwise", block_size=block_size,
                                        block_mode="across_blocks", blockwise_fixed=False),
    })
    return configs


def drawn_afresh(config: OrderConfig) -> bool:
    """Whether the configuration draws an order per sample and step (through OrderSampler's
    compiled draw), not one order for all of them."""
    return not ORDER_KINDS[config.kind].fixed(config)

