"""The training loader over what gpubatch wrote (CPU): every sample once an epoch across ranks and
workers, an order that depends on (seed, epoch) alone, exact mid-epoch resume under another world size,
labels aligned after failures, every format."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from gpubatch.api import convert
from gpubatch.errors import UsageError
from gpubatch.training import Loader, epoch_order, loader, rank_batches

CHAIN = "resize_shorter(size=40) | center_crop(size=32)"


@pytest.fixture
def wds(imagenet, tmp_path) -> Path:
    out = tmp_path / "wds"
    convert(imagenet, out, to="webdataset", shard_size=16)
    return out


def _keys(dl, epoch: int = 0) -> list[list[str]]:
    dl.set_epoch(epoch)
    return [keys for keys, in dl]


def test_ranks_and_workers_see_every_sample_once_in_an_order_of_seed_and_epoch_alone(wds):
    one = loader(wds, batch_size=4, keys=("key",), device="cpu", seed=7)
    whole = [k for b in _keys(one) for k in b]
    assert len(whole) == len(set(whole)) == 60
    assert [k for b in _keys(one, 1) for k in b] != whole  # (another epoch, another order)
    seen = []
    for rank in range(2):
        for worker in range(2):
            dl = loader(wds, batch_size=4, keys=("key",), device="cpu", seed=7, rank=rank, world_size=2)
            dl._worker = (worker, 2)  # (as a DataLoader's worker process finds itself)
            seen += [k for b in _keys(dl) for k in b]
    assert sorted(seen) == sorted(whole)  # 60 = 7 global batches of 8 and a last one of 4: no padding needed
    # the global order is the one order whatever the ranks: at each step rank 0's batch, then rank 1's
    r0 = loader(wds, batch_size=4, keys=("key",), device="cpu", seed=7, rank=0, world_size=2)
    r1 = loader(wds, batch_size=4, keys=("key",), device="cpu", seed=7, rank=1, world_size=2)
    merged = [k for a, b in zip(_keys(r0), _keys(r1)) for k in a + b]
    assert merged == whole


def test_a_last_global_batch_is_padded_to_equal_parts_or_dropped():
    order = np.arange(10)
    pad = [rank_batches(order, 0, 4, r, 2, drop_last=False) for r in range(2)]
    assert [len(b) for b in pad[0]] == [4, 1] and [len(b) for b in pad[1]] == [4, 1]
    assert sorted(np.concatenate(pad[0] + pad[1]).tolist()) == list(range(10))
    order = np.arange(11)
    pad = [rank_batches(order, 0, 4, r, 2, drop_last=False) for r in range(2)]
    assert [b.tolist() for b in pad[0]] == [[0, 1, 2, 3], [8, 9]] and pad[1][1].tolist() == [10, 0]  # (padded)
    drop = rank_batches(order, 0, 4, 1, 2, drop_last=True)
    assert [b.tolist() for b in drop] == [[4, 5, 6, 7]]
    assert epoch_order(5, 0, 0, shuffle=False).tolist() == [0, 1, 2, 3, 4]
    assert epoch_order(100, 3, 1).tolist() == epoch_order(100, 3, 1).tolist() != epoch_order(100, 3, 2).tolist()


@pytest.mark.parametrize("new_world", [1, 2, 3])
def test_state_saved_mid_epoch_gives_the_rest_of_it_exactly_under_any_world_size(wds, new_world):
    full = loader(wds, batch_size=3, keys=("key",), device="cpu", seed=1, drop_last=True)
    full.set_epoch(2)
    whole = [k for b in full for (k,) in [b] for k in k]
    rng = random.Random(new_world)
    steps = rng.randrange(1, 9)
    ranks = [loader(wds, batch_size=3, keys=("key",), device="cpu", seed=1, rank=r, world_size=2, drop_last=True)
             for r in range(2)]
    done = []
    for dl in ranks:
        dl.set_epoch(2)
    for (a,), (b,) in zip(ranks[0], ranks[1]):
        done += a + b
        if len(done) == steps * 6:
            break
    state = ranks[0].state_dict(batches_seen=steps)
    assert state["consumed"] == steps * 6 and state["epoch"] == 2
    rest = []
    news = [loader(wds, batch_size=3, keys=("key",), device="cpu", seed=1, rank=r, world_size=new_world,
                   drop_last=True) for r in range(new_world)]
    for dl in news:
        dl.load_state_dict(state)
    for batches in zip(*[list(dl) for dl in news]):
        rest += [k for (keys,) in batches for k in keys]
    assert done + rest == whole[:len(done) + len(rest)] and len(done) + len(rest) >= 60 - 3 * new_world * 2
    assert not set(done) & set(rest)


def test_labels_stay_with_their_images_when_a_record_fails(imagenet):
    bad = sorted(imagenet.rglob("*.jpg"))[5]
    bad.write_bytes(bad.read_bytes()[:200])  # (cut short: it does not decode)
    with loader(imagenet, CHAIN, batch_size=8, keys=("key", "image", "label"), device="cpu", shuffle=False) as dl:
        rows, names = 0, dl.classes
        for keys, images, labels in dl:
            assert len(keys) == len(np.asarray(images)) == len(labels)
            assert np.asarray(images).shape[1:] == (32, 32, 3)
            for k, lab in zip(keys, labels):
                assert k.split("/")[0] == names[lab]  # (ImageNet layout: a key's folder is its class)
            rows += len(keys)
    assert rows == 59 and [s["key"] for s in dl.skipped] == [bad.relative_to(imagenet).with_suffix("").as_posix()]
    assert dl.skipped[0]["reason"].startswith("decode: ")


def test_every_format_gpubatch_writes_is_read_with_its_labels(imagenet, coco, tmp_path):
    for fmt in ("webdataset", "tfrecord", "recordio", "folder", "lmdb", "coco"):
        src = coco if fmt == "coco" else imagenet
        out = tmp_path / f"out-{fmt}"
        convert(src, out, to=fmt)
        with loader(out, CHAIN, batch_size=16, keys=("image", "label"), device="cpu", seed=0) as dl:
            n = sum(len(labels) for _, labels in dl)
            assert n == (12 if fmt == "coco" else 60) and not dl.skipped, fmt


def test_refusals_are_one_line(wds, tmp_path):
    with pytest.raises(UsageError, match="give rank and world_size together"):
        Loader(wds, rank=1)
    with pytest.raises(UsageError, match="give 0 <= rank < world_size"):
        Loader(wds, rank=2, world_size=2)
    dl = Loader(wds, device="cpu", seed=3)
    with pytest.raises(UsageError, match="the state is of another loader: seed 4 there, 3 here"):
        dl.load_state_dict({**dl.state_dict(), "seed": 4})


def test_audio_datasets_give_feature_batches_with_their_labels(tmp_path):
    from tests.audio.sounds import speech_commands, tone, write

    root = speech_commands(tmp_path / "sc", per_word=4)
    bad = root / "up" / "0003_nohash_0.wav"
    bad.write_bytes(bad.read_bytes()[:30])  # (a header cut short: it does not decode)
    write(root / "no" / "0009_nohash_0.wav", tone(0.7, 16000, 300), 16000)
    clips = tmp_path / "clips"
    convert(root, clips, to="audio", device="cpu", on_error="skip")
    broken = sorted(clips.rglob("*.wav"))[2]  # (written whole, then damaged: the loader meets it)
    broken.write_bytes(broken.read_bytes()[:60] + bytes(200))
    chain = "fix_duration(seconds=1) | log_mel(n_mels=40)"
    with loader(clips, chain, batch_size=4, keys=("key", "audio", "label"), device="cpu", shuffle=False,
                dtype="float32") as dl:
        assert dl.media == "audio"
        rows, names = 0, dl.classes
        for keys, feats, labels in dl:
            x = np.asarray(feats.data)
            assert x.shape[0] == len(keys) == len(labels) and x.shape[1] == 40 and x.dtype == np.float32
            assert feats.shape == x.shape and feats.dtype == x.dtype and np.array_equal(np.asarray(feats), x)
            assert [names[lab] for lab in labels] == [k.split("/")[0] for k in keys]
            rows += len(keys)
        skipped = [s["key"] for s in dl.skipped]
    assert broken.relative_to(clips).with_suffix("").as_posix() in skipped
    assert rows + len(skipped) == 13 - (bad.relative_to(root).with_suffix("").as_posix() not in skipped)
    # features gpubatch wrote are read as they are (no ops), one (bins, frames) array a row
    feats = tmp_path / "feats"
    convert(root, feats, to="webdataset", device="cpu", sample_rate=16000, mono=True, duration=1,
            features="log-mel(n_mels=40)", on_error="skip")
    with loader(feats, batch_size=8, keys=("audio", "label"), device="cpu", shuffle=False) as dl:
        got = [(np.asarray(a.data), lab) for a, lab in dl]
    assert sum(len(lab) for _, lab in got) == rows + 1  # (the clip damaged above was whole at the source)
    assert {a.shape[1:] for a, _ in got} == {(40, 100)}
    with pytest.raises(UsageError, match="holds audio records: ask for 'audio', not 'image'"):
        loader(feats, keys=("image",))


def test_video_datasets_give_clip_batches_with_their_labels(tmp_path):
    """Videos passed through to shards and clips written as ``.npy``: one clip a record, labels aligned, a
    record too short or damaged skipped with its reason, the clip drawn per (seed, key, epoch)."""
    pytest.importorskip("av", reason="PyAV decodes the videos")
    from tests.video.clips import class_folders, make_clip

    src = class_folders(tmp_path / "src")  # jump: 48 and 30 frames; walk: 60 (HEVC) and 36 (MKV)
    make_clip(src / "walk" / "w3.mp4", 6)  # too short for a clip of 8 frames 2 apart
    make_clip(src / "jump" / "j3.mp4", 40)
    shards = tmp_path / "shards"
    s = convert(src, shards, to="video", device="cpu")  # (the files as they are, in class folders)
    assert s.records_out == 6
    damaged = shards / "jump" / "j3.mp4"
    damaged.write_bytes(damaged.read_bytes()[:2000])  # (written whole, then its frames cut off: no clip)
    chain = "resize_shorter(size=32) | center_crop(size=32)"
    opts = dict(batch_size=2, clip_length=8, frame_step=2, device="cpu", shuffle=False, num_workers=2)
    with loader(shards, chain, keys=("key", "video", "label"), **opts) as dl:
        assert dl.media == "video"
        got = [(keys, np.asarray(v.data), labels) for keys, v, labels in dl]
        skipped = {x["key"]: x["reason"] for x in dl.skipped}
        dl.set_epoch(1)
        again = {k: c for keys, v, _ in dl for k, c in zip(keys, np.asarray(v.data))}
    rows = [k for keys, _, _ in got for k in keys]
    assert sorted(rows) == ["jump/j1", "jump/j2", "walk/w1", "walk/w2"] and sorted(skipped) == ["jump/j3", "walk/w3"]
    assert "decode" in skipped["walk/w3"] and "frames" in skipped["walk/w3"], skipped
    for keys, clips, labels in got:
        assert clips.shape == (len(keys), 3, 8, 32, 32) and clips.dtype == np.uint8  # (N, C, T, H, W)
        assert [dl.classes[lab] for lab in labels] == [k.split("/")[0] for k in keys]
    first = {k: c for keys, clips, _ in got for k, c in zip(keys, clips)}
    with loader(shards, chain, keys=("key", "video"), **opts) as dl2:  # the same (seed, key, epoch): the same clip
        assert all(np.array_equal(first[k], c) for keys, v in dl2 for k, c in zip(keys, np.asarray(v.data)))
    assert any(not np.array_equal(first[k], again[k]) for k in first)  # another epoch draws other positions

    # clips written decoded (.npy): read as they are, T x H x W x C frames into the layout asked
    clips = tmp_path / "clips"
    convert(src, clips, to="webdataset", clip_length=8, frame_step=2, resize_shorter=32, center_crop=32,
            device="cpu", on_error="skip")
    import io
    import tarfile

    stored = {}
    for tar in sorted(clips.glob("*.tar")):
        with tarfile.open(tar) as t:
            for m in t.getmembers():
                if m.name.endswith(".npy"):
                    stored[m.name.rsplit(".", 1)[0]] = np.load(io.BytesIO(t.extractfile(m).read()))
    with loader(clips, keys=("key", "video"), clip_length=8, batch_size=4, device="cpu", shuffle=False,
                layout="NTCHW") as dl:
        seen = {k: c for keys, v in dl for k, c in zip(keys, np.asarray(v.data))}
    assert seen.keys() == stored.keys() and len(seen) >= 4
    for k, c in seen.items():
        assert np.array_equal(c, stored[k].transpose(0, 3, 1, 2)), k  # (T, C, H, W): nothing lost or moved
    with pytest.raises(UsageError, match="holds video records: ask for 'video', not 'image'"):
        loader(clips, keys=("image",))
    torch = pytest.importorskip("torch")  # a DataLoader's workers (daemonic: they decode in threads) see each clip once
    with loader(clips, keys=("key", "video"), clip_length=8, batch_size=2, device="cpu", shuffle=False) as dl:
        keys = [k for ks, _ in torch.utils.data.DataLoader(dl, batch_size=None, num_workers=2) for k in ks]
    assert sorted(keys) == sorted(stored)


def test_wids_reads_the_shard_list_beside_a_webdataset(wds):
    """webdataset's ``wids`` (indexed access; it needs PyTorch) reads ``wids.json``: every sample, the
    same bytes as gpubatch's reader."""
    wids = pytest.importorskip("wids")
    from gpubatch.formats.webdataset import WebDatasetReader

    ds = wids.ShardListDataset(str(wds / "wids.json"), transformations=[])  # (the members' bytes, undecoded)
    reader = WebDatasetReader(wds)
    entries = reader.entries()
    assert len(ds) == len(entries) == 60
    for i in (0, 17, 59):
        sample, rec = ds[i], reader.read(entries[i])
        jpg = sample[".jpg"]
        assert sample["__key__"] == rec.key and (jpg.read() if hasattr(jpg, "read") else jpg) == rec.data


