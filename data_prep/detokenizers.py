"""Detokenizers of the zero-shot evaluation sets: undo each corpus's tokenization before GPT-2 BPE.

WikiText, PTB and LM1B are distributed as whitespace-tokenized text ("word , word", "it 's"); GPT-2
never saw text like that, so the zero-shot protocol of GPT-2, SEDD and AO-GPT
rewrites it to plain English first. The rules below are that protocol's, applied in the same
order: perplexities are only comparable with the paper's when the text is the same byte for byte.

Each detokenizer maps one example (one dataset row) to the text that gets tokenized.
"""

import re
from collections.abc import Callable

# A rule is (pattern, replacement): a str pattern is replaced literally, a compiled one as a regex.
Rule = tuple[str | re.Pattern, str]


def _apply(rules: list[Rule], text: str) -> str:
    for pattern, replacement in rules:
        if isinstance(pattern, str):
            text = text.replace(pattern, replacement)
        else:
            text = pattern.sub(replacement, text)
    return text


def _strip_inside(open_mark: str, close_mark: str) -> Rule:
    """'( a b )' -> '(a b)': drops the spaces just inside a bracket or quote pair."""
    o, c = re.escape(open_mark), re.escape(close_mark)
    return re.compile(rf"{o}\s*([^{c}]*?)\s*{c}"), rf"{open_mark}\1{close_mark}"


# WikiText keeps numbers' separators as " @-@ ", " @,@ ", " @.@ " and spaces out punctuation,
# brackets and the "= = Heading = =" markers. (The historical rule list also holds a regex written
# with JavaScript-style slashes, "/' [0-9]/", which only matches that literal text and never fires
# on WikiText; it is left out.)
_WIKITEXT: list[Rule] = [
    ("s '", "s'"),
    (" @-@ ", "-"),
    (" @,@ ", ","),
    (" @.@ ", "."),
    (" : ", ": "),
    (" ; ", "; "),
    (" . ", ". "),
    (" ! ", "! "),
    (" ? ", "? "),
    (" , ", ", "),
    _strip_inside("(", ")"),
    _strip_inside("[", "]"),
    _strip_inside("{", "}"),
    _strip_inside('"', '"'),
    _strip_inside("'", "'"),
    ("= = = =", "===="),
    ("= = =", "==="),
    ("= =", "=="),
    (" \N{DEGREE SIGN} ", "\N{DEGREE SIGN}"),
    (" \n", "\n"),
    ("\n ", "\n"),
    (" N ", " 1 "),
    (" 's", "'s"),
]

# Mikolov's PTB: lower case, "N" for every number, "<unk>" for rare words, "\/" for "/".
_PTB: list[Rule] = [
    (" 's", "'s"),
    ("s ' ", "s' "),
    (" n't", "n't"),
    (" \n ", "\n"),
    ("\\/", "/"),
    # Every " N " becomes " 1 ", also in runs like " N N N " whose matches overlap.
    (re.compile(r"(?<= )N(?= )"), "1"),
    ("$ 1", "$1"),
    ("# 1", "#1"),
    ("<unk>", "?"),
]

# The One Billion Word benchmark: tokenized news sentences, URLs split at every symbol.
_LM1B: list[Rule] = [
    ("http : / / ", "http://"),
    ("https : / / ", "https://"),
    (re.compile(r" '(\w+)"), r"'\1"),
    (re.compile(r" (\w+) \. "), r" \1. "),
    (re.compile(r" (\w+) \.$"), r" \1."),
    (" ? ", "? "),
    (re.compile(r" \?$"), "?"),
    (" ! ", "! "),
    (re.compile(r" !$"), "!"),
    (" , ", ", "),
    (" : ", ": "),
    (" ; ", "; "),
    (" / ", "/"),
    (re.compile(r'" ([^"]+) "'), r'"\1"'),
    (re.compile(r"' ([^']+) '"), r"'\1'"),
    (re.compile(r"\( ([^()]+) \)"), r"(\1)"),
    (re.compile(r"\[ ([^\[\]]+) \]"), r"[\1]"),
    ("$ ", "$"),
    ("\N{POUND SIGN} ", "\N{POUND SIGN}"),
]


def wikitext(text: str) -> str:
    return _apply(_WIKITEXT, text)


def ptb(text: str) -> str:
    return _apply(_PTB, text)


def lm1b(text: str) -> str:
    return _apply(_LM1B, text)


def lambada(text: str) -> str:
    """LAMBADA is plain text: the protocol straightens curly quotes, adds a leading newline."""
    for curly in ("\N{LEFT DOUBLE QUOTATION MARK}", "\N{RIGHT DOUBLE QUOTATION MARK}"):
        text = text.replace(curly, '"')
    return "\n" + text.strip()


DETOKENIZERS: dict[str, Callable[[str], str]] = {
    "wikitext": wikitext,
    "ptb": ptb,
    "lm1b": lm1b,
    "lambada": lambada,
}
