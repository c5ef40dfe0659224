"""`specdeck head-data`: the target's states over given text and its own answers, in shards a
background job grows and resumes, and a head that fuses lower layers trained on them."""

from __future__ import annotations

import fnmatch
import json

import pytest
import torch
from tiny import build_pair

from specdeck.cli.main import main
from specdeck.engine.config import DecodeConfig
from specdeck.engine.events import TokenEvent
from specdeck.engine.loading.models import load_model
from specdeck.engine.pair import PairSpec
from specdeck.engine.session import load_pair, run_session
from specdeck.train import STORE_STATE, forcing
from specdeck.train.forcing import load_store
from specdeck.train.texts import TEXT_SOURCES, Exchange

EXCHANGES = [
    Exchange("python-docs", f"Explain item {i}.", f"Item {i} reads the file and returns a list of lines. " * 12)
    for i in range(24)
]
SMALL = [
    "--layers",
    "1",
    "--answer-every",
    "2",
    "--answer-batch",
    "3",
    "--answer-tokens",
    "12",
    "--shard-sequences",
    "8",
    "--threads",
    "1",
]


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    root = tmp_path_factory.mktemp("head-data")
    target, _ = build_pair(root, "llama")
    out = root / "data"
    with pytest.MonkeyPatch.context() as patch:  # the free text on disk is large: a few passages stand in
        patch.setattr(forcing, "existing_exchanges", lambda seed: EXCHANGES)
        patch.setattr(forcing, "lexicon_requests", lambda limit, seed: ["Tell me about a thing."])
        assert main(["head-data", "--target", str(target), "--out", str(out), "--positions", "1", *SMALL]) == 0
        first = {path.name: path.stat().st_mtime_ns for path in out.glob("shard-*.pt")}
        assert main(["head-data", "--target", str(target), "--out", str(out), "--positions", "100000", *SMALL]) == 0
    return target, out, first


def test_the_store_holds_only_the_names_its_folder_guard_knows(grown):
    """Every name `head-data` leaves in its folder is in `specdeck.train.STORE_STATE`, so a rerun
    that grows the store never meets its own files as a user's."""
    names = [path.name for path in grown[1].iterdir() if not path.name.startswith(".")]
    assert names and all(any(fnmatch.fnmatchcase(name, p) for p in STORE_STATE) for name in names), names


def test_a_resumed_job_keeps_its_shards_and_adds_the_rest(grown):
    """The first call stops after one shard; the second keeps it as it was and goes on until the
    given text is used up, with the target's own answers every second shard."""
    _, out, first = grown
    assert list(first) == ["shard-00000.pt"]
    assert (out / "shard-00000.pt").stat().st_mtime_ns == first["shard-00000.pt"]
    manifest = json.loads((out / "manifest.json").read_text())
    shards = manifest["shards"]
    assert sorted(shards) == [f"shard-{n:05d}.pt" for n in range(6)]  # given text and answers in turn
    assert set(shards["shard-00001.pt"]["sources"]) == {"target-answers"}
    assert set(shards["shard-00002.pt"]["sources"]) == {"python-docs"}
    assert manifest["sources"] == TEXT_SOURCES


def test_stored_states_are_the_targets(grown):
    """Each position stores the residual stream after the chosen layer and the final state, as the
    target computes them alone (bfloat16 rounding aside); every 20th sequence is held out."""
    target_folder, out, _ = grown
    store = load_store(out)
    target = load_model(str(target_folder))
    assert store.layers == (1,)
    for r in (0, 9, len(store.ids) - 1):
        with torch.inference_mode():
            hidden = target.model.model(store.ids[r][None].long(), output_hidden_states=True).hidden_states
        expected = torch.stack([hidden[1][0], hidden[-1][0]], dim=1)
        torch.testing.assert_close(store.states[r].float(), expected, rtol=2e-2, atol=2e-2)
    assert store.held_out[0] and not store.held_out[1] and store.held_out[8]  # sequence 0 of each shard


def test_other_settings_are_refused(grown, capsys):
    """Shards made with other layers cannot be mixed in: growing the folder with them is refused."""
    target, out, _ = grown
    assert main(["head-data", "--target", str(target), "--out", str(out), *SMALL[2:], "--layers", "1,2"]) == 2
    assert "made with other settings" in capsys.readouterr().err


def test_head_fusing_lower_layers_trains_on_the_data_and_keeps_greedy_exact(grown, tmp_path):
    target, out, _ = grown
    run = tmp_path / "run"
    assert (
        main(
            [
                "train-head",
                "--target",
                str(target),
                "--out",
                str(run),
                "--data",
                str(out),
                "--feature-layers",
                "1",
                "--unroll",
                "3",
                "--feature-weight",
                "0",
                "--steps",
                "4",
                "--batch",
                "2",
                "--eval-every",
                "2",
                "--output-vocab",
                "150",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    config = json.loads((run / "head" / "config.json").read_text())
    assert config["feature_layers"] == [1]
    pair = load_pair(PairSpec(str(target), str(run / "head"), None, device="cpu"))
    kept = [
        [
            e.token_id
            for e in run_session(pair, "Item 3 reads", config_, chat=False)
            if isinstance(e, TokenEvent) and e.state.kept
        ]
        for config_ in (DecodeConfig(k=3, schedule="constant", max_new_tokens=30), DecodeConfig(max_new_tokens=30))
    ]
    assert kept[0] == kept[1]
