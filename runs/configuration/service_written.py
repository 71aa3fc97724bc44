"""`type: service` as written: the keys a service has beyond a task's, with dstack 0.22.5's types,
defaults and rules (its ServiceConfigurationParams, ReplicaGroup, ScalingSpec and RateLimit).

Only these keys are read here; the task keys a service shares (commands, image, env, resources,
probes, retry, fleets, ...) are read by the task parser (runs/configuration/service.py hands them
on), so both kinds of run read them the same way.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import ValidationInfo, field_validator, model_validator

from .durations import parse_duration
from .fields import WrittenModel, check_group_name
from .ranges import parse_count_range

# dstack's scaling windows (seconds) and delays' defaults
SCALING_WINDOWS = (30, 60, 300)
SCALING_METRICS = ("rps", "queue")
MAX_QUEUE_WINDOW = 600  # metric: queue averages its own samples: any window up to this
DEFAULT_WINDOW = 60
DEFAULT_SCALE_UP_DELAY = 300
DEFAULT_SCALE_DOWN_DELAY = 600
MAX_REPLICAS = 1000
_HEADER_KEY = re.compile(r"^[a-zA-Z0-9-_]{1,500}$")
_PREFIX = re.compile(r"^/[^\s\\{}]*$")
# printable ASCII but `#`: the bytes of a request line (anything else %-escaped)
_PATH = re.compile(r"/[\x21\x22\x24-\x7e]*")
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]{0,199}$")
ROUTER_TYPES = ("smg", "dynamo")
WORKER_ROLES = ("prefill", "decode", "regular")


def parse_replicas(value: object) -> tuple[int, int]:
    """`2` -> (2, 2); `0..4` -> (0, 4); `..4` -> (0, 4) (dstack: the minimum defaults to 0);
    {min, max}. The maximum is required, as in dstack."""
    low, high = parse_count_range(value, "replicas")
    if high is None:
        raise ValueError("the maximum number of replicas is required: write e.g. 1..4")
    if high > MAX_REPLICAS:
        raise ValueError(f"replicas is at most {MAX_REPLICAS}")
    return (0 if low is None else low), high


class ScalingInput(WrittenModel):
    metric: Literal["rps", "queue"]
    target: float
    window: Any = None
    scale_up_delay: Any = DEFAULT_SCALE_UP_DELAY
    scale_down_delay: Any = DEFAULT_SCALE_DOWN_DELAY
    # `metric: queue` only (Muster's own): the Prometheus gauge each replica serves, and where
    queue_metric: str | None = None
    metrics_port: Any = None  # None: the service's port
    metrics_path: str | None = None  # None: /metrics

    @field_validator("metric", mode="before")
    @classmethod
    def _metric(cls, value: object) -> object:
        if value not in SCALING_METRICS:
            raise ValueError("metric must be rps (requests per second, as dstack) or queue (the queue depth the "
                             "replicas report on a Prometheus gauge, with `queue_metric`)")
        return value

    @field_validator("target", mode="before")
    @classmethod
    def _target(cls, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError("target must be a number above 0: the requests per second (metric: rps) or the "
                             "queued requests (metric: queue) one replica takes")
        return float(value)

    @field_validator("window")
    @classmethod
    def _window(cls, value: object, info: ValidationInfo) -> int:
        queue = info.data.get("metric") == "queue"
        if value is None:
            return DEFAULT_WINDOW
        seconds = parse_duration(value)
        if queue and not 1 <= seconds <= MAX_QUEUE_WINDOW:
            raise ValueError(f"window (metric: queue) is a duration from 1s to {MAX_QUEUE_WINDOW // 60}m")
        if not queue and seconds not in SCALING_WINDOWS:
            raise ValueError(f"window must be one of {', '.join(f'{w}s' for w in SCALING_WINDOWS)}")
        return seconds

    @field_validator("scale_up_delay", "scale_down_delay")
    @classmethod
    def _delay(cls, value: object) -> int:
        return parse_duration(value)

    @field_validator("queue_metric")
    @classmethod
    def _queue_metric(cls, value: str | None) -> str | None:
        if value is not None and not _METRIC_NAME.fullmatch(value):
            raise ValueError("queue_metric is a Prometheus metric name (letters, digits, _ and :), e.g. "
                             "sglang:num_queue_reqs or vllm:num_requests_waiting")
        return value

    @field_validator("metrics_port")
    @classmethod
    def _metrics_port(cls, value: object) -> int | None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535):
            raise ValueError("metrics_port is the port the replicas serve their metrics on: a number from 1 to 65535 "
                             "(leave it out for the service's port)")
        return value  # type: ignore[return-value]

    @field_validator("metrics_path")
    @classmethod
    def _metrics_path(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > 1024 or not _PATH.fullmatch(value)):
            raise ValueError("metrics_path is a path starting with `/`, of printable ASCII without spaces or `#` "
                             "(%-escape anything else), e.g. /metrics")
        return value

    @model_validator(mode="after")
    def _keys_of_the_metric(self) -> ScalingInput:
        queue_keys = [k for k in ("queue_metric", "metrics_port", "metrics_path") if getattr(self, k) is not None]
        if self.metric == "queue" and self.queue_metric is None:
            raise ValueError("metric: queue needs `queue_metric`: the gauge the replicas serve, e.g. "
                             "sglang:num_queue_reqs (SGLang) or vllm:num_requests_waiting (vLLM)")
        if self.metric == "rps" and queue_keys:
            raise ValueError(f"{', '.join(queue_keys)} is for metric: queue (metric: rps counts the endpoint's "
                             "requests)")
        return self


class _RateLimitKey(WrittenModel):
    type: Literal["ip_address", "header"] = "ip_address"
    header: str | None = None

    @model_validator(mode="after")
    def _header(self) -> _RateLimitKey:
        if self.type == "header" and (self.header is None or not _HEADER_KEY.fullmatch(self.header)):
            raise ValueError("a header key needs `header`: letters, digits, - and _")
        if self.type == "ip_address" and self.header is not None:
            raise ValueError("`header` is for `type: header`")
        return self


class RateLimitInput(WrittenModel):
    prefix: str = "/"
    key: _RateLimitKey = _RateLimitKey()
    rps: float
    burst: int = 0

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if len(value) > 4094 or not _PREFIX.fullmatch(value):
            raise ValueError("prefix is a path starting with `/`, without spaces, `\\`, `{` or `}`")
        return value

    @field_validator("rps", mode="before")
    @classmethod
    def _rps(cls, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 1 / 60:
            raise ValueError("rps must be a number of at least 1/60 (one request a minute)")
        return float(value)

    @field_validator("burst")
    @classmethod
    def _burst(cls, value: int) -> int:
        if value < 0:
            raise ValueError("burst cannot be negative")
        return value


class ModelInput(WrittenModel):
    """dstack's `model` mapping (OpenAIChatModel / TGIChatModel)."""

    type: Literal["chat"] = "chat"
    name: str
    format: Literal["openai", "tgi"]
    prefix: str = "/v1"  # openai only
    chat_template: str | None = None  # tgi only
    eos_token: str | None = None


