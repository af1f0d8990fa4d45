from hetero.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_PENDING: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]
    JOB_STATE_RESTARTING: _ClassVar[JobState]
    JOB_STATE_QUEUED: _ClassVar[JobState]

class RankState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RANK_STATE_UNSPECIFIED: _ClassVar[RankState]
    RANK_STATE_ASSIGNED: _ClassVar[RankState]
    RANK_STATE_RUNNING: _ClassVar[RankState]
    RANK_STATE_EXITED: _ClassVar[RankState]
    RANK_STATE_STOPPING: _ClassVar[RankState]
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_PENDING: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState
JOB_STATE_RESTARTING: JobState
JOB_STATE_QUEUED: JobState
RANK_STATE_UNSPECIFIED: RankState
RANK_STATE_ASSIGNED: RankState
RANK_STATE_RUNNING: RankState
RANK_STATE_EXITED: RankState
RANK_STATE_STOPPING: RankState

class RegisterNodeRequest(_message.Message):
    __slots__ = ("name", "address", "agent_endpoint", "agent_version", "devices", "host")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    AGENT_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    agent_endpoint: str
    agent_version: str
    devices: _containers.RepeatedCompositeFieldContainer[_types_pb2.DeviceProfile]
    host: _types_pb2.HostProfile
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., agent_endpoint: _Optional[str] = ..., agent_version: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[_types_pb2.DeviceProfile, _Mapping]]] = ..., host: _Optional[_Union[_types_pb2.HostProfile, _Mapping]] = ...) -> None: ...

