"""No traceback reaches a user: a model's chat template that fails, an output that cannot take a
character, an unusable cache folder or home, a setting in the environment with a wrong value;
each is one line saying what is wrong and what to do."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specdeck.cli.main import _Output
from specdeck.engine import cache
from specdeck.engine.environment import SETTINGS, check_environment
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.loading import models
from specdeck.engine.loading.models import MAX_TEMPLATE_CHARS, encode_prompt, load_tokenizer
from specdeck.engine.loading.registry import DEFAULT_TARGET

EXAMPLES = settings(max_examples=40, deadline=None, database=None)
ROOT = Path(__file__).resolve().parents[2]

BROKEN_TEMPLATES = [
    "{% if %}",
    "{{ messages | no_such_filter }}",
    "{{ raise_exception('this model takes no system turn') }}",
    "{{ 1 / 0 }}",
    "{% for m in messages %}{{ m.content.no_such_method() }}{% endfor %}",
    "{{ messages[99].content.upper() }}",
    "{% macro %}",
    "{% for m in messages %}{{ m['content'] + 1 }}{% endfor %}",
    "{% include 'other.jinja' %}",
    "{{ ().__class__.__mro__ }}",
    "{% for m in messages %}{{ m.content }}",
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(DEFAULT_TARGET)


@EXAMPLES
@given(
    template=st.sampled_from(BROKEN_TEMPLATES) | st.text(alphabet="{}%#-+|()[]'\". abcdefimnorstu_", max_size=60),
    prompt=st.text(min_size=1, max_size=20).filter(str.strip),
)
def test_a_chat_template_that_fails_is_one_clear_error(tokenizer, template, prompt):
    """Whatever a model's chat template holds (malformed, raising, unknown filters, arithmetic on
    the wrong types), encoding a prompt gives ids or a SpecDeckError naming the template and the
    way round it, never another exception."""
    kept = tokenizer.chat_template
    tokenizer.chat_template = template
    try:
        ids = encode_prompt(tokenizer, prompt)
    except SpecDeckError as error:
        assert "chat template" in str(error) and "--no-chat" in str(error)
    else:
        assert all(isinstance(i, int) for i in ids)
    finally:
        tokenizer.chat_template = kept


def test_a_huge_chat_template_is_refused_before_rendering(tokenizer):
    """A template far longer than a chat format (a file of 100 MB) is refused by its length."""
    kept = tokenizer.chat_template
    tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}" + "x" * MAX_TEMPLATE_CHARS
    try:
        with pytest.raises(SpecDeckError, match="chat template is .* characters long"):
            encode_prompt(tokenizer, "hi")
    finally:
        tokenizer.chat_template = kept


# templates that run for hours, each in a different way: nested loops, a growing output, 2^40 calls
ENDLESS_TEMPLATES = [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}",
    "{% macro f(n) %}{% if n < 40 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}{% endmacro %}{{ f(0) }}",
]


@pytest.mark.parametrize("template", ENDLESS_TEMPLATES)
def test_a_chat_template_that_never_ends_is_stopped(tokenizer, template, monkeypatch):
    """A template that would run for hours is stopped at the time limit with one error that names
    the template and the way round it."""
    monkeypatch.setattr(models, "TEMPLATE_SECONDS", 0.5)
    kept = tokenizer.chat_template
    tokenizer.chat_template = template
    started = time.monotonic()
    try:
        with pytest.raises(SpecDeckError, match="chat template ran for more than .*--no-chat"):
            encode_prompt(tokenizer, "hi")
    finally:
        tokenizer.chat_template = kept
    assert time.monotonic() - started < 30
    assert encode_prompt(tokenizer, "hi")  # the model's own template still renders


@EXAMPLES
@given(text=st.text(max_size=40), encoding=st.sampled_from(["latin-1", "ascii", "cp1252", "utf-8"]))
def test_output_in_any_encoding_writes_what_it_can(text, encoding):
    """Standard output in an encoding that lacks some characters writes the others and ? for those,
    never an exception."""
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding=encoding, errors="strict", newline="")
    out = _Output(stream)
    out.write(text)
    out.flush()
    assert raw.getvalue() == text.encode(encoding, "replace")


def test_specdeck_under_a_latin1_output_prints_in_a_line(tmp_path):
    """`specdeck cache` listing an entry whose name latin-1 cannot write, under PYTHONIOENCODING=latin-1:
    exit 0, the entry listed with ?, one line on stderr saying how to get every character."""
    (tmp_path / "gguf" / "模型-🙂").mkdir(parents=True)
    env = {**os.environ, "SPECDECK_CACHE": str(tmp_path), "PYTHONIOENCODING": "latin-1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "specdeck.cli.launch", "cache"], capture_output=True, env=env, timeout=120
    )
    assert done.returncode == 0 and b"Traceback" not in done.stderr
    assert b"??-?" in done.stdout and b"PYTHONIOENCODING=utf-8" in done.stderr


@EXAMPLES
@given(
    name=st.sampled_from(sorted(SETTINGS)),
    value=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12),
)
def test_every_setting_is_checked_like_its_flag(name, value):
    """Each SPECDECK_* setting with any value is either accepted or one SpecDeckError naming it,
    and a key's value is never shown."""
    try:
        check_environment({name: value})
    except SpecDeckError as error:
        assert str(error).startswith(name) and "\n" not in str(error)
        if name == "SPECDECK_API_KEY" and value.strip():
            assert value not in str(error)


