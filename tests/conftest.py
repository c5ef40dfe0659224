import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# one thread per test process, sessions and the commands tests start included: the suite runs in
# parallel processes (`make test`), and a session would otherwise count them as busy cores
os.environ.setdefault("SPECDECK_THREADS", "1")

import pytest
import torch

# Tiny test models gain nothing from intra-op threads, and several test processes may share the
# cores: one thread each avoids oversubscription.
torch.set_num_threads(1)


def _accelerator() -> tuple[torch.device | None, str]:
    """The GPU this machine offers the GPU set, or None and why not. `SPECDECK_TEST_DEVICE` names
    one instead (`cpu` rehearses the set's device-independent tests on a machine without a GPU)."""
    named = os.environ.get("SPECDECK_TEST_DEVICE")
    if named:
        return torch.device(named), ""
    if torch.cuda.is_available():
        return torch.device("cuda"), ""
    if torch.backends.mps.is_available():
        return torch.device("mps"), ""
    return None, f"needs a GPU: this torch ({torch.__version__}) sees no CUDA or MPS device"


@pytest.fixture
def device() -> torch.device:
    """The device of the GPU set (`pytest -m cuda`): CUDA where there is one, else MPS; skipped elsewhere."""
    found, why = _accelerator()
    if found is None:
        pytest.skip(why)
    return found


@pytest.fixture
def cuda(device) -> torch.device:
    """`device` where it is a CUDA GPU; skipped on others (the check needs torch.cuda's counters)."""
    if device.type != "cuda":
        pytest.skip(f"needs CUDA (torch.cuda's memory and synchronisation counters), not {device.type}")
    return device
