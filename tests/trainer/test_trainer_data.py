"""The training stream over real MDS data made by owt_to_mds.py: exact resumption, epochs,
mixing, validation, and the pre-flight checks of a data folder. One process, streaming for real."""

import gc
import json
import shutil

import pytest
import torch
from trainer_testing import SEQ_LEN, as_one_process, build_data, real_documents

from aogpt import UsageError
from aogpt.trainer.config import StreamConfig, load_config
from aogpt.trainer.data import TrainBatches, check_data, validation_loader
from aogpt.trainer.dist_env import setup_distributed_env

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def one_process(monkeypatch):
    as_one_process(monkeypatch)
    yield
    gc.collect()  # streaming frees its shared memory when the dataset object goes


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    """~20 micro-batches per epoch, so a test runs through several epochs quickly."""
    documents = real_documents()
    small = [d[:4000] for d in documents[:10]]
    return build_data(tmp_path_factory.mktemp("data") / "small", small, val_fraction=0.0)


def config(repo, data, *overrides):
    return load_config(repo / "configs" / "tiny.yaml",
                       [f"data.path={data}", f"model.block_size={SEQ_LEN}",
                        "train.micro_batch_size=8", "train.tokens_per_step=512",
                        "data.num_workers=1", "eval.every=0", *overrides])


def batches_for(cfg):
    env = setup_distributed_env()
    return TrainBatches(cfg, check_data(cfg, env), env, CPU)


def rows(batch) -> list[tuple]:
    """The token rows of a (tokens, sample ids) batch, as hashable tuples."""
    return [tuple(row.tolist()) for row in batch[0]]


