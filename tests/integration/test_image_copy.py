"""imageStaging copy on the real engine against a 2-node lab (issue 47).

The lab loads the simulator's image into every node; each scenario here first takes every
image of the simulator off node-2 (nothing of the stack runs there then), so the image exists
only on node-1, the head, as on a Spark pair where it was built on one node. Asserted on the
nodes: the image id node-2 holds afterwards, what Docker there holds after a refusal or an
interruption (no image under the tag, no container), what restarted, the bytes that moved."""

from __future__ import annotations

import base64
import json
import re
import threading
import time

import pytest

from lab import config
from tests.integration.engine import STACK, Lab, Run, containers, failed_lines, node_sh
from tests.integration.test_lifecycle import assert_serving, lab_identities, ok

pytestmark = pytest.mark.integration

NODES = ["node-1", "node-2"]
IMAGE = config.INNER_IMAGE
DERIVED = f"{IMAGE}-extra"  # the lab image and one more layer: a new nightly, say
COPY, LIVE = "image-copy-node-2", "image-copy-node-2-liveness"
ROLE = "image copy to node-2"  # the copy's log lines: "[spark-vllm] node-1: image copy to …"
SPOOL = f"~/.spark-vllm/image-spool/{STACK}"


def image_id(node: str, image: str = IMAGE) -> str:
    return node_sh(node, f"docker image inspect --format '{{{{.Id}}}}' {image} 2>/dev/null "
                   "|| true").strip()


def image_bytes(node: str, image: str = IMAGE) -> int:
    return int(node_sh(node, f"docker image inspect --format '{{{{.Size}}}}' {image}").strip())


def bare_node2() -> None:
    """node-2 without any image of the simulator, nor their layers."""
    assert not [c for c in containers(NODES) if c.node == "node-2"]
    node_sh("node-2", "ids=$(docker image ls -q --filter reference='spark-vllm-sim*' | sort -u); "
            "[ -z \"$ids\" ] || docker image rm -f $ids >/dev/null; docker image prune -f "
            ">/dev/null", timeout=120)
    assert image_id("node-2") == ""


def shim(node: str, path: str, text: str) -> None:
    """A stand-in at `path` on the node (/usr/local/bin comes before /usr/bin on its PATH)."""
    node_sh(node, f"echo {base64.b64encode(text.encode()).decode()} | base64 -d > {path} "
            f"&& chmod +x {path}")


def up_with_stand_ins(lab: Lab, stand_ins: dict[str, str], after: str = "") -> Run:
    """One `up` with stand-ins on node-2 (path -> text), removed after it, with `after`."""
    for path, text in stand_ins.items():
        shim("node-2", path, text)
    try:
        return lab.up()
    finally:
        node_sh("node-2", f"rm -f {' '.join(stand_ins)}; {after or 'true'}")


def copy_refused(run: Run) -> str:
    """The image copy's FAILED lines of a run that must have failed."""
    assert run.error is not None
    return " ".join(failed_lines(run, "node-1", ROLE))


def fresh(lab: Lab) -> None:
    ok(lab.destroy())
    bare_node2()


def moved(lab: Lab) -> dict:
    return json.loads(lab.command_outputs()[COPY]["stdout"].strip().splitlines()[-1])


def planned(run: Run) -> set[str]:
    return {name for name, op in run.changed().items() if op != "refresh"}


def ids() -> dict[tuple[str, str], str]:
    return {(c.node, c.role): c.id for c in containers(NODES)}


def assert_nothing_loaded_or_started() -> None:
    """After a refused or interrupted copy: no image under the tag on node-2, no container of
    the stack on any node, no spool left on the head (its lock file aside)."""
    assert image_id("node-2") == ""
    assert containers(NODES) == []
    assert node_sh("node-1", f"ls -A {SPOOL} 2>/dev/null || true").split() in ([], [".lock"])


@pytest.fixture(scope="module")
def copying(lab2: Lab) -> Lab:
    lab2.set("imageStaging", "copy")
    return lab2


