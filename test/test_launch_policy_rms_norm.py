"""rms_norm's CUDA launch policy (csrc/include/baracuda/rms_norm_policy.h) on CPU, with
the recorded facts of an H100 and an H200: every branch of the policy, asserted on
the config's fields. The grid of the kinds that walk rows by grid-stride takes the
kernel's occupancy, modelled from the facts here (the launchers ask the runtime)."""

import pytest
import torch

import baracuda_ops  # noqa: F401  (loads the ops)

FACTS = ["h100", "h200"]
SMS = 132  # both cards
DW_NONE, DW_DIRECT, DW_COLUMNS, DW_ORDERED = range(4)


def config(problem, dtype, facts, backward=False):
    op = "rms_norm_backward" if backward else "rms_norm"
    kind, names, values, workspace = torch.ops.baracuda._launch_config(op, list(problem), dtype, facts)
    return kind, dict(zip(names, values)), workspace


def fwd(m, n, dtype, facts):
    return config((m, n), dtype, facts)


def bwd(m, n, dtype, facts, dw_dtype=None):
    dw_elem = (dw_dtype or dtype).itemsize if dw_dtype is not False else 0
    return config((m, n, dw_elem), dtype, facts, backward=True)


def shape(c):
    kind, p, _ = c
    return kind, p["block"], p["cluster"], p["vpt"]


@pytest.fixture(params=FACTS)
def facts(request):
    return request.param


def test_empty(facts):
    for m, n in [(0, 4096), (4096, 0)]:
        kind, p, ws = fwd(m, n, torch.bfloat16, facts)
        assert kind == "empty" and ws == 0 and p["row_groups"] == 0
        kind, p, ws = bwd(m, n, torch.bfloat16, facts)
        assert kind == "empty" and ws == 0 and p["dw_sum"] == DW_NONE


def test_short_rows_share_a_cta(facts):
    kind, p, _ = fwd(1024, 1024, torch.bfloat16, facts)
    assert kind == "warp_rows" and (p["group"], p["block"], p["vec_bytes"]) == (32, 256, 16)
    assert p["row_groups"] == 1024 // 8  # a CTA per row group
    kind, p, _ = fwd(1024, 64, torch.float32, facts)  # 16 vectors: 4 threads a row
    assert kind == "warp_rows" and (p["group"], p["block"]) == (4, 256)
    kind, p, ws = bwd(4096, 1024, torch.bfloat16, facts)
    assert kind == "warp_rows" and p["dw_sum"] == DW_ORDERED and p["smem"] == 256 * 4 * 8 * 4
    assert ws == p["row_groups"] * 1024 * 4 and 1 < p["row_groups"] <= SMS * 4


def test_unaligned_rows_take_scalar_accesses(facts):
    kind, p, _ = fwd(1024, 1001, torch.bfloat16, facts)
    assert kind == "cta_row" and p["vec_bytes"] == 2 and p["block"] == 256


def test_cta_rows(facts):
    assert shape(fwd(1024, 4096, torch.bfloat16, facts)) == ("cta_row", 128, 1, 4)
    assert fwd(1024, 4096, torch.bfloat16, facts)[1]["row_groups"] == 1024
    assert shape(fwd(SMS + 1, 8192, torch.float32, facts)) == ("cta_row", 512, 1, 4)
    # 4096 vectors: a cluster of 2 at 512 threads, so 8 vectors a thread in one CTA.
    assert shape(fwd(1024, 16384, torch.float32, facts)) == ("cta_row", 512, 1, 8)
    kind, p, ws = bwd(1024, 4096, torch.bfloat16, facts)
    assert (kind, p["block"], p["dw_sum"]) == ("cta_row", 128, DW_ORDERED) and ws == p["row_groups"] * 4096 * 4
    assert p["row_groups"] <= SMS * 8  # at most half the threads an SM holds
    kind, p, ws = bwd(1024, 4096, torch.bfloat16, facts, dw_dtype=False)
    assert kind == "cta_row" and p["dw_sum"] == DW_NONE and p["smem"] == 0 and ws == 0


