"""The model as vLLM 0.33.0 finds and reads it, headers only: no weight byte is read.

Steps and their vLLM source (paths inside the 0.33.0 wheel):
- driver, HF_HUB_OFFLINE: a model that is not a path becomes its cached snapshot dir through
  `snapshot_download(local_files_only=True, ignore_patterns="*")`; absent -> huggingface_hub's
  LocalEntryNotFoundError, uncaught (engine/arg_utils.py:933-947, transformers_utils/repo_utils.py:286-304)
- driver: config.json must exist and parse (transformers_utils/config.py:879-923 get_config and
  its with_retry, repo_utils.py:99-129; the JSON error is transformers')      -> check_config
- each rank: the snapshot of its own node (snapshot_download, HF_HUB_OFFLINE as
  local_files_only), `*.safetensors` globbed, every shard of the index's weight_map present,
  sizes summed, each shard's header read as safetensors reads it
  (model_loader/default_loader.py:147-263, weight_utils.py:437-542, 590-616, 962-1022, 1115-1249;
  safetensors 0.8.0 tensor.rs read_metadata/validate)                         -> load_weights

huggingface_hub is imported with this module: like vLLM's workers, a Ray rank reads HF_HOME and
HF_HUB_OFFLINE from its own node's environment before the driver's is carried over.

The simulator never downloads. Not offline and not cached: it logs that a real vLLM would
download the model now, and carries on without weights (lab stacks older than the generated
model have none). Cached: it checks what is there (a real vLLM online would first fetch a
missing file; the lab's nodes have no egress, where vLLM ends up with the same check).
"""

import glob
import json
import os
import re
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import huggingface_hub.constants
from huggingface_hub import HfApi, try_to_load_from_cache
from huggingface_hub.errors import LocalEntryNotFoundError

from vllm_sim import simulated_version
from vllm_sim.logger import init_logger

logger = init_logger(__name__)

HF_CONFIG_NAME = "config.json"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"  # transformers.utils
# load_format "auto" -> "hf": safetensors, else .bin, with the .pt fall-back (default_loader.py:179-200)
ALLOW_PATTERNS = ["*.safetensors", "*.bin", "*.pt"]
CONFIG_RETRIES, CONFIG_RETRY_DELAY_S = 2, 2  # repo_utils.py:99-104 with_retry defaults
# safetensors 0.8.0 (safetensors/src/tensor.rs): header limit and element widths in bits
MAX_HEADER_SIZE = 100_000_000
DTYPE_BITS = {
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8,
    "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16,
    "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64,
    "U64": 64,
}
# weight_utils.py:842
_BAR = "{desc}: {pct:3.0f}% Completed | {n}/{total} [{elapsed}<{remaining}, {rate}]"
_LOADING_DESC = "Loading safetensors checkpoint shards"


class SafetensorError(Exception):
    """Stands in for safetensors_rust.SafetensorError; the messages are the library's."""


@dataclass(frozen=True)
class ModelSource:
    """What `vllm serve` was told about the weights."""

    model: str  # repo id or directory (after the driver's offline resolution)
    revision: str | None = None  # --revision; None = main
    download_dir: str | None = None  # --download-dir: the ranks' HF cache dir


@dataclass(frozen=True)
class Loaded:
    """What one rank found (None instead when a real vLLM would have downloaded)."""

    folder: str
    files: int
    bytes: int
    tensors: int


def _hf_api() -> HfApi:
    # transformers_utils/repo_utils.py:33-41
    return HfApi(library_name="vllm", library_version=simulated_version())


def offline() -> bool:
    return bool(huggingface_hub.constants.HF_HUB_OFFLINE)


def resolve_model(model: str, revision: str | None) -> str:
    """Driver: HF_HUB_OFFLINE turns a repo id into its snapshot directory or fails there."""
    if not offline() or os.path.exists(model):
        return model
    path = _hf_api().snapshot_download(
        repo_id=model, local_files_only=True, ignore_patterns="*", revision=revision
    )
    logger.info("HF_HUB_OFFLINE is True, replace model_id [%s] to model_path [%s]", model, path)
    return str(path)


def _invalid_model(model: str) -> ValueError:
    return ValueError(
        "Invalid repository ID or local directory specified:"
        f" '{model}'.\nPlease verify the following requirements:\n"
        "1. Provide a valid Hugging Face repository ID.\n"
        "2. Specify a local directory that contains a recognized "
        "configuration file.\n"
        "   - For Hugging Face models: ensure the presence of a "
        "'config.json'.\n"
        "   - For Mistral models: ensure the presence of a "
        "'params.json'.\n"
    )


