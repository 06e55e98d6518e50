"""TextGrad baseline entry point.

`textgrad` (optional extra `baselines`: it pulls litellm, boto3, datasets, pandas) is not wired
to the project's environment client yet, so the method stops with a clear error instead of
producing numbers from another code path.
"""

from __future__ import annotations

from prompt_r1.baselines.base import BaselineError


async def optimise(env, optimizer_env, questions, cfg, budget):
    try:
        import textgrad  # noqa: F401
    except ImportError:
        raise BaselineError("the `textgrad` method needs the optional extra: "
                            "`.venv/bin/pip install -e '.[baselines]'`") from None
    raise BaselineError("the `textgrad` method is not implemented yet; use `opro` or `gepa`")