def test_an_unknown_setting_is_said_to_be_ignored():
    """A SPECDECK_ name that is no setting (a typo) gets a notice naming the real ones."""
    (notice,) = check_environment({"SPECDECK_THREAD": "2", "HOME": "/root"})
    assert notice.startswith("SPECDECK_THREAD is not a SpecDeck setting: ignored") and "SPECDECK_THREADS" in notice


def test_a_wrong_setting_stops_specdeck_in_one_line(tmp_path):
    """`SPECDECK_LINEAR=fast specdeck run` stops before loading anything, in one line with exit 2."""
    env = {**os.environ, "SPECDECK_CACHE": str(tmp_path), "SPECDECK_LINEAR": "fast", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "specdeck.cli.launch", "run", "--prompt", "hi"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "specdeck: error: SPECDECK_LINEAR is 'fast', not one of dense, packed, kernel: set it to one, or unset it."
    ]


def _unusable_caches(root: Path) -> list[str]:
    (root / "file").write_text("not a folder")
    return [str(root / "file"), str(root / "file" / "below"), "/proc/specdeck-cache", "", "relative/cache"]


@pytest.mark.parametrize("which", range(5))
def test_an_unusable_cache_folder_is_said_at_once(which, tmp_path, monkeypatch):
    """A cache path that is a file, lies under one, cannot be made, is empty or relative: one
    SpecDeckError naming SPECDECK_CACHE at the first use."""
    monkeypatch.setenv("SPECDECK_CACHE", _unusable_caches(tmp_path)[which])
    with pytest.raises(SpecDeckError, match="SPECDECK_CACHE") as raised:
        cache.cache_root()
    assert "\n" not in str(raised.value)


@EXAMPLES
@given(home=st.sampled_from(["/nowhere", "/proc/nowhere", "", "relative"]) | st.text(min_size=1, max_size=10))
def test_an_unknown_home_is_named(home):
    """With HOME pointing nowhere (and no other cache setting), the cache's first use says so."""
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)  # a relative HOME is looked up here: an empty folder
        patch.delenv("SPECDECK_CACHE", raising=False)
        patch.delenv("XDG_CACHE_HOME", raising=False)
        patch.setenv("HOME", home.replace("\0", ""))
        if Path(home).is_dir() and Path(home).is_absolute():
            return
        with pytest.raises(SpecDeckError, match="HOME"):
            cache.cache_root()
