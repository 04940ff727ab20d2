"""sat: Show, Attend and Tell image captioning from Python, over the C++ library libsat.so.

    import sat
    captioner = sat.Captioner()                      # the default model, as the sat command picks it
    c = captioner.caption("photo.jpg")               # c.text, c.words, c.logprob, c.attention (words x rows x cols)
    cs = captioner.caption([rgb_array, "b.png"])     # NumPy H x W x 3 uint8 RGB arrays or paths; a list gives a list
    grid = captioner.encode("photo.jpg")             # the encoder's grid: rows x cols x depth float32
    sat.score(["a dog runs"], [["a dog is running", "a brown dog runs"]])   # {"Bleu_1": ..., "CIDEr": ...}
    sat.show_attention(c, "photo.jpg", "dog")        # matplotlib: where the model looked for one word

Problems with an input (a missing or unreadable file, a bad option value) raise sat.Error, a RuntimeError whose str()
is the one line the sat command prints; arguments of the wrong Python type or shape raise TypeError or ValueError.
The computation runs with the GIL released: other Python threads keep running, and one Captioner may be used by
several threads at once.
"""
import numbers
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _sat
from ._sat import Error
from .results import Candidate, Caption, Object
from .plot import attention_overlay, show_attention, show_attention_grid

__all__ = ["Captioner", "Caption", "Candidate", "Object", "Error", "score", "compare", "check_choice", "models_dir",
           "default_model", "show_attention", "show_attention_grid", "attention_overlay"]

Path = Union[str, "os.PathLike[str]"]


def models_dir() -> str:
    """The folder of the models sat ships (flickr8k.sat, flickr8k-inception.sat, synth.sat)."""
    return _sat.models_dir()


def default_model() -> str:
    """The model Captioner() loads: $SAT_MODEL, else flickr8k.sat in models_dir(), as the sat command picks it."""
    return os.environ.get("SAT_MODEL") or os.path.join(models_dir(), "flickr8k.sat")


def _is_path(x: Any) -> bool:
    return isinstance(x, (str, os.PathLike))


def _text(name: str, value: Any) -> str:
    if not _is_path(value):
        raise TypeError(f"{name}: expected a str or a path, got {type(value).__name__}")
    return os.fspath(value)


def _int(name: str, value: Any) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    return int(value)


