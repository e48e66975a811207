"""Docs that cannot drift: what README.md and docs/*.md name exists, and the numbers they quote
from a benchmark are in the JSON they name (the rules: docs/README.md; the checker:
tests/docs_testing.py). The last tests give the checker a doc of their own, to show that each rule
fails on what it is for and passes the same text made right."""

import re
import subprocess

import pytest
from docs_testing import REPO, THESE_TESTS, check, check_links, page, pages, slug

FAKE = REPO / "docs" / "a-page-of-this-test.md"  # never written: its links resolve from docs/


@pytest.mark.parametrize("doc", pages(), ids=lambda doc: doc.name)
def test_a_doc_names_only_what_exists(doc):
    problems = check(doc)
    assert not problems, "\n".join(problems)


def test_every_link_of_every_markdown_file_resolves():
    markdown = subprocess.run(["git", "ls-files", "*.md"], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.split()
    problems = [p for name in markdown for p in check_links(page(REPO / name))]
    assert not problems, "\n".join(problems)


def test_every_page_the_code_points_to_exists_with_the_section_it_names():
    """Comments and docstrings send readers to docs/*.md (`docs/export.md, "Hugging Face
    export"`): the page, and the heading where one is named."""
    code = subprocess.run(["git", "ls-files", "*.py", "*.sh", "*.yaml", "Makefile"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout.split()
    problems = []
    for name in (n for n in code if n != THESE_TESTS):
        text = (REPO / name).read_text()
        for target, heading in re.findall(r"\b((?:docs/[\w/-]+|README)\.(?:md|png|json))"
                                          r'(?:,? "([^"]+)")?', text):
            path = REPO / target
            if not path.is_file():
                problems.append(f"{name}: {target}: no such file")
            elif heading and slug(heading) not in {slug(line) for line in path.read_text()
                                                   .splitlines() if line.startswith("#")}:
                problems.append(f'{name}: {target}, "{heading}": no such heading')
    assert not problems, "\n".join(problems)


def test_every_test_file_the_code_names_exists():
    """Comments send readers to the tests that check a rule (`tests/model/test_ways.py checks
    that ...`): the file is there."""
    code = subprocess.run(["git", "ls-files", "*.py", "*.sh", "*.yaml", "Makefile", ".ci/run"],
                          cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    problems = [f"{name}: {target}: no such file"
                for name in code if name != THESE_TESTS
                for target in sorted(set(re.findall(r"\btests/[\w/]+\.py\b",
                                                    (REPO / name).read_text())))
                if not (REPO / target).is_file()]
    assert not problems, "\n".join(problems)


def problems_of(text: str) -> list[str]:
    return check(page(FAKE, text))


def assert_caught(wrong: str, right: str, *named: str) -> None:
    """The wrong text fails, its problems naming each of `named`; the right one passes."""
    problems = problems_of(wrong)
    assert problems and all(any(n in p for p in problems) for n in named), problems
    assert problems_of(right) == []


def test_a_path_that_does_not_exist_fails():
    assert_caught("The loop is in trainer/no_such_loop.py, configs in `configs/*.yml`.\n",
                  "The loop is in trainer/loop.py, configs in `configs/*.yaml`.\n",
                  "trainer/no_such_loop.py", "configs/*.yml")


def test_a_link_to_nothing_fails():
    assert_caught("See [the cluster](no-such-page.md) and [resume](cluster.md#no-such-part).\n",
                  "See [the cluster](cluster.md) and [resume](cluster.md#2-train).\n",
                  "no-such-page.md", "cluster.md#no-such-part")


def test_a_flag_the_command_does_not_take_fails():
    assert_caught("    python data_prep/verify.py --no-such-flag data/tiny\n",
                  "    python data_prep/verify.py --sizes-only data/tiny\n", "--no-such-flag")


def test_a_flag_alone_must_be_one_of_the_commands_its_paragraph_names():
    assert_caught("`data_prep/verify.py` checks a dataset; `--deep` also reads every sample.\n",
                  "`data_prep/verify.py` checks a dataset; `--sizes-only` reads no shard.\n",
                  "--deep")


def test_a_flag_alone_with_no_command_near_must_be_one_some_command_takes():
    """With no command named, the flag is looked for in every command's parser (the sampler's
    --tree comes from its ways' table, so no command's text spells it)."""
    assert_caught("Some samplers keep candidates: `--no-such-tree 3`.\n",
                  "Some samplers keep candidates: `--tree 3`.\n", "--no-such-tree")


def test_a_config_key_that_does_not_exist_fails():
    assert_caught("Set `train.max_stepz`, `recovery.spike_*` and `order.kinds`:\n\n"
                  "    python tools/demo.py order.p_left_to_rite=0.5\n",
                  "Set `train.max_steps`, `recovery.spike_*` and `order.kind`:\n\n"
                  "    python tools/demo.py order.p_left_to_right=0.5\n",
                  "train.max_stepz", "order.kinds", "order.p_left_to_rite")


def test_a_module_function_class_or_parameter_that_does_not_exist_fails():
    assert_caught("`mds.read_rowz` reads a shard, `Checkpointer.rewind(to_step)` goes back, "
                  "`aogpt.data_prep.tokenizerz fetch` and `NoSuchSampler` too.\n",
                  "`mds.read_rows` reads a shard, `Checkpointer.rewind(before_step)` goes back, "
                  "`aogpt.data_prep.tokenizer fetch` and `KVCacheSampler` too.\n",
                  "mds.read_rowz", "rewind(to_step)", "tokenizerz", "NoSuchSampler")


def test_a_make_target_or_environment_variable_that_does_not_exist_fails():
    assert_caught("Run `make benchmark` with `AOGPT_NO_SUCH_VARIABLE=1`.\n",
                  "Run `make gpu-report` with `AOGPT_DRY_RUN=1`.\n",
                  "make benchmark", "AOGPT_NO_SUCH_VARIABLE")


TABLE = """<!-- numbers from sampler-pareto.json, columns: calls/token, true NLL -->
| sampler | calls/token | true NLL | goal |
|---|---|---|---|
| speculative K=4 | {calls} | 2.4816 +- 0.0244 | 0.25 |
"""


def test_a_table_number_that_is_not_in_its_json_fails():
    assert_caught(TABLE.format(calls="0.250"), TABLE.format(calls="0.249"), "0.250")


def test_a_table_row_must_be_one_record_of_its_json():
    """0.192 is a calls/token of the file, K = 8's, not K = 4's; 24.9% is K = 4's 0.249."""
    assert_caught(TABLE.format(calls="0.192"), TABLE.format(calls="24.9%"), "0.192")


def test_a_number_linked_to_its_json_must_be_in_it():
    assert_caught("K = 4 needs [0.25](sampler-pareto.json) calls, [93%](sampler-pareto.json) "
                  "accepted.\n",
                  "K = 4 needs [0.25](sampler-pareto.json) calls, [92%](sampler-pareto.json) "
                  "accepted.\n", "93%")


def test_a_table_of_benchmark_numbers_must_name_its_json():
    table = "| what | ours |\n|---|---|\n| a step (`decode_step.py`) | 1.6 ms |\n"
    assert_caught(table, "<!-- numbers not recorded: measured by hand -->\n" + table,
                  "needs a marker")
