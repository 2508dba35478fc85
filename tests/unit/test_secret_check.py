"""The secrets are checked for being secret, not only for being there (spark_vllm.components.secret_check):
a plaintext value, an example's placeholder and a key Pulumi's SSH cannot use are refused, each
naming its key and the command, never the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_vllm.components.secret_check import (
    looks_like_placeholder,
    private_key_problem,
    secret_problems,
)

KEYS = Path(__file__).resolve().parents[1] / "fixtures" / "keys"
CLEAR = (KEYS / "clear_ed25519").read_text()
NS = "spark-vllm"
ALL = {f"{NS}:sshPrivateKey", f"{NS}:hfToken", f"{NS}:apiKey"}


def test_real_secrets_set_as_secrets_pass() -> None:
    values = {f"{NS}:sshPrivateKey": CLEAR, f"{NS}:hfToken": "hf_AbCdEfGhIjKlMnOpQrStUv",
              f"{NS}:apiKey": "sk-site-a-7f3c9e21"}
    assert secret_problems(values, ALL) == []


@pytest.mark.parametrize("key", ["sshPrivateKey", "hfToken", "apiKey"])
def test_a_plaintext_secret_is_refused_naming_the_key_and_the_command(key: str) -> None:
    value = CLEAR if key == "sshPrivateKey" else "sk-real-looking-value-123"
    (problem,) = secret_problems({f"{NS}:{key}": value}, ALL - {f"{NS}:{key}"})
    assert problem.startswith(f"{key}: set in plaintext")
    assert f"pulumi config set --secret {NS}:{key}" in problem
    assert value not in problem and "PRIVATE" not in problem


@pytest.mark.parametrize("value", ["SECRET", "HF_TOKEN_VALUE", "API_KEY_VALUE", "<your token>",
                                   "changeme", "xxxxxxxx", "TODO", "..."])
def test_an_examples_placeholder_is_refused(value: str) -> None:
    problems = secret_problems({f"{NS}:hfToken": value, f"{NS}:apiKey": value,
                                f"{NS}:sshPrivateKey": value}, ALL)
    assert [p.split(":")[0] for p in problems] == ["sshPrivateKey", "hfToken", "apiKey"]
    assert all("placeholder" in p and "pulumi config set --secret" in p for p in problems)


@pytest.mark.parametrize("value", ["hf_AbCdEfGhIjKlMnOpQrStUv", "sk-lab-0123abcd", "s3cr3t-Pass",
                                   "Bearer-Token-2026"])
def test_real_looking_values_are_not_placeholders(value: str) -> None:
    assert not looks_like_placeholder(value)


def test_empty_is_unset_not_a_problem() -> None:
    """Pulumi.yaml declares the optional secrets with default "": that is "not set"."""
    assert secret_problems({f"{NS}:hfToken": "", f"{NS}:apiKey": ""}, set()) == []


@pytest.mark.parametrize("name", ["clear_ed25519", "clear_rsa_pem"])
def test_a_passphrase_less_key_is_usable(name: str) -> None:
    assert private_key_problem((KEYS / name).read_text()) is None


@pytest.mark.parametrize("name", ["passphrase_ed25519", "passphrase_rsa_pem"])
def test_a_key_with_a_passphrase_is_refused_with_what_to_use(name: str) -> None:
    (problem,) = secret_problems({f"{NS}:sshPrivateKey": (KEYS / name).read_text()}, ALL)
    assert "has a passphrase" in problem and "ssh-keygen -t ed25519 -N ''" in problem


def test_a_public_key_or_junk_is_not_a_private_key() -> None:
    pub = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ8 ops@host"
    (problem,) = secret_problems({f"{NS}:sshPrivateKey": pub}, ALL)
    assert "is not a private key" in problem and pub not in problem
    broken = "-----BEGIN OPENSSH PRIVATE KEY-----\nbm90IGEga2V5\n-----END OPENSSH PRIVATE KEY-----"
    assert "no openssh-key-v1 header" in (private_key_problem(broken) or "")
