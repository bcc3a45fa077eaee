"""Pydantic models of the RolloutPool spec: the single source of the CRD schema.

Every field carries a docstring (it becomes the CRD's ``description``), a camelCase
alias (the wire name) and its validation bounds. Rules that span several fields are
written twice on purpose: as a CEL rule in ``x-kubernetes-validations`` (so the API
server rejects the manifest) and as a pydantic validator (so the operator and tests
reject exactly the same manifests); ``tests/test_crd_sync.py`` checks they agree.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

from rolloutpool.api.corev1 import (
    ENV_VAR_SCHEMA,
    EXTRA_ARG_MAX_LENGTH,
    GPU_LIMIT_MESSAGE,
    GPU_LIMIT_RULE,
    POD_TEMPLATE_SCHEMA,
    RESOURCES_SCHEMA,
    check_env,
    check_gpu_limit,
    check_pod_template,
    check_resources,
)

__all__ = [
    "AutoscalingSpec",
    "ConcurrencySpec",
    "EngineKind",
    "EngineSpec",
    "HostPathSource",
    "KvDtype",
    "ModelShape",
    "ModelVolumeSpec",
    "PersistentVolumeClaimSource",
    "RolloutPoolSpec",
    "RouterSpec",
    "RouterTraceSpec",
    "SecretKeySpec",
    "SimulatorSpec",
    "SpecModel",
    "UpdateStrategySpec",
]

EngineKind = Literal["vllm", "simulated"]
KvDtype = Literal["bfloat16", "float16", "float32", "fp8"]


def _cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    entry: JsonDict = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


class SpecModel(BaseModel):
    """Base of every spec model: camelCase wire names, unknown fields rejected, JSON types strict.

    Strict mode makes pydantic reject what the API server rejects (``"4"`` for an
    integer), instead of coercing it.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        frozen=True,
        strict=True,
    )


class ModelShape(SpecModel):
    """Attention shape of the served model; sizes the KV cache per token."""

    layers: int = Field(ge=1, le=1024)
    """Number of transformer layers."""

    kv_heads: int = Field(ge=1, le=1024)
    """Number of key/value heads per layer (after grouped-query attention)."""

    head_dim: int = Field(ge=1, le=4096)
    """Dimension of one attention head."""

    kv_dtype: KvDtype = "bfloat16"
    """Data type of the KV cache."""

    weight_gib: float | None = Field(default=None, ge=0, le=4096)
    """Size of the model weights per replica in GiB; used to estimate KV capacity."""


class SimulatorSpec(SpecModel):
    """Settings of the CPU engine simulator, used when ``engine.kind`` is ``simulated``."""

    time_scale: float = Field(default=1.0, ge=0.001, le=10000)
    """Simulated seconds per wall-clock second (10 runs the model ten times faster)."""

    hardware: Literal["h100-80gb", "h200-141gb"] = "h100-80gb"
    """Cost-model preset of the simulated GPU."""


class PersistentVolumeClaimSource(SpecModel):
    """A PersistentVolumeClaim that holds the model weights."""

    claim_name: str = Field(min_length=1, max_length=253)
    """Name of the claim, in the pool's namespace."""

    read_only: bool = True
    """Mount it read-only (the default: replicas share it)."""


class HostPathSource(SpecModel):
    """A folder of the node that holds the model weights (pre-staged by the cluster's admins)."""

    path: str = Field(min_length=1, max_length=4096, pattern=r"^/")
    """Absolute path on the node."""


class ModelVolumeSpec(SpecModel):
    """Where the engine reads the model weights from, instead of downloading them at every start."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "has(self.persistentVolumeClaim) != has(self.hostPath)",
                    "engine.modelVolume needs exactly one of persistentVolumeClaim and hostPath",
                )
            ]
        }
    )

    persistent_volume_claim: PersistentVolumeClaimSource | None = None
    """The weights live on this claim."""

    host_path: HostPathSource | None = None
    """The weights live in this folder of every GPU node."""

    sub_path: str | None = Field(default=None, min_length=1, max_length=1024, pattern=r"^[^/].*$")
    """Folder inside the volume that holds the model (mounted at ``mountPath``)."""

    mount_path: str = Field(default="/models", min_length=2, max_length=1024, pattern=r"^/.+")
    """Where the weights appear in the engine container; vLLM serves this path under ``engine.model``."""

    @model_validator(mode="after")
    def _one_source(self) -> ModelVolumeSpec:
        if (self.persistent_volume_claim is None) == (self.host_path is None):
            raise ValueError("engine.modelVolume needs exactly one of persistentVolumeClaim and hostPath")
        return self


class SecretKeySpec(SpecModel):
    """One key of a Secret in the pool's namespace."""

    name: str = Field(min_length=1, max_length=253)
    """Name of the Secret."""

    key: str = Field(default="token", min_length=1, max_length=253)
    """Key inside the Secret."""