def test_forward_cluster_rows(facts):
    # Rows that need a cluster hold 8 vectors a thread, half the cluster.
    assert shape(fwd(2048, 65536, torch.bfloat16, facts)) == ("cluster_row", 512, 2, 8)
    assert shape(fwd(512, 262144, torch.bfloat16, facts)) == ("cluster_row", 1024, 4, 8)  # past 512 threads x 8
    assert shape(fwd(4096, 32768, torch.float32, facts)) == ("cluster_row", 512, 2, 8)
    assert shape(fwd(4096, 8192, torch.float64, facts)) == ("cluster_row", 512, 2, 4)  # float64 spills at 8
    kind, p, _ = fwd(2**20, 65536, torch.bfloat16, facts)
    assert kind == "cluster_row" and p["row_groups"] < 2**20  # 16 waves, the rest by grid-stride


def test_two_pass_rows(facts):
    kind, p, _ = fwd(64, 2**20, torch.float32, facts)
    assert (kind, p["block"], p["cluster"], p["vec_bytes"], p["row_groups"]) == ("two_pass_row", 512, 1, 16, 64)
    kind, p, ws = bwd(1, 2**20, torch.bfloat16, facts)
    # A single row group, but the two-pass kernel keeps dW in partial rows.
    assert (kind, p["row_groups"], p["dw_sum"]) == ("two_pass_row", 1, DW_ORDERED) and ws == 2**20 * 4


def test_forward_decode_rows(facts):
    def spread(m, n, dtype):
        kind, p, _ = fwd(m, n, dtype, facts)
        assert kind == "decode_row" and p["row_groups"] == m and p["vec_bytes"] == 16
        return p["block"], p["vpt"]

    assert spread(1, 2048, torch.bfloat16) == (256, 1)
    assert spread(SMS, 4096, torch.bfloat16) == (256, 2)
    assert spread(2, 6000, torch.bfloat16) == (192, 4)
    assert spread(8, 8192, torch.bfloat16) == (256, 4)
    assert spread(8, 4096, torch.float32) == (256, 4)
    assert spread(8, 8192, torch.float32) == (256, 8)
    assert spread(8, 2048, torch.float64) == (512, 2)  # float64: 2 vectors at most, then 512 threads
    assert shape(fwd(SMS + 1, 4096, torch.bfloat16, facts)) == ("cta_row", 128, 1, 4)
    assert shape(fwd(8, 16384, torch.bfloat16, facts)) == ("cta_row", 512, 1, 4)  # 2048 vectors: 8 a thread


def test_backward_decode_rows(facts):
    def decode(m, n, dtype, dw_dtype=None):
        kind, p, ws = bwd(m, n, dtype, facts, dw_dtype)
        assert kind == "decode_row" and ws == 0 and p["row_groups"] == m
        return p["block"], p["vpt"], p["dw_sum"], p["dw_columns"]

    # Up to 512 threads of 1 vector, then of 2, then 1024 threads of 2; a single row
    # writes its dW itself up to 8 KB of it, else column CTAs beside it do.
    assert decode(1, 3000, torch.bfloat16) == (384, 1, DW_DIRECT, 0)
    assert decode(1, 4096, torch.bfloat16) == (512, 1, DW_DIRECT, 0)
    assert decode(1, 2048, torch.float32) == (512, 1, DW_DIRECT, 0)
    assert decode(1, 4096, torch.float32) == (512, 2, DW_COLUMNS, 32)
    assert decode(1, 8192, torch.bfloat16) == (512, 2, DW_COLUMNS, 32)
    assert decode(1, 8192, torch.float32) == (1024, 2, DW_COLUMNS, 64)
    assert decode(1, 16384, torch.bfloat16) == (1024, 2, DW_COLUMNS, 64)
    assert decode(1, 4096, torch.bfloat16, torch.float32) == (512, 1, DW_COLUMNS, 16)  # a 16 KB dW
    assert decode(8, 8192, torch.bfloat16) == (512, 2, DW_COLUMNS, 32)
    assert decode(SMS, 4096, torch.bfloat16) == (512, 1, DW_COLUMNS, 16)
    assert decode(SMS - 64, 8192, torch.float32) == (1024, 2, DW_COLUMNS, 64)
    assert decode(1, 8192, torch.bfloat16, False) == (512, 2, DW_NONE, 0)
    # Past one wave of rows and column CTAs: the register kernel and partial rows.
    kind, p, _ = bwd(SMS + 1, 4096, torch.bfloat16, facts)
    assert (kind, p["block"], p["dw_sum"]) == ("cta_row", 128, DW_ORDERED)
    kind, p, _ = bwd(SMS - 63, 8192, torch.float32, facts)
    assert (kind, p["block"], p["dw_sum"]) == ("cta_row", 512, DW_ORDERED)


