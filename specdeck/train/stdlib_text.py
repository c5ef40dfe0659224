"""Training text from the Python standard library of the interpreter that runs the training (PSF
License 2.0): requests to summarise or question a passage of its documentation, beginnings of its
functions for the target to continue as raw code, and its docstrings and source as given answers.
"""

from __future__ import annotations

import ast
import random
import sysconfig
import textwrap
from collections.abc import Iterator
from pathlib import Path

PASSAGE_TASKS = [
    "Summarize the following text in a few sentences.\n\n{p}",
    "Read the text below and list its main points.\n\n{p}",
    "{p}\n\nBased on the text above, what is described and how is it used?",
    "Rewrite the following text in simpler words.\n\n{p}",
    "Extract the names of functions, parameters and values mentioned in this text.\n\n{p}",
    "Here is some documentation:\n\n{p}\n\nAnswer briefly: what does it do, and what should a user watch out for?",
]


def passage_instructions(limit: int, seed: int = 0, max_chars: int = 1000) -> list[str]:
    """Requests to summarise, question or rewrite a passage of standard-library documentation: the
    answers copy from their context, as summaries and retrieval-augmented answers do."""
    rng = random.Random(seed + 1)
    docs = [
        text
        for question, text in stdlib_documents(2 * limit, seed + 1, max_chars)
        if not text.startswith("```") and len(text) > 200
    ]
    return [rng.choice(PASSAGE_TASKS).format(p=doc) for doc in docs[:limit]]


def _stdlib_modules(rng: random.Random, private: bool) -> Iterator[tuple[Path, str, ast.Module]]:
    """The standard library's top-level modules (with `_private` ones if `private`) in an order
    shuffled by `rng`, as (path, source, syntax tree); unreadable files are skipped."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if private or not p.name.startswith("_"))
    rng.shuffle(files)
    for path in files:
        try:
            source = path.read_text(encoding="utf-8")
            yield path, source, ast.parse(source)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue


def code_prefixes(limit: int, seed: int = 0, max_chars: int = 700) -> list[str]:
    """Beginnings of standard-library functions (signature and docstring) for the target to continue
    as raw code, without a chat template, the way code-completion prompts are given."""
    rng = random.Random(seed + 2)
    prefixes: list[str] = []
    for _, source, tree in _stdlib_modules(rng, private=True):
        if len(prefixes) >= limit:
            break
        lines = source.splitlines()
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.FunctionDef)
                and len(node.body) > 1
                and not node.decorator_list
                and ast.get_docstring(node) is not None
            ):
                prefix = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.body[0].end_lineno])) + "\n"
                if 60 < len(prefix) < max_chars:
                    prefixes.append(prefix)
    rng.shuffle(prefixes)
    return prefixes[:limit]


def stdlib_documents(limit: int, seed: int = 0, max_chars: int = 1200) -> list[tuple[str, str]]:
    """(instruction, text) pairs from the standard library: a docstring as the answer to a question
    about its function, class or module, or a slice of source as the answer to a request for code."""
    rng = random.Random(seed)
    pairs: list[tuple[str, str]] = []
    for path, source, tree in _stdlib_modules(rng, private=False):
        if len(pairs) >= 3 * limit:
            break
        module = path.stem
        doc = ast.get_docstring(tree)
        if doc:
            pairs.append((f"What is the Python module `{module}` for?", doc[:max_chars]))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 80:
                    pairs.append((f"What does `{module}.{node.name}` do in Python?", doc[:max_chars]))
                segment = ast.get_source_segment(source, node)
                if isinstance(node, ast.FunctionDef) and segment and 200 < len(segment) < max_chars:
                    pairs.append(
                        (
                            f"Show me how `{node.name}` is implemented in Python's `{module}` module.",
                            f"```python\n{segment}\n```",
                        )
                    )
    rng.shuffle(pairs)
    return pairs[:limit]
