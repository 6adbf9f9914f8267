"""Train the embedded EAGLE-3 head on text the target generated (training-time test, K steps).

Data: prompts are windows of the corpus (train split for training, held-out split for evaluation); the
target continues each one (`jaxserve.training.generate`, half the rows greedy, half sampled), because the
draft must predict the target, not the corpus. The draft vocabulary is the `--draft-vocab-size` most
frequent target tokens of that generated text (`jaxserve.speculative.vocab_map`).

Recipe (EAGLE-3's training-time test, as in the EAGLE reference trainer and SpecForge): the frozen target
gives, per position t, the captured states aux_t and logits. Step k = 0..K-1 of the unroll, at every t: input
token x_{t+1+k}, hidden fc(aux_t) at k = 0 and the draft's own pre-norm output of step k-1 after, rotary
position t + k; the query attends to the step-0 keys at positions <= t and to its own position's keys of steps
1..k (what the draft sees when serving a chain); the teacher is softmax(target logits at t+1+k restricted to
the draft vocabulary), positions whose target argmax is outside it are masked out; loss = sum_k 0.8^k *
cross-entropy_k. Reported per step k: top-1 agreement = argmax(draft) mapped through d2t == argmax(target), on
held-out generated text. The shared embedding (the target's) stays frozen; AdamW as for the target.

    python -m jaxserve.training.draft --target build/embedded/target --corpus build/embedded/corpus \
        --out build/embedded/draft --steps 600 --minutes 8
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxserve.loader.load import load_model
from jaxserve.loader.tokenizer import HFTokenizer
from jaxserve.models.step import make_forward
from jaxserve.speculative.eagle3_checkpoint import save_eagle3_draft
from jaxserve.speculative.eagle3_draft import Eagle3Config, Eagle3Draft, random_draft
from jaxserve.speculative.vocab_map import build_vocab_map
from jaxserve.training import data
from jaxserve.training.dense import dense_forward
from jaxserve.training.generate import continue_prompts
from jaxserve.training.target import make_optimizer, set_lr

LOSS_DECAY = 0.8
_MASKED = -1e30


def draft_config(target_raw: dict, aux_layer_ids: tuple[int, ...], draft_vocab_size: int | None,
                 intermediate_size: int) -> Eagle3Config:
    """A draft matching the target's width and heads (Llama rope, theta 10000, as published heads use)."""
    return Eagle3Config.from_dict({
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": target_raw["hidden_size"],
        "intermediate_size": intermediate_size, "num_attention_heads": target_raw["num_attention_heads"],
        "num_key_value_heads": target_raw["num_key_value_heads"], "head_dim": target_raw["head_dim"],
        "vocab_size": target_raw["vocab_size"], "draft_vocab_size": draft_vocab_size,
        "rms_norm_eps": target_raw.get("rms_norm_eps", 1e-5), "max_position_embeddings": 4096,
        "rope_theta": 10000.0, "torch_dtype": "float32",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_layer_ids)}})


def ttt_attention(q: jax.Array, k0: jax.Array, v0: jax.Array, diag_k: list[jax.Array],
                  diag_v: list[jax.Array]) -> jax.Array:
    """`q [B, T, H, D]` over causal step-0 keys `k0, v0 [B, T, Hkv, D]` plus, per position, the keys of
    later unroll steps at that same position (`diag_k[j] [B, T, Hkv, D]`). Returns `[B, T, H * D]`."""
    batch, num_tokens, num_heads, head_dim = q.shape
    num_kv = k0.shape[2]
    group = num_heads // num_kv
    qg = q.reshape(batch, num_tokens, num_kv, group, head_dim) * head_dim ** -0.5
    causal = jnp.einsum("bqhgd,bkhd->bhgqk", qg, k0, preferred_element_type=jnp.float32)
    pos = jnp.arange(num_tokens)
    causal = jnp.where(pos[None, :] <= pos[:, None], causal, _MASKED)
    diag = [jnp.einsum("bthgd,bthd->bhgt", qg, kj, preferred_element_type=jnp.float32)[..., None]
            for kj in diag_k]
    probs = jax.nn.softmax(jnp.concatenate([causal, *diag], axis=-1), axis=-1)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", probs[..., :num_tokens], v0)
    for j, vj in enumerate(diag_v):
        out = out + jnp.einsum("bhgt,bthd->bthgd", probs[..., num_tokens + j], vj)
    return out.reshape(batch, num_tokens, num_heads * head_dim)


