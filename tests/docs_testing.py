"""The checker of tests/test_docs.py: what a doc names must exist, and every number it quotes from
a benchmark must be in the JSON it names. The conventions, for authors: docs/README.md.

Nothing runs a command. The code is read as syntax trees (ast) for its modules, classes,
functions and config dataclasses; a command's flags come from its own argparse parser, built by
calling the command's parse_args (or main) with argparse stopped before it parses, so the only
cost is the command's imports (torch is loaded by conftest already).
"""

from __future__ import annotations

import argparse
import ast
import bisect
import contextlib
import fnmatch
import functools
import importlib
import importlib.util
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT_FOLDERS = ("benchmarks", "tools", "experiments")  # scripts, no package
THESE_TESTS = "tests/test_docs.py"
FILE_SUFFIXES = {"py", "md", "json", "jsonl", "yaml", "yml", "safetensors", "pt", "png", "txt",
                 "sh", "log", "out", "mds", "tiktoken", "partial", "gz", "parquet", "tar", "xz"}


# --- the pages and their parts --------------------------------------------------------------------

@dataclass
class Block:
    """A run of lines of one kind: "code" (indented or fenced), "table", "prose" (a paragraph or
    a list item), "comment" (an HTML comment line) or "heading"."""

    kind: str
    line: int  # 1-based, of its first line
    lines: list[str]
    section: int  # how many headings come before it

    @property
    def text(self) -> str:
        return " ".join(line.strip() for line in self.lines)


@dataclass
class Page:
    path: Path
    text: str

    @property
    def name(self) -> str:
        return self.path.relative_to(REPO).as_posix() if self.path.is_relative_to(REPO) else str(
            self.path)

    @functools.cached_property
    def blocks(self) -> list[Block]:
        return split_blocks(self.text)

    def where(self, block: Block, text: str = "") -> str:
        """page:line of a block, or of its first line that holds `text`."""
        line = next((i for i, line in enumerate(block.lines) if text and text in line), 0)
        return f"{self.name}:{block.line + line}"


def page(path: Path, text: str | None = None) -> Page:
    return Page(path, path.read_text() if text is None else text)


def pages() -> list[Page]:
    """The docs the checks read: README.md and docs/*.md."""
    return [page(REPO / "README.md"), *(page(p) for p in sorted((REPO / "docs").glob("*.md")))]


ITEM = re.compile(r"\s{0,3}(?:[-*]|\d+\.)\s")


def split_blocks(text: str) -> list[Block]:
    blocks: list[Block] = []
    section, fenced, previous_blank = 0, False, True
    for number, line in enumerate(text.splitlines(), 1):
        last = blocks[-1] if blocks else None
        if line.lstrip().startswith("```"):
            fenced = not fenced
            if fenced:
                blocks.append(Block("code", number + 1, [], section))
            previous_blank = False
            continue
        if fenced:
            last.lines.append(line)
            continue
        if not line.strip():
            if last is not None and last.kind == "code":
                last.lines.append("")
            previous_blank = True
            continue
        if line.startswith("    ") and (previous_blank or (last is not None
                                                           and last.kind == "code")):
            if last is not None and last.kind == "code":
                last.lines.append(line[4:])
            else:
                blocks.append(Block("code", number, [line[4:]], section))
        elif line.startswith("#"):
            section += 1
            blocks.append(Block("heading", number, [line], section))
        elif line.lstrip().startswith("<!--") and line.rstrip().endswith("-->"):
            blocks.append(Block("comment", number, [line], section))
        elif line.lstrip().startswith("|"):
            if last is not None and last.kind == "table" and not previous_blank:
                last.lines.append(line)
            else:
                blocks.append(Block("table", number, [line], section))
        elif (last is not None and last.kind == "prose" and not previous_blank
              and not ITEM.match(line)):
            last.lines.append(line)
        else:
            blocks.append(Block("prose", number, [line], section))
        previous_blank = False
    for block in blocks:
        while block.kind == "code" and block.lines and not block.lines[-1].strip():
            block.lines.pop()
    return blocks


SPAN = re.compile(r"`([^`]+)`")
LINK = re.compile(r"!?\[((?:[^\]\[]|\[[^\]]*\])*)\]\(\s*([^)\s]+)\s*\)")


def spans(block: Block) -> list[str]:
    return SPAN.findall(block.text) if block.kind in ("prose", "table") else []


