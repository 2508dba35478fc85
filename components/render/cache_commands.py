"""The node's compile cache (compileCache), pure: where it is mounted in the containers, the
env that points vLLM's, inductor's, Triton's and the other JIT caches there, and the lines a
Ray container's start runs before it (the directory, the image it was made with, how warm it
is). commands.start_script and docker_run_argv use them.
"""

from __future__ import annotations

import shlex

from ..spec import ClusterSpec, NodeSpec

# The node's compile caches (compileCache) inside every container that runs a rank or the
# driver. vLLM keeps its torch.compile artefacts under VLLM_CACHE_ROOT/torch_compile_cache/
# <hash>/rank_<r>_<dp>/ and points inductor and Triton there too (vllm/compilation/backends.py
# VllmBackend.__call__, compiler_interface.py initialize_cache); the hash covers the compile-
# affecting env, the vLLM config (model, dtype, parallel layout, compilation flags), the source
# of every traced file and the compiler (torch) version. Kernels JIT-built outside that
# (Triton kernels vLLM calls directly, FlashInfer, the driver's PTX JIT, torch extensions)
# keep their own caches, each keyed by its own source and version: all of them live here.
CACHE_MOUNT = "/spark-vllm-cache"
CACHE_ENV_DIRS = {"VLLM_CACHE_ROOT": "vllm", "TRITON_CACHE_DIR": "triton",
                  "TORCHINDUCTOR_CACHE_DIR": "inductor", "FLASHINFER_WORKSPACE_BASE": "flashinfer",
                  "CUDA_CACHE_PATH": "nv", "TORCH_EXTENSIONS_DIR": "torch_extensions"}
# The image id the cache was made with, in the cache directory. None of the keys above covers
# a rebuilt image whose versions did not change (a patched kernel library, another CUDA
# build): so a Ray container that starts with another image clears the node's cache first.
CACHE_STAMP = ".spark-vllm-image"


def cache_lines(spec: ClusterSpec, node: NodeSpec) -> list[str]:
    """Before a Ray container starts on `node`: its compile cache directory exists, owned by
    the SSH user (the containers write into it as root; clearing goes through a container, so
    no sudo is needed), and was made with this image, or is cleared; then how warm it is."""
    d = spec.compile_cache_dir
    assert d is not None
    image = shlex.quote(spec.image)
    stamp = f'"$cache"/{CACHE_STAMP}'
    return [
        f"cache={shlex.quote(d)}",
        'mkdir -p "$cache" 2>/dev/null && [ -w "$cache" ] || fail "compileCache $cache on '
        f'{node.name} is not a directory $(id -un) can write (chown it, or set compileCache '
        'to one it owns, or none)"',
        f"img=$(docker image inspect --format '{{{{.Id}}}}' {image} 2>/dev/null || true)",
        f'was=$(cat {stamp} 2>/dev/null || true)',
        'if [ -n "$img" ] && [ "$was" != "$img" ]; then',
        f'  if [ -n "$(ls -A "$cache" | grep -vx {shlex.quote(CACHE_STAMP)} || true)" ]; then',
        '    log "compile cache $cache was made with ${was:-another image}: clearing it for $img"',
        f"    docker run --rm --network none --volume \"$cache\":{CACHE_MOUNT} --entrypoint sh "
        f"{image} -c {shlex.quote(f'rm -rf {CACHE_MOUNT}/* {CACHE_MOUNT}/.[!.]*')} >/dev/null "
        '2>&1 || fail "cannot clear the compile cache $cache"',
        "  fi",
        f'  printf "%s\\n" "$img" > {stamp}',
        "fi",
        'log "compile cache $cache: $(du -sk "$cache" 2>/dev/null | cut -f1) KiB '
        '($(find "$cache" -path "*/torch_compile_cache/*" -name "rank_*" 2>/dev/null | wc -l) '
        'compiled rank dirs)"',
    ]
