"""The benchmarks' sector-level traffic model, on cases counted by hand."""

import torch

import benchmarks.traffic as traffic
import kvformats as kvf

cache_sectors, sector_bytes = traffic.cache_sectors, traffic.sector_bytes


def test_a_full_page_costs_its_minimum_bytes():
    layout = kvf.Fp8DsMla()  # 64 x 576 B token records + 64 x 8 B scale records = 37376 B
    assert cache_sectors(layout, torch.arange(64), layout.page_bytes) * 32 == 37376


def test_one_random_slot_costs_whole_sectors():
    layout = kvf.Fp8DsMla()
    # slot 70: token record at 40896 (sector-aligned, 18 sectors), scales at 74352..74359 (1 sector)
    assert cache_sectors(layout, torch.tensor([70]), 37440) == 19
    # slot 71: token record at 41472 (aligned, 18), scales at 74360..74367 share slot 70's sector
    assert cache_sectors(layout, torch.tensor([70, 71]), 37440) == 37
    # an odd page stride shifts record starts off the sector grid: 577 B -> 19 sectors
    assert cache_sectors(layout, torch.tensor([70]), 37441) == 20


def test_negative_slots_cost_nothing_and_dense_bytes_round_up():
    layout = kvf.Mxfp4Indexer()
    assert cache_sectors(layout, torch.tensor([-1, -1]), layout.page_bytes) == 0
    # slot 0: 64 B values (2 sectors) + 4 B scales (1 sector); 100 dense bytes -> 4 sectors
    assert sector_bytes(layout, "gather", torch.tensor([0, -1]), layout.page_bytes, 100) == 32 * (3 + 4)
