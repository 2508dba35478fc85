"""Model staging and image consistency on the real engine against a 2-node lab.

The lab's node-1 holds a generated model in huggingface_hub's cache layout (lab/model.py, a few
GB of valid safetensors shards that vllm-sim checks as vLLM would); node-2 starts without it.
Asserted on the nodes: the blobs' sha256 on node-2 equal node-1's, what a refresh sees when a
shard is cut short, which containers kept their docker ids, what runs after a refusal."""

from __future__ import annotations

import json
import re

import pytest

from lab import cluster, hf_endpoint, model
from tests.integration.engine import STACK, Lab, Run, containers, failed_lines, node_sh
from tests.integration.test_lifecycle import assert_serving, lab_identities, ok

pytestmark = pytest.mark.integration

NODES = ["node-1", "node-2"]
HF = "/root/.cache/huggingface"
MODEL = "Qwen/Qwen3.5-122B-A10B-FP8"  # the lab stack's model (lab/stackfile.py)
OTHER = "lab/other-model"  # a second generated model, for the model change
COPY, COPY_LIVE = "model-copy-node-2", "model-copy-node-2-liveness"
RAY = {("node-1", "ray-head"), ("node-2", "ray-worker")}


def blobs(node: str, repo: str = MODEL) -> dict[str, tuple[str, str]]:
    """The current snapshot's files (refs/main) -> (their blob's name, sha256 of the content),
    as the node holds them."""
    rd = f"{HF}/hub/models--{repo.replace('/', '--')}"
    out = node_sh(node, f'cd {rd}/snapshots/$(cat {rd}/refs/main) && for f in *; do '
                  'echo "$f $(basename "$(readlink -f "$f")") $(sha256sum < "$f" | cut -c1-64)"; '
                  "done", timeout=120)
    return {f: (blob, digest) for f, blob, digest in (ln.split() for ln in out.splitlines())}


def largest_shard(node: str, repo: str = MODEL) -> tuple[str, int]:
    out = node_sh(node, f"cd {HF}/hub/models--{repo.replace('/', '--')}/snapshots/*/ && "
                  "stat -L -c '%s %n' *.safetensors | sort -n | tail -1")
    size, name = out.split()
    return name, int(size)


def ids() -> dict[tuple[str, str], str]:
    found = containers(NODES)
    assert all(c.running for c in found), found
    return {(c.node, c.role): c.id for c in found}


def planned(run: Run) -> set[str]:
    """What a run replaces, creates or deletes (a refresh's reads aside)."""
    return {name for name, op in run.changed().items() if op != "refresh"}


def copied(lab: Lab) -> dict:
    return json.loads(lab.command_outputs()[COPY]["stdout"])


@pytest.fixture(scope="module")
def staged(lab2: Lab) -> Lab:
    """First `pulumi up` with node-2 bare: the model is staged there, then everything starts."""
    ok(lab2.destroy())  # from nothing, whatever ran before
    node_sh("node-2", f"rm -rf {HF}/hub {HF}/spark-vllm")
    head = blobs("node-1")
    run = ok(lab2.up())
    # order: image check, the head's staging, the memory check, then Ray (while the copy
    # runs: Ray's containers read no weights), and vLLM once the copy is done
    done = {s.name: s.t for s in run.steps if s.phase == "done" and s.op == "create"}
    start = {s.name: s.t for s in run.steps if s.phase == "pre" and s.op == "create"}
    assert done["image-check"] <= start["model-stage"]
    assert done["model-stage"] <= start[COPY] and done["model-stage"] <= start["memory-check"]
    assert done["memory-check"] <= start["ray-head"] and done[COPY] <= start["vllm-serve"]
    assert blobs("node-2") == head
    assert all(blob == digest for f, (blob, digest) in head.items() if f.endswith(".safetensors"))
    summary = lab2.outputs()["model"]
    assert (summary["model"], summary["files"]) == (MODEL, len(head))
    copy = copied(lab2)
    assert copy["missing"] == summary["bytes"] <= copy["sent"] < summary["bytes"] * 1.01
    text = "\n".join(run.output)
    assert f"copying {summary['bytes'] // 1_000_000} MB of {MODEL} to node-2 (root@{cluster.find_node('node-2').fabric_ip})" \
        in text, text[-3000:]
    assert_serving(lab2, lab_identities())
    # every container runs offline: nothing may fetch weights on its own
    env = node_sh("node-2", f"docker inspect --format '{{{{json .Config.Env}}}}' "
                  f"spark-vllm-{STACK}-ray-worker")
    assert "HF_HUB_OFFLINE=1" in json.loads(env)
    return lab2


