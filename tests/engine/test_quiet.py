"""Library chatter stays out of SpecDeck's output."""

import json
import os
import subprocess
import sys


def test_jsonl_on_the_builtin_pair_prints_only_events(tmp_path):
    """`specdeck run --jsonl` on the default pair, GGUF conversion included (an empty cache), writes
    only JSON lines on stdout and nothing at all on stderr: no progress bars, no notices."""
    env = {**os.environ, "SPECDECK_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "specdeck.cli.main", "run", "--jsonl", "--max-new-tokens", "8"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=True,
    )
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert events[0]["type"] == "start" and events[-1]["type"] == "summary"
    assert done.stderr == ""
