"""Every module, attribute and path the code's docstrings and comments and the docs name exists, so a
reader who follows a name lands on the file it means.

The rule the names follow: a module is written by its one import name,
`specdeck.engine.forward.kvcache`, and an attribute after it,
`specdeck.engine.forward.kvcache.CachedModel`; a class's attribute may go by the class alone,
`CachedModel.crop`; a path is relative to the repository (`tests/engine/`), to `specdeck/`
(`engine/loop/decoding.py`) or to `specdeck/engine/` (`forward/`), or, starting with `./` or `../`,
to the file that names it. docs/journal/ is a dated record of its days and keeps the names it had
then.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import re
import tokenize
from collections import Counter
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specdeck"
# the folders a path may be relative to, in the order they are tried
BASES = [ROOT, PACKAGE, PACKAGE / "engine"]
SUBPACKAGES = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
# each module of the package by its own name, `row_kernel` -> ["specdeck.engine.forward.row_kernel"],
# and each class by its name, `DecodeConfig` -> ["specdeck.engine.config"] (the modules defining it)
MODULES: dict[str, list[str]] = {}
CLASSES: dict[str, list[str]] = {}
for _path in sorted(PACKAGE.rglob("*.py")):
    _parts = _path.relative_to(ROOT).with_suffix("").parts
    _parts = _parts[:-1] if _parts[-1] == "__init__" else _parts
    MODULES.setdefault(_parts[-1], []).append(".".join(_parts))
    for _node in ast.parse(_path.read_text(encoding="utf-8")).body:
        if isinstance(_node, ast.ClassDef):
            CLASSES.setdefault(_node.name, []).append(".".join(_parts))
PAGES = sorted(
    [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "packaging" / "README.md"]
    + [*PACKAGE.rglob("*.md"), *(ROOT / "training").rglob("*.md")]
)
SOURCES = sorted([*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "packaging").glob("*.py")])

SPAN = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(.*\))?")
PATH = re.compile(r"[\w.-]+(?:/[\w.-]+)*/?")
FILE = re.compile(r"\w+\.(?:py|c|sh)")


def _python_prose(path: Path) -> Iterator[str]:
    """The docstrings and comments of a Python file."""
    text = path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                yield docstring
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            yield token.string


def _comments(path: Path) -> Iterator[str]:
    """The `#` comments of a Makefile or a TOML file."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if "#" in line:
            yield line[line.index("#") :]


def _spans() -> Iterator[tuple[str, str]]:
    """(where, span) for every backticked span in the prose this test reads."""
    for path in SOURCES:
        for prose in _python_prose(path):
            for span in SPAN.findall(prose):
                yield path.relative_to(ROOT).as_posix(), span
    for path in [*PAGES, ROOT / "Makefile", ROOT / "pyproject.toml"]:
        prose = path.read_text(encoding="utf-8") if path.suffix == ".md" else "\n".join(_comments(path))
        for span in SPAN.findall(prose):
            yield path.relative_to(ROOT).as_posix(), span


SPANS = sorted(set(_spans()))


def _has_attribute(owner: object, name: str) -> bool:
    """Whether `owner` has `name`: an attribute, a dataclass field, an annotated class attribute, or
    one its methods set on `self`."""
    if hasattr(owner, name) or name in getattr(owner, "__dataclass_fields__", {}):
        return True
    if inspect.isclass(owner):
        for klass in owner.__mro__:
            if name in getattr(klass, "__annotations__", {}):
                return True
            try:
                if re.search(rf"\bself\.{name}\b", inspect.getsource(klass)):
                    return True
            except (OSError, TypeError):
                continue
    return False


