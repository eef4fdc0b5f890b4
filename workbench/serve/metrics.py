"""`GET /metrics`: the engine's state and the requests' latencies in Prometheus' text format, with
the workbench's own facts no other server exports: admission refusals by reason and the prefix
cache's hits. Kept in the HTTP process, from the engine's message of each step; each metric's
help string says what it counts."""

from __future__ import annotations

LATENCY_BUCKETS = (
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
    80.0,
)


DELIVERY_BUCKETS = (0.0001, 0.0002, 0.0005, *LATENCY_BUCKETS)


class Metrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.running = Gauge("workbench_requests_running", "requests running", registry=r)
        self.waiting = Gauge("workbench_requests_waiting", "requests waiting", registry=r)
        self.pages_in_use = Gauge(
            "workbench_kv_pages_in_use", "KV pages held by requests", registry=r
        )
        self.pages_total = Gauge("workbench_kv_pages_total", "KV pages in the pool", registry=r)
        self.evictable = Gauge(
            "workbench_kv_tokens_evictable", "cached prefix tokens no request holds", registry=r
        )
        self.prompt_tokens = Counter(
            "workbench_prompt_tokens", "prompt tokens of finished requests", registry=r
        )
        self.cached_tokens = Counter(
            "workbench_prefix_cache_hit_tokens",
            "prompt tokens found in the prefix cache",
            registry=r,
        )
        self.generation_tokens = Counter(
            "workbench_generation_tokens", "tokens sent to clients", registry=r
        )
        self.finished = Counter(
            "workbench_requests_finished", "requests ended, by reason", ["reason"], registry=r
        )
        self.refusals = Counter(
            "workbench_admission_refusals",
            "admission refusals of waiting requests, one per request and step, by reason",
            ["reason"],
            registry=r,
        )
        self.rejected = Counter(
            "workbench_http_rejected", "requests answered with an error", ["status"], registry=r
        )
        self.ttft = Histogram(
            "workbench_time_to_first_token_seconds",
            "arrival at the server to the first token",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "workbench_inter_token_latency_seconds",
            "between two tokens of one request",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.step = Histogram(
            "workbench_step_seconds",
            "one engine step (host wall time)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.delivery = Histogram(
            "workbench_step_delivery_seconds",
            "a step's tokens, from the engine's send to this process handing them to the "
            "responses (how far the HTTP side runs behind the engine)",
            buckets=DELIVERY_BUCKETS,
            registry=r,
        )

    def engine_state(self, state: dict) -> None:
        """The engine's queue, running set and KV pool after its last step (`EngineLoop.flush`)."""
        self.running.set(state["running"])
        self.waiting.set(state["waiting"])
        page = state["page_size"]
        in_use = state["kv_total"] - state["kv_free"] - state["kv_evictable"]
        self.pages_in_use.set(in_use // page)
        self.pages_total.set(state["kv_total"] // page)
        self.evictable.set(state["kv_evictable"])

    def text(self) -> tuple[bytes, str]:
        """The exposition and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
