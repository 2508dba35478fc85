"""The staging and image check in the graph (under mocks): where they sit in the order, what
reaches a node's stdin (secrets wrapped), what a diff shows, and what restarts for them."""

from __future__ import annotations

import json
import subprocess

import pytest

from spark_vllm.components.render import commands as c
from spark_vllm.components.render import staging_commands
from tests.unit.harness import (
    CMD,
    HF_TOKEN,
    IMAGE_ID,
    SECRET_SIG,
    SSH_KEY,
    TEST_HOST_KEY,
    lab_nodes,
    run,
    spec_from,
)

CONTAINERS = ("ray-head", "vllm-serve")


def graph(n: int = 2, **top: object):  # type: ignore[no-untyped-def]
    return run(spec_from(lab_nodes(n), **top))


@pytest.mark.parametrize("n", [1, 2, 4])
def test_image_check_then_staging_then_every_container(n: int) -> None:
    g = graph(n)
    check, stage = g["image-check"], g["model-stage"]
    copies = [g[f"model-copy-node-{i}"] for i in range(2, n + 1)]
    assert {g[f"node-{i}-preflight"].urn for i in range(1, n + 1)} <= set(check.dependencies)
    assert check.urn in stage.dependencies
    for i, copy in enumerate(copies, start=2):
        assert stage.urn in copy.dependencies
        assert g[f"node-{i}-preflight"].urn in copy.dependencies
    ray = ["ray-head", *(f"ray-worker-node-{i}" for i in range(2, n + 1))]
    for name in ray:
        # Ray's containers need the image and the admission, not the copies: they start while
        # the weights are copied to the other nodes
        assert {check.urn, stage.urn} <= set(g[name].dependencies)
        assert not {x.urn for x in copies} & set(g[name].dependencies), name
    # vLLM, whose ranks read the weights on every node, waits for every copy
    assert {x.urn for x in copies} <= set(g["vllm-serve"].dependencies)
    for name in [*ray, "vllm-serve"]:
        # ordering only: staging again (a shard re-copied) restarts no container
        linked = {u for deps in g[name].property_dependencies.values() for u in deps}
        assert not linked & {check.urn, stage.urn, *(x.urn for x in copies)}, name


def test_copies_carry_the_key_wrapped_and_name_what_they_copy() -> None:
    g = graph(2)
    copy = g["model-copy-node-2"]
    assert copy.inputs["stdin"][SECRET_SIG]
    key, helper = copy.plain("stdin").split(staging_commands.MANIFEST_SEPARATOR + "\n")
    assert key.strip() == SSH_KEY and helper == c.script_text("model_manifest.py")
    facts, links = copy.plain("triggers")
    assert facts == {"node": "node-2", "to": "192.168.231.12", "model": "org/model",
                     "revision": "main", "hfCache": "/root/.cache/huggingface"}
    assert links == {"headCopy": "model-stage-liveness-id",
                     "liveness": "model-copy-node-2-liveness-id"}
    # nothing of the staging's output reaches the copy: staging again copies nothing
    assert g["model-stage"].urn not in {u for deps in copy.property_dependencies.values()
                                        for u in deps}
    # the copy goes to the node's fabric identity, from the head
    assert "dest=root@192.168.231.12" in copy.plain("create")
    assert copy.plain("connection")["host"] == "10.231.0.11"
    live = g["model-copy-node-2-liveness"]
    assert (live.plain("node"), live.plain("commit"), live.plain("state")) == (
        "node-2", "main", "complete")
    stage = g["model-stage"]
    assert f"HF_TOKEN={HF_TOKEN}" in stage.plain("stdin") and stage.inputs["stdin"][SECRET_SIG]
    assert g["model-stage-liveness"].plain("commit") == "main"  # the head's check reads refs/


