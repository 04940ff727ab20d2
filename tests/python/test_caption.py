"""sat.Captioner: paths, arrays, batches, encode, options, errors, and the GIL released while it computes."""
import json
import subprocess
import threading
import time

import matplotlib.image
import numpy as np
import pytest

import sat


def rgb(path):
    """A PNG's pixels as NumPy RGB uint8, read by matplotlib (not by sat: the channel order is checked, not assumed)."""
    a = matplotlib.image.imread(str(path))
    return (a[:, :, :3] * 255).round().astype(np.uint8)


def test_path_caption_is_the_cli_caption(synth, repo, sat_bin):
    c = synth.caption(repo / "examples" / "scene.png")
    out = subprocess.run([sat_bin, "caption", str(repo / "examples" / "scene.png"), "--model",
                          str(repo / "models" / "synth.sat"), "--json"], check=True, capture_output=True, text=True)
    assert c.text == json.loads(out.stdout)[0]["caption"]
    assert c.words == c.text.split() and c.logprob < 0
    assert c.source == str(repo / "examples" / "scene.png")


def test_rgb_array_is_read_as_rgb(synth, repo):
    path = repo / "examples" / "scene.png"
    from_file, from_array = synth.caption(path), synth.caption(rgb(path))
    assert from_array.text == from_file.text
    assert from_array.logprob == pytest.approx(from_file.logprob, abs=1e-5)
    assert from_array.source is None
    # negative control: the same pixels in BGR order are another picture to the model (its blue cross turns red)
    swapped = synth.caption(np.ascontiguousarray(rgb(path)[:, :, ::-1]))
    assert (swapped.text, round(swapped.logprob, 4)) != (from_file.text, round(from_file.logprob, 4))


def test_grey_rgba_and_non_contiguous_arrays(synth, repo):
    a = rgb(repo / "examples" / "scene.png")
    base = synth.caption(a)
    rgba = np.concatenate([a, np.full(a.shape[:2] + (1,), 255, np.uint8)], axis=2)
    assert synth.caption(rgba).text == base.text
    assert synth.caption(a[:, :, 1]).text  # grey: captioned, not refused
    wide = np.zeros((a.shape[0], a.shape[1] * 2, 3), np.uint8)
    wide[:, ::2] = a  # a strided view, copied once by the package
    assert not wide[:, ::2].flags.c_contiguous
    assert synth.caption(wide[:, ::2]).logprob == pytest.approx(base.logprob, abs=1e-5)


def test_batches_give_lists_in_order(synth, repo):
    scene, dog = repo / "examples" / "scene.png", repo / "examples" / "dog_and_man.jpg"
    one = [synth.caption(scene), synth.caption(dog)]
    batch = synth.caption([scene, dog])
    assert isinstance(batch, list) and [c.text for c in batch] == [c.text for c in one]
    assert [c.source for c in batch] == [str(scene), str(dog)]
    arrays = synth.caption((rgb(scene), rgb(scene)[::-1].copy()))
    assert len(arrays) == 2 and arrays[0].text == one[0].text
    assert synth.caption([]) == []


def test_attention_candidates_and_options(synth, repo, sat_bin):
    scene = repo / "examples" / "scene.png"
    c = synth.caption(scene, candidates=3)
    rows, cols = synth.info["grid_rows"], synth.info["grid_cols"]
    assert c.attention.dtype == np.float32 and c.attention.shape == (len(c.words), rows, cols)
    np.testing.assert_allclose(c.attention.sum(axis=(1, 2)), 1, atol=1e-4)
    assert c.glimpses is None  # soft attention
    assert synth.caption(scene, attention=False).attention is None
    assert len(c.candidates) == 3 and [k.rank for k in c.candidates] == [1, 2, 3]
    chosen = [k for k in c.candidates if k.chosen]
    assert len(chosen) == 1 and chosen[0].text == c.text and chosen[0].logprob == pytest.approx(c.logprob)
    greedy = synth.caption(scene, beam=1, attention=False)
    out = subprocess.run([sat_bin, "caption", str(scene), "--model", str(repo / "models" / "synth.sat"), "--beam", "1",
                          "--json"], check=True, capture_output=True, text=True)
    assert greedy.text == json.loads(out.stdout)[0]["caption"] != c.text  # the option reached the search
    forced = synth.caption(scene, include="circle")
    assert "circle" in forced.words
    with pytest.raises(sat.Error, match="has no caption memory for relevance_weight"):
        synth.caption(scene, relevance_weight=1)