# The core/v1 objects passed through stay maps; their schema declares what CEL reads (api/corev1.py).
_EnvVar = Annotated[dict[str, Any], WithJsonSchema(ENV_VAR_SCHEMA)]
_Resources = Annotated[dict[str, Any], WithJsonSchema(RESOURCES_SCHEMA)]
_PodTemplate = Annotated[dict[str, Any], WithJsonSchema(POD_TEMPLATE_SCHEMA)]
_ExtraArg = Annotated[str, Field(max_length=EXTRA_ARG_MAX_LENGTH)]


class EngineSpec(SpecModel):
    """The inference engine each replica runs."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.kind != 'vllm' || has(self.image)",
                    "engine.image is required when engine.kind is vllm",
                    ".image",
                ),
                _cel(
                    "self.kind != 'vllm' || !has(self.gpusPerReplica) || self.gpusPerReplica >= 1",
                    "engine.gpusPerReplica must be at least 1 when engine.kind is vllm",
                    ".gpusPerReplica",
                ),
                _cel(GPU_LIMIT_RULE, GPU_LIMIT_MESSAGE, ".resources"),
            ]
        }
    )

    kind: EngineKind
    """``vllm`` runs the vLLM OpenAI server; ``simulated`` runs RolloutPool's CPU engine simulator."""

    model: str = Field(min_length=1, max_length=253)
    """Model to serve (a Hugging Face id or a path); also the served model name."""

    max_model_len: int = Field(ge=128, le=10_485_760)
    """Maximum context length in tokens (vLLM ``--max-model-len``)."""

    image: str | None = Field(default=None, min_length=1, max_length=512)
    """Container image of the engine; required for vllm, defaults to the operator's image when simulated."""

    gpus_per_replica: int = Field(default=1, ge=0, le=16)
    """GPUs per replica (``nvidia.com/gpu``); tensor parallel size for vllm."""

    gpu_memory_gib: float = Field(default=80.0, gt=0, le=4096)
    """Memory of one GPU in GiB; used with ``modelShape`` to estimate KV capacity."""

    gpu_memory_utilization: float = Field(default=0.9, ge=0.05, le=0.99)
    """Fraction of GPU memory vLLM may use (``--gpu-memory-utilization``)."""

    kv_capacity_tokens: int | None = Field(default=None, ge=16, le=1_000_000_000)
    """KV capacity per replica in tokens, when known; otherwise estimated, then read from the engine."""

    model_shape: ModelShape | None = None
    """Attention shape of the model, for the KV capacity estimate."""

    extra_args: list[_ExtraArg] = Field(default_factory=list, max_length=128)
    """Extra command-line arguments appended to the engine command (each at most 32 KiB)."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node selector of the engine pods."""

    tolerations: list[dict[str, Any]] = Field(default_factory=list, max_length=64)
    """Tolerations of the engine pods (core/v1 Toleration objects, passed through)."""

    affinity: dict[str, Any] | None = None
    """Affinity of the engine pods (a core/v1 Affinity, passed through)."""

    priority_class_name: str | None = Field(default=None, min_length=1, max_length=253)
    """PriorityClass of the engine pods."""

    image_pull_secrets: list[str] = Field(default_factory=list, max_length=16)
    """Names of Secrets used to pull the engine image."""

    model_volume: ModelVolumeSpec | None = None
    """Model weights from a PersistentVolumeClaim or a host path (vLLM then serves the mounted path)."""

    hf_token_secret: SecretKeySpec | None = None
    """Secret key exported as ``HF_TOKEN`` (gated models on the Hugging Face hub)."""

    env: list[_EnvVar] = Field(default_factory=list, max_length=256)
    """Extra environment variables of the engine container (core/v1 EnvVar objects), after the generated ones;
    each needs a name, and POD_IP, POD_NAME and POD_NAMESPACE are the operator's."""

    env_from: list[dict[str, Any]] = Field(default_factory=list, max_length=32)
    """ConfigMaps and Secrets exported whole into the engine container (core/v1 EnvFromSource objects)."""

    resources: _Resources | None = None
    """Requests and limits of the engine container (core/v1 ResourceRequirements). ``nvidia.com/gpu`` is set
    from ``gpusPerReplica`` for vllm; giving it here with another value is an error."""

    shm_size: str | None = Field(default=None, pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|K|M|G|T)?$")
    """Size limit of the engine's ``/dev/shm`` (a memory-backed emptyDir; NCCL needs several GiB for TP > 1)."""

    pod_template: _PodTemplate | None = None
    """Escape hatch: a partial core/v1 PodTemplateSpec (``metadata``, ``spec``) merged over the generated engine
    pod, last. Maps merge key by key; lists of named items (containers, initContainers, volumes, env,
    volumeMounts, ports) merge by ``name``; other lists are replaced. It may not rename the ``engine``
    container, set metadata name/namespace, or change ``rolloutpool.io/`` labels."""

    simulator: SimulatorSpec | None = None
    """Simulator settings; only used when ``kind`` is ``simulated``."""

    @model_validator(mode="after")
    def _check_kind(self) -> EngineSpec:
        if self.kind == "vllm" and self.image is None:
            raise ValueError("engine.image is required when engine.kind is vllm")
        if self.kind == "vllm" and self.gpus_per_replica < 1:
            raise ValueError("engine.gpusPerReplica must be at least 1 when engine.kind is vllm")
        check_env(self.env)
        if self.resources is not None:
            check_resources(self.resources)
        check_gpu_limit(self.kind, self.gpus_per_replica, self.resources)
        if self.pod_template is not None:
            check_pod_template(self.pod_template)
        return self