def ttt_unroll(draft: Eagle3Draft, embedding: jax.Array, ids: jax.Array, aux: jax.Array,
               num_steps: int) -> list[jax.Array]:
    """Draft logits `[B, T, draft_vocab]` of each unroll step k (T = L - num_steps for `ids [B, L]`):
    step k at position t reads token `ids[:, t + 1 + k]` and predicts the target at t + 1 + k."""
    batch, length = ids.shape
    num_tokens = length - num_steps
    hidden = draft.fuse(aux[:, :num_tokens])
    cfg = draft.config
    k0 = v0 = None
    diag_k, diag_v, logits = [], [], []
    for k in range(num_steps):
        embeds = jnp.take(embedding, ids[:, 1 + k: 1 + k + num_tokens], axis=0)
        positions = jnp.broadcast_to(jnp.arange(num_tokens) + k, (batch, num_tokens)).reshape(-1)
        q, kk, vv = draft.qkv(embeds.reshape(-1, cfg.hidden_size), hidden.reshape(-1, cfg.hidden_size),
                              positions)
        q = q.reshape(batch, num_tokens, cfg.num_heads, cfg.head_dim)
        kk = kk.reshape(batch, num_tokens, cfg.num_kv_heads, cfg.head_dim)
        vv = vv.reshape(batch, num_tokens, cfg.num_kv_heads, cfg.head_dim)
        if k == 0:
            k0, v0 = kk, vv
        else:
            diag_k.append(kk)
            diag_v.append(vv)
        hidden = draft.finish(ttt_attention(q, k0, v0, diag_k, diag_v), hidden)
        logits.append(draft.logits(hidden))
    return logits


def ttt_losses(draft: Eagle3Draft, target_logits: jax.Array, step_logits: list[jax.Array]):
    """Per step k: soft cross-entropy on positions whose target argmax is in the draft vocab, top-1
    agreement of the mapped draft argmax with the target argmax over all positions, and that mapped argmax
    `[B, T]` (a target id). Returns three lists over k."""
    cfg = draft.config
    draft_ids = jnp.arange(cfg.num_draft_tokens)
    target_ids = draft.to_target_ids(draft_ids)
    in_vocab = jnp.zeros(cfg.vocab_size, bool).at[target_ids].set(True)
    num_tokens = step_logits[0].shape[1]
    losses, accs, preds = [], [], []
    for k, logits in enumerate(step_logits):
        teacher = target_logits[:, 1 + k: 1 + k + num_tokens]
        target_top = teacher.argmax(-1)
        mask = in_vocab[target_top].astype(jnp.float32)
        p = jax.nn.softmax(teacher[..., target_ids], axis=-1)
        ce = -(p * jax.nn.log_softmax(logits, axis=-1)).sum(-1)
        losses.append((ce * mask).sum() / jnp.maximum(mask.sum(), 1.0))
        preds.append(target_ids[logits.argmax(-1)])
        accs.append((preds[-1] == target_top).mean())
    return losses, accs, preds


class DraftTrainer:
    """Jitted TTT steps on the draft's `nnx.Param`s; the target (and its embedding) stay frozen."""

    def __init__(self, draft: Eagle3Draft, target, num_steps: int):
        self.graphdef, self.params, self.rest = nnx.split(draft, nnx.Param, ...)
        t_graphdef, t_state = nnx.split(target)
        self.tx = make_optimizer()
        self.opt_state = self.tx.init(self.params)
        graphdef, rest, tx = self.graphdef, self.rest, self.tx

        def metrics(params, t_state, ids):
            model = nnx.merge(t_graphdef, t_state)
            target_logits, aux = jax.lax.stop_gradient(dense_forward(model, ids))
            embedding = jax.lax.stop_gradient(model.embed.embed.embedding[...])
            d = nnx.merge(graphdef, params, rest)
            losses, accs, preds = ttt_losses(d, target_logits, ttt_unroll(d, embedding, ids, aux, num_steps))
            total = sum(LOSS_DECAY ** k * loss for k, loss in enumerate(losses))
            return total, (jnp.stack(losses), jnp.stack(accs), jnp.stack(preds, axis=-1))

        @functools.partial(jax.jit, donate_argnums=(0, 1))
        def step(params, opt_state, t_state, ids):
            (_, (losses, accs, _)), grads = jax.value_and_grad(metrics, has_aux=True)(params, t_state, ids)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, (losses, accs)

        self._t_state = t_state
        self._step = step
        self._eval = jax.jit(lambda params, t_state, ids: metrics(params, t_state, ids)[1])

    def step(self, ids: np.ndarray, lr: float):
        self.opt_state = set_lr(self.opt_state, lr)
        self.params, self.opt_state, (losses, accs) = self._step(self.params, self.opt_state, self._t_state,
                                                                 jnp.asarray(ids))
        return losses, accs

    def evaluate(self, sequences: np.ndarray, batch_size: int) -> tuple[list[float], list[float], np.ndarray]:
        """Mean loss and agreement per unroll step over `sequences`, and the draft's mapped argmax
        `[n, T, K]` (for the first n = whole batches of sequences)."""
        out = [self._eval(self.params, self._t_state, jnp.asarray(sequences[i: i + batch_size]))
               for i in range(0, max(1, len(sequences) - batch_size + 1), batch_size)]
        losses = np.mean([np.asarray(o[0]) for o in out], axis=0)
        accs = np.mean([np.asarray(o[1]) for o in out], axis=0)
        preds = np.concatenate([np.asarray(o[2]) for o in out])
        return [round(float(x), 4) for x in losses], [round(float(x), 4) for x in accs], preds

    def model(self) -> Eagle3Draft:
        return nnx.merge(self.graphdef, self.params, self.rest)


