from fedleak.v1 import victim_pb2 as _victim_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DefenseInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DefenseInfo(_message.Message):
    __slots__ = ("name", "params", "stage", "version", "claim")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    name: str
    params: _containers.ScalarMap[str, str]
    stage: str
    version: str
    claim: GaussianClaim
    def __init__(self, name: _Optional[str] = ..., params: _Optional[_Mapping[str, str]] = ..., stage: _Optional[str] = ..., version: _Optional[str] = ..., claim: _Optional[_Union[GaussianClaim, _Mapping]] = ...) -> None: ...

class GaussianClaim(_message.Message):
    __slots__ = ("clip_norm", "noise_std", "stage", "clip_geometry", "group_clip_norms", "noise", "sampling", "sample_rate", "accountant", "delta", "shares", "dropout", "unit", "user_sample_rate")
    CLIP_NORM_FIELD_NUMBER: _ClassVar[int]
    NOISE_STD_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    CLIP_GEOMETRY_FIELD_NUMBER: _ClassVar[int]
    GROUP_CLIP_NORMS_FIELD_NUMBER: _ClassVar[int]
    NOISE_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTANT_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    DROPOUT_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    USER_SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    clip_norm: float
    noise_std: float
    stage: str
    clip_geometry: str
    group_clip_norms: _containers.RepeatedScalarFieldContainer[float]
    noise: str
    sampling: str
    sample_rate: float
    accountant: str
    delta: float
    shares: int
    dropout: str
    unit: str
    user_sample_rate: float
    def __init__(self, clip_norm: _Optional[float] = ..., noise_std: _Optional[float] = ..., stage: _Optional[str] = ..., clip_geometry: _Optional[str] = ..., group_clip_norms: _Optional[_Iterable[float]] = ..., noise: _Optional[str] = ..., sampling: _Optional[str] = ..., sample_rate: _Optional[float] = ..., accountant: _Optional[str] = ..., delta: _Optional[float] = ..., shares: _Optional[int] = ..., dropout: _Optional[str] = ..., unit: _Optional[str] = ..., user_sample_rate: _Optional[float] = ...) -> None: ...

class UpdateChunk(_message.Message):
    __slots__ = ("piece", "offset", "seed", "expected_batch_size")
    PIECE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    piece: _victim_pb2.Tensor
    offset: int
    seed: int
    expected_batch_size: int
    def __init__(self, piece: _Optional[_Union[_victim_pb2.Tensor, _Mapping]] = ..., offset: _Optional[int] = ..., seed: _Optional[int] = ..., expected_batch_size: _Optional[int] = ...) -> None: ...
