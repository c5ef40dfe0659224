import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

# Tiny test models gain nothing from intra-op threads, and several test processes may share the
# cores: one thread each avoids oversubscription.
torch.set_num_threads(1)
