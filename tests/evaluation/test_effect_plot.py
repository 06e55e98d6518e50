"""The report's figures with intervals: `training_effect.png` (what training changed, one panel per
environment, held-out ones marked) drawn from a table checked against a restatement, and the error
bars of it and of `bars_<env>.png` read back from matplotlib and compared with the cells' intervals."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from prompt_r1.evaluation.effect_plot import FILE_NAME, bar_errors, effect_plot_table, training_effect_figure
from prompt_r1.evaluation.heldout import EnvSplit
from prompt_r1.evaluation.report import bar_heights, write_report
from prompt_r1.evaluation.training_effect import BASE, TRAINED, effect_rows

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _rows(rng: random.Random) -> list[dict]:
    rows = []
    for env in rng.sample(["e1", "e2", "e3"], rng.randint(1, 3)):
        for dataset in rng.sample(["d1", "d2", "PopQA", "Xsum_ood"], rng.randint(1, 4)):
            base, trained = rng.random(), rng.random()
            diff = None if rng.random() < 0.2 else trained - base
            rows.append({"env_name": env, "dataset": dataset, "n": rng.randint(1, 50),
                         "base": (base, base - 0.1, base + 0.2),
                         "trained": (trained, None, None) if rng.random() < 0.1 else (trained, trained - 0.2, trained + 0.1),
                         "change": None if diff is None else {"diff": diff, "ci_low": diff - 0.1, "ci_high": diff + 0.1},
                         "shares": {}})
    return rows


def test_the_plot_table_restates_the_rows() -> None:
    rng = random.Random(3)
    for _ in range(200):
        rows = _rows(rng)
        held = {e: rng.random() < 0.5 for e in ("e1", "e2") if rng.random() < 0.8}
        table = effect_plot_table(rows, held)
        assert [p["env_name"] for p in table] == sorted({r["env_name"] for r in rows})  # one panel per environment
        for panel in table:
            env = panel["env_name"]
            assert panel["held_out"] == held.get(env)
            mine = [r for r in rows if r["env_name"] == env]
            assert sorted(c["dataset"] for c in panel["datasets"]) == sorted(r["dataset"] for r in mine)
            ood = [c["dataset"].endswith("_ood") for c in panel["datasets"]]  # the OOD datasets: Xsum_ood here
            assert ood == sorted(ood)  # in-domain first
            for cell in panel["datasets"]:
                r = next(r for r in mine if r["dataset"] == cell["dataset"])
                assert cell["n"] == r["n"]
                for key in ("base", "trained"):
                    assert cell[key] == tuple(None if v is None else pytest.approx(v * 100) for v in r[key])
                c = r["change"]
                assert cell["change"] == (None if c is None else pytest.approx((c["diff"] * 100, c["ci_low"] * 100,
                                                                                 c["ci_high"] * 100)))


def _error_segments(ax) -> list[list[tuple[float, float]]]:
    """Per bar series of `ax`: (bottom, top) of each error bar, in drawing order."""
    out = []
    for container in ax.containers:
        if getattr(container, "errorbar", None) is not None:
            segments = container.errorbar.lines[2][0].get_segments()
            out.append([(float(s[0][1]), float(s[1][1])) for s in segments])
    return out


def test_training_effect_figure_panels_marks_and_error_bars() -> None:
    rows = [{"env_name": env, "dataset": ds, "n": 10, "base": (0.2, 0.1, 0.35), "trained": (0.6, 0.45, 0.7),
             "change": {"diff": 0.4, "ci_low": 0.2, "ci_high": 0.6}, "shares": {}}
            for env in ("local", "remote") for ds in ("d1", "PopQA")]
    fig = training_effect_figure(effect_plot_table(rows, {"local": False, "remote": True}))
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["local (trained on)", "remote (held out)"]
    for ax in axes:
        base, trained = _error_segments(ax)
        assert base == [pytest.approx((10.0, 35.0))] * 2 and trained == [pytest.approx((45.0, 70.0))] * 2
        assert [t.get_text() for t in ax.texts] == ["+40.0*", "+40.0*"]
        hatched = {p.get_hatch() for p in ax.patches}
        assert hatched == ({"//"} if "held out" in ax.get_title() else {None})


def _result(env: str, method: str, dataset: str, score: float) -> dict:
    return {"env_name": env, "dataset": dataset, "method": method, "n": 4, "primary_metric": "f1", "score": score,
            "f1": score, "ci_low": score / 2, "ci_high": (1 + score) / 2, "errors": 0, "env_prompt_tokens": 1,
            "env_completion_tokens": 1, "cost_usd": 0.0}


def test_the_report_writes_training_effect_png_and_error_bars(tmp_path, monkeypatch) -> None:
    import matplotlib.image
    import matplotlib.pyplot as plt

    drawn = {}
    real_close = plt.close

    def keep(fig=None):  # the figures the report draws, kept to read their bars back
        if fig is not None and fig.axes:
            drawn[fig.axes[0].get_title()] = fig
        return real_close(fig)

    monkeypatch.setattr(plt, "close", keep)
    envs, datasets = ("local", "remote"), ("PopQA", "d1")  # in-domain, by name
    scores = {(e, d, m): (i + 1) / 20 for i, (e, d, m) in
              enumerate((e, d, m) for e in envs for d in datasets for m in ("direct", BASE, TRAINED))}
    results = [_result(e, m, d, s) for (e, d, m), s in scores.items()]
    predictions = [{"env_name": e, "method": m, "dataset": d, "question_id": f"q{i}", "score": float(i % 2 or m == TRAINED),
                    "prediction": str(i), "error": None}
                   for e in envs for d in datasets for m in ("direct", BASE, TRAINED) for i in range(4)]
    split = EnvSplit({"local": False, "remote": True}, "test")
    files = write_report(results, [], tmp_path, predictions=predictions, split=split)
    png = files["training_effect_plot"]
    assert png == tmp_path / FILE_NAME and png.read_bytes()[:8] == PNG_MAGIC
    assert matplotlib.image.imread(png).shape[2] in (3, 4)  # a PNG matplotlib reads back
    effect = drawn["local (trained on)"]
    assert [ax.get_title() for ax in effect.axes] == ["local (trained on)", "remote (held out)"]
    rows = effect_rows(results, [], [])
    for ax, env in zip(effect.axes, envs):
        for key, segments in zip(("base", "trained"), _error_segments(ax)):
            expected = [next(r[key] for r in rows if (r["env_name"], r["dataset"]) == (env, d)) for d in datasets]
            assert segments == [pytest.approx((low * 100, high * 100)) for _, low, high in expected]
    for env in envs:  # bars_<env>.png: every method's bar carries its cell's interval
        assert (tmp_path / f"bars_{env}.png").read_bytes()[:8] == PNG_MAGIC
        ax = drawn[f"{env}: with and without the agent"].axes[0]
        methods = ["direct", BASE, TRAINED]
        for m, segments in zip(methods, _error_segments(ax)):
            cells = [next(r for r in results if (r["env_name"], r["dataset"], r["method"]) == (env, d, m))
                     for d in datasets]
            assert segments == [pytest.approx((c["ci_low"] * 100, c["ci_high"] * 100)) for c in cells]
    base_only = write_report([r for r in results if r["method"] != TRAINED], [], tmp_path / "base-only")
    assert "training_effect_plot" not in base_only and not (tmp_path / "base-only" / FILE_NAME).exists()


def test_bar_heights_and_errors_restate_the_cells() -> None:
    rng = random.Random(5)
    for _ in range(100):
        cells = {}
        for d in ("a", "b", "c"):
            if rng.random() < 0.7:
                s = None if rng.random() < 0.2 else rng.random()
                cells[(d, "m")] = {"score": s, "ci_low": None if s is None else s * 0.5,
                                   "ci_high": None if s is None else (s + 1) / 2}
        heights, (below, above) = bar_heights(cells, ["a", "b", "c"], "m")
        for i, d in enumerate("abc"):
            c = cells.get((d, "m"))
            s = c["score"] if c else None
            assert heights[i] == pytest.approx((s or 0) * 100)
            assert (below[i], above[i]) == (pytest.approx((s - c["ci_low"]) * 100), pytest.approx((c["ci_high"] - s) * 100)) \
                if s is not None else (0.0, 0.0)
    assert bar_errors(0.5, 0.5, 0.5) == (0.0, 0.0)
