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
    __slots__ = ("dataset", "shape", "num_classes", "mean", "std", "class_names", "split", "text")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NUM_CLASSES_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    STD_FIELD_NUMBER: _ClassVar[int]
    CLASS_NAMES_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    num_classes: int
    mean: _containers.RepeatedScalarFieldContainer[float]
    std: _containers.RepeatedScalarFieldContainer[float]
    class_names: _containers.RepeatedScalarFieldContainer[str]
    split: str
    text: TextSpec
    def __init__(self, dataset: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., num_classes: _Optional[int] = ..., mean: _Optional[_Iterable[float]] = ..., std: _Optional[_Iterable[float]] = ..., class_names: _Optional[_Iterable[str]] = ..., split: _Optional[str] = ..., text: _Optional[_Union[TextSpec, _Mapping]] = ...) -> None: ...

class TextSpec(_message.Message):
    __slots__ = ("seq_len", "vocab_size", "task", "architecture", "pad_id", "start_id", "end_id", "special_ids", "tokenizer", "tokenizer_sha256", "tokenizer_json", "model_config", "embedding", "tied_head", "lora", "secrets")
    SEQ_LEN_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    PAD_ID_FIELD_NUMBER: _ClassVar[int]
    START_ID_FIELD_NUMBER: _ClassVar[int]
    END_ID_FIELD_NUMBER: _ClassVar[int]
    SPECIAL_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_SHA256_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_JSON_FIELD_NUMBER: _ClassVar[int]
    MODEL_CONFIG_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    TIED_HEAD_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    seq_len: int
    vocab_size: int
    task: str
    architecture: str
    pad_id: int
    start_id: int
    end_id: int
    special_ids: _containers.RepeatedScalarFieldContainer[int]
    tokenizer: str
    tokenizer_sha256: str
    tokenizer_json: str
    model_config: str
    embedding: str
    tied_head: bool
    lora: bool
    secrets: int
    def __init__(self, seq_len: _Optional[int] = ..., vocab_size: _Optional[int] = ..., task: _Optional[str] = ..., architecture: _Optional[str] = ..., pad_id: _Optional[int] = ..., start_id: _Optional[int] = ..., end_id: _Optional[int] = ..., special_ids: _Optional[_Iterable[int]] = ..., tokenizer: _Optional[str] = ..., tokenizer_sha256: _Optional[str] = ..., tokenizer_json: _Optional[str] = ..., model_config: _Optional[str] = ..., embedding: _Optional[str] = ..., tied_head: _Optional[bool] = ..., lora: _Optional[bool] = ..., secrets: _Optional[int] = ...) -> None: ...

class ProtocolSpec(_message.Message):
    __slots__ = ("kind", "num_images", "local_epochs", "batch_size", "learning_rate", "batchnorm", "momentum", "weight_decay", "nesterov", "shuffle")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NUM_IMAGES_FIELD_NUMBER: _ClassVar[int]
    LOCAL_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    BATCHNORM_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    NESTEROV_FIELD_NUMBER: _ClassVar[int]
    SHUFFLE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    num_images: int
    local_epochs: int
    batch_size: int
    learning_rate: float
    batchnorm: str
    momentum: float
    weight_decay: float
    nesterov: bool
    shuffle: bool
    def __init__(self, kind: _Optional[str] = ..., num_images: _Optional[int] = ..., local_epochs: _Optional[int] = ..., batch_size: _Optional[int] = ..., learning_rate: _Optional[float] = ..., batchnorm: _Optional[str] = ..., momentum: _Optional[float] = ..., weight_decay: _Optional[float] = ..., nesterov: _Optional[bool] = ..., shuffle: _Optional[bool] = ...) -> None: ...

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
    __slots__ = ("victim_version", "model", "data", "protocol", "defenses", "parameters", "buffers", "num_private_images", "reveal_enabled", "max_message_bytes", "num_users", "score_budget", "score_token_required", "token_accepted", "score_token_accepted", "limits", "image_score_budget", "image_scores_left", "images_score_exhausted", "buffers_returned", "informed_game", "audit_enabled", "audit_budget", "audits_left", "max_audit_trials", "score_access")
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
    INFORMED_GAME_FIELD_NUMBER: _ClassVar[int]
    AUDIT_ENABLED_FIELD_NUMBER: _ClassVar[int]
    AUDIT_BUDGET_FIELD_NUMBER: _ClassVar[int]
    AUDITS_LEFT_FIELD_NUMBER: _ClassVar[int]
    MAX_AUDIT_TRIALS_FIELD_NUMBER: _ClassVar[int]
    SCORE_ACCESS_FIELD_NUMBER: _ClassVar[int]
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
    informed_game: InformedGameSpec
    audit_enabled: bool
    audit_budget: int
    audits_left: int
    max_audit_trials: int
    score_access: str
    def __init__(self, victim_version: _Optional[str] = ..., model: _Optional[_Union[ModelSpec, _Mapping]] = ..., data: _Optional[_Union[DataSpec, _Mapping]] = ..., protocol: _Optional[_Union[ProtocolSpec, _Mapping]] = ..., defenses: _Optional[_Iterable[_Union[DefenseSpec, _Mapping]]] = ..., parameters: _Optional[_Iterable[_Union[TensorInfo, _Mapping]]] = ..., buffers: _Optional[_Iterable[_Union[TensorInfo, _Mapping]]] = ..., num_private_images: _Optional[int] = ..., reveal_enabled: _Optional[bool] = ..., max_message_bytes: _Optional[int] = ..., num_users: _Optional[int] = ..., score_budget: _Optional[int] = ..., score_token_required: _Optional[bool] = ..., token_accepted: _Optional[bool] = ..., score_token_accepted: _Optional[bool] = ..., limits: _Optional[_Union[VictimLimits, _Mapping]] = ..., image_score_budget: _Optional[int] = ..., image_scores_left: _Optional[int] = ..., images_score_exhausted: _Optional[int] = ..., buffers_returned: _Optional[str] = ..., informed_game: _Optional[_Union[InformedGameSpec, _Mapping]] = ..., audit_enabled: _Optional[bool] = ..., audit_budget: _Optional[int] = ..., audits_left: _Optional[int] = ..., max_audit_trials: _Optional[int] = ..., score_access: _Optional[str] = ...) -> None: ...

