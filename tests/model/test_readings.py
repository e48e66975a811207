"""The random streams' ids (model/orders.py's Stream) are one table of distinct values."""

from aogpt.model.orders import Stream


def test_random_stream_ids_are_distinct_and_keep_their_values():
    # a renumbered id would change every order, sample and ensemble member drawn with it
    assert len({int(stream) for stream in Stream}) == len(Stream)
    assert {stream.name: int(stream) for stream in Stream} == {
        "PERMUTATION": 1, "COIN": 2, "BLOCKS": 3, "SAMPLE_ORDER": 11, "REVEAL": 12, "TOKEN": 13,
        "ENSEMBLE_TARGETS": 101, "ENSEMBLE_MEMBERS": 102}
