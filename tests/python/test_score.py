"""sat.score: the coco-caption metrics, the same numbers `sat eval` prints, from lists, dicts and files."""
import json
import math
import subprocess

import pytest

import sat

METRICS = ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "length_ratio"]


def test_known_values():
    # one image, hypothesis and reference of 6 words: clipped n-gram precisions 5/6, 3/5, 1/4, 0/3 (brevity penalty
    # 1), LCS 5 words; CIDEr-D is 0 for a single image (every n-gram's idf is 0)
    s = sat.score(["a dog runs on the grass"], [["a dog runs in the grass"]])
    assert s["images"] == 1
    assert s["Bleu_1"] == pytest.approx(5 / 6, abs=1e-6)
    assert s["Bleu_2"] == pytest.approx(math.sqrt(5 / 6 * 3 / 5), abs=1e-6)
    assert s["Bleu_3"] == pytest.approx((5 / 6 * 3 / 5 * 1 / 4) ** (1 / 3), abs=1e-6)
    assert s["Bleu_4"] < 1e-3
    assert s["ROUGE_L"] == pytest.approx(5 / 6, abs=1e-9)
    assert s["CIDEr"] == 0 and s["length_ratio"] == 1
    # tokenized as the toolkit tokenizes: case and punctuation do not count
    assert sat.score(["A dog runs, on the grass."], [["a dog runs in the grass"]]) == s


def test_coco_caption_demo(shared):
    path = shared / "data" / "coco-eval" / "fakecap_tokenized_hyp_refs_1000.json"
    if not path.exists():
        pytest.skip(f"{path} is not there")
    demo = json.loads(path.read_text())
    s = sat.score([e["test"] for e in demo], [e["refs"] for e in demo])
    # the toolkit's own figures for its demo (tests/test_metrics.cpp checks the same from C++)
    for key, value in {"Bleu_1": 0.5794, "Bleu_2": 0.4044, "Bleu_3": 0.2785, "Bleu_4": 0.1908, "ROUGE_L": 0.3963,
                       "CIDEr": 0.5998}.items():
        assert s[key] == pytest.approx(value, abs=5e-4), key


@pytest.fixture()
def files(tmp_path):
    refs = {"images": [{"id": 1, "file_name": "a.jpg"}, {"id": 2, "file_name": "b.jpg"}, {"id": 3, "file_name": "c.jpg"}],
            "annotations": [
                {"image_id": 1, "id": 1, "caption": "A dog runs through the grass."},
                {"image_id": 1, "id": 2, "caption": "a brown dog running on a lawn"},
                {"image_id": 2, "id": 3, "caption": "two children play in the water"},
                {"image_id": 2, "id": 4, "caption": "kids splash at the beach"},
                {"image_id": 3, "id": 5, "caption": "a man rides a bike down a hill"},
                {"image_id": 3, "id": 6, "caption": "a cyclist on a mountain trail"}]}
    captions = {"a.jpg": "a dog runs on the grass", "b.jpg": "two kids play in the water", "c.jpg": "a man on a bike"}
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    (tmp_path / "results.json").write_text(json.dumps([{"image_id": k, "caption": v} for k, v in captions.items()]))
    return tmp_path / "results.json", tmp_path / "refs.json", captions, refs


def test_same_numbers_as_sat_eval(files, sat_bin, tmp_path):
    results, refs, captions, ref_json = files
    out = subprocess.run([sat_bin, "eval", "--results", str(results), "--refs", str(refs), "--json"], check=True,
                         capture_output=True, text=True)
    cli = json.loads(out.stdout)
    by_id = {i["file_name"]: i["id"] for i in ref_json["images"]}
    references = {name: [a["caption"] for a in ref_json["annotations"] if a["image_id"] == by_id[name]]
                  for name in captions}
    forms = [sat.score(results, refs), sat.score(captions, refs), sat.score({by_id[k]: v for k, v in captions.items()},
             refs), sat.score(captions, references), sat.score(list(captions.values()), list(references.values()))]
    keys = [k for k in METRICS if k in cli]
    assert len(keys) >= 7 and cli["images"] == 3
    for s in forms:
        assert {k: s[k] for k in keys} == pytest.approx({k: cli[k] for k in keys}, abs=1e-9)
    # negative control: another caption moves the numbers this comparison reads
    other = sat.score(dict(captions, **{"c.jpg": "a woman walks a dog"}), refs)
    assert other["CIDEr"] != pytest.approx(cli["CIDEr"], abs=1e-3)


