"""Time SpecDeck's first launch as a user sees it, on an X screen of its own, and save what it shows.

Starts Xvfb (1366x768 unless --screen says otherwise) with openbox as window manager, runs
`python -m specdeck.cli.launch gui` (what `specdeck` runs) with a fresh HOME and XDG_CONFIG_HOME
and an empty SPECDECK_CACHE (--cache DIR keeps one, so a second run is warm), grabs the screen
about every 0.3 s, presses Ctrl+Enter (Run; with --compare Ctrl+Shift+Enter) once the window has
painted, and prints:

- launch to mapped: until the window manager shows the window;
- mapped to painted: until the window holds more than a blank (an unpainted window is one colour);
- Run to first token: until text appears in the speculative pane (the largest white area of the
  window's right part, found on the painted window);
- the longest still stretch: the longest time between two grabs that differ, from the window's
  mapping to the first token (the busy bar moves while anything runs, so a stretch is a freeze);
- the run's end: the last change before the screen stood still for --settle seconds after the
  first token (the session's end changes the status bar and the buttons), and the longest still
  stretch between the first token and it.

The last grab is saved as a PNG (--png; docs/screenshot.png is made this way, see
docs/window.md#the-screenshot), and with --frames DIR every grab that differed from the one before.

    python packaging/first_launch.py --png first-launch.png
    python packaging/first_launch.py --cache /tmp/warm --png warm-1.png   # fills the cache
    python packaging/first_launch.py --cache /tmp/warm --png warm-2.png   # warm
    python packaging/first_launch.py --preset edit --compare --png docs/screenshot.png

Needs Xvfb, openbox and xdotool (`make window-frame-tools` installs the first two; apt-get install
xdotool) and Pillow.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image, ImageChops, ImageGrab

ROOT = Path(__file__).resolve().parent.parent
GRAB_EVERY_S = 0.3
PAINTED_COLOURS = 64  # an unpainted (black or one-colour) window has a handful; a painted one thousands
WHITE = (255, 255, 255)  # the token views' background (Qt's base colour under Fusion)


@dataclass
class Timeline:
    """When each thing was first seen, in seconds after the launch, and the grabs' times."""

    mapped: float | None = None
    painted: float | None = None
    run: float | None = None
    first_token: float | None = None
    ended: float | None = None
    changes: list[float] = field(default_factory=list)  # times of grabs that differed from the one before

    def longest_still(self, start: float | None, end: float | None) -> tuple[float, float]:
        """(seconds, when it began) of the longest stretch without a changed grab in [start, end]."""
        if start is None or end is None:
            return 0.0, 0.0
        times = [start] + [t for t in self.changes if start < t < end] + [end]
        gaps = [(b - a, a) for a, b in zip(times, times[1:])]
        return max(gaps, default=(0.0, start))