def test_a_torch_dataloader_s_workers_see_every_sample_once(wds):
    """The loader as a PyTorch IterableDataset: DataLoader(batch_size=None, num_workers=2) hands out every
    sample of the epoch once, labels with their keys."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    dl = loader(wds, CHAIN, batch_size=4, keys=("key", "image", "label"), device="cpu", seed=3)
    assert isinstance(dl, torch.utils.data.IterableDataset)
    seen = []
    for keys, images, labels in DataLoader(dl, batch_size=None, num_workers=2):
        assert np.asarray(images).shape == (len(keys), 32, 32, 3) and len(labels) == len(keys)
        seen += keys
    assert sorted(seen) == sorted(k for b in _keys(loader(wds, batch_size=4, keys=("key",), device="cpu", seed=3))
                                  for k in b)
    assert len(seen) == len(set(seen)) == 60


def test_a_dataloader_s_persistent_workers_read_the_next_epoch_when_iterated_again(wds):
    """Behind a DataLoader whose workers persist, iterating again reads the next epoch, in order, as the
    loader does in its own process; a DataLoader that starts its workers each epoch takes the loader as
    this process holds it, and set_epoch says which epoch."""
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    def epoch(n):
        return _keys(loader(wds, batch_size=4, keys=("key",), device="cpu", seed=3), n)

    dl = loader(wds, batch_size=4, keys=("key",), device="cpu", seed=3)
    kept = DataLoader(dl, batch_size=None, num_workers=2, persistent_workers=True)
    assert [[list(k) for (k,) in kept] for _ in range(2)] == [epoch(0), epoch(1)]
    fresh = DataLoader(dl, batch_size=None, num_workers=2)
    got = [list(k) for (k,) in fresh]
    dl.set_epoch(4)
    assert [got, [list(k) for (k,) in fresh]] == [epoch(0), epoch(4)]


@pytest.mark.parametrize("stop", [2, 5])
def test_torchdata_s_stateful_dataloader_holds_the_loader_s_state_across_its_workers(wds, stop):
    """torchdata's StatefulDataLoader with two workers: its state taken after ``stop`` batches (each worker's
    place in the epoch, and whose turn is next) and loaded into a new one gives the rest of the epoch in
    order, nothing seen twice or lost; the same with the loader's own state through a plain DataLoader."""
    pytest.importorskip("torch")
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    from torch.utils.data import DataLoader

    def make():
        return loader(wds, batch_size=4, keys=("key",), device="cpu", seed=5)

    whole = [list(keys) for (keys,) in DataLoader(make(), batch_size=None, num_workers=2)]
    first = stateful.StatefulDataLoader(make(), batch_size=None, num_workers=2)
    seen = []
    for n, (keys,) in enumerate(first):
        seen.append(list(keys))
        if n + 1 == stop:
            state = first.state_dict()
            break
    again = stateful.StatefulDataLoader(make(), batch_size=None, num_workers=2)
    again.load_state_dict(state)
    rest = [list(keys) for (keys,) in again]
    assert seen + rest == whole and len(whole) == 15
    # the loader's own state, from the batches this process took, through a plain DataLoader's two workers
    own = make()
    own.load_state_dict(make().state_dict(batches_seen=stop))
    assert [list(keys) for (keys,) in DataLoader(own, batch_size=None, num_workers=2)] == whole[stop:]


