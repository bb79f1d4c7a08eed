"""A search tool over a local corpus: the web archetype of tool use, offline.

A web-search agent asks a search engine, reads the snippets it returns and answers from
them. Here the engine is BM25 over a small bundled corpus (search_corpus.jsonl, next to
this file), so a run is deterministic, needs no network and its answers can be checked:
the corpus is a generated gazetteer of invented towns, each document one town's numbers:

    "Vornak has 12 towers, 7 bridges and 30 wells. Vornak lies east of Tesh."

BM25 (Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond", 2009)
scores a document d for a query q as

    score(q, d) = Σ_{t ∈ q} idf(t) · tf(t, d) · (k1 + 1) / (tf(t, d) + k1 · (1 − b + b · |d| / avgdl))
    idf(t)      = ln(1 + (N − df(t) + 0.5) / (df(t) + 0.5))

tf the term's count in d, |d| its length in terms, avgdl the mean length, N the documents,
df(t) how many hold t. k1 = 1.5 and b = 0.75 are the common defaults: k1 saturates a term's
repeats (the second "Vornak" counts, the tenth barely), b discounts long documents. A town's
own document names it twice and its neighbour's once, so a query for the town ranks its own
document first and the neighbour's second (tests/test_joint_rewards.py asserts the ranks).

    index = SearchIndex.load()                 # the bundled corpus
    index.search("Vornak", k=2)                -> [(doc id, score), ...] best first
    registry = ToolRegistry([search_tool(index), calculator_tool()])
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

from posttrain.envs.tools import Tool

CORPUS_PATH = Path(__file__).with_name("search_corpus.jsonl")
CORPUS_TOWNS, CORPUS_SEED = 1000, 0  # what search_corpus.jsonl was generated with (write_corpus)
ATTRIBUTES = ("towers", "bridges", "wells")
TERM = re.compile(r"[a-z0-9]+")


def terms(text: str) -> list[str]:
    """The index terms of a text: lower-cased runs of letters and digits."""
    return TERM.findall(text.lower())


class SearchIndex:
    """BM25 over a list of documents, with an inverted index: a query reads only the postings
    of its own terms, not every document (module docstring)."""

    def __init__(self, documents: list[str], k1: float = 1.5, b: float = 0.75):
        if not documents:
            raise ValueError("a SearchIndex needs at least one document")
        self.documents, self.k1, self.b = list(documents), k1, b
        counts = [Counter(terms(doc)) for doc in self.documents]
        self.lengths = [sum(c.values()) for c in counts]
        self.avgdl = sum(self.lengths) / len(self.lengths)
        self.postings: dict[str, list[tuple[int, int]]] = {}  # term -> [(doc id, tf), ...]
        for doc_id, count in enumerate(counts):
            for term, tf in count.items():
                self.postings.setdefault(term, []).append((doc_id, tf))
        n = len(self.documents)
        self.idf = {t: math.log(1 + (n - len(p) + 0.5) / (len(p) + 0.5)) for t, p in self.postings.items()}

    @classmethod
    def load(cls, path: str | Path = CORPUS_PATH) -> SearchIndex:
        """The index of a JSONL corpus of {"id", "text"} records (the bundled one by default)."""
        return cls([json.loads(line)["text"] for line in Path(path).read_text(encoding="utf-8").splitlines()])

    def search(self, query: str, k: int = 1) -> list[tuple[int, float]]:
        """The k best documents for `query` as (doc id, BM25 score), best first; ties go to
        the lower doc id. Documents sharing no term with the query are never returned."""
        scores: dict[int, float] = {}
        for term in set(terms(query)):
            for doc_id, tf in self.postings.get(term, []):
                norm = self.k1 * (1 - self.b + self.b * self.lengths[doc_id] / self.avgdl)
                scores[doc_id] = scores.get(doc_id, 0.0) + self.idf[term] * tf * (self.k1 + 1) / (tf + norm)
        return sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:k]

    def snippets(self, query: str, k: int = 1) -> str:
        """What the search tool returns: the k best documents' text, joined by " | ";
        a query that matches nothing says so (an answer, not an error: the model may rephrase)."""
        hits = self.search(query, k)
        if not hits:
            return f"no document matches {query[:60]!r}"
        return " | ".join(self.documents[doc_id] for doc_id, _ in hits)


def search_tool(index: SearchIndex, top_k: int = 1) -> Tool:
    """`search(query)`: the top_k documents of `index` for the query. One document by default:
    every snippet is context the model must read, and a town's own document ranks first."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be an int >= 1, got {top_k!r}")

    def search(query: str) -> str:
        return index.snippets(query, top_k)

    return Tool("search", f"Search the local gazetteer; returns the {top_k} best matching document(s).",
                {"type": "object", "properties": {"query": {"type": "string", "description": "words to look up"}},
                 "required": ["query"], "additionalProperties": False}, search)


# --- the corpus: a gazetteer of invented towns -------------------------------------------------

SYLLABLES = ["ba", "do", "fe", "ga", "ki", "lo", "ma", "ne", "pu", "ra", "si", "ta", "vo", "ze", "ku", "ri",
             "sa", "te", "no", "li"]
CODAS = ["", "n", "k", "r", "sh", "l", "m", "th"]


def town_name(rng: random.Random) -> str:
    return ("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))) + rng.choice(CODAS)).capitalize()


def town_numbers(rng: random.Random) -> dict[str, int]:
    """Three distinct counts in 2..60, none the sum or product of the other two: a number copied
    from the snippet is then never the answer to a question about two of them (envs/search_qa.py)."""
    while True:
        values = rng.sample(range(2, 61), 3)
        if not any(v == x + y or v == x * y for v, (x, y) in
                   ((values[i], [values[j] for j in range(3) if j != i]) for i in range(3))):
            return dict(zip(ATTRIBUTES, values))


def generate_corpus(towns: int = CORPUS_TOWNS, seed: int = CORPUS_SEED) -> list[dict[str, Any]]:
    """`towns` documents, {"id", "name", "text", towers, bridges, wells, "neighbour"}, the same
    for the same arguments on every machine. Names are unique."""
    rng = random.Random(seed)
    names: list[str] = []
    while len(names) < towns:
        name = town_name(rng)
        if name not in names:
            names.append(name)
    records = []
    for i, name in enumerate(names):
        numbers = town_numbers(rng)
        neighbour = names[(i + rng.randint(1, towns - 1)) % towns]
        text = (f"{name} has {numbers['towers']} towers, {numbers['bridges']} bridges and {numbers['wells']} wells. "
                f"{name} lies {rng.choice(['east', 'west', 'north', 'south'])} of {neighbour}.")
        records.append({"id": i, "name": name, "text": text, **numbers, "neighbour": neighbour})
    return records


def write_corpus(path: str | Path = CORPUS_PATH) -> None:
    """(Re)write the bundled corpus (a test holds the file to generate_corpus())."""
    lines = [json.dumps(record, sort_keys=True) for record in generate_corpus()]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
