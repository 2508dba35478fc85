"""get_ip() must choose exactly as vLLM's: VLLM_HOST_IP, then the default route, then IPv6,
then 0.0.0.0 with vLLM's warning (vllm/utils/network_utils.py get_ip)."""

import logging
import socket

import pytest
import vllm_sim  # noqa: F401  (installed by make test)
from vllm_sim import network_utils  # noqa: E402
from vllm_sim.network_utils import get_ip  # noqa: E402


class FakeSocket:
    """Stands in for socket.socket: answers or fails per address family, records connects."""

    answers: dict[int, str] = {}
    connects: list[tuple[int, tuple]] = []

    def __init__(self, family: int, kind: int) -> None:
        assert kind == socket.SOCK_DGRAM, "get_ip must only ever 'connect' a UDP socket"
        self.family = family

    def __enter__(self) -> "FakeSocket":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def connect(self, addr: tuple) -> None:
        FakeSocket.connects.append((self.family, addr))
        if self.family not in FakeSocket.answers:
            raise OSError("Network is unreachable")

    def getsockname(self) -> tuple:
        return (FakeSocket.answers[self.family], 40000)


@pytest.fixture
def fake_net(monkeypatch: pytest.MonkeyPatch) -> type[FakeSocket]:
    monkeypatch.delenv("VLLM_HOST_IP", raising=False)
    monkeypatch.delenv("HOST_IP", raising=False)
    FakeSocket.answers = {}
    FakeSocket.connects = []
    monkeypatch.setattr(network_utils.socket, "socket", FakeSocket)
    return FakeSocket


def test_vllm_host_ip_wins_without_touching_the_network(fake_net, monkeypatch):
    fake_net.answers = {socket.AF_INET: "10.231.0.11"}
    monkeypatch.setenv("VLLM_HOST_IP", "192.168.231.11")
    assert get_ip() == "192.168.231.11"
    assert fake_net.connects == []


def test_default_route_source_address_when_unset(fake_net):
    fake_net.answers = {socket.AF_INET: "10.231.0.11", socket.AF_INET6: "fd00::11"}
    assert get_ip() == "10.231.0.11"
    assert fake_net.connects == [(socket.AF_INET, ("8.8.8.8", 80))]


def test_empty_vllm_host_ip_counts_as_unset(fake_net, monkeypatch):
    fake_net.answers = {socket.AF_INET: "10.231.0.11"}
    monkeypatch.setenv("VLLM_HOST_IP", "")
    assert get_ip() == "10.231.0.11"


def test_ipv6_when_ipv4_has_no_route(fake_net):
    fake_net.answers = {socket.AF_INET6: "fd00::11"}
    assert get_ip() == "fd00::11"
    assert fake_net.connects == [
        (socket.AF_INET, ("8.8.8.8", 80)),
        (socket.AF_INET6, ("2001:4860:4860::8888", 80)),
    ]


def test_zero_address_with_vllm_warning_when_no_route(fake_net):
    with pytest.warns(UserWarning, match="Failed to get the IP address, using 0.0.0.0 by default"):
        assert get_ip() == "0.0.0.0"


def test_host_ip_is_ignored_with_vllm_deprecation_warning(fake_net, monkeypatch, caplog):
    fake_net.answers = {socket.AF_INET: "10.231.0.11"}
    monkeypatch.setenv("HOST_IP", "192.168.231.11")
    monkeypatch.setattr(logging.getLogger("vllm_sim"), "propagate", True)
    assert get_ip() == "10.231.0.11"
    assert "HOST_IP is deprecated and ignored" in caplog.text