def same_batch(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def draw(stream, batches: int) -> tuple[list, list[dict]]:
    """The stream's next batches, and its position after each."""
    seen, states = [], []
    for _ in range(batches):
        seen.append(next(stream))
        states.append(stream.state_dict())
    return seen, states


def test_resumed_stream_continues_with_the_next_batch_even_across_epochs(repo, small_data):
    cfg = config(repo, small_data)
    stream = batches_for(cfg)
    seen, states = draw(stream, 45)
    del stream
    epochs = [s["epoch"] for s in states]
    assert epochs[-1] >= 1, "the test must cross an epoch boundary"
    end_of_epoch = epochs.index(1) - 1
    for k in (3, end_of_epoch, end_of_epoch + 2):
        resumed = batches_for(cfg)
        resumed.load_state_dict(states[k])
        for expected in seen[k + 1:k + 4]:
            assert same_batch(next(resumed), expected)
        del resumed
        gc.collect()


def test_the_same_stream_goes_back_to_an_earlier_position_and_skips_past_batches(repo, small_data):
    """A rollback, in the process that drew the batches: back to a position of an earlier epoch
    or of this one (streaming takes the first for stale unless told), then past two batches."""
    cfg = config(repo, small_data)
    stream = batches_for(cfg)
    seen, states = draw(stream, 30)
    assert states[-1]["epoch"] >= 1 and states[3]["epoch"] == 0, "the test must cross an epoch"
    for k in (3, len(states) - 5):
        stream.load_state_dict(states[k])
        assert same_batch(next(stream), seen[k + 1])
    stream.load_state_dict(states[3])
    skipped = stream.skip(2)
    assert skipped == seen[4][1].tolist() + seen[5][1].tolist()
    assert same_batch(next(stream), seen[6])
    assert stream.state_dict() == states[6]


def test_cached_copy_of_the_shards_streams_the_same_batches(repo, text_data, tmp_path):
    direct = next(batches_for(config(repo, text_data)))
    gc.collect()
    cached = batches_for(config(repo, text_data, f"data.local_cache={tmp_path / 'cache'}"))
    assert same_batch(next(cached), direct)
    assert list((tmp_path / "cache").glob("node0/*/train/shard.*.mds"))  # read from the copy


def test_every_epoch_reshuffles_the_same_samples(repo, small_data):
    stream = batches_for(config(repo, small_data))
    by_epoch = {}
    while len(by_epoch) < 3:
        batch = next(stream)
        by_epoch.setdefault(stream.state_dict()["epoch"], []).extend(rows(batch))
    first, second = by_epoch[0], by_epoch[1]
    assert first != second
    assert len(set(first)) == len(first)  # no sample twice within an epoch
    # drop_last skips an epoch's few leftovers (fewer than a micro-batch), never more
    assert len(set(first) ^ set(second)) < 2 * 8 and len(first) == len(second)


def test_each_sample_carries_its_index_in_the_dataset(repo, small_data):
    stream = batches_for(config(repo, small_data))
    by_epoch = {}
    while len(by_epoch) < 2:
        tokens, sample_ids = next(stream)
        for row, sample_id in zip(tokens, sample_ids.tolist(), strict=True):
            stored = stream.dataset[sample_id]["tokens"]  # random access by that index
            assert torch.equal(row, torch.from_numpy(stored.astype("int64")))
        by_epoch.setdefault(stream.state_dict()["epoch"], []).extend(sample_ids.tolist())
    assert len(set(by_epoch[0])) == len(by_epoch[0])  # an index names one sample


def test_order_follows_train_seed(repo, small_data):
    first = rows(next(batches_for(config(repo, small_data, "train.seed=1"))))
    gc.collect()
    again = rows(next(batches_for(config(repo, small_data, "train.seed=1"))))
    gc.collect()
    other = rows(next(batches_for(config(repo, small_data, "train.seed=2"))))
    assert first == again and first != other


def test_streams_are_mixed_by_proportion(repo, small_data, text_data):
    cfg = config(repo, text_data, f"data.streams=[{{path: {text_data}, proportion: 0.75}}, "
                                  f"{{path: {small_data}}}]")
    assert cfg.data.streams[1] == StreamConfig(str(small_data), None)
    small_samples = set()
    for batch in batches_for(config(repo, small_data, "data.num_workers=0")).loader:
        small_samples.update(rows(batch))
    gc.collect()
    stream = batches_for(cfg)
    drawn = []
    while not drawn or stream.state_dict()["epoch"] == 0:  # one whole epoch
        drawn.extend(rows(next(stream)))
    share_small = sum(row in small_samples for row in drawn) / len(drawn)
    # streaming draws each share in whole samples and batches: small sets land near, not on, it
    assert share_small == pytest.approx(0.25, abs=0.02)


def test_validation_batches_are_the_same_at_every_evaluation(repo, text_data):
    cfg = config(repo, text_data, "eval.every=10")
    env = setup_distributed_env()
    loader = validation_loader(cfg, check_data(cfg, env), env, CPU)
    first = [rows(b) for _, b in zip(range(3), loader, strict=False)]
    second = [rows(b) for _, b in zip(range(3), loader, strict=False)]
    assert first == second and len(first) == 3


def test_missing_data_folder_is_a_usage_error(repo, tmp_path):
    cfg = config(repo, tmp_path / "absent")
    with pytest.raises(UsageError, match="does not exist .* build it with"):
        check_data(cfg, setup_distributed_env())


def test_data_of_another_sequence_length_is_a_usage_error(repo, text_data):
    cfg = config(repo, text_data, "model.block_size=128", "train.tokens_per_step=1024")
    with pytest.raises(UsageError,
                       match="samples of 64 tokens, the model's sequence length is 128"):
        check_data(cfg, setup_distributed_env())


def test_data_of_another_tokenizer_is_a_usage_error(repo, text_data, tmp_path):
    other = tmp_path / "other_tokenizer"
    shutil.copytree(text_data, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["tokenizer"].update(name="llama", ranks_sha256="0" * 64)
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UsageError, match="tokenized with 'llama'"):
        check_data(config(repo, other), setup_distributed_env())


def test_too_little_training_data_for_one_micro_batch_per_rank_is_a_usage_error(repo, small_data):
    cfg = config(repo, small_data, "train.micro_batch_size=512", "train.tokens_per_step=32768")
    with pytest.raises(UsageError, match="fewer than one micro-batch on every rank .512."):
        check_data(cfg, setup_distributed_env())


def test_periodic_validation_needs_a_val_split(repo, small_data):
    with pytest.raises(UsageError, match="val split of .* is empty: .* or set eval.every=0"):
        check_data(config(repo, small_data, "eval.every=10"), setup_distributed_env())