class InformedGameSpec(_message.Message):
    __slots__ = ("candidates", "known_records", "prior_split", "threat_model", "adjacency")
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    KNOWN_RECORDS_FIELD_NUMBER: _ClassVar[int]
    PRIOR_SPLIT_FIELD_NUMBER: _ClassVar[int]
    THREAT_MODEL_FIELD_NUMBER: _ClassVar[int]
    ADJACENCY_FIELD_NUMBER: _ClassVar[int]
    candidates: int
    known_records: int
    prior_split: str
    threat_model: str
    adjacency: str
    def __init__(self, candidates: _Optional[int] = ..., known_records: _Optional[int] = ..., prior_split: _Optional[str] = ..., threat_model: _Optional[str] = ..., adjacency: _Optional[str] = ...) -> None: ...

class VictimLimits(_message.Message):
    __slots__ = ("max_local_epochs", "max_local_steps", "max_learning_rate", "max_release_epochs", "request_memory_bytes", "max_calls_per_peer", "max_connections_per_peer", "receive_timeout_seconds", "secagg_memory_bytes", "feature_memory_bytes", "release_memory_bytes", "memory_budget_bytes")
    MAX_LOCAL_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    MAX_LOCAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    MAX_LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    MAX_RELEASE_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_CALLS_PER_PEER_FIELD_NUMBER: _ClassVar[int]
    MAX_CONNECTIONS_PER_PEER_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SECAGG_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    FEATURE_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    RELEASE_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    max_local_epochs: int
    max_local_steps: int
    max_learning_rate: float
    max_release_epochs: int
    request_memory_bytes: int
    max_calls_per_peer: int
    max_connections_per_peer: int
    receive_timeout_seconds: float
    secagg_memory_bytes: int
    feature_memory_bytes: int
    release_memory_bytes: int
    memory_budget_bytes: int
    def __init__(self, max_local_epochs: _Optional[int] = ..., max_local_steps: _Optional[int] = ..., max_learning_rate: _Optional[float] = ..., max_release_epochs: _Optional[int] = ..., request_memory_bytes: _Optional[int] = ..., max_calls_per_peer: _Optional[int] = ..., max_connections_per_peer: _Optional[int] = ..., receive_timeout_seconds: _Optional[float] = ..., secagg_memory_bytes: _Optional[int] = ..., feature_memory_bytes: _Optional[int] = ..., release_memory_bytes: _Optional[int] = ..., memory_budget_bytes: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("round_id", "images", "labels", "user_ids", "features", "feature_layer", "recovered_ssim", "padding", "tokens", "token_set", "token_counts")
    ROUND_ID_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    USER_IDS_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    FEATURE_LAYER_FIELD_NUMBER: _ClassVar[int]
    RECOVERED_SSIM_FIELD_NUMBER: _ClassVar[int]
    PADDING_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_SET_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNTS_FIELD_NUMBER: _ClassVar[int]
    round_id: str
    images: Tensor
    labels: _containers.RepeatedScalarFieldContainer[int]
    user_ids: _containers.RepeatedScalarFieldContainer[int]
    features: Tensor
    feature_layer: str
    recovered_ssim: float
    padding: _containers.RepeatedScalarFieldContainer[int]
    tokens: Tensor
    token_set: _containers.RepeatedScalarFieldContainer[int]
    token_counts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, round_id: _Optional[str] = ..., images: _Optional[_Union[Tensor, _Mapping]] = ..., labels: _Optional[_Iterable[int]] = ..., user_ids: _Optional[_Iterable[int]] = ..., features: _Optional[_Union[Tensor, _Mapping]] = ..., feature_layer: _Optional[str] = ..., recovered_ssim: _Optional[float] = ..., padding: _Optional[_Iterable[int]] = ..., tokens: _Optional[_Union[Tensor, _Mapping]] = ..., token_set: _Optional[_Iterable[int]] = ..., token_counts: _Optional[_Iterable[int]] = ...) -> None: ...