def test_first_up_stages_the_model_to_every_node_and_serves(staged: Lab) -> None:
    # vllm-sim's rank on node-2 read the shards there (a missing one would have failed it)
    logs = node_sh("node-1", f"docker logs spark-vllm-{STACK}-vllm 2>&1")
    assert "safetensors" in logs.lower(), logs[-2000:]


def test_a_no_op_up_stages_nothing(staged: Lab) -> None:
    run = ok(staged.up())
    assert run.changed() == {}


def test_a_short_shard_on_the_worker_is_seen_and_copied_again_restarting_nothing(
        staged: Lab) -> None:
    lab = staged
    before = ids()
    name, size = largest_shard("node-2")
    path = f"{HF}/hub/models--{MODEL.replace('/', '--')}/snapshots/*/{name}"
    node_sh("node-2", f"truncate -s {size // 3} $(readlink -f {path})")
    preview = ok(lab.preview(refresh=True))
    text = "\n".join(preview.output)
    assert f'"complete" => "incomplete: {name} is {size // 3} bytes, not {size}"' in text, text
    assert planned(preview) == {COPY_LIVE, COPY}, preview.changed()
    run = ok(lab.up(refresh=True))
    assert planned(run) == {COPY_LIVE, COPY}, run.changed()
    assert blobs("node-2") == blobs("node-1")
    # resumed: only what was missing travelled (rsync --append-verify), nothing restarted
    copy = copied(lab)
    assert copy["missing"] == size - size // 3 <= copy["sent"] < copy["missing"] + 1_000_000
    assert ids() == before
    assert_serving(lab, lab_identities())


CACHE = f"/root/.cache/spark-vllm-compile/{STACK}"  # compileCache's default: beside hfCache


def rank_dirs(node: str) -> list[str]:
    out = node_sh(node, f"find {CACHE}/vllm/torch_compile_cache -mindepth 2 -maxdepth 2 "
                  "-name 'rank_*' 2>/dev/null | sort", check=False)
    return out.split()


def test_a_ray_container_replacement_starts_vllm_warm_from_the_nodes_compile_cache(
        staged: Lab) -> None:
    """vllm-sim's ranks compile (VLLM_SIM_COMPILE_S) into VLLM_CACHE_ROOT as vLLM does: each
    node keeps its rank's artefacts in its compileCache, and an env change, which replaces
    every Ray container and vLLM, starts the new ranks from them."""
    lab = staged
    assert rank_dirs("node-1") and rank_dirs("node-2")  # rank 0 on the head, rank 1 on node-2
    env = lab.get("env") or {}
    try:
        lab.set("env", {**env, "NCCL_DEBUG": "TRACE"})
        run = ok(lab.up())
        assert {"ray-head", "ray-worker-node-2", "vllm-serve"} <= planned(run)
        text = "\n".join(run.output)
        for node in NODES:
            assert re.search(rf"{node}: ray-(head|worker): compile cache {CACHE}: \d+ KiB "
                             r"\([1-9]\d* compiled rank dirs\)", text), text[-3000:]
            role = "ray-head" if node == "node-1" else "ray-worker"
            mounts = json.loads(node_sh(node, "docker inspect --format '{{json .Mounts}}' "
                                        f"spark-vllm-{STACK}-{role}"))
            assert {"Source": CACHE, "Destination": "/spark-vllm-cache"}.items() <= next(
                m for m in mounts if m["Destination"] == "/spark-vllm-cache").items()
        logs = node_sh("node-1", f"docker logs spark-vllm-{STACK}-vllm 2>&1")
        assert "Directly load the compiled graph(s)" in logs, logs[-3000:]
        assert "Compiling a graph" not in logs
        assert_serving(lab, lab_identities())
    finally:
        lab.set("env", env)
        ok(lab.up())  # back as the module's other tests expect it


