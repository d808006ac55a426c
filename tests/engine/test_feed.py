"""FileFeed: files read, header-parsed and drawn for in worker processes (CPU only)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

from gpubatch.engine.codecs.headers import jpeg_display_size, jpeg_kind, jpeg_orientation
from gpubatch.engine.codecs.image import decode
from gpubatch.engine.gpu.feed import FileFeed
from gpubatch.engine.ops import Flip, Normalize, RandomResizedCrop
from gpubatch.engine.plan import Plan
from gpubatch.engine.windows import fold_windows
from gpubatch.errors import RecordError
from tests.helpers import child_env

SAMPLES = Path(__file__).resolve().parents[2] / "sample_data" / "imagenet"


def _files() -> list[Path]:
    return sorted(p for p in SAMPLES.rglob("*") if p.is_file() and p.suffix.lower() in (".jpg", ".jpeg", ".png"))


def test_display_size_matches_decode_including_exif_rotation():
    rotated = 0
    for f in _files():
        data = f.read_bytes()
        hw = jpeg_display_size(data)
        if f.suffix.lower() == ".png":
            assert hw is None
            continue
        try:
            arr = decode(data)
        except ValueError:
            continue
        assert hw == arr.shape[:2], f
        rotated += jpeg_orientation(data) in (5, 6, 7, 8)
    assert rotated >= 1  # the sample set holds an EXIF-rotated photo: the size must come out transposed


def test_jpeg_kind_sets_exif_turned_images_apart():
    """An EXIF-oriented JPEG gets a kind of its own (the hardware engine's direct path does not turn
    images, so the router sends those to the CUDA decoder); an upright one keeps the plain kind."""
    kinds = {f.name: jpeg_kind(f.read_bytes()) for f in _files() if f.suffix.lower() != ".png"}
    turned = [k for k in kinds.values() if k[0] and k[0].endswith("/turned")]
    assert len(turned) >= 1 and all(k[0].count("/") == 2 for k in turned)
    assert kinds["flower_000.jpg"][0].endswith("/turned")  # orientation 6 in the sample set
    assert sum(1 for k in kinds.values() if k[0] and not k[0].endswith("/turned")) >= 30  # upright: plain kinds


def test_orientation_of_broken_exif_is_upright():
    head = b"\xff\xd8\xff\xe1\x00\x10Exif\x00\x00MM\x00\x2a\x00\x00\xff\xff"
    assert jpeg_orientation(head) == 1
    assert jpeg_orientation(b"not a jpeg") == 1


def test_a_jpeg_whose_header_is_corrupt_is_read_and_handed_to_the_decoder(tmp_path: Path):
    """Bytes that start as a JPEG but hold no marker where one must be have no kind and no size (the
    decoder names the record's error); the feed's reader hands them over like any other file, not failing
    the batch (jpeg_kind raised on them before)."""
    good = _files()[0]
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8\x00\x11" + b"\x00" * 100)
    assert jpeg_kind(bad.read_bytes()) == (None, 0, 0) and jpeg_display_size(bad.read_bytes()) is None
    with FileFeed([good, bad], ["good", "bad"], 8, None, workers=1, depth=2) as feed:
        (batch,) = list(feed)
    assert [bytes(b) for b in batch.blobs] == [good.read_bytes(), bad.read_bytes()]
    assert batch.headers[1] == (None, 0, 0) and batch.sizes[1] is None and batch.headers[0] == jpeg_kind(good.read_bytes())


def test_a_views_batch_gives_its_bytes_addresses_and_jpeg_ends_as_each_view_would(tmp_path: Path):
    """In views mode a batch's bytes are a SlotViews: each item the file's bytes (an unreadable file's empty),
    slices of items, every item's host address and size in one call (what the GPU decoder takes instead of
    one ctypes object an image) pointing at those very bytes, and whether each ends with a JPEG's end
    marker, as testing each view's last two bytes says (a JPEG cut short, a file of one byte, none)."""
    import ctypes

    from gpubatch.engine.gpu.slot_views import SlotViews

    files = _files()[:5]
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(files[0].read_bytes()[:-7])
    tiny = tmp_path / "tiny.jpg"
    tiny.write_bytes(b"\xd9")
    paths = [*files, cut, tmp_path / "gone.jpg", tiny]
    with FileFeed(paths, None, batch_size=len(paths), workers=1, depth=2, views=True) as feed:
        (fed,) = list(feed)
        blobs = fed.blobs
        assert isinstance(blobs, SlotViews) and len(blobs) == len(paths)
        want = [p.read_bytes() if p.exists() else b"" for p in paths]
        assert [bytes(b) for b in blobs] == want and [bytes(b) for b in blobs[1:3]] == want[1:3]
        addrs, sizes = blobs.addresses()
        assert sizes == [len(w) for w in want]
        assert [ctypes.string_at(a, n) for a, n in zip(addrs, sizes)] == want
        assert blobs.jpeg_ended() == [bytes(b[-2:]) == b"\xff\xd9" for b in want] == [True] * 5 + [False] * 3
        fed.done()


@pytest.mark.parametrize("slot_bytes", [64 << 20, 100_000])  # the second overflows: batches come back pickled
def test_feed_gives_bytes_sizes_and_the_same_draws(tmp_path: Path, slot_bytes: int):
    files = _files()
    missing = tmp_path / "gone.jpg"
    paths = [*files[:20], missing, *files[20:]]
    keys = [f"k{i}" for i in range(len(paths))]
    plan = Plan(ops=(RandomResizedCrop(64), Flip(), Normalize()), seed=7)
    got, headers, geo, out = [], [], [], []
    with FileFeed(paths, keys, batch_size=16, plan=plan, workers=2, depth=2, slot_bytes=slot_bytes) as feed:
        for fed in feed:
            assert len(fed.keys) == len(fed.blobs) == len(fed.sizes) == len(fed.params) == len(fed.errors)
            got.extend(zip(fed.keys, fed.blobs, fed.sizes, fed.params, fed.errors))
            headers.extend(fed.headers)
            geo.extend(fed.windows[0])
            out.extend(fed.windows[1])
    assert [g[0] for g in got] == keys
    for (key, blob, hw, params, err), path in zip(got, paths):
        if path == missing:
            assert blob == b"" and hw is None and params is None and "cannot read" in err
            continue
        assert err is None and blob == path.read_bytes()
        assert hw == jpeg_display_size(blob)
        if hw is not None:
            assert params == tuple(plan.draw(key, *hw))
    for (_, blob, hw, params, _), head, g, o in zip(got, headers, geo, out):
        assert head == (jpeg_kind(blob) if blob else (None, 0, 0))  # what the GPU decoder routes by
        if hw is None:
            assert not g.any() and not o.any()
            continue
        # the leading window segment (crop + flip) folded as the GPU process would fold it
        win = fold_windows(plan.ops, [0, 1], params, *hw)
        np.testing.assert_allclose(g, [win.ay, win.by, win.ax, win.bx], rtol=1e-6)
        assert tuple(o) == (win.oh, win.ow) == (64, 64)


def test_feed_repeats_and_stops_early():
    files = _files()[:10]
    with FileFeed(files, batch_size=4, workers=1, depth=2, repeat=True) as feed:
        seen, epochs = [], []
        for fed in feed:
            seen.append(len(fed))
            epochs.append(fed.epoch)
            if len(seen) == 7:
                break
    assert seen == [4, 4, 2, 4, 4, 2, 4]
    assert epochs == [0, 0, 0, 1, 1, 1, 2]


def test_each_epoch_of_a_repeating_iteration_draws_anew_and_reproducibly():
    from gpubatch.pipelines.image import ImagePipeline

    files = [f for f in _files() if f.suffix.lower() != ".png"][:6]
    ops = [RandomResizedCrop(32), Flip()]

    def three_epochs() -> list[list[np.ndarray]]:
        with ImagePipeline(ops, device="cpu", seed=3, cpu_threads=2) as pipe:
            out = []
            for k, batch in enumerate(pipe.iterate_files(files, batch_size=6, repeat=True, workers=1)):
                out.append([a.copy() for a in batch])
                if k == 2:
                    break
            first = pipe([f.read_bytes() for f in files], [f.stem for f in files])
            again = pipe.process(pipe.decode([f.read_bytes() for f in files]), [f.stem for f in files], epoch=1)
        return out, first, again

    (runs, first, again), (reruns, _, _) = three_epochs(), three_epochs()
    for x, y in zip(runs, reruns):  # the same seed gives the same epochs
        assert all(np.array_equal(a, b) for a, b in zip(x, y))
    assert all(np.array_equal(a, b) for a, b in zip(runs[0], first))  # epoch 0 is what a plain call draws
    assert all(np.array_equal(a, b) for a, b in zip(runs[1], again))  # and process(epoch=1) the second
    for e in (1, 2):  # new crops and flips each epoch
        assert not all(np.array_equal(a, b) for a, b in zip(runs[0], runs[e]))


def test_image_pipeline_iterate_files_on_cpu_matches_call():
    from gpubatch.pipelines.image import ImagePipeline

    files = [f for f in _files() if f.suffix.lower() != ".png"][:12]
    keys = [f.stem for f in files]
    ops = [RandomResizedCrop(48), Flip(), Normalize(dtype="float32")]
    with ImagePipeline(ops, device="cpu", seed=2, cpu_threads=2) as pipe:
        streamed = [a for b in pipe.iterate_files(files, keys, batch_size=5, workers=1) for a in b]
        direct = pipe([f.read_bytes() for f in files], keys)
    assert len(streamed) == len(direct) == len(files)
    for a, b in zip(streamed, direct):
        np.testing.assert_array_equal(a, b)


def test_views_mode_gives_the_bytes_and_reuses_slots_only_when_done():
    files = _files()[:12]
    with FileFeed(files, batch_size=4, workers=1, depth=2, repeat=True, views=True) as feed:
        seen = 0
        for fed in feed:
            for blob, path in zip(fed.blobs, files[(seen * 4) % 12 : (seen * 4) % 12 + 4]):
                assert bytes(blob) == path.read_bytes()
            fed.done()  # two slots serve any number of batches once each is handed back
            seen += 1
            if seen == 7:
                break


def test_pipeline_stopping_early_on_a_repeating_feed_returns():
    import threading

    from gpubatch.pipelines.image import ImagePipeline

    files = [f for f in _files() if f.suffix.lower() != ".png"][:12]
    done = threading.Event()

    def run() -> None:
        with ImagePipeline([RandomResizedCrop(32), Normalize()], device="cpu", seed=0, cpu_threads=1) as pipe:
            for k, _ in enumerate(pipe.iterate_files(files, batch_size=4, repeat=True, workers=1)):
                if k == 2:
                    break
        done.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)
    assert done.is_set(), "iterate_files did not return after the consumer stopped"


