"""The twin: the real scheduler, prefix cache and page table on predicted step times.

costs = fit_step_costs([load_run("a.parquet"), load_run("b.parquet")])  # recorded runs
twin = Workbench("dummy:qwen3-0.6b", step_costs=costs, max_extend_tokens=512)
twin.add_request(...); twin.run()    # steps, records, tables, views: as a real run's
validate_twin(real_runs, twin_runs)  # its error, beside the real runs' own noise
"""

from .accuracy import validate_twin, validation_summary
from .costs import StepCosts, fit_step_costs, load_step_costs
from .replay import replay_requests

__all__ = [
    "StepCosts",
    "fit_step_costs",
    "load_step_costs",
    "replay_requests",
    "validate_twin",
    "validation_summary",
]