def test_an_image_only_on_the_head_is_copied_and_serves_and_a_second_up_moves_nothing(
        copying: Lab) -> None:
    lab = copying
    fresh(lab)
    head = image_id("node-1")
    run = ok(lab.up())
    out = "\n".join(run.output)
    assert image_id("node-2") == head
    done = {s.name: s.t for s in run.steps if s.phase == "done" and s.op == "create"}
    start = {s.name: s.t for s in run.steps if s.phase == "pre" and s.op == "create"}
    assert done[COPY] <= start["image-check"] and done["image-check"] <= start["ray-head"]
    copy = moved(lab)
    whole = image_bytes("node-1")
    assert copy["image"] == head and copy["layers"].split(" of ")[0] == copy["layers"].split(
        " of ")[1]
    assert whole * 0.95 <= copy["sent"] <= whole * 1.1, (copy, whole)
    assert f"copying {IMAGE} ({head[:19]}) to node-2 (root@" in out
    assert lab.outputs()["image"]["copies"][0]["sent"] == copy["sent"]
    assert_serving(lab, lab_identities())
    print(f"image copy over SSH: {copy['sent'] / 1e6:.0f} MB in {copy['seconds']} s")
    before = ids()
    again = ok(lab.up())
    assert planned(again) == set() and ids() == before


def test_a_pruned_image_is_seen_by_refresh_and_copied_again_restarting_nothing(
        copying: Lab) -> None:
    lab = copying
    before = ids()
    assert image_id("node-2")
    node_sh("node-2", f"docker image rm -f {IMAGE} >/dev/null")  # untagged; its containers run
    assert image_id("node-2") == ""
    preview = ok(lab.preview(refresh=True))
    assert planned(preview) == {COPY, LIVE}, preview.changed()
    run = ok(lab.up(refresh=True))
    assert planned(run) == {COPY, LIVE}
    assert image_id("node-2") == image_id("node-1") and ids() == before
    # every layer was there (the containers hold them): the config and the manifest moved
    assert moved(lab)["sent"] < 1_000_000, moved(lab)


def test_a_new_image_sharing_all_but_one_layer_moves_that_layer(copying: Lab) -> None:
    lab = copying
    node_sh("node-1", f"docker rm -f extra >/dev/null 2>&1; docker run --name extra --entrypoint "
            f"sh {IMAGE} -c 'head -c 8000000 /dev/urandom > /extra' && docker commit extra "
            f"{DERIVED} >/dev/null && docker rm extra >/dev/null", timeout=120)
    try:
        lab.set("image", DERIVED)
        ok(lab.up())
        copy, whole = moved(lab), image_bytes("node-1", DERIVED)
        assert image_id("node-2", DERIVED) == image_id("node-1", DERIVED)
        assert copy["layers"].startswith("1 of ")
        assert 8_000_000 <= copy["sent"] < 0.05 * whole, (copy, whole)
        assert_serving(lab, lab_identities())
        print(f"layer-sharing copy: {copy['sent'] / 1e6:.1f} MB of {whole / 1e6:.0f} MB "
              f"({100 * copy['sent'] / whole:.1f} %)")
    finally:
        lab.set("image", IMAGE)


def test_a_node_without_room_is_refused_with_the_numbers_before_a_byte_moves(
        copying: Lab) -> None:
    lab = copying
    fresh(lab)
    # df on node-2 says 1000 KiB free (Docker's storage itself is the lab machine's disk)
    run = up_with_stand_ins(lab, {"/usr/local/bin/df": (
        "#!/bin/sh\necho 'Filesystem 1024-blocks Used Available Capacity Mounted on'\n"
        "echo 'overlay 2000 1000 1000 50% /'\n")})
    said = copy_refused(run)
    assert "node-2 has 1 MB free on /var/lib/docker (Docker's storage), the image's missing " \
           "layers need" in said, run.failure()
    assert_nothing_loaded_or_started()


def test_a_docker_that_cannot_load_is_named_with_its_own_error(copying: Lab) -> None:
    lab = copying
    fresh(lab)
    error = "Error processing tar file(exit status 1): write /usr/x: no space left on device"
    run = up_with_stand_ins(lab, {"/usr/local/bin/docker": (
        "#!/bin/sh\nif [ \"$1\" = load ]; then cat >/dev/null; "
        f"echo '{error}' >&2; exit 1; fi\nexec /usr/bin/docker \"$@\"\n")})
    said = copy_refused(run)
    assert f"node-2's Docker cannot load the image (docker load, exit 1), twice: {error}" \
        in said, run.failure()
    assert_nothing_loaded_or_started()


