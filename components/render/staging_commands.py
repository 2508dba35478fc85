"""Builders of the model's staging, copy and image check: spec in, scripts and stdin out.

The staging downloads once on the head and copies to every other node (staging.py); the image
check compares the image on every node (image_check.py). The programs they run are in
scripts/ (model_manifest.py, image_check.py), sent on stdin after a separator.
"""

from __future__ import annotations

import json
import re
import shlex

from .. import ssh
from ..spec import ClusterSpec, NodeSpec
from .commands import LABEL, PROGRESS_EVERY_S, owner, prelude, script_text

MODEL_ROLE = "model"
# In a staging command's stdin: the secret part (the env-file with HF_TOKEN, or the SSH key the
# head copies with) comes first; the staging helper's Python follows this line.
MANIFEST_SEPARATOR = "#--- spark-vllm: its program follows ---"


# The user's env keys the download container gets: the Hub's own settings and proxies. Not the
# rest (NCCL_DEBUG …): an env change must not re-run the staging, a reviewer reads that as
# weights being copied again.
_DOWNLOAD_ENV = re.compile(r"^(HF_.*|HUGGINGFACE_.*|(HTTPS?|NO|ALL)_PROXY|(https?|no|all)_proxy"
                           r"|REQUESTS_CA_BUNDLE|SSL_CERT_FILE|CURL_CA_BUNDLE)$")


def download_env(spec: ClusterSpec) -> dict[str, str]:
    return {k: v for k, v in spec.user_env.items() if _DOWNLOAD_ENV.match(k)}


def model_repo_dir(spec: ClusterSpec) -> str:
    return f"{spec.hf_cache}/hub/models--{spec.model.replace('/', '--')}"


def staging_stdin(secret_part: str, program: str = "model_manifest.py", preamble: str = "") -> str:
    """stdin of a staging command (or the image check): a secret (env-file or key), then the
    Python it runs (after `preamble`, e.g. its data)."""
    if MANIFEST_SEPARATOR in secret_part:
        raise ValueError("secret contains the staging separator")
    return (secret_part if secret_part.endswith("\n") else secret_part + "\n") \
        + MANIFEST_SEPARATOR + "\n" + preamble + script_text(program)


def image_check_stdin(spec: ClusterSpec, ssh_private_key: str) -> str:
    """The image check's stdin: the key, then its program with what it asks (the payload)."""
    return staging_stdin(ssh_private_key, "image_check.py",
                         f"PAYLOAD = {image_check_payload(spec)!r}\n")


def _staging_prelude(spec: ClusterSpec, node: NodeSpec, what: str, secret_file: str,
                     env: bool = True) -> list[str]:
    """Split stdin into a 0600 secret file and the helper, in a directory removed on exit; a
    signal (Ctrl-C twice, a lost session) ends the script, and with it what it started."""
    return [
        *prelude(spec, node, what),
        'fail() { log "FAILED: $*"; exit 1; }',
        f"command -v python3 >/dev/null 2>&1 || fail \"python3 is not installed: the {what} "
        "runs with it\"",
        "umask 077; work=$(mktemp -d)",
        "trap 'cleanup; rm -rf \"$work\"' EXIT",
        "trap 'exec >/dev/null 2>&1; exit 1' HUP INT TERM PIPE",
        "cleanup() { :; }",
        "awk -v s=" + shlex.quote(MANIFEST_SEPARATOR)
        + f" -v f=\"$work\"/{secret_file} -v m=\"$work\"/m.py "
        + shlex.quote('$0 == s { f = m; next } { print > f }'),
        *([f"export SPARK_VLLM_NODE={shlex.quote(node.name)}",
           f"hf={shlex.quote(spec.hf_cache)}; repo={shlex.quote(spec.model)}"] if env else []),
    ]


