"""The peers' estimators, run in their own venv (bench/sparkrun_env.py: CPython 3.12, kvfit
0.3.0 and sparkrun 0.4.2 from PyPI): a JSON list of cases on stdin (bench/estimators_cases.py
peer_input), one JSON object on stdout. Imports kvfit, sparkrun and the standard library only;
run by bench/estimators.py, never by the repository's own venv.

Each tool is run through its own functions, nothing of its arithmetic redone here:

- kvfit: its Python API composed as its CLI composes it for one hardware target (cli.run):
  resolve_cache_dtype, estimate_cache, apply_cache_layout ("logical", the default),
  plan_topologies with the GPU as `custom:<GiB>` (parse_hardware) and no runtime reserve (the
  CLI's default). Its HF metadata fetch is the network's, so the checkpoint's size is passed
  as weight_bytes (what the CLI's --weight-gib does). Available KV is planner.py's own
  `available_for_kv = budget - weights_per_rank - fixed_per_rank - runtime_reserve_bytes`, from
  the TopologyEstimate's fields; KV tokens are its sequences before the floor
  (available_for_kv / kv_per_sequence_per_rank) x the context, as vLLM counts concurrency x
  max_model_len. Admitted: verdict "fits".
- sparkrun: a recipe (runtime vllm, defaults max_model_len / gpu_memory_utilization /
  tensor_parallel / kv_cache_dtype) and Recipe.estimate_vram(total_gpu_memory_gb=...), which
  reads config.json and the checkpoint's size the way `sparkrun` does (fetch_model_config,
  extract_model_info, fetch_safetensors_size, then vram.estimate_vram), here from a local
  Hugging Face cache this script writes (config.json, model.safetensors.index.json with the
  size as metadata.total_size), HF_HUB_OFFLINE=1. Available KV is VRAMEstimate.available_kv_gb,
  KV tokens its max_context_tokens ("GB" there is bytes / 1024**3). Admitted: models/fit.py
  check_fit against one H200 of the GPU's total.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import tempfile
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any

GIB = 1024**3


def kvfit_one(case: dict[str, Any]) -> dict[str, Any]:
    from kvfit.architectures import estimate_cache
    from kvfit.cache_layout import apply_cache_layout
    from kvfit.cli import DTYPE_BYTES, resolve_cache_dtype
    from kvfit.hardware import parse_hardware
    from kvfit.planner import plan_topologies

    cfg = case["config"]
    kv_dtype, kv_source, warnings = resolve_cache_dtype(cfg, case["kv_cache_dtype"])
    cache = estimate_cache(cfg, context_tokens=case["context"], kv_bytes=DTYPE_BYTES[kv_dtype],
                           index_bytes=DTYPE_BYTES[kv_dtype])
    cache = apply_cache_layout(cache, cfg, profile="logical", kv_dtype=kv_dtype)
    hardware = parse_hardware(f"custom:{case['total_bytes'] / GIB!r}")
    (layout,) = plan_topologies(cache, weight_bytes=case["weight_bytes"], hardware=hardware,
                                gpus=case["tp"], utilization=case["utilization"],
                                tensor_parallel=case["tp"])
    available = (layout.budget_per_rank_bytes - layout.weights_per_rank_bytes
                 - layout.fixed_cache_per_rank_bytes - layout.runtime_reserve_per_rank_bytes)
    per_seq = layout.kv_per_sequence_per_rank_bytes
    tokens = int(max(available, 0) / per_seq * case["context"]) if per_seq else None
    return {"available_bytes": available, "tokens": tokens, "admits": layout.verdict == "fits",
            "raw": {"kv_dtype": kv_dtype, "kv_dtype_source": kv_source,
                    "warnings": list(warnings), "context_tokens": case["context"],
                    "hardware": hardware.as_dict(), "cache": cache.as_dict(),
                    "layout": layout.as_dict()}}


def _hf_cache(root: Path, model: str, case: dict[str, Any]) -> None:
    """A Hugging Face hub cache holding the model's config.json and its size, as
    huggingface_hub lays one out (models--org--name/{refs/main, snapshots/<rev>/})."""
    repo = root / ("models--" + model.replace("/", "--"))
    rev = "0" * 40
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    (snap / "config.json").write_text(json.dumps(case["config"]))
    (snap / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": case["weight_bytes"]}, "weight_map": {}}))


def sparkrun_one(case: dict[str, Any], root: Path, n: int) -> dict[str, Any]:
    from sparkrun.core.cluster_manager import ClusterDefinition
    from sparkrun.core.hardware import AcceleratorSpec, HostHardware
    from sparkrun.core.recipe import Recipe
    from sparkrun.models.fit import check_fit

    model = f"spark-vllm-bench/case-{n}"
    _hf_cache(root, model, case)
    defaults: dict[str, Any] = {"max_model_len": case["max_model_len"] or "auto",
                                "gpu_memory_utilization": case["utilization"],
                                "tensor_parallel": case["tp"]}
    if case["kv_cache_dtype"] != "auto":
        defaults["kv_cache_dtype"] = case["kv_cache_dtype"]
    recipe = Recipe({"model": model, "runtime": "vllm", "defaults": defaults})
    total_gb = case["total_bytes"] / GIB
    est = recipe.estimate_vram(total_gpu_memory_gb=total_gb)
    host = HostHardware(accelerators=[AcceleratorSpec(vendor="nvidia", model="h200", count=1,
                                                      memory_gb=total_gb)])
    fit = check_fit(est, ClusterDefinition(name="h200", hosts=["gpu"],
                                           hosts_hardware={"gpu": host}))
    avail = est.available_kv_gb
    return {"available_bytes": avail * GIB if avail is not None else None,
            "tokens": est.max_context_tokens, "admits": fit.ok,
            "raw": {"recipe_defaults": defaults, "estimate": est.to_dict(),
                    "fit": fit.to_dict()}}


def _guarded(fn: Any, *args: Any) -> dict[str, Any]:
    """A tool that refuses a model (kvfit fails closed on what it does not know) is a result:
    no estimate, nothing admitted, its error kept."""
    try:
        with contextlib.redirect_stdout(sys.stderr):  # stdout carries the one JSON answer
            return fn(*args)
    except Exception as e:  # noqa: BLE001  (the tool's own exception, whatever it is)
        return {"available_bytes": None, "tokens": None, "admits": False,
                "error": f"{type(e).__name__}: {e}",
                "raw": {"traceback": traceback.format_exc(limit=4)}}


def main() -> int:
    cases = json.load(sys.stdin)
    out = []
    with tempfile.TemporaryDirectory(prefix="peers-hf-") as tmp:
        os.environ["HF_HUB_CACHE"] = tmp  # read by huggingface_hub at import: before sparkrun's
        os.environ["HF_HUB_OFFLINE"] = "1"
        for n, case in enumerate(cases):
            out.append({"id": case["id"], "kvfit": _guarded(kvfit_one, case),
                        "sparkrun": _guarded(sparkrun_one, case, Path(tmp), n)})
    json.dump({"versions": {"kvfit": metadata.version("kvfit"),
                            "sparkrun": metadata.version("sparkrun"),
                            "python": platform.python_version(),
                            "huggingface_hub": metadata.version("huggingface_hub")},
               "results": out}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
