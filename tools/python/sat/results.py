"""What sat.Captioner.caption returns: one Caption per image, with the search's candidates and the objects found."""
from dataclasses import dataclass, field
from typing import List, Optional, Union

import numpy as np


@dataclass
class Candidate:
    """A caption the search considered (caption(..., candidates=N)): why the kept one was kept."""
    text: str
    rank: int           # 1: the best score
    logprob: float      # natural log of its probability, its end included (as Caption.logprob)
    score: float        # what the beam ranks by: logprob / (words + 1) ** length_norm
    agreement: float    # consensus reranking: CIDEr-D against the nearest training photos' captions (else 0)
    object_evidence: float  # the detector's evidence for the objects it names (caption(..., object_evidence=V))
    relevance: float    # its words' relevance to the image (caption(..., relevance_weight=R); else 0)
    total: float        # score + consensus weight * agreement + V * object_evidence + R * relevance: the kept one's
    # is the highest
    chosen: bool        # the caption returned
    memory_photo: int   # -1: from the beam; else a caption of this caption-memory photo


@dataclass
class Object:
    """A COCO object found in the image (caption(..., objects=True)): its class, its peak heat, and where that peak
    is (x, y: fractions of the image's width and height)."""
    name: str
    score: float
    x: float
    y: float


@dataclass(repr=False)
class Caption:
    """One image's caption.

    attention: float32, words x rows x cols: each word's weights over the encoder's grid (which covers the whole
    image: cell (r, c) is rows r/rows..(r+1)/rows of its height), summing to 1; None when not asked for or when the
    model has no attention. glimpses: int32, words x 2, the (row, col) hard attention read each word from (None for
    soft attention)."""
    text: str
    words: List[str]
    logprob: float  # natural log of the caption's probability under the model, its end included
    attention: Optional[np.ndarray] = None
    glimpses: Optional[np.ndarray] = None
    candidates: List[Candidate] = field(default_factory=list)
    objects: List[Object] = field(default_factory=list)
    source: Optional[str] = None  # the file it was read from; None for an array

    @classmethod
    def _from(cls, d: dict, source: Optional[str]) -> "Caption":
        return cls(text=d["text"], words=list(d["words"]), logprob=d["logprob"], attention=d.get("attention"),
                   glimpses=d.get("glimpses"), candidates=[Candidate(**c) for c in d["candidates"]],
                   objects=[Object(*o) for o in d["objects"]], source=source)

    def word_index(self, word: Union[int, str]) -> int:
        """The position of `word` in the caption: an index (negative counts from the end) or the word itself (its
        first occurrence)."""
        if isinstance(word, str):
            if word not in self.words:
                raise ValueError(f"{word!r} is not a word of the caption {self.text!r}")
            return self.words.index(word)
        if isinstance(word, (bool, np.bool_)) or not isinstance(word, (int, np.integer)):
            raise TypeError(f"word: expected an index or a word of the caption, got {type(word).__name__}")
        n = len(self.words)
        if not -n <= word < n:
            raise IndexError(f"word {word}: the caption {self.text!r} has {n} words")
        return int(word) % n

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        parts = [repr(self.text), f"logprob={self.logprob:.3f}"]
        if self.attention is not None:
            parts.append(f"attention={self.attention.shape}")
        if self.glimpses is not None:
            parts.append(f"glimpses={len(self.glimpses)}")
        if self.candidates:
            parts.append(f"candidates={len(self.candidates)}")
        if self.objects:
            parts.append("objects=[" + ", ".join(f"{o.name} {o.score:.2f}" for o in self.objects) + "]")
        if self.source is not None:
            parts.append(f"source={self.source!r}")
        return "Caption(" + ", ".join(parts) + ")"
