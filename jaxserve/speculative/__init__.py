"""EAGLE-3 speculative decoding: the draft head (`eagle3_draft`), its checkpoint format
(`eagle3_checkpoint`) and draft vocabulary (`vocab_map`)."""
