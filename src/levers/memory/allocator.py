"""A model of PyTorch's CUDA caching allocator, replayed over a trace of allocations and frees.

It follows the rules of ``c10/cuda/CUDACachingAllocator.cpp`` (default settings, one stream):

- every request is rounded up to a multiple of 512 bytes (``kMinBlockSize``);
- requests of at most 1 MiB (``kSmallSize``) come from the small pool, whose segments are
  2 MiB (``kSmallBuffer``); larger requests come from the large pool, whose new segments are
  20 MiB (``kLargeBuffer``) for requests under 10 MiB (``kMinLargeAlloc``) and the request
  rounded up to 2 MiB (``kRoundLarge``) above that;
- a request takes the smallest free block of its pool that is large enough (ties: the lowest
  address); only when none is free does the allocator ``cudaMalloc`` a new segment;
- the block is split when the remainder is at least 512 bytes (small pool) or more than 1 MiB
  (large pool); otherwise the whole block is handed out, and the whole block counts as
  allocated (that slack is part of ``max_memory_allocated``);
- a freed block merges with free neighbours of its segment; segments are never returned to the
  driver, except that when ``cudaMalloc`` would exceed the device's capacity the allocator first
  frees every cached segment that is entirely free and tries again (then it is out of memory).

``allocated`` is the sum of the sizes of allocated blocks (``memory_allocated``); ``reserved``
is the sum of segment sizes (``memory_reserved``). ``max_split_size_mb``, ``roundup_power2``
and expandable segments are not modelled (a non-default ``PYTORCH_CUDA_ALLOC_CONF`` is reported
as an assumption by the caller).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MIN_BLOCK_BYTES = 512
SMALL_REQUEST_BYTES = 1 << 20  # largest request served by the small pool
SMALL_SEGMENT_BYTES = 2 << 20
LARGE_SEGMENT_BYTES = 20 << 20  # the segment size for requests between 1 and 10 MiB
MIN_LARGE_ALLOC_BYTES = 10 << 20
ROUND_LARGE_BYTES = 2 << 20


def round_request(nbytes: int) -> int:
    """The block size a request of ``nbytes`` asks for."""
    if nbytes < MIN_BLOCK_BYTES:
        return MIN_BLOCK_BYTES
    return -(-nbytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES


def segment_bytes(block_bytes: int) -> int:
    """The size of the segment ``cudaMalloc``-ed when no cached block fits ``block_bytes``."""
    if block_bytes <= SMALL_REQUEST_BYTES:
        return SMALL_SEGMENT_BYTES
    if block_bytes < MIN_LARGE_ALLOC_BYTES:
        return LARGE_SEGMENT_BYTES
    return -(-block_bytes // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


def is_small(block_bytes: int) -> bool:
    return block_bytes <= SMALL_REQUEST_BYTES


@dataclass
class _Block:
    addr: int
    size: int
    segment: int  # address of the segment's first byte
    small: bool
    allocated: bool = False
    prev: _Block | None = None
    next: _Block | None = None


@dataclass
class _Pool:
    # free blocks, sorted by (size, addr): bisect gives the smallest fit, lowest address first
    keys: list[tuple[int, int]] = field(default_factory=list)
    blocks: dict[tuple[int, int], _Block] = field(default_factory=dict)

    def add(self, block: _Block) -> None:
        key = (block.size, block.addr)
        bisect.insort(self.keys, key)
        self.blocks[key] = block

    def remove(self, block: _Block) -> None:
        key = (block.size, block.addr)
        del self.keys[bisect.bisect_left(self.keys, key)]
        del self.blocks[key]

    def take_best_fit(self, size: int) -> _Block | None:
        index = bisect.bisect_left(self.keys, (size, -1))
        if index == len(self.keys):
            return None
        key = self.keys.pop(index)
        return self.blocks.pop(key)


class OutOfMemory(Exception):
    """The modelled allocator cannot satisfy a request within the capacity it was given."""


class CachingAllocator:
    """Replays ``malloc``/``free`` calls and keeps ``allocated`` and ``reserved`` byte counts.

    ``capacity_bytes`` (optional) is the memory the allocator may reserve; past it, requests
    that cannot be served raise :class:`OutOfMemory` after cached free segments were released.
    """

    def __init__(self, capacity_bytes: int | None = None) -> None:
        self.capacity_bytes = capacity_bytes
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.peak_allocated_bytes = 0
        self.peak_reserved_bytes = 0
        self.num_segments_released = 0
        self._small = _Pool()
        self._large = _Pool()
        self._live: dict[int, _Block] = {}
        self._segments: dict[int, int] = {}  # segment address -> segment size
        self._next_addr = 0

    def malloc(self, handle: int, nbytes: int) -> int:
        """Allocate ``nbytes`` for ``handle``; returns the size of the block handed out."""
        if handle in self._live:
            raise ValueError(f"handle {handle} is already allocated; free it first")
        size = round_request(nbytes)
        pool = self._small if is_small(size) else self._large
        block = pool.take_best_fit(size)
        if block is None:
            block = self._new_segment(size)
        self._split(block, size, pool)
        block.allocated = True
        self._live[handle] = block
        self.allocated_bytes += block.size
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        return block.size

    def free(self, handle: int) -> int:
        """Free the block of ``handle``; returns its size."""
        block = self._live.pop(handle)
        size = block.size
        block.allocated = False
        self.allocated_bytes -= size
        pool = self._small if block.small else self._large
        block = self._merge(block, pool)
        pool.add(block)
        return size

    def block_bytes(self, handle: int) -> int:
        """The size of the block that ``handle`` holds now."""
        return self._live[handle].size

    def holds(self, handle: int) -> bool:
        """Whether ``handle`` is allocated now."""
        return handle in self._live

    def live_blocks(self) -> dict[int, int]:
        """Every allocated handle and the size of its block, in allocation order."""
        return {handle: block.size for handle, block in self._live.items()}

    def _new_segment(self, size: int) -> _Block:
        alloc_bytes = segment_bytes(size)
        if (
            self.capacity_bytes is not None
            and self.reserved_bytes + alloc_bytes > self.capacity_bytes
        ):
            self._release_free_segments()
            if self.reserved_bytes + alloc_bytes > self.capacity_bytes:
                raise OutOfMemory(
                    f"a request of {size} bytes needs a new {alloc_bytes}-byte segment with "
                    f"{self.reserved_bytes} bytes reserved of {self.capacity_bytes}"
                )
        addr = self._next_addr
        # segments sit far apart so that addresses of different segments never touch
        self._next_addr += -(-alloc_bytes // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES + (1 << 40)
        self._segments[addr] = alloc_bytes
        self.reserved_bytes += alloc_bytes
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        return _Block(addr=addr, size=alloc_bytes, segment=addr, small=is_small(size))

    def _split(self, block: _Block, size: int, pool: _Pool) -> None:
        remaining = block.size - size
        if block.small:
            should_split = remaining >= MIN_BLOCK_BYTES
        else:
            should_split = remaining > SMALL_REQUEST_BYTES
        if not should_split:
            return
        rest = _Block(
            addr=block.addr + size,
            size=remaining,
            segment=block.segment,
            small=block.small,
            prev=block,
            next=block.next,
        )
        if block.next is not None:
            block.next.prev = rest
        block.next = rest
        block.size = size
        pool.add(rest)

    def _merge(self, block: _Block, pool: _Pool) -> _Block:
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.allocated:
            pool.remove(prev)
            prev.size += block.size
            prev.next = nxt
            if nxt is not None:
                nxt.prev = prev
            block = prev
        nxt = block.next
        if nxt is not None and not nxt.allocated:
            pool.remove(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
        return block

    def _release_free_segments(self) -> None:
        # release_cached_blocks: every free block that is a whole segment goes back to the driver
        for pool in (self._small, self._large):
            for key in list(pool.keys):
                block = pool.blocks[key]
                if block.prev is None and block.next is None:
                    pool.remove(block)
                    self.reserved_bytes -= self._segments.pop(block.segment)
                    self.num_segments_released += 1
