"""A model's packed weights in one run of memory, in the order a step reads them, on huge pages.

A decode step on the row kernel streams every weight once from memory, so the step runs at the
pace memory delivers. Each product packed on its own sits in a buffer of a few hundred kilobytes to
a few megabytes in ordinary 4 KiB pages: streaming SmolLM2-135M's 145 MB (Q8_0) crosses 35,000
pages, each an address translation of its own. `gather` copies the products' packed weights, one after
another in a step's order, into one private anonymous mapping advised to use transparent huge
pages (`madvise(MADV_HUGEPAGE)`, 2 MiB each on x86-64, where the system's
/sys/kernel/mm/transparent_hugepage/enabled is "madvise" or "always"), and points each product at
its part. The bytes are the same, so are the products' bits.

Where the platform has no such advice (not Linux), the products keep their own buffers.
"""

from __future__ import annotations

import logging
import mmap

import numpy as np
import torch

from specdeck.engine.forward.row_kernel import KernelLinear, QuantizedLinear, QuantizedParts
from specdeck.engine.memory import trim_heap

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20  # x86-64's transparent huge page: a mapping of whole ones starts on one (Linux 6.7 on)
ALIGN = 64  # each part starts on a cache line
# Less than this is left where it is: weights that fit a large L3 cache hardly stream from memory,
# and the mapping's rounding to whole huge pages would add up to a sixteenth to them.
SMALLEST = 16 * HUGE_PAGE
TRIM_EVERY = 64 << 20  # bytes of freed buffers after which the C heap gives them back to the system


def packed_parts(products: list) -> list[KernelLinear | QuantizedLinear]:
    """The row kernel's products among `products`, a product of parts as its parts, in order."""
    parts: list[KernelLinear | QuantizedLinear] = []
    for product in products:
        for part in product.parts if isinstance(product, QuantizedParts) else [product]:
            if isinstance(part, KernelLinear | QuantizedLinear):
                parts.append(part)
    return parts


def gather(products: list, smallest: int = SMALLEST) -> mmap.mmap | None:
    """Move the packed weights of `products` (in the order a step multiplies them) into one mapping
    on huge pages, each product's `_packed` a view of its part; the mapping, or None where nothing
    moved (under `smallest` bytes, or no such advice here). A product's own buffer is freed as soon
    as its part is filled, so the move holds one product's bytes twice at most. Call it before
    anything keeps a pointer into the buffers (the fused layers' `FusedLayers` does)."""
    parts = packed_parts(products)
    sizes = [-(-part._packed.nbytes // ALIGN) * ALIGN for part in parts]
    if sum(sizes) < max(smallest, 1) or not hasattr(mmap, "MADV_HUGEPAGE") or not hasattr(mmap, "MAP_PRIVATE"):
        return None
    # whole huge pages: the kernel then starts the mapping on one
    length = -(-sum(sizes) // HUGE_PAGE) * HUGE_PAGE
    try:
        arena = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        arena.madvise(mmap.MADV_HUGEPAGE)
    except (OSError, ValueError) as error:  # only costs speed
        log.info("the packed weights keep their own buffers: %s", error)
        return None
    memory = torch.from_numpy(np.frombuffer(arena, dtype=np.uint8))
    at = freed = 0
    for part, size in zip(parts, sizes):
        own = part._packed
        place = memory[at : at + own.nbytes].view(own.dtype)
        place.copy_(own)
        part._packed = place
        at += size
        freed += own.nbytes
        del own
        if freed >= TRIM_EVERY:
            # the C heap keeps what was freed for its own later use; given back now, the arena's
            # pages take the place of the buffers' instead of adding to them
            trim_heap()
            freed = 0
    trim_heap()
    return arena