class RegisterNodeResponse(_message.Message):
    __slots__ = ("node_id", "heartbeat_interval_s", "heartbeat_timeout_s", "allowed_roots")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_ROOTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    allowed_roots: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_id: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ..., heartbeat_timeout_s: _Optional[float] = ..., allowed_roots: _Optional[_Iterable[str]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "host", "devices", "sampled_at_unix_s")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    host: _types_pb2.HostTelemetry
    devices: _containers.RepeatedCompositeFieldContainer[_types_pb2.DeviceTelemetry]
    sampled_at_unix_s: float
    def __init__(self, node_id: _Optional[str] = ..., host: _Optional[_Union[_types_pb2.HostTelemetry, _Mapping]] = ..., devices: _Optional[_Iterable[_Union[_types_pb2.DeviceTelemetry, _Mapping]]] = ..., sampled_at_unix_s: _Optional[float] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ProbeRequest(_message.Message):
    __slots__ = ("payload", "reply_bytes")
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    REPLY_BYTES_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    reply_bytes: int
    def __init__(self, payload: _Optional[bytes] = ..., reply_bytes: _Optional[int] = ...) -> None: ...

class ProbeResponse(_message.Message):
    __slots__ = ("payload",)
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    def __init__(self, payload: _Optional[bytes] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Node(_message.Message):
    __slots__ = ("id", "name", "address", "agent_endpoint", "agent_version", "healthy", "registered_at_unix_s", "last_heartbeat_unix_s", "devices", "host", "telemetry", "draining", "host_profile")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    AGENT_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    HOST_PROFILE_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    address: str
    agent_endpoint: str
    agent_version: str
    healthy: bool
    registered_at_unix_s: float
    last_heartbeat_unix_s: float
    devices: _containers.RepeatedCompositeFieldContainer[_types_pb2.DeviceProfile]
    host: _types_pb2.HostTelemetry
    telemetry: _containers.RepeatedCompositeFieldContainer[_types_pb2.DeviceTelemetry]
    draining: bool
    host_profile: _types_pb2.HostProfile
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., address: _Optional[str] = ..., agent_endpoint: _Optional[str] = ..., agent_version: _Optional[str] = ..., healthy: bool = ..., registered_at_unix_s: _Optional[float] = ..., last_heartbeat_unix_s: _Optional[float] = ..., devices: _Optional[_Iterable[_Union[_types_pb2.DeviceProfile, _Mapping]]] = ..., host: _Optional[_Union[_types_pb2.HostTelemetry, _Mapping]] = ..., telemetry: _Optional[_Iterable[_Union[_types_pb2.DeviceTelemetry, _Mapping]]] = ..., draining: bool = ..., host_profile: _Optional[_Union[_types_pb2.HostProfile, _Mapping]] = ...) -> None: ...

class DrainNodeRequest(_message.Message):
    __slots__ = ("node", "undrain")
    NODE_FIELD_NUMBER: _ClassVar[int]
    UNDRAIN_FIELD_NUMBER: _ClassVar[int]
    node: str
    undrain: bool
    def __init__(self, node: _Optional[str] = ..., undrain: bool = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ...) -> None: ...

class RankPlacement(_message.Message):
    __slots__ = ("rank", "node_id", "node_name", "device_index", "device_kind", "device_name", "local_rank", "state", "exit_code", "emulated_slowdown")
    RANK_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    DEVICE_KIND_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    EMULATED_SLOWDOWN_FIELD_NUMBER: _ClassVar[int]
    rank: int
    node_id: str
    node_name: str
    device_index: int
    device_kind: _types_pb2.DeviceKind
    device_name: str
    local_rank: int
    state: RankState
    exit_code: int
    emulated_slowdown: float
    def __init__(self, rank: _Optional[int] = ..., node_id: _Optional[str] = ..., node_name: _Optional[str] = ..., device_index: _Optional[int] = ..., device_kind: _Optional[_Union[_types_pb2.DeviceKind, str]] = ..., device_name: _Optional[str] = ..., local_rank: _Optional[int] = ..., state: _Optional[_Union[RankState, str]] = ..., exit_code: _Optional[int] = ..., emulated_slowdown: _Optional[float] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("id", "time_unix_s", "kind", "message")
    ID_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    id: int
    time_unix_s: float
    kind: str
    message: str
    def __init__(self, id: _Optional[int] = ..., time_unix_s: _Optional[float] = ..., kind: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "name", "state", "policy", "global_batch", "world_size", "backend", "master_addr", "master_port", "submitted_at_unix_s", "finished_at_unix_s", "message", "restarts", "ranks", "plan", "spec_yaml", "events", "last_step", "live", "total_steps", "priority", "owner", "launcher")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    SPEC_YAML_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    LAUNCHER_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    state: JobState
    policy: str
    global_batch: int
    world_size: int
    backend: str
    master_addr: str
    master_port: int
    submitted_at_unix_s: float
    finished_at_unix_s: float
    message: str
    restarts: int
    ranks: _containers.RepeatedCompositeFieldContainer[RankPlacement]
    plan: _types_pb2.Plan
    spec_yaml: str
    events: _containers.RepeatedCompositeFieldContainer[JobEvent]
    last_step: int
    live: JobLive
    total_steps: int
    priority: int
    owner: str
    launcher: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., policy: _Optional[str] = ..., global_batch: _Optional[int] = ..., world_size: _Optional[int] = ..., backend: _Optional[str] = ..., master_addr: _Optional[str] = ..., master_port: _Optional[int] = ..., submitted_at_unix_s: _Optional[float] = ..., finished_at_unix_s: _Optional[float] = ..., message: _Optional[str] = ..., restarts: _Optional[int] = ..., ranks: _Optional[_Iterable[_Union[RankPlacement, _Mapping]]] = ..., plan: _Optional[_Union[_types_pb2.Plan, _Mapping]] = ..., spec_yaml: _Optional[str] = ..., events: _Optional[_Iterable[_Union[JobEvent, _Mapping]]] = ..., last_step: _Optional[int] = ..., live: _Optional[_Union[JobLive, _Mapping]] = ..., total_steps: _Optional[int] = ..., priority: _Optional[int] = ..., owner: _Optional[str] = ..., launcher: _Optional[str] = ...) -> None: ...

class AttachedRank(_message.Message):
    __slots__ = ("host", "device_name", "device_kind", "compute_score", "emulated_slowdown")
    HOST_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    DEVICE_KIND_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SCORE_FIELD_NUMBER: _ClassVar[int]
    EMULATED_SLOWDOWN_FIELD_NUMBER: _ClassVar[int]
    host: str
    device_name: str
    device_kind: _types_pb2.DeviceKind
    compute_score: float
    emulated_slowdown: float
    def __init__(self, host: _Optional[str] = ..., device_name: _Optional[str] = ..., device_kind: _Optional[_Union[_types_pb2.DeviceKind, str]] = ..., compute_score: _Optional[float] = ..., emulated_slowdown: _Optional[float] = ...) -> None: ...

class AttachJobRequest(_message.Message):
    __slots__ = ("name", "launcher", "launcher_job_id", "global_batch", "steps", "policy", "rebalance_interval", "min_batch", "ranks")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LAUNCHER_FIELD_NUMBER: _ClassVar[int]
    LAUNCHER_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    MIN_BATCH_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    name: str
    launcher: str
    launcher_job_id: str
    global_batch: int
    steps: int
    policy: str
    rebalance_interval: int
    min_batch: int
    ranks: _containers.RepeatedCompositeFieldContainer[AttachedRank]
    def __init__(self, name: _Optional[str] = ..., launcher: _Optional[str] = ..., launcher_job_id: _Optional[str] = ..., global_batch: _Optional[int] = ..., steps: _Optional[int] = ..., policy: _Optional[str] = ..., rebalance_interval: _Optional[int] = ..., min_batch: _Optional[int] = ..., ranks: _Optional[_Iterable[_Union[AttachedRank, _Mapping]]] = ...) -> None: ...

class AttachJobResponse(_message.Message):
    __slots__ = ("job_id", "plan")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    plan: _types_pb2.Plan
    def __init__(self, job_id: _Optional[str] = ..., plan: _Optional[_Union[_types_pb2.Plan, _Mapping]] = ...) -> None: ...

class DetachJobRequest(_message.Message):
    __slots__ = ("job_id", "failed", "message")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    failed: bool
    message: str
    def __init__(self, job_id: _Optional[str] = ..., failed: bool = ..., message: _Optional[str] = ...) -> None: ...

class StragglerFlag(_message.Message):
    __slots__ = ("rank", "ratio", "intervals", "message")
    RANK_FIELD_NUMBER: _ClassVar[int]
    RATIO_FIELD_NUMBER: _ClassVar[int]
    INTERVALS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    rank: int
    ratio: float
    intervals: int
    message: str
    def __init__(self, rank: _Optional[int] = ..., ratio: _Optional[float] = ..., intervals: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class JobLive(_message.Message):
    __slots__ = ("end_step", "plan_version", "samples_per_s", "equal_samples_per_s", "ideal_samples_per_s", "loss", "ranks", "stragglers", "emulated")
    END_STEP_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    EQUAL_SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    IDEAL_SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    STRAGGLERS_FIELD_NUMBER: _ClassVar[int]
    EMULATED_FIELD_NUMBER: _ClassVar[int]
    end_step: int
    plan_version: int
    samples_per_s: float
    equal_samples_per_s: float
    ideal_samples_per_s: float
    loss: float
    ranks: _containers.RepeatedCompositeFieldContainer[_types_pb2.RankIntervalStats]
    stragglers: _containers.RepeatedCompositeFieldContainer[StragglerFlag]
    emulated: bool
    def __init__(self, end_step: _Optional[int] = ..., plan_version: _Optional[int] = ..., samples_per_s: _Optional[float] = ..., equal_samples_per_s: _Optional[float] = ..., ideal_samples_per_s: _Optional[float] = ..., loss: _Optional[float] = ..., ranks: _Optional[_Iterable[_Union[_types_pb2.RankIntervalStats, _Mapping]]] = ..., stragglers: _Optional[_Iterable[_Union[StragglerFlag, _Mapping]]] = ..., emulated: bool = ...) -> None: ...

class GetJobDetailRequest(_message.Message):
    __slots__ = ("job_id", "max_intervals", "after_step")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_INTERVALS_FIELD_NUMBER: _ClassVar[int]
    AFTER_STEP_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    max_intervals: int
    after_step: int
    def __init__(self, job_id: _Optional[str] = ..., max_intervals: _Optional[int] = ..., after_step: _Optional[int] = ...) -> None: ...

class JobDetail(_message.Message):
    __slots__ = ("job", "intervals", "plans", "more")
    JOB_FIELD_NUMBER: _ClassVar[int]
    INTERVALS_FIELD_NUMBER: _ClassVar[int]
    PLANS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    job: Job
    intervals: _containers.RepeatedCompositeFieldContainer[_types_pb2.IntervalReport]
    plans: _containers.RepeatedCompositeFieldContainer[_types_pb2.Plan]
    more: bool
    def __init__(self, job: _Optional[_Union[Job, _Mapping]] = ..., intervals: _Optional[_Iterable[_Union[_types_pb2.IntervalReport, _Mapping]]] = ..., plans: _Optional[_Iterable[_Union[_types_pb2.Plan, _Mapping]]] = ..., more: bool = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("spec_yaml", "source_name", "dry_run", "priority")
    SPEC_YAML_FIELD_NUMBER: _ClassVar[int]
    SOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    spec_yaml: str
    source_name: str
    dry_run: bool
    priority: int
    def __init__(self, spec_yaml: _Optional[str] = ..., source_name: _Optional[str] = ..., dry_run: bool = ..., priority: _Optional[int] = ...) -> None: ...

class PolicyPrediction(_message.Message):
    __slots__ = ("policy", "batches", "predicted_step_s", "predicted_samples_per_s", "emulated", "comm_s")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_STEP_S_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    EMULATED_FIELD_NUMBER: _ClassVar[int]
    COMM_S_FIELD_NUMBER: _ClassVar[int]
    policy: str
    batches: _containers.RepeatedScalarFieldContainer[int]
    predicted_step_s: float
    predicted_samples_per_s: float
    emulated: bool
    comm_s: float
    def __init__(self, policy: _Optional[str] = ..., batches: _Optional[_Iterable[int]] = ..., predicted_step_s: _Optional[float] = ..., predicted_samples_per_s: _Optional[float] = ..., emulated: bool = ..., comm_s: _Optional[float] = ...) -> None: ...

class SubmitJobResponse(_message.Message):
    __slots__ = ("job_id", "job", "predictions")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    job: Job
    predictions: _containers.RepeatedCompositeFieldContainer[PolicyPrediction]
    def __init__(self, job_id: _Optional[str] = ..., job: _Optional[_Union[Job, _Mapping]] = ..., predictions: _Optional[_Iterable[_Union[PolicyPrediction, _Mapping]]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("states", "limit", "page_token")
    STATES_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[JobState]
    limit: int
    page_token: str
    def __init__(self, states: _Optional[_Iterable[_Union[JobState, str]]] = ..., limit: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token", "total")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    next_page_token: str
    total: int
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., total: _Optional[int] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class WatchOrdersRequest(_message.Message):
    __slots__ = ("node_id", "peer_probe_port", "peer_probe_token")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PEER_PROBE_PORT_FIELD_NUMBER: _ClassVar[int]
    PEER_PROBE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    peer_probe_port: int
    peer_probe_token: bytes
    def __init__(self, node_id: _Optional[str] = ..., peer_probe_port: _Optional[int] = ..., peer_probe_token: _Optional[bytes] = ...) -> None: ...

class TrainingArgs(_message.Message):
    __slots__ = ("command", "resume", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    command: _containers.RepeatedScalarFieldContainer[str]
    resume: bool
    options: _containers.ScalarMap[str, str]
    def __init__(self, command: _Optional[_Iterable[str]] = ..., resume: bool = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RankLaunch(_message.Message):
    __slots__ = ("job_id", "rank", "world_size", "local_rank", "master_addr", "master_port", "backend", "device_index", "device_kind", "emulated_slowdown", "args", "plan", "attempt", "collective_timeout_s")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    DEVICE_KIND_FIELD_NUMBER: _ClassVar[int]
    EMULATED_SLOWDOWN_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    backend: str
    device_index: int
    device_kind: _types_pb2.DeviceKind
    emulated_slowdown: float
    args: TrainingArgs
    plan: _types_pb2.Plan
    attempt: int
    collective_timeout_s: float
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., local_rank: _Optional[int] = ..., master_addr: _Optional[str] = ..., master_port: _Optional[int] = ..., backend: _Optional[str] = ..., device_index: _Optional[int] = ..., device_kind: _Optional[_Union[_types_pb2.DeviceKind, str]] = ..., emulated_slowdown: _Optional[float] = ..., args: _Optional[_Union[TrainingArgs, _Mapping]] = ..., plan: _Optional[_Union[_types_pb2.Plan, _Mapping]] = ..., attempt: _Optional[int] = ..., collective_timeout_s: _Optional[float] = ...) -> None: ...

class RankStop(_message.Message):
    __slots__ = ("job_id", "rank", "reason", "attempt")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    reason: str
    attempt: int
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., reason: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class Orders(_message.Message):
    __slots__ = ("launches", "stops", "sent_at_unix_s", "complete", "wanted", "measure_links")
    LAUNCHES_FIELD_NUMBER: _ClassVar[int]
    STOPS_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    WANTED_FIELD_NUMBER: _ClassVar[int]
    MEASURE_LINKS_FIELD_NUMBER: _ClassVar[int]
    launches: _containers.RepeatedCompositeFieldContainer[RankLaunch]
    stops: _containers.RepeatedCompositeFieldContainer[RankStop]
    sent_at_unix_s: float
    complete: bool
    wanted: NodeRanks
    measure_links: _containers.RepeatedCompositeFieldContainer[PeerProbeOrder]
    def __init__(self, launches: _Optional[_Iterable[_Union[RankLaunch, _Mapping]]] = ..., stops: _Optional[_Iterable[_Union[RankStop, _Mapping]]] = ..., sent_at_unix_s: _Optional[float] = ..., complete: bool = ..., wanted: _Optional[_Union[NodeRanks, _Mapping]] = ..., measure_links: _Optional[_Iterable[_Union[PeerProbeOrder, _Mapping]]] = ...) -> None: ...

class PeerProbeOrder(_message.Message):
    __slots__ = ("peer", "address", "port", "token")
    PEER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    peer: str
    address: str
    port: int
    token: bytes
    def __init__(self, peer: _Optional[str] = ..., address: _Optional[str] = ..., port: _Optional[int] = ..., token: _Optional[bytes] = ...) -> None: ...

class ReportPeerLinksRequest(_message.Message):
    __slots__ = ("node_id", "links")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    links: _containers.RepeatedCompositeFieldContainer[_types_pb2.PeerLink]
    def __init__(self, node_id: _Optional[str] = ..., links: _Optional[_Iterable[_Union[_types_pb2.PeerLink, _Mapping]]] = ...) -> None: ...

class ReportPeerLinksResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeRanks(_message.Message):
    __slots__ = ("ranks",)
    RANKS_FIELD_NUMBER: _ClassVar[int]
    ranks: _containers.RepeatedCompositeFieldContainer[RankRef]
    def __init__(self, ranks: _Optional[_Iterable[_Union[RankRef, _Mapping]]] = ...) -> None: ...

class RankRef(_message.Message):
    __slots__ = ("job_id", "rank", "attempt")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    attempt: int
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class ReportRankStatusRequest(_message.Message):
    __slots__ = ("node_id", "job_id", "rank", "state", "exit_code", "message", "attempt")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    job_id: str
    rank: int
    state: RankState
    exit_code: int
    message: str
    attempt: int
    def __init__(self, node_id: _Optional[str] = ..., job_id: _Optional[str] = ..., rank: _Optional[int] = ..., state: _Optional[_Union[RankState, str]] = ..., exit_code: _Optional[int] = ..., message: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class ReportRankStatusResponse(_message.Message):
    __slots__ = ("job_state",)
    JOB_STATE_FIELD_NUMBER: _ClassVar[int]
    job_state: JobState
    def __init__(self, job_state: _Optional[_Union[JobState, str]] = ...) -> None: ...

class LogLine(_message.Message):
    __slots__ = ("seq", "rank", "stream", "text", "time_unix_s")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    seq: int
    rank: int
    stream: str
    text: str
    time_unix_s: float
    def __init__(self, seq: _Optional[int] = ..., rank: _Optional[int] = ..., stream: _Optional[str] = ..., text: _Optional[str] = ..., time_unix_s: _Optional[float] = ...) -> None: ...

class AppendJobLogsRequest(_message.Message):
    __slots__ = ("job_id", "lines")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    lines: _containers.RepeatedCompositeFieldContainer[LogLine]
    def __init__(self, job_id: _Optional[str] = ..., lines: _Optional[_Iterable[_Union[LogLine, _Mapping]]] = ...) -> None: ...

class AppendJobLogsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetJobLogsRequest(_message.Message):
    __slots__ = ("job_id", "after_seq", "limit")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    after_seq: int
    limit: int
    def __init__(self, job_id: _Optional[str] = ..., after_seq: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class GetJobLogsResponse(_message.Message):
    __slots__ = ("lines", "next_seq")
    LINES_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    lines: _containers.RepeatedCompositeFieldContainer[LogLine]
    next_seq: int
    def __init__(self, lines: _Optional[_Iterable[_Union[LogLine, _Mapping]]] = ..., next_seq: _Optional[int] = ...) -> None: ...

class WatchClusterRequest(_message.Message):
    __slots__ = ("period_s",)
    PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    period_s: float
    def __init__(self, period_s: _Optional[float] = ...) -> None: ...

class ClusterSnapshot(_message.Message):
    __slots__ = ("time_unix_s", "nodes", "jobs")
    TIME_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    time_unix_s: float
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, time_unix_s: _Optional[float] = ..., nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ..., jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...