def _config_path(model: str, revision: str | None) -> str | None:
    if Path(model).exists():
        path = Path(model) / HF_CONFIG_NAME
        if path.is_file():
            return str(path)
        try:
            raise ValueError(
                "Could not detect config format for no config file found. "
                "With config_format 'auto', ensure your model has either "
                "config.json (HF format) or params.json (Mistral format). "
                "Otherwise please specify your_custom_config_format "
                "in engine args for customized config parser."
            )
        except ValueError as e:
            raise _invalid_model(model) from e
    try:
        cached = try_to_load_from_cache(repo_id=model, filename=HF_CONFIG_NAME, revision=revision)
    except Exception as e:  # HFValidationError: neither a path nor a repo id
        raise _invalid_model(model) from e
    return cached if isinstance(cached, str) else None


def check_config(model: str, revision: str | None) -> dict[str, Any] | None:
    """Driver: config.json as get_config reads it; None when only the Hub would have it."""
    path = _config_path(model, revision)
    if path is None:
        logger.info(
            "%s is not in this node's Hugging Face cache (%s): a real vLLM would fetch its "
            "config.json from the Hub now (simulated: nothing is downloaded).",
            model, huggingface_hub.constants.HF_HUB_CACHE,
        )
        return None
    for attempt in range(CONFIG_RETRIES):
        try:
            try:
                with open(path, encoding="utf-8") as fh:
                    config: dict[str, Any] = json.load(fh)
                return config
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise OSError(
                    f"It looks like the config file at '{path}' is not a valid JSON file."
                ) from None
        except OSError as e:
            if attempt == CONFIG_RETRIES - 1:
                logger.error("Error parsing config for %s: %s", model, e)
                raise
            logger.error("Error parsing config for %s: %s, retrying %d of %d",
                         model, e, attempt + 1, CONFIG_RETRIES)
            time.sleep(CONFIG_RETRY_DELAY_S)
    raise AssertionError("unreachable")


def _download_weights_from_hf(source: ModelSource) -> str | None:
    """weight_utils.py:437-542 without the network: the cached snapshot, or None where a real
    vLLM would download (not offline); offline, huggingface_hub's own error."""
    folder = None
    for pattern in ALLOW_PATTERNS:
        try:
            folder = _hf_api().snapshot_download(
                source.model, allow_patterns=pattern, cache_dir=source.download_dir,
                revision=source.revision, local_files_only=True,
            )
        except LocalEntryNotFoundError:
            if offline():
                raise
            logger.info(
                "%s is not in this node's Hugging Face cache (%s): a real vLLM would download "
                "its weights from the Hub now (simulated: nothing is downloaded, nothing checked).",
                source.model, source.download_dir or huggingface_hub.constants.HF_HUB_CACHE,
            )
            return None
        if any(Path(folder).glob(pattern)):
            break
    return folder


def _filter_duplicate_safetensors_files(files: list[str], folder: str) -> list[str]:
    """weight_utils.py:590-616: only the index's shards, every one of them present."""
    index_file = os.path.join(folder, SAFE_WEIGHTS_INDEX_NAME)
    if not os.path.isfile(index_file):
        return files
    with open(index_file) as f:
        weight_map = json.load(f)["weight_map"]
    in_index = {os.path.join(folder, shard) for shard in weight_map.values()}
    missing_files = in_index - set(files)
    if missing_files:
        raise FileNotFoundError(f"Weight files referenced in index but missing: {missing_files}")
    return [f for f in files if f in in_index]


def prepare_weights(source: ModelSource) -> tuple[str, list[str], bool] | None:
    """default_loader.py:147-263: (folder, weight files, safetensors?) or None (not cached)."""
    folder = source.model if os.path.isdir(source.model) else _download_weights_from_hf(source)
    if folder is None:
        return None
    files: list[str] = []
    use_safetensors = False
    for pattern in ALLOW_PATTERNS:
        files += glob.glob(os.path.join(folder, pattern))
        if files:
            use_safetensors = pattern.endswith(".safetensors")
            break
    if use_safetensors:
        files = _filter_duplicate_safetensors_files(files, folder)
    if not files:
        raise RuntimeError(f"Cannot find any model weights with `{source.model}`")
    return folder, files, use_safetensors


def _header_error(reason: str) -> SafetensorError:
    # bindings/python/src/lib.rs Open::new
    return SafetensorError(f"Error while deserializing header: {reason}")


def _tensor_info(name: str, info: Any) -> tuple[int, int, int]:
    """(begin, end, bits) of one header entry; serde's complaints, roughly worded."""
    if not isinstance(info, dict):
        raise _header_error(f"invalid JSON in header: invalid type for tensor `{name}`")
    for field in ("dtype", "shape", "data_offsets"):
        if field not in info:
            raise _header_error(f"invalid JSON in header: missing field `{field}`")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if dtype not in DTYPE_BITS:
        raise _header_error(f"invalid JSON in header: unknown variant `{dtype}`")
    if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
            or not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and o >= 0 for o in offsets)):
        raise _header_error(f"invalid JSON in header: invalid shape or data_offsets of `{name}`")
    count = 1
    for d in shape:
        count *= d
    return offsets[0], offsets[1], count * DTYPE_BITS[dtype]