def _decoded_size(data: bytes) -> tuple[int, int] | None:
    try:
        return decode(data).shape[:2]
    except ValueError:
        return None


@pytest.mark.parametrize("dataset, fmt", [("imagenet", "folder"), ("coco", "coco")])
def test_record_feed_reads_passes_through_and_draws_per_output(dataset: str, fmt: str):
    """What a GPU worker gets for augment: untouched originals finished, one source per record, and per
    variant the parameters and moved boxes the CPU path draws for the decoded size."""
    from gpubatch.engine import spec
    from gpubatch.engine.gpu.feed import RecordFeed
    from gpubatch.engine.windows import leading_windows
    from gpubatch.formats import open_reader
    from gpubatch.types import Record

    src = SAMPLES.parent / dataset
    reader = open_reader(src, fmt)
    entries = reader.entries()
    ops = spec.preset("ssd") if dataset == "coco" else spec.preset("resnet50-train")
    plan = Plan(ops=ops, seed=3, copies=2, keep_original=True, min_box_visibility=0.25)
    batches = []
    with RecordFeed(functools.partial(open_reader, src, fmt), entries, plan, batch_size=5, workers=2, depth=2) as feed:
        # the ring has no name left in /dev/shm once its readers mapped it: no end of the run leaves it there
        assert not Path("/dev/shm", feed.shm.name.lstrip("/")).exists()
        feed.start()
        for fed in feed:
            fed.blobs = [bytes(b) for b in fed.blobs]  # views of a slot the feed reuses once done
            fed.done()
            batches.append(fed)
    records = [reader.read(e) for e in entries]
    assert sum(f.counts["records_in"] for f in batches) == len(records)
    assert sum(f.counts["passthrough"] for f in batches) <= len(records)
    k = 0
    for fed in batches:
        assert len(fed.blobs) == len(fed.sizes) == len(fed.headers) == len(fed.sources)
        it = iter(fed.results)
        n_jobs = 0
        for rec in records[k : k + 5]:
            original = next(it)
            assert isinstance(original, Record | RecordError)
            if isinstance(original, Record):
                assert original.key == rec.key and original.data == rec.data  # passed through untouched
            for variant in range(2):
                j = next(it)
                assert j == n_jobs
                job = fed.jobs[j]
                n_jobs += 1
                assert job.template.key == f"{rec.key}_aug{variant}" and job.template.data == b""
                assert fed.sources[job.source] == (rec.key, rec.origin)
                hw = fed.sizes[job.source]
                assert hw == jpeg_display_size(rec.data)
                if hw is None:
                    assert job.params is None
                    continue
                assert hw == _decoded_size(rec.data) or _decoded_size(rec.data) is None
                params, boxes, dropped = plan.draw_and_move(job.template.key, *hw, rec.boxes)
                assert job.params == params and job.dropped == dropped
                assert (job.boxes is None) == (boxes is None)
                if boxes is not None:
                    np.testing.assert_allclose(job.boxes.xyxy, boxes.xyxy)
            src_i = fed.jobs[n_jobs - 1].source
            assert bytes(fed.blobs[src_i]) == rec.data  # once per record, for both variants
        assert next(it, None) is None
        k += 5
        want = leading_windows(plan.ops, [j.params for j in fed.jobs], [fed.sizes[j.source] for j in fed.jobs])
        if want is None:
            assert fed.windows is None
        else:
            np.testing.assert_array_equal(fed.windows[0], want[0])
            np.testing.assert_array_equal(fed.windows[1], want[1])
    assert k >= len(records)


