"""The three secret keys, checked for being secret before anything runs. Pure: no Pulumi import.

Presence is not enough. A value set without `--secret` sits in clear in the stack file (and then
in git); an example's placeholder (`SECRET`, `HF_TOKEN_VALUE`) passes any presence check and
reaches the nodes as a token; an SSH key with a passphrase cannot be used by Pulumi's SSH, which
has no prompt (pulumi-command `remote.Connection`: `privateKeyPassword` or nothing). Each is
refused here, naming the key and the command that sets it right, and never its value.
"""

from __future__ import annotations

import base64
import re
import struct
from collections.abc import Collection, Mapping

NAMESPACE = "spark-vllm"
SECRET_KEYS = ("sshPrivateKey", "hfToken", "apiKey")

# How each secret is set: by stdin from a file, or by Pulumi's own no-echo prompt (no argv).
SET_COMMAND = {
    "sshPrivateKey": f"`pulumi config set --secret {NAMESPACE}:sshPrivateKey < ~/.ssh/spark-vllm-deploy`"
                     " (the deploy key's file)",
    "hfToken": f"`pulumi config set --secret {NAMESPACE}:hfToken` (it prompts; or `< FILE`)",
    "apiKey": f"`pulumi config set --secret {NAMESPACE}:apiKey` (it prompts; or `< FILE`)",
}

# An example's stand-in: one CAPS word (SECRET, HF_TOKEN_VALUE, KEYFILE), <…>, or a word that
# names a placeholder. Real HF tokens are hf_ + mixed case; an API key an operator picks is
# not one CAPS word.
_CAPS_WORD = re.compile(r"^[A-Z][A-Z0-9_]*$")
_ANGLE = re.compile(r"^<.*>$")
_PLACEHOLDER_WORDS = {"secret", "changeme", "change-me", "change_me", "todo", "tbd", "xxx",
                      "placeholder", "password", "token", "apikey", "api-key", "api_key", "...",
                      "…", "none", "null"}


def looks_like_placeholder(value: str) -> bool:
    v = value.strip()
    return (bool(_CAPS_WORD.match(v)) or bool(_ANGLE.match(v))
            or v.lower() in _PLACEHOLDER_WORDS or set(v.lower()) <= {"x", "*", "-", "."})


def private_key_problem(text: str) -> str | None:
    """What is wrong with the sshPrivateKey value, or None. Never quotes the key."""
    body = text.strip()
    match = re.search(r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----(.*?)-----END", body, re.S)
    if not match:
        return ("is not a private key (expected a key file's contents, from "
                "'-----BEGIN … PRIVATE KEY-----' to its END line)")
    kind, inner = match.group(1), match.group(2)
    if "ENCRYPTED" in kind or "Proc-Type: 4,ENCRYPTED" in inner:
        return _PASSPHRASE
    if kind.strip() == "OPENSSH":
        # PROTOCOL.key in OpenSSH: "openssh-key-v1\0", then string ciphername ("none" if clear)
        try:
            blob = base64.b64decode("".join(inner.split()), validate=True)
        except ValueError:
            return "is not a readable OpenSSH private key (its base64 body does not decode)"
        magic = b"openssh-key-v1\0"
        if not blob.startswith(magic) or len(blob) < len(magic) + 4:
            return "is not a readable OpenSSH private key (no openssh-key-v1 header)"
        (n,) = struct.unpack(">I", blob[len(magic):len(magic) + 4])
        if blob[len(magic) + 4:len(magic) + 4 + n] != b"none":
            return _PASSPHRASE
    return None


_PASSPHRASE = ("has a passphrase; Pulumi's SSH cannot prompt for one: use a passphrase-less "
               "deploy key made for spark-vllm (ssh-keygen -t ed25519 -N '' -f "
               "~/.ssh/spark-vllm-deploy)")


def secret_problems(values: Mapping[str, str], secret_keys: Collection[str]) -> list[str]:
    """Problems of the secret keys in Pulumi's flat config (`spark-vllm:key` -> text).

    `secret_keys` are the full keys the engine marks secret (PULUMI_CONFIG_SECRET_KEYS). An
    empty value is an unset key (Pulumi.yaml declares the optional ones with default "").
    """
    problems = []
    for key in SECRET_KEYS:
        full = f"{NAMESPACE}:{key}"
        value = values.get(full)
        if not value:
            continue
        if full not in secret_keys:
            problems.append(
                f"{key}: set in plaintext, so the stack file holds it in clear; set it as a "
                f"secret instead: {SET_COMMAND[key]}")
        elif key == "sshPrivateKey":
            if looks_like_placeholder(value):
                problems.append(f"{key}: is a placeholder, not a key; set the key file with "
                                f"{SET_COMMAND[key]}")
            elif problem := private_key_problem(value):
                problems.append(f"{key}: {problem}; set it with {SET_COMMAND[key]}")
        elif looks_like_placeholder(value):
            problems.append(f"{key}: is a placeholder (an example's stand-in), not a real value; "
                            f"set it with {SET_COMMAND[key]}")
    return problems


def present(values: Mapping[str, str]) -> frozenset[str]:
    """The secret keys that are set (non-empty)."""
    return frozenset(k for k in SECRET_KEYS if values.get(f"{NAMESPACE}:{k}"))
