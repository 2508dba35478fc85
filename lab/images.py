"""The lab's images, built locally (no registry): Debian base → node image, inner image.

- base  `spark-vllm-lab-base:bookworm`: debootstrap minbase, tarball cached under
  ${SPARK_VLLM_CACHE:-~/.cache/spark-vllm}/lab/, then `docker import`.
- node  `spark-vllm-lab-node:<hash of lab/node/*>`: sshd + dockerd (lab/node/Dockerfile).
- inner `spark-vllm-sim:lab`: Ray + vllm-sim playing vLLM config.SIM_VLLM_VERSION, labelled with
  the hash of what it was built from (lab/inner/*, lab/vllm_sim/**, the Ray version, the
  simulated vLLM version) so a change rebuilds it. The same image playing another vLLM version
  (e.g. the legacy config.LEGACY_SIM_VLLM_VERSION) is tagged `spark-vllm-sim:lab-<version>`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from lab import config
from lab.run import LabError, Progress, docker, docker_ok, run, run_logged

_IGNORED = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "build", "dist"}


def _files(root: Path) -> list[Path]:
    """Files under root that matter for a build, in a stable order."""
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).parts
        if any(part in _IGNORED or part.endswith(".egg-info") for part in rel):
            continue
        if p.is_file() and not p.name.endswith(".pyc"):
            out.append(p)
    return out


def content_hash(roots: list[Path], extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for root in roots:
        if not root.exists():
            h.update(f"missing:{root.name}\0".encode())
            continue
        for f in _files(root):
            h.update(f"{root.name}/{f.relative_to(root)}\0".encode())
            h.update(f.read_bytes())
            h.update(b"\0")
    return h.hexdigest()[:12]


def image_id(ref: str) -> str | None:
    out = docker("image", "inspect", "-f", "{{.Id}}", ref, check=False)
    return out if out.startswith("sha256:") else None


def _log_path(name: str) -> Path:
    d = config.STATE_DIR / "logs"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{name}.log"


def _build(tag: str, context: Path, log_name: str, build_args: dict[str, str], labels: dict[str, str]) -> None:
    argv = ["docker", "build", "--network", "host", "-t", tag]
    for k, v in build_args.items():
        argv += ["--build-arg", f"{k}={v}"]
    for k, v in labels.items():
        argv += ["--label", f"{k}={v}"]
    run_logged([*argv, str(context)], _log_path(log_name), timeout=1800, what=f"docker build of {tag}")


# --- base --------------------------------------------------------------------------------

def rootfs_tarball() -> Path:
    return config.cache_dir() / f"{config.DEBIAN_SUITE}-minbase.tar"


def _debootstrap(tarball: Path, progress: Progress) -> None:
    if shutil.which("debootstrap") is None:
        raise LabError("debootstrap not installed (run lab/system-deps.sh)")
    tarball.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rootfs-", dir=tarball.parent))
    try:
        rootfs = work / "rootfs"
        with progress.step(f"debootstrap {config.DEBIAN_SUITE} minbase"):
            run_logged(["debootstrap", "--variant=minbase", config.DEBIAN_SUITE, str(rootfs),
                        config.DEBIAN_MIRROR], _log_path("debootstrap"), timeout=1200,
                       what="debootstrap")
        # Smaller image, nothing stale: package caches and lists are rebuilt by apt-get update.
        for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for p in (rootfs / sub).glob("*"):
                if p.is_file():
                    p.unlink()
        tmp = tarball.with_suffix(".tar.tmp")
        run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tmp), "."], timeout=600)
        os.replace(tmp, tarball)
    finally:
        run(["rm", "-rf", "--one-file-system", str(work)], check=False, timeout=600)


def ensure_base(progress: Progress) -> str:
    if image_id(config.BASE_IMAGE):
        return config.BASE_IMAGE
    tarball = rootfs_tarball()
    if not tarball.exists():
        _debootstrap(tarball, progress)
    with progress.step(f"docker import {config.BASE_IMAGE}"):
        docker("import", "--change", "CMD [\"/bin/bash\"]", str(tarball), config.BASE_IMAGE, timeout=600)
    return config.BASE_IMAGE


# --- node --------------------------------------------------------------------------------

def node_image() -> str:
    return f"{config.NODE_IMAGE_REPO}:{content_hash([config.LAB_DIR / 'node'])}"


def ensure_node_image(progress: Progress) -> str:
    tag = node_image()
    if image_id(tag):
        return tag
    base = ensure_base(progress)
    with progress.step(f"build node image {tag}"):
        _build(tag, config.LAB_DIR / "node", "build-node", {"BASE": base}, {config.LABEL_CONTENT: tag.split(":")[1]})
    # Older node images: removed unless a node still runs one (then `up` recreates it next).
    for old in docker("images", "--format", "{{.Repository}}:{{.Tag}}", config.NODE_IMAGE_REPO).split():
        if old != tag:
            docker("rmi", old, check=False)
    return tag


# --- inner -------------------------------------------------------------------------------

def _inner_roots() -> list[Path]:
    return [config.LAB_DIR / "inner", config.LAB_DIR / "vllm_sim"]


def inner_image_tag(vllm_version: str = config.SIM_VLLM_VERSION) -> str:
    """spark-vllm-sim:lab for the default simulated vLLM, spark-vllm-sim:lab-<version> else."""
    if vllm_version == config.SIM_VLLM_VERSION:
        return config.INNER_IMAGE
    return f"{config.INNER_IMAGE}-{vllm_version}"


def inner_hash(vllm_version: str = config.SIM_VLLM_VERSION) -> str:
    return content_hash(_inner_roots(), extra=f"ray=={config.RAY_VERSION};vllm=={vllm_version}")


def _host_ca_bundle() -> Path:
    for cand in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"),
                 "/etc/ssl/certs/ca-certificates.crt"):
        if cand and Path(cand).is_file():
            return Path(cand)
    raise LabError("no CA bundle for pip inside docker build (install ca-certificates)")


def inner_image_current(vllm_version: str = config.SIM_VLLM_VERSION) -> bool:
    want = inner_hash(vllm_version)
    got = docker("image", "inspect", "-f", f'{{{{index .Config.Labels "{config.LABEL_CONTENT}"}}}}',
                 inner_image_tag(vllm_version), check=False)
    return got == want


def ensure_inner_image(progress: Progress, force: bool = False,
                       vllm_version: str = config.SIM_VLLM_VERSION) -> str:
    """Build the inner image for a simulated vLLM version (default: spark-vllm-sim:lab playing
    config.SIM_VLLM_VERSION) unless an image built from the same content exists."""
    tag = inner_image_tag(vllm_version)
    if not force and inner_image_current(vllm_version):
        return tag
    base = ensure_base(progress)
    with progress.step(f"build inner image {tag}"), tempfile.TemporaryDirectory() as ctx_s:
        ctx = Path(ctx_s)
        shutil.copy(config.LAB_DIR / "inner" / "Dockerfile", ctx / "Dockerfile")
        shutil.copy(_host_ca_bundle(), ctx / "host-ca.crt")
        sim = config.LAB_DIR / "vllm_sim"
        (ctx / "vllm_sim").mkdir()
        if sim.is_dir():
            for f in _files(sim):
                dst = ctx / "vllm_sim" / f.relative_to(sim)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, dst)
        else:
            progress.say("note: lab/vllm_sim missing: inner image gets Ray only")
        deps = ctx / "vllm_sim_deps"
        deps.mkdir()
        (deps / ".keep").touch()
        if (sim / "pyproject.toml").is_file():
            shutil.copy(sim / "pyproject.toml", deps / "pyproject.toml")
        _build(tag, ctx, "build-inner" if tag == config.INNER_IMAGE else f"build-inner-{vllm_version}",
               {"BASE": base, "RAY_VERSION": config.RAY_VERSION,
                "VLLM_SIM_VLLM_VERSION": vllm_version},
               {config.LABEL_CONTENT: inner_hash(vllm_version)})
    # The previous build's image is now dangling; drop it so rebuilds do not pile up.
    docker("image", "prune", "-f", "--filter", f"label={config.LABEL_CONTENT}", check=False)
    return tag


def gateway_hash() -> str:
    return content_hash([config.LAB_DIR / "gateway"])


def ensure_gateway_image(progress: Progress, force: bool = False) -> str:
    """spark-vllm-gateway:lab (lab/gateway), unless one built from the same files exists."""
    tag = config.GATEWAY_IMAGE
    got = docker("image", "inspect", "-f", f'{{{{index .Config.Labels "{config.LABEL_CONTENT}"}}}}',
                 tag, check=False)
    if not force and got == gateway_hash():
        return tag
    base = ensure_base(progress)
    with progress.step(f"build gateway image {tag}"), tempfile.TemporaryDirectory() as ctx_s:
        ctx = Path(ctx_s)
        for f in ("Dockerfile", "requirements.txt"):
            shutil.copy(config.LAB_DIR / "gateway" / f, ctx / f)
        shutil.copy(_host_ca_bundle(), ctx / "host-ca.crt")
        _build(tag, ctx, "build-gateway", {"BASE": base}, {config.LABEL_CONTENT: gateway_hash()})
    docker("image", "prune", "-f", "--filter", f"label={config.LABEL_CONTENT}", check=False)
    return tag


def images_present() -> bool:
    return bool(image_id(node_image())) and docker_ok("image", "inspect", config.INNER_IMAGE)