def test_a_corrupt_shard_on_the_worker_is_seen_hashed_and_sent_again(staged: Lab) -> None:
    """One byte flipped in a shard on node-2, the size unchanged: the read-time check (stat
    only) sees the blob written since it was verified, the copy hashes it, drops it and sends
    it again; nothing restarts."""
    lab = staged
    before = ids()
    name, size = largest_shard("node-2")
    path = f"$(readlink -f {HF}/hub/models--{MODEL.replace('/', '--')}/snapshots/*/{name})"
    node_sh("node-2", f"printf '\\377' | dd of={path} bs=1 seek=4096 count=1 conv=notrunc "
            "2>/dev/null")
    assert blobs("node-2")[name] != blobs("node-1")[name]
    preview = ok(lab.preview(refresh=True))
    text = "\n".join(preview.output)
    assert f"incomplete: {name} was written since it was verified" in text, text[-3000:]
    run = ok(lab.up(refresh=True))
    assert planned(run) == {COPY_LIVE, COPY}, run.changed()
    assert "does not match its hash: sending it again" in "\n".join(run.output)
    assert blobs("node-2") == blobs("node-1")
    copy = copied(lab)
    assert copy["missing"] == size <= copy["sent"] < size + 1_000_000
    assert ids() == before
    assert_serving(lab, lab_identities())


def test_the_tcp_copy_survives_an_interruption_and_resumes(staged: Lab) -> None:
    """copyTransport tcp: the head's sender killed mid-copy (a lost link, a crash) fails the
    copy before vLLM starts (Ray may be up: it starts beside the copy) and leaves a partial
    blob and no receiver on node-2; the next `up` resumes from the partial, every blob hashed
    on arrival, and keeps the Ray containers the failed one started."""
    import threading
    import time

    lab = staged
    lab.set("copyTransport", "tcp")
    try:
        ok(lab.destroy())
        node_sh("node-2", f"rm -rf {HF}/hub {HF}/spark-vllm")
        killed: list[int] = []

        def kill_when_partial() -> None:
            end = time.monotonic() + 180
            while time.monotonic() < end:
                out = node_sh("node-2", f"find {HF}/hub -name '*.spark-vllm-partial' -size +20M "
                              "2>/dev/null | head -1", check=False)
                if out.strip():
                    # the sender alone (the copy's script, whose text names it, lives on)
                    node_sh("node-1", "pkill -KILL -f '^python3 /tmp/[^ ]*/m[.]py push-tcp' "
                            "|| true")
                    killed.append(1)
                    return
                time.sleep(0.05)

        # the head sends at 50 MB/s while the killer watches: unthrottled, the stack's model
        # (512 MiB) crosses the lab's fabric in about a second, before a poll on a busy machine
        # sees a partial; throttled, each shard is a partial past 20 MB for seconds
        cluster.throttle_fabric("node-1", "400mbit")
        t = threading.Thread(target=kill_when_partial)
        t.start()
        try:
            failed = lab.up()
            t.join()
        finally:
            cluster.unthrottle_fabric("node-1")
        assert killed and failed.error is not None, failed.error
        said = failed_lines(failed, "node-1", "model copy to node-2")  # not the script's text
        assert said and "the copy to node-2" in said[0], failed.failure()
        # nothing half-done: no vLLM, only Ray containers that are in the state, a partial
        # kept for the resume, and the receiver gone from node-2 (its connections closed
        # with the sender)
        ray_left = {c.id for c in containers(NODES)}
        assert all(c.role.startswith("ray-") for c in containers(NODES)), containers(NODES)
        in_state = {o["stdout"].strip() for o in lab.command_outputs().values()
                    if o.get("stdout")}
        assert ray_left <= in_state, (ray_left, in_state)
        partial = node_sh("node-2", f"find {HF}/hub -name '*.spark-vllm-partial' -printf '%s\\n'")
        have = sum(int(x) for x in partial.split())
        assert have > 20_000_000
        time.sleep(2)
        assert node_sh("node-2", "pgrep -f '[r]ecv /root' || true").strip() == ""
        run = ok(lab.up())
        assert ray_left <= {c.id for c in containers(NODES)}  # what Ray started stayed
        assert "raw TCP (unencrypted) stream(s)" in "\n".join(run.output)
        total = lab.outputs()["model"]["bytes"]
        copy = copied(lab)
        assert copy["sent"] < total  # resumed: what node-2 had did not travel again
        assert blobs("node-2") == blobs("node-1")
        assert node_sh("node-2", f"find {HF}/hub -name '*.spark-vllm-partial'").strip() == ""
        assert_serving(lab, lab_identities())
    finally:
        lab.set("copyTransport", "ssh")


