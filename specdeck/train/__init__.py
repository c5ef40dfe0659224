"""Training drafters for a target: the draft model (`specdeck train-draft`), the feature head
(`train-head`, `distill-head`, `head-data`), the own-tokenizer draft (`train-cross-draft`), and the
texts and teacher data they learn from."""

# What a training run writes in its --out folder, as glob patterns: the teacher's shards, the
# head's features, the plan and the target's own answers, the checkpoint, the curve, and the
# exported drafter. A folder holding anything else is a user's (`specdeck.engine.atomic.claim_folder`).
RUN_STATE = (
    "teacher",
    "features",
    "plan.pt",
    "answers.pt",
    "texts.json",
    "tokenizer",
    "checkpoint.pt",
    "curve.json",
    "head",
    "draft",
)
# What `specdeck head-data` grows in its folder: the store's manifest, its plan and its shards
STORE_STATE = ("manifest.json", "plan.pt", "shard-*.pt")
