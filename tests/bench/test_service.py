"""The benchmark harness on tiny models: the files it writes and the greedy identity check."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from tiny import build_pair, write_two_prompts
from transformers import LlamaForCausalLM

from specdeck.bench.prompts import read_prompts, sample_prompts
from specdeck.bench.service import run_and_write
from specdeck.bench.settings import AUTO_K, BenchSettings
from specdeck.bench.sweep import parse_drafters, parse_lookups
from specdeck.bench.tables import PER_PROMPT_COLUMNS, SUMMARY_COLUMNS, SWEEP_COLUMNS
from specdeck.cli.main import main
from specdeck.engine.config import DecodeConfig
from specdeck.engine.drafting.heads import FeatureHead, fingerprint, head_config, save_head
from specdeck.engine.errors import SpecDeckError
from specdeck.engine.forward import row_kernel
from specdeck.engine.forward.linear import packed_available
from specdeck.engine.pair import DrafterKind, PairSpec
from specdeck.engine.session import load_pair, load_pairs


@pytest.fixture(scope="module")
def bench_models(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("models"), "llama", noise=0.3)


@pytest.fixture
def two_prompts(tmp_path):
    return write_two_prompts(tmp_path / "prompts.jsonl")


def specs(target, *drafters):
    """One PairSpec per (drafter kind, model) entry, on `target` on the CPU."""
    return [PairSpec(target, draft, kind, device="cpu") for kind, draft in drafters]


def _read(path):
    with path.open(encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _run(pairs, prompts_path, out, ks=(2,), baselines=("plain", "hf", "hf-assisted"), lookups=(0,)):
    prompts = read_prompts(prompts_path)
    settings = BenchSettings(
        ks=ks, lookups=lookups, baselines=baselines, repeats=1, decode=DecodeConfig(k=max(1, ks[0]), max_new_tokens=12)
    )
    context = {"command": "test", "target": "tiny", "device": "cpu", "dtype": "float32", "prompts": str(prompts_path)}
    run_and_write(pairs, prompts, settings, out, context, plots=False)
    return out


def test_summary_has_a_row_per_method_and_category_and_all(bench_models, two_prompts, tmp_path):
    """summary.csv: the promised columns, one row per method and category plus `all`."""
    target, draft = bench_models
    pair = load_pair(PairSpec(str(target), str(draft), "draft-model", device="cpu"))
    out = _run([pair], two_prompts, tmp_path / "out")
    rows = _read(out / "summary.csv")
    assert tuple(rows[0]) == SUMMARY_COLUMNS
    methods = ["plain", "speculative", "hf", "hf-assisted"]
    assert [(r["method"], r["category"]) for r in rows] == [
        (m, c) for m in methods for c in ("summarization", "qa", "all")
    ]
    assert all(int(r["prompts"]) == (2 if r["category"] == "all" else 1) for r in rows)
    per_prompt = _read(out / "per_prompt.csv")
    assert tuple(per_prompt[0]) == PER_PROMPT_COLUMNS
    assert len(per_prompt) == 2 * len(methods)


def test_greedy_methods_are_identical_to_plain(bench_models, two_prompts, tmp_path):
    """Greedy: SpecDeck speculative and both Hugging Face methods reproduce plain decoding's text."""
    target, draft = bench_models
    pair = load_pair(PairSpec(str(target), str(draft), "draft-model", device="cpu"))
    rows = _read(_run([pair], two_prompts, tmp_path / "out") / "per_prompt.csv")
    assert all(r["identical_to_plain"] == "true" for r in rows), [r["mismatch"] for r in rows]
    speculative = [r for r in rows if r["method"] == "speculative"]
    assert sum(int(r["drafted"]) for r in speculative) > 0