def test_record_feed_reports_unreadable_records_in_place(tmp_path: Path):
    import shutil

    from gpubatch.engine.gpu.feed import RecordFeed
    from gpubatch.engine.ops import ResizeShorter
    from gpubatch.formats import open_reader

    src = tmp_path / "set"
    shutil.copytree(SAMPLES, src)
    reader = open_reader(src, "folder")
    entries = reader.entries()
    (src / entries[3][0]).unlink()
    plan = Plan(ops=(ResizeShorter(32),))
    with RecordFeed(functools.partial(open_reader, src, "folder"), entries, plan, batch_size=4, workers=1, depth=2, views=False) as feed:
        results = [r for fed in feed for r in fed.results]
    assert len(results) == len(entries)
    assert isinstance(results[3], RecordError) and results[3].stage.value == "read"
    assert all(isinstance(r, int) for i, r in enumerate(results) if i != 3)


def test_rings_fit_a_small_dev_shm(monkeypatch):
    """A container's 64 MiB /dev/shm: slots shrink (batches then come back pickled) instead of the
    process dying of SIGBUS when it touches memory /dev/shm cannot hold."""
    import os

    from gpubatch.engine.gpu import feed as feed_mod

    class Small:
        f_bavail, f_frsize = 64 * 256, 4096  # 64 MiB free

    monkeypatch.setattr(os, "statvfs", lambda path: Small())
    assert feed_mod.fit_slots(4, 64 << 20) == 8 << 20  # 4 slots take half of it
    assert feed_mod.fit_slots(4, 1 << 20) == 1 << 20  # what fits is left alone
    files = _files()[:12]
    with FileFeed(files, batch_size=6, workers=1, depth=2, slot_bytes=64 << 20) as feed:
        assert feed.slot_bytes == 16 << 20
        got = [bytes(b) for fed in feed for b in fed.blobs]
    assert got == [f.read_bytes() for f in files]


