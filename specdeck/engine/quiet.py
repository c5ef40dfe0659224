"""Keep library chatter out of SpecDeck's output.

SpecDeck reports its own progress (`[Converting ...]`, `[Loading ...]` on stderr), so the progress
bars and notices of transformers and huggingface_hub only repeat it noisily, and with
`specdeck run --jsonl` they would mix with the event stream. SpecDeck's own messages and the
libraries' errors still come through.
"""

from __future__ import annotations

import os


def silence_libraries() -> None:
    """Turn off transformers' and huggingface_hub's progress bars and notices for this process."""
    import huggingface_hub.utils
    import transformers.modeling_gguf_pytorch_utils as gguf_loading
    from transformers.utils import logging

    # for child processes; this one imported both libraries with the engine, so the calls below act
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    huggingface_hub.utils.disable_progress_bars()
    logging.set_verbosity_error()
    logging.disable_progress_bar()  # "Loading weights"
    # the GGUF reader opens its "Converting and de-quantizing" bar with tqdm itself; transformers'
    # own tqdm is the same bar with the switch above
    gguf_loading.tqdm = logging.tqdm
