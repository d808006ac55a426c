"""gpubatch's own LMDB pages (formats/lmdb_write.py): what the LMDB library reads, and writes on."""

from __future__ import annotations

import random

import pytest

lmdb = pytest.importorskip("lmdb")


def _write(path, shards):
    """``shards`` (lists of (key, value) in ascending key order across them) written as the sink writes them: each
    shard's pages from the file's next free page, then the branch and meta pages; (the pages' counts, leaves)."""
    from gpubatch.formats.lmdb_write import FIRST_PAGE, PS, shard_pages, tree_pages

    leaves: list = []
    counts = {"leaf_pages": 0, "overflow_pages": 0, "entries": 0}
    page = FIRST_PAGE
    with open(path / "data.mdb", "w+b") as f:
        for items in shards:
            buffers, mine, c = shard_pages(items, page)
            f.seek(page * PS)
            for b in buffers:
                f.write(b)
            page += c["pages"]
            leaves += mine
            for k in counts:
                counts[k] += c[k]
        branches, metas, pages = tree_pages(leaves, page, counts)
        f.seek(page * PS)
        f.write(branches)
        f.seek(0)
        f.write(metas)
        assert f.tell() == 2 * PS and pages * PS == f.seek(0, 2)
    return counts, leaves


@pytest.mark.parametrize("per_shard", [50, 1000, 4000])
def test_the_library_reads_every_record_of_pages_gpubatch_wrote(tmp_path, per_shard):
    """Values inline in their leaf node and on overflow pages (both sides of the node limit, 2,038 bytes a node on
    4-KiB pages), in shards that each begin a leaf, three levels of pages: the LMDB library reads every key and value
    back in order, its own counts of them, and finds keys through the branch pages."""
    from gpubatch.formats.lmdb_write import NODEMAX

    rng = random.Random(per_shard)
    sizes = [0, 10, 900, 1990, 2000, 2010, 2030, 2040, 3000, 4080, 4081, 70_000]
    items = [(b"%08d_k%d" % (i, i), rng.randbytes(rng.choice(sizes))) for i in range(4000)]
    assert any(8 + len(k) + len(v) > NODEMAX for k, v in items) and any(8 + len(k) + len(v) <= NODEMAX for k, v in items)
    counts, leaves = _write(tmp_path, [items[a : a + per_shard] for a in range(0, len(items), per_shard)])
    env = lmdb.open(str(tmp_path), readonly=True, lock=False)
    st = env.stat()
    assert st["entries"] == 4000 and st["leaf_pages"] == counts["leaf_pages"] == len(leaves)
    assert st["overflow_pages"] == counts["overflow_pages"] and st["depth"] == 3
    with env.begin() as txn:
        assert list(txn.cursor()) == items
        for i in (0, 1, 1999, 3999):
            assert txn.get(items[i][0]) == items[i][1]
        assert txn.get(b"00000000_k") is None and txn.get(b"99999999") is None
    env.close()


def test_the_library_writes_on_pages_gpubatch_wrote(tmp_path):
    """An append, a delete and keys between the existing ones (splits of the pages gpubatch made) by the LMDB
    library, into a file gpubatch wrote: every record there afterwards, in order."""
    rng = random.Random(1)
    items = [(b"%08d_k" % i, rng.randbytes(rng.choice([100, 1500, 9000]))) for i in range(3000)]
    _write(tmp_path, [items[:1000], items[1000:]])
    env = lmdb.open(str(tmp_path), map_size=1 << 30)
    with env.begin(write=True) as txn:
        assert txn.put(b"99999999_last", b"x" * 5000, append=True)
        assert txn.delete(items[5][0])
        for i in range(500):
            txn.put(b"00001000_%05d" % i, b"y" * 100)
    want = sorted([*items[:5], *items[6:], (b"99999999_last", b"x" * 5000),
                   *((b"00001000_%05d" % i, b"y" * 100) for i in range(500))])
    with env.begin() as txn:
        assert list(txn.cursor()) == want and env.stat()["entries"] == len(want)
    env.close()


def test_an_empty_database(tmp_path):
    """No records: the two meta pages alone, an empty database to the library."""
    counts, _ = _write(tmp_path, [[]])
    assert counts["entries"] == 0 and (tmp_path / "data.mdb").stat().st_size == 2 * 4096
    env = lmdb.open(str(tmp_path), readonly=True, lock=False)
    assert env.stat()["entries"] == 0
    with env.begin() as txn:
        assert list(txn.cursor()) == []
    env.close()