def test_objects(repo, shared):
    if not (shared / "models" / "centernet_mobilenetv3").is_dir() or not (shared / "models" / "resnet_v2_101").is_dir():
        pytest.skip("the detector and ResNet weights are not in ../shared/models")
    c = sat.Captioner(repo / "models" / "flickr8k.sat").caption(repo / "examples" / "dog_and_man.jpg", objects=True)
    names = [o.name for o in c.objects]
    assert "person" in names and "dog" in names
    assert all(0 <= o.x <= 1 and 0 <= o.y <= 1 and 0.3 <= o.score <= 1 for o in c.objects)


def test_reranking_terms(repo, shared):
    """Each candidate's total is score + consensus weight x agreement + evidence weight x evidence + relevance weight x
    relevance, as the model stores them or as asked."""
    if not (shared / "models" / "centernet_mobilenetv3").is_dir() or not (shared / "models" / "resnet_v2_101").is_dir():
        pytest.skip("the detector and ResNet weights are not in ../shared/models")
    model = sat.Captioner(repo / "models" / "flickr8k.sat")
    info = model.info
    assert info["relevance_weight"] > 0 and info["consensus_weight"] > 0 and info["object_evidence"] > 0
    for asked in (None, 3.0):
        c = model.caption(repo / "examples" / "dog_and_man.jpg", candidates=5, attention=False,
                          relevance_weight=asked)
        r = info["relevance_weight"] if asked is None else asked
        for k in c.candidates:
            assert -1 <= k.relevance <= 1
            assert k.total == pytest.approx(k.score + info["consensus_weight"] * k.agreement +
                                            info["object_evidence"] * k.object_evidence + r * k.relevance)
        assert max(c.candidates, key=lambda k: k.total).text == c.text
    # the neighbours' captions in the objects' evidence, as the model stores it or as asked: the totals' rule holds
    for share in (None, 0.0, 1.0):
        c = model.caption(repo / "examples" / "dog_and_man.jpg", candidates=5, attention=False,
                          neighbour_evidence=share)
        for k in c.candidates:
            assert k.total == pytest.approx(k.score + info["consensus_weight"] * k.agreement +
                                            info["object_evidence"] * k.object_evidence +
                                            info["relevance_weight"] * k.relevance)
        assert max(c.candidates, key=lambda k: k.total).text == c.text
    with pytest.raises(sat.Error, match=r"neighbour_evidence must be in \[0, 1\]"):
        model.caption(repo / "examples" / "dog_and_man.jpg", neighbour_evidence=2.0)
    # the objects' evidence steering the beam, as stored or as asked: the totals' rule holds (the steering only
    # chooses which captions the beam finds); steered hard, every caption the beam finds names the dog it sees
    dog = set("dog dogs puppy puppies pup pups doggy greyhound greyhounds poodle poodles terrier terriers retriever "
              "retrievers collie collies dachshund dachshunds beagle beagles labrador labradors shepherd".split())
    for weight in (None, 0.0, 100.0):
        c = model.caption(repo / "examples" / "dog_and_man.jpg", candidates=100, attention=False,
                          beam_evidence=weight, evidence_threshold=0.0 if weight == 100.0 else None)
        for k in c.candidates:
            assert k.total == pytest.approx(k.score + info["consensus_weight"] * k.agreement +
                                            info["object_evidence"] * k.object_evidence +
                                            info["relevance_weight"] * k.relevance)
        assert max(c.candidates, key=lambda k: k.total).text == c.text
        named = [bool(dog & set(k.text.split())) for k in c.candidates]
        if weight == 0.0:
            assert not all(named), c.candidates  # unsteered, some captions leave the dog out: the check below can fail
        if weight == 100.0:
            assert all(named), c.candidates
    with pytest.raises(sat.Error, match=r"beam_evidence must be in \[0, 100\]"):
        model.caption(repo / "examples" / "dog_and_man.jpg", beam_evidence=101.0)


def test_encode(synth, repo):
    scene = repo / "examples" / "scene.png"
    g = synth.encode(scene)
    assert g.dtype == np.float32 and g.shape[:2] == (synth.info["grid_rows"], synth.info["grid_cols"])
    assert g.shape[2] > 0 and np.isfinite(g).all() and g.std() > 0
    both = synth.encode([rgb(scene), rgb(scene)[:, ::-1].copy()])
    np.testing.assert_allclose(both[0], g, atol=1e-5)
    np.testing.assert_allclose(synth.encode(rgb(scene)), g, atol=1e-5)
    assert isinstance(both, list) and both[1].shape == g.shape and not np.allclose(both[1], g)


def test_default_model(monkeypatch, repo):
    assert sat.default_model().endswith("flickr8k.sat") and sat.default_model().startswith(sat.models_dir())
    monkeypatch.setenv("SAT_MODEL", str(repo / "models" / "synth.sat"))
    c = sat.Captioner()
    assert c.model == str(repo / "models" / "synth.sat") and c.info["input_size"] == 128