def stage_script(spec: ClusterSpec) -> str:
    """`create` of the head's staging command: the model complete in the head's hfCache,
    downloaded there first when missing (modelStaging: download), its manifest written; prints
    the manifest summary (commit, files, bytes, digest) as JSON."""
    head = spec.head
    rev = spec.model_revision or "main"
    name = f"{LABEL}-{owner(spec)}-model-download"
    lines = [
        *_staging_prelude(spec, head, "model", "hf.env"),
        f"rev={shlex.quote(rev)}",
        'log "looking for $repo ($rev) in $hf"',
        'if python3 "$work"/m.py build "$hf" "$repo" "$rev" > "$work"/summary; then :',
        "else",
        '  rc=$?; [ "$rc" -eq 4 ] || fail "cannot read $repo in $hf (above)"',
    ]
    if spec.model_staging == "copy":
        lines += [
            '  fail "$repo ($rev) is not complete in hfCache $hf on $node (above); modelStaging: '
            'copy never downloads: put it there first (hf download), or set modelStaging: '
            'download"',
        ]
    else:
        env = []  # what reaches the Hub (HF_ENDPOINT, proxies), not HF_HUB_OFFLINE
        for key, value in download_env(spec).items():
            env += ["--env", f"{key}={value}"]
        run = shlex.join([
            "docker", "run", "--rm", "-i", "--name", name, "--network", "host",
            "--label", f"{LABEL}.stack={spec.stack}", "--label", f"{LABEL}.role=model-download",
            "--volume", f"{spec.hf_cache}:/root/.cache/huggingface", *env,
            "--entrypoint", "python3", spec.image, "-", "download", "/root/.cache/huggingface",
            spec.model, rev])
        lines += [
            f'  log "downloading $repo ($rev) into $hf with {spec.image}"',
            '  mkdir -p "$hf"',
            f"  cleanup() {{ docker rm --force {shlex.quote(name)} >/dev/null 2>&1 || true; }}",
            "  cleanup",
            f'  {run[:run.index(" --name")]} --env-file "$work"/hf.env{run[run.index(" --name"):]}'
            ' < "$work"/m.py > "$work"/dl.out 2> "$work"/dl.err &',
            "  dl=$!; start=$(date +%s); last=$start",
            '  while kill -0 "$dl" 2>/dev/null; do',
            "    sleep 1; now=$(date +%s)",
            f"    if [ $((now - last)) -ge {PROGRESS_EVERY_S} ]; then last=$now",
            "      total=$(awk '$1 == \"total\" {print $2}' \"$work\"/dl.out)",
            f"      have=$(du -sb {shlex.quote(model_repo_dir(spec))}/blobs 2>/dev/null | cut -f1)",
            '      log "downloading: ${have:-0} of ${total:-?} bytes after $((now - start)) s"',
            "    fi",
            "  done",
            '  if ! wait "$dl"; then sed "s/^/    | /" "$work"/dl.err | tail -n 20 >&2; '
            'fail "download of $repo ($rev) failed (above)"; fi',
            "  cleanup() { :; }",
            '  python3 "$work"/m.py build "$hf" "$repo" "$rev" > "$work"/summary '
            '|| fail "downloaded $repo ($rev), but it is not complete (above)"',
        ]
    lines += [
        "fi",
        'log "ready: $(cat "$work"/summary)"',
        'cat "$work"/summary',
    ]
    return "\n".join(lines) + "\n"


