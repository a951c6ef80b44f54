"""Busy intervals of resources, for the list schedulers (:mod:`ipu_stack.exchange.schedule_greedy`,
:mod:`ipu_stack.exchange.schedule_pieces`)."""

from __future__ import annotations

from bisect import bisect_right


class Calendar:
    """Busy intervals of every resource: sorted, disjoint, merged when touching.

    ``starts[r]`` and ``ends[r]`` exist only for resources that have been occupied (phases
    have tens of thousands of SRAM-element resources, most of them never touched by a
    given scheduler run).
    """

    def __init__(self, resource_count: int) -> None:
        self.resource_count = resource_count
        self.starts: dict[int, list[int]] = {}
        self.ends: dict[int, list[int]] = {}

    def first_free(self, resource: int, time: int, length: int) -> int:
        """The earliest ``t >= time`` with ``[t, t + length)`` free on ``resource``."""
        starts = self.starts.get(resource)
        if starts is None:
            return time
        ends = self.ends[resource]
        k = bisect_right(starts, time) - 1
        if k >= 0 and ends[k] > time:
            time = ends[k]
        k += 1
        count = len(starts)
        while k < count and starts[k] < time + length:
            time = ends[k]
            k += 1
        return time

    def earliest(self, uses: list[tuple[int, int]], length: int, time: int) -> int:
        """The earliest start ``>= time`` at which every ``(resource, offset)`` use is free."""
        # :meth:`first_free` inlined: this loop is the list schedulers' inner loop.
        starts_of = self.starts
        ends_of = self.ends
        settled = 0
        position = 0
        count = len(uses)
        while settled < count:
            resource, offset = uses[position]
            starts = starts_of.get(resource)
            if starts is None:
                settled += 1  # never occupied: free at ``time``
            elif time + offset >= (ends := ends_of[resource])[-1]:
                settled += 1  # free from the end of its last busy interval on
            else:
                at = time + offset
                k = bisect_right(starts, at) - 1
                if k >= 0 and ends[k] > at:
                    at = ends[k]
                k += 1
                busy = len(starts)
                while k < busy and starts[k] < at + length:
                    at = ends[k]
                    k += 1
                if at - offset != time:
                    time = at - offset
                    settled = 1
                else:
                    settled += 1
            position += 1
            if position == count:
                position = 0
        return time

    def occupy_uses(self, uses: list[tuple[int, int]], time: int, length: int) -> None:
        """Mark every ``(resource, offset)`` use busy for ``length`` cycles from ``time``.

        Each use's interval must be free; the list schedulers' other inner loop."""
        starts_of = self.starts
        ends_of = self.ends
        for resource, offset in uses:
            begin = time + offset
            end = begin + length
            starts = starts_of.get(resource)
            if starts is None:
                starts_of[resource] = [begin]
                ends_of[resource] = [end]
                continue
            ends = ends_of[resource]
            if begin >= ends[-1]:
                if begin == ends[-1]:
                    ends[-1] = end
                else:
                    starts.append(begin)
                    ends.append(end)
                continue
            k = bisect_right(starts, begin)
            joins_previous = k > 0 and ends[k - 1] == begin
            joins_next = k < len(starts) and starts[k] == end
            if joins_previous and joins_next:
                ends[k - 1] = ends[k]
                del starts[k]
                del ends[k]
            elif joins_previous:
                ends[k - 1] = end
            elif joins_next:
                starts[k] = begin
            else:
                starts.insert(k, begin)
                ends.insert(k, end)

    def occupy(self, resource: int, begin: int, end: int) -> None:
        """Mark ``[begin, end)`` busy (it must be free)."""
        self.occupy_uses([(resource, 0)], begin, end - begin)
