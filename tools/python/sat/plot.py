"""Where the model looked, drawn with matplotlib: the look every sat front end shares (sat attend, the HTML report, the
web page). The photo keeps its aspect ratio; a word's weights are upsampled bilinearly to it and divided by their
maximum (v in [0, 1]); the inferno colour of v is blended over the photo with alpha 0.65 v, so places the word hardly
looked at show the photo untouched; a key runs from 0 to the map's largest weight, as a percent of the word's
attention; hard attention's glimpse is outlined on its grid cell.

matplotlib is imported when a drawing is asked for, so `import sat` works without it."""
import os
import re
from typing import Union

import numpy as np

from .results import Caption

OPACITY = 0.65  # alpha where a word's attention peaks


def _photo(image) -> np.ndarray:
    """The photo as H x W x 3 floats in [0, 1]: a path (read by matplotlib) or an array (uint8 or floats in [0, 1])."""
    if isinstance(image, (str, os.PathLike)):
        import matplotlib.image
        a = matplotlib.image.imread(os.fspath(image))
    elif isinstance(image, np.ndarray):
        a = image
    else:
        raise TypeError(f"image: expected a path or a NumPy array, got {type(image).__name__}")
    if not (a.ndim == 2 or (a.ndim == 3 and a.shape[2] in (3, 4))) or a.shape[0] == 0 or a.shape[1] == 0:
        raise ValueError(f"image: expected H x W x 3, H x W x 4 or H x W pixels, got shape {a.shape}")
    a = a.astype(np.float32) / 255 if a.dtype == np.uint8 else np.clip(a.astype(np.float32), 0, 1)
    if a.ndim == 2:
        a = np.repeat(a[:, :, None], 3, axis=2)
    return a[:, :, :3]


def _linear_axis(n_out: int, n_in: int):
    # Pixel centres mapped onto cell centres, clamped at the edges: OpenCV's INTER_LINEAR, as sat attend resizes.
    src = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
    i0 = np.floor(src).astype(np.int64)
    return i0, np.minimum(i0 + 1, n_in - 1), (src - i0).astype(np.float32)


def upsample(grid: np.ndarray, height: int, width: int) -> np.ndarray:
    """A rows x cols map resized bilinearly to height x width (the grid covers the whole photo)."""
    r0, r1, fr = _linear_axis(height, grid.shape[0])
    c0, c1, fc = _linear_axis(width, grid.shape[1])
    rows = grid[r0] * (1 - fr)[:, None] + grid[r1] * fr[:, None]
    return rows[:, c0] * (1 - fc) + rows[:, c1] * fc


def _weights(result: Caption, word: Union[int, str]):
    if not isinstance(result, Caption):
        raise TypeError(f"result: expected a sat.Caption, got {type(result).__name__}")
    if result.attention is None:
        raise ValueError(f"{result.text!r} has no attention maps: caption with attention=True, with a model that "
                         "attends")
    k = result.word_index(word)
    return k, np.asarray(result.attention[k], dtype=np.float32)


def attention_overlay(result: Caption, image, word: Union[int, str]) -> np.ndarray:
    """The photo with one word's attention blended over it: H x W x 3 floats in [0, 1], the photo's own size."""
    import matplotlib
    _, grid = _weights(result, word)
    photo = _photo(image)
    up = upsample(grid, photo.shape[0], photo.shape[1])
    top = float(up.max())
    v = up / top if top > 0 else np.zeros_like(up)
    heat = matplotlib.colormaps["inferno"](v)[:, :, :3].astype(np.float32)
    alpha = (OPACITY * v)[:, :, None]
    return photo * (1 - alpha) + heat * alpha


def _highlighted(words, k: int) -> str:
    def plain(w):
        return w.replace("$", r"\$")
    w = words[k]
    marked = r"$\bf{" + w + "}$" if re.fullmatch(r"[A-Za-z0-9]+", w) else "[" + plain(w) + "]"
    return " ".join(marked if i == k else plain(x) for i, x in enumerate(words))


def show_attention(result: Caption, image, word: Union[int, str], ax=None, title: bool = True,
                   key_location: str = "right"):
    """Draws where the model looked while saying `word` (an index into result.words, or the word itself) over the
    photo (`image`: the path or the array that was captioned) on a matplotlib Axes (a new figure when ax is None).
    Returns (figure, axes)."""
    import matplotlib.pyplot as plt
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.patches import Rectangle

    k, grid = _weights(result, word)
    blended = attention_overlay(result, image, k)
    if ax is None:
        height, width = blended.shape[:2]
        fig, ax = plt.subplots(figsize=(6.4, 5.2 * height / width + 1.0), layout="constrained")
    fig = ax.figure
    ax.imshow(blended, interpolation="bilinear")  # aspect "equal": the photo is never squashed
    ax.set_axis_off()
    if result.glimpses is not None and k < len(result.glimpses):
        rows, cols = grid.shape
        cell_h, cell_w = blended.shape[0] / rows, blended.shape[1] / cols
        r, c = (int(x) for x in result.glimpses[k])
        for colour, width in (("black", 3.5), ("white", 1.8)):  # a white outline with a dark rim shows on any photo
            ax.add_patch(Rectangle((c * cell_w - 0.5, r * cell_h - 0.5), cell_w, cell_h, fill=False,
                                   edgecolor=colour, linewidth=width))
    if title:
        ax.set_title(_highlighted(result.words, k), wrap=True)
    top = 100 * float(grid.max())
    key = fig.colorbar(ScalarMappable(Normalize(0, top), cmap="inferno"), ax=ax, location=key_location,
                       fraction=0.046, pad=0.03)
    key.set_ticks([0, top])
    key.set_ticklabels(["0%", f"{top:.1f}%"])
    key.set_label("share of the word's attention")
    return fig, ax


def show_attention_grid(result: Caption, image, columns: int = 4):
    """One panel per word of the caption (each drawn as show_attention draws it, its key under it), the caption as the
    figure's title. Returns the figure."""
    import matplotlib.pyplot as plt

    if isinstance(columns, bool) or not isinstance(columns, (int, np.integer)) or columns < 1:
        raise ValueError(f"columns: expected a positive int, got {columns!r}")
    _weights(result, 0)
    photo = _photo(image)
    n = len(result.words)
    cols = min(int(columns), n)
    rows = (n + cols - 1) // cols
    aspect = photo.shape[0] / photo.shape[1]
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, (3.2 * aspect + 1.0) * rows + 0.4), squeeze=False,
                             layout="constrained")
    for k, ax in enumerate(axes.flat):
        if k < n:
            show_attention(result, photo, k, ax=ax, title=False, key_location="bottom")
            ax.set_title(result.words[k])
        else:
            ax.set_axis_off()
    fig.suptitle(result.text)
    return fig
