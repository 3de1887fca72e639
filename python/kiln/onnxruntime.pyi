# Type stubs for kiln.onnxruntime (ONNX Runtime's inference API over kiln engines).
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from . import Engine

class GraphOptimizationLevel:
    ORT_DISABLE_ALL: int
    ORT_ENABLE_BASIC: int
    ORT_ENABLE_EXTENDED: int
    ORT_ENABLE_ALL: int

class ExecutionMode:
    ORT_SEQUENTIAL: int
    ORT_PARALLEL: int

class SessionOptions:
    intra_op_num_threads: int
    inter_op_num_threads: int
    graph_optimization_level: int
    execution_mode: int
    execution_order: int
    log_severity_level: int
    log_verbosity_level: int
    logid: str
    enable_profiling: bool
    profile_file_prefix: str
    optimized_model_filepath: str
    enable_mem_pattern: bool
    enable_cpu_mem_arena: bool
    enable_mem_reuse: bool
    use_deterministic_compute: bool
    def add_session_config_entry(self, key: str, value: str) -> None: ...
    def get_session_config_entry(self, key: str) -> str: ...

class RunOptions:
    log_severity_level: int
    log_verbosity_level: int
    logid: str
    terminate: bool

class NodeArg:
    name: str
    shape: List[Union[int, str, None]]
    type: str

def get_available_providers() -> List[str]: ...
def get_device() -> str: ...
def cache_dir() -> str: ...

class InferenceSession:
    cache_file: str
    cache_hit: bool
    def __init__(
        self,
        path_or_bytes: Union[str, os.PathLike, bytes],
        sess_options: Optional[SessionOptions] = ...,
        providers: Optional[Sequence[Any]] = ...,
        provider_options: Optional[Sequence[Dict[str, Any]]] = ...,
        **kwargs: Any,
    ) -> None: ...
    def get_inputs(self) -> List[NodeArg]: ...
    def get_outputs(self) -> List[NodeArg]: ...
    def get_overridable_initializers(self) -> List[NodeArg]: ...
    def get_providers(self) -> List[str]: ...
    def get_provider_options(self) -> Dict[str, Dict[str, Any]]: ...
    def get_session_options(self) -> SessionOptions: ...
    def set_providers(self, providers: Optional[Sequence[Any]] = ..., provider_options: Any = ...) -> None: ...
    def run(
        self, output_names: Optional[Sequence[str]], input_feed: Mapping[str, Any], run_options: Optional[RunOptions] = ...
    ) -> List[np.ndarray]: ...
    @property
    def engine(self) -> Engine: ...