class RouterInput(WrittenModel):
    type: str = "smg"

    @field_validator("type")
    @classmethod
    def _type(cls, value: str) -> str:
        value = "smg" if value == "sglang" else value  # dstack's legacy name, accepted until its 0.23
        if value not in ROUTER_TYPES:
            raise ValueError(f"router type must be one of {', '.join(ROUTER_TYPES)}")
        return value


class RolloutInput(WrittenModel):
    """`rollout`: how an update of a service with a `router` group is rolled (docs/services.md)."""

    max_surge: Any = None

    @field_validator("max_surge")
    @classmethod
    def _max_surge(cls, value: object) -> int | None:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError("max_surge must be a whole number of replicas, at least 1 (the new deployment's "
                             "router needs a host beside the serving one), or left out for a full second copy")
        return value  # type: ignore[return-value]


class WorkerInput(WrittenModel):
    """A replica group's `worker`: how the router registers its replicas, over what they report."""

    role: Any = None
    bootstrap_port: Any = None

    @field_validator("role")
    @classmethod
    def _role(cls, value: object) -> str | None:
        if value is not None and value not in WORKER_ROLES:
            raise ValueError(f"worker.role is one of {', '.join(WORKER_ROLES)} (got {value!r}): the role the "
                             "router gives this group's replicas")
        return value  # type: ignore[return-value]

    @field_validator("bootstrap_port")
    @classmethod
    def _bootstrap_port(cls, value: object) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
            raise ValueError("worker.bootstrap_port is the prefill's KV-transfer bootstrap port: a number from 1 "
                             "to 65535")
        return value

    @model_validator(mode="after")
    def _prefill_only(self) -> WorkerInput:
        if self.bootstrap_port is not None and self.role not in (None, "prefill"):
            raise ValueError(f"worker.bootstrap_port is a prefill worker's: remove it, or set worker.role: prefill "
                             f"(not {self.role})")
        return self


