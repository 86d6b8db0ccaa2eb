"""Hybrid search over the bundled audit corpus: BM25 + vector embeddings, fused with RRF.

- keyword side: `bm25s` (BM25 over sparse matrices) with the Snowball English
  stemmer from `PyStemmer`;
- vector side: `model2vec` static embeddings, using the model that the
  `tokenlearn-static-model` package ships inside its wheel (a Model2Vec-format
  model: tokenizer, 64-dimension int8 vectors) -- it loads from site-packages,
  never from a model hub;
- fusion: reciprocal rank fusion (Cormack et al., 2009): a document's score is
  the sum over the two rankings of ``1 / (k + rank)``, with the usual k = 60.

All three come with ``pip install -e '.[examples]'``. They are imported on first
use, so ``interlock validate`` and ``interlock graph`` do not need them, and the
index (with the embedding model, a few seconds to load) is built once per process.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CORPUS_FILE = Path(__file__).parent / "corpus.json"
RRF_K = 60
EXTRA_HINT = "the audit example's retrieval needs: pip install -e '.[examples]'"


def corpus() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = json.loads(CORPUS_FILE.read_text())
    return docs


def _doc_text(doc: dict[str, Any]) -> str:
    return f"{doc['title']}. {doc['text']}"


@dataclass(frozen=True)
class Hit:
    doc: str
    title: str
    kind: str
    rrf: float
    bm25_rank: int | None  # 1-based; None: not among the keyword side's candidates
    vector_rank: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"doc": self.doc, "title": self.title, "kind": self.kind,
                "rrf": round(self.rrf, 6), "bm25_rank": self.bm25_rank,
                "vector_rank": self.vector_rank}


def rrf(rankings: list[list[str]], k: int = RRF_K) -> dict[str, float]:
    """Reciprocal rank fusion of several rankings (each a list of ids, best first)."""
    fused: dict[str, float] = {}
    for ranking in rankings:
        for rank, doc_id in enumerate(ranking, start=1):
            fused[doc_id] = fused.get(doc_id, 0.0) + 1.0 / (k + rank)
    return fused


class HybridIndex:
    """A BM25 index and an embedding matrix over the same documents."""

    def __init__(self, docs: list[dict[str, Any]]) -> None:
        try:
            import bm25s
            import numpy as np
            import Stemmer
            from model2vec import StaticModel
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ImportError(f"{exc}; {EXTRA_HINT}") from exc
        self._bm25s = bm25s
        self._np = np
        self.docs = docs
        self.ids = [d["id"] for d in docs]
        texts = [_doc_text(d) for d in docs]
        self._stemmer = Stemmer.Stemmer("english")
        self._bm25 = bm25s.BM25()
        self._bm25.index(self._tokenize(texts), show_progress=False)
        self._model = StaticModel.from_pretrained(str(embedding_model_dir()))
        self._vectors = self._model.encode(texts)  # normalized rows: dot product = cosine

    def _tokenize(self, texts: list[str]) -> Any:
        return self._bm25s.tokenize(texts, stopwords="en", stemmer=self._stemmer,
                                    show_progress=False)

    def keyword_ranking(self, query: str, n: int) -> list[str]:
        """Documents sharing at least one (stemmed, non-stop) term with the query, best first."""
        docs, scores = self._bm25.retrieve(self._tokenize([query]), k=len(self.ids),
                                           show_progress=False)
        return [self.ids[i] for i, s in zip(docs[0], scores[0], strict=True) if s > 0][:n]

    def vector_ranking(self, query: str, n: int) -> list[str]:
        """The n documents nearest to the query by cosine similarity."""
        q = self._model.encode([query])[0]
        sims = self._vectors @ q
        order = self._np.argsort(-sims, kind="stable")
        return [self.ids[i] for i in order[:n]]

    def search(self, query: str, *, top_k: int = 3, candidates: int = 5) -> list[Hit]:
        """The top_k documents by RRF over each side's first ``candidates`` results."""
        keyword = self.keyword_ranking(query, candidates)
        vector = self.vector_ranking(query, candidates)
        fused = rrf([keyword, vector])
        by_id = {d["id"]: d for d in self.docs}
        # ties (same fused score) break by id, so the result never depends on dict order
        best = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))[:top_k]
        return [Hit(doc=doc_id, title=by_id[doc_id]["title"], kind=by_id[doc_id]["kind"],
                    rrf=score,
                    bm25_rank=keyword.index(doc_id) + 1 if doc_id in keyword else None,
                    vector_rank=vector.index(doc_id) + 1 if doc_id in vector else None)
                for doc_id, score in best]


def embedding_model_dir() -> Path:
    """The Model2Vec model directory shipped inside the tokenlearn-static-model wheel."""
    from importlib.resources import files

    try:
        path = Path(str(files("static_model") / "model"))
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the install
        raise ImportError(f"{exc}; {EXTRA_HINT} (the model's package, tokenlearn-static-model, "
                          "has wheels for Linux x86-64 only)") from exc
    return path


@functools.cache
def index() -> HybridIndex:
    """The bundled corpus's index, built once per process (the model load is the slow part)."""
    return HybridIndex(corpus())
