"""`specdeck run`: bad input gets one clear line and exit status 2, never a traceback."""

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny import build_model

from specdeck.cli.bench import bench_specs
from specdeck.cli.main import build_parser, main
from specdeck.cli.options import pair_spec
from specdeck.engine.pair import DrafterKind, PairSpec


@pytest.fixture(scope="module")
def tiny_dirs(tiny_root):
    from tiny import build_pair

    return build_pair(tiny_root / "cli", "llama", noise=0.2)


@pytest.fixture(scope="module")
def foreign_model(tiny_root):
    """A model whose tokenizer was trained on other text: its vocabulary differs."""
    directory = tiny_root / "foreign"
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        ["zebra yak xylophone " * 20, "walrus vole"],
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<pad>", "<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    fast.save_pretrained(directory)
    return build_model(directory, "llama", len(fast), seed=5, eos_token_id=fast.eos_token_id)


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(["run", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--k", "0"], "K must be at least 1"),
        (
            ["--k", "64"],
            "K can be at most 16 (got 64): a round keeps drafts only up to the first one the target rejects",
        ),
        (["--temperature", "-0.5"], "Temperature must be 0"),
        (["--temperature", "nan"], "Temperature must be 0 (greedy) or a positive number (got nan)"),
        (["--temperature", "inf"], "Temperature must be 0 (greedy) or a positive number (got inf)"),
        (["--stop", ""], "A stop string must not be empty"),
        (["--max-k", "100000"], "The longest draft can be at most 64 tokens (got 100000)"),
        (["--top-p", "0"], "top-p must be in (0, 1]"),
        (["--top-p", "1.5"], "top-p must be in (0, 1]"),
        (["--prompt", "   "], "The prompt is empty"),
    ],
)
def test_nonsense_parameters_are_refused(capsys, tiny_dirs, argv, message):
    """Each bad parameter gets a message naming it."""
    target, _ = tiny_dirs
    code, _, err = run_cli(capsys, "--target", str(target), "--no-chat", "--prompt", "hi", *argv)
    assert code == 2 and message in err and "Traceback" not in err


def test_missing_model(capsys, tmp_path):
    """A model path that does not exist is named in the message."""
    code, _, err = run_cli(capsys, "--target", str(tmp_path / "nowhere"), "--prompt", "hi")
    assert code == 2 and "No model at" in err and "nowhere" in err


def test_corrupt_gguf(capsys, tmp_path):
    """A damaged GGUF file is reported as such."""
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    code, _, err = run_cli(capsys, "--target", str(bad), "--prompt", "hi")
    assert code == 2 and "not a readable GGUF model" in err and "broken.gguf" in err


def test_pair_with_different_tokenizers_runs(capsys, tiny_dirs, foreign_model):
    """A draft with another tokenizer runs instead of being refused: the pair's case and shared-token
    count are shown, and greedy output equals plain output."""
    target, _ = tiny_dirs
    argv = [
        "--target",
        str(target),
        "--no-chat",
        "--prompt",
        "The quick brown fox",
        "--max-new-tokens",
        "16",
        "--k",
        "2",
        "--schedule",
        "constant",
    ]
    code, plain, _ = run_cli(capsys, *argv, "--plain")
    assert code == 0
    code, out, err = run_cli(capsys, *argv, "--draft", str(foreign_model))
    assert code == 0 and "different tokenizers" in err and "of the draft's" in err
    assert "different tokenizers" in out  # the summary's pair line
    assert out.partition("\n\npair ")[0] == plain.partition("\n\npair ")[0]


def test_jsonl_stream(tiny_dirs):
    """`--jsonl` writes one parseable object per event, with the documented fields."""
    target, draft = tiny_dirs
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "specdeck.cli.main",
            "run",
            "--target",
            str(target),
            "--draft",
            str(draft),
            "--no-chat",
            "--prompt",
            "The quick brown fox",
            "--max-new-tokens",
            "16",
            "--jsonl",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.splitlines()
    events = [json.loads(line) for line in out]
    tokens = [e for e in events if e["type"] == "token"]
    rounds = [e for e in events if e["type"] == "round"]
    assert events[0]["type"] == "start" and events[0]["runs"] == "float32"  # what runs the tiny target
    assert {"state", "token_id", "text", "pos", "round", "p", "q"} <= tokens[0].keys()
    assert {"round", "drafted", "accepted", "draft_ms", "verify_ms"} <= rounds[0].keys()
    summary = events[-1]
    assert summary["type"] == "summary" and summary["new_tokens"] == 16
    assert summary["text"] == "".join(t["text"] for t in tokens if t["state"] not in ("rejected", "discarded"))
    assert {"acceptance_rate", "mean_accepted_length", "tokens_per_s", "rounds"} <= summary.keys()


def test_prompt_file_that_is_not_utf8_is_named(capsys, tiny_dirs, tmp_path):
    """A prompt file in another encoding gets a message naming the file and the bad byte."""
    target, _ = tiny_dirs
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("Résumé of the quick brown fox".encode("latin-1"))
    code, _, err = run_cli(capsys, "--target", str(target), "--no-chat", "--prompt-file", str(latin))
    assert code == 2 and "Traceback" not in err
    assert "latin1.txt is not UTF-8 text" in err and "0xe9" in err and "Save the file as UTF-8" in err


