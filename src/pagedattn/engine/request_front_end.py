"""RequestFrontEnd: where :class:`~pagedattn.engine.llm_engine.LLMEngine` requests enter the
scheduler and their outputs leave it.

A request of one completion is one scheduler request under its own id. A request with ``n`` /
``best_of`` > 1 becomes a :class:`~pagedattn.engine.parent_request.ParentRequest` and its child
requests; with prefix caching on and a prompt of one full page or more, children ``1 ..`` wait
in the queue until child 0 sampled its first token (its prompt's full pages are then in the
prefix index), so they compute only the prompt's partial last page. Aborting the request
aborts every child; a child's failure ends its siblings with the same error.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence as SequenceABC

from pagedattn.engine.outputs import FINISH_ERROR, RequestOutput
from pagedattn.engine.parent_request import ParentRequest, child_params
from pagedattn.engine.request_builder import RequestBuilder
from pagedattn.engine.scheduler import Scheduler
from pagedattn.sampling_params import SamplingParams


class RequestFrontEnd:
    """Adds, aborts and reports the engine's requests.

    Args:
        scheduler: where the (child) requests run.
        builder: builds their sequences.
        shared_page: tokens a prompt needs for children 1.. to wait for child 0's prompt pages
            (the page size); None = they never wait (prefix caching off).
    """

    def __init__(
        self, scheduler: Scheduler, builder: RequestBuilder, shared_page: int | None
    ) -> None:
        self.scheduler = scheduler
        self.builder = builder
        self.shared_page = shared_page
        self._parents: dict[str, ParentRequest] = {}
        self._by_child: dict[str, ParentRequest] = {}

    def add(
        self,
        prompt: str | SequenceABC[int],
        params: SamplingParams | None,
        request_id: str | None,
        arrival_time: float | None,
    ) -> str:
        """Queue a request (see :meth:`LLMEngine.add_request`); returns its id.

        Raises:
            ValueError: a bad prompt or params (nothing queued), or a request id (or one of
                its child ids) already in use.
        """
        params = SamplingParams() if params is None else params
        request_id = uuid.uuid4().hex if request_id is None else request_id
        if request_id in self._parents:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if params.num_completions == 1:
            self.scheduler.add(self.builder.build(prompt, params, request_id, arrival_time))
            return request_id
        parent = ParentRequest(request_id, params)
        for rid in (request_id, *parent.child_ids):
            if self.scheduler.get(rid) is not None or rid in self._by_child:
                raise ValueError(f"request_id {rid!r} is already in use")
        seed = params.seed if params.seed is not None else self.builder.draw_seed()
        seqs = self.builder.build_many(
            prompt, child_params(params, seed), parent.child_ids, arrival_time,
            lead_from=self.shared_page,
        )  # fmt: skip
        self._parents[request_id] = parent
        for seq in seqs:
            self._by_child[seq.request_id] = parent
            self.scheduler.add(seq)
        return request_id

    def abort(self, request_id: str) -> bool:
        """Abort a request (every child of a parent); False when unknown or finished."""
        parent = self._parents.get(request_id)
        if parent is None:
            return self.scheduler.abort(request_id)
        aborted = [self.scheduler.abort(cid) for cid in parent.child_ids]
        return any(aborted)

    def route(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """The scheduler's outputs with each parent's children folded into one output per
        parent, at its first child's place; a child's failure ends its siblings (their
        outputs come with the next step)."""
        slots: list[RequestOutput | ParentRequest] = []
        seen: set[str] = set()
        for out in outputs:
            parent = self._by_child.get(out.request_id)
            if parent is None:
                slots.append(out)
                continue
            if parent.request_id not in seen:
                seen.add(parent.request_id)
                slots.append(parent)
            for cid in parent.add(out):
                self.scheduler.abort(cid, FINISH_ERROR, parent.error)
        routed: list[RequestOutput] = []
        for slot in slots:
            if isinstance(slot, RequestOutput):
                routed.append(slot)
                continue
            merged = slot.take_output()
            if merged is not None:
                routed.append(merged)
            if slot.finished:
                del self._parents[slot.request_id]
                for cid in slot.child_ids:
                    del self._by_child[cid]
        return routed