class ConcurrencySpec(SpecModel):
    """How the routers schedule turns on each replica (routing/workingset.py) and the ceiling on live sessions."""

    working_set_target: float = Field(default=0.9, ge=0.1, le=1.0)
    """Share of a replica's KV capacity its working set may fill: the contexts of generating sessions and of the
    idle sessions whose prefix the routers keep. A returning turn whose prefix was let go waits for room under it.
    With autoscaling, where the control law starts each replica."""

    keep_quantile: float = Field(default=0.99, gt=0.0, lt=1.0)
    """An idle session's prefix is kept (its lease) until this quantile of its predicted tool time, learned from the
    gaps between turns, and no longer than its break-even (``prefillTokensPerSecond``); after that it may be let go
    when a turn or a new session needs the room."""

    prefill_tokens_per_second: float = Field(default=40_000.0, ge=0.0, le=1e9)
    """The engines' prefill rate (an 8B model on an H100: about 40,000 tokens/s). An idle prefix is kept no longer than
    its break-even: the time its re-prefill would stall the replica's generating turns. 0: the lease alone."""

    hold_limit_seconds: float = Field(default=300.0, ge=0.0, le=86_400.0)
    """A held turn is served after this long whatever the room (bounded wait)."""

    max_sessions_per_replica: int | None = Field(default=None, ge=1, le=100_000)
    """Hard ceiling on live sessions per replica, whatever the working set has room for."""


class RouterTraceSpec(SpecModel):
    """The router's turn trace: each session's turns as JSONL (token counts only), for ``simulate --trace``."""

    enabled: bool = False
    """Record the trace at ``/var/lib/rolloutpool/trace.jsonl`` in the router pod (a new file per router start)."""

    max_bytes: int = Field(default=256 * 1024 * 1024, ge=512, le=64 * 1024 * 1024 * 1024)
    """The trace stops (a last ``stop`` line, a warning in the log) before it grows past this many bytes."""

    session_ids: Literal["hashed", "raw"] = "hashed"
    """``hashed``: session and group ids written as a keyed hash whose key is never written; ``raw``: as sent."""


