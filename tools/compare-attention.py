#!/usr/bin/env python3
"""Trains every attention variant on the same data with the same budget and prints one comparison table.

Synthetic scenes (default): generates a training, validation and test set once, trains each variant end to end
(the small CNN encoder and the decoder), then reports on the test scenes BLEU-4 and CIDEr-D (beam 3), grounding
accuracy, and training speed (captions/s over the run's epochs).

Flickr8k (--flickr8k DIR --features CACHE): the decoder of each variant trained on cached InceptionV3 features of
the training split, scored on dev (beam 3); no grounding (there are no boxes).

Each variant's results are kept in WORK/<variant>/result.json; a rerun skips variants that have one and resumes
an interrupted variant from its checkpoint, so an interrupted comparison continues where it stopped. Usage:
  tools/compare-attention.py [--work runs/compare] [--images 2000] [--epochs 10] [--only soft,hard]
  tools/compare-attention.py --flickr8k ../shared/data/flickr8k --features f8k.feat --work runs/compare-f8k
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# hard attention's training: 4 glimpse samples per caption (reward-to-go, leave-one-out baseline) and 5 epochs that
# go from all-soft steps to Xu et al.'s one in two
HARD = ["--hard-samples", "4", "--hard-soft-warmup", "5"]

# name -> flags; every variant shares everything else
VARIANTS = [
    ("none", "no attention (Show and Tell)", ["--attention", "none"]),
    ("soft", "soft, additive, Bahdanau order", ["--attention", "soft", "--score", "additive"]),
    ("soft-coverage", "soft, additive + coverage", ["--attention", "soft", "--score", "additive", "--coverage", "true"]),
    ("soft-dot", "soft, dot (scaled)", ["--attention", "soft", "--score", "dot"]),
    ("soft-general", "soft, general", ["--attention", "soft", "--score", "general"]),
    ("soft-cosine", "soft, cosine", ["--attention", "soft", "--score", "cosine"]),
    ("soft-location", "soft, location-only", ["--attention", "soft", "--score", "location"]),
    ("luong", "soft, additive, Luong order", ["--attention", "soft", "--score", "additive", "--order", "luong"]),
    ("luong-general", "soft, general, Luong order", ["--attention", "soft", "--score", "general", "--order", "luong"]),
    ("updown", "soft, additive, two LSTMs (Up-Down order)", ["--attention", "soft", "--score", "additive", "--order", "updown"]),
    ("local", "local (2-D window), additive", ["--attention", "local", "--score", "additive"]),
    ("hard-xu", "hard, 1-cell glimpse, REINFORCE as Xu et al. (1 sample, moving baseline)",
     ["--attention", "hard", "--hard-window", "1"]),
    ("hard", "hard, 1-cell glimpse, 4 samples, leave-one-out baseline, soft warm-up",
     ["--attention", "hard", "--hard-window", "1"] + HARD),
    ("hard-3x3", "hard, 3x3 Gaussian glimpse, same training", ["--attention", "hard", "--hard-window", "3"] + HARD),
]


def run(cmd, log=None):
    """Runs cmd; its output goes to log as it comes (when given) and is returned."""
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    if log:
        with open(log, "w") as f:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
        with open(log) as f:
            text = f.read()
    else:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        rc, text = out.returncode, out.stdout
    if rc != 0:
        sys.exit("command failed (exit %d): %s\n%s" % (rc, " ".join(cmd), text[-2000:]))
    return text


def epoch_speeds(log_text):
    # the trainer ends each epoch with a line "epoch k/E n/n  loss ...  X cap/s  mm:ss"
    speeds = []
    for m in re.finditer(r"epoch (\d+)/\d+ (\d+)/(\d+) .*? (\d+) cap/s  (?!ETA)", log_text):
        if m.group(2) == m.group(3):
            speeds.append(int(m.group(4)))
    return speeds


def last_json(text):
    start = text.rfind("\n{")
    return json.loads(text[start + 1 if start >= 0 else text.find("{"):])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sat", default=os.path.join(TOP, "build", "sat"))
    ap.add_argument("--work", default=os.path.join(TOP, "runs", "compare"))
    ap.add_argument("--images", type=int, default=2000, help="synthetic training scenes")
    ap.add_argument("--test-images", type=int, default=500, help="synthetic test scenes (seed 3)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    ap.add_argument("--flickr8k", default="", help="Flickr8k directory (captions.csv, train.txt, dev.txt)")
    ap.add_argument("--features", default="", help="feature cache of the Flickr8k photos (sat extract)")
    ap.add_argument("--encoder", default=os.path.join(TOP, "models", "inception_v3.sat"))
    ap.add_argument("--cut", default="mixed5")
    ap.add_argument("--encoder-size", default="299")
    ap.add_argument("--table", default="", help="also write the markdown table to this file")
    ap.add_argument("--bench", action="store_true",
                    help="time each variant's decoder training step (sat bench decoder) into its result; run it on a "
                         "quiet machine")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    sat = a.sat
    names = set(filter(None, a.only.split(",")))
    unknown = names - {v[0] for v in VARIANTS}
    if unknown:
        sys.exit("unknown variant(s): " + ", ".join(sorted(unknown)))

    common = ["--epochs", str(a.epochs), "--patience", str(a.epochs), "--threads", str(a.threads), "--seed", "1"]
    if a.flickr8k:
        if not a.features:
            sys.exit("--flickr8k needs --features (a cache made by sat extract)")
        f8k = a.flickr8k
        data = ["--data", f8k, "--train-split", os.path.join(f8k, "train.txt"), "--val-split",
                os.path.join(f8k, "dev.txt"), "--encoder", a.encoder, "--cut", a.cut, "--encoder-size", a.encoder_size,
                "--features", a.features]
        common += ["--embed", "256", "--hidden", "256", "--attn", "256", "--dropout", "0.5", "--min-count", "5",
                   "--batch", "16", "--lr", "5e-4", "--lr-decay", "0.9", "--penalty", "1", "--val-limit", "200",
                   "--metric", "bleu4"]
        evaluate = ["--data", f8k, "--split", os.path.join(f8k, "dev.txt"), "--features", a.features]
        setup = "Flickr8k: %d epochs on the 6000 training photos (cached InceptionV3 %s at %s), scored on the 1000 dev photos" % (
            a.epochs, a.cut, a.encoder_size)
    else:
        train_dir, val_dir, test_dir = (os.path.join(a.work, d) for d in ("synth-train", "synth-val", "synth-test"))
        for d, n, seed in ((train_dir, a.images, 1), (val_dir, 200, 2), (test_dir, a.test_images, 3)):
            if not os.path.exists(os.path.join(d, "captions.json")):
                run([sat, "synth", "--out", d, "--images", str(n), "--seed", str(seed)])
        data = ["--data", train_dir, "--val-data", val_dir]
        common += ["--lr", "2e-3", "--lr-decay", "0.85", "--penalty", "0", "--captions-per-image", "2"]
        evaluate = ["--data", test_dir]
        setup = "synthetic scenes: %d training scenes, %d epochs, CNN encoder trained end to end; %d test scenes (seed 3)" % (
            a.images, a.epochs, a.test_images)

    rows = []
    for name, what, flags in VARIANTS:
        if names and name not in names:
            continue
        vdir = os.path.join(a.work, name)
        result_path = os.path.join(vdir, "result.json")
        if os.path.exists(result_path):
            with open(result_path) as f:
                rows.append(json.load(f))
            continue
        os.makedirs(vdir, exist_ok=True)
        log = os.path.join(vdir, "train.log")
        start = time.time()
        checkpoint = os.path.join(vdir, "checkpoint.sat")
        if os.path.exists(checkpoint) and os.path.exists(log):  # an interrupted run continues where it stopped
            os.replace(log, log + ".before-resume")
            run([sat, "train", "--resume", checkpoint, "--threads", str(a.threads)], log)
        else:
            run([sat, "train"] + data + common + flags + ["--out", vdir], log)
        wall = time.time() - start
        with open(log) as f:
            speeds = epoch_speeds(f.read())
        model = os.path.join(vdir, "model.sat")
        scores = last_json(run([sat, "eval", "--model", model, "--beam", "3", "--json"] + evaluate))
        row = {"variant": name, "what": what, "flags": " ".join(flags), "bleu4": scores["Bleu_4"],
               "cider": scores["CIDEr"], "train_seconds": round(wall), "captions_per_second":
               round(sum(speeds) / len(speeds)) if speeds else None}
        for k in ("Bleu_1", "METEOR", "ROUGE_L"):
            row[k] = scores.get(k)
        if not a.flickr8k:
            g = last_json(run([sat, "eval-grounding", "--model", model, "--json"] + evaluate))
            row["grounding"] = g["grounding_accuracy"]
        tmp = result_path + ".partial"
        with open(tmp, "w") as f:
            json.dump(row, f, indent=1)
        os.replace(tmp, result_path)
        rows.append(row)

    if a.bench:
        # The decoder step alone, every variant back to back at one size (the synthetic model's, or the Flickr8k
        # comparison's), so the speeds compare the attention kinds and not the machine's load at training time.
        size = (["--batch", "64", "--grid", "17", "--features", "768", "--embed", "256", "--hidden", "256", "--attn",
                 "256", "--vocab", "2538", "--steps", "16", "--dropout", "0.5"] if a.flickr8k else
                ["--batch", "32", "--grid", "8", "--features", "130", "--embed", "128", "--hidden", "256", "--attn",
                 "128", "--vocab", "44", "--steps", "14", "--dropout", "0.3"])
        for r in rows:
            flags = r["flags"].split()
            if "--hard-soft-warmup" in flags:  # a training schedule, not part of the step
                i = flags.index("--hard-soft-warmup")
                del flags[i:i + 2]
            out = run([sat, "bench", "decoder", "--iters", "10"] + size + flags)
            r["decoder_captions_per_second"] = float(re.search(r"([0-9.]+) captions/s \(mean\)", out).group(1))
            r["bench_size"] = " ".join(size)
            path = os.path.join(a.work, r["variant"], "result.json")
            with open(path + ".partial", "w") as f:
                json.dump(r, f, indent=1)
            os.replace(path + ".partial", path)

    lines = ["Setup: " + setup + ". Command: `tools/compare-attention.py " + " ".join(sys.argv[1:]) + "`", ""]
    head = "| variant | flags | BLEU-4 | CIDEr-D |" + (" grounding |" if not a.flickr8k else
                                                     " BLEU-1 | METEOR≈ | ROUGE-L |") + " decoder step, captions/s |"
    lines += [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in rows:
        line = "| %s | `%s` | %.3f | %.3f |" % (r["what"], r["flags"], r["bleu4"], r["cider"])
        if not a.flickr8k:  # without attention there is nothing to ground
            line += " %.3f |" % r["grounding"] if r["variant"] != "none" else " — |"
        else:
            line += "".join(" %.3f |" % r[k] if r.get(k) is not None else " — |" for k in ("Bleu_1", "METEOR", "ROUGE_L"))
        speed = r.get("decoder_captions_per_second")
        line += " %s |" % ("%.0f" % speed if speed else "—")
        lines.append(line)
    table = "\n".join(lines)
    print(table)
    if a.table:
        with open(a.table + ".partial", "w") as f:
            f.write(table + "\n")
        os.replace(a.table + ".partial", a.table)


if __name__ == "__main__":
    main()