def read_safetensors_header(path: str) -> tuple[dict[str, Any], int]:
    """(header, data bytes) of one shard, checked in safetensors' order (tensor.rs
    read_metadata and Metadata::validate); reads the header and the file size only."""
    try:
        fh = open(path, "rb")  # noqa: SIM115
    except FileNotFoundError:
        raise FileNotFoundError(f"No such file or directory: {path}") from None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if size < 8:
            raise _header_error("header too small")
        (n,) = struct.unpack("<Q", fh.read(8))
        if n > MAX_HEADER_SIZE:
            raise _header_error("header too large")
        if 8 + n > size:
            raise _header_error("invalid header length")
        raw = fh.read(n)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _header_error(f"invalid UTF-8 in header: invalid utf-8 sequence of "
                            f"{e.end - e.start} bytes from index {e.start}") from None
    try:
        header = json.loads(text)
    except json.JSONDecodeError as e:
        raise _header_error(f"invalid JSON in header: {e.msg} at line {e.lineno} "
                            f"column {e.colno}") from None
    if not isinstance(header, dict):
        raise _header_error("invalid JSON in header: invalid type: expected a map")
    header.pop("__metadata__", None)
    entries = sorted(((_tensor_info(k, v), k) for k, v in header.items()), key=lambda x: x[0][:2])
    start = 0
    for (begin, end, bits), name in entries:
        if begin != start or end < begin:
            raise _header_error(f"invalid offset for tensor `{name}`")
        if bits % 8:
            raise _header_error("The slice is slicing for subbytes dtypes, and the slice does not "
                                "end up at a byte boundary, this is invalid.")
        if end - begin != bits // 8:
            raise _header_error("invalid shape, data type, or offset for tensor")
        start = end
    if start + 8 + n != size:
        raise _header_error("incomplete metadata, file not fully covered")
    return header, start


def _natural_sort_key(filepath: str) -> list[Any]:
    # weight_utils.py:152-158
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", os.path.basename(filepath))]


def _fs_type(path: str) -> str:
    """weight_utils.py:990-1020: the longest /proc/mounts prefix of the first file."""
    resolved, best, fstype = os.path.realpath(path), "", ""
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and (resolved == parts[1] or resolved.startswith(
                        os.path.join(parts[1], ""))) and len(parts[1]) > len(best):
                    best, fstype = parts[1], parts[2]
    except OSError:
        return ""
    return fstype


def _available_ram_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _mmss(seconds: float) -> str:
    return f"{int(seconds) // 60:02d}:{int(seconds) % 60:02d}"


def _bar(n: int, total: int, t0: float) -> None:
    """A tqdm line as vLLM's rank 0 prints it (stderr, one line per update)."""
    elapsed = time.perf_counter() - t0
    rate = f"{n / elapsed:.2f}it/s" if n and elapsed > 0 else "?it/s"
    remaining = _mmss(elapsed / n * (total - n)) if n else "?"
    print(_BAR.format(desc=_LOADING_DESC, pct=100 * n / total, n=n, total=total,
                      elapsed=_mmss(elapsed), remaining=remaining, rate=rate),
          file=sys.stderr, flush=True)


def load_weights(source: ModelSource, *, progress: bool, where: str,
                 pretend_s: float = 0.0) -> Loaded | None:
    """One rank's weight loading, headers only. `progress`: print the shard bar (rank 0 in
    vLLM). `where` ("rank 1 on 10.0.0.2 (node-2)") goes into a note on any failure, with the
    shard being read: a simulator addition, safetensors' own messages name no file.
    `pretend_s`: the load's pretend time (VLLM_SIM_LOAD_SECONDS), spent before vLLM's
    "Loading weights took" line, as a real load's is."""
    t0 = time.perf_counter()
    current: str | None = None
    try:
        prepared = prepare_weights(source)
        if prepared is None:
            return None
        folder, files, use_safetensors = prepared
        files = sorted(files, key=_natural_sort_key)
        total = sum(os.path.getsize(f) for f in files)  # a dangling link fails here, as in vLLM
        logger.info(
            "Filesystem type for checkpoints: %s. Checkpoint size: %.2f GiB. "
            "Available RAM: %.2f GiB.",
            (_fs_type(files[0]).upper() or "unknown"), total / 1024**3,
            _available_ram_bytes() / 1024**3,
        )
        tensors = 0
        if use_safetensors:
            for i, current in enumerate(files):
                if progress:
                    _bar(i, len(files), t0)
                tensors += len(read_safetensors_header(current)[0])
            if progress:
                _bar(len(files), len(files), t0)
    except Exception as e:
        e.add_note(f"vllm-sim: {where} failed to load {source.model}"
                   + (f" at {current}" if current else ""))
        raise
    time.sleep(pretend_s)
    logger.info("Loading weights took %.2f seconds", time.perf_counter() - t0)
    return Loaded(folder=folder, files=len(files), bytes=total, tensors=tensors)
