"""`Rocchio`: vector pseudo-relevance feedback, the expansion that needs no LLM."""

from __future__ import annotations

from typing import ClassVar

from .._checks import check_int, validate_query
from .base import (
    Guards,
    QueryTransformer,
    TransformResult,
    check_feedback_weight,
)


class Rocchio(QueryTransformer):
    """Search with ``unit(alpha * e(question) + beta * mean(e(top-k documents)))``.

    The question is searched first; the vectors of its top ``k`` hits (read from the
    FAISS index or Milvus collection, re-embedded only when the store cannot return
    them) pull the search vector towards the collection's own wording. No LLM, no
    cost: the free baseline a generated expansion has to beat (pyserini's dense
    Rocchio PRF). On a hybrid store the keyword side keeps the question as asked.

    Carried out by `TransformRetriever` (which has the embedder and the hits); on its
    own, ``transform()`` returns the question unchanged.
    """

    method: ClassVar[str] = "rocchio"
    include_query = True
    DEFAULT_K: ClassVar[int] = 5
    DEFAULT_ALPHA: ClassVar[float] = 1.0
    DEFAULT_BETA: ClassVar[float] = 0.1

    def __init__(
        self, *, k: int | None = None, alpha: float | None = None, beta: float | None = None
    ) -> None:
        super().__init__()
        k = self.DEFAULT_K if k is None else k
        alpha = self.DEFAULT_ALPHA if alpha is None else alpha
        beta = self.DEFAULT_BETA if beta is None else beta
        check_int(k, "k", 1, 100)
        alpha = check_feedback_weight(alpha, "alpha")
        beta = check_feedback_weight(beta, "beta")
        if alpha == 0 and beta == 0:
            raise ValueError("alpha and beta cannot both be 0")
        self.k, self.alpha, self.beta = k, alpha, beta
        self.guards = Guards(feedback_k=k, feedback_alpha=self.alpha, feedback_beta=self.beta)

    def transform(self, query: str) -> TransformResult:
        """The question itself: `TransformRetriever` does the feedback, from the question's
        own top ``k`` hits (the transform's `guards`)."""
        validate_query(query)
        return TransformResult(query=query, method=self.method, queries=())

    async def atransform(self, query: str) -> TransformResult:
        """`transform`: no I/O, so it runs on the event loop."""
        return self.transform(query)
