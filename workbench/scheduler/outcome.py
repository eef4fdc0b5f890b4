"""What a scheduler step hands on: the batch in flight, the step's outcome, a failure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..core import Admissions, Batch, Req, ReqView
from ..engine.engine import DeviceStep
from ..stages import StageClock


class StepError(RuntimeError):
    """A scheduler step failed; the requests of its batch ended with finish_reason "error" and
    gave back what they held. The engine keeps serving the others. `stage`: where it failed,
    one of `stages.STAGES` ("prepare", "plan", "forward", "sample", "wait", "collect", ...)."""

    def __init__(self, stage: str, uids: list[int], message: str) -> None:
        self.stage, self.uids = stage, uids
        super().__init__(
            f"a step failed in {stage} ({message}); requests {uids} ended with "
            'finish_reason="error" and their KV pages and slots were freed'
        )


@dataclass
class InFlight:
    """A launched batch whose tokens have not been processed yet."""

    index: int
    batch: Batch
    admissions: Admissions
    device: DeviceStep  # the sampled tokens' host copy, its ready event, the device timer
    launched_at: float
    padded_size: int
    cuda_graph: bool
    page_rows: dict[int, tuple] | None = None  # record="full": slot runs each row gained
    launch_ms: float = 0.0  # host time to schedule, prepare and enqueue this batch
    overlapped: bool = False  # set when the next batch is launched before this is collected
    # its host time by stage, from launch to record (paused in between)
    clock: StageClock = field(default_factory=StageClock)
    padded_tokens: int = 0  # tokens as run, padding included (0: not known)

    @property
    def rows(self) -> list[ReqView]:
        """The ledgers as launched (built when first asked for)."""
        return self.batch.launched_views()


@dataclass
class StepOutcome:
    """What one scheduler step did; `record` is its StepRecord when recording is on."""

    launched: InFlight
    tokens: list[int | None]  # per sampled request; None where dropped (past its end)
    finished: list[Req]  # requests whose last token came from this batch
    completed_at: float
    # host time in collect: blocked on the device's tokens, then processing them. With overlap,
    # waiting near zero means the host is the bottleneck; a long wait, the device.
    wait_ms: float = 0.0
    collect_ms: float = 0.0
    record: Any = None

    @property
    def index(self) -> int:
        return self.launched.index

    @property
    def batch(self) -> Batch:
        return self.launched.batch

    @property
    def rows(self) -> list[ReqView]:
        """The batch's ledgers as launched (before the forward moved them)."""
        return self.launched.rows

    @property
    def admissions(self) -> Admissions:
        return self.launched.admissions


class Occupancy(NamedTuple):
    """The scheduler's resources after a step, as a record keeps them."""

    queue_len: int  # requests waiting (a prompt part-way through its chunks included)
    running: int  # requests decoding
    free_slots: int  # request slots free
    kv_free: int  # KV slots free
    kv_evictable: int  # KV slots only the prefix cache holds
    kv_total: int