def test_k_sweep_gives_one_row_per_k(bench_models, two_prompts, tmp_path):
    """A K sweep with prompt lookup writes one k_sweep.csv row per K and runs each K for both loops."""
    target, _ = bench_models
    pair = load_pair(PairSpec(str(target), None, "prompt-lookup", device="cpu"))
    out = _run([pair], two_prompts, tmp_path / "out", ks=(1, 2, 3))
    sweep = _read(out / "k_sweep.csv")
    assert tuple(sweep[0]) == SWEEP_COLUMNS
    assert [int(r["k"]) for r in sweep] == [1, 2, 3]
    summary = _read(out / "summary.csv")
    assert sorted(int(r["k"]) for r in summary if r["method"] == "speculative" and r["category"] == "all") == [1, 2, 3]
    assert all(r["identical_to_plain"] == "true" for r in summary)
    assert "Machine and versions" in (out / "report.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("forced", "named"),
    [("dense", "F.linear"), ("packed", "oneDNN's packed product"), ("kernel", "SpecDeck's row kernel")],
)
def test_report_names_the_path_the_products_took(bench_models, two_prompts, tmp_path, monkeypatch, forced, named):
    """The cost curve in report.md says how this run's matrix products ran, and why."""
    missing = {"packed": packed_available, "kernel": row_kernel.unavailable}.get(forced, lambda _: None)
    if missing(torch.zeros(1, 1)):
        pytest.skip(missing(torch.zeros(1, 1)))
    monkeypatch.setenv("SPECDECK_LINEAR", forced)
    target, _ = bench_models
    pair = load_pair(PairSpec(str(target), None, "prompt-lookup", device="cpu"))
    report = (_run([pair], two_prompts, tmp_path / "out", ks=(1,)) / "report.md").read_text(encoding="utf-8")
    assert f"Matrix products in this run: {named} (SPECDECK_LINEAR={forced})" in report


def test_report_says_what_the_auto_schedule_weighed(bench_models, two_prompts, tmp_path):
    """report.md gives the auto schedule's account after its last prompt (its costs, the plain step
    it weighed drafts against, acceptance by depth), so a run that chose plain steps says why; a
    fixed K has no such section."""
    target, draft = bench_models
    pair = load_pair(PairSpec(str(target), str(draft), "draft-model", device="cpu"))
    auto = (_run([pair], two_prompts, tmp_path / "auto", ks=(AUTO_K,), baselines=("plain",)) / "report.md").read_text(
        encoding="utf-8"
    )
    weighed = auto.split("## What the auto schedule weighed (after the last prompt)")[1].split("\n## ")[0]
    assert "a plain step weighed at" in weighed and "drafter acceptance by depth" in weighed
    fixed = (_run([pair], two_prompts, tmp_path / "fixed", ks=(2,), baselines=("plain",)) / "report.md").read_text(
        encoding="utf-8"
    )
    assert "What the auto schedule weighed" not in fixed