class SentenceScore(_message.Message):
    __slots__ = ("index", "matched_index", "rouge1", "rouge2", "rouge_l", "exact", "padding")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MATCHED_INDEX_FIELD_NUMBER: _ClassVar[int]
    ROUGE1_FIELD_NUMBER: _ClassVar[int]
    ROUGE2_FIELD_NUMBER: _ClassVar[int]
    ROUGE_L_FIELD_NUMBER: _ClassVar[int]
    EXACT_FIELD_NUMBER: _ClassVar[int]
    PADDING_FIELD_NUMBER: _ClassVar[int]
    index: int
    matched_index: int
    rouge1: float
    rouge2: float
    rouge_l: float
    exact: bool
    padding: bool
    def __init__(self, index: _Optional[int] = ..., matched_index: _Optional[int] = ..., rouge1: _Optional[float] = ..., rouge2: _Optional[float] = ..., rouge_l: _Optional[float] = ..., exact: _Optional[bool] = ..., padding: _Optional[bool] = ...) -> None: ...

class TextScore(_message.Message):
    __slots__ = ("sequences_scored", "rouge1", "rouge2", "rouge_l", "exact", "sentences", "sentence_scores", "token_set_scored", "token_precision", "token_recall", "tokens_recovered", "tokens_true", "counts_scored", "count_precision", "count_recall", "secrets", "secrets_recovered", "floor_scored", "floor_rouge1", "floor_rouge2", "floor_rouge_l")
    SEQUENCES_SCORED_FIELD_NUMBER: _ClassVar[int]
    ROUGE1_FIELD_NUMBER: _ClassVar[int]
    ROUGE2_FIELD_NUMBER: _ClassVar[int]
    ROUGE_L_FIELD_NUMBER: _ClassVar[int]
    EXACT_FIELD_NUMBER: _ClassVar[int]
    SENTENCES_FIELD_NUMBER: _ClassVar[int]
    SENTENCE_SCORES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_SET_SCORED_FIELD_NUMBER: _ClassVar[int]
    TOKEN_PRECISION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_RECALL_FIELD_NUMBER: _ClassVar[int]
    TOKENS_RECOVERED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_TRUE_FIELD_NUMBER: _ClassVar[int]
    COUNTS_SCORED_FIELD_NUMBER: _ClassVar[int]
    COUNT_PRECISION_FIELD_NUMBER: _ClassVar[int]
    COUNT_RECALL_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    SECRETS_RECOVERED_FIELD_NUMBER: _ClassVar[int]
    FLOOR_SCORED_FIELD_NUMBER: _ClassVar[int]
    FLOOR_ROUGE1_FIELD_NUMBER: _ClassVar[int]
    FLOOR_ROUGE2_FIELD_NUMBER: _ClassVar[int]
    FLOOR_ROUGE_L_FIELD_NUMBER: _ClassVar[int]
    sequences_scored: bool
    rouge1: float
    rouge2: float
    rouge_l: float
    exact: int
    sentences: int
    sentence_scores: _containers.RepeatedCompositeFieldContainer[SentenceScore]
    token_set_scored: bool
    token_precision: float
    token_recall: float
    tokens_recovered: int
    tokens_true: int
    counts_scored: bool
    count_precision: float
    count_recall: float
    secrets: int
    secrets_recovered: int
    floor_scored: bool
    floor_rouge1: float
    floor_rouge2: float
    floor_rouge_l: float
    def __init__(self, sequences_scored: _Optional[bool] = ..., rouge1: _Optional[float] = ..., rouge2: _Optional[float] = ..., rouge_l: _Optional[float] = ..., exact: _Optional[int] = ..., sentences: _Optional[int] = ..., sentence_scores: _Optional[_Iterable[_Union[SentenceScore, _Mapping]]] = ..., token_set_scored: _Optional[bool] = ..., token_precision: _Optional[float] = ..., token_recall: _Optional[float] = ..., tokens_recovered: _Optional[int] = ..., tokens_true: _Optional[int] = ..., counts_scored: _Optional[bool] = ..., count_precision: _Optional[float] = ..., count_recall: _Optional[float] = ..., secrets: _Optional[int] = ..., secrets_recovered: _Optional[int] = ..., floor_scored: _Optional[bool] = ..., floor_rouge1: _Optional[float] = ..., floor_rouge2: _Optional[float] = ..., floor_rouge_l: _Optional[float] = ...) -> None: ...

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
    __slots__ = ("index", "matched_index", "psnr", "ssim", "mse", "margin", "voters", "fisher_psnr_ceiling", "padding", "exact", "exact_index", "floor_psnr", "floor_ssim", "floor_guess")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MATCHED_INDEX_FIELD_NUMBER: _ClassVar[int]
    PSNR_FIELD_NUMBER: _ClassVar[int]
    SSIM_FIELD_NUMBER: _ClassVar[int]
    MSE_FIELD_NUMBER: _ClassVar[int]
    MARGIN_FIELD_NUMBER: _ClassVar[int]
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    FISHER_PSNR_CEILING_FIELD_NUMBER: _ClassVar[int]
    PADDING_FIELD_NUMBER: _ClassVar[int]
    EXACT_FIELD_NUMBER: _ClassVar[int]
    EXACT_INDEX_FIELD_NUMBER: _ClassVar[int]
    FLOOR_PSNR_FIELD_NUMBER: _ClassVar[int]
    FLOOR_SSIM_FIELD_NUMBER: _ClassVar[int]
    FLOOR_GUESS_FIELD_NUMBER: _ClassVar[int]
    index: int
    matched_index: int
    psnr: float
    ssim: float
    mse: float
    margin: float
    voters: int
    fisher_psnr_ceiling: float
    padding: bool
    exact: bool
    exact_index: int
    floor_psnr: float
    floor_ssim: float
    floor_guess: str
    def __init__(self, index: _Optional[int] = ..., matched_index: _Optional[int] = ..., psnr: _Optional[float] = ..., ssim: _Optional[float] = ..., mse: _Optional[float] = ..., margin: _Optional[float] = ..., voters: _Optional[int] = ..., fisher_psnr_ceiling: _Optional[float] = ..., padding: _Optional[bool] = ..., exact: _Optional[bool] = ..., exact_index: _Optional[int] = ..., floor_psnr: _Optional[float] = ..., floor_ssim: _Optional[float] = ..., floor_guess: _Optional[str] = ...) -> None: ...