def test_a_state_taken_between_batches_resumes_after_the_last_batch_handed_over(wds):
    one = loader(wds, batch_size=5, keys=("key",), device="cpu", seed=11)
    whole = [k for (keys,) in one for k in keys]
    dl = loader(wds, batch_size=5, keys=("key",), device="cpu", seed=11)
    seen = []
    for n, (keys,) in enumerate(dl):
        seen += keys
        if n == 3:
            state = dl.state_dict()
            break
    again = loader(wds, batch_size=5, keys=("key",), device="cpu", seed=11)
    again.load_state_dict(state)
    rest = [k for (keys,) in again for k in keys]
    assert state["consumed"] == 20 and seen + rest == whole


def test_iterating_again_after_an_epoch_s_end_reads_the_next_epoch(wds):
    """A loop over epochs needs no set_epoch: iterated again after an epoch read to its end, the loader
    reads the next epoch; a loop stopped mid-epoch is taken up where it stopped."""
    dl = loader(wds, batch_size=7, keys=("key",), device="cpu", seed=3)
    first = [k for (keys,) in dl for k in keys]
    second = [k for (keys,) in dl for k in keys]
    assert dl.epoch == 1 and sorted(first) == sorted(second) and first != second
    assert [first, second] == [[k for keys in _keys(loader(wds, batch_size=7, keys=("key",), device="cpu", seed=3),
                                                    epoch) for k in keys] for epoch in (0, 1)]
    part = []
    for n, (keys,) in enumerate(dl):  # (epoch 2, stopped after two batches)
        part += keys
        if n == 1:
            break
    part += [k for (keys,) in dl for k in keys]
    assert dl.epoch == 2 and len(part) == len(first) and sorted(part) == sorted(first)


