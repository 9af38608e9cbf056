"""The CUDA launch policies of repeat, alibi, embedding_bag, fractional_max_pool, rms_norm and
rms_norm_fused as data (csrc/include/baracuda/<family>_policy.h): every branch of every policy, run on CPU with
the recorded facts of an H100 and an H200, asserting on the config's fields. The configs pinned
here are what the launchers pick on an H200 (rms_norm's row groups of the kinds that walk rows
by grid-stride follow the kernel's occupancy, modelled from the facts here; the launchers ask
the runtime)."""

import pytest
import torch

import baracuda_ops
from launch_configs import LaunchConfig, device_has_recorded_facts, launch_config

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
SMS = 132  # the recorded H100's and H200's
# rms_norm_backward's dw_sum: no dW, written by the row kernel, by column CTAs beside decode
# rows, or an ordered sum of partial rows (one a row group, in the workspace).
DW_NONE, DW_DIRECT, DW_COLUMNS, DW_ORDERED = range(4)

# (op, problem, dtype, kind, params the case pins, workspace bytes)
CASES = [
    # alibi: [B, H, Q, K]. Decode bf16: half a wave at 4 vectors a thread; its float32 twin,
    # past half the GPU's threads, takes 1. Odd K: one element a vector. Past 2^31: i64.
    ("alibi", [64, 16, 1, 4096], BF16, "bias_stream",
     dict(vec_bytes=16, index32=1, threads=256, vectors_per_thread=4, blocks=512), 0),
    ("alibi", [64, 16, 1, 4096], F32, "bias_stream", dict(vec_bytes=16, vectors_per_thread=1, blocks=4096), 0),
    ("alibi", [2, 3, 4, 5], F32, "bias_stream", dict(vec_bytes=4, index32=1, vectors_per_thread=4, blocks=1), 0),
    ("alibi", [1, 1, 2048, 1048576], F16, "bias_stream", dict(index32=0, vectors_per_thread=1, blocks=1048576), 0),
    # alibi_backward: chunks of a head's rows (partials in the workspace), rows cut into
    # segments when whole rows give too few warps, nothing to cut without heads or rows.
    ("alibi_backward", [2, 20, 64, 256], F32, "slope_grad_rows",
     dict(vec_bytes=16, index32=1, threads=256, segments=1, chunks=16), 20 * 16 * 4),
    ("alibi_backward", [8, 32, 1024, 1024], BF16, "slope_grad_rows", dict(segments=1, chunks=66), 32 * 66 * 4),
    ("alibi_backward", [2, 3, 4, 5], F32, "slope_grad_rows", dict(vec_bytes=4, segments=1, chunks=1), 0),
    ("alibi_backward", [2, 0, 4, 8], F32, "slope_grad_rows", dict(segments=1, chunks=1), 0),
    ("alibi_backward", [1, 1, 1, 8192], F64, "slope_grad_rows", dict(segments=32, chunks=4), 4 * 8),
    ("alibi_backward", [1, 1, 2048, 1048576], F16, "slope_grad_rows",
     dict(index32=0, segments=16, chunks=2048), 2048 * 4),
    # repeat: [ndim, *shape, *repeats]. Narrow rows gather; 16+ tiles past L2 gather; rows
    # of 128 bytes or more broadcast, their tiles split when the input is small.
    ("repeat", [2, 4, 8, 2, 2], F32, "tile_gather", dict(vec_bytes=16, index32=1, blocks=1), 0),
    ("repeat", [1, 4096, 8192, 1], BF16, "tile_gather", dict(vec_bytes=16, blocks=16384), 0),
    ("repeat", [2, 1024, 1024, 32, 1], F32, "tile_gather", dict(blocks=32768), 0),
    ("repeat", [2, 1024, 1024, 2, 2], F32, "tile_broadcast", dict(blocks=1024, splits=2, tiles_per_split=2), 0),
    ("repeat", [1, 4096, 4], F32, "tile_broadcast", dict(blocks=4, splits=4, tiles_per_split=1), 0),
    ("repeat", [2, 64, 3, 1, 8], F16, "tile_gather", dict(vec_bytes=2, blocks=6), 0),
    ("repeat", [1, 100, 3], F64, "tile_broadcast", dict(vec_bytes=16, splits=3), 0),
    ("repeat", [1, 50000, 50000], BF16, "tile_gather", dict(index32=0, blocks=1220704), 0),
    # repeat_backward: tile lanes and split partials for a bias-like sum, tile lanes alone
    # when the tiles are too few to split, one-step sums (8-byte vectors, unroll 1, 2 or 4),
    # looped sums, dx kept in L2 or streamed out.
    ("repeat_backward", [1, 4096, 8192, 1], BF16, "tile_sum",
     dict(vec_bytes=16, blocks=16, splits=33, tiles_per_split=249, tile_lanes=8, unroll=4, one_step=0,
          evict_first_dx=0, combine_blocks=128), 33 * 4096 * 4),
    ("repeat_backward", [1, 4096, 64], F32, "tile_sum", dict(splits=1, tile_lanes=8, combine_blocks=0), 0),
    ("repeat_backward", [1, 4096, 1], F32, "tile_sum", dict(vec_bytes=8, tile_lanes=1, unroll=1, one_step=1), 0),
    ("repeat_backward", [2, 1024, 1024, 2, 1], F32, "tile_sum",
     dict(vec_bytes=8, blocks=2048, tile_lanes=1, unroll=2, one_step=1, evict_first_dx=0), 0),
    ("repeat_backward", [2, 1024, 1024, 3, 1], F32, "tile_sum", dict(vec_bytes=8, unroll=4, one_step=1), 0),
    ("repeat_backward", [2, 4096, 4096, 8, 1], BF16, "tile_sum",
     dict(vec_bytes=16, blocks=8192, tile_lanes=1, unroll=4, one_step=0, evict_first_dx=1), 0),
    ("repeat_backward", [1, 3, 5], F32, "tile_sum", dict(vec_bytes=4, tiles_per_split=5, one_step=0), 0),
    # embedding_bag: [num_embeddings, dim, num_indices, num_bags, mode, has_psw]
    ("embedding_bag", [1000, 64, 4096, 128, 0, 0], F32, "bag_gather", dict(team=16, vec_bytes=16, blocks=8), 0),
    ("embedding_bag", [1000, 7, 4096, 128, 1, 0], BF16, "bag_gather", dict(team=8, vec_bytes=2, blocks=4), 0),
    ("embedding_bag", [1000, 1024, 4096, 128, 2, 1], F32, "bag_gather", dict(team=256, blocks=128), 0),
    # embedding_bag_backward (workspace without CUB's sort scratch): late and early fills,
    # 8- and 9-bit sort digits, max mode with and without the won words staged, and a
    # problem with nothing to sum.
    ("embedding_bag_backward", [1000, 64, 4096, 128, 0, 0], F32, "sort_segment",
     dict(team=16, radix_bits=8, early_fill=0, fill_blocks=4, fill_threads=256, sweep_threads=256, sweep_blocks=4,
          stage_won=0, sweep_smem=16384), 103936),
    ("embedding_bag_backward", [200000, 128, 8192, 512, 1, 0], BF16, "sort_segment",
     dict(radix_bits=9, early_fill=1, fill_blocks=66, fill_threads=1024), 1264384),
    ("embedding_bag_backward", [100000, 64, 1000000, 8192, 2, 0], F32, "sort_segment",
     dict(radix_bits=9, early_fill=0, fill_blocks=264, stage_won=1, sweep_smem=24576, sweep_blocks=977), 32625152),
    ("embedding_bag_backward", [100000, 2048, 100000, 8192, 2, 0], F32, "sort_segment",
     dict(team=256, early_fill=1, fill_blocks=98, stage_won=1, sweep_smem=17408), 53702144),
    ("embedding_bag_backward", [1000, 8192, 100, 10, 2, 0], F32, "sort_segment",
     dict(team=256, stage_won=0, sweep_smem=64 * (3 * 4 + 4)), None),
    ("embedding_bag_backward", [1000, 3, 10, 2, 0, 1], F64, "sort_segment",
     dict(team=4, vec_bytes=8, early_fill=1, fill_blocks=1, sweep_threads=128, sweep_smem=40960), 6656),
    ("embedding_bag_backward", [0, 64, 10, 2, 0, 0], F32, "sort_segment", dict(team=16, sweep_blocks=0), 0),
    ("embedding_bag_per_sample_weights_backward", [1000, 64, 4096, 128, 0, 1], F32, "position_dot",
     dict(team=16, vec_bytes=16, blocks=256), 0),
    ("embedding_bag_per_sample_weights_backward", [1000, 1024, 4096, 128, 0, 1], F16, "position_dot",
     dict(team=32, blocks=512), 0),
    ("embedding_bag_per_sample_weights_backward", [1000, 5, 4096, 128, 0, 1], F32, "position_dot",
     dict(team=8, vec_bytes=4, blocks=128), 0),
    # fractional_max_pool: [dims, ndim, *input_shape, *kernel_size, *output_size]. Bands of
    # rows staged (2d, unrolled windows), blocks per segment (disjoint windows), waves of
    # resident blocks (overlapping windows; the grid comes from the kernel's occupancy),
    # windows scanned in loops with inline starts, 64-bit index math.
    ("fractional_max_pool2d", [2, 4, 8, 16, 112, 112, 2, 2, 56, 56], F32, "band_window_max",
     dict(k=2, threads=224, cells_per_thread=4, band_rows=14, band_in_rows=30, bands=4, smem=13744, blocks=512), 0),
    ("fractional_max_pool2d", [2, 4, 8, 16, 112, 112, 3, 3, 80, 80], F32, "band_window_max",
     dict(k=3, threads=160, cells_per_thread=2, band_rows=20, band_in_rows=31, bands=4), 0),
    ("fractional_max_pool3d", [3, 5, 2, 4, 16, 32, 32, 2, 2, 2, 8, 16, 16], BF16, "window_max_segments",
     dict(index32=1, k=2, table=1, threads=256, cells_per_thread=4, smem=160, items=16, blocks=16), 0),
    ("fractional_max_pool2d", [2, 4, 2, 3, 50000, 100, 2, 3, 20000, 50], F32, "window_max_resident",
     dict(k=0, table=0, threads=256, cells_per_thread=1, smem=0, items=23442, waves=2), 0),
    ("fractional_max_pool2d", [2, 4, 1, 1, 2000, 2000, 3, 3, 1000, 1000], F32, "window_max_resident",
     dict(k=3, table=0, cells_per_thread=2, items=1954), 0),
    ("fractional_max_pool2d", [2, 4, 1, 1, 50000, 50000, 2, 2, 100, 100], F32, "window_max_segments",
     dict(index32=0, k=0, table=1, cells_per_thread=1, smem=200 * 8), 0),
    # fractional_max_pool backward: owned boxes (integer strides), tile counts over one or
    # more tiles a plane (a stray fixup past one), tiles shrunk to fit the shared memory,
    # tile stores (disjoint windows), 64-bit index math, and an empty batch.
    ("fractional_max_pool2d_backward", [2, 4, 8, 16, 112, 112, 2, 2, 56, 56], F32, "owned_boxes",
     dict(index32=1, blocks=512, block_cells=784, stride_h=2, stride_w=2, fixup_group=1, fixup_blocks=128), 2048),
    ("fractional_max_pool2d_backward", [2, 4, 1, 1, 514, 8, 2, 2, 257, 4], BF16, "owned_boxes",
     dict(blocks=2, block_cells=516), 8),  # 1028 cells: two blocks of whole units of 4 cells
    ("fractional_max_pool2d_backward", [2, 4, 8, 16, 112, 112, 3, 3, 56, 56], F32, "tile_counts",
     dict(blocks=256, tile_h=56, tile_w=112, tiles=2, box_cells=1624, whole_rows=1, smem=50112, fixup_blocks=128),
     1024),
    ("fractional_max_pool2d_backward", [2, 4, 8, 16, 20, 20, 3, 3, 10, 10], F32, "tile_counts",
     dict(tiles=1, smem=3200, fixup_group=0, fixup_blocks=0), 512),
    ("fractional_max_pool3d_backward", [3, 5, 8, 32, 32, 64, 64, 3, 3, 3, 16, 32, 32], F32, "tile_counts",
     dict(tile_t=2, tile_h=64, tile_w=64, tiles=16, box_cells=3072, smem=72736, fixup_blocks=256), 16384),
    ("fractional_max_pool3d_backward", [3, 5, 8, 32, 32, 64, 64, 2, 2, 2, 16, 32, 32], F32, "owned_boxes",
     dict(blocks=4096, block_cells=1024, stride_t=2, stride_h=2, stride_w=2), 16384),
    ("fractional_max_pool2d_backward", [2, 4, 8, 16, 9, 12, 3, 3, 3, 4], BF16, "tile_stores",
     dict(tiles=1, box_cells=12, smem=256, fixup_blocks=0), 512),
    ("fractional_max_pool2d_backward", [2, 4, 1, 1, 50000, 50000, 2, 2, 100, 100], F32, "tile_stores",
     dict(index32=0), None),
    ("fractional_max_pool2d_backward", [2, 4, 70000, 1, 100, 100, 2, 2, 50, 50], F32, "owned_boxes",
     dict(blocks=210000, fixup_group=32, fixup_blocks=2112), 840000),
    ("fractional_max_pool2d_backward", [2, 4, 0, 16, 112, 112, 2, 2, 56, 56], F32, "owned_boxes",
     dict(blocks=0, fixup_blocks=0), 0),
    # rms_norm: [M, N]. Nothing to run without rows or columns. Short rows share a CTA, a
    # sub-warp each; N not a multiple of a 16-byte vector takes scalar accesses; a row per CTA
    # (a CTA per row group); rows that need a cluster hold 8 vectors a thread, half the cluster
    # (float64 spills at 8: 4); rows too long for registers read x twice.
    ("rms_norm", [0, 4096], BF16, "empty", dict(row_groups=0), 0),
    ("rms_norm", [4096, 0], BF16, "empty", dict(row_groups=0), 0),
    ("rms_norm", [1024, 1024], BF16, "warp_rows", dict(vec_bytes=16, group=32, block=256, row_groups=1024 // 8), 0),
    ("rms_norm", [1024, 64], F32, "warp_rows", dict(group=4, block=256), 0),
    ("rms_norm", [1024, 1001], BF16, "cta_row", dict(vec_bytes=2, block=256), 0),
    ("rms_norm", [1024, 4096], BF16, "cta_row", dict(block=128, cluster=1, vpt=4, row_groups=1024), 0),
    ("rms_norm", [SMS + 1, 8192], F32, "cta_row", dict(block=512, cluster=1, vpt=4, stages=0), 0),
    # 4096 vectors: a cluster of 2 at 512 threads, so 8 vectors a thread in one CTA, on an H200
    # too; longer rows: BANDWIDTH_CASES.
    ("rms_norm", [1024, 16384], F32, "cta_row", dict(block=512, cluster=1, vpt=8, stages=0), 0),
    ("rms_norm", [4096, 32768], BF16, "cta_row", dict(block=512, cluster=1, vpt=8, stages=0), 0),
    ("rms_norm", [4096, 8192], F64, "cluster_row", dict(block=512, cluster=2, vpt=4), 0),
    ("rms_norm", [64, 2**20], F32, "two_pass_row", dict(vec_bytes=16, block=512, cluster=1, row_groups=64), 0),
    # rms_norm decode rows (no more rows than SMs, a CTA each): at most 256 threads of 1, 2, 4
    # or 8 vectors (float64: 2 at most, then 512 threads); past that, rows of a CTA.
    ("rms_norm", [1, 2048], BF16, "decode_row", dict(vec_bytes=16, block=256, vpt=1, row_groups=1), 0),
    ("rms_norm", [SMS, 4096], BF16, "decode_row", dict(vec_bytes=16, block=256, vpt=2, row_groups=SMS), 0),
    ("rms_norm", [2, 6000], BF16, "decode_row", dict(vec_bytes=16, block=192, vpt=4, row_groups=2), 0),
    ("rms_norm", [8, 8192], BF16, "decode_row", dict(vec_bytes=16, block=256, vpt=4, row_groups=8), 0),
    ("rms_norm", [8, 4096], F32, "decode_row", dict(vec_bytes=16, block=256, vpt=4, row_groups=8), 0),
    ("rms_norm", [8, 8192], F32, "decode_row", dict(vec_bytes=16, block=256, vpt=8, row_groups=8), 0),
    ("rms_norm", [8, 2048], F64, "decode_row", dict(vec_bytes=16, block=512, vpt=2, row_groups=8), 0),
    ("rms_norm", [SMS + 1, 4096], BF16, "cta_row", dict(block=128, cluster=1, vpt=4), 0),
    ("rms_norm", [8, 16384], BF16, "cta_row", dict(block=512, cluster=1, vpt=4), 0),  # 2048 vectors: 8 a thread
    # rms_norm_backward: [M, N, grad_weight's element size, 0 without dW]. The grid-stride kinds
    # run one wave of row groups, each writing a dW partial row (dw_sum 3); without a dW, none.
    ("rms_norm_backward", [0, 4096, 2], BF16, "empty", dict(row_groups=0, dw_sum=DW_NONE), 0),
    ("rms_norm_backward", [4096, 0, 2], BF16, "empty", dict(row_groups=0, dw_sum=DW_NONE), 0),
    ("rms_norm_backward", [8192, 512, 2], BF16, "warp_rows",
     dict(group=16, block=256, smem=256 * 4 * 8 * 4, row_groups=2 * SMS, dw_sum=DW_ORDERED), 2 * SMS * 512 * 4),
    # Rows of one CTA of 512 threads and float32 rows: the register kernel, dW slots in shared
    # memory, on either device (half-input rows of fewer threads, and the next row fetched
    # into L2 by rows of 512 threads: BANDWIDTH_CASES).
    ("rms_norm_backward", [1024, 4096, 4], F32, "cta_row",
     dict(block=256, stages=0, smem=256 * 4 * 4 * 4, dw_sum=DW_ORDERED), None),
    # A single row too long for registers: the two-pass kernel keeps dW in a partial row.
    ("rms_norm_backward", [1, 2**20, 2], BF16, "two_pass_row", dict(row_groups=1, dw_sum=DW_ORDERED), 2**20 * 4),
    # rms_norm_backward decode rows: up to 512 threads of 1 vector, then of 2, then 1024
    # threads of 2. A single row writes its dW itself up to 8 KB of it, else column CTAs
    # (32 vectors each) beside the rows sum it, while rows and column CTAs fit one wave.
    ("rms_norm_backward", [1, 3000, 2], BF16, "decode_row",
     dict(block=384, vpt=1, row_groups=1, dw_sum=DW_DIRECT, dw_columns=0), 0),
    ("rms_norm_backward", [1, 4096, 2], BF16, "decode_row",
     dict(block=512, vpt=1, row_groups=1, dw_sum=DW_DIRECT, dw_columns=0), 0),
    ("rms_norm_backward", [1, 2048, 4], F32, "decode_row",
     dict(block=512, vpt=1, row_groups=1, dw_sum=DW_DIRECT, dw_columns=0), 0),
    ("rms_norm_backward", [1, 4096, 4], F32, "decode_row",
     dict(block=512, vpt=2, row_groups=1, dw_sum=DW_COLUMNS, dw_columns=32), 0),
    ("rms_norm_backward", [1, 8192, 2], BF16, "decode_row",
     dict(block=512, vpt=2, row_groups=1, dw_sum=DW_COLUMNS, dw_columns=32), 0),
    ("rms_norm_backward", [1, 8192, 4], F32, "decode_row",
     dict(block=1024, vpt=2, row_groups=1, dw_sum=DW_COLUMNS, dw_columns=64), 0),
    ("rms_norm_backward", [1, 16384, 2], BF16, "decode_row",
     dict(block=1024, vpt=2, row_groups=1, dw_sum=DW_COLUMNS, dw_columns=64), 0),
    ("rms_norm_backward", [1, 4096, 4], BF16, "decode_row",  # a float32 weight: a 16 KB dW
     dict(block=512, vpt=1, dw_sum=DW_COLUMNS, dw_columns=16), 0),
    ("rms_norm_backward", [8, 8192, 2], BF16, "decode_row",
     dict(block=512, vpt=2, row_groups=8, dw_sum=DW_COLUMNS, dw_columns=32), 0),
    ("rms_norm_backward", [SMS, 4096, 2], BF16, "decode_row",
     dict(block=512, vpt=1, row_groups=SMS, dw_sum=DW_COLUMNS, dw_columns=16), 0),
    ("rms_norm_backward", [SMS - 64, 8192, 4], F32, "decode_row",
     dict(block=1024, vpt=2, row_groups=SMS - 64, dw_sum=DW_COLUMNS, dw_columns=64), 0),
    ("rms_norm_backward", [1, 8192, 0], BF16, "decode_row",
     dict(block=512, vpt=2, row_groups=1, dw_sum=DW_NONE, dw_columns=0), 0),
    ("rms_norm_backward", [SMS - 63, 8192, 4], F32, "cta_row", dict(block=512, dw_sum=DW_ORDERED), None),
    # rms_norm_backward cluster rows: a single row too long for the decode kernel, one vector a
    # thread over a cluster of 8; a few such rows, a cluster of 2 each. Two CTAs an SM (64
    # registers), so clusters of 4 of 512 threads fit SMS / 2 times (one wave); float32 rows
    # the same register kernel.
    ("rms_norm_backward", [1, 32768, 2], BF16, "cluster_row",
     dict(cluster=8, block=512, vpt=1, ctas_per_sm=2, smem=0, row_groups=1, dw_sum=DW_DIRECT), 0),
    ("rms_norm_backward", [8, 32768, 2], BF16, "cluster_row",
     dict(cluster=2, block=512, vpt=4, ctas_per_sm=2, row_groups=8, dw_sum=DW_ORDERED), 8 * 32768 * 4),
    ("rms_norm_backward", [2048, 65536, 4], F32, "cluster_row", dict(cluster=8, ctas_per_sm=2), None),
    # A float32 dW on a half input: the streamed kernel, 3 rows of x and dy staged by bulk
    # copies (BANDWIDTH_CASES: its CTAs by device). Rows of 131072 fill a cluster of eight
    # 512-thread CTAs on every device: one CTA an SM, SMS / 8 clusters.
    ("rms_norm_backward", [256, 131072, 4], BF16, "streamed_cluster_row",
     dict(cluster=8, block=512, ctas_per_sm=1, stages=3, smem=3 * 2 * 4 * 512 * 16, row_groups=SMS // 8,
          dw_sum=DW_ORDERED), SMS // 8 * 131072 * 4),
    # rms_norm_fused (and rms_norm_quant): [M, N, H]. Rows of whole 16-byte vectors in registers,
    # 4 vectors a thread up to 1024 threads (longer rows, of 8 vectors a thread: BANDWIDTH_CASES;
    # float64: 1024 x 8, no clusters). Rows of 4 vectors a thread: a CTA per row group;
    # of 8: a row group (CTA or cluster) per row group while the device holds them (by threads:
    # 2048 an SM), one wave. Decode rows (no more than SMS): 2 vectors a thread, 4 past 256
    # threads, the weight loaded with x. Rows not of whole vectors, or longer than registers hold:
    # a CTA a row.
    ("rms_norm_fused", [0, 4096, 1], BF16, "empty", dict(row_groups=0), 0),
    ("rms_norm_fused", [4096, 4096, 1], BF16, "register_rows",
     dict(threads=128, group=128, vpt=4, cluster=1, row_groups=4096, one_wave=0), 0),
    ("rms_norm_fused", [131072, 1024, 1], BF16, "register_rows",
     dict(threads=256, group=32, vpt=4, row_groups=131072 // 8, one_wave=0), 0),
    ("rms_norm_fused", [4096, 32768, 1], BF16, "register_rows",
     dict(threads=1024, vpt=4, row_groups=4096, one_wave=0), 0),
    ("rms_norm_fused", [4096, 16384, 1], F32, "register_rows",
     dict(threads=1024, vpt=4, row_groups=4096, one_wave=0), 0),
    ("rms_norm_fused", [64, 8192, 1], F64, "register_rows", dict(threads=1024, vpt=4), 0),
    ("rms_norm_fused", [64, 16384, 1], F64, "register_rows", dict(threads=1024, vpt=8), 0),
    ("rms_norm_fused", [64, 32768, 1], F64, "cta_rows", dict(threads=1024, row_groups=64), 0),
    ("rms_norm_fused", [SMS + 1, 4096, 1], BF16, "register_rows", dict(threads=128, vpt=4), 0),
    ("rms_norm_fused", [4096, 1000, 1], F16, "register_rows",
     dict(threads=256, group=32, vpt=4, row_groups=512, one_wave=0), 0),
    ("rms_norm_fused", [1, 4096, 1], BF16, "decode_rows", dict(threads=512, group=512, vpt=1, row_groups=1), 0),
    ("rms_norm_fused", [8, 8192, 1], BF16, "decode_rows", dict(threads=512, vpt=2, row_groups=8, one_wave=0), 0),
    ("rms_norm_fused", [SMS, 1024, 1], BF16, "decode_rows", dict(threads=128, vpt=1, row_groups=SMS), 0),
    ("rms_norm_fused", [5, 8, 2], F32, "decode_rows", dict(threads=256, group=2, vpt=1, row_groups=1), 0),
    ("rms_norm_fused", [1, 16384, 1], BF16, "register_rows", dict(threads=512, vpt=4, row_groups=1), 0),
    ("rms_norm_quant", [1, 4096, 1], BF16, "decode_rows", dict(threads=512, vpt=1), 0),
    ("rms_norm_fused", [4096, 1001, 1], BF16, "cta_rows", dict(threads=256, group=0, row_groups=8 * SMS), 0),
    # rms_norm_fused_backward: [M, N, H, grad_weight's element size, 0 without dW]. Register rows of
    # 2 vectors a thread (4 past 512 threads), 512 x 2 capped for two CTAs an SM; a wave of half the
    # CTAs the device holds by threads, a dW partial row each. Longer rows: a row a cluster of
    # 512-thread CTAs, 2 vectors a thread (two CTAs an SM) while a cluster of 8 holds it, else 4.
    # The dW of a per-head weight, and rows longer than a cluster of 8 holds: a CTA a row. (16-bit
    # rows of 64 to 512 threads x 4 past the decode rows are streamed on an H200: BANDWIDTH_CASES.)
    ("rms_norm_fused_backward", [4096, 0, 1, 2], BF16, "empty", dict(row_groups=0), 0),
    ("rms_norm_fused_backward", [4096, 2048, 1, 4], F32, "register_rows",
     dict(threads=256, group=256, vpt=2, ctas_per_sm=1, stages=0, row_groups=4 * SMS), 4 * SMS * 2048 * 4),
    ("rms_norm_fused_backward", [SMS, 4096, 1, 2], BF16, "register_rows",
     dict(threads=256, group=256, vpt=2, ctas_per_sm=1, stages=0, row_groups=SMS), SMS * 4096 * 4),
    ("rms_norm_fused_backward", [4096, 1000, 1, 2], BF16, "register_rows", dict(threads=256, group=32, vpt=4), None),
    ("rms_norm_fused_backward", [16384, 4096, 1, 2], F32, "register_rows",
     dict(threads=512, vpt=2, ctas_per_sm=2, row_groups=2 * SMS), 2 * SMS * 4096 * 4),
    ("rms_norm_fused_backward", [SMS, 32768, 1, 2], BF16, "cluster_rows",
     dict(threads=512, group=512, cluster=4, vpt=2, ctas_per_sm=2, row_groups=SMS // 2), SMS // 2 * 32768 * 4),
    ("rms_norm_fused_backward", [SMS, 65536, 1, 4], BF16, "cluster_rows",
     dict(cluster=8, vpt=2, ctas_per_sm=2, row_groups=SMS // 4), SMS // 4 * 65536 * 4),
    ("rms_norm_fused_backward", [64, 40000, 1, 2], BF16, "cluster_rows", dict(cluster=5, vpt=2, row_groups=52), None),
    ("rms_norm_fused_backward", [1024, 65536, 1, 4], F32, "cluster_rows",
     dict(cluster=8, vpt=4, ctas_per_sm=1, row_groups=SMS // 4), None),
    ("rms_norm_fused_backward", [1024, 16384, 1, 8], F64, "cluster_rows", dict(cluster=8, vpt=2), None),
    ("rms_norm_fused_backward", [1024, 131072, 1, 4], F32, "cta_rows",
     dict(threads=1024, row_groups=2 * SMS), 2 * SMS * 131072 * 4),
    ("rms_norm_fused_backward", [64, 4096, 4, 2], BF16, "cta_rows", dict(threads=1024, row_groups=16),
     16 * 4 * 4096 * 4),
    ("rms_norm_fused_backward", [64, 4096, 4, 0], BF16, "register_rows", dict(threads=256, vpt=2), 0),
    # a per-head weight without its dW: register rows on either device (the streamed kernel holds one weight row)
    ("rms_norm_fused_backward", [4096, 4096, 4, 0], BF16, "register_rows", dict(threads=256, vpt=2, stages=0), 0),
]

def _id(case):
    op, problem, dtype = case[:3]
    return f"{op}-{'x'.join(map(str, problem))}-{str(dtype).removeprefix('torch.')}"


@pytest.mark.parametrize("facts", ["h100", "h200"])
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_policy_picks(case, facts):
    op, problem, dtype, kind, params, workspace = case
    config = launch_config(op, problem, dtype, facts)
    assert config.kind == kind
    assert {name: config[name] for name in params} == params
    if workspace is not None:
        assert config.workspace_bytes == workspace


# Choices that the device's bandwidth class sets: (op, problem, dtype, {facts: (kind, params)}).
# The backward of half-input rows of one CTA streams them (3 rows of x and dy staged, 48 KB at 128
# threads: 4 CTAs an SM) on an H200, where two or more of its CTAs fit an SM's shared memory; on an
# H100 the register kernel keeps them.
BANDWIDTH_CASES = [
    # rms_norm forward rows past 512 x 8 vectors: on an H200 row clusters, a row a cluster of
    # the fewest CTAs of up to 256 threads x 8 vectors (2 to 16), a cluster a row (row_groups =
    # M), whatever the rows; on an H100 the register kernel, whose cluster rows hold 8 vectors
    # a thread in half the cluster (up to 16 waves, then grid-stride), past 8192 vectors
    # 1024-thread CTAs.
    ("rms_norm", [2048, 65536], BF16,
     {"h200": ("row_clusters", dict(block=256, group=256, cluster=4, vpt=8, stages=0, smem=0, row_groups=2048)),
      "h100": ("cluster_row", dict(block=512, cluster=2, vpt=8, stages=0, smem=0, row_groups=2048))}),
    ("rms_norm", [1024, 65536], F32,
     {"h200": ("row_clusters", dict(block=256, cluster=8, vpt=8, row_groups=1024)),
      "h100": ("cluster_row", dict(block=512, cluster=4, vpt=8))}),
    ("rms_norm", [4096, 32768], F32,
     {"h200": ("row_clusters", dict(block=256, cluster=4, vpt=8, row_groups=4096)),
      "h100": ("cluster_row", dict(block=512, cluster=2, vpt=8, stages=0))}),
    ("rms_norm", [2**20, 65536], BF16,
     {"h200": ("row_clusters", dict(row_groups=2**20)),
      "h100": ("cluster_row", dict(row_groups=16 * SMS))}),  # 16 waves, then grid-stride
    ("rms_norm", [SMS, 65536], BF16,
     {"h200": ("row_clusters", dict(cluster=4, vpt=8, row_groups=SMS)),
      "h100": ("cluster_row", dict(cluster=2, vpt=8))}),
    ("rms_norm", [7, 130000], F16,  # 16250 vectors: eight CTAs of 256 x 8, the last one's part short
     {"h200": ("row_clusters", dict(block=256, cluster=8, row_groups=7)),
      "h100": ("cluster_row", dict(block=512, cluster=4, vpt=8))}),
    ("rms_norm", [512, 262144], BF16,  # clusters of 16, past the portable 8
     {"h200": ("row_clusters", dict(block=256, cluster=16, vpt=8, row_groups=512)),
      "h100": ("cluster_row", dict(block=1024, cluster=4, vpt=8, stages=0))}),
    # Forward rows of one 512-thread CTA of 16-bit elements, more rows than SMs: on an H200
    # 256 threads of 8 vectors (four CTAs an SM, twice the bytes in flight); on an H100 512 x 4.
    # Float32 rows and few rows keep 512 x 4 (CASES).
    ("rms_norm", [8192, 16384], BF16,
     {"h200": ("cta_row", dict(block=256, group=256, cluster=1, vpt=8, row_groups=8192)),
      "h100": ("cta_row", dict(block=512, group=512, cluster=1, vpt=4, row_groups=8192))}),
    ("rms_norm", [SMS + 1, 12288], F16,
     {"h200": ("cta_row", dict(block=192, vpt=8)), "h100": ("cta_row", dict(block=384, vpt=4))}),
    # rms_norm_fused backward register rows of 16-bit inputs, 512 x 4 (one CTA an SM): on an H200
    # each CTA fetches its next row into L2; float32 rows, 512 x 2 rows, the forward and the H100
    # do not.
    ("rms_norm_fused_backward", [8192, 16384, 1, 0], BF16,
     {"h200": ("register_rows", dict(threads=512, vpt=4, ctas_per_sm=1, cluster=1, stages=0, prefetch_next=1)),
      "h100": ("register_rows", dict(threads=512, vpt=4, ctas_per_sm=1, cluster=1, stages=0, prefetch_next=0))}),
    ("rms_norm_fused_backward", [16384, 8192, 1, 4], F32,
     {"h200": ("register_rows", dict(threads=512, vpt=4, prefetch_next=0)),
      "h100": ("register_rows", dict(threads=512, vpt=4, prefetch_next=0))}),
    ("rms_norm_fused_backward", [16384, 4096, 1, 2], F32,
     {"h200": ("register_rows", dict(threads=512, vpt=2, ctas_per_sm=2, prefetch_next=0)),
      "h100": ("register_rows", dict(threads=512, vpt=2, ctas_per_sm=2, prefetch_next=0))}),
    # Backward rows of one 512-thread CTA (one an SM): on an H200 each CTA fetches its next row
    # into L2 while it works on this one; CTAs of fewer threads, cluster rows and the H100 do not.
    ("rms_norm_backward", [1024, 16384, 2], BF16,
     {"h200": ("cta_row", dict(block=512, stages=0, smem=512 * 4 * 8 * 4, prefetch_next=1)),
      "h100": ("cta_row", dict(block=512, stages=0, smem=512 * 4 * 8 * 4, prefetch_next=0))}),
    ("rms_norm_backward", [1024, 8192, 4], F32,
     {"h200": ("cta_row", dict(block=512, prefetch_next=1)), "h100": ("cta_row", dict(block=512, prefetch_next=0))}),
    ("rms_norm_backward", [1024, 5120, 4], F32,
     {"h200": ("cta_row", dict(block=320, prefetch_next=0)), "h100": ("cta_row", dict(block=320, prefetch_next=0))}),
    ("rms_norm_backward", [SMS, 32768, 2], BF16,
     {"h200": ("cluster_row", dict(cluster=2, prefetch_next=0)),
      "h100": ("cluster_row", dict(cluster=2, prefetch_next=0))}),
    # Half-input rows of a whole warp: on an H200 a CTA of 32 threads each, streamed (12 KB of
    # stages: the modelled 16 CTAs an SM, by the kernel's 128-register budget), a dW partial row
    # each (16 CTAs an SM are more than launch clusters keep resident); on an H100 eight a
    # 256-thread CTA, in registers.
    ("rms_norm_backward", [131072, 1024, 2], BF16,
     {"h200": ("streamed_row", dict(group=32, block=32, stages=3, smem=3 * 2 * 4 * 32 * 16, row_groups=16 * SMS,
                                    dw_sum=DW_ORDERED, dw_fold=1)),
      "h100": ("warp_rows", dict(group=32, block=256, stages=0, smem=256 * 4 * 8 * 4, row_groups=2 * SMS,
                                 dw_sum=DW_ORDERED, dw_fold=1))}),
    ("rms_norm_backward", [4096, 768, 0], F16,
     {"h200": ("streamed_row", dict(group=32, block=32, stages=3, dw_sum=DW_NONE, dw_fold=1)),
      "h100": ("warp_rows", dict(group=32, block=256, dw_sum=DW_NONE))}),
    # 4 to 8 CTAs an SM: launched in clusters of an SM's share that fold their dW sums into one
    # partial row (dw_fold); 2 an SM, a partial row each. Rows of one CTA refill a stage after
    # the next row's block sum, whose barrier they already wait at (refill_after_dx=0).
    ("rms_norm_backward", [1024, 4096, 2], BF16,
     {"h200": ("streamed_row", dict(block=128, stages=3, smem=3 * 2 * 4 * 128 * 16, row_groups=4 * SMS,
                                    dw_sum=DW_ORDERED, dw_fold=4, refill_after_dx=False)),
      "h100": ("cta_row", dict(block=128, stages=0, smem=128 * 4 * 8 * 4, row_groups=4 * SMS, dw_sum=DW_ORDERED))}),
    ("rms_norm_backward", [1024, 4096, 0], BF16,
     {"h200": ("streamed_row", dict(block=128, stages=3, dw_sum=DW_NONE, dw_fold=1)),
      "h100": ("cta_row", dict(block=128, smem=0, dw_sum=DW_NONE))}),
    ("rms_norm_backward", [1024, 8192, 4], BF16,
     {"h200": ("streamed_row", dict(block=256, stages=3, smem=3 * 2 * 4 * 256 * 16, row_groups=2 * SMS, dw_fold=1)),
      "h100": ("cta_row", dict(block=256, stages=0))}),
    ("rms_norm_backward", [1100, 2048, 2], BF16,
     {"h200": ("streamed_row", dict(block=64, row_groups=8 * SMS, dw_fold=8)),
      "h100": ("cta_row", dict(block=64, dw_fold=1))}),
    # A wave that does not fill the SMs evenly (a CTA a row): a partial row a CTA.
    ("rms_norm_backward", [SMS + 1, 4096, 2], F16,
     {"h200": ("streamed_row", dict(block=128, dw_sum=DW_ORDERED, row_groups=SMS + 1, dw_fold=1)),
      "h100": ("cta_row", dict(block=128, dw_sum=DW_ORDERED))}),
    # rms_norm_fused_backward of 16-bit rows of 64 to 512 threads x 4 vectors past the decode rows:
    # on an H200 dy, h and dres staged in shared memory (sized for all three), 3 rows ahead, 2 at
    # N = 8192 (two CTAs an SM); as many CTAs as shared memory holds, the CTAs of an SM's share
    # folding their dW sums into one partial row where they are 4 to 8 (dw_fold). On an H100
    # register rows.
    ("rms_norm_fused_backward", [4096, 2048, 1, 2], BF16,
     {"h200": ("streamed_rows", dict(threads=64, group=64, vpt=4, stages=3, smem=3 * 3 * 4 * 64 * 16,
                                     row_groups=6 * SMS, dw_fold=6)),
      "h100": ("register_rows", dict(threads=128, group=128, vpt=2, stages=0, smem=0, dw_fold=1))}),
    ("rms_norm_fused_backward", [4096, 4096, 1, 2], BF16,
     {"h200": ("streamed_rows", dict(threads=128, vpt=4, stages=3, smem=3 * 3 * 4 * 128 * 16, row_groups=3 * SMS,
                                     dw_fold=1)),
      "h100": ("register_rows", dict(threads=256, vpt=2, stages=0, row_groups=4 * SMS))}),
    ("rms_norm_fused_backward", [4096, 2560, 1, 0], F16,
     {"h200": ("streamed_rows", dict(threads=128, vpt=4, stages=3, row_groups=3 * SMS, dw_fold=1)),
      "h100": ("register_rows", dict(threads=256, vpt=2))}),
    ("rms_norm_fused_backward", [16384, 8192, 1, 2], BF16,
     {"h200": ("streamed_rows", dict(threads=256, vpt=4, stages=2, smem=2 * 3 * 4 * 256 * 16, row_groups=2 * SMS,
                                     dw_fold=1)),
      "h100": ("register_rows", dict(threads=512, vpt=2, ctas_per_sm=2, row_groups=2 * SMS))}),
    ("rms_norm_fused_backward", [4096, 4096, 1, 2, 0], BF16,  # grad_out or h not bfloat16: register rows
     {"h200": ("register_rows", dict(threads=256, vpt=2, stages=0, row_groups=4 * SMS)),
      "h100": ("register_rows", dict(threads=256, vpt=2, stages=0, row_groups=4 * SMS))}),
    ("rms_norm_fused_backward", [SMS + 1, 4096, 1, 4], BF16,
     {"h200": ("streamed_rows", dict(threads=128, row_groups=SMS + 1, dw_fold=1)),
      "h100": ("register_rows", dict(threads=256, row_groups=SMS + 1))}),
    # The backward of cluster rows with a float32 dW on a half input: the streamed kernel, 3 rows
    # of x and dy staged, each stage refilled as soon as its row's dx is written. On an H200 CTAs
    # of at most 256 threads, the cluster widened (96 KB: two CTAs an SM, SMS / 4 clusters of 8
    # at N = 65536, SMS / 2 of 4 at 32768; at 40000, 5000 vectors, eight CTAs of 160 threads,
    # three an SM); on an H100 512-thread CTAs, one an SM.
    ("rms_norm_backward", [2048, 65536, 4], BF16,
     {"h200": ("streamed_cluster_row", dict(cluster=8, block=256, group=256, ctas_per_sm=1, stages=3,
                                            smem=3 * 2 * 4 * 256 * 16, row_groups=SMS // 4, dw_sum=DW_ORDERED,
                                            refill_after_dx=True)),
      "h100": ("streamed_cluster_row", dict(cluster=4, block=512, group=512, ctas_per_sm=1, stages=3,
                                            smem=3 * 2 * 4 * 512 * 16, row_groups=SMS // 4, dw_sum=DW_ORDERED,
                                            refill_after_dx=True))}),
    ("rms_norm_backward", [2048, 65536, 4], F16,
     {"h200": ("streamed_cluster_row", dict(cluster=8, block=256, row_groups=SMS // 4)),
      "h100": ("streamed_cluster_row", dict(cluster=4, block=512, row_groups=SMS // 4))}),
    ("rms_norm_backward", [4096, 32768, 4], BF16,
     {"h200": ("streamed_cluster_row", dict(cluster=4, block=256, smem=3 * 2 * 4 * 256 * 16, row_groups=SMS // 2)),
      "h100": ("streamed_cluster_row", dict(cluster=2, block=512, smem=3 * 2 * 4 * 512 * 16, row_groups=SMS // 2))}),
    ("rms_norm_backward", [300, 40000, 4], F16,
     {"h200": ("streamed_cluster_row", dict(cluster=8, block=160, row_groups=3 * SMS // 8)),
      "h100": ("streamed_cluster_row", dict(cluster=4, block=320, row_groups=SMS // 4))}),
    # A 16-bit dW (or none), more rows than SMs: on an H200 the same streamed CTAs; on an H100
    # two register CTAs of 512 threads an SM (no more rows than SMs: the register kernel on
    # both, CASES).
    ("rms_norm_backward", [2048, 65536, 2], BF16,
     {"h200": ("streamed_cluster_row", dict(cluster=8, block=256, stages=3, smem=3 * 2 * 4 * 256 * 16,
                                            row_groups=SMS // 4, dw_sum=DW_ORDERED, refill_after_dx=True)),
      "h100": ("cluster_row", dict(cluster=4, block=512, ctas_per_sm=2, stages=0, smem=512 * 4 * 8 * 4,
                                   row_groups=SMS // 2, dw_sum=DW_ORDERED, refill_after_dx=False))}),
    ("rms_norm_backward", [2048, 65536, 0], BF16,
     {"h200": ("streamed_cluster_row", dict(cluster=8, block=256, dw_sum=DW_NONE)),
      "h100": ("cluster_row", dict(cluster=4, dw_sum=DW_NONE))}),
    ("rms_norm_backward", [1024, 32768, 2], BF16,
     {"h200": ("streamed_cluster_row", dict(cluster=4, block=256, row_groups=SMS // 2, refill_after_dx=True)),
      "h100": ("cluster_row", dict(cluster=2, block=512, prefetch_next=0))}),
    # rms_norm_fused_backward cluster rows of dy, h and dres in the input's dtype, more rows than
    # SMs: on an H200 streamed over the fewest CTAs (2 to 16) of at most 128 threads, where they
    # leave three CTAs an SM (3 rows of the CTA's slices of dy, h and dres staged: 72 KB at 128
    # threads), else (N = 65536 float32: 256 threads in 16 CTAs) the register kernel. On an H100
    # the register kernel: 512 x 2, two CTAs an SM.
    ("rms_norm_fused_backward", [4096, 32768, 1, 2], BF16,
     {"h200": ("streamed_cluster_rows", dict(threads=128, group=128, cluster=8, vpt=4, stages=3,
                                             smem=3 * 3 * 4 * 128 * 16, row_groups=3 * SMS // 8)),
      "h100": ("cluster_rows", dict(threads=512, cluster=4, vpt=2, ctas_per_sm=2, stages=0, row_groups=SMS // 2))}),
    ("rms_norm_fused_backward", [8192, 16384, 1, 4], F32,
     {"h200": ("streamed_cluster_rows", dict(threads=128, cluster=8, smem=3 * 3 * 4 * 128 * 16)),
      "h100": ("cluster_rows", dict(threads=512, cluster=4, vpt=2))}),
    ("rms_norm_fused_backward", [4096, 32768, 1, 4], F32,
     {"h200": ("streamed_cluster_rows", dict(threads=128, cluster=16, smem=3 * 3 * 4 * 128 * 16,
                                             row_groups=3 * SMS // 16)),
      "h100": ("cluster_rows", dict(threads=512, cluster=8, vpt=2))}),
    ("rms_norm_fused_backward", [300, 40000, 1, 2], F16,  # 1250 threads a row: 10 CTAs of 128
     {"h200": ("streamed_cluster_rows", dict(threads=128, cluster=10, row_groups=3 * SMS // 10)),
      "h100": ("cluster_rows", dict(threads=512, cluster=5, vpt=2))}),
    ("rms_norm_fused_backward", [2048, 65536, 1, 4], BF16,
     {"h200": ("streamed_cluster_rows", dict(threads=128, cluster=16, vpt=4, stages=3, smem=3 * 3 * 4 * 128 * 16,
                                             row_groups=3 * SMS // 16)),
      "h100": ("cluster_rows", dict(threads=512, cluster=8, vpt=2, ctas_per_sm=2, row_groups=SMS // 4))}),
    ("rms_norm_fused_backward", [2048, 65536, 1, 4], F32,
     {"h200": ("cluster_rows", dict(threads=512, cluster=8, vpt=4)),
      "h100": ("cluster_rows", dict(threads=512, cluster=8, vpt=4))}),
    # rms_norm_fused forward rows past 1024 x 4 vectors: on an H200 (an input of at most 4 bytes, its
    # residual of its dtype) a row a cluster of 2 to 16 CTAs of up to 256 threads x 8 vectors, a cluster
    # per row (row_groups = M); on an H100 (or with a float32 residual on a 16-bit input) 1024 x 8
    # register rows, then clusters of 512 x 8 (one wave of row groups by threads).
    ("rms_norm_fused", [4096, 65536, 1], BF16,
     {"h200": ("row_clusters", dict(threads=256, group=256, cluster=4, vpt=8, row_groups=4096, one_wave=0)),
      "h100": ("register_rows", dict(threads=1024, vpt=8, row_groups=2 * SMS, one_wave=1, prefetch_next=0))}),
    ("rms_norm_fused", [4096, 65536, 1, 0], BF16,  # a float32 residual
     {"h200": ("register_rows", dict(threads=1024, vpt=8, row_groups=2 * SMS, one_wave=1)),
      "h100": ("register_rows", dict(threads=1024, vpt=8, row_groups=2 * SMS, one_wave=1))}),
    ("rms_norm_fused", [4096, 32768, 1], F32,
     {"h200": ("row_clusters", dict(threads=256, cluster=4, vpt=8, row_groups=4096)),
      "h100": ("register_rows", dict(threads=1024, vpt=8))}),
    ("rms_norm_fused", [300, 40000, 1], F16,  # 625 threads a row: 3 CTAs of 224
     {"h200": ("row_clusters", dict(threads=224, cluster=3, vpt=8, row_groups=300)),
      "h100": ("register_rows", dict(threads=1024, vpt=8))}),
    ("rms_norm_fused", [4096, 131072, 1], BF16,
     {"h200": ("row_clusters", dict(threads=256, cluster=8, vpt=8, row_groups=4096)),
      "h100": ("cluster_rows", dict(threads=512, group=512, cluster=4, vpt=8, row_groups=SMS, one_wave=1))}),
    ("rms_norm_fused", [8, 262144, 1], BF16,  # clusters of 16, past the portable 8
     {"h200": ("row_clusters", dict(threads=256, cluster=16, vpt=8, row_groups=8)),
      "h100": ("cluster_rows", dict(threads=512, cluster=8, vpt=8, row_groups=8))}),
    ("rms_norm_fused", [64, 65536, 1], F32,
     {"h200": ("row_clusters", dict(threads=256, cluster=8, row_groups=64)),
      "h100": ("cluster_rows", dict(threads=512, cluster=4, row_groups=64))}),
    ("rms_norm_quant", [4096, 65536, 1], F32,
     {"h200": ("row_clusters", dict(cluster=8, vpt=8, row_groups=4096)),
      "h100": ("cluster_rows", dict(cluster=4, vpt=8, row_groups=SMS))}),
    ("rms_norm_fused_backward", [4096, 32768, 1, 2, 0], BF16,  # grad_out or h not bfloat16: register rows
     {"h200": ("cluster_rows", dict(threads=512, cluster=4, vpt=2)),
      "h100": ("cluster_rows", dict(threads=512, cluster=4, vpt=2))}),
]


@pytest.mark.parametrize("facts", ["h100", "h200"])
@pytest.mark.parametrize("case", BANDWIDTH_CASES, ids=_id)
def test_policy_picks_by_bandwidth(case, facts):
    op, problem, dtype, by_facts = case
    kind, params = by_facts[facts]
    config = launch_config(op, problem, dtype, facts)
    assert config.kind == kind
    assert {name: config[name] for name in params} == params


@pytest.mark.parametrize("op,problem,rows", [
    ("rms_norm_backward", [131072, 1024, 2], 16 * SMS),
    ("rms_norm_backward", [65536, 2048, 2], SMS),
    ("rms_norm_backward", [1024, 8192, 2], 2 * SMS),
    ("rms_norm_backward", [SMS + 1, 4096, 2], SMS + 1),
    ("rms_norm_fused_backward", [4096, 2048, 1, 2], 6 * SMS // 6),
    ("rms_norm_fused_backward", [SMS + 1, 4096, 1, 2], SMS + 1),
])
def test_dw_fold_sizes_the_workspace(op, problem, rows):
    # The workspace holds one float32 dW partial row a launch cluster of dw_fold CTAs.
    config = launch_config(op, problem, BF16, "h200")
    assert config["row_groups"] // config["dw_fold"] == rows
    assert config.workspace_bytes == rows * problem[1] * 4


# The dW sum's CTAs (dw_sum_cols x dw_sum_slices): 32 x 8 over fewer than 512 partial rows,
# 8 x 64 from 512 on; none without partial rows.
@pytest.mark.parametrize("facts", ["h100", "h200"])
@pytest.mark.parametrize("problem,dtype,rows,shape", [
    ([131072, 1024, 2], BF16, {"h200": 16 * SMS, "h100": 2 * SMS}, {"h200": (8, 64), "h100": (32, 8)}),
    ([131072, 1024, 4], F32, {"h200": 8 * SMS, "h100": 8 * SMS}, {"h200": (8, 64), "h100": (8, 64)}),
    ([65536, 2048, 2], BF16, {"h200": SMS, "h100": 8 * SMS}, {"h200": (32, 8), "h100": (8, 64)}),
    ([100000, 2560, 2], BF16, {"h200": SMS, "h100": 5 * SMS}, {"h200": (32, 8), "h100": (8, 64)}),
    ([16384, 8192, 2], BF16, {"h200": 2 * SMS, "h100": 2 * SMS}, {"h200": (32, 8), "h100": (32, 8)}),
    ([32, 4096, 2], BF16, {"h200": 0, "h100": 0}, {"h200": (0, 0), "h100": (0, 0)}),  # dW by column CTAs
    ([4096, 1024, 0], BF16, {"h200": 0, "h100": 0}, {"h200": (0, 0), "h100": (0, 0)}),  # no dW
])
def test_dw_sum_shape_follows_the_partial_rows(problem, dtype, rows, shape, facts):
    config = launch_config("rms_norm_backward", problem, dtype, facts)
    assert config.workspace_bytes == rows[facts] * problem[1] * 4
    assert (config["dw_sum_cols"], config["dw_sum_slices"]) == shape[facts]


def test_h100_and_h200_facts_give_the_same_configs():
    # The facts differ only in DRAM bandwidth, which these choices do not depend on.
    for op, problem, dtype, *_ in CASES:
        assert launch_config(op, problem, dtype, "h100") == launch_config(op, problem, dtype, "h200"), op


def test_every_kind_is_reached():
    kinds = {(op, kind) for op, _, _, kind, _, _ in CASES}
    kinds |= {(op, kind) for op, _, _, by_facts in BANDWIDTH_CASES for kind, _ in by_facts.values()}
    assert kinds == {
        ("alibi", "bias_stream"), ("alibi_backward", "slope_grad_rows"),
        ("repeat", "tile_gather"), ("repeat", "tile_broadcast"), ("repeat_backward", "tile_sum"),
        ("embedding_bag", "bag_gather"), ("embedding_bag_backward", "sort_segment"),
        ("embedding_bag_per_sample_weights_backward", "position_dot"),
        ("fractional_max_pool2d", "band_window_max"), ("fractional_max_pool2d", "window_max_resident"),
        ("fractional_max_pool2d", "window_max_segments"), ("fractional_max_pool3d", "window_max_segments"),
        ("fractional_max_pool2d_backward", "owned_boxes"), ("fractional_max_pool2d_backward", "tile_counts"),
        ("fractional_max_pool2d_backward", "tile_stores"), ("fractional_max_pool3d_backward", "tile_counts"),
        ("fractional_max_pool3d_backward", "owned_boxes"),
        ("rms_norm", "empty"), ("rms_norm", "warp_rows"), ("rms_norm", "cta_row"), ("rms_norm", "cluster_row"),
        ("rms_norm", "decode_row"), ("rms_norm", "two_pass_row"), ("rms_norm", "row_clusters"),
        ("rms_norm_backward", "empty"), ("rms_norm_backward", "warp_rows"), ("rms_norm_backward", "cta_row"),
        ("rms_norm_backward", "cluster_row"), ("rms_norm_backward", "streamed_row"),
        ("rms_norm_backward", "streamed_cluster_row"),
        ("rms_norm_backward", "decode_row"), ("rms_norm_backward", "two_pass_row"),
        ("rms_norm_fused", "empty"), ("rms_norm_fused", "register_rows"), ("rms_norm_fused", "decode_rows"),
        ("rms_norm_fused", "cta_rows"), ("rms_norm_fused", "cluster_rows"), ("rms_norm_fused", "row_clusters"),
        ("rms_norm_quant", "decode_rows"), ("rms_norm_quant", "cluster_rows"), ("rms_norm_quant", "row_clusters"),
        ("rms_norm_fused_backward", "empty"), ("rms_norm_fused_backward", "register_rows"),
        ("rms_norm_fused_backward", "cluster_rows"), ("rms_norm_fused_backward", "cta_rows"),
        ("rms_norm_fused_backward", "streamed_rows"), ("rms_norm_fused_backward", "streamed_cluster_rows"),
    }


def test_fractional_max_pool_3d_ops_share_the_policy():
    problem = [3, 5, 2, 4, 16, 32, 32, 2, 2, 2, 8, 16, 16]
    assert launch_config("fractional_max_pool3d", problem, F32).kind == "window_max_segments"
    assert launch_config("fractional_max_pool3d_backward", problem, F32).kind == "owned_boxes"


def test_describe_is_kind_and_params_in_order():
    config = launch_config("alibi", [64, 16, 1, 4096], BF16)
    assert list(config.params) == ["vec_bytes", "index32", "threads", "vectors_per_thread", "blocks"]
    assert config.describe() == LaunchConfig(config.kind, config.params, 0).describe()


@pytest.mark.parametrize("op, problem, message", [
    ("alibi", [1, 2, 3], "baracuda::alibi: problem must be [B, H, Q, K], got [1, 2, 3]"),
    ("repeat", [3, 4], "baracuda::repeat: malformed problem [3, 4]"),
    ("repeat_backward", [2, 4, 5, 3], "baracuda::repeat_backward: repeats [3] has 1 entries"),
    ("embedding_bag_backward", [1, 2, 3], "baracuda::embedding_bag_backward: malformed problem [1, 2, 3]"),
    ("fractional_max_pool2d", [4, 1], "baracuda::fractional_max_pool: malformed problem [4, 1]"),
    ("rms_norm", [4, 8, 2], "baracuda::rms_norm: malformed problem [4, 8, 2]"),
    ("rms_norm_backward", [4, 8], "baracuda::rms_norm_backward: malformed problem [4, 8]"),
    ("rms_norm_fused", [4, 8], "baracuda::rms_norm_fused: malformed problem [4, 8]"),
    ("rms_norm_fused_backward", [4, 8, 0, 2], "baracuda::rms_norm_fused_backward: malformed problem [4, 8, 0, 2]"),
    ("rms_norm_fused_backward", [4, 8, 1, 2, 2],
     "baracuda::rms_norm_fused_backward: malformed problem [4, 8, 1, 2, 2]"),
])
def test_malformed_problems_are_value_errors(op, problem, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        launch_config(op, problem, F32)


def test_rms_norm_dtype_must_be_floating():
    with pytest.raises(ValueError, match=r"baracuda::rms_norm: dtype must be"):
        launch_config("rms_norm", [4, 8], torch.int32)


@pytest.mark.parametrize("facts", ["h100", "h200"])
def test_rms_norm_backward_row_groups_run_in_one_wave(facts):
    # Every kind that walks rows by grid-stride launches at most the row groups an SM holds
    # at once times the SMs (clusters: ctas_per_sm CTAs an SM), each writing one dW partial
    # row: the workspace is those rows, and nothing without an ordered dW sum.
    for op, problem, dtype, *_ in CASES:
        if op != "rms_norm_backward":
            continue
        config = launch_config(op, problem, dtype, facts)
        acc_bytes = 8 if dtype == F64 else 4
        if config["dw_sum"] == DW_ORDERED:
            assert config.workspace_bytes == config["row_groups"] * problem[1] * acc_bytes, problem
        else:
            assert config.workspace_bytes == 0, problem
        if config.kind in ("empty", "decode_row"):
            continue
        per_sm = config["ctas_per_sm"] if config["cluster"] > 1 else 1024 // config["block"]
        assert 1 <= config["row_groups"] <= SMS * per_sm // config["cluster"], (problem, config)


def test_embedding_bag_backward_past_uint32_is_not_implemented():
    with pytest.raises(NotImplementedError, match="baracuda::embedding_bag_backward: the CUDA kernel needs"):
        launch_config("embedding_bag_backward", [1 << 32, 8, 10, 2, 0, 0], F32)


@pytest.mark.skipif(not torch.cuda.is_available() or not baracuda_ops.build_info()["cuda"],
                    reason="needs a CUDA device and the CUDA build")
def test_plan_variant_is_the_launch_config():
    # On a device the policies see as the recorded H100/H200, the Plan's variant and
    # workspace are the recorded config's (the embedding_bag backward's workspace adds
    # CUB's sort scratch, which only the CUDA build knows).
    device = torch.device("cuda")
    if not device_has_recorded_facts(device):
        pytest.skip("the device's facts are not the recorded ones")
    plans = [
        ("alibi", baracuda_ops.AlibiPlan.select(baracuda_ops.AlibiDescriptor((2, 20, 64, 256), F32, F32, device)),
         [2, 20, 64, 256], F32),
        ("alibi_backward", baracuda_ops.AlibiBackwardPlan.select(
            baracuda_ops.AlibiBackwardDescriptor((2, 20, 64, 256), F32, F32, device)), [2, 20, 64, 256], F32),
        ("repeat", baracuda_ops.RepeatPlan.select(baracuda_ops.RepeatDescriptor((1024, 1024), (2, 2), F32, device)),
         [2, 1024, 1024, 2, 2], F32),
        ("repeat_backward", baracuda_ops.RepeatBackwardPlan.select(
            baracuda_ops.RepeatBackwardDescriptor((4096,), (8192, 1), BF16, device)), [1, 4096, 8192, 1], BF16),
        ("fractional_max_pool2d", baracuda_ops.FractionalMaxPool2dPlan.select(
            baracuda_ops.FractionalMaxPool2dDescriptor((8, 16, 112, 112), (2, 2), (56, 56), F32, device)),
         [2, 4, 8, 16, 112, 112, 2, 2, 56, 56], F32),
        ("fractional_max_pool2d_backward", baracuda_ops.FractionalMaxPool2dBackwardPlan.select(
            baracuda_ops.FractionalMaxPool2dDescriptor((8, 16, 112, 112), (3, 3), (56, 56), F32, device)),
         [2, 4, 8, 16, 112, 112, 3, 3, 56, 56], F32),
        # rms_norm's kinds whose grid needs no occupancy (the others: test_rms_norm.py).
        ("rms_norm", baracuda_ops.RMSNormPlan.select(
            baracuda_ops.RMSNormDescriptor((1024, 4096), (4096,), BF16, device=device)), [1024, 4096], BF16),
        ("rms_norm", baracuda_ops.RMSNormPlan.select(
            baracuda_ops.RMSNormDescriptor((8, 8192), (8192,), BF16, device=device)), [8, 8192], BF16),
        ("rms_norm_backward", baracuda_ops.RMSNormBackwardPlan.select(
            baracuda_ops.RMSNormBackwardDescriptor((1, 4096), (4096,), BF16, device=device)), [1, 4096, 2], BF16),
        ("rms_norm_backward", baracuda_ops.RMSNormBackwardPlan.select(
            baracuda_ops.RMSNormBackwardDescriptor((8, 8192), (8192,), BF16, device=device)), [8, 8192, 2], BF16),
    ]
    for op, plan, problem, dtype in plans:
        config = launch_config(op, problem, dtype)
        assert plan.sku().variant == config.describe(), op
        assert plan.workspace_size() == config.workspace_bytes, op
    desc = baracuda_ops.EmbeddingBagBackwardDescriptor(100000, 64, (1000000,), 8192, "max", device=device)
    plan = baracuda_ops.EmbeddingBagBackwardPlan.select(desc)
    config = launch_config("embedding_bag_backward", [100000, 64, 1000000, 8192, 2, 0], F32)
    assert plan.sku().variant == config.describe()
    assert plan.workspace_size() > config.workspace_bytes
