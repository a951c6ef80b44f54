"""A phase and its model compiled into unary resources, fixed offsets and precedence delays.

The schedulers and bounds see one abstract problem: transfer ``i`` starts (its first send
cycle) at ``x_i`` and then occupies each of its *resources* ``r`` for ``duration_i`` cycles from
``x_i + offset_ir``. A resource carries one transfer at a time. The resources are:

- the send port of every tile (offset 0), and the reserved partner's send and receive ports of a
  ``paired64`` transfer (offset 0);
- the receive port of every tile (offset = latency of the source to that destination); with
  ``full_duplex`` off, a tile's send and receive ports are one resource;
- with SRAM hazards on, one resource per ``(tile, element)`` that some transfer reads on that
  tile while another writes it (reads at offset 0, writes at the arrival offset). Elements only
  read or only written on a tile need no resource: the ports already serialise them.

Memory-order dependencies become precedence delays ``x_after >= x_before + delay``, always from
an earlier transfer to a later one, so index order is a topological order.

The verifier does not use this module (it re-derives every rule from the phase).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from ipu_stack.exchange.model import (
    ExchangeModel,
    ExchangePhase,
    PhaseArrays,
    element_of,
    latency_model,
    lead_model,
    phase_arrays,
)
from ipu_stack.target.ipu21 import WORD_BYTES
from ipu_stack.target.topology import PAIR_PARTNER_BIT

IntArray = npt.NDArray[np.int64]
SEND = 0
RECEIVE = 1
ELEMENT = 2
_ADDRESS_BITS = 20  # tile memory ends below 2**20 bytes
_ELEMENT_SLOTS = 64  # element indices per tile fit in 64


@dataclass(frozen=True, slots=True)
class ResourceProblem:
    """The compiled phase (see the module docstring).

    Attributes:
        count: number of transfers.
        durations: cycles each transfer occupies each of its resources.
        use_starts: uses of transfer ``i`` are ``use_starts[i]:use_starts[i + 1]``.
        use_resources: resource id of each use.
        use_offsets: cycles from the transfer's send cycle to the start of the use.
        use_transfers: transfer of each use.
        completion: ``max offset + duration`` of each transfer (its end relative to ``x_i``).
        resource_count: number of resources.
        resource_kinds: ``SEND``, ``RECEIVE`` or ``ELEMENT`` per resource.
        resource_tiles: tile of each resource.
        dependency_before: earlier transfer of each dependency.
        dependency_after: later transfer of each dependency.
        dependency_delay: ``x_after >= x_before + delay``.
        destination_latency: latency of each destination entry of the phase arrays.
        release: earliest send cycle of each transfer: every destination's source select
            (``lead - latency`` cycles from the send) at or after the phase start.
        words_per_cycle: 2 for transfers moved as ``paired64``, else 1.
        arrays: the phase arrays.
    """

    count: int
    durations: IntArray
    use_starts: IntArray
    use_resources: IntArray
    use_offsets: IntArray
    use_transfers: IntArray
    completion: IntArray
    resource_count: int
    resource_kinds: IntArray
    resource_tiles: IntArray
    dependency_before: IntArray
    dependency_after: IntArray
    dependency_delay: IntArray
    destination_latency: IntArray
    words_per_cycle: IntArray
    arrays: PhaseArrays
    release: IntArray

    def resource_loads(self) -> IntArray:
        """Cycles of work on every resource (each use counts its transfer's duration)."""
        weights = self.durations[self.use_transfers]
        # bincount on int weights goes through float64: exact far above any phase's load.
        return np.bincount(
            self.use_resources, weights=weights, minlength=self.resource_count
        ).astype(np.int64)

    def heads(self) -> IntArray:
        """Earliest start of every transfer allowed by the releases and dependencies."""
        head = self.release.copy()
        if self.dependency_after.size:
            order = np.argsort(self.dependency_after, kind="stable")
            before = self.dependency_before[order].tolist()
            after = self.dependency_after[order].tolist()
            delay = self.dependency_delay[order].tolist()
            values = head.tolist()
            # Edges go from lower to higher index: sorted by ``after``, every ``before`` is final.
            for b, a, d in zip(before, after, delay, strict=True):
                if values[b] + d > values[a]:
                    values[a] = values[b] + d
            head = np.asarray(values, dtype=np.int64)
        return head

    def tails(self) -> IntArray:
        """Shortest time from each transfer's start to the horizon: its completion or chain."""
        tail = self.completion.copy()
        if self.dependency_after.size:
            order = np.argsort(-self.dependency_before, kind="stable")
            before = self.dependency_before[order].tolist()
            after = self.dependency_after[order].tolist()
            delay = self.dependency_delay[order].tolist()
            values = tail.tolist()
            for b, a, d in zip(before, after, delay, strict=True):
                if d + values[a] > values[b]:
                    values[b] = d + values[a]
            tail = np.asarray(values, dtype=np.int64)
        return tail

    def resource_name(self, resource: int) -> str:
        """A human name of a resource for messages."""
        kind = int(self.resource_kinds[resource])
        tile = int(self.resource_tiles[resource])
        return ("send port", "receive port", "SRAM element")[kind] + f" of tile {tile}"


def compile_phase(phase: ExchangePhase, model: ExchangeModel) -> ResourceProblem:
    """Compile a (validated) phase under a model into a :class:`ResourceProblem`.

    Args:
        phase: the phase; call ``phase.validate()`` first.
        model: the rules to encode.

    Returns:
        The problem.
    """
    arrays = phase_arrays(phase)
    count = arrays.words.size
    tile_count = phase.tile_count
    paired = arrays.paired & model.paired
    words_per_cycle = np.where(paired, 2, 1).astype(np.int64)
    durations = arrays.words // words_per_cycle

    owners = arrays.destination_transfers
    dest_sources = arrays.sources[owners]
    latency = np.zeros(owners.size, dtype=np.int64)
    if owners.size and model.latency != "none":
        dest_paired = paired[owners]
        plain = latency_model(model.latency)
        latency[~dest_paired] = plain(
            dest_sources[~dest_paired], arrays.destination_tiles[~dest_paired]
        )
        if dest_paired.any():
            twin = latency_model(model.latency, paired=True)
            latency[dest_paired] = twin(
                dest_sources[dest_paired], arrays.destination_tiles[dest_paired]
            )

    release = np.zeros(count, dtype=np.int64)
    if owners.size and model.latency != "none":
        np.maximum.at(
            release, owners, lead_model(model.latency)(arrays.destination_tiles) - latency
        )
    receive_base = tile_count if model.full_duplex else 0
    transfers = [np.arange(count, dtype=np.int64), owners]
    resources = [arrays.sources, receive_base + arrays.destination_tiles]
    offsets = [np.zeros(count, dtype=np.int64), latency]
    kinds = [np.full(count, SEND), np.full(owners.size, RECEIVE)]
    if paired.any():
        reserved = np.flatnonzero(paired)
        partner = arrays.sources[reserved] ^ PAIR_PARTNER_BIT
        transfers += [reserved, reserved]
        resources += [partner, receive_base + partner]
        offsets += [np.zeros(reserved.size, dtype=np.int64)] * 2
        kinds += [np.full(reserved.size, SEND), np.full(reserved.size, RECEIVE)]

    element_uses = _element_uses(arrays, latency, tile_count) if model.sram_hazards else None
    resource_kinds = np.concatenate(
        (np.full(tile_count, SEND), np.full(tile_count if model.full_duplex else 0, RECEIVE))
    ).astype(np.int64)
    resource_tiles = np.concatenate(
        (np.arange(tile_count), np.arange(tile_count if model.full_duplex else 0))
    ).astype(np.int64)
    if element_uses is not None:
        use_transfer, use_key, use_offset, keys = element_uses
        base = resource_kinds.size
        transfers.append(use_transfer)
        resources.append(base + np.searchsorted(keys, use_key))
        offsets.append(use_offset)
        kinds.append(np.full(use_transfer.size, ELEMENT))
        resource_kinds = np.concatenate((resource_kinds, np.full(keys.size, ELEMENT)))
        resource_tiles = np.concatenate((resource_tiles, keys // _ELEMENT_SLOTS))

    use_transfers = np.concatenate(transfers).astype(np.int64)
    use_resources = np.concatenate(resources).astype(np.int64)
    use_offsets = np.concatenate(offsets).astype(np.int64)
    # One use per (transfer, resource): without full duplex a partner's two ports coincide.
    order = np.lexsort((use_offsets, use_resources, use_transfers))
    use_transfers, use_resources, use_offsets = (
        use_transfers[order],
        use_resources[order],
        use_offsets[order],
    )
    keep = np.ones(order.size, dtype=bool)
    keep[1:] = (use_transfers[1:] != use_transfers[:-1]) | (use_resources[1:] != use_resources[:-1])
    use_transfers, use_resources, use_offsets = (
        use_transfers[keep],
        use_resources[keep],
        use_offsets[keep],
    )
    use_starts = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(np.bincount(use_transfers, minlength=count), out=use_starts[1:])
    max_offset = np.zeros(count, dtype=np.int64)
    if use_offsets.size:
        np.maximum.at(max_offset, use_transfers, use_offsets)
    completion = max_offset + durations

    if model.dependencies:
        before, after, delay = _dependencies(arrays, latency, durations)
    else:
        before = after = delay = np.zeros(0, dtype=np.int64)
    return ResourceProblem(
        count=count,
        durations=durations,
        use_starts=use_starts,
        use_resources=use_resources,
        use_offsets=use_offsets,
        use_transfers=use_transfers,
        completion=completion,
        resource_count=int(resource_kinds.size),
        resource_kinds=resource_kinds,
        resource_tiles=resource_tiles,
        dependency_before=before,
        dependency_after=after,
        dependency_delay=delay,
        destination_latency=latency,
        words_per_cycle=words_per_cycle,
        arrays=arrays,
        release=release,
    )


def _element_ranges(addresses: IntArray, words: IntArray) -> tuple[IntArray, IntArray]:
    first = element_of(addresses)
    last = element_of(addresses + words * WORD_BYTES - 1)
    return first, last


def _expand(
    transfer: IntArray, tile: IntArray, first: IntArray, last: IntArray, offset: IntArray
) -> tuple[IntArray, IntArray, IntArray]:
    """One row per (access, element) of each access's element range."""
    spans = last - first + 1
    rows = np.repeat(np.arange(transfer.size), spans)
    starts = np.zeros(transfer.size, dtype=np.int64)
    np.cumsum(spans[:-1], out=starts[1:])
    element = first[rows] + np.arange(rows.size) - starts[rows]
    return transfer[rows], tile[rows] * _ELEMENT_SLOTS + element, offset[rows]


def _element_uses(
    arrays: PhaseArrays, latency: IntArray, tile_count: int
) -> tuple[IntArray, IntArray, IntArray, IntArray] | None:
    count = arrays.words.size
    first, last = _element_ranges(arrays.source_addresses, arrays.words)
    read = _expand(
        np.arange(count, dtype=np.int64),
        arrays.sources,
        first,
        last,
        np.zeros(count, dtype=np.int64),
    )
    owners = arrays.destination_transfers
    first, last = _element_ranges(arrays.destination_addresses, arrays.words[owners])
    write = _expand(owners, arrays.destination_tiles, first, last, latency)
    keys = np.intersect1d(read[1], write[1])
    if keys.size == 0:
        return None
    read_keep = np.isin(read[1], keys)
    write_keep = np.isin(write[1], keys)
    return (
        np.concatenate((read[0][read_keep], write[0][write_keep])),
        np.concatenate((read[1][read_keep], write[1][write_keep])),
        np.concatenate((read[2][read_keep], write[2][write_keep])),
        keys,
    )


def _dependencies(
    arrays: PhaseArrays, latency: IntArray, durations: IntArray
) -> tuple[IntArray, IntArray, IntArray]:
    """Memory-order precedences between transfers with overlapping bytes on a tile."""
    count = arrays.words.size
    owners = arrays.destination_transfers
    transfer = np.concatenate((np.arange(count, dtype=np.int64), owners))
    tile = np.concatenate((arrays.sources, arrays.destination_tiles))
    low = np.concatenate((arrays.source_addresses, arrays.destination_addresses))
    high = low + arrays.words[transfer] * WORD_BYTES
    offset = np.concatenate((np.zeros(count, dtype=np.int64), latency))
    is_write = np.concatenate((np.zeros(count, dtype=bool), np.ones(owners.size, dtype=bool)))
    key_low = (tile << _ADDRESS_BITS) | low
    key_high = (tile << _ADDRESS_BITS) | high
    order = np.argsort(key_low, kind="stable")
    sorted_low = key_low[order]
    writes = np.flatnonzero(is_write)
    write_order = writes[np.argsort(key_low[writes], kind="stable")]
    sorted_write_low = key_low[write_order]
    pairs_a: list[IntArray] = []
    pairs_b: list[IntArray] = []
    # (any access a, write w) with low_a <= low_w < high_a.
    # Queries in sorted order search much faster; results go back to their rows.
    begin = _sorted_search(sorted_write_low, key_low, order, "left")
    end = _sorted_search(sorted_write_low, key_high, order, "left")
    _collect(np.arange(transfer.size), begin, end, write_order, pairs_a, pairs_b)
    # (write w, any access a) with low_w < low_a < high_w (strict: equal lows came above).
    by_low = np.argsort(key_low[writes], kind="stable")
    begin = _sorted_search(sorted_low, key_low[writes], by_low, "right")
    end = _sorted_search(sorted_low, key_high[writes], by_low, "left")
    _collect(writes, begin, end, order, pairs_a, pairs_b)
    a = np.concatenate(pairs_a) if pairs_a else np.zeros(0, dtype=np.int64)
    b = np.concatenate(pairs_b) if pairs_b else np.zeros(0, dtype=np.int64)
    differ = transfer[a] != transfer[b]
    a, b = a[differ], b[differ]
    if a.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    swap = transfer[a] > transfer[b]
    early = np.where(swap, b, a)
    late = np.where(swap, a, b)
    before = transfer[early]
    after = transfer[late]
    delay = offset[early] + durations[before] - offset[late]
    # Keep the largest delay per (before, after).
    order = np.lexsort((-delay, after, before))
    before, after, delay = before[order], after[order], delay[order]
    keep = np.ones(before.size, dtype=bool)
    keep[1:] = (before[1:] != before[:-1]) | (after[1:] != after[:-1])
    return before[keep], after[keep], delay[keep]


def _sorted_search(
    haystack: IntArray, needles: IntArray, order: IntArray, side: Literal["left", "right"]
) -> IntArray:
    """``np.searchsorted(haystack, needles, side)``, searching the needles in ``order``
    (an order that sorts them, or nearly: only the speed depends on it)."""
    found = np.empty(needles.size, dtype=np.int64)
    found[order] = np.searchsorted(haystack, needles[order], side=side)
    return found


def _collect(
    rows: IntArray,
    begin: IntArray,
    end: IntArray,
    sorted_ids: IntArray,
    pairs_a: list[IntArray],
    pairs_b: list[IntArray],
) -> None:
    spans = np.maximum(end - begin, 0)
    total = int(spans.sum())
    if total == 0:
        return
    repeated = np.repeat(np.arange(rows.size), spans)
    starts = np.zeros(rows.size, dtype=np.int64)
    np.cumsum(spans[:-1], out=starts[1:])
    positions = begin[repeated] + np.arange(total) - starts[repeated]
    pairs_a.append(rows[repeated].astype(np.int64))
    pairs_b.append(sorted_ids[positions].astype(np.int64))