def chain_acceptance(preds: np.ndarray, sequences: np.ndarray, prompt_len: int, num_steps: int = 2) -> dict:
    """Acceptance of greedy chain drafting (topk 1, `num_steps` draft tokens per verify), replayed on the
    greedy rows (even rows, see `generate_data`) of `sequences` from the unroll's predictions.

    After prefill of the `prompt_len` prompt tokens the target has produced x_P; a verify with the newest
    token x_n proposes the step-k predictions at position n - 1, accepts them while they equal x_{n+1+k}
    (the target's greedy tokens) and emits accepted + 1 tokens. Exact for greedy verification: a later
    step's input only matters when the earlier draft was accepted, i.e. equal to the teacher-forced token.
    Returns the pooled mean of (accepted + 1) per verify and SGLang's acc_length (completion tokens, first
    token included, over verifies), pooled over requests.
    """
    rows = np.arange(0, min(len(preds), len(sequences)), 2)
    num_positions = preds.shape[1]
    emitted = verifies = completion = 0
    for row in rows:
        seq, n = sequences[row], prompt_len
        completion += 1
        while n - 1 < num_positions and n + num_steps < len(seq):
            accepted = 0
            while accepted < num_steps and preds[row, n - 1, accepted] == seq[n + 1 + accepted]:
                accepted += 1
            emitted += accepted + 1
            completion += accepted + 1
            verifies += 1
            n += accepted + 1
    return {"mean_tokens_per_verify": round(emitted / max(verifies, 1), 4),
            "acc_length": round(completion / max(verifies, 1), 4), "verifies": verifies,
            "num_steps": num_steps}


def generate_data(target, stream: np.ndarray, num_seqs: int, prompt_len: int, seq_len: int, seed: int,
                  batch_size: int = 64) -> np.ndarray:
    """`[num_seqs, seq_len]`: corpus windows of `prompt_len` tokens continued by the target, even rows
    greedy and odd rows at temperature 0.8."""
    rng = np.random.default_rng(seed)
    forward = make_forward(target)
    out = []
    for start in range(0, num_seqs, batch_size):
        n = min(batch_size, num_seqs - start)
        prompts = data.sample_windows(stream, batch_size, prompt_len, rng)
        temps = np.where(np.arange(batch_size) % 2 == 0, 0.0, 0.8)
        out.append(continue_prompts(target, prompts, seq_len - prompt_len, temps, rng, forward)[:n])
    return np.concatenate(out)


def init_head_from_target(draft: Eagle3Draft, target) -> None:
    """Start the draft's LM head and final norm from the target's (rows of the draft vocabulary): the
    draft's output state then begins in the target's logit space, which shortens training a lot."""
    if target.config.tie_word_embeddings or target.config.hidden_size != draft.config.hidden_size:
        return
    ids = draft.to_target_ids(jnp.arange(draft.config.num_draft_tokens))
    draft.lm_head.kernel[...] = target.lm_head.kernel[...][:, ids]
    draft.norm.weight[...] = jnp.array(target.final_norm.weight[...], copy=True)  # own buffer: donated


def evaluate(trainer: DraftTrainer, sequences: np.ndarray, args: argparse.Namespace) -> dict:
    loss, acc, preds = trainer.evaluate(sequences, args.batch_size)
    return {"heldout_loss": loss, "heldout_acc": acc,
            "heldout_chain_acc_length": chain_acceptance(preds, sequences, args.prompt_len)}