def test_staged_containers_run_offline_and_unstaged_ones_as_before() -> None:
    staged = graph(2)
    assert staged["ray-worker-node-2"].plain("triggers")[0]["env"]["HF_HUB_OFFLINE"] == "1"
    plain = graph(2, modelStaging="none")
    assert not any(name.startswith("model-") for name in plain)
    assert "HF_HUB_OFFLINE" not in plain["ray-worker-node-2"].plain("triggers")[0]["env"]
    assert "image-check" in plain  # one image everywhere is checked either way
    # a user's own HF_HUB_OFFLINE is theirs only while the program does not stage
    assert graph(2, modelStaging="none", env={"HF_HUB_OFFLINE": "1"})


def test_only_the_hubs_settings_reach_the_download_and_an_env_change_stages_nothing() -> None:
    env = {"NCCL_DEBUG": "INFO", "HF_ENDPOINT": "http://mirror:8080", "HTTPS_PROXY": "http://p:3128"}
    stage = graph(2, env=env)["model-stage"]
    assert stage.plain("triggers")[0]["downloadEnv"] == {
        "HF_ENDPOINT": "http://mirror:8080", "HTTPS_PROXY": "http://p:3128"}
    assert "NCCL_DEBUG" not in stage.plain("create")
    quiet = {**env, "NCCL_DEBUG": "WARN"}
    for name in ("model-stage", "model-copy-node-2", "image-check"):
        a, b = graph(2, env=env)[name], graph(2, env=quiet)[name]
        assert (a.plain("create"), a.plain("triggers")) == (b.plain("create"), b.plain("triggers"))
    # copy mode downloads nothing: neither the image nor the env is its business
    assert "downloadEnv" not in graph(2, modelStaging="copy")["model-stage"].plain("triggers")[0]


def test_a_pinned_digest_is_checked_by_every_container_on_its_node() -> None:
    g = graph(2, imageDigest=IMAGE_ID)
    for name in ("ray-head", "ray-worker-node-2", "vllm-serve"):
        assert f"is not imageDigest {IMAGE_ID}" in g[name].plain("create"), name
    assert "imageDigest" not in graph(2)["ray-head"].plain("create")


def test_a_revision_reaches_vllm_and_its_diff() -> None:
    g = graph(2, modelRevision="v2.1")
    serve = g["vllm-serve"]
    assert serve.plain("triggers")[0]["modelRevision"] == "v2.1"
    assert "--revision v2.1" in serve.plain("create")
    assert g["model-stage"].plain("triggers")[0]["revision"] == "v2.1"
    assert "modelRevision" not in graph(2)["vllm-serve"].plain("triggers")[0]


def test_image_check_names_what_it_compares_and_asks_the_nodes_itself() -> None:
    g = graph(2, imageDigest=IMAGE_ID)
    check = g["image-check"]
    assert check.plain("triggers") == [{"image": "vllm/image:1", "imagePull": "missing",
                                        "imageDigest": IMAGE_ID, "nodes": ["node-1", "node-2"]}]
    # not on the preflights' outputs: a node added would make every id unknown in a preview
    assert not check.property_dependencies.get("triggers")
    key, program = check.plain("stdin").split(staging_commands.MANIFEST_SEPARATOR + "\n")
    assert key.strip() == SSH_KEY and check.inputs["stdin"][SECRET_SIG]
    assert program == f"PAYLOAD = {staging_commands.image_check_payload(spec_from(lab_nodes(2), imageDigest=IMAGE_ID))!r}\n" + c.script_text("image_check.py")
    assert json.loads(staging_commands.image_check_payload(spec_from(lab_nodes(2))))["nodes"][1] == {
        "name": "node-2", "ip": "192.168.231.12", "user": "root", "port": 22,
        "hostKey": TEST_HOST_KEY}
    # a pinned digest restarts the containers when it changes (the content changed)
    assert g["ray-head"].plain("triggers")[0]["imageDigest"] == IMAGE_ID
    assert "imageDigest" not in graph(2)["ray-head"].plain("triggers")[0]