def test_two_nodes_with_different_images_under_one_tag_are_refused_with_a_table(
        staged: Lab) -> None:
    lab = staged
    ok(lab.destroy())
    image = lab.get("image")
    node_sh("node-2", f"docker tag {image} {image}-orig && docker create --name retag {image} "
            f">/dev/null && docker commit retag {image} >/dev/null && docker rm retag >/dev/null")
    try:
        ids_now = {n: node_sh(n, f"docker image inspect --format '{{{{.Id}}}}' {image}").strip()
                   for n in NODES}
        assert ids_now["node-1"] != ids_now["node-2"]
        run = lab.up()
        assert run.error is not None
        table = [f"image {image} is not the same on every node (same tag, different content):",
                 "  node    image id", f"  node-1  {ids_now['node-1']}",
                 f"  node-2  {ids_now['node-2']}"]
        said = [ln.strip() for ln in run.error.splitlines()]  # Pulumi indents diagnostics
        start = said.index(table[0]) if table[0] in said else -1
        assert said[start:start + len(table)] == [t.strip() for t in table], run.error[-3000:]
        assert run.seconds < 30
        # refused before anything: no container on any node, none in the state
        assert containers(NODES) == []
        assert not [n for n in lab.command_outputs() if n.startswith(("ray-", "vllm-", "model-"))]
    finally:
        node_sh("node-2", f"docker tag {image}-orig {image} && docker rmi {image}-orig >/dev/null"
                " && docker image prune -f >/dev/null")
    # the node fixed, a plain `up` goes through (the check asks the nodes again)
    ok(lab.up())
    assert_serving(lab, lab_identities())


def test_a_model_change_stages_the_new_model_and_reloads_vllm_only(staged: Lab) -> None:
    lab = staged
    head = next(n for n in cluster.info().nodes if n.name == "node-1")
    model.ensure(head, repo=OTHER, size=256 << 20, shards=2)
    before = ids()
    lab.set("model", OTHER)
    try:
        preview = ok(lab.preview())
        planned = preview.changed()
        assert all("replace" in planned.get(k, "") for k in ("model-stage", COPY, "vllm-serve")
                   ), planned
        assert not {"ray-head", "ray-worker-node-2", "ray-gate"} & set(planned), planned
        ok(lab.up())
        after = ids()
        assert {k: after[k] for k in RAY} == {k: before[k] for k in RAY}  # Ray kept
        assert after[("node-1", "vllm")] != before[("node-1", "vllm")]
        assert blobs("node-2", OTHER) == blobs("node-1", OTHER)
        assert lab.outputs()["model"]["model"] == OTHER
        assert_serving(lab, lab_identities())
    finally:
        lab.set("model", MODEL)


DOWNLOAD = "lab/download-model"  # served by a lab-local Hub endpoint, downloaded by the stage
MIRROR = "/srv/hf-mirror"  # the endpoint's source: a generated model in HF cache layout
HUB_PORT = 8765


def test_a_missing_model_is_downloaded_once_on_the_head_through_hf_endpoint(
        staged: Lab) -> None:
    """modelStaging: download with `HF_ENDPOINT` pointing at lab/hf_endpoint.py inside node-1
    (stdlib; the image's real huggingface_hub 1.33.0 talks to it as to huggingface.co): the
    stage downloads into the head's hfCache, the copy takes it to node-2, vLLM serves it."""
    lab = staged
    head = next(n for n in cluster.info().nodes if n.name == "node-1")
    rd = f"models--{DOWNLOAD.replace('/', '--')}"
    for node in NODES:
        node_sh(node, f"rm -rf {HF}/hub/{rd} {HF}/spark-vllm/manifests/{rd}@*")
    model.ensure(head, repo=DOWNLOAD, size=64 << 20, shards=2, hf_home=MIRROR)
    ssh_prefix = cluster.ssh_argv("node-1")
    hf_endpoint.start_in_node(ssh_prefix, MIRROR, HUB_PORT)
    env = lab.get("env")
    try:
        lab.set("model", DOWNLOAD)
        lab.set("env", {**env, "HF_ENDPOINT": f"http://127.0.0.1:{HUB_PORT}"})
        run = ok(lab.up())
        text = "\n".join(run.output)
        assert f"downloading {DOWNLOAD} (main) into {HF}" in text, text[-3000:]
        source = node_sh("node-1", f"cd {MIRROR}/hub/{rd}/blobs && sha256sum * | sort")
        for node in NODES:  # downloaded on the head, copied to node-2: byte for byte the source
            assert node_sh(node, f"cd {HF}/hub/{rd}/blobs && sha256sum * | sort") == source, node
        assert lab.outputs()["model"]["model"] == DOWNLOAD
        assert_serving(lab, lab_identities())
    finally:
        hf_endpoint.stop_in_node(ssh_prefix, HUB_PORT)
        lab.set("model", MODEL)
        lab.set("env", env)