def _real(name: str, value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    return float(value)


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected True or False, got {type(value).__name__}")
    return bool(value)


def _pixels(a: np.ndarray, name: str) -> np.ndarray:
    if a.dtype != np.uint8:
        raise TypeError(f"{name}: pixels must be uint8 (0..255), got {a.dtype}; a float image in [0, 1] is "
                        "(a * 255).round().astype(numpy.uint8)")
    if not (a.ndim == 2 or (a.ndim == 3 and a.shape[2] in (3, 4))):
        raise ValueError(f"{name}: expected H x W x 3 (RGB), H x W x 4 (RGBA) or H x W (grey) pixels, got shape "
                         f"{a.shape}")
    # A C-contiguous array is read in place; a view of another layout (a crop, a transpose) is copied once here.
    return np.ascontiguousarray(a)


def _images(x: Any) -> Tuple[str, list, bool]:
    """x as ("files" or "arrays", the items, whether x was a single image)."""
    if _is_path(x):
        return "files", [os.fspath(x)], True
    if isinstance(x, np.ndarray):
        return "arrays", [_pixels(x, "image")], True
    if isinstance(x, (list, tuple)):
        if all(_is_path(i) for i in x):
            return "files", [os.fspath(i) for i in x], False
        if all(isinstance(i, np.ndarray) for i in x):
            return "arrays", [_pixels(a, f"image[{k}]") for k, a in enumerate(x)], False
        kinds = sorted({type(i).__name__ for i in x})
        raise TypeError("a batch is a list of paths or a list of NumPy arrays, got " + ", ".join(kinds))
    raise TypeError("expected an image path, a NumPy H x W x 3 uint8 RGB array, or a list of either; got "
                    f"{type(x).__name__}")


class Captioner:
    """A caption model loaded once, for any number of images and threads.

    model: a model file (None: default_model()); weights_dir: where to look first for encoder weights the model names
    but does not hold (then $SAT_WEIGHTS, then the installed models folder, or ../shared/models beside a checkout);
    precision: the encoder's arithmetic, "f32", "bf16", "int8" or "auto" (None: the model's stored choice); threads:
    the cores the network uses (0: all, or $OMP_NUM_THREADS)."""

    def __init__(self, model: Optional[Path] = None, weights_dir: Optional[Path] = None,
                 precision: Optional[str] = None, threads: int = 0):
        self.model = default_model() if model is None else _text("model", model)
        weights = "" if weights_dir is None else _text("weights_dir", weights_dir)
        if precision is not None and not isinstance(precision, str):
            raise TypeError(f"precision: expected a str, got {type(precision).__name__}")
        self._c = _sat.Captioner(self.model, weights, precision or "", _int("threads", threads))
        #: what the model file holds: input_size, grid_rows, grid_cols, vocabulary, attention, the stored search
        #: settings (beam, length_norm, ...) and encoder_precision
        self.info: Dict[str, Any] = self._c.info()

    def __repr__(self) -> str:
        return f"sat.Captioner({self.model!r})"

    def caption(self, x, *, beam: Optional[int] = None, length_norm: Optional[float] = None,
                no_repeat_ngram: Optional[int] = None, consensus_weight: Optional[float] = None,
                memory_candidates: Optional[int] = None, object_evidence: Optional[float] = None,
                evidence_threshold: Optional[float] = None, neighbour_evidence: Optional[float] = None,
                beam_evidence: Optional[float] = None, relevance_weight: Optional[float] = None,
                beam_groups: Optional[int] = None,
                diversity: Optional[float] = None, include: Optional[str] = None, candidates: int = 0,
                attention: bool = True, objects: bool = False,
                object_threshold: float = 0.3, allow_damaged: bool = False) -> Union[Caption, List[Caption]]:
        """Captions an image (a path, or a NumPy H x W x 3 uint8 RGB array) or a list of them (a list of Captions,
        in order; a batch is encoded together, faster per image).

        Unset search settings take the model's stored ones (self.info). beam: 1 is greedy; length_norm: the beam ranks
        by logprob / words ** length_norm; no_repeat_ngram: never repeat an n-word phrase; consensus_weight and
        memory_candidates: consensus reranking by the nearest training photos' captions; object_evidence and
        evidence_threshold: the detector's evidence in reranking (a model that reads it); neighbour_evidence: the share
        of each object's evidence taken from the nearest memory photos' captions (0..1); beam_evidence: the same
        evidence steering the beam toward captions naming what the photo likely holds (0: off); relevance_weight: the
        caption's relevance to the image in the caption memory's CCA space, in reranking; beam_groups and diversity:
        diverse beam search; include: a word the caption must say; candidates: also return the search's N best;
        attention: fill Caption.attention (and glimpses); objects: the COCO objects found, each class peaking at or
        above object_threshold; allow_damaged: caption an image file whose data is cut short or corrupt (a JPEG
        whose scan ends early, a PNG chunk failing its CRC) as its decoder fills it in, where by default it is a
        sat.Error naming the file and the damage."""
        o = _sat.CaptionOptions()
        o.beam = _int("beam", beam)
        o.length_norm = _real("length_norm", length_norm)
        o.no_repeat_ngram = _int("no_repeat_ngram", no_repeat_ngram)
        o.consensus_weight = _real("consensus_weight", consensus_weight)
        o.memory_candidates = _int("memory_candidates", memory_candidates)
        o.object_evidence = _real("object_evidence", object_evidence)
        o.evidence_threshold = _real("evidence_threshold", evidence_threshold)
        o.neighbour_evidence = _real("neighbour_evidence", neighbour_evidence)
        o.beam_evidence = _real("beam_evidence", beam_evidence)
        o.relevance_weight = _real("relevance_weight", relevance_weight)
        o.beam_groups = _int("beam_groups", beam_groups)
        o.diversity = _real("diversity", diversity)
        o.include = "" if include is None else _text("include", include)
        o.candidates = _int("candidates", candidates)
        o.attention = _bool("attention", attention)
        o.objects = _bool("objects", objects)
        o.object_threshold = _real("object_threshold", object_threshold)
        o.allow_damaged = _bool("allow_damaged", allow_damaged)
        kind, items, single = _images(x)
        if kind == "files":
            found = self._c.caption_files(items, o)
            captions = [Caption._from(d, path) for d, path in zip(found, items)]
        else:
            captions = [Caption._from(d, None) for d in self._c.caption_arrays(items, o)]
        return captions[0] if single else captions

    def encode(self, x) -> Union[np.ndarray, List[np.ndarray]]:
        """The encoder's grid the captions of the same images are searched over: float32, rows x cols x depth (a
        list of them for a list of images)."""
        kind, items, single = _images(x)
        grids = self._c.encode_files(items) if kind == "files" else self._c.encode_arrays(items)
        return grids[0] if single else grids


def _caption_text(c: Any, name: str) -> str:
    if isinstance(c, Caption):
        return c.text
    if isinstance(c, str):
        return c
    raise TypeError(f"{name}: expected a caption (str or sat.Caption), got {type(c).__name__}")


def _reference_list(refs: Any, name: str) -> List[str]:
    if isinstance(refs, str) or not isinstance(refs, Sequence):
        raise TypeError(f"{name}: expected a list of reference captions, got {type(refs).__name__}")
    for r in refs:
        if not isinstance(r, str):
            raise TypeError(f"{name}: reference captions are str, got {type(r).__name__}")
    return list(refs)


def compare(results: Path, baseline: Path, references: Path, resamples: int = 2000, seed: int = 1) -> Dict:
    """Is `results` better than `baseline` (two COCO results files of the same images), or is the difference the luck
    of which images were scored? The paired bootstrap, as `sat eval --results R --baseline B --refs F --json` prints
    it: the image set drawn again `resamples` times, and for each metric (Bleu_4, METEOR, ROUGE_L, CIDEr) in
    "metrics": baseline, candidate, difference, the 95% interval of the resampled differences (low, high) and the
    share of draws not ahead (share_not_above_zero); with how many images' CIDEr-D rose, fell or stayed."""
    for name, value in (("results", results), ("baseline", baseline), ("references", references)):
        if not _is_path(value):
            raise TypeError(f"{name}: expected a file path, got {type(value).__name__}")
    if isinstance(resamples, bool) or not isinstance(resamples, int):
        raise TypeError(f"resamples: expected an int, got {type(resamples).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise TypeError("seed: expected a non-negative int")
    return _sat.compare_files(os.fspath(results), os.fspath(baseline), os.fspath(references), resamples, seed)


def check_choice(results: Sequence[Path], references: Path, by: str = "Bleu_4", splits: int = 200,
                 seed: int = 1) -> Dict:
    """Does choosing the best of several COCO results files of the same images (several settings scored on dev, say)
    hold on images the choice was not made on? As `sat eval --choose-among R1 R2 ... --refs F --by M --json` prints
    it: the images split into two random halves `splits` times, the file best by `by` (Bleu_4, METEOR, ROUGE_L,
    CIDEr or rarer_named) chosen on one half and scored on the other (chosen_own_half, chosen_other_half), beside
    the median file there (median_other_half); how much the choice's own half overstates it ("overstated": mean,
    low, high: the central 90%); and per file ("systems") its name, its score on all the images and how often it
    was chosen."""
    if isinstance(results, (str, bytes)) or _is_path(results) or not isinstance(results, Sequence):
        raise TypeError(f"results: expected a list of file paths, got {type(results).__name__}")
    for value in results:
        if not _is_path(value):
            raise TypeError(f"results: expected file paths, got {type(value).__name__}")
    if not _is_path(references):
        raise TypeError(f"references: expected a file path, got {type(references).__name__}")
    if not isinstance(by, str):
        raise TypeError(f"by: expected a metric name (str), got {type(by).__name__}")
    if isinstance(splits, bool) or not isinstance(splits, int):
        raise TypeError(f"splits: expected an int, got {type(splits).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise TypeError("seed: expected a non-negative int")
    return _sat.check_choice_files([os.fspath(r) for r in results], os.fspath(references), by, splits, seed)


def score(results, references) -> Dict[str, float]:
    """The coco-caption metrics, as `sat eval` computes and names them: Bleu_1..Bleu_4, METEOR (approximated:
    exact, stem and synonym stages; left out when WordNet is not installed), ROUGE_L, CIDEr (CIDEr-D), with images
    and length_ratio (caption words / closest reference words).

    results and references as lists: results[i] (a str or a sat.Caption) against references[i] (a list of str).
    As dicts: {image: caption} against {image: [captions]}. references as a file (COCO captions JSON, Flickr8k's
    captions.csv, or a data folder holding either): results is a COCO results file ([{"image_id", "caption"}]), a
    dict {image file name or COCO id: caption}, or a list of Captions of files (named by their file names)."""
    if _is_path(references):
        references = os.fspath(references)
        if _is_path(results):
            return _sat.score_files(os.fspath(results), references)
        if isinstance(results, dict):
            pairs = [(str(k), _caption_text(v, f"results[{k!r}]")) for k, v in results.items()]
        elif isinstance(results, (list, tuple)):
            pairs = []
            for i, c in enumerate(results):
                if not isinstance(c, Caption) or c.source is None:
                    raise TypeError(f"results[{i}]: scored against a references file, a list holds Captions of "
                                    "files (to name their images); pass {image: caption} otherwise")
                pairs.append((os.path.basename(c.source), c.text))
        else:
            raise TypeError(f"results: expected a results file, a dict or a list, got {type(results).__name__}")
        return _sat.score_images([p[0] for p in pairs], [p[1] for p in pairs], references)
    if isinstance(results, dict):
        if not isinstance(references, dict):
            raise TypeError("results is a dict: references must be a dict {image: [captions]} or a file")
        missing = [k for k in results if k not in references]
        if missing:
            raise ValueError(f"references: no captions for image {missing[0]!r}")
        keys = list(results)
        return _sat.score([_caption_text(results[k], f"results[{k!r}]") for k in keys],
                          [_reference_list(references[k], f"references[{k!r}]") for k in keys])
    if isinstance(results, (list, tuple)) and isinstance(references, (list, tuple)):
        return _sat.score([_caption_text(c, f"results[{i}]") for i, c in enumerate(results)],
                          [_reference_list(r, f"references[{i}]") for i, r in enumerate(references)])
    raise TypeError("score(results, references): lists, dicts, or a references file; got "
                    f"{type(results).__name__} and {type(references).__name__}")
