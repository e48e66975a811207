"""docs/configuration.md's reference is generated from the config dataclasses and up to date."""

from conftest import run_cli


def test_the_configuration_page_holds_the_current_generated_reference(repo):
    generated = run_cli("tools/config_reference.py")
    assert generated.returncode == 0, generated.stderr
    page = (repo / "docs" / "configuration.md").read_text()
    assert generated.stdout in page, ("docs/configuration.md is stale: run "
                                      "python tools/config_reference.py --update")


def test_reference_lists_every_key_with_its_comment():
    text = run_cli("tools/config_reference.py").stdout
    assert "| `order.p_left_to_right` | float | 0.1 |" in text
    assert "| `train.tokens_per_step` | int | 1048576 | global batch in tokens" in text
    assert "`ema.decay`" in text and "`data.streams`" in text
