"""EAGLE-3 speculative decoding: the draft head (`eagle3_draft`), its configuration (`eagle3_config`),
checkpoint format (`eagle3_checkpoint`) and draft vocabulary (`vocab_map`)."""
