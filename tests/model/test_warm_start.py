"""model.init_from: AO-GPT started from a left-to-right GPT reads left to right as that GPT did,
at step 0, for a GPT-2 made by transformers and for a left-to-right checkpoint of ours."""

import json

import pytest
import torch
from vocabulary_testing import DECODER_VARIANTS

from aogpt import UsageError
from aogpt.model import AOGPT, save_consolidated
from aogpt.model.config import GPT2_EOS, GPT2_VOCAB, ModelConfig, plain_gpt
from aogpt.model.warm_start import check_source, warm_start

BLOCK = 16


def gpt2_like(**changes) -> ModelConfig:
    return ModelConfig(**{"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": BLOCK,
                          "cond_dim": 8, "norm": "layer", "qk_norm": False, "bias": True,
                          "gelu": "tanh", **changes})


def save_gpt2(folder, n_positions=BLOCK + 1, **changes):
    """A GPT-2 built and saved by transformers (its own weights: random, seeded)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=n_positions,
                                       **changes))
    model.save_pretrained(folder)
    return model.eval()


IDX = torch.randint(0, GPT2_VOCAB, (3, BLOCK), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("injection", DECODER_VARIANTS)
def test_at_step_0_the_left_to_right_logits_are_gpt2s_after_its_end_of_text(tmp_path, injection):
    gpt2 = save_gpt2(tmp_path / "gpt2")
    model = AOGPT(gpt2_like(target_injection=injection)).eval()
    assert warm_start(model, tmp_path / "gpt2").startswith("Hugging Face GPT-2")
    with torch.no_grad():
        ours = model.logits(IDX)  # slot k predicts token k from [None], x_0 .. x_{k-1}
        shifted = torch.cat([torch.full((3, 1), GPT2_EOS), IDX[:, :-1]], dim=1)
        theirs = gpt2(shifted).logits
    # the same fp32 operations up to the order of sums inside matmuls and norms (d = 32, 2 layers)
    torch.testing.assert_close(ours[..., :GPT2_VOCAB], theirs, rtol=1e-5, atol=1e-5)
    # the padded ids get no probability: the softmax is GPT-2's
    torch.testing.assert_close(ours.log_softmax(-1)[..., :GPT2_VOCAB], theirs.log_softmax(-1),
                               rtol=1e-5, atol=1e-5)


def test_any_target_position_reads_as_left_to_right_until_training_moves_adaln(tmp_path):
    save_gpt2(tmp_path / "gpt2")
    model = AOGPT(gpt2_like()).eval()
    warm_start(model, tmp_path / "gpt2")
    orders = torch.stack([torch.randperm(BLOCK, generator=torch.Generator().manual_seed(s))
                          for s in range(3)])
    with torch.no_grad():
        tokens, positions, _, _ = model.training_stream(IDX, orders)
        hidden = model.forward_stream(tokens, positions, orders)
        elsewhere = model.forward_stream(tokens, positions, orders.roll(1, dims=1))
    assert torch.equal(hidden, elsewhere)  # gate 1, shift 0, scale 0 for every target position


def test_a_left_to_right_checkpoint_of_ours_starts_ao_gpt_exactly(tmp_path):
    torch.manual_seed(2)
    gpt = AOGPT(plain_gpt(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=BLOCK,
                                      cond_dim=8))).eval()
    save_consolidated(tmp_path / "gpt", gpt.config, gpt.state_dict(), None)
    model = AOGPT(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=BLOCK, cond_dim=8)).eval()
    warm_start(model, tmp_path / "gpt")
    with torch.no_grad():
        assert torch.equal(model.logits(IDX), gpt.logits(IDX))


def test_a_folder_the_model_cannot_start_from_is_one_line(tmp_path):
    save_gpt2(tmp_path / "small_vocab", vocab_size=1000)
    with pytest.raises(UsageError, match="has a vocabulary of 1000 tokens, not GPT-2's 50257"):
        check_source(tmp_path / "small_vocab", gpt2_like())
    save_gpt2(tmp_path / "gpt2")
    with pytest.raises(UsageError, match="needs GPT-2's block: set model.norm=layer "
                                         "model.bias=true model.qk_norm=false model.gelu=tanh"):
        check_source(tmp_path / "gpt2", ModelConfig(n_layer=2, n_head=2, n_embd=32))
    with pytest.raises(UsageError, match="is a GPT-2 of .'n_layer': 2, 'n_head': 2, 'n_embd': 32"):
        check_source(tmp_path / "gpt2", gpt2_like(n_layer=3))
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(UsageError, match="holds a bert model, not a Hugging Face GPT-2"):
        check_source(tmp_path / "bert", gpt2_like())
    with pytest.raises(UsageError, match="neither a Hugging Face GPT-2 folder"):
        check_source(tmp_path / "nowhere", gpt2_like())
