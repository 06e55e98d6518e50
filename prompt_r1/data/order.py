"""Deterministic, resumable order of training questions.

A run's data order is a pure function of (question ids, batch size, seed): batch number
`position` is always the same list, so a run resumed at a checkpoint's saved position sees
exactly the batches an uninterrupted run would have seen, with none repeated or skipped.
Each epoch is a fresh shuffle seeded by `derive_seed("data_order", seed, epoch)`; the last
incomplete batch of an epoch is dropped (every GRPO step gets the same number of questions),
unless there are fewer questions than one batch, in which case every batch is the whole
(shuffled) list.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from prompt_r1.core.seeding import derive_seed


def batches_per_epoch(n_questions: int, batch_size: int) -> int:
    """Batches in one epoch (at least 1).

    >>> batches_per_epoch(10, 4), batches_per_epoch(3, 4)
    (2, 1)
    """
    return max(1, n_questions // batch_size)


def epoch_order(question_ids: list[str], seed: int, epoch: int) -> list[str]:
    """The question order of one epoch (a seeded shuffle, independent of any global RNG)."""
    order = list(question_ids)
    random.Random(derive_seed("data_order", seed, epoch)).shuffle(order)
    return order


def batches(question_ids: list[str], batch_size: int, seed: int,
            start_position: int = 0) -> Iterator[tuple[int, list[str]]]:
    """Endless `(position, batch)` pairs from `start_position` on.

    >>> run = batches(list("abcdefg"), 3, seed=1)
    >>> full = [next(run) for _ in range(5)]
    >>> resumed = batches(list("abcdefg"), 3, seed=1, start_position=3)
    >>> [next(resumed) for _ in range(2)] == full[3:]
    True
    >>> sorted(full[0][1] + full[1][1]) == sorted(set(full[0][1] + full[1][1]))  # no repeats in an epoch
    True
    >>> full[3][1] == epoch_order(list("abcdefg"), 1, epoch=1)[3:6]  # 2 batches an epoch: the 2nd of epoch 1
    True
    """
    if not question_ids:
        raise ValueError("no questions to draw batches from (is the training pool empty?)")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    per_epoch = batches_per_epoch(len(question_ids), batch_size)
    position = start_position
    order: list[str] = []
    cached_epoch = -1
    while True:
        epoch, index = divmod(position, per_epoch)
        if epoch != cached_epoch:
            order, cached_epoch = epoch_order(question_ids, seed, epoch), epoch
        yield position, order[index * batch_size:(index + 1) * batch_size]
        position += 1
