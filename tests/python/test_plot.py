"""The matplotlib helpers draw the look every front end shares (Agg backend, no display)."""
import io

import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.patches import Rectangle

import sat
from sat.plot import upsample


@pytest.fixture(scope="module")
def scene(synth, repo):
    path = repo / "examples" / "scene.png"
    return synth.caption(path), path


def test_upsample_is_bilinear_over_the_whole_photo():
    grid = np.array([[0, 1], [2, 3]], np.float32)
    up = upsample(grid, 4, 6)
    assert up.shape == (4, 6)
    assert up[0, 0] == 0 and up[-1, -1] == 3  # the corners are the corner cells' own weights (clamped)
    # OpenCV's INTER_LINEAR: pixel x samples cell (x + 0.5) * 2 / 6 - 0.5; row 1 samples row 0.25: [0.5, 1.5]
    np.testing.assert_allclose(up[1, :], [0.5, 0.5, 0.5 + 1 / 3, 0.5 + 2 / 3, 1.5, 1.5], atol=1e-6)


def test_overlay_leaves_unattended_places_untouched(scene):
    c, path = scene
    photo = matplotlib.image.imread(str(path))[:, :, :3]
    k = c.words.index("cross")
    out = sat.attention_overlay(c, path, "cross")
    assert out.shape == photo.shape
    up = upsample(c.attention[k], *photo.shape[:2])
    v = up / up.max()
    calm, peak = v < 0.02, np.unravel_index(np.argmax(v), v.shape)
    # alpha 0.65 v: where the word hardly looked the photo shows within 0.65 * 0.02 of itself; at the peak, 65% heat
    assert np.abs(out - photo)[calm].max() <= 0.65 * 0.02 + 1e-5
    heat = matplotlib.colormaps["inferno"](1.0)[:3]
    np.testing.assert_allclose(out[peak], 0.35 * photo[peak] + 0.65 * np.array(heat), atol=1e-5)


def test_show_attention_draws_a_figure(scene):
    c, path = scene
    fig, ax = sat.show_attention(c, path, "cross")
    assert "cross" in ax.get_title() and r"\bf" in ax.get_title()
    image = ax.get_images()[0].get_array()
    height, width = matplotlib.image.imread(str(path)).shape[:2]
    assert image.shape[:2] == (height, width)  # the photo's own size and aspect
    key = fig.axes[-1]
    labels = [t.get_text() for t in key.get_yticklabels()]
    assert labels[0] == "0%" and labels[-1] == f"{100 * c.attention[c.words.index('cross')].max():.1f}%"
    png = io.BytesIO()
    fig.savefig(png, format="png")
    assert png.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"
    plt.close(fig)
    # by index, on a given Axes, over an array
    fig, ax = plt.subplots()
    assert sat.show_attention(c, matplotlib.image.imread(str(path)), -1, ax=ax)[1] is ax
    plt.close(fig)


def test_grid_has_a_panel_per_word(scene):
    c, path = scene
    fig = sat.show_attention_grid(c, path, columns=5)
    titled = [ax.get_title() for ax in fig.axes if ax.get_images()]
    assert titled == c.words
    plt.close(fig)


def test_glimpse_outlined_on_its_cell(scene):
    c, path = scene
    hard = sat.Caption(c.text, c.words, c.logprob, attention=c.attention,
                       glimpses=np.array([[2, 5]] * len(c.words), np.int32))
    fig, ax = sat.show_attention(hard, path, 0)
    rows, cols = c.attention.shape[1:]
    height, width = matplotlib.image.imread(str(path)).shape[:2]
    boxes = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert boxes and all(b.get_xy() == pytest.approx((5 * width / cols - 0.5, 2 * height / rows - 0.5)) for b in boxes)
    assert len(sat.show_attention(c, path, 0)[1].patches) == 0  # negative control: soft attention draws no outline
    plt.close("all")


def test_helper_errors(synth, scene):
    c, path = scene
    with pytest.raises(ValueError, match="zebra"):
        sat.show_attention(c, path, "zebra")
    with pytest.raises(IndexError):
        sat.show_attention(c, path, len(c.words))
    with pytest.raises(ValueError, match="attention=True"):
        sat.show_attention(synth.caption(path, attention=False), path, 0)
    with pytest.raises(TypeError):
        sat.show_attention(c, 42, 0)
