"""Installing SpecDeck like an application: the desktop entry, AppStream metadata, icons, the
wheel's contents and entry point, and the first launch with no network."""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from tiny import ON_CPU, build_model, build_tokenizer

from specdeck.engine.errors import SpecDeckError
from specdeck.engine.loading.models import load_model

ROOT = Path(__file__).resolve().parent.parent
DESKTOP = ROOT / "packaging" / "io.github.specdeck.SpecDeck.desktop"
METAINFO = ROOT / "packaging" / "io.github.specdeck.SpecDeck.metainfo.xml"
ICON_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
UNCACHED_HUB_ID = "HuggingFaceTB/SmolLM2-360M-Instruct"


def _validator(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (Debian package {package}); `make test` installs it when run as root")
    return path


def test_desktop_entry_validates():
    """The .desktop file passes desktop-file-validate with no error or warning."""
    result = subprocess.run(
        [_validator("desktop-file-validate", "desktop-file-utils"), str(DESKTOP)], capture_output=True, text=True
    )
    problems = [line for line in result.stdout.splitlines() if ": error:" in line or ": warning:" in line]
    assert result.returncode == 0 and not problems, result.stdout + result.stderr


def test_metainfo_validates():
    """The AppStream metainfo passes appstreamcli validate and launches the desktop entry."""
    result = subprocess.run(
        [_validator("appstreamcli", "appstream"), "validate", "--no-net", str(METAINFO)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f'<launchable type="desktop-id">{DESKTOP.name}</launchable>' in METAINFO.read_text()


def _png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", header[16:24])


def test_icon_ships_in_every_usual_size():
    """The application icon exists as SVG and as a square PNG of each size desktops ask for."""
    icons = ROOT / "specdeck" / "resources" / "icons"
    assert (icons / "specdeck.svg").read_text().lstrip().startswith("<?xml")
    for size in ICON_SIZES:
        assert _png_size(icons / f"specdeck-{size}.png") == (size, size)


def test_menu_entry_installs_with_its_icon_in_every_size(tmp_path):
    """install_desktop_entry.sh puts a valid menu entry and the icon it names under XDG_DATA_HOME."""
    subprocess.run(
        ["bash", str(ROOT / "packaging" / "install_desktop_entry.sh")],
        check=True,
        capture_output=True,
        env={"XDG_DATA_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    entry = tmp_path / "applications" / DESKTOP.name
    fields = dict(line.split("=", 1) for line in entry.read_text().splitlines() if "=" in line)
    assert fields["Exec"] == "specdeck gui"
    hicolor = tmp_path / "icons" / "hicolor"
    assert (hicolor / "scalable" / "apps" / f"{fields['Icon']}.svg").is_file()
    for size in ICON_SIZES:
        assert _png_size(hicolor / f"{size}x{size}" / "apps" / f"{fields['Icon']}.png") == (size, size)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the checkout, so the build leaves no files in the tree."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    source.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "specdeck", source / "specdeck", ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp / "dist"),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    (built,) = (tmp / "dist").glob("specdeck-*.whl")
    return built


def test_wheel_carries_every_resource(wheel):
    """Every file under resources/ (presets, icons, shipped models, samples) is in the wheel."""
    expected = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "specdeck" / "resources").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "specdeck/resources/icons/specdeck.svg" in expected
    assert expected <= names, sorted(expected - names)


def test_wheel_installs_one_import_package(wheel):
    """Installed, SpecDeck adds one top-level name, `specdeck`, so it cannot shadow another
    project's `app` or `engine` package (or be shadowed by one)."""
    top = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {name for name in top if not name.endswith(".dist-info")} == {"specdeck"}


def test_wheel_entry_point_runs_from_the_installed_files(wheel, tmp_path):
    """The wheel's `specdeck` entry point imports and finds its resources without the checkout."""
    installed = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(installed)
    probe = (
        "import sys, importlib.metadata as md\n"
        "(ep,) = [e for e in md.entry_points(group='console_scripts') if e.name == 'specdeck']\n"
        "main = ep.load()\n"
        "from specdeck.engine.resources import resource_path\n"
        "print(ep.value, main.__module__, sys.modules['specdeck.engine'].__file__, resource_path('icons', 'specdeck.svg'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(installed), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    value, module, engine_file, icon = result.stdout.split()
    assert (value, module) == ("specdeck.cli.launch:main", "specdeck.cli.launch")
    assert Path(engine_file).is_relative_to(installed)
    assert Path(icon).is_relative_to(installed) and Path(icon).is_file()


@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch) -> Path:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


@pytest.fixture
def no_network(monkeypatch):
    """Online mode, but the Hub's address refuses connections, as on a machine with no network."""
    from huggingface_hub import constants

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")


def _assert_hub_unreachable_message(error: SpecDeckError) -> None:
    text = str(error)
    assert "Hugging Face Hub could not be reached" in text
    assert "local folder" in text and f"hf download {UNCACHED_HUB_ID} --local-dir" in text


def test_uncached_hub_id_in_offline_mode_says_hub_unreachable(empty_hub_cache):
    """With HF_HUB_OFFLINE=1 a model never downloaded gives the 'use a local folder' message."""
    with pytest.raises(SpecDeckError) as raised:
        load_model(UNCACHED_HUB_ID)
    _assert_hub_unreachable_message(raised.value)


def test_uncached_hub_id_with_no_network_says_hub_unreachable(empty_hub_cache, no_network):
    """With no network (and no offline flag) the same message comes, not a traceback."""
    with pytest.raises(SpecDeckError) as raised:
        load_model(UNCACHED_HUB_ID)
    _assert_hub_unreachable_message(raised.value)


def _cache_like_a_download(hub_cache: Path, repo_id: str) -> None:
    """Lay a tiny model out the way huggingface_hub stores a downloaded snapshot."""
    commit = "0" * 40
    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    tokenizer = build_tokenizer(snapshot)
    build_model(snapshot, "llama", len(tokenizer), seed=0, eos_token_id=tokenizer.eos_token_id)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)


def test_model_downloaded_before_loads_with_no_network(empty_hub_cache, no_network):
    """A Hub id already in the Hugging Face cache loads offline, by its id."""
    _cache_like_a_download(empty_hub_cache, "tiny-org/tiny-llama")
    loaded = load_model("tiny-org/tiny-llama", ON_CPU)
    assert loaded.name == "tiny-org/tiny-llama"
    assert loaded.tokenizer.decode(loaded.tokenizer("speculative")["input_ids"]) == "speculative"