class FloorScore(_message.Message):
    __slots__ = ("guess", "mean_psnr", "mean_ssim")
    GUESS_FIELD_NUMBER: _ClassVar[int]
    MEAN_PSNR_FIELD_NUMBER: _ClassVar[int]
    MEAN_SSIM_FIELD_NUMBER: _ClassVar[int]
    guess: str
    mean_psnr: float
    mean_ssim: float
    def __init__(self, guess: _Optional[str] = ..., mean_psnr: _Optional[float] = ..., mean_ssim: _Optional[float] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("images", "mean_psnr", "mean_ssim", "mean_mse", "labels_scored", "label_accuracy", "features_scored", "features", "mean_feature_cosine", "mean_feature_relative_error", "recovered", "recovered_ssim", "fisher_bounded", "fisher_note", "mean_fisher_psnr_ceiling", "exact", "exact_psnr", "best_psnr", "best_scored", "successes", "success_psnr", "text", "floors_scored", "floors", "mean_floor_psnr", "mean_floor_ssim", "mean_floor_margin", "above_floor", "floor_margin_db")
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
    FISHER_BOUNDED_FIELD_NUMBER: _ClassVar[int]
    FISHER_NOTE_FIELD_NUMBER: _ClassVar[int]
    MEAN_FISHER_PSNR_CEILING_FIELD_NUMBER: _ClassVar[int]
    EXACT_FIELD_NUMBER: _ClassVar[int]
    EXACT_PSNR_FIELD_NUMBER: _ClassVar[int]
    BEST_PSNR_FIELD_NUMBER: _ClassVar[int]
    BEST_SCORED_FIELD_NUMBER: _ClassVar[int]
    SUCCESSES_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_PSNR_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FLOORS_SCORED_FIELD_NUMBER: _ClassVar[int]
    FLOORS_FIELD_NUMBER: _ClassVar[int]
    MEAN_FLOOR_PSNR_FIELD_NUMBER: _ClassVar[int]
    MEAN_FLOOR_SSIM_FIELD_NUMBER: _ClassVar[int]
    MEAN_FLOOR_MARGIN_FIELD_NUMBER: _ClassVar[int]
    ABOVE_FLOOR_FIELD_NUMBER: _ClassVar[int]
    FLOOR_MARGIN_DB_FIELD_NUMBER: _ClassVar[int]
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
    fisher_bounded: bool
    fisher_note: str
    mean_fisher_psnr_ceiling: float
    exact: int
    exact_psnr: float
    best_psnr: float
    best_scored: bool
    successes: int
    success_psnr: float
    text: TextScore
    floors_scored: bool
    floors: _containers.RepeatedCompositeFieldContainer[FloorScore]
    mean_floor_psnr: float
    mean_floor_ssim: float
    mean_floor_margin: float
    above_floor: int
    floor_margin_db: float
    def __init__(self, images: _Optional[_Iterable[_Union[ImageScore, _Mapping]]] = ..., mean_psnr: _Optional[float] = ..., mean_ssim: _Optional[float] = ..., mean_mse: _Optional[float] = ..., labels_scored: _Optional[bool] = ..., label_accuracy: _Optional[float] = ..., features_scored: _Optional[bool] = ..., features: _Optional[_Iterable[_Union[FeatureScore, _Mapping]]] = ..., mean_feature_cosine: _Optional[float] = ..., mean_feature_relative_error: _Optional[float] = ..., recovered: _Optional[int] = ..., recovered_ssim: _Optional[float] = ..., fisher_bounded: _Optional[bool] = ..., fisher_note: _Optional[str] = ..., mean_fisher_psnr_ceiling: _Optional[float] = ..., exact: _Optional[int] = ..., exact_psnr: _Optional[float] = ..., best_psnr: _Optional[float] = ..., best_scored: _Optional[bool] = ..., successes: _Optional[int] = ..., success_psnr: _Optional[float] = ..., text: _Optional[_Union[TextScore, _Mapping]] = ..., floors_scored: _Optional[bool] = ..., floors: _Optional[_Iterable[_Union[FloorScore, _Mapping]]] = ..., mean_floor_psnr: _Optional[float] = ..., mean_floor_ssim: _Optional[float] = ..., mean_floor_margin: _Optional[float] = ..., above_floor: _Optional[int] = ..., floor_margin_db: _Optional[float] = ...) -> None: ...

class BeginInformedTrialRequest(_message.Message):
    __slots__ = ("parameters", "buffers")
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    parameters: _containers.RepeatedCompositeFieldContainer[Tensor]
    buffers: _containers.RepeatedCompositeFieldContainer[Tensor]
    def __init__(self, parameters: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., buffers: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ...) -> None: ...

class InformedTrial(_message.Message):
    __slots__ = ("trial_id", "candidates", "candidate_labels", "known_images", "known_labels", "update", "update_kind", "protocol", "num_images", "local_steps", "metadata", "threat_model")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_LABELS_FIELD_NUMBER: _ClassVar[int]
    KNOWN_IMAGES_FIELD_NUMBER: _ClassVar[int]
    KNOWN_LABELS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    UPDATE_KIND_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    NUM_IMAGES_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    THREAT_MODEL_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    candidates: Tensor
    candidate_labels: _containers.RepeatedScalarFieldContainer[int]
    known_images: Tensor
    known_labels: _containers.RepeatedScalarFieldContainer[int]
    update: _containers.RepeatedCompositeFieldContainer[Tensor]
    update_kind: str
    protocol: ProtocolSpec
    num_images: int
    local_steps: int
    metadata: _containers.ScalarMap[str, str]
    threat_model: str
    def __init__(self, trial_id: _Optional[str] = ..., candidates: _Optional[_Union[Tensor, _Mapping]] = ..., candidate_labels: _Optional[_Iterable[int]] = ..., known_images: _Optional[_Union[Tensor, _Mapping]] = ..., known_labels: _Optional[_Iterable[int]] = ..., update: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., update_kind: _Optional[str] = ..., protocol: _Optional[_Union[ProtocolSpec, _Mapping]] = ..., num_images: _Optional[int] = ..., local_steps: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., threat_model: _Optional[str] = ...) -> None: ...

class InformedGuess(_message.Message):
    __slots__ = ("trial_id", "candidate")
    TRIAL_ID_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    trial_id: str
    candidate: int
    def __init__(self, trial_id: _Optional[str] = ..., candidate: _Optional[int] = ...) -> None: ...

class InformedOutcome(_message.Message):
    __slots__ = ("success", "trials_scored", "successes")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    TRIALS_SCORED_FIELD_NUMBER: _ClassVar[int]
    SUCCESSES_FIELD_NUMBER: _ClassVar[int]
    success: bool
    trials_scored: int
    successes: int
    def __init__(self, success: _Optional[bool] = ..., trials_scored: _Optional[int] = ..., successes: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("parameters", "buffers", "protocol", "audit_id")
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    parameters: _containers.RepeatedCompositeFieldContainer[Tensor]
    buffers: _containers.RepeatedCompositeFieldContainer[Tensor]
    protocol: ProtocolSpec
    audit_id: str
    def __init__(self, parameters: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., buffers: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., protocol: _Optional[_Union[ProtocolSpec, _Mapping]] = ..., audit_id: _Optional[str] = ...) -> None: ...

class BeginSecAggResponse(_message.Message):
    __slots__ = ("round_id", "user_ids", "threshold", "clip", "vector_length", "session", "update_kind", "protocol", "images_per_user", "local_steps", "metadata", "audit_round", "audit_trial")
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
    AUDIT_ROUND_FIELD_NUMBER: _ClassVar[int]
    AUDIT_TRIAL_FIELD_NUMBER: _ClassVar[int]
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
    audit_round: bool
    audit_trial: int
    def __init__(self, round_id: _Optional[str] = ..., user_ids: _Optional[_Iterable[int]] = ..., threshold: _Optional[int] = ..., clip: _Optional[float] = ..., vector_length: _Optional[int] = ..., session: _Optional[int] = ..., update_kind: _Optional[str] = ..., protocol: _Optional[_Union[ProtocolSpec, _Mapping]] = ..., images_per_user: _Optional[int] = ..., local_steps: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., audit_round: _Optional[bool] = ..., audit_trial: _Optional[int] = ...) -> None: ...

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

class BeginAuditRequest(_message.Message):
    __slots__ = ("parameters", "buffers", "protocol", "canary", "direction", "canary_seed", "canary_norm", "coordinate", "trials", "delta", "confidence", "threshold_rule", "threshold", "calibration_fraction", "detect_shortfall", "power", "false_alarm", "single_canary", "max_chosen_trials")
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    CANARY_SEED_FIELD_NUMBER: _ClassVar[int]
    CANARY_NORM_FIELD_NUMBER: _ClassVar[int]
    COORDINATE_FIELD_NUMBER: _ClassVar[int]
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_RULE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_FRACTION_FIELD_NUMBER: _ClassVar[int]
    DETECT_SHORTFALL_FIELD_NUMBER: _ClassVar[int]
    POWER_FIELD_NUMBER: _ClassVar[int]
    FALSE_ALARM_FIELD_NUMBER: _ClassVar[int]
    SINGLE_CANARY_FIELD_NUMBER: _ClassVar[int]
    MAX_CHOSEN_TRIALS_FIELD_NUMBER: _ClassVar[int]
    parameters: _containers.RepeatedCompositeFieldContainer[Tensor]
    buffers: _containers.RepeatedCompositeFieldContainer[Tensor]
    protocol: ProtocolSpec
    canary: str
    direction: str
    canary_seed: int
    canary_norm: float
    coordinate: int
    trials: int
    delta: float
    confidence: float
    threshold_rule: str
    threshold: float
    calibration_fraction: float
    detect_shortfall: float
    power: float
    false_alarm: float
    single_canary: bool
    max_chosen_trials: int
    def __init__(self, parameters: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., buffers: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., protocol: _Optional[_Union[ProtocolSpec, _Mapping]] = ..., canary: _Optional[str] = ..., direction: _Optional[str] = ..., canary_seed: _Optional[int] = ..., canary_norm: _Optional[float] = ..., coordinate: _Optional[int] = ..., trials: _Optional[int] = ..., delta: _Optional[float] = ..., confidence: _Optional[float] = ..., threshold_rule: _Optional[str] = ..., threshold: _Optional[float] = ..., calibration_fraction: _Optional[float] = ..., detect_shortfall: _Optional[float] = ..., power: _Optional[float] = ..., false_alarm: _Optional[float] = ..., single_canary: _Optional[bool] = ..., max_chosen_trials: _Optional[int] = ...) -> None: ...

class AuditClaim(_message.Message):
    __slots__ = ("epsilon", "delta", "mechanism", "accountant", "mu", "reported_epsilon")
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTANT_FIELD_NUMBER: _ClassVar[int]
    MU_FIELD_NUMBER: _ClassVar[int]
    REPORTED_EPSILON_FIELD_NUMBER: _ClassVar[int]
    epsilon: float
    delta: float
    mechanism: str
    accountant: str
    mu: float
    reported_epsilon: float
    def __init__(self, epsilon: _Optional[float] = ..., delta: _Optional[float] = ..., mechanism: _Optional[str] = ..., accountant: _Optional[str] = ..., mu: _Optional[float] = ..., reported_epsilon: _Optional[float] = ...) -> None: ...

class BeginAuditResponse(_message.Message):
    __slots__ = ("audit_id", "trials", "canary", "direction", "canary_direction", "canary_image", "canary_label", "canary_norm", "coordinate", "claim", "threat_model", "delta", "confidence", "update_kind", "protocol", "secure_aggregation", "canary_user", "score_sign", "expected_shift", "threshold_rule", "threshold", "max_trials_per_call", "coverage", "canaries", "false_alarm", "power", "detect_shortfall")
    AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    CANARY_DIRECTION_FIELD_NUMBER: _ClassVar[int]
    CANARY_IMAGE_FIELD_NUMBER: _ClassVar[int]
    CANARY_LABEL_FIELD_NUMBER: _ClassVar[int]
    CANARY_NORM_FIELD_NUMBER: _ClassVar[int]
    COORDINATE_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    THREAT_MODEL_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    UPDATE_KIND_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    SECURE_AGGREGATION_FIELD_NUMBER: _ClassVar[int]
    CANARY_USER_FIELD_NUMBER: _ClassVar[int]
    SCORE_SIGN_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_SHIFT_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_RULE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    MAX_TRIALS_PER_CALL_FIELD_NUMBER: _ClassVar[int]
    COVERAGE_FIELD_NUMBER: _ClassVar[int]
    CANARIES_FIELD_NUMBER: _ClassVar[int]
    FALSE_ALARM_FIELD_NUMBER: _ClassVar[int]
    POWER_FIELD_NUMBER: _ClassVar[int]
    DETECT_SHORTFALL_FIELD_NUMBER: _ClassVar[int]
    audit_id: str
    trials: int
    canary: str
    direction: str
    canary_direction: _containers.RepeatedCompositeFieldContainer[Tensor]
    canary_image: Tensor
    canary_label: int
    canary_norm: float
    coordinate: int
    claim: AuditClaim
    threat_model: str
    delta: float
    confidence: float
    update_kind: str
    protocol: ProtocolSpec
    secure_aggregation: bool
    canary_user: int
    score_sign: float
    expected_shift: float
    threshold_rule: str
    threshold: float
    max_trials_per_call: int
    coverage: str
    canaries: int
    false_alarm: float
    power: float
    detect_shortfall: float
    def __init__(self, audit_id: _Optional[str] = ..., trials: _Optional[int] = ..., canary: _Optional[str] = ..., direction: _Optional[str] = ..., canary_direction: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., canary_image: _Optional[_Union[Tensor, _Mapping]] = ..., canary_label: _Optional[int] = ..., canary_norm: _Optional[float] = ..., coordinate: _Optional[int] = ..., claim: _Optional[_Union[AuditClaim, _Mapping]] = ..., threat_model: _Optional[str] = ..., delta: _Optional[float] = ..., confidence: _Optional[float] = ..., update_kind: _Optional[str] = ..., protocol: _Optional[_Union[ProtocolSpec, _Mapping]] = ..., secure_aggregation: _Optional[bool] = ..., canary_user: _Optional[int] = ..., score_sign: _Optional[float] = ..., expected_shift: _Optional[float] = ..., threshold_rule: _Optional[str] = ..., threshold: _Optional[float] = ..., max_trials_per_call: _Optional[int] = ..., coverage: _Optional[str] = ..., canaries: _Optional[int] = ..., false_alarm: _Optional[float] = ..., power: _Optional[float] = ..., detect_shortfall: _Optional[float] = ...) -> None: ...

class AuditTrialsRequest(_message.Message):
    __slots__ = ("audit_id", "count")
    AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    audit_id: str
    count: int
    def __init__(self, audit_id: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class AuditTrial(_message.Message):
    __slots__ = ("index", "update")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    index: int
    update: _containers.RepeatedCompositeFieldContainer[Tensor]
    def __init__(self, index: _Optional[int] = ..., update: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ...) -> None: ...

class AuditTrialsResponse(_message.Message):
    __slots__ = ("trials", "trials_left", "update_kind", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    TRIALS_LEFT_FIELD_NUMBER: _ClassVar[int]
    UPDATE_KIND_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    trials: _containers.RepeatedCompositeFieldContainer[AuditTrial]
    trials_left: int
    update_kind: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, trials: _Optional[_Iterable[_Union[AuditTrial, _Mapping]]] = ..., trials_left: _Optional[int] = ..., update_kind: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class AuditScoresRequest(_message.Message):
    __slots__ = ("audit_id", "scores")
    AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    audit_id: str
    scores: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, audit_id: _Optional[str] = ..., scores: _Optional[_Iterable[float]] = ...) -> None: ...

class AuditBound(_message.Message):
    __slots__ = ("estimator", "epsilon", "is_estimate", "confidence", "trials_in", "trials_out", "delta", "canary", "threat_model", "threshold_rule", "threshold", "lower_threshold", "fpr_upper", "fnr_upper", "mu", "reference", "group", "interval_low", "interval_high", "interval_level", "note")
    ESTIMATOR_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    IS_ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    TRIALS_IN_FIELD_NUMBER: _ClassVar[int]
    TRIALS_OUT_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    THREAT_MODEL_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_RULE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    LOWER_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    FPR_UPPER_FIELD_NUMBER: _ClassVar[int]
    FNR_UPPER_FIELD_NUMBER: _ClassVar[int]
    MU_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_LOW_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_HIGH_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_LEVEL_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    estimator: str
    epsilon: float
    is_estimate: bool
    confidence: float
    trials_in: int
    trials_out: int
    delta: float
    canary: str
    threat_model: str
    threshold_rule: str
    threshold: float
    lower_threshold: float
    fpr_upper: float
    fnr_upper: float
    mu: float
    reference: str
    group: str
    interval_low: float
    interval_high: float
    interval_level: float
    note: str
    def __init__(self, estimator: _Optional[str] = ..., epsilon: _Optional[float] = ..., is_estimate: _Optional[bool] = ..., confidence: _Optional[float] = ..., trials_in: _Optional[int] = ..., trials_out: _Optional[int] = ..., delta: _Optional[float] = ..., canary: _Optional[str] = ..., threat_model: _Optional[str] = ..., threshold_rule: _Optional[str] = ..., threshold: _Optional[float] = ..., lower_threshold: _Optional[float] = ..., fpr_upper: _Optional[float] = ..., fnr_upper: _Optional[float] = ..., mu: _Optional[float] = ..., reference: _Optional[str] = ..., group: _Optional[str] = ..., interval_low: _Optional[float] = ..., interval_high: _Optional[float] = ..., interval_level: _Optional[float] = ..., note: _Optional[str] = ...) -> None: ...

class AuditTest(_message.Message):
    __slots__ = ("test", "group", "p_value", "rejected", "statement", "samples_in", "samples_out", "ratio", "ratio_lower", "detectable_noise", "power", "epsilon_lb", "level")
    TEST_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    P_VALUE_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_IN_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_OUT_FIELD_NUMBER: _ClassVar[int]
    RATIO_FIELD_NUMBER: _ClassVar[int]
    RATIO_LOWER_FIELD_NUMBER: _ClassVar[int]
    DETECTABLE_NOISE_FIELD_NUMBER: _ClassVar[int]
    POWER_FIELD_NUMBER: _ClassVar[int]
    EPSILON_LB_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    test: str
    group: str
    p_value: float
    rejected: bool
    statement: str
    samples_in: int
    samples_out: int
    ratio: float
    ratio_lower: float
    detectable_noise: float
    power: float
    epsilon_lb: float
    level: float
    def __init__(self, test: _Optional[str] = ..., group: _Optional[str] = ..., p_value: _Optional[float] = ..., rejected: _Optional[bool] = ..., statement: _Optional[str] = ..., samples_in: _Optional[int] = ..., samples_out: _Optional[int] = ..., ratio: _Optional[float] = ..., ratio_lower: _Optional[float] = ..., detectable_noise: _Optional[float] = ..., power: _Optional[float] = ..., epsilon_lb: _Optional[float] = ..., level: _Optional[float] = ...) -> None: ...

class AuditScoreHistogram(_message.Message):
    __slots__ = ("edges", "canary_in", "canary_out")
    EDGES_FIELD_NUMBER: _ClassVar[int]
    CANARY_IN_FIELD_NUMBER: _ClassVar[int]
    CANARY_OUT_FIELD_NUMBER: _ClassVar[int]
    edges: _containers.RepeatedScalarFieldContainer[float]
    canary_in: _containers.RepeatedScalarFieldContainer[int]
    canary_out: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, edges: _Optional[_Iterable[float]] = ..., canary_in: _Optional[_Iterable[int]] = ..., canary_out: _Optional[_Iterable[int]] = ...) -> None: ...

class AuditReport(_message.Message):
    __slots__ = ("audit_id", "bounds", "claim", "violation", "verdict", "histogram", "trials", "canary", "threat_model", "tests", "power_statement", "detectable_noise", "false_alarm", "coverage")
    AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    BOUNDS_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    VIOLATION_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    TRIALS_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    THREAT_MODEL_FIELD_NUMBER: _ClassVar[int]
    TESTS_FIELD_NUMBER: _ClassVar[int]
    POWER_STATEMENT_FIELD_NUMBER: _ClassVar[int]
    DETECTABLE_NOISE_FIELD_NUMBER: _ClassVar[int]
    FALSE_ALARM_FIELD_NUMBER: _ClassVar[int]
    COVERAGE_FIELD_NUMBER: _ClassVar[int]
    audit_id: str
    bounds: _containers.RepeatedCompositeFieldContainer[AuditBound]
    claim: AuditClaim
    violation: bool
    verdict: str
    histogram: AuditScoreHistogram
    trials: int
    canary: str
    threat_model: str
    tests: _containers.RepeatedCompositeFieldContainer[AuditTest]
    power_statement: str
    detectable_noise: float
    false_alarm: float
    coverage: str
    def __init__(self, audit_id: _Optional[str] = ..., bounds: _Optional[_Iterable[_Union[AuditBound, _Mapping]]] = ..., claim: _Optional[_Union[AuditClaim, _Mapping]] = ..., violation: _Optional[bool] = ..., verdict: _Optional[str] = ..., histogram: _Optional[_Union[AuditScoreHistogram, _Mapping]] = ..., trials: _Optional[int] = ..., canary: _Optional[str] = ..., threat_model: _Optional[str] = ..., tests: _Optional[_Iterable[_Union[AuditTest, _Mapping]]] = ..., power_statement: _Optional[str] = ..., detectable_noise: _Optional[float] = ..., false_alarm: _Optional[float] = ..., coverage: _Optional[str] = ...) -> None: ...
