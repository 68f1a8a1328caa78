"""Waiting queues (spec A2): FCFS deque and PRIORITY heap."""

from __future__ import annotations

import heapq
from collections import deque
from typing import Iterable, Iterator

from kvreplay.replay.request import Request


class FCFSRequestQueue:
    """Add at the back; preempted and skipped requests go to the front (A2)."""

    __slots__ = ("_q",)

    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add_request(self, request: Request) -> None:
        self._q.append(request)

    def prepend_request(self, request: Request) -> None:
        self._q.appendleft(request)

    def prepend_requests(self, requests: list[Request]) -> None:
        """Put `requests` back at the front in their given order."""
        self._q.extendleft(reversed(requests))

    def peek_request(self) -> Request:
        return self._q[0]

    def pop_request(self) -> Request:
        return self._q.popleft()

    def remove_request(self, request: Request) -> None:
        self._q.remove(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        drop = set(id(r) for r in requests)
        self._q = deque(r for r in self._q if id(r) not in drop)

    def __len__(self) -> int:
        return len(self._q)

    def __bool__(self) -> bool:
        return bool(self._q)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._q)


class PriorityRequestQueue:
    """A heap on (priority, arrival_time, request_id); "prepend" is just a push (A2)."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[tuple[int, float, str], Request]] = []

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.sort_key(), request))

    prepend_request = add_request

    def prepend_requests(self, requests: list[Request]) -> None:
        for r in requests:
            self.add_request(r)

    def peek_request(self) -> Request:
        return self._heap[0][1]

    def pop_request(self) -> Request:
        return heapq.heappop(self._heap)[1]

    def remove_request(self, request: Request) -> None:
        self.remove_requests([request])

    def remove_requests(self, requests: Iterable[Request]) -> None:
        drop = set(id(r) for r in requests)
        self._heap = [e for e in self._heap if id(e[1]) not in drop]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __iter__(self) -> Iterator[Request]:
        """Pop order, as vLLM's queue iterates."""
        return iter(r for _, r in sorted(self._heap))


def create_request_queue(policy: str) -> FCFSRequestQueue | PriorityRequestQueue:
    return PriorityRequestQueue() if policy == "priority" else FCFSRequestQueue()