def links(block: Block) -> list[tuple[str, str]]:
    """(text, target) of each Markdown link and image of a prose or table block."""
    return LINK.findall(SPAN.sub("", block.text)) if block.kind in ("prose", "table") else []


def commands(block: Block) -> list[str]:
    """A code block's shell lines, a trailing backslash joining a line to the next."""
    found, pending = [], ""
    for line in block.lines:
        pending += line.strip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        if pending:
            found.append(pending)
        pending = ""
    return found


def table_rows(block: Block, header: bool = False) -> list[list[str]]:
    """A table's body rows (or, with header, its header row alone), as cells."""
    rows = [[cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            for line in block.lines]
    if header:
        return rows[:1]
    return rows[2:] if len(rows) > 1 and set("".join(rows[1])) <= set("-: ") else rows[1:]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[`*]|\[|\]\([^)]*\)", "", heading.lstrip("#").strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


# --- what exists: files, words, code, config keys, commands ---------------------------------------

@functools.cache
def tracked() -> frozenset[str]:
    """The repository's files and folders (relative paths): git's, and new ones it does not
    ignore."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    folders = {Path(f).parents[i].as_posix() for f in files for i in range(len(Path(f).parts) - 1)}
    return frozenset(files) | frozenset(folders)


@functools.cache
def roots() -> frozenset[str]:
    """The top-level folders a repository path starts with."""
    return frozenset(p for p in tracked() if "/" not in p and (REPO / p).is_dir()
                     and not p.startswith("."))


@functools.cache
def code_words() -> frozenset[str]:
    """Every identifier-like word of the repository's files other than the docs (code, configs,
    templates, tests; not tests/test_docs.py, whose made-up names must fail)."""
    words: set[str] = set()
    for name in tracked():
        if name.startswith("docs/") or name.endswith((".md", ".png")) or name == THESE_TESTS:
            continue
        path = REPO / name
        if path.is_file():
            with contextlib.suppress(UnicodeDecodeError):
                words.update(re.findall(r"\w+", path.read_text()))
    return frozenset(words)


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


@dataclass
class Definition:
    """A module, class, function or value of the repository's code, read from its syntax tree."""

    kind: str  # "module" | "class" | "function" | "value" | "config"
    members: dict[str, Definition] = field(default_factory=dict)
    params: frozenset[str] | None = None  # a function's, None when it takes **kwargs
    bases: tuple[str, ...] = ()
    dataclass: bool = False
    annotations: dict[str, str] = field(default_factory=dict)  # a class's field -> type name

    def member(self, name: str, depth: int = 0) -> Definition | None:
        if name in self.members:
            return self.members[name]
        for base in self.bases if depth < 8 else ():  # inherited from the repository's own
            for cls in code().classes.get(base, []):
                if (found := cls.member(name, depth + 1)) is not None:
                    return found
        return None


def function(node: ast.FunctionDef | ast.AsyncFunctionDef) -> Definition:
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    return Definition("function", params=None if args.kwarg else frozenset(names))


def klass(node: ast.ClassDef) -> Definition:
    members: dict[str, Definition] = {}
    annotations = {}
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            members[statement.name] = function(statement)
            for sub in ast.walk(statement):  # self.X = ... in a method
                for target in getattr(sub, "targets", [getattr(sub, "target", None)]):
                    if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                            and target.value.id == "self"):
                        members.setdefault(target.attr, Definition("value"))
        elif isinstance(statement, ast.ClassDef):
            members[statement.name] = klass(statement)
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            members[statement.target.id] = Definition("value")
            annotations[statement.target.id] = ast.unparse(statement.annotation)
        elif isinstance(statement, ast.Assign):
            for target in statement.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        members[name.id] = Definition("value")
    decorators = {ast.unparse(d).split("(")[0] for d in node.decorator_list}
    return Definition("class", members, bases=tuple(ast.unparse(b).split(".")[-1].split("[")[0]
                                                    for b in node.bases),
                      dataclass=bool(decorators & {"dataclass", "dataclasses.dataclass"}),
                      annotations=annotations)


def module(tree: ast.Module) -> Definition:
    members: dict[str, Definition] = {}
    statements = list(tree.body)
    while statements:
        statement = statements.pop(0)
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            members[statement.name] = function(statement)
        elif isinstance(statement, ast.ClassDef):
            members[statement.name] = klass(statement)
        elif isinstance(statement, (ast.Import, ast.ImportFrom)):
            for alias in statement.names:
                members[(alias.asname or alias.name).split(".")[0]] = Definition("value")
        elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [
                statement.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        members[name.id] = Definition("value")
        elif isinstance(statement, (ast.If, ast.Try, ast.With)):
            statements[:0] = [*statement.body, *getattr(statement, "orelse", []),
                              *(s for h in getattr(statement, "handlers", []) for s in h.body)]
    return Definition("module", members)


@dataclass
class Code:
    modules: dict[str, Definition]  # "aogpt.model.orders", "benchmarks.results", ...
    files: dict[str, Path]  # the same names -> their file
    classes: dict[str, list[Definition]]  # top-level classes by name

    def named(self, basename: str) -> list[Definition]:
        return [m for name, m in self.modules.items() if name.rsplit(".", 1)[-1] == basename]


@functools.cache
def code() -> Code:
    """Every module of the packages (setup.py's PACKAGES) and of the script folders."""
    tree = ast.parse((REPO / "setup.py").read_text())
    packages = next(ast.literal_eval(node.value) for node in tree.body if isinstance(
        node, ast.Assign) and ast.unparse(node.targets[0]) == "PACKAGES")
    folders = {**packages, **{folder: folder for folder in SCRIPT_FOLDERS}}
    modules, files, classes = {}, {}, {}
    for package, folder in folders.items():
        for path in sorted((REPO / folder).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            modules[name] = module(parsed(path))
            files[name] = path
        modules.setdefault(package, Definition("module"))
    for name, definition in modules.items():
        parent = name.rpartition(".")[0]
        if parent in modules:
            modules[parent].members.setdefault(name.rpartition(".")[2], definition)
        for member, found in definition.members.items():
            if found.kind == "class":
                classes.setdefault(member, []).append(found)
    return Code(modules, files, classes)


@functools.cache
def config_sections() -> dict[str, Definition]:
    """The run config's sections (model, data, train, ...: RunConfig's dataclass fields)."""
    run_config = code().modules["aogpt.trainer.config"].members["RunConfig"]
    sections = {}
    for name, annotation in run_config.annotations.items():
        found = [c for c in code().classes.get(annotation, []) if c.dataclass]
        sections[name] = found[0] if found else Definition("value")
    return sections


def config_key(parts: list[str]) -> bool:
    """Whether section.key[.sub] names a field of the run config (`*` matches any)."""
    found = config_sections().get(parts[0])
    for part in parts[1:]:
        if found is None or found.kind != "class":
            return False
        names = [n for n in found.annotations if fnmatch.fnmatchcase(n, part)]
        if not names:
            return False
        classes = [c for c in code().classes.get(found.annotations[names[0]], []) if c.dataclass]
        found = classes[0] if classes else Definition("value")
    return True


def resolve(parts: list[str]) -> list[Definition] | None:
    """What a dotted name of the docs may be (`aogpt.data_prep.tokenizer`, `mds.read_rows`,
    `AOGPT.slots`, `order.kind`): the definitions it names, [] when every reading of it fails, or
    None when its first part is nothing of this repository's (torch.compile, model.safetensors)."""
    starts: list[Definition] = []
    if parts[0] == "aogpt":
        starts.append(code().modules["aogpt"])
    if f"aogpt.{parts[0]}" in code().modules:
        starts.append(code().modules[f"aogpt.{parts[0]}"])
    starts += code().named(parts[0]) + code().classes.get(parts[0], [])
    readings = [start for start in starts if start is not None]
    is_config = parts[0] in config_sections()
    if not readings and not is_config:
        return None
    found = [f for f in (walk(start, parts[1:]) for start in readings) if f is not None]
    if is_config and config_key(parts):
        found.append(Definition("config"))
    return found


def walk(start: Definition, parts: list[str]) -> Definition | None:
    for i, part in enumerate(parts):
        member = start.member(part)
        if member is None:
            return None
        if member.kind == "value" and i < len(parts) - 1:
            return member  # an attribute of a type the syntax tree does not know: not followed
        start = member
    return start


# --- commands and their flags ---------------------------------------------------------------------

class _Parser(BaseException):
    """Raised where a command's parser would parse: carries the parser out of the command."""

    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__()
        self.parser = parser


@contextlib.contextmanager
def parsers_stopped() -> Iterator[None]:
    """argparse raising _Parser instead of parsing, for as long as the context lasts."""
    saved = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args

    def stop(parser, *args, **kwargs):
        raise _Parser(parser)

    argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_known_args = stop
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = saved


# a module that runs as a script (not one whose text merely names __main__, as a package's
# docstring naming its __main__.py does)
RUNS_AS_SCRIPT = re.compile(r"^if __name__ == ['\"]__main__['\"]:", re.M)


@functools.cache
def command_files() -> dict[str, str]:
    """Every command (a file that runs as a script) by its path, its basename where that is one
    command's only, and `-m` module name: -> its path."""
    found: dict[str, str] = {}
    for name, path in code().files.items():
        relative = path.relative_to(REPO).as_posix()
        source = path.read_text()
        if path.name != "__main__.py" and not RUNS_AS_SCRIPT.search(source):
            continue
        found[relative] = relative
        found[name.removesuffix(".__main__")] = relative
        if sum(p.name == path.name for p in code().files.values()) == 1:
            found[path.name] = relative
    return found


def command_of(words: list[str]) -> tuple[str | None, list[str]]:
    """The command a shell line runs (its file) and the words after it."""
    for i, word in enumerate(words):
        if word == "-m" and i + 1 < len(words):
            return command_files().get(words[i + 1]), words[i + 2:]
        if word in command_files():
            return command_files()[word], words[i + 1:]
    return None, []


@functools.cache
def flags(command: str) -> frozenset[str]:
    """The option strings of a command's argparse parser (its subcommands' too)."""
    path = REPO / command
    name = next(n for n, p in code().files.items() if p == path)
    sys.path.insert(0, str(path.parent))  # as for a script: its folder's modules import by name
    try:
        if name.startswith("aogpt."):
            loaded = importlib.import_module(name)
        else:
            spec = importlib.util.spec_from_file_location(f"docs_check_{name.replace('.', '_')}",
                                                          path)
            loaded = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(loaded)
        with parsers_stopped():
            (loaded.parse_args if hasattr(loaded, "parse_args") else loaded.main)([])
    except _Parser as stopped:
        return frozenset(option_strings(stopped.parser))
    finally:
        sys.path.remove(str(path.parent))
    raise AssertionError(f"{command} parsed no command line")


def option_strings(parser: argparse.ArgumentParser) -> Iterator[str]:
    for action in parser._actions:
        yield from action.option_strings
        for sub in getattr(action, "choices", None) or ():
            if isinstance(action.choices, dict) and isinstance(action.choices[sub],
                                                               argparse.ArgumentParser):
                yield from option_strings(action.choices[sub])


@functools.cache
def make_targets() -> frozenset[str]:
    text = (REPO / "Makefile").read_text()
    return frozenset(re.findall(r"^([\w-]+)\s*:", text, re.M))


# --- the checks -----------------------------------------------------------------------------------

def check(doc: Page) -> list[str]:
    """Every problem of a page, one line each, "page:line: what is wrong"."""
    return [problem for checker in CHECKS for problem in checker(doc)]


def check_links(doc: Page) -> Iterator[str]:
    for block in doc.blocks:
        for _, target in links(block):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (doc.path.parent / path).resolve() if path else doc.path
            if not file.exists() or not file.is_relative_to(REPO):
                yield f"{doc.where(block, target)}: link to {target}: no such file"
            elif anchor and file.suffix == ".md" and anchor not in {
                    slug(line) for line in file.read_text().splitlines() if line.startswith("#")}:
                yield (f"{doc.where(block, target)}: link to {target}: no such heading in "
                       f"{path or doc.name}")


PLACEHOLDER = re.compile(r"<[^<>]*>")


def repo_paths(text: str) -> Iterator[str]:
    """The repository paths a text names: words that start with a top-level folder."""
    pattern = (r"(?<![\w.~/$-])((?:" + "|".join(map(re.escape, roots()))
               + r")/(?:[\w.*-]|<[^<>\s][^<>]*>|\{[\w,.]*\})*)")
    for found in re.findall(pattern, text):
        yield found.rstrip(".")


def expand(path: str) -> list[str]:
    """A path's brace alternatives ({small,medium}) with its placeholders (<name>) as `*`."""
    braces = re.search(r"\{([^}]*)\}", path)
    if braces:
        return [p for option in braces.group(1).split(",")
                for p in expand(path[:braces.start()] + option + path[braces.end():])]
    return [PLACEHOLDER.sub("*", path).rstrip("/")]


def path_exists(path: str) -> bool:
    """Tracked (a glob matches a tracked path), or a made file's pattern (<placeholders>) in a
    tracked folder."""
    for pattern in expand(path):
        if any(fnmatch.fnmatchcase(p, pattern) for p in tracked()):
            continue
        if "*" in pattern and PLACEHOLDER.search(path) and str(Path(pattern).parent) in tracked():
            continue
        return False
    return True


def check_paths(doc: Page) -> Iterator[str]:
    for block in doc.blocks:
        if block.kind in ("comment", "heading"):
            continue
        text = "\n".join(block.lines)
        for path in repo_paths(text):
            if not path_exists(path):
                yield f"{doc.where(block, path)}: {path}: no such file or folder in the repository"
        code = text if block.kind == "code" else " ".join(spans(block))
        for name in re.findall(r"(?<![\w./<*-])(\w+\.py)\b", code):
            if not any(p.rsplit("/", 1)[-1] == name for p in tracked()):
                yield f"{doc.where(block, name)}: {name}: no such file in the repository"


DOTTED = re.compile(r"(?<![\w./-])([A-Za-z_]\w*(?:\.[A-Za-z_*]\w*\*?)+)(\([^()]*\))?")


def check_names(doc: Page) -> Iterator[str]:
    """The dotted names of code spans (modules, functions, classes, config keys), the arguments
    of a call written out, and every single identifier of a span (`per_reading`, `READINGS`)."""
    for block in doc.blocks:
        for span in spans(block):
            if re.fullmatch(r"[A-Za-z_]\w*(\(\))?", span) and re.search(r"[A-Z_]", span):
                if span.removesuffix("()") not in code_words():
                    yield f"{doc.where(block, span)}: `{span}`: no such name in the code"
                continue
            for name, call in DOTTED.findall(span):
                yield from check_dotted(doc, block, name, call)
        if block.kind == "code":
            for line in commands(block):
                for key in re.findall(r"(?<![\w.-])([a-z_]+(?:\.[\w*]+)+)=", line):
                    if key.split(".")[0] in config_sections() and not config_key(key.split(".")):
                        yield f"{doc.where(block, key)}: {key}: no such config key"
        for variable in re.findall(r"\bAOGPT_[A-Z_]+\b", "\n".join(block.lines)):
            if variable not in code_words():
                yield (f"{doc.where(block, variable)}: {variable}: no such environment variable in "
                       "the code")


def check_dotted(doc: Page, block: Block, name: str, call: str) -> Iterator[str]:
    parts = name.split(".")
    if parts[-1] in FILE_SUFFIXES:
        return
    found = resolve(parts)
    if found is None:
        return
    if not found:
        yield f"{doc.where(block, name)}: `{name}`: no such module, class, function or config key"
        return
    arguments = [a.split("=")[0].strip() for a in call.strip("()").split(",") if a.strip()]
    if arguments and all(re.fullmatch(r"\w+", a) for a in arguments):
        functions = [f for f in found if f.kind == "function"]
        if functions and not any(f.params is None or set(arguments) <= f.params
                                 for f in functions):
            params = sorted(functions[0].params - {"self", "cls"})
            yield (f"{doc.where(block, name)}: `{name}{call}`: its parameters are "
                   f"({', '.join(params)})")


FLAG = re.compile(r"(?<![\w-])(--[A-Za-z][\w-]*)")
COMMAND_WORD = re.compile(r"[\w./]+\.py\b|\baogpt(?:\.\w+)+")


def named_commands(text: str) -> set[str]:
    return {command_files()[w] for w in COMMAND_WORD.findall(text) if w in command_files()}


def check_flags(doc: Page) -> Iterator[str]:
    """A flag written after a command (a code block's line, a span) must be that command's; a
    span that starts with a flag is one of the commands its paragraph or section names (any
    command's where they name none); a line or span that runs another program (sbatch, torchrun)
    is that program's."""
    by_section: dict[int, set[str]] = {}
    for block in doc.blocks:
        by_section.setdefault(block.section, set()).update(named_commands("\n".join(block.lines)))
    for block in doc.blocks:
        context = named_commands(block.text) | by_section.get(block.section, set())
        for piece in commands(block) if block.kind == "code" else spans(block):
            command, rest = command_of(piece.split())
            if command is not None:
                for flag in FLAG.findall(" ".join(rest)):
                    if not has_flag({command}, flag):
                        yield f"{doc.where(block, flag)}: {flag}: {command} has no such flag"
            elif piece.startswith("--"):
                for flag in FLAG.findall(piece):
                    if not has_flag(context or set(command_files().values()), flag):
                        where = " or ".join(sorted(context)) or "any command"
                        yield f"{doc.where(block, flag)}: {flag}: not a flag of {where}"


def has_flag(commands: set[str], flag: str) -> bool:
    """Whether one of the commands takes the flag: seen in its source as the option of an
    add_argument call, else (a flag made at run time, or none) in its parser, built then, those
    that write no option first (their parser is built elsewhere: lm-eval's)."""
    return any(flag in written_flags(c) for c in commands) or any(
        flag in flags(c) for c in sorted(commands, key=lambda c: (len(written_flags(c)), c)))


@functools.cache
def written_flags(command: str) -> frozenset[str]:
    """The options a command's source passes to argparse as literals, or as constants of its own
    or imported by name (`add("--seed", ...)`, `add_argument(START_OVER, ...)`)."""
    tree = parsed(REPO / command)
    values = dict(string_constants(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in code().files:
            imported = string_constants(parsed(code().files[node.module]))
            values.update({a.asname or a.name: imported[a.name] for a in node.names
                           if a.name in imported})
    written = {values.get(arg.id) if isinstance(arg, ast.Name) else getattr(arg, "value", None)
               for call in ast.walk(tree) if isinstance(call, ast.Call) for arg in call.args}
    return frozenset(w for w in written if isinstance(w, str)
                     and re.fullmatch(r"--[A-Za-z][\w-]*", w))


@functools.cache
def string_constants(tree: ast.Module) -> dict[str, str]:
    return {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for target in node.targets if isinstance(target, ast.Name)}


def check_make(doc: Page) -> Iterator[str]:
    for block in doc.blocks:
        pieces = commands(block) if block.kind == "code" else spans(block)
        for target in (m for p in pieces for m in re.findall(r"^make ([a-z][\w-]*)", p)):
            if target not in make_targets():
                yield f"{doc.where(block, target)}: make {target}: no such target in the Makefile"


# --- numbers and the JSON they come from ----------------------------------------------------------

MARKER = re.compile(r"<!--\s*numbers (from|not recorded)\b:?\s*(.*?)\s*-->")
NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(%|x(?![\w])|M\b|k\b)?")
SCALES = {"%": (100.0, 1.0), "M": (1e-6,), "k": (1e-3,), "x": (1.0,), "": (1.0,)}


def numbers_of(value) -> list[float]:
    """Every number of a JSON value: its numbers, its keys and the numbers written in its
    strings."""
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, (int, float)):
        return [abs(float(value))]
    if isinstance(value, str):
        return [number for _, number, _, _ in numbers(value)]
    if isinstance(value, dict):
        return [n for key, item in value.items() for n in (*numbers_of(key), *numbers_of(item))]
    return [n for item in value for n in numbers_of(item)]


@functools.cache
def json_records(path: Path) -> tuple[tuple[float, ...], ...]:
    """The numbers of each record of a JSON file (each object below the top one, with the top
    one's own numbers: a table's row is one record), the whole file's first."""
    document = json.loads(path.read_text())
    top = [n for key, item in (document.items() if isinstance(document, dict) else ())
           if not isinstance(item, (dict, list)) for n in numbers_of({key: item})]
    records, stack = [numbers_of(document)], [document]
    while stack:
        value = stack.pop()
        children = list(value.values()) if isinstance(value, dict) else (
            value if isinstance(value, list) else [])
        for child in children:
            if isinstance(child, dict):
                records.append(numbers_of(child) + top)
            stack.append(child)
    return tuple(tuple(sorted(set(record))) for record in records)


def numbers(text: str) -> Iterator[tuple[str, float, int, str]]:
    """(as written, value, decimals, unit) of every number of a text."""
    for match in NUMBER.finditer(text):
        whole, decimals, unit = match.groups()
        value = float(whole.replace(",", "") + (f".{decimals}" if decimals else ""))
        yield match.group(0), value, len(decimals or ""), unit or ""


def in_json(value: float, decimals: int, unit: str, pool: tuple[float, ...]) -> bool:
    """Whether a number, as rounded where it is written, is one of a sorted pool's."""
    tolerance = 0.5 * 10 ** -decimals * (1 + 1e-9) + 1e-12
    for scale in SCALES[unit]:
        low = bisect.bisect_left(pool, (value - tolerance) / scale)
        if low < len(pool) and pool[low] * scale <= value + tolerance:
            return True
    return False


def check_numbers(doc: Page) -> Iterator[str]:
    """A table after a `numbers from` marker: every number of its body in the JSONs named; a
    number linked to a JSON: in that JSON; a table naming a benchmark: a marker above it."""
    marker = None
    for block in doc.blocks:
        if block.kind == "comment" and (found := MARKER.search(block.text)):
            marker = (block, found)
            continue
        if block.kind == "table":
            if marker is not None:
                yield from table_in_json(doc, block, *marker)
            elif any(re.search(r"\b(\w+\.py)\b", cell) and Path(
                    "benchmarks", re.search(r"\b(\w+\.py)\b", cell).group(1)).as_posix()
                    in tracked() for row in table_rows(block) for cell in row):
                yield (f"{doc.where(block)}: a table of benchmark numbers needs a marker above it"
                       " naming its JSON (<!-- numbers from X.json -->; docs/README.md)")
        marker = None
        for text, target in links(block):
            if target.endswith(".json"):
                yield from numbers_in_json(doc, block, text, [doc.path.parent / target])


def table_in_json(doc: Page, block: Block, marker: Block, found: re.Match) -> Iterator[str]:
    kind, names = found.groups()
    if kind == "not recorded":
        if not names:
            yield f"{doc.where(marker)}: `numbers not recorded` must say why"
        return
    names, _, columns = names.partition("columns:")
    files = [doc.path.parent / name for name in re.split(r"[,\s]+", names) if name]
    header = table_rows(Block("table", 0, block.lines[:1], 0), header=True)[0]
    wanted = [c.strip() for c in columns.split(",") if c.strip()] or header
    if missing := [c for c in wanted if c not in header]:
        yield f"{doc.where(marker)}: no column {', '.join(missing)} in the table below"
        return
    for row in table_rows(block):
        cells = [cell for name, cell in zip(header, row, strict=False) if name in wanted]
        yield from numbers_in_json(doc, block, " | ".join(cells), files, one_record=True)


def numbers_in_json(doc: Page, block: Block, text: str, files: list[Path],
                    one_record: bool = False) -> Iterator[str]:
    """The numbers of a text in the files, all in one record of one file where one_record (a
    table's row): a row's numbers are one measurement's."""
    if missing := [p.name for p in files if not p.is_file()]:
        yield f"{doc.where(block)}: {', '.join(missing)}: no such JSON"
        return
    written = list(numbers(text))
    if one_record:
        records = [r for path in files for r in json_records(path)[1:]] or [
            json_records(path)[0] for path in files]
    else:
        records = [tuple(sorted(n for path in files for n in json_records(path)[0]))]
    absent: list[str] = [w for w, *_ in written]
    for record in records:
        missed = [w for w, value, decimals, unit in written
                  if not in_json(value, decimals, unit, record)]
        absent = min(absent, missed, key=len)
        if not absent:
            return
    where = ", ".join(p.name for p in files)
    for number in absent:
        place = f"the record of {where} that holds the rest of its row" if one_record and len(
            absent) < len(written) else where
        yield f"{doc.where(block, number)}: {number} is not in {place}"


CHECKS = (check_links, check_paths, check_names, check_flags, check_make, check_numbers)


# --- the pages whose commands run (tests/test_readme.py) ------------------------------------------

def walkthrough() -> list[Path]:
    """README.md, then the pages docs/README.md lists under "Pages whose commands run", in order."""
    text = (REPO / "docs" / "README.md").read_text()
    section = text.split("## Pages whose commands run", 1)[1].split("\n## ", 1)[0]
    return [REPO / "README.md", *(REPO / "docs" / target for target in re.findall(
        r"^\d+\. \[[^\]]*\]\(([^)#]+)\)", section, re.M))]
