"""The blindness attacker at full size (tests/test_blind_attacker.py runs a seeded slice).

Two folds: fit on the ``pan`` and ``blobs`` families, guess on held-out ``grain`` and ``stripes``
clips, then the other way round. Per fold: ABX and preference studies (several seeds each) of
``--clips`` clips per family, ``--raters`` raters each; every predictor of
:mod:`evalkit.testing.attack` (question x feature) counted on distinct held-out trials with a
two-sided exact binomial p-value; the pooled rules (issue 44: what colluding raters pool per
file hash, :func:`evalkit.testing.attack.add_pooled`) counted per held-out trial, pooled within
each study and across the held-out studies (made from the same runs, with other ``--seed``s);
how many test and catch files recur in every held-out study, and a replay bot's table of catch
answers labelled in one study looked up in the others; then ``--bots``
file-reading bots screened by each held-out ABX study's catch rule. Prints a table (and writes
it to ``--out``).

    python benchmarks/bench_blind_attack.py --clips 24 --raters 16 --bots 60 \\
        --out benchmarks/results/blind_attack_cpu2.txt
    python benchmarks/bench_blind_attack.py --delivery lossless --clips 12 --raters 12 \\
        --bots 24 --out benchmarks/results/blind_attack_lossless_cpu2.txt
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from scipy.stats import binomtest

from evalkit import study
from evalkit.testing import attack


def fold(
    root: Path,
    train_fams,
    held_fams,
    clips: int,
    raters: int,
    bots: int,
    seeds: int,
    delivery: str = "stream",
):
    train = attack.make_report(root / "train", train_fams, range(clips))
    held = attack.make_report(root / "held", held_fams, range(1000, 1000 + clips))
    db = root / "s.db"
    trials = {"train": [], "held": []}
    abx = []
    per_study = {}  # held-out study -> (protocol, its trials)
    for name, report in (("train", train), ("held", held)):
        for protocol in ("abx", "preference"):
            n = 1 if name == "train" else seeds if protocol == "abx" else 2 * seeds
            for seed in range(1, 1 + n):
                sid = study.create_study(
                    report,
                    db,
                    protocol=protocol,
                    seed=seed,
                    raters_planned=10,
                    allow_masking=True,
                    delivery=delivery,
                )["study"]
                got = attack.collect(db, sid, raters)
                trials[name] += got
                if name == "held":
                    per_study[sid] = (protocol, got)
                if name == "held" and protocol == "abx":
                    abx.append(sid)
    train_t, held_t = attack.add_features(trials["train"]), attack.add_features(trials["held"])
    res = attack.attack(train_t, held_t, seed=0)
    res.update(attack.attack_pooled(attack.add_pooled(train_t), attack.add_pooled(held_t)))
    across = attack.attack_pooled(attack.add_pooled(train_t, True), attack.add_pooled(held_t, True))
    res.update({q.replace("pooled", "pooled across studies", 1): v for q, v in across.items()})
    recur = recurrence(per_study)
    attack.add_pooled(held_t)
    rule = attack.best_stump(train_t)
    screened = [attack.bot_screening(db, sid, rule, bots // len(abx)) for sid in abx]
    return res, rule, screened, recur


def recurrence(per_study: dict) -> list[str]:
    """Per protocol, across the held-out studies of the same runs: how many of the distinct
    test and catch files were served in every one of them (issue 44 open (a): a catch file
    drawn from a study's seed was served in one), and a replay bot's table (each catch file's
    answer, labelled in the first study) looked up in the others."""
    import hashlib

    lines = []
    for protocol in ("abx", "preference"):
        studies = [t for p, t in per_study.values() if p == protocol]
        where: dict = {}
        for i, ts in enumerate(studies):
            for t in ts:
                where.setdefault((t["kind"], hashlib.sha256(t["data"]).hexdigest()), set()).add(i)
        for kind in ("test", "catch"):
            got = [len(v) for (k, _), v in where.items() if k == kind]
            lines.append(
                f"  {protocol} {kind} files served in all {len(studies)} studies: "
                f"{sum(g == len(studies) for g in got)}/{len(got)}"
            )
        r = attack.replay_catch(studies[0], [t for ts in studies[1:] for t in ts])
        lines.append(
            f"  {protocol} replay: catch files of studies 2-{len(studies)} in a table "
            f"labelled in study 1: {r['known']}/{r['files']}, answered right "
            f"{r['hits']}/{r['known']}"
        )
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clips", type=int, default=24, help="clips per family")
    ap.add_argument("--raters", type=int, default=16)
    ap.add_argument("--seeds", type=int, default=3, help="held-out ABX studies per fold")
    ap.add_argument("--bots", type=int, default=60)
    ap.add_argument("--delivery", choices=("stream", "lossless"), default="stream")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    lines = [
        f"bench_blind_attack: {a.clips} clips per family, {a.raters} raters per study, "
        f"{a.seeds} held-out ABX studies (x2 preference) per fold, {a.bots} bots per fold, "
        f"delivery {a.delivery}"
    ]
    worst = []
    t0 = time.perf_counter()
    for train_fams, held_fams in (
        (("pan", "blobs"), ("grain", "stripes")),
        (("grain", "stripes"), ("pan", "blobs")),
    ):
        with tempfile.TemporaryDirectory() as d:
            res, rule, screened, recur = fold(
                Path(d), train_fams, held_fams, a.clips, a.raters, a.bots, a.seeds, a.delivery
            )
        lines.append(f"\nfit on {'+'.join(train_fams)}, counted on held-out {'+'.join(held_fams)}")
        lines.extend(recur)
        for q, per in res.items():
            lines.append(f"  {q}")
            for f, r in sorted(per.items()):
                per_file = (
                    f"  files {r['cluster_hits']}/{r['cluster_n']} of {r['clusters']}"
                    f"  p = {r['cluster_p']:.3g}"
                    if "cluster_p" in r
                    else ""
                )
                lines.append(
                    f"    {f:<18} {r['hits']:>5}/{r['n']:<5} {r['hits'] / r['n']:.3f}"
                    f"  p = {r['p']:.3g}{per_file}"
                )
                worst.append((r.get("cluster_p", r["p"]), q, f))
        passed = sum(s["passed"] for s in screened)
        n = sum(s["bots"] for s in screened)
        hits = sum(s["catch_hits"] for s in screened)
        cn = sum(s["catch_n"] for s in screened)
        rate = screened[0]["random_pass_rate"]
        lines.append(
            f"  bot (rule: {rule[0]}): {passed}/{n} passed screening (a random clicker "
            f"passes {rate:.3f}: p = {binomtest(passed, n, rate).pvalue:.3g}); easy "
            f"catches right {hits}/{cn} = {hits / cn:.3f} (p = "
            f"{binomtest(hits, cn, 0.5).pvalue:.3g})"
        )
    worst.sort()
    lines.append(
        "\n(pooled per-trial rules: p per trial, and over files, the sign test of files "
        "whose trials were more often right; the smallest p-values below take the "
        "files' where given)"
    )
    lines.append("smallest p-values: " + "; ".join(f"{q} / {f}: {p:.3g}" for p, q, f in worst[:3]))
    lines.append(
        f"predictors: {len(worst)}; p < 0.001 expected by chance in "
        f"{len(worst) * 0.001:.2f} of them; seconds: {time.perf_counter() - t0:.0f}"
    )
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
