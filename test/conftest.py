import pytest
import torch

import baracuda_ops

CUDA_OK = baracuda_ops.build_info()["cuda"] and torch.cuda.is_available()


def pytest_report_header(config):
    return f"baracuda_ops build: {baracuda_ops.build_info()}"


@pytest.fixture(
    params=[
        "cpu",
        pytest.param("cuda", marks=pytest.mark.skipif(not CUDA_OK, reason="no CUDA device or CUDA kernels not built")),
    ]
)
def device(request):
    """Every test taking `device` runs on CPU, and on CUDA when a GPU and the CUDA build are present."""
    return torch.device(request.param)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