def test_len_is_what_the_next_iteration_gives(wds):
    """len() is the batches the next loop gets: the whole epoch at its start, the rest of it mid-epoch, and
    after its end the next epoch's, which the next loop reads (a progress bar's total each epoch)."""
    dl = loader(wds, batch_size=7, keys=("key",), device="cpu", rank=1, world_size=2)
    lens = []
    for _ in range(2):  # (two epochs, no set_epoch)
        lens.append(len(dl))
        got = 0
        for n, _batch in enumerate(dl):
            got += 1
            if n == 0:
                lens.append(len(dl))  # (one handed over)
        lens.append((got, len(dl)))
    full = len(rank_batches(np.arange(60), 0, 7, 1, 2, False))
    assert full == 5 and lens == [full, full - 1, (full, full)] * 2


def _keys_in_a_daemon(path, q) -> None:
    with loader(path, CHAIN, batch_size=8, keys=("key", "image"), device="cpu", shuffle=False) as dl:
        q.put([(list(keys), np.asarray(images).shape) for keys, images in dl])


def test_the_loader_decodes_inside_a_daemonic_process(wds):
    """A DataLoader's worker is a daemonic process, which may start no processes of its own: the CPU
    pipeline decodes in threads there, giving the same batches."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_keys_in_a_daemon, args=(wds, q), daemon=True)
    p.start()
    got = q.get(timeout=120)
    p.join(30)
    with loader(wds, CHAIN, batch_size=8, keys=("key", "image"), device="cpu", shuffle=False) as dl:
        here = [(list(keys), np.asarray(images).shape) for keys, images in dl]
    assert got == here and sum(len(k) for k, _ in got) == 60


def test_a_record_s_random_draws_follow_its_key_not_its_rank_or_batch(wds):
    """Random ops draw per (seed, key, epoch): the same record comes out the same under one rank or two."""
    chain = "random_resized_crop(size=24) | flip(p=0.5)"
    one = loader(wds, chain, batch_size=6, keys=("key", "image"), device="cpu", seed=4)
    one.set_epoch(3)
    alone = {k: np.asarray(img) for keys, images in one for k, img in zip(keys, np.asarray(images))}
    seen = {}
    for rank in range(2):
        dl = loader(wds, chain, batch_size=4, keys=("key", "image"), device="cpu", seed=4, rank=rank, world_size=2)
        dl.set_epoch(3)
        seen.update({k: img for keys, images in dl for k, img in zip(keys, np.asarray(images))})
    assert sorted(seen) == sorted(alone) and all(np.array_equal(seen[k], alone[k]) for k in alone)
    other = loader(wds, chain, batch_size=6, keys=("key", "image"), device="cpu", seed=4)
    other.set_epoch(4)
    later = {k: np.asarray(img) for keys, images in other for k, img in zip(keys, np.asarray(images))}
    assert any(not np.array_equal(later[k], alone[k]) for k in alone)  # (another epoch, other draws)


def test_the_gpu_loader_s_reader_processes_hand_over_each_batch_s_records(wds):
    """LoaderFeed (the GPU path's reads, run here without a GPU): the batches of the spans asked for, each
    record's bytes in shared memory with its key, label and drawn parameters, epoch after epoch in the same
    processes; a record that cannot be read is named, not handed over."""
    import functools

    from gpubatch.engine.gpu.feed import LoaderFeed
    from gpubatch.engine.plan import Plan
    from gpubatch.formats import open_reader
    from gpubatch.formats.base import Damaged

    with open_reader(wds) as reader:
        entries = reader.entries()
        truth = {reader.read(e).key: reader.read(e) for e in entries}
    from gpubatch.engine.codecs.headers import jpeg_display_size

    truth_size = {key: jpeg_display_size(bytes(r.data[:65536])) for key, r in truth.items()}
    plan = Plan(ops=tuple(__import__("gpubatch.engine.spec", fromlist=["x"]).parse_chain(
        "random_resized_crop(size=24)")), seed=2)
    feed = LoaderFeed(functools.partial(open_reader, wds, None), plan, workers=2, depth=3)
    try:
        for epoch in (0, 1):
            order = entries[::-1] + [Damaged("gone", "nowhere", "cut short")]
            spans = [(a, min(a + 8, len(order))) for a in range(0, len(order), 8)]
            keys, failed = [], []
            for fed in feed.reading((epoch, order[a:b]) for a, b in spans):  # (a slot is the feed's again once done)
                for blob, key, label, origin, meta, params, hw in zip(fed.blobs, fed.keys, fed.labels, fed.origins,
                                                                      fed.metas, fed.params, fed.sizes):
                    assert bytes(blob) == truth[key].data and label == truth[key].label
                    assert origin == truth[key].origin and meta == truth[key].meta
                    # (drawn for the header's size; a PNG's is known after decode, and drawn there)
                    assert params == (tuple(plan.draw(key, *hw, epoch=epoch)) if hw is not None else None)
                keys += fed.keys
                failed += fed.failed
                fed.done()
            assert keys == list(truth)[::-1]
            assert failed == [{"key": "gone", "origin": "nowhere", "reason": "read: cut short"}]
        # one iteration that runs on from an epoch into the next (the loader's stream): each batch drawn
        # for its own epoch; stopped early, it leaves the next iteration every slot
        stream = ((epoch, entries[a:a + 8]) for epoch in (4, 5) for a in range(0, len(entries), 8))
        got = []
        for fed in feed.reading(stream):
            got += [(fed.epoch, key, params) for key, params in zip(fed.keys, fed.params)]
            fed.done()
            if len(got) == len(entries) + 8:
                break
        assert got == [(epoch, key, tuple(plan.draw(key, *truth_size[key], epoch=epoch)) if truth_size[key] else None)
                       for epoch in (4, 5) for key in list(truth)][:len(entries) + 8]
        assert [fed.keys for fed in feed.reading([(6, entries[:8])])] == [list(truth)[:8]]
    finally:
        feed.close()
    # a loader that asks for keys, images and labels only is sent no metas and no boxes
    with LoaderFeed(functools.partial(open_reader, wds, None), plan, workers=1, depth=2,
                    fields=("key", "image", "label")) as lean:
        (fed,) = list(lean.reading([(0, entries[:4])]))
        assert fed.metas is None and fed.boxes is None and fed.keys == list(truth)[:4] and len(fed.labels) == 4


def test_the_gpu_loader_s_readers_cut_regions_as_the_file_feed_does(wds):
    """``GPUBATCH_REGION_DECODE`` for the loader: with ``regions`` the reader processes name the part of
    each upright JPEG the leading crop reads, report its size and move the window into it, so that the
    window put back where the region lies is the window of the whole image (as FileFeed's regions)."""
    import functools

    from gpubatch.engine.gpu.feed import LoaderFeed
    from gpubatch.engine.plan import Plan
    from gpubatch.engine.spec import parse_chain
    from gpubatch.formats import open_reader

    with open_reader(wds) as reader:
        entries = reader.entries()
    plan = Plan(ops=tuple(parse_chain("random_resized_crop(size=24) | flip")), seed=2)
    got = {}
    for regions in (False, True):
        with LoaderFeed(functools.partial(open_reader, wds, None), plan, workers=1, depth=2, regions=regions) as feed:
            got[regions] = {}
            for fed in feed.reading([(0, entries[a:a + 16]) for a in range(0, len(entries), 16)]):
                assert (fed.regions is not None) == regions
                for i, key in enumerate(fed.keys):
                    got[regions][key] = (fed.sizes[i], fed.windows[0][i].copy(), fed.windows[1][i].copy(),
                                         fed.regions[i] if regions else None)
                fed.done()
    assert got[True].keys() == got[False].keys() and len(got[True]) == len(entries)
    cut = 0
    for key, (size, geometry, out, region) in got[True].items():
        whole_size, whole_geometry, whole_out, _ = got[False][key]
        np.testing.assert_array_equal(out, whole_out)
        if region is None:
            assert size == whole_size
            np.testing.assert_array_equal(geometry, whole_geometry)
            continue
        y0, x0, y1, x1 = region
        assert size == (y1 - y0, x1 - x0) and (y1 - y0) * (x1 - x0) < whole_size[0] * whole_size[1]
        moved = geometry.copy()
        moved[0] += y0
        moved[2] += x0
        np.testing.assert_allclose(moved, whole_geometry, rtol=1e-6, atol=1e-4)
        cut += 1
    assert cut >= len(entries) // 2  # (most random crops read well under the whole image)


@pytest.mark.parametrize("env,regions,banks", [({}, True, 2), ({"GPUBATCH_REGION_DECODE": "0"}, False, 2),
                                                ({"GPUBATCH_RING_BANKS": "1"}, True, 1),
                                                ({"GPUBATCH_REGION_DECODE": "1", "GPUBATCH_RING_BANKS": "3"}, True, 3)])
def test_the_loader_s_image_pipeline_decodes_regions_into_two_banks_unless_told_otherwise(wds, monkeypatch, env,
                                                                                       regions, banks):
    """The training loader's image pipeline: region decode and two banks of decode buffers by default
    (``LOADER_REGIONS``, ``LOADER_BANKS``), the environment's settings over them; the pipelines' own
    default stays whole images and one bank."""
    import gpubatch.pipelines.image as image_mod
    from gpubatch.engine.settings import Settings

    made = {}

    class Recorder:  # (what the loader asks of the pipeline; the GPU pipeline itself is not made here)
        def __init__(self, ops, **kw):
            made.update(kw)

    for var in ("GPUBATCH_REGION_DECODE", "GPUBATCH_RING_BANKS"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setattr(image_mod, "ImagePipeline", Recorder)
    loader(wds, "random_resized_crop(size=24)", device="cpu")._pipeline()
    assert (made["region_decode"], made["settings"].ring_banks) == (regions, banks)
    if not env:
        st = Settings.from_env()
        assert (bool(st.region_decode), max(1, st.ring_banks)) == (False, 1)


def walk_epochs(dl, rows) -> tuple[dict[int, list], list]:
    """A loop over epochs as training loops go: epoch 0, iterated again (epoch 1), set_epoch(2), epoch 3
    stopped after two batches and taken up again, then set_epoch(7) (off the stream's way). Each epoch's
    ``rows(batch)``, and the loader's stream after epochs 0, 1, 2 and 7."""
    epochs, streams = {}, []
    for epoch in (0, 1):
        epochs[epoch] = [rows(b) for b in dl]  # (epoch 1: iterated again, read on from epoch 0's end)
        streams.append(dl._stream)
    dl.set_epoch(2)
    epochs[2] = [rows(b) for b in dl]
    streams.append(dl._stream)
    epochs[3] = []
    for n, b in enumerate(dl):
        epochs[3].append(rows(b))
        if n == 1:
            break
    epochs[3] += [rows(b) for b in dl]
    dl.set_epoch(7)
    epochs[7] = [rows(b) for b in dl]
    streams.append(dl._stream)
    assert dl.epoch == 7 and len(epochs[0]) > 2
    return epochs, streams


class _FedOnTheCpu(Loader):
    """The GPU path's reads (reader processes, a stream that runs on from epoch to epoch) before the CPU's
    decoder: the stream's logic checked without a GPU."""

    def _feed(self, pipe):
        import functools

        from gpubatch.engine.gpu.feed import LoaderFeed
        from gpubatch.formats import open_reader

        if self._readers is None:
            self._readers = LoaderFeed(functools.partial(open_reader, self.path, self.fmt), pipe.plan, workers=2,
                                       depth=4, fields=self.keys)
        return self._readers


def test_the_reads_run_on_from_one_epoch_into_the_next_and_give_each_epoch_s_own_batches(wds, monkeypatch):
    """The GPU path's stream (here before the CPU's decoder): each epoch of a loop over epochs, iterated again
    or set, is the epoch a loader started at it gives, images and labels included; a loop stopped mid-epoch
    goes on where it stopped; a set_epoch off the stream's way starts a new one."""
    monkeypatch.setenv("GPUBATCH_PIN_FEED", "0")  # (no GPU to page-lock for)
    chain = "random_resized_crop(size=24) | flip(p=0.5)"
    kw = dict(batch_size=8, keys=("key", "image", "label"), device="cpu", seed=5)

    def rows(batch):
        key, images, labels = batch
        return list(key), np.asarray(images), labels.tolist()

    def alone(epoch):
        with loader(wds, chain, **kw) as dl:
            dl.set_epoch(epoch)
            return [rows(b) for b in dl]

    with _FedOnTheCpu(wds, chain, **kw) as dl:
        epochs, streams = walk_epochs(dl, rows)
    assert streams[0] is streams[1] is streams[2] and streams[3] is not streams[2]  # (one stream over epochs 0 to 2)
    for epoch, got in epochs.items():
        want = alone(epoch)
        assert [(k, lab) for k, _, lab in got] == [(k, lab) for k, _, lab in want], epoch
        assert all(np.array_equal(g, w) for (_, g, _), (_, w, _) in zip(got, want)), epoch


def test_an_error_in_the_stream_is_raised_and_the_next_iteration_reads_again(wds, monkeypatch):
    """A batch that fails in the stream (here its processing) raises in the loop; the stream it ended is
    dropped, and iterating again reads from where the epoch stands."""
    monkeypatch.setenv("GPUBATCH_PIN_FEED", "0")
    kw = dict(batch_size=8, keys=("key", "label"), device="cpu", seed=5)
    with loader(wds, CHAIN, **kw) as ref:
        whole = [list(k) for k, _ in ref]
    with _FedOnTheCpu(wds, CHAIN, batch_size=8, keys=("key", "image", "label"), device="cpu", seed=5) as dl:
        pipe = dl._pipeline()
        real, calls = pipe.process, []

        def flaky(*a, **k):
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError("a device error")
            return real(*a, **k)

        monkeypatch.setattr(pipe, "process", flaky)
        got = []
        with pytest.raises(RuntimeError, match="a device error"):
            for keys, _, _ in dl:
                got.append(list(keys))
        assert dl._stream is None and len(got) == 2
        got += [list(keys) for keys, _, _ in dl]  # (from the third batch on, a stream of its own)
    assert got == whole


def test_a_batch_whose_records_all_fail_still_comes_empty_so_ranks_keep_in_step(tmp_path):
    """Two recordings are too short for a log-mel frame: one leaves the first batch smaller, the other is all the last
    batch holds, which comes with no rows (keys and labels empty, aligned), so that the loop takes as many steps as
    ``len(loader)`` says on every rank; both are named in ``skipped`` with the op's reason."""
    import soundfile as sf

    src = tmp_path / "src"
    for i, n in enumerate([16000, 16000, 100, 50, 16000]):
        (src / ("yes" if i % 2 else "no")).mkdir(parents=True, exist_ok=True)
        sf.write(src / ("yes" if i % 2 else "no") / f"c{i}.wav", np.full((n,), 0.05 * (i + 1)), 16000)
    out = tmp_path / "wds"
    convert(src, out, to="webdataset")
    keys = ("key", "audio", "label")
    ld = loader(out, batch_size=2, device="cpu", shuffle=False, keys=keys, ops="log_mel(n_mels=80)")
    plain = loader(out, batch_size=2, device="cpu", shuffle=False, keys=keys, ops="fix_duration(seconds=1)")
    order = [k for k, _, _ in plain]
    steps = len(ld)
    got = [(list(keys), np.asarray(labels).tolist()) for keys, _, labels in ld]
    assert steps == len(got) == 3 and got[2] == ([], []), got
    short = {"no/c2", "yes/c3"}
    for (keys, labels), planned in zip(got, order):
        assert keys == [k for k in planned if k not in short] and len(labels) == len(keys), (keys, planned)
    assert sorted(e["key"] for e in ld.skipped) == sorted(short), ld.skipped
    assert all("too short for log_mel" in e["reason"] for e in ld.skipped), ld.skipped