def test_prompt_file_with_a_byte_order_mark_is_read(capsys, tiny_dirs, tmp_path):
    """A UTF-8 prompt file saved with a byte-order mark decodes as if it had none."""
    target, _ = tiny_dirs
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbfThe quick brown fox")
    code, out, _ = run_cli(
        capsys, "--target", str(target), "--no-chat", "--prompt-file", str(path), "--max-new-tokens", "4", "--jsonl"
    )
    assert code == 0 and json.loads(out.splitlines()[0])["prompt_tokens"] == 4


def test_prompt_too_long_for_the_context(capsys, tiny_dirs):
    """A prompt past the context is refused with both sizes; --truncate-prompt keeps its end and says so."""
    target, _ = tiny_dirs
    prompt = "The quick brown fox jumps over the lazy dog. " * 100
    code, _, err = run_cli(capsys, "--target", str(target), "--no-chat", "--prompt", prompt)
    assert code == 2 and "context 512" in err and "--truncate-prompt" in err and "Traceback" not in err
    code, out, err = run_cli(
        capsys, "--target", str(target), "--no-chat", "--prompt", prompt, "--truncate-prompt", "--max-new-tokens", "4"
    )
    assert code == 0 and "kept its last 508 tokens" in err and "(max_new_tokens)" in out


# model names and paths as people write them: no leading dash (argparse would read an option), no
# comma (the separator of --drafters), no blanks at the ends (PairSpec strips them)
names = st.from_regex(r"[A-Za-z0-9_./~][A-Za-z0-9_./:~ -]{0,30}[A-Za-z0-9_./~]", fullmatch=True)
specs = st.builds(
    PairSpec,
    target=names,
    draft=st.none() | names,
    drafter=st.none() | st.sampled_from(DrafterKind),
    device=st.sampled_from(["auto", "cpu", "cuda", "cuda:1", "mps"]),
    dtype=st.sampled_from(["auto", "float32", "bfloat16", "float16"]),
    trust_remote_code=st.booleans(),
)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(spec=specs)
def test_pair_spec_round_trips_through_its_arguments(spec):
    """A PairSpec written as command-line arguments is read back as the same PairSpec by `run` and
    `bench`, and in `bench --drafters` form with other drafters of its target."""
    parser = build_parser()
    assert pair_spec(parser.parse_args(["run", *spec.arguments()])) == spec
    assert bench_specs(parser.parse_args(["bench", *spec.arguments(), "--out", "results"])) == [spec]
    if spec.drafter is not None and (spec.draft is None or spec.drafter.needs_model):
        others = [spec.with_drafter(DrafterKind.SUFFIX, None), spec.with_drafter(DrafterKind.DRAFT_MODEL, "a/b:c")]
        drafters = ",".join(each.drafter_entry for each in (spec, *others))
        argv = ["bench", *spec.model_arguments(), "--drafters", drafters, "--out", "results"]
        assert bench_specs(parser.parse_args(argv)) == [spec, *others]


def test_jsonl_keeps_each_event_on_one_line_for_any_line_reader():
    """Text with characters that some readers take for line ends (NEL, U+2028, U+2029) stays one
    line under str.splitlines, and reads back as the same text."""
    from specdeck.cli.run import jsonl_line

    text = "a\x85b\u2028c\u2029d\ne Zürich 🙂"
    line = jsonl_line({"type": "token", "text": text})
    assert len(line.splitlines()) == 1
    assert json.loads(line)["text"] == text


def test_a_prompt_file_too_large_to_be_prompts_is_refused_before_reading(tmp_path, capsys):
    """A prompt file over 64 MiB (a log, a dataset picked by mistake) is refused by size, for run and
    bench alike, with what to do, before it is read or a model is loaded."""
    big = tmp_path / "big.txt"
    with big.open("wb") as file:  # sparse: no 65 MiB written
        file.truncate(65 * 2**20)
    assert main(["run", "--prompt-file", str(big)]) == 2
    assert "is 65 MiB: SpecDeck reads prompt files of up to 64 MiB" in capsys.readouterr().err
    assert main(["bench", "--prompts", str(big), "--out", str(tmp_path / "out")]) == 2
    assert "is 65 MiB" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [
        ["distill-head", "--steps", "1"],
        ["train-head", "--steps", "1"],
        ["train-draft", "--steps", "1"],
        ["train-cross-draft", "--steps", "1"],
        ["head-data"],
        ["suffix-texts"],
    ],
)
def test_a_training_commands_out_is_checked_before_any_work(command, tiny_dirs, tmp_path, capsys, monkeypatch):
    """`--out` naming a file, or a place nothing can be written, is refused in one line before a
    model loads or a token is generated (a typo must not cost a run's worth of work)."""
    from specdeck.engine.loading import models

    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("loaded a model before checking --out"))
    target, _ = tiny_dirs
    taken = tmp_path / "a-file"
    taken.write_text("")
    for out, said in ((taken, "is a file"), (taken / "below", "is a file")):
        assert main([*command, "--target", str(target), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "Cannot write results to" in err and said in err and "Traceback" not in err, err