def test_regions_give_the_pixels_of_a_full_decode():
    """With ``regions`` the feed names the part of each upright JPEG the leading crop reads, moves the
    window into it and reports the region's size; resampling the region gives what resampling the
    whole image gives (the region covers the filter's reach). Pillow's box resize is not exactly
    shift-invariant (moving a box by whole pixels changes up to a fifth of the values by one level),
    so the comparison allows that."""
    from gpubatch.engine.codecs.headers import jpeg_orientation
    from gpubatch.engine.ops.base import Window
    from gpubatch.engine.ops.geometry import resample_cpu

    files = [f for f in _files() if f.suffix.lower() != ".png"]
    keys = [f"k{i}" for i in range(len(files))]
    plan = Plan(ops=(RandomResizedCrop(64), Flip(), Normalize()), seed=5)
    cut = 0
    with FileFeed(files, keys, batch_size=16, plan=plan, workers=2, depth=2, regions=True) as feed:
        for fed in feed:
            for i, (key, blob) in enumerate(zip(fed.keys, fed.blobs)):
                region = fed.regions[i]
                try:
                    full = decode(blob)
                except ValueError:
                    assert region is None or fed.sizes[i] is not None
                    continue
                win = fold_windows(plan.ops, [0, 1], fed.params[i], *full.shape[:2])
                if region is None:
                    assert fed.sizes[i] == full.shape[:2]
                    continue
                assert jpeg_orientation(blob) == 1
                y0, x0, y1, x1 = region
                assert fed.sizes[i] == (y1 - y0, x1 - x0) and (y1 - y0) * (x1 - x0) < full.shape[0] * full.shape[1]
                g, o = fed.windows[0][i], fed.windows[1][i]
                moved = Window(float(g[0]), float(g[1]), float(g[2]), float(g[3]), int(o[0]), int(o[1]))
                whole = Window(moved.ay + y0, moved.by, moved.ax + x0, moved.bx, moved.oh, moved.ow)
                np.testing.assert_allclose(whole.as_array(), win.as_array(), rtol=1e-6, atol=1e-4)
                got = resample_cpu(full[y0:y1, x0:x1], moved).astype(int)
                want = resample_cpu(full, whole).astype(int)
                assert np.abs(got - want).max() <= 1 and np.abs(got - want).mean() < 0.3, key
                cut += 1
    assert cut >= 10  # most crops keep well under 90% of the image


