"""Table tests of the spec: each refusal, each message, all problems reported together."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from spark_vllm.components.spec import OWNED_ENV, SpecError, _Settings, decode_config, parse_spec
from tests.unit.harness import TEST_HOST_KEY, pinned

ROOT = Path(__file__).resolve().parents[2]
ALL_SECRETS = frozenset({"sshPrivateKey"})


def good() -> dict[str, Any]:
    return {
        "nodes": [
            {"name": "spark-a", "host": "10.1.230.180", "user": "aurora",
             "hostKey": TEST_HOST_KEY,
             "fabricIp": "192.168.200.12", "fabricInterface": "enp1s0f1np1", "gpus": 1},
            {"name": "spark-b", "host": "10.1.230.181", "user": "aurora",
             "hostKey": TEST_HOST_KEY,
             "fabricIp": "192.168.200.13", "fabricInterface": "enp1s0f1np1", "gpus": 1},
        ],
        "image": "hellohal2064/vllm-qwen3.5-gb10:latest",
        "model": "Qwen/Qwen3.5-122B-A10B-FP8",
        "tensorParallelSize": 2,
    }


def problems(mutate: Any, secrets: frozenset[str] = ALL_SECRETS) -> list[str]:
    raw = good()
    mutate(raw)
    with pytest.raises(SpecError) as err:
        parse_spec(raw, "t", secrets)
    return err.value.problems


def set_node(i: int, **kv: Any) -> Any:
    return lambda raw: raw["nodes"][i].update(kv)


def drop_node_key(i: int, key: str) -> Any:
    return lambda raw: raw["nodes"][i].pop(key)


REFUSALS = [
    ("unknown node key", set_node(1, fabricIface="x"), "nodes[1].fabricIface: unknown key (a typo?)"),
    ("unknown top key", lambda r: r.update(tensorParalelSize=2), "tensorParalelSize: unknown key (a typo?)"),
    ("node name chars", set_node(0, name="Spark_A"), "nodes[0].name: 'Spark_A' must be 1-40 of [a-z0-9-]"),
    ("node name unique", set_node(1, name="spark-a"), "nodes[1].name: 'spark-a' already used by nodes[0]"),
    ("fabricIp literal", set_node(1, fabricIp="192.168.200.300"), "nodes[1].fabricIp: "),
    ("identity unique", set_node(1, fabricIp="192.168.200.12"),
     "nodes[1].fabricIp: identity 192.168.200.12 already used by nodes[0]"),
    ("host identity unique", lambda r: [n.pop(k) for n in r["nodes"] for k in ("fabricIp", "fabricInterface")]
     and r["nodes"][1].update(host="10.1.230.180"),
     "nodes[1].host: identity 10.1.230.180 already used by nodes[0]"),
    ("fabricInterface with fabricIp", drop_node_key(1, "fabricInterface"),
     "nodes[1].fabricInterface: required when fabricIp is set"),
    ("fabricIp with fabricInterface", drop_node_key(1, "fabricIp"),
     "nodes[1].fabricIp: required when fabricInterface is set"),
    ("identity must be an IP", lambda r: [r["nodes"][1].pop(k) for k in ("fabricIp", "fabricInterface")]
     and r["nodes"][1].update(host="spark-b.local"),
     "nodes[1].host: 'spark-b.local' is not an IP literal; the node identity must be an IP"),
    ("gpus >= 1", set_node(0, gpus=0), "nodes[0].gpus: Input should be greater than or equal to 1"),
    ("TP x PP = GPUs", lambda r: r.update(tensorParallelSize=4),
     "tensorParallelSize: tensorParallelSize × pipelineParallelSize = 4 × 1 = 4 must equal the GPUs of all nodes (2)"),
    ("PP counts", lambda r: r.update(pipelineParallelSize=2),
     "= 2 × 2 = 4 must equal the GPUs of all nodes (2)"),
    ("port range", lambda r: r.update(port=70000), "port: Input should be less than or equal to 65535"),
    ("rayPort range", lambda r: r.update(rayPort=0), "rayPort: Input should be greater than or equal to 1"),
    ("ssh port range", set_node(1, port=65536), "nodes[1].port: Input should be less than or equal to 65535"),
    ("port clash", lambda r: r.update(port=6379), "port: 6379 is also rayPort"),
    ("imagePull", lambda r: r.update(imagePull="sometimes"),
     "imagePull: Input should be 'always', 'missing' or 'never'"),
    ("hfCache absolute", lambda r: r.update(hfCache="cache"), "hfCache: must be an absolute path on the nodes"),
    ("env value type", lambda r: r.update(env={"A": True}), "env.A: Input should be a valid string"),
    ("env key name", lambda r: r.update(env={"A-B": "1"}), "env.A-B: not a valid environment variable name"),
    ("vllmArgs owned", lambda r: r.update(vllmArgs=["--tensor-parallel-size=2"]),
     "vllmArgs[0]: --tensor-parallel-size is set by the program from tensorParallelSize"),
    ("vllmArgs api key", lambda r: r.update(vllmArgs=["--max-model-len", "8", "--api-key", "x"]),
     "vllmArgs[2]: --api-key is set by the program from apiKey (a secret)"),
    ("vllmArgs owned, underscores", lambda r: r.update(vllmArgs=["--tensor_parallel_size=1"]),
     "vllmArgs[0]: --tensor-parallel-size is set by the program from tensorParallelSize "
     "(vLLM reads --tensor_parallel_size as --tensor-parallel-size)"),
    ("vllmArgs owned, a prefix", lambda r: r.update(vllmArgs=["--served-model", "x"]),
     "vllmArgs[0]: --served-model-name is set by the program from servedModelName"),
    ("vllmArgs owned, prefix with underscores", lambda r: r.update(vllmArgs=["--api_k=x"]),
     "vllmArgs[0]: --api-key is set by the program from apiKey (a secret) "
     "(vLLM reads --api_k as --api-key)"),
    ("vllmArgs owned, short alias", lambda r: r.update(vllmArgs=["-pp", "2"]),
     "vllmArgs[0]: -pp is set by the program from pipelineParallelSize"),
    ("host key shape", set_node(0, hostKey="AAAA"), "nodes[0].hostKey: expected \"<type> <base64>\""),
    ("nodes missing", lambda r: r.pop("nodes"), "nodes: required, a non-empty list"),
    ("image missing", lambda r: r.pop("image"), "image: Field required"),
    ("checkGpu type", lambda r: r.update(checkGpu="yes"), "checkGpu: Input should be a valid boolean"),
]


@pytest.mark.parametrize("mutate,expected", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_refusal_names_the_field(mutate: Any, expected: str) -> None:
    found = problems(mutate)
    assert any(expected in p for p in found), found


@pytest.mark.parametrize("args", [
    ["--max-model-len", "32768"], ["--max_model_len=32768"], ["--enable-prefix-caching"],
    ["--gpu-memory-utilization", "0.85"], ["--chat-template", "host"],
    ["--kv-transfer-config.kv_role", "kv_both"],
])
def test_vllm_args_that_are_not_program_owned_pass(args: list[str]) -> None:
    raw = good()
    raw["vllmArgs"] = args
    assert parse_spec(raw, "t", ALL_SECRETS).vllm_args == tuple(args)


def test_an_ambiguous_prefix_names_every_owned_flag_it_could_be() -> None:
    found = problems(lambda r: r.update(vllmArgs=["--p=1"]))
    assert any("--pipeline-parallel-size is set by the program" in p for p in found), found
    assert any("--port is set by the program" in p for p in found), found


@pytest.mark.parametrize("key", sorted(OWNED_ENV))
def test_owned_env_keys_are_refused_naming_the_field_to_use(key: str) -> None:
    found = problems(lambda r: r.update(env={key: "x", "NCCL_DEBUG": "INFO"}))
    assert found == [f"env.{key}: set by the program from {OWNED_ENV[key]}; remove it from env"]


def test_owned_env_covers_the_design_list() -> None:
    design = {"VLLM_HOST_IP", "RAY_NODE_IP_ADDRESS", "RAY_OVERRIDE_NODE_IP_ADDRESS", "HOST_IP",
              "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES",
              "NCCL_IB_HCA"}
    assert design <= set(OWNED_ENV)
    assert "fabricInterface" in OWNED_ENV["NCCL_SOCKET_IFNAME"]
    assert "ibHca" in OWNED_ENV["NCCL_IB_HCA"]


def test_ssh_key_is_required() -> None:
    found = problems(lambda r: None, secrets=frozenset())
    assert found == ["sshPrivateKey: required; set it with "
                     "`pulumi config set --secret spark-vllm:sshPrivateKey < "
                     "~/.ssh/spark-vllm-deploy` (the deploy key's file)"]


def test_every_problem_is_reported_together() -> None:
    def many(raw: dict[str, Any]) -> None:
        raw["nodes"][0].update(name="A", gpus=0)
        raw["nodes"][1].pop("fabricInterface")
        raw.update(imagePull="sometimes", port=99999, env={"VLLM_HOST_IP": "1.2.3.4"}, typo=1)

    found = problems(many)
    paths = sorted(p.split(":")[0] for p in found)
    assert paths == ["imagePull", "nodes[0].gpus", "nodes[0].name", "nodes[1].fabricInterface",
                     "port", "typo"], found
    # message is one line per problem, each prefixed, so the Pulumi error reads as a list
    with pytest.raises(SpecError) as err:
        raw = good()
        many(raw)
        parse_spec(raw, "t", ALL_SECRETS)
    assert str(err.value).startswith("invalid spark-vllm config (6 problems):\n  - ")


def test_valid_spec_defaults_and_identity() -> None:
    spec = parse_spec(good(), "duo", ALL_SECRETS)
    assert spec.head.name == "spark-a" and [w.name for w in spec.workers] == ["spark-b"]
    assert [n.identity_ip for n in spec.nodes] == ["192.168.200.12", "192.168.200.13"]
    assert (spec.image_pull, spec.port, spec.ray_port, spec.served_name) == (
        "missing", 8000, 6379, "Qwen/Qwen3.5-122B-A10B-FP8")
    assert spec.nodes[0].user == "aurora" and spec.nodes[0].port == 22
    with pytest.raises(ValidationError):
        spec.nodes[0].host = "x"  # type: ignore[misc]  # frozen


def test_identity_falls_back_to_host_ip() -> None:
    raw = good()
    for n in raw["nodes"]:
        n.pop("fabricIp"), n.pop("fabricInterface")
    spec = parse_spec(raw, "t", ALL_SECRETS)
    assert [n.identity_ip for n in spec.nodes] == ["10.1.230.180", "10.1.230.181"]


def test_env_numbers_become_strings() -> None:
    raw = good()
    raw["env"] = {"NCCL_DEBUG": "WARN", "NCCL_IB_DISABLE": 0, "RATIO": 0.5}
    assert parse_spec(raw, "t", ALL_SECRETS).user_env == {
        "NCCL_DEBUG": "WARN", "NCCL_IB_DISABLE": "0", "RATIO": "0.5"}


def test_decode_config_types_and_secrets() -> None:
    raw, secrets = decode_config({
        "spark-vllm:nodes": '[{"name": "a", "host": "10.0.0.1"}]',
        "spark-vllm:image": "123",  # a string field stays text
        "spark-vllm:tensorParallelSize": "1",
        "spark-vllm:checkGpu": "false",
        "spark-vllm:sshPrivateKey": "PRIVATE",
        "other:key": "ignored",
    })
    assert raw == {"nodes": [{"name": "a", "host": "10.0.0.1"}], "image": "123",
                   "tensorParallelSize": 1, "checkGpu": False}
    assert secrets == {"sshPrivateKey"}
    assert "PRIVATE" not in repr(raw)


def stack_config(path: Path) -> tuple[dict[str, Any], frozenset[str]]:
    """Flatten a stack file the way Pulumi hands config to a program: structured values as
    JSON text, scalars as their text."""
    doc = yaml.safe_load(path.read_text())["config"]
    doc["spark-vllm:nodes"] = pinned(doc["spark-vllm:nodes"])  # each site pins its own
    flat = {k: v if isinstance(v, str) else json.dumps(v) for k, v in doc.items()}
    return decode_config(flat)


def test_spark_duo_example_is_valid_and_matches_the_outage_layout() -> None:
    raw, secrets = stack_config(ROOT / "stacks" / "Pulumi.spark-duo.yaml")
    spec = parse_spec(raw, "spark-duo", secrets | {"sshPrivateKey"})
    assert spec.head.host == "10.1.230.180"
    assert [n.identity_ip for n in spec.nodes] == ["192.168.200.12", "192.168.200.13"]
    assert {n.fabric_interface for n in spec.nodes} == {"enp1s0f1np1"}
    assert spec.tensor_parallel_size == 2 and spec.model == "Qwen/Qwen3.5-122B-A10B-FP8"
    assert spec.image.startswith("hellohal2064/vllm-qwen3.5-gb10")


def test_example_documents_every_key() -> None:
    text = (ROOT / "spark_vllm" / "template" / "stack.example.yaml").read_text()
    doc = yaml.safe_load(text)["config"]
    keys = {k.split(":", 1)[1] for k in doc}
    from pydantic.alias_generators import to_camel
    settings = {to_camel(f) for f in _Settings.model_fields}
    # models and gateway are the several-models example's (they exclude the one model's keys)
    assert keys == settings - {"models", "gateway"} | {"nodes"}
    # the secrets are documented with their command, never given a (placeholder) value
    for key in ("sshPrivateKey", "hfToken", "apiKey"):
        assert f"pulumi config set --secret spark-vllm:{key}" in text, key
    node_keys = set(doc["spark-vllm:nodes"][0])
    assert node_keys == {"name", "host", "user", "port", "hostKey", "fabricIp",
                         "fabricInterface", "ibHca", "gpus"}


def test_problems_do_not_leak_between_calls() -> None:
    raw = good()
    before = copy.deepcopy(raw)
    parse_spec(raw, "t", ALL_SECRETS)
    assert raw == before


def test_image_digest_must_be_a_digest() -> None:
    assert problems(lambda r: r.update(imageDigest="latest"))[0].startswith(
        "imageDigest: String should match pattern")


def test_staging_needs_a_repo_id_and_owns_hf_hub_offline() -> None:
    assert problems(lambda r: r.update(model="/models/qwen", env={"HF_HUB_OFFLINE": "1"})) == [
        "env.HF_HUB_OFFLINE: set by the program while modelStaging is download; remove it from "
        "env (or set modelStaging: none)",
        "model: '/models/qwen' is not a Hugging Face repo id (org/name); modelStaging download "
        "stages repos into hfCache: set modelStaging: none for a path or a model the nodes "
        "already have"]
    parse_spec({**good(), "model": "/models/qwen", "modelStaging": "none"}, "s", ALL_SECRETS)
    with pytest.raises(SpecError, match=r"vllmArgs\[0\]: --revision is set by the program from "
                                        "modelRevision"):
        parse_spec({**good(), "vllmArgs": ["--revision=abc"]}, "s", ALL_SECRETS)


# --- issue 34, item 4: three kinds of bad config that used to pass ---------------------------

def refused(mutate: Any) -> list[str]:
    found = problems(mutate)
    assert all("\n" not in p for p in found), found  # one line per problem, whatever the input
    return found


@pytest.mark.parametrize("arg,message", [
    # a prefix of a single-dash alias: argparse's abbreviation (vLLM 0.26.0 read `-t 4` as -tp 4)
    ("-t", "-tp is set by the program from tensorParallelSize (vLLM reads -t as -tp)"),
    ("-t=4", "-tp is set by the program from tensorParallelSize (vLLM reads -t as -tp)"),
    # the owned flags' own short aliases (vLLM 0.33.0's flag table)
    ("-n", "-n is set by the program from backend and nodes"),
    ("-r=1", "-r is set by the program from backend and nodes"),
    ("-dpl", "-dpl is set by the program from (one engine)"),
    ("-dpa", "-dpa is set by the program from (one engine)"),
    ("-dpn", "-dpn is set by the program from (one engine)"),
    ("-dpr", "-dpr is set by the program from (one engine)"),
    ("-dpp=5555", "-dpp is set by the program from (one engine)"),
    ("-dpb", "-dpb is set by the program from (one engine)"),
    # a one-letter alias takes its value attached: -n2 is --nnodes 2
    ("-n2", "-n is set by the program from backend and nodes (vLLM reads -n2 as -n)"),
    ("-r1", "-r is set by the program from backend and nodes (vLLM reads -r1 as -r)"),
    # long prefixes, with underscores
    ("--tensor-parallel", "--tensor-parallel-size is set by the program from tensorParallelSize"),
    ("--tensor_parallel_s", "--tensor-parallel-size is set by the program from tensorParallelSize"),
])
def test_vllm_args_that_vllm_expands_to_an_owned_flag_are_refused(arg: str, message: str) -> None:
    found = refused(lambda r: r.update(vllmArgs=["--enforce-eager", arg, "4"]))
    assert any(p.startswith(f"vllmArgs[1]: {message}") for p in found), found


def test_an_exact_owned_flag_is_read_as_itself_not_as_a_longer_one() -> None:
    # argparse takes an exact option string before any abbreviation: --data-parallel-size and
    # -dp are not --data-parallel-size-local / -dpl
    found = refused(lambda r: r.update(vllmArgs=["--data-parallel-size", "2", "-dp", "2"]))
    assert found == ["vllmArgs[0]: --data-parallel-size is set by the program from (one engine: "
                     "tensorParallelSize × pipelineParallelSize)",
                     "vllmArgs[2]: -dp is set by the program from (one engine: "
                     "tensorParallelSize × pipelineParallelSize)"], found


def _serve_parser() -> Any:
    """`vllm serve`'s options as vLLM 0.33.0 declares them (the lab's flag table), in argparse."""
    import argparse

    from vllm_sim.serve_flags import add_serve_arguments

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> Any:  # ambiguous: vLLM exits; nothing to refuse
            raise ValueError(message)

    parser = Parser(prog="vllm serve")
    add_serve_arguments(parser)
    return parser


def _argparse_reads(parser: Any, token: str) -> Any:
    """The action argparse takes `token` for (after vLLM's own rewriting), or None."""
    from vllm_sim.serve_flags import flexible_argv

    try:
        found = parser._parse_optional(flexible_argv([token])[0])
    except ValueError:
        return None
    if isinstance(found, list):  # Python >= 3.12.7: a list of candidates
        found = found[0] if len(found) == 1 else None
    return found[0] if found else None


def test_every_spelling_argparse_reads_as_an_owned_flag_is_refused_and_no_other() -> None:
    from vllm_sim.serve_flags import load_flag_table

    from spark_vllm.components.spec import OWNED_VLLM_FLAGS, owned_vllm_flags

    parser = _serve_parser()
    table = load_flag_table()
    owned_rows = [opts for opts, _ in table if set(opts) & set(OWNED_VLLM_FLAGS)]
    # every alias vLLM gives an owned flag is owned too (-n, -r, -dpl … were not)
    assert sorted(o for opts in owned_rows for o in opts) == sorted(OWNED_VLLM_FLAGS)
    tokens = set()
    for opts in owned_rows:
        for o in opts:
            start = 3 if o.startswith("--") else 2
            for k in range(start, len(o) + 1):
                p = o[:k]
                tokens |= {p, p + "=4", p.replace("-", "_").replace("__", "--", 1)}
            if len(o) == 2:
                tokens |= {o + "4", o + "x"}
    tokens |= {o for opts, _ in table for o in opts} | {o + "=1" for opts, _ in table for o in opts}
    misread = []
    for token in sorted(tokens):
        action = _argparse_reads(parser, token)
        if action is None or not action.option_strings:
            continue
        said = owned_vllm_flags(token)
        if set(action.option_strings) & set(OWNED_VLLM_FLAGS):
            if not said or not set(said) <= set(action.option_strings):
                misread.append((token, action.option_strings, said))
        elif said:
            misread.append((token, action.option_strings, said))
    assert not misread, misread


def test_two_nodes_on_one_ssh_endpoint_are_refused() -> None:
    found = refused(set_node(1, host="10.1.230.180"))
    assert found == ["nodes[1].host: same SSH endpoint as nodes[0] (10.1.230.180:22); "
                     "each node needs its own"], found
    # case and whitespace of a name, the default port written out
    found = refused(lambda r: (r["nodes"][0].update(host="Spark-A.lan"),
                               r["nodes"][1].update(host=" spark-a.lan ", port=22)))
    assert found == ["nodes[1].host: same SSH endpoint as nodes[0] (spark-a.lan:22); "
                     "each node needs its own"], found
    # an IPv6 literal compared as an address
    found = refused(lambda r: (r["nodes"][0].update(host="fd00::1", port=2222),
                               r["nodes"][1].update(host="FD00:0:0::1", port=2222)))
    assert found == ["nodes[1].host: same SSH endpoint as nodes[0] ([fd00::1]:2222); "
                     "each node needs its own"], found
    # another port of the same host is another endpoint (a forwarded port, a container)
    raw = good()
    raw["nodes"][1].update(host="10.1.230.180", port=2222)
    parse_spec(raw, "t", ALL_SECRETS)


def test_two_nodes_with_one_identity_address_are_refused() -> None:
    found = refused(lambda r: (r["nodes"][0].update(fabricIp="fd00::c"),
                               r["nodes"][1].update(fabricIp="FD00:0::C")))
    assert found == ["nodes[1].fabricIp: identity fd00::c already used by nodes[0]; vLLM "
                     "requires a unique IP per node"], found


@pytest.mark.parametrize("mutate,expected", [
    (lambda r: r.update(vllmArgs=["--max-model-len", "8", "--chat-template", "a\nb"]),
     "vllmArgs[3]: contains control character '\\n'"),
    (lambda r: r.update(vllmArgs=["--chat-template", "a\x00b"]),
     "vllmArgs[1]: contains control character '\\x00'"),
    (lambda r: r.update(vllmArgs=["--enforce-eager\r"]),
     "vllmArgs[0]: contains control character '\\r'"),
    (lambda r: r.update(env={"FOO": "a\rb"}), "env.FOO: contains control character '\\r'"),
    (lambda r: r.update(env={"FOO": "\x1b[2Jx"}), "env.FOO: contains control character '\\x1b'"),
    (lambda r: r.update(env={"FOO": "x\x7f"}), "env.FOO: contains control character '\\x7f'"),
    (lambda r: r.update(env={"FOO": "one\ntwo"}), "env.FOO: contains control character '\\n'"),
    # a key: a name never holds one (re.match's $ let "NCCL_DEBUG\n" through)
    (lambda r: r.update(env={"NCCL_DEBUG\n": "INFO"}),
     "env.NCCL_DEBUG\\n: not a valid environment variable name"),
])
def test_control_characters_in_vllm_args_and_env_are_refused(mutate: Any, expected: str) -> None:
    found = refused(mutate)
    assert any(p.startswith(expected) for p in found), found


def test_a_tab_is_not_a_control_character_here() -> None:
    raw = good()
    raw.update(env={"FOO": "a\tb"}, vllmArgs=["--chat-template", "{{ x }}\t{{ y }}"])
    spec = parse_spec(raw, "t", ALL_SECRETS)
    assert spec.user_env == {"FOO": "a\tb"} and spec.vllm_args[1] == "{{ x }}\t{{ y }}"


def test_a_node_without_a_host_key_is_refused_naming_it_and_the_keyscan_to_run() -> None:
    def unpin(raw: dict[str, Any]) -> None:
        raw["nodes"][1].pop("hostKey")
        raw["nodes"][1]["port"] = 2222
    (problem,) = problems(unpin)
    assert problem.startswith("nodes[1].hostKey: required: spark-b has no pinned host key")
    assert "`ssh-keyscan -t ed25519 -p 2222 10.1.230.181`" in problem
    assert "insecureAcceptAnyHostKey: true" in problem
    (both,) = {p.split(":")[0] for p in problems(lambda r: [n.pop("hostKey") for n in r["nodes"]])
               if "spark-a" in p}
    assert both == "nodes[0].hostKey"


def test_the_labs_opt_out_accepts_a_node_without_a_host_key() -> None:
    raw = good()
    raw["nodes"][0].pop("hostKey")
    raw["insecureAcceptAnyHostKey"] = True
    spec = parse_spec(raw, "t", ALL_SECRETS)
    assert spec.insecure_accept_any_host_key and spec.head.host_key is None
    assert spec.nodes[1].host_key == TEST_HOST_KEY  # a pinned one stays pinned
    with pytest.raises(SpecError) as err:
        parse_spec({**raw, "insecureAcceptAnyHostKey": "yes"}, "t", ALL_SECRETS)
    assert err.value.problems[0].startswith("insecureAcceptAnyHostKey: Input should be a valid "
                                            "boolean")
