"""Text -> GPT-2 tokens -> MosaicML Streaming MDS shards."""
