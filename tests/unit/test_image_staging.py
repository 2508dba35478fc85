"""imageStaging copy: the copies in the graph (under mocks), the preflights that no longer pull
on the receiving nodes, the config's refusals, and the copy program's own decisions (which
layers travel, the space it needs, its progress) on files laid out as `docker save` writes
them. The lab runs it for real (tests/integration/test_image_copy.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from spark_vllm.components.render import commands as c
from spark_vllm.components.render import image_commands, preflight_commands, staging_commands
from spark_vllm.components.spec import SpecError
from tests.unit.harness import (
    CMD,
    IMAGE_ID,
    SECRET_SIG,
    SSH_KEY,
    lab_nodes,
    run,
    run_outputs,
    spec_from,
)

sys.path.insert(0, str(Path(c.__file__).resolve().parents[1] / "scripts"))
import image_copy  # noqa: E402  (scripts the head runs, imported here for their functions)
import image_layers  # noqa: E402

CONTAINERS = ("ray-head", "vllm-serve")


def graph(n: int = 2, **top: object) -> dict[str, Any]:
    return run(spec_from(lab_nodes(n), **top))


@pytest.mark.parametrize("n", [2, 4])
def test_each_other_node_gets_a_copy_from_the_head_before_the_image_check(n: int) -> None:
    top: dict[str, Any] = {"imageStaging": "copy"}
    if n == 4:
        top |= {"tensorParallelSize": 2, "pipelineParallelSize": 2}
    g = graph(n, **top)
    copies = [g[f"image-copy-node-{i}"] for i in range(2, n + 1)]
    preflights = {g[f"node-{i}-preflight"].urn for i in range(1, n + 1)}
    for i, copy in enumerate(copies, start=2):
        assert copy.type == CMD
        assert copy.plain("connection")["host"] == "10.231.0.11"  # run on the head
        assert preflights <= set(copy.dependencies)  # the head's pulled it first
        assert copy.plain("triggers") == [
            {"node": f"node-{i}", "to": f"192.168.231.{10 + i}", "image": "vllm/image:1"},
            {"liveness": f"image-copy-node-{i}-liveness-id"}]
        key, program = copy.plain("stdin").split(staging_commands.MANIFEST_SEPARATOR + "\n")
        assert key.strip() == SSH_KEY and copy.inputs["stdin"][SECRET_SIG]
        payload = json.loads(program.splitlines()[0].split(" = ", 1)[1].strip("'"))
        assert payload["node"]["ip"] == f"192.168.231.{10 + i}"
        assert program.endswith(c.script_text("image_copy.py"))
        live = g[f"image-copy-node-{i}-liveness"]
        # what the node must hold: the head's image id, as its preflight read it
        assert (live.plain("image"), live.plain("imageId"), live.plain("state")) == (
            "vllm/image:1", IMAGE_ID, "present")
    check = g["image-check"]
    assert {x.urn for x in copies} <= set(check.dependencies)
    assert check.plain("triggers")[0]["imageStaging"] == "copy"
    for name in CONTAINERS:
        # ordering only: a copy that runs again (a pruned image) restarts nothing
        linked = {u for deps in g[name].property_dependencies.values() for u in deps}
        assert not linked & {x.urn for x in copies}, name


@pytest.mark.parametrize("mode, n", [("pull", 2), ("none", 2), ("copy", 1)])
def test_no_copy_where_nothing_is_copied(mode: str, n: int) -> None:
    g = graph(n, imageStaging=mode, **({"tensorParallelSize": 1} if n == 1 else {}))
    assert not [name for name in g if name.startswith("image-copy")]
    assert "image-check" in g
    triggers = g["image-check"].plain("triggers")[0]
    assert triggers.get("imageStaging") == (None if mode == "pull" else mode)


def test_the_image_output_says_what_every_node_runs_and_what_moved() -> None:
    out = run_outputs(spec_from(lab_nodes(2), imageStaging="copy"))
    assert out["image"]["name"] == "vllm/image:1" and out["image"]["staging"] == "copy"
    assert [x.get("node") for x in out["image"]["copies"]] == [None]  # the mock prints no JSON
    assert "copies" not in run_outputs(spec_from(lab_nodes(2)))["image"]


def _preflight(node: int, **top: object) -> str:
    spec = spec_from(lab_nodes(2), **top)
    return preflight_commands.preflight_script(spec, spec.nodes[node])


def test_only_the_head_pulls_and_the_others_may_lack_the_image() -> None:
    head, other = _preflight(0, imageStaging="copy"), _preflight(1, imageStaging="copy")
    assert "docker pull --quiet" in head and "docker pull" not in other
    assert "|| image_id=" in other and 'versions="- - -"' in other
    assert "fail \"image vllm/image:1 is not on node-1" not in head  # it pulls first
    never = _preflight(0, imageStaging="copy", imagePull="never")
    assert ("image vllm/image:1 is not on node-1 (imagePull: never; pull or build it on "
            "node-1, the head (docker pull vllm/image:1)") in never
    for node in (0, 1):
        none = _preflight(node, imageStaging="none")
        assert "docker pull --quiet" not in none
        assert f"is not on node-{node + 1} (imageStaging: none, nothing fetches it" in none
    # imageStaging pull: as before
    assert _preflight(1).count("docker pull --quiet") == 1
    assert "is not on the node (imagePull: missing); load it with" in _preflight(1)


def test_a_receiving_node_without_the_image_runs_and_reports_no_versions(tmp_path: Path) -> None:
    """node-2's preflight, imageStaging copy, on a node whose docker has no such image."""
    spec = spec_from([{"name": f"node-{i}", "host": f"192.168.231.{10 + i}"} for i in (1, 2)],
                     imageStaging="copy", checkGpu=False)
    script = preflight_commands.preflight_script(spec, spec.nodes[1])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(
        '#!/bin/sh\ncase "$1 $2" in "version --format") echo 27.0 ;; "image inspect") exit 1 ;;'
        ' *) echo "unexpected docker $*" >&2; exit 9 ;; esac\n')
    (bin_dir / "ip").write_text("#!/bin/sh\necho '2: eth0 inet 192.168.231.12/24'\n")
    for tool in ("rsync", "python3"):
        (bin_dir / tool).write_text("#!/bin/sh\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.splitlines()[-1])
    assert (report["image_id"], report["ray"], report["vllm"]) == ("", "-", "-")


@pytest.mark.parametrize("top, problem", [
    ({"imageStaging": "copy", "image": "reg/vllm@sha256:" + "a" * 64},
     "imageStaging copy moves the image with docker save and load"),
    ({"imageStaging": "none", "imagePull": "always"},
     "imagePull: always pulls on every node, imageStaging: none never fetches the image"),
    ({"imageStaging": "rsync"}, "imageStaging"),
])
def test_config_that_cannot_work_is_refused_by_name(top: dict[str, Any], problem: str) -> None:
    with pytest.raises(SpecError) as err:
        spec_from(lab_nodes(2), **top)
    assert problem in str(err.value)


def test_the_gate_compares_only_the_versions_a_node_read() -> None:
    from spark_vllm.components.ray_cluster import _versions_read
    head = '{"node": "node-1", "image_id": "sha256:ab", "ray": "2.60.0"}\n'
    copied = '{"node": "node-2", "image_id": "", "ray": "-"}\n'
    assert _versions_read([head, copied]) == [head.strip()]


# --- the copy program's decisions ----------------------------------------------------------

# chain IDs as Docker 20.10's layer store names them (its layerdb: <chain>/diff, <chain>/parent)
L1 = "sha256:65def782e1341a053d93ae51a8d1e59105e2fa1c2b2e343e4e51e1b3d9f2a3bd"
L2 = "sha256:84f9ab307e6452f23ea791f2a1d46dc5b6da853b1d9ae1fd9e1ffeabf4a95b29"
L3 = "sha256:d8fb28c69d90fff203ec7eebbfdfc240b82b87ccf854f65c9b8aad3634b7c8a6"
CHAIN3 = "sha256:001d3f4bd63457e5c73f3339e5351f8468f987e4fd02a23b5e4d5f56128e32cd"


def test_chain_ids_are_dockers() -> None:
    assert image_layers.chain_ids([L1]) == [L1]
    assert image_layers.chain_ids([L1, L2, L3])[2] == CHAIN3


def _spool(tmp: Path, layout: str, sizes: list[int]) -> tuple[Path, list[str]]:
    """A spool as `docker save` writes it: legacy (<v1 id>/layer.tar) or OCI (blobs/sha256)."""
    diff_ids = ["sha256:" + f"{i:x}" * 64 for i in range(1, len(sizes) + 1)]
    spool = tmp / layout
    config = {"rootfs": {"type": "layers", "diff_ids": diff_ids}}
    if layout == "legacy":
        layers = [f"v1id{i}/layer.tar" for i in range(len(sizes))]
        cfg = "c0ffee.json"
    else:
        layers = [f"blobs/sha256/{d[7:]}" for d in diff_ids]
        cfg = "blobs/sha256/" + "c" * 64
    for path, size in zip(layers, sizes, strict=True):
        (spool / path).parent.mkdir(parents=True, exist_ok=True)
        (spool / path).write_bytes(b"x" * size)
    (spool / cfg).parent.mkdir(parents=True, exist_ok=True)
    (spool / cfg).write_text(json.dumps(config))
    (spool / "manifest.json").write_text(json.dumps(
        [{"Config": cfg, "RepoTags": ["vllm/image:1"], "Layers": layers}]))
    (spool / ".complete").write_text("")
    return spool, diff_ids


@pytest.mark.parametrize("layout", ["legacy", "oci"])
def test_only_the_layers_whose_chain_the_node_lacks_travel(tmp_path: Path, layout: str) -> None:
    spool, diff_ids = _spool(tmp_path, layout, [5000, 3000, 700])
    chains = image_layers.chain_ids(diff_ids)
    whole_files, whole, _, n, of = image_layers.plan(str(spool), set())
    assert (n, of) == (3, 3) and ".complete" not in whole_files
    # a new nightly: the node has the first two layers (as the chain below the third)
    files, sent, total, n, of = image_layers.plan(str(spool), set(chains[:2]))
    assert (n, of, total) == (1, 3, whole)
    assert sent == whole - 8000 and len(files) == len(whole_files) - 2
    assert "manifest.json" in files
    # the same layer under another base is not the node's: its chain differs
    other = image_layers.chain_ids(["sha256:" + "9" * 64, diff_ids[1]])
    assert image_layers.plan(str(spool), set(other))[3] == 3


def test_a_layer_saved_as_a_link_to_another_sends_its_target(tmp_path: Path) -> None:
    spool, diff_ids = _spool(tmp_path, "legacy", [5000, 3000])
    (spool / "v1id1/layer.tar").unlink()
    (spool / "v1id1/layer.tar").symlink_to("../v1id0/layer.tar")  # as docker save links repeats
    files = image_layers.plan(str(spool), {image_layers.chain_ids(diff_ids)[0]})[0]
    assert {"v1id0/layer.tar", "v1id1/layer.tar"} <= set(files)


def test_the_probe_reads_what_the_node_holds() -> None:
    seen = image_layers.parse_probe(
        f"id {IMAGE_ID}\nfree 1048576 /var/lib/docker\nlayers {L1} {L2} {L3} \nlayers {L2} \n")
    assert seen["id"] == IMAGE_ID and seen["free"] == 1 << 30
    assert {L1, CHAIN3, L2} <= seen["chains"]
    assert image_layers.parse_probe("id \nfree  /x\n") == {
        "id": "", "chains": set(), "free": None, "root": "/x"}


def test_a_node_without_room_is_refused_with_the_numbers() -> None:
    assert image_layers.space_problem("node-2", 3_000_000_000, "/var/lib/docker", 1_000_000_000) \
        is None
    assert image_layers.space_problem("node-2", 1_500_000_000, "/var/lib/docker", 1_000_000_000) \
        == ("node-2 has 1500 MB free on /var/lib/docker (Docker's storage), the image's missing "
            "layers need 2000 MB there (1000 MB to receive, held 2 times while docker load "
            "unpacks them): free space there (docker system prune), then run pulumi up again")
    assert image_layers.space_problem("node-2", None, "/x", 10**12) is None  # df could not say


def test_progress_says_bytes_rate_and_time_left(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(image_copy, "PROGRESS_EVERY_S", 0.05)
    monkeypatch.setattr(image_copy, "PAYLOAD_PREFIX", "[p] ")
    meter = image_copy.Meter("copying to node-2", 400 * image_copy.MB, "docker exports")
    time.sleep(0.08)
    meter.done = 100 * image_copy.MB
    time.sleep(0.1)
    meter.stop()
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("[p] copying to node-2: docker exports (")
    assert any(ln.startswith("[p] copying to node-2: 100 of 400 MB (25 %), ") and " MB/s, ETA "
               in ln for ln in lines), lines


def test_the_copy_script_ends_its_program_on_a_signal() -> None:
    script = image_commands.copy_script(spec_from(lab_nodes(2), imageStaging="copy"),
                                        spec_from(lab_nodes(2)).nodes[1])
    assert 'python3 "$work"/m.py "$work"/key > "$work"/out &' in script
    assert 'cleanup() { kill "$py"' in script
    assert "[spark-vllm] $node: image copy to node-2: $*" in script
    assert os.path.basename(image_commands.SPOOL_DIR) == "image-spool"


def test_the_pr_summary_says_which_nodes_receive_the_image_and_that_nothing_restarts() -> None:
    """A refresh saw node-2's image gone (pruned): its copy runs again, alone."""
    from spark_vllm import summary
    base = "urn:pulumi:lab::spark-vllm::spark-vllm:image:ImageStaging$"
    copy_urn = base + "command:remote:Command::image-copy-node-2"
    live_urn = base + "pulumi-python:dynamic:Resource::image-copy-node-2-liveness"
    facts = {"node": "node-2", "to": "192.168.231.12", "image": "spark-vllm-sim:lab"}

    def state(urn: str, inputs: dict[str, Any], outputs: dict[str, Any] | None = None
              ) -> dict[str, Any]:
        return {"urn": urn, "type": urn.split("$")[1].split("::")[0], "custom": True,
                "inputs": inputs, "outputs": outputs or inputs}

    steps = [
        {"op": "refresh", "urn": live_urn, "detailedDiff": None,
         "oldState": state(live_urn, {"state": "present"}, {"state": "gone"}),
         "newState": state(live_urn, {"state": "gone"})},
        {"op": "replace", "urn": live_urn, "detailedDiff": {"state": {"kind": "update-replace"}},
         "oldState": state(live_urn, {"state": "gone"}),
         "newState": state(live_urn, {"state": "present"})},
        {"op": "replace", "urn": copy_urn,
         "detailedDiff": {"triggers[1].liveness": {"kind": "update-replace"}},
         "oldState": state(copy_urn, {"triggers": [facts, {"liveness": "old"}]}),
         "newState": state(copy_urn, {"triggers": [facts, {"liveness": summary.UNKNOWN}]})},
    ]
    s = summary.summarize({"steps": steps, "config": {}})
    assert [(r.node, r.role, r.action, r.cause) for r in s.rows] == [
        ("node-2", "image copy", "replace", "the node's image was gone")]
    assert s.rows[0].consequence == summary.IMAGE_COPIED
    assert summary.headline(s) == "the head's image is copied to node-2 · Ray keeps running"
    assert summary.what_restarts(s).startswith("What restarts: Ray on no node; vLLM: no. The "
                                               "head's image copied to node-2 (only the layers")


def test_status_names_a_node_whose_image_is_not_the_stacks() -> None:
    from spark_vllm import status
    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    worker = status.ContainerView("node-2", "ray-worker", "w", "running", "cid", "", a)
    assert status.image_mismatch(a, a, [worker]) is None
    assert status.image_mismatch("", "missing", [worker]) is None  # deployed before it existed
    assert status.image_mismatch(a, "missing", [worker]) == (
        f"the tag holds no image (pruned?), the stack's is {a[:19]}")
    stale = status.ContainerView("node-2", "ray-worker", "w", "running", "cid", "", b)
    assert status.image_mismatch(a, b, [stale]) == (
        f"ray-worker runs {b[:19]}; the tag holds {b[:19]}, the stack's is {a[:19]}")
    report = status.Report("lab", "http://x:8000/v1", "m", containers=[worker], ray_ok=True,
                           vllm_state="serving", endpoint_ok=True, image=a,
                           image_mismatch={"node-2": "the tag holds no image (pruned?)"})
    text = report.text()
    assert "node-2      image       MISMATCH: the tag holds no image (pruned?)" in text
    assert "verdict: SERVING" in text and "pulumi up --refresh --stack lab copies" in text
    assert report.to_json()["image"]["mismatch"] == {"node-2": "the tag holds no image (pruned?)"}
