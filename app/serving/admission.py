"""The scheduler's front: requests admitted into its queues or refused (overload, shutdown) and cancelled,
from the event loop, and counted from submission until answered (`unanswered`, what the queue's cap counts;
the worker, `app/serving/scheduler.py`, releases them). Both sides take the same lock.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from typing import TypeVar

from app.errors import NotReady, Overloaded, ServiceError
from app.serving.work_items import GenerationItem, SchedulerStats, ScoringItem, WorkItem

Item = TypeVar("Item", GenerationItem, ScoringItem)


class Admission:
    def __init__(self, max_batch_size: int, max_queue: int) -> None:
        self.max_batch_size = max_batch_size
        self.max_queue = max_queue
        self.stats = SchedulerStats()
        self._condition = threading.Condition()
        self._waiting: deque[GenerationItem] = deque()
        self._scoring: deque[ScoringItem] = deque()
        self._stopping = False
        self._abandon: ServiceError | None = None  # set by `abandon_everything`, taken by the worker
        self._refusal: ServiceError | None = None  # set by `abandon_everything`: nothing more is admitted
        self._cancel_seen = False  # set by `cancel`: the worker's next step looks for cancelled rows
        self._unanswered = 0  # submitted and not yet answered, guarded by the condition's lock

    @property
    def unanswered(self) -> int:
        return self._unanswered

    def _release(self, item: WorkItem) -> None:
        """The item has its answer (or was dropped): its slot is free again."""
        with self._condition:
            if not item.released:
                item.released = True
                self._unanswered -= 1

    def _retry_after(self) -> int:
        waiting = len(self._waiting) + 1
        return math.ceil(self.stats.average_request_s * waiting / self.max_batch_size)

    def _admit(self, queue: deque[Item], item: Item, capped: bool = True) -> None:
        with self._condition:
            if self._stopping or self._refusal is not None:
                raise NotReady("the service is shutting down", retry_after_s=5)
            if capped and self._unanswered >= self.max_queue + self.max_batch_size:
                raise Overloaded(
                    f"too many requests in flight ({self._unanswered}); retry later",
                    retry_after_s=self._retry_after(),
                )
            self._unanswered += 1
            queue.append(item)
            self.stats.queue_depth = len(self._waiting)
            self._condition.notify_all()

    def submit_generation(self, item: GenerationItem) -> None:
        self._admit(self._waiting, item)

    def submit_scoring(self, item: ScoringItem, follow_up: bool = False) -> None:
        """`follow_up`: a pass of a request already admitted (a check pass), which the queue's cap does not refuse."""
        self._admit(self._scoring, item, capped=not follow_up)

    def abandon_everything(self, error: ServiceError) -> None:
        """Shutdown that cannot wait any longer: every request queued or running is answered with `error`
        (the worker does it at its next pass, after the step it is in), so that each client gets an answer
        in the API's shape rather than a connection cut by the server's exit."""
        with self._condition:
            self._abandon = self._refusal = error  # and whatever arrives after it is refused, not admitted
            self._condition.notify_all()

    def cancel(self, item: WorkItem) -> None:
        """The client went away: drop the item if still queued, else stop it at the next step."""
        with self._condition:
            item.cancelled = True
            self._cancel_seen = True
            for queue in (self._waiting, self._scoring):
                if item in queue:
                    queue.remove(item)  # type: ignore[arg-type]
                    self.stats.queue_depth = len(self._waiting)
                    if not item.released:
                        item.released = True
                        self._unanswered -= 1
            self._condition.notify_all()
