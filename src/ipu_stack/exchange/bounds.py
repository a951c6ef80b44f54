"""Lower bounds on the horizon of an exchange phase (latency ignored).

See `shared/docs/exchange-scheduling.md` §3.1. Comparing a schedule's horizon with the strongest
bound tells whether to improve the scheduler (a gap) or the mapping and layout (tight bound).
"""

from __future__ import annotations

import numpy as np

from ipu_stack.exchange.model import ExchangePhase, PhaseArrays, phase_arrays

ENDPOINT = "endpoint"
CONFLICT_CLIQUE = "conflict-clique"


def endpoint_lower_bound(phase: ExchangePhase) -> int:
    """The port bound: the largest number of words any tile must send or receive.

    Every port moves one word per cycle, so no schedule can be shorter.

    Args:
        phase: the phase.

    Returns:
        ``max`` over tiles of ``max(words sent, words received)``; 0 for an empty phase.
    """
    if not phase.transfers:
        return 0
    return _endpoint_bound(phase_arrays(phase), phase.tile_count)


def _endpoint_bound(arrays: PhaseArrays, tile_count: int) -> int:
    sent = np.bincount(arrays.sources, weights=arrays.words, minlength=tile_count)
    received = np.bincount(
        arrays.destination_tiles,
        weights=arrays.words[arrays.destination_transfers],
        minlength=tile_count,
    )
    return int(max(sent.max(), received.max()))


def conflict_lower_bound(
    phase: ExchangePhase, max_seeds: int = 32, max_candidates: int = 2048
) -> int:
    """The conflict-clique bound: total words of a set of pairwise port-sharing transfers.

    Transfers that pairwise share a port (a send port, or a receive port) can never overlap in
    time, so their words add up. The transfers on one port form such a clique, which gives the
    endpoint bound; multicast can give larger cliques (e.g. an all-gather among ``g >= 3``
    tiles: all ``g`` multicasts pairwise share a receiver, bound ``g * chunk`` against the
    endpoint bound ``(g - 1) * chunk``). For unicast-only phases the conflict graph is the line
    graph of a bipartite graph, whose cliques are stars, so the bound equals the endpoint bound
    and the search is skipped.

    The clique search is a bounded greedy (the exact problem is NP-hard): seeds are the
    transfers on the heaviest ports, extended by heaviest-first candidates that conflict with
    every member. Any clique found is a valid bound, so the result is always sound.

    Args:
        phase: the phase.
        max_seeds: number of heaviest ports whose transfer sets seed the greedy.
        max_candidates: candidates examined per seed.

    Returns:
        The bound in cycles, at least the endpoint bound.
    """
    if not phase.transfers:
        return 0
    arrays = phase_arrays(phase)
    endpoint = _endpoint_bound(arrays, phase.tile_count)
    if int(arrays.fanouts.max()) <= 1:
        return endpoint
    tile_count = phase.tile_count
    # Port ids: send port of tile t is t, receive port of tile t is tile_count + t.
    ports: list[frozenset[int]] = []
    port_transfers: dict[int, list[int]] = {}
    for index, transfer in enumerate(phase.transfers):
        members = [transfer.source] + [tile_count + tile for tile, _ in transfer.destinations]
        ports.append(frozenset(members))
        for port in members:
            port_transfers.setdefault(port, []).append(index)
    words = arrays.words
    load = {port: int(words[indices].sum()) for port, indices in port_transfers.items()}
    seed_ports = sorted(load, key=lambda port: (-load[port], port))[:max_seeds]
    best = endpoint
    for seed_port in seed_ports:
        clique = list(port_transfers[seed_port])
        total = load[seed_port]
        anchor = ports[clique[0]]
        in_clique = set(clique)
        candidates = {
            other for port in anchor for other in port_transfers[port] if other not in in_clique
        }
        ordered = sorted(candidates, key=lambda i: (-int(words[i]), i))[:max_candidates]
        for candidate in ordered:
            candidate_ports = ports[candidate]
            if all(not candidate_ports.isdisjoint(ports[member]) for member in clique):
                clique.append(candidate)
                total += int(words[candidate])
        best = max(best, total)
    return best


def strongest_lower_bound(phase: ExchangePhase) -> tuple[int, str]:
    """The strongest available lower bound and the name of the bound that attains it.

    Args:
        phase: the phase.

    Returns:
        ``(value, name)`` where name is ``"endpoint"`` or ``"conflict-clique"``; the endpoint
        bound wins ties.
    """
    endpoint = endpoint_lower_bound(phase)
    clique = conflict_lower_bound(phase)
    if clique > endpoint:
        return clique, CONFLICT_CLIQUE
    return endpoint, ENDPOINT