class RouterSpec(SpecModel):
    """The session router placed in front of the engine replicas."""

    replicas: int = Field(default=1, ge=0, le=64)
    """Router pods."""

    image: str | None = Field(default=None, min_length=1, max_length=512)
    """Router image; defaults to the operator's image."""

    session_header: str = Field(
        default="X-Session-ID", min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9-]*$"
    )
    """HTTP header that carries the session id."""

    idle_timeout_seconds: int = Field(default=1800, ge=1, le=604_800)
    """A session idle this long is released (the safety net; release explicitly)."""

    queue_timeout_seconds: int = Field(default=600, ge=0, le=86_400)
    """How long a new session may wait for a free slot before a 503."""

    max_queue_length: int = Field(default=10_000, ge=0, le=1_000_000)
    """New sessions that may wait at once; beyond it the router answers 429."""

    prefix_renewal_seconds: float | None = Field(default=None, gt=0, le=86_400)
    """Renew an idle session's cached prefix (its last context, max_tokens=1) after this many seconds; unset: off."""

    trace: RouterTraceSpec = Field(default_factory=RouterTraceSpec)
    kv_events: bool = True
    """Engines publish their prefix cache's changes (vLLM's ``--kv-events-config``, ports 5557 and 5558) and the
    router keeps an exact index of which sessions' prefixes are still cached (docs/kv-events.md): a returning turn
    whose prefix is resident is served at once. Off: the router infers residency from ``cached_tokens``. An
    engine ``extraArgs`` entry of its own ``--kv-events-config`` turns the operator's off (wire the router's
    ``--kv-events`` yourself then)."""
    """Record each session's turns (prompt, cached and output tokens, tool gaps) for replay in the simulator."""


class AutoscalingSpec(SpecModel):
    """The control law: each replica's working-set target tuned from Prometheus KV-pressure signals."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "!has(self.enabled) || !self.enabled || has(self.prometheusUrl)",
                    "autoscaling.prometheusUrl is required when autoscaling.enabled is true",
                    ".prometheusUrl",
                ),
                _cel(
                    "!has(self.minTarget) || !has(self.maxTarget) || self.minTarget <= self.maxTarget",
                    "autoscaling.minTarget must not exceed autoscaling.maxTarget",
                    ".minTarget",
                ),
            ]
        }
    )

    enabled: bool = False
    """Tune each replica's working-set target with measured pressure; off: the routers keep
    ``concurrency.workingSetTarget``."""

    prometheus_url: str | None = Field(default=None, max_length=2048, pattern=r"^https?://[^\s]+$")
    """Base URL of the Prometheus that scrapes the engines and the router."""

    interval_seconds: int = Field(default=15, ge=5, le=3600)
    """Period of the control loop."""

    cooldown_seconds: int = Field(default=60, ge=0, le=86_400)
    """Minimum time between two target changes of one replica (anti-flap)."""

    decrease_factor: float = Field(default=0.9, ge=0.1, le=0.99)
    """Multiplicative cut of a target when kept prefixes are evicted or requests preempted."""

    target_step: float = Field(default=0.02, ge=0.0, le=0.5)
    """Raise of a target per cooldown while turns wait for room and nothing presses."""

    min_target: float = Field(default=0.5, ge=0.1, le=1.0)
    """The law never sets a target below this."""

    max_target: float | None = Field(default=None, ge=0.1, le=1.0)
    """The law never sets a target above this. Unset: the pool's ``concurrency.workingSetTarget``, so the law cuts a
    target under pressure and raises it back, never past it (in the simulator, raising past 0.9 cost 1-4 % of
    throughput at 3-4x load on every workload measured: docs/benchmarks.md)."""

    @model_validator(mode="after")
    def _check(self) -> AutoscalingSpec:
        if self.enabled and self.prometheus_url is None:
            raise ValueError("autoscaling.prometheusUrl is required when autoscaling.enabled is true")
        if self.max_target is not None and self.min_target > self.max_target:
            raise ValueError("autoscaling.minTarget must not exceed autoscaling.maxTarget")
        return self


class UpdateStrategySpec(SpecModel):
    """How replicas are removed and replaced."""

    drain_timeout_seconds: int = Field(default=1800, ge=0, le=604_800)
    """How long a draining replica may keep its live sessions before it is deleted anyway."""


class RolloutPoolSpec(SpecModel):
    """Desired state of a RolloutPool."""

    replicas: int = Field(ge=0, le=1024)
    """Number of engine replicas (one pod each)."""

    engine: EngineSpec
    """The engine every replica runs."""

    concurrency: ConcurrencySpec = Field(default_factory=ConcurrencySpec)
    """Turn scheduling on each replica and the ceiling on live sessions."""

    router: RouterSpec = Field(default_factory=RouterSpec)
    """The session router."""

    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    """The control law tuning each replica's working-set target."""

    update_strategy: UpdateStrategySpec = Field(default_factory=UpdateStrategySpec)
    """Drain and replacement of replicas."""