def test_cpu_iterate_files_reports_unreadable_and_corrupt_files(tmp_path):
    """On the CPU the worker processes read the files themselves: a missing file and a corrupt one are
    reported in ``last_errors`` of their batch, and the rest of the batch comes out."""
    from gpubatch.pipelines.image import ImagePipeline

    files = [f for f in _files() if f.suffix.lower() != ".png"][:6]
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    paths = [files[0], tmp_path / "missing.jpg", *files[1:3], bad, *files[3:]]
    with ImagePipeline([RandomResizedCrop(32), Normalize()], device="cpu", seed=0, cpu_threads=2) as pipe:
        got, errors = [], []
        for b in pipe.iterate_files(paths, batch_size=4):
            got.append(len(b))
            errors.append([i for i, _ in pipe.last_errors])
    assert got == [3, 3] and errors == [[1], [0]]


def test_decoder_warm_up_images_cover_every_subsampling():
    """The decoder warm-up (GpuEngine.warm_up) sends a whole batch of tiny JPEGs of every subsampling
    the GPU decoders route, and gray, so each decoder meets every kind and a full batch before the
    first real one (and the hardware engine's refusals are learned before real batches are routed)."""
    from gpubatch.engine.codecs.image_gpu import tiny_jpegs

    blobs = tiny_jpegs(256)
    kinds = [jpeg_kind(b)[0] for b in blobs]
    assert len(blobs) == 256
    assert set(kinds) == {"baseline/4:4:4", "baseline/4:2:2", "baseline/4:2:0", "baseline/gray"}
    assert all(decode(b).shape == (64, 64, 3) for b in blobs[:4])