@cache
def resolves(name: str) -> bool:
    """Whether `name` is a module of SpecDeck, or one followed by attributes it has."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            if not _has_attribute(owner, attribute):
                return False
            owner = getattr(owner, attribute, None)
        return True
    return False


def module_name_problem(span: str, where: Path = ROOT) -> str | None:
    """What is wrong with a backticked dotted name of SpecDeck's, or None (also for names that are
    not SpecDeck's, such as `torch.float32`, for a class of SpecDeck's with an attribute it has, such
    as `DecodeConfig.lookup`, and for a file beside `where`)."""
    match = DOTTED.fullmatch(span)
    if not match or (where.parent / span).is_file():
        return None
    name = match.group(1)
    first = name.split(".")[0]
    if first in SUBPACKAGES:
        full = f"specdeck.{name}"
        hint = f"write `{full}`" if resolves(full) else f"`{full}` does not exist either"
        return f"`{name}` is not an import name: {hint}"
    if first == "specdeck":
        return None if resolves(name) else f"`{name}` names no module of SpecDeck or no attribute of one"
    # a module's own name with one of its attributes (row_kernel.QUANTIZED) is a short form too;
    # one whose attribute the module lacks (config.steps, texts.json) is some other thing's
    full = [module + name[len(first) :] for module in MODULES.get(first, [])]
    if any(resolves(name) for name in full):
        return f"`{name}` is not an import name: write `{' or '.join(full)}`"
    # a class of SpecDeck's with an attribute (`DecodeConfig.lookup`) reads well as it is, if it has it
    if first in CLASSES and not any(resolves(f"{module}.{name}") for module in CLASSES[first]):
        return f"`{name}`: {first} ({', '.join(CLASSES[first])}) has no such attribute"
    return None


def _candidates(span: str, where: Path = ROOT) -> list[Path]:
    """The places a relative path may mean: beside `where` for `./` and `../`, else under each base
    holding a folder of its first part."""
    first = span.split("/")[0]
    if first in (".", ".."):
        return [where.parent / span]
    return [base / span for base in BASES if (base / first).is_dir()]


def path_problem(span: str, where: Path = ROOT) -> str | None:
    """What is wrong with a backticked path into the repository, named in the file `where`, or None
    (also for paths that are not the repository's, such as `~/.cache/specdeck` or `figures/`)."""
    if FILE.fullmatch(span):
        if not any(ROOT.glob(f"[!.]*/**/{span}")) and not (ROOT / span).exists():
            return f"`{span}`: no file of that name in the repository"
        return None
    if "/" not in span or not PATH.fullmatch(span):
        return None
    candidates = _candidates(span, where)
    if candidates and not any(path.exists() for path in candidates):
        return f"`{span}` does not exist (read as {', '.join(p.relative_to(ROOT).as_posix() for p in candidates)})"
    return None


def test_every_module_name_imports():
    """Every backticked dotted name that starts with SpecDeck's package, one of its sub-packages or
    one of its modules with an attribute of that module is written in full and imports, attributes
    included; a class of SpecDeck's followed by an attribute has that attribute."""
    problems = [f"{where}: {problem}" for where, span in SPANS if (problem := module_name_problem(span, ROOT / where))]
    assert not problems, "\n".join(problems)


def test_every_path_exists():
    """Every backticked path into the repository, and every backticked .py, .c or .sh file name,
    names a file or folder that exists."""
    problems = [f"{where}: {problem}" for where, span in SPANS if (problem := path_problem(span, ROOT / where))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "span, wrong",
    [
        ("specdeck.engine.forward.kvcache", False),
        ("specdeck.engine.forward.kvcache.CachedModel", False),
        ("specdeck.engine.config.DecodeConfig.lookup", False),
        ("engine.forward.kvcache", True),
        ("specdeck.engine.kvcache", True),
        ("specdeck.engine.forward.kvcache.NoSuchThing", True),
        ("torch.float32", False),
        ("row_kernel.QUANTIZED", True),
        ("config.steps", False),
        ("DecodeConfig.lookup", False),
        ("DecodeConfig.no_such_setting", True),
    ],
)
def test_the_module_rule_tells_names_apart(span, wrong):
    """The check accepts a full import name and its attributes, refuses a short, moved or unknown one,
    and leaves names that are not SpecDeck's alone."""
    assert (module_name_problem(span) is not None) == wrong


@pytest.mark.parametrize(
    "span, wrong",
    [
        ("engine/loop/decoding.py", False),
        ("specdeck/engine/forward/", False),
        ("forward/kvcache.py", False),
        ("tests/engine/", False),
        ("engine/kvcache.py", True),
        ("tests/engine/test_nothing_here.py", True),
        ("no_such_module.py", True),
        ("figures/", False),
        ("../README.md", False),
        ("../no_such_page.md", True),
    ],
)
def test_the_path_rule_tells_paths_apart(span, wrong):
    """The check finds paths relative to the repository, specdeck/, specdeck/engine/ and the page
    that names them, refuses ones that are gone, and leaves paths outside the repository alone."""
    assert (path_problem(span, ROOT / "docs" / "testing.md") is not None) == wrong


def _readme_code_map() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return readme.split("\n## The code\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_code_map_matches_the_tree():
    """README's "The code" names every sub-package of specdeck/ and every room of the engine, and
    each folder it names exists."""
    named = {span for span in SPAN.findall(_readme_code_map()) if span.endswith("/")}
    for folder in named:
        assert any(path.is_dir() for path in _candidates(folder)), f"README's code map names {folder}, gone"
    rooms = [p.name for p in (PACKAGE / "engine").iterdir() if (p / "__init__.py").is_file()]
    missing = sorted({f"{name}/" for name in [*SUBPACKAGES, *rooms]} - named)
    assert not missing, f"README's code map does not name {missing}"


def test_tests_are_laid_out_as_the_code():
    """Every folder of tests/ mirrors a folder of specdeck/, and no two test files share a name
    (pytest imports each by its name alone, tests/ having no __init__.py)."""
    tests = sorted((ROOT / "tests").rglob("test_*.py"))
    for folder in {path.parent.relative_to(ROOT / "tests") for path in tests}:
        assert (PACKAGE / folder).is_dir(), f"tests/{folder}/ mirrors no folder of specdeck/"
    twice = [name for name, count in Counter(path.name for path in tests).items() if count > 1]
    assert not twice, f"test files that share a name: {twice}"