def train(args: argparse.Namespace) -> dict:
    aux_ids = tuple(args.aux_layer_ids)
    target = load_model(args.target, progress=False, aux_hidden_state_layer_ids=aux_ids)
    has_tokenizer = (Path(args.target) / "tokenizer.json").exists()
    tokenizer = HFTokenizer(args.target if has_tokenizer else args.tokenizer)
    corpus = Path(args.corpus)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    train_seqs = generate_data(target, data.encode_file(tokenizer, corpus / "train.txt"), args.num_sequences,
                               args.prompt_len, args.seq_len, args.seed)
    heldout_seqs = generate_data(target, data.encode_file(tokenizer, corpus / "heldout.txt"),
                                 args.eval_sequences, args.prompt_len, args.seq_len, args.seed + 1)
    gen_s = time.perf_counter() - t0
    counts = np.bincount(train_seqs[:, args.prompt_len:].reshape(-1), minlength=target.config.vocab_size)
    vocab_size = args.draft_vocab_size or None
    vocab_map = build_vocab_map(counts, vocab_size) if vocab_size else None
    coverage = float(np.sort(counts)[::-1][:vocab_size].sum() / counts.sum()) if vocab_size else 1.0
    cfg = draft_config(dict(target.config.raw), aux_ids, vocab_size, args.intermediate_size)
    draft = random_draft(cfg, seed=args.seed, vocab_map=vocab_map)
    if not args.random_head:
        init_head_from_target(draft, target)
    if args.init_from:
        from jaxserve.speculative.eagle3_checkpoint import load_eagle3_draft
        draft = load_eagle3_draft(args.init_from)
    trainer = DraftTrainer(draft, target, args.ttt_steps)
    log = {"generated_train_tokens": int(train_seqs.size), "generated_heldout_tokens": int(heldout_seqs.size),
           "generation_s": round(gen_s, 1), "draft_vocab_size": vocab_size, "draft_vocab_coverage": coverage,
           "aux_layer_ids": list(aux_ids), "ttt_steps": args.ttt_steps, "steps": []}
    print(json.dumps({k: v for k, v in log.items() if k != "steps"}), flush=True)
    rng = np.random.default_rng(args.seed)
    warmup = min(50, max(1, args.steps // 10))
    start = time.perf_counter()
    step, tokens, mark = 0, 0, start
    for step in range(args.steps):
        progress = max(step / args.steps,
                       (time.perf_counter() - start) / (60 * args.minutes) if args.minutes else 0.0)
        if progress >= 1.0:
            break
        lr = data.cosine_lr(int(progress * args.steps), peak=args.lr, warmup=warmup, total=args.steps)
        batch = train_seqs[rng.integers(0, len(train_seqs), args.batch_size)]
        losses, accs = trainer.step(batch, lr)
        tokens += batch.size
        if (step + 1) % args.log_every == 0 or step == 0:
            losses, accs = np.asarray(losses), np.asarray(accs)  # waits for the step: honest tokens/s
            now = time.perf_counter()
            entry = {"step": step + 1, "loss": [round(float(x), 4) for x in losses],
                     "acc": [round(float(x), 4) for x in accs], "lr": round(lr, 6),
                     "tokens_per_s": round(tokens / (now - mark), 1), "elapsed_s": round(now - start, 1)}
            if (step + 1) % args.eval_every == 0:
                entry.update(evaluate(trainer, heldout_seqs, args))
            log["steps"].append(entry)
            print(json.dumps(entry), flush=True)
            tokens, mark = 0, time.perf_counter()
        if args.save_every and (step + 1) % args.save_every == 0:
            save_eagle3_draft(trainer.model(), out)
    log.update({f"final_{k}": v for k, v in evaluate(trainer, heldout_seqs, args).items()})
    log["steps_done"] = step + 1
    log["wall_s"] = round(time.perf_counter() - start, 1)
    save_eagle3_draft(trainer.model(), out)
    (out / "training.json").write_text(json.dumps(log, indent=1))
    print(json.dumps({"final_heldout_acc_per_step": log["final_heldout_acc"],
                      "final_heldout_chain_acc_length": log["final_heldout_chain_acc_length"],
                      "steps": log["steps_done"], "wall_s": log["wall_s"]}), flush=True)
    return log


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="build/embedded/target")
    p.add_argument("--tokenizer", default="build/embedded/tokenizer", help="if the target dir has none")
    p.add_argument("--corpus", default="build/embedded/corpus")
    p.add_argument("--out", default="build/embedded/draft")
    p.add_argument("--init-from", default=None, help="continue from this draft checkpoint directory")
    p.add_argument("--aux-layer-ids", type=int, nargs="+", default=[0, 1, 2],
                   help="target layers whose outputs the draft reads (eagle_aux_hidden_state_layer_ids)")
    p.add_argument("--draft-vocab-size", type=int, default=768, help="0 = the full target vocabulary")
    p.add_argument("--intermediate-size", type=int, default=512)
    p.add_argument("--random-head", action="store_true",
                   help="do not start the LM head and final norm from the target's")
    p.add_argument("--ttt-steps", type=int, default=3)
    p.add_argument("--num-sequences", type=int, default=2048)
    p.add_argument("--eval-sequences", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--minutes", type=float, default=8.0, help="time cap (0 = steps only)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--save-every", type=int, default=200)
    return p


def main(argv: list[str] | None = None) -> None:
    train(parser().parse_args(argv))


if __name__ == "__main__":
    main()
