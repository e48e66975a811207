"""The eval sets' detokenizers turn each corpus's tokenized text back into plain English."""

from aogpt.data_prep.detokenizers import DETOKENIZERS, lambada, lm1b, ptb, wikitext


def test_wikitext_rejoins_numbers_punctuation_brackets_and_quotes():
    line = (
        " The 2 @,@ 000 @-@ year old lobster 's claws ( approx . ) weigh 4 @.@ 9 lb , "
        'or " more " . \n'
    )
    assert (
        wikitext(line)
        == ' The 2,000-year old lobster\'s claws (approx.) weigh 4.9 lb, or "more".\n'
    )


def test_wikitext_closes_heading_markers():
    assert wikitext(" = = Description = = \n") == " == Description ==\n"
    assert wikitext(" = = = Range = = = \n") == " === Range ===\n"


def test_wikitext_leaves_empty_rows_empty():
    assert wikitext("") == ""


def test_ptb_restores_contractions_numbers_slashes_and_unknown_words():
    line = " mr. smith said he does n't like the $ N million \\/ year deal with N N N units <unk> "
    assert (
        ptb(line)
        == " mr. smith said he doesn't like the $1 million / year deal with 1 1 1 units ? "
    )


def test_lm1b_rejoins_urls_punctuation_and_quotes():
    line = 'He said : " it is http : / / www.x.com , ok . " Really ?'
    assert lm1b(line) == 'He said: "it is http://www.x.com, ok." Really?'


def test_lambada_straightens_quotes_and_starts_a_new_line():
    assert (
        lambada("\N{LEFT DOUBLE QUOTATION MARK}Hi,\N{RIGHT DOUBLE QUOTATION MARK} she said to Tom ")
        == '\n"Hi," she said to Tom'
    )


def test_every_eval_set_has_a_detokenizer():
    from aogpt.data_prep.eval_sets import EVAL_SETS

    assert {eval_set.detokenizer for eval_set in EVAL_SETS.values()} == set(DETOKENIZERS)
