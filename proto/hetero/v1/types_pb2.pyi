from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeviceKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEVICE_KIND_UNSPECIFIED: _ClassVar[DeviceKind]
    DEVICE_KIND_CPU: _ClassVar[DeviceKind]
    DEVICE_KIND_CUDA: _ClassVar[DeviceKind]
DEVICE_KIND_UNSPECIFIED: DeviceKind
DEVICE_KIND_CPU: DeviceKind
DEVICE_KIND_CUDA: DeviceKind

class DeviceProfile(_message.Message):
    __slots__ = ("index", "name", "kind", "matmul_tflops", "memory_bandwidth_bytes_per_s", "host_to_device_bytes_per_s", "device_to_host_bytes_per_s", "memory_bytes", "compute_score", "emulated_slowdown", "suspect", "shared_while_profiled", "foreign_utilization_percent")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MATMUL_TFLOPS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BANDWIDTH_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    HOST_TO_DEVICE_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    DEVICE_TO_HOST_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SCORE_FIELD_NUMBER: _ClassVar[int]
    EMULATED_SLOWDOWN_FIELD_NUMBER: _ClassVar[int]
    SUSPECT_FIELD_NUMBER: _ClassVar[int]
    SHARED_WHILE_PROFILED_FIELD_NUMBER: _ClassVar[int]
    FOREIGN_UTILIZATION_PERCENT_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    kind: DeviceKind
    matmul_tflops: float
    memory_bandwidth_bytes_per_s: float
    host_to_device_bytes_per_s: float
    device_to_host_bytes_per_s: float
    memory_bytes: int
    compute_score: float
    emulated_slowdown: float
    suspect: _containers.RepeatedScalarFieldContainer[str]
    shared_while_profiled: bool
    foreign_utilization_percent: float
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., kind: _Optional[_Union[DeviceKind, str]] = ..., matmul_tflops: _Optional[float] = ..., memory_bandwidth_bytes_per_s: _Optional[float] = ..., host_to_device_bytes_per_s: _Optional[float] = ..., device_to_host_bytes_per_s: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., compute_score: _Optional[float] = ..., emulated_slowdown: _Optional[float] = ..., suspect: _Optional[_Iterable[str]] = ..., shared_while_profiled: bool = ..., foreign_utilization_percent: _Optional[float] = ...) -> None: ...

class HostProfile(_message.Message):
    __slots__ = ("cpu_model", "cpu_count", "cpu_gflops", "ram_bytes", "network_rtt_s", "network_bytes_per_s", "emulated_slowdown", "measured_in_s", "disk_read_bytes_per_s", "disk_read_method", "peer_links")
    CPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    CPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    CPU_GFLOPS_FIELD_NUMBER: _ClassVar[int]
    RAM_BYTES_FIELD_NUMBER: _ClassVar[int]
    NETWORK_RTT_S_FIELD_NUMBER: _ClassVar[int]
    NETWORK_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    EMULATED_SLOWDOWN_FIELD_NUMBER: _ClassVar[int]
    MEASURED_IN_S_FIELD_NUMBER: _ClassVar[int]
    DISK_READ_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    DISK_READ_METHOD_FIELD_NUMBER: _ClassVar[int]
    PEER_LINKS_FIELD_NUMBER: _ClassVar[int]
    cpu_model: str
    cpu_count: int
    cpu_gflops: float
    ram_bytes: int
    network_rtt_s: float
    network_bytes_per_s: float
    emulated_slowdown: float
    measured_in_s: float
    disk_read_bytes_per_s: float
    disk_read_method: str
    peer_links: _containers.RepeatedCompositeFieldContainer[PeerLink]
    def __init__(self, cpu_model: _Optional[str] = ..., cpu_count: _Optional[int] = ..., cpu_gflops: _Optional[float] = ..., ram_bytes: _Optional[int] = ..., network_rtt_s: _Optional[float] = ..., network_bytes_per_s: _Optional[float] = ..., emulated_slowdown: _Optional[float] = ..., measured_in_s: _Optional[float] = ..., disk_read_bytes_per_s: _Optional[float] = ..., disk_read_method: _Optional[str] = ..., peer_links: _Optional[_Iterable[_Union[PeerLink, _Mapping]]] = ...) -> None: ...

class PeerLink(_message.Message):
    __slots__ = ("peer", "rtt_s", "send_bytes_per_s", "receive_bytes_per_s", "measured_at_unix_s")
    PEER_FIELD_NUMBER: _ClassVar[int]
    RTT_S_FIELD_NUMBER: _ClassVar[int]
    SEND_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_BYTES_PER_S_FIELD_NUMBER: _ClassVar[int]
    MEASURED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    peer: str
    rtt_s: float
    send_bytes_per_s: float
    receive_bytes_per_s: float
    measured_at_unix_s: float
    def __init__(self, peer: _Optional[str] = ..., rtt_s: _Optional[float] = ..., send_bytes_per_s: _Optional[float] = ..., receive_bytes_per_s: _Optional[float] = ..., measured_at_unix_s: _Optional[float] = ...) -> None: ...

