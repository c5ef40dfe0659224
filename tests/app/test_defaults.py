"""One source of defaults: a fresh window, `specdeck run` and `specdeck bench` without options load
the same pair, decode with the same settings and benchmark the same way."""

from specdeck.app.bench_tab import BenchmarkTab
from specdeck.app.model_panel import ModelPanel
from specdeck.app.panels import DecodingPanel
from specdeck.bench.runner import BenchSettings
from specdeck.cli.bench import bench_settings, bench_specs
from specdeck.cli.main import build_parser
from specdeck.cli.options import decode_config, pair_spec
from specdeck.engine.config import DecodeConfig
from specdeck.engine.loading.registry import DEFAULT_DRAFT, DEFAULT_HEAD, LAST_STATE_HEAD
from specdeck.engine.pair import DrafterKind, PairSpec


def test_window_command_line_and_benchmark_share_their_defaults(qtbot):
    """The model panel, the decoding panel and the Benchmark tab start from the values the command
    line takes when given no options, which are the dataclasses' own."""
    parser = build_parser()
    run = parser.parse_args(["run"])
    bench = parser.parse_args(["bench", "--out", "results"])
    models, decoding, benchmark = ModelPanel(), DecodingPanel(), BenchmarkTab()
    for widget in (models, decoding, benchmark):
        qtbot.addWidget(widget)

    pair = models.spec()  # no drafter chosen: the loaded target's default (`specdeck.engine.pair.default_drafter`)
    assert pair == pair_spec(run) == pair_spec(bench) == PairSpec()
    assert pair.resolved().drafter is DrafterKind.FEATURE_HEAD and pair.resolved().draft
    assert pair.resolved("llama.cpp") == pair.with_drafter(DrafterKind.SUFFIX, None)
    assert decoding.config() == decode_config(run) == DecodeConfig()
    assert decoding.chat.isChecked() and not run.no_chat
    assert benchmark.settings() == bench_settings(bench) == BenchSettings()
    assert benchmark.other_drafters(pair) == [] and bench_specs(bench) == [pair_spec(bench)]


def test_a_drafter_the_user_picks_is_kept_whatever_runs_the_target(qtbot):
    """Left as it opens, the panel names no drafter, so the built-in target gets the one that pays
    on what runs it; a drafter the user picks, even the one shown, is the pair's on every backend."""
    models = ModelPanel()
    qtbot.addWidget(models)
    assert models.spec().drafter is None
    models.drafter.activated.emit(models.drafter.currentIndex())  # the user picks the feature head shown
    picked = models.spec()
    assert picked.drafter is DrafterKind.FEATURE_HEAD
    assert picked.resolved("llama.cpp").drafter is DrafterKind.FEATURE_HEAD


def test_the_built_in_head_on_llama_cpp_is_the_one_on_the_last_state():
    """The default head reads lower layers, which llama.cpp does not hand out: there the built-in
    head, chosen by the kind or named, is the one on the last state alone; on torch, the default; a
    head of one's own is kept on both, and a draft model is never swapped for a head."""
    for spec in (PairSpec(drafter="feature-head"), PairSpec(draft=DEFAULT_HEAD), PairSpec(drafter="hybrid")):
        assert spec.resolved("llama.cpp").draft == LAST_STATE_HEAD
        assert spec.resolved("torch").draft == spec.resolved().draft == DEFAULT_HEAD
    assert PairSpec(draft="my-heads/head", drafter="feature-head").resolved("llama.cpp").draft == "my-heads/head"
    assert PairSpec(drafter="draft-model").resolved("llama.cpp").draft == DEFAULT_DRAFT


def test_benchmark_tab_writes_the_command_that_rebuilds_its_pair_and_settings(qtbot):
    """The Benchmark tab's `specdeck bench` line, parsed by the command line, names the panel's pair,
    the other drafters and the tab's settings."""
    benchmark = BenchmarkTab()
    qtbot.addWidget(benchmark)
    benchmark.ks.setText("auto,2")
    benchmark.lookups.setText("0,3")
    benchmark.drafters.setText("prompt-lookup,suffix")
    benchmark.repeats.setValue(2)
    pair = PairSpec("models/target", "models/draft", DrafterKind.DRAFT_MODEL, "cpu", "float32", True)
    argv = benchmark.command_line(pair).split()
    assert argv[:2] == ["specdeck", "bench"]
    args = build_parser().parse_args(argv[1:])
    assert bench_specs(args) == [pair, *benchmark.other_drafters(pair)]
    assert [spec.drafter for spec in bench_specs(args)] == [
        DrafterKind.DRAFT_MODEL,
        DrafterKind.PROMPT_LOOKUP,
        DrafterKind.SUFFIX,
    ]
    assert bench_settings(args) == benchmark.settings()


def test_model_panel_names_a_served_target_as_the_command_line_does(qtbot):
    """A server's address in Target and a model name in 'Served as' make the pair that
    `--target URL --target-model NAME` makes, and its arguments say so."""
    models = ModelPanel()
    qtbot.addWidget(models)
    models.target.set_value("http://127.0.0.1:8000/v1")
    models.served_model.setText("llama-70b")
    models.drafter.setCurrentIndex(list(DrafterKind).index(DrafterKind.PROMPT_LOOKUP))
    run = build_parser().parse_args(
        ["run", "--target", "http://127.0.0.1:8000/v1", "--target-model", "llama-70b", "--drafter", "prompt-lookup"]
    )
    spec = models.spec()
    assert spec == pair_spec(run) and spec.remote
    assert build_parser().parse_args(["run", *spec.arguments()]) == run


def test_another_target_left_with_the_opening_pair_gets_its_own_default(qtbot, tmp_path):
    """The panel opens on the built-in target's pair: with another model as the target and the
    drafter not picked, the pair names no drafter and that target's default (prompt lookup) loads;
    the feature head the user picks is kept."""
    models = ModelPanel()
    qtbot.addWidget(models)
    models.target.set_value(str(tmp_path / "my-model"))
    assert models.spec().drafter is None
    assert models.spec().resolved().drafter is DrafterKind.PROMPT_LOOKUP
    models.drafter.activated.emit(models.drafter.currentIndex())
    assert models.spec().drafter is DrafterKind.FEATURE_HEAD
