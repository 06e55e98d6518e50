"""benchmarks/experiments/env_pool.py's arithmetic: the transfer matrix and pool − single differences, from
evaluation rows (no model runs here), against a plain restatement of what they mean: on one
environment, the mean over the questions both agents scored of (A's score − B's score), a failed
call under either agent leaving that question out, whatever order the rows come in."""

from __future__ import annotations

import random
import statistics

import pytest

env_pool = pytest.importorskip("benchmarks.experiments.env_pool")

ENVS = ["small", "other"]
AGENTS = ["base", "only-small", "only-other", "pool"]


def _rows(seed: int) -> list[dict]:
    """Evaluation rows of every agent on every environment over two datasets, some failed, some missing."""
    rng = random.Random(seed)
    rows = []
    for env in ENVS:
        for agent in AGENTS:
            for dataset in ("d1", "d2"):
                for q in range(rng.randint(5, 9)):
                    if rng.random() < 0.1:
                        continue  # never asked of this agent
                    failed = rng.random() < 0.15
                    rows.append({"env_name": env, "method": f"agent:{agent}", "dataset": dataset,
                                 "question_id": f"{dataset}-{q}", "score": None if failed else rng.random(),
                                 "prediction": str(q), "error": "timeout" if failed else None})
    rng.shuffle(rows)
    return rows


def _score(rows, env, agent):
    return {(r["dataset"], r["question_id"]): r["score"] for r in rows
            if r["env_name"] == env and r["method"] == f"agent:{agent}" and r["error"] is None}


def _expected_diff(rows, env, a, b):
    """Mean over datasets of the mean paired difference on the questions both scored."""
    sa, sb = _score(rows, env, a), _score(rows, env, b)
    per_dataset = []
    for dataset in ("d1", "d2"):
        both = [k for k in sa if k in sb and k[0] == dataset]
        if both:
            per_dataset.append(statistics.fmean(sa[k] - sb[k] for k in both))
    return statistics.fmean(per_dataset), sum(1 for k in sa if k in sb)


@pytest.mark.parametrize("seed", range(6))
def test_matrix_cells_against_a_restatement(seed):
    rows = _rows(seed)
    matrix = env_pool.transfer_matrix(rows, AGENTS, ENVS)
    assert [(c["agent"], c["env"]) for c in matrix] == [(a, e) for a in AGENTS for e in ENVS]
    for cell in matrix:
        scores = _score(rows, cell["env"], cell["agent"])
        assert cell["n"] == len(scores)
        assert cell["mean"] == pytest.approx(statistics.fmean(scores.values()))
        assert cell["ci_low"] <= cell["mean"] <= cell["ci_high"]
        if cell["agent"] == "base":
            assert "vs_untrained" not in cell
            continue
        diff, n = _expected_diff(rows, cell["env"], cell["agent"], "base")
        vs = cell["vs_untrained"]
        assert vs["diff"] == pytest.approx(diff) and vs["n"] == n
        assert vs["ci_low"] <= vs["diff"] <= vs["ci_high"]


@pytest.mark.parametrize("seed", range(6))
def test_pool_against_each_specialist_and_the_worst(seed):
    rows = _rows(seed)
    result = env_pool.pool_vs_single(rows, ENVS)
    expected = {env: _expected_diff(rows, env, "pool", f"only-{env}")[0] for env in ENVS}
    for env in ENVS:
        assert result["per_env"][env]["diff"] == pytest.approx(expected[env])
    worst = result["worst"]
    assert worst["env"] == min(expected, key=expected.get)
    assert worst["diff"] == pytest.approx(min(expected.values()))


def test_a_shift_of_one_agent_moves_only_its_differences():
    """Adding 0.1 to every score of the pool agent on one environment moves exactly those differences by 0.1."""
    rows = [dict(r, error=None, score=r["score"] if r["score"] is not None else 0.5) for r in _rows(7)]
    shifted = [dict(r, score=r["score"] + 0.1) if (r["method"], r["env_name"]) == ("agent:pool", "other") else r
               for r in rows]
    before, after = env_pool.pool_vs_single(rows, ENVS), env_pool.pool_vs_single(shifted, ENVS)
    assert after["per_env"]["other"]["diff"] == pytest.approx(before["per_env"]["other"]["diff"] + 0.1)
    assert after["per_env"]["small"]["diff"] == pytest.approx(before["per_env"]["small"]["diff"])


def test_arms_train_each_member_alone_and_the_pool():
    from prompt_r1.config.experiment import parse_config

    cfg = parse_config({"train": {"environments": [dict(e) for e in env_pool.TINY_ENVS]}})
    arms = env_pool.arm_configs(cfg)
    assert list(arms) == ["only-tiny-env", "only-tiny-smollm2-env", "pool"]
    assert [[e.name for e in c.training_environments()] for c in arms.values()] == [
        ["tiny-env"], ["tiny-smollm2-env"], ["tiny-env", "tiny-smollm2-env"]]
    assert arms["only-tiny-env"].train.environments == [] and arms["pool"] is cfg
    with pytest.raises(SystemExit, match="at least two"):
        env_pool.arm_configs(parse_config({}))


def test_a_work_folder_keeps_finished_work_for_the_same_settings_only(tmp_path):
    """What a stopped run left in its work folder is reused by the next run with the same settings
    (an arm only while its agent is still there); other settings are refused, nothing is overwritten."""
    settings = {"config": "configs/learning-pool.yaml", "steps": 8, "probe_limit": None, "overrides": []}
    work = env_pool.WorkFolder(tmp_path, settings)
    agent = tmp_path / "pool" / "agent"
    agent.mkdir(parents=True)
    work.save_arm("pool", {"agent_path": str(agent), "train_s": 1.0})
    work.save_arm("only-a", {"agent_path": str(tmp_path / "gone"), "train_s": 2.0})
    work.save_eval("base", [{"question_id": "q1", "score": 0.5}], 3.0)
    again = env_pool.WorkFolder(tmp_path, dict(settings))
    assert again.finished_arm("pool") == {"agent_path": str(agent), "train_s": 1.0}
    assert again.finished_arm("only-a") is None and again.finished_arm("only-b") is None  # its agent is gone
    assert again.evaluated("base") == {"rows": [{"question_id": "q1", "score": 0.5}], "eval_s": 3.0}
    assert again.evaluated("pool") is None
    with pytest.raises(SystemExit, match="other settings"):
        env_pool.WorkFolder(tmp_path, {**settings, "steps": 4})
    assert env_pool.WorkFolder(tmp_path, settings).finished_arm("pool") is not None  # still there