A, B, C = ("sha256:" + x * 64 for x in "abc")
# docker on the head and on each node (by the address ssh is given), as the check asks them
FAKE_SSH = """#!/bin/sh
for a; do last=$a; done
for a; do case "$a" in *@*) dest=${a#*@} ;; esac; done
case "$dest" in
  192.168.231.12) [ -n "$NODE2" ] && echo "$NODE2" || { echo "docker: no such image" >&2; exit 1; } ;;
  192.168.231.13) echo "$NODE3" ;;
  192.168.231.14) echo "ssh: connect to host $dest port 22: No route to host" >&2; exit 255 ;;
  *) echo "ssh: connect to host $dest port 22: No route to host" >&2; exit 255 ;;
esac
"""


def _verdict(tmp_path, ids: list[str], **top: object) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ssh").write_text(FAKE_SSH)
    (bin_dir / "docker").write_text('#!/bin/sh\necho "$NODE1"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    spec = spec_from(lab_nodes(len(ids)), **top)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path),
           **{f"NODE{i}": v for i, v in enumerate(ids, start=1)}}
    return subprocess.run(["sh", "-c", staging_commands.image_check_script(spec)], capture_output=True,
                          text=True, input=staging_commands.image_check_stdin(spec, SSH_KEY), env=env,
                          timeout=30)


def test_one_image_everywhere_passes_with_its_id(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = _verdict(tmp_path, [A, A])
    assert (out.returncode, out.stdout) == (0, A + "\n"), out.stderr
    assert "vllm/image:1 is " + A + " on all 2 node(s)" in out.stderr


def test_one_tag_two_contents_is_refused_with_a_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = _verdict(tmp_path, [A, B, A], tensorParallelSize=3)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.splitlines()[:5] == [
        "image vllm/image:1 is not the same on every node (same tag, different content):",
        "  node    image id", f"  node-1  {A}", f"  node-2  {B}", f"  node-3  {A}"]
    # the key was only ever in a 0600 file that is gone
    assert SSH_KEY not in out.stderr and not list(tmp_path.glob("tmp*"))


def test_a_node_without_the_image_is_in_the_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = _verdict(tmp_path, [A, ""])
    assert out.returncode == 1
    assert "  node-2  missing  docker: no such image" in out.stderr.splitlines()


def test_a_node_the_head_cannot_reach_is_named_with_its_fabric_address(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = _verdict(tmp_path, [A, A, A, A], tensorParallelSize=4)  # node-4's address: no route
    assert out.returncode == 1
    assert out.stderr.splitlines()[0] == (
        "the head cannot reach node-4 at 192.168.231.14:22 (its identity: the fabric) to ask "
        "which image it holds; check the link, routes and firewall: ssh: connect to host "
        "192.168.231.14 port 22: No route to host")
    assert "  node-4  unreachable  ssh: connect to host 192.168.231.14 port 22: No route to host" \
        in out.stderr.splitlines()


@pytest.mark.parametrize("digest, refused", [
    (A, None),  # the image id itself
    (C, None),  # a registry digest of it
    (B, "imageDigest " + B + " is not what node-1, node-2 hold as vllm/image:1:"),
])
def test_image_digest_pins_the_content(tmp_path, digest: str, refused: str | None) -> None:  # type: ignore[no-untyped-def]
    held = f"{A} reg/vllm@{C}"
    out = _verdict(tmp_path, [held, held], imageDigest=digest)
    if refused is None:
        assert (out.returncode, out.stdout) == (0, A + "\n"), out.stderr
    else:
        assert out.returncode == 1 and out.stderr.splitlines()[0] == refused
        assert f"  node-1  {A}  reg/vllm@{C}" in out.stderr


def test_every_staging_command_is_replaced_on_its_triggers_and_runs_again_on_any_other_change(
        ) -> None:
    """A new SSH key (in a copy's and the image check's stdin) or script text is an update,
    which runs `create` again (no `update`): it copies or stages nothing that is there."""
    for name, r in graph(4, tensorParallelSize=2, pipelineParallelSize=2).items():
        if r.type == CMD and (name.startswith("model-") or name == "image-check"):
            assert r.delete_before_replace, name
            assert set(r.replace_on_changes) == {"triggers", "triggers[*]"}, name
            assert r.plain("update") is None and not r.ignore_changes, name
