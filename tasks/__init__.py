"""The orchestration shell under `flows/`: the Prefect stages (`stages`: ingestion, one
environment's evaluation, the training schedule's stages as tasks), Prefect UI artifacts
(`artifacts`), crash recovery of scheduled runs (`recovery`), MLflow (`tracking/`: runs, evaluation runs, traces, the registry) and the agent as
an MLflow pyfunc model (`agent_model`; registered versions pickle its class by this path, so it
stays here). The library (`prompt_r1/`) never imports this package.
"""
