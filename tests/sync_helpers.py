"""Test helper: a weight update as a rollout engine receives it from Ray's object store.

`ray.get` in an actor hands each tensor of a `WeightUpdate` over as a read-only view of shared
memory (the bytes travel out of band, `core.weights`). Writing into such a view would corrupt the
stored object for every other reader, so an engine must copy what it receives into its own
weights and never write the received tensors. `as_received` makes the same read-only views in
process (pickle 5 with immutable buffers), so a test can load them and check they are unchanged.
"""

from __future__ import annotations

import pickle

from prompt_r1.core.weights import WeightUpdate


def as_received(update: WeightUpdate) -> WeightUpdate:
    """`update` after the trip an engine sees: pickled out of band, rebuilt on read-only buffers."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(update, protocol=5, buffer_callback=buffers.append)
    return pickle.loads(data, buffers=[memoryview(bytes(b.raw())) for b in buffers])


def snapshot(update: WeightUpdate) -> dict:
    """Copies of the received tensors, to show afterwards that nothing wrote into them."""
    return {name: t.clone() for name, t in update.tensors.items()}