def one_line(e):
    s = str(e.value)
    assert "\n" not in s and s
    return s


def test_errors(synth, repo, tmp_path):
    with pytest.raises(sat.Error) as e:
        synth.caption(tmp_path / "missing.jpg")
    assert one_line(e).startswith(str(tmp_path / "missing.jpg") + ":")
    with pytest.raises(sat.Error) as e:  # a batch is refused whole, naming the image that cannot be read
        synth.caption([repo / "examples" / "scene.png", tmp_path / "missing.jpg"])
    assert str(tmp_path / "missing.jpg") in one_line(e)
    garbage = tmp_path / "garbage.sat"
    garbage.write_bytes(b"not a model at all")
    with pytest.raises(sat.Error) as e:
        sat.Captioner(garbage)
    assert one_line(e).startswith(str(garbage))
    assert issubclass(sat.Error, RuntimeError)
    with pytest.raises(sat.Error):
        sat.Captioner(repo / "models" / "synth.sat", precision="float7")
    with pytest.raises(sat.Error) as e:
        synth.caption(repo / "examples" / "scene.png", beam=0)
    one_line(e)
    with pytest.raises(sat.Error) as e:
        synth.caption(repo / "examples" / "scene.png", include="zebra")
    assert "zebra" in one_line(e)
    a = rgb(repo / "examples" / "scene.png")
    with pytest.raises(TypeError, match="uint8"):
        synth.caption(a.astype(np.float32) / 255)
    with pytest.raises(ValueError, match="shape"):
        synth.caption(a[:, :, :2])
    with pytest.raises(TypeError):
        synth.caption(42)
    with pytest.raises(TypeError, match="paths or a list of NumPy"):
        synth.caption([a, repo / "examples" / "scene.png"])
    with pytest.raises(TypeError, match="beam"):
        synth.caption(a, beam="3")
    with pytest.raises(TypeError, match="attention"):
        synth.caption(a, attention=1)
    with pytest.raises(sat.Error, match="empty"):
        synth.caption(np.zeros((0, 5, 3), np.uint8))


def test_damaged_photo_refused_unless_allowed(synth, repo, tmp_path):
    whole = (repo / "examples" / "dog_and_man.jpg").read_bytes()
    half = tmp_path / "half.jpg"  # half a JPEG and an end marker: decodes with its lower half grey
    half.write_bytes(whole[: len(whole) // 2] + b"\xff\xd9")
    with pytest.raises(sat.Error) as e:
        synth.caption(half)
    assert one_line(e).startswith(str(half) + ": damaged JPEG: scan ")
    with pytest.raises(sat.Error, match="damaged JPEG"):  # in a batch too
        synth.caption([repo / "examples" / "dog_and_man.jpg", half])
    assert synth.caption(half, allow_damaged=True).text
    assert synth.caption(repo / "examples" / "dog_and_man.jpg").text  # the whole photo needs no flag
    with pytest.raises(TypeError, match="allow_damaged"):
        synth.caption(half, allow_damaged="yes")


def longest_pause(work):
    """Runs work() in another thread while this one wakes every millisecond: the longest this thread waited (a call
    holding the GIL stalls it for the whole call) and how long work took."""
    done, took = threading.Event(), []

    def run():
        start = time.perf_counter()
        work()
        took.append(time.perf_counter() - start)
        done.set()

    worker = threading.Thread(target=run)
    last, longest = time.perf_counter(), 0.0
    worker.start()
    while not done.is_set():
        time.sleep(0.001)
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    worker.join()
    return longest, took[0]


def test_gil_released_while_captioning(inception, repo):
    photos = [repo / "examples" / "dog_and_man.jpg"] * 4
    longest, took = longest_pause(lambda: inception.caption(photos))
    assert longest < took / 2, f"Python stalled {longest:.3f} s during a {took:.3f} s caption"
    longest, took = longest_pause(lambda: inception.encode(photos))
    assert longest < took / 2
    # negative control: a C call that holds the GIL (sorting floats runs no Python code) stalls this thread throughout
    values = list(np.random.default_rng(1).random(2_000_000))
    longest, took = longest_pause(lambda: sorted(values))
    assert longest > took / 2


def test_two_threads_caption_at_once(inception, repo):
    photos = [repo / "examples" / "dog_and_man.jpg", repo / "examples" / "scene.png"]
    alone = [c.text for c in inception.caption(photos)]
    together = [None, None]

    def run(k):
        together[k] = [c.text for c in inception.caption(photos[k:] + photos[:k])]

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads)
    assert together == [alone, alone[::-1]]
