"""The options `specdeck run` and `specdeck bench` share: which pair to load (a `PairSpec`) and how
to decode (a `DecodeConfig`). Every default is the dataclass's own, so the command line, the window
and the benchmark start from the same values."""

from __future__ import annotations

import argparse

from specdeck.engine.config import SCHEDULES, SUFFIX_SCOPES, DecodeConfig
from specdeck.engine.drafting.kinds import DrafterKind, kinds_reading
from specdeck.engine.loading.registry import BACKENDS
from specdeck.engine.pair_spec import PairSpec
from specdeck.engine.remote.remote_http import API_KEY_VARIABLE


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = PairSpec()
    kinds = "; ".join(f"{kind}: {kind.description}" for kind in DrafterKind)
    parser.add_argument(
        "--target",
        default=defaults.target,
        help="target model: alias, Hugging Face id, folder or .gguf (default %(default)s); or a "
        "server's OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1 (docs/remote.md; its "
        f"API key, if any, from the environment variable {API_KEY_VARIABLE})",
    )
    parser.add_argument(
        "--target-model",
        default=defaults.target_model,
        help="the model's name on the server --target names (its /v1/models lists them)",
    )
    parser.add_argument(
        "--tokenizer",
        default=defaults.tokenizer,
        help="a served target's tokenizer: a model whose tokenizer is the served one's (default: "
        f"the draft model's, else {defaults.target})",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=defaults.timeout_s,
        help="seconds a request to the server may take before the session stops (default %(default)g)",
    )
    parser.add_argument(
        "--draft",
        default=defaults.draft,
        help="draft model (any tokenizer: one of its own drafts through the text) or feature head "
        "(trained for the target)",
    )
    parser.add_argument(
        "--drafter",
        choices=[kind.value for kind in DrafterKind],
        default=defaults.drafter,
        help=f"what proposes tokens ({kinds}; default: what --draft names, else the default pair's)",
    )
    parser.add_argument(
        "--draft-layers",
        type=int,
        default=defaults.draft_layers,
        metavar="N",
        help=f"the target's first N layers draft ({kinds_reading('--draft-layers')}; default: the count "
        "with the best measured agreement and cost, cached per model)",
    )
    parser.add_argument("--device", default=defaults.device, help="auto, cpu, cuda, mps")
    parser.add_argument("--dtype", default=defaults.dtype, help="auto, float32, bfloat16, float16")
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default=defaults.backend,
        help="what runs a .gguf model: llama.cpp (its quantized weights as they are) or torch (the "
        "file's blocks on the row kernel where it reads them, else dequantized); auto: torch where the "
        "row kernel reads the file, else the faster of the two on this machine",
    )
    parser.add_argument("--trust-remote-code", action="store_true", help="run model code from the model's files")


def pair_spec(args: argparse.Namespace) -> PairSpec:
    """The pair that `add_model_arguments`' options name; `PairSpec.arguments()` writes them back."""
    return PairSpec(
        args.target,
        args.draft,
        args.drafter,
        args.device,
        args.dtype,
        args.trust_remote_code,
        args.backend,
        target_model=args.target_model,
        tokenizer=args.tokenizer,
        timeout_s=args.timeout,
        draft_layers=args.draft_layers,
    )


def add_decode_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = DecodeConfig()
    parser.add_argument(
        "--k",
        type=int,
        default=defaults.k,
        help="draft tokens per round (constant schedule; where the heuristic one starts)",
    )
    parser.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default=defaults.schedule,
        help="auto: each round's K (0..--max-k) and copy length chosen from this machine's "
        "measured costs and the session's acceptance",
    )
    parser.add_argument("--max-k", type=int, default=defaults.max_k, help="the longest draft the schedule may choose")
    parser.add_argument(
        "--confidence",
        type=float,
        default=defaults.confidence_threshold,
        help="stop drafting below this top probability",
    )
    parser.add_argument(
        "--lookup",
        type=int,
        default=defaults.lookup,
        help="where the text repeats, copy up to this many tokens by prompt lookup before asking the drafter (0: off)",
    )
    parser.add_argument(
        "--suffix-scope",
        choices=SUFFIX_SCOPES,
        default=defaults.suffix_scope,
        help=f"what the drafters that copy from earlier texts ({kinds_reading('--suffix-scope')}) copy "
        "from: prompt (this request's text), session "
        "(also earlier answers since SpecDeck started and the target's own texts, made by specdeck "
        "suffix-texts) or all (also past sessions', kept in "
        "the cache folder; specdeck cache --clear forgets them) (default %(default)s)",
    )
    parser.add_argument("--temperature", type=float, default=defaults.temperature, help="0 is greedy")
    parser.add_argument("--top-k", type=int, default=defaults.top_k)
    parser.add_argument("--top-p", type=float, default=defaults.top_p)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
    parser.add_argument("--stop", action="append", default=list(defaults.stop_strings), help="stop string (repeatable)")
    parser.add_argument("--no-chat", action="store_true", help="raw completion: no chat template")
    parser.add_argument(
        "--truncate-prompt",
        action="store_true",
        help="a prompt too long for the model's context: keep its last part instead of refusing it",
    )


def decode_config(args: argparse.Namespace) -> DecodeConfig:
    """The `DecodeConfig` that `add_decode_arguments`' options describe; raises SpecDeckError."""
    return DecodeConfig(
        k=args.k,
        schedule=args.schedule,
        max_k=args.max_k,
        confidence_threshold=args.confidence,
        lookup=args.lookup,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        stop_strings=tuple(args.stop),
        truncate_prompt=args.truncate_prompt,
        suffix_scope=args.suffix_scope,
    )
