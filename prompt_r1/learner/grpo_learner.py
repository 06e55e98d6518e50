"""The GRPO learner: turns one batch of trajectories into optimiser steps on the agent policy.

`GRPOLearner` owns the policy, its frozen reference, AdamW and the lr schedule. `step()` is four
parts, as verl keeps computing log-probs apart from updating the policy: `prepare` (group
advantages, `core.grpo`, per token under turn credit, `core.turn_credit`; the mini-batch plan and
the padded prompt + response micro-batches, `batches`), `logprobs` (old-policy and reference
log-probs with the current weights, no gradient; sampling log-probs from another engine are only
compared, never trusted for the ratio), `update` (`ppo_epochs` x mini-batches of
`mini_batch_questions` questions, one optimiser step each, x micro-batches of `micro_batch_size`
trajectories, gradients accumulated so the sum equals the full mini-batch loss) and `metrics`
(loss statistics, summed over ranks once). The batch's own statistics (`rollout_stats`: rewards,
turns, lengths) are no part of the update: the training session computes them, whichever learner
it has. The policy and its reference are built by `policy_build`; the weights leave by `weights_out`.

Precision: weights, gradients and AdamW state are always float32 ("master weights"); with
`agent.dtype: bfloat16` only the forward/backward compute runs in bfloat16: under autocast, or,
for FSDP on a GPU, by FSDP's `MixedPrecisionPolicy` (weights gathered in bfloat16, gradients
reduced in float32; no autocast, so no second bfloat16 copy of each gathered weight). At lr 1e-6
a bfloat16 weight cannot take the update (its spacing near 0.02 is about 1e-4), so updating
bfloat16 weights directly would leave almost every weight unchanged.

Log-probs (old, new and reference) are those of the sampling distribution, softmax(logits / T)
at `agent.temperature`, which is what the policy backends report for each sampled token.

The sampler against the learner (`core.rollout_correction`): the ratio keeps the recomputed old
log-probs; the sampling log-probs the engine recorded (`Trajectory.logprobs`) enter as a truncated
importance weight per token (cap `train.tis_cap`) when a batch may come from weights up to k updates
older (`rollout.max_staleness` >= 1) or `train.rollout_correction` asks for it, and as a geometric
sequence mask where it asks for that.

As one rank of a learner group (`train.world_size` > 1, `ray_group`) it holds a `Ranks` from
`collectives` (global token counts, gradient sums, sharding) and trains its share of every mini-batch.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Collection
from contextlib import nullcontext
from pathlib import Path

import torch
from transformers import AutoTokenizer

from prompt_r1.config.experiment import Config
from prompt_r1.core.grpo import packed_token_logprobs, policy_loss, token_logprobs
from prompt_r1.core.seeding import derive_seed
from prompt_r1.core.tokens import pad_token_id, stop_token_ids, torch_dtype
from prompt_r1.core.trajectory import Trajectory
from prompt_r1.core.turn_credit import token_advantages, turn_advantages, turn_spans
from prompt_r1.core.weights import WeightUpdate
from prompt_r1.models.bundled import model_load_errors
from prompt_r1.learner.advantages import outcome_advantages
from prompt_r1.learner.batches import (MicroBatch, check_packable, collate, empty_micro_batch,
                                       informative_question_ids, pack, pack_groups, plan_mini_batches, question_order)
from prompt_r1.learner.collectives import Ranks, tied_aliases
from prompt_r1.learner.devices import autocast_dtype, resolve_device
from prompt_r1.learner.finite import check_finite_update
from prompt_r1.learner.policy_build import build_policy
from prompt_r1.learner.update_state import PreparedBatch, UpdateSums, run_correction
from prompt_r1.learner.weights_out import adapter_update, merged_state_dict, on_device_update

log = logging.getLogger(__name__)


class GRPOLearner:
    """Policy + reference + optimiser; `step(trajectories)` is one GRPO update."""

    def __init__(self, cfg: Config, model_path: str | Path, device: str | None = None,
                 ranks: Ranks | None = None) -> None:
        """`device` overrides `cfg.train.device` (same spellings); `ranks` makes this learner one
        rank of a group (see `collectives`), the default is a learner alone."""
        cfg.check_trainable()
        self.cfg, self.model_path = cfg, str(model_path)
        self.ranks = ranks or Ranks()
        self.device = resolve_device(device or cfg.train.device)
        self.compute_dtype = autocast_dtype(self.device, cfg.agent.dtype, cfg.train.autocast)
        self.temperature = cfg.agent.temperature
        self.correction = run_correction(cfg)  # token TIS (stale, or asked for), the geometric mask, the metrics
        with model_load_errors(self.model_path, "agent.model"):
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.pad_id = pad_token_id(self.tokenizer, stop_token_ids(self.tokenizer))
        # LoRA's initial weights and dropout masks come from the global torch RNG: seed it from the
        # run seed so two runs learn alike (checkpoints save and restore its state for resumes)
        torch.manual_seed(derive_seed("learner", cfg.seed))
        self.use_lora = cfg.agent.lora.enabled
        self.syncs_on_device = cfg.syncs_on_device(self.device.type)
        self._handed_over: WeightUpdate | None = None  # the last on-device sync, kept until it is verified
        # FSDP on a GPU: weights gathered in bfloat16 by FSDP itself, instead of autocast's copies
        self.mixed_precision = self.compute_dtype if self.ranks.builds_on_meta and self.device.type == "cuda" else None
        if self.mixed_precision is not None:
            self.compute_dtype = None
        self.model, self.reference = build_policy(cfg, self.model_path, self.ranks, self.device,
                                                  self.mixed_precision)
        if cfg.train.pack_tokens:  # packed rows must mean what padded ones do on this model
            check_packable(self.model)
        # a micro-batch's shared prompt runs once (`token_logprobs`' share_prefix): not where forward
        # passes are collectives (FSDP) or where gradient checkpointing drops the cache it needs
        self.share_prefix = not self.ranks.matched_forwards and not cfg.train.gradient_checkpointing
        # names in the optimiser's order: checkpoints key its state by these positions
        self.param_names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        low = sorted({str(p.dtype) for p in self.params if p.dtype != torch.float32})
        if low:  # AdamW on low-precision weights loses nearly every update at RL learning rates
            raise ValueError(f"trainable weights in {low}: the learner needs float32 master weights; "
                             "set the low-precision dtype as agent.dtype (autocast compute) instead")
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
        warmup = cfg.train.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup > 0 else 1.0)

    # -- log-probs ---------------------------------------------------------------------------
    def _reference_context(self):
        return self.model.disable_adapter() if self.use_lora else nullcontext()

    def _logprobs(self, model: torch.nn.Module, batch: MicroBatch) -> torch.Tensor:
        """Float32 log-probs of the tempered distribution; the forward runs under autocast if set."""
        autocast = (torch.autocast(self.device.type, dtype=self.compute_dtype) if self.compute_dtype
                    else nullcontext())
        with autocast:
            chunk = self.cfg.train.logits_chunk_tokens
            if batch.packed:
                return packed_token_logprobs(model, batch.input_ids, batch.attention_mask, batch.position_ids,
                                             batch.response, self.temperature, chunk_tokens=chunk)
            return token_logprobs(model, batch.input_ids, batch.attention_mask, batch.start, self.temperature,
                                  share_prefix=self.share_prefix, chunk_tokens=chunk)

    @torch.no_grad()
    def _logprobs_no_grad(self, batch: MicroBatch, reference: bool) -> torch.Tensor:
        model = self.model if (self.use_lora or not reference) else self.reference
        with self._reference_context() if reference else nullcontext():
            return self._logprobs(model, batch)

    def response_logprobs(self, trajectories: list[Trajectory], reference: bool = False) -> list[torch.Tensor]:
        """Per-trajectory log-probs of `token_ids` under the current (or reference) policy, as the
        learner computes them for the ratio: comparable 1:1 with `Trajectory.logprobs`."""
        if reference and not self.use_lora and self.reference is None:
            raise ValueError("no reference policy: train.kl_coef is 0 under full fine-tuning")
        resp_lens = [len(t.token_ids) for t in trajectories]
        was_training = self.model.training
        self.model.eval()
        out: list[torch.Tensor] = [torch.empty(0)] * len(trajectories)
        size = self.cfg.train.micro_batch_size
        for m in range(0, len(trajectories), size):
            batch = collate(trajectories, list(range(m, min(m + size, len(trajectories)))), self.pad_id, self.device)
            for i, v in zip(batch.indices, batch.split(self._logprobs_no_grad(batch, reference), resp_lens)):
                out[i] = v
        self.model.train(was_training)
        return out

    # -- the update --------------------------------------------------------------------------
    def step(self, trajectories: list[Trajectory], plan: list[list[str]] | None = None) -> dict[str, float]:
        """One GRPO update on a rollout batch; returns the update's metrics (loss statistics, group
        counts, throughput: the batch's own statistics, `rollout_stats`, are the caller's).

        `plan` is a learner rank's share of the batch (from `LearnerGroup`): the questions it
        trains in each optimiser step of the whole batch, one list per step (possibly empty, and
        `trajectories` possibly none). Without it the learner plans the batch itself
        (`plan_mini_batches`). Counts that normalise the loss and the metrics are summed over ranks."""
        self._handed_over = None  # verified by now (colocated runs sync before sampling): its memory is free
        started = time.perf_counter()
        batch = self.prepare(trajectories, plan)
        if batch.empty:
            return self.skipped(batch, started)
        old, ref = self.logprobs(batch)
        sums = self.update(batch, old, ref)
        return self.metrics(batch, sums, started)

    def prepare(self, trajectories: list[Trajectory], plan: list[list[str]] | None) -> PreparedBatch:
        """The batch as this rank trains it: advantages, group counts (summed over ranks) and the
        micro-batches of every planned mini-batch (none when nothing is planned)."""
        if not trajectories and plan is None:
            raise ValueError("GRPOLearner.step got no trajectories")
        train = self.cfg.train
        if self.correction.needs_sampler and any(len(t.logprobs) != len(t.token_ids) for t in trajectories):
            raise ValueError("rollout.max_staleness >= 1 and train.rollout_correction need the sampling log-prob of "
                             "every response token (Trajectory.logprobs, recorded by the rollout engine); a trajectory "
                             "has none: roll out with the rollout pool, or set max_staleness 0 and the correction off")
        question_index = {q: i for i, q in enumerate(question_order(trajectories))}
        advantages, token_advantages = self._advantages(trajectories, question_index)
        with_turns = self.cfg.reward.turn_credit
        informative_questions = informative_question_ids(trajectories, with_turns)
        n_groups, n_informative = self.ranks.sum([len(question_index), len(informative_questions)])
        group_metrics = {"groups": n_groups, "groups_informative": n_informative,
                         "informative_share": n_informative / n_groups}
        prompt_lens = [len(t.prompt_ids) for t in trajectories]
        resp_lens = [len(t.token_ids) for t in trajectories]
        (longest,) = self.ranks.max([max(resp_lens, default=0)])
        # mini-batches of whole questions, then micro-batches of trajectories; with
        # drop_uniform_groups the groups of equal rewards (advantage 0 everywhere) are left out, so
        # they add neither KL nor tokens to the normalisation, and cost no forward pass
        if plan is None:
            plan = plan_mini_batches(trajectories, train.mini_batch_questions, train.drop_uniform_groups, with_turns)
        planned = {q for mini in plan for q in mini}
        return PreparedBatch(
            trajectories, resp_lens, advantages, token_advantages,
            max_len=max(self.cfg.agent.max_response_tokens, int(longest)),
            mini_batches=self._micro_batches(trajectories, plan) if plan else [],
            trained_tokens=sum(prompt_lens[i] + resp_lens[i]
                               for i, t in enumerate(trajectories) if t.question_id in planned),
            group_metrics=group_metrics)

    def _advantages(self, trajectories: list[Trajectory],
                    question_index: dict[str, int]) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Each trajectory's outcome advantage within its GRPO group (`core.grpo`) and, under turn
        credit, each of its response tokens' (`_token_advantages`; else None). A rank holds whole
        groups, so its advantages are those one learner computes on the whole batch."""
        advantages = outcome_advantages(trajectories, self.cfg, question_index)  # also what rollout traces show
        # turn credit: one advantage per response token, the outcome's plus the turn's (core.turn_credit);
        # a scaffold's cross-entropy term also moves single tokens
        if not self.cfg.reward.turn_credit and not self.cfg.rollout.scaffold.ce_coef:
            return advantages, None
        return advantages, self._token_advantages(trajectories, advantages)

    def _micro_batches(self, trajectories: list[Trajectory], plan: list[list[str]]) -> list[list[MicroBatch]]:
        """Each planned mini-batch's trajectories in micro-batches of `train.micro_batch_size`, or
        packed into sequences of at most `train.pack_tokens` tokens."""
        size, budget = self.cfg.train.micro_batch_size, self.cfg.train.pack_tokens
        mini_batches: list[list[MicroBatch]] = []
        for questions in plan:
            chosen = set(questions)
            idx = [i for i, t in enumerate(trajectories) if t.question_id in chosen]
            if budget:
                lengths = [len(trajectories[i].prompt_ids) + len(trajectories[i].token_ids) for i in idx]
                mini_batches.append([pack(trajectories, run, self.device) for run in pack_groups(idx, lengths, budget)])
            else:
                mini_batches.append([collate(trajectories, idx[m:m + size], self.pad_id, self.device)
                                     for m in range(0, len(idx), size)])
        if self.ranks.matched_forwards:  # FSDP: a forward pass is a collective, so all ranks run as many
            for mini, count in zip(mini_batches, self.ranks.max([len(mini) for mini in mini_batches])):
                mini.extend(empty_micro_batch(self.pad_id, self.device) for _ in range(int(count) - len(mini)))
        return mini_batches

    def skipped(self, batch: PreparedBatch, started: float) -> dict[str, float]:
        """The metrics of a batch with nothing planned: its group counts, and no optimiser or lr-schedule step."""
        log.info("no group with unequal rewards in this batch: no update (train.drop_uniform_groups)")
        return {**batch.group_metrics, "update_skipped": 1.0, "lr": self.optimizer.param_groups[0]["lr"],
                "step_time_s": time.perf_counter() - started}

    def logprobs(self, batch: PreparedBatch) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
        """Old-policy and reference log-probs of every trajectory with the current weights, before any
        update (reference: None each when `train.kl_coef` is 0). Without LoRA dropout the first
        mini-batch's old log-probs are left None: its first training forward is the same pass, and
        `update` takes them from it."""
        self.model.eval()
        old_lp: list[torch.Tensor | None] = [None] * len(batch.trajectories)
        ref_lp: list[torch.Tensor | None] = [None] * len(batch.trajectories)
        lazy_first = not (self.use_lora and self.cfg.agent.lora.dropout > 0)  # no dropout: same forward
        for mb_i, mini in enumerate(batch.mini_batches):
            for micro in mini:
                if mb_i > 0 or not lazy_first:
                    for i, v in zip(micro.indices, batch.split(micro, self._logprobs_no_grad(micro, False))):
                        old_lp[i] = v
                if self.cfg.train.kl_coef > 0:
                    for i, v in zip(micro.indices, batch.split(micro, self._logprobs_no_grad(micro, True))):
                        ref_lp[i] = v
        return old_lp, ref_lp

    def update(self, batch: PreparedBatch, old_lp: list[torch.Tensor | None],
               ref_lp: list[torch.Tensor | None]) -> UpdateSums:
        """`train.ppo_epochs` passes over the mini-batches, one optimiser step each (gradients of its
        micro-batches accumulated, summed over ranks, clipped), then one lr-schedule step. The old
        log-probs `logprobs` left None are filled in from their first pass. Returns this rank's sums."""
        train = self.cfg.train
        self.model.train()
        sums = UpdateSums()
        for epoch in range(train.ppo_epochs):
            for mini_i, mini in enumerate(batch.mini_batches):
                # the whole mini-batch's counts, over all ranks: each rank's loss is its share of
                # the one-learner loss, so the summed gradient is the one-learner gradient
                counts = self.ranks.sum([sum(b.loss_mask.sum().item() for b in mini),
                                         sum(len(b.indices) for b in mini)])
                self.optimizer.zero_grad(set_to_none=True)
                for micro in mini:
                    self._accumulate_gradient(batch, micro, old_lp, ref_lp, counts, sums, first_epoch=epoch == 0)
                self.ranks.reduce_gradients(self.params)
                norm = self.ranks.clip_grad_norm(self.params, train.max_grad_norm)
                # a NaN or inf gradient stops the step here, before the optimiser applies it
                sums.grad_norms.append(check_finite_update(norm, epoch, mini_i, len(batch.mini_batches)))
                self.optimizer.step()
        sums.lr = self.optimizer.param_groups[0]["lr"]  # the lr of these steps, before the schedule moves on
        self.scheduler.step()
        self.model.eval()
        return sums

    def _accumulate_gradient(self, batch: PreparedBatch, micro: MicroBatch, old_lp: list[torch.Tensor | None],
                             ref_lp: list[torch.Tensor | None], counts: list[float], sums: UpdateSums,
                             first_epoch: bool) -> None:
        """Forward, loss and backward of one micro-batch, its loss weighted by its share of the
        mini-batch's global `counts` (loss tokens, sequences); its statistics go into `sums`."""
        train = self.cfg.train
        logprobs = self._logprobs(self.model, micro)
        if not micro.indices:  # padding (FSDP): the pass's collectives, no gradient
            (logprobs.sum() * 0.0).backward()
            return
        if old_lp[micro.indices[0]] is None:  # lazy: first and only pass, weights untouched
            for i, v in zip(micro.indices, batch.split(micro, logprobs)):
                old_lp[i] = v
        old = micro.scatter(old_lp).to(self.device)
        ref = micro.scatter(ref_lp).to(self.device) if train.kl_coef > 0 else None
        adv = batch.micro_advantages(micro).to(self.device)
        # the sampler against the old policy (older weights, other numerics): each token's policy term
        # weighted by min(exp(old - sampler), train.tis_cap) and/or masked with its trajectory
        seq_ids = batch.sequence_ids(micro).to(self.device) if self.correction.per_sequence else None
        tis, weights = self.correction.weights(old, micro.sampling_logprobs.to(self.device), micro.loss_mask, seq_ids)
        # the clipped GRPO objective plus the k3 KL to the reference (core.grpo.policy_loss)
        loss, stats = policy_loss(logprobs, old, ref, adv, micro.loss_mask, train.clip_low,
                                  train.clip_high, train.kl_coef, train.loss_agg, batch.max_len,
                                  clip_ratio_c=train.clip_ratio_c, is_weights=weights)
        mini_tokens, mini_seqs = counts
        if train.loss_agg == "token-mean":  # a token mean over the mini-batch: weighted by its tokens
            weight = stats["tokens"] / max(mini_tokens, 1.0)
        else:  # a sequence mean over the mini-batch: weighted by its sequences
            weight = len(micro.indices) / mini_seqs
        (loss * weight).backward()  # accumulated: the micro-batches' sum is the mini-batch's loss
        sums.add_loss(stats)
        if first_epoch:  # the sampler against the old policy, once per sampled token (a scaffold's have no sampler)
            sums.add_sampling_gap(micro, old, tis, train.tis_cap, micro.scatter(batch.sampled_masks(micro)))
            if self.correction.measures:  # never with a scaffold (Config refuses the two together)
                sums.add_mismatch(micro, old, seq_ids, self.correction)

    def metrics(self, batch: PreparedBatch, sums: UpdateSums, started: float) -> dict[str, float]:
        """The update's metrics from this rank's `sums`, summed over ranks in one collective (one
        more for the sampler's importance weights and mismatch): loss statistics per loss token, the
        batch's group counts, mean gradient norm, lr, sampler-vs-learner log-prob gap, throughput."""
        train = self.cfg.train
        elapsed = time.perf_counter() - started
        keys = sorted(sums.loss)
        total_tokens = float(batch.trained_tokens) * train.ppo_epochs
        *summed, tokens_seen, diff_sum, diff_tokens, total_tokens = self.ranks.sum(
            [sums.loss[k] for k in keys] + [sums.tokens, sums.diff, sums.diff_tokens, total_tokens])
        metrics = {key: value / max(tokens_seen, 1.0) for key, value in zip(keys, summed)}
        metrics.update(batch.group_metrics)
        metrics.update({
            "grad_norm": sum(sums.grad_norms) / len(sums.grad_norms),
            "lr": sums.lr,
            "logprob_diff": diff_sum / max(diff_tokens, 1.0),
            "step_time_s": elapsed,
            "tokens_per_s": total_tokens / elapsed if elapsed > 0 else math.inf,
        })
        if self.correction.token_weights or self.correction.measures:  # one more collective, on every rank alike
            summed = self.ranks.sum(sums.correction_values())
            metrics.update(sums.correction_metrics(summed, diff_tokens, self.correction))
        return metrics

    def _token_advantages(self, trajectories: list[Trajectory], advantages: torch.Tensor) -> list[torch.Tensor]:
        """Per trajectory, the advantage of each response token: its outcome advantage, plus under turn
        credit `reward.turn.weight` times its turn's group-centred turn reward (`core.turn_credit`),
        plus `rollout.scaffold.ce_coef` on every agent token of a scaffolded member whose reward
        reached `verified_at`: at the on-policy ratio of 1 that adds exactly the gradient of
        ce_coef x the tokens' negative log-likelihood (a cross-entropy on the verified success,
        normalised as the policy loss is), and the PPO clip bounds it as it bounds any token."""
        if self.cfg.reward.turn_credit:
            missing = [t.question_id for t in trajectories if not t.turn_rewards]
            if missing:
                raise ValueError(f"reward.turn.scorer is set but trajectories of question {missing[0]!r} carry no "
                                 "turn rewards: score them first (TrainingSession.score sets Trajectory.turn_rewards)")
            turn_adv = turn_advantages([t.turn_rewards for t in trajectories], [t.question_id for t in trajectories])
        else:  # no turn credit: every turn carries the outcome's advantage alone
            turn_adv = [[0.0] * len(turn_spans(t.loss_mask)) for t in trajectories]
        weight = self.cfg.reward.turn.weight
        scaffold = self.cfg.rollout.scaffold
        out = []
        for t, a, ta in zip(trajectories, advantages.tolist(), turn_adv, strict=True):
            verified = bool(t.scaffold_turns) and t.reward is not None and t.reward.total >= scaffold.verified_at
            bonus = scaffold.ce_coef if verified else 0.0
            out.append(torch.tensor(token_advantages(float(a), ta, t.loss_mask, weight), dtype=torch.float32)
                       + bonus * torch.tensor(t.loss_mask, dtype=torch.float32))
        return out

    # -- weights out (`weights_out`) ------------------------------------------------------------
    @torch.no_grad()
    def weights_for_sync(self, version: int) -> WeightUpdate | None:
        """The weight sync for the rollout engines, as policy `version` (updates applied): under
        LoRA the adapter alone (float32, a few MB) with its LoraConfig, else the full weights of
        `merged_state_dict`, tied weights once (an engine ties them itself, as it does loading the
        model's own files). Checksummed here (see `core.weights`). Under FSDP every rank must call
        it; rank 0 gets the update, others None. Where the engines share this learner's GPU
        (`Config.syncs_on_device`) the full weights stay on it: one cast copy the engines map and
        copy from, kept until the next `step`."""
        if self.syncs_on_device:  # handed over in this GPU's memory (`core.device_share`)
            self._handed_over = on_device_update(self.model, tied_aliases(self.model),
                                                 torch_dtype(self.cfg.agent.dtype), self.device, version)
            return self._handed_over
        if not self.use_lora:
            full = self.merged_state_dict(skip=tied_aliases(self.model))
            return WeightUpdate.make(version, "full", full) if full else None
        return adapter_update(self.model, version)

    @torch.no_grad()
    def merged_state_dict(self, skip: Collection[str] = ()) -> dict[str, torch.Tensor]:
        """Plain HF state dict of the current weights (LoRA deltas merged in, model untouched), on
        CPU in the rollout dtype (`agent.dtype`), without the names in `skip` (`weights_out`).
        Under FSDP every rank must call it (the weights are gathered); rank 0 gets them, others `{}`."""
        return merged_state_dict(self.model, self.ranks, self.use_lora, torch_dtype(self.cfg.agent.dtype), skip)