class ServiceKeys(WrittenModel):
    """The service's own top-level keys; everything else of the document is the task parser's."""

    port: Any
    gateway: Any = None
    strip_prefix: bool = True
    model: Any = None  # a name, or a mapping read as ModelInput by the parser (each problem named)
    https: Any = None
    auth: bool = True
    scaling: ScalingInput | None = None
    rate_limits: list[RateLimitInput] = []
    replicas: Any = None
    groups: list[Any] | None = None
    rollout: RolloutInput | None = None

    @field_validator("port")
    @classmethod
    def _port(cls, value: object) -> int:
        return service_port(value)

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, value: object) -> tuple[int, int] | None:
        return None if value is None else parse_replicas(value)

    @field_validator("gateway")
    @classmethod
    def _gateway(cls, value: object) -> bool | str | None:
        if value is not None and not isinstance(value, bool) and not (isinstance(value, str) and value.strip()):
            raise ValueError("gateway is a gateway's name, true or false")
        return value  # type: ignore[return-value]

    @field_validator("https")
    @classmethod
    def _https(cls, value: object) -> bool | str | None:
        if value is not None and not isinstance(value, bool) and value != "auto":
            raise ValueError("https is true, false or auto")
        return value  # type: ignore[return-value]

    @field_validator("model")
    @classmethod
    def _model(cls, value: object) -> str | dict | None:
        if value is not None and not isinstance(value, dict) and not (isinstance(value, str) and value.strip()):
            raise ValueError("model is the model's name, or a mapping {name, format: openai | tgi, prefix}")
        return value  # type: ignore[return-value]

    @field_validator("rate_limits")
    @classmethod
    def _unique_prefixes(cls, value: list[RateLimitInput]) -> list[RateLimitInput]:
        prefixes = [limit.prefix for limit in value]
        twice = sorted({p for p in prefixes if prefixes.count(p) > 1})
        if twice:
            raise ValueError(f"prefix {', '.join(twice)} is used more than once: each rate limit has its own prefix")
        return value



def scaling_problem(replicas: tuple[int, int] | None, scaling: ScalingInput | None) -> tuple[str, str] | None:
    """(the key to name, the problem) when `replicas` and `scaling` do not go together (dstack's rule)."""
    low, high = replicas or (1, 1)
    if low != high and scaling is None:
        return "scaling", f"replicas {low}..{high} is a range: it needs `scaling` (metric: rps, target: N)"
    if low == high and scaling is not None:
        return "replicas", "`scaling` needs `replicas` to be a range, e.g. replicas: 1..4"
    if scaling is not None and scaling.metric == "queue" and low == 0:
        return "replicas", (f"metric: queue needs at least 1 replica: a group at zero reports no queue to scale up "
                            f"on; write replicas: 1..{high}")
    return None


def service_port(value: object) -> int:
    """dstack's `port`: a number, `"80:8000"` (only the second, the app's port, is used), or
    {local_port, container_port}."""
    if isinstance(value, dict):
        unknown = [str(k) for k in value if k not in ("local_port", "container_port")]
        if unknown or "container_port" not in value:
            raise ValueError("port as a mapping is {container_port: N} (local_port is ignored, as in dstack)")
        value = value["container_port"]
    if isinstance(value, str) and ":" in value:
        value = value.partition(":")[2]
    if isinstance(value, str) and value.isascii() and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValueError("port is the port the replicas serve on: a number from 1 to 65535")
    return value


# What a replica group may say besides the task group keys, read here; the rest goes to the task
# parser's group reader (`nodes` too: the hosts of one replica). `slices` and `depends_on` do not
# apply to a replica.
GROUP_SERVICE_KEYS = ("replicas", "count", "scaling", "router", "worker", "python", "nvcc", "docker", "privileged",
                      "spot_policy", "reservation")
GROUP_REFUSED = {
    "slices": "TPU multislice replicas are not supported yet: set `nodes` for a replica over several hosts",
    "on_slice_failure": "TPU multislice replicas are not supported yet: it is a key of a multislice set",
    "depends_on": "replicas start on their own: a service's groups have no depends_on",
    "ports": "a replica serves on the service's `port`",
    "on_failure": "a failed replica is replaced with the run's `retry` policy, not a group's on_failure",
    "max_restarts": "a failed replica is replaced with the run's `retry` policy",
}


class ReplicaGroupInput(WrittenModel):
    model_config = {**WrittenModel.model_config, "extra": "ignore"}  # the rest is the task group's

    name: str | None = None
    replicas: Any = None
    count: Any = None
    scaling: ScalingInput | None = None
    router: RouterInput | None = None
    worker: WorkerInput | None = None
    python: Any = None
    nvcc: bool | None = None
    docker: bool | None = None
    privileged: bool | None = None
    spot_policy: Literal["spot", "on-demand", "auto"] | None = None
    reservation: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        return check_group_name(value)

    @field_validator("replicas", "count")
    @classmethod
    def _replicas(cls, value: object) -> tuple[int, int] | None:
        return None if value is None else parse_replicas(value)

    @property
    def range(self) -> tuple[int, int]:
        found = self.replicas if self.replicas is not None else self.count
        return found if found is not None else (1, 1)

    def problems(self) -> list[tuple[str, str]]:
        """(key, problem) of the rules between this group's keys."""
        out = []
        if self.replicas is None and self.count is None:
            out.append(("replicas", "a replica group needs `replicas` (or `count`): a number or a range"))
        if self.python and self.docker:
            out.append(("docker", "`python` and `docker` cannot be used together within a replica group"))
        if self.privileged is False and self.docker:
            out.append(("privileged", "`privileged: false` is incompatible with `docker: true` "
                        "(docker-in-docker is privileged)"))
        scaling = scaling_problem(self.range, self.scaling)
        return [*out, scaling] if scaling else out
