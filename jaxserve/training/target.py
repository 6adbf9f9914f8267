"""Train the embedded target: a tiny gpt-oss (`GptOssForCausalLM`) on the stdlib-docstring corpus.

Architecture (`target_config`): 4 layers alternating sliding (window 32 keys incl. self, shorter than the
256-token training context, so the window matters) and full attention, one learned sink per head, GQA 4/2
heads of 32, YaRN rotary as gpt-oss ships it, attention biases, a 4-expert top-2 MoE with gpt-oss's clamped
interleaved SwiGLU, untied LM head, byte-level BPE vocab 1024: about 1.8M parameters.

Training runs the serving model's own modules through `jaxserve.training.dense.dense_forward` (the paged
attention call replaced by dense attention; tests check the logits against the paged path): next-token
cross-entropy plus a small load-balancing loss on the routers (fraction routed x mean router probability,
HF's `router_aux_loss_coef` idea), AdamW (betas 0.9/0.95, weight decay on matrices only), warm-up then
cosine decay over the step budget or the time cap, whichever ends first; gradient clipping at 1.0.

    python -m jaxserve.training.target --corpus build/embedded/corpus --tokenizer build/embedded/tokenizer \
        --out build/embedded/target --steps 1200 --minutes 15

writes a Hugging Face checkpoint (config.json + model.safetensors, HF tensor names; transformers loads it)
and `training.json` (losses, tokens/s). `--init-from DIR` continues from a saved checkpoint (fresh optimiser
state, short warm-up): that is how an interrupted run resumes, since a checkpoint is saved every
`--save-every` steps.
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
from jaxserve.models.build import random_model
from jaxserve.models.config import ModelConfig
from jaxserve.training import data
from jaxserve.training.dense import dense_forward
from jaxserve.training.export import save_hf_checkpoint


def target_config(vocab_size: int = 1024, *, hidden_size: int = 128, num_layers: int = 4, num_heads: int = 4,
                  num_kv_heads: int = 2, head_dim: int = 32, intermediate_size: int = 224,
                  num_experts: int = 4, experts_per_token: int = 2, sliding_window: int = 32,
                  eos_token_id: int = 0) -> dict:
    """An HF `config.json` dict for a small gpt-oss (field names and defaults as transformers writes them)."""
    return {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "dtype": "float32",
        "vocab_size": vocab_size, "hidden_size": hidden_size, "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers, "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads, "head_dim": head_dim, "attention_bias": True,
        "attention_dropout": 0.0, "hidden_act": "silu", "rms_norm_eps": 1e-5, "initializer_range": 0.02,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)],
        "sliding_window": sliding_window, "num_local_experts": num_experts,
        "num_experts_per_tok": experts_per_token, "swiglu_limit": 7.0, "swiglu_alpha": 1.702,
        "router_aux_loss_coef": 0.01, "output_router_logits": False,
        "max_position_embeddings": 131072,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                            "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
        "tie_word_embeddings": False, "use_cache": True,
        "eos_token_id": eos_token_id, "pad_token_id": eos_token_id, "bos_token_id": None,
    }


def count_params(model) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def router_balance_loss(model, mlp_inputs: list[jax.Array]) -> jax.Array:
    """Mean over MoE layers of E * sum_e(fraction of top-k slots routed to e * mean router prob of e)."""
    losses = []
    for layer, x in zip(model.layers, mlp_inputs, strict=True):
        moe = layer.mlp
        if not hasattr(moe, "router_weight"):
            continue
        logits = x.reshape(-1, x.shape[-1]) @ moe.router_weight[...].T + moe.router_bias[...]
        num_experts = logits.shape[-1]
        _, chosen = jax.lax.top_k(logits, moe.top_k)
        routed = jax.nn.one_hot(chosen, num_experts).sum(axis=1).mean(axis=0) / moe.top_k
        probs = jax.nn.softmax(logits, axis=-1).mean(axis=0)
        losses.append(num_experts * jnp.sum(jax.lax.stop_gradient(routed) * probs))
    return jnp.mean(jnp.stack(losses)) if losses else jnp.zeros(())


def lm_loss(model, ids: jax.Array, balance_coef: float) -> tuple[jax.Array, jax.Array]:
    """(total loss, next-token cross-entropy) on windows `ids [B, T+1]`."""
    logits, _, mlp_inputs = dense_forward(model, ids[:, :-1], with_mlp_inputs=True)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, ids[:, 1:]).mean()
    return ce + balance_coef * router_balance_loss(model, mlp_inputs), ce


def make_optimizer(weight_decay: float = 0.1) -> optax.GradientTransformation:
    def decay_mask(params):
        return jax.tree.map(lambda p: p.ndim >= 2, params)

    adamw = optax.inject_hyperparams(optax.adamw)(learning_rate=0.0, b1=0.9, b2=0.95,
                                                  weight_decay=weight_decay, mask=decay_mask)
    return optax.chain(optax.clip_by_global_norm(1.0), adamw)


def set_lr(opt_state, lr: float):
    opt_state[1].hyperparams["learning_rate"] = jnp.asarray(lr, jnp.float32)
    return opt_state


class Trainer:
    """Jitted AdamW steps on a model's `nnx.Param` state; `model()` rebuilds the module."""

    def __init__(self, model, balance_coef: float, weight_decay: float = 0.1):
        self.graphdef, self.params, self.rest = nnx.split(model, nnx.Param, ...)
        self.tx = make_optimizer(weight_decay)
        self.opt_state = self.tx.init(self.params)
        graphdef, rest, tx = self.graphdef, self.rest, self.tx

        def loss_fn(params, ids):
            return lm_loss(nnx.merge(graphdef, params, rest), ids, balance_coef)

        @functools.partial(jax.jit, donate_argnums=(0, 1))
        def step(params, opt_state, ids):
            (_, ce), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, ids)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, ce

        self._step = step
        self._eval = jax.jit(lambda params, ids: loss_fn(params, ids)[1])

    def step(self, ids: np.ndarray, lr: float) -> jax.Array:
        self.opt_state = set_lr(self.opt_state, lr)
        self.params, self.opt_state, ce = self._step(self.params, self.opt_state, jnp.asarray(ids))
        return ce

    def evaluate(self, windows: np.ndarray, batch_size: int) -> float:
        losses = [float(self._eval(self.params, jnp.asarray(windows[i: i + batch_size])))
                  for i in range(0, len(windows) - batch_size + 1, batch_size)] or \
                 [float(self._eval(self.params, jnp.asarray(windows)))]
        return float(np.mean(losses))

    def model(self):
        return nnx.merge(self.graphdef, self.params, self.rest)