def test_bench_command_writes_plots(bench_models, two_prompts, tmp_path, capsys):
    """`specdeck bench` end to end: exit status 0, the CSVs, the report and PNG plots."""
    target, _ = bench_models
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    status = main(
        [
            "bench",
            "--target",
            str(target),
            "--drafter",
            "prompt-lookup",
            "--prompts",
            str(two_prompts),
            "--k",
            "1,2",
            "--repeats",
            "1",
            "--max-new-tokens",
            "8",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )
    assert status == 0
    for name in ("summary.csv", "per_prompt.csv", "k_sweep.csv", "report.md", "speedup_by_category.png", "k_sweep.png"):
        assert (out / name).stat().st_size > 0
    assert (out / "k_sweep.png").read_bytes().startswith(b"\x89PNG")


def test_two_drafters_run_against_the_same_plain_runs(bench_models, two_prompts, tmp_path):
    """Draft model and prompt lookup in one run: one shared target, one plain run per prompt, speculative
    and hf-assisted rows for each drafter, all with plain decoding's greedy text."""
    target, draft = bench_models
    pairs = load_pairs(specs(str(target), ("draft-model", str(draft)), ("prompt-lookup", None)))
    assert pairs[0].target is pairs[1].target
    drafters = {f"draft {draft}", "prompt lookup"}
    out = _run(pairs, two_prompts, tmp_path / "out")
    rows = _read(out / "per_prompt.csv")
    assert all(r["identical_to_plain"] == "true" for r in rows), [r["mismatch"] for r in rows]
    by_method = {m: [r for r in rows if r["method"] == m] for m in ("plain", "hf", "speculative", "hf-assisted")}
    assert len(by_method["plain"]) == len(by_method["hf"]) == 2
    assert {r["drafter"] for r in by_method["plain"] + by_method["hf"]} == {""}
    for method in ("speculative", "hf-assisted"):
        assert sorted(r["drafter"] for r in by_method[method]) == sorted(list(drafters) * 2)
    assert all(int(r["drafted"]) > 0 for r in by_method["speculative"])
    assert {r["drafter"] for r in _read(out / "k_sweep.csv")} == drafters
    assert f"drafters draft {draft}; prompt lookup" in (out / "report.md").read_text(encoding="utf-8")


def test_feature_head_beside_a_draft_model_skips_only_its_hf_assisted(bench_models, two_prompts, tmp_path):
    """A feature head and a draft model in one run: hf-assisted runs for the draft model alone (with a
    note), and both speculative methods keep greedy text exact."""
    target, draft = bench_models
    target_model = LlamaForCausalLM.from_pretrained(target)
    weight = target_model.get_output_embeddings().weight
    torch.manual_seed(0)
    save_head(
        FeatureHead(head_config(target_model.config)), tmp_path / "head", weight.shape[0], "tiny", fingerprint(weight)
    )
    pairs = load_pairs(specs(str(target), ("draft-model", str(draft)), ("feature-head", str(tmp_path / "head"))))
    out = _run(pairs, two_prompts, tmp_path / "out", baselines=("plain", "hf-assisted"))
    summary = [r for r in _read(out / "summary.csv") if r["category"] == "all"]
    assert [(r["method"], r["drafter"]) for r in summary] == [
        ("plain", ""),
        ("speculative", f"draft {draft}"),
        ("speculative", f"feature head {tmp_path / 'head'}"),
        ("hf-assisted", f"draft {draft}"),
    ]
    assert all(r["identical_to_plain"] == "true" for r in summary)
    report = (out / "report.md").read_text(encoding="utf-8")
    assert f"hf-assisted left out for feature head {tmp_path / 'head'}" in report


def test_lookup_sweep_times_model_drafters_with_and_without_it(bench_models, two_prompts, tmp_path):
    """--lookup 0,2: the draft model runs without and with prompt lookup first, named apart in every
    file, both with plain decoding's greedy text; prompt lookup itself runs once."""
    target, draft = bench_models
    pairs = load_pairs(specs(str(target), ("draft-model", str(draft)), ("prompt-lookup", None)))
    out = _run(pairs, two_prompts, tmp_path / "out", baselines=("plain",), lookups=(0, 2))
    summary = [r for r in _read(out / "summary.csv") if r["category"] == "all"]
    assert [(r["method"], r["drafter"]) for r in summary] == [
        ("plain", ""),
        ("speculative", f"draft {draft}"),
        ("speculative", f"draft {draft} + prompt lookup 2"),
        ("speculative", "prompt lookup"),
    ]
    assert all(r["identical_to_plain"] == "true" for r in summary)
    assert [r["drafter"] for r in _read(out / "k_sweep.csv")] == [r["drafter"] for r in summary[1:]]
    with pytest.raises(SpecDeckError, match="--lookup takes"):
        parse_lookups("2,-1")


def test_bench_command_takes_several_drafters(bench_models, two_prompts, tmp_path):
    """`specdeck bench --drafters draft-model:D,prompt-lookup` with a K sweep: both drafters in the
    summary, one k_sweep row per drafter and K, and the sweep plot."""
    target, draft = bench_models
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    status = main(
        [
            "bench",
            "--target",
            str(target),
            "--drafters",
            f"draft-model:{draft},prompt-lookup",
            "--prompts",
            str(two_prompts),
            "--k",
            "1,2",
            "--baselines",
            "plain",
            "--repeats",
            "1",
            "--max-new-tokens",
            "8",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )
    assert status == 0
    sweep = _read(out / "k_sweep.csv")
    with_lookup = f"draft {draft} + prompt lookup {DecodeConfig.lookup}"  # the default --lookup
    assert [(r["drafter"], r["k"]) for r in sweep] == [
        (with_lookup, "1"),
        (with_lookup, "2"),
        ("prompt lookup", "1"),
        ("prompt lookup", "2"),
    ]
    assert (out / "k_sweep.png").read_bytes().startswith(b"\x89PNG")


def test_bad_drafters_entries_get_a_clear_error(bench_models, capsys):
    """An unknown kind, prompt lookup with a model, an empty list, a drafter named twice, a model-less
    feature head for a target without a built-in one, or --drafters with --drafter: one clear message."""
    target, draft = bench_models
    assert parse_drafters("draft-model, feature-head:heads/h1") == [("draft-model", None), ("feature-head", "heads/h1")]
    with pytest.raises(SpecDeckError, match="Unknown drafter 'eagle'"):
        parse_drafters("draft-model,eagle")
    with pytest.raises(SpecDeckError, match="prompt lookup drafter needs no model"):
        parse_drafters("prompt-lookup:some-model")
    with pytest.raises(SpecDeckError, match="names no drafter"):
        parse_drafters(" , ")
    with pytest.raises(SpecDeckError, match="named twice"):
        load_pairs(specs(str(target), ("draft-model", str(draft)), ("draft-model", str(draft))))
    with pytest.raises(SpecDeckError, match="feature-head:MODEL"):
        load_pairs(specs(str(target), ("prompt-lookup", None), ("feature-head", None)))
    assert main(["bench", "--drafters", "prompt-lookup", "--drafter", "draft-model", "--out", "unused"]) == 2
    assert "not both" in capsys.readouterr().err


def test_prompt_files_are_recognised_from_their_fields(tmp_path):
    """Spec-Bench takes turns[0] with its category, HumanEval is raw completion, text is one prompt per line."""
    humaneval = tmp_path / "he.jsonl"
    humaneval.write_text(json.dumps({"task_id": "HumanEval/0", "prompt": "def f():\n"}) + "\n", encoding="utf-8")
    [prompt] = read_prompts(humaneval)
    assert (prompt.category, prompt.chat, prompt.text) == ("humaneval", False, "def f():\n")
    text = tmp_path / "lines.txt"
    text.write_text("first prompt\n\nsecond prompt\n", encoding="utf-8")
    assert [p.text for p in read_prompts(text)] == ["first prompt", "second prompt"]
    sample = read_prompts(sample_prompts(), categories=["rag", "summarization"], limit=2)
    assert [p.category for p in sample].count("rag") == 2 and len(sample) == 4
    assert sample[0].text and sample[0].chat


def test_bad_prompt_files_get_a_clear_error(tmp_path):
    """A record of neither format, an unknown category, or a stray plain line among JSON records
    (which would be timed as a prompt) is refused with a message."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "no turns"}\n', encoding="utf-8")
    with pytest.raises(SpecDeckError, match="turns"):
        read_prompts(bad)
    with pytest.raises(SpecDeckError, match="category"):
        read_prompts(sample_prompts(), categories=["poetry"])
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"question_id": 1, "category": "x", "turns": ["hi"]}\nnot json at all\n', encoding="utf-8")
    with pytest.raises(SpecDeckError, match="line 2: not a JSON record, while the file's first prompt is one"):
        read_prompts(mixed)


@pytest.mark.parametrize(
    "turns, got",
    [
        ({"text": "hi"}, "got a dict"),
        (7, "got a number"),
        ([], "got an empty list"),
        ([3], "first turn is a number"),
    ],
)
def test_prompt_records_with_wrong_turns_name_file_line_and_field(tmp_path, turns, got):
    """A `turns` that holds no prompt text is refused with the file, the line and the field."""
    bad = tmp_path / "bad.jsonl"
    good = json.dumps({"question_id": 1, "turns": ["fine"]})
    bad.write_text(good + "\n" + json.dumps({"question_id": 2, "turns": turns}) + "\n", encoding="utf-8")
    with pytest.raises(SpecDeckError, match="turns") as error:
        read_prompts(bad)
    assert f"{bad}, line 2" in str(error.value) and got in str(error.value)


def test_prompt_files_with_a_byte_order_mark_read_as_text(tmp_path):
    """A UTF-8 file saved with a BOM (as Windows editors do) reads like one without."""
    path = tmp_path / "bom.jsonl"
    path.write_bytes("\ufeff".encode() + json.dumps({"question_id": 1, "turns": ["Grüß dich"]}).encode() + b"\n")
    [prompt] = read_prompts(path)
    assert prompt.text == "Grüß dich" and prompt.chat


def _bench_argv(target, prompts, out, *extra):
    return [
        "bench",
        "--target",
        str(target),
        "--drafter",
        "prompt-lookup",
        "--prompts",
        str(prompts),
        "--k",
        "1",
        "--repeats",
        "1",
        "--max-new-tokens",
        "8",
        "--baselines",
        "plain",
        "--device",
        "cpu",
        "--out",
        str(out),
        *extra,
    ]


def test_unwritable_out_is_refused_before_models_load(two_prompts, tmp_path, capsys):
    """An --out below a file is refused naming the folder and why, before the (missing) model is looked at."""
    blocker = tmp_path / "file"
    blocker.write_text("x", encoding="utf-8")
    status = main(_bench_argv(tmp_path / "no-such-model", two_prompts, blocker / "out"))
    err = capsys.readouterr().err
    assert status == 2 and f"Cannot write results to {blocker / 'out'}: {blocker} is a file" in err
    assert "No model at" not in err


def test_out_holding_other_files_keeps_them(bench_models, two_prompts, tmp_path, capsys):
    """Results go into --out beside the user's own files with --overwrite (refused without), and
    those files stay as they were."""
    target, _ = bench_models
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me", encoding="utf-8")
    assert main(_bench_argv(target, two_prompts, out)) == 2
    assert main(_bench_argv(target, two_prompts, out, "--overwrite")) == 0
    assert (out / "notes.txt").read_text(encoding="utf-8") == "keep me" and (out / "summary.csv").is_file()


def test_no_plots_run_names_only_what_it_wrote(bench_models, two_prompts, tmp_path, capsys):
    """--no-plots writes no PNG and does not claim plots; a rerun replaces the files."""
    target, _ = bench_models
    out = tmp_path / "out"
    assert main(_bench_argv(target, two_prompts, out, "--no-plots")) == 0
    assert main(_bench_argv(target, two_prompts, out, "--no-plots")) == 0
    wrote = capsys.readouterr().out.splitlines()[-1]
    assert wrote == f"Wrote {out}/: k_sweep.csv, per_prompt.csv, report.md, summary.csv."
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "prompts.jsonl"]
    assert not list(out.glob("*.png"))


def test_round_kinds_account_for_every_round_and_kept_token(bench_models, two_prompts, tmp_path):
    """report.md's table of round kinds (plain steps, model drafts, copies by source and match)
    covers every round of the speculative runs and every token they kept."""
    target, draft = bench_models
    pair = load_pair(PairSpec(str(target), str(draft), "draft-model", device="cpu"))
    out = _run([pair], two_prompts, tmp_path / "out", baselines=("plain",), lookups=(2,))
    report = (out / "report.md").read_text(encoding="utf-8")
    table = report.split("## What each kind of round kept and cost", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|") for line in table.splitlines() if line.startswith("| speculative")]
    kinds = {cells[2].strip(): (int(cells[3]), float(cells[5])) for cells in rows}
    speculative = [r for r in _read(out / "per_prompt.csv") if r["method"] == "speculative"]
    assert sum(rounds for rounds, _ in kinds.values()) == sum(int(r["rounds"]) for r in speculative)
    kept = sum(rounds * per_round for rounds, per_round in kinds.values())
    rounding = 0.005 * sum(rounds for rounds, _ in kinds.values())  # kept per round is shown to 2 decimals
    assert kept == pytest.approx(sum(int(r["new_tokens"]) for r in speculative), abs=rounding)
    assert "model drafts" in kinds and all(
        kind in ("plain step", "model drafts") or kind.startswith("copy of this request, ") for kind in kinds
    )


def test_round_kind_names_where_a_copy_came_from():
    from specdeck.bench.methods import round_kind
    from specdeck.engine.events import RoundEvent

    def event(drafted, **kwargs):
        return RoundEvent(1, drafted, 0, 0.1, 1.0, 1, 0.01, **kwargs)

    assert round_kind(event(0)) == "plain step"
    assert round_kind(event(2)) == "model drafts"
    assert round_kind(event(3, source="prompt", match_length=2)) == "copy of this request, match 2"
    assert round_kind(event(3, source="texts", match_length=12)) == "copy of earlier texts, match 9-15"
    assert round_kind(event(3, source="session", match_length=40)) == "copy of earlier texts, match 16+"
    assert round_kind(event(1, source="prompt")) == "copy of this request, match 0"


@pytest.mark.serial
def test_busy_runs_again_beside_spinning_processes(bench_models, two_prompts, tmp_path, capsys):
    """--busy 1 runs every method again beside a spinning process of its own, into OUT/busy-1/,
    puts each method's quiet and busy tok/s and speedups side by side, leaves no spinner behind,
    and a rerun into the same folder is not refused."""
    target, _ = bench_models
    out = tmp_path / "out"
    before = _spinners()
    assert main(_bench_argv(target, two_prompts, out, "--no-plots", "--busy", "1")) == 0
    assert _spinners() == before
    table = (out / "quiet-and-busy.md").read_text(encoding="utf-8")
    assert "beside 1 spinning process" in table
    quiet = {r["method"]: r for r in _read(out / "summary.csv") if r["category"] == "all" and r["turn"] == "all"}
    busy = {
        r["method"]: r for r in _read(out / "busy-1" / "summary.csv") if r["category"] == "all" and r["turn"] == "all"
    }
    assert set(quiet) == set(busy) == {"plain", "speculative"}
    for method in quiet:
        row = f"| {method} | {quiet[method]['k']} | {quiet[method]['drafter']} | all | "
        row += f"{float(quiet[method]['tokens_per_s']):.1f} | {float(busy[method]['tokens_per_s']):.1f} |"
        assert row in table, (row, table)
    assert "spinning processes of the benchmark's own" in (out / "busy-1" / "report.md").read_text(encoding="utf-8")
    assert main(_bench_argv(target, two_prompts, out, "--no-plots")) == 0
    assert capsys.readouterr().err.count("holds files") == 0


def test_busy_is_refused_where_it_would_leave_no_core(two_prompts, tmp_path, capsys, monkeypatch):
    """--busy takes fewer spinning processes than the machine has cores, and says so otherwise."""
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert main(_bench_argv(tmp_path / "no-model", two_prompts, tmp_path / "out", "--busy", "2")) == 2
    assert "--busy must be from 0 to 1" in capsys.readouterr().err


def _spinners() -> int:
    import subprocess

    found = subprocess.run(["pgrep", "-f", "while True: pass"], capture_output=True, text=True).stdout
    return len(found.split())


def test_bench_times_layer_skip_beside_hugging_faces_early_exit(tiny_llama, tmp_path, monkeypatch):
    """In the bench the drafter's rows name its layers and agreement, and Hugging Face's
    `assistant_early_exit` with the same layers runs beside it, drafting; every text is plain text."""

    monkeypatch.setenv("SPECDECK_CACHE", str(tmp_path))
    target, _ = tiny_llama
    pair = load_pair(PairSpec(target.name, drafter=DrafterKind.LAYER_SKIP, device="cpu", dtype="float32"))
    out = _run(
        [pair], write_two_prompts(tmp_path / "prompts.jsonl"), tmp_path / "out", baselines=("plain", "hf-assisted")
    )
    rows = _read(out / "per_prompt.csv")
    assert all(r["identical_to_plain"] == "true" for r in rows), [r["mismatch"] for r in rows]
    drafting = [r for r in rows if r["method"] in ("speculative", "hf-assisted")]
    assert len(drafting) == 4 and all(int(r["drafted"]) > 0 for r in drafting)
    assert all(r["drafter"].startswith("layer skip (first 1 of 2 layers, agreement") for r in drafting)
    # the target's own early-exit drafts are not counted as its verifies
    assert all(float(r["mean_accepted_length"]) >= 1 for r in drafting)
