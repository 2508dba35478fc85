import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "slow: starts real Ray nodes and vllm-sim servers on loopback (seconds each)"
    )