def test_an_interrupted_copy_leaves_nothing_half_loaded_and_the_next_up_completes(
        copying: Lab) -> None:
    """The up is cut mid-copy as Ctrl-C twice or a lost session cuts it: the copy's shell on
    the head is told to stop (its trap ends the program, which ends its ssh; node-2's docker
    load sees its stream end). The next up, over raw TCP this time, completes it."""
    lab = copying
    fresh(lab)
    result: list[Run] = []
    up = threading.Thread(target=lambda: result.append(lab.up()), daemon=True)
    up.start()
    deadline = time.monotonic() + 180
    while not node_sh("node-2", "pgrep -f '^docker load' || true").strip():
        assert time.monotonic() < deadline and up.is_alive(), "no docker load on node-2"
        time.sleep(0.2)
    time.sleep(1)  # some layers in
    node_sh("node-1", "pkill -TERM -f 'python3 .*/m.py .*/key$'")
    up.join(300)
    assert result and result[0].error is not None
    assert_nothing_loaded_or_started()
    lab.set("copyTransport", "tcp")
    try:
        run = ok(lab.up())
    finally:
        lab.set("copyTransport", "ssh")
    assert "over raw TCP (unencrypted)" in "\n".join(run.output)
    assert image_id("node-2") == image_id("node-1")
    assert_serving(lab, lab_identities())


def test_a_stream_damaged_on_the_way_is_refused_by_docker_and_sent_again(copying: Lab) -> None:
    lab = copying
    fresh(lab)
    # once: one byte flipped 50 MB into the stream (inside a layer: Docker checks its hash)
    flip = ("import sys\ni, o = sys.stdin.buffer, sys.stdout.buffer\no.write(i.read(50000000))\n"
            "b = i.read(1)\no.write(bytes([b[0] ^ 255]) if b else b)\n"
            "for c in iter(lambda: i.read(1 << 20), b''):\n    o.write(c)\n")
    node_sh("node-2", "touch /tmp/flip-once")
    run = ok(up_with_stand_ins(lab, {
        "/tmp/flip.py": flip,
        "/usr/local/bin/docker": "#!/bin/sh\nif [ \"$1\" = load ] && rm /tmp/flip-once 2>/dev/null; "
                                 "then python3 /tmp/flip.py | /usr/bin/docker load; exit $?; fi\n"
                                 "exec /usr/bin/docker \"$@\"\n"}, after="rm -f /tmp/flip-once"))
    out = "\n".join(run.output)
    assert "node-2's Docker refused the image (" in out and "): sending it again" in out, \
        out[-3000:]
    assert image_id("node-2") == image_id("node-1")
    assert moved(lab)["sent"] > 2 * image_bytes("node-1") * 0.9  # twice the image


def test_an_image_that_arrives_as_another_id_is_removed_and_sent_again(copying: Lab) -> None:
    lab = copying
    fresh(lab)
    # once: docker load, then the tag moved to another image (an empty one, imported)
    node_sh("node-2", "touch /tmp/other-once")
    head = image_id("node-1")
    run = ok(up_with_stand_ins(lab, {"/usr/local/bin/docker": (
        "#!/bin/sh\nif [ \"$1\" = load ] && rm /tmp/other-once 2>/dev/null; then "
        "/usr/bin/docker load || exit $?\n  tar cf - -T /dev/null | /usr/bin/docker import - "
        f"other:x >/dev/null\n  /usr/bin/docker tag other:x {IMAGE}\n  exit 0\nfi\n"
        "exec /usr/bin/docker \"$@\"\n")},
        after="rm -f /tmp/other-once; docker image rm -f other:x >/dev/null 2>&1 || true"))
    out = "\n".join(run.output)
    said = re.search(r"the image arrived on node-2 as (sha256:[0-9a-f]{64}), not the head's "
                     r"(sha256:[0-9a-f]{64}): removed, sending it again", out)
    assert said and said.group(2) == head and said.group(1) != head, out[-3000:]
    # the other image is gone from node-2 (it held only the tag the copy removed)
    assert node_sh("node-2", f"docker image inspect {said.group(1)} >/dev/null 2>&1 && echo "
                   "there || echo gone").strip() == "gone"
    assert image_id("node-2") == image_id("node-1")
    assert_serving(lab, lab_identities())


def test_an_image_on_no_node_with_image_pull_never_names_the_head_and_the_fix(
        copying: Lab) -> None:
    lab = copying
    before = ids()
    lab.set_all({"image": "spark-vllm-sim:absent", "imagePull": "never"})
    try:
        run = lab.up()
    finally:
        lab.set("image", IMAGE)
    assert run.error is not None
    said = " ".join(failed_lines(run, "node-1", "preflight"))
    assert ("image spark-vllm-sim:absent is not on node-1 (imagePull: never; pull or build it "
            "on node-1, the head (docker pull spark-vllm-sim:absent)") in said, run.failure()
    assert ids() == before and image_id("node-2", "spark-vllm-sim:absent") == ""