@pytest.mark.parametrize("cores, readers, threads", [(16, 4, 11), (32, 4, 11), (128, 4, 11), (14, 3, 10), (8, 2, 5),
                                                    (4, 1, 2), (1, 1, 1)])
def test_decoder_threads_leave_cores_to_the_feed_and_the_pipeline(monkeypatch, cores, readers, threads):
    """The CUDA decoder's default thread count leaves the feed's reader processes and one core for
    the pipeline's own threads (15 threads on 16 cores crowded them out), and stops at 11 on larger
    hosts (27 on 32 cores ran slower and took more device memory)."""
    from gpubatch.engine import executor, processes

    monkeypatch.setattr(processes, "default_workers", lambda: cores)
    assert processes.default_readers() == readers
    assert executor.default_decoder_threads() == threads


def test_a_slot_takes_reads_in_place_and_spills_what_does_not_fit():
    """A reader reads an image straight into the slot (reserve, then commit); a batch that outgrows its
    slot comes back pickled whole, the items read in place before it included; bytes read elsewhere go in
    as they are."""
    from multiprocessing.shared_memory import SharedMemory

    from gpubatch.engine.gpu import feed as F

    shm = SharedMemory(create=True, size=2 * 1000)
    saved = dict(F._W)
    try:
        F._W.update(shm=shm, slot=1000)
        fits = F._Slot(1)
        for fill, n in ((b"a", 600), (b"b", 300)):
            room = fits.reserve(n)
            room[:] = fill * n
            fits.commit(room)
            del room
        fits.commit(b"c" * 50)  # (read elsewhere: copied in)
        offsets, lengths, overflow = fits.layout()
        assert overflow is None and lengths == [600, 300, 50]
        assert [bytes(shm.buf[1000 + o : 1000 + o + n]) for o, n in zip(offsets, lengths)] == [
            b"a" * 600, b"b" * 300, b"c" * 50]
        spills = F._Slot(0)
        room = spills.reserve(700)
        room[:] = b"x" * 700
        spills.commit(room)
        room = spills.reserve(400)  # (past the slot's end: a buffer of its own)
        room[:] = b"y" * 400
        spills.commit(room)
        spills.reserve(10)  # (a read that failed after its room was given: nothing kept)
        spills.commit(b"z" * 5)
        del room
        assert [bytes(x) for x in spills.layout()[2]] == [b"x" * 700, b"y" * 400, b"z" * 5]
        del fits, spills
    finally:
        F._W.clear()
        F._W.update(saved)
        shm.close()
        shm.unlink()


def _fed(feed) -> list[tuple]:
    out = []
    feed.start()
    for fed in feed:
        out.append(([bytes(b) for b in fed.blobs], fed.sizes, fed.headers, fed.sources, fed.results,
                    [(j.template.key, j.params) for j in fed.jobs]))
        fed.done()
    return out


def test_readers_started_at_the_workers_boot_are_taken_by_its_feed():
    """A GPU worker's boot starts its feed's readers before its run comes (``gpu.feed_start``): the feed takes them
    where it wants as many, and they read what readers the feed starts itself read; where it wants another number
    they end and it starts its own."""
    from gpubatch.engine import spec
    from gpubatch.engine.gpu import feed_start
    from gpubatch.engine.gpu.feed import RecordFeed
    from gpubatch.formats import open_reader

    src = SAMPLES.parent / "imagenet"
    entries = open_reader(src, "folder").entries()
    plan = Plan(ops=spec.preset("resnet50-train"), seed=3, copies=2)
    opener = functools.partial(open_reader, src, "folder")
    with RecordFeed(opener, entries, plan, batch_size=7, workers=2, depth=2) as feed:
        assert not feed.prestarted
        want = _fed(feed)
    feed_start.prestart(2)
    pool = feed_start._PRESTARTED[-1][1]
    with RecordFeed(opener, entries, plan, batch_size=7, workers=2, depth=2, prestarted=feed_start.taken) as feed:
        assert feed.prestarted and feed.pool is pool and not feed_start._PRESTARTED
        assert _fed(feed) == want
    feed_start.prestart(3)
    unused = feed_start._PRESTARTED[-1][1]
    with RecordFeed(opener, entries, plan, batch_size=7, workers=2, depth=2, prestarted=feed_start.taken) as feed:
        assert not feed.prestarted and feed.pool is not unused and not feed_start._PRESTARTED
        assert _fed(feed) == want
    unused.shutdown(wait=True)  # (ended: shut down already when the feed did not take them)
    feed_start.prestart(2)
    feed_start.close()
    assert not feed_start._PRESTARTED


