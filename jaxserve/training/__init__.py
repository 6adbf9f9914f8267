"""Training scripts for the embedded default model: a tiny gpt-oss target and its EAGLE-3 head.

How to retrain (CPU is enough; about 25 minutes on 2 cores, all offline):

    python -m jaxserve.training.build_embedded --work build/embedded     # every stage, then export

or stage by stage (defaults read and write build/embedded/<stage>):

    python -m jaxserve.training.corpus       # stdlib docstrings + language reference -> train/heldout.txt
    python -m jaxserve.training.tokenizer    # byte-level BPE, vocab 1024 -> tokenizer.json
    python -m jaxserve.training.target       # GptOssForCausalLM, ~1.8M params; 1200 steps, cap 15 min
    python -m jaxserve.training.draft        # EAGLE-3 head on target-generated text; 600 steps, cap 8 min
    python -m jaxserve.training.export       # -> jaxserve/assets/embedded (+ draft/), < 20 MB

Modules: `corpus`, `tokenizer`, `data` (token streams, windows, lr schedule), `dense` (the serving model's
modules run over [batch, length] windows with dense attention; same math as the paged path), `target`,
`generate` (batched continuations through the serving forward), `draft` (TTT unroll and losses), `export`
(HF checkpoints), `build_embedded`. Each script writes `training.json` with its losses and throughput.
"""