def test_backward_cluster_rows(facts):
    # A single row too long for the decode kernel: one vector a thread over a cluster of 8.
    kind, p, ws = bwd(1, 32768, torch.bfloat16, facts)
    assert (kind, p["cluster"], p["block"], p["vpt"], p["ctas_per_sm"]) == ("cluster_row", 8, 512, 1, 2)
    assert p["dw_sum"] == DW_DIRECT and ws == 0 and p["smem"] == 0
    # A few such rows: a cluster of 2 each, two CTAs an SM, a partial row per row group.
    kind, p, ws = bwd(8, 32768, torch.bfloat16, facts)
    assert (kind, p["cluster"], p["block"], p["vpt"], p["ctas_per_sm"]) == ("cluster_row", 2, 512, 4, 2)
    assert (p["row_groups"], p["dw_sum"], ws) == (8, DW_ORDERED, 8 * 32768 * 4)
    # The row groups all run at once: two 512-thread CTAs fill an SM, so clusters of
    # 4 fit at most num_sms / 2 times.
    kind, p, ws = bwd(2048, 65536, torch.bfloat16, facts)
    assert (kind, p["cluster"], p["block"], p["ctas_per_sm"], p["stages"]) == ("cluster_row", 4, 512, 2, 0)
    assert 1 <= p["row_groups"] <= SMS // 2 and ws == p["row_groups"] * 65536 * 4
    assert p["smem"] == 512 * 4 * 8 * 4  # the dW accumulators
    # float32 rows: the same register kernel.
    kind, p, _ = bwd(2048, 65536, torch.float32, facts)
    assert (kind, p["cluster"], p["ctas_per_sm"]) == ("cluster_row", 8, 2)


def test_backward_streamed_cluster_rows(facts):
    # A float32 dW on a half input: one CTA per SM, 3 rows of x and dy staged by
    # bulk copies, so at most num_sms / 4 clusters of 4.
    for dtype in (torch.bfloat16, torch.float16):
        kind, p, ws = bwd(2048, 65536, dtype, facts, torch.float32)
        assert (kind, p["cluster"], p["block"], p["ctas_per_sm"], p["stages"]) == (
            "streamed_cluster_row", 4, 512, 1, 3)
        assert p["smem"] == 3 * 2 * 4 * 512 * 16 and p["dw_sum"] == DW_ORDERED
        assert 1 <= p["row_groups"] <= SMS // 4 and ws == p["row_groups"] * 65536 * 4
    # Not with a half dW, nor without a dW.
    assert bwd(2048, 65536, torch.bfloat16, facts, False)[0] == "cluster_row"
    assert bwd(2048, 65536, torch.bfloat16, facts)[0] == "cluster_row"


def test_facts_differ_only_in_bandwidth():
    # The recorded H100 and H200 differ in copy bandwidth, which the policy does not
    # read: the same configs on both.
    for problem, dtype, backward in [((2048, 65536), torch.bfloat16, False), ((1, 32768, 2), torch.bfloat16, True),
                                     ((4096, 4096, 4), torch.bfloat16, True), ((8, 8192), torch.float32, False)]:
        assert config(problem, dtype, "h100", backward) == config(problem, dtype, "h200", backward)


def test_malformed_problem():
    with pytest.raises(ValueError, match=r"baracuda::rms_norm: malformed problem"):
        config((4, 8, 2), torch.float32, "h200")
    with pytest.raises(ValueError, match=r"baracuda::rms_norm_backward: malformed problem"):
        config((4, 8), torch.float32, "h200", backward=True)
    with pytest.raises(ValueError, match=r"baracuda::rms_norm: dtype must be"):
        config((4, 8), torch.int32, "h200")
