"""An hour of faults: the `pipeline` and `train` deployments on a schedule, with faults injected
from a seeded plan, then counted (`python -m benchmarks.soak.run`, BENCHMARKS.md "An hour of faults").

Why a package: the plan (`plan`) is pure data with its own tests, the injectors (`faults`) touch
processes, mounts and sockets, the services (`services`) start and stop the Prefect server and
worker (with the automation that retries a crashed run), the Prefect API calls (`prefect_api`)
stop the schedules and collect the runs, the first call (`calls`) makes every training question
ask the environment, and the checks (`checks`) only read what the runs left (warehouse, run
folders, MLflow, Prefect), so each can be read and tested on its own.
"""