def copy_script(spec: ClusterSpec, node: NodeSpec) -> str:
    """`create` of one node's copy command, run on the head: the head's model copied to `node`
    over the fabric (rsync over SSH to its identity IP, resumable, only what is missing) and
    verified there against the manifest; prints what it copied as JSON. The commit is the one
    the head's staging resolved, read there when the copy runs: nothing of the staging's
    output is in this script, so re-running the staging (it is cheap) never re-runs a copy."""
    head = spec.head
    dest = f"{node.user}@{node.identity_ip}"
    opts = ssh.options("$work/key", node.port, node.host_key, "$work/known_hosts")
    known_line = []
    if node.host_key:
        known = ssh.known_hosts_line(node.identity_ip, node.port, node.host_key)
        known_line = [f"printf '%s\\n' {shlex.quote(known)} > \"$work\"/known_hosts"]
    # $work is mktemp's (no spaces): rsync splits -e at spaces
    ssh_opts = " ".join(opts)
    to = f"{node.name} ({dest})"
    transport = "raw TCP (unencrypted)" if spec.copy_transport == "tcp" else "rsync over SSH"
    remote_hf = shlex.quote(shlex.quote(spec.hf_cache))  # quoted for the remote shell too
    lines = [
        *_staging_prelude(spec, head, f"model copy to {node.name}", "key"),
        f"rev={shlex.quote(spec.model_revision or 'main')}",
        'commit=$(python3 "$work"/m.py commit "$hf" "$repo" "$rev") '
        '|| fail "$repo ($rev) is not staged on the head: its staging command does that"',
        *known_line,
        f'ssh_opts="{ssh_opts}"',
        f"dest={shlex.quote(dest)}",
        'on_node() { ssh $ssh_opts "$dest" "$@"; }',
        # the helper on the node, its program on stdin: on_helper MODE
        "on_helper() { on_node python3 - \"$1\" " + remote_hf + " " + shlex.quote(
            shlex.quote(spec.model)) + ' "$commit" < "$work"/m.py; }',
        "command -v rsync >/dev/null 2>&1 || fail \"rsync is not installed on the head\"",
        'python3 "$work"/m.py files "$hf" "$repo" "$commit" > "$work"/files '
        '|| fail "no manifest of $repo at $commit on the head: the staging command writes it"',
        # the blobs' directory first: parallel transfers then never race to create it
        f"if ! out=$(on_node mkdir -p {shlex.quote(shlex.quote(model_repo_dir(spec) + '/blobs'))}"
        " 2>&1); then "
        f'fail "cannot reach {to} over the fabric from the head: $out"; fi',
        # the manifest first (it tells the node what to check), then what is missing there
        'grep "^spark-vllm/manifests/" "$work"/files > "$work"/manifest-file',
        'rsync -a -s -e "ssh $ssh_opts" --files-from="$work"/manifest-file "$hf"/ "$dest:$hf"/ '
        f'|| fail "cannot copy the manifest to {to}"',
        f'space=$(on_helper need) || fail "cannot read free space on {node.name}"',
        "set -- $(printf '%s' \"$space\" | python3 -c 'import json,sys; d=json.load(sys.stdin); "
        "print(d[\"need\"], d[\"free\"], d[\"path\"], d.get(\"cpus\", 1))')",
        f'if [ "$1" -gt "$2" ]; then fail "{node.name} has $(($2 / 1000000)) MB free on $3, the '
        f'model needs $(($1 / 1000000)) MB more there (hfCache {spec.hf_cache})"; fi',
        *_streams_lines(spec),
        f'log "copying $(($1 / 1000000)) MB of $repo to {to}: $streams {transport} stream(s)"',
        "start=$(date +%s.%N)",
        *(_tcp_copy_lines(spec, node, to) if spec.copy_transport == "tcp" else [
            'python3 "$work"/m.py push-rsync "$hf" "$work"/files "$streams" "$dest" "$ssh_opts" '
            + shlex.quote(f"copying to {node.name}") + ' > "$work"/sent '
            f'|| fail "rsync to {to} failed (above)"',
            'on_helper mark || fail "cannot record the copy on ' + node.name + '"',
        ]),
        'state=$(on_helper check) || fail "cannot check the copy on ' + node.name + '"',
        f'[ "$state" = complete ] || fail "after the copy, {node.name} has: $state"',
        # the transfer and the node's check, to the hundredth (the bench's ratios need it)
        'secs=$(awk -v a="$start" -v b="$(date +%s.%N)" \'BEGIN {printf "%.2f", b - a}\')',
        'sent=$(cat "$work"/sent 2>/dev/null || echo 0)',
        f'log "ready: {node.name} has $repo at $commit ($sent bytes sent in $secs s)"',
        f"""printf '{{"node": "%s", "commit": "%s", "missing": %s, "sent": %s, "seconds": %s}}\\n' """
        f'{shlex.quote(node.name)} "$commit" "$1" "$sent" "$secs"',
    ]
    return "\n".join(lines) + "\n"


# Streams of the weight copy with copyStreams auto: one per core of the smaller side (SSH
# encryption and rsync's checksums are CPU-bound; a Spark's 20 cores give 8), at most 8.
MAX_AUTO_STREAMS = 8