class ThrottleReasons(_message.Message):
    __slots__ = ("reasons",)
    REASONS_FIELD_NUMBER: _ClassVar[int]
    reasons: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, reasons: _Optional[_Iterable[str]] = ...) -> None: ...

class DeviceTelemetry(_message.Message):
    __slots__ = ("device_index", "utilization_percent", "memory_used_bytes", "memory_total_bytes", "temperature_c", "power_w", "sm_clock_mhz", "throttle")
    DEVICE_INDEX_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    SM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_FIELD_NUMBER: _ClassVar[int]
    device_index: int
    utilization_percent: float
    memory_used_bytes: int
    memory_total_bytes: int
    temperature_c: float
    power_w: float
    sm_clock_mhz: float
    throttle: ThrottleReasons
    def __init__(self, device_index: _Optional[int] = ..., utilization_percent: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., temperature_c: _Optional[float] = ..., power_w: _Optional[float] = ..., sm_clock_mhz: _Optional[float] = ..., throttle: _Optional[_Union[ThrottleReasons, _Mapping]] = ...) -> None: ...

class HostTelemetry(_message.Message):
    __slots__ = ("cpu_percent", "ram_used_bytes", "ram_total_bytes")
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    RAM_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    RAM_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    cpu_percent: float
    ram_used_bytes: int
    ram_total_bytes: int
    def __init__(self, cpu_percent: _Optional[float] = ..., ram_used_bytes: _Optional[int] = ..., ram_total_bytes: _Optional[int] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("job_id", "version", "apply_at_step", "batches", "policy", "reason", "predicted_step_s")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    APPLY_AT_STEP_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_STEP_S_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    version: int
    apply_at_step: int
    batches: _containers.RepeatedScalarFieldContainer[int]
    policy: str
    reason: str
    predicted_step_s: float
    def __init__(self, job_id: _Optional[str] = ..., version: _Optional[int] = ..., apply_at_step: _Optional[int] = ..., batches: _Optional[_Iterable[int]] = ..., policy: _Optional[str] = ..., reason: _Optional[str] = ..., predicted_step_s: _Optional[float] = ...) -> None: ...

class RankIntervalStats(_message.Message):
    __slots__ = ("rank", "batch", "steps", "compute_s", "step_s", "peak_memory_bytes", "data_s", "comm_wait_s", "forward_s", "backward_s", "optimizer_s", "loss_sum", "samples", "switch_s", "busy_cv", "input_s", "input_cv")
    RANK_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_S_FIELD_NUMBER: _ClassVar[int]
    STEP_S_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_S_FIELD_NUMBER: _ClassVar[int]
    COMM_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    FORWARD_S_FIELD_NUMBER: _ClassVar[int]
    BACKWARD_S_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_S_FIELD_NUMBER: _ClassVar[int]
    LOSS_SUM_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SWITCH_S_FIELD_NUMBER: _ClassVar[int]
    BUSY_CV_FIELD_NUMBER: _ClassVar[int]
    INPUT_S_FIELD_NUMBER: _ClassVar[int]
    INPUT_CV_FIELD_NUMBER: _ClassVar[int]
    rank: int
    batch: int
    steps: int
    compute_s: float
    step_s: float
    peak_memory_bytes: int
    data_s: float
    comm_wait_s: float
    forward_s: float
    backward_s: float
    optimizer_s: float
    loss_sum: float
    samples: int
    switch_s: float
    busy_cv: float
    input_s: float
    input_cv: float
    def __init__(self, rank: _Optional[int] = ..., batch: _Optional[int] = ..., steps: _Optional[int] = ..., compute_s: _Optional[float] = ..., step_s: _Optional[float] = ..., peak_memory_bytes: _Optional[int] = ..., data_s: _Optional[float] = ..., comm_wait_s: _Optional[float] = ..., forward_s: _Optional[float] = ..., backward_s: _Optional[float] = ..., optimizer_s: _Optional[float] = ..., loss_sum: _Optional[float] = ..., samples: _Optional[int] = ..., switch_s: _Optional[float] = ..., busy_cv: _Optional[float] = ..., input_s: _Optional[float] = ..., input_cv: _Optional[float] = ...) -> None: ...

class IntervalReport(_message.Message):
    __slots__ = ("job_id", "end_step", "plan_version", "ranks", "received_at_unix_s")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    END_STEP_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_AT_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    end_step: int
    plan_version: int
    ranks: _containers.RepeatedCompositeFieldContainer[RankIntervalStats]
    received_at_unix_s: float
    def __init__(self, job_id: _Optional[str] = ..., end_step: _Optional[int] = ..., plan_version: _Optional[int] = ..., ranks: _Optional[_Iterable[_Union[RankIntervalStats, _Mapping]]] = ..., received_at_unix_s: _Optional[float] = ...) -> None: ...

class GetPlanRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ReportIntervalStatsResponse(_message.Message):
    __slots__ = ("plan",)
    PLAN_FIELD_NUMBER: _ClassVar[int]
    plan: Plan
    def __init__(self, plan: _Optional[_Union[Plan, _Mapping]] = ...) -> None: ...