def test_captions_of_files_score_by_file_name(synth, repo, tmp_path):
    scene = repo / "examples" / "scene.png"
    c = synth.caption(scene)
    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps({"images": [{"id": 7, "file_name": "scene.png"}],
                                "annotations": [{"image_id": 7, "id": 1, "caption": c.text}]}))
    assert sat.score([c], refs)["Bleu_4"] == pytest.approx(1, abs=1e-6)


def test_score_errors(files):
    results, refs, captions, _ = files
    with pytest.raises(sat.Error) as e:
        sat.score({"zebra.jpg": "a zebra"}, refs)
    assert "zebra" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(sat.Error, match="cannot open"):
        sat.score(results, refs.parent / "missing.json")
    with pytest.raises(sat.Error):
        sat.score(["a", "b"], [["a"]])
    with pytest.raises(sat.Error, match="no captions"):
        sat.score(["a"], [[]])
    with pytest.raises(TypeError):
        sat.score(["a"], ["a dog"])  # references of an image are a list
    with pytest.raises(TypeError):
        sat.score(["a dog"], refs)  # no image names
    with pytest.raises(ValueError, match="b.jpg"):
        sat.score({"b.jpg": "x"}, {"a.jpg": ["x"]})


def test_compare_same_numbers_as_sat_eval(files, sat_bin, tmp_path):
    results, refs, captions, _ = files
    other = tmp_path / "other.json"  # the same images in another order, one caption changed
    other.write_text(json.dumps([{"image_id": k, "caption": "a woman walks a dog" if k == "c.jpg" else v}
                                 for k, v in reversed(list(captions.items()))]))
    out = subprocess.run([sat_bin, "eval", "--results", str(other), "--baseline", str(results), "--refs", str(refs),
                          "--resamples", "300", "--seed", "4", "--json"], check=True, capture_output=True, text=True)
    cli = json.loads(out.stdout)
    c = sat.compare(other, results, refs, resamples=300, seed=4)
    assert c == cli
    assert c["images"] == 3 and c["cider_d_images_equal"] == 2
    assert c["metrics"]["CIDEr"]["candidate"] == pytest.approx(sat.score(other, refs)["CIDEr"], abs=1e-9)
    assert c["metrics"]["CIDEr"]["baseline"] == pytest.approx(sat.score(results, refs)["CIDEr"], abs=1e-9)
    same = sat.compare(results, results, refs)
    assert all(m["difference"] == m["low"] == m["high"] == 0 for m in same["metrics"].values())
    with pytest.raises(sat.Error, match="a paired comparison needs the same images"):
        short = tmp_path / "short.json"
        short.write_text(json.dumps([{"image_id": "a.jpg", "caption": "a dog"}]))
        sat.compare(short, results, refs)
    with pytest.raises(sat.Error, match="resamples must be in"):
        sat.compare(other, results, refs, resamples=0)
    with pytest.raises(TypeError):
        sat.compare({"a.jpg": "a dog"}, results, refs)


def test_check_choice_same_numbers_as_sat_eval(files, sat_bin, tmp_path):
    results, refs, captions, _ = files
    other = tmp_path / "other.json"  # the same images in another order, one caption changed
    other.write_text(json.dumps([{"image_id": k, "caption": "a woman walks a dog" if k == "c.jpg" else v}
                                 for k, v in reversed(list(captions.items()))]))
    out = subprocess.run([sat_bin, "eval", "--choose-among", str(results), str(other), "--refs", str(refs),
                          "--by", "CIDEr", "--splits", "30", "--seed", "2", "--json"],
                         check=True, capture_output=True, text=True)
    cli = json.loads(out.stdout)
    c = sat.check_choice([results, other], refs, by="CIDEr", splits=30, seed=2)
    assert c == cli
    assert c["images"] == 3 and sum(s["times_chosen"] for s in c["systems"]) == 30
    assert [s["name"] for s in c["systems"]] == [str(results), str(other)]
    assert c["systems"][1]["on_all"] == pytest.approx(sat.score(other, refs)["CIDEr"], abs=1e-9)
    with pytest.raises(sat.Error, match="at least 2 results files"):
        sat.check_choice([results], refs)
    with pytest.raises(sat.Error, match="not 'rarer_false'"):
        sat.check_choice([results, other], refs, by="rarer_false")
    with pytest.raises(sat.Error, match="splits must be in"):
        sat.check_choice([results, other], refs, splits=0)
    with pytest.raises(TypeError):
        sat.check_choice(results, refs)  # one path, not a list of them
