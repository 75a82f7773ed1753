"""Batching by length: every text keeps its own vector whatever the order
and grouping it is embedded in."""

from __future__ import annotations

import numpy as np
import pytest
from llama_index.core.schema import MetadataMode, TextNode
from pydantic import PrivateAttr

from llama_index_hyde_plus.local.embedding import LocalEmbedding, length_batches, usable_cores
from llama_index_hyde_plus.stores.nodes import embed_nodes
from llama_index_hyde_plus.testing import DeterministicEmbedding

LONG = " ".join(
    f"Sentence {i} of a long abstract about cerebral white matter, diffusion tensor "
    "imaging and the development of the newborn brain."
    for i in range(40)
)
MIXED = [
    LONG,
    "short",
    "",
    "A medium length sentence about cells, proteins and how they fold in the membrane.",
    LONG[:700],
    "Vitamin D deficiency and bone density.",
    LONG[:250],
]


def flat(batches: list[list[int]]) -> list[int]:
    return [i for batch in batches for i in batch]


def test_batches_cover_every_text_once_shortest_first() -> None:
    batches = length_batches(MIXED, batch_size=3, max_batch_chars=None)
    assert sorted(flat(batches)) == list(range(len(MIXED)))
    lengths = [len(MIXED[i]) for i in flat(batches)]
    assert lengths == sorted(lengths)
    assert all(1 <= len(b) <= 3 for b in batches)


def test_the_char_budget_puts_long_texts_alone_and_packs_short_ones() -> None:
    texts = ["x" * 10] * 6 + ["y" * 400] * 2 + ["z" * 2000]
    batches = length_batches(texts, batch_size=32, max_batch_chars=100)
    assert [len(b) for b in batches] == [6, 1, 1, 1]
    for batch in batches:
        padded = max(len(texts[i]) for i in batch) * len(batch)
        assert padded <= 100 or len(batch) == 1


def test_unsorted_batches_keep_the_callers_order() -> None:
    batches = length_batches(MIXED, batch_size=2, max_batch_chars=None, sort=False)
    assert batches == [[0, 1], [2, 3], [4, 5], [6]]
    assert length_batches([], batch_size=4, max_batch_chars=10) == []


def test_threads_default_to_the_usable_cores_and_zero_leaves_it_to_onnxruntime() -> None:
    assert LocalEmbedding(model_dir="unused").threads == usable_cores() >= 1
    assert LocalEmbedding(model_dir="unused", threads=0).threads == 0
    assert LocalEmbedding(model_dir="unused", threads=1).threads == 1


class RecordingEmbedding(DeterministicEmbedding):
    """Records the texts of each batch it is asked to embed."""

    _calls: list[list[str]] = PrivateAttr(default_factory=list)

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        self._calls.append(list(texts))
        return super()._get_text_embeddings(texts)


def test_embed_nodes_sorts_by_length_but_gives_each_node_its_own_vector() -> None:
    embed = RecordingEmbedding(dim=64)
    nodes = [TextNode(id_=str(i), text=t) for i, t in enumerate(MIXED)]
    done: list[int] = []
    embed_nodes(nodes, embed, batch_size=3, progress=done.append)
    assert [n.node_id for n in nodes] == [str(i) for i in range(len(MIXED))]  # order kept
    own = [embed.vector(n.get_content(MetadataMode.EMBED)) for n in nodes]
    assert len({tuple(v) for v in own}) == len(MIXED)  # a swap would show
    assert [n.embedding for n in nodes] == own
    sent = [text for call in embed._calls for text in call]
    assert [len(t) for t in sent] == sorted(len(t) for t in MIXED)
    assert sum(done) == len(MIXED)


@pytest.mark.local
def test_one_call_with_mixed_lengths_matches_one_text_at_a_time(
    real_embedding: LocalEmbedding,
) -> None:
    """Sorting and regrouping must not move a vector to another text."""
    model = LocalEmbedding(
        model_dir=real_embedding.model_dir, batch_size=4, max_batch_chars=100_000
    )
    together = np.array(model.get_text_embedding_batch(MIXED))
    alone = np.array([real_embedding.get_text_embedding(t) for t in MIXED])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    # the texts are different enough that a swap could not pass the check above
    cos = alone @ alone.T
    assert (cos[~np.eye(len(MIXED), dtype=bool)] < 0.99).all()


@pytest.mark.local
def test_new_batching_matches_the_old_fixed_batches(real_embedding: LocalEmbedding) -> None:
    old = LocalEmbedding(
        model_dir=real_embedding.model_dir,
        threads=0,
        batch_size=32,
        max_batch_chars=None,
        sort_by_length=False,
    )
    texts = MIXED * 5
    np.testing.assert_allclose(
        np.array(real_embedding.get_text_embedding_batch(texts)),
        np.array(old.get_text_embedding_batch(texts)),
        atol=1e-5,
    )
