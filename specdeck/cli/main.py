"""The `specdeck` command: `run` (terminal), `gui` (the window), `bench`, `train-draft`,
`train-cross-draft`, `train-head`, `head-data`, `suffix-texts`, `cache`.

Bare `specdeck` opens the window. Every user error ends in one clear line and exit status 2, never
a traceback.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

from specdeck.cli.bench import add_bench_command
from specdeck.cli.distill import add_train_cross_draft_command, add_train_draft_command
from specdeck.cli.distill_head import add_distill_head_command
from specdeck.cli.feature_head import add_head_data_command, add_train_head_command
from specdeck.cli.head_agreement import add_head_agreement_command
from specdeck.cli.run import add_run_command
from specdeck.cli.suffix_texts import add_suffix_texts_command
from specdeck.engine.cache import cache_root
from specdeck.engine.environment import check_environment
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.quiet import silence_libraries


def _cmd_cache(args) -> int:
    from specdeck.engine import cache
    from specdeck.engine.atomic import remove_path

    cache.heal(lambda line: print(f"[{line}]", file=sys.stderr))
    if not args.clear:
        print(cache.describe(cache.entries()))
        return 0
    cache.check_clearable()
    removed, kept = cache.clear()
    print(
        f"Removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'} "
        f"({cache.format_size(sum(e.size for e in removed))}) from {cache.gguf_cache()}."
    )
    for entry in kept:
        print(f"Kept {entry.path.name}: {entry.state}.")
    built = cache.clear_kernels()
    print(
        f"Removed {built} compiled kernel{'' if built == 1 else 's'} from {cache.kernels_cache()} "
        "(built again when next needed)."
    )
    for entry in cache.leftovers():  # the heal above removed those whose writer is gone
        print(f"Kept {entry.path}: {entry.state}.")
    print(
        f"Removed {cache.clear_costs()} measured cost files from {cache.costs_cache()} (measured again when next needed)."
    )
    print(
        f"Removed {cache.clear_suffix_texts()} files of past sessions' texts from {cache.suffix_cache()} "
        "(suffix drafting under --suffix-scope all starts afresh)."
    )
    print(
        f"Removed {cache.clear_tensor_indexes()} GGUF tensor indexes from {cache.tensor_index_cache()} "
        "(read again from the files when next needed)."
    )
    for entry in cache.training_folders():
        writer = cache.in_use(entry.path)
        if writer is None:
            remove_path(entry.path)
            print(f"Removed {entry.path} ({cache.format_size(entry.size)}): training data, made again by its command.")
        else:
            print(f"Kept {entry.path}: training data that process {writer} is writing now.")
    return 0


def _cmd_gui(args) -> int:
    if (
        not os.environ.get("DISPLAY")
        and not os.environ.get("WAYLAND_DISPLAY")
        and os.environ.get("QT_QPA_PLATFORM", "").split(":")[0] != "offscreen"  # its options after a colon
        and sys.platform.startswith("linux")
    ):
        if args.demo:
            os.environ["QT_QPA_PLATFORM"] = "offscreen"
        else:
            print(
                "No display found: running the default pair in the terminal instead "
                "(`specdeck run`; set QT_QPA_PLATFORM=offscreen to force the window).",
                file=sys.stderr,
            )
            return main(["run"])
    try:
        from specdeck.app.main import run_gui, xcb_problem
    except ImportError as error:
        raise SpecDeckError(
            f"The window needs PySide6, pyqtgraph and qasync ({error}): reinstall SpecDeck with its dependencies."
        ) from error
    problem = xcb_problem()
    if problem and args.demo:
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    elif problem:
        print(
            f"{problem}\nMeanwhile, running the default pair in the terminal instead (`specdeck run`).", file=sys.stderr
        )
        return main(["run"])
    return run_gui(args)


def build_parser(window_only: bool = False) -> argparse.ArgumentParser:
    """The parser of every command; `window_only`: of `gui` alone, which opens the window (the
    training commands' options take their defaults from the training code, which imports torch,
    and the window paints before torch has imported)."""
    parser = argparse.ArgumentParser(prog="specdeck", description="A playground for speculative decoding.")
    commands = parser.add_subparsers(dest="command")

    if not window_only:
        add_run_command(commands)

    gui = commands.add_parser("gui", help="open the window")
    gui.add_argument("--demo", action="store_true", help="load the default pair and run a compare session")
    gui.add_argument("--screenshot", default=None, help="with --demo: save a PNG of the window and exit")
    gui.add_argument("--export-csv", default=None, help="with --demo: save the session's CSV")
    gui.add_argument("--preset", default=None, help="the prompt preset to open (with --demo: to run; default chat)")
    gui.set_defaults(handler=_cmd_gui)
    if window_only:
        return parser

    cache = commands.add_parser(
        "cache", help="list the converted models and compiled kernels SpecDeck keeps, and their sizes"
    )
    cache.add_argument(
        "--clear",
        action="store_true",
        help="delete them (they are converted or built again when needed), the measured costs, the "
        "past sessions' texts kept for suffix drafting and what interrupted writes left",
    )
    cache.set_defaults(handler=_cmd_cache)

    add_bench_command(commands)
    add_train_draft_command(commands)
    add_train_cross_draft_command(commands)
    add_train_head_command(commands)
    add_head_data_command(commands)
    add_distill_head_command(commands)
    add_head_agreement_command(commands)
    add_suffix_texts_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(window_only=not words or words[0] == "gui")  # bare `specdeck` is `specdeck gui`
    args = parser.parse_args(words)
    if args.command is None:
        args = parser.parse_args(["gui"])
    if args.command != "gui":  # the window's model thread does it as it imports the engine, after the first paint
        silence_libraries()  # SpecDeck reports its own progress; the libraries keep quiet
    stdout = sys.stdout
    if stdout is not None and not isinstance(stdout, _Output):
        sys.stdout = _Output(stdout)  # type: ignore[assignment]
    try:
        for notice in check_environment():
            print(f"specdeck: {notice}", file=sys.stderr)
        cache_root()  # an unusable cache folder is said at once, not after a model has loaded
        return args.handler(args)
    except SpecDeckError as error:
        print(f"specdeck: error: {error}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as error:  # torch's OutOfMemoryError is a RuntimeError
        from specdeck.engine.memory import is_out_of_memory, out_of_memory_message

        if not is_out_of_memory(error):
            raise
        print(f"specdeck: error: {out_of_memory_message(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `specdeck run | head`: the reader left; say nothing more
        _silence_stdout()
        return 141  # 128 + SIGPIPE, as a command killed by the broken pipe would report
    except _OutputFailed as failed:
        _silence_stdout()
        print(
            f"specdeck: error: the output could not be written ({failed.error.strerror or failed.error}): "
            "free space where standard output goes, or send it elsewhere.",
            file=sys.stderr,
        )
        return 1
    finally:
        sys.stdout = stdout


class _OutputFailed(Exception):
    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class _Output:
    """Standard output whose failures (a full disk, a device error) are told apart from any other
    OSError, so that `main` reports them in a line; a reader that left stays a BrokenPipeError.
    Where it takes an encoding that cannot write a character (PYTHONIOENCODING=latin-1, an ASCII
    locale), that character is written as ? and one line on stderr says how to get every one."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self._told = False

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except UnicodeEncodeError:
            encoding = self._stream.encoding or "ascii"
            if not self._told:
                self._told = True
                print(
                    f"specdeck: standard output takes {encoding}, which cannot write every character of "
                    "the text: those are shown as ?. Set PYTHONIOENCODING=utf-8 (or a UTF-8 locale) for them.",
                    file=sys.stderr,
                )
            return self.write(text.encode(encoding, "replace").decode(encoding))
        except BrokenPipeError:
            raise
        except OSError as error:
            raise _OutputFailed(error) from error

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as error:
            raise _OutputFailed(error) from error

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so Python's final flush does not raise again at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    code = main()
    gc.freeze()  # as `specdeck.cli.launch` does: the exit's collections then skip all the command made
    sys.exit(code)