def _streams_lines(spec: ClusterSpec) -> list[str]:
    """$streams: copyStreams, or from the cores of the head (nproc) and of the node ($4)."""
    if spec.copy_streams != "auto":
        return [f"streams={int(spec.copy_streams)}"]
    return ["streams=$(nproc 2>/dev/null || echo 1)",
            '[ "$4" -lt "$streams" ] && streams=$4',
            f'[ "$streams" -gt {MAX_AUTO_STREAMS} ] && streams={MAX_AUTO_STREAMS}',
            '[ "$streams" -ge 1 ] || streams=1']


def _tcp_copy_lines(spec: ClusterSpec, node: NodeSpec, to: str) -> list[str]:
    """copyTransport tcp: the node's receiver listens on its identity IP (a port of its own
    choosing and a one-time token, both told back over SSH); the blobs travel over raw TCP,
    are hashed on arrival against their names; the rest (refs, snapshot links) over rsync."""
    ip = shlex.quote(shlex.quote(node.identity_ip))
    return [
        'on_node python3 - recv ' + shlex.quote(shlex.quote(spec.hf_cache)) + " "
        + shlex.quote(shlex.quote(spec.model)) + f' "$commit" {ip} "$streams" '
        '< "$work"/m.py > "$work"/recv.out 2> "$work"/recv.err &',
        "recv=$!",
        'cleanup() { kill "$recv" 2>/dev/null || true; }',
        'i=0; until read -r word port token 2>/dev/null < "$work"/recv.out '
        '&& [ "$word" = listening ]; do',
        '  kill -0 "$recv" 2>/dev/null || { sed "s/^/    | /" "$work"/recv.err >&2; '
        f'fail "the receiver on {node.name} did not start (above)"; }}',
        '  i=$((i + 1)); [ "$i" -lt 200 ] || fail "the receiver on ' + node.name
        + ' did not listen within 20 s"',
        "  sleep 0.1",
        "done",
        'python3 "$work"/m.py push-tcp "$hf" "$repo" "$commit" '
        f'{shlex.quote(node.identity_ip)} "$port" "$token" "$streams" '
        + shlex.quote(f"copying to {node.name}") + ' > "$work"/sent '
        f'|| {{ sed "s/^/    | /" "$work"/recv.err >&2; fail "the copy to {to} failed '
        '(above)"; }',
        'wait "$recv" || { sed "s/^/    | /" "$work"/recv.err >&2; '
        f'fail "the receiver on {node.name} failed (above)"; }}',
        "cleanup() { :; }",
        'sed "s/^/    | /" "$work"/recv.err >&2',
        'grep -v "/blobs/" "$work"/files > "$work"/links',
        'rsync -a -s -e "ssh $ssh_opts" --files-from="$work"/links "$hf"/ "$dest:$hf"/ '
        f'|| fail "cannot copy the snapshot links to {to}"',
    ]


# --- image consistency (image_check.py) --------------------------------------------------


def image_check_payload(spec: ClusterSpec) -> str:
    """What scripts/image_check.py asks: the tag, the pin, and how the head reaches each node."""
    return json.dumps({
        "image": spec.image, "imageDigest": spec.image_digest,
        **({"staging": spec.image_staging} if spec.image_staging != "pull" else {}),
        "nodes": [{"name": n.name, "ip": n.identity_ip, "user": n.user, "port": n.port,
                   "hostKey": n.host_key or ""} for n in spec.nodes]}, sort_keys=True)


def image_check_script(spec: ClusterSpec) -> str:
    """`create` of the image check (on the head, after every node's preflight, before any
    container): asks every node now which image it holds under spec.image; prints the id, or
    the per-node table on stderr and fails. stdin: the SSH key, then the program."""
    return "\n".join([
        *_staging_prelude(spec, spec.head, "image check", "key", env=False),
        'id=$(python3 "$work"/m.py "$work"/key)',
        f'log "{spec.image} is $id on all {len(spec.nodes)} node(s)"; echo "$id"',
    ]) + "\n"
