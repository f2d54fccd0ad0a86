"""The tiers' pieces: the row rules by hand, the rows' checksums against the normative page
checksums, the row placement against the reference row writer for every format, and what
offload leaves in host memory."""

from __future__ import annotations

import pytest
import torch

from kvformats import get_format, list_formats
from kvformats.codec.rows import read_rows, write_rows
from kvformats.layout import storage_bytes
from kvformats.transfer import RequestPages, offload
from kvformats.transfer.checksum import reference_checksums
from kvformats.transfer.tiers_checksum import CHUNK_ROWS, checksum_rows, row_spans
from kvformats.transfer.tiers_rows import compressed_rows, place_rows, state_rows, swa_rows


def random_cache(layout, pages: int, seed: int) -> torch.Tensor:
    cache = layout.allocate(pages)
    raw = storage_bytes(cache)
    raw.copy_(torch.randint(0, 256, raw.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.uint8))
    return cache


def test_row_rules_by_hand():
    assert swa_rows(150, 128) == (22, 150) and swa_rows(100, 128) == (0, 100)
    assert compressed_rows(150, 4) == (0, 37) and compressed_rows(150, 128) == (0, 1)
    # ratio 4: the open group (148, 149) and the group before it (144..147): the next window
    assert state_rows(150, 4) == (144, 150) and state_rows(148, 4) == (144, 148) and state_rows(3, 4) == (0, 3)
    # ratio 128: the open group only (no overlap)
    assert state_rows(150, 128) == (128, 150) and state_rows(128, 128) == (128, 128) and state_rows(5, 128) == (0, 5)


@pytest.mark.parametrize("name", list_formats())
def test_checksums_of_rows_are_the_page_checksums_of_a_page_of_64_rows(name):
    """checksum_rows over gathered rows equals reference_checksums of the same rows packed in
    pages of CHUNK_ROWS rows, the last page partly filled (page pads not counted)."""
    layout = get_format(name, page_size=CHUNK_ROWS)
    n = 2 * CHUNK_ROWS + 17
    rows = read_rows(layout, random_cache(layout, 3, 0), torch.arange(3 * CHUNK_ROWS))[:n]
    packed = layout.allocate(3)
    write_rows(layout, packed, torch.arange(n), rows)
    spans = row_spans(layout)
    page_rows = torch.tensor([[0, CHUNK_ROWS], [0, CHUNK_ROWS], [0, 17]])
    want = reference_checksums(layout, packed, torch.arange(3), page_rows)[:, :len(spans)]
    assert torch.equal(checksum_rows(rows, spans), want)


@pytest.mark.parametrize("name", list_formats())
@pytest.mark.parametrize("page_size", [1, 3, 16])
def test_place_rows_writes_what_write_rows_writes_and_nothing_else(name, page_size):
    """Each record at its own place in the destination page (scale records in that page's
    tail), in wide moves where the sizes allow, byte for byte as the reference writer."""
    layout = get_format(name, page_size=page_size)
    rows = read_rows(layout, random_cache(layout, 4, 1), torch.arange(4 * page_size))[:2 * page_size + 1]
    slots = torch.randperm(5 * page_size, generator=torch.Generator().manual_seed(2))[:rows.shape[0]]
    want, got = random_cache(layout, 5, 3), random_cache(layout, 5, 3)
    write_rows(layout, want, slots, rows)
    place_rows(layout, got, slots, rows)
    assert torch.equal(storage_bytes(got), storage_bytes(want))


def test_offload_on_the_cpu_keeps_plain_memory_and_needs_no_wait():
    layout = get_format("fp8_ds_mla", head_dim=128, rope_dim=64, page_size=16)
    cache = random_cache(layout, 4, 0)
    tier = offload({"kv": RequestPages(layout, cache, torch.tensor([2, 0, 3]))}, {"kv": (5, 40)})
    held = tier.caches["kv"]
    assert not held.rows.is_pinned() and tier.events == []
    tier.wait()
    assert (held.start, held.stop, tuple(held.rows.shape)) == (5, 40, (35, layout.row_bytes))
    assert tier.nbytes == 35 * layout.row_bytes
    slots = torch.tensor([2, 0, 3])[torch.arange(5, 40) // 16] * 16 + torch.arange(5, 40) % 16
    assert torch.equal(held.rows, read_rows(layout, cache, slots))
    cache.zero_()  # the tier holds a copy, not a view of the pages
    assert held.rows.any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_offload_from_cuda_lands_in_pinned_memory():
    layout = get_format("fp8_ds_mla", page_size=64)
    cache = random_cache(layout, 4, 0).cuda()
    tier = offload({"kv": RequestPages(layout, cache, torch.tensor([3, 1]))}, {"kv": (0, 100)})
    tier.wait()
    held = tier.caches["kv"]
    assert held.rows.is_pinned() and held.rows.device.type == "cpu" and tier.events == []
    slots = torch.tensor([3, 1])[torch.arange(100) // 64] * 64 + torch.arange(100) % 64
    assert torch.equal(held.rows, read_rows(layout, cache.cpu(), slots))


def test_checksums_can_be_skipped_then_a_verified_restore_is_refused_and_a_file_takes_them(tmp_path):
    from kvformats.errors import InputError
    from kvformats.transfer import load_tier, restore, save_tier

    layout = get_format("fp8_ds_mla", head_dim=128, rope_dim=64, page_size=16)
    src = {"kv": RequestPages(layout, random_cache(layout, 4, 0), torch.tensor([2, 0, 3]))}
    tier = offload(src, {"kv": (5, 40)}, checksums=False)
    assert tier.caches["kv"].checksums is None
    dst_cache = random_cache(layout, 4, 1)
    before = dst_cache.clone()
    dst = {"kv": RequestPages(layout, dst_cache, torch.tensor([1, 3, 0]))}
    with pytest.raises(InputError, match="checksums=False"):
        restore(tier, dst)
    assert torch.equal(dst_cache, before)
    restore(tier, dst, verify=False)
    save_tier(tmp_path / "t.kvc", tier)  # a file always carries them
    assert torch.equal(load_tier(tmp_path / "t.kvc").caches["kv"].checksums,
                       offload(src, {"kv": (5, 40)}).caches["kv"].checksums)
