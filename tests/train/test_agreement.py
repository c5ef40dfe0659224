"""`specdeck head-agreement`: a head's first drafts scored on the target's greedy answers, apart
where prompt lookup could copy."""

from __future__ import annotations

import json

import pytest
import torch
from tiny import ON_CPU, build_pair

from specdeck.cli.main import main
from specdeck.engine.drafting.heads import FeatureHead, LoadedHead, fingerprint, head_config, save_head
from specdeck.engine.loading.models import encode_prompt, load_model
from specdeck.train.agreement import greedy_answer, head_tally


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("agreement")
    target_dir, _ = build_pair(root, "llama")
    target = load_model(str(target_dir), ON_CPU)
    torch.manual_seed(3)
    head = FeatureHead(head_config(target.model.config)).eval()
    weight = target.model.get_output_embeddings().weight
    save_head(head, root / "head", weight.shape[0], str(target_dir), fingerprint(weight))
    return root, target_dir, target, head


def test_each_answer_token_is_scored_against_the_draft_made_from_the_token_before(pair):
    """Token t of the answer is matched with the head's prediction from the target's state at t - 2
    and the embedding of token t - 1, as the drafter makes it, checked against the target's own
    forward over the whole text; copyable tokens are those after a pair of tokens seen before."""
    _, _, target, head = pair
    ids, first = greedy_answer(target, encode_prompt(target.tokenizer, "the cat sat", chat=False), 40)
    # the answer's two most frequent tokens as the head's output tokens, so that a random head agrees at times
    allowed = torch.bincount(ids[first + 1 :].long()).topk(2).indices
    tally = head_tally(target, LoadedHead("h", head, allowed), ids, first)

    row = ids[None].long()
    with torch.no_grad():
        out = target.torch_model(input_ids=row, output_hidden_states=True)
        final = out.hidden_states[-1][0]
        embeds = target.torch_model.get_input_embeddings()(row)[0]
        predicted = head(final[None, :-1], embeds[None, 1:])[0]
        drafts = allowed[target.torch_model.lm_head(predicted)[:, allowed].argmax(-1)]  # drafts[j]: token j + 2
    truth = out.logits[0].argmax(-1)  # truth[j]: the target's choice after token j
    tokens = list(range(first + 2, len(ids) + 1))  # the answer after its first token, and the next one
    agreed = sum(int(drafts[t - 2] == truth[t - 1]) for t in tokens)
    listed = ids.tolist()
    copyable = sum(any(listed[i - 1 : i + 1] == listed[t - 2 : t] for i in range(1, t - 1)) for t in tokens)
    covered = sum(int(truth[t - 1] in allowed) for t in tokens)
    assert (tally.tokens, tally.agreed, tally.copyable, tally.covered) == (len(tokens), agreed, copyable, covered)
    assert tally.agreed > 0 and tally.copyable > 0 and tally.covered < tally.tokens  # it counts something
    copied = [t for t in tokens if any(listed[i - 1 : i + 1] == listed[t - 2 : t] for i in range(1, t - 1))]
    assert tally.copyable_agreed == sum(int(drafts[t - 2] == truth[t - 1]) for t in copied)


def test_the_command_prints_a_row_per_head_and_category(pair, tmp_path, capsys):
    root, target_dir, _, _ = pair
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "\n".join(json.dumps({"category": c, "turns": [t]}) for c, t in [("a", "the cat"), ("b", "a dog ran")])
    )
    head = str(root / "head")
    assert main(["head-agreement", "--heads", f"{head},{head}", "--target", str(target_dir),
                 "--prompts", str(prompts), "--max-new-tokens", "8"]) == 0  # fmt: skip
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith(f"| {head}")]
    assert [row[1] for row in rows] == ["a", "b", "all"] * 2
    assert int(rows[2][2]) == int(rows[0][2]) + int(rows[1][2]) > 0
    assert main(["head-agreement", "--heads", str(target_dir), "--target", str(target_dir),
                 "--prompts", str(prompts)]) == 2  # fmt: skip
    assert "not a feature head" in capsys.readouterr().err