def x_screen(size: str) -> tuple[list[subprocess.Popen], str]:
    """Xvfb with openbox on it; (the processes, the display's name)."""
    read, write = os.pipe()
    xvfb = subprocess.Popen(
        ["Xvfb", "-displayfd", str(write), "-screen", "0", f"{size}x24", "-nolisten", "tcp"],
        pass_fds=(write,),
        stderr=subprocess.DEVNULL,
    )
    os.close(write)
    with os.fdopen(read) as numbers:
        display = ":" + numbers.readline().strip()
    manager = subprocess.Popen(["openbox"], env={**os.environ, "DISPLAY": display}, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # openbox takes over the screen before the window maps
    return [xvfb, manager], display


def xdotool(display: str, *args: str) -> str:
    done = subprocess.run(
        ["xdotool", *args], capture_output=True, text=True, env={**os.environ, "DISPLAY": display}, timeout=10
    )
    return done.stdout.strip()


def window_box(display: str) -> tuple[str, tuple[int, int, int, int]] | None:
    """The SpecDeck main window's id and (x, y, width, height) of its client area, once mapped."""
    found = xdotool(display, "search", "--onlyvisible", "--name", "^SpecDeck$").split()
    if not found:
        return None
    values = dict(
        line.split("=", 1) for line in xdotool(display, "getwindowgeometry", "--shell", found[0]).splitlines()
    )
    box = (int(values["X"]), int(values["Y"]), int(values["WIDTH"]), int(values["HEIGHT"]))
    return found[0], box


def painted(image: Image.Image, box: tuple[int, int, int, int]) -> bool:
    x, y, width, height = box
    colours = image.crop((x, y, x + width, y + height)).getcolors(PAINTED_COLOURS)
    return colours is None  # None: more colours than PAINTED_COLOURS


def token_pane(image: Image.Image, box: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """The speculative pane: the largest white rectangle in the right three quarters of the window's
    upper half, as a box (left, top, right, bottom) in screen pixels, a few pixels inside its edge."""
    x, y, width, height = box
    region = image.crop((x + width // 4, y, x + width, y + height // 2)).convert("RGB")
    columns, rows = region.size
    pixels = region.load()
    heights = [0] * columns
    best = (0, 0, 0, 0, 0)  # area, left, top, right, bottom in region pixels
    for row in range(rows):  # the largest rectangle under each row's histogram of white runs
        for column in range(columns):
            heights[column] = heights[column] + 1 if pixels[column, row] == WHITE else 0
        stack: list[int] = []
        for column in range(columns + 1):
            current = heights[column] if column < columns else 0
            while stack and heights[stack[-1]] >= current:
                tall = heights[stack.pop()]
                left = stack[-1] + 1 if stack else 0
                area = tall * (column - left)
                if area > best[0]:
                    best = (area, left, row - tall + 1, column, row + 1)
            stack.append(column)
    _, left, top, right, bottom = best
    inset = 4
    return (x + width // 4 + left + inset, y + top + inset, x + width // 4 + right - inset, y + bottom - inset)


def has_text(image: Image.Image, pane: tuple[int, int, int, int]) -> bool:
    colours = image.crop(pane).convert("RGB").getcolors(1 << 16) or []
    return any(colour != WHITE for _, colour in colours)


def measure(arguments: argparse.Namespace) -> int:
    home = Path(tempfile.mkdtemp(prefix="specdeck-first-launch-"))
    cache = Path(arguments.cache) if arguments.cache else home / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    (home / "config").mkdir()
    processes, display = x_screen(arguments.screen)
    environment = {
        **os.environ,
        "DISPLAY": display,
        "QT_QPA_PLATFORM": "xcb",
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / "config"),
        "SPECDECK_CACHE": str(cache),
        "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
    }
    command = [sys.executable, "-m", "specdeck.cli.launch", "gui"]
    if arguments.preset:
        command += ["--preset", arguments.preset]
    frames = Path(arguments.frames) if arguments.frames else None
    if frames:
        frames.mkdir(parents=True, exist_ok=True)
    timeline = Timeline()
    previous: Image.Image | None = None
    pane = None
    found = None
    launched = time.perf_counter()
    app = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while time.perf_counter() - launched < arguments.seconds and app.poll() is None:
            started = time.perf_counter()
            now = started - launched
            image = ImageGrab.grab(xdisplay=display)
            if previous is None or ImageChops.difference(image, previous).getbbox() is not None:
                timeline.changes.append(now)
                if frames:
                    image.save(frames / f"{now:07.2f}.png")
            previous = image
            if timeline.painted is None:
                found = window_box(display)
            if found and timeline.mapped is None:
                timeline.mapped = now
            if found and timeline.painted is None and painted(image, found[1]):
                timeline.painted = now
                xdotool(display, "windowactivate", "--sync", found[0])
                xdotool(display, "key", "--clearmodifiers", "ctrl+shift+Return" if arguments.compare else "ctrl+Return")
                timeline.run = time.perf_counter() - launched
                pane = token_pane(image, found[1])  # on the grab before Run: the pane still empty
            elif pane and timeline.first_token is None and has_text(image, pane):
                timeline.first_token = now
            elif timeline.first_token is not None and now - timeline.changes[-1] >= arguments.settle:
                timeline.ended = timeline.changes[-1]
                break
            time.sleep(max(0.0, GRAB_EVERY_S - (time.perf_counter() - started)))
        if previous is not None and arguments.png:
            previous.save(arguments.png)
    finally:
        app.terminate()
        try:
            app.wait(10)
        except subprocess.TimeoutExpired:
            app.kill()
        for process in reversed(processes):
            process.terminate()
            process.wait(10)
        if not arguments.cache:
            shutil.rmtree(home, ignore_errors=True)
    report(timeline, arguments)
    if timeline.first_token is None and app.stderr is not None:
        print(app.stderr.read()[-2000:], file=sys.stderr)
    return 0 if timeline.first_token is not None else 1


def seconds(value: float | None) -> str:
    return f"{value:.1f} s" if value is not None else "not seen"


def report(timeline: Timeline, arguments: argparse.Namespace) -> None:
    mapped, painted_at, run, token = timeline.mapped, timeline.painted, timeline.run, timeline.first_token
    still, since = timeline.longest_still(mapped, token)
    print(f"cache: {'kept in ' + arguments.cache if arguments.cache else 'empty'}, screen {arguments.screen}")
    print(f"launch to mapped:      {seconds(mapped)}")
    print(f"mapped to painted:     {seconds(painted_at - mapped if painted_at and mapped else None)}")
    print(f"launch to painted:     {seconds(painted_at)}")
    print(f"Run to first token:    {seconds(token - run if token and run else None)}")
    print(f"longest still stretch: {still:.1f} s, from {since:.1f} s (mapped to first token)")
    print(f"Run to the end:        {seconds(timeline.ended - run if timeline.ended and run else None)}")
    still, since = timeline.longest_still(token, timeline.ended)
    print(f"longest still stretch: {still:.1f} s, from {since:.1f} s (first token to the end)")
    if arguments.png:
        print(f"last grab:             {arguments.png}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--screen", default="1366x768", help="the X screen's size (default %(default)s)")
    parser.add_argument("--cache", default=None, help="SPECDECK_CACHE to use and keep (default: a fresh empty one)")
    parser.add_argument("--preset", default=None, help="the prompt preset the window opens with")
    parser.add_argument("--compare", action="store_true", help="press Compare (Ctrl+Shift+Enter) instead of Run")
    parser.add_argument("--png", default=None, help="save the last grab here")
    parser.add_argument("--frames", default=None, help="save every grab that changed into this folder")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds without change that end the run")
    parser.add_argument("--seconds", type=float, default=120.0, help="give up after this long")
    arguments = parser.parse_args()
    missing = [tool for tool in ("Xvfb", "openbox", "xdotool") if shutil.which(tool) is None]
    if missing:
        print(f"first_launch: needs {', '.join(missing)} (apt-get install xvfb openbox xdotool)", file=sys.stderr)
        return 2
    return measure(arguments)


if __name__ == "__main__":
    sys.exit(main())
