from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    FLOAT32: _ClassVar[DType]
    FLOAT64: _ClassVar[DType]
    FLOAT16: _ClassVar[DType]
    BFLOAT16: _ClassVar[DType]
    INT64: _ClassVar[DType]
    INT32: _ClassVar[DType]
    UINT8: _ClassVar[DType]
    BOOL: _ClassVar[DType]

class SecAggPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SECAGG_PHASE_UNSPECIFIED: _ClassVar[SecAggPhase]
    ADVERTISE_KEYS: _ClassVar[SecAggPhase]
    SHARE_KEYS: _ClassVar[SecAggPhase]
    MASKED_INPUT: _ClassVar[SecAggPhase]
    UNMASKING: _ClassVar[SecAggPhase]
DTYPE_UNSPECIFIED: DType
FLOAT32: DType
FLOAT64: DType
FLOAT16: DType
BFLOAT16: DType
INT64: DType
INT32: DType
UINT8: DType
BOOL: DType
SECAGG_PHASE_UNSPECIFIED: SecAggPhase
ADVERTISE_KEYS: SecAggPhase
SHARE_KEYS: SecAggPhase
MASKED_INPUT: SecAggPhase
UNMASKING: SecAggPhase

class Tensor(_message.Message):
    __slots__ = ("name", "dtype", "shape", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class ModelSpec(_message.Message):
    __slots__ = ("name", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    options: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class DataSpec(_message.Message):
    __slots__ = ("dataset", "shape", "num_classes", "mean", "std", "class_names", "split")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NUM_CLASSES_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    STD_FIELD_NUMBER: _ClassVar[int]
    CLASS_NAMES_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    num_classes: int
    mean: _containers.RepeatedScalarFieldContainer[float]
    std: _containers.RepeatedScalarFieldContainer[float]
    class_names: _containers.RepeatedScalarFieldContainer[str]
    split: str
    def __init__(self, dataset: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., num_classes: _Optional[int] = ..., mean: _Optional[_Iterable[float]] = ..., std: _Optional[_Iterable[float]] = ..., class_names: _Optional[_Iterable[str]] = ..., split: _Optional[str] = ...) -> None: ...

class ProtocolSpec(_message.Message):
    __slots__ = ("kind", "num_images", "local_epochs", "batch_size", "learning_rate", "batchnorm")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NUM_IMAGES_FIELD_NUMBER: _ClassVar[int]
    LOCAL_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    BATCHNORM_FIELD_NUMBER: _ClassVar[int]
    kind: str
    num_images: int
    local_epochs: int
    batch_size: int
    learning_rate: float
    batchnorm: str
    def __init__(self, kind: _Optional[str] = ..., num_images: _Optional[int] = ..., local_epochs: _Optional[int] = ..., batch_size: _Optional[int] = ..., learning_rate: _Optional[float] = ..., batchnorm: _Optional[str] = ...) -> None: ...

class DefenseSpec(_message.Message):
    __slots__ = ("name", "params", "stage")
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
    name: str
    params: _containers.ScalarMap[str, str]
    stage: str
    def __init__(self, name: _Optional[str] = ..., params: _Optional[_Mapping[str, str]] = ..., stage: _Optional[str] = ...) -> None: ...

class TensorInfo(_message.Message):
    __slots__ = ("name", "shape", "dtype")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: DType
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[_Union[DType, str]] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("victim_version", "model", "data", "protocol", "defenses", "parameters", "buffers", "num_private_images", "reveal_enabled", "max_message_bytes", "num_users", "score_budget", "score_token_required", "token_accepted", "score_token_accepted", "limits", "image_score_budget", "image_scores_left", "images_score_exhausted", "buffers_returned")
    VICTIM_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    DEFENSES_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    NUM_PRIVATE_IMAGES_FIELD_NUMBER: _ClassVar[int]
    REVEAL_ENABLED_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_USERS_FIELD_NUMBER: _ClassVar[int]
    SCORE_BUDGET_FIELD_NUMBER: _ClassVar[int]
    SCORE_TOKEN_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    SCORE_TOKEN_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_SCORE_BUDGET_FIELD_NUMBER: _ClassVar[int]
    IMAGE_SCORES_LEFT_FIELD_NUMBER: _ClassVar[int]
    IMAGES_SCORE_EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_RETURNED_FIELD_NUMBER: _ClassVar[int]
    victim_version: str
    model: ModelSpec
    data: DataSpec
    protocol: ProtocolSpec
    defenses: _containers.RepeatedCompositeFieldContainer[DefenseSpec]
    parameters: _containers.RepeatedCompositeFieldContainer[TensorInfo]
    buffers: _containers.RepeatedCompositeFieldContainer[TensorInfo]
    num_private_images: int
    reveal_enabled: bool
    max_message_bytes: int
    num_users: int
    score_budget: int
    score_token_required: bool
    token_accepted: bool
    score_token_accepted: bool
    limits: VictimLimits
    image_score_budget: int
    image_scores_left: int
    images_score_exhausted: int
    buffers_returned: str
    def __init__(self, victim_version: _Optional[str] = ..., model: _Optional[_Union[ModelSpec, _Mapping]] = ..., data: _Optional[_Union[DataSpec, _Mapping]] = ..., protocol: _Optional[_Union[ProtocolSpec, _Mapping]] = ..., defenses: _Optional[_Iterable[_Union[DefenseSpec, _Mapping]]] = ..., parameters: _Optional[_Iterable[_Union[TensorInfo, _Mapping]]] = ..., buffers: _Optional[_Iterable[_Union[TensorInfo, _Mapping]]] = ..., num_private_images: _Optional[int] = ..., reveal_enabled: _Optional[bool] = ..., max_message_bytes: _Optional[int] = ..., num_users: _Optional[int] = ..., score_budget: _Optional[int] = ..., score_token_required: _Optional[bool] = ..., token_accepted: _Optional[bool] = ..., score_token_accepted: _Optional[bool] = ..., limits: _Optional[_Union[VictimLimits, _Mapping]] = ..., image_score_budget: _Optional[int] = ..., image_scores_left: _Optional[int] = ..., images_score_exhausted: _Optional[int] = ..., buffers_returned: _Optional[str] = ...) -> None: ...

class VictimLimits(_message.Message):
    __slots__ = ("max_local_epochs", "max_local_steps", "max_learning_rate", "max_release_epochs")
    MAX_LOCAL_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    MAX_LOCAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    MAX_LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    MAX_RELEASE_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    max_local_epochs: int
    max_local_steps: int
    max_learning_rate: float
    max_release_epochs: int
    def __init__(self, max_local_epochs: _Optional[int] = ..., max_local_steps: _Optional[int] = ..., max_learning_rate: _Optional[float] = ..., max_release_epochs: _Optional[int] = ...) -> None: ...

class GetGlobalModelRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetGlobalModelResponse(_message.Message):
    __slots__ = ("parameters", "buffers")
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    parameters: _containers.RepeatedCompositeFieldContainer[Tensor]
    buffers: _containers.RepeatedCompositeFieldContainer[Tensor]
    def __init__(self, parameters: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., buffers: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ...) -> None: ...

class ComputeUpdateRequest(_message.Message):
    __slots__ = ("parameters", "buffers", "protocol")
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    parameters: _containers.RepeatedCompositeFieldContainer[Tensor]
    buffers: _containers.RepeatedCompositeFieldContainer[Tensor]
    protocol: ProtocolSpec
    def __init__(self, parameters: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., buffers: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., protocol: _Optional[_Union[ProtocolSpec, _Mapping]] = ...) -> None: ...

class ComputeUpdateResponse(_message.Message):
    __slots__ = ("round_id", "update", "update_kind", "protocol", "num_images", "local_steps", "metadata", "buffers")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    UPDATE_KIND_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    NUM_IMAGES_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    round_id: str
    update: _containers.RepeatedCompositeFieldContainer[Tensor]
    update_kind: str
    protocol: ProtocolSpec
    num_images: int
    local_steps: int
    metadata: _containers.ScalarMap[str, str]
    buffers: _containers.RepeatedCompositeFieldContainer[Tensor]
    def __init__(self, round_id: _Optional[str] = ..., update: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., update_kind: _Optional[str] = ..., protocol: _Optional[_Union[ProtocolSpec, _Mapping]] = ..., num_images: _Optional[int] = ..., local_steps: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., buffers: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("round_id", "images", "labels", "user_ids", "features", "feature_layer", "recovered_ssim", "padding")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    USER_IDS_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    FEATURE_LAYER_FIELD_NUMBER: _ClassVar[int]
    RECOVERED_SSIM_FIELD_NUMBER: _ClassVar[int]
    PADDING_FIELD_NUMBER: _ClassVar[int]
    round_id: str
    images: Tensor
    labels: _containers.RepeatedScalarFieldContainer[int]
    user_ids: _containers.RepeatedScalarFieldContainer[int]
    features: Tensor
    feature_layer: str
    recovered_ssim: float
    padding: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, round_id: _Optional[str] = ..., images: _Optional[_Union[Tensor, _Mapping]] = ..., labels: _Optional[_Iterable[int]] = ..., user_ids: _Optional[_Iterable[int]] = ..., features: _Optional[_Union[Tensor, _Mapping]] = ..., feature_layer: _Optional[str] = ..., recovered_ssim: _Optional[float] = ..., padding: _Optional[_Iterable[int]] = ...) -> None: ...

class FeatureScore(_message.Message):
    __slots__ = ("index", "matched_index", "cosine", "relative_error")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MATCHED_INDEX_FIELD_NUMBER: _ClassVar[int]
    COSINE_FIELD_NUMBER: _ClassVar[int]
    RELATIVE_ERROR_FIELD_NUMBER: _ClassVar[int]
    index: int
    matched_index: int
    cosine: float
    relative_error: float
    def __init__(self, index: _Optional[int] = ..., matched_index: _Optional[int] = ..., cosine: _Optional[float] = ..., relative_error: _Optional[float] = ...) -> None: ...

class ImageScore(_message.Message):
    __slots__ = ("index", "matched_index", "psnr", "ssim", "mse", "margin", "voters", "padding", "exact", "exact_index")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MATCHED_INDEX_FIELD_NUMBER: _ClassVar[int]
    PSNR_FIELD_NUMBER: _ClassVar[int]
    SSIM_FIELD_NUMBER: _ClassVar[int]
    MSE_FIELD_NUMBER: _ClassVar[int]
    MARGIN_FIELD_NUMBER: _ClassVar[int]
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    PADDING_FIELD_NUMBER: _ClassVar[int]
    EXACT_FIELD_NUMBER: _ClassVar[int]
    EXACT_INDEX_FIELD_NUMBER: _ClassVar[int]
    index: int
    matched_index: int
    psnr: float
    ssim: float
    mse: float
    margin: float
    voters: int
    padding: bool
    exact: bool
    exact_index: int
    def __init__(self, index: _Optional[int] = ..., matched_index: _Optional[int] = ..., psnr: _Optional[float] = ..., ssim: _Optional[float] = ..., mse: _Optional[float] = ..., margin: _Optional[float] = ..., voters: _Optional[int] = ..., padding: _Optional[bool] = ..., exact: _Optional[bool] = ..., exact_index: _Optional[int] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("images", "mean_psnr", "mean_ssim", "mean_mse", "labels_scored", "label_accuracy", "features_scored", "features", "mean_feature_cosine", "mean_feature_relative_error", "recovered", "recovered_ssim", "exact", "exact_psnr", "best_psnr", "best_scored")
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    MEAN_PSNR_FIELD_NUMBER: _ClassVar[int]
    MEAN_SSIM_FIELD_NUMBER: _ClassVar[int]
    MEAN_MSE_FIELD_NUMBER: _ClassVar[int]
    LABELS_SCORED_FIELD_NUMBER: _ClassVar[int]
    LABEL_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    FEATURES_SCORED_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    MEAN_FEATURE_COSINE_FIELD_NUMBER: _ClassVar[int]
    MEAN_FEATURE_RELATIVE_ERROR_FIELD_NUMBER: _ClassVar[int]
    RECOVERED_FIELD_NUMBER: _ClassVar[int]
    RECOVERED_SSIM_FIELD_NUMBER: _ClassVar[int]
    EXACT_FIELD_NUMBER: _ClassVar[int]
    EXACT_PSNR_FIELD_NUMBER: _ClassVar[int]
    BEST_PSNR_FIELD_NUMBER: _ClassVar[int]
    BEST_SCORED_FIELD_NUMBER: _ClassVar[int]
    images: _containers.RepeatedCompositeFieldContainer[ImageScore]
    mean_psnr: float
    mean_ssim: float
    mean_mse: float
    labels_scored: bool
    label_accuracy: float
    features_scored: bool
    features: _containers.RepeatedCompositeFieldContainer[FeatureScore]
    mean_feature_cosine: float
    mean_feature_relative_error: float
    recovered: int
    recovered_ssim: float
    exact: int
    exact_psnr: float
    best_psnr: float
    best_scored: bool
    def __init__(self, images: _Optional[_Iterable[_Union[ImageScore, _Mapping]]] = ..., mean_psnr: _Optional[float] = ..., mean_ssim: _Optional[float] = ..., mean_mse: _Optional[float] = ..., labels_scored: _Optional[bool] = ..., label_accuracy: _Optional[float] = ..., features_scored: _Optional[bool] = ..., features: _Optional[_Iterable[_Union[FeatureScore, _Mapping]]] = ..., mean_feature_cosine: _Optional[float] = ..., mean_feature_relative_error: _Optional[float] = ..., recovered: _Optional[int] = ..., recovered_ssim: _Optional[float] = ..., exact: _Optional[int] = ..., exact_psnr: _Optional[float] = ..., best_psnr: _Optional[float] = ..., best_scored: _Optional[bool] = ...) -> None: ...

class RevealRequest(_message.Message):
    __slots__ = ("round_id",)
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    round_id: str
    def __init__(self, round_id: _Optional[str] = ...) -> None: ...

class RevealResponse(_message.Message):
    __slots__ = ("images", "labels")
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    images: Tensor
    labels: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, images: _Optional[_Union[Tensor, _Mapping]] = ..., labels: _Optional[_Iterable[int]] = ...) -> None: ...

class BeginSecAggRequest(_message.Message):
    __slots__ = ("parameters", "buffers", "protocol")
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    parameters: _containers.RepeatedCompositeFieldContainer[Tensor]
    buffers: _containers.RepeatedCompositeFieldContainer[Tensor]
    protocol: ProtocolSpec
    def __init__(self, parameters: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., buffers: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., protocol: _Optional[_Union[ProtocolSpec, _Mapping]] = ...) -> None: ...

class BeginSecAggResponse(_message.Message):
    __slots__ = ("round_id", "user_ids", "threshold", "clip", "vector_length", "session", "update_kind", "protocol", "images_per_user", "local_steps", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    USER_IDS_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    CLIP_FIELD_NUMBER: _ClassVar[int]
    VECTOR_LENGTH_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    UPDATE_KIND_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    IMAGES_PER_USER_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    round_id: str
    user_ids: _containers.RepeatedScalarFieldContainer[int]
    threshold: int
    clip: float
    vector_length: int
    session: int
    update_kind: str
    protocol: ProtocolSpec
    images_per_user: int
    local_steps: int
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, round_id: _Optional[str] = ..., user_ids: _Optional[_Iterable[int]] = ..., threshold: _Optional[int] = ..., clip: _Optional[float] = ..., vector_length: _Optional[int] = ..., session: _Optional[int] = ..., update_kind: _Optional[str] = ..., protocol: _Optional[_Union[ProtocolSpec, _Mapping]] = ..., images_per_user: _Optional[int] = ..., local_steps: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SecAggStepRequest(_message.Message):
    __slots__ = ("round_id", "user_id", "phase", "message")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    USER_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    round_id: str
    user_id: int
    phase: SecAggPhase
    message: bytes
    def __init__(self, round_id: _Optional[str] = ..., user_id: _Optional[int] = ..., phase: _Optional[_Union[SecAggPhase, str]] = ..., message: _Optional[bytes] = ...) -> None: ...

class SecAggStepResponse(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: bytes
    def __init__(self, message: _Optional[bytes] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("learning_rate", "max_epochs", "target_loss", "report_every")
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    MAX_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    TARGET_LOSS_FIELD_NUMBER: _ClassVar[int]
    REPORT_EVERY_FIELD_NUMBER: _ClassVar[int]
    learning_rate: float
    max_epochs: int
    target_loss: float
    report_every: int
    def __init__(self, learning_rate: _Optional[float] = ..., max_epochs: _Optional[int] = ..., target_loss: _Optional[float] = ..., report_every: _Optional[int] = ...) -> None: ...

class ReleasedModel(_message.Message):
    __slots__ = ("release_id", "parameters", "num_train", "input_shape", "value_low", "value_high", "binary_task", "epochs", "loss", "train_accuracy", "reached_target", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RELEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    NUM_TRAIN_FIELD_NUMBER: _ClassVar[int]
    INPUT_SHAPE_FIELD_NUMBER: _ClassVar[int]
    VALUE_LOW_FIELD_NUMBER: _ClassVar[int]
    VALUE_HIGH_FIELD_NUMBER: _ClassVar[int]
    BINARY_TASK_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    TRAIN_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    REACHED_TARGET_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    release_id: str
    parameters: _containers.RepeatedCompositeFieldContainer[Tensor]
    num_train: int
    input_shape: _containers.RepeatedScalarFieldContainer[int]
    value_low: float
    value_high: float
    binary_task: str
    epochs: int
    loss: float
    train_accuracy: float
    reached_target: bool
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, release_id: _Optional[str] = ..., parameters: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., num_train: _Optional[int] = ..., input_shape: _Optional[_Iterable[int]] = ..., value_low: _Optional[float] = ..., value_high: _Optional[float] = ..., binary_task: _Optional[str] = ..., epochs: _Optional[int] = ..., loss: _Optional[float] = ..., train_accuracy: _Optional[float] = ..., reached_target: _Optional[bool] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ReleaseProgress(_message.Message):
    __slots__ = ("epoch", "max_epochs", "loss", "train_accuracy", "release")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MAX_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    TRAIN_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    max_epochs: int
    loss: float
    train_accuracy: float
    release: ReleasedModel
    def __init__(self, epoch: _Optional[int] = ..., max_epochs: _Optional[int] = ..., loss: _Optional[float] = ..., train_accuracy: _Optional[float] = ..., release: _Optional[_Union[ReleasedModel, _Mapping]] = ...) -> None: ...