def test_a_full_dev_shm_sends_the_cpu_path_s_arrays_through_pipes_with_the_same_batches(tmp_path, monkeypatch):
    """Where /dev/shm has no room for a chunk's block (a container's 64 MiB), the CPU path's workers send their
    arrays back pickled instead of writing past its end (a SIGBUS that killed them: BrokenProcessPool): the same
    batches, and one warning that names the cause and the fix."""
    import os
    import subprocess
    import sys

    from gpubatch.pipelines import image_cpu
    from gpubatch.pipelines.image import ImagePipeline

    files = [f for f in _files() if f.suffix.lower() != ".png"][:10]
    keys = [f.stem for f in files]
    ops = [RandomResizedCrop(40), Flip(), Normalize(dtype="float16")]
    with ImagePipeline(ops, device="cpu", seed=4, cpu_threads=2) as pipe:
        shared = [a.copy() for b in pipe.iterate_files(files, keys, batch_size=4, workers=1) for a in b]
    # in this process: no room, or a reservation refused, gives no block (and leaves none in /dev/shm)
    monkeypatch.setattr("gpubatch.engine.processes.shm_free", lambda: 1 << 20)
    from multiprocessing.shared_memory import SharedMemory

    assert image_cpu.shared_block(SharedMemory, 4 << 20) is None
    monkeypatch.setattr("gpubatch.engine.processes.shm_free", lambda: None)
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()

    def refused(fd, offset, size):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", refused, raising=False)
    assert image_cpu.shared_block(SharedMemory, 4 << 20) is None
    assert (set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()) <= before
    name, layout = image_cpu.chain_chunk(pipe.plan, [str(f) for f in files[:3]], keys[:3])
    assert name is None and all(isinstance(a, np.ndarray) and e is None for a, e in layout)
    monkeypatch.undo()
    # the whole path, its worker processes told /dev/shm is full (every process of it imports the hook)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text("import gpubatch.engine.processes as p\np.shm_free = lambda: 0\n")
    script = (
        "import sys, warnings, numpy as np\nfrom pathlib import Path\n"
        "from gpubatch.engine.ops.geometry import Flip, RandomResizedCrop\n"
        "from gpubatch.engine.ops.normalize import Normalize\nfrom gpubatch.pipelines.image import ImagePipeline\n"
        "if __name__ == '__main__':\n"
        "    files = [Path(p) for p in sys.argv[2:]]\n"
        "    with warnings.catch_warnings(record=True) as w, ImagePipeline([RandomResizedCrop(40), Flip(), "
        "Normalize(dtype='float16')], device='cpu', seed=4, cpu_threads=2) as pipe:\n"
        "        warnings.simplefilter('always')\n"
        "        out = [a for b in pipe.iterate_files(files, [f.stem for f in files], batch_size=4, workers=1) for a in b]\n"
        "    np.save(sys.argv[1], np.stack(out))\n"
        "    print([str(x.message) for x in w if issubclass(x.category, RuntimeWarning)])\n")
    env = child_env(hook)
    p = subprocess.run([sys.executable, "-c", script, str(tmp_path / "out.npy"), *map(str, files)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert np.array_equal(np.load(tmp_path / "out.npy"), np.stack(shared))
    import ast

    said = [m for m in ast.literal_eval(p.stdout.strip().splitlines()[-1]) if "/dev/shm" in m]
    assert len(said) == 1 and "--shm-size" in said[0]
