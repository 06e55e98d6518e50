"""How far the vLLM CPU agent's log-probs are from the float32 learner's on the demo's two-hop batch
(issue 65 item 3): the `rollout_corr/*` metrics of `train.rollout_correction: metrics`, measured.

Why it exists: the tests compare the learner with a plain torch sampler
(tests/learner/test_learner_rollout_correction.py, float rounding only) and with vLLM on short single-turn samples (tests/policy/test_policy.py, within
2e-3). This rolls out the demo's own kind of batch (configs/demo.yaml: two-hop questions from
data/compositional, `rollout.group_size` samples each, up to `rollout.max_turns` turns around
environment replies) with the demo's vLLM CPU agent, then computes, with a float32 learner that
has the same weights (no update), each agent token's log-prob through the learner's own micro-batches
and the metrics the learner logs, from `core.rollout_correction` (agent tokens only).

    .venv/bin/python -m benchmarks.speed.rollout_mismatch                    # demo.yaml's first batch
    .venv/bin/python -m benchmarks.speed.rollout_mismatch --agent smollm2-135m-instruct --quick
    .venv/bin/python -m benchmarks.speed.rollout_mismatch --env-kind vllm   # the demo's managed server

The environment is the demo's model in this process by default (`--env-kind inprocess`, greedy as
the demo's server): its replies are loss-mask 0 and never count, so only the agent matters here.
The questions are the first `rollout.batch_questions` of the two-hop train split (the demo's own
first batch is a seeded draw from the same split). Nothing here asserts a value.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import yaml


ROOT = Path(__file__).resolve().parents[2]


def two_hop_questions(n: int):
    from prompt_r1.core.questions import QuestionRow

    path = ROOT / "data/compositional/train/compositional_train.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()[:n]]
    return [QuestionRow(f"q{i}", r["dataset"], "train", r["question"], r["answers"], r["task_family"], "f1")
            for i, r in enumerate(rows)]


def rollout(cfg, env_kind: str, n_questions: int, group: int):
    """The batch's trajectories from the config's agent (its backend) against its environment."""
    from prompt_r1.env import open_environment
    from prompt_r1.models.bundled import resolve_model
    from prompt_r1.policy import make_policy
    from prompt_r1.rollout.episode import rollout_batch

    policy = make_policy(cfg.agent, resolve_model(cfg.agent.model), seed=cfg.seed)
    env_cfg = cfg.environment.model_copy(update={"kind": env_kind})
    try:
        with open_environment(env_cfg, log_dir=Path("/tmp/prompt-r1-bench-logs")) as env:
            async def run():
                try:
                    return await rollout_batch(policy, env, two_hop_questions(n_questions), cfg.agent, cfg.rollout,
                                               cfg.reward, group_size=group, seed=cfg.seed, score=True)
                finally:
                    await env.aclose()

            return asyncio.run(run())
    finally:
        if hasattr(policy, "close"):
            policy.close()


def measure(cfg, trajectories) -> dict[str, float]:
    """Each agent token's |sampler - learner| and the `rollout_corr/*` metrics, through the learner's
    micro-batches (`GRPOLearner.prepare`), with no update."""
    from prompt_r1.core.rollout_correction import mismatch_metrics, mismatch_sums
    from prompt_r1.learner.grpo_learner import GRPOLearner
    from prompt_r1.models.bundled import resolve_model

    learner = GRPOLearner(cfg, resolve_model(cfg.agent.model))
    batch = learner.prepare(trajectories, None)
    sums: dict[str, float] = {}
    gaps: list[float] = []
    for mini in batch.mini_batches:
        for micro in mini:
            old = learner._logprobs_no_grad(micro, reference=False)
            seq_ids = batch.sequence_ids(micro)
            part = mismatch_sums(old, micro.sampling_logprobs, micro.loss_mask, seq_ids, cfg.train.tis_cap,
                                 (cfg.train.rollout_correction.geo_low, cfg.train.rollout_correction.geo_high))
            sums = {k: sums.get(k, 0.0) + v for k, v in part.items()}
            agent = micro.loss_mask > 0
            gaps += (old - micro.sampling_logprobs)[agent].abs().tolist()
    gaps.sort()
    return {"agent_tokens": len(gaps), "logprob_diff": statistics.fmean(gaps),
            "abs_diff_p50": gaps[len(gaps) // 2], "abs_diff_p99": gaps[int(0.99 * (len(gaps) - 1))],
            "abs_diff_max": gaps[-1], **mismatch_metrics(sums)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(ROOT / "configs" / "demo.yaml"))
    p.add_argument("--agent", default=None, help="agent.model (default: the config's)")
    p.add_argument("--backend", default=None, help="agent.backend (default: the config's, the demo's vllm)")
    p.add_argument("--env-kind", default="inprocess", choices=["inprocess", "vllm"])
    p.add_argument("--quick", action="store_true", help="2 questions x 2 samples")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override (YAML value), e.g. agent.vllm_max_model_len=4096")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = p.parse_args()
    from prompt_r1.cli.logging_setup import setup_logging
    from prompt_r1.config.experiment import load_config

    setup_logging()
    # every group measured (uniform ones too), no turn credit: the learner only computes log-probs here
    overrides = {"train.rollout_correction.mode": "metrics", "train.device": "cpu", "agent.dtype": "float32",
                 "train.drop_uniform_groups": False, "reward.turn.scorer": None}
    if args.agent:
        overrides["agent.model"] = args.agent
    if args.backend:
        overrides["agent.backend"] = args.backend
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key] = yaml.safe_load(value)
    cfg = load_config(args.config, overrides)
    n_questions, group = (2, 2) if args.quick else (cfg.rollout.batch_questions, cfg.rollout.group_size)
    started = time.perf_counter()
    sampled = rollout(cfg, args.env_kind, n_questions, group)
    trajectories = [t for t in sampled if t.error is None]
    if len(trajectories) < len(sampled):
        print(f"{len(sampled) - len(trajectories)} of {len(sampled)} trajectories ended by an environment failure: "
              f"left out ({sampled[0].error if sampled[0].error else ''})")
    rollout_s = time.perf_counter() - started
    figures = measure(cfg, trajectories)
    turns = statistics.fmean(len(t.agent_turns) for t in trajectories)
    print(f"{cfg.name}: {len(trajectories)} trajectories ({n_questions} two-hop questions x {group}), "
          f"{turns:.2f} agent turns each, agent {cfg.agent.model} on {cfg.agent.backend} "
          f"({cfg.agent.dtype}, T={cfg.agent.temperature}), environment {cfg.environment.model} ({args.env_kind}); "
          f"rollout {rollout_s:.0f} s; learner float32 on the CPU, same weights")
    for key, value in figures.items():
        print(f"  {key:34s} {value:.3g}")
    if args.json:
        args.json.write_text(json.dumps({"config": args.config, "agent": cfg.agent.model,
                                         "backend": cfg.agent.backend, "env_kind": args.env_kind,
                                         "trajectories": len(trajectories), **figures}, indent=1))


if __name__ == "__main__":
    main()
