"""`specdeck train-cross-draft`: a draft with a byte-level BPE of its own for the built-in target,
which pairs with it as "different tokenizers" and keeps greedy output exact."""

from __future__ import annotations

import fnmatch
import json
import shutil

import pytest
import torch
from tiny import ON_CPU

from specdeck.cli.main import main
from specdeck.engine import DecodeConfig, TokenEvent, encode_prompt, generate
from specdeck.engine.drafting.cross_vocab import CrossVocabularyDrafter
from specdeck.engine.drafting.vocabulary import match_vocabularies
from specdeck.engine.loading.models import load_model
from specdeck.engine.loading.registry import DEFAULT_TARGET
from specdeck.engine.pair import PairSpec
from specdeck.engine.session import load_pair
from specdeck.train import RUN_STATE

# a few seconds: the target writes six short answers, the draft memorises them in part
SMALL = [
    "--answers",
    "4",
    "--code",
    "2",
    "--passages",
    "0",
    "--answer-tokens",
    "32",
    "--generation-batch",
    "3",
    "--exchanges",
    "0",
    "--vocab",
    "400",
    "--hidden",
    "64",
    "--layers",
    "2",
    "--intermediate",
    "128",
    "--lr",
    "1e-2",
    "--batch",
    "4",
    "--max-length",
    "32",
    "--eval-every",
    "40",
    "--threads",
    "1",
]
PROMPTS = [
    "The quick brown fox",
    "Café, naïve, façade, 東京, Zürich, 🙂 — Ωμέγα ≠ ✓",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Once   upon\t\ta time\n\n\n    there   was",
]
ANSWER = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The output folder of an 80-step build for the built-in target."""
    out = tmp_path_factory.mktemp("cross-draft") / "run"
    assert main(["train-cross-draft", "--out", str(out), "--steps", "80", *SMALL]) == 0
    return out


def test_a_run_writes_only_the_names_its_folder_guard_knows(built):
    """Every name a run leaves in --out is one a later run may claim as its state
    (`specdeck.train.RUN_STATE`), so resuming never meets its own files as a user's."""
    names = [path.name for path in built.iterdir() if not path.name.startswith(".")]
    assert names and all(any(fnmatch.fnmatchcase(name, p) for p in RUN_STATE) for name in names), names


@pytest.fixture(scope="module")
def smollm2():
    return load_model(DEFAULT_TARGET, ON_CPU)


def test_draft_is_a_model_folder_with_its_own_tokenizer(built):
    """The draft is a Hugging Face folder with a model card and a byte-level BPE of at most --vocab
    tokens, which keeps the target's control tokens whole and ends a text where the target does."""
    folder = built / "draft"
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= {p.name for p in folder.iterdir()}
    draft = load_model(str(folder), ON_CPU)
    assert len(draft.tokenizer) <= 400
    assert json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["decoder"]["type"] == "ByteLevel"
    for control in ("<|im_start|>", "<|im_end|>"):
        assert len(draft.tokenizer(control, add_special_tokens=False)["input_ids"]) == 1
    assert draft.tokenizer.eos_token == "<|im_end|>"


def test_pair_with_the_built_in_target_is_different_tokenizers(built, capsys):
    """Loaded as a draft for the built-in target, it is the case of different tokenizers with
    its shared-token count, in the pair's description and in `specdeck run`'s report."""
    pair = load_pair(PairSpec(DEFAULT_TARGET, str(built / "draft"), "draft-model", device="cpu", dtype="float32"))
    assert pair.cross_vocabulary and pair.vocabulary.case == "different"
    shared = f"{pair.vocabulary.shared:,} of the draft's {pair.vocabulary.draft_tokens:,} tokens have a twin"
    assert 256 < pair.vocabulary.shared <= pair.vocabulary.draft_tokens
    assert shared in pair.description
    code = main(
        [
            "run",
            "--draft",
            str(built / "draft"),
            "--drafter",
            "draft-model",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--k",
            "2",
            "--schedule",
            "constant",
            "--lookup",
            "0",
            "--max-new-tokens",
            "6",
            "--prompt",
            "Hello",
        ]
    )
    assert code == 0
    captured = capsys.readouterr()
    assert "different tokenizers" in captured.err and shared in captured.out


def test_greedy_with_the_built_in_target_equals_plain(built, smollm2):
    """For K = 1..4, on prompts with Unicode, code and whitespace runs and on requests the draft
    learnt the answers to, greedy decoding with the draft keeps exactly plain greedy's tokens."""
    draft = load_model(str(built / "draft"), ON_CPU)
    match = match_vocabularies(smollm2, draft)
    texts = json.loads((built / "texts.json").read_text(encoding="utf-8"))["texts"]
    learnt = [text[: text.index(ANSWER) + len(ANSWER)] for text in texts if ANSWER in text][:2]
    assert learnt
    drafted = accepted = 0
    for prompt in PROMPTS + learnt:
        ids = encode_prompt(smollm2.tokenizer, prompt, chat=prompt in PROMPTS)
        plain = [
            e.token_id for e in generate(smollm2, ids, DecodeConfig(max_new_tokens=16)) if isinstance(e, TokenEvent)
        ]
        for k in range(1, 5):
            config = DecodeConfig(k=k, schedule="constant", lookup=0, max_new_tokens=16)
            events = list(generate(smollm2, ids, config, CrossVocabularyDrafter(draft.model, match)))
            assert [e.token_id for e in events if isinstance(e, TokenEvent) and e.state.kept] == plain, (prompt, k)
            drafted += events[-1].drafted
            accepted += events[-1].accepted
    assert 0 < accepted < drafted  # both outcomes happened, so the identity means something


def test_resumed_training_matches_an_uninterrupted_run(built, tmp_path):
    """Stopping after 40 steps and resuming to 80 gives the weights of the 80 steps in one go; the
    text and the tokenizer are made once and read back."""
    out = tmp_path / "resumed"
    out.mkdir()
    shutil.copy(built / "texts.json", out / "texts.json")
    shutil.copytree(built / "tokenizer", out / "tokenizer")
    assert main(["train-cross-draft", "--out", str(out), "--steps", "80", "--until", "40", *SMALL]) == 0
    assert not (out / "teacher").exists()  # the text was read back: the target wrote nothing
    assert main(["train-cross-draft", "--out", str(out), "--steps", "80", "--until", "40", *SMALL]) == 2
    assert main(["train-cross-draft", "--out", str(out), "--steps", "80", "--resume", *SMALL]) == 0
    a = torch.load(built / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(out / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[name], b[name]) for name in a)