def train(args: argparse.Namespace) -> dict:
    tokenizer = HFTokenizer(args.tokenizer)
    corpus = Path(args.corpus)
    train_ids = data.encode_file(tokenizer, corpus / "train.txt")
    heldout = data.heldout_windows(data.encode_file(tokenizer, corpus / "heldout.txt"), args.context + 1,
                                   args.eval_windows)
    if args.init_from:
        model = load_model(args.init_from, progress=False)
        raw = dict(model.config.raw)
    else:
        raw = target_config(tokenizer.vocab_size, hidden_size=args.hidden_size, num_layers=args.num_layers,
                            intermediate_size=args.intermediate_size, sliding_window=args.sliding_window,
                            eos_token_id=tokenizer.eos_token_ids[0])
        model = random_model(ModelConfig.from_dict(raw), seed=args.seed)
    trainer = Trainer(model, balance_coef=float(raw.get("router_aux_loss_coef", 0.01)))
    rng = np.random.default_rng(args.seed)
    out = Path(args.out)
    log = {"params": count_params(model), "train_tokens": int(train_ids.size), "context": args.context,
           "batch_size": args.batch_size, "steps": [], "init_from": args.init_from}
    print(json.dumps({k: v for k, v in log.items() if k != "steps"}), flush=True)
    warmup = min(args.warmup, max(1, args.steps // 10))
    start = time.perf_counter()
    step_start, tokens = start, 0
    step = 0
    for step in range(args.steps):
        elapsed = time.perf_counter() - start
        progress = max(step / args.steps, elapsed / (60 * args.minutes) if args.minutes else 0.0)
        if progress >= 1.0:
            break
        lr = data.cosine_lr(int(progress * args.steps), peak=args.lr, warmup=warmup, total=args.steps)
        ce = trainer.step(data.sample_windows(train_ids, args.batch_size, args.context + 1, rng), lr)
        tokens += args.batch_size * args.context
        if (step + 1) % args.log_every == 0 or step == 0:
            ce = float(ce)
            now = time.perf_counter()
            entry = {"step": step + 1, "loss": round(ce, 4), "lr": round(lr, 6),
                     "tokens_per_s": round(tokens / (now - step_start), 1),
                     "elapsed_s": round(now - start, 1)}
            if (step + 1) % args.eval_every == 0:
                entry["heldout_loss"] = round(trainer.evaluate(heldout, args.batch_size), 4)
            log["steps"].append(entry)
            print(json.dumps(entry), flush=True)
            step_start, tokens = time.perf_counter(), 0
        if args.save_every and (step + 1) % args.save_every == 0:
            save_hf_checkpoint(trainer.model(), out, raw)
    log["final_heldout_loss"] = trainer.evaluate(heldout, args.batch_size)
    log["steps_done"] = step + 1
    log["wall_s"] = round(time.perf_counter() - start, 1)
    save_hf_checkpoint(trainer.model(), out, raw)
    (out / "training.json").write_text(json.dumps(log, indent=1))
    print(json.dumps({"final_heldout_loss": log["final_heldout_loss"], "steps": log["steps_done"],
                      "wall_s": log["wall_s"]}), flush=True)
    return log


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default="build/embedded/corpus")
    p.add_argument("--tokenizer", default="build/embedded/tokenizer")
    p.add_argument("--out", default="build/embedded/target")
    p.add_argument("--init-from", default=None, help="continue from this checkpoint directory")
    p.add_argument("--hidden-size", type=int, default=128)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--intermediate-size", type=int, default=224)
    p.add_argument("--sliding-window", type=int, default=32)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=1200, help="1200 x 8 x 256 = 2.5M tokens")
    p.add_argument("--minutes", type=float, default=15.0, help="time cap (0 = steps only)")
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-windows", type=int, default=64)
    p.add_argument("--save-every", type=int, default=200)
    return p


def main(argv: list[str] | None = None) -> None:
    train(parser().parse_args(argv))


if __name__ == "__main__":
    main()
